"""Observation and action spaces as the networks read them: which kind of observation a space holds
(flat, image, Dict), an image's layout, the size of a flat observation, a MultiDiscrete's dims.
"""

from __future__ import annotations

from typing import TypeGuard

import gymnasium as gym
import numpy as np

from phalanx.envs.core import observation_shape
from phalanx.errors import ConfigError

__all__ = [
    "SUPPORTED_SPACES",
    "image_layout",
    "is_image_space",
    "multi_discrete_sizes",
    "obs_dim",
    "observation_kind",
    "observation_shape",
]

SUPPORTED_SPACES = "observations: a 1-D Box; actions: Discrete, MultiDiscrete or Box"


def is_image_space(space: gym.Space) -> TypeGuard[gym.spaces.Box]:
    """Whether ``space`` holds images: a Box of rank 3, channels first ``(C, H, W)`` or last ``(H, W, C)``
    with C in 1..4, or a rank-2 ``(H, W)`` Box of uint8 (one grey channel)."""
    if not isinstance(space, gym.spaces.Box):
        return False
    shape = space.shape
    return len(shape) == 3 or (len(shape) == 2 and space.dtype == np.uint8)


def image_layout(space: gym.spaces.Box) -> tuple[tuple[int, int, int], bool]:
    """``((C, H, W), channels_last)`` of an image space (see :func:`is_image_space`)."""
    shape = tuple(int(size) for size in space.shape)
    if len(shape) == 2:
        return (1, *shape), False  # (H, W): one channel, added by the encoder
    if shape[-1] <= 4 < shape[0]:  # (H, W, C), as Gymnasium renders and ALE gives without preprocessing
        return (shape[2], shape[0], shape[1]), True
    return (shape[0], shape[1], shape[2]), False


def observation_kind(space: gym.Space) -> str | None:
    """What an algorithm must read to learn from ``space``: "flat" (a 1-D Box), "image"
    (:func:`is_image_space`), "dict" (a Dict, its parts checked by :class:`DictEncoder`), or None (a
    space no phalanx network reads)."""
    if isinstance(space, gym.spaces.Dict):
        return "dict"
    if is_image_space(space):
        return "image"
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return "flat"
    return None


def obs_dim(space: gym.Space) -> int:
    """Size of a flat (1-D Box) observation space; a ConfigError for any other space."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ConfigError(
            f"unsupported observation space {space}: the MLP networks need a 1-D Box observation space "
            f"(supported: {SUPPORTED_SPACES}). Flatten the observations with a wrapper first."
        )
    return int(space.shape[0])


def multi_discrete_sizes(action_space: gym.spaces.MultiDiscrete) -> tuple[int, ...]:
    """``nvec`` of a MultiDiscrete action space as a policy reads it; a ConfigError where it is not a
    flat vector of dims starting at 0."""
    if action_space.nvec.ndim != 1:
        raise ConfigError(
            f"unsupported action space {action_space}: a MultiDiscrete action space must be a vector of "
            f"dims (nvec of shape (k,)), but nvec has shape {action_space.nvec.shape}. Flatten it with an "
            "action wrapper (gymnasium.spaces.MultiDiscrete(nvec.flatten()))."
        )
    if np.any(action_space.start != 0):  # RescaleAction presents every integer space from 0
        raise ConfigError(
            f"unsupported action space {action_space}: a policy acts from 0 (start="
            f"{action_space.start.tolist()}); build the env with phalanx's wrappers (RescaleAction)."
        )
    return tuple(int(size) for size in action_space.nvec)
