#!/usr/bin/env python3
"""Can interpolated chroma be rebuilt from a replicated-chroma decode? A CPU study for hybrid decode.

    python3 benches/e2e/chroma_reconstruct.py PHOTOS_DIR [--count 60] [--out DIR]

nvJPEG's hardware decoder is fast beside a model only with replicated chroma (each 4:2:0 chroma
sample covers its 2x2 pixels), where Pillow and torchvision interpolate it (libjpeg's "fancy"
upsampling: 3/4 of the nearer sample, 1/4 of the farther, per axis);
benches/results/2026-12-01-h200-chroma has the figures. This asks whether a pass on the GPU could
turn the replicated decode into the interpolated one: from each 2x2 block's pixels, estimate the
block's chroma (the chroma projection of RGB does not depend on luma: the mean over the block's
unclamped pixels), interpolate it as libjpeg does, and add the difference back through the colour
conversion's chroma columns.

It needs no GPU: for each photo (the corpus of ``make_photos.py``) it makes 4:2:0 planes as
libjpeg's encoder does (its fixed-point colour conversion, 2x2 means), then the three RGB images
a decoder could give from them, with libjpeg's own arithmetic (``nvjpeg_probe.fancy_up`` and
``ycc_to_rgb``, which match Pillow exactly on the H200's planar output): replicated, interpolated,
and replicated then rebuilt. Reports the PSNR of the replicated and the rebuilt images against the
interpolated one, at full size and after a 2x antialiased downscale (what the finishing resize
does to a RandomResizedCrop), with the mean and largest differences. Writes
chroma_reconstruct.json/.md into --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from nvjpeg_probe import decodes, psnr
from PIL import Image


def rgb_to_ycc(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """libjpeg's jccolor.c RGB -> YCbCr: 16-bit fixed point, rounded (Cb, Cr offset by 128)."""

    def fix(x: float) -> int:
        return int(x * 65536 + 0.5)

    r, g, b = (rgb[..., k].astype(np.int64) for k in range(3))
    half = 1 << 15
    y = (fix(0.29900) * r + fix(0.58700) * g + fix(0.11400) * b + half) >> 16
    cb = (-fix(0.16874) * r - fix(0.33126) * g + fix(0.5) * b + (128 << 16) + half - 1) >> 16
    cr = (fix(0.5) * r - fix(0.41869) * g - fix(0.08131) * b + (128 << 16) + half - 1) >> 16
    return y, cb, cr


def down2(c: np.ndarray) -> np.ndarray:
    """jcsample.c's h2v2 downsampling: the mean of each 2x2 block (edges replicated), biases 1, 2."""
    h, w = c.shape
    c = np.pad(c, ((0, h % 2), (0, w % 2)), mode="edge")
    s = c[0::2, 0::2] + c[0::2, 1::2] + c[1::2, 0::2] + c[1::2, 1::2]
    bias = np.tile(np.array([1, 2]), s.shape[1] // 2 + 1)[: s.shape[1]]
    return (s + bias[None, :]) >> 2


def rebuild(rep: np.ndarray, fh: int = 2, fv: int = 2) -> np.ndarray:
    """A replicated-chroma decode -> an estimate of the interpolated one (see the docstring).

    ``fh, fv``: the chroma factors, each 1 or 2 ((2, 2) 4:2:0, (2, 1) 4:2:2, (1, 2) 4:4:0; (1, 1)
    gives ``rep`` back). Along an axis of factor 1 nothing is interpolated. This is the reference
    of the GPU kernel ``ringfeed.gpu.chroma_kernel`` (``client-py/tests/test_chroma_kernel.py``)."""
    h, w, _ = rep.shape
    if (fh, fv) == (1, 1):
        return rep.copy()
    x = rep.astype(np.float64)
    # The chroma projection (JFIF): independent of luma, so constant over a block but for rounding
    # and clamping; clamped pixels (a channel at 0 or 255) are left out of the block's mean.
    cb = -0.168736 * x[..., 0] - 0.331264 * x[..., 1] + 0.5 * x[..., 2]
    cr = 0.5 * x[..., 0] - 0.418688 * x[..., 1] - 0.081312 * x[..., 2]
    ok = ((rep > 0) & (rep < 255)).all(-1).astype(np.float64)
    # A partial last block (odd size) is padded with its edge pixels, as libjpeg's downsampling
    # pads: each of its own pixels then counts equally, so its mean is the mean of those.
    eh, ew = (-h) % fv, (-w) % fh
    ph, pw = h + eh, w + ew

    def blocks(v: np.ndarray) -> np.ndarray:
        v = np.pad(v, ((0, eh), (0, ew)), mode="edge")
        return v.reshape(ph // fv, fv, pw // fh, fh).sum((1, 3))

    n = blocks(ok)
    cb_b = np.where(n > 0, blocks(cb * ok) / np.maximum(n, 1), blocks(cb) / (fh * fv))
    cr_b = np.where(n > 0, blocks(cr * ok) / np.maximum(n, 1), blocks(cr) / (fh * fv))

    def interp(c: np.ndarray) -> np.ndarray:
        # libjpeg's triangle filter in float: per subsampled axis 3/4 nearer, 1/4 farther, edges
        # replicated.
        rows = c
        if fv == 2:
            up = np.vstack([c[:1], c[:-1]])
            dn = np.vstack([c[1:], c[-1:]])
            rows = np.empty((2 * c.shape[0], c.shape[1]))
            rows[0::2], rows[1::2] = (3 * c + up) / 4, (3 * c + dn) / 4
        out = rows
        if fh == 2:
            lf = np.hstack([rows[:, :1], rows[:, :-1]])
            rt = np.hstack([rows[:, 1:], rows[:, -1:]])
            out = np.empty((rows.shape[0], 2 * rows.shape[1]))
            out[:, 0::2], out[:, 1::2] = (3 * rows + lf) / 4, (3 * rows + rt) / 4
        return out[:h, :w]

    d_cb = interp(cb_b) - np.repeat(np.repeat(cb_b, fv, 0), fh, 1)[:h, :w]
    d_cr = interp(cr_b) - np.repeat(np.repeat(cr_b, fv, 0), fh, 1)[:h, :w]
    delta = np.stack([1.402 * d_cr, -0.344136 * d_cb - 0.714136 * d_cr, 1.772 * d_cb], -1)
    return np.clip(np.floor(x + delta + 0.5), 0, 255).astype(np.uint8)


def half(img: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    size = (img.shape[0] // 2, img.shape[1] // 2)
    y = torch.nn.functional.interpolate(t, size=size, mode="bilinear", antialias=True, align_corners=False)
    return y[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("photos", type=Path)
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path())
    a = ap.parse_args()
    files = sorted(a.photos.rglob("*.jpg"))[: a.count]
    acc: dict[str, list[np.ndarray]] = {k: [] for k in ("interp", "rep", "rebuilt", "interp2", "rep2", "rebuilt2")}
    for f in files:
        with Image.open(f) as im:
            rgb = np.asarray(im.convert("RGB"))
        y, cb, cr = rgb_to_ycc(rgb)
        cb2, cr2 = down2(cb), down2(cr)
        rep, interp = decodes(y, cb2, cr2, 2, 2)
        rebuilt = rebuild(rep)
        for k, v in (("interp", interp), ("rep", rep), ("rebuilt", rebuilt)):
            acc[k].append(v.reshape(-1))
            acc[k + "2"].append(half(v).reshape(-1))
    cat = {k: np.concatenate(v) for k, v in acc.items()}
    rows = []
    for scale, sfx in (("full size", ""), ("downscaled 2x (antialiased bilinear)", "2")):
        ref = cat["interp" + sfx].astype(np.int32)
        for name in ("rep", "rebuilt"):
            d = np.abs(cat[name + sfx].astype(np.int32) - ref)
            rows.append(
                {
                    "scale": scale,
                    "decode": {"rep": "replicated", "rebuilt": "replicated, then rebuilt"}[name],
                    "psnr_vs_interpolated": psnr(cat[name + sfx], cat["interp" + sfx]),
                    "mean_abs": float(d.mean()),
                    "max_abs": int(d.max()),
                    "share_off_by_more_than_1": float((d > 1).mean()),
                }
            )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "chroma_reconstruct.json").write_text(json.dumps({"photos": len(files), "rows": rows}, indent=2) + "\n")
    lines = [
        f"# Rebuilding interpolated chroma from a replicated 4:2:0 decode: {len(files)} photos of {a.photos}",
        "",
        "| scale | decode | PSNR vs interpolated | mean abs | max abs | values off by more than 1 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scale']} | {r['decode']} | {r['psnr_vs_interpolated']:.2f} dB | {r['mean_abs']:.3f} "
            f"| {r['max_abs']} | {r['share_off_by_more_than_1'] * 100:.2f} % |"
        )
    (a.out / "chroma_reconstruct.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
