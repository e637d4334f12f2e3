"""The DQN family: DQN -> Double DQN -> Dueling DQN -> D3QN, one learning rule with two flags.

:meth:`DQN.update`, top to bottom (the loss is :func:`dqn_loss`, which ``compile()`` makes one graph
with its gradient step): Q(s, a) of the sampled actions; the target
``r + discount * Q_target(s', a*)`` where ``a*`` is ``argmax Q_target(s')`` (DQN) or
``argmax Q_online(s')`` (``double``); the Huber loss; a gradient step with norm clipping; and the target
network update (a hard copy every ``target_update_interval`` updates, or Polyak with ``tau < 1``).
``dueling`` splits the network's head into a state value and action advantages. ``discount`` folds in
n-step returns and terminal states (see ``phalanx.buffers.ReplayBatch``).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from phalanx.algos.base import (
    ActingModule,
    ExplorationPolicy,
    OffPolicyAlgorithm,
    OffPolicyConfig,
    PolyakPair,
    no_stochastic_policy,
)
from phalanx.buffers import ReplayBatch
from phalanx.config import TrainConfig, check
from phalanx.gradient_step import GradientStep
from phalanx.nets import activation_class, feature_encoder, layer_init, mlp
from phalanx.optim import make_adam


@dataclass
class DQNConfig(OffPolicyConfig):
    """Deep Q-Network (Mnih et al., 2015)."""

    learning_rate: float = 1e-4
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "relu"
    buffer_size: int = 100_000
    batch_size: int = 64
    learning_starts: int = 1_000
    tau: float = 1.0
    target_update_interval: int = 500
    """Gradient steps between target updates (each a hard copy when tau = 1, else a Polyak step)."""
    exploration_initial: float = 1.0
    """Epsilon of the epsilon-greedy policy at the start."""
    exploration_final: float = 0.05
    """Epsilon after the decay."""
    exploration_steps: int = 10_000
    """Environment steps over which epsilon decays linearly (absolute, so a resume keeps the schedule)."""
    max_grad_norm: float | None = 10.0
    """Clip the gradient norm (None: no clipping)."""
    double: bool = False
    """Double DQN: the online network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling network: Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)."""
    replay_stacked_frames: int = 1
    """Image observations that are stacks of k frames along their first axis (Atari's 4 x 84 x 84): k
    makes the replay store each frame once rather than 2k times and rebuild the stacks when it samples
    (exact: every step is compared with what is stored). 1: each observation stored once, whole."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(
            isinstance(self.replay_stacked_frames, int) and self.replay_stacked_frames >= 1,
            "replay_stacked_frames",
            self.replay_stacked_frames,
            "an integer >= 1 (the frames stacked in an image observation; 1: none)",
        )
        check(self.target_update_interval >= 1, "target_update_interval", self.target_update_interval, ">= 1")
        for name in ("exploration_initial", "exploration_final"):
            check(0 <= getattr(self, name) <= 1, name, getattr(self, name), "a probability in [0, 1]")
        check(self.exploration_steps >= 1, "exploration_steps", self.exploration_steps, "an integer >= 1")
        check(
            self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "> 0"
        )


@dataclass
class DoubleDQNConfig(DQNConfig):
    """Double DQN (van Hasselt et al., 2016)."""

    double: bool = True


@dataclass
class DuelingDQNConfig(DQNConfig):
    """Dueling DQN (Wang et al., 2016)."""

    dueling: bool = True


@dataclass
class D3QNConfig(DQNConfig):
    """Dueling Double DQN."""

    double: bool = True
    dueling: bool = True


class QNetwork(nn.Module):
    """Q-values ``(B, num_actions)`` of observations ``(B, *obs_shape)``: an encoder (a CNN for images, see
    :func:`phalanx.nets.feature_encoder`; none for flat vectors), then a plain MLP or a dueling head on a
    shared trunk; ``layer_norm``: a LayerNorm before each hidden activation (PQN's)."""

    def __init__(
        self,
        encoder: nn.Module | None,
        in_dim: int,
        num_actions: int,
        hidden_sizes: tuple[int, ...],
        activation: str,
        dueling: bool,
        layer_norm: bool = False,
    ):
        super().__init__()
        self.encoder = encoder if encoder is not None else nn.Identity()
        self.dueling = dueling
        if not dueling:
            self.q = mlp(in_dim, hidden_sizes, num_actions, activation, layer_norm=layer_norm)
            return
        *trunk_sizes, width = hidden_sizes or (64,)
        last_norm = [nn.LayerNorm(width)] if layer_norm else []
        self.trunk = nn.Sequential(
            mlp(in_dim, trunk_sizes, width, activation, layer_norm=layer_norm),
            *last_norm,
            activation_class(activation)(),
        )
        self.value = layer_init(nn.Linear(width, 1), 1.0)
        self.advantage = layer_init(nn.Linear(width, num_actions), 1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.encoder(obs)  # (B, feature_dim)
        if not self.dueling:
            return self.q(features)
        features = self.trunk(features)
        advantage = self.advantage(features)  # (B, A)
        return self.value(features) + advantage - advantage.mean(dim=1, keepdim=True)


class GreedyActing(ActingModule):
    """DQN's acting: the action of the largest Q-value."""

    def __init__(self, q_network: nn.Module) -> None:
        super().__init__()
        self.q_network = q_network

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q_network(obs).argmax(dim=-1)


class EpsilonSchedule:
    """Epsilon after ``steps`` env steps: linear from ``exploration_initial`` to ``exploration_final``
    over ``exploration_steps``, then constant (absolute steps, so a resume keeps the schedule)."""

    def __init__(self, config: DQNConfig) -> None:
        self.initial = config.exploration_initial
        self.final = config.exploration_final
        self.steps = config.exploration_steps

    def __call__(self, steps: int) -> float:
        fraction = min(steps / self.steps, 1.0)
        return self.initial + fraction * (self.final - self.initial)


class EpsilonGreedy(ExplorationPolicy):
    """DQN's exploration: the greedy action of ``q_network``, or with probability epsilon a uniform one.

    ``epsilon`` is the value of the last step it acted on (:meth:`advance_to`), a plain float.
    """

    def __init__(self, q_network: nn.Module, num_actions: int, schedule: EpsilonSchedule) -> None:
        super().__init__()
        self.q_network = q_network
        self.num_actions = num_actions
        self.schedule = schedule
        self.epsilon = schedule(0)

    def advance_to(self, steps: int) -> None:
        self.epsilon = self.schedule(steps)

    @torch.no_grad()
    def forward(self, obs: torch.Tensor, steps: int) -> torch.Tensor:
        self.advance_to(steps)
        greedy = self.q_network(obs).argmax(dim=1)  # (N,)
        random = torch.randint(self.num_actions, greedy.shape, device=obs.device)
        explore = torch.rand(greedy.shape, device=obs.device) < self.epsilon
        return torch.where(explore, random, greedy)


def dqn_loss(
    q_network: nn.Module, q_target: nn.Module, batch: ReplayBatch, double: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The DQN family's TD loss: the Huber loss of ``batch``'s TD errors, and the Q-values ``(B,)`` of its
    actions (detached). The target is ``r + discount * Q_target(s', a*)`` with ``a*`` the argmax of
    ``Q_target(s')``, or (``double``) of ``Q_online(s')``; ``discount`` folds in n-step returns and
    terminal states."""
    with torch.no_grad():
        next_q_target = q_target(batch.next_obs)  # (B, A)
        if double:
            next_actions = q_network(batch.next_obs).argmax(dim=1, keepdim=True)
        else:
            next_actions = next_q_target.argmax(dim=1, keepdim=True)
        next_values = next_q_target.gather(1, next_actions).squeeze(1)  # (B,)
        targets = batch.rewards + batch.discounts * next_values
    q_values = q_network(batch.obs).gather(1, batch.actions.long().unsqueeze(1)).squeeze(1)  # (B,)
    return F.smooth_l1_loss(q_values, targets), q_values.detach()


class DQN(OffPolicyAlgorithm):
    name = "dqn"
    config_class = DQNConfig
    action_spaces = (gym.spaces.Discrete,)
    observations = ("flat", "image")
    config: DQNConfig

    def __init__(self, config: DQNConfig, observation_space: gym.Space, action_space: gym.Space, device):
        super().__init__(config, observation_space, action_space, device)
        assert isinstance(action_space, gym.spaces.Discrete), "check_spaces: Discrete actions"
        self.num_actions = int(action_space.n)
        encoder, feature_dim = feature_encoder(observation_space, config.encoder)
        self.q_network = QNetwork(
            encoder,
            feature_dim,
            self.num_actions,
            config.hidden_sizes,
            config.activation,
            config.dueling,
        ).to(self.device)
        self.q_target = copy.deepcopy(self.q_network).requires_grad_(False)
        self.q_parameters = list(self.q_network.parameters())
        self.q_polyak = PolyakPair(self.q_target, self.q_network)
        self.optimizer = make_adam(self.q_parameters, lr=config.learning_rate)
        self.updates = 0
        self.gradient_step: GradientStep | None = None
        """The compiled gradient step (:meth:`compile`); None: the eager step, the reference."""
        self.exploration = EpsilonGreedy(self.q_network, self.num_actions, EpsilonSchedule(config))

    def exploration_policy(self) -> EpsilonGreedy:
        return self.exploration

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self.q_network(obs).argmax(dim=1)

    def acting_module(self, stochastic: bool = False) -> GreedyActing:
        if stochastic:
            raise no_stochastic_policy(
                self.name,
                "it acts greedily on its Q-values (epsilon-greedy exploration is for training only)",
            )
        return GreedyActing(self.q_network)

    def compile(self) -> list[str]:
        """Run :meth:`update`'s gradient step (TD target, Huber loss, gradient, clipping, Adam) as one
        compiled graph from now on (:class:`~phalanx.gradient_step.GradientStep`); the target network's update
        stays one foreach op. Learners of a data-parallel group step eagerly (their gradients are
        averaged between backward and clipping)."""
        if self.gradient_step is None:
            self.gradient_step = GradientStep(
                self.optimizer,  # type: ignore[arg-type]  # make_adam builds a flat one
                [self.q_network],
                functools.partial(dqn_loss, self.q_network, self.q_target, double=self.config.double),
                self.config.max_grad_norm,
            )
            self.gradient_step.compile()
        return ["update"]

    def update(self, batch: ReplayBatch, progress: float) -> dict[str, torch.Tensor]:
        config = self.config
        if self.gradient_step is not None and self.group is None:
            with torch.no_grad():  # the step differentiates with torch.func, which no_grad leaves alone
                loss, q_values = self.gradient_step(batch)
        else:
            loss, q_values = dqn_loss(self.q_network, self.q_target, batch, config.double)
            assert self.optimizer is not None, "a learning algorithm has its optimiser"
            self.minimise(loss, self.optimizer, config.max_grad_norm)
        self.updates += 1
        if self.updates % config.target_update_interval == 0:
            self.q_polyak.update(config.tau)
        return {
            "q_loss": loss.detach(),
            "q_mean": q_values.mean(),
            "epsilon": torch.tensor(self.exploration.epsilon),
        }


class DoubleDQN(DQN):
    name = "double-dqn"
    config_class = DoubleDQNConfig


class DuelingDQN(DQN):
    name = "dueling-dqn"
    config_class = DuelingDQNConfig


class D3QN(DQN):
    name = "d3qn"
    config_class = D3QNConfig
