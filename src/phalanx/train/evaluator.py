"""Evaluator: deterministic episodes on a separate env, one episode per sub-env, run in parallel."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from phalanx.envs.core import VecEnv

Tensor = torch.Tensor


@dataclass
class Evaluation:
    returns: list[float]
    lengths: list[int]

    @property
    def mean(self) -> float:
        return sum(self.returns) / len(self.returns)

    @property
    def std(self) -> float:
        mean = self.mean
        return math.sqrt(sum((r - mean) ** 2 for r in self.returns) / len(self.returns))


class Evaluator:
    """Runs the first episode of each of ``env.num_envs`` sub-envs with the deterministic policy.

    The env is reset with the same seed every time, so successive evaluations see the same start
    states and differ only by the policy. ``max_steps`` bounds envs without a time limit.
    """

    def __init__(self, env: VecEnv, seed: int, max_steps: int = 100_000, check_every: int = 16) -> None:
        self.env = env
        self.seed = seed
        self.max_steps = max_steps
        self.check_every = check_every
        self.best_return = -math.inf

    @torch.no_grad()
    def evaluate(self, algorithm) -> Evaluation:
        returns, lengths = self.first_episodes(
            lambda obs, info: algorithm.act(obs, deterministic=True),
            lambda info: info["episode_return"],
            torch.zeros(self.env.num_envs, dtype=torch.float32, device=self.env.device),
        )
        return Evaluation(returns.tolist(), lengths.tolist())

    def first_episodes(
        self, act: Callable[[Any, dict], Any], episode_return: Callable[[dict], Tensor], returns: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Reset the env with the evaluation seed and step it with ``act(obs, info)`` until every sub-env
        has ended its first episode: those episodes' ``episode_return(info)`` rows (``returns`` gives the
        shape, ``(num_envs, ...)``) and lengths ``(num_envs,)``."""
        env = self.env
        obs, info = env.reset(seed=self.seed)
        finished = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
        lengths = torch.zeros(env.num_envs, dtype=torch.int64, device=env.device)
        for step in range(1, self.max_steps + 1):
            obs, _, terminated, truncated, info = env.step(act(obs, info))
            first_end = (terminated | truncated) & ~finished
            rows = first_end.view(-1, *[1] * (returns.dim() - 1))
            returns = torch.where(rows, episode_return(info), returns)
            lengths = torch.where(first_end, info["episode_length"], lengths)
            finished |= first_end
            if step % self.check_every == 0 and bool(finished.all()):
                break
        if not bool(finished.all()):
            raise RuntimeError(
                f"evaluation: {int((~finished).sum())} of {env.num_envs} episodes of {env!r} did not end "
                f"within {self.max_steps} steps. Give the env a time limit (max_episode_steps)."
            )
        return returns, lengths

    def is_best(self, evaluation: Evaluation) -> bool:
        """Record ``evaluation``; true if its mean is the best so far."""
        if evaluation.mean > self.best_return:
            self.best_return = evaluation.mean
            return True
        return False
