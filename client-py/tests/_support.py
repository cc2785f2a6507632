"""Helpers for the tests that run the real `ringfeed` binary."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fleet import binary

REPO = Path(__file__).resolve().parents[2]


def ringfeed_bin() -> str:
    """The binary under test: $RINGFEED_BIN, else the workspace's debug or release build."""
    try:
        return binary()
    except RuntimeError as e:
        pytest.fail(str(e))
