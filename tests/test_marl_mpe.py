"""The batched MPE tasks (``phalanx.marl.mpe``) against mpe2's parallel envs, and their VecEnv contract.

Parity steps a few rows of our env and one mpe2 ``parallel_env`` per row in lockstep with the same random
actions. States are synchronised only at episode starts (our freshly reset row is written into the
reference's world), so any drift of the physics, rewards or observations shows up; one episode starts
with every entity pulled towards the centre so that agents and obstacles collide.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from phalanx.errors import ConfigError, EnvError
from phalanx.marl.mpe import MPE_ENVS, ParticleWorldEnv, SimpleSpread, SimpleTag

ATOL = 5e-5  # float32 against float64: the largest difference seen is ~1e-5


def _random_actions(env: ParticleWorldEnv, rng: np.random.Generator) -> dict[str, np.ndarray]:
    actions = {}
    for name, group in env.groups.items():
        if group.discrete:
            actions[name] = rng.integers(0, 5, (env.num_envs, group.num_agents))
        else:
            actions[name] = rng.uniform(0.0, 1.0, (env.num_envs, group.num_agents, 5)).astype(np.float32)
    return actions


def actions_as_tensors(actions: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.as_tensor(value) for name, value in actions.items()}


def _per_agent(env: ParticleWorldEnv, groups: dict[str, Any], row: int) -> dict[str, np.ndarray]:
    """``{agent name: groups[g][row, i]}`` as NumPy."""
    return {
        agent: np.asarray(groups[name][row, i].cpu().numpy())
        for name, group in env.groups.items()
        for i, agent in enumerate(group.agents)
    }


def _write_reference(env: ParticleWorldEnv, row: int, reference: Any) -> None:
    world = reference.unwrapped.world
    position = env.position[row].double().cpu().numpy()
    velocity = env.velocity[row].double().cpu().numpy()
    for e, entity in enumerate(world.entities):
        entity.state.p_pos = position[e].copy()
        entity.state.p_vel = velocity[e].copy()


def _touching(reference: Any) -> bool:
    """Whether two colliding entities of the reference's world overlap."""
    colliders = [e for e in reference.unwrapped.world.entities if e.collide]
    return any(
        np.linalg.norm(a.state.p_pos - b.state.p_pos) < a.size + b.size
        for i, a in enumerate(colliders)
        for b in colliders[i + 1 :]
    )


PARITY_CASES = [
    (SimpleSpread, {}),
    (SimpleSpread, {"N": 4, "local_ratio": 0.3, "max_cycles": 10}),
    (SimpleTag, {}),
    (SimpleTag, {"num_good": 2, "num_adversaries": 2, "num_obstacles": 1, "max_cycles": 15}),
]


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
@pytest.mark.parametrize(("cls", "kwargs"), PARITY_CASES, ids=["spread", "spread-N4", "tag", "tag-2v2"])
def test_parity_with_mpe2(cls, kwargs, continuous):
    pytest.importorskip("mpe2", reason="the parity tests compare with mpe2's reference envs")
    rows, episodes = (0, 2), 3
    env = cls(num_envs=3, continuous_actions=continuous, **kwargs)
    module = importlib.import_module(f"mpe2.{env.reference_id}")
    references = [module.parallel_env(**env.reference_kwargs) for _ in rows]
    for reference in references:
        assert reference.possible_agents == env.agents
        for group in env.groups.values():
            for agent in group.agents:
                assert reference.observation_space(agent).shape == group.observation_space.shape
                space = reference.action_space(agent)
                assert space == group.action_space, (space, group.action_space)
        assert reference.state_space.shape == env.state_space.shape
        reference.reset(seed=0)

    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=1)
    state = info["state"]
    touched = False
    for episode in range(episodes):
        for row, reference in zip(rows, references, strict=True):
            reference.reset()
            _write_reference(env, row, reference)
            expected = {agent: reference.unwrapped.observe(agent) for agent in reference.agents}
            for agent, value in _per_agent(env, obs, row).items():
                np.testing.assert_allclose(value, expected[agent], atol=ATOL, err_msg=f"start obs {agent}")
            np.testing.assert_allclose(state[row].numpy(), reference.state(), atol=ATOL)
        if episode == episodes - 1:  # crowd every entity near the centre: collisions
            env.position[list(rows)] *= 0.25
            for row, reference in zip(rows, references, strict=True):
                _write_reference(env, row, reference)

        for step in range(env.max_cycles):
            actions = _random_actions(env, rng)
            obs, rewards, terminated, truncated, info = env.step(actions)
            state = info["state"]
            for row, reference in zip(rows, references, strict=True):
                ref_actions = _per_agent(env, actions_as_tensors(actions), row)
                ref_obs, ref_rewards, ref_term, ref_trunc, _ = reference.step(ref_actions)
                where = f"episode {episode} step {step} row {row}"
                final_obs = _per_agent(env, info["final_obs"], row)
                ours_rewards = _per_agent(env, rewards, row)
                for agent in env.agents:
                    np.testing.assert_allclose(final_obs[agent], ref_obs[agent], atol=ATOL, err_msg=where)
                    np.testing.assert_allclose(
                        ours_rewards[agent], ref_rewards[agent], atol=ATOL, err_msg=where
                    )
                np.testing.assert_allclose(info["final_state"][row].numpy(), reference.state(), atol=ATOL)
                assert not terminated[row] and not any(ref_term.values()), where
                assert bool(truncated[row]) == all(ref_trunc.values()) == (step == env.max_cycles - 1), where
                assert bool(info["_final_obs"][row]) == bool(truncated[row])
                touched |= _touching(reference)
    assert touched, "no collision happened: the parity run did not exercise the contact forces"


def test_float64_tracks_mpe2_closely():
    pytest.importorskip("mpe2", reason="the parity tests compare with mpe2's reference envs")
    from mpe2 import simple_tag_v3

    env = SimpleTag(num_envs=1, continuous_actions=True, dtype=torch.float64, max_cycles=25)
    reference = simple_tag_v3.parallel_env(**env.reference_kwargs)
    reference.reset(seed=0)
    env.reset(seed=2)
    env.position *= 0.3
    _write_reference(env, 0, reference)
    rng = np.random.default_rng(1)
    for _ in range(env.max_cycles):
        world = reference.unwrapped.world
        actions = _random_actions(env, rng)
        env.step(actions)
        reference.step(_per_agent(env, actions_as_tensors(actions), 0))
        if not reference.agents:
            break
        ours = env.position[0].numpy()
        theirs = np.stack([entity.state.p_pos for entity in world.entities])
        np.testing.assert_allclose(ours, theirs, atol=1e-9)


def test_tag_boundary_penalty():
    """Every piece of mpe2's bound(|x|): 0 below 0.9, linear to 1, exponential, capped at 10."""
    xs = [0.5, 0.95, 1.0, 1.2, 2.0, -3.0]
    env = SimpleTag(num_envs=len(xs), num_obstacles=0)
    env.reset(seed=0)
    env.position[:, :3] = torch.tensor([[-3.0, -3.0], [-3.0, 0.0], [-3.0, 3.0]])  # adversaries, far away
    env.position[:, 3, 0] = torch.tensor(xs)
    env.position[:, 3, 1] = -0.3
    _, rewards, *_ = env.step({"adversary": torch.zeros(6, 3, dtype=torch.int64), "agent": torch.zeros(6, 1)})
    expected = [0.0, -0.5, -1.0, -np.exp(0.4), -np.exp(2.0), -10.0]
    np.testing.assert_allclose(rewards["agent"][:, 0].numpy(), expected, rtol=1e-5, atol=1e-5)
    assert (rewards["adversary"] == 0).all()
    try:
        from mpe2 import simple_tag_v3
    except ImportError:
        return
    reference = simple_tag_v3.parallel_env(num_obstacles=0)
    for row in range(len(xs)):
        reference.reset(seed=0)
        env.position[row, 3, 0] = xs[row]  # back to where the no-op step found it
        _write_reference(env, row, reference)
        _, ref_rewards, *_ = reference.step({agent: 0 for agent in reference.agents})
        assert ref_rewards["agent_0"] == pytest.approx(expected[row], abs=1e-5)


# -- spaces and names (no mpe2 needed) ------------------------------------------------------------
def test_spaces_and_names():
    spread = SimpleSpread(num_envs=2)
    assert list(spread.groups) == ["agent"]
    assert spread.agents == ["agent_0", "agent_1", "agent_2"]
    assert spread.groups["agent"].observation_space == gym.spaces.Box(-np.inf, np.inf, (18,), np.float32)
    assert spread.groups["agent"].action_space == gym.spaces.Discrete(5)
    assert spread.state_space.shape == (54,)
    assert "rgb_array" in spread.metadata["render_modes"]

    tag = SimpleTag(num_envs=2, continuous_actions=True)
    assert list(tag.groups) == ["adversary", "agent"]
    assert tag.agents == ["adversary_0", "adversary_1", "adversary_2", "agent_0"]
    assert tag.groups["adversary"].observation_space.shape == (16,)
    assert tag.groups["agent"].observation_space.shape == (14,)
    assert tag.groups["agent"].action_space == gym.spaces.Box(0.0, 1.0, (5,), np.float32)
    assert tag.state_space.shape == (3 * 16 + 14,)
    assert tag.entity_names[-2:] == ("landmark 0", "landmark 1")
    assert MPE_ENVS == {"simple_spread_v3": SimpleSpread, "simple_tag_v3": SimpleTag}

    obs, info = tag.reset(seed=0)
    assert obs["adversary"].shape == (2, 3, 16) and obs["agent"].shape == (2, 1, 14)
    assert obs["agent"].dtype == torch.float32
    assert info["state"].shape == (2, 62)
    torch.testing.assert_close(
        info["state"], torch.cat([obs["adversary"].flatten(1), obs["agent"].flatten(1)], 1)
    )


def test_initial_state_distribution():
    tag = SimpleTag(num_envs=2000, num_obstacles=3)
    tag.reset(seed=0)
    agents, obstacles = tag.position[:, :4], tag.position[:, 4:]
    assert agents.abs().max() <= 1.0 and agents.abs().max() > 0.99
    assert obstacles.abs().max() <= 0.9 and obstacles.abs().max() > 0.89
    assert (tag.velocity == 0).all()
    assert abs(float(agents.mean())) < 0.03


def test_action_decoding_and_kinematics():
    """From rest and apart, one step moves nothing (old velocity) and sets velocity = accel * dt * u."""
    env = SimpleSpread(num_envs=5, N=1)
    env.reset(seed=0)
    env.position[:, 0] = torch.tensor([0.0, 0.0])
    obs, *_ = env.step({"agent": torch.arange(5).view(5, 1)})
    expected = 0.5 * torch.tensor([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
    torch.testing.assert_close(env.velocity[:, 0], expected)
    torch.testing.assert_close(env.position[:, 0], torch.zeros(5, 2))
    torch.testing.assert_close(obs["agent"][:, 0, :2], expected)
    obs, *_ = env.step({"agent": torch.zeros(5, 1, dtype=torch.int64)})
    torch.testing.assert_close(env.position[:, 0], 0.1 * expected)
    torch.testing.assert_close(env.velocity[:, 0], 0.75 * expected)

    # Continuous: u = [a2 - a1, a4 - a3], clipped to the Box first; max speed clamps (tag good agent: 1.3).
    cont = SimpleTag(num_envs=2, continuous_actions=True, num_obstacles=0)
    cont.reset(seed=0)
    cont.position[:, :, 0] = torch.tensor([-0.9, -0.3, 0.3, 0.9])  # far apart: no contact
    cont.position[:, :, 1] = 0.0
    push = torch.zeros(2, 1, 5)
    push[0, 0, 2] = 0.75
    push[1, 0, 2] = 7.0  # clipped to 1
    cont.step({"adversary": torch.zeros(2, 3, 5), "agent": push})
    torch.testing.assert_close(cont.velocity[:, 3], torch.tensor([[0.3, 0.0], [0.4, 0.0]]))
    cont.velocity[:, 3] = torch.tensor([[3.0, 4.0], [0.1, 0.0]])
    cont.step({"adversary": torch.zeros(2, 3, 5), "agent": torch.zeros(2, 1, 5)})
    torch.testing.assert_close(cont.velocity[:, 3], torch.tensor([[0.78, 1.04], [0.075, 0.0]]))


def test_autoreset_and_final_obs():
    env = SimpleSpread(num_envs=4, max_cycles=5)
    obs, _ = env.reset(seed=3)
    actions = {"agent": torch.randint(0, 5, (4, 3), generator=torch.Generator().manual_seed(0))}
    for _ in range(3):
        obs, *_ = env.step(actions)
    env.elapsed_steps[1] = 4  # row 1 ends on the next step, the others go on
    before = obs["agent"].clone()
    obs, rewards, terminated, truncated, info = env.step(actions)
    assert truncated.tolist() == [False, True, False, False] and not terminated.any()
    assert info["_final_obs"].tolist() == [False, True, False, False]
    final = info["final_obs"]["agent"]
    # Positions move with the old velocity: self_pos' = self_pos + 0.1 self_vel, for every row.
    torch.testing.assert_close(final[..., 2:4], before[..., 2:4] + 0.1 * before[..., :2])
    kept = torch.tensor([0, 2, 3])
    torch.testing.assert_close(obs["agent"][kept], final[kept])
    assert not torch.equal(obs["agent"][1], final[1])
    assert (obs["agent"][1, :, :2] == 0).all()  # a new episode starts at rest
    assert env.elapsed_steps.tolist() == [4, 0, 4, 4]
    torch.testing.assert_close(info["final_state"], final.flatten(1))
    torch.testing.assert_close(info["state"], obs["agent"].flatten(1))
    assert info["episode_length"][1] == 4  # the statistics count this episode's own steps


@pytest.mark.parametrize("cls", [SimpleSpread, SimpleTag])
def test_episode_return_is_sum_of_rewards(cls):
    env = cls(num_envs=6, max_cycles=7)
    env.reset(seed=5)
    generator = torch.Generator().manual_seed(1)
    totals = {name: torch.zeros(6, group.num_agents) for name, group in env.groups.items()}
    for _ in range(7):
        actions = {
            name: torch.randint(0, 5, (6, g.num_agents), generator=generator)
            for name, g in env.groups.items()
        }
        obs, rewards, terminated, truncated, info = env.step(actions)
        for name in env.groups:
            totals[name] += rewards[name]
    assert truncated.all() and info["_final_obs"].all()
    assert (info["episode_length"] == 7).all()
    for name in env.groups:
        torch.testing.assert_close(info["episode_return"][name], totals[name])


@pytest.mark.parametrize("cls", [SimpleSpread, SimpleTag])
def test_seeding_reproduces_trajectories(cls):
    def rollout(seed: int) -> list[torch.Tensor]:
        env = cls(num_envs=8, max_cycles=4)
        obs, _ = env.reset(seed=seed)
        generator = torch.Generator().manual_seed(9)
        out = [torch.cat([o.flatten(1) for o in obs.values()], 1)]
        for _ in range(10):  # crosses two autoresets
            actions = {
                n: torch.randint(0, 5, (8, g.num_agents), generator=generator) for n, g in env.groups.items()
            }
            obs, rewards, *_ = env.step(actions)
            out.append(torch.cat([o.flatten(1) for o in [*obs.values(), *rewards.values()]], 1))
        return out

    first, again, other = rollout(11), rollout(11), rollout(12)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("cls", [SimpleSpread, SimpleTag])
def test_state_dict_round_trip(cls):
    env = cls(num_envs=5, max_cycles=6, continuous_actions=True)
    env.reset(seed=4)
    generator = torch.Generator().manual_seed(2)
    actions = [
        {n: torch.rand((5, g.num_agents, 5), generator=generator) for n, g in env.groups.items()}
        for _ in range(12)
    ]
    for a in actions[:4]:
        env.step(a)
    saved = env.state_dict()
    assert {"position", "velocity", "generator", "elapsed_steps"} <= set(saved)
    expected = [env.step(a) for a in actions[4:]]  # crosses autoresets: the generator must be restored

    restored = cls(num_envs=5, max_cycles=6, continuous_actions=True)
    restored.reset(seed=99)
    restored.load_state_dict(saved)
    for a, (obs, rewards, _, truncated, info) in zip(actions[4:], expected, strict=True):
        obs2, rewards2, terminated2, truncated2, info2 = restored.step(a)
        for name in env.groups:
            assert torch.equal(obs[name], obs2[name])
            assert torch.equal(rewards[name], rewards2[name])
            assert torch.equal(info["episode_return"][name], info2["episode_return"][name])
        assert torch.equal(truncated, truncated2)


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (SimpleSpread, {"N": 0}, "N .*>= 1, got 0"),
        (SimpleSpread, {"N": 2.5}, "N .*integer"),
        (SimpleSpread, {"local_ratio": 1.5}, r"local_ratio .*\[0, 1\], got 1.5"),
        (SimpleSpread, {"local_ratio": -0.1}, "local_ratio"),
        (SimpleSpread, {"max_cycles": 0}, "max_cycles .*>= 1, got 0"),
        (SimpleSpread, {"continuous_actions": "yes"}, "continuous_actions must be True or False"),
        (SimpleSpread, {"dtype": torch.float16}, "dtype"),
        (SimpleSpread, {"num_envs": 0}, "num_envs"),
        (SimpleTag, {"num_good": 0}, "num_good .*>= 1, got 0"),
        (SimpleTag, {"num_adversaries": -1}, "num_adversaries"),
        (SimpleTag, {"num_obstacles": -1}, "num_obstacles .*>= 0, got -1"),
        (SimpleTag, {"max_cycles": True}, "max_cycles"),
        (SimpleTag, {"device": "nonsense"}, "device"),
    ],
)
def test_bad_arguments(cls, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        cls(**kwargs)


def test_bad_actions():
    spread = SimpleSpread(num_envs=4)
    spread.reset(seed=0)
    with pytest.raises(EnvError, match=r"shape \(4, 2\), expected \(4, 3\)"):
        spread.step({"agent": torch.zeros(4, 2, dtype=torch.int64)})
    with pytest.raises(EnvError, match="one tensor per agent group"):
        spread.step(torch.zeros(4, 3, dtype=torch.int64))
    tag = SimpleTag(num_envs=4, continuous_actions=True)
    tag.reset(seed=0)
    with pytest.raises(EnvError, match="one tensor per agent group"):
        tag.step({"adversary": torch.zeros(4, 3, 5)})
    with pytest.raises(EnvError, match=r"expected \(4, 1, 5\)"):
        tag.step({"adversary": torch.zeros(4, 3, 5), "agent": torch.zeros(4, 1)})


def test_render():
    env = SimpleTag(num_envs=2)
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (env.render_size, env.render_size, 3) and frame.dtype == np.uint8
    colours = {tuple(c) for c in frame.reshape(-1, 3).tolist()}
    assert (255, 255, 255) in colours and (0, 0, 0) in colours
    assert (170, 70, 70) in colours and (70, 170, 70) in colours and (50, 50, 50) in colours
    spread = SimpleSpread(num_envs=1)
    spread.reset(seed=0)
    assert (70, 70, 170) in {tuple(c) for c in spread.render().reshape(-1, 3).tolist()}


def test_many_envs():
    env = SimpleSpread(num_envs=4096)
    obs, info = env.reset(seed=0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        obs, rewards, terminated, truncated, info = env.step(
            {"agent": torch.randint(0, 5, (4096, 3), generator=generator)}
        )
        assert torch.isfinite(obs["agent"]).all() and torch.isfinite(rewards["agent"]).all()
    assert obs["agent"].shape == (4096, 3, 18) and rewards["agent"].shape == (4096, 3)
    assert info["_final_obs"].sum() == 0 and env.elapsed_steps.eq(5).all()  # truncated after 25 steps


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    envs = [SimpleTag(num_envs=64, device=device) for device in ("cpu", "cuda")]
    actions = {"adversary": torch.randint(0, 5, (64, 3)), "agent": torch.randint(0, 5, (64, 1))}
    for env in envs:
        env.reset(seed=0)
    envs[1].position.copy_(envs[0].position)
    for _ in range(20):
        out = [env.step(actions) for env in envs]
        for name in envs[0].groups:
            torch.testing.assert_close(out[1][0][name].cpu(), out[0][0][name], atol=1e-4, rtol=0)
            torch.testing.assert_close(out[1][1][name].cpu(), out[0][1][name], atol=1e-4, rtol=0)
