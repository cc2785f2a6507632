"""The chroma rebuild kernels (``ringfeed.gpu.chroma_kernel``) against their NumPy reference.

CI has no GPU: the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU
tensors, in a child process (the interpreter is chosen when the kernels are defined). The
reference is ``rebuild`` of ``benches/e2e/chroma_reconstruct.py`` (the CPU study the kernels
port), imported by path. The inputs are replicated-chroma decodes made with libjpeg's own
arithmetic (``nvjpeg_probe.ycc_to_rgb``) from known planes, so the interpolated decode they
stand for (``nvjpeg_probe.fancy_up``) is known too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _support import interpreted, needs_triton

CLIENT = Path(__file__).resolve().parents[1]
E2E = CLIENT.parent / "benches" / "e2e"


# Loads argv[1] (npz: the arena, the table with addresses as offsets into it), rebuilds the
# images in place through their addresses and writes the arena back to argv[2].
CHILD = r"""
import sys
import numpy as np
import torch
from ringfeed.gpu import chroma_kernel as K

got = np.load(sys.argv[1])
arena = torch.from_numpy(got["arena"].copy())
rows = got["table"].copy()
rows[:, 0] += arena.data_ptr()
K.rebuild(torch.from_numpy(rows), rows)
np.save(sys.argv[2], arena.numpy())
"""

#: (height, width, fh, fv, pad bytes past 3 * width a row).
CASES = [
    (16, 24, 2, 2, 0),  # 4:2:0, even
    (17, 23, 2, 2, 5),  # 4:2:0, odd both ways (partial blocks), padded rows
    (1, 9, 2, 2, 0),  # 4:2:0, one row: every block partial
    (12, 20, 2, 1, 3),  # 4:2:2, even
    (9, 15, 2, 1, 0),  # 4:2:2, odd
    (14, 10, 1, 2, 0),  # 4:4:0, even
    (13, 11, 1, 2, 7),  # 4:4:0, odd
    (11, 13, 1, 1, 4),  # 4:4:4: nothing to do
    (31, 45, 2, 2, 2),  # 4:2:0, larger than the others
]


def _modules() -> tuple[Any, Any]:
    sys.path.insert(0, str(E2E))
    try:
        import chroma_reconstruct
        import nvjpeg_probe
    finally:
        sys.path.remove(str(E2E))
    return chroma_reconstruct, nvjpeg_probe


def _planes(rng: np.random.Generator, h: int, w: int, fh: int, fv: int) -> tuple[np.ndarray, ...]:
    """Luma and subsampled chroma planes: smooth ramps and noise, with luma at 0 and 255 in
    patches (so that channels clamp inside blocks) and strong chroma (so that they clamp often)."""
    ch, cw = -(-h // fv), -(-w // fh)
    yy, xx = np.mgrid[0:h, 0:w]
    y = 128 + 60 * np.sin(xx / 3.0 + yy / 5.0) + rng.normal(0, 12, (h, w))
    y[rng.random((h, w)) < 0.08] = 0
    y[rng.random((h, w)) < 0.08] = 255
    cy, cx = np.mgrid[0:ch, 0:cw]
    cb = 128 + 70 * np.sin(cx / 1.7) * np.cos(cy / 2.3) + rng.normal(0, 15, (ch, cw))
    cr = 128 + 70 * np.cos(cx / 2.1 + cy / 1.3) + rng.normal(0, 15, (ch, cw))
    return tuple(np.clip(np.rint(p), 0, 255).astype(np.int64) for p in (y, cb, cr))


@needs_triton
def test_kernel_matches_reference_and_approaches_interpolated(tmp_path: Path) -> None:
    """For 4:2:0, 4:2:2 and 4:4:0 images of even and odd sizes (partial blocks), with clamped
    pixels inside blocks and padded rows, all in one call: the kernels rebuild each image in place
    as the NumPy reference does within one level, closer to the interpolated decode than the
    replicated input was, and change no byte of a 4:4:4 image, of a row's padding, or between
    images."""
    cr_mod, probe = _modules()
    rng = np.random.default_rng(11)
    gap = 16  # bytes between images, as sentinels
    parts, table, images = [], [], []
    at = 0
    for h, w, fh, fv, pad in CASES:
        y, cb, cr = _planes(rng, h, w, fh, fv)
        rep, interp = probe.decodes(y, cb, cr, fh, fv)
        pitch = 3 * w + pad
        buf = rng.integers(0, 256, (h, pitch), dtype=np.uint8)  # the padding: random bytes
        buf[:, : 3 * w] = rep.reshape(h, 3 * w)
        parts += [buf.reshape(-1), rng.integers(0, 256, gap, dtype=np.uint8)]
        table.append([at, h, w, pitch, fh, fv])
        images.append((rep, interp, buf))
        at += h * pitch + gap
    arena = np.concatenate(parts)
    np.savez(tmp_path / "in.npz", arena=arena, table=np.array(table, dtype=np.int64))
    out = tmp_path / "out.npy"
    interpreted(CHILD, tmp_path / "in.npz", out)
    got = np.load(out)

    touched = np.zeros(arena.shape, dtype=bool)
    for (h, w, fh, fv, _), (off, _, _, pitch, _, _), (rep, interp, buf) in zip(CASES, table, images, strict=True):
        view = got[off : off + h * pitch].reshape(h, pitch)
        touched[off : off + h * pitch].reshape(h, pitch)[:, : 3 * w] = True
        assert (view[:, 3 * w :] == buf[:, 3 * w :]).all(), ("row padding written", h, w, fh, fv)
        out_img = view[:, : 3 * w].reshape(h, w, 3)
        case = (h, w, fh, fv)
        if (fh, fv) == (1, 1):
            assert (out_img == rep).all(), case
            continue
        ref = cr_mod.rebuild(rep, fh, fv)
        diff = np.abs(out_img.astype(int) - ref.astype(int))
        assert diff.max() <= 1, (case, np.argwhere(diff > 1)[:5])
        assert diff.mean() < 0.01, (case, diff.mean())
        # Not vacuous: the rebuild changed pixels, and brought them nearer the interpolated decode.
        assert (out_img != rep).mean() > 0.2, case
        before, after = probe.psnr(rep, interp), probe.psnr(out_img, interp)
        assert after > before + 1.0, (case, after, before)
        # The inputs exercise clamping: pixels at 0 or 255 inside the blocks.
        assert ((rep == 0) | (rep == 255)).any(-1).mean() > 0.1, case
    assert (got[~touched] == arena[~touched]).all(), "bytes outside the images' pixels were written"


def test_factors_are_checked() -> None:
    """A table row with a chroma factor other than 1 or 2 is refused, naming the image."""
    from ringfeed.gpu import chroma_kernel

    with pytest.raises(ValueError, match="image 1 of the table has fh=4"):
        chroma_kernel.extent([[0, 8, 8, 24, 2, 2], [0, 8, 8, 24, 4, 1]])


# A Finisher with RINGFEED_GPU_CHROMA=rebuild rebuilds, from the records' chroma codes, the
# images at argv[1]'s places (npz: arena, places with offsets, flags); writes the arena to argv[2]
# and the count it rebuilt to argv[3].
FINISHER_CHILD = r"""
import sys
import numpy as np
import torch
from ringfeed.gpu import hybrid as H

got = np.load(sys.argv[1])
arena = torch.from_numpy(got["arena"].copy())
at = got["places"].copy()
at[:, 0] += arena.data_ptr()
rec = np.zeros((len(at), H.RECORD_LEN), dtype=np.int64)
rec[:, 16] = got["flags"]
f = H.Finisher(torch.device("cpu"), "host", "NHWC", (8, 8))
assert f._chroma is not None
n = f.rebuild_chroma(rec, at)
np.save(sys.argv[2], arena.numpy())
open(sys.argv[3], "w").write(str(n))
"""


@needs_triton
def test_the_finisher_rebuilds_what_the_records_say_is_subsampled(tmp_path: Path) -> None:
    """With ``RINGFEED_GPU_CHROMA=rebuild`` the Finisher reads each record's chroma code
    (``gpu_job[16]`` bits 5-7, 1.4) beside its geometry bits and rebuilds exactly the images it
    names 4:2:0, 4:2:2 or 4:4:0, each with its own block shape (the reference's pixels within one
    level); a 4:4:4, grey, "other" or "not said" (a 1.3 server's 0) image is left as decoded."""
    cr_mod, probe = _modules()
    rng = np.random.default_rng(3)
    # (code, fh, fv): 4:2:0, 4:2:2, 4:4:0, then codes whose images must stay as they are.
    cases = [(4, 2, 2), (3, 2, 1), (5, 1, 2), (2, 2, 2), (0, 2, 2), (6, 2, 2), (1, 2, 2)]
    parts, places, flags, reps = [], [], [], []
    at = 0
    for code, fh, fv in cases:
        h, w = 10, 14
        y, cb, cr = _planes(rng, h, w, fh, fv)
        rep, _ = probe.decodes(y, cb, cr, fh, fv)
        parts.append(rep.reshape(-1))
        places.append([at, h, w, 3 * w, 3, 1])
        # Geometry bits set too (a flip, bilinear, antialias): the chroma code sits beside them.
        flags.append(code << 5 | 1 | 1 << 2 | 16)
        reps.append((rep, fh, fv))
        at += rep.size
    arena = np.concatenate(parts)
    np.savez(tmp_path / "in.npz", arena=arena, places=np.array(places, dtype=np.int64), flags=np.array(flags))
    out, count = tmp_path / "out.npy", tmp_path / "n.txt"
    interpreted(FINISHER_CHILD, tmp_path / "in.npz", out, count, RINGFEED_GPU_CHROMA="rebuild")
    got = np.load(out)
    assert count.read_text() == "3"
    for (code, _, _), (off, h, w, _, _, _), (rep, fh, fv) in zip(cases, places, reps, strict=True):
        img = got[off : off + rep.size].reshape(h, w, 3)
        if code in (3, 4, 5):
            diff = np.abs(img.astype(int) - cr_mod.rebuild(rep, fh, fv).astype(int))
            assert diff.max() <= 1, code
            assert (img != rep).any(), code
        else:
            assert (img == rep).all(), code
