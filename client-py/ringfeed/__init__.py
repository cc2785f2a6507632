"""ringfeed: the Python client of the ringfeed data-loading server.

Two parts. The loader: ``Loader`` connects to ``ringfeed serve`` over a Unix socket
(``proto/control.md``), maps the shared-memory ring the server decodes batches into
(``proto/ring.md``), and hands batches to PyTorch without copies. The packed-format reader:
``PackedDataset`` gives O(1) random access to the datasets ``ringfeed pack`` writes
(``proto/shard.md``), and ``verify`` checks every byte in the spec's order.

``import ringfeed`` needs only the standard library; the loader imports torch when it needs it
(numpy arrays stand in for tensors on the CPU when torch is absent).

Layout:

- ``loader``: ``Loader``, one stream: iteration, slot ownership, epochs, ``state_dict``.
- ``_tokens``: ``TokenLoader``, a ``Loader`` of token windows (``proto/control.md``, "Token streams").
- ``_tokfile``: the token dataset format (``proto/tokens.md``): reader, ``verify_tokens``, Megatron reader.
- ``_transforms``: the ops (torchvision's names), ``Compose``, ``Views``, ``MixUp``/``CutMix``.
- ``_batch``: what runs on a batch after the ring: normalisation, erasing, MixUp/CutMix.
- ``_protocol``: the control protocol: version, framing, ``Connection``.
- ``_ring``: the ring's layout: ``struct`` layouts, dtype codes, ``Segment`` (the mapping).
- ``_device``: pinned host-to-GPU copies on a side stream, fused normalisation.
- ``_sidecar``: the default socket, starting ``ringfeed serve`` when nothing listens.
- ``_errors``: ``RingfeedError`` and its subclasses.
- ``_shard``: the packed format itself: magics, versions, ``struct`` layouts, ``FormatError``.
- ``_crc32c``: pure-Python CRC-32C.
- ``_reader``: ``PackedDataset`` and ``Sample``.
- ``_verify``: ``verify``.
"""

from ._errors import ProtocolError, RingfeedError, ServerDiedError, ServerError, TimeoutError
from ._observe import snapshot
from ._protocol import PROTOCOL
from ._reader import PackedDataset, Sample
from ._shard import FormatError
from ._tokens import TokenLoader
from ._transforms import (
    AutoAugment,
    CenterCrop,
    ColorJitter,
    Compose,
    CutMix,
    Flip,
    GaussianBlur,
    MixUp,
    Normalize,
    Op,
    RandAugment,
    RandomAdjustSharpness,
    RandomApply,
    RandomAutocontrast,
    RandomChoice,
    RandomCrop,
    RandomEqualize,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomInvert,
    RandomPosterize,
    RandomResizedCrop,
    RandomSolarize,
    RandomVerticalFlip,
    Resize,
    Transform,
    TrivialAugmentWide,
    View,
    Views,
)
from ._verify import verify
from ._version import __version__
from .loader import Loader

__all__ = [
    "PROTOCOL",
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "Flip",
    "FormatError",
    "GaussianBlur",
    "Loader",
    "MixUp",
    "Normalize",
    "Op",
    "PackedDataset",
    "ProtocolError",
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
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomSolarize",
    "RandomVerticalFlip",
    "Resize",
    "RingfeedError",
    "Sample",
    "ServerDiedError",
    "ServerError",
    "TimeoutError",
    "TokenLoader",
    "Transform",
    "TrivialAugmentWide",
    "View",
    "Views",
    "__version__",
    "snapshot",
    "verify",
]
