#!/usr/bin/env python3
"""The README's charts, drawn from the committed results JSON.

    python3 benches/charts.py [--out docs/charts] [--idle GPU_JSON]

Every chart reads only files under ``benches/results/``, listed below in ``TRAINING`` (with
``BESIDE_DATALOADER``), ``FEED``, ``RECIPES``, ``DALI_FEED`` and ``WAIT`` with the command that
wrote each one, so that every bar can be traced to a file and a command. It writes (each a PNG of well under 150 KB):

- ``training.png``: training throughput as a share of the model's own ceiling (the same model fed
  a batch already on the GPU), by loader and CPU threads; ResNet-18 and ResNet-50, the plain
  recipe (RandomResizedCrop + flip) and the TrivialAugment recipe. A panel without a committed
  run says so and names the command that would make one.
- ``feed-threads.png``: images/s without a model by CPU threads: ringfeed's Loader, the
  DataLoader with PIL or torchvision.io, and a whole-image libjpeg-turbo decode.
- ``feed-recipes.png``: the plain and the TrivialAugment recipes without a model, ringfeed
  against a DataLoader with torchvision v2, per thread count in ``RECIPES``' run (1: per core).
- ``feed-dali.png``: the feed without a model on 15 threads, ringfeed (CPU decode, hybrid
  decode) against DALI with the GPU's hardware decoder.
- ``wait-over-time.png``: the share of time a training loop waited for data, every 0.5 s, over
  one run from a cold start (ResNet-50, the autotuner choosing threads).
- ``gpu-idle-over-time.png``: the share of each 0.5 s the GPU sat idle, from the per-step gaps
  (``gpu_idle_steps``) that ``benches/e2e/gpu_train.py`` records, for each loader of ``IDLE``'s
  run (ResNet-18 + TrivialAugment, 6 threads), or of ``--idle GPU_JSON``.

Needs matplotlib (``pip install matplotlib``), a development tool only: neither the demo nor the
tests import this file.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

#: How each run's corpus is made: the standard ImageNet-like photos, packed.
CORPUS = "python3 benches/make_photos.py DIR --count 8000; ringfeed pack DIR PACKED"
GPU_TRAIN = "python3 benches/e2e/gpu_train.py --images DIR --packed PACKED"
#: What every PNG is written with: small, and the same bytes for the same data.
DPI = 110
PNG_META = {"Software": None}

LOADER_NAMES = {
    "ringfeed": "ringfeed, CPU decode",
    "ringfeed-hybrid": "ringfeed, hybrid decode (the default on a GPU)",
    "dali": "NVIDIA DALI, GPU decode",
    "dataloader-pil": "DataLoader + PIL",
    "dataloader-tv2": "DataLoader + torchvision v2",
}
#: The training chart's legend: one entry per colour, in this order.
TRAINING_LEGEND = {
    "ringfeed": "ringfeed, CPU decode",
    "ringfeed-hybrid": "ringfeed, hybrid decode (the default on a GPU)",
    "dali": "NVIDIA DALI, GPU decode",
    "dataloader-pil": "DataLoader (PIL; torchvision v2 for TrivialAugment)",
}
COLOURS = {
    "ringfeed": "#1f77b4",
    "ringfeed-hybrid": "#17becf",
    "dali": "#76b900",
    "dataloader-pil": "#d62728",
    "dataloader-tv2": "#d62728",
}


@dataclass(frozen=True)
class Run:
    """One committed result file, the CPU threads it ran with and the command that wrote it."""

    path: str
    threads: int
    command: str
    #: Which of the file's loaders to draw, in order.
    loaders: tuple[str, ...]
    #: Shown under the group: when this run differs from its panel's others.
    note: str = ""

    def load(self) -> dict[str, Any]:
        return json.loads((RESULTS / self.path).read_text())


#: Both models beside the DataLoader, before hybrid decode (one run holds both).
BESIDE_DATALOADER = Run(
    "2026-11-30-h200-host-3/gpu/gpu.json",
    15,
    f"{GPU_TRAIN} --models resnet50,resnet18 --workers 15 --steps 150",
    ("ringfeed", "dataloader-pil"),
    note="earlier run",
)
#: Training throughput, by (recipe, model): the groups of bars of one panel.
TRAINING: dict[tuple[str, str], list[Run]] = {
    ("plain", "resnet18"): [
        Run(
            "2026-12-02-h200-final/settled/r18-6/gpu.json",
            6,
            f"{GPU_TRAIN} --models resnet18 --loaders ceiling,ringfeed-share-0.625,ringfeed-hybrid,dali "
            "--workers 15 --threads-cap 6 --steps 400 --warmup-s 10",
            ("ringfeed-hybrid", "dali"),
        ),
        Run(
            "2026-12-02-h200-final/settled/r18-15/gpu.json",
            15,
            f"{GPU_TRAIN} --models resnet18 --loaders ceiling,ringfeed,ringfeed-hybrid,dali --workers 15 "
            "--steps 400 --warmup-s 10",
            ("ringfeed", "ringfeed-hybrid", "dali"),
        ),
        BESIDE_DATALOADER,
    ],
    ("plain", "resnet50"): [
        Run(
            "2026-12-02-h200-final/settled/r50-3/gpu.json",
            3,
            f"{GPU_TRAIN} --models resnet50 --loaders ceiling,ringfeed-hybrid,dali --workers 15 --threads-cap 3 "
            "--steps 200 --warmup-s 10",
            ("ringfeed-hybrid", "dali"),
        ),
        BESIDE_DATALOADER,
    ],
    ("trivialaugment", "resnet18"): [
        Run(
            "2026-12-06-h200-charts/ta-r18-6/gpu.json",
            6,
            f"{GPU_TRAIN} --models resnet18 --loaders ceiling,ringfeed,dali,dataloader-pil --recipe full "
            "--workers 6 --threads-cap 6 --steps 200 --warmup-s 12",
            ("ringfeed", "dali", "dataloader-pil"),
        ),
        Run(
            "2026-12-06-h200-charts/ta-r18-15/gpu.json",
            15,
            f"{GPU_TRAIN} --models resnet18 --loaders ceiling,ringfeed,dali,dataloader-pil --recipe full "
            "--workers 15 --steps 300 --warmup-s 12",
            ("ringfeed", "dali", "dataloader-pil"),
        ),
    ],
    ("trivialaugment", "resnet50"): [
        Run(
            "2026-12-06-h200-charts/ta-r50-6/gpu.json",
            6,
            f"{GPU_TRAIN} --models resnet50 --loaders ceiling,ringfeed,dali --recipe full --workers 6 "
            "--threads-cap 6 --steps 150 --warmup-s 12",
            ("ringfeed", "dali"),
        ),
        Run(
            "2026-12-06-h200-charts/ta-r50-15/gpu.json",
            15,
            f"{GPU_TRAIN} --models resnet50 --loaders ceiling,ringfeed,dali,dataloader-pil --recipe full "
            "--workers 15 --steps 150 --warmup-s 12",
            ("ringfeed", "dali", "dataloader-pil"),
        ),
    ],
}
#: The command that would fill a panel without a committed run (none is empty now).
MISSING: dict[tuple[str, str], str] = {}
RECIPE_NAMES = {"plain": "plain recipe", "trivialaugment": "TrivialAugment recipe"}
MODEL_NAMES = {"resnet18": "ResNet-18", "resnet50": "ResNet-50"}

FEED = Run(
    "2026-11-30-h200-host-3/cpu/cpu.json",
    0,
    "python3 benches/e2e/cpu_scaling.py --images DIR --packed PACKED --threads 1,4,8,15 --batches 24",
    ("ringfeed_loader", "dataloader_tvio", "dataloader_pil", "turbo_decode_only"),
)
FEED_NAMES = {
    "ringfeed_loader": ("ringfeed Loader", "#1f77b4", "o"),
    "dataloader_tvio": ("DataLoader + torchvision.io", "#ff7f0e", "s"),
    "dataloader_pil": ("DataLoader + PIL", "#d62728", "^"),
    "turbo_decode_only": ("libjpeg-turbo, whole-image decode only", "#7f7f7f", "x"),
}
RECIPES = Run(
    "2026-12-06-h200-charts/recipe/recipe.json",
    1,
    "python3 benches/e2e/recipe_rate.py --images DIR --packed PACKED --threads 1 --recipes rrc,full "
    "--batches 20 --device cuda",
    ("ringfeed", "dataloader-tv2"),
)
DALI_FEED = Run(
    "2026-12-02-h200-final/feed/hybrid_feed.json",
    15,
    "bash benches/e2e/h200_hybrid.sh final3 (hybrid_feed.py, 15 threads)",
    ("ringfeed, CPU only", "ringfeed, autotuned share", "DALI (hardware decoder)"),
)
WAIT = Run(
    "2026-11-30-h200-host-3/autotune-gpu/autotune.json",
    0,
    "python3 benches/autotune.py PACKED --out DIR --step-ms 40 --batch-size 256 --fixed 6,8,10,15 --seconds 12 "
    "--auto-seconds 40 --threads 16 --model resnet50 --skip-sim",
    ("auto",),
)


#: The GPU's idle share over one run, by loader: ResNet-18 with the TrivialAugment recipe on 6 threads.
IDLE = Run(
    "2026-12-06-h200-charts/ta-r18-6/gpu.json",
    6,
    TRAINING[("trivialaugment", "resnet18")][0].command,
    ("ringfeed", "dali", "dataloader-pil"),
)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or an error naming the install."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("benches/charts.py needs matplotlib: pip install matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, metadata=PNG_META)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def training_rows(run: Run) -> list[dict[str, Any]]:
    """``run``'s bars: each loader's img/s and share of the same file's ceiling for its model."""
    doc = run.load()
    rows = doc["runs"]
    out = []
    for r in rows:
        if r["loader"] not in run.loaders:
            continue
        ceiling = next(c for c in rows if c["loader"] == "ceiling" and c["model"] == r["model"])
        out.append(r | {"share": r["img_per_s"] / ceiling["img_per_s"], "ceiling": ceiling["img_per_s"]})
    return out


def training(out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6), sharey=True)
    width = 0.26
    used: set[str] = set()
    for (row, recipe), (col, model) in (
        (r, c) for r in enumerate(("plain", "trivialaugment")) for c in enumerate(("resnet18", "resnet50"))
    ):
        ax = axes[row][col]
        ax.set_title(f"{MODEL_NAMES[model]}, {RECIPE_NAMES[recipe]}", fontsize=9)
        groups = TRAINING[(recipe, model)]
        if not groups:
            ax.text(
                0.5, 0.5, "no committed run; to measure:\n" + MISSING[(recipe, model)],
                ha="center", va="center", transform=ax.transAxes, fontsize=7, color="#555555",
            )  # fmt: skip
            ax.set_xticks([])
            continue
        labels = []
        for g, run in enumerate(groups):
            bars = [r for r in training_rows(run) if r["model"] == model]
            start = g - width * (len(bars) - 1) / 2
            for i, r in enumerate(bars):
                x, share = start + i * width, 100 * r["share"]
                ax.bar(x, share, width * 0.92, color=COLOURS[r["loader"]])
                used.add(r["loader"])
                ax.text(x, share + 1.5, f"{share:.0f} %\n{r['img_per_s']:,.0f}", ha="center", va="bottom", fontsize=6.5)
            label = f"{run.threads} CPU threads"
            if run.note:
                label += f"\n({run.note}, {run.path[:10]})"
            labels.append(label)
        ax.set_xticks(range(len(groups)), labels)
        centre = (len(groups) - 1) / 2
        ax.set_xlim(centre - 1.5, centre + 1.5)
        ax.set_ylim(0, 125)
        ax.axhline(100, color="#999999", lw=0.8, ls="--")
        if col == 0:
            ax.set_ylabel("% of the model's ceiling (img/s below)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in TRAINING_LEGEND if k in used]
    names = [v for k, v in TRAINING_LEGEND.items() if k in used]
    fig.legend(handles, names, loc="lower center", ncol=2, frameon=False, fontsize=7.5)
    fig.suptitle(
        "Training throughput fed by each loader, as a share of the same model with its data already on the GPU\n"
        "one NVIDIA H200, 16 CPU cores; bf16, channels_last, batch 256; 8,000 ImageNet-like photos. "
        "Plain: RandomResizedCrop(224) + flip;\nTrivialAugment: the same + TrivialAugmentWide + RandomErasing(0.25)",
        fontsize=8.5,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.98))
    return save(fig, out / "training.png")


def feed_threads(out: Path) -> Path:
    plt = pyplot()
    rows = FEED.load()["rows"]
    threads = [r["threads"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for key in FEED.loaders:
        name, colour, marker = FEED_NAMES[key]
        ax.plot(threads, [r[key] for r in rows], marker=marker, color=colour, label=name)
    ax.set_xticks(threads)
    ax.set_xlabel("CPU threads (ringfeed: decode threads; DataLoader: workers)")
    ax.set_ylabel("images/s")
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    ax.set_title(
        "Decode + RandomResizedCrop(224) + flip, no model\n"
        "one NVIDIA H200 host, 16 CPU cores; 8,000 ImageNet-like photos",
        fontsize=9,
    )
    ax.legend(frameon=False)
    fig.tight_layout()
    return save(fig, out / "feed-threads.png")


def feed_recipes(out: Path) -> Path:
    plt = pyplot()
    runs = RECIPES.load()["runs"]
    counts = sorted({r["threads"] for r in runs})
    fig, axes = plt.subplots(1, len(counts), figsize=(3.8 * len(counts) + 0.6, 3.4), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, threads in zip(axes, counts, strict=True):
        for i, recipe in enumerate(("rrc", "full")):
            for j, loader in enumerate(RECIPES.loaders):
                r = next(x for x in runs if (x["recipe"], x["loader"], x["threads"]) == (recipe, loader, threads))
                x = i + (j - 0.5) * 0.38
                ax.bar(x, r["img_per_s"], 0.36, color=COLOURS[loader], label=LOADER_NAMES[loader] if i == 0 else None)
                ax.text(x, r["img_per_s"], f"{r['img_per_s']:,.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks([0, 1], ["plain", "TrivialAugment"])
        ax.set_title(f"{threads} CPU thread{'s' if threads > 1 else ''}", fontsize=8.5)
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    axes[0].set_ylabel("images/s")
    axes[0].legend(frameon=False, fontsize=7)
    fig.suptitle(
        "Augmentation recipes without a model, per CPU thread; one NVIDIA H200 host\n"
        "plain: RandomResizedCrop(224) + flip + Normalize; TrivialAugment: + TrivialAugmentWide + RandomErasing(0.25)",
        fontsize=8.5,
    )
    fig.tight_layout()
    return save(fig, out / "feed-recipes.png")


def feed_dali(out: Path) -> Path:
    plt = pyplot()
    runs = DALI_FEED.load()["runs"]
    cases = [("imagenet-like", "train"), ("imagenet-like", "eval"), ("1.5-3 MP", "train"), ("1.5-3 MP", "eval")]
    colours = dict(
        zip(DALI_FEED.loaders, (COLOURS["ringfeed"], COLOURS["ringfeed-hybrid"], COLOURS["dali"]), strict=True)
    )
    names = {
        "ringfeed, CPU only": "ringfeed, CPU decode",
        "ringfeed, autotuned share": "ringfeed, hybrid decode (autotuned share)",
        "DALI (hardware decoder)": "NVIDIA DALI, GPU decode",
    }
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    for i, (corpus, transform) in enumerate(cases):
        for j, loader in enumerate(DALI_FEED.loaders):
            r = next(x for x in runs if (x["corpus"], x["transform"], x["loader"]) == (corpus, transform, loader))
            x = i + (j - 1) * 0.27
            ax.bar(x, r["img_per_s"], 0.25, color=colours[loader], label=names[loader] if i == 0 else None)
            ax.text(x, r["img_per_s"], f"{r['img_per_s']:,.0f}", ha="center", va="bottom", fontsize=6.5)
    ax.set_xticks(
        range(len(cases)),
        [
            f"{'ImageNet-like' if c == 'imagenet-like' else '1.5-3 MP photos'}\n"
            f"{'RandomResizedCrop + flip' if t == 'train' else 'Resize + CenterCrop'}"
            for c, t in cases
        ],
    )
    ax.set_ylabel("images/s")
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    ax.set_title("The feed without a model, 15 CPU threads; one NVIDIA H200, 16 CPU cores", fontsize=9)
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return save(fig, out / "feed-dali.png")


def wait_over_time(out: Path) -> Path:
    plt = pyplot()
    scenario = WAIT.load()["scenarios"]["resnet50"]["auto"]
    tl = scenario["timeline"]
    t = [e["t"] for e in tl]
    fig, ax = plt.subplots(figsize=(6.8, 3.4))
    ax.plot(t, [100 * e["wait"] for e in tl], color="#d62728", label="training loop waiting for data (%)")
    ax.set_xlabel("seconds since the loader opened")
    ax.set_ylabel("% of the time waiting for data")
    ax.set_ylim(0, max(30, 100 * max(e["wait"] for e in tl) * 1.1))
    right = ax.twinx()
    right.step(t, [e["threads"] for e in tl], where="post", color="#1f77b4", label="decode threads (right)")
    right.set_ylabel("decode threads")
    right.set_ylim(0, 17)
    right.spines["right"].set_visible(True)
    lines = ax.get_lines() + right.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], frameon=False, loc="upper right")
    ax.set_title(
        f"ResNet-50 fed by ringfeed from a cold start, the autotuner choosing threads "
        f"({scenario['samples_per_s']:,.0f} img/s)\none NVIDIA H200, 16 CPU cores; every 0.5 s, as the server saw it",
        fontsize=8.5,
    )
    fig.tight_layout()
    return save(fig, out / "wait-over-time.png")


def gpu_idle_over_time(path: Path, out: Path, window: float = 0.5, title: str = "") -> Path:
    """The share of each ``window`` seconds the GPU sat idle, for every run of a ``gpu_train.py``
    result that has ``gpu_idle_steps`` ([seconds since the timed steps began, idle ms] per step)."""
    plt = pyplot()
    doc = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(6.8, 3.4))
    drawn = 0
    for r in doc["runs"]:
        steps = r.get("gpu_idle_steps")
        if not steps or r["loader"] == "ceiling":
            continue
        # Each gap is the interval [t - idle, t] before the step that began at t: spread over
        # the windows it covers, so that a gap longer than a window fills each one it spans.
        bins = [0.0] * (int(r["seconds"] // window) + 1)
        for t, idle_ms in steps:
            lo, hi = max(0.0, t - idle_ms / 1000), t
            for k in range(int(lo // window), min(int(hi // window), len(bins) - 1) + 1):
                bins[k] += max(0.0, min(hi, (k + 1) * window) - max(lo, k * window))
        xs = range(len(bins))
        shares = [100 * min(b / window, 1.0) for b in bins]
        name = LOADER_NAMES.get(r["loader"], r["loader"])
        if r["loader"] == "dataloader-pil" and r.get("recipe") == "full":
            name = "DataLoader + torchvision v2"
        ax.plot([(k + 1) * window for k in xs], shares, color=COLOURS.get(r["loader"]), label=name)
        drawn += 1
    if not drawn:
        sys.exit(f"{path}: no run has gpu_idle_steps (made by benches/e2e/gpu_train.py since they were added)")
    ax.set_xlabel("seconds since the timed steps began")
    ax.set_ylabel(f"% of each {window:g} s the GPU was idle")
    ax.set_ylim(0, 105)
    ax.legend(frameon=True, framealpha=0.95, edgecolor="none", loc="center right")
    ax.set_title(title or f"GPU idle between steps, on the GPU's clock ({path.parent.name})", fontsize=9)
    fig.tight_layout()
    return save(fig, out / "gpu-idle-over-time.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "charts", help="where the PNGs go (docs/charts)")
    ap.add_argument(
        "--idle", type=Path, help="draw gpu-idle-over-time.png from this gpu_train.py result instead of IDLE's"
    )
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    made = [training(a.out), feed_threads(a.out), feed_recipes(a.out), feed_dali(a.out), wait_over_time(a.out)]
    title = (
        "GPU idle between steps, on the GPU's clock: ResNet-18 + TrivialAugment, 6 CPU threads\n"
        "one NVIDIA H200; the timed steps after a 12 s warm-up"
    )
    made.append(gpu_idle_over_time(a.idle or RESULTS / IDLE.path, a.out, title="" if a.idle else title))
    for p in made:
        print(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: {p.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
