"""Issue 29's CLIP bench at toy size on the CPU: ``benches/make_laion.py`` writes a LAION-like
WebDataset with the real ``webdataset`` library and trains a tokenizer, and
``benches/clip_train.py`` trains its small CLIP on it, fed by each of its loaders, against the real
server. Timing is not tested: that the set is what the bench says, that its two loaders tokenise
alike, and that every run is reported and agrees with itself, is."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import pytest
from _fleet import REPO, binary, client_env

import ringfeed

pytest.importorskip("webdataset")
pytest.importorskip("tokenizers")

N, PER_SHARD = 24, 8


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**client_env(), "RINGFEED_BIN": binary()}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def laion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LAION-like set of N photos of several sizes (a corpus in make_photos.py's layout)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("laion")
    photos = root / "photos"
    rows = []
    for i in range(N):
        rel = f"c{i % 3:04d}/{i:08d}.jpg"
        (photos / rel).parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.new("RGB", (40 + i, 72 - i), (i * 9 % 256, 80, 200)).save(buf, "JPEG", quality=90)
        (photos / rel).write_bytes(buf.getvalue())
        rows.append(f"{rel}\t{i % 3}\t{len(buf.getvalue())}\n")
    (photos / "manifest.tsv").write_text("".join(rows))
    out = run(
        str(REPO / "benches" / "make_laion.py"), str(root / "set"), "--photos", str(photos), "--count", str(N),
        "--per-shard", str(PER_SHARD), "--vocab", "2000",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return root


def test_the_set_is_laion_shaped_and_its_manifest_says_so(laion: Path) -> None:
    """Every sample has a JPEG, a caption of 5-40 words and metadata whose caption is that caption
    and whose sizes are the JPEG's, in shards of --per-shard samples; laion.json names them."""
    from PIL import Image

    doc = json.loads((laion / "set" / "laion.json").read_text())
    assert (doc["count"], doc["shards"]) == (N, N // PER_SHARD)
    assert doc["urls"] == f"{laion / 'set' / 'tars'}/{{00000..{N // PER_SHARD - 1:05d}}}.tar"
    samples: dict[str, dict[str, bytes]] = defaultdict(dict)
    for shard in sorted((laion / "set" / "tars").glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = tar.getmembers()
            assert len(members) == 3 * PER_SHARD, shard
            for m in members:
                key, ext = m.name.split(".", 1)
                samples[key][ext] = tar.extractfile(m).read()
    assert sorted(samples) == [f"{i:09d}" for i in range(N)]
    for i, (key, s) in enumerate(sorted(samples.items())):
        assert set(s) == {"jpg", "txt", "json"}, key
        caption = s["txt"].decode()
        meta = json.loads(s["json"])
        assert meta["caption"] == caption, key
        assert 5 <= len(caption.split()) <= 40, caption
        assert (meta["width"], meta["height"]) == Image.open(io.BytesIO(s["jpg"])).size == (40 + i, 72 - i)
        assert 1.0 <= meta["aesthetic"] <= 10.0
    assert len({s["txt"] for s in samples.values()}) == N, "captions are distinct sentences"


def test_the_server_tokenises_captions_as_the_dataloader_workers_do(laion: Path, sock: str) -> None:
    """ringfeed's server and clip_train.py's DataLoader pipeline (the HF library, truncated and
    padded to 77) give the same ids and mask for every caption, with the set's CLIP-like tokenizer
    (lowercased, <|startoftext|> ... <|endoftext|>)."""
    sys.path.insert(0, str(REPO / "benches"))
    from clip_train import CONTEXT, Tokenize

    doc = json.loads((laion / "set" / "laion.json").read_text())
    tokenize = Tokenize(doc["tokenizer"])
    with ringfeed.Loader(
        ringfeed.WebDataset(doc["urls"], label=""),
        8,
        ringfeed.Resize((16, 16)),
        text=[ringfeed.Text("txt", tokenizer=doc["tokenizer"], max_length=CONTEXT), ringfeed.Text("txt", name="raw")],
        server=ringfeed.Server(socket=sock, spawn=True),
    ) as ld:
        seen = 0
        for b in ld:
            for caption, ids, mask in zip(b["raw"], b["text_ids"], b["text_mask"], strict=True):
                want_ids, want_mask = tokenize(caption)
                assert ids.tolist() == want_ids.tolist(), caption
                assert mask.tolist() == want_mask.tolist(), caption
                assert ids[0] == tokenize.tok.token_to_id("<|startoftext|>")
                seen += 1
    assert seen == N


def test_every_loader_trains_and_is_reported_against_the_ceiling(laion: Path, tmp_path: Path) -> None:
    """One JSON line per run (the ceiling once, ringfeed and the DataLoader per thread count), each
    of whole timed steps with a finite loss, its ratio its rate over the ceiling's; clip.json and
    clip.md hold the same runs."""
    batch, steps = 4, 2
    out = run(
        str(REPO / "benches" / "clip_train.py"), "--data", str(laion / "set"), "--device", "cpu", "--batch",
        str(batch), "--steps", str(steps), "--image-size", "32", "--warmup-s", "0", "--warmup-steps", "1",
        "--threads", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["loader"], r["threads"]) for r in runs] == [("ceiling", None), ("ringfeed", 1), ("dataloader", 1)]
    ceiling = runs[0]["img_per_s"]
    for r in runs:
        assert (r["steps"], r["images"]) == (steps, steps * batch), r
        assert math.isclose(r["img_per_s"], r["images"] / r["seconds"], rel_tol=1e-9), r
        assert math.isclose(r["ratio"], r["img_per_s"] / ceiling, rel_tol=1e-9), r
        assert math.isfinite(r["loss"]), r
        assert 0.0 <= r["wait_share"] <= 1.0, r
    assert runs[1]["gpu_decode_reason"] == "the loader's device is the CPU"
    record = json.loads((tmp_path / "clip.json").read_text())
    assert record["runs"] == runs
    assert record["baseline"]["name"] == "ceiling"
    table = (tmp_path / "clip.md").read_text()
    for r in runs:
        assert f"| {r['loader']} | {r['threads'] or '-'} | {r['img_per_s']:.0f} |" in table, table
