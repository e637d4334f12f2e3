"""GymnasiumVecEnv: the in-process adapter conforms to the contract and matches a manual Gymnasium run."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

from phalanx.envs.check import check_vec_env
from phalanx.envs.workers import GymnasiumVecEnv
from phalanx.errors import EnvError


@pytest.mark.parametrize(("env_id", "num_steps"), [("CartPole-v1", 200), ("Pendulum-v1", 210)])
def test_conforms_to_the_contract(env_id, num_steps):
    env = GymnasiumVecEnv(env_id, num_envs=3)
    report = check_vec_env(env, num_steps=num_steps)
    assert report.episodes >= 3 and report.warnings == []
    env.close()


def test_lunar_lander_conforms_when_box2d_is_installed():
    if importlib.util.find_spec("Box2D") is None:
        pytest.skip("Box2D is not installed (pip install 'phalanx[box2d]')")
    env = GymnasiumVecEnv("LunarLander-v3", num_envs=2)
    check_vec_env(env, num_steps=300)


def test_final_obs_matches_a_manual_gymnasium_run():
    n, seed, steps = 3, 7, 120
    env = GymnasiumVecEnv("CartPole-v1", num_envs=n)
    manual = [gym.make("CartPole-v1") for _ in range(n)]
    obs, _ = env.reset(seed=seed)
    manual_obs = np.stack([m.reset(seed=seed + i)[0] for i, m in enumerate(manual)])
    assert torch.equal(obs, torch.as_tensor(manual_obs))
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(steps):
        actions = rng.integers(0, 2, size=n)
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(actions))
        for i, m in enumerate(manual):
            next_obs, r, term, trunc, _ = m.step(int(actions[i]))
            assert torch.equal(info["final_obs"][i], torch.as_tensor(next_obs))
            if term or trunc:
                ended += 1
                next_obs, _ = m.reset()
            assert torch.equal(obs[i], torch.as_tensor(next_obs))
            assert float(reward[i]) == r and bool(terminated[i]) == term and bool(truncated[i]) == trunc
        done = terminated | truncated
        assert torch.equal(info["_final_obs"], done)
        assert torch.equal(info["final_obs"][~done], obs[~done])
    assert ended >= 3
    for m in manual:
        m.close()


def test_dtypes_devices_and_seeding():
    env = GymnasiumVecEnv("Pendulum-v1", num_envs=4)
    first, _ = env.reset(seed=3)
    again, _ = env.reset(seed=3)
    assert torch.equal(first, again)
    assert len({tuple(row.tolist()) for row in first}) == 4  # sub-env i seeded with seed + i
    obs, reward, terminated, truncated, info = env.step(np.zeros((4, 1)))  # numpy actions accepted
    assert obs.dtype == reward.dtype == torch.float32 and terminated.dtype == torch.bool
    assert info["episode_length"].dtype == torch.int64
    with pytest.raises(EnvError, match=r"actions have shape \(4,\), expected \(4, 1\)"):
        env.step(torch.zeros(4))


def test_discrete_observations_are_one_hot():
    env = GymnasiumVecEnv("FrozenLake-v1", num_envs=2)
    assert env.single_observation_space == gym.spaces.Box(0.0, 1.0, (16,), np.float32)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 16) and torch.equal(obs.sum(1), torch.ones(2))
    assert int(obs[0].argmax()) == 0  # FrozenLake starts in state 0
    check_vec_env(env, num_steps=100)


def test_unsupported_space_names_env_and_space():
    with pytest.raises(
        EnvError,
        match=r"'Blackjack-v1' has observation space Tuple\(Discrete\(32\).*supports observation spaces Box",
    ):
        GymnasiumVecEnv("Blackjack-v1")


class OldApi(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, {}


def test_old_gym_step_api_is_explained():
    env = GymnasiumVecEnv(OldApi, num_envs=2)
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"old gym API: step\(\) returned 4 values.*terminated.*shimmy"):
        env.step(torch.zeros(2, dtype=torch.int64))


def test_factory_returning_something_else_is_refused():
    with pytest.raises(EnvError, match="returned dict, expected a gymnasium.Env"):
        GymnasiumVecEnv(lambda: {}, num_envs=1)


def test_render_frame():
    if importlib.util.find_spec("pygame") is None:
        pytest.skip("pygame is not installed (pip install 'phalanx[render]')")
    env = GymnasiumVecEnv("CartPole-v1", num_envs=2, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render_frame(1)
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8
    env.close()
    with pytest.raises(EnvError, match="render_mode=None, expected 'rgb_array'"):
        GymnasiumVecEnv("CartPole-v1").render_frame()


def test_state_dict_holds_episode_statistics():
    env = GymnasiumVecEnv("CartPole-v1", num_envs=2)
    env.reset(seed=0)
    for _ in range(5):
        env.step(torch.zeros(2, dtype=torch.int64))
    state = env.state_dict()
    other = GymnasiumVecEnv("CartPole-v1", num_envs=2)
    other.load_state_dict(state)
    assert torch.equal(other.episode_statistics.lengths, torch.full((2,), 5))
