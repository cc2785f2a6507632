"""The README's quick start runs as written: its shell block packs a small image folder with the
real ``ringfeed`` binary, and its Python block trains against the real server that the Loader
starts by itself.

The blocks are read from README.md, under the "Quick start" heading. Two things are substituted,
and only these: ``pip install`` lines are not run (the tests run this checkout's client and
binary, ``PYTHONPATH`` and ``RINGFEED_BIN``), and the leading ``ringfeed`` of a command is the
binary under test. The Loader finds no server on ``RINGFEED_SOCKET`` (a private path) and starts
one there, as it does for a user with no sidecar running.
"""

from __future__ import annotations

import io
import math
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from _support import REPO, ringfeed_bin
from PIL import Image

README = REPO / "README.md"
#: The quick start's folder: 64 images make one batch of 64 per epoch, with drop_last=True.
IMAGES, CLASSES = 64, 4


def quick_start() -> dict[str, list[str]]:
    """The fenced code blocks of the README's "Quick start" section, by language."""
    text = README.read_text()
    m = re.search(r"^## Quick start\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert m, "README.md has no '## Quick start' section"
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", m.group(1), flags=re.S | re.M):
        blocks.setdefault(lang, []).append(body)
    return blocks


def test_the_quick_start_is_at_most_fifteen_lines() -> None:
    """Install, pack and a training loop fit in 15 lines of code, as the README promises."""
    blocks = quick_start()
    assert set(blocks) == {"bash", "python"}, blocks.keys()
    lines = [ln for body in (*blocks["bash"], *blocks["python"]) for ln in body.splitlines() if ln.strip()]
    assert len(lines) <= 15, lines


def make_folder(root: Path) -> None:
    """An ImageFolder of IMAGES small JPEGs in CLASSES class directories, of varied sizes."""
    for i in range(IMAGES):
        p = root / f"class{i % CLASSES}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        colour = ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)
        Image.new("RGB", (120 + i % 17, 100 + i % 11), colour).save(buf, "JPEG", quality=90)
        p.write_bytes(buf.getvalue())


def test_the_quick_start_runs_as_written(tmp_path: Path, sock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell block packs ``images/``; the Python block then trains two epochs on it, each a
    full batch of 64 normalised 112x112 images with labels of the folder's classes, and the loss
    it ends with is finite."""
    blocks = quick_start()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RINGFEED_SOCKET", sock)
    make_folder(tmp_path / "images")
    ran = 0
    for body in blocks["bash"]:
        for line in body.splitlines():
            argv = shlex.split(line, comments=True)
            if not argv or argv[:2] == ["pip", "install"]:
                continue
            assert argv[0] == "ringfeed", f"the quick start runs only pip and ringfeed: {line!r}"
            r = subprocess.run([ringfeed_bin(), *argv[1:]], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (line, r.stderr)
            ran += 1
    assert ran >= 1, "the shell block packs the folder"

    ns: dict[str, Any] = {"__name__": "__readme__"}
    try:
        exec(compile("\n".join(blocks["python"]), str(README), "exec"), ns)
        assert ns["epoch"] == 1, "two epochs ran"
        images, labels, loss = ns["images"], ns["labels"], ns["loss"]
        assert images.shape == (64, 3, 112, 112)
        assert images.dtype == torch.float32
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert ns["loader"].classes == tuple(f"class{c}" for c in range(CLASSES))
        assert set(labels.tolist()) <= set(range(CLASSES))
        assert math.isfinite(loss.item())
    finally:
        if "loader" in ns:
            ns["loader"].close()
