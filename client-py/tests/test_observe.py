"""Observability against a real server: `ringfeed top --once` and the Prometheus endpoint
(`ringfeed serve --metrics`), read by prometheus_client's text-format parser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fleet import make_dataset
from _support import ringfeed_bin
from prometheus_client.parser import text_string_to_metric_families

import ringfeed

N = 24


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed dataset of N small JPEGs in 2 classes."""
    return make_dataset(tmp_path_factory.mktemp("observe"), N, classes=2)


@pytest.fixture
def server(sockdir: Path) -> Iterator[tuple[str, int]]:
    """A real server with --metrics on a loopback port the system picks (``--metrics 0``: no race
    with another process for a port chosen beforehand), read from its log; yields (socket, port)."""
    sock = str(sockdir / "s.sock")
    proc = subprocess.Popen(
        [ringfeed_bin(), "serve", "--socket", sock, "--threads", "2", "--metrics", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, RINGFEED_LOG="warn,ringfeed_serve::server=info", NO_COLOR="1"),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 20
    port = None
    while port is None or not Path(sock).exists():
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, f"the server did not start: {''.join(lines)}"
        found = [m for m in map(re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics").search, lines) if m]
        port = int(found[0][1]) if found else None
        time.sleep(0.02)
    assert port != 0
    yield sock, port
    proc.terminate()
    proc.wait(timeout=10)
    reader.join(timeout=10)
    proc.stderr.close()  # type: ignore[union-attr]


def top(sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ringfeed_bin(), "top", "--socket", sock, "--once", *args], capture_output=True, text=True, timeout=30
    )


def metrics(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples if s.name == f.name or s.name == f.name + "_total"]
        for f in text_string_to_metric_families(body)
    }


def test_top_and_metrics_show_a_live_stream(dataset: Path, server: tuple[str, int]) -> None:
    sock, port = server
    with ringfeed.Loader(
        dataset,
        4,
        ringfeed.RandomResizedCrop(16),
        server=ringfeed.Server(socket=sock, spawn=False, timeout=30),
        tuning=ringfeed.Tuning(autotune=False, threads=2),
    ) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        # The third batch is held; two were released. The server has counted three deliveries.
        snap = json.loads(top(sock, "--json").stdout)
        (stream,) = snap["streams"]
        assert str(dataset) in stream["dataset"]
        assert stream["batches"] >= 3
        assert stream["samples"] >= 12
        assert (stream["autotune"], stream["threads"]) == (False, 2)
        assert sum(stream["slots"].values()) == ld.slots
        assert snap["server"]["threads"] == 2

        table = top(sock)
        assert table.returncode == 0, table.stderr
        assert str(dataset) in table.stdout, table.stdout
        assert "2*" in table.stdout, table.stdout

        m = metrics(port)
        (labels, samples), *_ = m["ringfeed_stream_samples"]
        assert str(dataset) in labels["dataset"]
        assert samples >= 12
        assert m["ringfeed_pool_threads"] == [({}, 2.0)]
        assert m["ringfeed_stream_threads"][0][1] == 2.0
        states = {lab["state"]: v for lab, v in m["ringfeed_stream_slots"]}
        assert set(states) == {"free", "filling", "ready", "held"}
        assert sum(states.values()) == ld.slots
        assert {lab["stage"] for lab, _ in m["ringfeed_stream_stage_seconds"]} == {
            "read",
            "decode",
            "transform",
            "write",
        }
    # Closed: the stream is gone from both views.
    deadline = time.monotonic() + 10
    while json.loads(top(sock, "--json").stdout)["streams"]:
        assert time.monotonic() < deadline, "a closed stream is still listed"
        time.sleep(0.05)
    assert "ringfeed_stream_samples" not in metrics(port) or not metrics(port)["ringfeed_stream_samples"]


def test_metrics_serves_only_its_path(server: tuple[str, int]) -> None:
    _, port = server
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).close()
    assert e.value.code == 404
    e.value.close()


def test_top_without_a_server_names_the_socket(sockdir: Path) -> None:
    r = top(str(sockdir / "nothing.sock"))
    assert r.returncode != 0
    assert "nothing.sock" in r.stderr, r.stderr
    assert "ringfeed serve" in r.stderr, r.stderr


def test_a_slow_training_loop_gets_fewer_threads_and_stats_show_why(
    dataset: Path, sockdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The autotuner, end to end: a loop that computes 0.15 s per batch of 4 tiny images needs a
    fraction of one thread; the server sheds the second thread and says why."""
    sock = str(sockdir / "t.sock")
    proc = subprocess.Popen(
        [ringfeed_bin(), "serve", "--socket", sock, "--threads", "2", "--cpu-budget", "2"],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not Path(sock).exists():
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        with ringfeed.Loader(
            dataset,
            4,
            ringfeed.Resize((16, 16)),
            server=ringfeed.Server(socket=sock, spawn=False, timeout=30),
            tuning=ringfeed.Tuning(log_every=5),
        ) as ld:
            first = ld.stats()["server"]
            assert first is not None
            assert first["threads"] == 2, first  # all of the budget until the loop has been measured
            deadline = time.monotonic() + 30
            server = first
            epoch = 0
            while server["threads"] != 1:
                assert time.monotonic() < deadline, f"still {server['threads']} threads: {server}"
                ld.set_epoch(epoch)
                epoch += 1
                for _ in ld:
                    time.sleep(0.15)
                server = ld.stats()["server"]
            stats = ld.stats()
        # The last change says why, naming who waits for what (a shed thread's "needs", or a
        # later depth change of an epoch's start).
        assert "the training loop" in server["tune"], server
        assert server["step_ms"] > 100, server
        assert 0.0 <= stats["wait_share"] < 0.5, stats
        assert stats["batches"] >= 6
        # 1.2: the server's reading of the interval, in words, and the allotted thread's busy share
        # (the loop consumes a fraction of one thread: not all of its time).
        assert "the training loop waits for data" in server["limit"], server
        assert 0.0 < server["busy"] < 0.9, server
        assert server.get("gpu_wait") is None, server  # a CPU loop has no GPU to wait behind
        log = capsys.readouterr().err
        assert "samples/s; the training loop waited for data" in log, log
        assert "(server: " in log, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)
