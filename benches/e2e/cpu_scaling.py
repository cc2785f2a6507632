#!/usr/bin/env python3
"""Decode + RandomResizedCrop(224) + flip rate by thread count, every loader in one run on the
same files and cores: libjpeg-turbo decode only (the physical limit), ringfeed's transform alone,
ringfeed's Loader end to end, DataLoader + PIL, and DataLoader + torchvision.io.decode_jpeg.

    python3 benches/e2e/cpu_scaling.py --images DIR --packed DIR [--threads 1,2,4,8,15]
        [--batches 24] [--out DIR]

`corpus_rate` is `cargo build --release -p ringfeed --example corpus_rate` (found next to
$RINGFEED_BIN, or in target/release/examples). Writes cpu.json, cpu.md and, with matplotlib,
cpu.png (img/s against threads) into --out.
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

import torch
import torchvision
from torchvision import transforms
from torchvision.io import decode_image
from torchvision.transforms import v2

BATCH = 256


def corpus_rate_bin() -> str:
    for cand in (os.environ.get("CORPUS_RATE_BIN"), "target/release/examples/corpus_rate"):
        if cand and Path(cand).exists():
            return cand
    raise SystemExit("build it: cargo build --release -p ringfeed --example corpus_rate (or set CORPUS_RATE_BIN)")


def native(images: Path, mode: str, threads: int) -> float:
    out = subprocess.run([corpus_rate_bin(), str(images), mode, str(threads), "1"], capture_output=True, text=True)
    return json.loads(out.stdout)["img_per_s"]


def timed(batches, warmup: int, count: int) -> float:
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    n, start = 0, time.perf_counter()
    for _ in range(count):
        n += next(it)[0].shape[0]
    return n / (time.perf_counter() - start)


class TvioFolder(torchvision.datasets.ImageFolder):
    """ImageFolder that decodes with torchvision.io (decode_jpeg for JPEGs) and crops tensors (v2)."""

    def __init__(self, root: str) -> None:
        super().__init__(root, loader=lambda p: Path(p).read_bytes())
        self.tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])

    def __getitem__(self, i: int):
        data, label = super().__getitem__(i)
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        img = decode_image(raw, mode=torchvision.io.ImageReadMode.RGB)  # decode_jpeg for JPEGs
        return self.tf(img), label


def dataloader(images: Path, workers: int, kind: str, batches: int) -> float:
    if kind == "pil":
        tf = transforms.Compose(
            [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
        )
        ds = torchvision.datasets.ImageFolder(str(images), transform=tf)
    else:
        ds = TvioFolder(str(images))
    dl = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, drop_last=True, persistent_workers=True
    )

    def forever():
        while True:
            yield from dl

    # Skip every batch the workers could have prefetched (2 per worker), and time at least four
    # times that many, so the figure is the workers' production rate, not a drained queue.
    return timed(forever(), 2 * workers + 2, max(batches, 8 * workers))


def ringfeed_loader(packed: Path, threads: int, batches: int, pin: bool = False) -> float:
    import ringfeed

    binary = os.environ.get("RINGFEED_BIN") or shutil.which("ringfeed") or "ringfeed"
    work = Path(tempfile.mkdtemp(prefix="rfc-", dir="/tmp"))
    sock = work / "ringfeed.sock"
    cmd = [binary, "serve", "--socket", str(sock), "--threads", str(threads)] + (["--pin-threads"] if pin else [])
    server = subprocess.Popen(cmd)
    try:
        while not sock.exists():
            time.sleep(0.05)
        tf = ringfeed.RandomResizedCrop(224) + ringfeed.Flip()
        # Fixed settings: this measures the decode path, not the autotuner (benches/autotune.py).
        with ringfeed.Loader(packed, BATCH, transform=tf, socket=str(sock), autotune=False, threads=threads) as ld:

            def forever():
                epoch = 0
                while True:
                    ld.set_epoch(epoch)
                    yield from ld
                    epoch += 1

            # Skip the batches the ring may already hold (4 slots) before timing starts.
            return timed(forever(), 6, batches)
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--threads", default="1,2,4,8,15")
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--out", type=Path, default=Path())
    ap.add_argument("--pin", action="store_true", help="also the Loader with `serve --pin-threads`")
    a = ap.parse_args()
    rows = []
    for t in [int(x) for x in a.threads.split(",")]:
        row = {
            "threads": t,
            "turbo_decode_only": native(a.images, "decode", t),
            "ringfeed_transform": native(a.images, "rrc", t),
            "ringfeed_loader": ringfeed_loader(a.packed, t, a.batches),
            **({"ringfeed_loader_pinned": ringfeed_loader(a.packed, t, a.batches, pin=True)} if a.pin else {}),
            "dataloader_pil": dataloader(a.images, t, "pil", a.batches),
            "dataloader_tvio": dataloader(a.images, t, "tvio", a.batches),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cpu.json").write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")
    cols = ["turbo_decode_only", "ringfeed_transform", "ringfeed_loader", "dataloader_pil", "dataloader_tvio"]
    if a.pin:
        cols.insert(3, "ringfeed_loader_pinned")
    lines = [
        "# Decode + RandomResizedCrop(224) + flip, img/s by threads (DataLoader: workers)",
        "",
        "| threads | " + " | ".join(cols) + " | ringfeed loader / PIL | / tvio | transform / decode-only |",
        "|---:|" + "---:|" * (len(cols) + 3),
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | "
            + " | ".join(f"{r[c]:.0f}" for c in cols)
            + f" | {r['ringfeed_loader'] / r['dataloader_pil']:.2f}x"
            + f" | {r['ringfeed_loader'] / r['dataloader_tvio']:.2f}x"
            + f" | {r['ringfeed_transform'] / r['turbo_decode_only'] * 100:.0f} % |"
        )
    base = rows[0]
    lines += ["", "Scaling efficiency from 1 thread to the last row:"]
    for c in cols:
        eff = rows[-1][c] / (base[c] * rows[-1]["threads"] / base["threads"]) * 100
        lines.append(f"- {c}: {eff:.0f} %")
    (a.out / "cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for c in cols:
            ax.plot([r["threads"] for r in rows], [r[c] for r in rows], marker="o", label=c)
        ax.set_xlabel("threads (DataLoader: workers)")
        ax.set_ylabel("images/s")
        ax.set_title("Decode + RandomResizedCrop(224) + flip")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.out / "cpu.png", dpi=120)
    except ImportError:
        print("matplotlib is not installed: no plot")


if __name__ == "__main__":
    main()
