"""PettingZooVecEnv: copies of a PettingZoo parallel env behind the multi-agent VecEnv contract.

The env checks its arguments, builds one env to read its layout
(:mod:`~phalanx.marl.adapters.pettingzoo_layout`), then steps its copies in this process or in worker
processes over shared memory (:mod:`~phalanx.marl.adapters.pettingzoo_copies`, the pool of
:mod:`phalanx.pool`), and hands out the results as tensors per agent group, with same-step autoreset,
the global state and the episode statistics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from phalanx.envs.base import as_device
from phalanx.envs.episodes import EpisodeStatistics
from phalanx.errors import ConfigError, EnvError
from phalanx.marl.adapters.groups import concat_state, split_groups
from phalanx.marl.adapters.pettingzoo_copies import STEP, PettingZooCopies, PettingZooWorker
from phalanx.marl.adapters.pettingzoo_layout import make_parallel_env, read_layout
from phalanx.marl.core import Groups, MultiAgentVecEnv, Tensor, check_actions
from phalanx.pool import Fault, WorkerPool, choose_start_method, copy_out


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
        probe = make_parallel_env(env_factory, who)
        try:
            probe.reset(seed=None if seed is None else int(seed))
            layout, groups, state_space = read_layout(probe, env_factory, who)
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
        self._copies: PettingZooCopies | None = None
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
        self._copies = PettingZooCopies(envs, self.layout, self._views, 0)
        self.closed = False

    def _start_workers(self, env_factory: Callable[[], Any], start_method: str | None) -> None:
        """With workers: a pool whose workers own ``num_envs / num_workers`` copies each, in shared memory."""
        start_method = choose_start_method(start_method, who=self._who, error=ConfigError)
        self._per_worker = self.num_envs // self.num_workers
        self._pool = WorkerPool(
            PettingZooWorker(env_factory, self.layout, self._per_worker),
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
    @property
    def _workers(self) -> WorkerPool:
        """The pool of the worker processes that step the copies (num_workers > 0)."""
        assert self._pool is not None, "the copies are stepped in worker processes"
        return self._pool

    def _fail(self, fault: Fault) -> None:
        """Any fault of a worker closes the env and raises EnvError (workers are not restarted)."""
        start = fault.worker * self._per_worker
        pid = self._workers.processes[fault.worker].pid
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
            self._workers.broadcast(
                ("reset", seed, options)
            )  # copy i gets seed + i: the worker adds its offset
            self._workers.wait(range(self.num_workers), "reset", self._fail)
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
            self._workers.broadcast(STEP)
            self._workers.wait(range(self.num_workers), "step", self._fail)
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
            "episode_return": split_groups(self.groups, episode_return),
            "episode_length": episode_length,
        }
        if self.has_action_mask:
            info["action_mask"] = self._groups("mask", self.layout.masks)
            info["final_action_mask"] = self._groups("final_mask", self.layout.masks)
        return obs, split_groups(self.groups, reward), terminated, truncated, info

    def _groups(self, key: str, names: Any = None) -> Groups:
        return {name: copy_out(self._views[f"{key}:{name}"], self.device) for name in (names or self.groups)}

    def _state(self, key: str, obs: Groups) -> Tensor:
        if self.layout.state_dim:
            return copy_out(self._views[key], self.device)
        return concat_state(self.groups, obs)

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
            self._workers.close()

    def __repr__(self) -> str:
        groups = ", ".join(f"{name}: {group.num_agents}" for name, group in self.groups.items())
        return (
            f"{type(self).__name__}({self.env_name!r}, num_envs={self.num_envs}, "
            f"num_workers={self.num_workers}, groups={{{groups}}}, device={self.device})"
        )
