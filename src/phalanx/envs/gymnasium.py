"""Ordinary (one-env-at-a-time) Gymnasium environments behind the VecEnv contract, in this process.

:func:`make_gym_env` builds one Gymnasium env from an id or a factory, behind a check of the Gymnasium
API; its errors name the extra to install when a dependency is missing. :class:`GymnasiumAdapter` is what
both Gymnasium adapters share (argument checks, space and tensor conversions).

:class:`GymnasiumVecEnv` steps ``num_envs`` copies in this process, one after another, through
``gymnasium.vector.SyncVectorEnv`` in same-step autoreset mode, and converts everything to torch
tensors on ``device``. It is the fallback for any Gymnasium id that phalanx has no batched simulator
for; expect thousands, not millions, of steps per second. :class:`~phalanx.envs.processes.ProcessVecEnv`
steps them in worker processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

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
    step_info,
    tensor_space,
    unsupported_space,
)
from phalanx.envs.gymnasium_ids import GYMNASIUM_EXTRAS, gymnasium_unavailable
from phalanx.envs.mujoco_warnings import gymnasium_model_warnings_silenced
from phalanx.errors import EnvError
from phalanx.pool import copy_out

__all__ = ["EnvFactory", "GymnasiumAdapter", "GymnasiumVecEnv", "env_name", "env_spaces", "make_gym_env"]

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


class ApiCheck(gym.Wrapper):
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


def env_spaces(env: gym.Env) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of a Gymnasium env."""
    return env.observation_space, env.action_space


def env_name(env: str | EnvFactory) -> str:
    """The name of an env id or factory, for messages."""
    return env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))


def make_gym_env(env: str | EnvFactory, make_kwargs: dict[str, Any]) -> ApiCheck:
    """One Gymnasium env from an id or factory, behind the API check; errors say what is missing."""
    name = env_name(env)
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
    return ApiCheck(inner, name)


class GymnasiumAdapter(VecEnv):
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
        self.env_id = env_name(env)
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
        assert act_space.shape is not None, f"{act_space} has a shape (_convert_space checked it)"
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


class GymnasiumVecEnv(GymnasiumAdapter):
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
        frame = self.envs.envs[index].render()
        return cast(np.ndarray, frame)  # an rgb_array env (checked above) renders an array

    def render(self) -> tuple[Any, ...]:
        return self.envs.render()

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.envs.close()
            self.closed = True
