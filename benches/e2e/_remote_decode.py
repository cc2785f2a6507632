"""What `remote.py`'s DataLoader workers run, in a module of its own so that spawned workers
(LitData starts them with `spawn`) can import it: PIL decode, then torchvision's
RandomResizedCrop + horizontal flip, as a uint8 tensor."""

from __future__ import annotations

import io
from typing import Any


class Decode:
    """Decodes a sample `{"image": bytes, "label": int}` into `(uint8 CHW tensor, label)`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.tf: Any = None

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        from PIL import Image

        if self.tf is None:
            from torchvision.transforms import v2

            self.tf = v2.Compose(
                [v2.RandomResizedCrop(self.size, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor()]
            )
        return self.tf(Image.open(io.BytesIO(sample["image"])).convert("RGB")), int(sample["label"])


def lit_dataset(size: int, *args: Any, **kw: Any) -> Any:
    """LitData's StreamingDataset, each item decoded and transformed."""
    return _lit_class()(size, *args, **kw)


def _lit_class() -> Any:
    import litdata
    from litdata.streaming import downloader

    # LitData's obstore client options refuse a plain-HTTP endpoint (the local server); allow it,
    # in every process that downloads (this runs where the dataset is unpickled, in each worker).
    opts = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(opts, dict):
        opts["allow_http"] = "true"

    global LitDecoded
    if "LitDecoded" not in globals():

        class LitDecoded(litdata.StreamingDataset):
            def __init__(self, size: int, *args: Any, **kw: Any) -> None:
                super().__init__(*args, **kw)
                self.decode = Decode(size)

            def __getitem__(self, index: Any) -> Any:
                return self.decode(super().__getitem__(index))

        globals()["LitDecoded"] = LitDecoded
    return globals()["LitDecoded"]


def __getattr__(name: str) -> Any:
    # A spawned worker unpickling `_remote_decode.LitDecoded` makes the class on first use.
    if name == "LitDecoded":
        return _lit_class()
    raise AttributeError(name)
