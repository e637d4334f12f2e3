"""EnvPool's C++ vectorized environments behind the VecEnv contract: ``make_env("envpool:<id>")``.

`EnvPool <https://envpool.readthedocs.io>`_ steps many copies of an Atari, MuJoCo, classic-control,
... environment in C++ threads and returns numpy batches. :class:`EnvPoolVecEnv` runs one pool in
synchronous mode (every step returns all ``num_envs`` rows, in sub-env order) and converts its
arrays to torch tensors on ``device``.

EnvPool's Gymnasium API resets an ended sub-env on the *next* call to ``step`` (``NEXT_STEP``
autoreset: that call ignores the row's action and returns the reset observation with reward 0),
and it has no option for another mode. The adapter converts this to phalanx's same-step autoreset
without an extra step: after a step in which rows ended, it resets exactly those rows at once
(``pool.reset(env_ids)``), so their ``obs`` row is the first observation of the next episode and
``info["final_obs"]`` keeps the last one. Every transition the agent sees is a real one, and the
reset draws the same random initial state that EnvPool's own autoreset would have drawn. The price
is a second call into EnvPool on steps where some sub-env ended: negligible for long episodes
(MuJoCo's 1000 steps), noticeable when episodes last a few dozen steps.

Atari (``envpool:Pong-v5``, ``envpool:Breakout-v5``, ...): EnvPool's own preprocessing (noop reset, frame
skip 4 with max-pool, 84x84 grey, 4 stacked frames, uint8), with episodic life and reward clipping on
by default as CleanRL's ``ppo_atari_envpool.py`` sets them (:data:`ATARI_DEFAULTS`). The learner sees
clipped rewards and ``terminated`` at every life lost; the episode statistics are the game's: the
unclipped score (EnvPool's ``info["reward"]``) summed until the game is over (``info["terminated"]``) or
truncated, reported at that step with ``info["_episode_return"]`` (as CleanRL's RecordEpisodeStatistics
for EnvPool does). Episodic life is the adapter's, on EnvPool's ``info["lives"]``: EnvPool's own
ends the life's episode inside the pool, and an explicit ``pool.reset(env_ids)`` (which the same-step
conversion needs) then restarts the whole game; here the game simply goes on after a life is lost
(the row's next observation is the next frame, as after Stable-Baselines3's EpisodicLifeEnv, without
its no-op step).
"""

from __future__ import annotations

import difflib
import warnings
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.core import (
    EpisodeStatistics,
    StatisticsCheckpoint,
    Tensor,
    VecEnv,
    step_info,
    supported_tensor_space,
)
from phalanx.errors import EnvError, import_optional

__all__ = ["EnvPoolVecEnv"]

# envpool.make arguments the adapter sets itself; passing them in **kwargs would break the contract.
_RESERVED = {
    "env_type": "the adapter always uses EnvPool's Gymnasium API (env_type='gymnasium')",
    "num_envs": "pass num_envs as EnvPoolVecEnv's own argument",
    "gym_reset_return_info": "the adapter needs reset() to return (obs, info)",
    "env_seed": "seed with reset(seed=s) or seed=s; sub-env i then draws from seed s + i",
}
_SEED_RANGE = (-(2**31), 2**31 - 1)  # EnvPool seeds are C++ int32
ATARI_DEFAULTS = {"episodic_life": True, "reward_clip": True}
"""EnvPool Atari settings that differ from EnvPool's defaults, as CleanRL's ppo_atari_envpool.py sets them
(pass ``episodic_life=False`` or ``reward_clip=False`` to make_env to change them); ``episodic_life`` is
implemented by the adapter (see the module docstring)."""


class EnvPoolVecEnv(StatisticsCheckpoint, VecEnv):
    """``num_envs`` copies of an EnvPool environment, stepped in C++, behind the phalanx VecEnv contract.

    Args:
        env_id: an EnvPool id (``"HalfCheetah-v5"``, ``"Pong-v5"``, ``"CartPole-v1"``; see
            ``envpool.list_all_envs()``), without the ``"envpool:"`` prefix that :func:`make_env` takes.
        num_envs: number of sub-envs in the pool.
        device: where the returned tensors live.
        **kwargs: passed to ``envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, ...)``,
            e.g. ``num_threads=4``, ``max_episode_steps=200``, ``seed=7`` (the seed of the first
            :meth:`reset` without a seed; EnvPool's default is 42) or Atari's ``episodic_life=True``.

    Conversions: observations become float32 tensors of the same shape, except uint8 ones: Atari frames
    stay uint8 ``(stack, 84, 84)`` tensors (the networks scale them by 1/255; buffers keep one byte a
    pixel). A ``Discrete(n)`` observation (toy-text tasks) becomes a float32 one-hot vector of length
    ``n``. Rewards become float32, ``terminated``/``truncated`` bool.
    Actions arrive as torch tensors (or numpy arrays): int64 ``(num_envs,)`` for ``Discrete``, float32
    ``(num_envs, *shape)`` for ``Box``; they are checked for shape (and range, for ``Discrete``) and
    handed to EnvPool in its own dtype. EnvPool's own info keys (``elapsed_step``, Atari's ``lives``,
    ...) are passed through as numpy arrays that describe the step's transition, before any reset.

    Atari: episodic life and reward clipping are on unless passed (:data:`ATARI_DEFAULTS`), and
    ``info["episode_return"]`` / ``["episode_length"]`` are the game's unclipped score and its length in
    steps, valid where ``info["_episode_return"]`` (the game ended), not at every life lost.

    Autoreset: same-step, as the contract requires (see the module docstring for how EnvPool's
    next-step autoreset is converted). EnvPool derives ``terminated = done & ~truncated``, so a step
    that reaches the time limit is reported as truncated only, even if it also reached a terminal state.

    Seeding: EnvPool fixes its random streams when the pool is built (sub-env ``i`` draws from seed
    ``seed + i``). ``reset(seed=s)`` therefore builds a new pool seeded with ``s`` (unless the current
    pool was built with ``s`` and has not been reset or stepped yet), so that ``reset(seed=s)`` followed
    by the same actions gives the same trajectories. ``reset()`` without a seed resets every sub-env of
    the current pool, continuing its random streams. Seeds must fit in a 32-bit signed integer.

    Checkpointing: EnvPool's simulator state cannot be saved, so :meth:`state_dict` holds only the
    episode statistics; a resumed run starts the envs from a fresh reset.
    """

    def __init__(
        self, env_id: str, num_envs: int = 1, device: str | torch.device = "cpu", **kwargs: Any
    ) -> None:
        self.env_id = env_id
        envpool = import_optional(
            "envpool",
            EnvError,
            f"EnvPoolVecEnv({env_id!r}): the package 'envpool' is not installed, so EnvPool's C++ "
            "environments ('envpool:<id>' ids) are unavailable. Install it with "
            "`pip install 'phalanx[envpool]'`, or use the Gymnasium id without the 'envpool:' prefix.",
            packages=("envpool",),
        )
        if not isinstance(env_id, str) or env_id not in envpool.list_all_envs():
            raise self._unknown_id(envpool)
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise EnvError(
                f"EnvPoolVecEnv({env_id!r}): num_envs must be an integer >= 1, got {num_envs!r}. Pass the "
                "number of sub-envs, e.g. num_envs=16."
            )
        for key, reason in _RESERVED.items():
            if key in kwargs:
                raise EnvError(
                    f"EnvPoolVecEnv({env_id!r}): the keyword argument {key}={kwargs[key]!r} is set by the "
                    f"adapter and cannot be passed ({reason}). Remove it."
                )
        batch_size = kwargs.get("batch_size", 0)
        if batch_size not in (0, num_envs):
            raise EnvError(
                f"EnvPoolVecEnv({env_id!r}): batch_size={batch_size!r} asks for EnvPool's asynchronous mode "
                f"(a step returns batch_size of the num_envs={num_envs} sub-envs), but the VecEnv "
                "contract returns every sub-env at every step. Remove batch_size (or set it to num_envs)."
            )
        if "seed" in kwargs:
            self._check_seed(kwargs["seed"], "seed")
        self._envpool = envpool
        self._make_kwargs = {key: value for key, value in kwargs.items() if key != "seed"}
        self.atari = set(ATARI_DEFAULTS) <= set(envpool.make_spec(env_id).config._fields)
        """An Atari task: game statistics from EnvPool's info (unclipped score, game over)."""
        self.episodic_life = False
        """Atari: ``terminated`` at every life lost, the game going on (the adapter's, not EnvPool's)."""
        if self.atari:
            settings = {**ATARI_DEFAULTS, **self._make_kwargs}
            self.episodic_life = bool(settings.pop("episodic_life"))
            self._make_kwargs = {**settings, "episodic_life": False}
        self.pool = self._make_pool(int(num_envs), kwargs.get("seed"))
        self._seed = int(self.pool.config["seed"])
        self._fresh = True  # built with self._seed and neither reset nor stepped since
        self._needs_reset = True

        raw_obs_space, raw_act_space = self.pool.observation_space, self.pool.action_space
        try:
            single_obs = self._convert_space(raw_obs_space, "observation")
            single_act = self._convert_space(raw_act_space, "action")
        except EnvError:
            self.pool.close()
            raise
        super().__init__(int(num_envs), single_obs, single_act, device)
        self._obs_is_discrete = isinstance(raw_obs_space, gym.spaces.Discrete)
        self._obs_start = int(raw_obs_space.start) if self._obs_is_discrete else 0
        self._obs_dtype = torch.uint8 if single_obs.dtype == np.uint8 else torch.float32
        self._obs_is_wrapped = not self._obs_is_discrete and raw_obs_space.dtype in (np.float32, np.uint8)
        self._discrete_act = isinstance(raw_act_space, gym.spaces.Discrete)
        self._action_shape = (self.num_envs,) if self._discrete_act else (self.num_envs, *raw_act_space.shape)
        self._action_dtype = np.dtype(self.pool.spec.action_array_spec["action"].dtype)
        self._on_cpu = self.device.type == "cpu"
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device)
        """Of the episodes, or for Atari of the games (unclipped score until game over)."""

    # -- construction helpers ----------------------------------------------------------------------
    def _unknown_id(self, envpool: ModuleType) -> EnvError:
        known = list(envpool.list_all_envs())
        by_lower = {name.lower(): name for name in known}
        query = str(self.env_id).lower()
        close = [by_lower[name] for name in difflib.get_close_matches(query, list(by_lower), n=5, cutoff=0.6)]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return EnvError(
            f"Unknown EnvPool environment id {self.env_id!r} (make_env id 'envpool:{self.env_id}'): EnvPool "
            f"{envpool.__version__} has no such environment among its {len(known)} ids.{hint} "
            "`python -c 'import envpool; print(envpool.list_all_envs())'` lists them; note that ids are "
            "case-sensitive and carry a version suffix such as '-v5'."
        )

    def _check_seed(self, seed: Any, where: str) -> int:
        low, high = _SEED_RANGE
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not low <= seed <= high:
            raise EnvError(
                f"EnvPoolVecEnv({self.env_id!r}): {where}={seed!r} is not a valid EnvPool seed, expected an "
                f"integer in [{low}, {high}] (EnvPool stores seeds as 32-bit signed integers). Pass a "
                "smaller integer seed."
            )
        return int(seed)

    def _make_pool(self, num_envs: int, seed: int | None) -> Any:
        """A synchronous pool; ``seed=None`` leaves EnvPool's default seed."""
        kwargs = dict(self._make_kwargs) if seed is None else {**self._make_kwargs, "seed": seed}
        try:
            pool = self._envpool.make(self.env_id, env_type="gymnasium", num_envs=num_envs, **kwargs)
        except TypeError as error:
            try:
                fields = self._envpool.make_spec(self.env_id).config._fields
                accepted = ", ".join(name for name in fields if name not in _RESERVED)
            except Exception:  # noqa: BLE001 - only for the message
                accepted = "see envpool.make_spec(env_id).config"
            raise EnvError(
                f"EnvPoolVecEnv({self.env_id!r}): envpool.make rejected the keyword arguments "
                f"{sorted(self._make_kwargs)} ({error}). It accepts: {accepted}. Pass only those."
            ) from None
        except (AssertionError, ValueError, RuntimeError) as error:
            raise EnvError(
                f"EnvPoolVecEnv({self.env_id!r}): envpool.make(num_envs={num_envs}, {kwargs}) failed: "
                f"{type(error).__name__}: {error}. Check the keyword arguments against "
                f"envpool.make_spec({self.env_id!r}).config."
            ) from None
        # EnvPool builds its spaces (cached on the pool) from float64 bounds into float32 Boxes, and Gymnasium
        # warns about the cast at the first reset; build them now, quietly: the warning is not the user's.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
            pool.observation_space, pool.action_space  # noqa: B018 - builds the cached spaces
        return pool

    def _convert_space(self, space: gym.Space, role: str) -> gym.Space:
        return supported_tensor_space(
            space,
            role,
            f"EnvPool environment {self.env_id!r}",
            "Use another task, or the Gymnasium version of this one through a factory that flattens the "
            "space (gymnasium.wrappers.FlattenObservation) and GymnasiumVecEnv.",
        )

    # -- conversions -------------------------------------------------------------------------------
    def _obs_tensor(self, obs: np.ndarray) -> Tensor:
        """EnvPool hands out a fresh array per batch, so a float32 or uint8 batch on CPU is wrapped, not
        copied."""
        if self._obs_is_discrete:
            index = torch.from_numpy(np.asarray(obs, dtype=np.int64) - self._obs_start)
            assert self.single_observation_space.shape is not None, "a one-hot Box of the Discrete one"
            return torch.nn.functional.one_hot(index, self.single_observation_space.shape[0]).to(
                self.device, torch.float32
            )
        if self._obs_is_wrapped and self._on_cpu:
            return torch.from_numpy(obs)
        return torch.from_numpy(obs).to(self.device, self._obs_dtype)

    def _actions_numpy(self, actions: Any) -> np.ndarray:
        if isinstance(actions, torch.Tensor):
            actions = actions.detach().cpu().numpy()
        actions = np.asarray(actions, dtype=self._action_dtype)
        if actions.shape != self._action_shape:
            raise EnvError(
                f"EnvPoolVecEnv({self.env_id!r}).step: actions have shape {actions.shape}, expected "
                f"{self._action_shape} (num_envs={self.num_envs}, action space {self.single_action_space}). "
                "Pass one action per sub-env."
            )
        if self._discrete_act:
            assert isinstance(self.single_action_space, gym.spaces.Discrete)
            low, count = int(self.single_action_space.start), int(self.single_action_space.n)
            if actions.min() < low or actions.max() >= low + count:
                index = int(np.flatnonzero((actions < low) | (actions >= low + count))[0])
                raise EnvError(
                    f"EnvPoolVecEnv({self.env_id!r}).step: action {int(actions[index])} of sub-env {index} "
                    f"is outside the action space {self.single_action_space}, expected an integer in "
                    f"[{low}, {low + count - 1}]. Sample actions from env.single_action_space or clamp them."
                )
        return actions

    def _not_ready(self) -> EnvError:
        if self.closed:
            return EnvError(
                f"EnvPoolVecEnv({self.env_id!r}).step: the env is closed. Create a new one with "
                f"make_env('envpool:{self.env_id}', ...)."
            )
        return EnvError(
            f"EnvPoolVecEnv({self.env_id!r}).step: called before reset(). Call env.reset(seed=...) first "
            "(EnvPool would otherwise start episodes without reporting their first observation)."
        )

    # -- the contract ------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        """Reset every sub-env; ``seed`` rebuilds the pool with that seed (see the class docstring)."""
        if self.closed:
            raise EnvError(
                f"EnvPoolVecEnv({self.env_id!r}).reset: the env is closed. Create a new one with "
                f"make_env('envpool:{self.env_id}', ...)."
            )
        if options:
            raise EnvError(
                f"EnvPoolVecEnv({self.env_id!r}).reset: options={options!r} are not supported, expected None "
                "(reset always resets every sub-env; ended sub-envs are reset inside step)."
            )
        if seed is not None:
            seed = self._check_seed(seed, "reset(seed)")
            if not (self._fresh and seed == self._seed):
                self.pool.close()
                self.pool = self._make_pool(self.num_envs, seed)
                self._seed = seed
        obs, info = self.pool.reset()
        self._fresh = False
        self._needs_reset = False
        self.episode_statistics.reset()
        if self.episodic_life:
            self._lives = np.array(info["lives"])
        return self._obs_tensor(obs), dict(info)

    def step(self, actions: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if self._needs_reset:
            raise self._not_ready()
        raw_obs, raw_reward, raw_terminated, raw_truncated, raw_info = self.pool.step(
            self._actions_numpy(actions)
        )
        ended = raw_terminated | raw_truncated  # numpy (num_envs,) bool: the sub-envs to reset
        next_obs = self._obs_tensor(raw_obs)  # the true next observation of every row
        if self.episodic_life:  # a life lost ends the learner's episode; the game goes on
            lives = np.array(raw_info["lives"])
            raw_terminated = raw_terminated | ((0 < lives) & (lives < self._lives))
            self._lives = lives
        if ended.any():
            # EnvPool would reset these rows on the next step (ignoring their actions); reset them now.
            reset_obs, reset_info = self.pool.reset(np.flatnonzero(ended).astype(np.int32))
            obs = next_obs.clone()
            rows = torch.from_numpy(reset_info["env_id"].astype(np.int64)).to(self.device)
            obs[rows] = self._obs_tensor(reset_obs)
            final_obs = next_obs
            if self.episodic_life:
                self._lives[reset_info["env_id"]] = reset_info["lives"]
        else:
            obs, final_obs = next_obs, next_obs.clone()
        reward = torch.from_numpy(raw_reward).to(self.device, torch.float32)
        terminated = torch.from_numpy(raw_terminated).to(self.device)
        truncated = torch.from_numpy(raw_truncated).to(self.device)
        if self.atari:  # the game's score and length, reported when the game is over
            game_over = torch.from_numpy(ended).to(self.device)
            done = terminated | truncated
            score = torch.from_numpy(raw_info["reward"]).to(self.device, torch.float32)
            episode_return, episode_length = self.episode_statistics.step(score, game_over)
            statistics = step_info(final_obs, done, episode_return, episode_length, game_over)
        else:
            done = torch.from_numpy(ended).to(self.device)
            episode_return, episode_length = self.episode_statistics.step(reward, done)
            statistics = step_info(final_obs, done, episode_return, episode_length)
        return obs, reward, terminated, truncated, {**raw_info, **statistics}

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.pool.close()
            self.closed = True
            self._needs_reset = True

    def __repr__(self) -> str:
        return f"EnvPoolVecEnv({self.env_id!r}, num_envs={self.num_envs}, device={self.device})"
