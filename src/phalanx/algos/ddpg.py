"""DDPG, and the ensemble-critic machinery that TD3, SAC and REDQ build on.

The K critics are one :class:`~phalanx.nets.EnsembleMLP` (a leading member dimension, batched
matmuls), not a loop of K modules. :meth:`EnsembleCriticAlgorithm.update`, top to bottom:

1. the TD target ``r + discount * V(s')`` where ``V(s')`` reduces the K target critics at the next
   action by ``min``, ``mean`` or REDQ's ``min`` over a random subset of M; subclasses choose the next
   action (DDPG: the target actor; TD3: plus clipped noise; SAC: a sample, minus alpha * log-prob);
2. the critics' loss: squared TD error summed over members, averaged over the batch;
3. every ``policy_delay`` updates, the actor's loss (``-mean over critics of Q(s, pi(s))``, plus the
   entropy term for SAC) and a Polyak step of the target networks.

``discount`` folds in n-step returns and terminal states (``phalanx.buffers.ReplayBatch``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch import nn

from phalanx.algos.base import ExplorationPolicy, OffPolicyAlgorithm, OffPolicyConfig, PolyakPair
from phalanx.buffers import ReplayBatch
from phalanx.config import TrainConfig, check
from phalanx.nets import EnsembleMLP, mlp, obs_dim
from phalanx.optim import make_adam

TARGET_REDUCTIONS = ("min", "mean", "redq")


@dataclass
class EnsembleCriticConfig(OffPolicyConfig):
    """Continuous control with an ensemble of K critics."""

    learning_rate: float = 1e-3
    """Actor learning rate."""
    critic_learning_rate: float | None = None
    """Critic learning rate (None: the actor's)."""
    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    num_critics: int = 1
    """K critics trained as one batched network."""
    target_reduction: str = "min"
    """How the K target critics combine into V(s'): min, mean, or redq (min over a random subset)."""
    target_subset: int = 2
    """M, the size of REDQ's random subset of critics (target_reduction = redq)."""
    policy_delay: int = 1
    """Critic updates per actor (and target network) update."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        lr = self.critic_learning_rate
        check(
            lr is None or lr > 0, "critic_learning_rate", lr, "a positive number, or None for learning_rate"
        )
        check(self.num_critics >= 1, "num_critics", self.num_critics, "an integer >= 1")
        check(
            self.target_reduction in TARGET_REDUCTIONS,
            "target_reduction",
            self.target_reduction,
            f"one of {TARGET_REDUCTIONS}",
        )
        if self.target_reduction == "redq":
            check(
                1 <= self.target_subset <= self.num_critics,
                "target_subset",
                self.target_subset,
                f"REDQ's subset size M between 1 and num_critics K = {self.num_critics} (M <= K); "
                "raise num_critics or lower target_subset",
            )
        check(self.policy_delay >= 1, "policy_delay", self.policy_delay, "an integer >= 1")


@dataclass
class DDPGConfig(EnsembleCriticConfig):
    """Deep Deterministic Policy Gradient (Lillicrap et al., 2016)."""

    exploration_noise: float = 0.1
    """Standard deviation of the Gaussian noise added to actions in [-1, 1] during collection."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(self.exploration_noise >= 0, "exploration_noise", self.exploration_noise, ">= 0")


class EnsembleCriticAlgorithm(OffPolicyAlgorithm):
    """The critic machinery shared by DDPG, TD3, SAC and REDQ; subclasses supply the actor."""

    action_spaces = (gym.spaces.Box,)
    config: EnsembleCriticConfig

    def __init__(
        self, config: EnsembleCriticConfig, observation_space: gym.Space, action_space: gym.Space, device
    ):
        super().__init__(config, observation_space, action_space, device)
        self.obs_dim = obs_dim(observation_space)
        self.action_dim = int(action_space.shape[0])
        self.actor = self.make_actor().to(self.device)
        self.critic = EnsembleMLP(
            config.num_critics, self.obs_dim + self.action_dim, config.hidden_sizes, 1, config.activation
        ).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_parameters = list(self.critic.parameters())
        self.critic_polyak = PolyakPair(self.critic_target, self.critic)
        self.actor_optimizer = make_adam(list(self.actor.parameters()), lr=config.learning_rate)
        critic_lr = config.critic_learning_rate or config.learning_rate
        self.critic_optimizer = make_adam(self.critic_parameters, lr=critic_lr)
        self.updates = 0

    # -- what subclasses define ------------------------------------------------------------------
    def make_actor(self) -> nn.Module:
        raise NotImplementedError

    def next_value(self, next_obs: torch.Tensor) -> torch.Tensor:
        """V(s') of the TD target, (B,)."""
        raise NotImplementedError

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def update_targets(self) -> None:
        self.critic_polyak.update(self.config.tau)

    # -- the shared critic -----------------------------------------------------------------------
    def q_values(self, critic: EnsembleMLP, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q of every member, (K, B)."""
        return critic(torch.cat([obs, actions], dim=-1)).squeeze(-1)

    def reduce_critics(self, q_values: torch.Tensor) -> torch.Tensor:
        """Combine the target critics (K, B) into one value (B,)."""
        reduction = self.config.target_reduction
        if reduction == "mean":
            return q_values.mean(dim=0)
        if reduction == "redq":  # min over a random subset of M members, redrawn every update
            subset = torch.randperm(q_values.shape[0], device=q_values.device)[: self.config.target_subset]
            return q_values[subset].min(dim=0).values
        return q_values.min(dim=0).values

    def update(self, batch: ReplayBatch, progress: float) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            targets = batch.rewards + batch.discounts * self.next_value(batch.next_obs)  # (B,)
        q_values = self.q_values(self.critic, batch.obs, batch.actions)  # (K, B)
        critic_loss = (q_values - targets).pow(2).mean(dim=1).sum()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.optimizer_step(self.critic_optimizer)
        self.updates += 1

        metrics = {"critic_loss": critic_loss.detach(), "q_mean": q_values.detach().mean()}
        if self.updates % self.config.policy_delay == 0:
            self.set_critic_grad(False)  # the actor's loss moves the actor only
            actor_loss, actor_metrics = self.actor_loss(batch.obs)
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.optimizer_step(self.actor_optimizer)
            self.set_critic_grad(True)
            self.after_actor_step(actor_metrics)
            self.update_targets()
            metrics.update(
                actor_loss=actor_loss.detach(), **{k: v.detach() for k, v in actor_metrics.items()}
            )
        return metrics

    def set_critic_grad(self, requires_grad: bool) -> None:
        """``critic.requires_grad_`` on the cached parameter list (no walk over the submodules)."""
        for parameter in self.critic_parameters:
            parameter.requires_grad_(requires_grad)

    def after_actor_step(self, actor_metrics: dict[str, torch.Tensor]) -> None:
        """Hook after each actor step (SAC tunes its temperature here)."""


class GaussianExploration(ExplorationPolicy):
    """DDPG's exploration: the deterministic actor's action plus Gaussian noise, clipped to [-1, 1]."""

    def __init__(self, actor: nn.Module, noise: float) -> None:
        super().__init__()
        self.actor = actor
        self.noise = noise

    @torch.no_grad()
    def forward(self, obs: torch.Tensor, steps: int) -> torch.Tensor:
        actions = self.actor(obs)
        return (actions + self.noise * torch.randn_like(actions)).clamp(-1.0, 1.0)


class DDPG(EnsembleCriticAlgorithm):
    """A deterministic tanh actor with a target copy; Gaussian exploration noise."""

    name = "ddpg"
    config_class = DDPGConfig
    config: DDPGConfig

    def __init__(self, config: DDPGConfig, observation_space: gym.Space, action_space: gym.Space, device):
        super().__init__(config, observation_space, action_space, device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.actor_polyak = PolyakPair(self.actor_target, self.actor)
        self.exploration = GaussianExploration(self.actor, config.exploration_noise)

    def make_actor(self) -> nn.Module:
        config = self.config
        return nn.Sequential(
            mlp(self.obs_dim, config.hidden_sizes, self.action_dim, config.activation), nn.Tanh()
        )

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self.actor(obs)

    def exploration_policy(self) -> GaussianExploration:
        return self.exploration

    def next_actions(self, next_obs: torch.Tensor) -> torch.Tensor:
        return self.actor_target(next_obs)

    def next_value(self, next_obs: torch.Tensor) -> torch.Tensor:
        q_next = self.q_values(self.critic_target, next_obs, self.next_actions(next_obs))  # (K, B)
        return self.reduce_critics(q_next)

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return -self.q_values(self.critic, obs, self.actor(obs)).mean(), {}

    def update_targets(self) -> None:
        super().update_targets()
        self.actor_polyak.update(self.config.tau)
