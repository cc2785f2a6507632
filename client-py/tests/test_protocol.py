"""The control protocol's framing and ``Connection`` (``proto/control.md``, "Framing").

The peer is the other end of a real ``socket.socketpair()`` (``AF_UNIX``, ``SOCK_STREAM``), so
descriptor passing, end of file and timeouts are the kernel's, not a mock's.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
import pickle
import socket
import struct
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ringfeed
from ringfeed import ProtocolError, ServerDiedError, ServerError
from ringfeed.wire import protocol
from ringfeed.wire.protocol import (
    MAX_FRAME_LEN,
    PROTOCOL,
    REMOTE_COUNTERS,
    Connection,
    check_server_message,
    decode_frame,
    decode_payload,
    encode,
    remote_stats,
    stats_message,
)


def frame(payload: bytes, length: int | None = None) -> bytes:
    return struct.pack("<I", len(payload) if length is None else length) + payload


@pytest.fixture
def pair() -> Iterator[tuple[Connection, socket.socket]]:
    """A client Connection and the raw socket of its peer."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = Connection(a, name="the test peer", timeout=5.0, timeout_hint=" (set `timeout`)")
    yield conn, b
    conn.close()
    b.close()


def memfd(name: str) -> int:
    fd = os.memfd_create(name)
    os.ftruncate(fd, 4096)
    return fd


def open_memfds(name: str) -> int:
    """How many of this process's descriptors refer to a memfd called ``name``."""
    n = 0
    for link in Path("/proc/self/fd").iterdir():
        try:
            target = str(link.readlink())
        except OSError:
            continue
        n += target.startswith(f"/memfd:{name} ")
    return n


def fd_target(fd: int) -> str:
    return str(Path(f"/proc/self/fd/{fd}").readlink())


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each ``os.close`` the protocol module makes closes (the descriptor's /proc link)."""
    seen: list[str] = []
    real = os.close

    def close(fd: int) -> None:
        with contextlib.suppress(OSError):
            seen.append(str(Path(f"/proc/self/fd/{fd}").readlink()).split(" ")[0])
        real(fd)

    monkeypatch.setattr(protocol, "os", types.SimpleNamespace(close=close))
    return seen


# -- encoding and decoding ------------------------------------------------------------------------


def test_protocol_version_is_the_specs() -> None:
    """This client speaks the version proto/control.md states, exported once as ringfeed.PROTOCOL."""
    title = (Path(__file__).resolve().parents[2] / "proto" / "control.md").read_text().splitlines()[0]
    major, minor = title.rsplit("version ", 1)[1].split(".")
    assert PROTOCOL == ringfeed.PROTOCOL == (int(major), int(minor))


def test_encode_is_compact_sorted_utf8() -> None:
    """Frames are a u32 LE length plus compact JSON with sorted keys and raw (unescaped) UTF-8."""
    f = encode({"type": "ready", "slot": 2, "run": 1, "seq": 7, "name": "café"})
    body = '{"name":"café","run":1,"seq":7,"slot":2,"type":"ready"}'.encode()
    assert f == struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    "message",
    [
        {"type": "hello", "protocol": [1, 0], "client": "ringfeed-py 0.1.0", "pid": 4242},
        {"type": "start", "epoch": 0, "first_batch": 2**53},
        {"type": "open", "dataset": "/d/ü/日本", "transform": {"kind": "resize", "size": [1, 4096]}, "x": None},
        {"type": "x", "f": 1.3333333333333333, "g": -0.0, "s": '\u2028\n\t"\\', "neg": -(2**53)},
        {"type": "e", "nested": [[[{"a": []}]]], "t": True, "f": False},
    ],
)
def test_round_trip(message: dict[str, Any]) -> None:
    """decode_frame(encode(m)) == m, for every JSON type, extreme integers and non-ASCII text."""
    assert decode_frame(encode(message)) == message


def test_largest_frame_round_trips_and_one_more_byte_is_refused() -> None:
    """A 65,536-byte payload is allowed; the encoder refuses 65,537 bytes."""
    pad = "x" * (MAX_FRAME_LEN - len('{"p":"","type":"t"}'))
    f = encode({"type": "t", "p": pad})
    assert len(f) == 4 + MAX_FRAME_LEN
    assert decode_frame(f)["p"] == pad
    with pytest.raises(ValueError, match="over the frame limit"):
        encode({"type": "t", "p": pad + "x"})


@pytest.mark.parametrize("bad", [{"no": "type"}, {"type": 1}, {"type": "x", "v": float("nan")}])
def test_encode_refuses_what_cannot_be_a_frame(bad: dict[str, Any]) -> None:
    """The encoder refuses a message without a string type, or with a value JSON cannot hold."""
    with pytest.raises(ValueError):  # noqa: PT011 - two different messages
        encode(bad)


REJECTED: list[tuple[str, bytes, str]] = [
    ("length 0", frame(b"", 0), r"frame length 0 is outside 1..=65536"),
    ("length 65537", frame(b"{}", 65537), r"frame length 65537 is outside"),
    ("length 2^32-1", frame(b"{}", 2**32 - 1), r"frame length 4294967295 is outside"),
    ("prefix only", b"\x05\x00", "shorter than its 4-byte length prefix"),
    ("fewer bytes than the length", frame(b'{"type":"x"}', 20), "says 20 bytes but 12 follow"),
    ("more bytes than the length", frame(b'{"type":"x"}', 5), "says 5 bytes but 12 follow"),
    ("invalid UTF-8", frame(b'{"type":"\xff"}'), "not valid UTF-8"),
    ("overlong UTF-8", frame(b'{"type":"\xc0\xaf"}'), "not valid UTF-8"),
    ("UTF-8 BOM", frame(b'\xef\xbb\xbf{"type":"x"}'), "not valid JSON"),
    ("not JSON", frame(b"hello"), "not valid JSON"),
    ("trailing garbage", frame(b'{"type":"x"} x'), "not valid JSON"),
    ("two objects", frame(b'{"type":"x"}{"type":"y"}'), "not valid JSON"),
    ("single quotes", frame(b"{'type':'x'}"), "not valid JSON"),
    ("NaN", frame(b'{"type":"x","v":NaN}'), "not valid JSON"),
    ("Infinity", frame(b'{"type":"x","v":-Infinity}'), "not valid JSON"),
    ("number overflow", frame(b'{"type":"x","v":1e400}'), "not valid JSON: number 1e400 is out of range"),
    ("integer beyond 2^53", frame(b'{"type":"x","v":9007199254740993}'), "outside ±2\\^53"),
    ("lone surrogate", frame(b'{"type":"x","v":"\\ud800"}'), "not valid JSON"),
    ("duplicate member", frame(b'{"type":"x","type":"y"}'), "'type' appears twice"),
    ("nesting 128 deep", frame(b'{"type":"x","v":' + b"[" * 127 + b"]" * 127 + b"}"), "128 or more"),
    ("an array", frame(b"[]"), "a JSON array, not an object"),
    ("a string", frame(b'"type"'), "a JSON string, not an object"),
    ("a number", frame(b"7"), "a JSON number, not an object"),
    ("null", frame(b"null"), "a JSON null, not an object"),
    ("true", frame(b"true"), "a JSON boolean, not an object"),
    ("no type", frame(b"{}"), "no member `type`"),
    ("type is a number", frame(b'{"type":1}'), "`type` is a JSON number, not a string"),
    ("type is null", frame(b'{"type":null}'), "`type` is a JSON null, not a string"),
    ("type is an object", frame(b'{"type":{"type":"x"}}'), "`type` is a JSON object, not a string"),
]


@pytest.mark.parametrize(("name", "data", "match"), REJECTED, ids=[r[0] for r in REJECTED])
def test_every_framing_rule_is_enforced(name: str, data: bytes, match: str) -> None:
    """Each malformed frame of control.md "Framing" ({name}) is a ProtocolError saying which rule it breaks."""
    with pytest.raises(ProtocolError, match=match):
        decode_frame(data)


def test_nesting_just_below_the_limit_is_accepted() -> None:
    """127 nested containers (the object included) decode, as serde_json allows."""
    payload = b'{"type":"x","v":' + b"[" * 126 + b"]" * 126 + b"}"
    assert decode_payload(payload)["type"] == "x"


def test_unknown_members_are_ignored_but_unknown_types_refused() -> None:
    """A server message may carry members this client does not know; an unknown type is an error."""
    check_server_message({"type": "ready", "run": 1, "seq": 1, "slot": 0, "from_the_future": {"x": 1}})
    with pytest.raises(ProtocolError, match="unknown message type 'teleport'"):
        check_server_message({"type": "teleport"})
    with pytest.raises(ProtocolError, match="`release` message, which only a client sends"):
        check_server_message({"type": "release", "slot": 0, "seq": 1})


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"type": "ready", "run": 1, "seq": 1}, "`ready` message has no member `slot`"),
        ({"type": "ready", "run": 1, "seq": 1, "slot": True}, "`ready` member `slot` should be a non-negative"),
        ({"type": "ready", "run": 1, "seq": 1.0, "slot": 0}, "`ready` member `seq` should be"),
        ({"type": "end", "run": 1, "epoch": -1, "batches": 0, "skipped": 0}, "`end` member `epoch`"),
        ({"type": "welcome", "protocol": [1]}, r"should be \[major, minor\]"),
        ({"type": "welcome", "protocol": [1, 0], "server": 5}, "`welcome` member `server` should be a string"),
        ({"type": "error", "code": "x", "message": "m"}, "no member `fatal`"),
        ({"type": "error", "code": "x", "message": "m", "fatal": 1}, "`fatal` should be a boolean"),
        ({"type": "error", "code": "x", "message": "m", "fatal": False, "sample": "3"}, "`sample` should be"),
        (
            {"type": "ring", "segment_len": 1, "dataset_len": 1, "samples_per_rank": 1, "batches_per_epoch": 1},
            "no member `classes`",
        ),
        (
            {
                "type": "ring",
                "segment_len": 1,
                "dataset_len": 1,
                "samples_per_rank": 1,
                "batches_per_epoch": 1,
                "classes": [1],
            },
            "`classes` should be an array of strings",
        ),
    ],
)
def test_required_members_are_checked(message: dict[str, Any], match: str) -> None:
    """A server message missing a required member, or with one of the wrong type, is a ProtocolError naming it."""
    with pytest.raises(ProtocolError, match=match):
        check_server_message(message)


# -- the connection -----------------------------------------------------------------------------


def test_frames_split_and_coalesced_arrive_whole(pair: tuple[Connection, socket.socket]) -> None:
    """A frame sent byte by byte, and several frames sent in one write, each arrive as one message."""
    conn, peer = pair
    one = encode({"type": "ready", "run": 1, "seq": 1, "slot": 0})
    for i in range(len(one)):
        peer.send(one[i : i + 1])
    assert conn.recv() == ({"type": "ready", "run": 1, "seq": 1, "slot": 0}, None)
    peer.sendall(b"".join(encode({"type": "end", "n": i}) for i in range(3)))
    assert [conn.recv()[0]["n"] for _ in range(3)] == [0, 1, 2]


def test_send_writes_one_frame(pair: tuple[Connection, socket.socket]) -> None:
    """send() writes exactly the encoded frame."""
    conn, peer = pair
    conn.send({"type": "release", "slot": 1, "seq": 2})
    assert peer.recv(100) == encode({"type": "release", "slot": 1, "seq": 2})


def test_ring_frame_brings_its_descriptor_close_on_exec(pair: tuple[Connection, socket.socket]) -> None:
    """The descriptor sent with a `ring` frame comes back with it, close-on-exec, referring to the same memfd."""
    conn, peer = pair
    fd = memfd("rf-ring")
    socket.send_fds(peer, [encode({"type": "ring", "segment_len": 4096})], [fd])
    os.close(fd)
    msg, got = conn.recv()
    assert msg["type"] == "ring"
    assert got is not None
    try:
        assert fd_target(got).startswith("/memfd:rf-ring ")
        assert fcntl.fcntl(got, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(got)


@pytest.mark.parametrize("kind", ["welcome", "ready", "end", "error", "teleport"])
def test_descriptors_on_other_frames_are_closed(
    pair: tuple[Connection, socket.socket], closes: list[str], kind: str
) -> None:
    """Descriptors attached to a frame other than `ring` (here `{kind}`) are closed; a later ring gets its own."""
    conn, peer = pair
    stray, mine = memfd("rf-stray"), memfd("rf-mine")
    socket.send_fds(peer, [encode({"type": kind})], [stray, stray])
    socket.send_fds(peer, [encode({"type": "ring"})], [mine])
    os.close(stray)
    os.close(mine)
    msg, fd = conn.recv()
    assert msg == {"type": kind}
    assert fd is None
    assert closes == ["/memfd:rf-stray", "/memfd:rf-stray"]
    assert open_memfds("rf-stray") == 0
    msg, fd = conn.recv()
    assert msg["type"] == "ring"
    assert fd is not None
    assert fd_target(fd).startswith("/memfd:rf-mine ")
    assert len(closes) == 2
    os.close(fd)


def test_descriptor_on_a_malformed_frame_is_closed(pair: tuple[Connection, socket.socket], closes: list[str]) -> None:
    """A descriptor arriving with a frame that does not decode is closed before the error is raised."""
    conn, peer = pair
    stray = memfd("rf-bad")
    socket.send_fds(peer, [frame(b"[1]")], [stray])
    os.close(stray)
    with pytest.raises(ProtocolError, match="not an object"):
        conn.recv()
    assert closes == ["/memfd:rf-bad"]


@pytest.mark.parametrize("count", [0, 2])
def test_ring_needs_exactly_one_descriptor(
    pair: tuple[Connection, socket.socket], closes: list[str], count: int
) -> None:
    """A `ring` frame with no descriptor, or with two, is a ProtocolError (and the two are closed)."""
    conn, peer = pair
    fds = [memfd("rf-two") for _ in range(count)]
    socket.send_fds(peer, [encode({"type": "ring"})], fds)
    for fd in fds:
        os.close(fd)
    with pytest.raises(ProtocolError, match=f"exactly one file descriptor, it brought {count}"):
        conn.recv()
    assert closes == ["/memfd:rf-two"] * count


def test_bad_length_is_refused_before_the_payload(pair: tuple[Connection, socket.socket]) -> None:
    """A bad length prefix is refused as soon as its 4 bytes arrive, without waiting for a payload."""
    conn, peer = pair
    peer.sendall(struct.pack("<I", 70000))
    t = time.monotonic()
    with pytest.raises(ProtocolError, match="frame length 70000"):
        conn.recv()
    assert time.monotonic() - t < 1


@pytest.mark.parametrize("partial", [b"", b"\x10\x00", frame(b'{"type":"x"}')[:9]])
def test_eof_is_server_died_at_once(pair: tuple[Connection, socket.socket], partial: bytes) -> None:
    """End of file, between frames or inside one, is ServerDiedError at once, not after the timeout."""
    conn, peer = pair
    conn.timeout = 30.0
    peer.sendall(partial)
    peer.close()
    t = time.monotonic()
    with pytest.raises(ServerDiedError, match="closed the connection"):
        conn.recv()
    assert time.monotonic() - t < 1


def test_peer_dying_while_we_wait_is_noticed_promptly(pair: tuple[Connection, socket.socket]) -> None:
    """A receive blocked on a live peer raises ServerDiedError as soon as that peer closes, not at the timeout."""
    conn, peer = pair
    conn.timeout = 30.0
    closer = threading.Timer(0.2, peer.close)
    closer.start()
    t = time.monotonic()
    with pytest.raises(ServerDiedError):
        conn.recv()
    elapsed = time.monotonic() - t
    closer.join()
    assert 0.15 < elapsed < 2


def test_reset_is_server_died(pair: tuple[Connection, socket.socket]) -> None:
    """Sending to a closed peer is ServerDiedError (EPIPE, never SIGPIPE)."""
    conn, peer = pair
    peer.close()
    with pytest.raises(ServerDiedError, match="before taking a `release` message"):
        conn.send({"type": "release", "slot": 0, "seq": 1})


def test_timeout_is_distinct_and_names_the_setting(pair: tuple[Connection, socket.socket]) -> None:
    """Silence past the timeout is ringfeed.TimeoutError (also a built-in TimeoutError), naming the setting."""
    conn, _ = pair
    t = time.monotonic()
    with pytest.raises(
        ringfeed.TimeoutError, match=r"no message from the test peer within 0.2 s \(set `timeout`\)"
    ) as e:
        conn.recv(timeout=0.2)
    assert 0.15 < time.monotonic() - t < 2
    assert isinstance(e.value, builtins.TimeoutError)
    assert not isinstance(e.value, ServerDiedError)


def test_timeout_mid_frame_loses_nothing(pair: tuple[Connection, socket.socket], closes: list[str]) -> None:
    """A timeout in the middle of a frame keeps the bytes received; the next recv completes the frame."""
    conn, peer = pair
    f = encode({"type": "ready", "run": 1, "seq": 1, "slot": 3})
    fd = memfd("rf-mid")
    socket.send_fds(peer, [f[:2]], [fd])  # the descriptor comes with the frame's first bytes
    os.close(fd)
    with pytest.raises(ringfeed.TimeoutError):
        conn.recv(timeout=0.1)
    peer.sendall(f[2:7])
    with pytest.raises(ringfeed.TimeoutError):
        conn.recv(timeout=0.1)
    peer.sendall(f[7:])
    assert conn.recv() == ({"type": "ready", "run": 1, "seq": 1, "slot": 3}, None)
    assert closes == ["/memfd:rf-mid"]  # it came with a `ready`, so it was closed


def test_poll_does_not_wait(pair: tuple[Connection, socket.socket]) -> None:
    """poll() returns None at once when no whole frame is readable, and the frame once it is."""
    conn, peer = pair
    assert conn.poll() is None
    f = encode({"type": "end"})
    peer.sendall(f[:3])
    assert conn.poll() is None
    peer.sendall(f[3:])
    assert conn.poll() == ({"type": "end"}, None)


def test_closed_connection_raises(pair: tuple[Connection, socket.socket]) -> None:
    """A closed connection raises ServerDiedError instead of touching a closed socket."""
    conn, _ = pair
    conn.close()
    conn.close()
    assert conn.closed
    with pytest.raises(ServerDiedError, match="is closed"):
        conn.recv()


def test_server_error_carries_code_sample_and_key() -> None:
    """ServerError keeps code, message, sample, key and fatal, says them in its text, and pickles."""
    e = ServerError("sample", "sample 17 does not decode", 17, "a/b.jpg", False)
    assert (e.code, e.message, e.sample, e.key, e.fatal) == (
        "sample",
        "sample 17 does not decode",
        17,
        "a/b.jpg",
        False,
    )
    assert str(e) == "sample 17 does not decode (sample 17, key 'a/b.jpg') [server error `sample`]"
    assert isinstance(e, ringfeed.RingfeedError)
    again = pickle.loads(pickle.dumps(e))
    assert (again.code, again.sample, again.key, again.fatal) == ("sample", 17, "a/b.jpg", False)


# -- the shared vectors ---------------------------------------------------------------------------

VECTORS = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "control"
needs_vectors = pytest.mark.skipif(
    not (VECTORS / "frames.json").exists(), reason="proto/vectors/control/ not generated yet (Rust wire_vectors)"
)


def load(name: str) -> list[dict[str, Any]]:
    return json.loads((VECTORS / name).read_text()) if (VECTORS / name).exists() else []


@needs_vectors
@pytest.mark.parametrize("case", load("frames.json"), ids=lambda c: c["name"])
def test_vector_frames_decode_and_encode_byte_for_byte(case: dict[str, Any]) -> None:
    """Each vector frame decodes to its message, and this encoder produces exactly the same bytes."""
    data = bytes.fromhex(case["frame"])
    message = decode_frame(data)
    assert message == case["message"]
    assert encode(case["message"]) == data
    if message["type"] in ("welcome", "ring", "ready", "end", "error") or "server" in message:
        check_server_message(message)


@needs_vectors
@pytest.mark.parametrize("case", load("frames.json"), ids=lambda c: c["name"])
def test_vector_frames_arrive_over_a_socket(pair: tuple[Connection, socket.socket], case: dict[str, Any]) -> None:
    """Each vector frame, written to a real socket, is received as its message."""
    conn, peer = pair
    data = bytes.fromhex(case["frame"])
    if case["message"]["type"] == "ring":
        fd = memfd("rf-vec")
        socket.send_fds(peer, [data], [fd])
        os.close(fd)
        msg, got = conn.recv()
        assert got is not None
        os.close(got)
    else:
        peer.sendall(data)
        msg, _ = conn.recv()
    assert msg == case["message"]


REASONS = {
    "length": "frame length",
    "json": "not valid (UTF-8|JSON)",
    "not_object": "not an object",
    "no_type": "`type`",
}


@needs_vectors
@pytest.mark.parametrize("case", load("bad_frames.json"), ids=lambda c: c["name"])
def test_vector_bad_frames_are_refused(pair: tuple[Connection, socket.socket], case: dict[str, Any]) -> None:
    """Each vector bad frame is refused, for its stated reason, by decode_frame and by a Connection."""
    data = bytes.fromhex(case["frame"])
    match = REASONS[case["reason"]]
    with pytest.raises(ProtocolError, match=match):
        decode_frame(data)
    conn, peer = pair
    peer.sendall(data)
    peer.close()
    with pytest.raises(ProtocolError, match=match):
        conn.recv()


@needs_vectors
def test_stats_messages_are_the_vectors() -> None:
    """The loader's `stats` message is the vectors' byte for byte: 1.2 with `gpu_wait_ns`, and without it to a 1.1
    server or from a loader with no GPU."""
    cases = {c["name"]: c for c in load("frames.json")}
    v12, v11 = cases["stats, 1.2 with gpu wait"], cases["stats"]
    m = v12["message"]
    assert encode(stats_message(m["steps"], m["wait_ns"], m["compute_ns"], m["gpu_wait_ns"])).hex() == v12["frame"]
    m = v11["message"]
    assert encode(stats_message(m["steps"], m["wait_ns"], m["compute_ns"], None)).hex() == v11["frame"]
    assert encode(stats_message(m["steps"], m["wait_ns"], m["compute_ns"], 7, minor=1)).hex() == v11["frame"]


@needs_vectors
def test_hybrid_stats_messages_are_the_vectors() -> None:
    """With hybrid decode the loader's `stats` is the 1.3 vector to a 1.3 (or 1.4) server and the 1.5 vector, with
    `gpu_decode_wait_ns`, to a 1.5 one (control.md, `stats`)."""
    cases = {c["name"]: c for c in load("frames.json")}
    v13, v15 = cases["stats, 1.3 with gpu decode"], cases["stats, 1.5 with gpu decode wait"]
    m = v15["message"]
    counts = (m["gpu_samples"], m["gpu_decode_ns"], m["gpu_fallbacks"], m["gpu_decode_wait_ns"])
    args = (m["steps"], m["wait_ns"], m["compute_ns"], m["gpu_wait_ns"])
    assert encode(stats_message(*args, gpu_decode=counts)).hex() == v15["frame"]
    for minor in (3, 4):
        assert encode(stats_message(*args, minor=minor, gpu_decode=counts)).hex() == v13["frame"]
    assert encode(stats_message(*args, gpu_decode=counts[:3])).hex() == v13["frame"]


def test_stats_message_keeps_the_gpu_decode_wait_within_the_wait_for_data() -> None:
    """`gpu_decode_wait_ns` is part of the wait for data, `wait_ns - gpu_wait_ns`: clamped to it."""
    assert stats_message(1, 100, 5, 30, gpu_decode=(4, 1, 0, 500))["gpu_decode_wait_ns"] == 70
    assert stats_message(1, 100, 5, None, gpu_decode=(4, 1, 0, 500))["gpu_decode_wait_ns"] == 100
    assert stats_message(1, 100, 5, 30, gpu_decode=(4, 1, 0, -1))["gpu_decode_wait_ns"] == 0


def test_stats_message_keeps_gpu_wait_within_the_wait() -> None:
    """`gpu_wait_ns` is part of `wait_ns` (control.md, `stats`): clamped to 0..=wait_ns."""
    assert stats_message(1, 10, 5, 25)["gpu_wait_ns"] == 10
    assert stats_message(1, 10, 5, -3)["gpu_wait_ns"] == 0


@needs_vectors
def test_the_remote_snapshot_vector_has_every_counter() -> None:
    """A 1.3 snapshot's `server.remote` (the vector) carries exactly REMOTE_COUNTERS, `wait_s`, `fetch_concurrency`
    and `fetch_pinned`, typed as control.md says; a snapshot without it reads as None, one missing a counter or with
    a mistyped fetch member is refused."""
    cases = {c["name"]: c for c in load("frames.json")}
    snap = cases["snapshot, 1.3 remote"]["message"]
    remote = remote_stats(snap)
    assert remote is not None
    assert set(remote) == {*REMOTE_COUNTERS, "wait_s", "fetch_concurrency", "fetch_pinned"}
    assert (remote["fetch_concurrency"], remote["fetch_pinned"]) == (6, False)
    assert remote_stats(cases["snapshot"]["message"]) is None
    damaged = {**snap, "server": {**snap["server"], "remote": {k: v for k, v in remote.items() if k != "retries"}}}
    with pytest.raises(ProtocolError, match="retries"):
        remote_stats(damaged)
    mistyped = {**snap, "server": {**snap["server"], "remote": {**remote, "fetch_pinned": 1}}}
    with pytest.raises(ProtocolError, match="fetch_pinned"):
        remote_stats(mistyped)


@needs_vectors
def test_a_remote_dataset_url_is_sent_unchanged() -> None:
    """An `s3://` dataset reaches `open.dataset` as given (the vector's); a local path is made absolute."""
    from ringfeed._options import dataset_path

    cases = {c["name"]: c for c in load("frames.json")}
    url = cases["open, 1.3 remote dataset"]["message"]["dataset"]
    assert dataset_path(url) == url
    assert dataset_path("rel/ds") == os.path.abspath("rel/ds")  # noqa: PTH100


def _fnv1a_64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def test_dataset_ids_are_the_specs_fnv1a_of_the_description() -> None:
    """``ring.dataset_id`` (control.md, "Dataset identity"): each vector's id is FNV-1a 64 of the
    description the spec lays out, recomputed here independently of the server's code."""
    cases = json.loads((VECTORS / "dataset_id.json").read_text())["cases"]
    assert len(cases) >= 5
    for case in cases:
        d = bytearray(b"ringfeed-dataset\0")
        d += struct.pack("<QI", case["len"], len(case["classes"]))
        for c in case["classes"]:
            raw = c.encode()
            d += struct.pack("<I", len(raw)) + raw
        shards = case["shards"] or []
        d += struct.pack("<I", len(shards)) + b"".join(struct.pack("<Q", s) for s in shards)
        tokens = case.get("tokens")
        if tokens is not None:
            d += struct.pack("<IBI", tokens["seq_len"], tokens["mode"], len(tokens["parts"]))
            d += b"".join(struct.pack("<4Q", *p) for p in tokens["parts"])
        assert f"{_fnv1a_64(bytes(d)):016x}" == case["id"], case["name"]
