"""The VecEnv contract: batched environments whose arrays are torch tensors on one device.

Every environment the learner sees is a :class:`VecEnv`. The contract (docs/architecture.md has it too):

- ``reset(seed=None, options=None) -> (obs, info)`` with ``obs`` of shape ``(num_envs, *obs_shape)``,
  float32 (uint8 for a uint8 observation space: images), on ``device``.
- ``step(actions) -> (obs, reward, terminated, truncated, info)``; ``reward`` float32 ``(num_envs,)``,
  ``terminated``/``truncated`` bool ``(num_envs,)``, all on ``device``.
- Same-step autoreset: a sub-env whose episode ends is reset inside ``step``. Its ``obs`` row is the
  first observation of the next episode; ``info["final_obs"]`` is the *true next observation of every
  row*: the last observation of the finished episode where ``terminated | truncated``, and equal to
  ``obs`` elsewhere. ``info["_final_obs"]`` is the boolean mask of rows that ended.
- ``info["episode_return"]`` and ``info["episode_length"]`` are ``(num_envs,)`` tensors, valid where
  an episode ended (the same mask), or where ``info["_episode_return"]`` says if the env sets it: an
  env whose learning episodes are parts of a longer one (Atari with episodic life: ``terminated`` at
  every life lost) reports the statistics of the whole (the game score) where that ends
  (:func:`episode_ends`).

:class:`BatchedVecEnv` implements all of the bookkeeping (autoreset, time limit, episode statistics,
seeding, checkpointable state) so that a simulator only writes its physics in three methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from phalanx.compiling import compiled
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


def tensor_space(space: gym.Space, role: str) -> gym.Space | None:
    """The space a phalanx adapter presents for a simulator's ``space`` (``role``: observation or action).

    Observations: a uint8 Box stays a uint8 Box (images: one byte a pixel on the device and in buffers;
    the networks scale them); any other Box becomes a float32 Box with the same bounds; a ``Discrete(n)``
    becomes the float32 one-hot ``Box(0, 1, (n,))`` (an index fed as a number would order the states
    meaninglessly); a ``Dict`` of Box, Discrete and MultiBinary parts is presented as that Dict space,
    while its observation tensors are the float32 vectors of ``gymnasium.spaces.flatten`` (the parts by
    sorted key, Discrete parts one-hot; see :func:`flat_observation`). Actions: a Discrete space stays
    Discrete, a Box becomes float32, a one-dimensional ``MultiDiscrete`` stays one (int64 actions
    ``(N, k)``); integer spaces keep their ``start`` (the agent's actions are shifted into them by
    :class:`~phalanx.envs.wrappers.RescaleAction`). Anything else is unsupported: None, for the adapter
    to explain (:func:`unsupported_space`).
    """
    if isinstance(space, gym.spaces.Box):
        if role == "observation" and space.dtype == np.uint8:
            return gym.spaces.Box(space.low, space.high, shape=space.shape, dtype=np.uint8)
        return gym.spaces.Box(
            space.low.astype(np.float32), space.high.astype(np.float32), shape=space.shape, dtype=np.float32
        )
    if isinstance(space, gym.spaces.Discrete):
        if role == "observation":
            return gym.spaces.Box(0.0, 1.0, shape=(int(space.n),), dtype=np.float32)
        return gym.spaces.Discrete(int(space.n), start=int(space.start))
    if isinstance(space, gym.spaces.Dict) and role == "observation":
        if all(isinstance(part, DICT_PARTS) for part in space.spaces.values()):
            return space
        return None
    if isinstance(space, gym.spaces.MultiDiscrete) and role == "action" and len(space.nvec.shape) == 1:
        return gym.spaces.MultiDiscrete(space.nvec.astype(np.int64), start=np.asarray(space.start, np.int64))
    return None


DICT_PARTS = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary)
"""The parts a Dict observation space may have (what the networks' Dict encoder reads)."""

SUPPORTED_SPACES = {
    "observation": "Box (uint8 stays uint8, others become float32), Discrete (one-hot) and Dict (of Box, "
    "Discrete and MultiBinary parts, flattened)",
    "action": "Discrete, Box and one-dimensional MultiDiscrete",
}
"""The spaces :func:`tensor_space` supports, per role, for error messages."""


def unsupported_space(space: gym.Space, role: str, simulator: str, fix: str) -> EnvError:
    """The error for a ``role`` space of ``simulator`` that :func:`tensor_space` does not support: the
    space, its offending Dict part if that is what is wrong, what is supported, and ``fix``."""
    problem = f"{simulator} has {role} space {space}"
    if isinstance(space, gym.spaces.Dict) and role == "observation":
        parts = [
            f"{key!r} ({part})" for key, part in space.spaces.items() if not isinstance(part, DICT_PARTS)
        ]
        plural = "s" if len(parts) > 1 else ""
        problem += f", whose part{plural} {', '.join(parts)} cannot be flattened for the networks"
    return EnvError(f"{problem}; phalanx supports {role} spaces {SUPPORTED_SPACES[role]}. {fix}")


def supported_tensor_space(space: gym.Space, role: str, simulator: str, fix: str) -> gym.Space:
    """:func:`tensor_space`, or an :class:`EnvError` saying that ``simulator`` has an unsupported ``role``
    space (``fix``: what the user can do instead)."""
    converted = tensor_space(space, role)
    if converted is None:
        raise unsupported_space(space, role, simulator, fix)
    return converted


def observation_dtype(space: gym.Space) -> np.dtype:
    """The numpy dtype of the observation arrays of a :func:`tensor_space` observation space: uint8 for
    a uint8 Box, float32 otherwise (Dict observations are flat float32 vectors)."""
    if isinstance(space, gym.spaces.Box) and space.dtype == np.uint8:
        return np.dtype(np.uint8)
    return np.dtype(np.float32)


def observation_shape(space: gym.Space) -> tuple[int, ...]:
    """The shape of one observation tensor of a :func:`tensor_space` observation space (a Dict's:
    ``(flatdim,)``)."""
    if isinstance(space, gym.spaces.Dict):
        return (int(gym.spaces.flatdim(space)),)
    return tuple(space.shape)


def flat_observation(space: gym.spaces.Dict, observation: Any) -> np.ndarray:
    """One Dict observation as the float32 vector the VecEnv contract hands out (``gymnasium.spaces.
    flatten``: parts by sorted key, Discrete parts one-hot, each part flattened)."""
    return np.asarray(gym.spaces.flatten(space, observation), dtype=np.float32)


def episode_ends(info: dict[str, Any]) -> Tensor:
    """The rows of a step whose ``info["episode_return"]`` / ``info["episode_length"]`` are valid:
    ``info["_episode_return"]`` where the env sets it (Atari with episodic life: the game, not the life,
    ended), else ``info["_final_obs"]`` (every ended episode)."""
    return info.get("_episode_return", info["_final_obs"])


class VecEnv(gym.vector.VectorEnv):
    """Base class of every phalanx environment: a Gymnasium VectorEnv on torch tensors.

    Subclasses set the spaces through ``__init__`` and implement :meth:`reset` and :meth:`step`
    following the contract in the module docstring. Environments that carry state needed for an
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


class EpisodeStatistics:
    """Running return and length of every sub-env; reports the finished ones each step.

    Shared by every VecEnv implementation so that the statistics mean the same thing everywhere:
    the undiscounted sum of the env's own rewards (before any reward scaling wrapper).
    """

    def __init__(self, num_envs: int, device: torch.device, per_row: tuple[int, ...] = ()) -> None:
        """``per_row``: the shape of one sub-env's reward, e.g. ``(num_agents,)`` for multi-agent envs."""
        self.returns = torch.zeros((num_envs, *per_row), dtype=torch.float32, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)

    def step(self, reward: Tensor, done: Tensor) -> tuple[Tensor, Tensor]:
        """Add one step; return ``(episode_return, episode_length)`` valid where ``done``."""
        finished_return = self.returns + reward
        finished_length = self.lengths + 1
        self.returns = finished_return.masked_fill(done.view(-1, *[1] * (reward.dim() - 1)), 0.0)
        self.lengths = finished_length.masked_fill(done, 0)
        return finished_return, finished_length

    def reset(self) -> None:
        self.returns.zero_()
        self.lengths.zero_()

    def state_dict(self) -> dict[str, Tensor]:
        return {"returns": self.returns.clone(), "lengths": self.lengths.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.returns.copy_(state["returns"])
        self.lengths.copy_(state["lengths"])


def action_layout(
    space: gym.Space, num_envs: int, integer_dtype: torch.dtype
) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of a batch of ``num_envs`` actions of ``space``: ``(num_envs,)`` of
    ``integer_dtype`` for a Discrete space, ``(num_envs, k)`` of ``integer_dtype`` for a
    ``MultiDiscrete`` of k columns, ``(num_envs, *space.shape)`` float32 otherwise."""
    if isinstance(space, gym.spaces.Discrete):
        return (num_envs,), integer_dtype
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (num_envs, *space.shape), integer_dtype
    return (num_envs, *space.shape), torch.float32


def step_info(
    final_obs: Any,
    done: Tensor,
    episode_return: Any,
    episode_length: Tensor,
    statistics_rows: Tensor | None = None,
) -> dict[str, Any]:
    """The ``info`` a step returns under the contract: the true next observation of every row, the mask
    ``terminated | truncated`` of the rows it is the last one of, and the episode statistics (valid
    where ``done``, or where ``statistics_rows`` says when given: ``info["_episode_return"]``)."""
    info = {
        "final_obs": final_obs,
        "_final_obs": done,
        "episode_return": episode_return,
        "episode_length": episode_length,
    }
    if statistics_rows is not None:
        info["_episode_return"] = statistics_rows
    return info


class StatisticsCheckpoint:
    """``state_dict`` / ``load_state_dict`` of an env whose simulator cannot be checkpointed (Gymnasium,
    EnvPool): the episode statistics only; a resumed run resets the simulator."""

    episode_statistics: EpisodeStatistics

    def state_dict(self) -> dict[str, Any]:
        """Episode statistics only: the simulator cannot be checkpointed (a resume re-resets it)."""
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])


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


def concat_transitions(
    parts: list[tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]],
) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
    """The step results of several VecEnvs as one: every array concatenated along the row dimension."""
    obs, reward, terminated, truncated = (torch.cat([part[i] for part in parts]) for i in range(4))
    info = {key: torch.cat([part[4][key] for part in parts]) for key in _CONTRACT_INFO}
    if any("_episode_return" in part[4] for part in parts):
        info["_episode_return"] = torch.cat([episode_ends(part[4]) for part in parts])
    return obs, reward, terminated, truncated, info


_CONTRACT_INFO = ("final_obs", "_final_obs", "episode_return", "episode_length")


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
