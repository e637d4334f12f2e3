"""What runs inside a :class:`~phalanx.envs.processes.ProcessVecEnv` worker process, and the protocol.

Each worker of the pool builds its block of Gymnasium sub-envs (:class:`EnvWorker`), then steps, resets
and renders them on one-byte messages, reading the actions from and writing the results to the shared
buffers. The messages and a step's progress marks are defined here, for both sides. Forkserver workers
preload this module.
"""

from __future__ import annotations

import contextlib
from typing import Any

import gymnasium as gym

from phalanx.envs.core import flat_observation
from phalanx.envs.gymnasium import ApiCheck, EnvFactory, env_name, env_spaces, make_gym_env
from phalanx.errors import EnvError
from phalanx.pool import OK, WorkerSide, WorkerTask, frame

__all__ = ["DONE", "EXCUSED", "FINISHED", "PENDING", "STEP_ALL", "STEP_HALF", "EnvWorker"]

# Sub-envs in the workers of a WorkerPool, data in its shared buffers, one-byte messages.
DONE = (b"d", b"e")  # worker -> main: all workers stepped slot 0 / 1; results are in shared memory
STEP_ALL, STEP_HALF = (
    frame(b"s"),
    (frame(b"s0"), frame(b"s1")),
)  # step every sub-env / the first, second half

# A step's progress: per slot (0: the whole env or its first half, 1: the second half) and worker, in
# shared memory. Only the last worker to finish a slot tells the main process, which then wakes once per
# step instead of once per worker (on 2 cores: ~90 us of a ~460 us CartPole x 64 step).
PENDING, FINISHED, EXCUSED = 0, 1, 2  # EXCUSED: the worker failed; its restarted successor owes nothing


class EnvWorker(WorkerTask):
    """What a :class:`~phalanx.envs.processes.ProcessVecEnv` worker does: build its sub-envs; step, reset and
    render them."""

    fatal = (EnvError,)  # a broken contract (the old gym API, unequal spaces): no restart would fix it

    def __init__(
        self,
        env: str | EnvFactory,
        make_kwargs: dict[str, Any],
        spaces: tuple[gym.Space, ...],
        per_worker: int,
        statistics_from_info: bool,
    ) -> None:
        self.env, self.make_kwargs, self.spaces, self.per_worker = env, make_kwargs, spaces, per_worker
        self.statistics_from_info = statistics_from_info
        self.flat_space = spaces[0] if isinstance(spaces[0], gym.spaces.Dict) else None
        """A Dict observation space: observations are flattened into the shared buffers."""
        self.envs: list[ApiCheck] = []

    def start(self, worker: WorkerSide) -> None:
        """Views of this worker's rows of the shared buffers, and its sub-envs, checked to have the spaces
        of the env built in the main process."""
        self.worker, self.lock, self.first = worker.index, worker.lock, worker.index * self.per_worker
        views = dict(worker.views)
        self.progress = views.pop("progress")
        self.rows = {name: view[self.first : self.first + self.per_worker] for name, view in views.items()}
        self.done = [frame(notice) for notice in DONE]
        while len(self.envs) < self.per_worker:
            self.where = self.first + len(self.envs)
            self.envs.append(make_gym_env(self.env, self.make_kwargs))
            built = env_spaces(self.envs[-1])
            for which, space, expected in zip(("observation", "action"), built, self.spaces, strict=True):
                if space != expected:
                    raise EnvError(
                        f"sub-env {self.where} of {env_name(self.env)!r} has {which} space {space}, "
                        f"expected {expected} (the space of the first env built). Every sub-env of a "
                        "VecEnv must have the same spaces: make the factory return identical envs."
                    )
        self.where = None
        self.inner = [
            sub_env.env for sub_env in self.envs
        ]  # stepped past the API check: the unpacking checks

    def handle(self, message: Any) -> Any:
        if isinstance(message, bytes):
            return self.step(message)
        command, *arguments = message
        if command == "reset":  # sub-envs low..high-1 get the seeds seed, seed + 1, ...
            seed, options, low, high = arguments
            for current in range(low, high):
                self.where = self.first + current
                obs, _ = self.envs[current].reset(
                    seed=None if seed is None else seed + current - low, options=options
                )
                self.rows["obs"][current] = (
                    obs if self.flat_space is None else flat_observation(self.flat_space, obs)
                )
            self.where = None
            return OK
        return self.envs[arguments[0]].render()  # "render"

    def step(self, message: bytes) -> bytes | None:
        """Step every sub-env (b"s") or one half (b"s0", b"s1") with the actions in shared memory; the
        last worker to finish the slot answers its notice."""
        slot, low, high = 0, 0, len(self.envs)
        if len(message) > 1:
            slot, half = int(message[1:]), len(self.envs) // 2
            low, high = half * slot, half * slot + half
        rows, envs, inner, flat_space = self.rows, self.envs, self.inner, self.flat_space
        actions, obs, final_obs = rows["actions"], rows["obs"], rows["final_obs"]
        reward, terminated, truncated = rows["reward"], rows["terminated"], rows["truncated"]
        current = low
        try:
            for current in range(low, high):
                result = inner[current].step(actions[current])
                try:
                    next_obs, r, term, trunc, info = result
                except (TypeError, ValueError):
                    envs[current].check_step(result)  # the old gym API says so
                    raise
                reward[current], terminated[current], truncated[current] = r, term, trunc
                if flat_space is not None:
                    next_obs = flat_observation(flat_space, next_obs)
                final_obs[current] = next_obs  # the true next observation of every row
                if self.statistics_from_info:
                    self.record_statistics(current, info)
                if term or trunc:
                    next_obs, _ = envs[current].reset()
                    if flat_space is not None:
                        next_obs = flat_observation(flat_space, next_obs)
                obs[current] = next_obs
        except BaseException:
            self.where = self.first + current
            raise
        with self.lock:
            self.progress[slot, self.worker] = FINISHED
            last = self.progress[slot].all()
        return self.done[slot] if last else None

    def record_statistics(self, current: int, info: dict[str, Any]) -> None:
        """Write sub-env ``current``'s ``info["episode"]`` (RecordEpisodeStatistics) where it ended one."""
        episode = info.get("episode")
        self.rows["episode_end"][current] = episode is not None
        if episode is not None:
            self.rows["episode_return"][current] = episode["r"]

    def close(self) -> None:
        for sub_env in self.envs:
            with contextlib.suppress(Exception):  # closing is best effort on the way out
                sub_env.close()
