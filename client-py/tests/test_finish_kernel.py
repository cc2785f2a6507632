"""The Triton finishing kernel (``ringfeed._finish_kernel``) against the matrix-product path.

CI has no GPU: the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU
tensors, in a child process (the interpreter is chosen when the kernel is defined). The
matrix-product path is itself pinned to torchvision and to the server's CPU path by
``test_hybrid.py``; here both paths get the same records and decoded images and must agree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CLIENT = Path(__file__).resolve().parents[1]

try:
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

needs_triton = pytest.mark.skipif(
    not HAVE_TRITON and os.environ.get("CI") != "true",
    reason="triton is not installed (PyPI's torch wheels bring it; CI fails instead of skipping)",
)

# Runs both paths over the same records and images; writes their outputs to argv[1] (npz).
CHILD = r"""
import sys
import numpy as np
import torch
from ringfeed import _hybrid as H

OH, OW = 8, 12
A, S = H.ANTIALIAS, H.INTERPOLATION_SHIFT
def rec(pre, resize, win, valid, flags, fill=0x30A0FF):
    return [0, 1, 24, 18, *pre, *resize, *win, *valid, flags, fill]
cases = [
    # RandomResizedCrop: a crop scaled down, bilinear with antialias.
    rec((3, 2, 19, 13), (12, 8), (0, 0), (0, 0, 12, 8), (1 << S) | A),
    # Bicubic with antialias, flipped horizontally.
    rec((1, 4, 20, 11), (12, 8), (0, 0), (0, 0, 12, 8), (2 << S) | A | H.FLIP_X),
    # Bicubic without antialias (PyTorch's a = -0.75), upscaled, flipped vertically.
    rec((10, 6, 5, 4), (12, 8), (0, 0), (0, 0, 12, 8), (2 << S) | H.FLIP_Y),
    # Nearest.
    rec((0, 0, 24, 18), (12, 8), (0, 0), (0, 0, 12, 8), 0),
    # Resize then a window inside it (a centre crop).
    rec((0, 0, 24, 18), (16, 12), (2, 2), (0, 0, 16, 12), (1 << S) | A),
    # A resize smaller than the output: the window overhangs and the rest is fill; both flips.
    rec((0, 0, 24, 18), (9, 6), (-2, -1), (0, 0, 9, 6), (1 << S) | A | H.FLIP_X | H.FLIP_Y),
    # No resize: the window is in source coordinates, a crop of the source.
    rec((5, 4, 12, 8), (0, 0), (5, 4), (5, 4, 12, 8), 0),
    # No resize, a window larger than the crop on one side: fill there; flipped.
    rec((5, 4, 10, 8), (0, 0), (4, 4), (5, 4, 10, 8), H.FLIP_X),
]
rng = np.random.default_rng(7)
srcs = [torch.from_numpy(rng.integers(0, 256, (18, 24, 3), dtype=np.uint8)) for _ in cases]
# Half of them as torchvision's decoder leaves them: CHW memory seen as HWC.
srcs = [s if k % 2 == 0 else s.permute(2, 0, 1).contiguous().permute(1, 2, 0) for k, s in enumerate(srcs)]
jobs = np.array(cases, dtype=np.int64)
# Out of order into a larger batch: rows are addressed by the table, not by position.
where = np.array([9, 0, 4, 7, 2, 5, 1, 3], dtype=np.int64)
out = {}
for layout in ("NHWC", "NCHW"):
    shape = (10, OH, OW, 3) if layout == "NHWC" else (10, 3, OH, OW)
    for geom in ("bmm", "triton"):
        f = H.Finisher(torch.device("cpu"), "host", layout, (OH, OW), geometry=geom)
        img = torch.full(shape, 77, dtype=torch.uint8)
        if geom == "bmm":
            f._finish(jobs, srcs, img, where)
        else:
            table = jobs.copy()
            table[:, 0:4] = [(p[0], p[3], p[4], p[5]) for p in map(H._place, srcs)]
            table = np.concatenate([table, where[:, None]], 1)
            f._kernel.finish(torch.from_numpy(table), img, layout)
        out[f"{layout}-{geom}"] = img.numpy()
np.savez(sys.argv[1], **out)
"""


@needs_triton
def test_kernel_matches_matrix_products(tmp_path: Path) -> None:
    """For every geometry the records carry (bilinear and bicubic with and without antialias,
    nearest, no resize, windows, fill, both flips), both layouts and both image memory orders, the
    kernel's pixels equal the matrix products' within one level (rounding of exact halves), and
    it writes only the rows the table names."""
    out = tmp_path / "out.npz"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(CLIENT))
    subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, check=True, timeout=600)
    got = np.load(out)
    for layout in ("NHWC", "NCHW"):
        bmm = got[f"{layout}-bmm"].astype(int)
        tri = got[f"{layout}-triton"].astype(int)
        # Rows 6 and 8 are named by no sample: untouched by either path.
        assert (tri[[6, 8]] == 77).all(), layout
        assert (bmm[[6, 8]] == 77).all(), layout
        diff = np.abs(bmm - tri)
        assert diff.max() <= 1, (layout, np.argwhere(diff > 1)[:5])
        assert diff.mean() < 0.02, (layout, diff.mean())
        # Not vacuous: the outputs carry image content and fill, not a constant.
        assert len(np.unique(tri)) > 100, layout


def test_geometry_setting_is_checked() -> None:
    """An unknown ``RINGFEED_GPU_FINISH`` is refused by name, not silently replaced."""
    import torch

    from ringfeed import _hybrid

    with pytest.raises(ValueError, match="RINGFEED_GPU_FINISH"):
        _hybrid.Finisher(torch.device("cpu"), "host", "NHWC", (8, 8), geometry="cuda-graphs")
