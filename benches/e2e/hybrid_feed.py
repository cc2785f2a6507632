#!/usr/bin/env python3
"""Feed rate with hybrid decode, no model: ringfeed CPU-only, ringfeed with a share of each batch
decoded by the GPU (pinned shares and the autotuner's), and NVIDIA DALI, in the same run.

    python3 benches/e2e/hybrid_feed.py --images DIR --packed DIR [--big-images DIR --big-packed DIR]
        [--transforms train,eval] [--threads 6,15] [--batches 40] [--settle 12] [--bin PATH] [--out DIR]
    python3 benches/e2e/hybrid_feed.py --make-big SRC DST --count 2000   # 1.5-3 MP photos from SRC

Every loader delivers 224x224 images normalised with ImageNet's mean and std, bf16 NCHW on the
GPU, batch 256, for each of `--transforms` on every corpus: `train` is RandomResizedCrop(224) +
flip (DALI: its training pipeline, `_dali.batches`), `eval` is Resize(256) + CenterCrop(224)
(DALI: its evaluation pipeline, `_dali.eval_batches`). The rate is batches x 256 over the wall
time of `--batches` batches (a third of them on the large photos) after 10 warm-up batches, with
the GPU synchronised at both ends; an autotuned row first runs `--settle` seconds (12) so that the
tuner settles (its interval is 0.5 s; each change of the share is judged about two intervals
later). ringfeed runs with `autotune=False` and exactly `threads`
decode threads (the GPU share pinned), and with the autotuner (threads bounded by `threads`, the
share its own); DALI with `num_threads=threads` and its hardware decoder. `--loaders` picks among
ringfeed (CPU only), hybrid (pinned shares, the geometry as matrix products and nvImageCodec image
by image: RINGFEED_GPU_FINISH=bmm), triton (pinned shares, the default path: nvJPEG's batched
decoder and the Triton kernel), auto (the autotuned share, the default path) and dali, the same
for each transform. The server is a `harness.Server` (15 threads); the timing is
`harness.measure` with `--settle` as the warm-up by time of autotuned rows only (a pinned row has
nothing to settle, and 72 rows of 12 s would not fit the device call). Writes hybrid_feed.json (a
`harness` record; the baseline is DALI at the same corpus, transform and threads) and
hybrid_feed.md: a row per corpus, transform, threads and loader.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import _cpu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py
import harness

BATCH = 256
WARMUP = 10
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TRANSFORMS = ("train", "eval", "ta", "ra", "aa", "full")


def _big_one(args: tuple[str, str, float]) -> int:
    from PIL import Image

    src, dst, scale = args
    with Image.open(src) as im:
        im = im.convert("RGB")
        big = im.resize((int(im.width * scale), int(im.height * scale)), Image.BICUBIC)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    big.save(dst, "JPEG", quality=90)
    return Path(dst).stat().st_size


def make_big(src: Path, dst: Path, count: int) -> None:
    """Upscales the first `count` images of `src` (ImageFolder) by 2.6-3.4x: 1.5-3 MP JPEGs."""
    from multiprocessing import Pool

    files = sorted(p for p in src.rglob("*.jpg"))[:count]
    jobs = [(str(f), str(dst / f.relative_to(src)), 2.6 + 0.8 * (i % 5) / 4) for i, f in enumerate(files)]
    with Pool(os.cpu_count()) as pool:
        sizes = pool.map(_big_one, jobs, chunksize=16)
    print(f"{len(sizes)} photos, {sum(sizes) / len(sizes) / 1e3:.0f} KB on average")


def ringfeed_transform(transform: str):
    """The ringfeed pipeline of `transform` (`train` or `eval`), as torchvision writes it."""
    import ringfeed

    if transform in ("ta", "ra", "aa", "full"):
        from _recipes import rf_recipe

        return rf_recipe(transform)
    if transform == "train":
        ops = [ringfeed.RandomResizedCrop(224), ringfeed.RandomHorizontalFlip()]
    elif transform == "eval":
        ops = [ringfeed.Resize(256), ringfeed.CenterCrop(224)]
    else:
        raise ValueError(f"--transforms: {transform!r} is not one of {', '.join(TRANSFORMS)}")
    return ringfeed.Compose([*ops, ringfeed.Normalize(MEAN, STD)])


def ringfeed_loader(
    packed: Path,
    sock: str,
    threads: int,
    share: object,
    autotune: bool,
    big: bool,
    transform: str = "train",
    device: str = "cuda",
):
    import ringfeed

    return ringfeed.Loader(
        packed,
        BATCH,
        ringfeed_transform(transform),
        device=device,
        dtype=torch.bfloat16,
        server=ringfeed.Server(socket=sock),
        tuning=ringfeed.Tuning(slots=4, threads=threads, autotune=autotune),
        gpu_decode=ringfeed.GPUDecode(share=share, bytes_per_sample=(1 << 20) if big else None),
        shuffle=True,
        drop_last=True,
    )


def dali_iter(images: Path, threads: int, transform: str = "train"):
    import _dali

    if transform == "eval":
        return _dali.eval_batches(images, threads, BATCH)
    return _dali.batches(images, threads, BATCH, recipe="rrc" if transform == "train" else transform)


def rate(batches, n: int, settle_s: float = 0.0) -> tuple[float, float]:
    """``(img/s, CPU ms per image)``: CPU of the bench's process tree, the sidecar with it (_cpu.py).
    ``settle_s``: seconds of batches before the warm-up (the autotuner's time to settle)."""
    harness.warm_up(batches, settle_s)
    r = harness.measure(
        batches, warmup_s=0.0, warmup_batches=WARMUP, min_batches=n, sync=torch.cuda.synchronize,
        clocks={"cpu_s": _cpu.tree_cpu_seconds},
    )  # fmt: skip
    return r["img_per_s"], r["cpu_s"] / r["images"] * 1e3


def measure(
    run: tuple[str, object, object],
    images: Path,
    packed: Path,
    big: bool,
    transform: str,
    threads: int,
    sock: str,
    batches: int,
    settle_s: float = 0.0,
) -> dict[str, object]:
    """One row's figures: `run` is `(kind, share, autotune)`; a third of `batches` on large photos;
    an autotuned row runs `settle_s` seconds before its warm-up."""
    kind, share, auto = run
    n = batches if not big else max(batches // 3, 8)
    r: dict[str, object] = {}
    if kind == "dali":
        r["img_per_s"], r["cpu_ms_per_img"] = rate(dali_iter(images, threads, transform), n)
        return r
    # The default geometry (the Triton kernel, with nvJPEG's batched decoder) but for `hybrid`.
    os.environ["RINGFEED_GPU_FINISH"] = "bmm" if kind == "rf-bmm" else "auto"
    with ringfeed_loader(packed, sock, threads, share, bool(auto), big, transform) as ld:
        r["img_per_s"], r["cpu_ms_per_img"] = rate(harness.epochs(ld), n, settle_s if auto else 0.0)
        st = ld.stats()
        r["gpu_samples"] = st.get("gpu_samples")
        sv = st.get("server") or {}
        r["server"] = {k: sv.get(k) for k in ("threads", "gpu_share", "busy", "limit", "tune")}
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-big", nargs=2, type=Path, metavar=("SRC", "DST"))
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--images", type=Path)
    ap.add_argument("--packed", type=Path)
    ap.add_argument("--big-images", type=Path)
    ap.add_argument("--big-packed", type=Path)
    ap.add_argument(
        "--transforms",
        default="train,eval",
        help="train (RandomResizedCrop + flip), eval (Resize + CenterCrop), or a recipe of _recipes.py "
        "(ta, ra, aa: the policy after the crop and flip; full: ta_wide's with erasing)",
    )
    ap.add_argument("--threads", default="6,15")
    ap.add_argument("--shares", default="0.5,0.75,1.0")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument(
        "--settle", type=float, default=12.0, help="seconds an autotuned row runs before its warm-up (to settle)"
    )
    ap.add_argument("--loaders", default="ringfeed,hybrid,triton,auto,dali")
    ap.add_argument("--out", type=Path, default=Path())
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    if a.make_big:
        make_big(*a.make_big, a.count)
        return
    transforms = a.transforms.split(",")
    for t in transforms:
        if t not in TRANSFORMS:
            ap.error(f"--transforms: {t!r} is not one of {', '.join(TRANSFORMS)}")
    results = []
    corpora = [("imagenet-like", a.images, a.packed, False)]
    if a.big_packed:
        corpora.append(("1.5-3 MP", a.big_images, a.big_packed, True))
    loaders = a.loaders.split(",")
    runs: list[tuple[str, tuple[str, object, object]]] = []
    if "ringfeed" in loaders:
        runs.append(("ringfeed, CPU only", ("rf", False, False)))
    if "hybrid" in loaders:
        runs += [(f"ringfeed, GPU share {s}, bmm", ("rf-bmm", float(s), False)) for s in a.shares.split(",")]
    if "triton" in loaders:
        # The same shares with the geometry in one Triton kernel (_finish_kernel.py).
        runs += [(f"ringfeed, GPU share {s}, triton", ("rf-triton", float(s), False)) for s in a.shares.split(",")]
    if "auto" in loaders:
        runs.append(("ringfeed, autotuned share", ("rf", "auto", True)))
    if "dali" in loaders:
        runs.append(("DALI (hardware decoder)", ("dali", None, None)))
    with harness.Server(15, binary=a.bin) as server:
        sock = server.sock
        for (corpus, images, packed, big), transform, threads, (name, run) in itertools.product(
            corpora, transforms, [int(t) for t in a.threads.split(",")], runs
        ):
            r: dict[str, object] = {"corpus": corpus, "transform": transform, "threads": threads, "loader": name}
            try:
                r.update(measure(run, images, packed, big, transform, threads, sock, a.batches, a.settle))
            except Exception as e:  # one loader's failure is a row, not the end of the run
                r["error"] = f"{type(e).__name__}: {e}"
            results.append(r)
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()
    a.out.mkdir(parents=True, exist_ok=True)
    ratios = harness.against(
        results, value="img_per_s", by=["corpus", "transform", "threads"], keep=["loader"],
        baseline=lambda r: r["loader"].startswith("DALI"),
    )  # fmt: skip
    harness.write_record(a.out / "hybrid_feed.json", {"runs": results}, args=a, baseline="DALI", ratios=ratios)
    lines = [
        "# Feed rate, no model: normalised bf16 224x224 on the GPU, batch 256",
        "",
        "Transforms: train = RandomResizedCrop(224) + flip (DALI: its training pipeline); ta, ra, aa = "
        "the same + TrivialAugmentWide, RandAugment(2, 9), AutoAugment (DALI: its own policy, on the GPU), "
        "eval = Resize(256) + CenterCrop(224) (DALI: its evaluation pipeline).",
        "",
        f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores; {a.batches} timed batches "
        f"(a third on the large photos) after {WARMUP} warm-up batches.",
        "",
        "| corpus | transform | threads | loader | img/s | CPU ms per image | GPU share (end) |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for r in results:
        val = f"{r['img_per_s']:.0f}" if "img_per_s" in r else f"failed: {r.get('error', '')[:80]}"
        cpu = f"{r['cpu_ms_per_img']:.3f}" if "cpu_ms_per_img" in r else "-"
        share = (r.get("server") or {}).get("gpu_share")
        lines.append(
            f"| {r['corpus']} | {r['transform']} | {r['threads']} | {r['loader']} | {val} | {cpu} "
            f"| {'-' if share is None else share} |"
        )
    (a.out / "hybrid_feed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
