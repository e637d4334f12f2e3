"""benchmarks/atari_pong.py and benchmarks/recurrent_cartpole.py: the phalanx commands they run are valid
``phalanx train`` commands that set the compared settings (whatever the presets say), and what they read
back from the runs (the peers' printed lines, phalanx's run files) gives the numbers they report. The
runs themselves take minutes and the peers' virtualenvs: they are not run here."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from phalanx.cli import parse_train_args

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def atari_pong():
    return load_benchmark("atari_pong")


@pytest.fixture(scope="module")
def recurrent_cartpole():
    return load_benchmark("recurrent_cartpole")


def test_atari_phalanx_command_sets_cleanrl_settings(atari_pong, tmp_path):
    arguments = atari_pong.phalanx_arguments(
        total_steps=4096, seed=3, threads=1, device="cpu", compile=False, run_dir=tmp_path / "run"
    )
    config = parse_train_args(arguments[1:])  # without "train"
    hyperparameters = config.hyperparameters
    assert (config.algo, config.env, config.num_envs, config.total_steps) == (
        "ppo",
        "envpool:Pong-v5",
        8,
        4096,
    )
    assert not config.normalize_obs and not config.normalize_reward
    assert (hyperparameters.encoder, hyperparameters.share_encoder) == ("nature", True)
    assert tuple(hyperparameters.hidden_sizes) == ()  # linear heads on the CNN's features, as CleanRL
    assert (hyperparameters.horizon, hyperparameters.epochs, hyperparameters.minibatch_size) == (128, 4, 256)
    assert (hyperparameters.clip_range, hyperparameters.clip_value) == (0.1, 0.1)
    assert hyperparameters.learning_rate == 2.5e-4 and hyperparameters.anneal_lr
    assert (hyperparameters.entropy_coef, hyperparameters.value_coef) == (0.01, 0.5)
    assert (hyperparameters.gamma, hyperparameters.gae_lambda, hyperparameters.max_grad_norm) == (
        0.99,
        0.95,
        0.5,
    )
    assert hyperparameters.normalize_advantages and hyperparameters.target_kl is None


def test_cleanrl_output_gives_its_last_speed_and_the_final_window_return(atari_pong):
    # 10,240 steps: the final return is over the episodes that ended after step 8,192 (the last 20%)
    output = "\n".join(
        [
            "global_step=3000, episodic_return=[-21.]",
            "SPS: 140",
            "global_step=8192, episodic_return=[-20.]",  # not after 8,192: left out
            "global_step=8200, episodic_return=[-19.]",
            "global_step=10000, episodic_return=-17.0",
            "SPS: 151",
        ]
    )
    parsed = atari_pong.parse_cleanrl(output, total_steps=10_240)
    assert parsed["own_clock_steps_per_s"] == 151.0
    assert (parsed["episodes"], parsed["final_episodes"]) == (4, 2)
    assert parsed["final_return"] == pytest.approx(-18.0)


def test_phalanx_run_files_give_its_speed_and_the_final_window_return(atari_pong, tmp_path):
    summary = {"total_steps": 10_240, "compile_time_s": 2.0, "eval_return_mean": -21.0, "error": None}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "metrics.csv").write_text(
        "steps,wall_time_s,episodes,episode_return_mean\n"
        "8192,40.0,3,-21.0\n"
        "9216,45.0,1,-19.0\n"  # the final window: episodes weighted by their counts
        "10240,52.0,3,-20.0\n"
    )
    parsed = atari_pong.parse_phalanx(tmp_path, total_steps=10_240)
    assert parsed["own_clock_steps_per_s"] == pytest.approx(10_240 / 50.0)  # compilation left out
    assert (parsed["episodes"], parsed["final_episodes"]) == (7, 4)
    assert parsed["final_return"] == pytest.approx((-19.0 - 60.0) / 4)


@pytest.mark.parametrize("recurrent", [True, False])
def test_recurrent_phalanx_commands_set_rl_zoo_settings(recurrent_cartpole, recurrent):
    arguments = ["ppo", "CartPoleNoVel-v1", *recurrent_cartpole.phalanx_hyperparameters(recurrent)]
    config = parse_train_args(arguments)
    hyperparameters = config.hyperparameters
    assert config.num_envs == 8 and config.normalize_obs and config.normalize_reward
    assert hyperparameters.recurrent == ("lstm" if recurrent else None)
    if recurrent:
        assert (hyperparameters.recurrent_hidden_size, hyperparameters.sequence_length) == (64, 32)
        assert hyperparameters.burn_in == 0
    assert tuple(hyperparameters.hidden_sizes) == (64,) and hyperparameters.activation == "relu"
    assert (hyperparameters.horizon, hyperparameters.minibatch_size, hyperparameters.epochs) == (32, 256, 20)
    assert hyperparameters.learning_rate == 1e-3 and hyperparameters.anneal_lr
    assert (hyperparameters.clip_range, hyperparameters.clip_value, hyperparameters.entropy_coef) == (
        0.2,
        None,
        0.0,
    )
    assert (hyperparameters.gamma, hyperparameters.gae_lambda) == (0.98, 0.8)


def test_median_steps_counts_a_seed_that_never_reached_as_slowest(recurrent_cartpole):
    median = recurrent_cartpole.median_steps
    assert median([{"steps_to_threshold": s} for s in (30_000, None, 10_000)]) == 30_000
    assert median([{"steps_to_threshold": s} for s in (10_000, 20_000, 30_000, None)]) == 25_000
    assert median([{"steps_to_threshold": s} for s in (10_000, None, None)]) is None
    assert median([{"error": "exit 2"}]) is None
