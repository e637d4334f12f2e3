"""Stepping copies of a PettingZoo parallel env into arrays: the same code in-process and in workers.

:class:`PettingZooCopies` resets and steps some copies of the env and writes what they return into the
arrays of a :class:`~phalanx.marl.adapters.pettingzoo_layout.PettingZooLayout` (plain arrays in this
process, a worker's rows of the shared buffers in a worker), so both give identical trajectories.
:class:`PettingZooWorker` is the task a worker process of the pool runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx.errors import EnvError
from phalanx.marl.adapters.pettingzoo_layout import PettingZooLayout
from phalanx.pool import OK, WorkerSide, WorkerTask, frame


class PettingZooCopies:
    """Copies ``offset..offset+len(envs)-1`` of a PettingZoo parallel env, writing into ``views``.

    The same code steps the copies in-process (``views``: plain arrays) and in a worker process
    (``views``: its rows of the shared buffers), so both give identical trajectories.
    """

    def __init__(
        self, envs: list[Any], layout: PettingZooLayout, views: dict[str, np.ndarray], offset: int
    ) -> None:
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
                assert self.final_state is not None, "the layout has a final state with a state"
                self._write_state(i, env, self.final_state)
            if ended:
                self._reset_one(i, None, None)
            elif self.state is not None:
                assert self.final_state is not None, "the layout has a final state with a state"
                self.state[i] = self.final_state[i]
        self.current = -1


STEP = frame(b"s")  # main -> worker: step your copies with the actions in shared memory


class PettingZooWorker(WorkerTask):
    """What a :class:`PettingZooVecEnv` worker does: build its copies of the env; step and reset them."""

    fatal = (EnvError,)

    def __init__(self, factory: Callable[[], Any], layout: PettingZooLayout, per_worker: int) -> None:
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
        self.copies = PettingZooCopies(self.envs, self.layout, views, first)

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
