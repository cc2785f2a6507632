#!/usr/bin/env python3
"""LLM training throughput fed by each token loader, against the same model's ceiling.

    python3 benches/e2e/gpt_train.py --corpus DIR [--bin PATH]
        [--models gpt2-small,llama-1b] [--seq-len 1024] [--batch-size 16] [--steps 50]
        [--workers 4] [--device cuda] [--out DIR]

DIR holds corpus.jsonl and tokenizer.json (`python3 scripts/make_text.py DIR`); the
corpus is packed into DIR/packed.tok with `ringfeed pack --tokenizer` first if it is not there.
Each model (transformers, random init, bf16 weights, AdamW, loss = cross-entropy of the logits
against the already-shifted labels) is trained for `--steps` timed steps after `--warmup`, fed by:

- ceiling: one batch already on the device, reused (the rate when the GPU never waits);
- ringfeed: `ringfeed.TokenLoader` (concat windows, autotuned: a token stream starts at one server
  thread and the table shows where the tuner left it; CUDA mode: pinned ring, side-stream copies),
  a private server started for the run (`harness.Server`; the binary: --bin, RINGFEED_BIN, PATH
  or the workspace build, which also packs the corpus);
- dataloader-tokenize: a torch DataLoader whose `--workers` workers read corpus.jsonl and
  tokenise on the fly with `tokenizers` (concatenate with EOS, cut seq_len + 1 windows),
  pin_memory, copied with non_blocking;
- dataloader-memmap: a torch DataLoader over the packed token array as a numpy memmap
  (nanoGPT-style: random seq_len + 1 windows), `--workers` workers, pin_memory.

Reports tokens/s, ms/step and the share of the ceiling; the step-time cost of on-the-fly
tokenisation is dataloader-tokenize's ms/step minus the ceiling's. `--models tiny` and
`--device cpu` make the same run on a CPU with a two-layer model (how the script is tested).
Warm-up is counted in steps (`--warmup`), as the device calls of the committed results ran it.
Writes gpt.json (a `harness` record; the baseline is the ceiling) and gpt.md into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from itertools import repeat
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.nn import functional

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "client-py"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benches/: harness.py

import harness

import ringfeed
from ringfeed.formats import tokfile as tf

IGNORE = -100


def make_model(name: str, vocab: int, seq_len: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if name == "gpt2-small":  # 124 M parameters
        ids = {"bos_token_id": None, "eos_token_id": None}
        return GPT2LMHeadModel(
            GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=768, n_layer=12, n_head=12, **ids)
        )
    if name == "llama-1b":  # TinyLlama-1.1B's shape
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            max_position_embeddings=seq_len,
            bos_token_id=None,
            eos_token_id=None,
        )
        return LlamaForCausalLM(cfg)
    if name == "tiny":
        ids = {"bos_token_id": None, "eos_token_id": None}
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=64, n_layer=2, n_head=2, **ids))
    raise SystemExit(f"unknown model {name!r}: gpt2-small, llama-1b or tiny")


class Tokenize(torch.utils.data.IterableDataset):
    """corpus.jsonl tokenised on the fly: each worker takes every n-th document, appends the EOS,
    and cuts its stream into seq_len + 1 windows."""

    def __init__(self, corpus: Path, seq_len: int) -> None:
        self.corpus, self.seq_len = corpus, seq_len

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, n = (info.id, info.num_workers) if info else (0, 1)
        tok = Tokenizer.from_file(str(self.corpus / "tokenizer.json"))
        eos = tok.token_to_id("<|endoftext|>")
        buf: list[int] = []
        while True:
            with open(self.corpus / "corpus.jsonl", encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if i % n != wid:
                        continue
                    buf += [*tok.encode(json.loads(line)["text"], add_special_tokens=False).ids, eos]
                    while len(buf) > self.seq_len:
                        w = torch.tensor(buf[: self.seq_len + 1], dtype=torch.int64)
                        del buf[: self.seq_len]
                        yield {"input_ids": w[:-1], "labels": w[1:]}


class Memmap(torch.utils.data.Dataset):
    """Random seq_len + 1 windows of the packed token array, read through a numpy memmap."""

    def __init__(self, packed: Path, seq_len: int, length: int) -> None:
        self.packed, self.seq_len, self.length = packed, seq_len, length
        self.tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.tokens is None:
            self.tokens = tf.TokenDataset(self.packed).tokens
        rng = np.random.default_rng(i)
        s = int(rng.integers(0, len(self.tokens) - self.seq_len - 1))
        w = torch.from_numpy(self.tokens[s : s + self.seq_len + 1].astype(np.int64))
        return {"input_ids": w[:-1], "labels": w[1:]}


def train(model: torch.nn.Module, batches, steps: int, warmup: int, device: torch.device, vocab: int) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    it = iter(batches)

    def step() -> None:
        b = next(it)
        ids = b["input_ids"].to(device, non_blocking=True)
        labels = b["labels"].to(device, non_blocking=True)
        logits = model(input_ids=ids).logits
        loss = functional.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1), ignore_index=IGNORE)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"seconds": time.perf_counter() - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--models", default="gpt2-small,llama-1b")
    ap.add_argument("--modes", default="ceiling,ringfeed,dataloader-tokenize,dataloader-memmap")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    harness.add_arguments(ap, warmup=False)
    a = ap.parse_args()
    binary = harness.find_binary(a.bin)
    device = torch.device(a.device)
    packed = a.corpus / "packed.tok"
    if not (packed / tf.TOKENS_FILE).is_file():
        cmd = [binary, "pack", str(a.corpus / "corpus.jsonl"), str(packed), "--tokenizer"]
        subprocess.run([*cmd, str(a.corpus / "tokenizer.json"), "--progress", "none"], check=True)
    vocab = tf.TokenDataset(packed).vocab_size
    rows = []
    with harness.Server(binary=binary) as server:
        sock = server.sock
        for name in a.models.split(","):
            for mode in a.modes.split(","):
                torch.manual_seed(0)
                model = make_model(name, vocab, a.seq_len).to(device=device, dtype=torch.bfloat16)
                model.train()
                closer = None
                if mode == "ceiling":
                    w = torch.from_numpy(
                        tf.TokenDataset(packed).tokens[: a.batch_size * (a.seq_len + 1)].astype(np.int64)
                    )
                    w = w.view(a.batch_size, a.seq_len + 1).to(device)
                    fixed = {"input_ids": w[:, :-1], "labels": w[:, 1:]}
                    batches = repeat(fixed)
                elif mode == "ringfeed":
                    loader = ringfeed.TokenLoader(
                        packed,
                        batch_size=a.batch_size,
                        seq_len=a.seq_len,
                        device=a.device,
                        server=ringfeed.Server(socket=sock),
                        tuning=ringfeed.Tuning(slots=8),
                        shuffle=True,
                        drop_last=True,
                    )
                    closer = loader.close
                    batches = harness.epochs(loader)
                elif mode == "dataloader-tokenize":
                    batches = torch.utils.data.DataLoader(
                        Tokenize(a.corpus, a.seq_len),
                        batch_size=a.batch_size,
                        num_workers=a.workers,
                        pin_memory=device.type == "cuda",
                        persistent_workers=a.workers > 0,
                    )
                elif mode == "dataloader-memmap":
                    n = (a.steps + a.warmup + 1) * a.batch_size
                    batches = torch.utils.data.DataLoader(
                        Memmap(packed, a.seq_len, n),
                        batch_size=a.batch_size,
                        shuffle=False,
                        num_workers=a.workers,
                        pin_memory=device.type == "cuda",
                    )
                else:
                    raise SystemExit(f"unknown mode {mode!r}")
                r = train(model, batches, a.steps, a.warmup, device, vocab)
                # The autotuner's setting at the end: for tokens it should have stayed at one thread.
                server_threads = None
                if mode == "ringfeed":
                    view = loader.stats()["server"]
                    server_threads = view["threads"] if view else None
                if closer:
                    closer()
                del model
                tokens = a.steps * a.batch_size * a.seq_len
                rows.append(
                    {
                        "model": name,
                        "mode": mode,
                        "tokens_per_s": tokens / r["seconds"],
                        "ms_per_step": r["seconds"] * 1e3 / a.steps,
                        "server_threads": server_threads,
                    }
                )
                last = rows[-1]
                print(
                    f"{name:>10} {mode:>20}: {last['tokens_per_s']:12,.0f} tokens/s, {last['ms_per_step']:.2f} ms/step",
                    flush=True,
                )
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    for r in rows:
        ceil = next((c for c in rows if c["model"] == r["model"] and c["mode"] == "ceiling"), None)
        r["share_of_ceiling"] = r["tokens_per_s"] / ceil["tokens_per_s"] if ceil else None
        r["extra_ms_per_step"] = r["ms_per_step"] - ceil["ms_per_step"] if ceil else None
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        meta = {
            "device": str(device),
            "seq_len": a.seq_len,
            "batch_size": a.batch_size,
            "steps": a.steps,
            "workers": a.workers,
        }
        if device.type == "cuda":
            meta["gpu"] = torch.cuda.get_device_name(device)
        harness.write_record(
            a.out / "gpt.json",
            {"meta": meta, "rows": rows},
            args=a,
            baseline="ceiling",
            ratios=[{"model": r["model"], "mode": r["mode"], "ratio": r["share_of_ceiling"]} for r in rows],
        )
        md = [
            f"# LLM training fed by token loaders ({meta.get('gpu', a.device)}, seq {a.seq_len}, batch {a.batch_size})",
            "",
            "| model | feed | tokens/s | ms/step | share of ceiling | ms/step over ceiling | server threads |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            share = f"{r['share_of_ceiling'] * 100:.1f} %" if r["share_of_ceiling"] is not None else "-"
            extra = f"{r['extra_ms_per_step']:+.2f}" if r["extra_ms_per_step"] is not None else "-"
            md.append(
                f"| {r['model']} | {r['mode']} | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:.2f} "
                f"| {share} | {extra} | {r['server_threads'] if r['server_threads'] is not None else '-'} |"
            )
        (a.out / "gpt.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
