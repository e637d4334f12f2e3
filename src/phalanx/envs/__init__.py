"""Batched environments on torch tensors: the VecEnv contract, built-in envs, adapters, wrappers."""

from phalanx.envs.action_map import RescaleAction
from phalanx.envs.check import CheckReport, check_vec_env
from phalanx.envs.core import BatchedVecEnv, ConcatVecEnv, EpisodeStatistics, VecEnv
from phalanx.envs.gymnasium import GymnasiumVecEnv
from phalanx.envs.nan_guard import NanGuard
from phalanx.envs.normalization import NormalizeObservation, RunningMeanStd, ScaleReward
from phalanx.envs.observation_wrappers import FrameStack
from phalanx.envs.processes import ProcessVecEnv
from phalanx.envs.registry import list_envs, load_factory, make_env, register_env
from phalanx.envs.wrapper_base import VecEnvWrapper, find_wrapper

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
