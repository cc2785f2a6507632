"""CUDA mode against ``_fakeserver.FakeServer``: pinned ring, side-stream copies, event-gated release.

Skipped where CUDA is not available. The fake server overwrites a slot with 0xEE the moment it is
released, so a release sent before the host-to-device copy finished would show up as 0xEE bytes
in the GPU batches (ring.md rule 5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _fakeserver import DATASET, FakeServer

import ringfeed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make(
    server: FakeServer, batch_size: int, size: int, *, slots: int = 4, normalize: Any = None, **kw: Any
) -> ringfeed.Loader:
    """A CUDA loader of the fake server; ``normalize=(mean, std)`` ends the transform with ``Normalize``."""
    kw.setdefault("shuffle", False)
    transform = ringfeed.Resize((size, size) if isinstance(size, int) else size)
    if normalize is not None:
        transform = transform + ringfeed.Normalize(*normalize)
    return ringfeed.Loader(
        DATASET,
        batch_size,
        transform=transform,
        server=ringfeed.Server(socket=server.path, spawn=False, timeout=30),
        tuning=ringfeed.Tuning(slots=slots),
        **kw,
    )


def test_batches_arrive_on_the_gpu_intact(serve: Callable[..., FakeServer]) -> None:
    """Large batches copied asynchronously arrive intact: no slot was released before its copy finished."""
    server = serve(dataset_len=64 * 12)
    with make(server, 64, 224, device="cuda", slots=3, fields=["index"]) as loader:
        seg = loader._res.segment
        assert seg is not None
        assert seg.as_uint8().is_pinned()
        kept = []
        for b in loader:  # no synchronisation in the loop: the copies race the releases
            assert b["image"].device.type == "cuda"
            assert tuple(b["image"].shape) == (64, 224, 224, 3)
            kept.append((b["image"], b["index"]))
        torch.cuda.synchronize()
        assert len(kept) == 12
        for images, index in kept:
            want = (index % 251).to(torch.uint8).view(-1, 1, 1, 1).expand_as(images)
            assert torch.equal(images, want)
        assert [int(i[0]) for _, i in kept] == list(range(0, 64 * 12, 64))
    conn = server.conns[0]
    server.wait(lambda: conn.closed)
    assert len(server.sent("release")) + len(conn.held) == conn.readies


def test_consumer_on_its_own_stream(serve: Callable[..., FakeServer]) -> None:
    """A consumer on a non-default stream sees complete data: its stream waits on the copy's event."""
    server = serve(dataset_len=32 * 6)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with make(server, 32, 128, device="cuda") as loader, torch.cuda.stream(side):
        sums = []
        for images, labels in loader:
            sums.append((images.float().sum(dim=(1, 2, 3)), labels))
        side.synchronize()
    for s, labels in sums:
        assert torch.equal(s, ((labels % 251).float() * 128 * 128 * 3).to(s.device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_normalize_on_the_gpu(serve: Callable[..., FakeServer], dtype: torch.dtype, layout: str) -> None:
    """normalize on the GPU gives (x/255 - mean)/std in dtype, [N, 3, H, W] channels_last, for either ring layout."""
    server = serve(dataset_len=16)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    with make(server, 8, 32, device="cuda", normalize=(mean, std), dtype=dtype, layout=layout) as loader:
        for images, labels in loader:
            assert images.dtype == dtype
            assert tuple(images.shape) == (8, 3, 32, 32)
            assert images.is_contiguous(memory_format=torch.channels_last)
            x = (labels % 251).double().cuda() / 255
            for c in range(3):
                want = ((x - mean[c]) / std[c]).view(-1, 1, 1).expand(-1, 32, 32)
                tol = 1e-5 if dtype == torch.float32 else 2e-2
                assert torch.allclose(images[:, c].double(), want, atol=tol, rtol=tol)


def test_local_rank_picks_the_device(serve: Callable[..., FakeServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """device="cuda" means cuda:$LOCAL_RANK under torchrun."""
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count() - 1))
    server = serve(dataset_len=8)
    with make(server, 4, 16, device="cuda") as loader:
        assert loader.device == torch.device("cuda", torch.cuda.device_count() - 1)
        images, _ = next(iter(loader))
        assert images.device == loader.device


def test_close_waits_for_copies_and_unpins(serve: Callable[..., FakeServer]) -> None:
    """close() right after a batch waits for the copy, unregisters the ring, and the GPU batch stays intact."""
    server = serve(dataset_len=64 * 2)
    loader = make(server, 64, 224, device="cuda")
    images, labels = next(iter(loader))
    cuda = loader._res.cuda
    assert cuda is not None
    assert cuda.pinned
    loader.close()
    assert cuda.ptr == 0
    assert not cuda.pending
    torch.cuda.synchronize()
    assert torch.equal(images, (labels % 251).to(torch.uint8).view(-1, 1, 1, 1).expand_as(images))


def test_batch_ops_on_the_gpu_equal_the_cpu_path(tmp_path: Any) -> None:
    """A real server's pipeline with Normalize, RandomErasing and MixUp/CutMix gives the same batches on
    the GPU (side stream) as on the CPU, batch for batch."""
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _fleet import make_dataset

    os.environ.setdefault("RINGFEED_BIN", "ringfeed")
    ds = make_dataset(tmp_path, 48, size=(64, 48))
    recipe = ringfeed.Compose(
        [
            ringfeed.RandomResizedCrop(32),
            ringfeed.RandomHorizontalFlip(),
            ringfeed.TrivialAugmentWide(),
            ringfeed.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            ringfeed.RandomErasing(0.9),
        ]
    )
    mix = ringfeed.RandomChoice([ringfeed.MixUp(alpha=0.2, num_classes=4), ringfeed.CutMix(alpha=1.0, num_classes=4)])
    out = {}
    for device in ("cpu", "cuda"):
        with ringfeed.Loader(
            ds,
            8,
            recipe,
            batch_transform=mix,
            device=device,
            seed=3,
            server=ringfeed.Server(socket=str(tmp_path / f"{device}.sock"), spawn=True, timeout=60),
        ) as ld:
            out[device] = [(x.cpu(), y.cpu()) for x, y in ld]
    assert len(out["cpu"]) == len(out["cuda"]) == 6
    for (a, la), (b, lb) in zip(out["cpu"], out["cuda"], strict=True):
        assert torch.allclose(la, lb)
        assert torch.allclose(a, b, atol=1e-4)


def test_time_behind_a_busy_gpu_is_not_a_wait_for_data(serve: Callable[..., FakeServer]) -> None:
    """Copies queued behind GPU work (here a 20 ms spin kernel on the copy stream before each batch) make next()
    wait for the copy's event; that time is reported as gpu_wait_ns to a 1.2 server, apart from the wait for data."""
    server = serve(dataset_len=32 * 16, protocol=(1, 2))
    with make(server, 32, 64, device="cuda", slots=2) as loader:
        copier = loader._res.cuda
        khz = torch.cuda.get_device_properties(copier.device).clock_rate or 2_000_000  # 0 where CUDA drops it
        cycles = int(khz * 1e3 * 0.02)  # ~20 ms
        for _ in loader:
            with torch.cuda.stream(copier.stream):
                torch.cuda._sleep(cycles)  # the next copy queues behind it
        s = loader.stats(server=False)
        server.wait(lambda: len(server.sent("stats")) >= 1)
        sent = server.sent("stats")
    # Two slots: from the third batch on, next() waits for the oldest copy, behind a 20 ms kernel.
    assert s["gpu_wait_s"] > 0.1, s
    assert s["gpu_wait_s"] <= s["wait_s"], s
    assert s["data_wait_s"] < s["gpu_wait_s"], s
    assert all(0 < m["gpu_wait_ns"] <= m["wait_ns"] for m in sent), sent
