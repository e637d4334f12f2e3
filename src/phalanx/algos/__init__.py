"""Learning rules. Each file holds one family, readable top to bottom; ``phalanx.registry`` names them."""

from phalanx.algos.base import Algorithm
from phalanx.algos.ddpg import DDPG
from phalanx.algos.dqn import D3QN, DQN, DoubleDQN, DuelingDQN
from phalanx.algos.ppo import A2C, PPO
from phalanx.algos.pqn import PQN
from phalanx.algos.sac import REDQ, SAC
from phalanx.algos.td3 import TD3

__all__ = [
    "A2C",
    "D3QN",
    "DDPG",
    "DQN",
    "PPO",
    "PQN",
    "REDQ",
    "SAC",
    "TD3",
    "Algorithm",
    "DoubleDQN",
    "DuelingDQN",
]
