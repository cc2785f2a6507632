#!/usr/bin/env python3
"""Delivery rate of `ringfeed.Loader` with no model: images/s at which batches reach the training
loop (CPU views, or CUDA tensors after the host-to-device copy).

    python3 benches/loader_throughput.py DATASET [--device cpu|cuda] [--threads N] [--batch-size 256]
        [--size 224] [--epochs 2] [--json OUT]

Starts its own `ringfeed serve` (RINGFEED_BIN or PATH) on a private socket with `--threads`
decode threads, so runs at different thread counts are comparable. The first epoch warms the page
cache and the decoders; the figure is the mean over the later epochs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import ringfeed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    binary = os.environ.get("RINGFEED_BIN") or shutil.which("ringfeed") or "ringfeed"
    work = Path(tempfile.mkdtemp(prefix="rfb-", dir="/tmp"))
    sock = work / "ringfeed.sock"
    cmd = [binary, "serve", "--socket", str(sock), "--threads", str(a.threads)]
    server = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.05)
        tf = ringfeed.RandomResizedCrop(a.size) + ringfeed.Flip()
        rates = []
        with ringfeed.Loader(a.dataset, a.batch_size, transform=tf, device=a.device, socket=str(sock)) as ld:
            for epoch in range(a.epochs):
                ld.set_epoch(epoch)
                n, start = 0, time.perf_counter()
                for images, _labels in ld:
                    n += images.shape[0]
                if a.device.startswith("cuda"):
                    import torch

                    torch.cuda.synchronize()
                rate = n / (time.perf_counter() - start)
                rates.append(rate)
                print(f"epoch {epoch}: {n} images, {rate:.0f} img/s ({a.threads} threads, {a.device})", flush=True)
        steady = rates[1:] or rates
        result = {
            "threads": a.threads,
            "device": a.device,
            "batch_size": a.batch_size,
            "size": a.size,
            "img_per_s": sum(steady) / len(steady),
            "epochs": rates,
        }
        print(json.dumps(result))
        if a.json:
            a.json.write_text(json.dumps(result) + "\n")
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
