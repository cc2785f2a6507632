#!/usr/bin/env python3
"""What slows the training thread's kernel launches beside hybrid decode.

    python3 benches/e2e/launch_probe.py --packed DIR [--count 192] [--seconds 2] [--out DIR]

Under the profiler, with nvJPEG's decode threads beside it, ResNet-18's training thread took
28 µs a `cudaLaunchKernel` instead of 10.5, while the model's kernels took no longer
(benches/results/2026-12-02-h200-kinds, trace/). Here the "training thread" is a loop of tiny
kernel launches, timed on the host, run two ways: from C (`launch_loop` in launch_probe.cu,
called through ctypes without the GIL: the driver's cost alone) and from Python (`x.add_(1)`,
PyTorch's launch path with the GIL). Beside it, one "decode thread" at a time:

- none;
- copy, record, kernel, record+wait, per-image: one kind of CUDA call in a C loop without the
  GIL (`hammer`: a 4 KiB pinned copy, an event record, a tiny kernel, a record and its wait, and
  the four of them as nvJPEG's hardware decode makes them per image);
- nvjpeg: nvJPEG's batched hardware decode of `--count` corpus images, one call after another
  (ctypes, without the GIL during the call), as a decode thread does;
- python: pure Python (the GIL), for scale.

For each: the launch loop's host ns per launch from C and from Python (medians of several
rounds), and the second thread's loops per second (its C loop's iterations; images for nvjpeg;
2 ms bursts for python). The C source is compiled here
with nvcc (sm_90). Writes launch_probe.json/.md into --out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

KINDS = {"copy": 1, "record": 2, "kernel": 3, "record+wait": 4, "per-image": 5}


def build() -> ctypes.CDLL:
    """launch_probe.cu compiled into a shared library (nvcc, sm_90), loaded."""
    src = Path(__file__).with_suffix(".cu")
    out = Path(tempfile.mkdtemp(prefix="launch-probe-")) / "liblaunch_probe.so"
    cmd = ["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-o", str(out), str(src)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(out))
    vp = ctypes.c_void_p
    lib.launch_loop.argtypes = [ctypes.c_int, vp, vp, ctypes.POINTER(ctypes.c_double)]
    lib.launch_loop.restype = ctypes.c_int
    lib.hammer.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), vp, vp, vp, vp]
    lib.hammer.restype = ctypes.c_longlong
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packed", type=Path, required=True, help="a packed corpus, for the nvjpeg row")
    ap.add_argument("--count", type=int, default=192, help="images a batch for the nvjpeg row")
    ap.add_argument("--seconds", type=float, default=2.0, help="per row")
    ap.add_argument("--out", type=Path, default=Path())
    a = ap.parse_args()

    from hybrid_step import NvjpegBatch

    from ringfeed.gpu import nvjpeg as _nvjpeg

    lib = build()
    dev = torch.device("cuda")
    main_stream, side = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(1, device=dev)
    target = torch.zeros(1, device=dev)
    pinned = torch.zeros(4096, dtype=torch.uint8).pin_memory()
    devbuf = torch.empty(4096, dtype=torch.uint8, device=dev)
    batch = NvjpegBatch.from_packed(str(a.packed), a.count)
    dec = _nvjpeg.HardwareDecoder(dev, flags=0)
    dec.warm()

    def c_launches() -> float:
        ns = ctypes.c_double()
        rc = lib.launch_loop(20000, ctypes.c_void_p(main_stream.cuda_stream), ctypes.c_void_p(x.data_ptr()), ns)
        if rc != 0:
            raise RuntimeError(f"launch_loop: CUDA error {rc}")
        return ns.value

    def py_launches() -> float:
        """As `launch_loop`, from Python: 20 rounds of 256 `x.add_(1)`, the stream waited for
        between rounds and the waits left out."""
        spent = 0
        with torch.cuda.stream(main_stream):
            for _ in range(20):
                t0 = time.perf_counter_ns()
                for _ in range(256):
                    x.add_(1.0)
                spent += time.perf_counter_ns() - t0
                main_stream.synchronize()
        return spent / (20 * 256)

    rows = []
    for row in ["none", *KINDS, "nvjpeg", "python", "none"]:
        stop = ctypes.c_int(0)
        stop_py = threading.Event()
        count = [0]

        def second(row: str = row, stop: ctypes.c_int = stop, stop_py: threading.Event = stop_py, count=count) -> None:
            if row in KINDS:
                n = lib.hammer(
                    KINDS[row],
                    ctypes.byref(stop),
                    ctypes.c_void_p(side.cuda_stream),
                    ctypes.c_void_p(target.data_ptr()),
                    ctypes.c_void_p(pinned.data_ptr()),
                    ctypes.c_void_p(devbuf.data_ptr()),
                )
                if n < 0:
                    raise RuntimeError(f"hammer {row}: a CUDA error")
                count[0] = n
            elif row == "nvjpeg":
                while not stop_py.is_set():
                    batch.decode(dec, side)
                    side.synchronize()
                    count[0] += a.count
            elif row == "python":
                while not stop_py.is_set():
                    end = time.perf_counter() + 0.002
                    while time.perf_counter() < end:
                        pass
                    count[0] += 1

        t = threading.Thread(target=second)
        t0 = time.perf_counter()
        t.start()
        time.sleep(0.2)  # the second thread under way
        c_ns, py_ns = [], []
        while time.perf_counter() - t0 < a.seconds:
            c_ns.append(c_launches())
            py_ns.append(py_launches())
        stop.value = 1
        stop_py.set()
        t.join()
        wall = time.perf_counter() - t0
        rows.append(
            {
                "beside": row,
                "c_ns_per_launch": statistics.median(c_ns),
                "py_ns_per_launch": statistics.median(py_ns),
                "rounds": len(c_ns),
                "second_per_s": count[0] / wall,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    dec.close()

    base = rows[0]
    lines = [
        f"# Host time a kernel launch beside other CUDA work in another thread ({torch.cuda.get_device_name()})",
        "",
        f"`{' '.join(sys.argv)}`",
        "",
        "| beside the launches | ns a launch, C | x alone | ns a launch, Python | x alone | other thread's loops/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['beside']} | {r['c_ns_per_launch']:.0f} | {r['c_ns_per_launch'] / base['c_ns_per_launch']:.2f} "
            f"| {r['py_ns_per_launch']:.0f} | {r['py_ns_per_launch'] / base['py_ns_per_launch']:.2f} "
            f"| {r['second_per_s']:,.0f} |"
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "launch_probe.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    (a.out / "launch_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
