"""The token dataset format, version 1.1 (``proto/tokens.md`` is the normative text).

The single Python truth for the token file's layout, the counterpart of the Rust
``crates/format/src/tokens/``: magics, ``struct`` layouts, the layout arithmetic, an O(1) reader
(``TokenDataset``) and ``verify_tokens``, checked against ``proto/vectors/tokens/`` by
``tests/test_token_vectors.py``; 1.1's packing files (``packing-S.rfp``: ``Packing``,
``best_fit_decreasing``, checked by ``verify_tokens``). Shared conventions (``FormatError``, ``check_struct``, CRC-32C)
come from ``shard``, as in the spec, which defers to ``proto/shard.md`` for them.

Also reads Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) for tests and tools.
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
from .shard import FormatError, align_up, check_struct

__all__ = ["Packing", "TokenDataset", "best_fit_decreasing", "verify_tokens", "width_for_vocab"]

#: Minor version this implementation knows.
TOKENS_MINOR = 0
TOKENS_FILE = "tokens.rft"
TOKENS_MAGIC = b"RFTOKEN\0"
TOKENS_END_MAGIC = b"RFTOKEND"
#: Where the token array starts (one page).
TOKENS_OFFSET = 4096
NO_EOS = 0xFFFFFFFF
FLAG_PROMPTS = 1
#: Packing files (1.1): magic, the minor they appeared in, header size.
PACK_MAGIC = b"RFPACK\0\0"
PACK_MINOR = 1
#: PackHeader: magic, major, minor, seq_len, window_count, doc_count, token_count, cut_tokens,
#: docs_crc, tables_crc, reserved, header_crc.
PACK_HEADER = struct.Struct("<8sHHIQQQQIIII")
assert PACK_HEADER.size == 64

#: TokenHeader: magic, major, minor, token_width (u8), reserved[3], vocab_size, eos_id,
#: tokens_offset, reserved[28], header_crc.
TOKEN_HEADER = struct.Struct("<8sHHB3sIIQ28sI")
#: TokenFooter: magic, major, minor, flags, token_count, doc_count, docs_offset, prompts_offset,
#: chunks_offset, info_offset, info_len, file_len, chunk_bytes, chunk_count, docs_crc, prompts_crc,
#: chunks_crc, info_crc, reserved[20], footer_crc.
TOKEN_FOOTER = struct.Struct("<8sHHIQQQQQQQQIIIIII20sI")
assert TOKEN_HEADER.size == 64
assert TOKEN_FOOTER.size == 128

#: Megatron-Core's index magic and its dtype codes that hold token ids.
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES: dict[int, Any] = {1: np.uint8, 8: np.uint16, 4: np.int32}


def width_for_vocab(vocab_size: int) -> int:
    """2 bytes when every id of the vocabulary fits a uint16, else 4."""
    return 2 if vocab_size <= 1 << 16 else 4


class Layout(NamedTuple):
    tokens_end: int
    docs_offset: int
    prompts_offset: int
    prompts_end: int
    chunks_offset: int
    chunk_count: int
    info_offset: int
    footer_offset: int
    file_len: int


def layout(token_count: int, doc_count: int, width: int, prompts: bool, chunk_bytes: int, info_len: int) -> Layout:
    """Where each section lies, from the counts (``proto/tokens.md``, "Layout")."""
    token_bytes = token_count * width
    tokens_end = TOKENS_OFFSET + token_bytes
    docs_offset = align_up(tokens_end, 8)
    prompts_offset = docs_offset + 8 * (doc_count + 1)
    prompts_end = prompts_offset + (4 * doc_count if prompts else 0)
    chunks_offset = align_up(prompts_end, 8)
    chunk_count = -(-token_bytes // chunk_bytes)
    info_offset = align_up(chunks_offset + 4 * chunk_count, 8)
    footer_offset = align_up(info_offset + info_len, 8)
    return Layout(
        tokens_end,
        docs_offset,
        prompts_offset,
        prompts_end,
        chunks_offset,
        chunk_count,
        info_offset,
        footer_offset,
        footer_offset + TOKEN_FOOTER.size,
    )


def _map(path: str) -> Any:
    """The file mapped read-only (``b""`` when empty: an empty mapping is an error); an I/O
    failure as a ``FormatError`` naming the file."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if size else b""
    except OSError as e:
        raise FormatError("io", path, None, f"{path}: {e.strerror or e}") from e


class TokenDataset:
    """An open token dataset (``DATASET/tokens.rft``), read in O(1) at open.

    ``tokens`` is a numpy view of the mapped token array (``uint16`` or ``uint32``), no copy;
    ``doc_starts`` the mapped document table (``uint64``, ``doc_count + 1`` entries).
    """

    def __init__(self, path: str | os.PathLike[str], *, buffer: bytes | None = None) -> None:
        p = Path(path)
        self.path = str(p / TOKENS_FILE) if buffer is None and p.is_dir() else str(p)
        buf: Any = _map(self.path) if buffer is None else buffer
        self._buf = buf
        b = memoryview(buf)
        n = len(b)
        minimum = TOKENS_OFFSET + TOKEN_FOOTER.size
        if n < minimum:
            raise FormatError.truncated(self.path, n, f"a token file has at least {minimum} bytes, this one has {n}")
        at = n - TOKEN_FOOTER.size
        raw_footer = bytes(b[at:])
        check_struct(self.path, at, raw_footer, "token footer", TOKENS_END_MAGIC)
        f = TOKEN_FOOTER.unpack(raw_footer)
        (
            _,
            _,
            fminor,
            flags,
            token_count,
            doc_count,
            docs_off,
            prompts_off,
            chunks_off,
            info_off,
            info_len,
            file_len,
        ) = f[:12]
        chunk_bytes, chunk_count, docs_crc, prompts_crc, chunks_crc, info_crc, freserved, _ = f[12:]
        if file_len != n:
            raise FormatError.truncated(
                self.path, at + 72, f"the footer says the file has {file_len} bytes, it has {n}"
            )
        if fminor == 0 and flags & ~FLAG_PROMPTS:
            raise FormatError.corrupt(self.path, at + 12, f"unknown flags {flags:#x}")
        if (token_count == 0) != (doc_count == 0) or doc_count > token_count:
            raise FormatError.corrupt(
                self.path, at + 24, f"doc_count {doc_count} is inconsistent with token_count {token_count}"
            )
        if chunk_bytes < 4 or chunk_bytes & (chunk_bytes - 1):
            raise FormatError.corrupt(
                self.path, at + 80, f"chunk_bytes {chunk_bytes} is not a power of two of at least 4"
            )
        raw_header = bytes(b[: TOKEN_HEADER.size])
        check_struct(self.path, 0, raw_header, "token header", TOKENS_MAGIC)
        _, _, hminor, width, hres1, vocab_size, eos_id, tokens_offset, hres2, _ = TOKEN_HEADER.unpack(raw_header)
        if width not in (2, 4):
            raise FormatError.corrupt(self.path, 12, f"token_width {width} is not 2 or 4")
        if vocab_size == 0 or (width == 2 and vocab_size > 1 << 16):
            raise FormatError.corrupt(self.path, 16, f"vocab_size {vocab_size} does not fit token_width {width}")
        if eos_id != NO_EOS and eos_id >= vocab_size:
            raise FormatError.corrupt(self.path, 20, f"eos_id {eos_id} is not below vocab_size {vocab_size}")
        if tokens_offset != TOKENS_OFFSET:
            raise FormatError.corrupt(self.path, 24, f"tokens_offset {tokens_offset} is not {TOKENS_OFFSET}")
        prompts = bool(flags & FLAG_PROMPTS)
        lay = layout(token_count, doc_count, width, prompts, chunk_bytes, info_len)
        if lay.file_len != n:
            raise FormatError.corrupt(
                self.path,
                at + 16,
                f"{token_count} tokens of {width} bytes and {doc_count} documents do not fit a file of {n} bytes",
            )
        for off, got, want, name in (
            (32, docs_off, lay.docs_offset, "docs_offset"),
            (40, prompts_off, lay.prompts_offset, "prompts_offset"),
            (48, chunks_off, lay.chunks_offset, "chunks_offset"),
            (56, info_off, lay.info_offset, "info_offset"),
            (84, chunk_count, lay.chunk_count, "chunk_count"),
        ):
            if got != want:
                raise FormatError.corrupt(self.path, at + off, f"{name} is {got}, the layout puts it at {want}")
        self.header_minor, self.footer_minor = hminor, fminor
        self.width, self.vocab_size = width, vocab_size
        self.eos_id: int | None = None if eos_id == NO_EOS else eos_id
        self.token_count, self.doc_count = token_count, doc_count
        self.has_prompts = prompts
        self.chunk_bytes = chunk_bytes
        self.layout = lay
        self.info_len = info_len
        self.crcs = {"docs": docs_crc, "prompts": prompts_crc, "chunks": chunks_crc, "info": info_crc}
        self._reserved = (hres1, hres2, freserved)
        dtype = np.uint16 if width == 2 else np.uint32
        self.tokens = np.frombuffer(
            buf, dtype=np.dtype(dtype).newbyteorder("<"), count=token_count, offset=TOKENS_OFFSET
        )
        self.doc_starts = np.frombuffer(buf, dtype="<u8", count=doc_count + 1, offset=lay.docs_offset)
        self.prompt_lens = (
            np.frombuffer(buf, dtype="<u4", count=doc_count, offset=lay.prompts_offset)
            if prompts
            else np.zeros(doc_count, dtype="<u4")
        )

    def doc(self, d: int) -> np.ndarray:
        """Document ``d``'s tokens (a view)."""
        if not 0 <= d < self.doc_count:
            raise IndexError(f"document {d} is out of range: {self.path} has {self.doc_count}")
        s, e = int(self.doc_starts[d]), int(self.doc_starts[d + 1])
        return self.tokens[s:e]

    def info(self) -> dict[str, Any]:
        b = bytes(memoryview(self._buf)[self.layout.info_offset : self.layout.info_offset + self.info_len])
        return json.loads(b.decode())


def packing_name(seq_len: int) -> str:
    """``packing-S.rfp``."""
    return f"packing-{seq_len}.rfp"


def best_fit_decreasing(lens: list[int], cap: int) -> tuple[list[int], list[int]]:
    """Best-fit decreasing (``proto/control.md``, "Token streams"): documents longest first (ties:
    lower index), each into the window with the least room that fits it (ties: the lower window),
    else a new one. Returns ``bin_starts`` and ``bins`` as a packing file stores them."""
    import bisect

    order = sorted(range(len(lens)), key=lambda d: (-lens[d], d))
    bins: list[list[int]] = []
    rooms: list[tuple[int, int]] = []  # (room, window), sorted
    for d in order:
        at = bisect.bisect_left(rooms, (lens[d], -1))
        if at < len(rooms):
            room, b = rooms.pop(at)
        else:
            bins.append([])
            room, b = cap, len(bins) - 1
        bins[b].append(d)
        bisect.insort(rooms, (room - lens[d], b))
    starts = [0]
    for b in bins:
        starts.append(starts[-1] + len(b))
    return starts, [d for b in bins for d in b]


class Packing:
    """A packing file (1.1) of ``ds`` for ``seq_len``, checked in O(1) against its dataset
    (``proto/tokens.md``, "Reading a packing"); ``bin_starts`` and ``bins`` are mapped views."""

    def __init__(self, ds: TokenDataset, seq_len: int) -> None:
        self.path = str(Path(ds.path).parent / packing_name(seq_len))
        raw = _map(self.path)
        n = len(raw)
        if n < PACK_HEADER.size:
            raise FormatError.truncated(
                self.path, n, f"a packing file has at least {PACK_HEADER.size} bytes, this one has {n}"
            )
        head = raw[: PACK_HEADER.size]
        check_struct(self.path, 0, head, "packing header", PACK_MAGIC)
        _, _, minor, s, windows, docs, tokens, cut, docs_crc, tables_crc, reserved, _ = PACK_HEADER.unpack(head)
        if minor == PACK_MINOR and reserved:
            raise FormatError.corrupt(self.path, 56, "non-zero reserved packing header bytes")
        if s != seq_len:
            raise FormatError.corrupt(self.path, 12, f"the packing is for seq_len {s}, its name says {seq_len}")
        if windows == 0:
            raise FormatError.corrupt(self.path, 16, "window_count is 0")
        want = PACK_HEADER.size + 8 * (windows + 1) + 8 * docs
        if want != n:
            raise FormatError.truncated(
                self.path, 16, f"{windows} windows and {docs} documents need {want} bytes, the file has {n}"
            )
        for at, got, mine, what in (
            (24, docs, ds.doc_count, "doc_count"),
            (32, tokens, ds.token_count, "token_count"),
            (48, docs_crc, ds.crcs["docs"], "docs_crc"),
        ):
            if got != mine:
                raise FormatError.corrupt(
                    self.path, at, f"{what} is {got} but {ds.path} has {mine}: the packing belongs to another dataset"
                )
        self.seq_len, self.window_count, self.doc_count, self.cut_tokens = s, windows, docs, cut
        self.tables_crc = tables_crc
        self._raw = raw
        self.bin_starts = np.frombuffer(raw, dtype="<u8", count=windows + 1, offset=PACK_HEADER.size)
        self.bins = np.frombuffer(raw, dtype="<u8", count=docs, offset=PACK_HEADER.size + 8 * (windows + 1))

    def window(self, w: int) -> list[int]:
        """The documents of window ``w``, in placement order."""
        return [int(d) for d in self.bins[int(self.bin_starts[w]) : int(self.bin_starts[w + 1])]]


def packings(path: str | os.PathLike[str]) -> list[int]:
    """The seq_lens a dataset directory has packing files for, ascending (1.1)."""
    d = Path(path)
    d = d if d.is_dir() else d.parent
    out = []
    for f in d.glob("packing-*.rfp"):
        mid = f.name[len("packing-") : -len(".rfp")]
        if not mid.isdigit() or str(int(mid)) != mid:
            raise FormatError.corrupt(str(f), 0, "a packing file's name must be packing-S.rfp with S a decimal seq_len")
        out.append(int(mid))
    return sorted(out)


def _verify_packing(ds: TokenDataset, seq_len: int, starts: list[int]) -> None:
    p = Packing(ds, seq_len)
    _crc(p.path, 52, bytes(p._raw[PACK_HEADER.size :]), p.tables_crc, "packing tables")
    w, d = p.window_count, p.doc_count
    prev = 0
    for i, v in enumerate(int(x) for x in p.bin_starts):
        ok = v == 0 if i == 0 else (v == d and v > prev) if i == w else prev < v < d
        if not ok:
            raise FormatError.corrupt(
                p.path,
                PACK_HEADER.size + 8 * i,
                f"bin_starts[{i}] = {v} breaks the window table (after {prev}; {d} documents)",
            )
        prev = v
    cap = seq_len + 1
    lens = [starts[k + 1] - starts[k] for k in range(ds.doc_count)]
    want_starts, want_bins = best_fit_decreasing([min(n, cap) for n in lens], cap)
    if len(want_starts) != w + 1:
        raise FormatError.corrupt(
            p.path, 16, f"window_count is {w}, best-fit decreasing makes {len(want_starts) - 1} windows"
        )
    stored = [int(x) for x in p.bin_starts] + [int(x) for x in p.bins]
    for i, (got, want) in enumerate(zip(stored, want_starts + want_bins, strict=True)):
        if got != want:
            raise FormatError.corrupt(
                p.path,
                PACK_HEADER.size + 8 * i,
                f"the table differs from best-fit decreasing at entry {i} (stored {got}, computed {want})",
            )
    cut = sum(max(0, n - cap) for n in lens)
    if cut != p.cut_tokens:
        raise FormatError.corrupt(p.path, 40, f"cut_tokens is {p.cut_tokens}, the documents give {cut}")


def _zero(path: str, b: memoryview, start: int, end: int, what: str) -> None:
    seg = bytes(b[start:end])
    stripped = seg.lstrip(b"\0")
    if stripped:
        raise FormatError.corrupt(path, start + len(seg) - len(stripped), f"non-zero {what}")


def _crc(path: str, at: int, data: bytes, stored: int, what: str) -> None:
    computed = crc32c(data)
    if computed != stored:
        raise FormatError.checksum(path, at, what, stored, computed)


def verify_tokens(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Verifies every byte of a token dataset in ``proto/tokens.md``'s order; raises the first
    ``FormatError``. Pure Python CRCs: meant for small files and the vectors."""
    ds = TokenDataset(path)
    p, lay, b = ds.path, ds.layout, memoryview(ds._buf)
    footer_at = lay.footer_offset
    if ds.header_minor == 0:
        _zero(p, b, 13, 16, "reserved header bytes")
        _zero(p, b, 32, 60, "reserved header bytes")
        _zero(p, b, 64, TOKENS_OFFSET, "padding after the header")
    if ds.footer_minor == 0:
        _zero(p, b, footer_at + 104, footer_at + 124, "reserved footer bytes")
    _crc(p, footer_at + 88, bytes(b[lay.docs_offset : lay.prompts_offset]), ds.crcs["docs"], "document table")
    starts = [int(x) for x in ds.doc_starts]
    prev = 0
    for d, v in enumerate(starts):
        if d == 0:
            ok = v == 0
        elif d == ds.doc_count:
            ok = v == ds.token_count and v > prev
        else:
            ok = prev < v < ds.token_count
        if not ok:
            raise FormatError.corrupt(
                p,
                lay.docs_offset + 8 * d,
                f"doc_starts[{d}] = {v} breaks the document table (after {prev}; {ds.token_count} tokens)",
            )
        prev = v
    _crc(p, footer_at + 92, bytes(b[lay.prompts_offset : lay.prompts_end]), ds.crcs["prompts"], "prompt lengths")
    if ds.has_prompts:
        for d in range(ds.doc_count):
            pl, n = int(ds.prompt_lens[d]), starts[d + 1] - starts[d]
            if pl >= n:
                raise FormatError.corrupt(
                    p,
                    lay.prompts_offset + 4 * d,
                    f"document {d} has {n} tokens and a prompt of {pl}: no token would carry loss",
                )
    chunks_end = lay.chunks_offset + 4 * lay.chunk_count
    table = bytes(b[lay.chunks_offset : chunks_end])
    _crc(p, footer_at + 96, table, ds.crcs["chunks"], "chunk CRC table")
    for c in range(lay.chunk_count):
        start = TOKENS_OFFSET + c * ds.chunk_bytes
        end = min(start + ds.chunk_bytes, lay.tokens_end)
        (stored,) = struct.unpack_from("<I", table, 4 * c)
        _crc(p, start, bytes(b[start:end]), stored, f"token chunk {c}")
    bad = np.nonzero(ds.tokens >= ds.vocab_size)[0]
    if len(bad):
        t = int(bad[0])
        raise FormatError.corrupt(
            p, TOKENS_OFFSET + t * ds.width, f"token {t} is {int(ds.tokens[t])}, not below vocab_size {ds.vocab_size}"
        )
    if ds.eos_id is not None:
        for d in range(ds.doc_count):
            last = starts[d + 1] - 1
            if int(ds.tokens[last]) != ds.eos_id:
                raise FormatError.corrupt(
                    p,
                    TOKENS_OFFSET + last * ds.width,
                    f"document {d} ends with token {int(ds.tokens[last])}, not the EOS {ds.eos_id}",
                )
    _zero(p, b, lay.tokens_end, lay.docs_offset, "padding after the tokens")
    _zero(p, b, lay.prompts_end, lay.chunks_offset, "padding after the prompt lengths")
    _zero(p, b, chunks_end, lay.info_offset, "padding after the chunk CRC table")
    info_end = lay.info_offset + ds.info_len
    _zero(p, b, info_end, lay.footer_offset, "padding after the info")
    info = bytes(b[lay.info_offset : info_end])
    _crc(p, footer_at + 100, info, ds.crcs["info"], "info")
    try:
        obj = json.loads(info.decode())
    except (UnicodeDecodeError, ValueError):
        obj = None
    if not isinstance(obj, dict):
        raise FormatError.corrupt(p, lay.info_offset, "the info is not a JSON object")
    seq_lens = packings(Path(ds.path).parent)
    for s in seq_lens:
        _verify_packing(ds, s, starts)
    return {
        "tokens": ds.token_count,
        "documents": ds.doc_count,
        "width": ds.width,
        "chunks": lay.chunk_count,
        "packings": seq_lens,
    }


class MegatronDataset:
    """A Megatron-LM indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), mapped with numpy."""

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        base = os.fspath(prefix)
        for ext in (".bin", ".idx"):
            if base.endswith(ext):
                base = base[: -len(ext)]
        raw = Path(base + ".idx").read_bytes()
        if raw[:9] != MEGATRON_MAGIC:
            raise FormatError.at("bad_magic", base + ".idx", 0, "not a Megatron index")
        (version,) = struct.unpack_from("<Q", raw, 9)
        code = raw[17]
        seqs, docs = struct.unpack_from("<QQ", raw, 18)
        if version != 1 or code not in MEGATRON_DTYPES:
            raise FormatError.corrupt(base + ".idx", 9, f"version {version}, dtype code {code}")
        off = 34
        self.sequence_lengths = np.frombuffer(raw, dtype="<i4", count=seqs, offset=off)
        off += 4 * seqs
        self.sequence_pointers = np.frombuffer(raw, dtype="<i8", count=seqs, offset=off)
        off += 8 * seqs
        self.document_indices = np.frombuffer(raw, dtype="<i8", count=docs, offset=off)
        self.tokens = np.memmap(base + ".bin", dtype=MEGATRON_DTYPES[code], mode="r")
        self.doc_count = docs - 1
