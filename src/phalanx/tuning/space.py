"""The search space of a study: each searched hyperparameter's :class:`Dimension` (``KIND:ARGS``), checked
against the base config, drawn by Optuna, and decoded back to a config value; and the default space of
each algorithm when none is given (:data:`DEFAULT_SEARCH`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from phalanx.algos.base import OffPolicyConfig
from phalanx.algos.ddpg import DDPGConfig, EnsembleCriticConfig
from phalanx.algos.dqn import DQNConfig
from phalanx.algos.ppo import A2CConfig, ActorCriticConfig, PPOConfig
from phalanx.algos.pqn import PQNConfig
from phalanx.config import TrainConfig, check_hyperparameter_name, coerce, is_int
from phalanx.config.specs import parse_kind_args
from phalanx.errors import ConfigError
from phalanx.marl.qmix import ValueDecompositionConfig

KINDS = {
    "uniform": "uniform:LOW,HIGH (a float drawn uniformly), e.g. gamma=uniform:0.9,0.9999",
    "log": "log:LOW,HIGH (a float drawn log-uniformly, LOW > 0), e.g. learning_rate=log:1e-5,1e-3",
    "int": "int:LOW,HIGH[,STEP] (an integer, both ends included), e.g. epochs=int:1,10",
    "int_log": "int_log:LOW,HIGH (an integer drawn log-uniformly, LOW >= 1), e.g. horizon=int_log:16,256",
    "choice": "choice:A,B,... (one of the values), e.g. activation=choice:tanh,relu",
}
"""The kinds of a search dimension, ``NAME=KIND:ARGS``, and how each is written."""


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
        kind, arguments = parse_kind_args(spec, KINDS, where=f"--search {name}={spec}")
        return cls(kind, arguments)

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
    PQNConfig: {
        "learning_rate": "log:1e-5,1e-2",
        "gamma": GAMMAS,
        "q_lambda": "choice:0.0,0.5,0.65,0.8,0.95",
        "epochs": "int:1,8",
        "exploration_final": "uniform:0.0,0.2",
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


def check_within_budget(config: TrainConfig) -> None:
    """A ConfigError where one rollout of an on-policy trial (horizon x num_envs env steps, which it
    collects whole) is more than its budget: the trial would train past the budget every trial shares."""
    if not isinstance(config.hyperparameters, ActorCriticConfig | PQNConfig):  # rollouts of a horizon
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
