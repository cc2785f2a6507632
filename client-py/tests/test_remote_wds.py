"""WebDataset tars in a store: ``ringfeed index s3://...`` and ``ringfeed inspect s3://...`` (proto/webdataset.md,
"Tars in a store"; docs/remote.md), against a real ``s3s-fs`` server (objects as files, so a test can place, cut
or rewrite a tar under it) and, for the index, ``moto_server`` too (it lists ETags; s3s-fs does not). A
``FaultProxy`` between the command and the store counts the requests and bytes. The local ``ringfeed index`` and
``ringfeed inspect`` of the same tars are the reference.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _s3 import BUCKET, FaultProxy, S3Server, s3_server
from _support import ringfeed_bin
from PIL import Image
from test_webdataset import parse_index

import ringfeed

TARS = 4
PER_TAR = 40


def jpeg(w: int, h: int, seed: int) -> bytes:
    img = Image.new("RGB", (w, h), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256))
    for x in range(0, w, 3):
        img.putpixel((x, (x * seed) % h), (255 - x % 256, seed % 256, 7))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=92)
    return buf.getvalue()


def write_tar(path: Path, t: int, count: int = PER_TAR) -> None:
    """KEY.jpg, KEY.cls and KEY.json per sample, by Python's tarfile (pax, as webdataset's TarWriter writes)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for j in range(count):
            key = f"s{t}-{j:03d}"
            meta = json.dumps({"tar": t, "j": j, "caption": f"photo {t}/{j}"}).encode()
            for ext, data in (
                ("jpg", jpeg(40 + j % 13, 30 + t, t * 100 + j)),
                ("cls", str((t + j) % 5).encode()),
                ("json", meta),
            ):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tf.addfile(info, io.BytesIO(data))


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ringfeed_bin(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def client(server: S3Server) -> Any:
    """A boto3 client of `server` (boto3 comes with moto, which the tests need anyway)."""
    import boto3

    env = server.env()
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )


def upload(server: S3Server, src: Path, prefix: str) -> None:
    """Puts the tars of `src` (not the index files a local open may have written beside them) under `prefix/`: as
    files for s3s-fs (its objects are files), through the S3 API for moto."""
    c = None if server.kind == "s3s-fs" else client(server)
    for p in sorted(src.glob("*.tar")):
        if c is None:
            dest = server.object_path(f"{prefix}/{p.name}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(p.read_bytes())
        else:
            c.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.name}", Body=p.read_bytes())


def get(server: S3Server, key: str) -> bytes:
    if server.kind == "s3s-fs":
        return server.object_path(key).read_bytes()
    return bytes(client(server).get_object(Bucket=BUCKET, Key=key)["Body"].read())


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TARS local tars of PER_TAR samples each, and nothing else."""
    d = tmp_path_factory.mktemp("rwds") / "tars"
    d.mkdir()
    for t in range(TARS):
        write_tar(d / f"shard-{t:03d}.tar", t)
    return d


@pytest.fixture(scope="module")
def local_index(tars: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """What the local `ringfeed index` writes for each tar (on a copy: `tars` stays without index files)."""
    copy = tmp_path_factory.mktemp("rwds-local")
    for p in tars.glob("*.tar"):
        (copy / p.name).write_bytes(p.read_bytes())
    r = run("index", str(copy))
    assert r.returncode == 0, r.stderr
    return {p.name: (copy / f"{p.name}.rfidx").read_bytes() for p in tars.glob("*.tar")}


@pytest.fixture(params=["s3s-fs", "moto"])
def server(request: pytest.FixtureRequest) -> Iterator[S3Server]:
    with s3_server(request.param) as s:
        yield s


@contextlib.contextmanager
def serving(server: S3Server, sock: str, tmp_path: Path, log: Path | None = None, env: dict[str, str] | None = None):
    """A `ringfeed serve` on `sock` reading `server`'s store (a cache in `tmp_path`), stderr to `log`; stopped on
    exit."""
    cmd = ["serve", "--socket", sock, "--threads", "2", "--cache-dir", str(tmp_path / "cache")]
    with (log or Path(os.devnull)).open("wb") as f:
        proc = subprocess.Popen(
            [ringfeed_bin(), *cmd, "--cache-bytes", str(1 << 30)],
            stderr=f,
            env={**os.environ, **server.env(), **(env or {})},
        )
    try:
        deadline = time.monotonic() + 30
        while not Path(sock).exists():
            assert proc.poll() is None, log.read_text() if log else "the server exited"
            assert time.monotonic() < deadline, log.read_text() if log else "the server did not start"
            time.sleep(0.02)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def as_stored(local: bytes, mtime_ns: int, etag: str) -> bytes:
    """The local index of a tar with the modification time and ETag of a tar in a store (proto/webdataset.md 1.1:
    the same layout, `etag_len` at byte 12, the ETag before the CRC)."""
    from ringfeed.formats.crc32c import crc32c

    body = bytearray(local[:-4])
    struct.pack_into("<I", body, 12, len(etag.encode()))
    struct.pack_into("<q", body, 24, mtime_ns)
    body += etag.encode()
    return bytes(body) + struct.pack("<I", crc32c(bytes(body)))


def test_index_of_tars_in_a_store_is_the_local_index_with_the_objects_etag(
    server: S3Server, tars: Path, local_index: dict[str, bytes]
) -> None:
    """`ringfeed index s3://bucket/prefix` writes TAR.rfidx beside every tar in the store: byte for byte the index
    the local `ringfeed index` writes for the same tar, but for the stamp a tar in a store has (its LastModified, the
    ETag the download saw); a second run keeps every index and reads no tar (counted by a proxy)."""
    upload(server, tars, "wds")
    proxy = FaultProxy(server.port)
    try:
        env = server.env(proxy.url)
        r = run("index", f"s3://{BUCKET}/wds", "--progress", "lines", env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("index written") == TARS, r.stdout
        assert f"indexing tar {TARS} of {TARS}" in r.stderr
        tar_bytes = sum(p.stat().st_size for p in tars.glob("*.tar"))
        assert proxy.stats.bytes >= tar_bytes, "each tar is read once"
        assert proxy.stats.bytes < 2 * tar_bytes, "and only once"
        for name, want in local_index.items():
            stored = get(server, f"wds/{name}.rfidx")
            got = parse_index(stored)
            assert got["etag"], "the ETag the download saw is recorded"
            assert got["members"] == parse_index(want)["members"]
            assert stored == as_stored(want, int(got["mtime_ns"]), str(got["etag"])), name
        before = (proxy.stats.bytes, proxy.stats.gets)
        r = run("index", f"s3://{BUCKET}/wds/shard-{{000..003}}.tar", env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("index valid, kept") == TARS, r.stdout
        assert "0 index files written" in r.stderr
        read = proxy.stats.bytes - before[0]
        assert read < sum(len(b) for b in local_index.values()) + TARS * 1024 + 8192, read
    finally:
        proxy.close()


def test_serving_opens_from_the_stored_indexes_without_scanning(tars: Path, sockdir: Path, tmp_path: Path) -> None:
    """After `ringfeed index s3://...`, a server opens the tars from their stored indexes (its log: every tar "from
    the store's", none downloaded and scanned) and serves the local tars' batches."""
    with s3_server("s3s-fs") as server:
        upload(server, tars, "wds")
        r = run("index", f"s3://{BUCKET}/wds", env=server.env())
        assert r.returncode == 0, r.stderr
        sock, log = str(sockdir / "r.sock"), tmp_path / "serve.log"
        with serving(server, sock, tmp_path, log, {"RINGFEED_LOG": "warn,ringfeed_serve::images=info"}):
            kw = {
                "transform": ringfeed.RandomResizedCrop(16),
                "seed": 3,
                "order": "shard_blocks",
                "server": ringfeed.Server(socket=sock),
            }
            with ringfeed.Loader(f"s3://{BUCKET}/wds", 8, **kw) as ld:
                got = [(b[0].clone(), b[1].clone()) for b in ld]
            with ringfeed.Loader(tars, 8, **kw) as ld:
                want = [(b[0].clone(), b[1].clone()) for b in ld]
        text = log.read_text()
        assert f"{TARS} tars (0 from cached index files, {TARS} from the store's, 0 downloaded and scanned)" in text, (
            text
        )
        assert len(got) == len(want) > 0
        assert all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(got, want, strict=True))


def test_a_stale_stored_index_is_not_used_and_index_rebuilds_it(tars: Path) -> None:
    """A tar rewritten after it was indexed (same length, other members: its ETag changed) makes its stored index
    stale: `inspect` does not use it (reads the tar whole and reports the new members), `index` rebuilds it, saying
    why, and the rebuilt index is the new tar's."""
    with s3_server("s3s-fs") as server:
        upload(server, tars, "wds")
        url = f"s3://{BUCKET}/wds/shard-000.tar"
        assert run("index", url, env=server.env()).returncode == 0
        old = parse_index(server.object_path("wds/shard-000.tar.rfidx").read_bytes())
        assert old["etag"]
        # The same number of bytes (zeros after the end-of-archive blocks are more of them), other members.
        original = (tars / "shard-000.tar").read_bytes()
        other = tars.parent / "other.tar"
        write_tar(other, 7, PER_TAR - 4)
        data = other.read_bytes()
        assert len(data) <= len(original)
        data += bytes(len(original) - len(data))
        server.object_path("wds/shard-000.tar").write_bytes(data)
        r = run("inspect", "--json", url, env=server.env())
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["webdataset"]["tars_read_whole"] == 1
        assert (got["samples"], got["webdataset"]["first_key"]) == (PER_TAR - 4, "s7-000")
        r = run("index", url, env=server.env())
        assert r.returncode == 0, r.stderr
        assert "index rebuilt (the one there was not used: it was made for the object's etag" in r.stdout, r.stdout
        new = parse_index(server.object_path("wds/shard-000.tar.rfidx").read_bytes())
        assert new["etag"] != old["etag"]
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            want = [{"name": m.name, "offset": m.offset_data, "size": m.size} for m in t.getmembers() if m.isfile()]
        assert new["members"] == want


def test_a_damaged_tar_is_indexed_up_to_the_damage_and_named(tars: Path) -> None:
    """A tar cut short in the store is indexed up to the cut, and `index` exits non-zero naming the object; the
    other tars are indexed."""
    with s3_server("s3s-fs") as server:
        upload(server, tars, "wds")
        whole = (tars / "shard-002.tar").read_bytes()
        server.object_path("wds/shard-002.tar").write_bytes(whole[: len(whole) // 2 + 100])
        r = run("index", f"s3://{BUCKET}/wds", env=server.env())
        assert r.returncode != 0
        assert f"s3://{BUCKET}/wds/shard-002.tar: the tar is cut short" in r.stderr, r.stderr
        assert "1 damaged tars" in r.stderr
        cut = parse_index(server.object_path("wds/shard-002.tar.rfidx").read_bytes())
        assert cut["end"] == "truncated"
        assert 0 < len(cut["members"]) < 3 * PER_TAR
        for t in (0, 1, 3):
            assert server.object_path(f"wds/shard-{t:03d}.tar.rfidx").exists()


def test_a_store_that_cannot_be_reached_is_an_error_naming_the_setting(tars: Path) -> None:
    """`index s3://...` against a store that does not answer fails, naming the URL and the settings to change."""
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    r = run("index", f"s3://{BUCKET}/wds", "--fetch-retries", "0", "--fetch-timeout", "2", env=env, timeout=60)
    assert r.returncode != 0
    assert f"s3://{BUCKET}/wds" in r.stderr
    assert "--fetch-retries" in r.stderr, r.stderr


def test_refused_credentials_are_an_error_naming_them_not_retried(tars: Path) -> None:
    """`index s3://...` with a secret the store refuses (403) fails at once, naming the credentials' settings."""
    with s3_server("s3s-fs") as server:
        upload(server, tars, "wds")
        env = {**server.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
        r = run("index", f"s3://{BUCKET}/wds", "--fetch-retries", "3", env=env)
        assert r.returncode != 0
        assert "access denied" in r.stderr, r.stderr
        assert "AWS_SECRET_ACCESS_KEY" in r.stderr
        assert "attempts failed" not in r.stderr


def test_inspect_of_tars_in_a_store_reports_what_the_local_inspect_does(tars: Path) -> None:
    """`inspect s3://...` of tars reports the local inspect's counts, extensions, label field, keys, image sizes and
    sample (its members, label, image and JSON metadata); without index files it reads every tar whole, with them
    (after `ringfeed index`) only the index files and ranged GETs of a few samples, a small part of the tars."""
    with s3_server("s3s-fs") as server:
        upload(server, tars, "wds")
        proxy = FaultProxy(server.port)
        try:
            env = server.env(proxy.url)
            url = f"s3://{BUCKET}/wds"
            want = json.loads(run("inspect", "--json", "--sample", "45", str(tars)).stdout)
            tar_bytes = sum(p.stat().st_size for p in tars.glob("*.tar"))
            results = []
            for step in ("without", "with"):
                if step == "with":
                    assert run("index", url, env=env).returncode == 0
                before = proxy.stats.bytes
                r = run("inspect", "--json", "--sample", "45", url, env=env)
                assert r.returncode == 0, r.stderr
                results.append((json.loads(r.stdout), proxy.stats.bytes - before))
            for got, _ in results:
                for key in ("kind", "samples", "shards", "bytes_on_disk", "sample_bytes", "classes"):
                    assert got[key] == want[key], key
                w = {k: v for k, v in want["webdataset"].items() if not k.startswith("tars_")}
                assert {k: v for k, v in got["webdataset"].items() if not k.startswith("tars_")} == w
                assert got["webdataset"]["extensions"] == {
                    "jpg": TARS * PER_TAR,
                    "cls": TARS * PER_TAR,
                    "json": TARS * PER_TAR,
                }
                assert got["webdataset"]["label"] == "cls"
                for key in ("index", "key", "label", "bytes", "image", "members", "metadata"):
                    assert got["sample"][key] == want["sample"][key], key
                assert got["sample"]["metadata"] == {"tar": 1, "j": 5, "caption": "photo 1/5"}
                assert got["sample"]["tar"] == f"{url}/shard-001.tar"
                assert got["formats"] == {"jpeg": got["probed"]}
                assert got["labels"]["read"] == got["probed"]
                assert want["labels"]["min"] <= got["labels"]["min"] <= got["labels"]["max"] <= want["labels"]["max"]
            (without, read_without), (with_index, read_with) = results
            assert (without["webdataset"]["tars_from_index"], without["webdataset"]["tars_read_whole"]) == (0, TARS)
            assert (with_index["webdataset"]["tars_from_index"], with_index["webdataset"]["tars_read_whole"]) == (
                TARS,
                0,
            )
            assert read_without >= tar_bytes
            assert read_with < tar_bytes // 2, (read_with, tar_bytes)
            text = run("inspect", url, env=env).stdout
            assert "label: .cls" in text, text
            assert "read:     4 tars from their index files" in text, text
        finally:
            proxy.close()


def test_sample_fields_of_tars_in_a_store_are_the_local_tars(tars: Path, sockdir: Path, tmp_path: Path) -> None:
    """Text and metadata fields (protocol 1.9) of tars served from a store come from the same cached copy as the image:
    every batch (images, labels, captions, metadata) is the local tars' batch."""
    with s3_server("s3s-fs") as server:
        upload(server, tars, "wds")
        sock = str(sockdir / "f.sock")
        with serving(server, sock, tmp_path):
            kw = {
                "transform": ringfeed.RandomResizedCrop(16),
                "seed": 3,
                "order": "shard_blocks",
                "server": ringfeed.Server(socket=sock),
                "text": ringfeed.Text("json:caption"),
                "meta": ringfeed.Meta("json", {"tar": "int32", "j": "int64"}),
            }
            with ringfeed.Loader(f"s3://{BUCKET}/wds", 8, **kw) as ld:
                got = [{k: (v.clone() if hasattr(v, "clone") else v) for k, v in b.items()} for b in ld]
            with ringfeed.Loader(tars, 8, **kw) as ld:
                want = [{k: (v.clone() if hasattr(v, "clone") else v) for k, v in b.items()} for b in ld]
    assert len(got) == len(want) == TARS * PER_TAR // 8
    for a, b in zip(got, want, strict=True):
        assert set(a) == set(b) == {"image", "label", "text", "tar", "j"}
        assert a["text"] == b["text"]
        for k in ("image", "label", "tar", "j"):
            assert (a[k] == b[k]).all(), k
    # The captions are the JSON members' own, matching each sample's metadata.
    for b in got:
        assert b["text"] == [f"photo {t}/{j}" for t, j in zip(b["tar"].tolist(), b["j"].tolist(), strict=True)]
