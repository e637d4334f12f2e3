"""eval_process: the evaluator in a process of its own, on a copy of the weights, while training goes on."""

from __future__ import annotations

import copy
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from matplotlib.axes import Axes
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import phalanx
from phalanx.envs.registry import register_env, unregister_env
from phalanx.errors import ConfigError
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.evaluator import CopiesEvaluator, EvaluationProcess
from phalanx.train.logging import read_table
from phalanx.train.loop import TrainingInterrupted
from phalanx.train.plots import plot_curve
from phalanx.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parent))  # the evaluation process imports the factory by name
from fault_envs import failing_in_evaluation  # noqa: E402
from test_training import small_config as training_config  # noqa: E402


def small_config(tmp_path, name="run", **overrides):
    """test_training's small PPO run, on Pendulum-v1 with normalised observations (statistics to send)."""
    settings = dict(env="Pendulum-v1", total_steps=4096, eval_every=512, normalize_obs=True)
    return training_config(tmp_path, name, **{**settings, **overrides})


def weights(run_dir, which):
    return load_checkpoint(phalanx.agent.resolve_checkpoint(run_dir, which))["algorithm"]["policy"]


def test_training_is_the_same_and_every_evaluation_is_logged_at_the_step_of_its_weights(
    tmp_path, monkeypatch
):
    inline = phalanx.train(small_config(tmp_path, "inline"), show_progress=False)
    separate = phalanx.train(small_config(tmp_path, "process", eval_process=True), show_progress=False)
    a, b = weights(inline.run_dir, "latest"), weights(separate.run_dir, "latest")
    assert all(torch.equal(a[k], b[k]) for k in a), "the evaluation process changed training"
    # The final evaluation is of the same final weights, on the same env and seed.
    assert separate.summary["eval_steps"] == separate.summary["total_steps"] == 4096
    assert separate.summary["eval_return_mean"] == pytest.approx(inline.summary["eval_return_mean"], rel=1e-6)

    # Every copy taken (each eval_every = 512 steps) was evaluated, those that waited side by side, and
    # each is logged at the step of its weights (not the step its result came in): one row and one
    # TensorBoard value per step, and the same points on curve.png.
    rows = read_table(separate.run_dir / "evaluations.csv")
    assert [int(row["steps"]) for row in rows] == list(range(512, 4097, 512))
    assert all(row["wall_time_s"] <= row["result_wall_time_s"] for row in rows)
    events = EventAccumulator(str(separate.run_dir))
    events.Reload()
    assert [event.step for event in events.Scalars("eval/return_mean")] == list(range(512, 4097, 512))
    plotted, plot = [], Axes.plot

    def recorded_plot(axis, x, y, **kwargs):
        plotted.append((kwargs["label"], list(x)))
        return plot(axis, x, y, **kwargs)

    monkeypatch.setattr(Axes, "plot", recorded_plot)
    plot_curve(separate.run_dir, "curve")
    assert ("evaluation (deterministic)", list(range(512, 4097, 512))) in plotted
    # The best checkpoint holds the weights that were evaluated, not those of the step the result came in.
    best = [row for row in rows if row["eval_return_mean"] == separate.summary["best_eval_return"]][0]
    state = load_checkpoint(phalanx.agent.resolve_checkpoint(separate.run_dir, "best"))
    assert state["progress"]["steps"] == separate.summary["best_eval_steps"] == int(best["steps"])
    assert state["progress"]["best_eval_return"] == separate.summary["best_eval_return"]
    again = phalanx.evaluate(separate.run_dir, episodes=3, checkpoint="best")
    assert again.mean == pytest.approx(separate.summary["best_eval_return"], rel=1e-5)


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_the_process_evaluates_as_the_in_process_evaluator_under_every_start_method(tmp_path, start_method):
    if start_method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"start method {start_method!r} is not available on this platform")
    trainer = Trainer(small_config(tmp_path), show_progress=False)  # its Evaluator, in this process
    process = EvaluationProcess(
        trainer.config, seed=trainer.evaluator.seed, envs={}, start_method=start_method
    )
    try:
        trainer.train()  # weights and observation statistics worth evaluating
        expected = trainer.evaluator.evaluate(trainer.algorithm)
        state = trainer.agent_state()
        process.submit(7, {"algorithm": state["algorithm"], "obs_statistics": state["obs_statistics"]})
        assert process.busy
        [(steps, evaluation)] = process.wait()
        assert steps == 7 and not process.busy and process.poll() == []
        assert evaluation.returns == pytest.approx(expected.returns, rel=1e-6)
        assert evaluation.lengths == expected.lengths
    finally:
        process.close()
        trainer.close()
    assert process.process is None


def test_copies_evaluated_side_by_side_score_as_each_alone(tmp_path):
    """k copies of the weights evaluated together: each gets the returns of its own evaluation, with its
    own weights and observation statistics, on the evaluation env's start states."""
    trainer = Trainer(small_config(tmp_path), show_progress=False)
    together = CopiesEvaluator(trainer.config, seed=trainer.evaluator.seed)
    try:

        def agent():
            state = {
                "algorithm": trainer.algorithm.state_dict(),
                "obs_statistics": trainer.obs_statistics.state_dict(),
            }
            return copy.deepcopy(state)

        untrained = agent()
        trainer.train()
        trained = agent()
        shifted = copy.deepcopy(trained)  # the trained weights with other observation statistics
        shifted["obs_statistics"]["mean"] += 0.5
        copies, alone = [trained, untrained, shifted, trained], []
        for state in copies:
            trainer.algorithm.load_state_dict(state["algorithm"])
            trainer.obs_statistics.load_state_dict(state["obs_statistics"])  # the evaluation env's too
            alone.append(trainer.evaluator.evaluate(trainer.algorithm))
        assert len({round(evaluation.mean, 3) for evaluation in alone}) == 3  # three different agents
        assert together.batch_limit == trainer.config.eval_batch == 8
        for evaluation, expected in zip(together.evaluate(copies), alone, strict=True):
            assert evaluation.returns == pytest.approx(expected.returns, rel=1e-6)
            assert evaluation.lengths == expected.lengths
        with pytest.raises(ValueError, match="9 copies, expected 1 to 8"):
            together.evaluate(copies * 2 + copies[:1])
    finally:
        together.close()
        trainer.close()


def test_envs_that_are_not_batched_simulators_evaluate_one_copy_at_a_time(tmp_path):
    config = training_config(tmp_path, env="gym:CartPole-v1", eval_process=True)
    trainer = Trainer(config, show_progress=False)
    try:
        trainer.eval_process.wait_ready()
        assert trainer.eval_process.batch_limit == 1  # the newest copy replaces the one waiting
        trainer.train()
    finally:
        trainer.close()
    assert trainer.state.last_evaluation_step == config.total_steps


def test_stop_return_stops_on_a_result_from_the_evaluation_process(tmp_path):
    config = phalanx.make_config(
        "ppo",
        "CartPole-v1",
        run_dir=str(tmp_path / "cartpole"),
        total_steps=150_000,
        stop_return=475,
        seed=0,
        eval_every=2048,
        eval_process=True,
    )
    result = phalanx.train(config, show_progress=False)
    summary = result.summary
    assert summary["time_to_stop_return_s"] is not None and summary["total_steps"] < 150_000, summary
    assert summary["eval_return_mean"] >= 475 and summary["eval_steps"] <= summary["total_steps"]
    assert phalanx.evaluate(result.run_dir, checkpoint="best").mean >= 475


def test_ctrl_c_and_the_end_of_training_leave_no_process_behind(tmp_path, interrupt_update):
    trainer = Trainer(small_config(tmp_path, eval_process=True), show_progress=False)
    process = trainer.eval_process.process
    interrupt_update(trainer, 10)
    with pytest.raises(TrainingInterrupted):
        trainer.train()
    trainer.close()
    assert not process.is_alive()
    resumed = phalanx.resume(trainer.run_dir, show_progress=False)
    assert resumed.summary["total_steps"] == 4096 and resumed.summary["eval_steps"] == 4096


def test_a_failing_evaluation_env_is_reported_from_the_process(tmp_path):
    register_env("FailingInEvaluation-v0", failing_in_evaluation)
    try:
        config = small_config(tmp_path, env="FailingInEvaluation-v0", eval_process=True, normalize_obs=False)
        with pytest.raises(RuntimeError, match="evaluation process failed: RuntimeError: injected fault"):
            phalanx.train(config, show_progress=False)
    finally:
        unregister_env("FailingInEvaluation-v0")


def test_a_killed_evaluation_process_is_reported(tmp_path):
    trainer = Trainer(small_config(tmp_path, eval_process=True), show_progress=False)
    try:
        trainer.eval_process.wait_ready()
        os.kill(trainer.eval_process.process.pid, signal.SIGKILL)
        trainer.eval_process.process.join(timeout=10)
        with pytest.raises(RuntimeError, match="evaluation process ended: the process died .*signal 9"):
            trainer.train()
    finally:
        trainer.close()


def test_multi_agent_runs_refuse_eval_process():
    with pytest.raises(ConfigError, match="eval_process = True is not supported for the multi-agent"):
        phalanx.make_config("mappo", "simple_spread", eval_process=True).validate()


@pytest.mark.parametrize(("algo", "env"), [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_other_algorithms_evaluate_copies_side_by_side_as_alone(tmp_path, algo, env):
    """Algorithms without a batched side_by_side act one copy after another on their blocks of rows."""
    config = phalanx.make_config(
        algo, env, run_dir=str(tmp_path / algo), eval_episodes=3, hidden_sizes=(16, 16)
    )
    trainer = Trainer(config, show_progress=False)
    together = CopiesEvaluator(trainer.config, seed=trainer.evaluator.seed)
    try:
        copies, alone = [], []
        for seed in range(3):  # three differently initialised agents
            torch.manual_seed(seed)
            agent = type(trainer.algorithm)(
                config.hyperparameters,
                trainer.env.single_observation_space,
                trainer.env.single_action_space,
                "cpu",
            )
            copies.append({"algorithm": agent.state_dict(), "obs_statistics": None})
            alone.append(trainer.evaluator.evaluate(agent))
        for evaluation, expected in zip(together.evaluate(copies), alone, strict=True):
            assert evaluation.returns == pytest.approx(expected.returns, rel=1e-6)
            assert evaluation.lengths == expected.lengths
    finally:
        together.close()
        trainer.close()
