"""Batched environments on torch tensors: the VecEnv contract, built-in envs, adapters, wrappers."""

from phalanx.envs.core import BatchedVecEnv, EpisodeStatistics, VecEnv

__all__ = ["BatchedVecEnv", "EpisodeStatistics", "VecEnv"]
