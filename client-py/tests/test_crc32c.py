"""The pure-Python CRC-32C that the packed format uses everywhere."""

from __future__ import annotations

import pytest

from ringfeed.formats.crc32c import crc32c


def test_check_value() -> None:
    """crc32c(b"123456789") is the spec's check value 0xE3069283 (Castagnoli, reflected, iSCSI)."""
    assert crc32c(b"123456789") == 0xE3069283


def test_empty_input() -> None:
    """The CRC of no bytes is 0 (initial value and final XOR cancel)."""
    assert crc32c(b"") == 0


@pytest.mark.parametrize("split", [0, 1, 4096, 65536, 65537, 100_000])
def test_continuation_and_buffer_types_agree(split: int) -> None:
    """crc32c(b, crc32c(a)) == crc32c(a + b), and bytes, bytearray and memoryview give the same CRC."""
    data = bytes((i * 7919 + (i >> 8)) & 0xFF for i in range(100_000))
    whole = crc32c(data)
    assert crc32c(data[split:], crc32c(data[:split])) == whole
    assert crc32c(bytearray(data)) == whole
    assert crc32c(memoryview(data)) == whole
