"""The augmentation recipes the end-to-end benchmarks compare, written once for both loaders.

- ``rrc``: RandomResizedCrop + RandomHorizontalFlip + Normalize;
- ``full``: torchvision's ``ta_wide`` reference recipe: RandomResizedCrop + RandomHorizontalFlip +
  TrivialAugmentWide + Normalize + RandomErasing(``erasing``), erasing after normalisation;
- ``ta``, ``ra``, ``aa``: RandomResizedCrop + RandomHorizontalFlip + TrivialAugmentWide,
  RandAugment(2, 9) or AutoAugment (ImageNet policy) + Normalize (no erasing: DALI's policies
  beside them have none).

``tv_recipe`` is the torchvision v2 pipeline a DataLoader's workers run on PIL images (floats out);
``rf_recipe`` the same ops as a ``ringfeed.Compose``. (Iterating a loader epoch after epoch is
``harness.epochs``.)
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision.transforms import v2

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
RECIPES = ("rrc", "full", "ta", "ra", "aa")
#: The policy each recipe adds after the crop and flip.
POLICY = {"full": "ta", "ta": "ta", "ra": "ra", "aa": "aa"}


def tv_recipe(name: str, size: int = 224, erasing: float = 0.25) -> v2.Compose:
    if name not in RECIPES:
        raise ValueError(f"recipe {name!r} is not one of {', '.join(RECIPES)}")
    ops: list[Any] = [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
    policy = POLICY.get(name)
    if policy is not None:
        ops.append({"ta": v2.TrivialAugmentWide, "ra": lambda: v2.RandAugment(2, 9), "aa": v2.AutoAugment}[policy]())
    ops += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    if name == "full":
        ops.append(v2.RandomErasing(erasing))
    return v2.Compose(ops)


def rf_recipe(name: str, size: int = 224, erasing: float = 0.25) -> Any:
    import ringfeed

    ops: list[Any] = [ringfeed.RandomResizedCrop(size), ringfeed.RandomHorizontalFlip()]
    policy = POLICY.get(name)
    if policy is not None:
        ops.append(
            {
                "ta": ringfeed.TrivialAugmentWide,
                "ra": lambda: ringfeed.RandAugment(2, 9),
                "aa": ringfeed.AutoAugment,
            }[policy]()
        )
    ops.append(ringfeed.Normalize(MEAN, STD))
    if name == "full":
        ops.append(ringfeed.RandomErasing(erasing))
    return ringfeed.Compose(ops)
