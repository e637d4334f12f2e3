"""Other libraries' multi-agent envs behind the :class:`~phalanx.marl.core.MultiAgentVecEnv` contract.

:class:`PettingZooVecEnv` runs ``num_envs`` copies of any PettingZoo *parallel-API* environment
(``pettingzoo.ParallelEnv``: MPE2's ``simple_spread_v3.parallel_env``, butterfly envs with flat
observations, ...), in this process or split over worker processes that exchange actions and results
through shared memory, the same machinery as :class:`phalanx.envs.workers.ProcessVecEnv`.

:class:`VMASVecEnv` presents a `VMAS <https://github.com/proroklab/VectorizedMultiAgentSimulator>`_
scenario, already batched in torch on the device, with no copies: it only stacks the per-agent tensors
into groups and resets the ended rows in the same step.

Both group agents the same way (:func:`group_agents`): agents whose names share the prefix before a
final ``_<number>`` (``adversary_0``, ``adversary_1`` -> ``"adversary"``; ``agent_0`` -> ``"agent"``)
and that have equal observation and action spaces form one group, in the library's agent order.

Where each part lives: :mod:`~phalanx.marl.adapters.groups` (grouping the agents),
:mod:`~phalanx.marl.adapters.pettingzoo` (:class:`PettingZooVecEnv`; its agents' layout in
:mod:`~phalanx.marl.adapters.pettingzoo_layout`, the stepping of its copies in
:mod:`~phalanx.marl.adapters.pettingzoo_copies`) and :mod:`~phalanx.marl.adapters.vmas`
(:class:`VMASVecEnv`).
"""

from __future__ import annotations

from phalanx.marl.adapters.groups import agent_prefix as agent_prefix
from phalanx.marl.adapters.groups import group_agents
from phalanx.marl.adapters.pettingzoo import PettingZooVecEnv
from phalanx.marl.adapters.vmas import VMASVecEnv

__all__ = ["PettingZooVecEnv", "VMASVecEnv", "group_agents"]
