"""A pure-Python reference of the server's sample orders (control.md, "Order and randomness").

Written from the spec, independently of ``crates/order/src/blocks.rs``: the per-sample generator
(``ops/rng.rs``'s splitmix64 with Lemire's unbiased ``below``), Fisher-Yates, the ``global`` and
``shard_blocks`` permutations, and ``DistributedSampler``'s rank split.
"""

from __future__ import annotations

from collections.abc import Sequence

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
DOMAIN = int.from_bytes(b"ringfeed", "big")
FORK = int.from_bytes(b"viewfork", "big")
GLOBAL_STREAM = M64
SHARD_STREAM = M64 - 1
BLOCK_STREAM = M64 - 2


def mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Rng:
    """``SampleRng``: the generator of ``(seed, epoch, index)``."""

    def __init__(self, seed: int, epoch: int, index: int, *, state: int | None = None) -> None:
        self.state = mix(mix(mix(seed ^ DOMAIN) ^ epoch) ^ index) if state is None else state

    def fork(self, j: int) -> Rng:
        return Rng(0, 0, 0, state=mix(self.state ^ mix(j ^ FORK)))

    def next_u64(self) -> int:
        self.state = (self.state + GAMMA) & M64
        return mix(self.state)

    def below(self, n: int) -> int:
        if n == 0:
            return 0
        m = self.next_u64() * n
        if (m & M64) < n:
            threshold = ((1 << 64) - n) % n
            while (m & M64) < threshold:
                m = self.next_u64() * n
        return m >> 64


def fisher_yates(v: list[int], rng: Rng) -> None:
    for i in range(len(v) - 1, 0, -1):
        j = rng.below(i + 1)
        v[i], v[j] = v[j], v[i]


def global_order(n: int, seed: int, epoch: int) -> list[int]:
    v = list(range(n))
    fisher_yates(v, Rng(seed, epoch, GLOBAL_STREAM))
    return v


def shard_blocks(sizes: Sequence[int], block: int, seed: int, epoch: int) -> list[int]:
    starts = [sum(sizes[:s]) for s in range(len(sizes))]
    shards = list(range(len(sizes)))
    fisher_yates(shards, Rng(seed, epoch, SHARD_STREAM))
    blocks = Rng(seed, epoch, BLOCK_STREAM)
    out: list[int] = []
    for b in range(0, len(shards), block):
        samples = [i for s in shards[b : b + block] for i in range(starts[s], starts[s] + sizes[s])]
        fisher_yates(samples, blocks.fork(b // block))
        out += samples
    return out


def rank_split(order: list[int], world: int, rank: int, drop_last: bool) -> list[int]:
    """``DistributedSampler``: cut to a multiple of ``world`` or pad by repeating the start, then stride."""
    n = len(order)
    per_rank = n // world if drop_last else -(-n // world)
    total = per_rank * world
    padded = list(order)
    i = 0
    while len(padded) < total:
        padded.append(padded[i])
        i += 1
    return padded[:total][rank::world]
