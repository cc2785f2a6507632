#!/usr/bin/env python3
"""Augmentation recipes fed without a model: ringfeed against a DataLoader with torchvision v2, per core
and at many cores, same files, same run.

    python3 benches/e2e/recipe_rate.py --images DIR --packed DIR [--threads 1,15] [--batches 40]
        [--recipes rrc,full] [--loaders ringfeed,dataloader-tv2] [--device cpu|cuda] [--warmup-s 12]
        [--bin PATH] [--out DIR]

Recipes (torchvision's reference recipe names):
- ``rrc``: RandomResizedCrop(224) + RandomHorizontalFlip, normalised.
- ``full``: RandomResizedCrop(224) + RandomHorizontalFlip + TrivialAugmentWide + Normalize +
  RandomErasing(0.25) (torchvision's ``ta_wide`` recipe, as the issue's DataLoader baseline runs it).

Loaders:
- ``ringfeed``: ``ringfeed.Loader`` with ``ringfeed.Compose([...])`` of the same ops, ``threads=N``
  decode threads pinned (``autotune=False``), a private server (``harness.Server``) started for
  the run; normalisation and erasing on ``--device``.
- ``dataloader-tv2``: ``torch.utils.data.DataLoader`` over ``torchvision.datasets.ImageFolder`` (PIL
  decode) with ``torchvision.transforms.v2`` (``ToImage``, ``ToDtype(float32, scale=True)``,
  ``Normalize``, ``RandomErasing``), ``N`` workers, pinned memory; batches moved to ``--device``.

Each run draws batches for ``--warmup-s`` seconds and at least 5 batches, then times ``--batches``
batches of 256 (``harness.measure``, the GPU synchronised at both ends) and reports img/s; the
table gives ringfeed's rate over the DataLoader's at the same N ("x DataLoader"). Writes
recipe.json (a ``harness`` record; the baseline is dataloader-tv2) and recipe.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch
import torchvision
from _recipes import rf_recipe, tv_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness

BATCH = 256
SKIP = 5


def timed(batches, n: int, device: str, warmup_s: float) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else None
    return harness.measure(iter(batches), warmup_s=warmup_s, warmup_batches=SKIP, min_batches=n, sync=sync)["img_per_s"]


def dataloader(images: Path, recipe: str, workers: int, device: str):
    ds = torchvision.datasets.ImageFolder(str(images), transform=tv_recipe(recipe))
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        pin_memory=device == "cuda",
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    while True:
        for x, y in dl:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def ringfeed_loader(packed: Path, recipe: str, threads: int, device: str, sock: str):
    import ringfeed

    ld = ringfeed.Loader(
        packed,
        BATCH,
        transform=rf_recipe(recipe),
        device=device,
        server=ringfeed.Server(socket=sock),
        tuning=ringfeed.Tuning(autotune=False, threads=threads, slots=6),
        shuffle=True,
        drop_last=True,
    )
    yield from harness.epochs(ld)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--threads", default="1,15")
    ap.add_argument("--recipes", default="rrc,full")
    ap.add_argument("--loaders", default="ringfeed,dataloader-tv2")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path())
    harness.add_arguments(ap)
    a = ap.parse_args()
    top = max(int(t) for t in a.threads.split(","))
    results = []
    with harness.Server(top, binary=a.bin) as server:
        sock = server.sock
        for recipe in a.recipes.split(","):
            for n in (int(t) for t in a.threads.split(",")):
                for loader in a.loaders.split(","):
                    batches = (
                        ringfeed_loader(a.packed, recipe, n, a.device, sock)
                        if loader == "ringfeed"
                        else dataloader(a.images, recipe, n, a.device)
                    )
                    rate = timed(batches, a.batches, a.device, a.warmup_s)
                    del batches
                    r = {"recipe": recipe, "loader": loader, "threads": n, "img_per_s": rate, "device": a.device}
                    results.append(r)
                    print(json.dumps(r), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "host": platform.node(),
    }
    by = {(r["recipe"], r["loader"], r["threads"]): r["img_per_s"] for r in results}
    ratios = harness.against(
        results,
        value="img_per_s",
        by=["recipe", "threads"],
        keep=["loader"],
        baseline=lambda r: r["loader"] == "dataloader-tv2",
    )
    harness.write_record(
        a.out / "recipe.json", {"machine": meta, "runs": results}, args=a, baseline="dataloader-tv2", ratios=ratios
    )
    lines = [
        "# Augmentation recipes, no model: img/s (batch 256)",
        "",
        f"{meta['cpus']} CPU cores, torch {meta['torch']}, torchvision {meta['torchvision']}; device {a.device}; "
        f"{a.batches} timed batches after {a.warmup_s:g} s and at least {SKIP} batches.",
        "",
        "| recipe | threads / workers | ringfeed | DataLoader + torchvision v2 | x DataLoader |",
        "|---|---:|---:|---:|---:|",
    ]
    for recipe in a.recipes.split(","):
        for n in (int(t) for t in a.threads.split(",")):
            rf, dl = by.get((recipe, "ringfeed", n)), by.get((recipe, "dataloader-tv2", n))
            ratio = f"{rf / dl:.2f}" if rf and dl else "-"
            lines.append(f"| {recipe} | {n} | {rf or 0:,.0f} | {dl or 0:,.0f} | {ratio} |")
    (a.out / "recipe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
