#!/usr/bin/env python3
"""Host-to-GPU hand-off: the copy of a batch out of the ring against the same copy out of ordinary
pinned memory (``torch.empty(pin_memory=True)``), in one run, on one GPU.

    python3 benches/e2e/h2d.py PACKED [--batch-size 256] [--size 224] [--reps 50] [--bin PATH] [--json OUT]

The ring side is the real path: a ``ringfeed.Loader(device="cuda")`` maps the server's memfd and
registers it with ``cudaHostRegister``; the copy is timed on the loader's side stream from a slot
it holds. The baseline is a pinned tensor of the same bytes. Both are timed with CUDA events over
``--reps`` copies after a warm-up of 5 copies (copies, not batches: no loader is timed, so the
harness's warm-up by time does not apply); the ratio is the issue's hand-off target (>= 90 %).
The server is a ``harness.Server``; ``--json`` writes a ``harness`` record (baseline: pinned).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import ringfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness


def gbps(src: torch.Tensor, dst: torch.Tensor, stream: torch.cuda.Stream, reps: int) -> float:
    with torch.cuda.stream(stream):
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    return src.numel() * src.element_size() * reps / (start.elapsed_time(end) / 1e3) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", type=Path, default=None)
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    with harness.Server(binary=a.bin) as server:
        tf = ringfeed.RandomResizedCrop(a.size)
        with ringfeed.Loader(
            a.packed,
            a.batch_size,
            tf,
            server=ringfeed.Server(socket=server.sock, spawn=False),
            device="cuda",
            shuffle=True,
            drop_last=True,
        ) as ld:
            next(iter(ld))  # the ring is mapped and registered
            res = ld._res
            copier, segment = res.cuda, res.segment
            assert copier is not None
            assert segment is not None
            ring_src = segment.view(0, "image")  # slot 0's image field: a batch's bytes in the ring
            dst = torch.empty(ring_src.shape, dtype=ring_src.dtype, device="cuda")
            pinned_src = torch.empty(ring_src.shape, dtype=ring_src.dtype, pin_memory=True)
            pinned_src.copy_(ring_src)
            pageable_src = ring_src.clone()
            stream = copier.stream
            rows = {}
            for _ in range(3):  # interleaved, best of three each
                for name, src in (("ring", ring_src), ("pinned", pinned_src), ("pageable", pageable_src)):
                    rows[name] = max(rows.get(name, 0.0), gbps(src, dst, stream, a.reps))
            result = {
                "bytes_per_batch": ring_src.numel(),
                "registered": copier.pinned,
                "gb_per_s": rows,
                "ring_over_pinned": rows["ring"] / rows["pinned"],
                "device": torch.cuda.get_device_name(),
            }
    print(json.dumps(result, indent=1))
    if a.json:
        ratios = {"ring_over_pinned": result["ring_over_pinned"]}
        harness.write_record(a.json, result, args=a, baseline="pinned", ratios=ratios, indent=1)


if __name__ == "__main__":
    main()
