#!/usr/bin/env python3
"""Does killing clients slow the others down? A surviving client's delivery rate before, during and
after a loop of SIGKILLed clients on the same server.

    python3 benches/client_kills.py [--kills 100] [--window 3] [--threads 2] [--bin PATH] [--json OUT]

The timed counterpart of ``client-py/tests/test_killed_client.py`` (which asserts no leak and
exact coverage, and only prints rates). Each killed client is forked, opens a stream, and is
killed while open, holding a batch, or mid-stream, in turn. Rates are batches/s of the surviving
client (batch 8, RandomResizedCrop(16)+flip) over ``--window`` seconds alone, over the kill loop,
and over ``--window`` seconds after it. On a machine with few cores the killed clients' start-up
competes for CPU with the survivor, so "during" measures that competition as well as the server.
The server is a `harness.Server`; "before" is the baseline (`during_over_before`,
`after_over_before`), and `--json` writes a `harness` record.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client-py" / "tests"))

from _fleet import Consumer, Zygote, make_dataset, rate, sigkill


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    binary = harness.find_binary(a.bin)  # exported first: make_dataset's `ringfeed pack` runs it too
    dataset = make_dataset(Path(tempfile.mkdtemp(prefix="rfkb-", dir="/tmp")), 256)
    with harness.Server(a.threads, binary=binary) as server:
        consumer = Consumer(dataset, server.sock, batch_size=8, seconds=3600, tick=0.25)
        zygote = Zygote()
        try:
            consumer.wait_ready()
            while not consumer.epochs():
                consumer.poll(0.1)
            t0 = time.time()
            time.sleep(a.window)
            t1 = time.time()
            for k in range(a.kills):
                sigkill(zygote.spawn(("open", "hold", "stream")[k % 3], dataset, server.sock))
                consumer.poll()
            t2 = time.time()
            time.sleep(a.window)
            t3 = time.time()
            consumer.poll(0.5)
        finally:
            consumer.proc.terminate()
            consumer.wait(10)
            zygote.close()
    ticks = consumer.ticks()
    result = {
        "kills": a.kills,
        "kill_loop_s": t2 - t1,
        "batches_per_s": {"before": rate(ticks, t0, t1), "during": rate(ticks, t1, t2), "after": rate(ticks, t2, t3)},
        "errors": consumer.errors(),
        "bad_epochs": [e for e in consumer.epochs() if not e["ok"]],
    }
    r = result["batches_per_s"]
    result["during_over_before"] = r["during"] / r["before"]
    result["after_over_before"] = r["after"] / r["before"]
    print(json.dumps(result, indent=1))
    if a.json is not None:
        ratios = {"during": result["during_over_before"], "after": result["after_over_before"]}
        harness.write_record(a.json, result, args=a, baseline="before", ratios=ratios, indent=1)
    return 0 if not result["errors"] and not result["bad_epochs"] else 1


if __name__ == "__main__":
    sys.exit(main())
