"""The base class of every phalanx environment, :class:`VecEnv`, and :class:`ConcatVecEnv`.

:class:`VecEnv` is a Gymnasium VectorEnv on torch tensors: its spaces, its device, asynchronous and
compiled stepping (each a plain ``step`` unless a subclass does better) and its checkpoint state. The
contract its ``reset`` and ``step`` follow is in :mod:`phalanx.envs.core`. :class:`ConcatVecEnv` shows
several VecEnvs as one (double buffering). :func:`as_device` parses the device every env is given.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from phalanx.envs.episodes import concat_transitions
from phalanx.errors import ConfigError, EnvError

Tensor = torch.Tensor


def as_device(device: str | torch.device) -> torch.device:
    """Parse a device string with a useful error instead of torch's bare RuntimeError."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(
            f"device {device!r} is not a valid torch device ({error}). Use 'cpu', 'cuda', 'cuda:0', or 'mps'."
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {str(device)!r} was requested but CUDA is not available on this machine "
            f"(torch {torch.__version__}). Use --device cpu, or install a CUDA build of torch."
        )
    return device


class VecEnv(gym.vector.VectorEnv):
    """Base class of every phalanx environment: a Gymnasium VectorEnv on torch tensors.

    Subclasses set the spaces through ``__init__`` and implement :meth:`reset` and :meth:`step`
    following the contract in :mod:`phalanx.envs.core`. Environments that carry state needed for an
    exact resume override :meth:`state_dict` and :meth:`load_state_dict`.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
    traceable: bool = False
    """Whether :meth:`step_with_noise` traces as one ``torch.compile`` graph (batched simulators)."""

    def __init__(
        self,
        num_envs: int,
        single_observation_space: gym.Space,
        single_action_space: gym.Space,
        device: str | torch.device = "cpu",
    ) -> None:
        if not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or num_envs < 1:
            raise ConfigError(f"{type(self).__name__}: num_envs must be an integer >= 1, got {num_envs!r}.")
        self.num_envs = int(num_envs)
        self.device = as_device(device)
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.observation_space = batch_space(single_observation_space, self.num_envs)
        self.action_space = batch_space(single_action_space, self.num_envs)
        self.closed = False

    # -- asynchronous stepping ------------------------------------------------------------------
    def step_async(self, actions: Any) -> None:
        """Start a step with ``actions``; :meth:`step_wait` returns its results.

        Environments that can step while the caller computes (worker processes) override both; for
        the others the step happens inside :meth:`step_wait`. ``step(a)`` equals ``step_async(a)``
        followed by ``step_wait()``.
        """
        self._pending_actions = actions

    def step_wait(self) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The results of the step started by :meth:`step_async`."""
        actions = getattr(self, "_pending_actions", None)
        if actions is None:
            raise EnvError(f"{type(self).__name__}.step_wait: no step in flight; call step_async first.")
        self._pending_actions = None
        return self.step(actions)

    # -- compiled stepping ----------------------------------------------------------------------
    def step_noise(self) -> tuple[Tensor, ...]:
        """The random draws one :meth:`step` uses, drawn now from the env's generators; see
        :meth:`BatchedVecEnv.step_noise`. None here: an env that is not a batched simulator (worker
        processes, Gymnasium, EnvPool) draws its own randomness inside ``step``."""
        return ()

    def step_with_noise(
        self, actions: Tensor, noise: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """:meth:`step` with the draws of :meth:`step_noise`; here (no draws) simply ``step``, which
        ``torch.compile`` cannot trace: only batched simulators and their wrappers step traceably."""
        return self.step(actions)

    def compile(self) -> list[str]:
        """Switch :meth:`step` to a compiled graph where this env can; the names of what was compiled
        (``["env step"]``), or [] (here: nothing, the env steps outside torch)."""
        return []

    def check(self) -> None:
        """Raise what a step recorded on the device instead of raising at once (a :class:`NanGuard`'s
        first non-finite value); one host synchronisation. Call it after steps taken through
        :meth:`step_with_noise` inside a compiled function. Nothing to check here."""

    # -- checkpointable state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact same trajectories (tensors and primitives)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs}, device={self.device})"


class ConcatVecEnv(VecEnv):
    """Several VecEnvs with the same spaces and device as one (the rows of ``parts[0]`` first, ...).

    Used for double buffering: the training worker steps the parts one after another with
    ``step_async`` / ``step_wait``, computing the actions of one part while another steps; seen as a
    whole (``step``, ``reset``, checkpoints) it is one VecEnv. ``reset(seed=s)`` gives the part that
    starts at row ``r`` the seed ``s + r``. Only the contract keys of ``info`` are kept.
    """

    def __init__(self, parts: list[VecEnv]) -> None:
        first = parts[0]
        for part in parts[1:]:
            if (part.single_observation_space, part.single_action_space, part.device) != (
                first.single_observation_space,
                first.single_action_space,
                first.device,
            ):
                raise ConfigError(
                    f"ConcatVecEnv: {part!r} has spaces {part.single_observation_space} / "
                    f"{part.single_action_space} on {part.device}, expected those of {first!r} "
                    f"({first.single_observation_space} / {first.single_action_space} on {first.device})."
                )
        super().__init__(
            sum(part.num_envs for part in parts),
            first.single_observation_space,
            first.single_action_space,
            first.device,
        )
        self.parts = list(parts)
        self.metadata = first.metadata
        self.render_mode = getattr(first, "render_mode", None)

    @property
    def unwrapped(self) -> VecEnv:  # type: ignore[override]
        """The innermost env of the first part (all parts have the same spaces)."""
        return self.parts[0].unwrapped

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        observations, start = [], 0
        for part in self.parts:
            obs, _ = part.reset(seed=None if seed is None else seed + start, options=options)
            observations.append(obs)
            start += part.num_envs
        return torch.cat(observations), {}

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        start = 0
        for part in self.parts:
            part.step_async(actions[start : start + part.num_envs])
            start += part.num_envs
        return concat_transitions([part.step_wait() for part in self.parts])

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            for part in self.parts:
                part.close(**kwargs)
            self.closed = True

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for part, part_state in zip(self.parts, state["parts"], strict=True):
            part.load_state_dict(part_state)

    def __repr__(self) -> str:
        return f"ConcatVecEnv({self.parts!r})"
