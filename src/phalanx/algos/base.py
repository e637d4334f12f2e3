"""The Algorithm interface shared by every learning rule.

An algorithm knows observation and action *spaces*, never environments (docs/architecture.md, "Layers").
It owns its networks and optimisers and exposes:

- ``act(obs, deterministic)``: actions in the normalised action space ([-1, 1] for Box), for
  evaluation and deployment; ``acting_module(stochastic)``: the same as an :class:`ActingModule`, a
  module of tensors alone, for export (TorchScript, ONNX);
- ``explore``: actions for collection, one signature per kind (:class:`OnPolicy`, :class:`OffPolicy`);
  an off-policy algorithm explores with an :class:`ExplorationPolicy`, a module the pipeline's worker
  thread copies and refreshes by its tensors;
- ``update(batch, progress) -> metrics``: one learning step on collected data; ``progress`` in [0, 1]
  is the fraction of the training budget spent (for schedules); metrics are scalar tensors, read on
  the host only when they are logged;
- ``compile()``: switch to compiled hot paths, returning their names ([]: none);
- ``state_dict()`` / ``load_state_dict()``: built here from the networks and optimisers the algorithm
  holds (:meth:`Algorithm.state_entries`) and its :attr:`Algorithm.extra_state`; tensors and primitives
  only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import gymnasium as gym
import torch
from torch import nn

from phalanx.config import AlgoConfig, TrainConfig, check
from phalanx.errors import ConfigError
from phalanx.nets import ActionNoise, observation_kind
from phalanx.optim import clip_grad_norm, gradients
from phalanx.registry import algorithms_reading

if TYPE_CHECKING:
    from phalanx.buffers import RolloutBuffer, StepLayout


class GradientGroup(Protocol):
    """What an algorithm needs of a data-parallel group of learners (``phalanx.train.learner``)."""

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its mean over the learners (identical on every learner)."""


class OnPolicy(Protocol):
    """An on-policy algorithm as the worker and the trainer use it (PPO, A2C)."""

    device: torch.device

    def explore(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sampled actions of a (N, obs_dim) batch with their log-probabilities and values, each (N, ...)."""

    def rollout_buffer(
        self, horizon: int, num_envs: int, layout: StepLayout, device: torch.device
    ) -> RolloutBuffer:
        """The buffer a rollout of ``horizon`` steps of ``num_envs`` sub-envs is collected into."""

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor: ...

    def update(self, rollout: Any, progress: float) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class OffPolicy(Protocol):
    """An off-policy algorithm as the worker, the pipeline and the trainer use it (DQN, DDPG, TD3, SAC)."""

    device: torch.device

    def explore(self, obs: torch.Tensor, steps: int) -> torch.Tensor:
        """Collection actions of a (N, obs_dim) batch; ``steps``: env steps so far (for schedules)."""

    def exploration_policy(self) -> ExplorationPolicy:
        """The module :meth:`explore` acts with (the pipeline's worker thread acts with a copy)."""

    def random_actions(self, num_envs: int) -> torch.Tensor: ...

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor: ...

    def update(self, batch: Any, progress: float) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ExplorationPolicy(nn.Module):
    """Collection actions as a module: ``forward(obs, steps) -> actions`` in the normalised action space.

    It holds (shares) the algorithm's acting networks, so that a deep copy acts with its own copies of
    them, brought up to date by copying :meth:`tensors` (the pipeline's worker thread). Its schedules
    (DQN's epsilon) are plain values set by :meth:`advance_to`.
    """

    def advance_to(self, steps: int) -> None:
        """Move the exploration schedules to ``steps`` env steps. ``forward`` does; the pipeline calls it
        on the learner's policy for each step a copy acted on, so the learner logs the value it acted with."""

    def tensors(self) -> list[torch.Tensor]:
        """Parameters and buffers, in a fixed order (those of a deep copy match them one to one)."""
        return [tensor.data for tensor in self.parameters()] + list(self.buffers())


class ActingModule(nn.Module):
    """What an algorithm's ``act`` computes, as a module of tensors alone: no Python state, no random
    draws, the networks held as submodules (so that tracing for TorchScript or ONNX records their
    weights as parameters, not as constants).

    ``forward(obs)`` gives the deterministic actions of ``act(obs)`` in the normalised action space
    ([-1, 1] for Box). A stochastic module (:attr:`noise` set) takes the random draw as its last input,
    ``noise`` ``(B, noise.size)`` distributed as :attr:`noise` says, and gives the action that
    ``act(obs, deterministic=False)`` samples with that draw. A multi-agent module acts for the agents
    of one group: inputs and actions ``(B, A_g, ...)``, with an ``action_mask`` ``(B, A_g, n)`` input
    where the algorithm applies the env's masks. :attr:`inputs` names ``forward``'s inputs in order.
    The module shares the algorithm's networks (a copy of it copies them).
    """

    def __init__(self, noise: ActionNoise | None = None, action_mask: bool = False) -> None:
        super().__init__()
        self.noise = noise
        self.inputs = ("obs", *(("action_mask",) if action_mask else ()), *(("noise",) if noise else ()))


def no_stochastic_policy(algorithm: str, why: str) -> ConfigError:
    """The error of asking ``algorithm``, whose acting policy is deterministic (``why``), for a stochastic
    acting module."""
    return ConfigError(
        f"{algorithm} has no stochastic policy to export: {why}. Export its deterministic policy (leave "
        "out --stochastic / stochastic=True)."
    )


class SideBySide:
    """k agents as one actor: agent i acts on its own block of ``len(obs) / k`` rows."""

    def __init__(self, agents: list[Algorithm]) -> None:
        self.agents = agents

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        blocks = obs.chunk(len(self.agents))
        return torch.cat(
            [agent.act(rows, deterministic) for agent, rows in zip(self.agents, blocks, strict=True)]
        )


class Algorithm:
    """A learning rule (see the module docstring for its interface). Its class declares what it is, and
    ``phalanx.registry`` reads nothing else: the table there maps a name to the class."""

    name: ClassVar[str]
    """The name configs, presets and the CLI call it by (lower case): its key in ``phalanx.registry``."""
    config_class: ClassVar[type[AlgoConfig]]
    """Its hyperparameters' dataclass (``TrainConfig.hyperparameters`` of its runs)."""
    on_policy: ClassVar[bool]
    """Whether it learns from rollouts of its current policy (:class:`OnPolicy`: its config has a
    ``horizon``, it has a ``rollout_buffer`` method) or from a replay (:class:`OffPolicy`: its config is
    an :class:`OffPolicyConfig`)."""
    extra_state: ClassVar[tuple[str, ...]] = ()
    """Attributes a checkpoint holds beside the networks and optimisers: counters, tensors (SAC's
    ``log_alpha``); see :meth:`state_dict`."""
    action_spaces: ClassVar[tuple[type[gym.Space], ...]] = (gym.spaces.Discrete, gym.spaces.Box)
    """The action spaces it acts in: Discrete (discrete actions), Box (continuous), MultiDiscrete."""
    observations: ClassVar[tuple[str, ...]] = ("flat",)
    """The kinds of observation space the algorithm reads (``phalanx.nets.observation_kind``): flat (a
    1-D Box), image (a Box of images, through a CNN encoder), dict (a Dict of flat and image parts)."""
    multi_agent: ClassVar[bool] = False
    """Whether the algorithm learns the agents of a multi-agent env (``phalanx.marl``)."""
    recurrent_variant: ClassVar[str | None] = None
    """The ``Algorithm`` class a run builds when its hyperparameters ask for a recurrent policy
    (``recurrent: lstm``), as ``"module:Class"`` (imported when a run asks for it); None: it has none."""
    vectorized_population: ClassVar[str | None] = None
    """Its vectorized population, ``"module:Class"`` (P members as one batched run: ``phalanx population
    run --backend vectorized``); None: it has none. Both are inherited: a subclass that is another
    algorithm says its own (A2C, a PPO, has no vectorized population: None)."""
    trainer: ClassVar[str] = "phalanx.train.trainer:Trainer"
    """The trainer class that runs it, ``"module:Class"`` (a layer above the algorithms: imported by the
    runtime when a run starts)."""
    agent: ClassVar[str] = "phalanx.agent:Agent"
    """The class ``phalanx.load_agent`` gives for its runs, ``"module:Class"``."""

    def __init__(
        self,
        config: AlgoConfig,
        observation_space: gym.Space,
        action_space: gym.Space,
        device: torch.device,
    ) -> None:
        self.check_spaces(observation_space, action_space)
        self.config = config
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = torch.device(device)
        self.group: GradientGroup | None = None
        """Set by a data-parallel group of learners: gradients are averaged over it before each step."""

    @classmethod
    def check_spaces(cls, observation_space: gym.Space, action_space: gym.Space) -> None:
        """A ConfigError naming the space, the algorithms that can read it and the fix, where this
        algorithm cannot act in ``action_space`` or read ``observation_space`` (:attr:`observations`)."""
        kind = observation_kind(observation_space)
        if not isinstance(action_space, cls.action_spaces):
            supported = " or ".join(space.__name__ for space in cls.action_spaces)
            acting = algorithms_reading(kind, action_space) if kind is not None else []
            fix = (
                f"Use {' or '.join(acting)}, which act in it."
                if acting
                else "No phalanx algorithm acts in it: convert it with an action wrapper."
            )
            raise ConfigError(
                f"{cls.name} needs a {supported} action space, but the environment's action space is "
                f"{action_space}. {fix}"
            )
        if kind is None:
            raise ConfigError(
                f"{cls.name} cannot read the observation space {observation_space}: phalanx reads a 1-D Box "
                "(a vector per sub-env), images (a Box (C, H, W), (H, W, C), or uint8 (H, W)) and Dict "
                "spaces of those. Flatten the observations with a wrapper "
                "(gymnasium.wrappers.FlattenObservation)."
            )
        if kind not in cls.observations:
            readers = algorithms_reading(kind, action_space)
            fix = (
                f"use {' or '.join(readers)}"
                if readers
                else f"no phalanx algorithm reads them with the action space {action_space}"
            )
            what = {
                "image": f"image observations {observation_space.shape} {observation_space.dtype}",
                "dict": f"Dict observations {observation_space}",
            }[kind]
            raise ConfigError(
                f"{what}: {cls.name} reads {_kinds_text(cls.observations)} only; {fix}, or flatten the "
                "observations with a wrapper "
                "(gymnasium.wrappers.FlattenObservation)."
            )

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def acting_module(self, stochastic: bool = False) -> ActingModule:
        """:meth:`act` as an :class:`ActingModule`: deterministic, or (``stochastic``) sampling from a
        given draw; a ConfigError where the algorithm's policy is deterministic."""
        raise ConfigError(
            f"{self.name} defines no acting_module(), which export needs: return an ActingModule that "
            "computes its act() from tensors alone."
        )

    @classmethod
    def side_by_side(cls, agents: list[Algorithm]) -> SideBySide | Any:
        """One actor for k agents of this class (an evaluation of k copies of the weights at once): its
        ``act`` of ``(k * E, ...)`` observations gives agent i's deterministic actions for its block of E
        rows. A subclass may batch the k networks into one."""
        return SideBySide(agents)

    def compile(self) -> list[str]:
        """Switch this algorithm's hot paths to compiled ones (:mod:`phalanx.compiling`) and name them;
        [] where it has none (the base: nothing). Idempotent. Eager is the default and the reference:
        compiled and eager differ by float rounding only."""
        return []

    def optimizer_step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None) -> None:
        """Step ``optimizer`` on the gradients its parameters hold: first averaged over the learners of a
        data-parallel group (if any), then clipped to ``max_grad_norm`` (if given), as one learner with
        the learners' batches together would clip them."""
        grads = gradients(optimizer)
        if self.group is not None:
            self.group.average(grads)
        if max_grad_norm is not None:
            clip_grad_norm(grads, max_grad_norm)
        optimizer.step()

    def minimise(
        self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None
    ) -> None:
        """One gradient step of ``optimizer`` on ``loss``: fresh gradients, then :meth:`optimizer_step`."""
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer_step(optimizer, max_grad_norm)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimiser the algorithm holds, by name (``phalanx.train.handover.adopt`` sets their
        learning rates)."""
        return {name: value for name, value in vars(self).items() if isinstance(value, torch.optim.Optimizer)}

    def update(self, batch: Any, progress: float) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def state_entries(self) -> dict[str, Any]:
        """What a checkpoint holds of the algorithm besides :attr:`extra_state`, by key: every network
        and optimiser it holds as an attribute, under the attribute's name (exploration policies share
        networks held elsewhere, so they are left out). A subclass whose networks sit in containers
        returns them here (values with ``state_dict`` / ``load_state_dict``, or dicts of them)."""
        stateful = (nn.Module, torch.optim.Optimizer)
        return {
            name: value
            for name, value in vars(self).items()
            if isinstance(value, stateful) and not isinstance(value, ExplorationPolicy)
        }

    def state_dict(self) -> dict[str, Any]:
        """The state dicts of :meth:`state_entries`, then the :attr:`extra_state` attributes."""
        state = _state_dicts(self.state_entries())
        for name in self.extra_state:
            value = getattr(self, name)
            state[name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (tensors of :attr:`extra_state` are copied in place)."""
        _load_state_dicts(self.state_entries(), state)
        for name in self.extra_state:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                with torch.no_grad():
                    value.copy_(state[name])
            else:
                setattr(self, name, state[name])


def _kinds_text(kinds: tuple[str, ...]) -> str:
    """``("flat", "image")`` as "flat vectors and images"."""
    names = {"flat": "flat vectors", "image": "images", "dict": "Dict observations"}
    return " and ".join(names[kind] for kind in kinds)


def _state_dicts(entries: dict[str, Any]) -> dict[str, Any]:
    return {
        key: _state_dicts(value) if isinstance(value, dict) else value.state_dict()
        for key, value in entries.items()
        if value is not None  # an optimiser of an algorithm built to act only (without_optimizers)
    }


def _load_state_dicts(entries: dict[str, Any], state: dict[str, Any]) -> None:
    for key, value in entries.items():
        if value is None:  # an optimiser of an algorithm built to act only: its state is left alone
            continue
        if isinstance(value, dict):
            _load_state_dicts(value, state[key])
        else:
            value.load_state_dict(state[key])


@dataclass
class OffPolicyConfig(AlgoConfig):
    """What every replay-based algorithm has: the buffer, the batch, the update-to-data ratio."""

    buffer_size: int = 1_000_000
    """Replay capacity in transitions (kept on the training device)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    learning_starts: int = 10_000
    """Transitions collected with uniformly random actions before the first update (the warm-up)."""
    updates_per_step: float = 1.0
    """Gradient steps per collected transition: a VecEnv step of N envs triggers N * ratio of them."""
    max_updates_per_step: int | None = None
    """Cap on the gradient steps after one VecEnv step (None: no cap)."""
    tau: float = 0.005
    """Polyak factor of the target networks (1.0: hard copy)."""
    n_step: int = 1
    """Steps of reward summed in each TD target (n-step returns; stops at episode ends)."""

    @property
    def replay_stacked_frames(self) -> int:
        """The frames each image observation is a stack of, which the replay stores once each (1: every
        observation stored whole). A setting of the configs that read stacked frames (the DQN family's)."""
        return 1

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        check(
            _int(self.buffer_size) and self.buffer_size >= 1,
            "buffer_size",
            self.buffer_size,
            "an integer >= 1",
        )
        check(
            _int(self.batch_size) and self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1"
        )
        check(
            _int(self.learning_starts) and self.learning_starts >= self.batch_size,
            "learning_starts",
            self.learning_starts,
            f"an integer >= batch_size ({self.batch_size}): the first batch is drawn from the warm-up "
            "transitions; raise learning_starts or lower batch_size",
        )
        check(
            self.buffer_size >= max(self.learning_starts, run.num_envs * self.n_step),
            "buffer_size",
            self.buffer_size,
            f">= learning_starts ({self.learning_starts}) and >= num_envs * n_step "
            f"({run.num_envs} * {self.n_step})",
        )
        check(self.updates_per_step > 0, "updates_per_step", self.updates_per_step, "> 0, e.g. 1 or 0.25")
        check(
            self.max_updates_per_step is None
            or (_int(self.max_updates_per_step) and self.max_updates_per_step >= 1),
            "max_updates_per_step",
            self.max_updates_per_step,
            "an integer >= 1, or None",
        )
        check(0 < self.tau <= 1, "tau", self.tau, "a value in (0, 1]")
        check(_int(self.n_step) and self.n_step >= 1, "n_step", self.n_step, "an integer >= 1")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PolyakPair:
    """A target network that follows its source: ``target <- (1 - tau) * target + tau * source``
    (``tau = 1``: a copy), as one foreach op over parameter lists cached at construction."""

    def __init__(self, target: nn.Module, source: nn.Module) -> None:
        self.target: list[torch.Tensor] = list(target.parameters())
        self.source: list[torch.Tensor] = list(source.parameters())

    @torch.no_grad()
    def update(self, tau: float) -> None:
        if tau >= 1.0:
            torch._foreach_copy_(self.target, self.source)
        else:
            torch._foreach_lerp_(self.target, self.source, tau)


class OffPolicyAlgorithm(Algorithm):
    """Replay-based (:class:`OffPolicy`): :meth:`explore` acts with :meth:`exploration_policy`; ``update``
    takes a sampled ReplayBatch."""

    on_policy = False
    config: OffPolicyConfig
    extra_state: ClassVar[tuple[str, ...]] = ("updates",)

    def exploration_policy(self) -> ExplorationPolicy:
        raise NotImplementedError

    def explore(self, obs: torch.Tensor, steps: int) -> torch.Tensor:
        return self.exploration_policy()(obs, steps)

    def random_actions(self, num_envs: int) -> torch.Tensor:
        """Uniform actions for the warm-up, in the normalised action space."""
        if isinstance(self.action_space, gym.spaces.Discrete):
            return torch.randint(int(self.action_space.n), (num_envs,), device=self.device)
        assert self.action_space.shape is not None, "a Box (the other action spaces it acts in)"
        return torch.rand(num_envs, *self.action_space.shape, device=self.device) * 2 - 1
