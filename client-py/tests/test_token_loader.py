"""``ringfeed.TokenLoader`` against a real ``ringfeed serve``: windows of a token dataset packed by
``ringfeed pack --tokenizer``, checked field by field against a Python reference implementation
of ``proto/control.md``, "Token streams" (concat and pack modes, position_ids, document_ids,
cu_seqlens, loss masks), plus coverage, resume and ranks."""

from __future__ import annotations

import json
import logging
import math
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _support import frame_vector, record_sent, restripe_conformance, ringfeed_bin
from _tokorder import epoch_order, quantise, quota_schedule, rest_of_epoch

import ringfeed
from ringfeed.formats import tokfile as tf

torch = pytest.importorskip("torch")

IGNORE = -100
WORDS = [f"w{i}" for i in range(50)]


def tokenizer(dir: Path) -> Path:
    """A word-level tokenizer.json: ``<|endoftext|>`` 0, ``[UNK]`` 1, words from 2."""
    vocab = {"<|endoftext|>": 0, "[UNK]": 1} | {w: i + 2 for i, w in enumerate(WORDS)}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 0,
                "content": "<|endoftext|>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    p = dir / "tokenizer.json"
    p.write_text(json.dumps(spec))
    return p


def pack(tmp: Path, rows: list[dict[str, str]], *extra: str) -> Path:
    src = tmp / "c.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "tok"
    r = subprocess.run(
        [ringfeed_bin(), "pack", str(src), str(out), "--tokenizer", str(tokenizer(tmp)), "--progress", "none", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return out


def text(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 documents of 1 to 120 words (so some are longer than the windows below)."""
    rng = np.random.default_rng(0)
    rows = [{"text": text(rng, int(rng.integers(1, 120)))} for _ in range(300)]
    return pack(tmp_path_factory.mktemp("corpus"), rows)


@pytest.fixture(scope="module")
def sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(1)
    rows = [
        {"prompt": text(rng, int(rng.integers(0, 20))), "completion": text(rng, int(rng.integers(1, 30)))}
        for _ in range(120)
    ]
    return pack(tmp_path_factory.mktemp("sft"), rows, "--prompt-field", "prompt", "--completion-field", "completion")


@pytest.fixture(scope="module")
def sft_packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SFT rows, some longer than a 64-token window, packed with the pack-mode windows stored for
    seq_len 64 (tokens.md 1.1)."""
    rng = np.random.default_rng(1)
    rows = [
        {"prompt": text(rng, int(rng.integers(1, 12))), "completion": text(rng, int(rng.integers(1, 90)))}
        for _ in range(150)
    ]
    out = pack(
        tmp_path_factory.mktemp("sftp"),
        rows,
        *("--prompt-field", "prompt", "--completion-field", "completion", "--pack-seq-len", "64"),
    )
    assert (out / "packing-64.rfp").is_file()
    return out


# -- the reference ------------------------------------------------------------------------------


def best_fit_decreasing(lens: list[int], cap: int) -> list[list[int]]:
    """Documents sorted longest first (ties by index), each into the open bin with the least room
    that fits it (ties: the lowest bin), else a new bin."""
    order = sorted(range(len(lens)), key=lambda d: (-lens[d], d))
    bins: list[list[int]] = []
    room: list[int] = []
    for d in order:
        fits = [(room[b], b) for b in range(len(bins)) if room[b] >= lens[d]]
        if fits:
            _, b = min(fits)
        else:
            bins.append([])
            room.append(cap)
            b = len(bins) - 1
        bins[b].append(d)
        room[b] -= lens[d]
    return bins


def reference(ds: tf.TokenDataset, mode: str, seq_len: int, max_docs: int) -> list[dict[str, list[int]]]:
    """Every window of the dataset, as proto/control.md ("Token streams") defines them."""
    starts = ds.doc_starts.tolist()
    tokens = ds.tokens.tolist()
    prompts = ds.prompt_lens.tolist()
    # Per token of the stream: its document and its position in it.
    meta: list[tuple[int, int]] = []
    for d in range(ds.doc_count):
        meta += [(d, p) for p in range(starts[d + 1] - starts[d])]
    windows: list[tuple[list[int], list[tuple[int, int, bool]]]] = []
    if mode == "concat":
        for w in range((len(tokens) - 1) // seq_len):
            s = w * seq_len
            first = meta[s][0]
            m = [(meta[t][0] - first, meta[t][1], meta[t][1] >= prompts[meta[t][0]]) for t in range(s, s + seq_len + 1)]
            windows.append((tokens[s : s + seq_len + 1], m))
    else:
        cap = seq_len + 1
        lens = [min(starts[d + 1] - starts[d], cap) for d in range(ds.doc_count)]
        for b in best_fit_decreasing(lens, cap):
            buf: list[int] = []
            m = []
            for k, d in enumerate(b):
                buf += tokens[starts[d] : starts[d] + lens[d]]
                m += [(k, p, p >= prompts[d]) for p in range(lens[d])]
            pad = cap - len(buf)
            buf += [ds.eos_id or 0] * pad
            m += [(-1, p, False) for p in range(pad)]
            windows.append((buf, m))
    out = []
    for buf, m in windows:
        labels = []
        for i in range(seq_len):
            crosses = mode == "pack" and (m[i + 1][0] != m[i][0] or m[i][0] < 0)
            labels.append(buf[i + 1] if m[i + 1][2] and not crosses else IGNORE)
        pos = [m[i][1] for i in range(seq_len)]
        cu = [0] + [i for i in range(1, seq_len) if pos[i] == 0]
        cu = cu[:max_docs] + [seq_len] * (max_docs + 1 - len(cu[:max_docs]))
        out.append(
            {
                "input_ids": buf[:seq_len],
                "labels": labels,
                "position_ids": pos,
                "document_ids": [m[i][0] for i in range(seq_len)],
                "cu_seqlens": cu,
            }
        )
    return out


FIELDS = ("position_ids", "document_ids", "cu_seqlens", "index")


def collect(loader: ringfeed.TokenLoader) -> list[dict[str, Any]]:
    """Every window of one iteration, per window, copied out of the ring."""
    got = []
    for batch in loader:
        b = batch["input_ids"].shape[0]
        cu = batch["cu_seqlens"][1:].reshape(b, -1) - torch.arange(b, dtype=torch.int32)[:, None] * loader.seq_len
        for i in range(b):
            row = {k: batch[k][i].tolist() for k in ("input_ids", "labels", "position_ids", "document_ids", "index")}
            row["cu_seqlens"] = [0, *cu[i].tolist()]
            got.append(row)
    return got


@pytest.mark.parametrize(
    ("mode", "data"),
    [("concat", "corpus"), ("pack", "corpus"), ("concat", "sft"), ("pack", "sft"), ("pack", "sft_packed")],
)
def test_windows_match_the_reference(mode: str, data: str, request: pytest.FixtureRequest, sock: str) -> None:
    """Every window of an epoch has the reference's input_ids, labels (loss masks included),
    position_ids, document_ids and padded cu_seqlens; the epoch delivers each window once. With
    the packing stored at pack time (``sft_packed``) the windows are the same as computed."""
    path = request.getfixturevalue(data)
    ds = tf.TokenDataset(path)
    seq_len, max_docs = 64, 8
    ref = reference(ds, mode, seq_len, max_docs)
    with ringfeed.TokenLoader(
        path,
        batch_size=4,
        seq_len=seq_len,
        mode=mode,
        max_docs=max_docs,
        fields=FIELDS,
        server=ringfeed.Server(socket=sock, spawn=True),
        seed=3,
        shuffle=True,
        drop_last=True,
    ) as loader:
        assert len(loader) == len(ref) // 4
        got = collect(loader)
    indices = [g.pop("index") for g in got]
    assert len(set(indices)) == len(indices) == len(ref) // 4 * 4
    for i, g in zip(indices, got, strict=True):
        assert g == ref[i], f"window {i}"


def test_concat_windows_cover_the_stream_once(corpus: Path, sock: str) -> None:
    """In concat mode the windows of an epoch, put back in index order, are the token stream
    itself: each input token once, in order, and labels the stream shifted by one."""
    ds = tf.TokenDataset(corpus)
    seq_len = 50
    with ringfeed.TokenLoader(
        corpus, batch_size=1, seq_len=seq_len, fields=["index"], server=ringfeed.Server(socket=sock, spawn=True)
    ) as loader:
        rows = {int(b["index"][0]): (b["input_ids"][0].clone(), b["labels"][0].clone()) for b in loader}
    n = (ds.token_count - 1) // seq_len
    assert sorted(rows) == list(range(n))
    stream = torch.cat([rows[i][0] for i in range(n)])
    labels = torch.cat([rows[i][1] for i in range(n)])
    want = torch.from_numpy(ds.tokens[: n * seq_len + 1].astype(np.int64))
    assert torch.equal(stream, want[:-1])
    assert torch.equal(labels, want[1:])


def test_a_token_stream_says_nothing_about_gpu_decode(
    corpus: Path, sock: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A token stream has nothing to decode: it opens without hybrid decode and without a message
    about it (it used to log "GPU decode is off: the 1.1 transform dict form ...")."""
    with (
        caplog.at_level(logging.DEBUG, logger="ringfeed"),
        ringfeed.TokenLoader(
            corpus, batch_size=2, seq_len=16, server=ringfeed.Server(socket=sock, spawn=True)
        ) as loader,
    ):
        next(iter(loader))
    assert not [r for r in caplog.records if "GPU decode" in r.getMessage()], caplog.text
    assert loader.gpu_decode_reason == "gpu_decode=False"


def test_pack_never_splits_a_document(corpus: Path, sock: str) -> None:
    """In pack mode every document shorter than seq_len + 1 appears whole in exactly one window,
    and a longer one is cut to its first seq_len + 1 tokens."""
    ds = tf.TokenDataset(corpus)
    seq_len = 64
    seen: list[tuple[int, ...]] = []
    with ringfeed.TokenLoader(
        corpus,
        batch_size=2,
        seq_len=seq_len,
        mode="pack",
        fields=["document_ids"],
        server=ringfeed.Server(socket=sock, spawn=True),
        drop_last=False,
        shuffle=True,
    ) as loader:
        for b in loader:
            for ids_t, docs_t, labels_t in zip(b["input_ids"], b["document_ids"], b["labels"], strict=True):
                ids, docs, labels = ids_t.tolist(), docs_t.tolist(), labels_t.tolist()
                for k in sorted(set(docs) - {-1}):
                    where = [i for i, d in enumerate(docs) if d == k]
                    assert where == list(range(where[0], where[-1] + 1)), "a document's tokens are contiguous"
                    toks = [ids[i] for i in where]
                    # The window's (seq_len + 1)-th token is seen only as the last label.
                    if where[-1] == seq_len - 1 and labels[-1] != IGNORE:
                        toks.append(labels[-1])
                    seen.append(tuple(toks))
    want = [tuple(ds.doc(d).tolist()[: seq_len + 1]) for d in range(ds.doc_count)]
    assert any(len(ds.doc(d)) > seq_len + 1 for d in range(ds.doc_count)), "the corpus has documents to cut"
    assert sorted(seen) == sorted(want)


def test_resume_gives_exactly_the_rest(corpus: Path, sock: str) -> None:
    """A loader resumed from state_dict() mid-epoch delivers exactly the windows the first one had
    not delivered, in the same order."""
    kw = {
        "batch_size": 3,
        "seq_len": 32,
        "fields": ["index"],
        "server": ringfeed.Server(socket=sock, spawn=True),
        "seed": 7,
    }
    with ringfeed.TokenLoader(corpus, **kw) as loader:
        loader.set_epoch(2)
        full = [b["index"].tolist() for b in loader]
    with ringfeed.TokenLoader(corpus, **kw) as a:
        a.set_epoch(2)
        it = iter(a)
        head = [next(it)["index"].tolist() for _ in range(5)]
        state = a.state_dict()
    with ringfeed.TokenLoader(corpus, **kw) as b:
        b.load_state_dict(state)
        b.set_epoch(2)
        rest = [x["index"].tolist() for x in b]
    assert head + rest == full


@pytest.mark.parametrize("mode", ["concat", "pack"])
def test_resume_with_another_world_size_restripes_the_rest(corpus: Path, sock: str, mode: str) -> None:
    """Four ranks take 4 batches of windows each; the job resumes from their state at world 2, at world 3 and
    at world 3 with another batch size: every window of the epoch exactly once, each with its own tokens."""
    ds = tf.TokenDataset(corpus)
    # A seq_len whose window count leaves no drop_last tail: 32 consumed, then a multiple of 36.
    count = {"concat": lambda s: (ds.token_count - 1) // s, "pack": lambda s: len(packed_windows(ds, s))}[mode]
    seq_len = next(s for s in range(8, 400) if count(s) >= 68 and (count(s) - 32) % 36 == 0)
    n = count(seq_len)
    tokens: dict[int, list[int]] = {}

    def make(**kw: Any) -> ringfeed.TokenLoader:
        ld = ringfeed.TokenLoader(
            corpus, seq_len=seq_len, mode=mode, fields=["index"], server=ringfeed.Server(socket=sock, spawn=True), **kw
        )
        ld.set_epoch(1)
        return ld

    def key(b: dict[str, Any]) -> list[int]:
        for i, ids in zip(b["index"].tolist(), b["input_ids"].tolist(), strict=True):
            assert tokens.setdefault(i, ids) == ids
        return b["index"].tolist()

    restripe_conformance(make, n, key, batch=2, steps=4)


def packed_windows(ds: tf.TokenDataset, seq_len: int) -> list[list[int]]:
    starts = ds.doc_starts.tolist()
    return best_fit_decreasing([min(starts[d + 1] - starts[d], seq_len + 1) for d in range(ds.doc_count)], seq_len + 1)


def test_ranks_share_an_epoch_like_distributed_sampler(corpus: Path, sock: str) -> None:
    """Two ranks get disjoint windows whose union is every window of the epoch (drop_last off:
    padded like DistributedSampler)."""
    seen = []
    for rank in range(2):
        with ringfeed.TokenLoader(
            corpus,
            batch_size=4,
            seq_len=40,
            fields=["index"],
            rank=rank,
            world_size=2,
            server=ringfeed.Server(socket=sock, spawn=True),
            drop_last=False,
        ) as loader:
            seen.append([i for b in loader for i in b["index"].tolist()])
    n = (tf.TokenDataset(corpus).token_count - 1) // 40
    assert set(seen[0]) | set(seen[1]) == set(range(n))
    assert len(seen[0]) == len(seen[1]) == -(-n // 2)


def test_bad_token_requests_are_refused(corpus: Path, sock: str) -> None:
    """A window longer than the dataset and an unknown field are refused with the setting named."""
    with pytest.raises(ringfeed.ServerError, match="seq_len"):
        ringfeed.TokenLoader(corpus, batch_size=1, seq_len=1 << 20, server=ringfeed.Server(socket=sock, spawn=True))
    with pytest.raises(ValueError, match="fields"):
        ringfeed.TokenLoader(
            corpus, batch_size=1, seq_len=8, fields=["image"], server=ringfeed.Server(socket=sock, spawn=True)
        )


def test_the_token_open_is_the_vectors(corpus: Path, sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `open` a TokenLoader sends is the frames.json vector "open, 1.2 token stream" (which the
    Rust side decodes into its one OpenRequest and encodes back byte for byte), but for the path."""
    want = frame_vector("open, 1.2 token stream")
    sent = record_sent(monkeypatch)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    t = want["tokens"]
    with ringfeed.TokenLoader(
        corpus,
        batch_size=want["batch_size"],
        seq_len=16,
        max_docs=t["max_docs"] // 8,
        fields=want["fields"],
        rank=want["rank"],
        world_size=2,
        drop_last=want["drop_last"],
        server=ringfeed.Server(socket=sock, spawn=True),
        shuffle=True,
    ) as loader:
        assert len(loader) >= 1
    got = next(m for m in sent if m["type"] == "open")
    assert got == want | {
        "dataset": str(corpus),
        "tokens": t | {"seq_len": 16, "max_docs": t["max_docs"] // 8},
        "world_size": 2,
    }


def test_a_token_open_with_image_members_is_refused(corpus: Path, sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One `open` serves both kinds, and a token stream's `open` that carries an image member is a
    bad request naming the member."""
    from ringfeed._tokens import TokenBatches

    real = TokenBatches.open_members
    monkeypatch.setattr(TokenBatches, "open_members", lambda self, *a: real(self, *a) | {"layout": "NHWC"})
    with pytest.raises(ringfeed.ServerError, match=r"open\.layout is not a member of a token stream"):
        ringfeed.TokenLoader(corpus, batch_size=1, seq_len=8, server=ringfeed.Server(socket=sock, spawn=True))


# -- mixing (control.md, "Mixing") -------------------------------------------------------------


@pytest.fixture(scope="module")
def third(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(2)
    return pack(tmp_path_factory.mktemp("third"), [{"text": text(rng, int(rng.integers(5, 40)))} for _ in range(60)])


@pytest.mark.parametrize("weights", [[0.6, 0.3, 0.1], [0.5, 0.25, 0.25]], ids=["long-period", "period-4"])
def test_a_mix_holds_its_weights_at_every_prefix(
    corpus: Path, sft: Path, third: Path, sock: str, weights: list[float]
) -> None:
    """A mix of three datasets delivers each dataset's windows in exactly the reference quota schedule (so
    after every window each dataset has had floor or ceil of its share of the tokens), each window is its
    dataset's window `index`, and each pass over a dataset uses every one of its windows once; with a
    period of 4 slots the epoch wraps around the period many times and still matches."""
    seq_len = 16
    paths = [corpus, sft, third]
    refs = [reference(tf.TokenDataset(p), "concat", seq_len, seq_len) for p in paths]
    with ringfeed.TokenLoader(
        dict(zip(paths, weights, strict=True)),
        batch_size=4,
        seq_len=seq_len,
        fields=["index", "dataset_index"],
        server=ringfeed.Server(socket=sock, spawn=True),
        seed=5,
    ) as loader:
        assert loader.dataset_len == sum(len(r) for r in refs)
        got = [
            (d, i, ids)
            for b in loader
            for d, i, ids in zip(b["dataset_index"].tolist(), b["index"].tolist(), b["input_ids"].tolist(), strict=True)
        ]
    schedule = quota_schedule(quantise(weights), loader.dataset_len)
    assert [d for d, _, _ in got] == schedule[: len(got)]
    counts = [0, 0, 0]
    for k, (d, i, ids) in enumerate(got):
        counts[d] += 1
        for j, w in enumerate(weights):
            share = w / sum(weights) * (k + 1)
            assert math.floor(share - 1e-9) <= counts[j] <= math.ceil(share + 1e-9), f"window {k}, dataset {j}"
        assert ids == refs[d][i]["input_ids"], f"window {k}: dataset {d}'s window {i}"
    for d, ref in enumerate(refs):
        mine = [i for dd, i, _ in got if dd == d]
        for p in range(0, len(mine) - len(ref) + 1, len(ref)):
            assert sorted(mine[p : p + len(ref)]) == list(range(len(ref))), f"dataset {d}, pass {p // len(ref)}"
    assert counts[0] > len(refs[0]) or counts[2] > len(refs[2]) or counts[1] > len(refs[1]), "some dataset repeats"


def test_a_mix_resumes_with_another_world_size(corpus: Path, sft: Path, third: Path, sock: str) -> None:
    """A mixed stream run on 4 ranks for 3 steps and resumed on 3 ranks delivers, in global order, exactly
    the single-rank stream of the same seed and epoch: the mix's order survives the re-striping."""
    mix = {corpus: 0.5, sft: 0.25, third: 0.25}
    kw: dict[str, Any] = {
        "seq_len": 24,
        "fields": ["index", "dataset_index"],
        "server": ringfeed.Server(socket=sock, spawn=True),
    }

    def items(b: dict[str, Any]) -> list[tuple[int, int]]:
        return list(zip(b["dataset_index"].tolist(), b["index"].tolist(), strict=True))

    with ringfeed.TokenLoader(mix, batch_size=1, seed=2, **kw) as ld:
        ld.set_epoch(1)
        full = [x for b in ld for x in items(b)]
    n = len(full)
    order: dict[int, tuple[int, int]] = {}
    states = []
    for rank in range(4):
        with ringfeed.TokenLoader(mix, batch_size=2, seed=2, rank=rank, world_size=4, **kw) as ld:
            ld.set_epoch(1)
            it = iter(ld)
            mine = [x for _ in range(3) for x in items(next(it))]
            order |= {rank + 4 * j: x for j, x in enumerate(mine)}
            states.append(ld.state_dict())
    start = states[0]["position"]
    assert start == 24
    for rank in range(3):
        with ringfeed.TokenLoader(mix, batch_size=2, seed=2, rank=rank, world_size=3, **kw) as ld:
            ld.load_state_dict(states[0])
            mine = [x for b in ld for x in items(b)]
            order |= {start + rank + 3 * j: x for j, x in enumerate(mine)}
    kept = len(order)
    assert kept > n - 6, "only the drop_last tail (under 3 ranks x 2) is left out"
    assert [order[k] for k in range(kept)] == full[:kept]


@pytest.mark.parametrize("mode", ["concat", "pack"])
def test_a_stream_is_the_reference_window_order(corpus: Path, sock: str, mode: str) -> None:
    """A shuffled one-dataset stream delivers, on each of 3 ranks (padded), exactly the reference order's
    windows (a mix of one: position k holds window permute(n, key(seed, epoch, 0, 0), k)), and after a
    resume at a global position on 2 ranks exactly the reference's rest of the epoch from there."""
    kw: dict[str, Any] = {
        "seq_len": 20,
        "mode": mode,
        "fields": ["index"],
        "server": ringfeed.Server(socket=sock, spawn=True),
        "seed": 13,
    }
    with ringfeed.TokenLoader(corpus, batch_size=1, shuffle=True, drop_last=True, **kw) as ld:
        n = ld.dataset_len
    order = epoch_order([n], None, 13, 3, True)
    assert sorted(w for _, w in order) == list(range(n))
    for rank in range(3):
        with ringfeed.TokenLoader(
            corpus, batch_size=4, rank=rank, world_size=3, shuffle=True, drop_last=False, **kw
        ) as ld:
            ld.set_epoch(3)
            it = iter(ld)
            got = [i for _ in range(2) for i in next(it)["index"].tolist()]
            state = ld.state_dict()
            got += [i for b in it for i in b["index"].tolist()]
        assert got == [w for _, w in rest_of_epoch(order, 0, 3, rank, False)], f"rank {rank}"
    assert state["position"] == 2 * 4 * 3
    for rank in range(2):
        with ringfeed.TokenLoader(
            corpus, batch_size=5, rank=rank, world_size=2, shuffle=True, drop_last=False, **kw
        ) as ld:
            ld.load_state_dict(state)
            got = [i for b in ld for i in b["index"].tolist()]
        assert got == [w for _, w in rest_of_epoch(order, 24, 2, rank, False)], f"resumed rank {rank}"


def test_a_shuffled_mix_is_the_reference_window_order(corpus: Path, sft: Path, third: Path, sock: str) -> None:
    """A shuffled mix of three datasets delivers exactly the reference's (dataset, window) at every
    position: the quota schedule, and in each dataset the keyed permutation of each pass over it."""
    paths, weights = [corpus, sft, third], [0.2, 0.3, 0.5]
    seq_len = 16
    windows = [(tf.TokenDataset(p).token_count - 1) // seq_len for p in paths]
    with ringfeed.TokenLoader(
        dict(zip(paths, weights, strict=True)),
        batch_size=8,
        seq_len=seq_len,
        fields=["index", "dataset_index"],
        server=ringfeed.Server(socket=sock, spawn=True),
        seed=21,
        drop_last=False,
        shuffle=True,
    ) as loader:
        loader.set_epoch(6)
        got = [(d, i) for b in loader for d, i in zip(b["dataset_index"].tolist(), b["index"].tolist(), strict=True)]
    assert got == epoch_order(windows, weights, 21, 6, True)


def test_a_token_stream_starts_at_one_thread_under_autotune(corpus: Path, sock: str) -> None:
    """With autotune, a token stream starts at one reading thread (the server's default for the kind), not
    the whole budget an image stream starts with; without autotune it is pinned at one."""
    with ringfeed.TokenLoader(corpus, batch_size=2, seq_len=16, server=ringfeed.Server(socket=sock, spawn=True)) as ld:
        server = ld.stats()["server"]
        assert server is not None
        assert server["threads"] == 1
        assert server["autotune"]
    with ringfeed.TokenLoader(
        corpus,
        batch_size=2,
        seq_len=16,
        server=ringfeed.Server(socket=sock, spawn=True),
        tuning=ringfeed.Tuning(autotune=False),
    ) as ld:
        assert ld.stats()["server"]["threads"] == 1


def test_defaults_are_the_dataloaders_and_kept_batches_stay(corpus: Path, sock: str) -> None:
    """No shuffle, the last partial batch delivered, and ``list(loader)`` on the CPU equals the
    epoch cloned batch by batch (held windows move to private memory before their slot is refilled)."""
    with ringfeed.TokenLoader(
        corpus, batch_size=5, seq_len=16, fields=["index"], server=ringfeed.Server(socket=sock, spawn=True)
    ) as ld:
        assert (ld.shuffle, ld.drop_last) == (False, False)
        cloned = [{k: v.clone() for k, v in b.items()} for b in ld]
        ld.set_epoch(0)
        kept = list(ld)
        n = ld.dataset_len
    assert n % 5, "the corpus should end in a partial batch"
    assert [len(b["index"]) for b in kept] == [5] * (n // 5) + [n % 5]
    assert torch.cat([b["index"] for b in kept]).tolist() == list(range(n))
    for a, b in zip(kept, cloned, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
