"""What a step reports besides the transition: which rows ended, the episode statistics, the info.

:class:`EpisodeStatistics` keeps every sub-env's running return and length, :func:`step_info` builds
the ``info`` the VecEnv contract asks for (:mod:`phalanx.envs.core`), :func:`episode_ends` reads which
rows' statistics are valid, and :func:`concat_transitions` joins the steps of several VecEnvs. Shared by
every environment so that an episode's return and length mean the same thing everywhere.
"""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor


def episode_ends(info: dict[str, Any]) -> Tensor:
    """The rows of a step whose ``info["episode_return"]`` / ``info["episode_length"]`` are valid:
    ``info["_episode_return"]`` where the env sets it (Atari with episodic life: the game, not the life,
    ended), else ``info["_final_obs"]`` (every ended episode)."""
    return info.get("_episode_return", info["_final_obs"])


class EpisodeStatistics:
    """Running return and length of every sub-env; reports the finished ones each step.

    Shared by every VecEnv implementation so that the statistics mean the same thing everywhere:
    the undiscounted sum of the env's own rewards (before any reward scaling wrapper).
    """

    def __init__(self, num_envs: int, device: torch.device, per_row: tuple[int, ...] = ()) -> None:
        """``per_row``: the shape of one sub-env's reward, e.g. ``(num_agents,)`` for multi-agent envs."""
        self.returns = torch.zeros((num_envs, *per_row), dtype=torch.float32, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)

    def step(self, reward: Tensor, done: Tensor) -> tuple[Tensor, Tensor]:
        """Add one step; return ``(episode_return, episode_length)`` valid where ``done``."""
        finished_return = self.returns + reward
        finished_length = self.lengths + 1
        self.returns = finished_return.masked_fill(done.view(-1, *[1] * (reward.dim() - 1)), 0.0)
        self.lengths = finished_length.masked_fill(done, 0)
        return finished_return, finished_length

    def reset(self) -> None:
        self.returns.zero_()
        self.lengths.zero_()

    def state_dict(self) -> dict[str, Tensor]:
        return {"returns": self.returns.clone(), "lengths": self.lengths.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.returns.copy_(state["returns"])
        self.lengths.copy_(state["lengths"])


def step_info(
    final_obs: Any,
    done: Tensor,
    episode_return: Any,
    episode_length: Tensor,
    statistics_rows: Tensor | None = None,
) -> dict[str, Any]:
    """The ``info`` a step returns under the contract: the true next observation of every row, the mask
    ``terminated | truncated`` of the rows it is the last one of, and the episode statistics (valid
    where ``done``, or where ``statistics_rows`` says when given: ``info["_episode_return"]``)."""
    info = {
        "final_obs": final_obs,
        "_final_obs": done,
        "episode_return": episode_return,
        "episode_length": episode_length,
    }
    if statistics_rows is not None:
        info["_episode_return"] = statistics_rows
    return info


class StatisticsCheckpoint:
    """``state_dict`` / ``load_state_dict`` of an env whose simulator cannot be checkpointed (Gymnasium,
    EnvPool): the episode statistics only; a resumed run resets the simulator."""

    episode_statistics: EpisodeStatistics

    def state_dict(self) -> dict[str, Any]:
        """Episode statistics only: the simulator cannot be checkpointed (a resume re-resets it)."""
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])


def concat_transitions(
    parts: list[tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]],
) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
    """The step results of several VecEnvs as one: every array concatenated along the row dimension."""
    obs = torch.cat([part[0] for part in parts])
    reward = torch.cat([part[1] for part in parts])
    terminated = torch.cat([part[2] for part in parts])
    truncated = torch.cat([part[3] for part in parts])
    info = {key: torch.cat([part[4][key] for part in parts]) for key in _CONTRACT_INFO}
    if any("_episode_return" in part[4] for part in parts):
        info["_episode_return"] = torch.cat([episode_ends(part[4]) for part in parts])
    return obs, reward, terminated, truncated, info


_CONTRACT_INFO = ("final_obs", "_final_obs", "episode_return", "episode_length")
