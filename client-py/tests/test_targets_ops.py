"""Detection and segmentation targets (control 1.10) against torchvision v2 on identical parameters.

The server's ops run through ``ringfeed ops --boxes --labels --keypoints --instance-masks --mask`` (the same
``Processor::run_targets`` the pool runs), which prints the parameters each op drew and the targets it moved. The
reference replays those parameters through ``torchvision.transforms.v2.functional`` on ``tv_tensors.BoundingBoxes``
(XYXY, ``clamping_mode="hard"``), ``tv_tensors.KeyPoints`` and ``tv_tensors.Mask`` (the label map, and the instance
masks ``[M, H, W]`` whose uncovered pixels are 0), then ``sanitize_bounding_boxes`` (whose ``valid`` indexes the
keypoints and instance masks too). Boxes and keypoints must agree within 1e-4 px with the same boxes kept, in the same
order, with the same labels; masks exactly.
"""

from __future__ import annotations

import io
import itertools
import json
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T  # noqa: N812 - torchvision's own idiom
import torchvision.transforms.v2.functional as F  # noqa: N812
from PIL import Image
from test_ops import exact_grid, run_ops  # noqa: F401 - the fixture applies to these tests too
from test_pixels import photo
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode

import ringfeed

W, H = 83, 61
#: Keypoints per box in the sample (``[x, y, v]``, ``v`` carried unchanged).
KP = 3
GEOMETRIC = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An 83x61 PNG, 12 boxes inside it (some thin, some at the edges), their labels, ``KP`` keypoints per box (some
    outside the image, fractional), an instance mask per box (random pixels), and a label map of random labels (every
    pixel its own, so a nearest index off by one shows)."""
    d = tmp_path_factory.mktemp("targets")
    rng = np.random.default_rng(5)
    path = d / "p.png"
    buf = io.BytesIO()
    Image.fromarray(np.asarray(photo(W, H, 3))).save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    x0 = rng.uniform(-2, W - 5, 12)
    y0 = rng.uniform(-2, H - 5, 12)
    boxes = np.stack([x0, y0, x0 + rng.uniform(0.5, 40, 12), y0 + rng.uniform(0.5, 30, 12)], 1)
    boxes[0] = [0, 0, W, H]
    boxes[1] = [W - 3.25, 10.5, W, 30.75]
    boxes = np.clip(boxes, 0, [W, H, W, H]).astype(np.float32)
    mask = rng.integers(0, 250, (H, W), dtype=np.uint8)
    (d / "mask.bin").write_bytes(mask.tobytes())
    instances = (rng.random((12, H, W)) < 0.4).astype(np.uint8)
    (d / "instances.bin").write_bytes(instances.tobytes())
    kps = np.stack(
        [rng.uniform(-3, W + 3, (12, KP)), rng.uniform(-3, H + 3, (12, KP)), rng.integers(0, 3, (12, KP))], -1
    ).astype(np.float32)
    return {
        "keypoints": kps.tolist(),
        "path": path,
        "boxes": boxes.tolist(),
        "labels": [int(v) for v in rng.integers(1, 90, 12)],
        "mask": torch.from_numpy(mask),
        "mask_path": d / "mask.bin",
        "instances": torch.from_numpy(instances),
        "instances_path": d / "instances.bin",
    }


def run_targets(
    sample: dict[str, Any],
    *ops: Any,
    size: tuple[int, int],
    count: int,
    mask_fill: int = 0,
    min_size: float = 1.0,
    min_area: float = 1.0,
    seed: int = 0,
) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """Each sample's `ringfeed ops` line (draws, moved boxes, labels and keypoints), its output mask, and its kept
    boxes' instance masks ``[M, *size]``."""
    views = ringfeed.Views({"image": ringfeed.Compose(list(ops))})
    mask_out = sample["path"].parent / f"masks-{abs(hash(json.dumps(views.to_json()))) % 10**9}-{seed}.bin"
    extra = (
        "--boxes",
        json.dumps(sample["boxes"]),
        "--labels",
        json.dumps(sample["labels"]),
        "--keypoints",
        json.dumps(sample["keypoints"]),
        "--instance-masks",
        str(sample["instances_path"]),
        "--instance-masks-out",
        str(mask_out.with_suffix(".inst")),
        "--mask",
        str(sample["mask_path"]),
        "--mask-out",
        str(mask_out),
        "--mask-fill",
        str(mask_fill),
        "--min-size",
        str(min_size),
        "--min-area",
        str(min_area),
    )
    _, lines = run_ops(sample["path"], views, count=count, seed=seed, extra=extra)
    masks = torch.from_numpy(np.fromfile(mask_out, dtype=np.uint8).reshape(count, *size).copy())
    flat = np.fromfile(mask_out.with_suffix(".inst"), dtype=np.uint8)
    counts = [len(line["boxes"]) for line in lines]
    assert flat.size == sum(counts) * size[0] * size[1]
    ends = np.cumsum([0, *counts]) * size[0] * size[1]
    instances = [torch.from_numpy(flat[a:b].reshape(-1, *size).copy()) for a, b in itertools.pairwise(ends)]
    return list(zip(lines, masks, instances, strict=True))


def crop_filled(m: torch.Tensor, top: int, left: int, h: int, w: int, fill: int) -> torch.Tensor:
    """F.crop of a mask whose outside is `fill` (F.pad with fill, then F.crop)."""
    mh, mw = m.shape[-2:]
    pl, pt = max(0, -left), max(0, -top)
    pr, pb = max(0, left + w - mw), max(0, top + h - mh)
    if pl or pt or pr or pb:
        m = F.pad(m, [pl, pt, pr, pb], fill=fill)
    return F.crop(m, top + pt, left + pl, h, w)


class Replay:
    """The sample's targets as tv_tensors, moved by torchvision v2's functionals with the drawn parameters."""

    def __init__(self, sample: dict[str, Any], mask_fill: int) -> None:
        self.boxes = tv_tensors.BoundingBoxes(
            torch.tensor(sample["boxes"]), format="XYXY", canvas_size=(H, W), clamping_mode="hard"
        )
        self.labels = torch.tensor(sample["labels"])
        kps = torch.tensor(sample["keypoints"])
        self.points = tv_tensors.KeyPoints(kps[..., :2], canvas_size=(H, W))
        self.visibility = kps[..., 2:]
        self.mask = tv_tensors.Mask(sample["mask"].clone())
        self.instances = tv_tensors.Mask(sample["instances"].clone())
        self.fill = mask_fill

    @property
    def size(self) -> tuple[int, int]:
        return self.boxes.canvas_size

    def both(self, f: Any, **kw: Any) -> None:
        """``f`` on every target (the name stays: boxes and mask came first)."""
        self.boxes = f(self.boxes, **kw)
        self.points = f(self.points, **kw)
        self.mask = f(self.mask, **kw)
        self.instances = f(self.instances, **kw)

    def crop(self, top: int, left: int, h: int, w: int) -> None:
        """A crop that may reach outside (padding): boxes by F.crop, the mask padded with the mask fill."""
        self.boxes = F.crop(self.boxes, top, left, h, w)
        self.points = F.crop(self.points, top, left, h, w)
        self.mask = tv_tensors.wrap(crop_filled(self.mask, top, left, h, w, self.fill), like=self.mask)
        self.instances = tv_tensors.wrap(crop_filled(self.instances, top, left, h, w, 0), like=self.instances)

    def random_crop(self, d: dict[str, Any], op: dict[str, Any]) -> None:
        """RandomCrop.transform: F.pad with the padding make_params computed, then F.crop."""
        (ch, cw) = op["size"]
        pl, pt, pr, pb = op.get("padding", [0, 0, 0, 0])
        h, w = self.size
        if op.get("pad_if_needed"):
            if h + pt + pb < ch:
                diff = ch - (h + pt + pb)
                pt, pb = pt + diff, pb + diff
            if w + pl + pr < cw:
                diff = cw - (w + pl + pr)
                pl, pr = pl + diff, pr + diff
        if pl or pt or pr or pb:
            self.boxes = F.pad(self.boxes, [pl, pt, pr, pb])
            self.points = F.pad(self.points, [pl, pt, pr, pb])
            self.mask = F.pad(self.mask, [pl, pt, pr, pb], fill=self.fill)
            self.instances = F.pad(self.instances, [pl, pt, pr, pb], fill=0)
        if self.size != (ch, cw):
            self.both(F.crop, top=d["top"] + pt, left=d["left"] + pl, height=ch, width=cw)

    def step(self, d: dict[str, Any], op: dict[str, Any], policy: Any) -> None:
        name = d["op"]
        if name == "random_resized_crop":
            self.both(F.crop, top=d["top"], left=d["left"], height=d["height"], width=d["width"])
            self.resize(op["size"])
        elif name == "resize":
            self.resize([d["height"], d["width"]])
        elif name in ("horizontal_flip", "vertical_flip"):
            if d["flip"]:
                self.both(F.horizontal_flip if name == "horizontal_flip" else F.vertical_flip)
        elif name == "center_crop":
            # Our offsets are the image's (torchvision's own box anchor differs by one: see the test below).
            self.crop(d["top"], d["left"], *op["size"])
        elif name == "random_crop":
            self.random_crop(d, op)
        elif name == "scale_jitter":
            self.resize([d["height"], d["width"]])
        elif name == "random_zoom_out":
            if d["apply"]:
                self.boxes = F.pad(self.boxes, d["padding"])
                self.points = F.pad(self.points, d["padding"])
                self.mask = F.pad(self.mask, d["padding"], fill=self.fill)
                self.instances = F.pad(self.instances, d["padding"], fill=0)
        elif name == "random_iou_crop":
            if d["apply"]:
                self.iou_crop(d)
        elif name in ("trivial_augment_wide", "rand_augment", "auto_augment"):
            if d.get("apply") is not False and d["aug"] in GEOMETRIC:
                m = d.get("magnitude") or 0.0
                fill = {tv_tensors.Mask: self.fill, tv_tensors.BoundingBoxes: None, tv_tensors.KeyPoints: None}
                move = policy._apply_image_or_video_transform
                self.boxes = move(self.boxes, d["aug"], m, policy.interpolation, fill)
                self.points = move(self.points, d["aug"], m, policy.interpolation, fill)
                self.mask = move(self.mask, d["aug"], m, policy.interpolation, fill)
                self.instances = move(self.instances, d["aug"], m, policy.interpolation, {tv_tensors.Mask: 0})
        else:
            assert name in ("color_jitter", "invert", "solarize", "grayscale"), name

    def iou_crop(self, d: dict[str, Any]) -> None:
        """RandomIoUCrop.transform: F.crop, and the boxes whose centre was outside zeroed (sanitize removes them)."""
        b = self.boxes.as_subclass(torch.Tensor)
        cx, cy = 0.5 * (b[:, 0] + b[:, 2]), 0.5 * (b[:, 1] + b[:, 3])
        left, top = d["left"], d["top"]
        right, bottom = left + d["width"], top + d["height"]
        within = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
        self.both(F.crop, top=top, left=left, height=d["height"], width=d["width"])
        self.boxes[~within] = 0

    def resize(self, size: list[int]) -> None:
        self.boxes = F.resize(self.boxes, size)
        self.points = F.resize(self.points, size)
        self.mask = F.resize(self.mask, size, interpolation=InterpolationMode.NEAREST)
        self.instances = F.resize(self.instances, size, interpolation=InterpolationMode.NEAREST)

    def sanitize(self, min_size: float, min_area: float) -> None:
        self.boxes, valid = F.sanitize_bounding_boxes(self.boxes, min_size=min_size, min_area=min_area)
        self.labels = self.labels[valid]
        self.points = tv_tensors.wrap(self.points[valid], like=self.points)
        self.visibility = self.visibility[valid]
        self.instances = tv_tensors.wrap(self.instances[valid], like=self.instances)

    def keypoints(self) -> torch.Tensor:
        """``[M, KP, 3]``: the moved ``[x, y]`` with the visibility carried along."""
        return torch.cat([self.points.as_subclass(torch.Tensor), self.visibility], dim=-1)


def check(
    sample: dict[str, Any],
    ops: list[Any],
    size: tuple[int, int],
    *,
    count: int = 40,
    mask_fill: int = 0,
    policy: Any = None,
    min_size: float = 1.0,
    min_area: float = 1.0,
) -> list[dict[str, Any]]:
    """Runs `ops` on `count` samples and compares every sample's targets with torchvision's replay of its draws."""
    specs = {o.to_json()["op"]: o.to_json() for o in ops}
    results = run_targets(
        sample, *ops, size=size, count=count, mask_fill=mask_fill, min_size=min_size, min_area=min_area
    )
    for line, mask, instances in results:
        r = Replay(sample, mask_fill)
        for d in line["trace"]:
            r.step(d, specs.get(d["op"], {}), policy)
        assert tuple(r.size) == size
        r.sanitize(min_size, min_area)
        got = torch.tensor(line["boxes"], dtype=torch.float32).reshape(-1, 4)
        assert got.shape == r.boxes.shape, (line["trace"], got, r.boxes)
        assert torch.allclose(got, r.boxes.as_subclass(torch.Tensor), rtol=0, atol=1e-4), (line["trace"], got, r.boxes)
        assert line["labels"] == r.labels.tolist()
        kps = torch.tensor(line["keypoints"], dtype=torch.float32).reshape(-1, KP, 3)
        want = r.keypoints()
        assert kps.shape == want.shape, (line["trace"], kps.shape, want.shape)
        assert torch.allclose(kps, want, rtol=0, atol=1e-4), (line["trace"], kps, want)
        assert torch.equal(mask, r.mask.as_subclass(torch.Tensor)), line["trace"]
        assert torch.equal(instances, r.instances.as_subclass(torch.Tensor)), line["trace"]
    return [line for line, _, _ in results]


def test_random_resized_crop_and_flip(sample: dict[str, Any]) -> None:
    """RandomResizedCrop + flips move boxes as F.resized_crop/F.horizontal_flip do, and the mask nearest."""
    lines = check(
        sample,
        [ringfeed.RandomResizedCrop((40, 48)), ringfeed.RandomHorizontalFlip(), ringfeed.RandomVerticalFlip()],
        (40, 48),
    )
    assert 0 < sum(len(line["boxes"]) for line in lines) < 12 * len(lines)


def test_resize_then_random_crop_with_padding(sample: dict[str, Any]) -> None:
    """Resize(max_size) + RandomCrop(padding, pad_if_needed): F.pad (mask filled with mask_fill), then F.crop."""
    check(
        sample,
        [ringfeed.Resize(50, max_size=60), ringfeed.RandomCrop((64, 64), padding=(4, 2, 3, 1), pad_if_needed=True)],
        (64, 64),
        mask_fill=255,
    )


def test_center_crop_larger_than_the_image(sample: dict[str, Any]) -> None:
    """CenterCrop larger than the image pads (boxes shift, the mask fills with mask_fill), then a resize."""
    check(sample, [ringfeed.CenterCrop((90, 88)), ringfeed.Resize((45, 40))], (45, 40), count=2, mask_fill=7)
    check(sample, [ringfeed.CenterCrop((64, 86)), ringfeed.RandomHorizontalFlip()], (64, 86), count=4)


def test_center_crop_boxes_stay_on_their_pixels() -> None:
    """Deliberate difference: torchvision's F.center_crop on boxes anchors a larger crop at round((n - c) / 2), one
    pixel away from where its own image kernel pads ((c - n) // 2); ringfeed moves boxes with the pixels."""
    img = torch.zeros(1, 5, 5, dtype=torch.uint8)
    img[0, 2, 2] = 1
    b = tv_tensors.BoundingBoxes(torch.tensor([[2.0, 2.0, 3.0, 3.0]]), format="XYXY", canvas_size=(5, 5))
    out = F.center_crop(img, [8, 8])
    y, x = (out[0] == 1).nonzero()[0].tolist()
    assert (x, y) == (3, 3)  # where the pixel went
    assert F.center_crop(b, [8, 8]).tolist() == [[4.0, 4.0, 5.0, 5.0]]  # torchvision's box: one off
    assert F.crop(b, -1, -1, 8, 8).tolist() == [[3.0, 3.0, 4.0, 4.0]]  # ours: F.crop at the pixels' offset


def test_geometry_after_colour_ops(sample: dict[str, Any]) -> None:
    """Crops, resizes and flips in the tail (after a colour op) move targets like the fused prefix does."""
    check(
        sample,
        [
            ringfeed.Resize((50, 70)),
            ringfeed.RandomInvert(1.0),
            ringfeed.RandomCrop((40, 60), padding=3),
            ringfeed.RandomHorizontalFlip(),
            ringfeed.Resize((30, 30), interpolation="nearest"),
        ],
        (30, 30),
        count=20,
        mask_fill=9,
    )


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (ringfeed.TrivialAugmentWide(), T.TrivialAugmentWide()),
        (
            ringfeed.TrivialAugmentWide(interpolation="bilinear", fill=[120, 10, 200]),
            T.TrivialAugmentWide(interpolation=InterpolationMode.BILINEAR, fill=[120, 10, 200]),
        ),
        (ringfeed.RandAugment(num_ops=3, magnitude=20), T.RandAugment(num_ops=3, magnitude=20)),
    ],
    ids=["ta-nearest", "ta-bilinear", "ra"],
)
def test_policies_move_targets_as_f_affine(sample: dict[str, Any], ours: Any, theirs: Any) -> None:
    """Deliberate extension: the policies' shear/translate/rotate move boxes and masks as F.affine/F.rotate would with
    the drawn parameters (torchvision's policies refuse boxes); the square crop exercises the quarter turns."""
    for size in [(48, 48), (40, 56)]:
        check(sample, [ringfeed.CenterCrop(size), ours], size, count=60, mask_fill=3, policy=theirs)


def test_sanitize_thresholds(sample: dict[str, Any]) -> None:
    """min_size/min_area are SanitizeBoundingBoxes's: larger thresholds keep fewer boxes, in order, with labels."""
    ops = [ringfeed.RandomResizedCrop((32, 32), scale=(0.05, 0.3))]
    few = check(sample, ops, (32, 32), count=30, min_size=4, min_area=40)
    many = check(sample, ops, (32, 32), count=30, min_size=0.5, min_area=0.5)
    assert sum(len(line["boxes"]) for line in few) < sum(len(line["boxes"]) for line in many)


def test_scale_jitter_then_random_crop(sample: dict[str, Any]) -> None:
    """ScaleJitter (F.resize to the drawn size) then RandomCrop(pad_if_needed) move targets as torchvision's do."""
    check(
        sample,
        [ringfeed.ScaleJitter((60, 40), scale_range=(0.3, 2.0)), ringfeed.RandomCrop((48, 48), pad_if_needed=True)],
        (48, 48),
        mask_fill=255,
    )


def test_zoom_out_iou_crop_resize(sample: dict[str, Any]) -> None:
    """The SSD recipe: RandomZoomOut, RandomIoUCrop (boxes whose centre is outside removed), Resize, flip."""
    lines = check(
        sample,
        [
            ringfeed.RandomZoomOut(fill=(10, 20, 30), side_range=(1.0, 2.5)),
            ringfeed.RandomIoUCrop(),
            ringfeed.Resize((40, 40)),
            ringfeed.RandomHorizontalFlip(),
        ],
        (40, 40),
        count=80,
        mask_fill=254,
    )
    drawn = [next(d for d in line["trace"] if d["op"] == "random_iou_crop") for line in lines]
    assert 0 < sum(d["apply"] for d in drawn) < len(drawn)
    zoomed = [next(d for d in line["trace"] if d["op"] == "random_zoom_out") for line in lines]
    assert 0 < sum(d["apply"] for d in zoomed) < len(zoomed)


def test_detection_ops_pixels_follow_torchvision(sample: dict[str, Any]) -> None:
    """The images of random_zoom_out (F.pad with fill), random_iou_crop (F.crop) and scale_jitter (F.resize) are
    torchvision's on the drawn parameters: exact for the pad and crop, PSNR >= 40 dB for the antialiased resize."""
    from test_ops import one, psnr

    x = torch.from_numpy(np.asarray(photo(W, H, 3)).copy()).permute(2, 0, 1)
    path = sample["path"]
    ops = [ringfeed.RandomZoomOut(fill=(10, 20, 30), p=1.0), ringfeed.CenterCrop((150, 200))]
    got, lines = one(path, *ops, count=6)
    for img, line in zip(got, lines, strict=True):
        d = line["trace"][0]
        assert torch.equal(img, F.center_crop(F.pad(x, d["padding"], fill=[10, 20, 30]), [150, 200]))
    got, lines = one(path, ringfeed.ScaleJitter((50, 50)), ringfeed.CenterCrop((40, 40)), count=6)
    for img, line in zip(got, lines, strict=True):
        d = line["trace"][0]
        want = F.center_crop(F.resize(x, [d["height"], d["width"]], antialias=True), [40, 40])
        assert psnr(img, want) >= 40
    # RandomIoUCrop without boxes leaves the image as it is.
    got, lines = one(path, ringfeed.RandomIoUCrop(), ringfeed.CenterCrop((H, W)), count=3)
    assert all(torch.equal(img, x) for img in got)
    assert all(line["trace"][0] == {"op": "random_iou_crop", "apply": False} for line in lines)
    results = run_targets(sample, ringfeed.RandomIoUCrop(), ringfeed.CenterCrop((32, 32)), size=(32, 32), count=20)
    n = 0
    for line, _, _ in results:
        d = line["trace"][0]
        if d["apply"]:
            n += 1
            assert d["top"] + d["height"] <= H
            assert d["left"] + d["width"] <= W
    assert n > 0


def test_iou_crop_sampler_follows_torchvision(sample: dict[str, Any]) -> None:
    """RandomIoUCrop's crops (whether it crops, top, left, height, width) are distributed as torchvision's make_params
    on the same image size and boxes (Kolmogorov-Smirnov, p > 0.01)."""
    from scipy import stats

    n = 1500
    results = run_targets(sample, ringfeed.RandomIoUCrop(), ringfeed.Resize((16, 16)), size=(16, 16), count=n)
    ours = [line["trace"][0] for line, _, _ in results]
    torch.manual_seed(0)
    tv = T.RandomIoUCrop()
    boxes = tv_tensors.BoundingBoxes(torch.tensor(sample["boxes"]), format="XYXY", canvas_size=(H, W))
    image = tv_tensors.Image(torch.zeros(3, H, W, dtype=torch.uint8))
    theirs = [tv.make_params([image, boxes]) for _ in range(n)]
    p = stats.ks_2samp([float(d["apply"]) for d in ours], [float(bool(t)) for t in theirs]).pvalue
    assert p > 0.01, ("apply", p)
    for key in ("top", "left", "height", "width"):
        a = [d[key] for d in ours if d["apply"]]
        b = [t[key] for t in theirs if t]
        p = stats.ks_2samp(a, b).pvalue
        assert p > 0.01, (key, p)
