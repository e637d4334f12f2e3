"""Data-parallel learners (num_learners > 1): identical parameters on every learner, merged statistics,
checkpoints and resume, a failing or hung learner, Ctrl+C, torchrun, bad input."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.envs.registry import register_env, unregister_env
from phalanx.errors import ConfigError
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.launch import LearnerError, available_cores, launch_learners
from phalanx.train.trainer import Trainer

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # spawned learners import the helpers below by module name
import learner_checks  # noqa: E402
from fault_envs import failing_pendulum  # noqa: E402

pytestmark = pytest.mark.skipif(
    available_cores() < 2,
    reason="two learners need two CPU cores",
)


def config(tmp_path, name, algo="sac", env="Pendulum-v1", **overrides):
    settings = dict(
        num_envs=4,
        total_steps=800,
        eval_every=400,
        eval_episodes=2,
        log_every=200,
        run_dir=str(tmp_path / name),
        hidden_sizes=(16, 16),
        torch_threads=1,
    )
    if algo != "ppo":
        settings.update(batch_size=32, learning_starts=160, buffer_size=2000, updates_per_step=0.5)
    settings.update(overrides)
    return phalanx.make_config(algo, env, use_preset=False, **settings)


def no_learners_left() -> bool:
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not multiprocessing.active_children()


@pytest.mark.parametrize(
    ("algo", "env", "overrides"),
    [
        ("sac", "Pendulum-v1", {"normalize_obs": True}),
        ("ppo", "CartPole-v1", {"horizon": 32, "minibatch_size": 64, "epochs": 2, "target_kl": 0.02}),
        ("dqn", "CartPole-v1", {"max_grad_norm": 1.0}),
    ],
)
def test_learners_hold_bitwise_equal_parameters(tmp_path, algo, env, overrides):
    run = config(tmp_path, algo, algo, env, **overrides)
    run.num_learners = 2
    outcome = launch_learners(
        learner_checks.parameters_after_training, {"config": run.to_dict()}, 2, "cpu", timeout=60
    )
    (initial_0, final_0, obs_0, updates_0, steps_0), (initial_1, final_1, obs_1, updates_1, steps_1) = (
        outcome.value
    )
    assert torch.equal(initial_0, initial_1)  # learner 0's initial weights everywhere
    assert updates_0 == updates_1 > 0
    assert not torch.equal(final_0, initial_0)  # they learned...
    assert torch.equal(final_0, final_1)  # ...and still hold the same bits
    assert not torch.equal(obs_0, obs_1)  # from different env shards
    assert steps_0 == steps_1 >= 800  # steps count the env steps of both learners
    assert no_learners_left()


def test_merged_statistics_are_those_of_all_samples_and_identical(tmp_path):
    outcome = launch_learners(learner_checks.merged_statistics, {}, 2, "cpu", timeout=60)
    everything, held = outcome.value
    (count_0, mean_0, var_0), (count_1, mean_1, var_1) = held
    assert torch.equal(mean_0, mean_1) and torch.equal(var_0, var_1) and torch.equal(count_0, count_1)
    assert int(count_0) == everything.shape[0]
    torch.testing.assert_close(mean_0, everything.double().mean(0))
    torch.testing.assert_close(var_0, everything.double().var(0, unbiased=False))


def test_two_learners_from_the_api_checkpoint_and_resume(tmp_path):
    run = config(tmp_path, "run", checkpoint_every=400, save_buffer=True)
    run.num_learners = 2
    result = phalanx.train(run, show_progress=False)
    assert result.summary["total_steps"] == 800
    # warm-up: 160 steps, 80 per learner (20 VecEnv steps of 4); then 2 updates per VecEnv step
    assert result.summary["updates"] == 2 * (100 - 20 + 1)
    state = load_checkpoint(result.run_dir / "checkpoints" / "step_800")
    assert len(state["learner_shards"]) == 1 and "buffer" in state["learner_shards"][0]
    assert not torch.equal(state["worker"]["obs"], state["learner_shards"][0]["worker"]["obs"])
    assert set(load_checkpoint(result.run_dir / "checkpoints" / "best")) >= {"algorithm", "config", "spaces"}

    resumed = phalanx.resume(result.run_dir, total_steps=1200, show_progress=False)
    assert resumed.summary["total_steps"] == 1200
    assert resumed.summary["updates"] == result.summary["updates"] + 2 * 50
    assert no_learners_left()


def test_pipelined_learners_checkpoint_mid_run(tmp_path):
    """Each learner's pipeline drains to the same env step before a checkpoint, so the learners keep
    making the same updates (a mismatch would hang the group or fail its timeout)."""
    run = config(tmp_path, "pipe", pipeline=True, checkpoint_every=96, learner_timeout=30)
    run.num_learners = 2
    result = phalanx.train(run, show_progress=False)
    assert result.summary["total_steps"] == 800
    assert result.summary["updates"] == 2 * (100 - 20 + 1)
    assert no_learners_left()


def test_cli_learners_flag(tmp_path):
    run_dir = tmp_path / "cli"
    completed = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "train", "ppo", "CartPole-v1", "--learners", "2",
         "--num-envs", "4", "--horizon", "16", "--minibatch-size", "32", "--total-steps", "512",
         "--eval-every", "0", "--eval-episodes", "2", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert f"run directory: {run_dir}" in completed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 512 and summary["updates"] == 4  # 512 / (16 * 4 * 2) rollouts


@pytest.fixture
def failing_env():
    register_env("FailingPendulum-v0", failing_pendulum)
    register_env("HangingPendulum-v0", functools.partial(failing_pendulum, mode="hang"))
    yield
    unregister_env("FailingPendulum-v0")
    unregister_env("HangingPendulum-v0")


def test_a_failing_learner_takes_the_group_down_with_its_traceback(tmp_path, failing_env):
    run = config(tmp_path, "fail", env="FailingPendulum-v0", learner_timeout=60)
    run.num_learners = 2
    start = time.monotonic()
    with pytest.raises(LearnerError) as raised:
        phalanx.train(run, show_progress=False)
    message = str(raised.value)
    assert message.startswith("learner 1 of 2 failed: RuntimeError: injected fault in learner 1")
    assert "--- learner 1 traceback ---" in message and "fault_envs.py" in message
    assert time.monotonic() - start < 30  # not the 60 s timeout: learner 0 noticed at once
    assert no_learners_left()


def test_a_hung_learner_fails_the_group_after_the_timeout(tmp_path, failing_env):
    run = config(tmp_path, "hang", env="HangingPendulum-v0", learner_timeout=3)
    run.num_learners = 2
    start = time.monotonic()
    with pytest.raises(LearnerError) as raised:
        phalanx.train(run, show_progress=False)
    message = str(raised.value)
    assert message.startswith("learner 0 of 2 failed")
    assert "learner(s) [1] were still running but stopped answering" in message
    assert time.monotonic() - start < 40
    assert no_learners_left()


@pytest.mark.parametrize(
    ("moment", "stop"),
    [
        ("while training", "SIGINT to the group"),
        ("while the learners start", "SIGINT to the group"),
        ("while training", "SIGTERM to the launcher"),
    ],
)
def test_a_stop_signal_stops_every_learner_and_saves(tmp_path, moment, stop):
    """Ctrl+C reaches the whole group (the launcher and the learners); SIGTERM from `kill` or a scheduler
    may reach the launcher alone, which forwards it."""
    run_dir = tmp_path / "interrupted"
    process = subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", "train", "sac", "Pendulum-v1", "--learners", "2",
         "--num-envs", "4", "--total-steps", "10000000", "--learning-starts", "64", "--batch-size", "32",
         "--hidden-sizes", "16", "16", "--log-every", "64", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        if moment == "while training":
            while not (run_dir / "metrics.csv").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)
        else:  # as soon as both learner processes exist: they are still importing torch
            while len(learner_processes(process.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        if stop == "SIGINT to the group":
            os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl+C does: the whole group
        else:
            process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    signal_name = stop.split()[0]
    assert process.returncode == 128 + signal.Signals[signal_name], stderr
    assert f"interrupted by {signal_name} at step" in stderr and "phalanx resume" in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == signal_name
    state = load_checkpoint(run_dir / "checkpoints" / f"step_{summary['total_steps']}")
    assert len(state["learner_shards"]) == 1
    assert group_is_gone(process.pid)  # the launcher, the learners and multiprocessing's helpers


def learner_processes(launcher: int) -> list[str]:
    """The process ids of the learners ``launcher`` started (spawned: `... spawn_main ...`)."""
    found = subprocess.run(["pgrep", "-P", str(launcher), "-f", "spawn_main"], capture_output=True, text=True)
    return found.stdout.split()


def group_is_gone(process_group: int, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(process_group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_torchrun_starts_the_group(tmp_path):
    run_dir = tmp_path / "torchrun"
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "phalanx.cli", "train", "sac", "Pendulum-v1", "--num-envs", "4", "--total-steps", "400",
         "--learning-starts", "64", "--batch-size", "32", "--hidden-sizes", "16", "16",
         "--eval-every", "0", "--eval-episodes", "2", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 400
    config_text = (run_dir / "config.yaml").read_text()
    assert "num_learners: 2" in config_text


# -- bad input ---------------------------------------------------------------------------------------
def test_more_learners_than_cores_is_refused(tmp_path):
    run = config(tmp_path, "many")
    run.num_learners = 4096
    expected = r"num_learners = 4096 .* may use \d+ core\(s\)\. Use --learners \d+"
    with pytest.raises(ConfigError, match=expected):
        phalanx.train(run, show_progress=False)
    assert not (tmp_path / "many").exists()


def test_bad_learner_settings(tmp_path):
    with pytest.raises(ConfigError, match="num_learners"):
        phalanx.train(config(tmp_path, "zero", num_learners=0), show_progress=False)
    with pytest.raises(ConfigError, match="pipeline with num_learners > 1 cannot normalise"):
        config(tmp_path, "norm", num_learners=2, pipeline=True, normalize_obs=True).validate()
    with pytest.raises(ConfigError, match="a Trainer is one learner"):
        Trainer(config(tmp_path, "trainer", num_learners=2), show_progress=False)
    with pytest.raises(ConfigError, match="needs device 'cpu'"):
        phalanx.train(config(tmp_path, "mps", num_learners=2, device="meta"), show_progress=False)
