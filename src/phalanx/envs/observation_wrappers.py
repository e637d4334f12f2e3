"""Wrappers that change what an observation holds, on the device.

- :class:`FrameStack`: the last k observations of every sub-env as one (Atari's 4 frames).
- :class:`MaskVelocity`: chosen entries of the observations zeroed (the velocities of CartPole and
  Pendulum: the built-in memory tasks ``CartPoleNoVel-v1``, ``PendulumNoVel-v1``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space

from phalanx.envs.core import Tensor, VecEnv
from phalanx.envs.wrapper_base import VecEnvWrapper
from phalanx.errors import ConfigError

__all__ = ["FrameStack", "MaskVelocity"]


class MaskVelocity(VecEnvWrapper):
    """Observations with the entries ``indices`` (of a 1-D Box observation) set to zero, in the
    observations of ``reset`` and ``step`` and in ``info["final_obs"]``; the space keeps its shape.

    With the velocities masked, an observation no longer tells the state: the agent must infer the
    velocities from the observations before it, which a feed-forward policy cannot and a recurrent one
    can (RL Zoo's ``CartPoleNoVel-v1``, the memory task of recurrent PPO). One batched multiply on the
    device per step.
    """

    def __init__(self, env: VecEnv, indices: tuple[int, ...]) -> None:
        super().__init__(env)
        space = env.single_observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(
                f"MaskVelocity: the observation space of {env.unwrapped!r} is {space}, expected a 1-D Box "
                "(a vector per sub-env) whose entries can be masked."
            )
        size = space.shape[0]
        if not indices or any(not 0 <= index < size for index in indices):
            raise ConfigError(
                f"MaskVelocity: indices {indices} must be non-empty and in [0, {size}), the entries of the "
                f"observations of {env.unwrapped!r} ({space})."
            )
        self.indices = tuple(indices)
        mask = torch.ones(size, dtype=torch.float32, device=self.device)
        mask[list(self.indices)] = 0.0
        self.mask = mask
        low, high = space.low.copy(), space.high.copy()
        low[list(self.indices)] = 0.0
        high[list(self.indices)] = 0.0
        self.single_observation_space = gym.spaces.Box(low, high, dtype=space.dtype)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return obs * self.mask, info

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        info = dict(info)
        if "final_obs" in info:
            info["final_obs"] = info["final_obs"] * self.mask
        return obs * self.mask, reward, terminated, truncated, info


class FrameStack(VecEnvWrapper):
    """The last ``num_frames`` observations of every sub-env as one observation, kept on the device.

    Where the frames are stacked: a 1-D or 2-D observation (a vector, a grey ``(H, W)`` image, Atari's
    84x84 frames) gains a leading axis, ``(num_frames, *shape)``; an image ``(C, H, W)`` or
    ``(H, W, C)`` is stacked along its channels (``(num_frames * C, H, W)``, or ``(H, W, num_frames *
    C)`` for channels last, as ``phalanx.nets.image_layout`` reads it), oldest frame first. The dtype
    stays (uint8 frames stay uint8). An episode's first stack repeats its first observation (Gymnasium's
    FrameStackObservation with ``padding_type="reset"``, EnvPool, and CleanRL's Atari stacks do the
    same). Same-step autoreset: ``info["final_obs"]`` is the stack ending with the finished episode's
    last observation, and the ended rows start their next stack from the reset observation. Every step
    builds new tensors, so returned observations are never modified later (a buffer may keep them).

    The stacks are tensor operations only, traceable with the wrapped step. :meth:`state_dict` holds them
    for an exact resume.
    """

    def __init__(self, env: VecEnv, num_frames: int = 4) -> None:
        super().__init__(env)
        if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
            raise ConfigError(f"FrameStack: num_frames must be an integer >= 1, got {num_frames!r}.")
        space = env.single_observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ConfigError(
                f"FrameStack: the observation space of {env.unwrapped!r} is {space}, expected a Box (vectors "
                "or images). Stack Dict observations part by part in a Gymnasium wrapper instead."
            )
        self.num_frames = num_frames
        shape = tuple(space.shape)
        if len(shape) == 3:  # an image: stack along the channels
            channels_last = shape[-1] <= 4 < shape[0]
            self.axis = 2 if channels_last else 0
            self.frame_shape: tuple[int, ...] = shape
        else:  # a new leading axis of size 1 per frame
            self.axis = 0
            self.frame_shape = (1, *shape)
        low = np.concatenate([space.low.reshape(self.frame_shape)] * num_frames, axis=self.axis)
        high = np.concatenate([space.high.reshape(self.frame_shape)] * num_frames, axis=self.axis)
        self.single_observation_space = gym.spaces.Box(low, high, dtype=space.dtype)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.width = self.frame_shape[self.axis]
        """The size of one frame along the stacking axis."""
        self.frames = torch.zeros(
            (self.num_envs, *self.single_observation_space.shape),
            dtype=_torch_dtype(space.dtype),
            device=self.device,
        )
        """The current stack of every sub-env, ``(num_envs, *single_observation_space.shape)``."""

    def _as_frames(self, obs: Tensor) -> Tensor:
        """A batch of observations as frames of the stack, ``(N, *frame_shape)``."""
        return obs.reshape(obs.shape[0], *self.frame_shape)

    def _first_stack(self, obs: Tensor) -> Tensor:
        """The stack of an episode's first observation: that observation, ``num_frames`` times (a
        broadcast view where the frames have their own axis)."""
        frames = self._as_frames(obs)
        if self.width == 1:
            return frames.expand(self.frames.shape)
        repeats = [1] * (len(self.frame_shape) + 1)
        repeats[self.axis + 1] = self.num_frames
        return frames.repeat(*repeats)

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.frames = self._first_stack(obs).contiguous()
        return self.frames, info

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        axis = self.axis + 1
        kept = self.frames.narrow(axis, self.width, self.width * (self.num_frames - 1))
        final = torch.cat([kept, self._as_frames(info["final_obs"])], dim=axis)  # the true next stacks
        done = (terminated | truncated).view(-1, *[1] * (final.dim() - 1))
        self.frames = torch.where(done, self._first_stack(obs), final)
        return self.frames, reward, terminated, truncated, {**info, "final_obs": final}

    def _own_state_dict(self) -> dict[str, Any]:
        return {"frames": self.frames.clone()}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        frames = torch.as_tensor(state["frames"])
        if frames.shape != self.frames.shape:
            raise ConfigError(
                f"FrameStack.load_state_dict: the stacks have shape {tuple(frames.shape)}, expected "
                f"{tuple(self.frames.shape)} (num_envs={self.num_envs}, {self.num_frames} frames of "
                f"{self.env.single_observation_space}). Load the state of the same env and num_envs."
            )
        self.frames = frames.to(self.device, self.frames.dtype).clone()

    def __repr__(self) -> str:
        return f"FrameStack({self.env!r}, num_frames={self.num_frames})"


def _torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (``np.uint8`` -> ``torch.uint8``)."""
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
