"""Storage on the training device: on-policy rollouts with GAE, and the off-policy replay buffers.

Everything stays on one device as preallocated tensors: writing a step is a few ``copy_`` calls and
computing advantages is a short loop of elementwise kernels, with no host synchronisation.

- :mod:`~phalanx.buffers.rollout`: :class:`RolloutBuffer`, :func:`compute_gae`, :func:`compute_gae_scan`;
- :mod:`~phalanx.buffers.replay`: :class:`ReplayRing` (the base of both replays), :class:`ReplayBuffer`,
  n-step sampling (:class:`NStepWindow`, :class:`ReplayBatch`);
- :mod:`~phalanx.buffers.compact`: :class:`CompactReplayBuffer`, for images;
- :mod:`~phalanx.buffers.layout`: what one step of one sub-env stores (:class:`StepLayout`), in which dtype
  (:func:`storage_dtype`);
- :mod:`~phalanx.buffers.choice`: which replay a space gets;
- :mod:`~phalanx.buffers.memory`: what a replay takes, and the error before one that does not fit.
"""

from __future__ import annotations

from phalanx.buffers.choice import ReplayChoice, replay_choice
from phalanx.buffers.compact import WORDS, CompactReplayBuffer
from phalanx.buffers.layout import Device, StepLayout, action_storage, storage_dtype
from phalanx.buffers.memory import ReplayMemory, check_memory, replay_layout, transition_bytes
from phalanx.buffers.replay import NStepWindow, ReplayBatch, ReplayBuffer, ReplayRing, load_fields
from phalanx.buffers.rollout import SCAN_MAX_ENVS, RolloutBuffer, compute_gae, compute_gae_scan

__all__ = [
    "SCAN_MAX_ENVS",
    "WORDS",
    "CompactReplayBuffer",
    "Device",
    "NStepWindow",
    "ReplayBatch",
    "ReplayChoice",
    "ReplayBuffer",
    "ReplayMemory",
    "ReplayRing",
    "RolloutBuffer",
    "StepLayout",
    "action_storage",
    "check_memory",
    "compute_gae",
    "compute_gae_scan",
    "load_fields",
    "replay_choice",
    "replay_layout",
    "storage_dtype",
    "transition_bytes",
]
