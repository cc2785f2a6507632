#!/usr/bin/env python3
"""The autotuner against hand-tuned settings, in one run, on one server and one corpus.

    python3 benches/autotune.py DATASET --out DIR [--step-ms 40] [--batch-size 128]
        [--fixed 1,2,4,6,8,12,15] [--seconds 20] [--threads N] [--model resnet50] [--bin PATH]

A simulated training loop computes a fixed time per step (``time.sleep``), so the rate it can
consume at is known: ``batch / step``. Scenarios (control.md, "Autotuning"; issue "Autotuner"):

- **fixed**: ``autotune=False`` with each thread count of ``--fixed``: samples/s and the share of
  time the loop waited. The best is the hand-tuned reference; the smallest setting within 5 % of it
  is the fewest threads a person could have picked.
- **auto**: the autotuner, from a cold start. Reported: the time until the 2 s moving throughput
  reaches 95 % of the best fixed setting (and stays), its settled threads, and the wait.
- **slow**: a loop 4x slower: the autotuner sheds threads (threads at the start and the end).
- **speedup**: the 4x slower loop for a third of the run, then the normal one: the time from the
  switch until the loop's wait (its 2-s moving average) falls under 2 % and stays there.
- with ``--model``: the same, with a real model training on the GPU instead of the sleep (the
  step time is then the model's); fixed settings against the autotuner.

Every scenario polls ``ringfeed.snapshot()`` every 0.5 s: threads, depth, the loop's wait and
samples/s over time go to ``DIR/autotune.json`` (a ``harness`` record: the baseline is the best
fixed setting, the ratio the autotuner's rate over it), a table to ``DIR/autotune.md`` and a plot
to ``DIR/autotune.png``. There is no warm-up: how fast the autotuner gets there from a cold start
is what is measured; each scenario runs on one private server (``harness.Server``).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness

import ringfeed


def run(
    server: harness.Server,
    dataset: str,
    batch: int,
    seconds: float,
    step: Callable[[float], float],
    device: str = "cpu",
    model: Any = None,
    **loader_kw: Any,
) -> dict[str, Any]:
    """Trains for `seconds`; `step(t)` is the simulated compute time at time t (ignored with a
    model). Returns throughput, wait share and the server's timeline."""
    timeline: list[dict[str, Any]] = []
    done = threading.Event()
    t0 = time.monotonic()

    def poll() -> None:
        while not done.wait(0.5):
            snap = ringfeed.snapshot(server.sock)
            for s in snap["streams"]:
                timeline.append(
                    {
                        "t": round(time.monotonic() - t0, 2),
                        "threads": s["threads"],
                        "depth": s["depth"],
                        "wait": s["wait"],
                        "samples_per_s": s["samples_per_s"],
                        "tune": s["tune"],
                    }
                )

    poller = threading.Thread(target=poll, daemon=True)
    samples: list[tuple[float, int]] = []
    tf = ringfeed.RandomResizedCrop(224) + ringfeed.Flip()
    kw: dict[str, Any] = {
        "server": ringfeed.Server(socket=server.sock, spawn=False),
        "device": device,
        "shuffle": True,
        "drop_last": True,
        **loader_kw,
    }
    if model is not None:
        tf = tf + ringfeed.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
        import torch

        kw["dtype"] = torch.bfloat16
    with ringfeed.Loader(dataset, batch, tf, **kw) as ld:
        poller.start()
        epoch = 0
        while time.monotonic() - t0 < seconds:
            ld.set_epoch(epoch)
            epoch += 1
            for images, labels in ld:
                if model is not None:
                    model(images, labels)
                else:
                    time.sleep(step(time.monotonic() - t0))
                samples.append((time.monotonic() - t0, images.shape[0]))
                if time.monotonic() - t0 >= seconds:
                    break
        stats = ld.stats(server=False)
    done.set()
    poller.join()
    # Throughput over the second half (steady state), and a 2 s moving throughput.
    half = [n for t, n in samples if t >= seconds / 2]
    return {
        "samples_per_s": sum(half) / (seconds / 2),
        "wait_share": stats["wait_share"],
        "timeline": timeline,
        "samples": samples,
    }


def moving(samples: list[tuple[float, int]], at: float, window: float = 2.0) -> float:
    return sum(n for t, n in samples if at - window < t <= at) / window


def first_stable(times: list[float], ok: list[bool]) -> float | None:
    """The first time from which `ok` holds to the end."""
    for i in range(len(ok)):
        if all(ok[i:]):
            return times[i]
    return None


def make_model(name: str) -> Callable[[Any, Any], None]:
    import torch
    import torchvision

    net = getattr(torchvision.models, name)(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(images: Any, labels: Any) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(images), labels.cuda(non_blocking=True) % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # a real loop logs the loss; this is its synchronisation

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--step-ms", type=float, default=40.0)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--fixed", default="1,2,4,6,8,12,15")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--auto-seconds", type=float, default=40.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the server's pool")
    ap.add_argument("--model", default=None, help="a torchvision model trained on the GPU, e.g. resnet50")
    ap.add_argument("--skip-sim", action="store_true", help="only the --model scenarios")
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    fixed = [int(x) for x in a.fixed.split(",")]
    step = a.step_ms / 1000
    results: dict[str, Any] = {"config": vars(a) | {"out": str(a.out)}, "scenarios": {}}

    def scenarios(tag: str, device: str, model: Any) -> None:
        res: dict[str, Any] = {"fixed": {}}
        # The tuner's decisions at info level: their lines end the record (server_log_tail).
        with harness.Server(a.threads, binary=a.bin, env={"RINGFEED_LOG": "warn,ringfeed_serve::tune=info"}) as server:
            try:
                for k in fixed:
                    r = run(server, a.dataset, a.batch_size, a.seconds, lambda _t: step, device, model,
                            tuning=ringfeed.Tuning(autotune=False, threads=k))  # fmt: skip
                    res["fixed"][k] = {"samples_per_s": r["samples_per_s"], "wait_share": r["wait_share"]}
                    print(
                        f"{tag} fixed {k:2d} threads: {r['samples_per_s']:8.0f} samples/s, wait {r['wait_share']:.1%}"
                    )
                best = max(v["samples_per_s"] for v in res["fixed"].values())
                enough = min(k for k, v in res["fixed"].items() if v["samples_per_s"] >= 0.95 * best)
                auto = run(server, a.dataset, a.batch_size, a.auto_seconds, lambda _t: step, device, model)
                times = [t for t, _ in auto["samples"]]
                reach = first_stable(times, [moving(auto["samples"], t) >= 0.95 * best for t in times])
                settled = [p["threads"] for p in auto["timeline"] if p["t"] >= a.auto_seconds - 5]
                settled_threads = max(set(settled), key=settled.count) if settled else None
                res["auto"] = {
                    "samples_per_s": auto["samples_per_s"],
                    "wait_share": auto["wait_share"],
                    "best_fixed": best,
                    "fewest_fixed_threads_within_5pct": enough,
                    "seconds_to_95pct": reach,
                    "settled_threads": settled_threads,
                    "settled_threads_range": [min(settled), max(settled)] if settled else None,
                    "timeline": auto["timeline"],
                }
                print(
                    f"{tag} auto: {auto['samples_per_s']:.0f} samples/s ({auto['samples_per_s'] / best:.1%} of the "
                    f"best fixed), 95% after {reach} s, settled at {res['auto']['settled_threads']} threads "
                    f"(fewest fixed within 5%: {enough})"
                )
                if model is None:
                    slow = run(server, a.dataset, a.batch_size, a.auto_seconds, lambda _t: 4 * step)
                    tl = slow["timeline"]
                    res["slow"] = {
                        "threads_start": tl[0]["threads"] if tl else None,
                        "threads_end": tl[-1]["threads"] if tl else None,
                        "samples_per_s": slow["samples_per_s"],
                        "timeline": tl,
                    }
                    print(
                        f"{tag} slow (4x step): threads {res['slow']['threads_start']} -> {res['slow']['threads_end']}"
                    )
                    switch = a.auto_seconds / 3
                    sp = run(server, a.dataset, a.batch_size, a.auto_seconds + switch,
                             lambda t: 4 * step if t < switch else step)  # fmt: skip
                    after = [p for p in sp["timeline"] if p["t"] > switch and p["wait"] is not None]
                    # The wait's 2-s moving average (4 intervals): one interval's spike (an epoch's
                    # first batch) is not a level.
                    level = [
                        sum(q["wait"] for q in after[max(0, i - 3) : i + 1]) / len(after[max(0, i - 3) : i + 1])
                        for i in range(len(after))
                    ]
                    recovered = first_stable([p["t"] for p in after], [w < 0.02 for w in level])
                    res["speedup"] = {
                        "switch_s": switch,
                        "seconds_to_wait_under_2pct": None if recovered is None else round(recovered - switch, 2),
                        "timeline": sp["timeline"],
                    }
                    took = res["speedup"]["seconds_to_wait_under_2pct"]
                    print(f"{tag} speed-up at {switch:.0f} s: wait < 2% after {took} s")
            finally:
                res["server_log_tail"] = server.log_tail(40)
        results["scenarios"][tag] = res

    if not a.skip_sim:
        scenarios(f"sleep {a.step_ms:.0f} ms", "cpu", None)
    if a.model:
        scenarios(a.model, "cuda", make_model(a.model))
    ratios = {
        tag: harness.ratio(res["auto"]["samples_per_s"], res["auto"]["best_fixed"])
        for tag, res in results["scenarios"].items()
    }
    harness.write_record(
        a.out / "autotune.json", results, args=a, baseline="best fixed setting", ratios=ratios, indent=1
    )
    write_table(results, a.out / "autotune.md")
    plot(results, a.out / "autotune.png")


def write_table(results: dict[str, Any], path: Path) -> None:
    cfg = results["config"]
    lines = [
        "# Autotuner against hand-tuned settings",
        "",
        f"`python3 benches/autotune.py {cfg['dataset']} --out {cfg['out']} --step-ms {cfg['step_ms']} "
        f"--batch-size {cfg['batch_size']} --fixed {cfg['fixed']} --seconds {cfg['seconds']} "
        f"--auto-seconds {cfg['auto_seconds']} --threads {cfg['threads']}"
        + (f" --model {cfg['model']}" if cfg["model"] else "")
        + "`",
        "",
    ]
    for tag, res in results["scenarios"].items():
        lines += [f"## {tag}", "", "| setting | samples/s | loop waiting |", "|---|---:|---:|"]
        for k, v in res["fixed"].items():
            lines.append(f"| fixed {k} threads | {v['samples_per_s']:.0f} | {v['wait_share']:.1%} |")
        au = res["auto"]
        lines.append(f"| **autotune** | {au['samples_per_s']:.0f} | {au['wait_share']:.1%} |")
        lines += [
            "",
            f"- Autotune: {au['samples_per_s'] / au['best_fixed']:.1%} of the best fixed setting; 95 % of it "
            f"after {au['seconds_to_95pct']} s; settled at {au['settled_threads']} threads (range over the last 5 s: "
            f"{au['settled_threads_range']}); the fewest fixed "
            f"threads within 5 % of the best: {au['fewest_fixed_threads_within_5pct']}.",
        ]
        if "slow" in res:
            lines.append(
                f"- Slow loop (4x step): threads {res['slow']['threads_start']} → {res['slow']['threads_end']}."
            )
        if "speedup" in res:
            lines.append(
                f"- Speed-up at {res['speedup']['switch_s']:.0f} s: the wait (2-s moving average) is under 2 % after "
                f"{res['speedup']['seconds_to_wait_under_2pct']} s."
            )
        lines.append("")
    path.write_text("\n".join(lines))


def plot(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    panels = [
        (tag, name, res[name]["timeline"])
        for tag, res in results["scenarios"].items()
        for name in ("auto", "slow", "speedup")
        if name in res
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3 * len(panels)), squeeze=False)
    for ax, (tag, name, tl) in zip(axes[:, 0], panels, strict=True):
        t = [p["t"] for p in tl]
        ax.step(t, [p["threads"] for p in tl], where="post", label="threads")
        ax.step(t, [p["depth"] for p in tl], where="post", label="depth")
        ax.set_ylabel("threads / depth")
        ax2 = ax.twinx()
        ax2.plot(t, [100 * (p["wait"] or 0) for p in tl], color="tab:red", alpha=0.6, label="wait %")
        ax2.set_ylabel("loop waiting (%)")
        ax.set_title(f"{tag}: {name}")
        ax.legend(loc="upper left")
        ax2.legend(loc="upper right")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
