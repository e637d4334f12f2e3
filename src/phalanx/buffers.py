"""Storage for on-policy rollouts on the training device, and generalized advantage estimation.

Everything stays on one device as preallocated tensors: writing a step is a few ``copy_`` calls
and computing advantages is a short loop of elementwise kernels, with no host synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from phalanx.errors import CheckpointError

Tensor = torch.Tensor


class RolloutBuffer:
    """One on-policy rollout: ``horizon`` T steps of ``num_envs`` N environments.

    Fields (all preallocated on ``device``):

    - ``obs`` ``(T, N, *obs_shape)`` float32: the observation each action was taken from.
    - ``actions`` ``(T, N, *action_shape)``: int64 for discrete actions, float32 for continuous.
    - ``log_probs``, ``values``, ``rewards`` ``(T, N)`` float32.
    - ``terminated`` ``(T, N)`` bool: the episode reached a terminal state (no bootstrap).
    - ``dones`` ``(T, N)`` bool: ``terminated | truncated`` (the episode ended, either way).
    - ``next_obs`` ``(T, N, *obs_shape)`` float32: the true next observation of each step, i.e. the
      env's ``info["final_obs"]`` (the last observation of an episode that ended at that step,
      not the first observation of the next one).
    """

    FIELDS = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "dones", "next_obs")

    def __init__(
        self,
        horizon: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        self.horizon = horizon
        self.num_envs = num_envs
        self.obs_shape = tuple(obs_shape)
        self.action_shape = tuple(action_shape)
        self.action_dtype = action_dtype
        self.device = torch.device(device)
        steps = (horizon, num_envs)
        float32 = dict(dtype=torch.float32, device=self.device)
        self.obs = torch.zeros(*steps, *self.obs_shape, **float32)  # (T, N, *obs_shape)
        self.actions = torch.zeros(*steps, *self.action_shape, dtype=action_dtype, device=self.device)
        self.log_probs = torch.zeros(*steps, **float32)  # (T, N)
        self.values = torch.zeros(*steps, **float32)  # (T, N)
        self.rewards = torch.zeros(*steps, **float32)  # (T, N)
        self.terminated = torch.zeros(*steps, dtype=torch.bool, device=self.device)  # (T, N)
        self.dones = torch.zeros(*steps, dtype=torch.bool, device=self.device)  # (T, N)
        self.next_obs = torch.zeros(*steps, *self.obs_shape, **float32)  # (T, N, *obs_shape)

    def add(
        self,
        step: int,
        obs: Tensor,
        actions: Tensor,
        log_probs: Tensor,
        values: Tensor,
        rewards: Tensor,
        terminated: Tensor,
        dones: Tensor,
        next_obs: Tensor,
    ) -> None:
        """Copy one step of N environments into row ``step`` (no allocation, no host sync)."""
        row = dict(
            obs=obs,
            actions=actions,
            log_probs=log_probs,
            values=values,
            rewards=rewards,
            terminated=terminated,
            dones=dones,
            next_obs=next_obs,
        )
        for name, value in row.items():
            storage = self._storage(name)
            if value.shape != storage.shape[1:]:
                raise ValueError(
                    f"RolloutBuffer.add: {name} has shape {tuple(value.shape)}, "
                    f"expected {tuple(storage.shape[1:])} (num_envs, ...)."
                )
            storage[step].copy_(value)

    def flatten(self, *names: str) -> tuple[Tensor, ...]:
        """Views of the named fields with T and N merged: ``(T * N, ...)``, for minibatching."""
        return tuple(self._storage(name).flatten(0, 1) for name in names)

    @property
    def nbytes(self) -> int:
        """Device memory held by the buffer, in bytes."""
        return sum(self._storage(name).nbytes for name in self.FIELDS)

    def state_dict(self) -> dict[str, Any]:
        """Copies of every field (safe to keep while the buffer is reused)."""
        return {name: self._storage(name).clone() for name in self.FIELDS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy what :meth:`state_dict` returned into this buffer (any device; shapes must match)."""
        missing = [name for name in self.FIELDS if name not in state]
        if missing:
            raise CheckpointError(f"RolloutBuffer state is missing {missing}; it has {sorted(state)}.")
        for name in self.FIELDS:
            storage, value = self._storage(name), state[name]
            if value.shape != storage.shape or value.dtype != storage.dtype:
                raise CheckpointError(
                    f"RolloutBuffer state {name!r} is {tuple(value.shape)} {value.dtype}, but this buffer "
                    f"holds {tuple(storage.shape)} {storage.dtype}; the checkpoint was written with a "
                    "different horizon, num_envs, or env spaces."
                )
        for name in self.FIELDS:
            self._storage(name).copy_(state[name])

    def _storage(self, name: str) -> Tensor:
        if name not in self.FIELDS:
            raise KeyError(f"RolloutBuffer has no field {name!r}; fields: {', '.join(self.FIELDS)}.")
        return getattr(self, name)

    def __repr__(self) -> str:
        return (
            f"RolloutBuffer(horizon={self.horizon}, num_envs={self.num_envs}, obs_shape={self.obs_shape}, "
            f"action_shape={self.action_shape}, action_dtype={self.action_dtype}, device={self.device})"
        )


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    dones: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation; returns ``(advantages, returns)``, both ``(T, N)``.

    All inputs are ``(T, N)``. ``next_values[t]`` is V of the *true* next observation of step t
    (``RolloutBuffer.next_obs``, the env's ``info["final_obs"]``), so that the two ways an episode
    ends are told apart:

    - terminated (a terminal state; its value is 0 by definition): no bootstrap,
      ``delta_t = r_t - V(s_t)``;
    - truncated but not terminated (a time limit cut an episode that would go on): bootstrap from
      the value of the final observation, ``delta_t = r_t + gamma * V(final_obs_t) - V(s_t)``.

    In both cases the recursion ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`` stops, as
    step t + 1 belongs to the next episode. The last step of the rollout bootstraps through
    ``next_values[T - 1]`` and has ``A_T = 0``. ``returns = advantages + values``.

    Where a step did not end an episode, ``next_values[t]`` equals ``values[t + 1]``; a caller may
    compute V only for the final observations and the last step, and fill the rest from ``values``.
    """
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape == dones.shape):
        raise ValueError(
            "compute_gae: rewards, values, next_values, terminated and dones must all be (T, N); got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(next_values.shape)}, "
            f"{tuple(terminated.shape)}, {tuple(dones.shape)}."
        )
    horizon = values.shape[0]
    not_terminated = 1.0 - terminated.to(values.dtype)  # (T, N)
    continues = gamma * gae_lambda * (1.0 - dones.to(values.dtype))  # (T, N)
    deltas = rewards + gamma * next_values * not_terminated - values  # (T, N)
    advantages = torch.empty_like(values)  # (T, N)
    next_advantage = torch.zeros_like(values[0])  # (N,)
    for t in reversed(range(horizon)):
        next_advantage = deltas[t] + continues[t] * next_advantage
        advantages[t] = next_advantage
    return advantages, advantages + values


# The device ReplayBuffer for off-policy algorithms (a later issue) will live here too: a ring of
# preallocated (capacity, *shape) tensors on the training device, with the same next_obs /
# terminated convention as RolloutBuffer so that TD targets bootstrap across truncations.
