"""The MuJoCo presets (PPO, SAC, TD3 on HalfCheetah, Hopper, Walker2d, Ant, Humanoid v5), the replay
memory check before allocating, the errors and warnings of MuJoCo ids, and benchmarks/mujoco_returns.py's
reading, planning and reporting of runs (its learning runs take hours: they are not run here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from phalanx.buffers import ReplayBuffer, StepLayout
from phalanx.cli import parse_train_args
from phalanx.config import make_config, presets
from phalanx.envs.mujoco_warnings import SILENCED, forward_warning, is_gymnasium_mujoco
from phalanx.errors import ConfigError
from phalanx.train.checkpoint import STATE

ROOT = Path(__file__).resolve().parents[1]
MUJOCO_ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
SETTOTALMASS = (
    "compiler attribute 'settotalmass' is deprecated and will be removed in a future release: scale the "
    "masses and densities in the model, or call mj_setTotalmass and mj_setConst on the compiled model"
)


def load_benchmark(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def returns():
    return load_benchmark("mujoco_returns")


# -- presets -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["ppo", "sac", "td3"])
@pytest.mark.parametrize("env", MUJOCO_ENVS)
def test_every_mujoco_preset_loads_and_validates(algo, env):
    assert env in presets(algo)
    config = make_config(algo, env)
    config.validate()
    assert (config.num_envs, config.num_workers) == (16, 2)
    assert config.total_steps >= 1_000_000
    assert config.eval_every > 0 and config.eval_episodes == 5


@pytest.mark.parametrize("env", MUJOCO_ENVS)
def test_td3_presets_are_cleanrls_settings(env):
    hp = make_config("td3", env).hyperparameters
    assert hp.hidden_sizes == (256, 256) and hp.activation == "relu"
    assert hp.learning_rate == 3e-4 and hp.critic_learning_rate is None  # both at 3e-4, as CleanRL
    assert (hp.batch_size, hp.buffer_size, hp.learning_starts) == (256, 1_000_000, 25_000)
    assert (hp.tau, hp.gamma, hp.updates_per_step) == (0.005, 0.99, 1.0)
    assert (hp.exploration_noise, hp.target_noise, hp.target_noise_clip) == (0.1, 0.2, 0.5)
    assert (hp.policy_delay, hp.num_critics, hp.target_reduction) == (2, 2, "min")


def test_ppo_presets_sample_2048_transitions_per_update_in_minibatches_of_64():
    for env in MUJOCO_ENVS:
        config = make_config("ppo", env)
        hp = config.hyperparameters
        assert config.num_envs * hp.horizon == 2048 and hp.minibatch_size == 64 and hp.epochs == 10
        assert config.normalize_obs and config.normalize_reward and hp.anneal_lr


# -- the replay memory check ---------------------------------------------------------------------------
HUMANOID_BYTES = 1_000_000 * (2 * 348 * 4 + 17 * 4 + 4 + 1 + 1)
"""The SAC/TD3 Humanoid-v5 preset's replay: 1M transitions of two float32 (348,) observations, a float32
(17,) action, a float32 reward and two bool flags."""


def fake_memory(monkeypatch, available):
    monkeypatch.setattr("phalanx.buffers.memory.available_memory", lambda device: available)


HUMANOID = StepLayout((348,), torch.float32, (17,), torch.float32)
"""Humanoid's observations and actions."""


def humanoid_replay(members=1):
    return ReplayBuffer(1_000_000 * members, 16 * members, HUMANOID, "cpu", members=members)


def test_replay_that_does_not_fit_is_refused_with_bytes_and_fix(monkeypatch):
    assert ReplayBuffer.bytes_needed(1_000_000, HUMANOID) == HUMANOID_BYTES
    fake_memory(monkeypatch, 2 * 2**30)
    fits = int(0.9 * 2 * 2**30 / (HUMANOID_BYTES / 1_000_000))
    with pytest.raises(ConfigError) as error:
        humanoid_replay()
    message = str(error.value)
    assert f"{HUMANOID_BYTES:,} bytes needed, {2 * 2**30:,} available" in message
    assert "2.66 GiB on cpu, but only 2.00 GiB is available" in message
    assert f"lower --buffer-size to at most {fits:,} transitions" in message
    assert "members" not in message


def test_population_replay_that_does_not_fit_says_to_use_fewer_members(monkeypatch):
    fake_memory(monkeypatch, 8 * 2**30)  # 90% of it holds two members' 1M-transition replays, not four
    with pytest.raises(
        ConfigError, match=r"4 members x 1,000,000 transitions.*use fewer members \(at most 2 "
    ):
        humanoid_replay(members=4)


def test_replay_that_fits_is_allocated(monkeypatch):
    fake_memory(monkeypatch, 10 * 2**30)
    ReplayBuffer(1000, 4, HUMANOID, "cpu")  # no error


def test_trainer_refuses_a_preset_the_machine_cannot_hold_before_creating_the_run(monkeypatch, tmp_path):
    pytest.importorskip("mujoco", reason="MuJoCo envs need the mujoco extra: pip install 'phalanx[mujoco]'")
    from phalanx.train.trainer import Trainer

    fake_memory(monkeypatch, 64 * 2**20)
    config = make_config("td3", "Hopper-v5", num_envs=2, num_workers=0, run_dir=str(tmp_path / "run"))
    with pytest.raises(
        ConfigError, match=r"1,000,000 transitions \(obs \(11,\), actions \(3,\).*--buffer-size"
    ):
        Trainer(config, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


# -- MuJoCo without the extra; MuJoCo's warnings ---------------------------------------------------------
def test_a_mujoco_id_without_the_extra_names_the_extra_to_install():
    blocked = textwrap.dedent(
        """
        import importlib.abc, sys

        class NoMujoco(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "mujoco" or name.startswith("mujoco."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoMujoco())
        from phalanx.envs import make_env
        from phalanx.errors import EnvError
        try:
            make_env("Hopper-v5", num_envs=2)
        except EnvError as error:
            print(error)
        """
    )
    output = subprocess.run(
        [sys.executable, "-c", blocked],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert "Environment 'Hopper-v5' is known to Gymnasium but cannot be built" in output.stdout, output.stderr
    assert "pip install 'phalanx[mujoco]'" in output.stdout


def test_only_gymnasium_mujoco_ids_get_the_warning_filter():
    assert all(is_gymnasium_mujoco(env) for env in MUJOCO_ENVS)
    assert not is_gymnasium_mujoco("CartPole-v1") and not is_gymnasium_mujoco("not-an-env")


def test_the_filter_drops_only_the_deprecation_of_gymnasiums_xml(capsys):
    seen = []
    handler = forward_warning(seen.append)
    handler(SETTOTALMASS)
    handler("Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.")
    assert seen == ["Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable."]
    forward_warning(None)(SETTOTALMASS)
    forward_warning(None)("something else")
    assert capsys.readouterr().err == "WARNING: something else\n"
    assert SETTOTALMASS.startswith(SILENCED)


def test_halfcheetah_is_made_without_the_settotalmass_warning(capfd, monkeypatch, tmp_path):
    mujoco = pytest.importorskip("mujoco", reason="needs the mujoco extra: pip install 'phalanx[mujoco]'")
    from phalanx.envs import make_env

    monkeypatch.chdir(tmp_path)  # MuJoCo's default handler would append to ./MUJOCO_LOG.TXT
    seen = []
    previous = seen.append
    mujoco.set_mju_user_warning(previous)  # a handler of the user's, restored after
    try:
        make_env("HalfCheetah-v5", num_envs=2).close()
        assert mujoco.get_mju_user_warning() is previous
    finally:
        mujoco.set_mju_user_warning(None)
    make_env("HalfCheetah-v5", num_envs=2).close()
    assert mujoco.get_mju_user_warning() is None
    assert seen == [] and "settotalmass" not in capfd.readouterr().err
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


@pytest.mark.slow
def test_td3_preset_trains_a_few_steps_on_halfcheetah(tmp_path):
    """The preset's networks, noise and delayed updates run end to end (1,024 env steps, ~128 updates)."""
    pytest.importorskip("mujoco", reason="needs the mujoco extra: pip install 'phalanx[mujoco]'")
    from phalanx.train.entry import train

    torch.set_num_threads(1)
    config = make_config(
        "td3",
        "HalfCheetah-v5",
        num_envs=4,
        num_workers=0,
        total_steps=1024,
        eval_every=1024,
        eval_episodes=1,
        learning_starts=512,
        updates_per_step=0.25,
        buffer_size=4096,
        run_dir=str(tmp_path / "run"),
    )
    result = train(config, show_progress=False)
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert summary["total_steps"] == 1024 and abs(summary["updates"] - 0.25 * (1024 - 512)) <= 1
    assert summary["eval_return_mean"] is not None and not summary["interrupted"]


# -- benchmarks/mujoco_returns.py ------------------------------------------------------------------------
def write_run(run_dir: Path, algo, env, seed, total_steps, evaluations, training, summary_steps=None):
    """A run directory as phalanx train writes it: config.yaml, evaluations.csv, metrics.csv, and
    summary.json once it has ended (``summary_steps``)."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        f"algo: {algo}\nenv: {env}\nseed: {seed}\ntotal_steps: {total_steps}\n"
    )
    rows = "".join(
        f"{steps},{steps / 1000},{value},1.0,1000,{steps / 1000}\n" for steps, value in evaluations
    )
    (run_dir / "evaluations.csv").write_text(
        "steps,wall_time_s,eval_return_mean,eval_return_std,eval_length_mean,result_wall_time_s\n" + rows
    )
    rows = "".join(f"{steps},{steps / 1000},{value}\n" for steps, value in training)
    (run_dir / "metrics.csv").write_text("steps,wall_time_s,episode_return_mean\n" + rows)
    if summary_steps is not None:
        summary = {"total_steps": summary_steps, "wall_time_s": summary_steps / 1000, "interrupted": False}
        (run_dir / "summary.json").write_text(json.dumps({**summary, "error": None}))


def test_runs_are_read_planned_and_compared_with_references_at_their_budget(returns, tmp_path):
    runs_dir = tmp_path / "runs"
    curve = [(100_000, 3000.0), (200_000, 7000.0), (300_000, 8000.0)]
    write_run(
        runs_dir / "td3-HalfCheetah-v5-s1",
        "td3",
        "HalfCheetah-v5",
        1,
        300_000,
        curve,
        [(300_000, 7500.0)],
        300_000,
    )
    write_run(
        runs_dir / "td3-HalfCheetah-v5-s2",
        "td3",
        "HalfCheetah-v5",
        2,
        300_000,
        [(100_000, 2000.0), (300_000, 9000.0), (300_000, 7000.0)],  # the last row of a step wins
        [(300_000, 6000.0)],
        300_000,
    )
    write_run(
        runs_dir / "td3-HalfCheetah-v5-s3", "td3", "HalfCheetah-v5", 3, 300_000, curve[:1], [(100_000, 10.0)]
    )
    runs = [
        returns.read_run(runs_dir / f"td3-HalfCheetah-v5-s{s}", "td3", "HalfCheetah-v5", s)
        for s in (1, 2, 3, 4)
    ]
    assert [r.status for r in runs] == ["finished", "finished", "partial", "missing"]
    assert (runs[1].final_eval, runs[1].best_eval, runs[1].best_eval_steps) == (7000.0, 9000.0, 300_000)
    assert (runs[2].steps, runs[2].final_training) == (100_000, 10.0)
    assert [returns.plan_run(r, 300_000) for r in runs] == ["skip", "skip", "stuck", "train"]
    assert returns.plan_run(runs[0], 1_000_000) == "stuck"  # no checkpoint to continue from
    checkpoints = runs_dir / "td3-HalfCheetah-v5-s1" / "checkpoints"
    (checkpoints / "best").mkdir(parents=True)
    (checkpoints / "best" / STATE).write_bytes(b"")
    assert returns.plan_run(runs[0], 1_000_000) == "stuck"  # the best evaluation's state is not the latest
    (checkpoints / "step_300000").mkdir()
    assert returns.plan_run(runs[0], 1_000_000) == "stuck"  # half-written: no state file yet
    (checkpoints / "step_300000" / STATE).write_bytes(b"")
    assert returns.plan_run(runs[0], 1_000_000) == "resume"

    result = returns.summarize("td3", "HalfCheetah-v5", 300_000, runs[:3])
    assert result["seeds_at_budget"] == [1, 2] and not result["partial"]
    assert result["medians"] == {"final_eval": 7500.0, "best_eval": 8500.0, "final_training": 6750.0}
    at_budget = result["references_at_budget"]
    assert [r["source"] for r in at_budget] == ["TD3 paper (Fujimoto et al., 2018)"]
    assert at_budget[0]["steps"] == 300_000 and at_budget[0]["kind"] == "evaluation"
    assert at_budget[0]["median"] == 7500.0 and at_budget[0]["reaches"] is False  # 7,500 < 7,697
    assert {r["steps"] for r in result["references_at_other_budgets"]} == {1_000_000}
    text = returns.report_markdown([result])
    assert "TD3 paper (Fujimoto et al., 2018) (HalfCheetah-v1, 300k steps, evaluation return)" in text
    assert "CleanRL (HalfCheetah-v4, 1M steps, training return)" in text.split("OTHER budgets")[1]

    figure = returns.draw_figure("td3", "HalfCheetah-v5", 300_000, runs[:3], tmp_path / "figures", "minmax")
    assert figure == tmp_path / "figures" / "mujoco_td3_HalfCheetah-v5.png" and figure.stat().st_size > 0


def test_partial_runs_are_summarized_but_never_judged(returns, tmp_path):
    write_run(
        tmp_path / "ppo-Hopper-v5-s1", "ppo", "Hopper-v5", 1, 1_000_000, [(20_480, 200.0)], [(20_480, 90.0)]
    )
    run = returns.read_run(tmp_path / "ppo-Hopper-v5-s1", "ppo", "Hopper-v5", 1)
    result = returns.summarize("ppo", "Hopper-v5", 1_000_000, [run])
    assert result["partial"] and result["medians"]["final_eval"] == 200.0
    assert {r["reaches"] for r in result["references_at_budget"]} == {None}
    assert "partial: s1 20.5k" in returns.report_markdown([result])


def test_the_train_command_is_the_preset_at_the_budget(returns, tmp_path):
    command = returns.train_command("sac", "Walker2d-v5", 2, 300_000, tmp_path / "run", ["--compile"])
    assert command[1:4] == ["-m", "phalanx.cli", "train"]
    config = parse_train_args(command[4:])
    assert (config.algo, config.env, config.seed, config.total_steps) == ("sac", "Walker2d-v5", 2, 300_000)
    assert config.run_dir == str(tmp_path / "run") and config.compile
    assert config.hyperparameters.learning_starts == 10_000  # the preset's


def test_references_name_their_budget_and_source(returns):
    from mujoco_references import MISSING, REFERENCES

    for reference in REFERENCES:
        assert reference.env in MUJOCO_ENVS and reference.kind in ("training", "evaluation")
        assert reference.url.startswith("https://github.com/") and reference.seeds >= 1
        assert reference.source_env.rsplit("-v", 1)[0] == reference.env.rsplit("-v", 1)[0]
        assert reference.source_env != reference.env  # v1/v3/v4 figures, said so in every label
        assert returns.steps_text(reference.steps) in reference.label()
    for env in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"):
        assert any(r.algo == "td3" and r.env == env and r.steps == 300_000 for r in REFERENCES)
        assert any(r.algo == "ppo" and r.env == env and r.steps == 1_000_000 for r in REFERENCES)
    assert not any(r.algo == "sac" and r.steps == 300_000 for r in REFERENCES)
    assert any("SAC at 300k" in line for line in MISSING)
