#!/usr/bin/env python3
"""What sample fields (protocol 1.9) cost the image path: the delivery rate of one `ringfeed.Loader`
over LAION-like WebDataset tars (`.jpg` + `.txt` + `.json`) with no field, with the captions as
raw text, tokenised in the server (a BPE `tokenizer.json`, 77 tokens), and with three metadata
fields, in the same run against the same server (issue 29: captions tokenised in the server cost at
most 10 % of the image path's rate).

    python3 benches/fields_rate.py --photos DIR --text DIR [--count 2000] [--threads 2]
        [--batch-size 64] [--rounds 3] [--seconds 8] [--warmup-s 4] [--out DIR] [--bin PATH]

`--photos`: `make_photos.py`'s corpus (the first `--count` photos are used); `--text`:
`make_text.py`'s output (its `corpus.jsonl` gives the captions, cut to 40-300 bytes at a
character boundary, and its `tokenizer.json` tokenises them). The tars are written with the
`webdataset` library into `--out`/tars. Each configuration runs `--rounds` times, the
configurations interleaved (A B C D A B C D ...) so that a drift of the machine touches them
alike; each run warms up `--warmup-s` seconds, then times batches for `--seconds`. The figure of a
configuration is its median; the ratio is over the image-only median. CPU tensors, RandomResizedCrop
(224) + flip, the tuner off (`--threads` decode threads, fixed).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import harness

import ringfeed

CONFIGS = ("image only", "raw text", "tokenised text", "metadata")


def captions(text_dir: Path, n: int) -> list[str]:
    """`n` captions cut from the corpus's documents (40-300 UTF-8 bytes, at a character boundary)."""
    out: list[str] = []
    with (text_dir / "corpus.jsonl").open() as f:
        for line in f:
            doc = " ".join(json.loads(line)["text"].split())
            if len(doc) < 10:
                continue
            cut = 40 + (len(out) * 37) % 261
            b = doc.encode()[:cut]
            out.append(b.decode("utf-8", errors="ignore"))
            if len(out) == n:
                break
    if len(out) < n:
        raise SystemExit(f"{text_dir}/corpus.jsonl has fewer than {n} usable documents")
    return out


def write_tars(photos: Path, text_dir: Path, count: int, dest: Path, per_tar: int = 500) -> Path:
    """LAION-like tars of `count` photos with their class, captions and metadata, by the `webdataset`
    library."""
    import webdataset as wds

    files = sorted(p for p in photos.rglob("*.jpg"))[:count]
    if len(files) < count:
        raise SystemExit(f"{photos} has {len(files)} photos, fewer than --count {count}")
    caps = captions(text_dir, count)
    classes = {c: k for k, c in enumerate(sorted({p.parent.name for p in files}))}
    dest.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(dest / "shard-%04d.tar"), maxcount=per_tar, verbose=0) as sink:
        for i, (p, cap) in enumerate(zip(files, caps, strict=True)):
            meta = {"caption": cap, "aesthetic": 4.0 + (i % 30) / 10, "width": 300 + i % 500, "nsfw": i % 7 == 0}
            sample = {"__key__": f"s{i:06d}", "jpg": p.read_bytes(), "cls": str(classes[p.parent.name])}
            sink.write({**sample, "txt": cap, "json": json.dumps(meta)})
    return dest


def loader(tars: Path, sock: str, config: str, tokenizer: Path, threads: int, batch: int) -> ringfeed.Loader:
    kw: dict[str, object] = {}
    if config == "raw text":
        kw["text"] = ringfeed.Text("txt", max_bytes=512)
    elif config == "tokenised text":
        kw["text"] = ringfeed.Text("txt", tokenizer=str(tokenizer), max_length=77)
    elif config == "metadata":
        kw["meta"] = ringfeed.Meta("json", {"aesthetic": "float32", "width": "int32", "nsfw": "bool"})
    return ringfeed.Loader(
        tars,
        batch,
        ringfeed.Compose([ringfeed.RandomResizedCrop(224), ringfeed.RandomHorizontalFlip()]),
        server=ringfeed.Server(socket=sock),
        tuning=ringfeed.Tuning(autotune=False, threads=threads),
        shuffle=True,
        drop_last=True,
        **kw,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", type=Path, required=True)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=Path("fields-rate"))
    harness.add_arguments(ap, warmup_s=4.0)
    a = ap.parse_args()
    tars = a.out / "tars"
    if not any(tars.glob("*.tar")):
        write_tars(a.photos, a.text, a.count, tars)
    tokenizer = a.text / "tokenizer.json"
    runs: list[dict[str, object]] = []
    with harness.Server(a.threads, binary=a.bin) as server:
        for r in range(a.rounds):
            for config in CONFIGS:
                with loader(tars, server.sock, config, tokenizer, a.threads, a.batch_size) as ld:
                    m = harness.measure(harness.epochs(ld), warmup_s=a.warmup_s, min_seconds=a.seconds)
                row = {"config": config, "round": r, "img_per_s": m["img_per_s"], "batches": m["batches"]}
                runs.append(row)
                print(json.dumps(row), flush=True)
    med = {c: statistics.median(float(r["img_per_s"]) for r in runs if r["config"] == c) for c in CONFIGS}
    ratios = {c: harness.ratio(med[c], med["image only"]) for c in CONFIGS}
    harness.write_record(
        a.out / "fields_rate.json", {"runs": runs, "median": med}, args=a, baseline="image only", ratios=ratios
    )
    lines = [
        "# Sample fields' cost: delivery rate over LAION-like WebDataset tars",
        "",
        f"{harness.cpu_model()}; {a.count} photos of make_photos' corpus with captions from make_text's corpus "
        f"(40-300 bytes); CPU tensors, RandomResizedCrop(224) + flip, batch {a.batch_size}, {a.threads} decode "
        f"threads (tuner off); {a.rounds} interleaved rounds of {a.seconds:g} s after {a.warmup_s:g} s of warm-up.",
        "",
        "| fields | img/s (median) | per round | against image only |",
        "|---|---:|---|---:|",
    ]
    for c in CONFIGS:
        per = ", ".join(f"{float(r['img_per_s']):.0f}" for r in runs if r["config"] == c)
        ratio = ratios[c]
        lines.append(f"| {c} | {med[c]:.0f} | {per} | {ratio:.3f} |" if ratio is not None else f"| {c} | - | | |")
    (a.out / "fields_rate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
