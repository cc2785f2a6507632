"""Two Triton kernels that rebuild interpolated chroma, in place, in a batch of replicated decodes.

nvJPEG's hardware decoder is cheap beside a training model only with replicated chroma (each
subsampled chroma sample covers its whole block of pixels: 2x2 for 4:2:0, 2x1 for 4:2:2, 1x2 for
4:4:0), while Pillow and torchvision interpolate chroma (libjpeg's "fancy" upsampling). With
interpolation the engine's planar path cost ResNet-18's step +41 % against +4 % replicated
(``benches/results/2026-12-01-h200-chroma/README.md``). ``benches/e2e/chroma_reconstruct.py``
showed on the CPU that the interpolated decode can be rebuilt from the replicated one (53.0 dB
against it at full size, where replicated is 44.4 dB): its ``rebuild`` is the reference these
kernels follow, pinned by ``tests/test_chroma_kernel.py``.

The arithmetic, per image of chroma factors ``(fh, fv)``:

1. Each block's chroma: the mean, over the block's own pixels (a partial block at an odd edge
   has fewer) that no channel clamps (0 or 255), of the JFIF chroma projection
   ``Cb' = -0.168736 R - 0.331264 G + 0.5 B``, ``Cr' = 0.5 R - 0.418688 G - 0.081312 B``. It does
   not depend on luma, so it is the block's chroma but for the decoder's rounding; clamped pixels
   lost part of theirs. A block whose pixels all clamp takes the mean over all of them.
2. For each pixel, that block chroma interpolated with libjpeg's triangle weights (3/4 of the
   nearer block, 1/4 of the farther, per subsampled axis; at the image's edges the edge block is
   its own neighbour), minus its own block's chroma, added back through the colour conversion's
   chroma columns: ``dR = 1.402 dCr``, ``dG = -0.344136 dCb - 0.714136 dCr``, ``dB = 1.772 dCb``;
   then rounded half up and clamped to 0..255.

In float32 (the reference is float64): results differ from it by at most one level, where a value
lies within float32's error of a half.

**In place, safely, in two launches on one stream.** Pass 1 (:func:`_blocks`) only reads the
images and writes each block's chroma into a scratch tensor; pass 2 (:func:`_correct`) reads, for
each pixel, only that pixel and the scratch, and writes only that pixel. Launches on one stream
run one after the other, so every read of pass 1 is done before any write of pass 2, and within
pass 2 no program reads a byte another writes: the result cannot depend on the order programs
run in. Images of factors (1, 1) are masked out of both passes: not a byte of them is read or
written. Neither are the bytes past ``3 * width`` of a row (the pitch's padding).

One launch per pass whatever the batch: the grids cover (image, row, chunk of columns) up to the
largest image, and each program masks by its own image's size.

What this costs on a GPU is not yet measured. Under ``TRITON_INTERPRET=1`` the kernels run on
the CPU, on CPU tensors: that is how CI, which has no GPU, tests them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton
import triton.language as tl

#: int64 values per table row: address (uint8 interleaved RGB), height, width, pitch (bytes a
#: row), then the chroma factors fh, fv (each 1 or 2).
TABLE_LEN = 6
#: Blocks per program of pass 1.
BLOCKS = 128
#: Pixels per program of pass 2.
PIXELS = 256
#: Warps per program, both passes.
WARPS = 4


@triton.jit
def _image(table, i, row_len: tl.constexpr):
    """Image ``i``'s table row: its pixels' address, height, width, pitch, chroma factors, and its
    count of block rows and block columns."""
    row = table + i * row_len
    base = tl.load(row).to(tl.pointer_type(tl.uint8))
    h = tl.load(row + 1)
    w = tl.load(row + 2)
    pitch = tl.load(row + 3)
    fh = tl.load(row + 4)
    fv = tl.load(row + 5)
    return base, h, w, pitch, fh, fv, (h + fv - 1) // fv, (w + fh - 1) // fh


@triton.jit
def _blocks(table, scratch, s_img, s_row, row_len: tl.constexpr, block: tl.constexpr):
    """Pass 1: the chroma (Cb', Cr') of ``block`` blocks of one block row of one image, into
    ``scratch[i, block row, block column, 0:2]`` (float32)."""
    i = tl.program_id(0)
    by = tl.program_id(1)
    base, h, w, pitch, fh, fv, bh, bw = _image(table, i, row_len)
    bx = tl.program_id(2) * block + tl.arange(0, block)
    # Scalar conditions through `where`: Triton's interpreter (3.9, NumPy 2.4) turns `vector & scalar`
    # of booleans into int64, which it then refuses as a mask.
    live = tl.where((by < bh) & (fh * fv > 1), bx < bw, False)

    s_cb = tl.zeros([block], dtype=tl.float32)
    s_cr = tl.zeros([block], dtype=tl.float32)
    n = tl.zeros([block], dtype=tl.float32)
    a_cb = tl.zeros([block], dtype=tl.float32)
    a_cr = tl.zeros([block], dtype=tl.float32)
    a_n = tl.zeros([block], dtype=tl.float32)
    for dy in tl.static_range(2):
        for dx in tl.static_range(2):
            y = by * fv + dy
            x = bx * fh + dx
            # Only the block's own pixels: a second row or column only where the factor is 2,
            # none past the image's edge (the reference's edge padding counts each own pixel
            # equally, so the mean is the same).
            m = tl.where((fv > dy) & (fh > dx) & (y < h), live & (x < w), False)
            p = base + y * pitch + x * 3
            r = tl.load(p, mask=m, other=0).to(tl.float32)
            g = tl.load(p + 1, mask=m, other=0).to(tl.float32)
            b = tl.load(p + 2, mask=m, other=0).to(tl.float32)
            cb = -0.168736 * r - 0.331264 * g + 0.5 * b
            cr = 0.5 * r - 0.418688 * g - 0.081312 * b
            lo = tl.minimum(tl.minimum(r, g), b)
            hi = tl.maximum(tl.maximum(r, g), b)
            ok = m & (lo > 0.0) & (hi < 255.0)
            s_cb += tl.where(ok, cb, 0.0)
            s_cr += tl.where(ok, cr, 0.0)
            n += tl.where(ok, 1.0, 0.0)
            a_cb += tl.where(m, cb, 0.0)
            a_cr += tl.where(m, cr, 0.0)
            a_n += tl.where(m, 1.0, 0.0)
    some = n > 0.0
    cnt = tl.where(some, n, tl.maximum(a_n, 1.0))
    q = scratch + i.to(tl.int64) * s_img + by * s_row + bx * 2
    tl.store(q, tl.where(some, s_cb, a_cb) / cnt, mask=live)
    tl.store(q + 1, tl.where(some, s_cr, a_cr) / cnt, mask=live)


@triton.jit
def _tri(near, far, on):
    """One axis of libjpeg's triangle filter: 3/4 of the nearer, 1/4 of the farther, where ``on``
    (the axis is subsampled), else the nearer as it is."""
    return tl.where(on, (3.0 * near + far) / 4.0, near)


@triton.jit
def _delta(own, hor, ver, diag, c, live, vert, horiz):
    """Chroma ``c`` (0: Cb', 1: Cr') interpolated at the pixels minus their own block's, from the
    scratch at their own block, the column neighbour, the row neighbour and the diagonal one;
    rows first, then columns, as the reference (and libjpeg) does."""
    c0 = tl.load(own + c, mask=live, other=0.0)
    r0 = _tri(c0, tl.load(ver + c, mask=live, other=0.0), vert)
    r1 = _tri(tl.load(hor + c, mask=live, other=0.0), tl.load(diag + c, mask=live, other=0.0), vert)
    return _tri(r0, r1, horiz) - c0


@triton.jit
def _correct(table, scratch, s_img, s_row, row_len: tl.constexpr, block: tl.constexpr):
    """Pass 2: ``block`` pixels of one row of one image, corrected in place from the scratch."""
    i = tl.program_id(0)
    y = tl.program_id(1)
    base, h, w, pitch, fh, fv, bh, bw = _image(table, i, row_len)
    x = tl.program_id(2) * block + tl.arange(0, block)
    live = tl.where((y < h) & (fh * fv > 1), x < w, False)

    # The block of the pixel and the neighbour block the triangle weighs by 1/4 on each
    # subsampled axis: the one above for the upper row of a block, below for the lower, left for
    # the left column, right for the right; at the edges the block itself.
    by = y // fv
    ny = tl.where(y % 2 == 0, by - 1, by + 1)
    ny = tl.minimum(tl.maximum(ny, 0), bh - 1)
    bx = x // fh
    nx = tl.where(x % 2 == 0, bx - 1, bx + 1)
    nx = tl.minimum(tl.maximum(nx, 0), bw - 1)
    s = scratch + i.to(tl.int64) * s_img
    own = s + by * s_row + bx * 2
    hor = s + by * s_row + nx * 2
    ver = s + ny * s_row + bx * 2
    diag = s + ny * s_row + nx * 2
    vert = fv == 2
    horiz = fh == 2
    d_cb = _delta(own, hor, ver, diag, 0, live, vert, horiz)
    d_cr = _delta(own, hor, ver, diag, 1, live, vert, horiz)

    p = base + y * pitch + x * 3
    r = tl.load(p, mask=live, other=0).to(tl.float32)
    g = tl.load(p + 1, mask=live, other=0).to(tl.float32)
    b = tl.load(p + 2, mask=live, other=0).to(tl.float32)
    r = tl.floor(r + 1.402 * d_cr + 0.5)
    g = tl.floor(g + (-0.344136 * d_cb - 0.714136 * d_cr) + 0.5)
    b = tl.floor(b + 1.772 * d_cb + 0.5)
    tl.store(p, tl.minimum(tl.maximum(r, 0.0), 255.0).to(tl.uint8), mask=live)
    tl.store(p + 1, tl.minimum(tl.maximum(g, 0.0), 255.0).to(tl.uint8), mask=live)
    tl.store(p + 2, tl.minimum(tl.maximum(b, 0.0), 255.0).to(tl.uint8), mask=live)


def extent(rows: Any) -> tuple[int, int, int, int]:
    """From the host copy of a table (``[k, TABLE_LEN]``, anything ``np.asarray`` takes): the
    largest height and width, and the largest count of block rows and block columns, over its
    subsampled images (zeros where none is). The grids and the scratch are sized by these."""
    a = np.asarray(rows, dtype=np.int64).reshape(-1, TABLE_LEN)
    h, w, fh, fv = a[:, 1], a[:, 2], a[:, 4], a[:, 5]
    bad = ~np.isin(fh, (1, 2)) | ~np.isin(fv, (1, 2))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"chroma factors must be 1 or 2: image {j} of the table has fh={fh[j]}, fv={fv[j]}")
    sub = fh * fv > 1
    if not sub.any():
        return 0, 0, 0, 0
    h, w, fh, fv = h[sub], w[sub], fh[sub], fv[sub]
    return int(h.max()), int(w.max()), int((-(-h // fv)).max()), int((-(-w // fh)).max())


def rebuild(table: Any, rows: Any, *, blocks: int = BLOCKS, pixels: int = PIXELS, warps: int = WARPS) -> None:
    """Rebuilds interpolated chroma in place in the images of ``table`` (int64 ``[k, TABLE_LEN]``
    on their device), on the current stream: two launches (none when no image is subsampled).

    ``rows``: the host copy the table was uploaded from (a NumPy array or nested lists), for the
    grids and the scratch's size, so that nothing waits on the device. The images must stay alive
    until the kernels have run (the caller keeps them). The scratch (float32, two values a block
    of the largest image, per image) comes from torch's caching allocator on the current stream,
    so its reuse after this returns is ordered behind the kernels. ``blocks``, ``pixels`` and
    ``warps``: the launch shapes."""
    import torch

    k = int(table.shape[0])
    host = np.asarray(rows, dtype=np.int64).reshape(-1, TABLE_LEN)
    if host.shape[0] != k:
        raise ValueError(f"the chroma table has {k} rows but its host copy (`rows`) has {host.shape[0]}")
    max_h, max_w, max_bh, max_bw = extent(host)
    if max_h == 0:
        return
    scratch = torch.empty((k, max_bh, max_bw, 2), dtype=torch.float32, device=table.device)
    s_img, s_row = scratch.stride(0), scratch.stride(1)
    grid1 = (k, max_bh, triton.cdiv(max_bw, blocks))
    _blocks[grid1](table, scratch, s_img, s_row, row_len=TABLE_LEN, block=blocks, num_warps=warps)
    # One program row per pixel row: a grid's second axis holds 65,535, a JPEG's largest height.
    grid2 = (k, max_h, triton.cdiv(max_w, pixels))
    _correct[grid2](table, scratch, s_img, s_row, row_len=TABLE_LEN, block=pixels, num_warps=warps)


def warm(device: Any) -> None:
    """Compiles both kernels on ``device`` by rebuilding one 3x3 4:2:0 image in a scratch tensor."""
    import torch

    img = torch.full((3, 3, 3), 128, dtype=torch.uint8, device=device)
    rows = [[img.data_ptr(), 3, 3, 9, 2, 2]]
    rebuild(torch.tensor(rows, dtype=torch.int64, device=device), rows)
    torch.cuda.synchronize(device)
