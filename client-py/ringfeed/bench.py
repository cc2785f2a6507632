"""``ringfeed bench DATASET`` (or ``python -m ringfeed.bench DATASET``): what ringfeed delivers on
this machine, from this dataset, beside a ``torch.utils.data.DataLoader`` decoding the same
samples with PIL.

For each thread count it measures, in one run on the same files and cores:

- **ringfeed**: a ``Loader`` with the chosen transform, fixed at that many decode threads
  (``autotune=False``), from a ``ringfeed serve`` this command starts on a private socket;
- **DataLoader + PIL**: the same samples read from the packed dataset (``PackedDataset``),
  decoded with PIL and transformed by the torchvision equivalent, with that many workers.

and, with ``--target IMG_PER_S``, how many threads (and workers) it takes to feed that rate: the
fewest measured that reach it, or, when none does, the count the best measured rate per thread
would need (marked as extrapolated, and a lower bound: no loader scales linearly).

Why Python: the baseline *is* Python (torch, PIL, torchvision), and the ringfeed figure is the
``Loader``'s, as a training loop sees it, so both sides run in one process the same way; the
``ringfeed bench`` subcommand of the binary runs this module with the binary itself as the server.

Rates are images delivered per second of wall time after a warm-up (batches the ring or the
workers may have prepared ahead are skipped), over at least ``--seconds`` and ``--batches``.
Nothing here is a pass/fail speed test; ``benches/`` holds those.

``--plot FILE.png`` draws the printed table as a bar chart (``plot``). It needs matplotlib
(``pip install matplotlib``), which is checked before anything is measured; nothing else here
imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ._errors import RingfeedError
from ._options import Server, Tuning
from ._transforms import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize
from .loader import Loader
from .wire import sidecar

__all__ = ["dataloader_rate", "main", "needed", "plot", "ringfeed_rate", "run"]

#: ``--transform`` names: the transforms ringfeed has today.
TRANSFORMS = ("rrc-flip", "rrc", "center", "resize")
#: Layout version of the ``--json`` report.
REPORT_VERSION = 1


def make_transform(name: str, size: int) -> Compose:
    """The ringfeed pipeline called ``name`` (one of ``TRANSFORMS``) at output ``size``."""
    if name == "rrc-flip":
        return Compose([RandomResizedCrop(size), RandomHorizontalFlip()])
    if name == "rrc":
        return Compose([RandomResizedCrop(size)])
    if name == "center":
        return Compose([Resize(min(4096, int(size / 0.875))), CenterCrop(size)])
    if name == "resize":
        return Compose([Resize((size, size))])
    raise ValueError(f"--transform must be one of {', '.join(TRANSFORMS)}, got {name!r}")


def torchvision_transform(t: Compose) -> Any:
    """torchvision's equivalent of ``t``, ending in a uint8 CHW tensor (``PILToTensor``)."""
    from torchvision import transforms as tv

    steps: list[Any] = []
    for op in t.ops:
        if isinstance(op, RandomResizedCrop):
            steps.append(tv.RandomResizedCrop(op.size, scale=op.scale, ratio=op.ratio, antialias=True))
        elif isinstance(op, RandomHorizontalFlip):
            steps.append(tv.RandomHorizontalFlip(op.p))
        elif isinstance(op, CenterCrop):
            steps.append(tv.CenterCrop(op.size))
        elif isinstance(op, Resize):
            steps.append(tv.Resize(list(op.size), antialias=True))
        else:
            raise ValueError(f"no torchvision equivalent for {op!r} in this benchmark")
    return tv.Compose([*steps, tv.PILToTensor()])


class PilSamples:
    """A map-style dataset over a packed dataset's samples: bytes → PIL (RGB) → torchvision.

    Picklable (the ``PackedDataset`` reopens by path in each worker).
    """

    def __init__(self, path: str, transform: Any) -> None:
        from .formats.reader import PackedDataset

        self.ds = PackedDataset(path)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import io

        from PIL import Image

        s = self.ds.sample(i)
        with Image.open(io.BytesIO(s.data)) as im:
            img = im.convert("RGB")
        return self.transform(img), s.label


def _timed(batches: Iterator[Any], warmup: int, min_batches: int, min_seconds: float) -> dict[str, Any]:
    """Skips ``warmup`` batches, then counts images until both minimums are met."""
    for _ in range(warmup):
        next(batches)
    images = count = 0
    start = time.perf_counter()
    while True:
        images += len(next(batches)[1])
        count += 1
        elapsed = time.perf_counter() - start
        if count >= min_batches and elapsed >= min_seconds:
            return {"images": images, "batches": count, "seconds": elapsed, "img_per_s": images / elapsed}


def _epochs(make_iter: Callable[[int], Iterator[Any]]) -> Iterator[Any]:
    epoch = 0
    while True:
        yield from make_iter(epoch)
        epoch += 1


def ringfeed_rate(
    dataset: str, transform: Compose, threads: int, *, batch_size: int, socket: str,
    min_batches: int, min_seconds: float,
) -> dict[str, Any]:  # fmt: skip
    """img/s of a ``Loader`` pinned at ``threads`` decode threads, from the server at ``socket``."""
    with Loader(
        dataset,
        batch_size,
        transform=transform,
        server=Server(socket=socket, spawn=False, timeout=120.0),
        tuning=Tuning(autotune=False, threads=threads),
        shuffle=True,
        drop_last=True,
    ) as ld:

        def epoch(e: int) -> Iterator[Any]:
            ld.set_epoch(e)
            return iter(ld)

        # The ring may hold finished batches before the clock starts: skip them.
        return _timed(_epochs(epoch), ld.slots + 2, min_batches, min_seconds)


def dataloader_rate(
    dataset: str, transform: Compose, workers: int, *, batch_size: int, min_batches: int, min_seconds: float
) -> dict[str, Any]:
    """img/s of ``torch.utils.data.DataLoader`` with ``workers`` workers (0: in this process)
    decoding the same samples with PIL and ``transform``'s torchvision equivalent."""
    import torch

    ds = PilSamples(dataset, torchvision_transform(transform))
    if len(ds) < batch_size:
        raise ValueError(f"{dataset} has {len(ds)} samples, fewer than --batch-size {batch_size}")
    dl = torch.utils.data.DataLoader(
        ds, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True,
        persistent_workers=workers > 0,
    )  # fmt: skip
    # Workers prefetch two batches each before the first is asked for: skip that many.
    return _timed(_epochs(lambda _e: iter(dl)), 2 * workers + 1, max(min_batches, 2 * workers), min_seconds)


def needed(points: Sequence[tuple[int, float]], target: float) -> dict[str, Any]:
    """The threads it takes to feed ``target`` img/s, from ``(threads, img/s)`` measurements.

    The fewest measured threads whose rate reaches the target (``extrapolated: False``); when none
    does, ``ceil(target / best rate per thread)`` (``extrapolated: True``, a lower bound).
    """
    for threads, rate in sorted(points):
        if rate >= target:
            return {"threads": threads, "extrapolated": False, "img_per_s": rate}
    per_thread = max(rate / threads for threads, rate in points)
    return {"threads": math.ceil(target / per_thread), "extrapolated": True, "img_per_s": None}


def default_threads(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    out, t = [], 1
    while t < cores:
        out.append(t)
        t *= 2
    return [*out, cores]


@contextlib.contextmanager
def private_server(threads: int) -> Iterator[str]:
    """``ringfeed serve`` on a socket in a fresh directory; yields the socket path."""
    binary = sidecar.find_server_binary()
    if binary is None:
        raise RingfeedError("no `ringfeed` binary to start: install the wheel, put it on PATH or set RINGFEED_BIN")
    work = Path(tempfile.mkdtemp(prefix="rfbench-", dir="/tmp"))
    sock = work / "ringfeed.sock"
    log = work / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [binary, "serve", "--socket", str(sock), "--threads", str(threads)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None:
                raise RingfeedError(f"`{binary} serve` exited with status {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RingfeedError(f"`{binary} serve` did not listen at {sock} within 30 s")
            time.sleep(0.02)
        yield str(sock)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def run(
    dataset: str, *, transform: str = "rrc-flip", size: int = 224, batch_size: int = 64,
    threads: Sequence[int] | None = None, baseline: bool = True, target: float | None = None,
    min_batches: int = 8, min_seconds: float = 3.0, progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Measures every thread count and returns the report (the ``--json`` layout)."""
    cores = len(os.sched_getaffinity(0))
    counts = sorted(set(threads)) if threads else default_threads(cores)
    if any(t < 1 for t in counts):
        raise ValueError(f"--threads must be positive integers, got {counts}")
    tf = make_transform(transform, size)
    dataset = os.path.abspath(dataset)  # noqa: PTH100 - the server needs it absolute
    if baseline and not (Path(dataset) / "index.rfi").is_file():
        raise ValueError(
            f"{dataset} is not a packed dataset, and the DataLoader + PIL baseline reads packed datasets only: "
            f"pass --no-baseline to measure ringfeed alone"
        )
    say = progress or (lambda _msg: None)
    points: list[dict[str, Any]] = []
    with private_server(max(counts)) as sock:
        for t in counts:
            say(f"ringfeed, threads={t}")
            r = ringfeed_rate(
                dataset, tf, t, batch_size=batch_size, socket=sock, min_batches=min_batches, min_seconds=min_seconds
            )
            points.append({"threads": t, "ringfeed": r, "dataloader_pil": None})
    if baseline:
        for p in points:
            say(f"DataLoader + PIL, workers={p['threads']}")
            p["dataloader_pil"] = dataloader_rate(
                dataset, tf, p["threads"], batch_size=batch_size, min_batches=min_batches, min_seconds=min_seconds
            )
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "dataset": dataset,
        "transform": repr(tf),
        "batch_size": batch_size,
        "cores": cores,
        "points": points,
        "target": None,
    }
    if target is not None:
        rf = [(p["threads"], p["ringfeed"]["img_per_s"]) for p in points]
        report["target"] = {"img_per_s": target, "ringfeed": needed(rf, target), "dataloader_pil": None}
        if baseline:
            dl = [(p["threads"], p["dataloader_pil"]["img_per_s"]) for p in points]
            report["target"]["dataloader_pil"] = needed(dl, target)
    return report


def render(report: dict[str, Any]) -> str:
    """The report as the table ``ringfeed bench`` prints."""
    lines = [
        f"ringfeed bench: {report['dataset']}, {report['transform']}, batch {report['batch_size']}, "
        f"{report['cores']} cores",
        "",
        f"{'threads':>7}  {'ringfeed img/s':>14}  {'DataLoader + PIL img/s':>22}  {'ringfeed / DataLoader':>21}",
    ]
    for p in report["points"]:
        rf = p["ringfeed"]["img_per_s"]
        dl = p["dataloader_pil"]
        base = f"{dl['img_per_s']:>22,.0f}" if dl else f"{'-':>22}"
        ratio = f"{rf / dl['img_per_s']:>20.1f}x" if dl else f"{'-':>21}"
        lines.append(f"{p['threads']:>7}  {rf:>14,.0f}  {base}  {ratio}")
    target = report["target"]
    if target is not None:
        lines.append("")
        lines.append(f"to feed {target['img_per_s']:,.0f} img/s:")
        for key, name, unit in (("ringfeed", "ringfeed", "threads"), ("dataloader_pil", "DataLoader + PIL", "workers")):
            n = target[key]
            if n is None:
                continue
            if n["extrapolated"]:
                lines.append(
                    f"  {name}: at least {n['threads']} {unit} (no measured count reached it; "
                    f"from the best rate per thread, and scaling is never linear)"
                )
            else:
                lines.append(f"  {name}: {n['threads']} {unit} (measured {n['img_per_s']:,.0f} img/s)")
    return "\n".join(lines) + "\n"


#: The message when ``--plot`` cannot draw.
NO_MATPLOTLIB = "--plot needs matplotlib, which is not installed: pip install matplotlib"


def _figure_class() -> Any:
    """matplotlib's ``Figure``, which draws without pyplot or a global backend, or a
    ``RingfeedError`` naming the install."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RingfeedError(NO_MATPLOTLIB) from None
    return Figure


def plot(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Draws the table ``render`` prints as a bar chart into ``path`` (a PNG): img/s by thread
    count for ringfeed and, when measured, the DataLoader + PIL, each bar labelled with its rate
    and the ringfeed bar with its ratio to the DataLoader."""
    figure = _figure_class()
    points = report["points"]
    baseline = all(p["dataloader_pil"] is not None for p in points)
    fig = figure(figsize=(max(4.0, 1.1 * len(points) + 2.5), 3.6))
    ax = fig.subplots()
    width = 0.38 if baseline else 0.6
    for i, p in enumerate(points):
        rf = p["ringfeed"]["img_per_s"]
        x = i - width / 2 if baseline else i
        ax.bar(x, rf, width, color="#1f77b4", label="ringfeed" if i == 0 else None)
        label = f"{rf:,.0f}"
        if baseline:
            dl = p["dataloader_pil"]["img_per_s"]
            ax.bar(i + width / 2, dl, width, color="#d62728", label="DataLoader + PIL" if i == 0 else None)
            ax.text(i + width / 2, dl, f"{dl:,.0f}", ha="center", va="bottom", fontsize=7)
            label += f"\n{rf / dl:.1f}x"
        ax.text(x, rf, label, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(points)), [str(p["threads"]) for p in points])
    ax.set_xlabel("decode threads (DataLoader: workers)")
    ax.set_ylabel("images/s")
    top = max(max(p["ringfeed"]["img_per_s"], (p["dataloader_pil"] or {}).get("img_per_s", 0.0)) for p in points)
    ax.set_ylim(0, 1.2 * top)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(frameon=False, fontsize=8)
    ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:,.0f}")
    ops = " + ".join(op for op in re.findall(r"(\w+)\(", report["transform"]) if op != "Compose")
    ax.set_title(
        f"ringfeed bench: {Path(report['dataset']).name}, {ops}\nbatch {report['batch_size']}, {report['cores']} cores",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110, metadata={"Software": None})


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="ringfeed bench",
        description="img/s by thread count on this machine and dataset: ringfeed beside DataLoader + PIL.",
    )
    ap.add_argument("dataset", help="a packed dataset (the DataLoader baseline reads the same samples)")
    ap.add_argument(
        "--transform", choices=TRANSFORMS, default="rrc-flip",
        help="rrc-flip: RandomResizedCrop + Flip (default); rrc; center: Resize + CenterCrop; resize",
    )  # fmt: skip
    ap.add_argument("--size", type=int, default=224, help="output side in pixels (default 224)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", help="comma-separated thread counts (default: 1, 2, 4, ... and all cores)")
    ap.add_argument("--target", type=float, metavar="IMG_PER_S", help="say how many threads feed this rate")
    ap.add_argument("--no-baseline", action="store_true", help="skip the DataLoader + PIL measurement")
    ap.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per measurement")
    ap.add_argument("--batches", type=int, default=8, help="minimum timed batches per measurement")
    ap.add_argument("--json", metavar="FILE", help="also write the report as JSON ('-': stdout only)")
    ap.add_argument("--plot", metavar="FILE.png", help="also draw the table as a bar chart (needs matplotlib)")
    a = ap.parse_args(argv)
    try:
        threads = [int(x) for x in a.threads.split(",")] if a.threads else None
    except ValueError:
        ap.error(f"--threads must be comma-separated integers, got {a.threads!r}")
    if a.plot:
        try:
            _figure_class()
        except RingfeedError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    try:
        report = run(
            a.dataset, transform=a.transform, size=a.size, batch_size=a.batch_size, threads=threads,
            baseline=not a.no_baseline, target=a.target, min_batches=a.batches, min_seconds=a.seconds,
            progress=lambda msg: print(f"measuring {msg} ...", file=sys.stderr, flush=True),
        )  # fmt: skip
    except (ValueError, RingfeedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.plot:
        plot(report, a.plot)
    if a.json == "-":
        print(json.dumps(report, indent=2))
        return 0
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    print(render(report), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
