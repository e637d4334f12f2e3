"""Each off-policy algorithm learns its benchmark task with its shipped preset, a fixed seed and budget.

Every test trains the preset until the deterministic evaluation mean reaches the task's threshold
(``stop_return``) or the budget runs out, and asserts that the threshold was reached before the budget
ended: an algorithm that stopped learning fails. The comments give the env steps each one needed
when the presets were tuned (seeds 0-4, one torch thread); the budgets leave at least 2x margin.
"""

from __future__ import annotations

import pytest

import phalanx


def train(tmp_path, algo, env, stop_return, total_steps, seed=0, **overrides):
    config = phalanx.make_config(
        algo,
        env,
        run_dir=str(tmp_path / f"{algo}-{env}"),
        stop_return=stop_return,
        total_steps=total_steps,
        seed=seed,
        torch_threads=1,
        **overrides,
    )
    return phalanx.train(config, show_progress=False).summary


# Pendulum-v1 to -200 (an untrained policy scores about -1200): the presets need 3-5k env steps
# (SAC, TD3, DDPG; ~1-3 s) and 2-3k (REDQ, ~4-9 s).
@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg", "redq"])
def test_learns_pendulum(tmp_path, algo):
    summary = train(tmp_path, algo, "Pendulum-v1", stop_return=-200, total_steps=12_288)
    assert summary["best_eval_return"] >= -200, summary
    assert summary["time_to_stop_return_s"] is not None
    assert summary["total_steps"] < 12_288, summary


# CartPole-v1 to 475 (an untrained greedy policy scores about 10): the presets need 25-50k env steps
# (~6-14 s). D3QN is double and dueling DQN at once, so those two alone run with -m slow.
@pytest.mark.parametrize(
    "algo",
    [
        "dqn",
        pytest.param("double-dqn", marks=pytest.mark.slow),
        pytest.param("dueling-dqn", marks=pytest.mark.slow),
        "d3qn",
    ],
)
def test_learns_cartpole(tmp_path, algo):
    summary = train(tmp_path, algo, "CartPole-v1", stop_return=475, total_steps=100_000)
    assert summary["best_eval_return"] >= 475, summary
    assert summary["total_steps"] < 100_000, summary


# Acrobot-v1 to -100 (an untrained policy scores -500): DQN's preset needs 6-20k env steps.
def test_dqn_learns_acrobot(tmp_path):
    summary = train(tmp_path, "dqn", "Acrobot-v1", stop_return=-100, total_steps=60_000)
    assert summary["best_eval_return"] >= -100, summary
    assert summary["total_steps"] < 60_000, summary


# MountainCarContinuous-v0 to 90 (doing nothing scores 0): an exploration problem; the DDPG and TD3
# presets need 300-500k env steps (~10-20 s) on the seeds that find the goal (DDPG 5/5, TD3 4/5).
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ddpg", "td3"])
def test_learns_mountain_car_continuous(tmp_path, algo):
    summary = train(tmp_path, algo, "MountainCarContinuous-v0", stop_return=90, total_steps=1_000_000)
    assert summary["best_eval_return"] >= 90, summary
    assert summary["total_steps"] < 1_000_000, summary
