#!/usr/bin/env python3
# A copy of shared/datasets/make_text.py (the company's offline text corpus maker), kept here so the
# token tests make their data on a bare CI checkout; refresh it from there, do not edit it here.
"""A real-text JSONL corpus and a BPE tokenizer, made offline from text this machine already has.

    python3 make_text.py OUT_DIR [--min-docs 20000] [--vocab 32000] [--seed 0]

Documents are the docstrings and comments of Python's standard library, the licence texts under
/usr/share/common-licenses and the copyright files under /usr/share/doc: English prose and code,
with a long-tailed length distribution (tens of bytes to tens of kilobytes), as web text has. They
are shuffled with the seed and repeated with a running index until there are --min-docs of them.
Writes OUT_DIR/corpus.jsonl ({"id", "source", "text"} per line), OUT_DIR/sft.jsonl ({"prompt",
"completion"} pairs cut from the same documents, for loss-masked fine-tuning data) and
OUT_DIR/tokenizer.json (a byte-level BPE trained on the corpus with the `tokenizers` package,
with <|endoftext|> as its end-of-document token). Needs: pip install tokenizers.
"""
import argparse
import ast
import glob
import json
import os
import random
import sysconfig


def stdlib_docs():
    root = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        if "site-packages" in path or "/test" in path:
            continue
        try:
            src = open(path, encoding="utf-8").read()
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    yield os.path.relpath(path, root), doc
        comments = "\n".join(line.strip()[1:].strip() for line in src.splitlines() if line.strip().startswith("#"))
        if len(comments) > 200:
            yield os.path.relpath(path, root) + "#comments", comments


def system_texts():
    for path in sorted(glob.glob("/usr/share/common-licenses/*") + glob.glob("/usr/share/doc/*/copyright")):
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        if len(text) > 80:
            yield path, text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--min-docs", type=int, default=20000)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    docs = list(stdlib_docs()) + list(system_texts())
    rng = random.Random(a.seed)
    rng.shuffle(docs)
    out, i = [], 0
    while len(out) < a.min_docs:
        src, text = docs[i % len(docs)]
        out.append({"id": len(out), "source": src, "text": text if i < len(docs) else f"[{i // len(docs)}] {text}"})
        i += 1
    with open(os.path.join(a.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for d in out:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    with open(os.path.join(a.out, "sft.jsonl"), "w", encoding="utf-8") as f:
        for d in out[: len(out) // 4]:
            t = d["text"]
            cut = max(1, min(len(t) - 1, int(len(t) * rng.uniform(0.2, 0.6))))
            f.write(json.dumps({"prompt": t[:cut], "completion": t[cut:]}, ensure_ascii=False) + "\n")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((d["text"] for d in out[: len(docs)]), trainer=trainer)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    size = os.path.getsize(os.path.join(a.out, "corpus.jsonl"))
    print(f"{len(out)} documents ({len(docs)} distinct), {size / 1e6:.1f} MB; tokenizer vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
