"""The ring segment (``proto/ring.md``), read by ``ringfeed.wire.ring`` from real memfds.

Segments are built by ``_ringbuild`` field by field from the spec's tables, written into a sealed
memfd as the server makes them, and mapped through ``Segment`` exactly as the loader maps them.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _ringbuild import (
    INT32,
    INT64,
    UINT8,
    FieldSpec,
    header_page,
    memfd_segment,
    put,
    refresh_header_crc,
    slot_header,
    standard_fields,
)

from ringfeed import ProtocolError
from ringfeed.formats.crc32c import crc32c
from ringfeed.wire import ring


def test_structure_sizes_match_the_spec() -> None:
    """SegmentHeader, FieldDesc and SlotHeader are 64 bytes each, little-endian, without padding."""
    assert ring.SEGMENT_HEADER.size == ring.FIELD_DESC.size == ring.SLOT_HEADER.size == 64
    for s in (ring.SEGMENT_HEADER, ring.FIELD_DESC, ring.SLOT_HEADER):
        assert s.format.startswith("<")


def test_dtype_table() -> None:
    """Dtype codes 1-4 are uint8, int32, int64, float32, with the spec's item sizes in torch and numpy."""
    expect = {1: torch.uint8, 2: torch.int32, 3: torch.int64, 4: torch.float32}
    for code, dtype in ring.DTYPES.items():
        assert dtype.torch() is expect[code]
        assert np.dtype(dtype.numpy).itemsize == dtype.itemsize == expect[code].itemsize
        assert np.dtype(dtype.numpy).byteorder in ("<", "|", "=")
    assert sorted(ring.DTYPES) == [1, 2, 3, 4]


class Built:
    """A segment in a memfd, plus what went into it."""

    def __init__(self, fields: list[FieldSpec], batch_size: int, slot_count: int, **header: object) -> None:
        self.fields = {f.name: f for f in fields}
        self.batch_size = batch_size
        self.page = header_page(fields, batch_size=batch_size, slot_count=slot_count, **header)  # type: ignore[arg-type]
        (self.stride,) = struct.unpack_from("<Q", self.page, 24)
        (self.length,) = struct.unpack_from("<Q", self.page, 32)
        self.fd = memfd_segment(self.page, max(self.length, len(self.page)))

    def slot_at(self, slot: int) -> int:
        return int(4096 + slot * self.stride)

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self.fd, data, offset)

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)


@pytest.fixture
def built() -> Iterator[Built]:
    b = Built(standard_fields(4, 6, extras=("index", "crop")), batch_size=2, slot_count=3)
    yield b
    os.close(b.fd)


def open_segment(b: Built, **kw: object) -> ring.Segment:
    return ring.Segment(b.fd, b.length, **kw)  # type: ignore[arg-type]


def test_header_and_fields_decode(built: Built) -> None:
    """The decoded header and field table equal what was encoded per ring.md."""
    seg = open_segment(built)
    try:
        h = seg.header
        assert (h.major, h.minor, h.header_len, h.slot_count, h.field_count, h.batch_size) == (1, 0, 4096, 3, 4, 2)
        assert h.slot_stride == built.stride
        assert h.segment_len == built.length == 4096 + 3 * built.stride
        assert list(seg.fields) == ["image", "label", "index", "crop"]
        for name, f in seg.fields.items():
            spec = built.fields[name]
            assert (f.code, f.shape, f.offset, f.sample_bytes) == (
                spec.code,
                spec.shape,
                spec.offset,
                spec.sample_bytes,
            )
        assert [seg.slot_offset(s) for s in range(3)] == [built.slot_at(s) for s in range(3)]
    finally:
        seg.close()


def test_views_have_shape_dtype_offset_and_content(built: Built) -> None:
    """Each field's view is [batch_size, *shape] of its dtype, at slot_start + offset, showing the memfd's bytes."""
    img = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
    slot = 2
    at = built.slot_at(slot)
    built.write(at + built.fields["image"].offset, img.tobytes())
    built.write(at + built.fields["label"].offset, struct.pack("<qq", 7, -1))
    built.write(at + built.fields["index"].offset, struct.pack("<qq", 123456789012, 5))
    built.write(at + built.fields["crop"].offset, struct.pack("<10i", *range(10)))
    seg = open_segment(built)
    try:
        base = seg.as_uint8().data_ptr()
        expect = {
            "image": ((2, 4, 6, 3), torch.uint8),
            "label": ((2,), torch.int64),
            "index": ((2,), torch.int64),
            "crop": ((2, 5), torch.int32),
        }
        for name, (shape, dtype) in expect.items():
            v = seg.view(slot, name)
            assert tuple(v.shape) == shape
            assert v.dtype == dtype
            assert v.data_ptr() - base == at + built.fields[name].offset
            assert v.is_contiguous()
        assert torch.equal(seg.view(slot, "image"), torch.from_numpy(img))
        assert seg.view(slot, "label").tolist() == [7, -1]
        assert seg.view(slot, "index").tolist() == [123456789012, 5]
        assert seg.view(slot, "crop").tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
        assert seg.view(slot, "image") is seg.view(slot, "image")
    finally:
        seg.close()


def test_views_are_shared_memory_both_ways(built: Built) -> None:
    """The mapping is MAP_SHARED read-write: later writes to the memfd show in a view, and a view's writes reach it."""
    seg = open_segment(built)
    try:
        labels = seg.view(0, "label")
        at = built.slot_at(0) + built.fields["label"].offset
        built.write(at, struct.pack("<qq", 41, 42))
        assert labels.tolist() == [41, 42]
        labels[1] = 99
        assert struct.unpack("<qq", built.read(at, 16)) == (41, 99)
    finally:
        seg.close()


def test_numpy_views(built: Built) -> None:
    """Without torch the same views come as numpy arrays (array="numpy")."""
    built.write(built.slot_at(1) + built.fields["crop"].offset, struct.pack("<10i", *range(10, 20)))
    seg = open_segment(built, array="numpy")
    try:
        crop = seg.view(1, "crop")
        assert isinstance(crop, np.ndarray)
        assert crop.dtype == np.int32
        assert crop.shape == (2, 5)
        assert crop.tolist() == [list(range(10, 15)), list(range(15, 20))]
        assert seg.view(1, "image").shape == (2, 4, 6, 3)
    finally:
        seg.close()


def test_slot_header_decodes(built: Built) -> None:
    """A slot header written per ring.md decodes to its seq, run, epoch, batch, count and skipped."""
    built.write(built.slot_at(1), bytes(slot_header(seq=2**40 + 3, run=7, epoch=4, batch=2**33, count=1, skipped=1)))
    seg = open_segment(built)
    try:
        assert seg.slot_header(1) == ring.SlotHeader(seq=2**40 + 3, run=7, epoch=4, batch=2**33, count=1, skipped=1)
    finally:
        seg.close()


@pytest.mark.parametrize(
    ("offset", "what"), [(0, "seq"), (9, "run"), (24, "count"), (40, "reserved"), (61, "the crc itself")]
)
def test_slot_header_crc_mismatch_is_refused(built: Built, offset: int, what: str) -> None:
    """A flipped bit anywhere in a slot header (here: {what}) is a checksum error naming the slot's offset."""
    h = slot_header(seq=1, run=1, epoch=0, batch=0, count=2)
    h[offset] ^= 0x10
    built.write(built.slot_at(2), bytes(h))
    seg = open_segment(built)
    try:
        with pytest.raises(ProtocolError, match=f"slot header at byte {built.slot_at(2)} has checksum"):
            seg.slot_header(2)
    finally:
        seg.close()


@pytest.mark.parametrize("count", [0, 3])
def test_slot_header_count_out_of_range(built: Built, count: int) -> None:
    """A slot's count must lie in 0..=batch_size, and 0 only when samples were skipped."""
    built.write(built.slot_at(0), bytes(slot_header(seq=1, run=1, epoch=0, batch=0, count=count)))
    seg = open_segment(built)
    try:
        with pytest.raises(ProtocolError, match=f"count {count} \\(skipped 0\\), outside 0..=2"):
            seg.slot_header(0)
    finally:
        seg.close()


def test_slot_header_of_a_batch_whose_every_sample_was_skipped(built: Built) -> None:
    """count 0 with skipped samples is an empty batch (ring.md, "Slot header")."""
    built.write(built.slot_at(0), bytes(slot_header(seq=1, run=1, epoch=0, batch=0, count=0, skipped=2)))
    seg = open_segment(built)
    try:
        h = seg.slot_header(0)
        assert (h.count, h.skipped) == (0, 2)
    finally:
        seg.close()


def damaged(edit: Callable[[bytearray], None], *, fix_crc: bool = True) -> bytearray:
    page = header_page(standard_fields(4, 6, extras=("index",)), batch_size=2, slot_count=3)
    edit(page)
    if fix_crc:
        refresh_header_crc(page)
    return page


def refuse(page: bytearray, match: str, length: int | None = None) -> None:
    (seg_len,) = struct.unpack_from("<Q", page, 32)
    length = seg_len if length is None else length
    fd = memfd_segment(page, max(length, 4096, seg_len if seg_len < 1 << 30 else 0))
    try:
        with pytest.raises(ProtocolError, match=match):
            ring.Segment(fd, length)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("at", "field"), [(16, "slot_count"), (40, "batch_size"), (64 + 40, "a field offset")])
def test_header_crc_mismatch_is_refused(at: int, field: str) -> None:
    """A changed byte in the header or a field descriptor ({field}) without a matching CRC is refused."""
    refuse(damaged(lambda b: b.__setitem__(at, b[at] ^ 1), fix_crc=False), "header checksum mismatch")


def test_crc_covers_exactly_bytes_0_60_and_the_descriptors() -> None:
    """Padding after the descriptors is outside the CRC; bytes 60..64 are the CRC itself."""
    page = header_page(standard_fields(4, 6), batch_size=2, slot_count=1)
    (count,) = struct.unpack_from("<I", page, 20)
    assert struct.unpack_from("<I", page, 60)[0] == crc32c(bytes(page[:60]) + bytes(page[64 : 64 + 64 * count]))


def test_major_version_is_refused_naming_both_versions() -> None:
    """A segment of major version 2 (with a valid CRC) is refused, naming 2.x and 1.x."""
    refuse(damaged(lambda b: put(b, 8, "HH", 2, 3)), r"layout version 2\.3, but this client reads version 1\.x only")


def test_newer_minor_is_read() -> None:
    """Minor 7 of major 1 is read, reserved bytes and all (a newer minor may use them)."""

    def newer(b: bytearray) -> None:
        put(b, 10, "H", 7)  # minor 7
        put(b, 44, "I", 0xABCD)  # reserved header bytes in use
        put(b, 64 + 36, "I", 5)  # reserved field bytes in use

    page = damaged(newer)
    (length,) = struct.unpack_from("<Q", page, 32)
    fd = memfd_segment(page, length)
    try:
        seg = ring.Segment(fd, length)
        assert (seg.header.major, seg.header.minor) == (1, 7)
        seg.close()
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda b: b.__setitem__(slice(0, 8), b"RFRINX\0\0"), "bad magic"),
        (lambda b: put(b, 20, "I", 0), r"field_count 0 is outside 1..=16"),
        (lambda b: put(b, 20, "I", 17), r"field_count 17 is outside 1..=16"),
        (lambda b: put(b, 12, "I", 8192), "header_len is 8192"),
        (lambda b: put(b, 44, "B", 1), "reserved bytes 44..60"),
        (lambda b: put(b, 24, "Q", 5000), "slot_stride 5000"),
        (lambda b: put(b, 40, "I", 0), "batch_size is 0"),
        (lambda b: put(b, 16, "I", 0), "slot_count is 0"),
        (lambda b: put(b, 32, "Q", 4096), "segment_len 4096 is not header_len"),
        (lambda b: put(b, 64 + 16, "B", 9), "unknown dtype code 9"),
        (lambda b: put(b, 64 + 17, "B", 5), "ndim 5"),
        (lambda b: put(b, 64 + 20 + 12, "I", 1), "unused 0"),
        (lambda b: put(b, 64 + 20, "I", 0), "used dimensions must be non-zero"),
        (lambda b: put(b, 64 + 48, "Q", 71), "sample_bytes 71"),
        (lambda b: put(b, 64 + 40, "Q", 4097), "offset 4097"),
        (lambda b: put(b, 64 + 40, "Q", 0), "offset 0"),
        (lambda b: put(b, 128 + 40, "Q", 4096), "payloads of fields '(image|label)' and '(image|label)' overlap"),
        (lambda b: put(b, 128 + 40, "Q", 1 << 20), "ends past the slot"),
        (lambda b: b.__setitem__(slice(128, 144), b"label\0x" + bytes(9)), "not NUL-padded ASCII"),
        (lambda b: b.__setitem__(slice(128, 144), b"image" + bytes(11)), "described twice"),
        (lambda b: put(b, 64 + 18, "B", 1), "non-zero reserved bytes"),
    ],
)
def test_invalid_headers_are_refused(edit: Callable[[bytearray], None], match: str) -> None:
    """Every bound of the SegmentHeader and FieldDesc tables is checked (with a valid CRC), naming the field."""
    refuse(damaged(edit), match)


def test_descriptor_shorter_than_segment_len_is_refused() -> None:
    """A memfd shorter than the ring message's segment_len is refused before mapping (no SIGBUS later)."""
    page = header_page(standard_fields(4, 6), batch_size=2, slot_count=2)
    (length,) = struct.unpack_from("<Q", page, 32)
    fd = memfd_segment(page, length - 4096)
    try:
        with pytest.raises(ProtocolError, match=f"segment_len {length}"):
            ring.Segment(fd, length)
    finally:
        os.close(fd)


def test_segment_len_must_equal_the_mapped_length() -> None:
    """The header's segment_len must equal the ring message's segment_len."""
    page = header_page(standard_fields(4, 6), batch_size=2, slot_count=2)
    (length,) = struct.unpack_from("<Q", page, 32)
    fd = memfd_segment(page, length + 4096)
    try:
        with pytest.raises(ProtocolError, match="differs from the"):
            ring.Segment(fd, length + 4096)
    finally:
        os.close(fd)


def memfd_mappings() -> int:
    return sum("memfd:ringfeed-test" in line for line in Path("/proc/self/maps").read_text().splitlines())


def test_close_with_views_outstanding_defers_the_unmap(built: Built) -> None:
    """close() with a view alive keeps the memory mapped (the view stays readable) until the last view is freed."""
    built.write(built.slot_at(0) + built.fields["label"].offset, struct.pack("<qq", 5, 6))
    before = memfd_mappings()
    seg = open_segment(built)
    labels = seg.view(0, "label")[:1]
    image = seg.view(0, "image")
    assert memfd_mappings() == before + 1
    seg.close()
    seg.close()  # idempotent
    assert seg.closed
    assert labels.tolist() == [5]  # still mapped: no crash
    assert memfd_mappings() == before + 1
    del labels, image
    assert memfd_mappings() == before
    with pytest.raises(ValueError, match="closed"):
        seg.view(0, "label")


def test_close_without_views_unmaps_at_once(built: Built) -> None:
    """close() with no view outstanding unmaps immediately."""
    before = memfd_mappings()
    seg = open_segment(built)
    seg.view(1, "image")  # cached by the segment itself, dropped by close()
    seg.close()
    assert memfd_mappings() == before


def test_multi_dimensional_fields_and_float32() -> None:
    """A float32 [2, 3] field and an int32 scalar field view correctly (every dtype code works)."""
    fields = [FieldSpec("image", UINT8, (1, 1, 3)), FieldSpec("m", 4, (2, 3)), FieldSpec("k", INT32, ())]
    b = Built(fields, batch_size=3, slot_count=1)
    try:
        m = np.arange(18, dtype="<f4") / 4
        b.write(b.slot_at(0) + b.fields["m"].offset, m.tobytes())
        b.write(b.slot_at(0) + b.fields["k"].offset, struct.pack("<3i", -1, 0, 1))
        seg = open_segment(b)
        assert torch.equal(seg.view(0, "m"), torch.from_numpy(m.reshape(3, 2, 3)))
        assert seg.view(0, "k").tolist() == [-1, 0, 1]
        seg.close()
    finally:
        os.close(b.fd)


def test_int64_label_field_shape() -> None:
    """Scalar fields (ndim 0) view as [batch_size]."""
    b = Built([FieldSpec("label", INT64, ())], batch_size=5, slot_count=2)
    try:
        seg = open_segment(b)
        assert tuple(seg.view(1, "label").shape) == (5,)
        seg.close()
    finally:
        os.close(b.fd)


# -- the shared vectors ---------------------------------------------------------------------------

VECTORS = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "ring"
needs_vectors = pytest.mark.skipif(
    not (VECTORS / "expected.json").exists(), reason="proto/vectors/ring/ not generated yet (Rust wire_vectors)"
)


def expected() -> Any:
    return json.loads((VECTORS / "expected.json").read_text())


@needs_vectors
def test_vector_segment_header_decodes_as_expected() -> None:
    """segment.bin (the Rust server's header page) decodes to exactly expected.json's header and fields."""
    want = expected()["segment"]
    page = (VECTORS / "segment.bin").read_bytes()
    assert len(page) == want["header_len"] == 4096
    header, fields = ring.decode_segment_header(page)
    for key in ("major", "minor", "header_len", "slot_count", "slot_stride", "segment_len", "batch_size"):
        assert getattr(header, key) == want[key], key
    assert header.field_count == len(want["fields"])
    got = [
        {"name": f.name, "dtype": f.code, "shape": list(f.shape), "offset": f.offset, "sample_bytes": f.sample_bytes}
        for f in fields.values()
    ]
    assert got == want["fields"]


@needs_vectors
def test_vector_segment_maps_with_expected_slot_offsets() -> None:
    """A memfd holding segment.bin as its first page maps, with slots where expected.json puts them."""
    want = expected()
    page = (VECTORS / "segment.bin").read_bytes()
    fd = memfd_segment(page, want["segment"]["segment_len"])
    try:
        seg = ring.Segment(fd, want["segment"]["segment_len"])
        assert [seg.slot_offset(s) for s in range(seg.slot_count)] == want["slot_offsets"]
        assert tuple(seg.view(2, "image").shape) == (2, 4, 6, 3)
        seg.close()
    finally:
        os.close(fd)


@needs_vectors
def test_vector_slot_header_decodes_as_expected() -> None:
    """slot.bin, slot-all-skipped.bin (count 0) and slot-bucket.bin (1.10: height, width) decode to expected.json's."""
    want = expected()
    got = ring.decode_slot_header((VECTORS / "slot.bin").read_bytes(), batch_size=want["segment"]["batch_size"])
    assert got._asdict() == want["slot"]
    batch_size = want["segment"]["batch_size"]
    skipped = ring.decode_slot_header((VECTORS / "slot-all-skipped.bin").read_bytes(), batch_size=batch_size)
    assert skipped._asdict() == want["slot_all_skipped"]
    assert bytes(slot_header(**want["slot_all_skipped"])) == (VECTORS / "slot-all-skipped.bin").read_bytes()
    bucket = ring.decode_slot_header((VECTORS / "slot-bucket.bin").read_bytes(), batch_size=batch_size)
    assert bucket._asdict() == want["slot_bucket"]
    assert bytes(slot_header(**want["slot_bucket"])) == (VECTORS / "slot-bucket.bin").read_bytes()


@needs_vectors
def test_vector_bytes_equal_an_independent_encoding() -> None:
    """Encoding expected.json's values from ring.md's tables gives segment.bin and slot.bin byte for byte."""
    want = expected()
    s = want["segment"]
    specs = [FieldSpec(f["name"], f["dtype"], tuple(f["shape"])) for f in s["fields"]]
    page = header_page(specs, batch_size=s["batch_size"], slot_count=s["slot_count"])
    assert bytes(page) == (VECTORS / "segment.bin").read_bytes()
    assert [f.offset for f in specs] == [f["offset"] for f in s["fields"]]
    slot = want["slot"]
    assert bytes(slot_header(**slot)) == (VECTORS / "slot.bin").read_bytes()
    packed = ring.SLOT_HEADER.pack(
        slot["seq"], slot["run"], slot["epoch"], slot["batch"], slot["count"], slot["skipped"], 0, 0, bytes(20), 0
    )
    assert packed[:60] == (VECTORS / "slot.bin").read_bytes()[:60]
