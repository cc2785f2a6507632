"""``python -m ringfeed.bench`` (what ``ringfeed bench`` runs): a real run on a small packed dataset,
against the real server and a real DataLoader + PIL. Timing is not tested, only that the report
is complete and agrees with itself."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from _fleet import binary, client_env, make_dataset

import ringfeed
from ringfeed.bench import needed

N = 32
BS = 8


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("bench"), N, size=(64, 48))


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**client_env(), "RINGFEED_BIN": binary()}
    return subprocess.run(
        [sys.executable, "-m", "ringfeed.bench", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_run_reports_every_thread_count_for_both_loaders_consistently(dataset: Path, tmp_path: Path) -> None:
    """Each thread count has a ringfeed and a DataLoader + PIL measurement whose images are whole
    batches and whose rate is images / seconds; the printed table shows the same figures; and the
    threads for an unreachable target are extrapolated from the best measured rate per thread."""
    report_path = tmp_path / "bench.json"
    target = 1e9
    out = bench(
        str(dataset), "--threads", "2,1", "--size", "32", "--batch-size", str(BS), "--seconds", "0.3",
        "--batches", "3", "--target", str(target), "--json", str(report_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    r = json.loads(report_path.read_text())
    assert (r["version"], r["dataset"], r["batch_size"]) == (1, str(dataset), BS)
    assert r["transform"] == repr(ringfeed.RandomResizedCrop(32) + ringfeed.Flip())
    assert [p["threads"] for p in r["points"]] == [1, 2]
    for p in r["points"]:
        for key in ("ringfeed", "dataloader_pil"):
            m = p[key]
            assert m["batches"] >= 3, (key, m)
            assert m["seconds"] >= 0.3, (key, m)
            assert m["images"] == m["batches"] * BS, (key, m)
            assert math.isclose(m["img_per_s"], m["images"] / m["seconds"], rel_tol=1e-9), (key, m)
    for key in ("ringfeed", "dataloader_pil"):
        points = [(p["threads"], p[key]["img_per_s"]) for p in r["points"]]
        best = max(rate / t for t, rate in points)
        assert r["target"][key] == {"threads": math.ceil(target / best), "extrapolated": True, "img_per_s": None}
    table = out.stdout.splitlines()
    for p in r["points"]:
        row = f"{p['ringfeed']['img_per_s']:>14,.0f}  {p['dataloader_pil']['img_per_s']:>22,.0f}"
        assert any(line.startswith(f"{p['threads']:>7}  {row}") for line in table), (row, out.stdout)
    assert "to feed 1,000,000,000 img/s:" in out.stdout


def test_a_reachable_target_names_the_fewest_measured_threads() -> None:
    """The threads for a target are the fewest measured whose rate reaches it, whatever order
    the points come in; beyond every measurement it is the best rate per thread's ceiling."""
    points = [(4, 900.0), (1, 300.0), (2, 500.0)]
    assert needed(points, 450.0) == {"threads": 2, "extrapolated": False, "img_per_s": 500.0}
    assert needed(points, 300.0) == {"threads": 1, "extrapolated": False, "img_per_s": 300.0}
    assert needed(points, 3000.0) == {"threads": 10, "extrapolated": True, "img_per_s": None}


def test_a_dataset_that_is_not_packed_names_the_option_to_skip_the_baseline(tmp_path: Path) -> None:
    """The DataLoader baseline reads packed datasets only; anything else is refused before any
    measurement, naming --no-baseline."""
    out = bench(str(tmp_path), "--threads", "1")
    assert out.returncode != 0
    assert "not a packed dataset" in out.stderr, out.stderr
    assert "--no-baseline" in out.stderr, out.stderr
