"""phalanx: massively parallel deep reinforcement learning in PyTorch.

import phalanx
config = phalanx.make_config("ppo", "CartPole-v1", stop_return=475)
result = phalanx.train(config)
agent = phalanx.load_agent(result.run_dir)
"""

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"

# Each public name and the module that defines it, imported on first use: importing a lower layer
# (``phalanx.envs``, ``phalanx.config``) does not import the learners and the runtime above it.
_EXPORTS = {
    "A2CConfig": "phalanx.algos.ppo",
    "Agent": "phalanx.agent",
    "BatchedVecEnv": "phalanx.envs.core",
    "CheckpointError": "phalanx.errors",
    "ConfigError": "phalanx.errors",
    "ContractError": "phalanx.errors",
    "EnvError": "phalanx.errors",
    "PPOConfig": "phalanx.algos.ppo",
    "PhalanxError": "phalanx.errors",
    "TrainConfig": "phalanx.config",
    "Hook": "phalanx.train.hooks",
    "TrainResult": "phalanx.train.loop",
    "VecEnv": "phalanx.envs.core",
    "check_vec_env": "phalanx.envs.check",
    "evaluate": "phalanx.agent",
    "export": "phalanx.exporting",
    "list_envs": "phalanx.envs.registry",
    "load_agent": "phalanx.agent",
    "make_config": "phalanx.config",
    "make_env": "phalanx.envs.registry",
    "plot": "phalanx.train.plots",
    "record_video": "phalanx.video",
    "register_algorithm": "phalanx.registry",
    "register_env": "phalanx.envs.registry",
    "resume": "phalanx.train.entry",
    "train": "phalanx.train.entry",
    "tune": "phalanx.tuning",
}

__all__ = sorted([*_EXPORTS, "marl"])

# `phalanx.train` names the training function and the package phalanx/train/ alike. The package (its
# __init__ is empty) is loaded now, so that no later import binds it over the function's name.
importlib.import_module("phalanx.train")
del globals()["train"]


def __getattr__(name: str) -> Any:
    if name == "marl":
        return importlib.import_module("phalanx.marl")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule, e.g. phalanx.agent
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
