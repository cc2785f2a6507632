"""The per-image steps after a view's geometry, on the device: colour, tone, blur, sharpness,
flips, quarter turns and the policies' warps, applied to a hybrid batch's GPU samples as the
server drew them (control.md, "Per-image ops on the GPU (1.8)").

The server stays the one source of randomness and of what each op means: it draws every
sample's parameters and lowers its ops to concrete steps (``crates/ops/src/steps.rs``: brightness
1.286, then hue -0.05, then a warp by this matrix), which the ring's ``gpu_ops`` field carries as
16-int32 records (ring.md, "``gpu_ops``"). This module only reads the records and runs them.

**Batched, few launches.** Sample ``i``'s ``k``-th step runs after its ``(k-1)``-th. Steps are
processed in order; within a step the samples are grouped by what they run (the kind, plus what
fixes the kernel's shape: a blur's kernel sizes, a warp's sampling), and each group is one
gather of its rows, one batched op over them with their parameters in a device table, one
scatter back. The grouping reads the records on the host (they are in the ring, which is pinned
host memory) with a few numpy calls per step, never per sample; the tables go up in two copies
per batch (one ``int64`` and one ``float64`` buffer, sliced into views). Nothing depends on the
batch size but the tables' lengths, so the launches per batch are bounded by the pipeline (its
steps times the kinds a step can draw), never by the batch; the host never waits on the device.

**Layout.** :func:`apply` works on the batch tensor :class:`ringfeed.gpu.hybrid.Finisher`
writes: uint8 ``[N, H, W, 3]`` (``"NHWC"``) or ``[N, 3, H, W]`` (``"NCHW"``), in place, rows
given by the table (a batch's GPU samples are some of its rows).

**Arithmetic.** Each kernel is the server's (``crates/ops/src/color.rs``, ``tone.rs``,
``blur.rs``, ``affine.rs``), operation for operation in ``f32`` with the same rounding, as
separate tensor ops (no fused multiply-add), from the ``f32`` parameters the record carries: the
tone ops are exact integer maps; the colour ops, sharpness and the warps reproduce the server's
``f32`` sequence; the blur's two 1-D passes are depthwise convolutions, which sum in another order
(and in TF32 where cuDNN is allowed it), so a sum can round the other way at .5 (the tests hold
it to PSNR >= 40 dB against the server, as the server is held against torchvision).

**Which pipelines.** :func:`pipeline_problem` is the server's rule (``ops::gpu::finishable``),
whose verdicts ``proto/vectors/control/hybrid.json`` pins for both sides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The record kinds (ring.md, the ``gpu_ops`` table), by code; ``proto/vectors/ring/gpu_ops.json``
#: pins them. Code 0 ends a sample's steps.
KIND_CODES = {
    1: "remap",
    2: "blend",
    3: "hue",
    4: "grayscale",
    5: "solarize",
    6: "posterize",
    7: "invert",
    8: "autocontrast",
    9: "equalize",
    10: "sharpness",
    11: "blur",
    12: "affine",
}
#: int32 values per record: ``[kind, arg, p0, ..., p13]``.
RECORD_INTS = 16
#: The most steps a sample of a view may draw (the field's ``S``).
MAX_STEPS = 64

#: Ops of a view's op list that the geometric prefix (the decode and the finishing kernel) does
#: when they lead it: the client's one list of them.
GEOMETRIC = frozenset(
    ("random_resized_crop", "resize", "center_crop", "random_crop", "horizontal_flip", "vertical_flip")
)
#: The geometric prefix resizes at most once.
RESIZES = frozenset(("random_resized_crop", "resize"))
#: Ops that keep the image's size and lower to steps (``steps::lowers``); containers do when
#: every op inside them does.
_LOWERS = frozenset(
    (
        "horizontal_flip",
        "vertical_flip",
        "color_jitter",
        "grayscale",
        "gaussian_blur",
        "solarize",
        "posterize",
        "autocontrast",
        "equalize",
        "invert",
        "adjust_sharpness",
        "trivial_augment_wide",
        "rand_augment",
        "auto_augment",
    )
)
_CONTAINERS = frozenset(("random_apply", "random_choice"))
#: Ops of a pipeline's JSON that run on the batch, not per image.
BATCH_OPS = frozenset(("normalize", "random_erasing"))


def prefix_len(ops: Sequence[dict[str, Any]]) -> int:
    """How many leading ops the geometric prefix covers (``gpu::prefix_len``): the leading
    geometric ops, up to a second resize."""
    resized = False
    for k, op in enumerate(ops):
        name = op["op"]
        if name not in GEOMETRIC:
            return k
        if name in RESIZES:
            if resized:
                return k
            resized = True
    return len(ops)


def lowers(op: dict[str, Any]) -> bool:
    """Whether ``op`` keeps the image's size and lowers to steps (``steps::lowers``)."""
    name = op["op"]
    if name in _CONTAINERS:
        return all(lowers(o) for o in op["ops"])
    return name in _LOWERS


def max_steps(op: dict[str, Any]) -> int:
    """The most steps ``op`` can lower to (``steps::max_steps``)."""
    name = op["op"]
    if name == "random_apply":
        return sum(max_steps(o) for o in op["ops"])
    if name == "random_choice":
        return max((max_steps(o) for o in op["ops"]), default=0)
    if name == "color_jitter":
        return sum(op.get(k) is not None for k in ("brightness", "contrast", "saturation", "hue"))
    if name == "rand_augment":
        return int(op.get("num_ops", 2))
    if name == "auto_augment":
        return 2
    return 1 if lowers(op) else 0


def pipeline_problem(doc: dict[str, Any], per_image: bool = True, views: bool = True) -> str | None:
    """Why hybrid decode cannot finish the pipeline ``doc`` (as the wire carries it, control.md
    ``open.pipeline``), or ``None``: the server's rule, with the per-image tail of a 1.8 session
    when ``per_image``, and several views and images per view (a 1.10 session) when ``views``.
    The reason names the first op of any view that has no GPU kernel."""
    docs = doc["views"]
    if not views:
        if len(docs) != 1:
            return f"the pipeline has {len(docs)} views; GPU decode finishes one before protocol 1.10"
        count = docs[0].get("count", 1)
        if count != 1:
            return f"the view makes {count} images per sample; GPU decode finishes one before protocol 1.10"
    for view in docs:
        why = _view_problem(_own_ops(view), per_image)
        if why is not None:
            return why if len(docs) == 1 else f"view {view.get('name', 'image')!r}: {why}"
    return None


def _own_ops(view: dict[str, Any]) -> list[dict[str, Any]]:
    """A view's per-image ops as the server plans them: without the batch ops, and without
    ``aspect_buckets`` (1.10: its covering resize and crop are planned per bucket, ahead of them)."""
    return [op for op in view["ops"] if op["op"] not in BATCH_OPS and op["op"] != "aspect_buckets"]


def _view_problem(ops: list[dict[str, Any]], per_image: bool) -> str | None:
    p = prefix_len(ops)
    if p == len(ops):
        return None
    first = ops[p]["op"]
    if first in RESIZES:
        return "the pipeline resizes twice; GPU decode finishes one resize"
    if not per_image:
        return (
            f"{first} is not geometric (GPU decode finishes crops, flips and one resize; the other ops run on the CPU)"
        )
    for op in ops[p:]:
        if not lowers(op):
            return (
                f"{_first_sized(op)} changes the image's size after a per-image op "
                "(GPU decode runs sized ops only in the leading crops, flips and resize)"
            )
    most = sum(max_steps(op) for op in ops)
    if most > MAX_STEPS:
        return f"the view can draw {most} per-image steps per sample; GPU decode finishes at most {MAX_STEPS}"
    return None


def _first_sized(op: dict[str, Any]) -> str:
    if op["op"] in _CONTAINERS:
        return next(_first_sized(o) for o in op["ops"] if not lowers(o))
    return str(op["op"])


def needs_steps(doc: dict[str, Any]) -> bool:
    """Whether some view has per-image ops after its geometry (a ``gpu_ops`` field; 1.8)."""
    return steps_per_output(doc) > 0


def steps_per_output(doc: dict[str, Any]) -> int:
    """The ``gpu_ops`` field's steps per output (``gpu::finishable``'s answer): the most any view
    can draw, 0 when no view has a tail (no field)."""
    most = 0
    for view in doc["views"]:
        ops = _own_ops(view)
        if prefix_len(ops) < len(ops):
            most = max(most, max(1, sum(max_steps(o) for o in ops)))
    return most


def multi_output(doc: dict[str, Any]) -> bool:
    """Whether a sample of the pipeline has several outputs (views, or images per view): 1.10's
    ``gpu_job`` ``[outputs, 18]``."""
    return sum(v.get("count", 1) for v in doc["views"]) > 1


# -- the table --------------------------------------------------------------------------------


@dataclass
class Group:
    """The samples of one step that run one kind: their batch rows and parameters on the device."""

    kind: str
    static: tuple[Any, ...]
    rows: Any
    params: Any
    count: int


_F32 = np.float32
# torchvision's luma weights and the other constants, as the f32 values the server uses (Python
# floats that are exactly those f32s, so that a tensor op gets them whatever it rounds to).
_LR, _LG, _LB = (float(_F32(c)) for c in (0.2989, 0.587, 0.114))
_UNIT = float(_F32(1.0) / _F32(255.0))
_SIXTH = float(_F32(1.0) / _F32(6.0))
_TO8 = float(_F32(256.0) - _F32(1e-3))
_S1, _S5 = float(_F32(1.0) / _F32(13.0)), float(_F32(5.0) / _F32(13.0))


def gaussian_kernels(k: int, sigma: np.ndarray) -> np.ndarray:
    """torchvision's ``_get_gaussian_kernel1d`` of size ``k`` for each of ``sigma`` (``[n]``
    float32), in ``f32`` as ``blur.rs``'s ``kernel1d``: ``[n, k]``."""
    lim = _F32((k - 1.0) / (2.0 * math.sqrt(2.0)))
    step = (_F32(2.0) * lim) / _F32(k - 1.0) if k > 1 else _F32(0.0)
    half = k // 2
    xs = np.array(
        [(-lim + step * _F32(i)) if i < half else (lim - step * _F32(k - 1 - i)) for i in range(k)], dtype=_F32
    )
    v = xs[None, :] / sigma.astype(_F32)[:, None]
    v = -(v * v)
    e = np.exp(v - v.max(axis=1, keepdims=True)).astype(_F32)
    # The sum in order, in f32, as the server adds.
    total = np.cumsum(e, axis=1, dtype=_F32)[:, -1:]
    return (e / total).astype(_F32)


def _params(kind: str, arg: np.ndarray, p: np.ndarray) -> dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]]:
    """One step's group of ``kind`` (its records' ``arg`` ``[m]`` and f32 parameters ``[m, 14]``),
    split by what fixes the kernel's shape: ``{static: (which of the m, kernel params [.., w])}``."""
    every = np.arange(len(arg))
    if kind == "blend":
        return {(): (every, np.concatenate([p[:, :2], arg[:, None].astype(_F32)], axis=1))}
    if kind == "remap":
        return {(): (every, p[:, :6])}
    if kind in ("hue", "solarize", "posterize", "sharpness"):
        return {(): (every, p[:, :1])}
    if kind == "blur":
        out = {}
        for a in np.unique(arg):
            sel = np.nonzero(arg == a)[0]
            kx, ky = int(a) & 0xFFFF, int(a) >> 16
            out[(kx, ky)] = (sel, np.concatenate([gaussian_kernels(kx, p[sel, 0]), gaussian_kernels(ky, p[sel, 1])], 1))
        return out
    if kind == "affine":
        out = {}
        for a in np.unique(arg):
            sel = np.nonzero(arg == a)[0]
            q = p[sel]
            # The nearest path's fill, rounded half to even (numpy's round is).
            out[("bilinear" if a == 1 else "nearest",)] = (sel, np.concatenate([q[:, :10], np.round(q[:, 7:10])], 1))
        return out
    return {(): (every, np.zeros((len(arg), 1), dtype=_F32))}


@dataclass
class OpTable:
    """A batch's per-image steps: for each step, its groups (:class:`Group`), in kind order.
    Built on the host from the ring's ``gpu_ops`` records; :func:`apply` runs it."""

    size: tuple[int, int]
    steps: list[list[Group]] = field(default_factory=list)

    @classmethod
    def from_records(
        cls,
        records: np.ndarray,
        size: tuple[int, int],
        *,
        rows: Sequence[int] | np.ndarray | None = None,
        device: Any = "cpu",
    ) -> OpTable:
        """The table of samples whose ``gpu_ops`` records are ``records`` (int32 ``[n, S, 16]``),
        in batch rows ``rows`` (default ``0 .. n``), for images of ``size`` ``(height, width)``.

        Raises:
            ValueError: a record of an unknown kind (a newer server's), naming it.
        """
        import torch

        recs = np.ascontiguousarray(records, dtype=np.int32)
        if recs.ndim != 3 or recs.shape[2] != RECORD_INTS:
            raise ValueError(f"gpu_ops records must be [n, S, {RECORD_INTS}] int32, got {recs.shape}")
        n = recs.shape[0]
        rows_np = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        flts = recs[:, :, 2:].view(_F32)
        plan: list[list[tuple[str, tuple[Any, ...], np.ndarray, np.ndarray]]] = []
        for k in range(recs.shape[1]):
            kinds = recs[:, k, 0]
            if not kinds.any():
                break
            step = []
            for code in np.unique(kinds):
                if code == 0:
                    continue
                kind = KIND_CODES.get(int(code))
                if kind is None:
                    raise ValueError(f"gpu_ops: step {k} has kind {int(code)}, which this client does not know")
                sel = np.nonzero(kinds == code)[0]
                for static, (which, params) in _params(kind, recs[sel, k, 1], flts[sel, k]).items():
                    step.append((kind, static, rows_np[sel[which]], params.astype(np.float64)))
            plan.append(step)
        # Two uploads for the whole batch: every group's rows, every group's parameters.
        groups = [g for step in plan for g in step]
        ints = np.concatenate([g[2] for g in groups]) if groups else np.zeros(0, np.int64)
        flat = np.concatenate([g[3].ravel() for g in groups]) if groups else np.zeros(0, np.float64)
        dev = torch.device(device)

        def up(a: np.ndarray) -> Any:
            t = torch.from_numpy(np.ascontiguousarray(a))
            return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t.to(dev)

        ints_d, flts_d = up(ints), up(flat)
        table = cls(size)
        ri = fi = 0
        for step in plan:
            out = []
            for kind, static, _, params in step:
                m, width = params.shape
                out.append(Group(kind, static, ints_d[ri : ri + m], flts_d[fi : fi + m * width].view(m, width), m))
                ri, fi = ri + m, fi + m * width
            table.steps.append(out)
        return table

    def kinds(self) -> set[str]:
        """The kinds the table runs."""
        return {g.kind for step in self.steps for g in step}

    def groups(self) -> int:
        """How many groups (each a gather, a kernel, a scatter) the table runs."""
        return sum(len(s) for s in self.steps)


def apply(images: Any, table: OpTable, layout: str = "NHWC") -> Any:
    """Runs ``table`` on ``images`` (uint8 ``[N, H, W, 3]`` for ``"NHWC"``, ``[N, 3, H, W]`` for
    ``"NCHW"``) in place, on the tensor's device and current stream; returns ``images``."""
    x = images if layout == "NHWC" else images.permute(0, 2, 3, 1)
    if tuple(x.shape[1:3]) != tuple(table.size) or x.shape[3] != 3:
        raise ValueError(
            f"the table is for {table.size[0]}x{table.size[1]} RGB images, the batch is {tuple(images.shape)}"
        )
    for step in table.steps:
        for g in step:
            sub = x.index_select(0, g.rows)
            x.index_copy_(0, g.rows, _KERNELS[g.kind](sub, g.params, *g.static))
    return images


# -- the kernels: [n, H, W, 3] uint8 in, the same out ------------------------------------------


def _col(p: Any, j: int) -> Any:
    """Parameter column ``j`` as f32 ``[n, 1, 1, 1]``."""
    return p[:, j].float().view(-1, 1, 1, 1)


def _u8(v: Any) -> Any:
    import torch

    return v.clamp_(0.0, 255.0).to(torch.uint8)


def _luma(x: Any) -> Any:
    return x[..., 0] * _LR + x[..., 1] * _LG + x[..., 2] * _LB


def _k_blend(g: Any, p: Any) -> Any:
    import torch

    x = g.float()
    npx = max(g.shape[1] * g.shape[2], 1)
    grey = _luma(x).floor_()
    # Integers summed in f64: exact in any order, so the mean is the server's.
    mean = (grey.double().sum((1, 2)) / npx).float().view(-1, 1, 1)
    mode = p[:, 2].view(-1, 1, 1)
    other = torch.where(mode == 2.0, grey, torch.where(mode == 1.0, mean, 0.0))
    return _u8(x * _col(p, 0) + (other * p[:, 1].float().view(-1, 1, 1)).unsqueeze_(-1))


def _k_grayscale(g: Any, p: Any) -> Any:
    import torch

    return _luma(g.float()).to(torch.uint8).unsqueeze_(-1).expand(-1, -1, -1, 3)


def _k_hue(g: Any, p: Any) -> Any:
    import torch

    x = g.float() * _UNIT
    r, gg, b = x[..., 0], x[..., 1], x[..., 2]
    maxc = x.amax(-1)
    minc = x.amin(-1)
    eqc = maxc == minc
    rng = maxc - minc
    s = rng / torch.where(eqc, 1.0, maxc)
    div = torch.where(eqc, 1.0, rng)
    rc, gc, bc = (maxc - r) / div, (maxc - gg) / div, (maxc - b) / div
    zero = torch.zeros_like(rc)
    hr = torch.where(maxc == r, bc - gc, zero)
    hg = torch.where((maxc == gg) & (maxc != r), 2.0 + rc - bc, zero)
    hb = torch.where((maxc != gg) & (maxc != r), 4.0 + gc - rc, zero)
    h = torch.fmod((hr + hg + hb) * _SIXTH + 1.0, 1.0)
    h = torch.fmod(h + _col(p, 0).view(-1, 1, 1), 1.0)
    h = torch.where(h < 0, h + 1.0, h)
    h6 = h * 6.0
    i = h6.floor()
    fr = h6 - i
    i = torch.remainder(i.to(torch.int32), 6)
    sxf = s * fr
    q = ((1.0 - sxf) * maxc).clamp_(0.0, 1.0)
    t = ((sxf + (1.0 - s)) * maxc).clamp_(0.0, 1.0)
    pp = ((1.0 - s) * maxc).clamp_(0.0, 1.0)
    v = maxc
    # The six sectors' (r, g, b), picked per pixel.
    table = torch.stack(
        [
            torch.stack([v, t, pp], -1),
            torch.stack([q, v, pp], -1),
            torch.stack([pp, v, t], -1),
            torch.stack([pp, q, v], -1),
            torch.stack([t, pp, v], -1),
            torch.stack([v, pp, q], -1),
        ],
        -2,
    )
    out = table.gather(-2, i.long()[..., None, None].expand(-1, -1, -1, 1, 3)).squeeze(-2)
    return (out * _TO8).to(torch.uint8)


def _k_solarize(g: Any, p: Any) -> Any:
    import torch

    return torch.where(g.float() >= _col(p, 0), 255 - g, g)


def _k_posterize(g: Any, p: Any) -> Any:
    import torch

    return g & p[:, 0].to(torch.uint8).view(-1, 1, 1, 1)


def _k_invert(g: Any, p: Any) -> Any:
    return 255 - g


def _k_autocontrast(g: Any, p: Any) -> Any:
    import torch

    lo = g.amin((1, 2)).float()
    hi = g.amax((1, 2)).float()
    flat = hi == lo
    lo = torch.where(flat, 0.0, lo)[:, None, None, :]
    inv = torch.where(flat, 1.0, (hi - lo.view(hi.shape)) * _UNIT)[:, None, None, :]
    return _u8((g.float() - lo) / inv)


def _k_equalize(g: Any, p: Any) -> Any:
    import torch

    n, h, w, _ = g.shape
    npx = h * w
    v = g.reshape(n, npx, 3).permute(0, 2, 1).long()  # [n, 3, HW]
    base = (torch.arange(n * 3, device=g.device) * 256).view(n, 3, 1)
    idx = (v + base).reshape(-1)
    hist = torch.zeros(n * 3 * 256, dtype=torch.int64, device=g.device)
    hist.scatter_add_(0, idx, torch.ones(1, dtype=torch.int64, device=g.device).expand(idx.numel()))
    hist = hist.view(n, 3, 256)
    levels = torch.arange(256, device=g.device)
    last = torch.where(hist > 0, levels, 0).amax(-1, keepdim=True)
    step = (npx - hist.gather(-1, last)) // 255  # [n, 3, 1]
    cdf = hist.cumsum(-1) - hist  # cdf[k] = sum of hist[0..k-1]
    safe = torch.where(step == 0, 1, step)
    lut = ((cdf + safe // 2) // safe).clamp_(max=255)
    lut[..., 0] = 0
    lut = torch.where(step == 0, levels, lut)
    out = lut.gather(-1, v).to(torch.uint8)
    return out.permute(0, 2, 1).reshape(n, h, w, 3)


def _k_sharpness(g: Any, p: Any) -> Any:
    import torch

    _, h, w, _ = g.shape
    if h <= 2 or w <= 2:
        return g
    x = g.float()

    def at(dy: int, dx: int) -> Any:
        return x[:, dy : h - 2 + dy, dx : w - 2 + dx]

    s = at(0, 0) * _S1
    for dy, dx in ((0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)):
        s = s + at(dy, dx) * (_S5 if (dy, dx) == (1, 1) else _S1)
    v = at(1, 1)
    inner = _u8(v + _col(p, 0) * (torch.round(s) - v))
    out = g.clone()
    out[:, 1 : h - 1, 1 : w - 1] = inner
    return out


def _reflect(n: int, r: int, device: Any) -> Any:
    """Source index of padded position ``j`` (``-r .. n + r``), PyTorch's reflect (``blur.rs``)."""
    import torch

    i = torch.arange(-r, n + r, device=device)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    i = torch.remainder(i, period)
    return torch.where(i >= n, period - i, i)


def _k_blur(g: Any, p: Any, kx: int, ky: int) -> Any:
    import torch
    import torch.nn.functional as fn

    n, h, w, _ = g.shape
    # [1, n*3, H, W]: one channel per image and colour, each image's kernel in its 3 channels.
    x = g.permute(0, 3, 1, 2).float().reshape(1, n * 3, h, w)
    wx = p[:, :kx].float().repeat_interleave(3, 0).view(n * 3, 1, 1, kx)
    wy = p[:, kx : kx + ky].float().repeat_interleave(3, 0).view(n * 3, 1, ky, 1)
    x = x.index_select(3, _reflect(w, kx // 2, g.device))
    x = fn.conv2d(x, wx, groups=n * 3)
    x = x.index_select(2, _reflect(h, ky // 2, g.device))
    x = fn.conv2d(x, wy, groups=n * 3)
    return _u8(torch.round(x)).view(n, 3, h, w).permute(0, 2, 3, 1)


def _gather(g: Any, ix: Any, iy: Any) -> tuple[Any, Any]:
    """Pixels ``(ix, iy)`` (``[n, H, W]`` each) of each image, as f32 ``[n, H, W, 3]``, 0 outside;
    and where they are inside."""
    n, h, w, _ = g.shape
    inside = (ix >= 0) & (iy >= 0) & (ix < w) & (iy < h)
    at = (iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)).view(n, h * w, 1).expand(-1, -1, 3)
    v = g.reshape(n, h * w, 3).gather(1, at).view(n, h, w, 3).float()
    return v * inside.unsqueeze(-1), inside


def _k_remap(g: Any, p: Any) -> Any:
    import torch

    n, h, w, _ = g.shape
    c = p.long()
    xs = torch.arange(w, device=g.device).view(1, 1, w)
    ys = torch.arange(h, device=g.device).view(1, h, 1)

    def col(j: int) -> Any:
        return c[:, j].view(-1, 1, 1)

    sx = col(0) * xs + col(1) * ys + col(2)
    sy = col(3) * xs + col(4) * ys + col(5)
    at = (sy * w + sx).view(n, h * w, 1).expand(-1, -1, 3)
    return g.reshape(n, h * w, 3).gather(1, at).view(n, h, w, 3)


def _k_affine(g: Any, p: Any, interp: str) -> Any:
    import torch

    _, h, w, _ = g.shape
    dev = g.device
    wf, hf = float(w), float(h)
    # Output pixel centres, as `affine.rs` (and `_affine_grid`) make them, in f32.
    xg = (torch.arange(w, device=dev, dtype=torch.float32) + float(_F32((1.0 - wf) * 0.5))).double().view(1, 1, w)
    yg = (torch.arange(h, device=dev, dtype=torch.float32) + float(_F32((1.0 - hf) * 0.5))).double().view(1, h, 1)

    def r(j: int) -> Any:
        return p[:, j].view(-1, 1, 1)

    # x·r0 + y·r1 + r2 exactly (products of two f32 are exact in f64), rounded to f32 once.
    gx = (xg * r(0) + yg * r(1) + r(2)).float()
    gy = (xg * r(3) + yg * r(4) + r(5)).float()
    sx = ((gx + 1.0) * wf - 1.0) / 2.0
    sy = ((gy + 1.0) * hf - 1.0) / 2.0
    has_fill = p[:, 6].view(-1, 1, 1, 1) != 0
    if interp == "nearest":
        v, inside = _gather(g, torch.round(sx).long(), torch.round(sy).long())
        fill = p[:, 10:13].float().view(-1, 1, 1, 3)
        return torch.where(inside.unsqueeze(-1), v, fill).to(torch.uint8)
    fx, fy = sx.floor(), sy.floor()
    ix, iy = fx.long(), fy.long()
    tx, ty = sx - fx, sy - fy
    wts = [(1.0 - tx) * (1.0 - ty), tx * (1.0 - ty), (1.0 - tx) * ty, tx * ty]
    pts = [(ix, iy), (ix + 1, iy), (ix, iy + 1), (ix + 1, iy + 1)]
    val = mask = None
    for (a, b), wt in zip(pts, wts, strict=True):
        s, inside = _gather(g, a, b)
        term, m = s * wt.unsqueeze(-1), torch.where(inside, wt, 0.0)
        val, mask = (term, m) if val is None else (val + term, mask + m)
    f = p[:, 7:10].float().view(-1, 1, 1, 3)
    val = torch.where(has_fill, (val - f) * mask.unsqueeze(-1) + f, val)
    return _u8(torch.round(val))


_KERNELS = {
    "remap": _k_remap,
    "blend": _k_blend,
    "hue": _k_hue,
    "grayscale": _k_grayscale,
    "solarize": _k_solarize,
    "posterize": _k_posterize,
    "invert": _k_invert,
    "autocontrast": _k_autocontrast,
    "equalize": _k_equalize,
    "sharpness": _k_sharpness,
    "blur": _k_blur,
    "affine": _k_affine,
}
