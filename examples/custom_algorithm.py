"""An algorithm of your own, in one module: REINFORCE with a learned baseline (vanilla policy gradient).

phalanx learns it once this module is imported, which ``--import`` does (from the repository root):

    phalanx train reinforce CartPole-v1 --import examples.custom_algorithm --total-steps 50000

The class says what it is (its name, its hyperparameters' dataclass, on-policy, the action spaces it acts
in); ``register_algorithm`` names it to phalanx, once. Being on-policy, it gets the machinery PPO gets:
the trainer fills a rollout buffer of ``horizon`` steps of every sub-env with :meth:`Reinforce.explore`,
then calls :meth:`Reinforce.update` on it; evaluation, checkpoints, ``phalanx eval`` and ``load_agent`` use
:meth:`Reinforce.act`. See docs/architecture.md, "Adding an algorithm".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from phalanx.algos.base import Algorithm
from phalanx.buffers import RolloutBuffer
from phalanx.config import AlgoConfig, TrainConfig, check
from phalanx.nets import CategoricalPolicy, ValueNet
from phalanx.registry import register_algorithm


@dataclass
class ReinforceConfig(AlgoConfig):
    """REINFORCE's hyperparameters (each one a flag: ``--horizon 256``), besides every algorithm's
    (``learning_rate``, ``gamma``, ``hidden_sizes``, ...)."""

    learning_rate: float = 1e-3
    horizon: int = 128
    """Steps each sub-env takes per rollout (an on-policy config has a horizon)."""
    value_coef: float = 0.5
    """Weight of the baseline's loss."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(self.horizon >= 1, "horizon", self.horizon, "an integer >= 1")
        check(self.value_coef >= 0, "value_coef", self.value_coef, ">= 0")


@register_algorithm
class Reinforce(Algorithm):
    """The policy gradient ``-log pi(a|s) * (G - V(s))``, with ``G`` the discounted return that followed
    each step (bootstrapped from the baseline where the rollout or a time limit cut the episode)."""

    name = "reinforce"
    config_class = ReinforceConfig
    on_policy = True
    action_spaces = (gym.spaces.Discrete,)
    config: ReinforceConfig

    def __init__(
        self,
        config: ReinforceConfig,
        observation_space: gym.Space,
        action_space: gym.Space,
        device: torch.device,
    ) -> None:
        super().__init__(config, observation_space, action_space, device)  # checks the spaces
        features = observation_space.shape[0]
        self.policy = CategoricalPolicy(features, int(action_space.n), config.hidden_sizes, config.activation)
        self.value = ValueNet(features, config.hidden_sizes, config.activation)
        self.policy.to(self.device)
        self.value.to(self.device)
        parameters = [*self.policy.parameters(), *self.value.parameters()]
        self.optimizer = torch.optim.Adam(parameters, lr=config.learning_rate)
        # the checkpoints hold every network and optimiser held as an attribute (Algorithm.state_dict)

    def rollout_buffer(self, horizon: int, num_envs: int, *args: Any, **kwargs: Any) -> RolloutBuffer:
        return RolloutBuffer(horizon, num_envs, *args, **kwargs)

    @torch.no_grad()
    def explore(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Actions to collect with, their log-probabilities and values, each ``(N,)``."""
        actions, log_probs = self.policy.sample(obs, noise=noise)
        return actions, log_probs, self.value(obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        if deterministic:
            return self.policy.deterministic_action(obs)
        return self.policy.sample(obs)[0]

    def update(self, rollout: RolloutBuffer, progress: float) -> dict[str, torch.Tensor]:
        gamma = self.config.gamma
        with torch.no_grad():  # the return after each step, from the last step of the rollout back
            next_values = self.value(rollout.next_obs)  # (T, N): V of each step's true next observation
            returns = torch.empty_like(rollout.rewards)
            following = next_values[-1]
            for step in reversed(range(rollout.horizon)):
                # an episode that ended at this step: what follows it is its final observation's value
                following = torch.where(rollout.dones[step], next_values[step], following)
                following = rollout.rewards[step] + gamma * ~rollout.terminated[step] * following
                returns[step] = following
        obs, actions, returns = rollout.obs.flatten(0, 1), rollout.actions.flatten(0, 1), returns.flatten()
        log_probs, entropy = self.policy.log_prob_entropy(obs, actions)
        values = self.value(obs)
        advantages = (returns - values).detach()
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = -(log_probs * advantages).mean()
        value_loss = 0.5 * (returns - values).pow(2).mean()
        self.minimise(policy_loss + self.config.value_coef * value_loss, self.optimizer)
        return {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.mean().detach(),
        }
