#!/usr/bin/env python3
"""Makes a small synthetic image corpus in ImageFolder layout, for the demo and smoke tests.

    python3 scripts/make_corpus.py OUT --count 512 --classes 8 --seed 0

Images are smooth colour fields with shapes and noise, 160-520 px on a side, mostly JPEG
(quality 80-95, some progressive, some grayscale) with a few PNGs. Deterministic for a seed.
Benchmarks use the photographic corpus of shared/datasets/make_photos.py instead.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def make_image(rng: np.random.Generator) -> Image.Image:
    w, h = (int(x) for x in rng.integers(160, 521, size=2))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(0, 255, size=3)
    slope = rng.uniform(-0.6, 0.6, size=(3, 2))
    rgb = np.stack([base[c] + slope[c, 0] * xx + slope[c, 1] * yy for c in range(3)], axis=-1)
    rgb += rng.normal(0, 12, size=rgb.shape)
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 7))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(10, w // 2 + 11)), y0 + int(rng.integers(10, h // 2 + 11))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
    return img


def encode(img: Image.Image, rng: np.random.Generator) -> tuple[bytes, str]:
    buf = io.BytesIO()
    r = rng.random()
    if r < 0.05:
        img.save(buf, "PNG")
        return buf.getvalue(), "png"
    if r < 0.12:
        img = img.convert("L")
    img.save(buf, "JPEG", quality=int(rng.integers(80, 96)), progressive=bool(rng.random() < 0.1))
    return buf.getvalue(), "jpg"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    total = 0
    for i in range(a.count):
        cls = a.out / f"class_{i % a.classes:03d}"
        cls.mkdir(parents=True, exist_ok=True)
        data, ext = encode(make_image(rng), rng)
        (cls / f"{i:06d}.{ext}").write_bytes(data)
        total += len(data)
    print(f"wrote {a.count} images ({total / 1e6:.1f} MB) in {a.classes} classes to {a.out}")


if __name__ == "__main__":
    main()
