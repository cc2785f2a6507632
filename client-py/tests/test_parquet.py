"""Parquet datasets served in place (protocol 1.9; control.md, "Parquet datasets (1.9)";
docs/parquet.md), end to end against the real server: inputs written by pyarrow (a binary image
column, and Hugging Face's `{bytes, path}` struct) and by the `datasets` library (an `Image()`
feature, `to_parquet`), compared sample by sample (label, caption, decoded pixels) with an
ImageFolder of the same pictures; ranks, resume, and the listing and per-row failures under
`raise` and `skip`."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from _support import frame_vector, record_sent, ringfeed_bin
from PIL import Image

import ringfeed
from ringfeed import ServerError

N = 24
CLASSES = 3
ROW_GROUP = 5


def jpeg(i: int) -> bytes:
    rng = np.random.default_rng(100 + i)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (20 + i % 3, 26, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def caption(i: int) -> str:
    return ["", "a cat", "café au lait 日本語", "emoji 🐱"][i % 4] + f" #{i}"


def label(i: int) -> int:
    return i % CLASSES


def table(rows: range, image: str) -> pa.Table:
    """Rows `rows` with the image as binary or as the HF struct, a label (int64), a caption and a
    struct of metadata."""
    if image == "binary":
        images = pa.array([jpeg(i) for i in rows], pa.binary())
    else:
        images = pa.array(
            [{"bytes": jpeg(i), "path": f"{i:03d}.jpg"} for i in rows],
            pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
        )
    return pa.table(
        {
            "image": images,
            "label": pa.array([label(i) for i in rows], pa.int64()),
            "caption": pa.array([caption(i) for i in rows], pa.string()),
            "likes": pa.array([7 * i for i in rows], pa.int64()),
            "meta": pa.array(
                [{"width": 100 + i, "score": i / 4} for i in rows],
                pa.struct([("width", pa.int32()), ("score", pa.float64())]),
            ),
        }
    )


def write_two_files(root: Path, image: str) -> Path:
    """Two files of 12 rows, row groups of 5 (so 3 per file, the last one short)."""
    root.mkdir(parents=True, exist_ok=True)
    half = N // 2
    pq.write_table(table(range(half), image), root / "train-00000-of-00002.parquet", row_group_size=ROW_GROUP)
    pq.write_table(table(range(half, N), image), root / "train-00001-of-00002.parquet", row_group_size=ROW_GROUP)
    assert pq.ParquetFile(root / "train-00000-of-00002.parquet").num_row_groups == 3
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same pictures as an ImageFolder, as pyarrow Parquet (binary and struct images) and as a
    `datasets` Parquet export."""
    base = tmp_path_factory.mktemp("pq")
    folder = base / "folder"
    for i in range(N):
        d = folder / f"class{label(i)}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:03d}.jpg").write_bytes(jpeg(i))
    out = {
        "folder": folder,
        "binary": write_two_files(base / "binary", "binary"),
        "struct": write_two_files(base / "struct", "struct"),
    }
    try:
        import datasets
    except ImportError:  # pragma: no cover - scripts/bootstrap installs it
        return out
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(num_classes=CLASSES),
            "caption": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": jpeg(i), "path": None} for i in range(N)],
            "label": [label(i) for i in range(N)],
            "caption": [caption(i) for i in range(N)],
        },
        features=features,
    )
    (base / "hf").mkdir()
    ds.to_parquet(str(base / "hf" / "train.parquet"), batch_size=ROW_GROUP)
    out["hf"] = base / "hf"
    # 1.10: the same rows saved with save_to_disk (Arrow IPC streams, one record batch per file here),
    # in two files: the image column's bytes cast to Image(), as users build one.
    saved = datasets.Dataset.from_dict(
        {
            "image": [jpeg(i) for i in range(N)],
            "label": [label(i) for i in range(N)],
            "caption": [caption(i) for i in range(N)],
        }
    ).cast_column("image", datasets.Image())
    saved.save_to_disk(str(base / "saved"), num_shards=2)
    assert sorted(p.name for p in (base / "saved").glob("*.arrow")) == [
        "data-00000-of-00002.arrow",
        "data-00001-of-00002.arrow",
    ]
    out["saved"] = base / "saved"
    return out


def loader(path: Any, sock: str, **kw: Any) -> ringfeed.Loader:
    opts: dict[str, Any] = {
        "shuffle": False,
        "fields": ["index"],
        "drop_last": False,
        "server": ringfeed.Server(socket=sock, spawn=True),
    }
    opts.update(kw)
    return ringfeed.Loader(path, 4, ringfeed.Resize((16, 16)), **opts)


def samples(batches: list[Any]) -> dict[int, dict[str, Any]]:
    """Each delivered sample by its index (a sample delivered twice fails)."""
    out: dict[int, dict[str, Any]] = {}
    for b in batches:
        for p, i in enumerate(b["index"].tolist()):
            assert i not in out, f"sample {i} delivered twice"
            out[i] = {k: (v[p] if isinstance(v, list) else v[p].clone()) for k, v in b.items() if k != "index"}
    return out


def folder_pixels(data: dict[str, Path], sock: str) -> dict[int, torch.Tensor]:
    """The ImageFolder's decoded pixels, by the picture's number (its file name)."""
    names = sorted((f"class{label(i)}", f"{i:03d}.jpg", i) for i in range(N))
    with loader(str(data["folder"]), sock) as ld:
        got = samples(list(ld))
    assert sorted(got) == list(range(N))
    for j, (_, _, i) in enumerate(names):
        assert got[j]["label"].item() == label(i), "the ImageFolder's labels are its class order"
    return {i: got[j]["image"] for j, (_, _, i) in enumerate(names)}


@pytest.mark.parametrize("kind", ["binary", "struct", "hf", "saved"])
def test_rows_equal_an_image_folder_of_the_same_pictures(data: dict[str, Path], sock: str, kind: str) -> None:
    """Every row: its label, caption and decoded pixels equal the ImageFolder's sample of the same picture."""
    if kind not in data:
        pytest.skip("the datasets library is not installed (scripts/bootstrap installs it)")
    want = folder_pixels(data, sock)
    with loader(ringfeed.Parquet(data[kind]), sock, text=ringfeed.Text("caption", max_bytes=64)) as ld:
        assert len(ld) == N // 4
        got = samples(list(ld))
    assert sorted(got) == list(range(N))
    for i in range(N):
        assert got[i]["label"].item() == label(i)
        assert got[i]["text"] == caption(i)
        assert torch.equal(got[i]["image"], want[i]), f"row {i}: pixels differ from the ImageFolder's"


def test_a_bare_path_is_served_with_the_default_columns(data: dict[str, Path], sock: str) -> None:
    """A directory of .parquet files, and one .parquet file, work as any dataset path."""
    with loader(str(data["struct"]), sock) as ld:
        assert sorted(samples(list(ld))) == list(range(N))
    one = data["binary"] / "train-00001-of-00002.parquet"
    with loader(str(one), sock) as ld:
        got = samples(list(ld))
    assert sorted(got) == list(range(N // 2))
    assert [got[k]["label"].item() for k in range(N // 2)] == [label(N // 2 + k) for k in range(N // 2)]


def test_struct_members_and_columns_as_metadata(data: dict[str, Path], sock: str) -> None:
    """`COLUMN:KEY` reads a member of a struct column; a bare name a top-level column."""
    meta = [ringfeed.Meta("meta", {"width": "int32", "score": "float32"}), ringfeed.Meta(None, {"likes": "int64"})]
    with loader(ringfeed.Parquet(data["binary"]), sock, meta=meta) as ld:
        got = samples(list(ld))
    assert sorted(got) == list(range(N))
    for i, s in got.items():
        assert s["width"].item() == 100 + i
        assert s["score"].item() == pytest.approx(i / 4)
        assert s["likes"].item() == 7 * i


def test_two_ranks_take_every_row_once_and_resume(data: dict[str, Path], sock: str) -> None:
    """Shuffled over 2 ranks, every row comes once, its fields its own; a state taken mid-epoch
    resumes with the rest of it."""
    kw = {"shuffle": True, "seed": 3, "text": ringfeed.Text("caption", max_bytes=64)}
    got: dict[int, dict[str, Any]] = {}
    for rank in (0, 1):
        with loader(ringfeed.Parquet(data["struct"]), sock, rank=rank, world_size=2, **kw) as ld:
            ld.set_epoch(1)
            part = samples(list(ld))
        assert not set(part) & set(got), "the ranks overlap"
        got.update(part)
    assert sorted(got) == list(range(N))
    assert all(s["text"] == caption(i) and s["label"].item() == label(i) for i, s in got.items())
    with loader(ringfeed.Parquet(data["struct"]), sock, **kw) as ld:
        ld.set_epoch(2)
        it = iter(ld)
        first = samples([next(it) for _ in range(2)])
        state = ld.state_dict()
    with loader(ringfeed.Parquet(data["struct"]), sock, **kw) as ld:
        ld.load_state_dict(state)
        rest = samples(list(ld))
    assert not set(first) & set(rest)
    assert sorted({**first, **rest}) == list(range(N))
    assert all(s["text"] == caption(i) for i, s in {**first, **rest}.items())


@pytest.fixture
def with_bad_files(data: dict[str, Path], tmp_path: Path) -> Path:
    """A good file (12 rows), a file without the label column, and a file named .parquet that is not Parquet."""
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a-good.parquet").write_bytes((data["binary"] / "train-00000-of-00002.parquet").read_bytes())
    pq.write_table(table(range(4), "binary").drop_columns(["label"]), d / "b-nolabel.parquet")
    (d / "c-junk.parquet").write_bytes(b"this is not parquet at all")
    (d / "notes.txt").write_text("ignored: not *.parquet")
    return d


def test_listing_problems_refuse_under_raise_and_are_left_out_under_skip(with_bad_files: Path, sock: str) -> None:
    with pytest.raises(ServerError, match=r"b-nolabel\.parquet") as e:
        loader(ringfeed.Parquet(with_bad_files), sock)
    assert 'no column "label"' in str(e.value)
    (with_bad_files / "b-nolabel.parquet").unlink()
    with pytest.raises(ServerError, match=r"c-junk\.parquet.*not a readable Parquet file"):
        loader(ringfeed.Parquet(with_bad_files), sock)
    pq.write_table(table(range(4), "binary").drop_columns(["label"]), with_bad_files / "b-nolabel.parquet")
    with loader(ringfeed.Parquet(with_bad_files), sock, on_error="skip") as ld:
        got = samples(list(ld))
    assert sorted(got) == list(range(N // 2))
    # With no label column asked for, the file without one is served too.
    with loader(ringfeed.Parquet(with_bad_files, label=""), sock, on_error="skip") as ld:
        got = samples(list(ld))
    assert sorted(got) == list(range(N // 2 + 4))
    assert all(s["label"].item() == -1 for s in got.values())


def test_a_missing_field_column_is_named(data: dict[str, Path], sock: str) -> None:
    with pytest.raises(ServerError, match='no column "txt"'):
        loader(ringfeed.Parquet(data["binary"]), sock, text=ringfeed.Text("txt"))


def write_nulls(d: Path, null: int | None, path_only: int | None) -> Path:
    """8 rows in row groups of 3: image `null` is null, image `path_only` an HF struct with only a
    path; label 6 is null."""
    d.mkdir()
    images: list[Any] = [{"bytes": jpeg(i), "path": None} for i in range(8)]
    if null is not None:
        images[null] = None
    if path_only is not None:
        images[path_only] = {"bytes": None, "path": "elsewhere/005.jpg"}
    t = pa.table(
        {
            "image": pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "label": pa.array([None if i == 6 else i for i in range(8)], pa.int32()),
        }
    )
    pq.write_table(t, d / "x.parquet", row_group_size=3)
    return d


def test_a_null_image_is_a_per_sample_failure(tmp_path: Path, sock: str) -> None:
    """A null image, and an HF struct with only a path, fail their row (named) under raise and are
    skipped under skip; a null label is -1."""
    both = write_nulls(tmp_path / "both", 2, 5)
    with pytest.raises(ServerError, match=r"x.parquet: row 2: the image \(column \"image\"\) is null"):
        list(loader(ringfeed.Parquet(both), sock))
    with loader(ringfeed.Parquet(both), sock, on_error="skip") as ld:
        got = samples(list(ld))
        assert ld.stats()["skipped"] == 2
    assert sorted(got) == [0, 1, 3, 4, 6, 7]
    assert got[6]["label"].item() == -1
    assert got[7]["label"].item() == 7
    path_only = write_nulls(tmp_path / "path", None, 5)
    with pytest.raises(ServerError, match=r'x.parquet: row 5: .*only the path "elsewhere/005.jpg"'):
        list(loader(ringfeed.Parquet(path_only), sock))


def test_options_are_checked_where_written(data: dict[str, Path], sock: str) -> None:
    with pytest.raises(ValueError, match="image must name"):
        ringfeed.Parquet("/x", image="")
    with pytest.raises(ValueError, match="label must be a column name"):
        ringfeed.Parquet("/x", label=3)  # type: ignore[arg-type]
    # Parquet options on a dataset that is not Parquet: bad_request naming the member.
    with pytest.raises(ServerError, match=r"open\.parquet"):
        loader(ringfeed.Parquet(data["folder"]), sock)
    # A wrong image column is named, with the columns there are.
    with pytest.raises(ServerError, match=r'no column "jpg" \(open.parquet.image\); its columns: image, label'):
        loader(ringfeed.Parquet(data["binary"], image="jpg"), sock)


def test_an_older_server_is_refused_naming_its_version(serve: Any) -> None:
    """A 1.8 server serves no Parquet: the loader refuses it before any open, naming both versions."""
    from _fakeserver import DATASET

    s = serve(protocol=(1, 8))
    with pytest.raises(ringfeed.RingfeedError, match=r"protocol 1\.8; Parquet datasets need .*1\.9"):
        ringfeed.Loader(
            ringfeed.Parquet(DATASET),
            2,
            ringfeed.Resize((4, 6)),
            server=ringfeed.Server(socket=s.path, spawn=False, timeout=5),
        )


def test_the_open_members_are_the_vector(data: dict[str, Path], sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`parquet`, `text` and `meta` as a Loader sends them are the frames.json vector "open, 1.9
    parquet" (which the Rust side decodes into its OpenRequest and encodes back byte for byte)."""
    want = frame_vector("open, 1.9 parquet")
    sent = record_sent(monkeypatch)
    source = ringfeed.Parquet(data["binary"], image="jpg", label="")
    # The file has no column jpg: the server refuses, after the open was sent.
    with pytest.raises(ServerError, match="jpg"):
        loader(source, sock, text=ringfeed.Text("caption"), meta=ringfeed.Meta("meta", {"width": "int32"}))
    got = next(m for m in sent if m["type"] == "open")
    assert (got["parquet"], got["text"], got["meta"]) == (want["parquet"], want["text"], want["meta"])


def run_pack(*args: str) -> subprocess.CompletedProcess[str]:
    """`ringfeed pack ARGS` without progress output."""
    return subprocess.run(
        [ringfeed_bin(), "pack", *args, "--progress", "none"], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("kind", ["struct", "hf", "saved"])
def test_pack_from_parquet_keeps_every_row(data: dict[str, Path], sock: str, tmp_path: Path, kind: str) -> None:
    """`ringfeed pack` of a Parquet directory: the packed dataset's samples are the rows, in order,
    with their labels and the ImageFolder's pixels."""
    if kind not in data:
        pytest.skip("the datasets library is not installed (scripts/bootstrap installs it)")
    want = folder_pixels(data, sock)
    out = tmp_path / "packed"
    r = run_pack(str(data[kind]), str(out))
    assert r.returncode == 0, r.stderr
    with loader(str(out), sock) as ld:
        got = samples(list(ld))
    assert sorted(got) == list(range(N))
    for i in range(N):
        assert got[i]["label"].item() == label(i)
        assert torch.equal(got[i]["image"], want[i]), f"row {i}: pixels differ from the ImageFolder's"


def test_pack_of_a_null_image_fails_naming_the_row_or_skips_it(tmp_path: Path) -> None:
    src = write_nulls(tmp_path / "src", 2, None)
    r = run_pack(str(src), str(tmp_path / "a"))
    assert r.returncode != 0
    assert 'x.parquet: row 2: the image (column "image") is null' in r.stderr
    r = run_pack(str(src), str(tmp_path / "b"), "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "b" / "skipped.tsv").read_text().splitlines()
    assert len(report) == 2, report
    assert report[1].startswith("x.parquet:2\t")
    assert "row 2" in report[1]


def test_a_save_to_disk_directory_is_read_as_parquet_is(data: dict[str, Path], tmp_path: Path, sock: str) -> None:
    """A `save_to_disk` directory (1.10) is a bare dataset path too; its record batches are the shards of
    `shard_blocks`; one without an image column is refused naming its file and the column, as a Parquet file."""
    if "saved" not in data:
        pytest.skip("the datasets library is not installed (scripts/bootstrap installs it)")
    with loader(str(data["saved"]), sock, shuffle=True, seed=1) as ld:
        assert ld.order == "shard_blocks"
        got = samples(list(ld))
    assert sorted(got) == list(range(N))
    assert all(got[i]["label"].item() == label(i) for i in range(N))
    import datasets

    d = tmp_path / "saved"
    datasets.Dataset.from_dict({"label": [0, 1]}).save_to_disk(str(d))
    with pytest.raises(ServerError, match=r'data-00000-of-00001\.arrow.*no column "image"'):
        loader(str(d), sock)
    r = run_pack(str(d), str(tmp_path / "out"))
    assert r.returncode != 0
    assert 'no column "image"' in r.stderr
