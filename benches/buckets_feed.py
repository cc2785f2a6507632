#!/usr/bin/env python3
"""Aspect-bucketed feed rate (issue 29, item 5): `ringfeed.Loader` with `AspectBuckets` over an
image folder of photos of many shapes, beside what such users run today: torchvision's
`ImageFolder` + PIL + a `DataLoader` with a batch sampler that groups samples by the same buckets
(sizes read from PIL headers up front), resizing to cover and cropping with torchvision v2. Same
run, same folder, same buckets, same batch size; the figure is images per second delivered to a
loop that does nothing else (CPU tensors).

    python3 benches/buckets_feed.py --out DIR [--count 400] [--side 1024] [--threads 2]
        [--workers 2] [--batch-size 16] [--rounds 3] [--seconds 8] [--warmup-s 4] [--bin PATH]

The photos are written once into `--out`/photos: smooth pictures with noise, JPEG quality 90,
sizes drawn so that the area is about `--side`² and the ratio spread over 0.5..2. Each
configuration runs `--rounds` times, interleaved; the figure is the median.
`--threads` decode threads for the server (tuner off) and `--workers` DataLoader workers: give
both the same CPUs.
"""

from __future__ import annotations

import argparse
import io
import math
import random
import statistics
from pathlib import Path
from typing import Any

import harness
import numpy as np

import ringfeed

CONFIGS = ("ringfeed", "DataLoader + PIL")


def write_photos(dest: Path, count: int, side: int) -> Path:
    """`count` JPEGs of about `side`² pixels, ratios log-uniform in 0.5..2, in two classes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        ratio = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
        h = max(16, int(side / math.sqrt(ratio) * rng.uniform(0.8, 1.25)))
        w = max(16, int(h * ratio))
        small = rng.integers(0, 256, (h // 32 + 2, w // 32 + 2, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
        noisy = np.asarray(img, dtype=np.int16) + rng.integers(-6, 7, (h, w, 3))
        p = dest / ("a" if i % 2 else "b") / f"{i:05d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        p.write_bytes(buf.getvalue())
    return dest


class _BucketBatches:
    """A batch sampler grouping an ImageFolder's samples by bucket (shuffled, full batches only), as
    the usual bucketing recipes do."""

    def __init__(self, buckets: list[int], batch_size: int, seed: int) -> None:
        self.buckets, self.batch_size, self.seed, self.epoch = buckets, batch_size, seed, 0

    def __iter__(self) -> Any:
        rng = random.Random(self.seed * 1000 + self.epoch)
        self.epoch += 1
        order = list(range(len(self.buckets)))
        rng.shuffle(order)
        groups: dict[int, list[int]] = {}
        for i in order:
            groups.setdefault(self.buckets[i], []).append(i)
        batches = [g[k : k + self.batch_size] for g in groups.values() for k in range(0, len(g), self.batch_size)]
        batches = [b for b in batches if len(b) == self.batch_size]
        rng.shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        return sum(1 for _ in iter(self))


class _Bucketed:
    """ImageFolder samples resized to cover their bucket and randomly cropped to it (torchvision v2)."""

    def __init__(self, folder: Path, sizes: list[tuple[int, int]], buckets: list[int], table: list[tuple[int, int]]):
        import torchvision

        self.ds = torchvision.datasets.ImageFolder(str(folder))
        self.sizes, self.buckets, self.table = sizes, buckets, table

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        import torch
        from PIL import Image, ImageOps
        from torchvision.transforms.v2 import functional as tvf

        path, label = self.ds.samples[i]
        with Image.open(path) as im:  # as ImageFolder's loader, EXIF orientation applied
            img = ImageOps.exif_transpose(im).convert("RGB")
        t = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        bh, bw = self.table[self.buckets[i]]
        h, w = t.shape[1:]
        nh, nw = (bh, w * bh // h) if w * bh >= bw * h else (h * bw // w, bw)
        t = tvf.resize(t, [nh, nw], antialias=True)
        top, left = random.randint(0, nh - bh), random.randint(0, nw - bw)
        return tvf.crop(t, top, left, bh, bw).permute(1, 2, 0).contiguous(), label


def dataloader(folder: Path, tf: ringfeed.AspectBuckets, workers: int, batch: int) -> Any:
    import torch
    from PIL import Image, ImageOps

    table = tf.buckets
    sizes = []
    for p in sorted(p for d in sorted(folder.iterdir()) for p in d.iterdir()):
        with Image.open(p) as im:
            w, h = im.size
            if ImageOps.exif_transpose(im).size != (w, h):
                w, h = h, w
        sizes.append((w, h))
    ratios = [math.log(bw / bh) for bh, bw in table]
    buckets = [min(range(len(table)), key=lambda k: abs(math.log(w / h) - ratios[k])) for w, h in sizes]
    ds = _Bucketed(folder, sizes, buckets, table)
    return torch.utils.data.DataLoader(
        ds,
        batch_sampler=_BucketBatches(buckets, batch, 0),
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--side", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    harness.add_arguments(ap, warmup_s=4.0)
    a = ap.parse_args()
    photos = a.out / "photos"
    if not photos.is_dir():
        write_photos(photos, a.count, a.side)
    tf = ringfeed.AspectBuckets(area=a.side * a.side, min_ratio=0.5, max_ratio=2.0, step=64)
    runs: list[dict[str, Any]] = []
    with harness.Server(a.threads, binary=a.bin) as server:
        for r in range(a.rounds):
            for config in CONFIGS:
                if config == "ringfeed":
                    with ringfeed.Loader(
                        photos,
                        a.batch_size,
                        tf,
                        server=ringfeed.Server(socket=server.sock),
                        tuning=ringfeed.Tuning(autotune=False, threads=a.threads),
                    ) as ld:
                        m = harness.measure(harness.epochs(ld), warmup_s=a.warmup_s, min_seconds=a.seconds)
                else:
                    dl = dataloader(photos, tf, a.workers, a.batch_size)
                    m = harness.measure(harness.epochs(dl), warmup_s=a.warmup_s, min_seconds=a.seconds)
                    del dl
                row = {"config": config, "round": r, "img_per_s": m["img_per_s"], "batches": m["batches"]}
                runs.append(row)
                print(row, flush=True)
    med = {c: statistics.median(float(r["img_per_s"]) for r in runs if r["config"] == c) for c in CONFIGS}
    ratio = harness.ratio(med["ringfeed"], med["DataLoader + PIL"])
    harness.write_record(
        a.out / "buckets_feed.json",
        {"runs": runs, "median": med},
        args=a,
        baseline="DataLoader + PIL",
        ratios={"ringfeed": ratio},
    )
    lines = [
        f"# Aspect-bucketed feed rate, {a.side} px",
        "",
        f"{harness.cpu_model()}; {a.count} JPEGs of about {a.side}² px, ratios 0.5..2; "
        f"AspectBuckets(area={a.side}², step=64, crop='random'), batch {a.batch_size}; ringfeed with "
        f"{a.threads} decode threads (tuner off), the DataLoader with {a.workers} workers; {a.rounds} interleaved "
        f"rounds of {a.seconds:g} s after {a.warmup_s:g} s of warm-up.",
        "",
        "| loader | img/s (median) | per round |",
        "|---|---:|---|",
    ]
    for c in CONFIGS:
        per = ", ".join(f"{float(r['img_per_s']):.1f}" for r in runs if r["config"] == c)
        lines.append(f"| {c} | {med[c]:.1f} | {per} |")
    if ratio is not None:
        lines += ["", f"ringfeed / DataLoader: {ratio:.2f}x"]
    (a.out / "buckets_feed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
