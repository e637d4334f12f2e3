"""Gymnasium envs that fail on purpose, for the ProcessVecEnv fault tests (imported by worker processes).

Each failure is armed by a flag file: the env fails while the file exists and removes it when it fails
(``once=True``), so a restarted worker runs cleanly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np


class FaultyEnv(gym.Env):
    """A 4-dim random-walk env whose ``step`` raises, kills its process, or hangs while ``flag`` exists.

    ``delay`` seconds of sleep in every step make a slow worker.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(
        self, flag: str = "", mode: str = "raise", once: bool = True, obs_dim: int = 4, delay: float = 0.0
    ) -> None:
        self.flag = Path(flag) if flag else None
        self.mode = mode
        self.once = once
        self.delay = delay
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.state = np.zeros(obs_dim, np.float32)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.state = self.np_random.normal(size=self.state.shape).astype(np.float32)
        self.t = 0
        return self.state.copy(), {}

    def _armed(self) -> bool:
        """Whether to fail now; with ``once``, exactly one sub-env in any process claims the flag."""
        if not self.once:
            return self.flag.exists()
        try:
            os.rename(self.flag, f"{self.flag}.claimed-{os.getpid()}")  # atomic: one winner
        except FileNotFoundError:
            return False
        return True

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self.flag is not None and self._armed():
            if self.mode == "raise":
                raise RuntimeError("injected fault")
            if self.mode == "exit":
                os._exit(3)
            if self.mode == "hang":
                time.sleep(3600)
        if self.delay:
            time.sleep(self.delay)
        self.t += 1
        self.state = self.state + (1.0 if action else -1.0) * 0.1
        return self.state.copy(), 1.0, False, self.t >= 20, {}


class OldApiEnv(gym.Env):
    """The old gym API: step returns 4 values."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        return np.zeros(2, np.float32), 0.0, False, {}


_calls = {"count": 0}


def different_spaces() -> gym.Env:
    """Each call in a process builds an env with one more observation dimension than the last."""
    _calls["count"] += 1
    return FaultyEnv(obs_dim=_calls["count"] + (os.getpid() % 7))


def failing_pendulum(
    num_envs: int, device: Any, mode: str = "raise", rank: int = 1, after: int = 20, **kwargs: Any
) -> Any:
    """phalanx's Pendulum whose ``step`` raises (or hangs) after ``after`` steps in learner ``rank`` of a
    data-parallel group; a factory for ``phalanx.envs.register_env`` (importable by spawned learners)."""
    import torch.distributed as dist

    from phalanx.envs import make_env
    from phalanx.envs.wrappers import VecEnvWrapper

    class FailingLearnerEnv(VecEnvWrapper):
        steps = 0

        def step(self, actions):
            self.steps += 1
            if dist.is_initialized() and dist.get_rank() == rank and self.steps > after:
                if mode == "hang":
                    time.sleep(3600)
                raise RuntimeError(f"injected fault in learner {rank}")
            return self.env.step(actions)

    return FailingLearnerEnv(make_env("Pendulum-v1", num_envs=num_envs, device=device, **kwargs))


def failing_in_evaluation(num_envs: int, device: Any, **kwargs: Any) -> Any:
    """phalanx's CartPole whose ``step`` raises in the 3-env evaluation env (3 = the tests' eval_episodes);
    a factory for ``phalanx.envs.register_env`` (importable by an evaluation process)."""
    from phalanx.envs import make_env
    from phalanx.envs.wrappers import VecEnvWrapper

    class FailingEvaluationEnv(VecEnvWrapper):
        def step(self, actions):
            if self.num_envs == 3:
                raise RuntimeError("injected fault in the evaluation env")
            return self.env.step(actions)

    return FailingEvaluationEnv(make_env("CartPole-v1", num_envs=num_envs, device=device, **kwargs))
