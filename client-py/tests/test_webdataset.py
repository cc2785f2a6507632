"""WebDataset tar shards served in place by the real ``ringfeed serve`` (control.md, "WebDataset
shards"; docs/webdataset.md).

The tars hold the same images as an image folder, in the folder's order, in WebDataset's layout
(written by Python's ``tarfile`` and by the ``webdataset`` package's own ``TarWriter``): served
in place they must give the folder's labels and pixels, batch for batch. Malformed tars follow
``on_error``, naming the tar, the member and the key.
"""

from __future__ import annotations

import gc
import io
import json
import os
import struct
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset
from _fleet import Server
from _order import rank_split, shard_blocks
from PIL import Image

import ringfeed
from ringfeed import ServerError

N = 30
CLASSES = ["ant", "bee", "cat"]


def image_bytes(i: int) -> tuple[str, bytes]:
    rng = np.random.default_rng(i)
    pixels = rng.integers(0, 256, (26 + i % 5, 30 + i % 7, 3), dtype=np.uint8)
    buf = io.BytesIO()
    ext = "png" if i % 7 == 0 else "jpg"
    Image.fromarray(pixels).save(buf, "PNG" if ext == "png" else "JPEG", quality=90)
    return ext, buf.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An image folder, and the same samples as WebDataset tars: 3 shards by tarfile (`cls` and
    `json` labels; one long path for a pax header), 2 by webdataset.TarWriter."""
    root = tmp_path_factory.mktemp("wds")
    folder = root / "folder"
    samples = []  # (key, ext, bytes, label) in the folder's order: classes, then file names
    for i in range(N):
        ext, b = image_bytes(i)
        label = i % 3
        stem = f"{i:03d}" if i != 5 else "x" * 120 + "005"
        p = folder / CLASSES[label] / f"{stem}.{ext}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b)
        samples.append((f"{CLASSES[label]}/{stem}", ext, b, label))
    samples.sort(key=lambda s: (s[3], s[0].encode()))
    tars = root / "tars"
    tars.mkdir()
    for s in range(3):
        with tarfile.open(tars / f"shard-{s:06d}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for key, ext, b, label in samples[s * 10 : (s + 1) * 10]:
                add(tar, f"{key}.{ext}", b)
                add(tar, f"{key}.cls", f"{label}\n".encode())
                add(tar, f"{key}.json", json.dumps({"target": label, "caption": key}).encode())
    writer_dir = root / "writer"
    writer_dir.mkdir()
    for s in range(2):
        with webdataset.TarWriter(str(writer_dir / f"part-{s}.tar")) as sink:
            for key, ext, b, label in samples[s * 15 : (s + 1) * 15]:
                sink.write({"__key__": key, ext: b, "cls": label})
    return {"root": root, "folder": folder, "tars": tars, "writer": writer_dir}


def epoch(path: Path | str | ringfeed.WebDataset, sock: str, **kw: object) -> list[tuple[torch.Tensor, ...]]:
    """Every batch of epoch 1: (index, label, image) clones."""
    opts: dict[str, object] = {
        "seed": 3,
        "shuffle": True,
        "fields": ["index"],
        "drop_last": False,
        "server": ringfeed.Server(socket=sock, spawn=True),
    }
    opts.update(kw)
    with ringfeed.Loader(path, 4, ringfeed.RandomResizedCrop(20) + ringfeed.Flip(), **opts) as loader:
        loader.set_epoch(1)
        return [(b["index"].clone(), b["label"].clone(), b["image"].clone()) for b in loader]


def same(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            assert torch.equal(u, v)


@pytest.mark.parametrize("shuffle", [False, True])
def test_tars_serve_the_image_folders_labels_and_pixels(data: dict[str, Path], sock: str, shuffle: bool) -> None:
    """Tars written with tarfile in WebDataset's layout give the image folder's batches: indices, labels, pixels."""
    same(epoch(data["tars"], sock, shuffle=shuffle), epoch(data["folder"], sock, shuffle=shuffle))


def test_the_webdataset_packages_tars_and_its_own_reading_agree(data: dict[str, Path], sock: str) -> None:
    """Tars from webdataset.TarWriter serve the folder's batches, and the labels webdataset reads in its order."""
    got = epoch(data["writer"], sock, shuffle=False)
    same(got, epoch(data["folder"], sock, shuffle=False))
    urls = [str(p) for p in sorted(data["writer"].glob("*.tar"))]
    with warnings.catch_warnings():
        # webdataset 1.0.2 leaves its shard files for the garbage collector to close.
        warnings.simplefilter("ignore", ResourceWarning)
        theirs = [int(s["cls"]) for s in webdataset.WebDataset(urls, shardshuffle=False)]
        gc.collect()
    assert torch.cat([b[1] for b in got]).tolist() == theirs


def test_json_labels_patterns_and_globs(data: dict[str, Path], sock: str) -> None:
    """A json label with label_key, a brace pattern and a glob all serve what the directory does."""
    want = epoch(data["folder"], sock)
    same(epoch(ringfeed.WebDataset(data["tars"], label="json", label_key="target"), sock), want)
    same(epoch(f"{data['tars']}/shard-{{000000..000002}}.tar", sock), want)
    same(epoch(f"{data['tars']}/shard-*.tar", sock), want)
    first = epoch(data["tars"] / "shard-000000.tar", sock, shuffle=False)
    assert torch.cat([b[1] for b in first]).tolist() == [0] * 10


def test_one_tar_is_one_shard_of_the_shard_blocks_order(data: dict[str, Path], sock: str) -> None:
    """order="shard_blocks" over tars is the reference order with one shard per tar, each sample once over ranks."""
    perm = shard_blocks([15, 15], 1, 3, 1)
    seen = []
    for rank in range(2):
        got = epoch(data["writer"], sock, order=ringfeed.ShardBlocks(block=1), rank=rank, world_size=2)
        mine = torch.cat([b[0] for b in got]).tolist()
        assert mine == rank_split(perm, 2, rank, drop_last=False)
        seen += mine
    assert sorted(seen) == list(range(N))


def copy_tars(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in sorted(src.glob("*.tar")):
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def fresh(path: Path | ringfeed.WebDataset, **kw: object) -> list[tuple[torch.Tensor, ...]]:
    """`epoch` on a server of its own, so the tars are opened anew (a server reuses an open source)."""
    with Server(threads=1) as server:
        return epoch(path, str(server.sock), server=ringfeed.Server(socket=str(server.sock), spawn=False), **kw)


def test_index_files_are_written_reused_and_rebuilt_when_they_do_not_match(
    data: dict[str, Path], tmp_path: Path
) -> None:
    """The first open writes TAR.rfidx; a later open uses it; a tampered or stale one is rebuilt, same batches."""
    tars = copy_tars(data["tars"], tmp_path / "t")
    want = fresh(data["folder"])
    same(fresh(tars), want)
    index = tars / "shard-000001.tar.rfidx"
    assert sorted(p.name for p in tars.glob("*.rfidx")) == [f"shard-00000{s}.tar.rfidx" for s in range(3)]
    written = index.read_bytes()
    os.utime(index, ns=(1, 1))
    same(fresh(tars), want)
    assert index.stat().st_mtime_ns == 1, "a valid index is read, not rewritten"
    index.write_bytes(written[:40] + bytes(len(written) - 40))  # tampered
    same(fresh(tars), want)
    assert index.read_bytes() == written, "a tampered index is rebuilt"
    tar = tars / "shard-000001.tar"
    os.utime(tar, ns=(2_000_000_000, 2_000_000_000))  # the tar changed since: the index is stale
    same(fresh(tars), want)
    assert index.read_bytes() != written
    no_write = copy_tars(data["tars"], tmp_path / "n")
    same(fresh(ringfeed.WebDataset(no_write, write_index=False)), want)
    assert not list(no_write.glob("*.rfidx"))


def malformed(tmp_path: Path, kind: str) -> Path:
    """Two tars of 4 samples each; the second one damaged as `kind` says."""
    d = tmp_path / kind
    d.mkdir()
    for s in range(2):
        with tarfile.open(d / f"s{s}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for j in range(4):
                key = f"k{s}{j}"
                _, b = image_bytes(j)
                bad = s == 1 and j == 2
                if not (bad and kind == "no_image"):
                    add(tar, f"{key}.jpg", b)
                if not (bad and kind == "no_label"):
                    add(tar, f"{key}.cls", b"seven" if bad and kind == "bad_cls" else str(j).encode())
    if kind == "truncated":
        t = d / "s1.tar"
        t.write_bytes(t.read_bytes()[: 512 * 9])  # inside the second sample's image
    if kind == "not_tar":
        (d / "s1.tar").write_bytes(b"this is not a tar file\n" * 100)
    return d


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("no_image", "no image member"),
        ("no_label", "no label member `.cls`"),
        ("bad_cls", "is not an integer"),
    ],
)
def test_a_bad_sample_follows_on_error_naming_tar_and_key(tmp_path: Path, sock: str, kind: str, message: str) -> None:
    """A key without an image or label, or with a non-integer cls, fails naming tar and key, or is skipped."""
    d = malformed(tmp_path, kind)
    with pytest.raises(ServerError) as e:
        epoch(d, sock, shuffle=False)
    assert e.value.code == "sample"
    assert message in str(e.value)
    assert "s1.tar" in str(e.value)
    assert "k12" in str(e.value)
    with ringfeed.Loader(
        d,
        4,
        ringfeed.Resize((8, 8)),
        server=ringfeed.Server(socket=sock, spawn=True),
        shuffle=False,
        on_error="skip",
        drop_last=False,
    ) as loader:
        labels = [b[1].tolist() for b in loader]
        assert loader.stats(server=False)["skipped"] == 1
    assert labels == [[0, 1, 2, 3], [0, 1, 3]]


@pytest.mark.parametrize(("kind", "message"), [("truncated", "cut short"), ("not_tar", "not a tar file")])
def test_a_bad_tar_refuses_the_open_or_serves_what_it_can(tmp_path: Path, sock: str, kind: str, message: str) -> None:
    """A truncated or non-tar file refuses the open under raise, naming it; under skip what can be read is served."""
    d = malformed(tmp_path, kind)
    with pytest.raises(ServerError) as e:
        epoch(d, sock)
    assert e.value.code == "dataset"
    assert message in str(e.value)
    assert "s1.tar" in str(e.value)
    with ringfeed.Loader(
        d,
        1,
        ringfeed.Resize((8, 8)),
        server=ringfeed.Server(socket=sock, spawn=True),
        shuffle=False,
        on_error="skip",
        drop_last=False,
    ) as loader:
        labels = [b[1].tolist() for b in loader]
        skipped = loader.stats(server=False)["skipped"]
    if kind == "truncated":
        # s1's first sample is whole; its second is cut inside its image (skipped and counted).
        assert (labels, skipped) == ([[0], [1], [2], [3], [0]], 1)
    else:
        assert (labels, skipped) == ([[0], [1], [2], [3]], 0)


def test_a_pattern_that_matches_nothing_names_itself(tmp_path: Path, sock: str) -> None:
    """A brace or glob pattern without matches is a `dataset` error naming the pattern."""
    with pytest.raises(ServerError, match="matches no file") as e:
        epoch(f"{tmp_path}/none-*.tar", sock)
    assert e.value.code == "dataset"


VECTORS = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "webdataset"


def parse_index(b: bytes) -> dict[str, object]:
    """An index file read by the layout of proto/webdataset.md 1.1, independently of the Rust reader."""
    from ringfeed.formats.crc32c import crc32c

    assert b[:8] == b"RFWDSIDX"
    assert struct.unpack_from("<I", b, len(b) - 4)[0] == crc32c(b[:-4])
    major, minor, etag_len, length, mtime, count = struct.unpack_from("<HHIQqQ", b, 8)
    end_kind, _cut, detail_len, _stop = struct.unpack_from("<BBxxIQ", b, 40)
    pos = 56 + detail_len
    members = []
    for _ in range(count):
        offset, size, n = struct.unpack_from("<QQI", b, pos)
        pos += 20
        members.append({"name": b[pos : pos + n].decode(), "offset": offset, "size": size})
        pos += n
    etag = b[pos : pos + etag_len].decode()
    assert pos + etag_len == len(b) - 4, "nothing else between the members and the CRC"
    return {
        "version": (major, minor),
        "len": length,
        "mtime_ns": mtime,
        "etag": etag,
        "end": {0: "complete", 1: "truncated", 2: "bad header"}[end_kind],
        "members": members,
    }


def test_index_file_vectors_read_as_the_spec_says() -> None:
    """The shared index vectors (written by the Rust side) read back, by this independent parser, to what
    expected.json pins, and their member offsets are where Python's tarfile finds each member's data."""
    want = json.loads((VECTORS / "expected.json").read_text())
    with tarfile.open(VECTORS / want["tar"]) as t:
        offsets = [{"name": m.name, "offset": m.offset_data, "size": m.size} for m in t.getmembers()]
    assert offsets == want["members"]
    local = parse_index((VECTORS / want["files"]["local"]).read_bytes())
    stored = parse_index((VECTORS / want["files"]["store"]).read_bytes())
    for got, etag in ((local, ""), (stored, want["etag"])):
        assert got["version"] == (1, 1)
        assert (got["len"], got["mtime_ns"], got["end"]) == (want["len"], want["mtime_ns"], want["end"])
        assert got["members"] == want["members"]
        assert got["etag"] == etag
    assert want["len"] == (VECTORS / want["tar"]).stat().st_size
