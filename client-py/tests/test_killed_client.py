"""Clients killed with SIGKILL mid-epoch, a hundred times against one server: the server frees
everything each one held, and the client that keeps consuming never notices.

The throughput of the surviving client is printed (before and during the kills), never asserted:
``benches/client_kills.py`` is the timed comparison.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from _fleet import Consumer, Server, Zygote, make_dataset, rate, settle, sigkill

KILLS = 100
N = 64


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("kills"), N)


def test_a_hundred_killed_clients_leak_nothing_and_stall_no_one(dataset: Path) -> None:
    """After 100 clients are SIGKILLed (open, holding a batch, or mid-stream) the server's fds,
    ring memfds, their mappings and its threads are back to their baseline, and a client consuming
    throughout covers every epoch exactly."""
    with Server(threads=2) as server:
        # Threads before any client: tokio's blocking threads (the dataset open and the ring's
        # creation run there) idle out after 10 s, so this is where the count settles.
        threads0 = server.stats()["threads"]
        consumer = Consumer(dataset, server.sock, batch_size=8, seconds=3600, tick=0.25)
        zygote = Zygote()
        try:
            consumer.wait_ready()
            # Warm up: one epoch complete before the baseline.
            while not consumer.epochs():
                consumer.poll(0.1)
            base = server.stats()
            assert base["memfds"] == 1, base  # the consumer's ring
            assert base["memfd_maps"] >= 1, base
            time.sleep(1.0)  # a window of undisturbed consumption, for the printed rate
            consumer.poll()
            t_loop0 = time.time()
            rng = random.Random(7)
            modes = ("open", "hold", "stream")
            peak = dict(base)
            for k in range(KILLS):
                mode = modes[k % 3]
                pid = zygote.spawn(mode, dataset, server.sock)
                if mode == "stream":
                    time.sleep(rng.uniform(0, 0.03))  # land anywhere in the stream
                if k % 10 == 0:
                    s = server.stats()
                    peak = {key: max(peak[key], s[key]) for key in s}
                    # The killed client's ring is live while it runs: ours plus the consumer's.
                    assert s["memfds"] >= 2, s
                sigkill(pid)
                consumer.poll()
            t_loop1 = time.time()
            consumer.poll()
            # Fds and memfds come back at once; threads once tokio's idle blocking threads exit.
            want = (base["fds"], 1, base["memfd_maps"])
            fds_ok, after, waited = settle(server.pid, lambda s: (s["fds"], s["memfds"], s["memfd_maps"]) == want, 10)
            threads_ok, after_t, waited_t = settle(server.pid, lambda s: s["threads"] == threads0, 20)
            # The consumer still has to complete an epoch after the loop.
            n_epochs = len(consumer.epochs())
            deadline = time.monotonic() + 30
            while len(consumer.epochs()) < n_epochs + 1 and time.monotonic() < deadline:
                consumer.poll(0.1)
            assert consumer.proc.poll() is None, consumer.stderr()
        finally:
            consumer.proc.terminate()
            consumer.wait(10)
            zygote.close()
        assert server.alive()
    print(
        f"\n{KILLS} kills in {t_loop1 - t_loop0:.1f} s; server baseline {base}, peak during the loop {peak}, "
        f"after {after} (settled in {waited:.2f} s), threads {threads0} before any client, "
        f"{after_t['threads']} after (settled in {waited_t:.2f} s)"
    )
    ticks = consumer.ticks()
    before = rate(ticks, t_loop0 - 1.0, t_loop0)
    during = rate(ticks, t_loop0, t_loop1)
    print(f"surviving client: {before:.0f} batches/s before the kills, {during:.0f} batches/s during them")
    # (The consumer's errors in the message: a consumer that reconnected would hold a second ring.)
    assert fds_ok, (
        f"server descriptors did not return to the baseline: {base} -> {after}; consumer errors {consumer.errors()}"
    )
    assert threads_ok, f"server threads did not return to {threads0}: {after_t}"
    assert not consumer.errors(), consumer.errors()
    epochs = consumer.epochs()
    during_loop = [e for e in epochs if e["t0"] >= t_loop0 and e["t1"] <= t_loop1]
    assert during_loop, "no epoch of the surviving client ran entirely during the kills"
    assert len(epochs) >= 3
    for e in epochs:
        assert (e["ok"], e["dups"], e["missing"], e["samples"]) == (True, 0, 0, N), e
