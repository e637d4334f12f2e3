"""The Algorithm interface shared by every learning rule.

An algorithm knows observation and action *spaces*, never environments (DESIGN.md). It owns its
networks and optimisers and exposes:

- ``act(obs, deterministic)``: actions in the normalised action space ([-1, 1] for Box), for
  evaluation and deployment;
- ``update(batch, progress) -> metrics``: one learning step on collected data; ``progress`` in [0, 1]
  is the fraction of the training budget spent (for schedules); metrics are scalar tensors, read on
  the host only when they are logged;
- ``state_dict()`` / ``load_state_dict()``: networks and optimiser state, tensors and primitives only.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import torch

from phalanx.config import AlgoConfig
from phalanx.errors import ConfigError


class Algorithm:
    name: ClassVar[str]
    config_class: ClassVar[type[AlgoConfig]]
    on_policy: ClassVar[bool]
    action_spaces: ClassVar[tuple[type[gym.Space], ...]] = (gym.spaces.Discrete, gym.spaces.Box)

    def __init__(
        self,
        config: AlgoConfig,
        observation_space: gym.Space,
        action_space: gym.Space,
        device: torch.device,
    ) -> None:
        self.check_spaces(observation_space, action_space)
        self.config = config
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = torch.device(device)

    @classmethod
    def check_spaces(cls, observation_space: gym.Space, action_space: gym.Space) -> None:
        if not isinstance(action_space, cls.action_spaces):
            supported = " or ".join(space.__name__ for space in cls.action_spaces)
            raise ConfigError(
                f"{cls.name} needs a {supported} action space, but the environment's action space is "
                f"{action_space}. Choose an algorithm for this action space (see `phalanx train --help`)."
            )
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise ConfigError(
                f"{cls.name} needs flat Box observations (a vector per sub-env), but the environment's "
                f"observation space is {observation_space}. Flatten the observations in the env."
            )

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def update(self, batch: Any, progress: float) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError
