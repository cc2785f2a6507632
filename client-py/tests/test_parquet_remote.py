"""Parquet files on object storage served in place (control.md, "Parquet on object storage (1.10)";
docs/parquet.md, docs/remote.md), against real stores: ``s3s-fs`` and ``moto_server`` (``_s3``), and Azurite
(``_stores``), the S3 and Azure ones behind the fault-injecting proxy. The local Parquet files they hold are
the reference: the same rows, in the same order (``auto`` is ``shard_blocks`` of row groups in both), with
the same pixels, labels, captions and metadata. Footers are read by range at ``open``; row groups are
fetched (the column chunks read, by range) into the shard cache, so a 503 burst and a cut body are retried,
never decoded.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from _s3 import BUCKET, Fault, FaultProxy, S3Server, s3_server
from _stores import Emulator, emulator
from test_parquet import ROW_GROUP, N, caption, label, write_two_files
from test_remote import Sidecar, start

import ringfeed
from ringfeed import ServerError

FILES = ("train-00000-of-00002.parquet", "train-00001-of-00002.parquet")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two local files of 12 rows (HF `{bytes, path}` images), 3 row groups each, with page CRCs (so a
    flipped byte in a fetched row group fails its check): the reference."""
    root = write_two_files(tmp_path_factory.mktemp("pq-remote") / "struct", "struct")
    for name in FILES:
        pq.write_table(pq.read_table(root / name), root / name, row_group_size=ROW_GROUP, write_page_checksum=True)
    return root


def put(server: S3Server, key: str, data: bytes) -> None:
    """Places object `key`: s3s-fs keeps objects as files; moto takes an unsigned PUT."""
    if server.kind == "s3s-fs":
        p = server.object_path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    else:
        req = urllib.request.Request(f"{server.url}/{BUCKET}/{key}", data=data, method="PUT")
        # Without it urllib sends a form's type, whose body moto tries to parse.
        req.add_header("Content-Type", "application/octet-stream")
        urllib.request.urlopen(req, timeout=30).close()


@pytest.fixture(scope="module", params=["s3s-fs", "moto"])
def store(request: pytest.FixtureRequest, local: Path) -> Iterator[S3Server]:
    """A real S3 server holding the two files under pq/ (and nothing else there)."""
    with s3_server(request.param) as server:
        for name in FILES:
            put(server, f"pq/{name}", (local / name).read_bytes())
        yield server


def rows(ld: ringfeed.Loader) -> list[tuple[list[int], torch.Tensor, torch.Tensor, list[str], torch.Tensor]]:
    """One epoch, batch by batch: indices, pixels, labels, captions, the `likes` column."""
    return [
        (b["index"].tolist(), b["image"].clone(), b["label"].clone(), list(b["text"]), b["likes"].clone()) for b in ld
    ]


def open_kw(**kw: Any) -> dict[str, Any]:
    return {
        "transform": ringfeed.Resize((16, 16)),
        "text": ringfeed.Text("caption", max_bytes=64),
        "meta": ringfeed.Meta(None, {"likes": "int64"}),
        **kw,
    }


def epoch(sc: Sidecar, path: Any, **kw: Any) -> tuple[str, list[Any], dict[str, Any]]:
    with sc.loader(ringfeed.Parquet(path), **open_kw(**kw)) as ld:
        ld.set_epoch(1)
        got = rows(ld)
        return ld.order, got, ld.stats()["server"].get("remote", {})


def same(a: list[Any], b: list[Any]) -> bool:
    def eq(x: Any, y: Any) -> bool:
        return torch.equal(x, y) if isinstance(x, torch.Tensor) else bool(x == y)

    return len(a) == len(b) and all(all(eq(x, y) for x, y in zip(p, q, strict=True)) for p, q in zip(a, b, strict=True))


def test_rows_from_the_store_equal_the_local_parquet(
    store: S3Server, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """A prefix, a pattern and the two `.parquet` keys give the local files' batches (shuffled, `auto` being
    `shard_blocks` of row groups for both, two ranks): pixels, labels, captions and a metadata column."""
    sc = start(sidecars, sockdir, store.env(), tmp_path / "cache", 1 << 30)
    prefix = f"s3://{BUCKET}/pq"
    for rank in (0, 1):
        kw = {"shuffle": True, "seed": 5, "rank": rank, "world_size": 2}
        order, want, _ = epoch(sc, local, **kw)
        assert order == "shard_blocks"
        for url in (prefix, f"{prefix}/train-*.parquet"):
            order, got, remote = epoch(sc, url, **kw)
            assert order == "shard_blocks", url
            assert same(got, want), (url, rank)
            assert remote["fetches"] > 0, remote
            assert remote["errors"] == 0, remote
    # One file alone: its rows, in order, with their own fields.
    sc2 = start(sidecars, sockdir, store.env(), tmp_path / "cache2", 1 << 30)
    _, got, _ = epoch(sc2, f"{prefix}/{FILES[1]}")
    flat = [
        (i, lab, cap, likes)
        for b in got
        for i, lab, cap, likes in zip(b[0], b[2].tolist(), b[3], b[4].tolist(), strict=True)
    ]
    assert sorted(i for i, *_ in flat) == list(range(N // 2))
    for i, lab, cap, likes in flat:
        assert (lab, cap, likes) == (label(N // 2 + i), caption(N // 2 + i), 7 * (N // 2 + i))


@pytest.mark.parametrize(
    ("faults", "counted"),
    [
        ([Fault("status", 503, "train-00001")] * 3, "retries"),
        ([Fault("truncate", 0.5, "train-00001")], "retries"),
        ([Fault("corrupt", 0, "train-00001")], "rejected"),
    ],
    ids=["503-burst", "cut-response", "flipped-byte"],
)
def test_a_fault_on_a_row_group_is_retried_never_served(
    local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar], faults: list[Fault], counted: str
) -> None:
    """A burst of 503s, a body cut in half, and a flipped byte, on a row group's ranged GET (the file's second
    GET: its first is the footer's), are retried (the flipped copy fails its check: a page CRC) and counted; the
    epoch equals the local files': nothing partial or damaged decoded."""
    with s3_server("s3s-fs") as server:
        for name in FILES:
            put(server, f"pq/{name}", (local / name).read_bytes())
        proxy = FaultProxy(server.port)
        try:
            # A no-op first: the footer's GET passes, the faults fall on row groups.
            proxy.stage(Fault("delay", 0, "train-00001"), *faults)
            sc = start(sidecars, sockdir, server.env(proxy.url), tmp_path / "cache", 1 << 30)
            _, got, remote = epoch(sc, f"s3://{BUCKET}/pq", shuffle=True, seed=2)
            _, want, _ = epoch(sc, local, shuffle=True, seed=2)
        finally:
            proxy.close()
    applied = [k for k, _ in proxy.stats.applied]
    assert applied == ["delay", *(f.kind for f in faults)], proxy.stats.applied
    assert same(got, want)
    assert remote[counted] >= len(faults), remote
    assert remote["errors"] == 0, remote
    assert remote["rejected"] == (counted == "rejected"), remote


def test_a_missing_file_and_a_file_that_is_not_parquet_are_named(
    store: S3Server, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """A `.parquet` key that is not there is a `dataset` error naming it; an object named .parquet that is not
    Parquet is a listing problem (refused under raise naming it, left out under skip)."""
    sc = start(sidecars, sockdir, store.env(), tmp_path / "cache", 1 << 30)
    missing = f"s3://{BUCKET}/pq/nope.parquet"
    with pytest.raises(ServerError, match=r"nope\.parquet") as e:
        sc.loader(ringfeed.Parquet(missing), **open_kw())
    assert e.value.code == "dataset"
    put(store, "bad/a.parquet", (local / FILES[0]).read_bytes())
    put(store, "bad/b.parquet", b"this is not parquet at all")
    with pytest.raises(ServerError, match=r"b\.parquet.*not a readable Parquet file"):
        sc.loader(ringfeed.Parquet(f"s3://{BUCKET}/bad"), **open_kw())
    with sc.loader(ringfeed.Parquet(f"s3://{BUCKET}/bad"), on_error="skip", **open_kw()) as ld:
        assert sorted(i for b in rows(ld) for i in b[0]) == list(range(N // 2))


@pytest.fixture(scope="module")
def azurite(local: Path) -> Iterator[Emulator]:
    server = emulator("azurite")
    try:
        for name in FILES:
            server.put(f"pq/{name}", (local / name).read_bytes())
        yield server
    finally:
        server.close()


def test_parquet_in_azure_blob_storage_serves_the_local_rows(
    azurite: Emulator, local: Path, sockdir: Path, tmp_path: Path, sidecars: list[Sidecar]
) -> None:
    """The same files in Azurite (`az://`), with a 503 on a row group ridden out: the local files' batches."""
    azurite.proxy.stage(Fault("delay", 0, "train-00000"), Fault("status", 503, "train-00000"))
    sc = start(sidecars, sockdir, azurite.env(), tmp_path / "cache", 1 << 30)
    _, got, remote = epoch(sc, azurite.url("pq"), shuffle=True, seed=7)
    _, want, _ = epoch(sc, local, shuffle=True, seed=7)
    assert same(got, want)
    assert remote["retries"] >= 1, remote
    assert remote["errors"] == 0, remote
