"""The per-image ops after a view's geometric prefix, on the device: colour, tone, blur, sharpness,
flips and the policies' affine warps, applied to a hybrid batch's GPU samples with the parameters
the server drew (issue 27, item 1).

The server stays the one source of randomness: it draws every sample's parameters (its trace,
the JSON ``ringfeed ops`` prints per sample) and this module only applies them.
:meth:`OpTable.from_traces` walks each sample's trace along the view's op list (the op list gives
what the trace leaves out: a solarize threshold, a blur's kernel size, a policy's interpolation and
fill) and turns it into a list of concrete steps per sample: brightness 1.286, then hue -0.05, then
a warp by this matrix. Policies (TrivialAugmentWide, RandAugment, AutoAugment) are just the
sub-ops they drew, ``ColorJitter`` its factors in its drawn order, ``RandomApply`` and
``RandomChoice`` what they picked.

**Batched, few launches.** Sample ``i``'s ``k``-th step runs after its ``(k-1)``-th. Steps are
processed in order; within a step the samples are grouped by what they run (op kind, plus what
the op list fixes: a blur's kernel size, a warp's interpolation), and each group is one gather
of its rows, one batched op over them with their parameters in a device table, one scatter
back. Nothing depends on the batch size but the tables' lengths, so the launches per batch are
bounded by the pipeline (its steps times the kinds a step can draw), never by the batch; the
host never waits on the device (no ``.item()``, no data-dependent shapes). The tables are
uploaded once per batch, in two copies (one ``int64`` and one ``float64`` buffer, sliced into
views).

**Layout.** :func:`apply` works on the batch tensor :class:`ringfeed.gpu.hybrid.Finisher`
writes: uint8 ``[N, H, W, 3]`` (``"NHWC"``) or ``[N, 3, H, W]`` (``"NCHW"``), in place, rows
given by the table (a batch's GPU samples are some of its rows).

**Arithmetic.** Each kernel is the server's (``crates/ops/src/color.rs``, ``tone.rs``,
``blur.rs``, ``affine.rs``), operation for operation in ``f32`` with the same rounding, as
separate tensor ops (no fused multiply-add): the tone ops are exact integer maps; the colour
ops, sharpness and the warps reproduce the server's ``f32`` sequence; the blur's two 1-D passes
are depthwise convolutions, which sum in another order (and in TF32 where cuDNN is allowed it),
so a sum can round the other way at .5 (the tests hold it to PSNR >= 40 dB against the server,
as the server is held against torchvision).

**Not covered.** A crop or resize after a non-geometric op (it changes the image's size inside
the tail); :func:`without_kernel` names the first such op of a view, for ``gpu_decode_reason``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Op kinds with a kernel, in the order a step's groups run (any order gives the same result:
#: each group touches only its own rows).
KINDS = (
    "remap",
    "blend",
    "hue",
    "grayscale",
    "solarize",
    "posterize",
    "invert",
    "autocontrast",
    "equalize",
    "sharpness",
    "blur",
    "affine",
)

#: Ops of a view's op list that the geometric prefix (the decode and the finishing kernel) does
#: when they lead it, and that have no kernel here after it (they change the image's size): the
#: client's one list of them (``_images`` checks hybrid pipelines against it too).
GEOMETRIC = frozenset(
    ("random_resized_crop", "resize", "center_crop", "random_crop", "horizontal_flip", "vertical_flip")
)
#: The geometric prefix resizes at most once.
RESIZES = frozenset(("random_resized_crop", "resize"))
#: Ops with a kernel: every per-image op but the sized geometric ones (each draw they make is in the
#: trace; the rest comes from the op list).
_COLOUR = ("color_jitter", "grayscale", "adjust_sharpness", "gaussian_blur")
_TONE = ("solarize", "posterize", "autocontrast", "equalize", "invert")
_POLICIES = ("trivial_augment_wide", "rand_augment", "auto_augment")
_CONTAINERS = ("random_apply", "random_choice")
SUPPORTED = frozenset(("horizontal_flip", "vertical_flip", *_COLOUR, *_TONE, *_POLICIES, *_CONTAINERS))

_F32 = np.float32
# torchvision's luma weights and the other constants, as the f32 values the server uses (Python
# floats that are exactly those f32s, so that a tensor op gets them whatever it rounds to).
_LR, _LG, _LB = (float(_F32(c)) for c in (0.2989, 0.587, 0.114))
_UNIT = float(_F32(1.0) / _F32(255.0))
_SIXTH = float(_F32(1.0) / _F32(6.0))
_TO8 = float(_F32(256.0) - _F32(1e-3))
_S1, _S5 = float(_F32(1.0) / _F32(13.0)), float(_F32(5.0) / _F32(13.0))


class NoKernelError(ValueError):
    """An op of the pipeline has no GPU kernel: the samples that run it must stay on the host."""


class TraceMismatchError(ValueError):
    """A sample's trace does not follow the view's op list."""


def fused_prefix(ops: Sequence[dict[str, Any]]) -> int:
    """How many leading ops of a view's op list (``views[i].ops`` of the pipeline's JSON) the
    geometric prefix does (decode, crop, resize, flips; ``crates/ops/src/plan.rs``): the leading
    geometric ops, up to a second resize; the rest are this module's. The server's plan can stop earlier for some
    draws (a resize of a padded window); their samples then meet a sized op in the tail, which
    :meth:`OpTable.from_traces` refuses with :class:`NoKernelError`."""
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


def without_kernel(ops: Sequence[dict[str, Any]]) -> str | None:
    """The name of the first op of a view (its whole op list, the prefix included) that runs per
    image and has no GPU kernel, or ``None`` when every op after the prefix has one. For
    ``gpu_decode_reason``: ``"<name> has no GPU kernel"``."""

    def first(tail: Sequence[dict[str, Any]]) -> str | None:
        for op in tail:
            name = op["op"]
            if name not in SUPPORTED:
                return name
            if name in _CONTAINERS:
                inner = first(op["ops"])
                if inner is not None:
                    return inner
        return None

    return first(list(ops)[fused_prefix(ops) :])


def split_trace(ops: Sequence[dict[str, Any]], trace: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of a sample's trace (as ``ringfeed ops`` prints it) that belong to the ops after
    the geometric prefix: each prefix op records exactly one entry."""
    n = fused_prefix(ops)
    head = [e["op"] for e in trace[:n]]
    want = [o["op"] for o in ops[:n]]
    if head != want:
        raise TraceMismatchError(f"the trace opens with {head}, the view's prefix is {want}")
    return list(trace[n:])


# -- the steps of one sample ------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One concrete op on one image: its kind, what the op list fixes (the group key's rest) and
    its per-image parameters (float64 values; ``f32`` ones exactly)."""

    kind: str
    static: tuple[Any, ...]
    params: tuple[float, ...]


def _nums(v: Any) -> list[float]:
    return [float(x) for x in v] if isinstance(v, (list, tuple)) else [float(v)]


def _f32(v: float) -> float:
    return float(_F32(v))


#: ``blend`` modes: what the image is blended with.
_BLEND = {"brightness": 0.0, "contrast": 1.0, "saturation": 2.0}


def _blend(kind: str, f: float) -> Step:
    """Brightness, contrast or saturation, one kind: ``_blend(x, other, f)`` with ``other`` 0, the
    mean grey or the pixel's grey. The server casts ``f`` and ``1 - f`` (computed in f64) to f32;
    brightness is ``x·f``, and ``x·f + 0·0`` is the same f32."""
    return Step("blend", (), (_f32(f), 0.0 if kind == "brightness" else _f32(1.0 - f), _BLEND[kind]))


def _kernel1d(k: int, sigma: float) -> list[float]:
    """torchvision's ``_get_gaussian_kernel1d`` in f32, as ``blur.rs``'s ``kernel1d``."""
    lim = _F32((k - 1.0) / (2.0 * math.sqrt(2.0)))
    s = _F32(sigma)
    step = (_F32(2.0) * lim) / _F32(k - 1.0) if k > 1 else _F32(0.0)
    half = k // 2
    xs = [(-lim + step * _F32(i)) if i < half else (lim - step * _F32(k - 1 - i)) for i in range(k)]
    v = np.array([-((x / s) * (x / s)) for x in xs], dtype=np.float32)
    e = np.exp(v - v.max()).astype(np.float32)
    total = _F32(0.0)
    for t in e:
        total = _F32(total + t)
    return [float(t / total) for t in e]


def _inverse_matrix(
    center: tuple[float, float], angle: float, translate: tuple[float, float], shear: tuple[float, float]
) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` (scale 1), in f64, as ``affine.rs``."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    (cx, cy), (tx, ty) = center, translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


def _affine(m: list[float], size: tuple[int, int], interp: str, fill: list[float] | None) -> Step:
    """A warp by the inverse matrix ``m``: its grid's coefficients in f32 as ``affine.rs`` rescales
    them, and the fill (the nearest path's fill rounded half to even; 0 and no mask without one)."""
    h, w = size
    mf = [_F32(v) for v in m]
    hw, hh = _F32(0.5) * _F32(w), _F32(0.5) * _F32(h)
    r = [mf[0] / hw, mf[1] / hw, mf[2] / hw, mf[3] / hh, mf[4] / hh, mf[5] / hh]
    f = [0.0, 0.0, 0.0] if fill is None else [float(_F32(v)) for v in fill]
    near = [float(np.round(_F32(v))) for v in f]
    return Step("affine", (interp,), (*(float(v) for v in r), float(fill is not None), *f, *near))


def _remap(code: str, size: tuple[int, int]) -> Step:
    """A pixel permutation: ``sx = ax·x + bx·y + cx``, ``sy = ay·x + by·y + cy``."""
    h, w = size
    coef = {
        "hflip": (-1, 0, w - 1, 0, 1, 0),
        "vflip": (1, 0, 0, 0, -1, h - 1),
        "rot180": (-1, 0, w - 1, 0, -1, h - 1),
        # torch.rot90 counter-clockwise once (90) or three times (270), on a square image.
        "rot90": (0, -1, w - 1, 1, 0, 0),
        "rot270": (0, 1, 0, -1, 0, h - 1),
    }[code]
    return Step("remap", (), tuple(float(v) for v in coef))


def _policy_steps(aug: str, m: float | None, size: tuple[int, int], interp: str, fill: Any) -> list[Step]:
    """What a policy's drawn augmentation does (``lib.rs``, ``augment``)."""
    h, w = size
    mm = 0.0 if m is None else float(m)
    fl = None if fill is None else _nums(fill) * (3 if len(_nums(fill)) == 1 else 1)
    if aug == "Identity":
        return []
    if aug in ("ShearX", "ShearY"):
        deg = math.degrees(math.atan(mm))
        shear = (deg, 0.0) if aug == "ShearX" else (0.0, deg)
        return [_affine(_inverse_matrix((-w * 0.5, -h * 0.5), 0.0, (0.0, 0.0), shear), size, interp, fl)]
    if aug in ("TranslateX", "TranslateY"):
        t = float(math.trunc(mm))
        tr = (t, 0.0) if aug == "TranslateX" else (0.0, t)
        return [_affine(_inverse_matrix((0.0, 0.0), 0.0, tr, (0.0, 0.0)), size, interp, fl)]
    if aug == "Rotate":
        angle = math.fmod(mm, 360.0)
        if angle < 0:
            angle += 360.0
        if angle == 0.0:
            return []
        if angle == 180.0:
            return [_remap("rot180", size)]
        if w == h and angle in (90.0, 270.0):
            return [_remap("rot90" if angle == 90.0 else "rot270", size)]
        return [_affine(_inverse_matrix((0.0, 0.0), -angle, (0.0, 0.0), (0.0, 0.0)), size, interp, fl)]
    if aug == "Brightness":
        return [_blend("brightness", 1.0 + mm)]
    if aug == "Color":
        return [_blend("saturation", 1.0 + mm)]
    if aug == "Contrast":
        return [_blend("contrast", 1.0 + mm)]
    if aug == "Sharpness":
        return [Step("sharpness", (), (_f32(1.0 - (1.0 + mm)),))]
    if aug == "Posterize":
        return [_posterize(int(mm))]
    if aug == "Solarize":
        return [Step("solarize", (), (_f32(255.0 * mm),))]
    if aug in ("AutoContrast", "Equalize", "Invert"):
        return [Step(aug.lower(), (), ())]
    raise TraceMismatchError(f"unknown policy augmentation {aug!r}")


def _posterize(bits: int) -> Step:
    mask = 255 if bits >= 8 else (((1 << bits) - 1) << (8 - bits)) & 255
    return Step("posterize", (), (float(mask),))


class _Walk:
    """Walks one sample's trace along an op list, collecting its steps."""

    def __init__(self, trace: Sequence[dict[str, Any]], size: tuple[int, int], sample: int) -> None:
        self.trace, self.at, self.size, self.sample = trace, 0, size, sample
        self.steps: list[Step] = []

    def entry(self, name: str) -> dict[str, Any]:
        if self.at >= len(self.trace):
            raise TraceMismatchError(f"sample {self.sample}: the trace ends before op {name!r}")
        e = self.trace[self.at]
        if e.get("op") != name:
            raise TraceMismatchError(
                f"sample {self.sample}: trace entry {self.at} is {e.get('op')!r}, the op list has {name!r}"
            )
        self.at += 1
        return e

    def ops(self, ops: Sequence[dict[str, Any]]) -> None:
        for op in ops:
            self.op(op)

    def op(self, op: dict[str, Any]) -> None:
        name, size = op["op"], self.size
        if name not in SUPPORTED:
            raise NoKernelError(f"{name} has no GPU kernel (it changes the image's size after the prefix)")
        if name in _POLICIES:
            interp = op.get("interpolation", "nearest")
            n = {"trivial_augment_wide": 1, "rand_augment": int(op.get("num_ops", 2)), "auto_augment": 2}[name]
            for _ in range(n):
                e = self.entry(name)
                if e.get("apply", True):
                    self.steps += _policy_steps(e["aug"], e.get("magnitude"), size, interp, op.get("fill"))
            return
        e = self.entry(name)
        if name in ("horizontal_flip", "vertical_flip"):
            if e["flip"]:
                self.steps.append(_remap("hflip" if name == "horizontal_flip" else "vflip", size))
        elif name == "color_jitter":
            for i in e["order"]:
                key = ("brightness", "contrast", "saturation", "hue")[i]
                f = e[key]
                if f is None:
                    continue
                self.steps.append(Step("hue", (), (_f32(f),)) if key == "hue" else _blend(key, f))
        elif name == "gaussian_blur":
            k = [int(v) for v in _nums(op["kernel_size"])]
            kx, ky = (k[0], k[0]) if len(k) == 1 else (k[0], k[1])
            s = float(e["sigma"])
            self.steps.append(Step("blur", (kx, ky), (*_kernel1d(kx, s), *_kernel1d(ky, s))))
        elif name == "random_apply":
            if e["apply"]:
                self.ops(op["ops"])
        elif name == "random_choice":
            self.op(op["ops"][int(e["choice"])])
        elif e.get("apply"):
            if name == "grayscale":
                self.steps.append(Step("grayscale", (), ()))
            elif name == "solarize":
                self.steps.append(Step("solarize", (), (_f32(float(op["threshold"])),)))
            elif name == "posterize":
                self.steps.append(_posterize(int(op["bits"])))
            elif name == "adjust_sharpness":
                self.steps.append(Step("sharpness", (), (_f32(1.0 - float(op["sharpness_factor"])),)))
            else:
                self.steps.append(Step(name, (), ()))


def steps_of(
    ops: Sequence[dict[str, Any]], trace: Sequence[dict[str, Any]], size: tuple[int, int], sample: int = 0
) -> list[Step]:
    """The steps one sample runs: ``ops`` is the op list after the prefix, ``trace`` its entries
    (:func:`split_trace`), ``size`` the image's ``(height, width)``."""
    w = _Walk(trace, size, sample)
    w.ops(ops)
    if w.at != len(trace):
        raise TraceMismatchError(f"sample {sample}: {len(trace) - w.at} trace entries left after the op list")
    return w.steps


# -- the table --------------------------------------------------------------------------------


@dataclass
class Group:
    """The samples of one step that run one kind: their batch rows and parameters on the device."""

    kind: str
    static: tuple[Any, ...]
    rows: Any
    params: Any
    count: int


@dataclass
class OpTable:
    """A batch's per-image ops: for each step, its groups (:class:`Group`), in :data:`KINDS`
    order. Built on the host from the server's draws; :func:`apply` runs it."""

    size: tuple[int, int]
    steps: list[list[Group]] = field(default_factory=list)

    @classmethod
    def from_traces(
        cls,
        traces: Sequence[Sequence[dict[str, Any]]],
        ops: Sequence[dict[str, Any]],
        size: tuple[int, int],
        *,
        rows: Sequence[int] | None = None,
        device: Any = "cpu",
    ) -> OpTable:
        """The table of a batch's samples: ``traces[i]`` is sample ``i``'s trace entries after the
        prefix (:func:`split_trace`), ``ops`` the view's op list after the prefix, ``size`` the
        images' ``(height, width)``, ``rows[i]`` the batch row sample ``i`` is in (default ``i``).

        Raises:
            NoKernelError: an op after the prefix has no kernel (:func:`without_kernel`).
            TraceMismatchError: a trace does not follow ``ops``.
        """
        return cls.from_steps([steps_of(ops, t, size, i) for i, t in enumerate(traces)], size, rows=rows, device=device)

    @classmethod
    def from_steps(
        cls,
        steps: Sequence[Sequence[Step]],
        size: tuple[int, int],
        *,
        rows: Sequence[int] | None = None,
        device: Any = "cpu",
    ) -> OpTable:
        """The table of samples given by their steps (:func:`steps_of`)."""
        import torch

        rows = list(range(len(steps))) if rows is None else [int(r) for r in rows]
        depth = max((len(s) for s in steps), default=0)
        plan: list[list[tuple[str, tuple[Any, ...], list[int], list[tuple[float, ...]]]]] = []
        for k in range(depth):
            groups: dict[tuple[str, tuple[Any, ...]], tuple[list[int], list[tuple[float, ...]]]] = {}
            for i, s in enumerate(steps):
                if k < len(s):
                    g = groups.setdefault((s[k].kind, s[k].static), ([], []))
                    g[0].append(rows[i])
                    g[1].append(s[k].params)
            order = sorted(groups, key=lambda key: (KINDS.index(key[0]), str(key[1])))
            plan.append([(kind, static, *groups[(kind, static)]) for kind, static in order])
        # Two uploads for the whole batch: every group's rows, every group's parameters.
        ints = np.array([r for step in plan for g in step for r in g[2]], dtype=np.int64)
        flts = np.array([v for step in plan for g in step for p in g[3] for v in p], dtype=np.float64)
        dev = torch.device(device)

        def up(a: np.ndarray) -> Any:
            t = torch.from_numpy(a)
            return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t.to(dev)

        ints_d, flts_d = up(ints), up(flts)
        table = cls(size)
        ri = fi = 0
        for step in plan:
            out = []
            for kind, static, rws, params in step:
                n, width = len(rws), len(params[0])
                p = flts_d[fi : fi + n * width].view(n, width)
                out.append(Group(kind, static, ints_d[ri : ri + n], p, n))
                ri, fi = ri + n, fi + n * width
            table.steps.append(out)
        return table

    def kinds(self) -> set[str]:
        """The kinds the table runs."""
        return {g.kind for step in self.steps for g in step}


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
