"""Multi-agent adapters (PettingZoo, VMAS) and the multi-agent contract checker.

The tests of each adapter skip when its package is missing; the checker's and the grouping's tests
need neither. Worker processes start with forkserver / spawn: everything they build comes from
importable modules (this one included) or is pickled by value.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from phalanx.errors import ConfigError, ContractError, EnvError
from phalanx.marl.adapters import agent_prefix, group_agents
from phalanx.marl.check import check_multi_agent_env
from phalanx.marl.core import AgentGroup, BatchedMultiAgentEnv

MARL = "the PettingZoo adapter needs pettingzoo: pip install 'phalanx[marl]'"
MPE = "the MPE environments need mpe2: pip install mpe2"
VMAS = "the VMAS adapter needs vmas: pip install vmas"

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def random_actions(
    env: Any, generator: torch.Generator, masks: dict | None = None
) -> dict[str, torch.Tensor]:
    actions = {}
    for name, group in env.groups.items():
        shape = (env.num_envs, group.num_agents)
        if group.discrete:
            n = int(group.action_space.n)
            if masks is not None and name in masks:
                weights = masks[name].reshape(-1, n).float()
                actions[name] = torch.multinomial(weights, 1, generator=generator).reshape(shape)
            else:
                actions[name] = torch.randint(0, n, shape, generator=generator)
        else:
            low = torch.as_tensor(group.action_space.low)
            high = torch.as_tensor(group.action_space.high)
            actions[name] = low + (high - low) * torch.rand(
                (*shape, *group.action_space.shape), generator=generator
            )
    return actions


def rollout(env: Any, steps: int, seed: int = 5) -> list[torch.Tensor]:
    """Every tensor a seeded rollout with seeded random actions returns, in order."""
    generator = torch.Generator().manual_seed(seed)
    obs, info = env.reset(seed=seed)
    out = [*obs.values(), info["state"]]
    for _ in range(steps):
        obs, rewards, terminated, truncated, info = env.step(
            random_actions(env, generator, info.get("action_mask"))
        )
        out += [*obs.values(), *rewards.values(), terminated, truncated, info["state"], info["final_state"]]
        out += [*info["final_obs"].values(), *info["episode_return"].values(), info["episode_length"]]
    return out


# ------------------------------------------------------------------------------------------------------
# Grouping (no optional package needed)


def test_agent_names_group_by_prefix_and_equal_spaces():
    assert agent_prefix("adversary_2") == "adversary" and agent_prefix("agent") == "agent"
    assert agent_prefix("red_team_10") == "red_team" and agent_prefix("agent_x") == "agent_x"
    names = ["adversary_0", "adversary_1", "adversary_2", "agent_0"]
    assert group_agents(names, lambda agent: 0) == {
        "adversary": ("adversary_0", "adversary_1", "adversary_2"),
        "agent": ("agent_0",),
    }
    # same prefix, different spaces: split, the first keeps the prefix; group order = first agent's order
    spaces = {"a_0": 1, "b_0": 1, "a_1": 2, "a_2": 1}
    assert group_agents(list(spaces), spaces.__getitem__) == {
        "a": ("a_0", "a_2"),
        "b": ("b_0",),
        "a_g1": ("a_1",),
    }


# ------------------------------------------------------------------------------------------------------
# The checker, on a small batched env written here (no optional package needed)


class Walkers(BatchedMultiAgentEnv):
    """Two walkers (Discrete(3): left, stay, right) and a watcher (Box(-1, 1, (1,))) on a line, 6 steps."""

    state_names = ("pos",)

    def __init__(self, num_envs: int = 4, bug: str | None = None) -> None:
        box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        groups = {
            "walker": AgentGroup(("walker_0", "walker_1"), box, gym.spaces.Discrete(3)),
            "watcher": AgentGroup(("watcher_0",), box, gym.spaces.Box(-1.0, 1.0, (1,), np.float32)),
        }
        super().__init__(
            num_envs, groups, gym.spaces.Box(-np.inf, np.inf, (6,), np.float32), max_episode_steps=6
        )
        self.bug = bug
        self.pos = torch.zeros(num_envs, 3)

    def _reset_rows(self, mask):
        self.pos = torch.where(mask.view(-1, 1), self.uniform(-1.0, 1.0, (self.num_envs, 3)), self.pos)

    def _advance(self, actions):
        self.pos[:, :2] += actions["walker"].float() - 1.0
        self.pos[:, 2] += actions["watcher"][:, 0, 0]
        rewards = {"walker": -self.pos[:, :2].abs(), "watcher": -self.pos[:, 2:].abs()}
        return rewards, self.pos.abs().max(dim=1).values > 4.0

    def _observe(self):
        obs = torch.stack([self.pos, self.pos.roll(1, dims=1)], dim=2)  # (N, 3, 2)
        return {"walker": obs[:, :2].clone(), "watcher": obs[:, 2:].clone()}

    def step(self, actions):
        obs, rewards, terminated, truncated, info = super().step(actions)
        if self.bug == "final_obs":
            info["final_obs"]["walker"][~info["_final_obs"], 1] += 1.0
        elif self.bug == "episode_return":
            info["episode_return"]["watcher"] = info["episode_return"]["watcher"] * 2.0 + 1.0
        elif self.bug == "dtype":
            rewards = {**rewards, "walker": rewards["walker"].double()}
        elif self.bug == "state":
            info["state"] = info["state"][:, :5]
        elif self.bug == "nan":
            obs["watcher"][1, 0, 1] = float("nan")
        elif self.bug == "keys":
            rewards = {"walker": rewards["walker"]}
        return obs, rewards, terminated, truncated, info


def test_checker_passes_a_correct_env():
    report = check_multi_agent_env(Walkers(), steps=30)
    assert report.episodes > 0 and report.mean_episode_length <= 6 and report.warnings == []
    assert set(report.mean_episode_return) == {"walker", "watcher"}


@pytest.mark.parametrize(
    ("bug", "expected"),
    [
        (
            "final_obs",
            r"step\(\) info\[\"final_obs\"\]\['walker'\] at step 1, sub-env index 0, agent 'walker_1' "
            r"\(episode not ended\): expected equal to obs",
        ),
        (
            "episode_return",
            r"step\(\) info\[\"episode_return\"\]\['watcher'\] at step \d+, sub-env index \d, agent "
            r"'watcher_0': expected -?[\d.]+ \(the sum of its rewards since the episode began\), got",
        ),
        ("dtype", r"step\(\) rewards\['walker'\]: expected dtype torch.float32, got torch.float64"),
        ("state", r"step\(\) info\[\"state\"\]: expected shape \(4, 6\), got \(4, 5\)"),
        (
            "nan",
            r"step\(\) obs\['watcher'\] at step 1: expected finite values, got \[.*nan\] at sub-env index 1, "
            r"agent 'watcher_0'",
        ),
        (
            "keys",
            r"step\(\) rewards: expected the keys \['walker', 'watcher'\] \(one per group\), "
            r"got \['walker'\]",
        ),
    ],
)
def test_checker_names_what_where_expected_and_actual(bug, expected):
    with pytest.raises(ContractError, match=expected) as error:
        check_multi_agent_env(Walkers(bug=bug), steps=30)
    assert "breaks the multi-agent VecEnv contract" in str(error.value)


def test_checker_reports_every_violation_and_unseeded_randomness():
    class Unseeded(Walkers):
        def _reset_rows(self, mask):  # the global RNG, not the env's generator
            self.pos = torch.where(mask.view(-1, 1), torch.rand(self.num_envs, 3), self.pos)

        def step(self, actions):
            obs, rewards, terminated, truncated, info = super().step(actions)
            del info["final_state"]
            return obs, rewards, terminated, truncated, info

    with pytest.raises(ContractError) as error:
        check_multi_agent_env(Unseeded(), steps=10)
    violations = error.value.violations
    assert len(violations) == 2
    assert any('step() info["final_state"]: missing' in line for line in violations)
    assert any(
        line.startswith("seeding: reset(seed=0) twice") and "agent 'walker_0'" in line for line in violations
    )


def test_checker_rejects_what_is_not_a_multi_agent_env():
    with pytest.raises(ContractError, match="is missing num_envs, groups, state_space"):
        check_multi_agent_env(object())


# ------------------------------------------------------------------------------------------------------
# Missing packages: clear errors (no optional package needed)


def test_missing_pettingzoo_says_how_to_install(monkeypatch):
    from phalanx.marl.adapters import PettingZooVecEnv

    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(ConfigError, match=r"pip install 'phalanx\[marl\]'"):
        PettingZooVecEnv(lambda: None, num_envs=2)


def test_missing_vmas_says_how_to_install(monkeypatch):
    from phalanx.marl.adapters import VMASVecEnv

    monkeypatch.setitem(sys.modules, "vmas", None)
    with pytest.raises(ConfigError, match=r"pip install vmas"):
        VMASVecEnv("balance", num_envs=2)


# ------------------------------------------------------------------------------------------------------
# PettingZoo: custom parallel envs (need pettingzoo only)


def _parallel_env_base() -> type:
    pettingzoo = pytest.importorskip("pettingzoo", reason=MARL)
    return pettingzoo.ParallelEnv


try:
    from pettingzoo import ParallelEnv as _ParallelEnv
except ImportError:  # the tests that use these envs skip
    _ParallelEnv = object


class Elimination(_ParallelEnv):
    """Scouts 0 and 1 and a base; scout_1 is eliminated at step ``die_at``, all terminate at ``episode``.

    Observations (``obs``="masked") are PettingZoo's masked dicts: ``[t, agent index, offset]`` and a
    mask that forbids action 2 at even t; the env raises on a forbidden action. ``obs="discrete"``: t
    as a ``Discrete(8, start=1)`` (t + 1), no masks; ``obs="image"``: a 2-D Box (unsupported). Rewards:
    action + agent index. ``crash_at``: every copy raises at that step.
    """

    metadata = {"name": "elimination_v0"}

    def __init__(
        self,
        episode: int = 4,
        die_at: int = 2,
        crash_at: int | None = None,
        obs: str = "masked",
        action_start: int = 0,
    ):
        self.action_start = action_start  # actions are Discrete(3, start=action_start); others raise
        self.possible_agents = ["scout_0", "scout_1", "base"]
        self.agents: list[str] = []
        self.episode, self.die_at, self.crash_at, self.obs = episode, die_at, crash_at, obs
        self.rng = np.random.default_rng()
        self.t, self.offset = 0, 0.0

    def observation_space(self, agent):
        if self.obs == "image":
            return gym.spaces.Box(-10, 10, (2, 3), np.float32)
        if self.obs == "discrete":
            return gym.spaces.Discrete(8, start=1)
        return gym.spaces.Dict(
            {
                "observation": gym.spaces.Box(-10, 100, (3,), np.float32),
                "action_mask": gym.spaces.MultiBinary(3),
            }
        )

    def action_space(self, agent):
        return gym.spaces.Discrete(3, start=self.action_start)

    def _mask(self):
        return np.array([1, 1, self.t % 2 if self.obs == "masked" else 1], np.int8)

    def _obs(self, agent):
        if self.obs == "discrete":
            return self.t + 1
        index = self.possible_agents.index(agent)
        return {
            "observation": np.array([self.t, index, self.offset], np.float32),
            "action_mask": self._mask(),
        }

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.offset = 0, float(self.rng.uniform(-1.0, 1.0))
        self.agents = list(self.possible_agents)
        return {agent: self._obs(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions):
        actions = {agent: int(action) - self.action_start for agent, action in actions.items()}
        for agent in self.agents:
            if not 0 <= actions[agent] < 3:
                raise ValueError(f"{agent}: action {actions[agent] + self.action_start} is not in its space")
            if not self._mask()[actions[agent]]:
                raise ValueError(f"{agent}: action {actions[agent]} is masked at t={self.t}")
        self.t += 1
        if self.crash_at == self.t:
            raise RuntimeError("injected fault")
        rewards = {agent: float(actions[agent]) + self.possible_agents.index(agent) for agent in self.agents}
        terminations = {
            agent: self.t >= self.episode or (agent == "scout_1" and self.t == self.die_at)
            for agent in self.agents
        }
        truncations = {agent: False for agent in self.agents}
        obs = {agent: self._obs(agent) for agent in self.agents}
        infos = {agent: {} for agent in self.agents}
        self.agents = [agent for agent in self.agents if not terminations[agent]]
        return obs, rewards, terminations, truncations, infos


def test_masked_dict_observations_eliminations_and_returns():
    _parallel_env_base()
    from phalanx.marl.adapters import PettingZooVecEnv

    env = PettingZooVecEnv(Elimination, num_envs=3)
    assert list(env.groups) == ["scout", "base"] and env.groups["scout"].agents == ("scout_0", "scout_1")
    assert env.has_action_mask and env.state_space.shape == (9,)  # no state(): the observations
    obs, info = env.reset(seed=1)
    assert info["action_mask"]["scout"].shape == (3, 2, 3)
    assert info["action_mask"]["scout"][:, :, 2].logical_not().all()  # t = 0: action 2 forbidden
    actions = {"scout": torch.tensor([[1, 1]] * 3), "base": torch.tensor([[0]] * 3)}
    returns = []
    for t in range(1, 5):
        obs, rewards, terminated, truncated, info = env.step(actions)
        returns.append(rewards["scout"])
        scout_1 = info["final_obs"]["scout"][:, 1]
        if t <= 2:  # alive, and at t = 2 its last observation and reward
            assert scout_1[:, 0].eq(t).all() and rewards["scout"][:, 1].eq(2.0).all()
        else:  # eliminated: zeros, reward 0, every action allowed, until the episode ends
            assert scout_1.eq(0).all() and rewards["scout"][:, 1].eq(0).all()
            assert info["final_action_mask"]["scout"][:, 1].all()
        assert torch.equal(info["state"][:, :3], obs["scout"][:, 0])
        assert (terminated.all() and not truncated.any()) if t == 4 else not (terminated | truncated).any()
    assert obs["scout"][:, :, 0].eq(0).all() and obs["scout"][:, 1, 1].eq(1).all()  # the next episode
    assert info["final_obs"]["base"][:, 0, 0].eq(4).all()
    assert torch.equal(info["episode_return"]["scout"], torch.stack(returns).sum(0))
    assert info["episode_return"]["scout"][0].tolist() == [4.0, 4.0] and info["episode_length"].eq(4).all()
    check_multi_agent_env(env, steps=12)
    env.close()


def test_discrete_observations_are_one_hot():
    _parallel_env_base()
    from phalanx.marl.adapters import PettingZooVecEnv

    env = PettingZooVecEnv(functools.partial(Elimination, obs="discrete"), num_envs=2)
    assert not env.has_action_mask and env.groups["base"].observation_space == gym.spaces.Box(0, 1, (8,))
    obs, _ = env.reset(seed=0)
    assert obs["scout"][:, :, 0].eq(1).all() and obs["scout"].sum(2).eq(1).all()
    zeros = {"scout": torch.zeros(2, 2, dtype=torch.int64), "base": torch.zeros(2, 1, dtype=torch.int64)}
    obs, *_ = env.step(zeros)
    assert obs["base"][:, 0].argmax(1).eq(1).all() and obs["scout"][:, 1].argmax(1).eq(1).all()  # t = 1
    env.step(zeros)
    obs, *_ = env.step(zeros)  # t = 3: scout_1 was eliminated at t = 2
    assert obs["base"][:, 0].argmax(1).eq(3).all() and obs["scout"][:, 1].eq(0).all()
    check_multi_agent_env(env, steps=8)


def test_aec_envs_and_unsupported_spaces_are_refused_with_the_fix():
    _parallel_env_base()
    pytest.importorskip("mpe2", reason=MPE)
    from mpe2 import simple_spread_v3

    from phalanx.marl.adapters import PettingZooVecEnv

    with pytest.raises(ConfigError) as error:
        PettingZooVecEnv(simple_spread_v3.env, num_envs=2)
    message = str(error.value)
    assert "returned an AEC env" in message and "pettingzoo.utils.conversions.aec_to_parallel(env)" in message
    assert "`parallel_env` (mpe2.simple_spread.simple_spread.parallel_env, not its `env`)" in message
    with pytest.raises(ConfigError, match=r"not an env"):
        PettingZooVecEnv(simple_spread_v3.parallel_env(), num_envs=2)
    with pytest.raises(
        ConfigError, match=r"agent 'scout_0' has observation space Box\(-10.0, 10.0, \(2, 3\)"
    ):
        PettingZooVecEnv(functools.partial(Elimination, obs="image"), num_envs=2)


# ------------------------------------------------------------------------------------------------------
# PettingZoo: MPE2


def _mpe():
    _parallel_env_base()
    return pytest.importorskip("mpe2", reason=MPE)


@pytest.mark.parametrize("continuous", [False, True])
def test_mpe_passes_the_checker_in_process(continuous):
    _mpe()
    from mpe2 import simple_spread_v3, simple_tag_v3

    from phalanx.marl.adapters import PettingZooVecEnv

    for factory in (simple_spread_v3.parallel_env, simple_tag_v3.parallel_env):
        env = PettingZooVecEnv(
            functools.partial(factory, continuous_actions=continuous, max_cycles=8), num_envs=3
        )
        report = check_multi_agent_env(env, steps=20)
        assert report.episodes == 6 and report.mean_episode_length == 8
        env.close()


def test_simple_tag_groups_state_and_faithful_steps_and_autoreset():
    _mpe()
    from mpe2 import simple_tag_v3

    from phalanx.marl.adapters import PettingZooVecEnv

    factory = functools.partial(simple_tag_v3.parallel_env, max_cycles=3)
    env = PettingZooVecEnv(factory, num_envs=2, seed=7)
    assert {name: group.agents for name, group in env.groups.items()} == {
        "adversary": ("adversary_0", "adversary_1", "adversary_2"),
        "agent": ("agent_0",),
    }
    assert env.groups["adversary"].observation_space.shape == (16,)
    assert env.groups["agent"].observation_space.shape == (14,) and env.state_space.shape == (62,)
    # copy 1 is the raw env reset with seed 7 + 1, stepped with the same actions, autoreset without a seed
    raw = factory()
    raw_obs, _ = raw.reset(seed=8)
    obs, info = env.reset()  # the constructor's seed
    assert np.array_equal(obs["agent"][1, 0].numpy(), raw_obs["agent_0"])
    assert np.array_equal(info["state"][1].numpy(), raw.state())
    actions = {"adversary": torch.tensor([[1, 2, 3]] * 2), "agent": torch.tensor([[4]] * 2)}
    raw_actions = dict(zip(raw.possible_agents, [1, 2, 3, 4], strict=True))
    returns = torch.zeros(4)
    for t in range(1, 4):
        obs, rewards, terminated, truncated, info = env.step(actions)
        raw_obs, raw_rewards, *_ = raw.step(raw_actions)
        step_rewards = torch.tensor(
            [raw_rewards[agent] for agent in raw.possible_agents], dtype=torch.float32
        )
        assert torch.equal(torch.cat([rewards["adversary"][1], rewards["agent"][1]]), step_rewards)
        returns += step_rewards
        final = info["final_obs"]
        assert np.array_equal(final["adversary"][1, 2].numpy(), raw_obs["adversary_2"])
        if t < 3:
            assert not (terminated | truncated).any() and torch.equal(obs["agent"], final["agent"])
    # max_cycles: every copy truncated and reset in the same step
    assert truncated.all() and not terminated.any() and info["_final_obs"].all() and not raw.agents
    assert np.array_equal(info["final_state"][1].numpy(), raw.state())
    assert not torch.equal(obs["agent"], final["agent"])
    episode_return = torch.cat([info["episode_return"]["adversary"][1], info["episode_return"]["agent"][1]])
    assert torch.allclose(episode_return, returns) and info["episode_length"].eq(3).all()
    raw_obs, _ = raw.reset()  # the autoreset continues the copy's random stream
    assert np.array_equal(obs["adversary"][1, 0].numpy(), raw_obs["adversary_0"])
    assert np.array_equal(info["state"][1].numpy(), raw.state())
    env.close()


# ------------------------------------------------------------------------------------------------------
# PettingZoo: worker processes


def test_workers_pass_the_checker_and_match_the_in_process_trajectories():
    _mpe()
    from mpe2 import simple_spread_v3, simple_tag_v3

    from phalanx.marl.adapters import PettingZooVecEnv

    factory = functools.partial(simple_tag_v3.parallel_env, max_cycles=10)
    local = PettingZooVecEnv(factory, num_envs=4)
    workers = PettingZooVecEnv(factory, num_envs=4, num_workers=2)
    try:
        assert len(workers.pids) == 2
        first, second = rollout(local, 25), rollout(workers, 25)
        assert len(first) == len(second)
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
        check_multi_agent_env(workers, steps=12)
    finally:
        workers.close()
        local.close()
    spread = PettingZooVecEnv(
        functools.partial(simple_spread_v3.parallel_env, continuous_actions=True, max_cycles=5),
        2,
        num_workers=2,
    )
    try:
        assert check_multi_agent_env(spread, steps=12).episodes == 4
    finally:
        spread.close()


def test_workers_with_masks_and_eliminations_match_in_process():
    _parallel_env_base()
    from phalanx.marl.adapters import PettingZooVecEnv

    local = PettingZooVecEnv(Elimination, num_envs=4)
    workers = PettingZooVecEnv(Elimination, num_envs=4, num_workers=2)
    try:
        first, second = rollout(local, 10), rollout(workers, 10)
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    finally:
        workers.close()
        local.close()


def test_a_crashing_copy_raises_env_error_naming_worker_and_copy_and_closes():
    _parallel_env_base()
    from phalanx.marl.adapters import PettingZooVecEnv

    env = PettingZooVecEnv(functools.partial(Elimination, crash_at=2, episode=50), num_envs=4, num_workers=2)
    pids = env.pids
    env.reset(seed=0)
    actions = {"scout": torch.zeros(4, 2, dtype=torch.int64), "base": torch.zeros(4, 1, dtype=torch.int64)}
    env.step(actions)
    start = time.monotonic()
    with pytest.raises(EnvError) as error:
        env.step(actions)
    assert time.monotonic() - start < 10.0
    message = str(error.value)
    assert "PettingZooVecEnv('elimination_v0')" in message and "RuntimeError: injected fault" in message
    # every copy raises at the same step: whichever worker answers first is the one named
    assert re.search(r"worker (0 \(pid \d+, copies 0\.\.1\)|1 \(pid \d+, copies 2\.\.3\))", message), message
    assert re.search(r"in copy [02] during step", message), message
    assert env.closed and wait_gone(pids) == []
    with pytest.raises(EnvError, match="closed"):
        env.step(actions)


@linux_only
def test_close_and_garbage_collection_leave_no_worker():
    _parallel_env_base()
    import gc

    from phalanx.marl.adapters import PettingZooVecEnv

    env = PettingZooVecEnv(Elimination, num_envs=2, num_workers=2)
    pids = env.pids
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    env.close()
    assert wait_gone(pids) == []
    env = PettingZooVecEnv(Elimination, num_envs=2, num_workers=2)
    pids = env.pids
    del env
    gc.collect()
    assert wait_gone(pids) == []


def _shifted_elimination(num_envs, device="cpu", obs="masked"):
    from phalanx.marl.adapters import PettingZooVecEnv

    factory = functools.partial(Elimination, obs=obs, action_start=-2)
    return PettingZooVecEnv(factory, num_envs=num_envs, device=device)


@pytest.mark.parametrize(("algo", "obs"), [("mappo", "discrete"), ("qmix", "masked")])
def test_multi_agent_actions_reach_the_env_inside_a_space_that_starts_away_from_0(tmp_path, algo, obs):
    """Elimination's actions are Discrete(3, start=-2) and it raises on any other: training (qmix with its
    action masks, read by index), evaluation and the deployed agent stay inside the space."""
    _parallel_env_base()
    import phalanx
    from phalanx.marl.registry import _REGISTERED, register_multi_agent_env

    register_multi_agent_env(
        "ShiftedElimination-v0", functools.partial(_shifted_elimination, obs=obs), overwrite=True
    )
    try:
        settings = dict(num_envs=4, total_steps=256, eval_every=128, eval_episodes=2, log_every=64)
        if algo == "qmix":
            settings.update(learning_starts=32, batch_size=16)
        config = phalanx.make_config(algo, "ShiftedElimination-v0", run_dir=str(tmp_path / "run"), **settings)
        result = phalanx.train(config, show_progress=False)
        assert result.summary["error"] is None and result.summary["total_steps"] >= 256
        agent = phalanx.load_agent(result.run_dir)
        assert agent.evaluate(episodes=2).mean is not None  # steps the env, which raises outside the space
    finally:
        _REGISTERED.pop("ShiftedElimination-v0", None)


@linux_only
def test_workers_exit_when_the_main_process_is_killed(tmp_path):
    _parallel_env_base()
    script = textwrap.dedent(
        """
        import sys, time
        sys.path.insert(0, sys.argv[1])
        from test_marl_adapters import Elimination
        from phalanx.marl.adapters import PettingZooVecEnv
        if __name__ == "__main__":
            env = PettingZooVecEnv(Elimination, num_envs=2, num_workers=2)
            print(" ".join(map(str, env.pids)), flush=True)
            time.sleep(600)
        """
    )
    path = tmp_path / "main.py"
    path.write_text(script)
    process = subprocess.Popen(
        [sys.executable, str(path), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        pids = [int(pid) for pid in process.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    finally:
        process.kill()
        process.wait()
    assert wait_gone(pids) == []


# ------------------------------------------------------------------------------------------------------
# VMAS


@pytest.mark.parametrize(("scenario", "continuous"), [("balance", True), ("navigation", False)])
def test_vmas_passes_the_checker(scenario, continuous):
    pytest.importorskip("vmas", reason=VMAS)
    from phalanx.marl.adapters import VMASVecEnv

    env = VMASVecEnv(scenario, num_envs=4, seed=0, max_steps=8, continuous_actions=continuous)
    assert list(env.groups) == ["agent"] and env.groups["agent"].discrete is not continuous
    report = check_multi_agent_env(env, steps=20)
    assert report.episodes == 8 and report.mean_episode_length == 8


def test_vmas_autoresets_ended_rows_in_the_same_step():
    pytest.importorskip("vmas", reason=VMAS)
    from phalanx.marl.adapters import VMASVecEnv

    env = VMASVecEnv("balance", num_envs=3, max_steps=3, seed=1)
    obs, info = env.reset()
    assert obs["agent"].shape == (3, 3, 16) and info["state"].shape == (3, 48)
    total = torch.zeros(3, 3)
    for t in range(1, 4):
        obs, rewards, terminated, truncated, info = env.step({"agent": torch.zeros(3, 3, 2)})
        total += rewards["agent"]
        done = terminated | truncated
        if t < 3:
            assert not done.any() and torch.equal(obs["agent"], info["final_obs"]["agent"])
    assert done.all() and info["_final_obs"].all() and info["episode_length"].eq(3).all()
    assert not torch.equal(obs["agent"], info["final_obs"]["agent"])
    assert torch.equal(info["final_state"], info["final_obs"]["agent"].flatten(1))
    assert torch.allclose(info["episode_return"]["agent"], total)
    with pytest.raises(ConfigError, match="dict_spaces"):
        VMASVecEnv("balance", num_envs=2, dict_spaces=True)


def test_mappo_trains_on_a_pettingzoo_env_in_worker_processes(tmp_path):
    pytest.importorskip("mpe2", reason="mpe2 is not installed (pip install 'phalanx[marl]')")
    import phalanx

    config = phalanx.make_config(
        "mappo",
        "pettingzoo:mpe2.simple_spread_v3",
        num_envs=4,
        num_workers=2,
        total_steps=200,
        eval_episodes=2,
        eval_every=0,
        run_dir=str(tmp_path / "run"),
    )
    result = phalanx.train(config, show_progress=False)
    assert result.summary["total_steps"] == 200 and set(result.summary["eval_agent_returns"]) == {
        "agent_0",
        "agent_1",
        "agent_2",
    }
