"""``ringfeed.Loader``'s logic, against ``_fakeserver.FakeServer`` (the real protocol and a real ring).

What is checked here is the client's side of the protocol: which messages it sends when, that
every ``ready`` is answered by exactly one ``release`` at the right moment, that views show the
right bytes while they are valid, resume, errors. The fake server overwrites a slot with 0xEE as
soon as it is released, so "valid until the next batch" is observable.
"""

from __future__ import annotations

import collections
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _fakeserver import DATASET, POISON, FakeServer, plan

import ringfeed
from ringfeed import ProtocolError, RingfeedError, ServerDiedError, ServerError
from ringfeed import _stream as stream_mod
from ringfeed.wire import sidecar

H, W = 4, 6
TESTS = Path(__file__).resolve().parent


def make(
    server: FakeServer, batch_size: int = 3, *, timeout: float = 5.0, slots: int = 4, hold: int = 1, **kw: Any
) -> ringfeed.Loader:
    kw.setdefault("transform", ringfeed.Resize((H, W)))
    kw.setdefault("shuffle", False)
    kw.setdefault("drop_last", True)
    return ringfeed.Loader(
        DATASET,
        batch_size,
        server=ringfeed.Server(socket=server.path, spawn=False, timeout=timeout),
        tuning=ringfeed.Tuning(slots=slots, hold=hold),
        **kw,
    )


def labels_of(batches: list[Any]) -> list[list[int]]:
    return [b[1].tolist() for b in batches]


def epoch_labels(loader: ringfeed.Loader) -> list[list[int]]:
    """Iterates the loader, reading each batch's labels while it is valid."""
    return [labels.tolist() for _, labels in loader]


# -- an epoch -------------------------------------------------------------------------------------


def test_an_epoch_in_cpu_mode(serve: Callable[..., FakeServer]) -> None:
    """An epoch yields len(loader) (images, labels) batches in the server's order, then ends with StopIteration."""
    server = serve(dataset_len=10)
    with make(server, 3, seed=5, shuffle=True, drop_last=False) as loader:
        assert len(loader) == 4
        assert (loader.dataset_len, loader.samples_per_rank) == (10, 10)
        want = plan(10, seed=5, epoch=0, shuffle=True, rank=0, world=1, drop_last=False, batch=3)
        got = []
        for images, labels in loader:
            assert images.dtype == torch.uint8
            assert tuple(images.shape) == (len(labels), H, W, 3)
            assert labels.dtype == torch.int64
            assert torch.equal(images, (labels % 251).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, H, W, 3))
            got.append(labels.tolist())
        assert got == want
        assert [len(b) for b in got] == [3, 3, 3, 1]
        assert server.sent("start") == [{"type": "start", "epoch": 0, "first_batch": 0}]
        assert loader.state_dict()["batches_delivered"] == 4
    server.wait(lambda: server.conns[0].closed)
    assert server.sent("close")


def test_handshake_and_open_carry_every_setting(serve: Callable[..., FakeServer]) -> None:
    """hello names protocol 1.0; open carries the dataset path and every setting, as control.md spells them."""
    server = serve(dataset_len=12)
    t = ringfeed.RandomResizedCrop((H, W), scale=(0.5, 1)) + ringfeed.Flip(0.25)
    with make(
        server, 4, transform=t, seed=9, slots=3, layout="NCHW", on_error="skip", fields=["crop"], rank=1, world_size=2
    ):
        hello, op = server.conns[0].received[:2]
    assert hello["type"] == "hello"
    assert hello["protocol"] == list(ringfeed.PROTOCOL)
    assert hello["pid"] == os.getpid()
    assert hello["client"].startswith("ringfeed-py ")
    assert op == {
        "type": "open",
        "dataset": DATASET,
        "batch_size": 4,
        "transform": {
            "kind": "random_resized_crop",
            "size": [H, W],
            "scale": [0.5, 1.0],
            "ratio": [0.75, 4 / 3],
            "flip": 0.25,
        },
        "layout": "NCHW",
        "shuffle": False,
        "seed": 9,
        "drop_last": True,
        "rank": 1,
        "world_size": 2,
        "slots": 3,
        "on_error": "skip",
        "fields": ["image", "label", "crop"],
        "check_crc": True,
    }


def test_extra_fields_come_as_a_dict(serve: Callable[..., FakeServer]) -> None:
    """With fields=["index", "crop"] each batch is a dict of image, label, index and crop, NCHW when asked."""
    server = serve(dataset_len=4)
    with make(server, 2, fields=["index", "crop"], layout="NCHW") as loader:
        batches = []
        for b in loader:
            assert set(b) == {"image", "label", "index", "crop"}
            assert tuple(b["image"].shape) == (2, 3, H, W)
            assert b["crop"].dtype == torch.int32
            assert tuple(b["crop"].shape) == (2, 5)
            assert torch.equal(b["index"], b["label"])
            batches.append(b["crop"][:, 0].tolist())
        assert batches == [[0, 1], [2, 3]]


# -- slot ownership ---------------------------------------------------------------------------------


def test_cpu_batch_is_valid_until_the_next_one_is_requested(serve: Callable[..., FakeServer]) -> None:
    """A CPU batch is a view of its slot, released only when the next batch is requested; a batch
    still referenced then moves to private memory first, so the server's refill does not reach it."""
    server = serve(dataset_len=9)
    with make(server, 3, slots=3) as loader:
        it = iter(loader)
        images, labels = next(it)
        ptr = images.data_ptr()
        time.sleep(0.1)  # were the slot released early, the server would have poisoned it by now
        assert labels.tolist() == [0, 1, 2]
        assert int(images[0, 0, 0, 0]) == 0
        assert not server.sent("release")
        images2, labels2 = next(it)
        assert images2.data_ptr() != ptr  # another slot
        server.wait(lambda: len(server.sent("release")) == 1)
        seg = loader._res.segment
        assert seg is not None
        ring = seg.as_uint8()
        assert int(ring[ptr - ring.data_ptr()]) == POISON  # the first batch's slot went back
        assert images.data_ptr() != ptr  # but the images still held had moved out of it
        assert int(images[0, 0, 0, 0]) == 0
        assert labels.tolist() == [0, 1, 2]
        assert labels2.tolist() == [3, 4, 5]
        assert server.sent("release") == [{"type": "release", "slot": 0, "seq": 1}]


def test_hold_keeps_more_batches_valid(serve: Callable[..., FakeServer]) -> None:
    """With hold=2 the two most recent CPU batches stay valid."""
    server = serve(dataset_len=12)
    with make(server, 2, slots=4, hold=2) as loader:
        it = iter(loader)
        seen = [next(it) for _ in range(3)]
        server.wait(lambda: len(server.sent("release")) == 1)
        time.sleep(0.05)
        assert len(server.sent("release")) == 1
        assert seen[1][1].tolist() == [2, 3]
        assert seen[2][1].tolist() == [4, 5]


def test_every_ready_is_released_exactly_once(serve: Callable[..., FakeServer]) -> None:
    """Over epochs, early breaks and re-iterations, every ready gets exactly one matching release (the fake checks)."""
    server = serve(dataset_len=20)
    with make(server, 2, slots=3) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for i, _ in enumerate(loader):
                if epoch == 1 and i == 2:
                    break
        list(loader)  # a fourth run, after a broken one
    server.wait(lambda: server.conns[0].closed)
    conn = server.conns[0]
    # Slots still held at `close` are freed by the server; every release matched a held slot.
    assert len(server.sent("release")) + len(conn.held) == conn.readies


def test_a_new_iteration_discards_the_old_runs_batches(serve: Callable[..., FakeServer]) -> None:
    """After a broken iteration the next one starts a new run; the old run's late readies are released unread."""
    server = serve(dataset_len=12)
    with make(server, 2, slots=4) as loader:
        it = iter(loader)
        next(it)
        server.wait(lambda: server.conns[0].readies == 4)  # the old run filled the ring
        got = epoch_labels(loader)
        assert got == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
        assert [m["first_batch"] for m in server.sent("start")] == [0, 0]
        with pytest.raises(RuntimeError, match="abandoned"):
            next(it)


def test_a_batch_still_referenced_after_its_iteration_stays_valid(serve: Callable[..., FakeServer]) -> None:
    """next(iter(loader)) (or a break) keeps the batch the user still holds valid until the next iteration."""
    server = serve(dataset_len=6)
    with make(server, 3) as loader:
        images, labels = next(iter(loader))  # the iterator is gone at once
        time.sleep(0.1)
        assert not server.sent("release")
        assert labels.tolist() == [0, 1, 2]
        assert int(images.flatten()[0]) == 0
        del images, labels
        for _ in loader:  # a new iteration releases it
            break
        server.wait(lambda: {"type": "release", "slot": 0, "seq": 1} in server.sent("release"))


def test_an_unreferenced_batch_is_released_when_its_iteration_ends(serve: Callable[..., FakeServer]) -> None:
    """A batch dropped before its iteration ends is released right then, not at the next iteration."""
    server = serve(dataset_len=6)
    with make(server, 3) as loader:
        it = iter(loader)
        next(it)  # the batch is dropped at once
        it.close()  # what a `break` does to the loop's iterator
        server.wait(lambda: len(server.sent("release")) == 1)


def test_views_stay_readable_after_close(serve: Callable[..., FakeServer]) -> None:
    """Closing the loader while the user still holds a CPU view does not crash reading it (the unmap is deferred)."""
    server = serve(dataset_len=6)
    loader = make(server, 3)
    images, labels = next(iter(loader))
    loader.close()
    loader.close()
    assert images.sum().item() >= 0
    assert labels.tolist() == [0, 1, 2]
    with pytest.raises(RingfeedError, match="closed"):
        iter(loader)


def test_garbage_collection_closes_the_stream(serve: Callable[..., FakeServer]) -> None:
    """A loader dropped without close() is closed by its finalizer: the server sees the connection end."""
    server = serve(dataset_len=6)
    loader = make(server, 3)
    next(iter(loader))
    del loader
    gc.collect()
    server.wait(lambda: server.conns[0].closed)


# -- epochs and resume ----------------------------------------------------------------------------


def test_set_epoch_selects_the_order(serve: Callable[..., FakeServer]) -> None:
    """set_epoch(e) makes the next iteration start epoch e; the batches follow that epoch's order."""
    server = serve(dataset_len=9)
    with make(server, 3, shuffle=True, seed=1) as loader:
        loader.set_epoch(2)
        assert loader.epoch == 2
        got = epoch_labels(loader)
        assert got == plan(9, seed=1, epoch=2, shuffle=True, rank=0, world=1, drop_last=True, batch=3)
        assert server.sent("start")[-1]["epoch"] == 2


def test_state_dict_round_trip_resumes_mid_epoch(serve: Callable[..., FakeServer]) -> None:
    """A state saved after k batches resumes in a new loader with first_batch=k: exactly batches k.. of the epoch."""
    server = serve(dataset_len=15)
    full = plan(15, seed=3, epoch=1, shuffle=True, rank=0, world=1, drop_last=True, batch=2)
    with make(server, 2, shuffle=True, seed=3) as loader:
        loader.set_epoch(1)
        it = iter(loader)
        head = [next(it)[1].tolist() for _ in range(3)]
        state = loader.state_dict()
    assert head == full[:3]
    assert state == {
        "version": 2,
        "seed": 3,
        "epoch": 1,
        "position": 6,
        "run_position": 0,
        "batches_delivered": 3,
        "rank": 0,
        "world_size": 1,
        "batch_size": 2,
        "shuffle": True,
        "drop_last": True,
        "order": "global",
        "order_block": None,
        "dataset": DATASET,
        "dataset_id": None,  # the fake server speaks 1.5: no ring.dataset_id
    }
    with make(server, 2, shuffle=True, seed=3) as again:
        again.load_state_dict(state)
        again.set_epoch(1)  # the usual loop calls this; the same epoch keeps the resume point
        tail = [labels.tolist() for _, labels in again]
        assert head + tail == full
        assert server.sent("start") == [{"type": "start", "epoch": 1, "first_batch": 3}]
        assert again.state_dict()["batches_delivered"] == len(full)
        again.set_epoch(2)
        assert again.state_dict()["batches_delivered"] == 0
        assert len(list(again)) == len(full)
        assert server.sent("start")[-1] == {"type": "start", "epoch": 2, "first_batch": 0}


def test_resume_at_the_end_of_an_epoch_yields_nothing_from_it(serve: Callable[..., FakeServer]) -> None:
    """A state saved after the last batch of an epoch resumes with that epoch already complete."""
    server = serve(dataset_len=4)
    with make(server, 2) as loader:
        loader.load_state_dict({"epoch": 0, "batches_delivered": 2})
        assert list(loader) == []
        assert not server.sent("start")
        assert len(list(loader)) == 2  # iterating again replays the epoch from its start


@pytest.mark.parametrize(
    ("key", "value", "version"),
    [
        ("seed", 1, 2),
        ("shuffle", True, 2),
        ("drop_last", False, 2),
        ("batch_size", 4, 1),
        ("world_size", 2, 1),
    ],
)
def test_state_from_another_configuration_is_refused(
    serve: Callable[..., FakeServer], key: str, value: Any, version: int
) -> None:
    """load_state_dict refuses a state saved with a different {key} (another order; for a version 1 state,
    which has no global position, another batch or world size too), naming the setting to change."""
    server = serve(dataset_len=8)
    with make(server, 2) as loader:
        state = loader.state_dict() | {key: value, "version": version}
        with pytest.raises(ValueError, match=f"saved with {key}={value!r}.*construct the Loader with {key}="):
            loader.load_state_dict(state)


def test_state_with_a_cursor_past_the_epoch_is_refused(serve: Callable[..., FakeServer]) -> None:
    """batches_delivered beyond len(loader) is refused."""
    server = serve(dataset_len=8)
    with make(server, 2) as loader, pytest.raises(ValueError, match="batches_delivered"):
        loader.load_state_dict({"epoch": 0, "batches_delivered": 5})


# -- errors -----------------------------------------------------------------------------------------


def test_unknown_dataset_is_a_server_error_naming_it(serve: Callable[..., FakeServer]) -> None:
    """A path the server cannot open fails in the constructor with the server's `dataset` error naming the path."""
    server = serve()
    with pytest.raises(ServerError, match="no dataset at /nope/x") as e:
        ringfeed.Loader(
            "/nope/x", 2, transform=ringfeed.Resize((4, 4)), server=ringfeed.Server(socket=server.path, spawn=False)
        )
    assert e.value.code == "dataset"


def test_batch_larger_than_dataset_is_a_bad_request(serve: Callable[..., FakeServer]) -> None:
    """A batch size larger than the dataset is the server's bad_request, naming batch_size."""
    server = serve(dataset_len=5)
    with pytest.raises(ServerError, match="batch_size 8 is larger than the dataset") as e:
        make(server, 8)
    assert e.value.code == "bad_request"


def test_version_refused_by_the_server(serve: Callable[..., FakeServer]) -> None:
    """A server of another major version answers `version`; the loader raises it with both versions."""
    server = serve(protocol=(2, 0))
    major, minor = ringfeed.PROTOCOL
    with pytest.raises(ServerError, match=rf"client speaks protocol \[{major}, {minor}\], this server \(2, 0\)") as e:
        make(server)
    assert e.value.code == "version"


def test_server_of_another_major_is_refused_by_the_client(serve: Callable[..., FakeServer]) -> None:
    """A server that welcomes this client with another major version is refused, naming both versions."""
    server = serve(protocol=(2, 1), check_version=False)
    major, minor = ringfeed.PROTOCOL
    with pytest.raises(ProtocolError, match=rf"speaks protocol 2\.1, but this client speaks {major}\.{minor}"):
        make(server)


def test_welcome_with_a_descriptor_is_fine(serve: Callable[..., FakeServer]) -> None:
    """A stray descriptor on `welcome` is closed and the session goes on."""
    server = serve(dataset_len=4, fd_with_welcome=True)
    with make(server, 2) as loader:
        assert len(list(loader)) == 2


def test_sample_error_ends_the_iteration_not_the_loader(serve: Callable[..., FakeServer]) -> None:
    """A `sample` error raises ServerError with the sample index and key; the next iteration starts a new run."""
    server = serve(dataset_len=8, sample_error_at=2)
    with make(server, 2) as loader:
        it = iter(loader)
        got = [next(it)[1].tolist(), next(it)[1].tolist()]
        with pytest.raises(ServerError, match=r"does not decode \(sample 4, key 'k/4.jpg'\)") as e:
            next(it)
        assert (e.value.code, e.value.sample, e.value.key, e.value.fatal) == ("sample", 4, "k/4.jpg", False)
        assert got == [[0, 1], [2, 3]]
        server.sample_error_at = None
        assert epoch_labels(loader) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_server_death_is_reported_at_once_and_state_survives(serve: Callable[..., FakeServer]) -> None:
    """A server that dies mid-epoch is ServerDiedError at once (not after the timeout); the state still resumes."""
    server = serve(dataset_len=10, die_after=2)
    loader = make(server, 2, timeout=30.0)
    got: list[list[int]] = []
    t = time.monotonic()
    with pytest.raises(ServerDiedError, match="closed the connection"):
        collect(loader, got)
    assert time.monotonic() - t < 2
    assert got in ([[0, 1]], [[0, 1], [2, 3]])  # the second batch may or may not be read before the EPIPE
    assert loader.state_dict()["batches_delivered"] == len(got)
    with pytest.raises(RingfeedError, match=r"failed earlier.*load_state_dict"):
        iter(loader)
    loader.close()


def test_a_fatal_error_before_the_close_is_what_the_user_sees(serve: Callable[..., FakeServer]) -> None:
    """A fatal error sent just before the server closes is raised as such, even when a send fails first."""
    server = serve(dataset_len=10, die_after=1, die_with_error=True)
    loader = make(server, 2, timeout=30.0)
    it = iter(loader)
    next(it)
    server.wait(lambda: server.conns[0].closed)
    with pytest.raises(ServerError, match="the decode pool panicked") as e:
        next(it)
    assert e.value.code == "internal"
    loader.close()


def test_silence_is_a_timeout_naming_the_setting(serve: Callable[..., FakeServer]) -> None:
    """A live server that sends nothing is ringfeed.TimeoutError after `timeout`, naming Server(timeout=...)."""
    server = serve(dataset_len=10, stall_after=1)
    with make(server, 2, timeout=0.3) as loader:
        it = iter(loader)
        next(it)
        t = time.monotonic()
        with pytest.raises(ringfeed.TimeoutError, match=r"within 0.3 s.*server=ringfeed\.Server\(timeout=...\)"):
            next(it)
        assert 0.25 < time.monotonic() - t < 3


def test_nothing_listening_at_an_explicit_socket(sockdir: Path) -> None:
    """With socket= given and nothing listening, the error names the path; no server is started."""
    path = str(sockdir / "none.sock")
    with pytest.raises(RingfeedError, match=f"no ringfeed server is listening at {path}"):
        ringfeed.Loader(DATASET, 2, transform=ringfeed.Resize((4, 4)), server=ringfeed.Server(socket=path))
    assert not Path(path).exists()


# -- options ----------------------------------------------------------------------------------------


def test_normalize_on_the_cpu(serve: Callable[..., FakeServer]) -> None:
    """Normalize(mean, std) gives (x/255 - mean)/std, float [N, 3, H, W] channels_last, and frees the slot at once."""
    server = serve(dataset_len=4)
    mean, std = (0.5, 0.25, 0.0), (0.5, 0.25, 1.0)
    normalized = ringfeed.Resize((H, W)) + ringfeed.Normalize(mean, std)
    with make(server, 2, transform=normalized) as loader:
        it = iter(loader)
        images, labels = next(it)
        server.wait(lambda: len(server.sent("release")) == 1)
        assert images.dtype == torch.float32
        assert tuple(images.shape) == (2, 3, H, W)
        assert images.is_contiguous(memory_format=torch.channels_last)
        x = (labels % 251).double() / 255
        for c in range(3):
            want = ((x - mean[c]) / std[c]).float()
            assert torch.allclose(images[:, c, 0, 0], want, atol=1e-6)
        assert labels.tolist() == [0, 1]  # a copy: the slot is already poisoned
    with make(server, 2, transform=normalized, dtype=torch.bfloat16) as loader:
        images, _ = next(iter(loader))
        assert images.dtype == torch.bfloat16


def test_numpy_without_torch(serve: Callable[..., FakeServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch the CPU batches are numpy views of the ring."""
    monkeypatch.setattr(stream_mod, "_have_torch", lambda: False)
    server = serve(dataset_len=4)
    with make(server, 2) as loader:
        images, labels = next(iter(loader))
        time.sleep(0.05)
        assert isinstance(images, np.ndarray)
        assert images.shape == (2, H, W, 3)
        assert labels.tolist() == [0, 1]


def test_stats_count_batches_and_wait(serve: Callable[..., FakeServer]) -> None:
    """stats() counts batches and the time waited; a `stats` message goes to the server every 16 batches."""
    server = serve(dataset_len=40)
    with make(server, 2, slots=2) as loader:
        n = sum(1 for _ in loader)
        s = loader.stats()
        assert s["batches"] == n == 20
        assert s["wait_s"] >= 0
        assert s["skipped"] == 0
        server.wait(lambda: len(server.sent("stats")) == 1)
        assert server.sent("stats")[0]["steps"] == 16


class LaggingGpu:
    """Stands in for ``_device.CudaCopier`` on the CPU: a GPU that is behind.

    Each copy's launch blocks for ``launch`` seconds (a full launch queue), and its event completes
    ``lag`` seconds after the previous one (the copies queue behind the model's work), so waiting for
    the oldest copy blocks. ``blocked`` is the host time spent inside these calls.
    """

    def __init__(self, lag: float, launch: float) -> None:
        self.lag, self.launch = lag, launch
        self.pending: collections.deque[tuple[float, int]] = collections.deque()
        self.free_at = time.perf_counter()
        self.blocked = 0.0

    def copy(self, views: dict[str, Any], slot: int, post: Any = None) -> dict[str, Any]:
        t = time.perf_counter()
        time.sleep(self.launch)
        out = {k: v.clone() for k, v in views.items()}
        self.free_at = max(self.free_at, time.perf_counter()) + self.lag
        self.pending.append((self.free_at, slot))
        self.blocked += time.perf_counter() - t
        return out

    def completed(self) -> list[int]:
        now, done = time.perf_counter(), []
        while self.pending and self.pending[0][0] <= now:
            done.append(self.pending.popleft()[1])
        return done

    def wait_oldest(self) -> int:
        t = time.perf_counter()
        at, slot = self.pending.popleft()
        time.sleep(max(at - t, 0.0))
        self.blocked += time.perf_counter() - t
        return slot

    def wait_all(self) -> list[int]:
        slots = []
        while self.pending:
            slots.append(self.wait_oldest())
        return slots

    def close(self) -> None:
        self.wait_all()


@pytest.mark.parametrize("protocol", [(1, 2), (1, 1)])
def test_time_behind_the_gpu_is_reported_apart_from_the_wait_for_data(
    serve: Callable[..., FakeServer], protocol: tuple[int, int]
) -> None:
    """The time next() spends in the copier's calls (a blocking launch, waiting for a copy's event) is gpu_wait_s,
    inside wait_s and apart from the wait for data, and a 1.2 server gets it as `gpu_wait_ns`; a 1.1 server does not."""
    server = serve(dataset_len=2 * 24, protocol=protocol)
    with make(server, 2, slots=2) as loader:
        gpu = LaggingGpu(lag=0.02, launch=0.002)
        loader._res.cuda = gpu
        assert sum(1 for _ in loader) == 24
        s = loader.stats(server=False)
        blocked = gpu.blocked  # before close() waits for the last copies
        server.wait(lambda: len(server.sent("stats")) >= 1)
        sent = server.sent("stats")
    # 24 copies 20 ms apart on two slots: most of next() is spent waiting for the oldest copy.
    assert blocked > 0.3, blocked
    assert blocked * 0.95 <= s["gpu_wait_s"] <= blocked + 0.05, (s, blocked)
    assert s["gpu_wait_s"] <= s["wait_s"]
    assert s["data_wait_s"] == pytest.approx(s["wait_s"] - s["gpu_wait_s"])
    assert s["gpu_wait_share"] + s["data_wait_share"] == pytest.approx(s["wait_share"])
    if protocol >= (1, 2):
        assert all(0 <= m["gpu_wait_ns"] <= m["wait_ns"] for m in sent), sent
        reported = sum(m["gpu_wait_ns"] for m in sent) / 1e9
        steps = sum(m["steps"] for m in sent)
        # Per step, what was sent is what was measured (the steps are alike, but for the first two).
        assert reported / steps == pytest.approx(s["gpu_wait_s"] / 24, rel=0.5), (sent, s)
    else:
        assert all("gpu_wait_ns" not in m for m in sent), sent


def test_without_a_gpu_no_time_is_behind_the_gpu(serve: Callable[..., FakeServer]) -> None:
    """In CPU mode nothing is counted behind the GPU, and `stats` carries no `gpu_wait_ns`, even to a 1.2 server."""
    server = serve(dataset_len=2 * 20, protocol=(1, 2))
    with make(server, 2, slots=2) as loader:
        assert sum(1 for _ in loader) == 20
        s = loader.stats(server=False)
        server.wait(lambda: len(server.sent("stats")) >= 1)
        sent = server.sent("stats")
    assert s["gpu_wait_s"] == 0.0, s
    assert s["data_wait_s"] == s["wait_s"], s
    assert all("gpu_wait_ns" not in m for m in sent), sent


# -- the sidecar ------------------------------------------------------------------------------------


def collect(loader: ringfeed.Loader, into: list[list[int]]) -> None:
    for _, labels in loader:
        into.append(labels.tolist())


def fake_binary(tmp: Path, body: str) -> Path:
    exe = tmp / "ringfeed"
    exe.write_text(f"#!{sys.executable}\n{body}")
    exe.chmod(0o755)
    return exe


@pytest.fixture
def sidecar_env(sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """RINGFEED_SOCKET in a fresh directory; the fake server script as RINGFEED_BIN."""
    sock = sockdir / "run" / "ringfeed.sock"
    monkeypatch.setenv("RINGFEED_SOCKET", str(sock))
    monkeypatch.setenv("FAKE_DATASET", DATASET)
    monkeypatch.setenv("FAKE_SERVER_RECORD", str(sockdir / "spawned.txt"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    body = (
        f"import sys, runpy\nsys.path[:0] = [{str(TESTS)!r}, {str(TESTS.parent)!r}]\n"
        f"runpy.run_path({str(TESTS / '_fakeserver.py')!r}, run_name='__main__')\n"
    )
    monkeypatch.setenv("RINGFEED_BIN", str(fake_binary(sockdir, body)))
    yield sock
    # Sidecars exit by themselves once idle; wait for them so none outlives the test.
    for proc in sidecar._SPAWNED:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_default_socket_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket is $RINGFEED_SOCKET, else $XDG_RUNTIME_DIR/ringfeed/ringfeed.sock, else /tmp/ringfeed-$UID/."""
    monkeypatch.setenv("RINGFEED_SOCKET", "/x/y.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert sidecar.default_socket_path() == "/x/y.sock"
    monkeypatch.delenv("RINGFEED_SOCKET")
    assert sidecar.default_socket_path() == "/run/user/7/ringfeed/ringfeed.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert sidecar.default_socket_path() == f"/tmp/ringfeed-{os.getuid()}/ringfeed.sock"


def test_sidecar_is_started_when_nothing_listens(sidecar_env: Path) -> None:
    """With no socket= and no server, the loader starts `$RINGFEED_BIN serve --exit-when-idle --socket PATH`."""
    with ringfeed.Loader(
        DATASET, 2, transform=ringfeed.Resize((H, W)), shuffle=False, server=ringfeed.Server(timeout=10)
    ) as loader:
        assert loader.server_log == str(sidecar_env.with_suffix(".log"))
        assert epoch_labels(loader) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
        proc = sidecar._SPAWNED[-1]
        assert list(proc.args)[1:] == ["serve", "--exit-when-idle", "--socket", str(sidecar_env)]  # type: ignore[arg-type]
        assert os.getsid(proc.pid) == proc.pid  # its own session
    assert (sidecar_env.parent.stat().st_mode & 0o777) == 0o700
    assert "listening at" in Path(loader.server_log).read_text()
    proc.wait(timeout=10)  # it exits once idle


def test_local_ranks_start_one_sidecar_between_them(sidecar_env: Path) -> None:
    """Four loaders that find no server at the same moment start exactly one between them."""
    loaders: list[ringfeed.Loader] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            loaders.append(
                ringfeed.Loader(DATASET, 2, transform=ringfeed.Resize((H, W)), server=ringfeed.Server(timeout=10))
            )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert len(loaders) == 4
        started = (sidecar_env.parent.parent / "spawned.txt").read_text().splitlines()
        assert len(started) == 1, started
    finally:
        for x in loaders:
            x.close()


def test_sidecar_that_exits_is_reported_with_its_log(sidecar_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidecar that exits before listening is an error with its exit status and its log's last lines."""
    exe = fake_binary(
        sidecar_env.parent.parent,
        "import sys\nprint('error: cannot bind: permission denied', file=sys.stderr)\nsys.exit(3)\n",
    )
    monkeypatch.setenv("RINGFEED_BIN", str(exe))
    with pytest.raises(
        RingfeedError,
        match=r"exited with status 3 before listening.*its log .*ringfeed.log ends with:\nerror: cannot bind",
    ):
        ringfeed.Loader(DATASET, 2, transform=ringfeed.Resize((4, 4)))


def test_sidecar_that_never_listens_times_out(sidecar_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidecar that never listens is an error after spawn_timeout naming the socket and the log."""
    exe = fake_binary(sidecar_env.parent.parent, "import time\ntime.sleep(30)\n")
    monkeypatch.setenv("RINGFEED_BIN", str(exe))
    t = time.monotonic()
    with pytest.raises(RingfeedError, match=rf"did not listen at {sidecar_env} within 0.5 s; see its log"):
        ringfeed.Loader(DATASET, 2, transform=ringfeed.Resize((4, 4)), server=ringfeed.Server(spawn_timeout=0.5))
    assert time.monotonic() - t < 5
    proc = sidecar._SPAWNED[-1]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_no_binary_to_start(sidecar_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no binary anywhere, the error says how to provide one."""
    monkeypatch.delenv("RINGFEED_BIN")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sidecar, "Path", _NoShipped)
    with pytest.raises(RingfeedError, match=r"no `ringfeed` binary was found.*RINGFEED_BIN"):
        ringfeed.Loader(DATASET, 2, transform=ringfeed.Resize((4, 4)))


class _NoShipped(type(Path())):  # type: ignore[misc]
    """A Path whose files never exist, to hide a binary shipped in the package."""

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return False


class StubCopier:
    """CUDA mode's bookkeeping without a GPU: copies are clones whose completion is never observed by polling."""

    def __init__(self) -> None:
        self.pending: collections.deque[tuple[None, int]] = collections.deque()
        self.waited = 0

    def copy(self, views: dict[str, Any], slot: int, post: Any = None) -> dict[str, Any]:
        self.pending.append((None, slot))
        return {k: v.clone() for k, v in views.items()}

    def completed(self) -> list[int]:
        return []

    def wait_oldest(self) -> int:
        self.waited += 1
        return self.pending.popleft()[1]

    def close(self) -> None:
        self.pending.clear()


@pytest.mark.parametrize("slots", [1, 2])
def test_copies_in_flight_never_deadlock_the_ring(serve: Callable[..., FakeServer], slots: int) -> None:
    """CUDA mode: all slots held by copies in flight and nothing to read: the oldest copy is awaited and released."""
    server = serve(dataset_len=12)
    with make(server, 2, slots=slots, timeout=2.0) as loader:
        stub = StubCopier()
        loader._res.cuda = stub
        assert epoch_labels(loader) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
        assert stub.waited >= 6 - slots
    conn = server.conns[0]
    server.wait(lambda: conn.closed)
    assert len(server.sent("release")) + len(conn.held) == conn.readies
