"""The runtime end to end: learning, run directory, checkpoints, exact resume, Ctrl+C, deployment."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

import phalanx
from phalanx.errors import CheckpointError, ConfigError
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.logging import read_table
from phalanx.train.loop import TrainingInterrupted
from phalanx.train.trainer import Trainer


def small_config(tmp_path, name="run", **overrides):
    settings = dict(
        num_envs=8,
        total_steps=2048,
        eval_every=1024,
        eval_episodes=3,
        log_every=256,
        run_dir=str(tmp_path / name),
        horizon=16,
        minibatch_size=64,
        epochs=2,
        hidden_sizes=(16, 16),
    )
    settings.update(overrides)
    return phalanx.make_config("ppo", settings.pop("env", "CartPole-v1"), use_preset=False, **settings)


def parameters(run_dir, which="latest"):
    state = load_checkpoint(phalanx.agent.resolve_checkpoint(run_dir, which))
    return {**state["algorithm"]["policy"], **{"v." + k: v for k, v in state["algorithm"]["value"].items()}}


def test_ppo_learns_cartpole_with_fixed_budget(tmp_path):
    # The preset solves seed 1 in ~50-106k env steps; the budget leaves 1.5-3x margin. Evaluations in
    # this process (not the preset's evaluation process), so that every run stops at the same step.
    config = phalanx.make_config(
        "ppo",
        "CartPole-v1",
        run_dir=str(tmp_path / "cartpole"),
        total_steps=150_000,
        stop_return=475,
        seed=1,
        eval_process=False,
    )
    result = phalanx.train(config, show_progress=False)
    assert result.summary["eval_return_mean"] >= 475, result.summary
    assert result.summary["time_to_stop_return_s"] is not None
    assert result.summary["total_steps"] < 150_000, result.summary


def test_a2c_learns_cartpole_with_fixed_budget(tmp_path):
    # The preset solves seed 0 in ~60k env steps; the budget leaves 2.5x margin.
    config = phalanx.make_config(
        "a2c", "CartPole-v1", run_dir=str(tmp_path / "a2c"), total_steps=150_000, stop_return=475, seed=0
    )
    result = phalanx.train(config, show_progress=False)
    assert result.summary["best_eval_return"] >= 475, result.summary


def test_ppo_continuous_improves_on_pendulum(tmp_path):
    # A random policy scores about -1200; the preset reaches -200 on seed 0 in ~30k env steps.
    config = phalanx.make_config(
        "ppo",
        "Pendulum-v1",
        run_dir=str(tmp_path / "pendulum"),
        total_steps=160_000,
        stop_return=-200,
        seed=0,
        eval_process=False,
    )
    result = phalanx.train(config, show_progress=False)
    assert result.summary["best_eval_return"] >= -200, result.summary


@pytest.mark.parametrize("minibatch_size", [64, 48])  # 128 samples: 2 minibatches, or 48 + 48 + 32
def test_ppo_update_metrics_and_the_kl_early_stop(tmp_path, minibatch_size):
    # a large learning rate: the second epoch's ratios are far from 1, some beyond the clip range
    config = small_config(tmp_path, minibatch_size=minibatch_size, learning_rate=0.05)
    trainer = Trainer(config, show_progress=False)
    try:
        trainer.worker.collect(trainer.buffer)
        algorithm, steps_per_epoch = trainer.algorithm, -(-128 // minibatch_size)
        metrics = algorithm.update(trainer.buffer, progress=0.0)
        assert metrics["gradient_steps"] == 2 * steps_per_epoch  # epochs = 2
        assert metrics["approx_kl"] > 0 and 0 < metrics["clip_fraction"] < 1
        assert all(torch.isfinite(value) for value in metrics.values())
        algorithm.config.target_kl = 1e-12  # exceeded by any step: the update ends after its first epoch
        assert algorithm.update(trainer.buffer, progress=0.0)["gradient_steps"] == steps_per_epoch
    finally:
        trainer.close()


def test_run_directory_layout(tmp_path):
    result = phalanx.train(small_config(tmp_path), show_progress=False)
    run = result.run_dir
    for name in ("config.yaml", "metrics.csv", "evaluations.csv", "curve.png", "summary.json"):
        assert (run / name).is_file(), name
    assert list(run.glob("events.out.tfevents.*"))
    assert (run / "checkpoints" / "best" / "state.pt").is_file()
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_2048"
    state = torch.load(run / "checkpoints" / latest / "state.pt", weights_only=True)
    assert state["progress"]["steps"] == 2048
    summary = json.loads((run / "summary.json").read_text())
    for key in ("env", "algo", "seed", "total_steps", "wall_time_s", "time_to_stop_return_s"):
        assert key in summary
    assert summary["time_to_stop_return_s"] is None
    assert summary["eval_return_mean"] is not None and summary["eval_return_std"] is not None
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["hyperparameters"]["horizon"] == 16
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["steps", "wall_time_s", "steps_per_second"]


def test_metrics_and_evaluations_are_one_tidy_table_each(tmp_path):
    """metrics.csv: a training row per log step, with all of its columns; evaluations.csv: a row per
    evaluation, keyed by the step of the weights evaluated. A resume drops the rows a run logged after
    the checkpoint it goes on from (then was killed), so each step is in each table once."""
    run = phalanx.train(small_config(tmp_path, total_steps=1024), show_progress=False).run_dir
    for name in ("metrics.csv", "evaluations.csv"):  # logged after the last checkpoint, before a kill
        header = (run / name).read_text().splitlines()[0]
        with (run / name).open("a") as file:
            file.write("1280" + "," * header.count(",") + "\n")
    phalanx.resume(run, total_steps=2048, show_progress=False)

    training = read_table(run / "metrics.csv")
    assert [row["steps"] for row in training] == [128, *range(256, 2049, 256)]
    for key in ("wall_time_s", "steps_per_second", "updates", "updates_per_second", "policy_loss"):
        assert all(key in row for row in training), key
    assert not [key for row in training for key in row if key.startswith("eval")]
    evaluations = read_table(run / "evaluations.csv")
    assert [row["steps"] for row in evaluations] == [1024, 2048]
    columns = ["steps", "wall_time_s", "eval_return_mean", "eval_return_std", "eval_length_mean"]
    assert all(list(row) == [*columns, "result_wall_time_s"] for row in evaluations)


def test_metrics_csv_ends_with_the_runs_last_step(tmp_path):
    """log_every = 600 does not divide the 2,048 steps (rollouts of 128): the steps after the last log
    step get a row of their own at the end, the run's last step, once."""
    result = phalanx.train(small_config(tmp_path, log_every=600), show_progress=False)
    training = read_table(result.run_dir / "metrics.csv")
    assert [row["steps"] for row in training] == [128, 640, 1280, 1920, 2048]
    assert training[-1]["steps"] == result.summary["total_steps"]
    assert training[-1]["updates"] == 2048 // 128


def test_ctrl_c_writes_the_last_row_and_a_resume_neither_repeats_nor_loses_rows(tmp_path, interrupt_update):
    trainer = Trainer(small_config(tmp_path, log_every=600), show_progress=False)
    interrupt_update(trainer, 3)  # Ctrl+C in the 3rd update: the run stops at 3 * 128 steps
    with pytest.raises(TrainingInterrupted):
        trainer.train()
    assert [row["steps"] for row in read_table(trainer.run_dir / "metrics.csv")] == [128, 384]
    phalanx.resume(trainer.run_dir, show_progress=False)
    steps = [row["steps"] for row in read_table(trainer.run_dir / "metrics.csv")]
    assert steps == [128, 384, 640, 1280, 1920, 2048]


def test_checkpoint_rotation_keeps_the_last_few(tmp_path):
    config = small_config(tmp_path, checkpoint_every=256, keep_checkpoints=2)
    result = phalanx.train(config, show_progress=False)
    steps = sorted(p.name for p in (result.run_dir / "checkpoints").glob("step_*"))
    assert steps == ["step_1792", "step_2048"]


def test_seeded_runs_repeat_exactly(tmp_path):
    a = phalanx.train(small_config(tmp_path, "a", seed=3), show_progress=False)
    b = phalanx.train(small_config(tmp_path, "b", seed=3), show_progress=False)
    c = phalanx.train(small_config(tmp_path, "c", seed=4), show_progress=False)
    pa, pb, pc = parameters(a.run_dir), parameters(b.run_dir), parameters(c.run_dir)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


@pytest.mark.parametrize(
    "env, extra",
    [("CartPole-v1", {}), ("Pendulum-v1", {"normalize_obs": True, "normalize_reward": True})],
)
def test_resume_continues_exactly(tmp_path, env, extra):
    straight = phalanx.train(
        small_config(tmp_path, "straight", env=env, total_steps=4096, **extra), show_progress=False
    )
    half = phalanx.train(
        small_config(tmp_path, "half", env=env, total_steps=2048, **extra), show_progress=False
    )
    resumed = phalanx.resume(half.run_dir, total_steps=4096, show_progress=False)
    assert resumed.summary["total_steps"] == 4096
    a, b = parameters(straight.run_dir), parameters(resumed.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed parameters differ from the straight run"
    rows = (resumed.run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("steps,") and len(rows) > 10  # appended, header once


def test_deployed_agent_reproduces_final_evaluation(tmp_path):
    result = phalanx.train(small_config(tmp_path, env="Pendulum-v1", normalize_obs=True), show_progress=False)
    evaluation = phalanx.evaluate(result.run_dir, episodes=3, checkpoint="latest")
    assert evaluation.mean == pytest.approx(result.summary["eval_return_mean"], rel=1e-5)
    agent = phalanx.load_agent(result.run_dir, checkpoint="latest")
    single = agent.act(np.zeros(3, dtype=np.float32))
    assert single.shape == (1,) and -2.0 <= single[0] <= 2.0
    batch = agent.act(torch.zeros(5, 3))
    assert batch.shape == (5, 1)
    with pytest.raises(ValueError, match=r"expected \(3,\)"):
        agent.act(np.zeros(4, dtype=np.float32))


def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path, interrupt_update):
    trainer = Trainer(small_config(tmp_path), show_progress=False)
    interrupt_update(trainer, 3)
    with pytest.raises(TrainingInterrupted, match="phalanx resume"):
        trainer.train()
    summary = json.loads((trainer.run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["total_steps"] == 3 * 128
    resumed = phalanx.resume(trainer.run_dir, show_progress=False)
    assert resumed.summary["total_steps"] == 2048


def test_existing_run_directory_is_never_overwritten(tmp_path):
    run = tmp_path / "taken"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="never overwrites"):
        Trainer(small_config(tmp_path, "taken"), show_progress=False)
    assert (run / "notes.txt").read_text() == "mine"


def test_resume_refuses_a_changed_config(tmp_path):
    result = phalanx.train(small_config(tmp_path), show_progress=False)
    path = result.run_dir / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["hyperparameters"]["hidden_sizes"] = [32, 32]
    path.write_text(yaml.safe_dump(data))
    before = sorted(p.name for p in (result.run_dir / "checkpoints").iterdir())
    with pytest.raises(CheckpointError, match=r"hyperparameters.hidden_sizes: checkpoint has \[16, 16\]"):
        phalanx.resume(result.run_dir, total_steps=4096, show_progress=False)
    assert sorted(p.name for p in (result.run_dir / "checkpoints").iterdir()) == before


def test_foreign_and_corrupt_checkpoints_are_refused(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match="not a phalanx checkpoint"):
        load_checkpoint(foreign)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00not a zip file at all")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(corrupt)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


def test_deployed_agent_normalises_exactly_as_the_training_env(tmp_path):
    from phalanx.envs.wrappers import NormalizeObservation, find_wrapper
    from phalanx.train.environments import build_env

    result = phalanx.train(small_config(tmp_path, env="Pendulum-v1", normalize_obs=True), show_progress=False)
    agent = phalanx.load_agent(result.run_dir, checkpoint="latest")
    env = build_env(agent.config, 5, training=False)
    find_wrapper(env, NormalizeObservation).statistics.load_state_dict(
        load_checkpoint(result.run_dir / "checkpoints" / "step_2048")["obs_statistics"]
    )
    normalised, _ = env.reset(seed=7)
    raw = env.unwrapped.state  # Pendulum's observation is (cos, sin, thetadot) of this state
    raw_obs = torch.stack([raw[:, 0].cos(), raw[:, 0].sin(), raw[:, 1]], dim=1).float()
    expected = 2.0 * agent.algorithm.act(normalised).clamp(-1, 1)  # Pendulum's bounds are [-2, 2]
    torch.testing.assert_close(agent.act(raw_obs), expected, rtol=1e-5, atol=1e-6)


def test_default_logging_scales_to_the_run_so_a_short_run_has_a_readable_curve(tmp_path):
    """log_every 0 (the default): total_steps / 100 steps between rows, at most 10,000; a 4,096-step run
    logs every iteration (128 steps) rather than once at its end."""
    config = small_config(tmp_path, total_steps=4096, log_every=0, eval_every=0)
    assert config.log_interval == 40 and phalanx.make_config("ppo", "CartPole-v1").log_interval == 5_000
    assert phalanx.make_config("sac", "Pendulum-v1", total_steps=10**7).log_interval == 10_000
    result = phalanx.train(config, show_progress=False)
    rows = read_table(result.run_dir / "metrics.csv")
    assert [row["steps"] for row in rows] == [128.0 * k for k in range(1, 33)]
