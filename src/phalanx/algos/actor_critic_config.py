"""The hyperparameters of PPO and A2C (and of their recurrent variants), with their validation: kept apart
from :mod:`phalanx.algos.ppo` so that the learning rule starts at the top of that module."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.config import AlgoConfig, TrainConfig, check, is_int
from phalanx.errors import ConfigError
from phalanx.registry import has_recurrent_policy, no_recurrent_policy

RECURRENT_CELLS = ("lstm", "gru")
"""The memories of a recurrent policy (``ActorCriticConfig.recurrent``)."""


@dataclass
class ActorCriticConfig(AlgoConfig):
    """Hyperparameters shared by PPO and A2C."""

    horizon: int = 128
    """Steps each sub-env takes per rollout (rollout size = horizon * num_envs)."""
    gae_lambda: float = 0.95
    """GAE lambda: 1 is Monte Carlo with bootstrap, 0 is one-step TD."""
    normalize_advantages: bool = True
    """Normalise advantages to zero mean and unit variance in each minibatch."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float | None = 0.5
    """Clip the global gradient norm to this value (None: no clipping)."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly to 0 over total_steps."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions)."""
    recurrent: str | None = None
    """A recurrent policy with memory: lstm or gru (None: feed-forward). See docs/recurrent.md."""
    recurrent_hidden_size: int = 128
    """With recurrent: the size of the LSTM/GRU hidden state."""
    sequence_length: int | None = None
    """With recurrent: the steps of one training sequence, truncated backpropagation through time over
    chunks of this many steps of a sub-env's rollout; it must divide horizon (None: the whole horizon)."""
    burn_in: int = 0
    """With recurrent: steps at the start of each sequence run without gradient and left out of the loss,
    to warm the memory from the stored one with the current weights (< sequence_length)."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(isinstance(self.horizon, int) and self.horizon >= 1, "horizon", self.horizon, "an integer >= 1")
        self.validate_recurrent(run)
        check(0.0 <= self.gae_lambda <= 1.0, "gae_lambda", self.gae_lambda, "a value in [0, 1]")
        check(self.entropy_coef >= 0, "entropy_coef", self.entropy_coef, ">= 0")
        check(self.value_coef >= 0, "value_coef", self.value_coef, ">= 0")
        check(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            "max_grad_norm",
            self.max_grad_norm,
            "a positive number, or None for no clipping",
        )

    def validate_recurrent(self, run: TrainConfig) -> None:
        """The recurrent settings: a known cell, and sequences that tile the horizon."""
        if self.recurrent is None:
            return
        if not has_recurrent_policy(run.algo):
            raise no_recurrent_policy(run.algo)
        check(
            self.recurrent in RECURRENT_CELLS,
            "recurrent",
            self.recurrent,
            f"one of {RECURRENT_CELLS} or None",
        )
        if run.overlap:
            raise ConfigError(
                "overlap=True computes the actions of one half of the sub-envs while the other steps, but a "
                "recurrent policy's memory goes from each step to the next of the same sub-env. Drop "
                "--overlap for a recurrent policy (--num-workers alone still steps the envs in processes)."
            )
        check(
            is_int(self.recurrent_hidden_size) and self.recurrent_hidden_size >= 1,
            "recurrent_hidden_size",
            self.recurrent_hidden_size,
            "an integer >= 1, e.g. 128",
        )
        length = self.sequence_steps()
        check(
            self.sequence_length is None
            or (is_int(self.sequence_length) and 1 <= length and self.horizon % length == 0),
            "sequence_length",
            self.sequence_length,
            f"an integer that divides horizon = {self.horizon} (the rollout of each sub-env is cut into "
            "sequences of this many steps), or None for the whole horizon",
        )
        check(
            is_int(self.burn_in) and 0 <= self.burn_in < length,
            "burn_in",
            self.burn_in,
            f"an integer in [0, sequence length = {length}): the steps of a sequence left out of the loss "
            "must leave some in",
        )

    def sequence_steps(self) -> int:
        """The steps of one training sequence of a recurrent policy (``sequence_length``, or the horizon)."""
        return self.horizon if self.sequence_length is None else self.sequence_length


@dataclass
class PPOConfig(ActorCriticConfig):
    """Proximal Policy Optimization (Schulman et al., 2017)."""

    epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 256
    """Samples per gradient step; at most horizon * num_envs."""
    clip_range: float = 0.2
    """Probability-ratio clip e in min(r*A, clip(r, 1-e, 1+e)*A)."""
    clip_value: float | None = None
    """Clip the value update around the old value by this range (None: no value clipping)."""
    target_kl: float | None = None
    """Stop the epochs of an update early once the approximate KL exceeds this (None: never)."""

    def rollout_size(self, run: TrainConfig) -> int | None:
        """Samples in one rollout, the bound of ``minibatch_size`` (None: known only with the env)."""
        return self.horizon * run.num_envs

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        rollout = self.rollout_size(run)
        check(isinstance(self.epochs, int) and self.epochs >= 1, "epochs", self.epochs, "an integer >= 1")
        check(
            isinstance(self.minibatch_size, int) and self.minibatch_size >= 1,
            "minibatch_size",
            self.minibatch_size,
            "an integer >= 1",
        )
        check(
            rollout is None or self.minibatch_size <= rollout,
            "minibatch_size",
            self.minibatch_size,
            f"an integer between 1 and the rollout size horizon * num_envs = {self.horizon} * "
            f"{run.num_envs} = {rollout}; lower minibatch_size or raise horizon or num_envs",
        )
        if self.recurrent is not None:
            length = self.sequence_steps()
            check(
                self.minibatch_size % length == 0,
                "minibatch_size",
                self.minibatch_size,
                f"a multiple of the sequence length {length} (a recurrent policy learns from minibatches "
                f"of whole sequences: minibatch_size / {length} sequences each); set minibatch_size to "
                f"{max(length, self.minibatch_size // length * length)} or change sequence_length",
            )
        check(0 < self.clip_range < 1, "clip_range", self.clip_range, "a value in (0, 1), e.g. 0.2")
        check(self.clip_value is None or self.clip_value > 0, "clip_value", self.clip_value, "> 0 or None")
        check(self.target_kl is None or self.target_kl > 0, "target_kl", self.target_kl, "> 0 or None")


@dataclass
class A2CConfig(ActorCriticConfig):
    """Advantage Actor-Critic (Mnih et al., 2016), synchronous, with RMSprop as in the paper."""

    learning_rate: float = 7e-4
    horizon: int = 5
    gae_lambda: float = 1.0
    normalize_advantages: bool = False
    rmsprop_alpha: float = 0.99
    """RMSprop smoothing constant."""
    rmsprop_eps: float = 1e-5
    """RMSprop epsilon."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(0 < self.rmsprop_alpha < 1, "rmsprop_alpha", self.rmsprop_alpha, "a value in (0, 1)")
        check(self.rmsprop_eps > 0, "rmsprop_eps", self.rmsprop_eps, "> 0")
