"""Multi-agent DRL: batched multi-agent envs, adapters, and multi-agent algorithms.

The multi-agent algorithms (mappo, ippo, qmix, vdn, maddpg, matd3) are rows of ``phalanx.registry``
like the others; their modules sit in the layers of what they are (envs: core, mpe, adapters,
registry; algorithms: base, mappo, qmix, maddpg; runtime: trainer; applications: agent).
"""

from phalanx.marl import maddpg, mappo, qmix
from phalanx.marl.adapters import PettingZooVecEnv, VMASVecEnv
from phalanx.marl.agent import MultiAgentAgent
from phalanx.marl.base import MultiAgentAlgorithm
from phalanx.marl.check import check_multi_agent_env
from phalanx.marl.core import AgentGroup, BatchedMultiAgentEnv, MultiAgentSpec, MultiAgentVecEnv
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
