#!/usr/bin/env python3
"""What the client's GPU work costs the GPU by itself: nvJPEG's batched hardware decode per output
format and the finishing kernel, each alone on an idle GPU.

    python3 benches/e2e/nvjpeg_probe.py --packed DIR [--count 192] [--kernels-only] [--nv12]
        [--compare MODULE] [--out DIR]

A trace of the training loop (benches/results/2026-12-01-h200-nvjpeg, trace-nvjpeg.md) shows the
client's kernels beside the model's, where each lasts as long as the model lets it: it cannot
say what each costs alone. This decodes the first `--count` samples of a packed dataset (the
standard corpus) with ``ringfeed.gpu.nvjpeg`` in one call a batch, for interleaved RGB (what the
Finisher asks for) and planar YCbCr, each with and without interpolated chroma upsampling, and
reports per batch: the wall time (the GPU synchronised), and under ``torch.profiler`` each GPU
kernel's and copy's time by name. For the planar output it also checks the planes: converted to
RGB on the host as libjpeg does (fancy upsampling, its fixed-point colour conversion,
``_yuv_reference``), they should equal Pillow's decode of the same files. Then the Triton finishing
kernel alone over the decoded batch (RandomResizedCrop(224) parameters drawn as torchvision draws
them, bilinear antialias, random flips): its time per batch from CUDA events, at its default
launch shape and at others (tile rows and columns, the source pieces, warps), and with
``--compare`` another kernel module's time and how far its pixels are from the default's.
``--kernels-only`` decodes one way only (the kernel's input); ``--nv12`` adds an NV12 row. (Until
2026-12-02 an ``--ex`` flag also timed ``nvjpegDecodeBatchedEx``: the hardware's downscale and a
centre region saved nothing, benches/results/2026-12-02-h200-kinds, and ``ringfeed.gpu.nvjpeg`` no
longer offers them.) Writes nvjpeg_probe.json/.md into --out.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

#: PIL's JpegImagePlugin.get_sampling codes -> chroma (horizontal, vertical) factors.
SAMPLING = {0: (1, 1), 1: (2, 1), 2: (2, 2)}


def chroma_block(data: bytes) -> tuple[int, int] | None:
    """A JPEG's chroma factors ``(fh, fv)`` as Pillow reads its header (``(1, 1)`` for 4:4:4 and
    samplings Pillow does not name), ``None`` for a grey one."""
    from PIL import Image, JpegImagePlugin

    with Image.open(io.BytesIO(data)) as im:
        if im.mode == "L":
            return None
        return SAMPLING.get(JpegImagePlugin.get_sampling(im), (1, 1))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of ``a`` against ``b`` (8-bit values), in dB."""
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 10 * math.log10(255**2 / max(mse, 1e-12))


def decodes(y: np.ndarray, cb: np.ndarray, cr: np.ndarray, fh: int, fv: int) -> tuple[np.ndarray, np.ndarray]:
    """The RGB decodes of luma ``y`` and chroma planes ``cb``, ``cr`` subsampled by ``(fh, fv)``,
    with libjpeg's arithmetic: ``(replicated chroma, interpolated chroma)``."""
    h, w = y.shape

    def rep(c: np.ndarray) -> np.ndarray:
        return np.repeat(np.repeat(c, fv, 0), fh, 1)[:h, :w]

    replicated = ycc_to_rgb(y, rep(cb), rep(cr))
    return replicated, ycc_to_rgb(y, fancy_up(cb, fh, fv, w, h), fancy_up(cr, fh, fv, w, h))


def fancy_up(c: np.ndarray, fh: int, fv: int, w: int, h: int) -> np.ndarray:
    """libjpeg's "fancy" chroma upsampling (jdsample.c: h2v1, h1v2, h2v2) of plane ``c`` to
    ``h x w``: a triangle filter, 3/4 of the nearer sample and 1/4 of the farther, edges
    replicated, rounded with libjpeg's alternating biases."""
    c = c.astype(np.int32)
    if fv == 2:
        up = np.vstack([c[:1], c[:-1]])  # the row above (replicated at the top)
        dn = np.vstack([c[1:], c[-1:]])
        near_far = np.empty((2 * c.shape[0], c.shape[1]), dtype=np.int32)
        near_far[0::2] = 3 * c + up
        near_far[1::2] = 3 * c + dn
        c = near_far  # column sums, scaled by 4
        scale = 4
    else:
        scale = 1
    if fh == 2:
        lf = np.hstack([c[:, :1], c[:, :-1]])
        rt = np.hstack([c[:, 1:], c[:, -1:]])
        out = np.empty((c.shape[0], 2 * c.shape[1]), dtype=np.int32)
        if scale == 4:
            out[:, 0::2] = (3 * c + lf + 8) >> 4
            out[:, 1::2] = (3 * c + rt + 7) >> 4
        else:
            out[:, 0::2] = (3 * c + lf + 1) >> 2
            out[:, 1::2] = (3 * c + rt + 2) >> 2
        c = out
    elif scale == 4:  # h1v2: libjpeg-turbo's biases 1 and 2 on the upper and lower row
        out = np.empty_like(c)
        out[0::2] = (c[0::2] + 1) >> 2
        out[1::2] = (c[1::2] + 2) >> 2
        c = out
    return c[:h, :w]


def ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """libjpeg's jdcolor.c YCbCr -> RGB: 16-bit fixed point, rounded, clamped."""

    def fix(x: float) -> int:
        return int(x * 65536 + 0.5)

    y = y.astype(np.int64)
    b_ = cb.astype(np.int64) - 128
    r_ = cr.astype(np.int64) - 128
    half = 1 << 15
    r = y + ((fix(1.40200) * r_ + half) >> 16)
    b = y + ((fix(1.77200) * b_ + half) >> 16)
    g = y + ((-fix(0.34414) * b_ - fix(0.71414) * r_ + half) >> 16)
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


def rrc_records(addr, w, h, seed: int = 0) -> list[list[int]]:
    """The finishing kernel's table (``_finish_kernel``'s columns) for images of sizes ``w`` x
    ``h`` at device addresses ``addr`` (interleaved RGB rows of ``3 w`` bytes): a
    RandomResizedCrop(224) drawn as torchvision draws it, bilinear with antialias, a random flip;
    image ``i`` to batch row ``i``."""
    rnd = random.Random(seed)
    recs = []
    for i in range(len(w)):
        wi, hi = int(w[i]), int(h[i])
        area = wi * hi
        for _ in range(10):  # torchvision's RandomResizedCrop draw
            ta = area * rnd.uniform(0.08, 1.0)
            ar = math.exp(rnd.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw_, ch_ = round(math.sqrt(ta * ar)), round(math.sqrt(ta / ar))
            if 0 < cw_ <= wi and 0 < ch_ <= hi:
                break
        else:
            cw_, ch_ = min(wi, hi), min(wi, hi)
        left, top = rnd.randint(0, wi - cw_), rnd.randint(0, hi - ch_)
        flags = 1 * rnd.randint(0, 1) | (1 << 2) | 16
        place = [int(addr[i]), wi * 3, 3, 1]
        recs.append([*place, left, top, cw_, ch_, 224, 224, 0, 0, 0, 0, 224, 224, flags, 0, i])
    return recs


def kernel_times(prof) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if t and e.device_type is not None and "cuda" in str(e.device_type).lower():
            rows.append({"name": e.key[:90], "calls": e.count, "us": t})
    rows.sort(key=lambda r: -r["us"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--count", type=int, default=192)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument(
        "--compare",
        default="",
        help="a module beside this script with another finishing kernel (same finish()) to time in the same run",
    )
    ap.add_argument(
        "--kernels-only",
        action="store_true",
        help="one decode (the kernels' input), then the finishing kernel's shapes: no decode variants",
    )
    ap.add_argument("--nv12", action="store_true", help="also NV12 output (the batch's 4:2:0 images)")
    ap.add_argument("--out", type=Path, default=Path())
    a = ap.parse_args()

    from PIL import Image

    from ringfeed import PackedDataset
    from ringfeed.gpu import finish_kernel as _finish_kernel
    from ringfeed.gpu import nvjpeg as _nvjpeg

    dev = torch.device("cuda")
    with PackedDataset(a.packed) as ds:
        datas = [bytes(ds.sample(i).data) for i in range(a.count)]
    info = []
    for d in datas:
        with Image.open(io.BytesIO(d)) as im:
            info.append((im.width, im.height, chroma_block(d)))
    modes = sorted({str(b) for _, _, b in info})
    print(f"{len(datas)} JPEGs, chroma blocks {modes}", flush=True)
    arena = np.frombuffer(b"".join(datas), dtype=np.uint8)
    pinned = torch.from_numpy(arena.copy()).pin_memory()
    lens = np.array([len(d) for d in datas], dtype=np.uint64)
    offs = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.uint64)
    ptrs = pinned.data_ptr() + offs
    w = np.array([i[0] for i in info], dtype=np.int64)
    h = np.array([i[1] for i in info], dtype=np.int64)
    fac = [i[2] or (1, 1) for i in info]
    grey = np.array([i[2] is None for i in info])
    stream = torch.cuda.Stream()
    results: dict = {"count": len(datas), "chroma_blocks": modes, "decode": [], "finish": {}}

    def layout(kind: str):
        """Plane addresses (relative), pitches and the buffer size for `kind`."""
        if kind == "rgbi":
            size = (w * h * 3 + 255) // 256 * 256
            off = np.concatenate([[0], np.cumsum(size[:-1])])
            return off[:, None], (w * 3)[:, None], int(size.sum())
        cw = np.array([-(-wi // f[0]) for wi, f in zip(w, fac, strict=True)])
        ch = np.array([-(-hi // f[1]) for hi, f in zip(h, fac, strict=True)])
        cw = np.where(grey, 0, cw)
        ch = np.where(grey, 0, ch)
        ysz = (w * h + 255) // 256 * 256
        csz = (cw * ch + 255) // 256 * 256
        size = ysz + 2 * csz
        off = np.concatenate([[0], np.cumsum(size[:-1])])
        planes = np.stack([off, off + ysz, off + ysz + csz], 1)
        pitches = np.stack([w, np.maximum(cw, 1), np.maximum(cw, 1)], 1)
        return planes, pitches, int(size.sum())

    def measure(once) -> dict:
        """Wall ms per batch of `once` (synchronised each time) and its GPU work (profiler)."""
        for _ in range(3):
            once()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(a.batches):
            once()
            torch.cuda.synchronize()
        row = {"ms_per_batch": (time.perf_counter() - t) / a.batches * 1e3}
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                once()
            torch.cuda.synchronize()
        row["gpu"] = [{**r, "us": r["us"] / 3, "calls": r["calls"] / 3} for r in kernel_times(prof)]
        return row

    rgb_buf = None
    for kind in ("rgbi",) if a.kernels_only else ("rgbi", "yuv"):
        for interp in (True,) if a.kernels_only else (True, False):
            flags = _nvjpeg.FLAGS_UPSAMPLING_WITH_INTERPOLATION if interp else 0
            out_fmt = _nvjpeg.OUTPUT_RGBI if kind == "rgbi" else _nvjpeg.OUTPUT_YUV
            name = f"{kind}{'' if interp else ', replicated chroma'}"
            row: dict = {"variant": name}
            try:
                dec = _nvjpeg.HardwareDecoder(dev, flags=flags)
                planes, pitches, total = layout(kind)
                buf = torch.empty(total, dtype=torch.uint8, device=dev)
                addr = (buf.data_ptr() + planes).astype(np.uint64)

                def once(dec=dec, addr=addr, pitches=pitches, out_fmt=out_fmt):
                    dec.decode(ptrs, lens, addr, pitches.astype(np.uint64), stream.cuda_stream, output=out_fmt)

                row |= measure(once)
                if kind == "yuv" and interp:
                    host = buf.cpu().numpy()
                    diffs = []
                    for i in range(min(24, len(datas))):
                        p, q = planes[i], pitches[i]
                        yp = host[p[0] : p[0] + w[i] * h[i]].reshape(h[i], w[i])
                        with Image.open(io.BytesIO(datas[i])) as im:
                            ref = np.asarray(im.convert("RGB"))
                        if grey[i]:
                            got = np.repeat(yp[:, :, None], 3, 2)
                        else:
                            cw_, ch_ = q[1], -(-h[i] // fac[i][1])
                            cb = host[p[1] : p[1] + cw_ * ch_].reshape(ch_, cw_)
                            cr = host[p[2] : p[2] + cw_ * ch_].reshape(ch_, cw_)
                            got = ycc_to_rgb(yp, fancy_up(cb, *fac[i], w[i], h[i]), fancy_up(cr, *fac[i], w[i], h[i]))
                        d = np.abs(got.astype(np.int32) - ref.astype(np.int32))
                        diffs.append((float(d.mean()), int(d.max())))
                    row["planes_vs_pillow"] = {
                        "images": len(diffs),
                        "mean": max(m for m, _ in diffs),
                        "max": max(x for _, x in diffs),
                    }
                if kind == "rgbi" and interp:
                    rgb_buf = (buf, planes[:, 0])
                dec.close()
            except Exception as e:  # one variant's failure is a row
                row["error"] = f"{type(e).__name__}: {e}"
            results["decode"].append(row)
            print(json.dumps(row)[:1500], flush=True)

    if a.nv12:
        # NV12 (Y, then Cb and Cr interleaved at half size) of the batch's 4:2:0 images (the only
        # sampling NV12 holds without resampling chroma): whether the engine writes it without a
        # conversion kernel (a kernel reading it could then interpolate chroma itself). On the
        # H200 with nvJPEG 13.0.2 the batched hardware decoder refuses it (status 6,
        # benches/results/2026-12-02-h200-kinds).
        dec = _nvjpeg.HardwareDecoder(dev, flags=0)
        sel = np.array([i for i, f in enumerate(fac) if f == (2, 2) and not grey[i]], dtype=np.int64)
        row = {"variant": f"nv12 ({len(sel)} 4:2:0 images)"}
        try:
            sw, sh = w[sel], h[sel]
            cw2, ch2 = -(-sw // 2), -(-sh // 2)
            yb = (sw * sh + 255) // 256 * 256
            uvb = (2 * cw2 * ch2 + 255) // 256 * 256
            off = np.concatenate([[0], np.cumsum((yb + uvb)[:-1])]).astype(np.int64)
            buf = torch.empty(int((yb + uvb).sum()), dtype=torch.uint8, device=dev)
            planes = np.stack([off, off + yb], axis=1)
            pitches = np.stack([sw, 2 * cw2], axis=1).astype(np.uint64)
            sptrs, slens = ptrs[sel], lens[sel]

            def nv12(buf=buf, planes=planes, pitches=pitches, sptrs=sptrs, slens=slens):
                addr = (buf.data_ptr() + planes).astype(np.uint64)
                dec.decode(sptrs, slens, addr, pitches, stream.cuda_stream, output=_nvjpeg.OUTPUT_NV12)

            row |= measure(nv12)
        except Exception as e:  # one variant's failure is a row
            row["error"] = f"{type(e).__name__}: {e}"
        results["decode"].append(row)
        print(json.dumps(row)[:1500], flush=True)
        dec.close()

    if rgb_buf is not None:
        buf, off = rgb_buf
        table = torch.tensor(rrc_records(buf.data_ptr() + off, w, h), dtype=torch.int64, device=dev)
        image = torch.empty((len(datas), 224, 224, 3), dtype=torch.uint8, device=dev)
        _finish_kernel.warm(dev, "NHWC", (224, 224))
        fk = _finish_kernel
        shapes = [(fk.TY, fk.TX, fk.CHUNK, fk.WARPS)]
        shapes += [
            s
            for s in [
                (32, 32, 32, 4),
                (32, 32, 32, 2),
                (16, 16, 16, 1),
                (16, 16, 16, 4),
                (16, 32, 16, 2),
                (32, 16, 16, 2),
                (16, 16, 32, 2),
                (32, 32, 16, 2),
                (16, 64, 16, 4),
                (64, 16, 16, 4),
            ]
            if s != shapes[0]
        ]
        timed = []
        for ty, tx, chunk, warps in shapes:
            kw = {"ty": ty, "tx": tx, "chunk": chunk, "warps": warps}
            try:
                for _ in range(3):
                    _finish_kernel.finish(table, image, "NHWC", **kw)
            except Exception as e:  # a shape that does not compile is a row
                timed.append({**kw, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                continue
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
            for _ in range(20):
                _finish_kernel.finish(table, image, "NHWC", **kw)
            ev[1].record()
            torch.cuda.synchronize()
            timed.append({**kw, "ms_per_batch": ev[0].elapsed_time(ev[1]) / 20})
        if a.compare:
            import importlib

            other = importlib.import_module(a.compare)
            other.warm(dev, "NHWC", (224, 224))
            # The same batch through both kernels: how far apart their pixels are.
            _finish_kernel.finish(table, image, "NHWC")
            mine = image.clone()
            other.finish(table, image, "NHWC")
            diff = (mine.int() - image.int()).abs()
            agree = {
                "max": int(diff.max()),
                "mean": float(diff.float().mean()),
                "psnr": psnr(mine.cpu().numpy(), image.cpu().numpy()),
            }
            for _ in range(3):
                other.finish(table, image, "NHWC")
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
            for _ in range(20):
                other.finish(table, image, "NHWC")
            ev[1].record()
            torch.cuda.synchronize()
            results["finish_compare"] = {
                "module": a.compare,
                "ms_per_batch": ev[0].elapsed_time(ev[1]) / 20,
                "diff": agree,
            }
            print(json.dumps(results["finish_compare"]), flush=True)
        results["finish"] = {"kernel": "_finish_kernel (RGB in)", "ms_per_batch": timed[0]["ms_per_batch"]}
        results["finish_shapes"] = timed
        print(json.dumps(results["finish_shapes"]), flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "nvjpeg_probe.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"# The client's GPU work alone: {len(datas)} images of the corpus a batch ({torch.cuda.get_device_name()})",
        "",
        "| decode variant | ms per batch (wall) | GPU work per batch (profiler) |",
        "|---|---:|---|",
    ]
    for r in results["decode"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'][:100]} | |")
            continue
        g = "; ".join(f"`{x['name'][:48]}` {x['calls']:.0f}x {x['us']:.0f} us" for x in r["gpu"][:5])
        lines.append(f"| {r['variant']} | {r['ms_per_batch']:.2f} | {g} |")
    for r in results["decode"]:
        if "planes_vs_pillow" in r:
            p = r["planes_vs_pillow"]
            lines.append(
                f"\nPlanar output converted as libjpeg does, against Pillow ({p['images']} images): "
                f"mean |diff| at most {p['mean']:.3f}, max {p['max']}."
            )
    if results["finish"]:
        lines.append(f"\nFinishing kernel alone: {results['finish']['ms_per_batch']:.3f} ms per batch (default shape).")
        if "finish_compare" in results:
            c = results["finish_compare"]
            d = c["diff"]
            lines.append(
                f"`{c['module']}` (--compare) alone: {c['ms_per_batch']:.3f} ms per batch; its pixels against "
                f"the default kernel's: max |diff| {d['max']}, mean {d['mean']:.4f}, PSNR {d['psnr']:.1f} dB."
            )
        lines += ["", "| tile rows | tile columns | chunk | warps | ms per batch |", "|---:|---:|---:|---:|---:|"]
        lines += [
            f"| {r['ty']} | {r['tx']} | {r['chunk']} | {r['warps']} | "
            + (f"{r['ms_per_batch']:.3f} |" if "ms_per_batch" in r else f"{r['error'][:80]} |")
            for r in results["finish_shapes"]
        ]
    (a.out / "nvjpeg_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
