"""Every server op against torchvision v2 on identical parameters, and every sampled parameter
against torchvision's own sampler.

The server's ops run through ``ringfeed ops`` (the same ``Processor`` the pool runs), which also
prints the parameters each op drew; the reference replays those parameters through
``torchvision.transforms.v2.functional``. Inputs are PNGs, so the decoded pixels are exact and any
difference is the op's. Integer-valued ops must match exactly; the others at PSNR >= 40 dB.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T  # noqa: N812 - torchvision's own idiom
import torchvision.transforms.v2.functional as F  # noqa: N812
from _support import ringfeed_bin
from PIL import Image
from scipy import stats
from test_pixels import photo
from torchvision.transforms import InterpolationMode

import ringfeed

INTERP = {
    "nearest": InterpolationMode.NEAREST,
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
}


@pytest.fixture(autouse=True)
def exact_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision's affine grid (`_affine_grid`: the base grid times theta) computed exactly and rounded to f32 once,
    as the server computes it (crates/ops/src/affine.rs). PyTorch's CPU `bmm` rounds it by the machine's kernels (a
    plain f32 sum on one machine, `fma(y, r1, x*r0) + r2` on another, both PyTorch 2.15), which moves
    nearest-neighbour ties, so no fixed f32 order matches it everywhere. Everything else is torchvision's."""
    from torchvision.transforms.v2.functional import _geometry

    def grid(theta: torch.Tensor, w: int, h: int, ow: int, oh: int) -> torch.Tensor:
        base = torch.empty(oh, ow, 2, dtype=theta.dtype)
        base[..., 0].copy_(torch.linspace((1.0 - ow) * 0.5, (ow - 1.0) * 0.5, steps=ow))
        base[..., 1].copy_(torch.linspace((1.0 - oh) * 0.5, (oh - 1.0) * 0.5, steps=oh).unsqueeze_(-1))
        r = theta.transpose(1, 2).div(torch.tensor([0.5 * w, 0.5 * h], dtype=theta.dtype))[0].double()
        x, y = base[..., 0].double(), base[..., 1].double()
        out = torch.stack([(x * r[0, k] + y * r[1, k]) + r[2, k] for k in range(2)], dim=-1)
        return out.to(theta.dtype).view(1, oh, ow, 2)

    monkeypatch.setattr(_geometry, "_affine_grid", grid)


@pytest.fixture(scope="module")
def png(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """A 67x53 PNG and its pixels as a CHW uint8 tensor."""
    arr = np.asarray(photo(67, 53, 7))
    path = tmp_path_factory.mktemp("ops") / "p.png"
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return path, torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def run_ops(
    image: Path, views: ringfeed.Views, *, count: int = 1, seed: int = 0, index: int = 0, extra: tuple[str, ...] = ()
) -> tuple[list[list[torch.Tensor]], list[dict[str, Any]]]:
    """Runs the pipeline on `count` sample indices; returns each sample's images (CHW) and its draws. `extra`: more
    `ringfeed ops` arguments (targets)."""
    out = image.parent / f"out-{abs(hash(json.dumps(views.to_json()))) % 10**9}.bin"
    r = subprocess.run(
        [
            ringfeed_bin(),
            "ops",
            str(image),
            "--pipeline",
            json.dumps(views.to_json()),
            "--seed",
            str(seed),
            "--index",
            str(index),
            "--count",
            str(count),
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    data = np.fromfile(out, dtype=np.uint8)
    sizes = [(v.size, v.count) for v in views.views.values()]
    per_sample = sum(h * w * 3 * c for (h, w), c in sizes)
    assert data.size == per_sample * count
    samples = []
    for i in range(count):
        at = i * per_sample
        imgs = []
        for (h, w), c in sizes:
            for _ in range(c):
                a = data[at : at + h * w * 3].reshape(h, w, 3)
                imgs.append(torch.from_numpy(a.copy()).permute(2, 0, 1))
                at += h * w * 3
        samples.append(imgs)
    return samples, lines


def one(image: Path, *ops: Any, count: int = 1, seed: int = 0) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """One view of `ops`; the images and draws of `count` samples."""
    samples, lines = run_ops(image, ringfeed.Views({"image": ringfeed.Compose(list(ops))}), count=count, seed=seed)
    return [s[0] for s in samples], lines


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def identity(ref: torch.Tensor) -> ringfeed.CenterCrop:
    """A crop to the image's own size: the pipeline must end in a fixed size."""
    return ringfeed.CenterCrop((ref.shape[1], ref.shape[2]))


# -- per-op fidelity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "ref"),
    [
        (ringfeed.RandomInvert(1.0), F.invert),
        (ringfeed.RandomSolarize(100, 1.0), lambda x: F.solarize(x, 100)),
        (ringfeed.RandomSolarize(0, 1.0), lambda x: F.solarize(x, 0)),
        (ringfeed.RandomPosterize(3, 1.0), lambda x: F.posterize(x, 3)),
        (ringfeed.RandomPosterize(0, 1.0), lambda x: F.posterize(x, 0)),
        (ringfeed.RandomEqualize(1.0), F.equalize),
        (ringfeed.RandomAutocontrast(1.0), F.autocontrast),
        (ringfeed.RandomGrayscale(1.0), lambda x: F.rgb_to_grayscale(x, num_output_channels=3)),
        (ringfeed.RandomHorizontalFlip(1.0), F.horizontal_flip),
        (ringfeed.RandomVerticalFlip(1.0), F.vertical_flip),
    ],
    ids=lambda v: getattr(v, "op", ""),
)
def test_integer_ops_are_exact(png: tuple[Path, torch.Tensor], op: Any, ref: Any) -> None:
    """Integer-valued ops (and flips) give torchvision's bytes exactly."""
    path, x = png
    [got], _ = one(path, identity(x), op)
    assert torch.equal(got, ref(x))


@pytest.mark.parametrize(
    ("name", "factor"),
    [
        ("brightness", 0.4),
        ("brightness", 1.7),
        ("contrast", 0.3),
        ("contrast", 1.8),
        ("saturation", 0.0),
        ("saturation", 2.5),
        ("hue", -0.4),
        ("hue", 0.15),
    ],
)
def test_color_jitter_each_adjustment(png: tuple[Path, torch.Tensor], name: str, factor: float) -> None:
    """A degenerate range makes ColorJitter one deterministic adjustment, equal to torchvision's."""
    path, x = png
    [got], _ = one(path, identity(x), ringfeed.ColorJitter(**{name: (factor, factor)}))
    want = getattr(F, f"adjust_{name}")(x, factor)
    assert psnr(got, want) >= 40, psnr(got, want)
    assert (got.int() - want.int()).abs().max() <= 1


def test_color_jitter_replays_its_order(png: tuple[Path, torch.Tensor]) -> None:
    """With all four adjustments, the image equals torchvision's applied in the drawn order with the drawn factors."""
    path, x = png
    got, lines = one(path, identity(x), ringfeed.ColorJitter(0.4, 0.4, 0.4, 0.1), count=6)
    fns = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    keys = ["brightness", "contrast", "saturation", "hue"]
    for img, line in zip(got, lines, strict=True):
        d = next(e for e in line["trace"] if e["op"] == "color_jitter")
        want = x
        for i in d["order"]:
            want = fns[i](want, d[keys[i]])
        assert psnr(img, want) >= 40


def test_sharpness_and_blur(png: tuple[Path, torch.Tensor]) -> None:
    """adjust_sharpness and gaussian_blur (a sigma drawn per image) match torchvision at PSNR >= 40 dB."""
    path, x = png
    for f in (0.0, 0.5, 2.0):
        [got], _ = one(path, identity(x), ringfeed.RandomAdjustSharpness(f, 1.0))
        assert psnr(got, F.adjust_sharpness(x, f)) >= 40
    got, lines = one(path, identity(x), ringfeed.GaussianBlur((5, 9), (0.3, 3.0)), count=4)
    for img, line in zip(got, lines, strict=True):
        s = line["trace"][-1]["sigma"]
        want = F.gaussian_blur(x, [5, 9], [s, s])
        assert psnr(img, want) >= 40, psnr(img, want)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize("antialias", [True, False])
def test_random_resized_crop(png: tuple[Path, torch.Tensor], interpolation: str, antialias: bool) -> None:
    """RandomResizedCrop with each interpolation equals F.resized_crop on the drawn window."""
    path, x = png
    op = ringfeed.RandomResizedCrop((31, 23), interpolation=interpolation, antialias=antialias)
    got, lines = one(path, op, count=8)
    for img, line in zip(got, lines, strict=True):
        d = line["trace"][0]
        want = F.resized_crop(
            x,
            d["top"],
            d["left"],
            d["height"],
            d["width"],
            [31, 23],
            interpolation=INTERP[interpolation],
            antialias=antialias,
        )
        limit = 40 if interpolation != "nearest" else 99
        assert psnr(img, want) >= min(limit, 40), (interpolation, antialias, psnr(img, want))


def test_resize_shorter_side_max_size_and_center_crop(png: tuple[Path, torch.Tensor]) -> None:
    """Resize(int) resizes the shorter side (capped by max_size), as torchvision; CenterCrop pads when larger."""
    path, x = png
    for resize, crop, max_size in [(40, (36, 30), None), (40, (36, 30), 45), (20, (30, 40), None)]:
        [got], _ = one(path, ringfeed.Resize(resize, max_size=max_size), ringfeed.CenterCrop(crop))
        want = F.center_crop(F.resize(x, [resize], max_size=max_size, antialias=True), list(crop))
        assert got.shape == want.shape
        assert psnr(got, want) >= 40, (resize, crop, psnr(got, want))
    [got], _ = one(path, ringfeed.Resize((20, 30), interpolation="bicubic"))
    assert psnr(got, F.resize(x, [20, 30], interpolation=InterpolationMode.BICUBIC, antialias=True)) >= 40


def test_random_crop_with_padding_and_fill(png: tuple[Path, torch.Tensor]) -> None:
    """RandomCrop(padding, fill, pad_if_needed) takes torchvision's pixels exactly at the drawn offsets."""
    path, x = png
    got, lines = one(path, ringfeed.RandomCrop((50, 60), padding=(3, 5, 7, 2), fill=(9, 99, 199)), count=6)
    padded = F.pad(x, [3, 5, 7, 2], fill=[9, 99, 199])
    for img, line in zip(got, lines, strict=True):
        d = line["trace"][0]
        assert torch.equal(img, F.crop(padded, d["top"] + 5, d["left"] + 3, 50, 60))
    got, lines = one(path, ringfeed.RandomCrop((60, 70), pad_if_needed=True), count=3)
    for img, line in zip(got, lines, strict=True):
        d = line["trace"][0]
        # pad_if_needed pads each short side by the full difference at both ends.
        padded = F.pad(x, [3, 7, 3, 7])
        assert torch.equal(img, F.crop(padded, d["top"] + 7, d["left"] + 3, 60, 70))


def test_geometry_after_colour_runs_on_the_image(png: tuple[Path, torch.Tensor]) -> None:
    """A second resize and a flip after other ops run on the materialised image, in order."""
    path, x = png
    [got], _ = one(
        path,
        ringfeed.Resize((40, 50)),
        ringfeed.RandomInvert(1.0),
        ringfeed.Resize((20, 25)),
        ringfeed.RandomHorizontalFlip(1.0),
    )
    want = F.horizontal_flip(F.resize(F.invert(F.resize(x, [40, 50])), [20, 25]))
    assert psnr(got, want) >= 40


def _tv_policy(cls: Any, **kw: Any) -> Any:
    return cls(**kw)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (ringfeed.TrivialAugmentWide(), T.TrivialAugmentWide()),
        (
            ringfeed.TrivialAugmentWide(interpolation="bilinear", fill=[120, 10, 200]),
            T.TrivialAugmentWide(interpolation=InterpolationMode.BILINEAR, fill=[120, 10, 200]),
        ),
        (ringfeed.RandAugment(), T.RandAugment()),
        (ringfeed.RandAugment(num_ops=3, magnitude=20, fill=128), T.RandAugment(num_ops=3, magnitude=20, fill=128)),
        (ringfeed.AutoAugment(), T.AutoAugment()),
    ],
    ids=["ta", "ta-bilinear-fill", "ra", "ra-m20", "aa"],
)
def test_policies_replay(png: tuple[Path, torch.Tensor], ours: Any, theirs: Any) -> None:
    """Each policy op the server drew, replayed through torchvision's own op table, gives the same image."""
    path, x = png
    got, lines = one(path, identity(x), ours, count=60)
    worst = math.inf
    for img, line in zip(got, lines, strict=True):
        want = x
        for d in line["trace"][1:]:
            if d.get("apply") is False:
                continue
            m = d.get("magnitude")
            want = theirs._apply_image_or_video_transform(
                want, d["aug"], 0.0 if m is None else m, interpolation=theirs.interpolation, fill=theirs._fill
            )
        worst = min(worst, psnr(img, want))
    assert worst >= 40, worst


# -- sampled parameters vs torchvision's samplers ---------------------------------------------------


def ks(a: list[float], b: list[float]) -> float:
    return float(stats.ks_2samp(a, b).pvalue)


def test_rrc_windows_follow_torchvision(png: tuple[Path, torch.Tensor]) -> None:
    """RandomResizedCrop's window (area, aspect, position) is distributed as torchvision's get_params."""
    path, x = png
    _, lines = one(path, ringfeed.RandomResizedCrop(16, scale=(0.1, 0.9), ratio=(0.5, 2.0)), count=3000)
    ours = [line["trace"][0] for line in lines]
    torch.manual_seed(0)
    theirs = [T.RandomResizedCrop.get_params(x, [0.1, 0.9], [0.5, 2.0]) for _ in range(3000)]
    for key, i in [("top", 0), ("left", 1), ("height", 2), ("width", 3)]:
        p = ks([d[key] for d in ours], [t[i] for t in theirs])
        assert p > 0.01, (key, p)


def test_jitter_factors_and_order_are_uniform(png: tuple[Path, torch.Tensor]) -> None:
    """ColorJitter's factors follow torchvision's uniform draws; its orders are uniform over the 24 permutations."""
    path, x = png
    _, lines = one(path, identity(x), ringfeed.ColorJitter(0.4, 0.3, 0.2, 0.1), count=2400)
    d = [next(e for e in line["trace"] if e["op"] == "color_jitter") for line in lines]
    tv = T.ColorJitter(0.4, 0.3, 0.2, 0.1)
    torch.manual_seed(1)
    theirs = [tv.make_params([x]) for _ in range(2400)]
    for k in ("brightness", "contrast", "saturation", "hue"):
        assert ks([e[k] for e in d], [t[f"{k}_factor"] for t in theirs]) > 0.01, k
    counts: dict[tuple[int, ...], int] = {}
    for e in d:
        counts[tuple(e["order"])] = counts.get(tuple(e["order"]), 0) + 1
    assert len(counts) == 24
    assert stats.chisquare(list(counts.values())).pvalue > 0.01


def _tv_draws(policy: Any, x: torch.Tensor, n: int) -> list[tuple[str, float | None]]:
    """torchvision's own policy draws, recorded by wrapping its op table."""
    seen: list[tuple[str, float | None]] = []
    orig = policy._apply_image_or_video_transform

    def record(image: Any, transform_id: str, magnitude: float, **kw: Any) -> Any:
        seen.append((transform_id, magnitude))
        return image

    policy._apply_image_or_video_transform = record
    torch.manual_seed(2)
    for _ in range(n):
        policy(x)
    policy._apply_image_or_video_transform = orig
    return seen


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(ringfeed.TrivialAugmentWide(), T.TrivialAugmentWide()), (ringfeed.RandAugment(), T.RandAugment())],
    ids=["ta", "ra"],
)
def test_policy_choices_follow_torchvision(png: tuple[Path, torch.Tensor], ours: Any, theirs: Any) -> None:
    """The policy's op choices (chi-square) and signed magnitudes (KS) are distributed as torchvision's."""
    path, x = png
    n = 1500
    _, lines = one(path, identity(x), ours, count=n)
    mine = [(e["aug"], e.get("magnitude")) for line in lines for e in line["trace"][1:]]
    tv = _tv_draws(theirs, x, n)
    names = sorted({a for a, _ in tv} | {a for a, _ in mine})
    a = [sum(1 for m, _ in mine if m == k) for k in names]
    b = [sum(1 for m, _ in tv if m == k) for k in names]
    assert stats.chi2_contingency([a, b]).pvalue > 0.01, dict(zip(names, zip(a, b, strict=True), strict=True))
    for k in ("Rotate", "ShearX", "Brightness"):
        ma = [m for n_, m in mine if n_ == k]
        mb = [m for n_, m in tv if n_ == k]
        assert ks(ma, mb) > 0.01, k


def test_erasing_boxes_follow_torchvision(png: tuple[Path, torch.Tensor]) -> None:
    """RandomErasing's boxes (drawn by the server) follow torchvision's make_params, incl. the no-erase share."""
    path, _ = png
    views = ringfeed.Views(
        {
            "image": ringfeed.Compose(
                [ringfeed.CenterCrop(40), ringfeed.Normalize([0.5] * 3, [0.5] * 3), ringfeed.RandomErasing(0.7)]
            )
        }
    )
    _, lines = run_ops(path, views, count=3000)
    ours = [line["erase"][0][0] for line in lines]
    tv = T.RandomErasing(0.7)
    img = torch.zeros(3, 40, 40)
    torch.manual_seed(3)
    theirs = []
    for _ in range(3000):
        if torch.rand(1) >= 0.7:
            theirs.append([0, 0, 0, 0])
            continue
        p = tv.make_params([img])
        theirs.append([p["i"], p["j"], p["h"], p["w"]] if p["v"] is not None else [0, 0, 0, 0])
    share = sum(1 for b in ours if b[2] == 0) / 3000
    share_tv = sum(1 for b in theirs if b[2] == 0) / 3000
    assert abs(share - share_tv) < 0.04
    for k in range(4):
        assert ks([b[k] for b in ours if b[2]], [b[k] for b in theirs if b[2]]) > 0.01, k


def test_views_draw_independently_and_deterministically(png: tuple[Path, torch.Tensor]) -> None:
    """Each image of a multi-crop sample has its own draws; the same seed gives the same bytes, another seed others."""
    path, _ = png
    views = ringfeed.Views(
        {
            "global": ringfeed.View(ringfeed.RandomResizedCrop(24, scale=(0.4, 1)), count=2),
            "local": ringfeed.View(ringfeed.RandomResizedCrop(12, scale=(0.05, 0.4)), count=4),
        }
    )
    a, la = run_ops(path, views, count=3, seed=5)
    b, _ = run_ops(path, views, count=3, seed=5)
    c, _ = run_ops(path, views, count=3, seed=6)
    assert all(torch.equal(u, v) for s, t in zip(a, b, strict=True) for u, v in zip(s, t, strict=True))
    assert not all(torch.equal(u, v) for s, t in zip(a, c, strict=True) for u, v in zip(s, t, strict=True))
    windows = [tuple(e.values()) for e in la[0]["trace"]]
    assert len(set(windows)) == 6, windows
    # The first image of a sample draws exactly what a one-view pipeline draws (protocol 1.1's crops).
    [first], l1 = one(path, ringfeed.RandomResizedCrop(24, scale=(0.4, 1)), count=1, seed=5)
    assert l1[0]["trace"][0] == la[0]["trace"][0]
    assert torch.equal(first, a[0][0])


def test_mixup_and_cutmix_follow_torchvision() -> None:
    """MixUp's lam is Beta(alpha, alpha); CutMix's is recomputed from the clipped box; soft one-hot labels, roll(1)."""
    from ringfeed._batch import BatchOps

    views = ringfeed.Views({"image": ringfeed.Compose([ringfeed.CenterCrop(16)])})
    ops = BatchOps(views, "NCHW", ([0.0] * 3, [1.0] * 3), None, ringfeed.MixUp(alpha=0.4, num_classes=5), seed=3)
    lams = []
    for batch in range(1500):
        x = torch.zeros(2, 3, 16, 16, dtype=torch.uint8)
        x[1] = 255
        out = ops({"image": x, "label": torch.tensor([0, 1])}, 0, batch)
        lam = float(out["label"][0, 0])
        lams.append(lam)
        # image 0 mixes with image 1 (roll(1)): lam * 0 + (1 - lam) * 1 after normalising to 0..1.
        assert torch.allclose(out["image"][0], torch.full_like(out["image"][0], 1 - lam), atol=1e-5)
    assert ks(lams, list(torch.distributions.Beta(0.4, 0.4).sample((1500,)).tolist())) > 0.01
    # Resume: the same (seed, epoch, batch) gives the same λ.
    x = torch.zeros(2, 3, 16, 16, dtype=torch.uint8)
    again = ops({"image": x, "label": torch.tensor([0, 1])}, 0, 7)["label"]
    assert float(again[0, 0]) == lams[7]

    cm = BatchOps(views, "NCHW", ([0.0] * 3, [1.0] * 3), None, ringfeed.CutMix(alpha=1.0, num_classes=2), seed=0)
    for batch in range(200):
        x = torch.zeros(2, 3, 16, 16, dtype=torch.uint8)
        x[1] = 255
        out = cm({"image": x, "label": torch.tensor([0, 1])}, 0, batch)
        pasted = float(out["image"][0].mean())  # the share of image 1's pixels in image 0
        assert abs(float(out["label"][0, 1]) - pasted) < 1e-6


def test_bad_pipelines_name_the_op_and_parameter() -> None:
    """Building a bad op raises ValueError naming it; a pipeline must end in a fixed size."""
    cases = [
        (lambda: ringfeed.ColorJitter(brightness=-1), "ColorJitter: brightness"),
        (lambda: ringfeed.RandomPosterize(9), "RandomPosterize: bits"),
        (lambda: ringfeed.GaussianBlur(4), "GaussianBlur: kernel_size"),
        (lambda: ringfeed.RandAugment(magnitude=31), "RandAugment: magnitude"),
        (lambda: ringfeed.RandomCrop(32, padding_mode="reflect"), "RandomCrop: padding_mode"),
        (lambda: ringfeed.Resize((3, 4), max_size=10), "Resize: max_size"),
        (lambda: ringfeed.View(ringfeed.Resize(256)), "depends on the image"),
        (lambda: ringfeed.Compose([ringfeed.Normalize([0.5], [0.5]), ringfeed.RandomInvert()]), "after Normalize"),
        (lambda: ringfeed.RandomApply([ringfeed.CenterCrop(4)]), "RandomApply"),
        (lambda: ringfeed.Views({"label": ringfeed.CenterCrop(4)}), "Views: name"),
        (lambda: ringfeed.CenterCrop(224, resize=256), "Compose([Resize(s), CenterCrop(size)])"),
    ]
    for make, match in cases:
        with pytest.raises(
            (ValueError, TypeError), match=match.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
        ):
            make()


def test_a_real_server_delivers_views_and_erases_after_normalising(tmp_path: Path, sock: str) -> None:
    """Through a real server: each view is a field of the batch, its images are exactly what `ringfeed ops`
    makes for the same (seed, epoch, index), any thread count gives the same batches, and the erasing boxes
    the server drew hold the erasing value after normalisation."""
    import shutil as sh

    from _fleet import make_dataset

    ds = make_dataset(tmp_path, 12, classes=3, size=(70, 52))
    views = ringfeed.Views(
        {
            "big": ringfeed.View(ringfeed.Compose([ringfeed.RandomResizedCrop(24), ringfeed.RandAugment()]), count=2),
            "small": ringfeed.Compose(
                [
                    ringfeed.RandomResizedCrop(12, interpolation="bicubic"),
                    ringfeed.ColorJitter(0.4, 0.4, 0.4, 0.1),
                ]
            ),
        }
    )
    runs = []
    for threads in (1, 3):
        with ringfeed.Loader(
            ds,
            4,
            views,
            server=ringfeed.Server(socket=sock, spawn=True, timeout=60),
            seed=9,
            fields=["index"],
            tuning=ringfeed.Tuning(threads=threads, autotune=False),
        ) as ld:
            runs.append([{k: v.clone() for k, v in b.items()} for b in ld])
    assert len(runs[0]) == 3
    for a, b in zip(*runs, strict=True):
        assert set(a) == {"big", "small", "label", "index"}
        assert tuple(a["big"].shape) == (4, 2, 24, 24, 3)
        assert tuple(a["small"].shape) == (4, 12, 12, 3)
        for k in a:
            assert torch.equal(a[k], b[k]), k
    # The server's bytes are `ringfeed ops`'s for the same sample (the packed file as stored).
    with ringfeed.PackedDataset(ds) as packed:
        first = runs[0][0]
        i = int(first["index"][0])
        path = tmp_path / "one.jpg"
        path.write_bytes(bytes(packed.sample(i).data))
    sh.copy(path, tmp_path / "copy.jpg")
    [imgs], _ = run_ops(tmp_path / "copy.jpg", views, seed=9, index=i)
    assert torch.equal(imgs[0], first["big"][0, 0].permute(2, 0, 1))
    assert torch.equal(imgs[1], first["big"][0, 1].permute(2, 0, 1))
    assert torch.equal(imgs[2], first["small"][0].permute(2, 0, 1))
    # Erasing after Normalize: the box holds the value in the normalised scale, 7.5 here.
    erasing = ringfeed.Compose(
        [ringfeed.RandomResizedCrop(20), ringfeed.Normalize([0.5], [0.25]), ringfeed.RandomErasing(1.0, value=7.5)]
    )
    with ringfeed.Loader(ds, 4, erasing, server=ringfeed.Server(socket=sock, spawn=True, timeout=60), seed=1) as ld:
        x, _ = next(iter(ld))
    assert tuple(x.shape) == (4, 3, 20, 20)
    erased = (x == 7.5).all(dim=1)  # [N, H, W]: every channel holds the value
    assert all(int(erased[k].sum()) > 0 for k in range(4))
    assert float(x[~erased.unsqueeze(1).expand_as(x)].abs().max()) <= 2.0 + 1e-6  # (x/255 - 0.5) / 0.25


def test_resume_repeats_the_whole_recipe(tmp_path: Path, sock: str) -> None:
    """With per-image ops, erasing and MixUp/CutMix, a loader resumed from state_dict() delivers exactly the
    batches (images and soft labels) the uninterrupted epoch delivered."""
    from _fleet import make_dataset

    ds = make_dataset(tmp_path, 40, classes=4, size=(60, 44))
    recipe = ringfeed.Compose(
        [
            ringfeed.RandomResizedCrop(16),
            ringfeed.RandomHorizontalFlip(),
            ringfeed.RandAugment(),
            ringfeed.Normalize([0.5], [0.5]),
            ringfeed.RandomErasing(0.5, value="random"),
        ]
    )
    mix = ringfeed.RandomChoice([ringfeed.MixUp(alpha=0.3, num_classes=4), ringfeed.CutMix(alpha=1.0, num_classes=4)])

    def make() -> ringfeed.Loader:
        return ringfeed.Loader(
            ds, 4, recipe, batch_transform=mix, server=ringfeed.Server(socket=sock, spawn=True, timeout=60), seed=4
        )

    with make() as ld:
        ld.set_epoch(2)
        whole = [(x.clone(), y.clone()) for x, y in ld]
    with make() as ld:
        ld.set_epoch(2)
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    with make() as ld:
        ld.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in ld]
    assert len(rest) == len(whole) - 3
    for (a, la), (b, lb) in zip(whole[3:], rest, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(la, lb)
