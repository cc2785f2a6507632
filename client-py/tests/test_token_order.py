"""The shared vectors of a token stream's window order (``proto/vectors/tokens/order.json``, control.md
"Token streams", "Order"), checked against the Python reference ``_tokorder.py``.

The Rust side (``crates/ringfeed/tests/it/token_order.rs``) wrote them from the server's own code; here a
reference written from the spec must produce the same permutation values and the same ranks' rest of
an epoch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _tokorder import epoch_order, key, permute, rest_of_epoch

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "proto" / "vectors" / "tokens" / "order.json").read_text()
)


def test_permute_is_the_vectors() -> None:
    """``permute(n, key, x)`` of the reference equals every listed value, for windows counts from 1 to
    past 2^40 and keys from 0 to 2^64 - 1; and it is a bijection where the vector lists all of 0..n."""
    for c in VECTORS["permute"]:
        n, k = c["n"], c["key"]
        assert [permute(n, k, x) for x in c["x"]] == c["y"], f"n {n} key {k}"
        if len(c["x"]) == n:
            assert sorted(c["y"]) == list(range(n))


def test_permute_is_a_bijection_at_feistel_domain_edges() -> None:
    """At window counts around powers of four (where the network's domain grows), every key's
    permutation takes each of 0..n exactly once."""
    for n in [2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 255, 256, 257]:
        for k in [0, key(1, 2, 0, 0)]:
            assert sorted(permute(n, k, x) for x in range(n)) == list(range(n))


@pytest.mark.parametrize("case", VECTORS["streams"], ids=[c["name"] for c in VECTORS["streams"]])
def test_a_ranks_rest_of_an_epoch_is_the_vectors(case: dict[str, Any]) -> None:
    """A rank's (dataset, window) pairs for the rest of an epoch from a global position, from the
    reference's whole-epoch order padded and striped like DistributedSampler, are the vector's: count,
    first, last and sums (for the 4.9 M-window stream, its listed ends, at their positions)."""
    windows, weights = case["windows"], case["weights"]
    seed, epoch, shuffle = case["seed"], case["epoch"], case["shuffle"]
    world, rank, drop_last, position = case["world_size"], case["rank"], case["drop_last"], case["position"]
    first, last = [tuple(p) for p in case["first"]], [tuple(p) for p in case["last"]]
    if "window_sum" not in case:
        # Too long to materialise here: one dataset (a mix of one), so position k holds window
        # permute(n, key(seed, epoch, 0, 0), k); the rank's i-th is position position + rank + i*world.
        assert weights is None
        assert drop_last
        (n,) = windows
        count = (n - position) // world
        assert count == case["count"]
        k = key(seed, epoch, 0, 0)
        at = [position + rank + i * world for i in [*range(len(first)), *range(count - len(last), count)]]
        assert [(0, permute(n, k, p)) for p in at] == first + last
        return
    order = epoch_order(windows, weights, seed, epoch, shuffle)
    mine = rest_of_epoch(order, position, world, rank, drop_last)
    assert len(mine) == case["count"]
    assert mine[: len(first)] == first
    assert mine[len(mine) - len(last) :] == last
    assert sum(w for _, w in mine) == case["window_sum"]
    assert sum(d for d, _ in mine) == case["dataset_sum"]
