"""Wrappers around a :class:`~phalanx.envs.core.VecEnv`: every array stays a tensor on the env's device.

- :class:`VecEnvWrapper`: the base class; forwards everything explicitly (no ``__getattr__``), keeps
  the wrapped env's state in ``state_dict()["env"]``.
- :class:`RescaleAction`: the agent acts in ``[-1, 1]`` (a Box) or from 0 (Discrete, MultiDiscrete); the
  wrapper maps its actions into the env's space (:class:`ActionMap`, shared with deployed and exported
  policies).
- :class:`NormalizeObservation`: running mean/variance normalisation of observations (and of
  ``info["final_obs"]`` with the same statistics), statistics shareable with an evaluation env.
- :class:`ScaleReward`: reward divided by the running standard deviation of the discounted return
  (the reward normalisation of Stable-Baselines3's ``VecNormalize``).
- :class:`NanGuard`: raises a :class:`~phalanx.errors.ContractError` at the first non-finite action,
  observation or reward, naming the array, the sub-env index and the step (integer arrays, such as
  uint8 images, cannot hold one and are not checked).
- :class:`FrameStack`: the last k observations of every sub-env as one, on the device (Atari's 4 frames).
- :class:`MaskVelocity`: zeroes chosen entries of the observations (the velocities of CartPole and
  Pendulum: the built-in memory tasks ``CartPoleNoVel-v1``, ``PendulumNoVel-v1``).

Wrappers never change ``info["episode_return"]`` / ``info["episode_length"]``: those are the
undiscounted statistics of the innermost env's own rewards.

Where each lives (every name is importable from here too): :mod:`phalanx.envs.wrapper_base`,
:mod:`phalanx.envs.action_map`, :mod:`phalanx.envs.normalization`, :mod:`phalanx.envs.nan_guard`,
:mod:`phalanx.envs.observation_wrappers`.
"""

from __future__ import annotations

from phalanx.envs.action_map import ActionMap, RescaleAction, agent_action_space, needs_action_map
from phalanx.envs.nan_guard import NanGuard
from phalanx.envs.normalization import (
    OBS_CLIP,
    OBS_EPSILON,
    MemberNormalizeObservation,
    MemberScaleReward,
    NormalizeObservation,
    RunningMeanStd,
    ScaleReward,
)
from phalanx.envs.observation_wrappers import FrameStack, MaskVelocity
from phalanx.envs.wrapper_base import VecEnvWrapper, find_wrapper

__all__ = [
    "OBS_CLIP",
    "OBS_EPSILON",
    "ActionMap",
    "FrameStack",
    "MaskVelocity",
    "MemberNormalizeObservation",
    "MemberScaleReward",
    "NanGuard",
    "NormalizeObservation",
    "RescaleAction",
    "RunningMeanStd",
    "ScaleReward",
    "VecEnvWrapper",
    "agent_action_space",
    "find_wrapper",
    "needs_action_map",
]
