"""PQN: Q-learning on vectorized envs with no replay buffer and no target network (Gallici et al.,
"Simplifying Deep Temporal Difference Learning", ICLR 2025).

It collects rollouts as PPO does, ``horizon`` steps of every sub-env acted on epsilon-greedily, and
learns from each rollout once, in :meth:`PQN.update` (steps 1 to 3 in :func:`pqn_update`, which the
vectorized population's members share), to be read top to bottom:

1. Q(lambda) targets: ``G_t = r_t + gamma * [(1 - lambda) * max_a Q(s_{t+1}, a) + lambda * G_{t+1}]``,
   which is GAE's recursion (:func:`~phalanx.buffers.compute_gae`) with ``max_a Q`` as the value: a
   terminated episode does not bootstrap, a truncated one bootstraps from its final observation, and the
   recursion stops at either end;
2. the rollout flattened into samples (:class:`~phalanx.algos.ppo.FlatSampler`, PPO's);
3. ``epochs`` passes of shuffled minibatches, each a gradient step on the squared error of ``Q(s, a)`` to
   its target (:func:`pqn_loss`), gradient-norm clipped, with RAdam;
4. epsilon moved along its schedule for the next rollout, and the metrics.

What keeps this stable without a target network or a replay is the LayerNorm before each hidden
activation of the Q-network (``layer_norm``) and the many decorrelated sub-envs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from phalanx.algos.base import Algorithm, no_stochastic_policy
from phalanx.algos.dqn import GreedyActing, QNetwork
from phalanx.algos.ppo import FlatSampler, Sampler
from phalanx.buffers import RolloutBuffer, StepLayout, compute_gae, compute_gae_scan
from phalanx.config import AlgoConfig, TrainConfig, check, is_int
from phalanx.gradient_step import GradientStep
from phalanx.nets import feature_encoder
from phalanx.optim import anneal_learning_rate, make_radam

Tensor = torch.Tensor


@dataclass
class PQNConfig(AlgoConfig):
    """Parallelised Q-Network (PQN); the defaults are CleanRL pqn.py's."""

    learning_rate: float = 2.5e-4
    hidden_sizes: tuple[int, ...] = (120, 84)
    activation: str = "relu"
    horizon: int = 128
    """Steps each sub-env takes per rollout (rollout size = horizon * num_envs)."""
    epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 128
    """Samples per gradient step; at most horizon * num_envs."""
    q_lambda: float = 0.65
    """Lambda of the Q(lambda) targets: 0 is one-step Q-learning, 1 the Monte Carlo return."""
    layer_norm: bool = True
    """A LayerNorm before each hidden activation of the Q-network, in its CNN encoder too (what PQN's
    stability rests on)."""
    max_grad_norm: float | None = 10.0
    """Clip the global gradient norm to this value (None: no clipping)."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this in the targets (purejaxql scales CartPole's by 0.1); the logged
    episode returns stay the env's."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over total_steps."""
    exploration_initial: float = 1.0
    """Epsilon of the epsilon-greedy policy at the start."""
    exploration_final: float = 0.05
    """Epsilon at the end of the decay."""
    exploration_fraction: float = 0.5
    """Fraction of total_steps over which epsilon decays linearly to its final value."""
    exploration_final_lowest: float | None = None
    """Per-env epsilons: the sub-envs' final epsilons spread geometrically from exploration_final (the
    first sub-env) down to this (the last), so that some explore more than others (None: the same
    epsilon for every sub-env). Spread over the rows of each acting call: with --overlap, over each half."""

    def rollout_size(self, run: TrainConfig) -> int:
        return self.horizon * run.num_envs

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(is_int(self.horizon) and self.horizon >= 1, "horizon", self.horizon, "an integer >= 1")
        check(is_int(self.epochs) and self.epochs >= 1, "epochs", self.epochs, "an integer >= 1")
        rollout = self.rollout_size(run)
        check(
            is_int(self.minibatch_size) and 1 <= self.minibatch_size <= rollout,
            "minibatch_size",
            self.minibatch_size,
            f"an integer between 1 and the rollout size horizon * num_envs = {self.horizon} * "
            f"{run.num_envs} = {rollout}; lower minibatch_size or raise horizon or num_envs",
        )
        check(0.0 <= self.q_lambda <= 1.0, "q_lambda", self.q_lambda, "a value in [0, 1]")
        check(
            self.reward_scale > 0,
            "reward_scale",
            self.reward_scale,
            "a positive number (1: the env's rewards)",
        )
        check(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            "max_grad_norm",
            self.max_grad_norm,
            "a positive number, or None for no clipping",
        )
        for name in ("exploration_initial", "exploration_final"):
            check(0 <= getattr(self, name) <= 1, name, getattr(self, name), "a probability in [0, 1]")
        check(
            0 < self.exploration_fraction <= 1,
            "exploration_fraction",
            self.exploration_fraction,
            "a fraction of total_steps in (0, 1]",
        )
        lowest = self.exploration_final_lowest
        if lowest is not None:
            check(
                0 < lowest <= self.exploration_final,
                "exploration_final_lowest",
                lowest,
                f"a probability in (0, exploration_final = {self.exploration_final}], or None for one "
                "epsilon for every sub-env",
            )
            check(
                run.num_envs >= 2,
                "exploration_final_lowest",
                lowest,
                f"None with num_envs = {run.num_envs}: epsilons spread over the sub-envs need at least 2 "
                "of them (raise --num-envs)",
            )


class QLambdaSettings(NamedTuple):
    """What :func:`pqn_update` reads besides the rollout: floats for one agent, ``(P*N,)`` tensors of
    gamma and lambda (each member's value on its rows) for P members."""

    gamma: float | Tensor
    q_lambda: float | Tensor
    epochs: int
    gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae
    """:func:`~phalanx.buffers.compute_gae`, or its scan for a compiled update."""
    reward_scale: float = 1.0


class EpsilonGreedyQ(nn.Module):
    """PQN's acting while it collects: per sub-env, the greedy action of ``q_network`` or, with
    probability epsilon, a uniform one; with the greedy action's Q-value, ``max_a Q(s, a)``, which the
    rollout keeps as its ``values`` for the Q(lambda) targets.

    Epsilon is ``initial + decay * (final - initial)``, ``decay`` a ``()`` buffer in [0, 1] that the
    algorithm moves after each update; ``final`` is one value, or one per row of the batch acted on
    (geometric from ``final`` down to ``lowest``). The random draw is an input (:meth:`draw_noise`), so
    that the compiled rollout step draws it eagerly as the eager one does.
    """

    decay: Tensor

    def __init__(self, q_network: nn.Module, num_actions: int, config: PQNConfig) -> None:
        super().__init__()
        self.q_network = q_network
        self.num_actions = num_actions
        self.initial = config.exploration_initial
        self.final = config.exploration_final
        self.lowest = config.exploration_final_lowest
        device = next(q_network.parameters()).device
        self.register_buffer("decay", torch.zeros((), device=device))

    def epsilons(self, num_rows: int) -> Tensor:
        """The epsilon of each of ``num_rows`` sub-envs ``(num_rows,)`` at the current decay."""
        return epsilons_at(self.initial, self.final, self.lowest, self.decay, num_rows)

    def draw_noise(self, obs: Tensor) -> Tensor:
        """The random draw of acting on ``obs``: ``(N, 2)`` uniform, whether to explore and which action."""
        return torch.rand(obs.shape[0], 2, device=obs.device)

    def forward(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(actions, log_probs, values)`` of ``(N, ...)`` observations, each ``(N,)``: the log-probabilities
        are zeros (PQN's update does not read them)."""
        actions, values = epsilon_greedy(self.q_network(obs), noise, self.epsilons(obs.shape[0]))
        return actions, torch.zeros_like(values), values


def epsilons_at(
    initial: float | Tensor, final: float | Tensor, lowest: float | None, decay: Tensor, num_rows: int
) -> Tensor:
    """Epsilon of each of ``num_rows`` sub-envs at ``decay`` in [0, 1]: ``initial + decay * (final_i -
    initial)``, ``final_i`` all ``final`` or spread geometrically from it down to ``lowest``. Floats and a
    ``()`` decay give ``(num_rows,)``; P members' ``(P, 1)`` tensors give ``(P, num_rows)``."""
    device = decay.device
    final_rows = torch.full((num_rows,), 1.0, device=device) * final
    if lowest is not None and num_rows > 1:
        spread = torch.linspace(0.0, 1.0, num_rows, device=device)
        final_rows = final * (lowest / final) ** spread
    return initial + decay * (final_rows - initial)


def epsilon_greedy(q_values: Tensor, noise: Tensor, epsilon: Tensor) -> tuple[Tensor, Tensor]:
    """Epsilon-greedy actions of Q-values ``(..., N, A)`` and their ``max_a Q``, each ``(..., N)``: row n
    takes a uniform action where ``noise[..., n, 0] < epsilon[..., n]`` (the action from
    ``noise[..., n, 1]``), else its greedy one."""
    num_actions = q_values.shape[-1]
    values, greedy = q_values.max(dim=-1)
    random = (noise[..., 1] * num_actions).long().clamp_(max=num_actions - 1)
    return torch.where(noise[..., 0] < epsilon, random, greedy), values


def q_lambda_targets(
    rollout: RolloutBuffer,
    next_values: Tensor,
    gamma: float | Tensor,
    q_lambda: float | Tensor,
    gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae,
    reward_scale: float = 1.0,
) -> Tensor:
    """The Q(lambda) targets ``(T, N)`` of a rollout: ``G_t = r_t + gamma * next_t`` where ``next_t`` is
    0 if the episode terminated at step t, ``max_a Q`` of its final observation if it was truncated
    (``next_values[t]``), else ``(1 - lambda) * max_a Q(s_{t+1}) + lambda * G_{t+1}``; the last step of the
    rollout bootstraps from ``next_values[T - 1]``. The rollout's ``values[t]`` is ``max_a Q(s_t)`` (equal
    to ``next_values[t - 1]`` within an episode): with it as the value, GAE's return is this recursion
    exactly (``gae``: :func:`~phalanx.buffers.compute_gae`, or its scan for a compiled update). ``gamma``
    and ``q_lambda``: floats, or ``(N,)`` tensors of one value per sub-env (a vectorized population's).
    The rewards are multiplied by ``reward_scale`` first."""
    return gae(
        rollout.rewards * reward_scale,
        rollout.values,
        next_values,
        rollout.terminated,
        rollout.dones,
        gamma,
        q_lambda,
    )[1]


def q_loss(q_network: nn.Module, obs: Tensor, actions: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The mean squared error of ``Q(s, a)`` to its target over a minibatch, and the minibatch's Q-values,
    detached: observations ``(B, ...)``, actions and targets ``(B,)`` give a scalar loss; P members'
    ``(P, B, obs_dim)`` and ``(P, B)`` (``q_network`` an ensemble) give each member's ``(P,)``."""
    q_values = q_network(obs).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)  # (..., B)
    return F.mse_loss(q_values, targets, reduction="none").mean(dim=-1), q_values.detach()


def pqn_loss(
    q_network: nn.Module,
    targets: Tensor,
    index: Tensor,
    obs: Tensor,
    actions: Tensor,
    critic_obs: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """:func:`q_loss` over the minibatch ``index`` of :class:`~phalanx.algos.ppo.FlatSampler`'s samples
    (``targets``: the Q(lambda) targets as its one row ``(1, T*N)``; ``critic_obs`` is not read)."""
    return q_loss(q_network, obs[index], actions[index], targets[0].index_select(0, index))


def pqn_update(
    rollout: RolloutBuffer,
    next_values: Tensor,
    sampler: Sampler,
    loss: Callable[..., tuple[Tensor, Tensor]],
    minimise: Callable[[Tensor], None],
    settings: QLambdaSettings,
    compiled_step: Callable[..., tuple[Tensor, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """Steps 1 to 3 of the module docstring on a rollout: Q(lambda) targets, then epochs of shuffled
    minibatches, a gradient step on each; the metrics ``q_loss``, ``q_mean``, ``target_mean`` and
    ``gradient_steps``.

    Shape-generic as :func:`~phalanx.algos.ppo.ppo_update`: one agent's ``(T, N)`` rollout with
    :class:`~phalanx.algos.ppo.FlatSampler` and scalar metrics, or P members' ``(T, P*N)`` with a member
    sampler, ``(P*N,)`` gamma and lambda, and ``(P,)`` metrics. ``next_values``: ``max_a Q`` of every
    step's true next observation ``(T, N)``; ``loss``: the minibatch loss of the sampler's minibatches;
    ``minimise(loss)``: the eager gradient step on it; ``compiled_step``: the loss and that step as one
    graph (:class:`~phalanx.gradient_step.GradientStep`; None: eager)."""
    # 1. Q(lambda) targets (T, N): GAE's recursion with max_a Q as the value.
    with torch.no_grad():
        returns = q_lambda_targets(
            rollout, next_values, settings.gamma, settings.q_lambda, settings.gae, settings.reward_scale
        )
        targets = sampler.flatten(returns)  # (T*N,) or (P, T*N)

    # 2. The steps as samples, the targets as the one row of the sampler's targets.
    data = sampler.data(rollout, targets.unsqueeze(0))

    # 3. Epochs of shuffled minibatches, a gradient step on each.
    losses, q_means = [], []
    for _epoch in range(settings.epochs):
        for inputs in sampler.minibatches(data):
            if compiled_step is None:
                loss_value, q_values = loss(*inputs)
                minimise(loss_value)
            else:
                with torch.no_grad():  # the step differentiates with torch.func
                    loss_value, q_values = compiled_step(*inputs)
            losses.append(loss_value.detach())
            q_means.append(q_values.mean(dim=-1))
    q_loss_mean = torch.stack(losses).mean(dim=0)
    return {
        "q_loss": q_loss_mean,
        "q_mean": torch.stack(q_means).mean(dim=0),
        "target_mean": targets.mean(dim=-1),
        "gradient_steps": torch.full_like(q_loss_mean, float(len(losses))),
    }


class PQN(Algorithm):
    name = "pqn"
    config_class = PQNConfig
    on_policy = True
    action_spaces = (gym.spaces.Discrete,)
    observations = ("flat", "image")
    extra_state = ("exploration_decay",)
    vectorized_population: ClassVar[str | None] = "phalanx.population.vectorized_pqn:VectorizedPQN"
    config: PQNConfig

    def __init__(
        self, config: PQNConfig, observation_space: gym.Space, action_space: gym.Space, device: torch.device
    ) -> None:
        super().__init__(config, observation_space, action_space, device)
        assert isinstance(action_space, gym.spaces.Discrete), "check_spaces: Discrete actions"
        self.num_actions = int(action_space.n)
        encoder, feature_dim = feature_encoder(observation_space, config.encoder, config.layer_norm)
        self.q_network = QNetwork(
            encoder,
            feature_dim,
            self.num_actions,
            config.hidden_sizes,
            config.activation,
            dueling=False,
            layer_norm=config.layer_norm,
        ).to(self.device)
        self.policy = EpsilonGreedyQ(self.q_network, self.num_actions, config)
        self.exploration_decay = self.policy.decay
        """The epsilon schedule's position in [0, 1] (the policy's buffer; checkpointed)."""
        self.optimizer = make_radam(list(self.q_network.parameters()), lr=config.learning_rate)
        self.gradient_step: GradientStep | None = None
        """The compiled gradient step (:meth:`compile`); None: the eager step, the reference."""
        self.gae = compute_gae

    def state_entries(self) -> dict[str, nn.Module | torch.optim.Optimizer | None]:
        """The Q-network and its optimiser (the policy shares the network)."""
        return {"q_network": self.q_network, "optimizer": self.optimizer}

    def rollout_buffer(
        self, horizon: int, num_envs: int, layout: StepLayout, device: str | torch.device
    ) -> RolloutBuffer:
        return RolloutBuffer(horizon, num_envs, layout, device)

    # -- acting ----------------------------------------------------------------------------------
    @torch.no_grad()
    def explore(self, obs: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Epsilon-greedy actions for collection, with zero log-probabilities and ``max_a Q(s, a)``;
        ``noise``: the policy's ``draw_noise(obs)`` (None: drawn here)."""
        return self.policy(obs, self.policy.draw_noise(obs) if noise is None else noise)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        return self.q_network(obs).argmax(dim=1)

    def acting_module(self, stochastic: bool = False) -> GreedyActing:
        if stochastic:
            raise no_stochastic_policy(
                self.name,
                "it acts greedily on its Q-values (epsilon-greedy exploration is for training only)",
            )
        return GreedyActing(self.q_network)

    # -- learning --------------------------------------------------------------------------------
    def compile(self) -> list[str]:
        """Run :meth:`update`'s gradient steps (loss, gradient, clipping, RAdam) as one compiled graph
        each from now on (:class:`~phalanx.gradient_step.GradientStep`), the targets with
        :func:`~phalanx.buffers.compute_gae_scan`. Learners of a data-parallel group step eagerly."""
        if self.gradient_step is None:
            self.gradient_step = GradientStep(
                self.optimizer,  # type: ignore[arg-type]  # make_radam builds a flat one
                [self.q_network],
                functools.partial(pqn_loss, self.q_network),
                self.config.max_grad_norm,
            )
            self.gradient_step.compile()
            self.gae = compute_gae_scan
        return ["update"]

    def update(self, rollout: RolloutBuffer, progress: float) -> dict[str, Tensor]:
        config = self.config
        assert self.optimizer is not None, "a learning algorithm has its optimiser"
        if config.anneal_lr:  # linearly to 0 at the end of the budget
            anneal_learning_rate(self.optimizer, config.learning_rate, progress)
        horizon, num_envs = rollout.rewards.shape

        # 1.-3. From max_a Q of every step's true next observation (the final one where an episode ended):
        # the targets, the samples and the gradient steps.
        with torch.no_grad():
            next_values = self.q_network(rollout.next_obs.flatten(0, 1)).amax(dim=1).view(horizon, num_envs)
        metrics = pqn_update(
            rollout,
            next_values,
            FlatSampler(config.minibatch_size, self.device),
            functools.partial(pqn_loss, self.q_network),
            functools.partial(self.minimise, optimizer=self.optimizer, max_grad_norm=config.max_grad_norm),
            QLambdaSettings(config.gamma, config.q_lambda, config.epochs, self.gae, config.reward_scale),
            self.gradient_step if self.group is None else None,
        )

        # 4. Epsilon for the next rollout; the metrics (epsilon: the mean the rollout acted with).
        epsilon = self.policy.epsilons(num_envs).mean()
        self.exploration_decay.fill_(min(progress / config.exploration_fraction, 1.0))
        return {
            **metrics,
            "epsilon": epsilon,
            "learning_rate": torch.tensor(self.optimizer.param_groups[0]["lr"]),
        }
