"""What one step of one sub-env puts in a buffer: :class:`StepLayout`, the shapes and dtypes every rollout
and replay buffer is built from, given or read from an env's spaces (:meth:`StepLayout.of`)."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from phalanx.nets import observation_shape

Device = str | torch.device
"""A device as the buffers take it: a torch.device or its name."""


def storage_dtype(space: gym.Space) -> torch.dtype:
    """The dtype buffers store observations of ``space`` in: the space's own (uint8 images stay uint8, one
    byte a pixel; bool and integer observations as they come), float32 for a Dict (the VecEnv presents its
    observations as flat float32 vectors) and for a space without a dtype."""
    if isinstance(space, gym.spaces.Dict) or space.dtype is None:
        return torch.float32
    return torch.from_numpy(np.empty(0, dtype=space.dtype)).dtype


def action_storage(action_space: gym.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """How a buffer stores actions of ``action_space``: their shape, and int64 (discrete) or float32."""
    integer_actions = isinstance(action_space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
    assert action_space.shape is not None, f"an action space has a shape: {action_space}"
    return action_space.shape, torch.int64 if integer_actions else torch.float32


@dataclass(frozen=True)
class StepLayout:
    """The observation and the action of one sub-env's step as a buffer stores them: one value for the
    four that every buffer, its ``memory`` and the replay choice would otherwise each take."""

    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    action_shape: tuple[int, ...]
    action_dtype: torch.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "obs_shape", tuple(self.obs_shape))
        object.__setattr__(self, "action_shape", tuple(self.action_shape))

    @classmethod
    def of(cls, observation_space: gym.Space, action_space: gym.Space) -> StepLayout:
        """The layout of an env's single observation and action spaces: observations in
        :func:`storage_dtype` (a Dict's as its flat vector), actions as :func:`action_storage` says."""
        return cls(
            observation_shape(observation_space),
            storage_dtype(observation_space),
            *action_storage(action_space),
        )
