"""How the package and the binary come together: one version, and the lookup of the binary to
start (``$RINGFEED_BIN``, the one installed with this package, ``PATH``). The wheel itself is
built, installed into a fresh virtualenv and run from there by ``scripts/wheel_smoke``."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _fleet import REPO, binary

import ringfeed
from ringfeed.wire import sidecar

HERE = Path(ringfeed.__file__).resolve()


def test_one_version_for_the_package_the_wheel_and_the_binary() -> None:
    """``ringfeed.__version__``, the Cargo workspace's version (the wheel's, through maturin),
    client-py's pyproject and ``ringfeed --version`` agree."""
    cargo = _first(r'\[workspace\.package\][^\[]*?\nversion = "([^"]+)"', REPO / "Cargo.toml")
    client = _first(r'\[project\][^\[]*?\nversion = "([^"]+)"', REPO / "client-py" / "pyproject.toml")
    out = subprocess.run([binary(), "--version"], capture_output=True, text=True, check=True).stdout.split()
    assert (ringfeed.__version__, client, out) == (cargo, cargo, ["ringfeed", cargo])
    # The wheel takes the Cargo version (maturin), never one of its own.
    assert _first(r"\[project\][^\[]*?\ndynamic = (\[[^\]]*\])", REPO / "pyproject.toml") == '["version"]'


def _first(pattern: str, path: Path) -> str:
    m = re.search(pattern, path.read_text())
    assert m is not None, f"{pattern} not in {path}"
    return m.group(1)


def fake_install(site: Path, package_init: Path, bin_dir: Path) -> Path:
    """A ``ringfeed`` distribution in ``site`` as pip records one: its RECORD lists
    ``package_init`` and ``bin_dir/ringfeed`` (an executable), relative to ``site``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "ringfeed"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    info = site / "ringfeed-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ringfeed\nVersion: 0.0.0\n")
    rows = [os.path.relpath(package_init, site), os.path.relpath(exe, site), "ringfeed-0.0.0.dist-info/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in rows))
    return exe


def on_path(tmp: Path) -> Path:
    d = tmp / "path-bin"
    d.mkdir()
    exe = d / "ringfeed"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


def test_the_binary_installed_with_this_package_comes_before_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the installed distribution's files include this very ``ringfeed/__init__.py``, its
    ``bin/ringfeed`` is started rather than another ``ringfeed`` on ``PATH``; ``$RINGFEED_BIN``
    still overrides both."""
    site = tmp_path / "site"
    installed = fake_install(site, HERE.parent / "__init__.py", tmp_path / "venv" / "bin")
    other = on_path(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("RINGFEED_BIN", raising=False)
    monkeypatch.setenv("PATH", str(other.parent))
    assert sidecar.find_server_binary() == str(installed.resolve())
    monkeypatch.setenv("RINGFEED_BIN", "/opt/explicit/ringfeed")
    assert sidecar.find_server_binary() == "/opt/explicit/ringfeed"


def test_another_installed_copy_does_not_lend_its_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout imported from ``PYTHONPATH`` beside an installed wheel of another copy starts
    ``ringfeed`` from ``PATH``, not that wheel's binary (it may be another version)."""
    site = tmp_path / "site"
    elsewhere = tmp_path / "elsewhere" / "ringfeed" / "__init__.py"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text("")
    fake_install(site, elsewhere, tmp_path / "venv" / "bin")
    other = on_path(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("RINGFEED_BIN", raising=False)
    monkeypatch.setenv("PATH", str(other.parent))
    assert sidecar.installed_binary() is None
    assert sidecar.find_server_binary() == str(other)


def test_bench_module_runs_as_a_script() -> None:
    """``python -m ringfeed.bench --help`` is the entry point ``ringfeed bench`` runs."""
    out = subprocess.run(
        [sys.executable, "-m", "ringfeed.bench", "--help"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: ringfeed bench")
    assert "--target IMG_PER_S" in out.stdout
