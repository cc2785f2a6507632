"""Token datasets on S3 (``TokenLoader("s3://...")``, protocol 1.7, control.md "Remote token
datasets (1.7)") against real S3 servers and the real ``ringfeed`` binary.

``ringfeed pack CORPUS s3://... --tokenizer T`` uploads the dataset; the same corpus packed
locally (deterministic, byte-identical) is the reference: the remote stream's batches, resume
and ``dataset_id`` must be the local copy's. ``s3s-fs`` serves every test, ``moto_server`` the
main one as a second implementation; missing servers skip, except in CI (``CI=true``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _s3 import BUCKET, Fault, FaultProxy, S3Server, s3_server
from _support import ringfeed_bin
from test_token_loader import WORDS, tokenizer

import ringfeed
from ringfeed import ServerError
from ringfeed.formats import tokfile

torch = pytest.importorskip("torch")

SEQ = 16
URL = f"s3://{BUCKET}/sets/tok"


def pack(src: Path, out: str, env: dict[str, str] | None = None, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [ringfeed_bin(), "pack", str(src), out, "--tokenizer", str(tokenizer(src.parent)), "--progress", "none"]
    cmd += ["--pack-seq-len", str(SEQ), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def corpus(d: Path, seed: int, docs: int) -> Path:
    rng = np.random.default_rng(seed)
    rows = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(1, 50)))) for _ in range(docs)]
    src = d / "c.jsonl"
    src.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    return src


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus(tmp_path_factory.mktemp("tokremote"), 3, 200)


@pytest.fixture(scope="module")
def local(source: Path) -> Path:
    """The local copy: the reference."""
    out = source.parent / "tok"
    r = pack(source, str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, local token dataset, for mixes."""
    src = corpus(tmp_path_factory.mktemp("tokother"), 4, 120)
    r = pack(src, str(src.parent / "tok"))
    assert r.returncode == 0, r.stderr
    return src.parent / "tok"


def upload(server: S3Server, source: Path) -> None:
    r = pack(source, URL, server.env())
    assert r.returncode == 0, r.stderr
    assert "uploaded 2 files" in r.stdout


@pytest.fixture(scope="module", params=["s3s-fs", "moto"])
def store(request: pytest.FixtureRequest, source: Path, local: Path) -> Iterator[S3Server]:
    """A real S3 server holding the dataset at URL, uploaded by `ringfeed pack --tokenizer`."""
    with s3_server(request.param) as server:
        upload(server, source)
        yield server


@pytest.fixture(scope="module")
def fs_store(source: Path, local: Path) -> Iterator[S3Server]:
    with s3_server("s3s-fs") as server:
        upload(server, source)
        yield server


class Sidecar:
    """`ringfeed serve` with its own cache and the store's environment (`env`)."""

    def __init__(self, d: Path, env: dict[str, str], cache_bytes: int = 1 << 30, *args: str) -> None:
        self.socket = str(d / f"s{time.monotonic_ns()}.sock")
        cache = d / f"cache{time.monotonic_ns()}"
        cmd = [ringfeed_bin(), "serve", "--socket", self.socket, "--threads", "2", "--cache-dir", str(cache)]
        cmd += ["--cache-bytes", str(cache_bytes), "--fetch-timeout", "5", "--fetch-retries", "2", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env={**os.environ, **env})
        deadline = time.monotonic() + 30
        while not Path(self.socket).exists():
            assert self.proc.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def loader(self, path: Any, timeout: float = 60.0, **kw: Any) -> ringfeed.TokenLoader:
        server = ringfeed.Server(socket=self.socket, timeout=timeout)
        return ringfeed.TokenLoader(path, kw.pop("batch_size", 4), SEQ, server=server, **kw)


@pytest.fixture
def sidecar(sockdir: Path) -> Iterator[Callable[..., Sidecar]]:
    """Starts sidecars (`sidecar(env, cache_bytes, *flags)`); each is stopped (SIGTERM) after the test."""
    with contextlib.ExitStack() as stack:

        def make(env: dict[str, str], cache_bytes: int = 1 << 30, *args: str) -> Sidecar:
            sc = Sidecar(sockdir, env, cache_bytes, *args)
            stack.callback(sc.proc.wait, timeout=20)
            stack.callback(sc.proc.terminate)
            return sc

        yield make


def batches(ld: ringfeed.TokenLoader, epoch: int = 0) -> list[dict[str, list[Any]]]:
    ld.set_epoch(epoch)
    return [{k: v.tolist() for k, v in b.items()} for b in ld]


def spec_id(ds: tokfile.TokenDataset, windows: int, mode: int) -> str:
    """control.md "Dataset identity" for a one-dataset token stream, computed here: FNV-1a 64 of
    the description (no classes, no shards, then seq_len, mode and the dataset's counts)."""
    d = b"ringfeed-dataset\0" + struct.pack("<QII", windows, 0, 0)
    d += struct.pack("<IBI", SEQ, mode, 1) + struct.pack("<4Q", ds.token_count, ds.doc_count, windows, 1)
    h = 0xCBF29CE484222325
    for byte in d:
        h = ((h ^ byte) * 0x100000001B3) % (1 << 64)
    return f"{h:016x}"


def test_the_upload_is_the_local_copy_byte_for_byte(fs_store: S3Server, local: Path) -> None:
    """`ringfeed pack --tokenizer ... s3://` stores exactly the files of a local pack: tokens.rft and the packing."""
    names = sorted(p.name for p in local.iterdir())
    assert names == ["packing-16.rfp", "tokens.rft"]
    for name in names:
        assert fs_store.object_path(f"sets/tok/{name}").read_bytes() == (local / name).read_bytes(), name


def test_packing_over_a_token_dataset_in_the_store_needs_force(fs_store: S3Server, source: Path) -> None:
    """A second `pack --tokenizer ... s3://` onto a prefix holding a token dataset is refused,
    naming its tokens.rft and --force, and leaves it as it was; with --force it replaces it."""
    rft = fs_store.object_path("sets/tok/tokens.rft")
    before = (rft.read_bytes(), rft.stat().st_mtime_ns)
    r = pack(source, URL, fs_store.env())
    assert r.returncode != 0
    assert "already holds a dataset (its tokens.rft); pass --force to replace it" in r.stderr, r.stderr
    assert (rft.read_bytes(), rft.stat().st_mtime_ns) == before
    r = pack(source, URL, fs_store.env(), "--force")
    assert r.returncode == 0, r.stderr
    assert rft.read_bytes() == before[0]
    assert rft.stat().st_mtime_ns != before[1], "--force uploaded the dataset again"


@pytest.mark.parametrize("mode", ["concat", "pack"])
def test_token_batches_from_s3_equal_the_local_copy(
    store: S3Server, local: Path, sidecar: Callable[..., Sidecar], mode: str
) -> None:
    """For shuffled and plain orders, two ranks and two epochs, `TokenLoader("s3://...")` yields exactly the batches
    of `TokenLoader(local copy)`, every field, and the same `dataset_id`: the one the spec computes from the counts."""
    sc = sidecar(store.env())
    fields = ["position_ids", "document_ids", "cu_seqlens", "index"]
    for seed, shuffle, rank in [(0, False, 0), (5, True, 1)]:
        got, want, ids = [], [], []
        for path, out in ((URL, got), (local, want)):
            kw = {"mode": mode, "fields": fields, "shuffle": shuffle, "seed": seed, "rank": rank, "world_size": 2}
            with sc.loader(path, **kw) as ld:
                out += batches(ld, 0) + batches(ld, 1)
                ids.append((ld.state_dict()["dataset_id"], ld.dataset_len))
        assert got, (store.kind, mode, seed)
        assert got == want, (store.kind, mode, seed)
        assert ids[0] == ids[1]
        assert ids[0][0] == spec_id(tokfile.TokenDataset(local), ids[0][1], {"concat": 0, "pack": 1}[mode])


def test_a_mix_of_remote_and_local_members_is_the_all_local_mix(
    fs_store: S3Server, local: Path, other: Path, sidecar: Callable[..., Sidecar]
) -> None:
    """`{"s3://b/tok": 0.7, "/local/other": 0.3}` and `{other: 0.3, "s3://...": 0.7}` serve the batches of the same
    mixes of local copies, `dataset_index` included."""
    sc = sidecar(fs_store.env())
    kw = {"fields": ["dataset_index", "index"], "shuffle": True, "seed": 3}
    for remote_mix, local_mix in [
        ({URL: 0.7, str(other): 0.3}, {str(local): 0.7, str(other): 0.3}),
        ({str(other): 0.3, URL: 0.7}, {str(other): 0.3, str(local): 0.7}),
    ]:
        with sc.loader(remote_mix, **kw) as a, sc.loader(local_mix, **kw) as b:
            assert a.mix == list(remote_mix.items())
            got, want = batches(a), batches(b)
            assert got == want
            assert {i for bt in got for i in bt["dataset_index"]} == {0, 1}
            assert a.state_dict()["dataset_id"] == b.state_dict()["dataset_id"]


def test_a_remote_token_stream_resumes_exactly(fs_store: S3Server, sidecar: Callable[..., Sidecar]) -> None:
    """`state_dict()` taken mid-epoch on the S3 dataset, loaded by a new loader on a new server (a cold cache),
    delivers exactly the rest of the epoch."""
    kw = {"fields": ["index"], "shuffle": True, "seed": 9, "batch_size": 3}
    sc = sidecar(fs_store.env())
    with sc.loader(URL, **kw) as ld:
        full = batches(ld, 1)
    with sc.loader(URL, **kw) as a:
        a.set_epoch(1)
        it = iter(a)
        head = [{k: v.tolist() for k, v in next(it).items()} for _ in range(4)]
        state = a.state_dict()
    fresh = sidecar(fs_store.env())
    with fresh.loader(URL, **kw) as b:
        b.load_state_dict(state)
        b.set_epoch(1)
        rest = [{k: v.tolist() for k, v in x.items()} for x in b]
    assert head + rest == full


def test_remote_token_errors_name_the_url(fs_store: S3Server, local: Path, sidecar: Callable[..., Sidecar]) -> None:
    """A prefix without a dataset, a mix member that is missing and a dataset larger than the cache refuse the
    open naming the URL (and `--cache-bytes`); a malformed URL is a ValueError before anything is sent."""
    sc = sidecar(fs_store.env())
    with pytest.raises(ServerError) as e:
        sc.loader(f"s3://{BUCKET}/nothing")
    assert f"s3://{BUCKET}/nothing is no token dataset: nothing is stored under it" in str(e.value)
    with pytest.raises(ServerError) as e:
        sc.loader({str(local): 0.5, f"s3://{BUCKET}/sets": 0.5})
    assert f"s3://{BUCKET}/sets/tokens.rft does not exist (the prefix holds tok/)" in str(e.value)
    small = sidecar(fs_store.env(), 4096)
    with pytest.raises(ServerError) as e:
        small.loader(URL)
    assert f"{URL}: its files (tokens.rft) are" in str(e.value)
    assert "--cache-bytes" in str(e.value)
    for bad in ["s3:///tok", f"s3://{BUCKET}/../tok", Path(URL)]:
        with pytest.raises(ValueError, match="not a usable dataset URL"):
            ringfeed.TokenLoader(bad, 4, SEQ, server=ringfeed.Server(socket=sc.socket))
        # The image Loader checks its URL the same way (one function, `_options.dataset_path`).
        with pytest.raises(ValueError, match="not a usable dataset URL"):
            ringfeed.Loader(bad, 4, ringfeed.CenterCrop(8), server=ringfeed.Server(socket=sc.socket))


def test_a_slow_download_keeps_the_client_waiting_with_opening_progress(
    fs_store: S3Server, local: Path, sidecar: Callable[..., Sidecar], caplog: pytest.LogCaptureFixture
) -> None:
    """While `tokens.rft` takes 3 s to arrive, the sidecar sends `opening` messages, so a client whose receive
    timeout is 1 s waits for the download instead of failing, and then gets the local copy's batches."""
    proxy = FaultProxy(fs_store.port)
    try:
        proxy.stage(Fault("delay", 3.0, pattern="tokens.rft"))
        sc = sidecar(fs_store.env(proxy.url), 1 << 30, "--open-progress", "0.2")
        caplog.set_level(logging.INFO, logger="ringfeed")
        with sc.loader(URL, timeout=1.0, fields=["index"]) as ld:
            got = batches(ld)
        assert ("delay", "/rf-test/sets/tok/tokens.rft") in proxy.stats.applied
        assert any(f"listing {URL}: 0 files" in r.getMessage() for r in caplog.records)
        with sc.loader(local, fields=["index"]) as ld:
            assert got == batches(ld)
    finally:
        proxy.close()


def test_a_token_url_is_not_sent_to_a_1_6_server(serve: Any) -> None:
    """A 1.6 server would take the URL for a relative path: the client refuses before `open`, naming the server's
    version and the one needed, for one dataset and for a mix member."""
    server = serve(protocol=(1, 6))
    for path in [URL, {"/data/a.tok": 0.5, URL: 0.5}]:
        with pytest.raises(ringfeed.ProtocolError, match=r"speaks protocol 1\.6; token datasets on S3 .* need 1\.7"):
            ringfeed.TokenLoader(path, 4, SEQ, server=ringfeed.Server(socket=server.path, spawn=False, timeout=10))
