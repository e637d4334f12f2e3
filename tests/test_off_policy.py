"""The off-policy family: bad input, the update-to-data ratio, exact resume with the buffer, deployment."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import phalanx
from phalanx.algos.ddpg import DDPG
from phalanx.algos.dqn import DQN
from phalanx.algos.sac import SAC
from phalanx.errors import ConfigError
from phalanx.registry import get_algorithm
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.trainer import Trainer

TINY = dict(num_envs=4, eval_every=0, eval_episodes=2, log_every=64, hidden_sizes=(16, 16))


def config(tmp_path, algo, env, name="run", **overrides):
    settings = {**TINY, "run_dir": str(tmp_path / name), "total_steps": 400, "learning_starts": 64,
                "batch_size": 32, "buffer_size": 1000, **overrides}  # fmt: skip
    return phalanx.make_config(algo, env, use_preset=False, **settings)


@pytest.mark.parametrize(
    "algo, env, expected",
    [
        ("dqn", "Pendulum-v1", r"dqn needs a Discrete action space.*Box"),
        ("d3qn", "Pendulum-v1", r"d3qn needs a Discrete action space"),
        ("sac", "CartPole-v1", r"sac needs a Box action space.*Discrete.*Use a2c or d3qn or double-dqn"),
        ("td3", "Acrobot-v1", r"td3 needs a Box action space"),
    ],
)
def test_action_space_mismatch_is_refused_before_the_run_dir(tmp_path, algo, env, expected):
    with pytest.raises(ConfigError, match=expected):
        Trainer(config(tmp_path, algo, env), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_batch_larger_than_the_warm_up_is_refused(tmp_path):
    with pytest.raises(
        ConfigError, match=r"learning_starts = 64 is invalid: expected an integer >= batch_size \(128\)"
    ):
        config(tmp_path, "sac", "Pendulum-v1", batch_size=128).validate()


def test_redq_subset_larger_than_the_ensemble_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"target_subset = 5 is invalid.*M <= K"):
        config(tmp_path, "redq", "Pendulum-v1", num_critics=3, target_subset=5).validate()


def test_class_hierarchy_adds_only_what_differs():
    assert issubclass(get_algorithm("td3"), DDPG)
    assert get_algorithm("d3qn").config_class().double and get_algorithm("d3qn").config_class().dueling
    assert issubclass(get_algorithm("double-dqn"), DQN) and get_algorithm("double-dqn").config_class().double
    redq = get_algorithm("redq").config_class()
    assert issubclass(get_algorithm("redq"), SAC)
    assert (redq.num_critics, redq.target_subset, redq.target_reduction) == (10, 2, "redq")


@pytest.mark.parametrize("ratio, cap, expected", [(1.0, None, 4 * 85), (0.25, None, 85), (2.0, 3, 3 * 85)])
def test_updates_per_step_sets_the_gradient_steps(tmp_path, ratio, cap, expected):
    # 400 steps of 4 envs = 100 VecEnv steps; updates start once 64 transitions are stored, i.e. after
    # the 16th VecEnv step: 85 steps with updates, each owing 4 * ratio gradient steps.
    trainer = Trainer(
        config(tmp_path, "ddpg", "Pendulum-v1", updates_per_step=ratio, max_updates_per_step=cap),
        show_progress=False,
    )
    result = trainer.train()
    assert result.summary["updates"] == expected


@pytest.mark.parametrize(
    "algo, env", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1"), ("td3", "Pendulum-v1")]
)
def test_resume_with_the_buffer_continues_exactly(tmp_path, algo, env):
    straight = phalanx.train(
        config(tmp_path, algo, env, "straight", total_steps=800, save_buffer=True), show_progress=False
    )
    half = phalanx.train(
        config(tmp_path, algo, env, "half", total_steps=400, save_buffer=True), show_progress=False
    )
    resumed = phalanx.resume(half.run_dir, total_steps=800, show_progress=False)
    a = load_checkpoint(straight.run_dir / "checkpoints" / "step_800")["algorithm"]
    b = load_checkpoint(resumed.run_dir / "checkpoints" / "step_800")["algorithm"]
    network = "q_network" if algo == "dqn" else "actor"
    assert all(torch.equal(a[network][k], b[network][k]) for k in a[network])
    assert resumed.summary["buffer_bytes"] > 0


def test_save_and_load_give_identical_deterministic_actions(tmp_path):
    result = phalanx.train(config(tmp_path, "sac", "Pendulum-v1", normalize_obs=True), show_progress=False)
    trainer_actions = None
    agent = phalanx.load_agent(result.run_dir, checkpoint="latest")
    again = phalanx.load_agent(result.run_dir, checkpoint="latest")
    obs = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)
    trainer_actions = agent.act(obs)
    assert np.array_equal(trainer_actions, again.act(obs))
    assert trainer_actions.shape == (7, 1) and np.all(np.abs(trainer_actions) <= 2.0)
    evaluation = phalanx.evaluate(result.run_dir, episodes=2, checkpoint="latest")
    assert evaluation.mean == pytest.approx(result.summary["eval_return_mean"], rel=1e-5)


@pytest.mark.parametrize("algo", ["dqn", "double-dqn", "dueling-dqn", "d3qn", "ddpg", "td3", "sac", "redq"])
def test_every_algorithm_runs_from_the_cli(tmp_path, algo, capsys):
    from phalanx.cli import main

    env = "CartPole-v1" if algo.endswith("dqn") or algo == "d3qn" else "Pendulum-v1"
    flags = ["--num-envs", "4", "--total-steps", "200", "--learning-starts", "32", "--batch-size", "16"]
    flags += ["--eval-episodes", "2", "--hidden-sizes", "8", "8", "--run-dir", str(tmp_path / algo)]
    if algo == "redq":
        flags += ["--updates-per-step", "2"]
    assert main(["train", algo, env, *flags]) == 0, capsys.readouterr().err


def test_metrics_csv_gets_the_losses_that_start_after_the_warm_up(tmp_path):
    import csv

    result = phalanx.train(config(tmp_path, "sac", "Pendulum-v1", log_every=16), show_progress=False)
    with (result.run_dir / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert rows[0]["critic_loss"] == ""  # logged during the warm-up, before any update
    assert any(row["critic_loss"] and row["alpha"] for row in rows[1:])
    assert all(row["steps"] for row in rows)


@pytest.mark.parametrize("algo, env", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_metrics_csv_ends_with_the_runs_last_step(tmp_path, algo, env):
    """log_every = 150 does not divide the 400 steps (VecEnv steps of 4): the last row is the last step."""
    from phalanx.train.logging import read_table

    result = phalanx.train(config(tmp_path, algo, env, log_every=150), show_progress=False)
    steps = [row["steps"] for row in read_table(result.run_dir / "metrics.csv")]
    assert steps == [4, 152, 300, 400] and result.summary["total_steps"] == 400


@pytest.mark.parametrize("algo, env", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_replay_memory_is_what_the_trainers_buffer_takes(tmp_path, algo, env):
    """Trainer.replay_memory counts, without building the run, the bytes its replay buffer then holds."""
    run = config(tmp_path, algo, env, buffer_size=1002)  # not a multiple of the 4 sub-envs
    memory = Trainer.replay_memory(run)
    trainer = Trainer(run, show_progress=False)
    try:
        assert (memory.needed, memory.capacity) == (trainer.buffer.nbytes, trainer.buffer.capacity)
    finally:
        trainer.close()
    assert Trainer.replay_memory(phalanx.make_config("ppo", "CartPole-v1")) is None  # a rollout, no replay
