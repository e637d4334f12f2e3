"""Multi-agent storage on the training device: the on-policy rollout and the replay buffer.

Both hold the same kinds of fields as their single-agent counterparts in :mod:`phalanx.buffers`, per
agent group (agent axis after the env axis) plus the global state, preallocated as one tensor per
field and group. A field of a group is keyed ``"<field>/<group>"`` in checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from phalanx.buffers import NStepWindow
from phalanx.buffers.memory import ReplayMemory, check_memory
from phalanx.errors import CheckpointError
from phalanx.marl.core import Groups, MultiAgentSpec, Tensor

PER_AGENT_FIELDS = (
    "obs",
    "actions",
    "rewards",
    "next_obs",
    "log_probs",
    "values",
    "action_mask",
    "next_action_mask",
)


def _layout(spec: MultiAgentSpec, fields: tuple[str, ...]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{key: (shape after the leading dims, dtype)}`` of the named fields."""
    layout: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for field in fields:
        if field in ("state", "next_state"):
            layout[field] = ((spec.state_dim,), torch.float32)
        elif field in ("terminated", "truncated", "dones"):
            layout[field] = ((), torch.bool)
        else:
            for name, group in spec.groups.items():
                agents, action_space = group.num_agents, group.action_space
                shape: tuple[int, ...]
                if field in ("obs", "next_obs"):
                    shape, dtype = (agents, int(group.observation_space.shape[0])), torch.float32
                elif field == "actions":
                    if isinstance(action_space, gym.spaces.Discrete):  # group.discrete
                        shape, dtype = (agents,), torch.int64
                    else:
                        shape, dtype = (agents, int(action_space.shape[0])), torch.float32
                elif field in ("action_mask", "next_action_mask"):
                    if not (spec.has_action_mask and isinstance(action_space, gym.spaces.Discrete)):
                        continue
                    shape, dtype = (agents, int(action_space.n)), torch.bool
                else:  # rewards, log_probs, values
                    shape, dtype = (agents,), torch.float32
                layout[f"{field}/{name}"] = (shape, dtype)
    return layout


class _Storage:
    """Named tensors ``(*leading, ...)`` built from a layout; group fields read back as dicts."""

    def __init__(
        self, spec: MultiAgentSpec, fields: tuple[str, ...], leading: tuple[int, ...], device
    ) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.layout = _layout(spec, fields)
        self.tensors = {
            key: torch.zeros((*leading, *shape), dtype=dtype, device=self.device)
            for key, (shape, dtype) in self.layout.items()
        }

    def field(self, field: str) -> Tensor | Groups | None:
        """A plain field's tensor, a per-agent field's ``{group: tensor}``, or None if absent."""
        if field in self.tensors:
            return self.tensors[field]
        groups = {
            name: self.tensors[f"{field}/{name}"]
            for name in self.spec.groups
            if f"{field}/{name}" in self.tensors
        }
        return groups or None

    def write(self, index: Any, values: dict[str, Tensor | Groups | None]) -> None:
        for field, value in values.items():
            if value is None:
                continue
            if isinstance(value, dict):
                for name, tensor in value.items():
                    self._copy(f"{field}/{name}", index, tensor)
            else:
                self._copy(field, index, value)

    def _copy(self, key: str, index: Any, value: Tensor) -> None:
        storage = self.tensors[key][index]
        if value.shape != storage.shape:
            raise ValueError(
                f"{type(self).__name__}: {key} has shape {tuple(value.shape)}, "
                f"expected {tuple(storage.shape)}."
            )
        storage.copy_(value)

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors.values())

    def state_dict(self) -> dict[str, Any]:
        return {key: tensor.clone() for key, tensor in self.tensors.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, tensor in self.tensors.items():
            value = state.get(key)
            if value is None or value.shape != tensor.shape or value.dtype != tensor.dtype:
                found = "missing" if value is None else f"{tuple(value.shape)} {value.dtype}"
                raise CheckpointError(
                    f"{type(self).__name__} state {key!r} is {found}, but this buffer holds "
                    f"{tuple(tensor.shape)} {tensor.dtype}; the checkpoint was written with other buffer "
                    "settings, num_envs or env spaces."
                )
        for key, tensor in self.tensors.items():
            tensor.copy_(state[key])


class MultiAgentRollout(_Storage):
    """One on-policy rollout: ``horizon`` T steps of ``num_envs`` N sub-envs.

    Per agent group ``(T, N, A_g, ...)``: ``obs``, ``actions``, ``log_probs``, ``values``, ``rewards``,
    ``next_obs`` (the true next observations, ``info["final_obs"]``) and, with masks, ``action_mask``.
    Per sub-env: ``state`` and ``next_state`` ``(T, N, S)``, ``terminated`` and ``dones`` ``(T, N)``.
    """

    FIELDS = (
        "obs",
        "state",
        "actions",
        "log_probs",
        "values",
        "rewards",
        "terminated",
        "dones",
        "next_obs",
        "next_state",
        "action_mask",
    )

    def __init__(self, horizon: int, num_envs: int, spec: MultiAgentSpec, device: str | torch.device) -> None:
        super().__init__(spec, self.FIELDS, (horizon, num_envs), device)
        self.horizon = horizon
        self.num_envs = num_envs

    def add(self, step: int, **values: Tensor | Groups | None) -> None:
        """Copy one step of N sub-envs into row ``step`` (fields named as :attr:`FIELDS`)."""
        self.write(step, values)

    def __getattr__(self, name: str) -> Any:
        if name in type(self).FIELDS:
            return self.field(name)
        raise AttributeError(name)


@dataclass
class MultiAgentBatch:
    """A sampled batch of multi-agent transitions; per-agent fields are dicts per group.

    The TD target of agent a is ``rewards[g][:, a] + discounts * V(next)``: ``rewards`` are the agent's
    discounted n-step sums, ``discounts`` is ``gamma**k`` for a k-step window, and 0 where the episode
    terminated (a time limit bootstraps); the ``next_*`` fields are those of the window's last step.
    """

    obs: Groups  # (B, A_g, obs_dim_g)
    state: Tensor  # (B, S)
    actions: Groups  # (B, A_g) int64 or (B, A_g, act_dim) in [-1, 1]
    rewards: Groups  # (B, A_g)
    next_obs: Groups  # (B, A_g, obs_dim_g)
    next_state: Tensor  # (B, S)
    discounts: Tensor  # (B,)
    next_action_mask: Groups | None  # (B, A_g, n) bool, where the env has masks


class MultiAgentReplayBuffer(_Storage):
    """A ring of past multi-agent transitions, ``(slots, N, ...)`` with ``slots = capacity // N``.

    Fed one VecEnv step at a time by :meth:`add`; :meth:`sample` draws uniform transitions on the device.
    """

    FIELDS = (
        "obs",
        "state",
        "actions",
        "rewards",
        "next_obs",
        "next_state",
        "terminated",
        "truncated",
        "next_action_mask",
    )

    def __init__(
        self, capacity: int, num_envs: int, spec: MultiAgentSpec, device: str | torch.device
    ) -> None:
        self.num_envs = num_envs
        self.slots = max(capacity // num_envs, 1)
        self.capacity = self.slots * num_envs
        check_memory(self.memory(capacity, num_envs, spec, device))
        super().__init__(spec, self.FIELDS, (self.slots, num_envs), device)
        self.position = 0
        self.filled = 0

    @classmethod
    def memory(
        cls, capacity: int, num_envs: int, spec: MultiAgentSpec, device: str | torch.device
    ) -> ReplayMemory:
        """What a buffer built with these arguments takes, without allocating it."""
        capacity = max(capacity // num_envs, 1) * num_envs
        per_transition = sum(
            math.prod(shape) * dtype.itemsize for shape, dtype in _layout(spec, cls.FIELDS).values()
        )
        groups = ", ".join(
            f"{name}: {group.num_agents} agents, obs ({int(group.observation_space.shape[0])},)"
            for name, group in spec.groups.items()
        )
        layout = f"{groups}; state ({spec.state_dim},)"
        return ReplayMemory(capacity * per_transition, capacity, layout, torch.device(device))

    def __len__(self) -> int:
        return self.filled * self.num_envs

    def add(self, **values: Tensor | Groups | None) -> None:
        """Store one step of every sub-env (fields named as :attr:`FIELDS`, leading dim ``num_envs``)."""
        self.write(self.position, values)
        self.position = (self.position + 1) % self.slots
        self.filled = min(self.filled + 1, self.slots)

    def sample(self, batch_size: int, gamma: float, n_step: int = 1) -> MultiAgentBatch:
        """A uniform batch of ``n_step``-step transitions (n-step returns stop at an episode end), each
        agent's rewards summed over the window as in :class:`~phalanx.buffers.ReplayBuffer`."""
        terminated, truncated = self.field("terminated"), self.field("truncated")
        assert isinstance(terminated, Tensor) and isinstance(truncated, Tensor), "plain fields"
        window = NStepWindow.sample(
            self,
            batch_size,
            gamma,
            n_step,
            terminated,
            truncated,
            "MultiAgentReplayBuffer",
        )

        def take(field: str, slot: Tensor) -> Any:
            value = self.field(field)
            if isinstance(value, dict):
                return {name: tensor[slot, window.env] for name, tensor in value.items()}
            return None if value is None else value[slot, window.env]

        rewards = self.field("rewards")
        assert isinstance(rewards, dict), "a per-agent field"
        return MultiAgentBatch(
            obs=take("obs", window.start),
            state=take("state", window.start),
            actions=take("actions", window.start),
            rewards={name: window.returns(tensor) for name, tensor in rewards.items()},
            next_obs=take("next_obs", window.last),
            next_state=take("next_state", window.last),
            discounts=window.discounts,
            next_action_mask=take("next_action_mask", window.last),
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "position": self.position, "filled": self.filled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.position = int(state["position"])
        self.filled = int(state["filled"])
