"""A small, strict stand-in for ``ringfeed serve``, for testing the loader's logic.

It speaks the real protocol over a real Unix socket and hands out a real sealed memfd ring built
by ``_ringbuild`` (independently of the client's code), and it follows ring.md's ownership rules:
it fills FREE slots only, sends ``ready`` in order, and sends ``end`` after the last one. It is
also strict about the client: a ``release`` of a slot the client does not hold is recorded as a
violation (and answered with a fatal ``protocol`` error), and a released slot is overwritten with
0xEE at once, so a test can tell exactly when the client gave a slot back.

Batches are simple functions of the sample index ``i``: every image byte is ``i % 251``, the
label is ``i``, the ``index`` field is ``i``, and ``crop`` is ``[i, 0, h, w, i % 2]``. The order
is a seeded shuffle split like ``DistributedSampler`` (not the real server's permutation).

Run as a script it behaves like the binary for the loader's sidecar logic:
``python _fakeserver.py serve --exit-when-idle --socket PATH``.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _ringbuild import FieldSpec, header_page, memfd_segment, slot_header, standard_fields

POISON = 0xEE


def plan(
    n: int, *, seed: int, epoch: int, shuffle: bool, rank: int, world: int, drop_last: bool, batch: int
) -> list[list[int]]:
    """This rank's batches of one epoch, as lists of sample indices."""
    order = list(range(n))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    if drop_last:
        order = order[: n - n % world]
    else:
        pad = (-n) % world
        order = order + (order * (pad // max(n, 1) + 1))[:pad]
    mine = order[rank::world]
    batches = [mine[i : i + batch] for i in range(0, len(mine), batch)]
    if drop_last and batches and len(batches[-1]) < batch:
        batches.pop()
    return batches


@dataclass
class Run:
    number: int
    epoch: int
    batches: list[list[int]]
    next: int
    sent: int = 0
    ended: bool = False


@dataclass
class Conn:
    """What one connection did, for the tests to inspect."""

    received: list[dict[str, Any]] = field(default_factory=list)
    held: dict[int, int] = field(default_factory=dict)
    readies: int = 0
    closed: bool = False


#: The dataset path fake servers claim to serve.
DATASET = "/data/fake"


class FakeServer:
    def __init__(
        self,
        path: str,
        *,
        dataset: str = "/data/fake",
        dataset_len: int = 10,
        classes: tuple[str, ...] = (),
        protocol: tuple[int, int] = (1, 0),
        stall_after: int | None = None,
        die_after: int | None = None,
        die_with_error: bool = False,
        sample_error_at: int | None = None,
        fd_with_welcome: bool = False,
        check_version: bool = True,
    ) -> None:
        self.path = path
        self.dataset = dataset
        self.dataset_len = dataset_len
        self.classes = classes
        self.protocol = protocol
        self.stall_after = stall_after
        self.die_after = die_after
        self.die_with_error = die_with_error
        self.sample_error_at = sample_error_at
        self.fd_with_welcome = fd_with_welcome
        self.check_version = check_version
        self.conns: list[Conn] = []
        self.violations: list[str] = []
        self._stop = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(8)
        self._sock.settimeout(0.05)
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    # -- for tests --

    def wait(self, cond: Any, timeout: float = 5.0) -> None:
        """Waits until ``cond()`` is true (the server handles messages on its own threads)."""
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError("the fake server never reached the expected state")
            time.sleep(0.005)

    def sent(self, kind: str, conn: int = -1) -> list[dict[str, Any]]:
        return [m for m in self.conns[conn].received if m["type"] == kind]

    def close(self) -> None:
        self._stop = True
        self._accept.join()
        for t in self._threads:
            t.join(timeout=5)
        self._sock.close()
        Path(self.path).unlink(missing_ok=True)

    # -- serving --

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                s, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            state = Conn()
            self.conns.append(state)
            t = threading.Thread(target=self._serve, args=(s, state), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, s: socket.socket, st: Conn) -> None:
        mm = None
        s.settimeout(0.05)
        try:
            mm = self._session(s, st)
        except (ConnectionError, _ClosedError):
            pass
        finally:
            st.closed = True
            s.close()
            if mm is not None:
                mm.close()

    def _read(self, s: socket.socket, st: Conn) -> dict[str, Any]:
        head = self._exact(s, 4)
        (n,) = struct.unpack("<I", head)
        msg: dict[str, Any] = json.loads(self._exact(s, n))
        st.received.append(msg)
        return msg

    def _exact(self, s: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            if self._stop:
                raise _ClosedError
            try:
                chunk = s.recv(n - len(buf))
            except TimeoutError:
                continue
            if not chunk:
                raise _ClosedError
            buf += chunk
        return buf

    @staticmethod
    def _frame(msg: dict[str, Any]) -> bytes:
        body = json.dumps(msg, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
        return struct.pack("<I", len(body)) + body

    def _send(self, s: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        if fds:
            socket.send_fds(s, [self._frame(msg)], fds)
        else:
            s.sendall(self._frame(msg))

    def _error(self, s: socket.socket, code: str, message: str, fatal: bool = True, **extra: Any) -> None:
        self._send(s, {"type": "error", "code": code, "message": message, "fatal": fatal, **extra})

    def _session(self, s: socket.socket, st: Conn) -> mmap.mmap | None:
        hello = self._read(s, st)
        if self.check_version and hello["protocol"][0] != self.protocol[0]:
            self._error(s, "version", f"client speaks protocol {hello['protocol']}, this server {self.protocol}")
            return None
        welcome = {"type": "welcome", "protocol": list(self.protocol), "server": "fake 0"}
        if self.fd_with_welcome:
            stray = os.memfd_create("rf-stray-welcome")
            self._send(s, welcome, [stray])
            os.close(stray)
        else:
            self._send(s, welcome)
        op = self._read(s, st)
        if op["type"] != "open":
            return None
        if op["dataset"] != self.dataset:
            self._error(s, "dataset", f"no dataset at {op['dataset']}: no such file or directory")
            return None
        b = op["batch_size"]
        if b > self.dataset_len:
            self._error(s, "bad_request", f"batch_size {b} is larger than the dataset ({self.dataset_len} samples)")
            return None
        if "pipeline" in op:
            # A 1.2 client: the one view's fixed size, which the fake server's ops need not run (the
            # pipelines' own tests use the real server). The fake fills a slot with the sample index.
            views = op["pipeline"]["views"]
            if len(views) != 1 or views[0].get("name", "image") != "image" or views[0].get("count", 1) != 1:
                self._error(s, "bad_request", "the fake server serves one view named image")
                return None
            size = next(o["size"] for o in reversed(views[0]["ops"]) if "size" in o)
            h, w = (size * 2)[:2] if len(size) == 1 else size
        else:
            h, w = op["transform"]["size"]
        names = op.get("fields", ["image", "label"])
        fields = standard_fields(h, w, layout_=op.get("layout", "NHWC"), extras=tuple(names))
        slots = op.get("slots", 4)
        page = header_page(fields, batch_size=b, slot_count=slots)
        (stride,) = struct.unpack_from("<Q", page, 24)
        (seg_len,) = struct.unpack_from("<Q", page, 32)
        fd = memfd_segment(page, seg_len)
        mm = mmap.mmap(fd, seg_len, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        mem = np.frombuffer(mm, dtype=np.uint8)
        world, rank = op.get("world_size", 1), op.get("rank", 0)
        per_rank = plan(
            self.dataset_len, seed=0, epoch=0, shuffle=False, rank=rank, world=world, drop_last=op["drop_last"], batch=1
        )
        ring = {
            "type": "ring",
            "segment_len": seg_len,
            "dataset_len": self.dataset_len,
            "samples_per_rank": sum(len(x) for x in per_rank),
            "batches_per_epoch": len(self._plan(op, 0)),
            "classes": list(self.classes),
        }
        self._send(s, ring, [fd])
        os.close(fd)
        free = set(range(slots))
        seq = 0
        run: Run | None = None
        runs = 0
        try:
            while True:
                while run is not None and not run.ended and run.next < len(run.batches) and free:
                    if self.stall_after is not None and st.readies >= self.stall_after:
                        break
                    if self.die_after is not None and st.readies >= self.die_after:
                        if self.die_with_error:
                            self._error(s, "internal", "the decode pool panicked; see the server's log")
                        return mm
                    if self.sample_error_at is not None and run.next == self.sample_error_at:
                        bad = run.batches[run.next][0]
                        self._error(
                            s,
                            "sample",
                            f'sample {bad} (key "k/{bad}.jpg") does not decode',
                            fatal=False,
                            sample=bad,
                            key=f"k/{bad}.jpg",
                        )
                        run = None
                        break
                    slot = min(free)
                    free.discard(slot)
                    seq += 1
                    self._fill(mem, 4096 + slot * stride, fields, run, seq)
                    st.held[slot] = seq
                    st.readies += 1
                    run.sent += 1
                    self._send(s, {"type": "ready", "run": run.number, "seq": seq, "slot": slot})
                    run.next += 1
                if run is not None and not run.ended and run.next == len(run.batches):
                    self._send(
                        s, {"type": "end", "run": run.number, "epoch": run.epoch, "batches": run.sent, "skipped": 0}
                    )
                    run.ended = True
                msg = self._read(s, st)
                kind = msg["type"]
                if kind == "start":
                    runs += 1
                    first = msg.get("first_batch", 0)
                    run = Run(runs, msg["epoch"], self._plan(op, msg["epoch"]), first)
                elif kind == "release":
                    slot, rseq = msg["slot"], msg["seq"]
                    if st.held.get(slot) != rseq:
                        self.violations.append(f"release of slot {slot} seq {rseq}; held: {st.held}")
                        self._error(s, "protocol", f"release of slot {slot} seq {rseq}, which the client does not hold")
                        return mm
                    del st.held[slot]
                    mem[4096 + slot * stride : 4096 + (slot + 1) * stride] = POISON
                    free.add(slot)
                elif kind == "close":
                    return mm
                elif kind != "stats":
                    self.violations.append(f"unexpected {kind}")
        finally:
            del mem

    def _plan(self, op: dict[str, Any], epoch: int) -> list[list[int]]:
        return plan(
            self.dataset_len,
            seed=op.get("seed", 0),
            epoch=epoch,
            shuffle=op.get("shuffle", True),
            rank=op.get("rank", 0),
            world=op.get("world_size", 1),
            drop_last=op.get("drop_last", True),
            batch=op["batch_size"],
        )

    @staticmethod
    def _fill(mem: np.ndarray, at: int, fields: list[FieldSpec], run: Run, seq: int) -> None:
        idx = run.batches[run.next]
        shape = fields[0].shape  # the image's
        h, w = (shape[0], shape[1]) if shape[2] == 3 else (shape[1], shape[2])
        for f in fields:
            start = at + f.offset
            for j, i in enumerate(idx):
                lo = start + j * f.sample_bytes
                dst = mem[lo : lo + f.sample_bytes]
                if f.name == "image":
                    dst[:] = i % 251
                elif f.name in ("label", "index"):
                    dst[:] = np.frombuffer(struct.pack("<q", i), dtype=np.uint8)
                elif f.name == "crop":
                    dst[:] = np.frombuffer(struct.pack("<5i", i, 0, h, w, i % 2), dtype=np.uint8)
        mem[at : at + 64] = np.frombuffer(bytes(slot_header(seq, run.number, run.epoch, run.next, len(idx))), np.uint8)


class _ClosedError(Exception):
    pass


def main(argv: list[str]) -> int:
    """``serve --exit-when-idle --socket PATH``: serve until the last client leaves."""
    assert argv[:1] == ["serve"], argv
    path = argv[argv.index("--socket") + 1]
    record = os.environ.get("FAKE_SERVER_RECORD")
    if record:
        with open(record, "a") as f:
            f.write(f"{os.getpid()} {' '.join(argv)}\n")
    print(f"fake server {os.getpid()} listening at {path}", file=sys.stderr, flush=True)
    server = FakeServer(path, dataset=os.environ.get("FAKE_DATASET", DATASET))
    server.wait(lambda: server.conns, timeout=60)
    server.wait(lambda: all(c.closed for c in server.conns), timeout=60)
    time.sleep(0.2)
    server.wait(lambda: all(c.closed for c in server.conns), timeout=60)
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
