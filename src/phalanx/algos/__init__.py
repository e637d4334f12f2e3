"""Learning rules. Each file holds one family, readable top to bottom."""

from __future__ import annotations

import difflib

from phalanx.algos.base import Algorithm
from phalanx.algos.ddpg import DDPG
from phalanx.algos.dqn import D3QN, DQN, DoubleDQN, DuelingDQN
from phalanx.algos.ppo import A2C, PPO
from phalanx.algos.sac import REDQ, SAC
from phalanx.algos.td3 import TD3
from phalanx.errors import ConfigError

ALGORITHMS: dict[str, type[Algorithm]] = {
    algorithm.name: algorithm
    for algorithm in (PPO, A2C, DQN, DoubleDQN, DuelingDQN, D3QN, DDPG, TD3, SAC, REDQ)
}


def register_algorithm(algorithm: type[Algorithm]) -> type[Algorithm]:
    """Make ``algorithm`` known by its name to configs, the CLI and presets (the multi-agent algorithms
    of ``phalanx.marl`` register themselves this way); returns it, so it can decorate the class."""
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered under ``name``; unknown names get the closest suggestions."""
    key = name.lower() if isinstance(name, str) else name
    if key in ALGORITHMS:
        return ALGORITHMS[key]
    close = difflib.get_close_matches(str(key), algorithm_names(), n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown algorithm {name!r}.{hint} Available: {', '.join(algorithm_names())}.")


__all__ = [
    "A2C",
    "ALGORITHMS",
    "D3QN",
    "DDPG",
    "DQN",
    "PPO",
    "REDQ",
    "SAC",
    "TD3",
    "Algorithm",
    "DoubleDQN",
    "DuelingDQN",
    "algorithm_names",
    "get_algorithm",
    "register_algorithm",
]
