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
    ActionMap,
    MemberNormalizeObservation,
    MemberScaleReward,
    NanGuard,
    NormalizeObservation,
    RescaleAction,
    RunningMeanStd,
    ScaleReward,
    find_wrapper,
    needs_action_map,
)
from phalanx.errors import CheckpointError, ConfigError
from phalanx.nets import is_image_space
from phalanx.registry import get_algorithm
from phalanx.train.learner import rollout_settings

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


def nan_check_every(config: TrainConfig) -> int:
    """Env steps between the training NaN guard's reads of its record on an accelerator (each read is a
    host synchronisation; on a CPU every step is checked as it happens): once per rollout on-policy, at
    its last step, so a NaN is raised before the update learns from it; every step off-policy, where the
    next update may already sample the new transitions."""
    on_policy = bool(config.algo) and get_algorithm(config.algo).on_policy  # no algo: an env-only config
    return rollout_settings(config.hyperparameters).horizon if on_policy else 1


def wrap_env(
    env: VecEnv,
    config: TrainConfig,
    training: bool,
    obs_statistics: Any | None,
    reward_statistics: Any | None,
    blocks: int = 1,
    gamma: torch.Tensor | None = None,
) -> VecEnv:
    """The one wrapper chain of every training and evaluation env: NaN guard (training), actions in
    [-1, 1], then the normalisation the config asks for.

    ``blocks`` > 1: the rows form that many equal blocks, each normalised with statistics of its own.
    ``gamma``, a vectorized population's ``(P,)`` discounts: the rows are its ``blocks`` = P members', each
    with its own statistics (also where P = 1) and its rewards scaled with its own discount
    (:class:`~phalanx.envs.wrappers.MemberScaleReward`); the population refuses image observations itself
    (:func:`phalanx.population.member_env.check_batchable`).
    """
    population = gamma is not None
    if training:  # evaluation runs the same env with frozen weights: no need to pay the check per step
        env = NanGuard(env, check_every=nan_check_every(config))
    if needs_action_map(env.single_action_space):  # a Box, or integer actions that start away from 0
        env = RescaleAction(env)
    if config.normalize_obs and not population:
        check_normalizable(env.single_observation_space)
    if config.normalize_obs and (blocks > 1 or population):
        env = MemberNormalizeObservation(env, blocks, statistics=obs_statistics, update=training)
    elif config.normalize_obs:
        env = NormalizeObservation(env, statistics=obs_statistics, update=training)
    if config.normalize_reward and training and gamma is not None:  # a population
        env = MemberScaleReward(env, blocks, gamma)
    elif config.normalize_reward and training:
        env = ScaleReward(env, gamma=config.hyperparameters.gamma, statistics=reward_statistics)
    return env


def check_normalizable(space: gym.Space) -> None:
    """A ConfigError where ``normalize_obs`` cannot apply to observations of ``space``: images (and Dict
    spaces with image parts) are scaled by the network's encoder instead; other Dict spaces are refused."""
    parts = space.spaces.values() if isinstance(space, gym.spaces.Dict) else [space]
    if any(is_image_space(part) for part in parts):
        raise ConfigError(
            f"normalize_obs = True cannot apply to the image observations of {space}: images are scaled "
            "to [0, 1] inside the network's encoder (uint8 pixels / 255), and per-pixel running statistics "
            "would waste memory and add noise. Drop --normalize-obs (set normalize_obs: false)."
        )
    if isinstance(space, gym.spaces.Dict):
        raise ConfigError(
            f"normalize_obs = True is for Box observations, but the observation space is a Dict, {space}. "
            "Drop --normalize-obs, or normalise the vector parts in the env (e.g. with "
            "gymnasium.wrappers.NormalizeObservation on a Box part)."
        )


def space_spec(observation_space: gym.Space, action_space: gym.Space) -> dict[str, Any]:
    """The spaces as tensors and primitives (no pickled objects), so that a checkpoint can rebuild the
    agent without the env: ``{"observation": spec, "action": spec}``, each spec a dict with a ``type``
    (box, discrete, multi_discrete, multi_binary, dict) and the space's bounds, sizes and dtype; a Dict's
    ``spaces`` hold the spec of each part, by key."""
    return {"observation": _spec(observation_space), "action": _spec(action_space)}


def spaces_from_spec(spec: dict[str, Any]) -> tuple[gym.Space, gym.Space]:
    """The ``(observation_space, action_space)`` of :func:`space_spec`, or of the format before it (a
    float32 Box observation as ``observation_low`` / ``observation_high``)."""
    if "observation" in spec:
        observation_space = _space(spec["observation"])
    else:
        observation_space = gym.spaces.Box(
            spec["observation_low"].numpy(), spec["observation_high"].numpy(), dtype=np.float32
        )
    return observation_space, _space(spec["action"])


def _spec(space: gym.Space) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "box",
            "low": torch.as_tensor(space.low),
            "high": torch.as_tensor(space.high),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "multi_discrete",
            "nvec": torch.as_tensor(space.nvec),
            "start": torch.as_tensor(space.start),
        }
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "multi_binary", "n": [int(size) for size in np.atleast_1d(space.n)]}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "dict", "spaces": {key: _spec(part) for key, part in space.spaces.items()}}
    raise ConfigError(
        f"cannot store the space {space} in a checkpoint: phalanx stores Box, Discrete, MultiDiscrete, "
        "MultiBinary and Dict spaces of those."
    )


def _space(spec: dict[str, Any]) -> gym.Space:
    kind = spec["type"]
    if kind == "box":  # a checkpoint of before dtypes were stored: float32
        return gym.spaces.Box(spec["low"].numpy(), spec["high"].numpy(), dtype=spec.get("dtype", "float32"))
    if kind == "discrete":
        return gym.spaces.Discrete(spec["n"], start=spec.get("start", 0))
    if kind == "multi_discrete":
        return gym.spaces.MultiDiscrete(spec["nvec"].numpy(), start=spec["start"].numpy())
    if kind == "multi_binary":
        return gym.spaces.MultiBinary(spec["n"] if len(spec["n"]) > 1 else spec["n"][0])
    if kind == "dict":
        return gym.spaces.Dict({key: _space(part) for key, part in spec["spaces"].items()})
    raise CheckpointError(
        f"the checkpoint stores a space of type {kind!r}, which this phalanx version does not know; load it "
        "with the phalanx version that wrote it."
    )


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
    acting (in [-1, 1] for a Box, from 0 for integer actions), its actions mapped into ``action_space``
    (:class:`~phalanx.envs.wrappers.ActionMap`, as in training).

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
        self.action_map = ActionMap(action_space).to(self.device)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Raw observations as the algorithm saw them in training."""
        if self.obs_statistics is not None:
            obs = self.obs_statistics.normalize(obs, OBS_EPSILON).clamp(-OBS_CLIP, OBS_CLIP)
        return obs

    def rescale(self, actions: torch.Tensor) -> torch.Tensor:
        """The algorithm's actions in the env's action space."""
        return self.action_map(actions)

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
        steps of one episode in order (a recurrent policy remembers the earlier ones); uint8 images stay
        uint8 (the encoder scales them)."""
        array = np.asarray(obs)
        dtype = torch.uint8 if array.dtype == np.uint8 else torch.float32
        obs_tensor = torch.as_tensor(array, dtype=dtype, device=self.device)
        return self.act(obs_tensor.unsqueeze(0))[0].cpu().numpy()
