"""The shared vectors in ``proto/vectors/tokens/``, read by the Python side of the token format.

The Rust writer produced them (``crates/ringfeed/tests/it/token_vectors.rs``); here the Python reader must
read them back exactly, and each damage case must make ``verify_tokens`` report its pinned error
kind and offset first, as the Rust verifier does.
"""

from __future__ import annotations

import itertools
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from ringfeed import FormatError
from ringfeed.formats import tokfile as tf
from ringfeed.formats.crc32c import crc32c

VECTORS = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "tokens"
CASES: list[dict[str, Any]] = json.loads((VECTORS / "cases.json").read_text())
EXPECTED: dict[str, Any] = json.loads((VECTORS / "expected.json").read_text())


def _put_crc(b: bytearray, at: int, start: int, end: int) -> None:
    struct.pack_into("<I", b, at, crc32c(bytes(b[start:end])))


def refresh_crcs(file: Path) -> None:
    """Recomputes every CRC of a token file (or of a packing file: its tables, then its header),
    as ``refresh_crcs`` in the Rust test does."""
    b = bytearray(file.read_bytes())
    if file.suffix == ".rfp":
        _put_crc(b, 52, 64, len(b))
        _put_crc(b, 60, 0, 60)
        file.write_bytes(bytes(b))
        return
    footer = len(b) - 128
    width = b[12]
    tokens, docs, docs_off, prompts_off, chunks_off, info_off, info_len = struct.unpack_from("<QQQQQQQ", b, footer + 16)
    chunk_bytes, chunk_count = struct.unpack_from("<II", b, footer + 80)
    (flags,) = struct.unpack_from("<I", b, footer + 12)
    prompts_len = 4 * docs if flags & 1 else 0
    _put_crc(b, 60, 0, 60)
    tokens_end = 4096 + tokens * width
    for c in range(chunk_count):
        s = 4096 + c * chunk_bytes
        _put_crc(b, chunks_off + 4 * c, s, min(s + chunk_bytes, tokens_end))
    _put_crc(b, footer + 88, docs_off, docs_off + 8 * (docs + 1))
    _put_crc(b, footer + 92, prompts_off, prompts_off + prompts_len)
    _put_crc(b, footer + 96, chunks_off, chunks_off + 4 * chunk_count)
    _put_crc(b, footer + 100, info_off, info_off + info_len)
    _put_crc(b, footer + 124, footer, footer + 124)
    file.write_bytes(bytes(b))


def apply(dataset: Path, case: dict[str, Any]) -> None:
    file = dataset / case["file"]
    b = bytearray(file.read_bytes())
    op = case["op"]
    if op == "xor":
        b[case["offset"]] ^= case["value"]
    elif op == "truncate":
        del b[case["length"] :]
    elif op == "set_u16_fix_crc":
        struct.pack_into("<H", b, case["offset"], case["value"])
        _put_crc(b, case["crc_end"], case["crc_start"], case["crc_end"])
    elif op == "patch_refresh_crcs":
        patch = bytes.fromhex(case["bytes"])
        b[case["offset"] : case["offset"] + len(patch)] = patch
        file.write_bytes(bytes(b))
        refresh_crcs(file)
        return
    else:
        raise AssertionError(f"unknown op {op!r}")
    file.write_bytes(bytes(b))


@pytest.mark.parametrize("name", sorted(EXPECTED["datasets"]))
def test_vectors_read_back_exactly(name: str) -> None:
    """Every header field, token, document boundary and prompt length of a vector reads back as
    the Rust writer recorded it, and the vector verifies."""
    e = EXPECTED["datasets"][name]
    ds = tf.TokenDataset(VECTORS / name)
    assert ds.width == e["token_width"] == tf.width_for_vocab(e["vocab_size"])
    assert ds.vocab_size == e["vocab_size"]
    assert ds.eos_id == e["eos_id"]
    assert ds.tokens.tolist() == e["tokens"]
    assert ds.doc_starts.tolist() == e["doc_starts"]
    if e["prompt_lens"] is not None:
        assert ds.prompt_lens.tolist() == e["prompt_lens"]
    assert ds.info() == json.loads(e["info"])
    for s, pe in e["packings"].items():
        p = tf.Packing(ds, int(s))
        assert (p.window_count, p.cut_tokens) == (pe["window_count"], pe["cut_tokens"])
        assert p.bin_starts.tolist() == pe["bin_starts"]
        assert p.bins.tolist() == pe["bins"]
        # The stored packing is what the reference best-fit decreasing makes of the documents.
        cap = int(s) + 1
        lens = [min(b - a, cap) for a, b in itertools.pairwise(e["doc_starts"])]
        assert tf.best_fit_decreasing(lens, cap) == (pe["bin_starts"], pe["bins"])
    report = tf.verify_tokens(VECTORS / name)
    assert report["tokens"] == len(e["tokens"])
    assert report["packings"] == sorted(int(s) for s in e["packings"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_damage_reports_pinned_error(case: dict[str, Any], tmp_path: Path) -> None:
    """Each damage of ``v1-basic`` (its token file or a packing file) makes verify report the kind
    and byte offset the Rust verifier reports."""
    dst = tmp_path / "ds"
    shutil.copytree(VECTORS / "v1-basic", dst)
    apply(dst, case)
    with pytest.raises(FormatError) as exc:
        tf.verify_tokens(dst)
    assert (exc.value.kind, exc.value.offset) == (case["kind"], case["error_offset"]), str(exc.value)
