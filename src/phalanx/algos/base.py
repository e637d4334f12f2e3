"""The Algorithm interface shared by every learning rule.

An algorithm knows observation and action *spaces*, never environments (DESIGN.md). It owns its
networks and optimisers and exposes:

- ``act(obs, deterministic)``: actions in the normalised action space ([-1, 1] for Box), for
  evaluation and deployment;
- ``update(batch, progress) -> metrics``: one learning step on collected data; ``progress`` in [0, 1]
  is the fraction of the training budget spent (for schedules); metrics are scalar tensors, read on
  the host only when they are logged;
- ``state_dict()`` / ``load_state_dict()``: networks and optimiser state, tensors and primitives only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import torch
from torch import nn

from phalanx.config import AlgoConfig, TrainConfig, check
from phalanx.errors import ConfigError
from phalanx.optim import clip_grad_norm, gradients


class GradientGroup(Protocol):
    """What an algorithm needs of a data-parallel group of learners (``phalanx.train.learner``)."""

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its mean over the learners (identical on every learner)."""


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
    name: ClassVar[str]
    config_class: ClassVar[type[AlgoConfig]]
    on_policy: ClassVar[bool]
    action_spaces: ClassVar[tuple[type[gym.Space], ...]] = (gym.spaces.Discrete, gym.spaces.Box)
    multi_agent: ClassVar[bool] = False
    """Whether the algorithm learns the agents of a multi-agent env (``phalanx.marl``)."""

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
        if not isinstance(action_space, cls.action_spaces):
            supported = " or ".join(space.__name__ for space in cls.action_spaces)
            raise ConfigError(
                f"{cls.name} needs a {supported} action space, but the environment's action space is "
                f"{action_space}. Choose an algorithm for this action space (see `phalanx train --help`)."
            )
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise ConfigError(
                f"{cls.name} needs flat Box observations (a vector per sub-env), but the environment's "
                f"observation space is {observation_space}. Flatten the observations in the env."
            )

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def side_by_side(cls, agents: list[Algorithm]) -> SideBySide | Any:
        """One actor for k agents of this class (an evaluation of k copies of the weights at once): its
        ``act`` of ``(k * E, ...)`` observations gives agent i's deterministic actions for its block of E
        rows. A subclass may batch the k networks into one."""
        return SideBySide(agents)

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

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimiser the algorithm holds, by name (``Trainer.adopt`` sets their learning rates)."""
        return {name: value for name, value in vars(self).items() if isinstance(value, torch.optim.Optimizer)}

    def update(self, batch: Any, progress: float) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


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
        self.target = list(target.parameters())
        self.source = list(source.parameters())

    @torch.no_grad()
    def update(self, tau: float) -> None:
        if tau >= 1.0:
            torch._foreach_copy_(self.target, self.source)
        else:
            torch._foreach_lerp_(self.target, self.source, tau)


class OffPolicyAlgorithm(Algorithm):
    """Replay-based: ``explore(obs, steps)`` picks collection actions (``steps``: env steps so far, for
    exploration schedules); ``update`` takes a sampled ReplayBatch."""

    on_policy = False
    config: OffPolicyConfig
    acting_modules: ClassVar[tuple[str, ...]] = ("actor",)
    """The networks that :meth:`explore` reads (the pipeline's worker acts with copies of them)."""

    def explore(self, obs: torch.Tensor, steps: int) -> torch.Tensor:
        raise NotImplementedError

    def acting_copy(self) -> OffPolicyAlgorithm:
        """A copy that explores with its own copies of :attr:`acting_modules` and shares the rest.

        The pipeline's worker thread acts with it while the learner updates the originals;
        :meth:`acting_tensors` of both, copied one onto the other, refresh it.
        """
        clone = copy.copy(self)
        for name in self.acting_modules:
            setattr(clone, name, copy.deepcopy(getattr(self, name)))
        return clone

    def acting_tensors(self) -> list[torch.Tensor]:
        """Parameters and buffers of :attr:`acting_modules`, in a fixed order."""
        tensors: list[torch.Tensor] = []
        for name in self.acting_modules:
            module = getattr(self, name)
            tensors += [tensor.data for tensor in module.parameters()]
            tensors += list(module.buffers())
        return tensors

    def random_actions(self, num_envs: int) -> torch.Tensor:
        """Uniform actions for the warm-up, in the normalised action space."""
        if isinstance(self.action_space, gym.spaces.Discrete):
            return torch.randint(int(self.action_space.n), (num_envs,), device=self.device)
        return torch.rand(num_envs, *self.action_space.shape, device=self.device) * 2 - 1
