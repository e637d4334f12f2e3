"""VMASVecEnv: a VMAS scenario, batched in torch already, behind the multi-agent VecEnv contract.

No copies: the adapter stacks VMAS's per-agent tensors into groups, resets the ended rows in the same
step and keeps the episode statistics.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.base import as_device
from phalanx.envs.episodes import EpisodeStatistics
from phalanx.errors import ConfigError, EnvError, import_optional
from phalanx.marl.adapters.groups import concat_state, group_agents, split_groups
from phalanx.marl.core import AgentGroup, Groups, MultiAgentVecEnv, Tensor, check_actions

_VMAS_RESERVED = {
    "num_envs": "pass num_envs as VMASVecEnv's own argument",
    "device": "pass device as VMASVecEnv's own argument",
    "dict_spaces": "the adapter reads VMAS's per-agent lists (dict_spaces=False)",
    "terminated_truncated": "the adapter needs terminated and truncated apart (terminated_truncated=True)",
    "wrapper": "the adapter is the wrapper",
    "multidiscrete_actions": "MultiDiscrete actions are not in the contract (Discrete or Box only)",
    "grad_enabled": "phalanx steps envs without gradients",
}


def _import_vmas() -> ModuleType:
    return import_optional(
        "vmas",
        ConfigError,
        "VMASVecEnv: the package {package} is not installed (VMAS needs vmas and the gym it imports), "
        "so VMAS scenarios are unavailable. Install it with `pip install vmas`.",
        packages=("vmas", "gym"),
    )


def _gymnasium_space(space: Any, role: str, agent: str) -> gym.spaces.Box | gym.spaces.Discrete:
    """VMAS's (old ``gym``) Box / Discrete as the gymnasium space the contract uses."""
    kind = type(space).__name__
    if kind == "Box" and len(space.shape) == 1:
        return gym.spaces.Box(
            np.asarray(space.low, np.float32),
            np.asarray(space.high, np.float32),
            tuple(space.shape),
            np.float32,
        )
    if kind == "Discrete" and role == "action":
        return gym.spaces.Discrete(int(space.n), start=int(getattr(space, "start", 0)))
    raise ConfigError(
        f"VMASVecEnv: agent {agent!r} has {role} space {space}; the multi-agent contract needs a flat Box "
        f"observation and a Discrete or flat Box action. Pick another scenario or scenario option."
    )


class VMASVecEnv(MultiAgentVecEnv):
    """A VMAS scenario (``num_envs`` batched worlds, torch on ``device``) behind the multi-agent contract.

    Args:
        scenario: a VMAS scenario name (``"balance"``, ``"navigation"``, ...) or a ``BaseScenario``.
        num_envs: number of worlds in the batch.
        device: where VMAS simulates and the tensors live.
        seed: the seed of VMAS's construction and of the first :meth:`reset` called without one.
        max_steps: the episode horizon (truncation); None: only the scenario's own ``done``.
        continuous_actions: Box actions (True) or VMAS's Discrete actions (False).
        **scenario_kwargs: passed to ``vmas.make_env`` (the scenario's options, e.g. ``n_agents=4``,
            and ``clamp_actions``).

    Groups follow the same rule as :class:`PettingZooVecEnv` (name prefix and equal spaces). The
    global state is every agent's observation concatenated, group by group. ``terminated`` is VMAS's
    ``done`` of the scenario; ``truncated`` is the horizon reached without it. Ended rows are reset in
    the same step with ``reset_at`` (one call per ended row: VMAS 1.5 has no masked reset), and
    ``info["final_obs"]`` keeps their last observations. VMAS's per-agent infos are not passed on.

    Seeding: VMAS draws every row's randomness from one random stream of its own (shared by all VMAS
    envs of the process); ``reset(seed=s)`` reseeds it, so the same actions then give the same
    trajectories. Checkpoints hold the episode statistics only (VMAS worlds cannot be saved).
    """

    def __init__(
        self,
        scenario: Any,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        max_steps: int | None = None,
        continuous_actions: bool = True,
        **scenario_kwargs: Any,
    ) -> None:
        self.closed = True
        vmas = _import_vmas()
        name = scenario if isinstance(scenario, str) else type(scenario).__name__
        who = f"VMASVecEnv({name!r})"
        for key, reason in _VMAS_RESERVED.items():
            if key in scenario_kwargs:
                raise ConfigError(
                    f"{who}: the keyword argument {key}= is set by the adapter ({reason}). Remove it."
                )
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ConfigError(f"{who}: num_envs must be an integer >= 1, got {num_envs!r}.")
        if max_steps is not None and (
            isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
        ):
            raise ConfigError(f"{who}: max_steps must be an integer >= 1 or None, got {max_steps!r}.")
        device = as_device(device)
        self.env = vmas.make_env(
            scenario,
            num_envs=int(num_envs),
            device=device,
            continuous_actions=continuous_actions,
            dict_spaces=False,
            seed=seed,
            max_steps=max_steps,
            terminated_truncated=True,
            **scenario_kwargs,
        )
        agents = [str(agent.name) for agent in self.env.agents]
        spaces = {
            agent: (
                _gymnasium_space(self.env.observation_space[i], "observation", agent),
                _gymnasium_space(self.env.action_space[i], "action", agent),
            )
            for i, agent in enumerate(agents)
        }
        grouping = group_agents(agents, lambda agent: spaces[agent])
        groups = {}
        for g, members in grouping.items():
            observation_space, action_space = spaces[members[0]]
            assert isinstance(observation_space, gym.spaces.Box), "_gymnasium_space: observations are Boxes"
            groups[g] = AgentGroup(members, observation_space, action_space)
        state_dim = sum(g.num_agents * int(g.observation_space.shape[0]) for g in groups.values())
        state_space = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
        super().__init__(int(num_envs), groups, state_space, device)
        self.scenario = name
        self.max_steps = max_steps
        self._seed = seed
        self._needs_reset = True
        position = {agent: i for i, agent in enumerate(agents)}
        self._order = {g: [position[agent] for agent in group.agents] for g, group in groups.items()}
        where = {agent: (g, j) for g, group in groups.items() for j, agent in enumerate(group.agents)}
        self._vmas_order = [where[agent] for agent in agents]  # VMAS's agent order -> (group, index)
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device, (self.num_agents,))
        self.closed = False

    def _group(self, per_agent: list[Tensor], dtype: torch.dtype) -> Groups:
        return {
            g: torch.stack([per_agent[i] for i in order], dim=1).to(self.device, dtype)
            for g, order in self._order.items()
        }

    def _observe(self) -> Groups:
        obs = self.env.get_from_scenario(
            get_observations=True, get_rewards=False, get_infos=False, get_dones=False
        )
        return self._group(obs[0], torch.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Groups, dict]:
        if self.closed:
            raise EnvError(f"VMASVecEnv({self.scenario!r}).reset: the env is closed; build a new one.")
        if seed is None and self._needs_reset:
            seed = self._seed
        obs = self.env.reset(seed=None if seed is None else int(seed))
        self._needs_reset = False
        self.episode_statistics.reset()
        grouped = self._group(obs, torch.float32)
        return grouped, {"state": concat_state(self.groups, grouped)}

    def step(self, actions: Groups) -> tuple[Groups, Groups, Tensor, Tensor, dict[str, Any]]:
        if self.closed:
            raise EnvError(f"VMASVecEnv({self.scenario!r}).step: the env is closed; build a new one.")
        if self._needs_reset:
            raise EnvError(f"VMASVecEnv({self.scenario!r}).step: call reset() before the first step.")
        checked = check_actions(self, actions)
        per_agent = []
        for g, j in self._vmas_order:
            value = checked[g][:, j]
            per_agent.append(value.unsqueeze(-1) if self.groups[g].discrete else value)
        obs, rewards, terminated, truncated, _ = self.env.step(per_agent)
        final_obs = self._group(obs, torch.float32)
        reward = self._group(rewards, torch.float32)
        terminated = terminated.to(self.device, torch.bool).reshape(self.num_envs)
        truncated = truncated.to(self.device, torch.bool).reshape(self.num_envs) & ~terminated
        done = terminated | truncated
        all_rewards = torch.cat([reward[g] for g in self.groups], dim=1)
        episode_return, episode_length = self.episode_statistics.step(all_rewards, done)
        rows = torch.nonzero(done).flatten().tolist()
        if rows:
            for row in rows:
                self.env.reset_at(row, return_observations=False)
            fresh = self._observe()
            next_obs = {g: torch.where(done.view(-1, 1, 1), fresh[g], final_obs[g]) for g in self.groups}
        else:
            next_obs = {g: value.clone() for g, value in final_obs.items()}
        info: dict[str, Any] = {
            "state": concat_state(self.groups, next_obs),
            "final_obs": final_obs,
            "final_state": concat_state(self.groups, final_obs),
            "_final_obs": done,
            "episode_return": split_groups(self.groups, episode_return),
            "episode_length": episode_length,
        }
        return next_obs, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """Episode statistics only: VMAS worlds cannot be checkpointed (a resume re-resets them)."""
        return {"episode_statistics": self.episode_statistics.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_statistics.load_state_dict(state["episode_statistics"])

    def __repr__(self) -> str:
        groups = ", ".join(f"{name}: {group.num_agents}" for name, group in self.groups.items())
        return (
            f"VMASVecEnv({self.scenario!r}, num_envs={self.num_envs}, groups={{{groups}}}, "
            f"device={self.device})"
        )
