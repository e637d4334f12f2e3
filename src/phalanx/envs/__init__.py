"""Batched environments on torch tensors: the VecEnv contract, built-in envs, adapters, wrappers."""

from phalanx.envs.check import CheckReport, check_vec_env
from phalanx.envs.core import BatchedVecEnv, ConcatVecEnv, EpisodeStatistics, VecEnv
from phalanx.envs.registry import list_envs, load_factory, make_env, register_env
from phalanx.envs.workers import GymnasiumVecEnv, ProcessVecEnv
from phalanx.envs.wrappers import (
    FrameStack,
    NanGuard,
    NormalizeObservation,
    RescaleAction,
    RunningMeanStd,
    ScaleReward,
    VecEnvWrapper,
    find_wrapper,
)

__all__ = [
    "BatchedVecEnv",
    "CheckReport",
    "ConcatVecEnv",
    "EpisodeStatistics",
    "FrameStack",
    "GymnasiumVecEnv",
    "NanGuard",
    "NormalizeObservation",
    "ProcessVecEnv",
    "RescaleAction",
    "RunningMeanStd",
    "ScaleReward",
    "VecEnv",
    "VecEnvWrapper",
    "check_vec_env",
    "find_wrapper",
    "list_envs",
    "load_factory",
    "make_env",
    "register_env",
]
