"""Which replay buffer an observation space gets: :func:`replay_choice`, the one table (images:
:class:`CompactReplayBuffer`, else :class:`ReplayBuffer`) that both building a replay and saying what it
would take read.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from phalanx.buffers.compact import CompactReplayBuffer
from phalanx.buffers.layout import Device, StepLayout
from phalanx.buffers.memory import ReplayMemory
from phalanx.buffers.replay import ReplayBuffer
from phalanx.errors import ConfigError
from phalanx.nets import is_image_space


@dataclass(frozen=True)
class ReplayChoice:
    """A replay buffer class and the arguments its constructor and its ``memory`` both take: build the
    buffer, or say what it would take without allocating it (a population checks that the buffers its
    members hold at once fit together)."""

    buffer_class: type[ReplayBuffer] | type[CompactReplayBuffer]
    arguments: tuple

    def build(self) -> ReplayBuffer | CompactReplayBuffer:
        return self.buffer_class(*self.arguments)

    def memory(self) -> ReplayMemory:
        return self.buffer_class.memory(*self.arguments)


def replay_choice(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_space: gym.Space,
    device: Device,
    stacked_frames: int = 1,
) -> ReplayChoice:
    """The replay buffer for an env's single observation and action spaces: a :class:`CompactReplayBuffer`
    for images (each observation stored once; with ``stacked_frames = k > 1``, each of the k frames stacked
    along their first axis once), else a :class:`ReplayBuffer`; observations in the space's dtype."""
    arguments = (capacity, num_envs, StepLayout.of(observation_space, action_space), device)
    if is_image_space(observation_space):
        return ReplayChoice(CompactReplayBuffer, (*arguments, stacked_frames))
    if stacked_frames != 1:
        raise ConfigError(
            f"stacked_frames = {stacked_frames} shares the frames of image observations, but the "
            f"observation space {observation_space} is not an image space. Use stacked_frames = 1."
        )
    return ReplayChoice(ReplayBuffer, arguments)
