#!/usr/bin/env python3
"""A LAION-like WebDataset, deterministic from a seed: photos with captions and metadata, in tars
written by the `webdataset` library's `ShardWriter`, and a CLIP-like BPE tokenizer for the captions.

    python3 benches/make_laion.py OUT [--count 4000] [--per-shard 64] [--photos DIR] [--vocab 49408]
        [--seed 0] [--jobs N]

Each sample is `KEY.jpg` (a photo of the standard corpus, `benches/make_photos.py`: ImageNet-like
sizes and JPEG settings), `KEY.txt` (its caption) and `KEY.json` (`{"caption", "width", "height",
"aesthetic"}`, as img2dataset writes LAION's metadata; the sizes are the JPEG's own, the aesthetic
score a seeded draw around 5.5). Keys are `%09d` and shards `OUT/tars/%05d.tar`, `--per-shard`
samples each: small shards, so that a DataLoader's workers each get several of a few thousand
photos (`webdataset.split_by_worker` hands whole shards to workers).

Captions are real English sentences of 5-40 words cut from the documents of
`scripts/make_text.py` (the standard library's docstrings and comments, the licence texts),
mostly-letter sentences only, shuffled with the seed (repeated when there are fewer than
`--count`). The tokenizer (`OUT/tokenizer.json`) is trained here on those sentences with the
`tokenizers` package, shaped like CLIP's: NFC and lowercase, byte-level BPE, at most CLIP's 49,408
tokens, and every text encoded as `<|startoftext|> ... <|endoftext|>`; `<|endoftext|>` is also its
padding token (docs/fields.md: the server pads with it, as CLIP does).

`--photos DIR` takes the first `--count` photos of an existing corpus (`DIR/manifest.tsv`, as
make_photos.py writes it); without it they are made into `OUT/photos`. `OUT/laion.json` says what
was made: `{"count", "shards", "urls", "tokenizer", "vocab_size", "seed"}`, `urls` the brace
pattern of the tars (`OUT/tars/{00000..00062}.tar`) that both `webdataset` and
`ringfeed.WebDataset` take. Needs numpy, pillow, scikit-image (the photos), webdataset, tokenizers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

BENCHES = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHES))  # make_photos.py
sys.path.insert(0, str(BENCHES.parent / "scripts"))  # make_text.py
import make_photos  # noqa: E402
import make_text  # noqa: E402

#: CLIP's vocabulary size (openai/clip-vit-base-patch32's tokenizer): the most the BPE may learn.
CLIP_VOCAB = 49408
START, END = "<|startoftext|>", "<|endoftext|>"
#: A caption's length in words, as issue 29's LAION-like set asks.
MIN_WORDS, MAX_WORDS = 5, 40
#: Sentence ends: ., ! or ? before white space.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(seed: int) -> list[str]:
    """Every distinct sentence of 5-40 words in make_text.py's documents that is mostly letters
    (prose, not code or tables), shuffled with `seed`."""
    seen: set[str] = set()
    out: list[str] = []
    for _, doc in [*make_text.stdlib_docs(), *make_text.system_texts()]:
        for s in SENTENCE_END.split(" ".join(doc.split())):
            words = s.split()
            if not MIN_WORDS <= len(words) <= MAX_WORDS or s in seen:
                continue
            chars = s.replace(" ", "")
            if sum(c.isalpha() for c in chars) < 0.8 * len(chars):
                continue
            seen.add(s)
            out.append(s)
    out.sort()  # the documents' order is the file system's; the seed alone decides the shuffle
    random.Random(seed).shuffle(out)
    return out


def train_tokenizer(texts: list[str], vocab: int, path: Path) -> int:
    """A CLIP-like BPE trained on `texts`, saved at `path`; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[START, END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{START} $A {END}", special_tokens=[(START, tok.token_to_id(START)), (END, tok.token_to_id(END))]
    )
    tok.save(str(path))
    return tok.get_vocab_size()


def photo_files(args: argparse.Namespace) -> list[Path]:
    """The first `--count` photos of `--photos` (its manifest's order), or of a corpus made here."""
    root = args.photos
    if root is None:
        root = args.out / "photos"
        if not (root / "manifest.tsv").exists():
            root.mkdir(parents=True, exist_ok=True)
            work = [(i, args.seed, 100, str(root)) for i in range(args.count)]
            with ProcessPoolExecutor(args.jobs) as ex, open(root.parent / "photos.tsv", "w") as m:
                for rel, label, n in ex.map(make_photos.make_one, work, chunksize=64):
                    m.write(f"{rel}\t{label}\t{n}\n")
            (root.parent / "photos.tsv").replace(root / "manifest.tsv")
    manifest = root / "manifest.tsv"
    if not manifest.exists():
        raise SystemExit(
            f"{manifest} is missing: make the corpus with benches/make_photos.py {root}, or leave out --photos"
        )
    with manifest.open() as f:
        files = [root / line.split("\t", 1)[0] for line in f][: args.count]
    if len(files) < args.count:
        raise SystemExit(f"{root} has {len(files)} photos, fewer than --count {args.count}")
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--count", type=int, default=4000)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--photos", type=Path, default=None, help="an existing make_photos.py corpus")
    ap.add_argument("--vocab", type=int, default=CLIP_VOCAB, help="the most tokens the BPE may learn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    a = ap.parse_args()
    import numpy as np
    import webdataset as wds

    a.out.mkdir(parents=True, exist_ok=True)
    files = photo_files(a)
    pool = sentences(a.seed)
    if not pool:
        raise SystemExit("make_text.py's documents gave no sentence of 5-40 words on this machine")
    vocab = train_tokenizer(pool, a.vocab, a.out / "tokenizer.json")
    tars = a.out / "tars"
    tars.mkdir(exist_ok=True)
    for old in tars.glob("*.tar"):
        old.unlink()
    rng = np.random.default_rng(a.seed)
    # mtime 0: the same seed gives the same bytes.
    with wds.ShardWriter(str(tars / "%05d.tar"), maxcount=a.per_shard, verbose=0, mtime=0.0) as sink:
        for i, path in enumerate(files):
            caption = pool[i % len(pool)]
            with Image.open(path) as im:
                width, height = im.size
            meta = {
                "caption": caption,
                "width": width,
                "height": height,
                "aesthetic": round(float(np.clip(rng.normal(5.5, 0.8), 1.0, 10.0)), 4),
            }
            sink.write({"__key__": f"{i:09d}", "jpg": path.read_bytes(), "txt": caption, "json": json.dumps(meta)})
    shards = sorted(tars.glob("*.tar"))
    doc = {
        "count": len(files),
        "shards": len(shards),
        "urls": f"{tars}/{{00000..{len(shards) - 1:05d}}}.tar",
        "tokenizer": str(a.out / "tokenizer.json"),
        "vocab_size": vocab,
        "seed": a.seed,
    }
    (a.out / "laion.json").write_text(json.dumps(doc, indent=2) + "\n")
    size = sum(p.stat().st_size for p in shards)
    print(
        f"{len(files)} samples in {len(shards)} shards, {size / 2**20:.0f} MiB; {len(pool)} distinct captions; "
        f"tokenizer vocab {vocab}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
