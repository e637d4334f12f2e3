"""Multi-agent DRL: batched multi-agent envs, adapters, and multi-agent algorithms.

Importing this package registers the multi-agent algorithms (mappo, ippo, qmix, vdn, maddpg, matd3)
with ``phalanx.algos``, so that configs, presets and the CLI know them (``phalanx`` imports it).
"""

from phalanx.marl import maddpg, mappo, qmix
from phalanx.marl.adapters import PettingZooVecEnv, VMASVecEnv
from phalanx.marl.agent import MultiAgentAgent
from phalanx.marl.base import MultiAgentAlgorithm, MultiAgentSpec
from phalanx.marl.check import check_multi_agent_env
from phalanx.marl.core import AgentGroup, BatchedMultiAgentEnv, MultiAgentVecEnv
from phalanx.marl.registry import list_multi_agent_envs, make_multi_agent_env, register_multi_agent_env
from phalanx.marl.trainer import MultiAgentTrainer

__all__ = [
    "AgentGroup",
    "BatchedMultiAgentEnv",
    "MultiAgentAgent",
    "MultiAgentAlgorithm",
    "MultiAgentSpec",
    "MultiAgentTrainer",
    "MultiAgentVecEnv",
    "PettingZooVecEnv",
    "VMASVecEnv",
    "check_multi_agent_env",
    "list_multi_agent_envs",
    "make_multi_agent_env",
    "maddpg",
    "mappo",
    "qmix",
    "register_multi_agent_env",
]
