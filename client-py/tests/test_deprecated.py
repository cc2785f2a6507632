"""The keywords the option objects replaced (issue 28, "one way to say each thing"): each still
works for one release with exactly one ``DeprecationWarning`` naming its new spelling, gives the
same batches as the new spelling from a real server, and mixing it with the object that now owns
it is refused, naming both.

The warnings are checked with ``pytest.warns``; anything else that warns fails the test (the
suite's ``filterwarnings = ["error"]``), so the rest of the suite shows it uses the new spellings.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _fleet import make_dataset

import ringfeed

N, B = 24, 4
NOWHERE = "/nonexistent/ringfeed.sock"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("deprecated"), N)


def warned(record: pytest.WarningsRecorder) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DeprecationWarning)]


# -- one warning per old keyword, naming the new spelling -----------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "message"),
    [
        ({"socket": NOWHERE}, r"Loader\(socket=...\) is deprecated: use server=ringfeed.Server\(socket=...\)"),
        ({"spawn": False}, r"Loader\(spawn=...\) is deprecated: use server=ringfeed.Server\(spawn=...\)"),
        ({"timeout": 5.0}, r"Loader\(timeout=...\) is deprecated: use server=ringfeed.Server\(timeout=...\)"),
        ({"spawn_timeout": 5.0}, r"use server=ringfeed.Server\(spawn_timeout=...\)"),
        ({"reconnect": 2}, r"use server=ringfeed.Server\(reconnect=...\)"),
        ({"reconnect_timeout": 5.0}, r"use server=ringfeed.Server\(reconnect_timeout=...\)"),
        ({"on_opening": print}, r"use server=ringfeed.Server\(on_opening=...\)"),
        ({"slots": 3}, r"Loader\(slots=...\) is deprecated: use tuning=ringfeed.Tuning\(slots=...\)"),
        ({"hold": 1}, r"use tuning=ringfeed.Tuning\(hold=...\)"),
        ({"threads": 2}, r"use tuning=ringfeed.Tuning\(threads=...\)"),
        ({"prefetch": 2}, r"use tuning=ringfeed.Tuning\(prefetch=...\)"),
        ({"autotune": False}, r"use tuning=ringfeed.Tuning\(autotune=...\)"),
        ({"log_every": 10}, r"use tuning=ringfeed.Tuning\(log_every=...\)"),
        ({"order_block": 4}, r"Loader\(order_block=...\) is deprecated: use order=ringfeed.ShardBlocks\(block=...\)"),
        ({"order_shard": 64}, r"use order=ringfeed.ShardBlocks\(shard=...\)"),
        ({"gpu_decode_bytes": 1 << 16}, r"use gpu_decode=ringfeed.GPUDecode\(bytes_per_sample=...\)"),
        ({"lmdb": {"layout": "raw"}}, r"Loader\(lmdb=\{...\}\) is deprecated: use path=ringfeed.LMDB\(path, ...\)"),
        ({"webdataset": {"label": ""}}, r"use path=ringfeed.WebDataset\(path, ...\)"),
        ({"normalize": (MEAN, STD)}, r"Loader\(normalize=\(mean, std\)\) is deprecated: use ringfeed.Normalize"),
    ],
)
def test_each_old_keyword_warns_once_naming_the_new_spelling(old: dict[str, Any], message: str) -> None:
    """An old keyword is one DeprecationWarning, pointing at the caller's line, before anything else happens."""
    kw: dict[str, Any] = {"socket": NOWHERE} | old  # nothing listens: the constructor fails after the warnings
    with pytest.warns(DeprecationWarning, match="is deprecated: use ") as record, pytest.raises(ringfeed.RingfeedError):
        ringfeed.Loader("/data/x", B, ringfeed.Resize((8, 8)), **kw)
    messages = warned(record)
    assert len(messages) == len(kw), messages
    assert sum(bool(re.search(message, m)) for m in messages) == 1, messages
    assert {w.filename for w in record} == {__file__}


def test_token_loader_keywords_warn_and_dtype_is_token_dtype() -> None:
    """TokenLoader's server and tuning keywords warn like Loader's; its dtype= (the file's type) is token_dtype=."""
    with pytest.warns(DeprecationWarning, match="is deprecated: use ") as record, pytest.raises(ringfeed.RingfeedError):
        ringfeed.TokenLoader("/data/t.bin", 2, 8, socket=NOWHERE, threads=1, dtype="uint16")
    assert sorted(warned(record)) == [
        "TokenLoader(dtype=...) is deprecated: use token_dtype=... (the token file's type)",
        "TokenLoader(socket=...) is deprecated: use server=ringfeed.Server(socket=...)",
        "TokenLoader(threads=...) is deprecated: use tuning=ringfeed.Tuning(threads=...)",
    ]
    with pytest.raises(
        ValueError, match=r"token_dtype must be 'uint16' or 'uint32' \(a flat token file's\), got 'int8'"
    ):
        ringfeed.TokenLoader("/data/t.bin", 2, 8, server=ringfeed.Server(socket=NOWHERE), token_dtype="int8")


def test_unknown_keywords_are_still_type_errors() -> None:
    """A keyword no release had is Python's TypeError, not swallowed by the deprecated ones."""
    with pytest.raises(TypeError, match=r"Loader\(\) got an unexpected keyword argument 'sockets'"):
        ringfeed.Loader("/data/x", B, ringfeed.Resize((8, 8)), sockets=NOWHERE)
    with pytest.raises(TypeError, match=r"TokenLoader\(\) got an unexpected keyword argument 'layout'"):
        ringfeed.TokenLoader("/data/t.bin", 2, 8, layout="NCHW")


# -- mixing an old keyword with its new owner -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"socket": NOWHERE, "server": ringfeed.Server(socket=NOWHERE)},
            r"Loader: socket= and server=ringfeed.Server\(...\) both given; set it once, in server=ringfeed.Server",
        ),
        (
            {"threads": 2, "slots": 3, "tuning": ringfeed.Tuning()},
            r"Loader: threads=, slots= and tuning=ringfeed.Tuning\(...\) both given; set it once, in tuning=",
        ),
        ({"order_block": 2, "order": ringfeed.ShardBlocks(block=4)}, r"order_block= and order=ringfeed.ShardBlocks"),
        (
            {"gpu_decode_bytes": 1 << 16, "gpu_decode": ringfeed.GPUDecode(share=False)},
            r"gpu_decode_bytes= and gpu_decode=ringfeed.GPUDecode\(...\) both given",
        ),
        ({"lmdb": {"layout": "raw"}, "path": ringfeed.LMDB("/data/x.lmdb")}, r"lmdb= and path=ringfeed.LMDB"),
        (
            {"webdataset": {"label": ""}, "path": ringfeed.WebDataset("/data/x.tar")},
            r"webdataset= and path=ringfeed.WebDataset",
        ),
        (
            {"normalize": (MEAN, STD), "transform": ringfeed.Resize((8, 8)) + ringfeed.Normalize(MEAN, STD)},
            r"has its own Normalize in its Compose; pass Normalize \(or the deprecated normalize=\), not both",
        ),
    ],
)
def test_an_old_keyword_beside_its_new_owner_is_refused(kw: dict[str, Any], match: str) -> None:
    """An old keyword and the option object that now holds it are a ValueError naming both, before connecting."""
    args: dict[str, Any] = {"path": "/data/x", "transform": ringfeed.Resize((8, 8))} | kw
    if "server" not in args and "socket" not in args:
        args["server"] = ringfeed.Server(socket=NOWHERE)
    with pytest.warns(DeprecationWarning, match="is deprecated: use "), pytest.raises(ValueError, match=match):
        ringfeed.Loader(args.pop("path"), B, args.pop("transform"), **args)


def test_token_dtype_beside_dtype_is_refused() -> None:
    """TokenLoader(dtype=..., token_dtype=...) names both."""
    with (
        pytest.warns(DeprecationWarning, match="is deprecated: use "),
        pytest.raises(ValueError, match=r"dtype= and token_dtype= both given"),
    ):
        ringfeed.TokenLoader(
            "/data/t.bin", 2, 8, server=ringfeed.Server(socket=NOWHERE), dtype="uint16", token_dtype="uint16"
        )


# -- the same batches both ways, from a real server -----------------------------------------------------------------


def epoch(*args: Any, **kw: Any) -> list[dict[str, torch.Tensor]]:
    """Epoch 1 of a shuffled loader, every batch copied while it is valid."""
    with ringfeed.Loader(*args, shuffle=True, seed=7, fields=["index"], **kw) as ld:
        ld.set_epoch(1)
        return [{k: v.clone() for k, v in b.items()} for b in ld]


def same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype, k
            assert torch.equal(x[k], y[k]), k


def test_old_and_new_spellings_give_the_same_batches(dataset: Path, sock: str) -> None:
    """The server, tuning and order keywords, and normalize= against the Normalize op (float32 and bfloat16),
    give bit-identical batches on the CPU."""
    crop = ringfeed.RandomResizedCrop(16) + ringfeed.Flip()
    for dtype in (None, torch.bfloat16):
        with pytest.warns(DeprecationWarning, match="is deprecated: use ") as record:
            old = epoch(
                dataset, B, crop, socket=sock, spawn=True, timeout=30.0, slots=3, hold=2, threads=2,
                autotune=False, prefetch=2, order="shard_blocks", order_block=2, normalize=(MEAN, STD), dtype=dtype,
            )  # fmt: skip
        assert len(warned(record)) == 10
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            new = epoch(
                dataset, B, crop + ringfeed.Normalize(MEAN, STD), dtype=dtype,
                server=ringfeed.Server(socket=sock, spawn=True, timeout=30.0),
                tuning=ringfeed.Tuning(slots=3, hold=2, threads=2, autotune=False, prefetch=2),
                order=ringfeed.ShardBlocks(block=2),
            )  # fmt: skip
        assert new[0]["image"].dtype == (dtype or torch.float32)
        assert tuple(new[0]["image"].shape) == (B, 3, 16, 16)
        same(old, new)


def test_loader_server_is_server_version_and_warns(dataset: Path, sock: str) -> None:
    """``loader.server`` (the server's version string) is now ``loader.server_version``: the old
    name still answers, with one warning pointing at the caller's line."""
    with ringfeed.Loader(dataset, B, ringfeed.CenterCrop(16), server=ringfeed.Server(socket=sock, spawn=True)) as ld:
        assert ld.server_version is not None
        assert ld.server_version.startswith("ringfeed ")
        with pytest.warns(DeprecationWarning, match=r"loader.server is deprecated: use loader.server_version") as rec:
            assert ld.server == ld.server_version
        assert len(warned(rec)) == 1
        assert rec[0].filename == __file__


def test_lmdb_options_and_the_lmdb_source_give_the_same_batches(tmp_path: Path, sock: str) -> None:
    """lmdb={...} and path=ringfeed.LMDB(path, ...) open the same LMDB the same way (here raw values with a
    label table under a key: the labels show the options reached the server)."""
    lmdb = pytest.importorskip("lmdb")
    from PIL import Image

    labels = {f"{i:04d}": i % 3 for i in range(12)}
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, key in enumerate(labels):
            buf = io.BytesIO()
            Image.new("RGB", (20, 16), (i * 20, 255 - i * 20, 7)).save(buf, "JPEG", quality=90)
            txn.put(key.encode(), buf.getvalue())
        txn.put(b"__labels__", json.dumps(labels).encode())
    env.close()
    server = ringfeed.Server(socket=sock, spawn=True)
    with pytest.warns(DeprecationWarning, match=r"Loader\(lmdb=\{...\}\) is deprecated"):
        old = epoch(
            tmp_path / "db", B, ringfeed.Resize((8, 8)), server=server,
            lmdb={"layout": "raw", "labels_key": "__labels__"},
        )  # fmt: skip
    new = epoch(
        ringfeed.LMDB(tmp_path / "db", layout="raw", labels_key="__labels__"), B, ringfeed.Resize((8, 8)), server=server
    )
    same(old, new)
    got = {int(i): int(label) for b in new for i, label in zip(b["index"], b["label"], strict=True)}
    assert got == {i: i % 3 for i in range(12)}


def test_token_dtype_and_dtype_read_a_flat_file_the_same(tmp_path: Path, sock: str) -> None:
    """A flat uint16 token file read with the old dtype= and the new token_dtype= gives the same windows."""
    tokens = (np.arange(4000) * 7919 % 50000).astype(np.uint16)
    path = tmp_path / "flat.bin"
    tokens.tofile(path)
    server = ringfeed.Server(socket=sock, spawn=True)

    def windows(**kw: Any) -> list[torch.Tensor]:
        with ringfeed.TokenLoader(path, 4, 16, server=server, shuffle=True, seed=3, **kw) as ld:
            return [b["input_ids"].clone() for b in ld]

    with pytest.warns(DeprecationWarning, match=r"TokenLoader\(dtype=...\) is deprecated"):
        old = windows(dtype="uint16")
    new = windows(token_dtype="uint16")
    assert len(old) == len(new) > 0
    assert all(torch.equal(a, b) for a, b in zip(old, new, strict=True))
    # Every value occurs once in the file, so each window is the run of the file that starts at its first token.
    where = {int(t): i for i, t in enumerate(tokens)}
    for batch in new:
        for window in batch.tolist():
            start = where[window[0]]
            assert window == tokens[start : start + 16].tolist()
