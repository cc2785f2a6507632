"""Real server and client processes for the fault and soak tests (and ``benches/soak.py``).

- ``make_dataset`` packs a tiny synthetic JPEG dataset with the real ``ringfeed pack``.
- ``Server`` runs ``ringfeed serve`` on a private socket and reads what the kernel says it holds
  (``proc_stats``: open descriptors, ring memfds, their mappings, threads, RSS).
- ``CONSUMER`` is a client process that iterates epochs and reports, one JSON line each, every
  epoch's coverage and its delivery rate.
- ``Zygote`` forks short-lived client processes on request (a fork of a process that has already
  imported ringfeed costs milliseconds, a fresh interpreter half a second), so a test can kill a
  hundred clients in a few seconds.

Client processes run the real ``ringfeed.Loader``; the ones that must start fast hide torch, so
the loader hands out numpy views of the ring instead of torch tensors (a supported mode).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CLIENT_PY = REPO / "client-py"

#: Prefix of the ring memfds' names (``Segment::create(.., "ringfeed-ring")``), as /proc shows them.
MEMFD = "/memfd:ringfeed-ring"


def binary() -> str:
    """The ``ringfeed`` binary: ``$RINGFEED_BIN``, else the workspace's debug or release build."""
    env = os.environ.get("RINGFEED_BIN")
    if env:
        return env
    for p in (REPO / "target" / "debug" / "ringfeed", REPO / "target" / "release" / "ringfeed"):
        if p.exists():
            return str(p)
    raise RuntimeError("no ringfeed binary: run `cargo build -p ringfeed` or set RINGFEED_BIN")


def client_env() -> dict[str, str]:
    """The environment for client processes: this checkout's ``ringfeed`` package first."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(CLIENT_PY) + (os.pathsep + path if path else "")}


def make_dataset(root: Path, n: int, *, classes: int = 4, size: tuple[int, int] = (48, 40)) -> Path:
    """Packs ``n`` small JPEGs (``classes`` classes) into ``root/ds`` with ``ringfeed pack``."""
    from PIL import Image

    for i in range(n):
        p = root / "src" / f"c{i % classes}" / f"{i:05d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.new("RGB", size, ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)).save(buf, "JPEG", quality=85)
        p.write_bytes(buf.getvalue())
    subprocess.run(
        [binary(), "pack", str(root / "src"), str(root / "ds"), "--progress", "none"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root / "ds"


def proc_stats(pid: int) -> dict[str, int]:
    """What process ``pid`` holds: ``fds`` (open descriptors), ``memfds`` (descriptors of ring
    memfds), ``memfd_maps`` (mappings of ring memfds in ``/proc/PID/maps``), ``threads``, and
    ``rss_kib``."""
    fds = memfds = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # a descriptor closed while we list them
            target = str(fd.readlink())
            fds += 1
            memfds += target.startswith(MEMFD)
    maps = sum(MEMFD in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "fds": fds,
        "memfds": memfds,
        "memfd_maps": maps,
        "threads": int(status["Threads"]),
        "rss_kib": int(status["VmRSS"].split()[0]),
    }


def settle(pid: int, ok: Callable[[dict[str, int]], bool], timeout: float) -> tuple[bool, dict[str, int], float]:
    """Polls ``proc_stats(pid)`` until ``ok`` holds or ``timeout`` seconds pass.

    Returns ``(held, last stats, seconds waited)``.
    """
    start = time.monotonic()
    while True:
        s = proc_stats(pid)
        waited = time.monotonic() - start
        if ok(s) or waited >= timeout:
            return ok(s), s, waited
        time.sleep(0.05)


class Server:
    """``ringfeed serve --socket DIR/ringfeed.sock --threads N``, started and awaited."""

    def __init__(
        self, threads: int = 2, sock: Path | None = None, log: Path | None = None, extra: list[str] | None = None
    ) -> None:
        self._dir = None
        self.extra = list(extra or [])
        if sock is None:
            self._dir = Path(tempfile.mkdtemp(prefix="rff-", dir="/tmp"))
            sock = self._dir / "ringfeed.sock"
        self.sock = sock
        self.threads = threads
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Starts the server (again, after a kill) and waits until it accepts connections."""
        out = open(self.log, "ab") if self.log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [binary(), "serve", "--socket", str(self.sock), "--threads", str(self.threads), *self.extra],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        finally:
            if not isinstance(out, int):
                out.close()
        deadline = time.monotonic() + 30
        import socket

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ringfeed serve exited with status {self.proc.returncode}")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    # A connection that closes without a word is harmless to a server without
                    # --exit-when-idle.
                    s.connect(str(self.sock))
                    return
                except (FileNotFoundError, ConnectionRefusedError):
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"ringfeed serve did not listen at {self.sock} within 30 s")
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stats(self) -> dict[str, int]:
        return proc_stats(self.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, and reap."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# A client process that iterates epochs until a deadline, reporting each epoch's coverage (the
# `index` field of every batch: each sample exactly once) and a tick with its batch count every
# `tick` seconds. argv: dataset socket batch_size seconds tick seed use_torch
CONSUMER = r"""
import json, os, sys, time
if sys.argv[7] == "0":
    sys.modules["torch"] = None  # numpy views: starts in a fraction of the time
import ringfeed

dataset, sock, bs, seconds, tick, seed = sys.argv[1:7]
bs, seconds, tick, seed = int(bs), float(seconds), float(tick), int(seed)

def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()

try:
    ld = ringfeed.Loader(dataset, bs, transform=ringfeed.RandomResizedCrop(16) + ringfeed.Flip(), seed=seed,
                         drop_last=False, fields=["index"],
                         server=ringfeed.Server(socket=sock, spawn=False, timeout=60.0))
    say(ready=os.getpid(), dataset_len=ld.dataset_len, batches_per_epoch=len(ld))
    end = time.monotonic() + seconds
    next_tick = time.monotonic() + tick
    since_tick = 0
    epoch = 0
    while time.monotonic() < end:
        ld.set_epoch(epoch)
        t0 = time.time()
        seen = []
        batches = 0
        for b in ld:
            seen.extend(int(i) for i in b["index"])
            int(b["image"][0, 0, 0, 0])  # touch the pixels
            batches += 1
            since_tick += 1
            if time.monotonic() >= next_tick:
                say(tick=time.time(), batches=since_tick)
                since_tick = 0
                next_tick += tick
        counts = {}
        for i in seen:
            counts[i] = counts.get(i, 0) + 1
        say(epoch=epoch, t0=t0, t1=time.time(), batches=batches, samples=len(seen),
            ok=sorted(seen) == list(range(ld.dataset_len)),
            dups=sum(c - 1 for c in counts.values()), missing=ld.dataset_len - len(counts))
        epoch += 1
    say(tick=time.time(), batches=since_tick)
    ld.close()
    say(done=True, epochs=epoch)
except BaseException as e:
    say(error=f"{type(e).__name__}: {e}")
    sys.exit(1)
"""


class Consumer:
    """A ``CONSUMER`` process; ``lines`` collects its JSON reports (read by ``poll``/``wait``)."""

    def __init__(
        self, dataset: Path, sock: Path, *, batch_size: int, seconds: float, tick: float = 0.5, seed: int = 0,
        torch: bool = False,
    ) -> None:  # fmt: skip
        argv = [sys.executable, "-c", CONSUMER, str(dataset), str(sock), str(batch_size), str(seconds), str(tick)]
        self.proc = subprocess.Popen(
            [*argv, str(seed), "1" if torch else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=client_env(),
        )
        self.lines: list[dict[str, Any]] = []
        self._partial = b""
        self._stderr = ""

    def poll(self, wait: float = 0.0) -> None:
        """Reads the reports written so far (waiting up to ``wait`` seconds for the first)."""
        if self.proc.stdout is None or self.proc.stdout.closed:
            return
        fd = self.proc.stdout.fileno()
        while select.select([fd], [], [], wait)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self._partial += chunk
            *whole, self._partial = self._partial.split(b"\n")
            self.lines.extend(json.loads(w) for w in whole if w)
            wait = 0.0

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any("ready" in x or "error" in x for x in self.lines):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.poll()
                break
            self.poll(0.1)
        if not any("ready" in x for x in self.lines):
            raise RuntimeError(f"the consumer did not start: {self.lines} {self.stderr()}")

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.poll(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.poll()
        self._stderr = self.stderr()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        return self.proc.returncode

    def stderr(self) -> str:
        """The end of the process's stderr, once it has exited."""
        if self.proc.poll() is None or self.proc.stderr is None or self.proc.stderr.closed:
            return self._stderr
        return self.proc.stderr.read().decode("utf-8", "replace")[-2000:]

    def epochs(self) -> list[dict[str, Any]]:
        return [x for x in self.lines if "epoch" in x]

    def ticks(self) -> list[dict[str, Any]]:
        return [x for x in self.lines if "tick" in x]

    def errors(self) -> list[str]:
        return [x["error"] for x in self.lines if "error" in x]


def rate(ticks: list[dict[str, Any]], t0: float, t1: float) -> float:
    """Batches per second over the ticks that fall in ``[t0, t1]`` (wall-clock times)."""
    inside = [t for t in ticks if t0 <= t["tick"] <= t1]
    if len(inside) < 2:
        return float("nan")
    # Each tick counts the batches since the previous one: skip the first tick's count.
    return sum(t["batches"] for t in inside[1:]) / (inside[-1]["tick"] - inside[0]["tick"])


# Forks clients on request. stdin: one line per client, "MODE DATASET SOCKET"; each child writes
# "ready PID" (or "error PID MESSAGE") on stdout once it is in MODE:
#   open   - the stream is open (ring mapped), no epoch started;
#   hold   - it holds its first batch and sleeps;
#   stream - it got its first batch and keeps consuming epoch after epoch.
ZYGOTE = r"""
import os, signal, sys, time
sys.modules["torch"] = None
import ringfeed
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel

def child(mode, dataset, sock):
    ld = ringfeed.Loader(dataset, 4, transform=ringfeed.RandomResizedCrop(16),
                         server=ringfeed.Server(socket=sock, spawn=False, timeout=30.0),
                         tuning=ringfeed.Tuning(slots=2))
    if mode == "open":
        os.write(1, f"ready {os.getpid()}\n".encode())
        time.sleep(600)
    it = iter(ld)
    batch = next(it)
    os.write(1, f"ready {os.getpid()}\n".encode())
    if mode == "hold":
        time.sleep(600)
    epoch = 0
    while True:
        for batch in it:
            pass
        epoch += 1
        ld.set_epoch(epoch)
        it = iter(ld)

for line in sys.stdin:
    mode, dataset, sock = line.split()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            child(mode, dataset, sock)
        except BaseException as e:
            os.write(1, f"error {os.getpid()} {type(e).__name__}: {e}\n".replace("\n", " ").encode() + b"\n")
        os._exit(1)
"""


class Zygote:
    """A process that has imported ringfeed and forks a client per ``spawn`` call."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=client_env(),
        )

    def spawn(self, mode: str, dataset: Path, sock: Path, timeout: float = 30.0) -> int:
        """Forks a client, waits until it is in ``mode``, returns its pid."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{mode} {dataset} {sock}\n".encode())
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise RuntimeError(f"a `{mode}` client did not report within {timeout} s")
        line = self.proc.stdout.readline().decode()
        word, pid, *rest = line.split(maxsplit=2)
        if word != "ready":
            raise RuntimeError(f"a `{mode}` client failed: {' '.join(rest)}")
        return int(pid)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def sigkill(pid: int, timeout: float = 10.0) -> None:
    """SIGKILLs ``pid`` and waits until it is gone (reaped by its parent)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} survived SIGKILL for {timeout} s")
        time.sleep(0.001)
