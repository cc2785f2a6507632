#!/usr/bin/env python3
"""Where a traced training step's time goes (the Chrome traces of `gpu_train.py --trace N`).

    python3 benches/e2e/trace_summary.py TRACE.json.gz [...] [--steps N]

For each trace: the model's stream (the one with the most kernel time) busy and spanned per
step, and the gaps in it (over 200 µs: the GPU waiting, for data or for the host's launches;
under: launch spacing); the kernel time per step on every other stream (the loader's copy
stream, nvJPEG's), the costliest kernels and copies, and the CUDA runtime calls per thread. Under
the profiler the host side runs slower than without it: compare traces with each other, not with
the untraced figures.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import itertools
import json
from pathlib import Path


def summary(path: Path, steps: int) -> list[str]:
    with gzip.open(path) as f:
        ev = json.load(f)["traceEvents"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    per_stream: dict[int, float] = collections.defaultdict(float)
    for e in gpu:
        per_stream[e["args"]["stream"]] += e["dur"]
    model = max(per_stream, key=per_stream.__getitem__)
    m = sorted((e for e in gpu if e["args"]["stream"] == model), key=lambda e: e["ts"])
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in itertools.pairwise(m)]
    ms = lambda us: us / steps / 1000  # noqa: E731
    out = [
        f"## {path.name}",
        "",
        f"- model stream {model}: busy {ms(per_stream[model]):.2f} ms/step, spans "
        f"{ms(m[-1]['ts'] + m[-1]['dur'] - m[0]['ts']):.2f} ms/step; gaps over 200 µs "
        f"{ms(sum(g for g in gaps if g > 200)):.2f} ms/step, shorter ones {ms(sum(g for g in gaps if g <= 200)):.2f}",
    ]
    others = {s: v for s, v in per_stream.items() if s != model}
    if others:
        out.append(
            f"- other streams: {ms(sum(others.values())):.2f} ms/step of GPU work in all ({len(others)} streams)"
        )
    names: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in gpu:
        s = e["args"]["stream"]
        key = ("model" if s == model else ("loader" if s < 100 else "nvJPEG"), e["cat"], e["name"][:70])
        names[key][0] += 1
        names[key][1] += e["dur"]
    out += ["", "| where | kind | name | calls/step | ms/step | µs each |", "|---|---|---|---:|---:|---:|"]
    for (where, cat, name), (n, dur) in sorted(names.items(), key=lambda kv: -kv[1][1])[:14]:
        out.append(f"| {where} | {cat} | `{name}` | {n / steps:.1f} | {ms(dur):.3f} | {dur / n:.1f} |")
    rt: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            rt[(e["tid"], e["name"])][0] += 1
            rt[(e["tid"], e["name"])][1] += e.get("dur", 0)
    out += ["", "| thread | CUDA call | calls/step | ms/step |", "|---|---|---:|---:|"]
    for (tid, name), (n, dur) in sorted(rt.items(), key=lambda kv: -kv[1][1])[:12]:
        out.append(f"| {tid} | {name} | {n / steps:.0f} | {ms(dur):.3f} |")
    return [*out, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", type=Path, nargs="+")
    ap.add_argument("--steps", type=int, default=30, help="steps in each trace (gpu_train.py --trace)")
    a = ap.parse_args()
    for t in a.traces:
        print("\n".join(summary(t, a.steps)))


if __name__ == "__main__":
    main()
