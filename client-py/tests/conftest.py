"""Fixtures shared by the tests that run the real `ringfeed` binary."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _fakeserver import DATASET, FakeServer
from _support import ringfeed_bin

from ringfeed.wire import sidecar


@pytest.fixture
def sock(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A socket path in a fresh short directory, with the binary as RINGFEED_BIN; servers the
    loader started are stopped afterwards."""
    monkeypatch.setenv("RINGFEED_BIN", ringfeed_bin())
    d = tempfile.mkdtemp(prefix="rfs-", dir="/tmp")
    before = {id(p) for p in sidecar._SPAWNED}
    yield str(Path(d) / "ringfeed.sock")
    for proc in [p for p in sidecar._SPAWNED if id(p) not in before]:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory for sockets (AF_UNIX paths are limited to 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sidecars() -> Iterator[list[Any]]:
    """Real `ringfeed serve` processes a test started (objects with `proc` and `close()`, such as
    `test_remote.Sidecar`): those still running are closed afterwards."""
    made: list[Any] = []
    yield made
    for s in made:
        if s.proc.poll() is None:
            s.close()


@pytest.fixture
def serve(sockdir: Path) -> Iterator[Callable[..., FakeServer]]:
    """Starts fake servers (the real protocol, checked for violations) on sockets in `sockdir`."""
    servers: list[FakeServer] = []

    def start(**kw: Any) -> FakeServer:
        s = FakeServer(str(sockdir / f"s{len(servers)}.sock"), dataset=DATASET, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()
        assert not s.violations, s.violations
