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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._base import BaseLoader, From
from ._images import ImageBatches, ImageOptions
from ._options import StreamConfig, dataset_path
from ._tokens import TokenLoader

__all__ = ["Loader", "TokenLoader"]


class Loader(BaseLoader):
    """Batches of a dataset, decoded and transformed by a ringfeed server, as tensors.

    ::

        loader = ringfeed.Loader("/data/imagenet-train", batch_size=256,
                                 transform=ringfeed.RandomResizedCrop(224) + ringfeed.Flip(),
                                 device="cuda", normalize=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
        for epoch in range(start_epoch, 90):
            loader.set_epoch(epoch)
            for images, labels in loader:
                ...

    The loader connects and opens the stream in the constructor, so a wrong path, batch size or
    transform fails here, with the server's message.

    Args:
        path: the dataset: a packed dataset directory (``ringfeed pack``), an LMDB, an image
            folder (``DIR/class_name/image.jpg``, torchvision's ``ImageFolder`` classes and order)
            or a ``.csv``/``.jsonl`` manifest (as ``ringfeed pack`` reads them); the last two are
            listed by the server at open and read in place (see the README, "Serving files in
            place", for what packing adds). Made absolute here; the server opens it. Or the URL
            ``s3://bucket/prefix`` of a packed dataset on S3-compatible storage (protocol 1.3),
            sent unchanged: the server fetches it with its own credentials into its shard cache
            (docs/remote.md).
        batch_size: samples per batch, ``1 ..= 65536``.
        transform: the per-image pipeline, with torchvision's names and semantics: an op,
            ``ringfeed.Compose([...])`` (e.g. ``Compose([RandomResizedCrop(224),
            RandomHorizontalFlip(), TrivialAugmentWide(), Normalize(mean, std),
            RandomErasing(0.1)])``), or ``ringfeed.Views({...})`` for several outputs per sample
            (multi-crop: batches are then dicts by view name). It must end in a fixed size. The
            protocol 1.1 ``transform`` object as a dict is still accepted.
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
        rank: this process's rank, ``0 <= rank < world_size``; default ``$RANK`` (torchrun), else 0.
        world_size: number of ranks sharing each epoch; default ``$WORLD_SIZE``, else 1.
        layout: ``"NHWC"`` (``[N, H, W, 3]``) or ``"NCHW"`` (``[N, 3, H, W]``) uint8 images.
        slots: batches in flight in the ring, ``1 ..= 64``.
        on_error: a sample that cannot be decoded: ``"raise"`` (``ServerError`` with the sample's
            index and key; the iteration ends) or ``"skip"`` (left out, counted in ``stats()``).
        fields: extra fields to deliver besides ``image`` and ``label``: ``"index"`` (the sample's
            dataset index) and ``"crop"`` (``top, left, height, width, flipped``). With extras,
            batches are dicts by field name instead of ``(images, labels)`` tuples.
        socket: the server's Unix socket. Default: ``$RINGFEED_SOCKET``, else
            ``$XDG_RUNTIME_DIR/ringfeed/ringfeed.sock``, else ``/tmp/ringfeed-$UID/ringfeed.sock``.
        timeout: seconds to wait for any one message from the server before raising
            ``ringfeed.TimeoutError``; ``None`` waits for ever. A dead server is reported at once
            either way (``ServerDiedError``).
        spawn: start ``ringfeed serve --exit-when-idle`` at the socket when nothing listens there.
            Default: only when ``socket`` is not given. The binary is ``$RINGFEED_BIN``, else
            the one installed with this package (the wheel), else ``ringfeed`` on ``PATH``.
        normalize: ``(mean, std)`` on the 0..1 scale, e.g. ImageNet's
            ``((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))``: images are delivered as
            ``(x / 255 - mean) / std`` in ``dtype``, shape ``[N, 3, H, W]`` in ``channels_last``
            memory format, computed in one fused step (on the GPU in CUDA mode, after the copy).
            On the CPU this makes a copy, so the slot is released at once.
        dtype: the floating dtype of normalized images (default ``torch.float32``; e.g.
            ``torch.bfloat16``). Only with ``normalize``.
        hold: CPU mode without ``normalize``: how many of the most recent batches stay valid
            (``1 ..= slots``). A batch is a view of ring memory that the server overwrites once
            it is released: **it is valid until ``hold`` more batches have been requested, a new
            iteration starts, or the loader is closed, unless copied** (see the module's notes on
            ``break``). Ignored in CUDA mode.
        check_crc: have the server check each packed record's CRC-32C on read.
        lmdb: LMDB options for an LMDB dataset: ``{"layout": ..., "labels": ..., "labels_key": ...}``.
        spawn_timeout: seconds to wait for a started sidecar to listen.
        autotune: let the server set this stream's decode threads and prefetch depth from the
            wait this loader measures (the default; see "Why is my GPU waiting?" in the README).
            ``False`` pins ``threads`` and ``prefetch``.
        threads: decode threads for this stream: with ``autotune=False`` exactly this many (at
            most the server's pool; default: the whole pool), with autotune an upper bound.
        prefetch: batches the server prepares at once, ``1 ..= slots``: fixed with
            ``autotune=False`` (default ``slots``), the starting depth with autotune.
        log_every: every this many batches, print one line to stderr: samples/s, the share of
            time spent waiting for data, and the server's threads and depth for this stream.
        reconnect: how many times in a row the loader may re-establish a lost stream (see
            "Losing the server" below); ``0`` (the default) raises ``ServerDiedError`` at once.
        reconnect_timeout: seconds one re-establishment may take: waiting for a server to listen
            at ``socket`` again (or for the restarted sidecar), connecting and re-opening.
        on_opening: called as ``on_opening(files_listed, seconds)`` about every second while the
            server lists an image folder or manifest for this loader (a large tree takes a while;
            the progress is also logged at INFO on the ``ringfeed`` logger), or indexes WebDataset
            tars (then the count is of tar members). Each report resets ``timeout``, so a long
            listing never times out.
        order: the epoch's permutation (protocol 1.3; docs/order.md): ``"global"`` (one shuffle
            of the whole dataset), ``"shard_blocks"`` (shuffle the shards, then the samples
            within blocks of ``order_block`` shards: each batch reads few shards, at some cost in
            randomness), or ``"auto"`` (the default: ``shard_blocks`` for remote sources,
            ``global`` for local ones, so local batches are those of 1.2). ``loader.order`` says
            which one the server used.
        order_block: shards per shuffle block of ``"shard_blocks"`` (default 16).
        order_shard: samples per stand-in shard of ``"shard_blocks"`` for datasets without shard
            files (LMDBs, folders, manifests; default 1024).
        webdataset: options for WebDataset tars (docs/webdataset.md): ``{"image": "jpg;png",
            "label": "cls", "label_key": "label", "write_index": True}``; ``label`` is the
            label's extension (``"json"``: the integer member ``label_key`` of a JSON member;
            ``""``: no labels).
        gpu_decode: hybrid decode (docs/hybrid-decode.md): the server hands a share of each batch
            to this process as JPEG bytes, which it decodes on its GPU (the hardware JPEG decoder
            through nvImageCodec, else ``torchvision.io.decode_jpeg``) and finishes there (crop,
            antialiased resize, flip) beside the CPU-decoded samples. ``"auto"`` (the default):
            on a CUDA device, when a decoder is installed and the pipeline is crops, flips and one
            resize (plus ``Normalize``/``RandomErasing``), with the share set by the autotuner;
            otherwise off, saying why once (``gpu_decode_reason``). A number in ``0 ..= 1`` pins
            the share (and raises ``ValueError`` where it cannot work); ``False`` turns it off.
        gpu_decode_bytes: room for encoded bytes per sample of a batch in each ring slot
            (default: ``max(3·H·W, 65536)`` for the view's size; raise it for large photos, whose files
            would not fit: those are then decoded by the server).

    Losing the server:
        When the server's connection closes under the loader (the server was killed, crashed or
        restarted; ``ServerDiedError``), a loader with ``reconnect=0`` raises at once, never
        after a timeout, and ``state_dict()`` resumes exactly in a new loader.

        With ``reconnect=N``, the loader instead re-establishes the stream itself, inside the
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
        path: str | os.PathLike[str],
        batch_size: int,
        transform: Any,
        *,
        batch_transform: Any = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        device: Any = "cpu",
        rank: int | None = None,
        world_size: int | None = None,
        layout: str = "NHWC",
        slots: int = 4,
        on_error: str = "raise",
        fields: Sequence[str] | None = None,
        socket: str | os.PathLike[str] | None = None,
        timeout: float | None = 60.0,
        spawn: bool | None = None,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: Any = None,
        hold: int = 1,
        check_crc: bool = True,
        lmdb: Mapping[str, Any] | None = None,
        spawn_timeout: float = 10.0,
        autotune: bool = True,
        threads: int | None = None,
        prefetch: int | None = None,
        log_every: int | None = None,
        reconnect: int = 0,
        reconnect_timeout: float = 30.0,
        on_opening: Callable[[int, float], None] | None = None,
        order: str = "auto",
        order_block: int | None = None,
        order_shard: int | None = None,
        webdataset: Mapping[str, Any] | None = None,
        gpu_decode: bool | float | str = "auto",
        gpu_decode_bytes: int | None = None,
        _gpu_backend: str | None = None,
    ) -> None:
        # Everything that can be checked without the server is, first.
        cfg = StreamConfig.check(
            dataset_path(path), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, device=device,
            rank=rank, world_size=world_size, slots=slots, socket=socket, timeout=timeout, spawn=spawn, hold=hold,
            spawn_timeout=spawn_timeout, autotune=autotune, threads=threads, prefetch=prefetch, log_every=log_every,
            reconnect=reconnect, reconnect_timeout=reconnect_timeout, on_opening=on_opening, order=order,
            order_block=order_block, order_shard=order_shard,
        )  # fmt: skip
        opts = ImageOptions.check(
            cfg, transform, layout=layout, on_error=on_error, fields=fields, check_crc=check_crc, lmdb=lmdb,
            webdataset=webdataset, normalize=normalize, dtype=dtype, batch_transform=batch_transform,
            gpu_decode=gpu_decode, _gpu_backend=_gpu_backend, gpu_decode_bytes=gpu_decode_bytes,
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
    lmdb = From("_kind.opts")
    webdataset = From("_kind.opts")
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
