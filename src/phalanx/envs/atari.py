"""Atari 2600 games through Gymnasium and ale-py, the standard preprocessing: ``make_env("ALE/Pong-v5")``.

:func:`make_atari_env` builds ``num_envs`` copies of an ``ALE/<Game>-v5`` id, stepped in ``num_workers``
processes (:class:`~phalanx.envs.workers.ProcessVecEnv`; in this process with ``num_workers=0``), each
preprocessed as DQN's Nature paper and the references after it (Stable-Baselines3's AtariWrapper,
CleanRL's ``ppo_atari.py``) do:

- no-op reset: a random number (1 to 30) of no-op actions after every reset;
- frame skip 4, the observation the max over the last two frames (flicker);
- 84x84 grey frames (uint8);
- episodic life (:class:`EpisodicLife`): ``terminated`` when a life is lost, but the game goes on and
  is reset only when it is over;
- fire reset (:class:`FireReset`): games that wait for FIRE get it after every reset;
- rewards clipped to their sign (-1, 0, 1);
- the last 4 frames stacked on the device (:class:`~phalanx.envs.wrappers.FrameStack`): observations
  are uint8 ``(4, 84, 84)`` tensors.

The first four are Gymnasium's ``AtariPreprocessing`` (the v5 id is made with ``frameskip=1`` so that
the wrapper skips and max-pools). The v5 ids keep ALE's sticky actions (``repeat_action_probability=0.25``,
the setting of Machado et al. 2018 that the v5 ids default to; pass 0.0 for the deterministic
emulator of the Nature paper and of CleanRL's ``NoFrameskip-v4`` runs).

The learner sees the clipped rewards and a ``terminated`` at every life lost; the episode statistics
(``info["episode_return"]``, ``info["episode_length"]``, the logged and evaluated returns) are the
game's: the unclipped score over all lives and the game's length in steps of the VecEnv, reported
when the game is over (or truncated at ALE's 108,000 frames) with ``info["_episode_return"]``. The
score comes from Gymnasium's ``RecordEpisodeStatistics`` placed below episodic life and reward
clipping, as CleanRL and the RL Zoo place their monitors (its length also counts the steps that the
reset after a lost life takes inside the sub-env, no-op and FIRE, which the VecEnv's does not).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.core import VecEnv
from phalanx.envs.gymnasium import GymnasiumVecEnv
from phalanx.envs.observation_wrappers import FrameStack
from phalanx.envs.processes import ProcessVecEnv
from phalanx.errors import EnvError, import_optional

__all__ = [
    "AtariGame",
    "EpisodicLife",
    "FireReset",
    "atari_game_ids",
    "is_atari_id",
    "make_atari_env",
    "video_env",
]

NAMESPACE = "ALE/"
MISSING = (
    "the Atari games need ale-py (the Arcade Learning Environment, ROMs included), which is not "
    "installed. Install it with `pip install 'phalanx[atari]'`."
)


def is_atari_id(env_id: str) -> bool:
    """Whether ``env_id`` names an Atari game of ale-py's Gymnasium ids (``ALE/<Game>-v5``)."""
    return isinstance(env_id, str) and env_id.startswith(NAMESPACE)


def _ale_py(env_id: str) -> Any:
    """ale-py, its Gymnasium ids registered; an EnvError naming the extra if it is missing."""
    ale_py = import_optional("ale_py", EnvError, f"make_env({env_id!r}): {MISSING}", packages=("ale_py",))
    import_optional(  # Gymnasium's AtariPreprocessing resizes with OpenCV
        "cv2",
        EnvError,
        f"make_env({env_id!r}): the Atari preprocessing needs OpenCV (the package 'opencv-python-headless'), "
        "which is not installed. Install it with `pip install 'phalanx[atari]'`.",
        packages=("cv2",),
    )
    # ALE's logs from Warning up: its version banner (info) would print once in every worker process
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)
    gym.register_envs(ale_py)
    return ale_py


def atari_game_ids() -> list[str] | None:
    """The ``ALE/<Game>-v5`` ids (one per game), or None if ale-py is not installed."""
    try:
        _ale_py("ALE/")
    except EnvError:
        return None
    return sorted(env_id for env_id in gym.envs.registry if is_atari_id(env_id) and env_id.endswith("-v5"))


class EpisodicLife(gym.Wrapper):
    """``terminated`` when a life is lost, reset only when the game is over (Stable-Baselines3's
    EpisodicLifeEnv): after a lost life, ``reset()`` continues the game with one no-op step.

    A reset that does not follow a lost life (the game over, or a reset asked for, with a seed or not)
    resets the game.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.lost_life = False
        """The last step ended the episode at a lost life, the game not over: reset continues it."""

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = _game(self.env).ale.lives()
        self.lost_life = not (terminated or truncated) and 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated or self.lost_life, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.lost_life:
            self.lost_life = False
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game
                obs, info = self.env.reset(**kwargs)
        else:
            obs, info = self.env.reset(**kwargs)
        self.lives = _game(self.env).ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """FIRE, then action 2, after every reset, for games that wait for FIRE to start (Breakout):
    Stable-Baselines3's FireResetEnv."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def _sign(reward: SupportsFloat) -> float:
    return float(np.sign(float(reward)))


def _game(env: gym.Env) -> Any:
    """The ale_py game under ``env``'s wrappers (Any: ale_py is an optional package)."""
    return env.unwrapped


@dataclass(frozen=True, repr=False)
class AtariGame:
    """The factory of one preprocessed Atari env (called in every worker process): ``AtariGame(id)()``
    is the Gymnasium env, with the preprocessing of the module docstring up to (not including) frame
    stacking, which :func:`make_atari_env` does on the device."""

    env_id: str
    noop_max: int = 30
    frame_skip: int = 4
    screen_size: int = 84
    episodic_life: bool = True
    clip_reward: bool = True
    repeat_action_probability: float = 0.25
    full_action_space: bool = False

    def __repr__(self) -> str:  # how the adapters name the env in messages
        return f"{self.env_id} (preprocessed)"

    def __call__(self, render_mode: str | None = None) -> gym.Env:
        _ale_py(self.env_id)
        env = gym.make(
            self.env_id,
            frameskip=1,
            repeat_action_probability=self.repeat_action_probability,
            full_action_space=self.full_action_space,
            render_mode=render_mode,
        )
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=self.noop_max, frame_skip=self.frame_skip, screen_size=self.screen_size
        )
        env = gym.wrappers.RecordEpisodeStatistics(env)  # the game: unclipped, over all lives
        if self.episodic_life:
            env = EpisodicLife(env)
        meanings = _game(env).get_action_meanings()
        if len(meanings) >= 3 and meanings[1] == "FIRE":
            env = FireReset(env)
        if self.clip_reward:
            env = gym.wrappers.TransformReward(env, _sign)
        return env


def make_atari_env(
    env_id: str,
    num_envs: int = 1,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
    worker_options: dict[str, Any] | None = None,
    frame_stack: int = 4,
    render_mode: str | None = None,
    **settings: Any,
) -> VecEnv:
    """``num_envs`` preprocessed copies of the Atari game ``env_id`` (``"ALE/Pong-v5"``), frames stacked.

    Args:
        env_id: an ``ALE/<Game>-v5`` id (``phalanx envs`` lists them).
        num_envs: sub-envs.
        device: where the observation tensors (uint8 ``(frame_stack, 84, 84)``) live.
        num_workers: processes that step the sub-envs (a multiple of it is ``num_envs``); 0 steps them
            in this process.
        worker_options: :class:`~phalanx.envs.workers.ProcessVecEnv` options (``max_restarts``, ...).
        frame_stack: frames per observation (1: none).
        render_mode: ``"rgb_array"`` renders the game's full-colour frames (videos).
        **settings: the preprocessing's fields of :class:`AtariGame` (``noop_max``, ``frame_skip``,
            ``screen_size``, ``episodic_life``, ``clip_reward``, ``repeat_action_probability``,
            ``full_action_space``).
    """
    _ale_py(env_id)
    if env_id not in gym.envs.registry:
        known = atari_game_ids() or []
        close = difflib.get_close_matches(env_id, known, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise EnvError(
            f"Unknown Atari id {env_id!r}: ale-py has no such game.{hint} `phalanx envs` lists the "
            f"{len(known)} games (ALE/<Game>-v5)."
        )
    fields = AtariGame.__dataclass_fields__
    unknown = sorted(set(settings) - (set(fields) - {"env_id"}))
    if unknown:
        raise EnvError(
            f"make_env({env_id!r}): unknown Atari settings {unknown}; accepted: "
            f"{', '.join(name for name in fields if name != 'env_id')}, frame_stack, render_mode."
        )
    game = AtariGame(env_id, **settings)
    if num_workers:
        env: VecEnv = ProcessVecEnv(
            game,
            num_envs=num_envs,
            num_workers=num_workers,
            device=device,
            render_mode=render_mode,
            statistics_from_info=True,
            **(worker_options or {}),
        )
    else:
        env = GymnasiumVecEnv(
            game, num_envs=num_envs, device=device, render_mode=render_mode, statistics_from_info=True
        )
    return env if frame_stack == 1 else FrameStack(env, frame_stack)


ENVPOOL_PREFIX = "envpool:"


def video_env(env_id: str, frame_stack: int = 4) -> gym.Env | None:
    """The single Gymnasium env a video of a policy trained on ``env_id`` plays, or None where ``env_id``
    is no preprocessed Atari game: for ``ALE/<Game>-v5`` and EnvPool's ``envpool:<Game>-v5``, the game with
    the training's preprocessing, its observations the ``frame_stack`` stacked frames the policy reads
    (the first one repeated at a reset, as :class:`~phalanx.envs.wrappers.FrameStack` does), rendering
    the full-colour game; a whole game (no episodic life) with unclipped rewards. EnvPool's Atari games
    are played by ale-py's (the same ROM and the same preprocessing; EnvPool's default of no sticky
    actions kept)."""
    if is_atari_id(env_id):
        game = AtariGame(env_id, episodic_life=False, clip_reward=False)
    elif env_id.startswith(ENVPOOL_PREFIX) and f"{NAMESPACE}{env_id[len(ENVPOOL_PREFIX) :]}" in (
        atari_game_ids() or ()
    ):
        name = f"{NAMESPACE}{env_id[len(ENVPOOL_PREFIX) :]}"
        game = AtariGame(name, episodic_life=False, clip_reward=False, repeat_action_probability=0.0)
    else:
        return None
    env = game(render_mode="rgb_array")
    if frame_stack > 1:
        env = gym.wrappers.FrameStackObservation(env, frame_stack, padding_type="reset")
    return env
