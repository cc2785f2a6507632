"""``ringfeed.preview``: what a pipeline does to one image, drawn by the server's own ops.

The image is served ``n`` times as an image folder of ``n`` files (in place, no pack step) by a
private sidecar, one batch of ``n``: sample ``i`` draws its augmentation from ``(seed, epoch, i)``,
exactly as sample ``i`` of a dataset would, so the ``n`` results are ``n`` different draws of the
recipe, pixel for pixel what training would see.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Preview", "preview"]

#: Most draws one preview makes (one batch).
MAX_PREVIEW = 256


class Preview(NamedTuple):
    """The results of ``ringfeed.preview``."""

    #: ``[n, H, W, 3]`` uint8 (``[n, 3, H, W]`` with ``layout="NCHW"``; float ``[n, 3, H, W]``
    #: when the pipeline ends in ``Normalize``), one draw per row.
    images: Any
    #: ``[n, 5]`` int32, per draw, the crop in the decoded image's coordinates and whether it was
    #: flipped, as the ``crop`` field (``proto/ring.md``): ``top, left, height, width, flipped``.
    crops: Any


def preview(pipeline: Any, image: Any, *, seed: int = 0, n: int = 8, epoch: int = 0, layout: str = "NHWC") -> Preview:
    """Runs ``pipeline`` (a ``ringfeed.Compose`` or op) on ``image`` ``n`` times, as the server
    would for ``n`` samples of epoch ``epoch`` with ``seed``, and returns the results.

    Args:
        pipeline: the per-sample recipe, as given to ``Loader(transform=...)``; it must end in a
            fixed size (a crop or a resize to ``(h, w)``).
        image: a path to an image file (JPEG, PNG, ... as the server decodes them, bytes as they
            are) or a ``PIL.Image.Image`` (served as a lossless PNG).
        seed: the loader's seed; ``epoch``: the epoch whose draws to show.
        n: how many draws, ``1 ..= 256``.
        layout: ``"NHWC"`` or ``"NCHW"``.

    Starts a private sidecar for the call (about a second) and stops it after.

    Example, in a notebook::

        p = ringfeed.preview(ringfeed.Compose([ringfeed.RandomResizedCrop(224), ringfeed.TrivialAugmentWide()]),
                             "cat.jpg", n=8)
        torchvision.utils.make_grid(p.images.permute(0, 3, 1, 2), nrow=4)
    """
    from ._options import Server
    from .loader import Loader

    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_PREVIEW:
        raise ValueError(f"n must be an integer in 1..={MAX_PREVIEW}, got {n!r}")
    with tempfile.TemporaryDirectory(prefix="ringfeed-preview-") as tmp:
        root = Path(tmp) / "images"
        (root / "preview").mkdir(parents=True)
        first = root / "preview" / f"0{_suffix(image)}"
        _write(image, first)
        for i in range(1, n):
            try:
                os.link(first, first.with_stem(str(i)))
            except OSError:
                shutil.copyfile(first, first.with_stem(str(i)))
        with Loader(
            root,
            n,
            pipeline,
            seed=seed,
            fields=["index", "crop"],
            layout=layout,
            server=Server(socket=str(Path(tmp) / "ringfeed.sock"), spawn=True),
        ) as ld:
            ld.set_epoch(epoch)
            batch = next(iter(ld))
            # Indexing by the order copies the batch out of the ring.
            order = batch["index"].argsort()
            return Preview(batch["image"][order], batch["crop"][order])


def _suffix(image: Any) -> str:
    if isinstance(image, (str, os.PathLike)):
        return Path(image).suffix or ".img"
    return ".png"


def _write(image: Any, to: Path) -> None:
    if isinstance(image, (str, os.PathLike)):
        shutil.copyfile(image, to)
        return
    save = getattr(image, "save", None)
    if save is None:
        raise TypeError(f"image must be a path or a PIL.Image.Image, got {type(image).__name__}")
    buf = io.BytesIO()
    image.convert("RGB").save(buf, "PNG")
    to.write_bytes(buf.getvalue())
