"""The wheel stands alone: built from the sdist as a user builds it (``python -m build``), passed by ``twine
check``, holding the package with its presets, market data and licences, and installed (not editable)
into a fresh virtualenv beside the pinned CPU torch, where the ``phalanx`` command trains, backtests and
lists the envs from a directory outside the repository.

The builds and the virtualenv need setuptools, torch and phalanx's dependencies from the package index
or pip's cache, as ``make`` does, and skip where neither has them (TORCH_SPEC: the Makefile's torch pin,
which it exports). ~80 s on a loaded 2-core machine with pip's cache warm, most of it installing (without
compiling the .py files to bytecode: that doubled it); the virtualenv (~1.4 GB) is removed after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from phalanx import __version__
from phalanx.config import presets

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "phalanx"
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # the Makefile's default, for pytest run alone
SDIST_METADATA = {"PKG-INFO", "setup.cfg"}  # what setuptools writes into every sdist


def run(*command, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a command outside the repository's source: without PYTHONPATH, so that only what is installed
    where the command runs is imported."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def installs(*command, cwd: Path) -> None:
    """Run a command that installs packages (a build's setuptools, torch, phalanx's dependencies); skip
    the test where it cannot reach a package index and pip's cache lacks a package, fail otherwise."""
    done = run(*command, cwd=cwd)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        unreachable = [line for line in output.splitlines() if "connection" in line.lower()]
        if unreachable:
            pytest.skip(f"no package index to install from: {unreachable[-1].strip()}")
        pytest.fail(f"{' '.join(map(str, command))} failed:\n{output[-3000:]}")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist, in a folder of their
    own (the builds' setuptools comes from the package index, as a user's does)."""
    out = tmp_path_factory.mktemp("dist")
    installs(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("phalanx-*.whl")
    return wheel


def test_the_builds_are_named_for_the_version_and_pass_twine_check(dist):
    wheel = f"phalanx-{__version__}-py3-none-any.whl"
    assert sorted(path.name for path in dist.iterdir()) == [wheel, f"phalanx-{__version__}.tar.gz"]
    assert f'pip install "dist/{wheel}[' in (ROOT / "README.md").read_text(), "README's install, as built"
    checked = run(sys.executable, "-m", "twine", "check", "--strict", *sorted(dist.iterdir()), cwd=dist)
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout + checked.stderr


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(dist):
    """The modules, the presets, the vendored market data with its licence and README: every file of
    src/phalanx but the generated ones; and the project's licence in the metadata."""
    names = zipfile.ZipFile(wheel_of(dist)).namelist()
    source = {
        f"phalanx/{path.relative_to(PACKAGE).as_posix()}"
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert {name for name in names if name.startswith("phalanx/")} == source
    assert {"phalanx/presets/ppo.yaml", "phalanx/finance/data/sp500_dataset.csv.gz"} <= source
    assert {"phalanx/finance/data/LICENSE-skfolio", "phalanx/finance/data/README.md"} <= source
    info = f"phalanx-{__version__}.dist-info"
    assert f"{info}/licenses/LICENSE" in names and f"{info}/entry_points.txt" in names
    assert not [name for name in names if not name.startswith(("phalanx/", f"{info}/"))]


def test_the_sdist_holds_the_tracked_source_tree(dist):
    """Every file under version control but the CI script and .gitignore (what ``make test`` runs on:
    tests, the pages and examples they run, the benchmarks they import), and only generated metadata
    besides."""
    listed = run("git", "ls-files", cwd=ROOT)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so no list of tracked files to compare with: {listed.stderr}")
    tracked = {name for name in listed.stdout.splitlines() if not name.startswith((".ci/", ".gitignore"))}
    prefix = f"phalanx-{__version__}/"
    with tarfile.open(next(dist.glob("*.tar.gz"))) as sdist:
        files = {member.name.removeprefix(prefix) for member in sdist.getmembers() if member.isfile()}
    assert {"tests/conftest.py", "docs/architecture.md", "Makefile", "CHANGELOG.md", "LICENSE"} <= tracked
    assert tracked - files == set(), "tracked files missing from the sdist (MANIFEST.in)"
    extra = {name for name in files - tracked if not name.startswith("src/phalanx.egg-info/")}
    assert extra == SDIST_METADATA, "files in the sdist that are not tracked"
    assert not [name for name in files if any(part in name for part in ("__pycache__", ".pyc"))]


@pytest.fixture
def venv(tmp_path):
    """A fresh virtualenv with the pinned torch, removed afterwards (~1.4 GB)."""
    venv = tmp_path / "venv"
    created = run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    try:
        installs(
            venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            TORCH_SPEC,
            cwd=tmp_path,
        )
        yield venv
    finally:
        shutil.rmtree(venv)


def test_the_installed_wheel_trains_backtests_and_lists_envs_on_its_own(dist, venv, tmp_path):
    def phalanx(*argv: str) -> str:
        done = run(venv / "bin" / "phalanx", *argv, cwd=tmp_path)
        assert done.returncode == 0, f"phalanx {' '.join(argv)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done.stdout

    python = venv / "bin" / "python"
    installs(
        python, "-m", "pip", "install", "--quiet", "--no-compile", f"{wheel_of(dist)}[finance]", cwd=tmp_path
    )
    where = run(
        python, "-c", "import phalanx, torch; print(phalanx.__file__, torch.__version__)", cwd=tmp_path
    )
    module, torch_version = where.stdout.split()
    assert Path(module).is_relative_to(venv) and torch_version.startswith(TORCH_SPEC.split("==")[-1])

    assert phalanx("--version") == f"phalanx {__version__}\n"  # from the wheel's metadata
    envs = phalanx("envs")
    assert "CartPole-v1" in envs and "StockTrading-v0" in envs

    # The shipped preset (64 envs) solves CartPole in seconds; exit 0 means that the return was reached.
    phalanx("train", "ppo", "CartPole-v1", "--stop-return", "475", "--device", "cpu", "--run-dir", "cartpole")
    summary = json.loads((tmp_path / "cartpole" / "summary.json").read_text())
    config = yaml.safe_load((tmp_path / "cartpole" / "config.yaml").read_text())
    assert (
        summary["eval_return_mean"] >= 475 and config["num_envs"] == presets("ppo")["CartPole-v1"]["num_envs"]
    )

    # A short trading run, backtested on the S&P 500 data that the wheel installed.
    phalanx("train", "ppo", "StockTrading-v0", "--device", "cpu", "--run-dir", "trading", "--num-envs", "8",
            "--total-steps", "512", "--eval-every", "0", "--eval-episodes", "2", "--horizon", "32",
            "--minibatch-size", "128", "--hidden-sizes", "32", "32")  # fmt: skip
    table = phalanx("backtest", "trading", "--start", "2019-01-01", "--end", "2019-12-31")
    assert "2019-01-02..2019-12-31" in table and "Sharpe ratio" in table
    written = tmp_path / "trading" / "backtest" / "2019-01-02_2019-12-31" / "metrics.json"
    assert set(json.loads(written.read_text())["metrics"]) == {"agent", "buy_and_hold", "index"}
