"""ringfeed: the Python client of the ringfeed data-loading server.

This part reads the packed dataset format (``proto/shard.md``) that ``ringfeed pack`` writes:
``PackedDataset`` gives O(1) random access to samples as zero-copy views of memory-mapped shards,
and ``verify`` checks every byte in the spec's order. Stdlib only.

Layout:

- ``_shard``: the format itself: magics, versions, ``struct`` layouts, ``FormatError``.
- ``_crc32c``: pure-Python CRC-32C.
- ``_reader``: ``PackedDataset`` and ``Sample``.
- ``_verify``: ``verify``.
"""

from ._reader import PackedDataset, Sample
from ._shard import FormatError
from ._verify import verify

__version__ = "0.1.0"

__all__ = ["FormatError", "PackedDataset", "Sample", "__version__", "verify"]
