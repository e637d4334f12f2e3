"""``check_multi_agent_env``: run a multi-agent env and report every way it breaks the contract.

The contract is :mod:`phalanx.marl.core`'s. Each violation is one line: what is wrong, where (method,
key, group, agent, sub-env index, step), expected against actual, and the fix. All violations found are
reported together in one :class:`~phalanx.errors.ContractError` (attribute ``violations``: the lines).
Exceptions raised by the env are reported as violations with their type, message and the line that
raised them. Actions are random and valid: within each group's space and, where the env has action
masks, among the allowed actions.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.check import (
    CheckAborted,
    CheckerBase,
    equal_with_nan,
    first_difference,
    first_true,
    format_values,
)
from phalanx.envs.contract_checker import ContractReport
from phalanx.marl.core import AgentGroup, MultiAgentVecEnv

__all__ = ["MultiAgentCheckReport", "check_multi_agent_env"]

_REQUIRED = ("num_envs", "groups", "state_space", "device", "metadata", "reset", "step")
_DETERMINISM_STEPS = 20
_RETURN_TOLERANCE = 1e-3  # relative, of the summed rewards against info["episode_return"]


class MultiAgentCheckReport(ContractReport[dict[str, float]]):
    """What :func:`check_multi_agent_env` saw on an env that passed; ``mean_episode_return`` per group:
    the mean over its agents and the episodes that ended."""


class _Checker(CheckerBase):
    contract = MultiAgentVecEnv
    contract_name = "phalanx.marl.MultiAgentVecEnv"
    contract_title = "multi-agent VecEnv contract"
    batched_name = "BatchedMultiAgentEnv"
    init_arguments = "num_envs, groups, state_space, device"
    required = _REQUIRED
    step_returns = "(obs, rewards, terminated, truncated, info)"

    def __init__(self, env: Any, steps: int, seed: int) -> None:
        super().__init__(env, steps, seed)
        self.groups: dict[str, AgentGroup] = {}
        self.state_dim: int | None = None
        self.masked = False
        self.masks: dict[str, torch.Tensor] | None = None  # the action masks the next actions obey
        self.running: dict[str, torch.Tensor] = {}  # per group, each agent's rewards since its episode began
        self.returns: dict[str, list[float]] = {}

    def agent(self, group: str, index: int) -> str:
        agents = self.groups[group].agents
        return repr(agents[index]) if 0 <= index < len(agents) else f"#{index}"

    def locate(self, x: torch.Tensor, index: list[int], group: str | None) -> tuple[str, torch.Tensor]:
        if group is None or len(index) < 2:
            return super().locate(x, index, group)
        return f"sub-env index {index[0]}, agent {self.agent(group, index[1])}", x[index[0], index[1]]

    # -- static structure --------------------------------------------------------------------------
    def check_structure(self) -> None:
        self.check_attributes()
        self.check_groups_declared()
        self.check_state_space()
        self.check_autoreset_mode()
        self.check_has_action_mask()

    def check_groups_declared(self) -> None:
        """``groups``: a non-empty dict of AgentGroups with float32 spaces, every agent in one group."""
        groups = self.env.groups
        if not isinstance(groups, dict) or not groups:
            self.fail(
                "groups",
                f"groups: expected a non-empty dict {{name: AgentGroup}}, got {groups!r}. Fix: pass one "
                "AgentGroup per set of agents with equal spaces to MultiAgentVecEnv.__init__.",
            )
            raise CheckAborted
        for name, group in groups.items():
            if not isinstance(group, AgentGroup):
                self.fail(
                    f"groups:{name}",
                    f"groups[{name!r}]: expected a phalanx.marl.core.AgentGroup, got {type(group).__name__}.",
                )
                continue
            obs_space, act_space = group.observation_space, group.action_space
            if obs_space.dtype != np.float32:
                self.fail(
                    f"groups:{name}:obs_dtype",
                    f"groups[{name!r}].observation_space.dtype: expected float32 (observations are float32 "
                    f"tensors), got {obs_space.dtype}. Fix: declare Box(..., dtype=np.float32).",
                )
            if isinstance(act_space, gym.spaces.Box) and act_space.dtype != np.float32:
                self.fail(
                    f"groups:{name}:act_dtype",
                    f"groups[{name!r}].action_space.dtype: expected float32, got {act_space.dtype}.",
                )
            self.groups[name] = group
        if not self.groups:
            raise CheckAborted
        agents = [agent for group in self.groups.values() for agent in group.agents]
        repeated = sorted({agent for agent in agents if agents.count(agent) > 1})
        if repeated:
            self.fail(
                "groups:unique",
                f"groups: agents {repeated} appear more than once (in one group or in several); "
                "expected every agent in exactly one group.",
            )

    def check_state_space(self) -> None:
        state_space = self.env.state_space
        if not isinstance(state_space, gym.spaces.Box) or len(state_space.shape) != 1:
            self.fail("state_space", f"state_space: expected a flat Box (state_dim,), got {state_space!r}.")
            return
        self.state_dim = int(state_space.shape[0])
        if state_space.dtype != np.float32:
            self.fail(
                "state_space:dtype",
                f"state_space.dtype: expected float32 (states are float32 tensors), got {state_space.dtype}.",
            )

    def check_has_action_mask(self) -> None:
        masked = getattr(self.env, "has_action_mask", False)
        if not isinstance(masked, bool):
            self.fail("has_action_mask", f"has_action_mask: expected a bool, got {masked!r}.")
        self.masked = bool(masked)
        if self.masked and not any(group.discrete for group in self.groups.values()):
            self.fail(
                "has_action_mask:discrete",
                "has_action_mask is True but no group has Discrete actions; action masks are for Discrete "
                "groups only. Fix: set has_action_mask = False.",
            )

    # -- arrays ------------------------------------------------------------------------------------
    def check_groups(
        self, where: str, value: Any, dims: dict[str, tuple[int, ...]], dtype: torch.dtype
    ) -> bool:
        """A dict of one tensor per group, each ``(num_envs, A_g, *dims[g])``; whether all are usable."""
        if not isinstance(value, dict):
            self.fail(
                f"{where}:type",
                f"{where}: expected a dict with one tensor per group {sorted(self.groups)}, got "
                f"{type(value).__name__}.",
            )
            return False
        ok = True
        if set(value) != set(dims):
            self.fail(
                f"{where}:keys",
                f"{where}: expected the keys {sorted(dims)} (one per group), got {sorted(value)}.",
            )
            ok = False
        for name, tail in dims.items():
            if name not in value:
                ok = False
                continue
            shape = (self.n, self.groups[name].num_agents, *tail)
            if not self.check_tensor(
                f"{where}[{name!r}]", value[name], shape, dtype, finite=True, group=name
            ):
                ok = False
        return ok

    def obs_dims(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(group.observation_space.shape) for name, group in self.groups.items()}

    def reward_dims(self) -> dict[str, tuple[int, ...]]:
        return {name: () for name in self.groups}

    def mask_dims(self) -> dict[str, tuple[int, ...]]:
        return {
            name: (int(g.action_space.n),)
            for name, g in self.groups.items()
            if isinstance(g.action_space, gym.spaces.Discrete)  # g.discrete
        }

    def check_state(self, where: str, state: Any) -> bool:
        if state is None:
            self.fail(
                f"{where}:missing",
                f"{where}: missing; expected the global state (num_envs, state_dim={self.state_dim}) of the "
                "observations returned. Fix: add it (BatchedMultiAgentEnv does; by default every agent's "
                "observation concatenated).",
            )
            return False
        shape = None if self.state_dim is None else (self.n, self.state_dim)
        return self.check_tensor(where, state, shape, torch.float32, finite=True)

    def check_masks(self, where: str, masks: Any) -> bool:
        if masks is None:
            self.fail(
                f"{where}:missing",
                f"{where}: missing; the env has has_action_mask = True, so expected one bool tensor "
                "(num_envs, A_g, n) per Discrete group.",
            )
            return False
        if not isinstance(masks, dict):
            self.fail(
                f"{where}:type", f"{where}: expected a dict per Discrete group, got {type(masks).__name__}."
            )
            return False
        dims = self.mask_dims()
        ok = True
        for name, (n,) in dims.items():
            if name not in masks:
                self.fail(
                    f"{where}:keys", f"{where}: missing the Discrete group {name!r}; got {sorted(masks)}."
                )
                ok = False
                continue
            mask = masks[name]
            shape = (self.n, self.groups[name].num_agents, n)
            if not self.check_tensor(f"{where}[{name!r}]", mask, shape, torch.bool):
                ok = False
                continue
            if mask.dtype == torch.bool:
                none = ~mask.any(dim=2)
                if bool(none.any()):
                    row, agent = none.nonzero()[0].tolist()
                    self.fail(
                        f"{where}:empty",
                        f"{where}[{name!r}]{self.at}, sub-env index {row}, agent {self.agent(name, agent)}: "
                        "no action allowed (all false); expected at least one true per agent (dead agents: "
                        "all true, their actions are ignored).",
                    )
        return ok

    # -- actions -----------------------------------------------------------------------------------
    def make_action_sampler(self) -> Any:
        """Random actions within each group's space, among the allowed ones of ``self.masks``."""
        generator = torch.Generator().manual_seed(self.seed)
        device = self.device or torch.device("cpu")

        def sample() -> dict[str, torch.Tensor]:
            masks, actions = self.masks, {}
            for name, group in self.groups.items():
                space = group.action_space
                if isinstance(space, gym.spaces.Discrete):  # group.discrete
                    n = int(space.n)
                    mask = None if masks is None else masks.get(name)
                    if isinstance(mask, torch.Tensor) and mask.shape == (self.n, group.num_agents, n):
                        weights = mask.detach().cpu().reshape(-1, n).to(torch.float32)
                        weights[weights.sum(dim=1) == 0] = 1.0  # an empty mask is reported; sample anyway
                        index = torch.multinomial(weights, 1, generator=generator).reshape(self.n, -1)
                    else:
                        index = torch.randint(0, n, (self.n, group.num_agents), generator=generator)
                    actions[name] = (index + int(space.start)).to(device)
                else:
                    low = torch.as_tensor(
                        np.nan_to_num(space.low, neginf=-1.0, posinf=1.0), dtype=torch.float32
                    )
                    high = torch.as_tensor(
                        np.nan_to_num(space.high, neginf=-1.0, posinf=1.0), dtype=torch.float32
                    )
                    high = torch.maximum(high, low)
                    u = torch.rand((self.n, group.num_agents, *space.shape), generator=generator)
                    actions[name] = (low + (high - low) * u).clamp(low, high).to(device)
            return actions

        return sample

    # -- reset and step ----------------------------------------------------------------------------
    def check_reset(self) -> None:
        obs, info = self.reset_result()
        self.check_groups("reset() obs", obs, self.obs_dims(), torch.float32)
        if info is None:
            return
        self.check_state('reset() info["state"]', info.get("state"))
        if self.masked and self.check_masks('reset() info["action_mask"]', info.get("action_mask")):
            self.masks = info["action_mask"]

    def run(self) -> int:
        self.running = {
            name: torch.zeros(self.n, g.num_agents, dtype=torch.float64) for name, g in self.groups.items()
        }
        self.returns = {name: [] for name in self.groups}
        return super().run()

    def check_step(
        self, step: int, obs: Any, rewards: Any, terminated: Any, truncated: Any, info: Any
    ) -> None:
        obs_ok = self.check_groups("step() obs", obs, self.obs_dims(), torch.float32)
        rewards_ok = self.check_groups("step() rewards", rewards, self.reward_dims(), torch.float32)
        done = self.check_flags(terminated, truncated, info)
        if not isinstance(info, dict):
            return
        state = info.get("state")
        state_ok = self.check_state('step() info["state"]', state)
        self.masks = None
        if self.masked and self.check_masks('step() info["action_mask"]', info.get("action_mask")):
            self.masks = info["action_mask"]
        if done is None:
            return
        self.counted += 1
        if rewards_ok:
            for name in self.groups:
                self.running[name] += rewards[name].detach().cpu().to(torch.float64)
        self.check_final_obs(step, info, obs if obs_ok else None, done)
        self.check_final_state(step, info, state if state_ok else None, done)
        if self.masked:
            self.check_final_masks(step, info, done)
        self.check_final_mask(step, info, done)
        self.check_episode_return(step, info, done, rewards_ok)
        self.check_episode_length(step, info, done)
        self.counted[done] = 0
        for name in self.groups:
            self.running[name][done] = 0.0

    def not_ended_but_different(self, done: torch.Tensor, same: torch.Tensor) -> list[int] | None:
        """The first (row, agent) where no episode ended but ``same`` (row, agent) is false."""
        return first_true(~done.view(-1, 1) & ~same)

    def check_final_obs(self, step: int, info: dict, obs: dict | None, done: torch.Tensor) -> None:
        """``info["final_obs"]``: a dict like obs, equal to it in the rows where no episode ended."""
        final = self.missing(
            info,
            "final_obs",
            "a dict like obs with the true next observations of every row (the last ones of the finished "
            "episode where it ended).",
        )
        if final is None:
            return
        if (
            not self.check_groups('step() info["final_obs"]', final, self.obs_dims(), torch.float32)
            or obs is None
        ):
            return
        for name in self.groups:
            same = equal_with_nan(final[name], obs[name]).all(dim=2).cpu()  # (n, A)
            wrong = self.not_ended_but_different(done, same)
            if wrong is not None:
                row, agent = wrong
                self.fail(
                    f"final_obs:not_ended:{name}",
                    f'step() info["final_obs"][{name!r}] at step {step}, sub-env index {row}, agent '
                    f"{self.agent(name, agent)} (episode not ended): expected equal to obs "
                    f"{format_values(obs[name][row, agent])}, got {format_values(final[name][row, agent])}. "
                    "Fix: final_obs must be the true next observation of every row.",
                )
            self.note_ended(done, same.all(dim=1))

    def check_final_state(
        self, step: int, info: dict, state: torch.Tensor | None, done: torch.Tensor
    ) -> None:
        """``info["final_state"]``: equal to ``info["state"]`` in the rows where no episode ended."""
        final = info.get("final_state")
        if not self.check_state('step() info["final_state"]', final) or state is None:
            return
        assert final is not None, "check_state passed"
        wrong = first_true(~done & ~equal_with_nan(final, state).all(dim=1).cpu())
        if wrong is not None:
            (row,) = wrong
            self.fail(
                "final_state:not_ended",
                f'step() info["final_state"] at step {step}, sub-env index {row} (episode not '
                f'ended): expected equal to info["state"] {format_values(state[row])}, got '
                f"{format_values(final[row])}.",
            )

    def check_final_masks(self, step: int, info: dict, done: torch.Tensor) -> None:
        """``info["final_action_mask"]``: equal to ``info["action_mask"]`` where no episode ended."""
        final = info.get("final_action_mask")
        if not self.check_masks('step() info["final_action_mask"]', final) or self.masks is None:
            return
        assert final is not None, "check_masks passed"
        for name in self.mask_dims():
            wrong = self.not_ended_but_different(done, (final[name] == self.masks[name]).all(dim=2).cpu())
            if wrong is not None:
                row, agent = wrong
                self.fail(
                    f"final_action_mask:not_ended:{name}",
                    f'step() info["final_action_mask"][{name!r}] at step {step}, sub-env index '
                    f"{row}, agent {self.agent(name, agent)} (episode not ended): expected equal "
                    'to info["action_mask"].',
                )

    def check_episode_return(self, step: int, info: dict, done: torch.Tensor, rewards_ok: bool) -> None:
        """``info["episode_return"]``: per group, each agent's summed rewards where its episode ended."""
        value = self.missing(
            info,
            "episode_return",
            "a dict {group: (num_envs, A_g)} valid where an episode ended. Fix: "
            "phalanx.envs.EpisodeStatistics(num_envs, device, (num_agents,)).",
        )
        if value is None:
            return
        ok = self.check_groups('step() info["episode_return"]', value, self.reward_dims(), torch.float32)
        if not (ok and rewards_ok and bool(done.any())):
            return
        rows = torch.nonzero(done).flatten()
        for name in self.groups:
            got = value[name].detach().cpu().to(torch.float64)[rows]
            expected = self.running[name][rows]
            wrong = first_true((got - expected).abs() > _RETURN_TOLERANCE * (1.0 + expected.abs()))
            if wrong is not None:
                i, agent = wrong
                want, have = float(expected[i, agent]), float(got[i, agent])
                self.fail(
                    f"episode_return:sum:{name}",
                    f'step() info["episode_return"][{name!r}] at step {step}, sub-env index {int(rows[i])}, '
                    f"agent {self.agent(name, agent)}: expected {want:.6g} (the sum of its rewards since the "
                    f"episode began), got {have:.6g}. Fix: add each step's reward and reset the sum when an "
                    "episode ends.",
                )
            self.returns[name].extend(float(v) for v in got.flatten())

    # -- seeding -----------------------------------------------------------------------------------
    def check_determinism(self) -> None:
        steps = min(_DETERMINISM_STEPS, self.num_steps)

        def play() -> list[tuple[str, int, Any]]:
            sample = self.make_action_sampler()
            obs, info = self.call(f"reset(seed={self.seed})", self.env.reset, seed=self.seed)
            self.masks = info.get("action_mask") if self.masked and isinstance(info, dict) else None
            trace = [("reset() obs", 0, obs)]
            for step in range(1, steps + 1):
                obs, rewards, *_, info = self.call(f"step(actions) at step {step}", self.env.step, sample())
                self.masks = info.get("action_mask") if self.masked and isinstance(info, dict) else None
                trace += [("obs", step, obs), ("rewards", step, rewards)]
            return trace

        for (what, step, a), (_, _, b) in zip(*self.replay_twice(play), strict=True):
            if not isinstance(a, dict) or not isinstance(b, dict) or set(a) != set(b):
                return
            for name in a:
                x, y = a[name], b[name]
                if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape:
                    return
                index = first_difference(x, y, leading=2)
                if index is not None:
                    row, agent = index
                    place = f"sub-env index {row}, agent {self.agent(name, agent)}"
                    self.seeding_failure(
                        steps, f"{what}[{name!r}]", step, place, x[row, agent], y[row, agent]
                    )
                    return


def check_multi_agent_env(env: Any, steps: int = 200, seed: int = 0) -> MultiAgentCheckReport:
    """Run ``env`` for ``steps`` random valid steps and verify the multi-agent VecEnv contract.

    Checks: the groups, spaces and ``metadata``; the types, shapes, dtypes and devices of everything
    ``reset`` and ``step`` return (observations, rewards, flags, ``info["state"]`` against
    ``state_space``, final observations and states, episode statistics, action masks); NaN and inf;
    ``final_obs`` / ``final_state`` equal to ``obs`` / ``state`` where no episode ended and different
    somewhere where one did (same-step autoreset); ``episode_return`` equal to each agent's summed
    rewards and ``episode_length`` to the steps counted; and that ``reset(seed=s)`` with the same actions
    reproduces the same observations and rewards.

    Raises :class:`~phalanx.errors.ContractError` listing every violation found (attribute
    ``violations``: one line each); returns a :class:`MultiAgentCheckReport` otherwise. The env is left
    reset or mid-episode; reset it before use.
    """
    checker = _Checker(env, int(steps), int(seed))
    num_steps = checker.check()
    mean_returns = {name: float(np.mean(v)) if v else float("nan") for name, v in checker.returns.items()}
    return checker.report(MultiAgentCheckReport, num_steps, mean_returns)
