"""The fused per-image steps (``ringfeed.gpu.ops_kernel``) against the PyTorch path (``ops.apply``)
and the server.

The records are the server's (``ringfeed ops`` prints each sample's ``gpu_ops``), the pixels the
server's output of the pipeline's geometric prefix (``test_gpu_ops.replay``'s way). Each case puts
the samples in some rows of a larger batch (shuffled, the other rows random), runs the kernels
and ``ops.apply`` on copies of it and compares: the same bytes for every sample whose steps have
no blur, PSNR >= 40 dB against both ``ops.apply`` and the server for the rest (the kernel sums a
blur's taps in the server's order, ``ops.py``'s convolutions in another), every other row
untouched. CI has no GPU: the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``) on
CPU tensors, in a child process (the interpreter is chosen when a kernel is defined); on a CUDA
machine the same cases run compiled on the device.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _support import REPO, interpreted, needs_triton
from test_gpu_ops import PER_OP, POLICIES, RECIPES, launches, psnr, records_of, run_ops
from test_pixels import photo

from ringfeed.gpu import ops as gops

DEVICES = [
    pytest.param("cpu", marks=needs_triton),
    pytest.param(
        "cuda", marks=[needs_triton, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
    ),
]
BLUR = 11

# Runs the kernels on every case of argv[1] (npz) on device argv[3]; writes the batches to argv[2].
CHILD = r"""
import sys
import numpy as np
import torch
from ringfeed.gpu import ops_kernel as K

cases, device = np.load(sys.argv[1]), sys.argv[3]
out = {}
for name in sorted({k.split("__")[0] for k in cases.files}):
    layout = str(cases[name + "__layout"])
    batch = torch.from_numpy(cases[name + "__batch"].copy())
    if layout == "NCHW":
        batch = batch.permute(0, 3, 1, 2).contiguous()
    batch = batch.to(device)
    K.run(batch, cases[name + "__recs"], cases[name + "__rows"], layout, block=int(cases[name + "__block"]))
    if layout == "NCHW":
        batch = batch.permute(0, 2, 3, 1)
    out[name] = batch.cpu().numpy()
np.savez(sys.argv[2], **out)
"""


@pytest.fixture(scope="module")
def png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 40x30 PNG photo (small: the interpreter runs every program in Python)."""
    path = tmp_path_factory.mktemp("ops-kernel") / "p.png"
    buf = io.BytesIO()
    photo(40, 30, 7).save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return path


class Case:
    """One batch: the server's records and prefix pixels for ``count`` samples of ``ops`` at
    ``size``, put in shuffled rows of a batch with ``spare`` more rows of random bytes."""

    def __init__(
        self,
        png: Path,
        ops: list[dict[str, Any]],
        size: tuple[int, int],
        *,
        count: int = 8,
        seed: int = 0,
        layout: str = "NHWC",
        block: int = 256,
        keep: Any = None,
    ) -> None:
        rrc = {"op": "random_resized_crop", "size": list(size)}
        full = [rrc, *ops]
        p = gops.prefix_len(full)
        want, lines = run_ops(png, full, count, seed)
        pre, _ = run_ops(png, full[:p], count, seed)
        recs = records_of(lines)
        kinds = [[int(c) for c in r[:, 0] if c] for r in recs]
        sel = np.array([i for i, k in enumerate(kinds) if keep is None or keep(k)])
        assert len(sel), f"no sample of {ops} drew what the case keeps"
        self.recs = recs[sel]
        self.kinds = [kinds[i] for i in sel]
        self.want = want[sel].reshape(len(sel), *size, 3)
        m = len(sel)
        rng = np.random.default_rng(seed + 11)
        n = m + 3
        self.rows = rng.permutation(n)[:m].astype(np.int64)
        self.batch = rng.integers(0, 256, (n, *size, 3), dtype=np.uint8)
        self.batch[self.rows] = pre[sel].reshape(m, *size, 3)
        self.layout, self.block, self.size = layout, block, size
        # The PyTorch path on the CPU (exact against the server but for the blur's last bits).
        ref = torch.from_numpy(self.batch.copy())
        ref = ref if layout == "NHWC" else ref.permute(0, 3, 1, 2).contiguous()
        gops.apply(ref, gops.OpTable.from_records(self.recs, size, rows=self.rows), layout)
        self.ref = (ref if layout == "NHWC" else ref.permute(0, 2, 3, 1)).numpy()

    def arrays(self, name: str) -> dict[str, Any]:
        return {
            f"{name}__batch": self.batch,
            f"{name}__recs": self.recs,
            f"{name}__rows": self.rows,
            f"{name}__layout": np.array(self.layout),
            f"{name}__block": np.array(self.block),
        }

    def check(self, name: str, got: np.ndarray) -> dict[str, float]:
        """The kernels' batch against the PyTorch path's and the server's; the least PSNRs."""
        others = np.setdiff1d(np.arange(len(self.batch)), self.rows)
        assert np.array_equal(got[others], self.batch[others]), f"{name}: rows without samples changed"
        # Not vacuous: the steps changed the samples.
        assert not np.array_equal(self.ref[self.rows], self.batch[self.rows]), f"{name}: no step changed a pixel"
        least = {"ops": np.inf, "server": np.inf}
        for j, (row, kinds) in enumerate(zip(self.rows, self.kinds, strict=True)):
            a, b, s = got[row], self.ref[row], self.want[j]
            if BLUR not in kinds:
                diff = np.argwhere(a != b)
                assert not len(diff), f"{name}: sample {j} ({kinds}) differs from ops.apply at {diff[:3].tolist()}"
            for what, other in (("ops", b), ("server", s)):
                q = psnr(a, other)
                assert q >= 40.0, f"{name}: sample {j} ({kinds}): PSNR {q:.1f} dB against {what}"
                least[what] = min(least[what], q)
        return least


def execute(cases: dict[str, Case], device: str, tmp: Path) -> dict[str, dict[str, float]]:
    """Runs the kernels on every case in one child process and checks each; the least PSNRs."""
    src, dst = tmp / "cases.npz", tmp / "out.npz"
    np.savez(src, **{k: v for name, c in cases.items() for k, v in c.arrays(name).items()})
    if device == "cpu":
        interpreted(CHILD, src, dst, device)
    else:
        env = dict(os.environ, PYTHONPATH=str(REPO / "client-py"))
        env.pop("TRITON_INTERPRET", None)
        subprocess.run([sys.executable, "-c", CHILD, str(src), str(dst), device], env=env, check=True, timeout=600)
    got = np.load(dst)
    return {name: c.check(name, got[name]) for name, c in cases.items()}


def kinds_run(cases: dict[str, Case]) -> set[str]:
    return {gops.KIND_CODES[k] for c in cases.values() for ks in c.kinds for k in ks}


@pytest.mark.parametrize("device", DEVICES)
def test_each_kind_alone(png: Path, device: str, tmp_path: Path) -> None:
    """Each op of ``test_gpu_ops.PER_OP`` (every kind but the warp, with its edge cases: a
    threshold of 0, 0 bits, sharpness above and below 1, blurs of 5, 23 and 3x7), and the warp
    alone (a policy's samples that drew only it, nearest and bilinear with fill), quarter turns,
    in NHWC and
    NCHW: ``ops.apply``'s bytes (blur: PSNR >= 40 dB)."""
    cases = {f"op{j}": Case(png, ops, (20, 28), layout=("NHWC", "NCHW")[j % 2]) for j, ops in enumerate(PER_OP)}
    for interp, layout in (("nearest", "NHWC"), ("bilinear", "NCHW")):
        taw = {"op": "trivial_augment_wide", "interpolation": interp, "fill": [10, 200, 30]}
        cases[f"affine-{interp}"] = Case(
            png, [taw], (20, 28), count=32, seed=2, layout=layout, keep=lambda k: k == [12]
        )
    # Quarter turns (remaps with a rotation) are rare draws of TrivialAugmentWide on a square.
    cases["rot90"] = Case(png, [{"op": "trivial_augment_wide"}], (24, 24), count=1000, seed=7, keep=lambda k: k == [1])
    assert (cases["rot90"].recs[:, 0, 3] != 0).any(), "a quarter turn drawn"
    assert kinds_run(cases) == set(gops.KIND_CODES.values())
    for name, least in execute(cases, device, tmp_path).items():
        print(f"{name}: least PSNR {least}")


@pytest.mark.parametrize("device", DEVICES)
def test_policies(png: Path, device: str, tmp_path: Path) -> None:
    """TrivialAugmentWide, RandAugment and AutoAugment's policies, nearest and bilinear with fill,
    on a square size (quarter turns are remaps) and a wide one (warps), after a
    RandomResizedCrop, both layouts: ``ops.apply``'s bytes."""
    cases = {}
    for j, (policy, _) in enumerate(POLICIES):
        for size in ((24, 24), (20, 28)):
            layout = ("NHWC", "NCHW")[(j + size[0]) % 2]
            cases[f"p{j}-{size[0]}x{size[1]}"] = Case(png, [policy], size, count=24, seed=3 + j, layout=layout)
    drawn = kinds_run(cases)
    assert {"affine", "blend", "sharpness", "posterize", "solarize", "autocontrast", "equalize"} <= drawn
    execute(cases, device, tmp_path)


CHAIN = [
    {"op": "trivial_augment_wide"},
    *RECIPES["ColorJitter(0.4, 0.4, 0.4, 0.1)"],
    {"op": "grayscale", "p": 0.3},
    {"op": "gaussian_blur", "kernel_size": [5], "sigma": [0.1, 2.0]},
    {"op": "horizontal_flip"},
]


@pytest.mark.parametrize("device", DEVICES)
def test_a_recipe_chain(png: Path, device: str, tmp_path: Path) -> None:
    """TrivialAugmentWide, ColorJitter, RandomGrayscale, GaussianBlur and a flip: samples of
    different step counts in one batch (each ends in its own half of the ping-pong buffer),
    several tiles a sample (``block`` 128), NHWC and NCHW."""
    cases = {
        f"chain-{layout}-{block}": Case(png, CHAIN, (24, 24), count=12, seed=5, layout=layout, block=block)
        for layout, block in (("NHWC", 128), ("NCHW", 1024))
    }
    assert len({len(k) for k in cases["chain-NHWC-128"].kinds}) > 1, "the samples' step counts differ"
    for name, least in execute(cases, device, tmp_path).items():
        print(f"{name}: least PSNR {least}")


class Counted:
    """Stands for a Triton kernel: counts its launches, runs it only on a CUDA device (the host
    decides the launches from the records alone, never from the device's results)."""

    def __init__(self, kernel: Any, counter: Any, run: bool) -> None:
        self.kernel, self.counter, self.run = kernel, counter, run

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.counter.count += 1
            if self.run:
                self.kernel[grid](*args, **kwargs)

        return launch


def fused_launches(monkeypatch: pytest.MonkeyPatch, recs: np.ndarray, size: tuple[int, int], device: str) -> int:
    """Launches of one ``ops_kernel.run`` over ``recs``: Triton kernels and tensor ops that run a
    kernel (``test_gpu_ops.Launches``), the upload included."""
    from test_gpu_ops import Launches

    from ringfeed.gpu import ops_kernel

    x = torch.zeros(len(recs), *size, 3, dtype=torch.uint8, device=device)
    with Launches() as c, monkeypatch.context() as mp:
        for name in ("_gather_kernel", "_pre_kernel", "_apply_kernel", "_scatter_kernel"):
            mp.setattr(ops_kernel, name, Counted(getattr(ops_kernel, name), c, device != "cpu"))
        ops_kernel.run(x, recs)
    return c.count


@needs_triton
@pytest.mark.parametrize("device", ["cpu", *DEVICES[1:]])
@pytest.mark.parametrize("recipe", [*RECIPES, "TrivialAugmentWide, flip", "chain"])
def test_launches_do_not_grow_with_the_batch(
    png: Path, recipe: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused kernels launch a few times a step, the same for the same draws four times over
    (a batch of 512 for 128); the PyTorch path's count beside them."""
    tail = {
        "TrivialAugmentWide, flip": [{"op": "trivial_augment_wide"}, {"op": "horizontal_flip"}],
        "chain": CHAIN,
    }.get(recipe) or RECIPES[recipe]
    _, lines = run_ops(png, [{"op": "random_resized_crop", "size": [32, 32]}, *tail], 128, 1)
    recs = records_of(lines)
    n = fused_launches(monkeypatch, recs, (32, 32), device)
    assert fused_launches(monkeypatch, np.concatenate([recs] * 4), (32, 32), device) == n
    steps = int(recs[:, :, 0].any(0).sum())
    # The gather, the scatter, and per step the apply and at most a pre-pass; on a GPU the upload
    # too (one host-to-device copy, which the dispatch counts as three ops: the pinning, the
    # conversion and the copy).
    assert n <= 2 + 2 * steps + (3 if device != "cpu" else 0)
    if recipe == "TrivialAugmentWide, flip":
        assert n < 10
    torch_path = launches(gops.OpTable.from_records(recs, (32, 32)), 128, (32, 32))
    print(f"{recipe}: {steps} steps; ops.apply {torch_path} launches, ops_kernel.run {n} ({device})")


@needs_triton
def test_bad_records_are_refused() -> None:
    """Records of an unknown kind (naming the step), of the wrong shape, rows of another length,
    a layout the kernels do not know: errors before anything runs, the batch untouched."""
    from ringfeed.gpu import ops_kernel

    x = torch.zeros(4, 8, 8, 3, dtype=torch.uint8)
    recs = np.zeros((3, 2, gops.RECORD_INTS), dtype=np.int32)
    recs[:, 0, 0] = 7
    recs[1, 1, 0] = 99
    with pytest.raises(ValueError, match="step 1 has kind 99"):
        ops_kernel.run(x, recs)
    with pytest.raises(ValueError, match=r"\[n, S, 16\]"):
        ops_kernel.run(x, recs[:, :, :8])
    recs[1, 1, 0] = 0
    with pytest.raises(ValueError, match="3 samples' records, 2 rows"):
        ops_kernel.run(x, recs, rows=[0, 1])
    with pytest.raises(ValueError, match="layout"):
        ops_kernel.run(x, recs, layout="HWC")
    assert not x.any()


@needs_triton
def test_the_kernels_compile_a_few_variants_however_the_draws_vary(png: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which kinds a batch's steps draw varies from batch to batch (a policy draws one of 14); the
    kernels compile in every kind seen so far, not each batch's, so over many small batches of
    TrivialAugmentWide and RandAugment draws they see a few distinct kind masks (each mask is a
    compilation, seconds on a GPU), not one per combination."""
    from ringfeed.gpu import ops_kernel

    masks: set[int] = set()

    class Spy:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *a, **kw: masks.add(int(kw["kinds"])) if "kinds" in kw else None

    monkeypatch.setattr(ops_kernel, "_SEEN", 0)
    monkeypatch.setattr(ops_kernel, "_pre_kernel", Spy())
    monkeypatch.setattr(ops_kernel, "_apply_kernel", Spy())
    for k in ("_gather_kernel", "_scatter_kernel"):
        monkeypatch.setattr(ops_kernel, k, Spy())
    combos = set()
    for tail in ([{"op": "trivial_augment_wide"}], [{"op": "rand_augment", "num_ops": 2, "magnitude": 9}]):
        _, lines = run_ops(png, [{"op": "random_resized_crop", "size": [16, 16]}, *tail], 240, 3)
        recs = records_of(lines)
        for b in range(0, 240, 4):
            part = recs[b : b + 4]
            combos.add(frozenset(part[:, :, 0].ravel().tolist()) - {0})
            ops_kernel.run(torch.zeros(4, 16, 16, 3, dtype=torch.uint8), part)
    assert len(combos) > 20, "the batches drew many combinations of kinds"
    assert len(masks) <= len(gops.KIND_CODES), sorted(masks)
    assert max(masks) == ops_kernel._SEEN
