"""The hyperparameters of DDPG, TD3 and SAC's ensemble critics (and of the parallel recipe's options: per-env
noise, AdamW, bf16, LayerNorm and distributional critics), with their validation: kept apart from
:mod:`phalanx.algos.ddpg` so that the learning rule starts at the top of that module."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from phalanx.algos.base import OffPolicyConfig
from phalanx.algos.distributional import validate_categorical_critic
from phalanx.config import TrainConfig, check
from phalanx.errors import ConfigError
from phalanx.optim import DECOUPLED_WEIGHT_DECAY

TARGET_REDUCTIONS = ("min", "mean", "redq")


@dataclass
class EnsembleCriticConfig(OffPolicyConfig):
    """Continuous control with an ensemble of K critics."""

    learning_rate: float = 1e-3
    """Actor learning rate."""
    critic_learning_rate: float | None = None
    """Critic learning rate (None: the actor's)."""
    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    bf16: bool = False
    """Run the actor's and the critics' forward passes and losses under bfloat16 autocast on CUDA (weights,
    gradients and optimiser states stay float32), as FastTD3 does; CUDA devices only."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay of the actor's and the critics' optimisers (not of SAC's
    temperature): each step shrinks the weights by ``lr * weight_decay`` of themselves (FastTD3: 0.1).
    0: plain Adam."""
    num_critics: int = 1
    """K critics trained as one batched network."""
    target_reduction: str = "min"
    """How the K target critics combine into V(s'): min, mean, or redq (min over a random subset)."""
    target_subset: int = 2
    """M, the size of REDQ's random subset of critics (target_reduction = redq)."""
    policy_delay: int = 1
    """Critic updates per actor (and target network) update."""
    critic_layer_norm: bool = False
    """A LayerNorm (each critic its own affine weights) between each hidden layer of the critics and its
    activation, as PQN's Q-network has."""
    critic_atoms: int | None = None
    """Distributional (C51) critics: each critic's logits over this many atoms evenly spaced on
    [v_min, v_max], e.g. 101 (FastTD3's); None: a scalar Q per critic."""
    v_min: float | None = None
    """With critic_atoms: the smallest return the atoms cover, e.g. -250."""
    v_max: float | None = None
    """With critic_atoms: the largest return the atoms cover, e.g. 250."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        layer_norm = self.critic_layer_norm
        check(isinstance(layer_norm, bool), "critic_layer_norm", layer_norm, "true or false")
        validate_categorical_critic(self)
        lr = self.critic_learning_rate
        check(
            lr is None or lr > 0, "critic_learning_rate", lr, "a positive number, or None for learning_rate"
        )
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0 (0: plain Adam)")
        check(
            not self.weight_decay or DECOUPLED_WEIGHT_DECAY,
            "weight_decay",
            self.weight_decay,
            f"0 with torch {torch.__version__}: AdamW's weight decay needs torch >= 2.6 (Adam's "
            "decoupled_weight_decay); upgrade torch",
        )
        device = run.device.split(":")[0]
        if self.bf16 and device != "cuda":
            raise ConfigError(
                f"bf16 autocast is for CUDA devices; this run's device is {device}: drop bf16 or pass "
                "--device cuda."
            )
        check(self.num_critics >= 1, "num_critics", self.num_critics, "an integer >= 1")
        check(
            self.target_reduction in TARGET_REDUCTIONS,
            "target_reduction",
            self.target_reduction,
            f"one of {TARGET_REDUCTIONS}",
        )
        if self.target_reduction == "redq":
            check(
                1 <= self.target_subset <= self.num_critics,
                "target_subset",
                self.target_subset,
                f"REDQ's subset size M between 1 and num_critics K = {self.num_critics} (M <= K); "
                "raise num_critics or lower target_subset",
            )
        check(self.policy_delay >= 1, "policy_delay", self.policy_delay, "an integer >= 1")


@dataclass
class DDPGConfig(EnsembleCriticConfig):
    """Deep Deterministic Policy Gradient (Lillicrap et al., 2016)."""

    exploration_noise: float = 0.1
    """Standard deviation of the Gaussian noise added to actions in [-1, 1] during collection."""
    exploration_noise_range: tuple[float, float] | None = None
    """Per-env noise (FastTD3's ``(0.001, 0.4)``): each sub-env's own standard deviation, spread evenly
    from low to high over the sub-envs (:class:`GaussianExploration`). It replaces exploration_noise,
    which is then not read. None: exploration_noise for every sub-env."""
    actor_output_gain: float = 1.0
    """Gain of the orthogonal initialisation of the actor's last layer. Small (FastTD3's 0.01) starts
    every action near 0, away from the flat ends of the tanh, where a saturated actor gets almost no
    gradient and can stay stuck; SAC's Gaussian head is always initialised at 0.01."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(self.exploration_noise >= 0, "exploration_noise", self.exploration_noise, ">= 0")
        check(self.actor_output_gain > 0, "actor_output_gain", self.actor_output_gain, "> 0, e.g. 0.01")
        name, spread = "exploration_noise_range", self.exploration_noise_range
        if spread is None:
            return
        pair = isinstance(spread, tuple | list) and len(spread) == 2
        numbers = pair and all(isinstance(v, int | float) and not isinstance(v, bool) for v in spread)
        check(numbers, name, spread, "a pair [low, high] of standard deviations, e.g. [0.001, 0.4]")
        low, high = spread
        check(low >= 0, name, spread, f"standard deviations >= 0, but low = {low}")
        check(low <= high, name, spread, f"low <= high, but {low} > {high}; write [low, high]")
        expected = f"None with num_envs = {run.num_envs}: per-env noise needs at least 2 sub-envs; with one"
        check(run.num_envs >= 2, name, spread, expected + " env use exploration_noise")
