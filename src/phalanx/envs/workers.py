"""Adapters that run ordinary (one-env-at-a-time) Gymnasium environments behind the VecEnv contract.

:class:`GymnasiumVecEnv` steps ``num_envs`` copies in this process, one after another, through
``gymnasium.vector.SyncVectorEnv`` in same-step autoreset mode, and converts everything to torch
tensors on ``device``. It is the fallback for any Gymnasium id that phalanx has no batched simulator
for; expect thousands, not millions, of steps per second.

The process-parallel ``ProcessVecEnv`` (sub-envs in worker processes, shared-memory buffers) lands
in a later issue, in this same file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from phalanx.envs.core import EpisodeStatistics, Tensor, VecEnv
from phalanx.errors import EnvError

__all__ = ["GymnasiumVecEnv"]

EnvFactory = Callable[..., gym.Env]

# Where Gymnasium's optional environments live, and the phalanx extra that installs them.
_EXTRAS = (
    ("gymnasium.envs.box2d", "box2d"),
    ("gymnasium.envs.mujoco", "mujoco"),
)


def _extra_for(env_id: str, error: BaseException) -> str | None:
    """The phalanx extra that provides what ``error`` says is missing for ``env_id``, if known."""
    entry_point = ""
    spec = gym.envs.registry.get(env_id) if isinstance(env_id, str) else None
    if spec is not None and isinstance(spec.entry_point, str):
        entry_point = spec.entry_point
    text = f"{entry_point} {error}".lower()
    for prefix, extra in _EXTRAS:
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
        result = self.env.step(action)
        if not isinstance(result, tuple) or len(result) != 5:
            got = f"{len(result)} values" if isinstance(result, tuple) else type(result).__name__
            raise self._old_api(f"step() returned {got}, expected 5 (obs, reward, done, info is the old API)")
        return result


def _float32_box(space: gym.spaces.Box) -> gym.spaces.Box:
    return gym.spaces.Box(
        space.low.astype(np.float32), space.high.astype(np.float32), shape=space.shape, dtype=np.float32
    )


class GymnasiumVecEnv(VecEnv):
    """``num_envs`` copies of a Gymnasium env, run in-process, behind the phalanx VecEnv contract.

    Args:
        env: a Gymnasium id (``"CartPole-v1"``) or a factory returning a ``gymnasium.Env``. A factory is
            called as ``env(**kwargs)``, plus ``render_mode=render_mode`` when that is not None.
        num_envs: number of copies.
        device: where the returned tensors live.
        render_mode: passed to every copy; ``"rgb_array"`` enables :meth:`render_frame`.
        **kwargs: passed to ``gymnasium.make`` (or to the factory).

    Conversions: observations become float32 tensors; a ``Discrete(n)`` observation becomes a float32
    one-hot vector of length ``n`` (observation space ``Box(0, 1, (n,))``), since an index fed as a
    number to a network would impose a meaningless order on the states. Actions arrive as torch (or
    numpy) and go to the env as int64 (``Discrete``) or float32 (``Box``). Box and Discrete observation
    and action spaces are supported; others raise :class:`~phalanx.errors.EnvError`.

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
        **kwargs: Any,
    ) -> None:
        self.env_id = env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
        if not isinstance(env, str) and not callable(env):
            raise EnvError(
                f"GymnasiumVecEnv: env must be a Gymnasium id or a callable returning a gymnasium.Env, "
                f"got {type(env).__name__} ({env!r})."
            )
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise EnvError(
                f"GymnasiumVecEnv({self.env_id!r}): num_envs must be an integer >= 1, got {num_envs!r}."
            )
        make_kwargs = dict(kwargs)
        if render_mode is not None:
            make_kwargs["render_mode"] = render_mode

        def make_one() -> gym.Env:
            inner = gym.make(env, **make_kwargs) if isinstance(env, str) else env(**make_kwargs)
            if not isinstance(inner, gym.Env):
                raise EnvError(
                    f"GymnasiumVecEnv: the factory {self.env_id!r} returned {type(inner).__name__}, "
                    "expected a gymnasium.Env. If it is an env of the old `gym` package, wrap it with "
                    "shimmy's GymV26CompatibilityV0 (`pip install shimmy`) or port it to Gymnasium >= 1."
                )
            return _ApiCheck(inner, self.env_id)

        try:
            envs = SyncVectorEnv(
                [make_one for _ in range(int(num_envs))], copy=False, autoreset_mode=AutoresetMode.SAME_STEP
            )
        except EnvError:
            raise
        except (gym.error.DependencyNotInstalled, ImportError) as error:
            extra = _extra_for(self.env_id, error)
            if extra is None:
                fix = "Install the package it names."
            else:
                fix = f"Install it with `pip install 'phalanx[{extra}]'`"
                fix += " (Box2D builds from source: `pip install swig` first)." if extra == "box2d" else "."

            raise EnvError(
                f"Environment {self.env_id!r} is known to Gymnasium but cannot be built: a dependency is "
                f"missing ({type(error).__name__}: {error}). {fix}"
            ) from None
        except gym.error.Error as error:
            raise EnvError(
                f"Gymnasium could not build {self.env_id!r} with arguments {make_kwargs}: "
                f"{type(error).__name__}: {error}. Check the id and its keyword arguments "
                "(`phalanx envs` lists the ids)."
            ) from None
        except TypeError as error:
            raise EnvError(
                f"Building {self.env_id!r} with arguments {make_kwargs} failed: {error}. Pass only "
                "keyword arguments that the environment's constructor accepts."
            ) from None

        self.envs = envs
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        single_obs = self._convert_observation_space(obs_space)
        single_act = self._convert_action_space(act_space)
        super().__init__(int(num_envs), single_obs, single_act, device)
        self.metadata = {
            **VecEnv.metadata,
            "render_modes": list(envs.metadata.get("render_modes", [])),
            "render_fps": envs.metadata.get("render_fps"),
        }
        self.render_mode = render_mode
        self._obs_space = obs_space
        self._discrete_act = isinstance(act_space, gym.spaces.Discrete)
        self._action_shape = (self.num_envs,) if self._discrete_act else (self.num_envs, *act_space.shape)
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device)

    # -- spaces ------------------------------------------------------------------------------------
    def _unsupported(self, which: str, space: gym.Space) -> EnvError:
        self_envs = getattr(self, "envs", None)
        if self_envs is not None:
            self_envs.close()
        return EnvError(
            f"Environment {self.env_id!r} has {which} space {space}; phalanx supports Box and Discrete "
            f"{which} spaces. Fix: flatten it with a Gymnasium wrapper (e.g. "
            f"gymnasium.wrappers.FlattenObservation for Dict/Tuple observations) in an env factory, and "
            "pass that factory to GymnasiumVecEnv."
        )

    def _convert_observation_space(self, space: gym.Space) -> gym.spaces.Box:
        if isinstance(space, gym.spaces.Discrete):
            return gym.spaces.Box(0.0, 1.0, shape=(int(space.n),), dtype=np.float32)
        if isinstance(space, gym.spaces.Box):
            return _float32_box(space)
        raise self._unsupported("observation", space)

    def _convert_action_space(self, space: gym.Space) -> gym.Space:
        if isinstance(space, gym.spaces.Discrete):
            return gym.spaces.Discrete(int(space.n), start=int(space.start))
        if isinstance(space, gym.spaces.Box):
            return _float32_box(space)
        raise self._unsupported("action", space)

    # -- conversions -------------------------------------------------------------------------------
    def _obs_tensor(self, obs: np.ndarray) -> Tensor:
        if isinstance(self._obs_space, gym.spaces.Discrete):
            index = torch.as_tensor(np.asarray(obs, dtype=np.int64) - int(self._obs_space.start))
            return torch.nn.functional.one_hot(index, int(self._obs_space.n)).to(self.device, torch.float32)
        return torch.tensor(obs, dtype=torch.float32, device=self.device)  # copies: gymnasium reuses obs

    def _actions_numpy(self, actions: Any) -> np.ndarray:
        if isinstance(actions, torch.Tensor):
            actions = actions.detach().cpu().numpy()
        actions = np.asarray(actions, dtype=np.int64 if self._discrete_act else np.float32)
        if actions.shape != self._action_shape:
            raise EnvError(
                f"GymnasiumVecEnv({self.env_id!r}).step: actions have shape {actions.shape}, expected "
                f"{self._action_shape} (num_envs={self.num_envs}, action space {self.single_action_space}). "
                "Pass one action per sub-env."
            )
        return actions

    # -- the contract ------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.envs.reset(seed=seed, options=options)
        self.episode_statistics.reset()
        return self._obs_tensor(obs), dict(info)

    def step(self, actions: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.envs.step(self._actions_numpy(actions))
        # SAME_STEP mode: info["final_obs"] is an object array holding the last observation of the
        # rows that ended (None elsewhere) and info["_final_obs"] their mask.
        ended = np.logical_or(terminated, truncated)
        info = dict(info)
        obs_t = self._obs_tensor(obs)
        if ended.any():
            final = np.array(obs, copy=True)
            for i in np.flatnonzero(ended):
                final[i] = info["final_obs"][i]
            info["final_obs"] = self._obs_tensor(final)
        else:
            info["final_obs"] = obs_t.clone()
        reward_t = torch.tensor(reward, dtype=torch.float32, device=self.device)
        terminated_t = torch.tensor(terminated, dtype=torch.bool, device=self.device)
        truncated_t = torch.tensor(truncated, dtype=torch.bool, device=self.device)
        done = terminated_t | truncated_t
        episode_return, episode_length = self.episode_statistics.step(reward_t, done)
        info["_final_obs"] = done
        info["episode_return"] = episode_return
        info["episode_length"] = episode_length
        return obs_t, reward_t, terminated_t, truncated_t, info

    def render_frame(self, index: int = 0) -> np.ndarray:
        """The rgb array of sub-env ``index`` (requires ``render_mode="rgb_array"``)."""
        if self.render_mode != "rgb_array":
            raise EnvError(
                f"GymnasiumVecEnv({self.env_id!r}).render_frame: the env was created with "
                f"render_mode={self.render_mode!r}, expected 'rgb_array'. Create it with "
                "render_mode='rgb_array' (make_env(..., render_mode='rgb_array'))."
            )
        if not 0 <= index < self.num_envs:
            raise EnvError(
                f"GymnasiumVecEnv({self.env_id!r}).render_frame: index {index} is out of range, expected "
                f"0 <= index < num_envs={self.num_envs}."
            )
        return self.envs.envs[index].render()

    def render(self) -> tuple[Any, ...]:
        return self.envs.render()

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.envs.close()
            self.closed = True

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Episode statistics only: Gymnasium envs cannot be checkpointed (a resume re-resets them)."""
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])

    def __repr__(self) -> str:
        return f"GymnasiumVecEnv({self.env_id!r}, num_envs={self.num_envs}, device={self.device})"
