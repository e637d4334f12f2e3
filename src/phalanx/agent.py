"""Deployment: load a trained agent from a run directory and act, or evaluate it.

``load_agent(run_dir).act(obs)`` takes raw environment observations (numpy or torch, one or a batch)
and returns actions in the environment's own action space: observation normalisation and action
rescaling are applied exactly as during training, from the checkpoint alone (no env needed). Images of a
uint8 space stay uint8 (the network scales them); a Dict observation is a dict of parts (one, or a batch
of each part), flattened as ``gymnasium.spaces.flatten`` does, or already that flat vector. A recurrent
agent (``agent.recurrent``) acts with its memory passed in and out:
``actions, memory = agent.act(obs, memory=memory, episode_start=starts)`` (docs/recurrent.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx import registry
from phalanx.algos.recurrent import is_recurrent
from phalanx.config import TrainConfig
from phalanx.envs.wrappers import NormalizeObservation, RunningMeanStd, agent_action_space, find_wrapper
from phalanx.errors import CheckpointError
from phalanx.nets import observation_shape
from phalanx.optim import without_optimizers
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.environments import EVAL_SEED_OFFSET, EnvSpacePolicy, build_env, spaces_from_spec
from phalanx.train.evaluator import Evaluation, Evaluator
from phalanx.train.run_dir import read_run_config
from phalanx.train.videos import MAX_EPISODE_STEPS, GymnasiumEpisode


class Agent:
    """A trained policy with its observation normalisation and action rescaling."""

    def __init__(
        self, config: TrainConfig, state: dict[str, Any], device: str | torch.device = "cpu"
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.observation_space, self.action_space = spaces_from_spec(state["spaces"])
        self.observation_shape = observation_shape(self.observation_space)  # a Dict's: its flat vector
        uint8 = (
            isinstance(self.observation_space, gym.spaces.Box) and self.observation_space.dtype == np.uint8
        )
        self.observation_dtype = torch.uint8 if uint8 else torch.float32
        spaces = (self.observation_space, agent_action_space(self.action_space))
        self.algorithm = restore_algorithm(config, spaces, state, self.device)
        self.obs_statistics: RunningMeanStd | None = None
        if state.get("obs_statistics") is not None:  # the training env's normalisation, frozen
            self.obs_statistics = RunningMeanStd(self.observation_shape, self.device)
            self.obs_statistics.load_state_dict(state["obs_statistics"])
        self.policy = EnvSpacePolicy(self.algorithm, self.obs_statistics, self.action_space)
        self.steps = state["progress"]["steps"]
        self.state = state

    def evaluate(self, episodes: int = 10, seed: int | None = None) -> Evaluation:
        """``episodes`` deterministic episodes on the training env (``seed``: of the evaluation episodes)."""
        config = dataclasses.replace(self.config, device=str(self.device))
        env = build_env(config, episodes, training=False)
        if self.state.get("obs_statistics") is not None:
            normalizer = find_wrapper(env, NormalizeObservation)
            assert normalizer is not None, "build_env normalises observations where the run did"
            normalizer.statistics.load_state_dict(self.state["obs_statistics"])
        evaluator = Evaluator(env, seed=config.seed + EVAL_SEED_OFFSET if seed is None else seed)
        try:
            return evaluator.evaluate(self.algorithm)
        finally:
            env.close()

    def frames(self, max_steps: int = MAX_EPISODE_STEPS, seed: int | None = None) -> GymnasiumEpisode:
        """One deterministic episode drawn by Gymnasium's rgb_array rendering of the env (built-in envs
        share Gymnasium's ids and semantics), its frames drawn as they are iterated (``seed``: of the
        episode, by default the evaluations' own): ``with agent.frames() as episode: list(episode)``."""
        seed = self.config.seed + EVAL_SEED_OFFSET if seed is None else seed
        policy = EnvSpacePolicy(self.algorithm, self.obs_statistics, self.action_space)  # a fresh memory
        return GymnasiumEpisode(self.config.env, policy, seed, max_steps)

    @property
    def recurrent(self) -> bool:
        """Whether the agent acts with a memory (a recurrent policy): :meth:`act` takes and returns it."""
        return is_recurrent(self.algorithm)

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = True, memory: Any = None, episode_start: Any = None) -> Any:
        """Actions for raw observations; numpy in, numpy out; torch in, torch out; batch or single. A Dict
        space's observations: dicts (numpy out), or their flat vectors.

        A recurrent agent returns ``(actions, memory)``: pass ``memory`` back at the next step (None: a
        zero memory, every row starting an episode), ``(B, M, H)`` for a batch, ``(M, H)`` for a single
        observation; ``episode_start`` (bool, ``(B,)`` or a scalar) marks the rows whose observation is the
        first of a new episode, whose memory is zeroed before acting."""
        if isinstance(obs, Mapping):
            obs = flatten_dict_observation(self.observation_space, obs)
        is_numpy = not isinstance(obs, torch.Tensor)
        obs_tensor = self._tensor(obs, self.observation_dtype)
        single = obs_tensor.dim() == len(self.observation_shape)
        if single:
            obs_tensor = obs_tensor.unsqueeze(0)
        if tuple(obs_tensor.shape[1:]) != self.observation_shape:
            raise ValueError(
                f"Agent.act: observations have shape {tuple(obs_tensor.shape[1:])} per sub-env, expected "
                f"{self.observation_shape} (the training env {self.config.env!r}, observation space "
                f"{self.observation_space})."
            )
        if not self.recurrent:
            if memory is not None or episode_start is not None:
                raise ValueError(
                    f"Agent.act: memory / episode_start were given, but the agent of {self.config.env!r} "
                    f"({self.config.algo}) is feed-forward: it has no memory. Call act(obs)."
                )
            actions = self.policy.act(obs_tensor, deterministic)
            actions = actions[0] if single else actions
            return actions.cpu().numpy() if is_numpy else actions
        batch = obs_tensor.shape[0]
        memory_shape = (batch, *self.algorithm.memory_shape)
        if memory is None:
            memory_tensor = self.algorithm.initial_memory(batch)
        else:
            memory_tensor = self._tensor(memory, torch.float32)
            expected = memory_shape[1:] if single else memory_shape
            if tuple(memory_tensor.shape) != expected:
                raise ValueError(
                    f"Agent.act: memory has shape {tuple(memory_tensor.shape)}, expected {expected} (the "
                    "memory act returned at the previous step, or None at the first)."
                )
            memory_tensor = memory_tensor.reshape(memory_shape)
        starts = None
        if episode_start is not None:
            starts = self._tensor(episode_start, torch.bool).reshape(-1).expand(batch)
        actions, memory_tensor = self.policy.act_with_memory(obs_tensor, memory_tensor, starts, deterministic)
        if single:
            actions, memory_tensor = actions[0], memory_tensor[0]
        if is_numpy:
            return actions.cpu().numpy(), memory_tensor.cpu().numpy()
        return actions, memory_tensor

    def _tensor(self, value: Any, dtype: torch.dtype) -> torch.Tensor:
        """``value`` (numpy, torch or a Python value) as a tensor on the agent's device."""
        array = value if isinstance(value, torch.Tensor) else np.asarray(value)
        return torch.as_tensor(array, dtype=dtype, device=self.device)


def flatten_dict_observation(space: gym.Space, obs: Mapping[str, Any]) -> np.ndarray:
    """A Dict observation (one, or a batch of each part) as the float32 flat vector(s) the network reads:
    ``gymnasium.spaces.flatten`` (parts by sorted key, Discrete parts one-hot), ``(flatdim,)`` or
    ``(B, flatdim)``."""
    if not isinstance(space, gym.spaces.Dict):
        raise ValueError(f"Agent.act: a dict observation, but the observation space is {space}.")
    missing = sorted(set(space.spaces) - set(obs))
    if missing:
        raise ValueError(
            f"Agent.act: the dict observation has no part {', '.join(map(repr, missing))}; the observation "
            f"space is {space}."
        )
    parts = {key: np.asarray(obs[key]) for key in space.spaces}
    key, part = next(iter(space.spaces.items()))
    shape = () if isinstance(part, gym.spaces.Discrete) else part.shape
    assert shape is not None, f"the observation part {key!r} has a shape"
    if parts[key].ndim == len(shape):  # one observation
        return np.asarray(gym.spaces.flatten(space, parts), dtype=np.float32)
    rows = [{name: value[row] for name, value in parts.items()} for row in range(len(parts[key]))]
    return np.stack([np.asarray(gym.spaces.flatten(space, row)) for row in rows]).astype(np.float32)


def restore_algorithm(config: TrainConfig, spaces: tuple, state: dict[str, Any], device: torch.device) -> Any:
    """The run's algorithm, built for ``spaces`` on ``device``, with the checkpoint's weights: a policy
    that acts, without optimisers (their state in the checkpoint is left alone)."""
    with without_optimizers():
        algorithm = registry.algorithm_class(config.algo, config.hyperparameters)(
            config.hyperparameters, *spaces, device
        )
    algorithm.load_state_dict(state["algorithm"])
    return algorithm


def resolve_checkpoint(run_dir: Path, checkpoint: str) -> Path:
    """``checkpoint`` of ``run_dir``: "best", "latest", a name in its checkpoints/ (``step_20480``, as
    ``phalanx eval`` prints them), or a path; a CheckpointError that lists the checkpoints there."""
    manager = CheckpointManager(run_dir)
    if checkpoint in ("best", "latest"):
        path = manager.best() if checkpoint == "best" else manager.latest()
        if path is None and checkpoint == "best":
            path = manager.latest()
        if path is None:
            raise CheckpointError(
                f"run directory {str(run_dir)!r} has no checkpoint yet (checkpoints/ is empty or missing)."
            )
        return path
    for path in (Path(checkpoint), Path(run_dir) / "checkpoints" / checkpoint):
        if path.exists():
            return path
    names = [p.name for p in manager.step_directories()] + (["best"] if manager.best() else [])
    raise CheckpointError(
        f"checkpoint {checkpoint!r} is neither a path nor one of {str(run_dir)!r}'s checkpoints: "
        + (", ".join(names) if names else "it has none yet")
        + ". Pass best, latest, one of those names, or a checkpoint directory's path."
    )


def _load(run_dir: str | Path, checkpoint: str) -> tuple[TrainConfig, dict[str, Any]]:
    config = read_run_config(run_dir)
    return config, load_checkpoint(resolve_checkpoint(Path(run_dir), checkpoint))


def load_agent(run_dir: str | Path, checkpoint: str = "best", device: str | torch.device = "cpu") -> Any:
    """The agent of a run: ``checkpoint`` is "best" (default), "latest", or a checkpoint path.

    A single-agent run gives an :class:`Agent`; a multi-agent run the agent class its algorithm names
    (:class:`phalanx.marl.agent.MultiAgentAgent`), with the same ``act`` / ``evaluate`` / ``frames``."""
    return _agent(*_load(run_dir, checkpoint), device)


def _agent(config: TrainConfig, state: dict[str, Any], device: str | torch.device) -> Any:
    return registry.agent_class(config.algo)(config, state, device)


def evaluate(
    run_dir: str | Path,
    episodes: int = 10,
    checkpoint: str = "best",
    device: str | None = None,
    seed: int | None = None,
) -> Evaluation:
    """Run ``episodes`` deterministic episodes of a trained agent on its training environment."""
    config, state = _load(run_dir, checkpoint)
    return _agent(config, state, device if device is not None else config.device).evaluate(episodes, seed)
