"""Compiled rollouts (Worker.compile) against the eager reference: the same seeded rollout, up to rounding.

Each case compiles once (module-scoped fixtures, small nets): the fused step (acting + env step + buffer
write) for a discrete and a continuous built-in env, and acting alone for a Gymnasium env.
"""

from __future__ import annotations

import pytest
import torch

import phalanx
from phalanx.buffers import RolloutBuffer
from phalanx.compiling import compile_problem
from phalanx.train.trainer import Trainer

problem = compile_problem(torch.device("cpu"))
pytestmark = pytest.mark.skipif(problem is not None, reason=f"cannot compile here: {problem}")

NUM_ENVS, HORIZON, ROLLOUTS = 4, 48, 2


def collected(
    tmp_path_factory, env: str, compile: bool, algo: str = "ppo", **settings
) -> tuple[Trainer, list[dict], list[dict]]:
    """A trainer's ``ROLLOUTS`` rollouts from one seed: their buffers' contents and episode statistics
    (the weights stay as initialised: the rollouts differ by the env's and the policy's draws only)."""
    config = phalanx.make_config(
        algo,
        env,
        use_preset=False,
        num_envs=NUM_ENVS,
        horizon=HORIZON,
        minibatch_size=NUM_ENVS * HORIZON,
        hidden_sizes=(16, 16),
        eval_every=0,
        seed=3,
        run_dir=str(tmp_path_factory.mktemp("compiled" if compile else "eager")),
        **settings,
    )
    trainer = Trainer(config, show_progress=False)
    names = trainer.worker.compile() if compile else []
    trainer.worker.reset(seed=11)
    torch.manual_seed(5)  # the policy's draws come from the global generator
    buffers, episodes = [], []
    for _ in range(ROLLOUTS):
        trainer.worker.collect(trainer.buffer)
        buffers.append(trainer.buffer.state_dict() | {"last_obs": trainer.worker.obs.clone()})
        episodes.append(trainer.worker.episodes.read())
    trainer.close()
    return names, buffers, episodes


def assert_same_rollouts(eager, compiled, exact_actions: bool) -> None:
    for eager_buffer, compiled_buffer in zip(eager[1], compiled[1], strict=True):
        for name in (*RolloutBuffer.FIELDS, "last_obs"):
            expected, actual = eager_buffer[name], compiled_buffer[name]
            if name in ("terminated", "dones") or (name == "actions" and exact_actions):
                assert torch.equal(actual, expected), name
            else:
                torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, msg=name)
    for eager_episodes, compiled_episodes in zip(eager[2], compiled[2], strict=True):
        assert compiled_episodes.keys() == eager_episodes.keys()
        for key, value in eager_episodes.items():
            assert compiled_episodes[key] == pytest.approx(value, rel=1e-5)


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    return collected(tmp_path_factory, "CartPole-v1", False), collected(tmp_path_factory, "CartPole-v1", True)


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    return collected(tmp_path_factory, "Pendulum-v1", False), collected(tmp_path_factory, "Pendulum-v1", True)


def test_discrete_fused_rollout_matches_eager(cartpole):
    eager, compiled = cartpole
    assert compiled[0] == ["acting + env step + buffer write"]
    assert sum(episodes["episodes"] for episodes in eager[2]) > 0  # episodes ended and reset inside
    assert_same_rollouts(eager, compiled, exact_actions=True)


@pytest.mark.slow  # one more fused graph; the discrete case runs by default
def test_continuous_fused_rollout_matches_eager(pendulum):
    eager, compiled = pendulum
    assert compiled[0] == ["acting + env step + buffer write"]
    assert_same_rollouts(eager, compiled, exact_actions=False)


@pytest.mark.slow  # one more graph
def test_acting_alone_is_compiled_for_an_env_stepped_outside_torch(tmp_path_factory):
    eager = collected(tmp_path_factory, "gym:CartPole-v1", False)
    compiled = collected(tmp_path_factory, "gym:CartPole-v1", True)
    assert compiled[0] == ["acting"]
    assert_same_rollouts(eager, compiled, exact_actions=True)


@pytest.mark.slow  # one more fused graph
def test_pqn_fused_rollout_matches_eager(tmp_path_factory):
    """PQN's epsilon-greedy acting, its draw taken before the compiled step as the eager one takes it
    (epsilon 0.5: greedy and random actions both)."""
    eager, compiled = (
        collected(tmp_path_factory, "CartPole-v1", compile, "pqn", exploration_initial=0.5)
        for compile in (False, True)
    )
    assert compiled[0] == ["acting + env step + buffer write"]
    assert_same_rollouts(eager, compiled, exact_actions=True)


def test_compile_is_idempotent_and_skips_off_policy(tmp_path):
    trainer = Trainer(
        phalanx.make_config(
            "dqn", "CartPole-v1", use_preset=False, num_envs=2, eval_every=0, run_dir=str(tmp_path / "dqn")
        ),
        show_progress=False,
    )
    assert trainer.worker.compile() == [] and trainer.worker.compile() == []
    trainer.close()
