"""Vectorized off-policy populations: P SAC (or TD3) members as the leading dimension of one run.

Every member is an ordinary SAC / TD3 agent, learning by the rule its single run uses
(:class:`phalanx.algos.sac.SACRule`, :class:`phalanx.algos.td3.TD3Rule`), but the P of them share every
kernel launch:

- networks: the actors of all members are one :class:`~phalanx.nets.EnsembleMLP`; the K critics of
  every member are one ensemble of ``P * K`` members (member p's critics are rows ``[p * K, (p + 1) * K)``);
- environment: one VecEnv of ``P * num_envs`` sub-envs, member i owning rows
  ``[i * num_envs, (i + 1) * num_envs)``, each block seeded as member i's single run;
- replay: one ring of ``P * num_envs`` columns; each member samples its own columns only;
- hyperparameters: those that may differ per member (:attr:`member_hyperparameters`) are ``(P,)``
  tensors that broadcast into the rule, the exploration noise, the Polyak steps and the optimisers;
- optimisers: :class:`~phalanx.population.vectorized.VectorizedAdam` over each network's flattened
  member parameters, with a learning rate per member.

Members stay independent, and every random draw of member i (warm-up actions, exploration noise,
replay indices, the rule's action noise) comes from its own ``torch.Generator``, started where the
global RNG of member i's single run stands after that run built its networks: on CPU member i ends
where ``phalanx.train`` with ``seed = seeds[i]`` and member i's hyperparameters ends (within float
rounding: batched matmuls and a batched Adam). Tests check it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import time
import types
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from phalanx.algos.ddpg import DDPG, Draws, EnsembleCriticAlgorithm, member_view
from phalanx.algos.sac import SAC, SquashedGaussianActor
from phalanx.algos.td3 import TD3
from phalanx.buffers import ReplayBatch, ReplayBuffer
from phalanx.config import TrainConfig
from phalanx.envs.core import Tensor, VecEnv, as_device, block_seeds
from phalanx.errors import CheckpointError, ConfigError
from phalanx.nets import EnsembleMLP
from phalanx.population.vectorized import VectorizedAdam, flatten_parameters
from phalanx.train.environments import EVAL_SEED_OFFSET, build_env
from phalanx.train.evaluator import Evaluator

GRADIENT_LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"
"""torch's one-time hint when a .grad is a view of a flat gradient tensor (flatten_parameters), on purpose."""
ADAM_EPS = 1e-8
"""The eps of the single runs' Adam (``phalanx.optim.make_adam``, torch's default)."""


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
    its VectorizedAdam; ``rows`` is P, or P * K for the critics (K rows per member)."""

    def __init__(self, parameters: Sequence[nn.Parameter], rows_per_member: int) -> None:
        self.parameters = list(parameters)
        self.flat, self.gradients = flatten_parameters(self.parameters)
        self.rows_per_member = rows_per_member
        self.optimizer = VectorizedAdam(self.flat, self.gradients, eps=ADAM_EPS)

    def minimize(self, loss: Tensor, learning_rate: Tensor) -> None:
        """Backward of the members' summed ``(P,)`` loss (each member's gradient is its own), then Adam."""
        self.gradients.zero_()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=GRADIENT_LAYOUT_WARNING)
            loss.sum().backward()
        self.step(learning_rate)

    def step(self, learning_rate: Tensor) -> None:
        """An Adam step on the gradients held; ``learning_rate`` ``(P,)``."""
        self.optimizer.step(learning_rate.repeat_interleave(self.rows_per_member))

    def member_rows(self, member: int) -> slice:
        return slice(member * self.rows_per_member, (member + 1) * self.rows_per_member)

    def tensors(self) -> list[Tensor]:
        """The tensors that make a member what it is: parameters and Adam state, rows first."""
        optimizer = self.optimizer
        return [self.flat, optimizer.exp_avg, optimizer.exp_avg_sq, optimizer.steps]


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
        )
    states = [ensemble.state_dict() for ensemble in ensembles]
    stacked.load_state_dict({name: torch.cat([state[name] for state in states]) for name in states[0]})
    return stacked.to(first.layers[0].weight.device)


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
class VectorizedOffPolicy:
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
    """Per-member hyperparameters that may be None (stored as NaN, resolved where used)."""

    def __init__(
        self,
        config: TrainConfig,
        seeds: Sequence[int],
        hyperparameters: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        config.validate()
        self.config = config = dataclasses.replace(config)  # the caller's config stays as it was
        self._check_config(config)
        self.seeds = [int(seed) for seed in seeds]
        self.num_members = len(self.seeds)
        hyperparameters = [{} for _ in self.seeds] if hyperparameters is None else list(hyperparameters)
        if self.num_members == 0 or len(hyperparameters) != self.num_members:
            raise ConfigError(
                f"{type(self).__name__}: {len(self.seeds)} seeds and {len(hyperparameters)} hyperparameter "
                "dicts; pass at least one seed and one dict (possibly empty) per seed, in the same order."
            )
        self.device = as_device(config.device)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.num_envs = config.num_envs
        values = [
            self._validated_values(member, overrides) for member, overrides in enumerate(hyperparameters)
        ]
        self.hyperparameter_tensors: dict[str, Tensor] = {
            name: torch.tensor(
                [_encode(member_values[name]) for member_values in values],
                dtype=torch.float64,
                device=self.device,
            )
            for name in self.member_hyperparameters
        }
        self.env = build_env(config, self.num_members * self.num_envs, training=True)
        raw_env = self.env.unwrapped
        self.algorithm_class.check_spaces(raw_env.single_observation_space, raw_env.single_action_space)
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space  # [-1, 1] (RescaleAction)
        members = [self._initial_member(member) for member in range(self.num_members)]
        self.generators = [generator for _, generator in members]
        self.draws = MemberDraws(self.generators)
        self._build_networks([algorithm for algorithm, _ in members])
        hp = config.hyperparameters
        self.buffer = ReplayBuffer(
            hp.buffer_size * self.num_members,
            self.num_members * self.num_envs,
            self.observation_space.shape,
            self.action_space.shape,
            torch.float32,
            self.device,
        )
        self.steps = self.updates = 0
        self.updates_owed = 0.0
        self.wall_time = 0.0
        self.best_eval_return = [-math.inf] * self.num_members
        self._eval_envs: dict[int, VecEnv] = {}
        self.obs, _ = self.env.reset(seed=self._env_seeds(0, self.num_envs))  # (P * N, obs_dim)

    # -- construction --------------------------------------------------------------------------------
    def _check_config(self, config: TrainConfig) -> None:
        """What a vectorized population cannot do, with the reason and the fix."""
        name = type(self).__name__
        if config.algo != self.algorithm_class.name:
            raise ConfigError(
                f"{name} trains {self.algorithm_class.name} members, but the config's algo is "
                f"{config.algo!r}. Build it with phalanx.make_config({self.algorithm_class.name!r}, env, "
                "...)."
            )
        if config.num_workers or config.overlap or config.num_learners != 1 or config.pipeline:
            raise ConfigError(
                f"{name} runs in one process on one device: num_workers must be 0, overlap and pipeline off, "
                f"num_learners 1 (got num_workers={config.num_workers}, overlap={config.overlap}, "
                f"pipeline={config.pipeline}, num_learners={config.num_learners}). Use a batched env (e.g. "
                "'Pendulum-v1') with the defaults, or the process backend for one process per member."
            )
        if config.normalize_obs or config.normalize_reward or config.hyperparameters.n_step != 1:
            raise ConfigError(
                f"{name} supports neither observation/reward normalisation nor n-step returns yet (got "
                f"normalize_obs={config.normalize_obs}, normalize_reward={config.normalize_reward}, "
                f"n_step={config.hyperparameters.n_step}). Turn them off, or train the members as separate "
                "runs (the process backend)."
            )

    def member_config(self, member: int) -> TrainConfig:
        """Member ``member`` as an ordinary single-run config: its seed and hyperparameters."""
        self._check_member(member)
        hyperparameters = dataclasses.replace(self.config.hyperparameters, **self.hyperparameters(member))
        return dataclasses.replace(self.config, seed=self.seeds[member], hyperparameters=hyperparameters)

    def _validated_values(self, member: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """The config's per-member values with ``overrides``, checked as the algorithm's config would."""
        self._check_names(overrides)
        base = {name: getattr(self.config.hyperparameters, name) for name in self.member_hyperparameters}
        for name, value in overrides.items():
            optional = name in self.optional_hyperparameters
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (is_number or (value is None and optional)):
                expected = "a number, or None" if optional else "a number"
                raise ConfigError(f"member {member}: {name} = {value!r} is invalid: expected {expected}.")
        values = {**base, **overrides}
        try:
            dataclasses.replace(self.config.hyperparameters, **values).validate(self.config)
        except ConfigError as error:
            raise ConfigError(f"member {member}: {error}") from None
        return values

    def _check_names(self, values: dict[str, Any]) -> None:
        """A ConfigError for a name that is not a per-member hyperparameter, naming the per-member ones."""
        allowed = ", ".join(self.member_hyperparameters)
        shared = {field.name for field in dataclasses.fields(self.config.hyperparameters)}
        shared |= {field.name for field in dataclasses.fields(TrainConfig)}
        for name in values:
            if name in self.member_hyperparameters:
                continue
            if name == "seed":
                raise ConfigError(
                    "seed is not a hyperparameter of a member: each member's seed is its entry of seeds."
                )
            if name in shared:
                raise ConfigError(
                    f"{name} is shared by all members of a vectorized population (it shapes the networks, "
                    "the env, the replay or the update), so it cannot be set per member; set it in the "
                    f"config instead. Per-member hyperparameters: {allowed}."
                )
            close = difflib.get_close_matches(str(name), self.member_hyperparameters, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown hyperparameter {name!r}.{hint} Per-member hyperparameters: {allowed}."
            )

    def _initial_member(self, member: int) -> tuple[EnsembleCriticAlgorithm, torch.Generator]:
        """The algorithm a single run seeded ``seeds[member]`` builds (on CPU, as Trainer's nets are
        initialised), and a generator in the state that run's global RNG is in afterwards."""
        config = self.member_config(member)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            algorithm = self.algorithm_class(
                config.hyperparameters, self.observation_space, self.action_space, torch.device("cpu")
            )
            generator = torch.Generator(device=self.device)
            if self.device.type == "cpu":
                generator.set_state(torch.get_rng_state())
            else:  # the single run samples from the device's generator, which its init never touched
                generator.manual_seed(config.seed)
        return algorithm, generator

    def _build_networks(self, algorithms: Sequence[EnsembleCriticAlgorithm]) -> None:
        """The members' networks as member-batched modules, their flat parameters and optimisers."""
        self.num_critics = algorithms[0].critic.num_members
        self.actor = self.member_actor([algorithm.actor for algorithm in algorithms]).to(self.device)
        self.critic = stack_ensembles([algorithm.critic for algorithm in algorithms]).to(self.device)
        self.critic_target = stack_ensembles([algorithm.critic_target for algorithm in algorithms])
        self.critic_target.to(self.device).requires_grad_(False)
        self.actors = MemberFlat(list(self.actor.parameters()), 1)
        self.critics = MemberFlat(list(self.critic.parameters()), self.num_critics)
        self.critic_targets = MemberFlat(list(self.critic_target.parameters()), self.num_critics)
        self.targets = [(self.critic_targets, self.critics)]  # (target, source) pairs of the Polyak step

    def member_actor(self, actors: Sequence[nn.Module]) -> nn.Module:
        """The members' actors as one module taking ``(P, B, obs_dim)``."""
        raise NotImplementedError

    def _env_seeds(self, offset: int, rows_per_member: int) -> int | list[int]:
        """``reset(seed=...)`` giving each member's rows what a single env seeded ``seed + offset`` gets."""
        return block_seeds(self.env, [seed + offset for seed in self.seeds], rows_per_member)

    # -- the rule's learner ------------------------------------------------------------------------------
    def learning_rate(self, name: str) -> Tensor:
        """``(P,)`` learning rate of an optional per-member rate (NaN: the member's learning_rate)."""
        rates = self.hyperparameter_tensors
        return torch.where(torch.isnan(rates[name]), rates["learning_rate"], rates[name])

    def step_critic(self, loss: Tensor) -> None:
        self.critics.minimize(loss, self.learning_rate("critic_learning_rate"))

    def step_actor(self, loss: Tensor) -> None:
        self.actors.minimize(loss, self.hyperparameter_tensors["learning_rate"])

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

    # -- training ------------------------------------------------------------------------------------
    def train(self, steps: int) -> dict[str, Tensor]:
        """Train every member ``steps`` more env steps (rounded up to whole VecEnv steps of num_envs).

        Returns the metrics of the last update, each ``(P,)`` ({} when no update was made yet).
        """
        if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1):
            raise ConfigError(
                f"{type(self).__name__}.train: steps = {steps!r} is invalid: expected an integer >= 1 (env "
                f"steps per member, rounded up to whole VecEnv steps of num_envs = {self.num_envs})."
            )
        start = time.perf_counter()
        metrics: dict[str, Tensor] = {}
        for _ in range(math.ceil(steps / self.num_envs)):
            self._step_envs()
            for _ in range(self._updates_due()):
                metrics = self._update()
        self.wall_time += time.perf_counter() - start
        return metrics

    @torch.no_grad()
    def _step_envs(self) -> None:
        """One step of every member's sub-envs into the replay (warm-up: uniform actions, as a single run)."""
        obs = self.obs.view(self.num_members, self.num_envs, -1)  # (P, N, obs_dim)
        if self.steps < self.config.hyperparameters.learning_starts:
            like = obs.new_empty(self.num_members, self.num_envs, *self.action_space.shape)
            actions = self.draws.uniform(like) * 2 - 1  # OffPolicyAlgorithm.random_actions, per member
        else:
            actions = self.explore(obs)
        actions = actions.flatten(0, 1)  # (P * N, A)
        next_obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.buffer.add(self.obs, actions, rewards, info["final_obs"], terminated, truncated)
        self.obs = next_obs
        self.steps += self.num_envs

    def _updates_due(self) -> int:
        """The updates one VecEnv step owes (Trainer.store's update-to-data ratio), once the warm-up is in."""
        hp = self.config.hyperparameters
        if self.buffer.filled * self.num_envs < max(hp.learning_starts, self.num_envs * hp.n_step):
            return 0
        self.updates_owed += self.num_envs * hp.updates_per_step
        updates = int(self.updates_owed)
        self.updates_owed -= updates
        return updates if hp.max_updates_per_step is None else min(updates, hp.max_updates_per_step)

    def _update(self) -> dict[str, Tensor]:
        hp = self.rule_hyperparameters()
        return self.algorithm_class.rule.update(self, self._sample(hp.batch_size), hp)

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

    # -- evaluation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, episodes: int) -> Tensor:
        """``(P,)`` mean return of each member's deterministic policy over ``episodes`` episodes, each
        member on rows seeded as its single run's evaluator; the training envs and generators are not
        touched. A float64 CPU tensor."""
        if not (isinstance(episodes, int) and not isinstance(episodes, bool) and episodes >= 1):
            raise ConfigError(
                f"{type(self).__name__}.evaluate: episodes = {episodes!r} is invalid: expected an integer "
                ">= 1."
            )
        env = self._eval_envs.get(episodes)
        if env is None:
            env = build_env(self.config, self.num_members * episodes, training=False, blocks=self.num_members)
            self._eval_envs[episodes] = env
        seeds = block_seeds(env, [seed + EVAL_SEED_OFFSET for seed in self.seeds], episodes)
        evaluation = Evaluator(env, seed=seeds).evaluate(MemberPolicy(self))  # type: ignore[arg-type]
        returns = torch.tensor(evaluation.returns, dtype=torch.float64)
        means = returns.view(self.num_members, episodes).mean(dim=1)
        self.best_eval_return = [
            max(a, b) for a, b in zip(self.best_eval_return, means.tolist(), strict=True)
        ]
        return means

    # -- hyperparameters and members -----------------------------------------------------------------
    def hyperparameters(self, member: int) -> dict[str, Any]:
        """Member ``member``'s current values of :attr:`member_hyperparameters`."""
        self._check_member(member)
        return {
            name: _decode(float(self.hyperparameter_tensors[name][member]))
            for name in self.member_hyperparameters
        }

    def set_hyperparameters(self, member: int, values: dict[str, Any]) -> None:
        """Give member ``member`` new values of some of :attr:`member_hyperparameters`, validated as the
        algorithm's config validates them; they apply from the next step."""
        self._check_member(member)
        merged = self._validated_values(member, {**self.hyperparameters(member), **values})
        for name, value in merged.items():
            self.hyperparameter_tensors[name][member] = _encode(value)

    def flats(self) -> list[MemberFlat]:
        """Every member-batched parameter set (networks, targets, temperature)."""
        return [self.actors, self.critics, self.critic_targets]

    @torch.no_grad()
    def copy_member(self, source: int, target: int) -> None:
        """Give member ``target`` the networks, target networks and optimiser state of member ``source``;
        ``target`` keeps its hyperparameters, env rows, replay columns and generator."""
        self._check_member(source)
        self._check_member(target)
        for flat in self.flats():
            for tensor in flat.tensors():
                tensor[flat.member_rows(target)] = tensor[flat.member_rows(source)]

    def _check_member(self, member: int) -> None:
        if not (isinstance(member, int) and not isinstance(member, bool) and 0 <= member < self.num_members):
            raise ConfigError(
                f"member {member!r} is not a member of this population: expected an integer in "
                f"[0, {self.num_members - 1}]."
            )

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything to resume exactly: weights, optimisers, hyperparameters, replay, env state, the last
        observations, every member's generator, progress. Tensors and primitives only."""
        return {
            "num_members": self.num_members,
            "seeds": list(self.seeds),
            "config": self.config.to_dict(),
            "hyperparameters": {name: tensor.clone() for name, tensor in self.hyperparameter_tensors.items()},
            "flats": [[tensor.clone() for tensor in flat.tensors()] for flat in self.flats()],
            "buffer": self.buffer.state_dict(),
            "env": self.env.state_dict(),
            "obs": self.obs.clone(),
            "generators": [generator.get_state() for generator in self.generators],
            "progress": {
                "steps": self.steps,
                "updates": self.updates,
                "updates_owed": self.updates_owed,
                "wall_time_s": self.wall_time,
                "best_eval_return": list(self.best_eval_return),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, into a population built with the same config and
        number of seeds."""
        saved = TrainConfig.from_dict(state["config"], where=f"the {type(self).__name__} state")
        if state["num_members"] != self.num_members or _shared(saved) != _shared(self.config):
            raise CheckpointError(
                f"cannot load this {type(self).__name__} state: it was saved by a population of "
                f"{state['num_members']} members with config {_shared(saved)}, this one has "
                f"{self.num_members} members and {_shared(self.config)}. Build the population as the "
                "state was saved."
            )
        with torch.no_grad():
            for name, tensor in self.hyperparameter_tensors.items():
                tensor.copy_(state["hyperparameters"][name])
            for flat, tensors in zip(self.flats(), state["flats"], strict=True):
                for tensor, saved_tensor in zip(flat.tensors(), tensors, strict=True):
                    tensor.copy_(saved_tensor)
        self.buffer.load_state_dict(state["buffer"])
        self.env.load_state_dict(state["env"])
        self.obs = state["obs"].to(self.device).clone()
        self.seeds = list(state["seeds"])
        for generator, generator_state in zip(self.generators, state["generators"], strict=True):
            generator.set_state(generator_state.cpu())
        progress = state["progress"]
        self.steps, self.updates = progress["steps"], progress["updates"]
        self.updates_owed, self.wall_time = progress["updates_owed"], progress["wall_time_s"]
        self.best_eval_return = list(progress["best_eval_return"])

    def close(self) -> None:
        """Close the training and evaluation envs."""
        for env in (self.env, *self._eval_envs.values()):
            env.close()
        self._eval_envs.clear()


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
        log_alpha = torch.stack([algorithm.log_alpha.detach() for algorithm in algorithms])  # type: ignore[attr-defined]
        self.log_alpha = nn.Parameter(log_alpha.to(self.device))  # (P,)
        self.temperatures = MemberFlat([self.log_alpha], 1)
        self.action_dim = algorithms[0].action_dim

    def member_actor(self, actors: Sequence[nn.Module]) -> nn.Module:
        return SquashedGaussianActor(EnsembleMLP.from_mlps([actor.net for actor in actors]))

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()  # (P,)

    @property
    def target_entropy(self) -> Tensor:
        """``(P,)``: each member's entropy target (None: -action_dim)."""
        targets = self.hyperparameter_tensors["target_entropy"].float()
        return torch.where(torch.isnan(targets), -float(self.action_dim), targets)

    def step_alpha(self, gradient: Tensor) -> None:
        self.temperatures.gradients.copy_(gradient.unsqueeze(1))
        self.temperatures.step(self.learning_rate("alpha_learning_rate"))

    def flats(self) -> list[MemberFlat]:
        return [*super().flats(), self.temperatures]

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
        targets: list[DDPG] = list(algorithms)  # type: ignore[arg-type]
        self.actor_target = self.member_actor([algorithm.actor_target for algorithm in targets])
        self.actor_target.to(self.device).requires_grad_(False)
        self.actor_targets = MemberFlat(list(self.actor_target.parameters()), 1)
        self.targets.append((self.actor_targets, self.actors))

    def member_actor(self, actors: Sequence[nn.Module]) -> nn.Module:
        return nn.Sequential(EnsembleMLP.from_mlps([actor[0] for actor in actors]), nn.Tanh())

    def flats(self) -> list[MemberFlat]:
        return [*super().flats(), self.actor_targets]

    def explore(self, obs: Tensor) -> Tensor:
        """DDPG.explore per member: Gaussian noise of the member's scale, clipped to [-1, 1]."""
        actions = self.actor(obs)
        noise = member_view(self.hyperparameter_tensors["exploration_noise"].float(), actions)
        return (actions + noise * self.draws.normal(actions)).clamp(-1.0, 1.0)

    def deterministic(self, obs: Tensor) -> Tensor:
        return self.actor(obs)


# -- helpers -------------------------------------------------------------------------------------------
def _encode(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _decode(value: float) -> float | None:
    return None if math.isnan(value) else value


def _shared(config: TrainConfig) -> tuple[Any, ...]:
    """The settings two populations must share for one's state to load into the other."""
    hp = config.hyperparameters
    return (config.algo, config.env, config.num_envs, tuple(hp.hidden_sizes), hp.activation, hp.num_critics,
            hp.buffer_size)  # fmt: skip
