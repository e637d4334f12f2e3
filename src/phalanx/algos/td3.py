"""TD3 (Fujimoto et al., 2018): DDPG with twin critics, target policy smoothing and a delayed actor.

What TD3 adds to :mod:`phalanx.algos.ddpg` is configuration: two (or K) critics reduced by ``min``, an
actor updated every ``policy_delay`` critic updates, and clipped Gaussian noise on the target action
(drawn by :data:`TD3_RULE`, added by :func:`phalanx.algos.ddpg.target_actions`).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.algos.ddpg import DDPG, DDPG_RULE, DDPGConfig
from phalanx.config import TrainConfig, check


@dataclass
class TD3Config(DDPGConfig):
    """Twin Delayed DDPG."""

    num_critics: int = 2
    policy_delay: int = 2
    target_noise: float = 0.2
    """Standard deviation of the smoothing noise on the target action."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to [-clip, clip]."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(self.target_noise >= 0, "target_noise", self.target_noise, ">= 0")
        check(self.target_noise_clip >= 0, "target_noise_clip", self.target_noise_clip, ">= 0")


TD3_RULE = DDPG_RULE._replace(next_action_noise=True)
"""DDPG's rule with the target action's noise drawn: target policy smoothing (``ddpg.target_actions``)."""


class TD3(DDPG):
    name = "td3"
    config_class = TD3Config
    vectorized_population = "phalanx.population.vectorized_off_policy:VectorizedTD3"
    config: TD3Config
    rule = TD3_RULE
