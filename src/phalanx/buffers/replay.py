"""Off-policy storage: the ring of past transitions on the training device and how it is sampled.

:class:`ReplayRing` is the one base of both single-agent replays (the ring of actions, rewards and
episode flags, n-step sampling through :class:`NStepWindow`, the checkpoint state); :class:`ReplayBuffer`
stores each transition's ``obs`` and ``next_obs`` whole. Sampling draws indices with ``torch.randint`` on
the device: no host round trip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from phalanx.buffers.layout import Device, StepLayout
from phalanx.buffers.memory import ReplayMemory, check_memory, replay_layout, transition_bytes
from phalanx.errors import CheckpointError

Tensor = torch.Tensor


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


class ReplayRing:
    """What both replay buffers share: a time-major ring of ``slots`` steps of ``num_envs`` sub-envs, each
    step stored as a :class:`StepLayout` says, its actions, rewards and episode flags, adding a step, the
    n-step sampling and the checkpoint state. A subclass says how it stores observations
    (:meth:`store_obs`, :meth:`stored_obs`, :meth:`stored_next_obs`) and lists its tensors in ``FIELDS``."""

    FIELDS: ClassVar[tuple[str, ...]]

    def __init__(self, capacity: int, num_envs: int, layout: StepLayout, device: Device) -> None:
        self.device = torch.device(device)
        self.num_envs = num_envs
        self.slots = max(capacity // num_envs, 1)
        self.capacity = self.slots * num_envs
        self.layout = layout
        self.obs_shape, self.obs_dtype = layout.obs_shape, layout.obs_dtype
        self.action_shape, self.action_dtype = layout.action_shape, layout.action_dtype

    def allocate_steps(self) -> None:
        """The ``(slots, N, ...)`` actions, rewards and episode flags, and an empty ring."""
        shape = (self.slots, self.num_envs)
        self.actions = torch.zeros(*shape, *self.action_shape, dtype=self.action_dtype, device=self.device)
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
        self.store_obs(obs, next_obs)
        self.store_step(actions, rewards, terminated, truncated)

    def store_obs(self, obs: Tensor, next_obs: Tensor) -> None:
        """Write a step's ``obs`` and ``next_obs`` ``(N, *obs_shape)`` for the slot written next."""
        raise NotImplementedError

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

    Each step is stored as ``layout`` says: observations in its ``obs_dtype`` (uint8 images stay uint8).
    For images, :class:`CompactReplayBuffer` stores each observation (or each frame of a stack) once
    instead of twice (or 8 times); :func:`replay_choice` chooses.
    """

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")

    def __init__(
        self, capacity: int, num_envs: int, layout: StepLayout, device: Device, members: int = 1
    ) -> None:
        """``members``: the buffer holds a population's members' transitions together (the memory
        check's error then says to use fewer members)."""
        super().__init__(capacity, num_envs, layout, device)
        check_memory(self.memory(capacity, num_envs, layout, device), members)
        self.obs = torch.zeros(
            self.slots, num_envs, *self.obs_shape, dtype=self.obs_dtype, device=self.device
        )
        self.next_obs = torch.zeros_like(self.obs)
        self.allocate_steps()

    @staticmethod
    def bytes_needed(capacity: int, layout: StepLayout) -> int:
        obs = layout.obs_dtype.itemsize * math.prod(layout.obs_shape)
        return capacity * (2 * obs + transition_bytes(layout.action_shape, layout.action_dtype))

    @classmethod
    def memory(cls, capacity: int, num_envs: int, layout: StepLayout, device: Device) -> ReplayMemory:
        """What a buffer built with these arguments takes, without allocating it."""
        capacity = max(capacity // num_envs, 1) * num_envs
        needed = cls.bytes_needed(capacity, layout)
        return ReplayMemory(
            needed, capacity, replay_layout(layout.obs_shape, layout.action_shape), torch.device(device)
        )

    def store_obs(self, obs: Tensor, next_obs: Tensor) -> None:
        self.obs[self.position].copy_(obs)
        self.next_obs[self.position].copy_(next_obs)

    def stored_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.obs[slots, envs]

    def stored_next_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.next_obs[slots, envs]
