"""The multi-agent VecEnv contract: many agents in each of many sub-envs, as tensors on one device.

A :class:`MultiAgentVecEnv` batches ``num_envs`` sub-environments, each with the same agents. Agents
that share observation and action spaces form a *group* (:class:`AgentGroup`); a cooperative task
usually has one group, a competitive one a group per team (``simple_tag``: ``adversary`` and
``agent``). Every per-agent array is a dict ``{group name: tensor}`` whose tensors have the agent
axis second:

- ``reset(seed=None, options=None) -> (obs, info)``: ``obs[g]`` is ``(num_envs, A_g, obs_dim_g)``
  float32.
- ``step(actions) -> (obs, rewards, terminated, truncated, info)``: ``actions[g]`` is
  ``(num_envs, A_g)`` int64 for a Discrete space or ``(num_envs, A_g, act_dim)`` float32 within a
  Box's bounds; ``rewards[g]`` is ``(num_envs, A_g)`` float32; ``terminated`` and ``truncated`` are
  bool ``(num_envs,)``: an episode ends for all agents of a sub-env at once.
- ``info["state"]``: the global state ``(num_envs, state_dim)`` for centralised critics, after
  ``reset`` and ``step`` (of the observations returned).
- Same-step autoreset, as in the single-agent contract: a sub-env that ends is reset inside ``step``;
  its ``obs`` rows are the first observations of its next episode; ``info["final_obs"]`` (a dict like
  ``obs``) and ``info["final_state"]`` are the true next observations and state of *every* row (the
  last ones of the finished episode where ``info["_final_obs"]``, the rows that ended, is true).
- ``info["episode_return"][g]`` ``(num_envs, A_g)`` and ``info["episode_length"]`` ``(num_envs,)``:
  valid where an episode ended.
- Action masks, where the env has them (``has_action_mask``, Discrete groups only):
  ``info["action_mask"][g]`` bool ``(num_envs, A_g, n)`` for the observations returned and
  ``info["final_action_mask"][g]`` for ``final_obs``; true where an action is allowed.

:class:`BatchedMultiAgentEnv` implements the bookkeeping (autoreset, time limit, episode statistics,
seeding, checkpointable state) so that a simulator writes only its physics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from phalanx.envs.core import BatchedBookkeeping, Tensor, as_device, step_info
from phalanx.errors import ConfigError, EnvError

Groups = dict[str, Tensor]
"""One tensor per agent group, agent axis second: ``{group: (num_envs, A_g, ...)}``."""


@dataclass(frozen=True)
class AgentGroup:
    """Agents with the same observation and action spaces: the A axis of their group's tensors."""

    agents: tuple[str, ...]
    """The agents' names, in the order of the agent axis."""
    observation_space: gym.spaces.Box
    """One agent's observation space: a flat float32 Box ``(obs_dim,)``."""
    action_space: gym.spaces.Discrete | gym.spaces.Box
    """One agent's action space, with the env's own bounds."""

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, gym.spaces.Discrete)

    def __post_init__(self) -> None:
        if not self.agents:
            raise ConfigError("an AgentGroup needs at least one agent name.")
        if not isinstance(self.observation_space, gym.spaces.Box) or len(self.observation_space.shape) != 1:
            raise ConfigError(
                f"agents {list(self.agents)}: observation space {self.observation_space} is not a flat Box; "
                "multi-agent algorithms need one observation vector per agent. Flatten it in the env."
            )
        if not isinstance(self.action_space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise ConfigError(
                f"agents {list(self.agents)}: action space {self.action_space} is neither Discrete nor Box."
            )
        if isinstance(self.action_space, gym.spaces.Box) and len(self.action_space.shape) != 1:
            raise ConfigError(
                f"agents {list(self.agents)}: action space {self.action_space} is not a flat Box (act_dim,)."
            )


class MultiAgentVecEnv:
    """Base class of every multi-agent environment phalanx trains on (the contract is the module's)."""

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
    has_action_mask: bool = False
    """Whether ``info`` carries ``action_mask`` / ``final_action_mask`` (Discrete groups)."""

    def __init__(
        self,
        num_envs: int,
        groups: dict[str, AgentGroup],
        state_space: gym.spaces.Box,
        device: str | torch.device = "cpu",
    ) -> None:
        if not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or num_envs < 1:
            raise ConfigError(f"{type(self).__name__}: num_envs must be an integer >= 1, got {num_envs!r}.")
        if not groups:
            raise ConfigError(f"{type(self).__name__}: a multi-agent env needs at least one agent group.")
        if not isinstance(state_space, gym.spaces.Box) or len(state_space.shape) != 1:
            raise ConfigError(
                f"{type(self).__name__}: the global state space must be a flat Box, got {state_space}."
            )
        self.num_envs = int(num_envs)
        self.groups = dict(groups)
        self.state_space = state_space
        self.device = as_device(device)
        self.closed = False

    @property
    def agents(self) -> list[str]:
        """Every agent's name, group by group."""
        return [agent for group in self.groups.values() for agent in group.agents]

    @property
    def num_agents(self) -> int:
        return sum(group.num_agents for group in self.groups.values())

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Groups, dict]:
        raise NotImplementedError

    def step(self, actions: Groups) -> tuple[Groups, Groups, Tensor, Tensor, dict[str, Any]]:
        raise NotImplementedError

    def render(self) -> np.ndarray | None:
        """An RGB frame ``(H, W, 3)`` uint8 of sub-env 0, for envs that list ``rgb_array``."""
        return None

    def close(self) -> None:
        self.closed = True

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact same trajectories (tensors and primitives)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    @property
    def unwrapped(self) -> MultiAgentVecEnv:
        return self

    def __repr__(self) -> str:
        groups = ", ".join(f"{name}: {group.num_agents}" for name, group in self.groups.items())
        return f"{type(self).__name__}(num_envs={self.num_envs}, groups={{{groups}}}, device={self.device})"


def check_actions(env: MultiAgentVecEnv, actions: Any) -> Groups:
    """``actions`` as the env's tensors (dtype, device), or an EnvError naming what does not fit."""
    if not isinstance(actions, dict) or set(actions) != set(env.groups):
        given = sorted(actions) if isinstance(actions, dict) else type(actions).__name__
        raise EnvError(
            f"{type(env).__name__}.step: actions must be a dict with one tensor per agent group "
            f"{sorted(env.groups)}, got {given}."
        )
    checked: Groups = {}
    for name, group in env.groups.items():
        value = actions[name]
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(np.asarray(value))
        shape: tuple[int, ...]
        if isinstance(group.action_space, gym.spaces.Discrete):  # group.discrete
            shape, dtype = (env.num_envs, group.num_agents), torch.int64
        else:
            shape, dtype = (env.num_envs, group.num_agents, int(group.action_space.shape[0])), torch.float32
        if tuple(value.shape) != shape:
            raise EnvError(
                f"{type(env).__name__}.step: actions of group {name!r} have shape {tuple(value.shape)}, "
                f"expected {shape} (num_envs, agents{', act_dim' if not group.discrete else ''}) for action "
                f"space {group.action_space}."
            )
        checked[name] = value.to(env.device, dtype)
    return checked


class BatchedMultiAgentEnv(BatchedBookkeeping[Groups], MultiAgentVecEnv):
    """A multi-agent simulator written as batched tensor operations; subclasses write the physics.

    Implement, each acting on all ``num_envs`` rows at once:

    - ``_reset_rows(mask)``: draw initial states (with :meth:`uniform`) where ``mask`` is true, leave the
      other rows untouched (draw for every row, then ``torch.where``, no boolean indexing: no host
      synchronisation on a GPU, and draws that do not depend on the mask, which :meth:`step_noise`
      makes before the step);
    - ``_advance(actions) -> (rewards, terminated)``: one step of every row; ``rewards`` per group;
    - ``_observe() -> obs``: the observations per group of the current state;
    - optionally ``_global_state(obs)`` (default: every agent's observation, concatenated, as PettingZoo
      MPE's ``state()``) and ``_action_mask()`` (with ``has_action_mask = True``).

    The base class handles seeding (one generator, ``reset(seed=s)``), the time limit
    (``max_episode_steps``: truncation), same-step autoreset with final observations and states,
    episode statistics per agent, and checkpoints of the attributes named in ``state_names``. As in
    ``BatchedVecEnv``, ``step(a)`` is ``step_with_noise(a, step_noise())``, traceable as one graph, and
    :meth:`compile` switches ``step`` to that graph.
    """

    def __init__(
        self,
        num_envs: int,
        groups: dict[str, AgentGroup],
        state_space: gym.spaces.Box,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = None,
    ) -> None:
        super().__init__(num_envs, groups, state_space, device)
        self._start_bookkeeping(max_episode_steps, per_row=(self.num_agents,))

    def _global_state(self, obs: Groups) -> Tensor:
        return torch.cat([obs[name].flatten(1) for name in self.groups], dim=1)

    def _action_mask(self) -> Groups:
        raise NotImplementedError

    # -- the contract ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Groups, dict]:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self._reset_rows(self._all_rows)
        self._restart_counters()
        obs = self._observe()
        info: dict[str, Any] = {"state": self._global_state(obs)}
        if self.has_action_mask:
            info["action_mask"] = self._action_mask()
        return obs, info

    def step(self, actions: Groups) -> tuple[Groups, Groups, Tensor, Tensor, dict[str, Any]]:
        if self._compiled_step is not None:
            return self._compiled_step(check_actions(self, actions), self.step_noise())
        return self.step_with_noise(actions, self.step_noise())

    def step_with_noise(
        self, actions: Groups, noise: tuple[Tensor, ...]
    ) -> tuple[Groups, Groups, Tensor, Tensor, dict[str, Any]]:
        """The whole step with the autoreset's draws given (what :meth:`step_noise` returned): traceable
        by ``torch.compile`` as one graph, and equal to :meth:`step` bit for bit eagerly."""
        rewards, terminated = self._advance(check_actions(self, actions))
        truncated = self._time_limit(terminated)
        done = terminated | truncated
        final_obs = self._observe()
        final_state = self._global_state(final_obs)
        final_mask = self._action_mask() if self.has_action_mask else None
        all_rewards = torch.cat([rewards[name] for name in self.groups], dim=1)  # (N, all agents)
        episode_return, episode_length = self.episode_statistics.step(all_rewards, done)
        self._reset_with(done, noise)
        self.elapsed_steps.masked_fill_(done, 0)
        fresh = self._observe()
        obs = {name: torch.where(done.view(-1, 1, 1), fresh[name], final_obs[name]) for name in self.groups}
        info = step_info(final_obs, done, self.split(episode_return), episode_length)
        info["state"] = torch.where(done.view(-1, 1), self._global_state(obs), final_state)
        info["final_state"] = final_state
        if final_mask is not None:
            fresh_mask = self._action_mask()
            info["action_mask"] = {
                name: torch.where(done.view(-1, 1, 1), fresh_mask[name], final_mask[name])
                for name in self.groups
            }
            info["final_action_mask"] = final_mask
        return obs, rewards, terminated, truncated, info

    def split(self, per_agent: Tensor) -> Groups:
        """A ``(num_envs, num_agents, ...)`` tensor over all agents as one view per group."""
        sizes = [group.num_agents for group in self.groups.values()]
        return dict(zip(self.groups, per_agent.split(sizes, dim=1), strict=True))

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self._bookkeeping_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_bookkeeping_state(state)


@dataclass(frozen=True)
class MultiAgentSpec:
    """The spaces a multi-agent algorithm is built for: the agent groups and the global state."""

    groups: dict[str, AgentGroup]
    state_space: gym.spaces.Box
    has_action_mask: bool = False

    @classmethod
    def of(cls, env: MultiAgentVecEnv) -> MultiAgentSpec:
        return cls(dict(env.groups), env.state_space, env.has_action_mask)

    @property
    def state_dim(self) -> int:
        return int(self.state_space.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """Primitives only (for checkpoints, which load with ``weights_only=True``)."""
        return {
            "multi_agent": True,
            "state_dim": self.state_dim,
            "has_action_mask": self.has_action_mask,
            "groups": {
                name: {
                    "agents": list(group.agents),
                    "obs_dim": int(group.observation_space.shape[0]),
                    "action": _space_dict(group.action_space),
                }
                for name, group in self.groups.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MultiAgentSpec:
        groups = {}
        for name, group in data["groups"].items():
            observation_space = gym.spaces.Box(-np.inf, np.inf, (group["obs_dim"],), np.float32)
            action = group["action"]
            if action["kind"] == "discrete":
                action_space: gym.spaces.Discrete | gym.spaces.Box = gym.spaces.Discrete(action["n"])
            else:
                action_space = gym.spaces.Box(
                    np.asarray(action["low"], np.float32), np.asarray(action["high"], np.float32)
                )
            groups[name] = AgentGroup(tuple(group["agents"]), observation_space, action_space)
        state_space = gym.spaces.Box(-np.inf, np.inf, (data["state_dim"],), np.float32)
        return cls(groups, state_space, data["has_action_mask"])


def _space_dict(space: gym.spaces.Discrete | gym.spaces.Box) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Discrete):
        return {"kind": "discrete", "n": int(space.n)}
    return {"kind": "box", "low": space.low.tolist(), "high": space.high.tolist()}
