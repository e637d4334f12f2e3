"""The algorithm table: each algorithm's name -> its class. The class says the rest.

An algorithm class declares what it is (:class:`phalanx.algos.base.Algorithm`): its ``name``, its
``config_class``, ``on_policy``, the ``action_spaces`` it acts in and the ``observations`` it reads,
``multi_agent``, its ``recurrent_variant`` and ``vectorized_population`` (None where it has none), the
``trainer`` that runs it and the ``agent`` that deploys it. Everything here reads those.

phalanx's own algorithms are written ``"module:Class"`` and imported on first use, so that this table sits
at the bottom of the layers (it imports nothing of phalanx but errors) and ``phalanx --help`` imports no
learner. A user's algorithm is a module that calls :func:`register_algorithm` on its class (or decorates
the class with it), imported with ``--import MODULE`` (``TrainConfig.imports``; see docs/architecture.md,
"Adding an algorithm").
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Protocol

from phalanx.errors import ConfigError


class AlgorithmClass(Protocol):
    """What this table reads of an algorithm class: the declarations of
    :class:`phalanx.algos.base.Algorithm` (the table sits below the algorithms, so it names them by
    this shape, not by import). Calling it builds the algorithm."""

    name: str
    config_class: type
    on_policy: bool
    action_spaces: tuple[type, ...]
    observations: tuple[str, ...]
    multi_agent: bool
    recurrent_variant: str | None
    vectorized_population: str | None
    trainer: str
    agent: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def check_spaces(self, observation_space: Any, action_space: Any) -> None: ...

    def side_by_side(self, agents: list[Any]) -> Any: ...


BUILTIN: dict[str, str] = {
    "ppo": "phalanx.algos.ppo:PPO",
    "a2c": "phalanx.algos.ppo:A2C",
    "dqn": "phalanx.algos.dqn:DQN",
    "double-dqn": "phalanx.algos.dqn:DoubleDQN",
    "dueling-dqn": "phalanx.algos.dqn:DuelingDQN",
    "d3qn": "phalanx.algos.dqn:D3QN",
    "pqn": "phalanx.algos.pqn:PQN",
    "ddpg": "phalanx.algos.ddpg:DDPG",
    "td3": "phalanx.algos.td3:TD3",
    "sac": "phalanx.algos.sac:SAC",
    "redq": "phalanx.algos.sac:REDQ",
    "mappo": "phalanx.marl.mappo:MAPPO",
    "ippo": "phalanx.marl.mappo:IPPO",
    "qmix": "phalanx.marl.qmix:QMIX",
    "vdn": "phalanx.marl.qmix:VDN",
    "maddpg": "phalanx.marl.maddpg:MADDPG",
    "matd3": "phalanx.marl.maddpg:MATD3",
}
"""phalanx's own algorithms: name -> ``"module:Class"``."""

ALGORITHMS: dict[str, str | type] = dict(BUILTIN)
"""Every algorithm by the name configs, presets and the CLI use (lower case): phalanx's own, then those
registered with :func:`register_algorithm`."""


def register_algorithm(algorithm: type) -> type:
    """Add ``algorithm`` (an ``Algorithm`` subclass) to the table under its ``name``, so that ``phalanx
    train NAME ENV --import MODULE`` and ``make_config(NAME, env, imports=[MODULE])`` train it. Returns the
    class, so that it can decorate the class statement. Registering the same class again (its module
    imported twice) is a no-op; a name phalanx or another class already has is a ConfigError."""
    name = getattr(algorithm, "name", None)
    declared = hasattr(algorithm, "config_class") and hasattr(algorithm, "on_policy")
    if not (isinstance(name, str) and name == name.lower() and name.strip() == name != "" and declared):
        raise ConfigError(
            f"register_algorithm({algorithm!r}): an algorithm class declares its `name` (lower case, e.g. "
            "'reinforce'), its `config_class` and `on_policy`. Subclass phalanx.algos.base.Algorithm; see "
            "docs/architecture.md, 'Adding an algorithm'."
        )
    if name in BUILTIN:
        raise ConfigError(
            f"register_algorithm: {name!r} is phalanx's own algorithm ({BUILTIN[name]}); give "
            f"{algorithm.__qualname__} another name."
        )
    current = ALGORITHMS.get(name)
    if current is not None and _qualified(current) != _qualified(algorithm):
        raise ConfigError(
            f"register_algorithm: {name!r} is already {_qualified(current)}; give {_qualified(algorithm)} "
            "another name."
        )
    ALGORITHMS[name] = algorithm
    return algorithm


def _qualified(algorithm: str | type) -> str:
    if isinstance(algorithm, str):
        return algorithm
    return f"{algorithm.__module__}:{algorithm.__qualname__}"


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def canonical_name(name: str) -> str:
    """``name`` as the table spells it (any case is accepted); an unknown name gets the closest names and
    the full list."""
    key = name.lower() if isinstance(name, str) else name
    if key in ALGORITHMS:
        return key
    close = difflib.get_close_matches(str(key), algorithm_names(), n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"unknown algorithm {name!r}.{hint} Available: {', '.join(algorithm_names())}. (An algorithm of "
        "your own: the module that registers it goes in --import MODULE.)"
    )


def resolve(target: str | type) -> Any:
    """The object named by ``"module:attribute"``, importing its module (a class is itself)."""
    if not isinstance(target, str):
        return target
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def get_algorithm(name: str) -> AlgorithmClass:
    """The ``Algorithm`` class of ``name``."""
    return resolve(ALGORITHMS[canonical_name(name)])


def config_class(name: str) -> type:
    """The hyperparameters' dataclass of ``name`` (an ``AlgoConfig``)."""
    return get_algorithm(name).config_class


def algorithm_class(name: str, hyperparameters: Any) -> AlgorithmClass:
    """The ``Algorithm`` class a run of ``name`` with these hyperparameters builds: the algorithm's own,
    or its ``recurrent_variant`` where the hyperparameters ask for a recurrent policy (the config of an
    algorithm with a recurrent variant has the ``recurrent`` field). Every place that builds an algorithm
    from a config (the trainer, the evaluators, ``load_agent``) asks here."""
    algorithm = get_algorithm(name)
    if algorithm.recurrent_variant is not None and hyperparameters.recurrent is not None:
        return resolve(algorithm.recurrent_variant)
    return algorithm


def has_recurrent_policy(name: str) -> bool:
    """Whether ``name`` has a recurrent variant (``recurrent: lstm|gru`` builds it)."""
    return get_algorithm(name).recurrent_variant is not None


RECURRENT_SETTINGS = ("recurrent", "recurrent_hidden_size", "sequence_length", "burn_in")
"""The hyperparameters of a recurrent policy (of the algorithms with a ``recurrent_variant``)."""


def no_recurrent_policy(name: str) -> ConfigError:
    """The error of asking ``name``, which has no recurrent variant, for a recurrent policy."""
    have = " and ".join(key for key in ALGORITHMS if has_recurrent_policy(key))
    return ConfigError(
        f"{name} has no recurrent policy: recurrent policies (--recurrent lstm|gru and their settings "
        f"{', '.join(RECURRENT_SETTINGS[1:])}) exist for {have}. Use one of those with --recurrent lstm, "
        f"or drop the recurrent settings for {name}."
    )


def algorithms_reading(kind: str, action_space: Any = None) -> list[str]:
    """The single-agent algorithms that read observations of ``kind`` (flat, image, dict: their
    ``Algorithm.observations``) and, if ``action_space`` is given, act in it (their ``action_spaces``)."""
    names = []
    for name in algorithm_names():
        algorithm = get_algorithm(name)
        if algorithm.multi_agent or kind not in algorithm.observations:
            continue
        if action_space is None or isinstance(action_space, algorithm.action_spaces):
            names.append(name)
    return names


def trainer_class(name: str) -> Any:
    """The trainer class that runs ``name`` (its ``trainer``; Any: imported by name, from a layer above)."""
    return resolve(get_algorithm(name).trainer)


def agent_class(name: str) -> Any:
    """The agent class ``phalanx.load_agent`` gives for runs of ``name`` (its ``agent``; Any: imported by
    name, from a layer above)."""
    return resolve(get_algorithm(name).agent)


def vectorized_population(name: str) -> Any:
    """The vectorized population class of ``name``; a ConfigError names the algorithms that have one (Any:
    imported by name, from a layer above)."""
    target = get_algorithm(name).vectorized_population
    if target is None:
        have = ", ".join(key for key in ALGORITHMS if get_algorithm(key).vectorized_population is not None)
        raise ConfigError(
            f"backend 'vectorized' trains {have} members as one batched network, but algo is {name!r}. "
            f"Use one of those algorithms, or the process backend for {name}."
        )
    return resolve(target)
