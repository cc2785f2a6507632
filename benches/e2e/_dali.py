"""NVIDIA DALI's standard ResNet-50 pipelines, the peer the GPU benchmarks measure against.

``batches``, training: ``fn.readers.file`` (shuffled) → ``fn.decoders.image_random_crop(device="mixed")``
(the hardware JPEG decoder) → ``fn.resize(224, antialias)`` → ``fn.crop_mirror_normalize`` (fp16, CHW,
a random mirror), as DALI's ResNet-50 example builds it. ``eval_batches``, evaluation (torchvision's
``Resize(256)`` + ``CenterCrop(224)``): ``fn.readers.file`` (in order) → ``fn.decoders.image(device="mixed")``
→ ``fn.resize(resize_shorter=256, antialias)`` → ``fn.crop_mirror_normalize`` (a centred 224 crop,
fp16, CHW, no mirror). Both yield ``(images, labels)`` on the GPU for ever, images as ``dtype``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

#: ImageNet's mean and std on DALI's 0..255 scale.
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def _run(p: Any, dtype: Any) -> Iterator[tuple[Any, Any]]:
    """Builds pipeline ``p`` (its reader named ``reader``) and yields its batches for ever."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    p.build()
    it = DALIGenericIterator(
        p, ["x", "y"], reader_name="reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True
    )
    while True:
        for out in it:
            yield out[0]["x"].to(dtype), out[0]["y"].squeeze(-1).long()


def batches(
    images: Path,
    threads: int,
    batch: int,
    dtype: Any = torch.bfloat16,
    shard: tuple[int, int] = (0, 1),
    recipe: str = "rrc",
) -> Iterator[tuple[Any, Any]]:
    """``shard``: ``(rank, world)``, the reader's share of the files (DDP: one pipeline per rank).
    ``recipe="full"`` (or ``"ta"``) adds DALI's own ``trivial_augment_wide`` (on the GPU, after the
    resize, as DALI's documentation places it for a fixed-size output; the pipeline is built with
    ``enable_conditionals``), ``"ra"`` its ``rand_augment(n=2, m=9)``, ``"aa"`` its
    ``auto_augment`` (ImageNet policy). DALI has no RandomErasing of torchvision's kind, so its
    "full" recipe leaves erasing out, which costs it nothing (ringfeed's erasing runs on the GPU
    too)."""
    from nvidia.dali import fn, pipeline_def, types

    conditionals = recipe != "rrc"

    @pipeline_def(
        batch_size=batch,
        num_threads=threads,
        device_id=torch.cuda.current_device(),
        seed=0,
        enable_conditionals=conditionals,
    )
    def pipe() -> Any:
        jpegs, labels = fn.readers.file(
            file_root=str(images), random_shuffle=True, shard_id=shard[0], num_shards=shard[1], name="reader"
        )
        img = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB)
        img = fn.resize(img, resize_x=224, resize_y=224, antialias=True)
        if recipe in ("full", "ta"):
            from nvidia.dali.auto_aug import trivial_augment

            img = trivial_augment.trivial_augment_wide(img)
        elif recipe == "ra":
            from nvidia.dali.auto_aug import rand_augment

            img = rand_augment.rand_augment(img, n=2, m=9)
        elif recipe == "aa":
            from nvidia.dali.auto_aug import auto_augment

            img = auto_augment.auto_augment(img)
        img = fn.crop_mirror_normalize(
            img,
            dtype=types.FLOAT16,
            output_layout="CHW",
            mean=MEAN,
            std=STD,
            mirror=fn.random.coin_flip(),
        )
        return img, labels.gpu()

    yield from _run(pipe(), dtype)


def eval_batches(
    images: Path, threads: int, batch: int, dtype: Any = torch.bfloat16, shard: tuple[int, int] = (0, 1)
) -> Iterator[tuple[Any, Any]]:
    """The evaluation pipeline; ``shard`` as in :func:`batches`."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=torch.cuda.current_device(), seed=0)
    def pipe() -> Any:
        jpegs, labels = fn.readers.file(
            file_root=str(images), random_shuffle=False, shard_id=shard[0], num_shards=shard[1], name="reader"
        )
        img = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        img = fn.resize(img, resize_shorter=256, antialias=True)
        # crop_pos_x/y default to 0.5: the crop is centred, as torchvision's CenterCrop.
        img = fn.crop_mirror_normalize(
            img,
            crop=(224, 224),
            dtype=types.FLOAT16,
            output_layout="CHW",
            mean=MEAN,
            std=STD,
            mirror=0,
        )
        return img, labels.gpu()

    yield from _run(pipe(), dtype)
