"""Other libraries' multi-agent envs behind the :class:`~phalanx.marl.core.MultiAgentVecEnv` contract.

:class:`PettingZooVecEnv` runs ``num_envs`` copies of any PettingZoo *parallel-API* environment
(``pettingzoo.ParallelEnv``: MPE2's ``simple_spread_v3.parallel_env``, butterfly envs with flat
observations, ...), in this process or split over worker processes that exchange actions and results
through shared memory, the same machinery as :class:`phalanx.envs.workers.ProcessVecEnv`.

:class:`VMASVecEnv` presents a `VMAS <https://github.com/proroklab/VectorizedMultiAgentSimulator>`_
scenario, already batched in torch on the device, with no copies: it only stacks the per-agent tensors
into groups and resets the ended rows in the same step.

Both group agents the same way (:func:`group_agents`): agents whose names share the prefix before a
final ``_<number>`` (``adversary_0``, ``adversary_1`` -> ``"adversary"``; ``agent_0`` -> ``"agent"``)
and that have equal observation and action spaces form one group, in the library's agent order.
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.core import EpisodeStatistics, as_device, tensor_space
from phalanx.errors import ConfigError, EnvError, import_optional
from phalanx.marl.core import AgentGroup, Groups, MultiAgentVecEnv, Tensor, check_actions
from phalanx.pool import OK, Fault, WorkerPool, WorkerSide, WorkerTask, choose_start_method, copy_out, frame

__all__ = ["PettingZooVecEnv", "VMASVecEnv", "group_agents"]

_NUMBERED = re.compile(r"(.+)_(\d+)")


# ------------------------------------------------------------------------------------------------------
# Grouping, shared by both adapters.


def agent_prefix(name: str) -> str:
    """The group prefix of an agent name: the part before a final ``_<number>``, else the whole name."""
    match = _NUMBERED.fullmatch(str(name))
    return match.group(1) if match else str(name)


def group_agents(agents: Sequence[str], signature: Callable[[str], Any]) -> dict[str, tuple[str, ...]]:
    """Agents grouped by name prefix and equal ``signature(agent)`` (their spaces), in ``agents`` order.

    Groups come in the order of their first agent. Agents that share a prefix but not a signature form
    several groups: the first keeps the prefix as its name, the next are ``prefix_g1``, ``prefix_g2``...
    """
    buckets: dict[str, list[tuple[Any, list[str]]]] = {}
    for agent in agents:
        subgroups = buckets.setdefault(agent_prefix(agent), [])
        key = signature(agent)
        for known, members in subgroups:
            if known == key:
                members.append(agent)
                break
        else:
            subgroups.append((key, [agent]))
    named: list[tuple[int, str, tuple[str, ...]]] = []
    taken: set[str] = set()
    for prefix, subgroups in buckets.items():
        for k, (_, members) in enumerate(subgroups):
            name = prefix if k == 0 else f"{prefix}_g{k}"
            while name in taken or (name != prefix and name in buckets):
                name += "_"
            taken.add(name)
            named.append((list(agents).index(members[0]), name, tuple(members)))
    return {name: members for _, name, members in sorted(named)}


def _split(groups: dict[str, AgentGroup], per_agent: Tensor) -> Groups:
    """A ``(num_envs, num_agents, ...)`` tensor over all agents as one view per group."""
    sizes = [group.num_agents for group in groups.values()]
    return dict(zip(groups, per_agent.split(sizes, dim=1), strict=True))


def _concat_state(groups: dict[str, AgentGroup], obs: Groups) -> Tensor:
    """The global state of envs without one: every agent's observation, group by group."""
    return torch.cat([obs[name].flatten(1) for name in groups], dim=1)


# ------------------------------------------------------------------------------------------------------
# PettingZoo: one layout for all copies, one stepper used in-process and in the workers.

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
class _Slot:
    """Where one agent's data goes: its group, its index on the group's agent axis, its conversion."""

    name: str
    group: str
    index: int  # on the group's agent axis
    flat: int  # over all agents, group by group (rewards, episode returns)
    one_hot: int  # > 0: a Discrete observation of that many values, written one-hot
    obs_start: int  # the Discrete observation's start
    dict_obs: bool  # observations are {"observation": ..., "action_mask": ...}


@dataclass(frozen=True)
class _Layout:
    """Everything a worker needs to know about the env's agents and spaces (sent pickled)."""

    env_name: str
    slots: tuple[_Slot, ...]  # in possible_agents order
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


def _make_parallel_env(factory: Callable[[], Any], who: str) -> Any:
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


def _one_space(space: gym.Space, agent: str, who: str) -> tuple[gym.Box, int, int, bool]:
    """(flat float32 observation Box, one-hot size or 0, Discrete start, dict obs) of a raw space."""
    dict_obs = False
    if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces and "action_mask" in space.spaces:
        dict_obs, space = True, space["observation"]
    converted = tensor_space(space, "observation")
    if converted is None or len(converted.shape) != 1:
        raise ConfigError(
            f"{who}: agent {agent!r} has observation space {space}; the multi-agent contract needs one flat "
            "observation vector per agent: a 1-D Box, a Discrete (presented one-hot), or a Dict with "
            "'observation' (one of those) and 'action_mask'. Fix: flatten it in env_factory (e.g. "
            "gymnasium.spaces.flatten per agent, or SuperSuit's flatten_v0 wrapper)."
        )
    if isinstance(space, gym.spaces.Discrete):
        return converted, int(space.n), int(space.start), dict_obs
    return converted, 0, 0, dict_obs


def _layout(env: Any, factory: Any, who: str) -> tuple[_Layout, dict[str, AgentGroup], gym.spaces.Box]:
    """The layout of ``env`` (freshly reset), its agent groups and its global state space."""
    agents = [str(agent) for agent in env.possible_agents]
    if not agents:
        raise ConfigError(f"{who}: the env has no possible_agents; a multi-agent env needs at least one.")
    raw = {agent: (env.observation_space(agent), env.action_space(agent)) for agent in agents}
    converted: dict[str, tuple[gym.Box, gym.Space, int, int, bool]] = {}
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
    slots, agent_groups, obs_dims, actions, masks = [], {}, {}, {}, {}
    flat = 0
    for name, members in groups.items():
        obs_box, action, *_ = converted[members[0]]
        agent_groups[name] = AgentGroup(members, obs_box, action)
        obs_dims[name] = int(obs_box.shape[0])
        if isinstance(action, gym.spaces.Discrete):
            actions[name] = ((), "int64")
            if has_masks:
                masks[name] = int(action.n)
        else:
            actions[name] = ((int(action.shape[0]),), "float32")
        for index, agent in enumerate(members):
            _, _, one_hot, start, dict_obs = converted[agent]
            slots.append(_Slot(agent, name, index, flat, one_hot, start, dict_obs))
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
    layout = _Layout(_env_name(env, factory), tuple(slots), groups, obs_dims, actions, masks, state_dim, raw)
    return layout, agent_groups, state_space


class _Copies:
    """Copies ``offset..offset+len(envs)-1`` of a PettingZoo parallel env, writing into ``views``.

    The same code steps the copies in-process (``views``: plain arrays) and in a worker process
    (``views``: its rows of the shared buffers), so both give identical trajectories.
    """

    def __init__(self, envs: list[Any], layout: _Layout, views: dict[str, np.ndarray], offset: int) -> None:
        self.envs = envs
        self.layout = layout
        self.offset = offset
        self.current = -1  # the copy being stepped or reset, for error reports
        self.dead: list[set[str]] = [set() for _ in envs]
        self.views = views
        self.act = {g: views[f"act:{g}"] for g in layout.groups}
        self.obs = {g: views[f"obs:{g}"] for g in layout.groups}
        self.final_obs = {g: views[f"final_obs:{g}"] for g in layout.groups}
        self.mask = {g: views[f"mask:{g}"] for g in layout.masks}
        self.final_mask = {g: views[f"final_mask:{g}"] for g in layout.masks}
        self.reward, self.terminated, self.truncated = (
            views["reward"],
            views["terminated"],
            views["truncated"],
        )
        self.state = views.get("state")
        self.final_state = views.get("final_state")
        self.slot = {slot.name: slot for slot in layout.slots}

    def _error(self, what: str) -> EnvError:
        return EnvError(f"{self.layout.env_name!r}, copy {self.offset + self.current}: {what}")

    def _write(self, i: int, observations: Any, live: set[str]) -> None:
        """Observations (and masks) of copy ``i`` into the ``obs`` rows; zeros for agents not in ``live``."""
        if not isinstance(observations, dict):
            raise self._error(
                f"expected a dict of observations per agent (PettingZoo parallel API), got "
                f"{type(observations).__name__}."
            )
        for slot in self.layout.slots:
            row = self.obs[slot.group][i, slot.index]
            mask = self.mask[slot.group][i, slot.index] if slot.group in self.mask else None
            value = observations.get(slot.name) if slot.name in live else None
            if value is None:
                row[:] = 0.0
                if mask is not None:
                    mask[:] = True  # a dead agent's action is ignored: any is allowed
                continue
            if slot.dict_obs:
                if mask is not None:
                    mask[:] = np.asarray(value["action_mask"], dtype=bool)
                value = value["observation"]
            elif mask is not None:
                mask[:] = True
            try:
                if slot.one_hot:
                    row[:] = 0.0
                    row[int(value) - slot.obs_start] = 1.0
                else:
                    row[:] = value
            except (ValueError, IndexError, TypeError) as error:
                raise self._error(
                    f"agent {slot.name!r} returned observation {np.asarray(value).shape} {value!r:.80}, "
                    f"which does not fit its observation space {self.layout.raw_spaces[slot.name][0]} "
                    f"({error})."
                ) from None

    def _write_state(self, i: int, env: Any, target: np.ndarray) -> None:
        state = np.asarray(env.state(), dtype=np.float32).reshape(-1)
        if state.size != self.layout.state_dim:
            raise self._error(f"state() returned {state.size} values, expected {self.layout.state_dim}.")
        target[i] = state

    def _reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> None:
        env = self.envs[i]
        result = env.reset(seed=seed, options=options)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise self._error(
                f"reset() returned {type(result).__name__}, expected (observations, infos) (PettingZoo "
                ">= 1.22)."
            )
        self.dead[i] = set()
        agents = set(env.agents)
        if not agents <= self.slot.keys():
            raise self._error(f"agents {sorted(agents - self.slot.keys())} are not in possible_agents.")
        self._write(i, result[0], agents)
        if self.state is not None:
            self._write_state(i, env, self.state)

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> None:
        for i in range(len(self.envs)):
            self.current = i
            self._reset_one(i, None if seed is None else seed + self.offset + i, options)
        self.current = -1

    def step(self) -> None:
        layout = self.layout
        for i, env in enumerate(self.envs):
            self.current = i
            live = [agent for agent in env.agents if agent not in self.dead[i]]
            actions = {}
            for agent in env.agents:  # dead agents still listed get their (ignored) actions too
                slot = self.slot.get(agent)
                if slot is None:
                    raise self._error(f"agent {agent!r} is not in possible_agents {list(self.slot)}.")
                value = self.act[slot.group][i, slot.index]
                actions[agent] = int(value) if value.ndim == 0 else value.copy()
            result = env.step(actions)
            if not (isinstance(result, tuple) and len(result) == 5):
                got = f"{len(result)} values" if isinstance(result, tuple) else type(result).__name__
                raise self._error(
                    f"step() returned {got}, expected (observations, rewards, terminations, truncations, "
                    "infos) of the PettingZoo parallel API."
                )
            observations, rewards, terminations, truncations, _ = result
            alive = set(live)
            self._write(i, observations, alive)
            for slot in layout.slots:
                self.reward[i, slot.flat] = float(rewards.get(slot.name, 0.0)) if slot.name in alive else 0.0
            terminated = any(terminations.get(agent, False) for agent in live)
            still = set(env.agents)
            for agent in live:
                if terminations.get(agent, False) or truncations.get(agent, False) or agent not in still:
                    self.dead[i].add(agent)
            ended = not still or still <= self.dead[i]
            self.terminated[i] = ended and terminated
            self.truncated[i] = ended and not terminated
            for group in layout.groups:
                self.final_obs[group][i] = self.obs[group][i]
            for group in self.mask:
                self.final_mask[group][i] = self.mask[group][i]
            if self.state is not None:
                self._write_state(i, env, self.final_state)
            if ended:
                self._reset_one(i, None, None)
            elif self.state is not None:
                self.state[i] = self.final_state[i]
        self.current = -1


_STEP = frame(b"s")  # main -> worker: step your copies with the actions in shared memory


class _PettingZooWorker(WorkerTask):
    """What a :class:`PettingZooVecEnv` worker does: build its copies of the env; step and reset them."""

    fatal = (EnvError,)

    def __init__(self, factory: Callable[[], Any], layout: _Layout, per_worker: int) -> None:
        self.factory, self.layout, self.per_worker = factory, layout, per_worker
        self.envs: list[Any] = []

    def start(self, worker: WorkerSide) -> None:
        """Its copies, checked to have the spaces of the env built in the main process, writing into its
        rows of the shared buffers."""
        first = worker.index * self.per_worker
        while len(self.envs) < self.per_worker:
            self.where = first + len(self.envs)
            self.envs.append(self.factory())
            for agent, (obs_space, act_space) in self.layout.raw_spaces.items():
                built = (self.envs[-1].observation_space(agent), self.envs[-1].action_space(agent))
                if built != (obs_space, act_space):
                    raise EnvError(
                        f"copy {self.where} has spaces {built} for agent {agent!r}, expected "
                        f"{(obs_space, act_space)} (those of the first env built). Every copy must have the "
                        "same spaces: make env_factory return identical envs."
                    )
        self.where = None
        views = {name: view[first : first + self.per_worker] for name, view in worker.views.items()}
        self.copies = _Copies(self.envs, self.layout, views, first)

    def handle(self, message: Any) -> bytes:
        try:
            if isinstance(message, bytes):
                self.copies.step()
            else:  # ("reset", seed, options)
                self.copies.reset(*message[1:])
        except BaseException:
            if self.copies.current >= 0:
                self.where = self.copies.offset + self.copies.current
            raise
        return OK

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):
                env.close()


def _check_arguments(who: str, num_envs: Any, num_workers: Any, seed: Any, step_timeout: Any) -> None:
    """PettingZooVecEnv's arguments, checked before an env is built."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
        raise ConfigError(f"{who}: num_workers must be an integer >= 0, got {num_workers!r}.")
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ConfigError(f"{who}: num_envs must be an integer >= 1, got {num_envs!r}.")
    if num_workers and num_envs % num_workers:
        low = num_envs // num_workers * num_workers
        raise ConfigError(
            f"{who}: num_envs={num_envs} is not divisible by num_workers={num_workers}; every worker "
            f"steps the same number of copies. Use a multiple of {num_workers} (e.g. num_envs="
            f"{max(low, num_workers)} or {low + num_workers}), or another num_workers."
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ConfigError(f"{who}: seed must be an integer or None, got {seed!r}.")
    if isinstance(step_timeout, bool) or not isinstance(step_timeout, (int, float)) or not step_timeout > 0:
        raise ConfigError(f"{who}: step_timeout must be a number of seconds > 0, got {step_timeout!r}.")


class PettingZooVecEnv(MultiAgentVecEnv):
    """``num_envs`` copies of a PettingZoo parallel env behind the multi-agent VecEnv contract.

    Args:
        env_factory: a zero-argument callable returning a new ``pettingzoo.ParallelEnv`` (e.g.
            ``mpe2.simple_spread_v3.parallel_env`` or ``functools.partial(..., continuous_actions=True)``;
            lambdas work: it travels to the workers with cloudpickle). An AEC env is refused with the
            way to convert it (``pettingzoo.utils.conversions.aec_to_parallel``).
        num_envs: number of copies.
        num_workers: 0 steps every copy in this process, one after another; ``k >= 1`` splits the
            copies over ``k`` processes (``num_envs`` a multiple of ``k``) that step in parallel and
            exchange actions and results through shared memory: worth it for CPU-heavy envs.
        device: where the returned tensors live.
        seed: the seed of the first :meth:`reset` called without one.
        step_timeout: seconds a worker may take to start, reset or step before it counts as hung.
        start_method: of the worker processes: ``"forkserver"`` (default on Linux) or ``"spawn"``;
            a script that builds this env with workers guards its entry point with
            ``if __name__ == "__main__":``.

    Agents and groups: every agent of ``possible_agents``; agents with the same name prefix (before a
    final ``_<number>``) and equal spaces form a group, in ``possible_agents`` order (simple_tag:
    ``adversary`` with adversary_0..2, ``agent`` with agent_0). Observations must be flat Boxes; a
    ``Discrete(n)`` observation is presented one-hot (``Box(0, 1, (n,))``); a ``Dict`` with
    ``"observation"`` and ``"action_mask"`` (PettingZoo's convention) gives the env action masks
    (``has_action_mask``; every Discrete group then has ``info["action_mask"]``, all true for agents
    without masks). Anything else raises :class:`~phalanx.errors.ConfigError` naming the agent.

    Global state: ``env.state()`` when the env has a Box ``state_space`` (flattened), else every
    agent's observation concatenated, group by group.

    Episodes: a copy ends when all its agents are done (PettingZoo removes them from ``env.agents``);
    it is then reset in the same step, ``info["final_obs"]`` / ``info["final_state"]`` holding its
    last observations and state. ``terminated[i]`` is true if any agent of copy ``i`` terminated in its
    final step, ``truncated[i]`` otherwise (all truncated, or removed without a flag). Agents that die
    before the others (envs with eliminations) get actions ignored, observations of zeros (an all-true
    action mask) and rewards 0 until their copy ends; the step where they die still reports their last
    observation and reward. ``info["episode_return"][g]`` is each agent's sum of rewards.

    Seeding: ``reset(seed=s)`` resets copy ``i`` with ``seed=s + i``; autoresets continue each copy's
    own random stream. The envs' per-agent ``infos`` are not passed on.

    Faults: a copy that raises in a worker, a worker that dies or one that does not answer within
    ``step_timeout`` closes the env and raises :class:`~phalanx.errors.EnvError` naming the env, the
    worker, its copies and the cause, with the worker's traceback. Workers exit by themselves when the
    main process disappears; :meth:`close`, garbage collection and interpreter exit close them.
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        num_envs: int,
        num_workers: int = 0,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        step_timeout: float = 60.0,
        start_method: str | None = None,
    ) -> None:
        self.closed = True  # until the envs exist
        who = type(self).__name__
        _check_arguments(who, num_envs, num_workers, seed, step_timeout)
        device = as_device(device)
        probe = _make_parallel_env(env_factory, who)
        try:
            probe.reset(seed=None if seed is None else int(seed))
            layout, groups, state_space = _layout(probe, env_factory, who)
        except BaseException:
            with contextlib.suppress(Exception):
                probe.close()
            raise
        super().__init__(int(num_envs), groups, state_space, device)
        self.closed = True
        self.env_name = layout.env_name
        self.layout = layout
        self.has_action_mask = bool(layout.masks)
        self.num_workers = int(num_workers)
        self.step_timeout = float(step_timeout)
        self._seed = None if seed is None else int(seed)
        self._needs_reset = True
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device, (self.num_agents,))
        self._who = f"{who}({self.env_name!r})"
        self._copies: _Copies | None = None
        self._pool: WorkerPool | None = None
        if not self.num_workers:
            self._build_copies(env_factory, probe)
            return
        with contextlib.suppress(Exception):
            probe.close()
        self._start_workers(env_factory, start_method)

    def _build_copies(self, env_factory: Callable[[], Any], probe: Any) -> None:
        """Without workers: every copy in this process (the probe is the first), writing into plain arrays."""
        buffers = self.layout.buffers(self.num_envs)
        self._views = {key: np.zeros(shape, dtype) for key, (shape, dtype) in buffers.items()}
        envs = [probe]
        try:
            while len(envs) < self.num_envs:
                envs.append(env_factory())
        except BaseException:
            for env in envs:
                with contextlib.suppress(Exception):
                    env.close()
            raise
        self._copies = _Copies(envs, self.layout, self._views, 0)
        self.closed = False

    def _start_workers(self, env_factory: Callable[[], Any], start_method: str | None) -> None:
        """With workers: a pool whose workers own ``num_envs / num_workers`` copies each, in shared memory."""
        start_method = choose_start_method(start_method, who=self._who, error=ConfigError)
        self._per_worker = self.num_envs // self.num_workers
        self._pool = WorkerPool(
            _PettingZooWorker(env_factory, self.layout, self._per_worker),
            self.num_workers,
            name="phalanx-marl-worker",
            start_method=start_method,
            preload=["phalanx.marl.adapters"],
            buffers=self.layout.buffers(self.num_envs),
            timeout=self.step_timeout,
            timeout_setting="step_timeout",
        )
        self._views = self._pool.views
        self._pool.wait_started(self._fail)
        self.closed = False

    # -- workers -----------------------------------------------------------------------------------
    def _fail(self, fault: Fault) -> None:
        """Any fault of a worker closes the env and raises EnvError (workers are not restarted)."""
        start = fault.worker * self._per_worker
        pid = self._pool.processes[fault.worker].pid
        description = f"worker {fault.worker} (pid {pid}, copies {start}..{start + self._per_worker - 1})"
        self.close()
        raise EnvError(
            f"{self._who}: {description} failed: {fault.cause('copy')}. The env was closed; fix the env (the "
            f"traceback below is the worker's) and build a new one.\n{fault.trace}".rstrip()
        )

    @property
    def pids(self) -> list[int]:
        """The process ids of the live workers (empty without workers)."""
        return [] if self._pool is None else self._pool.pids

    # -- the contract ------------------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self.closed:
            raise EnvError(f"{self._who}.{what}: the env is closed; build a new one.")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Groups, dict]:
        self._check_open("reset")
        if seed is None and self._needs_reset:
            seed = self._seed
        seed = None if seed is None else int(seed)
        if self._copies is not None:
            self._copies.reset(seed, options)
        else:
            self._pool.broadcast(("reset", seed, options))  # copy i gets seed + i: the worker adds its offset
            self._pool.wait(range(self.num_workers), "reset", self._fail)
        self._needs_reset = False
        self.episode_statistics.reset()
        obs = self._groups("obs")
        info: dict[str, Any] = {"state": self._state("state", obs)}
        if self.has_action_mask:
            info["action_mask"] = self._groups("mask", self.layout.masks)
        return obs, info

    def step(self, actions: Groups) -> tuple[Groups, Groups, Tensor, Tensor, dict[str, Any]]:
        self._check_open("step")
        if self._needs_reset:
            raise EnvError(f"{self._who}.step: call reset() before the first step.")
        checked = check_actions(self, actions)
        for name, value in checked.items():
            self._views[f"act:{name}"][...] = value.detach().cpu().numpy()
        if self._copies is not None:
            self._copies.step()
        else:
            self._pool.broadcast(_STEP)
            self._pool.wait(range(self.num_workers), "step", self._fail)
        obs = self._groups("obs")
        final_obs = self._groups("final_obs")
        reward = copy_out(self._views["reward"], self.device)
        terminated = copy_out(self._views["terminated"], self.device)
        truncated = copy_out(self._views["truncated"], self.device)
        done = terminated | truncated
        episode_return, episode_length = self.episode_statistics.step(reward, done)
        info: dict[str, Any] = {
            "state": self._state("state", obs),
            "final_obs": final_obs,
            "final_state": self._state("final_state", final_obs),
            "_final_obs": done,
            "episode_return": _split(self.groups, episode_return),
            "episode_length": episode_length,
        }
        if self.has_action_mask:
            info["action_mask"] = self._groups("mask", self.layout.masks)
            info["final_action_mask"] = self._groups("final_mask", self.layout.masks)
        return obs, _split(self.groups, reward), terminated, truncated, info

    def _groups(self, key: str, names: Any = None) -> Groups:
        return {name: copy_out(self._views[f"{key}:{name}"], self.device) for name in (names or self.groups)}

    def _state(self, key: str, obs: Groups) -> Tensor:
        if self.layout.state_dim:
            return copy_out(self._views[key], self.device)
        return _concat_state(self.groups, obs)

    def state_dict(self) -> dict[str, Any]:
        """Episode statistics only: PettingZoo envs cannot be checkpointed (a resume re-resets them)."""
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._copies is not None:
            for env in self._copies.envs:
                with contextlib.suppress(Exception):
                    env.close()
        else:
            self._pool.close()

    def __repr__(self) -> str:
        groups = ", ".join(f"{name}: {group.num_agents}" for name, group in self.groups.items())
        return (
            f"{type(self).__name__}({self.env_name!r}, num_envs={self.num_envs}, "
            f"num_workers={self.num_workers}, groups={{{groups}}}, device={self.device})"
        )


# ------------------------------------------------------------------------------------------------------
# VMAS: batched torch already; group, autoreset, statistics.

_VMAS_RESERVED = {
    "num_envs": "pass num_envs as VMASVecEnv's own argument",
    "device": "pass device as VMASVecEnv's own argument",
    "dict_spaces": "the adapter reads VMAS's per-agent lists (dict_spaces=False)",
    "terminated_truncated": "the adapter needs terminated and truncated apart (terminated_truncated=True)",
    "wrapper": "the adapter is the wrapper",
    "multidiscrete_actions": "MultiDiscrete actions are not in the contract (Discrete or Box only)",
    "grad_enabled": "phalanx steps envs without gradients",
}


def _import_vmas() -> ModuleType:
    return import_optional(
        "vmas",
        ConfigError,
        "VMASVecEnv: the package {package} is not installed (VMAS needs vmas and the gym it imports), "
        "so VMAS scenarios are unavailable. Install it with `pip install vmas`.",
        packages=("vmas", "gym"),
    )


def _gymnasium_space(space: Any, role: str, agent: str) -> gym.Space:
    """VMAS's (old ``gym``) Box / Discrete as the gymnasium space the contract uses."""
    kind = type(space).__name__
    if kind == "Box" and len(space.shape) == 1:
        return gym.spaces.Box(
            np.asarray(space.low, np.float32),
            np.asarray(space.high, np.float32),
            tuple(space.shape),
            np.float32,
        )
    if kind == "Discrete" and role == "action":
        return gym.spaces.Discrete(int(space.n), start=int(getattr(space, "start", 0)))
    raise ConfigError(
        f"VMASVecEnv: agent {agent!r} has {role} space {space}; the multi-agent contract needs a flat Box "
        f"observation and a Discrete or flat Box action. Pick another scenario or scenario option."
    )


class VMASVecEnv(MultiAgentVecEnv):
    """A VMAS scenario (``num_envs`` batched worlds, torch on ``device``) behind the multi-agent contract.

    Args:
        scenario: a VMAS scenario name (``"balance"``, ``"navigation"``, ...) or a ``BaseScenario``.
        num_envs: number of worlds in the batch.
        device: where VMAS simulates and the tensors live.
        seed: the seed of VMAS's construction and of the first :meth:`reset` called without one.
        max_steps: the episode horizon (truncation); None: only the scenario's own ``done``.
        continuous_actions: Box actions (True) or VMAS's Discrete actions (False).
        **scenario_kwargs: passed to ``vmas.make_env`` (the scenario's options, e.g. ``n_agents=4``,
            and ``clamp_actions``).

    Groups follow the same rule as :class:`PettingZooVecEnv` (name prefix and equal spaces). The
    global state is every agent's observation concatenated, group by group. ``terminated`` is VMAS's
    ``done`` of the scenario; ``truncated`` is the horizon reached without it. Ended rows are reset in
    the same step with ``reset_at`` (one call per ended row: VMAS 1.5 has no masked reset), and
    ``info["final_obs"]`` keeps their last observations. VMAS's per-agent infos are not passed on.

    Seeding: VMAS draws every row's randomness from one random stream of its own (shared by all VMAS
    envs of the process); ``reset(seed=s)`` reseeds it, so the same actions then give the same
    trajectories. Checkpoints hold the episode statistics only (VMAS worlds cannot be saved).
    """

    def __init__(
        self,
        scenario: Any,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        max_steps: int | None = None,
        continuous_actions: bool = True,
        **scenario_kwargs: Any,
    ) -> None:
        self.closed = True
        vmas = _import_vmas()
        name = scenario if isinstance(scenario, str) else type(scenario).__name__
        who = f"VMASVecEnv({name!r})"
        for key, reason in _VMAS_RESERVED.items():
            if key in scenario_kwargs:
                raise ConfigError(
                    f"{who}: the keyword argument {key}= is set by the adapter ({reason}). Remove it."
                )
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ConfigError(f"{who}: num_envs must be an integer >= 1, got {num_envs!r}.")
        if max_steps is not None and (
            isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
        ):
            raise ConfigError(f"{who}: max_steps must be an integer >= 1 or None, got {max_steps!r}.")
        device = as_device(device)
        self.env = vmas.make_env(
            scenario,
            num_envs=int(num_envs),
            device=device,
            continuous_actions=continuous_actions,
            dict_spaces=False,
            seed=seed,
            max_steps=max_steps,
            terminated_truncated=True,
            **scenario_kwargs,
        )
        agents = [str(agent.name) for agent in self.env.agents]
        spaces = {
            agent: (
                _gymnasium_space(self.env.observation_space[i], "observation", agent),
                _gymnasium_space(self.env.action_space[i], "action", agent),
            )
            for i, agent in enumerate(agents)
        }
        grouping = group_agents(agents, lambda agent: spaces[agent])
        groups = {g: AgentGroup(members, *spaces[members[0]]) for g, members in grouping.items()}
        state_dim = sum(g.num_agents * int(g.observation_space.shape[0]) for g in groups.values())
        state_space = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
        super().__init__(int(num_envs), groups, state_space, device)
        self.scenario = name
        self.max_steps = max_steps
        self._seed = seed
        self._needs_reset = True
        position = {agent: i for i, agent in enumerate(agents)}
        self._order = {g: [position[agent] for agent in group.agents] for g, group in groups.items()}
        where = {agent: (g, j) for g, group in groups.items() for j, agent in enumerate(group.agents)}
        self._vmas_order = [where[agent] for agent in agents]  # VMAS's agent order -> (group, index)
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device, (self.num_agents,))
        self.closed = False

    def _group(self, per_agent: list[Tensor], dtype: torch.dtype) -> Groups:
        return {
            g: torch.stack([per_agent[i] for i in order], dim=1).to(self.device, dtype)
            for g, order in self._order.items()
        }

    def _observe(self) -> Groups:
        obs = self.env.get_from_scenario(
            get_observations=True, get_rewards=False, get_infos=False, get_dones=False
        )
        return self._group(obs[0], torch.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Groups, dict]:
        if self.closed:
            raise EnvError(f"VMASVecEnv({self.scenario!r}).reset: the env is closed; build a new one.")
        if seed is None and self._needs_reset:
            seed = self._seed
        obs = self.env.reset(seed=None if seed is None else int(seed))
        self._needs_reset = False
        self.episode_statistics.reset()
        grouped = self._group(obs, torch.float32)
        return grouped, {"state": _concat_state(self.groups, grouped)}

    def step(self, actions: Groups) -> tuple[Groups, Groups, Tensor, Tensor, dict[str, Any]]:
        if self.closed:
            raise EnvError(f"VMASVecEnv({self.scenario!r}).step: the env is closed; build a new one.")
        if self._needs_reset:
            raise EnvError(f"VMASVecEnv({self.scenario!r}).step: call reset() before the first step.")
        checked = check_actions(self, actions)
        per_agent = []
        for g, j in self._vmas_order:
            value = checked[g][:, j]
            per_agent.append(value.unsqueeze(-1) if self.groups[g].discrete else value)
        obs, rewards, terminated, truncated, _ = self.env.step(per_agent)
        final_obs = self._group(obs, torch.float32)
        reward = self._group(rewards, torch.float32)
        terminated = terminated.to(self.device, torch.bool).reshape(self.num_envs)
        truncated = truncated.to(self.device, torch.bool).reshape(self.num_envs) & ~terminated
        done = terminated | truncated
        all_rewards = torch.cat([reward[g] for g in self.groups], dim=1)
        episode_return, episode_length = self.episode_statistics.step(all_rewards, done)
        rows = torch.nonzero(done).flatten().tolist()
        if rows:
            for row in rows:
                self.env.reset_at(row, return_observations=False)
            fresh = self._observe()
            next_obs = {g: torch.where(done.view(-1, 1, 1), fresh[g], final_obs[g]) for g in self.groups}
        else:
            next_obs = {g: value.clone() for g, value in final_obs.items()}
        info: dict[str, Any] = {
            "state": _concat_state(self.groups, next_obs),
            "final_obs": final_obs,
            "final_state": _concat_state(self.groups, final_obs),
            "_final_obs": done,
            "episode_return": _split(self.groups, episode_return),
            "episode_length": episode_length,
        }
        return next_obs, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """Episode statistics only: VMAS worlds cannot be checkpointed (a resume re-resets them)."""
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])

    def __repr__(self) -> str:
        groups = ", ".join(f"{name}: {group.num_agents}" for name, group in self.groups.items())
        return (
            f"VMASVecEnv({self.scenario!r}, num_envs={self.num_envs}, groups={{{groups}}}, "
            f"device={self.device})"
        )
