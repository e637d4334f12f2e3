"""The spaces a phalanx environment presents, and the arrays they give.

A simulator's spaces become tensor spaces (:func:`tensor_space`): what the learner, the networks and the
buffers read. The helpers here give the dtype and shape of the observation tensors of such a space, a
Dict observation as its flat float32 vector, a batch of actions' shape and dtype, and the error that
names an unsupported space. Every adapter (Gymnasium, worker processes, EnvPool, JAX) shares them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.errors import EnvError


def tensor_space(space: gym.Space, role: str) -> gym.Space | None:
    """The space a phalanx adapter presents for a simulator's ``space`` (``role``: observation or action).

    Observations: a uint8 Box stays a uint8 Box (images: one byte a pixel on the device and in buffers;
    the networks scale them); any other Box becomes a float32 Box with the same bounds; a ``Discrete(n)``
    becomes the float32 one-hot ``Box(0, 1, (n,))`` (an index fed as a number would order the states
    meaninglessly); a ``Dict`` of Box, Discrete and MultiBinary parts is presented as that Dict space,
    while its observation tensors are the float32 vectors of ``gymnasium.spaces.flatten`` (the parts by
    sorted key, Discrete parts one-hot; see :func:`flat_observation`). Actions: a Discrete space stays
    Discrete, a Box becomes float32, a one-dimensional ``MultiDiscrete`` stays one (int64 actions
    ``(N, k)``); integer spaces keep their ``start`` (the agent's actions are shifted into them by
    :class:`~phalanx.envs.wrappers.RescaleAction`). Anything else is unsupported: None, for the adapter
    to explain (:func:`unsupported_space`).
    """
    if isinstance(space, gym.spaces.Box):
        if role == "observation" and space.dtype == np.uint8:
            return gym.spaces.Box(space.low, space.high, shape=space.shape, dtype=np.uint8)
        return gym.spaces.Box(
            space.low.astype(np.float32), space.high.astype(np.float32), shape=space.shape, dtype=np.float32
        )
    if isinstance(space, gym.spaces.Discrete):
        if role == "observation":
            return gym.spaces.Box(0.0, 1.0, shape=(int(space.n),), dtype=np.float32)
        return gym.spaces.Discrete(int(space.n), start=int(space.start))
    if isinstance(space, gym.spaces.Dict) and role == "observation":
        if all(isinstance(part, DICT_PARTS) for part in space.spaces.values()):
            return space
        return None
    if isinstance(space, gym.spaces.MultiDiscrete) and role == "action" and len(space.nvec.shape) == 1:
        return gym.spaces.MultiDiscrete(space.nvec.astype(np.int64), start=np.asarray(space.start, np.int64))
    return None


DICT_PARTS = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary)
"""The parts a Dict observation space may have (what the networks' Dict encoder reads)."""

SUPPORTED_SPACES = {
    "observation": "Box (uint8 stays uint8, others become float32), Discrete (one-hot) and Dict (of Box, "
    "Discrete and MultiBinary parts, flattened)",
    "action": "Discrete, Box and one-dimensional MultiDiscrete",
}
"""The spaces :func:`tensor_space` supports, per role, for error messages."""


def unsupported_space(space: gym.Space, role: str, simulator: str, fix: str) -> EnvError:
    """The error for a ``role`` space of ``simulator`` that :func:`tensor_space` does not support: the
    space, its offending Dict part if that is what is wrong, what is supported, and ``fix``."""
    problem = f"{simulator} has {role} space {space}"
    if isinstance(space, gym.spaces.Dict) and role == "observation":
        parts = [
            f"{key!r} ({part})" for key, part in space.spaces.items() if not isinstance(part, DICT_PARTS)
        ]
        plural = "s" if len(parts) > 1 else ""
        problem += f", whose part{plural} {', '.join(parts)} cannot be flattened for the networks"
    return EnvError(f"{problem}; phalanx supports {role} spaces {SUPPORTED_SPACES[role]}. {fix}")


def supported_tensor_space(space: gym.Space, role: str, simulator: str, fix: str) -> gym.Space:
    """:func:`tensor_space`, or an :class:`EnvError` saying that ``simulator`` has an unsupported ``role``
    space (``fix``: what the user can do instead)."""
    converted = tensor_space(space, role)
    if converted is None:
        raise unsupported_space(space, role, simulator, fix)
    return converted


def observation_dtype(space: gym.Space) -> np.dtype:
    """The numpy dtype of the observation arrays of a :func:`tensor_space` observation space: uint8 for
    a uint8 Box, float32 otherwise (Dict observations are flat float32 vectors)."""
    if isinstance(space, gym.spaces.Box) and space.dtype == np.uint8:
        return np.dtype(np.uint8)
    return np.dtype(np.float32)


def observation_shape(space: gym.Space) -> tuple[int, ...]:
    """The shape of one observation tensor of a :func:`tensor_space` observation space (a Dict's:
    ``(flatdim,)``)."""
    if isinstance(space, gym.spaces.Dict):
        return (int(gym.spaces.flatdim(space)),)
    assert space.shape is not None, f"a tensor space has a shape: {space}"
    return tuple(space.shape)


def flat_observation(space: gym.spaces.Dict, observation: Any) -> np.ndarray:
    """One Dict observation as the float32 vector the VecEnv contract hands out (``gymnasium.spaces.
    flatten``: parts by sorted key, Discrete parts one-hot, each part flattened)."""
    return np.asarray(gym.spaces.flatten(space, observation), dtype=np.float32)


def action_layout(
    space: gym.Space, num_envs: int, integer_dtype: torch.dtype
) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of a batch of ``num_envs`` actions of ``space``: ``(num_envs,)`` of
    ``integer_dtype`` for a Discrete space, ``(num_envs, k)`` of ``integer_dtype`` for a
    ``MultiDiscrete`` of k columns, ``(num_envs, *space.shape)`` float32 otherwise."""
    if isinstance(space, gym.spaces.Discrete):
        return (num_envs,), integer_dtype
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (num_envs, *space.shape), integer_dtype
    assert space.shape is not None, f"an action space has a shape: {space}"
    return (num_envs, *space.shape), torch.float32
