"""Getting batches off the ring: normalisation, and pinned host-to-GPU copies (needs torch).

``DESIGN.md`` §1 and §4: the GPU reads the ring by DMA, and float conversion happens on the GPU,
after the copy, because uint8 is 4x fewer bytes over PCIe.

Invariants of ``CudaCopier``:

- The whole segment is registered once as pinned memory (``cudaHostRegister``) when the ring is
  opened, and unregistered once, after every copy that reads it has completed, before the segment
  is unmapped.
- Each batch is copied on a dedicated side stream with ``non_blocking=True``. A ``copied`` event
  is recorded right after the copies: the slot is released only once that event has completed
  (``proto/ring.md`` rule 5), never because the consumer is done with its GPU tensors (those are
  copies the ring no longer backs).
- The consumer's current stream waits on a ``done`` event (after the optional normalisation), so
  the training step sees complete data without the host ever blocking; the output tensors are
  marked with ``record_stream`` so the caching allocator does not hand their memory to the side
  stream while the consumer still reads it.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

from .._errors import RingfeedError

__all__ = ["CudaCopier", "Normalizer"]


class Normalizer:
    """``(x / 255 - mean) / std`` for uint8 RGB images, in one fused kernel, as ``channels_last`` floats.

    ``mean`` and ``std`` are on the 0..1 scale (torchvision's ``Normalize`` after ``ToTensor``).
    The result has the logical shape ``[N, 3, H, W]`` whichever ring layout the images come in,
    with ``channels_last`` strides (what convolutions on GPUs want). It is computed as one
    ``addcmul`` (``x * scale + bias`` in float32, cast to ``dtype`` as it is written).
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: Any, layout: str) -> None:
        import torch

        mean_t, std_t = _channels("mean", mean), _channels("std", std)
        if any(s <= 0 for s in std_t):
            raise ValueError(f"normalize: every std must be positive, got {list(std)}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(
                f"dtype must be a floating torch dtype (torch.float32, torch.bfloat16, ...), got {dtype!r}"
            )
        self.dtype = dtype
        self.layout = layout
        scale = [1.0 / (255.0 * s) for s in std_t]
        bias = [-m / s for m, s in zip(mean_t, std_t, strict=True)]
        self._scale = torch.tensor(scale, dtype=torch.float32).view(1, 3, 1, 1)
        self._bias = torch.tensor(bias, dtype=torch.float32).view(1, 3, 1, 1)
        self._on: dict[Any, tuple[Any, Any]] = {}

    def __call__(self, images: Any) -> Any:
        import torch

        x = images.permute(0, 3, 1, 2) if self.layout == "NHWC" else images
        consts = self._on.get(x.device)
        if consts is None:
            consts = self._on[x.device] = (self._scale.to(x.device), self._bias.to(x.device))
        scale, bias = consts
        out = torch.empty(x.shape, dtype=self.dtype, device=x.device, memory_format=torch.channels_last)
        return torch.addcmul(bias, x, scale, out=out)


def _channels(name: str, value: Sequence[float]) -> list[float]:
    try:
        values = [float(v) for v in value]
    except (TypeError, ValueError):
        values = []
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"normalize: {name} must be 3 finite numbers (one per RGB channel), got {value!r}")
    return values


class CudaCopier:
    """Pins one ring segment and copies held slots to one GPU on a side stream.

    Args:
        segment: the mapped ring (``wire.ring.Segment`` with torch views).
        device: the target ``torch.device`` (type ``cuda``, with an index).

    What runs on the copies (normalisation, erasing, MixUp/CutMix) is ``copy``'s ``post``.
    """

    def __init__(self, segment: Any, device: Any) -> None:
        import torch

        self.device = device
        #: ``(copied event, slot)`` of copies whose slot is not released yet, oldest first.
        self.pending: deque[tuple[Any, int]] = deque()
        self._cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        whole = segment.as_uint8()
        #: The mapping's address and length, as registered.
        self.ptr, self.size = whole.data_ptr(), whole.numel()
        del whole
        with torch.cuda.device(device):
            # The side stream: copies, GPU decode, the finishing kernel and the batch ops, at
            # PyTorch's default priority. The device's highest (its kernels jumping the model's
            # queued blocks) fed ResNet-18 no faster (benches/results/2026-12-02-h200-tiled, "prio").
            self.stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            status = int(self._cudart.cudaHostRegister(self.ptr, self.size, 0))
        #: Whether the registration succeeded; without it copies still work, from pageable memory.
        self.pinned = status == 0
        if not self.pinned:
            warnings.warn(
                f"ringfeed: cudaHostRegister of the {self.size}-byte ring failed (CUDA error {status}); host-to-GPU "
                f"copies fall back to pageable memory and will be slower",
                RuntimeWarning,
                stacklevel=3,
            )

    def copy(self, views: dict[str, Any], slot: int, post: Any = None, finish: Any = None) -> dict[str, Any]:
        """Starts copying ``views`` (slices of slot ``slot``) to the GPU; returns the GPU tensors.

        ``finish`` (hybrid decode: the GPU samples' decode and geometry, which read the slot's
        encoded bytes) runs on the side stream after the copy and before the event that releases
        the slot; ``post`` (the batch ops: normalisation, erasing, MixUp/CutMix) after it, on the
        GPU tensors. The host returns at once. The slot joins ``pending`` and is handed back by
        ``completed`` once everything that reads it has finished.
        """
        import torch

        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            out = {name: v.to(self.device, non_blocking=True) for name, v in views.items()}
            if finish is not None:
                out = finish(out, self.stream)
            # SYNC POINT: the slot is released once this event has completed: every read of the
            # slot (the copies, and the GPU decoder's reads of its encoded bytes) is queued before it.
            copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            copied.record(self.stream)
            if post is not None:
                out = post(out)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        consumer.wait_event(done)
        for t in out.values():
            t.record_stream(consumer)
        self.pending.append((copied, slot))
        return out

    def completed(self) -> list[int]:
        """Slots whose copies have finished, removed from ``pending`` (never blocks)."""
        done = []
        while self.pending and self.pending[0][0].query():
            done.append(self.pending.popleft()[1])
        return done

    def wait_oldest(self) -> int:
        """Blocks until the oldest pending copy has finished; returns its slot."""
        event, slot = self.pending.popleft()
        event.synchronize()
        return slot

    def wait_all(self) -> list[int]:
        """Blocks until every pending copy has finished; returns their slots."""
        self.stream.synchronize()
        slots = [slot for _, slot in self.pending]
        self.pending.clear()
        return slots

    def close(self) -> None:
        """Waits for every copy, then unregisters the ring (before the caller unmaps it). Idempotent."""
        if self.ptr == 0:
            return
        try:
            self.wait_all()
        finally:
            ptr, self.ptr = self.ptr, 0
            if self.pinned:
                status = int(self._cudart.cudaHostUnregister(ptr))
                if status != 0:
                    raise RingfeedError(f"cudaHostUnregister of the ring failed (CUDA error {status})")
