#!/usr/bin/env python3
# A copy of the company's offline photo corpus maker (make_photos.py), kept here so that every
# benchmark's corpus can be made from a clone; refresh it from there, do not edit it here.
"""Deterministic ImageNet-like JPEG corpus in ImageFolder layout.

Every image is a crop of a real photograph shipped inside scikit-image,
rescaled to an ImageNet-like size, jittered, lightly noised and encoded as a
JPEG (quality 85-97, a few progressive, a few grayscale), so that decode cost
per image is close to that of real ImageNet files (~110 KB, ~500x375).

    python3 make_photos.py OUT_DIR --count 10000 --classes 100 --seed 0

Needs numpy, pillow and scikit-image (pip install numpy pillow scikit-image).
Writes OUT_DIR/<class>/<index>.jpg and OUT_DIR/manifest.tsv (path, label, bytes).
"""
import argparse
import io
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

SOURCES_COLOR = ["astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg",
                 "ihc.png", "motorcycle_left.png", "motorcycle_right.png", "retina.jpg",
                 "rocket.jpg"]
SOURCES_GRAY = ["camera.png", "brick.png", "grass.png", "gravel.png", "moon.png", "coins.png"]
COMMON_SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 500), (640, 480), (480, 640)]

_SRC = None


def _load_sources():
    import skimage
    d = os.path.join(os.path.dirname(skimage.__file__), "data")
    imgs = []
    for name in SOURCES_COLOR + SOURCES_GRAY:
        im = Image.open(os.path.join(d, name)).convert("RGB")
        # upsample small sources so crops still carry photographic detail
        if min(im.size) < 600:
            s = 600 / min(im.size)
            im = im.resize((int(im.width * s), int(im.height * s)), Image.BICUBIC)
        imgs.append(np.asarray(im))
    return imgs


def _target_size(rng):
    if rng.random() < 0.7:
        w, h = COMMON_SIZES[rng.integers(len(COMMON_SIZES))]
        j = rng.uniform(0.9, 1.1)
        return max(64, int(w * j)), max(64, int(h * j))
    long_side = rng.integers(200, 801)
    aspect = np.exp(rng.uniform(np.log(0.5), np.log(2.0)))
    if aspect >= 1:
        return int(long_side), max(64, int(long_side / aspect))
    return max(64, int(long_side * aspect)), int(long_side)


def make_one(args):
    i, seed, classes, out = args
    global _SRC
    if _SRC is None:
        _SRC = _load_sources()
    rng = np.random.default_rng([seed, i])
    src = _SRC[rng.integers(len(_SRC))]
    H, W = src.shape[:2]
    area = rng.uniform(0.25, 1.0)
    ch, cw = int(H * np.sqrt(area)), int(W * np.sqrt(area))
    y, x = rng.integers(0, H - ch + 1), rng.integers(0, W - cw + 1)
    crop = src[y:y + ch, x:x + cw].astype(np.float32)
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    crop = crop * rng.uniform(0.7, 1.3, size=3) + rng.uniform(-20, 20)
    w, h = _target_size(rng)
    im = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize((w, h), Image.BILINEAR)
    arr = np.asarray(im).astype(np.float32)
    arr += rng.normal(0, rng.uniform(6.0, 14.0), size=arr.shape)
    im = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if rng.random() < 0.02:
        im = im.convert("L")
    label = int(rng.integers(classes))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=int(rng.integers(85, 98)), progressive=bool(rng.random() < 0.05))
    rel = os.path.join(f"c{label:04d}", f"{i:08d}.jpg")
    path = os.path.join(out, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return rel, label, len(buf.getvalue())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = [(i, a.seed, a.classes, a.out) for i in range(a.count)]
    with ProcessPoolExecutor(a.jobs) as ex, open(os.path.join(a.out, "manifest.tsv"), "w") as m:
        total = 0
        for rel, label, n in ex.map(make_one, work, chunksize=64):
            m.write(f"{rel}\t{label}\t{n}\n")
            total += n
    print(f"{a.count} images, {total / a.count / 1024:.1f} KiB average, {total / 2**20:.0f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
