"""The per-image GPU steps (``ringfeed.gpu.ops``) against the server's CPU ops on the same pixels
and the same draws.

The server runs a pipeline through ``ringfeed ops`` (its own ``Processor``), which prints every
sample's draws and the ``gpu_ops`` records a GPU sample would carry (ring.md, control 1.8: the
tail's steps, lowered by the same code the server's CPU path runs); the same command run on the
pipeline's geometric prefix alone gives each sample's pixels before the steps (the crop is drawn
first, so it is the same crop). The GPU kernels run the records on those pixels, batched, and
must give the server's bytes: exactly for the integer-valued kinds (the ones exact against
torchvision: invert, solarize, posterize, autocontrast, equalize, grayscale, remaps), PSNR >= 40
dB for the rest. Inputs are PNGs, so the decoded pixels are exact. Runs on the CPU (CI has no
GPU) and on a CUDA device where there is one.
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
from _support import ringfeed_bin
from PIL import Image
from test_pixels import photo
from torch.utils._python_dispatch import TorchDispatchMode

from ringfeed.gpu import ops as gops

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
#: Kinds whose server op is exact against torchvision: the GPU op must give the same bytes.
EXACT = {"remap", "grayscale", "solarize", "posterize", "invert", "autocontrast", "equalize"}
#: TrivialAugmentWide's and RandAugment's augmentations.
OPS14 = {
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
}


@pytest.fixture(scope="module")
def png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 67x53 PNG photo."""
    path = tmp_path_factory.mktemp("gpu-ops") / "p.png"
    buf = io.BytesIO()
    Image.fromarray(np.asarray(photo(67, 53, 7))).save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return path


def run_ops(image: Path, ops: list[dict[str, Any]], count: int, seed: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """``ringfeed ops`` on one view of ``ops``: every sample's output (``[count, H*W*3]``) and draws."""
    out = image.parent / "out.bin"
    pipeline = json.dumps({"views": [{"name": "image", "ops": ops}]})
    cmd = [ringfeed_bin(), "ops", str(image), "--pipeline", pipeline, "--count", str(count), "--seed", str(seed)]
    r = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.uint8).reshape(count, -1), [json.loads(x) for x in r.stdout.splitlines()]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def records_of(lines: list[dict[str, Any]]) -> np.ndarray:
    """The ``gpu_ops`` records of ``ringfeed ops``'s lines, ``[count, S, 16]`` (S: the most steps
    any sample drew, at least 1; zeros after each sample's steps, as the ring holds them)."""
    recs = [line["gpu_ops"] for line in lines]
    assert all(r is not None for r in recs), "every sample's geometry is the GPU's"
    s = max(1, *(len(r) for r in recs))
    out = np.zeros((len(recs), s, gops.RECORD_INTS), dtype=np.int32)
    for i, r in enumerate(recs):
        if r:
            out[i, : len(r)] = np.array(r, dtype=np.int64).astype(np.int32)
    return out


def replay(
    image: Path, ops: list[dict[str, Any]], size: tuple[int, int], device: str, count: int = 16, seed: int = 0
) -> tuple[list[dict[str, Any]], gops.OpTable, list[list[str]], np.ndarray, np.ndarray]:
    """Runs ``ops`` on the server and its prefix on the server, then the rest on the GPU path from
    the server's records. Returns the lines, the table, each sample's step kinds, the GPU's and
    the server's images (``[count, H*W*3]``)."""
    p = gops.prefix_len(ops)
    want, lines = run_ops(image, ops, count, seed)
    pre, _ = run_ops(image, ops[:p], count, seed)
    recs = records_of(lines)
    kinds = [[gops.KIND_CODES[int(c)] for c in r[:, 0] if c] for r in recs]
    table = gops.OpTable.from_records(recs, size, device=device)
    x = torch.from_numpy(pre.reshape(count, *size, 3).copy()).to(device)
    gops.apply(x, table)
    return lines, table, kinds, x.cpu().numpy().reshape(count, -1), want


def check(kinds: list[list[str]], got: np.ndarray, want: np.ndarray) -> float:
    """Each sample exact where all its steps are exact kinds, else PSNR >= 40 dB; the least PSNR."""
    least = math.inf
    for i, k in enumerate(kinds):
        if set(k) <= EXACT:
            assert np.array_equal(got[i], want[i]), f"sample {i} ({sorted(k)}) differs from the server"
        q = psnr(got[i], want[i])
        assert q >= 40.0, f"sample {i} ({k}): PSNR {q:.1f} dB"
        least = min(least, q)
    return least


IDENTITY = {"op": "center_crop", "size": [53, 67]}

PER_OP = [
    [{"op": "invert", "p": 1.0}],
    [{"op": "solarize", "threshold": 100, "p": 1.0}],
    [{"op": "solarize", "threshold": 0, "p": 0.5}],
    [{"op": "posterize", "bits": 3, "p": 1.0}],
    [{"op": "posterize", "bits": 0, "p": 1.0}],
    [{"op": "autocontrast", "p": 1.0}],
    [{"op": "equalize", "p": 1.0}],
    [{"op": "grayscale", "p": 0.5}],
    # Flips after a non-geometric op run here (at the head they are the prefix's).
    [{"op": "invert", "p": 0.0}, {"op": "horizontal_flip"}, {"op": "vertical_flip"}],
    [{"op": "adjust_sharpness", "sharpness_factor": 2.0, "p": 1.0}],
    [{"op": "adjust_sharpness", "sharpness_factor": 0.3, "p": 1.0}],
    [{"op": "color_jitter", "brightness": [0.2, 1.8]}],
    [{"op": "color_jitter", "contrast": [0.2, 1.8]}],
    [{"op": "color_jitter", "saturation": [0.0, 2.0]}],
    [{"op": "color_jitter", "hue": [-0.5, 0.5]}],
    [
        {
            "op": "color_jitter",
            "brightness": [0.6, 1.4],
            "contrast": [0.6, 1.4],
            "saturation": [0.6, 1.4],
            "hue": [-0.1, 0.1],
        }
    ],
    [{"op": "gaussian_blur", "kernel_size": [5], "sigma": [0.1, 2.0]}],
    [{"op": "gaussian_blur", "kernel_size": [23], "sigma": [0.1, 2.0]}],
    [{"op": "gaussian_blur", "kernel_size": [3, 7], "sigma": [0.5, 3.0]}],
    [
        {
            "op": "random_apply",
            "p": 0.5,
            "ops": [{"op": "color_jitter", "brightness": [0.5, 1.5]}, {"op": "invert", "p": 1}],
        },
        {"op": "random_choice", "ops": [{"op": "equalize", "p": 1.0}, {"op": "solarize", "threshold": 128, "p": 1.0}]},
    ],
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "ops", PER_OP, ids=lambda o: "+".join(x["op"] for x in o) + f"-{abs(hash(json.dumps(o))) % 997}"
)
def test_each_op_matches_the_server(png: Path, ops: list[dict[str, Any]], device: str) -> None:
    """Each op, replayed on the GPU path from the server's draws, gives the server's image: the
    same bytes for the integer-valued ops, PSNR >= 40 dB for the rest."""
    _, table, steps, got, want = replay(png, [IDENTITY, *ops], (53, 67), device)
    assert table.kinds(), "the draws made at least one sample run an op"
    print(f"{sorted(table.kinds())}: least PSNR {check(steps, got, want)} dB")


POLICIES = [
    ({"op": "trivial_augment_wide"}, OPS14),
    ({"op": "trivial_augment_wide", "interpolation": "bilinear", "fill": [10, 200, 30]}, OPS14),
    ({"op": "rand_augment", "num_ops": 2, "magnitude": 9}, OPS14),
    ({"op": "rand_augment", "num_ops": 2, "magnitude": 30, "interpolation": "bilinear", "fill": [128]}, OPS14),
    ({"op": "auto_augment", "policy": "imagenet"}, None),
    ({"op": "auto_augment", "policy": "cifar10"}, None),
    ({"op": "auto_augment", "policy": "svhn", "fill": [255, 0, 0]}, None),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [(32, 32), (28, 40)], ids=["square", "wide"])
@pytest.mark.parametrize(("policy", "every"), POLICIES, ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_policies_match_the_server(
    png: Path, policy: dict[str, Any], every: set[str] | None, size: tuple[int, int], device: str
) -> None:
    """Every augmentation a policy draws (each seen over 240 samples), replayed on the GPU path
    after a RandomResizedCrop, gives the server's image: exact for chains of exact ops, PSNR >= 40 dB
    otherwise. Square sizes take the exact quarter turns, others the warp at 90 degrees."""
    ops = [{"op": "random_resized_crop", "size": list(size)}, policy]
    lines, _, steps, got, want = replay(png, ops, size, device, count=240, seed=3)
    seen = {e["aug"] for line in lines for e in line["trace"] if "aug" in e and e.get("apply", True)}
    if every is not None:
        assert seen == every, f"not drawn in 240 samples: {sorted(every - seen)}"
    print(f"{policy['op']} {size}: least PSNR {check(steps, got, want)} dB")


@pytest.mark.parametrize("device", DEVICES)
def test_a_recipe_chain_matches_the_server(png: Path, device: str) -> None:
    """A full recipe's chain (TrivialAugmentWide, ColorJitter, GaussianBlur, a flip after them):
    each sample's ops in its own order, step by step, give the server's image."""
    ops = [
        {"op": "random_resized_crop", "size": [32, 32]},
        {"op": "trivial_augment_wide"},
        {
            "op": "color_jitter",
            "brightness": [0.6, 1.4],
            "contrast": [0.6, 1.4],
            "saturation": [0.6, 1.4],
            "hue": [-0.1, 0.1],
        },
        {"op": "gaussian_blur", "kernel_size": [5], "sigma": [0.1, 2.0]},
        {"op": "horizontal_flip"},
    ]
    _, table, steps, got, want = replay(png, ops, (32, 32), device, count=64, seed=5)
    assert len(table.steps) >= 6
    print(f"recipe chain: least PSNR {check(steps, got, want)} dB")


@pytest.mark.parametrize("device", DEVICES)
def test_nchw_and_rows(png: Path, device: str) -> None:
    """In an NCHW batch, with the samples in rows the table names (the rest untouched), the
    result is the NHWC one's."""
    ops = [IDENTITY, {"op": "trivial_augment_wide"}, {"op": "gaussian_blur", "kernel_size": [3]}]
    lines, _, _, got, _ = replay(png, ops, (53, 67), device, count=8)
    pre, _ = run_ops(png, [IDENTITY], 8, 0)
    rows = [1, 3, 5, 7, 9, 11, 13, 15]
    table = gops.OpTable.from_records(records_of(lines), (53, 67), rows=rows, device=device)
    batch = torch.zeros(16, 53, 67, 3, dtype=torch.uint8)
    batch[rows] = torch.from_numpy(pre.reshape(8, 53, 67, 3))
    nchw = batch.permute(0, 3, 1, 2).contiguous().to(device)
    gops.apply(nchw, table, "NCHW")
    out = nchw.permute(0, 2, 3, 1).cpu().numpy()
    assert np.array_equal(out[rows].reshape(8, -1), got)
    assert not out[::2].any(), "rows the table does not name are untouched"


class Launches(TorchDispatchMode):
    """Counts the tensor ops that run a kernel (every op but views and allocations): on a GPU each
    is at least one launch."""

    SKIP = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided"})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view and func._schema.name not in self.SKIP:
            self.count += 1
        return func(*args, **(kwargs or {}))


def launches(table: gops.OpTable, n: int, size: tuple[int, int]) -> int:
    x = torch.zeros(n, *size, 3, dtype=torch.uint8)
    with Launches() as c:
        gops.apply(x, table)
    return c.count


RECIPES = {
    "TrivialAugmentWide": [{"op": "trivial_augment_wide"}],
    "RandAugment(2, 9)": [{"op": "rand_augment", "num_ops": 2, "magnitude": 9}],
    "ColorJitter(0.4, 0.4, 0.4, 0.1)": [
        {
            "op": "color_jitter",
            "brightness": [0.6, 1.4],
            "contrast": [0.6, 1.4],
            "saturation": [0.6, 1.4],
            "hue": [-0.1, 0.1],
        }
    ],
    "GaussianBlur(23)": [{"op": "gaussian_blur", "kernel_size": [23], "sigma": [0.1, 2.0]}],
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_launches_do_not_grow_with_the_batch(png: Path, recipe: str) -> None:
    """The kernels a batch launches depend on which ops its samples drew, not on how many
    samples: the same draws four times over (a batch of 512 for 128) launch as many."""
    ops = [{"op": "random_resized_crop", "size": [32, 32]}, *RECIPES[recipe]]
    _, lines = run_ops(png, ops, 128, 1)
    recs = records_of(lines)
    small = gops.OpTable.from_records(recs, (32, 32))
    large = gops.OpTable.from_records(np.concatenate([recs] * 4), (32, 32))
    n = launches(small, 128, (32, 32))
    assert n > 0
    assert launches(large, 512, (32, 32)) == n
    print(f"{recipe}: {len(small.steps)} steps, {small.groups()} groups, {n} launches per batch")


def test_records_match_the_vectors() -> None:
    """The client reads the spec's ``gpu_ops`` vectors (written by the server's code) as the
    server wrote them: each kind's code and name, its argument and its float32 parameters."""
    vectors = json.loads((Path(__file__).parents[2] / "proto/vectors/ring/gpu_ops.json").read_text())
    assert vectors["record_ints"] == gops.RECORD_INTS
    assert vectors["max_steps"] == gops.MAX_STEPS
    assert {k["code"]: k["name"] for k in vectors["kinds"]} == gops.KIND_CODES
    recs = np.array([c["record"] for c in vectors["steps"]], dtype=np.int64).astype(np.int32)
    params = recs[:, 2:].view(np.float32)
    for case, r, p in zip(vectors["steps"], recs, params, strict=True):
        assert gops.KIND_CODES[int(r[0])] == case["kind"], case["step"]
        assert int(r[1]) == case["arg"], case["step"]
        assert [float(v) for v in p] == case["params"], case["step"]
    # Each record runs on an image of the vectors' size (every kind has a kernel).
    w, h = vectors["size"]
    table = gops.OpTable.from_records(recs[:, None, :], (h, w))
    assert table.kinds() == set(gops.KIND_CODES.values())
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (len(recs), h, w, 3), dtype=np.uint8))
    gops.apply(x, table)


def test_a_record_of_an_unknown_kind_is_refused() -> None:
    """A kind this client does not know (a newer server's) is an error naming it and the step, not
    a sample left unfinished."""
    recs = np.zeros((3, 2, gops.RECORD_INTS), dtype=np.int32)
    recs[:, 0, 0] = 7  # invert
    recs[1, 1, 0] = 99
    with pytest.raises(ValueError, match="step 1 has kind 99"):
        gops.OpTable.from_records(recs, (8, 8))
    with pytest.raises(ValueError, match=r"\[n, S, 16\]"):
        gops.OpTable.from_records(recs[:, :, :8], (8, 8))


def test_ops_that_change_the_size_after_a_per_image_op_are_named() -> None:
    """The client's eligibility rule names the first op that has no step (for
    ``gpu_decode_reason``): a crop or resize after a per-image op, inside a container too."""
    rrc = {"op": "random_resized_crop", "size": [32, 32]}

    def why(*ops: dict[str, Any]) -> str | None:
        return gops.pipeline_problem({"views": [{"ops": list(ops)}]})

    assert why(rrc, {"op": "horizontal_flip"}, {"op": "trivial_augment_wide"}) is None
    assert "resizes twice" in str(why(rrc, {"op": "resize", "size": [16]}))
    late = why(rrc, {"op": "invert"}, {"op": "random_apply", "ops": [{"op": "center_crop", "size": [8]}]})
    assert late is not None
    assert late.startswith("center_crop changes the image's size"), late
    assert "not geometric" in str(gops.pipeline_problem({"views": [{"ops": [rrc, {"op": "invert"}]}]}, False))
