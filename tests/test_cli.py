"""The `phalanx` command: happy paths and the one-paragraph errors for bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import phalanx
from phalanx.cli import main, parse_train_args
from phalanx.config import presets

SMALL = ["--num-envs", "8", "--total-steps", "1024", "--eval-every", "512", "--eval-episodes", "2",
         "--horizon", "16", "--minibatch-size", "64", "--hidden-sizes", "16", "16"]  # fmt: skip


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_train_eval_resume_round_trip(tmp_path, capsys):
    run = tmp_path / ("run_with_a_name_that_does_not_fit_one_line_" * 2)
    code, out = run_cli(capsys, "train", "ppo", "CartPole-v1", *SMALL, "--run-dir", str(run))
    assert code == 0, out
    assert f"run directory: {run}\n" in out  # whole, to be copied, however long (the terminal wraps it)
    assert json.loads((run / "summary.json").read_text())["total_steps"] == 1024
    code, out = run_cli(capsys, "eval", str(run), "--episodes", "3")
    assert code == 0 and "return mean" in out and f"run directory: {run} (checkpoint: best)\n" in out
    code, out = run_cli(capsys, "resume", str(run), "--total-steps", "2048")
    assert code == 0, out
    assert json.loads((run / "summary.json").read_text())["total_steps"] == 2048


def test_checkpoints_are_named_as_eval_prints_them_and_a_missing_one_lists_those_there(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", "ppo", "CartPole-v1", *SMALL, "--run-dir", str(run))[0] == 0
    code, out = run_cli(capsys, "eval", str(run), "--episodes", "2", "--checkpoint", "step_1024")
    assert code == 0 and "(checkpoint: step_1024)" in out, out
    code, out = run_cli(capsys, "eval", str(run), "--checkpoint", "step_999")
    assert code == 2 and "neither a path nor one of" in out and "step_1024, best" in " ".join(out.split())
    code, out = run_cli(capsys, "export", str(tmp_path / "no_such_run"))
    assert code == 2 and "does not exist" in out and "config.yaml" not in out


def test_eval_video_checks_that_the_env_draws_before_it_evaluates(tmp_path, capsys, monkeypatch):
    """An env with no Gymnasium id to draw it (a registered VecEnv) is refused before the evaluation runs."""
    from phalanx.envs import register_env
    from phalanx.envs.classic import CartPoleEnv
    from phalanx.envs.registry import unregister_env

    register_env("MyCartPole-v0", CartPoleEnv, overwrite=True)
    try:
        run = tmp_path / "run"
        assert run_cli(capsys, "train", "ppo", "MyCartPole-v0", *SMALL, "--run-dir", str(run))[0] == 0
        evaluated = []
        monkeypatch.setattr("phalanx.cli.evaluation.evaluate", lambda *args: evaluated.append(args))
        code, out = run_cli(capsys, "eval", str(run), "--video")
        assert code == 2 and "cannot render 'MyCartPole-v0'" in out and not evaluated
    finally:
        unregister_env("MyCartPole-v0")


def test_resume_without_a_step_checkpoint_says_why_best_is_not_one(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", "ppo", "CartPole-v1", *SMALL, "--run-dir", str(run))[0] == 0
    for step in (run / "checkpoints").glob("step_*"):  # as a run killed before its first checkpoint
        shutil.rmtree(step)
    assert (run / "checkpoints" / "best").is_dir()
    code, out = run_cli(capsys, "resume", str(run), "--total-steps", "2048")
    assert code == 2 and "has no checkpoint to resume from" in out
    assert "checkpoints/best is the best evaluation's weights" in out and "phalanx train" in out


def test_train_and_resume_exit_1_when_stop_return_is_not_reached(tmp_path, capsys):
    reached, missed = tmp_path / "reached", tmp_path / "missed"
    code, out = run_cli(
        capsys, "train", "ppo", "CartPole-v1", *SMALL, "--stop-return", "0", "--run-dir", str(reached)
    )
    assert code == 0, out
    code, out = run_cli(capsys, "resume", str(reached), "--total-steps", "2048")
    assert code == 0, out
    code, out = run_cli(
        capsys, "train", "ppo", "CartPole-v1", *SMALL, "--stop-return", "1e9", "--run-dir", str(missed)
    )
    assert code == 1, out
    code, out = run_cli(capsys, "resume", str(missed), "--total-steps", "2048")
    assert code == 1, out


def test_preset_and_flags_and_config_file_compose(tmp_path):
    preset = presets("ppo")["CartPole-v1"]
    config = parse_train_args(["ppo", "CartPole-v1"])
    assert config.num_envs == preset["num_envs"]
    file = tmp_path / "run.yaml"
    file.write_text("num_envs: 3000\nhyperparameters:\n  learning_rate: 0.01\n")
    config = parse_train_args(["ppo", "CartPole-v1", "--config", str(file), "--learning-rate", "0.02"])
    assert config.num_envs == 3000 and config.hyperparameters.learning_rate == 0.02
    assert config.hyperparameters.horizon == preset["hyperparameters"]["horizon"]  # preset beneath the file


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_one_in_pyproject(capsys, flag):
    """The version is written once, in pyproject.toml; from a source tree ``phalanx --version`` reads it
    there (tests/test_wheel.py checks an installed wheel, which reads its metadata)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert run_cli(capsys, flag) == (0, f"phalanx {project['version']}\n")
    assert phalanx.__version__ == project["version"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "ppx", "CartPole-v1"], "unknown algorithm 'ppx'. Did you mean ppo"),
        (["train", "ppo", "CartPole-v2"], "CartPole-v1"),
        (["train", "ppo", "CartPole-v1", "--learning-rate", "-1"], "learning_rate = -1.0 is invalid"),
        (["train", "ppo", "CartPole-v1", "--num-envs", "0"], "num_envs = 0 is invalid"),
        (
            ["train", "ppo", "CartPole-v1", "--num-envs", "4", "--horizon", "8", "--minibatch-size", "64"],
            "rollout size horizon * num_envs = 8 * 4 = 32",
        ),
        (
            ["train", "ppo"],
            "`phalanx train` needs an algorithm and an environment. usage: phalanx train ALGO",
        ),
        (["eval", "/nonexistent/run"], "does not exist"),
        (["resume", "/nonexistent/run"], "does not exist"),
        (["check-env", "no_such_module_xyz:make"], "no_such_module_xyz"),
        (["trian"], "Did you mean `phalanx train`"),
        (["export", "/nonexistent/run"], "does not exist"),
        (["backtest", "/nonexistent/run"], "does not exist"),
        (["plot", "/nonexistent/run"], "is not a directory"),
        (["population", "status", "/nonexistent/pop"], "/nonexistent/pop"),
        (["population", "run", "ppo", "CartPole-v1", "--size", "0"], "size = 0 is invalid"),
        (["tune", "ppo", "CartPole-v1", "--trials", "0"], "trials = 0 is invalid"),
    ],
)
def test_bad_input_gets_one_paragraph_and_exit_2(capsys, argv, expected):
    """Bad input exits 2 (the README's table of exit codes), whatever the command."""
    code, out = run_cli(capsys, *argv)
    assert code == 2
    assert expected in " ".join(out.split()), out
    assert "Traceback" not in out


def test_config_file_with_unknown_key_suggests_the_right_one(tmp_path, capsys):
    file = tmp_path / "bad.yaml"
    file.write_text("hyperparameters:\n  learning_rat: 0.01\n")
    code, out = run_cli(capsys, "train", "ppo", "CartPole-v1", "--config", str(file))
    assert code == 2 and "Did you mean learning_rate" in out


def test_eval_refuses_a_corrupt_checkpoint_without_touching_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", "ppo", "CartPole-v1", *SMALL, "--run-dir", str(run))[0] == 0
    state = run / "checkpoints" / "best" / "state.pt"
    state.write_bytes(b"garbage")
    code, out = run_cli(capsys, "eval", str(run))
    assert code == 2 and "cannot read checkpoint" in out and "Traceback" not in out
    assert state.read_bytes() == b"garbage"


def test_train_without_arguments_lists_the_presets_on_stdout(capsys):
    for help_flag in ([], ["--help"]):
        assert main(["train", *help_flag]) == 0  # a listing, not an error
        captured = capsys.readouterr()
        assert captured.err == "" and captured.out.startswith("usage: phalanx train ALGO ENV [flags]")
        assert re.search(r"^  ppo +CartPole-v1, Pendulum-v1, ", captured.out, re.MULTILINE)


@pytest.mark.parametrize("columns", [200, 60])
def test_envs_lists_what_runs_marks_what_needs_an_extra_and_fits_the_terminal(capsys, monkeypatch, columns):
    from phalanx.envs.registry import list_envs

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    sections: dict[str, list[str]] = {}
    for line in out.splitlines():
        assert len(line) <= min(columns, 80), line
        if not line.startswith(" "):  # a heading; the lines under it, continuations too, are indented
            assert line.endswith(":"), line
            heading = line
            continue
        sections.setdefault(heading, []).extend(re.findall(r"[\w/.:<>\[\]-]+", line))
    gymnasium = next(ids for heading, ids in sections.items() if heading.startswith("Gymnasium ids ("))
    assert "CartPole-v1" in gymnasium and "Ant-v5" in gymnasium and "Acrobot-v1" in gymnasium
    for cannot_run in ("Ant-v2", "Hopper-v3", "GymV21Environment-v0", "GymV26Environment-v0"):
        assert cannot_run not in out
    needs_extra = list_envs()["needs_extra"]
    if importlib.util.find_spec("Box2D") is None:  # marked with the extra, not among those that run now
        assert needs_extra["LunarLander-v3"] == "box2d" and "LunarLander-v3" not in gymnasium
        heading = "Gymnasium ids that need phalanx[box2d] (not installed):"
        assert "LunarLander-v3" in sections[heading]
    else:
        assert "LunarLander-v3" in gymnasium
    assert "simple_spread" in out and "pettingzoo:<module>[:<factory>]" in out
    atari = next(ids for heading, ids in sections.items() if heading.startswith("Atari games ("))
    assert ("ALE/Pong-v5" in atari) == (importlib.util.find_spec("ale_py") is not None)
    assert "ALE/Pong-v5" not in gymnasium


def test_check_env_accepts_a_good_env_and_explains_a_broken_one(tmp_path, capsys, monkeypatch):
    module = tmp_path / "my_envs.py"
    module.write_text(
        "import torch\n"
        "from phalanx.envs.classic import CartPoleEnv\n"
        "def good(num_envs=4, device='cpu'):\n"
        "    return CartPoleEnv(num_envs=num_envs, device=device)\n"
        "class Broken(CartPoleEnv):\n"
        "    def _observe(self):\n"
        "        return super()._observe().double()\n"
        "def broken(num_envs=4, device='cpu'):\n"
        "    return Broken(num_envs=num_envs, device=device)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out = run_cli(capsys, "check-env", "my_envs:good", "--steps", "200")
    assert code == 0 and "ok" in out and "CheckReport(" not in out  # said in words, not a repr
    assert "200 steps of CartPoleEnv" in out and "episodes ended, mean return" in " ".join(out.split())
    code, out = run_cli(capsys, "check-env", "my_envs:broken", "--steps", "200")
    assert code == 2 and "float32" in out and "float64" in out


def test_sigint_saves_a_checkpoint_and_leaves_no_process(tmp_path):
    run = tmp_path / "run"
    script = Path(sys.executable).parent / "phalanx"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "phalanx.cli"]
    process = subprocess.Popen(
        [*command, "train", "ppo", "CartPole-v1", "--num-envs", "8", "--total-steps", "100000000",
         "--horizon", "16", "--minibatch-size", "64", "--eval-every", "0", "--run-dir", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.time() + 60
    while time.time() < deadline and not (run / "metrics.csv").exists():
        time.sleep(0.2)
    assert (run / "metrics.csv").exists(), "training did not start"
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "phalanx resume" in output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["latest_checkpoint"]
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)
