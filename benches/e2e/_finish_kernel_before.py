"""The direct finishing kernel of 970c170 (``ringfeed.gpu.finish_kernel`` before the tiled one), kept
for ``nvjpeg_probe.py --compare`` and ``hybrid_step.py``'s ``finish/before`` to time beside it in
the same run. Same table, filters and API as ``ringfeed.gpu.finish_kernel`` (whose ``_kern``,
``_taps`` and warm-up it uses); each program computes ``BLOCK`` output pixels of one output row,
gathering every tap of every output pixel (column taps ``TAPS`` at a time, row taps ``ROWS``).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ringfeed.gpu import finish_kernel as _tiled
from ringfeed.gpu.finish_kernel import TABLE_LEN, _kern, _taps

#: Output pixels per program.
BLOCK = 128
#: Warps per program.
WARPS = 2
#: Row taps whose loads are issued together.
ROWS: tl.constexpr = tl.constexpr(4)
#: Column taps per chunk (the second axis of the kernel's tensors).
TAPS = 2


@triton.jit
def _finish_kernel(
    table, out, s_b, s_y, s_x, s_c, oh, ow, row_len: tl.constexpr, block: tl.constexpr, taps: tl.constexpr
):
    i = tl.program_id(0)
    oy = tl.program_id(1)
    bx = tl.program_id(2)
    row = table + i * row_len
    base = tl.load(row).to(tl.pointer_type(tl.uint8))
    sy = tl.load(row + 1)
    sx = tl.load(row + 2)
    sc = tl.load(row + 3)
    pre_l = tl.load(row + 4)
    pre_t = tl.load(row + 5)
    pre_w = tl.load(row + 6)
    pre_h = tl.load(row + 7)
    rs_w = tl.load(row + 8)
    rs_h = tl.load(row + 9)
    win_l = tl.load(row + 10)
    win_t = tl.load(row + 11)
    val_l = tl.load(row + 12)
    val_t = tl.load(row + 13)
    val_w = tl.load(row + 14)
    val_h = tl.load(row + 15)
    flags = tl.load(row + 16)
    fill = tl.load(row + 17)
    dest = tl.load(row + 18)

    interp = (flags >> 2) & 3
    antialias = (flags & 16) != 0
    cubic = interp == 2
    a = tl.where(antialias, -0.5, -0.75)

    ylo, ny, yc, yw, yf, yv = _taps(
        oy, oh, pre_t, pre_h, rs_h, win_t, val_t, val_h, (flags & 2) != 0, interp, antialias
    )
    ox = bx * block + tl.arange(0, block)
    cols = ox < ow
    xlo, nx, xc, xw, xf, xv = _taps(
        ox, ow, pre_l, pre_w, rs_w, win_l, val_l, val_w, (flags & 1) != 0, interp, antialias
    )
    nx = tl.where(cols, nx, 0)
    nx_max = tl.max(nx, 0)

    acc0 = tl.zeros([block], dtype=tl.float32)
    acc1 = tl.zeros([block], dtype=tl.float32)
    acc2 = tl.zeros([block], dtype=tl.float32)
    wsum = tl.zeros([block], dtype=tl.float32)
    # Column taps TAPS at a time as the second axis of [block, TAPS] tensors: their weights are
    # computed once per program and chunk (not once per row tap), and each row tap issues
    # block x TAPS loads at once. Rows inside, ROWS at a time; a row tap's weight is one scalar.
    # `while`, not `range`: Triton 3.6's interpreter (with NumPy 2.5) cannot take a loaded
    # value as a range's bound (its scalars are one-element arrays); compiled, both are one loop.
    lane = tl.arange(0, taps)
    cx = 0
    while cx < nx_max:
        t2 = cx + lane[None, :]
        jx = xlo[:, None] + t2
        m2 = t2 < nx[:, None]
        # The filter's width and whether it applies are the sample's (scalars); centres per pixel.
        wx = _kern((jx.to(tl.float32) + 0.5 - xc[:, None]) / xw, cubic, a)
        wx = tl.where(m2, tl.where(xf, wx, 1.0), 0.0)
        wxs = tl.sum(wx, axis=1)
        col = base + (pre_l + jx) * sx
        ty = 0
        while ty < ny:
            for u in tl.static_range(ROWS):
                t = ty + u
                jy = ylo + t
                wy = tl.where(t < ny, tl.where(yf, _kern((jy.to(tl.float32) + 0.5 - yc) / yw, cubic, a), 1.0), 0.0)
                p = col + (pre_t + jy) * sy
                mm = tl.where(t < ny, m2, False)
                acc0 += wy * tl.sum(wx * tl.load(p, mask=mm, other=0).to(tl.float32), axis=1)
                acc1 += wy * tl.sum(wx * tl.load(p + sc, mask=mm, other=0).to(tl.float32), axis=1)
                acc2 += wy * tl.sum(wx * tl.load(p + 2 * sc, mask=mm, other=0).to(tl.float32), axis=1)
                wsum += wy * wxs
            ty += ROWS
        cx += taps

    # No tap (a one-hot source outside the crop) gives 0, as a zero row of weights does.
    inv = tl.where(wsum > 0.0, 1.0 / tl.where(wsum > 0.0, wsum, 1.0), 0.0)
    valid = tl.where(yv, xv, False)
    v0 = tl.where(valid, acc0 * inv, (fill & 255).to(tl.float32))
    v1 = tl.where(valid, acc1 * inv, ((fill >> 8) & 255).to(tl.float32))
    v2 = tl.where(valid, acc2 * inv, ((fill >> 16) & 255).to(tl.float32))
    q = out + dest * s_b + oy * s_y + ox * s_x
    tl.store(q, tl.minimum(tl.maximum(tl.floor(v0 + 0.5), 0.0), 255.0).to(tl.uint8), mask=cols)
    tl.store(q + s_c, tl.minimum(tl.maximum(tl.floor(v1 + 0.5), 0.0), 255.0).to(tl.uint8), mask=cols)
    tl.store(q + 2 * s_c, tl.minimum(tl.maximum(tl.floor(v2 + 0.5), 0.0), 255.0).to(tl.uint8), mask=cols)


def warm(device: Any, layout: str, size: tuple[int, int]) -> None:
    """Compiles this kernel as ``ringfeed.gpu.finish_kernel.warm`` does its own."""
    _tiled.warm(device, layout, size, run=finish)


def finish(table: Any, image: Any, layout: str, *, block: int = BLOCK, warps: int = WARPS, taps: int = TAPS) -> None:
    """Runs the kernel over ``table`` into ``image`` on the current stream, as
    ``ringfeed.gpu.finish_kernel.finish`` does."""
    k = table.shape[0]
    if k == 0:
        return
    oh, ow, s_b, s_y, s_x, s_c = _tiled.geometry(image, layout)
    grid = (k, oh, triton.cdiv(ow, block))
    _finish_kernel[grid](
        table, image, s_b, s_y, s_x, s_c, oh, ow, row_len=TABLE_LEN, block=block, taps=taps, num_warps=warps
    )
