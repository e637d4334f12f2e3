"""MADDPG (Lowe et al., 2017) and MATD3 (Ackermann et al., 2019): DDPG and TD3 with centralised critics.

Every agent acts on its own observation with a deterministic tanh actor (decentralised execution); its
critic ``Q_a(s, u_1, ..., u_n)`` sees the global state and the actions of *all* agents of *all* groups,
concatenated over groups in the spec's order (centralised training). :meth:`MADDPG.update`, top to
bottom, as :meth:`phalanx.algos.ddpg.EnsembleCriticAlgorithm.update` for one agent:

1. the TD target of each agent a of each group: ``r_a + discount * V_a(s')``, where ``V_a`` reduces the
   K target critics of agent a (min, mean or REDQ's min of a subset) at the target actors' next actions
   of every agent (MATD3: plus clipped noise);
2. the critics' loss: squared TD error summed over the K members and the groups, averaged over the batch
   and the agents;
3. every ``policy_delay`` updates, the actors' loss ``-Q_a(s, u_1, .., pi_a(o_a), .., u_n)`` (the MADDPG
   policy gradient: agent a's own action from its actor, every other action the batch's), then a Polyak
   step of every target network.

Each group has its own actors and critics (a competitive team never shares networks with the other
team; its critic learns its own rewards). Within a group, ``share_parameters`` gives its agents one actor
and one critic ensemble, told apart by a one-hot agent id in the input, or else one network per agent;
either way a group's networks are a single :class:`~phalanx.nets.EnsembleMLP` (:class:`GroupNets`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import nn

from phalanx.algos.base import ActingModule, PolyakPair, no_stochastic_policy
from phalanx.algos.ddpg import DDPGConfig, EnsembleCriticAlgorithm
from phalanx.algos.td3 import TD3Config
from phalanx.config import TrainConfig, check
from phalanx.marl.base import (
    MultiAgentAlgorithm,
    agent_id_dim,
    broadcast_state,
    with_agent_ids,
)
from phalanx.marl.buffers import MultiAgentBatch
from phalanx.marl.core import AgentGroup, Groups, MultiAgentSpec, Tensor
from phalanx.nets import EnsembleMLP
from phalanx.optim import make_adam


@dataclass
class MADDPGConfig(DDPGConfig):
    """Multi-Agent DDPG: decentralised deterministic actors, centralised critics (Lowe et al., 2017).

    The defaults suit MPE ``simple_spread`` (25-step episodes): gamma 0.95 and 64-unit MLPs as in the
    paper; a larger tau (0.05 against 0.01), a smaller batch (256 against 1024) and learning rate (3e-3
    against 1e-2), and few gradient steps per transition, which learn fastest with many sub-envs.
    """

    learning_rate: float = 3e-3
    gamma: float = 0.95
    hidden_sizes: tuple[int, ...] = (64, 64)
    batch_size: int = 256
    learning_starts: int = 4_096
    updates_per_step: float = 0.03125
    tau: float = 0.05
    share_parameters: bool = True
    """Agents of a group share one actor and one critic ensemble, with a one-hot agent id appended to
    their inputs (False: every agent has its own, as members of one batched network)."""

    def validate(self, run: TrainConfig) -> None:
        """Refuses the single-agent options MADDPG lacks (the parallel recipe's weight_decay, bf16,
        exploration_noise_range, critic_layer_norm, critic_atoms), then DDPG's checks."""
        unset = {
            "weight_decay": 0.0,
            "bf16": False,
            "exploration_noise_range": None,
            "critic_layer_norm": False,
            "critic_atoms": None,
        }
        for name, off in unset.items():
            value = getattr(self, name)
            check(value == off, name, value, f"{off}: {run.algo} does not take it yet (DDPG, TD3 and SAC do)")
        super().validate(run)


@dataclass
class MATD3Config(MADDPGConfig, TD3Config):
    """Multi-Agent TD3: MADDPG with TD3's twin critics (min target), target policy smoothing and delayed
    actor updates. TD3's ``target_noise`` and ``target_noise_clip`` come from ``TD3Config``; every other
    default is MADDPG's."""

    num_critics: int = 2
    policy_delay: int = 2


class GroupNets(nn.Module):
    """K networks for each of a group's A agents as one EnsembleMLP: ``(B, A, in) -> (K, B, A, out)``.

    Shared (``share_parameters``): K members, each agent's one-hot id appended to its input; otherwise
    K * A members, member ``k * A + a`` being agent a's k-th network.
    """

    def __init__(
        self, num_nets: int, num_agents: int, in_dim: int, out_dim: int, config: MADDPGConfig
    ) -> None:
        super().__init__()
        self.num_nets, self.num_agents, self.shared = num_nets, num_agents, config.share_parameters
        members = num_nets if self.shared else num_nets * num_agents
        in_dim += agent_id_dim(num_agents, self.shared)
        self.net = EnsembleMLP(members, in_dim, config.hidden_sizes, out_dim, config.activation)

    def forward(self, x: Tensor) -> Tensor:
        batch, agents, in_dim = x.shape  # (B, A, in)
        if self.shared:  # every member sees every agent's row, told apart by the id
            out = self.net(with_agent_ids(x).reshape(batch * agents, -1))  # (K, B * A, out)
            return out.view(self.num_nets, batch, agents, -1)
        rows = x.transpose(0, 1).expand(self.num_nets, agents, batch, in_dim)  # (K, A, B, in)
        out = self.net(rows.reshape(self.num_nets * agents, batch, in_dim))  # (K * A, B, out)
        return out.view(self.num_nets, agents, batch, -1).transpose(1, 2)  # (K, B, A, out)


class GroupActorActing(ActingModule):
    """MADDPG's and MATD3's acting for one agent group: each agent's deterministic tanh action from its
    own observation, ``(B, A_g, obs_dim)`` to ``(B, A_g, act_dim)`` in [-1, 1]."""

    def __init__(self, actor: GroupNets) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.actor(obs)[0])


def _action_dim(group: AgentGroup) -> int:
    """The size of one agent's continuous action (MADDPG learns Box actions only: check_spec)."""
    assert isinstance(group.action_space, gym.spaces.Box), "continuous actions (action_kinds)"
    return int(group.action_space.shape[0])


class MADDPG(MultiAgentAlgorithm):
    """Deterministic tanh actors per group, critics on the global state and every agent's action."""

    name = "maddpg"
    config_class: ClassVar[type[MADDPGConfig]] = MADDPGConfig
    on_policy = False
    action_kinds = ("continuous",)
    config: MADDPGConfig
    extra_state = ("updates",)

    # The K target critics reduce as in single-agent DDPG/TD3/REDQ (dim 0 of (K, B, A_g) here).
    # EnsembleCriticAlgorithm's methods, which read only config, draws and the critics' parameters
    reduce_critics: ClassVar[Callable[[Any, Tensor], Tensor]] = EnsembleCriticAlgorithm.reduce_critics
    set_critic_grad: ClassVar[Callable[[Any, bool], None]] = EnsembleCriticAlgorithm.set_critic_grad

    def __init__(self, config: MADDPGConfig, spec: MultiAgentSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.action_dims = {name: _action_dim(group) for name, group in spec.groups.items()}
        joint_dim = sum(group.num_agents * self.action_dims[name] for name, group in spec.groups.items())
        self.actor, self.critic = nn.ModuleDict(), nn.ModuleDict()
        for name, group in spec.groups.items():
            obs_dim = int(group.observation_space.shape[0])
            self.actor[name] = GroupNets(1, group.num_agents, obs_dim, self.action_dims[name], config)
            critic_in = spec.state_dim + joint_dim
            self.critic[name] = GroupNets(config.num_critics, group.num_agents, critic_in, 1, config)
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_polyak = PolyakPair(self.actor_target, self.actor)
        self.critic_polyak = PolyakPair(self.critic_target, self.critic)
        self.critic_parameters = list(self.critic.parameters())
        self.actor_optimizer = make_adam(list(self.actor.parameters()), lr=config.learning_rate)
        critic_lr = config.critic_learning_rate or config.learning_rate
        self.critic_optimizer = make_adam(self.critic_parameters, lr=critic_lr)
        # own[g][a, b]: whether slot b of group g's joint action is agent a's own, (A_g, A_g, 1)
        self.own_slots = {
            name: torch.eye(group.num_agents, dtype=torch.bool, device=self.device).unsqueeze(-1)
            for name, group in spec.groups.items()
        }
        self.updates = 0

    # -- acting ----------------------------------------------------------------------------------
    def policy(self, actor: nn.ModuleDict, obs: Groups) -> Groups:
        """Each agent's deterministic action in [-1, 1] from its own observation: ``{g: (B, A_g, act)}``."""
        return {name: torch.tanh(actor[name](obs[name])[0]) for name in self.spec.groups}

    @torch.no_grad()
    def act(  # type: ignore[override]  # groups of observations in, as MultiAgentAlgorithm.act
        self, obs: Groups, action_mask: Groups | None = None, deterministic: bool = True
    ) -> Groups:
        return self.policy(self.actor, obs)

    def group_acting_module(self, group: str, stochastic: bool = False) -> GroupActorActing:
        if stochastic:
            raise no_stochastic_policy(
                self.name, "its actors are deterministic (Gaussian exploration noise is for training only)"
            )
        actor = self.actor[group]
        assert isinstance(actor, GroupNets)
        return GroupActorActing(actor)

    @torch.no_grad()
    def explore(self, obs: Groups, state: Tensor, action_mask: Groups | None, steps: int) -> Groups:
        noise = self.config.exploration_noise
        return {
            name: (actions + noise * torch.randn_like(actions)).clamp(-1.0, 1.0)
            for name, actions in self.policy(self.actor, obs).items()
        }

    def random_actions(self, num_envs: int, action_mask: Groups | None = None) -> Groups:
        return {
            name: torch.rand(num_envs, group.num_agents, self.action_dims[name], device=self.device) * 2 - 1
            for name, group in self.spec.groups.items()
        }

    # -- the centralised critics -----------------------------------------------------------------
    def joint_actions(self, actions: Groups) -> Tensor:
        """Every agent's action, concatenated over the groups in spec order: ``(B, sum_g A_g * act_g)``."""
        return torch.cat([actions[name].flatten(1) for name in self.spec.groups], dim=1)

    def with_own_actions(self, actions: Groups, name: str, own: Tensor) -> Tensor:
        """For each agent a of group ``name``: the joint action with a's slot replaced by ``own[:, a]``
        and every other slot from ``actions``, ``(B, A_g, joint_dim)``."""
        agents = own.shape[1]
        # mine[:, a, b]: agent a's own action where b == a, agent b's batch action elsewhere; (B, A, A, act)
        mine = torch.where(self.own_slots[name], own.unsqueeze(1), actions[name].unsqueeze(1))
        parts = []
        for other in self.spec.groups:  # every group's slots, in spec order
            if other == name:
                parts.append(mine.flatten(2))  # (B, A_g, A_g * act)
            else:  # the same for each agent a: (B, A_g, A_o * act_o)
                parts.append(actions[other].flatten(1).unsqueeze(1).expand(-1, agents, -1))
        return torch.cat(parts, dim=-1)  # (B, A_g, joint_dim)

    def q_values(self, critic: nn.ModuleDict, name: str, state: Tensor, joint_actions: Tensor) -> Tensor:
        """Q of every member for each agent of group ``name``, ``(K, B, A_g)``; ``joint_actions`` is
        ``(B, joint_dim)`` (the same for every agent) or ``(B, A_g, joint_dim)`` (one per agent)."""
        agents = self.spec.groups[name].num_agents
        joint_actions = joint_actions.unsqueeze(1) if joint_actions.dim() == 2 else joint_actions
        joint_actions = joint_actions.expand(-1, agents, -1)
        inputs = torch.cat([broadcast_state(state, agents), joint_actions], dim=-1)  # (B, A_g, S + joint)
        return critic[name](inputs).squeeze(-1)

    def next_actions(self, next_obs: Groups) -> Groups:
        """The actions of the TD target: the target actors' (MATD3 adds smoothing noise)."""
        return self.policy(self.actor_target, next_obs)

    # -- the learning rule -----------------------------------------------------------------------
    def update(self, batch: MultiAgentBatch, progress: float) -> dict[str, Tensor]:
        groups, config = self.spec.groups, self.config
        with torch.no_grad():
            next_joint = self.joint_actions(self.next_actions(batch.next_obs))  # (B, joint_dim)
            discounts = batch.discounts.unsqueeze(1)  # (B, 1)
            targets = {}
            for name in groups:
                q_next = self.q_values(self.critic_target, name, batch.next_state, next_joint)  # (K, B, A_g)
                targets[name] = batch.rewards[name] + discounts * self.reduce_critics(q_next)  # (B, A_g)

        joint = self.joint_actions(batch.actions)  # (B, joint_dim)
        critic_loss, q_sum = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
        for name in groups:
            q_values = self.q_values(self.critic, name, batch.state, joint)  # (K, B, A_g)
            critic_loss = critic_loss + (q_values - targets[name]).pow(2).mean(dim=(1, 2)).sum()
            q_sum = q_sum + q_values.detach().mean()
        assert self.critic_optimizer is not None, "a learning algorithm has its optimisers"
        self.minimise(critic_loss, self.critic_optimizer)
        self.updates += 1

        metrics = {"critic_loss": critic_loss.detach(), "q_mean": q_sum / len(groups)}
        if self.updates % config.policy_delay == 0:
            self.set_critic_grad(False)  # the actors' loss moves the actors only
            own_actions = self.policy(self.actor, batch.obs)  # {g: (B, A_g, act)}
            actor_loss = torch.zeros((), device=self.device)
            for name in groups:
                # agent a's own action from its actor, everyone else's from the batch: (B, A_g, joint_dim)
                joint_own = self.with_own_actions(batch.actions, name, own_actions[name])
                actor_loss = actor_loss - self.q_values(self.critic, name, batch.state, joint_own).mean()
            assert self.actor_optimizer is not None, "a learning algorithm has its optimisers"
            self.minimise(actor_loss, self.actor_optimizer)
            self.set_critic_grad(True)
            self.actor_polyak.update(config.tau)
            self.critic_polyak.update(config.tau)
            metrics["actor_loss"] = actor_loss.detach()
        return metrics


class MATD3(MADDPG):
    """MADDPG with TD3's pieces: twin critics reduced by min and delayed actor updates (both config
    values of :class:`MATD3Config`), and clipped Gaussian noise on the target actions (here)."""

    name = "matd3"
    config_class = MATD3Config
    config: MATD3Config

    def next_actions(self, next_obs: Groups) -> Groups:
        clip = self.config.target_noise_clip
        smoothed = {}
        for name, actions in super().next_actions(next_obs).items():
            noise = (self.config.target_noise * torch.randn_like(actions)).clamp(-clip, clip)
            smoothed[name] = (actions + noise).clamp(-1.0, 1.0)
        return smoothed
