"""The packed dataset format, version 1.0 (``proto/shard.md`` is the normative text).

This module is the single Python truth for the on-disk layout, the counterpart of the Rust
``crates/format/src/shard/mod.rs``: magics, versions, structure sizes and every structure as a
``struct.Struct("<...")`` constant, checked against the spec by module-level asserts and against
the vectors in ``proto/vectors/shard/`` by ``tests/test_format_vectors.py``. The reader
(``reader.py``) and ``verify`` (``verify.py``) use only what is defined here.

Invariants:

- Structures are decoded with explicit little-endian ``struct`` formats (``<``: no padding, any
  host byte order), straight from the mapped file with ``unpack_from``.
- Decoding a structure checks its magic, then its major version, then its CRC, before any other
  field is used; a foreign major version is reported only when the CRC matches (``check_struct``).
- Every error is a ``FormatError`` naming the file and, where there is one, the byte offset.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, Literal, NamedTuple

from .crc32c import crc32c

__all__ = ["FormatError"]

#: Major version written and read by this implementation.
MAJOR = 1
#: Minor version this implementation knows; any minor of ``MAJOR`` is read.
MINOR = 0

#: File name of the dataset index inside a dataset directory.
INDEX_FILE = "index.rfi"
#: Extension of shard files.
SHARD_EXT = "rfs"
#: Smallest and largest allowed record alignment (a power of two in between).
MIN_RECORD_ALIGN = 8
MAX_RECORD_ALIGN = 1 << 20
#: Longest allowed shard file name.
MAX_SHARD_NAME = 255

SHARD_MAGIC = b"RFSHARD\0"
SHARD_END_MAGIC = b"RFSHEND\0"
INDEX_MAGIC = b"RFINDEX\0"
INDEX_END_MAGIC = b"RFIXEND\0"

# Every structure of the spec, field by field in table order. Reserved fields are `Ns` so that
# `verify` can see them; the trailing `I` of the fixed structures is their CRC.

#: ShardHeader: magic, major, minor, record_align, shard_number, reserved[40], header_crc.
SHARD_HEADER = struct.Struct("<8sHHII40sI")
#: ShardFooter: magic, major, minor, record_count, table_offset, file_len, table_crc, body_crc,
#: reserved[20], footer_crc.
SHARD_FOOTER = struct.Struct("<8sHHIQQII20sI")
#: RecordEntry: offset, length, crc.
RECORD_ENTRY = struct.Struct("<QII")
#: IndexHeader: magic, major, minor, flags, sample_count, shard_count, class_count, shards_offset,
#: classes_offset, samples_offset, heap_offset, heap_len, info_offset, info_len, reserved[36],
#: header_crc.
INDEX_HEADER = struct.Struct("<8sHHIQIIQQQQQQQ36sI")
#: IndexFooter: magic, major, minor, body_crc, file_len, reserved, footer_crc.
INDEX_FOOTER = struct.Struct("<8sHHIQII")
#: ShardEntry: name_offset, name_len, record_count, file_len, body_crc, reserved.
SHARD_ENTRY = struct.Struct("<QIIQII")
#: ClassEntry: name_offset, name_len, reserved.
CLASS_ENTRY = struct.Struct("<QII")
#: SampleEntry: label (i64), heap_offset, key_len, meta_len, shard, record.
SAMPLE_ENTRY = struct.Struct("<qQIIII")
#: The version fields every fixed structure carries at byte 8.
VERSION = struct.Struct("<HH")
VERSION_OFFSET = 8

# The spec's tables, restated.
assert SHARD_HEADER.size == 64
assert SHARD_FOOTER.size == 64
assert RECORD_ENTRY.size == 16
assert INDEX_HEADER.size == 128
assert INDEX_FOOTER.size == 32
assert SHARD_ENTRY.size == 32
assert CLASS_ENTRY.size == 16
assert SAMPLE_ENTRY.size == 32

#: The smallest possible index: a header and a footer.
MIN_INDEX_LEN = INDEX_HEADER.size + INDEX_FOOTER.size
#: The smallest possible shard: a header and a footer.
MIN_SHARD_LEN = SHARD_HEADER.size + SHARD_FOOTER.size

Kind = Literal["io", "bad_magic", "unsupported_version", "checksum", "truncated", "corrupt"]
#: The spec's error kinds ("Error kinds"), without `decode`, which needs `verify --decode`.
KINDS: tuple[Kind, ...] = ("io", "bad_magic", "unsupported_version", "checksum", "truncated", "corrupt")


class FormatError(Exception):
    """A packed dataset could not be read, or failed verification.

    Attributes:
        kind: the spec's error kind (``proto/shard.md``, "Error kinds"): ``io``, ``bad_magic``,
            ``unsupported_version``, ``checksum``, ``truncated`` or ``corrupt``. The vectors in
            ``proto/vectors/shard/cases.json`` pin which kind each damage produces.
        path: the file (or, for a missing index, the file that was looked for).
        offset: byte offset of the problem in ``path``, or ``None`` when there is none (``io``).
    """

    kind: Kind
    path: str
    offset: int | None

    def __init__(self, kind: Kind, path: str | os.PathLike[str], offset: int | None, message: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}; expected one of {', '.join(KINDS)}")
        super().__init__(message)
        self.kind = kind
        self.path = os.fspath(path)
        self.offset = offset

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.path, self.offset, str(self)))

    @classmethod
    def at(cls, kind: Kind, path: str | os.PathLike[str], offset: int, detail: str) -> FormatError:
        """An error at byte ``offset`` of ``path``: ``"{path} at byte {offset}: {detail}"``."""
        return cls(kind, path, offset, f"{os.fspath(path)} at byte {offset}: {detail}")

    @classmethod
    def corrupt(cls, path: str | os.PathLike[str], offset: int, detail: str) -> FormatError:
        return cls.at("corrupt", path, offset, detail)

    @classmethod
    def truncated(cls, path: str | os.PathLike[str], offset: int, detail: str) -> FormatError:
        return cls.at("truncated", path, offset, f"truncated: {detail}")

    @classmethod
    def checksum(cls, path: str | os.PathLike[str], offset: int, what: str, stored: int, computed: int) -> FormatError:
        detail = f"{what} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
        return cls.at("checksum", path, offset, detail)


def escape(b: bytes) -> str:
    """Prints bytes the way Rust's ``escape_ascii`` does: printable ASCII as is, the rest escaped."""
    out = []
    for c in b:
        if c in (0x09, 0x0A, 0x0D):
            out.append({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}[c])
        elif c in (0x22, 0x27, 0x5C):
            out.append("\\" + chr(c))
        elif 0x20 <= c < 0x7F:
            out.append(chr(c))
        else:
            out.append(f"\\x{c:02x}")
    return "".join(out)


def align_up(x: int, a: int) -> int:
    """Rounds ``x`` up to a multiple of ``a`` (a power of two)."""
    return (x + a - 1) & ~(a - 1)


def check_struct(path: str | os.PathLike[str], offset: int, raw: bytes, what: str, magic: bytes) -> None:
    """Checks magic, major version and the trailing CRC of one fixed-size structure.

    ``raw`` is exactly the structure; ``offset`` is where it starts in ``path``. The CRC covers
    every byte before the last four. A major version other than ``MAJOR`` is reported as
    ``unsupported_version`` only when the CRC matches: a flipped bit in the version field is just
    damage (``checksum``).
    """
    found = raw[:8]
    if found != magic:
        raise FormatError.at(
            "bad_magic",
            path,
            offset,
            f'bad magic in the {what}: expected b"{escape(magic)}", found b"{escape(found)}"',
        )
    n = len(raw)
    (stored,) = struct.unpack_from("<I", raw, n - 4)
    computed = crc32c(raw[: n - 4])
    major, minor = VERSION.unpack_from(raw, VERSION_OFFSET)
    if major != MAJOR and stored == computed:
        raise FormatError.at(
            "unsupported_version",
            path,
            offset + VERSION_OFFSET,
            f"the {what} has format version {major}.{minor}, but this ringfeed reads version {MAJOR}.x only; "
            f"repack the dataset with this ringfeed (`ringfeed pack`) or use a ringfeed release that reads "
            f"version {major}",
        )
    if stored != computed:
        raise FormatError.checksum(path, offset + n - 4, what, stored, computed)


class ShardHeader(NamedTuple):
    """A decoded ShardHeader (``proto/shard.md``, "ShardHeader")."""

    minor: int
    record_align: int
    shard_number: int

    @property
    def data_offset(self) -> int:
        """Where the first record starts: ``align(64, record_align)``."""
        return align_up(SHARD_HEADER.size, self.record_align)

    @classmethod
    def decode(cls, path: str | os.PathLike[str], raw: bytes) -> ShardHeader:
        check_struct(path, 0, raw, "shard header", SHARD_MAGIC)
        _, _, minor, align, number, _, _ = SHARD_HEADER.unpack(raw)
        if align & (align - 1) or not MIN_RECORD_ALIGN <= align <= MAX_RECORD_ALIGN:
            raise FormatError.corrupt(
                path, 12, f"record_align {align} is not a power of two in {MIN_RECORD_ALIGN}..={MAX_RECORD_ALIGN}"
            )
        return cls(minor, align, number)


class ShardFooter(NamedTuple):
    """A decoded ShardFooter (``proto/shard.md``, "ShardFooter")."""

    minor: int
    record_count: int
    table_offset: int
    file_len: int
    table_crc: int
    body_crc: int

    @classmethod
    def decode(cls, path: str | os.PathLike[str], offset: int, raw: bytes, actual_len: int) -> ShardFooter:
        """Decodes the footer found at ``offset`` and checks it against the file's real length."""
        check_struct(path, offset, raw, "shard footer", SHARD_END_MAGIC)
        _, _, minor, count, table_offset, file_len, table_crc, body_crc, _, _ = SHARD_FOOTER.unpack(raw)
        if file_len != actual_len:
            raise FormatError.truncated(
                path, offset + 24, f"the footer records {file_len} bytes but the file has {actual_len}"
            )
        if align_up(table_offset + count * RECORD_ENTRY.size, 8) != offset:
            raise FormatError.corrupt(
                path,
                offset + 16,
                f"record table at {table_offset} with {count} entries does not end where the footer starts ({offset})",
            )
        return cls(minor, count, table_offset, file_len, table_crc, body_crc)


class IndexHeader(NamedTuple):
    """A decoded IndexHeader (``proto/shard.md``, "IndexHeader")."""

    minor: int
    flags: int
    sample_count: int
    shard_count: int
    class_count: int
    shards_offset: int
    classes_offset: int
    samples_offset: int
    heap_offset: int
    heap_len: int
    info_offset: int
    info_len: int

    @classmethod
    def decode(cls, path: str | os.PathLike[str], raw: bytes, body_end: int) -> IndexHeader:
        """Decodes the header and checks that every section lies inside ``128..body_end``."""
        check_struct(path, 0, raw, "index header", INDEX_MAGIC)
        _, _, *fields, _, _ = INDEX_HEADER.unpack(raw)
        h = cls(*fields)
        sections = (
            ("shard table", 32, h.shards_offset, h.shard_count * SHARD_ENTRY.size),
            ("class table", 40, h.classes_offset, h.class_count * CLASS_ENTRY.size),
            ("sample table", 48, h.samples_offset, h.sample_count * SAMPLE_ENTRY.size),
            ("heap", 56, h.heap_offset, h.heap_len),
            ("info", 72, h.info_offset, h.info_len),
        )
        # Python integers do not overflow, so `start + length` is exact: a length or an end that
        # overflows a u64 is simply far past `body_end`, and gets the same error as in Rust.
        for what, field_at, start, length in sections:
            if not (start >= INDEX_HEADER.size and start + length <= body_end):
                size = "an overflowing number of" if length >= 1 << 64 else str(length)
                raise FormatError.corrupt(
                    path,
                    field_at,
                    f"the {what} (offset {start}, {size} bytes) lies outside the index body (0..{body_end})",
                )
        return h


class IndexFooter(NamedTuple):
    """A decoded IndexFooter (``proto/shard.md``, "IndexFooter")."""

    minor: int
    body_crc: int
    file_len: int

    @classmethod
    def decode(cls, path: str | os.PathLike[str], offset: int, raw: bytes, actual_len: int) -> IndexFooter:
        check_struct(path, offset, raw, "index footer", INDEX_END_MAGIC)
        _, _, minor, body_crc, file_len, _, _ = INDEX_FOOTER.unpack(raw)
        if file_len != actual_len:
            raise FormatError.truncated(
                path, offset + 16, f"the footer records {file_len} bytes but the file has {actual_len}"
            )
        return cls(minor, body_crc, file_len)


def valid_shard_name(name: bytes) -> bool:
    """Whether ``name`` is a plain file name inside the dataset directory (ShardEntry ``name_len``)."""
    return 0 < len(name) <= MAX_SHARD_NAME and name not in (b".", b"..") and b"/" not in name and b"\0" not in name


def shard_file_name(n: int) -> str:
    """The shard file name ``ringfeed pack`` gives shard ``n``."""
    return f"shard-{n:06d}.{SHARD_EXT}"


def parse_json_object(raw: bytes) -> dict[str, Any] | None:
    """Parses a UTF-8 JSON object (sample metadata, the info), or returns ``None``.

    Follows what the Rust side (serde_json) accepts, so both implementations judge the same bytes
    alike: strict UTF-8 (no BOM), no ``NaN``/``Infinity``, no number that overflows a double, no
    lone surrogate escapes, no nesting 128 or more containers deep.
    """
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_float, parse_int=_int)
        if not isinstance(value, dict) or _depth(value) >= _MAX_DEPTH:
            return None
        # Lone surrogates (`"\ud800"`) parse in Python but are not valid Unicode text.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeError, ValueError, RecursionError):
        return None
    return value


# serde_json's recursion limit: it refuses 128 nested arrays/objects (the outer object included).
_MAX_DEPTH = 128


def _depth(value: Any) -> int:
    """How many containers deep ``value`` nests (a flat object is 1)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _int(text: str) -> int:
    # serde_json reads an integer beyond 64 bits as a double, and refuses it if that overflows.
    if len(text) > 20:
        _float(text)
    return int(text)
