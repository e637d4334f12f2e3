"""Agents act in a normalised action space; :class:`ActionMap` takes their actions into the env's.

:class:`ActionMap` is the one map, shared by training (the :class:`RescaleAction` wrapper), deployed and
exported policies: a Box becomes ``[-1, 1]``, a Discrete or MultiDiscrete space starts at 0
(:func:`agent_action_space`).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space

from phalanx.envs.core import Tensor, VecEnv
from phalanx.envs.wrapper_base import VecEnvWrapper, as_device_tensor
from phalanx.errors import ConfigError

__all__ = ["ActionMap", "RescaleAction", "agent_action_space", "needs_action_map"]


class ActionMap(torch.nn.Module):
    """The one map from an agent's actions to an env's action space, for training (:class:`RescaleAction`),
    deployment (:class:`~phalanx.train.environments.EnvSpacePolicy`) and export alike.

    Agents act in a normalised space (:func:`agent_action_space`): ``[-1, 1]`` for a Box, mapped linearly to
    ``[low, high]`` (clipped first); ``{0, ..., n - 1}`` for a ``Discrete(n, start)`` and ``[0, nvec)`` for
    a ``MultiDiscrete(nvec, start)``, shifted by ``start``; any other space as it is. A module (its bounds
    and starts are buffers), so that it is part of an exported graph.
    """

    low: Tensor  # buffers: low and high of a Box, start of a Discrete or MultiDiscrete
    high: Tensor
    start: Tensor

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self.continuous = isinstance(space, gym.spaces.Box)
        self.integer = isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
        if isinstance(space, gym.spaces.Box):  # self.continuous
            if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
                raise ConfigError(
                    f"the action space {space} has infinite bounds: an agent acts in [-1, 1], which has no "
                    "image in an unbounded Box. Give the env's action space finite low and high."
                )
            self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))
        elif isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):  # self.integer
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
        return self.map(as_device_tensor(actions, self.device))
