"""A kill at any moment (SIGKILL, a power loss) leaves every file of a run whole, and a checkpoint that
resumes: the writes of phalanx.files, checkpoints, and training runs killed at random moments."""

from __future__ import annotations

import csv
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import phalanx
from phalanx.config import save_yaml
from phalanx.files import append_line, atomic_write, replace_directory, write_text_atomic
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.logging import RunLogger


# -- a write cut short ------------------------------------------------------------------------------
def test_a_write_cut_short_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_text_atomic(path, "old\n")
    with pytest.raises(RuntimeError), atomic_write(path) as file:
        file.write("a part of the new")
        raise RuntimeError("the writer fails midway")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]

    # Killed between the temporary file and the rename: the old file, and a leftover the next write replaces.
    def killed(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "new\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    write_text_atomic(path, "newer\n")
    assert path.read_text() == "newer\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_append_line_drops_a_line_a_kill_cut_short(tmp_path):
    path = tmp_path / "decisions.jsonl"
    append_line(path, '{"event": "a"}')
    with path.open("a") as file:
        file.write('{"event": "b", "rea')  # a kill in the middle of a line
    append_line(path, '{"event": "c"}')
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == ["a", "c"]


def test_a_directory_replaced_midway_stays_the_old_one(tmp_path):
    target = tmp_path / "best"
    with replace_directory(target) as directory:
        (directory / "config.yaml").write_text("old")
    with pytest.raises(RuntimeError), replace_directory(target) as directory:
        (directory / "config.yaml").write_text("new")
        raise RuntimeError("the export fails midway")
    assert (target / "config.yaml").read_text() == "old"
    with replace_directory(target) as directory:
        (directory / "config.yaml").write_text("new")
    assert (target / "config.yaml").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


# -- SIGKILL at every line ----------------------------------------------------------------------------
@pytest.fixture
def no_fsync(monkeypatch):
    """fsync keeps files through a power loss; a killed process's writes survive without it, faster."""
    monkeypatch.setattr(os, "fsync", lambda descriptor: None)


def kill_at_every_line(operation, check, prepare, modules: tuple[str, ...]) -> int:
    """For n = 1, 2, ...: ``prepare()``, then in a forked child run ``operation()`` and SIGKILL it at its
    n-th line in ``modules`` (of phalanx: those that write files), and ``check()`` what it left; until a
    child runs to the end. Returns the number of lines."""
    watched = tuple(os.path.join("phalanx", *module.split("/")) + ".py" for module in modules)
    for n in itertools.count(1):
        prepare()
        child = os.fork()
        if child == 0:
            lines = itertools.count(1)

            def tracer(frame, event, argument, n=n, lines=lines):
                if not frame.f_code.co_filename.endswith(watched):
                    return None
                if event == "line" and next(lines) == n:
                    os.kill(os.getpid(), signal.SIGKILL)
                return tracer

            code = 1
            try:
                sys.settrace(tracer)
                operation()
                sys.settrace(None)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0, f"the operation failed at line {n}"
        check()
        if not os.WIFSIGNALED(status):
            return n - 1


def complete_checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if (p / "state.pt").is_file())


def test_sigkill_at_every_line_of_a_checkpoint_save_keeps_the_newest_complete_one(tmp_path, no_fsync):
    template, run = tmp_path / "template", tmp_path / "run"
    manager = CheckpointManager(template, keep=2)
    manager.save(1, {"x": torch.tensor(1)})
    manager.save(2, {"x": torch.tensor(2)})
    manager.save_best({"x": torch.tensor(10)})
    leftovers = template / "checkpoints"
    (leftovers / "step_9").mkdir()  # a kill right after the directory of step 9 was made
    (leftovers / "step_5.tmp").mkdir()  # what earlier versions' directory swaps left
    (leftovers / "step_5.tmp" / "state.pt").write_bytes(b"PK\x03\x04 truncated")
    shutil.copytree(leftovers / "best", leftovers / "best.old")

    def prepare():
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(template, run)

    def save():
        checkpoints = CheckpointManager(run, keep=2)
        checkpoints.save(3, {"x": torch.tensor(3)})
        checkpoints.save_best({"x": torch.tensor(30)})

    def check():
        checkpoints = CheckpointManager(run, keep=2)
        latest = checkpoints.latest()
        assert latest is not None and latest.name in ("step_2", "step_3")
        assert int(load_checkpoint(latest)["x"]) == int(latest.name[5:])
        named = (run / "checkpoints" / "latest").read_text().strip()
        assert int(load_checkpoint(run / "checkpoints" / named)["x"]) == int(named[5:])
        assert int(load_checkpoint(checkpoints.best())["x"]) in (10, 30)
        # The next save cleans up what the kill left.
        checkpoints.save(4, {"x": torch.tensor(4)})
        left = sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir())
        assert left == ["best", latest.name, "step_4"]

    lines = kill_at_every_line(save, check, prepare, ("files", "train/checkpoint"))
    assert lines > 20  # the kills landed inside the save, not around it


def test_sigkill_at_every_line_of_rewriting_run_files_leaves_them_whole(tmp_path, no_fsync):
    template, run = tmp_path / "template", tmp_path / "run"
    template.mkdir()
    old, new = (
        phalanx.make_config("ppo", "CartPole-v1", seed=1),
        phalanx.make_config("ppo", "CartPole-v1", seed=2),
    )
    save_yaml(old, template / "config.yaml")
    logger = RunLogger(template, 100, show_progress=False, tensorboard=False)
    for steps in (1, 2, 3):
        logger.log({"steps": steps, "loss": 0.5})

    def prepare():
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(template, run)

    def rewrite():
        save_yaml(new, run / "config.yaml")
        logger = RunLogger(run, 100, show_progress=False, tensorboard=False, steps=2)  # resumed at step 2
        logger.log({"steps": 3, "loss": 0.25, "entropy": 0.7})  # a new column: the file is rewritten

    def check():
        assert yaml.safe_load((run / "config.yaml").read_text())["seed"] in (1, 2)
        with (run / "metrics.csv").open(newline="") as file:
            header, *rows = list(csv.reader(file))
        assert all(len(row) == len(header) for row in rows), rows
        assert [row[0] for row in rows] in (["1", "2", "3"], ["1", "2"])

    assert kill_at_every_line(rewrite, check, prepare, ("files", "train/logging")) > 20


# -- SIGKILL at random moments of training ------------------------------------------------------------
TOTAL_STEPS = 4096


def assert_whole(run: Path) -> None:
    """Every file the run wrote parses, every checkpoint loads, and the agent loads."""
    manager = CheckpointManager(run)
    assert manager.latest() is not None
    for name in complete_checkpoints(run / "checkpoints"):
        load_checkpoint(run / "checkpoints" / name)
    named = (run / "checkpoints" / "latest").read_text().strip()
    assert (run / "checkpoints" / named / "state.pt").is_file()
    phalanx.load_agent(run, checkpoint="latest")
    phalanx.load_agent(run)
    assert yaml.safe_load((run / "config.yaml").read_text())["total_steps"] == TOTAL_STEPS
    with (run / "metrics.csv").open(newline="") as file:
        header, *rows = list(csv.reader(file))
    assert all(len(row) == len(header) for row in rows)
    if (run / "summary.json").exists():
        json.loads((run / "summary.json").read_text())


def start(*arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kill_when(process: subprocess.Popen, ready, delay: float) -> None:
    """SIGKILL ``process`` ``delay`` seconds after ``ready()`` (or let it end first)."""
    deadline = time.monotonic() + 300  # a guard against a hang, not a measurement
    while not ready() and process.poll() is None:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.02)
    time.sleep(delay)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate(timeout=60)
    assert process.returncode in (0, -signal.SIGKILL), output


def test_a_run_killed_at_random_moments_resumes_from_its_newest_complete_checkpoint(tmp_path):
    run = tmp_path / "run"
    rng = random.Random(21)
    process = start(
        "train", "ppo", "CartPole-v1", "--num-envs", "8", "--horizon", "16", "--minibatch-size", "64",
        "--epochs", "2", "--hidden-sizes", "16", "16", "--total-steps", str(TOTAL_STEPS),
        "--checkpoint-every", "512", "--log-every", "128", "--eval-every", "512", "--eval-episodes", "2",
        "--no-eval-process", "--torch-threads", "1", "--run-dir", str(run),
    )  # fmt: skip
    kill_when(process, lambda: CheckpointManager(run).latest() is not None, rng.uniform(0, 1.0))
    for _ in range(2):
        assert_whole(run)
        written = (run / "config.yaml").stat().st_mtime_ns
        process = start("resume", str(run))  # it rewrites config.yaml first, then metrics.csv

        def rewritten(written=written):
            return (run / "config.yaml").stat().st_mtime_ns != written

        kill_when(process, rewritten, rng.uniform(0, 1.0))
    assert_whole(run)
    result = phalanx.resume(run, show_progress=False)
    assert result.summary["total_steps"] == TOTAL_STEPS and result.summary["interrupted"] is False
    assert_whole(run)
    with (run / "metrics.csv").open(newline="") as file:
        steps = [int(row["steps"]) for row in csv.DictReader(file)]
    assert steps == sorted(steps) and steps[-1] == TOTAL_STEPS  # no rows of the steps a kill lost, twice
    assert complete_checkpoints(run / "checkpoints")[-1] == f"step_{TOTAL_STEPS}"
