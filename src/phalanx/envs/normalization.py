"""Observation and reward normalisation by running statistics.

- :class:`RunningMeanStd`: running mean and variance of a stream of batches, on one device (also what
  deployed and exported policies normalise their observations with: :data:`OBS_CLIP`,
  :data:`OBS_EPSILON`).
- :class:`NormalizeObservation`: observations (and ``info["final_obs"]``) normalised and clipped, the
  statistics shareable with an evaluation env; :class:`MemberNormalizeObservation`: one set of
  statistics per member of a vectorized population.
- :class:`ScaleReward`: reward divided by the running standard deviation of the discounted return
  (the reward normalisation of Stable-Baselines3's ``VecNormalize``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space

from phalanx.envs.core import Tensor, VecEnv
from phalanx.envs.wrapper_base import VecEnvWrapper
from phalanx.errors import ConfigError

__all__ = [
    "OBS_CLIP",
    "OBS_EPSILON",
    "MemberNormalizeObservation",
    "MemberScaleReward",
    "NormalizeObservation",
    "RunningMeanStd",
    "ScaleReward",
]

OBS_CLIP = 10.0
"""Normalised observations are clipped to [-OBS_CLIP, OBS_CLIP] (training and deployment alike)."""
OBS_EPSILON = 1e-8
"""Added to the variance before the square root when normalising observations."""


class RunningMeanStd:
    """Running mean and (population) variance of a stream of batches, on one device.

    Batches are merged with the parallel-variance formula of Chan et al. (1979)::

        delta = batch_mean - mean;  n = count + batch_count
        mean += delta * batch_count / n
        var = (var * count + batch_var * batch_count + delta**2 * count * batch_count / n) / n

    The statistics are float64 (float32 on MPS, which has no float64). With thousands of envs the
    count passes 1e8 within a run; in float32 the weight ``batch_count / n`` of a new batch then falls
    near the float32 resolution (6e-8) and the estimate stops moving, and a float32 count is not even
    exact past 2**24. The cost of float64 is irrelevant here: a few element-wise ops over ``shape``.
    ``count`` starts at 0, so after the first batch the statistics are exactly that batch's mean and
    variance; before any update, ``mean = 0`` and ``var = 1`` (normalisation is the identity).
    """

    def __init__(self, shape: tuple[int, ...] = (), device: str | torch.device = "cpu") -> None:
        self.shape = tuple(shape)
        self.device = torch.device(device)
        self.dtype = torch.float32 if self.device.type == "mps" else torch.float64
        self.mean = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.var = torch.ones(self.shape, dtype=self.dtype, device=self.device)
        self.count = torch.zeros((), dtype=self.dtype, device=self.device)

    @property
    def std(self) -> Tensor:
        return self.var.sqrt()

    def update(self, batch: Tensor) -> None:
        """Merge a batch of shape ``(B, *shape)``."""
        if tuple(batch.shape[1:]) != self.shape:
            raise ConfigError(
                f"RunningMeanStd.update: batch has shape {tuple(batch.shape)}, expected (B, *{self.shape}). "
                "Statistics are per feature; pass one row per sample."
            )
        batch = batch.to(self.dtype)
        self.merge(batch.shape[0], batch.mean(dim=0), batch.var(dim=0, unbiased=False))

    def merge(self, count: float | Tensor, mean: Tensor, var: Tensor) -> None:
        """Merge the statistics of ``count`` samples with mean ``mean`` and population variance ``var``."""
        if not count:
            return
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta.square() * self.count * count / total
        self.mean = self.mean + delta * (count / total)
        self.var = m2 / total
        self.count = total

    def normalize(self, x: Tensor, epsilon: float = 1e-8) -> Tensor:
        """``(x - mean) / sqrt(var + epsilon)`` in ``x``'s dtype."""
        inv_std = torch.rsqrt(self.var + epsilon).to(x.dtype)
        return (x - self.mean.to(x.dtype)) * inv_std

    def state_dict(self) -> dict[str, Tensor]:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name in ("mean", "var", "count"):
            value = torch.as_tensor(state[name])
            if tuple(value.shape) != tuple(getattr(self, name).shape):
                raise ConfigError(
                    f"RunningMeanStd.load_state_dict: {name!r} has shape {tuple(value.shape)}, expected "
                    f"{tuple(getattr(self, name).shape)}. The checkpoint was saved for an env with "
                    "another observation shape; load it into the same env id."
                )
            setattr(self, name, value.to(device=self.device, dtype=self.dtype).clone())

    def __repr__(self) -> str:
        return f"RunningMeanStd(shape={self.shape}, count={float(self.count):g})"


def _check_positive(owner: str, name: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not value > 0:
        raise ConfigError(f"{owner}: {name} must be > 0{' or None' if allow_none else ''}, got {value!r}.")


class NormalizeObservation(VecEnvWrapper):
    """Observations normalised by a running mean and variance, then clipped to ``[-clip, clip]``.

    With ``update=True`` the statistics absorb the observations of every ``reset`` and ``step`` (the
    step's ``obs`` batch, before normalising). ``info["final_obs"]`` is normalised with the same
    statistics, so that bootstrapping on truncation sees the same input scale as the policy.

    Pass ``statistics=train_env_wrapper.statistics`` and ``update=False`` to give an evaluation env
    the training env's statistics, read-only. ``update`` may be toggled at any time.
    """

    def __init__(
        self,
        env: VecEnv,
        clip: float | None = OBS_CLIP,
        epsilon: float = OBS_EPSILON,
        statistics: RunningMeanStd | None = None,
        update: bool = True,
    ) -> None:
        super().__init__(env)
        _check_positive("NormalizeObservation", "clip", clip, allow_none=True)
        _check_positive("NormalizeObservation", "epsilon", epsilon)
        space = env.single_observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ConfigError(
                f"NormalizeObservation: the observation space of {env.unwrapped!r} is {space}, expected "
                "a Box. Normalise only vector/array observations."
            )
        shape = self.statistics_shape(space)
        if statistics is None:
            statistics = RunningMeanStd(shape, self.device)
        elif statistics.shape != shape or statistics.device != self.device:
            raise ConfigError(
                f"NormalizeObservation: the shared statistics have shape {statistics.shape} on "
                f"{statistics.device}, expected shape {shape} on {self.device} (the "
                f"observations of {env.unwrapped!r}). Share statistics only between envs with the same "
                "observation space and device."
            )
        self.statistics = statistics
        self.clip = clip
        self.epsilon = epsilon
        self.update = update
        bound = np.inf if clip is None else clip
        self.single_observation_space = gym.spaces.Box(-bound, bound, shape=space.shape, dtype=np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    def statistics_shape(self, space: gym.spaces.Box) -> tuple[int, ...]:
        """The shape of the running statistics (a subclass may keep several sets of them)."""
        return tuple(space.shape)

    def observe(self, obs: Tensor) -> None:
        """Add a batch of raw observations to the running statistics."""
        self.statistics.update(obs)

    def normalize(self, obs: Tensor) -> Tensor:
        """float32 normalised observations (integer ones, e.g. uint8, are converted first)."""
        out = self.statistics.normalize(obs if obs.is_floating_point() else obs.float(), self.epsilon)
        return out if self.clip is None else out.clamp_(-self.clip, self.clip)

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.update:
            self.observe(obs)
        return self.normalize(obs), info

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if self.update:
            self.observe(obs)
        info = dict(info)
        if "final_obs" in info:
            info["final_obs"] = self.normalize(info["final_obs"])
        return self.normalize(obs), reward, terminated, truncated, info

    def _own_state_dict(self) -> dict[str, Any]:
        return {"obs_statistics": self.statistics.state_dict()}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        self.statistics.load_state_dict(state["obs_statistics"])


class MemberNormalizeObservation(NormalizeObservation):
    """NormalizeObservation with running statistics of their own for each of P equal blocks of rows:
    the members of a vectorized population, or the snapshots of the weights that an evaluation process
    evaluates together.

    ``statistics`` is a RunningMeanStd of shape ``(P, *obs_shape)`` fed the ``(N, P, *obs_shape)`` view
    of each batch: member i's mean and variance are those a NormalizeObservation of member i's rows
    alone would hold (the count is shared: every member adds N rows per step). Normalised observations
    are clipped to ``[-OBS_CLIP, OBS_CLIP]`` as in a single run; ``update=False`` for evaluation envs.
    """

    def __init__(
        self, env: VecEnv, num_members: int, statistics: RunningMeanStd | None = None, update: bool = True
    ) -> None:
        self.num_members = num_members  # before the base class sizes the statistics with it
        super().__init__(env, statistics=statistics, update=update)

    def statistics_shape(self, space: gym.spaces.Box) -> tuple[int, ...]:
        return (self.num_members, *space.shape)

    def _by_member(self, obs: Tensor) -> Tensor:
        """``(P * N, *obs_shape)`` rows as a ``(N, P, *obs_shape)`` view."""
        return obs.view(self.num_members, -1, *obs.shape[1:]).transpose(0, 1)

    def observe(self, obs: Tensor) -> None:
        self.statistics.update(self._by_member(obs))

    def normalize(self, obs: Tensor) -> Tensor:
        obs = obs if obs.is_floating_point() else obs.float()
        normalized = self.statistics.normalize(self._by_member(obs), self.epsilon)  # (N, P, *obs_shape)
        assert self.clip is not None, "a population's observations are clipped (the default clip)"
        return normalized.transpose(0, 1).reshape(obs.shape).clamp_(-self.clip, self.clip)


class ScaleReward(VecEnvWrapper):
    """Rewards divided by the running std of the discounted return, then clipped (SB3 VecNormalize).

    Per sub-env, ``ret = gamma * ret + reward`` (reset to 0 when the episode ends, after use); the
    :class:`RunningMeanStd` of ``ret`` gives ``var``; the agent sees
    ``clip(reward / sqrt(var + epsilon), -clip, clip)``. The mean is not subtracted (shifting rewards
    would change the optimal policy when episodes can end early). ``info["episode_return"]`` stays the
    raw, unscaled return.
    """

    def __init__(
        self,
        env: VecEnv,
        gamma: float = 0.99,
        clip: float | None = 10.0,
        epsilon: float = 1e-8,
        update: bool = True,
        statistics: RunningMeanStd | None = None,
    ) -> None:
        super().__init__(env)
        if not 0.0 <= gamma <= 1.0:
            raise ConfigError(f"ScaleReward: gamma must be in [0, 1], got {gamma!r}.")
        _check_positive("ScaleReward", "clip", clip, allow_none=True)
        _check_positive("ScaleReward", "epsilon", epsilon)
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon
        self.update = update
        if statistics is not None and (statistics.shape != () or statistics.device != self.device):
            raise ConfigError(
                f"ScaleReward: the shared statistics have shape {statistics.shape} on {statistics.device}, "
                f"expected shape () on {self.device}. Share the statistics of another ScaleReward."
            )
        self.statistics = statistics if statistics is not None else RunningMeanStd((), self.device)
        self.returns = torch.zeros(self.num_envs, dtype=self.statistics.dtype, device=self.device)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        self.returns.zero_()
        return self.env.reset(seed=seed, options=options)

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        self.returns = self.returns * self.gamma + reward
        if self.update:
            self.statistics.update(self.returns)
        scaled = reward / torch.sqrt(self.statistics.var + self.epsilon)
        if self.clip is not None:
            scaled = scaled.clamp(-self.clip, self.clip)
        self.returns.masked_fill_(terminated | truncated, 0.0)
        return obs, scaled.to(reward.dtype), terminated, truncated, info

    def _own_state_dict(self) -> dict[str, Any]:
        return {"return_statistics": self.statistics.state_dict(), "returns": self.returns.clone()}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        self.statistics.load_state_dict(state["return_statistics"])
        self.returns.copy_(state["returns"])


class MemberScaleReward(ScaleReward):
    """ScaleReward with a discount and return statistics of their own for each member's block of rows.

    ``gamma`` is the population's ``(P,)`` float64 discount tensor, read at every step (a member's new
    gamma applies from the next step, as it would after a single run reloaded its config). Reset and
    state dict are ScaleReward's.
    """

    def __init__(
        self, env: VecEnv, num_members: int, gamma: Tensor, clip: float = 10.0, epsilon: float = 1e-8
    ) -> None:
        VecEnvWrapper.__init__(self, env)  # not ScaleReward's: its gamma and statistics are scalars
        self.num_members = num_members
        self.gamma = gamma  # type: ignore[assignment]  # (P,) float64, shared with the population
        self.clip = clip
        self.epsilon = epsilon
        self.update = True
        self.statistics = RunningMeanStd((num_members,), self.device)
        self.returns = torch.zeros(self.num_envs, dtype=self.statistics.dtype, device=self.device)  # (P * N,)

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        by_member = (self.num_members, -1)
        # ignored below: a (P,) tensor where ScaleReward has a float (see __init__)
        gamma: Tensor = self.gamma  # type: ignore[assignment]
        self.returns = (self.returns.view(by_member) * gamma.unsqueeze(1)).view(-1) + reward
        self.statistics.update(self.returns.view(by_member).T)  # (N, P)
        scale = torch.sqrt(self.statistics.var + self.epsilon).to(reward.dtype)  # (P,)
        assert self.clip is not None, "a population's rewards are clipped (clip is a float here)"
        scaled = (reward.view(by_member) / scale.unsqueeze(1)).view(-1).clamp(-self.clip, self.clip)
        self.returns.masked_fill_(terminated | truncated, 0.0)
        return obs, scaled, terminated, truncated, info
