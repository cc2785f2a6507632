#!/usr/bin/env python3
"""Detection and segmentation training fed by each loader, against the same model's ceiling (issue 30).

    python3 benches/det_train.py --data DIR --packed DIR [--models retinanet,deeplab]
        [--loaders ceiling,ringfeed,dataloader] [--threads 6,15] [--batch 0] [--size 640] [--steps 30]
        [--seconds 0] [--warmup-s 12] [--warmup-steps 5] [--amp bf16] [--gpu-decode auto]
        [--device cuda] [--out DIR] [--bin PATH]

`--data`: what `benches/make_coco.py DIR` wrote (images, `annotations.json`, `masks/`);
`--packed`: the same set packed by `ringfeed pack DIR/images PACKED --coco DIR/annotations.json
--masks DIR/masks`.

Models (torchvision, random weights: `weights=None, weights_backbone=None`; 21 classes, VOC's 20
and the background):
- `retinanet`: `retinanet_resnet50_fpn`; `fasterrcnn`: `fasterrcnn_resnet50_fpn`. Their own
  transform neither resizes (`min_size = max_size = --size`, which the images already have) nor
  normalises (mean 0, std 1: the loaders normalise with ImageNet's mean and std). The loss is the
  sum of the model's losses.
- `deeplab`: `deeplabv3_resnet50` (no auxiliary head), channels_last, cross-entropy over the
  label map with 255 (padding) ignored.
SGD (momentum 0.9, weight decay 1e-4), `--amp bf16` autocast (or `fp16`, or `fp32`). When the
first step under autocast fails or gives a non-finite loss, the model runs in fp32 with TF32
matrix products instead, and the run says so (`amp`, `amp_fallback`). Under autocast,
torchvision's anchor generator makes its anchors in the feature maps' dtype (as in torchvision's
own `--amp` recipe, which uses fp16).

The recipe, one for both loaders (torchvision's large-scale jitter of the detection references,
with `RandomCrop(pad_if_needed)` for their `FixedSizeCrop`): `ScaleJitter((S, S))` (scale 0.1-2),
`RandomCrop(S, pad_if_needed=True)` (images padded with 0, label maps with 255),
`RandomHorizontalFlip()`, `SanitizeBoundingBoxes()`; then ImageNet's normalisation on the device.

Loaders, each giving the loop `(images, targets)` on the device: images float32 `[B, 3, S, S]`;
targets a list of `{"boxes", "labels"}` per image (detection) or the label maps `int64 [B, S, S]`
(segmentation):
- ceiling: the dataloader's first batch, made once and kept on the device: the rate the model
  reaches when it never waits for data (the same images and targets every step).
- ringfeed: `ringfeed.Loader` over `--packed` with the recipe (`ringfeed.ScaleJitter`, ...),
  `Targets(boxes="stored")` or `Targets(mask="stored", mask_fill=255)`, `Normalize` on the device
  (`device="cuda"`), hybrid decode `--gpu-decode`, the autotuner bounded at `--threads` decode
  threads, in a private server (`harness.Server`). Its padded `boxes [B, M, 4]`, `box_labels [B, M]`
  and `box_count [B]` become torchvision's list of dicts (`ringfeed.detection_targets`) on the
  device: one read of `box_count` a batch (a host sync a batch, not one an image; the models
  themselves check every image's boxes for degenerate ones with a sync each, so the GPU drains at
  every step whatever the loader), the rest views of the padded tensors. This conversion is inside the timed loop.
- dataloader: torchvision's reference scripts' shape: a Dataset reading each image with PIL and
  its targets from the COCO json (parsed here; no pycocotools) as `tv_tensors` (`BoundingBoxes`
  XYXY, `Mask`), the same recipe in torchvision v2, `ToImage` (uint8 tensors), a
  `DataLoader(num_workers=--threads, pin_memory, persistent_workers, shuffle, drop_last)` whose
  collate keeps lists; images and each target copied to the device one by one (as the references'
  `engine.py` does), stacked and normalised there.

ringfeed and dataloader run once per `--threads` count; the ceiling once per model. Each run warms
up for at least `--warmup-steps` steps and `--warmup-s` seconds, then times at least `--steps`
steps and `--seconds` seconds (`harness.timed`, the device synchronised at both ends). `--batch 0`
(the default) starts at each model's batch for an 80 GB GPU at `--size` (`BATCH`, scaled by
(640 / size)^2) and steps down by a quarter while the ceiling's first steps run out of memory; the
batch found is every loader's. It prints one JSON line per run: img/s, the ratio to the ceiling,
the loop's share in `next()` (and in the target conversion), CPU milliseconds per image and cores
busy (the whole process tree, `e2e/_cpu.py`), ringfeed's hybrid decode state, the last loss.
`--out` gets `det.json` (a `harness` record, each model's ceiling its baseline) and `det.md`,
rewritten after every run (a run cut short by a timeout keeps the runs before it). A run that
runs out of device memory is reported (`error`, under `failed`) and the others go on.

At toy size it runs on a CPU (`--device cpu --batch 2 --steps 1 --size 64 --amp fp32 --warmup-s 0
--warmup-steps 1`), as `client-py/tests/test_bench_det.py` does.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torch import nn

BENCHES = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHES / "e2e"))  # _cpu.py
sys.path.insert(0, str(BENCHES))  # harness.py
import _cpu  # noqa: E402
import harness  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CLASSES = 21
#: The label of label-map pixels no image pixel covers (padding): ignored by the loss.
IGNORE = 255
#: Each model's kind and its starting batch at 640 px on an 80 GB GPU in bf16 (`--batch 0`).
MODELS = {"retinanet": "detection", "fasterrcnn": "detection", "deeplab": "segmentation"}
BATCH = {"retinanet": 32, "fasterrcnn": 32, "deeplab": 24}

Targets = list[dict[str, torch.Tensor]] | torch.Tensor
Batch = tuple[torch.Tensor, Targets]


def make_model(name: str, size: int, device: str) -> nn.Module:
    from torchvision.models import detection, segmentation

    torch.manual_seed(0)
    if MODELS[name] == "detection":
        build = {"retinanet": detection.retinanet_resnet50_fpn, "fasterrcnn": detection.fasterrcnn_resnet50_fpn}[name]
        # The loaders give images of --size, normalised: the model's transform does neither again.
        m = build(
            weights=None, weights_backbone=None, num_classes=CLASSES, min_size=size, max_size=size,
            image_mean=[0.0, 0.0, 0.0], image_std=[1.0, 1.0, 1.0],
        )  # fmt: skip
        return m.to(device).train()
    m = segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=CLASSES, aux_loss=False)
    return m.to(device).to(memory_format=torch.channels_last).train()


def read_coco(data: Path) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """The COCO file's images in ascending id (the order `ringfeed pack --coco` and torchvision's
    `CocoDetection` use) and each image's annotations, crowds left out (as the references do)."""
    doc = json.loads((data / "annotations.json").read_text())
    images = sorted(doc["images"], key=lambda e: e["id"])
    anns: dict[int, list[dict[str, Any]]] = {e["id"]: [] for e in images}
    for a in doc["annotations"]:
        if not a.get("iscrowd"):
            anns[a["image_id"]].append(a)
    return images, anns


def tv_recipe(size: int, kind: str) -> Any:
    """The recipe in torchvision v2, on PIL images with `tv_tensors` targets, to uint8 tensors
    (`SanitizeBoundingBoxes` where there are boxes: torchvision's refuses a sample without)."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    sanitize = [v2.SanitizeBoundingBoxes()] if kind == "detection" else []
    return v2.Compose(
        [
            v2.ScaleJitter((size, size), antialias=True),
            v2.RandomCrop(size, pad_if_needed=True, fill={tv_tensors.Mask: IGNORE, "others": 0}),
            v2.RandomHorizontalFlip(),
            *sanitize,
            v2.ToImage(),
        ]
    )


class CocoSet(torch.utils.data.Dataset):
    """torchvision's reference style: an image read with PIL, its boxes (COCO xywh to xyxy) and
    labels, or its label map, as `tv_tensors`, through the v2 recipe."""

    def __init__(self, data: Path, kind: str, size: int) -> None:
        self.data, self.kind = data, kind
        self.images, self.anns = read_coco(data)
        self.tf = tv_recipe(size, kind)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        import numpy as np
        from PIL import Image
        from torchvision import tv_tensors

        entry = self.images[i]
        with Image.open(self.data / "images" / entry["file_name"]) as f:
            image = f.convert("RGB")
        target: dict[str, Any] = {}
        if self.kind == "detection":
            anns = self.anns[entry["id"]]
            xywh = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
            target["boxes"] = tv_tensors.BoundingBoxes(
                torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1),
                format="XYXY",
                canvas_size=(image.height, image.width),
            )
            target["labels"] = torch.tensor([a["category_id"] for a in anns], dtype=torch.int64)
        else:
            with Image.open(self.data / "masks" / (Path(entry["file_name"]).stem + ".png")) as m:
                target["mask"] = tv_tensors.Mask(torch.from_numpy(np.asarray(m, dtype=np.uint8).copy()))
        image, target = self.tf(image, target)
        return image.as_subclass(torch.Tensor), {k: v.as_subclass(torch.Tensor) for k, v in target.items()}


def keep_lists(batch: list[Any]) -> tuple[Any, ...]:
    """The references' `collate_fn`: a list of images and a list of targets."""
    return tuple(zip(*batch, strict=True))


class Device:
    """The device side every loader shares: ImageNet's normalisation, and targets as the model takes them."""

    def __init__(self, device: str, kind: str) -> None:
        self.device, self.kind = device, kind
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def from_host(self, images: tuple[torch.Tensor, ...], targets: tuple[dict[str, torch.Tensor], ...]) -> Batch:
        """A DataLoader batch (lists of uint8 images and target dicts) on the device, one tensor at a time."""
        dev = self.device
        x = torch.stack([im.to(dev, non_blocking=True) for im in images]).float().sub_(self.mean).div_(self.std)
        if self.kind == "detection":
            return x, [{k: v.to(dev, non_blocking=True) for k, v in t.items()} for t in targets]
        return x.contiguous(memory_format=torch.channels_last), torch.stack(
            [t["mask"].to(dev, non_blocking=True) for t in targets]
        ).long()


def dataloader_batches(a: argparse.Namespace, kind: str, workers: int, dev: Device) -> Iterator[Batch]:
    dl = torch.utils.data.DataLoader(
        CocoSet(a.data, kind, a.size),
        batch_size=a.batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=a.device == "cuda",
        persistent_workers=workers > 0,
        collate_fn=keep_lists,
    )
    while True:
        for images, targets in dl:
            yield dev.from_host(images, targets)


def ceiling_batches(a: argparse.Namespace, kind: str, dev: Device) -> Iterator[Batch]:
    """The dataloader's first batch (samples 0..B-1 through the recipe, seeded), kept on the device."""
    torch.manual_seed(0)
    ds = CocoSet(a.data, kind, a.size)
    images, targets = keep_lists([ds[i % len(ds)] for i in range(a.batch)])
    x, t = dev.from_host(images, targets)
    while True:
        yield x, t


def ringfeed_batches(
    a: argparse.Namespace, kind: str, threads: int, sock: str, info: dict[str, Any]
) -> Iterator[Batch]:
    import ringfeed

    detection = kind == "detection"
    sanitize = [ringfeed.SanitizeBoundingBoxes()] if detection else []
    ld = ringfeed.Loader(
        str(a.packed),
        a.batch,
        transform=ringfeed.Compose(
            [
                ringfeed.ScaleJitter((a.size, a.size)),
                ringfeed.RandomCrop(a.size, pad_if_needed=True),
                ringfeed.RandomHorizontalFlip(),
                *sanitize,
                ringfeed.Normalize(MEAN, STD),
            ]
        ),
        targets=ringfeed.Targets(boxes="stored") if detection else ringfeed.Targets(mask="stored", mask_fill=IGNORE),
        device=a.device,
        gpu_decode=a.gpu_decode,
        server=ringfeed.Server(socket=sock),
        tuning=ringfeed.Tuning(threads=threads),
        shuffle=True,
        drop_last=True,
    )
    info["loader"] = ld
    with ld:
        for b in harness.epochs(ld):
            t = time.perf_counter()
            if detection:
                targets: Targets = ringfeed.detection_targets(b)
            else:
                targets = b["mask"].long()
            info["convert_s"] = info.get("convert_s", 0.0) + time.perf_counter() - t
            yield b["image"], targets


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` says the device ran out of memory (cuDNN and cuBLAS say it in their own words)."""
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


class Trainer:
    """A fresh model and its optimizer; `step` trains on one batch under the run's precision."""

    def __init__(self, name: str, a: argparse.Namespace) -> None:
        self.kind, self.device = MODELS[name], a.device
        self.model = make_model(name, a.size, a.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.002, momentum=0.9, weight_decay=1e-4)
        self.amp = a.amp
        self.fallback: str | None = None
        self.scaler = torch.amp.GradScaler(a.device) if a.amp == "fp16" else None

    def loss(self, x: torch.Tensor, t: Targets) -> torch.Tensor:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.amp)
        with torch.autocast(self.device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            if self.kind == "detection":
                return sum(self.model(x, t).values())
            out = self.model(x)["out"]
        return F.cross_entropy(out.float(), t, ignore_index=IGNORE)

    def step(self, x: torch.Tensor, t: Targets) -> torch.Tensor:
        loss = self.loss(x, t)
        self.opt.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        return loss.detach()

    def first_step(self, x: torch.Tensor, t: Targets) -> None:
        """One step; under autocast, a failure or a non-finite loss moves the model to fp32 + TF32."""
        if self.amp == "fp32":
            self.step(x, t)
            return
        try:
            loss = self.step(x, t)
            if math.isfinite(float(loss)):
                return
            why = f"non-finite loss {float(loss)} under {self.amp} autocast"
        except RuntimeError as e:
            if out_of_memory(e):
                raise
            why = f"{self.amp} autocast failed: {str(e).splitlines()[0][:300]}"
        self.fallback, self.amp, self.scaler = why, "fp32", None
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        self.step(x, t)


def train(trainer: Trainer, batches: Iterator[Batch], a: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    """Trains `trainer`'s model on `batches`: the warm-up, then at least `--steps` steps and `--seconds`, timed."""
    first = [True]

    def step(batch: Batch) -> torch.Tensor | None:
        x, t = batch
        if first[0]:
            first[0] = False
            trainer.first_step(x, t)
            return None
        return trainer.step(x, t)

    def window() -> None:
        info["convert_s"] = 0.0

    m = harness.train_window(
        batches,
        step,
        warmup_s=a.warmup_s,
        warmup_steps=max(a.warmup_steps, 1),
        min_steps=a.steps,
        min_seconds=a.seconds,
        sync=torch.cuda.synchronize if a.device == "cuda" else None,
        clocks={"cpu_s": _cpu.tree_cpu_seconds},
        on_window=window,
    )
    cpu_s = m.pop("cpu_s")
    return m | {
        "convert_share": info["convert_s"] / m["seconds"],
        "cpu_ms_per_img": cpu_s / m["images"] * 1e3,
        "cpu_cores": cpu_s / m["seconds"],
        "amp": trainer.amp,
        "amp_fallback": trainer.fallback,
    }


def fit_batch(name: str, a: argparse.Namespace, dev: Device) -> int:
    """`--batch`, or with 0 the largest of the model's start, stepped down by a quarter, whose
    ceiling runs 2 steps without running out of device memory."""
    if a.batch:
        return a.batch
    b = max(1, round(BATCH[name] * (640 / a.size) ** 2))
    while True:
        a.batch = b
        try:
            trainer = Trainer(name, a)
            it = ceiling_batches(a, MODELS[name], dev)
            for _ in range(2):
                trainer.first_step(*next(it))
            return b
        except RuntimeError as e:
            if b == 1 or not out_of_memory(e):
                raise
            b = max(1, b * 3 // 4)
        finally:
            trainer = it = None  # type: ignore[assignment]
            gc.collect()
            if a.device == "cuda":
                torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="make_coco.py's output directory")
    ap.add_argument("--packed", type=Path, required=True, help="the same set packed by `ringfeed pack --coco --masks`")
    ap.add_argument("--models", default="retinanet", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--loaders", default="ceiling,ringfeed,dataloader")
    ap.add_argument("--threads", default="6", help="decode threads / DataLoader workers, comma-separated")
    ap.add_argument("--batch", type=int, default=0, help="0: the largest that fits, from the model's start")
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=0.0, help="time at least this long too (whole steps)")
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--amp", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--gpu-decode", default="auto", help="ringfeed's gpu_decode: auto, off (False) or a share")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=None, help="write det.json and det.md here")
    harness.add_arguments(ap)
    a = ap.parse_args()
    named = {"auto": "auto", "off": False, "on": True}
    a.gpu_decode = named[a.gpu_decode] if a.gpu_decode in named else float(a.gpu_decode)
    models, loaders = a.models.split(","), a.loaders.split(",")
    for what, given, known in (
        ("--models", models, list(MODELS)),
        ("--loaders", loaders, ["ceiling", "ringfeed", "dataloader"]),
    ):
        if set(given) - set(known):
            ap.error(f"{what}: unknown {sorted(set(given) - set(known))}; known: {', '.join(known)}")
    threads = [int(t) for t in a.threads.split(",")]
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
    runs: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []  # runs that ran out of device memory
    batch_flag = a.batch
    with harness.Server(max(threads), binary=a.bin) as server:
        for name in models:
            kind = MODELS[name]
            dev = Device(a.device, kind)
            a.batch = batch_flag
            a.batch = fit_batch(name, a, dev)
            plan = [("ceiling", 0)] if "ceiling" in loaders else []
            plan += [(ld, t) for t in threads for ld in ("ringfeed", "dataloader") if ld in loaders]
            for loader, t in plan:
                info: dict[str, Any] = {}
                batches = {
                    "ceiling": lambda: ceiling_batches(a, kind, dev),  # noqa: B023 - called at once
                    "ringfeed": lambda: ringfeed_batches(a, kind, t, server.sock, info),  # noqa: B023
                    "dataloader": lambda: dataloader_batches(a, kind, t, dev),  # noqa: B023
                }[loader]()
                r = {"model": name, "loader": loader, "threads": t or None, "batch": a.batch, "size": a.size}
                try:
                    r |= train(Trainer(name, a), batches, a, info)
                except RuntimeError as e:
                    # A batch that fit the probe's steps can still run out with other targets: the
                    # run is reported as such and the others go on.
                    if not out_of_memory(e):
                        raise
                    r["error"] = str(e).splitlines()[0][:300]
                    print(json.dumps(r), flush=True)
                    info.pop("loader", None)
                    batches.close()
                    del batches
                    gc.collect()
                    torch.cuda.empty_cache()
                    failed.append(r)
                    continue
                if "loader" in info:
                    ld = info.pop("loader")
                    r["gpu_decode_reason"] = ld.gpu_decode_reason
                    r["gpu_samples"] = ld.stats(server=False).get("gpu_samples")
                    del ld
                batches.close()  # ends the loader: its stream, or the DataLoader's workers
                del batches
                gc.collect()
                ceiling = next((x["img_per_s"] for x in runs if x["model"] == name and x["loader"] == "ceiling"), None)
                r["ratio"] = harness.ratio(r["img_per_s"], ceiling if loader != "ceiling" else r["img_per_s"])
                runs.append(r)
                print(json.dumps(r), flush=True)
                if a.out is not None:  # after every run: a call cut short by its timeout keeps what ran
                    write(a, runs, failed, quiet=True)
                if a.device == "cuda":
                    torch.cuda.empty_cache()
    if a.out is not None:
        write(a, runs, failed)


def write(a: argparse.Namespace, runs: list[dict[str, Any]], failed: list[dict[str, Any]], quiet: bool = False) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    ratios = [{k: r[k] for k in ("model", "loader", "threads", "ratio")} for r in runs]
    images, anns = read_coco(a.data)
    data = {"images": len(images), "objects": sum(len(v) for v in anns.values()), "data": str(a.data)}
    harness.write_record(
        a.out / "det.json", {"data": data, "runs": runs, "failed": failed}, args=a, baseline="ceiling", ratios=ratios
    )
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    lines = [
        "# Detection and segmentation training fed by each loader (torchvision models, random weights)",
        "",
        f"{gpu}, {harness.cpu_model()}; {a.size} px, ScaleJitter + RandomCrop(pad_if_needed) + flip "
        f"(+ SanitizeBoundingBoxes for boxes); {data['images']} COCO-style images "
        f"({data['objects']} objects); at least "
        f"{a.steps} timed steps and {a.seconds:g} s after at least {a.warmup_steps} steps and {a.warmup_s:g} s "
        "of warm-up.",
        "",
        "| model | batch | precision | loader | threads | img/s | of the ceiling | loop in next() | CPU ms per image "
        "| CPU cores busy |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        share = f"{r['ratio'] * 100:.1f} %" if r["ratio"] is not None else "n/a"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['amp']} | {r['loader']} | {r['threads'] or '-'} "
            f"| {r['img_per_s']:.1f} | {share} | {r['wait_share'] * 100:.1f} % | {r['cpu_ms_per_img']:.2f} "
            f"| {r['cpu_cores']:.1f} |"
        )
    lines.append("")
    for r in failed:
        lines.append(f"- {r['model']} {r['loader']} at {r['threads'] or '-'} threads ran out of memory: {r['error']}")
    for r in runs:
        if r["amp_fallback"]:
            lines.append(f"- {r['model']} {r['loader']}: fp32 + TF32, because {r['amp_fallback']}.")
        if r["loader"] == "ringfeed":
            why = r["gpu_decode_reason"]
            state = f"off: {why}" if why else f"on, {r['gpu_samples']} samples decoded on the GPU"
            line = f"- {r['model']} ringfeed at {r['threads']} threads: hybrid decode {state}"
            if MODELS[r["model"]] == "detection":
                line += (
                    f"; the padded targets' conversion took {r['convert_share'] * 100:.1f} % of the loop (its read "
                    "of box_count waits for the previous step's GPU work, as the model's own first sync would)"
                )
            lines.append(line + ".")
    (a.out / "det.md").write_text("\n".join(lines) + "\n")
    if not quiet:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
