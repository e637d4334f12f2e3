"""The worked examples of docs/architecture.md, trained as a reader trains them: ``phalanx train ...
--import examples.MODULE`` in a process of its own, at the repository root ("Adding an algorithm":
examples/custom_algorithm.py; "Adding an environment": examples/custom_vec_env.py). A subprocess, so that
the algorithm and the env they register stay out of this test session's tables."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import phalanx

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4096


def phalanx_command(*args: str) -> subprocess.CompletedProcess:
    """``phalanx ARGS`` at the repository root, with the phalanx this session imports."""
    source = str(Path(phalanx.__file__).resolve().parents[1])
    path = os.pathsep.join(part for part in (source, os.environ.get("PYTHONPATH", "")) if part)
    return subprocess.run(
        [sys.executable, "-m", "phalanx", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("command", "metric"),
    [
        # the algorithm's name before its module is imported: --import may come first, one module each
        (["--import", "examples.custom_algorithm", "reinforce", "CartPole-v1"], "policy_loss"),
        (["ppo", "PointMass-v0", "--import", "examples.custom_vec_env"], "approx_kl"),
    ],
    ids=["custom_algorithm", "custom_vec_env"],
)
def test_an_example_trains_from_the_command_line(tmp_path, command, metric):
    run_dir = tmp_path / "run"
    trained = phalanx_command(
        "train", *command, "--total-steps", str(STEPS), "--num-envs", "8", "--run-dir", str(run_dir)
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] >= STEPS and summary["updates"] >= 4
    assert summary["eval_return_mean"] is not None  # evaluated with the trained policy
    assert (run_dir / "checkpoints" / "latest").exists()
    with open(run_dir / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert rows and rows[-1][metric]  # the update's own metrics: it learned, STEPS // 1024 times
    assert command[command.index("--import") + 1] in (run_dir / "config.yaml").read_text()

    evaluated = phalanx_command("eval", str(run_dir), "--episodes", "2")  # imports the module again
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
