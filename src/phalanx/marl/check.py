"""``check_multi_agent_env``: run a multi-agent env and report every way it breaks the contract.

The contract is :mod:`phalanx.marl.core`'s. Each violation is one line: what is wrong, where (method,
key, group, agent, sub-env index, step), expected against actual, and the fix. All violations found are
reported together in one :class:`~phalanx.errors.ContractError` (attribute ``violations``: the lines).
Exceptions raised by the env are reported as violations with their type, message and the line that
raised them. Actions are random and valid: within each group's space and, where the env has action
masks, among the allowed actions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from phalanx.envs.check import CheckerBase, _Abort, _equal, _fmt, _same_device
from phalanx.marl.core import AgentGroup, MultiAgentVecEnv

__all__ = ["MultiAgentCheckReport", "check_multi_agent_env"]

_REQUIRED = ("num_envs", "groups", "state_space", "device", "metadata", "reset", "step")
_DETERMINISM_STEPS = 20
_RETURN_TOLERANCE = 1e-3  # relative, of the summed rewards against info["episode_return"]


@dataclass
class MultiAgentCheckReport:
    """What :func:`check_multi_agent_env` saw on an env that passed."""

    env: str
    num_steps: int
    episodes: int
    mean_episode_return: dict[str, float]
    """Per group: the mean over its agents and the episodes that ended."""
    mean_episode_length: float
    warnings: list[str] = field(default_factory=list)


class _Checker(CheckerBase):
    def __init__(self, env: Any, steps: int, seed: int) -> None:
        super().__init__(env, seed)
        self.steps = steps
        self.groups: dict[str, AgentGroup] = {}
        self.state_dim: int | None = None
        self.masked = False

    def agent(self, group: str, index: int) -> str:
        agents = self.groups[group].agents
        return repr(agents[index]) if 0 <= index < len(agents) else f"#{index}"

    # -- static structure --------------------------------------------------------------------------
    def check_structure(self) -> None:
        env = self.env
        missing = [name for name in _REQUIRED if not hasattr(env, name)]
        if missing:
            self.fail(
                "attributes",
                f"{type(env).__name__} is missing {', '.join(missing)}: expected a "
                f"phalanx.marl.MultiAgentVecEnv with {', '.join(_REQUIRED)}. Fix: subclass MultiAgentVecEnv "
                "(or BatchedMultiAgentEnv) and call its __init__(num_envs, groups, state_space, device).",
            )
            raise _Abort
        if not isinstance(env, MultiAgentVecEnv):
            self.warnings.append(
                f"{type(env).__name__} is not a subclass of phalanx.marl.core.MultiAgentVecEnv (it has the "
                "attributes, so the check continues); subclass it so that trainers recognise it."
            )
        n = env.num_envs
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            self.fail("num_envs", f"num_envs: expected an int >= 1, got {n!r} ({type(n).__name__}).")
            raise _Abort
        self.n = int(n)
        try:
            self.device = torch.device(env.device)
        except (RuntimeError, TypeError):
            self.fail("device", f"device: expected a torch.device, got {env.device!r}.")
        groups = env.groups
        if not isinstance(groups, dict) or not groups:
            self.fail(
                "groups",
                f"groups: expected a non-empty dict {{name: AgentGroup}}, got {groups!r}. Fix: pass one "
                "AgentGroup per set of agents with equal spaces to MultiAgentVecEnv.__init__.",
            )
            raise _Abort
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
            raise _Abort
        agents = [agent for group in self.groups.values() for agent in group.agents]
        repeated = sorted({agent for agent in agents if agents.count(agent) > 1})
        if repeated:
            self.fail(
                "groups:unique",
                f"groups: agents {repeated} appear more than once (in one group or in several); "
                "expected every agent in exactly one group.",
            )
        state_space = env.state_space
        if not isinstance(state_space, gym.spaces.Box) or len(state_space.shape) != 1:
            self.fail("state_space", f"state_space: expected a flat Box (state_dim,), got {state_space!r}.")
        else:
            self.state_dim = int(state_space.shape[0])
            if state_space.dtype != np.float32:
                self.fail(
                    "state_space:dtype",
                    f"state_space.dtype: expected float32 (states are float32 tensors), got "
                    f"{state_space.dtype}.",
                )
        mode = env.metadata.get("autoreset_mode") if isinstance(env.metadata, dict) else None
        if mode != AutoresetMode.SAME_STEP and mode != AutoresetMode.SAME_STEP.value:
            self.fail(
                "autoreset_mode",
                f'metadata["autoreset_mode"]: expected AutoresetMode.SAME_STEP, got {mode!r}. Fix: inherit '
                "MultiAgentVecEnv.metadata and reset ended sub-envs inside step, with info['final_obs'].",
            )
        masked = getattr(env, "has_action_mask", False)
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
    def check_tensor(
        self, where: str, x: Any, shape: tuple[int, ...] | None, dtype: torch.dtype, group: str | None = None
    ) -> bool:
        """Check one returned tensor (finite if floating); return whether it has the expected shape."""
        if not isinstance(x, torch.Tensor):
            self.fail(
                f"{where}:type",
                f"{where}: expected a torch.Tensor, got {type(x).__name__}. Fix: return "
                "torch.as_tensor(x, device=env.device).",
            )
            return False
        ok = True
        if shape is not None and tuple(x.shape) != shape:
            self.fail(f"{where}:shape", f"{where}: expected shape {shape}, got {tuple(x.shape)}.")
            ok = False
        if x.dtype != dtype:
            self.fail(f"{where}:dtype", f"{where}: expected dtype {dtype}, got {x.dtype}. Fix: .to({dtype}).")
        if self.device is not None and not _same_device(x.device, self.device):
            self.fail(
                f"{where}:device",
                f"{where}: expected device {self.device} (env.device), got {x.device}. Fix: create the "
                "tensor on env.device.",
            )
        if x.is_floating_point() and x.numel() > 0 and x.dim() >= 1:
            finite = torch.isfinite(x)
            if not bool(finite.all()):
                bad = (~finite).nonzero()[0].tolist()
                place = f"sub-env index {bad[0]}"
                if group is not None and len(bad) > 1:
                    place += f", agent {self.agent(group, bad[1])}"
                row = x[tuple(bad[:2])] if group is not None and len(bad) > 1 else x[bad[0]]
                self.fail(
                    f"{where}:finite",
                    f"{where}{self.at}: expected finite values, got {_fmt(row)} at {place}. Fix: check the "
                    "dynamics for divisions by zero, exp/log overflow or unbounded state.",
                )
        return ok

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
            if name in value:
                shape = (self.n, self.groups[name].num_agents, *tail)
                ok = self.check_tensor(f"{where}[{name!r}]", value[name], shape, dtype, group=name) and ok
            else:
                ok = False
        return ok

    def obs_dims(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(group.observation_space.shape) for name, group in self.groups.items()}

    def mask_dims(self) -> dict[str, tuple[int, ...]]:
        return {name: (int(g.action_space.n),) for name, g in self.groups.items() if g.discrete}

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
        return self.check_tensor(where, state, shape, torch.float32)

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
    def make_sampler(self) -> Any:
        generator = torch.Generator().manual_seed(self.seed)
        device = self.device or torch.device("cpu")

        def sample(masks: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
            actions = {}
            for name, group in self.groups.items():
                space = group.action_space
                if group.discrete:
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
    def check_reset(self) -> dict[str, torch.Tensor] | None:
        result = self.call(f"reset(seed={self.seed})", self.env.reset, seed=self.seed)
        if not (isinstance(result, tuple) and len(result) == 2):
            got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
            self.fail("reset:tuple", f"reset(): expected a 2-tuple (obs, info), got {got}.")
            raise _Abort
        obs, info = result
        self.check_groups("reset() obs", obs, self.obs_dims(), torch.float32)
        if not isinstance(info, dict):
            self.fail("reset:info", f"reset() info: expected a dict, got {type(info).__name__}.")
            return None
        self.check_state('reset() info["state"]', info.get("state"))
        if self.masked:
            if self.check_masks('reset() info["action_mask"]', info.get("action_mask")):
                return info["action_mask"]
        return None

    def run(self, masks: dict[str, torch.Tensor] | None) -> tuple[int, dict[str, list[float]], list[int]]:
        """Step ``steps`` times with random actions; return (steps run, returns per group, lengths)."""
        sample = self.make_sampler()
        n = self.n
        obs_dims = self.obs_dims()
        counted = torch.zeros(n, dtype=torch.int64)  # steps since the last episode end, per row
        running = {name: torch.zeros(n, g.num_agents, dtype=torch.float64) for name, g in self.groups.items()}
        saw_end = saw_reset_differ = False
        returns: dict[str, list[float]] = {name: [] for name in self.groups}
        lengths: list[int] = []
        step = 0
        for step in range(1, self.steps + 1):
            self.at = f" at step {step}"
            result = self.call(f"step(actions) at step {step}", self.env.step, sample(masks))
            if not (isinstance(result, tuple) and len(result) == 5):
                got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
                self.fail(
                    "step:tuple",
                    f"step(): expected a 5-tuple (obs, rewards, terminated, truncated, info), got {got}.",
                )
                raise _Abort
            obs, rewards, terminated, truncated, info = result
            obs_ok = self.check_groups("step() obs", obs, obs_dims, torch.float32)
            rew_ok = self.check_groups(
                "step() rewards", rewards, {name: () for name in self.groups}, torch.float32
            )
            term_ok = self.check_tensor("step() terminated", terminated, (n,), torch.bool)
            trunc_ok = self.check_tensor("step() truncated", truncated, (n,), torch.bool)
            if not isinstance(info, dict):
                self.fail("step:info", f"step() info: expected a dict, got {type(info).__name__}.")
                continue
            state = info.get("state")
            state_ok = self.check_state('step() info["state"]', state)
            masks = None
            if self.masked and self.check_masks('step() info["action_mask"]', info.get("action_mask")):
                masks = info["action_mask"]
            if not (term_ok and trunc_ok):
                continue
            if terminated.dtype != torch.bool or truncated.dtype != torch.bool:
                continue
            done = (terminated | truncated).cpu()
            counted += 1
            if rew_ok:
                for name in self.groups:
                    running[name] += rewards[name].detach().cpu().to(torch.float64)
            # final observations, state and masks, against the returned ones where no episode ended
            final = info.get("final_obs")
            if final is None:
                self.fail(
                    "final_obs:missing",
                    'step() info["final_obs"]: missing; expected a dict like obs with the true next '
                    "observations of every row (the last ones of the finished episode where it ended).",
                )
            elif self.check_groups('step() info["final_obs"]', final, obs_dims, torch.float32) and obs_ok:
                for name in self.groups:
                    same = _equal(final[name], obs[name]).all(dim=2).cpu()  # (n, A)
                    row_same = same.all(dim=1)
                    wrong = ~done.view(-1, 1) & ~same
                    if bool(wrong.any()):
                        row, agent = wrong.nonzero()[0].tolist()
                        self.fail(
                            f"final_obs:not_ended:{name}",
                            f'step() info["final_obs"][{name!r}] at step {step}, sub-env index {row}, agent '
                            f"{self.agent(name, agent)} (episode not ended): expected equal to obs "
                            f"{_fmt(obs[name][row, agent])}, got {_fmt(final[name][row, agent])}. Fix: "
                            "final_obs must be the true next observation of every row.",
                        )
                    if bool(done.any()):
                        saw_end = True
                        saw_reset_differ = saw_reset_differ or bool((done & ~row_same).any())
            final_state = info.get("final_state")
            if self.check_state('step() info["final_state"]', final_state) and state_ok:
                same = _equal(final_state, state).all(dim=1).cpu()
                wrong = ~done & ~same
                if bool(wrong.any()):
                    row = int(wrong.nonzero()[0])
                    self.fail(
                        "final_state:not_ended",
                        f'step() info["final_state"] at step {step}, sub-env index {row} (episode not '
                        f'ended): expected equal to info["state"] {_fmt(state[row])}, got '
                        f"{_fmt(final_state[row])}.",
                    )
            if self.masked:
                final_masks = info.get("final_action_mask")
                if self.check_masks('step() info["final_action_mask"]', final_masks) and masks is not None:
                    for name in self.mask_dims():
                        same = (final_masks[name] == masks[name]).all(dim=2).cpu()
                        wrong = ~done.view(-1, 1) & ~same
                        if bool(wrong.any()):
                            row, agent = wrong.nonzero()[0].tolist()
                            self.fail(
                                f"final_action_mask:not_ended:{name}",
                                f'step() info["final_action_mask"][{name!r}] at step {step}, sub-env index '
                                f"{row}, agent {self.agent(name, agent)} (episode not ended): expected equal "
                                'to info["action_mask"].',
                            )
            mask = info.get("_final_obs")
            if mask is None:
                self.fail(
                    "_final_obs:missing",
                    'step() info["_final_obs"]: missing; expected the bool (num_envs,) mask '
                    "terminated | truncated.",
                )
            elif self.check_tensor('step() info["_final_obs"]', mask, (n,), torch.bool):
                differ = mask.cpu() != done
                if bool(differ.any()):
                    row = int(differ.nonzero()[0])
                    self.fail(
                        "_final_obs:value",
                        f'step() info["_final_obs"] at step {step}, sub-env index {row}: expected '
                        f"terminated | truncated = {bool(done[row])}, got {bool(mask[row])}.",
                    )
            # episode statistics
            ep_return, ep_length = info.get("episode_return"), info.get("episode_length")
            if ep_return is None:
                self.fail(
                    "episode_return:missing",
                    'step() info["episode_return"]: missing; expected a dict {group: (num_envs, A_g)} valid '
                    "where an episode ended. Fix: phalanx.envs.EpisodeStatistics(num_envs, device, "
                    "(num_agents,)).",
                )
                ret_ok = False
            else:
                ret_ok = self.check_groups(
                    'step() info["episode_return"]',
                    ep_return,
                    {name: () for name in self.groups},
                    torch.float32,
                )
            if ep_length is None:
                self.fail(
                    "episode_length:missing",
                    'step() info["episode_length"]: missing; expected a (num_envs,) int64 tensor valid where '
                    "an episode ended.",
                )
                len_ok = False
            else:
                len_ok = self.check_tensor('step() info["episode_length"]', ep_length, (n,), torch.int64)
            if bool(done.any()):
                rows = torch.nonzero(done).flatten()
                if len_ok:
                    got = ep_length.cpu()[rows]
                    mismatch = got != counted[rows]
                    if bool(mismatch.any()):
                        row = int(rows[int(mismatch.nonzero()[0])])
                        self.fail(
                            "episode_length:count",
                            f'step() info["episode_length"] at step {step}, sub-env index {row}: expected '
                            f"{int(counted[row])} (steps since that sub-env's previous episode ended), got "
                            f"{int(ep_length[row])}.",
                        )
                    lengths.extend(int(v) for v in got)
                if ret_ok and rew_ok:
                    for name in self.groups:
                        got = ep_return[name].detach().cpu().to(torch.float64)[rows]
                        expected = running[name][rows]
                        close = (got - expected).abs() <= _RETURN_TOLERANCE * (1.0 + expected.abs())
                        if not bool(close.all()):
                            i, agent = (~close).nonzero()[0].tolist()
                            row, who = int(rows[i]), self.agent(name, agent)
                            want, have = float(expected[i, agent]), float(got[i, agent])
                            self.fail(
                                f"episode_return:sum:{name}",
                                f'step() info["episode_return"][{name!r}] at step {step}, sub-env index '
                                f"{row}, agent {who}: expected {want:.6g} (the sum of its rewards since the "
                                f"episode began), got {have:.6g}. Fix: add each step's reward and reset the "
                                "sum when an episode ends.",
                            )
                        returns[name].extend(float(v) for v in got.flatten())
                counted[done] = 0
                for name in self.groups:
                    running[name][done] = 0.0
        if saw_end and not saw_reset_differ:
            self.fail(
                "autoreset",
                'step() autoreset: expected info["final_obs"] to differ from obs in some row where an '
                "episode ended (obs should be the first observation of the next episode), but every ended "
                "row had final_obs == obs. The env probably does not reset ended sub-envs inside step.",
            )
        if not saw_end:
            self.warnings.append(
                f"no episode ended in {step} steps x {n} sub-envs: autoreset, final_obs and the episode "
                "statistics were not verified. Raise steps, or give the env a time limit."
            )
        return step, returns, lengths

    def check_determinism(self) -> None:
        steps = min(_DETERMINISM_STEPS, self.steps)
        try:
            snapshot = copy.deepcopy(self.env.state_dict())
        except Exception:  # noqa: BLE001 - no usable state_dict: compare without restoring
            snapshot = None
        runs = []
        for _ in range(2):
            if snapshot is not None:
                self.call("load_state_dict(state)", self.env.load_state_dict, copy.deepcopy(snapshot))
            sample = self.make_sampler()
            obs, info = self.call(f"reset(seed={self.seed})", self.env.reset, seed=self.seed)
            masks = info.get("action_mask") if self.masked and isinstance(info, dict) else None
            trace = [("reset() obs", 0, obs)]
            for step in range(1, steps + 1):
                obs, rewards, *_, info = self.call(
                    f"step(actions) at step {step}", self.env.step, sample(masks)
                )
                masks = info.get("action_mask") if self.masked and isinstance(info, dict) else None
                trace += [("obs", step, obs), ("rewards", step, rewards)]
            runs.append(trace)
        for (what, step, a), (_, _, b) in zip(*runs, strict=True):
            if not isinstance(a, dict) or not isinstance(b, dict) or set(a) != set(b):
                return
            for name in a:
                x, y = a[name], b[name]
                if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape:
                    return
                same = _equal(x, y).reshape(x.shape[0], x.shape[1] if x.dim() > 1 else 1, -1).all(dim=2)
                if not bool(same.all()):
                    row, agent = (~same).nonzero()[0].tolist()
                    self.fail(
                        "determinism",
                        f"seeding: reset(seed={self.seed}) twice (state_dict() restored before each) with "
                        f"the same {steps} actions gave different {what}[{name!r}] at step {step}, sub-env "
                        f"index {row}, agent {self.agent(name, agent)}: first run {_fmt(x[row, agent])}, "
                        f"second run {_fmt(y[row, agent])}; expected identical. Fix: draw all randomness "
                        "from generators seeded in reset(seed=...), not from global RNGs.",
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
    num_steps, returns, lengths = 0, {}, []
    try:
        checker.check_structure()
        masks = checker.check_reset()
        num_steps, returns, lengths = checker.run(masks)
        checker.check_determinism()
    except _Abort:
        pass
    checker.raise_violations("multi-agent VecEnv contract", "phalanx.marl.core")
    return MultiAgentCheckReport(
        env=checker.name,
        num_steps=num_steps,
        episodes=len(lengths),
        mean_episode_return={name: float(np.mean(v)) if v else float("nan") for name, v in returns.items()},
        mean_episode_length=float(np.mean(lengths)) if lengths else float("nan"),
        warnings=checker.warnings,
    )
