#!/usr/bin/env python3
"""When does nvJPEG's batched hardware decoder refuse a batch with "allocator failure" (status 5)?

    python3 benches/e2e/nvjpeg_open_probe.py [--batches 60] [--out DIR]

Seen in the GPU tests once the Finisher opened and warmed its decoders at construction (10389e1):
one or two of the batched cases fell back to nvImageCodec with status 5. This decodes batches of
six small JPEGs like the tests' (60-221 x 48-73, 4:2:0, 4:2:2, 4:4:4 and grey mixed) in two
threads, each with a decoder of its own, for each way of opening them: in the main thread or
in the decoding thread, warmed (ringfeed.gpu.nvjpeg.HardwareDecoder.warm) or not. Prints how many
batches each way refused.
"""

from __future__ import annotations

import argparse
import io
import json
import threading
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def jpegs(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = 60 + 7 * (i % 24), 48 + 5 * (i % 6)
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack([x * 255 // w, y * 255 // h, (x * y) % 256], -1) + rng.integers(-20, 21, (h, w, 3))
        im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        if i % 25 == 24:
            im.convert("L").save(buf, "JPEG", quality=90)
        else:
            im.save(buf, "JPEG", quality=90, subsampling=[2, 1, 0][i % 3])
        out.append(buf.getvalue())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path())
    a = ap.parse_args()
    from ringfeed.gpu import nvjpeg as _nvjpeg

    dev = torch.device("cuda")
    data = jpegs(100)
    info = [Image.open(io.BytesIO(d)).size for d in data]
    arena = torch.from_numpy(np.frombuffer(b"".join(data), dtype=np.uint8).copy()).pin_memory()
    offs = np.concatenate([[0], np.cumsum([len(d) for d in data[:-1]])]).astype(np.uint64)
    lens = np.array([len(d) for d in data], dtype=np.uint64)

    def run(dec_of, warm: bool) -> dict:
        refused, errors = [0], []

        def work(t: int) -> None:
            dec = dec_of(t)
            if warm and dec_of is opened_here:
                dec.warm()
            rng = np.random.default_rng(t)
            stream = torch.cuda.Stream()
            for _ in range(a.batches):
                pick = rng.choice(len(data), 6, replace=False)
                w = np.array([info[i][0] for i in pick])
                h = np.array([info[i][1] for i in pick])
                size = (w * h * 3 + 255) // 256 * 256
                with torch.cuda.stream(stream):
                    buf = torch.empty(int(size.sum()), dtype=torch.uint8, device=dev)
                off = np.concatenate([[0], np.cumsum(size[:-1])]).astype(np.uint64)
                try:
                    with torch.cuda.device(dev):
                        dec.decode(
                            arena.data_ptr() + offs[pick],
                            lens[pick],
                            buf.data_ptr() + off,
                            (w * 3).astype(np.uint64),
                            stream.cuda_stream,
                        )
                except _nvjpeg.HardwareRefusedError as e:
                    refused[0] += 1
                    errors.append(str(e))
                stream.synchronize()
            dec.close()

        threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return {"refused": refused[0], "of": 2 * a.batches, "errors": sorted(set(errors))[:3]}

    def opened_here(t: int):
        return _nvjpeg.HardwareDecoder(dev)

    results = {}
    for name, warm, main_open in [
        ("worker thread, not warmed", False, False),
        ("worker thread, warmed", True, False),
        ("main thread, not warmed", False, True),
        ("main thread, warmed", True, True),
        ("worker thread, not warmed (again)", False, False),
    ]:
        if main_open:
            decs = [_nvjpeg.HardwareDecoder(dev) for _ in range(2)]
            if warm:
                for d in decs:
                    d.warm()
            results[name] = run(lambda t, decs=decs: decs[t], False)
        else:
            results[name] = run(opened_here, warm)
        print(name, json.dumps(results[name]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "nvjpeg_open_probe.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
