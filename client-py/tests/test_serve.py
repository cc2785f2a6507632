"""``ringfeed.Loader`` end to end against the real ``ringfeed serve`` (the Rust binary).

Datasets are packed by ``ringfeed pack`` from JPEGs written by Pillow. The loader starts the
server itself (``spawn=True`` with a socket in a temporary directory), as it does for users.
Pixels are not compared with torchvision here: the server's transforms are its own tests'
business; these tests pin what the client promises: order, coverage, resume, ranks, errors.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _support import restripe_conformance, ringfeed_bin
from PIL import Image

import ringfeed
from ringfeed import RingfeedError, ServerDiedError, ServerError
from ringfeed.wire import sidecar

N = 22


def jpeg(w: int, h: int, seed: int) -> bytes:
    img = Image.new("RGB", (w, h), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed dataset of N small JPEGs in 3 classes (c0, c1, c2)."""
    root = tmp_path_factory.mktemp("serve")
    for i in range(N):
        p = root / "src" / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(40 + i % 13, 30 + i % 7, i))
    r = subprocess.run(
        [ringfeed_bin(), "pack", str(root / "src"), str(root / "ds"), "--progress", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return root / "ds"


@pytest.fixture(scope="module")
def labels(dataset: Path) -> list[int]:
    with ringfeed.PackedDataset(dataset) as ds:
        return [ds.sample(i).label for i in range(len(ds))]


def loader(dataset: Path, sock: str, batch_size: int = 4, *, timeout: float = 30.0, **kw: Any) -> ringfeed.Loader:
    kw.setdefault("transform", ringfeed.RandomResizedCrop(16) + ringfeed.Flip())
    kw.setdefault("fields", ["index"])
    kw.setdefault("seed", 11)
    kw.setdefault("shuffle", True)
    kw.setdefault("drop_last", True)
    return ringfeed.Loader(dataset, batch_size, server=ringfeed.Server(socket=sock, spawn=True, timeout=timeout), **kw)


def epoch(ld: ringfeed.Loader) -> list[dict[str, torch.Tensor]]:
    """One iteration, every batch copied while it is valid."""
    return [{k: v.clone() for k, v in b.items()} for b in ld]


def test_an_epoch_covers_the_dataset_with_the_right_labels(dataset: Path, sock: str, labels: list[int]) -> None:
    """One epoch of the real server: len(loader) batches, every sample once, each with its dataset label."""
    with loader(dataset, sock, drop_last=False) as ld:
        assert len(ld) == 6
        assert (ld.dataset_len, ld.samples_per_rank) == (N, N)
        assert ld.classes == ("c0", "c1", "c2")
        assert ld.server_log is not None
        batches = epoch(ld)
    assert len(batches) == 6
    seen = [i for b in batches for i in b["index"].tolist()]
    assert sorted(seen) == list(range(N))
    assert seen != list(range(N))  # shuffled
    for b in batches:
        assert b["image"].dtype == torch.uint8
        assert tuple(b["image"].shape[1:]) == (16, 16, 3)
        assert b["label"].tolist() == [labels[i] for i in b["index"].tolist()]


def test_batches_are_a_function_of_seed_and_epoch(dataset: Path, sock: str) -> None:
    """The same epoch twice gives the same batches, pixel for pixel; another epoch another order."""
    with loader(dataset, sock) as ld:
        ld.set_epoch(3)
        a = epoch(ld)
        ld.set_epoch(3)  # on purpose: the same epoch again
        b = epoch(ld)
        ld.set_epoch(4)
        c = epoch(ld)
    assert len(a) == len(b) == len(c) == N // 4
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["index"], y["index"])
        assert torch.equal(x["image"], y["image"])
    assert [x["index"].tolist() for x in a] != [x["index"].tolist() for x in c]


def test_resume_mid_epoch_in_a_new_loader(dataset: Path, sock: str) -> None:
    """A state saved after 2 batches resumes, in a new loader and connection, with exactly the rest of the epoch."""
    with loader(dataset, sock) as ld:
        ld.set_epoch(1)
        full = epoch(ld)
        ld.set_epoch(1)
        it = iter(ld)
        for _ in range(2):
            next(it)
        state = ld.state_dict()
    assert state["batches_delivered"] == 2
    with loader(dataset, sock) as again:
        again.load_state_dict(state)
        again.set_epoch(1)
        rest = epoch(again)
    assert len(rest) == len(full) - 2
    for x, y in zip(full[2:], rest, strict=True):
        assert torch.equal(x["index"], y["index"])
        assert torch.equal(x["image"], y["image"])


def test_a_state_loads_only_into_a_loader_of_its_dataset(dataset: Path, sock: str, tmp_path: Path) -> None:
    """The state records the server's dataset id: a copy of the dataset at another path resumes, another
    dataset is refused with an error naming both."""
    with loader(dataset, sock) as ld:
        it = iter(ld)
        next(it)
        state = ld.state_dict()
    assert state["dataset"] == str(dataset)
    assert len(state["dataset_id"]) == 16
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    with loader(copy, sock) as again:
        again.load_state_dict(state)
        assert again.state_dict()["dataset_id"] == state["dataset_id"]
    other = tmp_path / "other"
    for i in range(N + 2):
        p = other / "src" / f"c{i % 2}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(40, 30, i))
    with loader(other / "src", sock) as elsewhere:
        with pytest.raises(ValueError, match=r"saved on dataset .*serve.* but this loader serves .*other"):
            elsewhere.load_state_dict(state)
        elsewhere.load_state_dict({k: v for k, v in state.items() if k not in ("dataset", "dataset_id")})


@pytest.mark.parametrize("order", ["global", "shard_blocks"])
def test_resume_with_another_world_size_restripes_the_rest(tmp_path: Path, sock: str, order: str) -> None:
    """Four ranks take 4 batches each; the job resumes from their state at world 2, at world 3 and at world 3
    with another batch size: every sample of the epoch is delivered exactly once, and each sample's pixels
    are those it has in an epoch that was never interrupted (its augmentation is drawn by its index). For
    both orders (shard_blocks over small shards, two to a block)."""
    n = 68  # 32 consumed, then 36 = 9 batches of 2 ranks x 2, 6 of 3 x 2, 4 of 3 x 3
    for i in range(n):
        p = tmp_path / "src" / f"c{i % 2}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(40 + i % 13, 30 + i % 7, i))
    r = subprocess.run(
        [ringfeed_bin(), "pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--progress", "none"]
        + (["--shard-size", "8KiB"] if order == "shard_blocks" else []),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    if order == "shard_blocks":
        assert len(list((tmp_path / "ds").glob("*.rfs"))) >= 4, "several shards, so that blocks mean something"
    pixels: dict[int, torch.Tensor] = {}
    opts = {"order": ringfeed.ShardBlocks(block=2)} if order == "shard_blocks" else {}

    def make(**kw: Any) -> ringfeed.Loader:
        ld = loader(tmp_path / "ds", sock, **opts, **kw)
        ld.set_epoch(3)
        return ld

    def key(b: dict[str, torch.Tensor]) -> list[int]:
        for i, img in zip(b["index"].tolist(), b["image"], strict=True):
            pixels.setdefault(i, img.clone())
            assert torch.equal(pixels[i], img), f"sample {i} has other pixels after the resume"
        return b["index"].tolist()

    restripe_conformance(make, n, key, batch=2, steps=4)
    with make(batch_size=4, world_size=1, rank=0) as ld:
        for b in ld:
            key(b)
    assert len(pixels) == n


def test_ranks_split_the_epoch(dataset: Path, sock: str) -> None:
    """Two ranks of one epoch (drop_last=False) see N + padding samples between them, every sample at least once."""
    seen = []
    for rank in range(2):
        with loader(dataset, sock, rank=rank, world_size=2, drop_last=False) as ld:
            assert ld.samples_per_rank == N // 2
            seen.append([i for b in epoch(ld) for i in b["index"].tolist()])
    assert len(seen[0]) == len(seen[1]) == N // 2
    assert sorted(seen[0] + seen[1]) == list(range(N))


def test_cpu_views_point_into_the_ring(dataset: Path, sock: str) -> None:
    """CPU batches are zero-copy: each image tensor's memory lies inside the mapped ring."""
    with loader(dataset, sock) as ld:
        seg = ld._res.segment
        assert seg is not None
        base = seg.as_uint8().data_ptr()
        for b in ld:
            assert base <= b["image"].data_ptr() < base + seg.length


@pytest.mark.parametrize("hold", [1, 3])
@pytest.mark.parametrize("normalize", [False, True])
def test_kept_cpu_batches_never_change(dataset: Path, sock: str, hold: int, normalize: bool) -> None:
    """``list(loader)`` equals the same epoch cloned batch by batch, and a batch kept across a new
    iteration keeps its values: a slot going back moves the tensors still referenced to private
    memory first."""
    kw: dict[str, Any] = {"tuning": ringfeed.Tuning(hold=hold, slots=hold + 2), "seed": 1}
    if normalize:
        kw["transform"] = ringfeed.RandomResizedCrop(16) + ringfeed.Flip() + ringfeed.Normalize((0.5,) * 3, (0.25,) * 3)
    with loader(dataset, sock, batch_size=2, **kw) as ld:
        ld.set_epoch(3)
        cloned = epoch(ld)
        ld.set_epoch(3)
        kept = list(ld)
        assert len(kept) == len(cloned) == N // 2
        for a, b in zip(kept, cloned, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                assert torch.equal(a[k], b[k]), k
        ld.set_epoch(4)
        for _ in ld:  # another iteration refills every slot
            pass
        for a, b in zip(kept, cloned, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_callable_batch_transform_runs_last_and_may_cut_views(dataset: Path, sock: str) -> None:
    """Any callable is a batch transform: it gets the fields by name after the built-in ops (here
    normalize) and its result is the batch; a view it cuts of the ring is copied out before the slot
    goes back, so kept batches keep their values."""
    seen: list[torch.dtype] = []

    def mine(fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        seen.append(fields["image"].dtype)
        return {"image": fields["image"][..., :4], "label": fields["label"] + 100, "index": fields["index"][:2]}

    tf = ringfeed.RandomResizedCrop(16) + ringfeed.Flip() + ringfeed.Normalize((0.5,) * 3, (0.25,) * 3)
    with loader(dataset, sock, transform=tf, batch_transform=mine, shuffle=False) as ld:
        kept = list(ld)
    assert seen
    assert all(d == torch.float32 for d in seen)
    assert all(tuple(b["image"].shape[1:]) == (3, 16, 4) and b["label"].min() >= 100 for b in kept)
    assert [i for b in kept for i in b["index"].tolist()] == [j for k in range(0, N - 3, 4) for j in (k, k + 1)]
    with loader(
        dataset, sock, batch_transform=lambda f: {"image": f["image"][:, :2]}, fields=None, shuffle=False
    ) as ld:
        first = [b["image"] for b in ld]
        again = [b["image"].clone() for b in ld]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # views cut of the ring were copied
    with pytest.raises(ValueError, match="a callable on the batch's fields"):
        loader(dataset, sock, batch_transform=ringfeed.Flip())
    bad = loader(dataset, sock, batch_transform=lambda f: [f["image"]])
    with bad as ld, pytest.raises(TypeError, match="as a dict"):
        next(iter(ld))


def test_defaults_are_the_dataloaders(dataset: Path, sock: str) -> None:
    """Like ``torch.utils.data.DataLoader``: no shuffle, and the last partial batch is delivered."""
    with ringfeed.Loader(
        dataset, 4, ringfeed.Resize((8, 8)), fields=["index"], server=ringfeed.Server(socket=sock, spawn=True)
    ) as ld:
        assert (ld.shuffle, ld.drop_last) == (False, False)
        batches = epoch(ld)
        assert len(ld) == len(batches) == -(-N // 4)
        assert [len(b["index"]) for b in batches] == [4] * (N // 4) + [N % 4]
        assert torch.cat([b["index"] for b in batches]).tolist() == list(range(N))


def test_a_shuffled_epoch_repeated_without_set_epoch_is_warned_of(dataset: Path, sock: str) -> None:
    """The order would repeat: one warning names set_epoch; set_epoch or a resume silences it."""
    with loader(dataset, sock, shuffle=True) as ld:
        first = epoch(ld)
        with pytest.warns(UserWarning, match="call loader.set_epoch"):
            again = epoch(ld)
        assert [b["index"].tolist() for b in again] == [b["index"].tolist() for b in first]
    with loader(dataset, sock, shuffle=True) as ld, warnings.catch_warnings():
        warnings.simplefilter("error")
        for e in range(2):
            ld.set_epoch(e)
            epoch(ld)
        ld.set_epoch(1)  # the same epoch on purpose: no warning
        epoch(ld)
    with loader(dataset, sock, shuffle=False) as ld, warnings.catch_warnings():
        warnings.simplefilter("error")
        epoch(ld)
        epoch(ld)  # without shuffle, one order is what was asked for


def test_eval_transform_nchw_and_normalize(dataset: Path, sock: str) -> None:
    """CenterCrop in NCHW, and normalize on the CPU: float32 [N, 3, h, w] channels_last."""
    with loader(
        dataset,
        sock,
        transform=ringfeed.Compose([ringfeed.Resize(14), ringfeed.CenterCrop(12)]),
        layout="NCHW",
        shuffle=False,
    ) as ld:
        b = next(iter(ld))
        assert tuple(b["image"].shape) == (4, 3, 12, 12)
        assert b["index"].tolist() == [0, 1, 2, 3]
    norm = ringfeed.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    with loader(dataset, sock, transform=ringfeed.Resize((8, 10)) + norm, fields=None) as ld:
        images, lab = next(iter(ld))
        assert images.dtype == torch.float32
        assert tuple(images.shape) == (4, 3, 8, 10)
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert lab.dtype == torch.int64


def test_unknown_dataset_names_the_path(dataset: Path, sock: str) -> None:
    """Opening a path that is not a dataset fails in the constructor with the server's error naming the path."""
    missing = dataset.parent / "nope"
    with pytest.raises(ServerError, match=str(missing)) as e:
        loader(missing, sock)
    assert e.value.code == "dataset"


def test_batch_larger_than_the_dataset_is_a_bad_request(dataset: Path, sock: str) -> None:
    """batch_size beyond the dataset (with drop_last) is the server's bad_request naming batch_size."""
    with pytest.raises(ServerError, match="batch_size 64 is larger") as e:
        loader(dataset, sock, batch_size=64)
    assert e.value.code == "bad_request"


def test_a_killed_server_is_server_died_at_once(dataset: Path, sock: str) -> None:
    """SIGKILL of the server mid-epoch surfaces as ServerDiedError within a second, not after the timeout."""
    with loader(dataset, sock, timeout=60.0) as ld:
        it = iter(ld)
        next(it)
        proc = sidecar._SPAWNED[-1]
        proc.kill()
        proc.wait()
        t = time.monotonic()
        with pytest.raises(ServerDiedError):
            drain(it)
        assert time.monotonic() - t < 1
        state = ld.state_dict()
        with pytest.raises(RingfeedError, match="failed earlier"):
            iter(ld)
    assert state["batches_delivered"] >= 1


def test_the_embedded_sidecar_exits_when_idle(dataset: Path, sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no socket=, the loader starts `ringfeed serve --exit-when-idle` at $RINGFEED_SOCKET; it exits when idle."""
    monkeypatch.setenv("RINGFEED_SOCKET", sock)
    with ringfeed.Loader(
        dataset,
        4,
        transform=ringfeed.Resize((8, 8)),
        server=ringfeed.Server(timeout=30.0),
        shuffle=True,
        drop_last=True,
    ) as ld:
        assert len(epoch_tuples(ld)) == N // 4
        proc = sidecar._SPAWNED[-1]
        assert ld.server_log == sock[: -len(".sock")] + ".log"
    assert proc.wait(timeout=20) == 0
    assert not Path(sock).exists()


def epoch_tuples(ld: ringfeed.Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in ld]


def drain(it: Iterator[Any]) -> None:
    for _ in it:
        pass


def test_corrupt_samples_raise_or_are_skipped(tmp_path: Path, sock: str) -> None:
    """A sample that does not decode is ServerError(sample, key) under on_error="raise", and counted under "skip"."""
    for i in range(8):
        data = bytearray(jpeg(24, 20, i))
        if i == 5:
            sos = data.index(b"\xff\xda")
            data[sos + 16 : len(data) - 2] = b"\xff" * (len(data) - 2 - sos - 16)
        (tmp_path / "src" / "c").mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / "c" / f"{i}.jpg").write_bytes(bytes(data))
    r = subprocess.run(
        [
            ringfeed_bin(),
            "pack",
            str(tmp_path / "src"),
            str(tmp_path / "ds"),
            "--progress",
            "none",
            "--check",
            "header",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    with loader(tmp_path / "ds", sock, batch_size=2, shuffle=False) as ld:
        it = iter(ld)
        got = [next(it)["index"].tolist() for _ in range(2)]
        with pytest.raises(ServerError, match="on_error") as e:
            next(it)
        assert (e.value.code, e.value.sample, e.value.key, e.value.fatal) == ("sample", 5, "c/5.jpg", False)
        assert got == [[0, 1], [2, 3]]
        # Not fatal: the loader iterates again (a new run, from the first batch).
        assert next(iter(ld))["index"].tolist() == [0, 1]
    with loader(tmp_path / "ds", sock, batch_size=2, shuffle=False, on_error="skip") as ld:
        seen = [i for b in epoch(ld) for i in b["index"].tolist()]
        assert seen == [0, 1, 2, 3, 4, 6, 7]
        assert ld.stats()["skipped"] == 1
    # A batch whose every sample fails: nothing of it is handed out, but it counts as delivered,
    # so the numbering of the next batches and the resume point stay those of the epoch.
    with loader(tmp_path / "ds", sock, batch_size=1, shuffle=False, on_error="skip") as ld:
        seen = [i for b in epoch(ld) for i in b["index"].tolist()]
        assert seen == [0, 1, 2, 3, 4, 6, 7]
        assert ld.stats()["skipped"] == 1
        assert ld.state_dict()["batches_delivered"] == 8
        # Resuming after the empty batch starts at the right place.
        ld.load_state_dict({**ld.state_dict(), "batches_delivered": 5})
        assert [b["index"].tolist() for b in epoch(ld)] == [[6], [7]]


def test_preview_shows_the_draws_a_dataset_sample_gets(tmp_path: Path) -> None:
    """``ringfeed.preview`` runs the server's ops on one image: draw ``i`` is what sample ``i`` of a
    dataset of that image gets with the same seed and epoch (pixels and crop), from a file or a PIL image."""
    img = Image.new("RGB", (48, 40))
    img.putdata([((x * 5) % 256, (y * 7) % 256, (x * y) % 256) for y in range(40) for x in range(48)])
    path = tmp_path / "one.png"
    img.save(path)
    tf = ringfeed.RandomResizedCrop(16) + ringfeed.Flip()
    p = ringfeed.preview(tf, path, seed=4, n=6, epoch=2)
    assert tuple(p.images.shape) == (6, 16, 16, 3)
    assert tuple(p.crops.shape) == (6, 5)
    assert len({tuple(c) for c in p.crops.tolist()}) > 1  # six draws, not one
    root = tmp_path / "ds" / "c"
    root.mkdir(parents=True)
    for i in range(6):
        (root / f"{i}.png").write_bytes(path.read_bytes())
    with ringfeed.Loader(
        tmp_path / "ds",
        6,
        tf,
        seed=4,
        fields=["index", "crop"],
        server=ringfeed.Server(socket=str(tmp_path / "s.sock"), spawn=True),
    ) as ld:
        ld.set_epoch(2)
        b = next(iter(ld))
    assert torch.equal(p.images, b["image"])
    assert torch.equal(p.crops, b["crop"])
    assert torch.equal(ringfeed.preview(tf, img, seed=4, n=6, epoch=2).images, p.images)  # a PIL image too
    with pytest.raises(ValueError, match="n must be"):
        ringfeed.preview(tf, path, n=0)
