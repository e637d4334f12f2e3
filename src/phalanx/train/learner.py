"""Learner: owns the algorithm and its training data, and turns data into updates."""

from __future__ import annotations

from typing import Any

import torch

from phalanx.algos.base import Algorithm


class Learner:
    """One learner on one device. ``update`` consumes what the worker collected into ``buffer``.

    The data-parallel group (several learners with gradient all-reduce) of a later issue lives here.
    """

    def __init__(self, algorithm: Algorithm, buffer: Any) -> None:
        self.algorithm = algorithm
        self.buffer = buffer
        self.updates = 0

    def update(self, progress: float) -> dict[str, torch.Tensor]:
        metrics = self.algorithm.update(self.buffer, progress)
        self.updates += 1
        return metrics
