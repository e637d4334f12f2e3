"""Which replay buffer an observation space gets.

:func:`replay_choice` is the one table (images: :class:`CompactReplayBuffer`, else :class:`ReplayBuffer`)
that both :func:`make_replay_buffer` (build it) and :func:`replay_memory` (what it would take) read.
"""

from __future__ import annotations

import gymnasium as gym
import torch

from phalanx.buffers.compact import CompactReplayBuffer
from phalanx.buffers.layout import StepLayout
from phalanx.buffers.memory import ReplayMemory
from phalanx.buffers.replay import ReplayBuffer
from phalanx.errors import ConfigError
from phalanx.nets import is_image_space


def make_replay_buffer(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_space: gym.Space,
    device: str | torch.device,
    stacked_frames: int = 1,
) -> ReplayBuffer | CompactReplayBuffer:
    """The replay buffer for an env's single observation and action spaces: a :class:`CompactReplayBuffer`
    for images (each observation stored once; with ``stacked_frames = k > 1``, each of the k frames stacked
    along their first axis once), else a :class:`ReplayBuffer`; observations in the space's dtype."""
    buffer_class, arguments = replay_choice(
        capacity, num_envs, observation_space, action_space, device, stacked_frames
    )
    return buffer_class(*arguments)


def replay_memory(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_space: gym.Space,
    device: str | torch.device,
    stacked_frames: int = 1,
) -> ReplayMemory:
    """What the buffer :func:`make_replay_buffer` builds from the same arguments takes, without allocating
    it (a population checks that the buffers its members hold at once fit together)."""
    buffer_class, arguments = replay_choice(
        capacity, num_envs, observation_space, action_space, device, stacked_frames
    )
    return buffer_class.memory(*arguments)


def replay_choice(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_space: gym.Space,
    device: str | torch.device,
    stacked_frames: int,
) -> tuple[type[ReplayBuffer] | type[CompactReplayBuffer], tuple]:
    """The buffer class for observations of ``observation_space`` and the arguments its constructor and
    its ``memory`` take (the same, in the same order): ``(capacity, num_envs, layout, device, ...)``."""
    arguments = (capacity, num_envs, StepLayout.of(observation_space, action_space), device)
    if is_image_space(observation_space):
        return CompactReplayBuffer, (*arguments, stacked_frames)
    if stacked_frames != 1:
        raise ConfigError(
            f"stacked_frames = {stacked_frames} shares the frames of image observations, but the "
            f"observation space {observation_space} is not an image space. Use stacked_frames = 1."
        )
    return ReplayBuffer, arguments
