"""ringfeed: the Python client of the ringfeed data-loading server.

Two parts. The loader: ``Loader`` connects to ``ringfeed serve`` over a Unix socket
(``proto/control.md``), maps the shared-memory ring the server decodes batches into
(``proto/ring.md``), and hands batches to PyTorch without copies. The packed-format reader:
``PackedDataset`` gives O(1) random access to the datasets ``ringfeed pack`` writes
(``proto/shard.md``), and ``verify`` checks every byte in the spec's order.

``import ringfeed`` needs only the standard library; the loader imports torch when it needs it
(numpy arrays stand in for tensors on the CPU when torch is absent).

Layout (layers import downward only: ``formats`` and ``wire`` never import ``gpu`` or the loader,
``gpu`` never imports the loader; ``tests/test_layout.py`` checks it):

- ``loader``: ``Loader``, a stream with the image kind's batch maker (and ``TokenLoader`` again).
- ``_tokens``: ``TokenLoader``, the same stream with the token kind's (``proto/control.md``,
  "Token streams"): ``TokenBatches``, the token options.
- ``_base``: ``BaseLoader``, what both loaders share: iteration, epochs, ``state_dict``, ``stats``.
- ``_stream``: ``Stream``, one stream whatever its kind: connection, ``open``, the ring, slot
  ownership, runs, resume, reconnecting; ``BatchMaker``, what a sample kind adds to it.
- ``_images``: the image kind: ``ImageOptions``, ``ImageBatches`` (fields, batch ops, hybrid decode).
- ``_options``: the option objects (``Server``, ``Tuning``, ``ShardBlocks``, ``GPUDecode``, the
  sources ``LMDB``, ``WebDataset`` and ``Parquet``), ``StreamConfig``, the checks every loader argument goes
  through, and the deprecated keywords' translation.
- ``_meter``: the wait and compute per step, for ``stats()`` and the server's autotuner.
- ``_transforms``: the ops (torchvision's names), ``Compose``, ``Views``, ``MixUp``/``CutMix``.
- ``_batch``: what runs on a batch after the ring: normalisation, erasing, MixUp/CutMix.
- ``_errors``: ``RingfeedError`` and its subclasses (a leaf every layer may import).
- ``wire``: what crosses to the server: the control protocol (``Connection``), the ring's layout
  (``Segment``), the sidecar, ``snapshot``.
- ``gpu``: pinned host-to-GPU copies on a side stream, fused normalisation, hybrid decode's
  finishing (nvJPEG, nvImageCodec, the Triton kernels). Imported only when a stream needs it.
- ``formats``: the on-disk formats: the packed format (``PackedDataset``, ``verify``), the token
  dataset format (reader, ``verify_tokens``, Megatron reader), CRC-32C.
- ``bench``, ``lightning``, ``_preview``: ``ringfeed bench``, the Lightning ``DataModule``, and
  ``preview`` (a recipe's draws on one image, by a private sidecar).

``_crc32c``, ``_tokfile``, ``_sidecar``, ``_hybrid``, ``_nvjpeg``, ``_finish_kernel`` and
``_chroma_kernel`` are the old names of modules in ``formats``, ``wire`` and ``gpu``, kept for
``benches/`` and ``scripts/`` that import them.
"""

from ._detection import detection_targets, unpack_instance_masks
from ._errors import ProtocolError, RingfeedError, ServerDiedError, ServerError, TimeoutError
from ._options import LMDB, GPUDecode, Meta, Parquet, Server, ShardBlocks, Targets, Text, Tuning, WebDataset
from ._preview import Preview, preview
from ._tokens import TokenLoader
from ._transforms import (
    AspectBuckets,
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
    RandomIoUCrop,
    RandomPosterize,
    RandomResizedCrop,
    RandomSolarize,
    RandomVerticalFlip,
    RandomZoomOut,
    Resize,
    SanitizeBoundingBoxes,
    ScaleJitter,
    Transform,
    TrivialAugmentWide,
    View,
    Views,
)
from ._version import __version__
from .formats.reader import PackedDataset, Sample
from .formats.shard import FormatError
from .formats.verify import verify
from .loader import Loader
from .wire.observe import snapshot
from .wire.protocol import PROTOCOL

__all__ = [
    "LMDB",
    "PROTOCOL",
    "AspectBuckets",
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "Flip",
    "FormatError",
    "GPUDecode",
    "GaussianBlur",
    "Loader",
    "Meta",
    "MixUp",
    "Normalize",
    "Op",
    "PackedDataset",
    "Parquet",
    "Preview",
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
    "RandomIoUCrop",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomSolarize",
    "RandomVerticalFlip",
    "RandomZoomOut",
    "Resize",
    "RingfeedError",
    "Sample",
    "SanitizeBoundingBoxes",
    "ScaleJitter",
    "Server",
    "ServerDiedError",
    "ServerError",
    "ShardBlocks",
    "Targets",
    "Text",
    "TimeoutError",
    "TokenLoader",
    "Transform",
    "TrivialAugmentWide",
    "Tuning",
    "View",
    "Views",
    "WebDataset",
    "__version__",
    "detection_targets",
    "preview",
    "snapshot",
    "unpack_instance_masks",
    "verify",
]
