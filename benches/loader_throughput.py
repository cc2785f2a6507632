#!/usr/bin/env python3
"""Delivery rate of `ringfeed.Loader` with no model: images/s at which batches reach the training
loop (CPU views, or CUDA tensors after the host-to-device copy).

    python3 benches/loader_throughput.py DATASET [--device cpu|cuda] [--threads N] [--batch-size 256]
        [--size 224] [--epochs 2] [--warmup-s 12] [--bin PATH] [--json OUT]

Starts its own `ringfeed serve` (`harness.Server`: --bin, RINGFEED_BIN, PATH or the workspace
build) on a private socket with `--threads` decode threads, so runs at different thread counts
are comparable. The loader first runs `--warmup-s` seconds (page cache, decoders, ring); then
`--epochs` windows of one epoch's batches each are timed (a window may straddle two epochs), and
the figure is their mean. No baseline is measured (`ringfeed bench DATASET` has one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import harness

import ringfeed
from ringfeed import bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=2, help="timed windows of one epoch's batches each")
    ap.add_argument("--json", type=Path, default=None)
    harness.add_arguments(ap)
    a = ap.parse_args()

    sync = None
    if a.device.startswith("cuda"):
        import torch

        sync = torch.cuda.synchronize
    tf = bench.make_transform("rrc-flip", a.size)
    with (
        harness.Server(a.threads, binary=a.bin) as server,
        ringfeed.Loader(
            a.dataset,
            a.batch_size,
            transform=tf,
            device=a.device,
            server=ringfeed.Server(socket=server.sock),
            shuffle=True,
            drop_last=True,
        ) as ld,
    ):
        batches = harness.epochs(ld)
        warm = harness.warm_up(batches, a.warmup_s)
        rates = []
        for window in range(a.epochs):
            r = harness.timed(batches, min_batches=len(ld), sync=sync)
            rates.append(r["img_per_s"])
            print(
                f"window {window}: {r['images']} images, {r['img_per_s']:.0f} img/s ({a.threads} threads, {a.device})",
                flush=True,
            )
    result = {
        "threads": a.threads,
        "device": a.device,
        "batch_size": a.batch_size,
        "size": a.size,
        "img_per_s": statistics.mean(rates),
        "epochs": rates,
        "warmup": warm,
    }
    print(json.dumps(result))
    if a.json:
        harness.write_record(a.json, result, args=a, indent=None)


if __name__ == "__main__":
    main()
