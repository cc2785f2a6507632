#!/usr/bin/env python3
"""Accuracy parity: the same model, recipe and seeds trained once fed by ringfeed and once by a torch
DataLoader with the torchvision v2 equivalent; top-1 on the same validation set, same evaluator.

    python3 benches/e2e/accuracy.py --data DIR --packed DIR [--seeds 0,1,2] [--recipes rrc,full]
        [--loaders ringfeed,ringfeed-share-0.5,ringfeed-host,dataloader]
        [--epochs 5] [--size 112] [--workers 15] [--bin PATH] [--out DIR]

``--loaders``: ``ringfeed`` (hybrid decode with the autotuned share: the GPU share of each batch
decoded and augmented on the GPU, protocol 1.8), ``ringfeed-share-S`` (the share pinned at S),
``ringfeed-host`` (every sample on the server's CPU), ``dataloader``.

``--data`` is ``make_learnable.py``'s output (``train/`` and ``val/`` ImageFolders); ``--packed`` is
``ringfeed pack DATA/train``. Recipes:
- ``rrc``: RandomResizedCrop(size) + RandomHorizontalFlip + Normalize;
- ``full``: RandomResizedCrop(size) + RandomHorizontalFlip + TrivialAugmentWide + Normalize +
  RandomErasing(0.25), then per batch RandomChoice([MixUp(0.2), CutMix(1.0)]) (torchvision's
  reference recipe).
Model: torchvision ResNet-18 (random init seeded by the seed), bf16 autocast, channels_last, SGD
(momentum 0.9, nesterov, one-cycle to ``--lr``, weight decay 5e-5), batch 256. Evaluation for every model:
one torchvision DataLoader, Resize(size * 8 / 7) + CenterCrop(size), PIL decode. The loaders differ
only in who makes the training batches (and their random numbers: ringfeed's generator is not
torch's). ringfeed reads from a private server (``harness.Server``, ``--workers`` threads). Nothing
is timed, so nothing is warmed up. Writes accuracy.json (a ``harness`` record; the baseline is the
DataLoader, the ratio ringfeed's mean top-1 over its, per recipe) and accuracy.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision
from _recipes import MEAN, STD, rf_recipe, tv_recipe
from torch import nn
from torchvision.transforms import v2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness

BATCH = 256


def batches_dataloader(data: Path, recipe: str, size: int, workers: int, seed: int, classes: int):
    g = torch.Generator()
    g.manual_seed(seed)
    ds = torchvision.datasets.ImageFolder(str(data / "train"), transform=tv_recipe(recipe, size))
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=4,
        generator=g,
    )
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])
    while True:
        for x, y in dl:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            if recipe == "full":
                x, y = mix(x, y)
            yield x.contiguous(memory_format=torch.channels_last), y


def batches_ringfeed(
    packed: Path, recipe: str, size: int, workers: int, seed: int, classes: int, sock: str, gpu_decode: object = "auto"
):
    import ringfeed

    mix = None
    if recipe == "full":
        mix = ringfeed.RandomChoice(
            [ringfeed.MixUp(alpha=0.2, num_classes=classes), ringfeed.CutMix(alpha=1.0, num_classes=classes)]
        )
    ld = ringfeed.Loader(
        packed,
        BATCH,
        transform=rf_recipe(recipe, size),
        batch_transform=mix,
        device="cuda",
        seed=seed,
        server=ringfeed.Server(socket=sock),
        tuning=ringfeed.Tuning(threads=workers, slots=6),
        gpu_decode=gpu_decode,
        shuffle=True,
        drop_last=True,
    )
    yield from harness.epochs(ld)


def gpu_decode_of(loader: str) -> object:
    """``ringfeed``: hybrid decode autotuned (the default); ``ringfeed-host``: every sample decoded
    and augmented by the server; ``ringfeed-share-S``: the GPU share pinned at ``S``."""
    if loader == "ringfeed-host":
        return False
    if loader.startswith("ringfeed-share-"):
        return float(loader.removeprefix("ringfeed-share-"))
    return "auto"


def evaluate(model: nn.Module, data: Path, size: int, workers: int) -> float:
    tf = v2.Compose(
        [
            v2.Resize(size * 8 // 7, antialias=True),
            v2.CenterCrop(size),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )
    ds = torchvision.datasets.ImageFolder(str(data / "val"), transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=500, num_workers=workers)
    model.eval()
    right = total = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for x, y in dl:
            out = model(x.cuda().contiguous(memory_format=torch.channels_last))
            right += int((out.argmax(1).cpu() == y).sum())
            total += len(y)
    model.train()
    return right / total


def train_one(batches, steps: int, seed: int, classes: int, lr: float) -> nn.Module:
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=classes).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.25)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(steps):
        x, y = next(batches)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    torch.cuda.synchronize()
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--recipes", default="rrc,full")
    ap.add_argument("--loaders", default="ringfeed,dataloader")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--workers", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path())
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    classes = len([d for d in (a.data / "train").iterdir() if d.is_dir()])
    n_train = sum(1 for _ in (a.data / "train").rglob("*.jpg"))
    steps = a.epochs * (n_train // BATCH)
    results = []
    with harness.Server(a.workers, binary=a.bin) as server:
        sock = server.sock
        for recipe in a.recipes.split(","):
            for seed in (int(s) for s in a.seeds.split(",")):
                for loader in a.loaders.split(","):
                    t = time.perf_counter()
                    batches = (
                        batches_ringfeed(
                            a.packed, recipe, a.size, a.workers, seed, classes, sock, gpu_decode_of(loader)
                        )
                        if loader.startswith("ringfeed")
                        else batches_dataloader(a.data, recipe, a.size, a.workers, seed, classes)
                    )
                    model = train_one(batches, steps, seed, classes, a.lr)
                    seconds = time.perf_counter() - t
                    del batches
                    top1 = evaluate(model, a.data, a.size, a.workers)
                    r = {
                        "recipe": recipe,
                        "seed": seed,
                        "loader": loader,
                        "top1": top1,
                        "steps": steps,
                        "train_seconds": seconds,
                    }
                    results.append(r)
                    print(json.dumps(r), flush=True)
                    del model
                    torch.cuda.empty_cache()
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "host": platform.node(),
        "classes": classes,
        "train_images": n_train,
        "epochs": a.epochs,
        "size": a.size,
    }
    mean_top1 = lambda recipe, loader: statistics.mean(  # noqa: E731
        [r["top1"] for r in results if (r["recipe"], r["loader"]) == (recipe, loader)] or [float("nan")]
    )
    ratios = {rc: harness.ratio(mean_top1(rc, "ringfeed"), mean_top1(rc, "dataloader")) for rc in a.recipes.split(",")}
    harness.write_record(
        a.out / "accuracy.json", {"machine": meta, "runs": results}, args=a, baseline="dataloader", ratios=ratios
    )
    lines = [
        "# Accuracy parity: ResNet-18 top-1 on make_learnable's validation set",
        "",
        f"{meta['gpu']}; {classes} classes, {n_train} training images, {a.epochs} epochs at {a.size} px, batch "
        f"{BATCH}, lr {a.lr}; seeds {a.seeds}. Same model, optimiser and evaluator; only the training batches' "
        "loader differs.",
        "",
        "| recipe | loader | top-1 per seed | mean | std |",
        "|---|---|---|---:|---:|",
    ]
    for recipe in a.recipes.split(","):
        for loader in a.loaders.split(","):
            accs = [r["top1"] for r in results if r["recipe"] == recipe and r["loader"] == loader]
            if not accs:
                continue
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            per = ", ".join(f"{100 * v:.2f}" for v in accs)
            lines.append(f"| {recipe} | {loader} | {per} | {100 * statistics.mean(accs):.2f} | {100 * sd:.2f} |")
    (a.out / "accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
