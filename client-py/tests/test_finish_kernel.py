"""The Triton finishing kernel (``ringfeed.gpu.finish_kernel``) against the matrix-product path.

CI has no GPU: the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU
tensors, in a child process (the interpreter is chosen when the kernel is defined). The
matrix-product path is itself pinned to torchvision and to the server's CPU path by
``test_hybrid.py``; here both paths finish the same slot (records and JPEG bytes) and must agree.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _support import interpreted, needs_triton

# Runs both paths over the same records and images; writes their outputs to argv[1] (npz).
CHILD = r"""
import sys
import numpy as np
import torch
from ringfeed.gpu import hybrid as H

A, S = H.ANTIALIAS, H.INTERPOLATION_SHIFT
if sys.argv[2] == "small":
    OH, OW, SW, SH = 8, 12, 24, 18
else:
    # Larger than the kernel's tiles and pieces: several output tiles a sample, several source
    # pieces a tile along each axis, a tile hanging over the output's edge.
    OH, OW, SW, SH = 40, 36, 150, 110
def rec(pre, resize, win, valid, flags, fill=0x30A0FF):
    return [0, 1, SW, SH, *pre, *resize, *win, *valid, flags, fill]
if sys.argv[2] == "small":
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
        # A strong downscale (8x), bicubic with antialias: up to 24 column taps.
        rec((0, 0, 24, 18), (3, 2), (0, 0), (0, 0, 3, 2), (2 << S) | A),
    ]
else:
    cases = [
        # RandomResizedCrop at about ImageNet's downscale, and a strong one (3.7x), flipped.
        rec((7, 5, 61, 55), (36, 40), (0, 0), (0, 0, 36, 40), (1 << S) | A),
        rec((0, 0, 150, 110), (36, 40), (0, 0), (0, 0, 36, 40), (1 << S) | A | H.FLIP_X),
        # Bicubic with antialias, both flips; bicubic without antialias, upscaled.
        rec((20, 9, 97, 88), (36, 40), (0, 0), (0, 0, 36, 40), (2 << S) | A | H.FLIP_X | H.FLIP_Y),
        rec((100, 60, 20, 25), (36, 40), (0, 0), (0, 0, 36, 40), (2 << S) | H.FLIP_Y),
        # Nearest, downscaled across several pieces.
        rec((3, 1, 140, 104), (36, 40), (0, 0), (0, 0, 36, 40), 0),
        # Resize 46 then a centre window of it; a resize smaller than the output (fill around it).
        rec((0, 0, 150, 110), (62, 46), (13, 3), (0, 0, 62, 46), (1 << S) | A),
        rec((0, 0, 150, 110), (30, 22), (-3, -9), (0, 0, 30, 22), (1 << S) | A | H.FLIP_Y),
        # No resize: a window of the source, hanging over the crop's bottom right corner.
        rec((90, 70, 50, 30), (0, 0), (100, 80), (90, 70, 50, 30), H.FLIP_X),
    ]
N = len(cases)
rng = np.random.default_rng(7)
# Real JPEGs in one arena, as a slot carries them: the whole Finisher call runs (decode, the
# table from the decoded images, the kernel), not the kernel alone.
import io
from PIL import Image
def texture(h, w):
    # Smooth gradients under noise: a resize's errors show on both.
    y, x = np.mgrid[0:h, 0:w]
    ramp = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 255 // (w + h)], -1)
    noise = rng.integers(-40, 41, (h, w, 3))
    return np.clip(ramp + noise, 0, 255).astype(np.uint8)
blobs = []
for _ in cases:
    buf = io.BytesIO()
    Image.fromarray(texture(SH, SW)).save(buf, "JPEG", quality=95)
    blobs.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
arena = np.concatenate(blobs)
jobs = np.array(cases, dtype=np.int32)
jobs[:, 0] = np.cumsum([0] + [len(b) for b in blobs[:-1]])
jobs[:, 1] = [len(b) for b in blobs]
# N samples at batch positions 0, 2, ..., 2N - 2 of a batch of 2N: the other rows are CPU
# samples, which the finisher must leave alone.
slot_jobs = np.zeros((2 * N, H.RECORD_LEN), dtype=np.int32)
slot_jobs[0::2] = jobs
# Every other decoded image as torchvision's decoder leaves them: CHW memory seen as HWC.
host_decode, decoded = H._host_decode, [0]
def decode(data):
    decoded[0] += 1
    t = host_decode(data)
    return t if decoded[0] % 2 else t.permute(2, 0, 1).contiguous().permute(1, 2, 0)
H._host_decode = decode
out = {}
for layout in ("NHWC", "NCHW"):
    shape = (2 * N, OH, OW, 3) if layout == "NHWC" else (2 * N, 3, OH, OW)
    for geom in ("bmm", "triton"):
        f = H.Finisher(torch.device("cpu"), "host", layout, (OH, OW), geometry=geom)
        img = torch.full(shape, 77, dtype=torch.uint8)
        done = f(slot_jobs, arena, img)
        assert done == list(range(0, 2 * N, 2)), done
        out[f"{layout}-{geom}"] = img.numpy()
np.savez(sys.argv[1], **out)
"""


@needs_triton
@pytest.mark.parametrize("geometry", ["small", "tiled"])
def test_kernel_matches_matrix_products(tmp_path: Path, geometry: str) -> None:
    """For every geometry the records carry (bilinear and bicubic with and without antialias,
    nearest, no resize, windows, fill, both flips, strong downscales; ``tiled``: samples of
    several output tiles, each over several source pieces along each axis), both layouts and
    both memory orders of the decoded images, a whole finisher call (the slot's JPEGs decoded,
    the table built from the decoded images, one launch) gives the matrix products' pixels
    within one level (rounding of exact halves), and writes only the rows of the GPU samples."""
    out = tmp_path / "out.npz"
    interpreted(CHILD, out, geometry)
    got = np.load(out)
    for layout in ("NHWC", "NCHW"):
        bmm = got[f"{layout}-bmm"].astype(int)
        tri = got[f"{layout}-triton"].astype(int)
        # The odd rows are CPU samples: untouched by either path.
        assert (tri[1::2] == 77).all(), layout
        assert (bmm[1::2] == 77).all(), layout
        diff = np.abs(bmm - tri)
        assert diff.max() <= 1, (layout, np.argwhere(diff > 1)[:5])
        assert diff.mean() < 0.02, (layout, diff.mean())
        # Not vacuous: the outputs carry image content and fill, not a constant.
        assert len(np.unique(tri)) > 100, layout


def test_geometry_setting_is_checked() -> None:
    """An unknown ``RINGFEED_GPU_FINISH`` is refused by name, not silently replaced."""
    import torch

    from ringfeed.gpu import hybrid

    with pytest.raises(ValueError, match="RINGFEED_GPU_FINISH"):
        hybrid.Finisher(torch.device("cpu"), "host", "NHWC", (8, 8), geometry="cuda-graphs")
