"""The NaN guard: a :class:`~phalanx.errors.ContractError` at the first non-finite array of a step.

:class:`NanGuard` checks the actions before the env sees them and the observations, rewards and
``info["final_obs"]`` it returns, and names the array, the sub-env index and the step; integer arrays
(uint8 images) cannot hold a NaN and are not checked. On an accelerator it records on the device and
reads back every ``check_every`` steps, so that it costs no host synchronisation per step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from phalanx.envs.core import Tensor, VecEnv
from phalanx.envs.wrapper_base import VecEnvWrapper, as_device_tensor
from phalanx.errors import ConfigError, ContractError

__all__ = ["NanGuard"]

_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)
_NAN_ARRAYS = ("actions", "obs", "reward", 'info["final_obs"]', "obs")  # code 4: obs from reset()


class NanGuard(VecEnvWrapper):
    """Raise a :class:`ContractError` at the first NaN or inf in actions, obs, reward or final_obs.

    On CPU every step is checked as it happens. On an accelerator a host synchronisation per step
    would stall the pipeline, so the first offence is recorded on the device without synchronising and
    read back every ``check_every`` steps (and by :meth:`check`). The actions are checked before the env
    sees them. :meth:`step_with_noise` (traced into a compiled graph) always records on the device, with
    the offence's step, array, sub-env index and value: whoever steps through it calls :meth:`check`
    afterwards (a compiled ``step`` does so every ``check_every`` steps). An eager step on an accelerator
    records the step and the array only: locating the sub-env and value took ~30 kernel launches per
    array and step, half of an eager PPO step's launches on a GPU; a CPU or compiled run locates them.
    """

    def __init__(self, env: VecEnv, check_every: int = 1) -> None:
        super().__init__(env)
        if not isinstance(check_every, int) or isinstance(check_every, bool) or check_every < 1:
            raise ConfigError(f"NanGuard: check_every must be an integer >= 1, got {check_every!r}.")
        self.check_every = check_every
        self.num_steps = 0
        self._sync_each_step = self.device.type == "cpu"
        # First offence (step, array code, sub-env index, value), kept on the device; step -1: none yet.
        self._record = torch.tensor([-1.0, 0.0, 0.0, 0.0], dtype=torch.float64, device=self.device)
        self._step = torch.zeros((), dtype=torch.float64, device=self.device)
        self._codes = torch.arange(len(_NAN_ARRAYS), dtype=torch.float64, device=self.device)
        self._clean = torch.ones((), dtype=torch.bool, device=self.device)  # nothing recorded yet
        self._unlocated = torch.tensor([-1.0, math.nan], dtype=torch.float64, device=self.device)
        self._flags: list[tuple[Tensor, int]] = []  # eager, on an accelerator: this step's (flag, code)
        self._code_lists: dict[tuple[int, ...], Tensor] = {}

    @staticmethod
    def _locate(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(any_bad, first bad row, first bad value of that row)`` as device scalars."""
        rows = x.reshape(x.shape[0], -1) if x.dim() > 0 else x.reshape(1, 1)
        bad = ~torch.isfinite(rows)  # (N, K)
        # the first bad element in row-major order, as a mask: element-wise ops and sums only (no
        # indexing by a computed index, which would need a host sync or a data-dependent shape)
        first = bad & (bad.cumsum(dim=1) == 1) & (bad.any(dim=1).cumsum(dim=0) == 1).unsqueeze(1)
        row_numbers = torch.arange(rows.shape[0], device=rows.device).unsqueeze(1)
        index = (first * row_numbers).sum()
        value = torch.where(first, rows, torch.zeros_like(rows)).sum()
        return bad.any(), index, value

    def _scan(self, x: Any, code: int) -> None:
        """Check ``x`` (array ``code``): at once on CPU, recorded on the device elsewhere."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return
        if not self._sync_each_step:  # NaN iff x holds a NaN or an inf: two kernels, no host sync
            self._flags.append(((x * 0).sum().isnan(), code))
            return
        # numpy's check of a small CPU array costs a third of torch's (two ops and a sync), on every
        # step of every array
        on_numpy = x.device.type == "cpu" and x.dtype in _NUMPY_FLOATS
        if on_numpy:  # (detach only where needed: an op per array and step)
            finite = np.isfinite((x.detach() if x.requires_grad else x).numpy()).all()
        else:
            finite = torch.isfinite(x).all()
        if bool(finite):
            return
        _, index, value = self._locate(x)
        self._record = torch.tensor([float(self.num_steps), float(code), float(index), float(value)])
        self.check()

    def _record_flags(self) -> None:
        """Record the step and the first array whose flag (:meth:`_scan`) is set, if none was recorded
        yet; the sub-env index and value stay unknown (-1, NaN). A few kernels a step, no host sync."""
        if not self._flags:
            return
        flags, codes = zip(*self._flags, strict=True)
        self._flags = []
        bad = torch.stack(flags)
        if codes not in self._code_lists:  # on the device once per layout (a list index would copy)
            self._code_lists[codes] = self._codes[list(codes)]
        code = self._code_lists[codes][bad.to(torch.uint8).argmax()]  # the first flagged array
        first = bad.any() & self._clean
        candidate = torch.cat([self._step.reshape(1), code.reshape(1), self._unlocated])
        self._record = torch.where(first, candidate, self._record)
        self._clean = self._clean & ~first

    def _record_first(self, x: Any, code: int) -> None:
        """Record the first non-finite value of ``x`` (array ``code``) on the device if none was yet:
        tensor operations only, no host synchronisation."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return
        any_bad, index, value = self._locate(x)
        candidate = torch.stack(
            [self._step, self._codes[code], index.to(torch.float64), value.to(torch.float64)]
        )
        first = any_bad & self._clean
        self._record = torch.where(first, candidate, self._record)
        self._clean = self._clean & ~first

    def check(self) -> None:
        """Raise if a non-finite value was recorded, here or in a guard it wraps (one host
        synchronisation)."""
        step, code, index, value = self._record.tolist()
        if step < 0:
            self.env.check()
            return
        env = self.unwrapped
        code = int(code)
        where = f"sub-env index {int(index)}, step {int(step)} (counted from the NanGuard's creation)"
        got = value
        if index < 0:  # recorded by an eager step on an accelerator (see the class docstring)
            got = "a NaN or an inf"
            where = (
                f"step {int(step)} (counted from the NanGuard's creation; an eager run on {self.device} "
                "does not locate the sub-env: --device cpu or --compile does)"
            )
        if code == 0:
            raise ContractError(
                f"NanGuard: the actions passed to {env!r}.step contain a non-finite value at {where}: "
                f"expected finite actions, got {got}. A NaN action usually means the policy diverged: "
                "lower the learning rate, enable gradient clipping (max_grad_norm), and check the "
                "losses for NaN."
            )
        source = "reset()" if code == 4 else "step()"
        raise ContractError(
            f"NanGuard: {env!r} produced a non-finite {_NAN_ARRAYS[code]} in {source} at {where}: expected "
            f"finite values, got {got}. Check the env's dynamics (divisions, exp/log, velocities without "
            "bounds) and the action bounds (wrap with RescaleAction or clip actions so the env never "
            "sees out-of-range actions)."
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._scan(obs, 4)
        self._record_flags()
        return obs, info

    def _action(self, actions: Tensor) -> Tensor:
        self.num_steps += 1
        self._step += 1
        self._scan(
            actions if isinstance(actions, torch.Tensor) else as_device_tensor(actions, self.device), 0
        )
        return actions

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        self._scan(obs, 1)
        self._scan(reward, 2)
        self._scan(info.get("final_obs"), 3)
        self._record_flags()
        if not self._sync_each_step and self.num_steps % self.check_every == 0:
            self.check()
        return obs, reward, terminated, truncated, info

    def step_with_noise(
        self, actions: Tensor, noise: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The wrapped env's step with every array checked on the device (recorded, raised by
        :meth:`check`): traceable, no host synchronisation."""
        self._step += 1
        self._record_first(actions, 0)
        obs, reward, terminated, truncated, info = self.env.step_with_noise(actions, noise)
        self._record_first(obs, 1)
        self._record_first(reward, 2)
        self._record_first(info.get("final_obs"), 3)
        return obs, reward, terminated, truncated, info

    def _own_state_dict(self) -> dict[str, Any]:
        # the device count: steps taken through step_with_noise count too (one synchronisation)
        return {"num_steps": int(self._step.item())}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        self.num_steps = int(state["num_steps"])
        self._step.fill_(self.num_steps)
