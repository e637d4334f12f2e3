"""What every multi-agent algorithm shares: the spec of the env it learns, and its interface.

A :class:`MultiAgentAlgorithm` learns every agent group of a :class:`~phalanx.marl.core.MultiAgentVecEnv`
at once (a cooperative task has one group; a competitive one a team per group, each with its own
networks). It sees only the :class:`MultiAgentSpec` (the groups' spaces and the global state's), never
the env. Per-agent arrays are dicts ``{group: (..., A_g, ...)}`` as in the env contract; Box actions
are in the normalised space [-1, 1] and the worker rescales them to the env's bounds.

On-policy (MAPPO, IPPO) and off-policy (MADDPG, MATD3, QMIX, VDN) algorithms are what
:class:`MultiAgentOnPolicy` and :class:`MultiAgentOffPolicy` say, the multi-agent forms of
:class:`phalanx.algos.base.OnPolicy` and :class:`~phalanx.algos.base.OffPolicy`. Both ``act`` for
evaluation and deployment (decentralised execution: each agent acts on its own observation), and
``group_acting_module`` gives one group's ``act`` as an :class:`~phalanx.algos.base.ActingModule` (for
export); their ``state_dict`` / ``load_state_dict`` are :class:`~phalanx.algos.base.Algorithm`'s.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import gymnasium as gym
import torch

from phalanx.algos.base import ActingModule, Algorithm
from phalanx.config import AlgoConfig
from phalanx.envs.wrappers import ActionMap
from phalanx.errors import ConfigError
from phalanx.marl.core import AgentGroup, Groups, MultiAgentSpec, Tensor


class MultiAgentOnPolicy(Protocol):
    """A multi-agent on-policy algorithm as the multi-agent worker uses it (MAPPO, IPPO)."""

    def explore(
        self, obs: Groups, state: Tensor, action_mask: Groups | None = None
    ) -> tuple[Groups, Groups, Groups]:
        """Sampled actions, their log-probabilities and values, each a dict per group (``(N, A_g, ...)``)."""

    def act(self, obs: Groups, action_mask: Groups | None = None, deterministic: bool = True) -> Groups: ...

    def update(self, rollout: Any, progress: float) -> dict[str, Tensor]:
        """One learning step on a ``MultiAgentRollout``."""


class MultiAgentOffPolicy(Protocol):
    """A multi-agent off-policy algorithm as the multi-agent worker uses it (MADDPG, MATD3, QMIX, VDN)."""

    def explore(self, obs: Groups, state: Tensor, action_mask: Groups | None, steps: int) -> Groups:
        """Collection actions per group; ``steps``: env steps so far (for schedules)."""

    def random_actions(self, num_envs: int, action_mask: Groups | None = None) -> Groups:
        """Uniform actions per group for the warm-up (among the allowed ones where masked)."""

    def act(self, obs: Groups, action_mask: Groups | None = None, deterministic: bool = True) -> Groups: ...

    def update(self, batch: Any, progress: float) -> dict[str, Tensor]:
        """One learning step on a sampled ``MultiAgentBatch``."""


class MultiAgentAlgorithm(Algorithm):
    """Base of the multi-agent algorithms (see the module docstring for the interface)."""

    multi_agent = True
    trainer = "phalanx.marl.trainer:MultiAgentTrainer"
    agent = "phalanx.marl.agent:MultiAgentAgent"
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "continuous")
    """Which action spaces the algorithm learns: discrete (Discrete) and/or continuous (Box)."""

    def __init__(self, config: AlgoConfig, spec: MultiAgentSpec, device: torch.device) -> None:
        self.check_spec(spec)
        self.config = config
        self.spec = spec
        self.device = torch.device(device)
        self.group = None  # no data-parallel learners for multi-agent runs

    @classmethod
    def check_spec(cls, spec: MultiAgentSpec) -> None:
        """A ConfigError if a group's action space is of a kind this algorithm cannot learn."""
        for name, group in spec.groups.items():
            kind = "discrete" if group.discrete else "continuous"
            if kind not in cls.action_kinds:
                needed = " or ".join(cls.action_kinds)
                alternatives = (
                    "qmix, vdn, mappo or ippo" if kind == "discrete" else "maddpg, matd3, mappo or ippo"
                )
                raise ConfigError(
                    f"{cls.name} needs {needed} actions, but agent group {name!r} "
                    f"({', '.join(group.agents)}) "
                    f"has the {kind} action space {group.action_space}. Use {alternatives} for it, or the "
                    f"env's {'continuous' if kind == 'discrete' else 'discrete'} variant "
                    "(see `phalanx envs`)."
                )

    @classmethod
    def check_spaces(cls, observation_space: gym.Space, action_space: gym.Space) -> None:
        raise ConfigError(
            f"{cls.name} is a multi-agent algorithm: train it on a multi-agent env such as simple_spread "
            "(see `phalanx envs`), not on a single-agent one."
        )

    # overrides Algorithm.act with another signature: groups of observations (and action masks) in,
    # groups of actions out, where a single-agent algorithm acts on one tensor
    def act(  # type: ignore[override]
        self, obs: Groups, action_mask: Groups | None = None, deterministic: bool = True
    ) -> Groups:
        raise NotImplementedError

    def group_acting_module(self, group: str, stochastic: bool = False) -> ActingModule:
        """What :meth:`act` computes for the agents of ``group``, as an :class:`ActingModule`: observations
        ``(B, A_g, obs_dim)`` (and the group's ``action_mask`` ``(B, A_g, n)`` where the algorithm applies
        masks) to actions ``(B, A_g[, act_dim])``; a ConfigError where the policy is deterministic."""
        raise ConfigError(
            f"{self.name} defines no group_acting_module(), which export needs: return an ActingModule "
            "that computes one group's act() from tensors alone."
        )


def with_agent_ids(x: Tensor, enabled: bool = True) -> Tensor:
    """``(N, A, D)`` inputs with each agent's one-hot id appended, ``(N, A, D + A)`` (parameter sharing
    tells agents apart by it); ``x`` itself when ``enabled`` is false or there is one agent.

    The ids are made from ``x`` (``ones_like``), not with ``device=x.device``: a traced policy (export)
    would hold that device as a constant and fail on another one."""
    num_agents = x.shape[-2]
    if not enabled or num_agents == 1:
        return x
    ids = torch.diag_embed(torch.ones_like(x[..., 0]))  # (N, A, A), the identity for every row
    return torch.cat((x, ids), dim=-1)


def agent_id_dim(num_agents: int, enabled: bool = True) -> int:
    """How many inputs :func:`with_agent_ids` appends."""
    return num_agents if enabled and num_agents > 1 else 0


def broadcast_state(state: Tensor, num_agents: int) -> Tensor:
    """The global state ``(N, S)`` repeated for each agent: ``(N, A, S)`` (a view)."""
    return state.unsqueeze(-2).expand(*state.shape[:-1], num_agents, state.shape[-1])


_ACTION_MAPS: dict[tuple[int, torch.device], tuple[AgentGroup, ActionMap]] = {}
"""Each group's :class:`ActionMap` on a device, built once (the group is kept, so its id stays its own)."""


def to_env_actions(actions: Groups, groups: dict[str, AgentGroup]) -> Groups:
    """Actions of the normalised space (Box: [-1, 1]; Discrete: from 0) in each group's env space (its
    bounds; its start), by the :class:`~phalanx.envs.wrappers.ActionMap` single-agent runs use."""
    env_actions: Groups = {}
    for name, group in groups.items():
        value = actions[name]
        key = (id(group), value.device)
        if key not in _ACTION_MAPS:
            if len(_ACTION_MAPS) > 256:  # groups of envs long gone
                _ACTION_MAPS.clear()
            _ACTION_MAPS[key] = (group, ActionMap(group.action_space).to(value.device))
        env_actions[name] = _ACTION_MAPS[key][1](value)
    return env_actions
