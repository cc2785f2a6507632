#!/usr/bin/env python3
"""What the chroma rebuild kernels (``ringfeed.gpu.chroma_kernel``) cost by themselves, on an idle GPU.

    PYTHONPATH=client-py python3 benches/e2e/chroma_kernel_probe.py [--count 192] [--size 500x375]
        [--factors 2x2] [--out DIR]

Makes ``--count`` replicated-chroma decodes of ``--size`` (width x height) from known planes with
libjpeg's arithmetic (``nvjpeg_probe.ycc_to_rgb``), as ``tests/test_chroma_kernel.py`` does, in
one device arena (rows 3 x width bytes apart, as the Finisher's decodes), then times
``_chroma_kernel.rebuild`` over the whole batch with CUDA events (its two launches), and checks
the first images against the NumPy reference (``chroma_reconstruct.rebuild``: at most one level
apart) and their PSNR against the interpolated decode before and after. ``--factors``: 2x2
(4:2:0), 2x1 (4:2:2) or 1x2 (4:4:0), or ``mixed`` (the three in turn). Writes
chroma_kernel_probe.json/.md into --out.

On a machine without CUDA it runs on the CPU under ``TRITON_INTERPRET=1`` (set it yourself; use
a small ``--count`` and ``--size``): that checks the script, not the speed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from chroma_reconstruct import rebuild as reference
from nvjpeg_probe import decodes, psnr

from ringfeed.gpu import chroma_kernel as _chroma_kernel


def planes(rng: np.random.Generator, h: int, w: int, fh: int, fv: int) -> tuple[np.ndarray, ...]:
    """Luma and subsampled chroma: smooth ramps plus noise, like photos' colour at this scale."""
    ch, cw = -(-h // fv), -(-w // fh)
    yy, xx = np.mgrid[0:h, 0:w]
    y = 128 + 80 * np.sin(xx / 17.0 + yy / 23.0) + rng.normal(0, 10, (h, w))
    cy, cx = np.mgrid[0:ch, 0:cw]
    cb = 128 + 50 * np.sin(cx / 5.0) * np.cos(cy / 7.0) + rng.normal(0, 6, (ch, cw))
    cr = 128 + 50 * np.cos(cx / 6.0 + cy / 4.0) + rng.normal(0, 6, (ch, cw))
    return tuple(np.clip(np.rint(p), 0, 255).astype(np.int64) for p in (y, cb, cr))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=192)
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--factors", default="2x2", choices=["2x2", "2x1", "1x2", "mixed"])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--check", type=int, default=6, help="images checked against the NumPy reference")
    ap.add_argument("--out", type=Path, default=Path())
    a = ap.parse_args()
    w, h = (int(v) for v in a.size.split("x"))
    kinds = [(2, 2), (2, 1), (1, 2)] if a.factors == "mixed" else [tuple(int(v) for v in a.factors.split("x"))]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rng = np.random.default_rng(0)
    # A few distinct images, repeated through the batch (making 192 on the host takes long).
    distinct = []
    for j in range(min(a.count, max(a.check, 3))):
        fh, fv = kinds[j % len(kinds)]
        y, cb, cr = planes(rng, h, w, fh, fv)
        rep, interp = decodes(y, cb, cr, fh, fv)
        distinct.append((fh, fv, rep, interp))
    pick = [distinct[j % len(distinct)] for j in range(a.count)]
    host = np.stack([p[2] for p in pick])
    arena = torch.from_numpy(host).to(dev)
    size = h * w * 3
    rows = np.array([[arena.data_ptr() + j * size, h, w, 3 * w, p[0], p[1]] for j, p in enumerate(pick)], np.int64)
    table = torch.from_numpy(rows).to(dev)

    _chroma_kernel.rebuild(table, rows)  # compiles; the result is checked below
    out = arena.cpu().numpy()
    checks = []
    for j in range(min(a.check, a.count)):
        fh, fv, rep, interp = pick[j]
        d = np.abs(out[j].astype(int) - reference(rep, fh, fv).astype(int))
        checks.append(
            {
                "factors": [fh, fv],
                "max_abs_vs_reference": int(d.max()),
                "psnr_replicated": psnr(rep, interp),
                "psnr_rebuilt": psnr(out[j], interp),
            }
        )
    # Timing: the kernels' work does not depend on the pixels, so rebuilding the rebuilt images
    # again costs what the first rebuild did.
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(a.iters):
            _chroma_kernel.rebuild(table, rows)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / a.iters
    else:
        t0 = time.perf_counter()
        _chroma_kernel.rebuild(table, rows)
        ms = (time.perf_counter() - t0) * 1e3
    res = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (Triton interpreter)",
        "count": a.count,
        "size": [w, h],
        "factors": a.factors,
        "ms_per_batch": ms,
        "checks": checks,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "chroma_kernel_probe.json").write_text(json.dumps(res, indent=2) + "\n")
    lines = [
        f"# Chroma rebuild kernels: {a.count} images of {w}x{h}, factors {a.factors}, on {res['device']}",
        "",
        f"{ms:.3f} ms per batch (two launches, {f'mean of {a.iters}' if dev.type == 'cuda' else 'one run'})",
        "",
        "| image | factors | max abs vs reference | PSNR vs interpolated: replicated | rebuilt |",
        "|---:|---|---:|---:|---:|",
    ]
    for j, c in enumerate(checks):
        lines.append(
            f"| {j} | {c['factors'][0]}x{c['factors'][1]} | {c['max_abs_vs_reference']} "
            f"| {c['psnr_replicated']:.2f} dB | {c['psnr_rebuilt']:.2f} dB |"
        )
    (a.out / "chroma_kernel_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if any(c["max_abs_vs_reference"] > 1 for c in checks):
        raise SystemExit("the kernels differ from the NumPy reference by more than one level (see the table)")


if __name__ == "__main__":
    main()
