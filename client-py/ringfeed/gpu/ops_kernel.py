"""A batch's per-image steps (``gpu_ops``, ring.md) in a handful of Triton launches.

:mod:`ringfeed.gpu.ops` runs the steps the server drew with plain PyTorch: per step, per group of
samples that drew one kind, a gather, a chain of small tensor ops and a scatter. That is a few
hundred launches a batch (TrivialAugmentWide 181, RandAugment(2, 9) 330 for 128 images), each one
host time on the training thread. :func:`run` gives the same bytes with a few launches whose
count depends on the pipeline's steps, never on the batch or on what the samples drew.

**Design.** The host reads the records (``[m, S, 16]`` int32, in the ring's pinned memory) with a
few numpy calls, never per sample, and uploads them once with each sample's step count, its batch
row and the blur kernels' weights (one host-to-device copy; the weights are
:func:`ringfeed.gpu.ops.gaussian_kernels`'s, so both paths blur with the same ``f32`` taps). Then:

1. ``_gather_kernel`` copies the ``m`` rows out of the batch (``NHWC`` or ``NCHW``, by strides)
   into a compact ``uint8`` buffer ``[m, H*W*3]`` (pixel-major), and zeroes the statistics.
2. Per step ``k``: when some sample's step ``k`` needs a whole-image statistic or is a blur,
   ``_pre_kernel``: per ``(sample, tile)`` program, contrast's sum of ``floor(luma)`` and
   autocontrast's and equalize's 256-bin histograms per channel (integer atomics: exact in any
   order), or the blur's horizontal pass into an ``f32`` scratch. Then ``_apply_kernel``: per
   ``(sample, tile)`` program, the sample's step ``k`` (the kind is uniform within a program,
   so the branch is too), reading one half of a ping-pong buffer and writing the other. Sample
   ``i`` with ``n_i`` steps reads half ``k % 2`` at step ``k < n_i`` and does nothing after, so a
   sample that is done costs nothing and ends in half ``n_i % 2``. The kinds a step can run are
   a compile-time mask (the host knows which appear), so a step of ColorJitter compiles the
   blend and the hue only.
3. ``_scatter_kernel`` copies each sample from its last half back to its batch row.

**Launches per batch**: one upload, the gather, per step one apply plus one pre-pass where the
step has contrast, autocontrast, equalize or a blur, and the scatter (the upload aside):
TrivialAugmentWide 4, with a flip after it 5; RandAugment(2, 9) 6; ColorJitter(0.4, 0.4, 0.4, 0.1)
10 (its contrast may come at any of its four steps); GaussianBlur(23) 4; the PyTorch path 181,
197, 330, 396 and 26 for the same 128 samples (``tests/test_ops_kernel.py`` prints both). Samples
with no steps are neither gathered nor scattered; the host never waits on the device.

**Exactness.** Each kind repeats :mod:`ringfeed.gpu.ops`'s ``_k_*`` sequence (itself the
server's) operation for operation in ``f32``: launched with ``enable_fp_fusion=False`` (no
fused multiply-add), ``f32`` divisions as ``div_rn`` (Triton's ``/`` is ``div.full.f32``, within
2 ulp), the affine grid's sums in ``f64`` (products of two ``f32`` are exact there; one rounding
to ``f32``, as ``_k_affine``), rounding half to even where the server rounds (``_rint``, built
from ``floor``), truncation after a clamp elsewhere, ``fmod(v, 1)`` as ``v - trunc(v)`` (exact),
equalize's integer table. So every kind but blur gives ``ops.apply``'s bytes. The blur sums its
taps in order from 0, as the server's ``blur.rs`` does (``ops.py``'s depthwise convolutions sum in
another order): against ``ops.apply`` it is held to PSNR >= 40 dB, against the server it is
exact in the tests' runs. Limits: a step's statistics are ``int32`` (images up to 8.4 Mpx, as
255 * H * W must fit), and a program's tile is ``BLOCK`` pixels of one image.

Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors: that is how CI, which has no GPU,
tests them against :func:`ringfeed.gpu.ops.apply` (``tests/test_ops_kernel.py``).
"""

# The kernels' kind dispatch nests a compile-time `if` (the step's kinds) and a runtime one (the
# sample's kind): they cannot be one condition.
# ruff: noqa: SIM102

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import triton
import triton.language as tl

from .ops import _LB, _LG, _LR, _S1, _S5, _SIXTH, _TO8, _UNIT, KIND_CODES, RECORD_INTS, gaussian_kernels

#: Pixels per program (each with its three channels).
BLOCK = 1024
#: Warps per program.
WARPS = 4
#: int32 per sample and statistics step: three 256-bin histograms, then the grey sum (at 768).
STATS = 1024

# The server's f32 constants, as compile-time constants of the kernels.
LR, LG, LB, UNIT, SIXTH, TO8, S1, S5 = map(tl.constexpr, (_LR, _LG, _LB, _UNIT, _SIXTH, _TO8, _S1, _S5))
# Kind codes (ring.md), for the kernels; the compile-time masks of a step's kinds use the codes.
REMAP, BLEND, HUE, GRAYSCALE, SOLARIZE, POSTERIZE, INVERT = map(tl.constexpr, range(1, 8))
AUTOCONTRAST, EQUALIZE, SHARPNESS, BLUR, AFFINE = map(tl.constexpr, range(8, 13))
#: The kinds every kernel launched so far compiled in (a bit per kind code): see :func:`run`.
_SEEN = 0
#: Kinds whose step needs the pre-pass (contrast is a blend with arg 1).
_PRE = frozenset((2, 8, 9, 11))


# -- helpers -----------------------------------------------------------------------------------


@triton.jit
def _rint(v):
    """Rounds half to even (``torch.round``), from ``floor`` (exact; ``floor(v + 0.5)`` is not)."""
    f = tl.floor(v)
    d = v - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


@triton.jit
def _u8(v):
    """Clamps to 0..255 and truncates (``clamp_(0, 255).to(torch.uint8)``)."""
    return tl.minimum(tl.maximum(v, 0.0), 255.0).to(tl.uint8)


@triton.jit
def _luma(r, g, b):
    return r * LR + g * LG + b * LB


@triton.jit
def _reflect(i, n):
    """Source index of padded position ``i``: PyTorch's reflect (``blur.rs``'s ``reflect``)."""
    period = tl.maximum(2 * (n - 1), 1)
    r = ((i % period) + period) % period
    r = tl.where(r >= n, period - r, r)
    return tl.where(n == 1, 0, r)


@triton.jit
def _load3(base, off, mask):
    """Channels of pixels ``off`` (element offsets of their red) as f32, 0 where not ``mask``."""
    r = tl.load(base + off, mask=mask, other=0).to(tl.float32)
    g = tl.load(base + off + 1, mask=mask, other=0).to(tl.float32)
    b = tl.load(base + off + 2, mask=mask, other=0).to(tl.float32)
    return r, g, b


@triton.jit
def _store3(out, r, g, b, mask):
    tl.store(out, r, mask=mask)
    tl.store(out + 1, g, mask=mask)
    tl.store(out + 2, b, mask=mask)


@triton.jit
def _fmod1(v):
    """``fmod(v, 1)``: ``v - trunc(v)``, exact."""
    return v - tl.where(v >= 0.0, tl.floor(v), tl.ceil(v))


# -- the kinds (each as ops.py's _k_*) ----------------------------------------------------------


@triton.jit
def _remap(base, out, prm, ok, y, x, h, w):
    ax = tl.load(prm).to(tl.int32)
    bx = tl.load(prm + 1).to(tl.int32)
    cx = tl.load(prm + 2).to(tl.int32)
    ay = tl.load(prm + 3).to(tl.int32)
    by = tl.load(prm + 4).to(tl.int32)
    cy = tl.load(prm + 5).to(tl.int32)
    sx = ax * x + bx * y + cx
    sy = ay * x + by * y + cy
    inside = ok & (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
    q = base + (sy * w + sx) * 3
    for c in tl.static_range(3):
        tl.store(out + c, tl.load(q + c, mask=inside, other=0), mask=ok)


@triton.jit
def _blend(base, out, prm, st, arg, off, ok, hw):
    rr = tl.load(prm)
    ss = tl.load(prm + 1)
    r, g, b = _load3(base, off, ok)
    grey = tl.floor(_luma(r, g, b))
    # Contrast's mean grey: the integer sum over the image, divided in f64, rounded to f32.
    total = tl.load(st + 768, mask=arg == 1, other=0)
    mean = (total.to(tl.float64) / hw).to(tl.float32)
    other = tl.where(arg == 2, grey, tl.where(arg == 1, mean, 0.0))
    o = other * ss
    _store3(out, _u8(r * rr + o), _u8(g * rr + o), _u8(b * rr + o), ok)


@triton.jit
def _hue(base, out, prm, off, ok):
    r8, g8, b8 = _load3(base, off, ok)
    r = r8 * UNIT
    g = g8 * UNIT
    b = b8 * UNIT
    maxc = tl.maximum(tl.maximum(r, g), b)
    minc = tl.minimum(tl.minimum(r, g), b)
    eqc = maxc == minc
    rng = maxc - minc
    s = tl.math.div_rn(rng, tl.where(eqc, 1.0, maxc))
    div = tl.where(eqc, 1.0, rng)
    rc = tl.math.div_rn(maxc - r, div)
    gc = tl.math.div_rn(maxc - g, div)
    bc = tl.math.div_rn(maxc - b, div)
    hr = tl.where(maxc == r, bc - gc, 0.0)
    hg = tl.where((maxc == g) & (maxc != r), 2.0 + rc - bc, 0.0)
    hb = tl.where((maxc != g) & (maxc != r), 4.0 + gc - rc, 0.0)
    h = _fmod1((hr + hg + hb) * SIXTH + 1.0)
    h = _fmod1(h + tl.load(prm))
    h = tl.where(h < 0.0, h + 1.0, h)
    h6 = h * 6.0
    fi = tl.floor(h6)
    fr = h6 - fi
    i = fi.to(tl.int32) % 6
    i = tl.where(i < 0, i + 6, i)
    sxf = s * fr
    q = tl.minimum(tl.maximum((1.0 - sxf) * maxc, 0.0), 1.0)
    t = tl.minimum(tl.maximum((sxf + (1.0 - s)) * maxc, 0.0), 1.0)
    pp = tl.minimum(tl.maximum((1.0 - s) * maxc, 0.0), 1.0)
    v = maxc
    ro = tl.where(i == 0, v, tl.where(i == 1, q, tl.where(i == 2, pp, tl.where(i == 3, pp, tl.where(i == 4, t, v)))))
    go = tl.where(i == 0, t, tl.where(i == 1, v, tl.where(i == 2, v, tl.where(i == 3, q, tl.where(i == 4, pp, pp)))))
    bo = tl.where(i == 0, pp, tl.where(i == 1, pp, tl.where(i == 2, t, tl.where(i == 3, v, tl.where(i == 4, v, q)))))
    _store3(out, (ro * TO8).to(tl.uint8), (go * TO8).to(tl.uint8), (bo * TO8).to(tl.uint8), ok)


@triton.jit
def _tone(base, out, prm, kind, off, ok):
    """Grayscale, solarize, posterize and invert: maps of each pixel's values."""
    t = tl.load(prm)
    mask = t.to(tl.int32)
    r, g, b = _load3(base, off, ok)
    grey = _luma(r, g, b).to(tl.uint8)
    for c in tl.static_range(3):
        x8 = tl.load(base + off + c, mask=ok, other=0)
        xf = x8.to(tl.float32)
        inv = (255 - x8.to(tl.int32)).to(tl.uint8)
        if kind == GRAYSCALE:
            o = grey
        elif kind == SOLARIZE:
            o = tl.where(xf >= t, inv, x8)
        elif kind == POSTERIZE:
            o = (x8.to(tl.int32) & mask).to(tl.uint8)
        else:
            o = inv
        tl.store(out + c, o, mask=ok)


@triton.jit
def _autocontrast(base, out, st, off, ok):
    lv = tl.arange(0, 256)
    for c in tl.static_range(3):
        hist = tl.load(st + c * 256 + lv)
        lo = tl.min(tl.where(hist > 0, lv, 255), 0).to(tl.float32)
        hi = tl.max(tl.where(hist > 0, lv, 0), 0).to(tl.float32)
        flat = hi == lo
        lo = tl.where(flat, 0.0, lo)
        inv = tl.where(flat, 1.0, (hi - lo) * UNIT)
        x = tl.load(base + off + c, mask=ok, other=0).to(tl.float32)
        tl.store(out + c, _u8(tl.math.div_rn(x - lo, inv)), mask=ok)


@triton.jit
def _equalize(base, out, st, off, ok, hw):
    lv = tl.arange(0, 256)
    for c in tl.static_range(3):
        hist = tl.load(st + c * 256 + lv)
        last = tl.max(tl.where(hist > 0, lv, 0), 0)
        step = (hw - tl.sum(tl.where(lv == last, hist, 0), 0)) // 255
        cdf = tl.cumsum(hist, 0) - hist
        safe = tl.where(step == 0, 1, step)
        lut = tl.minimum((cdf + safe // 2) // safe, 255)
        lut = tl.where(lv == 0, 0, lut)
        lut = tl.where(step == 0, lv, lut)
        x = tl.load(base + off + c, mask=ok, other=0).to(tl.int32)
        tl.store(out + c, tl.gather(lut, x, 0).to(tl.uint8), mask=ok)


@triton.jit
def _sharpness(base, out, prm, ok, y, x, h, w):
    k = tl.load(prm)
    # Empty when a side is 2 or less: such images are unchanged.
    inner = ok & (y >= 1) & (y <= h - 2) & (x >= 1) & (x <= w - 2)
    top = base + ((y - 1) * w + x - 1) * 3
    for c in tl.static_range(3):
        q = top + c
        s = tl.load(q, mask=inner, other=0).to(tl.float32) * S1
        s = s + tl.load(q + 3, mask=inner, other=0).to(tl.float32) * S1
        s = s + tl.load(q + 6, mask=inner, other=0).to(tl.float32) * S1
        q = q + w * 3
        s = s + tl.load(q, mask=inner, other=0).to(tl.float32) * S1
        s = s + tl.load(q + 3, mask=inner, other=0).to(tl.float32) * S5
        s = s + tl.load(q + 6, mask=inner, other=0).to(tl.float32) * S1
        q = q + w * 3
        s = s + tl.load(q, mask=inner, other=0).to(tl.float32) * S1
        s = s + tl.load(q + 3, mask=inner, other=0).to(tl.float32) * S1
        s = s + tl.load(q + 6, mask=inner, other=0).to(tl.float32) * S1
        v8 = tl.load(base + (y * w + x) * 3 + c, mask=ok, other=0)
        v = v8.to(tl.float32)
        o = _u8(v + k * (_rint(s) - v))
        tl.store(out + c, tl.where(inner, o, v8), mask=ok)


@triton.jit
def _blur_v(scratch, out, wt, arg, ok, y, x, h, w):
    """The blur's vertical pass over the horizontal one's ``f32`` rows; taps summed in order."""
    kx = arg & 0xFFFF
    ky = arg >> 16
    ry = ky // 2
    a0 = tl.zeros(x.shape, dtype=tl.float32)
    a1 = tl.zeros(x.shape, dtype=tl.float32)
    a2 = tl.zeros(x.shape, dtype=tl.float32)
    j = 0
    while j < ky:
        kv = tl.load(wt + kx + j)
        q = scratch + (_reflect(y - ry + j, h) * w + x) * 3
        a0 = a0 + tl.load(q, mask=ok, other=0.0) * kv
        a1 = a1 + tl.load(q + 1, mask=ok, other=0.0) * kv
        a2 = a2 + tl.load(q + 2, mask=ok, other=0.0) * kv
        j += 1
    _store3(out, _u8(_rint(a0)), _u8(_rint(a1)), _u8(_rint(a2)), ok)


@triton.jit
def _affine(base, out, prm, arg, ok, y, x, h, w, cx0, cy0):
    wf = w.to(tl.float32)
    hf = h.to(tl.float32)
    # Output pixel centres in f32, then the grid's sums in f64 (exact products), rounded once.
    xg = (x.to(tl.float32) + cx0).to(tl.float64)
    yg = (y.to(tl.float32) + cy0).to(tl.float64)
    gx = (xg * tl.load(prm).to(tl.float64) + yg * tl.load(prm + 1).to(tl.float64) + tl.load(prm + 2).to(tl.float64)).to(
        tl.float32
    )
    gy = (
        xg * tl.load(prm + 3).to(tl.float64) + yg * tl.load(prm + 4).to(tl.float64) + tl.load(prm + 5).to(tl.float64)
    ).to(tl.float32)
    sx = ((gx + 1.0) * wf - 1.0) * 0.5
    sy = ((gy + 1.0) * hf - 1.0) * 0.5
    # Far outside is outside: clamped before the conversion to int.
    lim_x = wf + 4.0
    lim_y = hf + 4.0
    if arg == 0:
        ix = tl.minimum(tl.maximum(_rint(sx), -4.0), lim_x).to(tl.int32)
        iy = tl.minimum(tl.maximum(_rint(sy), -4.0), lim_y).to(tl.int32)
        inside = ok & (ix >= 0) & (iy >= 0) & (ix < w) & (iy < h)
        q = base + (iy * w + ix) * 3
        for c in tl.static_range(3):
            fill = _rint(tl.load(prm + 7 + c))
            v = tl.load(q + c, mask=inside, other=0).to(tl.float32)
            tl.store(out + c, tl.where(inside, v, fill).to(tl.uint8), mask=ok)
    else:
        fx = tl.floor(sx)
        fy = tl.floor(sy)
        ix = tl.minimum(tl.maximum(fx, -4.0), lim_x).to(tl.int32)
        iy = tl.minimum(tl.maximum(fy, -4.0), lim_y).to(tl.int32)
        tx = sx - fx
        ty = sy - fy
        w0 = (1.0 - tx) * (1.0 - ty)
        w1 = tx * (1.0 - ty)
        w2 = (1.0 - tx) * ty
        w3 = tx * ty
        in0 = ok & (ix >= 0) & (iy >= 0) & (ix < w) & (iy < h)
        in1 = ok & (ix + 1 >= 0) & (iy >= 0) & (ix + 1 < w) & (iy < h)
        in2 = ok & (ix >= 0) & (iy + 1 >= 0) & (ix < w) & (iy + 1 < h)
        in3 = ok & (ix + 1 >= 0) & (iy + 1 >= 0) & (ix + 1 < w) & (iy + 1 < h)
        m = tl.where(in0, w0, 0.0)
        m = m + tl.where(in1, w1, 0.0)
        m = m + tl.where(in2, w2, 0.0)
        m = m + tl.where(in3, w3, 0.0)
        has_fill = tl.load(prm + 6) != 0.0
        q = base + (iy * w + ix) * 3
        for c in tl.static_range(3):
            v = tl.load(q + c, mask=in0, other=0).to(tl.float32) * w0
            v = v + tl.load(q + 3 + c, mask=in1, other=0).to(tl.float32) * w1
            v = v + tl.load(q + w * 3 + c, mask=in2, other=0).to(tl.float32) * w2
            v = v + tl.load(q + w * 3 + 3 + c, mask=in3, other=0).to(tl.float32) * w3
            f = tl.load(prm + 7 + c)
            v = tl.where(has_fill, (v - f) * m + f, v)
            tl.store(out + c, _u8(_rint(v)), mask=ok)


# -- the kernels -------------------------------------------------------------------------------


# Scalars that change from call to call are not specialised on (Triton compiles a variant for an
# integer equal to 1 or divisible by 16): a step index or a count would otherwise compile anew.
@triton.jit(do_not_specialize=["n_stats"])
def _gather_kernel(batch, buf, nst, rows, stats, n_stats, hw, w, s_b, s_y, s_x, s_c, block: tl.constexpr):
    """Batch rows into the compact buffer's first half; zeroes the statistics."""
    i = tl.program_id(0)
    t = tl.program_id(1)
    m = tl.num_programs(0)
    p = t * block + tl.arange(0, block)
    ok = p < hw
    if tl.load(nst + i) > 0:
        row = tl.load(rows + i).to(tl.int64)
        y = p // w
        x = p - y * w
        src = batch + row * s_b + y * s_y + x * s_x
        dst = buf + i.to(tl.int64) * hw * 3 + p * 3
        for c in tl.static_range(3):
            tl.store(dst + c, tl.load(src + c * s_c, mask=ok), mask=ok)
    if t == 0:
        lane = tl.arange(0, 1024)
        j = 0
        while j < n_stats:
            tl.store(stats + (j * m + i).to(tl.int64) * 1024 + lane, tl.zeros([1024], dtype=tl.int32))
            j += 1


@triton.jit(do_not_specialize=["m"])
def _scatter_kernel(buf, batch, nst, rows, m, hw, w, s_b, s_y, s_x, s_c, block: tl.constexpr):
    """Each sample from the half its last step wrote back to its batch row."""
    i = tl.program_id(0)
    t = tl.program_id(1)
    n = tl.load(nst + i)
    if n > 0:
        p = t * block + tl.arange(0, block)
        ok = p < hw
        row = tl.load(rows + i).to(tl.int64)
        y = p // w
        x = p - y * w
        src = buf + ((n % 2) * m + i).to(tl.int64) * hw * 3 + p * 3
        dst = batch + row * s_b + y * s_y + x * s_x
        for c in tl.static_range(3):
            tl.store(dst + c * s_c, tl.load(src + c, mask=ok), mask=ok)


@triton.jit(do_not_specialize=["k", "steps"])
def _pre_kernel(src, recs, stats, scratch, aux, k, steps, hw, w, aux_w, kinds: tl.constexpr, block: tl.constexpr):
    """Step ``k``'s whole-image statistics (atomics into ``stats``), or its blur's horizontal pass."""
    i = tl.program_id(0)
    t = tl.program_id(1)
    rec = recs + (i * steps + k) * 16
    kind = tl.load(rec)
    arg = tl.load(rec + 1)
    p = t * block + tl.arange(0, block)
    ok = p < hw
    i64 = i.to(tl.int64)
    base = src + i64 * hw * 3
    st = stats + i64 * 1024
    if (kinds >> 2) & 1:
        if (kind == BLEND) & (arg == 1):
            r, g, b = _load3(base, p * 3, ok)
            grey = tl.floor(_luma(r, g, b)).to(tl.int32)
            tl.atomic_add(st + 768, tl.sum(tl.where(ok, grey, 0), 0))
    if ((kinds >> 8) & 1) | ((kinds >> 9) & 1):
        if (kind == AUTOCONTRAST) | (kind == EQUALIZE):
            lane = tl.arange(0, 256)
            for c in tl.static_range(3):
                v = tl.load(base + p * 3 + c, mask=ok, other=0).to(tl.int32)
                tl.atomic_add(st + c * 256 + lane, tl.histogram(v, 256, mask=ok))
    if (kinds >> 11) & 1:
        if kind == BLUR:
            kx = arg & 0xFFFF
            rx = kx // 2
            wt = aux + i64 * aux_w
            y = p // w
            x = p - y * w
            a0 = tl.zeros([block], dtype=tl.float32)
            a1 = tl.zeros([block], dtype=tl.float32)
            a2 = tl.zeros([block], dtype=tl.float32)
            j = 0
            while j < kx:
                kv = tl.load(wt + j)
                q = base + (y * w + _reflect(x - rx + j, w)) * 3
                a0 = a0 + tl.load(q, mask=ok, other=0).to(tl.float32) * kv
                a1 = a1 + tl.load(q + 1, mask=ok, other=0).to(tl.float32) * kv
                a2 = a2 + tl.load(q + 2, mask=ok, other=0).to(tl.float32) * kv
                j += 1
            _store3(scratch + (i64 * hw + p) * 3, a0, a1, a2, ok)


@triton.jit(do_not_specialize=["k", "steps"])
def _apply_kernel(
    src,
    dst,
    recs,
    prms,
    stats,
    scratch,
    aux,
    k,
    steps,
    hw,
    h,
    w,
    aux_w,
    cx0,
    cy0,
    kinds: tl.constexpr,
    block: tl.constexpr,
):
    """Step ``k`` of every sample that has one: half ``src`` to half ``dst``."""
    i = tl.program_id(0)
    t = tl.program_id(1)
    at = (i * steps + k) * 16
    kind = tl.load(recs + at)
    arg = tl.load(recs + at + 1)
    prm = prms + at + 2
    p = t * block + tl.arange(0, block)
    ok = p < hw
    y = p // w
    x = p - y * w
    i64 = i.to(tl.int64)
    base = src + i64 * hw * 3
    off = p * 3
    out = dst + i64 * hw * 3 + off
    st = stats + i64 * 1024
    if (kinds >> 1) & 1:
        if kind == REMAP:
            _remap(base, out, prm, ok, y, x, h, w)
    if (kinds >> 2) & 1:
        if kind == BLEND:
            _blend(base, out, prm, st, arg, off, ok, hw)
    if (kinds >> 3) & 1:
        if kind == HUE:
            _hue(base, out, prm, off, ok)
    if (kinds & ((1 << 4) | (1 << 5) | (1 << 6) | (1 << 7))) != 0:
        if (kind >= GRAYSCALE) & (kind <= INVERT):
            _tone(base, out, prm, kind, off, ok)
    if (kinds >> 8) & 1:
        if kind == AUTOCONTRAST:
            _autocontrast(base, out, st, off, ok)
    if (kinds >> 9) & 1:
        if kind == EQUALIZE:
            _equalize(base, out, st, off, ok, hw)
    if (kinds >> 10) & 1:
        if kind == SHARPNESS:
            _sharpness(base, out, prm, ok, y, x, h, w)
    if (kinds >> 11) & 1:
        if kind == BLUR:
            _blur_v(scratch + i64 * hw * 3, out, aux + i64 * aux_w, arg, ok, y, x, h, w)
    if (kinds >> 12) & 1:
        if kind == AFFINE:
            _affine(base, out, prm, arg, ok, y, x, h, w, cx0, cy0)


# -- the host ----------------------------------------------------------------------------------


def _strides(images: Any, layout: str) -> tuple[int, int, int, int, int, int]:
    """``(height, width)`` of the batch and its strides in elements: batch, row, pixel, channel."""
    if layout == "NHWC":
        _, h, w, c = images.shape
        s_b, s_y, s_x, s_c = images.stride()
    elif layout == "NCHW":
        _, c, h, w = images.shape
        s_b, s_c, s_y, s_x = images.stride()
    else:
        raise ValueError(f"layout must be 'NHWC' or 'NCHW', got {layout!r}")
    if c != 3:
        raise ValueError(f"the batch must be RGB ({layout}), got {tuple(images.shape)}")
    return h, w, s_b, s_y, s_x, s_c


def _blur_weights(recs: np.ndarray, steps: list[int]) -> tuple[np.ndarray, int]:
    """The blur steps' 1-D kernels, ``[len(steps), m, width]`` float32 (``kx`` then ``ky`` taps;
    ``gaussian_kernels``, as ops.py's table), and ``width``."""
    m = recs.shape[0]
    args = [recs[:, k, 1][recs[:, k, 0] == 11] for k in steps]
    width = max((int(a & 0xFFFF) + int(a >> 16) for arr in args for a in np.unique(arr)), default=1)
    aux = np.zeros((len(steps), m, width), dtype=np.float32)
    flts = recs[:, :, 2:].view(np.float32)
    for j, k in enumerate(steps):
        blur = recs[:, k, 0] == 11
        for a in np.unique(recs[blur, k, 1]):
            sel = np.nonzero(blur & (recs[:, k, 1] == a))[0]
            kx, ky = int(a) & 0xFFFF, int(a) >> 16
            aux[j, sel, :kx] = gaussian_kernels(kx, flts[sel, k, 0])
            aux[j, sel, kx : kx + ky] = gaussian_kernels(ky, flts[sel, k, 1])
    return aux, width


def run(
    images: Any,
    records: np.ndarray,
    rows: Sequence[int] | np.ndarray | None = None,
    layout: str = "NHWC",
    *,
    block: int = BLOCK,
    warps: int = WARPS,
) -> Any:
    """Runs the ``gpu_ops`` ``records`` (int32 ``[m, S, 16]``, on the host) of the samples in
    batch rows ``rows`` (default ``0 .. m``) on ``images`` (uint8 ``[N, H, W, 3]`` for ``"NHWC"``,
    ``[N, 3, H, W]`` for ``"NCHW"``) in place, on its device and current stream; returns
    ``images``. The same bytes as ``ops.apply(images, OpTable.from_records(records, (H, W),
    rows=rows, device=images.device), layout)`` (blur: see the module's docstring). ``block``
    and ``warps``: the programs' shape (``block`` a power of two, at least 256).

    Raises:
        ValueError: records of the wrong shape or of an unknown kind (naming the step), rows that
            do not match them, a batch that is not uint8 RGB in ``layout``.
    """
    import torch

    recs = np.ascontiguousarray(records, dtype=np.int32)
    if recs.ndim != 3 or recs.shape[2] != RECORD_INTS:
        raise ValueError(f"gpu_ops records must be [n, S, {RECORD_INTS}] int32, got {recs.shape}")
    h, w, s_b, s_y, s_x, s_c = _strides(images, layout)
    if images.dtype != torch.uint8:
        raise ValueError(f"the batch must be uint8, got {images.dtype}")
    m = recs.shape[0]
    rows_np = np.arange(m, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows_np.shape != (m,):
        raise ValueError(f"{m} samples' records, {rows_np.size} rows")
    kinds = recs[:, :, 0]
    live = kinds.any(axis=0)
    # As ops.OpTable: steps up to the first that no sample has.
    steps = int(np.argmin(live)) if not live.all() else recs.shape[1]
    for k in range(steps):
        for code in np.unique(kinds[:, k]):
            if code != 0 and int(code) not in KIND_CODES:
                raise ValueError(f"gpu_ops: step {k} has kind {int(code)}, which this client does not know")
    if m == 0 or steps == 0 or h * w == 0:
        return images
    recs = np.ascontiguousarray(recs[:, :steps])
    kinds = recs[:, :, 0]
    # A sample's steps end at its first 0 (ring.md: every record after it is 0 too).
    nst = np.where((kinds == 0).any(axis=1), np.argmax(kinds == 0, axis=1), steps).astype(np.int32)
    present = [set(np.unique(kinds[:, k]).tolist()) - {0} for k in range(steps)]
    pre = [k for k in range(steps) if present[k] & _PRE]
    blurs = [k for k in range(steps) if 11 in present[k]]
    aux, aux_w = _blur_weights(recs, blurs)

    # One upload: the records, each sample's step count and row, the blur kernels.
    host = np.concatenate([recs.ravel(), nst, rows_np.astype(np.int32), aux.view(np.int32).ravel()])
    dev = images.device
    t = torch.from_numpy(host)
    meta = t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t.to(dev)
    n_rec = recs.size
    recs_d = meta[:n_rec]
    prms_d = recs_d.view(torch.float32)
    nst_d = meta[n_rec : n_rec + m]
    rows_d = meta[n_rec + m : n_rec + 2 * m]
    aux_d = meta[n_rec + 2 * m :].view(torch.float32).view(len(blurs), m, aux_w)

    hw = h * w
    buf = torch.empty((2, m, hw * 3), dtype=torch.uint8, device=dev)
    stats = torch.empty((max(len(pre), 1), m, STATS), dtype=torch.int32, device=dev)
    scratch = torch.empty((m, hw * 3) if blurs else (1,), dtype=torch.float32, device=dev)
    no_aux = torch.empty((1,), dtype=torch.float32, device=dev)
    cx0 = float(np.float32((1.0 - float(w)) * 0.5))
    cy0 = float(np.float32((1.0 - float(h)) * 0.5))
    grid = (m, triton.cdiv(hw, block))
    common = {"num_warps": warps, "enable_fp_fusion": False}

    _gather_kernel[grid](images, buf, nst_d, rows_d, stats, len(pre), hw, w, s_b, s_y, s_x, s_c, block=block, **common)
    # The kinds the kernels compile in: every kind seen so far in this process, not this step's
    # (which differ from batch to batch: a policy draws one of 14, so a mask per step and batch
    # would compile a variant for each new combination, seconds each, inside the training loop).
    # The union only grows, so it settles within the first batches: a few compiles in all.
    global _SEEN
    _SEEN |= sum(1 << c for c in set().union(*present))
    mask = _SEEN
    for k in range(steps):
        src, dst = buf[k % 2], buf[(k + 1) % 2]
        st = stats[pre.index(k)] if k in pre else stats[0]
        ax = aux_d[blurs.index(k)] if k in blurs else no_aux
        if k in pre:
            _pre_kernel[grid](src, recs_d, st, scratch, ax, k, steps, hw, w, aux_w, kinds=mask, block=block, **common)
        _apply_kernel[grid](
            src,
            dst,
            recs_d,
            prms_d,
            st,
            scratch,
            ax,
            k,
            steps,
            hw,
            h,
            w,
            aux_w,
            cx0,
            cy0,
            kinds=mask,
            block=block,
            **common,
        )
    _scatter_kernel[grid](buf, images, nst_d, rows_d, m, hw, w, s_b, s_y, s_x, s_c, block=block, **common)
    return images
