#!/usr/bin/env python3
"""Training throughput on the GPU, fed by each loader, against the same model's ceiling.

    python3 benches/e2e/gpu_train.py --images DIR --packed DIR [--models resnet50,resnet18]
        [--workers 15] [--steps 150] [--warmup-s 0] [--serve-arg ARG]... [--bin PATH] [--out DIR]

For each model (bf16 autocast, channels_last, batch 256, SGD):
- ceiling: the data is a batch already on the GPU (the rate the GPU reaches when it never waits);
- dataloader-pil: torch DataLoader over torchvision ImageFolder with PIL RandomResizedCrop(224) +
  flip, `--workers` workers, pin_memory, uint8 tensors normalised on the GPU;
- ringfeed: `ringfeed.Loader` in CUDA mode (pinned ring, side-stream copies), normalised to bf16
  channels_last on the GPU, `--workers` decode threads in a private server started for the run
  (`harness.Server`, with each `--serve-arg`; its log is --out/serve.log);
  ringfeed-hybrid: the same with hybrid decode and the autotuner's GPU share; ringfeed-share-S:
  with the share pinned at S; any ringfeed loader with `@slotsN`: a ring of N slots (else 6), with
  `@torchops` the per-image steps as PyTorch ops, with `@nopixels` the server finishing the samples
  it decodes (protocol 1.11's decoded pixels off; on otherwise);
- dali: NVIDIA DALI's standard ResNet-50 pipeline (mixed decode with the hardware decoder), with
  `--threads-cap` (else `--workers`) CPU threads; with `--recipe full`, DALI's own
  `trivial_augment_wide` on the GPU after the resize (no erasing: `_dali.batches`).
Each run skips 20 warm-up steps (and, with `--warmup-s S`, as many more as S seconds take, so that
the autotuner has settled; every loader gets the same), then times `--steps` steps, and reports two shares of the total:
- GPU idle: the sum over steps of the gap, on the GPU's own clock (CUDA events), between the end of
  one step's last kernel and the start of the next step's first: time the GPU had nothing queued,
  because the loop was waiting for a batch (or for the copy that brings it). This is the share of
  time the GPU waits for data. Each step's gap is kept too (`gpu_idle_steps`: seconds since the
  timed steps began, idle ms), which `benches/charts.py --idle gpu.json` draws over time.
- loop blocked in `next()`: the wall time the Python loop spends inside `next(iterator)`. When the
  loader keeps up, this still includes back-pressure from a GPU that is behind (a CUDA loader's
  `next()` waits for its copy, which queues behind the GPU's work), so for a GPU-bound model it
  measures the GPU's lead, not a wait for data.
For ringfeed, also what the loader and the server measured over the timed steps (protocol 1.2):
the loop's wait split into the wait for data and the time behind its own GPU (`Loader.stats()`),
and, every 0.5 s, the server's view of the stream (`ringfeed.snapshot`): decode threads and their
busy share, depth, the wait the autotuner acts on, and its reading (`limit`) and last change
(`tune`). `--threads-cap N` bounds the autotuned threads (`Loader(tuning=ringfeed.Tuning(threads=N))`), e.g. 6.
Each run also reports CPU milliseconds per image and CPU cores busy: user + system time of the
bench's whole process tree over the timed steps (benches/e2e/_cpu.py), so the loop's own thread,
DataLoader workers, DALI's threads and the sidecar alike.
`--trace N` profiles N more steps after the timed ones (torch.profiler, CPU and CUDA) and writes
each run's Chrome trace to --out as trace-<model>-<loader>.json.gz (the timed figures do not include
them; `benches/e2e/trace_summary.py` reads the traces).
Writes gpu.json (a `harness` record; the baseline is the ceiling, the ratios each run's share of
its model's ceiling) and gpu.md into --out. `--warmup-s` stays 0 by default here, unlike the
harness's feed benches: the device scripts that produced the committed results ran it so, under
`timeout`s sized for that.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path

import _cpu
import torch
import torchvision
from torch import nn
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
BATCH = 256
WARMUP = 20


def make_model(name: str) -> nn.Module:
    m = getattr(torchvision.models, name)(num_classes=1000)
    return m.cuda().to(memory_format=torch.channels_last)


#: The snapshot members of the stream the timeline keeps.
WATCHED = (
    "threads",
    "depth",
    "busy",
    "wait",
    "gpu_wait",
    "samples_per_s",
    "stage_us",
    "limit",
    "tune",
    "gpu_share",
    "gpu_decode_us",
)


class Watch:
    """Polls the server's snapshot every 0.5 s while the timed steps run (ringfeed runs only)."""

    def __init__(self, sock: str) -> None:
        self.sock, self.timeline, self._stop = sock, [], threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.t0 = time.perf_counter()

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self._thread.start()

    def _poll(self) -> None:
        import ringfeed

        while not self._stop.wait(0.5):
            try:
                snap = ringfeed.snapshot(self.sock, timeout=5.0)
            except Exception as e:  # a bench keeps going; the error is recorded
                self.timeline.append({"t": round(time.perf_counter() - self.t0, 2), "error": str(e)})
                continue
            for st in snap["streams"]:
                self.timeline.append(
                    {"t": round(time.perf_counter() - self.t0, 2), "pool_busy": snap["server"]["busy"]}
                    | {k: st.get(k) for k in WATCHED}
                )

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return self.timeline


def train_step(model: nn.Module, opt: torch.optim.Optimizer, loss_fn: nn.Module, x, y) -> None:
    """One bf16-autocast SGD step."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def train(
    model: nn.Module,
    batches,
    steps: int,
    watch: Watch | None = None,
    trace: tuple[int, Path] | None = None,
    warmup_s: float = 0.0,
) -> dict:
    """Runs WARMUP steps (and as many more as `warmup_s` seconds take: the autotuner's time to
    settle), then `steps` timed steps from `batches` (an iterator of (x, y) on the GPU); with
    `trace` `(n, path)`, n more under torch.profiler, whose Chrome trace goes to `path` (gzip)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    wait = 0.0
    start = None
    # (end of step k, start of step k + 1) on the GPU's clock, for the timed steps.
    gaps: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    # When each gap's next step was queued, in seconds since the timed steps began (host clock).
    gap_at: list[float] = []
    last_end = None
    began = time.perf_counter()
    step, timed = 0, 0
    while timed < steps:
        if start is None and step >= WARMUP and time.perf_counter() - began >= warmup_s:
            torch.cuda.synchronize()
            start, wait = time.perf_counter(), 0.0
            cpu0 = _cpu.tree_cpu_seconds()
            client0 = LOADERS[0].stats(server=False) if watch is not None and LOADERS else None
            if watch is not None:
                watch.start()
        t = time.perf_counter()
        x, y = next(batches)
        wait += time.perf_counter() - t
        if start is not None:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            if last_end is not None:
                gaps.append((last_end, begin))
                gap_at.append(time.perf_counter() - start)
        train_step(model, opt, loss_fn, x, y)
        step += 1
        if start is not None:
            timed += 1
            last_end = torch.cuda.Event(enable_timing=True)
            last_end.record()
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    cpu = _cpu.tree_cpu_seconds() - cpu0
    gap_ms = [a.elapsed_time(b) for a, b in gaps]
    idle = sum(gap_ms) / 1000
    out = {
        "img_per_s": steps * BATCH / total,
        # This process's threads, its DataLoader workers and the sidecar it started (_cpu.py).
        "cpu_ms_per_img": cpu / (steps * BATCH) * 1e3,
        "cpu_cores": cpu / total,
        "gpu_idle_share": idle / total,
        "wait_share": wait / total,
        "seconds": total,
        # Per timed step: [seconds since the timed steps began, GPU idle ms before it]
        # (benches/charts.py --idle draws it over time).
        "gpu_idle_steps": [[round(t, 4), round(ms, 4)] for t, ms in zip(gap_at, gap_ms, strict=True)],
    }
    if watch is not None:
        timeline = watch.stop()
        if client0 is not None:
            c1 = LOADERS[0].stats(server=False)
            keys = ["wait_s", "gpu_wait_s", "data_wait_s", "compute_s", "batches"]
            keys += [k for k in ("gpu_samples", "gpu_pixel_samples", "gpu_fallbacks", "gpu_decode_wait_s") if k in c1]
            d = {k: c1[k] - client0[k] for k in keys}
            whole = max(d["wait_s"] + d["compute_s"], 1e-9)
            out["loader_stats"] = d | {
                "data_wait_share": d["data_wait_s"] / whole,
                "gpu_wait_share": d["gpu_wait_s"] / whole,
            }
            if "gpu_decode_wait_s" in d:
                out["loader_stats"]["gpu_decode_wait_share"] = d["gpu_decode_wait_s"] / whole
        out["server_timeline"] = timeline
        last = next((e for e in reversed(timeline) if "limit" in e), None)
        if last is not None:
            out["server_last"] = last
    if trace is not None:
        n, path = trace
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                train_step(model, opt, loss_fn, *next(batches))
            torch.cuda.synchronize()
        raw = path.with_suffix("")  # .json
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as f, gzip.open(path, "wb") as g:
            shutil.copyfileobj(f, g)
        raw.unlink()
    return out


def ceiling_batches():
    x = torch.randn(BATCH, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (BATCH,), device="cuda")
    while True:
        yield x, y


def dataloader_batches(images: Path, workers: int, recipe: str = "rrc"):
    tf = transforms.Compose(
        [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
    )
    if recipe != "rrc":
        # torchvision v2 (_recipes: ta_wide's recipe, erasing after normalisation, or a policy):
        # floats from the workers.
        from _recipes import tv_recipe

        tf = tv_recipe(recipe)
    ds = torchvision.datasets.ImageFolder(str(images), transform=tf)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    mean, std = MEAN.cuda(), STD.cuda()
    while True:
        for x, y in dl:
            if recipe != "rrc":
                x = x.cuda(non_blocking=True).to(torch.bfloat16, memory_format=torch.channels_last)
            else:
                x = x.cuda(non_blocking=True).float().sub_(mean).div_(std).to(memory_format=torch.channels_last)
            yield x, y.cuda(non_blocking=True)


#: The ringfeed loader of the current run (for its stats after the run).
LOADERS: list = []


def dali_batches(images: Path, threads: int, recipe: str = "rrc"):
    """NVIDIA DALI's standard ResNet-50 training pipeline (mixed decode with the hardware decoder);
    with ``recipe="full"``, DALI's TrivialAugmentWide on the GPU after the resize (``_dali``)."""
    import _dali

    for x, y in _dali.batches(images, threads, BATCH, recipe=recipe):
        yield x.contiguous(memory_format=torch.channels_last), y


def ringfeed_batches(
    packed: str,
    sock: str,
    recipe: str = "rrc",
    threads: int | None = None,
    gpu_decode: object = False,
    slots: int = 6,
):
    from _recipes import rf_recipe

    import ringfeed

    ld = ringfeed.Loader(
        packed,
        BATCH,
        transform=rf_recipe(recipe),
        device="cuda",
        dtype=torch.bfloat16,
        server=ringfeed.Server(socket=sock),
        layout="NHWC",
        tuning=ringfeed.Tuning(slots=slots, threads=threads),
        gpu_decode=gpu_decode,
        shuffle=True,
        drop_last=True,
    )
    LOADERS[:] = [ld]
    yield from harness.epochs(ld)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--packed", required=True, help="a packed dataset: a directory or an s3:// URL")
    ap.add_argument("--models", default="resnet50,resnet18")
    ap.add_argument("--loaders", default="ceiling,ringfeed,dataloader-pil")
    ap.add_argument("--workers", type=int, default=15)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument(
        "--recipe",
        default="rrc",
        choices=["rrc", "full"],
        help="rrc: RandomResizedCrop + flip; full: + TrivialAugmentWide + Normalize + RandomErasing(0.25)",
    )
    ap.add_argument("--out", type=Path, default=Path())
    ap.add_argument("--trace", type=int, default=0, help="profile this many steps after the timed ones (Chrome traces)")
    ap.add_argument("--threads-cap", type=int, default=None, help="ringfeed: Tuning(threads=N), the autotuner's bound")
    ap.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="one more argument for the sidecar's `ringfeed serve` (repeat; e.g. --serve-arg=--cache-dir=/tmp/c)",
    )
    harness.add_arguments(ap, warmup_s=0.0)
    a = ap.parse_args()
    if os.environ.get("BENCH_BLOCKING_SYNC") == "1":
        # An experiment: every host wait on the GPU in this process blocks instead of spinning
        # (cudaDeviceScheduleBlockingSync on the primary context, before torch creates it).
        import ctypes

        cudart = ctypes.CDLL("libcudart.so.13")
        status = cudart.cudaSetDeviceFlags(4)
        print(f"cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync): {status}", flush=True)
    torch.backends.cudnn.benchmark = True

    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    with harness.Server(a.workers, a.serve_arg, binary=a.bin, log=a.out / "serve.log") as server:
        sock = server.sock
        for name in a.models.split(","):
            for loader in a.loaders.split(","):
                torch.manual_seed(0)
                model = make_model(name)
                kind, _, opt = loader.partition("@")
                slots = int(opt.removeprefix("slots")) if opt.startswith("slots") else 6
                # `@torchops`: the per-image steps of hybrid decode as PyTorch ops (RINGFEED_GPU_OPS),
                # to weigh the fused Triton kernels against them.
                os.environ["RINGFEED_GPU_OPS"] = "torch" if opt == "torchops" else "auto"
                # `@nopixels`: the server finishes the samples it decodes (1.11's decoded pixels off),
                # to weigh finishing them on the GPU against it.
                os.environ["RINGFEED_GPU_PIXELS"] = "0" if opt == "nopixels" else "1"
                share = float(kind.removeprefix("ringfeed-share-")) if kind.startswith("ringfeed-share-") else None
                batches = {
                    f"ringfeed-share-{share}": lambda: ringfeed_batches(
                        a.packed,
                        sock,
                        a.recipe,
                        a.threads_cap,
                        share,  # noqa: B023 - called at once
                        slots,  # noqa: B023
                    ),
                    "ceiling": lambda: ceiling_batches(),
                    "dataloader-pil": lambda: dataloader_batches(a.images, a.workers, a.recipe),
                    "ringfeed": lambda: ringfeed_batches(a.packed, sock, a.recipe, a.threads_cap, False, slots),  # noqa: B023
                    "ringfeed-hybrid": lambda: ringfeed_batches(a.packed, sock, a.recipe, a.threads_cap, "auto", slots),  # noqa: B023
                    "dali": lambda: dali_batches(a.images, a.threads_cap or a.workers, a.recipe),
                }[kind]()
                watch = Watch(sock) if loader.startswith("ringfeed") else None
                trace = (a.trace, a.out / f"trace-{name}-{loader}.json.gz") if a.trace else None
                r = train(model, batches, a.steps, watch, trace, a.warmup_s)
                LOADERS.clear()
                r.update(
                    {
                        "model": name,
                        "loader": loader,
                        "workers": a.workers,
                        "steps": a.steps,
                        "batch": BATCH,
                        "recipe": a.recipe,
                    }
                )
                results.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "server_timeline"}), flush=True)
                del batches, model
                torch.cuda.empty_cache()

    meta = {
        "gpu": torch.cuda.get_device_name(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "host": platform.node(),
    }
    ratios = harness.against(
        results, value="img_per_s", by=["model"], keep=["loader"], baseline=lambda r: r["loader"] == "ceiling"
    )
    harness.write_record(
        a.out / "gpu.json", {"machine": meta, "runs": results}, args=a, baseline="ceiling", ratios=ratios
    )
    lines = [
        "# Training throughput fed by each loader (bf16, channels_last, batch 256)",
        "",
        f"{meta['gpu']}, {meta['cpus']} CPU cores, torch {meta['torch']}; {a.workers} workers/threads; "
        f"{a.steps} timed steps after {WARMUP} warm-up steps"
        + (f" and at least {a.warmup_s:g} s of warm-up." if a.warmup_s else "."),
        "",
        "| model | loader | img/s | share of ceiling | GPU idle, waiting for data | loop blocked in next() "
        "| CPU ms per image | CPU cores busy |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in a.models.split(","):
        rows = [r for r in results if r["model"] == name]
        ceiling = next((r["img_per_s"] for r in rows if r["loader"] == "ceiling"), None)
        for r in rows:
            share = f"{r['img_per_s'] / ceiling * 100:.0f} %" if ceiling else "n/a"
            lines.append(
                f"| {name} | {r['loader']} | {r['img_per_s']:.0f} | {share} | {r['gpu_idle_share'] * 100:.1f} % "
                f"| {r['wait_share'] * 100:.1f} % | {r['cpu_ms_per_img']:.3f} | {r['cpu_cores']:.1f} |"
            )
    lines += [
        "",
        "GPU idle: the gaps on the GPU's clock between one step's last kernel and the next step's first,",
        "over the total. Loop blocked in next(): wall time inside next(); for a GPU-bound model fed by a",
        "CUDA loader it includes back-pressure from the GPU (see the module docstring). CPU: user + system",
        "time of the bench's process tree (the loop, DataLoader workers, the sidecar) over the timed steps.",
    ]
    signals = [r for r in results if "loader_stats" in r or "server_last" in r]
    if signals:
        lines += [
            "",
            "## ringfeed: what the loader and the server measured (timed steps)",
            "",
            "| model | next(): waiting for data | of it for GPU decodes | next(): behind the GPU | server: threads "
            "| busy | wait (tuner) | GPU wait | samples/s | GPU share | GPU-decoded |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        pct = lambda v: "-" if v is None else f"{v * 100:.1f} %"  # noqa: E731
        for r in signals:
            ld, sv = r.get("loader_stats", {}), r.get("server_last", {})
            lines.append(
                f"| {r['model']} {r['loader']} | {pct(ld.get('data_wait_share'))} "
                f"| {pct(ld.get('gpu_decode_wait_share'))} | {pct(ld.get('gpu_wait_share'))} "
                f"| {sv.get('threads', '-')} | {pct(sv.get('busy'))} | {pct(sv.get('wait'))} "
                f"| {pct(sv.get('gpu_wait'))} "
                f"| {sv.get('samples_per_s', '-')} | {pct(sv.get('gpu_share'))} "
                f"| {ld.get('gpu_samples', '-')} |"
            )
        lines.append("")
        for r in signals:
            sv = r.get("server_last", {})
            lines += [
                f"- {r['model']} {r['loader']}: limit: {sv.get('limit', '-')}",
                f"  last change: {sv.get('tune', '-')}",
            ]
        lines.append("")
        lines.append("The server's timeline (every 0.5 s) is in gpu.json, `server_timeline`.")
    (a.out / "gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
