"""CPU time of this process and every process it started (Linux ``/proc``), for the benches'
CPU-seconds per image: the training loop's own threads, DataLoader workers, a sidecar the bench
started, DALI's threads (in-process). A descendant that exits inside the window takes its time
with it (it is counted only while it lives), so the benches keep their workers alive across the
timed steps."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> tuple[int, float] | None:
    """``(parent pid, user + system seconds)`` of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its end.
    rest = text[text.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / ticks


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds, so far, of ``root`` (this process) and its living descendants."""
    root = os.getpid() if root is None else root
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                parent[int(entry.name)], cpu[int(entry.name)] = st
    total = 0.0
    for pid, seconds in cpu.items():
        p = pid
        while p not in (root, 0, 1) and p in parent:
            p = parent[p]
        if p == root:
            total += seconds
    return total
