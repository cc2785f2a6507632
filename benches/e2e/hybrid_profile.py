#!/usr/bin/env python3
"""Where a hybrid-decode batch's host time goes on the GPU machine.

    python3 benches/e2e/hybrid_profile.py --images DIR --packed DIR [--threads 6] [--share 1.0] [--bin PATH]

1. Stage timings of the client's finishing work on 256 files of DIR, each stage synchronised:
   nvImageCodec's batched decode (numpy buffers, and CodeStreams made beforehand), the decoded
   images as torch tensors (``__cuda_array_interface__`` and DLPack), the copy into the padded
   batch, the weights, the two products and the write.
2. cProfile of a Loader at ``gpu_decode=share`` over 30 batches, after 5 (a profile, not a rate:
   the threads and the share are pinned, so there is nothing to settle), on a private
   ``harness.Server``: the functions the loop spends its time in.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness


def timed(label: str, fn, reps: int = 5):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        out = fn()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / reps * 1e3
    print(f"{label:60s} {ms:8.2f} ms / 256 images", flush=True)
    return out


def stages(images: Path) -> None:
    from nvidia import nvimgcodec

    from ringfeed import PackedDataset

    packed = Path(str(images).replace("photos", "packed"))
    with PackedDataset(packed) as ds:
        datas = [np.frombuffer(bytes(ds.sample(i).data), dtype=np.uint8).copy() for i in range(256)]
    dec = nvimgcodec.Decoder(
        backends=[
            nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY),
            nvimgcodec.Backend(nvimgcodec.BackendKind.GPU_ONLY),
        ]
    )
    stream = torch.cuda.Stream()
    imgs = timed("decode(list of numpy)", lambda: dec.decode(datas, cuda_stream=stream.cuda_stream))
    streams = [nvimgcodec.CodeStream(d) for d in datas]
    timed("decode(list of CodeStream)", lambda: dec.decode(streams, cuda_stream=stream.cuda_stream))
    timed("CodeStream(...) x256", lambda: [nvimgcodec.CodeStream(d) for d in datas])
    timed("torch.as_tensor(img) x256", lambda: [torch.as_tensor(i, device="cuda") for i in imgs])
    timed("torch.from_dlpack(img) x256", lambda: [torch.from_dlpack(i) for i in imgs])
    ts = [torch.as_tensor(i, device="cuda") for i in imgs]
    ph = max(t.shape[0] for t in ts)
    pw = max(t.shape[1] for t in ts)
    x = torch.zeros((256, ph, pw, 3), dtype=torch.float16, device="cuda")

    def copy() -> None:
        for i, t in enumerate(ts):
            x[i, : t.shape[0], : t.shape[1]] = t

    timed(f"copy into padded fp16 [256, {ph}, {pw}, 3]", copy)
    from ringfeed.gpu import hybrid as _hybrid

    rec = np.zeros((256, _hybrid.RECORD_LEN), dtype=np.int32)
    for i, t in enumerate(ts):
        h, w = t.shape[0], t.shape[1]
        rec[i] = [0, 1, w, h, 0, 0, w, h, 224, 224, 0, 0, 0, 0, 224, 224, (1 << 2) | 16, 0]
    fin = _hybrid.Finisher(torch.device("cuda"), "nvimgcodec", "NCHW", (224, 224))
    image = torch.empty((256, 3, 224, 224), dtype=torch.uint8, device="cuda")
    where = np.arange(256)
    timed("Finisher._finish (copy, weights, products, write)", lambda: fin._finish(rec, ts, image, where))
    # The Triton kernel (RINGFEED_GPU_FINISH=triton): the table from nvImageCodec's images, then
    # one launch; the first call compiles it.
    kfin = _hybrid.Finisher(torch.device("cuda"), "nvimgcodec", "NCHW", (224, 224), geometry="triton")

    def table() -> np.ndarray:
        t = rec.astype(np.int64)
        t[:, 0:4] = [(p[0], p[3], p[4], p[5]) for p in map(_hybrid._place, imgs)]
        return np.concatenate([t, where.astype(np.int64)[:, None]], axis=1)

    kfin._kernel.finish(kfin._upload(table()), image, "NCHW")
    timed("triton: the table from 256 images", table)
    timed("triton: table + upload + kernel", lambda: kfin._kernel.finish(kfin._upload(table()), image, "NCHW"))
    import threading

    def spin(seconds: float) -> int:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    alone = spin(0.2)
    worker = threading.Thread(target=lambda: [dec.decode(datas, cuda_stream=stream.cuda_stream) for _ in range(8)])
    worker.start()
    beside = spin(0.2)
    worker.join()
    print(f"a Python loop beside a decoding thread runs at {beside / alone * 100:.0f} % of its speed alone (GIL)")
    arena = np.concatenate(datas)
    offs = np.cumsum([0] + [len(d) for d in datas[:-1]])
    rec[:, 0], rec[:, 1] = offs, [len(d) for d in datas]
    with torch.cuda.stream(stream):
        timed("Finisher(...) whole (decode + finish)", lambda: fin(rec, arena, image, stream))
        timed("Finisher(...) whole, triton (decode + finish)", lambda: kfin(rec, arena, image, stream))


def profile(packed: Path, threads: int, share: float, quiet: bool = False, binary: Path | None = None) -> None:
    import ringfeed

    t = ringfeed.Compose(
        [
            ringfeed.RandomResizedCrop(224),
            ringfeed.RandomHorizontalFlip(),
            ringfeed.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    with (
        harness.Server(15, binary=binary) as server,
        ringfeed.Loader(
            packed,
            256,
            t,
            device="cuda",
            server=ringfeed.Server(socket=server.sock),
            tuning=ringfeed.Tuning(threads=threads, autotune=False),
            gpu_decode=share,
            dtype=torch.bfloat16,
            shuffle=True,
            drop_last=True,
        ) as ld,
    ):
        it = harness.epochs(ld)
        harness.warm_up(it, 0.0, 5)
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(30):
            next(it)
        torch.cuda.synchronize()
        prof.disable()
        dt = time.perf_counter() - t0
        print(f"loader, share {share}, {threads} threads: {30 * 256 / dt:.0f} img/s", flush=True)
        if quiet:
            return
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        print(s.getvalue()[-6000:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=6)
    ap.add_argument("--share", type=float, default=1.0)
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    stages(a.images)
    profile(a.packed, a.threads, a.share, binary=a.bin)
    for share in (0.0, 0.5, 0.75):
        profile(a.packed, a.threads, share, quiet=True, binary=a.bin)


if __name__ == "__main__":
    main()
