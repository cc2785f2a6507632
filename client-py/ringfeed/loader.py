"""``ringfeed.Loader``: batches from a ringfeed server, as PyTorch tensors, without copies.

One loader is one stream (``proto/control.md``, "Session"): it connects to the server (starting a
sidecar when none listens and no socket was given), says ``hello``, ``open``\\ s the dataset, maps
the ring the server answers with (``proto/ring.md``), and then, for each iteration, sends
``start {epoch, first_batch}`` and turns each ``ready`` into a batch.

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

Wait (``stats()``, the server's autotuner): the time inside ``next()`` is ``wait_s``. In CUDA mode
part of it is spent behind the GPU, not waiting for data: in the copy's launches (the copy, the
normalisation, the training stream's wait on it), which block while the GPU's launch queue is full,
and waiting for a copy's event, which queues behind the model's kernels. That part is
``gpu_wait_s``, sent to the server as ``gpu_wait_ns`` (protocol 1.2), which tunes on the rest, the
wait for data (``data_wait_s``).
- ``ready`` messages of a run the loader no longer wants (an earlier iteration) are released at
  once, unread.

End of epoch (``StopIteration``), timeout (``ringfeed.TimeoutError``) and failure
(``ServerError``, ``ServerDiedError``, ``ProtocolError``) are distinct. A non-fatal ``sample``
error ends only the current iteration; the others make the loader unusable, but its
``state_dict()`` still resumes the stream exactly in a new loader.

The loader is not thread-safe: iterate it from one thread.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Literal, overload

from ._errors import ProtocolError, RingfeedError, ServerDiedError, ServerError
from ._transforms import Views, as_views
from ._version import __version__
from .wire.observe import snapshot
from .wire.protocol import PROTOCOL, Connection, check_server_message, remote_stats, stats_message
from .wire.ring import Segment
from .wire.sidecar import connect, default_socket_path

__all__ = ["Loader"]

log = logging.getLogger("ringfeed")

#: Fields a stream carries besides its views' images and erasing boxes (ring.md, "Fields a stream
#: carries"): ``label`` always, the others on request; each one's dtype and per-sample shape.
FIELDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "label": ("int64", ()),
    "index": ("int64", ()),
    "crop": ("int32", (5,)),
}
#: Bounds from control.md, "open".
MAX_BATCH_SIZE = 65536
MAX_SLOTS = 64
MAX_SEED = (1 << 53) - 1
# Datasets on object storage (protocol 1.3): sent to the server unchanged.
REMOTE_SCHEME = "s3://"
#: The slot header's epoch is a u32.
MAX_EPOCH = (1 << 32) - 1
#: Sample orders (control.md, "Order and randomness", 1.3) and the bounds of their members.
ORDERS = ("auto", "global", "shard_blocks")
MAX_ORDER_BLOCK = 1 << 20
MAX_ORDER_SHARD = 1 << 32
#: ``open.webdataset`` members (control.md, "WebDataset shards", 1.3).
WEBDATASET_OPTIONS = {"image": str, "label": str, "label_key": str, "write_index": bool}
#: A ``stats`` message is sent every this many batches (control.md, "stats").
STATS_EVERY = 16
#: ... or after this many seconds, whichever comes first (control.md, `stats`).
STATS_PERIOD = 0.25
#: Connections tried when a server closes before its welcome (see ``Loader._handshake``).
HANDSHAKE_ATTEMPTS = 3
#: Version of the ``state_dict()`` layout (control.md, "Resume by a global position"); version 1
#: (without ``position``) is still loaded.
STATE_VERSION = 2


class _Stream:
    """Everything a loader holds outside Python's heap: the connection, the ring, the pinning.

    Kept apart from ``Loader`` so that ``weakref.finalize`` can close it without keeping the
    loader alive. ``held`` maps each slot this client holds to the ``seq`` that delivered it.
    """

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.segment: Segment | None = None
        self.cuda: Any = None
        self.finisher: Any = None
        self.held: dict[int, int] = {}

    def release(self, slot: int) -> None:
        seq = self.held.pop(slot)
        if self.conn is not None and not self.conn.closed:
            self.conn.send({"type": "release", "slot": slot, "seq": seq})

    def close(self) -> None:
        """Waits for GPU copies and unpins, says ``close``, closes the socket, unmaps. Idempotent."""
        cuda, self.cuda = self.cuda, None
        conn, self.conn = self.conn, None
        segment, self.segment = self.segment, None
        finisher, self.finisher = self.finisher, None
        try:
            if finisher is not None:
                # Its thread may still read a slot's encoded bytes: it stops before the unmap.
                finisher.close()
            if cuda is not None:
                # Nothing may read the ring once it is unpinned and unmapped.
                cuda.close()
        finally:
            if conn is not None:
                # Closing the socket frees every slot server-side; no `release` is needed.
                with contextlib.suppress(RingfeedError, OSError):
                    conn.send({"type": "close"})
                conn.close()
            self.held.clear()
            if segment is not None:
                segment.close()


def _dataset_path(path: str | os.PathLike[str]) -> str:
    """What ``open.dataset`` carries: a local path made absolute, or a remote URL unchanged."""
    p = os.fspath(path)
    if isinstance(p, str) and p.startswith(REMOTE_SCHEME):
        return p
    return os.path.abspath(p)  # noqa: PTH100


class Loader:
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
            one-hot floats), seeded by ``(seed, epoch, batch)``.
        shuffle: a new permutation of the dataset every epoch (seeded by ``seed`` and the epoch).
        seed: seeds the order and every sample's augmentation, ``0 ..= 2^53 - 1``.
        drop_last: drop the last partial batch of each rank (and cut the permutation to a multiple
            of ``world_size``); without it the permutation is padded like ``DistributedSampler``.
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
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
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
        self._res = _Stream()
        self._finalizer = weakref.finalize(self, self._res.close)
        # Absolute, as the server needs, without resolving symlinks (what the user named is sent).
        # A remote dataset (``s3://bucket/prefix``, protocol 1.3) goes to the server as it is: the
        # server fetches it, with its own credentials (docs/remote.md).
        self.path = _dataset_path(path)
        self.batch_size = _int_in("batch_size", batch_size, 1, MAX_BATCH_SIZE)
        self.transform = transform
        self.views, self._legacy = _check_transform(transform)
        self.shuffle = _bool("shuffle", shuffle)
        self.seed = _int_in("seed", seed, 0, MAX_SEED)
        self.drop_last = _bool("drop_last", drop_last)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be 'NHWC' or 'NCHW', got {layout!r}")
        self.layout = layout
        self.slots = _int_in("slots", slots, 1, MAX_SLOTS)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.fields = _check_fields(fields, self.views)
        self.timeout = _check_timeout("timeout", timeout)
        self.hold = _int_in("hold", hold, 1, self.slots)
        self.check_crc = _bool("check_crc", check_crc)
        self.lmdb = dict(lmdb) if lmdb is not None else None
        self.autotune = _bool("autotune", autotune)
        self.threads = None if threads is None else _int_in("threads", threads, 1, 1024)
        self.prefetch = None if prefetch is None else _int_in("prefetch", prefetch, 1, self.slots)
        self.log_every = None if log_every is None else _int_in("log_every", log_every, 1, 1 << 30)
        #: The server's id for this stream (protocol 1.1), as ``ringfeed top`` shows it.
        self.stream_id: int | None = None
        self.socket_path = os.fspath(socket) if socket is not None else default_socket_path()
        self._spawn = (socket is None) if spawn is None else _bool("spawn", spawn)
        self._spawn_timeout = _check_timeout("spawn_timeout", spawn_timeout) or 10.0
        self.reconnect = _int_in("reconnect", reconnect, 0, 1 << 30)
        self.reconnect_timeout = _check_timeout("reconnect_timeout", reconnect_timeout) or 30.0
        if on_opening is not None and not callable(on_opening):
            raise ValueError(f"on_opening must be a callable (files_listed, seconds), got {on_opening!r}")
        self.on_opening = on_opening
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        self.order_requested = order
        self.order_block = None if order_block is None else _int_in("order_block", order_block, 1, MAX_ORDER_BLOCK)
        self.order_shard = None if order_shard is None else _int_in("order_shard", order_shard, 1, MAX_ORDER_SHARD)
        self.webdataset = _check_webdataset(webdataset)
        #: The order the server uses (``"global"`` or ``"shard_blocks"``), from its ``ring``.
        self.order = "global"
        self.device = resolve_device(device)
        self._cuda = self.device != "cpu" and self.device.type == "cuda"
        if normalize is not None:
            try:
                mean, std = normalize
            except (TypeError, ValueError):
                raise ValueError(f"normalize must be a (mean, std) pair, got {normalize!r}") from None
            normalize = (mean, std)
        self._post = None
        views = self.views if self.views is not None else as_views(_legacy_ops(self._legacy))
        needs_post = (
            normalize is not None
            or dtype is not None
            or batch_transform is not None
            or any(v.transform.normalize or v.transform.erasing for v in views.views.values())
        )
        if needs_post:
            from ._batch import BatchOps

            post = BatchOps(views, self.layout, normalize, dtype, batch_transform, self.seed)
            self._post = post if post.active else None
        #: The server's sidecar log, when this loader started the server.
        self.server_log: str | None = None
        #: Hybrid decode: the pinned share (a float), ``None`` for the tuner's, or off (``False``).
        self._gpu_share, self._gpu_backend, self.gpu_decode_reason = _gpu_plan(
            gpu_decode, _gpu_backend, self.device, self.views, self.autotune
        )
        if gpu_decode_bytes is not None:
            gpu_decode_bytes = _int_in("gpu_decode_bytes", gpu_decode_bytes, 4096, 64 << 20)
        self._gpu_bytes = gpu_decode_bytes
        self._finisher: Any = None
        # Hybrid decode's look-ahead: the next batch, taken from the server while this one is
        # handed out, whose GPU decode already runs in the finisher's thread: (slot, header,
        # pending decode); and messages read while looking ahead, not yet acted on.
        self._ahead: collections.deque[tuple[int, Any, Any]] = collections.deque()
        self._held_msgs: collections.deque[dict[str, Any]] = collections.deque()
        self._held_error: BaseException | None = None

        # Stream state (see `state_dict`).
        self._epoch = 0
        self._delivered = 0
        self._cursor = 0  # the first batch of the next iteration (set by load_state_dict)
        # The global position (control.md, "Resume by a global position") the current run's
        # striping starts from: 0 but in the first iteration after a re-striping load_state_dict().
        self._run_position = 0
        self._resumed = False  # load_state_dict() set the next iteration's start
        self._iteration = 0  # bumped by every iter(), set_epoch() and load_state_dict(): older iterators stop
        self._run = 0  # `start`s sent on this connection: the number of the current run
        self._run_epoch = 0  # the epoch of the current run
        self._first = 0  # the current run's first batch
        self._next_batch_index = 0  # the batch the next `ready` of the current run must hold
        self._last_seq = 0
        # CPU: (slot, weak references to the arrays handed out) of the batches still valid, oldest first.
        self._yielded: collections.deque[tuple[int, list[weakref.ref[Any]]]] = collections.deque()
        self._broken: BaseException | None = None
        self._closed = False
        self._stats = {"batches": 0, "wait_s": 0.0, "gpu_wait_s": 0.0, "compute_s": 0.0, "skipped": 0, "reconnects": 0}
        self._reconnects_in_row = 0  # re-establishments since the last batch or `end` (see `_recover`)
        self._pending_stats = [0, 0, 0, 0]  # steps, wait_ns, compute_ns, gpu_wait_ns since the last `stats`
        self._gpu_s = 0.0  # of the current next(), the time spent behind the GPU (CUDA mode)
        self._stats_sent = time.perf_counter()
        # time, batches, wait_s, compute_s, gpu_wait_s at the last log line
        self._log_mark = (time.perf_counter(), 0, 0.0, 0.0, 0.0)
        self._last_return: float | None = None
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    # -- connection ---------------------------------------------------------------------------------

    def _connect(self) -> None:
        welcome = self._handshake()
        conn = self._res.conn
        assert conn is not None
        major, minor = welcome["protocol"]
        if major != PROTOCOL[0]:
            raise ProtocolError(
                f"{conn.name} speaks protocol {major}.{minor}, but this client speaks {PROTOCOL[0]}.{PROTOCOL[1]}; "
                f"install the ringfeed Python package that matches the server"
            )
        self.server_protocol = (major, minor)
        self.server = welcome.get("server")
        conn.send(self._open_message())
        ring, fd = self._recv(want_fd=True)
        while ring["type"] == "opening":  # 1.2: a folder or manifest being listed (each resets the timeout)
            self._on_opening(ring)
            ring, fd = self._recv(want_fd=True)
        if fd is None:
            raise ProtocolError(f"{conn.name} answered `open` with `{ring['type']}`, expected `ring`")
        try:
            segment = Segment(fd, ring["segment_len"], array="torch" if _have_torch() else "numpy")
        finally:
            os.close(fd)
        self._res.segment = segment
        self._check_ring(segment)
        self.classes: tuple[str, ...] = tuple(ring["classes"])
        self.dataset_len: int = ring["dataset_len"]
        self.samples_per_rank: int = ring["samples_per_rank"]
        self.batches_per_epoch: int = ring["batches_per_epoch"]
        self.stream_id = ring.get("stream")
        self.order = ring.get("order", "global")
        if self._cuda:
            from .gpu.device import CudaCopier

            self._res.cuda = CudaCopier(segment, self.device)
        if self._gpu_on():
            from .gpu.hybrid import Finisher

            for name in ("gpu_job", "gpu_bytes"):
                if name not in segment.fields:
                    raise ProtocolError(f"the ring has no field {name!r}, which hybrid decode needs")
            assert self.views is not None
            assert self._gpu_backend is not None
            (view,) = self.views.views.values()
            device = self.device if self._cuda else _cpu()
            self._finisher = Finisher(device, self._gpu_backend, self.layout, view.size, segment.slot_count)
            self._res.finisher = self._finisher

    def _on_opening(self, msg: dict[str, Any]) -> None:
        """Reports a long open's progress: on the ``ringfeed`` logger, and to ``on_opening``."""
        if self.on_opening is not None:
            self.on_opening(msg["listed"], msg["elapsed_ms"] / 1000)
        log.info("ringfeed: listing %s: %d files after %.0f s", msg["dataset"], msg["listed"], msg["elapsed_ms"] / 1000)

    def _handshake(self) -> dict[str, Any]:
        """Connects (starting a sidecar if allowed), says hello, returns the welcome.

        A server that closes the connection before its welcome was exiting as this loader
        connected (a sidecar leaving ``--exit-when-idle``): the loader connects again, which
        starts a new sidecar when that is allowed, or names the socket when it is not.
        """
        hint = f"; if batches legitimately take longer, raise Loader(timeout=...) (now {self.timeout} s)"
        for attempt in range(HANDSHAKE_ATTEMPTS):
            conn, self.server_log = connect(
                self.socket_path,
                spawn=self._spawn,
                timeout=self.timeout,
                timeout_hint=hint,
                spawn_timeout=self._spawn_timeout,
            )
            if self.server_log is not None:
                conn.name += f" (log: {self.server_log})"
                conn.timeout_hint += f", or see the server's log {self.server_log}"
            self._res.conn = conn
            try:
                hello = {"type": "hello", "protocol": list(PROTOCOL), "client": f"ringfeed-py {__version__}"}
                conn.send(hello | {"pid": os.getpid()})
                return self._expect("welcome")
            except ServerDiedError:
                conn.close()
                self._res.conn = None
                if attempt + 1 == HANDSHAKE_ATTEMPTS:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def _open_message(self) -> dict[str, Any]:
        """The ``open``: the members every sample kind shares, and the kind's own (``_kind_members``)."""
        msg: dict[str, Any] = {
            "type": "open",
            "dataset": self.path,
            "batch_size": self.batch_size,
            **self._kind_members(),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "slots": self.slots,
        }
        if self.server_protocol >= (1, 1):
            msg["autotune"] = self.autotune
            if self.threads is not None:
                msg["threads"] = self.threads
            if self.prefetch is not None:
                msg["prefetch"] = self.prefetch
            local = _env_int("LOCAL_WORLD_SIZE")
            if local is not None and 1 <= local <= 4096:
                msg["local_world_size"] = local
        return msg

    def _kind_members(self) -> dict[str, Any]:
        """The image stream's members of ``open`` (control.md, "open")."""
        msg: dict[str, Any] = {
            **self._pipeline_member(),
            "layout": self.layout,
            "on_error": self.on_error,
            "fields": [f for f in self.fields if f in ("image", "label", "index", "crop")],
            "check_crc": self.check_crc,
        }
        if self.lmdb is not None:
            msg["lmdb"] = self.lmdb
        if self._gpu_share is not False and self.server_protocol < (1, 3):
            major, minor = self.server_protocol
            self._gpu_share = False
            self.gpu_decode_reason = f"the server speaks protocol {major}.{minor}; hybrid decode needs 1.3"
            log.warning("ringfeed: GPU decode is off: %s", self.gpu_decode_reason)
        if self._gpu_on():
            gpu: dict[str, Any] = {"share": self._gpu_share}
            if self._gpu_bytes is not None:
                gpu["bytes_per_sample"] = self._gpu_bytes
            msg["gpu_decode"] = gpu
        msg.update(self._order_members())
        return msg

    def _order_members(self) -> dict[str, Any]:
        """The 1.3 members (order, WebDataset options), sent only when set: a 1.2 server would ignore them."""
        members: dict[str, Any] = {}
        if self.order_requested != "auto":
            members["order"] = self.order_requested
        if self.order_block is not None:
            members["order_block"] = self.order_block
        if self.order_shard is not None:
            members["order_shard"] = self.order_shard
        if self.webdataset is not None:
            members["webdataset"] = self.webdataset
        if members and self.server_protocol < (1, 3):
            raise RingfeedError(
                f"the server speaks protocol {self.server_protocol[0]}.{self.server_protocol[1]}; "
                f"{', '.join(sorted(members))} need a ringfeed server with protocol 1.3 "
                f"(upgrade the server, or set RINGFEED_BIN to a newer binary)"
            )
        return members

    def _gpu_on(self) -> bool:
        """Whether this stream asks for hybrid decode."""
        return self._gpu_share is not False

    def _pipeline_member(self) -> dict[str, Any]:
        """``pipeline`` for a 1.2 server; ``transform`` for a 1.1 one, when the pipeline is one of its three."""
        if self.views is None:
            return {"transform": dict(self._legacy)}  # type: ignore[arg-type]
        if self.server_protocol >= (1, 2):
            return {"pipeline": self.views.to_json()}
        legacy = self.views.legacy()
        if legacy is None:
            raise RingfeedError(
                f"the server speaks protocol {self.server_protocol[0]}.{self.server_protocol[1]}, which runs only "
                f"RandomResizedCrop [+ RandomHorizontalFlip], Resize((h, w)) or Resize(s) + CenterCrop; this pipeline "
                f"needs a ringfeed server with protocol 1.2 (upgrade the server, or set RINGFEED_BIN to a newer binary)"
            )
        return {"transform": legacy}

    def _check_ring(self, segment: Segment) -> None:
        """The ring must carry what was asked for, in the shapes asked for."""
        if segment.batch_size != self.batch_size:
            raise ProtocolError(
                f"the ring holds batches of {segment.batch_size}, but the loader asked for {self.batch_size}"
            )
        if self.hold > segment.slot_count:
            raise ProtocolError(f"the ring has {segment.slot_count} slots, fewer than hold={self.hold}")
        for name in self._ring_fields():
            field = segment.fields.get(name)
            if field is None:
                raise ProtocolError(f"the ring has no field {name!r} (it has {', '.join(segment.fields)})")
            dtype, shape = self._field_spec(name)
            ok = len(field.shape) == len(shape) and all(a == b for a, b in zip(field.shape, shape, strict=True) if b)
            if field.dtype is None or field.dtype.name != dtype or not ok:
                got = f"{field.dtype.name if field.dtype else f'code {field.code}'} {list(field.shape)}"
                want = f"{dtype} {[d if d else '?' for d in shape]}"
                raise ProtocolError(f"the ring's field {name!r} is {got}, expected {want}")

    def _ring_fields(self) -> tuple[str, ...]:
        """The ring fields this loader reads and hands out."""
        return self.fields

    def _field_spec(self, name: str) -> tuple[str, tuple[int | None, ...]]:
        """A field's dtype and per-sample shape (``None``: not known here)."""
        if name in FIELDS:
            return FIELDS[name]
        if self.views is None:
            size = tuple(self._legacy.get("size", ()))  # type: ignore[union-attr]
            h, w = size if len(size) == 2 else (None, None)
            return "uint8", ((h, w, 3) if self.layout == "NHWC" else (3, h, w))
        base, erase = (name[: -len("_erase")], True) if name.endswith("_erase") else (name, False)
        v = self.views.views[base]
        lead: tuple[int, ...] = (v.count,) if v.count > 1 else ()
        if erase:
            return "int32", (*lead, len(v.transform.erasing), 4)
        h, w = v.size
        return "uint8", (*lead, *((h, w, 3) if self.layout == "NHWC" else (3, h, w)))

    # -- receiving ------------------------------------------------------------------------------

    @overload
    def _recv(self, *, want_fd: bool = ..., poll: Literal[False] = ...) -> tuple[dict[str, Any], int | None]: ...
    @overload
    def _recv(self, *, want_fd: bool = ..., poll: Literal[True]) -> tuple[dict[str, Any], int | None] | None: ...

    def _recv(self, *, want_fd: bool = False, poll: bool = False) -> tuple[dict[str, Any], int | None] | None:
        """The next message, checked, and the ring's descriptor if ``want_fd``.

        ``error`` messages are raised as ``ServerError``, except a non-fatal one that names an
        earlier run (a newer minor may add ``run`` to ``error``), which is dropped. With
        ``poll``, returns ``None`` instead of waiting.
        """
        conn = self._res.conn
        assert conn is not None
        while True:
            got = conn.poll() if poll else conn.recv()
            if got is None:
                return None
            msg, fd = got
            try:
                check_server_message(msg)
            except ProtocolError:
                if fd is not None:
                    os.close(fd)
                raise
            if fd is not None and not want_fd:
                os.close(fd)
                raise ProtocolError(f"{conn.name} sent a `ring` message after the stream was open")
            if msg["type"] == "error":
                run = msg.get("run")
                if type(run) is int and run < self._run and not msg["fatal"]:
                    continue
                raise self._server_error(msg)
            return msg, fd

    def _expect(self, kind: str) -> dict[str, Any]:
        msg, _ = self._recv()
        if msg["type"] != kind:
            raise ProtocolError(f"expected a `{kind}` message, got `{msg['type']}`")
        return msg

    def _server_error(self, msg: dict[str, Any]) -> ServerError:
        message = msg["message"]
        if msg["code"] == "dataset" and self.path not in message:
            message += f" (dataset {self.path})"
        return ServerError(msg["code"], message, msg.get("sample"), msg.get("key"), msg["fatal"])

    # -- iteration ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (``batches_per_epoch`` from the server)."""
        return self.batches_per_epoch

    def __iter__(self) -> Generator[Any, None, None]:
        """Starts a run at the current epoch and cursor; yields ``(images, labels)`` or dicts.

        A new iteration abandons the previous one: its batches are released (CPU views of them
        become invalid) and its iterator raises ``RuntimeError`` if used again.
        """
        self._check_usable()
        self._abandon()
        iteration = self._iteration
        first, self._cursor = self._cursor, 0
        if not self._resumed:
            self._run_position = 0
        self._resumed = False
        self._delivered = first
        if first >= self._run_batches():
            # The whole epoch was delivered before the state was saved: nothing is left of it.
            return _nothing()
        self._run_epoch = self._epoch
        self._resilient(self._start_run)
        return self._batches(iteration)

    def _start_run(self) -> None:
        """Sends ``start`` for the current iteration, from the first batch not yet delivered."""
        conn = self._res.conn
        assert conn is not None
        start = {"type": "start", "epoch": self._run_epoch, "first_batch": self._delivered}
        if self._run_position:
            start["position"] = self._run_position
        self._guard(conn.send, start)
        self._run += 1
        self._first = self._next_batch_index = self._delivered

    def _batches(self, iteration: int) -> Generator[Any, None, None]:
        batch = None
        try:
            while True:
                batch = self._resilient(self._guard, self._next, iteration, resume=True)
                if batch is None:
                    return
                yield batch
        finally:
            batch = None  # this frame's reference is not the user's
            if self._iteration == iteration:
                # The iteration ended (its end, a `break`, a dropped iterator): batches nobody
                # refers to any more go back now; one the user still holds stays valid until the
                # next iteration or close().
                self._release_yielded(unreferenced_only=True)

    def _next(self, iteration: int) -> Any:
        if self._iteration != iteration:
            raise RuntimeError(
                "this iterator was abandoned: the loader was iterated again, or set_epoch() or "
                "load_state_dict() was called, since it started"
            )
        self._check_usable()
        t0 = time.perf_counter()
        self._gpu_s = 0.0
        self._release_due()
        while True:
            if self._ahead:
                slot, header, pending = self._ahead.popleft()
                batch = self._make_batch(slot, header, pending)
                self._release_copied()
                self._look_ahead()
                self._reconnects_in_row = 0
                self._count_step(t0)
                return batch
            msg = self._next_message()
            kind = msg["type"]
            if kind == "ready":
                got = self._on_ready(msg)
                if got is None:
                    continue
                batch = self._make_batch(*got)
                self._release_copied()
                self._look_ahead()
                self._reconnects_in_row = 0
                self._count_step(t0)
                return batch
            if kind == "end":
                if msg["run"] != self._run:
                    if msg["run"] > self._run:
                        raise ProtocolError(f"`end` of run {msg['run']}, but only {self._run} runs were started")
                    continue
                batches = self._delivered - self._first
                if msg["epoch"] != self._run_epoch or msg["batches"] != batches:
                    raise ProtocolError(
                        f"`end` says epoch {msg['epoch']} with {msg['batches']} batches, but this run delivered "
                        f"{batches} batches of epoch {self._run_epoch}"
                    )
                self._reconnects_in_row = 0
                return None  # `skipped` was counted batch by batch, from the slot headers
            raise ProtocolError(f"unexpected `{kind}` message during an epoch")

    def _next_message(self) -> dict[str, Any]:
        """The next message of the stream, never waiting on the server while it waits on us.

        In CUDA mode the slots of copies in flight are still held; if the server has nothing to
        send, it may be waiting for one of them (all slots held). So while copies are pending
        and nothing is readable, wait for the oldest copy (a DMA, not the training step) and
        release its slot, instead of blocking on the socket.
        """
        if self._held_error is not None:
            e, self._held_error = self._held_error, None
            raise e
        if self._held_msgs:
            return self._held_msgs.popleft()
        cuda = self._res.cuda
        while cuda is not None and cuda.pending:
            got = self._recv(poll=True)
            if got is not None:
                return got[0]
            self._res.release(self._behind_gpu(cuda.wait_oldest))
        return self._recv()[0]

    def _look_ahead(self) -> None:
        """Hybrid decode: takes the next batch if the server has it ready, and starts its GPU decode
        in the finisher's thread, so that it runs while the training step runs (the hardware
        decoder's call blocks its thread for the whole decode). Never waits for the server."""
        if self._finisher is None or not self._finisher.background or self._held_error:
            return
        segment = self._res.segment
        assert segment is not None
        # As many ahead as the finisher has decode threads, two at least (decoding one while the
        # other is finished), leaving the server two slots.
        most = max(0, min(max(2, self._finisher.decode_threads), segment.slot_count - 2))
        try:
            while len(self._ahead) < most:
                got = self._recv(poll=True)
                if got is None:
                    return
                msg = got[0]
                if msg["type"] != "ready":
                    self._held_msgs.append(msg)
                    return
                taken = self._on_ready(msg)
                if taken is None:
                    continue  # a stale run's batch (released), or one whose every sample was skipped
                slot, header = taken
                jobs, arena = self._gpu_inputs(slot, header)
                self._ahead.append((slot, header, self._finisher.submit(jobs, arena, self._copy_stream())))
        except RingfeedError as e:
            # Raised where the loop would have met it: at the next batch, after this one.
            self._held_error = e

    def _copy_stream(self) -> Any:
        return None if self._res.cuda is None else self._res.cuda.stream

    def _drop_ahead(self) -> None:
        """Releases the batches taken ahead (once their decodes have stopped reading their slots)."""
        while self._ahead:
            slot, _, pending = self._ahead.popleft()
            with contextlib.suppress(Exception):
                pending.result()
            if slot in self._res.held:
                with contextlib.suppress(RingfeedError, OSError):
                    self._res.release(slot)

    def _behind_gpu(self, fn: Any, *args: Any) -> Any:
        """Runs ``fn`` (a CUDA call that may block behind the GPU's queued work), counting its time
        as back-pressure, not as a wait for data."""
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._gpu_s += time.perf_counter() - t

    def _on_ready(self, msg: dict[str, Any]) -> tuple[int, Any] | None:
        """Takes ownership of the slot; returns ``(slot, header)``, or ``None`` for a stale run's."""
        res = self._res
        assert res.segment is not None
        seq, run, slot = msg["seq"], msg["run"], msg["slot"]
        if seq != self._last_seq + 1:
            raise ProtocolError(f"`ready` has seq {seq}, expected {self._last_seq + 1}")
        self._last_seq = seq
        if slot >= res.segment.slot_count:
            raise ProtocolError(f"`ready` names slot {slot}, but the ring has {res.segment.slot_count}")
        if slot in res.held:
            raise ProtocolError(
                f"`ready` hands over slot {slot}, which this client already holds (seq {res.held[slot]})"
            )
        res.held[slot] = seq
        if run != self._run:
            if run > self._run:
                raise ProtocolError(f"`ready` of run {run}, but only {self._run} runs were started")
            res.release(slot)  # ring.md rule 4: a stale run's batch is released unread
            return None
        header = res.segment.slot_header(slot)
        if (header.seq, header.run) != (seq, run):
            raise ProtocolError(
                f"slot {slot}'s header has seq {header.seq}, run {header.run}; the `ready` message said {seq}, {run}"
            )
        if (header.epoch, header.batch) != (self._run_epoch, self._next_batch_index):
            raise ProtocolError(
                f"slot {slot} holds batch {header.batch} of epoch {header.epoch}; expected batch "
                f"{self._next_batch_index} of epoch {self._run_epoch}"
            )
        self._next_batch_index += 1
        if header.count == 0:
            # Every sample was skipped (on_error="skip"): the batch counts as delivered, for
            # state_dict() and `end`, but there is nothing to hand out.
            self._delivered += 1
            self._stats["skipped"] += header.skipped
            res.release(slot)
            return None
        return slot, header

    def _make_batch(self, slot: int, header: Any, pending: Any = None) -> Any:
        res = self._res
        assert res.segment is not None
        n = header.count
        views = {name: res.segment.view(slot, name)[:n] for name in self._ring_fields()}
        post = self._post
        if post is not None:
            try:
                post.check(views)
            except ValueError:
                res.release(slot)
                raise
        finish = self._gpu_finish(slot, header, pending) if self._finisher is not None else None
        if finish is not None and res.cuda is None:
            # CPU mode (the tests' host backend): the GPU samples are finished into the held slot
            # itself (ring.md rule 7), then the batch goes on as any other.
            try:
                views = finish(dict(views))
            except _SampleDecodeError:
                res.release(slot)
                raise
            self._stats["skipped"] += finish.skipped
        if res.cuda is not None:
            hook = None if post is None else (lambda o: post(o, header.epoch, header.batch))
            try:
                extra = () if finish is None else (finish,)
                out = self._behind_gpu(res.cuda.copy, views, slot, hook, *extra)
                if finish is not None and self._finisher is not None:
                    # Finishing the GPU samples is making the batch (the wait for data), not
                    # back-pressure from the GPU: the tuner must not read it as the model's step.
                    self._gpu_s = max(self._gpu_s - self._finisher.last_call_ns / 1e9, 0.0)
            except _SampleDecodeError:
                res.cuda.stream.synchronize()
                res.release(slot)
                raise
            if finish is not None:
                self._stats["skipped"] += finish.skipped
        elif post is not None:
            # The batch ops make new tensors; copy whatever they left as a view of the ring, and
            # hand the slot back now.
            out = post(dict(views), header.epoch, header.batch)
            out = {k: (v.clone() if any(v is r for r in views.values()) else v) for k, v in out.items()}
            res.release(slot)
        else:
            out = views
            self._yielded.append((slot, [weakref.ref(v) for v in views.values()]))
        self._delivered += 1
        self._stats["skipped"] += header.skipped
        return self._shape_batch(out)

    def _shape_batch(self, out: dict[str, Any]) -> Any:
        """What the iterator yields for a batch's fields: ``(images, labels)``, or a dict."""
        for k in [k for k in out if k.endswith("_erase")]:
            del out[k]
        if self.views is None or (list(self.views.views) == ["image"] and set(out) == {"image", "label"}):
            return out["image"], out["label"]
        return out

    def _gpu_inputs(self, slot: int, header: Any) -> tuple[Any, Any]:
        """The slot's ``gpu_job`` records and ``gpu_bytes`` arena, as numpy views of the ring."""
        res = self._res
        assert res.segment is not None
        jobs = res.segment.view(slot, "gpu_job")[: header.count]
        arena = res.segment.view(slot, "gpu_bytes")
        jobs_np = jobs.numpy() if hasattr(jobs, "numpy") else jobs
        arena_np = arena.numpy() if hasattr(arena, "numpy") else arena
        return jobs_np, arena_np.reshape(-1)

    def _gpu_finish(self, slot: int, header: Any, pending: Any = None) -> _Finish:
        """What finishes this batch's GPU samples, run where its tensors are (ring.md, ``gpu_job``)."""
        res = self._res
        assert res.segment is not None
        assert self._finisher is not None
        jobs, arena = self._gpu_inputs(slot, header)
        index = res.segment.view(slot, "index")[: header.count] if "index" in res.segment.fields else None
        return _Finish(self, jobs, arena, header, index, pending)

    def _release_due(self) -> None:
        """Releases what may be released before waiting for the next batch."""
        res = self._res
        while len(self._yielded) >= self.hold:
            res.release(self._yielded.popleft()[0])
        self._release_copied()

    def _release_copied(self) -> None:
        """CUDA mode: hands back the slots whose copies (and GPU finishing) have completed since
        the last look (never blocks). Called before waiting for a batch and again once a batch is
        made, before the training step runs, so that a copy completed while the loop waited does
        not hold its slot through the step too. (With hybrid decode the loop also holds the
        batches decoding ahead; on the H200 this made no difference beyond the runs' spread,
        benches/results/2026-12-02-h200-kinds.)"""
        res = self._res
        if res.cuda is not None:
            for slot in self._behind_gpu(res.cuda.completed):
                res.release(slot)

    def _release_yielded(self, *, unreferenced_only: bool = False) -> None:
        """Releases the CPU batches handed out (all, or those no longer referenced); GPU copies stay pending.

        Also runs from an iterator's ``finally`` when the iterator is collected, which may be after
        the stream was closed behind the loader's back: at interpreter exit ``weakref.finalize``
        closes every stream first (``atexit``), and the generators still alive are collected
        during teardown afterwards. A closed stream has nothing to release, and by then module
        globals may be gone, so that case returns before using any.
        """
        if self._closed or self._broken is not None or not self._finalizer.alive:
            self._yielded.clear()
            return
        keep = []
        with contextlib.suppress(RingfeedError, OSError):
            while self._yielded:
                slot, refs = self._yielded.popleft()
                if unreferenced_only and any(r() is not None for r in refs):
                    keep.append((slot, refs))
                else:
                    self._res.release(slot)
        self._yielded.extend(keep)

    def _abandon(self) -> None:
        """Ends the current iteration: its batches are released and its iterator stops.

        The server's run goes on until the next ``start``; its late ``ready`` messages are then
        stale and released unread.
        """
        self._iteration += 1
        self._drop_ahead()
        self._release_yielded()

    def _guard(self, fn: Any, *args: Any) -> Any:
        """Runs ``fn``; an error that leaves the connection unusable closes the stream."""
        try:
            return fn(*args)
        except ServerDiedError as e:
            self._fail(e)
            reason = _last_words(e.unread)
            if reason is not None:
                raise self._server_error(reason) from e
            raise
        except ProtocolError as e:
            self._fail(e)
            raise
        except ServerError as e:
            if e.fatal:
                self._fail(e)
            raise

    def _fail(self, e: BaseException) -> None:
        self._broken = e
        self._yielded.clear()
        self._res.close()

    def _check_usable(self) -> None:
        if self._closed or not self._finalizer.alive:
            raise RingfeedError("the loader is closed")
        if self._broken is not None:
            raise RingfeedError(
                f"the loader's connection failed earlier ({self._broken}); create a new Loader and "
                f"load_state_dict() this one's state_dict() to resume"
            ) from self._broken

    def _count_step(self, t0: float) -> None:
        now = time.perf_counter()
        wait = now - t0
        gpu = min(self._gpu_s, wait)
        compute = t0 - self._last_return if self._last_return is not None else 0.0
        self._last_return = now
        self._stats["batches"] += 1
        self._stats["wait_s"] += wait
        self._stats["gpu_wait_s"] += gpu
        self._stats["compute_s"] += compute
        p = self._pending_stats
        p[0] += 1
        p[1] += int(wait * 1e9)
        p[2] += int(compute * 1e9)
        p[3] += int(gpu * 1e9)
        if p[0] >= STATS_EVERY or now - self._stats_sent >= STATS_PERIOD:
            conn = self._res.conn
            assert conn is not None
            msg = stats_message(
                p[0],
                p[1],
                p[2],
                p[3] if self._res.cuda is not None else None,
                minor=self.server_protocol[1],
                gpu_decode=self._finisher.take_counts() if self._finisher is not None else None,
            )
            # The batch is already counted as delivered: a server that died since is reported by
            # the next receive (or recovered from), not here, where the batch would be lost.
            with contextlib.suppress(ServerDiedError):
                conn.send(msg)
            p[:] = [0, 0, 0, 0]
            self._stats_sent = now
        if self.log_every is not None and self._stats["batches"] % self.log_every == 0:
            self._log_line(now)

    def _log_line(self, now: float) -> None:
        t0, b0, w0, c0, g0 = self._log_mark
        st = self._stats
        self._log_mark = (now, st["batches"], st["wait_s"], st["compute_s"], st["gpu_wait_s"])
        batches, wait, compute = st["batches"] - b0, st["wait_s"] - w0, st["compute_s"] - c0
        gpu = st["gpu_wait_s"] - g0
        rate = batches * self.batch_size / max(now - t0, 1e-9)
        total = max(wait + compute, 1e-9)
        behind = f", behind its GPU {gpu / total:.1%}" if self._res.cuda is not None else ""
        server = self._server_view()
        tuned = f" (server: {server['threads']} threads, depth {server['depth']})" if server else ""
        print(
            f"ringfeed: batch {st['batches']}: {rate:.0f} samples/s; the training loop waited for data "
            f"{(wait - gpu) / total:.1%} of its time{behind}{tuned}",
            file=sys.stderr,
            flush=True,
        )

    def _server_view(self) -> dict[str, Any] | None:
        """This stream's entry in the server's snapshot, or None (a 1.0 server, or unreachable)."""
        if self.stream_id is None:
            return None
        try:
            snap = snapshot(self.socket_path, timeout=5.0)
        except RingfeedError:
            return None
        view = next((s for s in snap["streams"] if s["stream"] == self.stream_id), None)
        remote = remote_stats(snap)
        if view is not None and remote is not None:
            # 1.3: the server's remote fetching (every remote dataset's), beside the stream's own.
            view = {**view, "remote": remote}
        return view

    # -- losing the server (``reconnect``) ------------------------------------------------------------

    def _resilient(self, fn: Any, *args: Any, resume: bool = False) -> Any:
        """Runs ``fn``; if the server is lost and ``reconnect`` allows, re-establishes the stream
        (restarting the run at the first undelivered batch when ``resume``) and runs it again."""
        while True:
            try:
                return fn(*args)
            except (ServerDiedError, ServerError) as e:
                # A server that dies, or one that says it stops on purpose (`shutdown`, 1.1: a
                # restart), is worth reconnecting to; any other error from the server is final.
                lost = isinstance(e, ServerDiedError) or (e.code == "shutdown" and e.fatal)
                if not lost or self._closed or self._reconnects_in_row >= self.reconnect:
                    raise
                self._recover(e)
                if resume:
                    self._resilient(self._start_run)

    def _recover(self, cause: BaseException) -> None:
        """Connects again and re-opens the stream; ``_guard`` has already closed the dead one.

        Retries while nothing listens at the socket (or the new server goes away during the
        handshake) for up to ``reconnect_timeout`` seconds; any other failure is final. The new
        connection numbers its runs and ``seq`` from the start.
        """
        # The taken-ahead batches belonged to the lost stream (its ring is gone with it).
        self._ahead.clear()
        self._held_msgs.clear()
        self._held_error = None
        self._reconnects_in_row += 1
        log.warning(
            "lost the ringfeed server at %s (%s); reconnecting (%d of %d in a row), then resuming epoch %d at batch %d",
            self.socket_path, cause, self._reconnects_in_row, self.reconnect, self._run_epoch, self._delivered,
        )  # fmt: skip
        known = (self.dataset_len, self.samples_per_rank, self.batches_per_epoch)
        deadline = time.monotonic() + self.reconnect_timeout
        delay = 0.02
        while True:
            try:
                self._connect()
                break
            except RingfeedError as e:
                self._res.close()
                # Plain RingfeedError: nothing listens (yet); ServerDiedError: it went away again.
                if not (type(e) is RingfeedError or isinstance(e, ServerDiedError)):
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerDiedError(
                        f"lost the ringfeed server at {self.socket_path} ({cause}), and could not reconnect "
                        f"within reconnect_timeout={self.reconnect_timeout} s: {e}"
                    ) from cause
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.25)
            except BaseException:
                self._res.close()
                raise
        now = (self.dataset_len, self.samples_per_rank, self.batches_per_epoch)
        if now != known:
            self._res.close()
            raise RingfeedError(
                f"after reconnecting, the dataset {self.path} has (samples, samples per rank, batches per epoch) "
                f"{now}, not {known}: it changed, so the epoch cannot be resumed"
            ) from cause
        self._broken = None
        self._run = self._last_seq = 0
        self._pending_stats = [0, 0, 0, 0]
        self._stats["reconnects"] += 1

    # -- epochs, state ------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration delivers (its order and augmentations).

        Setting a different epoch abandons an iteration in progress (its batches are released)
        and starts the new epoch from its first batch. Setting the epoch a loaded
        ``state_dict`` holds keeps its resume point, so the usual loop
        ``for epoch in range(saved_epoch, n): loader.set_epoch(epoch); for batch in loader: ...``
        resumes mid-epoch exactly.
        """
        epoch = _int_in("epoch", epoch, 0, MAX_EPOCH)
        if epoch != self._epoch:
            self._abandon()
            self._epoch = epoch
            self._cursor = self._delivered = self._run_position = 0
            self._resumed = False

    def _run_batches(self) -> int:
        """Batches this rank gets in the current run (from ``_run_position``)."""
        return batches_from(
            self.dataset_len, self._run_position, self.world_size, self.batch_size, drop_last=self.drop_last
        )

    def state_dict(self) -> dict[str, Any]:
        """The stream's position: enough to resume it exactly, mid-epoch, in a new loader, with this
        or another ``world_size`` and ``batch_size`` (control.md, "Resume by a global position").

        ``position`` is the global position: the samples (windows, for tokens) of the epoch's order
        that all ranks together have consumed, ``dataset_len`` once the epoch is done.
        ``batches_delivered`` counts the batches of the current run handed out so far (a batch
        counts once it has been returned by the iterator; the run starts at ``run_position``, 0
        unless this loader resumed a state saved under another world or batch size). Every
        rank's state holds the same position when the ranks step together, so any rank's state
        can be loaded on every rank.
        """
        return self._state_at(self._delivered)

    def _state_at(self, delivered: int) -> dict[str, Any]:
        """``state_dict()`` as it would be after ``delivered`` batches of the current run."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self._epoch,
            "position": position_after(
                self.dataset_len, self._run_position, delivered, self.world_size, self.batch_size, self.drop_last
            ),
            "run_position": self._run_position,
            "batches_delivered": delivered,
            "rank": self.rank,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "order": self.order,
            "order_block": self.order_block,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``state_dict()``: the next iteration delivers the rest of the saved epoch.

        With the ``world_size`` and ``batch_size`` the state was saved with, it starts at batch
        ``batches_delivered``, exactly the batches the saving loader had not delivered. With
        another world or batch size, the rest of the epoch from the state's global position is
        re-striped over the ranks (every rank must load the same state): every sample not yet
        consumed is delivered once, as ``DistributedSampler`` would split it (control.md, "Resume
        by a global position"). A position that is not a multiple of the new
        ``world_size * batch_size`` needs a 1.3 server.

        Raises:
            ValueError: the state was saved with a different seed, shuffle, drop_last or order
                (another order of the samples), or (version 1) another batch size or world size,
                or is malformed.
            RingfeedError: the resume needs a 1.3 server and this one is older.
        """
        version = state.get("version", 1)
        if version not in (1, STATE_VERSION):
            raise ValueError(f"state_dict version {version!r} is not {STATE_VERSION} (or 1)")
        fixed = (
            ("seed", "batch_size", "world_size", "shuffle", "drop_last", "order", "order_block")
            if version == 1
            else ("seed", "shuffle", "drop_last", "order", "order_block")
        )
        for key in fixed:
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r} but this loader has {key}={getattr(self, key)!r}; "
                    f"construct the Loader with {key}={state[key]!r} to resume exactly"
                )
        for key in ("epoch", "batches_delivered"):
            if key not in state:
                raise ValueError(f"the state has no {key!r}")
        epoch = _int_in("state['epoch']", state["epoch"], 0, MAX_EPOCH)
        world = _int_in("state['world_size']", state.get("world_size", self.world_size), 1, MAX_SEED)
        batch = _int_in("state['batch_size']", state.get("batch_size", self.batch_size), 1, MAX_BATCH_SIZE)
        run_position = _int_in("state['run_position']", state.get("run_position", 0), 0, self.dataset_len)
        saved = batches_from(self.dataset_len, run_position, world, batch, drop_last=self.drop_last)
        delivered = _int_in("state['batches_delivered']", state["batches_delivered"], 0, saved)
        position = position_after(self.dataset_len, run_position, delivered, world, batch, self.drop_last)
        step = self.world_size * self.batch_size
        if position >= self.dataset_len:
            run_position, cursor = 0, self.batches_per_epoch  # the epoch is done
        elif position % step == 0:
            # On a batch boundary of this configuration: exactly batches k.. of the whole epoch.
            run_position, cursor = 0, min(position // step, self.batches_per_epoch)
        else:
            if self.server_protocol < (1, 3):
                major, minor = self.server_protocol
                raise RingfeedError(
                    f"resuming at global position {position} with world_size={self.world_size}, "
                    f"batch_size={self.batch_size} (not a multiple of {step}) re-stripes the epoch, which needs a "
                    f"ringfeed server with protocol 1.3; this one speaks {major}.{minor} (upgrade the server, or "
                    f"resume with world_size * batch_size dividing {position})"
                )
            run_position, cursor = position, 0
        self._abandon()
        self._epoch = epoch
        self._run_position = run_position
        self._resumed = True
        self._cursor = self._delivered = cursor

    # -- life cycle ---------------------------------------------------------------------------------

    def stats(self, server: bool = True) -> dict[str, Any]:
        """Counters since construction: ``batches``, ``wait_s`` (time spent inside ``next()``),
        ``gpu_wait_s`` (the part of it spent behind the GPU in CUDA mode: a copy's launch or event
        queued behind the model's work; 0 on the CPU), ``data_wait_s`` (the rest: waiting for the
        server's data), ``compute_s`` (time between batches), ``skipped`` (samples left out under
        ``on_error="skip"``), and the shares of ``wait_s + compute_s``: ``wait_share``,
        ``data_wait_share``, ``gpu_wait_share``. With hybrid decode also ``gpu_samples`` (samples
        this process finished on its GPU), ``gpu_decode_s`` (its host time on them),
        ``gpu_fallbacks`` (those the GPU decoder refused, decoded on the host instead) and
        ``gpu_decode_wait_s`` (the part of ``data_wait_s`` spent waiting for GPU decodes started
        ahead to leave the decode threads: where it grows, the decode threads, not the server,
        hold the loop back).

        With ``server`` (and a 1.1 server), ``"server"`` holds what the server measures for this
        stream, as ``ringfeed top`` shows it: ``threads``, ``depth``, ``slots``, ``samples_per_s``,
        ``wait`` (1.2: for data, net of the GPU wait), ``step_ms``, ``stage_us``
        (read/decode/transform/write per sample), ``tune`` (the autotuner's last decision); from a
        1.2 server also ``gpu_wait``, ``busy`` (the share of the stream's allotted decode threads'
        time spent on its samples) and ``limit`` (what limits the loop now); from a 1.3 server with
        hybrid decode ``gpu_share`` (the share offered to the GPU now) and ``gpu_samples`` (handed
        over, including batches prepared ahead). ``None`` when the server cannot say.
        """
        out: dict[str, Any] = dict(self._stats)
        out["data_wait_s"] = max(out["wait_s"] - out["gpu_wait_s"], 0.0)
        total = out["wait_s"] + out["compute_s"]
        out["wait_share"] = out["wait_s"] / total if total > 0 else 0.0
        out["data_wait_share"] = out["data_wait_s"] / total if total > 0 else 0.0
        out["gpu_wait_share"] = out["gpu_wait_s"] / total if total > 0 else 0.0
        if self._finisher is not None:
            samples, ns, fallbacks, waited = self._finisher.totals
            out["gpu_samples"], out["gpu_decode_s"], out["gpu_fallbacks"] = samples, ns / 1e9, fallbacks
            out["gpu_decode_wait_s"] = waited / 1e9
        if server:
            out["server"] = self._server_view()
        return out

    def close(self) -> None:
        """Releases everything: waits for GPU copies, unpins, closes the stream and unmaps the ring.

        CPU views handed out earlier stay readable memory (the unmap waits for them), but no
        longer belong to the stream. Idempotent; also run when the loader is garbage collected.
        """
        self._closed = True
        self._yielded.clear()
        self._finalizer()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch {self._epoch}, {self._delivered} batches delivered"
        return (
            f"<ringfeed.Loader {self.path!r} batch_size={self.batch_size} rank={self.rank}/{self.world_size} "
            f"device={self.device} ({state})>"
        )


def _nothing() -> Generator[Any, None, None]:
    """An iteration that yields nothing (an epoch already complete)."""
    yield from ()


def _last_words(unread: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first well-formed ``error`` among the messages a dead server left unread, if any."""
    for msg in unread:
        if msg.get("type") == "error":
            try:
                check_server_message(msg)
            except ProtocolError:
                continue
            return msg
    return None


# -- the global position (control.md, "Resume by a global position") -----------------------------


def batches_from(n: int, position: int, world: int, batch: int, *, drop_last: bool) -> int:
    """Batches each of ``world`` ranks gets of the rest of an epoch of ``n`` samples from ``position``."""
    rest = max(n - position, 0)
    per_rank = rest // world if drop_last else -(-rest // world)
    return per_rank // batch if drop_last else -(-per_rank // batch)


def position_after(n: int, run_position: int, delivered: int, world: int, batch: int, drop_last: bool) -> int:
    """The global position after every rank took ``delivered`` batches of a run from ``run_position``."""
    if delivered >= batches_from(n, run_position, world, batch, drop_last=drop_last):
        return n
    return min(n, run_position + delivered * batch * world)


# -- parameters ---------------------------------------------------------------------------------


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..={hi}, got {value!r}")
    return int(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _check_timeout(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def _check_transform(transform: Any) -> tuple[Views | None, dict[str, Any] | None]:
    """The loader's views, or (for a protocol 1.1 ``transform`` object given as a dict) that dict."""
    if isinstance(transform, Mapping) and isinstance(transform.get("kind"), str):
        return None, dict(transform)
    return as_views(transform), None


def _legacy_ops(legacy: dict[str, Any] | None) -> Any:
    """Stand-in ops for a 1.1 ``transform`` dict (only its output size matters client-side)."""
    from ._transforms import CenterCrop

    assert legacy is not None
    size = legacy.get("size", [1, 1])
    return CenterCrop(tuple(size) if isinstance(size, list) and len(size) == 2 else 1)


class _SampleDecodeError(ServerError):
    """Samples of a batch that neither the GPU nor the host could decode, under ``on_error="raise"``."""


class _Finish:
    """Finishes one batch's GPU samples (hybrid decode) into its image tensor, then applies ``on_error``."""

    def __init__(self, loader: Loader, jobs: Any, arena: Any, header: Any, index: Any, pending: Any = None) -> None:
        self.loader, self.jobs, self.arena, self.header, self.index = loader, jobs, arena, header, index
        self.pending = pending
        self.skipped = 0

    def __call__(self, out: dict[str, Any], stream: Any = None) -> dict[str, Any]:
        from .gpu.hybrid import DecodeError

        lo = self.loader
        assert lo.views is not None
        (name,) = lo.views.views
        try:
            lo._finisher(self.jobs, self.arena, out[name], stream, self.pending)
            return out
        except DecodeError as e:
            failed = e.failed
        where = f"batch {self.header.batch} of epoch {self.header.epoch} of {lo.path}"
        named = [
            f"sample #{int(self.index[p])}" if self.index is not None else f"position {p} of {where}" for p, _ in failed
        ]
        if lo.on_error == "raise":
            detail = "; ".join(f"{n}: {r}" for n, (_, r) in zip(named, failed, strict=True))
            raise _SampleDecodeError(
                "sample",
                f"{len(failed)} sample(s) of {where} do not decode (hybrid decode): {detail}; "
                f"pass on_error='skip' to leave such samples out",
                sample=int(self.index[failed[0][0]]) if self.index is not None else None,
                fatal=False,
            )
        import torch

        keep = [p for p in range(next(iter(out.values())).shape[0]) if p not in {p for p, _ in failed}]
        self.skipped = len(failed)
        rows = torch.as_tensor(keep, dtype=torch.long)
        return {k: v.index_select(0, rows.to(v.device)) for k, v in out.items()}


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


#: The per-image ops hybrid decode finishes on the GPU (control.md, "Hybrid decode"); the batch
#: ops run on the client anyway.
_GEOMETRIC = frozenset(
    {"random_resized_crop", "resize", "center_crop", "random_crop", "horizontal_flip", "vertical_flip"}
)
_BATCH_OPS = frozenset({"normalize", "random_erasing"})


def _gpu_plan(
    gpu_decode: Any, backend: str | None, device: Any, views: Views | None, autotune: bool
) -> tuple[float | bool | None, str | None, str | None]:
    """``(share, backend, why off)`` for ``Loader(gpu_decode=...)``: share a float (pinned), ``None``
    (the tuner's), or ``False`` (off, with the reason)."""
    if gpu_decode is False:
        return False, None, "gpu_decode=False"
    if gpu_decode == "auto" or gpu_decode is True:
        pinned: float | None = None
    elif isinstance(gpu_decode, (int, float)) and not isinstance(gpu_decode, bool) and 0.0 <= gpu_decode <= 1.0:
        pinned = float(gpu_decode)
    else:
        raise ValueError(f"gpu_decode must be 'auto', True, False or a share in 0..1, got {gpu_decode!r}")
    why = _gpu_pipeline_problem(views)
    if backend is None:
        from .gpu.hybrid import backend_for

        backend, reason = backend_for(device)
        if backend is None:
            why = why or reason
    if why is not None:
        if pinned is not None or gpu_decode is True:
            raise ValueError(f"gpu_decode={gpu_decode!r} cannot work: {why}")
        on_gpu = getattr(device, "type", "cpu") == "cuda"
        (log.warning if on_gpu else log.info)("ringfeed: GPU decode is off: %s", why)
        return False, None, why
    if pinned is None and not autotune:
        # Without the autotuner nobody would set the share: "auto" then means off.
        return False, None, "autotune=False and gpu_decode='auto' (pin a share, e.g. gpu_decode=0.5)"
    return pinned, backend, None


def _gpu_pipeline_problem(views: Views | None) -> str | None:
    """Why hybrid decode cannot finish this pipeline on the GPU, or ``None``."""
    if views is None:
        return "the 1.1 transform dict form is decoded on the CPU"
    return _gpu_pipeline_doc_problem(views.to_json())


def _gpu_pipeline_doc_problem(doc: dict[str, Any]) -> str | None:
    """The same for a pipeline as the wire carries it (control.md, ``open.pipeline``): the
    server's rule (``ops::gpu::finishable``), whose verdicts ``proto/vectors/control/hybrid.json``
    pins for both sides."""
    views = doc["views"]
    if len(views) != 1:
        return f"the pipeline has {len(views)} views; GPU decode finishes one"
    (view,) = views
    count = view.get("count", 1)
    if count != 1:
        return f"the view makes {count} images per sample; GPU decode finishes one"
    ops = [op["op"] for op in view["ops"] if op["op"] not in _BATCH_OPS]
    for op in ops:
        if op not in _GEOMETRIC:
            return (
                f"{op} is not geometric (GPU decode finishes crops, flips and one resize; the other ops run on the CPU)"
            )
    if sum(op in ("resize", "random_resized_crop") for op in ops) > 1:
        return "the pipeline resizes twice; GPU decode finishes one resize"
    return None


def _check_fields(fields: Sequence[str] | None, views: Views | None) -> tuple[str, ...]:
    """Every field the ring must carry: each view's images (and erasing boxes), ``label``, the extras."""
    if views is None:
        out = ["image", "label"]
    else:
        out = []
        for name, v in views.views.items():
            out.append(name)
            if v.transform.erasing:
                out.append(f"{name}_erase")
        out.append("label")
    if fields is None:
        return tuple(out)
    if isinstance(fields, str):
        fields = [fields]
    for name in fields:
        if name in out:
            continue
        if name not in FIELDS:
            known = ", ".join([*(views.views if views else ["image"]), *FIELDS])
            raise ValueError(f"fields: unknown field {name!r}; the server delivers {known}")
        out.append(name)
    return tuple(out)


def _check_webdataset(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if options is None:
        return None
    out = dict(options)
    for key, value in out.items():
        kind = WEBDATASET_OPTIONS.get(key)
        if kind is None:
            raise ValueError(f"webdataset: unknown option {key!r} (known: {', '.join(WEBDATASET_OPTIONS)})")
        if not isinstance(value, kind):
            raise ValueError(f"webdataset[{key!r}] must be a {kind.__name__}, got {value!r}")
    return out


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"the environment variable {name}={raw!r} is not an integer") from None


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` from the arguments, else torchrun's ``RANK``/``WORLD_SIZE``, else ``(0, 1)``."""
    if rank is None:
        rank = _env_int("RANK")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE")
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = _int_in("world_size", world_size, 1, MAX_SEED)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in 0..{world_size} (world_size={world_size}), got {rank!r}")
    return rank, world_size


def resolve_device(device: Any) -> Any:
    """``"cpu"`` stays a string (no torch needed); anything else becomes a ``torch.device``.

    ``"cuda"`` without an index is ``cuda:$LOCAL_RANK`` under torchrun, else the current device.
    """
    if device == "cpu":
        return "cpu"
    try:
        import torch
    except ImportError:
        raise ValueError(f"device={device!r} needs torch, which is not installed") from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ValueError(f"device must be the CPU or a CUDA device, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but CUDA is not available (torch.cuda.is_available() is False)")
    if dev.index is None:
        local = _env_int("LOCAL_RANK")
        dev = torch.device("cuda", local if local is not None else torch.cuda.current_device())
    if not 0 <= dev.index < torch.cuda.device_count():
        raise ValueError(f"device {dev} does not exist: this process sees {torch.cuda.device_count()} CUDA devices")
    return dev


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
