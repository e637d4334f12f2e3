"""PPO and its sibling A2C: on-policy actor-critic learning from a (T, N) rollout.

The update is written once, in :func:`ppo_update`, to be read top to bottom:

1. GAE(lambda) advantages and returns, from the value of every true next observation (``next_obs`` is
   the final observation where an episode ended), so that truncated episodes bootstrap and terminated
   ones do not;
2. the rollout flattened into samples;
3. ``epochs`` passes of shuffled minibatches, each a gradient step on
   ``-min(r*A, clip(r, 1-e, 1+e)*A) + value_coef * value_loss - entropy_coef * entropy``
   (:func:`actor_critic_loss`), with optional value clipping, gradient-norm clipping and a KL early
   stop;
4. the metrics.

It is shape-generic: one agent's samples, or P members' side by side (a leading member dim, one
hyperparameter value per member). What differs between its callers is passed in: the minibatches (a
:class:`Sampler`: :class:`FlatSampler` here, sequences in :mod:`phalanx.algos.recurrent`, P members'
in :mod:`phalanx.population.vectorized`), the loss (which networks) and the gradient step.
:meth:`PPO.compile` runs each minibatch's gradient step (loss, gradient, clipping, the optimiser's
step) as one compiled graph (:class:`~phalanx.gradient_step.GradientStep`); the eager step stays the
reference. A2C is the same update with one full-batch pass, the plain policy-gradient loss
(``clip_range`` None) and RMSprop (:func:`update_settings`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Protocol

import gymnasium as gym
import torch
from torch import nn

from phalanx.algos.actor_critic_config import A2CConfig, ActorCriticConfig, PPOConfig
from phalanx.algos.base import ActingModule, Algorithm, GradientGroup, SideBySide
from phalanx.buffers import RolloutBuffer, StepLayout, compute_gae, compute_gae_scan
from phalanx.gradient_step import GradientStep
from phalanx.nets import (
    CategoricalPolicy,
    GaussianPolicy,
    MemberActor,
    MultiCategoricalPolicy,
    ValueNet,
    feature_encoder,
    head_on_features,
    multi_discrete_sizes,
)
from phalanx.optim import anneal_learning_rate, make_adam, make_rmsprop

Tensor = torch.Tensor
PolicyHead = CategoricalPolicy | GaussianPolicy | MultiCategoricalPolicy
"""The policy heads of PPO and A2C, one per kind of action space."""
Hyperparameter = float | Tensor
"""A Python float for one agent, or a float64 tensor of one value per member: ``(P, 1)`` for those that
act on every sample (``clip_range``, ``clip_value``, broadcasting over the samples), ``(P,)`` for those
that weigh the members' losses (``value_coef``, ``entropy_coef``). Float64 as a Python float is; the
rule casts it to the samples' dtype where it uses it."""


class PolicyHeadActing(ActingModule):
    """The acting of a categorical or Gaussian policy head (PPO, A2C, each MAPPO unit): its argmax or
    mean, or (stochastic) the action :meth:`~phalanx.nets.CategoricalPolicy.sample` draws from ``noise``
    (uniform noise for the Gumbel-max trick; standard normal noise scaled by the standard deviation)."""

    def __init__(self, policy: PolicyHead, stochastic: bool = False) -> None:
        super().__init__(policy.action_noise if stochastic else None)
        self.policy = policy

    def forward(self, obs: Tensor, noise: Tensor | None = None) -> Tensor:
        if noise is None:
            return self.policy.deterministic_action(obs)
        return self.policy.sample(obs, noise=noise)[0]


# -- the learning rule ---------------------------------------------------------------------------------
class ActorCriticBatch(NamedTuple):
    """A minibatch: ``(B, ...)`` samples of one agent, or ``(P, B, ...)`` for P members (member p's
    samples in row p). ``critic_obs`` is the value function's input (``obs`` unless a centralised critic
    reads the global state)."""

    obs: Tensor
    actions: Tensor
    old_log_probs: Tensor
    advantages: Tensor
    old_values: Tensor
    returns: Tensor
    critic_obs: Tensor


class ActorCriticHyperparameters(NamedTuple):
    """The hyperparameters of :func:`actor_critic_loss`, each a :data:`Hyperparameter`."""

    value_coef: Hyperparameter
    entropy_coef: Hyperparameter
    clip_range: Hyperparameter | None
    """PPO's ratio clip e; None: A2C's plain policy gradient ``-log pi(a|s) * A``."""
    clip_value: Hyperparameter | None
    """Clip the value update around the old value by this; None (or +inf for a member): no clipping."""
    normalize_advantages: bool


class ActorCriticLoss(NamedTuple):
    """What :func:`actor_critic_loss` returns. ``loss`` and the ``metrics`` (policy_loss, value_loss,
    entropy) are scalars for one agent, ``(P,)`` for P members; ``ratio`` and ``log_ratio`` are every
    sample's probability ratio (detached), for :func:`ratio_metrics` and the KL early stop."""

    loss: Tensor
    metrics: dict[str, Tensor]
    ratio: Tensor
    log_ratio: Tensor


def actor_critic_loss(
    policy: PolicyHead,
    value: ValueNet,
    batch: ActorCriticBatch,
    hyperparameters: ActorCriticHyperparameters,
) -> ActorCriticLoss:
    """The PPO (or A2C) loss of a minibatch, for one agent or for P members at once.

    ``policy`` and ``value`` take the batch as it comes: ``(B, obs_dim)`` for one agent's networks,
    ``(P, B, obs_dim)`` for P members' batched networks (``phalanx.nets.Member*``). Every reduction is
    over the last (sample) dim, so member p's loss depends on its own samples and hyperparameters only:
    summing the members' losses and calling backward gives each member the gradient of its own loss.
    """
    config = hyperparameters
    log_probs, entropy = policy.log_prob_entropy(batch.obs, batch.actions)
    log_ratio = log_probs - batch.old_log_probs
    ratio = log_ratio.exp()
    advantages = batch.advantages
    if config.normalize_advantages and advantages.shape[-1] > 1:
        advantages = (advantages - advantages.mean(dim=-1, keepdim=True)) / (
            advantages.std(dim=-1, keepdim=True) + 1e-8
        )
    if config.clip_range is None:  # A2C
        policy_loss = -(log_probs * advantages).mean(dim=-1)
    else:  # the clipped surrogate -min(r*A, clip(r, 1-e, 1+e)*A)
        low, high = _like(1 - config.clip_range, ratio), _like(1 + config.clip_range, ratio)
        # low and high are both floats or both tensors (one hyperparameter), a pair no overload of clamp names
        surrogate = torch.min(ratio * advantages, ratio.clamp(low, high) * advantages)  # type: ignore[arg-type]
        policy_loss = -surrogate.mean(dim=-1)
    value_loss = _value_loss(value(batch.critic_obs), batch.old_values, batch.returns, config.clip_value)
    entropy_mean = entropy.mean(dim=-1)
    loss = policy_loss + _like(config.value_coef, value_loss) * value_loss
    entropy_coef = config.entropy_coef
    if isinstance(entropy_coef, Tensor) or entropy_coef != 0:  # a zero coefficient adds nothing
        loss = loss - _like(entropy_coef, entropy_mean) * entropy_mean
    metrics = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy_mean}
    return ActorCriticLoss(
        loss,
        {name: metric.detach() for name, metric in metrics.items()},
        ratio.detach(),
        log_ratio.detach(),
    )


def _value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip_value: Hyperparameter | None
) -> Tensor:
    """Squared error to the GAE returns; with clip_value, the pessimum of clipped and unclipped (a member
    whose clip_value is +inf keeps its unclipped error exactly)."""
    errors = (values - returns).pow(2)
    if clip_value is not None:
        clip = _like(clip_value, values)
        clipped = old_values + (values - old_values).clamp(-clip, clip)  # type: ignore[arg-type]  # as above
        pessimum = torch.max(errors, (clipped - returns).pow(2))
        errors = torch.where(torch.isfinite(clip), pessimum, errors) if isinstance(clip, Tensor) else pessimum
    return 0.5 * errors.mean(dim=-1)


def ratio_metrics(ratio: Tensor, log_ratio: Tensor, clip_range: Hyperparameter | None) -> dict[str, Tensor]:
    """The approximate KL (Schulman's unbiased estimator) and, for PPO, the clipped fraction, of the
    probability ratios ``(..., B)``: means over the last dim."""
    metrics = {"approx_kl": ((ratio - 1) - log_ratio).mean(dim=-1)}
    if clip_range is not None:  # a (P, 1) clip_range broadcasts over the (P, B) ratios
        metrics["clip_fraction"] = ((ratio - 1).abs() > _like(clip_range, ratio)).float().mean(dim=-1)
    return metrics


def _like(hyperparameter: Hyperparameter, samples: Tensor) -> Hyperparameter:
    """A tensor hyperparameter in the samples' dtype (a Python float is cast by the op itself)."""
    return hyperparameter.to(samples.dtype) if isinstance(hyperparameter, Tensor) else hyperparameter


# -- the update ----------------------------------------------------------------------------------------
MinibatchLoss = Callable[..., tuple[Tensor, tuple[dict[str, Tensor], Tensor, Tensor]]]
"""``loss(hyperparameters, *inputs) -> (loss, (metrics, ratio, log_ratio))``: :func:`actor_critic_loss` of
one minibatch, ``inputs`` as the sampler gives them (:func:`feed_forward_loss` for the flat samples)."""


class UpdateSettings(NamedTuple):
    """What :func:`ppo_update` runs with besides the rollout, the sampler and the networks."""

    epochs: int
    target_kl: float | None
    """After an epoch, stop if its last step's approximate KL exceeds this (None: never)."""
    gamma: Hyperparameter
    """A float, or one value per rollout row ``(N,)`` (float32, as the rollout)."""
    gae_lambda: Hyperparameter
    loss: ActorCriticHyperparameters
    gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae
    """:func:`~phalanx.buffers.compute_gae` (the loop, the reference) or, for a compiled update,
    :func:`~phalanx.buffers.compute_gae_scan`."""


class Sampler(Protocol):
    """How :func:`ppo_update` cuts a rollout into minibatches: :class:`FlatSampler` (shuffled samples),
    ``phalanx.population.vectorized.MemberSampler`` (P members' at once) or
    ``phalanx.algos.recurrent.SequenceSampler`` (shuffled sequences of a recurrent policy)."""

    def flatten(self, steps: Tensor) -> Tensor:
        """A ``(T, N)`` field of the rollout as samples: ``(T*N,)``, or ``(P, T*N)`` for P members."""
        ...

    def data(self, rollout: RolloutBuffer, targets: Tensor) -> tuple[Any, ...]:
        """What the minibatches are drawn from, made once per update; ``targets``: the flattened old
        log-probabilities, advantages, old values and returns as rows of one tensor ``(4, [P,] T*N)``."""
        ...

    def minibatches(self, data: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One epoch's minibatches (drawing its shuffle): each the inputs of the loss after its
        hyperparameters."""
        ...


class FlatSampler:
    """Shuffled minibatches of ``minibatch_size`` of the ``T*N`` samples (None: one of them all), each the
    inputs of :func:`feed_forward_loss`; the shuffle from the global generator."""

    def __init__(self, minibatch_size: int | None, device: torch.device) -> None:
        self.minibatch_size = minibatch_size
        self.device = device

    def flatten(self, steps: Tensor) -> Tensor:
        return steps.flatten(0, 1)

    def data(self, rollout: RolloutBuffer, targets: Tensor) -> tuple[Tensor | None, ...]:
        """``targets``, observations, actions and the value function's input (None: the observations),
        ``(T*N, ...)``."""
        critic_obs = None if rollout.critic_obs is rollout.obs else rollout.critic_obs.flatten(0, 1)
        return targets, rollout.obs.flatten(0, 1), rollout.actions.flatten(0, 1), critic_obs

    def minibatches(self, data: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        targets, *inputs = data
        batch_size = targets.shape[1]
        permutation = torch.randperm(batch_size, device=self.device)
        indices = permutation.split(self.minibatch_size or batch_size)
        return [(targets, index, *inputs) for index in indices]


def feed_forward_loss(
    encoder: nn.Module | None,
    policy: PolicyHead,
    value: ValueNet,
    hyperparameters: ActorCriticHyperparameters,
    targets: Tensor,
    index: Tensor,
    obs: Tensor,
    actions: Tensor,
    critic_obs: Tensor | None,
) -> tuple[Tensor, tuple[dict[str, Tensor], Tensor, Tensor]]:
    """:func:`actor_critic_loss` of the minibatch ``index`` of :class:`FlatSampler`'s samples. ``encoder``:
    a shared encoder run once, ``policy`` and ``value`` heads on its features (None: the networks read
    the observations)."""
    minibatch_obs = obs[index]
    old_log_probs, advantages, old_values, returns = targets.index_select(1, index)
    batch = ActorCriticBatch(
        minibatch_obs,
        actions[index],
        old_log_probs,
        advantages,
        old_values,
        returns,
        minibatch_obs if critic_obs is None else critic_obs[index],
    )
    if encoder is not None:  # the encoder once, both heads on its features
        features = encoder(minibatch_obs)
        batch = batch._replace(obs=features, critic_obs=features)
    result = actor_critic_loss(policy, value, batch, hyperparameters)
    return result.loss, (result.metrics, result.ratio, result.log_ratio)


def ppo_update(
    rollout: RolloutBuffer,
    next_values: Tensor,
    sampler: Sampler,
    loss: MinibatchLoss,
    minimise: Callable[[Tensor], None],
    settings: UpdateSettings,
    learning_rate: Tensor,
    compiled_step: Callable[..., tuple[Tensor, Any]] | None = None,
    group: GradientGroup | None = None,
) -> dict[str, Tensor]:
    """PPO's (and A2C's) update on a rollout: GAE, then epochs of shuffled minibatches, a gradient step on
    each; its metrics.

    Shape-generic: a ``(T, N)`` rollout of one agent, or of P members side by side (``(T, P*N)``, the
    sampler's ``flatten`` making ``(P, T*N)`` samples, the hyperparameters tensors of one value per
    member; the metrics then ``(P,)``). ``next_values``: the value ``(T, N)`` of every step's true next
    observation (or global state), so that truncated episodes bootstrap and terminated ones do not.
    ``loss``: the minibatch loss of the sampler's minibatches; ``minimise(loss)``: the eager gradient step
    on it (gradients, clipping, the optimiser's step); ``compiled_step``: the loss and that step as one
    compiled graph (:class:`~phalanx.gradient_step.GradientStep` of ``loss``; None: eager).
    ``learning_rate``: its metric (a CPU scalar for one agent, ``(P,)`` for P members); ``group``: a
    data-parallel group of learners, which stop their epochs together on their mean KL.
    """
    # 1. GAE(lambda) advantages and returns (T, N).
    advantages, returns = settings.gae(
        rollout.rewards,
        rollout.values,
        next_values,
        rollout.terminated,
        rollout.dones,
        settings.gamma,
        settings.gae_lambda,
    )

    # 2. Flatten: the steps as samples; the per-sample scalars as rows of one tensor (a minibatch gathers
    # them in one op).
    flatten = sampler.flatten
    old_values, returns = flatten(rollout.values), flatten(returns)
    targets = torch.stack((flatten(rollout.log_probs), flatten(advantages), old_values, returns))
    data = sampler.data(rollout, targets)

    # 3. Epochs of shuffled minibatches, a gradient step on each. The metrics are computed after them,
    # from what each step kept.
    step_metrics: list[dict[str, Tensor]] = []  # policy_loss, value_loss, entropy of each step
    ratios: list[tuple[Tensor, Tensor]] = []  # (ratio, log_ratio) of each step's samples
    for _epoch in range(settings.epochs):
        for inputs in sampler.minibatches(data):
            if compiled_step is None:  # eager: the loss, then its gradient step
                loss_value, (metrics, ratio, log_ratio) = loss(settings.loss, *inputs)
                minimise(loss_value)
            else:  # the loss, its gradient, clipping and the optimiser's step as one graph
                _, (metrics, ratio, log_ratio) = compiled_step(settings.loss, *inputs)
            step_metrics.append(metrics)
            ratios.append((ratio, log_ratio))
        if settings.target_kl is not None:  # stop once the epoch's last step's approximate KL is too high
            approx_kl = ((ratio - 1) - log_ratio).mean()
            if group is not None:  # every learner must stop after the same epoch: decide on the mean
                approx_kl = approx_kl.reshape(1).clone()
                group.average([approx_kl])
            if bool(approx_kl > settings.target_kl):  # one host sync per epoch, only with target_kl
                break

    # 4. Metrics: the losses' means over the gradient steps; approx_kl, clip_fraction over all their samples.
    with torch.no_grad():
        metrics = {
            name: torch.stack([step[name] for step in step_metrics]).mean(dim=0) for name in step_metrics[0]
        }
        ratio, log_ratio = (torch.cat(values, dim=-1) for values in zip(*ratios, strict=True))
        metrics.update(ratio_metrics(ratio, log_ratio, settings.loss.clip_range))
        explained = 1 - (returns - old_values).var(dim=-1) / (returns.var(dim=-1) + 1e-8)
    metrics["explained_variance"] = explained
    metrics["learning_rate"] = learning_rate
    metrics["gradient_steps"] = learning_rate.new_full(learning_rate.shape, float(len(step_metrics)))
    return metrics


def update_settings(
    config: ActorCriticConfig,
    gamma: Hyperparameter | None = None,
    gae_lambda: Hyperparameter | None = None,
    loss: ActorCriticHyperparameters | None = None,
    gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae,
) -> UpdateSettings:
    """The :class:`UpdateSettings` of a config (``gamma``, ``gae_lambda``, ``loss``: other values, as a
    population's per-member tensors). PPO's; A2C's config has no epochs, clipping or KL stop: one pass,
    the plain policy gradient ``-log pi(a|s) * A``."""
    if isinstance(config, PPOConfig):
        epochs, target_kl, clip_range, clip_value = (
            config.epochs,
            config.target_kl,
            config.clip_range,
            config.clip_value,
        )
    else:
        epochs, target_kl, clip_range, clip_value = 1, None, None, None
    if loss is None:
        loss = ActorCriticHyperparameters(
            config.value_coef, config.entropy_coef, clip_range, clip_value, config.normalize_advantages
        )
    return UpdateSettings(
        epochs,
        target_kl,
        config.gamma if gamma is None else gamma,
        config.gae_lambda if gae_lambda is None else gae_lambda,
        loss,
        gae,
    )


def minibatch_size(config: ActorCriticConfig) -> int | None:
    """Samples per minibatch: PPO's ``minibatch_size``; None (the whole rollout) for A2C."""
    return config.minibatch_size if isinstance(config, PPOConfig) else None


class PPO(Algorithm):
    name = "ppo"
    config_class: ClassVar[type[ActorCriticConfig]] = PPOConfig
    on_policy = True
    recurrent_variant: ClassVar[str | None] = "phalanx.algos.recurrent:RecurrentPPO"
    vectorized_population: ClassVar[str | None] = "phalanx.population.vectorized:VectorizedPPO"
    config: PPOConfig
    action_spaces = (gym.spaces.Discrete, gym.spaces.Box, gym.spaces.MultiDiscrete)
    observations = ("flat", "image", "dict")

    def __init__(
        self,
        config: ActorCriticConfig,
        observation_space: gym.Space,
        action_space: gym.Space,
        device: torch.device,
        critic_space: gym.Space | None = None,
    ) -> None:
        """``critic_space``: the value function's input when it is not the observation (a centralised
        critic on the global state, as MAPPO's); the rollout then carries it as ``critic_obs``.

        Observations other than a 1-D Box go through the encoder of ``config.encoder``
        (:func:`~phalanx.nets.feature_encoder`), one shared by the policy and the value function with
        ``config.share_encoder`` (where the value function reads the observations), else one each.
        Flat observations have no encoder: the networks are exactly the MLPs of before encoders."""
        super().__init__(config, observation_space, action_space, device)
        self.build_networks(observation_space, action_space, critic_space)
        self.optimizer = self.make_optimizer()
        self.gradient_step: GradientStep | None = None
        """The compiled gradient step (:meth:`compile`); None: the eager step, the reference."""
        self.gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae

    def build_networks(
        self, observation_space: gym.Space, action_space: gym.Space, critic_space: gym.Space | None
    ) -> None:
        """The policy and the value function (``critic_space``: see :meth:`__init__`), and ``parameters``,
        those the optimiser updates."""
        config = self.config
        encoder, features = feature_encoder(observation_space, config.encoder)
        self.policy: PolicyHead = self.policy_head(encoder, features, action_space)
        if critic_space is None and config.share_encoder:
            critic_encoder, critic_features = encoder, features
        else:
            critic_encoder, critic_features = feature_encoder(
                observation_space if critic_space is None else critic_space, config.encoder
            )
        self.value = ValueNet(critic_features, config.hidden_sizes, config.activation, critic_encoder)
        self.policy.to(self.device)
        self.value.to(self.device)
        # a shared encoder's parameters once (nn.Module.parameters() skips those already given)
        self.parameters = list(nn.ModuleList([self.policy, self.value]).parameters())
        self.shared_trunk: tuple[nn.Module, PolicyHead, ValueNet] | None = None
        """With a shared encoder: ``(encoder, policy, value)``, the heads as views on its features
        (:func:`~phalanx.nets.head_on_features`), so that collection and the loss run the encoder once
        for both heads (a tuple: the checkpoint holds the networks as ``policy`` and ``value``)."""
        if encoder is not None and self.value.encoder is encoder:
            self.shared_trunk = (encoder, head_on_features(self.policy), head_on_features(self.value))

    def policy_head(self, encoder: nn.Module | None, features: int, action_space: gym.Space) -> PolicyHead:
        """The policy of ``action_space``'s kind, reading ``features`` from ``encoder`` (None: the flat
        observations are the features)."""
        config = self.config
        if isinstance(action_space, gym.spaces.Discrete):
            return CategoricalPolicy(
                features, int(action_space.n), config.hidden_sizes, config.activation, encoder
            )
        if isinstance(action_space, gym.spaces.MultiDiscrete):
            nvec = multi_discrete_sizes(action_space)
            return MultiCategoricalPolicy(features, nvec, config.hidden_sizes, config.activation, encoder)
        assert action_space.shape is not None, "a Box (the action spaces PPO acts in)"
        return GaussianPolicy(
            features,
            int(action_space.shape[0]),
            config.hidden_sizes,
            config.activation,
            config.log_std_init,
            encoder,
        )

    def make_optimizer(self) -> torch.optim.Optimizer | None:
        return make_adam(self.parameters, lr=self.config.learning_rate, eps=1e-5)

    def rollout_buffer(
        self, horizon: int, num_envs: int, layout: StepLayout, device: str | torch.device
    ) -> RolloutBuffer:
        """The rollout buffer this algorithm learns from: a :class:`~phalanx.buffers.RolloutBuffer` (a
        recurrent policy's also stores its memory)."""
        return RolloutBuffer(horizon, num_envs, layout, device)

    # -- acting ----------------------------------------------------------------------------------
    @torch.no_grad()
    def explore(
        self, obs: torch.Tensor, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions for collection: ``(actions, log_probs, values)`` for a (N, obs_dim) batch;
        ``noise``: the policy's ``draw_noise(obs)``, drawn by the caller (None: drawn here). A shared
        encoder runs once for the actions and the values."""
        if self.shared_trunk is not None:
            encoder, policy, value = self.shared_trunk
            features = encoder(obs)
            actions, log_probs = policy.sample(features, noise=noise)
            return actions, log_probs, value(features)
        actions, log_probs = self.policy.sample(obs, noise=noise)
        return actions, log_probs, self.value(obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        if deterministic:  # argmax of the logits / the mean: no log-probabilities needed
            return self.policy.deterministic_action(obs)
        actions, _ = self.policy.sample(obs)
        return actions

    def acting_module(self, stochastic: bool = False) -> ActingModule:
        return PolicyHeadActing(self.policy, stochastic)

    @classmethod
    def side_by_side(cls, agents: list[Algorithm]) -> SideBySide | Any:
        """The k policies as one ensemble: one batched forward for all k blocks of rows."""
        # ignored below: the agents are this class's (PPOs): they have a policy
        return MemberActor.of([agent.policy for agent in agents])  # type: ignore[attr-defined]

    # -- learning --------------------------------------------------------------------------------
    def compile(self) -> list[str]:
        """Run :meth:`update` compiled from now on: each minibatch's gradient step (gathering the
        minibatch, :func:`feed_forward_loss`, its gradient, clipping and the optimiser's step) as one
        graph (:class:`~phalanx.gradient_step.GradientStep`), GAE as
        :func:`~phalanx.buffers.compute_gae_scan`.

        Shapes are static: a last minibatch of another size (``minibatch_size`` not dividing the
        rollout) compiles a second graph once, on the first update, and both are reused. Learners of a
        data-parallel group step eagerly (their gradients are averaged between backward and clipping).
        """
        if self.gradient_step is None:
            self.gradient_step = GradientStep(
                self.optimizer,  # type: ignore[arg-type]  # make_optimizer builds a flat one
                self.loss_modules(),
                self.loss_function(),
                self.config.max_grad_norm,
            )
            self.gradient_step.compile()
            self.gae = compute_gae_scan
        return ["update"]

    def loss_modules(self) -> list[nn.Module]:
        """The modules the loss computes with, each parameter in one of them once: the policy and the
        value function, or with a shared encoder the encoder and the two heads on its features (a module
        tree holding the encoder twice, tied, does not compile under torch.func)."""
        if self.shared_trunk is not None:
            return list(self.shared_trunk)
        return [self.policy, self.value]

    def loss_function(self) -> MinibatchLoss:
        """:func:`feed_forward_loss` on this algorithm's networks (with a shared encoder: the encoder once,
        the heads on its features)."""
        if self.shared_trunk is not None:
            return functools.partial(feed_forward_loss, *self.shared_trunk)
        return functools.partial(feed_forward_loss, None, self.policy, self.value)

    def update(self, rollout: RolloutBuffer, progress: float) -> dict[str, torch.Tensor]:
        """:func:`ppo_update` on the rollout's flat samples (:class:`FlatSampler`)."""
        config = self.config
        assert self.optimizer is not None, "a learning algorithm has its optimiser"
        self.anneal_learning_rate(progress)
        horizon, num_envs = rollout.rewards.shape
        with torch.no_grad():  # the value of each step's true next observation (or global state)
            next_values = self.value(rollout.next_critic_obs.flatten(0, 1)).view(horizon, num_envs)
        return ppo_update(
            rollout,
            next_values,
            FlatSampler(minibatch_size(config), self.device),
            self.loss_function(),
            functools.partial(self.minimise, optimizer=self.optimizer, max_grad_norm=config.max_grad_norm),
            update_settings(config, gae=self.gae),
            torch.tensor(self.optimizer.param_groups[0]["lr"]),
            self.gradient_step if self.group is None else None,
            self.group,
        )

    def anneal_learning_rate(self, progress: float) -> None:
        """With ``anneal_lr``: the learning rate falls linearly to 0 at ``progress`` 1."""
        config = self.config
        if config.anneal_lr:
            assert self.optimizer is not None, "a learning algorithm has its optimiser"
            anneal_learning_rate(self.optimizer, config.learning_rate, progress)


class A2C(PPO):
    """A2C: one full-batch pass per rollout, -log pi(a|s) * A, RMSprop."""

    name = "a2c"
    config_class = A2CConfig
    recurrent_variant = "phalanx.algos.recurrent:RecurrentA2C"
    vectorized_population = None
    # A2C's config is not a PPOConfig: the PPO methods A2C runs read only the fields both have
    config: A2CConfig  # type: ignore[assignment]

    def make_optimizer(self) -> torch.optim.Optimizer | None:
        config = self.config
        return make_rmsprop(
            self.parameters, lr=config.learning_rate, alpha=config.rmsprop_alpha, eps=config.rmsprop_eps
        )
