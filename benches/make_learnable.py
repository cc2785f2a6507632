#!/usr/bin/env python3
# A copy of the company's offline learnable-set maker (make_learnable.py), kept here so that the
# accuracy comparison's data can be made from a clone; refresh it from there, do not edit it here.
"""A learnable ImageNet-like classification set, for accuracy comparisons between loaders.

    python3 make_learnable.py OUT_DIR [--train-per-class 300] [--val-per-class 50] [--grid 2] [--seed 0]

Writes OUT_DIR/train/<class>/*.jpg and OUT_DIR/val/<class>/*.jpg (ImageFolder layout). A class is
one cell of a grid x grid split of one of the colour photographs that make_photos.py uses (9
photographs x 4 cells = 36 classes by default; --grid 3 gives 81 smaller, harder classes); each image is a random crop of its quadrant, rescaled to an ImageNet-like size,
with brightness jitter, noise and JPEG quality 80-95. Telling classes apart needs local colour and
texture, so a small CNN learns it in a few epochs (ResNet-18 at 128 px reaches ~97 % top-1 on the
default set in 8 epochs: use fewer epochs or --grid 3 to stay off the ceiling), and how well it generalises depends on the
augmentation recipe: the point of comparing loaders on it. Train and val crops are drawn from
different random streams. Needs numpy, pillow and scikit-image.
"""
import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

import make_photos as mp

_SRC = None


def _sources():
    global _SRC
    if _SRC is None:
        _SRC = mp._load_sources()[: len(mp.SOURCES_COLOR)]
    return _SRC


def make_one(args):
    out, split, cls, i, seed, grid = args
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, cls, i])
    src = _sources()[cls // (grid * grid)]
    H, W = src.shape[:2]
    qy, qx = divmod(cls % (grid * grid), grid)
    y0, x0, qh, qw = qy * H // grid, qx * W // grid, H // grid, W // grid
    area = rng.uniform(0.3, 0.9)
    ch, cw = max(32, int(qh * np.sqrt(area))), max(32, int(qw * np.sqrt(area)))
    y = y0 + rng.integers(0, qh - ch + 1)
    x = x0 + rng.integers(0, qw - cw + 1)
    crop = src[y:y + ch, x:x + cw].astype(np.float32) * rng.uniform(0.8, 1.2)
    crop += rng.normal(0, 4, size=crop.shape)
    im = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8)).resize(mp._target_size(rng), Image.BICUBIC)
    d = os.path.join(out, split, f"c{cls:02d}")
    os.makedirs(d, exist_ok=True)
    im.save(os.path.join(d, f"{i:05d}.jpg"), "JPEG", quality=int(rng.integers(80, 96)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--train-per-class", type=int, default=300)
    p.add_argument("--val-per-class", type=int, default=50)
    p.add_argument("--grid", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    a = p.parse_args()
    classes = a.grid * a.grid * len(mp.SOURCES_COLOR)
    jobs = [(a.out, "train", c, i, a.seed, a.grid) for c in range(classes) for i in range(a.train_per_class)]
    jobs += [(a.out, "val", c, i, a.seed, a.grid) for c in range(classes) for i in range(a.val_per_class)]
    with ProcessPoolExecutor(a.jobs) as ex:
        list(ex.map(make_one, jobs, chunksize=32))
    print(f"{classes} classes: {classes * a.train_per_class} train, {classes * a.val_per_class} val images in {a.out}")


if __name__ == "__main__":
    main()
