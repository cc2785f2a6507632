"""Iterators that are abandoned, outlived or left alive at interpreter exit: nothing is printed,
and every slot goes back to the server.

Each case runs in its own interpreter against one real ``ringfeed serve``, so that interpreter
exit (the ``weakref.finalize`` at exit, then the generators collected during teardown) is part of
what is tested. The child's stderr must be empty: Python prints ``Exception ignored in: ...`` for
an exception raised in a generator's ``finally`` and carries on, so only stderr shows it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _fleet import Server, binary, client_env, make_dataset

from ringfeed import snapshot

N = 48
BS = 4

PRELUDE = """
import gc, sys, time
import ringfeed

DS, SOCK = sys.argv[1], sys.argv[2]


def make(**kw):
    return ringfeed.Loader(DS, 4, transform=ringfeed.RandomResizedCrop(16), tuning=ringfeed.Tuning(slots=2),
                           server=ringfeed.Server(socket=SOCK, spawn=False, timeout=20.0), **kw)


def settle_held(ld, want, timeout=10.0):
    # The server's count of this stream's HELD slots (releases travel on the stream's socket,
    # the snapshot on another connection: poll until they agree).
    deadline = time.monotonic() + timeout
    while True:
        got = ld.stats()["server"]["slots"]["held"]
        if got == want or time.monotonic() > deadline:
            assert got == want, f"the server says {got} slots are held, expected {want}"
            return
        time.sleep(0.02)
"""

CASES = {
    # A batch held at module level by a live iterator when the interpreter exits.
    "live_iterator_at_exit": """
        ld = make()
        it = iter(ld)
        images, labels = next(it)
    """,
    # `next(iter(loader))`: the iterator is dropped at once, its batch kept.
    "next_of_a_fresh_iterator_at_exit": """
        ld = make()
        images, labels = next(iter(ld))
    """,
    # Two live iterators (the first abandoned by the second), both alive at exit.
    "two_live_iterators_at_exit": """
        ld = make()
        a = iter(ld)
        x = next(a)
        b = iter(ld)
        y = next(b)
    """,
    # Many abandoned iterators whose batches are then dropped: with two slots, a leaked slot would
    # stall the next epoch (a TimeoutError); afterwards nothing is held.
    "abandoned_iterators_give_their_slots_back": """
        ld = make()
        kept = [next(iter(ld)) for _ in range(5)]
        its = [iter(ld) for _ in range(3)]
        last = next(its[-1])
        del kept, its, last
        gc.collect()
        for epoch in range(2):
            ld.set_epoch(epoch)
            assert sum(1 for _ in ld) == len(ld)
        settle_held(ld, 0)
    """,
    # The loader closed while its iterator lives; the iterator then says so and is dropped.
    "loader_closed_before_its_iterator": """
        ld = make()
        it = iter(ld)
        batch = next(it)
        ld.close()
        try:
            next(it)
        except ringfeed.RingfeedError as e:
            assert "closed" in str(e), e
        else:
            raise AssertionError("a closed loader's iterator went on")
        del it
        gc.collect()
    """,
    # The iterator dropped first, then the loader closed.
    "loader_closed_after_its_iterator": """
        ld = make()
        it = iter(ld)
        batch = next(it)
        del it
        gc.collect()
        ld.close()
    """,
    # Only an iterator refers to the loader; a `for` left with `break` before it.
    "iterator_owning_its_loader_and_a_break": """
        it = iter(make())
        batch = next(it)
        other = make()
        for images, labels in other:
            break
    """,
    # The same with the sidecar the loader starts itself (default socket).
    "embedded_sidecar_with_live_iterators_at_exit": """
        ld = ringfeed.Loader(DS, 4, transform=ringfeed.RandomResizedCrop(16), tuning=ringfeed.Tuning(slots=2),
                             server=ringfeed.Server(timeout=20.0))
        a = iter(ld)
        x = next(a)
        b = iter(ld)
        y = next(b)
    """,
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("finaliser"), N)


@pytest.fixture(scope="module")
def server() -> object:
    with Server(threads=2) as s:
        yield s


def streams(sock: Path) -> list[dict[str, object]]:
    return snapshot(str(sock), timeout=5.0)["streams"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_iterators_end_quietly_and_release_their_slots(
    case: str, dataset: Path, server: Server, tmp_path: Path
) -> None:
    """Whatever iterators are alive or abandoned, and whether the loader is closed before, after
    or never: the process exits 0 with nothing on stderr, and the server is left with no stream."""
    env = client_env()
    env["RINGFEED_BIN"] = binary()
    env["RINGFEED_SOCKET"] = str(tmp_path / "embedded.sock")  # only the embedded case uses it
    script = PRELUDE + textwrap.dedent(CASES[case])
    out = subprocess.run(
        [sys.executable, "-c", script, str(dataset), str(server.sock)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr
    deadline = time.monotonic() + 10
    while streams(server.sock) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert streams(server.sock) == []
