"""Per-image detection targets from a batch's padded target fields (docs/detection.md).

The ring carries targets padded to ``max_boxes`` (ring.md), with instance masks eight to a byte
(``instance_masks`` ``uint8 [N, ceil(max_boxes / 8), H, W]``: box ``k``'s mask is bit ``k % 8`` of
plane ``k // 8``), because a ring field has one fixed size per sample and ``uint8 [max_boxes, H,
W]`` would be eight times larger. ``detection_targets`` turns a batch into what torchvision's
detection models take: one dict per image with ``boxes``, ``labels`` and, when the batch has
them, ``masks`` (``uint8 [M, H, W]``, 0 or 1, ``tv_tensors.Mask``'s layout) and ``keypoints``
(``float32 [M, K, 3]``). Everything stays on the batch's device; unpacking is one shift per box.
"""

from __future__ import annotations

from typing import Any

__all__ = ["detection_targets", "unpack_instance_masks"]


def unpack_instance_masks(planes: Any, count: int) -> Any:
    """The first ``count`` masks of one image's bit planes ``uint8 [P, H, W]``, as ``uint8 [count,
    H, W]`` of 0 and 1 (box ``k`` is bit ``k % 8`` of plane ``k // 8``)."""
    import torch

    k = torch.arange(count, device=planes.device)
    shifts = (k % 8).to(torch.uint8).view(-1, 1, 1)
    return torch.bitwise_and(torch.bitwise_right_shift(planes[k // 8], shifts), 1)


def detection_targets(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per image of ``batch`` (a loader's dict batch with ``boxes``, ``box_labels`` and
    ``box_count``): ``boxes`` ``[M, 4]``, ``labels`` ``[M]``, and ``masks`` ``uint8 [M, H, W]`` /
    ``keypoints`` ``[M, K, 3]`` when the batch has ``instance_masks`` / ``keypoints``; ``M`` is
    the image's ``box_count``."""
    if "box_count" not in batch:
        raise KeyError("detection_targets: the batch has no box_count; open the loader with Targets(boxes=...)")
    out = []
    for i, n in enumerate(batch["box_count"].tolist()):
        t = {"boxes": batch["boxes"][i, :n], "labels": batch["box_labels"][i, :n]}
        if "instance_masks" in batch:
            t["masks"] = unpack_instance_masks(batch["instance_masks"][i], n)
        if "keypoints" in batch:
            t["keypoints"] = batch["keypoints"][i, :n]
        out.append(t)
    return out
