"""The short CI version of ``benches/soak.py``: 8 client processes on one server for 15 s.

Asserts correctness and leaks only, never timing or throughput (the 10-minute run's figures are
in ``benches/results/*/soak/``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _fleet import REPO, client_env

CLIENTS = 8


def test_eight_clients_for_fifteen_seconds(tmp_path: Path) -> None:
    """8 clients iterating epochs for 15 s: no error, every epoch of every client delivers each
    sample exactly once, each client held one ring while it ran, and afterwards the server is back
    to its pre-client descriptors, memfds and threads."""
    out = tmp_path / "soak"
    cmd = [
        sys.executable, str(REPO / "benches" / "soak.py"), "--out", str(out), "--seconds", "15",
        "--clients", str(CLIENTS), "--images", "256", "--array", "numpy", "--interval", "5",
    ]  # fmt: skip
    r = subprocess.run(cmd, env=client_env(), capture_output=True, text=True, timeout=240)
    print(r.stdout[-3000:])
    result = json.loads((out / "soak.json").read_text())
    assert result["errors"] == []
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(result["clients"]) == CLIENTS
    for c in result["clients"]:
        assert c["exit"] == 0
        assert c["epochs"] >= 1, c
        assert c["bad_epochs"] == [], c
    server = result["server"]
    assert server["max_during"]["memfds"] == CLIENTS, server
    assert server["returned_to_baseline"], server
    assert (server["after"]["memfds"], server["after"]["memfd_maps"]) == (0, 0)
    assert server["exit_status_on_sigterm"] == 0
    assert (out / "soak.md").read_text().startswith(f"# Soak: {CLIENTS} clients")
