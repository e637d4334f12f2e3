"""Pipelined off-policy training: same steps and updates as the synchronous loop, bounded policy lag,
checkpoints and resume mid-pipeline, failures on either side, Ctrl+C, bad input."""

from __future__ import annotations

import csv
import json
import math
import threading
from copy import deepcopy

import pytest
import torch

import phalanx
from phalanx.envs.classic import PendulumEnv
from phalanx.envs.registry import unregister_env
from phalanx.errors import ConfigError
from phalanx.train.loop import TrainingInterrupted
from phalanx.train.pipeline import PipelineError
from phalanx.train.trainer import Trainer


def config(tmp_path, name, algo="sac", env="Pendulum-v1", **overrides):
    settings = dict(
        num_envs=8,
        total_steps=1600,
        eval_every=800,
        eval_episodes=2,
        log_every=200,
        run_dir=str(tmp_path / name),
        hidden_sizes=(16, 16),
        batch_size=64,
        learning_starts=320,
        buffer_size=5000,
        updates_per_step=0.5,
        torch_threads=1,
    )
    settings.update(overrides)
    return phalanx.make_config(algo, env, use_preset=False, **settings)


def pipeline_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "phalanx-pipeline-worker"]


def metrics(run_dir) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as file:
        return list(csv.DictReader(file))


ALGORITHMS = [("sac", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("ddpg", "Pendulum-v1"), ("dqn", "CartPole-v1")]


@pytest.mark.parametrize(("algo", "env"), ALGORITHMS)
def test_same_steps_and_updates_as_the_synchronous_loop(tmp_path, algo, env):
    synchronous = phalanx.train(config(tmp_path, "sync", algo, env), show_progress=False).summary
    pipelined = phalanx.train(config(tmp_path, "pipe", algo, env, pipeline=True), show_progress=False).summary
    assert pipelined["total_steps"] == synchronous["total_steps"] == 1600
    # updates start with the VecEnv step that fills the warm-up: (1600 - 320 + 8) steps at 0.5 each
    assert pipelined["updates"] == synchronous["updates"] == 644
    assert math.isfinite(pipelined["eval_return_mean"])
    assert pipeline_threads() == []
    if algo == "dqn":  # the epsilon the worker thread explored with is the one logged
        epsilons = [float(row["epsilon"]) for row in metrics(tmp_path / "pipe") if row.get("epsilon")]
        assert epsilons[-1] < epsilons[0]


def test_policy_lag_is_logged_and_within_its_bound(tmp_path):
    queue_size, sync_every, num_envs, ratio = 2, 3, 8, 0.5
    result = phalanx.train(
        config(tmp_path, "lag", pipeline=True, pipeline_queue=queue_size, sync_every=sync_every),
        show_progress=False,
    )
    rows = [row for row in metrics(result.run_dir) if row.get("policy_lag_max")]
    assert rows, "the policy lag is logged"
    bound = sync_every + (queue_size + 2) * math.ceil(num_envs * ratio)
    assert max(float(row["policy_lag_max"]) for row in rows) <= bound
    assert all(float(row["updates_per_second"]) >= 0 for row in rows)


def test_sac_learns_pendulum_pipelined(tmp_path):
    overrides = dict(
        num_envs=16,
        total_steps=8192,
        eval_every=4096,
        eval_episodes=4,
        hidden_sizes=(64, 64),
        batch_size=256,
        learning_starts=1024,
        buffer_size=100_000,
        updates_per_step=0.25,
        learning_rate=3e-3,
        tau=0.05,
        alpha_init=0.1,
        pipeline=True,
    )
    summary = phalanx.train(config(tmp_path, "learn", **overrides), show_progress=False).summary
    assert summary["best_eval_return"] > -400, summary  # random policy: about -1200


def test_checkpoint_and_resume_mid_pipeline(tmp_path):
    first = phalanx.train(
        config(tmp_path, "run", pipeline=True, checkpoint_every=400, total_steps=1200, save_buffer=True),
        show_progress=False,
    )
    resumed = phalanx.resume(first.run_dir, total_steps=1600, show_progress=False).summary
    reference = phalanx.train(config(tmp_path, "reference"), show_progress=False).summary
    assert resumed["total_steps"] == 1600 and resumed["updates"] == reference["updates"]
    checkpoints = [p for p in (first.run_dir / "checkpoints").iterdir() if p.name.startswith("step_")]
    assert checkpoints, "periodic checkpoints were written while the pipeline ran"
    assert pipeline_threads() == []


class FailingPendulum(PendulumEnv):
    """Pendulum that raises on its 30th step: a failure inside the pipeline's worker thread."""

    def step(self, actions):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 30:
            raise RuntimeError("the simulator broke")
        return super().step(actions)


def test_a_failure_in_the_worker_thread_stops_the_run_and_names_its_origin(tmp_path):
    phalanx.register_env("BrokenPendulum-v0", FailingPendulum)
    try:
        with pytest.raises(PipelineError, match="worker thread failed") as error:
            phalanx.train(
                config(tmp_path, "broken", env="BrokenPendulum-v0", pipeline=True), show_progress=False
            )
    finally:
        unregister_env("BrokenPendulum-v0")
    assert "the simulator broke" in str(error.value) and "FailingPendulum" in str(error.value)
    summary = json.loads((tmp_path / "broken" / "summary.json").read_text())
    assert "the simulator broke" in summary["error"]
    assert pipeline_threads() == []


def raise_in_update(monkeypatch, trainer: Trainer, call: int, error: BaseException) -> None:
    """Make the learner's ``call``-th update raise ``error`` (the updates before it run as usual)."""
    original, calls = trainer.learner.update, {"n": 0}

    def update(progress):
        calls["n"] += 1
        if calls["n"] == call:
            raise error
        return original(progress)

    monkeypatch.setattr(trainer.learner, "update", update)


def test_a_failure_in_the_learner_stops_the_worker_thread(tmp_path, monkeypatch):
    trainer = Trainer(config(tmp_path, "learner", pipeline=True), show_progress=False)
    raise_in_update(monkeypatch, trainer, 5, FloatingPointError("loss is NaN"))
    try:
        with pytest.raises(FloatingPointError, match="loss is NaN"):
            trainer.train()
    finally:
        trainer.close()
    assert pipeline_threads() == []


def processes(tmp_path, name, **overrides):
    settings = dict(env="gym:Pendulum-v1", num_workers=2, total_steps=800, pipeline=True)
    return config(tmp_path, name, **{**settings, **overrides})


def test_pipeline_through_worker_processes(tmp_path):
    """With worker processes the processes are the pipeline's worker: no thread; they step while the
    learner makes the previous step's updates, so the policy lag is exactly those updates."""
    synchronous = phalanx.train(processes(tmp_path, "sync", pipeline=False), show_progress=False).summary
    result = phalanx.train(
        processes(tmp_path, "pipe", checkpoint_every=320, save_buffer=True), show_progress=False
    )
    assert result.summary["total_steps"] == synchronous["total_steps"] == 800
    assert result.summary["updates"] == synchronous["updates"] == 244  # (800 - 320 + 8) * 0.5
    lags = [float(row["policy_lag_max"]) for row in metrics(result.run_dir) if row.get("policy_lag_max")]
    assert lags and max(lags) == 4  # 8 envs * 0.5 updates per env step
    assert pipeline_threads() == []
    resumed = phalanx.resume(result.run_dir, total_steps=1200, show_progress=False).summary
    assert resumed["updates"] == 244 + 400 // 2


@pytest.mark.parametrize("worker", ["thread", "processes"])
def test_ctrl_c_mid_pipeline_saves_a_checkpoint_that_resumes(tmp_path, monkeypatch, worker):
    """Ctrl+C during an update: with the worker thread, or while the worker processes step."""
    run = (
        config(tmp_path, "interrupted", pipeline=True)
        if worker == "thread"
        else processes(tmp_path, "interrupted")
    )
    trainer = Trainer(run, show_progress=False)
    raise_in_update(monkeypatch, trainer, 10, KeyboardInterrupt())
    sends = []
    send = trainer.worker.send
    monkeypatch.setattr(trainer.worker, "send", lambda *args, **kw: sends.append(1) or send(*args, **kw))
    try:
        with pytest.raises(TrainingInterrupted, match="phalanx resume"):
            trainer.train()
    finally:
        trainer.close()
    assert pipeline_threads() == []
    summary = json.loads((trainer.run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["total_steps"] > 320
    if worker == "processes":  # the step received and the step in flight are both stored, not lost
        assert summary["total_steps"] == len(sends) * run.num_envs == len(trainer.buffer)
    resumed = phalanx.resume(trainer.run_dir, show_progress=False).summary
    assert resumed["total_steps"] == run.total_steps and pipeline_threads() == []


def test_bad_pipeline_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="off-policy"):
        Trainer(phalanx.make_config("ppo", "CartPole-v1", pipeline=True, run_dir=str(tmp_path / "p")))
    with pytest.raises(ConfigError, match="pipeline_queue = 0"):
        config(tmp_path, "q", pipeline=True, pipeline_queue=0).validate()
    with pytest.raises(ConfigError, match="sync_every"):
        config(tmp_path, "s", pipeline=True, sync_every=0).validate()
    assert not (tmp_path / "p").exists()


def test_a_copy_of_the_exploration_policy_follows_the_learner_only_when_synced(tmp_path):
    trainer = Trainer(config(tmp_path, "copy"), show_progress=False)
    try:
        algorithm = trainer.algorithm
        copy = deepcopy(algorithm.exploration_policy())
        obs = torch.randn(4, 3)
        torch.manual_seed(0)
        before = copy(obs, 0)
        with torch.no_grad():
            for tensor in algorithm.exploration_policy().tensors():
                tensor.add_(0.5)
        torch.manual_seed(0)
        assert torch.equal(copy(obs, 0), before)  # its own networks
        torch._foreach_copy_(copy.tensors(), algorithm.exploration_policy().tensors())
        torch.manual_seed(0)
        expected = algorithm.explore(obs, 0)
        torch.manual_seed(0)
        assert torch.equal(copy(obs, 0), expected)
    finally:
        trainer.close()
