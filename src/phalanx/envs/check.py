"""``check_vec_env``: run an environment and report every way it breaks the VecEnv contract.

Each violation is one line: what is wrong, where (method, key, sub-env index, step), expected
against actual, and the fix. All violations found are reported together in one
:class:`~phalanx.errors.ContractError` (its ``violations`` attribute holds the lines). Exceptions
raised by the env itself are reported as violations with their type, message and the line that
raised them.
"""

from __future__ import annotations

import copy
import traceback
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from phalanx.envs.core import VecEnv
from phalanx.errors import ContractError

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


@dataclass
class CheckReport:
    """What :func:`check_vec_env` saw on an env that passed."""

    env: str
    num_steps: int
    episodes: int
    mean_episode_return: float
    mean_episode_length: float
    warnings: list[str] = field(default_factory=list)


class _Abort(Exception):
    """Continuing the check is impossible (e.g. reset raised)."""


def _describe(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _fmt(row: torch.Tensor, limit: int = 8) -> str:
    """A row's values for a message, shortened for large observations."""
    values = row.detach().flatten().cpu().tolist()
    if len(values) <= limit:
        return str(values)
    return f"[{', '.join(repr(v) for v in values[:limit])}, ... ({len(values)} values)]"


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise equality where NaN equals NaN."""
    same = a == b
    if a.is_floating_point():
        same |= torch.isnan(a) & torch.isnan(b)
    return same


class CheckerBase:
    """What the contract checkers (this one and ``phalanx.marl.check``'s) share: the violations found,
    one line per kind, and :meth:`call`, which turns an exception of the user's env into one."""

    def __init__(self, env: Any, seed: int) -> None:
        self.env = env
        self.name = repr(env)
        self.seed = seed
        self.violations: dict[str, str] = {}  # key -> line; one line per kind of violation
        self.warnings: list[str] = []
        self.device: torch.device | None = None
        self.n = 0
        self.at = ""  # " at step k" while stepping, for messages

    def fail(self, key: str, line: str) -> None:
        self.violations.setdefault(key, line)

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the user's env may raise anything
            self.fail(
                f"raised:{what.split('(')[0]}",
                f"{what} raised {_describe(error)}. Expected it to return normally. Fix the env "
                f"(call env.{what.split('(')[0]}(...) directly to see the full traceback).",
            )
            raise _Abort from None

    def raise_violations(self, contract: str, module: str) -> None:
        """Raise one :class:`ContractError` listing every violation found (``violations``: one line each,
        ``warnings`` too); nothing if there is none."""
        if not self.violations:
            return
        lines = list(self.violations.values())
        count = f"{len(lines)} problem{'s' if len(lines) > 1 else ''}"
        error = ContractError(
            f"{self.name} breaks the {contract} ({count}; see {module} for the contract):\n"
            + "\n".join(f"- {line}" for line in lines)
        )
        error.violations = lines  # type: ignore[attr-defined]
        error.warnings = list(self.warnings)  # type: ignore[attr-defined]
        raise error


class _Checker(CheckerBase):
    def __init__(self, env: Any, num_steps: int, seed: int) -> None:
        super().__init__(env, seed)
        self.num_steps = num_steps
        self.obs_shape: tuple[int, ...] | None = None

    # -- static structure --------------------------------------------------------------------------
    def check_structure(self) -> None:
        env = self.env
        missing = [name for name in _REQUIRED if not hasattr(env, name)]
        if missing:
            self.fail(
                "attributes",
                f"{type(env).__name__} is missing {', '.join(missing)}: expected a phalanx.envs.VecEnv "
                f"with {', '.join(_REQUIRED)}. Fix: subclass phalanx.envs.VecEnv (or BatchedVecEnv) and call "
                "its __init__(num_envs, single_observation_space, single_action_space, device).",
            )
            raise _Abort
        if not isinstance(env, VecEnv):
            self.warnings.append(
                f"{type(env).__name__} is not a subclass of phalanx.envs.VecEnv (it has the attributes, so "
                "the check continues); subclass VecEnv so that wrappers and trainers recognise it."
            )
        n = env.num_envs
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            self.fail(
                "num_envs",
                f"num_envs: expected an int >= 1, got {n!r} ({type(n).__name__}). Fix: pass num_envs to "
                "VecEnv.__init__.",
            )
            raise _Abort
        self.n = int(n)
        try:
            self.device = torch.device(env.device)
        except (RuntimeError, TypeError):
            self.fail(
                "device",
                f"device: expected a torch.device, got {env.device!r}. Fix: pass device='cpu' or 'cuda' to "
                "VecEnv.__init__ (it parses it with phalanx.envs.core.as_device).",
            )
        self.check_spaces()
        mode = env.metadata.get("autoreset_mode") if isinstance(env.metadata, dict) else None
        if mode != AutoresetMode.SAME_STEP and mode != AutoresetMode.SAME_STEP.value:
            self.fail(
                "autoreset_mode",
                f'metadata["autoreset_mode"]: expected AutoresetMode.SAME_STEP, got {mode!r}. Fix: inherit '
                "VecEnv.metadata (or set it) and reset ended sub-envs inside step, returning the last "
                'observation in info["final_obs"].',
            )

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
            if single_obs.dtype != np.float32:
                self.fail(
                    "obs_space_dtype",
                    f"single_observation_space.dtype: expected float32 (observations are float32 "
                    f"tensors), got {single_obs.dtype}. Fix: declare Box(..., dtype=np.float32).",
                )
        elif isinstance(single_obs, gym.spaces.Space):
            self.fail(
                "obs_space_type",
                f"single_observation_space: expected a Box (phalanx networks read float32 arrays), got "
                f"{single_obs}. Fix: flatten or one-hot the observation into a float32 Box.",
            )
        if isinstance(single_act, gym.spaces.Space) and not isinstance(
            single_act, (gym.spaces.Box, gym.spaces.Discrete)
        ):
            self.fail(
                "act_space_type",
                f"single_action_space: expected a Box or Discrete, got {single_act}. Fix: flatten the "
                "action space (e.g. one Discrete over all combinations, or a Box).",
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

    # -- arrays ------------------------------------------------------------------------------------
    def check_tensor(
        self,
        where: str,
        x: Any,
        shape: tuple[int, ...] | None,
        dtype: torch.dtype,
        finite: bool = False,
    ) -> bool:
        """Check one returned array; return whether it is a usable tensor of the expected shape."""
        if not isinstance(x, torch.Tensor):
            self.fail(
                f"{where}:type",
                f"{where}: expected a torch.Tensor, got {type(x).__name__}. Fix: return "
                "torch.as_tensor(x, device=env.device).",
            )
            return False
        ok = True
        if shape is not None and tuple(x.shape) != shape:
            self.fail(
                f"{where}:shape",
                f"{where}: expected shape {shape}, got {tuple(x.shape)}. Fix: return one row per sub-env, "
                "matching the declared space.",
            )
            ok = False
        if x.dtype != dtype:
            self.fail(
                f"{where}:dtype",
                f"{where}: expected dtype {dtype}, got {x.dtype}. Fix: convert with .to({dtype}).",
            )
        if self.device is not None and not _same_device(x.device, self.device):
            self.fail(
                f"{where}:device",
                f"{where}: expected device {self.device} (env.device), got {x.device}. Fix: create the "
                "tensor on env.device.",
            )
        if finite and x.is_floating_point() and x.numel() > 0:
            rows = x.reshape(x.shape[0], -1) if x.dim() > 0 else x.reshape(1, 1)
            bad = ~torch.isfinite(rows).all(dim=1)
            if bool(bad.any()):
                index = int(bad.to(torch.int8).argmax())
                self.fail(
                    f"{where}:finite",
                    f"{where}{self.at}: expected finite values, got {_fmt(rows[index])} at sub-env index "
                    f"{index}. "
                    "Fix: check the dynamics for divisions by zero, exp/log overflow or unbounded state.",
                )
        return ok

    # -- actions -----------------------------------------------------------------------------------
    def make_action_sampler(self) -> Any:
        single = self.env.single_action_space
        batched = batch_space(single, self.n)
        batched.seed(self.seed)
        dtype = torch.int64 if isinstance(single, gym.spaces.Discrete) else torch.float32
        device = self.device or torch.device("cpu")

        def sample() -> torch.Tensor:
            return torch.as_tensor(np.asarray(batched.sample()), device=device).to(dtype)

        return sample

    # -- reset and step ----------------------------------------------------------------------------
    def check_reset(self) -> torch.Tensor | None:
        result = self.call(f"reset(seed={self.seed})", self.env.reset, seed=self.seed)
        if not (isinstance(result, tuple) and len(result) == 2):
            got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
            self.fail(
                "reset:tuple",
                f"reset(): expected a 2-tuple (obs, info), got {got}. Fix: return obs, {{}}.",
            )
            raise _Abort
        obs, info = result
        if not isinstance(info, dict):
            self.fail(
                "reset:info",
                f"reset() info: expected a dict, got {type(info).__name__}. Fix: return obs, {{}}.",
            )
        self.check_obs("reset() obs", obs)
        return obs if isinstance(obs, torch.Tensor) else None

    def check_obs(self, where: str, obs: Any) -> bool:
        shape = (self.n, *self.obs_shape) if self.obs_shape is not None else None
        return self.check_tensor(where, obs, shape, torch.float32, finite=True)

    def run(self) -> tuple[int, list[float], list[int]]:
        """Step ``num_steps`` times with random actions; return (steps run, returns, lengths)."""
        sample = self.make_action_sampler()
        n = self.n
        counted = torch.zeros(n, dtype=torch.int64)  # steps since the last episode end, per row
        saw_end = saw_reset_differ = False
        returns: list[float] = []
        lengths: list[int] = []
        step = 0
        for step in range(1, self.num_steps + 1):
            actions = sample()
            self.at = f" at step {step}"
            result = self.call(f"step(actions) at step {step}", self.env.step, actions)
            if not (isinstance(result, tuple) and len(result) == 5):
                got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
                self.fail(
                    "step:tuple",
                    f"step(): expected a 5-tuple (obs, reward, terminated, truncated, info), got {got}. "
                    "Fix: split done into terminated and truncated (Gymnasium >= 1 API).",
                )
                raise _Abort
            obs, reward, terminated, truncated, info = result
            obs_ok = self.check_obs("step() obs", obs)
            self.check_tensor("step() reward", reward, (n,), torch.float32, finite=True)
            term_ok = self.check_tensor("step() terminated", terminated, (n,), torch.bool)
            trunc_ok = self.check_tensor("step() truncated", truncated, (n,), torch.bool)
            if not isinstance(info, dict):
                self.fail(
                    "step:info",
                    f"step() info: expected a dict, got {type(info).__name__}. Fix: return a dict.",
                )
                continue
            if not (term_ok and trunc_ok):
                continue
            done = (terminated | truncated).cpu()
            counted += 1
            # final_obs and its mask
            final = info.get("final_obs")
            if final is None:
                self.fail(
                    "final_obs:missing",
                    'step() info["final_obs"]: missing; expected a (num_envs, *obs_shape) tensor (last '
                    "observation of the finished episode where terminated | truncated, equal to obs "
                    "elsewhere). Fix: subclass BatchedVecEnv, or add it (with the mask info['_final_obs']).",
                )
            elif self.check_obs('step() info["final_obs"]', final) and obs_ok:
                same = _equal(final, obs).reshape(n, -1).all(dim=1).cpu()
                wrong = ~done & ~same
                if bool(wrong.any()):
                    index = int(wrong.to(torch.int8).argmax())
                    self.fail(
                        "final_obs:not_ended",
                        f'step() info["final_obs"] at step {step}, sub-env index {index} (episode not '
                        f"ended): expected equal to obs {_fmt(obs[index])}, got {_fmt(final[index])}. "
                        "Fix: final_obs must be the true next observation of every row.",
                    )
                if bool(done.any()):
                    saw_end = True
                    saw_reset_differ = saw_reset_differ or bool((done & ~same).any())
            mask = info.get("_final_obs")
            if mask is None:
                self.fail(
                    "_final_obs:missing",
                    'step() info["_final_obs"]: missing; expected the bool (num_envs,) mask '
                    "terminated | truncated. Fix: info['_final_obs'] = terminated | truncated.",
                )
            elif self.check_tensor('step() info["_final_obs"]', mask, (n,), torch.bool):
                differ = mask.cpu() != done
                if bool(differ.any()):
                    index = int(differ.to(torch.int8).argmax())
                    self.fail(
                        "_final_obs:value",
                        f'step() info["_final_obs"] at step {step}, sub-env index {index}: expected '
                        f"terminated | truncated = {bool(done[index])}, got {bool(mask[index])}. Fix: "
                        "info['_final_obs'] = terminated | truncated.",
                    )
            ep_return, ep_length = info.get("episode_return"), info.get("episode_length")
            for key, value in (("episode_return", ep_return), ("episode_length", ep_length)):
                if value is None:
                    self.fail(
                        f"{key}:missing",
                        f'step() info["{key}"]: missing; expected a (num_envs,) tensor valid where an '
                        "episode ended. Fix: use phalanx.envs.EpisodeStatistics (BatchedVecEnv does).",
                    )
            ret_ok = ep_return is not None and self.check_tensor(
                'step() info["episode_return"]', ep_return, (n,), torch.float32
            )
            len_ok = ep_length is not None and self.check_tensor(
                'step() info["episode_length"]', ep_length, (n,), torch.int64
            )
            if bool(done.any()):
                rows = torch.nonzero(done).flatten()
                if len_ok:
                    got = ep_length.cpu()[rows]
                    if bool((got < 1).any()):
                        index = int(rows[int((got < 1).to(torch.int8).argmax())])
                        self.fail(
                            "episode_length:positive",
                            f'step() info["episode_length"] at step {step}, sub-env index {index}: expected '
                            f">= 1 for an ended episode, got {int(ep_length[index])}. Fix: count the steps "
                            "of each episode (phalanx.envs.EpisodeStatistics).",
                        )
                    mismatch = got != counted[rows]
                    if bool(mismatch.any()):
                        index = int(rows[int(mismatch.to(torch.int8).argmax())])
                        self.fail(
                            "episode_length:count",
                            f'step() info["episode_length"] at step {step}, sub-env index {index}: expected '
                            f"{int(counted[index])} (steps since that sub-env's previous episode ended), got "
                            f"{int(ep_length[index])}. Fix: reset the length counter when an episode ends "
                            "and on reset().",
                        )
                    lengths.extend(int(v) for v in got)
                if ret_ok:
                    returns.extend(float(v) for v in ep_return.cpu()[rows])
                counted[done] = 0
        if saw_end and not saw_reset_differ:
            self.fail(
                "autoreset",
                'step() autoreset: expected info["final_obs"] to differ from obs in some row where an '
                "episode ended (obs should be the first observation of the next episode), but every ended "
                "row had final_obs == obs. The env probably does not reset ended sub-envs inside step. "
                "Fix: same-step autoreset (BatchedVecEnv does it; see the VecEnv contract).",
            )
        if not saw_end:
            self.warnings.append(
                f"no episode ended in {step} steps x {n} sub-envs: autoreset, final_obs and the episode "
                "statistics were not verified. Raise num_steps, or give the env a max_episode_steps."
            )
        return step, returns, lengths

    def check_determinism(self) -> None:
        steps = min(_DETERMINISM_STEPS, self.num_steps)
        sample = self.make_action_sampler()
        actions = [sample() for _ in range(steps)]
        # Stateful wrappers (running normalisation statistics) change between the two runs unless their
        # state is restored; restore it so that only the seeding is under test.
        try:
            snapshot = copy.deepcopy(self.env.state_dict())
        except Exception:  # noqa: BLE001 - no usable state_dict: compare without restoring
            snapshot = None
        runs = []
        for _ in range(2):
            if snapshot is not None:
                self.call("load_state_dict(state)", self.env.load_state_dict, copy.deepcopy(snapshot))
            obs, _ = self.call(f"reset(seed={self.seed})", self.env.reset, seed=self.seed)
            trace = [("reset() obs", 0, obs)]
            for step, action in enumerate(actions, start=1):
                obs, reward, *_ = self.call(f"step(actions) at step {step}", self.env.step, action)
                trace += [("obs", step, obs), ("reward", step, reward)]
            runs.append(trace)
        for (what, step, a), (_, _, b) in zip(*runs, strict=True):
            if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
                return
            same = _equal(a, b).reshape(a.shape[0], -1).all(dim=1) if a.dim() else _equal(a, b).reshape(1)
            if not bool(same.all()):
                index = int((~same).to(torch.int8).argmax())
                self.fail(
                    "determinism",
                    f"seeding: reset(seed={self.seed}) twice (state_dict() restored before each) with the "
                    f"same {steps} actions gave different {what} at step {step}, sub-env index {index}: "
                    f"first run {_fmt(a[index])}, second run {_fmt(b[index])}; expected identical. "
                    "Fix: draw all randomness (initial states, noise) from a generator seeded in "
                    "reset(seed=...), not from global RNGs.",
                )
                return


def check_vec_env(env: Any, num_steps: int = 1000, seed: int = 0) -> CheckReport:
    """Run ``env`` for ``num_steps`` random steps and verify the VecEnv contract.

    Raises :class:`~phalanx.errors.ContractError` listing every violation found (attribute
    ``violations``: one line each); returns a :class:`CheckReport` otherwise. The env is left reset or
    mid-episode; reset it before use.
    """
    checker = _Checker(env, num_steps, seed)
    steps, returns, lengths = 0, [], []
    try:
        checker.check_structure()
        checker.check_reset()
        steps, returns, lengths = checker.run()
        checker.check_determinism()
    except _Abort:
        pass
    checker.raise_violations("VecEnv contract", "phalanx.envs.core")
    return CheckReport(
        env=checker.name,
        num_steps=steps,
        episodes=len(lengths),
        mean_episode_return=float(np.mean(returns)) if returns else float("nan"),
        mean_episode_length=float(np.mean(lengths)) if lengths else float("nan"),
        warnings=checker.warnings,
    )
