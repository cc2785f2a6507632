#!/usr/bin/env python3
"""What GPU decode costs a training step, one part at a time (issue 11's open gap).

    python3 benches/e2e/hybrid_step.py --packed DIR [--model resnet18] [--per-step 160]
        [--seconds 6] [--out DIR]

With hybrid decode at a share of 0.625, ResNet-18's step on the H200 grows from 19.3 ms to
23-26 ms and the run reaches 64-68 % of its ceiling where DALI reaches 77-80 %, although the feed
alone beats DALI (benches/results/2026-12-01-h200-kernel). This measures the model's step (CUDA
events on the default stream, data already on the GPU, bf16 autocast, channels_last, batch 256)
while a second thread does one part of the client's GPU work per step period, as fast as it can
up to `--per-step` images per model step:

- alone: nothing beside the model (the reference step);
- host: the host side only, on images decoded once (slices of the arena, reading where each
  image lies, building the table): the GIL and the host thread;
- decode-hw: nvImageCodec's batched decode with the hardware backend only, on its own stream;
- decode-gpu: the same with the CUDA backend only (no hardware decoder);
- decode-nvjpeg: nvJPEG's batched hardware decoder through ringfeed.gpu.nvjpeg (one call a batch,
  without the GIL, into one buffer), what the Finisher uses by default; decode-nvjpeg+finish: it
  and the kernel;
- decode-nvjpeg/replicated: the same without interpolated chroma upsampling (the hardware
  replicates chroma); decode-nvjpeg/planar: planar YCbCr output, no colour conversion;
- rebuild: the chroma rebuild (RINGFEED_GPU_CHROMA=rebuild, ringfeed.gpu.chroma_kernel) over a
  replicated decode, alone; decode-nvjpeg+rebuild+finish: the batched decode, the rebuild and
  the kernel, what that mode does;
- decode-hw/pinned: the hardware decode of the same bytes in pinned memory (as the ring is);
- decode-hw/tN: the hardware decode with nvImageCodec's own CPU threads capped at N (its
  default is one per core);
- finish: the Triton finishing kernel alone over images decoded once (their table built once),
  on its own stream; finish/before: the same with the direct kernel of 970c170
  (benches/e2e/_finish_kernel_before.py), the tiled kernel's baseline;
- decode+finish: what the client does (hardware decode, then the kernel);
- the GPU parts again with "@hi": on a stream of the highest priority;
- decode-nvjpeg@process: decode-nvjpeg/replicated's decode in a process of its own (its own
  CUDA context; the process's CPU is not in the cores column): whether taking nvJPEG's per-image
  CUDA calls out of the training process spares the training thread's launches;
- finish+ta, finish+ra, finish+aa, finish+jitter, finish+ta@graph: the finishing kernel and the
  fused step kernels of a batch of TrivialAugmentWide, RandAugment(2, 9), AutoAugment or
  ColorJitter + RandomGrayscale + GaussianBlur(23) (steps drawn by `ringfeed ops`, tables uploaded
  from pinned memory), launched from Python as the Finisher does, or (TrivialAugmentWide)
  replayed from a CUDA graph captured once (issue 27);
- py-2ms, kernels192, kernels192@graph, copies192, copies192@graph: no decoder, only a kind of
  work per batch: 2 ms of pure Python (the GIL), 192 tiny kernels or 192 small pinned copies
  launched from Python, or replayed from a CUDA graph (the GPU's side alone).

For each: the model's mean step (ms), its growth over `alone`, the images per second the
second thread got through, and the process's CPU cores busy. Writes hybrid_step.json/.md into --out.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torchvision

BATCH = 256


#: The stream the model trains on: None, the default (legacy) stream as a training loop's; or a
#: stream of its own (--model-stream side), to tell implicit synchronisation with the legacy
#: stream from competition for the GPU.
MODEL_STREAM: list = [None]


def model_steps(model, opt, x, y, stop: threading.Event, steps: list[float]) -> None:
    """Trains on one fixed batch until `stop`; appends each step's GPU time (ms) to `steps`."""
    if MODEL_STREAM[0] is not None:
        torch.cuda.set_stream(MODEL_STREAM[0])
    loss_fn = torch.nn.CrossEntropyLoss()
    while not stop.is_set():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        b.record()
        b.synchronize()
        steps.append(a.elapsed_time(b))


class NvjpegBatch:
    """JPEGs (`datas`, bytes-like) as one batch for nvJPEG's batched decode into interleaved RGB:
    the encoded bytes in pinned memory, one after another, and their addresses, sizes, output
    offsets and pitches. `decode(dec, stream)` decodes it once into a fresh buffer."""

    @classmethod
    def from_packed(cls, packed: str, n: int) -> NvjpegBatch:
        """The first `n` samples of the packed dataset `packed`."""
        from ringfeed import PackedDataset

        with PackedDataset(packed) as ds:
            return cls([bytes(ds.sample(i).data) for i in range(n)])

    def __init__(self, datas) -> None:
        from PIL import Image

        sizes = []
        for d in datas:
            with Image.open(io.BytesIO(d)) as im:
                sizes.append((im.width, im.height))
        w = np.array([s[0] for s in sizes], dtype=np.uint64)
        h = np.array([s[1] for s in sizes], dtype=np.uint64)
        size = (w * h * 3 + 255) // 256 * 256
        self.offs = np.concatenate([[0], np.cumsum(size[:-1])]).astype(np.uint64)
        self.total = int(size.sum())
        self.pitches = w * 3
        self.pinned = torch.from_numpy(np.frombuffer(b"".join(datas), dtype=np.uint8).copy()).pin_memory()
        self.lens = np.array([len(d) for d in datas], dtype=np.uint64)
        self.ptrs = self.pinned.data_ptr() + np.concatenate([[0], np.cumsum(self.lens[:-1])]).astype(np.uint64)

    def decode(self, dec, stream: torch.cuda.Stream) -> torch.Tensor:
        """Queues the batch's decode on `stream` into a new buffer (returned: keep it until the
        stream has run the decode)."""
        with torch.cuda.stream(stream):
            buf = torch.empty(self.total, dtype=torch.uint8, device=stream.device)
        dec.decode(self.ptrs, self.lens, buf.data_ptr() + self.offs, self.pitches, stream.cuda_stream)
        return buf


def decode_process(packed: str, n: int, steps_v, done_v, stop, ready) -> None:
    """nvJPEG's batched hardware decode (replicated chroma) of the first `n` samples of `packed`,
    in a process of its own (its own CUDA context: its CUDA calls take no lock of the training
    process's, and the GPU time-slices between the two contexts), at most `n` images per model
    step of the parent (`steps_v`), counting its images in `done_v`. For "decode-nvjpeg@process"."""
    from ringfeed.gpu import nvjpeg as _nvjpeg

    batch = NvjpegBatch.from_packed(packed, n)
    dec = _nvjpeg.HardwareDecoder(torch.device("cuda"), flags=0)
    dec.warm()
    side = torch.cuda.Stream()
    ready.set()
    while not stop.is_set():
        if done_v.value >= (steps_v.value + 1) * n:
            time.sleep(0.0005)
            continue
        batch.decode(dec, side)
        side.synchronize()
        with done_v.get_lock():
            done_v.value += n
    dec.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--per-step", type=int, default=160, help="images the second thread handles per model step")
    ap.add_argument("--seconds", type=float, default=6.0, help="per condition")
    parts_all = "alone,host,decode-hw,decode-gpu,finish,decode+finish,decode-hw@hi,finish@hi,decode+finish@hi"
    ap.add_argument("--parts", default=parts_all)
    ap.add_argument("--model-stream", choices=("default", "side"), default="default")
    ap.add_argument("--out", type=Path, default=Path())
    a = ap.parse_args()

    from nvidia import nvimgcodec

    from ringfeed import PackedDataset
    from ringfeed.gpu import finish_kernel as _finish_kernel
    from ringfeed.gpu import hybrid as _hybrid

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    n = a.per_step
    with PackedDataset(a.packed) as ds:
        datas = [np.frombuffer(bytes(ds.sample(i).data), dtype=np.uint8).copy() for i in range(n)]
    arena = np.concatenate(datas)
    offsets = np.cumsum([0] + [len(d) for d in datas[:-1]])

    def decoder(kind, threads: int = 0):
        # max_num_cpu_threads 0: nvImageCodec's default, one thread per core (16 on the H200).
        return nvimgcodec.Decoder(device_id=0, max_num_cpu_threads=threads, backends=[nvimgcodec.Backend(kind)])

    hw = decoder(nvimgcodec.BackendKind.HW_GPU_ONLY)
    try:
        gpu = decoder(nvimgcodec.BackendKind.GPU_ONLY)
    except RuntimeError as e:  # nvImageCodec 0.9 on the H200: "Could not create decoder. Code: 7"
        print(f"no CUDA-only decoder ({e}); decode-gpu left out", flush=True)
        gpu = None
    # The batch for nvJPEG's batched decoder: the same bytes in pinned memory (as the loader's
    # ring is); for nvImageCodec, numpy views of them.
    nvb = NvjpegBatch(datas)
    pinned_np = nvb.pinned.numpy()
    pinned_datas = [pinned_np[o : o + len(d)] for o, d in zip(offsets, datas, strict=True)]
    few = {t: decoder(nvimgcodec.BackendKind.HW_GPU_ONLY, t) for t in (1, 2, 4)}
    # nvJPEG's batched hardware decoder (what the Finisher uses by default): one call, no GIL.
    from ringfeed.gpu import nvjpeg as _nvjpeg

    batched = _nvjpeg.HardwareDecoder(dev)
    # The same without interpolated chroma upsampling (the hardware replicates chroma), and
    # planar YCbCr output (no colour conversion by nvJPEG: the planes at their own sizes).
    replicated = _nvjpeg.HardwareDecoder(dev, flags=0)
    planar = _nvjpeg.HardwareDecoder(dev)
    # Each decoder's first decode (seconds beside a busy model) here, not in its row's window.
    for d in (batched, replicated, planar):
        d.warm()
    in_ptrs, lens, out_offs = nvb.ptrs, nvb.lens, nvb.offs
    side = torch.cuda.Stream()
    once = hw.decode(datas, cuda_stream=side.cuda_stream)
    torch.cuda.synchronize()
    if any(i is None for i in once):
        raise SystemExit("the hardware decoder refused some of these JPEGs; pick a dataset it decodes")
    hw_sizes = [(int(img.shape[1]), int(img.shape[0])) for img in once]
    from nvjpeg_probe import chroma_block

    # Each image's chroma factors; (0, 0) for a grey one (no chroma planes).
    fac = np.array([chroma_block(d.tobytes()) or (0, 0) for d in datas], dtype=np.int64)
    yw, yh = np.array([w for w, _ in hw_sizes]), np.array([h for _, h in hw_sizes])
    cw = np.where(fac[:, 0] > 0, -(-yw // np.maximum(fac[:, 0], 1)), 0)
    ch = np.where(fac[:, 1] > 0, -(-yh // np.maximum(fac[:, 1], 1)), 0)
    ysz, csz = (yw * yh + 255) // 256 * 256, (cw * ch + 255) // 256 * 256
    yuv_size = ysz + 2 * csz
    yuv_offs = np.concatenate([[0], np.cumsum(yuv_size[:-1])])
    yuv_planes = np.stack([yuv_offs, yuv_offs + ysz, yuv_offs + ysz + csz], 1).astype(np.uint64)
    yuv_pitches = np.stack([yw, np.maximum(cw, 1), np.maximum(cw, 1)], 1).astype(np.uint64)
    out = torch.empty((n, 224, 224, 3), dtype=torch.uint8, device=dev)
    from ringfeed.gpu import chroma_kernel as _chroma_kernel

    _chroma_kernel.warm(dev)
    # One replicated decode of the batch, for the rebuild alone.
    once_rep = nvb.decode(replicated, side)
    torch.cuda.synchronize()
    _finish_kernel.warm(dev, "NHWC", (224, 224))
    # The direct kernel of 970c170, for "finish/before" (the tiled kernel's baseline, same run).
    import _finish_kernel_before as before

    before.warm(dev, "NHWC", (224, 224))

    def table_of(places: np.ndarray) -> torch.Tensor:
        """The kernel's table (host memory, pinned) for images at `places` (`_hybrid._place`'s
        columns, a row each), each with a RandomResizedCrop-like record: the centre square of the
        image down to 224, bilinear with antialias, no flip. No Python per image, as the
        Finisher builds it."""
        k = len(places)
        h, w = places[:, 1], places[:, 2]
        side_len = np.minimum(h, w)
        const = lambda v: np.full(k, v, dtype=np.int64)  # noqa: E731
        flags = (1 << _hybrid.INTERPOLATION_SHIFT) | _hybrid.ANTIALIAS
        cols = [places[:, 0], places[:, 3], places[:, 4], places[:, 5], (w - side_len) // 2, (h - side_len) // 2]
        cols += [side_len, side_len, const(224), const(224), *[const(0)] * 4, const(224), const(224)]
        cols += [const(flags), const(0), np.arange(k, dtype=np.int64)]
        return torch.from_numpy(np.stack(cols, axis=1).astype(np.int64)).pin_memory()

    def table(images) -> torch.Tensor:
        """The same for decoded image objects: where each lies read per image (in Python)."""
        return table_of(np.array([_hybrid._place(img) for img in images], dtype=np.int64))

    # The images decoded once lie where they lie: their table is built once.
    once_table = table(once)
    # nvJPEG's outputs: one buffer a batch, each image at its offset, rows of 3·width bytes.
    nv_places = np.array([(0, h, w, w * 3, 3, 1) for w, h in hw_sizes], dtype=np.int64)

    def host() -> None:
        [arena[o : o + len(d)] for o, d in zip(offsets, datas, strict=True)]
        table(once)

    def parts(stream: torch.cuda.Stream) -> dict:
        """The GPU parts, on `stream`."""

        def decode_with(dec, src=datas) -> None:
            dec.decode(src, cuda_stream=stream.cuda_stream)
            stream.synchronize()

        def finish(t: torch.Tensor, kernel=_finish_kernel) -> None:
            with torch.cuda.stream(stream):
                kernel.finish(t.to(dev, non_blocking=True), out, "NHWC")
            stream.synchronize()

        def nvjpeg_batch() -> torch.Tensor:
            return nvb.decode(batched, stream)

        def nvjpeg_only() -> None:
            nvjpeg_batch()
            stream.synchronize()

        def nvjpeg_replicated() -> None:
            nvb.decode(replicated, stream)
            stream.synchronize()

        def nvjpeg_planar() -> None:
            with torch.cuda.stream(stream):
                buf = torch.empty(int(yuv_size.sum()), dtype=torch.uint8, device=dev)
            planar.decode(
                in_ptrs, lens, buf.data_ptr() + yuv_planes, yuv_pitches, stream.cuda_stream, output=_nvjpeg.OUTPUT_YUV
            )
            stream.synchronize()

        def nvjpeg_finish() -> None:
            buf = nvjpeg_batch()  # alive until finish() has synchronised
            places = nv_places.copy()
            places[:, 0] = buf.data_ptr() + out_offs.astype(np.int64)
            finish(table_of(places))

        def rebuild_rows(base: int) -> np.ndarray:
            """The chroma rebuild's table for a batch decoded at `base` (replicated chroma)."""
            block = np.where(fac > 0, fac, 1)
            rows = np.stack([base + out_offs.astype(np.int64), yh, yw, yw * 3, block[:, 0], block[:, 1]], axis=1)
            return rows.astype(np.int64)

        def rebuild(buf: torch.Tensor) -> None:
            rows = rebuild_rows(buf.data_ptr())
            with torch.cuda.stream(stream):
                _chroma_kernel.rebuild(torch.from_numpy(rows).pin_memory().to(dev, non_blocking=True), rows)

        def rebuild_only() -> None:
            rebuild(once_rep)  # in place, again and again: the cost, not the pixels
            stream.synchronize()

        def nvjpeg_rebuild_finish() -> None:
            buf = nvjpeg_batch()
            rebuild(buf)
            places = nv_places.copy()
            places[:, 0] = buf.data_ptr() + out_offs.astype(np.int64)
            finish(table_of(places))

        return {
            "decode-nvjpeg": nvjpeg_only,
            "decode-nvjpeg+finish": nvjpeg_finish,
            "decode-nvjpeg/replicated": nvjpeg_replicated,
            "decode-nvjpeg/planar": nvjpeg_planar,
            "rebuild": rebuild_only,
            "decode-nvjpeg+rebuild+finish": nvjpeg_rebuild_finish,
            "decode-hw": lambda: decode_with(hw),
            **({} if gpu is None else {"decode-gpu": lambda: decode_with(gpu)}),
            "decode-hw/pinned": lambda: decode_with(hw, pinned_datas),
            **{f"decode-hw/t{t}": (lambda d=d: decode_with(d)) for t, d in few.items()},
            "finish": lambda: finish(once_table),
            "finish/before": lambda: finish(once_table, before),
            "decode+finish": lambda: finish(table(hw.decode(datas, cuda_stream=stream.cuda_stream))),
        }

    # What kind of work beside the model costs its step, without a decoder: 2 ms of pure Python a
    # batch (the GIL); 192 tiny kernels a batch launched from Python (the GIL, the driver, the
    # GPU) or replayed from a CUDA graph (the GPU alone: one launch); 192 small host-to-device
    # copies a batch from pinned memory, from Python or from a graph. nvJPEG's batched hardware
    # decode does one copy and one kernel per image.
    tiny = torch.zeros(1024, device=dev)
    src = torch.zeros((192, 4096), dtype=torch.uint8).pin_memory()
    dst = torch.empty((192, 4096), dtype=torch.uint8, device=dev)

    def py_burn() -> None:
        end = time.perf_counter() + 0.002
        x = 0
        while time.perf_counter() < end:
            x += 1

    def kernels192(stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            for _ in range(192):
                tiny.add_(1.0)

    def copies192(stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            for i in range(192):
                dst[i].copy_(src[i], non_blocking=True)

    graphs = {}
    for name, fn in (("kernels192", kernels192), ("copies192", copies192)):
        g = torch.cuda.CUDAGraph()
        cap = torch.cuda.Stream()
        fn(cap)  # warm
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=cap):
            fn(cap)
        graphs[name] = g

    def replay(g: torch.cuda.CUDAGraph) -> None:
        with torch.cuda.stream(side):
            g.replay()
        side.synchronize()

    def eager(fn) -> None:
        fn(side)
        side.synchronize()

    # Issue 27's per-recipe cost and CUDA-graph experiment: a batch's client GPU work after the
    # decode, the finishing kernel and a recipe's per-image steps (the fused Triton kernels), with
    # their tables uploaded from pinned memory, launched per batch (as the Finisher does) or, for
    # TrivialAugmentWide, replayed from a CUDA graph captured once (what a graph would save: the
    # host's launches). The steps are what the server draws for RandomResizedCrop(224) + flip +
    # the recipe's ops on n samples (`ringfeed ops`), the same every batch.
    from ringfeed.gpu import ops_kernel as _ops_kernel

    jpg = a.out / "one.jpg"
    a.out.mkdir(parents=True, exist_ok=True)
    jpg.write_bytes(datas[0].tobytes())
    import ringfeed
    from ringfeed._transforms import as_views

    recipes = {
        "ta": [ringfeed.TrivialAugmentWide()],
        "ra": [ringfeed.RandAugment(2, 9)],
        "aa": [ringfeed.AutoAugment()],
        "jitter": [ringfeed.ColorJitter(0.4, 0.4, 0.4, 0.1), ringfeed.RandomGrayscale(0.2), ringfeed.GaussianBlur(23)],
    }
    rows_all = np.arange(n, dtype=np.int64)

    def drawn_steps(tail: list) -> np.ndarray:
        t = ringfeed.Compose([ringfeed.RandomResizedCrop(224), ringfeed.RandomHorizontalFlip(), *tail])
        pipeline = json.dumps(as_views(t).to_json())
        cli = [os.environ.get("RINGFEED_BIN", "ringfeed"), "ops", str(jpg), "--pipeline", pipeline, "--count", str(n)]
        r = subprocess.run(
            [*cli, "--seed", "1", "--out", str(a.out / "ops.bin")], capture_output=True, text=True, timeout=300
        )
        if r.returncode != 0:
            raise SystemExit(f"ringfeed ops failed: {r.stderr}")
        drawn = [json.loads(x)["gpu_ops"] or [] for x in r.stdout.splitlines()]
        recs = np.zeros((n, max(1, *(len(d) for d in drawn)), 16), dtype=np.int32)
        for i, d in enumerate(drawn):
            if d:
                recs[i, : len(d)] = np.array(d, dtype=np.int64).astype(np.int32)
        return recs

    def finisher_of(recs: np.ndarray):
        def run(stream: torch.cuda.Stream) -> None:
            with torch.cuda.stream(stream):
                _finish_kernel.finish(once_table.to(dev, non_blocking=True), out, "NHWC")
                _ops_kernel.run(out, recs, rows_all, "NHWC")

        return run

    finishers = {name: finisher_of(drawn_steps(tail)) for name, tail in recipes.items()}
    cap = torch.cuda.Stream()
    for run in finishers.values():
        for _ in range(3):  # compiles every variant, and leaves pinned blocks in the host cache
            run(cap)
    torch.cuda.synchronize()
    ta_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(ta_graph, stream=cap, capture_error_mode="thread_local"):
        finishers["ta"](cap)
    torch.cuda.synchronize()

    probes = {
        **{f"finish+{name}": (lambda f=f: eager(f)) for name, f in finishers.items()},
        "finish+ta@graph": lambda: replay(ta_graph),
        "py-2ms": py_burn,
        "kernels192": lambda: eager(kernels192),
        "kernels192@graph": lambda: replay(graphs["kernels192"]),
        "copies192": lambda: eager(copies192),
        "copies192@graph": lambda: replay(graphs["copies192"]),
    }

    # The same parts on a stream of the highest priority ("@hi"): whether the decode's and the
    # kernel's blocks waiting behind the model's is what slows them (and so the loop).
    high = torch.cuda.Stream(priority=-100)
    work = {"host": host, **probes, **parts(side), **{f"{k}@hi": v for k, v in parts(high).items()}}

    if a.model_stream == "side":
        MODEL_STREAM[0] = torch.cuda.Stream()
    model = getattr(torchvision.models, a.model)().to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(BATCH, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (BATCH,), device=dev)
    torch.cuda.synchronize()  # the model's stream may be another one
    warm: list[float] = []
    stop = threading.Event()
    t = threading.Thread(target=model_steps, args=(model, opt, x, y, stop, warm))
    t.start()
    time.sleep(3.0)
    stop.set()
    t.join()

    if gpu is None:
        a.parts = ",".join(p for p in a.parts.split(",") if p != "decode-gpu")
    unknown = [p for p in a.parts.split(",") if p not in ("alone", "decode-nvjpeg@process") and p not in work]
    if unknown:
        raise SystemExit(f"unknown --parts {unknown}: choose from alone, {', '.join(work)}")
    rows = []
    for part in a.parts.split(","):
        steps: list[float] = []
        stop = threading.Event()
        done = [0]

        def second(fn, stop: threading.Event, steps: list[float], done: list[int]) -> None:
            if fn is None:
                return
            while not stop.is_set():
                # At most `per_step` images per model step: the rate the client would need.
                if done[0] >= (len(steps) + 1) * n:
                    time.sleep(0.0005)
                    continue
                fn()
                done[0] += n

        child = None
        if part == "decode-nvjpeg@process":
            ctx = multiprocessing.get_context("spawn")
            steps_v, done_v = ctx.Value("l", 0), ctx.Value("l", 0)
            child_stop, ready = ctx.Event(), ctx.Event()
            child = ctx.Process(target=decode_process, args=(str(a.packed), n, steps_v, done_v, child_stop, ready))
            child.start()
            if not ready.wait(180):
                raise SystemExit("the decoding process did not start within 180 s")

            def relay(stop: threading.Event, steps: list[float], done: list[int], steps_v, done_v) -> None:
                """The model's step count to the child, its images back."""
                while not stop.is_set():
                    steps_v.value = len(steps)
                    done[0] = done_v.value
                    time.sleep(0.0005)

            s = threading.Thread(target=relay, args=(stop, steps, done, steps_v, done_v))
        else:
            s = threading.Thread(target=second, args=(work.get(part), stop, steps, done))
        m = threading.Thread(target=model_steps, args=(model, opt, x, y, stop, steps))
        m.start()
        s.start()
        t0, c0 = time.perf_counter(), time.process_time()
        time.sleep(a.seconds)
        stop.set()
        m.join()
        s.join()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if child is not None:
            done[0] = done_v.value
            child_stop.set()
            child.join(60)
        tail = steps[len(steps) // 5 :]  # the first fifth settles
        rows.append(
            {
                "part": part,
                "step_ms": float(np.mean(tail)),
                "step_p90_ms": float(np.percentile(tail, 90)),
                "steps": len(steps),
                "images_per_s": done[0] / wall,
                # The whole process: the model's thread, the second thread and the decoder's own.
                "cpu_cores": cpu / wall,
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    base = rows[0]["step_ms"] if rows and rows[0]["part"] == "alone" else None
    lines = [
        f"# What GPU decode costs {a.model}'s training step ({torch.cuda.get_device_name()})",
        "",
        f"`{' '.join(sys.argv)}`",
        "",
        "| beside the model | step ms | p90 ms | growth | second thread img/s | process CPU cores |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        growth = f"{(r['step_ms'] / base - 1) * 100:+.1f} %" if base else "n/a"
        lines.append(
            f"| {r['part']} | {r['step_ms']:.2f} | {r['step_p90_ms']:.2f} | {growth} | {r['images_per_s']:.0f} "
            f"| {r['cpu_cores']:.2f} |"
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "hybrid_step.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    (a.out / "hybrid_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
