"""``ringfeed.Loader``: batches from a ringfeed server, as PyTorch tensors, without copies.

A loader is one stream (``proto/control.md``, "Session"; ``_stream.Stream``: the connection, the
ring, slot ownership, runs, resume, reconnecting) and the image kind's batch maker
(``_images.ImageBatches``: the pipeline, the fields, the batch ops, hybrid decode's finishing).
``TokenLoader`` (``_tokens``) is the same stream with the token kind's batch maker; both are
importable from here. The stream connects to the server (starting a sidecar when none listens
and no socket was given), says ``hello``, ``open``\\ s the dataset, maps the ring the server
answers with (``proto/ring.md``), and then, for each iteration, sends ``start {epoch,
first_batch}`` and turns each ``ready`` into a batch.

Ownership (ring.md, "Slot states and ownership"): every ``ready`` makes a slot HELD by this
loader, and every held slot is released exactly once:

- CPU mode: the batch handed out is a zero-copy view of the slot. **A batch is valid until the
  next batch is requested (``hold`` batches stay valid), a new iteration starts, or the loader
  is closed; copy it (``images.clone()``) to keep it longer.** Its slot is released at that
  moment. When an iteration ends early (``break``, a dropped iterator), batches nobody refers to
  any more are released at once, and one the user still holds (the loop variables after a
  ``break``, ``next(iter(loader))``) stays valid until the next iteration or ``close()``, so it
  is never overwritten under the user's eyes. At most ``hold`` batches are alive (default 1).
- CUDA mode: the slot is copied to the GPU on a side stream, and released once the copy's event
  has completed (polled at every batch; awaited when the loader would otherwise wait on the
  server while holding every slot, and at ``close()``). The user never sees ring memory.
- ``ready`` messages of a run the loader no longer wants (an earlier iteration) are released at
  once, unread.

Wait (``stats()``, the server's autotuner): the time inside ``next()`` is ``wait_s``. In CUDA mode
part of it is spent behind the GPU, not waiting for data: in the copy's launches (the copy, the
normalisation, the training stream's wait on it), which block while the GPU's launch queue is full,
and waiting for a copy's event, which queues behind the model's kernels. That part is
``gpu_wait_s``, sent to the server as ``gpu_wait_ns`` (protocol 1.2), which tunes on the rest, the
wait for data (``data_wait_s``; ``_meter``).

End of epoch (``StopIteration``), timeout (``ringfeed.TimeoutError``) and failure
(``ServerError``, ``ServerDiedError``, ``ProtocolError``) are distinct. A non-fatal ``sample``
error ends only the current iteration; the others make the loader unusable, but its
``state_dict()`` still resumes the stream exactly in a new loader.

The loader is not thread-safe: iterate it from one thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._base import BaseLoader, From
from ._images import ImageBatches, ImageOptions
from ._options import (
    LMDB,
    WEBDATASET_OPTIONS,
    GPUDecode,
    Meta,
    Parquet,
    Server,
    ShardBlocks,
    StreamConfig,
    Targets,
    Text,
    Tuning,
    WebDataset,
    dataset_path,
    deprecated,
    legacy_gpu_decode,
    legacy_group,
    legacy_order,
    no_other_keywords,
    refuse_both,
)
from ._tokens import TokenLoader

__all__ = ["Loader", "TokenLoader"]


class Loader(BaseLoader):
    """Batches of a dataset, decoded and transformed by a ringfeed server, as tensors.

    ::

        loader = ringfeed.Loader("/data/imagenet-train", batch_size=256,
                                 transform=ringfeed.Compose([
                                     ringfeed.RandomResizedCrop(224), ringfeed.RandomHorizontalFlip(),
                                     ringfeed.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]),
                                 shuffle=True, drop_last=True, device="cuda")
        for epoch in range(start_epoch, 90):
            loader.set_epoch(epoch)
            for images, labels in loader:
                ...

    The loader connects and opens the stream in the constructor, so a wrong path, batch size or
    transform fails here, with the server's message.

    The everyday settings are keywords; the rest are small option objects, each checked where it
    is written: ``server=ringfeed.Server(...)`` (socket, sidecar, timeouts, reconnecting),
    ``tuning=ringfeed.Tuning(...)`` (slots, threads, prefetch, hold, autotune, log_every),
    ``order=ringfeed.ShardBlocks(...)``, ``gpu_decode=ringfeed.GPUDecode(...)``, and the source
    formats as ``path``: ``ringfeed.LMDB(path, ...)``, ``ringfeed.WebDataset(path, ...)``,
    ``ringfeed.Parquet(path, ...)``. The keywords these replaced (``socket=``, ``threads=``,
    ``lmdb={...}``, ``normalize=``, ...) still work in this release, each with a
    ``DeprecationWarning`` naming its new spelling (docs/from-dataloader.md has the table); passing
    one beside the object that now holds it is a ``ValueError``.

    Args:
        path: the dataset: a packed dataset directory (``ringfeed pack``), an LMDB, an image
            folder (``DIR/class_name/image.jpg``, torchvision's ``ImageFolder`` classes and order)
            or a ``.csv``/``.jsonl`` manifest (as ``ringfeed pack`` reads them); the last two are
            listed by the server at open and read in place (see the README, "Serving files in
            place", for what packing adds). Made absolute here; the server opens it. Or the URL
            ``s3://bucket/prefix`` of a packed dataset on S3-compatible storage (protocol 1.3),
            or ``gs://bucket/prefix`` (Google Cloud Storage), ``az://container/prefix`` (Azure
            Blob Storage; both protocol 1.9), sent unchanged: the server fetches it with its own
            credentials into its shard cache
            (docs/remote.md). A source with options is an object: ``ringfeed.LMDB(path,
            layout=..., labels=..., labels_key=...)`` (docs/lmdb.md) or
            ``ringfeed.WebDataset(path, image=..., label=..., label_key=..., write_index=...)``
            (docs/webdataset.md) or ``ringfeed.Parquet(path, image=..., label=...)`` (protocol
            1.9, docs/parquet.md; a ``.parquet`` file or a directory of them alone is served with
            the default columns ``image`` and ``label``).
        batch_size: samples per batch, ``1 ..= 65536``.
        transform: the per-image pipeline, with torchvision's names and semantics: an op,
            ``ringfeed.Compose([...])`` (e.g. ``Compose([RandomResizedCrop(224),
            RandomHorizontalFlip(), TrivialAugmentWide(), Normalize(mean, std),
            RandomErasing(0.1)])``), or ``ringfeed.Views({...})`` for several outputs per sample
            (multi-crop: batches are then dicts by view name). It must end in a fixed size.
            ``Normalize(mean, std)`` at its end delivers ``(x / 255 - mean) / std`` in ``dtype``,
            shape ``[N, 3, H, W]`` in ``channels_last`` memory format, computed in one fused step
            (on the GPU in CUDA mode, after the copy; on the CPU this makes a copy, so the slot is
            released at once). The protocol 1.1 ``transform`` object as a dict is still accepted.
        batch_transform: ``MixUp(...)``, ``CutMix(...)`` or ``RandomChoice([MixUp(...),
            CutMix(...)])``, applied to each batch after normalisation (labels become soft
            one-hot floats), seeded by ``(seed, epoch, batch)``; or any callable of your own,
            ``f(fields) -> fields`` on the batch's fields by name (``{"image": ..., "label": ...,
            ...}``, tensors on the batch's device, after the built-in batch ops), whose result is
            the batch the loop gets.
        shuffle: a new permutation of the dataset every epoch (seeded by ``seed`` and the epoch;
            call ``set_epoch`` each epoch, as with ``DistributedSampler``). Default ``False``, as
            ``torch.utils.data.DataLoader``'s: pass ``shuffle=True`` for training.
        seed: seeds the order and every sample's augmentation, ``0 ..= 2^53 - 1``.
        drop_last: drop the last partial batch of each rank (and cut the permutation to a multiple
            of ``world_size``); without it (the default, as the DataLoader's) the last batch may be
            smaller and the permutation is padded like ``DistributedSampler``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``. ``"cuda"`` means
            ``cuda:$LOCAL_RANK`` under torchrun, else the current CUDA device.
        dtype: the output dtype of normalized images (default ``torch.float32``; e.g.
            ``torch.bfloat16``). Only with ``Normalize`` in the transform.
        rank: this process's rank, ``0 <= rank < world_size``; default ``$RANK`` (torchrun), else 0.
        world_size: number of ranks sharing each epoch; default ``$WORLD_SIZE``, else 1.
        on_error: a sample that cannot be decoded: ``"raise"`` (``ServerError`` with the sample's
            index and key; the iteration ends) or ``"skip"`` (left out, counted in ``stats()``).
            ``ringfeed pack --on-error`` takes the same two words.
        order: the epoch's permutation (protocol 1.3; docs/order.md): ``"global"`` (one shuffle
            of the whole dataset), ``"shard_blocks"`` or ``ringfeed.ShardBlocks(block=...,
            shard=...)`` (shuffle the shards, then the samples within blocks of ``block``
            shards: each batch reads few shards, at some cost in randomness), or ``"auto"`` (the
            default: ``shard_blocks`` for remote sources, ``global`` for local ones, so local
            batches are those of 1.2). ``loader.order`` says which one the server used.
        gpu_decode: hybrid decode (docs/hybrid-decode.md): the server hands a share of each batch
            to this process as JPEG bytes, which it decodes on its GPU (the hardware JPEG decoder
            through nvImageCodec, else ``torchvision.io.decode_jpeg``) and finishes there (crop,
            antialiased resize, flip) beside the CPU-decoded samples. ``"auto"`` (the default):
            on a CUDA device, when a decoder is installed and the pipeline is crops, flips and one
            resize (plus ``Normalize``/``RandomErasing``), with the share set by the autotuner;
            otherwise off, saying why once (``gpu_decode_reason``). A number in ``0 ..= 1`` pins
            the share (and raises ``ValueError`` where it cannot work); ``False`` turns it off.
            ``ringfeed.GPUDecode(share=..., bytes_per_sample=...)`` also sets the room for
            encoded bytes in each slot.
        fields: extra fields to deliver besides ``image`` and ``label``: ``"index"`` (the sample's
            dataset index) and ``"crop"`` (``top, left, height, width, flipped``). With extras,
            batches are dicts by field name instead of ``(images, labels)`` tuples.
        text: text fields of each sample (protocol 1.9; docs/fields.md), from WebDataset members,
            manifest columns or Parquet columns (``"caption"``; ``"meta:caption"``: a struct's
            member): ``ringfeed.Text("txt")`` adds ``text``, a list of ``str``;
            ``ringfeed.Text("json:caption", tokenizer="tokenizer.json", max_length=77)`` adds
            ``text_ids`` (``int32 [N, max_length]``) and ``text_mask`` (``bool``), tokenised in
            the server. One object or a list. Batches are then dicts (``image``, ``label``, the
            fields); tensors go to ``device`` with the batch, lists of ``str`` stay on the host.
        meta: typed metadata fields (protocol 1.9): ``ringfeed.Meta("json", {"aesthetic":
            "float32", "width": "int32", "nsfw": "bool"})`` adds one tensor per key. A missing
            or ill-typed value follows ``on_error``. One object or a list.
        targets: detection and segmentation targets (protocol 1.10; docs/detection.md):
            ``ringfeed.Targets(boxes="stored", mask="stored")`` for a dataset packed with
            ``ringfeed pack --coco --masks``, or WebDataset members
            (``Targets(boxes="json:annotations", max_boxes=100, mask="png")``), moved with the
            image by the pipeline's geometric ops. Batches are then dicts with ``boxes``,
            ``box_labels``, ``box_count`` and/or ``mask`` beside ``image`` and ``label``.
        layout: ``"NHWC"`` (``[N, H, W, 3]``) or ``"NCHW"`` (``[N, 3, H, W]``) uint8 images.
        check_crc: have the server check each packed record's CRC-32C on read.
        server: ``ringfeed.Server(socket=..., spawn=..., spawn_timeout=..., timeout=...,
            reconnect=..., reconnect_timeout=..., on_opening=...)``: how to reach the server (see
            ``ringfeed.Server``). Default ``Server()``: the default socket, a sidecar started when
            nothing listens there, a 60 s timeout, no reconnecting.
        tuning: ``ringfeed.Tuning(autotune=..., threads=..., prefetch=..., slots=..., hold=...,
            log_every=...)``: the ring and the decode threads (see ``ringfeed.Tuning``). Default
            ``Tuning()``: 4 slots, 1 batch held, the autotuner on.

    Losing the server:
        When the server's connection closes under the loader (the server was killed, crashed or
        restarted; ``ServerDiedError``), a loader with ``Server(reconnect=0)`` (the default) raises at once, never
        after a timeout, and ``state_dict()`` resumes exactly in a new loader.

        With ``Server(reconnect=N)``, the loader instead re-establishes the stream itself, inside the
        same iteration: it connects again (when the loader may start a sidecar, a dead one is
        restarted, under the same lock that lets local ranks share one; with an explicit
        ``socket``, it waits up to ``reconnect_timeout`` seconds for a server to listen there
        again), re-opens the stream (checking that the dataset still has the same length and
        batches per epoch) and restarts the epoch at the batch after the last one it delivered.
        Since batches are a pure function of ``(seed, epoch, batch index)``, the iteration
        continues as if nothing happened: every sample of the epoch is delivered exactly once.
        ``N`` bounds the re-establishments in a row without a batch delivered in between, so a
        server that dies on the same batch every time is reported (``ServerDiedError``, after
        ``N`` attempts) instead of being restarted for ever. Each one is logged as a warning on
        the ``ringfeed`` logger and counted in ``stats()["reconnects"]``.

        A server stopped on purpose (SIGTERM or SIGINT) says so with a ``shutdown`` error; that is
        reconnected too, so a sidecar can be restarted under running jobs. Not retried: any other
        ``error`` from the server (``ServerError``), protocol violations, timeouts, a refused
        ``open`` after reconnecting, and failures in the constructor. CPU batches handed out
        before the loss stay readable memory but no longer belong to any stream (copy what you
        keep); in CUDA mode the copies in flight are completed first.

    Raises:
        ValueError: a parameter is out of range (the message names it).
        ServerError: the server refused the stream: ``dataset`` (no dataset at ``path``),
            ``bad_request`` (e.g. a batch size larger than the dataset), ``version``.
        RingfeedError: no server listens and none could be started.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | LMDB | WebDataset | Parquet,
        batch_size: int,
        transform: Any,
        *,
        batch_transform: Any = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        device: Any = "cpu",
        dtype: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "raise",
        order: str | ShardBlocks = "auto",
        gpu_decode: bool | float | str | GPUDecode = "auto",
        fields: Sequence[str] | None = None,
        text: Text | Sequence[Text] | None = None,
        meta: Meta | Sequence[Meta] | None = None,
        targets: Targets | None = None,
        layout: str = "NHWC",
        check_crc: bool = True,
        server: Server | None = None,
        tuning: Tuning | None = None,
        _gpu_backend: str | None = None,
        **deprecated_keywords: Any,
    ) -> None:
        # The keywords of earlier releases, as the option objects that replaced them (one
        # DeprecationWarning each, pointing at the caller's line).
        old = dict(deprecated_keywords)
        server = legacy_group("Loader", old, "server", Server, server, 2)
        tuning = legacy_group("Loader", old, "tuning", Tuning, tuning, 2)
        order, blocks = legacy_order("Loader", old, order, 2)
        gpu = legacy_gpu_decode("Loader", old, gpu_decode, 2)
        source = _legacy_source(old, path)
        normalize = None
        if "normalize" in old:
            normalize = old.pop("normalize")
            deprecated(
                "Loader(normalize=(mean, std))",
                "ringfeed.Normalize(mean, std) at the end of transform (torchvision's spelling; "
                "its output dtype is dtype=)",
                2,
            )
        no_other_keywords("Loader", old)
        # Everything that can be checked without the server is, first.
        cfg = StreamConfig.check(
            dataset_path(source.path if source is not None else path), batch_size, shuffle=shuffle, seed=seed,
            drop_last=drop_last, device=device, rank=rank, world_size=world_size, server=server, tuning=tuning,
            order=order, blocks=blocks,
        )  # fmt: skip
        opts = ImageOptions.check(
            cfg, transform, layout=layout, on_error=on_error, fields=fields, text=text, meta=meta, check_crc=check_crc,
            source=source, targets=targets,
            normalize=normalize, dtype=dtype, batch_transform=batch_transform, gpu_decode=gpu,
            _gpu_backend=_gpu_backend,
        )  # fmt: skip
        self._start(cfg, ImageBatches(opts, cfg.path))

    # The image kind's settings.
    transform = From("_kind.opts")
    #: The pipeline as ``Views`` (``None`` for a protocol 1.1 ``transform`` dict).
    views = From("_kind.opts")
    layout = From("_kind.opts")
    on_error = From("_kind.opts")
    #: Every field the ring carries for this loader: each view's images (and erasing boxes), ``label``, the extras.
    fields = From("_kind.opts")
    check_crc = From("_kind.opts")
    #: The text fields (``ringfeed.Text``), as a tuple.
    text = From("_kind.opts")
    #: The metadata fields (``ringfeed.Meta``), as a tuple.
    meta = From("_kind.opts")
    #: The detection and segmentation targets (``ringfeed.Targets``), or ``None``.
    targets = From("_kind.opts")
    lmdb = From("_kind.opts")
    webdataset = From("_kind.opts")
    parquet = From("_kind.opts")
    order_shard = From("_stream.cfg")
    #: Why hybrid decode is off (``None`` while it is on).
    gpu_decode_reason = From("_kind")
    on_opening = From("_stream.cfg")

    @property
    def order_requested(self) -> str:
        """The ``order`` argument (``order`` is the one the server uses)."""
        return self._stream.cfg.order  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return (
            f"<ringfeed.Loader {self.path!r} batch_size={self.batch_size} rank={self.rank}/{self.world_size} "
            f"device={self.device} ({self._state()})>"
        )


def _legacy_source(old: dict[str, Any], path: Any) -> LMDB | WebDataset | Parquet | None:
    """The source object: ``path`` itself, or one made of ``path`` and the deprecated ``lmdb={...}``
    or ``webdataset={...}`` in ``old``."""
    source = path if isinstance(path, (LMDB, WebDataset, Parquet)) else None
    for key, cls, known in (
        ("lmdb", LMDB, ("layout", "labels", "labels_key")),
        ("webdataset", WebDataset, tuple(WEBDATASET_OPTIONS)),
    ):
        if key not in old:
            continue
        options = old.pop(key)
        deprecated(f"Loader({key}={{...}})", f"path=ringfeed.{cls.__name__}(path, ...)", 3)
        if options is None:
            continue
        if source is not None:
            refuse_both("Loader", f"{key}=", f"path=ringfeed.{type(source).__name__}(...)")
        if not isinstance(options, Mapping):
            raise ValueError(f"{key} must be a dict of options, got {options!r}")
        for k in options:
            if k not in known:
                raise ValueError(f"{key}: unknown option {k!r} (known: {', '.join(known)})")
        source = cls(path, **options)
    return source
