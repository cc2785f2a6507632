"""Helpers for the tests that run the real `ringfeed` binary."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _fleet import binary

REPO = Path(__file__).resolve().parents[2]

try:
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

#: For the tests of the Triton kernels, which run them under Triton's interpreter on the CPU.
needs_triton = pytest.mark.skipif(
    not HAVE_TRITON and os.environ.get("CI") != "true",
    reason="triton is not installed (PyPI's torch wheels bring it; CI fails instead of skipping)",
)


def interpreted(code: str, *args: object, **env: str) -> None:
    """Runs ``code`` with ``args`` in a child Python under Triton's interpreter
    (``TRITON_INTERPRET=1``, chosen when a kernel is defined, hence the child), with the client on
    its path and ``env`` added; raises if it fails."""
    full = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO / "client-py"), **env)
    subprocess.run([sys.executable, "-c", code, *map(str, args)], env=full, check=True, timeout=600)


def ringfeed_bin() -> str:
    """The binary under test: $RINGFEED_BIN, else the workspace's debug or release build."""
    try:
        return binary()
    except RuntimeError as e:
        pytest.fail(str(e))


def restripe_conformance(
    make: Callable[..., Any], n: int, key: Callable[[Any], list[int]], *, batch: int, steps: int
) -> dict[tuple[int, int], list[int]]:
    """The resume conformance test of a global position (proto/control.md, "Resume by a global
    position"), for any loader: ``make(rank=, world_size=, batch_size=)`` opens one, ``key(batch)``
    gives the sample (or window) indices of a batch. Four ranks take ``steps`` batches of
    ``batch`` each and save their states (all the same position); then the job resumes at world 2,
    at world 3 and at world 3 with batch ``batch + 1``. Each resume must deliver every index not yet
    delivered exactly once (``n`` is chosen by the caller so that no ``drop_last`` tail is left).
    Returns what each resume delivered, by ``(world, batch)``."""
    head: list[int] = []
    states = []
    for rank in range(4):
        with make(rank=rank, world_size=4, batch_size=batch) as ld:
            it = iter(ld)
            for _ in range(steps):
                head += key(next(it))
            states.append(ld.state_dict())
    assert len({s["position"] for s in states}) == 1, "every rank holds the same global position"
    assert states[0]["position"] == 4 * batch * steps
    out = {}
    for world, b in ((2, batch), (3, batch), (3, batch + 1)):
        rest: list[int] = []
        for rank in range(world):
            with make(rank=rank, world_size=world, batch_size=b) as ld:
                ld.load_state_dict(states[rank % 4])
                rest += [i for x in ld for i in key(x)]
        both = head + rest
        assert sorted(both) == list(range(n)), f"world {world}, batch {b}: every index of the epoch exactly once"
        out[(world, b)] = rest
    return out


#: proto/vectors/control/frames.json, the control protocol's vectors.
FRAMES = REPO / "proto" / "vectors" / "control" / "frames.json"


def frame_vector(name: str) -> dict[str, Any]:
    """The message of the frames.json vector called `name`."""
    import json

    return next(c for c in json.loads(FRAMES.read_text()) if c["name"] == name)["message"]  # type: ignore[no-any-return]


def record_sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every message the client sends from now on (still sent), in order."""
    from ringfeed.wire import protocol

    sent: list[dict[str, Any]] = []
    real_send = protocol.Connection.send

    def record(self: Any, msg: dict[str, Any]) -> None:
        sent.append(msg)
        real_send(self, msg)

    monkeypatch.setattr(protocol.Connection, "send", record)
    return sent
