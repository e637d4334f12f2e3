"""Storage on the training device: on-policy rollouts with GAE, and the off-policy replay buffer.

Everything stays on one device as preallocated tensors: writing a step is a few ``copy_`` calls
and computing advantages is a short loop of elementwise kernels, with no host synchronisation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from phalanx.buffer_memory import ReplayMemory, check_memory, replay_layout, transition_bytes
from phalanx.errors import CheckpointError, ConfigError
from phalanx.nets import is_image_space

Tensor = torch.Tensor


def observation_dtype(space: gym.Space) -> torch.dtype:
    """The dtype buffers store observations of ``space`` in: the space's own (uint8 images stay uint8, one
    byte a pixel; bool and integer observations as they come), float32 for a Dict (the VecEnv presents its
    observations as flat float32 vectors) and for a space without a dtype."""
    if isinstance(space, gym.spaces.Dict) or space.dtype is None:
        return torch.float32
    return torch.from_numpy(np.empty(0, dtype=space.dtype)).dtype


class RolloutBuffer:
    """One on-policy rollout: ``horizon`` T steps of ``num_envs`` N environments.

    Fields (all preallocated on ``device``):

    - ``obs`` ``(T, N, *obs_shape)`` ``obs_dtype`` (float32 by default; uint8 images stay uint8): the
      observation each action was taken from.
    - ``actions`` ``(T, N, *action_shape)``: int64 for discrete actions, float32 for continuous.
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
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: str | torch.device,
        obs_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.horizon = horizon
        self.num_envs = num_envs
        self.obs_shape = tuple(obs_shape)
        self.action_shape = tuple(action_shape)
        self.action_dtype = action_dtype
        self.obs_dtype = obs_dtype
        self.device = torch.device(device)
        steps = (horizon, num_envs)
        float32 = dict(dtype=torch.float32, device=self.device)
        # (T, N, *obs_shape)
        self.obs = torch.zeros(*steps, *self.obs_shape, dtype=obs_dtype, device=self.device)
        self.actions = torch.zeros(*steps, *self.action_shape, dtype=action_dtype, device=self.device)
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
            f"RolloutBuffer(horizon={self.horizon}, num_envs={self.num_envs}, obs_shape={self.obs_shape}, "
            f"action_shape={self.action_shape}, action_dtype={self.action_dtype}, "
            f"obs_dtype={self.obs_dtype}, device={self.device})"
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
    deltas, continues = _gae_terms(rewards, values, next_values, terminated, dones, gamma, gae_lambda)
    horizon = values.shape[0]
    advantages = torch.empty_like(values)  # (T, N)
    next_advantage = torch.zeros_like(values[0])  # (N,)
    for t in reversed(range(horizon)):
        next_advantage = deltas[t] + continues[t] * next_advantage
        advantages[t] = next_advantage
    return advantages, advantages + values


def compute_gae_scan(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    dones: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """:func:`compute_gae` in ~4 log2(T) ops rather than ~5 T: equal within float rounding (the sums are
    added in another order), for the compiled update, whose speed the T small ops of the loop bound.

    The recursion ``A_t = delta_t + c_t A_{t+1}`` is a linear scan; recursive doubling solves it: after
    pass k, ``A_t`` holds the sum over the next 2^k steps and ``C_t`` the product of their factors, and one
    pass combines each step with the one 2^k ahead. Each pass touches all T x N values, so where the
    loop's ops are large already (more than ``SCAN_MAX_ENVS`` sub-envs on a CPU) the loop runs instead.
    """
    if values.device.type == "cpu" and values[0].numel() > SCAN_MAX_ENVS:
        return compute_gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda)
    deltas, continues = _gae_terms(rewards, values, next_values, terminated, dones, gamma, gae_lambda)
    horizon = values.shape[0]
    advantages, factors, shift = deltas, continues, 1
    while shift < horizon:
        ahead = torch.addcmul(advantages[:-shift], factors[:-shift], advantages[shift:])
        advantages = torch.cat((ahead, advantages[-shift:]))
        if 2 * shift < horizon:  # the last pass needs no products
            factors = torch.cat((factors[:-shift] * factors[shift:], factors[-shift:]))
        shift *= 2
    return advantages, advantages + values


SCAN_MAX_ENVS = 1024
"""Above this many sub-envs on a CPU, :func:`compute_gae_scan` runs the loop: each of its T ops is then
large enough that its overhead no longer dominates, and the scan's log2(T) passes over all T x N values
cost more (measured: 4 envs x 128 steps 1.9 ms -> 0.15 ms, 1024 x 32 0.54 -> 0.43 ms, 4096 x 16 0.43 ->
0.50 ms, 65536 x 16 1.9 -> 18 ms)."""


def _gae_terms(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    dones: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """GAE's ``(T, N)`` TD errors ``delta_t`` and recursion factors ``gamma * lambda * (1 - done_t)``."""
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape == dones.shape):
        raise ValueError(
            "compute_gae: rewards, values, next_values, terminated and dones must all be (T, N); got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(next_values.shape)}, "
            f"{tuple(terminated.shape)}, {tuple(dones.shape)}."
        )
    not_terminated = 1.0 - terminated.to(values.dtype)  # (T, N)
    continues = gamma * gae_lambda * (1.0 - dones.to(values.dtype))  # (T, N)
    deltas = rewards + gamma * next_values * not_terminated - values  # (T, N)
    return deltas, continues


# -- off-policy -------------------------------------------------------------------------------------


@dataclass
class ReplayBatch:
    """A sampled batch; ``rewards`` and ``discounts`` already fold in n-step returns.

    The TD target is ``rewards + discounts * V(next_obs)``: ``discounts`` is ``gamma**k`` for a
    k-step return that reached ``next_obs`` and 0 where the episode terminated on the way.
    """

    obs: Tensor  # (B, *obs_shape)
    actions: Tensor  # (B, *action_shape)
    rewards: Tensor  # (B,)
    next_obs: Tensor  # (B, *obs_shape)
    discounts: Tensor  # (B,)


@dataclass
class NStepWindow:
    """Where a batch of n-step transitions lies in a time-major ring ``(slots, N, ...)``, and its discounts.

    The single- and multi-agent replay buffers both sample through it: transition i starts at slot
    ``start[i]`` of sub-env ``env[i]`` and runs ``n_step`` slots or up to its episode's end, whichever
    comes first; ``last[i]`` is the slot of its last step (whose ``next_obs`` it bootstraps from).
    """

    start: Tensor  # (B,) first slot
    env: Tensor  # (B,) sub-env
    last: Tensor  # (B,) last slot taken
    steps: Tensor  # (B, n) the n slots from start on
    weights: Tensor  # (B, n) gamma**j for the steps taken, 0 after an episode end
    discounts: Tensor  # (B,) gamma**k of the bootstrap after k steps, 0 where the episode terminated

    @classmethod
    def sample(
        cls,
        ring: Any,
        batch_size: int,
        gamma: float,
        n_step: int,
        terminated: Tensor,
        truncated: Tensor,
        owner: str,
    ) -> NStepWindow:
        """Uniform windows in ``ring`` (with ``slots``, ``filled``, ``position``, ``num_envs``, ``device``):
        a start slot is drawn only if its ``n_step`` slots are all written and in order."""
        valid = ring.filled - n_step + 1
        if valid < 1:
            raise ValueError(f"{owner}.sample: {len(ring)} transitions stored, need {n_step} steps.")
        device = ring.device
        oldest = (ring.position - ring.filled) % ring.slots
        start = (oldest + torch.randint(valid, (batch_size,), device=device)) % ring.slots  # (B,)
        env = torch.randint(ring.num_envs, (batch_size,), device=device)
        if n_step == 1:  # the common case, without the window's gathers
            discounts = gamma * (~terminated[start, env]).float()
            ones = torch.ones(batch_size, 1, device=device)
            return cls(start, env, start, start.unsqueeze(1), ones, discounts)
        steps = (start.unsqueeze(1) + torch.arange(n_step, device=device)) % ring.slots  # (B, n)
        envs = env.unsqueeze(1).expand(-1, n_step)
        ended = terminated[steps, envs] | truncated[steps, envs]  # (B, n)
        # alive[:, j]: no episode end before step j, so step j's reward belongs to this return
        alive = torch.cumprod(
            torch.cat([torch.ones_like(ended[:, :1]), ~ended[:, :-1]], dim=1).float(), dim=1
        )
        powers = gamma ** torch.arange(n_step, device=device, dtype=torch.float32)  # (n,)
        taken = alive.sum(dim=1).long()  # (B,) steps in the window, >= 1
        last = steps.gather(1, (taken - 1).unsqueeze(1)).squeeze(1)
        discounts = gamma ** taken.float() * (~terminated[last, env]).float()
        return cls(start, env, last, steps, alive * powers, discounts)

    def returns(self, rewards: Tensor) -> Tensor:
        """The discounted n-step reward sums ``(B, ...)`` of per-slot rewards ``(slots, N, ...)``."""
        if self.steps.shape[1] == 1:
            return rewards[self.start, self.env]
        window = rewards[self.steps, self.env.unsqueeze(1)]  # (B, n, ...)
        weights = self.weights.view(*self.weights.shape, *([1] * (window.dim() - 2)))
        return (window * weights).sum(dim=1)


class ReplayRing:
    """What both replay buffers share: a time-major ring of ``slots`` steps of ``num_envs`` sub-envs, its
    actions, rewards and episode flags, the n-step sampling and the checkpoint state. A subclass says how
    it stores observations (:meth:`stored_obs`, :meth:`stored_next_obs`) and lists its tensors in
    ``FIELDS``."""

    FIELDS: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        device: str | torch.device,
        obs_dtype: torch.dtype,
    ) -> None:
        self.device = torch.device(device)
        self.num_envs = num_envs
        self.slots = max(capacity // num_envs, 1)
        self.capacity = self.slots * num_envs
        self.obs_shape = tuple(obs_shape)
        self.action_shape = tuple(action_shape)
        self.obs_dtype = obs_dtype

    def allocate_steps(self, action_dtype: torch.dtype) -> None:
        """The ``(slots, N, ...)`` actions, rewards and episode flags, and an empty ring."""
        shape = (self.slots, self.num_envs)
        self.actions = torch.zeros(*shape, *self.action_shape, dtype=action_dtype, device=self.device)
        self.rewards = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.terminated = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.position = 0  # the slot written next
        self.filled = 0  # slots held, at most self.slots

    @property
    def nbytes(self) -> int:
        """Device memory held by the buffer, in bytes."""
        return sum(getattr(self, name).nbytes for name in self.FIELDS)

    def __len__(self) -> int:
        return self.filled * self.num_envs

    def store_step(self, actions: Tensor, rewards: Tensor, terminated: Tensor, truncated: Tensor) -> None:
        """Write a step's actions, rewards and flags to the slot written next, and move on to the next."""
        slot = self.position
        self.actions[slot].copy_(actions)
        self.rewards[slot].copy_(rewards)
        self.terminated[slot].copy_(terminated)
        self.truncated[slot].copy_(truncated)
        self.position = (slot + 1) % self.slots
        self.filled = min(self.filled + 1, self.slots)

    def stored_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        """The ``obs`` of the transitions at ``slots`` of sub-envs ``envs`` (both ``(B,)``)."""
        raise NotImplementedError

    def stored_next_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        """The ``next_obs`` of the transitions at ``slots`` of sub-envs ``envs`` (both ``(B,)``)."""
        raise NotImplementedError

    def sample(self, batch_size: int, gamma: float, n_step: int = 1) -> ReplayBatch:
        """A uniform batch of ``n_step``-step transitions (n-step returns stop at an episode end)."""
        window = NStepWindow.sample(
            self, batch_size, gamma, n_step, self.terminated, self.truncated, type(self).__name__
        )
        return ReplayBatch(
            self.stored_obs(window.start, window.env),
            self.actions[window.start, window.env],
            window.returns(self.rewards),
            self.stored_next_obs(window.last, window.env),
            window.discounts,
        )

    def state_dict(self) -> dict[str, Any]:
        state = {name: getattr(self, name).clone() for name in self.FIELDS}
        state.update(position=self.position, filled=self.filled)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy what :meth:`state_dict` returned into this buffer (shapes checked, dtypes converted)."""
        load_fields(self, state, self.FIELDS, type(self).__name__)
        self.position = int(state["position"])
        self.filled = int(state["filled"])


class ReplayBuffer(ReplayRing):
    """A ring of past transitions on the training device, fed one VecEnv step (N rows) at a time.

    Storage is time-major, ``(slots, N, ...)`` with ``slots = capacity // N``, so each sub-env's
    transitions stay in order and n-step returns are a gather along the time axis. ``next_obs`` is the
    true next observation (the env's ``final_obs`` where an episode ended), and ``terminated`` is kept
    apart from ``truncated``: a TD target bootstraps through a time limit, never through a terminal
    state. Sampling draws indices with ``torch.randint`` on the device: no host round trip.

    Observations are stored in ``obs_dtype`` (uint8 images stay uint8). For images,
    :class:`CompactReplayBuffer` stores each observation (or each frame of a stack) once instead of twice
    (or 8 times); :func:`make_replay_buffer` chooses.
    """

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: str | torch.device,
        obs_dtype: torch.dtype = torch.float32,
        members: int = 1,
    ) -> None:
        """``members``: the buffer holds a population's members' transitions together (the memory
        check's error then says to use fewer members)."""
        super().__init__(capacity, num_envs, obs_shape, action_shape, device, obs_dtype)
        check_memory(
            self.memory(capacity, num_envs, obs_shape, action_shape, action_dtype, device, obs_dtype), members
        )
        self.obs = torch.zeros(self.slots, num_envs, *self.obs_shape, dtype=obs_dtype, device=self.device)
        self.next_obs = torch.zeros_like(self.obs)
        self.allocate_steps(action_dtype)

    @staticmethod
    def bytes_needed(
        capacity: int,
        obs_shape: tuple,
        action_shape: tuple,
        action_dtype: torch.dtype,
        obs_dtype: torch.dtype = torch.float32,
    ) -> int:
        obs = obs_dtype.itemsize * math.prod(obs_shape)
        return capacity * (2 * obs + transition_bytes(action_shape, action_dtype))

    @classmethod
    def memory(
        cls,
        capacity: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: str | torch.device,
        obs_dtype: torch.dtype = torch.float32,
    ) -> ReplayMemory:
        """What a buffer built with these arguments takes, without allocating it."""
        capacity = max(capacity // num_envs, 1) * num_envs
        obs_shape, action_shape = tuple(obs_shape), tuple(action_shape)
        needed = cls.bytes_needed(capacity, obs_shape, action_shape, action_dtype, obs_dtype)
        return ReplayMemory(needed, capacity, replay_layout(obs_shape, action_shape), torch.device(device))

    def add(
        self,
        obs: Tensor,
        actions: Tensor,
        rewards: Tensor,
        next_obs: Tensor,
        terminated: Tensor,
        truncated: Tensor,
    ) -> None:
        """Store one step of every sub-env: each argument has a leading ``num_envs`` dimension."""
        self.obs[self.position].copy_(obs)
        self.next_obs[self.position].copy_(next_obs)
        self.store_step(actions, rewards, terminated, truncated)

    def stored_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.obs[slots, envs]

    def stored_next_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.next_obs[slots, envs]


def load_fields(buffer: Any, state: dict[str, Any], fields: Sequence[str], owner: str) -> None:
    """Copy ``state[name]`` into ``buffer.name`` for each of ``fields``, after checking every shape (a
    CheckpointError naming the field otherwise); dtypes are converted by the copy."""
    missing = [name for name in fields if name not in state]
    if missing:
        raise CheckpointError(
            f"{owner} state is missing {missing}; it has {sorted(state)}. The checkpoint was written by "
            "another kind of replay buffer."
        )
    for name in fields:
        storage, value = getattr(buffer, name), state[name]
        if value.shape != storage.shape:
            raise CheckpointError(
                f"{owner} state {name!r} is {tuple(value.shape)}, but this buffer holds "
                f"{tuple(storage.shape)}; the checkpoint was written with another buffer_size, "
                "num_envs or observation space."
            )
    for name in fields:
        getattr(buffer, name).copy_(state[name])


class CompactReplayBuffer(ReplayRing):
    """A replay buffer that stores each observation once, and each frame of stacked frames once: for
    images, as exact as :class:`ReplayBuffer` in a fraction of its memory.

    A :class:`ReplayBuffer` stores every observation twice (as the ``obs`` of a step and as the
    ``next_obs`` of the step before), and with ``k`` stacked frames each frame ``2k`` times. Here each
    sub-env has a ring of frame rows, written in order; an observation is the ``k`` consecutive rows ending
    at its *serial* (the count of rows the sub-env had written when it ended), and a transition stores the
    serials of its ``obs`` and ``next_obs``. Adding a step writes only what the rows do not hold yet:

    - ``obs`` equal to the observation stored last (the ``next_obs`` of the sub-env's previous step, as
      the VecEnv contract has it): nothing; equal to it shifted by one frame: that new frame; else all
      ``k`` (an episode's first observation);
    - ``next_obs`` against ``obs`` likewise: one frame in a running episode of stacked frames (or the whole
      observation, with ``k = 1``), and the final observation of an episode that ended gets its own row
      like any other, where a ReplayBuffer that leaves ``next_obs`` out would have lost it.

    Nothing is assumed: each step is compared with what is stored (a few elementwise ops on the device), so
    any data reads back exactly as added, and ``sample`` returns, for the same random draws, the very
    batch a :class:`ReplayBuffer` of the same capacity returns (it samples through the same
    :class:`NStepWindow`; the stacks are rebuilt by one gather). A run of stacked frames costs one row per
    transition plus ``k`` per episode; plain observations one row per transition plus one per episode.

    The rows are ``slots + slots // 8 + 2k`` per sub-env: room for the episodes' extra rows as long as
    they average at least ``8k`` steps (8 for plain observations, 32 for Atari's 4 frames). Where they
    run out, the oldest transitions, whose rows were written over, leave the buffer (``len`` says how many
    remain; :meth:`sample` finds them with one host synchronisation): the buffer then holds fewer than
    ``capacity`` transitions, each still exact. ``stacked_frames = k > 1`` requires observations
    ``(k, ...)``: the frames along the first axis, as Atari's ``(4, 84, 84)``.
    """

    FIELDS = (
        "frames",
        "obs_serial",
        "next_serial",
        "actions",
        "rewards",
        "terminated",
        "truncated",
        "head",
        "last",
    )

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: str | torch.device,
        obs_dtype: torch.dtype = torch.uint8,
        stacked_frames: int = 1,
    ) -> None:
        super().__init__(capacity, num_envs, obs_shape, action_shape, device, obs_dtype)
        if stacked_frames < 1 or (stacked_frames > 1 and self.obs_shape[:1] != (stacked_frames,)):
            raise ConfigError(
                f"CompactReplayBuffer: stacked_frames = {stacked_frames} needs observations of shape "
                f"({stacked_frames}, ...) (the frames along the first axis), but they are {self.obs_shape}. "
                "Use stacked_frames = 1 (each observation stored whole)."
            )
        self.stacked_frames = stacked_frames
        self.frame_shape = self.obs_shape[1:] if stacked_frames > 1 else self.obs_shape
        self.rows = self.rows_per_env(self.slots, stacked_frames)
        check_memory(
            self.memory(
                capacity, num_envs, obs_shape, action_shape, action_dtype, device, obs_dtype, stacked_frames
            )
        )
        shape = (self.slots, num_envs)
        # the row after the last is written with what a step leaves out (writes stay one op per step)
        self.frames = torch.zeros(
            num_envs, self.rows + 1, *self.frame_shape, dtype=obs_dtype, device=self.device
        )
        self.obs_serial = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.next_serial = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.allocate_steps(action_dtype)
        self.head = torch.full((num_envs,), -1, dtype=torch.int64, device=self.device)
        """Per sub-env, the serial of the last row written (-1: none yet)."""
        self.last = torch.zeros(
            num_envs, stacked_frames, *self.frame_shape, dtype=obs_dtype, device=self.device
        )
        """Per sub-env, the observation stored last (the rows ending at ``head``), which the next is
        compared with."""
        self.margin = -1
        """Rows every sub-env can still write before the oldest held observation is written over, as of
        the last check, less the most each add since may have written (2k): :meth:`drop_overwritten` checks
        again (a host synchronisation) only once it is negative."""
        # Frames are copied and compared as whole machine words (the widest integer that divides a frame's
        # bytes): index_select and index_copy_ of a CPU tensor take ~10x less time per frame than on bytes.
        frame_bytes = obs_dtype.itemsize * math.prod(self.frame_shape)
        self.word = next(dtype for dtype in WORDS if frame_bytes % dtype.itemsize == 0)
        self.frame_words = self.words(self.frames)  # (N * (rows + 1), W): a view of the frames
        self.last_words = self.words(self.last).view(num_envs, stacked_frames, -1)  # (N, k, W), a view
        self.env_rows = torch.arange(num_envs, device=self.device).unsqueeze(1) * (self.rows + 1)  # (N, 1)
        self.frame_offsets = torch.arange(1 - stacked_frames, 1, device=self.device)  # (k,)
        self.frame_index = torch.arange(stacked_frames, device=self.device)  # (k,)

    @staticmethod
    def rows_per_env(slots: int, stacked_frames: int) -> int:
        """Frame rows per sub-env: one per transition, an eighth more for the episodes' first frames."""
        return slots + slots // 8 + 2 * stacked_frames

    @classmethod
    def bytes_needed(
        cls,
        slots: int,
        num_envs: int,
        obs_shape: tuple,
        action_shape: tuple,
        action_dtype: torch.dtype,
        obs_dtype: torch.dtype,
        stacked_frames: int,
    ) -> int:
        frame = obs_dtype.itemsize * math.prod(obs_shape) // stacked_frames
        rows = cls.rows_per_env(slots, stacked_frames) + 1  # and the spare row
        per_transition = 2 * 8 + transition_bytes(action_shape, action_dtype)  # two int64 serials
        # and per sub-env the int64 head and the last observation
        return num_envs * (rows * frame + slots * per_transition + 8 + stacked_frames * frame)

    @classmethod
    def memory(
        cls,
        capacity: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: str | torch.device,
        obs_dtype: torch.dtype = torch.uint8,
        stacked_frames: int = 1,
    ) -> ReplayMemory:
        """What a buffer built with these arguments takes, without allocating it."""
        slots = max(capacity // num_envs, 1)
        obs_shape, action_shape = tuple(obs_shape), tuple(action_shape)
        needed = cls.bytes_needed(
            slots, num_envs, obs_shape, action_shape, action_dtype, obs_dtype, stacked_frames
        )
        return ReplayMemory(
            needed, slots * num_envs, replay_layout(obs_shape, action_shape), torch.device(device)
        )

    def __len__(self) -> int:
        self.drop_overwritten()
        return super().__len__()

    def add(
        self,
        obs: Tensor,
        actions: Tensor,
        rewards: Tensor,
        next_obs: Tensor,
        terminated: Tensor,
        truncated: Tensor,
    ) -> None:
        """Store one step of every sub-env: each argument has a leading ``num_envs`` dimension (no host
        synchronisation)."""
        stacks = (self.num_envs, self.stacked_frames, -1)
        obs_words = self.words(obs.to(self.obs_dtype)).view(stacks)  # (N, k, W)
        next_words = self.words(next_obs.to(self.obs_dtype)).view(stacks)
        obs_new = torch.where(self.head < 0, self.stacked_frames, self.new_frames(self.last_words, obs_words))
        obs_serial = self.head + obs_new  # (N,)
        next_serial = obs_serial + self.new_frames(obs_words, next_words)
        self.write(obs_words, obs_serial, obs_new)
        self.write(next_words, next_serial, next_serial - obs_serial)
        self.head = next_serial
        self.last_words.copy_(next_words)
        self.obs_serial[self.position] = obs_serial
        self.next_serial[self.position] = next_serial
        self.store_step(actions, rewards, terminated, truncated)
        self.margin -= 2 * self.stacked_frames

    def words(self, tensor: Tensor) -> Tensor:
        """``tensor`` (frames of the observation dtype, contiguous) as rows of machine words ``(-1, W)``."""
        rows = tensor.numel() // math.prod(self.frame_shape)
        return tensor.reshape(rows, -1).view(torch.uint8).view(self.word)

    def new_frames(self, previous: Tensor, current: Tensor) -> Tensor:
        """Per sub-env, the frames of ``current`` to write after ``previous`` (both ``(N, k, W)`` words): 0
        if they are equal, 1 if ``current`` is ``previous`` moved on by one frame, else k."""
        equal = (current == previous).flatten(1).all(dim=1)
        if self.stacked_frames == 1:
            return (~equal).long()
        shifted = (current[:, :-1] == previous[:, 1:]).flatten(1).all(dim=1)
        return torch.where(equal, 0, torch.where(shifted, 1, self.stacked_frames))

    def write(self, stacks: Tensor, serials: Tensor, new: Tensor) -> None:
        """Write the last ``new[i]`` frames of ``stacks[i]`` (``(N, k, W)`` words) to the rows ending at
        ``serials[i]``; the other frames go to the spare row (one index_copy_, whatever ``new`` is)."""
        keep = self.frame_index >= self.stacked_frames - new.unsqueeze(1)  # (N, k): the newest new[i]
        rows = torch.where(keep, self.frame_rows(serials), self.rows)  # (N, k)
        self.frame_words.index_copy_(0, (self.env_rows + rows).flatten(), stacks.flatten(0, 1))

    def frame_rows(self, serials: Tensor) -> Tensor:
        """The ring rows ``(..., k)`` of the observations ending at ``serials`` ``(...)``."""
        return (serials.unsqueeze(-1) + self.frame_offsets) % self.rows

    def observations(self, serials: Tensor, envs: Tensor) -> Tensor:
        """The observations ``(B, *obs_shape)`` ending at ``serials`` of sub-envs ``envs`` (both ``(B,)``)."""
        rows = self.env_rows[envs] + self.frame_rows(serials)  # (B, k)
        words = self.frame_words.index_select(0, rows.flatten())  # (B * k, W)
        return words.view(torch.uint8).view(self.obs_dtype).view(-1, *self.obs_shape)

    def stored_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.observations(self.obs_serial[slots, envs], envs)

    def stored_next_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.observations(self.next_serial[slots, envs], envs)

    def sample(self, batch_size: int, gamma: float, n_step: int = 1) -> ReplayBatch:
        """A uniform batch of ``n_step``-step transitions, exactly as :meth:`ReplayBuffer.sample` draws it
        (the transitions whose rows were written over dropped first)."""
        self.drop_overwritten()
        return super().sample(batch_size, gamma, n_step)

    def drop_overwritten(self) -> None:
        """Drop the oldest transitions whose rows were written over (episodes shorter than the rows allow
        for). A host synchronisation once the rows written since the last check could have reached the
        oldest held observation (with Atari's episodes, every few thousand adds), and a binary search of a
        few more where some were."""
        if self.filled == 0 or self.margin >= 0:
            return
        if self.rows_left(0) < 0:
            broken, whole = 0, self.filled - 1  # the newest transition is always whole
            while whole - broken > 1:
                middle = (broken + whole) // 2
                broken, whole = (middle, whole) if self.rows_left(middle) < 0 else (broken, middle)
            self.filled -= whole
        self.margin = self.rows_left(0)

    def rows_left(self, age: int) -> int:
        """The rows every sub-env can still write before the ``age``-th oldest slot's observation is
        written over; negative where it already is, in some sub-env (serials only grow along a sub-env's
        slots, so the later slots' observations are then still whole)."""
        slot = (self.position - self.filled + age) % self.slots
        oldest_row = self.obs_serial[slot] + 1 - self.stacked_frames  # (N,)
        return int((oldest_row - 1 - (self.head - self.rows)).min())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stacked_frames": self.stacked_frames}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "stacked_frames" not in state:
            raise CheckpointError(
                f"CompactReplayBuffer state has {sorted(state)}, not the frames of a compact replay: the "
                "checkpoint was written by another kind of replay buffer (resume it with its own version "
                "of phalanx, or without its buffer: save_buffer = false)."
            )
        if state["stacked_frames"] != self.stacked_frames:
            raise CheckpointError(
                f"CompactReplayBuffer state has stacked_frames = {state['stacked_frames']}, but this "
                f"buffer stacks {self.stacked_frames}; resume with the observation space and frame stacking "
                "the checkpoint was written with."
            )
        super().load_state_dict(state)
        self.margin = -1


WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)
"""The integer types :class:`CompactReplayBuffer` moves frames as, widest first."""


def make_replay_buffer(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_shape: Sequence[int],
    action_dtype: torch.dtype,
    device: str | torch.device,
    stacked_frames: int = 1,
) -> ReplayBuffer | CompactReplayBuffer:
    """The replay buffer for observations of ``observation_space``: a :class:`CompactReplayBuffer` for
    images (each observation stored once; with ``stacked_frames = k > 1``, each of the k frames stacked
    along their first axis once), else a :class:`ReplayBuffer`; observations in the space's dtype."""
    buffer_class, arguments = replay_choice(
        capacity, num_envs, observation_space, action_shape, action_dtype, device, stacked_frames
    )
    return buffer_class(*arguments)


def replay_memory(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_shape: Sequence[int],
    action_dtype: torch.dtype,
    device: str | torch.device,
    stacked_frames: int = 1,
) -> ReplayMemory:
    """What the buffer :func:`make_replay_buffer` builds from the same arguments takes, without allocating
    it (a population checks that the buffers its members hold at once fit together)."""
    buffer_class, arguments = replay_choice(
        capacity, num_envs, observation_space, action_shape, action_dtype, device, stacked_frames
    )
    return buffer_class.memory(*arguments)


def replay_choice(
    capacity: int,
    num_envs: int,
    observation_space: gym.Space,
    action_shape: Sequence[int],
    action_dtype: torch.dtype,
    device: str | torch.device,
    stacked_frames: int,
) -> tuple[type[ReplayBuffer] | type[CompactReplayBuffer], tuple]:
    """The buffer class for observations of ``observation_space`` and the arguments its constructor and
    its ``memory`` take (the same, in the same order)."""
    obs_dtype = observation_dtype(observation_space)
    obs_shape = tuple(observation_space.shape)
    arguments = (capacity, num_envs, obs_shape, action_shape, action_dtype, device, obs_dtype)
    if is_image_space(observation_space):
        return CompactReplayBuffer, (*arguments, stacked_frames)
    if stacked_frames != 1:
        raise ConfigError(
            f"stacked_frames = {stacked_frames} shares the frames of image observations, but the "
            f"observation space {observation_space} is not an image space. Use stacked_frames = 1."
        )
    return ReplayBuffer, arguments
