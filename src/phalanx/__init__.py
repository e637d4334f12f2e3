"""phalanx: massively parallel deep reinforcement learning in PyTorch.

import phalanx
config = phalanx.make_config("ppo", "CartPole-v1", stop_return=475)
result = phalanx.train(config)
agent = phalanx.load_agent(result.run_dir)
"""

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

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


def _version() -> str:
    """The version, written once: pyproject.toml's ``[project] version``. Read from pyproject.toml itself
    when phalanx runs from a source tree (a checkout or an unpacked sdist, used with PYTHONPATH=src or
    installed editable, whose recorded metadata goes stale when the file changes), else from the
    installed distribution's metadata (a wheel). Resolved on first use of ``phalanx.__version__``:
    importlib.metadata costs ~30 ms of every start-up otherwise."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file() and sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "phalanx":
            return project["version"]
    import importlib.metadata

    try:
        return importlib.metadata.version("phalanx")
    except importlib.metadata.PackageNotFoundError:  # a source tree on Python 3.10, never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()["__version__"] = _version()
        return globals()["__version__"]
    if name == "marl":
        return importlib.import_module("phalanx.marl")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule, e.g. phalanx.agent
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
