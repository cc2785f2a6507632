"""What a running server is doing: its snapshot (control.md, "snapshot"), as ``ringfeed top``
shows it, over a short-lived observer connection."""

from __future__ import annotations

import os
from typing import Any

from .._errors import ProtocolError, RingfeedError, ServerError
from .._version import __version__
from .protocol import PROTOCOL, Connection, check_server_message
from .sidecar import default_socket_path


def snapshot(socket: str | os.PathLike[str] | None = None, *, timeout: float = 10.0) -> dict[str, Any]:
    """The server's state now: ``{"server": {...}, "streams": [{...}, ...]}`` (control.md,
    "snapshot"): per stream its slots, threads, depth, samples/s, the training loop's wait share
    and per-stage times; from a 1.2 server also its wait behind its own GPU (``gpu_wait``, apart
    from ``wait``, the wait for data), its threads' ``busy`` share and ``limit``, what limits the
    loop now.

    Args:
        socket: the server's socket (default: as for ``Loader``).
        timeout: seconds to wait for the server.

    Raises:
        RingfeedError: nothing listens at the socket.
        ProtocolError: the server speaks protocol 1.0, which has no snapshots.
    """
    path = os.fspath(socket) if socket is not None else default_socket_path()
    try:
        conn = Connection.connect(path, timeout=timeout)
    except OSError as e:
        raise RingfeedError(f"no ringfeed server listens on {path} ({e}); start one with `ringfeed serve`") from e
    try:
        conn.send({"type": "hello", "protocol": list(PROTOCOL), "client": f"ringfeed-py {__version__}"})
        welcome, _ = conn.recv()
        check_server_message(welcome)
        if welcome["type"] == "error":
            raise ServerError(welcome["code"], welcome["message"])
        if tuple(welcome["protocol"]) < (1, 1):
            raise ProtocolError(
                f"the server at {path} speaks protocol {welcome['protocol'][0]}.{welcome['protocol'][1]}, "
                f"which has no snapshots; upgrade the server"
            )
        conn.send({"type": "snapshot"})
        snap, _ = conn.recv()
        check_server_message(snap)
        if snap["type"] != "snapshot":
            raise ProtocolError(f"the server answered `snapshot` with `{snap['type']}`")
        conn.send({"type": "close"})
        return {"server": snap["server"], "streams": snap["streams"]}
    finally:
        conn.close()
