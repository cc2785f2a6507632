"""The ops the server runs, with torchvision's names and semantics (``proto/control.md``, "Pipelines").

``ringfeed.Compose([RandomResizedCrop(224), RandomHorizontalFlip(), TrivialAugmentWide(),
Normalize(mean, std), RandomErasing(0.1)])`` is torchvision's recipe: code ports by changing the
import. Each op validates its parameters when it is built, with a ``ValueError`` that names the op
and the parameter, and ``to_json()`` gives its object in the ``open`` message's ``pipeline``; every
member is sent explicitly, so the server's defaults never decide anything.

Where the ops run:

- Per image, in the server (Rust), with each op's parameters drawn from the sample's seeded
  generator: the geometric ops (a crop still decodes only its region), colour, tone, blur and the
  auto-augment policies, and ``RandomApply`` / ``RandomChoice`` of them.
- Per batch, in the client, on the batch's device: ``Normalize`` and, after it, ``RandomErasing``
  (its boxes are drawn per image by the server, so they follow the seed and resume).
- ``MixUp`` and ``CutMix`` (and ``RandomChoice`` of them) are batch transforms: pass them as
  ``Loader(batch_transform=...)``.

Deliberate differences from torchvision, each tested: ``RandomCrop`` pads with a constant only
(``padding_mode="constant"``); the server's generator is not torch's, so the same seed draws other
(identically distributed) parameters; ``GaussianBlur`` convolves in two 1-D passes (the sums differ
in the last bits). ``Views`` (several outputs per sample) has no torchvision counterpart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "AspectBuckets",
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "Flip",
    "GaussianBlur",
    "MixUp",
    "Normalize",
    "Op",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomCrop",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomIoUCrop",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomSolarize",
    "RandomVerticalFlip",
    "RandomZoomOut",
    "Resize",
    "SanitizeBoundingBoxes",
    "ScaleJitter",
    "Transform",
    "TrivialAugmentWide",
    "View",
    "Views",
    "as_views",
]

#: Bounds of an output side, in pixels (control.md, "Pipelines").
MAX_SIZE = 4096
#: Longest view name (ring field names hold 16 bytes, and a view may add ``_erase``).
MAX_VIEW_NAME = 10
#: Most images per sample over all views.
MAX_OUTPUTS = 64

_INTERPOLATIONS = ("nearest", "bilinear", "bicubic")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _size(who: str, name: str, value: Any) -> tuple[int, int]:
    """``value`` as ``(height, width)``: an int is a square, a pair is ``(h, w)``."""
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) in (1, 2):
        pair = (value[0], value[-1])
    else:
        pair = (value, value)
    for side in pair:
        if not _is_int(side) or not 1 <= side <= MAX_SIZE:
            raise ValueError(
                f"{who}: {name} must be an int or an (height, width) pair of ints in 1..={MAX_SIZE}, got {value!r}"
            )
    return int(pair[0]), int(pair[1])


def _prob(who: str, value: Any, name: str = "p") -> float:
    if not (_real(value) and 0 <= value <= 1):
        raise ValueError(f"{who}: {name} must be a probability in 0..=1, got {value!r}")
    return float(value)


def _interval(who: str, name: str, value: Any, upper: float | None) -> tuple[float, float]:
    """``value`` as ``(lo, hi)`` with ``0 < lo <= hi`` (``<= upper`` when given)."""
    bound = f" <= {upper:g}" if upper is not None else ""
    try:
        lo, hi = value
    except (TypeError, ValueError):
        lo = hi = None
    if not (_real(lo) and _real(hi) and 0 < lo <= hi and (upper is None or hi <= upper)):
        raise ValueError(f"{who}: {name} must be a (min, max) pair with 0 < min <= max{bound}, got {value!r}")
    return float(lo), float(hi)


def _interpolation(who: str, value: Any, allowed: Sequence[str] = _INTERPOLATIONS) -> str:
    """A name, or torchvision's ``InterpolationMode`` (its ``value`` is the name)."""
    name = getattr(value, "value", value)
    if name not in allowed:
        raise ValueError(
            f"{who}: interpolation must be one of {', '.join(allowed)} (or InterpolationMode), got {value!r}"
        )
    return str(name)


def _fill(who: str, value: Any, *, allow_none: bool, integer: bool) -> list[float] | None:
    if value is None:
        if allow_none:
            return None
        value = 0
    values = [value] if _real(value) else list(value) if isinstance(value, Sequence) else None
    if values is None or len(values) not in (1, 3) or not all(_real(v) and 0 <= v <= 255 for v in values):
        raise ValueError(f"{who}: fill must be a number or 3 numbers in 0..=255, got {value!r}")
    if integer and not all(float(v).is_integer() for v in values):
        raise ValueError(f"{who}: fill must be integers for uint8 images, got {value!r}")
    if len(values) == 1:
        values *= 3
    return [int(v) if integer else float(v) for v in values]


class Op:
    """One op of a pipeline; build the subclasses. Ops are values: equal when their JSON is."""

    #: The ``op`` member of the protocol's op object.
    op = ""

    def to_json(self) -> dict[str, Any]:
        """The op's object in the ``pipeline``."""
        raise NotImplementedError

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """The output ``(height, width)`` for an input of ``size`` (``None``: depends on the image)."""
        return size

    def __add__(self, other: object) -> Compose:
        if not isinstance(other, (Op, Compose)):
            return NotImplemented
        return Compose([self, other])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and type(other) is type(self) and other.to_json() == self.to_json()

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        members = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items() if k != "op")
        return f"{type(self).__name__}({members})"


#: The name ringfeed 0.1 used for the base class.
Transform = Op


# -- geometry ---------------------------------------------------------------------------------------


class RandomResizedCrop(Op):
    """torchvision's ``RandomResizedCrop(size, scale, ratio, interpolation, antialias)``.

    Args:
        size: output size: an int (square) or ``(height, width)``, each in ``1 ..= 4096``.
        scale: bounds of the crop's area as a fraction of the image's, ``0 < min <= max <= 1``.
        ratio: bounds of the crop's aspect ratio (width / height), ``0 < min <= max``.
        interpolation: ``"bilinear"`` (default), ``"bicubic"``, ``"nearest"`` or an ``InterpolationMode``.
        antialias: widen the filter when downscaling (torchvision's default, ``True``).
    """

    op = "random_resized_crop"

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        interpolation: Any = "bilinear",
        antialias: bool = True,
    ) -> None:
        self.size = _size("RandomResizedCrop", "size", size)
        self.scale = _interval("RandomResizedCrop", "scale", scale, 1.0)
        self.ratio = _interval("RandomResizedCrop", "ratio", ratio, None)
        self.interpolation = _interpolation("RandomResizedCrop", interpolation)
        self.antialias = bool(antialias)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "size": list(self.size),
            "scale": list(self.scale),
            "ratio": list(self.ratio),
            "interpolation": self.interpolation,
            "antialias": self.antialias,
        }

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size


class Resize(Op):
    """torchvision's ``Resize(size, interpolation, max_size, antialias)``.

    An int (or a 1-sequence) resizes the **shorter side** and keeps the aspect ratio, as torchvision
    does (the longer side is truncated, and capped at ``max_size`` when given); ``(h, w)`` stretches
    to exactly that. A pipeline must end in a fixed size, so ``Resize(256)`` is followed by a crop.

    Args:
        size: the shorter side, or ``(height, width)``; sides in ``1 ..= 4096``.
        interpolation: ``"bilinear"`` (default), ``"bicubic"``, ``"nearest"`` or an ``InterpolationMode``.
        max_size: with a shorter-side size: the longer side's maximum, greater than ``size``.
        antialias: widen the filter when downscaling (default ``True``).
    """

    op = "resize"

    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: Any = "bilinear",
        max_size: int | None = None,
        antialias: bool = True,
    ) -> None:
        shorter = _is_int(size) or (isinstance(size, Sequence) and not isinstance(size, str) and len(size) == 1)
        if shorter:
            s = size if _is_int(size) else size[0]  # type: ignore[index]
            if not _is_int(s) or not 1 <= s <= MAX_SIZE:
                raise ValueError(f"Resize: size must be in 1..={MAX_SIZE}, got {size!r}")
            self.size: tuple[int, ...] = (int(s),)
        else:
            self.size = _size("Resize", "size", size)
        if max_size is not None:
            if not shorter:
                raise ValueError(
                    "Resize: max_size applies only when size is an int (the shorter side), as in torchvision"
                )
            if not _is_int(max_size) or not self.size[0] < max_size <= MAX_SIZE:
                raise ValueError(
                    f"Resize: max_size must be an int greater than size ({self.size[0]}) and at most {MAX_SIZE}, "
                    f"got {max_size!r}"
                )
        self.max_size = max_size
        self.interpolation = _interpolation("Resize", interpolation)
        self.antialias = bool(antialias)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": self.op,
            "size": list(self.size),
            "interpolation": self.interpolation,
            "antialias": self.antialias,
        }
        if self.max_size is not None:
            out["max_size"] = self.max_size
        return out

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return (self.size[0], self.size[1]) if len(self.size) == 2 else None


class AspectBuckets(Op):
    """Aspect-ratio buckets (protocol 1.10), the first op of a pipeline: every batch is one bucket.

    The buckets are every ``(h, w)`` whose sides are multiples of ``step`` (at most 4096) with
    ``w = floor(area / (h * step)) * step`` (the widest with ``h * w <= area``), and its transpose,
    whose ``w / h`` is in ``[min_ratio, max_ratio]``: SDXL's bucket lists are made this way. Each
    image goes to the bucket nearest its aspect ratio (log-ratio distance, read from its header without decoding; EXIF
    orientation respected), is resized to cover it (torchvision's ``Resize((nh, nw))``) and cropped
    to it (``crop="random"``: ``RandomCrop``; ``"center"``: ``CenterCrop``). Batches then carry
    ``crop_top_left`` and ``original_size`` (int32 ``[N, 2]``, SDXL's conditioning) and change shape
    from batch to batch. Only ops that keep the size (colour ops, flips, policies) may follow.

    Args:
        area: the buckets' area bound, in ``1 ..= 4096 * 4096``.
        min_ratio, max_ratio: bounds of a bucket's ``w / h``, ``0 < min_ratio <= max_ratio``.
        step: the sides' multiple; it divides 4096.
        crop: ``"random"`` or ``"center"``.
        interpolation, antialias: the covering resize's, as ``Resize``'s.
    """

    op = "aspect_buckets"

    def __init__(
        self,
        area: int = 1024 * 1024,
        min_ratio: float = 0.5,
        max_ratio: float = 2.0,
        step: int = 64,
        crop: str = "random",
        interpolation: str = "bilinear",
        antialias: bool = True,
    ) -> None:
        who = "AspectBuckets"
        if not (_is_int(area) and 1 <= area <= MAX_SIZE * MAX_SIZE):
            raise ValueError(
                f"{who}: area must be an int in 1..={MAX_SIZE * MAX_SIZE} (sides are at most {MAX_SIZE}), got {area!r}"
            )
        if not (_real(min_ratio) and min_ratio > 0):
            raise ValueError(f"{who}: min_ratio must be positive, got {min_ratio!r}")
        if not (_real(max_ratio) and min_ratio <= max_ratio):
            raise ValueError(f"{who}: min_ratio {min_ratio!r} is above max_ratio {max_ratio!r}")
        if not (_is_int(step) and 1 <= step <= MAX_SIZE and MAX_SIZE % step == 0):
            raise ValueError(f"{who}: step must be an int that divides {MAX_SIZE} (8, 32, 64, ...), got {step!r}")
        if crop not in ("random", "center"):
            raise ValueError(f"{who}: crop must be 'random' or 'center', got {crop!r}")
        self.area, self.min_ratio, self.max_ratio, self.step = int(area), float(min_ratio), float(max_ratio), int(step)
        self.crop = crop
        self.interpolation = _interpolation(who, interpolation)
        self.antialias = bool(antialias)
        if not self.buckets:
            raise ValueError(
                f"{who}: no bucket of sides that are multiples of step {step} has an area up to {area} and a ratio "
                f"in [{min_ratio}, {max_ratio}]; widen the ratios or change area or step"
            )

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """The buckets ``(h, w)``, by number (``w / h`` ascending, then ``h`` descending): control.md's rule."""
        s, out = self.step, set()
        for h in range(MAX_SIZE // s * s, s - 1, -s):
            w = self.area // (h * s) * s
            for bh, bw in ((h, w), (w, h)):
                if s <= bh <= MAX_SIZE and s <= bw <= MAX_SIZE and self.min_ratio <= bw / bh <= self.max_ratio:
                    out.add((bh, bw))
        return sorted(out, key=lambda b: (Fraction(b[1], b[0]), -b[0]))

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "area": self.area,
            "min_ratio": self.min_ratio,
            "max_ratio": self.max_ratio,
            "step": self.step,
            "crop": self.crop,
            "interpolation": self.interpolation,
            "antialias": self.antialias,
        }

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        # The largest bucket (the ring's slots are sized for it); a batch has its own bucket's.
        return max(self.buckets, key=lambda b: b[0] * b[1])


class CenterCrop(Op):
    """torchvision's ``CenterCrop(size)``: zero padding where the crop is larger than the image.

    ringfeed 0.1's ``CenterCrop(size, resize=s)`` meant ``Resize(s)`` then the crop; write that as
    ``Compose([Resize(s), CenterCrop(size)])`` now.

    Args:
        size: output size: an int (square) or ``(height, width)``, each in ``1 ..= 4096``.
    """

    op = "center_crop"

    def __init__(self, size: int | Sequence[int], **removed: Any) -> None:
        if removed:
            raise TypeError(
                f"CenterCrop: unexpected {', '.join(removed)}; CenterCrop(size, resize=s) became "
                f"Compose([Resize(s), CenterCrop(size)]), as in torchvision"
            )
        self.size = _size("CenterCrop", "size", size)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "size": list(self.size)}

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size


class RandomCrop(Op):
    """torchvision's ``RandomCrop(size, padding, pad_if_needed, fill, padding_mode="constant")``.

    Args:
        size: output size: an int or ``(height, width)``.
        padding: pixels added before cropping: an int (all sides), ``(left/right, top/bottom)`` or
            ``(left, top, right, bottom)``.
        pad_if_needed: pad a side shorter than the crop (by the difference, on both ends).
        fill: the padding's colour: an int or 3 ints in ``0 ..= 255``.
        padding_mode: only ``"constant"`` (a deliberate difference: reflect/edge/symmetric are not
            implemented).
    """

    op = "random_crop"

    def __init__(
        self,
        size: int | Sequence[int],
        padding: int | Sequence[int] | None = None,
        pad_if_needed: bool = False,
        fill: Any = 0,
        padding_mode: str = "constant",
    ) -> None:
        self.size = _size("RandomCrop", "size", size)
        if padding is None:
            pad = [0, 0, 0, 0]
        else:
            vals = [padding] if _is_int(padding) else list(padding) if isinstance(padding, Sequence) else None
            if vals is None or len(vals) not in (1, 2, 4) or not all(_is_int(v) and 0 <= v <= MAX_SIZE for v in vals):
                raise ValueError(
                    f"RandomCrop: padding must be an int, (left/right, top/bottom) or (left, top, right, bottom) of "
                    f"ints in 0..={MAX_SIZE}, got {padding!r}"
                )
            pad = vals * 4 if len(vals) == 1 else vals * 2 if len(vals) == 2 else vals
        self.padding = [int(v) for v in pad]
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = _fill("RandomCrop", fill, allow_none=False, integer=True)
        if padding_mode != "constant":
            raise ValueError(
                f"RandomCrop: padding_mode must be 'constant' (ringfeed does not implement {padding_mode!r}), "
                f"got {padding_mode!r}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "size": list(self.size),
            "padding": self.padding,
            "pad_if_needed": self.pad_if_needed,
            "fill": self.fill,
        }

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.size


# -- detection (control 1.10: they move boxes and masks; see docs/augmentation.md) --------------------


class RandomIoUCrop(Op):
    """torchvision v2's ``RandomIoUCrop(min_scale, max_scale, min_aspect_ratio, max_aspect_ratio, sampler_options,
    trials)`` (SSD): a crop whose draws depend on the sample's boxes after the ops before it; boxes whose centre falls
    outside the crop are removed. Needs the loader's targets to carry boxes. With no boxes the image is left as it is
    (torchvision draws until it draws an option of 1 or more, with the same result); where no crop can ever be found
    (no option of 1 or more), it gives up after 1000 rounds and leaves the image as it is (torchvision loops forever).

    Args:
        min_scale, max_scale: bounds of each side's fraction of the image, ``0 < min <= max <= 1``.
        min_aspect_ratio, max_aspect_ratio: bounds of the crop's width / height.
        sampler_options: the minimal IoUs drawn from (1 or more: leave the image as it is).
        trials: tries per drawn option, ``1 ..= 1000``.
    """

    op = "random_iou_crop"

    def __init__(
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        min_aspect_ratio: float = 0.5,
        max_aspect_ratio: float = 2.0,
        sampler_options: Sequence[float] | None = None,
        trials: int = 40,
    ) -> None:
        who = "RandomIoUCrop"
        self.scale = _interval(who, "(min_scale, max_scale)", (min_scale, max_scale), 1.0)
        self.aspect = _interval(who, "(min_aspect_ratio, max_aspect_ratio)", (min_aspect_ratio, max_aspect_ratio), None)
        options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] if sampler_options is None else list(sampler_options)
        if not (1 <= len(options) <= 64 and all(_real(v) and v >= 0 for v in options)):
            raise ValueError(f"{who}: sampler_options must be 1..=64 numbers >= 0, got {sampler_options!r}")
        self.sampler_options = [float(v) for v in options]
        if not (_is_int(trials) and 1 <= trials <= 1000):
            raise ValueError(f"{who}: trials must be an int in 1..=1000, got {trials!r}")
        self.trials = int(trials)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "min_scale": self.scale[0],
            "max_scale": self.scale[1],
            "min_aspect_ratio": self.aspect[0],
            "max_aspect_ratio": self.aspect[1],
            "sampler_options": self.sampler_options,
            "trials": self.trials,
        }

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return None


class RandomZoomOut(Op):
    """torchvision v2's ``RandomZoomOut(fill, side_range, p)``: with probability ``p``, the image placed in a canvas
    ``r`` times its size (``r`` uniform in ``side_range``), the rest ``fill``; a mask's rest is the targets'
    ``mask_fill``.

    Args:
        fill: the canvas's colour: an int or 3 ints in ``0 ..= 255``.
        side_range: bounds of ``r``, ``1 <= min <= max <= 64``.
        p: probability.
    """

    op = "random_zoom_out"

    def __init__(self, fill: Any = 0, side_range: Sequence[float] = (1.0, 4.0), p: float = 0.5) -> None:
        self.fill = _fill("RandomZoomOut", fill, allow_none=False, integer=True)
        self.side_range = _interval("RandomZoomOut", "side_range", side_range, 64.0)
        if self.side_range[0] < 1:
            raise ValueError(f"RandomZoomOut: side_range must be (min, max) with 1 <= min <= max, got {side_range!r}")
        self.p = _prob("RandomZoomOut", p)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "fill": self.fill, "side_range": list(self.side_range), "p": self.p}

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return None


class ScaleJitter(Op):
    """torchvision v2's ``ScaleJitter(target_size, scale_range, interpolation, antialias)`` (large-scale jitter): the
    image resized by ``min(target_size[1] / height, target_size[0] / width)`` times a factor uniform in
    ``scale_range``, as torchvision's code computes it. ``target_size`` is torchvision's pair as given; the protocol's
    ``target_size`` is ``[height, width]``, so it is sent reversed.

    Args:
        target_size: torchvision's ``target_size`` (an int: square).
        scale_range: bounds of the factor, ``0 < min <= max <= 64``.
        interpolation: ``"bilinear"`` (default), ``"bicubic"``, ``"nearest"`` or an ``InterpolationMode``.
        antialias: widen the filter when downscaling (default ``True``).
    """

    op = "scale_jitter"

    def __init__(
        self,
        target_size: int | Sequence[int],
        scale_range: Sequence[float] = (0.1, 2.0),
        interpolation: Any = "bilinear",
        antialias: bool = True,
    ) -> None:
        self.target_size = _size("ScaleJitter", "target_size", target_size)
        self.scale_range = _interval("ScaleJitter", "scale_range", scale_range, 64.0)
        self.interpolation = _interpolation("ScaleJitter", interpolation)
        self.antialias = bool(antialias)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "target_size": [self.target_size[1], self.target_size[0]],
            "scale_range": list(self.scale_range),
            "interpolation": self.interpolation,
            "antialias": self.antialias,
        }

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return None


class SanitizeBoundingBoxes:
    """torchvision v2's ``SanitizeBoundingBoxes(min_size=1, min_area=1)``: not an op the server runs per step but the
    targets' last step, which the server always takes (with the defaults when a pipeline has none): boxes narrower or
    lower than ``min_size`` or smaller than ``min_area`` output pixels are removed, with their labels. In a
    ``Compose`` it comes after every per-image op (before ``Normalize``); the loader sends its bounds as
    ``open.targets.min_size`` / ``min_area`` (``Compose.sanitize``). ``labels_getter`` is accepted as torchvision's
    default only: ringfeed's labels are the boxes' own.
    """

    def __init__(self, min_size: float = 1.0, min_area: float = 1.0, labels_getter: Any = "default") -> None:
        for name, v in (("min_size", min_size), ("min_area", min_area)):
            if not (_real(v) and v >= 0):
                raise ValueError(f"SanitizeBoundingBoxes: {name} must be a number >= 0, got {v!r}")
        if labels_getter != "default":
            raise ValueError(
                "SanitizeBoundingBoxes: labels_getter must be 'default' (ringfeed's box_labels follow their boxes), "
                f"got {labels_getter!r}"
            )
        self.min_size = float(min_size)
        self.min_area = float(min_area)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SanitizeBoundingBoxes) and (other.min_size, other.min_area) == (
            self.min_size,
            self.min_area,
        )

    def __hash__(self) -> int:
        return hash((self.min_size, self.min_area))

    def __repr__(self) -> str:
        return f"SanitizeBoundingBoxes(min_size={self.min_size!r}, min_area={self.min_area!r})"


class _P(Op):
    """An op with only a probability ``p``."""

    default_p = 0.5

    def __init__(self, p: float | None = None) -> None:
        self.p = _prob(type(self).__name__, self.default_p if p is None else p)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "p": self.p}


class RandomHorizontalFlip(_P):
    """torchvision's ``RandomHorizontalFlip(p=0.5)``."""

    op = "horizontal_flip"


#: ringfeed 0.1's name for ``RandomHorizontalFlip``.
Flip = RandomHorizontalFlip


class RandomVerticalFlip(_P):
    """torchvision's ``RandomVerticalFlip(p=0.5)``."""

    op = "vertical_flip"


# -- colour and tone --------------------------------------------------------------------------------


def _jitter(name: str, value: Any, center: float, bound: tuple[float, float], clip: bool) -> list[float] | None:
    """torchvision's ``ColorJitter._check_input``."""
    if value is None:
        return None
    if _real(value):
        if value < 0:
            raise ValueError(f"ColorJitter: {name} as a single number must be non-negative, got {value!r}")
        pair = [center - value, center + value]
        if clip:
            pair[0] = max(pair[0], 0.0)
    elif isinstance(value, Sequence) and len(value) == 2 and all(_real(v) for v in value):
        pair = [float(v) for v in value]
    else:
        raise ValueError(f"ColorJitter: {name} must be a number or a (min, max) pair, got {value!r}")
    if not bound[0] <= pair[0] <= pair[1] <= bound[1]:
        raise ValueError(f"ColorJitter: {name} must lie in {bound} and increase, got {pair}")
    return None if pair[0] == pair[1] == center else [float(pair[0]), float(pair[1])]


class ColorJitter(Op):
    """torchvision's ``ColorJitter(brightness, contrast, saturation, hue)``: the four adjustments in a
    random order per image, each factor uniform in its range.

    Args:
        brightness, contrast, saturation: ``x`` for ``[max(0, 1 - x), 1 + x]``, or ``(min, max)``.
        hue: ``x`` for ``[-x, x]`` (``0 <= x <= 0.5``), or ``(min, max)`` in ``-0.5 ..= 0.5``.
    """

    op = "color_jitter"

    def __init__(self, brightness: Any = 0, contrast: Any = 0, saturation: Any = 0, hue: Any = 0) -> None:
        inf = float("inf")
        self.brightness = _jitter("brightness", brightness, 1.0, (0, inf), True)
        self.contrast = _jitter("contrast", contrast, 1.0, (0, inf), True)
        self.saturation = _jitter("saturation", saturation, 1.0, (0, inf), True)
        self.hue = _jitter("hue", hue, 0.0, (-0.5, 0.5), False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        for k in ("brightness", "contrast", "saturation", "hue"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


class RandomGrayscale(_P):
    """torchvision's ``RandomGrayscale(p=0.1)`` (three equal channels)."""

    op = "grayscale"
    default_p = 0.1


class GaussianBlur(Op):
    """torchvision's ``GaussianBlur(kernel_size, sigma=(0.1, 2.0))``: one sigma uniform in the range
    per image.

    Args:
        kernel_size: odd ints: one, or ``(kx, ky)`` (x first, as torchvision's functional takes it).
        sigma: a positive number, or ``(min, max)``.
    """

    op = "gaussian_blur"

    def __init__(self, kernel_size: int | Sequence[int], sigma: float | Sequence[float] = (0.1, 2.0)) -> None:
        ks = [kernel_size] if _is_int(kernel_size) else list(kernel_size) if isinstance(kernel_size, Sequence) else []
        if len(ks) == 1:
            ks *= 2
        if len(ks) != 2 or not all(_is_int(k) and 1 <= k <= 255 and k % 2 == 1 for k in ks):
            raise ValueError(f"GaussianBlur: kernel_size must be odd ints in 1..=255, got {kernel_size!r}")
        self.kernel_size = [int(k) for k in ks]
        if _real(sigma):
            if not sigma > 0:  # type: ignore[operator]
                raise ValueError(f"GaussianBlur: sigma must be positive, got {sigma!r}")
            self.sigma = (float(sigma), float(sigma))  # type: ignore[arg-type]
        else:
            self.sigma = _interval("GaussianBlur", "sigma", sigma, None)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "kernel_size": self.kernel_size, "sigma": list(self.sigma)}


class RandomSolarize(Op):
    """torchvision's ``RandomSolarize(threshold, p=0.5)``: pixels ``>= threshold`` are inverted."""

    op = "solarize"

    def __init__(self, threshold: float, p: float = 0.5) -> None:
        if not (_real(threshold) and 0 <= threshold <= 255):
            raise ValueError(f"RandomSolarize: threshold must be in 0..=255 for uint8 images, got {threshold!r}")
        self.threshold = float(threshold)
        self.p = _prob("RandomSolarize", p)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "threshold": self.threshold, "p": self.p}


class RandomPosterize(Op):
    """torchvision's ``RandomPosterize(bits, p=0.5)``: keep the top ``bits`` bits of each channel."""

    op = "posterize"

    def __init__(self, bits: int, p: float = 0.5) -> None:
        if not (_is_int(bits) and 0 <= bits <= 8):
            raise ValueError(f"RandomPosterize: bits must be an int in 0..=8, got {bits!r}")
        self.bits = int(bits)
        self.p = _prob("RandomPosterize", p)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "bits": self.bits, "p": self.p}


class RandomAutocontrast(_P):
    """torchvision's ``RandomAutocontrast(p=0.5)``."""

    op = "autocontrast"


class RandomEqualize(_P):
    """torchvision's ``RandomEqualize(p=0.5)``."""

    op = "equalize"


class RandomInvert(_P):
    """torchvision's ``RandomInvert(p=0.5)``."""

    op = "invert"


class RandomAdjustSharpness(Op):
    """torchvision's ``RandomAdjustSharpness(sharpness_factor, p=0.5)``."""

    op = "adjust_sharpness"

    def __init__(self, sharpness_factor: float, p: float = 0.5) -> None:
        if not (_real(sharpness_factor) and sharpness_factor >= 0):
            raise ValueError(f"RandomAdjustSharpness: sharpness_factor must be non-negative, got {sharpness_factor!r}")
        self.sharpness_factor = float(sharpness_factor)
        self.p = _prob("RandomAdjustSharpness", p)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "sharpness_factor": self.sharpness_factor, "p": self.p}


# -- policies ---------------------------------------------------------------------------------------


class _Policy(Op):
    def _common(self, interpolation: Any, fill: Any) -> None:
        who = type(self).__name__
        self.interpolation = _interpolation(who, interpolation, ("nearest", "bilinear"))
        self.fill = _fill(who, fill, allow_none=True, integer=False)

    def _members(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "interpolation": self.interpolation}
        if self.fill is not None:
            out["fill"] = self.fill
        return out


class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide(num_magnitude_bins=31, interpolation=NEAREST, fill=None)``."""

    op = "trivial_augment_wide"

    def __init__(self, num_magnitude_bins: int = 31, interpolation: Any = "nearest", fill: Any = None) -> None:
        if not (_is_int(num_magnitude_bins) and 2 <= num_magnitude_bins <= 1024):
            raise ValueError(
                f"TrivialAugmentWide: num_magnitude_bins must be an int in 2..=1024, got {num_magnitude_bins!r}"
            )
        self.num_magnitude_bins = int(num_magnitude_bins)
        self._common(interpolation, fill)

    def to_json(self) -> dict[str, Any]:
        return {**self._members(), "num_magnitude_bins": self.num_magnitude_bins}


class RandAugment(_Policy):
    """torchvision's ``RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation=NEAREST,
    fill=None)``."""

    op = "rand_augment"

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        interpolation: Any = "nearest",
        fill: Any = None,
    ) -> None:
        if not (_is_int(num_ops) and 0 <= num_ops <= 16):
            raise ValueError(f"RandAugment: num_ops must be an int in 0..=16, got {num_ops!r}")
        if not (_is_int(num_magnitude_bins) and 2 <= num_magnitude_bins <= 1024):
            raise ValueError(f"RandAugment: num_magnitude_bins must be an int in 2..=1024, got {num_magnitude_bins!r}")
        if not (_is_int(magnitude) and 0 <= magnitude < num_magnitude_bins):
            raise ValueError(
                f"RandAugment: magnitude must be an int in 0..{num_magnitude_bins} (a magnitude bin), got {magnitude!r}"
            )
        self.num_ops, self.magnitude, self.num_magnitude_bins = int(num_ops), int(magnitude), int(num_magnitude_bins)
        self._common(interpolation, fill)

    def to_json(self) -> dict[str, Any]:
        return {
            **self._members(),
            "num_ops": self.num_ops,
            "magnitude": self.magnitude,
            "num_magnitude_bins": self.num_magnitude_bins,
        }


class AutoAugment(_Policy):
    """torchvision's ``AutoAugment(policy=IMAGENET, interpolation=NEAREST, fill=None)``.

    Args:
        policy: ``"imagenet"``, ``"cifar10"``, ``"svhn"`` or torchvision's ``AutoAugmentPolicy``.
    """

    op = "auto_augment"

    def __init__(self, policy: Any = "imagenet", interpolation: Any = "nearest", fill: Any = None) -> None:
        name = getattr(policy, "value", policy)
        if name not in ("imagenet", "cifar10", "svhn"):
            raise ValueError(f"AutoAugment: policy must be 'imagenet', 'cifar10' or 'svhn', got {policy!r}")
        self.policy = str(name)
        self._common(interpolation, fill)

    def to_json(self) -> dict[str, Any]:
        return {**self._members(), "policy": self.policy}


# -- glue -------------------------------------------------------------------------------------------


def _ops(who: str, transforms: Any) -> list[Op]:
    items = transforms.transforms if isinstance(transforms, Compose) else transforms
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise ValueError(f"{who}: transforms must be a non-empty list of ringfeed ops, got {transforms!r}")
    out: list[Op] = []
    for t in items:
        if isinstance(t, Compose):
            out.extend(t.transforms)
        elif isinstance(t, (Normalize, RandomErasing)):
            raise ValueError(f"{who}: {type(t).__name__} applies to the batch, so it cannot be inside {who}")
        elif isinstance(t, (MixUp, CutMix)):
            raise ValueError(f"{who}: {type(t).__name__} is a batch transform; pass it as Loader(batch_transform=...)")
        elif isinstance(t, Op):
            out.append(t)
        else:
            raise ValueError(
                f"{who}: {t!r} is not a ringfeed op (torchvision's own transforms do not run in the server)"
            )
    return out


class RandomApply(Op):
    """torchvision's ``RandomApply(transforms, p=0.5)``: all of them, in order, with probability ``p``.
    They must keep the image's size."""

    op = "random_apply"

    def __init__(self, transforms: Any, p: float = 0.5) -> None:
        self.transforms = _ops("RandomApply", transforms)
        self.p = _prob("RandomApply", p)
        size = (1, 1)
        for t in self.transforms:
            size = t.out_size(size)  # type: ignore[assignment]
        if size != (1, 1):
            raise ValueError(
                "RandomApply: its transforms must keep the image's size (apply crops and resizes outside it)"
            )

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "p": self.p, "ops": [t.to_json() for t in self.transforms]}


class RandomChoice(Op):
    """torchvision's ``RandomChoice(transforms, p=None)``: one of them (weights ``p``, normalised).

    Of per-image ops it runs in the server; of ``MixUp`` and ``CutMix`` it is a batch transform
    (``Loader(batch_transform=RandomChoice([MixUp(...), CutMix(...)]))``), as in torchvision's recipe.
    """

    op = "random_choice"

    def __init__(self, transforms: Sequence[Any], p: Sequence[float] | None = None) -> None:
        if not isinstance(transforms, Sequence) or not transforms:
            raise ValueError(f"RandomChoice: transforms must be a non-empty list, got {transforms!r}")
        self.batch = all(isinstance(t, (MixUp, CutMix)) for t in transforms)
        if self.batch:
            self.transforms: list[Any] = list(transforms)
        else:
            self.transforms = _ops("RandomChoice", [Compose([t]) if isinstance(t, Compose) else t for t in transforms])
            if len(self.transforms) != len(transforms):
                raise ValueError("RandomChoice: each choice must be one op (wrap several in RandomApply(..., p=1))")
        if p is None:
            weights = [1.0] * len(self.transforms)
        else:
            weights = list(p)
            if (
                len(weights) != len(self.transforms)
                or not all(_real(w) and w >= 0 for w in weights)
                or sum(weights) <= 0
            ):
                raise ValueError(
                    f"RandomChoice: p must hold one non-negative weight per transform, not all 0, got {p!r}"
                )
        total = float(sum(weights))
        self.p = [float(w) / total for w in weights]
        if not self.batch:
            sizes = {t.out_size((1, 1)) for t in self.transforms}
            if len(sizes) != 1:
                raise ValueError("RandomChoice: every choice must give the same size")

    def out_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.transforms[0].out_size(size)

    def to_json(self) -> dict[str, Any]:
        if self.batch:
            raise ValueError(
                "RandomChoice of MixUp/CutMix is a batch transform: pass it as Loader(batch_transform=...)"
            )
        return {"op": self.op, "ops": [t.to_json() for t in self.transforms], "p": self.p}


class Normalize(Op):
    """torchvision's ``Normalize(mean, std)`` after ``ToDtype(float32, scale=True)``: ``(x / 255 - mean) / std``,
    on the batch's device, in the client. Images come out as float ``[N, 3, H, W]`` (channels_last).

    Args:
        mean, std: 3 numbers each (or 1) on the 0..1 scale; every std positive.
    """

    op = "normalize"

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        def three(name: str, v: Any) -> list[float]:
            vals = [v] if _real(v) else list(v) if isinstance(v, Sequence) else []
            if len(vals) == 1:
                vals *= 3
            if len(vals) != 3 or not all(_real(x) for x in vals):
                raise ValueError(f"Normalize: {name} must be 3 finite numbers (one per channel), got {v!r}")
            return [float(x) for x in vals]

        self.mean = three("mean", mean)
        self.std = three("std", std)
        if any(s <= 0 for s in self.std):
            raise ValueError(f"Normalize: every std must be positive, got {list(std)}")

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "mean": self.mean, "std": self.std}


class RandomErasing(Op):
    """torchvision's ``RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)``, after
    ``Normalize`` as torchvision's recipes order it. The box is drawn per image by the server; the
    client erases it on the batch's device.

    Args:
        value: a number, 3 numbers (one per channel, in the normalised scale when after
            ``Normalize``), or ``"random"`` (standard normal noise).
    """

    op = "random_erasing"

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: Any = 0.0,
        inplace: bool = False,
    ) -> None:
        self.p = _prob("RandomErasing", p)
        self.scale = _interval("RandomErasing", "scale", scale, 1.0)
        self.ratio = _interval("RandomErasing", "ratio", ratio, None)
        if value == "random":
            self.value: str | list[float] = "random"
        else:
            vals = [value] if _real(value) else list(value) if isinstance(value, Sequence) else []
            if len(vals) not in (1, 3) or not all(_real(v) for v in vals):
                raise ValueError(f"RandomErasing: value must be a number, 3 numbers or 'random', got {value!r}")
            self.value = [float(v) for v in vals] * (3 if len(vals) == 1 else 1)
        del inplace  # ringfeed erases the batch it made; there is nothing else to protect

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "p": self.p, "scale": list(self.scale), "ratio": list(self.ratio), "value": self.value}


class Compose:
    """torchvision's ``Compose(transforms)``: ops run in order; the per-image ones must end in a fixed size.

    ``Normalize`` and ``RandomErasing`` come last (they run on the batch, in the client).
    """

    def __init__(self, transforms: Sequence[Any]) -> None:
        if not isinstance(transforms, Sequence) or isinstance(transforms, str):
            raise ValueError(f"Compose: transforms must be a list of ringfeed ops, got {transforms!r}")
        flat: list[Op] = []
        self.sanitize: SanitizeBoundingBoxes | None = None
        for t in transforms:
            if isinstance(t, SanitizeBoundingBoxes) or (isinstance(t, Compose) and t.sanitize is not None):
                if self.sanitize is not None:
                    raise ValueError("Compose: SanitizeBoundingBoxes comes once, after every per-image op")
                self.sanitize = t if isinstance(t, SanitizeBoundingBoxes) else t.sanitize
                if isinstance(t, Compose):
                    flat.extend(t.transforms)
            elif self.sanitize is not None and not isinstance(t, (Normalize, RandomErasing)):
                raise ValueError(
                    f"Compose: {type(t).__name__} comes after SanitizeBoundingBoxes, which is the targets' last step "
                    f"(put it after every per-image op)"
                )
            elif isinstance(t, Compose):
                flat.extend(t.transforms)
            elif isinstance(t, (MixUp, CutMix)) or (isinstance(t, RandomChoice) and t.batch):
                raise ValueError(
                    f"Compose: {type(t).__name__} is a batch transform; pass it as Loader(batch_transform=...)"
                )
            elif isinstance(t, Op):
                flat.append(t)
            else:
                raise ValueError(
                    f"Compose: {t!r} is not a ringfeed op "
                    f"(use ringfeed's RandomResizedCrop, ... in place of torchvision's)"
                )
        for i, t in enumerate(flat):
            if isinstance(t, AspectBuckets) and i > 0:
                raise ValueError("Compose: AspectBuckets must be the first op")
            if i > 0 and isinstance(flat[0], AspectBuckets) and t.out_size((1, 1)) != (1, 1):
                raise ValueError(
                    f"Compose: {type(t).__name__} changes the size after AspectBuckets, whose bucket is the batch's "
                    f"size; only ops that keep the size (colour ops, flips) may follow it"
                )
        tail = False
        for i, t in enumerate(flat):
            if isinstance(t, (Normalize, RandomErasing)):
                tail = True
                if isinstance(t, Normalize) and any(isinstance(u, (Normalize, RandomErasing)) for u in flat[:i]):
                    raise ValueError("Compose: Normalize comes once, before RandomErasing")
            elif tail:
                raise ValueError(
                    f"Compose: {type(t).__name__} comes after Normalize/RandomErasing; per-image ops come first "
                    f"(the batch ops run in the client)"
                )
        self.transforms = flat

    @property
    def ops(self) -> list[Op]:
        """The per-image ops (what the server runs)."""
        return [t for t in self.transforms if not isinstance(t, (Normalize, RandomErasing))]

    @property
    def normalize(self) -> Normalize | None:
        return next((t for t in self.transforms if isinstance(t, Normalize)), None)

    @property
    def erasing(self) -> list[RandomErasing]:
        return [t for t in self.transforms if isinstance(t, RandomErasing)]

    @property
    def size(self) -> tuple[int, int] | None:
        """The output ``(height, width)``, or ``None`` when it depends on the image."""
        size: tuple[int, int] | None = None
        for t in self.ops:
            size = t.out_size(size)
        return size

    def to_json(self) -> list[dict[str, Any]]:
        return [t.to_json() for t in self.transforms]

    def __add__(self, other: object) -> Compose:
        if not isinstance(other, (Op, Compose)):
            return NotImplemented
        return Compose([self, other])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compose) and (other.to_json(), other.sanitize) == (self.to_json(), self.sanitize)

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        tail = [] if self.sanitize is None else [self.sanitize]
        return f"Compose({self.transforms + tail!r})"


# -- views ------------------------------------------------------------------------------------------


class View:
    """One output field of a sample: ``count`` images from the same pipeline, each with its own draws.

    With ``count > 1`` the field has a leading dimension: ``[N, count, H, W, 3]`` (NHWC).
    """

    def __init__(self, transform: Any, count: int = 1) -> None:
        self.transform = transform if isinstance(transform, Compose) else Compose([transform])
        if not (_is_int(count) and 1 <= count <= MAX_OUTPUTS):
            raise ValueError(f"View: count must be an int in 1..={MAX_OUTPUTS}, got {count!r}")
        self.count = int(count)
        if self.transform.size is None:
            raise ValueError(
                f"View: the pipeline {self.transform!r} ends in a size that depends on the image; end it with a crop "
                f"or a resize to (height, width)"
            )

    @property
    def size(self) -> tuple[int, int]:
        size = self.transform.size
        assert size is not None
        return size

    def __repr__(self) -> str:
        return f"View({self.transform!r}, count={self.count})"


class Views:
    """Several outputs per sample (multi-crop, several views): ``Views({"global": View(g, count=2),
    "local": View(l, count=8)})`` delivers fields ``global`` and ``local`` beside ``label``.

    Names: 1..=10 characters of ``a-z``, ``0-9``, ``_``, not starting with a digit, not ``label``,
    ``index`` or ``crop``.
    """

    def __init__(self, views: Mapping[str, Any]) -> None:
        if not isinstance(views, Mapping) or not views:
            raise ValueError(f"Views: views must be a non-empty mapping of names to View or Compose, got {views!r}")
        self.views: dict[str, View] = {}
        for name, v in views.items():
            ok = (
                isinstance(name, str)
                and 1 <= len(name) <= MAX_VIEW_NAME
                and all(c.isascii() and (c.islower() or c.isdigit() or c == "_") for c in name)
                and not name[0].isdigit()
            )
            if not ok or name in ("label", "index", "crop"):
                raise ValueError(
                    f"Views: name {name!r} must be 1..={MAX_VIEW_NAME} characters of a-z, 0-9 and _, not starting with "
                    f"a digit, and not label, index or crop"
                )
            self.views[name] = v if isinstance(v, View) else View(v)
        if sum(v.count for v in self.views.values()) > MAX_OUTPUTS:
            raise ValueError(f"Views: more than {MAX_OUTPUTS} images per sample")

    def to_json(self) -> dict[str, Any]:
        """The ``pipeline`` member of ``open``."""
        return {
            "views": [{"name": name, "count": v.count, "ops": v.transform.to_json()} for name, v in self.views.items()]
        }

    def legacy(self) -> dict[str, Any] | None:
        """The protocol 1.1 ``transform`` this means, if it is one of the three it had (for a 1.1 server)."""
        if list(self.views) != ["image"]:
            return None
        v = self.views["image"]
        # Normalize runs in the client whatever the server; erasing needs 1.2's boxes.
        t = v.transform.ops
        if v.count != 1 or v.transform.erasing:
            return None
        bilinear = {"interpolation": "bilinear", "antialias": True}

        def plain(op: Op) -> bool:
            j = op.to_json()
            return all(j.get(k, bilinear[k]) == bilinear[k] for k in bilinear)

        rrc = len(t) in (1, 2) and isinstance(t[0], RandomResizedCrop) and plain(t[0])
        if rrc and (len(t) == 1 or isinstance(t[1], RandomHorizontalFlip)):
            flip = t[1].p if len(t) == 2 else 0.0  # type: ignore[attr-defined]
            return {
                "kind": "random_resized_crop",
                "size": list(t[0].size),  # type: ignore[attr-defined]
                "scale": list(t[0].scale),  # type: ignore[attr-defined]
                "ratio": list(t[0].ratio),  # type: ignore[attr-defined]
                "flip": flip,
            }
        if len(t) == 1 and isinstance(t[0], Resize) and len(t[0].size) == 2 and plain(t[0]):
            return {"kind": "resize", "size": list(t[0].size)}
        if (
            len(t) == 2
            and isinstance(t[0], Resize)
            and len(t[0].size) == 1
            and t[0].max_size is None
            and plain(t[0])
            and isinstance(t[1], CenterCrop)
        ):
            return {"kind": "center_crop", "size": list(t[1].size), "resize": t[0].size[0]}
        return None

    def __repr__(self) -> str:
        return f"Views({self.views!r})"


def as_views(transform: Any) -> Views:
    """The ``Views`` a ``Loader``'s ``transform`` means: an op, a ``Compose``, or ``Views`` itself."""
    if isinstance(transform, Views):
        return transform
    if isinstance(transform, (MixUp, CutMix)):
        raise ValueError(f"transform: {type(transform).__name__} is a batch transform; pass it as batch_transform=")
    if isinstance(transform, View):
        return Views({"image": transform})
    if isinstance(transform, (Op, Compose)):
        if isinstance(transform, RandomChoice) and transform.batch:
            raise ValueError(
                "transform: RandomChoice of MixUp/CutMix is a batch transform; pass it as batch_transform="
            )
        return Views({"image": View(transform)})
    raise ValueError(f"transform must be a ringfeed op, Compose([...]) or Views({{...}}), got {transform!r}")


# -- batch transforms ---------------------------------------------------------------------------------


class _MixBase:
    def __init__(self, alpha: float, num_classes: int) -> None:
        who = type(self).__name__
        if not (_real(alpha) and alpha > 0):
            raise ValueError(f"{who}: alpha must be positive, got {alpha!r}")
        if not (_is_int(num_classes) and num_classes >= 1):
            raise ValueError(f"{who}: num_classes must be a positive int (labels become one-hot), got {num_classes!r}")
        self.alpha = float(alpha)
        self.num_classes = int(num_classes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes})"


class MixUp(_MixBase):
    """torchvision v2's ``MixUp(alpha=1.0, num_classes)``: one ``lam ~ Beta(alpha, alpha)`` per batch, the batch
    mixed with itself rolled by one, labels one-hot and mixed the same way. A batch transform:
    ``Loader(batch_transform=MixUp(...))``; seeded from ``(seed, epoch, batch)``, so resume repeats it."""

    def __init__(self, *, alpha: float = 1.0, num_classes: int) -> None:
        super().__init__(alpha, num_classes)


class CutMix(_MixBase):
    """torchvision v2's ``CutMix(alpha=1.0, num_classes)``: a box of area ``1 - lam`` (centre uniform,
    clipped) pasted from the batch rolled by one; ``lam`` recomputed from the clipped box for the labels."""

    def __init__(self, *, alpha: float = 1.0, num_classes: int) -> None:
        super().__init__(alpha, num_classes)
