"""A cluster job's life: the same command starts a run and continues it after a preemption (--resume),
checkpoints by time bound what a SIGKILL loses, and a resume with nothing left to train changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import phalanx
from phalanx.cli import main
from phalanx.errors import ConfigError
from phalanx.train.checkpoint import CheckpointManager
from phalanx.train.logging import read_table

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--num-envs", "8", "--horizon", "16", "--minibatch-size", "64", "--epochs", "2",
        "--hidden-sizes", "16", "16", "--eval-episodes", "2", "--torch-threads", "1"]  # fmt: skip


def command(run_dir: Path, total_steps: int, *extra: str) -> list[str]:
    return ["train", "ppo", "CartPole-v1", *TINY, "--total-steps", str(total_steps), "--eval-every", "1024",
            "--run-dir", str(run_dir), "--resume", *extra]  # fmt: skip


def files_of(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of a run directory: its size and modification time (ns)."""
    return {
        str(path.relative_to(run_dir)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(run_dir.rglob("*"))
        if path.is_file()
    }


def test_the_same_command_starts_the_run_then_finds_nothing_left(tmp_path, capsys):
    run_dir = tmp_path / "job"
    assert main(command(run_dir, 1024)) == 0  # no directory yet: started there
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 1024 and not summary["interrupted"]
    before = files_of(run_dir)
    capsys.readouterr()
    assert main(command(run_dir, 1024)) == 0  # requeued after it finished
    assert "nothing left to train" in capsys.readouterr().err
    assert main(["resume", str(run_dir)]) == 0
    assert "nothing left to train" in capsys.readouterr().err
    assert files_of(run_dir) == before  # no evaluation row, no wall time, no checkpoint added
    assert main(["resume", str(run_dir), "--total-steps", "1536"]) == 0  # a larger budget trains on
    assert json.loads((run_dir / "summary.json").read_text())["total_steps"] == 1536


def test_resume_continues_an_interrupted_run_exactly_where_it_stopped(tmp_path, interrupt_update):
    from phalanx.train.loop import TrainingInterrupted
    from phalanx.train.trainer import Trainer

    config = phalanx.make_config(
        "ppo", "CartPole-v1", use_preset=False, **_settings(tmp_path / "job", total_steps=2048, resume=True)
    )
    trainer = Trainer(config, show_progress=False)
    interrupt_update(trainer, 3)  # Ctrl+C (or SIGTERM) during the 3rd update: saved at the 2nd
    with pytest.raises(TrainingInterrupted):
        trainer.train()
    trainer.close()
    result = phalanx.train(config, show_progress=False)  # the same config, requeued
    assert result.trained and result.summary["total_steps"] == 2048
    straight = phalanx.train(
        phalanx.make_config("ppo", "CartPole-v1", use_preset=False, **_settings(tmp_path / "straight")),
        show_progress=False,
    )
    rows = [row["steps"] for row in read_table(result.run_dir / "metrics.csv")]
    expected = [row["steps"] for row in read_table(straight.run_dir / "metrics.csv")]
    assert rows == sorted(set(rows)) and set(expected) <= set(rows)  # none lost, none twice
    assert len(set(rows) - set(expected)) == 1  # the row the interruption wrote, at its checkpoint


def _settings(run_dir: Path, **overrides) -> dict:
    settings = dict(
        num_envs=8, horizon=16, minibatch_size=64, epochs=2, hidden_sizes=(16, 16), eval_episodes=2
    )
    settings.update(total_steps=2048, eval_every=1024, log_every=256, run_dir=str(run_dir), torch_threads=1)
    settings.update(overrides)
    return settings


def test_resume_refuses_another_config_and_a_directory_without_a_run(tmp_path):
    run_dir = tmp_path / "job"
    assert main(command(run_dir, 1024)) == 0
    other = phalanx.make_config(
        "ppo", "CartPole-v1", use_preset=False, **_settings(run_dir, total_steps=1024, seed=7, resume=True)
    )
    with pytest.raises(
        ConfigError, match=r"another config than this command: seed: the run has 0, the command 7"
    ):
        phalanx.train(other, show_progress=False)
    stranger = tmp_path / "notes"
    stranger.mkdir()
    (stranger / "todo.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files but no phalanx run"):
        phalanx.train(phalanx.make_config("ppo", "CartPole-v1", run_dir=str(stranger), resume=True))
    with pytest.raises(ConfigError, match="resume = true needs run_dir"):
        phalanx.train(phalanx.make_config("ppo", "CartPole-v1", resume=True))


def test_a_run_killed_before_its_first_checkpoint_starts_again_and_keeps_the_old_files(tmp_path):
    run_dir = tmp_path / "job"
    assert main(command(run_dir, 1024)) == 0
    for step in CheckpointManager(run_dir).step_directories():  # as if killed before its first save
        for file in step.iterdir():
            file.unlink()
        step.rmdir()
    (run_dir / "summary.json").unlink()
    assert main(command(run_dir, 1024)) == 0
    assert (run_dir / "attempts" / "1" / "config.yaml").is_file()  # set aside, not deleted
    assert json.loads((run_dir / "summary.json").read_text())["total_steps"] == 1024


def test_checkpoints_by_time_bound_what_a_sigkill_loses(tmp_path):
    """--checkpoint-every-minutes 0.01 (0.6 s): step checkpoints while the run trains; after a SIGKILL
    (no warning, nothing saved then) the same command goes on from the last one."""
    run_dir = tmp_path / "job"
    extra = ("--checkpoint-every-minutes", "0.01", "--log-every", "1024")
    process = subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", *command(run_dir, 10_000_000, *extra)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(CheckpointManager(run_dir).step_directories()) < 2:
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    saved = CheckpointManager(run_dir).latest()
    steps = int(saved.name.split("_")[1])
    assert steps < 10_000_000
    resumed = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", *command(run_dir, steps + 1024, *extra)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == steps + 1024 and not summary["interrupted"]
