"""The sample orders (control.md, "Order and randomness", protocol 1.3), checked against the
shared vectors with a pure-Python reference (``_order.py``), then through the real server.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from _order import global_order, rank_split, shard_blocks
from _support import REPO, ringfeed_bin
from PIL import Image

import ringfeed

VECTORS = REPO / "proto" / "vectors" / "order" / "cases.json"
N = 90


def test_the_reference_computes_every_vector() -> None:
    """The Python reference of both orders gives each vector's first and last indices, count and sum."""
    cases = json.loads(VECTORS.read_text())["cases"]
    assert {c["order"] for c in cases} == {"global", "shard_blocks"}
    for c in cases:
        if c["order"] == "global":
            perm = global_order(sum(c["shards"]), c["seed"], c["epoch"])
        else:
            perm = shard_blocks(c["shards"], c["block"], c["seed"], c["epoch"])
        assert sorted(perm) == list(range(sum(c["shards"]))), c["name"]
        mine = rank_split(perm, c["world_size"], c["rank"], c["drop_last"])
        got = (len(mine), mine[:16], mine[-8:], sum(mine))
        assert got == (c["samples_per_rank"], c["first"], c["last"], c["sum"]), c["name"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A packed dataset of N small JPEGs in several shard files, and its shards' sample counts."""
    root = tmp_path_factory.mktemp("order")
    rng = np.random.default_rng(1)
    for i in range(N):
        p = root / "src" / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(buf, "JPEG")
        p.write_bytes(buf.getvalue())
    out = root / "ds"
    cmd = [ringfeed_bin(), "pack", str(root / "src"), str(out), "--shard-size", "40KiB", "--progress", "none"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    with ringfeed.PackedDataset(out) as ds:
        sizes = [s.footer.record_count for s in ds._shards]
    assert len(sizes) > 5, sizes
    return out, sizes


def indices(path: Path, sock: str, **kw: object) -> tuple[str, list[int]]:
    with ringfeed.Loader(
        path,
        4,
        ringfeed.Resize((8, 8)),
        server=ringfeed.Server(socket=sock, spawn=True),
        seed=5,
        fields=["index"],
        shuffle=True,
        drop_last=False,
        **kw,
    ) as loader:
        loader.set_epoch(2)
        return loader.order, [i for b in loader for i in b["index"].tolist()]


def test_the_server_serves_the_shard_blocks_order_of_the_packed_shards(
    packed: tuple[Path, list[int]], sock: str
) -> None:
    """order="shard_blocks" over packed shards is the reference order over the shard files; each sample once."""
    path, sizes = packed
    perm = shard_blocks(sizes, 2, 5, 2)
    seen: list[int] = []
    for rank in range(2):
        order, got = indices(path, sock, order=ringfeed.ShardBlocks(block=2), rank=rank, world_size=2)
        assert order == "shard_blocks"
        assert got == rank_split(perm, 2, rank, drop_last=False)
        seen += got
    assert sorted(seen) == list(range(N))


def test_auto_is_the_global_order_for_local_data(packed: tuple[Path, list[int]], sock: str) -> None:
    """Without `order` (auto) a local dataset keeps the global order, the 1.2 batches, as order="global" does."""
    path, _ = packed
    assert indices(path, sock) == ("global", rank_split(global_order(N, 5, 2), 1, 0, drop_last=False))
    assert indices(path, sock, order="global") == indices(path, sock)


def test_stand_in_shards_are_ranges_of_order_shard_samples(packed: tuple[Path, list[int]], sock: str) -> None:
    """A source without shard files (a folder in place) cuts its indices into ranges of order_shard samples."""
    path, _ = packed
    folder = path.parent / "src"
    order, got = indices(folder, sock, order=ringfeed.ShardBlocks(block=3, shard=7))
    sizes = [min(7, N - s) for s in range(0, N, 7)]
    assert (order, got) == ("shard_blocks", shard_blocks(sizes, 3, 5, 2))


def test_a_resumed_shard_blocks_epoch_delivers_exactly_the_rest(packed: tuple[Path, list[int]], sock: str) -> None:
    """state_dict() records the order; resuming at batch k gives exactly batches k.. of the shard_blocks epoch."""
    path, _ = packed
    kw: dict[str, object] = {
        "server": ringfeed.Server(socket=sock, spawn=True),
        "seed": 5,
        "shuffle": True,
        "drop_last": True,
        "fields": ["index"],
        "order": "shard_blocks",
    }
    with ringfeed.Loader(path, 4, ringfeed.Resize((8, 8)), **kw) as loader:
        loader.set_epoch(1)
        it = iter(loader)
        head = [next(it)["index"].clone() for _ in range(5)]
        state = loader.state_dict()
        rest = [b["index"].clone() for b in it]
    assert state["order"] == "shard_blocks"
    with ringfeed.Loader(path, 4, ringfeed.Resize((8, 8)), **kw) as again:
        again.load_state_dict(state)
        again.set_epoch(1)
        assert torch.equal(torch.cat([b["index"].clone() for b in again]), torch.cat(rest))
    with (
        ringfeed.Loader(path, 4, ringfeed.Resize((8, 8)), **{**kw, "order": "global"}) as other,
        pytest.raises(ValueError, match="order"),
    ):
        other.load_state_dict(state)
    assert len(head) == 5


def test_bad_order_options_are_refused_naming_them(sock: str, packed: tuple[Path, list[int]]) -> None:
    """An unknown order or an out-of-range block is refused before or at open, naming the member."""
    path, _ = packed
    with pytest.raises(ValueError, match="order must be one of"):
        ringfeed.Loader(path, 4, ringfeed.Resize((8, 8)), server=ringfeed.Server(socket=sock), order="random")
    with pytest.raises(ValueError, match=r"ShardBlocks: block must be an integer in 1..=1048576, got 0"):
        ringfeed.ShardBlocks(block=0)
