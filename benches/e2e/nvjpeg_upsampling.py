#!/usr/bin/env python3
"""nvJPEG's batched hardware decoder (ringfeed.gpu.nvjpeg) with and without
NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, against Pillow (libjpeg's "fancy" chroma upsampling,
what the server's CPU path matches) and nvImageCodec's hardware decode, on 4:2:0, 4:4:4 and 4:2:2
JPEGs of smooth random content. Needs a GPU with a hardware JPEG decoder.

    python3 benches/e2e/nvjpeg_upsampling.py
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from ringfeed.gpu import nvjpeg as _nvjpeg


def jpeg(seed: int, w: int, h: int, **kw: object) -> bytes:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(base).resize((w, h), Image.BILINEAR).save(out, "JPEG", quality=90, **kw)
    return out.getvalue()


def main() -> None:
    from nvidia import nvimgcodec

    cases = [jpeg(1, 64, 48), jpeg(3, 500, 375), jpeg(2, 333, 250, subsampling=0), jpeg(4, 120, 200, subsampling=1)]
    sizes = [Image.open(io.BytesIO(c)).size for c in cases]
    arena = torch.from_numpy(np.frombuffer(b"".join(cases), dtype=np.uint8).copy()).pin_memory()
    lens = np.array([len(c) for c in cases], dtype=np.uint64)
    offs = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.uint64)
    out_offs = np.concatenate([[0], np.cumsum([w * h * 3 for w, h in sizes[:-1]])]).astype(np.uint64)
    pitch = np.array([w * 3 for w, _ in sizes], dtype=np.uint64)
    ref = nvimgcodec.Decoder(backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)])
    for flags in (0, _nvjpeg.FLAGS_UPSAMPLING_WITH_INTERPOLATION):
        dec = _nvjpeg.HardwareDecoder(torch.device("cuda"), flags=flags)
        buf = torch.zeros(sum(w * h * 3 for w, h in sizes), dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        dec.decode(arena.data_ptr() + offs, lens, buf.data_ptr() + out_offs, pitch, stream)
        torch.cuda.synchronize()
        for k, ((w, h), data) in enumerate(zip(sizes, cases, strict=True)):
            ours = buf[int(out_offs[k]) : int(out_offs[k]) + w * h * 3].view(h, w, 3).cpu().float()
            theirs = torch.as_tensor(ref.decode(data), device="cuda").cpu().float()
            pil = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).float()
            d = (ours - pil).abs()
            print(
                f"flags {flags} case {k} {w}x{h}: vs Pillow mean {d.mean():.2f} max {d.max():.0f}; "
                f"vs nvImageCodec mean {(ours - theirs).abs().mean():.2f}; "
                f"nvImageCodec vs Pillow {(theirs - pil).abs().mean():.2f}"
            )
        dec.close()


if __name__ == "__main__":
    main()
