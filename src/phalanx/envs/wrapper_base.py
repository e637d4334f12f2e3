"""The base class of VecEnv wrappers, and how to find a wrapper in a chain.

:class:`VecEnvWrapper` forwards everything explicitly (no ``__getattr__``), splits a step into two hooks
(the actions on their way in, the results on their way out) so that ``step_async`` / ``step_wait`` and a
compiled step pass through every wrapper, and keeps the wrapped env's state in ``state_dict()["env"]``.
The wrappers themselves: :mod:`phalanx.envs.action_map`, :mod:`phalanx.envs.normalization`,
:mod:`phalanx.envs.nan_guard`, :mod:`phalanx.envs.observation_wrappers`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import torch

from phalanx.compiling import compiled
from phalanx.envs.core import ConcatVecEnv, Tensor, VecEnv
from phalanx.errors import ConfigError

__all__ = ["VecEnvWrapper", "as_device_tensor", "find_wrapper"]

W = TypeVar("W", bound="VecEnvWrapper")


class VecEnvWrapper(VecEnv):
    """Base class of VecEnv wrappers: forwards ``reset``/``step``, spaces, ``num_envs``, ``device``.

    A subclass that changes a space assigns ``single_observation_space`` / ``single_action_space``
    (and the batched space) after ``super().__init__(env)``. A step is split in two hooks, so that
    :meth:`step_async` / :meth:`step_wait` pass through every wrapper: :meth:`_action` maps the actions
    on their way in, :meth:`_transition` maps the results on their way out. Wrapper state goes in
    :meth:`_own_state_dict` / :meth:`_load_own_state_dict`; :meth:`state_dict` nests the wrapped env's
    state under ``"env"``.
    """

    _check_every: int  # set by compile(): the NanGuard's steps between checks, and the steps since one
    _unchecked_steps: int

    def __init__(self, env: VecEnv) -> None:
        if not isinstance(env, VecEnv):
            raise ConfigError(
                f"{type(self).__name__} wraps a phalanx VecEnv, got {type(env).__name__} ({env!r}). "
                "Build the env with phalanx.envs.make_env(...) or subclass phalanx.envs.VecEnv."
            )
        self.env = env
        self.num_envs = env.num_envs
        self.device = env.device
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.metadata = env.metadata
        self.render_mode = getattr(env, "render_mode", None)
        self.closed = False
        self._compiled_step: Any = None
        """``compiled(step_with_noise)`` after :meth:`compile`; None: the eager step."""

    # -- forwarding --------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if self._compiled_step is not None:
            result = self._compiled_step(actions, self.step_noise())
            self._unchecked_steps += 1
            if self._unchecked_steps >= self._check_every:
                self._unchecked_steps = 0
                self.check()
            return result
        # step_async + step_wait, without their plumbing (a tenth of a 4-env step)
        return self._transition(*self.env.step(self._action(actions)))

    # -- compiled stepping ---------------------------------------------------------------------------
    def step_noise(self) -> tuple[Tensor, ...]:
        """The wrapped env's draws (a wrapper draws nothing); none if this wrapper writes ``step``."""
        return () if self._overrides_step() else self.env.step_noise()

    def step_with_noise(
        self, actions: Tensor, noise: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The wrapped env's :meth:`step_with_noise` between this wrapper's hooks: the whole wrapped step,
        traceable as one graph when the wrapped env's is (see :attr:`traceable`)."""
        if self._overrides_step():
            return self.step(actions)
        return self._transition(*self.env.step_with_noise(self._action(actions), noise))

    @property
    # ignored below: a property here where VecEnv has a class attribute
    def traceable(self) -> bool:  # type: ignore[override]
        """Whether :meth:`step_with_noise` traces as one graph: the wrapped env's does, and this wrapper
        works through the hooks (a wrapper that writes ``step`` itself is stepped eagerly)."""
        return not self._overrides_step() and self.env.traceable

    def compile(self) -> list[str]:
        """Switch :meth:`step` to one compiled graph of the whole wrapped step (fed by the eager
        :meth:`step_noise`), where :attr:`traceable`; idempotent. A :class:`NanGuard` in the chain records
        the first non-finite value on the device inside the graph; :meth:`step` raises it through
        :meth:`check` every ``check_every`` steps of that guard (every step by default)."""
        if not self.traceable:
            return []
        if self._compiled_step is None:
            from phalanx.envs.nan_guard import NanGuard  # a wrapper itself: imported where it is used

            guard = find_wrapper(self, NanGuard)
            self._check_every = guard.check_every if guard is not None else 1
            self._unchecked_steps = 0
            self._compiled_step = compiled(self.step_with_noise)
        return ["env step"]

    def check(self) -> None:
        self.env.check()

    def step_async(self, actions: Tensor) -> None:
        if self._overrides_step():
            VecEnv.step_async(self, actions)
        else:
            self.env.step_async(self._action(actions))

    def step_wait(self) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if self._overrides_step():
            return VecEnv.step_wait(self)
        return self._transition(*self.env.step_wait())

    def _overrides_step(self) -> bool:
        """True for a subclass that writes ``step`` itself instead of the hooks: it is then stepped
        through its own ``step`` (inside ``step_wait``), so that nothing it does is bypassed."""
        return type(self).step is not VecEnvWrapper.step

    def _action(self, actions: Tensor) -> Tensor:
        """The actions the wrapped env receives (identity here)."""
        return actions

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The step's results as the caller sees them (unchanged here)."""
        return obs, reward, terminated, truncated, info

    def render(self) -> Any:
        return self.env.render()

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.env.close(**kwargs)
            self.closed = True

    @property
    # ignored below: the innermost VecEnv, where gymnasium's VectorEnv types unwrapped as itself
    def unwrapped(self) -> VecEnv:  # type: ignore[override]
        """The innermost env of the wrapper chain."""
        return self.env.unwrapped

    @property
    def state(self) -> Tensor:
        """The wrapped env's physical state (built-in simulators only)."""
        try:
            # ignored below: the built-in simulators have a state; the AttributeError below says so
            return self.env.state  # type: ignore[attr-defined]
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__}: the wrapped env {self.unwrapped!r} has no `state` attribute "
                "(only the built-in batched simulators expose their physical state)."
            ) from None

    # -- checkpointable state ----------------------------------------------------------------------
    def _own_state_dict(self) -> dict[str, Any]:
        return {}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"env": self.env.state_dict(), **self._own_state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state["env"])
        self._load_own_state_dict({key: value for key, value in state.items() if key != "env"})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"


def find_wrapper(env: VecEnv, cls: type[W]) -> W | None:
    """The outermost wrapper of type ``cls`` in ``env``'s wrapper chain, or None.

    For a :class:`~phalanx.envs.core.ConcatVecEnv`, the chain of its first part (the parts of a
    double-buffered env are wrapped alike and share their statistics).
    """
    if isinstance(env, ConcatVecEnv):
        env = env.parts[0]
    while isinstance(env, VecEnvWrapper):
        if isinstance(env, cls):
            return env
        env = env.env
    return None


def as_device_tensor(actions: Any, device: torch.device) -> Tensor:
    """``actions`` (a tensor, an array or a list) as a tensor on ``device`` (a tensor there: itself)."""
    if isinstance(actions, torch.Tensor):
        return actions if actions.device == device else actions.to(device)
    return torch.as_tensor(np.asarray(actions), device=device)
