#!/usr/bin/env python3
"""How far replicated chroma takes hybrid decode's pixels from torchvision's, on the corpus.

    python3 benches/e2e/chroma_fidelity.py --packed DIR [--count 128] [--out DIR]

nvJPEG's hardware decoder replicates chroma by default (fast beside a model) and interpolates it
as libjpeg does with ``RINGFEED_GPU_CHROMA=interpolate`` (Pillow's pixels, slow beside a model:
benches/results/2026-12-01-h200-chroma). The GPU tests' photos have sharp colour edges everywhere;
this measures the corpus instead: the first ``--count`` samples of a packed dataset, decoded by
the batched hardware decoder in each ``RINGFEED_GPU_CHROMA`` mode (``rebuild``: replicated, then
``_chroma_kernel.rebuild`` with each JPEG's chroma block as Pillow reads it) and finished by the
Triton kernel with the same
RandomResizedCrop(224) + flip draws (``nvjpeg_probe.rrc_records``), against torchvision's
``resized_crop`` (bilinear, antialias) of Pillow's decode with the same parameters. Reports the
PSNR over all the images, full size (against Pillow) and finished (against torchvision), and how
block-constant each decode's chroma is (``block_spread``: the rebuild assumes the hardware's
replicated chroma is one value a block, as libjpeg's replication is).
Writes chroma_fidelity.json/.md into --out.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import torch


def block_spread(img: np.ndarray, fh: int, fv: int) -> float:
    """The mean, over the chroma blocks of ``img`` (whole ones, every pixel unclamped), of the
    spread (max - min) of the JFIF chroma projection within the block. 0 for libjpeg's
    replicated chroma (its rounded chroma offsets do not depend on luma), which is what the
    rebuild (``_chroma_kernel``) assumes; interpolated chroma spreads by several levels."""
    h, w = img.shape[0] // fv * fv, img.shape[1] // fh * fh
    x = img[:h, :w].astype(np.float64)
    cb = -0.168736 * x[..., 0] - 0.331264 * x[..., 1] + 0.5 * x[..., 2]
    cr = 0.5 * x[..., 0] - 0.418688 * x[..., 1] - 0.081312 * x[..., 2]
    ok = ((img[:h, :w] > 0) & (img[:h, :w] < 255)).all(-1).reshape(h // fv, fv, w // fh, fh).all((1, 3))
    spread = []
    for c in (cb, cr):
        b = c.reshape(h // fv, fv, w // fh, fh)
        spread.append((b.max((1, 3)) - b.min((1, 3)))[ok])
    return float(np.mean(np.concatenate(spread))) if ok.any() else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--count", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path())
    a = ap.parse_args()

    from nvjpeg_probe import chroma_block, psnr, rrc_records
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2.functional import resized_crop

    from ringfeed import PackedDataset
    from ringfeed.gpu import chroma_kernel as _chroma_kernel
    from ringfeed.gpu import finish_kernel as _finish_kernel
    from ringfeed.gpu import nvjpeg as _nvjpeg

    dev = torch.device("cuda")
    with PackedDataset(a.packed) as ds:
        datas = [bytes(ds.sample(i).data) for i in range(a.count)]
    pil = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for d in datas]
    # Each JPEG's chroma block (what a 1.4 server says in gpu_job): Pillow's sampling code.
    blocks = [chroma_block(d) or (1, 1) for d in datas]
    h = np.array([p.shape[0] for p in pil], dtype=np.int64)
    w = np.array([p.shape[1] for p in pil], dtype=np.int64)
    arena = torch.from_numpy(np.frombuffer(b"".join(datas), dtype=np.uint8).copy()).pin_memory()
    lens = np.array([len(d) for d in datas], dtype=np.uint64)
    offs = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.uint64)
    size = w * h * 3
    out_offs = np.concatenate([[0], np.cumsum(size[:-1])])
    stream = torch.cuda.current_stream().cuda_stream
    recs = None
    got: dict[str, dict] = {}
    full: dict[str, list] = {}
    for name, flags in _nvjpeg.CHROMA.items():
        dec = _nvjpeg.HardwareDecoder(dev, flags=flags)
        buf = torch.empty(int(size.sum()), dtype=torch.uint8, device=dev)
        dec.decode(
            arena.data_ptr() + offs,
            lens,
            (buf.data_ptr() + out_offs).astype(np.uint64),
            (w * 3).astype(np.uint64),
            stream,
        )
        if name == "rebuild":  # the replicated decode, then the client's rebuild (_chroma_kernel)
            rows = [
                [buf.data_ptr() + int(o), int(hh), int(ww), int(ww) * 3, *b]
                for o, hh, ww, b in zip(out_offs, h, w, blocks, strict=True)
            ]
            _chroma_kernel.rebuild(torch.tensor(rows, dtype=torch.int64, device=dev), rows)
        recs = rrc_records(buf.data_ptr() + out_offs, w, h)
        image = torch.empty((a.count, 224, 224, 3), dtype=torch.uint8, device=dev)
        _finish_kernel.finish(torch.tensor(recs, dtype=torch.int64, device=dev), image, "NHWC")
        torch.cuda.synchronize()
        host = buf.cpu().numpy()
        full[name] = [host[o : o + s].reshape(hh, ww, 3) for o, s, hh, ww in zip(out_offs, size, h, w, strict=True)]
        got[name] = {"finished": image.cpu().numpy()}
        dec.close()
    assert recs is not None
    ref = []
    for i, r in enumerate(recs):
        left, top, cw, ch, flags = r[4], r[5], r[6], r[7], r[16]
        t = torch.from_numpy(pil[i].copy()).permute(2, 0, 1)
        y = resized_crop(t, top, left, ch, cw, [224, 224], interpolation=InterpolationMode.BILINEAR, antialias=True)
        if flags & 1:
            y = y.flip(-1)
        ref.append(y.permute(1, 2, 0).numpy())
    ref_a = np.stack(ref)
    rows = []
    for name in got:
        fr = np.concatenate([f.reshape(-1) for f in full[name]])
        pr = np.concatenate([p.reshape(-1) for p in pil])
        fin = got[name]["finished"]
        rows.append(
            {
                "chroma": name,
                "full_psnr_vs_pillow": psnr(fr, pr),
                "full_mean_abs": float(np.abs(fr.astype(int) - pr.astype(int)).mean()),
                "finished_psnr_vs_torchvision": psnr(fin, ref_a),
                "finished_mean_abs": float(np.abs(fin.astype(int) - ref_a.astype(int)).mean()),
                "finished_max_abs": int(np.abs(fin.astype(int) - ref_a.astype(int)).max()),
                # How block-constant the decode's chroma is, over the subsampled images.
                "block_chroma_spread": float(
                    np.nanmean(
                        [block_spread(f, *b) for f, b in zip(full[name], blocks, strict=True) if b != (1, 1)]
                        or [float("nan")]
                    )
                ),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "chroma_fidelity.json").write_text(json.dumps({"count": a.count, "rows": rows}, indent=2) + "\n")
    lines = [
        f"# Replicated against interpolated chroma on {a.count} images of the corpus ({torch.cuda.get_device_name()})",
        "",
        "| chroma | full size: PSNR vs Pillow | mean abs | finished 224: PSNR vs torchvision | mean abs | max abs "
        "| chroma spread in a block |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['chroma']} | {r['full_psnr_vs_pillow']:.2f} dB | {r['full_mean_abs']:.3f} "
            f"| {r['finished_psnr_vs_torchvision']:.2f} dB | {r['finished_mean_abs']:.3f} | {r['finished_max_abs']} "
            f"| {r['block_chroma_spread']:.2f} |"
        )
    (a.out / "chroma_fidelity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
