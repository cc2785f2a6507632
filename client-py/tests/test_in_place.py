"""Image folders and manifests served in place by the real ``ringfeed serve``.

The loader is pointed at the folder itself: what it delivers must be what torchvision's
``ImageFolder`` lists (classes, and each sample's label) and, pixel for pixel, what the packed
dataset of the same folder delivers.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from _fleet import Server
from _support import ringfeed_bin
from PIL import Image

import ringfeed
from ringfeed import ServerError

N = 26


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An image folder (classes created out of order, mixed case, a nested directory, a PNG, a
    text file) and the dataset ``ringfeed pack`` makes of it."""
    root = tmp_path_factory.mktemp("inplace")
    classes = ["zebra", "Ant", "ant", "bee"]
    rng = np.random.default_rng(0)
    for i in range(N):
        sub = "deep/er/" if i % 4 == 0 else ""
        ext = "png" if i % 9 == 0 else "JPG" if i % 5 == 0 else "jpg"
        p = root / "train" / classes[i % 4] / f"{sub}{i:03d}.{ext}"
        p.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (30 + i % 7, 40 + i % 11, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG" if ext == "png" else "JPEG", quality=90)
        p.write_bytes(buf.getvalue())
    (root / "train" / "ant" / "README.txt").write_text("not an image")
    subprocess.run(
        [ringfeed_bin(), "pack", str(root / "train"), str(root / "train.rf"), "--progress", "none"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return root / "train", root / "train.rf"


def epoch(path: Path, sock: str, **kw: object) -> tuple[tuple[str, ...], list[tuple[torch.Tensor, ...]]]:
    with ringfeed.Loader(
        path,
        4,
        ringfeed.RandomResizedCrop(24) + ringfeed.Flip(),
        server=ringfeed.Server(socket=sock, spawn=True),
        seed=7,
        fields=["index"],
        drop_last=False,
        **kw,
    ) as loader:
        loader.set_epoch(1)
        return loader.classes, [(b["index"].clone(), b["label"].clone(), b["image"].clone()) for b in loader]


def test_an_image_folder_has_torchvisions_classes_and_labels(tree: tuple[Path, Path], sock: str) -> None:
    """Served in place, an image folder has torchvision ImageFolder's classes, samples and labels, in its order."""
    folder, _ = tree
    tv = torchvision.datasets.ImageFolder(str(folder))
    classes, batches = epoch(folder, sock, shuffle=False)
    assert list(classes) == tv.classes
    index = torch.cat([b[0] for b in batches]).tolist()
    labels = torch.cat([b[1] for b in batches]).tolist()
    assert index == list(range(len(tv.samples)))
    assert labels == tv.targets


def test_an_image_folder_serves_the_packed_datasets_batches(tree: tuple[Path, Path], sock: str) -> None:
    """An image folder served in place gives the packed dataset's batches: indices, labels and pixels."""
    folder, packed = tree
    want_classes, want = epoch(packed, sock)
    classes, got = epoch(folder, sock)
    assert classes == want_classes
    assert len(got) == len(want) == -(-N // 4)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert torch.equal(a, b)


def test_a_manifest_serves_the_packed_datasets_batches(tree: tuple[Path, Path], sock: str, tmp_path: Path) -> None:
    """A JSONL manifest listing the folder's files in the packed order, with class names, gives the packed batches."""
    folder, packed = tree
    tv = torchvision.datasets.ImageFolder(str(folder))
    manifest = tmp_path / "train.jsonl"
    manifest.write_text(
        "".join(json.dumps({"path": p, "label": tv.classes[t], "note": "x"}) + "\n" for p, t in tv.samples)
    )
    classes, got = epoch(manifest, sock)
    want_classes, want = epoch(packed, sock)
    assert classes == want_classes
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert torch.equal(a, b)


def test_a_directory_that_is_no_dataset_is_refused_with_what_was_looked_for(tmp_path: Path, sock: str) -> None:
    """A directory that is neither a packed dataset, an LMDB nor an image folder is a `dataset` error saying so."""
    (tmp_path / "loose.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ServerError) as e:
        ringfeed.Loader(tmp_path, 1, ringfeed.Resize((8, 8)), server=ringfeed.Server(socket=sock, spawn=True))
    assert e.value.code == "dataset"
    assert "neither a packed ringfeed dataset" in str(e.value)
    assert "image folder" in str(e.value)


def test_a_long_listing_reports_progress(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """While the server lists a large manifest, on_opening hears of it and the ringfeed logger logs it."""
    manifest = tmp_path / "big.jsonl"
    manifest.write_text("".join(f'{{"path": "img/{i:05d}.jpg", "label": {i % 10}}}\n' for i in range(40_000)))
    reports: list[tuple[int, float]] = []
    with Server(threads=1, extra=["--open-progress", "0.001"]) as server:
        with caplog.at_level(logging.INFO, logger="ringfeed"):
            loader = ringfeed.Loader(
                manifest,
                8,
                ringfeed.Resize((8, 8)),
                server=ringfeed.Server(socket=server.sock, spawn=False, on_opening=lambda n, s: reports.append((n, s))),
            )
        with loader:
            assert loader.dataset_len == 40_000
            assert loader.classes == ()
    assert reports, "on_opening was called"
    assert [n for n, _ in reports] == sorted(n for n, _ in reports)
    assert all(0 <= n <= 40_000 and s >= 0 for n, s in reports)
    assert any("listing" in r.getMessage() and str(manifest) in r.getMessage() for r in caplog.records)
