"""The batch ops the client applies after a batch leaves the ring (needs torch).

In order, on the batch's device (the side stream in CUDA mode): each view's ``Normalize``
(``gpu.device.Normalizer``), then its ``RandomErasing`` boxes (drawn per image by the server into the
view's ``<name>_erase`` field), then the loader's ``batch_transform``: ``MixUp``, ``CutMix`` or a
``RandomChoice`` of them on the view's images and the labels, or the user's own callable on the
batch's fields.

Randomness the client draws (MixUp/CutMix's lam, box and choice; erasing's ``"random"`` noise) comes
from generators seeded by ``(seed, epoch, batch index)``, so a resumed epoch repeats it exactly.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any

from ._transforms import CutMix, MixUp, RandomChoice, Views

__all__ = ["BatchOps"]


def _seed(*parts: int) -> int:
    """A 64-bit seed that depends on every part (stable across Python versions and processes)."""
    h = hashlib.blake2b(
        b"ringfeed-batch" + b"".join(p.to_bytes(8, "little", signed=False) for p in parts), digest_size=8
    )
    return int.from_bytes(h.digest(), "little")


class BatchOps:
    """What runs on each batch after the ring: see the module docs.

    Args:
        views: the loader's views (their ``Normalize`` and ``RandomErasing``).
        layout: the ring's image layout, ``"NHWC"`` or ``"NCHW"``.
        normalize: the deprecated ``Loader(normalize=(mean, std))``, for every view without its own.
        dtype: the floating dtype of normalised images.
        batch_transform: ``MixUp``, ``CutMix``, ``RandomChoice`` of them, any other callable (given
            the batch's fields by name, a dict of tensors on the batch's device, after the built-in
            ops; it returns the fields the loop gets), or ``None``.
        seed: the loader's seed.
    """

    def __init__(
        self,
        views: Views,
        layout: str,
        normalize: tuple[Any, Any] | None,
        dtype: Any,
        batch_transform: Any,
        seed: int,
    ) -> None:
        from .gpu.device import Normalizer

        self.layout = layout
        self.seed = seed
        self.normalizers: dict[str, Any] = {}
        self.erasing: dict[str, list[Any]] = {}
        for name, v in views.views.items():
            own = v.transform.normalize
            if own is not None and normalize is not None:
                raise ValueError(
                    f"normalize: view {name!r} has its own Normalize in its Compose; "
                    f"pass Normalize (or the deprecated normalize=), not both"
                )
            mean_std = (own.mean, own.std) if own is not None else normalize
            if mean_std is not None:
                import torch

                self.normalizers[name] = Normalizer(
                    mean_std[0], mean_std[1], torch.float32 if dtype is None else dtype, layout
                )
            if v.transform.erasing:
                self.erasing[name] = v.transform.erasing
        if dtype is not None and not self.normalizers:
            raise ValueError(
                "dtype applies to normalized images only; end the transform with ringfeed.Normalize(mean, std)"
            )
        self.mix: list[Any] = []
        self.mix_p: list[float] = []
        #: The user's own batch transform: runs last, on the fields by name.
        self.user: Any = None
        if batch_transform is not None:
            if isinstance(batch_transform, (MixUp, CutMix)):
                self.mix, self.mix_p = [batch_transform], [1.0]
            elif isinstance(batch_transform, RandomChoice) and batch_transform.batch:
                self.mix, self.mix_p = list(batch_transform.transforms), list(batch_transform.p)
            elif callable(batch_transform) and not isinstance(batch_transform, RandomChoice):
                self.user = batch_transform
            else:
                raise ValueError(
                    f"batch_transform must be MixUp, CutMix, RandomChoice([MixUp(...), CutMix(...)]) or a "
                    f"callable on the batch's fields, got {batch_transform!r}"
                )
            if self.mix and len(views.views) != 1:
                raise ValueError("batch_transform: MixUp/CutMix mix one view's images; this loader has several views")
        self.mixed_view = next(iter(views.views))
        #: Erasing's constant fills, per (value, device, dtype, layout): made once, not per batch.
        self._fills: dict[tuple[Any, ...], Any] = {}

    def check(self, views: dict[str, Any]) -> None:
        """Checks what can be checked on the host views before the batch is copied (no GPU sync)."""
        if not self.mix:
            return
        labels = views["label"]
        if len(labels) == 0:
            return
        lo, hi = int(labels.min()), int(labels.max())
        classes = min(op.num_classes for op in self.mix)
        if lo < 0:
            raise ValueError("MixUp/CutMix: the dataset has samples without a label (-1); they need class labels")
        if hi >= classes:
            raise ValueError(f"MixUp/CutMix: label {hi} is out of range for num_classes={classes}")

    @property
    def active(self) -> bool:
        """Whether any op runs (else batches are the ring's own views)."""
        return bool(self.normalizers or self.erasing or self.mix or self.user is not None)

    def __call__(self, out: dict[str, Any], epoch: int, batch: int) -> dict[str, Any]:
        for name in list(out):
            if name.endswith("_erase"):
                continue
            boxes = out.pop(f"{name}_erase", None)
            if name not in self.normalizers and name not in self.erasing:
                continue
            x = out[name]
            lead = x.shape[:-3]  # [N] or [N, count]
            flat = x.reshape((-1, *x.shape[-3:]))
            if name in self.normalizers:
                flat = self.normalizers[name](flat)
                nchw = True
            else:
                nchw = self.layout == "NCHW"
            if boxes is not None and name in self.erasing:
                flat = self._erase(flat, boxes.reshape((-1, *boxes.shape[-2:])), self.erasing[name], nchw, epoch, batch)
            out[name] = flat.reshape((*lead, *flat.shape[1:])) if len(lead) > 1 else flat
        if self.mix:
            self._mix(out, epoch, batch)
        if self.user is not None:
            out = self.user(out)
            if not isinstance(out, dict):
                raise TypeError(
                    f"batch_transform {self.user!r} must return the batch's fields as a dict (name to "
                    f"tensor), got {type(out).__name__}"
                )
        return out

    def _erase(self, x: Any, boxes: Any, ops: list[Any], nchw: bool, epoch: int, batch: int) -> Any:
        import torch

        boxes = boxes.to(x.device, non_blocking=True).long()
        h, w = (x.shape[-2], x.shape[-1]) if nchw else (x.shape[-3], x.shape[-2])
        rows = torch.arange(h, device=x.device)
        cols = torch.arange(w, device=x.device)
        for k, op in enumerate(ops):
            top, left, bh, bw = boxes[:, k, 0], boxes[:, k, 1], boxes[:, k, 2], boxes[:, k, 3]
            in_y = (rows[None, :] >= top[:, None]) & (rows[None, :] < (top + bh)[:, None])
            in_x = (cols[None, :] >= left[:, None]) & (cols[None, :] < (left + bw)[:, None])
            mask = in_y[:, :, None] & in_x[:, None, :]  # [N, H, W]
            mask = mask[:, None] if nchw else mask[..., None]
            if op.value == "random":
                g = torch.Generator(device=x.device)
                g.manual_seed(_seed(self.seed, epoch, batch, k) & ((1 << 63) - 1))
                fill = torch.randn(x.shape, generator=g, device=x.device, dtype=torch.float32).to(x.dtype)
            else:
                key = (tuple(op.value), x.device, x.dtype, nchw)
                fill = self._fills.get(key)
                if fill is None:
                    shape = (1, 3, 1, 1) if nchw else (1, 1, 1, 3)
                    fill = torch.tensor(op.value, dtype=torch.float32).view(shape).to(x.device, x.dtype)
                    self._fills[key] = fill
            x = torch.where(mask, fill, x)
        return x

    def _mix(self, out: dict[str, Any], epoch: int, batch: int) -> None:
        import torch

        rng = random.Random(_seed(self.seed, epoch, batch, 0x6D6978))
        u = rng.random()
        acc, k = 0.0, len(self.mix) - 1
        for i, p in enumerate(self.mix_p):
            acc += p
            if u < acc:
                k = i
                break
        op = self.mix[k]
        images, labels = out[self.mixed_view], out["label"]
        lam = rng.betavariate(op.alpha, op.alpha)
        if not images.is_floating_point():
            raise ValueError(f"{type(op).__name__}: mixes float images; end the transform with Normalize")
        if isinstance(op, MixUp):
            mixed = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
        else:
            # The images are NCHW after normalisation.
            h, w = images.shape[-2], images.shape[-1]
            r_x, r_y = rng.randrange(w), rng.randrange(h)
            r = 0.5 * math.sqrt(1.0 - lam)
            r_w_half, r_h_half = int(r * w), int(r * h)
            x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
            x2, y2 = min(r_x + r_w_half, w), min(r_y + r_h_half, h)
            mixed = images.clone()
            mixed[..., y1:y2, x1:x2] = images.roll(1, 0)[..., y1:y2, x1:x2]
            lam = 1.0 - (x2 - x1) * (y2 - y1) / (w * h)
        onehot = torch.nn.functional.one_hot(labels.long(), op.num_classes).to(torch.float32)
        out[self.mixed_view] = mixed
        out["label"] = onehot.roll(1, 0).mul_(1.0 - lam).add_(onehot.mul(lam))
