"""CRC-32C (Castagnoli), the checksum used everywhere in the packed dataset format.

Polynomial 0x1EDC6F41, reflected (0x82F63B78), initial value and final XOR 0xFFFFFFFF: the iSCSI
CRC. ``crc32c(b"123456789") == 0xE3069283`` pins all of that (``proto/shard.md``, "Conventions").

This is a pure-Python, table-driven implementation (one table lookup per byte), so the package has
no runtime dependencies. It runs at a few MB/s: fine for the fixed structures checked at open, for
the vectors and tests, and for ``PackedDataset.sample(i, check_crc=True)`` on a few samples, but
slow for ``verify`` on a large dataset, where ``ringfeed verify`` (Rust, hardware CRC) is the tool.
"""

from __future__ import annotations

__all__ = ["crc32c"]

_POLY_REFLECTED = 0x82F63B78


def _make_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY_REFLECTED if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _make_table()


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """Returns the CRC-32C of ``data``.

    ``value`` is the CRC of the bytes before ``data``, so a long range can be checksummed in
    pieces: ``crc32c(b, crc32c(a)) == crc32c(a + b)``.
    """
    if isinstance(data, bytes):
        return _update(data, value ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
    # Iterating `bytes` is about twice as fast as iterating a memoryview, so other buffers (an
    # mmap slice, say) are copied in bounded chunks, and the view is released before returning.
    crc = value ^ 0xFFFFFFFF
    with memoryview(data) as view, view.cast("B") as octets:
        for start in range(0, len(octets), _CHUNK):
            crc = _update(octets[start : start + _CHUNK].tobytes(), crc)
    return crc ^ 0xFFFFFFFF


_CHUNK = 1 << 16


def _update(data: bytes, crc: int) -> int:
    """Runs the register ``crc`` (already XORed with the initial value) over ``data``."""
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


assert crc32c(b"123456789") == 0xE3069283, "CRC-32C check value"
