"""The shared vectors in ``proto/vectors/shard/``, read by the Python side of the packed format.

The Rust writer produced them (``crates/ringfeed/tests/it/vectors.rs``); here the Python reader must read
them back exactly, and each damage case in ``cases.json`` must make ``verify`` report its pinned
error kind first, as the Rust verifier does.
"""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

import ringfeed
from ringfeed import FormatError, PackedDataset, verify
from ringfeed.formats import shard as layout
from ringfeed.formats.crc32c import crc32c

VECTORS = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "shard"
BASIC = VECTORS / "v1-basic"
CASES: list[dict[str, Any]] = json.loads((VECTORS / "cases.json").read_text())
EXPECTED: dict[str, Any] = json.loads((VECTORS / "expected.json").read_text())


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A scratch copy of ``v1-basic`` that a test may damage."""
    dst = tmp_path / "ds"
    shutil.copytree(BASIC, dst)
    return dst


def apply(dataset: Path, case: dict[str, Any]) -> None:
    """Applies one damage case, exactly as ``apply`` in ``crates/ringfeed/tests/it/vectors.rs`` does."""
    file = dataset / case["file"]
    b = bytearray(file.read_bytes())
    op = case["op"]
    if op == "xor":
        b[case["offset"]] ^= case["value"]
    elif op == "truncate":
        del b[case["length"] :]
    elif op == "set_u16_fix_crc":
        # Write a u16 and recompute the CRC of the structure it belongs to.
        struct.pack_into("<H", b, case["offset"], case["value"])
        start, end = case["crc_start"], case["crc_end"]
        struct.pack_into("<I", b, end, crc32c(bytes(b[start:end])))
    elif op == "patch_refresh_crcs":
        # Damage behind valid checksums, so verify's later steps must find it.
        patch = bytes.fromhex(case["bytes"])
        b[case["offset"] : case["offset"] + len(patch)] = patch
        file.write_bytes(bytes(b))
        refresh_checksums(dataset)
        return
    else:
        raise AssertionError(f"unknown op {op!r} in cases.json")
    file.write_bytes(bytes(b))


def refresh_checksums(dataset: Path) -> None:
    """Recomputes every CRC of an undamaged-in-structure copy, so a test reaches verify's later steps.

    Shards first (header, record table, body, footer), then each shard's entry in the index, then
    the index (header, body, footer). Record CRCs are left alone.
    """
    index = bytearray((dataset / "index.rfi").read_bytes())
    shard_count, shards_offset = struct.unpack_from("<I", index, 24)[0], struct.unpack_from("<Q", index, 32)[0]
    heap_offset = struct.unpack_from("<Q", index, 56)[0]
    for n in range(shard_count):
        entry_at = shards_offset + n * layout.SHARD_ENTRY.size
        name_offset, name_len = struct.unpack_from("<QI", index, entry_at)
        path = dataset / index[heap_offset + name_offset : heap_offset + name_offset + name_len].decode()
        b = bytearray(path.read_bytes())
        footer_at = len(b) - layout.SHARD_FOOTER.size
        struct.pack_into("<I", b, 60, crc32c(bytes(b[:60])))
        count, table_offset = struct.unpack_from("<IQ", b, footer_at + 12)
        struct.pack_into("<I", b, footer_at + 32, crc32c(bytes(b[table_offset : table_offset + 16 * count])))
        body_crc = crc32c(bytes(b[:footer_at]))
        struct.pack_into("<I", b, footer_at + 36, body_crc)
        struct.pack_into("<I", b, footer_at + 60, crc32c(bytes(b[footer_at : footer_at + 60])))
        path.write_bytes(bytes(b))
        struct.pack_into("<I", index, entry_at + 24, body_crc)
    footer_at = len(index) - layout.INDEX_FOOTER.size
    struct.pack_into("<I", index, 124, crc32c(bytes(index[:124])))
    struct.pack_into("<I", index, footer_at + 12, crc32c(bytes(index[:footer_at])))
    struct.pack_into("<I", index, footer_at + 28, crc32c(bytes(index[footer_at : footer_at + 28])))
    (dataset / "index.rfi").write_bytes(bytes(index))


def test_struct_sizes_match_the_spec() -> None:
    """Every structure's struct.Struct has the size the spec's tables give it."""
    sizes = {
        "SHARD_HEADER": 64,
        "SHARD_FOOTER": 64,
        "RECORD_ENTRY": 16,
        "INDEX_HEADER": 128,
        "INDEX_FOOTER": 32,
        "SHARD_ENTRY": 32,
        "CLASS_ENTRY": 16,
        "SAMPLE_ENTRY": 32,
    }
    structs = {name: getattr(layout, name) for name in sizes}
    assert {name: s.size for name, s in structs.items()} == sizes
    assert all(s.format.startswith("<") for s in structs.values()), "little-endian, no padding"


def test_vector_reads_back_exactly() -> None:
    """Reading v1-basic yields exactly the classes and samples expected.json describes."""
    with PackedDataset(BASIC) as ds:
        assert ds.classes == [bytes.fromhex(c) for c in EXPECTED["classes"]]
        assert len(ds) == len(EXPECTED["samples"])
        assert ds.info["format"] == "ringfeed-packed"
        for i, e in enumerate(EXPECTED["samples"]):
            s = ds.sample(i, check_crc=True)
            assert s.index == i
            assert s.key == bytes.fromhex(e["key"]), f"sample {i}"
            assert s.label == e["label"], f"sample {i}"
            assert s.meta == (json.loads(e["meta"]) if e["meta"] else None), f"sample {i}"
            assert ds._locate(i).meta == e["meta"].encode(), f"sample {i}: metadata bytes"
            assert s.data.tobytes() == bytes.fromhex(e["data"]), f"sample {i}"


def test_clean_vector_verifies() -> None:
    """verify accepts the undamaged vector and reports what it covered."""
    report = verify(BASIC)
    assert report == {
        "samples": len(EXPECTED["samples"]),
        "shards": 2,
        "classes": len(EXPECTED["classes"]),
        "bytes": sum(f.stat().st_size for f in BASIC.iterdir()),
    }


def test_cases_are_present() -> None:
    """cases.json holds the damage cases, each naming a spec error kind."""
    assert len(CASES) >= 10
    assert {c["kind"] for c in CASES} <= set(layout.KINDS)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_damage_case_reports_its_pinned_kind(copy: Path, case: dict[str, Any]) -> None:
    """Each damage case makes verify raise FormatError with the kind, file and offset cases.json pins."""
    apply(copy, case)
    with pytest.raises(FormatError) as info:
        verify(copy)
    err = info.value
    assert err.kind == case["kind"], str(err)
    assert err.path == str(copy / case["error_file"]), str(err)
    assert err.offset == case["error_offset"], str(err)
    assert str(err).startswith(err.path), str(err)
    if err.offset is not None:
        assert f" at byte {err.offset}: " in str(err)


def test_out_of_range_index_raises_index_error() -> None:
    """sample(i) outside 0..len raises IndexError naming the index and the sample count."""
    with PackedDataset(BASIC) as ds:
        n = len(ds)
        for i in (n, n + 1, -1):
            with pytest.raises(IndexError, match=rf"^sample {i} is out of range: .* has {n} samples$"):
                ds.sample(i)


def test_errors_name_file_and_offset(copy: Path) -> None:
    """A FormatError carries kind, path and offset, and its message is lowercase and names both."""
    shard = copy / "shard-000000.rfs"
    apply(copy, {"file": shard.name, "op": "xor", "offset": 0, "value": 1})
    with pytest.raises(FormatError) as info:
        PackedDataset(copy)
    err = info.value
    assert (err.kind, err.path, err.offset) == ("bad_magic", str(shard), 0)
    prefix = f"{shard} at byte 0: "
    assert str(err).startswith(prefix)
    assert str(err)[len(prefix)].islower()
    assert 'expected b"RFSHARD\\x00", found b"SFSHARD\\x00"' in str(err)


def test_format_error_pickles() -> None:
    """A FormatError survives pickling (worker processes send errors to the parent) with its fields."""
    err = FormatError.corrupt("/d/index.rfi", 12, "flags are non-zero")
    back = pickle.loads(pickle.dumps(err))
    assert (back.kind, back.path, back.offset, str(back)) == (err.kind, err.path, err.offset, str(err))


def test_unsupported_major_names_both_versions(copy: Path) -> None:
    """A major version 2 index with a valid CRC is refused as unsupported_version, naming 2.0 and 1.x."""
    apply(copy, {"file": "index.rfi", "op": "set_u16_fix_crc", "offset": 8, "value": 2, "crc_start": 0, "crc_end": 124})
    with pytest.raises(FormatError) as info:
        PackedDataset(copy)
    assert info.value.kind == "unsupported_version"
    assert "version 2.0" in str(info.value)
    assert "reads version 1.x" in str(info.value)


def test_damaged_version_field_is_a_checksum_error(copy: Path) -> None:
    """A major version changed without fixing the CRC is damage (checksum), not a foreign version."""
    apply(copy, {"file": "index.rfi", "op": "xor", "offset": 8, "value": 2})
    with pytest.raises(FormatError) as info:
        PackedDataset(copy)
    assert info.value.kind == "checksum"


def test_newer_minor_is_read(copy: Path) -> None:
    """An index of a newer minor version (1.1) opens and reads like 1.0."""
    apply(
        copy, {"file": "index.rfi", "op": "set_u16_fix_crc", "offset": 10, "value": 1, "crc_start": 0, "crc_end": 124}
    )
    with PackedDataset(copy) as ds:
        assert ds.version == (1, 1)
        assert ds.sample(0, check_crc=True).data.tobytes() == bytes.fromhex(EXPECTED["samples"][0]["data"])


def test_open_does_not_read_the_sample_table(copy: Path) -> None:
    """Open ignores the sample table (O(shards)); a bad sample entry is found when that sample is read."""
    with PackedDataset(BASIC) as ds:
        entry = ds._header.samples_offset
    apply(copy, {"file": "index.rfi", "op": "xor", "offset": entry + 24, "value": 0x40})  # shard 0 -> 64
    with PackedDataset(copy) as ds:
        assert len(ds) == len(EXPECTED["samples"])
        assert ds.sample(1).key == bytes.fromhex(EXPECTED["samples"][1]["key"])
        with pytest.raises(FormatError, match="refers to shard 64 but there are 2 shards") as info:
            ds.sample(0)
        assert (info.value.kind, info.value.offset) == ("corrupt", entry + 24)


def test_check_crc_catches_a_flipped_record_byte(copy: Path) -> None:
    """sample(i) hands out a damaged record unchecked by default, and check_crc=True refuses it."""
    with PackedDataset(BASIC) as ds:
        at = ds._locate(0).offset
    apply(copy, {"file": "shard-000000.rfs", "op": "xor", "offset": at, "value": 0x80})
    with PackedDataset(copy) as ds:
        assert len(ds.sample(0).data) == len(bytes.fromhex(EXPECTED["samples"][0]["data"]))
        with pytest.raises(FormatError, match=r"record 0 .*checksum mismatch") as info:
            ds.sample(0, check_crc=True)
        assert (info.value.kind, info.value.offset) == ("checksum", at)


def test_data_is_a_zero_copy_view_that_outlives_close() -> None:
    """Sample.data is a read-only view of the mapped shard and stays valid after close()."""
    ds = PackedDataset(BASIC)
    data = ds.sample(2).data
    assert isinstance(data, memoryview)
    assert data.readonly
    assert type(data.obj).__name__ == "mmap"
    ds.close()
    assert ds.closed
    assert data.tobytes() == bytes.fromhex(EXPECTED["samples"][2]["data"])
    with pytest.raises(ValueError, match="is closed"):
        ds.sample(0)
    ds.close()  # idempotent


def test_dataset_pickles_by_path() -> None:
    """A pickled PackedDataset (as sent to a worker process) reopens the same dataset."""
    with PackedDataset(BASIC) as ds, pickle.loads(pickle.dumps(ds)) as back:
        assert (back.path, len(back), back.classes) == (ds.path, len(ds), ds.classes)
        assert back.sample(4).data.tobytes() == ds.sample(4).data.tobytes()


def test_missing_dataset_is_an_io_error(tmp_path: Path) -> None:
    """A directory without index.rfi, or no directory at all, is an io error on the directory that says what to do:
    pack that directory (as the source) into a sibling NAME.rf, and open that."""
    with pytest.raises(FormatError, match=r"is not a packed ringfeed dataset: it has no index\.rfi") as a:
        PackedDataset(tmp_path)
    hint = f"pack them with `ringfeed pack {tmp_path} {tmp_path}.rf` and open {tmp_path}.rf)"
    assert str(a.value).endswith(hint), str(a.value)
    with pytest.raises(FormatError, match="no such directory") as b:
        PackedDataset(tmp_path / "nope")
    assert (a.value.kind, a.value.path, a.value.offset) == ("io", str(tmp_path), None)
    assert (b.value.kind, b.value.path) == ("io", str(tmp_path / "nope"))


def test_missing_shard_is_an_io_error(copy: Path) -> None:
    """A shard file named in the index but absent is an io error naming that file."""
    (copy / "shard-000001.rfs").unlink()
    with pytest.raises(FormatError) as info:
        verify(copy)
    assert (info.value.kind, info.value.path) == ("io", str(copy / "shard-000001.rfs"))


def test_version_is_exported() -> None:
    """The package exports its version and the public API."""
    assert ringfeed.__version__ == "0.1.0"
    assert {"FormatError", "PackedDataset", "Sample", "verify"} <= set(ringfeed.__all__)
