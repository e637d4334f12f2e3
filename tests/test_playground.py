"""The MuJoCo Playground adapter (phalanx.envs.playground): ``playground:<EnvName>`` ids.

Skipped when the ``playground`` package is not installed (`pip install 'phalanx[playground]'`).
The default suite checks what needs no MJX compilation (the refusals, errors and spaces); compiling
an MJX task's reset and step takes a minute or more on a CPU, so the contract, truncation, resume
and learning checks compile one small env once (a module-scoped fixture) and are marked slow.
"""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip(
    "mujoco_playground", reason="playground is not installed (pip install 'phalanx[playground]')"
)

from mujoco_playground._src import dm_control_suite, locomotion, manipulation, mjx_env  # noqa: E402

from phalanx.envs import check_vec_env, make_env  # noqa: E402
from phalanx.envs.playground import PlaygroundVecEnv, playground_envs  # noqa: E402
from phalanx.errors import EnvError  # noqa: E402

EPISODE_LENGTH = 25
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def no_menagerie(monkeypatch, tmp_path):
    """Menagerie absent, and any attempt to download it (Playground runs `git clone`) fails the test."""
    monkeypatch.setattr(mjx_env, "MENAGERIE_PATH", tmp_path / "mujoco_menagerie")

    def no_download(*args, **kwargs):
        raise AssertionError(f"a download was attempted: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_download)
    monkeypatch.setattr(subprocess, "run", no_download)
    monkeypatch.setattr(mjx_env, "ensure_menagerie_exists", no_download)


@pytest.mark.parametrize("name", [locomotion.ALL_ENVS[0], "Go1JoystickFlatTerrain", manipulation.ALL_ENVS[0]])
def test_tasks_whose_robots_are_not_shipped_are_refused_before_any_download(no_menagerie, name):
    with pytest.raises(EnvError) as caught:
        make_env(f"playground:{name}", 2)
    message = str(caught.value)
    assert "Menagerie" in message and "does not ship" in message
    assert (
        f"git clone https://github.com/google-deepmind/mujoco_menagerie {mjx_env.MENAGERIE_PATH}" in message
    )
    assert mjx_env.MENAGERIE_COMMIT_SHA in message  # the commit Playground pins
    assert "CheetahRun" in message  # the tasks that run without a download


def test_playground_envs_separates_shipped_tasks_from_menagerie_ones(no_menagerie):
    envs = playground_envs()
    assert envs["ready"] == list(dm_control_suite.ALL_ENVS)
    assert set(envs["needs_menagerie"]) == set(locomotion.ALL_ENVS) | set(manipulation.ALL_ENVS)


def test_unknown_name_suggests_the_close_ones():
    with pytest.raises(
        EnvError, match=r"unknown MuJoCo Playground environment 'CheetaRun'.*Did you mean: CheetahRun"
    ):
        make_env("playground:CheetaRun", 2)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (
            {"config_overrides": {"episode_lenght": 10}},
            r"no field 'episode_lenght'; its fields are \[.*'episode_length'",
        ),
        ({"config_overrides": {"vision_config.nope": 1}}, r"vision_config has no field 'nope'"),
        ({"config_overrides": {"episode_length": "long"}}, r"does not fit the field"),
        ({"config_overrides": {"vision": True}}, r"vision=True asks for pixel observations"),
        ({"episode_length": 0}, r"episode_length must be an integer >= 1, got 0"),
        ({"action_repeat": 2.5}, r"action_repeat must be an integer >= 1, got 2.5"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(kwargs, expected):
    with pytest.raises(EnvError, match=expected):
        make_env("playground:CartpoleBalance", 2, **kwargs)


def test_without_the_extra_the_error_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco_playground", None)
    with pytest.raises(EnvError, match=r"pip install 'phalanx\[playground\]'"):
        make_env("playground:CheetahRun", 2)


@pytest.fixture(scope="module")
def playground_ppo():
    """benchmarks/playground_ppo.py, loaded as a module (its training imports happen only in ``run``)."""
    spec = importlib.util.spec_from_file_location("playground_ppo", BENCHMARKS / "playground_ppo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["playground_ppo"] = module
    spec.loader.exec_module(module)
    return module


def test_benchmark_records_playgrounds_brax_ppo_config_for_every_task(playground_ppo):
    from brax.training.agents.ppo import networks
    from flax import linen
    from mujoco_playground.config import dm_control_suite_params

    for name in dm_control_suite.ALL_ENVS:
        recorded = playground_ppo.brax_ppo_config(name)
        shipped = dm_control_suite_params.brax_ppo_config(name)
        for field in ("num_envs", "num_timesteps", "unroll_length", "batch_size", "num_minibatches"):
            assert recorded[field] == shipped[field], (name, field)
        for field in ("num_updates_per_batch", "discounting", "learning_rate", "entropy_cost"):
            assert recorded[field] == shipped[field], (name, field)
        for field in ("action_repeat", "reward_scaling", "normalize_observations"):
            assert recorded[field] == shipped[field], (name, field)
        assert "network_factory" not in shipped  # so the networks are Brax's defaults
    defaults = inspect.signature(networks.make_ppo_networks).parameters
    config = playground_ppo.BRAX_PPO
    assert tuple(defaults["policy_hidden_layer_sizes"].default) == config["policy_hidden_layer_sizes"]
    assert tuple(defaults["value_hidden_layer_sizes"].default) == config["value_hidden_layer_sizes"]
    assert config["activation"] == "swish" and defaults["activation"].default is linen.swish  # = silu
    # the paper's Table IV has a PPO throughput for every DM Control task Playground registers
    assert set(playground_ppo.PPO_STEPS_PER_SECOND) == set(dm_control_suite.ALL_ENVS)


def test_benchmark_runs_the_tasks_playground_settings(playground_ppo):
    finger = playground_ppo.plan(playground_ppo.parse(["--env", "FingerSpin", "--device", "cuda"]))
    assert (finger["gamma"], finger["total_steps"], finger["num_envs"]) == (0.95, 60_000_000, 4_096)
    # Brax's minibatch of batch_size x unroll_length = 1,024 x 30 samples, 16 passes
    assert (finger["horizon"], finger["minibatch_size"], finger["epochs"]) == (30, 30_720, 16)
    walker = playground_ppo.plan(playground_ppo.parse(["--env", "WalkerRun", "--device", "cuda"]))
    assert (walker["gamma"], walker["total_steps"]) == (0.995, 100_000_000)
    on_cpu = playground_ppo.plan(playground_ppo.parse(["--env", "WalkerRun", "--total-steps", "3840"]))
    assert (on_cpu["total_steps"], on_cpu["num_envs"], on_cpu["minibatch_size"]) == (3_840, 64, 480)
    table = playground_ppo.settings_table("FingerSpin", finger)
    assert "| discount | 0.95 (discounting) | 0.95 |" in table
    assert (
        "| env steps per update | 983,040 (batch_size x num_minibatches x unroll_length) | 122,880" in table
    )
    assert playground_ppo.reference("CheetahRun")["steps_per_second"] == 435_162
    assert playground_ppo.reference("CheetahRun")["final_return"] is None  # the paper plots it only
    assert playground_ppo.reference("NoSuchTask") is None


def test_spaces_and_time_limit_in_agent_steps():
    env = PlaygroundVecEnv("CheetahRun", num_envs=3, action_repeat=3)  # builds and traces; compiles nothing
    assert env.single_observation_space.shape == (17,)  # qpos[1:] (8) and qvel (9)
    assert env.single_action_space.shape == (6,)
    assert np.all(env.single_action_space.low == -1) and np.all(env.single_action_space.high == 1)
    assert env.max_episode_steps == 334  # 1000 simulator steps, 3 per agent step: Playground stops at 1002
    assert env.config.impl == "warp"  # Playground 0.2's own choice for the DM Control tasks
    assert repr(env) == "PlaygroundVecEnv('CheetahRun', num_envs=3, device=cpu)"


# -- compiled (slow) -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cartpole():
    torch.set_num_threads(1)
    env = make_env("playground:CartpoleBalance", 4, episode_length=EPISODE_LENGTH, seed=0)
    yield env
    env.close()


@pytest.mark.slow
def test_passes_check_vec_env(cartpole):
    report = check_vec_env(cartpole, num_steps=3 * EPISODE_LENGTH)
    assert report.episodes >= 8
    assert report.mean_episode_length == EPISODE_LENGTH
    assert 0 < report.mean_episode_return <= EPISODE_LENGTH  # DM Control rewards are in [0, 1] per step


@pytest.mark.slow
def test_truncates_at_episode_length_with_the_final_observation(cartpole):
    obs, _ = cartpole.reset(seed=3)
    actions = torch.zeros(4, 1)
    for step in range(1, EPISODE_LENGTH + 1):
        previous = obs.clone()
        obs, reward, terminated, truncated, info = cartpole.step(actions)
        assert not terminated.any()
        assert bool(truncated.all()) == (step == EPISODE_LENGTH)
    assert torch.equal(info["_final_obs"], torch.ones(4, dtype=torch.bool))
    assert torch.allclose(info["final_obs"], previous, atol=0.1)  # the last state, one small step on
    assert not torch.allclose(info["final_obs"], obs)  # obs is the next episode's first observation
    assert info["episode_length"].tolist() == [EPISODE_LENGTH] * 4
    obs, _, _, truncated, _ = cartpole.step(actions)
    assert not truncated.any()  # the new episodes run on


@pytest.mark.slow
def test_state_dict_resumes_the_same_trajectory(cartpole):
    cartpole.reset(seed=5)
    actions = [torch.rand(4, 1) * 2 - 1 for _ in range(EPISODE_LENGTH + 5)]  # crosses a reset
    for action in actions[:7]:
        cartpole.step(action)
    saved = cartpole.state_dict()
    first = [cartpole.step(action)[:2] for action in actions[7:]]
    cartpole.load_state_dict(saved)
    again = [cartpole.step(action)[:2] for action in actions[7:]]
    for (obs, reward), (obs_again, reward_again) in zip(first, again, strict=True):
        assert torch.equal(obs, obs_again) and torch.equal(reward, reward_again)


@pytest.mark.slow
def test_ppo_runs_on_a_playground_task(tmp_path):
    import phalanx

    torch.set_num_threads(1)
    config = phalanx.make_config(
        "ppo",
        "playground:CartpoleBalance",
        num_envs=16,
        total_steps=16 * 32 * 4,
        horizon=32,
        minibatch_size=128,
        eval_every=0,
        eval_episodes=2,
        run_dir=str(tmp_path / "run"),
        seed=0,
    )
    summary = phalanx.train(config).summary
    assert summary["total_steps"] == 2048 and summary["error"] is None
    assert summary["eval_episodes"] == 2
    assert 0 < summary["eval_return_mean"] <= 1000  # two whole 1,000-step episodes, rewards in [0, 1]


@pytest.mark.slow
def test_warp_says_nothing_but_warnings(tmp_path):
    """MuJoCo Warp's banner and its line per compiled or loaded module (some thirty) are not printed."""
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from phalanx.envs import make_env\n"
        "env = make_env('playground:CartpoleBalance', 2, seed=0)\n"
        "env.reset(seed=0)\n"
        "env.step(torch.zeros(2, 1))\n"
        "print('stepped')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "stepped" in output, output[-3000:]
    assert "Module " not in output and "initialized" not in output, output[-3000:]
