"""The transforms the server applies, as small value objects (``proto/control.md``, "Transforms").

Each object validates its parameters when it is built, with a ``ValueError`` that names the
parameter, so a typo fails at the line that made it rather than as a ``bad_request`` from the
server. ``to_json()`` gives the ``transform`` member of the ``open`` message; every member is sent
explicitly, so the server's defaults never decide anything.

Semantics are torchvision's. ``RandomResizedCrop(224) + Flip()`` is torchvision's
``Compose([RandomResizedCrop(224), RandomHorizontalFlip()])``, sent as one ``random_resized_crop``
with ``flip: 0.5``; ``RandomResizedCrop`` alone does not flip (``flip: 0``, although the protocol's
default for a missing ``flip`` is 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["CenterCrop", "Flip", "RandomResizedCrop", "Resize", "Transform"]

#: Bounds of an output side, in pixels (control.md, "Transforms").
MAX_SIZE = 4096


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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


class Transform:
    """A transform the server runs on every decoded image; build one of the subclasses."""

    #: The ``kind`` member of the protocol's ``transform`` object.
    kind = ""
    #: The output image's ``(height, width)``.
    size: tuple[int, int]

    def to_json(self) -> dict[str, Any]:
        """The ``transform`` object of the ``open`` message."""
        raise NotImplementedError

    def __add__(self, other: object) -> Transform:
        if not isinstance(other, Transform):
            return NotImplemented
        raise TypeError(
            f"ringfeed cannot combine {type(self).__name__} with {type(other).__name__}: the server runs one "
            f"transform per stream, and only RandomResizedCrop(...) + Flip(...) combine"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Transform) and type(other) is type(self) and other.to_json() == self.to_json()

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        members = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items() if k != "kind")
        return f"{type(self).__name__}({members})"


class RandomResizedCrop(Transform):
    """torchvision's ``RandomResizedCrop(size, scale, ratio, antialias=True)``.

    Args:
        size: output size: an int (square) or ``(height, width)``, each in ``1 ..= 4096``.
        scale: bounds of the crop's area as a fraction of the image's, ``0 < min <= max <= 1``.
        ratio: bounds of the crop's aspect ratio (width / height), ``0 < min <= max``.

    Add ``Flip()`` to flip horizontally after the crop: ``RandomResizedCrop(224) + Flip()``.
    """

    kind = "random_resized_crop"

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size = _size("RandomResizedCrop", "size", size)
        self.scale = _interval("RandomResizedCrop", "scale", scale, 1.0)
        self.ratio = _interval("RandomResizedCrop", "ratio", ratio, None)
        #: The probability of a horizontal flip after the crop (set by ``+ Flip(p)``).
        self.flip = 0.0
        self._flips = False

    def __add__(self, other: object) -> Transform:
        if isinstance(other, Flip):
            if self._flips:
                raise TypeError("RandomResizedCrop(...) + Flip(...) already flips; add Flip() once")
            combined = RandomResizedCrop(self.size, self.scale, self.ratio)
            combined.flip = other.p
            combined._flips = True
            return combined
        return super().__add__(other)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "size": list(self.size),
            "scale": list(self.scale),
            "ratio": list(self.ratio),
            "flip": self.flip,
        }


class Flip(Transform):
    """torchvision's ``RandomHorizontalFlip(p)``; only after a crop: ``RandomResizedCrop(224) + Flip()``.

    Args:
        p: the probability of flipping an image, ``0 <= p <= 1``.
    """

    kind = "flip"

    def __init__(self, p: float = 0.5) -> None:
        if not (_real(p) and 0 <= p <= 1):
            raise ValueError(f"Flip: p must be a probability in 0..=1, got {p!r}")
        self.p = float(p)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "p": self.p}


class CenterCrop(Transform):
    """Evaluation: torchvision's ``Resize(resize)`` (shorter side, antialiased) then ``CenterCrop(size)``.

    Args:
        size: output size: an int (square) or ``(height, width)``, each in ``1 ..= 4096``.
        resize: the shorter side after resizing, in ``1 ..= 4096``. By default
            ``floor(max(size) / 0.875)``, the usual ImageNet ratio (224 → 256).
    """

    kind = "center_crop"

    def __init__(self, size: int | Sequence[int], resize: int | None = None) -> None:
        self.size = _size("CenterCrop", "size", size)
        if resize is None:
            resize = min(MAX_SIZE, math.floor(max(self.size) / 0.875))
        elif not _is_int(resize) or not 1 <= resize <= MAX_SIZE:
            raise ValueError(f"CenterCrop: resize must be an int in 1..={MAX_SIZE} (the shorter side), got {resize!r}")
        self.resize = int(resize)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": list(self.size), "resize": self.resize}


class Resize(Transform):
    """Stretch every image to exactly ``height x width`` (torchvision's ``Resize((h, w))``, antialiased).

    Unlike torchvision's ``Resize(int)``, which resizes the shorter side, ``Resize(224)`` here
    means ``(224, 224)``: use ``CenterCrop(size, resize=...)`` to keep the aspect ratio.

    Args:
        size: output size: an int (square) or ``(height, width)``, each in ``1 ..= 4096``.
    """

    kind = "resize"

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _size("Resize", "size", size)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": list(self.size)}
