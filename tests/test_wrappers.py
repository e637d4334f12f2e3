"""VecEnv wrappers: normalisation statistics, final_obs, action rescaling, reward scaling, NaN guard."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from phalanx.envs.core import BatchedVecEnv, EpisodeStatistics, VecEnv
from phalanx.envs.wrappers import (
    NanGuard,
    NormalizeObservation,
    RescaleAction,
    RunningMeanStd,
    ScaleReward,
    VecEnvWrapper,
    find_wrapper,
)
from phalanx.errors import ConfigError, ContractError


class Drift(BatchedVecEnv):
    """obs = state = (position, velocity); the action pushes; an episode ends when position > 3."""

    def __init__(self, num_envs: int = 4, device: str = "cpu", max_episode_steps: int | None = 50) -> None:
        obs_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        act_space = gym.spaces.Box(
            np.array([-2.0], np.float32), np.array([3.0], np.float32), dtype=np.float32
        )
        super().__init__(num_envs, obs_space, act_space, device, max_episode_steps)
        self.state = torch.zeros(self.num_envs, 2, device=self.device)

    def _reset_rows(self, mask: torch.Tensor) -> None:
        new = torch.stack(
            [self.uniform(-1.0, 1.0, (self.num_envs,)), self.uniform(0.5, 1.5, (self.num_envs,))], 1
        )
        self.state = torch.where(mask[:, None], new, self.state)

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        velocity = self.state[:, 1] + 0.1 * actions[:, 0]
        position = self.state[:, 0] + 0.1 * velocity
        self.state = torch.stack([position, velocity], 1)
        return position.clone(), position > 3.0

    def _observe(self) -> torch.Tensor:
        return self.state.clone()


class Record(VecEnvWrapper):
    """Keeps the raw arrays that pass through, for comparisons with the wrapper above it."""

    def __init__(self, env: VecEnv) -> None:
        super().__init__(env)
        self.obs: list[torch.Tensor] = []
        self.actions: list[torch.Tensor] = []
        self.infos: list[dict[str, Any]] = []

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.obs.append(obs.clone())
        return obs, info

    def step(self, actions):
        self.actions.append(actions.clone())
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.obs.append(obs.clone())
        self.infos.append({key: value.clone() for key, value in info.items()})
        return obs, reward, terminated, truncated, info


class Scripted(VecEnv):
    """Returns a fixed sequence of rewards and done flags (obs is always zero)."""

    def __init__(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        super().__init__(
            rewards.shape[1],
            gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32),
            gym.spaces.Discrete(2),
        )
        self.rewards = torch.as_tensor(rewards, dtype=torch.float32)
        self.dones = torch.as_tensor(dones, dtype=torch.bool)
        self.t = 0
        self.stats = EpisodeStatistics(self.num_envs, self.device)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return torch.zeros(self.num_envs, 1), {}

    def step(self, actions):
        reward, done = self.rewards[self.t], self.dones[self.t]
        self.t += 1
        ep_return, ep_length = self.stats.step(reward, done)
        obs = torch.zeros(self.num_envs, 1)
        info = {
            "final_obs": obs.clone(),
            "_final_obs": done,
            "episode_return": ep_return,
            "episode_length": ep_length,
        }
        return obs, reward.clone(), done, torch.zeros_like(done), info


def random_actions(env: VecEnv, generator: torch.Generator) -> torch.Tensor:
    space = env.single_action_space
    return torch.rand((env.num_envs, *space.shape), generator=generator) * 2 - 1


# -- RunningMeanStd ------------------------------------------------------------------------------------
def test_running_mean_std_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(size, 3)) for size in (1, 7, 64, 5)]
    stats = RunningMeanStd((3,))
    for batch in batches:
        stats.update(torch.as_tensor(batch, dtype=torch.float32))
    data = np.concatenate([b.astype(np.float32) for b in batches]).astype(np.float64)
    assert stats.mean.dtype == torch.float64
    np.testing.assert_allclose(stats.mean.numpy(), data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(stats.var.numpy(), data.var(0), rtol=1e-10)
    assert float(stats.count) == len(data)


def test_running_mean_std_rejects_wrong_shape():
    with pytest.raises(ConfigError, match=r"expected \(B, \*\(3,\)\)"):
        RunningMeanStd((3,)).update(torch.zeros(4, 2))


# -- NormalizeObservation ---------------------------------------------------------------------------------
def test_normalize_observation_statistics_match_data_seen():
    record = Record(Drift(num_envs=4))
    env = NormalizeObservation(record, clip=5.0)
    generator = torch.Generator().manual_seed(0)
    obs, _ = env.reset(seed=0)
    for _ in range(60):
        obs, *_ = env.step(random_actions(env, generator))
    data = torch.cat(record.obs).double().numpy()  # (61 * 4, 2): reset obs and every step's obs
    np.testing.assert_allclose(env.statistics.mean.numpy(), data.mean(0), rtol=1e-9)
    np.testing.assert_allclose(env.statistics.var.numpy(), data.var(0), rtol=1e-9)
    raw = record.obs[-1].double().numpy()
    expected = np.clip((raw - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), -5.0, 5.0)
    np.testing.assert_allclose(obs.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert obs.dtype == torch.float32
    assert env.single_observation_space == gym.spaces.Box(-5.0, 5.0, (2,), np.float32)


def test_normalize_observation_final_obs_uses_the_same_statistics():
    record = Record(Drift(num_envs=4, max_episode_steps=7))
    env = NormalizeObservation(record)
    generator = torch.Generator().manual_seed(1)
    env.reset(seed=1)
    ended_any = False
    for _ in range(30):
        obs, _, terminated, truncated, info = env.step(random_actions(env, generator))
        done = terminated | truncated
        raw_final = record.infos[-1]["final_obs"]
        expected = env.normalize(raw_final)  # statistics already include this step's obs
        torch.testing.assert_close(info["final_obs"], expected)
        torch.testing.assert_close(info["final_obs"][~done], obs[~done])
        if done.any():
            ended_any = True
            assert not torch.equal(info["final_obs"][done], obs[done])
    assert ended_any


def test_shared_statistics_with_update_false_stay_unchanged():
    train = NormalizeObservation(Drift(num_envs=4))
    generator = torch.Generator().manual_seed(2)
    train.reset(seed=2)
    for _ in range(10):
        train.step(random_actions(train, generator))
    before = copy.deepcopy(train.statistics.state_dict())
    evaluation = NormalizeObservation(Drift(num_envs=3), statistics=train.statistics, update=False)
    evaluation.reset(seed=3)
    for _ in range(10):
        obs, *_ = evaluation.step(random_actions(evaluation, generator))
    for key, value in train.statistics.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert evaluation.statistics is train.statistics
    train.update = False
    train.step(random_actions(train, generator))
    assert float(train.statistics.count) == float(before["count"])


def test_shared_statistics_of_another_shape_are_refused():
    with pytest.raises(ConfigError, match=r"expected shape \(2,\)"):
        NormalizeObservation(Drift(), statistics=RunningMeanStd((5,)))


# -- RescaleAction ----------------------------------------------------------------------------------------
def test_rescale_action_maps_unit_box_to_bounds():
    record = Record(Drift(num_envs=4))
    env = RescaleAction(record)
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    env.reset(seed=0)
    env.step(torch.tensor([[-1.0], [1.0], [0.0], [5.0]]))
    torch.testing.assert_close(record.actions[-1], torch.tensor([[-2.0], [3.0], [0.5], [3.0]]))
    env.step(np.array([[-7.0], [0.5], [-0.5], [1.0]], dtype=np.float32))  # numpy accepted, clipped
    torch.testing.assert_close(record.actions[-1], torch.tensor([[-2.0], [1.75], [-0.75], [3.0]]))


def test_rescale_action_refuses_unbounded_boxes():
    class Unbounded(Drift):
        def __init__(self):
            super().__init__()
            self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    with pytest.raises(ConfigError, match="infinite bounds"):
        RescaleAction(Unbounded())


# -- ScaleReward --------------------------------------------------------------------------------------
def test_scale_reward_matches_hand_computation():
    rewards = np.array([[1.0, -2.0], [0.5, 4.0], [2.0, 1.0], [-1.0, 0.0], [3.0, 2.0]])
    dones = np.array([[0, 0], [1, 0], [0, 0], [0, 1], [0, 0]], dtype=bool)
    gamma, clip, eps = 0.9, 1.5, 1e-8
    env = ScaleReward(Scripted(rewards, dones), gamma=gamma, clip=clip, epsilon=eps)
    env.reset()
    returns = np.zeros(2)
    seen = []
    for t in range(len(rewards)):
        _, reward, _, _, info = env.step(torch.zeros(2, dtype=torch.int64))
        returns = returns * gamma + rewards[t]
        seen.append(returns.copy())
        expected = np.clip(rewards[t] / np.sqrt(np.var(np.concatenate(seen)) + eps), -clip, clip)
        np.testing.assert_allclose(reward.numpy(), expected, rtol=1e-6)
        assert reward.dtype == torch.float32
        returns[dones[t]] = 0.0
        if dones[t].any():  # episode statistics stay raw
            row = int(np.flatnonzero(dones[t])[0])
            assert float(info["episode_return"][row]) == pytest.approx(rewards[: t + 1, row].sum())
    np.testing.assert_allclose(env.returns.numpy(), returns)


# -- NanGuard -----------------------------------------------------------------------------------------
class NanAtStep(Drift):
    def __init__(self, row: int, at: int) -> None:
        super().__init__(num_envs=4)
        self.row, self.at, self.t = row, at, 0

    def _observe(self) -> torch.Tensor:
        obs = self.state.clone()
        if self.t >= self.at:
            obs[self.row, 1] = float("nan")
        return obs

    def _advance(self, actions):
        self.t += 1
        return super()._advance(actions)


def test_nan_guard_names_array_sub_env_and_step():
    env = NanGuard(NanAtStep(row=2, at=3))
    env.reset(seed=0)
    env.step(torch.zeros(4, 1))
    env.step(torch.zeros(4, 1))
    with pytest.raises(ContractError) as info:
        env.step(torch.zeros(4, 1))
    message = str(info.value)
    assert "non-finite obs" in message and "sub-env index 2" in message and "step 3" in message
    assert "NanAtStep" in message and "dynamics" in message


def test_nan_guard_flags_nan_actions_as_a_diverged_policy():
    env = NanGuard(Drift(num_envs=4))
    env.reset(seed=0)
    actions = torch.zeros(4, 1)
    actions[1, 0] = float("nan")
    with pytest.raises(ContractError, match=r"actions .* sub-env index 1.*policy diverged.*learning rate"):
        env.step(actions)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_nan_guard_checks_every_float_dtype(dtype):
    """CPU arrays numpy can hold are checked with numpy, the others (bfloat16) with torch: both catch
    an inf, and finite arrays of the dtype pass."""

    class Typed(NanAtStep):
        def _observe(self) -> torch.Tensor:
            return super()._observe().nan_to_num(nan=float("inf")).to(dtype)

    env = NanGuard(Typed(row=1, at=2))
    env.reset(seed=0)
    env.step(torch.zeros(4, 1))
    with pytest.raises(ContractError, match=r"non-finite obs .* sub-env index 1, step 2 .* got inf"):
        env.step(torch.zeros(4, 1))


def test_nan_guard_deferred_check_reports_the_first_offence():
    env = NanGuard(NanAtStep(row=3, at=2), check_every=4)
    env._sync_each_step = False  # the accelerator path, exercised on CPU
    env.reset(seed=0)
    for _ in range(3):
        env.step(torch.zeros(4, 1))  # the NaN appears at step 2 but is only read back at step 4
    with pytest.raises(ContractError, match=r"non-finite obs in step\(\) at step 2 .* got a NaN or an inf"):
        env.step(torch.zeros(4, 1))


def test_nan_guard_traced_step_locates_the_sub_env_and_keeps_the_first_offence():
    """step_with_noise (what a compiled step traces) locates the sub-env and value; an eager step's later
    offence does not overwrite the first one."""
    env = NanGuard(NanAtStep(row=3, at=2), check_every=100)
    env._sync_each_step = False
    env.reset(seed=0)
    for _ in range(3):
        env.step_with_noise(torch.zeros(4, 1), env.step_noise())
    env.step(torch.full((4, 1), float("inf")))  # a later offence, in another array
    with pytest.raises(ContractError, match=r"non-finite obs .* sub-env index 3, step 2 .* got nan"):
        env.check()


def test_nan_guard_eager_accelerator_step_costs_few_kernels():
    """On an accelerator every eager kernel is a launch: the guard's record of a step stays a few
    kernels per array (locating the sub-env and value cost ~30 per array, half of PPO's eager step)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    def kernels_per_step(env: VecEnv) -> float:
        env.reset(seed=0)
        env.step(torch.zeros(4, 1))
        Count.calls = 0
        with Count():
            for _ in range(10):
                env.step(torch.zeros(4, 1))
        return Count.calls / 10

    guard = NanGuard(Drift(num_envs=4, max_episode_steps=5), check_every=10**6)
    guard._sync_each_step = False
    added = kernels_per_step(guard) - kernels_per_step(Drift(num_envs=4, max_episode_steps=5))
    # 26 now (four arrays: three kernels each for the flag, then one record); locating took 121
    assert 0 < added <= 32, f"the NaN guard adds {added} kernels per eager step, expected <= 32"


# -- base class and state ---------------------------------------------------------------------------
def test_wrapper_chain_forwards_and_finds():
    inner = Drift(num_envs=3)
    env = NanGuard(ScaleReward(NormalizeObservation(RescaleAction(inner))))
    assert env.unwrapped is inner
    assert env.num_envs == 3 and env.device == inner.device
    assert find_wrapper(env, NormalizeObservation) is env.env.env
    assert find_wrapper(env, Record) is None
    env.reset(seed=0)
    assert env.state is inner.state
    with pytest.raises(AttributeError, match="no `state` attribute"):
        _ = NormalizeObservation(Scripted(np.zeros((1, 2)), np.zeros((1, 2)))).state
    assert not hasattr(NormalizeObservation(Scripted(np.zeros((1, 2)), np.zeros((1, 2)))), "state")


def test_wrapper_chain_conforms_to_the_contract():
    from phalanx.envs.check import check_vec_env

    env = NanGuard(ScaleReward(NormalizeObservation(RescaleAction(Drift(num_envs=4, max_episode_steps=20)))))
    report = check_vec_env(env, num_steps=100)
    assert report.episodes >= 4


def test_state_dict_round_trip_reproduces_the_trajectory():
    env = ScaleReward(NormalizeObservation(Drift(num_envs=4, max_episode_steps=9)))
    generator = torch.Generator().manual_seed(4)
    env.reset(seed=4)
    for _ in range(13):
        env.step(random_actions(env, generator))
    state = copy.deepcopy(env.state_dict())
    assert set(state) == {"env", "return_statistics", "returns"}
    assert set(state["env"]) == {"env", "obs_statistics"}
    actions = [random_actions(env, generator) for _ in range(12)]
    first = [env.step(a)[:2] for a in actions]
    env.load_state_dict(state)
    second = [env.step(a)[:2] for a in actions]
    for (obs_a, rew_a), (obs_b, rew_b) in zip(first, second, strict=True):
        assert torch.equal(obs_a, obs_b) and torch.equal(rew_a, rew_b)


def test_wrapper_parameters_are_validated():
    with pytest.raises(ConfigError, match="check_every"):
        NanGuard(Drift(), check_every=0)
    with pytest.raises(ConfigError, match="gamma"):
        ScaleReward(Drift(), gamma=1.5)
    with pytest.raises(ConfigError, match="clip"):
        NormalizeObservation(Drift(), clip=-1.0)
    with pytest.raises(ConfigError, match="wraps a phalanx VecEnv"):
        NormalizeObservation(gym.make("CartPole-v1"))


@pytest.mark.parametrize("algo, every", [("ppo", 7), ("sac", 1)])
def test_training_nan_guard_reads_once_per_rollout_on_policy_and_every_step_off_policy(algo, every):
    """On an accelerator each read of the guard's record is a host synchronisation: once per PPO rollout
    (at its last step, before the update), every step off-policy (the next update may sample it)."""
    from phalanx.config import TrainConfig
    from phalanx.train.environments import build_env

    hyperparameters = {"horizon": 7} if algo == "ppo" else {}
    config = TrainConfig.from_dict(
        {"algo": algo, "env": "Pendulum-v1", "num_envs": 2, "hyperparameters": hyperparameters}
    )
    env = build_env(config, 2, training=True)
    try:
        assert find_wrapper(env, NanGuard).check_every == every
    finally:
        env.close()
