"""A client killed with SIGKILL mid-epoch: the server frees its ring and keeps serving others."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _support import REPO, ringfeed_bin
from PIL import Image

import ringfeed


def ring_fds(pid: int) -> int:
    """How many ring memfds the process holds open."""
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            n += str(fd.readlink()).startswith("/memfd:ringfeed-ring")
    return n


CHILD = """
import sys, time, ringfeed
ld = ringfeed.Loader(sys.argv[1], 4, transform=ringfeed.RandomResizedCrop(32), socket=sys.argv[2], spawn=False)
it = iter(ld)
next(it)
print("holding a batch", flush=True)
time.sleep(120)
"""


def test_sigkilled_client_frees_its_ring(tmp_path: Path) -> None:
    """After a client is SIGKILLed mid-epoch the server holds no ring of it, and another client completes an epoch."""
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(24):
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), (i * 9, 100, 200)).save(buf, "JPEG")
        (src / f"{i:02d}.jpg").write_bytes(buf.getvalue())
    subprocess.run(
        [ringfeed_bin(), "pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--progress", "none"], check=True
    )
    sock = Path(tempfile.mkdtemp(prefix="rfk-", dir="/tmp")) / "ringfeed.sock"
    server = subprocess.Popen(
        [ringfeed_bin(), "serve", "--socket", str(sock), "--threads", "2"], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        env = {**os.environ, "PYTHONPATH": str(REPO / "client-py")}
        for _ in range(3):
            cmd = [sys.executable, "-c", CHILD, str(tmp_path / "ds"), str(sock)]
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True) as child:
                assert child.stdout is not None
                assert child.stdout.readline().strip() == "holding a batch"
                assert ring_fds(server.pid) == 1
                child.send_signal(signal.SIGKILL)
                child.wait()
            deadline = time.monotonic() + 5
            while ring_fds(server.pid) != 0:
                assert time.monotonic() < deadline, "the server still holds the killed client's ring"
                time.sleep(0.02)
        tf = ringfeed.RandomResizedCrop(32)
        with ringfeed.Loader(tmp_path / "ds", 4, transform=tf, socket=str(sock), spawn=False) as ld:
            assert sum(images.shape[0] for images, _ in ld) == 24
        assert server.poll() is None, "the server is still running"
    finally:
        server.terminate()
        server.wait(timeout=10)
