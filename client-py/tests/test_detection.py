"""Detection and segmentation targets, packed: ``ringfeed pack --coco FILE --masks DIR`` over
real images and VOC-style palette masks written by Pillow, read back by the Python reader of
``targets.rft`` and compared with what torchvision makes of the same COCO annotations.

Serving them (``open.targets``, the ring fields ``boxes``/``box_labels``/``box_count``/``mask``)
is not in this branch yet; see docs/detection.md.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _support import ringfeed_bin
from PIL import Image
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
    v = run("verify", str(out))
    assert "ok: targets of 4 samples: 9 boxes (at most 5 per sample), 4 masks" in v.stdout
    info = json.loads(run("inspect", str(out), "--json", "--sample", "0").stdout)
    assert info["targets"]["boxes"] == 9
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


def test_a_1_9_server_is_refused_naming_its_version(tmp_path: Path, sock: str) -> None:
    """Against the server binary (protocol 1.9), a loader with targets raises before it opens,
    naming the server's version and what targets need: a 1.9 server would ignore them."""
    write_set(tmp_path)
    out = tmp_path / "out"
    pack_set(tmp_path, out)
    server = ringfeed.Server(socket=sock, spawn=True, timeout=60)
    with pytest.raises(ringfeed.RingfeedError, match=r"speaks protocol 1\.9; detection and segmentation targets need"):
        ringfeed.Loader(out, 2, ONE_VIEW, targets=ringfeed.Targets(boxes="stored", mask="stored"), server=server)
