"""Memory-mapped, O(1) random access to a packed dataset (``proto/shard.md``, "Reading rules").

``PackedDataset(path)`` maps the index and every shard read-only and checks each file's fixed
structures (magic, version, CRCs, lengths, section bounds), exactly the spec's "Open" rules. That
costs O(shards + classes): the sample table is not read at open, so a million-sample dataset opens
in milliseconds and in constant memory.

``PackedDataset.sample(i)`` then reads one sample entry and one record entry, bounds-checks both,
and hands out the record as a zero-copy ``memoryview`` of the mapped shard. The record's CRC is
checked on request (``check_crc=True``; slow, see ``crc32c``); ``ringfeed.verify`` checks the rest.

Lifetime: a ``Sample.data`` view keeps its shard's mapping alive. ``close()`` unmaps every file no
view still refers to; the others are unmapped when their last view is released, so a view never
dangles. Like any mmap reader, touching a view of a file that another process truncated raises
SIGBUS; a packed dataset is immutable once ``ringfeed pack`` has renamed it into place.
"""

from __future__ import annotations

import contextlib
import mmap
import operator
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .crc32c import crc32c
from .shard import (
    CLASS_ENTRY,
    INDEX_FILE,
    INDEX_FOOTER,
    INDEX_HEADER,
    MAJOR,
    MIN_INDEX_LEN,
    MIN_SHARD_LEN,
    RECORD_ENTRY,
    SAMPLE_ENTRY,
    SHARD_ENTRY,
    SHARD_FOOTER,
    SHARD_HEADER,
    FormatError,
    IndexFooter,
    IndexHeader,
    ShardFooter,
    ShardHeader,
    escape,
    parse_json_object,
    valid_shard_name,
)

__all__ = ["PackedDataset", "Sample"]

# Since 3.13 an mmap need not keep a duplicate of the file descriptor open; without this a
# dataset of N shards holds N descriptors for as long as it is open.
_MMAP_OPTIONS: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) and os.name == "posix" else {}


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of a packed dataset."""

    #: Position of the sample in the dataset.
    index: int
    #: The source's key: the original path or LMDB key, bytes exactly as stored.
    key: bytes
    #: The label; -1 when the sample has none. With classes, ``classes[label]`` names it.
    label: int
    #: Extra manifest columns (a JSON object), or ``None`` when the sample has none.
    meta: dict[str, Any] | None
    #: The record's encoded bytes (JPEG, PNG, ...), a read-only zero-copy view of the mapped shard.
    data: memoryview


class _Located(NamedTuple):
    """A sample entry resolved to its record, every bound checked ("Get sample" steps 1-2)."""

    sample: int
    entry_at: int
    label: int
    key: bytes
    meta: bytes
    shard: int
    record: int
    offset: int
    length: int
    crc: int


def _map(path: Path, check_len: Callable[[int], None]) -> mmap.mmap:
    """Maps ``path`` read-only after ``check_len(size)`` accepted its size (an empty file cannot be mapped)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_len(size)
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ, **_MMAP_OPTIONS)
    except OSError as e:
        raise FormatError("io", path, None, f"{path}: {e.strerror or e}") from e


def _unmap(m: mmap.mmap) -> None:
    # BufferError: a Sample.data view still refers to the mapping, which is unmapped when the last
    # view is released (the view holds a reference to the mmap object).
    with contextlib.suppress(BufferError):
        m.close()


class _Shard:
    """One mapped shard file whose header and footer were checked against its index entry."""

    __slots__ = ("footer", "header", "map", "path")

    def __init__(self, path: Path, number: int, entry: tuple[int, ...]) -> None:
        _, _, entry_records, entry_len, entry_body_crc, _ = entry

        def check_len(size: int) -> None:
            if size < entry_len:
                raise FormatError.truncated(path, size, f"the index expects {entry_len} bytes, the file has {size}")
            if size > entry_len:
                raise FormatError.corrupt(
                    path, entry_len, f"the index expects {entry_len} bytes, the file has {size}: bytes were appended"
                )
            if size < MIN_SHARD_LEN:
                raise FormatError.truncated(
                    path, size, f"a shard is at least {MIN_SHARD_LEN} bytes, this file has {size}"
                )

        self.path = path
        self.map = _map(path, check_len)
        try:
            size = len(self.map)
            footer_at = size - SHARD_FOOTER.size
            self.footer = ShardFooter.decode(path, footer_at, self.map[footer_at:], size)
            self.header = ShardHeader.decode(path, self.map[: SHARD_HEADER.size])
            if self.header.shard_number != number:
                raise FormatError.corrupt(
                    path,
                    16,
                    f"the header says shard {self.header.shard_number} but the index lists it as shard {number}",
                )
            if self.footer.table_offset < self.header.data_offset:
                raise FormatError.corrupt(
                    path,
                    footer_at + 16,
                    f"record table offset {self.footer.table_offset} is before the first record "
                    f"({self.header.data_offset})",
                )
            f = self.footer
            if (entry_records, entry_len, entry_body_crc) != (f.record_count, f.file_len, f.body_crc):
                raise FormatError.corrupt(
                    path,
                    footer_at,
                    f"this shard does not belong to the index: the index expects {entry_records} records, "
                    f"{entry_len} bytes, body crc {entry_body_crc:#010x}; the file has {f.record_count} records, "
                    f"{f.file_len} bytes, body crc {f.body_crc:#010x}",
                )
        except BaseException:
            _unmap(self.map)
            raise

    def record(self, r: int) -> tuple[int, int, int]:
        """Record entry ``r`` as ``(offset, length, crc)``, bounds-checked against the data region."""
        f = self.footer
        if r >= f.record_count:
            raise FormatError.corrupt(
                self.path, f.table_offset, f"record {r} is past the last record ({f.record_count} records)"
            )
        at = f.table_offset + r * RECORD_ENTRY.size
        # In bounds: the footer check proved the table ends before the footer.
        offset, length, crc = RECORD_ENTRY.unpack_from(self.map, at)
        data_offset = self.header.data_offset
        if not (offset >= data_offset and length > 0 and offset + length <= f.table_offset):
            raise FormatError.corrupt(
                self.path,
                at,
                f"record {r} ({length} bytes at offset {offset}) is outside the data region "
                f"{data_offset}..{f.table_offset}",
            )
        return offset, length, crc


class PackedDataset:
    """A packed dataset directory written by ``ringfeed pack``, open for random access.

    Opening checks every file's fixed structures (``proto/shard.md``, "Reading rules", "Open") and
    raises ``FormatError`` on the first problem; it does not read the per-sample table, so it costs
    O(shards + classes). Use it as a context manager, or call ``close()``.

    Args:
        path: the dataset directory (the one holding ``index.rfi``).

    Raises:
        FormatError: the dataset is missing, unreadable, or its structure is damaged.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._dir = Path(path)
        self._index_path = self._dir / INDEX_FILE
        self._shards: list[_Shard] = []
        self._info: dict[str, Any] | None = None
        self._closed = False
        self._index = self._open_index()
        try:
            self._open_rest()
        except BaseException:
            self.close()
            raise

    def _open_index(self) -> mmap.mmap:
        path = self._index_path

        def check_len(size: int) -> None:
            if size < MIN_INDEX_LEN:
                detail = f"an index is at least {MIN_INDEX_LEN} bytes, this file has {size}"
                raise FormatError.truncated(path, size, detail)

        try:
            return _map(path, check_len)
        except FormatError as e:
            if not isinstance(e.__cause__, FileNotFoundError):
                raise
            # Worded like the Rust `ShardError::NotADataset`; the path is the directory.
            if self._dir.is_dir():
                packed = self._dir.with_name(self._dir.name + ".rf") if self._dir.name else "OUT"
                message = (
                    f"{self._dir} is not a packed ringfeed dataset: it has no {INDEX_FILE} (if it holds images, "
                    f"pack them with `ringfeed pack {self._dir} {packed}` and open {packed})"
                )
            else:
                message = f"no dataset at {self._dir}: no such directory"
            raise FormatError("io", self._dir, None, message) from e.__cause__

    def _open_rest(self) -> None:
        path, index = self._index_path, self._index
        size = len(index)
        footer_at = size - INDEX_FOOTER.size
        self._footer = IndexFooter.decode(path, footer_at, index[footer_at:], size)
        self._header = h = IndexHeader.decode(path, index[: INDEX_HEADER.size], footer_at)
        for n in range(h.shard_count):
            at = h.shards_offset + n * SHARD_ENTRY.size
            entry = SHARD_ENTRY.unpack_from(index, at)
            name = self._heap(entry[0], entry[1], at, "shard name")
            if not valid_shard_name(name):
                raise FormatError.corrupt(path, at, f'shard {n} has an invalid file name "{escape(name)}"')
            # The spec allows any bytes here, but the Rust reader refuses a name that is not UTF-8
            # (`pack` writes ASCII names), and both must report the same kind for the same damage.
            try:
                file_name = name.decode("utf-8")
            except UnicodeDecodeError:
                raise FormatError.corrupt(path, at, f"shard {n} has a non-UTF-8 file name") from None
            self._shards.append(_Shard(self._dir / file_name, n, entry))
        # O(classes), and after this a class name cannot fail.
        self._classes = tuple(self._class_name(c) for c in range(h.class_count))

    # -- public API -----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The dataset directory."""
        return self._dir

    @property
    def version(self) -> tuple[int, int]:
        """Format version of the index, ``(major, minor)``."""
        return MAJOR, self._header.minor

    @property
    def classes(self) -> list[bytes]:
        """Class names, bytes exactly as stored; class ``c`` is the class of label ``c``.

        Empty when labels are plain integers.
        """
        return list(self._classes)

    @property
    def info(self) -> dict[str, Any]:
        """The info JSON object ``ringfeed pack`` wrote: how the dataset was made.

        Raises:
            FormatError: (``corrupt``) the info section is not a UTF-8 JSON object.
        """
        if self._info is None:
            self._check_open()
            self._info = self._parse_info()
        return self._info

    def __len__(self) -> int:
        """Number of samples."""
        return self._header.sample_count

    def sample(self, i: int, check_crc: bool = False) -> Sample:
        """Sample ``i``, in O(1).

        Args:
            i: sample index, ``0 <= i < len(self)`` (negative indices are not accepted).
            check_crc: also check the record's CRC-32C. Off by default: it is pure Python and
                reads the whole record (``ringfeed.verify`` checks every record).

        Returns:
            The sample; ``data`` is a zero-copy view of the mapped shard that stays valid after
            ``close()``.

        Raises:
            IndexError: ``i`` is out of range.
            FormatError: the sample's entries point outside their files (``corrupt``), its metadata
                is not a JSON object (``corrupt``), or its CRC does not match (``checksum``).
            ValueError: the dataset is closed.
        """
        s = self._locate(i)
        shard = self._shards[s.shard]
        data = memoryview(shard.map)[s.offset : s.offset + s.length]
        if check_crc:
            computed = crc32c(data)
            if computed != s.crc:
                data.release()
                what = f'record {s.record} (sample {s.sample}, key "{escape(s.key)}")'
                raise FormatError.checksum(shard.path, s.offset, what, s.crc, computed)
        meta = None
        if s.meta:
            meta = parse_json_object(s.meta)
            if meta is None:
                data.release()
                raise FormatError.corrupt(
                    self._index_path,
                    s.entry_at + 20,
                    f"sample {s.sample} has metadata that is not a UTF-8 JSON object",
                )
        return Sample(s.sample, s.key, s.label, meta, data)

    def close(self) -> None:
        """Unmaps the files. Idempotent.

        A file that a ``Sample.data`` view still refers to stays mapped until its last view is
        released; every other method raises ``ValueError`` afterwards.
        """
        if self._closed:
            return
        self._closed = True
        for shard in self._shards:
            _unmap(shard.map)
        _unmap(self._index)
        self._shards = []

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self) -> PackedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Mappings cannot be pickled; a copy sent to a worker process reopens the dataset by path.
        return (type(self), (self._dir,))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} samples, {len(self._shards)} shards"
        return f"PackedDataset({os.fspath(self._dir)!r}, {state})"

    # -- internals shared with `verify` ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the packed dataset {self._dir} is closed")

    def _heap(self, offset: int, length: int, entry_at: int, what: str) -> bytes:
        """``length`` heap bytes at heap-relative ``offset``; ``entry_at`` locates the referring entry."""
        h = self._header
        if offset + length > h.heap_len:
            raise FormatError.corrupt(
                self._index_path,
                entry_at,
                f"{what} ({length} bytes at heap offset {offset}) is outside the heap ({h.heap_len} bytes)",
            )
        start = h.heap_offset + offset
        return self._index[start : start + length]

    def _parse_info(self) -> dict[str, Any]:
        h = self._header
        raw = self._index[h.info_offset : h.info_offset + h.info_len]
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError.corrupt(self._index_path, h.info_offset, "info is not UTF-8") from None
        info = parse_json_object(raw)
        if info is None:
            raise FormatError.corrupt(self._index_path, h.info_offset, "the info section is not a JSON object")
        return info

    def _class_name(self, c: int) -> bytes:
        at = self._header.classes_offset + c * CLASS_ENTRY.size
        name_offset, name_len, _ = CLASS_ENTRY.unpack_from(self._index, at)
        return self._heap(name_offset, name_len, at, "class name")

    def _locate(self, i: int) -> _Located:
        """Sample ``i`` resolved to its record, with the spec's "Get sample" steps 1-2."""
        self._check_open()
        i = operator.index(i)
        n = self._header.sample_count
        if not 0 <= i < n:
            raise IndexError(f"sample {i} is out of range: {self._dir} has {n} samples")
        path = self._index_path
        at = self._header.samples_offset + i * SAMPLE_ENTRY.size
        label, heap_offset, key_len, meta_len, shard_no, record_no = SAMPLE_ENTRY.unpack_from(self._index, at)
        kv = self._heap(heap_offset, key_len + meta_len, at + 8, "sample key")
        if shard_no >= len(self._shards):
            raise FormatError.corrupt(
                path, at + 24, f"sample {i} refers to shard {shard_no} but there are {len(self._shards)} shards"
            )
        shard = self._shards[shard_no]
        count = shard.footer.record_count
        if record_no >= count:
            raise FormatError.corrupt(
                path, at + 28, f"sample {i} refers to record {record_no} of {shard.path}, which has {count} records"
            )
        offset, length, crc = shard.record(record_no)
        return _Located(i, at, label, kv[:key_len], kv[key_len:], shard_no, record_no, offset, length, crc)
