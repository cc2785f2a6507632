"""One stream of batches from a ringfeed server (``proto/control.md``, "Session"), whatever its
sample kind: the connection, the ring, slot ownership, runs, resume and reconnecting.

A ``Stream`` connects to the server (starting a sidecar when none listens and no socket was
given), says ``hello``, ``open``\\ s the dataset, maps the ring the server answers with
(``proto/ring.md``), and then, for each iteration, sends ``start {epoch, first_batch}`` and turns
each ``ready`` into a batch through its ``BatchMaker``: the sample kind's half, which says what
``open`` asks for, which ring fields it reads, and how a held slot becomes the batch handed out
(``_images.ImageBatches``, ``_tokens.TokenBatches``). ``Loader`` and ``TokenLoader`` are each a
stream and its batch maker (``_base.BaseLoader``).

Ownership (ring.md, "Slot states and ownership"): every ``ready`` makes a slot HELD by this
stream (``Resources.held``), and every held slot is released exactly once:

- CPU mode: the batch handed out is a zero-copy view of the slot. Its slot is released once
  ``hold`` more batches have been requested, a new iteration starts, or the loader is closed.
  When an iteration ends early (``break``, a dropped iterator), batches nobody refers to any more
  are released at once. A batch is never overwritten under the user's eyes: a slot going back
  while the user still refers to its tensors first moves them to private memory (``_give_back``:
  a copy, then ``Tensor.set_``, so the user's tensor objects keep their values), which makes
  ``list(loader)`` and kept references correct; when the user lets go in time, nothing is
  copied. Views the user cut from a batch (an index, ``.view``, ``.numpy()``) are not moved: they
  are valid until the batch's slot goes back.
- CUDA mode: the slot is copied to the GPU on a side stream, and released once the copy's event
  has completed (polled at every batch; awaited when the stream would otherwise wait on the
  server while holding every slot, and at ``close()``). The user never sees ring memory.
- ``ready`` messages of a run the stream no longer wants (an earlier iteration) are released at
  once, unread.

End of epoch (``None`` from ``next_batch``, ``StopIteration`` for the user), timeout
(``ringfeed.TimeoutError``) and failure (``ServerError``, ``ServerDiedError``, ``ProtocolError``)
are distinct. A non-fatal ``sample`` error ends only the current iteration; the others make the
stream unusable (unless ``reconnect`` re-establishes it), but its ``state_dict()`` still resumes
it exactly in a new loader.

Not thread-safe: one thread iterates a stream.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import time
import warnings
import weakref
from collections.abc import Generator, Mapping
from typing import Any, Literal, overload

from ._errors import ProtocolError, RingfeedError, ServerDiedError, ServerError
from ._meter import Meter
from ._options import MAX_BATCH_SIZE, MAX_EPOCH, MAX_SEED, StreamConfig, check_remote_protocol, env_int, int_in
from ._version import __version__
from .wire.observe import snapshot
from .wire.protocol import PROTOCOL, Connection, check_server_message, remote_stats, stats_message
from .wire.ring import Segment
from .wire.sidecar import connect

__all__ = ["BatchMaker", "Resources", "Stream", "batches_from", "position_after"]

log = logging.getLogger("ringfeed")

#: Connections tried when a server closes before its welcome (see ``Stream._handshake``).
HANDSHAKE_ATTEMPTS = 3
#: Version of the ``state_dict()`` layout (control.md, "Resume by a global position"); version 1
#: (without ``position``) is still loaded.
STATE_VERSION = 2


class Resources:
    """Everything a stream holds outside Python's heap: the connection, the ring, the pinning.

    Kept apart from ``Stream`` so that ``weakref.finalize`` can close it without keeping the
    stream alive. ``held`` maps each slot this client holds to the ``seq`` that delivered it.
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


class BatchMaker:
    """A sample kind's half of a stream: what its ``open`` asks for, the ring fields it reads, and
    how a held slot becomes a batch. This base makes the plain batch (the slot's fields, copied to
    the GPU or handed out as views); a kind overrides what it adds."""

    def open_members(self, cfg: StreamConfig, server_protocol: tuple[int, int]) -> dict[str, Any]:
        """The kind's members of ``open`` (control.md, "open")."""
        raise NotImplementedError

    def ring_fields(self) -> tuple[str, ...]:
        """The ring fields this kind reads and hands out, in order."""
        raise NotImplementedError

    def field_spec(self, name: str) -> tuple[str, tuple[int | None, ...]]:
        """A field's dtype and per-sample shape (``None``: not known here)."""
        raise NotImplementedError

    def attach(self, segment: Segment, cfg: StreamConfig) -> Any:
        """The ring is mapped (again, after a reconnect): returns what must be closed before it is
        unmapped (hybrid decode's finisher), or ``None``."""
        return None

    def make(self, st: Stream, slot: int, header: Any, pending: Any = None) -> Any:
        """The batch of held ``slot``; the slot is released, or handed out, or its copy pending."""
        views = st.ring_views(slot, header.count)
        out = st.to_device(views, slot) if st.res.cuda is not None else st.hand_out(slot, views)
        st.count_delivered(header)
        return self.shape(out)

    def shape(self, out: dict[str, Any]) -> Any:
        """What the iterator yields for a batch's fields."""
        return out

    # Batches taken ahead of the loop (hybrid decode's look-ahead); none by default.

    def take_ahead(self) -> tuple[int, Any, Any] | None:
        """The oldest batch taken ahead, ``(slot, header, pending work)``, or ``None``."""
        return None

    def look_ahead(self, st: Stream) -> None:
        """A batch was handed out: take the next ones ahead if the server has them (never waits)."""

    def drop_ahead(self, st: Stream) -> None:
        """The iteration is abandoned: release the batches taken ahead."""

    def forget_ahead(self) -> None:
        """The connection was lost: the batches taken ahead went with its ring."""

    def gpu_counts(self) -> tuple[int, int, int, int] | None:
        """Hybrid decode's counts since the last ``stats`` message (``stats_message(gpu_decode=)``)."""
        return None

    def add_stats(self, out: dict[str, Any]) -> None:
        """Adds the kind's own counters to ``stats()``."""


class Stream:
    """One stream: ``cfg`` the settings, ``kind`` the sample kind's ``BatchMaker``.

    Constructing it checks nothing and connects nowhere; ``open()`` does both.
    """

    def __init__(self, cfg: StreamConfig, kind: BatchMaker) -> None:
        self.cfg = cfg
        self.kind = kind
        self.res = Resources()
        self._finalizer = weakref.finalize(self, self.res.close)
        self.meter = Meter()
        # What the server said (`welcome`, `ring`); set by `_connect`, again after a reconnect.
        self.server_protocol: tuple[int, int] = PROTOCOL
        self.server_version: str | None = None
        #: The server's sidecar log, when this stream started the server.
        self.server_log: str | None = None
        #: The server's id for this stream (protocol 1.1), as ``ringfeed top`` shows it.
        self.stream_id: int | None = None
        #: The order the server uses (``"global"`` or ``"shard_blocks"``), from its ``ring``.
        self.order = "global"
        self.classes: tuple[str, ...] = ()
        self.dataset_len = self.samples_per_rank = self.batches_per_epoch = 0
        # Messages read while looking ahead (`poll_ready`), not yet acted on, and an error met there.
        self._held_msgs: collections.deque[dict[str, Any]] = collections.deque()
        self._held_error: BaseException | None = None
        # Position (see `state_dict`).
        self.epoch = 0
        self.delivered = 0
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
        #: CPU batches handed out and not yet given back, oldest first: (slot, weak references to
        #: its tensors).
        self._yielded: collections.deque[tuple[int, list[weakref.ref[Any]]]] = collections.deque()
        #: The epoch whose run last ended, until ``set_epoch`` or ``load_state_dict``: a shuffled
        #: iteration starting at it again repeats its order (warned of once).
        self._ended_epoch: int | None = None
        self._warned_repeat = False
        self._broken: BaseException | None = None
        self.closed = False
        self._reconnects_in_row = 0  # re-establishments since the last batch or `end` (see `_recover`)

    def open(self) -> None:
        """Connects and opens the stream; on failure everything is closed again."""
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    # -- connection ---------------------------------------------------------------------------------

    def _connect(self) -> None:
        welcome = self._handshake()
        conn = self.res.conn
        assert conn is not None
        major, minor = welcome["protocol"]
        if major != PROTOCOL[0]:
            raise ProtocolError(
                f"{conn.name} speaks protocol {major}.{minor}, but this client speaks {PROTOCOL[0]}.{PROTOCOL[1]}; "
                f"install the ringfeed Python package that matches the server"
            )
        self.server_protocol = (major, minor)
        self.server_version = welcome.get("server")
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
        self.res.segment = segment
        self._check_ring(segment)
        self.classes = tuple(ring["classes"])
        self.dataset_len = ring["dataset_len"]
        self.samples_per_rank = ring["samples_per_rank"]
        self.batches_per_epoch = ring["batches_per_epoch"]
        self.stream_id = ring.get("stream")
        self.order = ring.get("order", "global")
        #: 1.6: the server's fingerprint of the served data (control.md, "Dataset identity").
        self.dataset_id: str | None = ring.get("dataset_id")
        if self.cfg.cuda:
            from .gpu.device import CudaCopier

            self.res.cuda = CudaCopier(segment, self.cfg.device)
        self.res.finisher = self.kind.attach(segment, self.cfg)

    def _on_opening(self, msg: dict[str, Any]) -> None:
        """Reports a long open's progress: on the ``ringfeed`` logger, and to ``on_opening``."""
        if self.cfg.on_opening is not None:
            self.cfg.on_opening(msg["listed"], msg["elapsed_ms"] / 1000)
        log.info("ringfeed: listing %s: %d files after %.0f s", msg["dataset"], msg["listed"], msg["elapsed_ms"] / 1000)

    def _handshake(self) -> dict[str, Any]:
        """Connects (starting a sidecar if allowed), says hello, returns the welcome.

        A server that closes the connection before its welcome was exiting as this stream
        connected (a sidecar leaving ``--exit-when-idle``): the stream connects again, which
        starts a new sidecar when that is allowed, or names the socket when it is not.
        """
        cfg = self.cfg
        hint = f"; if batches legitimately take longer, raise server=ringfeed.Server(timeout=...) (now {cfg.timeout} s)"
        for attempt in range(HANDSHAKE_ATTEMPTS):
            conn, self.server_log = connect(
                cfg.socket_path,
                spawn=cfg.spawn,
                timeout=cfg.timeout,
                timeout_hint=hint,
                spawn_timeout=cfg.spawn_timeout,
            )
            if self.server_log is not None:
                conn.name += f" (log: {self.server_log})"
                conn.timeout_hint += f", or see the server's log {self.server_log}"
            self.res.conn = conn
            try:
                hello = {"type": "hello", "protocol": list(PROTOCOL), "client": f"ringfeed-py {__version__}"}
                conn.send(hello | {"pid": os.getpid()})
                return self._expect("welcome")
            except ServerDiedError:
                conn.close()
                self.res.conn = None
                if attempt + 1 == HANDSHAKE_ATTEMPTS:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def _open_message(self) -> dict[str, Any]:
        """The ``open``: the members every sample kind shares, and the kind's own."""
        cfg = self.cfg
        # 1.9: gs:// and az:// only to a server that fetches them (an older one takes them for paths).
        check_remote_protocol([cfg.path], self.server_protocol)
        msg: dict[str, Any] = {
            "type": "open",
            "dataset": cfg.path,
            "batch_size": cfg.batch_size,
            **self.kind.open_members(cfg, self.server_protocol),
            "shuffle": cfg.shuffle,
            "seed": cfg.seed,
            "drop_last": cfg.drop_last,
            "rank": cfg.rank,
            "world_size": cfg.world_size,
            "slots": cfg.slots,
        }
        if self.server_protocol >= (1, 1):
            msg["autotune"] = cfg.autotune
            if cfg.threads is not None:
                msg["threads"] = cfg.threads
            if cfg.prefetch is not None:
                msg["prefetch"] = cfg.prefetch
            local = env_int("LOCAL_WORLD_SIZE")
            if local is not None and 1 <= local <= 4096:
                msg["local_world_size"] = local
        return msg

    def _check_ring(self, segment: Segment) -> None:
        """The ring must carry what was asked for, in the shapes asked for."""
        if segment.batch_size != self.cfg.batch_size:
            raise ProtocolError(
                f"the ring holds batches of {segment.batch_size}, but the loader asked for {self.cfg.batch_size}"
            )
        if self.cfg.hold > segment.slot_count:
            raise ProtocolError(f"the ring has {segment.slot_count} slots, fewer than hold={self.cfg.hold}")
        for name in self.kind.ring_fields():
            field = segment.fields.get(name)
            if field is None:
                raise ProtocolError(f"the ring has no field {name!r} (it has {', '.join(segment.fields)})")
            dtype, shape = self.kind.field_spec(name)
            ok = len(field.shape) == len(shape) and all(a == b for a, b in zip(field.shape, shape, strict=True) if b)
            if field.dtype is None or field.dtype.name != dtype or not ok:
                got = f"{field.dtype.name if field.dtype else f'code {field.code}'} {list(field.shape)}"
                want = f"{dtype} {[d if d else '?' for d in shape]}"
                raise ProtocolError(f"the ring's field {name!r} is {got}, expected {want}")

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
        conn = self.res.conn
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
        if msg["code"] == "dataset" and self.cfg.path not in message:
            message += f" (dataset {self.cfg.path})"
        return ServerError(msg["code"], message, msg.get("sample"), msg.get("key"), msg["fatal"])

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
        cuda = self.res.cuda
        while cuda is not None and cuda.pending:
            got = self._recv(poll=True)
            if got is not None:
                return got[0]
            self.res.release(self.meter.behind_gpu(cuda.wait_oldest))
        return self._recv()[0]

    def poll_ready(self) -> tuple[int, Any] | None:
        """Looking ahead: the next batch of the current run, ``(slot, header)``, if the server has
        already sent it; never waits. A message that is not a ``ready`` is kept for the loop, and
        an error met here is raised where the loop would have met it (at the next batch)."""
        if self._held_error is not None:
            return None
        try:
            while True:
                got = self._recv(poll=True)
                if got is None:
                    return None
                msg = got[0]
                if msg["type"] != "ready":
                    self._held_msgs.append(msg)
                    return None
                taken = self._on_ready(msg)
                if taken is not None:
                    return taken
                # else a stale run's batch (released), or one whose every sample was skipped
        except RingfeedError as e:
            self._held_error = e
            return None

    def defer_error(self, e: BaseException) -> None:
        """An error met while looking ahead, raised at the next batch instead of now."""
        self._held_error = e

    @property
    def looking_ahead_failed(self) -> bool:
        """Whether an error met while looking ahead waits for the next batch."""
        return self._held_error is not None

    def _on_ready(self, msg: dict[str, Any]) -> tuple[int, Any] | None:
        """Takes ownership of the slot; returns ``(slot, header)``, or ``None`` for a stale run's."""
        res = self.res
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
            self.delivered += 1
            self.meter.totals["skipped"] += header.skipped
            res.release(slot)
            return None
        return slot, header

    def _on_end(self, msg: dict[str, Any]) -> bool:
        """Whether ``end`` ends the current run (an earlier run's is dropped)."""
        if msg["run"] != self._run:
            if msg["run"] > self._run:
                raise ProtocolError(f"`end` of run {msg['run']}, but only {self._run} runs were started")
            return False
        batches = self.delivered - self._first
        if msg["epoch"] != self._run_epoch or msg["batches"] != batches:
            raise ProtocolError(
                f"`end` says epoch {msg['epoch']} with {msg['batches']} batches, but this run delivered "
                f"{batches} batches of epoch {self._run_epoch}"
            )
        return True

    # -- what a batch maker uses ----------------------------------------------------------------

    def ring_views(self, slot: int, count: int) -> dict[str, Any]:
        """The kind's fields of held ``slot``, the first ``count`` samples, as views of the ring."""
        segment = self.res.segment
        assert segment is not None
        return {name: segment.view(slot, name)[:count] for name in self.kind.ring_fields()}

    def to_device(self, views: dict[str, Any], slot: int, post: Any = None, finish: Any = None) -> dict[str, Any]:
        """CUDA mode: starts the copy of ``views`` (then ``finish``, then ``post``) on the side
        stream; the slot is released once the copy's event has completed."""
        extra = () if finish is None else (finish,)
        return self.meter.behind_gpu(self.res.cuda.copy, views, slot, post, *extra)  # type: ignore[no-any-return]

    def hand_out(self, slot: int, views: dict[str, Any]) -> dict[str, Any]:
        """CPU mode: ``views`` are handed out as they are; the slot stays held until ``hold`` more
        batches have been requested, or the iteration ends with nobody referring to them."""
        self._yielded.append((slot, [weakref.ref(v) for v in views.values()]))
        return views

    def _give_back(self, slot: int, refs: list[weakref.ref[Any]]) -> None:
        """Releases a CPU slot handed out as the tensors ``refs``.

        The tensors the user still refers to move to private memory first: each is copied and
        takes the copy's storage (``Tensor.set_``), so the objects the user holds keep their
        values while the server refills the slot. Nothing is copied when the user has let go.
        Views the user cut from the batch share the slot's storage and are not moved.
        """
        for r in refs:
            t = r()
            if t is not None:
                _to_private_memory(t)
        self.res.release(slot)

    def count_delivered(self, header: Any) -> None:
        """A batch made of a held slot is handed out (it counts for ``state_dict()`` and ``end``)."""
        self.delivered += 1
        self.meter.totals["skipped"] += header.skipped

    # -- iteration ------------------------------------------------------------------------------

    def iterate(self) -> Generator[Any, None, None]:
        """Starts a run at the current epoch and cursor; a generator of its batches.

        A new iteration abandons the previous one: its batches are released (CPU batches the
        user still refers to move to private memory first, keeping their values) and its
        iterator raises ``RuntimeError`` if used again.
        """
        self.check_usable()
        self._abandon()
        if self.cfg.shuffle and self._ended_epoch == self.epoch and not self._warned_repeat:
            self._warned_repeat = True
            warnings.warn(
                f"this shuffled loader starts epoch {self.epoch} again, so it repeats that epoch's "
                "order; call loader.set_epoch(epoch) before each epoch, as with DistributedSampler",
                UserWarning,
                stacklevel=3,
            )
        iteration = self._iteration
        first, self._cursor = self._cursor, 0
        if not self._resumed:
            self._run_position = 0
        self._resumed = False
        self.delivered = first
        if first >= self.run_batches():
            # The whole epoch was delivered before the state was saved: nothing is left of it.
            return _nothing()
        self._run_epoch = self.epoch
        self._resilient(self._start_run)
        return self._batches(iteration)

    def _start_run(self) -> None:
        """Sends ``start`` for the current iteration, from the first batch not yet delivered."""
        conn = self.res.conn
        assert conn is not None
        start = {"type": "start", "epoch": self._run_epoch, "first_batch": self.delivered}
        if self._run_position:
            start["position"] = self._run_position
        self._guard(conn.send, start)
        self._run += 1
        self._first = self._next_batch_index = self.delivered

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
        """The next batch of the iteration, or ``None`` at the end of its run."""
        if self._iteration != iteration:
            raise RuntimeError(
                "this iterator was abandoned: the loader was iterated again, or set_epoch() or "
                "load_state_dict() was called, since it started"
            )
        self.check_usable()
        t0 = self.meter.begin()
        self._release_due()
        while True:
            taken = self.kind.take_ahead()
            if taken is None:
                msg = self._next_message()
                kind = msg["type"]
                if kind == "end":
                    if not self._on_end(msg):
                        continue
                    self._reconnects_in_row = 0
                    self._ended_epoch = self.epoch
                    return None  # `skipped` was counted batch by batch, from the slot headers
                if kind != "ready":
                    raise ProtocolError(f"unexpected `{kind}` message during an epoch")
                ready = self._on_ready(msg)
                if ready is None:
                    continue
                taken = (*ready, None)
            batch = self.kind.make(self, *taken)
            self.release_copied()
            self.kind.look_ahead(self)
            self._reconnects_in_row = 0
            self._count_step(t0)
            return batch

    # -- releasing ------------------------------------------------------------------------------

    def _release_due(self) -> None:
        """Releases what may be released before waiting for the next batch."""
        while len(self._yielded) >= self.cfg.hold:
            self._give_back(*self._yielded.popleft())
        self.release_copied()

    def release_copied(self) -> None:
        """CUDA mode: hands back the slots whose copies (and GPU finishing) have completed since
        the last look (never blocks). Called before waiting for a batch and again once a batch is
        made, before the training step runs, so that a copy completed while the loop waited does
        not hold its slot through the step too. (With hybrid decode the loop also holds the
        batches decoding ahead; on the H200 this made no difference beyond the runs' spread,
        benches/results/2026-12-02-h200-kinds.)"""
        res = self.res
        if res.cuda is not None:
            for slot in self.meter.behind_gpu(res.cuda.completed):
                res.release(slot)

    def _release_yielded(self, *, unreferenced_only: bool = False) -> None:
        """Releases the CPU batches handed out (all, or those no longer referenced); GPU copies stay pending.

        Also runs from an iterator's ``finally`` when the iterator is collected, which may be after
        the stream was closed behind the loader's back: at interpreter exit ``weakref.finalize``
        closes every stream first (``atexit``), and the generators still alive are collected
        during teardown afterwards. A closed stream has nothing to release, and by then module
        globals may be gone, so that case returns before using any.
        """
        if self.closed or self._broken is not None or not self._finalizer.alive:
            self._yielded.clear()
            return
        keep = []
        with contextlib.suppress(RingfeedError, OSError):
            while self._yielded:
                slot, refs = self._yielded.popleft()
                if unreferenced_only and any(r() is not None for r in refs):
                    keep.append((slot, refs))
                else:
                    self._give_back(slot, refs)
        self._yielded.extend(keep)

    def _abandon(self) -> None:
        """Ends the current iteration: its batches are released and its iterator stops.

        The server's run goes on until the next ``start``; its late ``ready`` messages are then
        stale and released unread.
        """
        self._iteration += 1
        self.kind.drop_ahead(self)
        self._release_yielded()

    # -- failing --------------------------------------------------------------------------------

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
        self.res.close()

    def check_usable(self) -> None:
        if self.closed or not self._finalizer.alive:
            raise RingfeedError("the loader is closed")
        if self._broken is not None:
            raise RingfeedError(
                f"the loader's connection failed earlier ({self._broken}); create a new Loader and "
                f"load_state_dict() this one's state_dict() to resume"
            ) from self._broken

    # -- measuring ------------------------------------------------------------------------------

    def _count_step(self, t0: float) -> None:
        now = self.meter.step(t0)
        due = self.meter.take_due(now)
        if due is not None:
            conn = self.res.conn
            assert conn is not None
            steps, wait_ns, compute_ns, gpu_wait_ns = due
            msg = stats_message(
                steps,
                wait_ns,
                compute_ns,
                gpu_wait_ns if self.res.cuda is not None else None,
                minor=self.server_protocol[1],
                gpu_decode=self.kind.gpu_counts(),
            )
            # The batch is already counted as delivered: a server that died since is reported by
            # the next receive (or recovered from), not here, where the batch would be lost.
            with contextlib.suppress(ServerDiedError):
                conn.send(msg)
        every = self.cfg.log_every
        if every is not None and self.meter.totals["batches"] % every == 0:
            line = self.meter.log_line(now, self.cfg.batch_size, self.res.cuda is not None, self.server_view())
            print(line, file=sys.stderr, flush=True)

    def server_view(self) -> dict[str, Any] | None:
        """This stream's entry in the server's snapshot, or None (a 1.0 server, or unreachable)."""
        if self.stream_id is None:
            return None
        try:
            snap = snapshot(self.cfg.socket_path, timeout=5.0)
        except RingfeedError:
            return None
        view = next((s for s in snap["streams"] if s["stream"] == self.stream_id), None)
        remote = remote_stats(snap)
        if view is not None and remote is not None:
            # 1.3: the server's remote fetching (every remote dataset's), beside the stream's own.
            view = {**view, "remote": remote}
        return view

    def stats(self, server: bool = True) -> dict[str, Any]:
        """``Loader.stats()``: the meter's totals, the kind's counters, and the server's view."""
        out = self.meter.summary()
        self.kind.add_stats(out)
        if server:
            out["server"] = self.server_view()
        return out

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
                if not lost or self.closed or self._reconnects_in_row >= self.cfg.reconnect:
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
        cfg = self.cfg
        # The taken-ahead batches belonged to the lost stream (its ring is gone with it).
        self.kind.forget_ahead()
        self._held_msgs.clear()
        self._held_error = None
        self._reconnects_in_row += 1
        log.warning(
            "lost the ringfeed server at %s (%s); reconnecting (%d of %d in a row), then resuming epoch %d at batch %d",
            cfg.socket_path, cause, self._reconnects_in_row, cfg.reconnect, self._run_epoch, self.delivered,
        )  # fmt: skip
        known = (self.dataset_len, self.samples_per_rank, self.batches_per_epoch, self.dataset_id)
        self._reconnect_within(cfg.reconnect_timeout, cause)
        now = (self.dataset_len, self.samples_per_rank, self.batches_per_epoch, self.dataset_id)
        if now != known:
            self.res.close()
            raise RingfeedError(
                f"after reconnecting, the dataset {cfg.path} has (samples, samples per rank, batches per epoch, id) "
                f"{now}, not {known}: it changed, so the epoch cannot be resumed"
            ) from cause
        self._broken = None
        self._run = self._last_seq = 0
        self.meter.forget_pending()
        self.meter.totals["reconnects"] += 1

    def _reconnect_within(self, seconds: float, cause: BaseException) -> None:
        """Connects and opens again, retrying while nothing listens (or the server goes away)."""
        deadline = time.monotonic() + seconds
        delay = 0.02
        while True:
            try:
                self._connect()
                return
            except RingfeedError as e:
                self.res.close()
                # Plain RingfeedError: nothing listens (yet); ServerDiedError: it went away again.
                if not (type(e) is RingfeedError or isinstance(e, ServerDiedError)):
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerDiedError(
                        f"lost the ringfeed server at {self.cfg.socket_path} ({cause}), and could not reconnect "
                        f"within reconnect_timeout={seconds} s: {e}"
                    ) from cause
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.25)
            except BaseException:
                self.res.close()
                raise

    # -- epochs, state ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """``Loader.set_epoch``: a different epoch abandons the iteration and starts from its first batch."""
        epoch = int_in("epoch", epoch, 0, MAX_EPOCH)
        self._ended_epoch = None
        if epoch != self.epoch:
            self._abandon()
            self.epoch = epoch
            self._cursor = self.delivered = self._run_position = 0
            self._resumed = False

    def run_batches(self) -> int:
        """Batches this rank gets in the current run (from ``_run_position``)."""
        cfg = self.cfg
        return batches_from(
            self.dataset_len, self._run_position, cfg.world_size, cfg.batch_size, drop_last=cfg.drop_last
        )

    def state_at(self, delivered: int) -> dict[str, Any]:
        """``state_dict()`` as it would be after ``delivered`` batches of the current run."""
        cfg = self.cfg
        return {
            "version": STATE_VERSION,
            "seed": cfg.seed,
            "epoch": self.epoch,
            "position": position_after(
                self.dataset_len, self._run_position, delivered, cfg.world_size, cfg.batch_size, cfg.drop_last
            ),
            "run_position": self._run_position,
            "batches_delivered": delivered,
            "rank": cfg.rank,
            "world_size": cfg.world_size,
            "batch_size": cfg.batch_size,
            "shuffle": cfg.shuffle,
            "drop_last": cfg.drop_last,
            "order": self.order,
            "order_block": cfg.order_block,
            "dataset": cfg.path,
            "dataset_id": self.dataset_id,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """``Loader.load_state_dict``: the next iteration delivers the rest of the saved epoch."""
        run_position, cursor = self._resume_point(state)
        self._abandon()
        self._ended_epoch = None
        self.epoch = int(state["epoch"])
        self._run_position = run_position
        self._resumed = True
        self._cursor = self.delivered = cursor

    def _resume_point(self, state: Mapping[str, Any]) -> tuple[int, int]:
        """Checks ``state`` against this stream; ``(run_position, first batch)`` of the resumed run."""
        cfg = self.cfg
        version = state.get("version", 1)
        if version not in (1, STATE_VERSION):
            raise ValueError(f"state_dict version {version!r} is not {STATE_VERSION} (or 1)")
        fixed = (
            ("seed", "batch_size", "world_size", "shuffle", "drop_last", "order", "order_block")
            if version == 1
            else ("seed", "shuffle", "drop_last", "order", "order_block")
        )
        mine = {"order": self.order, "order_block": cfg.order_block}
        for key in fixed:
            have = mine[key] if key in mine else getattr(cfg, key)
            if key in state and state[key] != have:
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r} but this loader has {key}={have!r}; "
                    f"construct the Loader with {key}={state[key]!r} to resume exactly"
                )
        saved_id = state.get("dataset_id")
        if saved_id is not None and self.dataset_id is not None and saved_id != self.dataset_id:
            raise ValueError(
                f"the state was saved on dataset {state.get('dataset', '?')!r} (id {saved_id}), but this loader "
                f"serves {cfg.path!r} (id {self.dataset_id}): another dataset, split or mix, where the saved "
                f"position means nothing; load the state into a loader of the dataset it was saved on"
            )
        for key in ("epoch", "batches_delivered"):
            if key not in state:
                raise ValueError(f"the state has no {key!r}")
        int_in("state['epoch']", state["epoch"], 0, MAX_EPOCH)
        world = int_in("state['world_size']", state.get("world_size", cfg.world_size), 1, MAX_SEED)
        batch = int_in("state['batch_size']", state.get("batch_size", cfg.batch_size), 1, MAX_BATCH_SIZE)
        run_position = int_in("state['run_position']", state.get("run_position", 0), 0, self.dataset_len)
        saved = batches_from(self.dataset_len, run_position, world, batch, drop_last=cfg.drop_last)
        delivered = int_in("state['batches_delivered']", state["batches_delivered"], 0, saved)
        position = position_after(self.dataset_len, run_position, delivered, world, batch, cfg.drop_last)
        step = cfg.world_size * cfg.batch_size
        if position >= self.dataset_len:
            return 0, self.batches_per_epoch  # the epoch is done
        if position % step == 0:
            # On a batch boundary of this configuration: exactly batches k.. of the whole epoch.
            return 0, min(position // step, self.batches_per_epoch)
        if self.server_protocol < (1, 3):
            major, minor = self.server_protocol
            raise RingfeedError(
                f"resuming at global position {position} with world_size={cfg.world_size}, "
                f"batch_size={cfg.batch_size} (not a multiple of {step}) re-stripes the epoch, which needs a "
                f"ringfeed server with protocol 1.3; this one speaks {major}.{minor} (upgrade the server, or "
                f"resume with world_size * batch_size dividing {position})"
            )
        return position, 0

    def close(self) -> None:
        """Releases everything (``Loader.close``). Idempotent; also run when the stream is collected."""
        self.closed = True
        self._yielded.clear()
        self._finalizer()


def _to_private_memory(t: Any) -> None:
    """Moves tensor ``t`` off the ring: it takes a private copy's storage, in place, keeping its
    values. A numpy array (a loader without torch) cannot be moved and stays a view."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor):
        with torch.no_grad():
            t.set_(t.clone())


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


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


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
