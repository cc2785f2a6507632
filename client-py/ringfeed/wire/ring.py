"""The shared-memory ring, version 1.0 (``proto/ring.md`` is the normative text).

This module is the single Python truth for the ring's layout, the counterpart of the Rust
``crates/format/src/ring/``: the magic, the versions, every structure as a ``struct.Struct("<...")``
constant with its size asserted, the dtype codes, and ``Segment``, a client's mapping of one ring.
``tests/test_ring.py`` builds segments field by field from the spec's tables, and the vectors in
``proto/vectors/ring/`` pin the bytes.

Invariants:

- The segment is a memfd the server created and passed in the ``ring`` message. It is mapped
  ``MAP_SHARED`` read-write, attached without owning any name (there is none to unlink: the memory
  goes away when the server's and the client's mappings and descriptors are gone).
- The segment header is checked in this order before any other field is used: magic, major
  version (only 1 is read; any minor of it is), field count, CRC, then every bound, so a damaged
  or foreign header never leads to a view outside the mapping. A newer minor may use the reserved
  bytes and a longer header; the 1.0 rules (zero reserved bytes, ``header_len == 4096``) apply
  only to minor 0.
- Views are zero-copy: ``torch.frombuffer`` (or ``numpy.frombuffer`` without torch) over one
  ``memoryview`` of the mapping. Every view holds a reference to that memoryview, which holds a
  buffer export of the mmap, so ``close()`` never unmaps memory a view still points to: the unmap
  is deferred until the last view is freed (``mmap.close`` raises ``BufferError`` until then).
- This module knows nothing of ownership. Which slot may be read when is the caller's business
  (ring.md, "Slot states and ownership"): the loader reads a slot only while it holds it.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import struct
import sys
from typing import Any, NamedTuple

from .._errors import ProtocolError
from ..formats.crc32c import crc32c

__all__ = ["DTYPES", "Field", "Segment", "SegmentHeader", "SlotHeader"]

MAGIC = b"RFRING\0\0"
#: Major version read by this implementation.
MAJOR = 1
#: Minor version this implementation knows; any minor of ``MAJOR`` is read.
MINOR = 0
#: Page size the layout aligns to (header length, slot stride, field offsets).
PAGE = 4096
#: ``header_len`` of a 1.0 segment.
HEADER_LEN = 4096
#: Most fields a segment may describe.
MAX_FIELDS = 16
#: Most dimensions of one sample.
MAX_NDIM = 4

#: SegmentHeader: magic, major, minor, header_len, slot_count, field_count, slot_stride,
#: segment_len, batch_size, reserved[16], header_crc.
SEGMENT_HEADER = struct.Struct("<8sHHIIIQQI16sI")
#: FieldDesc: name[16], dtype, ndim, reserved[2], shape u32[4], reserved[4], offset, sample_bytes,
#: reserved[8].
FIELD_DESC = struct.Struct("<16sBB2s4I4sQQ8s")
#: SlotHeader: seq, run, epoch, batch, count, skipped, height, width (control 1.10: an
#: aspect-bucketed batch's image size, else 0), reserved[20], header_crc.
SLOT_HEADER = struct.Struct("<QIIQIIII20sI")

# The spec's tables, restated.
assert SEGMENT_HEADER.size == 64
assert FIELD_DESC.size == 64
assert SLOT_HEADER.size == 64
#: Where the field descriptors start, and the offset of a structure's trailing CRC.
FIELDS_OFFSET = 64
CRC_OFFSET = 60


class DType(NamedTuple):
    """One row of ring.md's dtype table."""

    name: str
    itemsize: int
    #: The numpy dtype string (explicitly little-endian).
    numpy: str

    def torch(self) -> Any:
        """The torch dtype (imports torch)."""
        import torch

        return getattr(torch, self.name)


#: ring.md, "Dtype codes".
DTYPES: dict[int, DType] = {
    1: DType("uint8", 1, "|u1"),
    2: DType("int32", 4, "<i4"),
    3: DType("int64", 8, "<i8"),
    4: DType("float32", 4, "<f4"),
}


class SegmentHeader(NamedTuple):
    """A decoded, checked SegmentHeader (ring.md, "SegmentHeader")."""

    major: int
    minor: int
    header_len: int
    slot_count: int
    field_count: int
    slot_stride: int
    segment_len: int
    batch_size: int


class Field(NamedTuple):
    """A decoded, checked FieldDesc (ring.md, "FieldDesc")."""

    name: str
    #: The dtype code; ``dtype`` is ``None`` for a code this client does not know (newer minor).
    code: int
    dtype: DType | None
    #: One sample's shape (``()`` for a scalar).
    shape: tuple[int, ...]
    #: Where the payload starts, from the start of a slot.
    offset: int
    sample_bytes: int


class SlotHeader(NamedTuple):
    """A decoded, checked SlotHeader (ring.md, "SlotHeader")."""

    seq: int
    run: int
    epoch: int
    batch: int
    count: int  # type: ignore[assignment]  # the spec's name; shadows tuple.count
    skipped: int
    #: Control 1.10: the batch's image height and width in an aspect-bucketed stream (0 otherwise).
    height: int = 0
    width: int = 0


def _error(detail: str) -> ProtocolError:
    return ProtocolError(f"the ring segment is invalid: {detail}")


def decode_segment_header(buf: Any, length: int | None = None) -> tuple[SegmentHeader, dict[str, Field]]:
    """Decodes and checks the header and field descriptors at the start of ``buf``.

    Args:
        buf: at least the first ``64 + 64 * field_count`` bytes of a segment.
        length: the segment's real length, which ``segment_len`` must equal; ``None`` skips the
            check (the vectors hold only the first page of a segment).

    Raises:
        ProtocolError: naming the field and the values found, for the first rule broken.
    """
    if len(buf) < SEGMENT_HEADER.size:
        raise _error(f"{len(buf)} bytes is too short for the 64-byte segment header")
    magic, major, minor, header_len, slot_count, field_count, stride, seg_len, batch_size, reserved, stored = (
        SEGMENT_HEADER.unpack_from(buf)
    )
    if magic != MAGIC:
        raise _error(f"bad magic {magic!r}, expected {MAGIC!r}")
    if major != MAJOR:
        raise ProtocolError(
            f"the ring segment has layout version {major}.{minor}, but this client reads version {MAJOR}.x only; "
            f"install the ringfeed Python package that matches the server"
        )
    if not 1 <= field_count <= MAX_FIELDS:
        raise _error(f"field_count {field_count} is outside 1..={MAX_FIELDS}")
    fields_end = FIELDS_OFFSET + FIELD_DESC.size * field_count
    if len(buf) < fields_end:
        raise _error(f"{len(buf)} bytes is too short for {field_count} field descriptors")
    computed = crc32c(bytes(buf[:CRC_OFFSET]) + bytes(buf[FIELDS_OFFSET:fields_end]))
    if stored != computed:
        raise _error(f"header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")
    if minor == MINOR:
        if header_len != HEADER_LEN:
            raise _error(f"header_len is {header_len}, version 1.0 has {HEADER_LEN}")
        if any(reserved):
            raise _error("reserved bytes 44..60 of the header are not zero")
    elif header_len % PAGE or header_len < fields_end:
        raise _error(f"header_len {header_len} is not a multiple of {PAGE} holding {field_count} field descriptors")
    if slot_count < 1:
        raise _error("slot_count is 0")
    if stride == 0 or stride % PAGE:
        raise _error(f"slot_stride {stride} is not a positive multiple of {PAGE}")
    if batch_size < 1:
        raise _error("batch_size is 0")
    if seg_len != header_len + slot_count * stride:
        raise _error(
            f"segment_len {seg_len} is not header_len + slot_count * slot_stride "
            f"= {header_len} + {slot_count} * {stride}"
        )
    if length is not None and seg_len != length:
        raise _error(f"segment_len {seg_len} differs from the {length} bytes mapped (the `ring` message's segment_len)")
    fields: dict[str, Field] = {}
    for f in range(field_count):
        field = _decode_field(buf, f, minor, batch_size, stride)
        if field.name in fields:
            raise _error(f"field {field.name!r} is described twice")
        fields[field.name] = field
    # Payloads of different fields do not overlap.
    spans = sorted((f.offset, f.offset + batch_size * f.sample_bytes, f.name) for f in fields.values())
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise _error(f"the payloads of fields {a!r} and {b!r} overlap")
    header = SegmentHeader(major, minor, header_len, slot_count, field_count, stride, seg_len, batch_size)
    return header, fields


def _decode_field(buf: Any, f: int, minor: int, batch_size: int, stride: int) -> Field:
    at = FIELDS_OFFSET + FIELD_DESC.size * f
    raw_name, code, ndim, res1, *rest = FIELD_DESC.unpack_from(buf, at)
    shape4, (res2, offset, sample_bytes, res3) = tuple(rest[:4]), rest[4:]
    name_bytes, _, padding = raw_name.partition(b"\0")
    if not name_bytes or any(padding) or not name_bytes.isascii():
        raise _error(f"field {f} has the name {raw_name!r}, not NUL-padded ASCII")
    name = name_bytes.decode("ascii")
    what = f"field {name!r}"
    if minor == MINOR and (any(res1) or any(res2) or any(res3)):
        raise _error(f"{what} has non-zero reserved bytes")
    dtype = DTYPES.get(code)
    if dtype is None and minor == MINOR:
        raise _error(f"{what} has the unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise _error(f"{what} has ndim {ndim}, more than {MAX_NDIM}")
    shape = shape4[:ndim]
    if any(d == 0 for d in shape) or any(shape4[ndim:]):
        raise _error(f"{what} has shape {list(shape4)} with ndim {ndim}: used dimensions must be non-zero, unused 0")
    if dtype is not None:
        numel = 1
        for d in shape:
            numel *= d
        if sample_bytes != dtype.itemsize * numel:
            raise _error(
                f"{what} has sample_bytes {sample_bytes}, but {dtype.name} {list(shape)} takes "
                f"{dtype.itemsize * numel} bytes"
            )
    if offset % PAGE or offset < PAGE:
        raise _error(f"{what} has offset {offset}, not a multiple of {PAGE} after the slot header")
    if offset + batch_size * sample_bytes > stride:
        raise _error(
            f"{what}'s payload ({batch_size} * {sample_bytes} bytes at offset {offset}) ends past the "
            f"slot ({stride} bytes)"
        )
    return Field(name, code, dtype, tuple(shape), offset, sample_bytes)


def decode_slot_header(buf: Any, at: int = 0, *, batch_size: int | None = None, minor: int = MINOR) -> SlotHeader:
    """Decodes and checks the SlotHeader at byte ``at`` of ``buf``.

    Args:
        batch_size: the segment's batch size, which ``count`` may not exceed (``None``: unchecked).
        minor: the segment's minor version (reserved bytes must be zero in minor 0).

    Raises:
        ProtocolError: a checksum mismatch, non-zero reserved bytes, or a count out of range.
    """
    seq, run, epoch, batch, count, skipped, height, width, reserved, stored = SLOT_HEADER.unpack_from(buf, at)
    computed = crc32c(bytes(buf[at : at + CRC_OFFSET]))
    if stored != computed:
        raise _error(f"the slot header at byte {at} has checksum {stored:#010x}, computed {computed:#010x}")
    if minor == MINOR and any(reserved):
        raise _error(f"the slot header at byte {at} has non-zero reserved bytes")
    if count + skipped < 1 or (batch_size is not None and count > batch_size):
        # count 0 is a batch whose every sample was skipped (ring.md, "Slot header").
        raise _error(
            f"the slot header at byte {at} has count {count} (skipped {skipped}), outside 0..={batch_size} "
            f"or with nothing skipped"
        )
    return SlotHeader(seq, run, epoch, batch, count, skipped, height, width)


def _array_api(array: str | None) -> str:
    """Resolves ``array="auto"`` to ``"torch"`` when torch is importable, else ``"numpy"``."""
    if array in ("torch", "numpy"):
        return array
    if array != "auto":
        raise ValueError(f"array must be 'torch', 'numpy' or 'auto', got {array!r}")
    try:
        import torch  # noqa: F401
    except ImportError:
        return "numpy"
    return "torch"


# Since 3.13 an mmap need not keep a duplicate of the file descriptor open.
_MMAP_OPTIONS: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}


class Segment:
    """One ring segment, mapped: its checked header, its slots' headers, zero-copy field views.

    The caller keeps ownership of ``fd`` (the mapping does not need it; close it after this).

    Args:
        fd: the memfd of the ``ring`` message.
        length: the ``ring`` message's ``segment_len``: bytes to map.
        array: ``"torch"``, ``"numpy"`` or ``"auto"`` (torch when importable): what ``view`` returns.

    Raises:
        ProtocolError: the descriptor is shorter than ``length`` or the header is invalid.
    """

    def __init__(self, fd: int, length: int, *, array: str = "auto") -> None:
        self.array = _array_api(array)
        if sys.byteorder != "little":
            raise ProtocolError("the ring is little-endian and views need a little-endian host")
        size = os.fstat(fd).st_size
        if length < SEGMENT_HEADER.size or size < length:
            # Mapping past the end of the memfd would turn a read into SIGBUS.
            raise _error(f"the descriptor holds {size} bytes, the `ring` message says segment_len {length}")
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._mm: mmap.mmap | None = mmap.mmap(
            fd, length, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE, **_MMAP_OPTIONS
        )
        #: The one buffer every view is made from (see the module's invariants).
        self._buf: memoryview | None = memoryview(self._mm)
        self._views: dict[tuple[int, str], Any] = {}
        self._base: int | None = None  # the mapping's address, for ``holds``
        try:
            self.header, self.fields = decode_segment_header(self._buf, length)
        except BaseException:
            self.close()
            raise
        self.length = length

    @property
    def closed(self) -> bool:
        return self._buf is None

    @property
    def slot_count(self) -> int:
        return self.header.slot_count

    @property
    def batch_size(self) -> int:
        return self.header.batch_size

    def slot_offset(self, slot: int) -> int:
        """Where slot ``slot`` starts in the segment."""
        if not 0 <= slot < self.header.slot_count:
            raise IndexError(f"slot {slot} is outside 0..{self.header.slot_count}")
        return self.header.header_len + slot * self.header.slot_stride

    def slot_header(self, slot: int) -> SlotHeader:
        """Decodes and checks the header of slot ``slot`` (read it only while the slot is HELD)."""
        return decode_slot_header(
            self._buffer(), self.slot_offset(slot), batch_size=self.header.batch_size, minor=self.header.minor
        )

    def view(self, slot: int, name: str) -> Any:
        """The payload of field ``name`` in slot ``slot``, zero-copy, shaped ``[batch_size, *shape]``.

        Only the first ``slot_header(slot).count`` samples are meaningful. Returns a torch tensor
        or a numpy array (``array``); the same object for the same slot and field.
        """
        key = (slot, name)
        v = self._views.get(key)
        if v is not None:
            return v
        field = self.fields.get(name)
        if field is None:
            raise KeyError(f"the ring has no field {name!r}; it has {', '.join(self.fields)}")
        if field.dtype is None:
            raise ProtocolError(f"field {name!r} has dtype code {field.code}, which this client does not know")
        start = self.slot_offset(slot) + field.offset
        count = self.header.batch_size * (field.sample_bytes // field.dtype.itemsize)
        shape = (self.header.batch_size, *field.shape)
        if self.array == "torch":
            import torch

            v = torch.frombuffer(self._buffer(), dtype=field.dtype.torch(), count=count, offset=start).view(shape)
        else:
            import numpy as np

            v = np.frombuffer(self._buffer(), dtype=field.dtype.numpy, count=count, offset=start).reshape(shape)
        self._views[key] = v
        return v

    def packed_view(self, slot: int, name: str, count: int, shape: tuple[int, ...]) -> Any:
        """Control 1.10: the first ``count`` samples of field ``name`` in slot ``slot``, packed at
        the per-sample ``shape`` (an aspect-bucketed batch's ``(h, w, 3)`` or ``(3, h, w)``), zero-copy.

        The shape's bytes may not exceed the field's ``sample_bytes`` (ring.md, "SlotHeader").
        """
        field = self.fields[name]
        if field.dtype is None:
            raise ProtocolError(f"field {name!r} has dtype code {field.code}, which this client does not know")
        per = 1
        for d in shape:
            per *= d
        if per * field.dtype.itemsize > field.sample_bytes or not 0 <= count <= self.header.batch_size:
            raise _error(f"a batch of {count} samples of {list(shape)} does not fit field {name!r}")
        start = self.slot_offset(slot) + field.offset
        if self.array == "torch":
            import torch

            if count == 0:  # every sample skipped: frombuffer refuses an empty count
                return torch.empty((0, *shape), dtype=field.dtype.torch())
            t = torch.frombuffer(self._buffer(), dtype=field.dtype.torch(), count=count * per, offset=start)
            return t.view((count, *shape))
        import numpy as np

        return np.frombuffer(self._buffer(), dtype=field.dtype.numpy, count=count * per, offset=start).reshape(
            (count, *shape)
        )

    def holds(self, t: Any) -> bool:
        """Whether tensor (or array) ``t``'s memory lies in this segment: a view of the ring."""
        if self._base is None:
            self._base = _address(self.as_uint8())
        return self._base <= _address(t) < self._base + self.length

    def as_uint8(self) -> Any:
        """The whole segment as one flat uint8 tensor (or array), zero-copy: e.g. to pin it."""
        if self.array == "torch":
            import torch

            return torch.frombuffer(self._buffer(), dtype=torch.uint8)
        import numpy as np

        return np.frombuffer(self._buffer(), dtype=np.uint8)

    def close(self) -> None:
        """Drops this object's views and unmaps the segment, or defers the unmap while views live.

        Views handed out earlier stay valid memory (the unmap waits for the last of them), but
        their bytes are no longer owned by anyone: the server may reuse or free the ring.
        Idempotent.
        """
        self._views.clear()
        mm, self._mm, self._buf = self._mm, None, None
        if mm is None:
            return
        # BufferError: a view still refers to the memoryview; it unmaps when the last one is freed.
        with contextlib.suppress(BufferError):
            mm.close()

    def _buffer(self) -> memoryview:
        if self._buf is None:
            raise ValueError("the ring segment is closed")
        return self._buf

    def __repr__(self) -> str:
        h = self.header
        state = "closed" if self.closed else f"{self.length} bytes"
        return (
            f"<ringfeed Segment {h.major}.{h.minor}, {h.slot_count} slots of {h.batch_size}, "
            f"fields {', '.join(self.fields)}, {state}>"
        )


def _address(a: Any) -> int:
    """Where the first element of torch tensor or numpy array ``a`` lies in memory."""
    return int(a.data_ptr()) if hasattr(a, "data_ptr") else int(a.ctypes.data)
