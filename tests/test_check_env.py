"""check_vec_env: a conforming env passes; each kind of broken env is named with expected vs actual."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from phalanx.envs.check import CheckReport, check_vec_env
from phalanx.envs.core import BatchedVecEnv
from phalanx.errors import ContractError


class Walk(BatchedVecEnv):
    """obs = (position, speed); position grows by speed * (1 + action); ends past 2, or after 30 steps."""

    def __init__(self, num_envs: int = 4, device: str = "cpu") -> None:
        super().__init__(
            num_envs,
            gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32),
            gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32),
            device,
            max_episode_steps=30,
        )
        self.state = torch.zeros(self.num_envs, 2, device=self.device)

    def _reset_rows(self, mask: torch.Tensor) -> None:
        new = torch.stack(
            [self.uniform(-1, 0, (self.num_envs,)), self.uniform(0.1, 0.4, (self.num_envs,))], 1
        )
        self.state = torch.where(mask[:, None], new, self.state)

    def _advance(self, actions):
        position = self.state[:, 0] + self.state[:, 1] * (1 + actions[:, 0])
        self.state = torch.stack([position, self.state[:, 1]], 1)
        return -position.abs(), position > 2.0

    def _observe(self):
        return self.state.clone()


def violations(env, num_steps: int = 200) -> str:
    with pytest.raises(ContractError) as info:
        check_vec_env(env, num_steps=num_steps)
    assert info.value.violations  # one line per problem
    return str(info.value)


def test_conforming_env_passes_with_a_report():
    report = check_vec_env(Walk(), num_steps=200)
    assert isinstance(report, CheckReport)
    assert report.num_steps == 200 and report.episodes > 10
    assert 1 <= report.mean_episode_length <= 30
    assert report.warnings == []


def test_wrong_obs_shape():
    class WrongShape(Walk):
        def _observe(self):
            return torch.cat([self.state, self.state[:, :1]], 1)

    message = violations(WrongShape())
    assert "reset() obs: expected shape (4, 2), got (4, 3)" in message


def test_float64_obs():
    class Float64(Walk):
        def _observe(self):
            return self.state.double()

    message = violations(Float64())
    assert "expected dtype torch.float32, got torch.float64" in message


def test_reward_of_the_wrong_shape():
    class RewardShape(Walk):
        def step(self, actions):
            obs, reward, terminated, truncated, info = super().step(actions)
            return obs, reward[:, None], terminated, truncated, info

    message = violations(RewardShape())
    assert "step() reward: expected shape (4,), got (4, 1)" in message


def test_missing_final_obs_and_several_violations_together():
    class NoFinalObs(Walk):
        def step(self, actions):
            obs, reward, terminated, truncated, info = super().step(actions)
            del info["final_obs"]
            return obs, reward.double(), terminated, truncated, info

    with pytest.raises(ContractError) as info:
        check_vec_env(NoFinalObs(), num_steps=50)
    lines = info.value.violations
    assert any('info["final_obs"]: missing' in line for line in lines)
    assert any("reward: expected dtype torch.float32, got torch.float64" in line for line in lines)
    assert len(str(info.value).splitlines()) == 1 + len(lines)


def test_no_autoreset():
    class NoAutoreset(Walk):
        """Resets only on reset(); ended rows keep going (and keep reporting terminated)."""

        def _reset_rows(self, mask):
            if bool(mask.all()) and getattr(self, "_full_reset", True):
                super()._reset_rows(mask)

        def step(self, actions):
            self._full_reset = False
            try:
                return super().step(actions)
            finally:
                self._full_reset = True

    message = violations(NoAutoreset())
    assert "autoreset" in message and "final_obs == obs" in message


def test_final_obs_differs_from_obs_where_nothing_ended():
    class StaleFinal(Walk):
        def step(self, actions):
            before = self._observe()
            obs, reward, terminated, truncated, info = super().step(actions)
            info["final_obs"] = before
            return obs, reward, terminated, truncated, info

    message = violations(StaleFinal())
    assert (
        'info["final_obs"] at step 1, sub-env index 0 (episode not ended): expected equal to obs' in message
    )


def test_nan_obs_names_the_sub_env():
    class NanObs(Walk):
        def _observe(self):
            obs = self.state.clone()
            obs[1, 0] = float("nan")
            return obs

    message = violations(NanObs())
    assert "expected finite values, got [nan," in message and "sub-env index 1" in message


def test_step_that_raises_is_reported_not_propagated():
    class Raises(Walk):
        def _advance(self, actions):
            raise RuntimeError("boom in the physics")

    message = violations(Raises())
    assert "step(actions) at step 1 raised RuntimeError: boom in the physics" in message
    assert "_advance" in message  # where it was raised


def test_non_deterministic_seeding():
    class GlobalRng(Walk):
        def _reset_rows(self, mask):
            new = torch.rand(self.num_envs, 2)  # the global RNG, not self.generator
            self.state = torch.where(mask[:, None], new, self.state)

    message = violations(GlobalRng(), num_steps=30)
    assert "seeding: reset(seed=0) twice" in message and "first run" in message and "second run" in message


def test_wrong_mask_and_episode_length():
    class BadInfo(Walk):
        def step(self, actions):
            obs, reward, terminated, truncated, info = super().step(actions)
            info["_final_obs"] = terminated
            info["episode_length"] = info["episode_length"] * 0
            return obs, reward, terminated, truncated, info

    message = violations(BadInfo())
    assert 'info["_final_obs"]' in message and "expected terminated | truncated" in message
    assert "expected >= 1 for an ended episode, got 0" in message


def test_wrong_autoreset_mode_and_missing_attributes():
    env = Walk()
    env.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    message = violations(env)
    assert "expected AutoresetMode.SAME_STEP, got <AutoresetMode.NEXT_STEP" in message

    class NotAnEnv:
        num_envs = 2

        def reset(self, seed=None):
            return None

    message = violations(NotAnEnv())
    assert "NotAnEnv is missing device, single_observation_space" in message


def test_numpy_arrays_instead_of_tensors():
    class Numpy(Walk):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            return obs.numpy(), info

    message = violations(Numpy())
    assert "reset() obs: expected a torch.Tensor, got ndarray" in message


def test_no_episode_end_is_a_warning():
    report = check_vec_env(Walk(num_envs=2), num_steps=1)
    assert report.episodes == 0 and "no episode ended" in report.warnings[0]
