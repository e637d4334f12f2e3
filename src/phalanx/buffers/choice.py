"""Which replay buffer an observation space gets, and the dtype buffers store its observations in.

:func:`replay_choice` is the one table (images: :class:`CompactReplayBuffer`, else :class:`ReplayBuffer`)
that both :func:`make_replay_buffer` (build it) and :func:`replay_memory` (what it would take) read.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch

from phalanx.buffers.compact import CompactReplayBuffer
from phalanx.buffers.memory import ReplayMemory
from phalanx.buffers.replay import ReplayBuffer
from phalanx.errors import ConfigError
from phalanx.nets import is_image_space


def storage_dtype(space: gym.Space) -> torch.dtype:
    """The dtype buffers store observations of ``space`` in: the space's own (uint8 images stay uint8, one
    byte a pixel; bool and integer observations as they come), float32 for a Dict (the VecEnv presents its
    observations as flat float32 vectors) and for a space without a dtype."""
    if isinstance(space, gym.spaces.Dict) or space.dtype is None:
        return torch.float32
    return torch.from_numpy(np.empty(0, dtype=space.dtype)).dtype


def make_replay_buffer(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_shape: Sequence[int],
    action_dtype: torch.dtype,
    device: str | torch.device,
    stacked_frames: int = 1,
) -> ReplayBuffer | CompactReplayBuffer:
    """The replay buffer for observations of ``observation_space``: a :class:`CompactReplayBuffer` for
    images (each observation stored once; with ``stacked_frames = k > 1``, each of the k frames stacked
    along their first axis once), else a :class:`ReplayBuffer`; observations in the space's dtype."""
    buffer_class, arguments = replay_choice(
        capacity, num_envs, observation_space, action_shape, action_dtype, device, stacked_frames
    )
    return buffer_class(*arguments)


def replay_memory(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_shape: Sequence[int],
    action_dtype: torch.dtype,
    device: str | torch.device,
    stacked_frames: int = 1,
) -> ReplayMemory:
    """What the buffer :func:`make_replay_buffer` builds from the same arguments takes, without allocating
    it (a population checks that the buffers its members hold at once fit together)."""
    buffer_class, arguments = replay_choice(
        capacity, num_envs, observation_space, action_shape, action_dtype, device, stacked_frames
    )
    return buffer_class.memory(*arguments)


def replay_choice(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_shape: Sequence[int],
    action_dtype: torch.dtype,
    device: str | torch.device,
    stacked_frames: int,
) -> tuple[type[ReplayBuffer] | type[CompactReplayBuffer], tuple]:
    """The buffer class for observations of ``observation_space`` and the arguments its constructor and
    its ``memory`` take (the same, in the same order)."""
    obs_dtype = storage_dtype(observation_space)
    obs_shape = tuple(observation_space.shape)
    arguments = (capacity, num_envs, obs_shape, action_shape, action_dtype, device, obs_dtype)
    if is_image_space(observation_space):
        return CompactReplayBuffer, (*arguments, stacked_frames)
    if stacked_frames != 1:
        raise ConfigError(
            f"stacked_frames = {stacked_frames} shares the frames of image observations, but the "
            f"observation space {observation_space} is not an image space. Use stacked_frames = 1."
        )
    return ReplayBuffer, arguments
