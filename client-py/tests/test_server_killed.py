"""The server killed mid-epoch: every client hears of it at once; with ``reconnect``, the
iteration carries on across a restarted server and still delivers every sample exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _fleet import Server, make_dataset

import ringfeed
from ringfeed import RingfeedError, ServerDiedError, ServerError
from ringfeed.wire import sidecar

N = 64
BS = 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Larger images than elsewhere, so that clients spend their time waiting on the server.
    return make_dataset(tmp_path_factory.mktemp("srvkill"), N, size=(320, 240))


def loader(dataset: Path, sock: Path | str, **server: Any) -> ringfeed.Loader:
    """A loader of the server at ``sock``; ``server`` holds the other ``ringfeed.Server`` settings."""
    server.setdefault("spawn", False)
    return ringfeed.Loader(
        dataset,
        BS,
        transform=ringfeed.RandomResizedCrop(64),
        fields=["index"],
        drop_last=False,
        seed=5,
        server=ringfeed.Server(socket=str(sock), **server),
    )


def test_every_client_of_a_killed_server_raises_within_a_second(dataset: Path) -> None:
    """SIGKILL of the server: three clients iterating (timeout=None, so only the closed socket can
    wake them) and one holding a batch all raise ServerDiedError within 1 s; none hangs."""
    with Server(threads=2) as server:
        loaders = [loader(dataset, server.sock, timeout=None) for _ in range(4)]
        outcome: list[tuple[BaseException | None, float, int]] = [(None, 0.0, 0)] * 3

        def consume(k: int) -> None:
            n = 0
            try:
                for epoch in range(10_000):
                    loaders[k].set_epoch(epoch)
                    for _ in loaders[k]:
                        n += 1
            except BaseException as e:
                outcome[k] = (e, time.monotonic(), n)

        threads = [threading.Thread(target=consume, args=(k,), daemon=True) for k in range(3)]
        idle = iter(loaders[3])
        next(idle)
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while any(ld.stats()["batches"] < 3 for ld in loaders[:3]):
            assert time.monotonic() < deadline, "the clients did not get going"
            time.sleep(0.01)
        t_kill = time.monotonic()
        server.kill()
        for t in threads:
            t.join(timeout=10)  # the guard: a client that hangs fails the test here
        assert not any(t.is_alive() for t in threads), "a client hung after the server was killed"
        t_idle = time.monotonic()
        with pytest.raises(ServerDiedError, match="closed the connection"):
            next(idle)
        idle_s = time.monotonic() - t_idle
        for ld in loaders:
            ld.close()
    delays = [when - t_kill for _, when, _ in outcome]
    print(f"\nraised {[round(d, 4) for d in delays]} s after the kill; the idle client {idle_s:.4f} s")
    for e, _, n in outcome:
        assert isinstance(e, ServerDiedError), repr(e)
        assert n >= 3
    assert max(delays) < 1.0
    assert idle_s < 1.0


def restart_later(server: Server, delay: float, pids: list[int]) -> threading.Thread:
    """Kills the server now and starts it again on the same socket after ``delay`` seconds,
    appending the new server's pid to ``pids``."""
    server.kill()

    def restart() -> None:
        time.sleep(delay)
        server.start()
        pids.append(server.pid)

    t = threading.Thread(target=restart, daemon=True)
    t.start()
    return t


def test_reconnect_to_a_restarted_server_delivers_every_sample_once(dataset: Path) -> None:
    """With an explicit socket and reconnect=3, the server killed twice mid-epoch (and restarted
    by someone else 0.3 s later) costs nothing: the epoch delivers each of the N samples once."""
    with Server(threads=2) as server:
        ld = loader(dataset, server.sock, reconnect=3, reconnect_timeout=20.0, timeout=30.0)
        with ld:
            ld.set_epoch(2)
            seen: list[int] = []
            restarts = []
            pids = [server.pid]
            for n, b in enumerate(ld, 1):
                seen.extend(b["index"].tolist())
                if n in (3, 10):
                    restarts.append(restart_later(server, 0.3, pids))
            for t in restarts:
                t.join(timeout=30)
            reconnects = ld.stats()["reconnects"]
            # The next epoch starts on the new server as usual.
            ld.set_epoch(3)
            again = [i for b in ld for i in b["index"].tolist()]
    assert len(restarts) == 2
    assert len(set(pids)) == 3, f"the server was not restarted twice: {pids}"
    assert reconnects == 2
    assert sorted(seen) == list(range(N)), f"{len(seen)} samples, {len(set(seen))} distinct"
    assert sorted(again) == list(range(N))


def test_reconnect_restarts_the_embedded_sidecar(dataset: Path, sock: str) -> None:
    """With the loader's own sidecar and reconnect=2, killing the sidecar twice mid-epoch makes the
    loader start a new one each time; the epoch still delivers each sample exactly once, in the
    order of an undisturbed epoch."""
    with loader(dataset, sock, spawn=True, reconnect=2, timeout=30.0) as ld:
        ld.set_epoch(1)
        reference = [i for b in ld for i in b["index"].tolist()]
        first = sidecar._SPAWNED[-1]
        seen: list[int] = []
        killed = []
        for n, b in enumerate(ld, 1):
            seen.extend(b["index"].tolist())
            if n in (2, 9):
                proc = sidecar._SPAWNED[-1]
                proc.kill()
                proc.wait()
                killed.append(proc.pid)
        reconnects = ld.stats()["reconnects"]
        last = sidecar._SPAWNED[-1]
    assert len(killed) == 2
    assert first.pid in killed
    assert last.pid not in killed, "no new sidecar was started"
    assert reconnects == 2
    assert seen == reference
    assert sorted(seen) == list(range(N))


def test_reconnect_gives_up_after_reconnect_timeout(dataset: Path) -> None:
    """A server that does not come back: a reconnecting loader raises ServerDiedError naming
    reconnect_timeout, after about that long; the loader is then unusable, its state exact."""
    with Server(threads=2) as server:
        ld = loader(dataset, server.sock, reconnect=5, reconnect_timeout=0.5, timeout=30.0)
        with ld:
            it = iter(ld)
            next(it)
            next(it)
            server.kill()
            t = time.monotonic()
            with pytest.raises(ServerDiedError, match=r"reconnect_timeout=0\.5"):
                for _ in it:
                    pass
            waited = time.monotonic() - t
            state = ld.state_dict()
            with pytest.raises(RingfeedError, match="failed earlier"):
                iter(ld)
    print(f"\ngave up after {waited:.2f} s")
    assert 0.4 < waited < 5.0
    assert 2 <= state["batches_delivered"] < N // BS


def test_a_server_stopped_on_purpose_says_so_and_is_reconnected_only_when_asked(dataset: Path) -> None:
    """SIGTERM: the server sends a fatal `shutdown` error. Without reconnect the loader raises it
    within 1 s; with reconnect=3 it resumes on the server started next on the socket, and the
    epoch still delivers every sample once."""
    with Server(threads=2) as server, loader(dataset, server.sock, timeout=30.0) as ld:
        it = iter(ld)
        next(it)
        t = time.monotonic()
        server.proc.terminate()  # type: ignore[union-attr]
        with pytest.raises(ServerError, match="shutting down") as e:
            for _ in it:
                pass
        waited = time.monotonic() - t
        assert (e.value.code, e.value.fatal) == ("shutdown", True)
    print(f"\nraised after {waited:.3f} s")
    assert waited < 1.0

    with Server(threads=2) as server:
        with loader(dataset, server.sock, reconnect=3, reconnect_timeout=20.0, timeout=30.0) as ld:
            seen: list[int] = []
            restarted = None
            for n, b in enumerate(ld, 1):
                seen.extend(b["index"].tolist())
                if n == 3:
                    server.proc.terminate()  # type: ignore[union-attr]
                    server.proc.wait(timeout=10)  # type: ignore[union-attr]

                    def restart() -> None:
                        time.sleep(0.3)
                        server.start()

                    restarted = threading.Thread(target=restart, daemon=True)
                    restarted.start()
            assert restarted is not None
            restarted.join(timeout=30)
            assert ld.stats()["reconnects"] == 1
        assert sorted(seen) == list(range(N))
