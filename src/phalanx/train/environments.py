"""The envs a run trains and evaluates on, and the checkpoint form of their spaces.

:func:`build_env` wraps what ``phalanx.envs.make_env`` gives in what every algorithm expects (a NaN
guard, actions in [-1, 1], optional normalisation); :func:`space_spec` stores the spaces in a checkpoint
so that a deployed agent is rebuilt without the env.
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.algos.recurrent import actor
from phalanx.config import TrainConfig
from phalanx.envs.core import ConcatVecEnv, VecEnv
from phalanx.envs.registry import make_env, registered_factories
from phalanx.envs.workers import ProcessVecEnv
from phalanx.envs.wrappers import (
    OBS_CLIP,
    OBS_EPSILON,
    MemberNormalizeObservation,
    NanGuard,
    NormalizeObservation,
    RescaleAction,
    RunningMeanStd,
    ScaleReward,
    find_wrapper,
)
from phalanx.errors import ConfigError

EVAL_SEED_OFFSET = 1_000_003
"""A run seeded ``s`` evaluates on envs seeded ``s + EVAL_SEED_OFFSET`` (apart from its training envs)."""


# -- environments -------------------------------------------------------------------------------
def build_env(
    config: TrainConfig,
    num_envs: int,
    training: bool,
    obs_statistics: Any | None = None,
    blocks: int = 1,
) -> VecEnv:
    """The env the algorithm sees: NaN guard (training only), actions in [-1, 1], optional normalisation.

    ``blocks`` > 1 (evaluation): the rows form that many equal blocks, each normalised with statistics of
    its own (:class:`MemberNormalizeObservation`), for as many agents evaluated side by side.

    Training envs of Gymnasium ids step in ``config.num_workers`` processes, and with ``config.overlap``
    as two halves (a :class:`ConcatVecEnv` of two wrapped halves that share their statistics) for the
    worker's double buffering. Evaluation envs step in this process (a few episodes with frozen
    weights, where idle worker processes would only take memory).
    """
    env: VecEnv = make_env(
        config.env,
        num_envs=num_envs,
        device=config.device,
        num_workers=config.num_workers if training else 0,
        worker_options={"max_restarts": config.worker_restarts, "step_timeout": config.worker_timeout},
    )
    if not (training and config.overlap):
        return wrap_env(env, config, training, obs_statistics, None, blocks)
    if not isinstance(env, ProcessVecEnv):
        env.close()
        raise ConfigError(
            f"overlap=True steps half of the sub-envs in worker processes while the policy computes, "
            f"but {config.env!r} is {type(env).__name__}, not a Gymnasium env in worker processes. Use a "
            "Gymnasium id with --num-workers (e.g. 'gym:CartPole-v1'), or drop --overlap (batched envs "
            "step all sub-envs at once already)."
        )
    halves = env.split()
    first = wrap_env(halves[0], config, training, obs_statistics, None)
    normalizer, scaler = find_wrapper(first, NormalizeObservation), find_wrapper(first, ScaleReward)
    second = wrap_env(
        halves[1],
        config,
        training,
        normalizer.statistics if normalizer is not None else None,
        scaler.statistics if scaler is not None else None,
    )
    return ConcatVecEnv([first, second])


def wrap_env(
    env: VecEnv,
    config: TrainConfig,
    training: bool,
    obs_statistics: Any | None,
    reward_statistics: Any | None,
    blocks: int = 1,
) -> VecEnv:
    if training:  # evaluation runs the same env with frozen weights: no need to pay the check per step
        env = NanGuard(env)
    if isinstance(env.single_action_space, gym.spaces.Box):
        env = RescaleAction(env)
    if config.normalize_obs and blocks > 1:
        env = MemberNormalizeObservation(env, blocks, statistics=obs_statistics, update=training)
    elif config.normalize_obs:
        env = NormalizeObservation(env, statistics=obs_statistics, update=training)
    if config.normalize_reward and training:
        env = ScaleReward(env, gamma=config.hyperparameters.gamma, statistics=reward_statistics)
    return env


def space_spec(observation_space: gym.Space, action_space: gym.Space) -> dict[str, Any]:
    """The spaces as tensors and primitives, so that a checkpoint can rebuild the agent without the env."""
    spec: dict[str, Any] = {
        "observation_shape": list(observation_space.shape),
        "observation_low": torch.as_tensor(observation_space.low),
        "observation_high": torch.as_tensor(observation_space.high),
    }
    if isinstance(action_space, gym.spaces.Discrete):
        spec["action"] = {"type": "discrete", "n": int(action_space.n)}
    else:
        spec["action"] = {
            "type": "box",
            "low": torch.as_tensor(action_space.low),
            "high": torch.as_tensor(action_space.high),
        }
    return spec


def spaces_from_spec(spec: dict[str, Any]) -> tuple[gym.Space, gym.Space]:
    observation_space = gym.spaces.Box(
        spec["observation_low"].numpy(), spec["observation_high"].numpy(), dtype="float32"
    )
    action = spec["action"]
    if action["type"] == "discrete":
        return observation_space, gym.spaces.Discrete(action["n"])
    return observation_space, gym.spaces.Box(action["low"].numpy(), action["high"].numpy(), dtype="float32")


def picklable_factory(env_id: str, why: str, instead: str) -> dict[str, Any]:
    """``{env_id: factory}`` if ``env_id`` was added with register_env, checked to reach new processes
    (``why`` they are started and what to do ``instead`` go into the error)."""
    factory = registered_factories().get(env_id)
    if factory is None:
        return {}
    try:
        pickle.dumps(factory)
    except Exception as error:
        raise ConfigError(
            f"{why}, and each must build {env_id!r} with its factory {factory!r}, which cannot be sent to "
            f"another process ({type(error).__name__}: {error}). Define the factory at the top level of an "
            f"importable module (not in __main__, a notebook or a function), or {instead}."
        ) from error
    return {env_id: factory}


def to_device(state: Any, device: torch.device, copy: bool = False) -> Any:
    """A checkpoint's tensors moved to ``device`` (nested dicts and lists); ``copy``: always copied."""
    if isinstance(state, torch.Tensor):
        return state.to(device, copy=copy)
    if isinstance(state, dict):
        return {key: to_device(value, device, copy) for key, value in state.items()}
    if isinstance(state, list):
        return [to_device(value, device, copy) for value in state]
    return state


class EnvSpacePolicy:
    """An algorithm's actions for raw observations of its env, as a deployed agent and a video take them:
    the observations normalised with ``obs_statistics`` (frozen, clipped as in training), the algorithm
    acting (in [-1, 1] for a Box), the actions rescaled to ``action_space``'s bounds.

    :meth:`act` acts on a stream of steps through the algorithm's :func:`~phalanx.algos.recurrent.actor`:
    a recurrent policy carries its memory from one call to the next (call :meth:`episodes_ended` after
    each step, or :meth:`reset` for a new stream); :meth:`act_with_memory` is the same with the memory
    passed in and out."""

    def __init__(
        self, algorithm: Any, obs_statistics: RunningMeanStd | None, action_space: gym.Space
    ) -> None:
        self.algorithm = algorithm
        self.actor = actor(algorithm)
        self.obs_statistics = obs_statistics
        self.device = algorithm.device
        self.bounds = None
        if isinstance(action_space, gym.spaces.Box):
            self.bounds = tuple(
                torch.as_tensor(bound, dtype=torch.float32, device=self.device)
                for bound in (action_space.low, action_space.high)
            )

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Raw observations as the algorithm saw them in training."""
        if self.obs_statistics is not None:
            obs = self.obs_statistics.normalize(obs, OBS_EPSILON).clamp(-OBS_CLIP, OBS_CLIP)
        return obs

    def rescale(self, actions: torch.Tensor) -> torch.Tensor:
        """The algorithm's actions in the env's action space."""
        if self.bounds is not None:
            low, high = self.bounds
            actions = low + (actions.clamp(-1.0, 1.0) + 1.0) * 0.5 * (high - low)
        return actions

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Actions for a batch of raw observations ``(B, *observation_shape)`` on the algorithm's device."""
        return self.rescale(self.actor.act(self.normalize(obs), deterministic=deterministic))

    @torch.no_grad()
    def act_with_memory(
        self,
        obs: torch.Tensor,
        memory: torch.Tensor,
        episode_starts: torch.Tensor | None = None,
        deterministic: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A recurrent policy's ``(actions, memory after the step)`` for raw observations ``(B, ...)``, the
        memory before the step ``(B, M, H)`` and the rows that start an episode ``(B,)`` (None: none)."""
        actions, memory = self.algorithm.act_with_memory(
            self.normalize(obs), memory, episode_starts, deterministic
        )
        return self.rescale(actions), memory

    def episodes_ended(self, dones: torch.Tensor) -> None:
        """The episodes of the rows where ``dones`` is true ended (a recurrent policy forgets them)."""
        self.actor.episodes_ended(dones)

    def reset(self) -> None:
        """Start a new stream of episodes."""
        self.actor.reset()

    def __call__(self, obs: Any) -> np.ndarray:
        """The deterministic action for one observation of a Gymnasium env (numpy in, numpy out), the
        steps of one episode in order (a recurrent policy remembers the earlier ones)."""
        obs_tensor = torch.as_tensor(np.asarray(obs), dtype=torch.float32, device=self.device)
        return self.act(obs_tensor.unsqueeze(0))[0].cpu().numpy()
