#!/usr/bin/env python3
"""Decode + RandomResizedCrop(224) + flip rate by thread count, every loader in one run on the
same files and cores: libjpeg-turbo decode only (the physical limit of a whole-image decode),
ringfeed's transform alone on the files as given and as `ringfeed pack` stores them (rewritten
losslessly with restart markers, the same pixels), ringfeed's Loader end to end on the packed
dataset, DataLoader + PIL, DataLoader + torchvision.io.decode_jpeg and, when
`import datago` works, Photoroom's datago.

    python3 benches/e2e/cpu_scaling.py --images DIR --packed DIR [--threads 1,2,4,8,15]
        [--batches 24] [--warmup-s 12] [--pin] [--bin PATH] [--out DIR]

`corpus_rate` is `cargo build --release -p ringfeed --example corpus_rate` ($CORPUS_RATE_BIN, or
target/release/examples). Every Python-side loader (ringfeed's Loader, each on a private
`harness.Server` with that many threads, the DataLoaders, datago) runs `--warmup-s` seconds and at
least its own warm-up batches before the clock starts (the same for each), then `--batches`
batches or more are timed (`harness.measure`). Writes cpu.json (a `harness` record; baselines:
DataLoader + PIL, and the ratios against it and against DataLoader + torchvision.io), cpu.md and,
with matplotlib, cpu.png (img/s against threads) into --out.

datago (PyPI `datago`, tested with 2026.10.1) has no random crop and no flip. Its column reads
the same --images folder (file source, shuffled each pass) with its only geometric transform,
`crop_and_resize` restricted to one 1:1 bucket of 224: resize so the shorter side is 224
(Lanczos3), then a centre crop to 224x224, the same for every epoch; `image_to_rgb8` makes
greyscale files 3-channel. That is torchvision's Resize(224, LANCZOS) + CenterCrop(224), not
RandomResizedCrop(224) + flip, so the column is labelled as such. Its thread count is
DATAGO_MAX_TASKS, the decode tasks in flight (datago reads it at each start(); its tokio pool
has one thread per CPU whatever the setting). Samples arrive one at a time as 224x224x3 uint8
arrays; the bench stacks 256 of them into a batch on the main thread, and `harness.measure` counts
them as for the other loaders. While it waits for a sample, datago's reader spins on sched_yield, so
the main thread keeps a core busy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torchvision
from torchvision import transforms
from torchvision.io import decode_image
from torchvision.transforms import v2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness

BATCH = 256
DATAGO_LABEL = "datago (resize + centre crop 224, no random crop, no flip)"


def corpus_rate_bin() -> str:
    for cand in (os.environ.get("CORPUS_RATE_BIN"), "target/release/examples/corpus_rate"):
        if cand and Path(cand).exists():
            return cand
    raise SystemExit("build it: cargo build --release -p ringfeed --example corpus_rate (or set CORPUS_RATE_BIN)")


def native(images: Path, mode: str, threads: int) -> float:
    out = subprocess.run([corpus_rate_bin(), str(images), mode, str(threads), "1"], capture_output=True, text=True)
    # The last line is the rate; `-rs` modes first print what the rewrite did.
    return json.loads(out.stdout.strip().splitlines()[-1])["img_per_s"]


def timed(batches, warmup: int, count: int, warmup_s: float) -> float:
    """img/s over at least ``count`` batches, after ``warmup_s`` seconds and ``warmup`` batches."""
    return harness.measure(iter(batches), warmup_s=warmup_s, warmup_batches=warmup, min_batches=count)["img_per_s"]


class TvioFolder(torchvision.datasets.ImageFolder):
    """ImageFolder that decodes with torchvision.io (decode_jpeg for JPEGs) and crops tensors (v2)."""

    def __init__(self, root: str) -> None:
        super().__init__(root, loader=lambda p: Path(p).read_bytes())
        self.tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])

    def __getitem__(self, i: int):
        data, label = super().__getitem__(i)
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        img = decode_image(raw, mode=torchvision.io.ImageReadMode.RGB)  # decode_jpeg for JPEGs
        return self.tf(img), label


def dataloader(images: Path, workers: int, kind: str, batches: int, warmup_s: float) -> float:
    if kind == "pil":
        tf = transforms.Compose(
            [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
        )
        ds = torchvision.datasets.ImageFolder(str(images), transform=tf)
    else:
        ds = TvioFolder(str(images))
    dl = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, drop_last=True, persistent_workers=True
    )

    def forever():
        while True:
            yield from dl

    # Skip every batch the workers could have prefetched (2 per worker), and time at least four
    # times that many, so the figure is the workers' production rate, not a drained queue.
    return timed(forever(), 2 * workers + 2, max(batches, 8 * workers), warmup_s)


def ringfeed_loader(packed: Path, threads: int, batches: int, warmup_s: float, pin: bool = False) -> float:
    import ringfeed
    from ringfeed import bench

    tf = bench.make_transform("rrc-flip", 224)
    # Fixed settings: this measures the decode path, not the autotuner (benches/autotune.py).
    with (
        harness.Server(threads, ["--pin-threads"] if pin else []) as server,
        ringfeed.Loader(
            packed,
            BATCH,
            transform=tf,
            server=ringfeed.Server(socket=server.sock),
            tuning=ringfeed.Tuning(autotune=False, threads=threads),
            shuffle=True,
            drop_last=True,
        ) as ld,
    ):
        # Skip the batches the ring may already hold (4 slots) before timing starts.
        return timed(harness.epochs(ld), 6, batches, warmup_s)


def datago_installed() -> bool:
    try:
        import datago  # noqa: F401
    except ImportError:
        return False
    return True


def datago_loader(images: Path, threads: int, batches: int, warmup_s: float) -> float:
    import datago
    import numpy as np

    # Decode tasks in flight; read from the environment at each start().
    os.environ["DATAGO_MAX_TASKS"] = str(threads)
    config = {
        "source_type": "file",
        "source_config": {"root_path": str(images), "random_sampling": True, "rank": 0, "world_size": 1},
        # One 1:1 bucket: shorter side to 224 (Lanczos3), centre crop 224x224. No random crop exists.
        "image_config": {
            "crop_and_resize": True,
            "default_image_size": 224,
            "downsampling_ratio": 32,
            "min_aspect_ratio": 1.0,
            "max_aspect_ratio": 1.0,
            "image_to_rgb8": True,
        },
        "limit": 10**12,  # a pass ends when the folder does
        "samples_buffer_size": BATCH,
    }
    client = datago.DatagoClient(json.dumps(config))

    def forever():
        batch = []  # carried across passes: no decoded sample is dropped
        while True:
            client.start()  # one shuffled pass over the folder; reads return None at its end
            while (sample := client.get_sample()) is not None:
                batch.append(sample.image.to_numpy_array())  # read-only view of datago's buffer
                if len(batch) == BATCH:
                    stacked = torch.from_numpy(np.stack(batch))
                    if stacked.shape != (BATCH, 224, 224, 3):
                        raise RuntimeError(f"datago returned a batch of shape {tuple(stacked.shape)}")
                    yield (stacked,)
                    batch = []

    try:
        # Skip what the ready queue (BATCH samples) and the tasks in flight may already hold.
        return timed(forever(), 2, batches, warmup_s)
    finally:
        client.stop()
        os.environ.pop("DATAGO_MAX_TASKS", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--packed", type=Path, required=True)
    ap.add_argument("--threads", default="1,2,4,8,15")
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--out", type=Path, default=Path())
    ap.add_argument("--pin", action="store_true", help="also the Loader with `serve --pin-threads`")
    harness.add_arguments(ap)
    a = ap.parse_args()
    harness.find_binary(a.bin)
    with_datago = datago_installed()
    rows = []
    for t in [int(x) for x in a.threads.split(",")]:
        row = {
            "threads": t,
            "turbo_decode_only": native(a.images, "decode", t),
            "ringfeed_transform_unpacked": native(a.images, "rrc", t),
            "ringfeed_transform": native(a.images, "rrc-rs", t),
            "ringfeed_loader": ringfeed_loader(a.packed, t, a.batches, a.warmup_s),
            **(
                {"ringfeed_loader_pinned": ringfeed_loader(a.packed, t, a.batches, a.warmup_s, pin=True)}
                if a.pin
                else {}
            ),
            "dataloader_pil": dataloader(a.images, t, "pil", a.batches, a.warmup_s),
            "dataloader_tvio": dataloader(a.images, t, "tvio", a.batches, a.warmup_s),
            **({"datago": datago_loader(a.images, t, a.batches, a.warmup_s)} if with_datago else {}),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "datago": DATAGO_LABEL if with_datago else "not installed"}
    ratios = [
        {
            "threads": r["threads"],
            "ringfeed_loader_over_pil": harness.ratio(r["ringfeed_loader"], r["dataloader_pil"]),
            "ringfeed_loader_over_tvio": harness.ratio(r["ringfeed_loader"], r["dataloader_tvio"]),
        }
        for r in rows
    ]
    harness.write_record(a.out / "cpu.json", {**meta, "rows": rows}, args=a, baseline="dataloader_pil", ratios=ratios)
    cols = [
        "turbo_decode_only",
        "ringfeed_transform_unpacked",
        "ringfeed_transform",
        "ringfeed_loader",
        "dataloader_pil",
        "dataloader_tvio",
    ]
    if a.pin:
        cols.insert(4, "ringfeed_loader_pinned")
    if with_datago:
        cols.append("datago")
    labels = {"datago": DATAGO_LABEL}
    lines = [
        "# Decode + RandomResizedCrop(224) + flip, img/s by threads (DataLoader: workers)",
        "",
        "| threads | "
        + " | ".join(labels.get(c, c) for c in cols)
        + " | ringfeed loader / PIL | / tvio | transform / decode-only |",
        "|---:|" + "---:|" * (len(cols) + 3),
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | "
            + " | ".join(f"{r[c]:.0f}" for c in cols)
            + f" | {r['ringfeed_loader'] / r['dataloader_pil']:.2f}x"
            + f" | {r['ringfeed_loader'] / r['dataloader_tvio']:.2f}x"
            + f" | {r['ringfeed_transform'] / r['turbo_decode_only'] * 100:.0f} % |"
        )
    lines += [
        "",
        "ringfeed_transform_unpacked: ringfeed's transform on the files as they are;"
        " ringfeed_transform: on the same files rewritten with restart markers as `ringfeed pack` stores them"
        " (lossless: the same pixels), which lets a crop skip the Huffman decoding outside it;"
        " the loader reads the packed dataset.",
        "",
    ]
    if with_datago:
        lines.append(
            f"{DATAGO_LABEL}: datago has no random crop or flip; it resizes the shorter side to 224 (Lanczos3)"
            " and centre-crops 224x224 (its `crop_and_resize` with one 1:1 bucket), the same crop every epoch."
            " Threads are DATAGO_MAX_TASKS (decode tasks in flight); samples are stacked into batches of"
            f" {BATCH} on the main thread, whose reader spins on sched_yield while it waits."
        )
    else:
        lines.append("datago: not installed")
    base = rows[0]
    lines += ["", "Scaling efficiency from 1 thread to the last row:"]
    for c in cols:
        eff = rows[-1][c] / (base[c] * rows[-1]["threads"] / base["threads"]) * 100
        lines.append(f"- {labels.get(c, c)}: {eff:.0f} %")
    (a.out / "cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for c in cols:
            ax.plot([r["threads"] for r in rows], [r[c] for r in rows], marker="o", label=labels.get(c, c))
        ax.set_xlabel("threads (DataLoader: workers)")
        ax.set_ylabel("images/s")
        ax.set_title("Decode + RandomResizedCrop(224) + flip")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.out / "cpu.png", dpi=120)
    except ImportError:
        print("matplotlib is not installed: no plot")


if __name__ == "__main__":
    main()
