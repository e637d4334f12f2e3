"""Vectorized populations: P members of one algorithm as the leading dimension of one run, in one process,
on one device. :class:`VectorizedPopulation` is what they share; :class:`~phalanx.population.vectorized.
VectorizedPPO` (P PPO members), :class:`~phalanx.population.vectorized_pqn.VectorizedPQN` (PQN) and
:mod:`phalanx.population.vectorized_off_policy` (SAC, TD3) add their algorithm's networks, collection and
learning step.

Every member is an ordinary agent, learning by its algorithm's own rule (for PPO,
:func:`phalanx.algos.ppo.actor_critic_loss`, called once for all P members), but the P of them share
every kernel launch:

- networks: the policies of all members are one :class:`~phalanx.nets.EnsembleMLP` (weights
  ``(P, in, out)``, one batched matmul per layer), and so are the value networks;
- environment: one VecEnv of ``P * num_envs`` sub-envs; member i owns rows
  ``[i * num_envs, (i + 1) * num_envs)``, each block reset by its own generator
  (``reset(seed=[s0, s1, ...])``) and, with ``normalize_obs`` / ``normalize_reward``, normalised with its
  own running statistics;
- hyperparameters: the ones that may differ per member (:attr:`VectorizedPopulation.member_hyperparameters`)
  are ``(P,)`` float64 tensors that broadcast into the loss, GAE, gradient clipping and the optimiser;
- optimiser: :class:`~phalanx.optim.VectorizedAdam`, torch's Adam rule over the members' flattened
  ``(P, D)`` parameters with a learning rate, bias corrections and step count per member.

Members stay independent: nothing mixes across the member dimension, and each member draws its action
noise and minibatch shuffles from its own ``torch.Generator``, which starts where the global RNG of a
single run with the member's seed stands after that run built its networks. On CPU, member i's
parameters after training equal (within float rounding: batched matmul against ``nn.Linear``) those of
``phalanx.train`` with ``seed = seeds[i]`` and member i's hyperparameters; tests check it.

:class:`VectorizedPopulation` is what every vectorized population shares (seeds and generators, member
hyperparameter tensors, the member env, evaluation, copying members, the state dict, a member as a
single run's checkpoint); a subclass adds its algorithm's networks, collection and learning step. The
member env is every run's wrapper chain (:func:`phalanx.train.environments.wrap_env`), and the layout
that reads a member back as its single run's tensors is in :mod:`phalanx.population.member_layout`.

Cost: every op is batched over the members except the random draws, one small call per member (the
action noise and the env's reset draws each env step, the shuffles each update), the price of giving each
member its own stream; ``benchmarks/population_vectorized.py`` measures P members against one.

Selection (tournament, generational) lives outside: it reads :meth:`VectorizedPopulation.evaluate`,
copies members with :meth:`VectorizedPopulation.copy_member` and mutates with
:meth:`VectorizedPopulation.set_hyperparameters`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import torch

from phalanx.algos.base import Algorithm
from phalanx.config import TrainConfig
from phalanx.envs.core import Tensor, VecEnv, as_device, block_seeds
from phalanx.envs.registry import make_env
from phalanx.envs.wrappers import MemberNormalizeObservation, MemberScaleReward, RunningMeanStd, find_wrapper
from phalanx.errors import CheckpointError, ConfigError
from phalanx.population.member_env import check_batchable
from phalanx.population.member_layout import SingleLayout, ensemble_linear_weights
from phalanx.train.environments import EVAL_SEED_OFFSET, space_spec, wrap_env
from phalanx.train.evaluator import Evaluator

__all__ = [  # with the names of member_env and member_layout that were defined here before
    "MemberScaleReward",
    "SingleLayout",
    "VectorizedPopulation",
    "check_batchable",
    "ensemble_linear_weights",
]


# -- what every vectorized population shares ----------------------------------------------------------
class VectorizedPopulation:
    """P members of :attr:`algorithm_class` trained as one batched run; see the module docstring.

    ``config`` is an ordinary TrainConfig of that algorithm: env, ``num_envs`` (per member), device,
    network sizes and the settings that shape the update are shared by every member; ``seeds[i]`` is
    member i's seed and ``hyperparameters[i]`` its values of any of :attr:`member_hyperparameters`.

    A subclass names its algorithm and hyperparameters (the ClassVars) and supplies the learner:
    :meth:`_build_members` (batched networks, flat parameters, optimiser, buffer, ``steps_per_round``),
    :meth:`_train_round` (collect ``steps_per_round`` env steps per member and learn from them),
    :meth:`_evaluation_actor`, :meth:`_member_tensors` (what :meth:`copy_member` copies),
    :meth:`_learner_state` / :meth:`_load_learner_state` and :meth:`_load_member` (for
    :meth:`member_agent_state`).
    """

    algorithm_class: ClassVar[type[Algorithm]]
    """The single-run algorithm each member is: it builds a member's initial networks."""
    member_hyperparameters: ClassVar[tuple[str, ...]]
    """Fields of the algorithm's config that may differ per member (``(P,)`` float64 tensors)."""
    optional_hyperparameters: ClassVar[tuple[str, ...]] = ()
    """Those of them that may be None (no clipping, or a default the learner resolves), stored as +inf."""
    shared_hyperparameters: ClassVar[tuple[str, ...]] = ("hidden_sizes", "activation")
    """Fields of the algorithm's config a saved state must share to load (they shape its tensors)."""
    steps_per_round: int
    """Env steps per member of one :meth:`_train_round`; set by :meth:`_build_members`."""

    def __init__(
        self,
        config: TrainConfig,
        seeds: Sequence[int],
        hyperparameters: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        config.validate()
        self.config = config = dataclasses.replace(config)  # the caller's config stays as it was
        self.check_config(config)
        self.seeds = [int(seed) for seed in seeds]
        self.num_members = len(self.seeds)
        name = type(self).__name__
        if self.num_members == 0:
            raise ConfigError(f"{name} needs at least one member: pass a non-empty list of seeds.")
        if hyperparameters is None:
            hyperparameters = [{} for _ in self.seeds]
        if len(hyperparameters) != self.num_members:
            raise ConfigError(
                f"{name}: {len(hyperparameters)} hyperparameter dicts for {self.num_members} seeds; "
                "pass one dict (possibly empty) per member, in the order of the seeds."
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
        }  # (P,) float64 each, None stored as +inf
        self._refresh_flags()

        # One env of P * num_envs sub-envs, wrapped as build_env wraps a training env, with per-member
        # normalisation; each member's block seeded as the single run with its seed (rank 0).
        self.env = self._build_env(self.num_members * self.num_envs, training=True)
        raw_env = self.env.unwrapped
        self.algorithm_class.check_spaces(raw_env.single_observation_space, raw_env.single_action_space)
        check_batchable(
            self.algorithm_class.name, raw_env.single_observation_space, raw_env.single_action_space
        )
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space  # [-1, 1] for a Box (RescaleAction)
        self.spaces = space_spec(self.observation_space, raw_env.single_action_space)
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)

        # Member i's networks are those a single run seeded seeds[i] builds; its generator continues from
        # where that run's global RNG stands after building them.
        members = [self._initial_member(member) for member in range(self.num_members)]
        self.generators: list[torch.Generator] = [generator for _, generator in members]
        self._build_members([algorithm for algorithm, _ in members])
        self.steps = 0
        self.updates = 0
        self.wall_time = 0.0
        self.best_eval_return = [-math.inf] * self.num_members
        self._episodes = torch.zeros(3, self.num_members, dtype=torch.float64, device=self.device)
        self._eval_envs: dict[int, VecEnv] = {}
        # a list of seeds, one per sub-env (as Evaluator's), where the VecEnv contract types an int
        self.obs, _ = self.env.reset(seed=self._env_seeds(0, self.num_envs))  # type: ignore[arg-type]

    # -- what a subclass supplies -----------------------------------------------------------------------
    def _build_members(self, algorithms: list[Algorithm]) -> None:
        """Batch the members' initial networks (``algorithms[i]``: member i's single-run algorithm, on
        CPU); build the flat parameters, optimiser and buffers; set :attr:`steps_per_round`."""
        raise NotImplementedError

    def _train_round(self, progress: float) -> dict[str, Tensor]:
        """Collect :attr:`steps_per_round` env steps per member (recording finished episodes with
        :meth:`_record_episodes`; :attr:`steps` counts them after the round) and learn from them,
        counting :attr:`updates`; the ``(P,)`` metrics of the learning ({} if it made no update)."""
        raise NotImplementedError

    def _evaluation_actor(self) -> Any:
        """The members' deterministic policies as one actor of ``(P * E, obs_dim)`` rows (``act(obs,
        deterministic=True)``, as :class:`~phalanx.nets.MemberActor`)."""
        raise NotImplementedError

    def _member_tensors(self) -> list[Tensor]:
        """The learner's tensors with a leading member dim that :meth:`copy_member` copies (networks,
        optimiser state)."""
        raise NotImplementedError

    def _learner_state(self) -> dict[str, Any]:
        """The learner's part of :meth:`state_dict` (networks, optimiser, progress of its own)."""
        raise NotImplementedError

    def _load_learner_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _load_member(self, member: int, algorithm: Algorithm) -> None:
        """Give ``algorithm``, a new single run of member ``member``'s config, the member's networks and
        optimiser state (moments in the single run's layout, learning rates, step counts)."""
        raise NotImplementedError

    def compile(self) -> list[str]:
        """Switch the learner to compiled paths (:mod:`phalanx.compiling`) and name them; [] where the
        population has none (the base). Idempotent; eager is the default and the reference."""
        return []

    def _refresh_flags(self) -> None:
        """Host-side facts about the hyperparameter tensors the learner branches on (after they change)."""

    @classmethod
    def check_config(cls, config: TrainConfig) -> None:
        """What a vectorized population cannot do, with the reason and the fix."""
        algorithm = cls.algorithm_class.name
        if config.algo != algorithm:
            raise ConfigError(
                f"{cls.__name__} trains {algorithm.upper()} members, but the config's algo is "
                f"{config.algo!r}. Build it with phalanx.make_config({algorithm!r}, env, ...)."
            )
        if config.num_workers or config.overlap or config.num_learners != 1 or config.pipeline:
            raise ConfigError(
                "a vectorized population runs in one process on one device: num_workers must be 0, overlap "
                f"and pipeline off, num_learners 1 (got num_workers={config.num_workers}, overlap="
                f"{config.overlap}, pipeline={config.pipeline}, num_learners={config.num_learners}). Use a "
                "batched env (e.g. 'CartPole-v1') with the defaults, or the process backend for one process "
                "per member."
            )

    # -- members and their hyperparameters -------------------------------------------------------------
    def member_config(self, member: int) -> TrainConfig:
        """Member ``member`` as an ordinary single-run config: its seed and hyperparameters."""
        self._check_member(member)
        hyperparameters = dataclasses.replace(self.config.hyperparameters, **self.hyperparameters(member))
        return dataclasses.replace(self.config, seed=self.seeds[member], hyperparameters=hyperparameters)

    def hyperparameters(self, member: int) -> dict[str, Any]:
        """Member ``member``'s current values of :attr:`member_hyperparameters` (floats; None: no clip)."""
        self._check_member(member)
        return {
            name: _decode(
                float(self.hyperparameter_tensors[name][member]), name in self.optional_hyperparameters
            )
            for name in self.member_hyperparameters
        }

    def set_hyperparameters(self, member: int, values: dict[str, Any]) -> None:
        """Give member ``member`` new values of some of :attr:`member_hyperparameters`, validated as the
        algorithm's config validates them; the others keep theirs. They apply from the next round."""
        self._check_member(member)
        merged = self._validated_values(member, {**self.hyperparameters(member), **values})
        for name, value in merged.items():
            self.hyperparameter_tensors[name][member] = _encode(value)
        self._refresh_flags()

    def _validated_values(self, member: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """The config's per-member values with ``overrides``, checked as the config's validate checks them."""
        self._check_names(overrides)
        base = {name: getattr(self.config.hyperparameters, name) for name in self.member_hyperparameters}
        values = {**base, **overrides}
        for name, value in overrides.items():
            optional = name in self.optional_hyperparameters
            allowed = "a number, or None for no clipping" if optional else "a number"
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (is_number or (value is None and optional)):
                raise ConfigError(f"member {member}: {name} = {value!r} is invalid: expected {allowed}.")
        candidate = dataclasses.replace(self.config.hyperparameters, **values)
        try:
            candidate.validate(self.config)
        except ConfigError as error:
            raise ConfigError(f"member {member}: {error}") from None
        return values

    def _check_names(self, values: dict[str, Any]) -> None:
        """A ConfigError for a name that is not a per-member hyperparameter, naming the per-member ones."""
        per_member = self.member_hyperparameters
        allowed = ", ".join(per_member)
        shared = {field.name for field in dataclasses.fields(self.config.hyperparameters)} | {
            field.name for field in dataclasses.fields(TrainConfig)
        }
        for name in values:
            if name in per_member:
                continue
            if name == "seed":
                raise ConfigError(
                    "seed is not a hyperparameter of a member: each member's seed is its entry of the seeds "
                    f"argument of {type(self).__name__}."
                )
            if name in shared:
                raise ConfigError(
                    f"{name} is shared by all members of a vectorized population (it shapes the networks, "
                    f"the env, the rollout or the update), so it cannot be set per member; set it in the "
                    f"config instead. Per-member hyperparameters: {allowed}."
                )
            close = difflib.get_close_matches(str(name), per_member, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown hyperparameter {name!r}.{hint} Per-member hyperparameters: {allowed}."
            )

    def _check_member(self, member: int) -> None:
        if not (isinstance(member, int) and not isinstance(member, bool) and 0 <= member < self.num_members):
            raise ConfigError(
                f"member {member!r} is not a member of this population: expected an integer in "
                f"[0, {self.num_members - 1}]."
            )

    def _initial_member(self, member: int) -> tuple[Algorithm, torch.Generator]:
        """The algorithm a single run seeded ``seeds[member]`` builds (on CPU, as Trainer's nets are
        initialised before they move), and a generator in the state that run's global RNG is in afterwards.

        The global RNG is left as it was (``fork_rng``)."""
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

    @torch.no_grad()
    def copy_member(self, source: int, target: int) -> None:
        """Give member ``target`` the networks, optimiser state and normalisation statistics of member
        ``source``; ``target`` keeps its hyperparameters, its env rows and their state, and its generator."""
        self._check_member(source)
        self._check_member(target)
        if source == target:
            return
        tensors = self._member_tensors()
        for statistics in (self.obs_statistics, self.reward_statistics):
            if statistics is not None:  # mean and var per member (the count is the same for all)
                tensors += [statistics.mean, statistics.var]
        for tensor in tensors:
            tensor[target] = tensor[source]

    # -- the member env --------------------------------------------------------------------------------
    def _build_env(self, num_envs: int, training: bool) -> VecEnv:
        """``num_envs`` rows of the config's env in the wrapper chain of every run (``wrap_env``), with the
        normalisation statistics and the reward discount per member."""
        statistics = None if training else self.obs_statistics
        env = make_env(self.config.env, num_envs=num_envs, device=self.device)
        gamma = self.hyperparameter_tensors["gamma"]
        return wrap_env(env, self.config, training, statistics, None, self.num_members, gamma)

    def _env_seeds(self, offset: int, rows_per_member: int) -> int | list[int]:
        """``reset(seed=...)`` giving each member's rows what a single env seeded ``seed + offset`` gets."""
        return block_seeds(self.env, [seed + offset for seed in self.seeds], rows_per_member)

    @property
    def obs_statistics(self) -> RunningMeanStd | None:
        """The members' observation statistics, ``(P, *obs_shape)``, or None without normalize_obs."""
        normalizer = find_wrapper(self.env, MemberNormalizeObservation)
        return normalizer.statistics if normalizer is not None else None

    @property
    def reward_statistics(self) -> RunningMeanStd | None:
        """The members' return statistics, ``(P,)``, or None without normalize_reward."""
        scaler = find_wrapper(self.env, MemberScaleReward)
        return scaler.statistics if scaler is not None else None

    # -- training and evaluation -----------------------------------------------------------------------
    def train(self, steps: int) -> dict[str, Tensor]:
        """Train every member ``steps`` more env steps (rounded up to whole rounds).

        Returns the metrics of the last round that learned and the means of the episodes finished during
        this call, each ``(P,)`` on the device (``episode_return_mean``: NaN for a member that finished none).
        """
        if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1):
            raise ConfigError(
                f"{type(self).__name__}.train: steps = {steps!r} is invalid: expected an integer >= 1 (env "
                f"steps per member; they are rounded up to whole rounds of {self.steps_per_round})."
            )
        start = time.perf_counter()
        self._episodes.zero_()
        metrics: dict[str, Tensor] = {}
        for _ in range(math.ceil(steps / self.steps_per_round)):
            progress = min((self.steps + self.steps_per_round) / self.config.total_steps, 1.0)
            metrics = self._train_round(progress) or metrics  # a round may make no update (a warm-up)
            self.steps += self.steps_per_round
        count, return_sum, length_sum = self._episodes
        finished = count.clamp(min=1)
        metrics["episodes"] = count
        metrics["episode_return_mean"] = torch.where(count > 0, return_sum / finished, math.nan)
        metrics["episode_length_mean"] = torch.where(count > 0, length_sum / finished, math.nan)
        self.wall_time += time.perf_counter() - start
        return metrics

    def _record_episodes(self, dones: Tensor, info: dict[str, Any]) -> None:
        """Add the episodes that ended this step (``dones``: ``(P * N,)``) to each member's sums."""
        finished = dones.view(self.num_members, self.num_envs)
        episode_return = info["episode_return"].view(self.num_members, self.num_envs)
        episode_length = info["episode_length"].view(self.num_members, self.num_envs)
        self._episodes += torch.stack(  # (3, P): episodes, return sums, length sums
            (
                finished.sum(dim=1, dtype=torch.float64),
                torch.where(finished, episode_return, 0.0).sum(dim=1, dtype=torch.float64),
                torch.where(finished, episode_length, 0).sum(dim=1, dtype=torch.float64),
            )
        )

    @torch.no_grad()
    def evaluate(self, episodes: int) -> Tensor:
        """``(P,)`` mean return of each member's deterministic policy over ``episodes`` episodes.

        Member i runs on its own rows of an evaluation env seeded as a single run's evaluator
        (``seeds[i] + EVAL_SEED_OFFSET``), with its frozen observation statistics; the training envs,
        generators and RNG are not touched. Returns a float64 CPU tensor (one host sync per 16 steps).
        """
        if not (isinstance(episodes, int) and not isinstance(episodes, bool) and episodes >= 1):
            raise ConfigError(
                f"{type(self).__name__}.evaluate: episodes = {episodes!r} is invalid: expected an "
                "integer >= 1."
            )
        env = self._eval_envs.get(episodes)
        if env is None:
            env = self._eval_envs[episodes] = self._build_env(self.num_members * episodes, training=False)
        seeds = self._env_seeds(EVAL_SEED_OFFSET, episodes)  # a list: each member's rows as its own run's
        evaluation = Evaluator(env, seed=seeds).evaluate(self._evaluation_actor())
        means = (
            torch.tensor(evaluation.returns, dtype=torch.float64).view(self.num_members, episodes).mean(dim=1)
        )
        self.best_eval_return = [
            max(best, mean) for best, mean in zip(self.best_eval_return, means.tolist(), strict=True)
        ]
        return means

    def _progress_state(self, member: int) -> dict[str, Any]:
        """Member ``member``'s ``progress`` entry of a single run's agent state (as Trainer's)."""
        config = self.config
        eval_every, checkpoint_every = config.eval_every, config.checkpoint_every
        return {
            "steps": self.steps,
            "updates": self.updates,
            "wall_time_s": self.wall_time,
            "best_eval_return": self.best_eval_return[member],
            "time_to_stop_return_s": None,
            "schedules": {  # the built-in hooks' next steps (train.state.RunState.schedules)
                "evaluations": (self.steps // eval_every + 1) * eval_every if eval_every else math.inf,
                "checkpoints": (
                    (self.steps // checkpoint_every + 1) * checkpoint_every if checkpoint_every else math.inf
                ),
                "logging": self.steps,
            },
            "updates_owed": 0.0,
        }

    def member_agent_state(self, member: int) -> dict[str, Any]:
        """Member ``member`` as the agent state of an ordinary single run (the keys of
        ``Trainer.agent_state()``): written as ``checkpoints/step_<n>/state.pt`` of a run directory whose
        ``config.yaml`` is ``state["config"]``, it loads with ``phalanx.load_agent`` and ``phalanx eval``."""
        config = self.member_config(member)
        with torch.random.fork_rng(devices=[]):  # its throwaway initialisation must not move the RNG
            algorithm = self.algorithm_class(
                config.hyperparameters, self.observation_space, self.action_space, self.device
            )
        self._load_member(member, algorithm)
        return {
            "config": config.to_dict(),
            "spaces": self.spaces,
            "algorithm": algorithm.state_dict(),
            "obs_statistics": self._member_obs_statistics(member),
            "progress": self._progress_state(member),
        }

    def _member_obs_statistics(self, member: int) -> dict[str, Tensor] | None:
        """Member ``member``'s observation statistics as a single run's NormalizeObservation holds them."""
        if self.obs_statistics is None:
            return None
        statistics = self.obs_statistics.state_dict()
        return {
            "mean": statistics["mean"][member].clone(),
            "var": statistics["var"][member].clone(),
            "count": statistics["count"].clone(),
        }

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything to resume exactly: weights, optimiser, hyperparameter tensors, env state, the last
        observations, every member's generator, progress. Tensors and primitives only."""
        learner = self._learner_state()
        return {
            "num_members": self.num_members,
            "seeds": list(self.seeds),
            "config": self.config.to_dict(),
            "hyperparameters": {name: tensor.clone() for name, tensor in self.hyperparameter_tensors.items()},
            **{name: value for name, value in learner.items() if name != "progress"},
            "env": self.env.state_dict(),
            "obs": self.obs.clone(),
            "generators": [generator.get_state() for generator in self.generators],
            "progress": {
                "steps": self.steps,
                "updates": self.updates,
                **learner.get("progress", {}),
                "wall_time_s": self.wall_time,
                "best_eval_return": list(self.best_eval_return),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, into a population built with the same shared settings."""
        name = type(self).__name__
        saved = TrainConfig.from_dict(state["config"], where=f"the {name} state")
        theirs = {"num_members": state["num_members"], **self._shared_settings(saved)}
        mine = {"num_members": self.num_members, **self._shared_settings(self.config)}
        differences = [
            f"{setting}: the state has {theirs[setting]!r}, this population {mine[setting]!r}"
            for setting in mine
            if theirs[setting] != mine[setting]
        ]
        if differences:
            raise CheckpointError(
                f"cannot load this {name} state: " + "; ".join(differences) + ". Build the population "
                "with the config and number of seeds the state was saved with."
            )
        with torch.no_grad():
            for setting, tensor in self.hyperparameter_tensors.items():
                tensor.copy_(state["hyperparameters"][setting])
        self._refresh_flags()
        self._load_learner_state(state)
        self.env.load_state_dict(state["env"])
        self.obs = state["obs"].to(self.device).clone()
        self.seeds = list(state["seeds"])
        for generator, generator_state in zip(self.generators, state["generators"], strict=True):
            generator.set_state(generator_state.cpu())  # a CPU byte tensor, even for a CUDA generator
        progress = state["progress"]
        self.steps = progress["steps"]
        self.updates = progress["updates"]
        self.wall_time = progress["wall_time_s"]
        self.best_eval_return = list(progress["best_eval_return"])

    def _shared_settings(self, config: TrainConfig) -> dict[str, Any]:
        """The settings two populations must share for one's state to load into the other."""
        hyperparameters = config.hyperparameters
        settings = {
            "algo": config.algo,
            "env": config.env,
            "num_envs": config.num_envs,
            "normalize_obs": config.normalize_obs,
            "normalize_reward": config.normalize_reward,
        }
        for field in self.shared_hyperparameters:
            value = getattr(hyperparameters, field)
            settings[field] = tuple(value) if isinstance(value, list | tuple) else value
        return settings

    def close(self) -> None:
        """Close the training and evaluation envs."""
        for env in (self.env, *self._eval_envs.values()):
            env.close()
        self._eval_envs.clear()


# -- helpers -------------------------------------------------------------------------------------------
def _encode(value: float | None) -> float:
    """A hyperparameter value as a tensor entry: None (no clipping) as +inf."""
    return math.inf if value is None else float(value)


def _decode(value: float, optional: bool) -> float | None:
    """A tensor entry as a hyperparameter value: +inf as None for an ``optional`` one."""
    return None if optional and math.isinf(value) else value
