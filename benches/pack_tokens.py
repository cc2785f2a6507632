#!/usr/bin/env python3
"""Text packing throughput of `ringfeed pack --tokenizer`, in tokens/s and MB/s of text, by thread
count, against the Python `tokenizers` batch encoder on the same corpus in the same run.

    python3 benches/pack_tokens.py --corpus DIR [--bin PATH] [--threads 1,2,4]
        [--out benches/results/DATE-MACHINE]

DIR holds corpus.jsonl and tokenizer.json; make them with
`python3 ../shared/datasets/make_text.py DIR` (20,000 documents, ~50 MB, a 32,000-token BPE).
The corpus is read once before timing (warm page cache). The Python baseline is
`Tokenizer.encode_batch(texts, add_special_tokens=False)` over the same documents (JSON parsing
excluded, so the baseline is only the tokeniser), with `RAYON_NUM_THREADS` set to the same thread
count. Both produce the same ids (the test suite checks that); ringfeed also parses JSON, checks
every id and writes the token file. The binary: --bin, RINGFEED_BIN, PATH or the workspace build
(`harness.find_binary`). Writes pack_tokens.json (a `harness` record; the baseline is Python
`tokenizers`, the ratio ringfeed's tokens/s over it) and pack_tokens.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness


def ringfeed_run(binary: str, corpus: Path, threads: int, work: Path) -> dict:
    out = work / f"tok-{threads}"
    summary = work / "summary.json"
    cmd = [str(binary), "pack", str(corpus / "corpus.jsonl"), str(out), "--tokenizer", str(corpus / "tokenizer.json")]
    cmd += ["--threads", str(threads), "--progress", "none", "--force", "--summary-json", str(summary)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    s = json.loads(summary.read_text())
    s["wall_seconds"] = wall
    return s


PY_BASELINE = r"""
import json, sys, time
from tokenizers import Tokenizer
corpus = sys.argv[1]
texts = [json.loads(l)["text"] for l in open(corpus + "/corpus.jsonl", encoding="utf-8")]
tok = Tokenizer.from_file(corpus + "/tokenizer.json")
t = time.perf_counter()
n = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
dt = time.perf_counter() - t
print(json.dumps({"tokens": n + len(texts), "seconds": dt, "bytes": sum(len(x.encode()) for x in texts)}))
"""


def python_run(corpus: Path, threads: int) -> dict:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    r = subprocess.run(
        [sys.executable, "-c", PY_BASELINE, str(corpus)], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1, 2, 4, ..., the cores)")
    ap.add_argument("--out", type=Path, default=None)
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    binary = harness.find_binary(a.bin)
    cores = os.cpu_count() or 1
    threads = (
        [int(x) for x in a.threads.split(",")]
        if a.threads
        else sorted({min(2**k, cores) for k in range(8) if 2**k <= cores} | {cores})
    )
    (a.corpus / "corpus.jsonl").read_bytes()  # warm the page cache
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)  # the work directory below is made beside it
    rows = []
    with tempfile.TemporaryDirectory(dir=a.out.parent if a.out else None) as work:
        for t in threads:
            rf = ringfeed_run(binary, a.corpus, t, Path(work))
            py = python_run(a.corpus, t)
            rows.append(
                {
                    "threads": t,
                    "ringfeed_tokens_per_s": rf["tokens_per_sec"],
                    "ringfeed_mb_per_s": rf["input_mb_per_sec"],
                    "ringfeed_seconds": rf["seconds"],
                    "python_tokens_per_s": py["tokens"] / py["seconds"],
                    "python_mb_per_s": py["bytes"] / 1e6 / py["seconds"],
                    "python_seconds": py["seconds"],
                    "tokens": rf["tokens"],
                    "documents": rf["documents"],
                }
            )
            r = rows[-1]
            print(
                f"{t:>3} threads: ringfeed {r['ringfeed_tokens_per_s'] / 1e6:6.2f} M tokens/s "
                f"({r['ringfeed_mb_per_s']:5.1f} MB/s), python tokenizers {r['python_tokens_per_s'] / 1e6:6.2f} M "
                f"tokens/s ({r['python_mb_per_s']:5.1f} MB/s)",
                flush=True,
            )
    result = {"cpu": harness.cpu_model(), "cores": cores, "corpus": str(a.corpus), "rows": rows}
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        ratios = [
            {"threads": r["threads"], "ratio": harness.ratio(r["ringfeed_tokens_per_s"], r["python_tokens_per_s"])}
            for r in rows
        ]
        harness.write_record(
            a.out / "pack_tokens.json",
            result,
            args=a,
            baseline="python tokenizers",
            ratios=ratios,
            server_binary=binary,
        )
        lines = [
            f"# Text packing throughput ({harness.cpu_model()}, {cores} cores)",
            "",
            f"Corpus: {a.corpus} ({rows[0]['documents']} documents, {rows[0]['tokens']} tokens incl. EOS). "
            "Command: `python3 benches/pack_tokens.py --corpus DIR --out DIR`.",
            "",
            "| threads | ringfeed pack (M tokens/s) | MB/s | Python tokenizers encode_batch (M tokens/s) | MB/s |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['threads']} | {r['ringfeed_tokens_per_s'] / 1e6:.2f} | {r['ringfeed_mb_per_s']:.1f} "
                f"| {r['python_tokens_per_s'] / 1e6:.2f} | {r['python_mb_per_s']:.1f} |"
            )
        (a.out / "pack_tokens.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
