"""The on-disk formats: the packed dataset (``proto/shard.md``) and the token dataset (``proto/tokens.md``).

Plain data: readers, verifiers and the ``struct`` layouts they share, over memory-mapped files.
Nothing here talks to a server or touches a GPU, so ``ringfeed verify`` and ``PackedDataset``
work without one.

Layout:

- ``crc32c``: pure-Python CRC-32C, the formats' checksum.
- ``shard``: the packed format itself: magics, versions, ``struct`` layouts, ``FormatError``.
- ``reader``: ``PackedDataset`` and ``Sample``.
- ``verify``: ``verify``, every byte in the spec's order.
- ``tokfile``: the token dataset format: reader, ``verify_tokens``, Megatron and flat readers.

Imports: the bottom layer. These modules import the standard library, numpy (``tokfile``) and
one another, nothing else of ``ringfeed`` (not ``wire``, ``gpu`` or the loader);
``tests/test_layout.py`` checks it.
"""
