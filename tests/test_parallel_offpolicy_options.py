"""FastTD3's recipe as options of DDPG, TD3 and SAC: per-env exploration noise, AdamW weight decay and bf16
autocast; their bad input, and that leaving them off changes nothing."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import phalanx
from phalanx.algos.ddpg import DDPGConfig, LearningRule
from phalanx.algos.sac import SAC, SACConfig
from phalanx.algos.td3 import TD3, TD3Config
from phalanx.buffers import ReplayBatch
from phalanx.cli import main
from phalanx.compiling import compile_problem
from phalanx.config import load_yaml
from phalanx.errors import ConfigError
from phalanx.gradient_step import GradientStep
from phalanx.nets.mlp import mlp
from phalanx.optim import DECOUPLED_WEIGHT_DECAY, make_adam
from phalanx.population.vectorized_off_policy import VectorizedTD3

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
needs_adamw = pytest.mark.skipif(not DECOUPLED_WEIGHT_DECAY, reason="AdamW as Adam's flag needs torch >= 2.6")


def td3(device: str = "cpu", **hyperparameters) -> TD3:
    torch.manual_seed(0)
    return TD3(TD3Config(hidden_sizes=(16, 16), **hyperparameters), OBS, ACTIONS, torch.device(device))


def batch(size: int = 32, device: str = "cpu") -> ReplayBatch:
    generator = torch.Generator().manual_seed(1)
    obs, next_obs = (torch.rand(size, 3, generator=generator) * 2 - 1 for _ in range(2))
    actions = torch.rand(size, 2, generator=generator) * 2 - 1
    rewards, discounts = torch.randn(size, generator=generator), torch.full((size,), 0.99)
    return ReplayBatch(*(t.to(device) for t in (obs, actions, rewards, next_obs, discounts)))


def make(algo: str, **overrides) -> phalanx.TrainConfig:
    settings = {"num_envs": 4, "learning_starts": 64, "batch_size": 32, "buffer_size": 1000, **overrides}
    return phalanx.make_config(algo, "Pendulum-v1", use_preset=False, **settings)


# -- per-env exploration noise ---------------------------------------------------------------------
def test_per_env_noise_has_each_rows_own_standard_deviation():
    algorithm = td3(exploration_noise_range=(0.01, 0.3))
    policy = algorithm.exploration_policy()
    obs = torch.rand(8, 3) * 2 - 1
    mean = algorithm.act(obs)
    torch.manual_seed(2)
    noise = torch.stack([policy(obs, 0) - mean for _ in range(2000)])  # (draws, rows, action)
    expected = torch.linspace(0.01, 0.3, 8)
    measured = noise.transpose(0, 1).reshape(8, -1).std(dim=1)  # 4000 draws a row
    torch.testing.assert_close(measured, expected, rtol=0.05, atol=1e-3)
    assert measured[-1] > 20 * measured[0]
    # each acting call spreads over its own rows (a half of the sub-envs with --overlap); one row: the middle
    assert torch.allclose(policy.scales(torch.zeros(4, 2)).squeeze(1), torch.linspace(0.01, 0.3, 4))
    assert policy.scales(torch.zeros(1, 2)).item() == pytest.approx(0.155)


def test_without_a_range_the_noise_draws_exactly_what_it_drew_before():
    """Seeded runs keep their results: actor(obs) + 0.1 * randn, the same numbers in the same order."""
    algorithm = td3()
    obs = torch.rand(5, 3) * 2 - 1
    torch.manual_seed(7)
    got = torch.stack([algorithm.explore(obs, 0) for _ in range(3)])
    torch.manual_seed(7)
    want = torch.stack([(algorithm.actor(obs) + 0.1 * torch.randn(5, 2)).clamp(-1.0, 1.0) for _ in range(3)])
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"exploration_noise_range": (-0.1, 0.4)}, r"expected standard deviations >= 0, but low = -0.1"),
        ({"exploration_noise_range": (0.4, 0.1)}, r"expected low <= high, but 0.4 > 0.1; write \[low,"),
        ({"exploration_noise_range": (0.1, 0.2, 0.3)}, r"is not a list of 2 values or null"),
        (
            {"exploration_noise_range": (0.001, 0.4), "num_envs": 1},
            r"per-env noise needs at least 2 sub-envs; with one env use exploration_noise",
        ),
        ({"weight_decay": -0.1}, r"weight_decay = -0.1 is invalid: expected a number >= 0"),
        ({"actor_output_gain": 0.0}, r"actor_output_gain = 0.0 is invalid: expected > 0, e.g. 0.01"),
        (  # the replay must hold the warm-up, which holds a batch (OffPolicyConfig.validate)
            {"batch_size": 512, "learning_starts": 512, "buffer_size": 256},
            r"buffer_size = 256 is invalid: expected >= learning_starts \(512\)",
        ),
        (
            {"batch_size": 512, "learning_starts": 256, "buffer_size": 256},
            r"learning_starts = 256 is invalid: expected an integer >= batch_size \(512\)",
        ),
    ],
)
def test_bad_input_is_refused_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make("td3", **overrides).validate()


def test_a_range_that_is_no_pair_is_refused_when_the_config_is_built_directly():
    config = make("td3")
    config.hyperparameters = DDPGConfig(exploration_noise_range=(0.1,))  # type: ignore[arg-type]
    config.algo = "ddpg"
    with pytest.raises(ConfigError, match=r"expected a pair \[low, high\] of standard deviations"):
        config.validate()


# -- a small actor initialisation ----------------------------------------------------------------------
def test_a_small_actor_output_gain_starts_every_action_near_zero_and_the_default_is_unchanged():
    obs = torch.rand(256, 3) * 2 - 1
    default, small = td3(), td3(actor_output_gain=0.01)
    assert small.act(obs).abs().max() < 0.05
    assert default.act(obs).abs().max() > 0.2  # gain 1: actions well away from 0
    torch.manual_seed(0)  # the default builds exactly the actor it built before the option existed
    before = nn.Sequential(mlp(3, (16, 16), 2, "relu"), nn.Tanh())
    assert all(
        torch.equal(a, b)
        for a, b in zip(default.actor.state_dict().values(), before.state_dict().values(), strict=True)
    )


def test_sac_samples_its_exploration_so_it_has_no_noise_range():
    with pytest.raises(ConfigError, match="unknown setting 'exploration_noise_range' for algo 'sac'"):
        make("sac", exploration_noise_range=(0.001, 0.4))


def test_the_vectorized_population_refuses_what_its_batched_members_lack():
    with pytest.raises(ConfigError, match=r"VectorizedTD3 has no weight_decay, exploration_noise_range yet"):
        VectorizedTD3.check_config(make("td3", weight_decay=0.1, exploration_noise_range=(0.01, 0.3)))


@pytest.mark.parametrize(
    "option", [{"weight_decay": 0.1}, {"bf16": True}, {"exploration_noise_range": (0.0, 0.4)}]
)
def test_maddpg_refuses_the_single_agent_options_it_lacks(option):
    name = next(iter(option))
    config = phalanx.make_config("matd3", "simple_spread_continuous", use_preset=False, **option)
    with pytest.raises(ConfigError, match=rf"{name} = .* matd3 does not take it yet \(DDPG, TD3 and SAC do"):
        config.validate()


# -- AdamW weight decay ----------------------------------------------------------------------------
def test_weight_decay_zero_builds_todays_adam():
    net = nn.Linear(3, 2)
    group = make_adam(list(net.parameters()), lr=1e-3).param_groups[0]
    assert group["weight_decay"] == 0 and not group.get("decoupled_weight_decay", False)
    algorithm = td3()
    for optimizer in (algorithm.actor_optimizer, algorithm.critic_optimizer):
        assert optimizer.param_groups[0]["weight_decay"] == 0


@needs_adamw
def test_weight_decay_reaches_the_actor_and_the_critics_not_sacs_temperature():
    sac = SAC(SACConfig(hidden_sizes=(16, 16), weight_decay=0.1), OBS, ACTIONS, "cpu")
    for optimizer in (sac.actor_optimizer, sac.critic_optimizer):
        group = optimizer.param_groups[0]
        assert group["weight_decay"] == 0.1 and group["decoupled_weight_decay"]
    assert sac.alpha_optimizer.param_groups[0]["weight_decay"] == 0


@needs_adamw
def test_adamw_shrinks_weights_by_lr_times_decay_on_zero_gradients_eager_and_in_the_gradient_step():
    torch.manual_seed(0)
    for functional in (False, True):
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
        before = [p.detach().clone() for p in net.parameters()]
        optimizer = make_adam(list(net.parameters()), lr=0.1, weight_decay=0.5)
        if functional:  # the compiled path's function, run eagerly
            GradientStep(optimizer, [net], lambda x, net=net: (0.0 * net(x).sum(), {}))(torch.zeros(4, 3))
        else:
            optimizer.zero_grad()
            optimizer.step()
        for got, want in zip(net.parameters(), before, strict=True):
            torch.testing.assert_close(got.detach(), want * (1 - 0.1 * 0.5))


@needs_adamw
def test_flat_adamw_is_torch_adamw_and_the_gradient_step_follows_it():
    """FlatAdam's own fast step (the fused AdamW kernel) and the gradient step's rule against torch's
    AdamW over the per-tensor parameters, for a few steps on real gradients."""
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    eager, functional = copy.deepcopy(reference), copy.deepcopy(reference)
    adamw = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=1.0)
    flat = make_adam(list(eager.parameters()), lr=1e-2, weight_decay=1.0)
    step = GradientStep(
        make_adam(list(functional.parameters()), lr=1e-2, weight_decay=1.0),
        [functional],
        lambda x: (functional(x).pow(2).mean(), {}),
    )
    for seed in range(6):
        x = torch.randn(16, 3, generator=torch.Generator().manual_seed(seed))
        step(x)
        for optimizer, net in ((flat, eager), (adamw, reference)):
            optimizer.zero_grad()
            net(x).pow(2).mean().backward()
            optimizer.step()
    for mine, theirs, want in zip(
        eager.parameters(), functional.parameters(), reference.parameters(), strict=True
    ):
        torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(theirs, want, rtol=1e-5, atol=1e-6)


@needs_adamw
@pytest.mark.skipif(compile_problem(torch.device("cpu")) is not None, reason="cannot compile here")
def test_compiled_td3_update_with_weight_decay_equals_the_eager_one():
    eager, compiled = td3(weight_decay=5.0), td3(weight_decay=5.0)
    compiled.compile()
    for _ in range(3):
        torch.manual_seed(5)
        eager.update(batch(), 0.0)
        torch.manual_seed(5)
        compiled.update(batch(), 0.0)
    for module in ("actor", "critic"):
        for got, want in zip(
            getattr(compiled, module).parameters(), getattr(eager, module).parameters(), strict=True
        ):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# -- bf16 autocast ---------------------------------------------------------------------------------
def test_bf16_on_a_cpu_run_is_refused_before_the_run_directory(tmp_path):
    config = make("td3", bf16=True, run_dir=str(tmp_path / "run"))
    message = "bf16 autocast is for CUDA devices; this run's device is cpu: drop bf16 or pass --device cuda"
    with pytest.raises(ConfigError, match=message):
        phalanx.train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


def recording(algorithm, rule: LearningRule, seen: list) -> LearningRule:
    """``rule`` whose losses record the dtype a matmul on the learner's device gets inside them."""

    def recorded(loss):
        def run(*inputs):
            probe = torch.ones(2, 2, device=algorithm.device)
            seen.append((loss.__name__, (probe @ probe).dtype))
            return loss(*inputs)

        return run

    return rule._replace(critic_loss=recorded(rule.critic_loss), actor_loss=recorded(rule.actor_loss))


@pytest.mark.parametrize("algorithm_class", [TD3, SAC])
@pytest.mark.parametrize("gradient_step", [False, True])
def test_bf16_runs_the_losses_under_bfloat16_autocast_and_keeps_float32(
    algorithm_class, gradient_step, monkeypatch
):
    """The learner's device's autocast (a run's is CUDA; the mechanism is the same on this CPU), in the
    eager step and in the gradient step that compile() builds (its function run uncompiled here)."""
    torch.manual_seed(0)
    config_class = TD3Config if algorithm_class is TD3 else SACConfig
    algorithm = algorithm_class(config_class(hidden_sizes=(16, 16), bf16=True), OBS, ACTIONS, "cpu")
    seen: list = []
    monkeypatch.setattr(algorithm_class, "rule", recording(algorithm, algorithm_class.rule, seen))
    if gradient_step:
        monkeypatch.setattr(GradientStep, "compile", lambda self: None)
        algorithm.compile()
    for _ in range(2):  # TD3's actor steps every second update
        metrics = algorithm.update(batch(), 0.0)
    assert {name for name, _ in seen} >= {"ddpg_critic_loss" if algorithm_class is TD3 else "sac_critic_loss"}
    assert seen and all(dtype == torch.bfloat16 for _, dtype in seen), seen
    assert all(value.dtype == torch.float32 for value in metrics.values()), metrics
    for module in (algorithm.actor, algorithm.critic):
        assert all(p.dtype == torch.float32 for p in module.parameters())
    state = algorithm.critic_optimizer.state[algorithm.critic_optimizer.flat.parameter]
    assert state["exp_avg"].dtype == torch.float32
    # without bf16: float32 matmuls inside the same losses
    seen.clear()
    algorithm.config.bf16 = False
    algorithm.critic_gradient_step = algorithm.actor_gradient_step = None
    algorithm.update(batch(), 0.0)
    assert seen and all(dtype == torch.float32 for _, dtype in seen)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")
def test_bf16_on_cuda_runs_the_update_under_bfloat16_autocast(monkeypatch):
    algorithm = td3("cuda", bf16=True)
    seen: list = []
    monkeypatch.setattr(TD3, "rule", recording(algorithm, TD3.rule, seen))
    for _ in range(2):
        metrics = algorithm.update(batch(device="cuda"), 0.0)
    assert seen and all(dtype == torch.bfloat16 for _, dtype in seen)
    assert all(value.dtype == torch.float32 and value.isfinite() for value in metrics.values())
    config = make("td3", bf16=True, device="cuda", total_steps=256, eval_every=0, hidden_sizes=(16, 16))
    config.validate()  # a CUDA run takes it


# -- the recipe through the command line -----------------------------------------------------------
@needs_adamw
def test_train_td3_with_per_env_noise_and_weight_decay(tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--num-envs", "4", "--total-steps", "320", "--learning-starts", "64", "--batch-size", "32"]
    flags += ["--buffer-size", "1000", "--hidden-sizes", "16", "16", "--eval-every", "0"]
    flags += ["--exploration-noise-range", "0.001", "0.4", "--weight-decay", "0.1", "--run-dir", str(run)]
    code = main(["train", "td3", "Pendulum-v1", *flags])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    written = (run / "config.yaml").read_text()
    assert "exploration_noise_range:" in written and "weight_decay: 0.1" in written


FAST_TD3_PENDULUM = Path(__file__).resolve().parents[1] / "examples" / "fast_td3_pendulum.yaml"


def test_the_fast_td3_pendulum_example_runs_with_every_option_of_the_recipe(tmp_path):
    """examples/fast_td3_pendulum.yaml: 1,024 envs, a C51 twin critic, per-env noise, AdamW, n-step; a few
    vector steps past the warm-up through the command line, with the example's settings recorded."""
    run_dir = tmp_path / "run"
    flags = ["--total-steps", "20480", "--eval-every", "20480", "--eval-episodes", "2", "--torch-threads=1"]
    main(
        ["train", "td3", "Pendulum-v1", "--config", str(FAST_TD3_PENDULUM), *flags, "--run-dir", str(run_dir)]
    )
    settings = load_yaml(run_dir / "config.yaml")
    assert settings["num_envs"] == 1024
    hyperparameters = settings["hyperparameters"]
    assert hyperparameters["critic_atoms"] == 101 and hyperparameters["exploration_noise_range"] == [
        0.001,
        0.4,
    ]
    assert hyperparameters["weight_decay"] == 0.1 and hyperparameters["n_step"] == 3
    assert (run_dir / "summary.json").is_file()


def test_the_fast_sac_pendulum_example_runs_sac_with_the_recipe(tmp_path):
    """examples/fast_sac_pendulum.yaml: the recipe on SAC (no noise range: SAC explores by its entropy); two
    vector steps past the warm-up through the command line."""
    run_dir = tmp_path / "run"
    example = FAST_TD3_PENDULUM.parent / "fast_sac_pendulum.yaml"
    flags = ["--total-steps", "12288", "--eval-every", "12288", "--eval-episodes", "2", "--torch-threads=1"]
    main(["train", "sac", "Pendulum-v1", "--config", str(example), *flags, "--run-dir", str(run_dir)])
    hyperparameters = load_yaml(run_dir / "config.yaml")["hyperparameters"]
    assert hyperparameters["critic_atoms"] == 101 and hyperparameters["weight_decay"] == 0.1
    assert hyperparameters["batch_size"] == 2048 and hyperparameters["n_step"] == 3
    assert json.loads((run_dir / "summary.json").read_text())["updates"] > 0


@pytest.mark.slow
def test_the_fast_td3_pendulum_example_reaches_minus_200(tmp_path):
    run_dir = tmp_path / "run"
    main(["train", "td3", "Pendulum-v1", "--config", str(FAST_TD3_PENDULUM), "--run-dir", str(run_dir)])
    returns = [row["eval_return_mean"] for row in csv.DictReader(open(run_dir / "evaluations.csv"))]
    assert max(float(value) for value in returns) >= -200


@pytest.mark.parametrize(
    "env, config",
    [
        ("playground:CheetahRun", None),
        ("playground:WalkerWalk", None),
        ("HalfCheetah-v5", "fast_td3_halfcheetah.yaml"),
        ("MountainCarContinuous-v0", "fast_td3_mountaincar.yaml"),
        ("playground:CheetahRun", "fast_td3_cheetahrun_cpu.yaml"),
    ],
)
def test_the_recipes_presets_and_examples_are_valid_configs(env, config):
    """The recipe's presets and example configs too long for a test validate as they are: their settings
    are the algorithm's fields with values it accepts (the runs are measured in BENCHMARKS.md)."""
    overrides = {} if config is None else load_yaml(FAST_TD3_PENDULUM.parent / config)
    run = phalanx.make_config("td3", env, **overrides)
    run.validate()
    assert run.num_envs >= 256 and run.hyperparameters.critic_atoms == 101
    assert run.hyperparameters.exploration_noise_range is not None and run.hyperparameters.weight_decay > 0
