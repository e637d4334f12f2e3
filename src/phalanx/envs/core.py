"""The VecEnv contract: batched environments whose arrays are torch tensors on one device.

Every environment the learner sees is a :class:`VecEnv`. The contract (docs/architecture.md has it too,
under "The VecEnv contract"):

- ``reset(seed=None, options=None) -> (obs, info)`` with ``obs`` of shape ``(num_envs, *obs_shape)``,
  float32 (uint8 for a uint8 observation space: images), on ``device``.
- ``step(actions) -> (obs, reward, terminated, truncated, info)``; ``reward`` float32 ``(num_envs,)``,
  ``terminated``/``truncated`` bool ``(num_envs,)``, all on ``device``.
- Same-step autoreset: a sub-env whose episode ends is reset inside ``step``. Its ``obs`` row is the
  first observation of the next episode; ``info["final_obs"]`` is the *true next observation of every
  row*: the last observation of the finished episode where ``terminated | truncated``, and equal to
  ``obs`` elsewhere. ``info["_final_obs"]`` is the boolean mask of rows that ended.
- ``info["episode_return"]`` and ``info["episode_length"]`` are ``(num_envs,)`` tensors, valid where
  an episode ended (the same mask), or where ``info["_episode_return"]`` says if the env sets it: an
  env whose learning episodes are parts of a longer one (Atari with episodic life: ``terminated`` at
  every life lost) reports the statistics of the whole (the game score) where that ends
  (:func:`episode_ends`).

:class:`BatchedVecEnv` implements all of the bookkeeping (autoreset, time limit, episode statistics,
seeding, checkpointable state) so that a simulator only writes its physics in three methods.

Where each part lives (every name is importable from here too):

- :mod:`phalanx.envs.base`: :class:`VecEnv`, the base class, :class:`ConcatVecEnv` and :func:`as_device`;
- :mod:`phalanx.envs.batched`: :class:`BatchedVecEnv` and :class:`BatchedBookkeeping`, :func:`block_seeds`;
- :mod:`phalanx.envs.spaces`: :func:`tensor_space` and the observation and action layouts of a space;
- :mod:`phalanx.envs.episodes`: :class:`EpisodeStatistics`, :func:`step_info`, :func:`episode_ends`.
"""

from __future__ import annotations

from phalanx.envs.base import ConcatVecEnv, Tensor, VecEnv, as_device
from phalanx.envs.batched import BatchedBookkeeping, BatchedVecEnv, PerRow, block_seeds
from phalanx.envs.episodes import (
    EpisodeStatistics,
    StatisticsCheckpoint,
    concat_transitions,
    episode_ends,
    step_info,
)
from phalanx.envs.spaces import (
    DICT_PARTS,
    SUPPORTED_SPACES,
    action_layout,
    flat_observation,
    observation_dtype,
    observation_shape,
    supported_tensor_space,
    tensor_space,
    unsupported_space,
)

__all__ = [
    "DICT_PARTS",
    "SUPPORTED_SPACES",
    "BatchedBookkeeping",
    "BatchedVecEnv",
    "ConcatVecEnv",
    "EpisodeStatistics",
    "PerRow",
    "StatisticsCheckpoint",
    "Tensor",
    "VecEnv",
    "action_layout",
    "as_device",
    "block_seeds",
    "concat_transitions",
    "episode_ends",
    "flat_observation",
    "observation_dtype",
    "observation_shape",
    "step_info",
    "supported_tensor_space",
    "tensor_space",
    "unsupported_space",
]
