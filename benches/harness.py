"""What every bench script shares: a private server, a warm-up by time, a timed window, a JSON record.

A bench script imports this module (a script in ``benches/`` finds it beside itself; one in
``benches/e2e/`` puts ``benches/`` on ``sys.path`` first) and composes five pieces:

- ``add_arguments(ap)`` gives the script ``--bin`` (the ``ringfeed`` binary) and, for a script that
  times a rate, ``--warmup-s``; ``find_binary(a.bin)`` resolves the binary once: ``--bin``, else
  ``$RINGFEED_BIN``, else ``ringfeed`` on ``PATH``, else this checkout's dist, release or debug build.
  The result is exported as ``$RINGFEED_BIN``, so that every process the bench starts (torchrun
  ranks, a nested bench, the test fleet's helpers) runs the same build.
- ``Server(threads=N, flags=[...])`` is ``ringfeed serve`` on a socket in a fresh temporary
  directory, as a context manager: it returns once the server accepts a connection, and is
  always stopped (SIGTERM, then SIGKILL after 10 s; SIGKILL at once when the body raised). If
  the server exits or stays silent while starting, ``HarnessError`` names the binary, the
  command and the end of the server's log.
- ``epochs(loader)`` iterates a loader for ever, one ``set_epoch`` per pass, so a window can span
  epochs.
- ``measure(batches, warmup_s=..., min_batches=..., min_seconds=...)`` draws batches for at least
  ``warmup_s`` seconds (default ``DEFAULT_WARMUP_S``, 12 s: the autotuner judges a change about
  two 0.5-s intervals later and needs several changes to settle; a warm-up counted in batches
  is seconds on one machine and too short on a faster one), then times whole batches until both
  minimums are met: ``{"images", "batches", "seconds", "img_per_s", "warmup": {...}}``.
- ``write_record(path, doc, args=a)`` writes the script's own JSON document with what makes it
  comparable later: the command line, the parsed flags (``config``), the machine (``machine()``:
  cores, CPU model, kernel, Python, torch and GPU when torch is loaded), the git commit and
  whether the tree was dirty, and, where the script measured one in the same run, the baseline
  and the ratios against it (``baseline``; ``against`` computes them from a script's rows). The
  script's own keys win, so its output layout stays what it was; a ``machine`` of its own is
  merged with the harness's.

What stays in each script: the loaders it compares, its table and its plot. ``ringfeed.bench``
(``ringfeed bench DATASET``, the user-facing report) is the package's own measurement; the benches
reuse its transforms (``ringfeed.bench.make_transform``), but the harness does not use its
``private_server``, which takes a thread count only (no flags, environment or log) and hides the
process that the soak and token scripts read ``/proc`` of.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

#: The repository root (this file is ``benches/harness.py``).
REPO = Path(__file__).resolve().parents[1]
#: Seconds of batches drawn before the clock starts, unless a script or ``--warmup-s`` says otherwise.
DEFAULT_WARMUP_S = 12.0
#: Seconds a server may take to accept its first connection.
START_TIMEOUT_S = 30.0
#: Seconds between SIGTERM and SIGKILL when a server is stopped.
STOP_GRACE_S = 10.0
#: Version of the fields ``write_record`` adds (``harness`` in every record).
RECORD_VERSION = 1


class HarnessError(RuntimeError):
    """The bench cannot run as asked: no binary, or a server that did not start."""


def add_arguments(ap: argparse.ArgumentParser, *, warmup: bool = True, warmup_s: float = DEFAULT_WARMUP_S) -> None:
    """Adds ``--bin`` and, with ``warmup``, ``--warmup-s`` (default ``warmup_s``) to ``ap``."""
    ap.add_argument(
        "--bin",
        type=Path,
        default=None,
        help="the ringfeed binary (default: $RINGFEED_BIN, else `ringfeed` on PATH, else target/dist, "
        "target/release or target/debug of this checkout)",
    )
    if warmup:
        ap.add_argument(
            "--warmup-s",
            type=float,
            default=warmup_s,
            help=f"seconds of batches before each timed window, so the autotuner settles (default {warmup_s:g})",
        )


def find_binary(explicit: str | Path | None = None) -> str:
    """The ``ringfeed`` binary to run, exported as ``$RINGFEED_BIN`` for the bench's children.

    ``explicit`` (a ``--bin`` flag), else ``$RINGFEED_BIN``, else ``ringfeed`` on ``PATH``, else
    ``target/dist/ringfeed``, ``target/release/ringfeed`` and then ``target/debug/ringfeed`` of this
    checkout.
    """
    tried = []
    for label, cand in (
        ("--bin", explicit),
        ("$RINGFEED_BIN", os.environ.get("RINGFEED_BIN")),
        ("PATH", shutil.which("ringfeed")),
        ("the dist build", REPO / "target" / "dist" / "ringfeed"),
        ("the release build", REPO / "target" / "release" / "ringfeed"),
        ("the debug build", REPO / "target" / "debug" / "ringfeed"),
    ):
        if not cand:
            continue
        path = Path(cand)
        if path.is_file() and os.access(path, os.X_OK):
            os.environ["RINGFEED_BIN"] = str(path.resolve())
            return str(path.resolve())
        tried.append(f"{label}: {cand}")
        if label in ("--bin", "$RINGFEED_BIN"):
            # A binary named on purpose that is not there is a mistake, not a reason to run another.
            raise HarnessError(f"{label} names {cand}, which is not an executable file")
    raise HarnessError(
        "no ringfeed binary: pass --bin, set RINGFEED_BIN, put `ringfeed` on PATH or run "
        "`cargo build --release -p ringfeed` (tried: " + ("; ".join(tried) or "nothing") + ")"
    )


class Server:
    """A private ``ringfeed serve --socket DIR/ringfeed.sock [--threads N] FLAGS...``.

    Use it as a context manager; ``sock`` is the socket's path (a ``str``, what ``ringfeed.Server(socket=)``
    takes), ``proc`` the process (``pid`` for ``/proc``). The server's stdout and stderr go to
    ``log`` (default: ``serve.log`` in its temporary directory, removed with it).
    """

    def __init__(
        self,
        threads: int | None = None,
        flags: Sequence[str] = (),
        *,
        binary: str | Path | None = None,
        env: dict[str, str] | None = None,
        log: str | Path | None = None,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.binary = find_binary(binary)
        self.dir = Path(tempfile.mkdtemp(prefix="rfbench-", dir="/tmp"))
        self.sock = str(self.dir / "ringfeed.sock")
        self.log = Path(log) if log is not None else self.dir / "serve.log"
        self.cmd = [self.binary, "serve", "--socket", self.sock]
        if threads is not None:
            self.cmd += ["--threads", str(threads)]
        self.cmd += [str(f) for f in flags]
        self.env = {**os.environ, **(env or {})}
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise HarnessError("the server has not been started")
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> list[str]:
        """The last ``lines`` lines of the server's log (empty once the log is gone)."""
        try:
            return self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return []

    def start(self) -> Server:
        """Starts the server and returns once it accepts a connection."""
        _stop_on_sigterm()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.env)
        try:
            self._wait_listening()
        except BaseException:
            self.stop(kill=True)
            raise
        return self

    def _wait_listening(self) -> None:
        assert self.proc is not None
        # A server started with --exit-when-idle may take a probe's close for its last client
        # leaving: for it, the socket file appearing is the sign. Any other server is probed.
        probe = "--exit-when-idle" not in self.cmd
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise self._failed(f"exited with status {self.proc.returncode} before listening")
            if Path(self.sock).exists() and (not probe or _accepts(self.sock)):
                return
            if time.monotonic() > deadline:
                raise self._failed(f"did not listen within {self.start_timeout:g} s")
            time.sleep(0.02)

    def _failed(self, what: str) -> HarnessError:
        tail = "\n  ".join(self.log_tail(20)) or "(nothing)"
        # A log in the server's own directory goes with it: then only its end is worth naming.
        kept = f" ({self.log})" if self.log.parent != self.dir else ""
        return HarnessError(
            f"`{self.binary} serve` {what} at {self.sock}\n  command: {shlex.join(self.cmd)}\n"
            f"  the end of its output{kept}:\n  {tail}"
        )

    def stop(self, kill: bool = False) -> int | None:
        """Stops the server (SIGTERM, SIGKILL after ``STOP_GRACE_S``; SIGKILL at once with
        ``kill``), removes its directory, and returns its exit status."""
        if self.proc is not None and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.returncode = self.proc.returncode
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.returncode

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(kill=exc_type is not None)


def _accepts(path: str) -> bool:
    """Whether something accepts connections at ``path``: a connection that closes without a
    word is harmless to a server without ``--exit-when-idle``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


def _stop_on_sigterm() -> None:
    """Turns SIGTERM into ``SystemExit`` so that ``with Server(...)`` still stops the server.

    The device scripts run benches under ``timeout N``, which sends SIGTERM: by default Python
    dies at once, skipping every ``finally``, and the server outlives the bench. Done only from
    the main thread and only while SIGTERM has its default action (a script's own handler stays).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def epochs(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch (``set_epoch`` before each pass when it has one)."""
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first member (a tuple's first element, a
    dict's first value)."""
    first = batch
    if isinstance(batch, (tuple, list)):
        first = batch[0]
    elif isinstance(batch, dict):
        first = next(iter(batch.values()))
    return int(first.shape[0]) if hasattr(first, "shape") else len(first)


def warm_up(batches: Iterator[Any], seconds: float = DEFAULT_WARMUP_S, min_batches: int = 0) -> dict[str, Any]:
    """Draws batches for at least ``seconds`` and at least ``min_batches`` of them."""
    start = time.perf_counter()
    n = 0
    while n < min_batches or time.perf_counter() - start < seconds:
        next(batches)
        n += 1
    return {"seconds": time.perf_counter() - start, "batches": n}


def timed(
    batches: Iterator[Any],
    *,
    min_batches: int = 1,
    min_seconds: float = 0.0,
    count: Callable[[Any], int] = batch_len,
    sync: Callable[[], Any] | None = None,
    clocks: dict[str, Callable[[], float]] | None = None,
) -> dict[str, Any]:
    """Times whole batches until at least ``min_batches`` and ``min_seconds`` are done.

    ``sync`` runs at both ends of the window (``torch.cuda.synchronize``, so queued GPU work is
    inside it); each of ``clocks`` is read at both ends too and its difference reported under its
    name (e.g. ``{"cpu_s": tree_cpu_seconds}``).
    """
    clocks = clocks or {}
    if sync is not None:
        sync()
    start = time.perf_counter()
    began = {k: clock() for k, clock in clocks.items()}
    images = n = 0
    while True:
        images += count(next(batches))
        n += 1
        if n >= min_batches and time.perf_counter() - start >= min_seconds:
            break
    if sync is not None:
        sync()
    seconds = time.perf_counter() - start
    out = {"images": images, "batches": n, "seconds": seconds, "img_per_s": images / seconds}
    out.update({k: clock() - began[k] for k, clock in clocks.items()})
    return out


def measure(
    batches: Iterator[Any], *, warmup_s: float = DEFAULT_WARMUP_S, warmup_batches: int = 0, **window: Any
) -> dict[str, Any]:
    """``warm_up`` then ``timed`` (``window`` holds ``timed``'s keywords: ``min_batches``,
    ``min_seconds``, ``count``, ``sync``, ``clocks``): the window's figures, with the warm-up's
    under ``warmup``."""
    warm = warm_up(batches, warmup_s, warmup_batches)
    out = timed(batches, **window)
    out["warmup"] = warm
    return out


def train_window(
    batches: Iterator[Any],
    step: Callable[[Any], Any],
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    warmup_steps: int = 0,
    min_steps: int = 1,
    min_seconds: float = 0.0,
    sync: Callable[[], Any] | None = None,
    clocks: dict[str, Callable[[], float]] | None = None,
    on_window: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """A training loop's rate: ``step(batch)`` (one optimiser step; it returns the step's loss
    tensor, or None) on each of ``batches``, warmed up for ``warmup_s`` and ``warmup_steps``, then
    timed for at least ``min_steps`` steps and ``min_seconds`` (``timed``: ``sync`` and ``clocks``
    at both ends). A batch's size is ``batch_len`` of it. ``on_window`` runs once as the timed
    window starts (to reset a script's own counters).

    Returns ``img_per_s``, ``images``, ``steps``, ``seconds``, ``wait_share`` (the loop's time in
    ``next(batches)`` over the window), each clock's difference, ``warmup`` and ``loss`` (the last
    step's, read once at the end: no host sync per step).
    """
    waited = [0.0]
    last: list[Any] = []

    def steps() -> Iterator[Any]:
        while True:
            t = time.perf_counter()
            batch = next(batches)
            waited[0] += time.perf_counter() - t
            loss = step(batch)
            if loss is not None:
                last[:] = [loss]
            yield batch

    it = steps()
    warm = warm_up(it, warmup_s, warmup_steps)
    waited[0] = 0.0
    if on_window is not None:
        on_window()
    m = timed(it, min_batches=min_steps, min_seconds=min_seconds, sync=sync, clocks=clocks)
    it.close()
    out = {k: m[k] for k in ("img_per_s", "images", "seconds")} | {"steps": m["batches"]}
    out |= {k: v for k, v in m.items() if k not in ("img_per_s", "images", "seconds", "batches")}
    out |= {"wait_share": waited[0] / m["seconds"], "warmup": warm}
    out["loss"] = float(last[0]) if last else None
    return out


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or ``None`` when either was not measured (or the baseline is 0)."""
    if value is None or not baseline:
        return None
    return value / baseline


def against(
    rows: Sequence[dict[str, Any]],
    *,
    value: str,
    by: Sequence[str],
    baseline: Callable[[dict[str, Any]], bool],
    keep: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Each row's ``value`` over that of the baseline row with the same ``by`` fields (the same
    model, thread count, ...): ``[{by and keep fields, "ratio": ...}]`` in the rows' order, the
    baseline rows included (1.0), ``None`` where a group has no baseline row."""
    base = {tuple(r.get(k) for k in by): r.get(value) for r in rows if baseline(r)}
    return [
        {k: r.get(k) for k in (*by, *keep)} | {"ratio": ratio(r.get(value), base.get(tuple(r.get(k) for k in by)))}
        for r in rows
    ]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Facts that make a figure comparable: cores (all, and usable by this process), CPU model,
    kernel, host, Python, the client package's version, and torch's version and GPU when the
    bench has imported torch (this never imports it: ``import torch`` takes seconds)."""
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "kernel": platform.release(),
        "host": platform.node(),
        "python": platform.python_version(),
        "ringfeed": getattr(sys.modules.get("ringfeed"), "__version__", None),
        "load_average": os.getloadavg(),
    }
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        out["torch"] = torch.__version__
        with contextlib.suppress(Exception):  # no driver, no GPU: the fact is that there is none
            if torch.cuda.is_available():
                out["gpu"] = torch.cuda.get_device_name()
                out["gpus"] = torch.cuda.device_count()
    return out


def commit() -> dict[str, Any] | None:
    """This checkout's commit and whether tracked files differ from it, or ``None`` outside git
    (the device machine gets a copy of the working tree, which may carry no ``.git``)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None


def _plain(value: Any) -> Any:
    """``value`` with paths as strings, for JSON."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def record(
    doc: dict[str, Any],
    *,
    args: argparse.Namespace | None = None,
    baseline: str | None = None,
    ratios: Any = None,
    server_binary: str | None = None,
) -> dict[str, Any]:
    """``doc`` with the harness's fields added (see the module docstring); ``doc``'s keys win."""
    facts = machine()
    out: dict[str, Any] = {
        "harness": RECORD_VERSION,
        "bench": Path(sys.argv[0]).stem,
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": _plain(vars(args)) if args is not None else None,
        "machine": facts,
        "git": commit(),
        "binary": server_binary or os.environ.get("RINGFEED_BIN"),
        "baseline": None if baseline is None else {"name": baseline, "ratios": _plain(ratios)},
    }
    own = dict(doc)
    if isinstance(own.get("machine"), dict):
        own["machine"] = {**facts, **own["machine"]}
    out.update(own)
    return out


def write_record(path: str | Path, doc: dict[str, Any], *, indent: int = 2, **kw: Any) -> dict[str, Any]:
    """Writes ``record(doc, **kw)`` to ``path`` (its directory made) and returns it."""
    rec = record(doc, **kw)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(rec), indent=indent) + "\n")
    return rec
