"""TD3 (Fujimoto et al., 2018): DDPG with twin critics, target policy smoothing and a delayed actor.

What TD3 adds to :mod:`phalanx.algos.ddpg` is all here: two (or K) critics reduced by ``min``, clipped
Gaussian noise on the target action, and an actor updated every ``policy_delay`` critic updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from phalanx.algos.ddpg import DDPG, DDPGConfig, DDPGRule, EnsembleCriticLearner, member_view
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


class TD3Rule(DDPGRule):
    """DDPG's rule with target policy smoothing: clipped Gaussian noise on the target action."""

    samples_next_action = True

    @classmethod
    def next_actions(
        cls, learner: EnsembleCriticLearner, next_obs: torch.Tensor, noise: torch.Tensor | None, hp: Any
    ) -> torch.Tensor:
        actions = learner.actor_target(next_obs)
        clip = member_view(hp.target_noise_clip, actions)
        noise = (member_view(hp.target_noise, actions) * noise).clamp(-clip, clip)
        return (actions + noise).clamp(-1.0, 1.0)


class TD3(DDPG):
    name = "td3"
    config_class = TD3Config
    vectorized_population = "phalanx.population.vectorized_off_policy:VectorizedTD3"
    config: TD3Config
    rule = TD3Rule
