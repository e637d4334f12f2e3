"""Gymnasium sub-envs stepped by worker processes behind the VecEnv contract: :class:`ProcessVecEnv`.

:class:`ProcessVecEnv` steps ``num_envs`` sub-envs in ``num_workers`` processes (a
:class:`~phalanx.pool.WorkerPool` running :class:`~phalanx.envs.process_worker.EnvWorker`) that exchange
actions, observations, rewards and flags with the main process through shared memory; it restarts
workers that fail. :meth:`ProcessVecEnv.split` gives the two halves of double buffering.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.core import EpisodeStatistics, Tensor, VecEnv, observation_shape, step_info
from phalanx.envs.gymnasium import EnvFactory, GymnasiumAdapter, env_spaces, make_gym_env
from phalanx.envs.process_worker import DONE, EXCUSED, PENDING, STEP_ALL, STEP_HALF, EnvWorker
from phalanx.errors import EnvError
from phalanx.pool import Fault, WorkerPool, choose_start_method, copy_out

__all__ = ["ProcessVecEnv"]

_RESULTS = ("obs", "final_obs", "reward", "terminated", "truncated")  # the buffers a step writes
_INFO_STATISTICS = ("episode_return", "episode_end")  # and with statistics_from_info


class ProcessVecEnv(GymnasiumAdapter):
    """``num_envs`` Gymnasium sub-envs stepped by ``num_workers`` processes, behind the VecEnv contract.

    Worker ``w`` owns the contiguous sub-envs ``w * k .. (w + 1) * k - 1`` (``k = num_envs / num_workers``)
    and steps them one after another. Actions, observations, rewards and flags travel through shared
    memory: a step costs a one-byte message to each worker and one back from the last worker to
    finish, never a pickled array. The results come back as tensors on ``device``, with the same
    conversions, seeding (``reset(seed=s)`` seeds sub-env ``i`` with ``s + i``) and same-step autoreset
    as :class:`GymnasiumVecEnv`. The sub-envs' ``info`` dicts stay in the workers (with
    ``statistics_from_info``, their ``info["episode"]`` statistics come back). uint8 observations travel
    as uint8 (an 84x84 Atari frame is 7 KB, not 28), Dict observations as the flat float32 vectors.

    Faults: a worker that raises, dies or does not answer within ``step_timeout`` seconds is restarted
    (its own fresh sub-envs, reset with new seeds when the env was seeded), and the step reports its
    sub-envs as ``truncated`` with reward 0 and ``final_obs`` equal to their last observation, so the
    episode ends cleanly and the run goes on. Each worker may be restarted ``max_restarts`` times;
    the next fault raises :class:`~phalanx.errors.EnvError` naming the env, the worker, its sub-envs
    and the cause. An :class:`~phalanx.errors.EnvError` raised by a sub-env (e.g. the old gym API) is
    a contract error, not a fault, and is raised at once.

    Processes: a :class:`~phalanx.pool.WorkerPool`, started with ``start_method`` (``"forkserver"`` on
    Linux, else ``"spawn"``), so a script that builds this env must guard its entry point with
    ``if __name__ == "__main__":``. Workers ignore SIGINT and SIGTERM (the main process handles a stop
    and closes them), exit by themselves when the main process disappears, and are closed by :meth:`close`,
    garbage collection and interpreter exit.

    Args:
        env: a Gymnasium id or a factory returning a ``gymnasium.Env`` (lambdas work: the factory is
            sent with cloudpickle).
        num_envs: total number of sub-envs, a multiple of ``num_workers``.
        num_workers: number of processes (>= 1).
        device: where the returned tensors live.
        render_mode: passed to every sub-env; ``"rgb_array"`` enables :meth:`render_frame`.
        max_restarts: restarts allowed per worker over the env's life.
        step_timeout: seconds a worker may take to start, reset or step before it counts as hung.
        start_method: ``"forkserver"``, ``"spawn"`` or ``"fork"``; None picks the default above.
        statistics_from_info: as for :class:`GymnasiumVecEnv`: the episode statistics of the sub-envs'
            ``info["episode"]`` (RecordEpisodeStatistics), reported with ``info["_episode_return"]``.
        **kwargs: passed to ``gymnasium.make`` (or to the factory).
    """

    def __init__(
        self,
        env: str | EnvFactory,
        num_envs: int = 2,
        num_workers: int = 2,
        device: str | torch.device = "cpu",
        render_mode: str | None = None,
        max_restarts: int = 3,
        step_timeout: float = 60.0,
        start_method: str | None = None,
        statistics_from_info: bool = False,
        **kwargs: Any,
    ) -> None:
        self.closed = True  # until the workers run
        super().__init__(env, num_envs, device, render_mode, statistics_from_info, kwargs)
        self._check_workers(num_workers, max_restarts, step_timeout)
        who = f"{type(self).__name__}({self.env_id!r})"
        start_method = choose_start_method(start_method, who=who, error=EnvError)
        self.num_workers = int(num_workers)
        self.max_restarts = int(max_restarts)
        self.step_timeout = float(step_timeout)

        # One env in this process first: its spaces size the shared buffers, and a missing dependency or
        # a bad id fails here, in the caller's process, with the adapter's error message.
        probe = make_gym_env(env, self._make_kwargs)
        try:
            obs_space, act_space = env_spaces(probe)
            render_modes, fps = probe.metadata.get("render_modes", []), probe.metadata.get("render_fps")
        finally:
            probe.close()
        self._set_spaces(obs_space, act_space, render_modes, fps)
        # Discrete observations travel as their index (one-hot in this process)
        obs_shape = (
            ()
            if isinstance(obs_space, gym.spaces.Discrete)
            else observation_shape(self.single_observation_space)
        )
        self._last_obs = np.zeros((self.num_envs, *obs_shape), dtype=self._obs_dtype)
        self._results = _RESULTS + (_INFO_STATISTICS if self.statistics_from_info else ())
        self._fault_rows = np.zeros(self.num_envs, dtype=bool)
        self._complete = [True, True]  # per slot: the step sent there is complete
        self._slots_in_flight: set[int] = set()
        self._split = False
        self._order: collections.deque[VecEnv] = collections.deque()  # owners of the steps in flight
        self._seed: int | None = None
        self._per_worker = self.num_envs // self.num_workers
        self._pool = WorkerPool(
            EnvWorker(
                env, self._make_kwargs, (obs_space, act_space), self._per_worker, self.statistics_from_info
            ),
            self.num_workers,
            name="phalanx-worker",
            start_method=start_method,
            preload=["phalanx.envs.process_worker"],
            buffers=self._buffer_layout(obs_shape),
            lock=True,  # makes "mark my slot finished, am I the last?" atomic
            timeout=self.step_timeout,
            timeout_setting="step_timeout",
            max_restarts=self.max_restarts,
        )
        self._views = self._pool.views
        self._progress = self._views["progress"]
        self._pool.wait_started(self._refuse)
        self.closed = False

    def _check_workers(self, num_workers: Any, max_restarts: Any, step_timeout: Any) -> None:
        name = type(self).__name__
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
            raise EnvError(
                f"{name}({self.env_id!r}): num_workers must be an integer >= 1, got {num_workers!r}."
            )
        if self._num_envs_requested % num_workers:
            low = self._num_envs_requested // num_workers * num_workers
            raise EnvError(
                f"{name}({self.env_id!r}): num_envs={self._num_envs_requested} is not divisible by "
                f"num_workers={num_workers}; every worker steps the same number of sub-envs. Use a "
                f"multiple of {num_workers} (e.g. num_envs={max(low, num_workers)} or "
                f"{low + num_workers}), or another num_workers."
            )
        if (
            isinstance(max_restarts, bool)
            or not isinstance(max_restarts, (int, np.integer))
            or max_restarts < 0
        ):
            raise EnvError(
                f"{name}({self.env_id!r}): max_restarts must be an integer >= 0, got {max_restarts!r}."
            )
        if (
            not isinstance(step_timeout, (int, float))
            or isinstance(step_timeout, bool)
            or not step_timeout > 0
        ):
            raise EnvError(
                f"{name}({self.env_id!r}): step_timeout must be a number of seconds > 0, "
                f"got {step_timeout!r}."
            )

    def _buffer_layout(self, obs_shape: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], str]]:
        """The shared buffers: what a step reads and writes, and its progress per slot and worker."""
        n, obs_dtype = self.num_envs, self._obs_dtype.name
        layout = {
            "actions": (self._action_shape, "int64" if self._integer_act else "float32"),
            "obs": ((n, *obs_shape), obs_dtype),
            "final_obs": ((n, *obs_shape), obs_dtype),
            "reward": ((n,), "float32"),
            "terminated": ((n,), "bool"),
            "truncated": ((n,), "bool"),
            "progress": ((2, self.num_workers), "int8"),
        }
        if self.statistics_from_info:
            layout |= {"episode_return": ((n,), "float32"), "episode_end": ((n,), "bool")}
        return layout

    # -- faults ------------------------------------------------------------------------------------
    @property
    def restarts(self) -> list[int]:
        """The restarts of each worker so far."""
        return self._pool.restarts

    def _rows(self, worker: int) -> tuple[int, int]:
        return worker * self._per_worker, (worker + 1) * self._per_worker

    def _describe(self, worker: int) -> str:
        start, stop = self._rows(worker)
        return f"worker {worker} (pid {self._pool.processes[worker].pid}, sub-envs {start}..{stop - 1})"

    @contextlib.contextmanager
    def _progress_locked(self) -> Any:
        assert self._pool.lock is not None, "the pool of a ProcessVecEnv has the lock"
        if not self._pool.lock.acquire(timeout=self.step_timeout):  # only if a worker died holding it
            self.close()
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}): a worker process ended while holding the lock "
                "that orders the step notices, so this env cannot go on; it was closed. Create it again."
            )
        try:
            yield
        finally:
            self._pool.lock.release()

    def _excuse(self, worker: int) -> None:
        """``worker`` is dead: it will finish no step in flight; complete the steps it was the last of."""
        with self._progress_locked():
            for slot in self._slots_in_flight:
                if self._progress[slot, worker] == PENDING:
                    self._progress[slot, worker] = EXCUSED
                if self._progress[slot].all():
                    self._complete[slot] = True

    def _notice(self, answer: bytes) -> None:
        """The last worker to finish a slot's step says so: the step is complete. Every wait passes it
        on: a half's step finishes while the other half resets (or a worker restarts)."""
        self._complete[DONE.index(answer)] = True

    def _refuse(self, fault: Fault) -> None:
        """A fault while a worker starts or restarts: no restart; close and raise."""
        self._fault(fault, restart=False)

    def _fault(self, fault: Fault, restart: bool = True, slot: int | None = None) -> None:
        """Restart the worker of ``fault`` (its sub-envs' episodes end truncated), or close the env and raise
        EnvError for a contract error, past ``max_restarts``, or when ``restart`` is false."""
        worker, name = fault.worker, f"{type(self).__name__}({self.env_id!r})"
        if fault.kind == "hung" and slot is not None and self._progress[slot, worker] != PENDING:
            return  # it finished its part of the step in flight; another worker is the one hung
        description = self._describe(worker)
        if fault.kind == "fatal" or (fault.kind == "raised" and not restart):
            self.close()
            at = "" if fault.where is None else f" in sub-env {fault.where}"
            raise EnvError(
                f"{name}: {description} failed{at} during {fault.what}: {fault.summary}\n{fault.trace}"
            ) from None
        cause = fault.cause("sub-env") + ("; killed it" if fault.kind == "hung" else "")
        self._pool.stop(worker)
        self._excuse(worker)
        if not restart or not self._pool.restart(worker):
            self.close()
            limit = (
                ""
                if not restart
                else f" after {self.max_restarts} restarts (max_restarts={self.max_restarts})"
            )
            raise EnvError(
                f"{name}: {description} failed{limit}: {cause}. Fix the env (the traceback below is the "
                "worker's), or raise max_restarts if the failures are rare and harmless."
                f"\n{fault.trace}".rstrip()
            ) from None
        warnings.warn(
            f"{name}: {description} failed: {cause}. Restarted it ({self.restarts[worker]} of "
            f"max_restarts={self.max_restarts}); its episodes are truncated.",
            RuntimeWarning,
            stacklevel=4,
        )
        self._pool.wait([worker], "start", self._refuse, on_answer=self._notice)
        start, stop = self._rows(worker)
        seed = None if self._seed is None else self._seed + start + self.num_envs * sum(self.restarts)
        self._pool.send(worker, ("reset", seed, None, 0, stop - start))
        self._pool.wait([worker], "reset", self._refuse, on_answer=self._notice)
        self._fault_rows[start:stop] = True

    # -- the contract ------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        self._check_whole("reset")
        obs = self._reset_rows(seed, options, None)
        self.episode_statistics.reset()
        return obs, {}

    def step_async(self, actions: Any) -> None:
        """Send ``actions`` to the workers and return at once; :meth:`step_wait` collects the results."""
        self._check_whole("step")
        self._send_step(self._actions_numpy(actions), slice(None), 0, self)

    def step_wait(self) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The results of the step started by :meth:`step_async`."""
        return self._receive_step(slice(None), self.episode_statistics, 0, self)

    def step(self, actions: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        self.step_async(actions)
        return self.step_wait()

    # -- double buffering --------------------------------------------------------------------------
    def split(self) -> list[VecEnv]:
        """Two VecEnvs over the two halves of every worker's sub-envs, for double buffering.

        Half ``g`` holds, for each worker, its sub-envs ``g * k/2 .. (g + 1) * k/2 - 1``; each half steps
        on its own (``step_async`` / ``step_wait``), so a worker steps one half while the caller
        computes the actions of the other. Once split, this env is stepped only through its halves.
        """
        self._check_open("split")
        if self._per_worker % 2:
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}).split: every worker needs an even number of "
                f"sub-envs to step them in two halves, but num_envs={self.num_envs} / "
                f"num_workers={self.num_workers} = {self._per_worker}. Use num_envs = an even multiple of "
                f"num_workers (e.g. {2 * self.num_workers * max(1, self._per_worker // 2)})."
            )
        self._split = True
        return [_ProcessHalf(self, group) for group in (0, 1)]

    # -- shared by the whole env and its halves ----------------------------------------------------
    def _check_whole(self, what: str) -> None:
        self._check_open(what)
        if self._split:
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}).{what}: this env was split in two halves for "
                "double buffering; step and reset the halves that split() returned."
            )

    def _reset_rows(self, seed: int | None, options: dict[str, Any] | None, group: int | None) -> Tensor:
        """Reset every sub-env (``group`` None) or one half; row ``j`` of the result gets ``seed + j``."""
        self._seed = None if seed is None else int(seed)
        low, high, size = 0, self._per_worker, self._per_worker
        if group is not None:
            size = self._per_worker // 2
            low, high = group * size, (group + 1) * size
        for worker in range(self.num_workers):
            self._pool.send(
                worker, ("reset", None if seed is None else int(seed) + worker * size, options, low, high)
            )
        self._pool.wait(range(self.num_workers), "reset", self._fault, on_answer=self._notice)
        rows = slice(None) if group is None else self._half_rows(group)
        self._fault_rows[rows] = False
        self._last_obs[rows] = self._views["obs"][rows]
        return self._obs_tensor(self._views["obs"][rows])

    def _half_rows(self, group: int) -> np.ndarray:
        size = self._per_worker // 2
        return np.concatenate(
            [
                np.arange(w * self._per_worker + group * size, w * self._per_worker + (group + 1) * size)
                for w in range(self.num_workers)
            ]
        )

    def _send_step(self, actions: np.ndarray, rows: Any, slot: int, owner: VecEnv) -> None:
        """Step ``rows`` (the whole env, slot 0, or a half, slot = its group) with ``actions``."""
        if owner in self._order:
            raise EnvError(f"{owner!r}.step_async: a step is already in flight; call step_wait first.")
        self._order.append(owner)
        self._views["actions"][rows] = actions
        self._progress[slot] = PENDING  # no worker touches this slot before it reads the command
        self._complete[slot] = False
        self._slots_in_flight.add(slot)
        self._pool.broadcast(STEP_ALL if owner is self else STEP_HALF[slot])

    def _receive_step(
        self, rows: Any, statistics: EpisodeStatistics, slot: int, owner: VecEnv
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if not self._order or self._order[0] is not owner:
            problem = (
                "no step in flight; call step_async first"
                if owner not in self._order
                else (
                    f"{self._order[0]!r} started its step first; wait for the steps in the order they started"
                )
            )
            raise EnvError(f"{owner!r}.step_wait: {problem}.")
        self._order.popleft()
        self._pool.wait(
            range(self.num_workers),
            "step",
            functools.partial(self._fault, slot=slot),
            until=lambda: self._complete[slot],
            on_answer=self._notice,
        )
        self._slots_in_flight.discard(slot)
        views = {key: self._views[key][rows] for key in self._results}  # copies when rows is an index array
        faulted = self._fault_rows[rows]
        if faulted.any():  # restarted workers: end their episodes at the last good observation
            views = {key: np.array(view) for key, view in views.items()}
            views["final_obs"][faulted] = self._last_obs[rows][faulted]
            views["reward"][faulted], views["terminated"][faulted], views["truncated"][faulted] = 0, 0, 1
            if self.statistics_from_info:  # the restarted sub-envs' statistics are lost with them
                views["episode_end"][faulted] = False
            self._fault_rows[rows] = False
        obs = self._obs_tensor(views["obs"])
        final_obs = self._obs_tensor(views["final_obs"])
        self._last_obs[rows] = views["obs"]
        reward, terminated, truncated = (
            copy_out(views[key], self.device) for key in ("reward", "terminated", "truncated")
        )
        done = terminated | truncated
        if self.statistics_from_info:
            episode_return, statistics_rows = (copy_out(views[key], self.device) for key in _INFO_STATISTICS)
            _, episode_length = statistics.step(torch.zeros_like(reward), statistics_rows)
        else:
            (episode_return, episode_length), statistics_rows = statistics.step(reward, done), None
        info = step_info(final_obs, done, episode_return, episode_length, statistics_rows)
        return obs, reward, terminated, truncated, info

    def render_frame(self, index: int = 0) -> np.ndarray:
        """The rgb array of sub-env ``index`` (requires ``render_mode="rgb_array"``)."""
        self._check_open("render_frame")
        self._check_index(index)
        if self._order:
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}).render_frame: a step is in flight; call "
                "step_wait first."
            )
        worker, local = divmod(index, self._per_worker)
        self._pool.send(worker, ("render", local))
        try:
            return self._pool.receive(worker, "render")
        except Fault as fault:
            self._refuse(fault)
            raise

    def render(self) -> tuple[Any, ...]:
        return tuple(self.render_frame(index) for index in range(self.num_envs))

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}).{what}: the env is closed; build a new one."
            )

    @property
    def pids(self) -> list[int]:
        """The process ids of the live workers."""
        return self._pool.pids

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.closed = True
            self._pool.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.env_id!r}, num_envs={self.num_envs}, "
            f"num_workers={self.num_workers}, device={self.device})"
        )


class _ProcessHalf(VecEnv):
    """One half of a split :class:`ProcessVecEnv`: its own steps, resets and episode statistics."""

    def __init__(self, parent: ProcessVecEnv, group: int) -> None:
        super().__init__(
            parent.num_envs // 2, parent.single_observation_space, parent.single_action_space, parent.device
        )
        self.parent = parent
        self.group = group
        self.metadata = parent.metadata
        self.rows = parent._half_rows(group)
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device)
        action_shape = parent._action_shape[1:]
        self._action_shape = (self.num_envs, *action_shape)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        self.parent._check_open("reset")
        obs = self.parent._reset_rows(seed, options, self.group)
        self.episode_statistics.reset()
        return obs, {}

    def step_async(self, actions: Any) -> None:
        self.parent._check_open("step")
        actions = self.parent._actions_numpy(actions, self._action_shape)
        self.parent._send_step(actions, self.rows, self.group, self)

    def step_wait(self) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        return self.parent._receive_step(self.rows, self.episode_statistics, self.group, self)

    def step(self, actions: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        self.step_async(actions)
        return self.step_wait()

    def state_dict(self) -> dict[str, Any]:
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])

    def close(self, **kwargs: Any) -> None:
        self.parent.close()
        self.closed = True

    def __repr__(self) -> str:
        return f"{self.parent!r}.split()[{self.group}]"
