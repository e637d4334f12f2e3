"""Learner: owns the algorithm and its training data, and turns data into updates."""

from __future__ import annotations

import torch

from phalanx.algos.base import Algorithm
from phalanx.buffers import ReplayBuffer, RolloutBuffer


class Learner:
    """One learner on one device.

    On-policy, ``update`` learns from the rollout the worker just wrote into ``buffer``; off-policy,
    each ``update`` samples a batch from the replay buffer. The data-parallel group (several
    learners with gradient all-reduce) of a later issue lives here.
    """

    def __init__(self, algorithm: Algorithm, buffer: RolloutBuffer | ReplayBuffer) -> None:
        self.algorithm = algorithm
        self.buffer = buffer
        self.updates = 0

    def update(self, progress: float) -> dict[str, torch.Tensor]:
        if isinstance(self.buffer, ReplayBuffer):
            config = self.algorithm.config
            batch = self.buffer.sample(config.batch_size, config.gamma, config.n_step)
            metrics = self.algorithm.update(batch, progress)
        else:
            metrics = self.algorithm.update(self.buffer, progress)
        self.updates += 1
        return metrics
