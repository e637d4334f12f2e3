"""The algorithm table: a name -> where its config, algorithm, trainer and agent live.

Each part is named as ``"module:attribute"`` and imported on first use, so that this table sits at the
bottom of the layers (it imports nothing of phalanx but errors) while naming classes of every layer:
``config.py`` checks a config against it, the runtime builds the trainer and the algorithm it names,
``load_agent`` the agent. Adding an algorithm is one row here.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any

from phalanx.errors import ConfigError

_SINGLE_AGENT = ("phalanx.train.trainer:Trainer", "phalanx.agent:Agent")
_MULTI_AGENT = ("phalanx.marl.trainer:MultiAgentTrainer", "phalanx.marl.agent:MultiAgentAgent")


@dataclass(frozen=True)
class Registration:
    """Where one algorithm's parts live, each ``"module:attribute"``."""

    config: str
    """Its hyperparameters' dataclass (an ``AlgoConfig``)."""
    algorithm: str
    """Its ``Algorithm`` class."""
    trainer: str
    """The trainer class that runs it."""
    agent: str
    """The deployed agent class ``phalanx.load_agent`` gives for its runs."""
    population: str | None = None
    """Its vectorized population (P members as one batched run: ``phalanx population run --backend
    vectorized``), or None where it has none."""
    recurrent: str | None = None
    """The ``Algorithm`` class a run builds when its hyperparameters ask for a recurrent policy
    (``recurrent: lstm``), or None where the algorithm has no recurrent policy."""


def _row(
    module: str,
    algorithm: str,
    runtime: tuple[str, str],
    population: str | None = None,
    recurrent: str | None = None,
) -> Registration:
    trainer, agent = runtime
    return Registration(
        f"{module}:{algorithm}Config", f"{module}:{algorithm}", trainer, agent, population, recurrent
    )


_VECTORIZED = "phalanx.population.vectorized"
_VECTORIZED_OFF_POLICY = "phalanx.population.vectorized_off_policy"


ALGORITHMS: dict[str, Registration] = {
    "ppo": _row(
        "phalanx.algos.ppo",
        "PPO",
        _SINGLE_AGENT,
        f"{_VECTORIZED}:VectorizedPPO",
        recurrent="phalanx.algos.recurrent:RecurrentPPO",
    ),
    "a2c": _row(
        "phalanx.algos.ppo",
        "A2C",
        _SINGLE_AGENT,
        recurrent="phalanx.algos.recurrent:RecurrentA2C",
    ),
    "dqn": _row("phalanx.algos.dqn", "DQN", _SINGLE_AGENT),
    "double-dqn": _row("phalanx.algos.dqn", "DoubleDQN", _SINGLE_AGENT),
    "dueling-dqn": _row("phalanx.algos.dqn", "DuelingDQN", _SINGLE_AGENT),
    "d3qn": _row("phalanx.algos.dqn", "D3QN", _SINGLE_AGENT),
    "ddpg": _row("phalanx.algos.ddpg", "DDPG", _SINGLE_AGENT),
    "td3": _row(
        "phalanx.algos.td3",
        "TD3",
        _SINGLE_AGENT,
        f"{_VECTORIZED_OFF_POLICY}:VectorizedTD3",
    ),
    "sac": _row(
        "phalanx.algos.sac",
        "SAC",
        _SINGLE_AGENT,
        f"{_VECTORIZED_OFF_POLICY}:VectorizedSAC",
    ),
    "redq": _row("phalanx.algos.sac", "REDQ", _SINGLE_AGENT),
    "mappo": _row("phalanx.marl.mappo", "MAPPO", _MULTI_AGENT),
    "ippo": _row("phalanx.marl.mappo", "IPPO", _MULTI_AGENT),
    "qmix": _row("phalanx.marl.qmix", "QMIX", _MULTI_AGENT),
    "vdn": _row("phalanx.marl.qmix", "VDN", _MULTI_AGENT),
    "maddpg": _row("phalanx.marl.maddpg", "MADDPG", _MULTI_AGENT),
    "matd3": _row("phalanx.marl.maddpg", "MATD3", _MULTI_AGENT),
}
"""Every algorithm by the name configs, presets and the CLI use (lower case)."""


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
    raise ConfigError(f"unknown algorithm {name!r}.{hint} Available: {', '.join(algorithm_names())}.")


def registration(name: str) -> Registration:
    return ALGORITHMS[canonical_name(name)]


def resolve(target: str) -> Any:
    """The object named by ``"module:attribute"``, importing its module."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def config_class(name: str) -> type:
    return resolve(registration(name).config)


def get_algorithm(name: str) -> type:
    """The ``Algorithm`` class of ``name``."""
    return resolve(registration(name).algorithm)


def algorithm_class(name: str, hyperparameters: Any) -> type:
    """The ``Algorithm`` class a run of ``name`` with these hyperparameters builds: the algorithm's own,
    or its recurrent variant where the hyperparameters ask for a recurrent policy (the config of an
    algorithm with a recurrent variant has the ``recurrent`` field). Every place that builds an algorithm
    from a config (the trainer, the evaluators, ``load_agent``) asks here."""
    row = registration(name)
    if row.recurrent is not None and hyperparameters.recurrent is not None:
        return resolve(row.recurrent)
    return resolve(row.algorithm)


RECURRENT_SETTINGS = ("recurrent", "recurrent_hidden_size", "sequence_length", "burn_in")
"""The hyperparameters of a recurrent policy (of the algorithms with a ``recurrent`` variant)."""


def no_recurrent_policy(name: str) -> ConfigError:
    """The error of asking ``name``, which has no recurrent variant, for a recurrent policy."""
    have = " and ".join(key for key, row in ALGORITHMS.items() if row.recurrent is not None)
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


def trainer_class(name: str) -> type:
    return resolve(registration(name).trainer)


def agent_class(name: str) -> type:
    return resolve(registration(name).agent)


def vectorized_population(name: str) -> type:
    """The vectorized population class of ``name``; a ConfigError names the algorithms that have one."""
    target = registration(name).population
    if target is None:
        have = ", ".join(key for key, row in ALGORITHMS.items() if row.population is not None)
        raise ConfigError(
            f"backend 'vectorized' trains {have} members as one batched network, but algo is {name!r}. "
            f"Use one of those algorithms, or the process backend for {name}."
        )
    return resolve(target)
