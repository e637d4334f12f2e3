"""MAPPO and IPPO: PPO for every agent of a multi-agent env, with a centralised or a local critic.

MAPPO (Yu et al., 2022) is PPO whose value function sees the *global state* while each policy acts on
its agent's own observation (centralised training, decentralised execution); IPPO (de Witt et al.,
2020) is the same with each agent's value function on its own observation. Both are
:class:`~phalanx.algos.ppo.PPO` itself, run on the agents' rows: a group of A agents in N sub-envs is
a batch of N * A rows, and PPO's whole learning rule (GAE with truncation bootstrapping, the clipped
surrogate, value clipping, entropy bonus, minibatch epochs) applies unchanged. What this file adds is
the bookkeeping:

- a *unit* is the agents that share one PPO learner: all agents of a group with ``share_parameters``
  (they tell themselves apart by a one-hot agent id appended to their inputs), or one agent each
  without it; each agent group (a team, in a competitive env) has its own units;
- ``explore`` gives each unit's rows to its policy and value networks, and ``update`` hands PPO a
  view of the multi-agent rollout in which each unit's agents are rows: per-agent rewards, the
  sub-env's episode ends repeated for each agent, the global state (MAPPO) or the observation (IPPO)
  as the value function's input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from phalanx.algos.base import ActingModule
from phalanx.algos.ppo import PPO, PolicyHeadActing, PPOConfig
from phalanx.config import TrainConfig
from phalanx.errors import ConfigError
from phalanx.marl.base import (
    MultiAgentAlgorithm,
    agent_id_dim,
    broadcast_state,
    with_agent_ids,
)
from phalanx.marl.buffers import MultiAgentRollout
from phalanx.marl.core import Groups, MultiAgentSpec, Tensor


@dataclass
class MAPPOConfig(PPOConfig):
    """Multi-Agent PPO (Yu et al., 2022): PPO per agent group with a value function on the global state."""

    horizon: int = 25
    """Steps each sub-env takes per rollout (rollout size = horizon * num_envs * agents)."""
    minibatch_size: int = 1024
    """Agent-steps per gradient step (a unit's rollout has horizon * num_envs * its agents; a larger
    minibatch is the whole rollout)."""
    epochs: int = 5
    learning_rate: float = 7e-4
    entropy_coef: float = 0.01
    max_grad_norm: float | None = 10.0
    share_parameters: bool = True
    """Agents of a group share one policy and one value network, told apart by a one-hot agent id in
    their inputs (False: each agent its own networks)."""
    centralised_critic: bool = True
    """The value function sees the global state (MAPPO); False: each agent's own observation (IPPO)."""

    def rollout_size(self, run: TrainConfig) -> int | None:
        return None  # rows are agent-steps: the agents per unit come with the env

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        if self.target_kl is not None:
            raise ConfigError(
                f"target_kl = {self.target_kl}: multi-agent PPO learners stop no epoch early (each unit of "
                "agents would stop at a different epoch). Leave target_kl unset."
            )


@dataclass
class IPPOConfig(MAPPOConfig):
    """Independent PPO (de Witt et al., 2020): as MAPPO, with each agent's value function on its own
    observation."""

    centralised_critic: bool = False


@dataclass
class _Unit:
    """Agents ``agents`` (a slice of the agent axis) of group ``group``, learned by one PPO."""

    key: str
    group: str
    agents: slice
    ppo: PPO
    with_ids: bool


@dataclass
class _UnitRollout:
    """A unit's share of a rollout as PPO reads it: rows are (sub-env, agent) pairs, ``(T, N * A_u, ...)``."""

    obs: Tensor
    critic_obs: Tensor
    next_critic_obs: Tensor
    actions: Tensor
    log_probs: Tensor
    values: Tensor
    rewards: Tensor
    terminated: Tensor
    dones: Tensor


class GroupPolicyActing(ActingModule):
    """MAPPO's and IPPO's acting for one agent group: each unit's policy head acts on its agents'
    observations (with their ids when shared), ``(B, A_g, obs_dim)`` to ``(B, A_g[, act_dim])``; the
    stochastic one takes noise ``(B, A_g, size)``, agent a's draw in ``noise[:, a]``."""

    def __init__(self, units: list[_Unit], stochastic: bool = False) -> None:
        heads = [PolicyHeadActing(unit.ppo.policy, stochastic) for unit in units]
        super().__init__(heads[0].noise)
        self.heads = nn.ModuleList(heads)
        self.agents = [unit.agents for unit in units]
        self.with_ids = [unit.with_ids for unit in units]

    def forward(self, obs: Tensor, noise: Tensor | None = None) -> Tensor:
        parts = []
        for head, agents, with_ids in zip(self.heads, self.agents, self.with_ids, strict=True):
            inputs = with_agent_ids(obs, with_ids)[..., agents, :]  # (B, A_u, D)
            draw = None if noise is None else noise[:, agents].flatten(0, 1)
            actions = head(inputs.flatten(0, 1), draw)
            parts.append(actions.view(*inputs.shape[:2], *actions.shape[1:]))
        return torch.cat(parts, dim=1)


class MAPPO(MultiAgentAlgorithm):
    name = "mappo"
    config_class = MAPPOConfig
    on_policy = True
    config: MAPPOConfig

    def __init__(self, config: MAPPOConfig, spec: MultiAgentSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        if spec.has_action_mask:
            raise ConfigError(
                f"{self.name} does not apply action masks, but this env has them (some actions are not "
                "allowed in some states). Use qmix or vdn, which respect them."
            )
        self.units: list[_Unit] = []
        for name, group in spec.groups.items():
            num_agents = group.num_agents
            shared = config.share_parameters
            ids = agent_id_dim(num_agents, shared)
            obs_space = _box(int(group.observation_space.shape[0]) + ids)
            critic_dim = (
                spec.state_dim if config.centralised_critic else int(group.observation_space.shape[0])
            )
            action_space = (
                group.action_space
                if isinstance(group.action_space, gym.spaces.Discrete)  # group.discrete
                else _box(int(group.action_space.shape[0]), 1.0)
            )
            parts = [slice(0, num_agents)] if shared else [slice(a, a + 1) for a in range(num_agents)]
            for part in parts:
                key = name if shared else f"{name}/{group.agents[part.start]}"
                ppo = PPO(config, obs_space, action_space, self.device, critic_space=_box(critic_dim + ids))
                self.units.append(_Unit(key, name, part, ppo, with_ids=shared))

    # -- inputs ----------------------------------------------------------------------------------
    def policy_input(self, unit: _Unit, obs: Groups) -> Tensor:
        """The unit's agents' observations (with ids when shared): ``(..., A_u, obs_dim [+ A])``."""
        return with_agent_ids(obs[unit.group], unit.with_ids)[..., unit.agents, :]

    def critic_input(self, unit: _Unit, obs: Groups, state: Tensor) -> Tensor:
        """The value function's input for each of the unit's agents: the global state (MAPPO) or the
        agent's observation (IPPO), with ids when shared: ``(..., A_u, critic_dim)``."""
        if not self.config.centralised_critic:
            return self.policy_input(unit, obs)
        num_agents = obs[unit.group].shape[-2]
        return with_agent_ids(broadcast_state(state, num_agents), unit.with_ids)[..., unit.agents, :]

    # -- acting ----------------------------------------------------------------------------------
    @torch.no_grad()
    def explore(self, obs: Groups, state: Tensor, action_mask: Groups | None = None) -> tuple[Groups, ...]:
        """Sampled actions, their log-probabilities and values, per group ``(N, A_g, ...)``."""
        parts: dict[str, list[tuple[Tensor, Tensor, Tensor]]] = {name: [] for name in self.spec.groups}
        for unit in self.units:
            inputs = self.policy_input(unit, obs)  # (N, A_u, D)
            rows = inputs.shape[:2]
            actions, log_probs = unit.ppo.policy.sample(inputs.flatten(0, 1))
            values = unit.ppo.value(self.critic_input(unit, obs, state).flatten(0, 1))
            parts[unit.group].append(
                (actions.view(*rows, *actions.shape[1:]), log_probs.view(rows), values.view(rows))
            )
        return tuple(
            {name: torch.cat([p[i] for p in parts[name]], dim=1) for name in parts} for i in range(3)
        )

    @torch.no_grad()
    def act(  # type: ignore[override]  # groups of observations in, as MultiAgentAlgorithm.act
        self, obs: Groups, action_mask: Groups | None = None, deterministic: bool = True
    ) -> Groups:
        parts: dict[str, list[Tensor]] = {name: [] for name in self.spec.groups}
        for unit in self.units:
            inputs = self.policy_input(unit, obs)
            flat = inputs.flatten(0, 1)
            if deterministic:
                actions = unit.ppo.policy.deterministic_action(flat)
            else:
                actions, _ = unit.ppo.policy.sample(flat)
            parts[unit.group].append(actions.view(*inputs.shape[:2], *actions.shape[1:]))
        return {name: torch.cat(actions, dim=1) for name, actions in parts.items()}

    def group_acting_module(self, group: str, stochastic: bool = False) -> GroupPolicyActing:
        return GroupPolicyActing([unit for unit in self.units if unit.group == group], stochastic)

    # -- learning --------------------------------------------------------------------------------
    def update(self, rollout: MultiAgentRollout, progress: float) -> dict[str, Tensor]:
        metrics: dict[str, Tensor] = {}
        for unit in self.units:
            # a _UnitRollout has the fields of a RolloutBuffer that PPO's update reads
            unit_metrics = unit.ppo.update(self.unit_rollout(unit, rollout), progress)  # type: ignore[arg-type]
            prefix = "" if len(self.units) == 1 else f"{unit.key}/"
            metrics.update({f"{prefix}{name}": value for name, value in unit_metrics.items()})
        return metrics

    def unit_rollout(self, unit: _Unit, rollout: MultiAgentRollout) -> _UnitRollout:
        """The unit's agents as rows of a PPO rollout: ``(T, N, A_u, ...)`` as ``(T, N * A_u, ...)``."""
        group, agents = unit.group, unit.agents

        def rows(x: Tensor) -> Tensor:  # (T, N, A_u, ...) -> (T, N * A_u, ...)
            return x.flatten(1, 2)

        num_agents = agents.stop - agents.start
        horizon, num_envs = rollout.horizon, rollout.num_envs

        def per_agent(x: Tensor) -> Tensor:  # (T, N) episode ends, the same for every agent of a sub-env
            return x.unsqueeze(-1).expand(horizon, num_envs, num_agents).flatten(1, 2)

        return _UnitRollout(
            obs=rows(self.policy_input(unit, rollout.obs)),
            critic_obs=rows(self.critic_input(unit, rollout.obs, rollout.state)),
            next_critic_obs=rows(self.critic_input(unit, rollout.next_obs, rollout.next_state)),
            actions=rows(rollout.actions[group][:, :, agents]),
            log_probs=rows(rollout.log_probs[group][:, :, agents]),
            values=rows(rollout.values[group][:, :, agents]),
            rewards=rows(rollout.rewards[group][:, :, agents]),
            terminated=per_agent(rollout.terminated),
            dones=per_agent(rollout.dones),
        )

    # -- state -----------------------------------------------------------------------------------
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {
            f"{unit.key}/{name}": optimizer
            for unit in self.units
            for name, optimizer in unit.ppo.optimizers().items()
        }

    def state_entries(self) -> dict[str, Any]:
        """Each unit's PPO, under the unit's key."""
        return {unit.key: unit.ppo for unit in self.units}


class IPPO(MAPPO):
    name = "ippo"
    config_class = IPPOConfig


def _box(dim: int, bound: float = np.inf) -> gym.spaces.Box:
    return gym.spaces.Box(-bound, bound, (dim,), np.float32)
