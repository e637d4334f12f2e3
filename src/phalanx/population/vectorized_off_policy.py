"""Vectorized off-policy populations: P SAC (or TD3) members as the leading dimension of one run.

Every member is an ordinary SAC / TD3 agent, learning by the rule its single run uses
(``phalanx.algos.sac.SAC_RULE``, ``phalanx.algos.td3.TD3_RULE``), but the P of them share every
kernel launch:

- networks: the actors of all members are one :class:`~phalanx.nets.EnsembleMLP`; the K critics of
  every member are one ensemble of ``P * K`` members (member p's critics are rows ``[p * K, (p + 1) * K)``);
- environment: one VecEnv of ``P * num_envs`` sub-envs, member i owning rows
  ``[i * num_envs, (i + 1) * num_envs)``, each block seeded as member i's single run;
- replay: one ring of ``P * num_envs`` columns; each member samples its own columns only;
- hyperparameters: those that may differ per member (:attr:`member_hyperparameters`) are ``(P,)``
  tensors that broadcast into the rule, the exploration noise, the Polyak steps and the optimisers;
- optimisers: :class:`~phalanx.optim.VectorizedAdam` over each network's flattened member parameters,
  with a learning rate per member.

Members stay independent, and every random draw of member i (warm-up actions, exploration noise,
replay indices, the rule's action noise) comes from its own ``torch.Generator``, started where the
global RNG of member i's single run stands after that run built its networks: on CPU member i ends
where ``phalanx.train`` with ``seed = seeds[i]`` and member i's hyperparameters ends (within float
rounding: batched matmuls and a batched Adam). Tests check it.

What is not off-policy specific (seeds and generators, member hyperparameters, the member env,
evaluation, copying members, the state dict, a member as a single run's checkpoint) is
:class:`~phalanx.population.vectorized_base.VectorizedPopulation`'s; a round here is one VecEnv step of every
member and the updates it owes.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import nn

from phalanx.algos.base import Algorithm
from phalanx.algos.ddpg import (
    DDPG,
    Draws,
    EnsembleCriticAlgorithm,
    TargetDraws,
    ensemble_critic_update,
    member_view,
)
from phalanx.algos.sac import SAC, SquashedGaussianActor
from phalanx.algos.td3 import TD3
from phalanx.buffers import ReplayBatch, ReplayBuffer, StepLayout
from phalanx.config import TrainConfig
from phalanx.envs.core import Tensor
from phalanx.errors import ConfigError
from phalanx.gradient_step import GradientStep
from phalanx.nets import EnsembleLinear, EnsembleMLP
from phalanx.optim import VectorizedAdam, flatten_parameters, load_adam_state
from phalanx.population.vectorized_base import SingleLayout, VectorizedPopulation, ensemble_linear_weights
from phalanx.train.learner import replay_settings

GRADIENT_LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"
"""torch's one-time hint when a .grad is a view of a flat gradient tensor (flatten_parameters), on purpose."""
ADAM_EPS = 1e-8
"""The eps of the single runs' Adam (``phalanx.optim.make_adam``, torch's default)."""
SingleParts = Callable[[Any], tuple[list[Tensor], torch.optim.Optimizer | None]]
"""A single run's parameters that correspond to a :class:`MemberFlat`, and their optimiser (or None)."""


class MemberDraws(Draws):
    """The rule's draws for P members: member i's slice drawn from ``generators[i]``, exactly what a single
    run with that generator's state draws."""

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        self.generators = generators

    def normal(self, like: Tensor) -> Tensor:
        noise = torch.empty_like(like)  # (P, ...)
        for view, generator in zip(noise.unbind(0), self.generators, strict=True):
            view.normal_(generator=generator)
        return noise

    def uniform(self, like: Tensor) -> Tensor:
        noise = torch.empty_like(like)
        for view, generator in zip(noise.unbind(0), self.generators, strict=True):
            view.uniform_(generator=generator)
        return noise

    def subset(self, size: int, count: int, device: torch.device) -> Tensor:
        return torch.stack(
            [
                torch.randperm(size, generator=generator, device=device)[:count]
                for generator in self.generators
            ]
        )  # (P, count)


class MemberFlat:
    """The parameters of some member-batched modules as one ``(rows, D)`` tensor (flatten_parameters), with
    its VectorizedAdam; ``rows`` is P, or P * K for the critics (K rows per member).

    ``single`` gives the same parameters of a single run (in the same order) and their optimiser (None
    for a target network), which :meth:`load_single` fills with a member's; ``template`` is a single run
    to read their shapes from. ``transposed``: the ids of those of ``parameters`` that are EnsembleLinear
    weights where the single run has an ``nn.Linear`` (:func:`ensemble_linear_weights`)."""

    def __init__(
        self,
        parameters: Sequence[nn.Parameter],
        rows_per_member: int,
        single: SingleParts,
        template: EnsembleCriticAlgorithm,
        transposed: set[int] | None = None,
    ) -> None:
        self.parameters = list(parameters)
        self.single = single
        single_parameters, _ = single(template)
        self.layout = SingleLayout(self.parameters, single_parameters, transposed or set(), rows_per_member)
        self.flat, self.gradients = flatten_parameters(self.parameters)
        self.rows_per_member = rows_per_member
        self.optimizer = VectorizedAdam(self.flat, self.gradients, eps=ADAM_EPS)
        self.gradient_step: GradientStep | None = None
        """The compiled gradient step (:meth:`compile`); None: the eager step, the reference."""

    def compile(self, modules: Sequence[nn.Module], loss: Callable[..., tuple[Tensor, Any]]) -> None:
        """Minimise ``loss`` (the one :meth:`minimise` is given) with ``modules`` as one compiled graph
        from now on (:class:`~phalanx.gradient_step.GradientStep` on this flat's VectorizedAdam)."""
        if self.gradient_step is None:
            self.gradient_step = GradientStep(self.optimizer, modules, loss)
            self.gradient_step.compile()

    def minimise(
        self, loss: Callable[..., tuple[Tensor, Any]], inputs: tuple[Any, ...], learning_rate: Tensor
    ) -> tuple[Tensor, Any]:
        """One Adam step on the members' ``(P,)`` losses ``loss(*inputs) -> (losses, aux)``: backward of
        their sum (each member's gradient is its own), or the compiled step; the losses and aux, detached."""
        if self.gradient_step is not None:
            rates = learning_rate.repeat_interleave(self.rows_per_member)
            with torch.no_grad():  # the step differentiates with torch.func, which no_grad leaves alone
                return self.gradient_step(*inputs, learning_rate=rates)
        losses, aux = loss(*inputs)
        self.gradients.zero_()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=GRADIENT_LAYOUT_WARNING)
            losses.sum().backward()
        self.step(learning_rate)
        return losses.detach(), aux

    def step(self, learning_rate: Tensor) -> None:
        """An Adam step on the gradients held; ``learning_rate`` ``(P,)``."""
        self.optimizer.step(learning_rate.repeat_interleave(self.rows_per_member))

    def member_rows(self, member: int) -> slice:
        return slice(member * self.rows_per_member, (member + 1) * self.rows_per_member)

    def tensors(self) -> list[Tensor]:
        """The tensors that make a member what it is: parameters and Adam state, rows first."""
        optimizer = self.optimizer
        return [self.flat, optimizer.exp_avg, optimizer.exp_avg_sq, optimizer.steps]

    @torch.no_grad()
    def load_single(self, member: int, algorithm: EnsembleCriticAlgorithm) -> None:
        """Member ``member``'s values into the parameters of a single run ``algorithm`` and their flat Adam
        (step count and moments; the learning rate is the optimiser's, from the member's config)."""
        parameters, optimizer = self.single(algorithm)
        rows = self.member_rows(member)
        for parameter, tensor in zip(parameters, self.layout.tensors(self.flat[rows]), strict=True):
            parameter.copy_(tensor)
        if optimizer is not None:
            adam = self.optimizer
            load_adam_state(
                optimizer,
                optimizer.param_groups[0]["lr"],
                float(adam.steps[rows][0]),
                self.layout.flat(adam.exp_avg[rows]),
                self.layout.flat(adam.exp_avg_sq[rows]),
            )


def stack_ensembles(ensembles: Sequence[EnsembleMLP]) -> EnsembleMLP:
    """One EnsembleMLP holding the members of ``ensembles`` in order (P ensembles of K: P * K members)."""
    first = ensembles[0]
    with torch.random.fork_rng(devices=[]):  # its throwaway initialisation must not move the RNG
        stacked = EnsembleMLP(
            sum(ensemble.num_members for ensemble in ensembles),
            first.in_dim,
            first.hidden_sizes,
            first.out_dim,
            first.activation,
            layer_norm=first.layer_norm,
        )
    states = [ensemble.state_dict() for ensemble in ensembles]
    stacked.load_state_dict({name: torch.cat([state[name] for state in states]) for name in states[0]})
    first_layer = first.layers[0]
    assert isinstance(first_layer, EnsembleLinear), "an EnsembleMLP starts with an EnsembleLinear"
    return stacked.to(first_layer.weight.device)


class MemberPolicy:
    """The members' deterministic actions as the Evaluator calls them: ``act`` of ``(P * E, obs_dim)`` rows
    gives member i's actions for its block of E rows."""

    def __init__(self, population: VectorizedOffPolicy) -> None:
        self.population = population

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        population = self.population
        actions = population.deterministic(obs.view(population.num_members, -1, *obs.shape[1:]))
        return actions.flatten(0, 1)


# -- the population ------------------------------------------------------------------------------------
class VectorizedOffPolicy(VectorizedPopulation):
    """P members of an ensemble-critic algorithm trained as one batched run; see the module docstring.

    ``config`` is an ordinary TrainConfig of the algorithm (``phalanx.make_config("sac", env, ...)``):
    env, ``num_envs`` (per member), device, network sizes, buffer, batch, warm-up and update-to-data ratio
    are shared; ``seeds[i]`` is member i's seed and ``hyperparameters[i]`` its values of any of
    :attr:`member_hyperparameters`. Subclasses name the algorithm and build its actor.
    """

    algorithm_class: ClassVar[type[EnsembleCriticAlgorithm]]
    member_hyperparameters: ClassVar[tuple[str, ...]] = (
        "learning_rate",
        "critic_learning_rate",
        "gamma",
        "tau",
    )
    optional_hyperparameters: ClassVar[tuple[str, ...]] = ("critic_learning_rate",)
    """None: the member's learning_rate (stored as +inf, resolved by :meth:`learning_rate`)."""
    shared_hyperparameters = (
        "hidden_sizes",
        "activation",
        "num_critics",
        "buffer_size",
        "critic_layer_norm",
        "critic_atoms",
    )

    @classmethod
    def check_config(cls, config: TrainConfig) -> None:
        super().check_config(config)
        n_step = replay_settings(config.hyperparameters).n_step
        if config.normalize_obs or config.normalize_reward or n_step != 1:
            raise ConfigError(
                f"{cls.__name__} supports neither observation/reward normalisation nor n-step returns yet "
                f"(got normalize_obs={config.normalize_obs}, normalize_reward={config.normalize_reward}, "
                f"n_step={n_step}). Turn them off, or train the members as separate "
                "runs (the process backend)."
            )
        off = {"weight_decay": 0.0, "bf16": False, "exploration_noise_range": None}
        chosen = {
            name: value
            for name, value in vars(config.hyperparameters).items()
            if name in off and value != off[name]
        }
        if chosen:
            raise ConfigError(
                f"{cls.__name__} has no {', '.join(chosen)} yet (got {chosen}): its members step one batched "
                "Adam without weight decay, in float32, with one exploration noise per member. Drop them, or "
                "train the members as separate runs (the process backend)."
            )

    # -- construction --------------------------------------------------------------------------------
    def _build_members(self, algorithms: list[Algorithm]) -> None:
        """The members' networks as member-batched modules, their flat parameters and optimisers; a replay
        of ``P * num_envs`` columns. A round is one VecEnv step (``num_envs`` env steps per member)."""
        self.steps_per_round = self.num_envs
        self.draws = MemberDraws(self.generators)
        # ignored below: the members are runs of algorithm_class
        self._build_networks(algorithms)  # type: ignore[arg-type]
        self.buffer = ReplayBuffer(
            replay_settings(self.config.hyperparameters).buffer_size * self.num_members,
            self.num_members * self.num_envs,
            StepLayout.of(self.observation_space, self.action_space),
            self.device,
            members=self.num_members,
        )
        self.updates_owed = 0.0

    def _build_networks(self, algorithms: Sequence[EnsembleCriticAlgorithm]) -> None:
        """The actor, the critics and their targets of every member, as member-batched modules."""
        single = algorithms[0]
        self.num_critics = single.critic.num_members
        self.actor = self.member_actor([algorithm.actor for algorithm in algorithms]).to(self.device)
        self.critic = stack_ensembles([algorithm.critic for algorithm in algorithms]).to(self.device)
        self.critic_target = stack_ensembles([algorithm.critic_target for algorithm in algorithms])
        self.critic_target.to(self.device).requires_grad_(False)
        self.actors = MemberFlat(
            list(self.actor.parameters()),
            1,
            lambda run: (list(run.actor.parameters()), run.actor_optimizer),
            single,
            ensemble_linear_weights(self.actor),
        )
        self.critics = MemberFlat(
            list(self.critic.parameters()),
            self.num_critics,
            lambda run: (run.critic_parameters, run.critic_optimizer),
            single,
        )
        self.critic_targets = MemberFlat(
            list(self.critic_target.parameters()),
            self.num_critics,
            lambda run: (list(run.critic_target.parameters()), None),
            single,
        )
        self.targets = [(self.critic_targets, self.critics)]  # (target, source) pairs of the Polyak step

    def member_actor(self, actors: Sequence[nn.Module]) -> nn.Module:
        """The members' actors as one module taking ``(P, B, obs_dim)``."""
        raise NotImplementedError

    def flats(self) -> list[MemberFlat]:
        """Every member-batched parameter set (networks, targets, temperature)."""
        return [self.actors, self.critics, self.critic_targets]

    # -- the rule's learner ------------------------------------------------------------------------------
    def learning_rate(self, name: str) -> Tensor:
        """``(P,)`` learning rate of an optional per-member rate (+inf, None: the member's learning_rate)."""
        rates = self.hyperparameter_tensors
        return torch.where(torch.isinf(rates[name]), rates["learning_rate"], rates[name])

    def compile(self) -> list[str]:
        """Run the members' two gradient steps compiled from now on, as
        :meth:`~phalanx.algos.ddpg.EnsembleCriticAlgorithm.compile` does for one run: the critics' and the
        actors' step of every member, each one graph with a learning rate per member (a tensor input:
        changing it compiles nothing). The random draws (each member's from its generator), the Polyak
        steps and SAC's temperature step stay eager."""
        rule = self.algorithm_class.rule
        self.critics.compile([self.critic], functools.partial(rule.critic_loss, self))
        self.actors.compile([self.actor], functools.partial(rule.actor_loss, self))
        return ["critic update", "actor update"]

    def step_critic(self, batch: ReplayBatch, draws: TargetDraws, hp: Any) -> tuple[Tensor, Tensor]:
        loss = functools.partial(self.algorithm_class.rule.critic_loss, self)
        return self.critics.minimise(loss, (batch, draws, hp), self.learning_rate("critic_learning_rate"))

    def step_actor(self, obs: Tensor, noise: Tensor | None, hp: Any) -> tuple[Tensor, dict[str, Tensor]]:
        loss = functools.partial(self.algorithm_class.rule.actor_loss, self)
        return self.actors.minimise(loss, (obs, noise, hp), self.hyperparameter_tensors["learning_rate"])

    def set_critic_grad(self, requires_grad: bool) -> None:
        for parameter in self.critics.parameters:
            parameter.requires_grad_(requires_grad)

    @torch.no_grad()
    def update_targets(self) -> None:
        for target, source in self.targets:
            tau = self.hyperparameter_tensors["tau"].to(target.flat.dtype)
            target.flat.lerp_(source.flat, tau.repeat_interleave(target.rows_per_member).unsqueeze(1))

    def rule_hyperparameters(self) -> types.SimpleNamespace:
        """The config's hyperparameters with the per-member ones as ``(P,)`` float tensors, for the rule."""
        hp = self.config.hyperparameters
        shared = {field.name: getattr(hp, field.name) for field in dataclasses.fields(hp)}
        members = {name: tensor.float() for name, tensor in self.hyperparameter_tensors.items()}
        return types.SimpleNamespace(**{**shared, **members})

    # -- acting ----------------------------------------------------------------------------------------
    def explore(self, obs: Tensor) -> Tensor:
        """Every member's exploration actions ``(P, N, A)`` for observations ``(P, N, obs_dim)``."""
        raise NotImplementedError

    def deterministic(self, obs: Tensor) -> Tensor:
        """Every member's deterministic actions ``(P, E, A)``."""
        raise NotImplementedError

    def _evaluation_actor(self) -> MemberPolicy:
        return MemberPolicy(self)

    # -- a round: one VecEnv step, then the updates it owes ------------------------------------------------
    def _train_round(self, progress: float) -> dict[str, Tensor]:
        self._step_envs()
        metrics: dict[str, Tensor] = {}
        for _ in range(self._updates_due()):
            metrics = self._update()
        return metrics

    @torch.no_grad()
    def _step_envs(self) -> None:
        """One step of every member's sub-envs into the replay (warm-up: uniform actions, as a single run)."""
        obs = self.obs.view(self.num_members, self.num_envs, -1)  # (P, N, obs_dim)
        if self.steps < replay_settings(self.config.hyperparameters).learning_starts:
            assert self.action_space.shape is not None, "a Box (the algorithms' action spaces)"
            like = obs.new_empty(self.num_members, self.num_envs, *self.action_space.shape)
            actions = self.draws.uniform(like) * 2 - 1  # OffPolicyAlgorithm.random_actions, per member
        else:
            actions = self.explore(obs)
        actions = actions.flatten(0, 1)  # (P * N, A)
        next_obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.buffer.add(self.obs, actions, rewards, info["final_obs"], terminated, truncated)
        self._record_episodes(terminated | truncated, info)
        self.obs = next_obs

    def _updates_due(self) -> int:
        """The updates one VecEnv step owes (Trainer.store's update-to-data ratio), once the warm-up is in."""
        hp = replay_settings(self.config.hyperparameters)
        if self.buffer.filled * self.num_envs < max(hp.learning_starts, self.num_envs * hp.n_step):
            return 0
        self.updates_owed += self.num_envs * hp.updates_per_step
        updates = int(self.updates_owed)
        self.updates_owed -= updates
        return updates if hp.max_updates_per_step is None else min(updates, hp.max_updates_per_step)

    def _update(self) -> dict[str, Tensor]:
        """One update of every member by the algorithm's rule (which counts :attr:`updates`)."""
        hp = self.rule_hyperparameters()
        return ensemble_critic_update(self, self._sample(hp.batch_size), hp, self.algorithm_class.rule)

    def _sample(self, batch_size: int) -> ReplayBatch:
        """Each member's batch from its own columns, drawn from its generator as ReplayBuffer.sample draws:
        ``(P, B, ...)`` tensors."""
        buffer, device = self.buffer, self.device
        oldest = (buffer.position - buffer.filled) % buffer.slots
        starts, envs = [], []
        for member, generator in enumerate(self.generators):
            start = torch.randint(buffer.filled, (batch_size,), generator=generator, device=device)
            starts.append((oldest + start) % buffer.slots)
            env = torch.randint(self.num_envs, (batch_size,), generator=generator, device=device)
            envs.append(env + member * self.num_envs)
        start, env = torch.stack(starts), torch.stack(envs)  # (P, B)
        gamma = self.hyperparameter_tensors["gamma"].float().unsqueeze(1)  # (P, 1)
        return ReplayBatch(
            buffer.obs[start, env],
            buffer.actions[start, env],
            buffer.rewards[start, env],
            buffer.next_obs[start, env],
            gamma * (~buffer.terminated[start, env]).float(),
        )

    # -- members and state ---------------------------------------------------------------------------
    def _member_tensors(self) -> list[Tensor]:
        """Every flat tensor viewed ``(P, rows_per_member, ...)``, so that index i is member i's rows."""
        return [
            tensor.unflatten(0, (self.num_members, -1)) for flat in self.flats() for tensor in flat.tensors()
        ]

    def _learner_state(self) -> dict[str, Any]:
        return {
            "flats": [[tensor.clone() for tensor in flat.tensors()] for flat in self.flats()],
            "buffer": self.buffer.state_dict(),
            "progress": {"updates_owed": self.updates_owed},
        }

    @torch.no_grad()
    def _load_learner_state(self, state: dict[str, Any]) -> None:
        for flat, tensors in zip(self.flats(), state["flats"], strict=True):
            for tensor, saved in zip(flat.tensors(), tensors, strict=True):
                tensor.copy_(saved)
        self.buffer.load_state_dict(state["buffer"])
        self.updates_owed = state["progress"]["updates_owed"]

    def _load_member(self, member: int, algorithm: Algorithm) -> None:
        """Member ``member``'s networks, targets and Adam states into a single run of its algorithm."""
        # ignored below: a single run of algorithm_class
        single: EnsembleCriticAlgorithm = algorithm  # type: ignore[assignment]
        for flat in self.flats():
            flat.load_single(member, single)
        single.updates = self.updates

    def _progress_state(self, member: int) -> dict[str, Any]:
        return {**super()._progress_state(member), "updates_owed": self.updates_owed}


class VectorizedSAC(VectorizedOffPolicy):
    """P SAC members: per member also the temperature's learning rate and entropy target."""

    algorithm_class = SAC
    member_hyperparameters = (
        *VectorizedOffPolicy.member_hyperparameters,
        "alpha_learning_rate",
        "target_entropy",
    )
    optional_hyperparameters = ("critic_learning_rate", "alpha_learning_rate", "target_entropy")

    def _build_networks(self, algorithms: Sequence[EnsembleCriticAlgorithm]) -> None:
        super()._build_networks(algorithms)
        # ignored below: SAC runs (algorithm_class), which have log_alpha
        log_alpha = torch.stack([algorithm.log_alpha.detach() for algorithm in algorithms])  # type: ignore[attr-defined]
        self.log_alpha = nn.Parameter(log_alpha.to(self.device))  # (P,)
        self.temperatures = MemberFlat(
            [self.log_alpha], 1, lambda run: ([run.log_alpha], run.alpha_optimizer), algorithms[0]
        )
        self.action_dim = algorithms[0].action_dim

    def member_actor(self, actors: Sequence[nn.Module]) -> SquashedGaussianActor:
        sac_actors = cast(Sequence[SquashedGaussianActor], actors)  # the members' SAC actors
        return SquashedGaussianActor(EnsembleMLP.from_mlps([actor.net for actor in sac_actors]))

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()  # (P,)

    @property
    def target_entropy(self) -> Tensor:
        """``(P,)``: each member's entropy target (None, stored as +inf: -action_dim)."""
        targets = self.hyperparameter_tensors["target_entropy"].float()
        return torch.where(torch.isinf(targets), -float(self.action_dim), targets)

    def step_alpha(self, gradient: Tensor) -> None:
        self.temperatures.gradients.copy_(gradient.unsqueeze(1))
        self.temperatures.step(self.learning_rate("alpha_learning_rate"))

    def flats(self) -> list[MemberFlat]:
        return [*super().flats(), self.temperatures]

    actor: SquashedGaussianActor  # member_actor's

    def explore(self, obs: Tensor) -> Tensor:
        return self.actor.sample_action(obs, self.draws)

    def deterministic(self, obs: Tensor) -> Tensor:
        return self.actor.deterministic(obs)


class VectorizedTD3(VectorizedOffPolicy):
    """P TD3 members: per member also the exploration noise and the target policy smoothing."""

    algorithm_class = TD3
    member_hyperparameters = (
        *VectorizedOffPolicy.member_hyperparameters,
        "exploration_noise",
        "target_noise",
        "target_noise_clip",
    )

    def _build_networks(self, algorithms: Sequence[EnsembleCriticAlgorithm]) -> None:
        super()._build_networks(algorithms)
        # ignored below: TD3 runs (algorithm_class), DDPGs
        targets: list[DDPG] = list(algorithms)  # type: ignore[arg-type]
        self.actor_target = self.member_actor([algorithm.actor_target for algorithm in targets])
        self.actor_target.to(self.device).requires_grad_(False)
        self.actor_targets = MemberFlat(
            list(self.actor_target.parameters()),
            1,
            lambda run: (list(run.actor_target.parameters()), None),
            targets[0],
            ensemble_linear_weights(self.actor_target),
        )
        self.targets.append((self.actor_targets, self.actors))

    def member_actor(self, actors: Sequence[nn.Module]) -> nn.Module:
        td3_actors = cast(Sequence[nn.Sequential], actors)  # the members' TD3 actors: an MLP, then tanh
        return nn.Sequential(EnsembleMLP.from_mlps([actor[0] for actor in td3_actors]), nn.Tanh())

    def flats(self) -> list[MemberFlat]:
        return [*super().flats(), self.actor_targets]

    def explore(self, obs: Tensor) -> Tensor:
        """DDPG.explore per member: Gaussian noise of the member's scale, clipped to [-1, 1]."""
        actions = self.actor(obs)
        noise = member_view(self.hyperparameter_tensors["exploration_noise"].float(), actions)
        return (actions + noise * self.draws.normal(actions)).clamp(-1.0, 1.0)

    def deterministic(self, obs: Tensor) -> Tensor:
        return self.actor(obs)
