"""Batched simulators: the base class that leaves a subclass only its physics.

:class:`BatchedVecEnv` implements the bookkeeping of the VecEnv contract (:mod:`phalanx.envs.core`) for
a simulator written as batched tensor operations: same-step autoreset, the time limit, episode
statistics, seeding (one generator, or one per block of rows: :func:`block_seeds`), checkpoints, and a
step free of generators that ``torch.compile`` traces as one graph. :class:`BatchedBookkeeping` is the
part shared with the multi-agent simulators (``phalanx.marl.core.BatchedMultiAgentEnv``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import gymnasium as gym
import numpy as np
import torch

from phalanx.compiling import compiled
from phalanx.envs.base import Tensor, VecEnv
from phalanx.envs.episodes import EpisodeStatistics, step_info
from phalanx.envs.spaces import action_layout
from phalanx.errors import ConfigError, EnvError

PerRow = TypeVar("PerRow")
"""What a batched simulator's observations, actions and rewards are: one tensor (single-agent) or one
tensor per agent group (multi-agent)."""


class BatchedBookkeeping(Generic[PerRow]):
    """What the base class of a batched simulator keeps besides the physics, single- or multi-agent
    (:class:`BatchedVecEnv`, ``phalanx.marl.core.BatchedMultiAgentEnv``): the time limit, the seeded
    generator, the step counters and episode statistics, and the checkpoint of ``state_names``; and
    the three methods of the physics that a subclass writes."""

    state_names: tuple[str, ...] = ()
    num_envs: int
    device: torch.device
    step_with_noise: Callable[..., Any]  # the simulator's step as a function of its draws (subclasses')

    # -- to implement ----------------------------------------------------------------------------
    def _reset_rows(self, mask: Tensor) -> None:
        """Initial states where ``mask``, drawn with :meth:`uniform`; the draws (sizes, order) must not
        depend on ``mask`` or on the state: :meth:`step_noise` makes them before the step."""
        raise NotImplementedError

    def _advance(self, actions: PerRow) -> tuple[PerRow, Tensor]:
        raise NotImplementedError

    def _observe(self) -> PerRow:
        raise NotImplementedError

    def _start_bookkeeping(self, max_episode_steps: int | None, per_row: tuple[int, ...] = ()) -> None:
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ConfigError(
                f"{type(self).__name__}: max_episode_steps must be >= 1 or None, got {max_episode_steps}."
            )
        self.max_episode_steps = max_episode_steps
        self.generator = torch.Generator(device=self.device)
        self.generator.seed()
        self.elapsed_steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device, per_row)
        self._all_rows = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._given_draws: list[Tensor] | None = None
        """Inside :meth:`step_with_noise`: the draws :meth:`uniform` hands out, in order."""
        self._probed_sizes: list[tuple[int, ...]] | None = None
        """While :meth:`_draw_sizes` probes ``_reset_rows``: the sizes :meth:`uniform` was asked for."""
        self._reset_sizes: tuple[tuple[int, ...], ...] | None = None
        self._compiled_step: Any = None
        """``compiled(step_with_noise)`` after :meth:`compile`; None: the eager step."""

    # -- random draws ----------------------------------------------------------------------------
    def uniform(self, low: float, high: float, size: tuple[int, ...]) -> Tensor:
        """Uniform samples in ``[low, high)`` from this env's seeded generator: ``low + (high - low) * u``
        with ``u`` drawn as ``torch.rand(size)`` draws it. Inside :meth:`step_with_noise`, ``u`` is the
        next of the draws that :meth:`step_noise` made (the same numbers, drawn before the step)."""
        if self._given_draws is not None:
            if not self._given_draws:
                raise EnvError(
                    f"{type(self).__name__}.uniform: _reset_rows asks for more draws inside a step than "
                    f"step_noise made ({len(self._draw_sizes())}, of sizes {self._draw_sizes()}). Its draws "
                    "must not depend on the mask or the state: draw for every row, then torch.where."
                )
            sample = self._given_draws.pop(0)
            if tuple(sample.shape) != tuple(size):
                raise EnvError(
                    f"{type(self).__name__}.uniform: _reset_rows asks for size {tuple(size)} inside a step, "
                    f"but the draw step_noise made for it has shape {tuple(sample.shape)}. Its draws must "
                    "not depend on the mask or the state: draw for every row, then torch.where."
                )
        elif self._probed_sizes is not None:
            self._probed_sizes.append(tuple(size))
            sample = torch.zeros(size, device=self.device)
        else:
            sample = self._draw(tuple(size))
        return low + (high - low) * sample

    def _draw(self, size: tuple[int, ...]) -> Tensor:
        """``torch.rand(size)`` from the env's generator."""
        return torch.rand(size, generator=self.generator, device=self.device)

    def _draw_sizes(self) -> tuple[tuple[int, ...], ...]:
        """The sizes of the draws ``_reset_rows`` makes, found once by running it on no rows (which
        leaves the state as it is) with :meth:`uniform` recording instead of drawing."""
        if self._reset_sizes is None:
            self._probed_sizes = []
            try:
                self._reset_rows(~self._all_rows)
                self._reset_sizes = tuple(self._probed_sizes)
            finally:
                self._probed_sizes = None
        return self._reset_sizes

    def step_noise(self) -> tuple[Tensor, ...]:
        """The random draws one step's autoreset uses, drawn now, in the order and sizes the eager step
        draws them: ``torch.rand`` samples, one per :meth:`uniform` call of ``_reset_rows``. A step
        draws them whether or not a row ends, so the random stream does not depend on the episodes."""
        return tuple(self._draw(size) for size in self._draw_sizes())

    def compile(self) -> list[str]:
        """Switch ``step`` to ``compiled(step_with_noise)``, fed by the eager :meth:`step_noise` (single- and
        multi-agent simulators alike); idempotent. The compiled step differs from the eager one by float
        rounding only."""
        if self._compiled_step is None:
            self._compiled_step = compiled(self.step_with_noise)
        return ["env step"]

    def _reset_with(self, mask: Tensor, noise: tuple[Tensor, ...]) -> None:
        """``_reset_rows(mask)`` with :meth:`uniform` handing out ``noise`` instead of drawing."""
        self._given_draws = list(noise)
        self._reset_rows(mask)
        left = len(self._given_draws)
        self._given_draws = None
        if left:
            raise EnvError(
                f"{type(self).__name__}.step_with_noise: {left} of the {len(noise)} draws given were not "
                "used by _reset_rows. Pass the draws of this env's step_noise(), unchanged."
            )

    def _restart_counters(self) -> None:
        """Every row starts an episode (``reset``)."""
        self.elapsed_steps.zero_()
        self.episode_statistics.reset()

    def _time_limit(self, terminated: Tensor) -> Tensor:
        """Count one step of every row; ``truncated``: the rows whose step count reached the limit."""
        self.elapsed_steps += 1
        if self.max_episode_steps is None:
            return torch.zeros_like(terminated)
        return self.elapsed_steps >= self.max_episode_steps

    def _bookkeeping_state(self) -> dict[str, Any]:
        state = {name: getattr(self, name).clone() for name in self.state_names}
        state["elapsed_steps"] = self.elapsed_steps.clone()
        state["episode_statistics"] = self.episode_statistics.state_dict()
        state["generator"] = self.generator.get_state()
        return state

    def _load_bookkeeping_state(self, state: dict[str, Any]) -> None:
        for name in self.state_names:
            getattr(self, name).copy_(state[name])
        self.elapsed_steps.copy_(state["elapsed_steps"])
        self.episode_statistics.load_state_dict(state["episode_statistics"])
        self.generator.set_state(state["generator"].cpu())  # a CPU byte tensor, even for a CUDA generator


class BatchedVecEnv(BatchedBookkeeping[Tensor], VecEnv):
    """A simulator written as batched tensor operations; subclasses write only the physics.

    Implement three methods, each acting on all ``num_envs`` rows at once:

    - ``_reset_rows(mask)``: draw initial states (with :meth:`uniform`, from the env's seeded
      generator) for the rows where the boolean ``mask`` is true and leave the others untouched. Draw
      for every row and use ``torch.where`` rather than boolean indexing, so that the step needs no host
      synchronisation on a GPU, and so that the draws (their sizes and order) never depend on the mask
      or the state: :meth:`step_noise` makes them before the step, and inside the step :meth:`uniform`
      hands them out instead of drawing, which keeps the step free of generators (traceable).
    - ``_advance(actions) -> (reward, terminated)``: advance the physics of every row by one step.
    - ``_observe() -> obs``: the ``(num_envs, *obs_shape)`` float32 observation of the current state.

    Seeding: ``reset(seed=s)`` seeds the one generator of all rows. ``reset(seed=[s0, s1, ...])`` with B
    seeds (B dividing ``num_envs``) gives each block of ``num_envs / B`` consecutive rows its own
    generator: block b then draws exactly what a separate env of ``num_envs / B`` sub-envs reset with
    ``seed=sb`` draws (a vectorized population's members, one block each; B = ``num_envs`` is one
    generator per sub-env, as Gymnasium's list of seeds). Per-block draws go through :meth:`uniform`.

    The base class handles seeding, the time limit (``max_episode_steps``, as Gymnasium's TimeLimit:
    ``truncated`` when the step count reaches it, independent of ``terminated``), same-step autoreset
    with ``info["final_obs"]``, episode statistics and checkpointing of the attributes named in
    ``state_names`` (``"state"`` by default).

    Compiled stepping: ``step(a)`` is ``step_with_noise(a, step_noise())``: the draws are taken eagerly,
    and :meth:`step_with_noise` is the whole step (physics, time limit, autoreset, statistics) as tensor
    operations without a generator or a host synchronisation, which ``torch.compile`` traces as one
    graph. :meth:`compile` switches ``step`` to that graph; a caller may also trace
    ``step_with_noise`` inside a larger compiled function (acting and stepping fused).
    """

    state_names: tuple[str, ...] = ("state",)
    traceable = True

    def __init__(
        self,
        num_envs: int,
        single_observation_space: gym.Space,
        single_action_space: gym.Space,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = None,
    ) -> None:
        super().__init__(num_envs, single_observation_space, single_action_space, device)
        self._start_bookkeeping(max_episode_steps)
        self.block_generators: list[torch.Generator] | None = None
        """One generator per block of rows after ``reset(seed=[...])``; None: ``generator`` for all."""
        self._action_shape, self._action_dtype = action_layout(
            single_action_space, self.num_envs, torch.int64
        )

    # -- the contract ----------------------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        if isinstance(seed, Sequence):
            self._seed_blocks(seed)
        elif seed is not None:
            self.generator.manual_seed(int(seed))
            self.block_generators = None
        self._reset_rows(self._all_rows)
        self._restart_counters()
        return self._observe(), {}

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        if self._compiled_step is not None:
            return self._compiled_step(self._as_actions(actions), self.step_noise())
        return self.step_with_noise(actions, self.step_noise())

    def step_with_noise(
        self, actions: Tensor, noise: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """The whole step with the autoreset's draws given (``noise``: what :meth:`step_noise` returned):
        traceable by ``torch.compile`` as one graph, and equal to :meth:`step` bit for bit eagerly."""
        actions = self._as_actions(actions)
        reward, terminated = self._advance(actions)
        truncated = self._time_limit(terminated)
        done = terminated | truncated
        final_obs = self._observe()  # (N, *obs_shape), the true next observation of every row
        episode_return, episode_length = self.episode_statistics.step(reward, done)
        self._reset_with(done, noise)
        self.elapsed_steps.masked_fill_(done, 0)
        obs = torch.where(done.view(-1, *([1] * (final_obs.dim() - 1))), self._observe(), final_obs)
        return obs, reward, terminated, truncated, step_info(final_obs, done, episode_return, episode_length)

    def _seed_blocks(self, seeds: Sequence[int]) -> None:
        """One generator per block of ``num_envs / len(seeds)`` rows, block b seeded ``seeds[b]``."""
        if len(seeds) == 0 or self.num_envs % len(seeds) != 0:
            raise EnvError(
                f"{type(self).__name__}.reset: {len(seeds)} seeds for {self.num_envs} sub-envs; a list of "
                "seeds gives each block of equally many rows its own generator, so its length must divide "
                f"num_envs. Pass an int, or a list whose length divides {self.num_envs}."
            )
        if len(seeds) == 1:
            self.generator.manual_seed(int(seeds[0]))
            self.block_generators = None
            return
        self.block_generators = [torch.Generator(device=self.device) for _ in seeds]
        for generator, seed in zip(self.block_generators, seeds, strict=True):
            generator.manual_seed(int(seed))

    def _as_actions(self, actions: Any) -> Tensor:
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(np.asarray(actions), device=self.device)
        if actions.device != self.device or actions.dtype != self._action_dtype:
            # float64 numpy actions must not silently turn the physics into float64
            actions = actions.to(self.device, self._action_dtype)
        if tuple(actions.shape) != self._action_shape:
            raise EnvError(
                f"{type(self).__name__}.step: actions have shape {tuple(actions.shape)}, expected "
                f"{self._action_shape} (num_envs={self.num_envs}, action space "
                f"{self.single_action_space}). Pass one action per sub-env."
            )
        return actions

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = self._bookkeeping_state()
        if self.block_generators is not None:
            state["block_generators"] = [generator.get_state() for generator in self.block_generators]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_bookkeeping_state(state)
        self.block_generators = None
        if state.get("block_generators") is not None:
            self.block_generators = []
            for generator_state in state["block_generators"]:
                generator = torch.Generator(device=self.device)
                generator.set_state(generator_state.cpu())
                self.block_generators.append(generator)

    def _draw(self, size: tuple[int, ...]) -> Tensor:
        """``torch.rand(size)`` from the env's generator; after ``reset(seed=[...])`` the rows of each
        block come from that block's generator, so ``size`` must have one row per sub-env:
        ``(num_envs, ...)``."""
        if self.block_generators is None:
            return torch.rand(size, generator=self.generator, device=self.device)
        if len(size) == 0 or size[0] != self.num_envs:
            raise EnvError(
                f"{type(self).__name__}.uniform: size {tuple(size)} after reset(seed=[...]): with a "
                f"generator per block of rows, every draw needs one row per sub-env, (num_envs="
                f"{self.num_envs}, ...). Draw per-row quantities, or reset with an int seed."
            )
        sample = torch.empty(size, device=self.device)
        rows = self.num_envs // len(self.block_generators)
        for block, generator in zip(sample.split(rows), self.block_generators, strict=True):
            block.uniform_(generator=generator)  # (rows, ...): torch.rand's draws, in place
        return sample


def block_seeds(env: VecEnv, seeds: Sequence[int], rows_per_block: int) -> int | list[int]:
    """``reset(seed=...)`` of ``env`` that gives each block b of ``rows_per_block`` consecutive rows what an
    env of ``rows_per_block`` sub-envs reset with ``seeds[b]`` gets: one seed per block for a batched
    simulator (a generator per block), one per sub-env otherwise (sub-env j of an env seeded s gets
    s + j, as Gymnasium's vector envs), and a plain int for a single block (every VecEnv takes one)."""
    if len(seeds) == 1:
        return int(seeds[0])
    if isinstance(env.unwrapped, BatchedVecEnv):
        return [int(seed) for seed in seeds]
    return [int(seed) + row for seed in seeds for row in range(rows_per_block)]
