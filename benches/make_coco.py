#!/usr/bin/env python3
"""A COCO-style detection and semantic-segmentation set, deterministic from a seed (issue 30).

    python3 benches/make_coco.py OUT [--count 2000] [--photos DIR] [--seed 0] [--jobs N]

Each image is a photo of the standard corpus (`benches/make_photos.py`: ImageNet-like sizes and
JPEG settings) with 1-20 synthetic objects drawn on it. An object's category (1..20, named after
VOC's 20 classes) decides its kind and colour, so a model can learn them: a filled rectangle, an
ellipse, a triangle, or a patch of the photo itself (cut elsewhere, mirrored, resized and tinted
with the category's colour). Each object is 4-45 % of the photo's shorter side across, anywhere
inside it; later objects cover earlier ones.

Written:
- `OUT/images/<stem>.jpg`: the photo with its objects (RGB, JPEG quality 90);
- `OUT/masks/<stem>.png`: its label map (8-bit grey, the image's size): 0 background, each
  object's pixels its category, in drawing order (VOC's layout, without the 255 "void" border);
- `OUT/annotations.json`: COCO *instances*: `images` (`id` from 1, `file_name`, `width`,
  `height`), `annotations` (`bbox` `[x, y, w, h]`: the drawn shape's bounding box, `area` its
  box's, `category_id`, `iscrowd` 0, no `segmentation`), `categories`.

`--photos DIR` takes the first `--count` photos of an existing corpus (`DIR/manifest.tsv`, as
make_photos.py writes it); without it they are made into `OUT/photos`. Pack the set with

    ringfeed pack OUT/images PACKED --coco OUT/annotations.json --masks OUT/masks

Needs numpy, pillow and scikit-image (the photos).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageOps

BENCHES = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHES))  # make_laion.py (its corpus helper)
from make_laion import photo_files  # noqa: E402

#: VOC's 20 object classes: category k + 1 is CLASSES[k] (0 is the background of the masks).
CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip
KINDS = ("rectangle", "ellipse", "triangle", "patch")
MAX_OBJECTS = 20
#: An object's size, as a share of the photo's shorter side.
MIN_SIDE, MAX_SIDE = 0.04, 0.45


def colour(category: int) -> tuple[int, int, int]:
    """The category's colour: well spread over the hues, fixed."""
    rng = np.random.default_rng([7, category])
    return tuple(int(v) for v in rng.integers(20, 236, size=3))


def draw_objects(im: Image.Image, mask: Image.Image, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Draws 1-20 objects on `im` and their categories on `mask`; returns their COCO annotations
    (without ids)."""
    w, h = im.size
    short = min(w, h)
    canvas, labels = ImageDraw.Draw(im), ImageDraw.Draw(mask)
    out = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        category = int(rng.integers(1, len(CLASSES) + 1))
        kind = KINDS[category % len(KINDS)]
        bw = max(2, int(short * rng.uniform(MIN_SIDE, MAX_SIDE)))
        bh = max(2, int(short * rng.uniform(MIN_SIDE, MAX_SIDE)))
        x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        x1, y1 = x0 + bw, y0 + bh  # the box is [x0, x1) x [y0, y1): bw x bh pixels
        fill = colour(category)
        if kind == "rectangle":
            canvas.rectangle((x0, y0, x1 - 1, y1 - 1), fill=fill)
            labels.rectangle((x0, y0, x1 - 1, y1 - 1), fill=category)
        elif kind == "ellipse":
            canvas.ellipse((x0, y0, x1 - 1, y1 - 1), fill=fill)
            labels.ellipse((x0, y0, x1 - 1, y1 - 1), fill=category)
        elif kind == "triangle":
            # Apex on the top edge, base on the bottom: the shape touches all four sides of its box.
            apex = x0 + int(rng.integers(0, bw))
            pts = [(apex, y0), (x1 - 1, y1 - 1), (x0, y1 - 1)]
            canvas.polygon(pts, fill=fill)
            labels.polygon(pts, fill=category)
        else:
            # A patch of the photo itself (cut elsewhere, mirrored), tinted half-way to the colour.
            sx, sy = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
            patch = ImageOps.mirror(im.crop((sx, sy, sx + bw, sy + bh)))
            patch = Image.blend(patch, Image.new("RGB", patch.size, fill), 0.5)
            im.paste(patch, (x0, y0))
            labels.rectangle((x0, y0, x1 - 1, y1 - 1), fill=category)
        out.append(
            {
                "bbox": [float(x0), float(y0), float(bw), float(bh)],
                "area": float(bw * bh),
                "category_id": category,
                "iscrowd": 0,
            }
        )
    return out


def make_one(job: tuple[int, str, str, int]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Image `i` of the set from the photo at `src`: its COCO image entry and annotations."""
    i, src, out, seed = job
    rng = np.random.default_rng([seed, 30, i])
    with Image.open(src) as photo:
        im = photo.convert("RGB")
    mask = Image.new("L", im.size, 0)
    anns = draw_objects(im, mask, rng)
    stem = f"{i:08d}"
    im.save(Path(out) / "images" / f"{stem}.jpg", quality=90)
    mask.save(Path(out) / "masks" / f"{stem}.png")
    entry = {"id": i + 1, "file_name": f"{stem}.jpg", "width": im.width, "height": im.height}
    return entry, [a | {"image_id": i + 1} for a in anns]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--photos", type=Path, default=None, help="an existing make_photos.py corpus")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    files = photo_files(a)
    for sub in ("images", "masks"):
        (a.out / sub).mkdir(exist_ok=True)
    jobs = [(i, str(p), str(a.out), a.seed) for i, p in enumerate(files)]
    images, annotations = [], []
    with ProcessPoolExecutor(a.jobs) as ex:
        for entry, anns in ex.map(make_one, jobs, chunksize=16):
            images.append(entry)
            for ann in anns:
                annotations.append({"id": len(annotations) + 1} | ann)
    doc = {
        "info": {"description": "benches/make_coco.py", "seed": a.seed},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": k + 1, "name": n, "supercategory": "voc"} for k, n in enumerate(CLASSES)],
    }
    (a.out / "annotations.json").write_text(json.dumps(doc))
    print(
        f"{len(images)} images, {len(annotations)} objects ({len(annotations) / len(images):.1f} an image)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
