"""Sample fields (protocol 1.9; control.md, "Sample fields (1.9)"; docs/fields.md): captions raw
or tokenised in the server, and typed metadata, from a LAION-like WebDataset written by the
``webdataset`` library and from manifests, served by the real ``ringfeed serve``.

Every value is compared with its source, sample by sample (by the sample's ``index``): raw
captions with the strings written, token ids and masks with the Python ``tokenizers`` library's
encoding with the same ``tokenizer.json``, metadata with the JSON written; over an epoch on 2
ranks (together exactly once) and across a resume.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import webdataset
from _support import frame_vector, record_sent, ringfeed_bin
from PIL import Image

import ringfeed
from ringfeed import ServerError

N = 24
META = {"aesthetic": "float32", "width": "int32", "nsfw": "bool"}
MAX_LENGTH = 16


def caption(i: int) -> str:
    """Captions with non-ASCII text, one empty, one far longer than MAX_LENGTH tokens."""
    if i == 4:
        return ""
    if i == 7:
        return " ".join(f"a very long caption word {k}" for k in range(30))
    extra = ["café au lait", "日本語の説明文", "emoji 🐱 and ü", "plain photo"][i % 4]
    return f"photo {i} of a cat, {extra}"


def record(i: int) -> dict[str, Any]:
    return {"caption": caption(i), "aesthetic": 4.0 + i / 8, "width": 100 + 3 * i, "nsfw": i % 5 == 0}


def jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (24, 28, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def write_wds(root: Path, records: list[dict[str, Any]], shards: int = 2) -> Path:
    """A LAION-like WebDataset: `.jpg` + `.txt` + `.json`, by webdataset.TarWriter."""
    root.mkdir(parents=True, exist_ok=True)
    per = len(records) // shards
    for s in range(shards):
        with webdataset.TarWriter(str(root / f"laion-{s:05d}.tar")) as sink:
            for i in range(s * per, (s + 1) * per):
                sink.write({"__key__": f"{i:06d}", "jpg": jpeg(i), "txt": caption(i), "json": records[i]})
    return root


@pytest.fixture(scope="module")
def laion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wds(tmp_path_factory.mktemp("laion"), [record(i) for i in range(N)])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here (offline) on the captions, with <s> ... </s> added around each text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([caption(i) for i in range(N)] * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
    )
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def loader(path: Any, sock: str, **kw: Any) -> ringfeed.Loader:
    opts: dict[str, Any] = {
        "seed": 5,
        "shuffle": True,
        "fields": ["index"],
        "drop_last": False,
        "server": ringfeed.Server(socket=sock, spawn=True),
    }
    opts.update(kw)
    return ringfeed.Loader(path, 4, ringfeed.Resize((8, 8)), **opts)


def wds(path: Path) -> ringfeed.WebDataset:
    return ringfeed.WebDataset(str(path), label="")


def rows(batches: list[dict[str, Any]], names: list[str]) -> dict[int, dict[str, Any]]:
    """Each delivered sample's fields, by its index; a sample delivered twice fails."""
    out: dict[int, dict[str, Any]] = {}
    for b in batches:
        for p, i in enumerate(b["index"].tolist()):
            assert i not in out, f"sample {i} delivered twice"
            out[i] = {n: (b[n][p] if isinstance(b[n], list) else b[n][p].item()) for n in names}
    return out


def check_raw(got: dict[int, dict[str, Any]], records: list[dict[str, Any]]) -> None:
    for i, r in got.items():
        assert r["text"] == caption(i)
        assert r["aesthetic"] == pytest.approx(records[i]["aesthetic"])
        assert r["width"] == records[i]["width"]
        assert r["nsfw"] is records[i]["nsfw"]


RAW = {"text": ringfeed.Text("txt"), "meta": ringfeed.Meta("json", META)}
NAMES = ["text", *META]


def test_raw_captions_and_metadata_equal_the_sources_on_two_ranks(laion: Path, sock: str) -> None:
    """On 2 ranks every sample comes exactly once, with its caption (as str) and metadata (typed tensors)."""
    got: dict[int, dict[str, Any]] = {}
    for rank in (0, 1):
        with loader(wds(laion), sock, rank=rank, world_size=2, **RAW) as ld:
            ld.set_epoch(1)
            batches = list(ld)
        b = batches[0]
        assert set(b) == {"image", "label", "index", "text", *META}
        assert isinstance(b["text"], list)
        assert all(isinstance(t, str) for t in b["text"])
        assert (b["aesthetic"].dtype, b["width"].dtype, b["nsfw"].dtype) == (torch.float32, torch.int32, torch.bool)
        part = rows(batches, NAMES)
        assert not set(part) & set(got), "the ranks overlap"
        got.update(part)
    assert sorted(got) == list(range(N))
    check_raw(got, [record(i) for i in range(N)])


def test_views_and_hybrid_decode_keep_the_fields(laion: Path, sock: str) -> None:
    """With two views, and with hybrid decode (its host backend), the batch is a dict of the views
    and the fields, each sample's its own."""
    views = ringfeed.Views({"big": ringfeed.RandomResizedCrop(12), "small": ringfeed.RandomResizedCrop(8)})
    with ringfeed.Loader(
        wds(laion), 4, views, fields=["index"], server=ringfeed.Server(socket=sock, spawn=True), **RAW
    ) as ld:
        batches = list(ld)
    assert set(batches[0]) == {"big", "small", "label", "index", "text", *META}
    got = rows(batches, NAMES)
    assert sorted(got) == list(range(N))
    check_raw(got, [record(i) for i in range(N)])
    with ringfeed.Loader(
        wds(laion),
        4,
        ringfeed.RandomResizedCrop(16),
        fields=["index"],
        server=ringfeed.Server(socket=sock, spawn=True),
        gpu_decode=0.5,
        _gpu_backend="host",
        **RAW,
    ) as ld:
        batches = list(ld)
        assert ld.stats()["gpu_samples"] > 0
    got = rows(batches, NAMES)
    assert sorted(got) == list(range(N))
    check_raw(got, [record(i) for i in range(N)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_mode_moves_the_tensors_and_keeps_the_texts_on_the_host(laion: Path, sock: str) -> None:
    """In CUDA mode the metadata go to the device with the batch; texts stay Python strings; values as on the CPU."""
    with loader(wds(laion), sock, device="cuda", **RAW) as ld:
        batches = [{k: (v if isinstance(v, list) else v.cpu()) for k, v in b.items()} for b in ld]
    with loader(wds(laion), sock, device="cuda", **RAW) as ld:
        b = next(iter(ld))
        assert all(b[k].is_cuda for k in META)
        assert b["nsfw"].dtype == torch.bool
    got = rows(batches, NAMES)
    assert sorted(got) == list(range(N))
    check_raw(got, [record(i) for i in range(N)])


def test_fields_hold_across_a_resume(laion: Path, sock: str) -> None:
    """A state_dict taken mid-epoch resumes with the rest of the epoch, each sample's fields its own."""
    with loader(wds(laion), sock, **RAW) as ld:
        ld.set_epoch(2)
        it = iter(ld)
        first = [next(it) for _ in range(2)]
        first = [{k: (v if isinstance(v, list) else v.clone()) for k, v in b.items()} for b in first]
        state = ld.state_dict()
    with loader(wds(laion), sock, **RAW) as ld:
        ld.load_state_dict(state)
        rest = list(ld)
    got = rows(first, NAMES)
    later = rows(rest, NAMES)
    assert not set(got) & set(later)
    got.update(later)
    assert sorted(got) == list(range(N))
    check_raw(got, [record(i) for i in range(N)])


def test_tokenised_captions_equal_the_tokenizers_library(laion: Path, tokenizer: Path, sock: str) -> None:
    """Ids and masks are the Python tokenizers library's, token for token (non-ASCII, empty, truncated)."""
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(tokenizer))
    ref.enable_truncation(MAX_LENGTH)
    ref.enable_padding(length=MAX_LENGTH, pad_id=ref.token_to_id("<pad>"))
    text = ringfeed.Text("json:caption", name="caption", tokenizer=tokenizer, max_length=MAX_LENGTH)
    with loader(wds(laion), sock, text=text) as ld:
        batches = list(ld)
    b = batches[0]
    assert (b["caption_ids"].dtype, b["caption_mask"].dtype) == (torch.int32, torch.bool)
    assert b["caption_ids"].shape[1:] == (MAX_LENGTH,)
    seen = set()
    for b in batches:
        for p, i in enumerate(b["index"].tolist()):
            want = ref.encode(caption(i))
            assert b["caption_ids"][p].tolist() == want.ids, f"sample {i}: {caption(i)!r}"
            assert b["caption_mask"][p].tolist() == [bool(m) for m in want.attention_mask]
            seen.add(i)
    assert seen == set(range(N))
    # The cases that matter were there: a cut caption (ends with </s>), an empty one (<s> </s>).
    assert len(ref.encode(caption(7)).overflowing) > 0
    assert sum(ref.encode("").attention_mask) == 2


def bad_meta(tmp: Path, missing: int | None = 3, ill: int = 5) -> Path:
    records = [record(i) for i in range(8)]
    if missing is not None:
        del records[missing]["width"]
    records[ill]["width"] = "wide"
    return write_wds(tmp / "bad", records, shards=1)


def test_missing_or_ill_typed_metadata_follows_on_error(tmp_path: Path, sock: str) -> None:
    """Under raise the error names the sample and the field; under skip both samples are left out and counted."""
    d = bad_meta(tmp_path)
    meta = ringfeed.Meta("json", {"width": "int32"})
    with pytest.raises(ServerError) as e, loader(wds(d), sock, shuffle=False, meta=meta) as ld:
        list(ld)
    assert e.value.code == "sample"
    msg = str(e.value)
    assert "000003" in msg
    assert 'open.meta "width" (.json:width)' in msg
    assert "no key" in msg
    with loader(wds(d), sock, shuffle=False, meta=meta, text=ringfeed.Text("txt"), on_error="skip") as ld:
        got = rows(list(ld), ["width", "text"])
        assert ld.stats(server=False)["skipped"] == 2
    assert sorted(got) == [0, 1, 2, 4, 6, 7]
    # The samples after a skipped one moved up in their batch with their fields.
    assert all(got[i] == {"width": 100 + 3 * i, "text": caption(i)} for i in got)


def sample_error(d: Path, sock: str, meta: Any) -> str:
    """The message of the `sample` error that an epoch of the tars in `d` with `meta` ends in."""
    with pytest.raises(ServerError) as e, loader(wds(d), sock, shuffle=False, meta=meta) as ld:
        list(ld)
    assert e.value.code == "sample"
    return str(e.value)


def test_an_ill_typed_value_is_named(tmp_path: Path, sock: str) -> None:
    """A string where an int32 belongs fails naming the sample, the field and the value."""
    d = bad_meta(tmp_path, missing=None, ill=2)
    msg = sample_error(d, sock, ringfeed.Meta("json", {"width": "int32"}))
    assert "000002" in msg
    assert '"width"' in msg
    assert '"wide" is not an int32' in msg


def test_a_whole_member_is_a_metadata_field(tmp_path: Path, sock: str) -> None:
    """A WebDataset member that is not JSON (`.aesthetic` holding a number as text, `.nsfw` holding 0/1) is read
    whole: `Meta("aesthetic", {"aesthetic": ...})` and `Meta(None, {...})` give its values; a member whose text is
    no number fails naming the sample, the field and the text, or is skipped."""
    root = tmp_path / "scores"
    root.mkdir()
    n = 8
    with webdataset.TarWriter(str(root / "s-00000.tar")) as sink:
        for i in range(n):
            score = "high" if i == 5 else f"{4.0 + i / 8}\n"
            sink.write({"__key__": f"{i:06d}", "jpg": jpeg(i), "aesthetic": score, "nsfw": str(i % 2)})
    for meta in (
        [ringfeed.Meta("aesthetic", {"aesthetic": "float32"}), ringfeed.Meta("nsfw", {"nsfw": "bool"})],
        ringfeed.Meta(None, {"aesthetic": "float32", "nsfw": "bool"}),
    ):
        with loader(wds(root), sock, shuffle=False, meta=meta, on_error="skip") as ld:
            got = rows(list(ld), ["aesthetic", "nsfw"])
            assert ld.stats(server=False)["skipped"] == 1
        assert sorted(got) == [i for i in range(n) if i != 5]
        for i, r in got.items():
            assert r["aesthetic"] == pytest.approx(4.0 + i / 8)
            assert r["nsfw"] is (i % 2 == 1)
    msg = sample_error(root, sock, ringfeed.Meta("aesthetic", {"aesthetic": "float32"}))
    assert "000005" in msg
    assert 'open.meta "aesthetic" (.aesthetic)' in msg
    assert '"high" is not a float32' in msg
    # Another key of a member that is not JSON is refused, naming the way to read it whole.
    with pytest.raises(ServerError, match=r'the whole member \.aesthetic is source "aesthetic"'):
        loader(wds(root), sock, meta=ringfeed.Meta("aesthetic", {"score": "float32"}))


def test_a_text_over_max_bytes_fails_naming_max_bytes(laion: Path, sock: str) -> None:
    """Text is never cut: a caption longer than max_bytes is a sample error that names max_bytes."""
    with pytest.raises(ServerError) as e, loader(wds(laion), sock, text=ringfeed.Text("txt", max_bytes=10)) as ld:
        list(ld)
    assert e.value.code == "sample"
    assert "max_bytes = 10" in str(e.value)
    assert 'open.text "text" (.txt)' in str(e.value)


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_manifests_caption_column(tmp_path: Path, sock: str, kind: str) -> None:
    """A manifest's caption and metadata columns are served with each image (CSV cells as text, JSONL as JSON)."""
    n = 8
    for i in range(n):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg(i))
    path = tmp_path / f"m.{kind}"
    if kind == "csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["path", "label", "caption", "aesthetic", "nsfw"])
            for i in range(n):
                r = record(i)
                w.writerow([f"{i}.jpg", i % 2, r["caption"], r["aesthetic"], int(r["nsfw"])])
    else:
        with path.open("w", encoding="utf-8") as f:
            for i in range(n):
                r = record(i)
                row = {"path": f"{i}.jpg", "label": i % 2, "caption": r["caption"]}
                row |= {"aesthetic": r["aesthetic"], "nsfw": r["nsfw"]}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    meta = ringfeed.Meta(None, {"aesthetic": "float32", "nsfw": "bool"})
    with loader(path, sock, text=ringfeed.Text("caption"), meta=meta) as ld:
        batches = list(ld)
    got = rows(batches, ["text", "aesthetic", "nsfw", "label"])
    assert sorted(got) == list(range(n))
    for i, r in got.items():
        assert (r["text"], r["label"], r["nsfw"]) == (caption(i), i % 2, record(i)["nsfw"])
        assert r["aesthetic"] == pytest.approx(record(i)["aesthetic"])


def test_a_packed_dataset_asked_for_text_refuses(tmp_path: Path, sock: str) -> None:
    """A packed dataset holds no text: the open is refused naming the member and the source's kind."""
    for i in range(4):
        p = tmp_path / "src" / "cat" / f"{i}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(i))
    out = tmp_path / "ds"
    subprocess.run([ringfeed_bin(), "pack", str(tmp_path / "src"), str(out), "--progress", "none"], check=True)
    with pytest.raises(ServerError) as e:
        loader(out, sock, text=ringfeed.Text("txt"))
    assert e.value.code == "bad_request"
    msg = str(e.value)
    assert 'open.text "text"' in msg
    assert "holds no sample fields" in msg
    assert str(out) in msg


def test_field_options_are_checked_where_written() -> None:
    """Bad names, dtypes and bounds fail in the option objects, naming the parameter."""
    with pytest.raises(ValueError, match="name must match"):
        ringfeed.Text("txt", name="Caption")
    with pytest.raises(ValueError, match="at most 11 bytes"):
        ringfeed.Text("txt", name="caption_text")  # its ring field caption_text_mask would not fit
    with pytest.raises(ValueError, match=r"max_length must be an integer in 1\.\.=8192"):
        ringfeed.Text("txt", tokenizer="t.json", max_length=0)
    with pytest.raises(ValueError, match="dtype of 'w' must be one of"):
        ringfeed.Meta("json", {"w": "float16"})
    assert ringfeed.Meta("json", {"meta.w": "int64"}).requests() == [
        {"name": "meta_w", "source": "json:meta.w", "dtype": "int64"}
    ]


def test_the_fields_open_members_are_the_vectors(laion: Path, sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `text` and `meta` a Loader sends are the frames.json vector "open, 1.9 sample fields" (which
    the Rust side decodes into its OpenRequest and encodes back byte for byte)."""
    want = frame_vector("open, 1.9 sample fields")
    sent = record_sent(monkeypatch)
    caption = want["text"][1]
    text = [
        ringfeed.Text("txt", max_bytes=1024),
        ringfeed.Text("json:caption", name="caption", tokenizer=caption["tokenizer"], max_length=77),
    ]
    meta = ringfeed.Meta("json", {"aesthetic": "float32", "width": "int32", "nsfw": "bool"})
    # The tokenizer the vector names is not on this machine: the server refuses, after the open was sent.
    with pytest.raises(ServerError, match="tokenizer"):
        loader(wds(laion), sock, text=text, meta=meta)
    got = next(m for m in sent if m["type"] == "open")
    assert (got["text"], got["meta"]) == (want["text"], want["meta"])


def test_an_older_server_is_refused_naming_its_version(serve: Any) -> None:
    """A 1.8 server would ignore `text` and `meta`: the loader refuses it, naming both versions, before any open."""
    from _fakeserver import DATASET

    server = serve(protocol=(1, 8))
    with pytest.raises(ringfeed.RingfeedError, match=r"protocol 1\.8; text and metadata fields need .*1\.9"):
        ringfeed.Loader(
            DATASET,
            2,
            ringfeed.Resize((4, 6)),
            server=ringfeed.Server(socket=server.path, spawn=False, timeout=5),
            text=ringfeed.Text("txt"),
        )


def test_more_fields_than_the_ring_holds_are_refused(laion: Path, sock: str) -> None:
    """A ring holds 16 fields (ring.md): image, label, index and 14 metadata fields are refused, naming the members."""
    meta = ringfeed.Meta("json", {f"m{k}": "float32" for k in range(14)})
    with pytest.raises(ServerError) as e:
        loader(wds(laion), sock, meta=meta)
    assert e.value.code == "bad_request"
    assert "open.text and open.meta" in str(e.value)
    assert "17 ring fields" in str(e.value)
