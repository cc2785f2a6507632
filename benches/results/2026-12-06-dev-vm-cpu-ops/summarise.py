#!/usr/bin/env python3
"""Reads the criterion logs of this directory (``*-N.txt``) and writes results.json: each bench's
[low, median, high] time per image in µs, by log, and the old/new (before/after) ratios of the
medians.

    python3 benches/results/2026-12-06-dev-vm-cpu-ops/summarise.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNIT = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}
TIME = re.compile(r"time:\s+\[([\d.]+) (\S+) ([\d.]+) (\S+) ([\d.]+) (\S+)\]")
# transform/* benches time 16 images per iteration.
PER_ITER = {"transform/": 16}


def parse(path: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    name = None
    for line in path.read_text().splitlines():
        head = line.split()[0] if line.strip() else ""
        if "/" in head and not line.startswith(" ") and not head.startswith(("Benchmarking", "Found")):
            name = head
        m = TIME.search(line)
        if m and name and "change" not in line:
            vals = [float(m.group(i)) * UNIT[m.group(i + 1)] for i in (1, 3, 5)]
            n = next((k for p, k in PER_ITER.items() if name.startswith(p)), 1)
            out[name] = [round(v / n, 3) for v in vals]
            name = None
    return out


def main() -> None:
    logs = {p.stem: parse(p) for p in sorted(HERE.glob("*-[0-9].txt"))}
    ratios: dict[str, dict[str, float]] = {}
    for log, rows in logs.items():
        if log.startswith("photometric"):
            for name, v in rows.items():
                if name.endswith("/old") and name[:-3] + "new" in rows:
                    ratios.setdefault(name[:-4], {})[log] = round(v[1] / rows[name[:-3] + "new"][1], 2)
        elif "-after-" in log:
            before = logs.get(log.replace("-after-", "-before-"), {})
            for name, v in rows.items():
                if name in before:
                    ratios.setdefault(name, {})[log.replace("-after", "")] = round(before[name][1] / v[1], 2)
    record = {
        "machine": "2-core development VM (x86-64 with AVX2), shared with other engineers' builds",
        "unit": "µs per image, [low, median, high] of criterion's estimate",
        "logs": logs,
        "ratio_old_over_new_median": ratios,
    }
    (HERE / "results.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    for name, r in ratios.items():
        print(f"{name:40s} " + "  ".join(f"{k}: {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
