"""``ringfeed bench --plot FILE.png``: the printed table drawn as a bar chart, from a real run on a
small packed dataset against the real server and a real DataLoader + PIL. What is drawn is not
compared pixel by pixel; that a PNG of the table is written, and that a missing matplotlib is
named before anything is measured, is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _fleet import binary, client_env, make_dataset

from ringfeed import RingfeedError, bench

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("plot"), 16, size=(40, 32))


def test_plot_draws_the_measured_table_as_a_png(dataset: Path, tmp_path: Path) -> None:
    """``--plot`` writes a PNG beside the same report that ``--json`` writes, from one run."""
    pytest.importorskip("matplotlib")
    png, report = tmp_path / "bench.png", tmp_path / "bench.json"
    out = subprocess.run(
        [
            sys.executable, "-m", "ringfeed.bench", str(dataset), "--threads", "1,2", "--size", "24",
            "--batch-size", "4", "--seconds", "0.2", "--batches", "2", "--json", str(report), "--plot", str(png),
        ],
        env={**client_env(), "RINGFEED_BIN": binary()}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert png.read_bytes().startswith(PNG)
    assert png.stat().st_size > 5_000, "a chart, not an empty image"
    assert [p["threads"] for p in json.loads(report.read_text())["points"]] == [1, 2]


def test_plot_draws_a_table_without_the_baseline(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report measured with ``--no-baseline`` (ringfeed alone) is drawn too."""
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("RINGFEED_BIN", binary())
    report = bench.run(str(dataset), size=24, batch_size=4, threads=[1], baseline=False, min_batches=2, min_seconds=0.2)
    bench.plot(report, tmp_path / "alone.png")
    assert (tmp_path / "alone.png").read_bytes().startswith(PNG)


def test_without_matplotlib_the_error_names_the_install(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without matplotlib, ``--plot`` fails before measuring, with a message naming
    ``pip install matplotlib``; ``plot`` itself raises the same."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    png = tmp_path / "never.png"
    assert bench.main([str(dataset), "--threads", "1", "--plot", str(png)]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not png.exists()
    with pytest.raises(RingfeedError, match="pip install matplotlib"):
        bench.plot({"points": []}, png)
