"""What the contract checkers share: :class:`CheckerBase`, the :class:`ContractReport` it fills, and the
comparisons their messages use.

:func:`phalanx.envs.check_vec_env` (the VecEnv contract) and ``phalanx.marl.check`` (the multi-agent
one) both run an env through :class:`CheckerBase`: it collects one line per kind of violation, turns
the env's own exceptions into violations, checks the attributes, the returned tensors, the 2- and
5-tuples, the ``_final_obs`` mask and the episode lengths, steps the env with random actions and replays
a seed twice. A subclass names its contract and checks what that contract adds.
"""

from __future__ import annotations

import copy
import traceback
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from phalanx.errors import ContractError

Return = TypeVar("Return")


@dataclass
class ContractReport(Generic[Return]):
    """What a contract check saw on an env that passed: the steps run, the episodes that ended, their
    mean return (``Return``: a float, or one per agent group) and length, and the warnings."""

    env: str
    num_steps: int
    episodes: int
    mean_episode_return: Return
    mean_episode_length: float
    warnings: list[str] = field(default_factory=list)


Report = TypeVar("Report", bound=ContractReport[Any])


class CheckAborted(Exception):
    """Continuing the check is impossible (e.g. reset raised)."""


def _describe(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def format_values(row: torch.Tensor, limit: int = 8) -> str:
    """A row's values for a message, shortened for large observations."""
    values = row.detach().flatten().cpu().tolist()
    if len(values) <= limit:
        return str(values)
    return f"[{', '.join(repr(v) for v in values[:limit])}, ... ({len(values)} values)]"


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def equal_with_nan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise equality where NaN equals NaN."""
    same = a == b
    if a.is_floating_point():
        same |= torch.isnan(a) & torch.isnan(b)
    return same


def first_true(mask: torch.Tensor) -> list[int] | None:
    """The index of the first true element of ``mask`` (row-major order), or None if none is true."""
    if not bool(mask.any()):
        return None
    return mask.nonzero()[0].tolist()


def first_difference(a: torch.Tensor, b: torch.Tensor, leading: int) -> list[int] | None:
    """The index over the ``leading`` dimensions of the first place where ``a`` and ``b`` differ (NaN
    equal to NaN), or None where they are equal; a tensor with fewer dimensions counts as size 1 there."""
    shape = tuple(a.shape[:leading]) + (1,) * max(0, leading - a.dim())
    return first_true(~equal_with_nan(a, b).reshape(*shape, -1).all(dim=-1))


class CheckerBase:
    """What the contract checkers (this one and ``phalanx.marl.check``'s) share: the violations found,
    one line per kind; :meth:`call`, which turns an exception of the user's env into one; the checks of
    the attributes, of returned tensors, of the 2- and 5-tuples, of the ``_final_obs`` mask and the
    episode lengths; the stepping loop and the seeding replay. A subclass names its contract in the class
    attributes and checks what its contract adds (spaces, groups, observations) in the hooks."""

    contract: type  # the class a conforming env subclasses
    contract_name: str  # how messages name it
    contract_title: str  # how the error names the contract
    batched_name: str  # the subclass that implements autoreset and episode statistics
    init_arguments: str  # the arguments of the contract's __init__, for messages
    required: tuple[str, ...]  # the attributes and methods every env has
    step_returns: str  # what step returns, for messages
    contract_module: str | None = None  # the module that states the contract; None: that of ``contract``

    def __init__(self, env: Any, num_steps: int, seed: int) -> None:
        self.env = env
        self.name = repr(env)
        self.num_steps = num_steps
        self.seed = seed
        self.violations: dict[str, str] = {}  # key -> line; one line per kind of violation
        self.warnings: list[str] = []
        self.device: torch.device | None = None
        self.n = 0
        self.at = ""  # " at step k" while stepping, for messages
        # while stepping: steps since the last episode end per row, the lengths of the ended episodes, and
        # whether an episode ended and whether an ended row's next observation differed from final_obs
        self.counted = torch.zeros(0, dtype=torch.int64)
        self.lengths: list[int] = []
        self.saw_end = self.saw_reset_differ = False

    def report(self, report_class: type[Report], steps: int, mean_episode_return: Any) -> Report:
        """What :meth:`check` saw, ``steps`` of it, as a ``report_class``."""
        return report_class(
            env=self.name,
            num_steps=steps,
            episodes=len(self.lengths),
            mean_episode_return=mean_episode_return,
            mean_episode_length=float(np.mean(self.lengths)) if self.lengths else float("nan"),
            warnings=self.warnings,
        )

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
            raise CheckAborted from None

    def check(self) -> int:
        """Run the checks in order (a violation that makes going on impossible ends them) and raise one
        :class:`ContractError` listing every violation found; return the steps run."""
        steps = 0
        try:
            self.check_structure()
            self.check_reset()
            steps = self.run()
            self.check_determinism()
        except CheckAborted:
            pass
        self.raise_violations()
        return steps

    def raise_violations(self) -> None:
        """Raise one :class:`ContractError` listing every violation found (``violations``: one line each,
        ``warnings`` too); nothing if there is none."""
        if not self.violations:
            return
        lines = list(self.violations.values())
        count = f"{len(lines)} problem{'s' if len(lines) > 1 else ''}"
        contract_module = self.contract_module or self.contract.__module__
        error = ContractError(
            f"{self.name} breaks the {self.contract_title} ({count}; see {contract_module} for the "
            "contract):\n" + "\n".join(f"- {line}" for line in lines)
        )
        # ignored below: attributes the report adds to the error, for callers that read them
        error.violations = lines  # type: ignore[attr-defined]
        error.warnings = list(self.warnings)  # type: ignore[attr-defined]
        raise error

    # -- static structure --------------------------------------------------------------------------
    def check_attributes(self) -> None:
        """The required attributes, the base class, ``num_envs`` and ``device``."""
        env = self.env
        missing = [name for name in self.required if not hasattr(env, name)]
        if missing:
            self.fail(
                "attributes",
                f"{type(env).__name__} is missing {', '.join(missing)}: expected a {self.contract_name} "
                f"with {', '.join(self.required)}. Fix: subclass {self.contract_name} (or "
                f"{self.batched_name}) and call its __init__({self.init_arguments}).",
            )
            raise CheckAborted
        if not isinstance(env, self.contract):
            self.warnings.append(
                f"{type(env).__name__} is not a subclass of {self.contract_name} (it has the attributes, so "
                "the check continues); subclass it so that wrappers and trainers recognise it."
            )
        n = env.num_envs
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            self.fail(
                "num_envs",
                f"num_envs: expected an int >= 1, got {n!r} ({type(n).__name__}). Fix: pass num_envs to "
                f"{self.contract.__name__}.__init__.",
            )
            raise CheckAborted
        self.n = int(n)
        try:
            self.device = torch.device(env.device)
        except (RuntimeError, TypeError):
            self.fail(
                "device",
                f"device: expected a torch.device, got {env.device!r}. Fix: pass device='cpu' or 'cuda' to "
                f"{self.contract.__name__}.__init__ (it parses it with phalanx.envs.core.as_device).",
            )

    def check_autoreset_mode(self) -> None:
        env = self.env
        mode = env.metadata.get("autoreset_mode") if isinstance(env.metadata, dict) else None
        if mode != AutoresetMode.SAME_STEP and mode != AutoresetMode.SAME_STEP.value:
            self.fail(
                "autoreset_mode",
                f'metadata["autoreset_mode"]: expected AutoresetMode.SAME_STEP, got {mode!r}. Fix: inherit '
                f"{self.contract.__name__}.metadata (or set it) and reset ended sub-envs inside step, "
                'returning the last observation in info["final_obs"].',
            )

    # -- arrays ------------------------------------------------------------------------------------
    def check_tensor(
        self,
        where: str,
        x: Any,
        shape: tuple[int, ...] | None,
        dtype: torch.dtype,
        finite: bool = False,
        group: str | None = None,
    ) -> bool:
        """Check one returned array (its values finite where ``finite`` and it is floating); return
        whether it is a usable tensor of the expected shape. ``group``: the agent group of its rows."""
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
            rows = x if x.dim() > 0 else x.reshape(1)
            index = first_true(~torch.isfinite(rows))
            if index is not None:
                place, values = self.locate(rows, index, group)
                self.fail(
                    f"{where}:finite",
                    f"{where}{self.at}: expected finite values, got {format_values(values)} at {place}. "
                    "Fix: check the dynamics for divisions by zero, exp/log overflow or unbounded state.",
                )
        return ok

    def locate(self, x: torch.Tensor, index: list[int], group: str | None) -> tuple[str, torch.Tensor]:
        """Where ``index`` is, for a message, and the values there to show."""
        return f"sub-env index {index[0]}", x[index[0]]

    # -- reset and step ----------------------------------------------------------------------------
    def reset_result(self) -> tuple[Any, dict | None]:
        """Call ``reset(seed=seed)`` and check that it returns ``(obs, info)`` with a dict ``info``;
        return them (``info`` None where it is not a dict)."""
        result = self.call(f"reset(seed={self.seed})", self.env.reset, seed=self.seed)
        if not (isinstance(result, tuple) and len(result) == 2):
            got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
            self.fail(
                "reset:tuple",
                f"reset(): expected a 2-tuple (obs, info), got {got}. Fix: return obs, {{}}.",
            )
            raise CheckAborted
        obs, info = result
        if not isinstance(info, dict):
            self.fail(
                "reset:info",
                f"reset() info: expected a dict, got {type(info).__name__}. Fix: return obs, {{}}.",
            )
            return obs, None
        return obs, info

    def check_structure(self) -> None:
        """The attributes and spaces, before anything runs."""
        raise NotImplementedError

    def check_reset(self) -> None:
        """What ``reset(seed=seed)`` returns."""
        raise NotImplementedError

    def check_determinism(self) -> None:
        """That the seed and the same actions reproduce the same observations and rewards."""
        raise NotImplementedError

    def make_action_sampler(self) -> Any:
        """A function of no arguments that returns random valid actions for every sub-env, seeded."""
        raise NotImplementedError

    def check_step(
        self, step: int, obs: Any, reward: Any, terminated: Any, truncated: Any, info: Any
    ) -> None:
        """Check what one step returned (a 5-tuple)."""
        raise NotImplementedError

    def run(self) -> int:
        """Step ``num_steps`` times with random actions, checking what each step returns; return the
        steps run."""
        sample = self.make_action_sampler()
        self.counted = torch.zeros(self.n, dtype=torch.int64)
        self.whole_counted = torch.zeros(self.n, dtype=torch.int64)  # see info["_episode_return"]
        step = 0
        for step in range(1, self.num_steps + 1):
            actions = sample()
            self.at = f" at step {step}"
            result = self.call(f"step(actions) at step {step}", self.env.step, actions)
            if not (isinstance(result, tuple) and len(result) == 5):
                got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
                self.fail(
                    "step:tuple",
                    f"step(): expected a 5-tuple {self.step_returns}, got {got}. "
                    "Fix: split done into terminated and truncated (Gymnasium >= 1 API).",
                )
                raise CheckAborted
            self.check_step(step, *result)
        self.check_autoreset_seen(step)
        return step

    def check_flags(self, terminated: Any, truncated: Any, info: Any) -> torch.Tensor | None:
        """Check ``terminated``, ``truncated`` and that ``info`` is a dict; return ``terminated |
        truncated`` on the CPU, or None where they are not usable."""
        term_ok = self.check_tensor("step() terminated", terminated, (self.n,), torch.bool)
        trunc_ok = self.check_tensor("step() truncated", truncated, (self.n,), torch.bool)
        if not isinstance(info, dict):
            self.fail(
                "step:info",
                f"step() info: expected a dict, got {type(info).__name__}. Fix: return a dict.",
            )
            return None
        if not (term_ok and trunc_ok) or terminated.dtype != torch.bool or truncated.dtype != torch.bool:
            return None
        return (terminated | truncated).cpu()

    def note_ended(self, done: torch.Tensor, same: torch.Tensor) -> None:
        """Record the episodes that ended, and whether ``final_obs`` differs from ``obs`` in an ended row
        (``same``: per row, whether they are equal)."""
        if bool(done.any()):
            self.saw_end = True
            self.saw_reset_differ = self.saw_reset_differ or bool((done & ~same).any())

    def missing(self, info: dict, key: str, expected: str) -> Any:
        """``info[key]``, or None after reporting it missing (``expected``: what it should be, the fix)."""
        value = info.get(key)
        if value is None:
            self.fail(f"{key}:missing", f'step() info["{key}"]: missing; expected {expected}')
        return value

    def check_final_mask(self, step: int, info: dict, done: torch.Tensor) -> None:
        """``info["_final_obs"]``: the bool mask ``terminated | truncated``."""
        mask = self.missing(
            info,
            "_final_obs",
            "the bool (num_envs,) mask terminated | truncated. Fix: info['_final_obs'] = terminated | "
            "truncated.",
        )
        if mask is not None and self.check_tensor('step() info["_final_obs"]', mask, (self.n,), torch.bool):
            differ = first_true(mask.cpu() != done)
            if differ is not None:
                (index,) = differ
                self.fail(
                    "_final_obs:value",
                    f'step() info["_final_obs"] at step {step}, sub-env index {index}: expected '
                    f"terminated | truncated = {bool(done[index])}, got {bool(mask[index])}. Fix: "
                    "info['_final_obs'] = terminated | truncated.",
                )

    def check_episode_length(self, step: int, info: dict, done: torch.Tensor) -> None:
        """``info["episode_length"]``: where an episode ended, the steps since that row's previous end."""
        length = self.missing(
            info,
            "episode_length",
            "a (num_envs,) int64 tensor valid where an episode ended. Fix: use "
            f"phalanx.envs.EpisodeStatistics ({self.batched_name} does).",
        )
        if length is None or not self.check_tensor(
            'step() info["episode_length"]', length, (self.n,), torch.int64
        ):
            return
        rows = torch.nonzero(done).flatten()
        got = length.cpu()[rows]

        def report(key: str, wrong: torch.Tensor, expected: str) -> None:
            first = first_true(wrong)
            if first is not None:
                index = int(rows[first[0]])
                self.fail(
                    key,
                    f'step() info["episode_length"] at step {step}, sub-env index {index}: expected '
                    f"{expected.format(counted=int(self.counted[index]))}, got {int(length[index])}. Fix: "
                    "count the steps of each episode and reset the count when an episode ends and on "
                    "reset() (phalanx.envs.EpisodeStatistics).",
                )

        report("episode_length:positive", got < 1, ">= 1 for an ended episode")
        report(
            "episode_length:count",
            got != self.counted[rows],
            "{counted} (steps since that sub-env's previous episode ended)",
        )
        self.lengths.extend(int(v) for v in got)

    def check_autoreset_seen(self, steps: int) -> None:
        """After stepping: an ended row's next observation differed from its final one somewhere (a
        warning where no episode ended)."""
        if self.saw_end and not self.saw_reset_differ:
            self.fail(
                "autoreset",
                'step() autoreset: expected info["final_obs"] to differ from obs in some row where an '
                "episode ended (obs should be the first observation of the next episode), but every ended "
                "row had final_obs == obs. The env probably does not reset ended sub-envs inside step. "
                f"Fix: same-step autoreset ({self.batched_name} does it; see the {self.contract_name} "
                "contract).",
            )
        if not self.saw_end:
            self.warnings.append(
                f"no episode ended in {steps} steps x {self.n} sub-envs: autoreset, final_obs and the "
                f"episode statistics were not verified. Raise the number of steps, or give the env a time "
                "limit (max_episode_steps)."
            )

    # -- seeding -----------------------------------------------------------------------------------
    def replay_twice(self, play: Any) -> list[list[tuple[str, int, Any]]]:
        """Run ``play`` (reset with the seed and step; it returns a trace of (what, step, value)) twice,
        restoring ``state_dict()`` before each run where the env has one: stateful wrappers (running
        normalisation statistics) change between the runs otherwise, and only the seeding is under test."""
        try:
            snapshot = copy.deepcopy(self.env.state_dict())
        except Exception:  # noqa: BLE001 - no usable state_dict: compare without restoring
            snapshot = None
        runs = []
        for _ in range(2):
            if snapshot is not None:
                self.call("load_state_dict(state)", self.env.load_state_dict, copy.deepcopy(snapshot))
            runs.append(play())
        return runs

    def seeding_failure(self, steps: int, what: str, step: int, place: str, first: Any, second: Any) -> None:
        self.fail(
            "determinism",
            f"seeding: reset(seed={self.seed}) twice (state_dict() restored before each) with the same "
            f"{steps} actions gave different {what} at step {step}, {place}: first run "
            f"{format_values(first)}, second run {format_values(second)}; expected identical. Fix: draw all "
            "randomness (initial states, noise) from a generator seeded in reset(seed=...), not from global "
            "RNGs.",
        )
