"""Worker: steps a VecEnv with the algorithm's exploration policy and records what happened."""

from __future__ import annotations

from typing import Any

import torch

from phalanx.buffers import ReplayBuffer, RolloutBuffer
from phalanx.envs.core import VecEnv


class EpisodeLog:
    """Sums of finished episodes' returns and lengths, kept on the device until they are read."""

    def __init__(self, device: torch.device) -> None:
        self.return_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.length_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.int64, device=device)

    def record(self, episode_return: torch.Tensor, episode_length: torch.Tensor, done: torch.Tensor) -> None:
        self.return_sum += torch.where(done, episode_return, 0.0).sum(dtype=torch.float64)
        self.length_sum += torch.where(done, episode_length, 0).sum(dtype=torch.float64)
        self.count += done.sum()

    def read(self) -> dict[str, float]:
        """Means of the episodes finished since the last read (one host sync), then clear."""
        count = int(self.count)
        if count == 0:
            return {"episodes": 0}
        means = {
            "episodes": count,
            "episode_return_mean": float(self.return_sum) / count,
            "episode_length_mean": float(self.length_sum) / count,
        }
        self.return_sum.zero_()
        self.length_sum.zero_()
        self.count.zero_()
        return means


class Worker:
    """Steps a VecEnv with the algorithm's policy; keeps the current observation between calls.

    On-policy it fills a rollout (:meth:`collect`); off-policy it adds one VecEnv step of N
    transitions to the replay buffer at a time (:meth:`step`).
    """

    def __init__(self, env: VecEnv, algorithm: Any) -> None:
        self.env = env
        self.algorithm = algorithm
        self.obs: torch.Tensor | None = None
        self.episodes = EpisodeLog(env.device)

    def reset(self, seed: int | None = None) -> None:
        self.obs, _ = self.env.reset(seed=seed)

    def collect(self, buffer: RolloutBuffer) -> RolloutBuffer:
        """Fill ``buffer`` with ``buffer.horizon`` steps of every sub-env."""
        if self.obs is None:
            raise RuntimeError("Worker.collect called before Worker.reset")
        for step in range(buffer.horizon):
            actions, log_probs, values = self.algorithm.explore(self.obs)
            next_obs, rewards, terminated, truncated, info = self.env.step(actions)
            dones = terminated | truncated
            buffer.add(
                step, self.obs, actions, log_probs, values, rewards, terminated, dones, info["final_obs"]
            )
            self.episodes.record(info["episode_return"], info["episode_length"], dones)
            self.obs = next_obs
        return buffer

    def step(self, replay: ReplayBuffer, steps: int, random: bool) -> None:
        """One step of every sub-env into ``replay``; uniformly random actions if ``random``."""
        if self.obs is None:
            raise RuntimeError("Worker.step called before Worker.reset")
        if random:
            actions = self.algorithm.random_actions(self.env.num_envs)
        else:
            actions = self.algorithm.explore(self.obs, steps)
        next_obs, rewards, terminated, truncated, info = self.env.step(actions)
        replay.add(self.obs, actions, rewards, info["final_obs"], terminated, truncated)
        self.episodes.record(info["episode_return"], info["episode_length"], terminated | truncated)
        self.obs = next_obs

    def state_dict(self) -> dict[str, Any]:
        return {"obs": self.obs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.obs = state["obs"]
