"""Full verification of a packed dataset: every byte of every file is checked.

The checks run in the order ``proto/shard.md`` ("Verification order", steps 1-5) fixes and stop at
the first problem, so this and the Rust ``crates/format/src/shard/verify.rs`` report the same first error
kind for the same damage (``proto/vectors/shard/cases.json`` pins it). Step 6 (``--decode``) is
not implemented here.

Every byte goes through the pure-Python CRC-32C (a few MB/s): fine for tests and small datasets;
use ``ringfeed verify`` (Rust) on a large one.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

from .crc32c import crc32c
from .reader import PackedDataset, _Shard
from .shard import (
    CLASS_ENTRY,
    INDEX_FOOTER,
    INDEX_HEADER,
    RECORD_ENTRY,
    SAMPLE_ENTRY,
    SHARD_ENTRY,
    SHARD_FOOTER,
    SHARD_HEADER,
    FormatError,
    align_up,
    parse_json_object,
)
from .targets import TARGETS_FILE, verify_targets

__all__ = ["verify"]

# Checksummed and zero-checked ranges are read in pieces of this size, so memory stays bounded.
_CHUNK = 1 << 20


def verify(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Checks every byte of the packed dataset in directory ``path``.

    Follows ``proto/shard.md``, "Verification order", steps 1-5: the open checks, the index body
    CRC, the index contents, every sample entry, then every shard front to back.

    Args:
        path: the dataset directory (the one holding ``index.rfi``).

    Returns:
        What was covered: ``{"samples": int, "shards": int, "classes": int, "bytes": int}``, where
        ``bytes`` is the size of all files, every one of them checksummed; with a ``targets.rft``
        (``proto/targets.md``), also ``"targets"``: ``verify_targets``' report, checked last
        against the index's sample count.

    Raises:
        FormatError: at the first problem, with the spec's error kind, the file and the offset.
    """
    # 1. Everything "Open" checks: footers, headers, section bounds, shard files tied to the index.
    with PackedDataset(path) as ds:
        index, index_path = ds._index, ds._index_path
        total = len(index) + sum(len(s.map) for s in ds._shards)

        # 2. The index body checksum.
        footer_at = len(index) - INDEX_FOOTER.size
        computed = _crc(index, 0, footer_at)
        if computed != ds._footer.body_crc:
            raise FormatError.checksum(
                index_path, footer_at + 12, f"index body (bytes 0..{footer_at})", ds._footer.body_crc, computed
            )

        # 3. Index contents.
        _check_index_contents(ds)

        # 4. Every sample entry, and every record referenced exactly once.
        referenced = [bytearray(s.footer.record_count) for s in ds._shards]
        class_count = ds._header.class_count
        for i in range(len(ds)):
            s = ds._locate(i)
            if s.label < -1 or (class_count > 0 and s.label >= class_count):
                raise FormatError.corrupt(
                    index_path, s.entry_at, f"sample {i} has label {s.label}, outside -1..{class_count}"
                )
            if s.meta and parse_json_object(s.meta) is None:
                raise FormatError.corrupt(
                    index_path, s.entry_at + 20, f"sample {i} has metadata that is not a UTF-8 JSON object"
                )
            seen = referenced[s.shard]
            if seen[s.record]:
                raise FormatError.corrupt(
                    index_path,
                    s.entry_at + 24,
                    f"sample {i} refers to shard {s.shard} record {s.record}, which an earlier sample already uses",
                )
            seen[s.record] = 1
        for shard, seen in zip(ds._shards, referenced, strict=True):
            r = seen.find(0)
            if r >= 0:
                raise FormatError.corrupt(
                    shard.path,
                    shard.footer.table_offset + r * RECORD_ENTRY.size,
                    f"record {r} is not referenced by any sample of the index",
                )

        # 5. Every shard, front to back.
        for shard in ds._shards:
            _check_shard(shard)

        out: dict[str, Any] = {"samples": len(ds), "shards": len(ds._shards), "classes": class_count, "bytes": total}
    # 6. The targets file, when the dataset was packed with targets.
    targets = Path(path) / TARGETS_FILE
    if targets.exists():
        out["targets"] = verify_targets(targets, sample_count=out["samples"])
        out["bytes"] += out["targets"]["bytes"]
    return out


def _crc(m: mmap.mmap, start: int, end: int) -> int:
    """CRC-32C of bytes ``start..end`` of ``m``."""
    value = 0
    for at in range(start, end, _CHUNK):
        value = crc32c(m[at : min(at + _CHUNK, end)], value)
    return value


def _check_zero(path: Path, m: mmap.mmap, start: int, end: int, what: str) -> None:
    """Checks bytes ``start..end`` of ``m`` are all zero, reporting the first that is not."""
    for at in range(start, end, _CHUNK):
        chunk = m[at : min(at + _CHUNK, end)]
        rest = chunk.lstrip(b"\0")
        if rest:
            raise FormatError.corrupt(path, at + len(chunk) - len(rest), f"non-zero byte in {what}")


def _check_index_contents(ds: PackedDataset) -> None:
    """Step 3: layout and padding of the sections, reserved fields, flags, the info object."""
    h, index, path = ds._header, ds._index, ds._index_path
    # A newer minor version may add sections or give reserved bytes a meaning, so the exact layout
    # and the zero checks apply to the structures of a 1.0 file only (class names were checked at open).
    if h.minor == 0:
        # Sections in the spec's order, each at the first multiple of 8 after the previous one ends.
        sections = (
            (INDEX_HEADER.size, h.shards_offset, "shard table"),
            (h.shards_offset + h.shard_count * SHARD_ENTRY.size, h.classes_offset, "class table"),
            (h.classes_offset + h.class_count * CLASS_ENTRY.size, h.samples_offset, "sample table"),
            (h.samples_offset + h.sample_count * SAMPLE_ENTRY.size, h.heap_offset, "heap"),
            (h.heap_offset + h.heap_len, h.info_offset, "info"),
            (h.info_offset + h.info_len, len(index) - INDEX_FOOTER.size, "footer"),
        )
        for prev_end, start, what in sections:
            if start != align_up(prev_end, 8):
                raise FormatError.corrupt(
                    path, 0, f"the {what} starts at {start}, but the layout puts it at {align_up(prev_end, 8)}"
                )
            _check_zero(path, index, prev_end, start, f"padding before the {what}")
        for n in range(h.shard_count):
            at = h.shards_offset + n * SHARD_ENTRY.size
            _check_zero(path, index, at + 28, at + 32, "a shard entry's reserved field")
        for c in range(h.class_count):
            at = h.classes_offset + c * CLASS_ENTRY.size
            _check_zero(path, index, at + 12, at + 16, "a class entry's reserved field")
        if h.flags != 0:
            raise FormatError.corrupt(path, 12, "flags are non-zero in a version 1.0 index")
        _check_zero(path, index, 88, 124, "the header's reserved field")
    if ds._footer.minor == 0:
        at = len(index) - INDEX_FOOTER.size + 24
        _check_zero(path, index, at, at + 4, "the footer's reserved field")
    ds._parse_info()


def _check_shard(shard: _Shard) -> None:
    """Step 5: one shard, front to back."""
    path, m, f = shard.path, shard.map, shard.footer
    align = shard.header.record_align
    table_end = f.table_offset + f.record_count * RECORD_ENTRY.size
    computed = _crc(m, f.table_offset, table_end)
    if computed != f.table_crc:
        raise FormatError.checksum(path, f.table_offset, "record table", f.table_crc, computed)
    footer_at = len(m) - SHARD_FOOTER.size
    # Reserved bytes are zero in a 1.0 structure; each structure's own minor version decides.
    if shard.header.minor == 0:
        _check_zero(path, m, 20, 60, "the header's reserved field")
    if f.minor == 0:
        _check_zero(path, m, footer_at + 40, footer_at + 60, "the footer's reserved field")
    data_offset = shard.header.data_offset
    _check_zero(path, m, SHARD_HEADER.size, data_offset, "padding after the header")

    expected = data_offset
    for r in range(f.record_count):
        offset, length, crc = shard.record(r)
        if offset != expected:
            raise FormatError.corrupt(
                path,
                f.table_offset + r * RECORD_ENTRY.size,
                f"record {r} starts at {offset}, but the layout puts it at {expected}",
            )
        computed = _crc(m, offset, offset + length)
        if computed != crc:
            raise FormatError.checksum(path, offset, f"record {r}", crc, computed)
        end = offset + length
        expected = align_up(end, align)
        if expected > f.table_offset:
            raise FormatError.corrupt(path, end, f"record {r} overlaps the record table")
        _check_zero(path, m, end, expected, f"padding after record {r}")
    if expected != f.table_offset:
        raise FormatError.corrupt(
            path, f.table_offset, f"the record table starts at {f.table_offset}, but the layout puts it at {expected}"
        )
    _check_zero(path, m, table_end, footer_at, "padding after the record table")
    computed = _crc(m, 0, footer_at)
    if computed != f.body_crc:
        raise FormatError.checksum(path, footer_at + 36, f"shard body (bytes 0..{footer_at})", f.body_crc, computed)
