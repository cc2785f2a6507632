"""Datasets on Google Cloud Storage and Azure Blob Storage (``gs://``, ``az://``: control.md, "Other
object stores (1.9)", docs/remote.md) against real emulators: fake-gcs-server and Azurite
(``_stores``), each behind the same fault-injecting proxy as the S3 tests (``_s3.FaultProxy``).

The stores go through the same code as S3 (one ``Store`` over ``object_store``'s backend for the
scheme), so these tests check what differs per store: its client configured from the server's
environment as docs/remote.md says, its URLs kept in every message, its listings, ranged reads
and ETags, and that its faults end in the same retries. A packed dataset and WebDataset tars
served from each store equal the local copy batch for batch; a 503 burst and a cut response are
ridden out by the retries, never served as data.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _s3 import Fault
from _stores import Emulator, emulator
from _support import ringfeed_bin
from test_remote import Sidecar, batches, blocks, jpeg, pack, same, write_tar
from test_token_remote import SEQ, corpus
from test_token_remote import batches as token_batches
from test_token_remote import pack as token_pack

import ringfeed
from ringfeed import ServerError

N = 24


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N small JPEGs in 3 classes, packed locally: the reference."""
    root = tmp_path_factory.mktemp("stores")
    for i in range(N):
        p = root / "src" / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(40 + i % 7, 32 + i % 5, i))
    r = pack(root / "src", str(root / "ds"))
    assert r.returncode == 0, r.stderr
    assert len(list((root / "ds").glob("*.rfs"))) >= 2  # the faults below pick shards 0 and 1
    return root / "ds"


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three local WebDataset tars of 6 images each."""
    d = tmp_path_factory.mktemp("stores-wds")
    for t in range(3):
        write_tar(
            d / f"shard-{t:03d}.tar", [(f"k{t}{j}", jpeg(30 + j, 28 + t, 50 + t * 6 + j), str(j % 3)) for j in range(6)]
        )
    return d


@pytest.fixture(scope="module", params=["gcs", "azurite"])
def store(request: pytest.FixtureRequest, local: Path, tars: Path) -> Iterator[Emulator]:
    """An emulator holding the packed dataset at sets/ds and the tars at wds/. Azurite's copy is uploaded by
    `ringfeed pack SRC az://...` (the upload path under test); fake-gcs-server has no XML upload (`_stores`), so
    the files of the local pack go up through its JSON API."""
    server = emulator(request.param)
    try:
        if request.param == "azurite":
            r = pack(local.parent / "src", server.url("sets/ds"), server.env())
            assert r.returncode == 0, r.stderr
            assert f"to {server.url('sets/ds')}" in r.stdout
        else:
            for f in sorted(local.iterdir()):
                server.put(f"sets/ds/{f.name}", f.read_bytes())
        for f in sorted(tars.iterdir()):
            server.put(f"wds/{f.name}", f.read_bytes())
        yield server
    finally:
        server.close()


def sidecar(made: list[Sidecar], sockdir: Path, store: Emulator, cache: Path, *args: str) -> Sidecar:
    s = Sidecar(sockdir, store.env(), cache, 1 << 30, *args)
    made.append(s)
    return s


def run(store: Emulator, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **store.env()}
    return subprocess.run([ringfeed_bin(), *args], capture_output=True, text=True, env=env, timeout=120)


def test_a_packed_dataset_in_the_store_serves_the_local_batches(
    store: Emulator, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """The store's copy gives the local copy's batches (indices, pixels, labels, order) for both orders, several
    seeds and ranks; `verify` and `inspect` read it by its URL, which every line names as given."""
    url = store.url("sets/ds")
    r = run(store, "verify", url, "--progress", "none")
    assert r.returncode == 0, r.stderr
    assert f"ok: {N} samples" in r.stdout
    assert url in r.stdout
    r = run(store, "inspect", url, "--json")
    assert r.returncode == 0, r.stderr
    assert f'"samples": {N}' in r.stdout
    sc = sidecar(sidecars, sockdir, store, tmp_path / "cache")
    with sc.loader(url) as ld:
        assert ld.order == "shard_blocks"
    for seed, rank, world, order in [(0, 0, 1, "shard_blocks"), (7, 1, 2, "global")]:
        got: list[Any] = []
        want: list[Any] = []
        for path, out in ((url, got), (local, want)):
            with sc.loader(path, seed=seed, rank=rank, world_size=world, order=blocks(order)) as ld:
                out.extend(batches(ld, 0) + batches(ld, 1))
                if path == url:
                    remote = ld.stats()["server"]["remote"]
        assert got
        assert same(got, want), (seed, rank, world, order)
        assert remote["fetches"] > 0, remote
        assert remote["errors"] == 0, remote


def test_webdataset_tars_in_the_store_serve_the_local_batches(
    store: Emulator, tars: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """Tars in the store (a brace pattern, and the prefix) give the batches of the same tars on local disk: the
    listing's ETags are compared with those of the downloads (GCS lists them unquoted, answers GETs quoted)."""
    sc = sidecar(sidecars, sockdir, store, tmp_path / "cache")
    for url in (store.url("wds/shard-{000..002}.tar"), store.url("wds")):
        got: list[Any] = []
        want: list[Any] = []
        for path, out in ((url, got), (tars, want)):
            with sc.loader(path, seed=3, order=blocks("shard_blocks")) as ld:
                out.extend(batches(ld, 0))
        assert got
        assert same(got, want), url


# The patterns are bare numbers: object_store's GCS client percent-encodes `-` and `.` in a path.
@pytest.mark.parametrize(
    ("faults", "counted"),
    [
        ([Fault("status", 503, "000000")] * 3, 3),
        ([Fault("truncate", 0.5, "000001")], 1),
    ],
    ids=["503-burst", "cut-response"],
)
def test_a_fault_of_the_store_is_retried_never_served(
    store: Emulator,
    local: Path,
    sockdir: Path,
    tmp_path: Path,
    sidecars: list[Sidecar],
    faults: list[Fault],
    counted: int,
) -> None:
    """A burst of 503s on a shard (three in a row, under --fetch-retries 3) and a body cut in half are retried (the
    cut one resumed from where it stopped) and counted; the epoch equals the local copy's: nothing from a partial
    download, nothing lost, nothing twice."""
    before = len(store.proxy.stats.applied)
    store.proxy.stage(*faults)
    sc = sidecar(sidecars, sockdir, store, tmp_path / "cache")
    with sc.loader(store.url("sets/ds"), seed=4) as ld:
        got = batches(ld)
        remote = ld.stats()["server"]["remote"]
    with sc.loader(local, seed=4, order="shard_blocks") as ld:
        want = batches(ld)
    applied = store.proxy.stats.applied[before:]
    assert [k for k, _ in applied] == [f.kind for f in faults], applied
    assert same(got, want)
    assert remote["retries"] >= counted, remote
    assert (remote["errors"], remote["rejected"]) == (0, 0), remote


def test_a_token_dataset_in_the_store_serves_the_local_windows(
    store: Emulator, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """A token dataset in the store (its packing file, then `tokens.rft`, as `ringfeed pack` uploads them) serves
    the local copy's windows and `dataset_id`, alone and as a member of a mix beside a local dataset."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    local, other = tmp_path / "a" / "tok", tmp_path / "b" / "tok"
    for d, seed, docs in ((local, 5, 80), (other, 6, 40)):
        r = token_pack(corpus(d.parent, seed, docs), str(d))
        assert r.returncode == 0, r.stderr
    names = sorted(f.name for f in local.iterdir())
    for name in [*(n for n in names if n != "tokens.rft"), "tokens.rft"]:
        store.put(f"tok/{name}", (local / name).read_bytes())
    url = store.url("tok")
    sc = sidecar(sidecars, sockdir, store, tmp_path / "cache")
    conn = ringfeed.Server(socket=sc.socket, timeout=60.0)
    cases: list[tuple[Any, Any, str]] = [
        (url, str(local), "pack"),
        (url, str(local), "concat"),
        ({url: 0.7, str(other): 0.3}, {str(local): 0.7, str(other): 0.3}, "concat"),
    ]
    for remote_path, local_path, mode in cases:
        got, want = [], []
        for path, out in ((remote_path, got), (local_path, want)):
            with ringfeed.TokenLoader(path, 4, SEQ, mode=mode, seed=2, server=conn) as ld:
                out.append((ld.state_dict()["dataset_id"], token_batches(ld)))
        assert got == want, (remote_path, mode)


def test_errors_name_the_url_as_given(store: Emulator, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]) -> None:
    """A prefix with no dataset is a `dataset` error naming the object by its own scheme, not `s3://`."""
    sc = sidecar(sidecars, sockdir, store, tmp_path / "cache")
    url = store.url("nothing/here")
    with pytest.raises(ServerError) as e:
        sc.loader(url)
    assert url in str(e.value), e.value
    assert "s3://" not in str(e.value), e.value


def test_a_gs_or_az_url_is_not_sent_to_a_1_8_server(serve: Any) -> None:
    """A 1.8 server would take the URL for a relative path: the client refuses before `open`, naming the server's
    version and the one needed, for images and tokens (a mix member too)."""
    server = serve(protocol=(1, 8))
    conn = ringfeed.Server(socket=server.path, spawn=False, timeout=10)
    for url in ("gs://b/ds", "az://c/ds"):
        with pytest.raises(ringfeed.ProtocolError, match=r"speaks protocol 1\.8; .* need 1\.9"):
            ringfeed.Loader(url, 4, transform=ringfeed.CenterCrop(8), server=conn)
        with pytest.raises(ringfeed.ProtocolError, match=r"speaks protocol 1\.8; .* need 1\.9"):
            ringfeed.TokenLoader({"/data/a.tok": 0.5, url: 0.5}, 4, 16, server=conn)


def test_malformed_urls_are_refused_by_the_client(tmp_path: Path) -> None:
    """`dataset_path` checks gs:// and az:// as the server does (a bucket, no `..`), and a pathlib.Path that folded
    the `//` is named as such, before any server is reached."""
    nowhere = ringfeed.Server(socket=str(tmp_path / "none.sock"), spawn=False, timeout=1)
    for bad, why in [
        ("gs:///x", "names no bucket"),
        ("az:///x", "names no container"),
        ("gs://b/../x", "not allowed"),
        (Path("az://c/x"), "pathlib.Path"),
    ]:
        with pytest.raises(ValueError, match=why):
            ringfeed.Loader(bad, 4, transform=ringfeed.CenterCrop(8), server=nowhere)
