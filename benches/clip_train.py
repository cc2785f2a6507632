#!/usr/bin/env python3
"""CLIP-style contrastive training fed by each loader, against the same model's ceiling (issue 29).

    python3 benches/clip_train.py --data DIR [--loaders ceiling,ringfeed,dataloader] [--threads 6,15]
        [--batch 512] [--steps 60] [--seconds 0] [--warmup-s 12] [--warmup-steps 10] [--image-size 224]
        [--device cuda] [--out DIR] [--bin PATH]

`--data`: what `benches/make_laion.py DIR` wrote (LAION-like WebDataset tars of photos with
captions, and the CLIP-like `tokenizer.json` their captions are tokenised with).

The model is a small CLIP: a ViT-Tiny/16 image tower (12 layers, width 192, 3 heads, a class
token) and a 4-layer causal text tower (width 256, 4 heads, context 77, the tokenizer's
vocabulary, the features at each text's last token, where CLIP's `<|endoftext|>` is), both
projected to 256 and compared with CLIP's symmetric cross-entropy at a learned temperature. AdamW,
bf16 autocast on `--device`; the images are channels_last (the patch embedding, the only
convolution, reads them so). Each loader gives the training loop `(images, ids, mask)` on the
device: images `[B, 3, S, S]` in bf16, normalised with CLIP's mean and std; ids `int32 [B, 77]`,
mask `bool [B, 77]`:

- ceiling: one batch resident on the device, the same every step: the rate the model reaches
  when it never waits for data.
- ringfeed: `ringfeed.Loader` over the tars, `RandomResizedCrop(S)` + flip + `Normalize` (to bf16
  on the device), the captions (`.txt`) tokenised in the server by `ringfeed.Text("txt",
  tokenizer=..., max_length=77)`, hybrid decode `"auto"`, the autotuner bounded at `--threads`
  decode threads (`Tuning(threads=N)`), in a private server (`harness.Server`).
- dataloader: what such users run today (open_clip's shape): a `webdataset` pipeline (resampled
  shards, a 1,000-sample shuffle buffer, PIL decode, torchvision v2 `RandomResizedCrop(S)` + flip
  to uint8 tensors, the captions tokenised by the HF `tokenizers` library with truncation and
  padding to 77, whole batches made in the workers) in a `torch.utils.data.DataLoader` of
  `--threads` workers, `pin_memory`, persistent workers; the images normalised to bf16
  channels_last on the device (the cheapest place for it: uint8 crosses the bus).

ringfeed and dataloader run once per `--threads` count; the ceiling once. Each run warms up for at
least `--warmup-steps` steps and `--warmup-s` seconds (the autotuner settles in that time, the
DataLoader's workers fill their queues), then times at least `--steps` steps and `--seconds`
seconds (`harness.timed`, the device synchronised at both ends). It prints one JSON line per run:
img/s, the ratio to the ceiling of the same process, the share of the time the loop spent in
`next()`, CPU milliseconds per image and cores busy (the whole process tree, `e2e/_cpu.py`: the
loop, the workers, the sidecar), ringfeed's hybrid decode state (why it is off, or the samples
decoded on the GPU), and the last loss (finite: the model trained). `--out` gets `clip.json` (a
`harness` record, the ceiling as its baseline) and `clip.md`.

At toy size it runs on a CPU (`--device cpu --batch 8 --steps 3 --image-size 64 --warmup-s 0
--warmup-steps 1`), as `client-py/tests/test_bench_clip.py` does.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
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

#: CLIP's image normalisation (openai/CLIP, `_transform`).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CONTEXT = 77
EMBED = 256
#: The token that pads a text when the tokenizer's file names no padding (docs/fields.md's rule,
#: which the server follows): the first of these in the vocabulary, else 0.
PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>")

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Block(nn.Module):
    """A pre-norm transformer block (attention through `scaled_dot_product_attention`)."""

    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class ImageTower(nn.Module):
    """ViT-Tiny/16: 16-pixel patches, a class token, 12 blocks of width 192 with 3 heads."""

    def __init__(self, size: int, width: int = 192, layers: int = 12, heads: int = 3) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 16, 16)
        self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 1 + (size // 16) ** 2, width) * 0.02)
        self.blocks = nn.Sequential(*(Block(width, heads, causal=False) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.proj = nn.Linear(width, EMBED, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1) + self.pos
        return self.proj(self.ln(self.blocks(x)[:, 0]))


class TextTower(nn.Module):
    """CLIP's text transformer, smaller: 4 causal blocks of width 256 with 4 heads, context 77;
    a text's features are those at its last token (CLIP's `<|endoftext|>`)."""

    def __init__(self, vocab: int, width: int = 256, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(CONTEXT, width) * 0.01)
        self.blocks = nn.Sequential(*(Block(width, heads, causal=True) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.proj = nn.Linear(width, EMBED, bias=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.blocks(self.tok(ids) + self.pos))
        # Causal attention: padding after a text's last token never reaches it, so no mask is needed.
        last = (mask.sum(1) - 1).clamp(min=0)
        return self.proj(x[torch.arange(x.shape[0], device=x.device), last])


class Clip(nn.Module):
    def __init__(self, size: int, vocab: int) -> None:
        super().__init__()
        self.image, self.text = ImageTower(size), TextTower(vocab)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """CLIP's loss: the mean of the image-to-text and text-to-image cross-entropies."""
        i = F.normalize(self.image(images), dim=-1)
        t = F.normalize(self.text(ids, mask), dim=-1)
        logits = self.logit_scale.exp().clamp(max=100) * i @ t.t()
        target = torch.arange(logits.shape[0], device=logits.device)
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def pad_id(tok: Any) -> int:
    """The id a text is padded with: the file's own padding, else docs/fields.md's rule."""
    if tok.padding is not None:
        return int(tok.padding["pad_id"])
    return next((tok.token_to_id(t) for t in PAD_TOKENS if tok.token_to_id(t) is not None), 0)


class Tokenize:
    """Captions to `(ids, mask)` with the HF `tokenizers` library, truncated and padded to 77 as
    ringfeed's server does (docs/fields.md); loaded once in each DataLoader worker."""

    def __init__(self, path: str) -> None:
        self.path, self.tok = path, None

    def __call__(self, caption: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(self.path)
            tok.enable_truncation(CONTEXT)
            tok.enable_padding(length=CONTEXT, pad_id=pad_id(tok))
            self.tok = tok
        enc = self.tok.encode(caption)
        return torch.tensor(enc.ids, dtype=torch.int32), torch.tensor(enc.attention_mask, dtype=torch.bool)


class Sample:
    """A decoded `(PIL image, caption)` to `(uint8 image, ids, mask)`: torchvision v2 crop and flip,
    then the tokenizer."""

    def __init__(self, size: int, tokenizer: str) -> None:
        from torchvision.transforms import v2

        self.tf = v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(), v2.PILToTensor()])
        self.tokenize = Tokenize(tokenizer)

    def __call__(self, sample: tuple[Any, str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image, caption = sample
        return (self.tf(image), *self.tokenize(caption))


def dataloader_batches(data: dict, a: argparse.Namespace, workers: int) -> Iterator[Batch]:
    import webdataset as wds

    pipe = (
        wds.WebDataset(data["urls"], resampled=True, shardshuffle=False, nodesplitter=wds.split_by_node)
        .shuffle(1000)
        .decode("pilrgb")
        .to_tuple("jpg", "txt")
        .map(Sample(a.image_size, data["tokenizer"]))
        .batched(a.batch, partial=False)
    )
    dl = torch.utils.data.DataLoader(
        pipe,
        batch_size=None,
        num_workers=workers,
        pin_memory=a.device == "cuda",
        persistent_workers=True,
    )
    mean = torch.tensor(CLIP_MEAN, device=a.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(CLIP_STD, device=a.device).view(1, 3, 1, 1) * 255
    for x, ids, mask in dl:
        x = x.to(a.device, non_blocking=True).float().sub_(mean).div_(std)
        x = x.to(torch.bfloat16, memory_format=torch.channels_last)
        yield x, ids.to(a.device, non_blocking=True), mask.to(a.device, non_blocking=True)


def ringfeed_batches(data: dict, a: argparse.Namespace, threads: int, sock: str, info: dict) -> Iterator[Batch]:
    import ringfeed

    ld = ringfeed.Loader(
        ringfeed.WebDataset(data["urls"], label=""),
        a.batch,
        transform=ringfeed.Compose(
            [
                ringfeed.RandomResizedCrop(a.image_size),
                ringfeed.RandomHorizontalFlip(),
                ringfeed.Normalize(CLIP_MEAN, CLIP_STD),
            ]
        ),
        text=ringfeed.Text("txt", tokenizer=data["tokenizer"], max_length=CONTEXT),
        device=a.device,
        dtype=torch.bfloat16,
        gpu_decode="auto",
        server=ringfeed.Server(socket=sock),
        tuning=ringfeed.Tuning(threads=threads),
        shuffle=True,
        drop_last=True,
    )
    info["loader"] = ld
    with ld:
        for b in harness.epochs(ld):
            yield b["image"], b["text_ids"], b["text_mask"]


def ceiling_batches(data: dict, a: argparse.Namespace) -> Iterator[Batch]:
    """One batch on the device, every step: random images, and ids of the tokenizer's range with
    lengths as captions of 5-40 words have."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, generator=g).to(a.device, torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    ids = torch.randint(0, data["vocab_size"], (a.batch, CONTEXT), generator=g, dtype=torch.int32)
    mask = torch.arange(CONTEXT) < torch.randint(8, 60, (a.batch, 1), generator=g)
    ids, mask = ids.to(a.device), mask.to(a.device)
    while True:
        yield x, ids, mask


def train(batches: Iterator[Batch], a: argparse.Namespace, vocab: int) -> dict:
    """Trains a fresh model on `batches`: the warm-up, then at least `--steps` steps and `--seconds`, timed."""
    torch.manual_seed(0)
    model = Clip(a.image_size, vocab).to(a.device)
    model.image.patch.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.2, fused=a.device == "cuda")

    def step(batch: Batch) -> torch.Tensor:
        x, ids, mask = batch
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = model(x, ids, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    m = harness.train_window(
        batches,
        step,
        warmup_s=a.warmup_s,
        warmup_steps=a.warmup_steps,
        min_steps=a.steps,
        min_seconds=a.seconds,
        sync=torch.cuda.synchronize if a.device == "cuda" else None,
        clocks={"cpu_s": _cpu.tree_cpu_seconds},
    )
    cpu_s = m.pop("cpu_s")
    return m | {"cpu_ms_per_img": cpu_s / m["images"] * 1e3, "cpu_cores": cpu_s / m["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="make_laion.py's output directory")
    ap.add_argument("--loaders", default="ceiling,ringfeed,dataloader")
    ap.add_argument("--threads", default="6", help="decode threads / DataLoader workers, comma-separated")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=0.0, help="time at least this long too (whole steps)")
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", type=Path, default=None, help="write clip.json and clip.md here")
    harness.add_arguments(ap)
    a = ap.parse_args()
    data = json.loads((a.data / "laion.json").read_text())
    loaders = a.loaders.split(",")
    unknown = set(loaders) - {"ceiling", "ringfeed", "dataloader"}
    if unknown:
        ap.error(f"--loaders: unknown {sorted(unknown)}; known: ceiling, ringfeed, dataloader")
    threads = [int(t) for t in a.threads.split(",")]
    torch.backends.cudnn.benchmark = True
    runs: list[dict] = []
    plan = [("ceiling", 0)] if "ceiling" in loaders else []
    plan += [(name, t) for t in threads for name in ("ringfeed", "dataloader") if name in loaders]
    with harness.Server(max(threads), binary=a.bin) as server:
        for name, t in plan:
            info: dict = {}
            batches = {
                "ceiling": lambda: ceiling_batches(data, a),
                "ringfeed": lambda: ringfeed_batches(data, a, t, server.sock, info),  # noqa: B023 - called at once
                "dataloader": lambda: dataloader_batches(data, a, t),  # noqa: B023
            }[name]()
            r = {"loader": name, "threads": t or None} | train(batches, a, data["vocab_size"])
            if "loader" in info:
                ld = info.pop("loader")
                r["gpu_decode_reason"] = ld.gpu_decode_reason
                # Samples decoded on the GPU, over the whole run (warm-up included).
                r["gpu_samples"] = ld.stats(server=False).get("gpu_samples")
                del ld
            batches.close()  # ends the loader: its stream, or the DataLoader's workers
            del batches
            gc.collect()
            ceiling = next((x["img_per_s"] for x in runs if x["loader"] == "ceiling"), r["img_per_s"])
            r["ratio"] = harness.ratio(r["img_per_s"], ceiling) if "ceiling" in loaders else None
            runs.append(r)
            print(json.dumps(r), flush=True)
            if a.device == "cuda":
                torch.cuda.empty_cache()
    if a.out is not None:
        write(a, data, runs)


def write(a: argparse.Namespace, data: dict, runs: list[dict]) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    ceiling = next((r["img_per_s"] for r in runs if r["loader"] == "ceiling"), None)
    ratios = [{"loader": r["loader"], "threads": r["threads"], "ratio": r["ratio"]} for r in runs]
    harness.write_record(a.out / "clip.json", {"data": data, "runs": runs}, args=a, baseline="ceiling", ratios=ratios)
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    lines = [
        "# CLIP-style training (ViT-Tiny/16 + 4-layer text tower) fed by each loader",
        "",
        f"{gpu}, {harness.cpu_model()}; batch {a.batch}, {a.image_size} px, bf16; {data['count']} LAION-like "
        f"samples in {data['shards']} tars; at least {a.steps} timed steps and {a.seconds:g} s after at least "
        f"{a.warmup_steps} steps and {a.warmup_s:g} s of warm-up.",
        "",
        "| loader | threads | img/s | of the ceiling | loop in next() | CPU ms per image | CPU cores busy |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        share = f"{r['img_per_s'] / ceiling * 100:.1f} %" if ceiling else "n/a"
        lines.append(
            f"| {r['loader']} | {r['threads'] or '-'} | {r['img_per_s']:.0f} | {share} | {r['wait_share'] * 100:.1f} % "
            f"| {r['cpu_ms_per_img']:.2f} | {r['cpu_cores']:.1f} |"
        )
    lines.append("")
    for r in runs:
        if r["loader"] == "ringfeed":
            why = r["gpu_decode_reason"]
            state = f"off: {why}" if why else f"on, {r['gpu_samples']} samples decoded on the GPU"
            lines.append(f"- ringfeed at {r['threads']} threads: hybrid decode {state}.")
    (a.out / "clip.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
