#!/usr/bin/env python3
"""Open time and server memory of token streams over a 10 B-token dataset: `concat` mode, `pack`
mode with the packing stored at pack time (`packing-S.rfp`, proto/tokens.md 1.1) and computed at
open (what a dataset without a packing file costs), and a mix of three datasets.

    python3 benches/token_open.py [--bin PATH] [--tokens 10e9] [--seq-len 2048] [--work DIR] [--out DIR]

The datasets are synthetic and sparse: valid `tokens.rft` files whose token pages are holes
(20 GB apparent for 10 B uint16 tokens, a few MB on disk), with real document tables and CRCs
(`ringfeed verify` passes). The main one has documents of log-uniform lengths in 16 .. 8192
tokens (mean ~1,300: SFT- or web-like, about 7.6 M documents for 10 B tokens), so that `pack`
mode has real packing work; its packing file is written with `ringfeed packing` (timed). The
mix adds two more sparse datasets (5 B and 1 B tokens, documents of 100,000 tokens) with weights
0.5 / 0.3 / 0.2, in `concat` mode.

Each case runs 3 times, each on a fresh server (so one case's memory is not another's): the
(median) time from `TokenLoader(...)` to its first batch (open, ring, first window), the
server's RSS and the anonymous part of it (not mapped file pages) after that first batch, and
the same when the server was idle before the open; then a second loader on the same server resumes
from the first one's `state_dict()` with another world size (2 ranks: the rest re-striped from the
global position) and the server's memory after its first batch is taken again. Nothing is
warmed up: the open is the figure. Each server is a `harness.Server` (the binary: --bin,
RINGFEED_BIN, PATH or the workspace build). Writes token_open.json (a `harness` record) and
token_open.md into --out.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client-py"))

import ringfeed
from ringfeed.formats import tokfile as tf
from ringfeed.formats.crc32c import crc32c


def write_sparse(directory: Path, starts: np.ndarray, chunk: int = 1 << 20) -> None:
    """A valid token dataset of zero uint16 tokens whose token pages are holes, with the document
    table `starts` (uint64, `doc_count + 1` entries, from 0 to the token count)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens, docs = int(starts[-1]), len(starts) - 1
    info = json.dumps(
        {"format": "ringfeed-tokens", "version": "1.0", "writer": "token_open.py", "source_kind": "synthetic"}
    ).encode()
    lay = tf.layout(tokens, docs, 2, False, chunk, len(info))
    fields = (tf.TOKENS_MAGIC, 1, 0, 2, b"\0" * 3, 1 << 16, tf.NO_EOS, 4096, b"\0" * 28, 0)
    header = bytearray(tf.TOKEN_HEADER.pack(*fields))
    header[60:64] = crc32c(bytes(header[:60])).to_bytes(4, "little")
    doc_bytes = starts.astype("<u8").tobytes()
    token_bytes = tokens * 2
    full = crc32c(b"\0" * chunk)
    last = token_bytes - (lay.chunk_count - 1) * chunk
    crcs = np.full(lay.chunk_count, full, dtype="<u4")
    crcs[-1] = crc32c(b"\0" * last)
    chunk_bytes = crcs.tobytes()
    footer = bytearray(
        tf.TOKEN_FOOTER.pack(
            tf.TOKENS_END_MAGIC, 1, 0, 0, tokens, docs, lay.docs_offset, lay.prompts_offset, lay.chunks_offset,
            lay.info_offset, len(info), lay.file_len, chunk, lay.chunk_count, crc32c(doc_bytes), crc32c(b""),
            crc32c(chunk_bytes), crc32c(info), b"\0" * 20, 0,
        )
    )  # fmt: skip
    footer[124:128] = crc32c(bytes(footer[:124])).to_bytes(4, "little")
    with open(directory / tf.TOKENS_FILE, "wb") as f:
        f.write(header)
        f.truncate(lay.file_len)  # the token pages stay holes
        for at, data in (
            (lay.docs_offset, doc_bytes),
            (lay.chunks_offset, chunk_bytes),
            (lay.info_offset, info),
            (lay.footer_offset, bytes(footer)),
        ):
            f.seek(at)
            f.write(data)


def log_uniform_starts(tokens: int, lo: int, hi: int, seed: int) -> np.ndarray:
    """Document starts for `tokens` tokens in documents of log-uniform lengths in lo .. hi."""
    rng = np.random.default_rng(seed)
    mean = (hi - lo) / np.log(hi / lo)
    lens = np.exp(rng.uniform(np.log(lo), np.log(hi), int(tokens / mean * 1.05) + 16)).astype(np.uint64)
    ends = np.cumsum(lens)
    n = int(np.searchsorted(ends, tokens))
    starts = np.concatenate([[0], ends[:n]]).astype(np.uint64)
    if starts[-1] < tokens:
        starts = np.concatenate([starts, [tokens]]).astype(np.uint64)
    return starts


def fixed_starts(tokens: int, doc: int) -> np.ndarray:
    return np.minimum(np.arange(0, tokens + doc, doc, dtype=np.uint64), tokens)[: -(-tokens // doc) + 1]


def status_mb(pid: int) -> dict[str, float]:
    """The process's resident memory, its anonymous part, and its peak, MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss": fields["VmRSS"], "anon": fields["RssAnon"], "peak": fields["VmHWM"]}


def run_case(binary: str, work: Path, name: str, dataset, repeat: int = 3, **kw) -> dict:
    """`repeat` opens, each on a fresh server: the median time to the first batch (all of them
    listed), and the memory of the last one before and after."""
    runs = [run_once(binary, work, name, dataset, **kw) for _ in range(repeat)]
    out = dict(runs[-1])
    times = sorted(r["open_to_first_batch_ms"] for r in runs)
    out["open_to_first_batch_ms"] = times[len(times) // 2]
    out["open_to_first_batch_ms_all"] = [r["open_to_first_batch_ms"] for r in runs]
    return out


def run_once(binary: str, work: Path, name: str, dataset, **kw) -> dict:
    """One open on a fresh server: time to the first batch, and its memory before and after."""
    log = work / f"{name}.log"
    log.unlink(missing_ok=True)  # the log line read below is this run's
    with harness.Server(2, binary=binary, log=log) as server:
        idle = status_mb(server.pid)
        t = time.perf_counter()
        loader = ringfeed.TokenLoader(
            dataset,
            batch_size=8,
            server=ringfeed.Server(socket=server.sock),
            tuning=ringfeed.Tuning(autotune=False, threads=1, slots=4),
            seed=1,
            shuffle=True,
            drop_last=True,
            **kw,
        )
        batch = next(iter(loader))
        first = time.perf_counter() - t
        assert batch["input_ids"].shape == (8, kw["seq_len"])
        after = status_mb(server.pid)
        windows = loader.dataset_len
        state = loader.state_dict()
        loader.close()
        # A resume by global position with another world size (control.md, "Resume by a global
        # position"): the rest of the epoch re-striped over 2 ranks, on the same server.
        resumed = ringfeed.TokenLoader(
            dataset,
            batch_size=8,
            server=ringfeed.Server(socket=server.sock),
            tuning=ringfeed.Tuning(autotune=False, threads=1, slots=4),
            seed=1,
            rank=0,
            world_size=2,
            shuffle=True,
            drop_last=True,
            **kw,
        )
        resumed.load_state_dict(state)
        assert next(iter(resumed))["input_ids"].shape == (8, kw["seq_len"])
        after_resume = status_mb(server.pid)
        resumed.close()
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    lines = [ln for ln in text.splitlines() if "pack mode computed" in ln]
    return {
        "case": name,
        "windows": windows,
        "open_to_first_batch_ms": first * 1e3,
        "server_mb_idle": idle,
        "server_mb_after_open": after,
        "server_mb_after_resume": after_resume,
        "log": lines[0] if lines else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_arguments(ap, warmup=False)
    ap.add_argument("--tokens", type=float, default=10e9)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=None, help="where the sparse datasets go (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    binary = harness.find_binary(a.bin)
    tokens = int(a.tokens)
    import torch  # noqa: F401  (imported now, so no open below times torch's import)

    with tempfile.TemporaryDirectory(dir=a.work) as w:
        work = Path(w)
        t = time.perf_counter()
        main_ds = work / "main.tok"
        starts = log_uniform_starts(tokens, 16, 8192, seed=0)
        write_sparse(main_ds, starts)
        second, third = work / "second.tok", work / "third.tok"
        write_sparse(second, fixed_starts(tokens // 2, 100_000))
        write_sparse(third, fixed_starts(tokens // 10, 100_000))
        made = time.perf_counter() - t
        docs = len(starts) - 1
        t = time.perf_counter()
        r = subprocess.run(
            [binary, "packing", str(main_ds), "--seq-len", str(a.seq_len)], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        packing_s = time.perf_counter() - t
        packing_bytes = (main_ds / tf.packing_name(a.seq_len)).stat().st_size
        t = time.perf_counter()
        py = tf.TokenDataset(main_ds)
        tf.Packing(py, a.seq_len)
        py_open_ms = (time.perf_counter() - t) * 1e3
        s = a.seq_len
        cases = [
            run_case(binary, work, "concat", main_ds, seq_len=s, mode="concat"),
            run_case(binary, work, "pack, stored packing", main_ds, seq_len=s, mode="pack"),
        ]
        stored = main_ds / tf.packing_name(s)
        aside = work / "aside.rfp"
        stored.rename(aside)
        cases.append(
            run_case(binary, work, "pack, computed at open (no packing file)", main_ds, seq_len=s, mode="pack")
        )
        aside.rename(stored)
        mix = {main_ds: 0.5, second: 0.3, third: 0.2}
        sizes = " + ".join(f"{t / 1e9:g} B" for t in (tokens, tokens // 2, tokens // 10))
        cases.append(run_case(binary, work, f"mix of 3 (concat; {sizes} tokens)", mix, seq_len=s, mode="concat"))
    result = {
        "tokens": tokens,
        "documents": docs,
        "seq_len": a.seq_len,
        "make_seconds": made,
        "ringfeed_packing_seconds": packing_s,
        "packing_file_bytes": packing_bytes,
        "python_open_ms": py_open_ms,
        "cases": cases,
    }
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        harness.write_record(a.out / "token_open.json", result, args=a)
        md = [
            f"# Token stream open: {tokens / 1e9:g} B-token sparse dataset, {docs:,} documents, seq_len {a.seq_len}",
            "",
            f"Command: `python3 benches/token_open.py --bin {binary} --tokens {tokens / 1e9:g}e9 --seq-len {a.seq_len} "
            "--out DIR`. Each case is opened 3 times, each time on a fresh server: the median time (all "
            "three in token_open.json), and the memory of the server process (RSS, its anonymous part, "
            "peak) idle, after the first batch of the last one, and after the first batch of a second "
            "loader resumed from the first one's state with world_size 2 (peak: over the whole server "
            "run). The token pages are holes, so RSS counts only what the open and the batches touched; "
            "the anonymous part is the server's own memory.",
            "",
            f"`ringfeed packing` (best-fit decreasing of {docs:,} documents, written once): {packing_s:.1f} s, "
            f"a {packing_bytes / 1e6:.0f} MB packing file. Python `TokenDataset` + `Packing` open: "
            f"{py_open_ms:.2f} ms.",
            "",
            "| case | windows | open to first batch | server RSS / anon / peak after (MB) "
            "| after a resume on 2 ranks: RSS / anon / peak (MB) | idle RSS / anon (MB) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for c in cases:
            m, r, i = c["server_mb_after_open"], c["server_mb_after_resume"], c["server_mb_idle"]
            md.append(
                f"| {c['case']} | {c['windows']:,} | {c['open_to_first_batch_ms']:,.1f} ms "
                f"| {m['rss']:.1f} / {m['anon']:.1f} / {m['peak']:.1f} "
                f"| {r['rss']:.1f} / {r['anon']:.1f} / {r['peak']:.1f} | {i['rss']:.1f} / {i['anon']:.1f} |"
            )
        logs = [c["log"] for c in cases if c["log"]]
        if logs:
            md += ["", "The server's log line for the computed case:", "", f"    {logs[0]}"]
        (a.out / "token_open.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
