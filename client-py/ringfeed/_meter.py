"""What the training loop's steps cost, as a stream measures them (``DESIGN.md`` §5).

Per batch: the time inside ``next()`` (``wait_s``), of it the part spent behind the GPU in CUDA
mode (``gpu_wait_s``: a copy's launch or event queued behind the model's work, not a wait for
data), and the time between two ``next()`` calls (``compute_s``). The totals are ``stats()``; the
steps since the last ``stats`` message are what the stream sends the server's autotuner (every
``STATS_EVERY`` batches or ``STATS_PERIOD`` seconds), which tunes on the wait for data alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: A ``stats`` message is sent every this many batches (control.md, "stats").
STATS_EVERY = 16
#: ... or after this many seconds, whichever comes first (control.md, `stats`).
STATS_PERIOD = 0.25


class Meter:
    """The step counters of one loader, across reconnects."""

    def __init__(self) -> None:
        self.totals: dict[str, Any] = {
            "batches": 0, "wait_s": 0.0, "gpu_wait_s": 0.0, "compute_s": 0.0, "skipped": 0, "reconnects": 0,
        }  # fmt: skip
        #: Of the current ``next()``, the time spent behind the GPU (CUDA mode).
        self.gpu_s = 0.0
        self._pending = [0, 0, 0, 0]  # steps, wait_ns, compute_ns, gpu_wait_ns since the last `stats`
        self._sent = time.perf_counter()
        self._last_return: float | None = None
        # time, batches, wait_s, compute_s, gpu_wait_s at the last log line
        self._log_mark = (time.perf_counter(), 0, 0.0, 0.0, 0.0)

    def begin(self) -> float:
        """A ``next()`` starts: returns its start time."""
        self.gpu_s = 0.0
        return time.perf_counter()

    def behind_gpu(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs ``fn`` (a CUDA call that may block behind the GPU's queued work), counting its time
        as back-pressure, not as a wait for data."""
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.gpu_s += time.perf_counter() - t

    def step(self, t0: float) -> float:
        """A ``next()`` started at ``t0`` returns a batch: counts it, returns the time now."""
        now = time.perf_counter()
        wait = now - t0
        gpu = min(self.gpu_s, wait)
        compute = t0 - self._last_return if self._last_return is not None else 0.0
        self._last_return = now
        st = self.totals
        st["batches"] += 1
        st["wait_s"] += wait
        st["gpu_wait_s"] += gpu
        st["compute_s"] += compute
        p = self._pending
        p[0] += 1
        p[1] += int(wait * 1e9)
        p[2] += int(compute * 1e9)
        p[3] += int(gpu * 1e9)
        return now

    def take_due(self, now: float) -> tuple[int, int, int, int] | None:
        """``(steps, wait_ns, compute_ns, gpu_wait_ns)`` since the last ``stats`` message when one
        is due, and starts counting anew; else ``None``."""
        p = self._pending
        if p[0] < STATS_EVERY and now - self._sent < STATS_PERIOD:
            return None
        out = (p[0], p[1], p[2], p[3])
        self.forget_pending()
        self._sent = now
        return out

    def forget_pending(self) -> None:
        """Drops the steps not yet sent (a new connection's server never saw the stream's earlier ones)."""
        self._pending[:] = [0, 0, 0, 0]

    def log_line(self, now: float, batch_size: int, on_gpu: bool, server: dict[str, Any] | None) -> str:
        """The ``log_every`` line: the rate and wait shares since the last one, and the server's view."""
        t0, b0, w0, c0, g0 = self._log_mark
        st = self.totals
        self._log_mark = (now, st["batches"], st["wait_s"], st["compute_s"], st["gpu_wait_s"])
        batches, wait, compute = st["batches"] - b0, st["wait_s"] - w0, st["compute_s"] - c0
        gpu = st["gpu_wait_s"] - g0
        rate = batches * batch_size / max(now - t0, 1e-9)
        total = max(wait + compute, 1e-9)
        behind = f", behind its GPU {gpu / total:.1%}" if on_gpu else ""
        tuned = f" (server: {server['threads']} threads, depth {server['depth']})" if server else ""
        return (
            f"ringfeed: batch {st['batches']}: {rate:.0f} samples/s; the training loop waited for data "
            f"{(wait - gpu) / total:.1%} of its time{behind}{tuned}"
        )

    def summary(self) -> dict[str, Any]:
        """The totals, with the wait for data and the shares of ``wait_s + compute_s`` (``stats()``)."""
        out: dict[str, Any] = dict(self.totals)
        out["data_wait_s"] = max(out["wait_s"] - out["gpu_wait_s"], 0.0)
        total = out["wait_s"] + out["compute_s"]
        out["wait_share"] = out["wait_s"] / total if total > 0 else 0.0
        out["data_wait_share"] = out["data_wait_s"] / total if total > 0 else 0.0
        out["gpu_wait_share"] = out["gpu_wait_s"] / total if total > 0 else 0.0
        return out
