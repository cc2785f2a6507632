"""The packed targets file ``targets.rft``, version 1.1 (``proto/targets.md`` is the normative text).

The Python counterpart of ``crates/format/src/targets/file.rs``: a reader (``TargetsFile``) and
``verify_targets``, checked against the vectors in ``proto/vectors/targets/`` by
``tests/test_targets_vectors.py``. The server reads the file itself; this side exists for
``verify`` and inspection parity, and for tests that compare what the server delivered with what
was packed.

Invariants:

- The footer and the header (magic, version, CRC) are checked before any other field is used; a
  record is checked against its entry before its boxes are read.
- Every error is a ``FormatError`` of the kinds ``shard.md`` defines, naming the file and offset.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .crc32c import crc32c
from .shard import MAJOR, FormatError, align_up, escape

__all__ = ["TARGETS_FILE", "StoredTargets", "TargetsFile", "verify_targets"]

#: File name of the targets file inside a dataset directory.
TARGETS_FILE = "targets.rft"
TARGETS_MAGIC = b"RFTARGS\0"
TARGETS_END_MAGIC = b"RFTGEND\0"
#: TargetsHeader: magic, major, minor, flags, sample_count, max_boxes, categories_len,
#: categories_offset, table_offset, reserved[12], header_crc.
TARGETS_HEADER = struct.Struct("<8sHHIQIIQQ12sI")
#: TargetsFooter: magic, file_len, table_crc, body_crc, reserved, footer_crc.
TARGETS_FOOTER = struct.Struct("<8sQIIII")
#: TargetsEntry: offset, len, crc.
TARGETS_ENTRY = struct.Struct("<QII")
#: A record's fixed part: box_count, mask_len.
RECORD_HEAD = struct.Struct("<II")
FLAG_BOXES = 1
FLAG_MASKS = 2
#: 1.1: every record has an instance mask per box, and keypoints per box.
FLAG_INSTANCES = 4
FLAG_KEYPOINTS = 8
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

assert TARGETS_HEADER.size == 64
assert TARGETS_FOOTER.size == 32
assert TARGETS_ENTRY.size == 16


class Header(NamedTuple):
    """A decoded TargetsHeader (``proto/targets.md``, "TargetsHeader")."""

    minor: int
    flags: int
    sample_count: int
    max_boxes: int
    categories_len: int
    categories_offset: int
    table_offset: int
    reserved: bytes

    @property
    def has_boxes(self) -> bool:
        return bool(self.flags & FLAG_BOXES)

    @property
    def has_masks(self) -> bool:
        return bool(self.flags & FLAG_MASKS)

    @property
    def has_instances(self) -> bool:
        return bool(self.flags & FLAG_INSTANCES)

    @property
    def keypoints(self) -> int:
        """1.1: keypoints per box (0: none); the first 4 reserved bytes of a 1.0 header."""
        return int.from_bytes(self.reserved[:4], "little") if self.minor >= 1 else 0


class StoredTargets(NamedTuple):
    """One sample's record: ``boxes`` float32 ``[n, 4]`` (xyxy, stored-image pixels), ``labels``
    int64 ``[n]``, the mask's 8-bit grey PNG bytes (empty: none); 1.1: ``keypoints`` float32
    ``[n, K, 3]`` (``None``: none) and ``instance_masks`` uint8 ``[n, h, w]`` of 0 and 1 (``None``:
    none)."""

    boxes: np.ndarray
    labels: np.ndarray
    mask_png: bytes
    keypoints: np.ndarray | None = None
    instance_masks: np.ndarray | None = None


def decode_runs(data: bytes) -> list[int]:
    """An instance mask's run lengths from their LEB128 varints (``proto/targets.md``)."""
    out, v, shift = [], 0, 0
    for byte in data:
        v |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 28:
                raise ValueError("a run length's varint is longer than 5 bytes")
        else:
            out.append(v)
            v, shift = 0, 0
    if shift:
        raise ValueError("the runs end inside a varint")
    return out


def runs_to_mask(runs: list[int], width: int, height: int) -> np.ndarray:
    """COCO's column-major runs (the first of zeros) as a ``uint8 [height, width]`` 0/1 mask."""
    if sum(runs) != width * height:
        raise ValueError(f"the runs cover {sum(runs)} pixels, the masks are {width}x{height}")
    flat = np.repeat(np.arange(len(runs)) % 2, runs).astype(np.uint8)
    return flat.reshape(width, height).T.copy()


class TargetsFile:
    """An open ``targets.rft``: header and footer checked on open, records read by sample index.

    Args:
        path: the file, or a dataset directory holding one.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        if p.is_dir():
            p = p / TARGETS_FILE
        self.path = str(p)
        try:
            with p.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < TARGETS_HEADER.size + TARGETS_FOOTER.size:
                    least = TARGETS_HEADER.size + TARGETS_FOOTER.size
                    raise FormatError.truncated(p, size, f"a targets file has at least {least} bytes, this one {size}")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise FormatError("io", p, None, f"{p}: {e.strerror or e}") from e
        b = self._map
        at = size - TARGETS_FOOTER.size
        footer = TARGETS_FOOTER.unpack_from(b, at)
        magic, file_len, self._table_crc, self._body_crc, self._footer_reserved, stored = footer
        if magic != TARGETS_END_MAGIC:
            raise FormatError.at(
                "bad_magic",
                p,
                at,
                f'bad magic in the targets footer: expected b"{escape(TARGETS_END_MAGIC)}", found b"{escape(magic)}"',
            )
        computed = crc32c(b[at : at + 28])
        if stored != computed:
            raise FormatError.checksum(p, at + 28, "targets footer", stored, computed)
        raw = b[: TARGETS_HEADER.size]
        if raw[:8] != TARGETS_MAGIC:
            raise FormatError.at(
                "bad_magic",
                p,
                0,
                f'bad magic in the targets header: expected b"{escape(TARGETS_MAGIC)}", found b"{escape(raw[:8])}"',
            )
        fields = TARGETS_HEADER.unpack(raw)
        computed = crc32c(raw[:60])
        if fields[-1] != computed:
            raise FormatError.checksum(p, 60, "targets header", fields[-1], computed)
        major, minor = fields[1], fields[2]
        if major != MAJOR:
            raise FormatError.at(
                "unsupported_version",
                p,
                8,
                f"the targets file has format version {major}.{minor}, but this ringfeed reads version {MAJOR}.x "
                f"only; repack the dataset with this ringfeed (`ringfeed pack`) or use a ringfeed release that "
                f"reads version {major}",
            )
        self.header = Header(minor, *fields[3:10])
        h = self.header
        if file_len != size:
            raise FormatError.truncated(p, at + 8, f"the footer says the file has {file_len} bytes, it has {size}")
        ok = (
            h.categories_offset >= TARGETS_HEADER.size
            and h.categories_offset % 8 == 0
            and h.table_offset % 8 == 0
            and align_up(h.categories_offset + h.categories_len, 8) == h.table_offset
            and h.table_offset + TARGETS_ENTRY.size * h.sample_count == at
        )
        if not ok:
            raise FormatError.corrupt(
                p,
                32,
                f"the header's categories ({h.categories_len} bytes at {h.categories_offset}) and table "
                f"({h.sample_count} entries at {h.table_offset}) do not fit the file's {size} bytes",
            )

    def __len__(self) -> int:
        return self.header.sample_count

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> TargetsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def categories(self) -> list[dict[str, Any]]:
        """The categories as stored (``[]`` when the file has none)."""
        h = self.header
        raw = self._map[h.categories_offset : h.categories_offset + h.categories_len]
        return json.loads(raw) if raw else []

    def _entry(self, index: int) -> tuple[int, int, int]:
        if not 0 <= index < self.header.sample_count:
            raise IndexError(f"sample {index} is out of range: {self.path} has {self.header.sample_count} samples")
        return TARGETS_ENTRY.unpack_from(self._map, self.header.table_offset + TARGETS_ENTRY.size * index)

    def get(self, index: int, check_crc: bool = False) -> StoredTargets:
        """Sample ``index``'s record, its structure checked (and its CRC with ``check_crc``)."""
        offset, length, stored = self._entry(index)
        h = self.header
        entry_at = h.table_offset + TARGETS_ENTRY.size * index
        inside = offset >= TARGETS_HEADER.size and offset % 8 == 0 and length >= RECORD_HEAD.size
        if not inside or offset + length > h.categories_offset:
            raise FormatError.corrupt(
                self.path,
                entry_at,
                f"sample {index}: the record ({length} bytes at {offset}) is not inside the records' area "
                f"(64 .. {h.categories_offset})",
            )
        r = self._map[offset : offset + length]
        if check_crc:
            computed = crc32c(r)
            if computed != stored:
                raise FormatError.checksum(self.path, offset, f"sample {index}'s targets record", stored, computed)
        n, m = RECORD_HEAD.unpack_from(r, 0)
        if n > h.max_boxes:
            detail = f"sample {index}: {n} boxes, more than the header's max_boxes {h.max_boxes}"
            raise FormatError.corrupt(self.path, offset, detail)
        base = RECORD_HEAD.size + 24 * n + m
        k = h.keypoints
        want = inst_at = base + 12 * n * k
        lens: list[int] = []
        if h.has_instances:
            if want + 8 + 4 * n <= length:
                lens = list(struct.unpack_from(f"<{n}I", r, inst_at + 8))
            want += 8 + 4 * n + sum(lens)
        if want != length:
            parts = ", their keypoints and instance masks" if h.has_instances or k else ""
            detail = f"sample {index}: {n} boxes, a {m}-byte mask{parts} make {want} bytes, the entry says {length}"
            raise FormatError.corrupt(self.path, offset, detail)
        boxes = np.frombuffer(r, dtype="<f4", count=4 * n, offset=8).reshape(n, 4).astype(np.float32)
        labels = np.frombuffer(r, dtype="<i8", count=n, offset=8 + 16 * n).astype(np.int64)
        keypoints = None
        if k:
            keypoints = np.frombuffer(r, dtype="<f4", count=3 * n * k, offset=base).reshape(n, k, 3).astype(np.float32)
        masks = None
        if h.has_instances:
            w, hh = struct.unpack_from("<II", r, inst_at)
            masks = np.zeros((n, hh, w), dtype=np.uint8)
            at = inst_at + 8 + 4 * n
            for j, ln in enumerate(lens):
                try:
                    masks[j] = runs_to_mask(decode_runs(bytes(r[at : at + ln])), w, hh)
                except ValueError as e:
                    raise FormatError.corrupt(self.path, offset, f"sample {index}'s instance mask {j}: {e}") from None
                at += ln
        return StoredTargets(boxes, labels, bytes(r[8 + 24 * n : base]), keypoints, masks)


def grey_png_size(png: bytes) -> tuple[int, int]:
    """``(width, height)`` of an 8-bit greyscale PNG; ``ValueError`` for anything else."""
    if len(png) < 33 or png[:8] != PNG_SIGNATURE or png[12:16] != b"IHDR":
        raise ValueError("not a PNG (no signature and IHDR)")
    w, h, depth, colour = struct.unpack_from(">IIBB", png, 16)
    if depth != 8 or colour != 0:
        raise ValueError(
            f"a PNG of bit depth {depth} and colour type {colour}, stored masks are 8-bit greyscale (type 0)"
        )
    return w, h


def verify_targets(path: str | os.PathLike[str], sample_count: int | None = None) -> dict[str, Any]:
    """Checks ``targets.rft`` completely (``proto/targets.md``, "Verification order").

    Args:
        path: the file, or a dataset directory holding one.
        sample_count: the index's sample count, which the file's must equal (``None``: not checked).

    Returns:
        ``{"samples", "boxes", "max_boxes", "masks", "instances", "keypoints", "bytes"}``.

    Raises:
        FormatError: the first problem, in the spec's order.
    """
    with TargetsFile(path) as t:
        b, h, p = t._map, t.header, t.path
        footer_at = len(b) - TARGETS_FOOTER.size
        computed = crc32c(b[h.table_offset : footer_at])
        if computed != t._table_crc:
            raise FormatError.checksum(p, footer_at + 16, "targets table", t._table_crc, computed)
        computed = crc32c(b[:footer_at])
        if computed != t._body_crc:
            raise FormatError.checksum(p, footer_at + 20, "targets body", t._body_crc, computed)
        if h.minor <= 1:
            reserved = h.reserved if h.minor == 0 else h.reserved[4:]
            if any(reserved) or t._footer_reserved:
                at = 60 - len(reserved) if any(reserved) else footer_at + 24
                raise FormatError.corrupt(p, at, "a reserved byte is not zero")
            known = FLAG_BOXES | FLAG_MASKS | (FLAG_INSTANCES | FLAG_KEYPOINTS if h.minor else 0)
            if h.flags & ~known:
                raise FormatError.corrupt(p, 12, f"unknown flags {h.flags:#x}")
            extra = h.flags & (FLAG_INSTANCES | FLAG_KEYPOINTS)
            if bool(h.flags & FLAG_KEYPOINTS) != bool(h.keypoints) or (extra and not h.has_boxes):
                raise FormatError.corrupt(
                    p,
                    12,
                    f"flags {h.flags:#x} and {h.keypoints} keypoints per box disagree "
                    "(keypoints and instance masks go with boxes)",
                )
        if sample_count is not None and sample_count != h.sample_count:
            detail = f"the file has targets for {h.sample_count} samples, the index has {sample_count}"
            raise FormatError.corrupt(p, 16, detail)
        nxt, boxes, masks, most, instances = TARGETS_HEADER.size, 0, 0, 0, 0
        for i in range(h.sample_count):
            offset, length, _ = t._entry(i)
            if offset != nxt:
                raise FormatError.corrupt(
                    p,
                    h.table_offset + TARGETS_ENTRY.size * i,
                    f"sample {i}'s record is at {offset}, records are contiguous and it must be at {nxt}",
                )
            nxt = align_up(offset + length, 8)
            if any(b[offset + length : nxt]):
                raise FormatError.corrupt(p, offset + length, f"the padding after sample {i}'s record is not zero")
            s = t.get(i, check_crc=True)
            bx = s.boxes
            valid = np.isfinite(bx).all() and (bx[:, 0] <= bx[:, 2]).all() and (bx[:, 1] <= bx[:, 3]).all()
            if len(bx) and not valid:
                raise FormatError.corrupt(p, offset, f"sample {i}: a box is not finite or has a negative size")
            if len(s.boxes) and not h.has_boxes:
                raise FormatError.corrupt(p, offset, f"sample {i} has boxes, the header says the file has none")
            if bool(s.mask_png) != h.has_masks:
                has, says = ("has" if s.mask_png else "has no"), ("has" if h.has_masks else "has no")
                detail = f"sample {i} {has} a mask, the header says the file {says} masks"
                raise FormatError.corrupt(p, offset + 4, detail)
            if s.mask_png:
                try:
                    grey_png_size(s.mask_png)
                except ValueError as e:
                    raise FormatError.corrupt(p, offset, f"sample {i}'s mask: {e}") from None
                masks += 1
            if s.keypoints is not None and not np.isfinite(s.keypoints).all():
                raise FormatError.corrupt(p, offset, f"sample {i}: a keypoint is not finite")
            instances += 0 if s.instance_masks is None else len(s.instance_masks)
            boxes += len(s.boxes)
            most = max(most, len(s.boxes))
        if most != h.max_boxes:
            raise FormatError.corrupt(p, 24, f"the header's max_boxes is {h.max_boxes}, the largest count is {most}")
        raw = b[h.categories_offset : h.categories_offset + h.categories_len]
        if raw:
            try:
                cats = json.loads(raw)
            except ValueError:
                cats = None
            if not isinstance(cats, list) or not all(isinstance(c, dict) for c in cats):
                raise FormatError.corrupt(p, h.categories_offset, "the categories are not a JSON array of objects")
        if any(b[h.categories_offset + h.categories_len : h.table_offset]):
            at = h.categories_offset + h.categories_len
            raise FormatError.corrupt(p, at, "the padding after the categories is not zero")
        return {
            "samples": h.sample_count,
            "boxes": boxes,
            "max_boxes": h.max_boxes,
            "masks": masks,
            "instances": instances,
            "keypoints": h.keypoints,
            "bytes": len(b),
        }
