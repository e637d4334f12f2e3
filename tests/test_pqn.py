"""PQN (phalanx.algos.pqn): its Q(lambda) targets against a hand computation with a truncation and a
termination, its acting and update shapes, repeatable seeded runs, save/load, learning CartPole with the
many-env config, and the command line (train, eval, export, resume) and bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

import phalanx
from phalanx.algos.pqn import PQN, PQNConfig, q_lambda_targets
from phalanx.buffers import RolloutBuffer, StepLayout, compute_gae, compute_gae_scan
from phalanx.cli import main
from phalanx.compiling import compile_problem
from phalanx.config import load_yaml
from phalanx.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
MANY_ENVS = ROOT / "examples" / "pqn_cartpole_many_envs.yaml"
SPACES = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(3))
COMPILE_PROBLEM = compile_problem(torch.device("cpu"))
SMALL = dict(num_envs=4, horizon=16, minibatch_size=32, torch_threads=1, eval_episodes=2)


def build(seed: int = 0, **settings) -> PQN:
    torch.manual_seed(seed)
    return PQN(PQNConfig(hidden_sizes=(16, 16), **settings), *SPACES, torch.device("cpu"))


def random_rollout(horizon: int = 8, num_envs: int = 4) -> RolloutBuffer:
    generator = torch.Generator().manual_seed(1)
    rollout = RolloutBuffer(horizon, num_envs, StepLayout((4,), torch.float32, (), torch.int64), "cpu")
    for t in range(horizon):
        terminated = torch.rand(num_envs, generator=generator) < 0.1
        rollout.add(
            t,
            torch.randn(num_envs, 4, generator=generator),
            torch.randint(3, (num_envs,), generator=generator),
            torch.zeros(num_envs),
            torch.randn(num_envs, generator=generator),
            torch.randn(num_envs, generator=generator),
            terminated,
            terminated | (torch.rand(num_envs, generator=generator) < 0.1),
            torch.randn(num_envs, 4, generator=generator),
        )
    return rollout


# -- the learning rule -----------------------------------------------------------------------------------
@pytest.mark.parametrize("gae", [compute_gae, compute_gae_scan])
def test_q_lambda_targets_match_a_hand_computation(gae):
    """Two sub-envs, three steps, gamma = lambda = 0.5. Sub-env 0 is truncated at step 1 (it bootstraps
    from its final observation's max Q, 99); sub-env 1 terminates at step 1 (no bootstrap). Both
    bootstrap at the rollout's end from max Q of the last next observation."""
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    values = torch.tensor([[10.0, 4.0], [20.0, 5.0], [30.0, 6.0]])  # max_a Q(s_t)
    next_values = torch.tensor([[20.0, 5.0], [99.0, 6.0], [40.0, 7.0]])  # max_a Q(true next obs of t)
    terminated = torch.tensor([[False, False], [False, True], [False, False]])
    dones = torch.tensor([[False, False], [True, True], [False, False]])
    rollout = SimpleNamespace(rewards=rewards, values=values, terminated=terminated, dones=dones)
    targets = q_lambda_targets(rollout, next_values, 0.5, 0.5, gae)
    # sub-env 0: G2 = 3 + .5 * 40 = 23; G1 = 2 + .5 * 99 = 51.5 (truncated: the final obs);
    #            G0 = 1 + .5 * (.5 * 20 + .5 * 51.5) = 18.875
    # sub-env 1: G2 = 1 + .5 * 7 = 4.5; G1 = 1 (terminated); G0 = 1 + .5 * (.5 * 5 + .5 * 1) = 2.5
    expected = torch.tensor([[18.875, 2.5], [51.5, 1.0], [23.0, 4.5]])
    torch.testing.assert_close(targets, expected)


def test_lambda_zero_is_one_step_q_learning_and_one_the_discounted_return():
    rollout = random_rollout()
    # max Q of each step's true next observation: the next step's max Q within an episode, as in a run
    next_values = rollout.next_obs[..., 0].clone()
    next_values[:-1] = torch.where(rollout.dones[:-1], next_values[:-1], rollout.values[1:])
    not_terminated = (~rollout.terminated).float()
    one_step = q_lambda_targets(rollout, next_values, 0.9, 0.0)
    torch.testing.assert_close(one_step, rollout.rewards + 0.9 * not_terminated * next_values)
    monte_carlo = q_lambda_targets(rollout, next_values, 0.9, 1.0)
    following = next_values[-1]
    for t in reversed(range(rollout.horizon)):  # the return, cut and bootstrapped where episodes end
        following = torch.where(rollout.dones[t], next_values[t], following)
        following = rollout.rewards[t] + 0.9 * not_terminated[t] * following
        torch.testing.assert_close(monte_carlo[t], following)


def test_reward_scale_scales_the_rewards_of_the_targets_only():
    """With Q-values scaled as the rewards are, the targets scale too: only the rewards are scaled."""
    rollout = random_rollout()
    next_values = torch.randn(rollout.horizon, 4, generator=torch.Generator().manual_seed(2))
    targets = q_lambda_targets(rollout, next_values, 0.9, 0.65)
    scaled = SimpleNamespace(
        rewards=rollout.rewards,
        values=rollout.values * 0.1,
        terminated=rollout.terminated,
        dones=rollout.dones,
    )
    torch.testing.assert_close(
        q_lambda_targets(scaled, next_values * 0.1, 0.9, 0.65, reward_scale=0.1), targets * 0.1
    )


def test_explore_is_epsilon_greedy_with_max_q_as_the_value():
    pqn = build()
    obs = torch.randn(6, 4)
    q_values = pqn.q_network(obs).detach()
    actions, log_probs, values = pqn.explore(obs, torch.ones(6, 2))  # no draw below epsilon: greedy
    assert actions.shape == log_probs.shape == values.shape == (6,)
    assert torch.equal(actions, q_values.argmax(dim=1)) and torch.equal(actions, pqn.act(obs))
    torch.testing.assert_close(values, q_values.amax(dim=1))
    noise = torch.stack([torch.zeros(6), torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 0.99])], dim=1)
    assert pqn.explore(obs, noise)[0].tolist() == [0, 0, 1, 1, 2, 2]  # epsilon 1: the drawn actions


def test_epsilon_decays_over_its_fraction_of_the_budget_and_spreads_over_the_sub_envs():
    pqn = build(exploration_fraction=0.5, exploration_final_lowest=0.0005)
    assert pqn.policy.epsilons(4).tolist() == [1.0] * 4
    metrics = pqn.update(random_rollout(), progress=0.25)
    assert float(metrics["epsilon"]) == 1.0  # what the rollout acted with
    middle = pqn.policy.epsilons(3)
    torch.testing.assert_close(middle, 1.0 + 0.5 * (torch.tensor([0.05, 0.005, 0.0005]) - 1.0))
    pqn.update(random_rollout(), progress=0.75)
    torch.testing.assert_close(pqn.policy.epsilons(3), torch.tensor([0.05, 0.005, 0.0005]))
    assert build().policy.epsilons(3).tolist() == [1.0] * 3


def test_update_runs_epochs_of_minibatches_and_moves_the_q_network():
    pqn = build(epochs=3, minibatch_size=8)
    before = [p.detach().clone() for p in pqn.q_network.parameters()]
    metrics = pqn.update(random_rollout(horizon=8, num_envs=4), progress=0.5)
    assert float(metrics["gradient_steps"]) == 3 * 32 / 8
    assert all(value.shape == () and torch.isfinite(value) for value in metrics.values())
    assert float(metrics["learning_rate"]) == pytest.approx(2.5e-4 * 0.5)  # annealed
    assert any(not torch.equal(a, b) for a, b in zip(before, pqn.q_network.parameters(), strict=True))


def test_image_observations_go_through_the_cnn_encoder():
    space = gym.spaces.Box(0, 255, (3, 16, 16), np.uint8)
    torch.manual_seed(0)
    pqn = PQN(PQNConfig(hidden_sizes=(32,)), space, gym.spaces.Discrete(4), torch.device("cpu"))
    rollout = RolloutBuffer(4, 2, StepLayout((3, 16, 16), torch.uint8, (), torch.int64), "cpu")
    for t in range(4):
        obs = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
        actions, log_probs, values = pqn.explore(obs)
        rollout.add(
            t, obs, actions, log_probs, values, torch.ones(2), *[torch.zeros(2, dtype=torch.bool)] * 2, obs
        )
    assert actions.shape == (2,) and pqn.act(obs).shape == (2,)
    assert torch.isfinite(pqn.update(rollout, progress=0.5)["q_loss"])


@pytest.mark.parametrize(
    "shape, encoder", [((4, 84, 84), "nature"), ((3, 16, 16), "impala"), ((10, 10, 4), "minatar")]
)
def test_the_cnn_encoder_has_layer_norms_before_its_activations(shape, encoder):
    """CleanRL's pqn_atari_envpool.py Q-network: a LayerNorm over each convolution's whole output and
    over the 512 features; without layer_norm, the plain encoder with the same initial weights."""
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    torch.manual_seed(0)
    pqn = PQN(PQNConfig(hidden_sizes=(), encoder=encoder), space, gym.spaces.Discrete(4), torch.device("cpu"))
    norms = [m.normalized_shape for m in pqn.q_network.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert (
        norms
        == {
            "nature": [(32, 20, 20), (64, 9, 9), (64, 7, 7), (512,)],
            "impala": [(16, 8, 8), (32, 4, 4), (32, 2, 2), (256,)],
            "minatar": [(16, 8, 8), (128,)],  # MinAtar's (10, 10, C) images, channels last
        }[encoder]
    )
    obs = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
    assert pqn.q_network(obs).shape == (5, 4) and torch.isfinite(pqn.q_network(obs)).all()

    torch.manual_seed(0)
    plain = PQN(
        PQNConfig(hidden_sizes=(), encoder=encoder, layer_norm=False), space, gym.spaces.Discrete(4), "cpu"
    )
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in plain.q_network.modules())

    def weights(module):  # the convolutions' and linear layers' parameters, in order
        layers = [m for m in module.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
        return [parameter for layer in layers for parameter in layer.parameters()]

    assert all(map(torch.equal, weights(pqn.q_network), weights(plain.q_network)))  # the same draws
    assert len(weights(plain.q_network)) == len(weights(pqn.q_network))


def test_the_minatar_preset_trains_through_gymnax(tmp_path):
    pytest.importorskip("gymnax", reason="MinAtar needs the jax extra (gymnax)")
    run_dir = tmp_path / "run"
    flags = ["--num-envs", "8", "--total-steps", "512", "--eval-every", "512", "--eval-episodes", "1"]
    main(["train", "pqn", "gymnax:Breakout-MinAtar", *flags, "--run-dir", str(run_dir), "--torch-threads=1"])
    settings = load_yaml(run_dir / "config.yaml")["hyperparameters"]
    assert settings["encoder"] == "minatar" and settings["horizon"] == 32
    assert (run_dir / "summary.json").is_file()


def test_the_atari_presets_are_cleanrl_pqn_atari_envpool_settings():
    from phalanx.config import presets

    for env in ("envpool:Pong-v5", "envpool:Breakout-v5"):
        preset = presets("pqn")[env]
        settings = preset["hyperparameters"]
        assert preset["num_envs"] == 8 and preset["total_steps"] == 10_000_000
        assert settings["horizon"] == 128 and settings["epochs"] == 4
        assert settings["minibatch_size"] == 8 * 128 // 4 and settings["layer_norm"] is True
        assert (settings["exploration_final"], settings["exploration_fraction"]) == (0.01, 0.1)
        assert settings["learning_rate"] == 2.5e-4 and settings["q_lambda"] == 0.65


def test_state_dict_loads_into_another_instance_with_identical_predictions():
    source = build(seed=0)
    source.update(random_rollout(), progress=0.6)
    target = build(seed=1)
    obs = torch.randn(16, 4)
    assert not torch.equal(target.q_network(obs), source.q_network(obs))
    target.load_state_dict(source.state_dict())
    assert set(source.state_dict()) == {"q_network", "optimizer", "exploration_decay"}
    assert torch.equal(target.q_network(obs), source.q_network(obs))
    assert torch.equal(target.policy.epsilons(4), source.policy.epsilons(4))


@pytest.mark.slow  # a compile of ~10-30 s
@pytest.mark.skipif(COMPILE_PROBLEM is not None, reason=f"cannot compile here: {COMPILE_PROBLEM}")
def test_the_compiled_update_equals_the_eager_update():
    eager = build(minibatch_size=16, anneal_lr=True)
    compiled = build(minibatch_size=16, anneal_lr=True)
    compiled.load_state_dict(eager.state_dict())
    assert compiled.compile() == ["update"]
    rollout = random_rollout()
    for progress in (0.0, 0.5):
        results = []
        for algorithm in (eager, compiled):
            torch.manual_seed(int(progress * 100))  # the same shuffles
            results.append(algorithm.update(rollout, progress))
        for name, value in results[0].items():
            torch.testing.assert_close(results[1][name], value, rtol=1e-4, atol=1e-5, msg=name)
    for mine, theirs in zip(eager.q_network.parameters(), compiled.q_network.parameters(), strict=True):
        torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-5)


# -- runs -----------------------------------------------------------------------------------------------
def train(tmp_path: Path, name: str, **settings):
    config = phalanx.make_config("pqn", "CartPole-v1", run_dir=str(tmp_path / name), **settings)
    return phalanx.train(config, show_progress=False)


def test_seeded_runs_repeat_exactly_and_load_agent_predicts_as_trained(tmp_path):
    settings = dict(SMALL, total_steps=1024, eval_every=512, seed=3)
    first, second = train(tmp_path, "a", **settings), train(tmp_path, "b", **settings)
    columns = ("steps", "q_loss", "q_mean", "target_mean", "epsilon", "episode_return_mean")
    rows = [
        [{key: row[key] for key in columns} for row in phalanx_rows(result.run_dir)]
        for result in (first, second)
    ]
    assert rows[0] == rows[1] and len(rows[0]) >= 2
    obs = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    agents = [phalanx.load_agent(result.run_dir, checkpoint="latest") for result in (first, second)]
    assert np.array_equal(agents[0].act(obs), agents[1].act(obs))


def phalanx_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as file:
        return list(csv.DictReader(file))


def test_learns_cartpole_with_the_many_env_config(tmp_path):
    """The many-env config reaches 475 at ~106-131k env steps (seeds 0, 1; ~11 s on one core)."""
    settings = load_yaml(MANY_ENVS)
    summary = train(tmp_path, "many", **settings, stop_return=475, seed=0, torch_threads=1).summary
    assert summary["best_eval_return"] >= 475, summary
    assert summary["total_steps"] < settings["total_steps"], summary


@pytest.mark.slow
def test_learns_cartpole_with_the_cleanrl_preset(tmp_path):
    """CleanRL pqn.py's settings: 500 from step ~200k of 500k (seed 0, ~30 s on one core)."""
    summary = train(tmp_path, "preset", stop_return=475, seed=0, torch_threads=1).summary
    assert summary["best_eval_return"] >= 475, summary


def test_the_command_line_trains_evaluates_exports_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--num-envs", "4", "--horizon", "16", "--minibatch-size", "32", "--torch-threads", "1"]
    flags += ["--total-steps", "512", "--eval-every", "256", "--eval-episodes", "2", "--run-dir", str(run)]
    assert main(["train", "pqn", "CartPole-v1", *flags]) == 0
    assert json.loads((run / "summary.json").read_text())["total_steps"] == 512
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert main(["export", str(run), "--format", "torchscript"]) == 0
    assert main(["resume", str(run), "--total-steps", "1024"]) == 0
    assert json.loads((run / "summary.json").read_text())["total_steps"] == 1024
    assert main(["export", str(run), "--stochastic"]) == 2
    assert "pqn has no stochastic policy" in " ".join(capsys.readouterr().err.split())


def test_a_population_of_pqn_members_trains_and_exports_its_best(tmp_path):
    flags = ["--size", "2", "--backend", "process", "--total-steps", "1024", "--num-envs", "4"]
    flags += ["--horizon", "16", "--minibatch-size", "32", "--eval-every", "512", "--eval-episodes", "2"]
    assert main(["population", "run", "pqn", "CartPole-v1", *flags, "--dir", str(tmp_path / "pop")]) == 0
    best = phalanx.load_agent(tmp_path / "pop" / "best")
    assert best.act(np.zeros((3, 4), dtype=np.float32)).shape == (3,)


# -- bad input -------------------------------------------------------------------------------------------
def test_a_box_action_space_is_refused_before_the_run_directory(tmp_path):
    config = phalanx.make_config("pqn", "Pendulum-v1", run_dir=str(tmp_path / "run"), num_envs=4)
    with pytest.raises(ConfigError, match=r"pqn needs a Discrete action space.*Box.*Use "):
        phalanx.train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(num_envs=1, exploration_final_lowest=0.01), r"exploration_final_lowest.*at least 2"),
        (dict(exploration_final_lowest=0.5), r"exploration_final_lowest.*\(0, exploration_final = 0.05\]"),
        (dict(num_envs=4, horizon=8, minibatch_size=64), r"minibatch_size.*8 \* 4 = 32"),
        (dict(q_lambda=1.5), r"q_lambda = 1.5 is invalid"),
        (dict(exploration_fraction=0.0), r"exploration_fraction = 0.0 is invalid"),
        (dict(reward_scale=0.0), r"reward_scale = 0.0 is invalid.*a positive number"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_and_the_fix(tmp_path, settings, message):
    config = phalanx.make_config("pqn", "CartPole-v1", run_dir=str(tmp_path / "run"), **settings)
    with pytest.raises(ConfigError, match=message):
        config.validate()
