"""Pixels end to end: what the real server writes into the ring equals what PIL and torchvision
compute from the same file, and RandomResizedCrop draws its crops from torchvision's distribution.

The server reports each sample's crop (`fields=["crop"]`), so the reference can apply exactly the
same crop with torchvision's functional ops.
"""

from __future__ import annotations

import io
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as tvf
from _support import ringfeed_bin
from PIL import Image
from torchvision.transforms import RandomResizedCrop as TvRandomResizedCrop

import ringfeed


def photo(w: int, h: int, seed: int) -> Image.Image:
    """A smooth picture with edges and noise, so that resampling differences would show."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack([(xx * (c + 1) * 0.7 + yy * (3 - c) * 0.5 + rng.uniform(0, 255)) % 256 for c in range(3)], -1)
    rgb[h // 3 : h // 2, w // 4 : w // 2] = rng.uniform(0, 255, size=3)
    rgb += rng.normal(0, 6, size=rgb.shape)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")


def encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, bytes]]:
    """JPEGs (4:2:0, 4:4:4, progressive, grayscale, CMYK) and PNGs (RGB, RGBA) of several sizes."""
    root = tmp_path_factory.mktemp("pixels")
    files = {}
    variants = [
        ("JPEG", {"quality": 92}, "RGB"),
        ("JPEG", {"quality": 95, "subsampling": 0}, "RGB"),
        ("JPEG", {"quality": 90, "progressive": True}, "RGB"),
        ("JPEG", {"quality": 90}, "L"),
        ("JPEG", {"quality": 90}, "CMYK"),
        ("PNG", {}, "RGB"),
        ("PNG", {}, "RGBA"),
    ]
    for i in range(14):
        fmt, kw, mode = variants[i % len(variants)]
        img = photo(160 + 37 * (i % 5), 120 + 29 * (i % 4), i).convert(mode)
        data = encode(img, fmt, **kw)
        name = f"a/{i:03d}.{'jpg' if fmt == 'JPEG' else 'png'}"
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_bytes(data)
        files[i] = data
    r = subprocess.run(
        [ringfeed_bin(), "pack", str(root / "src"), str(root / "ds"), "--progress", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    with ringfeed.PackedDataset(root / "ds") as ds:
        by_index = {i: bytes(ds.sample(i).data) for i in range(len(ds))}
    return root / "ds", by_index


def reference_rgb(data: bytes) -> torch.Tensor:
    """PIL's decode, as torchvision users get it: `Image.open(f).convert("RGB")`, as CHW uint8."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def pack(root: Path) -> Path:
    """Packs `root/src` into `root/ds` with the real binary."""
    cmd = [ringfeed_bin(), "pack", str(root / "src"), str(root / "ds"), "--progress", "none"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return root / "ds"


def batches(ld: ringfeed.Loader) -> list[dict[str, torch.Tensor]]:
    """One epoch, each batch copied out of the ring while it is valid, as a dict of fields."""
    out = []
    for b in ld:
        fields = b if isinstance(b, dict) else {"image": b[0], "label": b[1]}
        out.append({k: v.clone() for k, v in fields.items()})
    return out


def test_random_resized_crop_matches_torchvision(dataset: tuple[Path, dict[int, bytes]], sock: str) -> None:
    """Served RandomResizedCrop(64)+Flip equals torchvision's resized_crop (+hflip) of PIL's decode: PSNR >= 40 dB."""
    path, files = dataset
    tf = ringfeed.RandomResizedCrop(64) + ringfeed.Flip()
    with ringfeed.Loader(
        path, 7, transform=tf, layout="NCHW", fields=["index", "crop"], server=ringfeed.Server(socket=sock, spawn=True)
    ) as ld:
        worst, flips = math.inf, 0
        for epoch in range(3):
            ld.set_epoch(epoch)
            for b in batches(ld):
                for img, idx, crop in zip(b["image"], b["index"].tolist(), b["crop"].tolist(), strict=True):
                    top, left, h, w, flipped = crop
                    ref = tvf.resized_crop(reference_rgb(files[idx]), top, left, h, w, [64, 64], antialias=True)
                    if flipped:
                        ref = tvf.horizontal_flip(ref)
                        flips += 1
                    worst = min(worst, psnr(img, ref))
    assert worst >= 40.0, f"worst PSNR {worst:.1f} dB"
    assert 0 < flips < 42, "Flip() flips about half of the samples"


def test_center_crop_matches_torchvision(dataset: tuple[Path, dict[int, bytes]], sock: str) -> None:
    """Resize(64) + CenterCrop(56) equals torchvision's Resize(64) + CenterCrop(56) of PIL's decode, PSNR >= 40 dB."""
    path, files = dataset
    tf = ringfeed.Compose([ringfeed.Resize(64), ringfeed.CenterCrop(56)])
    with ringfeed.Loader(
        path,
        7,
        transform=tf,
        layout="NCHW",
        shuffle=False,
        fields=["index"],
        server=ringfeed.Server(socket=sock, spawn=True),
    ) as ld:
        worst = math.inf
        for b in batches(ld):
            for img, idx in zip(b["image"], b["index"].tolist(), strict=True):
                ref = tvf.center_crop(tvf.resize(reference_rgb(files[idx]), 64, antialias=True), [56, 56])
                worst = min(worst, psnr(img, ref))
    assert worst >= 40.0, f"worst PSNR {worst:.1f} dB"


def test_decoded_pixels_equal_pil(tmp_path: Path, sock: str) -> None:
    """A Resize to the image's own size returns PIL's decode (libjpeg-turbo, same IDCT): every pixel within 1."""
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    data = {}
    for i, (mode, kw) in enumerate([("RGB", {"quality": 90}), ("L", {"quality": 90}), ("RGB", {"subsampling": 0})]):
        data[i] = encode(photo(96, 72, 100 + i).convert(mode), "JPEG", **kw)
        (src / f"{i}.jpg").write_bytes(data[i])
    subprocess.run(
        [ringfeed_bin(), "pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--progress", "none"], check=True
    )
    tf = ringfeed.Resize((72, 96))
    with ringfeed.Loader(
        tmp_path / "ds", 3, transform=tf, layout="NCHW", shuffle=False, server=ringfeed.Server(socket=sock, spawn=True)
    ) as ld:
        (b,) = batches(ld)
    for i in range(3):
        diff = (b["image"][i].int() - reference_rgb(data[i]).int()).abs().max()
        assert int(diff) <= 1, f"image {i}: max difference {int(diff)}"


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def test_random_resized_crop_parameters_follow_torchvision(tmp_path: Path, sock: str) -> None:
    """Crop area, aspect ratio and position are distributed as torchvision's get_params draws them (two-sample KS)."""
    w, h, copies, epochs = 400, 300, 64, 30
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    data = encode(photo(w, h, 7), "JPEG", quality=80)
    for i in range(copies):
        (src / f"{i:03d}.jpg").write_bytes(data)
    subprocess.run(
        [ringfeed_bin(), "pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--progress", "none"], check=True
    )
    ours = []
    with ringfeed.Loader(
        tmp_path / "ds",
        copies,
        transform=ringfeed.RandomResizedCrop(8),
        fields=["crop"],
        server=ringfeed.Server(socket=sock, spawn=True),
    ) as ld:
        for epoch in range(epochs):
            ld.set_epoch(epoch)
            for b in batches(ld):
                ours += b["crop"].tolist()
    torch.manual_seed(0)
    img = torch.zeros(3, h, w)
    theirs = [list(TvRandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])) for _ in range(len(ours))]
    o, t = np.array(ours, dtype=np.float64), np.array(theirs, dtype=np.float64)
    # columns: top, left, height, width
    stats = {
        "area": ks_statistic(o[:, 2] * o[:, 3] / (w * h), t[:, 2] * t[:, 3] / (w * h)),
        "log aspect": ks_statistic(np.log(o[:, 3] / o[:, 2]), np.log(t[:, 3] / t[:, 2])),
        "top": ks_statistic(o[:, 0] / (h - o[:, 2] + 1), t[:, 0] / (h - t[:, 2] + 1)),
        "left": ks_statistic(o[:, 1] / (w - o[:, 3] + 1), t[:, 1] / (w - t[:, 3] + 1)),
    }
    # Critical value at alpha = 0.001 for two samples of 1,920: 1.95 * sqrt(2 / 1920) = 0.063.
    assert all(d < 0.063 for d in stats.values()), stats
    assert len({tuple(c) for c in ours}) > len(ours) * 0.9, "crops vary between samples and epochs"
