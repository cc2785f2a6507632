"""`ringfeed pack --tokenizer` on real text: the corpus of ``shared/datasets/make_text.py`` (Python
docstrings, licence texts) and its byte-level BPE go in; the Python ``tokenizers`` package is the
reference for what comes out. Also `verify`/`inspect` on token data, and Megatron-LM and flat
token files read in place."""

from __future__ import annotations

import itertools
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _support import ringfeed_bin

from ringfeed.formats import tokfile as tf
from ringfeed.formats.crc32c import crc32c

tokenizers = pytest.importorskip("tokenizers")

#: The repository's copy of shared/datasets/make_text.py, so a bare checkout makes the corpus too.
MAKE_TEXT = Path(__file__).resolve().parents[2] / "scripts" / "make_text.py"


def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([ringfeed_bin(), *args], capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,000 real documents, an SFT file and a 2,000-token BPE, made offline."""
    d = tmp_path_factory.mktemp("text")
    subprocess.run(
        [sys.executable, str(MAKE_TEXT), str(d), "--min-docs", "1000", "--vocab", "2000"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return d


@pytest.fixture(scope="module")
def packed(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "tok"
    run("pack", str(corpus / "corpus.jsonl"), str(out), "--tokenizer", str(corpus / "tokenizer.json"), "-j", "2")
    return out


def documents(corpus: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (corpus / "corpus.jsonl").read_text().splitlines()]


def test_packed_tokens_decode_back_to_the_documents(corpus: Path, packed: Path) -> None:
    """Each packed document is exactly what the Python tokenizer encodes, plus the EOS, and
    decodes back to the document's text."""
    tok = tokenizers.Tokenizer.from_file(str(corpus / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    ds = tf.TokenDataset(packed)
    texts = documents(corpus)
    assert ds.doc_count == len(texts)
    assert ds.width == 2
    assert ds.eos_id == eos
    refs = tok.encode_batch(texts, add_special_tokens=False)
    for d, (text, ref) in enumerate(zip(texts, refs, strict=True)):
        got = ds.doc(d).tolist()
        assert got == [*ref.ids, eos], f"document {d}"
        assert tok.decode(got[:-1], skip_special_tokens=False) == text, f"document {d}"
    assert tf.verify_tokens(packed)["documents"] == len(texts)


def test_any_thread_count_writes_the_same_bytes(corpus: Path, packed: Path, tmp_path: Path) -> None:
    """One thread and two threads produce byte-identical token files."""
    out = tmp_path / "one"
    run("pack", str(corpus / "corpus.jsonl"), str(out), "--tokenizer", str(corpus / "tokenizer.json"), "-j", "1")
    assert (out / "tokens.rft").read_bytes() == (packed / "tokens.rft").read_bytes()


def test_parquet_input_packs_the_same_documents(corpus: Path, packed: Path, tmp_path: Path) -> None:
    """The corpus written by pyarrow as Parquet (snappy, several row groups, an extra column) packs to the same
    token file as its JSONL, whose documents decode to the texts; gzip, lz4 and no compression read the same,
    and a directory of Parquet files packs as their rows in bytewise file order."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = documents(corpus)
    table = pa.table({"id": list(range(len(texts))), "text": texts})
    for codec in ("snappy", "gzip", "lz4", "none"):
        src = tmp_path / f"corpus-{codec}.parquet"
        pq.write_table(table, src, compression=codec, row_group_size=300)
        out = tmp_path / f"pq-{codec}"
        run("pack", str(src), str(out), "--tokenizer", str(corpus / "tokenizer.json"), "-j", "2")
        ds = tf.TokenDataset(out)
        assert ds.doc_count == len(texts)
        assert ds.tokens.tolist() == tf.TokenDataset(packed).tokens.tolist(), codec
        assert ds.info()["source_kind"] == "parquet"
    tok = tokenizers.Tokenizer.from_file(str(corpus / "tokenizer.json"))
    ds = tf.TokenDataset(tmp_path / "pq-snappy")
    for d in (0, 1, len(texts) // 2, len(texts) - 1):
        assert tok.decode(ds.doc(d).tolist()[:-1], skip_special_tokens=False) == texts[d]
    parts = tmp_path / "parts"
    parts.mkdir()
    half = len(texts) // 2
    pq.write_table(table.slice(half), parts / "b.parquet")
    pq.write_table(table.slice(0, half), parts / "a.parquet")
    out = tmp_path / "pq-dir"
    run("pack", str(parts), str(out), "--tokenizer", str(corpus / "tokenizer.json"), "--text-input", "parquet")
    assert tf.TokenDataset(out).tokens.tolist() == tf.TokenDataset(packed).tokens.tolist()


def test_bad_parquet_input_is_named(corpus: Path, tmp_path: Path) -> None:
    """A missing text column, a non-string one and a null value fail the pack naming the file (and row) and the
    setting; with --on-error skip only the null row is left out."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    tokenizer = str(corpus / "tokenizer.json")
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["a b c"], "n": [1]}), src)
    r = run("pack", str(src), str(tmp_path / "o1"), "--tokenizer", tokenizer, ok=False)
    assert "no column `text`" in r.stderr, r.stderr
    assert "--text-field" in r.stderr, r.stderr
    assert "body, n" in r.stderr, r.stderr
    r = run("pack", str(src), str(tmp_path / "o2"), "--tokenizer", tokenizer, "--text-field", "n", ok=False)
    assert "column `n` is INT64, not a string" in r.stderr, r.stderr
    pq.write_table(pa.table({"text": ["one doc", None, "three"]}), src)
    r = run("pack", str(src), str(tmp_path / "o3"), "--tokenizer", tokenizer, ok=False)
    assert f"{src}:row 2: column `text` is null" in r.stderr, r.stderr
    assert not (tmp_path / "o3").exists()
    run("pack", str(src), str(tmp_path / "o4"), "--tokenizer", tokenizer, "--on-error", "skip")
    assert tf.TokenDataset(tmp_path / "o4").doc_count == 2


def test_prompt_lengths_match_the_reference(corpus: Path, tmp_path: Path) -> None:
    """For prompt/completion pairs, each document is prompt + completion + EOS and records the
    prompt's token count, as the Python tokenizer counts it."""
    out = tmp_path / "sft"
    run(
        "pack",
        str(corpus / "sft.jsonl"),
        str(out),
        "--tokenizer",
        str(corpus / "tokenizer.json"),
        "--prompt-field",
        "prompt",
        "--completion-field",
        "completion",
    )
    tok = tokenizers.Tokenizer.from_file(str(corpus / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    ds = tf.TokenDataset(out)
    rows = [json.loads(line) for line in (corpus / "sft.jsonl").read_text().splitlines()]
    assert ds.has_prompts
    assert ds.doc_count == len(rows)
    for d, row in enumerate(rows):
        p = tok.encode(row["prompt"], add_special_tokens=False).ids
        c = tok.encode(row["completion"], add_special_tokens=False).ids
        assert ds.doc(d).tolist() == [*p, *c, eos]
        assert int(ds.prompt_lens[d]) == len(p)


def test_a_vocabulary_past_uint16_switches_to_uint32(corpus: Path, tmp_path: Path) -> None:
    """A tokenizer with an id above 65,535 gets uint32 tokens, and the id comes back intact (a
    uint16 cast would have wrapped it)."""
    spec = json.loads((corpus / "tokenizer.json").read_text())
    big = 70_000
    spec["model"]["vocab"]["<|big|>"] = big
    spec["added_tokens"].append(
        {
            "id": big,
            "content": "<|big|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    tok_path = tmp_path / "big.json"
    tok_path.write_text(json.dumps(spec))
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"text": "hello <|big|> world"}) + "\n")
    out = tmp_path / "out"
    run("pack", str(src), str(out), "--tokenizer", str(tok_path))
    ds = tf.TokenDataset(out)
    ref = tokenizers.Tokenizer.from_file(str(tok_path)).encode("hello <|big|> world", add_special_tokens=False).ids
    assert big in ref
    assert ds.width == 4
    assert ds.tokens.dtype == np.dtype("<u4")
    assert ds.doc(0).tolist()[:-1] == ref


def test_bad_inputs_are_named(corpus: Path, tmp_path: Path) -> None:
    """Invalid UTF-8 and a tokenizer that does not parse fail the pack with the file and line
    (or the tokenizer file) named, and leave no output."""
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b'{"text": "fine"}\n{"text": "bad \xff byte"}\n')
    out = tmp_path / "out"
    r = run("pack", str(src), str(out), "--tokenizer", str(corpus / "tokenizer.json"), ok=False)
    assert r.returncode != 0
    assert f"{src}:2: invalid UTF-8" in r.stderr, r.stderr
    assert not out.exists()
    broken = tmp_path / "tok.json"
    broken.write_text("{not json")
    r = run("pack", str(src), str(out), "--tokenizer", str(broken), ok=False)
    assert r.returncode != 0
    assert f"{broken}: cannot load the tokenizer" in r.stderr, r.stderr


def test_inspect_and_verify_understand_token_datasets(corpus: Path, packed: Path) -> None:
    """`inspect --json` reports the counts, the length histogram sums to the documents, and the
    sample decodes to the document's text; `verify` passes."""
    r = run("inspect", str(packed), "--json", "--sample", "3", "--tokenizer", str(corpus / "tokenizer.json"))
    v = json.loads(r.stdout)
    ds = tf.TokenDataset(packed)
    assert (v["tokens"], v["documents"], v["token_width"]) == (ds.token_count, ds.doc_count, 2)
    assert sum(b["documents"] for b in v["length_histogram"]) == ds.doc_count
    assert v["sample"]["text"] == documents(corpus)[3] + "<|endoftext|>"
    assert "ok:" in run("verify", str(packed)).stdout


def test_packing_files_are_written_verified_and_inspected(corpus: Path, packed: Path, tmp_path: Path) -> None:
    """`pack --pack-seq-len` and `ringfeed packing` write the same packing file, which is the
    Python reference's best-fit decreasing of the documents; `verify` checks it (and names a
    damaged one with its offset) and `inspect` lists it."""
    out = tmp_path / "tok"
    tok = str(corpus / "tokenizer.json")
    run("pack", str(corpus / "corpus.jsonl"), str(out), "--tokenizer", tok, "--pack-seq-len", "128,512", "-j", "2")
    assert tf.packings(out) == [128, 512]
    later = tmp_path / "later"
    later.mkdir()
    (later / tf.TOKENS_FILE).write_bytes((packed / tf.TOKENS_FILE).read_bytes())
    assert "packing-128.rfp" in run("packing", str(later), "--seq-len", "128").stdout
    assert (later / "packing-128.rfp").read_bytes() == (out / "packing-128.rfp").read_bytes()
    ds = tf.TokenDataset(out)
    starts = ds.doc_starts.tolist()
    for s in (128, 512):
        p = tf.Packing(ds, s)
        lens = [min(b - a, s + 1) for a, b in itertools.pairwise(starts)]
        assert (p.bin_starts.tolist(), p.bins.tolist()) == tf.best_fit_decreasing(lens, s + 1)
    r = run("verify", str(out))
    assert "packing files for seq_len 128, 512" in r.stdout, r.stdout
    v = json.loads(run("inspect", str(out), "--json").stdout)
    assert [(x["seq_len"], x["windows"]) for x in v["packings"]] == [
        (s, tf.Packing(ds, s).window_count) for s in (128, 512)
    ]
    # Two documents of a window swapped, CRCs refreshed: verify names the first entry that
    # differs from best-fit decreasing.
    f = out / "packing-512.rfp"
    b = bytearray(f.read_bytes())
    p = tf.Packing(ds, 512)
    w = next(i for i in range(p.window_count) if p.bin_starts[i + 1] - p.bin_starts[i] >= 2)
    at = 64 + 8 * (p.window_count + 1) + 8 * int(p.bin_starts[w])
    b[at : at + 8], b[at + 8 : at + 16] = b[at + 8 : at + 16], b[at : at + 8]
    b[52:56] = crc32c(bytes(b[64:])).to_bytes(4, "little")
    b[60:64] = crc32c(bytes(b[:60])).to_bytes(4, "little")
    f.write_bytes(bytes(b))
    r = run("verify", str(out), ok=False)
    assert r.returncode != 0
    assert f"{f} at byte {at}:" in r.stderr, r.stderr
    assert "best-fit decreasing" in r.stderr, r.stderr


def write_megatron(prefix: Path, docs: list[list[int]], dtype: type) -> None:
    """A reference writer of Megatron-Core's ``.bin``/``.idx`` layout (``_IndexWriter``): one
    sequence per document, ``document_indices`` from 0 to the sequence count."""
    code = {np.uint16: 8, np.int32: 4}[dtype]
    arrays = [np.asarray(d, dtype=dtype) for d in docs]
    with open(f"{prefix}.bin", "wb") as f:
        for a in arrays:
            f.write(a.tobytes(order="C"))
    lengths = np.array([len(a) for a in arrays], dtype=np.int32)
    pointers = np.zeros(len(arrays), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * np.dtype(dtype).itemsize)
    document_indices = np.arange(len(arrays) + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(tf.MEGATRON_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(document_indices.tobytes(order="C"))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_indexed_dataset_is_read_in_place(packed: Path, tmp_path: Path, dtype: type) -> None:
    """A Megatron `.bin/.idx` written by the reference writer is read by ringfeed with the same
    documents and tokens, without conversion."""
    ds = tf.TokenDataset(packed)
    docs = [ds.doc(d).tolist() for d in range(50)]
    prefix = tmp_path / "corpus_text_document"
    write_megatron(prefix, docs, dtype)
    ref = tf.MegatronDataset(prefix)
    assert ref.doc_count == 50
    v = json.loads(run("inspect", f"{prefix}.bin", "--json", "--sample", "7").stdout)
    assert v["kind"] == "megatron"
    assert (v["documents"], v["tokens"]) == (50, sum(map(len, docs)))
    assert v["token_width"] == np.dtype(dtype).itemsize
    assert v["sample"]["tokens"] == len(docs[7])
    assert v["sample"]["ids"] == docs[7][:64]
    assert "ok:" in run("verify", f"{prefix}.bin").stdout


def test_flat_token_file_is_read_with_its_dtype(packed: Path, tmp_path: Path) -> None:
    """A nanoGPT-style flat ``train.bin`` is one document of all its tokens, read with --token-dtype (Python's
    token_dtype=; --dtype, its older name, still works)."""
    ds = tf.TokenDataset(packed)
    flat = tmp_path / "train.bin"
    ds.tokens[:10_000].astype(np.uint16).tofile(flat)
    v = json.loads(run("inspect", str(flat), "--token-dtype", "uint16", "--json").stdout)
    assert (v["kind"], v["tokens"], v["documents"]) == ("flat", 10_000, 1)
    assert v["sample"]["ids"] == ds.tokens[:64].tolist()
    odd = tmp_path / "odd.bin"
    ds.tokens[:10_001].astype(np.uint16).tofile(odd)
    r = run("inspect", str(odd), "--dtype", "uint32", "--json", ok=False)
    assert r.returncode != 0
    assert "multiple of 4" in r.stderr, r.stderr
    assert "--dtype" in r.stderr, r.stderr
