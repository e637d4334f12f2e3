"""Spaces at the VecEnv boundary: uint8 images stay uint8, Dict observations arrive flat, MultiDiscrete
actions reach the envs; FrameStack on device tensors."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from space_envs import DictEnv, MultiDiscreteEnv, PixelEnv

from phalanx.envs.check import check_vec_env
from phalanx.envs.core import EpisodeStatistics, VecEnv, flat_observation, tensor_space
from phalanx.envs.workers import GymnasiumVecEnv, ProcessVecEnv
from phalanx.envs.wrappers import FrameStack, NanGuard, NormalizeObservation, RescaleAction
from phalanx.errors import ConfigError, EnvError

torch.set_num_threads(1)


def test_tensor_space_keeps_uint8_dict_and_multidiscrete():
    image = gym.spaces.Box(0, 255, (3, 8, 8), dtype=np.uint8)
    assert tensor_space(image, "observation") == image
    assert tensor_space(image, "action").dtype == np.float32  # a uint8 Box action is continuous
    assert tensor_space(gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64), "observation").dtype == np.float32
    parts = gym.spaces.Dict({"b": gym.spaces.Box(0, 1, (2,)), "a": gym.spaces.Discrete(3)})
    assert tensor_space(parts, "observation") is parts
    shifted = gym.spaces.MultiDiscrete([3, 4], start=[1, 0])
    assert tensor_space(shifted, "action") == shifted  # its start kept: RescaleAction shifts the agent's
    assert tensor_space(gym.spaces.Discrete(3, start=-2), "action") == gym.spaces.Discrete(3, start=-2)
    assert tensor_space(gym.spaces.MultiDiscrete([[2, 2]]), "action") is None  # two-dimensional nvec
    assert tensor_space(gym.spaces.Dict({"text": gym.spaces.Text(4)}), "observation") is None


def test_unsupported_dict_part_is_named():
    space = gym.spaces.Dict({"position": gym.spaces.Box(0, 1, (2,)), "name": gym.spaces.Text(5)})

    def factory() -> gym.Env:
        env = DictEnv()
        env.observation_space = space
        return env

    with pytest.raises(EnvError, match=r"part 'name' \(Text.*cannot be flattened.*Dict \(of Box, Discrete"):
        GymnasiumVecEnv(factory, num_envs=1)


def single_env_trajectory(factory, seed: int, actions: list) -> list[np.ndarray]:
    """The observations of one Gymnasium env stepped with ``actions`` (reset on episode end)."""
    env = factory()
    obs, _ = env.reset(seed=seed)
    trace = [obs]
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        trace.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
            trace.append(obs)
    return trace


@pytest.fixture(scope="module")
def pixel_workers():
    env = ProcessVecEnv(PixelEnv, num_envs=4, num_workers=2)
    yield env
    env.close()


def test_uint8_images_travel_as_uint8_through_worker_processes(pixel_workers):
    env = pixel_workers
    assert env._views["obs"].dtype == np.uint8 and env._views["final_obs"].dtype == np.uint8  # shared memory
    assert env.single_observation_space == gym.spaces.Box(0, 255, (12, 12), dtype=np.uint8)
    actions = [np.array([step % 4, 2, 3, 0]) for step in range(30)]
    obs, _ = env.reset(seed=5)
    traces = [[obs[row].numpy()] for row in range(4)]
    for action in actions:
        obs, _, terminated, truncated, info = env.step(torch.as_tensor(action))
        assert obs.dtype == torch.uint8 and info["final_obs"].dtype == torch.uint8
        for row in range(4):
            traces[row].append(info["final_obs"][row].numpy())
            if terminated[row] or truncated[row]:
                traces[row].append(obs[row].numpy())
    for row in range(4):
        expected = single_env_trajectory(PixelEnv, 5 + row, [int(a[row]) for a in actions])
        assert len(traces[row]) == len(expected)
        assert all(np.array_equal(a, b) for a, b in zip(traces[row], expected, strict=True))


def test_uint8_images_in_process_and_the_checker():
    env = GymnasiumVecEnv(PixelEnv, num_envs=2, channels=True)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == torch.uint8 and obs.shape == (2, 1, 12, 12)
    report = check_vec_env(env, num_steps=100)
    assert report.episodes > 0
    env.close()


def test_dict_observations_are_flat_float32_in_flatten_order():
    space = DictEnv().observation_space
    assert list(space.spaces) == ["flags", "mode", "velocity"]  # Gymnasium sorts the keys
    for env in (GymnasiumVecEnv(DictEnv, num_envs=2), ProcessVecEnv(DictEnv, num_envs=2, num_workers=1)):
        assert env.single_observation_space == space
        obs, _ = env.reset(seed=3)
        assert obs.dtype == torch.float32 and obs.shape == (2, 2 + 3 + 2)
        single = DictEnv()
        raw, _ = single.reset(seed=3)
        assert np.array_equal(obs[0].numpy(), flat_observation(space, raw))
        # flags (2), then mode one-hot (start 1: value v at index v - 1), then velocity
        assert obs[0, :2].tolist() == raw["flags"].tolist()
        assert obs[0, 2:5].tolist() == np.eye(3)[raw["mode"] - 1].tolist()
        assert np.allclose(obs[0, 5:].numpy(), raw["velocity"])
        for _ in range(5):
            obs, _, _, truncated, info = env.step(torch.tensor([0, 1]))
        assert truncated.all()
        assert info["final_obs"].shape == (2, 7) and not torch.equal(info["final_obs"], obs)
        assert check_vec_env(env, num_steps=20).episodes > 0
        env.close()


def test_multidiscrete_actions_reach_the_env_with_its_start():
    """The adapters present the simulator's space (start included) and pass actions as they are; the
    agent's, from 0, are shifted by RescaleAction."""
    for env in (
        GymnasiumVecEnv(MultiDiscreteEnv, num_envs=3),
        ProcessVecEnv(MultiDiscreteEnv, num_envs=2, num_workers=2),
    ):
        assert env.single_action_space == gym.spaces.MultiDiscrete([3, 4], start=[1, -2])
        env.reset(seed=0)
        actions = torch.tensor([[1, -2], [3, 1], [2, 0]])[: env.num_envs]
        obs, *_ = env.step(actions)
        assert obs.tolist() == actions.float().tolist()
        agent = RescaleAction(env)
        assert agent.single_action_space == gym.spaces.MultiDiscrete([3, 4])
        obs, *_ = agent.step(actions - torch.tensor([1, -2]))
        assert obs.tolist() == actions.float().tolist()  # the env's start added
        with pytest.raises(EnvError, match="actions have shape"):
            env.step(torch.zeros(env.num_envs, dtype=torch.int64))
        assert check_vec_env(env, num_steps=10).num_steps == 10
        env.close()


def test_rescale_action_shifts_discrete_actions_and_leaves_those_from_0_alone():
    from space_envs import ShiftedCartPole

    env = RescaleAction(GymnasiumVecEnv(lambda: ShiftedCartPole(start=-3), num_envs=2))
    assert env.single_action_space == gym.spaces.Discrete(2)
    env.reset(seed=0)
    env.step(torch.tensor([0, 1]))  # -3 and -2 reach the env, which raises on anything else
    with pytest.raises(Exception, match="is not in Discrete"):
        env.env.step(torch.tensor([0, 1]))  # the raw adapter passes them as they are
    env.close()


def test_nan_guard_and_normalization_take_uint8():
    env = NanGuard(GymnasiumVecEnv(PixelEnv, num_envs=2))
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(torch.tensor([0, 1]))
    assert obs.dtype == torch.uint8
    normalized = NormalizeObservation(GymnasiumVecEnv(PixelEnv, num_envs=2))
    obs, _ = normalized.reset(seed=0)
    assert obs.dtype == torch.float32 and obs.abs().max() <= 10.0
    env.close()
    normalized.close()


# -- FrameStack ---------------------------------------------------------------------------------------
class CountingEnv(VecEnv):
    """Observations ``[t, row]`` (uint8) where t counts the row's steps in its episode; row r's episodes
    end after r + 2 steps (terminated)."""

    def __init__(self, num_envs: int = 3) -> None:
        super().__init__(
            num_envs,
            gym.spaces.Box(0, 255, (2,), dtype=np.uint8),
            gym.spaces.Discrete(2),
        )
        self.t = torch.zeros(num_envs, dtype=torch.uint8)
        self.rows = torch.arange(num_envs, dtype=torch.uint8)
        self.statistics = EpisodeStatistics(num_envs, self.device)

    def observe(self) -> torch.Tensor:
        return torch.stack([self.t, self.rows], dim=1)

    def reset(self, *, seed=None, options=None):
        self.t.zero_()
        return self.observe(), {}

    def step(self, actions):
        self.t += 1
        final = self.observe()
        terminated = self.t >= self.rows + 2
        self.t = torch.where(terminated, 0, self.t)
        reward = torch.ones(self.num_envs)
        truncated = torch.zeros_like(terminated)
        episode_return, episode_length = self.statistics.step(reward, terminated)
        info = {"final_obs": final, "_final_obs": terminated}
        info |= {"episode_return": episode_return, "episode_length": episode_length}
        return self.observe(), reward, terminated, truncated, info


def test_frame_stack_stacks_resets_and_gives_final_stacks():
    env = FrameStack(CountingEnv(), num_frames=3)
    assert env.single_observation_space.shape == (3, 2) and env.single_observation_space.dtype == np.uint8
    obs, _ = env.reset()
    assert obs.dtype == torch.uint8 and obs[:, :, 0].tolist() == [[0, 0, 0]] * 3  # the first obs, 3 times
    obs, _, terminated, _, info = env.step(torch.zeros(3, dtype=torch.int64))
    assert obs[:, :, 0].tolist() == [[0, 0, 1]] * 3 and not terminated.any()
    obs, _, terminated, _, info = env.step(torch.zeros(3, dtype=torch.int64))
    assert terminated.tolist() == [True, False, False]
    assert info["final_obs"][0, :, 0].tolist() == [0, 1, 2]  # row 0's last stack
    assert obs[0, :, 0].tolist() == [0, 0, 0]  # row 0 starts again from its reset observation
    assert obs[1:, :, 0].tolist() == [[0, 1, 2]] * 2 and torch.equal(info["final_obs"][1:], obs[1:])
    assert obs[:, :, 1].tolist() == [[0] * 3, [1] * 3, [2] * 3]  # rows never mix
    kept = obs.clone()
    env.step(torch.zeros(3, dtype=torch.int64))
    assert torch.equal(obs, kept)  # returned stacks are never modified later
    assert check_vec_env(FrameStack(CountingEnv(), num_frames=4), num_steps=30).episodes > 0


def test_frame_stack_state_dict_resumes_exactly():
    actions = torch.zeros(3, dtype=torch.int64)
    first = FrameStack(CountingEnv(), num_frames=4)
    first.reset()
    for _ in range(3):
        first.step(actions)
    second = FrameStack(CountingEnv(), num_frames=4)
    second.reset()
    second.load_state_dict(first.state_dict())
    second.env.t.copy_(first.env.t)  # (the toy env keeps its counters outside its state_dict)
    for _ in range(4):
        a, b = first.step(actions), second.step(actions)
        assert torch.equal(a[0], b[0]) and torch.equal(a[4]["final_obs"], b[4]["final_obs"])


def test_frame_stack_stacks_channel_images_along_channels():
    env = FrameStack(GymnasiumVecEnv(PixelEnv, num_envs=2, channels=True), num_frames=4)
    assert env.single_observation_space.shape == (4, 12, 12)
    obs, _ = env.reset(seed=1)
    next_obs, *_ = env.step(torch.tensor([0, 0]))
    assert torch.equal(next_obs[:, :3], obs[:, 1:])
    with pytest.raises(ConfigError, match="expected a Box"):
        FrameStack(GymnasiumVecEnv(DictEnv, num_envs=1))
    env.close()
