"""Issue 30's detection bench at toy size on the CPU: ``benches/make_coco.py`` draws objects on
photos of the standard corpus and writes their COCO annotations and label maps, ``ringfeed pack
--coco --masks`` packs them, and ``benches/det_train.py`` trains a torchvision RetinaNet on them,
fed by each of its loaders, against the real server. Timing is not tested: that the set is what
its annotations say, that the bench's target conversion is torchvision's list of dicts, and that
every run is reported and agrees with itself, is."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _fleet import REPO, binary, client_env
from PIL import Image

import ringfeed

N = 6


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**client_env(), "RINGFEED_BIN": binary()}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N images of make_coco.py (photos made by make_photos.py), packed with their targets."""
    pytest.importorskip("skimage")
    root = tmp_path_factory.mktemp("coco")
    out = run(str(REPO / "benches" / "make_coco.py"), str(root / "set"), "--count", str(N), "--jobs", "2")
    assert out.returncode == 0, out.stderr
    pack = subprocess.run(
        [binary(), "pack", str(root / "set" / "images"), str(root / "packed"), "--coco",
         str(root / "set" / "annotations.json"), "--masks", str(root / "set" / "masks"), "--progress", "none"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert pack.returncode == 0, pack.stderr
    assert f"{N} masks" in pack.stdout, pack.stdout
    return root


def test_every_object_is_in_its_box_and_the_label_map(coco: Path) -> None:
    """Each image has 1-20 annotations of categories 1..20 whose boxes lie inside it; every labelled
    pixel of its mask lies in a box of that category, and the last-drawn object's box holds its
    category (nothing covers it); the label map has the image's size."""
    doc = json.loads((coco / "set" / "annotations.json").read_text())
    assert [c["id"] for c in doc["categories"]] == list(range(1, 21))
    assert [e["id"] for e in doc["images"]] == list(range(1, N + 1))
    for entry in doc["images"]:
        anns = [a for a in doc["annotations"] if a["image_id"] == entry["id"]]
        assert 1 <= len(anns) <= 20
        w, h = entry["width"], entry["height"]
        with Image.open(coco / "set" / "images" / entry["file_name"]) as im:
            assert im.size == (w, h)
        mask = np.asarray(Image.open(coco / "set" / "masks" / (Path(entry["file_name"]).stem + ".png")))
        assert mask.shape == (h, w)
        inside = np.zeros((21, h, w), dtype=bool)
        for a in anns:
            x, y, bw, bh = (int(v) for v in a["bbox"])
            assert 1 <= a["category_id"] <= 20
            assert a["iscrowd"] == 0
            assert min(x, y) >= 0, a
            assert min(bw, bh) >= 2, a
            assert y + bh <= h, a
            assert x + bw <= w, a
            inside[a["category_id"], y : y + bh, x : x + bw] = True
        ys, xs = np.nonzero(mask)
        assert inside[mask[ys, xs], ys, xs].all(), entry
        top = anns[-1]
        x, y, bw, bh = (int(v) for v in top["bbox"])
        assert (mask[y : y + bh, x : x + bw] == top["category_id"]).any(), top


def test_the_set_is_the_same_from_the_same_seed(coco: Path, tmp_path: Path) -> None:
    """make_coco.py again over the same corpus writes the same annotations and the same label maps."""
    out = run(
        str(REPO / "benches" / "make_coco.py"), str(tmp_path), "--count", str(N), "--photos",
        str(coco / "set" / "photos"), "--jobs", "1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "annotations.json").read_text() == (coco / "set" / "annotations.json").read_text()
    for m in sorted((coco / "set" / "masks").glob("*.png")):
        assert (tmp_path / "masks" / m.name).read_bytes() == m.read_bytes(), m.name


def test_padded_boxes_become_torchvisions_list_of_dicts() -> None:
    """The conversion det_train.py uses (``ringfeed.detection_targets``) keeps each image's first
    box_count boxes and labels, in order, and nothing of the padding."""
    boxes = torch.arange(3 * 4 * 4, dtype=torch.float32).view(3, 4, 4)
    labels = torch.tensor([[5, 6, -1, -1], [-1, -1, -1, -1], [1, 2, 3, 4]])
    out = ringfeed.detection_targets(
        {"boxes": boxes, "box_labels": labels, "box_count": torch.tensor([2, 0, 4], dtype=torch.int32)}
    )
    assert [len(t["boxes"]) for t in out] == [2, 0, 4]
    assert torch.equal(out[0]["boxes"], boxes[0, :2])
    assert out[0]["labels"].tolist() == [5, 6]
    assert out[1]["boxes"].shape == (0, 4)
    assert out[1]["labels"].shape == (0,)
    assert torch.equal(out[2]["boxes"], boxes[2])
    assert out[2]["labels"].tolist() == [1, 2, 3, 4]


def test_every_loader_trains_retinanet_and_is_reported_against_the_ceiling(coco: Path, tmp_path: Path) -> None:
    """One JSON line per run (the ceiling, then ringfeed and the DataLoader), each of whole timed
    steps with a finite loss, its ratio its rate over the ceiling's; ringfeed says why hybrid decode
    is off on the CPU; det.json and det.md hold the same runs."""
    batch, steps = 2, 1
    out = run(
        str(REPO / "benches" / "det_train.py"), "--data", str(coco / "set"), "--packed", str(coco / "packed"),
        "--models", "retinanet", "--device", "cpu", "--batch", str(batch), "--steps", str(steps), "--size", "64",
        "--amp", "fp32", "--warmup-s", "0", "--warmup-steps", "1", "--threads", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["loader"], r["threads"]) for r in runs] == [("ceiling", None), ("ringfeed", 1), ("dataloader", 1)]
    ceiling = runs[0]["img_per_s"]
    for r in runs:
        assert (r["model"], r["batch"], r["size"], r["amp"]) == ("retinanet", batch, 64, "fp32"), r
        assert (r["steps"], r["images"]) == (steps, steps * batch), r
        assert math.isclose(r["img_per_s"], r["images"] / r["seconds"], rel_tol=1e-9), r
        assert math.isclose(r["ratio"], r["img_per_s"] / ceiling, rel_tol=1e-9), r
        assert math.isfinite(r["loss"]), r
        assert 0.0 <= r["wait_share"] <= 1.0, r
        assert 0.0 <= r["convert_share"] <= 1.0, r
    assert runs[1]["gpu_decode_reason"]
    record = json.loads((tmp_path / "det.json").read_text())
    assert record["runs"] == runs
    assert record["baseline"]["name"] == "ceiling"
    assert record["data"]["images"] == N
    table = (tmp_path / "det.md").read_text()
    for r in runs:
        assert f"| retinanet | {batch} | fp32 | {r['loader']} | {r['threads'] or '-'} | {r['img_per_s']:.1f} |" in table


def test_a_failing_autocast_step_moves_the_model_to_fp32() -> None:
    """When the first step under autocast raises (not for memory), the trainer says why, runs that
    step again in fp32 and stays there; a step that runs out of memory is raised as it is."""
    sys.path.insert(0, str(REPO / "benches"))
    from det_train import Trainer

    class Flaky(Trainer):
        def __init__(self, error: str) -> None:
            super().__init__("retinanet", argparse.Namespace(device="cpu", size=64, amp="bf16"))
            self.error, self.precisions = error, []

        def step(self, x: torch.Tensor, t: object) -> torch.Tensor:
            self.precisions.append(self.amp)
            if self.amp == "bf16":
                raise RuntimeError(self.error)
            return torch.tensor(1.0)

    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # the fallback turns them on
    try:
        t = Flaky("expected scalar type Float but found BFloat16\nmore")
        t.first_step(torch.zeros(1), [])
        assert t.precisions == ["bf16", "fp32"]
        assert t.amp == "fp32"
        assert t.fallback == "bf16 autocast failed: expected scalar type Float but found BFloat16"
        oom = Flaky("CUDA out of memory. Tried to allocate 2.00 GiB")
        with pytest.raises(RuntimeError, match="out of memory"):
            oom.first_step(torch.zeros(1), [])
        assert oom.amp == "bf16"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
