#!/usr/bin/env python3
"""An image folder served in place against the same folder packed, in one run on the same files
and cores: `ringfeed.Loader` end to end, RandomResizedCrop(224) + flip, img/s by decode threads
(1 = per core, and all cores), plus the open time (listing the folder vs mapping the shards) and
the server's per-sample stage times, which say where the difference comes from.

    python3 benches/e2e/in_place.py --images DIR --packed DIR [--threads 1,N] [--batches 24]
        [--repeats 3] [--warmup-s 12] [--bin PATH] [--out DIR]

--packed is `ringfeed pack DIR PACKED` of --images (default options: JPEGs rewritten with
restart markers, CRC-32C checked on every read). The server is a `harness.Server` (--bin,
`$RINGFEED_BIN`, PATH or the workspace build; a release build: `cargo build --release -p
ringfeed`), started once per thread count with `--threads N`; each stream pins `threads=N` (no
autotuner), runs `--warmup-s` seconds and at least 6 batches, then `--batches` are timed. For
every thread count the two inputs alternate, repeats times, and the median is reported, so drift
on a shared machine hits both alike. The page cache is warm for both (every file is read once
before timing): the figures compare the CPU paths, not the disks. On a network filesystem the
per-file open/stat/read of the in-place path costs more. Writes in_place.json (a `harness`
record; the baseline is the packed input) and in_place.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (imported up front: the first Loader would otherwise time the import)

import ringfeed
from ringfeed import bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness

BATCH = 64


def warm(images: Path, packed: Path) -> None:
    """Reads every file once, so both inputs start from the page cache."""
    for root in (images, packed):
        for p in root.rglob("*"):
            if p.is_file():
                p.read_bytes()


def measure(path: Path, sock: str, threads: int, batches: int, warmup_s: float) -> dict[str, Any]:
    tf = bench.make_transform("rrc-flip", 224)
    t0 = time.perf_counter()
    loader = ringfeed.Loader(
        path,
        BATCH,
        transform=tf,
        server=ringfeed.Server(socket=sock, spawn=False, timeout=600),
        tuning=ringfeed.Tuning(autotune=False, threads=threads),
        shuffle=True,
        drop_last=True,
    )
    opened = time.perf_counter() - t0
    with loader:
        # At least what the ring may already hold (4 slots), and the first decodes.
        r = harness.measure(harness.epochs(loader), warmup_s=warmup_s, warmup_batches=6, min_batches=batches)
        view = loader.stats().get("server") or {}
    return {"img_per_s": r["img_per_s"], "open_s": opened, "stage_us": view.get("stage_us")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path())
    harness.add_arguments(ap)
    a = ap.parse_args()
    binary = harness.find_binary(a.bin)
    images, packed = a.images.resolve(), a.packed.resolve()
    warm(images, packed)
    inputs = {"in place (image folder)": images, "packed": packed}
    rows: list[dict[str, Any]] = []
    for threads in [int(t) for t in a.threads.split(",")]:
        with harness.Server(threads, binary=binary) as server:
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in inputs}
            for r in range(a.repeats):
                order = list(inputs.items()) if r % 2 == 0 else list(inputs.items())[::-1]
                for name, path in order:
                    runs[name].append(measure(path, server.sock, threads, a.batches, a.warmup_s))
            for name, got in runs.items():
                rows.append(
                    {
                        "input": name,
                        "threads": threads,
                        "img_per_s": statistics.median(g["img_per_s"] for g in got),
                        "img_per_s_runs": [round(g["img_per_s"], 1) for g in got],
                        "open_s": statistics.median(g["open_s"] for g in got),
                        "stage_us": got[-1]["stage_us"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    files = sum(1 for p in images.rglob("*") if p.is_file())
    meta = {
        "images": str(images),
        "files": files,
        "batch": BATCH,
        "batches": a.batches,
        "repeats": a.repeats,
        "cores": os.cpu_count(),
        "binary": binary,
    }
    ratios = harness.against(
        rows, value="img_per_s", by=["threads"], keep=["input"], baseline=lambda r: r["input"] == "packed"
    )
    harness.write_record(
        a.out / "in_place.json", {"meta": meta, "rows": rows}, args=a, baseline="packed", ratios=ratios, indent=1
    )
    lines = [
        "# Image folder in place vs packed: Loader end to end, RandomResizedCrop(224) + flip",
        "",
        f"{files} files under {images}, batch {BATCH}, {a.batches} batches timed, median of {a.repeats} "
        f"(alternating order), {os.cpu_count()} cores, page cache warm. Stage times: µs per sample, "
        "from the server (the last run).",
        "",
        "| input | threads | img/s | vs packed | open (s) | read µs | decode µs | transform µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ref = next(r for r in rows if r["threads"] == row["threads"] and r["input"] == "packed")
        st = row["stage_us"] or {}
        ratio = row["img_per_s"] / ref["img_per_s"]
        lines.append(
            f"| {row['input']} | {row['threads']} | {row['img_per_s']:,.0f} | {ratio:.2f}x "
            f"| {row['open_s']:.3f} | {st.get('read', float('nan')):.0f} | {st.get('decode', float('nan')):.0f} "
            f"| {st.get('transform', float('nan')):.0f} |"
        )
    (a.out / "in_place.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
