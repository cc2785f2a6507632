#!/usr/bin/env python3
"""The demo's training loop: ringfeed feeds a small CNN on the CPU, and the loop reports its
throughput and how much of each step it spent waiting for data.

    python3 scripts/demo_train.py DATASET [--epochs 2] [--batch-size 64] [--size 112]

DATASET is a packed dataset (or an LMDB). The loader starts a `ringfeed serve` sidecar itself
when none is listening (the embedded default), and the sidecar exits after the loop ends.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import ringfeed


def model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=112)
    a = ap.parse_args()

    torch.manual_seed(0)
    loader = ringfeed.Loader(
        a.dataset,
        batch_size=a.batch_size,
        transform=ringfeed.Compose([ringfeed.RandomResizedCrop(a.size), ringfeed.RandomHorizontalFlip()]),
        layout="NCHW",
        shuffle=True,
        seed=0,
        device="cpu",
    )
    with loader:
        classes = max(1, len(loader.classes))
        net = model(classes)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
        for epoch in range(a.epochs):
            loader.set_epoch(epoch)
            images_seen, wait, loss_sum, steps = 0, 0.0, 0.0, 0
            start = time.perf_counter()
            t = start
            for images, labels in loader:
                wait += time.perf_counter() - t
                x = (images.float() - mean) / std
                loss = nn.functional.cross_entropy(net(x), labels.clamp(min=0))
                opt.zero_grad()
                loss.backward()
                opt.step()
                images_seen += images.shape[0]
                loss_sum += loss.item()
                steps += 1
                t = time.perf_counter()
            total = time.perf_counter() - start
            print(
                f"epoch {epoch}: {images_seen} images in {total:.2f} s = {images_seen / total:.0f} img/s, "
                f"waited for data {wait / total * 100:.1f} % of the time, mean loss {loss_sum / max(steps, 1):.3f}"
            )
        # What the server's autotuner made of this loop (`ringfeed top` shows the same, live).
        server = loader.stats()["server"]
        if server is not None:
            print(
                f"server: {server['threads']} decode threads, {server['depth']} batches in flight; "
                f"per sample {server['stage_us']['decode']:.0f} µs decode + {server['stage_us']['transform']:.0f} µs "
                f"transform; last tuning: {server['tune'] or 'none'}"
            )
        # The loader alone, with no model: how fast ringfeed delivers on this machine.
        loader.set_epoch(a.epochs)
        start, n = time.perf_counter(), 0
        for images, _ in loader:
            n += images.shape[0]
        total = time.perf_counter() - start
        print(f"loader alone: {n} images in {total:.2f} s = {n / total:.0f} img/s")


if __name__ == "__main__":
    main()
