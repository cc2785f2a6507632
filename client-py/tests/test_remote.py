"""Remote packed datasets (``s3://``, protocol 1.3, docs/remote.md) against real S3 servers.

Every test runs the real ``ringfeed`` binary against ``s3s-fs`` (objects as files) and, where it
says so, ``moto_server`` as a second implementation. ``ringfeed pack SRC s3://...`` uploads the
dataset; the same source packed locally (deterministic, byte-identical) is the reference the
remote batches must equal. Faults come from ``_s3.FaultProxy`` between the sidecar and the store.
The servers skip these tests when they are not installed, except in CI (``CI=true``).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _s3 import BUCKET, Fault, FaultProxy, S3Server, s3_server
from _support import ringfeed_bin
from PIL import Image

import ringfeed
from ringfeed import ServerError

N = 48
SHARD = "16KiB"


def jpeg(w: int, h: int, seed: int) -> bytes:
    img = Image.new("RGB", (w, h), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    for x in range(0, w, 5):
        img.putpixel((x, (x * seed) % h), (255 - x % 256, seed % 256, 7))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N small JPEGs in 4 classes."""
    root = tmp_path_factory.mktemp("remote") / "src"
    for i in range(N):
        p = root / f"c{i % 4}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(40 + i % 11, 32 + i % 9, i))
    return root


def pack(src: Path, out: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ringfeed_bin(), "pack", str(src), out, "--progress", "none", "--shard-size", SHARD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def local(source: Path) -> Path:
    """The local copy: the reference."""
    out = source.parent / "ds"
    r = pack(source, str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module", params=["s3s-fs", "moto"])
def store(request: pytest.FixtureRequest, source: Path, local: Path) -> Iterator[S3Server]:
    """A real S3 server holding the dataset at s3://BUCKET/sets/ds, uploaded by `ringfeed pack`."""
    with s3_server(request.param) as server:
        r = pack(source, f"s3://{BUCKET}/sets/ds", server.env())
        assert r.returncode == 0, r.stderr
        assert "uploaded" in r.stdout
        yield server


@pytest.fixture(scope="module")
def fs_store(source: Path, local: Path) -> Iterator[S3Server]:
    """s3s-fs alone (its objects are files, so a test can change one under the server)."""
    with s3_server("s3s-fs") as server:
        r = pack(source, f"s3://{BUCKET}/sets/ds", server.env())
        assert r.returncode == 0, r.stderr
        yield server


URL = f"s3://{BUCKET}/sets/ds"


def blocks(order: str) -> str | ringfeed.ShardBlocks:
    """The order of a case: shard_blocks with 2 shards per block (few shards in these datasets)."""
    return ringfeed.ShardBlocks(block=2) if order == "shard_blocks" else order


class Sidecar:
    """`ringfeed serve` with a cache directory and the store's environment."""

    def __init__(self, sockdir: Path, env: dict[str, str], cache: Path, cache_bytes: int, *args: str) -> None:
        self.socket = str(sockdir / f"s{time.monotonic_ns()}.sock")
        self.log = sockdir / f"log{time.monotonic_ns()}"
        cmd = [ringfeed_bin(), "serve", "--socket", self.socket, "--threads", "2", "--cache-dir", str(cache)]
        cmd += ["--cache-bytes", str(cache_bytes), "--fetch-timeout", "5", *args]
        if "--fetch-retries" not in args:
            cmd += ["--fetch-retries", "3"]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stderr=log, env={**os.environ, **env})
        deadline = time.monotonic() + 30
        while not Path(self.socket).exists():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def loader(self, path: str | Path, **kw: Any) -> ringfeed.Loader:
        kw.setdefault("transform", ringfeed.RandomResizedCrop(16) + ringfeed.Flip())
        kw.setdefault("fields", ["index"])
        server = ringfeed.Server(socket=self.socket, timeout=60.0)
        return ringfeed.Loader(path, kw.pop("batch_size", 4), server=server, **kw)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)


def start(made: list[Sidecar], sockdir: Path, env: dict[str, str], cache: Path, cache_bytes: int, *a: str) -> Sidecar:
    s = Sidecar(sockdir, env, cache, cache_bytes, *a)
    made.append(s)
    return s


def batches(ld: ringfeed.Loader, epoch: int | None = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One iteration (of `epoch`; None: where the loader stands), every batch copied."""
    if epoch is not None:
        ld.set_epoch(epoch)
    return [(b["index"].clone(), b["image"].clone(), b["label"].clone()) for b in ld]


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        all(torch.equal(x, y) for x, y in zip(p, q, strict=True)) for p, q in zip(a, b, strict=True)
    )


def dir_bytes(d: Path) -> int:
    total = 0
    for p in d.iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def shard_count(local: Path) -> int:
    return len(list(local.glob("*.rfs")))


def test_the_upload_is_the_local_dataset_byte_for_byte(fs_store: S3Server, local: Path) -> None:
    """`ringfeed pack SRC s3://...` uploads exactly the files a local pack writes, and `verify` and `inspect` read
    the remote copy."""
    for f in local.iterdir():
        assert fs_store.object_path(f"sets/ds/{f.name}").read_bytes() == f.read_bytes(), f.name
    env = {**os.environ, **fs_store.env()}
    r = subprocess.run([ringfeed_bin(), "verify", URL, "--progress", "none"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert f"ok: {N} samples in {shard_count(local)} shards" in r.stdout
    r = subprocess.run([ringfeed_bin(), "inspect", URL, "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert f'"samples": {N}' in r.stdout
    again = pack(local.parent / "src", URL, fs_store.env())
    assert again.returncode != 0
    assert "--force" in again.stderr


def test_batches_from_s3_equal_the_local_copy(
    store: S3Server, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """For several seeds, ranks, resume points and both orders, the batches of the S3 copy equal those of the local
    copy: same indices, pixels and labels, in the same order; `order="auto"` is shard_blocks for the S3 copy."""
    sc = start(sidecars, sockdir, store.env(), tmp_path / "cache", 1 << 30)
    with sc.loader(URL) as ld:
        assert ld.order == "shard_blocks"
    cases = [
        (0, 0, 1, 0, "shard_blocks"),
        (7, 1, 2, 0, "global"),
        (3, 0, 2, 2, "shard_blocks"),
        (11, 2, 3, 1, "global"),
    ]
    for seed, rank, world, resume, order in cases:
        got, want = [], []
        for path, out in ((URL, got), (local, want)):
            with sc.loader(path, seed=seed, rank=rank, world_size=world, order=blocks(order)) as ld:
                if resume:
                    ld.load_state_dict({**ld.state_dict(), "batches_delivered": resume, "epoch": 1})
                    out.extend(batches(ld, None))
                else:
                    out.extend(batches(ld, 0) + batches(ld, 1))
        assert got, (seed, rank)
        assert same(got, want), (seed, rank, world, resume, order)


def test_the_cache_bound_holds_during_an_epoch(
    fs_store: S3Server, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """With a cache bound of two and a half shards, the cache directory (measured every few ms during two epochs)
    never holds more, the server reports the same, and every sample is still served exactly once per epoch."""
    shard = max(p.stat().st_size for p in local.glob("*.rfs"))
    bound = shard * 5 // 2
    cache = tmp_path / "cache"
    sc = start(sidecars, sockdir, fs_store.env(), cache, bound)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if cache.exists():
                peak[0] = max(peak[0], dir_bytes(cache))
            time.sleep(0.002)

    t = threading.Thread(target=watch)
    t.start()
    try:
        with sc.loader(URL, seed=5, drop_last=False) as ld:
            for e in range(2):
                seen = sorted(i for b in batches(ld, e) for i in b[0].tolist())
                assert seen == list(range(N))
            remote = ld.stats()["server"]["remote"]
    finally:
        stop.set()
        t.join()
    assert 0 < peak[0] <= bound, (peak[0], bound)
    assert remote["cache_limit"] == bound
    assert remote["cache_bytes"] <= bound
    assert remote["evictions"] > 0


def test_a_cache_smaller_than_a_shard_is_refused_at_open(
    fs_store: S3Server, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """A cache bound below the largest shard refuses the open with a `dataset` error naming the shard and
    --cache-bytes, instead of a deadlock later (MosaicML Streaming #417)."""
    shard = max(p.stat().st_size for p in local.glob("*.rfs"))
    sc = start(sidecars, sockdir, fs_store.env(), tmp_path / "cache", shard - 1)
    with pytest.raises(ServerError, match="--cache-bytes") as e:
        sc.loader(URL)
    assert e.value.code == "dataset"
    assert ".rfs" in str(e.value)


def test_a_restart_reuses_a_valid_cache_and_rejects_a_tampered_file(
    fs_store: S3Server, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """After a restart the cached shards are checked, not trusted: the valid ones are used without a download, a
    tampered one is rejected and downloaded again, and the batches are those of the local copy."""
    cache = tmp_path / "cache"
    n = shard_count(local)
    sc = start(sidecars, sockdir, fs_store.env(), cache, 1 << 30)
    with sc.loader(URL, seed=2) as ld:
        first = batches(ld)
    sc.close()
    files = sorted(p for p in cache.iterdir() if p.name.endswith(".rfs"))
    assert len(files) == n
    victim = files[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x01
    victim.write_bytes(bytes(data))
    sc = start(sidecars, sockdir, fs_store.env(), cache, 1 << 30, "--prefetch-shards", "0")
    with sc.loader(URL, seed=2) as ld:
        again = batches(ld)
        remote = ld.stats()["server"]["remote"]
    with sc.loader(local, seed=2, order="shard_blocks") as ld:
        want = batches(ld)
    assert same(first, want)
    assert same(again, want)
    assert (remote["reused"], remote["rejected"]) == (n - 1, 1), remote
    # The index, and the one shard downloaded again.
    assert remote["fetches"] == 2, remote
    assert victim.read_bytes() == (local / victim.name.split("%2F")[-1]).read_bytes()


@pytest.mark.parametrize(
    ("fault", "counted"),
    [
        (Fault("delay", 7.0), "retries"),
        (Fault("reset"), "retries"),
        (Fault("status", 500), "retries"),
        (Fault("status", 503), "retries"),
        (Fault("status", 429), "retries"),
        (Fault("truncate", 0.5), "retries"),
        (Fault("corrupt"), "rejected"),
    ],
    ids=["delay", "reset", "500", "503", "429", "truncated", "corrupted"],
)
def test_a_transient_fault_is_retried_and_counted(
    fs_store: S3Server,
    local: Path,
    sockdir: Path,
    tmp_path: Path,
    sidecars: list[Sidecar],
    fault: Fault,
    counted: str,
) -> None:
    """A fault on a shard's download (a stall past --fetch-timeout, a reset, 500/503/429, a body cut short, a flipped
    byte) ends in a retry, counted in the stream's stats; the epoch is the local copy's: nothing served twice, nothing
    lost, nothing from a partial or bad download."""
    proxy = FaultProxy(fs_store.port)
    try:
        proxy.stage(fault, Fault(fault.kind, fault.arg, "shard-000002"))
        sc = start(sidecars, sockdir, fs_store.env(proxy.url), tmp_path / "cache", 1 << 30)
        with sc.loader(URL, seed=4) as ld:
            got = batches(ld)
            remote = ld.stats()["server"]["remote"]
        with sc.loader(local, seed=4, order="shard_blocks") as ld:
            want = batches(ld)
    finally:
        proxy.close()
    assert [k for k, _ in proxy.stats.applied] == [fault.kind, fault.kind]
    assert same(got, want)
    assert remote[counted] >= 2, remote
    assert remote["errors"] == 0, remote


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        (Fault("status", 503), "--fetch-retries"),
        (Fault("gone"), "does not exist"),
    ],
    ids=["throttled-for-good", "gone"],
)
def test_a_lasting_fault_is_an_error_naming_the_object_and_the_setting(
    fs_store: S3Server, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar], fault: Fault, named: str
) -> None:
    """A shard that stays throttled past the retries, or has disappeared, fails the run with a `sample` error naming
    the object (and, for throttling, the setting to change), within bounded time; never a hang."""
    proxy = FaultProxy(fs_store.port)
    proxy.always = Fault(fault.kind, fault.arg, "shard-000001")
    try:
        sc = start(sidecars, sockdir, fs_store.env(proxy.url), tmp_path / "cache", 1 << 30, "--fetch-retries", "2")
        started = time.monotonic()
        with sc.loader(URL, seed=1) as ld, pytest.raises(ServerError) as e:
            batches(ld)
        took = time.monotonic() - started
        with sc.loader(URL) as ld:
            remote = ld.stats()["server"]["remote"]
    finally:
        proxy.close()
    assert e.value.code == "sample"
    assert "shard-000001.rfs" in str(e.value), str(e.value)
    assert named in str(e.value), str(e.value)
    assert took < 60
    assert remote["errors"] >= 1


def test_an_object_changed_under_a_running_job_is_an_error(
    fs_store: S3Server, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """A shard downloaded again (after its eviction) whose ETag is no longer the one the server first saw fails the run
    with an error saying the object changed under the job, naming it; the batches before it were the local copy's."""
    shard = max(p.stat().st_size for p in local.glob("*.rfs"))
    proxy = FaultProxy(fs_store.port)
    try:
        sc = start(sidecars, sockdir, fs_store.env(proxy.url), tmp_path / "cache", shard * 2, "--prefetch-shards", "0")
        with sc.loader(URL, seed=9) as ld:
            batches(ld)
            # From now on every shard download reports another ETag: the object was rewritten.
            proxy.always = Fault("etag")
            with pytest.raises(ServerError, match="changed while this server used it") as e:
                batches(ld, 1)
    finally:
        proxy.close()
    assert "s3://" in str(e.value)
    assert ".rfs" in str(e.value)


def write_tar(path: Path, samples: list[tuple[str, bytes | None, str | None]]) -> None:
    """A WebDataset tar by Python's tarfile: KEY.jpg and KEY.cls per sample (None leaves a member out)."""
    import tarfile

    with tarfile.open(path, "w") as t:
        for key, image, label in samples:
            for ext, data in (("jpg", image), ("cls", None if label is None else label.encode())):
                if data is None:
                    continue
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                t.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def wds(fs_store: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four local tars of 9 images each (`cls` labels), copied to s3://BUCKET/wds/; the second with an index file
    made locally by `ringfeed index` and uploaded beside it, as a user would."""
    d = tmp_path_factory.mktemp("wds")
    for t in range(4):
        write_tar(
            d / f"shard-{t:03d}.tar",
            [(f"k{t}{j}", jpeg(36 + j, 30 + t, t * 9 + j), str((t + j) % 4)) for j in range(9)],
        )
    r = subprocess.run([ringfeed_bin(), "index", str(d / "shard-001.tar")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for p in d.iterdir():
        dest = fs_store.object_path(f"wds/{p.name}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(p.read_bytes())
    (d / "shard-001.tar.rfidx").unlink()
    return d


WDS_URL = f"s3://{BUCKET}/wds/shard-{{000..003}}.tar"


def test_webdataset_tars_on_s3_serve_the_local_tars_batches(
    fs_store: S3Server, wds: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """Tars on S3 (a brace pattern) give the batches of the same tars on local disk, for both orders, several seeds
    and ranks; `order="auto"` is shard_blocks for them; a restarted server finds every tar's index in its cache and
    downloads nothing to open them."""
    cache = tmp_path / "cache"
    sc = start(sidecars, sockdir, fs_store.env(), cache, 1 << 30)
    with sc.loader(WDS_URL) as ld:
        assert ld.order == "shard_blocks"
        remote = ld.stats()["server"]["remote"]
    assert (remote["fetch_concurrency"], remote["fetch_pinned"]) == (4, False)
    for seed, rank, world, order in [(0, 0, 1, "global"), (5, 1, 2, "shard_blocks"), (2, 2, 3, "shard_blocks")]:
        got, want = [], []
        for path, out in ((WDS_URL, got), (wds, want)):
            with sc.loader(path, seed=seed, rank=rank, world_size=world, order=blocks(order)) as ld:
                out.extend(batches(ld, 0) + batches(ld, 1))
        assert got, (seed, rank)
        assert same(got, want), (seed, rank, world, order)
    sc.close()
    assert len(list((cache / "indexes").glob("*.rfidx"))) == 4
    sc = start(sidecars, sockdir, fs_store.env(), cache, 1 << 30, "--fetch-concurrency", "3")
    with sc.loader(f"s3://{BUCKET}/wds", seed=1) as ld:
        remote = ld.stats()["server"]["remote"]
        assert remote["fetches"] == 0, remote
        assert (remote["fetch_concurrency"], remote["fetch_pinned"]) == (3, True)
        got = batches(ld)
    with sc.loader(wds, seed=1, order="shard_blocks") as ld:
        assert same(got, batches(ld))


def test_a_malformed_tar_on_s3_follows_on_error(
    fs_store: S3Server, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """On S3 as on disk: a tar cut short refuses the open under on_error="raise", naming the tar; under "skip" the
    samples before the cut and every whole sample of the other tars are served, and a key without an image is
    skipped and counted."""
    d = tmp_path / "bad"
    d.mkdir()
    write_tar(d / "a.tar", [("a0", jpeg(30, 30, 1), "0"), ("a1", None, "1"), ("a2", jpeg(31, 30, 2), "2")])
    write_tar(d / "b.tar", [("b0", jpeg(32, 30, 3), "3"), ("b1", jpeg(33, 30, 4), "0")])
    whole = (d / "b.tar").read_bytes()
    cut = whole[: 512 + len(jpeg(32, 30, 3)) // 512 * 512 + 1024 + 512 + 100]
    for name, data in (("a.tar", (d / "a.tar").read_bytes()), ("b.tar", cut)):
        fs_store.object_path(f"bad/{name}").parent.mkdir(parents=True, exist_ok=True)
        fs_store.object_path(f"bad/{name}").write_bytes(data)
    sc = start(sidecars, sockdir, fs_store.env(), tmp_path / "cache", 1 << 30)
    url = f"s3://{BUCKET}/bad/*.tar"
    with pytest.raises(ServerError, match="cut short") as e:
        sc.loader(url, on_error="raise")
    assert e.value.code == "dataset"
    assert "bad/b.tar" in str(e.value)
    with sc.loader(url, on_error="skip", shuffle=False, drop_last=False, batch_size=1) as ld:
        labels = [int(b[2]) for b in batches(ld)]
        skipped = ld.stats(server=False)["skipped"]
    assert labels[:2] == [0, 2], labels
    assert 3 in labels
    assert skipped >= 1


def test_inspect_and_verify_on_s3_read_ranges_and_stream_one_shard_at_a_time(
    fs_store: S3Server, local: Path, tmp_path: Path
) -> None:
    """`inspect s3://...` reads only the index, each shard's record table and a few samples' first bytes (ranged GETs:
    a small part of the dataset's bytes, counted by a proxy) and reports what the local inspect reports; `verify
    s3://...` streams the dataset shard by shard, its temporary directory never holding more than one shard, with
    progress per shard."""
    import json

    proxy = FaultProxy(fs_store.port)
    try:
        env = {**os.environ, **fs_store.env(proxy.url)}
        cmd = [ringfeed_bin(), "inspect", "--json", "--sample", "5"]
        r = subprocess.run([*cmd, URL], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        fetched, gets = proxy.stats.bytes, proxy.stats.gets
        r = subprocess.run([*cmd, str(local)], capture_output=True, text=True, timeout=60)
        want = json.loads(r.stdout)
        for key in ("samples", "shards", "bytes_on_disk", "classes", "sample_bytes", "info"):
            assert got[key] == want[key], key
        for key in ("index", "key", "label", "class", "bytes", "image", "offset", "crc32c"):
            assert got["sample"][key] == want["sample"][key], key
        assert got["formats"] == {"jpeg": got["probed"]}
        dataset_bytes = sum(p.stat().st_size for p in local.iterdir())
        assert fetched < dataset_bytes // 4, (fetched, dataset_bytes)
        assert gets <= 1 + shard_count(local) + 32 + 1, gets

        tmp = tmp_path / "tmp"
        tmp.mkdir()
        peak = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                total = 0
                for root, _dirs, files in os.walk(tmp):
                    for f in files:
                        with contextlib.suppress(FileNotFoundError):
                            total += (Path(root) / f).stat().st_size
                peak[0] = max(peak[0], total)
                time.sleep(0.001)

        t = threading.Thread(target=watch)
        t.start()
        try:
            before = proxy.stats.bytes
            r = subprocess.run(
                [ringfeed_bin(), "verify", URL, "--decode", "--progress", "lines"],
                capture_output=True,
                text=True,
                env={**env, "TMPDIR": str(tmp)},
                timeout=120,
            )
        finally:
            stop.set()
            t.join()
        assert r.returncode == 0, r.stderr
        n = shard_count(local)
        assert f"ok: {N} samples in {n} shards" in r.stdout
        assert f"{N} samples decoded" in r.stdout
        assert f"shard {n} of {n}" in r.stderr
        assert proxy.stats.bytes - before >= dataset_bytes, "every byte is checked"
        shard = max(p.stat().st_size for p in local.glob("*.rfs"))
        assert 0 < peak[0] <= shard, (peak[0], shard)
    finally:
        proxy.close()
