"""QMIX (Rashid et al., 2018) and VDN (Sunehag et al., 2018): cooperative Q-learning with a mixed team value.

Each agent group is a team. Its agents have Q-networks ``Q_a(o_a, u_a)`` on their own observations
(decentralised execution: an agent acts greedily on its own Q-values), and a mixer combines the chosen
actions' Q-values into the team's ``Q_tot(s, u)``, learned with one TD target per transition:

    y = team_reward + discount * Q_tot_target(Q_target_a(o'_a, u*_a) for each agent a, s')

where ``u*_a = argmax Q_a(o'_a)`` over the agent's allowed actions (double Q-learning, on by default as
in QMIX: the online networks pick, the target networks value; ``double=False``: the target networks
pick too). Since ``Q_tot`` is monotonic in every ``Q_a``, each agent's greedy action is the team's greedy
joint action: that is what makes decentralised acting consistent. The team reward is the sum (or mean,
``team_reward``) of the group's per-agent rewards; the loss is the squared TD error of ``Q_tot``, summed
over the groups (each group is a team with its own networks).

- QMIX's mixer is a network on the agents' Q-values whose weights come from hypernetworks of the global
  state, made non-negative with ``abs`` (monotonic); its biases are state-dependent, the last one a
  state value ``V(s)``.
- VDN's mixer is the sum of the agents' Q-values; it is the only difference (:class:`VDN`).

The rest is DQN's (:mod:`phalanx.algos.dqn`): the Q-network (optionally dueling), the epsilon-greedy
exploration schedule, target networks copied every ``target_update_interval`` updates (or Polyak with
``tau < 1``), gradient-norm clipping. Agents of a group share one Q-network with a one-hot agent id in
its input (``share_parameters``), or have one each, evaluated as one ensemble. Action masks
(``action_mask``, ``next_action_mask``) exclude actions from the greedy choice, the random ones and the
targets' next actions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from phalanx.algos.base import ActingModule, PolyakPair, no_stochastic_policy
from phalanx.algos.dqn import DQNConfig, EpsilonSchedule, QNetwork
from phalanx.config import TrainConfig, check
from phalanx.errors import CheckpointError
from phalanx.marl.base import MultiAgentAlgorithm, agent_id_dim, with_agent_ids
from phalanx.marl.buffers import MultiAgentBatch
from phalanx.marl.core import AgentGroup, Groups, MultiAgentSpec, Tensor
from phalanx.nets import EnsembleMLP, mlp
from phalanx.optim import make_adam

TEAM_REWARDS = ("sum", "mean")
MIXER_OUTPUT_GAIN = 0.3
"""Init gain of the hypernetworks' output layers. With gain 1, the initial mixer multiplies the agents'
Q-values by ~6 (dQ_tot/dQ_a) and adds ~+4 on simple_spread's states, and QMIX's values there diverged
within 20k env steps; 0.3 starts the mixer near a sum with weights ~0.6, as PyTorch's default init does
in the reference implementation (pymarl)."""


@dataclass
class ValueDecompositionConfig(DQNConfig):
    """What QMIX and VDN share: DQN's settings, for teams of agents with a mixed team value.

    The defaults suit MPE ``simple_spread`` (25-step episodes, negative rewards): Polyak target updates
    after every gradient step and gamma 0.9, as BenchMARL's; with gamma 0.95 or 0.99, QMIX's values on
    simple_spread drift upwards and diverge within 50-100k env steps (the mixing weights grow, and the
    maximum in every target is amplified as much).
    """

    learning_rate: float = 5e-4
    gamma: float = 0.9
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "relu"
    buffer_size: int = 200_000
    batch_size: int = 256
    learning_starts: int = 5_000
    updates_per_step: float = 0.25
    tau: float = 0.005
    target_update_interval: int = 1
    exploration_steps: int = 100_000
    double: bool = True
    share_parameters: bool = True
    """Agents of a group share one Q-network, told apart by a one-hot agent id in its input (False: one
    Q-network per agent, evaluated together as an ensemble)."""
    team_reward: str = "sum"
    """How a group's per-agent rewards become the team reward the group learns from: sum or mean."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(self.team_reward in TEAM_REWARDS, "team_reward", self.team_reward, f"one of {TEAM_REWARDS}")


@dataclass
class QMIXConfig(ValueDecompositionConfig):
    """QMIX: agent Q-values mixed by a monotonic network conditioned on the global state."""

    mixing_embed_dim: int = 32
    """Width of the mixing network's hidden layer (on the agents' Q-values)."""
    hypernet_hidden: int = 64
    """Hidden width of the hypernetworks that produce the mixing weights from the global state."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(self.mixing_embed_dim >= 1, "mixing_embed_dim", self.mixing_embed_dim, "an integer >= 1")
        check(self.hypernet_hidden >= 1, "hypernet_hidden", self.hypernet_hidden, "an integer >= 1")


@dataclass
class VDNConfig(ValueDecompositionConfig):
    """VDN: the team value is the sum of the agents' Q-values."""


class AgentQNetworks(nn.Module):
    """Q-values ``(..., A, num_actions)`` of a group's A agents from their observations ``(..., A, obs_dim)``.

    Shared: one :class:`~phalanx.algos.dqn.QNetwork` on the observation and the agent's one-hot id.
    Separate: one MLP per agent, an :class:`~phalanx.nets.EnsembleMLP` with the agent as its member.
    """

    def __init__(
        self, num_agents: int, obs_dim: int, num_actions: int, config: ValueDecompositionConfig
    ) -> None:
        super().__init__()
        self.num_agents = num_agents
        self.num_actions = num_actions
        self.shared = config.share_parameters
        self.dueling = config.dueling
        if self.shared:
            in_dim = obs_dim + agent_id_dim(num_agents)
            self.net: nn.Module = QNetwork(
                None, in_dim, num_actions, config.hidden_sizes, config.activation, config.dueling
            )
        else:  # a dueling head is one more output: the state value
            out_dim = num_actions + int(config.dueling)
            self.net = EnsembleMLP(num_agents, obs_dim, config.hidden_sizes, out_dim, config.activation)

    def forward(self, obs: Tensor) -> Tensor:
        leading = obs.shape[:-2]
        if self.shared:
            inputs = with_agent_ids(obs).flatten(0, -2)  # (M * A, obs_dim + A)
            return self.net(inputs).view(*leading, self.num_agents, self.num_actions)
        inputs = obs.reshape(-1, self.num_agents, obs.shape[-1]).transpose(0, 1)  # (A, M, obs_dim)
        out = self.net(inputs).transpose(0, 1)  # (M, A, out_dim)
        if self.dueling:
            value, advantage = out[..., :1], out[..., 1:]
            out = value + advantage - advantage.mean(dim=-1, keepdim=True)
        return out.reshape(*leading, self.num_agents, self.num_actions)


class MonotonicMixer(nn.Module):
    """QMIX's mixer: ``Q_tot = w2(s) . elu(W1(s) q + b1(s)) + V(s)`` with ``W1, w2 >= 0`` (abs of the
    hypernetworks' outputs), so that ``dQ_tot / dq_a >= 0`` for every agent a."""

    def __init__(self, num_agents: int, state_dim: int, embed_dim: int, hypernet_hidden: int) -> None:
        super().__init__()
        self.num_agents = num_agents
        self.embed_dim = embed_dim
        gain = MIXER_OUTPUT_GAIN
        self.hyper_w1 = mlp(state_dim, (hypernet_hidden,), num_agents * embed_dim, "relu", gain)
        self.hyper_b1 = mlp(state_dim, (), embed_dim, output_gain=gain)
        self.hyper_w2 = mlp(state_dim, (hypernet_hidden,), embed_dim, "relu", gain)
        self.value = mlp(state_dim, (embed_dim,), 1, "relu", gain)  # V(s): the last bias

    def forward(self, agent_q: Tensor, state: Tensor) -> Tensor:
        """``Q_tot`` ``(B,)`` of the agents' Q-values ``(B, A)`` in global states ``(B, S)``."""
        w1 = self.hyper_w1(state).abs().view(-1, self.num_agents, self.embed_dim)  # (B, A, E)
        b1 = self.hyper_b1(state).unsqueeze(1)  # (B, 1, E)
        hidden = F.elu(torch.bmm(agent_q.unsqueeze(1), w1) + b1)  # (B, 1, E)
        w2 = self.hyper_w2(state).abs().unsqueeze(2)  # (B, E, 1)
        return torch.bmm(hidden, w2).view(-1) + self.value(state).view(-1)  # (B,)


class SumMixer(nn.Module):
    """VDN's mixer: ``Q_tot`` is the sum of the agents' Q-values (the state is not used)."""

    def forward(self, agent_q: Tensor, state: Tensor) -> Tensor:
        return agent_q.sum(dim=-1)  # (B,)


def masked_argmax(q_values: Tensor, mask: Tensor | None) -> Tensor:
    """The greedy actions ``(..., A)`` of Q-values ``(..., A, n)`` among the allowed ones (mask true)."""
    if mask is not None:
        q_values = q_values.masked_fill(~mask, float("-inf"))
    return q_values.argmax(dim=-1)


class GreedyAgentsActing(ActingModule):
    """QMIX's and VDN's acting for one agent group: each agent's greedy action on its own Q-values,
    among the allowed ones where the env has action masks (``action_mask`` ``(B, A_g, n)``, true where
    allowed)."""

    def __init__(self, q_network: AgentQNetworks, masked: bool) -> None:
        super().__init__(action_mask=masked)
        self.q_network = q_network

    def forward(self, obs: Tensor, action_mask: Tensor | None = None) -> Tensor:
        return masked_argmax(self.q_network(obs), action_mask)


def _num_actions(group: AgentGroup) -> int:
    """The actions of each agent of ``group`` (value decomposition learns Discrete actions: check_spec)."""
    assert isinstance(group.action_space, gym.spaces.Discrete), "discrete actions (action_kinds)"
    return int(group.action_space.n)


class QMIX(MultiAgentAlgorithm):
    """QMIX for every agent group of a multi-agent env with Discrete actions (see the module docstring)."""

    name = "qmix"
    config_class: ClassVar[type[ValueDecompositionConfig]] = QMIXConfig
    on_policy = False
    action_kinds = ("discrete",)
    config: QMIXConfig  # VDN: VDNConfig
    extra_state = ("updates",)

    def __init__(self, config: ValueDecompositionConfig, spec: MultiAgentSpec, device: torch.device) -> None:
        super().__init__(config, spec, device)
        self.q_networks: dict[str, AgentQNetworks] = {}
        self.mixers: dict[str, nn.Module] = {}
        for name, group in spec.groups.items():
            obs_dim, num_actions = int(group.observation_space.shape[0]), _num_actions(group)
            q_network = AgentQNetworks(group.num_agents, obs_dim, num_actions, config)
            self.q_networks[name] = q_network.to(self.device)
            self.mixers[name] = self.make_mixer(group.num_agents, spec.state_dim).to(self.device)
        self.q_targets = {name: _frozen_copy(net) for name, net in self.q_networks.items()}
        self.mixer_targets = {name: _frozen_copy(mixer) for name, mixer in self.mixers.items()}
        online = nn.ModuleList([*self.q_networks.values(), *self.mixers.values()])
        self.polyak = PolyakPair(
            nn.ModuleList([*self.q_targets.values(), *self.mixer_targets.values()]), online
        )
        self.optimizer = make_adam(list(online.parameters()), lr=config.learning_rate)
        self.updates = 0
        self.schedule = EpsilonSchedule(config)  # DQN's
        self.epsilon = self.schedule(0)  # of the last explore()

    def make_mixer(self, num_agents: int, state_dim: int) -> nn.Module:
        """The mixer of a group of ``num_agents`` agents: ``(agent_q (B, A), state (B, S)) -> Q_tot (B,)``."""
        config = self.config
        return MonotonicMixer(num_agents, state_dim, config.mixing_embed_dim, config.hypernet_hidden)

    # -- acting ------------------------------------------------------------------------------------
    @torch.no_grad()
    def explore(self, obs: Groups, state: Tensor, action_mask: Groups | None, steps: int) -> Groups:
        """Epsilon-greedy actions ``(N, A_g)`` per group; epsilon follows DQN's schedule over ``steps``."""
        epsilon = self.epsilon = self.schedule(steps)
        greedy = self.act(obs, action_mask)
        random = self.random_actions(next(iter(obs.values())).shape[0], action_mask)
        actions: Groups = {}
        for name, greedy_actions in greedy.items():
            explore = torch.rand(greedy_actions.shape, device=self.device) < epsilon  # (N, A)
            actions[name] = torch.where(explore, random[name], greedy_actions)
        return actions

    def random_actions(self, num_envs: int, action_mask: Groups | None = None) -> Groups:
        """Uniform actions ``(num_envs, A_g)`` per group, among the allowed ones where masked."""
        actions: Groups = {}
        for name, group in self.spec.groups.items():
            mask = None if action_mask is None else action_mask.get(name)
            if mask is None:
                actions[name] = torch.randint(
                    _num_actions(group), (num_envs, group.num_agents), device=self.device
                )
            else:  # the argmax of uniform noise over the allowed actions
                noise = torch.rand(mask.shape, device=self.device).masked_fill(~mask, -1.0)  # (N, A, n)
                actions[name] = noise.argmax(dim=-1)
        return actions

    @torch.no_grad()
    def act(  # type: ignore[override]  # groups of observations in, as MultiAgentAlgorithm.act
        self, obs: Groups, action_mask: Groups | None = None, deterministic: bool = True
    ) -> Groups:
        """Each agent's greedy action ``(N, A_g)`` on its own observation (Q-learning's policy is greedy,
        so ``deterministic`` changes nothing)."""
        return {
            name: masked_argmax(q_network(obs[name]), None if action_mask is None else action_mask.get(name))
            for name, q_network in self.q_networks.items()
        }

    def group_acting_module(self, group: str, stochastic: bool = False) -> GreedyAgentsActing:
        if stochastic:
            raise no_stochastic_policy(
                self.name,
                "its agents act greedily on their Q-values (epsilon-greedy exploration is for training only)",
            )
        return GreedyAgentsActing(self.q_networks[group], self.spec.has_action_mask)

    # -- learning ----------------------------------------------------------------------------------
    def update(self, batch: MultiAgentBatch, progress: float) -> dict[str, Tensor]:
        config = self.config
        next_masks = batch.next_action_mask or {}
        loss: Tensor | float = 0.0
        q_tot_means, target_means = [], []
        for name, q_network in self.q_networks.items():
            with torch.no_grad():
                next_q_target = self.q_targets[name](batch.next_obs[name])  # (B, A, n)
                next_q_picker = q_network(batch.next_obs[name]) if config.double else next_q_target
                next_actions = masked_argmax(next_q_picker, next_masks.get(name))  # (B, A)
                next_agent_q = next_q_target.gather(2, next_actions.unsqueeze(2)).squeeze(2)  # (B, A)
                next_q_tot = self.mixer_targets[name](next_agent_q, batch.next_state)  # (B,)
                rewards = batch.rewards[name]  # (B, A)
                team_reward = rewards.sum(dim=1) if config.team_reward == "sum" else rewards.mean(dim=1)
                targets = team_reward + batch.discounts * next_q_tot  # (B,)
            q_values = q_network(batch.obs[name])  # (B, A, n)
            agent_q = q_values.gather(2, batch.actions[name].long().unsqueeze(2)).squeeze(2)  # (B, A)
            q_tot = self.mixers[name](agent_q, batch.state)  # (B,)
            loss = loss + F.mse_loss(q_tot, targets)
            q_tot_means.append(q_tot.detach().mean())
            target_means.append(targets.mean())

        assert isinstance(loss, Tensor), "a spec has at least one group"
        assert self.optimizer is not None, "a learning algorithm has its optimiser"
        self.minimise(loss, self.optimizer, config.max_grad_norm)
        self.updates += 1
        if self.updates % config.target_update_interval == 0:
            self.polyak.update(config.tau)
        return {
            "td_loss": loss.detach(),
            "q_tot": torch.stack(q_tot_means).mean(),
            "target": torch.stack(target_means).mean(),
            "epsilon": torch.tensor(self.epsilon),
        }

    # -- checkpoints -------------------------------------------------------------------------------
    def state_entries(self) -> dict[str, Any]:
        """Per group its networks and their targets, then the one optimiser."""
        return {
            "groups": {
                name: {
                    "q_network": self.q_networks[name],
                    "mixer": self.mixers[name],
                    "q_target": self.q_targets[name],
                    "mixer_target": self.mixer_targets[name],
                }
                for name in self.spec.groups
            },
            "optimizer": self.optimizer,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state["groups"]) != set(self.spec.groups):
            raise CheckpointError(
                f"{self.name} checkpoint holds the agent groups {sorted(state['groups'])}, but this env has "
                f"{sorted(self.spec.groups)}; load it with the env it was trained on."
            )
        super().load_state_dict(state)


class VDN(QMIX):
    """VDN: QMIX with the sum of the agents' Q-values as the mixer."""

    name = "vdn"
    config_class = VDNConfig

    def make_mixer(self, num_agents: int, state_dim: int) -> nn.Module:
        return SumMixer()


def _frozen_copy(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module).requires_grad_(False)
