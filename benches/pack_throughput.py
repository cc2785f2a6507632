#!/usr/bin/env python3
"""Pack throughput of `ringfeed pack`, in images/s and MB/s, by thread count, in copy and
re-encode modes.

    python3 benches/pack_throughput.py --corpus DIR [--bin PATH]
        [--threads 1,2,4,8,16] [--reencode 256:90] [--out benches/results/DATE-MACHINE]

DIR is an image folder; make the standard one with
`python3 benches/make_photos.py DIR --count 8000`. The corpus is read once before
timing, so every run reads from a warm page cache and the figures measure ringfeed, not the disk.
Every run packs the same files with the default checks (a full decode of every image). The
binary: --bin, RINGFEED_BIN, PATH or the workspace build (`harness.find_binary`). Writes pack.json
(raw summaries, in a `harness` record; the baseline is the first thread count of each mode, 1 by
default, and the ratio the scaling efficiency) and pack.md (the table) into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness


def warm(corpus: Path) -> tuple[int, int]:
    files = total = 0
    for root, _, names in os.walk(corpus):
        for n in names:
            total += len(Path(root, n).read_bytes())
            files += 1
    return files, total


def run(binary: str, corpus: Path, threads: int, reencode: str | None, work: Path) -> dict:
    out = work / f"out-{threads}-{'re' if reencode else 'copy'}"
    summary = work / "summary.json"
    cmd = [str(binary), "pack", str(corpus), str(out), "--threads", str(threads), "--progress", "none", "--force"]
    cmd += ["--summary-json", str(summary)]
    if reencode:
        side, quality = reencode.split(":")
        cmd += ["--reencode", "--max-side", side, "--quality", quality]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    s = json.loads(summary.read_text())
    s["wall_seconds"] = wall
    s["mode"] = f"reencode {reencode}" if reencode else "copy"
    s["command"] = " ".join(cmd)
    shutil.rmtree(out)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1,2,4,... up to nproc)")
    ap.add_argument("--reencode", default="256:90", help="MAX_SIDE:QUALITY for the re-encode mode; 'none' to skip")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="where outputs are written (default: a temp dir)")
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    binary = harness.find_binary(a.bin)

    ncpu = os.cpu_count() or 1
    if a.threads:
        threads = [int(t) for t in a.threads.split(",")]
    else:
        threads, t = [], 1
        while t < ncpu:
            threads.append(t)
            t *= 2
        threads.append(ncpu)
    files, size = warm(a.corpus)
    modes = [None] if a.reencode == "none" else [None, a.reencode]
    results = []
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        for mode in modes:
            for t in threads:
                r = run(binary, a.corpus, t, mode, Path(work))
                results.append(r)
                rate, mbs = r["images_per_sec"], r["input_mb_per_sec"]
                print(f"{r['mode']:>16} threads={t:>3}: {rate:8.1f} img/s {mbs:7.1f} MB/s", flush=True)

    machine = {"cpu": harness.cpu_model(), "cores": ncpu, "kernel": platform.release()}
    corpus = {"path": str(a.corpus), "files": files, "bytes": size}
    out = a.out or Path("benches/results") / f"{time.strftime('%Y-%m-%d')}-{platform.node() or 'unknown'}"
    out.mkdir(parents=True, exist_ok=True)
    # Per thread, each mode's first run: the base of pack.md's speed-up and efficiency.
    one = {r["mode"]: r["images_per_sec"] / r["threads"] for r in reversed(results)}
    ratios = [
        {
            "mode": r["mode"],
            "threads": r["threads"],
            "efficiency": harness.ratio(r["images_per_sec"], one[r["mode"]] * r["threads"]),
        }
        for r in results
    ]
    harness.write_record(
        out / "pack.json",
        {"machine": machine, "corpus": corpus, "runs": results},
        args=a,
        baseline="the first thread count of each mode, per thread",
        ratios=ratios,
        server_binary=binary,
    )

    lines = [
        "# `ringfeed pack` throughput",
        "",
        f"Machine: {machine['cpu']}, {ncpu} cores, kernel {machine['kernel']}. "
        f"Corpus: {files} files, {size / 1e6:.1f} MB, warm page cache. "
        "Every image fully decoded as a check; output written to local disk.",
        "",
        "| mode | threads | images/s | input MB/s | speed-up | efficiency | samples | output MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in {r["mode"]: None for r in results}:
        rows = [r for r in results if r["mode"] == mode]
        base = rows[0]["images_per_sec"] / rows[0]["threads"]
        for r in rows:
            speedup = r["images_per_sec"] / base
            lines.append(
                f"| {mode} | {r['threads']} | {r['images_per_sec']:.0f} | {r['input_mb_per_sec']:.1f} | "
                f"{speedup:.2f}x | {speedup / r['threads'] * 100:.0f} % | {r['samples']} | {r['bytes'] / 1e6:.1f} |"
            )
    lines += ["", "Command: `python3 benches/pack_throughput.py " + " ".join(sys.argv[1:]) + "`", ""]
    (out / "pack.md").write_text("\n".join(lines))
    print(f"wrote {out / 'pack.json'} and {out / 'pack.md'}")


if __name__ == "__main__":
    main()
