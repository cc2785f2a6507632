#!/usr/bin/env python3
"""Fidelity of the photometric ops against torchvision v2, for one or more `ringfeed` binaries on the
same pixels and draws: PSNR, the largest difference and the share of bytes equal, per op.

    PYTHONPATH=client-py:client-py/tests python3 benches/results/2026-12-06-dev-vm-cpu-ops/parity.py \
        --bin before=PATH --bin after=PATH [--out parity.json]

The image is the tests' `photo(224, 224, 11)` saved as PNG (exact pixels); each op runs through
`ringfeed ops` with `--count 16` and its drawn parameters are replayed through
`torchvision.transforms.v2.functional`, as client-py/tests/test_ops.py does. Also says whether the
binaries wrote the same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.v2.functional as F  # noqa: N812
from test_pixels import photo

SIZE = 224
COUNT = 16
JITTER = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
KEYS = ["brightness", "contrast", "saturation", "hue"]


def cases() -> list[tuple[str, dict, object]]:
    """(name, op, reference(x, trace entry) -> tensor, or None where only the binaries are compared)."""
    out: list[tuple[str, dict, object]] = []
    for f in (-0.4, -0.1, 0.15, 0.5):
        out.append((f"hue {f}", {"op": "color_jitter", "hue": [f, f]}, lambda x, d, f=f: F.adjust_hue(x, f)))
    for name in ("brightness", "contrast", "saturation"):
        for f in (0.6, 1.4):
            fn = getattr(F, f"adjust_{name}")
            out.append((f"{name} {f}", {"op": "color_jitter", name: [f, f]}, lambda x, d, f=f, fn=fn: fn(x, f)))

    def jitter(x: torch.Tensor, d: dict) -> torch.Tensor:
        for i in d["order"]:
            x = JITTER[i](x, d[KEYS[i]])
        return x

    rng = {"brightness": [0.6, 1.4], "contrast": [0.6, 1.4], "saturation": [0.6, 1.4], "hue": [-0.1, 0.1]}
    out.append(("color_jitter(0.4, 0.4, 0.4, 0.1)", {"op": "color_jitter", **rng}, jitter))
    for k in (9, 23):
        out.append(
            (
                f"gaussian_blur({k}, sigma (0.1, 2.0))",
                {"op": "gaussian_blur", "kernel_size": [k], "sigma": [0.1, 2.0]},
                lambda x, d, k=k: F.gaussian_blur(x, [k, k], [d["sigma"], d["sigma"]]),
            )
        )
    for f in (0.0, 0.5, 2.0):
        out.append(
            (
                f"adjust_sharpness {f}",
                {"op": "adjust_sharpness", "sharpness_factor": f, "p": 1.0},
                lambda x, d, f=f: F.adjust_sharpness(x, f),
            )
        )
    # The policies (their warps among them): only whether the binaries agree.
    for op in (
        {"op": "trivial_augment_wide"},
        {"op": "rand_augment", "num_ops": 2, "magnitude": 15},
        {"op": "rand_augment", "num_ops": 2, "magnitude": 15, "interpolation": "bilinear", "fill": [10, 20, 30]},
        {"op": "auto_augment"},
    ):
        out.append((json.dumps(op), op, None))
    return out


def run(binary: str, png: Path, op: dict, out: Path) -> tuple[np.ndarray, list[dict]]:
    pipeline = {"views": [{"name": "image", "ops": [{"op": "center_crop", "size": [SIZE, SIZE]}, op]}]}
    r = subprocess.run(
        [binary, "ops", str(png), "--pipeline", json.dumps(pipeline), "--count", str(COUNT), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    entries = [next((e for e in line["trace"] if e["op"] == op["op"]), {}) for line in lines]
    return np.fromfile(out, dtype=np.uint8).reshape(COUNT, SIZE, SIZE, 3), entries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH of a ringfeed binary")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    bins = dict(b.split("=", 1) for b in args.bin)
    tmp = Path(tempfile.mkdtemp())
    png = tmp / "photo.png"
    arr = np.asarray(photo(SIZE, SIZE, 11))
    photo(SIZE, SIZE, 11).save(png)
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()
    rows = []
    for name, op, ref in cases():
        row: dict = {"op": name}
        got = {}
        for b, path in bins.items():
            imgs, entries = run(path, png, op, tmp / f"{b}.bin")
            got[b] = imgs
            if ref is None:
                continue
            diffs = []
            for img, d in zip(imgs, entries, strict=True):
                want = ref(x, d).permute(1, 2, 0).numpy().astype(np.int32)
                diffs.append(img.astype(np.int32) - want)
            dd = np.stack(diffs)
            mse = float((dd.astype(np.float64) ** 2).mean())
            row[b] = {
                # null: every byte equal (infinite PSNR).
                "psnr_db": None if mse == 0 else round(10 * math.log10(255.0**2 / mse), 2),
                "max_abs_diff": int(np.abs(dd).max()),
                "equal_bytes": round(float((dd == 0).mean()), 6),
            }
        names = list(got)
        row["binaries_agree"] = all(np.array_equal(got[names[0]], got[n]) for n in names[1:])
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps({"size": SIZE, "count": COUNT, "binaries": bins, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
