"""phalanx: massively parallel deep reinforcement learning in PyTorch.

import phalanx
config = phalanx.make_config("ppo", "CartPole-v1", stop_return=475)
result = phalanx.train(config)
agent = phalanx.load_agent(result.run_dir)
"""

import os

# Before torch is first imported: idle OpenMP threads sleep instead of spinning. With torch's default
# of one thread per core, spinning threads stall every small op whenever another process holds a core
# (measured: a 2 s CartPole run took 9-87 s on a shared 2-core machine). Set the variable yourself to
# override; it has no effect if torch was imported before phalanx.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from phalanx import marl  # noqa: E402,I001 - registers the multi-agent algorithms; after train (it builds on it)
from phalanx.agent import Agent, evaluate, load_agent
from phalanx.algos.ppo import A2CConfig, PPOConfig
from phalanx.config import TrainConfig, make_config
from phalanx.envs.check import check_vec_env
from phalanx.envs.core import BatchedVecEnv, VecEnv
from phalanx.envs.registry import list_envs, make_env, register_env
from phalanx.errors import CheckpointError, ConfigError, ContractError, EnvError, PhalanxError
from phalanx.train.entry import resume, train
from phalanx.train.hooks import Hook
from phalanx.train.loop import TrainResult

__version__ = "0.1.0"

__all__ = [
    "A2CConfig",
    "Agent",
    "BatchedVecEnv",
    "CheckpointError",
    "ConfigError",
    "ContractError",
    "EnvError",
    "Hook",
    "PPOConfig",
    "PhalanxError",
    "TrainConfig",
    "TrainResult",
    "VecEnv",
    "check_vec_env",
    "evaluate",
    "list_envs",
    "marl",
    "load_agent",
    "make_config",
    "make_env",
    "register_env",
    "resume",
    "train",
]
