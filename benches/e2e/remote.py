#!/usr/bin/env python3
"""Remote datasets over a limited link: first- and second-epoch img/s and bytes downloaded per
epoch, for ringfeed and (when they import) MosaicML Streaming and LitData, reading the same
images from the same local S3 server.

    python3 benches/e2e/remote.py --images DIR --out OUT [--mbps 40] [--threads 2]
        [--batch-size 64] [--size 224] [--shard-size 8MiB] [--cache-bytes SIZE]
        [--s3s-fs PATH] [--only ringfeed,streaming,litdata] [--order-block N] [--bin PATH]

What runs, in one process, in this order:

1. `s3s-fs` (PATH, or `--s3s-fs`: a carried binary) on 127.0.0.1 with a bucket, and in front of
   it `client-py/tests/_s3.FaultProxy` limiting every response to `--mbps` MB/s over all
   connections (a token bucket): the "remote link". Uploads go straight to the server.
2. ringfeed: `ringfeed pack --images s3://bucket/rf`; a private `ringfeed serve --threads N`
   (`harness.Server`) with a fresh `--cache-dir` (`--cache-bytes`, default: the whole dataset
   fits) whose endpoint is the proxy; `ringfeed.Loader(s3://...)` with RandomResizedCrop(size) +
   flip, two epochs. The same dataset packed locally gives the no-network rate beside it.
3. MosaicML Streaming (`streaming`): `MDSWriter` (JPEG bytes + label) locally, uploaded with
   boto3; `StreamingDataset(remote=s3://..., local=fresh dir)` (`S3_ENDPOINT_URL` = the proxy)
   in a DataLoader with N workers decoding with PIL + torchvision's RandomResizedCrop + flip.
4. LitData (`litdata`): `litdata.optimize` to a local dir, uploaded with boto3;
   `StreamingDataset("s3://...", storage_options={"endpoint_url": proxy})` in its
   `StreamingDataLoader` with N workers, the same decode and transform.

For each: img/s of epoch 1 (cold: everything comes over the link) and epoch 2 (from each one's
cache), and the bytes that crossed the proxy in each epoch. Nothing is warmed up: the cold first
epoch is the figure. `OUT/remote.json` (a `harness` record; the baseline is ringfeed on the local
copy) and `OUT/remote.md` (with the command line).

On the GPU machine (no network; carry the `s3s-fs` binary, built here with `cargo install
s3s-fs@0.14.1 --features binary --locked`, and the wheels of whatever is compared):

    python3 benches/e2e/remote.py --images /data/photos --out /tmp/remote --s3s-fs ./s3s-fs \\
        --mbps 400 --threads 15 --batch-size 256 --only ringfeed
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches"))  # harness.py
sys.path.insert(0, str(REPO / "client-py" / "tests"))  # the proxy and the server wrapper

sys.path.insert(0, str(Path(__file__).resolve().parent))  # what the DataLoader workers import
import _remote_decode  # noqa: E402
import _s3  # noqa: E402
import harness  # noqa: E402

import ringfeed  # noqa: E402


def list_images(root: Path) -> list[tuple[Path, int]]:
    """(path, label) in ImageFolder order: classes are the sorted sub-directories."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    out = []
    for label, c in enumerate(classes):
        out += [(p, label) for p in sorted((root / c).rglob("*")) if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
    return out


def run(cmd: list[str], env: dict[str, str] | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r.stdout


def upload_dir(local: Path, endpoint: str, bucket: str, prefix: str) -> None:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=_s3.KEY,
        aws_secret_access_key=_s3.SECRET,
        region_name="us-east-1",
    )
    for p in sorted(local.rglob("*")):
        if p.is_file():
            s3.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local)}")


class Link:
    """Bytes across the proxy between two marks."""

    def __init__(self, proxy: _s3.FaultProxy) -> None:
        self.proxy = proxy
        self.mark = proxy.stats.bytes

    def take(self) -> int:
        now = self.proxy.stats.bytes
        n, self.mark = now - self.mark, now
        return n


def bench_ringfeed(a: argparse.Namespace, server: _s3.S3Server, proxy: _s3.FaultProxy, work: Path) -> dict[str, Any]:
    binary = harness.find_binary(a.bin)
    local = work / "rf-local"
    run([binary, "pack", str(a.images), str(local), "--progress", "none", "--shard-size", a.shard_size])
    url = f"s3://{_s3.BUCKET}/rf"
    run(
        [binary, "pack", str(a.images), url, "--progress", "none", "--shard-size", a.shard_size],
        server.env(),
    )
    dataset_bytes = sum(p.stat().st_size for p in local.iterdir())
    cache_bytes = a.cache_bytes or str(dataset_bytes * 2)
    flags = ["--cache-dir", str(work / "cache"), "--cache-bytes", cache_bytes]
    # The server's S3 endpoint is the proxy: every byte it downloads crosses the limited link.
    with harness.Server(a.threads, flags, binary=binary, env=server.env(proxy.url), log=work / "serve.log") as rf:
        sock = rf.sock
        transform = ringfeed.RandomResizedCrop(a.size) + ringfeed.Flip()
        out: dict[str, Any] = {"dataset_bytes": dataset_bytes, "cache_bytes": int(cache_bytes)}
        link = Link(proxy)
        block = {} if a.order_block is None else {"order": ringfeed.ShardBlocks(block=a.order_block)}
        common: dict[str, Any] = {
            "transform": transform,
            "server": ringfeed.Server(socket=sock, timeout=600),
            "shuffle": True,
            "drop_last": True,
        }
        with ringfeed.Loader(url, a.batch_size, **common, **block) as ld:
            for e in (1, 2):
                ld.set_epoch(e - 1)
                n, t0 = 0, time.perf_counter()
                for _images, labels in ld:
                    n += len(labels)
                dt = time.perf_counter() - t0
                out[f"epoch{e}_img_s"] = n / dt
                out[f"epoch{e}_bytes"] = link.take()
                out[f"epoch{e}_images"] = n
                out[f"epoch{e}_s"] = dt
                # The server's remote counters (cumulative) and the loader's own wait, after the epoch: what
                # explains a cold epoch below the link's rate (readers waiting for downloads, `wait_s`).
                st = ld.stats()
                out[f"epoch{e}_remote"] = st["server"].get("remote")
                out[f"epoch{e}_loader_wait_s"] = st["wait_s"]
            out["remote"] = out["epoch2_remote"]
            out["order"] = ld.order
        with ringfeed.Loader(local, a.batch_size, **common) as ld:
            ld.set_epoch(1)
            n, t0 = 0, time.perf_counter()
            for _images, labels in ld:
                n += len(labels)
            out["local_img_s"] = n / (time.perf_counter() - t0)
        return out


def epochs_of(loader: Any, proxy: _s3.FaultProxy, set_epoch: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    link = Link(proxy)
    for e in (1, 2):
        if set_epoch is not None:
            set_epoch(e - 1)
        n, t0 = 0, time.perf_counter()
        for images, _labels in loader:
            n += len(images)
        out[f"epoch{e}_img_s"] = n / (time.perf_counter() - t0)
        out[f"epoch{e}_bytes"] = link.take()
        out[f"epoch{e}_images"] = n
    return out


def bench_streaming(a: argparse.Namespace, server: _s3.S3Server, proxy: _s3.FaultProxy, work: Path) -> dict[str, Any]:
    import torch
    from streaming import MDSWriter, StreamingDataset

    local = work / "mds-local"
    size_limit = int(float(a.shard_size.removesuffix("MiB")) * (1 << 20)) if a.shard_size.endswith("MiB") else 1 << 23
    with MDSWriter(out=str(local), columns={"image": "bytes", "label": "int"}, size_limit=size_limit) as w:
        for p, label in list_images(a.images):
            w.write({"image": p.read_bytes(), "label": label})
    upload_dir(local, server.url, _s3.BUCKET, "mds")
    os.environ["S3_ENDPOINT_URL"] = proxy.url
    for k, v in server.env().items():
        if k != "AWS_ENDPOINT_URL":
            os.environ[k] = v
    ds = StreamingDataset(
        remote=f"s3://{_s3.BUCKET}/mds",
        local=str(work / "mds-cache"),
        shuffle=True,
        batch_size=a.batch_size,
        shuffle_seed=0,
    )

    class Mapped(torch.utils.data.IterableDataset):
        def __init__(self) -> None:
            self.fn = _remote_decode.Decode(a.size)

        def __iter__(self):
            for s in ds:
                yield self.fn(s)

    loader = torch.utils.data.DataLoader(Mapped(), batch_size=a.batch_size, num_workers=a.threads)
    return epochs_of(loader, proxy)


def _lit_item(p: str) -> dict[str, Any]:
    path, label = p.rsplit("|", 1)
    return {"image": Path(path).read_bytes(), "label": int(label)}


def bench_litdata(a: argparse.Namespace, server: _s3.S3Server, proxy: _s3.FaultProxy, work: Path) -> dict[str, Any]:
    import litdata

    local = work / "lit-local"
    inputs = [f"{p}|{label}" for p, label in list_images(a.images)]
    litdata.optimize(
        fn=_lit_item, inputs=inputs, output_dir=str(local), chunk_bytes=a.shard_size.replace("iB", "B"), num_workers=1
    )
    upload_dir(local, server.url, _s3.BUCKET, "lit")
    for k, v in server.env().items():
        if k != "AWS_ENDPOINT_URL":
            os.environ[k] = v
    # LitData's obstore path reads this from the environment (an http:// endpoint).
    os.environ["AWS_ALLOW_HTTP"] = "true"
    ds = _remote_decode.lit_dataset(
        a.size,
        f"s3://{_s3.BUCKET}/lit",
        shuffle=True,
        seed=0,
        cache_dir=str(work / "lit-cache"),
        storage_options={"endpoint_url": proxy.url},
    )
    loader = litdata.StreamingDataLoader(ds, batch_size=a.batch_size, num_workers=a.threads)
    return epochs_of(loader, proxy, ds.set_epoch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True, help="an image folder (DIR/class/*.jpg)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mbps", type=float, default=40.0, help="the link's bandwidth, MB/s (1e6 bytes)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="decode threads / DataLoader workers")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--shard-size", default="8MiB")
    ap.add_argument("--cache-bytes", default=None, help="ringfeed's cache bound (default: twice the dataset)")
    ap.add_argument("--s3s-fs", default=None, help="the s3s-fs binary (default: on PATH)")
    ap.add_argument("--only", default="ringfeed,streaming,litdata")
    ap.add_argument(
        "--order-block",
        type=int,
        default=None,
        help="ringfeed: shards per block of the shard_blocks order (default: the server's, 16)",
    )
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    if a.s3s_fs:
        os.environ["PATH"] = f"{Path(a.s3s_fs).resolve().parent}{os.pathsep}{os.environ['PATH']}"
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rf-remote-"))
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "images": len(list_images(a.images)),
        "mbps": a.mbps,
        "threads": a.threads,
        "batch_size": a.batch_size,
        "size": a.size,
        "shard_size": a.shard_size,
        "runs": {},
    }
    results["load_start"] = os.getloadavg()
    server = _s3.S3Server("s3s-fs")
    proxy = _s3.FaultProxy(server.port, rate=a.mbps * 1e6)
    try:
        for name, fn in (("ringfeed", bench_ringfeed), ("streaming", bench_streaming), ("litdata", bench_litdata)):
            if name not in a.only.split(","):
                continue
            print(f"remote: {name} ...", flush=True)
            try:
                results["runs"][name] = fn(a, server, proxy, work)
            except Exception as e:  # a comparison that cannot run is reported, not fatal
                results["runs"][name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"remote: {name}: {json.dumps(results['runs'][name])}", flush=True)
    finally:
        proxy.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    results["load_end"] = os.getloadavg()
    rf = results["runs"].get("ringfeed", {})
    ratios = {e: harness.ratio(rf.get(f"{e}_img_s"), rf.get("local_img_s")) for e in ("epoch1", "epoch2")}
    harness.write_record(a.out / "remote.json", results, args=a, baseline="ringfeed on the local copy", ratios=ratios)
    lines = [
        f"# Remote datasets over a {a.mbps:g} MB/s link (local s3s-fs behind a throttling proxy)",
        "",
        f"`{results['command']}`",
        "",
        f"{results['images']} images, RandomResizedCrop({a.size}) + flip, batch {a.batch_size}, "
        f"{a.threads} decode threads / workers, shards of {a.shard_size}.",
        "",
        "| loader | epoch 1 img/s | epoch 2 img/s | MB downloaded, epoch 1 | epoch 2 | no network img/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results["runs"].items():
        if "error" in r:
            lines.append(f"| {name} | not run: {r['error'][:200]} | | | | |")
            continue
        local = f"{r['local_img_s']:.0f}" if "local_img_s" in r else ""
        lines.append(
            f"| {name} | {r['epoch1_img_s']:.0f} | {r['epoch2_img_s']:.0f} | {r['epoch1_bytes'] / 1e6:.1f} | "
            f"{r['epoch2_bytes'] / 1e6:.1f} | {local} |"
        )
    rf = results["runs"].get("ringfeed", {})
    if "epoch1_remote" in rf:
        for e in (1, 2):
            r = rf[f"epoch{e}_remote"] or {}
            lines.append("")
            lines.append(
                f"ringfeed epoch {e} ({rf['order']} order, block {a.order_block or 'default'}): "
                f"{rf[f'epoch{e}_s']:.1f} s, the loader waited "
                f"{rf[f'epoch{e}_loader_wait_s']:.1f} s in total so far; server counters so far: "
                + ", ".join(f"{k} {r.get(k)}" for k in ("fetches", "bytes", "hits", "misses", "prefetches", "wait_s"))
            )
    lines.append("")
    load = f"{results['load_start']} at the start, {results['load_end']} at the end"
    lines.append(f"Load average (1, 5, 15 min): {load}.")
    (a.out / "remote.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
