"""Two or more `ringfeed` binaries side by side in one run: the pack and feed benches, alternately.

    python3 benches/binaries.py --corpus DIR --dataset PACKED --bin old=PATH --bin new=PATH
        [--bin dist=PATH] [--reps 2] [--pack-threads 1,8] [--feed-threads 8] [--feed-epochs 2] [--out DIR]

For a change that must not move the hot path (a refactor, a build-profile change): each rep runs
`pack_throughput.py --reencode none` and `loader_throughput.py` (CPU delivery, crop + flip) once
per binary, in the order given, so that drift of the machine (thermal, page cache, neighbours)
falls on every binary alike. The baseline is the first `--bin`, measured in the same run; the
ratios are each binary's mean over the reps against the baseline's. DIR is an image folder (make
the standard one with `python3 benches/make_photos.py DIR --count 8000`); PACKED is
it packed by `ringfeed pack`. Writes binaries.json (every run, in a `harness` record) and
binaries.md (the table) into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent


def pack_rates(binary: str, corpus: Path, threads: str) -> dict[str, float]:
    """Images/s of `ringfeed pack` (copy mode) by thread count."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(HERE / "pack_throughput.py"), "--corpus", str(corpus), "--threads", threads]
        cmd += ["--reencode", "none", "--bin", binary, "--out", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        runs = json.loads((Path(out) / "pack.json").read_text())["runs"]
    return {f"pack {r['threads']}t": r["images_per_sec"] for r in runs}


def feed_rate(binary: str, dataset: Path, threads: int, warmup_s: float, epochs: int) -> dict[str, float]:
    """Images/s at which `ringfeed.Loader` delivers CPU batches (crop + flip to 224)."""
    with tempfile.TemporaryDirectory() as out:
        js = Path(out) / "feed.json"
        cmd = [sys.executable, str(HERE / "loader_throughput.py"), str(dataset), "--threads", str(threads)]
        cmd += ["--warmup-s", str(warmup_s), "--epochs", str(epochs), "--bin", binary, "--json", str(js)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return {f"feed {threads}t": json.loads(js.read_text())["img_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="an image folder (the pack bench's input)")
    ap.add_argument("--dataset", type=Path, required=True, help="a packed dataset (the feed bench's input)")
    ap.add_argument(
        "--bin", action="append", required=True, metavar="NAME=PATH", help="a binary; the first is the baseline"
    )
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--pack-threads", default="1,8")
    ap.add_argument("--feed-threads", type=int, default=8)
    ap.add_argument("--feed-epochs", type=int, default=2, help="timed windows of one epoch each, per feed run")
    ap.add_argument("--warmup-s", type=float, default=harness.DEFAULT_WARMUP_S)
    ap.add_argument("--out", type=Path, default=Path("benches/results") / time.strftime("%Y-%m-%d-binaries"))
    a = ap.parse_args()
    if any("=" not in b for b in a.bin):
        ap.error("each --bin is NAME=PATH")
    binaries = dict(b.split("=", 1) for b in a.bin)
    if len(binaries) < 2 or any(not Path(p).is_file() for p in binaries.values()):
        ap.error("give at least two --bin NAME=PATH, each an existing file")

    runs = []
    for rep in range(a.reps):
        for name, path in binaries.items():
            rates = pack_rates(path, a.corpus, a.pack_threads)
            rates |= feed_rate(path, a.dataset, a.feed_threads, a.warmup_s, a.feed_epochs)
            runs.append({"rep": rep, "binary": name, "rates": rates})
            print(f"rep {rep} {name}: " + ", ".join(f"{k} {v:.0f} img/s" for k, v in rates.items()), flush=True)

    metrics = list(runs[0]["rates"])
    mean = {
        name: {m: statistics.mean(r["rates"][m] for r in runs if r["binary"] == name) for m in metrics}
        for name in binaries
    }
    base = next(iter(binaries))
    ratios = {name: {m: harness.ratio(mean[name][m], mean[base][m]) for m in metrics} for name in binaries}
    a.out.mkdir(parents=True, exist_ok=True)
    harness.write_record(
        a.out / "binaries.json",
        {"binaries": binaries, "runs": runs, "mean": mean},
        args=a,
        baseline=f"binary {base!r}, the same benches in the same run",
        ratios=ratios,
    )
    lines = [
        "# Binaries side by side",
        "",
        f"Means of {a.reps} alternating reps, images/s; in brackets the ratio against `{base}`.",
        "",
        "| binary | " + " | ".join(metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    for name in binaries:
        cells = [f"{mean[name][m]:.0f} ({ratios[name][m]:.3f})" for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (a.out / "binaries.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
