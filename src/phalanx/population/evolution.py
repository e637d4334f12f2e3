"""What a population is and how it evolves: its config, the mutations, and the selection rules.

The rules here are pure functions of scores and random draws; they never know which backend trains
the members (in-process, processes, Ray actors, or one vectorized run), so every backend evolves the
same way:

- **tournament** (asynchronous): a member that has just reported and ranks in the bottom
  ``replace_fraction`` copies a member drawn from the top fraction by a tournament (the best of
  ``tournament_size`` drawn at random), then mutates the copied hyperparameters;
- **generational** (synchronous): once every member has trained a generation, each of the bottom
  fraction is replaced by a mutated copy of a tournament winner from the top fraction.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from phalanx.config import (
    TrainConfig,
    check,
    check_hyperparameter_name,
    coerce,
    is_int,
    load_yaml,
)
from phalanx.config.specs import parse_kind_args
from phalanx.errors import ConfigError
from phalanx.files import write_text_atomic
from phalanx.registry import vectorized_population

STRATEGIES = ("tournament", "generational")
BACKENDS = ("serial", "process", "ray", "vectorized")
MUTATION_KINDS = {
    "perturb": "perturb:F1,F2,... (multiply by one of the factors), e.g. learning_rate=perturb:0.8,1.25",
    "choices": "choices:A,B,... (resample one of the values), e.g. entropy_coef=choices:0,0.01,0.02",
    "uniform": "uniform:LOW,HIGH (resample uniformly), e.g. gamma=uniform:0.9,0.999",
    "log_uniform": "log_uniform:LOW,HIGH (resample log-uniformly, LOW > 0), e.g. "
    "learning_rate=log_uniform:1e-4,1e-2",
    "steps": "steps:A,B,... (move to a neighbour in the ordered list), e.g. gamma=steps:0.95,0.98,0.99",
    "min": "min:LOW (the least value a mutation gives), e.g. learning_rate=min:1e-5",
    "max": "max:HIGH (the greatest value a mutation gives), e.g. learning_rate=max:1e-2",
    "resample_probability": "resample_probability:P (with perturb and a resampling kind: how often to "
    "resample), e.g. learning_rate=resample_probability:0.25",
}
"""The kinds of a mutation, ``NAME=KIND:ARGS`` on the command line (the keys of a :class:`Mutation`; one
NAME's kinds combine), and how each is written."""


@dataclass
class Mutation:
    """How one hyperparameter is drawn at the start and changed after a member copies another.

    ``perturb`` multiplies the value by one of its factors; ``choices``, ``uniform`` and
    ``log_uniform`` resample it (``resample_probability`` picks resampling when perturb is also
    given); ``steps`` moves it to a neighbour along an ordered list. ``min``/``max`` bound the result.
    """

    perturb: tuple[float, ...] | None = None
    choices: tuple[Any, ...] | None = None
    uniform: tuple[float, float] | None = None
    log_uniform: tuple[float, float] | None = None
    steps: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    resample_probability: float = 0.25

    @staticmethod
    def spec_from_text(text: str, where: str = "--mutate") -> dict[str, Any]:
        """The mapping a CLI spec ``KIND:ARGS`` stands for: ``log_uniform:1e-4,1e-2`` ->
        ``{"log_uniform": [0.0001, 0.01]}``, ``min:1e-5`` -> ``{"min": 1e-05}`` (values read as in YAML,
        :func:`~phalanx.config.specs.parse_kind_args`); errors start with ``where``."""
        kind, arguments = parse_kind_args(text, MUTATION_KINDS, where)
        takes_one = kind in ("min", "max", "resample_probability")
        return {kind: arguments[0] if takes_one and len(arguments) == 1 else list(arguments)}

    @classmethod
    def from_spec(cls, name: str, spec: Any, where: str) -> Mutation:
        """From YAML (a mapping) or the CLI's ``KIND:ARGS`` string, e.g. ``perturb:0.8,1.2``."""
        if isinstance(spec, str):
            spec = cls.spec_from_text(spec, f"{where}: mutation of {name!r}")
        if not isinstance(spec, dict):
            raise ConfigError(
                f"{where}: mutation of {name!r} must be a mapping such as {{perturb: [0.8, 1.2], min: 1e-5}} "
                f"or a string such as 'perturb:0.8,1.2', got {spec!r}."
            )
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(spec) - set(valid))
        if unknown:
            raise ConfigError(
                f"{where}: mutation of {name!r} has unknown keys {unknown}; valid keys: {valid}."
            )
        where = f"{where}: mutation of {name!r}"
        return cls(**{key: coerce(cls, key, value, where) for key, value in spec.items()})

    def validate(self, name: str, base_value: Any) -> None:
        def fail(what: str) -> None:
            raise ConfigError(f"mutation of {name!r}: {what}")

        kinds = [k for k in ("choices", "uniform", "log_uniform", "steps") if getattr(self, k) is not None]
        if len(kinds) > 1:
            fail(f"give at most one of choices, uniform, log_uniform and steps, got {kinds}.")
        if not kinds and self.perturb is None:
            fail("give perturb, choices, uniform, log_uniform or steps (nothing says how to change it).")
        if self.perturb is not None:
            if not self.perturb or not all(isinstance(f, (int, float)) and f > 0 for f in self.perturb):
                fail(f"perturb must be a list of positive factors such as [0.8, 1.2], got {self.perturb}.")
            if not isinstance(base_value, (int, float)) or isinstance(base_value, bool):
                fail(f"perturb needs a number, but its value is {base_value!r}; use choices or steps.")
        for kind in ("uniform", "log_uniform"):
            bounds = getattr(self, kind)
            if bounds is None:
                continue
            if len(bounds) != 2 or not all(isinstance(b, (int, float)) for b in bounds):
                fail(f"{kind} must be [low, high], got {list(bounds)}.")
            if bounds[0] > bounds[1]:
                fail(
                    f"{kind} bounds are inverted: low {bounds[0]} > high {bounds[1]}; "
                    f"write [{bounds[1]}, {bounds[0]}]."
                )
            if kind == "log_uniform" and bounds[0] <= 0:
                fail(f"log_uniform needs positive bounds, got {list(bounds)}.")
        for kind in ("choices", "steps"):
            values = getattr(self, kind)
            if values is not None and len(values) < 2:
                fail(f"{kind} needs at least two values, got {list(values)}.")
        if self.min is not None and self.max is not None and self.min > self.max:
            fail(f"bounds are inverted: min {self.min} > max {self.max}; swap them.")
        check(
            0.0 <= self.resample_probability <= 1.0,
            f"{name}.resample_probability",
            self.resample_probability,
            "a probability in [0, 1]",
        )

    def initial(self, base_value: Any, rng: random.Random) -> Any:
        """A member's starting value: drawn from the distribution or list if there is one, else the base."""
        if self.choices is not None or self.uniform is not None or self.log_uniform is not None:
            return _like(base_value, self._resample(base_value, rng))
        if self.steps is not None:
            return _like(base_value, rng.choice(self.steps))
        return base_value

    def mutate(self, value: Any, rng: random.Random) -> Any:
        """The value after explore: resample, perturb, or step along the list."""
        can_resample = self.choices is not None or self.uniform is not None or self.log_uniform is not None
        if can_resample and (self.perturb is None or rng.random() < self.resample_probability):
            return _like(value, self._resample(value, rng))
        if self.perturb is not None:
            return self._bound(value * rng.choice(self.perturb), value)
        assert self.steps is not None, "a mutation that neither resamples nor perturbs steps (validated)"
        index = _nearest_index(self.steps, value)
        index = min(max(index + rng.choice((-1, 1)), 0), len(self.steps) - 1)
        return _like(value, self.steps[index])

    def _resample(self, value: Any, rng: random.Random) -> Any:
        if self.choices is not None:
            return rng.choice(self.choices)
        if self.uniform is not None:
            return self._bound(rng.uniform(*self.uniform), value)
        assert self.log_uniform is not None, "the resampling kind left (mutate checked there is one)"
        low, high = self.log_uniform
        return self._bound(math.exp(rng.uniform(math.log(low), math.log(high))), value)

    def _bound(self, new: float, old: Any) -> Any:
        if self.min is not None:
            new = max(new, self.min)
        if self.max is not None:
            new = min(new, self.max)
        return max(1, round(new)) if is_int(old) else float(new)


def _like(reference: Any, value: Any) -> Any:
    """A listed value of a float hyperparameter as a float (``choices: [0, 0.01]`` gives 0.0, not the
    int 0, which a later perturb would round as an integer)."""
    return float(value) if isinstance(reference, float) and is_int(value) else value


def _nearest_index(values: tuple[Any, ...], value: Any) -> int:
    if value in values:
        return values.index(value)
    numeric = [abs(v - value) if isinstance(v, (int, float)) else math.inf for v in values]
    return numeric.index(min(numeric))


@dataclass
class Resources:
    """What the orchestrator may use, and what one member needs; it runs as many members as fit."""

    cpus: float | None = None
    """CPU cores to use (None: the cores this process may run on; on Ray, the cluster's)."""
    gpus: float | None = None
    """GPUs to use (None: the visible CUDA devices when the base device is cuda, else 0)."""
    memory_gb: float | None = None
    """Memory to use (None: not a limit)."""
    cpus_per_member: float = 1.0
    """CPU cores one member needs (its torch threads)."""
    gpus_per_member: float = 0.0
    """The fraction of a GPU one member needs (0.25: four members share a GPU)."""
    memory_per_member_gb: float = 0.0
    """Memory one member needs (0: not counted)."""
    max_concurrent: int | None = None
    """At most this many members at once (None: as many as fit); `phalanx population scale` changes it."""

    def slots(self, cpus: float, gpus: float, memory_gb: float | None) -> int:
        """How many members fit into ``cpus``, ``gpus`` and ``memory_gb`` (the resources seen now)."""
        fits = [math.floor(cpus / self.cpus_per_member + 1e-9)]
        if self.gpus_per_member > 0:
            fits.append(math.floor(gpus / self.gpus_per_member + 1e-9))
        if self.memory_per_member_gb > 0 and memory_gb is not None:
            fits.append(math.floor(memory_gb / self.memory_per_member_gb + 1e-9))
        if self.max_concurrent is not None:
            fits.append(self.max_concurrent)
        return max(min(fits), 0)

    def validate(self) -> None:
        for name in ("cpus", "gpus", "memory_gb"):
            value = getattr(self, name)
            check(value is None or value >= 0, f"resources.{name}", value, ">= 0, or None to detect it")
        check(self.cpus_per_member > 0, "resources.cpus_per_member", self.cpus_per_member, "> 0")
        check(
            0 <= self.gpus_per_member,
            "resources.gpus_per_member",
            self.gpus_per_member,
            ">= 0 (a fraction of a GPU, e.g. 0.25)",
        )
        check(
            self.memory_per_member_gb >= 0,
            "resources.memory_per_member_gb",
            self.memory_per_member_gb,
            ">= 0",
        )
        check(
            self.max_concurrent is None or (is_int(self.max_concurrent) and self.max_concurrent >= 1),
            "resources.max_concurrent",
            self.max_concurrent,
            "an integer >= 1, or None",
        )


@dataclass
class PopulationConfig:
    """A population: the base run every member starts from, how it evolves, and where it runs."""

    base: TrainConfig
    """The training config of every member (its total_steps is each member's budget)."""
    size: int = 8
    """Members at the start."""
    strategy: str = "tournament"
    """tournament (asynchronous) or generational (synchronous)."""
    interval: int = 50_000
    """Env steps a member trains between evaluations and selections (one generation)."""
    replace_fraction: float = 0.25
    """The bottom fraction that copies from the top fraction."""
    tournament_size: int = 2
    """Members drawn from the top fraction; the best of them is copied."""
    mutations: dict[str, Mutation] = field(default_factory=dict)
    """Hyperparameter name -> how it is drawn and mutated."""
    backend: str = "process"
    """serial (in this process), process (one process per member), ray (Ray actors), vectorized."""
    resources: Resources = field(default_factory=Resources)
    """What the orchestrator may use and what a member needs."""
    max_restarts: int = 2
    """Restarts of a crashed member (from its last checkpoint) before it is removed."""
    address: str | None = None
    """Ray: the cluster address (None: start a local Ray)."""
    fallback: bool = False
    """Ray: run on the process backend if the cluster cannot be reached (else that is an error)."""
    directory: str | None = None
    """Population directory; default populations/<env>__<algo>__<yyyymmdd-hhmmss>."""

    def validate(self) -> None:
        self.base.validate()
        check(is_int(self.size) and self.size >= 1, "size", self.size, "an integer >= 1")
        check(self.strategy in STRATEGIES, "strategy", self.strategy, f"one of {STRATEGIES}")
        if self.strategy == "tournament":
            check(
                self.size >= 2,
                "size",
                self.size,
                ">= 2 for tournament selection: a member copies another member",
            )
        check(is_int(self.interval) and self.interval >= 1, "interval", self.interval, "env steps >= 1")
        check(
            isinstance(self.replace_fraction, (int, float)) and 0 < self.replace_fraction < 1,
            "replace_fraction",
            self.replace_fraction,
            "a fraction in (0, 1), e.g. 0.25 (the bottom quarter copies the top quarter)",
        )
        check(
            is_int(self.tournament_size) and self.tournament_size >= 1,
            "tournament_size",
            self.tournament_size,
            "an integer >= 1",
        )
        check(self.backend in BACKENDS, "backend", self.backend, f"one of {BACKENDS}")
        check(is_int(self.max_restarts) and self.max_restarts >= 0, "max_restarts", self.max_restarts, ">= 0")
        self.resources.validate()
        if self.backend == "vectorized":
            engine = vectorized_population(self.base.algo)
            engine.check_config(self.base)  # what its batched members cannot do, before any directory
            batched = engine.member_hyperparameters
            if self.base.track is not None:
                raise ConfigError(
                    f"track = {self.base.track!r} is not supported by backend 'vectorized': its members "
                    "train as one batched run, without run directories, metrics.csv or evaluations of their "
                    "own to log. Use --backend process (or serial, ray), where each member is an ordinary "
                    "run and logs a W&B run of its own, grouped by population; or drop --track."
                )
            fixed = sorted(set(self.mutations) - set(batched))
            if fixed:
                raise ConfigError(
                    f"backend 'vectorized' shares {fixed} across its members (they shape the batched "
                    f"networks, the rollout or the replay); it can mutate {', '.join(batched)}. Drop "
                    "those mutations, or use the process backend."
                )
        hyperparameters = self.base.hyperparameters
        for name, mutation in self.mutations.items():
            check_hyperparameter_name(name, self.base, where="mutations")
            if name in ("hidden_sizes", "buffer_size"):
                raise ConfigError(
                    f"mutations: {name!r} cannot be mutated: a member that copies another takes its "
                    + (
                        "networks, whose shapes it sets"
                        if name == "hidden_sizes"
                        else "weights into its own replay buffer, whose capacity it sets"
                    )
                    + ". Give every member the same value in the base config."
                )
            mutation.validate(name, getattr(hyperparameters, name))

    # -- dict/YAML round trip --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["base"] = self.base.to_dict()
        data["mutations"] = {
            name: {k: _plain(v) for k, v in dataclasses.asdict(m).items() if v is not None}
            for name, m in self.mutations.items()
        }
        data["resources"] = dataclasses.asdict(self.resources)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "population config") -> PopulationConfig:
        data = dict(data)
        base = data.pop("base", None)
        if not isinstance(base, dict):
            raise ConfigError(
                f"{where}: needs a 'base' mapping with the members' training config "
                "(at least algo and env), e.g. base: {{algo: ppo, env: Pendulum-v1, total_steps: 200000}}."
            )
        valid = [f.name for f in dataclasses.fields(cls) if f.name != "base"]
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise ConfigError(
                f"{where}: unknown settings {unknown}; valid settings: base, {', '.join(valid)}."
            )
        mutations = data.pop("mutations", None) or {}
        if not isinstance(mutations, dict):
            raise ConfigError(
                f"{where}: mutations must map hyperparameter names to specs, got {mutations!r}."
            )
        resources = data.pop("resources", None) or {}
        resource_fields = [f.name for f in dataclasses.fields(Resources)]
        if not isinstance(resources, dict) or set(resources) - set(resource_fields):
            raise ConfigError(
                f"{where}: resources must be a mapping with keys from {resource_fields}, got {resources!r}."
            )
        return cls(
            base=TrainConfig.from_dict(base, where=f"{where}: base"),
            mutations={name: Mutation.from_spec(name, spec, where) for name, spec in mutations.items()},
            resources=Resources(
                **{
                    key: coerce(Resources, key, value, f"{where}: resources")
                    for key, value in resources.items()
                }
            ),
            **{key: coerce(cls, key, value, where) for key, value in data.items()},
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> PopulationConfig:
        return cls.from_dict(load_yaml(path), where=f"population config {str(path)!r}")

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# -- selection ------------------------------------------------------------------------------------
def ranking(scores: dict[str, float]) -> list[str]:
    """Member ids, best score first (ties: the older id first, so that ranks are reproducible)."""
    return sorted(scores, key=lambda member: (-scores[member], member))


def split(scores: dict[str, float], fraction: float) -> tuple[list[str], list[str]]:
    """(top, bottom): the best and the worst ``fraction`` of the members, at least one each and never
    overlapping (with two members, one is the top and the other the bottom)."""
    ranked = ranking(scores)
    count = min(max(1, round(fraction * len(ranked))), len(ranked) // 2)
    return ranked[:count], ranked[len(ranked) - count :] if count else []


def tournament(candidates: list[str], scores: dict[str, float], size: int, rng: random.Random) -> str:
    """The best of ``size`` candidates drawn at random (without replacement, at most all of them)."""
    drawn = rng.sample(candidates, min(size, len(candidates)))
    return ranking({member: scores[member] for member in drawn})[0]


def tournament_donor(
    member: str, scores: dict[str, float], fraction: float, size: int, rng: random.Random
) -> str | None:
    """Tournament: the member ``member`` copies, or None when it is not in the bottom fraction."""
    top, bottom = split(scores, fraction)
    if member not in bottom:
        return None
    return tournament(top, scores, size, rng)


def generational_plan(
    scores: dict[str, float], fraction: float, size: int, rng: random.Random
) -> list[tuple[str, str]]:
    """Generational: (replaced, donor) pairs, every bottom member with a tournament winner of the top."""
    top, bottom = split(scores, fraction)
    return [(member, tournament(top, scores, size, rng)) for member in bottom]


def explore(
    hyperparameters: dict[str, Any], mutations: dict[str, Mutation], rng: random.Random
) -> dict[str, Any]:
    """New values of the mutated hyperparameters, from the copied ones."""
    return {name: mutation.mutate(hyperparameters[name], rng) for name, mutation in mutations.items()}


# -- random streams ---------------------------------------------------------------------------------
STREAMS = ("member", "decision")
"""What a population draws at random: a member's starting hyperparameters (indexed by the member) and
each decision's draws (selection, tournament, mutation; indexed by the number of decisions so far)."""


def population_random(seed: int, stream: str, index: int) -> random.Random:
    """The draws of member ``index``'s start or of decision ``index``: an independent stream derived
    from the base ``seed`` by :class:`numpy.random.SeedSequence` (spawn key: the stream, the index), so
    that no draw of a population replays another, for any seed (0 included); the same seed, stream and
    index give the same draws, and a resume goes on with the decision count of the leaderboard."""
    words = np.random.SeedSequence(seed, spawn_key=(STREAMS.index(stream), index)).generate_state(4)
    return random.Random(sum(int(word) << (32 * i) for i, word in enumerate(words)))


def initial_hyperparameters(config: PopulationConfig, rng: random.Random) -> dict[str, Any]:
    """A new member's starting values of the mutated hyperparameters."""
    base = config.base.hyperparameters
    return {name: mutation.initial(getattr(base, name), rng) for name, mutation in config.mutations.items()}


def member_config(
    config: PopulationConfig, seed: int, hyperparameters: dict[str, Any], run_dir: Path
) -> TrainConfig:
    """A member's training config: the base with its seed, run directory and hyperparameters.

    Members evaluate in their own process (``eval_process`` off, whatever the base's preset says): a
    member's fitness is the evaluation that ends its interval, and the population fills the cores."""
    member = dataclasses.replace(
        config.base,
        seed=seed,
        run_dir=str(run_dir),
        eval_process=False,
        resume=False,  # the population's own (--resume): a member goes on from its checkpoint anyway
        hyperparameters=dataclasses.replace(config.base.hyperparameters, **hyperparameters),
    )
    member.validate()
    return member
