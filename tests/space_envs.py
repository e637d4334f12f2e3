"""Small Gymnasium envs with image, Dict and MultiDiscrete spaces, importable by worker processes."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PixelEnv(gym.Env):
    """A dot moving on a uint8 ``(size, size)`` grey image (or ``(1, size, size)`` with ``channels``):
    action 0..3 moves it, the episode ends at the edge; the background is seeded noise, so that every
    pixel value differs between seeds and steps."""

    def __init__(self, size: int = 12, channels: bool = False) -> None:
        self.size = size
        shape = (1, size, size) if channels else (size, size)
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.position = np.zeros(2, dtype=np.int64)

    def _image(self) -> np.ndarray:
        image = self.np_random.integers(0, 200, (self.size, self.size), dtype=np.uint8)
        image[tuple(self.position)] = 255
        return image.reshape(self.observation_space.shape)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position = self.np_random.integers(2, self.size - 2, 2)
        return self._image(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        move = ((0, 1), (0, -1), (1, 0), (-1, 0))[int(action)]
        self.position = self.position + np.asarray(move)
        terminated = bool(np.any(self.position <= 0) or np.any(self.position >= self.size - 1))
        self.position = np.clip(self.position, 0, self.size - 1)
        return self._image(), float(self.position[0]), terminated, False, {}


class DictEnv(gym.Env):
    """Dict observations (keys given out of order) of a Box, a Discrete (start 1) and a MultiBinary part;
    episodes of 5 steps."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "velocity": gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float64),
                "mode": gym.spaces.Discrete(3, start=1),
                "flags": gym.spaces.MultiBinary(2),
            }
        )
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        return {
            "velocity": self.np_random.uniform(-1, 1, 2),
            "mode": int(self.np_random.integers(1, 4)),
            "flags": self.np_random.integers(0, 2, 2).astype(np.int8),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), float(action), False, self.t >= 5, {}


class MultiDiscreteEnv(gym.Env):
    """MultiDiscrete([3, 4], start=[1, -2]) actions; the observation is the last action received (as
    floats), checked to lie in the space."""

    def __init__(self) -> None:
        self.action_space = gym.spaces.MultiDiscrete([3, 4], start=[1, -2])
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action)
        if action.shape != (2,) or not self.action_space.contains(action.astype(np.int64)):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        return action.astype(np.float32), 0.0, False, False, {}


class ShiftedCartPole(gym.Env):
    """CartPole-v1 whose two actions are ``start`` and ``start + 1`` (``Discrete(2, start=start)``); an
    action outside that space raises, as a strict simulator would."""

    def __init__(self, start: int = 5) -> None:
        self.inner = gym.make("CartPole-v1", max_episode_steps=50)
        self.observation_space = self.inner.observation_space
        self.action_space = gym.spaces.Discrete(2, start=start)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return self.inner.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.action_space.contains(int(action)):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        return self.inner.step(int(action) - int(self.action_space.start))
