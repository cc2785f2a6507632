#!/usr/bin/env python3
"""DDP training on every GPU of a node, fed by each loader: one ringfeed sidecar for the node
against one DataLoader (or DALI pipeline) per rank, per rank and for the node, against the ceiling.

    python3 benches/e2e/ddp_train.py --images DIR --packed DIR --nproc 8 [--models resnet50,resnet18]
        [--loaders ceiling,ringfeed,ringfeed-hybrid,dataloader-pil,dali] [--steps 200]
        [--workers 15] [--bin PATH] [--out DIR]
    python3 benches/e2e/ddp_train.py ... --device cpu --size 64 --batch 8 --models resnet18   # smoke

The launcher starts one `ringfeed serve` for the node (`harness.Server`; its decode pool shared by
every rank's stream, `--server-threads`, default all cores), then, per model and loader, `torchrun
--standalone --nproc_per_node N` of this file in rank mode: DDP (NCCL on CUDA, gloo on the CPU),
bf16 autocast, channels_last, batch `--batch` per rank, SGD. Loaders per rank:
- ceiling: a batch already on the rank's GPU;
- ringfeed: `ringfeed.Loader` on the node's sidecar (autotuned; rank, world and LOCAL_WORLD_SIZE
  from torchrun's environment, so the sidecar splits its CPU budget between the ranks);
  ringfeed-hybrid: with hybrid GPU decode (`gpu_decode="auto"`); ringfeed-share-S: the share
  pinned at S;
- dataloader-pil: torch DataLoader over ImageFolder with a DistributedSampler and PIL
  RandomResizedCrop + flip, `--workers` workers per rank;
- dali: DALI's standard ResNet-50 pipeline (benches/e2e/_dali.py), one per rank, sharded.
Every rank skips `--warmup` steps, meets the others at a barrier, times `--steps` steps and meets
them again: the node's rate is the sum of the ranks' over the same window. Per rank: img/s, GPU
idle share (gaps between steps on the GPU's clock), the loop's wait inside `next()`, and for
ringfeed the loader's split of that wait (`data_wait_s`, `gpu_wait_s`). While a ringfeed run
is timed the launcher reads the sidecar's snapshot every 0.5 s: each rank's stream's threads,
busy share and wait, and the sidecar's CPU use (/proc). The CPU milliseconds per image count the
ranks' process trees (their workers, DALI's threads) and the sidecar over the timed window.
Warm-up is counted in steps (`--warmup`), as the device calls of the committed results ran it.
Writes ddp.json (a `harness` record; the baseline is the ceiling, the ratios each run's node rate
over its model's ceiling) and ddp.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _cpu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness

HERE = Path(__file__).resolve()
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


# ---------------------------------------------------------------------------------------------
# Rank mode: one process per GPU, started by torchrun.


def _batches(a: argparse.Namespace, dev: torch.device, rank: int, world: int):
    """An endless iterator of `(images, labels)` on `dev` for this rank."""
    import torchvision
    from torchvision import transforms

    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    size, batch = a.size, a.batch
    if a.loader == "ceiling":
        x = torch.randn(batch, 3, size, size, device=dev, dtype=dtype).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=dev)
        while True:
            yield x, y
    if a.loader.startswith("ringfeed"):
        import ringfeed

        share: object = False
        if a.loader == "ringfeed-hybrid":
            share = "auto"
        elif a.loader.startswith("ringfeed-share-"):
            share = float(a.loader.removeprefix("ringfeed-share-"))
        t = ringfeed.Compose(
            [ringfeed.RandomResizedCrop(size), ringfeed.RandomHorizontalFlip(), ringfeed.Normalize(MEAN, STD)]
        )
        ld = ringfeed.Loader(
            a.packed,
            batch,
            transform=t,
            device="cuda" if cuda else "cpu",
            dtype=dtype,
            server=ringfeed.Server(socket=a.socket),
            layout="NHWC",
            tuning=ringfeed.Tuning(slots=6, threads=a.threads_cap),
            gpu_decode=share,
            shuffle=True,
            drop_last=True,
        )
        _LOADER[:] = [ld]
        yield from harness.epochs(ld)
    if a.loader == "dataloader-pil":
        tf = transforms.Compose(
            [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
        )
        ds = torchvision.datasets.ImageFolder(str(a.images), transform=tf)
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=batch,
            sampler=sampler,
            num_workers=a.workers,
            pin_memory=cuda,
            drop_last=True,
            persistent_workers=a.workers > 0,
            prefetch_factor=4 if a.workers > 0 else None,
        )
        mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1) * 255
        std = torch.tensor(STD, device=dev).view(1, 3, 1, 1) * 255
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            for x, y in dl:
                x = x.to(dev, non_blocking=True).float().sub_(mean).div_(std)
                yield x.to(dtype, memory_format=torch.channels_last), y.to(dev, non_blocking=True)
            epoch += 1
    if a.loader == "dali":
        import _dali

        for x, y in _dali.batches(a.images, a.threads_cap or a.workers, batch, shard=(rank, world)):
            yield x.contiguous(memory_format=torch.channels_last), y
    raise SystemExit(f"unknown loader {a.loader!r}")


#: This rank's ringfeed loader, for its stats.
_LOADER: list = []


def rank_main(a: argparse.Namespace) -> None:
    import torch.distributed as dist
    import torchvision
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        torch.backends.cudnn.benchmark = True
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // (2 * world)))
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=1000).to(dev, memory_format=torch.channels_last)
    model = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batches = _batches(a, dev, rank, world)
    gaps: list = []
    last_end = None
    wait = 0.0
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            start_wall, start, wait = time.time(), time.perf_counter(), 0.0
            cpu0 = _cpu.tree_cpu_seconds()
            client0 = _LOADER[0].stats(server=False) if _LOADER else None
        t = time.perf_counter()
        x, y = next(batches)
        wait += time.perf_counter() - t
        if cuda and step >= a.warmup:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            if last_end is not None:
                gaps.append((last_end, begin))
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda and step >= a.warmup:
            last_end = torch.cuda.Event(enable_timing=True)
            last_end.record()
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    end_wall = time.time()
    # This rank's process and its own children (DataLoader workers; DALI's threads are inside).
    cpu = _cpu.tree_cpu_seconds() - cpu0
    dist.barrier()
    out = {
        "rank": rank,
        "local_rank": local,
        "pid": os.getpid(),
        "img_per_s": a.steps * a.batch / total,
        "seconds": total,
        "window": [start_wall, end_wall],
        "wait_share": wait / total,
        "gpu_idle_share": sum(e0.elapsed_time(e1) for e0, e1 in gaps) / 1000 / total if cuda else None,
        "cpu_cores": cpu / total,
        "loss": loss.item(),
    }
    if client0 is not None:
        c1 = _LOADER[0].stats(server=False)
        keys = [k for k in ("wait_s", "gpu_wait_s", "data_wait_s", "compute_s", "batches", "gpu_samples") if k in c1]
        d = {k: c1[k] - client0[k] for k in keys}
        whole = max(d["wait_s"] + d["compute_s"], 1e-9)
        out["loader_stats"] = d | {"data_wait_share": d["data_wait_s"] / whole}
    Path(a.result, f"rank{rank}.json").write_text(json.dumps(out) + "\n")
    for ld in _LOADER:
        ld.close()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Launcher mode.


class Watch:
    """Reads the sidecar's snapshot and CPU time every 0.5 s during a run."""

    def __init__(self, sock: str, server_pid: int) -> None:
        self.sock, self.pid, self.samples = sock, server_pid, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import ringfeed

        while not self._stop.wait(0.5):
            t, cpu = time.time(), _cpu.tree_cpu_seconds(self.pid)
            try:
                snap = ringfeed.snapshot(self.sock, timeout=5.0)
            except Exception as e:  # a bench keeps going; the error is recorded
                self.samples.append({"t": t, "server_cpu_s": cpu, "error": str(e)})
                continue
            streams = [
                {
                    k: s.get(k)
                    for k in ("pid", "threads", "depth", "busy", "wait", "samples_per_s", "gpu_share", "limit")
                }
                for s in snap["streams"]
            ]
            self.samples.append(
                {"t": t, "server_cpu_s": cpu, "pool_busy": snap["server"].get("busy"), "streams": streams}
            )

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


def summarise(ranks: list[dict], samples: list[dict]) -> dict:
    """The node's figures over the window all ranks timed."""
    lo = max(r["window"][0] for r in ranks)
    hi = min(r["window"][1] for r in ranks)
    out: dict = {
        "node_img_per_s": sum(r["img_per_s"] for r in ranks),
        "slowest_rank_img_per_s": min(r["img_per_s"] for r in ranks),
        "slowest_rank_wait_share": max(r["wait_share"] for r in ranks),
    }
    idle = [r["gpu_idle_share"] for r in ranks if r["gpu_idle_share"] is not None]
    if idle:
        out["gpu_idle_share_max"] = max(idle)
        out["gpu_idle_share_mean"] = statistics.mean(idle)
    data_wait = [r["loader_stats"]["data_wait_share"] for r in ranks if "loader_stats" in r]
    if data_wait:
        out["slowest_rank_data_wait_share"] = max(data_wait)
    inside = [s for s in samples if lo <= s["t"] <= hi and "streams" in s]
    cores = sum(r["cpu_cores"] for r in ranks)
    if len(inside) >= 2:
        span = inside[-1]["t"] - inside[0]["t"]
        out["server_cpu_cores"] = (inside[-1]["server_cpu_s"] - inside[0]["server_cpu_s"]) / max(span, 1e-9)
        cores += out["server_cpu_cores"]
        pids = {r["pid"]: r["rank"] for r in ranks}
        per_rank: dict[int, list[int]] = {}
        for s in inside:
            for st in s["streams"]:
                if st["pid"] in pids and st["threads"] is not None:
                    per_rank.setdefault(pids[st["pid"]], []).append(st["threads"])
        if per_rank:
            # Threads per rank at the end of the window, and the spread over the window.
            last = {r: v[-1] for r, v in sorted(per_rank.items())}
            out["threads_per_rank_end"] = last
            out["threads_spread_end"] = max(last.values()) - min(last.values())
            out["threads_per_rank_mean"] = {r: round(statistics.mean(v), 2) for r, v in sorted(per_rank.items())}
    # The ranks' process trees and, for ringfeed, the sidecar: CPU over the timed window.
    out["node_cpu_cores"] = cores
    out["cpu_ms_per_img"] = cores / out["node_img_per_s"] * 1e3
    return out


def launch(a: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="rfd-", dir="/tmp"))
    results = []
    try:
        with harness.Server(a.server_threads, binary=a.bin) as server:
            sock = server.sock
            for model in a.models.split(","):
                for loader in a.loaders.split(","):
                    result = work / f"{model}-{loader}"
                    result.mkdir()
                    rank_args = [
                        "--rank-mode",
                        "--model", model, "--loader", loader, "--device", a.device,
                        "--images", str(a.images), "--packed", str(a.packed), "--socket", sock,
                        "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch),
                        "--size", str(a.size), "--workers", str(a.workers), "--result", str(result),
                    ]  # fmt: skip
                    if a.threads_cap:
                        rank_args += ["--threads-cap", str(a.threads_cap)]
                    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.nproc}"]
                    watch = Watch(sock, server.pid) if loader.startswith("ringfeed") else None
                    r: dict = {"model": model, "loader": loader, "nproc": a.nproc, "batch": a.batch, "steps": a.steps}
                    try:
                        subprocess.run([*run, str(HERE), *rank_args], check=True, timeout=a.timeout)
                        r["ranks"] = sorted(
                            (json.loads(p.read_text()) for p in result.glob("rank*.json")), key=lambda x: x["rank"]
                        )
                        if len(r["ranks"]) != a.nproc:
                            raise RuntimeError(f"{len(r['ranks'])} of {a.nproc} ranks reported")
                    except (subprocess.SubprocessError, RuntimeError, OSError) as e:
                        r["error"] = f"{type(e).__name__}: {e}"
                    samples = watch.stop() if watch is not None else []
                    if "ranks" in r:
                        r |= summarise(r["ranks"], samples)
                    r["server_samples"] = samples
                    results.append(r)
                    print(json.dumps({k: v for k, v in r.items() if k not in ("server_samples", "ranks")}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(a, results)


def write(a: argparse.Namespace, results: list[dict]) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "gpus": a.nproc,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    ratios = harness.against(
        results, value="node_img_per_s", by=["model"], keep=["loader"], baseline=lambda r: r["loader"] == "ceiling"
    )
    harness.write_record(
        a.out / "ddp.json", {"machine": meta, "runs": results}, args=a, baseline="ceiling", ratios=ratios
    )
    lines = [
        f"# DDP training on {a.nproc} ranks, batch {a.batch} per rank, fed by each loader",
        "",
        f"{meta['gpu']} x {a.nproc}, {meta['cpus']} CPU cores, torch {meta['torch']}; {a.steps} timed steps "
        f"after {a.warmup} warm-up steps; {a.workers} DataLoader workers per rank.",
        "",
        "| model | loader | node img/s | share of ceiling | slowest rank img/s | slowest rank's wait "
        "| GPU idle (max rank) | sidecar threads per rank (end) | sidecar CPU cores | CPU ms per image |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    pct = lambda v: "-" if v is None else f"{v * 100:.1f} %"  # noqa: E731
    for model in a.models.split(","):
        rows = [r for r in results if r["model"] == model]
        ceiling = next((r.get("node_img_per_s") for r in rows if r["loader"] == "ceiling"), None)
        for r in rows:
            if "error" in r:
                lines.append(f"| {model} | {r['loader']} | failed: {r['error'][:90]} | | | | | | | |")
                continue
            share = f"{r['node_img_per_s'] / ceiling * 100:.1f} %" if ceiling else "-"
            threads = r.get("threads_per_rank_end")
            tcell = "-" if not threads else " ".join(str(v) for v in threads.values())
            cores = r.get("server_cpu_cores")
            lines.append(
                f"| {model} | {r['loader']} | {r['node_img_per_s']:.0f} | {share} | {r['slowest_rank_img_per_s']:.0f} "
                f"| {pct(r['slowest_rank_wait_share'])} | {pct(r.get('gpu_idle_share_max'))} | {tcell} "
                f"| {'-' if cores is None else f'{cores:.1f}'} | {r['cpu_ms_per_img']:.3f} |"
            )
    lines += [
        "",
        "Node img/s: the sum of the ranks' rates over the same timed window (barriers at both ends).",
        "Slowest rank's wait: the largest share of its time a rank's loop spent inside next() (DDP runs",
        "at the slowest rank's pace). Sidecar threads per rank: each rank's stream's decode threads",
        "at the end of the window (snapshot), rank 0 first. CPU ms per image: user + system time of the",
        "ranks' process trees (loops, DataLoader workers, DALI) and the sidecar over the timed window,",
        "over the node's images. Per-rank figures are in ddp.json.",
    ]
    (a.out / "ddp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--nproc", type=int, default=torch.cuda.device_count() or 2)
    ap.add_argument("--models", default="resnet50,resnet18")
    ap.add_argument("--loaders", default="ceiling,ringfeed,ringfeed-hybrid,dataloader-pil,dali")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=15, help="DataLoader workers per rank (DALI: threads per rank)")
    ap.add_argument("--threads-cap", type=int, default=None, help="ringfeed: Tuning(threads=N), per rank")
    ap.add_argument("--server-threads", type=int, default=None, help="the sidecar's pool (default: its own)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per torchrun")
    ap.add_argument("--out", type=Path, default=Path())
    harness.add_arguments(ap, warmup=False)
    ap.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--loader", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_mode:
        rank_main(a)
    else:
        launch(a)


if __name__ == "__main__":
    main()
