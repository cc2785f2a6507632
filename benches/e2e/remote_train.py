#!/usr/bin/env python3
"""ResNet-50 fed from a packed dataset on S3-compatible storage (issue 15's GPU target: >= 97 % of
the ceiling on the second epoch), with the first epoch's share beside it.

    python3 benches/e2e/remote_train.py --images DIR --s3s-fs PATH [--models resnet50]
        [--workers 15] [--steps 150] [--mbps 0] [--bin PATH] [--out DIR]

Starts a real `s3s-fs` on 127.0.0.1 (a carried binary on the GPU machine: `cargo install
s3s-fs@0.14.1 --features binary --locked`), packs DIR straight to `s3://bucket/rf`, and runs
`benches/e2e/gpu_train.py --packed s3://bucket/rf` twice with one `--cache-dir`: first from an
empty cache (the cold epoch: every shard comes from the store while the model trains), then from
the cache the first run filled (what every later epoch reads). `--mbps` above 0 puts the tests'
throttling proxy in front of the server (a remote link of that many MB/s). Each run also has
the ceiling, so each share is against its own run's ceiling. It starts no ringfeed server itself
(gpu_train.py does, through the harness); the binary (--bin, RINGFEED_BIN, PATH or the workspace
build) is resolved once and exported, so both runs and the pack use the same build. Writes
OUT/cold and OUT/warm (gpu_train's gpu.json/gpu.md), OUT/remote_train.json (a `harness` record;
the baseline is each run's ceiling) and OUT/remote_train.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches"))  # harness.py
sys.path.insert(0, str(REPO / "client-py" / "tests"))  # the S3 server wrapper and the proxy

import _s3  # noqa: E402
import harness  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--s3s-fs", default=None, help="the s3s-fs binary (default: on PATH)")
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--workers", type=int, default=15)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--mbps", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=Path())
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    if a.s3s_fs:
        os.environ["PATH"] = f"{Path(a.s3s_fs).resolve().parent}{os.pathsep}{os.environ['PATH']}"
    binary = harness.find_binary(a.bin)
    work = Path(tempfile.mkdtemp(prefix="rfrt-", dir="/tmp"))
    server = _s3.S3Server("s3s-fs")
    proxy = _s3.FaultProxy(server.port, rate=a.mbps * 1e6) if a.mbps > 0 else None
    url = f"s3://{_s3.BUCKET}/rf"
    rows = []
    try:
        subprocess.run(
            [binary, "pack", str(a.images), url, "--progress", "none"], env={**os.environ, **server.env()}, check=True
        )
        env = {**os.environ, **server.env(proxy.url if proxy else None)}
        for phase in ("cold", "warm"):
            cmd = [
                sys.executable, str(REPO / "benches/e2e/gpu_train.py"), "--images", str(a.images), "--packed", url,
                "--models", a.models, "--loaders", "ceiling,ringfeed", "--workers", str(a.workers),
                "--steps", str(a.steps), "--out", str(a.out / phase), f"--serve-arg=--cache-dir={work / 'cache'}",
            ]  # fmt: skip
            subprocess.run(cmd, env=env, check=True)
            runs = json.loads((a.out / phase / "gpu.json").read_text())["runs"]
            for model in a.models.split(","):
                ceiling = next(r["img_per_s"] for r in runs if r["model"] == model and r["loader"] == "ceiling")
                fed = next(r for r in runs if r["model"] == model and r["loader"] == "ringfeed")
                rows.append((phase, model, fed["img_per_s"], fed["img_per_s"] / ceiling, fed["gpu_idle_share"]))
    finally:
        if proxy is not None:
            proxy.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    link = f"a {a.mbps:g} MB/s link (throttling proxy)" if proxy else "loopback, no throttling"
    lines = [
        f"# ResNet fed from s3://{_s3.BUCKET}/rf on a local s3s-fs ({link})",
        "",
        f"`{' '.join(sys.argv)}`",
        "",
        "| cache | model | img/s | share of ceiling | GPU idle |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [f"| {p} | {m} | {v:.0f} | {s * 100:.1f} % | {i * 100:.1f} % |" for p, m, v, s, i in rows]
    lines += ["", "cold: the first run, from an empty cache; warm: the second, from the cache the first filled."]
    a.out.mkdir(parents=True, exist_ok=True)
    cols = ("cache", "model", "img_per_s", "share_of_ceiling", "gpu_idle_share")
    harness.write_record(
        a.out / "remote_train.json",
        {"rows": [dict(zip(cols, row, strict=True)) for row in rows]},
        args=a,
        baseline="ceiling",
        ratios=[{"cache": p, "model": m, "ratio": share} for p, m, _, share, _ in rows],
    )
    (a.out / "remote_train.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
