"""Wrappers around a :class:`~phalanx.envs.core.VecEnv`: every array stays a tensor on the env's device.

- :class:`VecEnvWrapper`: the base class; forwards everything explicitly (no ``__getattr__``), keeps
  the wrapped env's state in ``state_dict()["env"]``.
- :class:`RescaleAction`: the agent acts in ``[-1, 1]`` (a Box) or from 0 (Discrete, MultiDiscrete); the
  wrapper maps its actions into the env's space (:class:`ActionMap`, shared with deployed and exported
  policies).
- :class:`NormalizeObservation`: running mean/variance normalisation of observations (and of
  ``info["final_obs"]`` with the same statistics), statistics shareable with an evaluation env.
- :class:`ScaleReward`: reward divided by the running standard deviation of the discounted return
  (the reward normalisation of Stable-Baselines3's ``VecNormalize``).
- :class:`NanGuard`: raises a :class:`~phalanx.errors.ContractError` at the first non-finite action,
  observation or reward, naming the array, the sub-env index and the step (integer arrays, such as
  uint8 images, cannot hold one and are not checked).
- :class:`FrameStack`: the last k observations of every sub-env as one, on the device (Atari's 4 frames).
- :class:`MaskVelocity`: zeroes chosen entries of the observations (the velocities of CartPole and
  Pendulum: the built-in memory tasks ``CartPoleNoVel-v1``, ``PendulumNoVel-v1``).

Wrappers never change ``info["episode_return"]`` / ``info["episode_length"]``: those are the
undiscounted statistics of the innermost env's own rewards.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space

from phalanx.compiling import compiled
from phalanx.envs.core import ConcatVecEnv, Tensor, VecEnv
from phalanx.errors import ConfigError, ContractError

__all__ = [
    "ActionMap",
    "FrameStack",
    "MaskVelocity",
    "MemberNormalizeObservation",
    "NanGuard",
    "NormalizeObservation",
    "RescaleAction",
    "RunningMeanStd",
    "ScaleReward",
    "VecEnvWrapper",
    "find_wrapper",
]

W = TypeVar("W", bound="VecEnvWrapper")


class VecEnvWrapper(VecEnv):
    """Base class of VecEnv wrappers: forwards ``reset``/``step``, spaces, ``num_envs``, ``device``.

    A subclass that changes a space assigns ``single_observation_space`` / ``single_action_space``
    (and the batched space) after ``super().__init__(env)``. A step is split in two hooks, so that
    :meth:`step_async` / :meth:`step_wait` pass through every wrapper: :meth:`_action` maps the actions
    on their way in, :meth:`_transition` maps the results on their way out. Wrapper state goes in
    :meth:`_own_state_dict` / :meth:`_load_own_state_dict`; :meth:`state_dict` nests the wrapped env's
    state under ``"env"``.
    """

    def __init__(self, env: VecEnv) -> None:
        if not isinstance(env, VecEnv):
            raise ConfigError(
                f"{type(self).__name__} wraps a phalanx VecEnv, got {type(env).__name__} ({env!r}). "
                "Build the env with phalanx.envs.make_env(...) or subclass phalanx.envs.VecEnv."
            )
        self.env = env
        self.num_envs = env.num_envs
        self.device = env.device
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.metadata = env.metadata
        self.render_mode = getattr(env, "render_mode", None)
        self.closed = False
        self._compiled_step: Any = None
        """``compiled(step_with_noise)`` after :meth:`compile`; None: the eager step."""

    # -- forwarding --------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if self._compiled_step is not None:
            result = self._compiled_step(actions, self.step_noise())
            self._unchecked_steps += 1
            if self._unchecked_steps >= self._check_every:
                self._unchecked_steps = 0
                self.check()
            return result
        # step_async + step_wait, without their plumbing (a tenth of a 4-env step)
        return self._transition(*self.env.step(self._action(actions)))

    # -- compiled stepping ---------------------------------------------------------------------------
    def step_noise(self) -> tuple[Tensor, ...]:
        """The wrapped env's draws (a wrapper draws nothing); none if this wrapper writes ``step``."""
        return () if self._overrides_step() else self.env.step_noise()

    def step_with_noise(
        self, actions: Tensor, noise: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The wrapped env's :meth:`step_with_noise` between this wrapper's hooks: the whole wrapped step,
        traceable as one graph when the wrapped env's is (see :attr:`traceable`)."""
        if self._overrides_step():
            return self.step(actions)
        return self._transition(*self.env.step_with_noise(self._action(actions), noise))

    @property
    def traceable(self) -> bool:  # type: ignore[override]
        """Whether :meth:`step_with_noise` traces as one graph: the wrapped env's does, and this wrapper
        works through the hooks (a wrapper that writes ``step`` itself is stepped eagerly)."""
        return not self._overrides_step() and self.env.traceable

    def compile(self) -> list[str]:
        """Switch :meth:`step` to one compiled graph of the whole wrapped step (fed by the eager
        :meth:`step_noise`), where :attr:`traceable`; idempotent. A :class:`NanGuard` in the chain records
        the first non-finite value on the device inside the graph; :meth:`step` raises it through
        :meth:`check` every ``check_every`` steps of that guard (every step by default)."""
        if not self.traceable:
            return []
        if self._compiled_step is None:
            guard = find_wrapper(self, NanGuard)
            self._check_every = guard.check_every if guard is not None else 1
            self._unchecked_steps = 0
            self._compiled_step = compiled(self.step_with_noise)
        return ["env step"]

    def check(self) -> None:
        self.env.check()

    def step_async(self, actions: Tensor) -> None:
        if self._overrides_step():
            VecEnv.step_async(self, actions)
        else:
            self.env.step_async(self._action(actions))

    def step_wait(self) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if self._overrides_step():
            return VecEnv.step_wait(self)
        return self._transition(*self.env.step_wait())

    def _overrides_step(self) -> bool:
        """True for a subclass that writes ``step`` itself instead of the hooks: it is then stepped
        through its own ``step`` (inside ``step_wait``), so that nothing it does is bypassed."""
        return type(self).step is not VecEnvWrapper.step

    def _action(self, actions: Tensor) -> Tensor:
        """The actions the wrapped env receives (identity here)."""
        return actions

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The step's results as the caller sees them (unchanged here)."""
        return obs, reward, terminated, truncated, info

    def render(self) -> Any:
        return self.env.render()

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.env.close(**kwargs)
            self.closed = True

    @property
    def unwrapped(self) -> VecEnv:  # type: ignore[override]
        """The innermost env of the wrapper chain."""
        return self.env.unwrapped

    @property
    def state(self) -> Tensor:
        """The wrapped env's physical state (built-in simulators only)."""
        try:
            return self.env.state  # type: ignore[attr-defined]
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__}: the wrapped env {self.unwrapped!r} has no `state` attribute "
                "(only the built-in batched simulators expose their physical state)."
            ) from None

    # -- checkpointable state ----------------------------------------------------------------------
    def _own_state_dict(self) -> dict[str, Any]:
        return {}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"env": self.env.state_dict(), **self._own_state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state["env"])
        self._load_own_state_dict({key: value for key, value in state.items() if key != "env"})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"


def find_wrapper(env: VecEnv, cls: type[W]) -> W | None:
    """The outermost wrapper of type ``cls`` in ``env``'s wrapper chain, or None.

    For a :class:`~phalanx.envs.core.ConcatVecEnv`, the chain of its first part (the parts of a
    double-buffered env are wrapped alike and share their statistics).
    """
    if isinstance(env, ConcatVecEnv):
        env = env.parts[0]
    while isinstance(env, VecEnvWrapper):
        if isinstance(env, cls):
            return env
        env = env.env
    return None


def _as_tensor(actions: Any, device: torch.device) -> Tensor:
    if isinstance(actions, torch.Tensor):
        return actions if actions.device == device else actions.to(device)
    return torch.as_tensor(np.asarray(actions), device=device)


# ------------------------------------------------------------------------------------------------------
class ActionMap(torch.nn.Module):
    """The one map from an agent's actions to an env's action space, for training (:class:`RescaleAction`),
    deployment (:class:`~phalanx.train.environments.EnvSpacePolicy`) and export alike.

    Agents act in a normalised space (:func:`agent_action_space`): ``[-1, 1]`` for a Box, mapped linearly to
    ``[low, high]`` (clipped first); ``{0, ..., n - 1}`` for a ``Discrete(n, start)`` and ``[0, nvec)`` for
    a ``MultiDiscrete(nvec, start)``, shifted by ``start``; any other space as it is. A module (its bounds
    and starts are buffers), so that it is part of an exported graph.
    """

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self.continuous = isinstance(space, gym.spaces.Box)
        self.integer = isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
        if self.continuous:
            if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
                raise ConfigError(
                    f"the action space {space} has infinite bounds: an agent acts in [-1, 1], which has no "
                    "image in an unbounded Box. Give the env's action space finite low and high."
                )
            self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))
        elif self.integer:
            self.register_buffer("start", torch.as_tensor(np.asarray(space.start), dtype=torch.int64))

    def forward(self, actions: Tensor) -> Tensor:
        if self.continuous:
            actions = actions.to(torch.float32).clamp(-1.0, 1.0)
            return self.low + (actions + 1.0) * 0.5 * (self.high - self.low)
        if self.integer:
            return actions.to(torch.int64) + self.start
        return actions


def agent_action_space(space: gym.Space) -> gym.Space:
    """The space an agent acts in for an env's action ``space`` (see :class:`ActionMap`)."""
    if isinstance(space, gym.spaces.Box):
        return gym.spaces.Box(-1.0, 1.0, shape=space.shape, dtype=np.float32)
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.Discrete(int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return gym.spaces.MultiDiscrete(np.asarray(space.nvec, dtype=np.int64))
    return space


def needs_action_map(space: gym.Space) -> bool:
    """Whether an agent's actions differ from ``space``'s: a Box, or an integer space away from 0."""
    if isinstance(space, gym.spaces.Box):
        return True
    return isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and bool(np.any(space.start))


class RescaleAction(VecEnvWrapper):
    """The agent acts in its normalised space (``[-1, 1]`` for a Box, from 0 for Discrete and
    MultiDiscrete); :class:`ActionMap` takes its actions into the env's action space.

    ``single_action_space`` becomes :func:`agent_action_space` of the env's.
    """

    def __init__(self, env: VecEnv) -> None:
        super().__init__(env)
        self.map = ActionMap(env.single_action_space).to(self.device)
        self.single_action_space = agent_action_space(env.single_action_space)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def _action(self, actions: Tensor) -> Tensor:
        return self.map(_as_tensor(actions, self.device))


# ------------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------------
_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)
_NAN_ARRAYS = ("actions", "obs", "reward", 'info["final_obs"]', "obs")  # code 4: obs from reset()


class NanGuard(VecEnvWrapper):
    """Raise a :class:`ContractError` at the first NaN or inf in actions, obs, reward or final_obs.

    On CPU every step is checked as it happens. On an accelerator a host synchronisation per step
    would stall the pipeline, so the first offence is recorded on the device without synchronising and
    read back every ``check_every`` steps (and by :meth:`check`). The actions are checked before the env
    sees them. :meth:`step_with_noise` (traced into a compiled graph) always records on the device, with
    the offence's step, array, sub-env index and value: whoever steps through it calls :meth:`check`
    afterwards (a compiled ``step`` does so every ``check_every`` steps). An eager step on an accelerator
    records the step and the array only: locating the sub-env and value took ~30 kernel launches per
    array and step, half of an eager PPO step's launches on a GPU; a CPU or compiled run locates them.
    """

    def __init__(self, env: VecEnv, check_every: int = 1) -> None:
        super().__init__(env)
        if not isinstance(check_every, int) or isinstance(check_every, bool) or check_every < 1:
            raise ConfigError(f"NanGuard: check_every must be an integer >= 1, got {check_every!r}.")
        self.check_every = check_every
        self.num_steps = 0
        self._sync_each_step = self.device.type == "cpu"
        # First offence (step, array code, sub-env index, value), kept on the device; step -1: none yet.
        self._record = torch.tensor([-1.0, 0.0, 0.0, 0.0], dtype=torch.float64, device=self.device)
        self._step = torch.zeros((), dtype=torch.float64, device=self.device)
        self._codes = torch.arange(len(_NAN_ARRAYS), dtype=torch.float64, device=self.device)
        self._clean = torch.ones((), dtype=torch.bool, device=self.device)  # nothing recorded yet
        self._unlocated = torch.tensor([-1.0, math.nan], dtype=torch.float64, device=self.device)
        self._flags: list[tuple[Tensor, int]] = []  # eager, on an accelerator: this step's (flag, code)
        self._code_lists: dict[tuple[int, ...], Tensor] = {}

    @staticmethod
    def _locate(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(any_bad, first bad row, first bad value of that row)`` as device scalars."""
        rows = x.reshape(x.shape[0], -1) if x.dim() > 0 else x.reshape(1, 1)
        bad = ~torch.isfinite(rows)  # (N, K)
        # the first bad element in row-major order, as a mask: element-wise ops and sums only (no
        # indexing by a computed index, which would need a host sync or a data-dependent shape)
        first = bad & (bad.cumsum(dim=1) == 1) & (bad.any(dim=1).cumsum(dim=0) == 1).unsqueeze(1)
        row_numbers = torch.arange(rows.shape[0], device=rows.device).unsqueeze(1)
        index = (first * row_numbers).sum()
        value = torch.where(first, rows, torch.zeros_like(rows)).sum()
        return bad.any(), index, value

    def _scan(self, x: Any, code: int) -> None:
        """Check ``x`` (array ``code``): at once on CPU, recorded on the device elsewhere."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return
        if not self._sync_each_step:  # NaN iff x holds a NaN or an inf: two kernels, no host sync
            self._flags.append(((x * 0).sum().isnan(), code))
            return
        # numpy's check of a small CPU array costs a third of torch's (two ops and a sync), on every
        # step of every array
        on_numpy = x.device.type == "cpu" and x.dtype in _NUMPY_FLOATS
        if on_numpy:  # (detach only where needed: an op per array and step)
            finite = np.isfinite((x.detach() if x.requires_grad else x).numpy()).all()
        else:
            finite = torch.isfinite(x).all()
        if bool(finite):
            return
        _, index, value = self._locate(x)
        self._record = torch.tensor([float(self.num_steps), float(code), float(index), float(value)])
        self.check()

    def _record_flags(self) -> None:
        """Record the step and the first array whose flag (:meth:`_scan`) is set, if none was recorded
        yet; the sub-env index and value stay unknown (-1, NaN). A few kernels a step, no host sync."""
        if not self._flags:
            return
        flags, codes = zip(*self._flags, strict=True)
        self._flags = []
        bad = torch.stack(flags)
        if codes not in self._code_lists:  # on the device once per layout (a list index would copy)
            self._code_lists[codes] = self._codes[list(codes)]
        code = self._code_lists[codes][bad.to(torch.uint8).argmax()]  # the first flagged array
        first = bad.any() & self._clean
        candidate = torch.cat([self._step.reshape(1), code.reshape(1), self._unlocated])
        self._record = torch.where(first, candidate, self._record)
        self._clean = self._clean & ~first

    def _record_first(self, x: Any, code: int) -> None:
        """Record the first non-finite value of ``x`` (array ``code``) on the device if none was yet:
        tensor operations only, no host synchronisation."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return
        any_bad, index, value = self._locate(x)
        candidate = torch.stack(
            [self._step, self._codes[code], index.to(torch.float64), value.to(torch.float64)]
        )
        first = any_bad & self._clean
        self._record = torch.where(first, candidate, self._record)
        self._clean = self._clean & ~first

    def check(self) -> None:
        """Raise if a non-finite value was recorded, here or in a guard it wraps (one host
        synchronisation)."""
        step, code, index, value = self._record.tolist()
        if step < 0:
            self.env.check()
            return
        env = self.unwrapped
        code = int(code)
        where = f"sub-env index {int(index)}, step {int(step)} (counted from the NanGuard's creation)"
        got = value
        if index < 0:  # recorded by an eager step on an accelerator (see the class docstring)
            got = "a NaN or an inf"
            where = (
                f"step {int(step)} (counted from the NanGuard's creation; an eager run on {self.device} "
                "does not locate the sub-env: --device cpu or --compile does)"
            )
        if code == 0:
            raise ContractError(
                f"NanGuard: the actions passed to {env!r}.step contain a non-finite value at {where}: "
                f"expected finite actions, got {got}. A NaN action usually means the policy diverged: "
                "lower the learning rate, enable gradient clipping (max_grad_norm), and check the "
                "losses for NaN."
            )
        source = "reset()" if code == 4 else "step()"
        raise ContractError(
            f"NanGuard: {env!r} produced a non-finite {_NAN_ARRAYS[code]} in {source} at {where}: expected "
            f"finite values, got {got}. Check the env's dynamics (divisions, exp/log, velocities without "
            "bounds) and the action bounds (wrap with RescaleAction or clip actions so the env never "
            "sees out-of-range actions)."
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._scan(obs, 4)
        self._record_flags()
        return obs, info

    def _action(self, actions: Tensor) -> Tensor:
        self.num_steps += 1
        self._step += 1
        self._scan(actions if isinstance(actions, torch.Tensor) else _as_tensor(actions, self.device), 0)
        return actions

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        self._scan(obs, 1)
        self._scan(reward, 2)
        self._scan(info.get("final_obs"), 3)
        self._record_flags()
        if not self._sync_each_step and self.num_steps % self.check_every == 0:
            self.check()
        return obs, reward, terminated, truncated, info

    def step_with_noise(
        self, actions: Tensor, noise: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The wrapped env's step with every array checked on the device (recorded, raised by
        :meth:`check`): traceable, no host synchronisation."""
        self._step += 1
        self._record_first(actions, 0)
        obs, reward, terminated, truncated, info = self.env.step_with_noise(actions, noise)
        self._record_first(obs, 1)
        self._record_first(reward, 2)
        self._record_first(info.get("final_obs"), 3)
        return obs, reward, terminated, truncated, info

    def _own_state_dict(self) -> dict[str, Any]:
        # the device count: steps taken through step_with_noise count too (one synchronisation)
        return {"num_steps": int(self._step.item())}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        self.num_steps = int(state["num_steps"])
        self._step.fill_(self.num_steps)


class MaskVelocity(VecEnvWrapper):
    """Observations with the entries ``indices`` (of a 1-D Box observation) set to zero, in the
    observations of ``reset`` and ``step`` and in ``info["final_obs"]``; the space keeps its shape.

    With the velocities masked, an observation no longer tells the state: the agent must infer the
    velocities from the observations before it, which a feed-forward policy cannot and a recurrent one
    can (RL Zoo's ``CartPoleNoVel-v1``, the memory task of recurrent PPO). One batched multiply on the
    device per step.
    """

    def __init__(self, env: VecEnv, indices: tuple[int, ...]) -> None:
        super().__init__(env)
        space = env.single_observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(
                f"MaskVelocity: the observation space of {env.unwrapped!r} is {space}, expected a 1-D Box "
                "(a vector per sub-env) whose entries can be masked."
            )
        size = space.shape[0]
        if not indices or any(not 0 <= index < size for index in indices):
            raise ConfigError(
                f"MaskVelocity: indices {indices} must be non-empty and in [0, {size}), the entries of the "
                f"observations of {env.unwrapped!r} ({space})."
            )
        self.indices = tuple(indices)
        mask = torch.ones(size, dtype=torch.float32, device=self.device)
        mask[list(self.indices)] = 0.0
        self.mask = mask
        low, high = space.low.copy(), space.high.copy()
        low[list(self.indices)] = 0.0
        high[list(self.indices)] = 0.0
        self.single_observation_space = gym.spaces.Box(low, high, dtype=space.dtype)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return obs * self.mask, info

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        info = dict(info)
        if "final_obs" in info:
            info["final_obs"] = info["final_obs"] * self.mask
        return obs * self.mask, reward, terminated, truncated, info


# ------------------------------------------------------------------------------------------------------
class FrameStack(VecEnvWrapper):
    """The last ``num_frames`` observations of every sub-env as one observation, kept on the device.

    Where the frames are stacked: a 1-D or 2-D observation (a vector, a grey ``(H, W)`` image, Atari's
    84x84 frames) gains a leading axis, ``(num_frames, *shape)``; an image ``(C, H, W)`` or
    ``(H, W, C)`` is stacked along its channels (``(num_frames * C, H, W)``, or ``(H, W, num_frames *
    C)`` for channels last, as ``phalanx.nets.image_layout`` reads it), oldest frame first. The dtype
    stays (uint8 frames stay uint8). An episode's first stack repeats its first observation (Gymnasium's
    FrameStackObservation with ``padding_type="reset"``, EnvPool, and CleanRL's Atari stacks do the
    same). Same-step autoreset: ``info["final_obs"]`` is the stack ending with the finished episode's
    last observation, and the ended rows start their next stack from the reset observation. Every step
    builds new tensors, so returned observations are never modified later (a buffer may keep them).

    The stacks are tensor operations only, traceable with the wrapped step. :meth:`state_dict` holds them
    for an exact resume.
    """

    def __init__(self, env: VecEnv, num_frames: int = 4) -> None:
        super().__init__(env)
        if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
            raise ConfigError(f"FrameStack: num_frames must be an integer >= 1, got {num_frames!r}.")
        space = env.single_observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ConfigError(
                f"FrameStack: the observation space of {env.unwrapped!r} is {space}, expected a Box (vectors "
                "or images). Stack Dict observations part by part in a Gymnasium wrapper instead."
            )
        self.num_frames = num_frames
        shape = tuple(space.shape)
        if len(shape) == 3:  # an image: stack along the channels
            channels_last = shape[-1] <= 4 < shape[0]
            self.axis = 2 if channels_last else 0
            self.frame_shape = shape
        else:  # a new leading axis of size 1 per frame
            self.axis = 0
            self.frame_shape = (1, *shape)
        low = np.concatenate([space.low.reshape(self.frame_shape)] * num_frames, axis=self.axis)
        high = np.concatenate([space.high.reshape(self.frame_shape)] * num_frames, axis=self.axis)
        self.single_observation_space = gym.spaces.Box(low, high, dtype=space.dtype)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.width = self.frame_shape[self.axis]
        """The size of one frame along the stacking axis."""
        self.frames = torch.zeros(
            (self.num_envs, *self.single_observation_space.shape),
            dtype=_torch_dtype(space.dtype),
            device=self.device,
        )
        """The current stack of every sub-env, ``(num_envs, *single_observation_space.shape)``."""

    def _as_frames(self, obs: Tensor) -> Tensor:
        """A batch of observations as frames of the stack, ``(N, *frame_shape)``."""
        return obs.reshape(obs.shape[0], *self.frame_shape)

    def _first_stack(self, obs: Tensor) -> Tensor:
        """The stack of an episode's first observation: that observation, ``num_frames`` times (a
        broadcast view where the frames have their own axis)."""
        frames = self._as_frames(obs)
        if self.width == 1:
            return frames.expand(self.frames.shape)
        repeats = [1] * (len(self.frame_shape) + 1)
        repeats[self.axis + 1] = self.num_frames
        return frames.repeat(*repeats)

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.frames = self._first_stack(obs).contiguous()
        return self.frames, info

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        axis = self.axis + 1
        kept = self.frames.narrow(axis, self.width, self.width * (self.num_frames - 1))
        final = torch.cat([kept, self._as_frames(info["final_obs"])], dim=axis)  # the true next stacks
        done = (terminated | truncated).view(-1, *[1] * (final.dim() - 1))
        self.frames = torch.where(done, self._first_stack(obs), final)
        return self.frames, reward, terminated, truncated, {**info, "final_obs": final}

    def _own_state_dict(self) -> dict[str, Any]:
        return {"frames": self.frames.clone()}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        frames = torch.as_tensor(state["frames"])
        if frames.shape != self.frames.shape:
            raise ConfigError(
                f"FrameStack.load_state_dict: the stacks have shape {tuple(frames.shape)}, expected "
                f"{tuple(self.frames.shape)} (num_envs={self.num_envs}, {self.num_frames} frames of "
                f"{self.env.single_observation_space}). Load the state of the same env and num_envs."
            )
        self.frames = frames.to(self.device, self.frames.dtype).clone()

    def __repr__(self) -> str:
        return f"FrameStack({self.env!r}, num_frames={self.num_frames})"


def _torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (``np.uint8`` -> ``torch.uint8``)."""
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
