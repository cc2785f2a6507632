"""A pure-Python reference of a token stream's window order (control.md, "Token streams", "Order",
and "Mixing").

Written from the spec, independently of ``crates/order/src/mix.rs`` and ``crates/order/src/sampler.rs``:
splitmix64's output function, the pass key, the cycle-walked Feistel ``permute``, the two-step weight
quantisation, the quota method simulated slot by slot (no period), and the rest of an epoch from a
global position materialised as a list, padded and striped like ``DistributedSampler``.
"""

from __future__ import annotations

import math

M64 = (1 << 64) - 1
MIX_PERM = int.from_bytes(b"mix_perm", "big")


def mix64(z: int) -> int:
    """splitmix64's output function (with its increment), modulo 2^64."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def key(seed: int, epoch: int, dataset: int, pass_: int) -> int:
    return mix64(mix64(mix64(seed ^ MIX_PERM) ^ epoch) ^ ((dataset * 2**40 + pass_) & M64))


def permute(n: int, k: int, x: int) -> int:
    """The keyed permutation of ``0..n`` at ``x``: a 4-round Feistel network, walked into range."""
    assert 0 <= x < n
    if n <= 1:
        return x
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    h = bits // 2
    mask = (1 << h) - 1
    y = x
    while True:
        left, right = y >> h, y & mask
        for rnd in range(4):
            left, right = right, left ^ (mix64(right ^ mix64(k ^ rnd)) & mask)
        y = (left << h) | right
        if y < n:
            return y


def quantise(weights: list[float]) -> list[int]:
    """The integer weights r_i: q_i = floor(w_i / max w * 2^32 + 1/2), then q_i * 2^20 / Q rounded half
    up, divided by their greatest common divisor."""
    top = max(weights)
    q = [math.floor(w / top * 2**32 + 0.5) for w in weights]
    total = sum(q)
    r = [(x * 2**21 + total) // (2 * total) for x in q]
    g = math.gcd(*r)
    return [x // g for x in r]


def quota_schedule(r: list[int], n: int) -> list[int]:
    """The dataset of each of ``n`` slots by the quota method on integer weights ``r``, slot by slot:
    under the upper quota (c_i * R < r_i * (k + 1)), the largest r_i / (c_i + 1), ties to the lower
    index (compared as integers: exact)."""
    total = sum(r)
    c = [0] * len(r)
    out = []
    for k in range(n):
        best = -1
        for i in range(len(r)):
            if c[i] * total >= r[i] * (k + 1):
                continue
            if best < 0 or r[i] * (c[best] + 1) > r[best] * (c[i] + 1):
                best = i
        c[best] += 1
        out.append(best)
    return out


def epoch_order(
    windows: list[int], weights: list[float] | None, seed: int, epoch: int, shuffle: bool
) -> list[tuple[int, int]]:
    """The ``(dataset, window)`` at every position of an epoch; one dataset is a mix of one."""
    r = [1] if weights is None else quantise(weights)
    n = sum(windows)
    slots = quota_schedule(r, n)
    seen = [0] * len(windows)
    out = []
    for d in slots:
        j = seen[d]
        seen[d] += 1
        pass_, at = divmod(j, windows[d])
        out.append((d, permute(windows[d], key(seed, epoch, d, pass_), at) if shuffle else at))
    return out


def rest_of_epoch(order: list, position: int, world: int, rank: int, drop_last: bool) -> list:
    """Rank ``rank``'s share of the rest of the epoch from global ``position``: ``order[position:]``
    padded by repeating ``order`` from its start (or cut) to a multiple of ``world``, then every
    ``world``-th from ``rank`` (control.md, "Resume by a global position")."""
    n = len(order)
    left = n - position
    per_rank = left // world if drop_last else -(-left // world)
    rest = list(order[position:])
    i = 0
    while len(rest) < per_rank * world:
        rest.append(order[i % n])
        i += 1
    return rest[: per_rank * world][rank::world]
