"""`ringfeed pack` driven from Python: real LMDBs written by the `lmdb` package and real images
written by Pillow go in, and the Python reader of the packed format reads back what went in."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
from pathlib import Path

import lmdb
import msgpack
import pytest
from _support import ringfeed_bin
from PIL import Image

import ringfeed


def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([ringfeed_bin(), *args], capture_output=True, text=True, timeout=120)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def jpeg(w: int, h: int, seed: int, mode: str = "RGB") -> bytes:
    img = Image.new("RGB", (w, h), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    for x in range(0, w, 4):
        img.putpixel((x, x % h), (255, 255, 255))
    buf = io.BytesIO()
    img.convert(mode).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png(w: int, h: int, mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (w, h)).save(buf, "PNG")
    return buf.getvalue()


def write_lmdb(path: Path, items: dict[bytes, bytes], subdir: bool = True) -> None:
    env = lmdb.open(str(path), map_size=1 << 26, subdir=subdir)
    with env.begin(write=True) as txn:
        for k, v in items.items():
            txn.put(k, v)
    env.close()


def read_back(out: Path) -> list[tuple[bytes, int, bytes]]:
    with ringfeed.PackedDataset(out) as ds:
        return [(s.key, s.label, bytes(s.data)) for s in (ds.sample(i, check_crc=True) for i in range(len(ds)))]


def test_lmdb_raw_with_labels_key(tmp_path: Path) -> None:
    """An LMDB of raw JPEG values with a JSON label table under `__labels__` packs to the same bytes and labels."""
    images = {f"{i:04d}".encode(): jpeg(16 + i, 12, i) for i in range(6)}
    labels = {k.decode(): i % 3 for i, k in enumerate(images)}
    write_lmdb(tmp_path / "db", {**images, b"__labels__": json.dumps(labels).encode()})
    run(
        "pack",
        str(tmp_path / "db"),
        str(tmp_path / "out"),
        "--labels-key",
        "__labels__",
        "--progress",
        "none",
        "--no-restarts",
    )
    got = read_back(tmp_path / "out")
    assert got == [(k, labels[k.decode()], v) for k, v in sorted(images.items())]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_lmdb_pickle_records(tmp_path: Path, protocol: int) -> None:
    """Pickled (image bytes, label) tuples, protocols 2-5, pack to the same bytes and labels."""
    images = {f"img{i}".encode(): (jpeg(20, 20, i), 10 + i) for i in range(4)}
    write_lmdb(tmp_path / "db", {k: pickle.dumps(v, protocol=protocol) for k, v in images.items()})
    run("pack", str(tmp_path / "db"), str(tmp_path / "out"), "--progress", "none", "--no-restarts")
    assert read_back(tmp_path / "out") == [(k, v[1], v[0]) for k, v in sorted(images.items())]


def test_lmdb_msgpack_single_file(tmp_path: Path) -> None:
    """msgpack maps in a single-file LMDB (subdir=False) pack to the same bytes and labels."""
    images = {f"k{i}".encode(): {"image": jpeg(10, 30, i), "label": i} for i in range(3)}
    path = tmp_path / "db.lmdb"
    write_lmdb(path, {k: msgpack.packb(v) for k, v in images.items()}, subdir=False)
    run("pack", str(path), str(tmp_path / "out"), "--progress", "none", "--no-restarts")
    assert read_back(tmp_path / "out") == [(k, v["label"], v["image"]) for k, v in sorted(images.items())]


def test_lmdb_inspect_in_place(tmp_path: Path) -> None:
    """`inspect` reads an LMDB in place and reports its layout, count and first sample."""
    write_lmdb(tmp_path / "db", {b"a": pickle.dumps((jpeg(33, 22, 1), 4), protocol=4)})
    info = json.loads(run("inspect", str(tmp_path / "db"), "--json").stdout)
    assert info["samples"] == 1
    assert "pickle" in info["kind"]
    assert info["sample"]["label"] == 4
    assert info["sample"]["image"].startswith("jpeg 33x22")


def test_lmdb_numpy_labels_are_refused_with_the_fix(tmp_path: Path) -> None:
    """A pickle whose label is a numpy scalar is refused, naming the opcode and what to do instead."""
    np = pytest.importorskip("numpy")
    write_lmdb(tmp_path / "db", {b"a": pickle.dumps((jpeg(8, 8, 1), np.int64(3)), protocol=4)})
    r = run("pack", str(tmp_path / "db"), str(tmp_path / "out"), "--progress", "none", ok=False)
    assert r.returncode == 1
    assert "GLOBAL" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_folder_of_odd_images(tmp_path: Path) -> None:
    """CMYK, grayscale, 16-bit, palette and alpha images written by Pillow are all packed: the PNGs
    byte for byte; the JPEGs rewritten with restart markers, and Pillow (an independent decoder of
    the same library) decodes the stored file to exactly the original's pixels."""
    files = {
        "a/cmyk.jpg": jpeg(24, 16, 1, "CMYK"),
        "a/gray.jpg": jpeg(24, 16, 2, "L"),
        "a/progressive.jpg": progressive_jpeg(61, 37),
        "b/deep.png": png(9, 7, "I;16"),
        "b/palette.png": png(9, 7, "P"),
        "c/alpha.png": png(9, 7, "RGBA"),
    }
    for rel, data in files.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    r = run("pack", str(tmp_path / "src"), str(tmp_path / "out"), "--progress", "none")
    assert "3 JPEGs rewritten losslessly with restart markers" in r.stdout, r.stdout
    got = read_back(tmp_path / "out")
    expect = sorted((rel.encode(), "abc".index(rel[0]), data) for rel, data in files.items())
    assert [(k, label) for k, label, _ in got] == [(k, label) for k, label, _ in expect]
    for (key, _, stored), (_, _, original) in zip(got, expect, strict=True):
        if key.endswith(b".png"):
            assert stored == original, key
            continue
        assert stored != original, key
        assert b"\xff\xdd" in stored, key  # a DRI segment: restart markers
        a, b = Image.open(io.BytesIO(original)), Image.open(io.BytesIO(stored))
        assert (a.mode, a.size) == (b.mode, b.size), key
        assert a.tobytes() == b.tobytes(), f"{key}: Pillow decodes other pixels"
    run("verify", "--decode", str(tmp_path / "out"), "--progress", "none")
    ringfeed.verify(tmp_path / "out")


def progressive_jpeg(w: int, h: int) -> bytes:
    img = Image.new("RGB", (w, h))
    img.putdata([((x * 7) % 256, (y * 11) % 256, (x * y) % 256) for y in range(h) for x in range(w)])
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=88, progressive=True)
    return buf.getvalue()


def test_python_and_rust_agree_on_damage(tmp_path: Path) -> None:
    """A flipped record byte is reported by both verifiers, as a checksum error in the same shard."""
    src = tmp_path / "src" / "x"
    src.mkdir(parents=True)
    (src / "1.jpg").write_bytes(jpeg(32, 32, 5))
    out = tmp_path / "out"
    run("pack", str(tmp_path / "src"), str(out), "--progress", "none")
    shard = out / "shard-000000.rfs"
    b = bytearray(shard.read_bytes())
    b[4096 + 100] ^= 0x04
    shard.write_bytes(bytes(b))
    r = run("verify", str(out), "--progress", "none", ok=False)
    assert r.returncode == 1
    assert "checksum" in r.stderr, r.stderr
    assert "shard-000000.rfs at byte 4096" in r.stderr, r.stderr
    with pytest.raises(ringfeed.FormatError) as e:
        ringfeed.verify(out)
    assert e.value.kind == "checksum"
