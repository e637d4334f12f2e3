"""On-policy storage: :class:`RolloutBuffer`, one rollout of ``(T, N)`` steps preallocated on the training
device, and generalized advantage estimation over it (:func:`compute_gae`, the loop, and
:func:`compute_gae_scan`, the same recursion in log2(T) passes for a compiled update).

Writing a step is a few ``copy_`` calls and computing advantages a short run of elementwise kernels,
with no host synchronisation.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from phalanx.buffers.layout import Device, StepLayout
from phalanx.errors import CheckpointError

Tensor = torch.Tensor


class RolloutBuffer:
    """One on-policy rollout: ``horizon`` T steps of ``num_envs`` N environments, each step stored as
    ``layout`` says.

    Fields (all preallocated on ``device``):

    - ``obs`` ``(T, N, *obs_shape)`` ``obs_dtype`` (uint8 images stay uint8): the observation each action
      was taken from.
    - ``actions`` ``(T, N, *action_shape)`` ``action_dtype``: int64 for discrete actions, float32 for
      continuous.
    - ``log_probs``, ``values``, ``rewards`` ``(T, N)`` float32.
    - ``terminated`` ``(T, N)`` bool: the episode reached a terminal state (no bootstrap).
    - ``dones`` ``(T, N)`` bool: ``terminated | truncated`` (the episode ended, either way).
    - ``next_obs`` ``(T, N, *obs_shape)`` ``obs_dtype``: the true next observation of each step, i.e. the
      env's ``info["final_obs"]`` (the last observation of an episode that ended at that step,
      not the first observation of the next one).
    """

    FIELDS = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "dones", "next_obs")

    def __init__(
        self,
        horizon: int,
        num_envs: int,
        layout: StepLayout,
        device: Device,
    ) -> None:
        self.horizon = horizon
        self.num_envs = num_envs
        self.layout = layout
        self.obs_shape, self.obs_dtype = layout.obs_shape, layout.obs_dtype
        self.action_shape, self.action_dtype = layout.action_shape, layout.action_dtype
        self.device = torch.device(device)
        steps = (horizon, num_envs)
        float32: dict[str, Any] = dict(dtype=torch.float32, device=self.device)
        # (T, N, *obs_shape)
        self.obs = torch.zeros(*steps, *self.obs_shape, dtype=self.obs_dtype, device=self.device)
        self.actions = torch.zeros(*steps, *self.action_shape, dtype=self.action_dtype, device=self.device)
        self.log_probs = torch.zeros(*steps, **float32)  # (T, N)
        self.values = torch.zeros(*steps, **float32)  # (T, N)
        self.rewards = torch.zeros(*steps, **float32)  # (T, N)
        self.terminated = torch.zeros(*steps, dtype=torch.bool, device=self.device)  # (T, N)
        self.dones = torch.zeros(*steps, dtype=torch.bool, device=self.device)  # (T, N)
        self.next_obs = torch.zeros_like(self.obs)  # (T, N, *obs_shape)
        self.rows = [tuple(self._storage(name)[step] for name in self.FIELDS) for step in range(horizon)]
        """Per step, the views of its row of every field (in FIELDS' order): :meth:`add` copies into
        them without indexing the fields again."""
        self.row_shapes = [tuple(row.shape) for row in self.rows[0]]

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
        row = (obs, actions, log_probs, values, rewards, terminated, dones, next_obs)  # in FIELDS' order
        for storage, value, shape in zip(self.rows[step], row, self.row_shapes, strict=True):
            if value.shape != shape:  # copy_ would broadcast a (1,) or (N, 1) into the row silently
                self.raise_shape_error(row)
            storage.copy_(value)

    def raise_shape_error(self, row: tuple[Tensor, ...]) -> None:
        """The ValueError of :meth:`add` naming the first field of ``row`` whose shape is wrong."""
        for name, value, shape in zip(self.FIELDS, row, self.row_shapes, strict=True):
            if value.shape != shape:
                raise ValueError(
                    f"RolloutBuffer.add: {name} has shape {tuple(value.shape)}, expected {shape} "
                    "(num_envs, ...)."
                )

    @property
    def critic_obs(self) -> Tensor:
        """The value function's input: the observation (a centralised critic's rollout has its own)."""
        return self.obs

    @property
    def next_critic_obs(self) -> Tensor:
        return self.next_obs

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

    OBS_FIELDS = ("obs", "next_obs")
    """The fields in the observation dtype: a checkpoint's may be in another (float32, written before
    buffers kept the env's dtype), which loading converts."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy what :meth:`state_dict` returned into this buffer (any device; shapes must match)."""
        missing = [name for name in self.FIELDS if name not in state]
        if missing:
            raise CheckpointError(f"RolloutBuffer state is missing {missing}; it has {sorted(state)}.")
        for name in self.FIELDS:
            storage, value = self._storage(name), state[name]
            dtype_differs = value.dtype != storage.dtype and name not in self.OBS_FIELDS
            if value.shape != storage.shape or dtype_differs:
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
            f"RolloutBuffer(horizon={self.horizon}, num_envs={self.num_envs}, layout={self.layout}, "
            f"device={self.device})"
        )


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    dones: Tensor,
    gamma: float,
    gae_lambda: float,
    scan: bool = False,
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

    ``scan``: solve the recursion in ~4 log2(T) ops rather than the loop's ~5 T (:func:`_scan`), for the
    compiled update, whose speed the T small ops of the loop bound; equal within float rounding (the
    sums are added in another order). Where the loop's ops are large already (more than
    ``SCAN_MAX_ENVS`` sub-envs on a CPU) the loop runs instead.
    """
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape == dones.shape):
        raise ValueError(
            "compute_gae: rewards, values, next_values, terminated and dones must all be (T, N); got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(next_values.shape)}, "
            f"{tuple(terminated.shape)}, {tuple(dones.shape)}."
        )
    not_terminated = 1.0 - terminated.to(values.dtype)  # (T, N)
    continues = gamma * gae_lambda * (1.0 - dones.to(values.dtype))  # (T, N): the recursion's factors
    deltas = rewards + gamma * next_values * not_terminated - values  # (T, N): the TD errors
    if scan and not (values.device.type == "cpu" and values[0].numel() > SCAN_MAX_ENVS):
        advantages = _scan(deltas, continues)
    else:
        advantages = _loop(deltas, continues)
    return advantages, advantages + values


compute_gae_scan = functools.partial(compute_gae, scan=True)
""":func:`compute_gae` with ``scan=True``: the recursion in log2(T) passes, for a compiled update."""


def _loop(deltas: Tensor, continues: Tensor) -> Tensor:
    """``A_t = delta_t + c_t A_{t+1}`` solved backwards, one step at a time."""
    advantages = torch.empty_like(deltas)  # (T, N)
    next_advantage = torch.zeros_like(deltas[0])  # (N,)
    for t in reversed(range(deltas.shape[0])):
        next_advantage = deltas[t] + continues[t] * next_advantage
        advantages[t] = next_advantage
    return advantages


def _scan(deltas: Tensor, continues: Tensor) -> Tensor:
    """``A_t = delta_t + c_t A_{t+1}`` by recursive doubling: after pass k, ``A_t`` holds the sum over
    the next 2^k steps and ``C_t`` the product of their factors, and one pass combines each step with the
    one 2^k ahead."""
    horizon = deltas.shape[0]
    advantages, factors, shift = deltas, continues, 1
    while shift < horizon:
        ahead = torch.addcmul(advantages[:-shift], factors[:-shift], advantages[shift:])
        advantages = torch.cat((ahead, advantages[-shift:]))
        if 2 * shift < horizon:  # the last pass needs no products
            factors = torch.cat((factors[:-shift] * factors[shift:], factors[-shift:]))
        shift *= 2
    return advantages


SCAN_MAX_ENVS = 1024
"""Above this many sub-envs on a CPU, :func:`compute_gae` with ``scan`` runs the loop: each of its T ops is
then large enough that its overhead no longer dominates, and the scan's log2(T) passes over all T x N
values cost more (measured: 4 envs x 128 steps 1.9 ms -> 0.15 ms, 1024 x 32 0.54 -> 0.43 ms, 4096 x 16 0.43 ->
0.50 ms, 65536 x 16 1.9 -> 18 ms)."""
