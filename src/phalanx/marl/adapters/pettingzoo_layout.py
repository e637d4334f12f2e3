"""What a PettingZoo parallel env's agents and spaces are, checked, as one picklable layout.

:func:`make_parallel_env` builds the env from the user's factory (refusing, with the fix, an AEC env or
anything that is not a parallel env); :func:`read_layout` reads its agents, groups them, converts their
spaces and finds the global state: a :class:`PettingZooLayout` that every copy of the env, in this
process or in a worker, writes its observations, rewards and flags by.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, cast

import gymnasium as gym
import numpy as np

from phalanx.envs.spaces import tensor_space
from phalanx.errors import ConfigError, EnvError, import_optional
from phalanx.marl.adapters.groups import group_agents
from phalanx.marl.core import AgentGroup

_MARL_EXTRA = "pip install 'phalanx[marl]'"


def _import_pettingzoo(who: str) -> ModuleType:
    return import_optional(
        "pettingzoo",
        ConfigError,
        f"{who}: the package 'pettingzoo' is not installed, so PettingZoo environments are "
        f"unavailable. Install it with `{_MARL_EXTRA}` (and the env's own package, e.g. "
        "`pip install mpe2` for the MPE environments).",
        packages=("pettingzoo",),
    )


@dataclass(frozen=True)
class AgentSlot:
    """Where one agent's data goes: its group, its index on the group's agent axis, its conversion."""

    name: str
    group: str
    index: int  # on the group's agent axis
    flat: int  # over all agents, group by group (rewards, episode returns)
    one_hot: int  # > 0: a Discrete observation of that many values, written one-hot
    obs_start: int  # the Discrete observation's start
    dict_obs: bool  # observations are {"observation": ..., "action_mask": ...}


@dataclass(frozen=True)
class PettingZooLayout:
    """Everything a worker needs to know about the env's agents and spaces (sent pickled)."""

    env_name: str
    slots: tuple[AgentSlot, ...]  # in possible_agents order
    groups: dict[str, tuple[str, ...]]
    obs_dims: dict[str, int]
    actions: dict[str, tuple[tuple[int, ...], str]]  # per group: one agent's action shape, dtype
    masks: dict[str, int]  # Discrete groups (when the env has action masks): number of actions
    state_dim: int  # 0: no state() of its own; the adapter concatenates the observations
    raw_spaces: dict[str, tuple[gym.Space, gym.Space]] = field(default_factory=dict)

    def buffers(self, num_envs: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """The arrays a step reads and writes: name -> (shape, dtype)."""
        n, layout = num_envs, {}
        for group, agents in self.groups.items():
            shape, dtype = self.actions[group]
            layout[f"act:{group}"] = ((n, len(agents), *shape), dtype)
            layout[f"obs:{group}"] = ((n, len(agents), self.obs_dims[group]), "float32")
            layout[f"final_obs:{group}"] = ((n, len(agents), self.obs_dims[group]), "float32")
            if group in self.masks:
                layout[f"mask:{group}"] = ((n, len(agents), self.masks[group]), "bool")
                layout[f"final_mask:{group}"] = ((n, len(agents), self.masks[group]), "bool")
        layout["reward"] = ((n, len(self.slots)), "float32")
        layout["terminated"] = ((n,), "bool")
        layout["truncated"] = ((n,), "bool")
        if self.state_dim:
            layout["state"] = ((n, self.state_dim), "float32")
            layout["final_state"] = ((n, self.state_dim), "float32")
        return layout


def _env_name(env: Any, factory: Any) -> str:
    metadata = getattr(env, "metadata", None)
    if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
        return metadata["name"]
    name = getattr(factory, "__qualname__", None) or getattr(
        getattr(factory, "func", None), "__qualname__", None
    )
    return name or type(env).__name__


def make_parallel_env(factory: Callable[[], Any], who: str) -> Any:
    """``factory()``, checked to be a PettingZoo parallel env; errors say how to fix what it is not."""
    pettingzoo = _import_pettingzoo(who)
    if isinstance(factory, (pettingzoo.ParallelEnv, pettingzoo.AECEnv)) or not callable(factory):
        raise ConfigError(
            f"{who}: env_factory must be a zero-argument callable that returns a new PettingZoo parallel "
            f"env (e.g. mpe2.simple_spread_v3.parallel_env, or functools.partial(..., N=4)), got "
            f"{type(factory).__name__} ({factory!r}). Pass the function that builds the env, not an env."
        )
    try:
        env = factory()
    except ModuleNotFoundError as error:
        raise EnvError(
            f"{who}: env_factory {getattr(factory, '__qualname__', factory)!r} could not be built: the "
            f"package {error.name!r} is missing ({error}). Install it (the PettingZoo adapter itself "
            f"needs `{_MARL_EXTRA}`; MPE environments need `pip install mpe2`)."
        ) from None
    if isinstance(env, pettingzoo.AECEnv):
        modules = (getattr(factory, "__module__", None), type(getattr(env, "unwrapped", env)).__module__)
        found = [name for name in modules if name and hasattr(sys.modules.get(name), "parallel_env")]
        instead = f"{found[0]}.parallel_env" if found else "e.g. mpe2.simple_spread_v3.parallel_env"
        raise ConfigError(
            f"{who}: env_factory returned an AEC env ({type(env).__name__} "
            f"{_env_name(env, factory)!r}: agents act one after another), but PettingZooVecEnv needs the "
            "parallel API (pettingzoo.ParallelEnv: every agent acts at every step). Fix: return "
            "pettingzoo.utils.conversions.aec_to_parallel(env) from the factory, e.g. "
            "`lambda: aec_to_parallel(module.env())`, or use the env module's `parallel_env` "
            f"({instead}, not its `env`)."
        )
    required = ("possible_agents", "reset", "step", "observation_space", "action_space")
    if not isinstance(env, pettingzoo.ParallelEnv) and not all(hasattr(env, name) for name in required):
        raise ConfigError(
            f"{who}: env_factory returned {type(env).__name__}, not a PettingZoo parallel env "
            f"(pettingzoo.ParallelEnv, with {', '.join(required)}). Return one from the factory."
        )
    return env


def _one_space(space: gym.Space, agent: str, who: str) -> tuple[gym.spaces.Box, int, int, bool]:
    """(flat float32 observation Box, one-hot size or 0, Discrete start, dict obs) of a raw space."""
    dict_obs = False
    if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces and "action_mask" in space.spaces:
        dict_obs, space = True, space["observation"]
    converted = tensor_space(space, "observation")
    if not isinstance(converted, gym.spaces.Box) or len(converted.shape) != 1:  # a Dict: its shape is None
        raise ConfigError(
            f"{who}: agent {agent!r} has observation space {space}; the multi-agent contract needs one flat "
            "observation vector per agent: a 1-D Box, a Discrete (presented one-hot), or a Dict with "
            "'observation' (one of those) and 'action_mask'. Fix: flatten it in env_factory (e.g. "
            "gymnasium.spaces.flatten per agent, or SuperSuit's flatten_v0 wrapper)."
        )
    if isinstance(space, gym.spaces.Discrete):
        return converted, int(space.n), int(space.start), dict_obs
    return converted, 0, 0, dict_obs


def read_layout(
    env: Any, factory: Any, who: str
) -> tuple[PettingZooLayout, dict[str, AgentGroup], gym.spaces.Box]:
    """The layout of ``env`` (freshly reset), its agent groups and its global state space."""
    agents = [str(agent) for agent in env.possible_agents]
    if not agents:
        raise ConfigError(f"{who}: the env has no possible_agents; a multi-agent env needs at least one.")
    raw = {agent: (env.observation_space(agent), env.action_space(agent)) for agent in agents}
    converted: dict[str, tuple[gym.spaces.Box, gym.Space, int, int, bool]] = {}
    for agent, (obs_space, act_space) in raw.items():
        obs_box, one_hot, start, dict_obs = _one_space(obs_space, agent, who)
        action = tensor_space(act_space, "action")
        if action is None or len(action.shape or ()) > 1:
            raise ConfigError(
                f"{who}: agent {agent!r} has action space {act_space}; supported: Discrete and flat "
                "(1-D) Box. Fix: flatten the action space in env_factory."
            )
        if dict_obs and not isinstance(action, gym.spaces.Discrete):
            raise ConfigError(
                f"{who}: agent {agent!r} has an action mask in its observations but action space "
                f"{act_space}; action masks are for Discrete actions only."
            )
        converted[agent] = obs_box, action, one_hot, start, dict_obs
    groups = group_agents(agents, lambda agent: raw[agent])
    has_masks = any(entry[4] for entry in converted.values())
    slots, agent_groups, obs_dims, masks = [], {}, {}, {}
    actions: dict[str, tuple[tuple[int, ...], str]] = {}
    flat = 0
    for name, members in groups.items():
        obs_box, action, *_ = converted[members[0]]
        # Discrete, or 1-D (the check above; AgentGroup's type names the Box among those)
        agent_groups[name] = AgentGroup(
            members, obs_box, cast("gym.spaces.Discrete | gym.spaces.Box", action)
        )
        obs_dims[name] = int(obs_box.shape[0])
        if isinstance(action, gym.spaces.Discrete):
            actions[name] = ((), "int64")
            if has_masks:
                masks[name] = int(action.n)
        else:
            assert action.shape is not None, "a 1-D action space (checked above)"
            actions[name] = ((int(action.shape[0]),), "float32")
        for index, agent in enumerate(members):
            _, _, one_hot, start, dict_obs = converted[agent]
            slots.append(AgentSlot(agent, name, index, flat, one_hot, start, dict_obs))
            flat += 1
    order = {agent: i for i, agent in enumerate(agents)}
    slots.sort(key=lambda slot: order[slot.name])
    state_dim, state_space = 0, None
    raw_state = getattr(env, "state_space", None)
    if isinstance(raw_state, gym.spaces.Box):
        try:
            sample = np.asarray(env.state())
        except NotImplementedError:
            sample = None
        if sample is not None:
            if sample.size != int(np.prod(raw_state.shape)):
                raise EnvError(
                    f"{who}: env.state() returned an array of shape {sample.shape}, but its state_space "
                    f"is {raw_state}. Fix the env's state() or state_space."
                )
            state_dim = int(sample.size)
            state_space = gym.spaces.Box(
                np.asarray(raw_state.low, np.float32).reshape(-1),
                np.asarray(raw_state.high, np.float32).reshape(-1),
                (state_dim,),
                np.float32,
            )
    elif raw_state is not None:
        warnings.warn(
            f"{who}: the env's state_space {raw_state} is not a Box; using the concatenated observations "
            "as the global state instead.",
            RuntimeWarning,
            stacklevel=3,
        )
    if state_space is None:
        low = np.concatenate([np.tile(g.observation_space.low, g.num_agents) for g in agent_groups.values()])
        high = np.concatenate(
            [np.tile(g.observation_space.high, g.num_agents) for g in agent_groups.values()]
        )
        state_space = gym.spaces.Box(low, high, low.shape, np.float32)
    layout = PettingZooLayout(
        _env_name(env, factory), tuple(slots), groups, obs_dims, actions, masks, state_dim, raw
    )
    return layout, agent_groups, state_space
