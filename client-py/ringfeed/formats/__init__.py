"""The on-disk formats: the packed dataset (``proto/shard.md``, ``proto/targets.md``), the token dataset.

Plain data: readers, verifiers and the ``struct`` layouts they share, over memory-mapped files.
Nothing here talks to a server or touches a GPU, so ``ringfeed verify`` and ``PackedDataset``
work without one.

Layout:

- ``crc32c``: pure-Python CRC-32C, the formats' checksum.
- ``shard``: the packed format itself: magics, versions, ``struct`` layouts, ``FormatError``.
- ``reader``: ``PackedDataset`` and ``Sample``.
- ``verify``: ``verify``, every byte in the spec's order.
- ``tokfile``: the token dataset format: reader, ``verify_tokens``, Megatron and flat readers.
- ``targets``: a packed dataset's ``targets.rft`` (``proto/targets.md``): ``TargetsFile``,
  ``verify_targets``.

Imports: the bottom layer. These modules import the standard library, numpy (``tokfile``) and
one another, nothing else of ``ringfeed`` (not ``wire``, ``gpu`` or the loader);
``tests/test_layout.py`` checks it.
"""
