"""``check_vec_env``: run an environment and report every way it breaks the VecEnv contract.

Each violation is one line: what is wrong, where (method, key, sub-env index, step), expected
against actual, and the fix. All violations found are reported together in one
:class:`~phalanx.errors.ContractError` (its ``violations`` attribute holds the lines). Exceptions
raised by the env itself are reported as violations with their type, message and the line that
raised them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space

from phalanx.envs.base import VecEnv
from phalanx.envs.contract_checker import CheckAborted as CheckAborted
from phalanx.envs.contract_checker import (
    CheckerBase,
    ContractReport,
    equal_with_nan,
    first_difference,
    first_true,
    format_values,
)
from phalanx.envs.spaces import DICT_PARTS

__all__ = ["CheckReport", "check_vec_env"]

_REQUIRED = (
    "num_envs",
    "device",
    "single_observation_space",
    "single_action_space",
    "observation_space",
    "action_space",
    "metadata",
    "reset",
    "step",
)
_DETERMINISM_STEPS = 20


class CheckReport(ContractReport[float]):
    """What :func:`check_vec_env` saw on an env that passed."""


class _Checker(CheckerBase):
    contract = VecEnv
    contract_name = "phalanx.envs.VecEnv"
    contract_title = "VecEnv contract"
    batched_name = "BatchedVecEnv"
    init_arguments = "num_envs, single_observation_space, single_action_space, device"
    required = _REQUIRED
    step_returns = "(obs, reward, terminated, truncated, info)"
    contract_module = "phalanx.envs.core"

    def __init__(self, env: Any, num_steps: int, seed: int) -> None:
        super().__init__(env, num_steps, seed)
        self.obs_shape: tuple[int, ...] | None = None
        self.obs_dtype = torch.float32  # uint8 for a uint8 observation space
        self.returns: list[float] = []

    def check_structure(self) -> None:
        self.check_attributes()
        self.check_spaces()
        self.check_autoreset_mode()

    def check_spaces(self) -> None:
        env, n = self.env, self.n
        single_obs, single_act = env.single_observation_space, env.single_action_space
        for name, space in (
            ("single_observation_space", single_obs),
            ("single_action_space", single_act),
            ("observation_space", env.observation_space),
            ("action_space", env.action_space),
        ):
            if not isinstance(space, gym.spaces.Space):
                self.fail(
                    name,
                    f"{name}: expected a gymnasium.spaces.Space, got {type(space).__name__} ({space!r}). "
                    "Fix: use gymnasium.spaces.Box or Discrete.",
                )
        if isinstance(single_obs, gym.spaces.Box):
            self.obs_shape = tuple(single_obs.shape)
            if single_obs.dtype == np.uint8:
                self.obs_dtype = torch.uint8
            elif single_obs.dtype != np.float32:
                self.fail(
                    "obs_space_dtype",
                    f"single_observation_space.dtype: expected float32 (observations are float32 "
                    f"tensors) or uint8 (images), got {single_obs.dtype}. Fix: declare "
                    "Box(..., dtype=np.float32), or np.uint8 for images.",
                )
        elif isinstance(single_obs, gym.spaces.Dict) and all(
            isinstance(part, DICT_PARTS) for part in single_obs.spaces.values()
        ):
            self.obs_shape = (int(gym.spaces.flatdim(single_obs)),)  # flat float32 vectors
        elif isinstance(single_obs, gym.spaces.Space):
            self.fail(
                "obs_space_type",
                f"single_observation_space: expected a Box (float32, or uint8 images) or a Dict of Box, "
                f"Discrete and MultiBinary parts, got {single_obs}. Fix: flatten or one-hot the "
                "observation into a float32 Box.",
            )
        if isinstance(single_act, gym.spaces.Space) and not (
            isinstance(single_act, (gym.spaces.Box, gym.spaces.Discrete))
            or (isinstance(single_act, gym.spaces.MultiDiscrete) and len(single_act.shape) == 1)
        ):
            self.fail(
                "act_space_type",
                f"single_action_space: expected a Box, Discrete or one-dimensional MultiDiscrete, got "
                f"{single_act}. Fix: flatten the action space (e.g. one Discrete over all combinations, or a "
                "Box).",
            )
        for name, single, batched in (
            ("observation_space", single_obs, env.observation_space),
            ("action_space", single_act, env.action_space),
        ):
            if not isinstance(single, gym.spaces.Space) or not isinstance(batched, gym.spaces.Space):
                continue
            expected = (n, *single.shape) if single.shape is not None else None
            if expected is not None and tuple(batched.shape or ()) != expected:
                self.fail(
                    f"{name}_batched",
                    f"{name}: expected shape (num_envs, *single_{name}.shape) = {expected}, got "
                    f"{batched.shape}. Fix: set {name} = gymnasium.vector.utils.batch_space(single_{name}, "
                    "num_envs) (VecEnv.__init__ does this).",
                )

    def check_obs(self, where: str, obs: Any) -> bool:
        shape = (self.n, *self.obs_shape) if self.obs_shape is not None else None
        return self.check_tensor(where, obs, shape, self.obs_dtype, finite=True)

    # -- actions -----------------------------------------------------------------------------------
    def make_action_sampler(self) -> Any:
        single = self.env.single_action_space
        batched = batch_space(single, self.n)
        batched.seed(self.seed)
        integer = isinstance(single, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
        dtype = torch.int64 if integer else torch.float32
        device = self.device or torch.device("cpu")

        def sample() -> torch.Tensor:
            return torch.as_tensor(np.asarray(batched.sample()), device=device).to(dtype)

        return sample

    # -- reset and step ----------------------------------------------------------------------------
    def check_reset(self) -> None:
        obs, _ = self.reset_result()
        self.check_obs("reset() obs", obs)

    def check_step(
        self, step: int, obs: Any, reward: Any, terminated: Any, truncated: Any, info: Any
    ) -> None:
        obs_ok = self.check_obs("step() obs", obs)
        self.check_tensor("step() reward", reward, (self.n,), torch.float32, finite=True)
        done = self.check_flags(terminated, truncated, info)
        if done is None:
            return
        self.counted += 1
        self.check_final_obs(step, info, obs if obs_ok else None, done)
        self.check_final_mask(step, info, done)
        statistics_rows = self.check_statistics_rows(step, info, done)
        self.check_episode_return(info, done if statistics_rows is None else statistics_rows)
        if statistics_rows is None:
            self.check_episode_length(step, info, done)
        else:
            self.check_whole_episode_length(step, info, statistics_rows)
        self.counted[done] = 0

    def check_final_obs(self, step: int, info: dict, obs: torch.Tensor | None, done: torch.Tensor) -> None:
        """``info["final_obs"]``: equal to ``obs`` in the rows where no episode ended."""
        final = self.missing(
            info,
            "final_obs",
            "a (num_envs, *obs_shape) tensor (last observation of the finished episode where terminated "
            "| truncated, equal to obs elsewhere). Fix: subclass BatchedVecEnv, or add it (with the mask "
            "info['_final_obs']).",
        )
        if final is None or not self.check_obs('step() info["final_obs"]', final) or obs is None:
            return
        same = equal_with_nan(final, obs).reshape(self.n, -1).all(dim=1).cpu()
        wrong = first_true(~done & ~same)
        if wrong is not None:
            (index,) = wrong
            self.fail(
                "final_obs:not_ended",
                f'step() info["final_obs"] at step {step}, sub-env index {index} (episode not '
                f"ended): expected equal to obs {format_values(obs[index])}, got "
                f"{format_values(final[index])}. Fix: final_obs must be the true next observation of every "
                "row.",
            )
        self.note_ended(done, same)

    def check_statistics_rows(self, step: int, info: dict, done: torch.Tensor) -> torch.Tensor | None:
        """``info["_episode_return"]`` where the env sets it: a bool ``(num_envs,)`` tensor true only where
        an episode ended (a whole, e.g. an Atari game, ends with one of its parts); None if absent."""
        rows = info.get("_episode_return")
        if rows is None or not self.check_tensor(
            'step() info["_episode_return"]', rows, (self.n,), torch.bool
        ):
            return None
        rows = rows.cpu()
        wrong = first_true(rows & ~done)
        if wrong is not None:
            self.fail(
                "_episode_return:not_ended",
                f'step() info["_episode_return"] at step {step}, sub-env index {wrong[0]}: true where the '
                "episode did not end (terminated | truncated false). Fix: report the statistics of the "
                "whole episode at the step of its last part, which ends (terminated or truncated) too.",
            )
        return rows

    def check_whole_episode_length(self, step: int, info: dict, rows: torch.Tensor) -> None:
        """With ``info["_episode_return"]``: the lengths it marks count the steps since that row's previous
        whole episode ended (or reset)."""
        self.whole_counted += 1
        length = info.get("episode_length")
        if isinstance(length, torch.Tensor) and length.shape == (self.n,):
            got = length.cpu()[rows]
            expected = self.whole_counted[rows]
            wrong = first_true(got != expected)
            if wrong is not None:
                index = int(torch.nonzero(rows).flatten()[wrong[0]])
                self.fail(
                    "episode_length:whole",
                    f'step() info["episode_length"] at step {step}, sub-env index {index}: expected '
                    f"{int(self.whole_counted[index])} (steps since that sub-env's previous whole episode "
                    f'ended, as info["_episode_return"] marks them), got {int(length[index])}.',
                )
            self.lengths.extend(int(v) for v in got)
        self.whole_counted[rows] = 0

    def check_episode_return(self, info: dict, done: torch.Tensor) -> None:
        """``info["episode_return"]``: a float32 (num_envs,) tensor, valid where an episode ended (``done``:
        those rows, or those of ``info["_episode_return"]``)."""
        value = self.missing(
            info,
            "episode_return",
            "a (num_envs,) tensor valid where an episode ended. Fix: use phalanx.envs.EpisodeStatistics "
            "(BatchedVecEnv does).",
        )
        if value is not None and self.check_tensor(
            'step() info["episode_return"]', value, (self.n,), torch.float32
        ):
            self.returns.extend(float(v) for v in value.cpu()[done])

    # -- seeding -----------------------------------------------------------------------------------
    def check_determinism(self) -> None:
        steps = min(_DETERMINISM_STEPS, self.num_steps)
        sample = self.make_action_sampler()
        actions = [sample() for _ in range(steps)]

        def play() -> list[tuple[str, int, Any]]:
            obs, _ = self.call(f"reset(seed={self.seed})", self.env.reset, seed=self.seed)
            trace = [("reset() obs", 0, obs)]
            for step, action in enumerate(actions, start=1):
                obs, reward, *_ = self.call(f"step(actions) at step {step}", self.env.step, action)
                trace += [("obs", step, obs), ("reward", step, reward)]
            return trace

        for (what, step, a), (_, _, b) in zip(*self.replay_twice(play), strict=True):
            if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
                return
            index = first_difference(a, b, leading=1)
            if index is not None:
                self.seeding_failure(steps, what, step, f"sub-env index {index[0]}", a[index[0]], b[index[0]])
                return


def check_vec_env(env: Any, num_steps: int = 1000, seed: int = 0) -> CheckReport:
    """Run ``env`` for ``num_steps`` random steps and verify the VecEnv contract.

    Raises :class:`~phalanx.errors.ContractError` listing every violation found (attribute
    ``violations``: one line each); returns a :class:`CheckReport` otherwise. The env is left reset or
    mid-episode; reset it before use.
    """
    checker = _Checker(env, num_steps, seed)
    steps = checker.check()
    mean_return = float(np.mean(checker.returns)) if checker.returns else float("nan")
    return checker.report(CheckReport, steps, mean_return)
