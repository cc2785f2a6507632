"""Aspect-ratio buckets (control.md, "Aspect-ratio buckets (1.10)") served by the real ``ringfeed serve``.

An image folder of many aspect ratios (JPEGs, PNGs, an EXIF-rotated JPEG) is served with
``AspectBuckets`` as the pipeline's first op: every batch is one bucket, each image is the
torchvision v2 ``Resize((nh, nw))`` + crop of its decode at the offsets the batch reports.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision.transforms.v2 import functional as tvf

import ringfeed
from ringfeed import ServerError

N = 45
BUCKETS = ringfeed.AspectBuckets(area=24 * 24, min_ratio=0.5, max_ratio=2.0, step=8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Images of sizes 16..80 on each side in two classes; every ninth a PNG, one JPEG EXIF-rotated (6)."""
    root = tmp_path_factory.mktemp("buckets") / "train"
    rng = np.random.default_rng(3)
    for i in range(N):
        h, w = int(rng.integers(16, 81)), int(rng.integers(16, 81))
        ys, xs = np.mgrid[0:h, 0:w]
        # Smooth pictures (gradients plus a little noise): resampling differences stay small.
        pixels = np.stack([xs * 255 // w, ys * 255 // h, (xs + ys) * 127 // (w + h)], axis=-1)
        pixels = (pixels + rng.integers(0, 8, (h, w, 3))).clip(0, 255).astype(np.uint8)
        img = Image.fromarray(pixels)
        buf = io.BytesIO()
        if i % 9 == 0:
            img.save(buf, "PNG")
            ext = "png"
        elif i == 4:
            exif = img.getexif()
            exif[0x0112] = 6  # rotate 90° clockwise on display: the oriented size is (w, h)
            img.save(buf, "JPEG", quality=95, exif=exif)
            ext = "jpg"
        else:
            img.save(buf, "JPEG", quality=95)
            ext = "jpg"
        p = root / ("a" if i % 2 else "b") / f"{i:03d}.{ext}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(buf.getvalue())
    return root


def files(folder: Path) -> list[Path]:
    """The folder's images in ImageFolder order (the dataset's indices)."""
    return sorted(p for d in sorted(folder.iterdir()) for p in d.iterdir())


def decoded(path: Path) -> torch.Tensor:
    """The image as PIL decodes it, EXIF orientation applied, CHW uint8."""
    with Image.open(path) as im:
        rgb = ImageOps.exif_transpose(im).convert("RGB")
    return torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)


def nearest(buckets: list[tuple[int, int]], w: int, h: int) -> tuple[int, int]:
    """control.md's rule: the least |ln(W/H) - ln(w/h)|, the lower number on a tie."""
    r = math.log(w / h)
    return min(enumerate(buckets), key=lambda kb: (abs(r - math.log(kb[1][1] / kb[1][0])), kb[0]))[1]


def cover(bucket: tuple[int, int], w: int, h: int) -> tuple[int, int]:
    bh, bw = bucket
    return (bh, w * bh // h) if w * bh >= bw * h else (h * bw // w, bw)


def loader(folder: Path, sock: str, transform: Any = BUCKETS, **kw: Any) -> ringfeed.Loader:
    kw.setdefault("seed", 5)
    return ringfeed.Loader(
        folder, 4, transform, server=ringfeed.Server(socket=sock, spawn=True), fields=["index"], **kw
    )


def run(ld: ringfeed.Loader, epoch: int = 0) -> list[dict[str, torch.Tensor]]:
    ld.set_epoch(epoch)
    return [{k: v.clone() for k, v in b.items()} for b in ld]


def test_every_batch_is_one_bucket_of_each_images_nearest_bucket(folder: Path, sock: str) -> None:
    """Each batch's images have one bucket's shape: each image's nearest, by the oriented size original_size reports."""
    paths = files(folder)
    buckets = BUCKETS.buckets
    with loader(folder, sock, drop_last=False) as ld:
        batches = run(ld)
    seen = []
    for b in batches:
        n, h, w, c = b["image"].shape
        assert c == 3
        assert (h, w) in buckets
        assert b["original_size"].shape == (n, 2)
        assert b["crop_top_left"].shape == (n, 2)
        for i, idx in enumerate(b["index"].tolist()):
            ref = decoded(paths[idx])
            assert b["original_size"][i].tolist() == list(ref.shape[1:])
            assert nearest(buckets, ref.shape[2], ref.shape[1]) == (h, w)
            seen.append(idx)
    assert sorted(seen) == list(range(N))


def test_pixels_equal_torchvision_resize_and_crop_at_the_reported_offsets(folder: Path, sock: str) -> None:
    """Each image is torchvision v2 Resize((nh, nw)) of its decode cropped at crop_top_left (within 2 levels)."""
    paths = files(folder)
    for crop in ("random", "center"):
        tf = ringfeed.AspectBuckets(area=24 * 24, step=8, crop=crop)
        with loader(folder, sock, transform=tf, drop_last=False, layout="NCHW") as ld:
            batches = run(ld, epoch=1)
        for b in batches:
            _, _, h, w = b["image"].shape
            for i, idx in enumerate(b["index"].tolist()):
                ref = decoded(paths[idx])
                nh, nw = cover((h, w), ref.shape[2], ref.shape[1])
                top, left = b["crop_top_left"][i].tolist()
                assert 0 <= top <= nh - h
                assert 0 <= left <= nw - w
                if crop == "center":
                    assert (top, left) == (round((nh - h) / 2), round((nw - w) / 2))
                want = tvf.crop(tvf.resize(ref, [nh, nw], antialias=True), top, left, h, w)
                diff = (b["image"][i].int() - want.int()).abs().max()
                assert int(diff) <= 2, f"sample {idx} ({paths[idx].name}): max difference {int(diff)}"


@pytest.mark.parametrize("drop_last", [True, False])
def test_each_sample_comes_at_most_once_per_epoch_over_two_ranks(folder: Path, sock: str, drop_last: bool) -> None:
    """Two ranks see each sample at most once (all of them without drop_last); with it, equal counts of full batches."""
    got = []
    for rank in (0, 1):
        with loader(folder, sock, rank=rank, world_size=2, drop_last=drop_last) as ld:
            got.append(run(ld, epoch=2))
    indices = [i for r in got for b in r for i in b["index"].tolist()]
    assert len(indices) == len(set(indices))
    if drop_last:
        assert len(got[0]) == len(got[1])
        assert all(len(b["index"]) == 4 for r in got for b in r)
    else:
        assert sorted(indices) == list(range(N))
        assert abs(len(got[0]) - len(got[1])) <= 1


def test_resume_delivers_the_rest_of_the_epoch(folder: Path, sock: str) -> None:
    """A state saved after three batches resumes with exactly the batches that followed them."""
    with loader(folder, sock) as ld:
        whole = run(ld, epoch=3)
    with loader(folder, sock) as ld:
        ld.set_epoch(3)
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    with loader(folder, sock) as ld:
        ld.load_state_dict(state)
        rest = [{k: v.clone() for k, v in b.items()} for b in ld]
    assert len(rest) == len(whole) - 3
    for a, b in zip(rest, whole[3:], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_bad_buckets_are_refused_by_the_client_naming_the_member() -> None:
    """The client refuses ratios out of order, a step not dividing 4096, an area past 4096², a sized op after."""
    with pytest.raises(ValueError, match="min_ratio"):
        ringfeed.AspectBuckets(min_ratio=2.0, max_ratio=0.5)
    with pytest.raises(ValueError, match="step"):
        ringfeed.AspectBuckets(step=48)
    with pytest.raises(ValueError, match="area"):
        ringfeed.AspectBuckets(area=4097 * 4097)
    with pytest.raises(ValueError, match="RandomCrop changes the size after AspectBuckets"):
        ringfeed.Compose([ringfeed.AspectBuckets(), ringfeed.RandomCrop(64)])
    with pytest.raises(ValueError, match="first op"):
        ringfeed.Compose([ringfeed.RandomHorizontalFlip(), ringfeed.AspectBuckets()])
    ringfeed.Compose([ringfeed.AspectBuckets(), ringfeed.RandomHorizontalFlip(), ringfeed.ColorJitter(0.2)])


class _Raw(ringfeed.AspectBuckets):
    """AspectBuckets whose wire form is replaced, to reach the server's own checks."""

    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__()
        self.doc = doc

    def to_json(self) -> dict[str, Any]:
        return self.doc


@pytest.mark.parametrize(
    ("doc", "member"),
    [
        ({"op": "aspect_buckets", "min_ratio": 2.0, "max_ratio": 0.5}, "min_ratio"),
        ({"op": "aspect_buckets", "step": 48}, "step"),
        ({"op": "aspect_buckets", "area": 4097 * 4097}, "area"),
    ],
)
def test_bad_buckets_are_refused_by_the_server_naming_the_member(
    folder: Path, sock: str, doc: dict[str, Any], member: str
) -> None:
    """The server answers bad_request naming pipeline.views[0].ops[0].<member> (aspect_buckets)."""
    with pytest.raises(ServerError, match=rf"ops\[0\]\.{member} \(aspect_buckets\)") as e:
        loader(folder, sock, transform=_Raw(doc))
    assert e.value.code == "bad_request"


def test_a_sized_op_after_buckets_is_refused_by_the_server(folder: Path, sock: str) -> None:
    """A resize after aspect_buckets is the server's bad_request naming the op."""
    bad = ringfeed.Compose([ringfeed.AspectBuckets(area=24 * 24, step=8), ringfeed.RandomHorizontalFlip()])
    bad.transforms.append(ringfeed.Resize((16, 16)))
    with pytest.raises(ServerError, match=r"ops\[2\] \(resize\): changes the image's size") as e:
        loader(folder, sock, transform=bad)
    assert e.value.code == "bad_request"


#: A bucketed pipeline with per-image ops after the bucket's resize and crop.
TAIL = ringfeed.Compose(
    [
        ringfeed.AspectBuckets(area=24 * 24, min_ratio=0.5, max_ratio=2.0, step=8),
        ringfeed.RandomHorizontalFlip(),
        ringfeed.ColorJitter(0.4, 0.4, 0.4, 0.1),
        # Its warps' steps depend on the image's size: the bucket's, not the largest one's.
        ringfeed.TrivialAugmentWide(),
    ]
)


def _same_batches(
    cpu: list[dict[str, torch.Tensor]], gpu: list[dict[str, torch.Tensor]], layout: str, most: float
) -> None:
    """The same samples in the same buckets, with the CPU path's offsets and sizes; each image
    within ``most`` levels of the CPU path's on average."""
    assert len(cpu) == len(gpu) > 0
    worst = 0.0
    shapes = set()
    for a, b in zip(cpu, gpu, strict=True):
        assert a.keys() == b.keys()
        for k in ("label", "index", "crop_top_left", "original_size"):
            assert torch.equal(a[k].cpu(), b[k].cpu()), k
        assert a["image"].shape == b["image"].shape
        shapes.add(tuple(a["image"].shape[1:3] if layout == "NHWC" else a["image"].shape[2:4]))
        d = (a["image"].float().cpu() - b["image"].float().cpu()).abs().flatten(1).mean(1)
        worst = max(worst, float(d.max()))
    assert len(shapes) > 1, "batches of several buckets"
    assert worst < most, f"an image differs from the CPU path's by {worst:.2f} levels on average"


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("transform", [BUCKETS, TAIL], ids=["buckets", "buckets-flip-jitter-ta"])
def test_hybrid_decode_finishes_each_batch_at_its_bucket(folder: Path, sock: str, layout: str, transform: Any) -> None:
    """With every sample offered (1.10), the plain JPEGs of a bucketed stream go to the client,
    whose GPU jobs carry their bucket's covering resize and crop (drawn before decoding, so
    ``crop_top_left`` is the CPU path's) and whose finished images are written at the batch's
    shape: every batch equals the CPU path's, pixels within a few levels (another decoder, a float
    resample; a wrong offset or size moves an image by tens of levels)."""
    kw: dict[str, Any] = {"drop_last": False, "layout": layout}
    with loader(folder, sock, transform=transform, gpu_decode=False, **kw) as ld:
        cpu = run(ld, epoch=1)
    with loader(folder, sock, transform=transform, gpu_decode=1.0, _gpu_backend="host", **kw) as ld:
        assert ld.gpu_decode_reason is None
        gpu = run(ld, epoch=1)
        stats = ld.stats()
    # Every JPEG but the EXIF-rotated one: PNGs are every ninth (0, 9, ..., 36), the rotated one is #4.
    assert stats["gpu_samples"] == N - 5 - 1, stats
    _same_batches(cpu, gpu, layout, 4.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("gpu_decode", [False, 1.0], ids=["copied", "hybrid"])
def test_cuda_batches_have_their_bucket_s_shape(folder: Path, sock: str, gpu_decode: Any) -> None:
    """On a CUDA device each batch arrives at its bucket's shape: copied as the server made it
    (hybrid decode off: the same bytes as the CPU loader's) or with the GPU decoder finishing the
    plain JPEGs (within a few levels: the hardware decoder's chroma differs)."""
    kw: dict[str, Any] = {"drop_last": False, "layout": "NCHW"}
    with loader(folder, sock, transform=TAIL, gpu_decode=False, **kw) as ld:
        cpu = run(ld, epoch=2)
    with loader(folder, sock, transform=TAIL, gpu_decode=gpu_decode, device="cuda", **kw) as ld:
        cuda = run(ld, epoch=2)
        stats = ld.stats()
    assert all(b["image"].device.type == "cuda" for b in cuda)
    if gpu_decode is False:
        _same_batches(cpu, cuda, "NCHW", 1e-9)
    else:
        assert stats["gpu_samples"] > 0, stats
        _same_batches(cpu, cuda, "NCHW", 16.0)


def test_an_unreadable_header_refuses_under_raise_and_is_skipped_under_skip(
    folder: Path, sock: str, tmp_path: Path
) -> None:
    """An unreadable header refuses the loader naming the sample (raise), or is left out, the rest intact (skip)."""
    import shutil

    bad = tmp_path / "train"
    shutil.copytree(folder, bad)
    (bad / "a" / "000-broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    broken = files(bad).index(bad / "a" / "000-broken.jpg")
    with pytest.raises(ServerError, match=rf"sample {broken}: its image header cannot be read") as e:
        loader(bad, sock)
    assert e.value.code == "dataset"
    with loader(bad, sock, on_error="skip", drop_last=False) as ld:
        batches = run(ld)
    got = sorted(i for b in batches for i in b["index"].tolist())
    assert got == [i for i in range(N + 1) if i != broken]
    paths = files(bad)
    for b in batches:
        _, h, w, _ = b["image"].shape
        assert (h, w) in BUCKETS.buckets
        # The batch that lost the broken sample was compacted at its bucket's size.
        for i, idx in enumerate(b["index"].tolist()):
            ref = decoded(paths[idx])
            nh, nw = cover((h, w), ref.shape[2], ref.shape[1])
            top, left = b["crop_top_left"][i].tolist()
            assert b["original_size"][i].tolist() == list(ref.shape[1:])
            want = tvf.crop(tvf.resize(ref, [nh, nw], antialias=True), top, left, h, w).permute(1, 2, 0)
            assert int((b["image"][i].int() - want.int()).abs().max()) <= 2, idx


def test_a_1_9_server_is_refused_naming_its_version(serve: Any) -> None:
    """A 1.9 server does not know aspect_buckets: the loader refuses it before any open, naming its version."""
    from _fakeserver import DATASET

    server = serve(protocol=(1, 9))
    with pytest.raises(ringfeed.RingfeedError, match=r"protocol 1\.9; AspectBuckets needs .*1\.10"):
        ringfeed.Loader(DATASET, 2, BUCKETS, server=ringfeed.Server(socket=server.path, spawn=False, timeout=5))
