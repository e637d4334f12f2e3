"""SAC (Haarnoja et al., 2018) on the ensemble-critic machinery, and REDQ as a SAC configuration.

What SAC adds to :mod:`phalanx.algos.ddpg`: a tanh-squashed Gaussian actor whose log-probability
carries the change-of-variables correction ``- sum log(1 - tanh(u)^2)``; the soft target
``min_k Q_k(s', a') - alpha * log pi(a'|s')`` with ``a' ~ pi(.|s')``; the actor loss
``alpha * log pi(a|s) - mean_k Q_k(s, a)``; and automatic entropy tuning, a gradient step on
``log alpha`` towards ``target_entropy`` (default ``-action_dim``).

REDQ (Chen et al., 2021) is SAC with K = 10 critics, targets from the min over a random subset of
M = 2, and a high update-to-data ratio: only its defaults differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from phalanx.algos.base import ActingModule, ExplorationPolicy
from phalanx.algos.ddpg import (
    GLOBAL_DRAWS,
    Draws,
    EnsembleCriticAlgorithm,
    EnsembleCriticConfig,
    EnsembleCriticLearner,
    LearningRule,
    TargetDraws,
    categorical_critic_loss,
    critic_values,
    member_view,
    q_values,
    reduce_critics,
    td_loss,
)
from phalanx.buffers import ReplayBatch
from phalanx.config import TrainConfig, check
from phalanx.nets import ActionNoise, mlp
from phalanx.optim import make_adam

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class SACConfig(EnsembleCriticConfig):
    """Soft Actor-Critic with automatic entropy tuning."""

    learning_rate: float = 3e-4
    num_critics: int = 2
    alpha_init: float = 1.0
    """Initial entropy temperature alpha."""
    learn_alpha: bool = True
    """Tune alpha so that the policy's entropy approaches target_entropy."""
    alpha_learning_rate: float | None = None
    """Learning rate of log alpha (None: learning_rate)."""
    target_entropy: float | None = None
    """Entropy target of the tuning (None: -action_dim)."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(self.alpha_init > 0, "alpha_init", self.alpha_init, "> 0")
        lr = self.alpha_learning_rate
        check(lr is None or lr > 0, "alpha_learning_rate", lr, "> 0, or None for learning_rate")


@dataclass
class REDQConfig(SACConfig):
    """Randomized Ensembled Double Q-learning: 10 critics, targets from the min of a random pair."""

    num_critics: int = 10
    target_reduction: str = "redq"
    target_subset: int = 2
    updates_per_step: float = 20.0
    policy_delay: int = 20


class SquashedGaussianActor(nn.Module):
    """pi(a|s) = tanh(N(mu(s), sigma(s))): actions in (-1, 1) with their exact log-probabilities."""

    def __init__(self, net: nn.Module) -> None:
        """``net`` maps observations to ``2 * action_dim`` outputs (:meth:`make` builds it; a population
        passes an EnsembleMLP of its members' nets, observations then ``(P, B, obs_dim)``)."""
        super().__init__()
        self.net = net

    @classmethod
    def make(
        cls, obs_dim: int, action_dim: int, hidden_sizes: tuple[int, ...], activation: str
    ) -> SquashedGaussianActor:
        return cls(mlp(obs_dim, hidden_sizes, 2 * action_dim, activation, output_gain=0.01))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        return mean, log_std

    def sample_action(self, obs: torch.Tensor, draws: Draws = GLOBAL_DRAWS) -> torch.Tensor:
        """An action (B, A) in (-1, 1), the one :meth:`sample` draws, without its log-probability (half
        the ops: acting needs no log-probability, and acting is on the env's critical path)."""
        mean, log_std = self(obs)
        return torch.tanh(mean + log_std.exp() * draws.normal(mean))

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log_prob)``: action (B, A) in (-1, 1), log_prob (B,), for standard normal ``noise``
        (B, A) (drawn by the caller, so that this is a function of tensors)."""
        mean, log_std = self(obs)
        pre_tanh = mean + log_std.exp() * noise
        gaussian_log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(dim=-1)
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|
        correction = (2 * (math.log(2.0) - pre_tanh - F.softplus(-2 * pre_tanh))).sum(dim=-1)
        return torch.tanh(pre_tanh), gaussian_log_prob - correction

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self(obs)[0])


class SquashedGaussianActing(ActingModule):
    """SAC's acting: ``tanh`` of the mean, or (stochastic) of the Gaussian sample ``mean + std * noise``
    for standard normal ``noise`` ``(B, action_dim)``, the action :meth:`SquashedGaussianActor.sample`
    gives."""

    def __init__(self, actor: SquashedGaussianActor, action_dim: int, stochastic: bool = False) -> None:
        super().__init__(ActionNoise("normal", action_dim) if stochastic else None)
        self.actor = actor

    def forward(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        if noise is None:
            return self.actor.deterministic(obs)
        return self.actor.sample(obs, noise)[0]


class SampledExploration(ExplorationPolicy):
    """SAC's exploration: an action sampled from the squashed Gaussian actor."""

    def __init__(self, actor: SquashedGaussianActor) -> None:
        super().__init__()
        self.actor = actor

    @torch.no_grad()
    def forward(self, obs: torch.Tensor, steps: int) -> torch.Tensor:
        return self.actor.sample_action(obs)


class SACLearner(EnsembleCriticLearner, Protocol):
    """What SAC's losses and temperature step need besides the critics' learner: the temperature,
    ``alpha`` and ``target_entropy``, scalars or ``(P,)`` for a population."""

    alpha: torch.Tensor
    target_entropy: float | torch.Tensor

    @property
    def actor(self) -> SquashedGaussianActor: ...

    def step_alpha(self, gradient: torch.Tensor) -> None:
        """One optimiser step of log(alpha) on its loss's closed-form ``gradient``."""


def sac_critic_loss(
    learner: SACLearner, batch: ReplayBatch, draws: TargetDraws, hp: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """SAC's critic loss: :func:`~phalanx.algos.ddpg.td_loss` towards the soft target, ``V(s')`` the K
    target critics at a sampled action ``a' ~ pi(.|s')`` reduced (min, mean, REDQ's subset) minus
    ``alpha * log pi(a'|s')``; with ``hp.critic_atoms``, :func:`~phalanx.algos.ddpg.categorical_critic_loss`
    at that action, ``alpha * log pi(a'|s')`` shifting the target distribution as the reward does."""
    assert draws.noise is not None, "SAC's rule draws the noise of the target actions"
    with torch.no_grad():
        next_actions, next_log_probs = learner.actor.sample(batch.next_obs, draws.noise)
    if hp.critic_atoms is not None:
        next_entropy = member_view(learner.alpha, next_log_probs) * next_log_probs
        return categorical_critic_loss(learner, batch, next_actions, next_entropy, hp)
    with torch.no_grad():
        q_next = q_values(learner.critic_target, batch.next_obs, next_actions)  # (K, B)
        q_next = reduce_critics(q_next, hp, draws.subset)  # (B,)
        next_values = q_next - member_view(learner.alpha, q_next) * next_log_probs
    return td_loss(learner.critic, batch, next_values)


def sac_actor_loss(
    learner: SACLearner, obs: torch.Tensor, noise: torch.Tensor | None, hp: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAC's actor loss ``alpha * log pi(a|s) - mean_k Q_k(s, a)`` for the action ``a`` of ``noise``;
    metrics: the entropy, and the log-probabilities for :func:`sac_alpha_step`. With ``hp.critic_atoms``,
    the critics' expected values reduced as the target is (min or mean), as FastTD3's actor does."""
    assert noise is not None, "SAC's rule draws the noise of the actor's actions"
    actions, log_probs = learner.actor.sample(obs, noise)
    values = critic_values(learner.critic, obs, actions, hp)  # (K, B)
    q_mean = values.mean(dim=-2) if hp.critic_atoms is None else reduce_critics(values, hp, None)  # (B,)
    loss = (member_view(learner.alpha, log_probs) * log_probs - q_mean).mean(dim=-1)
    return loss, {"entropy": -log_probs.detach().mean(dim=-1), "log_probs": log_probs.detach()}


def alpha_loss_gradient(log_probs: torch.Tensor, target_entropy: float | torch.Tensor) -> torch.Tensor:
    """The gradient of the temperature's loss ``-mean(log_alpha * (log_probs + target_entropy))`` in
    closed form: the same step as autograd's, without a backward pass for one scalar (``(P,)`` for P
    members)."""
    return -(log_probs.mean(dim=-1) + target_entropy)


def sac_alpha_step(learner: SACLearner, actor_metrics: dict[str, torch.Tensor], hp: Any) -> None:
    """After each actor step: the temperature's step (``hp.learn_alpha``) on the actor step's
    log-probabilities (taken out of ``actor_metrics``), and alpha into the metrics."""
    log_probs = actor_metrics.pop("log_probs")
    if hp.learn_alpha:
        learner.step_alpha(alpha_loss_gradient(log_probs, learner.target_entropy))
    actor_metrics["alpha"] = learner.alpha


SAC_RULE = LearningRule(
    sac_critic_loss, sac_actor_loss, next_action_noise=True, actor_noise=True, after_actor_step=sac_alpha_step
)
"""SAC: the soft target and actor loss (both sample actions), then the temperature's step."""


class SAC(EnsembleCriticAlgorithm):
    name = "sac"
    config_class = SACConfig
    vectorized_population: ClassVar[str | None] = "phalanx.population.vectorized_off_policy:VectorizedSAC"
    config: SACConfig
    actor: SquashedGaussianActor  # make_actor's
    extra_state = ("updates", "log_alpha")
    rule = SAC_RULE

    def __init__(self, config: SACConfig, observation_space: gym.Space, action_space: gym.Space, device):
        super().__init__(config, observation_space, action_space, device)
        self.log_alpha = torch.tensor(math.log(config.alpha_init), device=self.device, requires_grad=True)
        self.alpha_optimizer = make_adam(
            [self.log_alpha], lr=config.alpha_learning_rate or config.learning_rate
        )
        self.target_entropy = (
            -float(self.action_dim) if config.target_entropy is None else config.target_entropy
        )
        self.exploration = SampledExploration(self.actor)

    def make_actor(self) -> nn.Module:
        return SquashedGaussianActor.make(
            self.obs_dim, self.action_dim, self.config.hidden_sizes, self.config.activation
        )

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self.actor.deterministic(obs) if deterministic else self.actor.sample_action(obs)

    def acting_module(self, stochastic: bool = False) -> SquashedGaussianActing:
        return SquashedGaussianActing(self.actor, self.action_dim, stochastic)

    def exploration_policy(self) -> SampledExploration:
        return self.exploration

    def step_alpha(self, gradient: torch.Tensor) -> None:
        self.log_alpha.grad = gradient
        assert self.alpha_optimizer is not None, "a learning algorithm has its optimisers"
        self.optimizer_step(self.alpha_optimizer)


class REDQ(SAC):
    name = "redq"
    config_class = REDQConfig
    vectorized_population = None
