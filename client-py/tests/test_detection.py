"""Detection and segmentation targets, packed and served: ``ringfeed pack --coco FILE --masks DIR`` over
real images and VOC-style palette masks written by Pillow, read back by the Python reader of
``targets.rft`` and compared with what torchvision makes of the same COCO annotations.

Served (protocol 1.10): a real server over a real socket delivers ``boxes``, ``box_labels``,
``box_count`` and ``mask`` moved by its crops and flips; each sample's equal torchvision v2's on
``tv_tensors`` replayed from the sample's ``crop`` field, over an epoch on 2 ranks and after a
resume, from the packed set and from WebDataset tars written by the ``webdataset`` library.
"""

from __future__ import annotations

import io
import json
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _support import ringfeed_bin
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as tvf
from torchvision.tv_tensors import BoundingBoxFormat

import ringfeed
from ringfeed.formats.targets import TargetsFile, verify_targets

#: (file name, width, height) of the synthetic set's images; ids are given out of file order.
IMAGES = [("b_000.jpg", 64, 48), ("a_001.png", 40, 40), ("c_002.jpg", 33, 57), ("d_003.jpg", 50, 30)]
IDS = [7, 3, 11, 5]


def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([ringfeed_bin(), *args], capture_output=True, text=True, timeout=120)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def picture(w: int, h: int, seed: int) -> Image.Image:
    """A seeded picture with structure (gradients and a disc), so crops and flips are visible."""
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1) + seed * 40) % 256
    g = (y * 255 // max(h - 1, 1) + seed * 90) % 256
    b = (((x - w / 2) ** 2 + (y - h / 2) ** 2) < (min(w, h) / 3) ** 2) * 200 + seed
    return Image.fromarray(np.stack([r, g, b], axis=-1).astype(np.uint8))


def label_map(w: int, h: int, seed: int) -> np.ndarray:
    """A label map with a few classes and the VOC 'void' label 255 on a border."""
    y, x = np.mgrid[0:h, 0:w]
    m = ((x // 7 + y // 5 + seed) % 4).astype(np.uint8)
    m[0, :] = 255
    return m


def write_set(root: Path, *, mask_sizes: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """Writes images, a COCO instances file and palette masks; returns the COCO document."""
    (root / "images").mkdir()
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    annotations = []
    for k, ((name, w, h), image_id) in enumerate(zip(IMAGES, IDS, strict=True)):
        img = picture(w, h, k)
        img.save(root / "images" / name, quality=92) if name.endswith(".jpg") else img.save(root / "images" / name)
        mw, mh = (mask_sizes or {}).get(name, (w, h))
        pal = Image.fromarray(label_map(mw, mh, k), mode="P")
        pal.putpalette([v for i in range(256) for v in (i, (i * 7) % 256, (i * 13) % 256)])
        pal.save(root / "masks" / (Path(name).stem + ".png"))
        count = [3, 0, 5, 1][k]  # image a_001 has no annotations
        for _ in range(count):
            x, y = float(rng.uniform(0, w - 8)), float(rng.uniform(0, h - 8))
            bw, bh = float(rng.uniform(0.5, w - x)), float(rng.uniform(0.5, h - y))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "bbox": [x, y, bw, bh],
                    "category_id": int(rng.integers(1, 4)),
                    "iscrowd": 0,
                    "area": bw * bh,
                    "segmentation": [[x, y, x + bw, y, x + bw, y + bh]],
                }
            )
    # A crowd annotation, which the detection references (and pack) leave out.
    annotations.append({"id": 99, "image_id": 7, "bbox": [1, 1, 5, 5], "category_id": 2, "iscrowd": 1})
    doc = {
        "images": [
            {"id": i, "file_name": n, "width": w, "height": h} for (n, w, h), i in zip(IMAGES, IDS, strict=True)
        ],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "disc"}, {"id": 2, "name": "bar"}, {"id": 3, "name": "edge"}],
    }
    (root / "instances.json").write_text(json.dumps(doc))
    return doc


def reference_boxes(doc: dict[str, Any], image_id: int, w: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's boxes for one image: COCO xywh converted to xyxy on float32 tensors (crowds dropped)."""
    anns = [a for a in doc["annotations"] if a["image_id"] == image_id and not a.get("iscrowd")]
    xywh = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
    xyxy = tvf.convert_bounding_box_format(xywh, old_format=BoundingBoxFormat.XYWH, new_format=BoundingBoxFormat.XYXY)
    return xyxy, torch.tensor([a["category_id"] for a in anns], dtype=torch.int64)


def pack_set(tmp_path: Path, out: Path, *extra: str, ok: bool = True) -> subprocess.CompletedProcess:
    """``ringfeed pack IMAGES OUT --coco instances.json --masks masks`` over ``write_set``'s files."""
    coco = ("--coco", str(tmp_path / "instances.json"), "--masks", str(tmp_path / "masks"))
    return run("pack", str(tmp_path / "images"), str(out), *coco, *extra, ok=ok)


def test_pack_coco_masks_stores_torchvisions_boxes_and_the_palette_indices(tmp_path: Path) -> None:
    """Every packed sample, in ascending image id, has torchvision's xyxy boxes and the mask's palette indices."""
    doc = write_set(tmp_path)
    out = tmp_path / "out"
    r = pack_set(tmp_path, out, "--progress", "lines")
    assert "targets: 9 boxes (at most 5 per image; 1 crowd annotations left out), 4 masks" in r.stdout
    order = sorted(range(len(IDS)), key=lambda k: IDS[k])
    with ringfeed.PackedDataset(out) as ds, TargetsFile(out) as t:
        assert len(ds) == len(t) == len(IMAGES)
        assert t.header.max_boxes == 5
        assert [c["name"] for c in t.categories()] == ["disc", "bar", "edge"]
        for i, k in enumerate(order):
            name, w, h = IMAGES[k]
            s = ds.sample(i)
            assert s.key == name.encode()
            assert s.meta == {"image_id": IDS[k]}
            stored = t.get(i, check_crc=True)
            want_boxes, want_labels = reference_boxes(doc, IDS[k], w, h)
            assert torch.equal(torch.from_numpy(stored.boxes), want_boxes), name
            assert torch.equal(torch.from_numpy(stored.labels), want_labels), name
            mask = np.asarray(Image.open(io.BytesIO(stored.mask_png)))
            np.testing.assert_array_equal(mask, label_map(w, h, k))
    assert verify_targets(out, sample_count=4)["boxes"] == 9
    assert ringfeed.verify(out)["targets"]["masks"] == 4
    v = run("verify", str(out))
    assert "ok: targets of 4 samples: 9 boxes (at most 5 per sample), 4 masks" in v.stdout
    info = json.loads(run("inspect", str(out), "--json", "--sample", "0").stdout)
    assert info["targets"]["boxes"] == 9
    assert (info["targets"]["max_boxes"], info["targets"]["masks"]) == (5, 4)
    assert (info["targets"]["instance_masks"], info["targets"]["keypoints"]) == (True, 0)  # its polygons
    text = run("inspect", str(out)).stdout
    assert "targets:  9 boxes (at most 5 per sample), 4 samples with masks, instance masks, 0 keypoints" in text
    assert len(info["targets"]["sample"]["boxes"]) == len(reference_boxes(doc, 3, 40, 40)[0])


def test_masks_alone_beside_an_image_folder(tmp_path: Path) -> None:
    """``--masks`` without ``--coco`` stores a mask for every sample of an image folder and no boxes."""
    write_set(tmp_path)
    (tmp_path / "folder" / "c").mkdir(parents=True)
    for name, _, _ in IMAGES:
        (tmp_path / "images" / name).rename(tmp_path / "folder" / "c" / name)
    out = tmp_path / "out"
    run("pack", str(tmp_path / "folder"), str(out), "--masks", str(tmp_path / "masks"))
    with ringfeed.PackedDataset(out) as ds, TargetsFile(out) as t:
        assert not t.header.has_boxes
        assert t.header.has_masks
        for i in range(len(ds)):
            key = ds.sample(i).key.decode()
            k = next(j for j, (n, _, _) in enumerate(IMAGES) if key.endswith(n))
            w, h = IMAGES[k][1:]
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(t.get(i).mask_png))), label_map(w, h, k))


def test_a_mask_of_the_wrong_size_names_the_image_and_the_mask(tmp_path: Path) -> None:
    """A label map whose size is not its image's stops the pack, naming both files and both sizes."""
    write_set(tmp_path, mask_sizes={"c_002.jpg": (57, 33)})
    out = tmp_path / "out"
    r = pack_set(tmp_path, out, ok=False)
    assert r.returncode != 0
    assert "c_002.jpg" in r.stderr
    assert "c_002.png is 57x33 pixels, the image is 33x57" in r.stderr
    assert not out.exists()
    skip = pack_set(tmp_path, out, "--on-error", "skip")
    assert "skipped 1" in skip.stdout
    with TargetsFile(out) as t:
        assert len(t) == 3


def test_a_missing_mask_names_the_file_looked_for(tmp_path: Path) -> None:
    """An image without its DIR/<stem>.png is a per-sample failure naming the path and the flag."""
    write_set(tmp_path)
    (tmp_path / "masks" / "d_003.png").unlink()
    r = pack_set(tmp_path, tmp_path / "out", ok=False)
    assert "d_003.jpg" in r.stderr
    assert "d_003.png" in r.stderr
    assert "--masks DIR" in r.stderr


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (
            {"id": 4, "image_id": 7, "bbox": [0, 0, -2, 3], "category_id": 1},
            'annotations[9] (id 4) of image "b_000.jpg"',
        ),
        ({"id": 5, "image_id": 7, "bbox": [0, 0, 2], "category_id": 1}, "`bbox` is not four numbers"),
        ({"id": 6, "image_id": 42, "bbox": [0, 0, 2, 2], "category_id": 1}, "image_id 42 is not in `images`"),
        ({"id": 7, "image_id": 7, "bbox": [0, 0, 2, 2], "category_id": "cat"}, "no integer `category_id`"),
    ],
)
def test_a_malformed_annotation_names_the_file_and_the_annotation(
    tmp_path: Path, annotation: dict[str, Any], message: str
) -> None:
    """A malformed COCO annotation stops the pack before any image is read, naming the file and the annotation."""
    doc = write_set(tmp_path)
    doc["annotations"].insert(9, annotation)
    (tmp_path / "instances.json").write_text(json.dumps(doc))
    r = run(
        "pack", str(tmp_path / "images"), str(tmp_path / "out"), "--coco", str(tmp_path / "instances.json"), ok=False
    )
    assert message in r.stderr
    assert "instances.json" in r.stderr
    assert not (tmp_path / "out").exists()


# -- the client's option ---------------------------------------------------------------------------

ONE_VIEW = ringfeed.Compose([ringfeed.Resize((24, 32))])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, "give boxes, mask or both"),
        ({"boxes": "json:annotations"}, "needs max_boxes"),
        ({"mask": "png", "max_boxes": 4}, "max_boxes is for boxes"),
        ({"boxes": "stored", "max_boxes": 0}, "max_boxes"),
        ({"boxes": "stored", "max_boxes": 5000}, "max_boxes"),
        ({"boxes": "stored", "min_size": -1}, "min_size must be a finite number >= 0"),
        ({"mask": "stored", "mask_fill": 256}, "mask_fill"),
        ({"boxes": ""}, "boxes must be 'stored' or a WebDataset member"),
    ],
)
def test_targets_options_are_checked(kw: dict[str, Any], message: str) -> None:
    """ringfeed.Targets refuses what open.targets would refuse, naming the argument."""
    with pytest.raises(ValueError, match=message):
        ringfeed.Targets(**kw)


def test_targets_request_and_ring_fields() -> None:
    """Targets' open.targets member and ring fields follow control.md and ring.md."""
    t = ringfeed.Targets(boxes="json:annotations", mask="png", max_boxes=7, min_size=2, mask_fill=255)
    assert ringfeed.Targets(boxes="stored").request(ringfeed.SanitizeBoundingBoxes(3, 4))["min_area"] == 4.0
    with pytest.raises(ValueError, match=r"the pipeline's SanitizeBoundingBoxes says 3\.0"):
        t.request(ringfeed.SanitizeBoundingBoxes(3))
    assert t.request() == {
        "boxes": "json:annotations", "mask": "png", "max_boxes": 7, "min_size": 2.0, "min_area": 1.0, "mask_fill": 255,
    }  # fmt: skip
    assert t.ring_fields((24, 32)) == {
        "boxes": ("float32", (7, 4)), "box_labels": ("int64", (7,)), "box_count": ("int32", ()),
        "mask": ("uint8", (24, 32)),
    }  # fmt: skip
    assert ringfeed.Targets(boxes="stored").ring_fields((8, 8))["boxes"] == ("float32", (None, 4))


def test_targets_need_one_view_of_one_image(tmp_path: Path) -> None:
    """A multi-view pipeline with targets is refused before anything is sent, naming targets."""
    views = ringfeed.Views({"a": ringfeed.Resize((8, 8)), "b": ringfeed.Resize((8, 8))})
    with pytest.raises(ValueError, match="targets go with a pipeline of one view of one image"):
        ringfeed.Loader(tmp_path, 2, views, targets=ringfeed.Targets(boxes="stored"))


def test_a_1_9_server_is_refused_naming_its_version(tmp_path: Path, serve: Any) -> None:
    """Against a 1.9 server (which would ignore open.targets), a loader with targets raises before it
    opens, naming the server's version and what targets need."""
    server = serve(protocol=(1, 9), dataset_len=4)
    with pytest.raises(ringfeed.RingfeedError, match=r"speaks protocol 1\.9; detection and segmentation targets need"):
        ringfeed.Loader(
            tmp_path, 2, ONE_VIEW, targets=ringfeed.Targets(boxes="stored"), server=ringfeed.Server(socket=server.path)
        )


# -- served: targets follow the ops, against torchvision v2 ---------------------------------------

#: The serving set: sizes of its images (stored, no EXIF orientation) and boxes per image.
SERVED = 14
PIPE = ringfeed.Compose([ringfeed.RandomResizedCrop((24, 32), scale=(0.2, 1.0)), ringfeed.RandomHorizontalFlip()])
OUT_HW = (24, 32)
FILL = 255


def served_images(n: int) -> list[tuple[str, int, int]]:
    rng = np.random.default_rng(11)
    return [(f"im_{k:03d}.jpg", int(rng.integers(40, 90)), int(rng.integers(36, 80))) for k in range(n)]


def grey_mask(w: int, h: int, seed: int) -> np.ndarray:
    """A label map where every pixel's label depends on both coordinates, so an index off by one shows."""
    y, x = np.mgrid[0:h, 0:w]
    return ((x * 7 + y * 13 + seed * 5) % 251).astype(np.uint8)


def annotations_for(k: int, w: int, h: int) -> list[dict[str, Any]]:
    """0..6 boxes inside the image (some thin, one at the edge), and a crowd one, as COCO writes them."""
    rng = np.random.default_rng(100 + k)
    out = []
    for j in range(k % 7):
        x, y = float(rng.uniform(0, w - 4)), float(rng.uniform(0, h - 4))
        bw, bh = float(rng.uniform(0.6, w - x)), float(rng.uniform(0.6, h - y))
        out.append({"id": 1000 * k + j, "image_id": k, "bbox": [x, y, bw, bh], "category_id": int(rng.integers(1, 9))})
    if k % 3 == 0:
        out.append({"id": 1000 * k + 99, "image_id": k, "bbox": [0, 0, w, h], "category_id": 5, "iscrowd": 1})
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same synthetic detection set, packed with ``--coco --masks`` and written as WebDataset
    tars (``jpg``, ``json`` holding the annotations, ``png`` the mask) by the webdataset library."""
    import webdataset

    root = tmp_path_factory.mktemp("served")
    (root / "images").mkdir()
    (root / "masks").mkdir()
    (root / "wds").mkdir()
    images, annotations, samples = [], [], []
    for k, (name, w, h) in enumerate(served_images(SERVED)):
        buf = io.BytesIO()
        picture(w, h, k).save(buf, "JPEG", quality=92)
        (root / "images" / name).write_bytes(buf.getvalue())
        mbuf = io.BytesIO()
        Image.fromarray(grey_mask(w, h, k), mode="L").save(mbuf, "PNG")
        (root / "masks" / (Path(name).stem + ".png")).write_bytes(mbuf.getvalue())
        anns = annotations_for(k, w, h)
        annotations += anns
        images.append({"id": k, "file_name": name, "width": w, "height": h})
        samples.append(
            {"__key__": f"{k:06d}", "jpg": buf.getvalue(), "json": {"annotations": anns}, "png": mbuf.getvalue()}
        )
    doc = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": c, "name": f"c{c}"} for c in range(1, 9)],
    }
    (root / "instances.json").write_text(json.dumps(doc))
    run("pack", str(root / "images"), str(root / "packed"), "--coco", str(root / "instances.json"),
        "--masks", str(root / "masks"))  # fmt: skip
    for s in range(2):
        with webdataset.TarWriter(str(root / "wds" / f"det-{s:05d}.tar")) as sink:
            for sample in samples[s * SERVED // 2 : (s + 1) * SERVED // 2]:
                sink.write(sample)
    return {"root": root, "doc": doc, "images": served_images(SERVED)}


def reference(served: dict[str, Any], k: int, crop: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torchvision v2's targets for sample ``k`` with the crop the server drew (its ``crop`` field):
    ``F.resized_crop`` on ``BoundingBoxes`` (XYXY, hard clamping) and on the ``Mask`` (nearest),
    ``F.horizontal_flip`` when flipped, then ``sanitize_bounding_boxes`` (min_size 1, min_area 1)."""
    _, w, h = served["images"][k]
    top, left, ch, cw, flipped = crop
    xyxy, labels = reference_boxes(served["doc"], k, w, h)
    boxes = tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(h, w), clamping_mode="hard")
    mask = tv_tensors.Mask(torch.from_numpy(grey_mask(w, h, k)))
    boxes = tvf.resized_crop(boxes, top, left, ch, cw, list(OUT_HW))
    mask = tvf.resized_crop(mask, top, left, ch, cw, list(OUT_HW), interpolation=InterpolationMode.NEAREST)
    if flipped:
        boxes, mask = tvf.horizontal_flip(boxes), tvf.horizontal_flip(mask)
    boxes, valid = tvf.sanitize_bounding_boxes(boxes, min_size=1.0, min_area=1.0)
    return boxes.as_subclass(torch.Tensor), labels[valid], mask.as_subclass(torch.Tensor)


def check_batches(served: dict[str, Any], batches: list[dict[str, Any]]) -> list[int]:
    """Every delivered sample's boxes, labels, count and mask equal torchvision's replay of its crop."""
    seen = []
    for b in batches:
        assert b["boxes"].dtype == torch.float32
        assert b["box_labels"].dtype == torch.int64
        assert b["box_count"].dtype == torch.int32
        assert b["mask"].dtype == torch.uint8
        assert tuple(b["mask"].shape[1:]) == OUT_HW
        for p, k in enumerate(b["index"].tolist()):
            want_boxes, want_labels, want_mask = reference(served, k, b["crop"][p].tolist())
            n = int(b["box_count"][p])
            assert n == len(want_boxes), (k, b["crop"][p], b["boxes"][p][:n], want_boxes)
            assert torch.allclose(b["boxes"][p][:n], want_boxes, rtol=0, atol=1e-4), (k, b["boxes"][p][:n], want_boxes)
            assert torch.equal(b["box_labels"][p][:n], want_labels)
            assert (b["box_labels"][p][n:] == -1).all()
            assert torch.equal(b["mask"][p], want_mask), k
            seen.append(k)
    return seen


def targets_loader(path: Any, sock: str, targets: ringfeed.Targets, **kw: Any) -> ringfeed.Loader:
    opts: dict[str, Any] = {
        "seed": 4,
        "fields": ["index", "crop"],
        "drop_last": False,
        "targets": targets,
        "server": ringfeed.Server(socket=sock, spawn=True),
    }
    opts.update(kw)
    return ringfeed.Loader(path, 3, PIPE, **opts)


STORED = ringfeed.Targets(boxes="stored", mask="stored", mask_fill=FILL)
MEMBERS = ringfeed.Targets(boxes="json:annotations", max_boxes=8, mask="png", mask_fill=FILL)


def sources(served: dict[str, Any]) -> dict[str, tuple[Any, ringfeed.Targets]]:
    root = served["root"]
    return {
        "packed": (root / "packed", STORED),
        "webdataset": (ringfeed.WebDataset(str(root / "wds"), label=""), MEMBERS),
    }


@pytest.mark.parametrize("kind", ["packed", "webdataset"])
def test_targets_follow_the_crops_over_an_epoch_on_two_ranks(served: dict[str, Any], sock: str, kind: str) -> None:
    """On 2 ranks, every sample of an epoch comes once, with torchvision v2's boxes (within 1e-4 px),
    labels and mask (exactly) for the crop and flip the server drew."""
    path, targets = sources(served)[kind]
    seen: list[int] = []
    delivered = flips = 0
    for rank in (0, 1):
        with targets_loader(path, sock, targets, rank=rank, world_size=2) as ld:
            ld.set_epoch(1)
            batches = list(ld)
        assert set(batches[0]) == {"image", "label", "index", "crop", "boxes", "box_labels", "box_count", "mask"}
        part = check_batches(served, batches)
        assert not set(part) & set(seen), "the ranks overlap"
        seen += part
        delivered += sum(int(b["box_count"].sum()) for b in batches)
        flips += sum(int(b["crop"][:, 4].sum()) for b in batches)
    assert sorted(seen) == list(range(SERVED))
    stored = sum(len(reference_boxes(served["doc"], k, w, h)[0]) for k, (_, w, h) in enumerate(served["images"]))
    assert 0 < delivered < stored, "some boxes survive the crops and some are cut away"
    assert 0 < flips < SERVED


def resumed(path: Any, sock: str, targets: ringfeed.Targets) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two batches of epoch 2, then the rest of it from a loader resumed with the state taken after them."""
    with targets_loader(path, sock, targets) as ld:
        ld.set_epoch(2)
        it = iter(ld)
        first = [{k: v.clone() for k, v in next(it).items()} for _ in range(2)]
        state = ld.state_dict()
    with targets_loader(path, sock, targets) as ld:
        ld.load_state_dict(state)
        return first, list(ld)


@pytest.mark.parametrize("kind", ["packed", "webdataset"])
def test_targets_hold_across_a_resume(served: dict[str, Any], sock: str, kind: str) -> None:
    """A state_dict taken mid-epoch resumes with the rest of the epoch, each sample with its own targets."""
    path, targets = sources(served)[kind]
    first, rest = resumed(path, sock, targets)
    seen = check_batches(served, first) + check_batches(served, rest)
    assert sorted(seen) == list(range(SERVED))


def test_more_boxes_than_max_boxes_names_the_sample_and_max_boxes(served: dict[str, Any], sock: str) -> None:
    """A sample with more boxes than max_boxes is a sample error naming it, its count and max_boxes."""
    root = served["root"]
    targets = ringfeed.Targets(boxes="json:annotations", max_boxes=3)
    with (
        targets_loader(ringfeed.WebDataset(str(root / "wds"), label=""), sock, targets) as ld,
        pytest.raises(ringfeed.ServerError, match=r"boxes, more than targets\.max_boxes = 3; raise max_boxes") as e,
    ):
        list(ld)
    assert e.value.code == "sample"


def test_a_mask_of_the_wrong_size_is_the_samples_error(tmp_path: Path, sock: str) -> None:
    """A WebDataset mask whose size is not its image's fails that sample, naming it."""
    import webdataset

    good, bad = io.BytesIO(), io.BytesIO()
    picture(40, 30, 1).save(good, "JPEG")
    Image.fromarray(grey_mask(30, 40, 1), mode="L").save(bad, "PNG")
    with webdataset.TarWriter(str(tmp_path / "a.tar")) as sink:
        sink.write({"__key__": "k0", "jpg": good.getvalue(), "png": bad.getvalue()})
    targets = ringfeed.Targets(mask="png")
    with (
        targets_loader(ringfeed.WebDataset(str(tmp_path), label=""), sock, targets) as ld,
        pytest.raises(ringfeed.ServerError, match=r"k0.*mask") as e,
    ):
        list(ld)
    assert e.value.code == "sample"


def test_a_malformed_annotation_member_is_the_samples_error(tmp_path: Path, sock: str) -> None:
    """A WebDataset annotation without a four-number bbox fails that sample, naming the member and the annotation."""
    import webdataset

    good = io.BytesIO()
    picture(40, 30, 1).save(good, "JPEG")
    with webdataset.TarWriter(str(tmp_path / "a.tar")) as sink:
        sink.write(
            {"__key__": "k0", "jpg": good.getvalue(), "json": {"annotations": [{"bbox": [1, 2], "category_id": 1}]}}
        )
    targets = ringfeed.Targets(boxes="json:annotations", max_boxes=4)
    with (
        targets_loader(ringfeed.WebDataset(str(tmp_path), label=""), sock, targets) as ld,
        pytest.raises(ringfeed.ServerError, match=r"k0.*annotation 0: `bbox` is not four numbers") as e,
    ):
        list(ld)
    assert e.value.code == "sample"


def test_samples_handed_to_the_gpu_decoder_carry_their_targets(served: dict[str, Any], sock: str) -> None:
    """Hybrid decode (the host backend): samples the server leaves encoded for the client's GPU get
    the targets the server moved through the geometry it planned, torchvision's as for the rest."""
    with targets_loader(served["root"] / "packed", sock, STORED, gpu_decode=1.0, _gpu_backend="host") as ld:
        ld.set_epoch(1)
        batches = list(ld)
        stats = ld.stats()
    assert sorted(check_batches(served, batches)) == list(range(SERVED))
    assert stats["gpu_samples"] > 0, stats


def test_targets_and_aspect_buckets_are_refused_together(served: dict[str, Any], sock: str) -> None:
    """A bucketed pipeline changes the batch shape, and the mask field has one: the pair is refused, naming both."""
    pipe = ringfeed.Compose([ringfeed.AspectBuckets(area=32 * 32, step=8)])
    with pytest.raises(ringfeed.ServerError, match="targets do not go with aspect_buckets") as e:
        ringfeed.Loader(
            served["root"] / "packed", 2, pipe, targets=STORED, server=ringfeed.Server(socket=sock, spawn=True)
        )
    assert e.value.code == "bad_request"


# -- instance masks and keypoints (targets file 1.1) ------------------------------------------------

KP = 4


def coco_mask(seg: Any, h: int, w: int) -> np.ndarray:
    """torchvision's ``wrap_dataset_for_transforms_v2`` mask of one COCO ``segmentation`` (pycocotools)."""
    from pycocotools import mask as coco

    if isinstance(seg, dict):
        rle = seg if isinstance(seg["counts"], str) else coco.frPyObjects(seg, h, w)
    else:
        rle = coco.merge(coco.frPyObjects(seg, h, w))
    with warnings.catch_warnings():
        # pycocotools 2.0 builds its arrays the numpy 1 way (a DeprecationWarning under numpy 2).
        warnings.simplefilter("ignore", DeprecationWarning)
        return coco.decode(rle)


def instance_annotations(k: int, w: int, h: int) -> list[dict[str, Any]]:
    """1..5 annotations of image ``k``: random polygons (fractional, some past the border, one of two
    parts), an uncompressed and a compressed RLE, each with ``KP`` keypoints (some outside the image,
    v in 0..2), and a crowd one."""
    from pycocotools import mask as coco

    rng = np.random.default_rng(500 + k)
    out = []
    for j in range(1 + k % 5):
        x, y = float(rng.uniform(-3, w - 6)), float(rng.uniform(-3, h - 6))
        bw, bh = float(rng.uniform(3, w - max(x, 0))), float(rng.uniform(3, h - max(y, 0)))
        kind = (k + j) % 4
        if kind == 0:
            seg: Any = [[x, y, x + bw, y + bh * 0.3, x + bw * 0.6, y + bh, x + bw * 0.1, y + bh * 0.8]]
        elif kind == 1:
            seg = [
                [x, y, x + bw / 2, y, x + bw / 2, y + bh / 2],
                [x + bw / 2, y + bh / 2, x + bw, y + bh / 2, x + bw, y + bh],
            ]
        else:
            m = np.zeros((h, w), dtype=np.uint8, order="F")
            x0, y0 = max(int(x), 0), max(int(y), 0)
            m[y0 : int(y0 + bh), x0 : int(x0 + bw)] = 1
            m[y0 + 1 :: 3, x0::2] = 0
            rle = coco.encode(m)
            if kind == 2:
                seg = {"counts": rle["counts"].decode(), "size": [h, w]}
            else:
                flat = m.flatten(order="F")
                change = np.flatnonzero(np.diff(flat)) + 1
                bounds = [0, *change.tolist(), flat.size]
                runs = np.diff(bounds).tolist()
                seg = {"counts": ([0] if flat[0] else []) + runs, "size": [h, w]}
        kps = []
        for _ in range(KP):
            kps += [float(rng.uniform(-4, w + 4)), float(rng.uniform(-4, h + 4)), int(rng.integers(0, 3))]
        bbox = [max(x, 0), max(y, 0), bw, bh]
        out.append({
            "id": 1000 * k + j, "image_id": k, "bbox": bbox, "category_id": int(rng.integers(1, 9)),
            "segmentation": seg, "keypoints": kps, "num_keypoints": KP,
        })  # fmt: skip
    if k % 4 == 1:
        out.append({"id": 1000 * k + 99, "image_id": k, "bbox": [0, 0, 4, 4], "category_id": 2, "iscrowd": 1,
                    "segmentation": {"counts": [0, w * h], "size": [h, w]}})  # fmt: skip
    return out


@pytest.fixture(scope="module")
def instances_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The serving images, packed with ``--coco`` annotations that have polygons, RLE and keypoints, and the same
    pictures and annotations written as WebDataset tars by the webdataset library (``jpg``, ``json`` holding
    ``{"annotations": [...]}``, and ``png`` a label map)."""
    import webdataset

    root = tmp_path_factory.mktemp("instances")
    (root / "images").mkdir()
    (root / "wds").mkdir()
    images, annotations, samples = [], [], []
    for k, (name, w, h) in enumerate(served_images(SERVED)):
        picture(w, h, k).save(root / "images" / name, "JPEG", quality=92)
        anns = instance_annotations(k, w, h)
        annotations += anns
        images.append({"id": k, "file_name": name, "width": w, "height": h})
        jpg = (root / "images" / name).read_bytes()
        mbuf = io.BytesIO()
        Image.fromarray(grey_mask(w, h, k), mode="L").save(mbuf, "PNG")
        samples.append({"__key__": f"{k:06d}", "jpg": jpg, "json": {"annotations": anns}, "png": mbuf.getvalue()})
    for s in range(2):
        with webdataset.TarWriter(str(root / "wds" / f"inst-{s:05d}.tar")) as sink:
            for sample in samples[s * SERVED // 2 : (s + 1) * SERVED // 2]:
                sink.write(sample)
    doc = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": c, "name": f"c{c}"} for c in range(1, 9)],
    }
    (root / "instances.json").write_text(json.dumps(doc))
    r = run("pack", str(root / "images"), str(root / "packed"), "--coco", str(root / "instances.json"))
    return {"root": root, "doc": doc, "images": served_images(SERVED), "stdout": r.stdout}


def reference_instances(doc: dict[str, Any], k: int, w: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Image ``k``'s instance masks ``uint8 [M, h, w]`` (pycocotools) and keypoints ``[M, KP, 3]``, crowds dropped."""
    anns = [a for a in doc["annotations"] if a["image_id"] == k and not a.get("iscrowd")]
    masks = np.stack([coco_mask(a["segmentation"], h, w) for a in anns]).astype(np.uint8)
    kps = torch.tensor([a["keypoints"] for a in anns], dtype=torch.float32).reshape(len(anns), KP, 3)
    return torch.from_numpy(masks), kps


def test_pack_coco_stores_instance_masks_as_pycocotools_decodes_them(instances_set: dict[str, Any]) -> None:
    """Every stored instance mask (polygons, unions of polygons, uncompressed and compressed RLE)
    equals pycocotools' decoding; keypoints are stored as given; verify counts them."""
    out = instances_set["root"] / "packed"
    total = 0
    with TargetsFile(out) as t:
        assert t.header.minor == 1
        assert t.header.has_instances
        assert t.header.keypoints == KP
        for k, (_, w, h) in enumerate(instances_set["images"]):
            s = t.get(k, check_crc=True)
            want_masks, want_kps = reference_instances(instances_set["doc"], k, w, h)
            assert s.instance_masks is not None
            assert s.keypoints is not None
            np.testing.assert_array_equal(s.instance_masks, want_masks.numpy(), err_msg=f"image {k}")
            np.testing.assert_array_equal(s.keypoints, want_kps.numpy())
            total += len(want_masks)
    assert f"{total} instance masks, {KP} keypoints per box" in instances_set["stdout"]
    report = verify_targets(out, sample_count=SERVED)
    assert (report["instances"], report["keypoints"]) == (total, KP)
    assert f"{total} instance masks, {KP} keypoints per box" in run("verify", str(out)).stdout
    counts = [
        len(reference_instances(instances_set["doc"], k, w, h)[0])
        for k, (_, w, h) in enumerate(instances_set["images"])
    ]
    info = json.loads(run("inspect", str(out), "--json").stdout)["targets"]
    assert (info["boxes"], info["max_boxes"], info["masks"]) == (total, max(counts), 0)
    assert (info["instance_masks"], info["keypoints"]) == (True, KP)
    text = run("inspect", str(out)).stdout
    want = f"targets:  {total} boxes (at most {max(counts)} per sample), 0 samples with masks, instance masks, {KP} key"
    assert want in text, text


def reference_with_instances(s: dict[str, Any], k: int, crop: list[int]) -> dict[str, torch.Tensor]:
    """torchvision v2's replay of sample ``k``'s crop and flip on ``BoundingBoxes``, the instance
    ``Mask`` ``[M, H, W]`` (nearest) and ``KeyPoints`` ``[M, KP, 2]``, then ``sanitize_bounding_boxes``
    indexing all three (keypoints as a ``labels_getter`` would); ``v`` rides along unchanged."""
    _, w, h = s["images"][k]
    top, left, ch, cw, flipped = crop
    xyxy, labels = reference_boxes(s["doc"], k, w, h)
    masks, kps = reference_instances(s["doc"], k, w, h)
    boxes = tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(h, w), clamping_mode="hard")
    mask = tv_tensors.Mask(masks)
    points = tv_tensors.KeyPoints(kps[..., :2], canvas_size=(h, w))
    boxes = tvf.resized_crop(boxes, top, left, ch, cw, list(OUT_HW))
    mask = tvf.resized_crop(mask, top, left, ch, cw, list(OUT_HW), interpolation=InterpolationMode.NEAREST)
    points = tvf.resized_crop(points, top, left, ch, cw, list(OUT_HW))
    if flipped:
        boxes, mask, points = tvf.horizontal_flip(boxes), tvf.horizontal_flip(mask), tvf.horizontal_flip(points)
    boxes, valid = tvf.sanitize_bounding_boxes(boxes, min_size=1.0, min_area=1.0)
    xyv = torch.cat([points.as_subclass(torch.Tensor), kps[..., 2:]], dim=-1)
    return {"boxes": boxes.as_subclass(torch.Tensor), "labels": labels[valid],
            "masks": mask.as_subclass(torch.Tensor)[valid], "keypoints": xyv[valid]}  # fmt: skip


def check_instances(s: dict[str, Any], batches: list[dict[str, Any]]) -> list[int]:
    """Every delivered sample's boxes, masks and keypoints equal torchvision's replay (masks exactly,
    boxes and keypoints within 1e-4 px), through ``ringfeed.detection_targets``."""
    seen = []
    for b in batches:
        assert b["instance_masks"].dtype == torch.uint8
        assert tuple(b["instance_masks"].shape[1:]) == (1, *OUT_HW)  # max_boxes 5: one plane
        assert tuple(b["keypoints"].shape[1:]) == (5, KP, 3)
        for p, (t, k) in enumerate(zip(ringfeed.detection_targets(b), b["index"].tolist(), strict=True)):
            want = reference_with_instances(s, k, b["crop"][p].tolist())
            assert len(t["boxes"]) == len(want["boxes"]), k
            assert torch.allclose(t["boxes"], want["boxes"], rtol=0, atol=1e-4), k
            assert torch.equal(t["labels"], want["labels"])
            assert t["masks"].dtype == torch.uint8
            assert torch.equal(t["masks"], want["masks"]), k
            assert torch.allclose(t["keypoints"], want["keypoints"], rtol=0, atol=1e-4), (k, t["keypoints"], want)
            n = len(want["boxes"])
            assert not b["keypoints"][p][n:].any()
            assert not (b["instance_masks"][p] >> n).any()
            seen.append(k)
    return seen


INSTANCES = ringfeed.Targets(boxes="stored", instance_masks=True, keypoints=KP)
WDS_INSTANCES = ringfeed.Targets(boxes="json:annotations", max_boxes=5, instance_masks=True, keypoints=KP)


def instance_sources(s: dict[str, Any]) -> dict[str, tuple[Any, ringfeed.Targets]]:
    """The instance set's packed copy and its WebDataset tars, each with the targets that read its annotations."""
    root = s["root"]
    return {
        "packed": (root / "packed", INSTANCES),
        "webdataset": (ringfeed.WebDataset(str(root / "wds"), label=""), WDS_INSTANCES),
    }


def test_instance_masks_and_keypoints_follow_the_crops_on_two_ranks(instances_set: dict[str, Any], sock: str) -> None:
    """On 2 ranks, every sample of an epoch comes once with torchvision v2's instance masks and
    keypoints for the crop and flip the server drew, removed with their boxes."""
    seen: list[int] = []
    kept = flips = 0
    for rank in (0, 1):
        with targets_loader(instances_set["root"] / "packed", sock, INSTANCES, rank=rank, world_size=2) as ld:
            ld.set_epoch(1)
            batches = list(ld)
        assert {"instance_masks", "keypoints"} <= set(batches[0])
        part = check_instances(instances_set, batches)
        assert not set(part) & set(seen)
        seen += part
        kept += sum(int(b["box_count"].sum()) for b in batches)
        flips += sum(int(b["crop"][:, 4].sum()) for b in batches)
    assert sorted(seen) == list(range(SERVED))
    assert kept > 0
    assert 0 < flips < SERVED


@pytest.mark.parametrize("kind", ["packed", "webdataset"])
def test_instance_masks_and_keypoints_hold_across_a_resume(instances_set: dict[str, Any], sock: str, kind: str) -> None:
    """A state_dict taken mid-epoch resumes with the rest of the epoch, each sample with its own masks and keypoints."""
    path, targets = instance_sources(instances_set)[kind]
    first, rest = resumed(path, sock, targets)
    assert sorted(check_instances(instances_set, first) + check_instances(instances_set, rest)) == list(range(SERVED))


def test_instance_masks_and_keypoints_need_them_stored(served: dict[str, Any], sock: str) -> None:
    """A set packed without segmentations or keypoints refuses them at open, naming the member and the pack flag."""
    for targets, member in [
        (ringfeed.Targets(boxes="stored", instance_masks=True), "targets.instance_masks"),
        (ringfeed.Targets(boxes="stored", keypoints=17), "targets.keypoints 17"),
    ]:
        with pytest.raises(ringfeed.ServerError, match=member) as e:
            ringfeed.Loader(
                served["root"] / "packed", 2, PIPE, targets=targets, server=ringfeed.Server(socket=sock, spawn=True)
            )
        assert e.value.code == "bad_request"
        assert "--coco" in str(e.value)


def by_index(batches: list[dict[str, Any]]) -> dict[int, dict[str, torch.Tensor]]:
    """Each delivered sample's ``detection_targets`` and crop, by dataset index."""
    out = {}
    for b in batches:
        for p, (t, k) in enumerate(zip(ringfeed.detection_targets(b), b["index"].tolist(), strict=True)):
            out[k] = {**t, "crop": b["crop"][p]}
    return out


def test_webdataset_instance_masks_and_keypoints_equal_the_packed_sets_on_two_ranks(
    instances_set: dict[str, Any], sock: str
) -> None:
    """Over an epoch on 2 ranks, every WebDataset sample's boxes, instance masks (polygons, unions, RLE compressed and
    not, rasterised from its ``json`` member at the image's size) and keypoints equal those of the same pictures packed
    with ``--coco``, and torchvision v2's replay of the drawn crop and flip."""
    kinds = instance_sources(instances_set)
    got: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for kind, (path, targets) in kinds.items():
        seen: list[int] = []
        got[kind] = {}
        for rank in (0, 1):
            with targets_loader(path, sock, targets, rank=rank, world_size=2) as ld:
                ld.set_epoch(1)
                batches = list(ld)
            part = check_instances(instances_set, batches)
            assert not set(part) & set(seen)
            seen += part
            got[kind] |= by_index(batches)
        assert sorted(seen) == list(range(SERVED)), kind
    masks = 0
    for k in range(SERVED):
        packed, wds = got["packed"][k], got["webdataset"][k]
        assert packed.keys() == wds.keys() >= {"boxes", "labels", "masks", "keypoints", "crop"}
        for name, value in packed.items():
            assert torch.equal(value, wds[name]), (k, name)
        masks += len(wds["masks"])
    assert masks > 0


WDS_ALL = ringfeed.Targets(
    boxes="json:annotations", max_boxes=5, mask="png", mask_fill=FILL, instance_masks=True, keypoints=KP
)


def test_webdataset_targets_from_object_storage_equal_the_local_tars_on_two_ranks(
    instances_set: dict[str, Any], sockdir: Path, tmp_path: Path
) -> None:
    """The instance set's tars put in a real S3 server (s3s-fs) and served from it (``s3://``): over an epoch on 2
    ranks every sample's image, crop, boxes, labels, label map, instance masks and keypoints equal the same tars
    served from local disk (and torchvision v2's replay)."""
    from _s3 import BUCKET, s3_server
    from test_remote_wds import serving, upload

    local = instances_set["root"] / "wds"
    got: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    with s3_server("s3s-fs") as store:
        upload(store, local, "det")
        sock = str(sockdir / "t.sock")
        with serving(store, sock, tmp_path):
            for kind, path in [("remote", f"s3://{BUCKET}/det"), ("local", str(local))]:
                seen: list[int] = []
                got[kind] = {}
                for rank in (0, 1):
                    ld = ringfeed.Loader(
                        ringfeed.WebDataset(path, label=""), 3, PIPE, seed=4, fields=["index", "crop"],
                        drop_last=False, targets=WDS_ALL, rank=rank, world_size=2,
                        server=ringfeed.Server(socket=sock),
                    )  # fmt: skip
                    with ld:
                        ld.set_epoch(1)
                        batches = [{k: v.clone() if hasattr(v, "clone") else v for k, v in b.items()} for b in ld]
                    assert {"mask", "instance_masks", "keypoints"} <= set(batches[0]), kind
                    part = check_instances(instances_set, batches)
                    assert not set(part) & set(seen), kind
                    seen += part
                    got[kind] |= by_index(batches)
                    for b in batches:
                        for p, k in enumerate(b["index"].tolist()):
                            got[kind][k] |= {"image": b["image"][p], "mask": b["mask"][p]}
                assert sorted(seen) == list(range(SERVED)), kind
    masks = 0
    for k in range(SERVED):
        remote, there = got["remote"][k], got["local"][k]
        assert remote.keys() == there.keys() >= {"image", "boxes", "labels", "mask", "masks", "keypoints", "crop"}
        for name, value in there.items():
            assert torch.equal(value, remote[name]), (k, name)
        masks += len(remote["masks"])
    assert masks > 0
    assert any(got["remote"][k]["mask"].ne(FILL).any() for k in range(SERVED))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"segmentation": None}, "no `segmentation` (targets.instance_masks needs one"),
        ({"keypoints": [1, 2, 2]}, f"1 keypoints, targets.keypoints is {KP} (keypoint count mismatch)"),
        ({"keypoints": [1, 2]}, "`keypoints` is not [x, y, v] * K"),
        ({"segmentation": [[1, 2, 3, 4, 5]]}, "polygon 0: a polygon is [x0, y0, x1, y1, ...] with at least 3 points"),
        (
            {"segmentation": {"counts": [0, 41 * 30], "size": [30, 41]}},
            "its RLE `size` is [30, 41] (height, width), the image is 40x30",
        ),
        ({"segmentation": {"counts": "0\x7f", "size": [30, 40]}}, "the compressed RLE `counts` hold"),
    ],
)  # fmt: skip
def test_a_bad_webdataset_instance_annotation_is_the_samples_error(
    tmp_path: Path, sock: str, change: dict[str, Any], message: str
) -> None:
    """A WebDataset annotation without a segmentation, with another keypoint count, a malformed polygon or an RLE of
    another size fails that sample, naming the sample, the member and the annotation (with its id)."""
    import webdataset

    jpg = io.BytesIO()
    picture(40, 30, 1).save(jpg, "JPEG")
    good = {"id": 7, "bbox": [1, 2, 10, 8], "category_id": 1, "segmentation": [[1, 2, 11, 2, 11, 10, 1, 10]],
            "keypoints": [2, 3, 2] * KP}  # fmt: skip
    bad = {**good, "id": 8, **change}
    if change.get("segmentation", 0) is None:
        del bad["segmentation"]
    with webdataset.TarWriter(str(tmp_path / "a.tar")) as sink:
        sink.write({"__key__": "k0", "jpg": jpg.getvalue(), "json": {"annotations": [good, bad]}})
    with (
        targets_loader(ringfeed.WebDataset(str(tmp_path), label=""), sock, WDS_INSTANCES) as ld,
        pytest.raises(ringfeed.ServerError) as e,
    ):
        list(ld)
    assert e.value.code == "sample"
    text = str(e.value)
    for part in ("k0", "json:annotations", "annotation 1 (id 8)", message):
        assert part in text, text


def pack_changed(s: dict[str, Any], doc: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess:
    """``pack --coco`` of the instance set's images with ``doc`` (written to ``a.json``), expected to fail."""
    (tmp_path / "a.json").write_text(json.dumps(doc))
    images, out = str(s["root"] / "images"), str(tmp_path / "out")
    return run("pack", images, out, "--coco", str(tmp_path / "a.json"), ok=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"segmentation": [[1, 2, 3, 4, 5]]}, "polygon 0: a polygon is [x0, y0, x1, y1, ...] with at least 3 points"),
        ({"segmentation": [[1, 2, 3, "x", 5, 6]]}, "polygon 0: a polygon is a list of numbers"),
        ({"keypoints": [1, 2, 2]}, "keypoint count mismatch"),
        ({"keypoints": [1, 2]}, "`keypoints` is not [x, y, v] * K"),
    ],
)
def test_bad_segmentations_and_keypoints_stop_the_pack_naming_the_annotation(
    instances_set: dict[str, Any], tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    """A malformed polygon or keypoint list, or an annotation with another keypoint count, stops
    the pack before any image is read, naming the file and the annotation."""
    doc = json.loads(json.dumps(instances_set["doc"]))
    at = next(i for i, a in enumerate(doc["annotations"]) if i >= 4 and not a.get("iscrowd"))
    doc["annotations"][at].update(change)
    r = pack_changed(instances_set, doc, tmp_path)
    assert message in r.stderr, r.stderr
    assert f"annotations[{at}] (id {doc['annotations'][at]['id']})" in r.stderr
    assert "a.json" in r.stderr
    assert not (tmp_path / "out").exists()


def test_an_rle_of_another_size_fails_its_image(instances_set: dict[str, Any], tmp_path: Path) -> None:
    """An RLE whose ``size`` is not its image's is that image's failure, naming the annotation and both sizes."""
    doc = json.loads(json.dumps(instances_set["doc"]))
    ann = next(a for a in doc["annotations"] if a["image_id"] == 2 and not a.get("iscrowd"))
    _, w, h = instances_set["images"][2]
    ann["segmentation"] = {"counts": [0, (w + 1) * h], "size": [h, w + 1]}
    r = pack_changed(instances_set, doc, tmp_path)
    assert f"(id {ann['id']}): its RLE `size` is [{h}, {w + 1}] (height, width), the image is {w}x{h}" in r.stderr, (
        r.stderr
    )
    assert "im_002.jpg" in r.stderr


@pytest.mark.parametrize("kind", ["packed", "webdataset"])
def test_samples_handed_to_the_gpu_decoder_carry_their_instances(
    instances_set: dict[str, Any], sock: str, kind: str
) -> None:
    """Hybrid decode (the host backend): samples left encoded for the client's GPU get the instance
    masks and keypoints the server moved through the geometry it planned, torchvision's as for the rest."""
    path, targets = instance_sources(instances_set)[kind]
    with targets_loader(path, sock, targets, gpu_decode=1.0, _gpu_backend="host") as ld:
        ld.set_epoch(1)
        batches = list(ld)
        stats = ld.stats()
    assert sorted(check_instances(instances_set, batches)) == list(range(SERVED))
    assert stats["gpu_samples"] > 0, stats
