"""Hyperparameter search with Optuna: independent trials, each an ordinary run directory.

``phalanx tune ALGO ENV --trials N`` (or :func:`tune`) asks Optuna's sampler for each trial's
hyperparameters, trains the trial in chunks of ``interval`` env steps on the population module's backend
(:class:`~phalanx.population.backends.Task` in, :class:`~phalanx.population.backends.Report` out: in this
process, or one process per running trial), reports each chunk's deterministic evaluation return to the
trial, and lets Optuna's pruner stop the trials that do worse than the others at the same step. The
objective is the return of the evaluation that ends the trial (its final one, as RL Zoo's).

The study lives in Optuna's storage (a SQLite file in the tune directory unless ``--storage`` names
another), so rerunning the same command continues it: finished trials are kept, and a trial that was
running when the study was interrupted (Ctrl+C) or killed goes on from its run directory's checkpoint.

Tune directory::

    tune.yaml          the resolved search: base config, search space, interval, sampler, pruner
    study.db           the Optuna storage (SQLite), unless --storage names another
    trials.csv         every trial: number, state, value, steps, seconds, params, run directory
    best.yaml          the best trial's config, for `phalanx train ALGO ENV --config best.yaml`
    trials/trial_0007/ each trial's run directory (`phalanx eval`, `phalanx resume` work on it)
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import difflib
import io
import math
import os
import time
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phalanx.algos.base import OffPolicyConfig
from phalanx.algos.ddpg import DDPGConfig, EnsembleCriticConfig
from phalanx.algos.dqn import DQNConfig
from phalanx.algos.ppo import A2CConfig, ActorCriticConfig, PPOConfig
from phalanx.config import TrainConfig, check_hyperparameter_name, coerce, is_int, parse_yaml
from phalanx.errors import ConfigError, PhalanxError, import_optional
from phalanx.files import write_text_atomic
from phalanx.marl.qmix import ValueDecompositionConfig
from phalanx.population.backends import ProcessBackend, Report, SerialBackend, Task
from phalanx.train.environments import picklable_factory
from phalanx.train.launch import available_cores

KINDS = {
    "uniform": "uniform:LOW,HIGH (a float drawn uniformly), e.g. gamma=uniform:0.9,0.9999",
    "log": "log:LOW,HIGH (a float drawn log-uniformly, LOW > 0), e.g. learning_rate=log:1e-5,1e-3",
    "int": "int:LOW,HIGH[,STEP] (an integer, both ends included), e.g. epochs=int:1,10",
    "int_log": "int_log:LOW,HIGH (an integer drawn log-uniformly, LOW >= 1), e.g. horizon=int_log:16,256",
    "choice": "choice:A,B,... (one of the values), e.g. activation=choice:tanh,relu",
}
"""The kinds of a search dimension, ``NAME=KIND:ARGS``, and how each is written."""
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
BACKENDS = ("serial", "process")
TRIAL_STATES_ENDED = ("COMPLETE", "PRUNED", "FAIL")
MAX_FAILURES_IN_A_ROW = 3
"""Trials that crash one after another before the study stops (the cause is likely not the values)."""


# -- the search space -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dimension:
    """One searched hyperparameter: its kind (:data:`KINDS`) and arguments (bounds, step or values)."""

    kind: str
    arguments: tuple[Any, ...]

    @classmethod
    def parse(cls, name: str, spec: str | Dimension) -> Dimension:
        """From ``KIND:ARGS`` (``log:1e-5,1e-3``; the values read as in YAML, so ``choice:[64,64],[256,256]``
        is a choice of two lists), or a Dimension as it is."""
        if isinstance(spec, Dimension):
            return spec
        if not isinstance(spec, str):
            raise ConfigError(
                f"search of {name!r}: expected a string KIND:ARGS such as 'log:1e-5,1e-3', got {spec!r}."
            )
        kind, colon, rest = spec.partition(":")
        kind = kind.strip()
        if not colon or kind not in KINDS:
            close = difflib.get_close_matches(kind, list(KINDS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"--search {name}={spec}: unknown kind {kind!r}.{hint} Write NAME=KIND:ARGS with one of:\n  "
                + "\n  ".join(KINDS.values())
            )
        try:
            values = parse_yaml(f"[{rest}]")
        except yaml.YAMLError as error:
            raise ConfigError(
                f"--search {name}={spec}: cannot read the values {rest!r} ({error}); expected {KINDS[kind]}."
            ) from None
        return cls(kind, tuple(values))

    def text(self) -> str:
        """As written on the command line: ``log:1.0e-05, 0.001``."""
        written = yaml.safe_dump(list(self.arguments), default_flow_style=True, width=10**6).strip()
        return f"{self.kind}:{written[1:-1]}"

    def validate(self, name: str, base: TrainConfig) -> None:
        """The name is a hyperparameter of ``base``'s algorithm, the kind fits its type, the bounds are in
        order, and the config is valid at each bound and with each value."""
        where = f"--search {name}={self.text()}"
        check_hyperparameter_name(name, base, where=f"--search {name}=...")
        hyperparameters = base.hyperparameters
        kind, arguments = self.kind, self.arguments
        expected = KINDS[kind]
        if kind == "choice":
            if len(arguments) < 2:
                raise ConfigError(
                    f"{where}: a choice needs at least two values, got {list(arguments)} (to fix one value, "
                    f"pass --{name.replace('_', '-')} VALUE instead)."
                )
        else:
            counts = (2, 3) if kind == "int" else (2,)
            numbers = all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in arguments)
            if len(arguments) not in counts or not numbers:
                raise ConfigError(f"{where}: expected {expected}, got {list(arguments)}.")
            low, high = arguments[:2]
            if low >= high:
                swap = f" (swap them: {kind}:{high},{low})" if low > high else ""
                raise ConfigError(
                    f"{where}: the bounds are inverted or equal: low {low} >= high {high}; expected low < "
                    f"high{swap}."
                )
            if kind == "log" and low <= 0:
                raise ConfigError(
                    f"{where}: a log-uniform search needs low > 0, got low {low}; use e.g. log:1e-8,{high}, "
                    "or uniform to include 0."
                )
            if kind == "int_log" and low < 1:
                raise ConfigError(f"{where}: an int_log search needs low >= 1, got low {low}.")
            if kind in ("int", "int_log") and not all(is_int(a) for a in arguments):
                raise ConfigError(f"{where}: an integer search needs whole numbers, got {list(arguments)}.")
            if kind == "int" and len(arguments) == 3 and arguments[2] < 1:
                raise ConfigError(f"{where}: the step must be >= 1, got {arguments[2]}.")
            if kind == "int" and len(arguments) == 3 and (high - low) % arguments[2]:
                step = arguments[2]
                reached = low + (high - low) // step * step
                raise ConfigError(
                    f"{where}: with step {step} from {low} the search never reaches {high} (its values are "
                    f"{low}, {low + step}, ..., {reached}); both ends are included, so high - low must be a "
                    f"multiple of the step: e.g. int:{low},{reached},{step} or int:{low},"
                    f"{reached + step},{step}."
                )
            field_type = _number_type(type(hyperparameters), name)
            if kind in ("uniform", "log") and field_type is not float:
                raise ConfigError(
                    f"{where}: {name} is {_type_name(field_type)}, not a float; search it with "
                    + ("int or int_log" if field_type is int else "choice")
                    + "."
                )
            if kind in ("int", "int_log") and field_type is not int:
                raise ConfigError(
                    f"{where}: {name} is {_type_name(field_type)}, not an integer; search it with "
                    + ("uniform or log" if field_type is float else "choice")
                    + "."
                )
        values = arguments if kind == "choice" else arguments[:2]
        for value in values:
            try:
                trial = with_hyperparameters(base, {name: self.decode(name, base, value)})
                trial.validate()
                check_within_budget(trial)
            except ConfigError as error:
                raise ConfigError(f"{where}: the value {value!r} makes an invalid config: {error}") from None

    def suggest(self, trial: Any, name: str) -> Any:
        """The trial's value (as Optuna stores it: a list of a choice as its YAML text)."""
        if self.kind == "uniform":
            return trial.suggest_float(name, *self.arguments)
        if self.kind == "log":
            return trial.suggest_float(name, *self.arguments, log=True)
        if self.kind == "int":
            return trial.suggest_int(name, *self.arguments[:2], step=(self.arguments[2:] or (1,))[0])
        if self.kind == "int_log":
            return trial.suggest_int(name, *self.arguments, log=True)
        return trial.suggest_categorical(name, [_storable(value) for value in self.arguments])

    def decode(self, name: str, base: TrainConfig, stored: Any) -> Any:
        """The config value of a value as Optuna stores it (a choice's list from its YAML text)."""
        if self.kind == "choice":
            stored = next((v for v in self.arguments if _storable(v) == stored), stored)
        return coerce(type(base.hyperparameters), name, stored, f"--search {name}")


def _storable(value: Any) -> Any:
    """A choice as Optuna's categorical distribution takes it: None, bool, int, float or str (a list as
    its YAML text, ``[64, 64]``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()


def _number_type(cls: type, name: str) -> Any:
    """The type of the field ``name`` of ``cls``, without ``| None``."""
    kind = typing.get_type_hints(cls)[name]
    options = [option for option in typing.get_args(kind) if option is not type(None)]
    return options[0] if typing.get_origin(kind) is not None and len(options) == 1 else kind


def _type_name(kind: Any) -> str:
    return {int: "an integer", float: "a float", bool: "true or false", str: "text"}.get(kind, f"a {kind}")


GAMMAS = "choice:0.9,0.95,0.98,0.99,0.995,0.999"
DEFAULT_SEARCH: dict[type, dict[str, str]] = {
    PPOConfig: {
        "learning_rate": "log:1e-5,1e-2",
        "gamma": GAMMAS,
        "gae_lambda": "choice:0.8,0.9,0.95,0.98,1.0",
        "entropy_coef": "log:1e-8,0.1",
        "clip_range": "choice:0.1,0.2,0.3",
        "epochs": "int:1,10",
        "max_grad_norm": "choice:0.3,0.5,1,2,5",
    },
    A2CConfig: {
        "learning_rate": "log:1e-5,1e-2",
        "gamma": GAMMAS,
        "gae_lambda": "choice:0.8,0.9,0.95,0.98,1.0",
        "entropy_coef": "log:1e-8,0.1",
        "horizon": "choice:5,8,16,32",
        "max_grad_norm": "choice:0.3,0.5,1,2,5",
    },
    ActorCriticConfig: {
        "learning_rate": "log:1e-5,1e-2",
        "gamma": GAMMAS,
        "gae_lambda": "choice:0.8,0.9,0.95,0.98,1.0",
        "entropy_coef": "log:1e-8,0.1",
    },
    ValueDecompositionConfig: {
        "learning_rate": "log:1e-5,1e-2",
        "gamma": GAMMAS,
        "batch_size": "choice:64,128,256,512",
        "exploration_final": "uniform:0.0,0.2",
        "tau": "choice:0.001,0.005,0.01,0.05",
    },
    DQNConfig: {
        "learning_rate": "log:1e-5,1e-2",
        "gamma": GAMMAS,
        "batch_size": "choice:64,128,256,512",
        "exploration_final": "uniform:0.0,0.2",
        "target_update_interval": "choice:100,500,1000,2000",
    },
    DDPGConfig: {
        "learning_rate": "log:1e-5,3e-3",
        "gamma": GAMMAS,
        "batch_size": "choice:64,128,256,512",
        "tau": "choice:0.001,0.005,0.01,0.02,0.05",
        "exploration_noise": "choice:0.05,0.1,0.2,0.3",
    },
    EnsembleCriticConfig: {
        "learning_rate": "log:1e-5,3e-3",
        "gamma": GAMMAS,
        "batch_size": "choice:64,128,256,512",
        "tau": "choice:0.001,0.005,0.01,0.02,0.05",
    },
    OffPolicyConfig: {
        "learning_rate": "log:1e-5,1e-2",
        "gamma": GAMMAS,
        "batch_size": "choice:64,128,256,512",
    },
}
"""The search space of an algorithm when none is given, by the most specific class of its hyperparameters
(modest, after RL Zoo's: the learning rate, the discount, and the few settings that matter most)."""


def default_search(base: TrainConfig) -> dict[str, Dimension]:
    """The default search space of ``base``'s algorithm (:data:`DEFAULT_SEARCH`)."""
    for cls in type(base.hyperparameters).__mro__:
        if cls in DEFAULT_SEARCH:
            return {name: Dimension.parse(name, spec) for name, spec in DEFAULT_SEARCH[cls].items()}
    return {
        "learning_rate": Dimension.parse("learning_rate", "log:1e-5,1e-2"),
        "gamma": Dimension.parse("gamma", GAMMAS),
    }


def with_hyperparameters(base: TrainConfig, values: Mapping[str, Any], **settings: Any) -> TrainConfig:
    """``base`` with some hyperparameters (and run settings) replaced."""
    hyperparameters = dataclasses.replace(base.hyperparameters, **values)
    return dataclasses.replace(base, hyperparameters=hyperparameters, **settings)


# -- the config -------------------------------------------------------------------------------------
@dataclass
class TuneConfig:
    """A search: the base run every trial starts from, the space, and how trials are run and pruned."""

    base: TrainConfig
    """The training config of every trial (its total_steps is each trial's budget, its seed every trial's)."""
    trials: int = 20
    """Trials in the study: a rerun goes on until this many have ended (complete, pruned or failed)."""
    search: dict[str, Dimension] = field(default_factory=dict)
    """Hyperparameter name -> its dimension (empty: the algorithm's default search space)."""
    sampler: str = "tpe"
    """How Optuna draws a trial's values: tpe (Tree-structured Parzen Estimator) or random."""
    pruner: str = "median"
    """median (stop a trial whose score is below the median of the earlier trials' at the same step, after
    5 trials and the first third of the budget) or none."""
    interval: int | None = None
    """Env steps a trial trains between evaluations reported to the pruner (default: total_steps / 5)."""
    parallel: int = 1
    """Trials trained at once."""
    backend: str | None = None
    """serial (in this process) or process (one process per running trial); default: serial for
    --parallel 1, process above."""
    storage: str | None = None
    """Optuna storage URL, e.g. sqlite:///study.db (default: sqlite in the tune directory)."""
    study_name: str | None = None
    """The study's name in the storage (default: the tune directory's name)."""
    directory: str | None = None
    """Tune directory; default tuning/<env>__<algo>, so that the same command continues the same study."""

    def __post_init__(self) -> None:
        self.search = {name: Dimension.parse(name, spec) for name, spec in self.search.items()}

    def resolved_interval(self) -> int:
        if self.interval is not None:
            return min(self.interval, self.base.total_steps)
        return max(1, self.base.total_steps // 5)

    def resolved_backend(self) -> str:
        return self.backend or ("serial" if self.parallel == 1 else "process")

    def space(self) -> dict[str, Dimension]:
        return self.search or default_search(self.base)

    def validate(self) -> None:
        self.base.validate()
        _check_count("trials", self.trials, "an integer >= 1 (the trials of the study)")
        _check_count("parallel", self.parallel, "an integer >= 1 (trials trained at once)")
        if self.interval is not None:
            _check_count("interval", self.interval, "env steps >= 1 between reports to the pruner")
        _check_name("sampler", self.sampler, SAMPLERS)
        _check_name("pruner", self.pruner, PRUNERS)
        if self.backend is not None:
            _check_name("backend", self.backend, BACKENDS)
        space = self.space()
        for name, dimension in space.items():
            try:
                dimension.validate(name, self.base)
            except ConfigError as error:
                if self.search:
                    raise
                raise ConfigError(
                    f"the default search space of {self.base.algo} does not fit this config: {error} "
                    "Give the space with --search NAME=KIND:ARGS (see docs/tuning.md)."
                ) from None

    def definition(self) -> dict[str, Any]:
        """What makes a study: the same definition continues it, another one is another study."""
        base = self.base.to_dict()
        base.pop("run_dir")
        return {
            "base": base,
            "search": {name: dimension.text() for name, dimension in self.space().items()},
            "interval": self.resolved_interval(),
        }


def _check_count(name: str, value: Any, expected: str) -> None:
    if not is_int(value) or value < 1:
        raise ConfigError(f"{name} = {value!r} is invalid: expected {expected}. Fix it with --{name}.")


def _check_name(name: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        close = difflib.get_close_matches(str(value), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown {name} {value!r}.{hint} Choose one of: {', '.join(valid)} (--{name}).")


# -- results and errors -----------------------------------------------------------------------------
@dataclass
class TuneResult:
    directory: Path
    study: Any
    """The optuna.Study (``study.trials_dataframe()``, Optuna's plots, ...)."""
    best_trial: int
    best_value: float
    best_params: dict[str, Any]
    """The best trial's hyperparameters, as the config takes them."""
    best_config: Path
    """best.yaml: the best trial's config (``phalanx train ALGO ENV --config best.yaml``)."""
    best_run_dir: Path | None
    """The best trial's run directory (None when another tune directory ran it on a shared storage)."""

    def table(self) -> Table:
        """Every trial of the study: number, state, value, steps, seconds and the searched values."""
        return trials_table(self.study, list(self.best_params))


def check_within_budget(config: TrainConfig) -> None:
    """A ConfigError where one rollout of an on-policy trial (horizon x num_envs env steps, which it
    collects whole) is more than its budget: the trial would train past the budget every trial shares."""
    if not isinstance(config.hyperparameters, ActorCriticConfig):  # PPO, A2C: rollouts of a horizon
        return
    horizon = config.hyperparameters.horizon
    rollout = horizon * config.num_envs
    if rollout > config.total_steps:
        raise ConfigError(
            f"one rollout, horizon {horizon} x num_envs {config.num_envs} = {rollout:,} env steps, is more "
            f"than the budget of {config.total_steps:,}: the trial would train "
            f"{rollout - config.total_steps:,} steps past it. Lower the horizon's search range or num_envs, "
            "or raise --total-steps."
        )


class TuneInterrupted(PhalanxError):
    """Ctrl+C: the running trials saved checkpoints; the same command continues the study."""

    def __init__(self, directory: Path, running: int) -> None:
        super().__init__(
            f"tuning interrupted; {running} running trial(s) saved a checkpoint. Rerun the same command "
            f"(the same --directory {directory}, --storage and --study-name) to continue the study: the "
            "finished trials are kept and the running ones go on from their checkpoints."
        )
        self.directory = directory


class TuneFailed(PhalanxError):
    """The study has no completed trial to report (every one failed or was pruned)."""


def import_optuna() -> Any:
    return import_optional(
        "optuna",
        ConfigError,
        "phalanx tune needs Optuna, which is an optional extra: pip install 'phalanx[tune]'.",
        packages=("optuna",),
    )


# -- the search -------------------------------------------------------------------------------------
@dataclass
class _Running:
    trial: Any
    """The optuna.trial.Trial."""
    name: str
    config: TrainConfig
    target: int
    """The step the chunk under way trains to (the step its score is reported at)."""


class Tuning:
    """A study run on a backend: asks Optuna for trials, trains them in chunks, reports and prunes."""

    def __init__(
        self,
        config: TuneConfig,
        sampler: Any = None,
        pruner: Any = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.optuna = import_optuna()
        config.validate()
        self.config = config
        self.space = config.space()
        self.interval = config.resolved_interval()
        self.say = say or (lambda message: None)
        base = config.base
        self.directory = Path(
            config.directory or Path("tuning") / f"{base.env.replace('/', '-')}__{base.algo}"
        )
        self.storage = config.storage or f"sqlite:///{(self.directory / 'study.db').resolve()}"
        self.study_name = config.study_name or self.directory.name
        self.sampler, self.pruner = sampler, pruner
        self.running: dict[str, _Running] = {}
        self.failures_in_a_row = 0

    # -- the study ------------------------------------------------------------------------------
    def open_study(self) -> Any:
        """Create the study, or load it and check that it is the same search."""
        optuna = self.optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            study = self._create_or_load_study()
        except Exception as error:  # noqa: BLE001 - whatever the storage's driver raises
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(
                f"cannot open the Optuna storage {self.storage!r}: {type(error).__name__}: {first}. Give "
                "a URL Optuna can open (sqlite:///path/study.db, postgresql://..., mysql://...; an RDB URL "
                "needs its driver installed), or leave --storage out for a SQLite file in the tune directory."
            ) from None
        if len(study.directions) != 1 or study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise ConfigError(
                f"study {self.study_name!r} in {self.storage} is not a single-objective maximization "
                "(phalanx tune maximizes the evaluation return); choose another --study-name."
            )
        definition = self.config.definition()
        stored = study.user_attrs.get("phalanx")
        if stored is None and study.trials:
            raise ConfigError(
                f"study {self.study_name!r} in {self.storage} holds trials that phalanx tune did not make; "
                "choose another --study-name."
            )
        if stored is None:
            study.set_user_attr("phalanx", definition)
        elif stored != definition:
            raise ConfigError(
                f"study {self.study_name!r} in {self.storage} is another search: "
                f"{_differences(stored, definition)}. "
                "Rerun with the settings it was made with to continue it, or start a new study with another "
                "--directory (or --study-name)."
            )
        ended = len(self.ended(study))
        # A sampler of its own seed for each session, derived from the base seed and the trials so far:
        # a resumed study does not draw again the values of its first trials.
        seed = int(np.random.SeedSequence(self.config.base.seed, spawn_key=(ended,)).generate_state(1)[0])
        study.sampler = self.sampler or (
            optuna.samplers.TPESampler(seed=seed)
            if self.config.sampler == "tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        )
        study.pruner = self.pruner or (
            optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=self.config.base.total_steps // 3)
            if self.config.pruner == "median"
            else optuna.pruners.NopPruner()
        )
        return study

    def _create_or_load_study(self, attempts: int = 4) -> Any:
        """optuna.create_study, again after a pause when it fails: two tune commands sharing one new
        storage (or a reader of it) can race to create its tables, and the loser's error ("table
        studies already exists", "UNIQUE constraint failed") is gone on the second try."""
        for attempt in range(attempts):
            try:
                return self.optuna.create_study(
                    storage=self.storage,
                    study_name=self.study_name,
                    direction="maximize",
                    load_if_exists=True,
                )
            except Exception:  # noqa: BLE001 - the driver's errors; the last one is raised
                if attempt == attempts - 1:
                    raise
                time.sleep(0.25 * (attempt + 1))
        raise AssertionError("unreachable")

    def ended(self, study: Any) -> list[Any]:
        states = tuple(getattr(self.optuna.trial.TrialState, state) for state in TRIAL_STATES_ENDED)
        return study.get_trials(deepcopy=False, states=states)

    def orphans(self, study: Any) -> list[Any]:
        """Trials left running by an interrupted or killed session of this directory (their run
        directories are here): they go on from their checkpoints."""
        running = study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,))
        return [t for t in running if self.trial_dir(t.number).is_dir()]

    def trial_dir(self, number: int) -> Path:
        """Absolute: the run directory every process reaches, whatever its working directory."""
        return self.directory.resolve() / "trials" / f"trial_{number:04d}"

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            study = self.open_study()
            self.save_definition()
            backend = self.make_backend()
            orphans = self.orphans(study)
            if orphans:
                self.say(f"continuing {len(orphans)} trial(s) from their checkpoints")
            elif len(self.ended(study)) >= self.config.trials:
                self.say(
                    f"nothing to do: the study in {self.directory} has its {self.config.trials} trials; "
                    f"pass --trials N (N > {self.config.trials}) to run more"
                )
            try:
                self.loop(study, backend, orphans)
            except KeyboardInterrupt:
                backend.close()  # a trial in flight saves its checkpoint as it ends
                self.write_table(study)
                raise TuneInterrupted(self.directory, len(self.running)) from None
            finally:
                backend.close()
            self.write_table(study)
            return self.result(study)

    def make_backend(self) -> Any:
        if self.config.resolved_backend() == "serial":
            self.envs: dict[str, Any] = {}
            return SerialBackend()
        self.envs = picklable_factory(
            self.config.base.env,
            "the process backend trains each trial in a process of its own",
            "use --backend serial",
        )
        return ProcessBackend(max(1, available_cores() // self.config.parallel))

    def loop(self, study: Any, backend: Any, orphans: list[Any]) -> None:
        while True:
            while len(self.running) < self.config.parallel:
                if orphans:
                    frozen = orphans.pop(0)
                    self.start(backend, self.optuna.trial.Trial(study, frozen._trial_id), frozen)
                elif len(self.ended(study)) + len(self.running) < self.config.trials:
                    self.start(backend, study.ask(), None)
                else:
                    break
            if not self.running:
                return
            for report in backend.wait(timeout=1.0):
                self.handle(study, backend, report)

    def start(self, backend: Any, trial: Any, frozen: Any) -> None:
        """Begin a trial (``frozen``: a trial that ran before, continued from its last reported step)."""
        name = f"trial_{trial.number:04d}"
        run_dir = self.trial_dir(trial.number)
        run_dir.mkdir(parents=True, exist_ok=True)  # marks the trial as this directory's (orphans())
        if frozen is None:
            stored = {name_: dimension.suggest(trial, name_) for name_, dimension in self.space.items()}
            trial.set_user_attr("run_dir", str(run_dir))
            reached = 0
        else:
            stored = frozen.params
            reached = max(frozen.intermediate_values, default=0)
        base = self.config.base
        try:
            values = {n: self.space[n].decode(n, base, stored[n]) for n in self.space}
            config = with_hyperparameters(base, values, run_dir=str(run_dir), eval_process=False)
            config.validate()
            check_within_budget(config)
        except ConfigError as error:  # a combination of values that no config takes
            self.fail(trial, f"its values make an invalid config: {error}")
            return
        running = _Running(trial, name, config, self.next_target(reached))
        self.running[name] = running
        self.submit(backend, running)
        self.say(
            f"trial {trial.number}: {_format_values(values)}"
            + (f" (continued at {reached:,} steps)" if frozen else "")
        )

    def submit(self, backend: Any, running: _Running) -> None:
        backend.submit(Task(running.name, running.config.to_dict(), running.target, envs=self.envs))

    def handle(self, study: Any, backend: Any, report: Report) -> None:
        running = self.running.get(report.member)
        if running is None:
            return
        if report.interrupted:
            raise KeyboardInterrupt
        trial, number = running.trial, running.trial.number
        if report.error is not None:
            del self.running[report.member]
            backend.stop(report.member)
            self.fail(trial, report.error.strip().splitlines()[-1])
            return
        if report.score is None or not math.isfinite(report.score):
            del self.running[report.member]
            backend.stop(report.member)
            self.fail(trial, f"its evaluation return is {report.score} at {report.steps:,} steps")
            return
        self.failures_in_a_row = 0
        trial.report(report.score, running.target)
        trial.set_user_attr("steps", report.steps)
        total = self.config.base.total_steps
        if report.steps >= total or report.steps < running.target:  # the budget, or stop_return
            del self.running[report.member]
            backend.stop(report.member)
            study.tell(trial, report.score)
            best = study.best_trial
            self.say(
                f"trial {number}: complete, value {report.score:.2f} at {report.steps:,} steps "
                f"(best: trial {best.number}, {best.value:.2f})"
            )
            self.write_table(study)
            if best.number == number:
                self.write_best(study)
            return
        if trial.should_prune():
            del self.running[report.member]
            backend.stop(report.member)
            study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
            self.say(f"trial {number}: pruned at {running.target:,} steps, score {report.score:.2f}")
            self.write_table(study)
            return
        self.say(f"trial {number}: score {report.score:.2f} at {report.steps:,} steps")
        running.target = self.next_target(report.steps)
        self.submit(backend, running)

    def next_target(self, steps: int) -> int:
        """The next chunk's step target: the first multiple of the interval past ``steps`` (a chunk that
        overshot its target, a rollout being larger than the interval, skips the targets it passed), at
        most the budget. Every trial reports at these same steps, so the pruner compares like with like."""
        return min((steps // self.interval + 1) * self.interval, self.config.base.total_steps)

    def fail(self, trial: Any, why: str) -> None:
        trial.set_user_attr("error", why)
        trial.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        self.say(f"trial {trial.number}: failed: {why}")
        self.write_table(trial.study)
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            raise TuneFailed(
                f"{self.failures_in_a_row} trials in a row failed; the last one: {why}. The study stops: "
                f"the cause is likely not the searched values. Every trial's error is in "
                f"{self.directory / 'trials.csv'}; fix the cause and rerun the command to continue the study."
            )

    # -- what it writes -------------------------------------------------------------------------
    def save_definition(self) -> None:
        resolved = {
            **self.config.definition(),
            "trials": self.config.trials,
            "sampler": self.config.sampler if self.sampler is None else type(self.sampler).__name__,
            "pruner": self.config.pruner if self.pruner is None else type(self.pruner).__name__,
            "parallel": self.config.parallel,
            "backend": self.config.resolved_backend(),
            "storage": self.storage,
            "study_name": self.study_name,
        }
        write_text_atomic(self.directory / "tune.yaml", yaml.safe_dump(resolved, sort_keys=False))

    def write_table(self, study: Any) -> None:
        rows = trial_rows(study, list(self.space))
        if not rows:
            return
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(self.directory / "trials.csv", text.getvalue())

    def best_config(self, study: Any) -> TrainConfig:
        best = study.best_trial
        base = self.config.base
        values = {name: self.space[name].decode(name, base, best.params[name]) for name in self.space}
        return with_hyperparameters(base, values, run_dir=None)

    def write_best(self, study: Any) -> Path:
        best = study.best_trial
        data = self.best_config(study).to_dict()
        data.pop("run_dir")
        header = (
            f"# phalanx tune: the best trial ({best.number}, value {best.value:.4g}) of study "
            f"{self.study_name!r}, {self.storage}.\n"
            f"# Train with: phalanx train {data['algo']} {data['env']} --config best.yaml "
            "[--total-steps N ...]\n"
        )
        path = self.directory / "best.yaml"
        write_text_atomic(path, header + yaml.safe_dump(data, sort_keys=False))
        return path

    def result(self, study: Any) -> TuneResult:
        complete = study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.COMPLETE,))
        if not complete:
            states = [trial.state.name.lower() for trial in study.get_trials(deepcopy=False)]
            counts = ", ".join(f"{states.count(state)} {state}" for state in sorted(set(states)))
            raise TuneFailed(
                f"no trial of study {self.study_name!r} completed ({counts}), "
                f"so there is no best config. See {self.directory / 'trials.csv'}; raise --trials to go on, "
                "or loosen the pruner (--pruner none)."
            )
        best = study.best_trial
        run_dir = Path(best.user_attrs["run_dir"]) if "run_dir" in best.user_attrs else None
        best_params = {
            name: self.space[name].decode(name, self.config.base, best.params[name]) for name in self.space
        }
        return TuneResult(
            directory=self.directory,
            study=study,
            best_trial=best.number,
            best_value=best.value,
            best_params=best_params,
            best_config=self.write_best(study),
            best_run_dir=run_dir if run_dir is not None and run_dir.is_dir() else None,
        )


def trial_rows(study: Any, names: list[str]) -> list[dict[str, Any]]:
    """Every trial of ``study``: number, state, value, last step, seconds, the values of ``names``, its
    run directory and, for a failed one, why."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        end = trial.datetime_complete
        seconds = (end - trial.datetime_start).total_seconds() if end and trial.datetime_start else None
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name.lower(),
                "value": trial.value,
                "steps": trial.user_attrs.get("steps"),
                "seconds": None if seconds is None else round(seconds, 1),
                **{name: trial.params.get(name) for name in names},
                "run_dir": trial.user_attrs.get("run_dir"),
                "error": trial.user_attrs.get("error"),
            }
        )
    return rows


def trials_table(study: Any, names: list[str]) -> Table:
    """The trials as a table (the best one in bold): number, state, value, steps, seconds, and the values
    searched as ``name=value`` in one column, which wraps, so that the table reads at any width."""
    rows = trial_rows(study, names)
    table = Table(title=f"study {study.study_name} ({len(rows)} trials)")
    columns = ["trial", "state", "value", "steps", "seconds"]
    for name in columns:
        table.add_column(name, justify="left" if name == "state" else "right", no_wrap=True)
    table.add_column("hyperparameters", overflow="fold")
    complete = [row for row in rows if row["state"] == "complete"]
    best = max(complete, key=lambda row: row["value"])["trial"] if complete else None
    for row in rows:
        table.add_row(
            *(_cell(row[name]) for name in columns),
            _format_values({name: row[name] for name in names}),
            style="bold green" if row["trial"] == best else None,
        )
    return table


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _format_values(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={_cell(value)}" for name, value in values.items() if value is not None)


def _differences(stored: dict[str, Any], definition: dict[str, Any]) -> str:
    """The settings in which two study definitions differ, e.g. ``base.total_steps 4096 -> 8192``."""
    found = []
    for key in sorted(set(stored) | set(definition)):
        old, new = stored.get(key), definition.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            for name in sorted(set(old) | set(new)):
                if old.get(name) != new.get(name):
                    found.append(f"{key}.{name} {old.get(name)!r} -> {new.get(name)!r}")
        elif old != new:
            found.append(f"{key} {old!r} -> {new!r}")
    return "; ".join(found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")


@contextlib.contextmanager
def _locked(directory: Path):
    """Hold the tune directory for this session: a second `phalanx tune` on it is refused (it would train
    the same trials twice)."""
    if os.name != "posix":  # no advisory locks to take: the user keeps one session per directory
        yield
        return
    import fcntl

    with open(directory / "tune.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another phalanx tune is running in {directory}; wait for it to end, or give this one "
                "another --directory (several directories can share one --storage and --study-name)."
            ) from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- the entry point --------------------------------------------------------------------------------
def tune(
    config: TrainConfig,
    trials: int,
    *,
    search: Mapping[str, str | Dimension] | None = None,
    sampler: Any = "tpe",
    pruner: Any = "median",
    interval: int | None = None,
    parallel: int = 1,
    backend: str | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    directory: str | Path | None = None,
    show_progress: bool = True,
) -> TuneResult:
    """Search ``config``'s hyperparameters with Optuna; returns the best trial and writes best.yaml.

    ``search`` maps hyperparameter names to ``KIND:ARGS`` (``{"learning_rate": "log:1e-5,1e-3"}``; None:
    the algorithm's default space). ``sampler`` and ``pruner`` are names (tpe, random; median, none) or
    Optuna objects (any ``optuna.samplers.BaseSampler`` / ``optuna.pruners.BasePruner``). The same call
    with the same directory (or storage and study name) continues the study.
    """
    tune_config = TuneConfig(
        base=config,
        trials=trials,
        search=dict(search or {}),
        sampler=sampler if isinstance(sampler, str) else "tpe",
        pruner=pruner if isinstance(pruner, str) else "median",
        interval=interval,
        parallel=parallel,
        backend=backend,
        storage=storage,
        study_name=study_name,
        directory=None if directory is None else str(directory),
    )
    return run_tuning(
        tune_config,
        sampler=None if isinstance(sampler, str) else sampler,
        pruner=None if isinstance(pruner, str) else pruner,
        show_progress=show_progress,
    )


def run_tuning(
    config: TuneConfig, sampler: Any = None, pruner: Any = None, show_progress: bool = True
) -> TuneResult:
    """Run (or continue) the study ``config`` describes; ``sampler``/``pruner``: Optuna objects that
    replace the named ones."""
    return Tuning(config, sampler, pruner, _say(show_progress)).run()


def _say(show_progress: bool) -> Callable[[str], None] | None:
    if not show_progress:
        return None
    console = Console(stderr=True)
    return lambda message: console.print(escape(message), highlight=False, soft_wrap=True)
