"""VectorizedPPO: P PPO members as the leading dimension of one run (see
:mod:`phalanx.population.vectorized_base` for what every vectorized population shares).

A round is one rollout of ``horizon`` steps of every member's sub-envs and one PPO update of every
member on it, by PPO's own update (:func:`phalanx.algos.ppo.ppo_update`, called once for all P members,
with a :class:`MemberSampler`): policies and value networks are :class:`~phalanx.nets.EnsembleMLP` s,
GAE takes ``(P,)`` gamma and lambda, gradients are clipped per member and
:class:`~phalanx.optim.VectorizedAdam` steps the members' flat ``(P, D)`` parameters with a learning
rate per member. On CPU, member i ends where ``phalanx.train`` with ``seed = seeds[i]`` and member i's
hyperparameters ends (within float rounding); tests check it. ``benchmarks/population_vectorized.py``
measures P members against one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn

from phalanx.algos.actor_critic_config import PPOConfig
from phalanx.algos.base import Algorithm
from phalanx.algos.ppo import (
    PPO,
    ActorCriticBatch,
    ActorCriticHyperparameters,
    MinibatchLoss,
    actor_critic_loss,
    ppo_update,
    update_settings,
)
from phalanx.buffers import RolloutBuffer, StepLayout, compute_gae, compute_gae_scan
from phalanx.config import TrainConfig
from phalanx.envs.core import Tensor
from phalanx.errors import ConfigError
from phalanx.gradient_step import GradientStep
from phalanx.nets import (
    CategoricalPolicy,
    GaussianPolicy,
    MemberActor,
    MemberCategoricalPolicy,
    MemberGaussianPolicy,
    MemberValueNet,
)
from phalanx.optim import (
    VectorizedAdam,
    clip_member_grad_norm,
    flatten_parameters,
    linear_decay,
    load_adam_state,
    member_backward,
)
from phalanx.population.vectorized_base import SingleLayout, VectorizedPopulation, ensemble_linear_weights

MEMBER_HYPERPARAMETERS: tuple[str, ...] = (
    "learning_rate",
    "entropy_coef",
    "clip_range",
    "clip_value",
    "gamma",
    "gae_lambda",
    "value_coef",
    "max_grad_norm",
)
"""PPOConfig fields that may differ per member; the others shape the networks, the rollout or the update."""
OPTIONAL_HYPERPARAMETERS = ("clip_value", "max_grad_norm")
"""Per-member hyperparameters that may be None (no clipping); stored as +inf in the tensors."""


# -- what the on-policy populations share ------------------------------------------------------------
class FlatAdamPopulation(VectorizedPopulation):
    """What VectorizedPPO and VectorizedPQN share: a round is one rollout of every member's sub-envs
    (:meth:`_collect`) and one update of every member on it (:meth:`_update`); every member's parameters
    are one row of a flat ``(P, D)`` buffer (``parameters``, ``gradients``), stepped by one VectorizedAdam
    with a learning rate per member (``lr_factor``: anneal_lr's factor of the last update). Here: the
    round, the eager and the compiled gradient step, the learner's checkpointed state, and a member's
    weights and Adam moments given to a single run."""

    parameters: Tensor
    gradients: Tensor
    optimizer: VectorizedAdam
    lr_factor: float
    gradient_step: GradientStep | None
    gae: Callable[..., tuple[Tensor, Tensor]]
    horizon: int
    _layout: SingleLayout
    _clips_gradients: bool

    def _collect(self) -> None:
        """Fill the rollout buffer with a rollout of every member's sub-envs."""
        raise NotImplementedError

    def _update(self, progress: float) -> dict[str, Tensor]:
        """One update of every member on the rollout; its ``(P,)`` metrics."""
        raise NotImplementedError

    def _train_round(self, progress: float) -> dict[str, Tensor]:
        self._collect()
        self.updates += 1
        return self._update(progress)

    def networks(self) -> list[nn.Module]:
        """The members' networks that :meth:`loss_function` differentiates."""
        raise NotImplementedError

    def loss_function(self) -> Callable[[Tensor], tuple[Tensor, Any]]:
        """The loss ``(P,)`` of every member on its packed minibatch (the member sampler's)."""
        raise NotImplementedError

    def compile(self) -> list[str]:
        """Run the members' update compiled from now on, as the algorithm's own compile does: each
        minibatch's gradient step of every member (loss, gradients, per-member clipping, the VectorizedAdam
        step with a learning rate per member) as one graph (:class:`~phalanx.gradient_step.GradientStep`),
        the targets by :func:`~phalanx.buffers.compute_gae_scan`. The hyperparameters are tensor inputs
        (mutating them compiles nothing); a host-side branch of the loss (PPO's: whether any member clips
        values) compiles a second graph once when it changes. Acting stays eager."""
        if self.gradient_step is None:
            self.gradient_step = GradientStep(
                self.optimizer,
                self.networks(),
                self.loss_function(),
                self.hyperparameter_tensors["max_grad_norm"],
            )
            self.gradient_step.compile()
            self.gae = compute_gae_scan
        return ["update"]

    def _member_tensors(self) -> list[Tensor]:
        optimizer = self.optimizer
        return [self.parameters, optimizer.exp_avg, optimizer.exp_avg_sq, optimizer.steps]

    def _learner_state(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters.clone(),
            "optimizer": self.optimizer.state_dict(),
            "progress": self._progress(),
        }

    def _load_learner_state(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.parameters.copy_(state["parameters"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_progress(state["progress"])

    def _progress(self) -> dict[str, float]:
        """Where the schedules stand (checkpointed with the learner)."""
        return {"lr_factor": self.lr_factor}

    def _load_progress(self, progress: dict[str, float]) -> None:
        self.lr_factor = progress["lr_factor"]

    def _gradient_steps(
        self, progress: float, anneal_lr: bool
    ) -> tuple[Tensor, Callable[[Tensor], None], Callable[..., Any] | None]:
        """What this update steps with: the members' learning rates ``(P,)`` float64 (``lr_factor`` moved to
        ``progress`` first, with ``anneal_lr``), the eager gradient step on a loss ``(P,)``
        (:meth:`_minimise`) and the compiled one (None until :meth:`compile`)."""
        if anneal_lr:
            self.lr_factor = linear_decay(progress)
        hp = self.hyperparameter_tensors  # (P,) each
        learning_rate = hp["learning_rate"] * self.lr_factor
        max_grad_norm = hp["max_grad_norm"].float()  # inf: no clipping
        minimise = functools.partial(self._minimise, learning_rate=learning_rate, max_grad_norm=max_grad_norm)
        compiled_step = (
            None
            if self.gradient_step is None
            else functools.partial(self.gradient_step, learning_rate=learning_rate)
        )
        return learning_rate, minimise, compiled_step

    def _in_env_rows(self, values: Tensor) -> Tensor:
        """Values ``(P, T * N)`` of the member sampler's flattening in the rollout's layout ``(T, P * N)``."""
        members, horizon, num_envs = self.num_members, self.horizon, self.num_envs
        return values.view(members, horizon, num_envs).transpose(0, 1).reshape(horizon, members * num_envs)

    def _minimise(self, loss: Tensor, learning_rate: Tensor, max_grad_norm: Tensor) -> None:
        """The eager gradient step of every member on its loss ``(P,)``: gradients, clipping per member
        (clip_grad_norm_ over all its parameters), a VectorizedAdam step."""
        self.gradients.zero_()
        member_backward(loss)
        with torch.no_grad():
            if self._clips_gradients:
                clip_member_grad_norm(self.gradients, max_grad_norm)
            self.optimizer.step(learning_rate)

    @torch.no_grad()
    def _load_flat_member(
        self,
        member: int,
        parameters: Sequence[Tensor],
        optimizer: torch.optim.Optimizer,
        learning_rate: float,
    ) -> None:
        """Member ``member``'s weights into a single run's ``parameters`` and its Adam state (step, moments,
        learning rate: ``learning_rate`` times ``lr_factor``) into the run's ``optimizer``."""
        for parameter, tensor in zip(parameters, self.single_tensors(member), strict=True):
            parameter.copy_(tensor)
        load_adam_state(
            optimizer,
            learning_rate * self.lr_factor,
            float(self.optimizer.steps[member]),
            self._layout.flat(self.optimizer.exp_avg[member]),
            self._layout.flat(self.optimizer.exp_avg_sq[member]),
        )

    def single_tensors(self, member: int) -> list[Tensor]:
        """Member ``member``'s ``(D,)`` row of the flat parameters as the tensors of its single run's."""
        return self._layout.tensors(self.parameters[member])


# -- PPO -------------------------------------------------------------------------------------------------
class VectorizedPPO(FlatAdamPopulation):
    """P PPO members trained as one batched run; see the module docstring.

    ``config`` is an ordinary PPO TrainConfig (``phalanx.make_config("ppo", env, ...)``); ``total_steps``
    is the horizon of ``anneal_lr`` only. A round is one rollout of ``horizon`` steps of every member's
    sub-envs and one PPO update of every member on it, by :func:`~phalanx.algos.ppo.ppo_update`.
    """

    algorithm_class = PPO
    member_hyperparameters = MEMBER_HYPERPARAMETERS
    optional_hyperparameters = OPTIONAL_HYPERPARAMETERS
    shared_hyperparameters = (
        "hidden_sizes",
        "activation",
        "horizon",
        "epochs",
        "minibatch_size",
        "normalize_advantages",
        "anneal_lr",
        "log_std_init",
    )

    @classmethod
    def check_config(cls, config: TrainConfig) -> None:
        super().check_config(config)
        hp = _ppo_settings(config)
        if hp.recurrent is not None:
            raise ConfigError(
                f"recurrent = {hp.recurrent!r} is not supported by VectorizedPPO: its "
                "members are feed-forward networks batched into one. Train a population of recurrent "
                "members with the process backend (phalanx population run ... --backend process), one "
                "process per member."
            )
        if hp.target_kl is not None:
            raise ConfigError(
                f"target_kl = {hp.target_kl!r} is not supported by VectorizedPPO: its "
                "early stop would end each member's epochs at a different point, which the batched update "
                "(every member takes the same gradient steps) does not do. Set target_kl to None, or train "
                "the members as separate runs (the process backend)."
            )

    def _build_members(self, algorithms: list[Algorithm]) -> None:
        hp = _ppo_settings(self.config)
        ppos = cast(list[PPO], algorithms)  # built from algorithm_class
        self.horizon = hp.horizon
        self.steps_per_round = self.rollout_size = hp.horizon * self.num_envs  # env steps per member
        policies = [algorithm.policy for algorithm in ppos]
        if self.discrete:
            categorical = cast(list[CategoricalPolicy], policies)  # PPO's heads of Discrete actions
            self.policy: MemberCategoricalPolicy | MemberGaussianPolicy = MemberCategoricalPolicy(categorical)
        else:
            self.policy = MemberGaussianPolicy(cast(list[GaussianPolicy], policies))  # of Box actions
        self.value = MemberValueNet([algorithm.value for algorithm in ppos])
        self.policy.to(self.device)
        self.value.to(self.device)
        member_parameters = [*self.policy.parameters(), *self.value.parameters()]
        transposed = ensemble_linear_weights(self.policy, self.value)
        self._layout = SingleLayout(member_parameters, ppos[0].parameters, transposed)
        self.parameters, self.gradients = flatten_parameters(member_parameters)  # (P, D) each
        self.optimizer = VectorizedAdam(self.parameters, self.gradients, eps=1e-5)
        self.gradient_step: GradientStep | None = None  # compiled (compile()); None: the eager step
        self.gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae
        layout = StepLayout.of(self.observation_space, self.action_space)
        self.buffer = RolloutBuffer(hp.horizon, self.num_members * self.num_envs, layout, self.device)
        self.lr_factor = 1.0  # anneal_lr: the factor of the last update

    def _refresh_flags(self) -> None:
        """Which optional branches any member needs (host-side, so that the update does not sync)."""
        hp = self.hyperparameter_tensors
        self._clips_values = bool(torch.isfinite(hp["clip_value"]).any())
        self._clips_gradients = bool(torch.isfinite(hp["max_grad_norm"]).any())

    def _evaluation_actor(self) -> MemberActor:
        return MemberActor(self.policy, self.num_members)

    def networks(self) -> list[nn.Module]:
        return [self.policy, self.value]

    # -- a round: collect a rollout, then one PPO update --------------------------------------------------
    @torch.no_grad()
    def _collect(self) -> None:
        """Fill the rollout buffer with ``horizon`` steps of every member's sub-envs (rows as the env's)."""
        for step in range(self.horizon):
            obs = self.obs  # (P * N, obs_dim)
            by_member = obs.view(self.num_members, self.num_envs, -1)  # (P, N, obs_dim)
            actions, log_probs = self.policy.sample_members(by_member, self.generators)  # (P, N[, A]), (P, N)
            values = self.value(by_member)  # (P, N)
            actions = actions.flatten(0, 1)  # (P * N[, A])
            next_obs, rewards, terminated, truncated, info = self.env.step(actions)
            dones = terminated | truncated
            self.buffer.add(
                step,
                obs,
                actions,
                log_probs.flatten(),
                values.flatten(),
                rewards,
                terminated,
                dones,
                info["final_obs"],
            )
            self._record_episodes(dones, info)
            self.obs = next_obs

    def _update(self, progress: float) -> dict[str, Tensor]:
        """:func:`~phalanx.algos.ppo.ppo_update` of every member at once: GAE with each member's gamma and
        lambda, epochs of minibatches of each member's own shuffles (:class:`MemberSampler`),
        :func:`member_loss`, gradient clipping per member and a VectorizedAdam step with a learning rate
        per member. The metrics, as PPO.update's, ``(P,)``."""
        config = _ppo_settings(self.config)
        learning_rate, minimise, compiled_step = self._gradient_steps(progress, config.anneal_lr)
        hp = self.hyperparameter_tensors  # (P,) each
        rollout = self.buffer  # (T, P * N): the env's row layout
        num_envs = self.num_envs
        sampler = MemberSampler(
            self.num_members, num_envs, config.minibatch_size, self.generators, self.discrete
        )
        with torch.no_grad():  # the value of each step's true next observation, in the env's row layout
            next_values = self._in_env_rows(self.value(sampler.flatten(rollout.next_obs)))
        settings = update_settings(  # gamma and lambda: the members' values repeated for each of their rows
            config,
            gamma=hp["gamma"].float().repeat_interleave(num_envs),
            gae_lambda=hp["gae_lambda"].float().repeat_interleave(num_envs),
            loss=self._loss_hyperparameters(),
            gae=self.gae,
        )
        return ppo_update(
            rollout,
            next_values,
            sampler,
            self.loss_function(),
            minimise,
            settings,
            learning_rate.float(),
            compiled_step,
        )

    def loss_function(self) -> MinibatchLoss:
        """:func:`member_loss` on the members' networks."""
        assert self.observation_space.shape is not None, "a flat observation space (check_config)"
        obs_dim = self.observation_space.shape[0]
        return functools.partial(member_loss, self.policy, self.value, obs_dim, self.discrete)

    def _loss_hyperparameters(self) -> ActorCriticHyperparameters:
        """The members' values of the loss's hyperparameters, float64 tensors: ``(P, 1)`` for the clip
        ranges, which act on every sample, ``(P,)`` for the loss weights; clip_value None when no member
        clips values (the loss then skips the branch)."""
        hp = self.hyperparameter_tensors  # (P,) each
        return ActorCriticHyperparameters(
            value_coef=hp["value_coef"],
            entropy_coef=hp["entropy_coef"],
            clip_range=hp["clip_range"].unsqueeze(1),
            clip_value=hp["clip_value"].unsqueeze(1) if self._clips_values else None,
            normalize_advantages=_ppo_settings(self.config).normalize_advantages,
        )

    # -- a member as a single PPO --------------------------------------------------------------------------
    @torch.no_grad()
    def _load_member(self, member: int, algorithm: Algorithm) -> None:
        """Member ``member``'s weights and Adam state (step, moments, learning rate) into a single PPO."""
        # ignored below: a single run of algorithm_class, PPO
        ppo: PPO = algorithm  # type: ignore[assignment]
        assert ppo.optimizer is not None, "a member's run, built to learn"
        self._load_flat_member(member, ppo.parameters, ppo.optimizer, ppo.config.learning_rate)


class MemberSampler:
    """P members' minibatches side by side (a :class:`~phalanx.algos.ppo.Sampler`): each epoch, member
    p's samples shuffled by its own generator (the draws of a single run with its seed), cut into
    minibatches of ``minibatch_size``; each the ``(P, M, F)`` slice of every member's samples packed in
    one tensor (observation, action, old log-probability, advantage, old value, return), so that a
    shuffle is one gather per epoch: the input of :func:`member_loss`."""

    def __init__(
        self,
        members: int,
        num_envs: int,
        minibatch_size: int,
        generators: list[torch.Generator],
        discrete: bool,
    ) -> None:
        self.members, self.num_envs, self.minibatch_size = members, num_envs, minibatch_size
        self.generators = generators
        self.discrete = discrete

    def flatten(self, steps: Tensor) -> Tensor:
        """``(T, P * N, ...)`` rollout rows as ``(P, T * N, ...)``: member p's samples in the order of a
        single run's flattened ``(T * N, ...)`` rollout."""
        horizon, members = steps.shape[0], self.members
        by_member = steps.view(horizon, members, self.num_envs, *steps.shape[2:]).transpose(0, 1)
        return by_member.reshape(members, horizon * self.num_envs, *steps.shape[2:])

    def data(self, rollout: RolloutBuffer, targets: Tensor) -> tuple[Tensor]:
        """Every member's samples in one ``(P, T*N, obs_dim + A + 4)`` tensor."""
        obs = self.flatten(rollout.obs)  # (P, T*N, obs_dim)
        actions = self.flatten(rollout.actions).to(obs.dtype)  # (P, T*N) or (P, T*N, A)
        if self.discrete:
            actions = actions.unsqueeze(-1)
        return (torch.cat((obs, actions, targets.movedim(0, -1)), dim=-1),)

    def minibatches(self, data: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        (samples,) = data
        batch_size, size = samples.shape[1], self.minibatch_size
        permutation = torch.stack(
            [torch.randperm(batch_size, generator=g, device=samples.device) for g in self.generators]
        )  # (P, T*N)
        shuffled = samples.gather(1, permutation.unsqueeze(-1).expand(-1, -1, samples.shape[-1]))
        return [(shuffled[:, start : start + size],) for start in range(0, batch_size, size)]


def member_loss(
    policy: MemberCategoricalPolicy | MemberGaussianPolicy,
    value: MemberValueNet,
    obs_dim: int,
    discrete: bool,
    hyperparameters: ActorCriticHyperparameters,
    minibatch: Tensor,
) -> tuple[Tensor, tuple[dict[str, Tensor], Tensor, Tensor]]:
    """Every member's :func:`~phalanx.algos.ppo.actor_critic_loss` ``(P,)`` on its ``(P, M, F)`` minibatch
    of :class:`MemberSampler`'s packed samples."""
    obs, actions, targets = minibatch.split([obs_dim, minibatch.shape[-1] - obs_dim - 4, 4], dim=-1)
    if discrete:
        actions = actions.squeeze(-1)
    old_log_probs, advantages, old_values, returns = targets.unbind(-1)  # (P, M) each
    batch = ActorCriticBatch(obs, actions, old_log_probs, advantages, old_values, returns, obs)
    result = actor_critic_loss(policy, value, batch, hyperparameters)
    return result.loss, (result.metrics, result.ratio, result.log_ratio)


def _ppo_settings(config: TrainConfig) -> PPOConfig:
    """The members' shared hyperparameters: PPO's config class (TrainConfig.validate checks the type)."""
    return cast(PPOConfig, config.hyperparameters)
