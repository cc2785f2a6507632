"""One Triton kernel that finishes a batch's GPU samples: crop, antialiased resize, flip and fill.

:class:`ringfeed.gpu.hybrid.Finisher` decodes a batch's GPU samples into one image each (nvImageCodec's
images, or tensors), then has to bring each into its row of the batch tensor. The matrix-product
path (``Finisher._finish_bmm``) copies every crop into a padded buffer first: a slice and a copy
per image, from Python, about 50 µs of the training process's host thread per sample on the H200
(``benches/results/2026-12-01-h200-hybrid``). This kernel reads the decoded images where they
are, through a table of their addresses and strides, and writes the finished pixels straight into
the batch: one launch per batch, and per sample only the table row the host fills in.

Each program computes a ``TY x TX`` tile of one sample's output as two matrix products on the
tensor cores, ``out = Wy @ src @ Wx``, over the tile's source rectangle in ``CHUNK x CHUNK``
pieces: each source pixel the tile needs is loaded once (a 2D load, coalesced along the row),
where a per-pixel gather loads it once per output pixel whose filter covers it (the kernel of
970c170, about 48 byte loads per output pixel at ImageNet's downscales;
``benches/e2e/_finish_kernel_before.py``). The weight matrices hold the filter the CPU path
uses (PIL's and torchvision's antialiased weights: a triangle for bilinear, Keys' cubic with
``a = -0.5`` for bicubic, ``-0.75`` without antialias, widened by the downscale factor; one tap
for nearest and for no resize), each output's weights normalised by their sum along its axis,
as ``hybrid.axis_weights`` builds them for the matrix-product path; zero outside a tap's
window. Operands are fp16 (0..255 are exact in it, weights carry 11 bits) with fp32
accumulation, as the matrix-product path's; the row products are rounded to fp16 for the second
product, a relative error of 2^-11 (at most an eighth of a level). Outside the window's
``valid`` rectangle the output is the fill.

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
#: Output tile: rows and columns per program (224 = 14 x 16 = 7 x 32: no tile hangs over a 224
#: output). The shape is the fastest of eleven ``nvjpeg_probe.py`` timed on the H200, 192 corpus
#: images a batch (benches/results/2026-12-02-h200-tiled, "prio/probe"): 16 x 32 tiles, pieces of
#: 16, 2 warps 0.416 ms; 16/16/16 0.474 ms; 32/32/32 with 4 warps 0.683 ms; the direct kernel of
#: 970c170 0.820 ms in the same run.
TY = 16
TX = 32
#: Source rows and columns per piece of the tile's source rectangle (the products' inner size).
CHUNK = 16
#: Warps per program.
WARPS = 2


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
    """Along one axis, for output indices ``o``: the first crop pixel of their taps, their count,
    the filter's centre and width, whether a filter applies (else one tap of weight 1), and
    whether ``o`` lies in ``valid``. The same geometry as ``hybrid.axis_weights``."""
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
def _weights(j, lo, n, center, widen, filt, cubic, a):
    """Unnormalised weight of crop pixel ``j`` in the filter of the output whose taps are
    (``lo``, ``n``, ``center``, ``widen``); ``j`` and the rest broadcast against each other."""
    inside = (j >= lo) & (j < lo + n)
    w = tl.where(filt, _kern((j.to(tl.float32) + 0.5 - center) / widen, cubic, a), 1.0)
    return tl.where(inside, w, 0.0)


@triton.jit
def _norm(lo, n, center, widen, filt, cubic, a):
    """1 / the sum of each output's weights (0 where it has none: it gives 0, as a zero row of
    weights does); the taps counted one at a time, every output at once."""
    total = tl.zeros(lo.shape, dtype=tl.float32)
    top = tl.max(n, 0)
    t = 0
    while t < top:
        total += _weights(lo + t, lo, n, center, widen, filt, cubic, a)
        t += 1
    return tl.where(total != 0.0, 1.0 / tl.where(total != 0.0, total, 1.0), 0.0)


@triton.jit
def _finish_kernel(
    table,
    out,
    s_b,
    s_y,
    s_x,
    s_c,
    oh,
    ow,
    row_len: tl.constexpr,
    ty: tl.constexpr,
    tx: tl.constexpr,
    chunk: tl.constexpr,
):
    i = tl.program_id(0)
    tile_y = tl.program_id(1)
    tile_x = tl.program_id(2)
    row = table + i * row_len
    base = tl.load(row).to(tl.pointer_type(tl.uint8))
    # Offsets within one image fit 32 bits (a decoded image is far below 2 GiB).
    sy = tl.load(row + 1).to(tl.int32)
    sx = tl.load(row + 2).to(tl.int32)
    sc = tl.load(row + 3).to(tl.int32)
    pre_l = tl.load(row + 4).to(tl.int32)
    pre_t = tl.load(row + 5).to(tl.int32)
    pre_w = tl.load(row + 6).to(tl.int32)
    pre_h = tl.load(row + 7).to(tl.int32)
    rs_w = tl.load(row + 8).to(tl.int32)
    rs_h = tl.load(row + 9).to(tl.int32)
    win_l = tl.load(row + 10).to(tl.int32)
    win_t = tl.load(row + 11).to(tl.int32)
    val_l = tl.load(row + 12).to(tl.int32)
    val_t = tl.load(row + 13).to(tl.int32)
    val_w = tl.load(row + 14).to(tl.int32)
    val_h = tl.load(row + 15).to(tl.int32)
    flags = tl.load(row + 16).to(tl.int32)
    fill = tl.load(row + 17).to(tl.int32)
    dest = tl.load(row + 18)

    interp = (flags >> 2) & 3
    antialias = (flags & 16) != 0
    cubic = interp == 2
    a = tl.where(antialias, -0.5, -0.75)

    oy = tile_y * ty + tl.arange(0, ty)
    ox = tile_x * tx + tl.arange(0, tx)
    rows = oy < oh
    cols = ox < ow
    ylo, yn, yc, yw, yf, yv = _taps(
        oy, oh, pre_t, pre_h, rs_h, win_t, val_t, val_h, (flags & 2) != 0, interp, antialias
    )
    xlo, xn, xc, xw, xf, xv = _taps(
        ox, ow, pre_l, pre_w, rs_w, win_l, val_l, val_w, (flags & 1) != 0, interp, antialias
    )
    yn = tl.where(rows, yn, 0)
    xn = tl.where(cols, xn, 0)
    ynorm = _norm(ylo, yn, yc, yw, yf, cubic, a)
    xnorm = _norm(xlo, xn, xc, xw, xf, cubic, a)
    # The tile's source rectangle: every tap of its outputs (none: an empty range).
    big = 1 << 30
    y0 = tl.min(tl.where(yn > 0, ylo, big), 0)
    y1 = tl.max(tl.where(yn > 0, ylo + yn, 0), 0)
    x0 = tl.min(tl.where(xn > 0, xlo, big), 0)
    x1 = tl.max(tl.where(xn > 0, xlo + xn, 0), 0)

    acc0 = tl.zeros([ty, tx], dtype=tl.float32)
    acc1 = tl.zeros([ty, tx], dtype=tl.float32)
    acc2 = tl.zeros([ty, tx], dtype=tl.float32)
    lane = tl.arange(0, chunk)
    # `while`, not `range`: Triton 3.6's interpreter (with NumPy 2.5) cannot take a loaded value
    # as a range's bound (its scalars are one-element arrays); compiled, both are one loop.
    r0 = y0
    while r0 < y1:
        jy = r0 + lane
        # [ty, chunk]: the tile's output rows against this piece's source rows.
        wy = _weights(jy[None, :], ylo[:, None], yn[:, None], yc[:, None], yw, yf, cubic, a) * ynorm[:, None]
        wy = wy.to(tl.float16)
        h0 = tl.zeros([chunk, tx], dtype=tl.float32)
        h1 = tl.zeros([chunk, tx], dtype=tl.float32)
        h2 = tl.zeros([chunk, tx], dtype=tl.float32)
        c0 = x0
        while c0 < x1:
            jx = c0 + lane
            # [chunk, tx]: this piece's source columns against the tile's output columns.
            wx = _weights(jx[:, None], xlo[None, :], xn[None, :], xc[None, :], xw, xf, cubic, a) * xnorm[None, :]
            wx = wx.to(tl.float16)
            m = ((jy < pre_h)[:, None]) & ((jx < pre_w)[None, :])
            p = base + ((pre_t + jy) * sy)[:, None] + ((pre_l + jx) * sx)[None, :]
            h0 = tl.dot(tl.load(p, mask=m, other=0).to(tl.float16), wx, h0)
            h1 = tl.dot(tl.load(p + sc, mask=m, other=0).to(tl.float16), wx, h1)
            h2 = tl.dot(tl.load(p + 2 * sc, mask=m, other=0).to(tl.float16), wx, h2)
            c0 += chunk
        acc0 = tl.dot(wy, h0.to(tl.float16), acc0)
        acc1 = tl.dot(wy, h1.to(tl.float16), acc1)
        acc2 = tl.dot(wy, h2.to(tl.float16), acc2)
        r0 += chunk

    valid = yv[:, None] & xv[None, :]
    v0 = tl.where(valid, acc0, (fill & 255).to(tl.float32))
    v1 = tl.where(valid, acc1, ((fill >> 8) & 255).to(tl.float32))
    v2 = tl.where(valid, acc2, ((fill >> 16) & 255).to(tl.float32))
    q = out + dest * s_b + (oy * s_y)[:, None] + (ox * s_x)[None, :]
    m = rows[:, None] & cols[None, :]
    tl.store(q, tl.minimum(tl.maximum(tl.floor(v0 + 0.5), 0.0), 255.0).to(tl.uint8), mask=m)
    tl.store(q + s_c, tl.minimum(tl.maximum(tl.floor(v1 + 0.5), 0.0), 255.0).to(tl.uint8), mask=m)
    tl.store(q + 2 * s_c, tl.minimum(tl.maximum(tl.floor(v2 + 0.5), 0.0), 255.0).to(tl.uint8), mask=m)


def warm(device: Any, layout: str, size: tuple[int, int], run: Any = None) -> None:
    """Compiles the kernel for batches of ``size`` in ``layout`` on ``device`` by finishing one
    1x1 image into a scratch row: the strides and sizes it is specialised on are a real batch's
    (a row of a contiguous batch tensor has the same strides whatever the batch size). ``run``:
    another ``finish`` of the same table to compile instead (a bench's baseline kernel)."""
    import torch

    oh, ow = size
    shape = (1, oh, ow, 3) if layout == "NHWC" else (1, 3, oh, ow)
    image = torch.empty(shape, dtype=torch.uint8, device=device)
    src = torch.zeros((1, 1, 3), dtype=torch.uint8, device=device)
    row = [src.data_ptr(), 3, 3, 1] + [0] * (TABLE_LEN - 4)
    row[6] = row[7] = 1  # pre: the 1x1 image
    row[14] = row[15] = 1  # valid: one pixel
    table = torch.tensor([row], dtype=torch.int64, device=device)
    (run or finish)(table, image, layout)
    torch.cuda.synchronize(device)


def geometry(image: Any, layout: str) -> tuple[int, int, int, int, int, int]:
    """``(height, width)`` of the uint8 batch ``image`` (``NHWC`` or ``NCHW``) and its strides in
    elements: batch, row, pixel, channel."""
    if layout == "NHWC":
        _, oh, ow, _ = image.shape
        s_b, s_y, s_x, s_c = image.stride()
    else:
        _, _, oh, ow = image.shape
        s_b, s_c, s_y, s_x = image.stride()
    return oh, ow, s_b, s_y, s_x, s_c


def finish(
    table: Any, image: Any, layout: str, *, ty: int = TY, tx: int = TX, chunk: int = CHUNK, warps: int = WARPS
) -> None:
    """Runs the kernel over ``table`` (int64 ``[k, TABLE_LEN]`` on ``image``'s device) into
    ``image`` (the uint8 batch, ``NHWC`` or ``NCHW``), on the current stream. The images the table
    points at must stay alive until the kernel has run (the caller keeps them). ``ty``, ``tx``,
    ``chunk`` and ``warps``: the launch's shape (powers of two, at least 16;
    benches/e2e/nvjpeg_probe.py tries others)."""
    k = table.shape[0]
    if k == 0:
        return
    oh, ow, s_b, s_y, s_x, s_c = geometry(image, layout)
    grid = (k, triton.cdiv(oh, ty), triton.cdiv(ow, tx))
    _finish_kernel[grid](
        table, image, s_b, s_y, s_x, s_c, oh, ow, row_len=TABLE_LEN, ty=ty, tx=tx, chunk=chunk, num_warps=warps
    )
