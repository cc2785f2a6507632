"""Real S3-compatible servers for the remote-dataset tests and benchmarks, and a fault-injecting
HTTP proxy to put in front of them.

- ``S3Server``: starts ``s3s-fs`` (objects as files) or ``moto_server`` (an in-memory emulator)
  on 127.0.0.1 with a bucket; ``env()`` is what a ringfeed server needs to reach it.
- ``FaultProxy``: a plain HTTP/1.1 proxy (one request per connection) that forwards requests
  byte for byte (SigV4 signatures stay valid: the Host header is passed through) and, for GETs
  whose path contains a pattern, applies the next staged fault: a delay, a connection reset, a
  500/503/429 answer, a body cut short, a flipped byte, a changed ETag, a 404. It can also
  limit the bandwidth of every response (a token bucket shared by all connections), to imitate a
  remote link.

Missing servers skip the tests, except in CI (``CI=true``), where they are a failure: CI installs
them (``scripts/bootstrap``).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

KEY, SECRET = "ringfeedtest", "ringfeedtestsecret"
BUCKET = "rf-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need(program: str) -> str:
    """The path of `program`, or a skip (a failure in CI)."""
    path = shutil.which(program)
    if path is None:
        import pytest  # here: the benchmarks use this module without pytest

        msg = f"{program} is not installed (scripts/bootstrap installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the S3 server exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the S3 server did not listen on port {port} within {timeout} s")


class S3Server:
    """A real S3-compatible server process with one bucket."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"rf-{kind}-"))
        if kind == "s3s-fs":
            exe = need("s3s-fs")
            (self.dir / BUCKET).mkdir()
            cmd = [exe, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", KEY, "--secret-key", SECRET]
            cmd.append(str(self.dir))
        elif kind == "moto":
            exe = need("moto_server")
            cmd = [exe, "-H", "127.0.0.1", "-p", str(self.port)]
        else:
            raise ValueError(kind)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc)
        if kind == "moto":
            # moto checks no signatures by default: an unsigned PUT makes the bucket.
            req = urllib.request.Request(f"{self.url}/{BUCKET}", method="PUT")
            urllib.request.urlopen(req, timeout=10).close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """What a ringfeed process needs to use this server (through `endpoint` if given)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.url,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
        }

    def object_path(self, key: str) -> Path:
        """Where s3s-fs keeps object `key` (s3s-fs only)."""
        assert self.kind == "s3s-fs"
        return self.dir / BUCKET / key

    def close(self) -> None:
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends a server process: SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Fault:
    """One staged fault: `kind` is delay, reset, status, truncate, corrupt, etag or gone."""

    kind: str
    arg: float = 0.0
    #: Only requests whose path contains this.
    pattern: str = ".rfs"


@dataclass
class Stats:
    requests: int = 0
    gets: int = 0
    bytes: int = 0
    #: (fault kind, request path) for every fault applied.
    applied: list[tuple[str, str]] = field(default_factory=list)


class FaultProxy:
    """An HTTP proxy in front of `upstream` that applies staged faults (see the module docs)."""

    def __init__(self, upstream_port: int, rate: float | None = None, port: int = 0) -> None:
        self.upstream = upstream_port
        #: Bytes per second over all responses (None: unlimited).
        self.rate = rate
        self.faults: list[Fault] = []
        #: Applied to every matching GET, in addition to the staged ones.
        self.always: Fault | None = None
        self.stats = Stats()
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._last = time.monotonic()
        self._sock = socket.create_server(("127.0.0.1", port))
        self.port = int(self._sock.getsockname()[1])
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stage(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def _next_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            if method != "GET":
                return None
            for i, f in enumerate(self.faults):
                if f.pattern in path:
                    return self.faults.pop(i)
            if self.always is not None and self.always.pattern in path:
                return self.always
        return None

    def _serve(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _throttle(self, n: int) -> None:
        if self.rate is None:
            return
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.rate * 0.05, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= n or self._tokens >= self.rate * 0.05:
                    self._tokens -= n
                    return
                wait = (n - self._tokens) / self.rate
            time.sleep(min(wait, 0.05))

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, body = data.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = [tuple(h.split(":", 1)) for h in lines[1:] if ":" in h]
                length = next((int(v) for k, v in headers if k.strip().lower() == "content-length"), 0)
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    body += chunk
                with self._lock:
                    self.stats.requests += 1
                    self.stats.gets += method == "GET"
                fault = self._next_fault(method, path)
                if fault is not None:
                    with self._lock:
                        self.stats.applied.append((fault.kind, path))
                if fault is not None and fault.kind == "delay":
                    time.sleep(fault.arg)
                if fault is not None and fault.kind == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                if fault is not None and fault.kind in ("status", "gone"):
                    code = 404 if fault.kind == "gone" else int(fault.arg)
                    reason = {404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}.get(
                        code, "Service Unavailable"
                    )
                    code_name = reason.replace(" ", "")
                    xml = f"<Error><Code>{code_name}</Code><Message>staged</Message></Error>"
                    payload = f"<?xml version='1.0'?>{xml}".encode()
                    head_out = f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/xml\r\n"
                    head_out += f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                    conn.sendall(head_out.encode() + payload)
                    return
                up = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
                up.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    up.putheader(k.strip(), v.strip())
                up.endheaders(body if body else None)
                resp = up.getresponse()
                payload = resp.read()
                out_headers = [
                    (k, v)
                    for k, v in resp.getheaders()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")
                ]
                up.close()
                if fault is not None and fault.kind == "etag":
                    out_headers = [(k, '"changed-etag"' if k.lower() == "etag" else v) for k, v in out_headers]
                if fault is not None and fault.kind == "corrupt" and payload:
                    b = bytearray(payload)
                    b[len(b) // 2] ^= 0x5A
                    payload = bytes(b)
                cut = None
                if fault is not None and fault.kind == "truncate":
                    cut = int(len(payload) * fault.arg)
                status = f"HTTP/1.1 {resp.status} {resp.reason}\r\n"
                hdrs = "".join(f"{k}: {v}\r\n" for k, v in out_headers)
                conn.sendall(f"{status}{hdrs}Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode())
                send = payload if cut is None else payload[:cut]
                for i in range(0, len(send), 16384):
                    piece = send[i : i + 16384]
                    self._throttle(len(piece))
                    conn.sendall(piece)
                    with self._lock:
                        self.stats.bytes += len(piece)
            except OSError:
                return

    def close(self) -> None:
        self._stop = True
        self._sock.close()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def s3_server(kind: str) -> Iterator[S3Server]:
    server = S3Server(kind)
    try:
        yield server
    finally:
        server.close()
