"""Deployment of a multi-agent run: ``phalanx.load_agent(run_dir)`` gives a :class:`MultiAgentAgent`.

``act(obs)`` takes every agent's observation as a dict per group (numpy or torch, ``(A_g, obs_dim)``
for one sub-env or ``(N, A_g, obs_dim)`` for a batch) and returns each agent's action in the env's
own action space; each agent acts on its own observation (decentralised execution), from the
checkpoint alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from phalanx.agent import restore_algorithm
from phalanx.config import TrainConfig
from phalanx.marl.base import MultiAgentAlgorithm, to_env_actions
from phalanx.marl.core import MultiAgentSpec
from phalanx.marl.registry import make_multi_agent_env
from phalanx.marl.trainer import MultiAgentEpisode, MultiAgentEvaluation, MultiAgentEvaluator
from phalanx.train.environments import EVAL_SEED_OFFSET
from phalanx.train.videos import MAX_EPISODE_STEPS


class MultiAgentAgent:
    """The trained policies of every agent of a multi-agent run."""

    def __init__(
        self, config: TrainConfig, state: dict[str, Any], device: str | torch.device = "cpu"
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.spec = MultiAgentSpec.from_dict(state["spaces"])
        self.algorithm: MultiAgentAlgorithm = restore_algorithm(config, (self.spec,), state, self.device)
        self.steps = state["progress"]["steps"]

    @torch.no_grad()
    def act(self, obs: dict[str, Any], action_mask: dict[str, Any] | None = None, deterministic: bool = True):
        """Actions ``{group: (A_g,) or (N, A_g[, act_dim])}`` in the env's action spaces; numpy in, numpy
        out; torch in, torch out."""
        if not isinstance(obs, dict) or set(obs) != set(self.spec.groups):
            given = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            raise ValueError(
                f"MultiAgentAgent.act: obs must be a dict with one array per agent group "
                f"{sorted(self.spec.groups)}, got {given}."
            )
        is_numpy = not isinstance(next(iter(obs.values())), torch.Tensor)
        tensors, single = {}, False
        for name, group in self.spec.groups.items():
            value = torch.as_tensor(np.asarray(obs[name]) if is_numpy else obs[name], dtype=torch.float32)
            value = value.to(self.device)
            expected = (group.num_agents, int(group.observation_space.shape[0]))
            single = value.dim() == 2
            if single:
                value = value.unsqueeze(0)
            if tuple(value.shape[1:]) != expected:
                raise ValueError(
                    f"MultiAgentAgent.act: observations of group {name!r} have shape "
                    f"{tuple(value.shape[1:])} per sub-env, expected {expected} (agents, obs_dim) of the "
                    f"training env {self.config.env!r}."
                )
            tensors[name] = value
        masks = None
        if action_mask is not None:
            masks = {
                name: torch.as_tensor(np.asarray(mask), device=self.device)
                for name, mask in action_mask.items()
            }
            if single:
                masks = {name: mask.unsqueeze(0) for name, mask in masks.items()}
        actions = to_env_actions(self.algorithm.act(tensors, masks, deterministic), self.spec.groups)
        if single:
            actions = {name: value[0] for name, value in actions.items()}
        return {name: value.cpu().numpy() for name, value in actions.items()} if is_numpy else actions

    def evaluate(self, episodes: int = 10, seed: int | None = None) -> MultiAgentEvaluation:
        """``episodes`` deterministic episodes on the training env: team and per-agent returns."""
        env = make_multi_agent_env(self.config.env, num_envs=episodes, device=self.device)
        try:
            evaluator = MultiAgentEvaluator(
                env, seed=self.config.seed + EVAL_SEED_OFFSET if seed is None else seed
            )
            return evaluator.evaluate(self.algorithm)
        finally:
            env.close()

    def frames(self, max_steps: int = MAX_EPISODE_STEPS, seed: int | None = None) -> MultiAgentEpisode:
        """One deterministic episode drawn by the env's own ``render()``, its frames drawn as they are
        iterated (``seed``: of the episode, by default the evaluations' own)."""
        seed = self.config.seed + EVAL_SEED_OFFSET if seed is None else seed
        return MultiAgentEpisode(self.config.env, self.algorithm, self.device, seed, max_steps)
