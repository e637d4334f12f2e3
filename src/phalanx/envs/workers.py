"""Adapters that run ordinary (one-env-at-a-time) Gymnasium environments behind the VecEnv contract.

:class:`GymnasiumVecEnv` steps ``num_envs`` copies in this process, one after another, through
``gymnasium.vector.SyncVectorEnv`` in same-step autoreset mode, and converts everything to torch
tensors on ``device``. It is the fallback for any Gymnasium id that phalanx has no batched simulator
for; expect thousands, not millions, of steps per second.

:class:`ProcessVecEnv` steps them in ``num_workers`` processes that exchange actions, observations,
rewards and flags with the main process through shared memory; it restarts workers that fail.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from phalanx.envs.core import (
    EpisodeStatistics,
    Tensor,
    VecEnv,
    flat_observation,
    observation_dtype,
    observation_shape,
    step_info,
    tensor_space,
    unsupported_space,
)
from phalanx.envs.gymnasium_ids import GYMNASIUM_EXTRAS, gymnasium_unavailable
from phalanx.envs.mujoco_warnings import gymnasium_model_warnings_silenced
from phalanx.errors import EnvError
from phalanx.pool import OK, Fault, WorkerPool, WorkerSide, WorkerTask, choose_start_method, copy_out, frame

__all__ = ["GymnasiumVecEnv", "ProcessVecEnv", "make_gym_env"]

EnvFactory = Callable[..., gym.Env]


def _extra_for(env_id: str, error: BaseException) -> str | None:
    """The phalanx extra that provides what ``error`` says is missing for ``env_id``, if known."""
    entry_point = ""
    spec = gym.envs.registry.get(env_id) if isinstance(env_id, str) else None
    if spec is not None and isinstance(spec.entry_point, str):
        entry_point = spec.entry_point
    text = f"{entry_point} {error}".lower()
    for prefix, (_, extra) in GYMNASIUM_EXTRAS.items():
        if entry_point.startswith(prefix):
            return extra
    for word, extra in (("box2d", "box2d"), ("mujoco", "mujoco"), ("pygame", "render")):
        if word in text:
            return extra
    return None


class _ApiCheck(gym.Wrapper):
    """Turns the old gym API (4-tuple step, bare-obs reset) into a clear EnvError at the first call."""

    def __init__(self, env: gym.Env, name: str) -> None:
        super().__init__(env)
        self._name = name

    def _old_api(self, what: str) -> EnvError:
        return EnvError(
            f"Environment {self._name!r} uses the old gym API: {what}. phalanx needs the Gymnasium >= 1 "
            "API, where reset returns (obs, info) and step returns (obs, reward, terminated, truncated, "
            "info). Fix: port the env (split `done` into `terminated` for true terminal states and "
            "`truncated` for time limits), or wrap the old env with shimmy's GymV21CompatibilityV0 / "
            "GymV26CompatibilityV0 (`pip install shimmy`)."
        )

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        result = self.env.reset(**kwargs)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
            raise self._old_api(f"reset() returned {type(result).__name__}, not an (obs, info) tuple")
        return result

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        return self.check_step(self.env.step(action))

    def check_step(self, result: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """``result`` if it is a step result of the Gymnasium API, else the old-API error."""
        if not isinstance(result, tuple) or len(result) != 5:
            got = f"{len(result)} values" if isinstance(result, tuple) else type(result).__name__
            raise self._old_api(f"step() returned {got}, expected 5 (obs, reward, done, info is the old API)")
        return result


def _spaces(env: gym.Env) -> tuple[gym.Space, gym.Space]:
    return env.observation_space, env.action_space


def _env_name(env: str | EnvFactory) -> str:
    return env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))


def make_gym_env(env: str | EnvFactory, make_kwargs: dict[str, Any]) -> gym.Env:
    """One Gymnasium env from an id or factory, behind the API check; errors say what is missing."""
    name = _env_name(env)
    unavailable = gymnasium_unavailable(env) if isinstance(env, str) else None
    if unavailable is not None:
        raise EnvError(f"Environment {name!r} cannot run in phalanx: {unavailable}.")
    try:
        if isinstance(env, str):
            with gymnasium_model_warnings_silenced(env):  # MuJoCo's deprecations of Gymnasium's XML
                inner = gym.make(env, **make_kwargs)
        else:
            inner = env(**make_kwargs)
    except EnvError:
        raise
    except (gym.error.DependencyNotInstalled, ImportError) as error:
        extra = _extra_for(name, error)
        if extra is None:
            fix = "Install the package it names."
        else:
            fix = f"Install it with `pip install 'phalanx[{extra}]'`"
            fix += " (Box2D builds from source: `pip install swig` first)." if extra == "box2d" else "."
        raise EnvError(
            f"Environment {name!r} is known to Gymnasium but cannot be built: a dependency is "
            f"missing ({type(error).__name__}: {error}). {fix}"
        ) from None
    except gym.error.Error as error:
        raise EnvError(
            f"Gymnasium could not build {name!r} with arguments {make_kwargs}: "
            f"{type(error).__name__}: {error}. Check the id and its keyword arguments "
            "(`phalanx envs` lists the ids)."
        ) from None
    except TypeError as error:
        raise EnvError(
            f"Building {name!r} with arguments {make_kwargs} failed: {error}. Pass only "
            "keyword arguments that the environment's constructor accepts."
        ) from None
    if not isinstance(inner, gym.Env):
        raise EnvError(
            f"The env factory {name!r} returned {type(inner).__name__}, expected a gymnasium.Env. If it "
            "is an env of the old `gym` package, wrap it with shimmy's GymV26CompatibilityV0 "
            "(`pip install shimmy`) or port it to Gymnasium >= 1."
        )
    return _ApiCheck(inner, name)


class _GymnasiumAdapter(VecEnv):
    """What both Gymnasium adapters share: argument checks, space conversion, tensor conversion."""

    def __init__(
        self,
        env: str | EnvFactory,
        num_envs: int,
        device: str | torch.device,
        render_mode: str | None,
        statistics_from_info: bool,
        kwargs: dict[str, Any],
    ) -> None:
        self.env_id = _env_name(env)
        if not isinstance(env, str) and not callable(env):
            raise EnvError(
                f"{type(self).__name__}: env must be a Gymnasium id or a callable returning a "
                f"gymnasium.Env, got {type(env).__name__} ({env!r})."
            )
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}): num_envs must be an integer >= 1, got {num_envs!r}."
            )
        self._env = env
        self._make_kwargs = dict(kwargs)
        if render_mode is not None:
            self._make_kwargs["render_mode"] = render_mode
        self.render_mode = render_mode
        self._num_envs_requested = int(num_envs)
        self._device_requested = device
        self.statistics_from_info = bool(statistics_from_info)

    def _set_spaces(
        self, obs_space: gym.Space, act_space: gym.Space, render_modes: list[str], fps: Any
    ) -> None:
        single_obs = self._convert_space(obs_space, "observation")
        single_act = self._convert_space(act_space, "action")
        VecEnv.__init__(self, self._num_envs_requested, single_obs, single_act, self._device_requested)
        self.metadata = {**VecEnv.metadata, "render_modes": list(render_modes), "render_fps": fps}
        self._obs_space = obs_space
        self._obs_dtype = observation_dtype(single_obs)
        self._integer_act = isinstance(act_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
        self._action_shape = (
            (self.num_envs,)
            if isinstance(act_space, gym.spaces.Discrete)
            else (self.num_envs, *act_space.shape)
        )
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device)

    # -- spaces ------------------------------------------------------------------------------------
    def _unsupported(self, which: str, space: gym.Space) -> EnvError:
        self.close()
        return unsupported_space(
            space,
            which,
            f"Environment {self.env_id!r}",
            "Fix: convert it with a Gymnasium wrapper (e.g. gymnasium.wrappers.FlattenObservation for "
            "Tuple observations, or an observation wrapper that drops or encodes the unsupported part) in "
            f"an env factory, and pass that factory to {type(self).__name__}.",
        )

    def _convert_space(self, space: gym.Space, role: str) -> gym.Space:
        converted = tensor_space(space, role)
        if converted is None:
            raise self._unsupported(role, space)
        return converted

    # -- conversions -------------------------------------------------------------------------------
    def _obs_tensor(self, obs: np.ndarray) -> Tensor:
        """A batch of observations (Dict ones already flat) as the tensor the contract hands out: uint8
        stays uint8, Discrete becomes one-hot, the rest float32."""
        if isinstance(self._obs_space, gym.spaces.Discrete):
            index = torch.as_tensor(np.asarray(obs, dtype=np.int64) - int(self._obs_space.start))
            return torch.nn.functional.one_hot(index, int(self._obs_space.n)).to(self.device, torch.float32)
        return copy_out(np.asarray(obs, dtype=self._obs_dtype), self.device)

    def _actions_numpy(self, actions: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
        shape = self._action_shape if shape is None else shape
        if isinstance(actions, torch.Tensor):
            actions = actions.detach().cpu().numpy()
        actions = np.asarray(actions, dtype=np.int64 if self._integer_act else np.float32)
        if actions.shape != shape:
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}).step: actions have shape {actions.shape}, "
                f"expected {shape} (num_envs={shape[0]}, action space "
                f"{self.single_action_space}). Pass one action per sub-env."
            )
        return actions

    def _check_index(self, index: int) -> None:
        if self.render_mode != "rgb_array":
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}).render_frame: the env was created with "
                f"render_mode={self.render_mode!r}, expected 'rgb_array'. Create it with "
                "render_mode='rgb_array' (make_env(..., render_mode='rgb_array'))."
            )
        if not 0 <= index < self.num_envs:
            raise EnvError(
                f"{type(self).__name__}({self.env_id!r}).render_frame: index {index} is out of range, "
                f"expected 0 <= index < num_envs={self.num_envs}."
            )

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Episode statistics only: Gymnasium envs cannot be checkpointed (a resume re-resets them)."""
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env_id!r}, num_envs={self.num_envs}, device={self.device})"


class GymnasiumVecEnv(_GymnasiumAdapter):
    """``num_envs`` copies of a Gymnasium env, run in-process, behind the phalanx VecEnv contract.

    Args:
        env: a Gymnasium id (``"CartPole-v1"``) or a factory returning a ``gymnasium.Env``. A factory is
            called as ``env(**kwargs)``, plus ``render_mode=render_mode`` when that is not None.
        num_envs: number of copies.
        device: where the returned tensors live.
        render_mode: passed to every copy; ``"rgb_array"`` enables :meth:`render_frame`.
        statistics_from_info: take the episode statistics from the sub-envs' ``info["episode"]``, as
            Gymnasium's ``RecordEpisodeStatistics`` writes it, instead of summing the rewards the agent
            sees: place that wrapper below wrappers that change the reward or end episodes early (Atari's
            reward clipping and episodic life), and ``info["episode_return"]`` reports the whole
            episode's return (the game score) at the steps where it appears, with the mask
            ``info["_episode_return"]``; ``info["episode_length"]`` counts this env's steps since the
            previous such step (or reset).
        **kwargs: passed to ``gymnasium.make`` (or to the factory).

    Conversions (:func:`~phalanx.envs.core.tensor_space`): a uint8 Box observation (images) stays a uint8
    tensor; other Box observations become float32; a ``Discrete(n)`` observation becomes a float32
    one-hot vector of length ``n`` (observation space ``Box(0, 1, (n,))``), since an index fed as a
    number to a network would impose a meaningless order on the states; a ``Dict`` observation (Box,
    Discrete and MultiBinary parts) keeps its Dict space and arrives as the float32 vector of
    ``gymnasium.spaces.flatten``. Actions arrive as torch (or numpy) and go to the env as int64
    (``Discrete``; ``MultiDiscrete``: ``(num_envs, k)``; both in the simulator's space, ``start`` included) or
    float32 (``Box``). Other spaces raise :class:`~phalanx.errors.EnvError`.

    ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i``. ``info["final_obs"]`` is the full
    ``(num_envs, *obs_shape)`` tensor of phalanx's convention; other info keys from the envs are
    passed through as Gymnasium returns them (numpy arrays with ``_key`` masks).

    Checkpointing: Gymnasium envs cannot be saved and restored, so :meth:`state_dict` holds only the
    episode statistics; a resumed run starts the envs from a fresh reset.
    """

    def __init__(
        self,
        env: str | EnvFactory,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        render_mode: str | None = None,
        statistics_from_info: bool = False,
        **kwargs: Any,
    ) -> None:
        self.closed = True  # until the envs exist
        super().__init__(env, num_envs, device, render_mode, statistics_from_info, kwargs)
        self.envs = SyncVectorEnv(
            [lambda: make_gym_env(env, self._make_kwargs)] * self._num_envs_requested,
            copy=False,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
        self.closed = False
        self._set_spaces(
            self.envs.single_observation_space,
            self.envs.single_action_space,
            self.envs.metadata.get("render_modes", []),
            self.envs.metadata.get("render_fps"),
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.envs.reset(seed=seed, options=options)
        self.episode_statistics.reset()
        return self._obs_tensor(self._flat_batch(obs)), dict(info)

    def _flat_batch(self, obs: Any) -> np.ndarray:
        """The vector env's batch of observations as one array (a Dict batch: one flat row per sub-env)."""
        if not isinstance(self._obs_space, gym.spaces.Dict):
            return obs
        rows = gym.vector.utils.iterate(self.envs.observation_space, obs)
        return np.stack([flat_observation(self._obs_space, row) for row in rows])

    def _flat_one(self, obs: Any) -> Any:
        """One sub-env's observation as a row of :meth:`_flat_batch`."""
        return flat_observation(self._obs_space, obs) if isinstance(self._obs_space, gym.spaces.Dict) else obs

    def step(self, actions: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.envs.step(self._actions_numpy(actions))
        # SAME_STEP mode: info["final_obs"] is an object array holding the last observation of the
        # rows that ended (None elsewhere) and info["_final_obs"] their mask; info["final_info"] their
        # step's info.
        ended = np.logical_or(terminated, truncated)
        info = dict(info)
        flat = self._flat_batch(obs)
        obs_t = self._obs_tensor(flat)
        if ended.any():
            final = np.array(flat, copy=True)
            for i in np.flatnonzero(ended):
                final[i] = self._flat_one(info["final_obs"][i])
            final_t = self._obs_tensor(final)
        else:
            final_t = obs_t.clone()
        reward_t = torch.tensor(reward, dtype=torch.float32, device=self.device)
        terminated_t = torch.tensor(terminated, dtype=torch.bool, device=self.device)
        truncated_t = torch.tensor(truncated, dtype=torch.bool, device=self.device)
        done = terminated_t | truncated_t
        if self.statistics_from_info:
            episode_return, rows = self._info_statistics(info.get("final_info", {}))
            _, episode_length = self.episode_statistics.step(torch.zeros_like(reward_t), rows)
        else:
            (episode_return, episode_length), rows = self.episode_statistics.step(reward_t, done), None
        info.update(step_info(final_t, done, episode_return, episode_length, rows))
        return obs_t, reward_t, terminated_t, truncated_t, info

    def _info_statistics(self, final_info: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``(episode_return, rows)`` from the ``info["episode"]`` of the rows that ended (in the vector
        env's ``final_info``); zero and not reported elsewhere."""
        episode = final_info.get("episode")
        if episode is None:
            zeros = torch.zeros(self.num_envs, device=self.device)
            return zeros, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        rows = np.asarray(final_info["_episode"], dtype=bool)
        episode_return = torch.tensor(np.where(rows, episode["r"], 0.0), dtype=torch.float32)
        return episode_return.to(self.device), torch.from_numpy(rows).to(self.device)

    def render_frame(self, index: int = 0) -> np.ndarray:
        """The rgb array of sub-env ``index`` (requires ``render_mode="rgb_array"``)."""
        self._check_index(index)
        return self.envs.envs[index].render()

    def render(self) -> tuple[Any, ...]:
        return self.envs.render()

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.envs.close()
            self.closed = True


# ------------------------------------------------------------------------------------------------------
# ProcessVecEnv: sub-envs in the workers of a WorkerPool, data in its shared buffers, one-byte messages.

_DONE = (b"d", b"e")  # worker -> main: all workers stepped slot 0 / 1; results are in shared memory
_STEP_ALL, _STEP_HALF = (
    frame(b"s"),
    (frame(b"s0"), frame(b"s1")),
)  # step every sub-env / the first, second half

# A step's progress: per slot (0: the whole env or its first half, 1: the second half) and worker, in
# shared memory. Only the last worker to finish a slot tells the main process, which then wakes once per
# step instead of once per worker (on 2 cores: ~90 us of a ~460 us CartPole x 64 step).
_PENDING, _FINISHED, _EXCUSED = 0, 1, 2  # _EXCUSED: the worker failed; its restarted successor owes nothing
_RESULTS = ("obs", "final_obs", "reward", "terminated", "truncated")  # the buffers a step writes
_INFO_STATISTICS = ("episode_return", "episode_end")  # and with statistics_from_info


class _EnvWorker(WorkerTask):
    """What a :class:`ProcessVecEnv` worker does: build its sub-envs; step, reset and render them."""

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
        self.envs: list[gym.Env] = []

    def start(self, worker: WorkerSide) -> None:
        """Views of this worker's rows of the shared buffers, and its sub-envs, checked to have the spaces
        of the env built in the main process."""
        self.worker, self.lock, self.first = worker.index, worker.lock, worker.index * self.per_worker
        views = dict(worker.views)
        self.progress = views.pop("progress")
        self.rows = {name: view[self.first : self.first + self.per_worker] for name, view in views.items()}
        self.done = [frame(notice) for notice in _DONE]
        while len(self.envs) < self.per_worker:
            self.where = self.first + len(self.envs)
            self.envs.append(make_gym_env(self.env, self.make_kwargs))
            built = _spaces(self.envs[-1])
            for which, space, expected in zip(("observation", "action"), built, self.spaces, strict=True):
                if space != expected:
                    raise EnvError(
                        f"sub-env {self.where} of {_env_name(self.env)!r} has {which} space {space}, "
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
            self.progress[slot, self.worker] = _FINISHED
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


class ProcessVecEnv(_GymnasiumAdapter):
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
            obs_space, act_space = _spaces(probe)
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
            _EnvWorker(
                env, self._make_kwargs, (obs_space, act_space), self._per_worker, self.statistics_from_info
            ),
            self.num_workers,
            name="phalanx-worker",
            start_method=start_method,
            preload=["phalanx.envs.workers"],
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
                if self._progress[slot, worker] == _PENDING:
                    self._progress[slot, worker] = _EXCUSED
                if self._progress[slot].all():
                    self._complete[slot] = True

    def _notice(self, answer: bytes) -> None:
        """The last worker to finish a slot's step says so: the step is complete. Every wait passes it
        on: a half's step finishes while the other half resets (or a worker restarts)."""
        self._complete[_DONE.index(answer)] = True

    def _refuse(self, fault: Fault) -> None:
        """A fault while a worker starts or restarts: no restart; close and raise."""
        self._fault(fault, restart=False)

    def _fault(self, fault: Fault, restart: bool = True, slot: int | None = None) -> None:
        """Restart the worker of ``fault`` (its sub-envs' episodes end truncated), or close the env and raise
        EnvError for a contract error, past ``max_restarts``, or when ``restart`` is false."""
        worker, name = fault.worker, f"{type(self).__name__}({self.env_id!r})"
        if fault.kind == "hung" and slot is not None and self._progress[slot, worker] != _PENDING:
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
        self._progress[slot] = _PENDING  # no worker touches this slot before it reads the command
        self._complete[slot] = False
        self._slots_in_flight.add(slot)
        self._pool.broadcast(_STEP_ALL if owner is self else _STEP_HALF[slot])

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
