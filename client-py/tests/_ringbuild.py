"""Builds ring segments byte by byte from ``proto/ring.md``'s tables, for tests.

Deliberately independent of ``ringfeed.wire.ring``: every field is written at the offset and width
the spec's tables give, so a mistake in the client's ``struct`` layouts shows up as a test
failure instead of being mirrored here.
"""

from __future__ import annotations

import fcntl
import os
import struct
from dataclasses import dataclass

from ringfeed.formats.crc32c import crc32c

PAGE = 4096
ITEMSIZE = {1: 1, 2: 4, 3: 8, 4: 4}
UINT8, INT32, INT64, FLOAT32 = 1, 2, 3, 4


def put(buf: bytearray, offset: int, fmt: str, *values: object) -> None:
    """Writes little-endian ``values`` at ``offset`` (one struct code per value)."""
    struct.pack_into("<" + fmt, buf, offset, *values)


def align(x: int) -> int:
    return (x + PAGE - 1) // PAGE * PAGE


@dataclass
class FieldSpec:
    name: str
    code: int
    shape: tuple[int, ...]
    offset: int = 0  # set by `layout`

    @property
    def sample_bytes(self) -> int:
        n = ITEMSIZE[self.code]
        for d in self.shape:
            n *= d
        return n


def layout(fields: list[FieldSpec], batch_size: int) -> int:
    """Places each field's payload at the next page after the previous one; returns the slot stride."""
    at = PAGE  # the slot header and its padding take the first page
    for f in fields:
        f.offset = at
        at = align(at + batch_size * f.sample_bytes)
    return at


def header_page(
    fields: list[FieldSpec],
    *,
    batch_size: int,
    slot_count: int,
    major: int = 1,
    minor: int = 0,
    header_len: int = 4096,
    stride: int | None = None,
    segment_len: int | None = None,
    fix_crc: bool = True,
) -> bytearray:
    """SegmentHeader + FieldDesc[] + zero padding: the first ``header_len`` bytes of a segment."""
    computed_stride = layout(fields, batch_size)
    stride = computed_stride if stride is None else stride
    b = bytearray(header_len)
    b[0:8] = b"RFRING\0\0"
    put(b, 8, "H", major)
    put(b, 10, "H", minor)
    put(b, 12, "I", header_len)
    put(b, 16, "I", slot_count)
    put(b, 20, "I", len(fields))
    put(b, 24, "Q", stride)
    put(b, 32, "Q", header_len + slot_count * stride if segment_len is None else segment_len)
    put(b, 40, "I", batch_size)
    for i, f in enumerate(fields):
        at = 64 + 64 * i
        name = f.name.encode("ascii")
        b[at : at + len(name)] = name
        put(b, at + 16, "B", f.code)
        put(b, at + 17, "B", len(f.shape))
        for d, size in enumerate(f.shape):
            put(b, at + 20 + 4 * d, "I", size)
        put(b, at + 40, "Q", f.offset)
        put(b, at + 48, "Q", f.sample_bytes)
    if fix_crc:
        refresh_header_crc(b)
    return b


def refresh_header_crc(b: bytearray) -> None:
    """Recomputes ``header_crc``: bytes 0..60 followed by the field descriptors."""
    (count,) = struct.unpack_from("<I", b, 20)
    put(b, 60, "I", crc32c(bytes(b[0:60]) + bytes(b[64 : 64 + 64 * count])))


def slot_header(
    seq: int, run: int, epoch: int, batch: int, count: int, skipped: int = 0, height: int = 0, width: int = 0
) -> bytearray:
    b = bytearray(64)
    put(b, 0, "Q", seq)
    put(b, 8, "I", run)
    put(b, 12, "I", epoch)
    put(b, 16, "Q", batch)
    put(b, 24, "I", count)
    put(b, 28, "I", skipped)
    put(b, 32, "I", height)
    put(b, 36, "I", width)
    put(b, 60, "I", crc32c(bytes(b[0:60])))
    return b


def memfd_segment(header: bytes | bytearray, segment_len: int) -> int:
    """A sealed memfd of ``segment_len`` bytes starting with ``header``, as the server makes it."""
    fd = os.memfd_create("ringfeed-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, segment_len)
        os.pwrite(fd, bytes(header), 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def standard_fields(h: int, w: int, *, layout_: str = "NHWC", extras: tuple[str, ...] = ()) -> list[FieldSpec]:
    """The fields of ring.md's "Fields a stream carries" for ``h x w`` images."""
    shape = (h, w, 3) if layout_ == "NHWC" else (3, h, w)
    fields = [FieldSpec("image", UINT8, shape), FieldSpec("label", INT64, ())]
    if "index" in extras:
        fields.append(FieldSpec("index", INT64, ()))
    if "crop" in extras:
        fields.append(FieldSpec("crop", INT32, (5,)))
    return fields
