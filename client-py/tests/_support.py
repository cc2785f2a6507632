"""Helpers for the tests that run the real `ringfeed` binary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ringfeed_bin() -> str:
    """The binary under test: $RINGFEED_BIN, else the workspace's debug or release build."""
    env = os.environ.get("RINGFEED_BIN")
    if env:
        return env
    for p in (REPO / "target" / "debug" / "ringfeed", REPO / "target" / "release" / "ringfeed"):
        if p.exists():
            return str(p)
    pytest.fail("no ringfeed binary: run `cargo build -p ringfeed` or set RINGFEED_BIN")
