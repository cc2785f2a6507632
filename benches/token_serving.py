#!/usr/bin/env python3
"""Serving token windows: windows/s and tokens/s from one server thread, and the open time and
memory of a 10 B-token dataset.

    python3 benches/token_serving.py [--bin PATH] [--tokens 10e9] [--seq-len 2048] [--batch-size 16]
        [--seconds 10] [--warmup-s 12] [--work DIR] [--dataset DIR] [--out DIR]

The dataset is synthetic and sparse: a valid `tokens.rft` (`proto/tokens.md`) of `--tokens`
uint16 tokens, all zero, in documents of 100,000 tokens, whose token pages are holes (20 GB
apparent, a few MB on disk). Its CRCs are real, so `ringfeed verify` passes. Measured:

- `open`: the time from `TokenLoader(...)` to its first batch (the server maps the file, reads
  header and footer, creates the ring), and the Python reader's `TokenDataset` open;
- serving: windows/s and tokens/s through a `TokenLoader` with `threads=1, autotune=False`,
  concat mode, shuffled (random windows across the whole file), for `--seconds`: on the sparse
  file (each window faults in pages of a hole: a cold-read figure, so not warmed up) and, with
  `--dataset DIR`, on a real token dataset whose pages are cached (after `--warmup-s` seconds);
- memory: the server's RSS after open and after serving (it must not grow with the dataset).

The server is a `harness.Server` (the binary: --bin, RINGFEED_BIN, PATH or the workspace build).
Writes token_serving.json (a `harness` record) and token_serving.md into --out.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client-py"))

import ringfeed
from ringfeed.formats import tokfile as tf
from ringfeed.formats.crc32c import crc32c

DOC_TOKENS = 100_000


def write_sparse(path: Path, tokens: int, chunk: int = 1 << 20) -> None:
    """A valid token file of `tokens` zero uint16 tokens with holes for the token pages."""
    docs = -(-tokens // DOC_TOKENS)
    info = json.dumps(
        {"format": "ringfeed-tokens", "version": "1.0", "writer": "token_serving.py", "source_kind": "synthetic"}
    )
    lay = tf.layout(tokens, docs, 2, False, chunk, len(info))
    fields = (tf.TOKENS_MAGIC, 1, 0, 2, b"\0" * 3, 1 << 16, tf.NO_EOS, 4096, b"\0" * 28, 0)
    header = bytearray(tf.TOKEN_HEADER.pack(*fields))
    struct.pack_into("<I", header, 60, crc32c(bytes(header[:60])))
    starts = [min(d * DOC_TOKENS, tokens) for d in range(docs)] + [tokens]
    doc_bytes = struct.pack(f"<{len(starts)}Q", *starts)
    token_bytes = tokens * 2
    full = crc32c(b"\0" * chunk)
    last = token_bytes - (lay.chunk_count - 1) * chunk
    crcs = [full] * (lay.chunk_count - 1) + [crc32c(b"\0" * last) if last != chunk else full]
    chunk_bytes = struct.pack(f"<{len(crcs)}I", *crcs)
    footer = bytearray(
        tf.TOKEN_FOOTER.pack(
            tf.TOKENS_END_MAGIC, 1, 0, 0, tokens, docs, lay.docs_offset, lay.prompts_offset, lay.chunks_offset,
            lay.info_offset, len(info), lay.file_len, chunk, lay.chunk_count, crc32c(doc_bytes), crc32c(b""),
            crc32c(chunk_bytes), crc32c(info.encode()), b"\0" * 20, 0,
        )
    )  # fmt: skip
    struct.pack_into("<I", footer, 124, crc32c(bytes(footer[:124])))
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(lay.file_len)  # the token pages stay holes
        f.seek(lay.docs_offset)
        f.write(doc_bytes)
        f.seek(lay.chunks_offset)
        f.write(chunk_bytes)
        f.seek(lay.info_offset)
        f.write(info.encode())
        f.seek(lay.footer_offset)
        f.write(footer)


def rss_mb(pid: int) -> tuple[float, float]:
    """The process's resident memory and the anonymous part of it (not mapped file pages), MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", float("nan")), fields.get("RssAnon", float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=float, default=10e9)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--work", type=Path, default=None, help="where the sparse dataset goes (default: a temp dir)")
    ap.add_argument("--dataset", type=Path, default=None, help="also measure windows/s on this real token dataset")
    ap.add_argument("--out", type=Path, default=None)
    harness.add_arguments(ap)
    a = ap.parse_args()
    tokens = int(a.tokens)
    windows = lambda b: len(b["input_ids"])  # noqa: E731 - windows in a batch
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        ds = Path(work) / "synthetic.tok"
        ds.mkdir()
        t = time.perf_counter()
        write_sparse(ds / tf.TOKENS_FILE, tokens)
        made = time.perf_counter() - t
        import torch  # noqa: F401  (imported now, so the open below does not time torch's import)

        t = time.perf_counter()
        py = tf.TokenDataset(ds)
        py_open = time.perf_counter() - t
        assert py.token_count == tokens
        with harness.Server(2, binary=a.bin) as server:
            rss0 = rss_mb(server.pid)
            t = time.perf_counter()
            loader = ringfeed.TokenLoader(
                ds,
                batch_size=a.batch_size,
                seq_len=a.seq_len,
                server=ringfeed.Server(socket=server.sock),
                tuning=ringfeed.Tuning(autotune=False, threads=1, slots=8),
                shuffle=True,
                drop_last=True,
            )
            it = harness.epochs(loader)
            next(it)
            first = time.perf_counter() - t
            rss_open = rss_mb(server.pid)
            sparse_rate = harness.timed(it, min_seconds=a.seconds, count=windows)["img_per_s"]
            rss_end = rss_mb(server.pid)
            loader.close()
            warm_rate = None
            if a.dataset is not None:
                loader = ringfeed.TokenLoader(
                    a.dataset,
                    batch_size=a.batch_size,
                    seq_len=a.seq_len,
                    server=ringfeed.Server(socket=server.sock),
                    tuning=ringfeed.Tuning(autotune=False, threads=1),
                    shuffle=True,
                    drop_last=True,
                )
                it = harness.epochs(loader)
                warm_rate = harness.measure(it, warmup_s=a.warmup_s, min_seconds=a.seconds, count=windows)["img_per_s"]
                loader.close()
    result = {
        "tokens": tokens,
        "apparent_bytes": tokens * 2,
        "make_seconds": made,
        "python_open_ms": py_open * 1e3,
        "open_to_first_batch_ms": first * 1e3,
        "windows_per_s_sparse": sparse_rate,
        "tokens_per_s_sparse": sparse_rate * a.seq_len,
        "windows_per_s_warm": warm_rate,
        "tokens_per_s_warm": warm_rate * a.seq_len if warm_rate else None,
        "warm_dataset": str(a.dataset) if a.dataset else None,
        "seq_len": a.seq_len,
        "batch_size": a.batch_size,
        "server_rss_mb": {"idle": rss0, "after_open": rss_open, "after_serving": rss_end},
    }
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        harness.write_record(a.out / "token_serving.json", result, args=a)
        r = result
        md = [
            f"# Serving token windows ({tokens / 1e9:.0f} B-token sparse dataset, one server thread)",
            "",
            "Command: `python3 benches/token_serving.py --dataset TOKEN_DATASET --out DIR`. RSS counts mapped file "
            "pages the server touched; the anonymous part is the server's own memory (a token stream's epoch "
            "plan holds nothing per window: its order is computed window by window).",
            "",
            "| measure | value |",
            "|---|---:|",
            f"| Python `TokenDataset` open | {r['python_open_ms']:.2f} ms |",
            f"| `TokenLoader(...)` to the first batch (server open + ring) | {r['open_to_first_batch_ms']:.1f} ms |",
            f"| windows/s on the sparse file (seq_len {a.seq_len}, batch {a.batch_size}, shuffled, 1 thread; "
            f"every window faults in hole pages) | {sparse_rate:,.0f} "
            f"({sparse_rate * a.seq_len / 1e6:,.1f} M tokens/s) |",
        ]
        if warm_rate:
            md.append(
                f"| windows/s on {a.dataset} (page cache warm, same settings) "
                f"| {warm_rate:,.0f} ({warm_rate * a.seq_len / 1e6:,.1f} M tokens/s) |"
            )
        md += [
            f"| server RSS idle / after open / after serving "
            f"| {rss0[0]:.1f} / {rss_open[0]:.1f} / {rss_end[0]:.1f} MB |",
            f"| of which anonymous (not file pages) | {rss0[1]:.1f} / {rss_open[1]:.1f} / {rss_end[1]:.1f} MB |",
        ]
        (a.out / "token_serving.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
