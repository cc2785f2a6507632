"""The control protocol, version 1.0 (``proto/control.md`` is the normative text).

This module is the single Python truth for the control plane, the counterpart of the Rust
``crates/format/src/control/``: the version, the framing (``encode``, ``decode_payload``, ``decode_frame``),
the messages the server may send and the members each one must carry (``check_server_message``),
and ``Connection``, one client's end of the Unix stream socket. ``tests/test_protocol.py`` pins the
framing rules one by one, and the vectors in ``proto/vectors/control/`` pin the bytes.

Invariants:

- A frame is a u32 little-endian length in ``1 ..= 65536``, then that many bytes of a UTF-8 JSON
  object with a string member ``type``. Anything else is a ``ProtocolError``; so is an integer
  outside ±2^53, a non-finite number, a lone surrogate escape, a duplicated member name, or
  nesting 128 containers deep (what serde_json on the server side refuses too).
- Frames are encoded canonically: compact separators, keys sorted, non-ASCII kept as UTF-8.
- ``Connection`` never reads past the end of the frame it is receiving, so every file descriptor
  belongs to exactly one frame: the frame whose bytes the ``recvmsg`` that carried it returned.
  The server sends a ``ring`` frame with a ``sendmsg`` of its own (control.md, "Framing"), so its
  descriptor arrives with the frame's first bytes. Descriptors that arrive with any frame other
  than ``ring`` are closed at once; a ``ring`` frame must bring exactly one.
- Received descriptors are close-on-exec (``MSG_CMSG_CLOEXEC``), so a sidecar or any other child
  the training process starts never inherits a ring.
- End of file is ``ServerDiedError`` as soon as the kernel reports it; silence for longer than the
  timeout is ``ringfeed.TimeoutError``; an ``error`` message is turned into ``ServerError`` by the
  caller (``Connection`` hands every message up unchanged).
"""

from __future__ import annotations

import array
import builtins
import contextlib
import json
import math
import os
import socket
import struct
import time
from collections.abc import Mapping
from types import EllipsisType
from typing import Any

from .._errors import ProtocolError, ServerDiedError, TimeoutError
from ..formats.shard import _MAX_DEPTH, _depth, _reject_constant

__all__ = [
    "MAX_FRAME_LEN",
    "PROTOCOL",
    "REMOTE_COUNTERS",
    "Connection",
    "check_server_message",
    "decode_frame",
    "decode_payload",
    "encode",
    "stats_message",
]

#: The protocol version this client speaks, ``(major, minor)``: sent in ``hello``. A server of the
#: same major is accepted; the session then uses the smaller minor.
PROTOCOL = (1, 11)

#: The frame's length prefix: u32 little-endian.
LENGTH = struct.Struct("<I")
assert LENGTH.size == 4
#: Largest allowed payload, in bytes.
MAX_FRAME_LEN = 65536
#: Integers must lie within ±2^53 (exactly representable as an IEEE double).
MAX_INT = 1 << 53

#: Every message type of control.md, by direction.
CLIENT_TYPES = frozenset({"hello", "open", "start", "release", "stats", "snapshot", "close"})
SERVER_TYPES = frozenset({"welcome", "ring", "ready", "end", "error", "snapshot", "opening"})
ALL_TYPES = CLIENT_TYPES | SERVER_TYPES

# The members a server message MUST carry (control.md, "req" column), by type. `int` means a JSON
# integer (not a bool), `list[int]`/`list[str]` an array of those.
_REQUIRED: dict[str, dict[str, str]] = {
    "welcome": {"protocol": "version"},
    "ring": {
        "segment_len": "uint",
        "dataset_len": "uint",
        "samples_per_rank": "uint",
        "batches_per_epoch": "uint",
        "classes": "list[str]",
    },
    "ready": {"run": "uint", "seq": "uint", "slot": "uint"},
    "end": {"run": "uint", "epoch": "uint", "batches": "uint", "skipped": "uint"},
    "error": {"code": "str", "message": "str", "fatal": "bool"},
    "snapshot": {"server": "object", "streams": "list[object]"},
    "opening": {"dataset": "str", "listed": "uint", "elapsed_ms": "uint"},
}
# Optional members whose type is still checked when present.
_OPTIONAL: dict[str, dict[str, str]] = {
    "welcome": {"server": "str"},
    "error": {"sample": "uint", "key": "str"},
    "ring": {"stream": "uint", "dataset_id": "str"},
}

#: 1.3: the integer members of a snapshot's ``server.remote`` (control.md, ``snapshot``); it also
#: has ``wait_s``, a number.
REMOTE_COUNTERS = (
    "fetches",
    "bytes",
    "retries",
    "errors",
    "hits",
    "misses",
    "prefetches",
    "evictions",
    "reused",
    "rejected",
    "cache_bytes",
    "cache_limit",
)


def remote_stats(snapshot: dict[str, Any]) -> dict[str, Any] | None:
    """A ``snapshot``'s ``server.remote`` (1.3: what fetching remote datasets has done), checked;
    ``None`` when absent (an older server, or no remote dataset opened yet).

    Raises:
        ProtocolError: a member missing or mistyped.
    """
    remote = snapshot.get("server", {}).get("remote")
    if remote is None:
        return None
    _check_member("snapshot", "server.remote", remote, "object")
    for member in REMOTE_COUNTERS:
        if member not in remote:
            raise ProtocolError(f"`snapshot` member `server.remote` has no member `{member}`")
        _check_member("snapshot", f"server.remote.{member}", remote[member], "uint")
    wait = remote.get("wait_s")
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        raise ProtocolError(f"`snapshot` member `server.remote.wait_s` should be a number, got {json.dumps(wait)}")
    # Downloads at once, and whether --fetch-concurrency pins them (absent from earlier 1.3 servers).
    if "fetch_concurrency" in remote:
        _check_member("snapshot", "server.remote.fetch_concurrency", remote["fetch_concurrency"], "uint")
    if "fetch_pinned" in remote and not isinstance(remote["fetch_pinned"], bool):
        raise ProtocolError("`snapshot` member `server.remote.fetch_pinned` should be a bool")
    return remote


# How many descriptors one recvmsg can take; a ring brings one, more than this is refused.
_MAX_FDS = 8
_FD = array.array("i")


def stats_message(
    steps: int,
    wait_ns: int,
    compute_ns: int,
    gpu_wait_ns: int | None = None,
    *,
    minor: int = PROTOCOL[1],
    gpu_decode: tuple[int, int, int] | tuple[int, int, int, int] | None = None,
) -> dict[str, Any]:
    """A ``stats`` message (control.md, ``stats``) for a session of protocol minor ``minor``.

    ``wait_ns`` is the whole time spent inside the requests for a batch; ``gpu_wait_ns`` (1.2, CUDA
    mode only: ``None`` leaves it out) the part of it spent behind the client's own GPU, so the
    wait for data is the difference. It is clamped to ``0 ..= wait_ns`` and sent only to 1.2 peers.
    ``gpu_decode`` (1.3, hybrid decode) is ``(samples, host ns, fallbacks)`` of the samples the
    client finished on its GPU, sent only to 1.3 peers, optionally with a fourth member, the part
    of the wait for data spent waiting for the client's GPU decodes (``gpu_decode_wait_ns``, sent
    only to 1.5 peers, clamped to ``0 ..= wait_ns - gpu_wait_ns``).
    """
    msg: dict[str, Any] = {"type": "stats", "steps": steps, "wait_ns": wait_ns, "compute_ns": compute_ns}
    if gpu_wait_ns is not None and minor >= 2:
        msg["gpu_wait_ns"] = min(max(gpu_wait_ns, 0), wait_ns)
    if gpu_decode is not None and minor >= 3:
        samples, ns, fallbacks = gpu_decode[:3]
        msg["gpu_samples"], msg["gpu_decode_ns"], msg["gpu_fallbacks"] = samples, ns, min(fallbacks, samples)
        if len(gpu_decode) > 3 and minor >= 5:
            data_wait = wait_ns - msg.get("gpu_wait_ns", 0)
            msg["gpu_decode_wait_ns"] = min(max(gpu_decode[3], 0), data_wait)
    return msg


def encode(message: Mapping[str, Any]) -> bytes:
    """Encodes one message as a frame: the length prefix, then canonical compact JSON.

    Raises:
        ValueError: the message has no string ``type``, holds a value JSON cannot carry (NaN, a
            lone surrogate), or its JSON is longer than 65,536 bytes.
    """
    if not isinstance(message.get("type"), str):
        raise ValueError(f"a message needs a string member `type`, got {message!r}")
    text = json.dumps(message, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False)
    payload = text.encode("utf-8")
    if len(payload) > MAX_FRAME_LEN:
        raise ValueError(
            f"the `{message['type']}` message is {len(payload)} bytes of JSON, over the frame limit of {MAX_FRAME_LEN}"
        )
    return LENGTH.pack(len(payload)) + payload


def check_length(length: int) -> None:
    """Raises ``ProtocolError`` unless ``length`` is an allowed frame length (``1 ..= 65536``)."""
    if not 1 <= length <= MAX_FRAME_LEN:
        raise ProtocolError(f"frame length {length} is outside 1..={MAX_FRAME_LEN}")


def decode_payload(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decodes a frame's payload (the bytes after the length prefix) to a message object.

    Checks, in this order: UTF-8, JSON, an object at the top, a string ``type``. Does not judge
    the type itself (see ``check_server_message``): both directions' messages decode here.

    Raises:
        ProtocolError: naming which rule the payload breaks.
    """
    try:
        text = bytes(payload).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"frame payload is not valid UTF-8 (byte {e.start})") from None
    try:
        value = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_parse_float,
            parse_int=_parse_int,
            object_pairs_hook=_unique_members,
        )
        if isinstance(value, (dict, list)) and _depth(value) >= _MAX_DEPTH:
            raise ValueError(f"nesting is {_MAX_DEPTH} or more containers deep")
        # A lone surrogate escape ("\ud800") parses in Python but is not Unicode text.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise ProtocolError(f"frame payload is not valid JSON: nesting is {_MAX_DEPTH} or more deep") from None
    except (UnicodeError, ValueError) as e:
        raise ProtocolError(f"frame payload is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"frame payload is a JSON {_json_kind(value)}, not an object")
    if "type" not in value:
        raise ProtocolError("message has no member `type`")
    if not isinstance(value["type"], str):
        raise ProtocolError(f"message member `type` is a JSON {_json_kind(value['type'])}, not a string")
    return value


def decode_frame(frame: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decodes exactly one whole frame (length prefix included), as the vectors give them.

    Raises:
        ProtocolError: a bad length, fewer or more bytes than the length says, or a bad payload.
    """
    frame = bytes(frame)
    if len(frame) < LENGTH.size:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than its 4-byte length prefix")
    (length,) = LENGTH.unpack_from(frame)
    check_length(length)
    body = len(frame) - LENGTH.size
    if body != length:
        raise ProtocolError(f"frame length prefix says {length} bytes but {body} follow")
    return decode_payload(frame[LENGTH.size :])


def check_server_message(message: dict[str, Any]) -> None:
    """Checks that a decoded message is one a server may send, with every required member.

    Unknown members are ignored (a newer minor may add them); an unknown ``type`` is refused.

    Raises:
        ProtocolError: a client-only or unknown type, or a required member missing or mistyped.
    """
    kind = message["type"]
    if kind not in SERVER_TYPES:
        if kind in CLIENT_TYPES:
            raise ProtocolError(f"the server sent a `{kind}` message, which only a client sends")
        raise ProtocolError(f"unknown message type {kind!r}")
    for member, want in _REQUIRED[kind].items():
        if member not in message:
            raise ProtocolError(f"`{kind}` message has no member `{member}`")
        _check_member(kind, member, message[member], want)
    for member, want in _OPTIONAL.get(kind, {}).items():
        if member in message:
            _check_member(kind, member, message[member], want)


def _check_member(kind: str, member: str, value: Any, want: str) -> None:
    ok = {
        "uint": lambda v: type(v) is int and v >= 0,
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "object": lambda v: isinstance(v, dict),
        "list[object]": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
        "version": lambda v: isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 0 for x in v),
    }[want](value)
    if not ok:
        expected = {
            "uint": "a non-negative integer",
            "str": "a string",
            "bool": "a boolean",
            "list[str]": "an array of strings",
            "object": "an object",
            "list[object]": "an array of objects",
            "version": "[major, minor]",
        }[want]
        raise ProtocolError(f"`{kind}` member `{member}` should be {expected}, got {json.dumps(value)}")


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}[type(value)]


def _parse_int(text: str) -> int:
    value = int(text)
    if not -MAX_INT <= value <= MAX_INT:
        raise ValueError(f"integer {text} is outside ±2^53")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"member {key!r} appears twice in one object")
        obj[key] = value
    return obj


class Connection:
    """The client's end of one control connection: a ``AF_UNIX`` stream socket, framed.

    ``send`` writes one message; ``recv`` returns the next message and, for ``ring``, its
    descriptor. ``recv`` keeps the bytes of a partly received frame between calls, so a timeout
    loses nothing and the next ``recv`` carries on.

    Args:
        sock: a connected ``AF_UNIX`` stream socket; the connection owns it from now on.
        name: what to call the peer in messages, e.g. ``"the ringfeed server at /run/x.sock"``.
        timeout: seconds ``recv`` waits for a whole frame before raising ``ringfeed.TimeoutError``;
            ``None`` waits for ever (a dead server is still noticed at once).
        timeout_hint: appended to timeout messages: the setting that changes the timeout.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        name: str = "the ringfeed server",
        timeout: float | None = None,
        timeout_hint: str = "",
    ) -> None:
        self.name = name
        self.timeout = timeout
        self.timeout_hint = timeout_hint
        self._sock: socket.socket | None = sock
        #: The bytes received so far of the frame being received: its prefix, then its payload.
        self._buf = bytearray()
        #: Descriptors that arrived with the frame being received (see the module's invariants).
        self._fds: list[int] = []

    @classmethod
    def connect(cls, path: str, *, timeout: float | None = None, timeout_hint: str = "") -> Connection:
        """Connects to the server socket at ``path``.

        Raises ``FileNotFoundError``/``ConnectionRefusedError`` when nothing listens there.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return cls(sock, name=f"the ringfeed server at {path}", timeout=timeout, timeout_hint=timeout_hint)

    @property
    def closed(self) -> bool:
        return self._sock is None

    def fileno(self) -> int:
        return self._socket().fileno()

    def close(self) -> None:
        """Closes the socket and any descriptor of a partly received frame. Idempotent."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        self._drop_fds()
        self._buf.clear()

    def send(self, message: Mapping[str, Any]) -> None:
        """Sends one message.

        Raises:
            ServerDiedError: the server has closed the connection.
            ringfeed.TimeoutError: the socket stayed full for longer than the timeout.
        """
        frame = encode(message)
        sock = self._socket()
        sock.settimeout(self.timeout)
        try:
            # MSG_NOSIGNAL: a closed peer is an EPIPE error here, never a SIGPIPE that kills the
            # training process (Python ignores SIGPIPE, but the application may not).
            sock.sendall(frame, socket.MSG_NOSIGNAL)
        except (BrokenPipeError, ConnectionResetError) as e:
            died = ServerDiedError(
                f"{self.name} closed the connection (it exited or was killed) before taking a "
                f"`{message['type']}` message"
            )
            # What the server sent before it went (often an `error` saying why) is still readable.
            died.unread = self._drain()
            raise died from e
        except builtins.TimeoutError as e:
            raise TimeoutError(
                f"{self.name} took no `{message['type']}` message within {self.timeout} s{self.timeout_hint}"
            ) from e

    def recv(self, timeout: float | EllipsisType | None = ...) -> tuple[dict[str, Any], int | None]:
        """Waits for the next whole frame and decodes it.

        Returns ``(message, fd)``: ``fd`` is the ring's descriptor for a ``ring`` message (the
        caller owns it), else ``None``. The message's type and members are not checked here.

        Args:
            timeout: overrides the connection's timeout for this call.

        Raises:
            ProtocolError: a malformed frame, or descriptors that break the rules.
            ServerDiedError: end of file or a reset, at once.
            ringfeed.TimeoutError: no whole frame within the timeout.
        """
        wait = self.timeout if timeout is ... else timeout
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            got = self._frame()
            if got is not None:
                return got
            self._fill(deadline, wait)

    def poll(self) -> tuple[dict[str, Any], int | None] | None:
        """Like ``recv``, but returns ``None`` instead of waiting when no whole frame is readable."""
        while True:
            got = self._frame()
            if got is not None:
                return got
            if not self._fill(None, None, block=False):
                return None

    # -- internals ------------------------------------------------------------------------------

    def _drain(self) -> list[dict[str, Any]]:
        """Every whole message still readable without waiting (descriptors closed), for post-mortems."""
        out: list[dict[str, Any]] = []
        with contextlib.suppress(ProtocolError, ServerDiedError, OSError):
            while (got := self.poll()) is not None:
                msg, fd = got
                if fd is not None:
                    os.close(fd)
                out.append(msg)
        return out

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise ServerDiedError(f"the connection to {self.name} is closed")
        return self._sock

    def _need(self) -> int:
        """How many more bytes the frame being received needs (never more: see the invariants)."""
        if len(self._buf) < LENGTH.size:
            return LENGTH.size - len(self._buf)
        (length,) = LENGTH.unpack_from(self._buf)
        return int(LENGTH.size + length - len(self._buf))

    def _frame(self) -> tuple[dict[str, Any], int | None] | None:
        """Decodes the frame in the buffer if it is whole, else returns ``None``."""
        if len(self._buf) < LENGTH.size or self._need() > 0:
            return None
        payload = bytes(self._buf[LENGTH.size :])
        fds, self._fds = self._fds, []
        self._buf.clear()
        try:
            message = decode_payload(payload)
        except ProtocolError:
            _close_all(fds)
            raise
        if message["type"] != "ring":
            # control.md: a receiver MUST close any descriptor that arrives with another frame.
            _close_all(fds)
            return message, None
        if len(fds) != 1:
            _close_all(fds)
            raise ProtocolError(f"a `ring` message must bring exactly one file descriptor, it brought {len(fds)}")
        return message, fds[0]

    def _fill(self, deadline: float | None, wait: float | None, *, block: bool = True) -> bool:
        """Receives more bytes of the current frame; returns ``False`` when none were ready (``block=False``)."""
        sock = self._socket()
        need = self._need()
        if block:
            if deadline is None:
                sock.settimeout(None)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout(wait)
                sock.settimeout(left)
        else:
            sock.settimeout(0.0)
        try:
            data, ancdata, msg_flags, _ = sock.recvmsg(
                need, socket.CMSG_SPACE(_MAX_FDS * _FD.itemsize), socket.MSG_CMSG_CLOEXEC
            )
        except (BlockingIOError, InterruptedError):
            if not block:
                return False
            raise
        except builtins.TimeoutError:
            raise self._timeout(wait) from None
        except ConnectionResetError as e:
            raise self._died() from e
        fds = _fds_of(ancdata)
        self._fds.extend(fds)
        if msg_flags & socket.MSG_CTRUNC:
            self._drop_fds()
            raise ProtocolError(f"{self.name} sent more than {_MAX_FDS} file descriptors with one message")
        if not data:
            raise self._died()
        self._buf += data
        if len(self._buf) == LENGTH.size:
            (length,) = LENGTH.unpack_from(self._buf)
            try:
                check_length(length)
            except ProtocolError:
                self._drop_fds()
                raise
        return True

    def _drop_fds(self) -> None:
        fds, self._fds = self._fds, []
        _close_all(fds)

    def _died(self) -> ServerDiedError:
        partial = f" in the middle of a frame ({len(self._buf)} bytes received)" if self._buf else ""
        return ServerDiedError(f"{self.name} closed the connection{partial}: the server exited or was killed")

    def _timeout(self, wait: float | None) -> TimeoutError:
        return TimeoutError(f"no message from {self.name} within {wait} s{self.timeout_hint}")


def _fds_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
