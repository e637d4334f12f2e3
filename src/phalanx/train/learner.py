"""Learner: owns the algorithm and its training data, and turns data into updates; several learners
share the work of one agent as a data-parallel group.

With ``num_learners = N > 1`` there are N processes in a ``torch.distributed`` group (gloo on CPU, NCCL
on CUDA). Each runs the whole training loop on its own env shard and buffer; every optimiser step
first averages the gradients over the group (:meth:`LearnerGroup.average`, one all-reduce of the
flattened gradients), so every learner applies the same step to the same parameters and they stay
identical, bit for bit. Learner 0 (rank 0) evaluates, logs and checkpoints; the others send it their
share of a checkpoint. Starting the group's processes is :mod:`phalanx.train.launch`'s.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist

from phalanx.algos.base import Algorithm, OffPolicyConfig
from phalanx.config import AlgoConfig
from phalanx.envs.wrappers import RunningMeanStd


def replay_settings(hyperparameters: AlgoConfig) -> OffPolicyConfig:
    """The hyperparameters of an off-policy algorithm: an OffPolicyConfig (the contract of
    ``Algorithm.on_policy``; docs/architecture.md, "Adding an algorithm")."""
    return cast(OffPolicyConfig, hyperparameters)


class RolloutSettings(Protocol):
    """What the runtime reads of an on-policy algorithm's hyperparameters (its config has a horizon)."""

    horizon: int


def rollout_settings(hyperparameters: AlgoConfig) -> RolloutSettings:
    """The hyperparameters of an on-policy algorithm, which have a ``horizon`` (the contract of
    ``Algorithm.on_policy``)."""
    return cast(RolloutSettings, hyperparameters)


class Learner:
    """One learner on one device.

    On-policy, ``update`` learns from the rollout the worker just wrote into ``buffer``; off-policy,
    each ``update`` samples a batch from the replay buffer. In a group, the algorithm's ``group`` is
    set and its optimiser steps average the gradients over the learners.
    """

    def __init__(self, algorithm: Algorithm, buffer: Any) -> None:
        self.algorithm = algorithm
        self.buffer: Any = buffer  # a rollout (on-policy) or a replay, single- or multi-agent
        self.updates = 0

    def update(self, progress: float) -> dict[str, torch.Tensor]:
        if not self.algorithm.on_policy:  # a replay buffer (single- or multi-agent)
            config = replay_settings(self.algorithm.config)
            batch = self.buffer.sample(config.batch_size, config.gamma, config.n_step)
            metrics = self.algorithm.update(batch, progress)
        else:
            metrics = self.algorithm.update(self.buffer, progress)
        self.updates += 1
        return metrics


# -- the group ------------------------------------------------------------------------------------
class LearnerGroup:
    """This process's place in a data-parallel group of learners (the process group is already up).

    Tensor collectives run on the group's backend (gloo: CPU tensors, NCCL: CUDA tensors); the
    collectives of Python objects (checkpoint shards, the run directory) on a gloo group beside it.
    """

    def __init__(
        self, rank: int, world_size: int, local_rank: int, device: torch.device, interrupted: threading.Event
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = device
        self.objects = dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else None
        self.interrupted = interrupted  # set by SIGINT; acted on when every learner agrees

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its mean over the learners: one all-reduce per dtype."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():
            flat = torch.cat([tensor.reshape(-1) for tensor in group])
            dist.all_reduce(flat)
            flat /= self.world_size
            views = [
                chunk.view_as(t)
                for chunk, t in zip(flat.split([t.numel() for t in group]), group, strict=True)
            ]
            torch._foreach_copy_(group, views)

    def maximum(self, value: int) -> int:
        """The largest of the learners' ``value``, on every learner."""
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def broadcast(self, obj: Any) -> Any:
        """Learner 0's ``obj``, on every learner."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.objects)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every learner's ``obj``, in rank order, on learner 0 (None elsewhere)."""
        gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0, group=self.objects)
        return gathered

    def scatter(self, objs: list[Any] | None) -> Any:
        """Learner 0 passes one object per learner (``objs[rank]``); each learner gets its own."""
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs if self.is_main else None, src=0, group=self.objects)
        return box[0]

    def close(self, finished: bool = False) -> None:
        """Leave the group; ``finished``: after a barrier, so that no learner tears its connections down
        while another still receives from it (gloo can abort the process then)."""
        if not dist.is_initialized():
            return
        if finished:
            dist.barrier()
        dist.destroy_process_group()


class StatisticsSync:
    """Keeps running statistics (observation normalisation, reward scaling) identical on every learner.

    Each learner's statistics absorb the samples of its own env shard. :meth:`__call__` recovers what
    each learner added since the last call (its *delta*: count, mean, variance, by undoing the merge
    into the common base), gathers the deltas, and merges all of them into the base in rank order, so
    that every learner ends with the same bits: the statistics of all the learners' samples.
    """

    def __init__(self, group: LearnerGroup, statistics: RunningMeanStd) -> None:
        self.group = group
        self.statistics = statistics
        empty = RunningMeanStd(statistics.shape, statistics.device)
        self.base = (empty.count, empty.mean, empty.var)  # before any sample: the same everywhere

    def rebase(self) -> None:
        """Take the current statistics as the common base (after loading a checkpoint)."""
        s = self.statistics
        self.base = (s.count.clone(), s.mean.clone(), s.var.clone())

    def __call__(self) -> None:
        s = self.statistics
        base_count, base_mean, base_var = self.base
        added = s.count - base_count
        if float(added) > 0:
            delta_mean = s.mean + (s.mean - base_mean) * (base_count / added)
            spread = (delta_mean - base_mean).square() * base_count * added / s.count
            delta_m2 = s.var * s.count - base_var * base_count - spread
            delta_var = (delta_m2 / added).clamp(min=0)
        else:
            delta_mean, delta_var = torch.zeros_like(s.mean), torch.zeros_like(s.var)
        packed = torch.cat([added.reshape(1), delta_mean.reshape(-1), delta_var.reshape(-1)])
        gathered = [torch.empty_like(packed) for _ in range(self.group.world_size)]
        dist.all_gather(gathered, packed)
        s.count, s.mean, s.var = base_count.clone(), base_mean.clone(), base_var.clone()
        size = s.mean.numel()
        for delta in gathered:
            s.merge(delta[0], delta[1 : 1 + size].view(s.shape), delta[1 + size :].view(s.shape))
        self.rebase()
