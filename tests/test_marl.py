"""Multi-agent training: the MAPPO/IPPO learning rule, the multi-agent trainer, deployment, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import phalanx
from phalanx.buffers import ReplayBuffer, StepLayout
from phalanx.errors import ConfigError, EnvError
from phalanx.marl.base import to_env_actions, with_agent_ids
from phalanx.marl.buffers import MultiAgentReplayBuffer, MultiAgentRollout
from phalanx.marl.core import MultiAgentSpec
from phalanx.marl.mappo import MAPPO, IPPOConfig, MAPPOConfig
from phalanx.marl.mpe import SimpleSpread, SimpleTag
from phalanx.marl.trainer import MultiAgentTrainer
from phalanx.registry import get_algorithm
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.loop import TrainingInterrupted


def marl_config(tmp_path, name="run", algo="mappo", env="simple_spread", **overrides):
    settings = dict(num_envs=16, total_steps=2_000, eval_every=0, eval_episodes=4, log_every=400)
    settings.update(overrides)
    return phalanx.make_config(algo, env, run_dir=str(tmp_path / name), **settings)


def algorithm_parameters(run_dir) -> dict[str, torch.Tensor]:
    state = load_checkpoint(CheckpointManager(run_dir).latest())["algorithm"]
    flat = {}
    for unit, unit_state in state.items():
        for part in ("policy", "value"):
            flat.update({f"{unit}.{part}.{k}": v for k, v in unit_state[part].items()})
    return flat


# -- the learning rule ------------------------------------------------------------------------------
def test_agent_ids_and_action_rescaling():
    x = torch.zeros(2, 3, 4)
    ids = with_agent_ids(x)
    assert ids.shape == (2, 3, 7) and torch.equal(ids[1, :, 4:], torch.eye(3))
    assert with_agent_ids(torch.zeros(2, 1, 4)).shape == (2, 1, 4)  # one agent: nothing to tell apart
    env = SimpleSpread(num_envs=2, continuous_actions=True)
    actions = to_env_actions({"agent": torch.tensor([[[-1.0] * 5, [1.0] * 5, [0.0] * 5]] * 2)}, env.groups)
    assert torch.allclose(actions["agent"][0, :, 0], torch.tensor([0.0, 1.0, 0.5]))  # Box(0, 1)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("centralised", [True, False])
def test_mappo_explore_act_and_update_shapes(share, centralised):
    env = SimpleTag(num_envs=8)  # two groups of different observation sizes
    spec = MultiAgentSpec.of(env)
    config = MAPPOConfig(share_parameters=share, centralised_critic=centralised, minibatch_size=64, epochs=1)
    algorithm = MAPPO(config, spec, torch.device("cpu"))
    assert len(algorithm.units) == (2 if share else 4)
    obs, info = env.reset(seed=0)
    rollout = MultiAgentRollout(5, 8, spec, "cpu")
    for step in range(5):
        actions, log_probs, values = algorithm.explore(obs, info["state"])
        assert actions["adversary"].shape == (8, 3) and actions["agent"].shape == (8, 1)
        assert log_probs["adversary"].shape == values["adversary"].shape == (8, 3)
        next_obs, rewards, terminated, truncated, info = env.step(to_env_actions(actions, env.groups))
        rollout.add(
            step,
            obs=obs,
            state=info["state"],
            actions=actions,
            log_probs=log_probs,
            values=values,
            rewards=rewards,
            terminated=terminated,
            dones=terminated | truncated,
            next_obs=info["final_obs"],
            next_state=info["final_state"],
        )
        obs = next_obs
    metrics = algorithm.update(rollout, progress=0.5)
    prefix = "adversary/" if share else "adversary/adversary_0/"
    assert torch.isfinite(metrics[f"{prefix}policy_loss"])
    assert {name: a.shape for name, a in algorithm.act(obs).items()} == {"adversary": (8, 3), "agent": (8, 1)}


def test_mappo_critic_sees_the_global_state_and_ippo_the_observation():
    spec = MultiAgentSpec.of(SimpleSpread(num_envs=1))
    mappo = MAPPO(MAPPOConfig(), spec, torch.device("cpu"))
    ippo = get_algorithm("ippo")(IPPOConfig(), spec, torch.device("cpu"))
    first = lambda algorithm: next(algorithm.units[0].ppo.value.parameters())  # noqa: E731
    assert first(mappo).shape[1] == 54 + 3 and first(ippo).shape[1] == 18 + 3  # state or obs, + ids


def test_unit_rollout_rows_are_env_major_agent_minor():
    spec = MultiAgentSpec.of(SimpleSpread(num_envs=1))
    algorithm = MAPPO(MAPPOConfig(), spec, torch.device("cpu"))
    rollout = MultiAgentRollout(2, 4, spec, "cpu")
    rollout.rewards["agent"].copy_(torch.arange(24, dtype=torch.float32).view(2, 4, 3))
    rollout.dones.copy_(torch.tensor([[True, False, False, False], [False] * 4]))
    view = algorithm.unit_rollout(algorithm.units[0], rollout)
    assert view.rewards.shape == (2, 12) and torch.equal(view.rewards[0, :6], torch.arange(6.0))
    assert view.dones[0, :3].all() and not view.dones[0, 3:].any()  # one sub-env's end ends its 3 agents


# -- training ---------------------------------------------------------------------------------------
def test_mappo_learns_simple_spread_with_fixed_budget(tmp_path):
    random_return = _random_policy_return()
    result = phalanx.train(
        marl_config(tmp_path, num_envs=64, total_steps=100_000, eval_every=50_000, eval_episodes=64, seed=0),
        show_progress=False,
    )
    assert result.summary["eval_return_mean"] > random_return + 4.0, (result.summary, random_return)


def _random_policy_return(episodes: int = 512) -> float:
    env = SimpleSpread(num_envs=episodes)
    env.reset(seed=123)
    generator = torch.Generator().manual_seed(0)
    for _ in range(25):
        _, _, _, _, info = env.step({"agent": torch.randint(5, (episodes, 3), generator=generator)})
    return float(info["episode_return"]["agent"].mean())


def test_run_directory_and_per_agent_summary(tmp_path):
    result = phalanx.train(marl_config(tmp_path, env="simple_tag", eval_every=1_000), show_progress=False)
    run_dir = result.run_dir
    for name in ("config.yaml", "metrics.csv", "evaluations.csv", "summary.json", "curve.png"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["eval_agent_returns"]) == {"adversary_0", "adversary_1", "adversary_2", "agent_0"}
    assert set(summary["eval_team_returns"]) == {"adversary", "agent"}
    assert summary["eval_return_mean"] == pytest.approx(summary["eval_team_returns"]["adversary"])
    header = (run_dir / "evaluations.csv").read_text().splitlines()[0].split(",")
    assert "eval_return/agent_0" in header and "eval_team_return/agent" in header


def test_seeded_runs_repeat_and_resume_continues_exactly(tmp_path):
    straight = phalanx.train(marl_config(tmp_path, "straight", total_steps=1_600), show_progress=False)
    again = phalanx.train(marl_config(tmp_path, "again", total_steps=1_600), show_progress=False)
    half = phalanx.train(marl_config(tmp_path, "half", total_steps=800), show_progress=False)
    resumed = phalanx.resume(half.run_dir, total_steps=1_600, show_progress=False)
    a, b, c = (algorithm_parameters(r.run_dir) for r in (straight, again, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(a[k], c[k]) for k in a), "resumed parameters differ from the straight run"


def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path, interrupt_update):
    trainer = MultiAgentTrainer(marl_config(tmp_path), show_progress=False)
    interrupt_update(trainer, 2)
    with pytest.raises(TrainingInterrupted, match="phalanx resume"):
        trainer.train()
    trainer.close()
    assert json.loads((trainer.run_dir / "summary.json").read_text())["interrupted"] is True
    assert phalanx.resume(trainer.run_dir, show_progress=False).summary["total_steps"] >= 2_000


@pytest.mark.parametrize("algo", ["mappo", "qmix"])
def test_metrics_csv_ends_with_the_runs_last_step(tmp_path, algo):
    """log_every = 700 divides no iteration's end: the steps after the last log step get a row at the end."""
    from phalanx.train.logging import read_table

    result = phalanx.train(marl_config(tmp_path, algo=algo, log_every=700), show_progress=False)
    steps = [row["steps"] for row in read_table(result.run_dir / "metrics.csv")]
    assert steps[-1] == result.summary["total_steps"] >= 2_000
    assert steps == sorted(set(steps)) and len(steps) == 4  # the first iteration's, 2 log steps, the last


def test_deployed_agent_reproduces_the_evaluation_and_acts_on_raw_observations(tmp_path):
    result = phalanx.train(
        marl_config(tmp_path, env="simple_spread_continuous", eval_every=1_000), show_progress=False
    )
    evaluation = phalanx.evaluate(result.run_dir, episodes=4, checkpoint="latest")
    assert evaluation.mean == pytest.approx(result.summary["eval_return_mean"], rel=1e-5)
    agent = phalanx.load_agent(result.run_dir, checkpoint="latest")
    single = agent.act({"agent": np.zeros((3, 18), dtype=np.float32)})
    assert single["agent"].shape == (3, 5) and (single["agent"] >= 0).all() and (single["agent"] <= 1).all()
    batch = agent.act({"agent": torch.zeros(7, 3, 18)})
    assert batch["agent"].shape == (7, 3, 5)
    with pytest.raises(ValueError, match=r"expected \(3, 18\)"):
        agent.act({"agent": np.zeros((3, 17), dtype=np.float32)})
    with agent.frames(max_steps=30) as episode:
        frames = list(episode)
    assert episode.name == "simple_spread_continuous" and len(frames) == 26 and frames[0].dtype == np.uint8


def test_multi_agent_replay_that_does_not_fit_is_refused_with_bytes_and_fix(monkeypatch):
    spec = MultiAgentSpec.of(SimpleTag(num_envs=4))  # two groups of different observation sizes
    memory = MultiAgentReplayBuffer.memory(40, 4, spec, "cpu")
    assert memory.needed == MultiAgentReplayBuffer(40, 4, spec, "cpu").nbytes
    monkeypatch.setattr("phalanx.buffers.memory.available_memory", lambda device: 2**20)
    fits = int(0.9 * 2**20 / memory.per_transition)
    with pytest.raises(ConfigError, match=rf"adversary: 3 agents.*lower --buffer-size to at most {fits:,} "):
        MultiAgentReplayBuffer(10**6, 4, spec, "cpu")


def test_multi_agent_replay_buffer_samples_stored_transitions():
    spec = MultiAgentSpec.of(SimpleSpread(num_envs=1))
    replay = MultiAgentReplayBuffer(40, 4, spec, "cpu")
    for step in range(12):  # wraps around its 10 slots
        replay.add(
            obs={"agent": torch.full((4, 3, 18), float(step))},
            state=torch.full((4, 54), float(step)),
            actions={"agent": torch.zeros(4, 3, dtype=torch.long)},
            rewards={"agent": torch.full((4, 3), float(step))},
            next_obs={"agent": torch.full((4, 3, 18), step + 1.0)},
            next_state=torch.zeros(4, 54),
            terminated=torch.tensor([True, False, False, False]),
        )
    batch = replay.sample(256, gamma=0.9)
    assert len(replay) == 40 and batch.obs["agent"].shape == (256, 3, 18)
    assert batch.obs["agent"][:, 0, 0].min() >= 2  # the two oldest steps were overwritten
    assert torch.equal(batch.rewards["agent"][:, 0], batch.obs["agent"][:, 0, 0])
    assert sorted({round(value, 6) for value in batch.discounts.tolist()}) == [0.0, 0.9]


def test_multi_agent_n_step_returns_are_the_single_agent_ones_per_agent():
    """The same rewards, episode ends and random draws give each agent the single-agent buffer's n-step
    return (times its reward scale), discount and bootstrap step."""
    spec = MultiAgentSpec.of(SimpleSpread(num_envs=1))
    replay = MultiAgentReplayBuffer(40, 4, spec, "cpu")
    single = ReplayBuffer(40, 4, StepLayout((1,), torch.float32, (), torch.long), "cpu")
    generator = torch.Generator().manual_seed(3)
    for step in range(13):  # wraps around its 10 slots
        reward = torch.randn(4, generator=generator)
        terminated = torch.rand(4, generator=generator) < 0.15
        truncated = ~terminated & (torch.rand(4, generator=generator) < 0.15)
        next_obs = torch.full((4,), step + 1.0) + 100 * torch.arange(4)
        replay.add(
            obs={"agent": torch.zeros(4, 3, 18)},
            state=torch.zeros(4, 54),
            actions={"agent": torch.zeros(4, 3, dtype=torch.long)},
            rewards={"agent": reward[:, None] * torch.tensor([1.0, 2.0, 3.0])},
            next_obs={"agent": next_obs[:, None, None].expand(4, 3, 18)},
            next_state=next_obs[:, None].expand(4, 54),
            terminated=terminated,
            truncated=truncated,
        )
        single.add(
            torch.zeros(4, 1),
            torch.zeros(4, dtype=torch.long),
            reward,
            next_obs[:, None],
            terminated,
            truncated,
        )
    for n_step in (1, 3):
        torch.manual_seed(0)
        expected = single.sample(512, gamma=0.9, n_step=n_step)
        torch.manual_seed(0)
        batch = replay.sample(512, gamma=0.9, n_step=n_step)
        for agent in range(3):
            torch.testing.assert_close(batch.rewards["agent"][:, agent], (agent + 1) * expected.rewards)
        torch.testing.assert_close(batch.discounts, expected.discounts)
        torch.testing.assert_close(batch.next_state[:, 0], expected.next_obs[:, 0])
        torch.testing.assert_close(batch.next_obs["agent"][:, 2, 0], expected.next_obs[:, 0])
    discounts = {round(value, 6) for value in batch.discounts.tolist()}
    assert {0.0, 0.729} <= discounts and discounts & {0.9, 0.81}  # full windows, and windows cut short


# -- bad input --------------------------------------------------------------------------------------
def test_single_agent_algorithm_on_a_multi_agent_env_says_so(tmp_path):
    with pytest.raises(EnvError, match="multi-agent env: train it with a multi-agent algorithm"):
        phalanx.train(
            phalanx.make_config("ppo", "simple_spread", run_dir=str(tmp_path / "r")), show_progress=False
        )


def test_multi_agent_algorithm_on_a_single_agent_env_says_so(tmp_path):
    with pytest.raises(EnvError, match="Unknown multi-agent environment id 'CartPole-v1'"):
        phalanx.train(
            phalanx.make_config("mappo", "CartPole-v1", run_dir=str(tmp_path / "r")), show_progress=False
        )
    with pytest.raises(EnvError, match="Did you mean simple_spread"):
        phalanx.marl.make_multi_agent_env("simple_sprad")


@pytest.mark.parametrize("setting", [{"pipeline": True}, {"normalize_obs": True}, {"num_learners": 2}])
def test_unsupported_run_settings_are_refused(tmp_path, setting):
    name = next(iter(setting))
    with pytest.raises(ConfigError, match=f"{name} = .* is not supported for the multi-agent algorithm"):
        marl_config(tmp_path, **setting).validate()
    assert not (tmp_path / "run").exists()


def test_target_kl_is_refused():
    with pytest.raises(ConfigError, match="target_kl"):
        phalanx.make_config("mappo", "simple_spread", target_kl=0.02).validate()
