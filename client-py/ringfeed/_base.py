"""What ``Loader`` and ``TokenLoader`` share: the iterator protocol over one ``_stream.Stream``.

Each loader is a stream (the connection, the ring, slot ownership, runs, resume, reconnecting)
and its sample kind's batch maker; ``BaseLoader`` is the public face both have: ``len()``,
iteration, ``set_epoch``, ``state_dict``/``load_state_dict``, ``stats``, ``close`` and the
context manager, and the stream's settings and what the server said, as read-only attributes.
Everything it does is the stream's; a loader adds its constructor, its kind's attributes and its
``repr``.
"""

from __future__ import annotations

import operator
from collections.abc import Generator, Mapping
from typing import Any, TypeVar

from ._options import StreamConfig, deprecated
from ._stream import BatchMaker, Resources, Stream

__all__ = ["BaseLoader", "From"]

_L = TypeVar("_L", bound="BaseLoader")


class From:
    """A read-only loader attribute that is its stream's, its settings' or its kind's (``where``,
    a dotted path from the loader), under the same name."""

    def __init__(self, where: str) -> None:
        self._get = operator.attrgetter(where)
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(self._get(obj), self.name)


class BaseLoader:
    """A stream of batches and its batch maker, iterated (see ``Loader``)."""

    _stream: Stream
    _kind: BatchMaker

    # The stream's settings (`Loader`'s arguments, checked).
    path = From("_stream.cfg")
    batch_size = From("_stream.cfg")
    shuffle = From("_stream.cfg")
    seed = From("_stream.cfg")
    drop_last = From("_stream.cfg")
    device = From("_stream.cfg")
    rank = From("_stream.cfg")
    world_size = From("_stream.cfg")
    slots = From("_stream.cfg")
    hold = From("_stream.cfg")
    timeout = From("_stream.cfg")
    socket_path = From("_stream.cfg")
    autotune = From("_stream.cfg")
    threads = From("_stream.cfg")
    prefetch = From("_stream.cfg")
    log_every = From("_stream.cfg")
    reconnect = From("_stream.cfg")
    reconnect_timeout = From("_stream.cfg")
    order_block = From("_stream.cfg")
    # What the server said at `open` (again after a reconnect).
    server_protocol = From("_stream")
    #: The server's version string (``welcome.server``, e.g. ``"ringfeed 0.1.0"``).
    server_version = From("_stream")
    #: The server's sidecar log, when this loader started the server.
    server_log = From("_stream")
    #: The server's id for this stream (protocol 1.1), as ``ringfeed top`` shows it.
    stream_id = From("_stream")
    #: The order the server uses (``"global"`` or ``"shard_blocks"``), from its ``ring``.
    order = From("_stream")
    classes = From("_stream")
    dataset_len = From("_stream")
    samples_per_rank = From("_stream")
    batches_per_epoch = From("_stream")
    epoch = From("_stream")

    def _start(self, cfg: StreamConfig, kind: BatchMaker) -> None:
        """Connects and opens the stream (the constructors' last step)."""
        self._kind = kind
        self._stream = Stream(cfg, kind)
        self._stream.open()

    @property
    def _res(self) -> Resources:
        """The stream's connection, ring and copier (benches/e2e/h2d.py reads the ring through it)."""
        return self._stream.res

    def __len__(self) -> int:
        """Batches per epoch for this rank (``batches_per_epoch`` from the server)."""
        return self._stream.batches_per_epoch

    def __iter__(self) -> Generator[Any, None, None]:
        """Starts a run at the current epoch and cursor; yields batches until the epoch's end.

        A new iteration abandons the previous one: its batches are released (CPU batches the
        user still refers to move to private memory first, keeping their values) and its
        iterator raises ``RuntimeError`` if used again.
        """
        return self._stream.iterate()

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration delivers (its order and augmentations).

        Setting a different epoch abandons an iteration in progress (its batches are released)
        and starts the new epoch from its first batch. Setting the epoch a loaded
        ``state_dict`` holds keeps its resume point, so the usual loop
        ``for epoch in range(saved_epoch, n): loader.set_epoch(epoch); for batch in loader: ...``
        resumes mid-epoch exactly.
        """
        self._stream.set_epoch(epoch)

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
        return self._stream.state_at(self._stream.delivered)

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
        self._stream.load_state_dict(state)

    @property
    def server(self) -> str | None:
        """Deprecated: ``server_version``. (``server=`` now names a loader's
        ``ringfeed.Server`` options, so the attribute got a name of its own.)"""
        deprecated("loader.server", "loader.server_version", 2)
        return self.server_version

    def stats(self, server: bool = True) -> dict[str, Any]:
        """Counters since construction: ``batches``, ``wait_s`` (time spent inside ``next()``),
        ``gpu_wait_s`` (the part of it spent behind the GPU in CUDA mode: a copy's launch or event
        queued behind the model's work; 0 on the CPU), ``data_wait_s`` (the rest: waiting for the
        server's data), ``compute_s`` (time between batches), ``skipped`` (samples left out under
        ``on_error="skip"``), ``reconnects``, and the shares of ``wait_s + compute_s``:
        ``wait_share``, ``data_wait_share``, ``gpu_wait_share``. With hybrid decode also
        ``gpu_samples`` (samples this process finished on its GPU), ``gpu_decode_s`` (its host
        time on them), ``gpu_fallbacks`` (those the GPU decoder refused, decoded on the host
        instead) and ``gpu_decode_wait_s`` (the part of ``data_wait_s`` spent waiting for GPU
        decodes started ahead to leave the decode threads: where it grows, the decode threads,
        not the server, hold the loop back); with decoded pixels (1.11) ``gpu_pixel_samples``
        (samples the server decoded and this process finished on its GPU).

        With ``server`` (and a 1.1 server), ``"server"`` holds what the server measures for this
        stream, as ``ringfeed top`` shows it: ``threads``, ``depth``, ``slots``, ``samples_per_s``,
        ``wait`` (1.2: for data, net of the GPU wait), ``step_ms``, ``stage_us``
        (read/decode/transform/write per sample), ``tune`` (the autotuner's last decision); from a
        1.2 server also ``gpu_wait``, ``busy`` (the share of the stream's allotted decode threads'
        time spent on its samples) and ``limit`` (what limits the loop now); from a 1.3 server with
        hybrid decode ``gpu_share`` (the share offered to the GPU now) and ``gpu_samples`` (handed
        over, including batches prepared ahead); from a 1.11 server ``pixel_samples`` (decoded by
        the server and handed over as pixels) once there are some. ``None`` when the server cannot say.
        """
        return self._stream.stats(server)

    def close(self) -> None:
        """Releases everything: waits for GPU copies, unpins, closes the stream and unmaps the ring.

        CPU views handed out earlier stay readable memory (the unmap waits for them), but no
        longer belong to the stream. Idempotent; also run when the loader (and every iterator of
        it) is garbage collected.
        """
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.close()

    def __enter__(self: _L) -> _L:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _state(self) -> str:
        """The life-cycle part of ``repr``."""
        st = self._stream
        return "closed" if st.closed else f"epoch {st.epoch}, {st.delivered} batches delivered"
