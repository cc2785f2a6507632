#!/usr/bin/env python3
"""Soak: many client processes on one `ringfeed serve` for a bounded time, watching for leaks.

    python3 benches/soak.py --out DIR [--seconds 600] [--clients 8] [--threads 2] [--images 512]
        [--batch-size 16] [--dataset DIR] [--array torch|numpy] [--interval 10] [--bin PATH]

Packs a synthetic dataset (``--images`` small JPEGs) unless ``--dataset`` is given, starts a
private server (``harness.Server``; the binary: ``--bin``, ``RINGFEED_BIN``, ``PATH`` or the
workspace build), and runs ``--clients`` processes that
each iterate epoch after epoch with ``ringfeed.Loader`` until ``--seconds`` have passed, checking
that every epoch delivers each sample exactly once (the ``index`` field). Meanwhile it samples the
server once a second: RSS, open descriptors, ring memfds and their mappings, threads.

Writes ``DIR/soak.json`` (every sample, every interval, every client's epochs) and ``DIR/soak.md``
(a summary): throughput per ``--interval`` seconds, the least-squares slope of the server's RSS
(KiB/min, after the first 10 % as warm-up and while every client is connected), the descriptor and thread counts before,
during and after, and the error count. Exits 1 when a client failed, an epoch's coverage was wrong,
or the server did not return to its pre-client descriptor, memfd and thread counts.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client-py" / "tests"))

from _fleet import Consumer, make_dataset, proc_stats, settle


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per minute."""
    n = len(points)
    if n < 2:
        return float("nan")
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return float("nan")
    return sum((t - mt) * (v - mv) for t, v in points) / var * 60.0


def steady(samples: list[dict[str, Any]], seconds: float, clients: int) -> list[tuple[float, float]]:
    """``(t, rss_kib)`` after the first 10 % (warm-up) and while every client still holds its ring
    (the rings' pages count in the server's RSS, so the last clients leaving is not a trend)."""
    return [(s["t"], s["rss_kib"]) for s in samples if s["t"] >= seconds * 0.1 and s["memfds"] == clients]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="the server's decode threads")
    ap.add_argument("--images", type=int, default=512, help="size of the synthetic dataset")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dataset", type=Path, default=None, help="a packed dataset instead of the synthetic one")
    ap.add_argument("--array", choices=("torch", "numpy"), default="torch", help="what the clients' batches are")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds per throughput interval")
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    # Resolved (and exported) before make_dataset, whose `ringfeed pack` then runs the same build.
    binary = harness.find_binary(a.bin)

    work = Path(tempfile.mkdtemp(prefix="rfsoak-", dir="/tmp"))
    dataset = a.dataset or make_dataset(work, a.images)
    # Stopped in the `finally` below, so that its exit status on SIGTERM is part of the result;
    # the `with` kills it if anything before that raised.
    with harness.Server(a.threads, binary=binary, log=a.out / "server.log") as server:
        samples: list[dict[str, Any]] = []
        clients: list[Consumer] = []
        try:
            before = proc_stats(server.pid)
            t_start = time.time()
            clients = [
                Consumer(
                    dataset,
                    server.sock,
                    batch_size=a.batch_size,
                    seconds=a.seconds,
                    tick=1.0,
                    seed=k,
                    torch=a.array == "torch",
                )
                for k in range(a.clients)
            ]
            for c in clients:
                c.wait_ready(timeout=300)
            t_ready = time.time()
            print(
                f"{a.clients} clients ready after {t_ready - t_start:.1f} s; soaking for {a.seconds:.0f} s", flush=True
            )
            next_print = time.monotonic() + 60
            while any(c.proc.poll() is None for c in clients):
                for c in clients:
                    c.poll()
                if server.alive():
                    samples.append({"t": time.time() - t_ready, **proc_stats(server.pid)})
                if time.monotonic() >= next_print:
                    s = samples[-1]
                    print(
                        f"  {s['t']:6.0f} s: rss {s['rss_kib']} KiB, fds {s['fds']}, threads {s['threads']}", flush=True
                    )
                    next_print += 60
                if time.time() - t_ready > a.seconds + 300:
                    break  # a client overran its deadline by 5 minutes: counted as an error below
                time.sleep(1.0)
            codes = [c.wait(timeout=10) for c in clients]
            # The server must hold no more than before any client: descriptors and memfds at once,
            # threads once tokio's idle blocking threads have exited (10 s). (Fewer descriptors than
            # the baseline is no leak: the baseline may include the start-up probe's connection,
            # which the server closes on its own time.)
            back, after, settle_s = settle(
                server.pid,
                lambda s: (
                    s["fds"] <= before["fds"]
                    and (s["memfds"], s["memfd_maps"]) == (0, 0)
                    and s["threads"] <= before["threads"]
                ),
                30,
            )
            server_alive = server.alive()
        finally:
            for c in clients:
                if c.proc.poll() is None:
                    c.proc.kill()
                    c.wait(10)
            server.stop()
            status = server.returncode

    # Throughput per interval, from every client's one-second ticks.
    ticks = [(t["tick"] - t_ready, t["batches"]) for c in clients for t in c.ticks()]
    n_intervals = max(1, math.ceil(a.seconds / a.interval))
    intervals = []
    for k in range(n_intervals):
        lo, hi = k * a.interval, (k + 1) * a.interval
        batches = sum(b for t, b in ticks if lo <= t < hi)
        intervals.append(
            {"from_s": lo, "to_s": hi, "batches": batches, "images_per_s": batches * a.batch_size / a.interval}
        )
    warm = steady(samples, a.seconds, a.clients)
    slope = slope_per_minute(warm)
    slope_all = slope_per_minute([(s["t"], s["rss_kib"]) for s in samples])
    per_client = []
    errors: list[str] = []
    for k, c in enumerate(clients):
        epochs = c.epochs()
        bad = [e for e in epochs if not (e["ok"] and e["dups"] == 0 and e["missing"] == 0)]
        per_client.append(
            {
                "client": k,
                "exit": codes[k],
                "epochs": len(epochs),
                "bad_epochs": bad,
                "batches": sum(e["batches"] for e in epochs),
                "errors": c.errors(),
            }
        )
        errors += [f"client {k}: {m}" for m in c.errors()]
        errors += [f"client {k}: epoch {e['epoch']} coverage wrong: {e}" for e in bad]
        if codes[k] != 0:
            errors.append(f"client {k} exited with status {codes[k]}: {c.stderr()[-500:]}")
        if not epochs:
            errors.append(f"client {k} completed no epoch")
    if not server_alive:
        errors.append("the server died")
    during = (
        {key: max(s[key] for s in samples) for key in ("fds", "memfds", "memfd_maps", "threads")} if samples else {}
    )
    rss = [s["rss_kib"] for s in samples]
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        },
        "binary": binary,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "dataset": str(dataset),
        "clients_ready_after_s": t_ready - t_start,
        "server": {
            "before_clients": before,
            "max_during": during,
            "after": after,
            "returned_to_baseline": back,
            "settle_s": settle_s,
            "exit_status_on_sigterm": status,
            "rss_kib": {
                "min": min(rss, default=0),
                "max": max(rss, default=0),
                "first": rss[0] if rss else 0,
                "last": rss[-1] if rss else 0,
            },
            "rss_slope_kib_per_min": slope,
            "rss_slope_kib_per_min_including_warmup": slope_all,
        },
        "intervals": intervals,
        "clients": per_client,
        "total_batches": sum(c["batches"] for c in per_client),
        "total_epochs": sum(c["epochs"] for c in per_client),
        "errors": errors,
        "error_count": len(errors),
        "samples": samples,
    }
    harness.write_record(a.out / "soak.json", result, args=a, indent=1)
    (a.out / "soak.md").write_text(summary(result, a))
    print(summary(result, a))
    return 0 if not errors and back else 1


def summary(r: dict[str, Any], a: argparse.Namespace) -> str:
    s = r["server"]
    lines = [
        f"# Soak: {a.clients} clients, {a.seconds:.0f} s",
        "",
        f"`{r['command']}` on {r['machine']['cpus']} CPUs ({r['machine']['platform']}), server `{r['binary']}` "
        f"with {a.threads} decode threads; batches of {a.batch_size} RandomResizedCrop(16)+flip, "
        f"{a.array} arrays.",
        "",
        f"- errors: **{r['error_count']}**" + ("" if not r["errors"] else ": " + "; ".join(r["errors"][:5])),
        f"- epochs completed: {r['total_epochs']} (every one checked: each sample exactly once), "
        f"batches: {r['total_batches']}",
        f"- server RSS: {s['rss_kib']['first']} KiB at the start, {s['rss_kib']['last']} KiB at the end "
        f"(min {s['rss_kib']['min']}, max {s['rss_kib']['max']}); least-squares slope "
        f"**{s['rss_slope_kib_per_min']:.2f} KiB/min** after the first 10 % and while every client ran "
        f"({s['rss_slope_kib_per_min_including_warmup']:.2f} including it)",
        f"- server before clients: {s['before_clients']}",
        f"- server at most during: {s['max_during']}",
        f"- server after clients left: {s['after']} (back to at most the pre-client fds and threads, no memfds: "
        f"**{s['returned_to_baseline']}**, in {s['settle_s']:.1f} s)",
        f"- server exit status on SIGTERM: {s['exit_status_on_sigterm']}",
        "",
        "| interval (s) | batches | images/s |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {i['from_s']:.0f}-{i['to_s']:.0f} | {i['batches']} | {i['images_per_s']:.0f} |" for i in r["intervals"]
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
