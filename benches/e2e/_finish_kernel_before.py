"""The direct finishing kernel of 970c170 (ringfeed._finish_kernel before the tiled one), kept for
``nvjpeg_probe.py --compare`` to time beside it in the same run.

One Triton kernel that finishes a batch's GPU samples: crop, antialiased resize, flip and fill.

:class:`ringfeed._hybrid.Finisher` decodes a batch's GPU samples into one image each (nvImageCodec's
images, or tensors), then has to bring each into its row of the batch tensor. The matrix-product
path (``Finisher._finish_bmm``) copies every crop into a padded buffer first: a slice and a copy
per image, from Python, about 50 µs of the training process's host thread per sample on the H200
(``benches/results/2026-12-01-h200-hybrid``). This kernel reads the decoded images where they
are, through a table of their addresses and strides, and writes the finished pixels straight into
the batch: one launch per batch, and per sample only the table row the host fills in.

Each program computes ``BLOCK`` output pixels of one output row of one sample, its column taps
``TAPS`` at a time as a second tensor axis (their weights computed once per program) and its row
taps ``ROWS`` at a time. Along each axis it finds the source taps of the filter the CPU path
uses (PIL's and torchvision's antialiased weights: a triangle for bilinear, Keys' cubic with
``a = -0.5`` for bicubic, ``-0.75`` without antialias, widened by the downscale factor; one tap
for nearest and for no resize) and sums the separable products ``w_y * w_x`` over them in
float32, normalised by their sum. That is the same arithmetic as the matrix products of
``_hybrid.axis_weights`` (each output pixel is ``sum_y sum_x w_y w_x src``), without the fp16
intermediate. Outside the window's ``valid`` rectangle the output is the fill.

The table (int64, ``[k, TABLE_LEN]``): columns 0-3 are the image's address and its strides in
elements (row, pixel, channel; uint8 HWC or CHW alike); columns 4-17 are the ``gpu_job`` record's
own columns 4-17 (ring.md: ``pre`` rectangle, resize, window origin, ``valid`` rectangle, flags,
fill); column 18 is the batch row the sample goes to.

Under ``TRITON_INTERPRET=1`` the same kernel runs on the CPU, on CPU tensors: that is how CI,
which has no GPU, tests it against the matrix-product path (``tests/test_finish_kernel.py``).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

#: int64 values per table row (see the module's docstring).
TABLE_LEN = 19
#: Output pixels per program.
BLOCK = 128
#: Warps per program: one output pixel per thread (4 warps would hold each pixel twice over).
WARPS = 2
#: Row taps whose loads are issued together.
ROWS: tl.constexpr = tl.constexpr(4)
#: Column taps per chunk (the second axis of the kernel's tensors; more are taken chunk by chunk).
TAPS = 2


@triton.jit
def _kern(x, cubic, a):
    """Filter weight at distance ``x`` in filter units: Keys' cubic (``a``) or the triangle."""
    ax = tl.abs(x)
    tri = tl.maximum(1.0 - ax, 0.0)
    near = ((a + 2.0) * ax - (a + 3.0)) * ax * ax + 1.0
    far = ((a * ax - 5.0 * a) * ax + 8.0 * a) * ax - 4.0 * a
    cub = tl.where(ax < 1.0, near, tl.where(ax < 2.0, far, 0.0))
    return tl.where(cubic, cub, tri)


@triton.jit
def _taps(o, out_n, pre0, pre_n, resize_n, win0, valid0, valid_n, flip, interp, antialias):
    """Along one axis, for output index ``o`` (scalar or vector): the first crop pixel of its taps,
    their count, the filter's centre and width, whether a filter applies (else one tap of weight
    1), and whether ``o`` lies in ``valid``. The same geometry as ``_hybrid.axis_weights``."""
    oo = tl.where(flip, out_n - 1 - o, o)
    b = (win0 + oo).to(tl.float32)
    valid = (b >= valid0.to(tl.float32)) & (b < (valid0 + valid_n).to(tl.float32))
    last = (pre_n - 1).to(tl.float32)
    resized = resize_n > 0
    scale = pre_n.to(tl.float32) / tl.maximum(resize_n, 1).to(tl.float32)
    filt = resized & (interp != 0)
    widen = tl.where(antialias, tl.maximum(scale, 1.0), 1.0)
    center = (b + 0.5) * scale
    radius = tl.where(interp == 2, 2.0, 1.0) * widen
    f_lo = tl.maximum(tl.floor(center - radius - 0.5), 0.0)
    f_hi = tl.minimum(tl.ceil(center + radius - 0.5), last)
    # Nearest picks floor(b * scale) in float32, as the server and PyTorch do; with no resize the
    # base is the source and the crop starts at `pre`.
    one = tl.where(resized, tl.minimum(tl.floor(b * scale), last), b - pre0.to(tl.float32))
    one_ok = (one >= 0.0) & (one <= last)
    lo = tl.where(filt, f_lo, tl.maximum(one, 0.0)).to(tl.int32)
    n = tl.where(filt, (f_hi - f_lo + 1.0).to(tl.int32), tl.where(one_ok, 1, 0))
    return lo, n, center, widen, filt, valid


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
    """Compiles the kernel for batches of ``size`` in ``layout`` on ``device`` by finishing one
    1x1 image into a scratch row: the strides and sizes it is specialised on are a real batch's
    (a row of a contiguous batch tensor has the same strides whatever the batch size)."""
    import torch

    oh, ow = size
    shape = (1, oh, ow, 3) if layout == "NHWC" else (1, 3, oh, ow)
    image = torch.empty(shape, dtype=torch.uint8, device=device)
    src = torch.zeros((1, 1, 3), dtype=torch.uint8, device=device)
    row = [src.data_ptr(), 3, 3, 1] + [0] * (TABLE_LEN - 4)
    row[6] = row[7] = 1  # pre: the 1x1 image
    row[14] = row[15] = 1  # valid: one pixel
    table = torch.tensor([row], dtype=torch.int64, device=device)
    finish(table, image, layout)
    torch.cuda.synchronize(device)


def finish(table: Any, image: Any, layout: str, *, block: int = BLOCK, warps: int = WARPS, taps: int = TAPS) -> None:
    """Runs the kernel over ``table`` (int64 ``[k, TABLE_LEN]`` on ``image``'s device) into
    ``image`` (the uint8 batch, ``NHWC`` or ``NCHW``), on the current stream. The images the table
    points at must stay alive until the kernel has run (the caller keeps them). ``block``,
    ``warps`` and ``taps``: the launch's shape (benches/e2e/nvjpeg_probe.py tries others)."""
    k = table.shape[0]
    if k == 0:
        return
    if layout == "NHWC":
        _, oh, ow, _ = image.shape
        s_b, s_y, s_x, s_c = image.stride()
    else:
        _, _, oh, ow = image.shape
        s_b, s_c, s_y, s_x = image.stride()
    grid = (k, oh, triton.cdiv(ow, block))
    _finish_kernel[grid](
        table, image, s_b, s_y, s_x, s_c, oh, ow, row_len=TABLE_LEN, block=block, taps=taps, num_warps=warps
    )
