"""DDPG, and the ensemble-critic learning rule that TD3, SAC and REDQ build on.

The K critics are one :class:`~phalanx.nets.EnsembleMLP` (a leading member dimension, batched
matmuls), not a loop of K modules. The rule is plain functions: each algorithm's critic loss and actor
loss (:func:`ddpg_critic_loss`, :func:`ddpg_actor_loss`; SAC's in :mod:`phalanx.algos.sac`), gathered
with the noise they take in a :class:`LearningRule` (``DDPG_RULE``, ``TD3_RULE``, ``SAC_RULE``), and one
update, :func:`ensemble_critic_update`, top to bottom:

1. the random draws of the update (:func:`draw`);
2. the critics' loss and step: the TD target ``r + discount * V(s')`` where ``V(s')`` reduces the K
   target critics at the next action by ``min``, ``mean`` or REDQ's ``min`` over a random subset of M
   (DDPG: the target actor's action; TD3: plus clipped noise; SAC: a sample, minus alpha * log-prob),
   and the squared TD error summed over critics, averaged over the batch (:func:`td_loss`); with
   ``critic_atoms``, categorical critics and their distributional target instead
   (:func:`categorical_critic_loss`, :mod:`phalanx.algos.distributional`);
3. every ``policy_delay`` updates, the actor's loss and step (``-mean over critics of Q(s, pi(s))``;
   with ``critic_atoms``, FastTD3's: expected values reduced as the target is; plus the entropy term for
   SAC), SAC's temperature step, and a Polyak step of the target networks;
4. the metrics.

``discount`` folds in n-step returns and terminal states (``phalanx.buffers.ReplayBatch``).

The rule is written once, for one algorithm or for P members trained as one batched run
(``phalanx.population.vectorized_off_policy``): its *learner* holds the networks, the random draws and
the optimiser steps, and the networks, the batch and any hyperparameter may carry a leading member
dimension ``(P, ...)`` (a member's K critics are then rows ``[p * K, (p + 1) * K)`` of one ensemble).
Every random draw goes through the learner's :class:`Draws`, so that each member of a population can
draw exactly what its own single run draws, and all of an update's draws are taken first
(:func:`draw`): the critics' and the actor's losses are then functions of tensors, which the learner
minimises eagerly (the reference) or as one compiled graph each
(:class:`~phalanx.gradient_step.GradientStep`, after ``compile()``).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Protocol

import gymnasium as gym
import torch
from torch import nn

from phalanx.algos.base import (
    ActingModule,
    ExplorationPolicy,
    OffPolicyAlgorithm,
    PolyakPair,
    no_stochastic_policy,
)
from phalanx.algos.distributional import (
    categorical_td_loss,
    expected_values,
    project_distribution,
    reduce_distributions,
    value_support,
)
from phalanx.algos.ensemble_critic_config import DDPGConfig, EnsembleCriticConfig
from phalanx.buffers import ReplayBatch
from phalanx.gradient_step import GradientStep
from phalanx.nets import EnsembleMLP, mlp, obs_dim
from phalanx.optim import make_adam

Tensor = torch.Tensor


# -- the learning rule, written once --------------------------------------------------------------
def member_view(value: Any, like: Tensor) -> Any:
    """A hyperparameter ready to broadcast against ``like`` ``(P, ...)``: a Python scalar (or a 0-d
    tensor) as it is, a ``(P,)`` tensor of per-member values as ``(P, 1, ..., 1)``."""
    if isinstance(value, torch.Tensor) and value.dim() == 1:
        return value.view(-1, *([1] * (like.dim() - 1)))
    return value


class Draws:
    """The random draws of a learning rule, from torch's global generator (a single run).

    A vectorized population passes its own, which draws each member's slice from that member's
    generator; the values and their order are the rule's (:func:`draw`), whoever
    draws them.
    """

    def normal(self, like: Tensor) -> Tensor:
        """Standard normal noise shaped like ``like``."""
        return torch.randn_like(like)

    def subset(self, size: int, count: int, device: torch.device) -> Tensor:
        """``count`` distinct indices in ``range(size)``: ``(count,)``, or ``(P, count)`` for P members."""
        return torch.randperm(size, device=device)[:count]


GLOBAL_DRAWS = Draws()
"""The draws of every single run (the class holds no state)."""


def critic_outputs(critic: EnsembleMLP, obs: Tensor, actions: Tensor) -> Tensor:
    """The outputs of every critic, ``(K, B, out)`` for obs ``(B, obs_dim)``; ``(P, K, B, out)`` for obs
    ``(P, B, obs_dim)`` and a critic of ``P * K`` members (member p's K critics see member p's rows).
    ``out`` is 1 (a scalar Q) or ``critic_atoms`` (logits)."""
    inputs = torch.cat([obs, actions], dim=-1)  # (*lead, B, in)
    lead, rows = inputs.shape[:-2], inputs.shape[-2:]
    critics = critic.num_members // math.prod(lead)
    expanded = inputs.unsqueeze(-3).expand(*lead, critics, *rows).reshape(-1, *rows)
    return critic(expanded).view(*lead, critics, rows[0], -1)


def q_values(critic: EnsembleMLP, obs: Tensor, actions: Tensor) -> Tensor:
    """Q of every scalar critic: ``(K, B)``, or ``(P, K, B)`` (:func:`critic_outputs`)."""
    return critic_outputs(critic, obs, actions).squeeze(-1)


def critic_values(critic: EnsembleMLP, obs: Tensor, actions: Tensor, hp: Any) -> Tensor:
    """Q of every critic, ``(K, B)`` or ``(P, K, B)``, of either kind: a scalar critic's output, or (with
    ``hp.critic_atoms``) the expected value of a categorical critic's distribution."""
    if hp.critic_atoms is None:
        return q_values(critic, obs, actions)
    logits = critic_outputs(critic, obs, actions)
    return expected_values(logits.softmax(dim=-1), value_support(hp, logits))


def reduce_critics(q_values: Tensor, hp: Any, subset: Tensor | None, dim: int = -2) -> Tensor:
    """Combine target critics (K along ``dim``) into one value by ``hp.target_reduction``: min, mean, or
    REDQ's min over ``subset``, ``hp.target_subset`` indices of critics redrawn every update (``(M,)``, or
    ``(P, M)`` for P members; None for the other reductions)."""
    if hp.target_reduction == "mean":
        return q_values.mean(dim=dim)
    if subset is not None:
        if subset.dim() == 1:
            q_values = q_values.index_select(dim, subset)
        else:  # (P, M) rows of (P, K, B)
            q_values = q_values.gather(dim, subset.unsqueeze(-1).expand(*subset.shape, q_values.shape[-1]))
    return q_values.min(dim=dim).values


class TargetDraws(NamedTuple):
    """The random draws of the critics' TD target in one update."""

    noise: Tensor | None
    """Standard normal noise of the next action, shaped like the batch's actions (TD3's smoothing, SAC's
    sample); None where the next action is deterministic (DDPG)."""
    subset: Tensor | None
    """REDQ's critics for the target (:func:`reduce_critics`); None for the other reductions."""


class ActorCritic(Protocol):
    """The networks the loss functions read: one algorithm's, or P members' (a leading member dimension).
    Read-only members, so that a learner may hold a subclass (SAC's actor, a population's draws)."""

    @property
    def actor(self) -> nn.Module: ...

    @property
    def critic(self) -> EnsembleMLP: ...

    @property
    def critic_target(self) -> EnsembleMLP: ...


class TargetActorCritic(ActorCritic, Protocol):
    """DDPG's and TD3's networks: also the target actor (SAC has none: its losses do not read it)."""

    @property
    def actor_target(self) -> nn.Module: ...


class EnsembleCriticLearner(ActorCritic, Protocol):
    """What :func:`ensemble_critic_update` needs of a learner: one algorithm, or P members at once."""

    @property
    def draws(self) -> Draws: ...

    updates: int

    def step_critic(self, batch: ReplayBatch, draws: TargetDraws, hp: Any) -> tuple[Tensor, Tensor]:
        """One optimiser step of the critics on the rule's :attr:`~LearningRule.critic_loss` (``(P,)``:
        each member's own); its loss and aux, detached."""

    def step_actor(self, obs: Tensor, noise: Tensor | None, hp: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """One optimiser step of the actor on the rule's :attr:`~LearningRule.actor_loss`; its loss and
        metrics, detached."""

    def set_critic_grad(self, requires_grad: bool) -> None: ...

    def update_targets(self) -> None:
        """A Polyak step of the target networks (``tau`` per member)."""


CriticLoss = Callable[[Any, ReplayBatch, TargetDraws, Any], tuple[Tensor, Tensor]]
"""``(learner, batch, draws, hp) -> (loss, q_mean)``: the critics' loss (``(P,)`` for P members)."""
ActorLoss = Callable[[Any, Tensor, Tensor | None, Any], tuple[Tensor, dict[str, Tensor]]]
"""``(learner, obs, noise, hp) -> (loss, metrics)``: the actor's loss; ``noise``: its action's noise."""
AfterActorStep = Callable[[Any, dict[str, Tensor], Any], None]
"""``(learner, actor_metrics, hp)``: what follows each actor step (SAC's temperature step)."""


class LearningRule(NamedTuple):
    """An ensemble-critic algorithm's learning rule: its loss functions and the noise they take
    (``DDPG_RULE``, ``td3.TD3_RULE``, ``sac.SAC_RULE``). :func:`ensemble_critic_update` applies it; the
    compiled gradient steps (:class:`~phalanx.gradient_step.GradientStep`) and a vectorized population
    minimise the same functions."""

    critic_loss: CriticLoss
    actor_loss: ActorLoss
    next_action_noise: bool = False
    """Whether the TD target's next action takes standard normal noise (:attr:`TargetDraws.noise`)."""
    actor_noise: bool = False
    """Whether the actor's loss takes standard normal noise for its action."""
    after_actor_step: AfterActorStep | None = None


def ensemble_critic_update(
    learner: EnsembleCriticLearner, batch: ReplayBatch, hp: Any, rule: LearningRule
) -> dict[str, Tensor]:
    """One update of ``learner`` on ``batch`` by ``rule``; scalar metrics (``(P,)`` for a population).

    ``hp`` has the fields of the algorithm's config; the ones a population varies per member are
    ``(P,)`` tensors there.
    """
    actor_update = (learner.updates + 1) % hp.policy_delay == 0
    target_draws, actor_noise = draw(learner.draws, batch, hp, actor_update, rule)
    critic_loss, q_mean = learner.step_critic(batch, target_draws, hp)
    learner.updates += 1

    metrics = {"critic_loss": critic_loss, "q_mean": q_mean}
    if actor_update:
        learner.set_critic_grad(False)  # the actor's loss moves the actor only
        actor_loss, actor_metrics = learner.step_actor(batch.obs, actor_noise, hp)
        learner.set_critic_grad(True)
        if rule.after_actor_step is not None:
            rule.after_actor_step(learner, actor_metrics, hp)
        learner.update_targets()
        metrics.update(actor_loss=actor_loss, **{k: v.detach() for k, v in actor_metrics.items()})
    return metrics


def draw(
    draws: Draws, batch: ReplayBatch, hp: Any, actor_update: bool, rule: LearningRule
) -> tuple[TargetDraws, Tensor | None]:
    """Every random draw of one update, before it and in the order the losses use them: the next
    action's noise, REDQ's subset, then (``actor_update``) the actor's noise. The losses are then
    functions of tensors, which run eagerly or compiled on the same draws."""
    like = batch.actions  # (B, A), or (P, B, A): the actor's actions
    noise = draws.normal(like) if rule.next_action_noise else None
    subset = None
    if hp.target_reduction == "redq":
        subset = draws.subset(hp.num_critics, hp.target_subset, like.device)
    actor_noise = draws.normal(like) if actor_update and rule.actor_noise else None
    return TargetDraws(noise, subset), actor_noise


def td_loss(critic: EnsembleMLP, batch: ReplayBatch, next_values: Tensor) -> tuple[Tensor, Tensor]:
    """The critics' loss towards the TD target ``r + discount * next_values``: the squared TD error
    summed over the K critics and averaged over the batch (``(P,)`` for P members), and their mean Q."""
    with torch.no_grad():
        targets = batch.rewards + batch.discounts * next_values
    q = q_values(critic, batch.obs, batch.actions)  # (K, B)
    loss = (q - targets.unsqueeze(-2)).pow(2).mean(dim=-1).sum(dim=-1)
    return loss, q.detach().mean(dim=(-2, -1))


def categorical_critic_loss(
    learner: ActorCritic, batch: ReplayBatch, next_actions: Tensor, next_entropy: Tensor | None, hp: Any
) -> tuple[Tensor, Tensor]:
    """The critics' loss with ``hp.critic_atoms``: each target critic's distribution at the next action
    moved to ``r + discount * (Z - next_entropy)`` (SAC's ``alpha * log pi(a'|s')``; None: 0) and
    projected onto the support, the K projected targets reduced by ``hp.target_reduction``, and the
    cross-entropy to that (:mod:`phalanx.algos.distributional`)."""
    with torch.no_grad():
        next_logits = critic_outputs(learner.critic_target, batch.next_obs, next_actions)  # (K, B, atoms)
        support = value_support(hp, next_logits)
        rewards = batch.rewards if next_entropy is None else batch.rewards - batch.discounts * next_entropy
        # one reward and discount per sample (B,) for all K critics: unsqueeze the critics' dim
        targets = project_distribution(
            next_logits.softmax(dim=-1), support, rewards.unsqueeze(-2), batch.discounts.unsqueeze(-2)
        )
        target = reduce_distributions(targets, support, hp.target_reduction)  # (B, atoms)
    logits = critic_outputs(learner.critic, batch.obs, batch.actions)
    return categorical_td_loss(logits, target, support)


def target_actions(actor_target: nn.Module, next_obs: Tensor, noise: Tensor | None, hp: Any) -> Tensor:
    """The TD target's next action: the target actor's (DDPG); with ``noise`` (TD3, whose rule draws it)
    plus target policy smoothing, ``hp.target_noise`` times the noise clipped to
    ``[-hp.target_noise_clip, hp.target_noise_clip]``, the sum clipped to [-1, 1]."""
    actions = actor_target(next_obs)
    if noise is None:
        return actions
    clip = member_view(hp.target_noise_clip, actions)
    noise = (member_view(hp.target_noise, actions) * noise).clamp(-clip, clip)
    return (actions + noise).clamp(-1.0, 1.0)


def ddpg_critic_loss(
    learner: TargetActorCritic, batch: ReplayBatch, draws: TargetDraws, hp: Any
) -> tuple[Tensor, Tensor]:
    """DDPG's and TD3's critic loss: :func:`td_loss` with ``V(s')`` the target critics at the target
    action (:func:`target_actions`), reduced over the K critics (:func:`reduce_critics`); with
    ``hp.critic_atoms``, :func:`categorical_critic_loss` at that action."""
    with torch.no_grad():
        next_actions = target_actions(learner.actor_target, batch.next_obs, draws.noise, hp)
    if hp.critic_atoms is not None:
        return categorical_critic_loss(learner, batch, next_actions, None, hp)
    with torch.no_grad():
        q_next = q_values(learner.critic_target, batch.next_obs, next_actions)
        next_values = reduce_critics(q_next, hp, draws.subset)  # (B,)
    return td_loss(learner.critic, batch, next_values)


def ddpg_actor_loss(
    learner: ActorCritic, obs: Tensor, noise: Tensor | None, hp: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """DDPG's and TD3's actor loss, ``-mean over critics of Q(s, pi(s))``; no metrics. With
    ``hp.critic_atoms``, FastTD3's: ``-`` the critics' expected values reduced as the target is (min, its
    clipped double Q; or mean), averaged over the batch."""
    values = critic_values(learner.critic, obs, learner.actor(obs), hp)  # (K, B)
    if hp.critic_atoms is None:
        return -values.mean(dim=(-2, -1)), {}
    return -reduce_critics(values, hp, None).mean(dim=-1), {}


DDPG_RULE = LearningRule(ddpg_critic_loss, ddpg_actor_loss)
"""DDPG: a deterministic actor, the target actor's action at s', no noise drawn."""


class EnsembleCriticAlgorithm(OffPolicyAlgorithm):
    """The critic machinery shared by DDPG, TD3, SAC and REDQ; subclasses supply the actor."""

    action_spaces = (gym.spaces.Box,)
    config: EnsembleCriticConfig
    rule: ClassVar[LearningRule]
    """The learning rule; :meth:`update` applies it to this algorithm's networks and config."""
    draws: ClassVar[Draws] = GLOBAL_DRAWS

    def __init__(
        self, config: EnsembleCriticConfig, observation_space: gym.Space, action_space: gym.Space, device
    ):
        super().__init__(config, observation_space, action_space, device)
        self.obs_dim = obs_dim(observation_space)
        assert action_space.shape is not None, "a Box (action_spaces)"
        self.action_dim = int(action_space.shape[0])
        self.actor = self.make_actor().to(self.device)
        self.critic = EnsembleMLP(
            config.num_critics,
            self.obs_dim + self.action_dim,
            config.hidden_sizes,
            config.critic_atoms or 1,  # logits over the atoms, or a scalar Q
            config.activation,
            layer_norm=config.critic_layer_norm,
        ).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_parameters = list(self.critic.parameters())
        self.critic_polyak = PolyakPair(self.critic_target, self.critic)
        decay = config.weight_decay
        self.actor_optimizer = make_adam(
            list(self.actor.parameters()), lr=config.learning_rate, weight_decay=decay
        )
        critic_lr = config.critic_learning_rate or config.learning_rate
        self.critic_optimizer = make_adam(self.critic_parameters, lr=critic_lr, weight_decay=decay)
        self.updates = 0
        self.critic_gradient_step: GradientStep | None = None
        """The critics' compiled gradient step (:meth:`compile`); None: the eager step, the reference."""
        self.actor_gradient_step: GradientStep | None = None

    def make_actor(self) -> nn.Module:
        raise NotImplementedError

    def compile(self) -> list[str]:
        """Run :meth:`update`'s two gradient steps compiled from now on, each as one graph
        (:class:`~phalanx.gradient_step.GradientStep`): the critics' (TD target, loss, gradient, Adam) and the
        actor's. The random draws stay outside, taken eagerly as the eager update takes them
        (:func:`draw`); the target networks' Polyak step stays one foreach op, SAC's
        temperature step a fused Adam step of one number. Learners of a data-parallel group step eagerly
        (their gradients are averaged between backward and the step)."""
        if self.critic_gradient_step is None:
            self.critic_gradient_step = GradientStep(
                self.critic_optimizer,  # type: ignore[arg-type]  # make_adam builds a flat one
                [self.critic],
                self.in_precision(functools.partial(self.rule.critic_loss, self)),
            )
            self.actor_gradient_step = GradientStep(
                # ignored below: make_adam's optimiser, None only inside without_optimizers (no compile there)
                self.actor_optimizer,  # type: ignore[arg-type]
                [self.actor],
                self.in_precision(functools.partial(self.rule.actor_loss, self)),
            )
            self.critic_gradient_step.compile()
            self.actor_gradient_step.compile()
        return ["critic update", "actor update"]

    def update(self, batch: ReplayBatch, progress: float) -> dict[str, torch.Tensor]:
        return ensemble_critic_update(self, batch, self.config, self.rule)

    def reduce_critics(self, q_values: torch.Tensor) -> torch.Tensor:
        """Combine target critics ``(K, ...)`` over dim 0 as the config says (MADDPG's per-group values)."""
        config = self.config
        subset = None
        if config.target_reduction == "redq":
            subset = self.draws.subset(q_values.shape[0], config.target_subset, q_values.device)
        return reduce_critics(q_values, config, subset, dim=0)

    # -- the learner's side of the rule: optimiser steps ----------------------------------------
    def in_precision(self, loss: Callable[..., Any]) -> Callable[..., Any]:
        """``loss`` as it runs in :meth:`step_critic` and :meth:`step_actor`, eager or compiled: itself, or
        with ``config.bf16`` under bfloat16 autocast on this learner's device (its matmuls in bfloat16 on
        float32 weights, as FastTD3's update; runs allow it on CUDA only), its outputs back in float32 so
        that the gradients, the metrics and SAC's temperature step are float32 as without it."""
        if not self.config.bf16:
            return loss

        def autocast_loss(*inputs: Any) -> Any:
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                return float32(loss(*inputs))

        return autocast_loss

    def step_critic(self, batch: ReplayBatch, draws: TargetDraws, hp: Any) -> tuple[Tensor, Tensor]:
        if self.critic_gradient_step is not None and self.group is None:
            with torch.no_grad():  # the step differentiates with torch.func, which no_grad leaves alone
                return self.critic_gradient_step(batch, draws, hp)
        loss, q_mean = self.in_precision(self.rule.critic_loss)(self, batch, draws, hp)
        assert self.critic_optimizer is not None, "a learning algorithm has its optimisers"
        self.minimise(loss, self.critic_optimizer)
        return loss.detach(), q_mean

    def step_actor(self, obs: Tensor, noise: Tensor | None, hp: Any) -> tuple[Tensor, dict[str, Tensor]]:
        if self.actor_gradient_step is not None and self.group is None:
            with torch.no_grad():
                return self.actor_gradient_step(obs, noise, hp)
        loss, metrics = self.in_precision(self.rule.actor_loss)(self, obs, noise, hp)
        assert self.actor_optimizer is not None, "a learning algorithm has its optimisers"
        self.minimise(loss, self.actor_optimizer)
        return loss.detach(), metrics

    def update_targets(self) -> None:
        self.critic_polyak.update(self.config.tau)

    def set_critic_grad(self, requires_grad: bool) -> None:
        """``critic.requires_grad_`` on the cached parameter list (no walk over the submodules)."""
        for parameter in self.critic_parameters:
            parameter.requires_grad_(requires_grad)


def float32(outputs: Any) -> Any:
    """A loss's outputs (tensors, in tuples and dicts) with their floating-point tensors in float32."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float() if outputs.is_floating_point() else outputs
    if isinstance(outputs, tuple):
        return tuple(float32(value) for value in outputs)
    if isinstance(outputs, dict):
        return {key: float32(value) for key, value in outputs.items()}
    return outputs


class GaussianExploration(ExplorationPolicy):
    """DDPG's exploration: the deterministic actor's action plus Gaussian noise, clipped to [-1, 1].

    Its standard deviation is ``noise`` or, with ``noise_range = (low, high)``, each sub-env's own
    (FastTD3's per-env noise: some sub-envs stay near the policy, others explore widely), evenly spaced
    from low (first row) to high (last row) over the rows of each acting call (one row: the middle).
    FastTD3 draws each env's value uniformly and redraws it at the env's episode ends; an exploration
    policy sees observations, not episode ends, so the spread is fixed, as PQN's per-env epsilons
    (``EpsilonGreedyQ.epsilons``): no random draw beyond the noise, and with --overlap each half of the
    sub-envs gets the whole spread."""

    def __init__(
        self, actor: nn.Module, noise: float, noise_range: tuple[float, float] | None = None
    ) -> None:
        super().__init__()
        self.actor = actor
        self.noise = noise
        self.noise_range = noise_range
        self.row_scales: Tensor | None = None  # the last call's (N, 1), kept: N rarely changes

    def scales(self, actions: Tensor) -> float | Tensor:
        """The noise's standard deviation for ``actions`` ``(N, A)``: ``noise``, or ``(N, 1)`` per row."""
        if self.noise_range is None:
            return self.noise
        rows, scales = actions.shape[0], self.row_scales
        if scales is None or scales.shape[0] != rows or scales.device != actions.device:
            low, high = self.noise_range
            if rows == 1:
                low = high = (low + high) / 2
            scales = torch.linspace(low, high, rows, dtype=actions.dtype, device=actions.device)
            self.row_scales = scales = scales.unsqueeze(1)
        return scales

    @torch.no_grad()
    def forward(self, obs: torch.Tensor, steps: int) -> torch.Tensor:
        actions = self.actor(obs)
        return (actions + self.scales(actions) * torch.randn_like(actions)).clamp(-1.0, 1.0)


class ActorActing(ActingModule):
    """DDPG's and TD3's acting: the deterministic actor's action."""

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)


class DDPG(EnsembleCriticAlgorithm):
    """A deterministic tanh actor with a target copy; Gaussian exploration noise."""

    name = "ddpg"
    config_class = DDPGConfig
    config: DDPGConfig
    rule = DDPG_RULE

    def __init__(self, config: DDPGConfig, observation_space: gym.Space, action_space: gym.Space, device):
        super().__init__(config, observation_space, action_space, device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.actor_polyak = PolyakPair(self.actor_target, self.actor)
        self.exploration = GaussianExploration(
            self.actor, config.exploration_noise, config.exploration_noise_range
        )

    def make_actor(self) -> nn.Module:
        config = self.config
        gain = config.actor_output_gain
        return nn.Sequential(
            mlp(self.obs_dim, config.hidden_sizes, self.action_dim, config.activation, gain), nn.Tanh()
        )

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self.actor(obs)

    def acting_module(self, stochastic: bool = False) -> ActorActing:
        if stochastic:
            raise no_stochastic_policy(
                self.name, "its actor is deterministic (Gaussian exploration noise is for training only)"
            )
        return ActorActing(self.actor)

    def exploration_policy(self) -> GaussianExploration:
        return self.exploration

    def update_targets(self) -> None:
        super().update_targets()
        self.actor_polyak.update(self.config.tau)
