"""Entry points for learner processes in tests/test_learners.py (spawned learners import them)."""

from __future__ import annotations

from typing import Any

import torch

from phalanx.config import TrainConfig
from phalanx.envs.wrappers import RunningMeanStd
from phalanx.train.learner import LearnerGroup, StatisticsSync
from phalanx.train.trainer import Trainer


def parameters_after_training(group: LearnerGroup, payload: dict[str, Any], report) -> None:
    """Train ``payload["config"]`` as one learner; learner 0 reports every learner's parameters (and the
    first observations in each learner's buffer, to show that the shards differ)."""
    config = TrainConfig.from_dict(payload["config"])
    trainer = Trainer(config, show_progress=False, group=group)
    try:
        initial = _flat_parameters(trainer)
        trainer.train()
        final = _flat_parameters(trainer)
        observations = trainer.buffer.obs.reshape(-1)[:32].clone()
        gathered = group.gather((initial, final, observations, trainer.learner.updates, trainer.steps))
    finally:
        trainer.close()
    if group.is_main:
        report("finished", gathered)


def _flat_parameters(trainer: Trainer) -> torch.Tensor:
    state = trainer.algorithm.state_dict()
    tensors = [
        value.reshape(-1).float()
        for key in sorted(state)
        if isinstance(state[key], dict) and "optimizer" not in key
        for value in state[key].values()
        if isinstance(value, torch.Tensor)
    ]
    return torch.cat(tensors)


def merged_statistics(group: LearnerGroup, payload: dict[str, Any], report) -> None:
    """Each learner absorbs its own batches; after every sync learner 0 reports what each holds."""
    statistics = RunningMeanStd((3,))
    sync = StatisticsSync(group, statistics)
    generator = torch.Generator().manual_seed(group.rank)
    seen = []
    for round_ in range(3):
        batch = torch.randn(5 + round_ + group.rank, 3, generator=generator) * (1 + group.rank) + group.rank
        statistics.update(batch)
        seen.append(batch)
        sync()
    everything = group.gather(torch.cat(seen))
    held = group.gather((statistics.count, statistics.mean, statistics.var))
    if group.is_main:
        report("finished", (torch.cat(everything), held))
