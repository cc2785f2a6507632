"""Stuck clients: one that never releases its batches, one that never reads its socket at all.
Neither slows another client down or makes the server hold more than a bounded amount for it."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from _fleet import Server, binary, make_dataset, settle

import ringfeed
from ringfeed import ServerError
from ringfeed.wire.protocol import PROTOCOL, encode

N = 64
BS = 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("slow"), N)


def loader(dataset: Path, sock: Path, **kw: object) -> ringfeed.Loader:
    return ringfeed.Loader(
        dataset,
        BS,
        transform=ringfeed.RandomResizedCrop(16),
        fields=["index"],
        drop_last=False,
        server=ringfeed.Server(socket=str(sock), spawn=False, timeout=30.0),
        **kw,
    )


def epoch_indices(ld: ringfeed.Loader, epoch: int) -> tuple[list[int], float]:
    ld.set_epoch(epoch)
    t = time.perf_counter()
    seen = [i for b in ld for i in b["index"].tolist()]
    return seen, len(ld) / (time.perf_counter() - t)


def test_a_client_that_never_releases_stalls_only_itself(dataset: Path) -> None:
    """A client that holds its batch (and leaves every other slot of its ring READY) for ever:
    another client still completes epochs with each sample exactly once."""
    with Server(threads=2) as server, loader(dataset, server.sock) as other:
        _, alone = epoch_indices(other, 0)
        with loader(dataset, server.sock, tuning=ringfeed.Tuning(slots=4)) as stuck:
            it = iter(stuck)
            held = next(it)  # and never another
            rates = []
            for epoch in (1, 2, 3):
                seen, r = epoch_indices(other, epoch)
                assert sorted(seen) == list(range(N))
                rates.append(r)
            assert held["index"].shape == (BS,)
            assert stuck.stats()["batches"] == 1
        print(f"\nthe other client: {alone:.0f} batches/s alone, {[round(r) for r in rates]} beside the stuck one")


def flood(sock: Path, dataset: Path, batches_per_epoch: int) -> tuple[socket.socket, int]:
    """Connects, opens a stream and starts epoch 0, then sends `start`s of already finished
    epochs (each answered by an `end`) until the kernel takes no more, never reading anything.

    Returns the socket and the number of `start`s sent.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(sock))
    s.sendall(encode({"type": "hello", "protocol": list(PROTOCOL)}))
    s.sendall(encode({
        "type": "open", "dataset": str(dataset), "batch_size": BS, "transform": {"kind": "resize", "size": [16, 16]},
        "drop_last": False, "slots": 4,
    }))  # fmt: skip
    s.sendall(encode({"type": "start", "epoch": 0, "first_batch": 0}))
    s.setblocking(False)
    sent = 0
    idle_since = time.monotonic()
    # The server answers each with an `end`; once its writes to us block, it stops reading, and
    # then our writes block too. Stop after half a second without progress.
    frame = encode({"type": "start", "epoch": 1, "first_batch": batches_per_epoch})
    pending = b""
    while time.monotonic() - idle_since < 0.5:
        try:
            n = s.send(pending or frame)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        idle_since = time.monotonic()
        rest = (pending or frame)[n:]
        if not rest:
            sent += 1
        pending = rest
    return s, sent


def test_a_client_that_never_reads_its_socket_is_bounded(dataset: Path) -> None:
    """A client that never reads a byte and floods the server with requests until the kernel
    buffers are full: its connection stays bounded (one ring, a few descriptors, bounded RSS),
    another client completes epochs exactly, and once it disconnects everything is freed."""
    with Server(threads=2) as server:
        with loader(dataset, server.sock) as other:
            _, alone = epoch_indices(other, 0)
            with_other = server.stats()
            stuck, sent = flood(server.sock, dataset, len(other))
            during = server.stats()
            rates = []
            for epoch in (1, 2, 3):
                seen, r = epoch_indices(other, epoch)
                assert sorted(seen) == list(range(N))
                rates.append(r)
            # Still stuck: the flood is not consumed by the server while its writes block.
            time.sleep(0.5)
            later = server.stats()
            stuck.close()
            ok, after, waited = settle(
                server.pid, lambda s: (s["fds"], s["memfds"]) == (with_other["fds"], with_other["memfds"]), 10
            )
        print(
            f"\nflooded with {sent} `start`s never read; server before {with_other}, stuck {during}, "
            f"0.5 s later {later}, after the client left {after} ({waited:.2f} s); other client "
            f"{alone:.0f} batches/s alone, {[round(r) for r in rates]} beside the stuck one"
        )
        # Our sends stopped being accepted: the server no longer reads this connection, because
        # its writes to us block (each small frame costs about 1 KiB of socket buffer).
        assert sent > 100
        assert during["memfds"] == with_other["memfds"] + 1  # the stuck stream's ring, one
        assert during["fds"] <= with_other["fds"] + 2  # its connection and its ring
        assert later["rss_kib"] - with_other["rss_kib"] < 16 * 1024
        assert ok, (with_other, after)
        assert server.alive()


def test_sigterm_with_a_stuck_client_still_exits(dataset: Path) -> None:
    """SIGTERM while a client never reads: the server still exits with status 0, after the 1 s it
    gives connections to end (the stuck connection's task, blocked in a write, never sees the
    shutdown; see the report in README "Failure modes")."""
    with Server(threads=2) as server:
        stuck, _ = flood(server.sock, dataset, N // BS)
        t = time.monotonic()
        assert server.proc is not None
        server.proc.terminate()
        status = server.proc.wait(timeout=30)
        took = time.monotonic() - t
        stuck.close()
    print(f"\nexited with status {status} {took:.2f} s after SIGTERM")
    assert status == 0
    assert took < 5


def test_a_ring_that_does_not_fit_in_memory_is_refused(dataset: Path, tmp_path: Path) -> None:
    """A server whose address space is limited (RLIMIT_AS 1 GiB) asked for a 1.5 GiB ring refuses
    the stream with a `bad_request` naming the size and the settings to lower; it keeps serving."""
    sock = tmp_path / "s.sock"
    if len(str(sock)) > 100:
        pytest.skip("socket path too long")
    proc = subprocess.Popen(
        ["prlimit", f"--as={1 << 30}", binary(), "serve", "--socket", str(sock), "--threads", "1"],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        # 8 slots of 64 images of 1024x1024x3 = 8 * 192 MiB.
        with pytest.raises(ServerError) as e:
            ringfeed.Loader(
                dataset,
                64,
                transform=ringfeed.Resize((1024, 1024)),
                server=ringfeed.Server(socket=str(sock), spawn=False),
                tuning=ringfeed.Tuning(slots=8),
                drop_last=False,
            )
        print(f"\n{e.value}")
        assert e.value.code == "bad_request"
        assert "lower `slots` or `batch_size`" in e.value.message
        with ringfeed.Loader(
            dataset, BS, transform=ringfeed.Resize((16, 16)), server=ringfeed.Server(socket=str(sock), spawn=False)
        ) as ld:
            assert len(list(ld)) == N // BS
    finally:
        proc.terminate()
        proc.wait(timeout=10)
