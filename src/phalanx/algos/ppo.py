"""PPO and its sibling A2C: on-policy actor-critic learning from a (T, N) rollout.

The learning rule is written once, in :func:`actor_critic_loss`: the loss of a minibatch, as a function
of (networks, batch, hyperparameters), for one agent or for P members at once (a leading member dim on
the batch, one hyperparameter value per member; see its docstring). :meth:`PPO.update` drives it:

1. value of every true next observation (``next_obs`` is the final observation where an episode
   ended), so that truncated episodes bootstrap and terminated ones do not;
2. GAE(lambda) advantages and returns;
3. ``epochs`` passes of shuffled minibatches over the T*N samples, minimising
   ``-min(r*A, clip(r, 1-e, 1+e)*A) + value_coef * value_loss - entropy_coef * entropy``,
   with optional value clipping, gradient-norm clipping and a KL early stop.

:meth:`PPO.compile` runs each minibatch's gradient step (loss, gradient, clipping, the optimiser's
step) as one compiled graph (:class:`~phalanx.gradient_step.GradientStep`); the eager step stays the
reference.
A2C is the same machinery with one full-batch pass, the plain policy-gradient loss (``clip_range``
None) and RMSprop. The vectorized population (:mod:`phalanx.population.vectorized`) drives the same
rule for P members.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import torch
from torch import nn

from phalanx.algos.actor_critic_config import A2CConfig, ActorCriticConfig, PPOConfig
from phalanx.algos.base import ActingModule, Algorithm
from phalanx.buffers import RolloutBuffer, compute_gae, compute_gae_scan
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
from phalanx.optim import make_adam, make_rmsprop

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
        surrogate = torch.min(ratio * advantages, ratio.clamp(low, high) * advantages)
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
        clipped = old_values + (values - old_values).clamp(-clip, clip)
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


def rollout_advantages(
    rollout: RolloutBuffer,
    next_values: Tensor,
    gamma: Hyperparameter,
    gae_lambda: Hyperparameter,
    gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae,
) -> tuple[Tensor, Tensor]:
    """GAE advantages and returns ``(T, N)`` of a rollout, from the value of every step's true next
    observation ``(T, N)``; ``gamma`` and ``gae_lambda`` are floats, or ``(N,)`` tensors (one per row).
    ``gae``: :func:`~phalanx.buffers.compute_gae` (the loop, the reference) or, for a compiled update,
    :func:`~phalanx.buffers.compute_gae_scan`."""
    return gae(
        rollout.rewards,
        rollout.values,
        next_values,
        rollout.terminated,
        rollout.dones,
        gamma,  # type: ignore[arg-type]  # a tensor broadcasts like a float
        gae_lambda,  # type: ignore[arg-type]
    )


def _like(hyperparameter: Hyperparameter, samples: Tensor) -> Hyperparameter:
    """A tensor hyperparameter in the samples' dtype (a Python float is cast by the op itself)."""
    return hyperparameter.to(samples.dtype) if isinstance(hyperparameter, Tensor) else hyperparameter


class PPO(Algorithm):
    name = "ppo"
    config_class = PPOConfig
    on_policy = True
    recurrent_variant = "phalanx.algos.recurrent:RecurrentPPO"
    vectorized_population = "phalanx.population.vectorized:VectorizedPPO"
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
        self.optimizer = self.make_optimizer()
        self.gradient_step: GradientStep | None = None
        """The compiled gradient step (:meth:`compile`); None: the eager step, the reference."""
        self.gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae

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
        return GaussianPolicy(
            features,
            int(action_space.shape[0]),
            config.hidden_sizes,
            config.activation,
            config.log_std_init,
            encoder,
        )

    def make_optimizer(self) -> torch.optim.Optimizer:
        return make_adam(self.parameters, lr=self.config.learning_rate, eps=1e-5)

    def rollout_buffer(self, horizon: int, num_envs: int, *args: Any, **kwargs: Any) -> RolloutBuffer:
        """The rollout buffer this algorithm learns from: ``RolloutBuffer(horizon, num_envs, *args,
        **kwargs)`` (a recurrent policy's also stores its memory)."""
        return RolloutBuffer(horizon, num_envs, *args, **kwargs)

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

    def acting_module(self, stochastic: bool = False) -> PolicyHeadActing:
        return PolicyHeadActing(self.policy, stochastic)

    @classmethod
    def side_by_side(cls, agents: list[Algorithm]) -> MemberActor:
        """The k policies as one ensemble: one batched forward for all k blocks of rows."""
        return MemberActor.of([agent.policy for agent in agents])  # type: ignore[attr-defined]

    # -- learning --------------------------------------------------------------------------------
    def compile(self) -> list[str]:
        """Run :meth:`update` compiled from now on: each minibatch's gradient step (gathering the
        minibatch, :func:`actor_critic_loss`, its gradient, clipping and the optimiser's step) as one
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
                self.minibatch_loss,
                self.config.max_grad_norm,
            )
            self.gradient_step.compile()
            self.gae = compute_gae_scan
        return ["update"]

    def loss_modules(self) -> list[nn.Module]:
        """The modules :meth:`minibatch_loss` computes with, each parameter in one of them once: the
        policy and the value function, or with a shared encoder the encoder and the two heads on its
        features (a module tree holding the encoder twice, tied, does not compile under torch.func)."""
        if self.shared_trunk is not None:
            return list(self.shared_trunk)
        return [self.policy, self.value]

    def update(self, rollout: RolloutBuffer, progress: float) -> dict[str, torch.Tensor]:
        config = self.config
        if config.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = config.learning_rate * max(1.0 - progress, 0.0)

        # 1-2. Advantages from the value of each step's true next observation (or global state).
        with torch.no_grad():
            next_values = self.next_values(rollout)  # (T, N)
        advantages, returns = rollout_advantages(
            rollout, next_values, config.gamma, config.gae_lambda, self.gae
        )

        old_log_probs = rollout.log_probs.flatten()  # (T*N,)
        old_values = rollout.values.flatten()
        advantages = advantages.flatten()
        returns = returns.flatten()
        # The per-sample scalars as rows of one tensor, so that a minibatch gathers them in one op.
        targets = torch.stack((old_log_probs, advantages, old_values, returns))  # (4, T*N)
        inputs = self.loss_inputs(rollout)

        # 3. Minibatch epochs. The metrics are computed once, after them, from what each step kept.
        compiled_step = self.gradient_step if self.group is None else None
        step_metrics: list[dict[str, torch.Tensor]] = []  # policy_loss, value_loss, entropy of each step
        ratios: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ratio, log_ratio) of each step
        for _epoch in range(self.num_epochs()):
            for index in self.minibatch_indices(rollout):
                if compiled_step is None:
                    loss, (metrics, ratio, log_ratio) = self.minibatch_loss(targets, index, *inputs)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.optimizer_step(self.optimizer, config.max_grad_norm)
                else:
                    _, (metrics, ratio, log_ratio) = compiled_step(targets, index, *inputs)
                step_metrics.append(metrics)
                ratios.append((ratio, log_ratio))
            if self.stop_early(*ratios[-1]):
                break

        with torch.no_grad():  # losses: means over the gradient steps; the rest: over all their samples
            metrics = {
                name: torch.stack([step[name] for step in step_metrics]).mean() for name in step_metrics[0]
            }
            ratio, log_ratio = (torch.cat(values) for values in zip(*ratios, strict=True))  # every sample's
            metrics.update(ratio_metrics(ratio, log_ratio, self.loss_hyperparameters().clip_range))
            explained = 1 - (returns - old_values).var() / (returns.var() + 1e-8)
        metrics["explained_variance"] = explained
        metrics["learning_rate"] = torch.tensor(self.optimizer.param_groups[0]["lr"])
        metrics["gradient_steps"] = torch.tensor(float(len(step_metrics)))
        return metrics

    def next_values(self, rollout: RolloutBuffer) -> Tensor:
        """The value ``(T, N)`` of every step's true next observation (or global state)."""
        horizon, num_envs = rollout.rewards.shape
        return self.value(rollout.next_critic_obs.flatten(0, 1)).view(horizon, num_envs)

    def loss_inputs(self, rollout: RolloutBuffer) -> tuple[Tensor | None, ...]:
        """What :meth:`minibatch_loss` reads of the rollout besides the targets, flattened ``(T*N, ...)``:
        observations, actions and the value function's input (None: it reads the observations)."""
        obs = rollout.obs.flatten(0, 1)  # (T*N, obs_dim)
        actions = rollout.actions.flatten(0, 1)  # (T*N,) or (T*N, act_dim)
        # (T*N, critic_dim): the value function's input, if it is not obs itself (a centralised critic)
        critic_obs = None if rollout.critic_obs is rollout.obs else rollout.critic_obs.flatten(0, 1)
        return obs, actions, critic_obs

    def minibatch_indices(self, rollout: RolloutBuffer) -> list[Tensor]:
        """One epoch's minibatches: shuffled indices into the ``T*N`` flattened samples."""
        batch_size = rollout.rewards.numel()
        permutation = torch.randperm(batch_size, device=self.device)
        return list(permutation.split(self.minibatch_size(batch_size)))

    def minibatch_loss(
        self, targets: Tensor, index: Tensor, obs: Tensor, actions: Tensor, critic_obs: Tensor | None
    ) -> tuple[Tensor, tuple[dict[str, Tensor], Tensor, Tensor]]:
        """The loss of the minibatch ``index`` of the flattened rollout (``targets``: the ``(4, T*N)``
        old log-probabilities, advantages, old values and returns; ``critic_obs`` None: the value
        function reads ``obs``), with the step's metrics, ratios and log-ratios."""
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
        policy, value = self.policy, self.value
        if self.shared_trunk is not None:  # the encoder once, both heads on its features
            encoder, policy, value = self.shared_trunk
            features = encoder(minibatch_obs)
            batch = batch._replace(obs=features, critic_obs=features)
        result = actor_critic_loss(policy, value, batch, self.loss_hyperparameters())
        return result.loss, (result.metrics, result.ratio, result.log_ratio)

    # The pieces where A2C differs.
    def num_epochs(self) -> int:
        return self.config.epochs

    def minibatch_size(self, batch_size: int) -> int:
        return self.config.minibatch_size

    def loss_hyperparameters(self) -> ActorCriticHyperparameters:
        """The config's values of :func:`actor_critic_loss`'s hyperparameters."""
        config = self.config
        return ActorCriticHyperparameters(
            config.value_coef,
            config.entropy_coef,
            config.clip_range,
            config.clip_value,
            config.normalize_advantages,
        )

    def stop_early(self, ratio: torch.Tensor, log_ratio: torch.Tensor) -> bool:
        """After an epoch: whether the approximate KL of its last step exceeds target_kl."""
        target = self.config.target_kl
        if target is None:
            return False
        approx_kl = ((ratio - 1) - log_ratio).mean()
        if self.group is not None:  # every learner must stop after the same epoch: decide on the mean
            approx_kl = approx_kl.reshape(1).clone()
            self.group.average([approx_kl])
        return bool(approx_kl > target)  # one host sync per epoch, only if target_kl is set


class A2C(PPO):
    """A2C: one full-batch pass per rollout, -log pi(a|s) * A, RMSprop."""

    name = "a2c"
    config_class = A2CConfig
    recurrent_variant = "phalanx.algos.recurrent:RecurrentA2C"
    vectorized_population = None
    config: A2CConfig

    def make_optimizer(self) -> torch.optim.Optimizer:
        config = self.config
        return make_rmsprop(
            self.parameters, lr=config.learning_rate, alpha=config.rmsprop_alpha, eps=config.rmsprop_eps
        )

    def num_epochs(self) -> int:
        return 1

    def minibatch_size(self, batch_size: int) -> int:
        return batch_size

    def loss_hyperparameters(self) -> ActorCriticHyperparameters:
        """The plain policy gradient, no value clipping."""
        config = self.config
        return ActorCriticHyperparameters(
            config.value_coef, config.entropy_coef, None, None, config.normalize_advantages
        )

    def stop_early(self, ratio: torch.Tensor, log_ratio: torch.Tensor) -> bool:
        return False
