"""User hooks from Python: phalanx.train(config, hooks=[...]) stops early on the hook's condition and logs
its numbers; a hook that is not a Hook, or has a bad schedule, is a clear ConfigError."""

from __future__ import annotations

import json

import pytest
import torch
from test_training import small_config as training_config

import phalanx
from phalanx.errors import ConfigError
from phalanx.train.launch import available_cores
from phalanx.train.logging import read_table


def small_config(tmp_path, name="run", **overrides):
    """test_training's small PPO CartPole run, long enough for a hook to stop it, evaluated inline."""
    return training_config(tmp_path, name, **{"total_steps": 4096, "eval_process": False, **overrides})


class StopAfterUpdates(phalanx.Hook):
    """A custom early stop: after a number of learner updates, whatever the budget left."""

    every = 512

    def __init__(self, updates: int) -> None:
        self.updates = updates
        self.calls: list[int] = []
        self.started = self.ended = 0
        self.evaluations: list[float] = []

    def on_start(self, trainer) -> None:
        self.started += 1

    def after_iteration(self, trainer) -> None:
        self.calls.append(trainer.steps)
        if trainer.learner.updates >= self.updates:
            trainer.stop(f"{trainer.learner.updates} updates")

    def on_evaluation(self, trainer, row) -> None:
        self.evaluations.append(row["eval_return_mean"])

    def on_end(self, trainer, summary) -> None:
        self.ended += 1


class StepsPerUpdate(phalanx.Hook):
    """A custom metric: env steps per learner update, in every row of metrics.csv."""

    def after_iteration(self, trainer) -> dict[str, float]:
        return {"steps_per_update": trainer.steps / max(trainer.learner.updates, 1)}


def test_a_hook_stops_training_on_its_own_condition(tmp_path):
    hook = StopAfterUpdates(updates=10)  # a rollout is 128 steps: 10 updates at 1,280 steps
    result = phalanx.train(small_config(tmp_path), show_progress=False, hooks=[hook])
    summary = result.summary
    assert summary["total_steps"] == 1536  # the first call of the hook at or after 10 updates
    assert summary["stop_reason"] == "12 updates"  # what the hook said, kept in summary.json
    assert hook.calls == [512, 1024, 1536]  # every 512 env steps
    assert hook.started == 1 and hook.ended == 1
    assert summary["interrupted"] is False and summary["error"] is None
    assert summary["eval_steps"] == 1536  # stopped as a spent budget: the final weights are evaluated
    assert len(hook.evaluations) == 2  # the one at 1,024 steps and the final one
    assert json.loads((result.run_dir / "summary.json").read_text())["total_steps"] == 1536


class Rows(phalanx.Hook):
    """Every row of metrics.csv, as on_log hands it over."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_log(self, trainer, row) -> None:
        self.rows.append(row)


def test_a_hooks_metric_lands_in_metrics_csv(tmp_path):
    config = small_config(tmp_path, total_steps=1024)
    rows_hook = Rows()
    result = phalanx.train(config, show_progress=False, hooks=[StepsPerUpdate(), rows_hook])
    rows = read_table(result.run_dir / "metrics.csv")
    assert [row["steps"] for row in rows] == [128, 256, 512, 768, 1024]
    assert all(row["steps_per_update"] == 128 for row in rows)  # one update per rollout of 8 x 16 steps
    # on_log hands over each row as written: the file's numbers, the hook's metric included
    logged = [{key: value for key, value in row.items() if value is not None} for row in rows_hook.rows]
    assert logged == rows


def test_resume_calls_the_hooks_too(tmp_path):
    first = phalanx.train(small_config(tmp_path, total_steps=1024), show_progress=False)
    hook = StopAfterUpdates(updates=1_000)
    resumed = phalanx.resume(first.run_dir, total_steps=2048, show_progress=False, hooks=[hook])
    assert resumed.summary["total_steps"] == 2048
    assert hook.calls == [1536, 2048] and hook.started == 1 and hook.ended == 1


class StopAtStepsOfGroup(phalanx.Hook):
    """Leaves a mark of the learner that calls it, and stops the group at ``steps``."""

    every = 512

    def after_iteration(self, trainer) -> dict[str, float]:
        (trainer.run_dir / f"called_by_learner_{trainer.group.rank}").touch()
        if trainer.steps >= 512:
            trainer.stop("512 steps")
        return {"learner_rank": trainer.group.rank}


@pytest.mark.skipif(available_cores() < 2, reason="two learners need two CPU cores")
def test_in_a_group_learner_0_calls_the_hooks_and_its_stop_stops_every_learner(tmp_path):
    config = small_config(tmp_path, num_learners=2, num_envs=4, horizon=32, torch_threads=1, eval_every=0)
    result = phalanx.train(config, show_progress=False, hooks=[StopAtStepsOfGroup()])
    assert result.summary["total_steps"] == 512  # 2 learners x 4 envs x 32 steps a rollout
    assert sorted(path.name for path in result.run_dir.glob("called_by_*")) == ["called_by_learner_0"]
    assert read_table(result.run_dir / "metrics.csv")[-1]["learner_rank"] == 0


def test_a_hook_that_is_not_a_hook_is_a_config_error(tmp_path):
    config = small_config(tmp_path)
    with pytest.raises(ConfigError, match=r"hooks\[0\] is function, not a phalanx.Hook instance"):
        phalanx.train(config, show_progress=False, hooks=[lambda trainer: None])
    with pytest.raises(ConfigError, match=r"pass StepsPerUpdate\(\)"):
        phalanx.train(config, show_progress=False, hooks=[StepsPerUpdate])
    with pytest.raises(ConfigError, match="hooks must be a list of phalanx.Hook instances"):
        phalanx.train(config, show_progress=False, hooks=StepsPerUpdate())
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


@pytest.mark.parametrize("every", [-1, 2.5, "1000", True])
def test_a_hook_with_a_bad_schedule_is_a_config_error(tmp_path, every):
    hook = StepsPerUpdate()
    hook.every = every
    with pytest.raises(ConfigError, match=r"hooks\[0\] \(StepsPerUpdate\) has every = .*env steps >= 0"):
        phalanx.train(small_config(tmp_path), show_progress=False, hooks=[hook])


class Order(phalanx.Hook):
    """Records the hooks of the train it runs in, in the order the scheduler calls them."""

    def on_start(self, trainer) -> None:
        self.names = [type(hook).__name__ for hook in trainer.hooks]


def test_every_hook_is_called_from_one_ordered_list(tmp_path):
    """The built-in hooks and the user's are one list on one scheduler, in the documented order."""
    order = Order()
    phalanx.train(small_config(tmp_path, total_steps=256), show_progress=False, hooks=[order])
    assert order.names == [
        "Evaluations", "StopAtReturn", "Order", "SafePoint", "Logging", "Checkpoints", "CompileWhenItPays",
    ]  # fmt: skip


def test_checkpoints_keep_the_built_in_schedules_so_a_resume_logs_evaluates_and_saves_at_the_same_steps(
    tmp_path,
):
    """A run trained in two parts (a checkpoint in between) writes its rows, evaluations and checkpoints
    at the same steps as one trained straight: the schedules travel in the checkpoint."""
    schedule = {"eval_every": 1024, "checkpoint_every": 1024, "log_every": 256, "keep_checkpoints": 10}
    straight = phalanx.train(small_config(tmp_path, "straight", **schedule), show_progress=False).run_dir
    config = small_config(tmp_path, "parts", **{**schedule, "total_steps": 2048})
    parts = phalanx.train(config, show_progress=False).run_dir
    progress = torch.load(parts / "checkpoints" / "step_2048" / "state.pt", weights_only=False)["progress"]
    assert progress["schedules"] == {"evaluations": 3072, "checkpoints": 3072, "logging": 2304}
    phalanx.resume(parts, total_steps=4096)

    def steps(run_dir, table):
        return [int(row["steps"]) for row in read_table(run_dir / table)]

    assert steps(parts, "evaluations.csv") == steps(straight, "evaluations.csv") == [1024, 2048, 3072, 4096]
    assert steps(parts, "metrics.csv") == steps(straight, "metrics.csv")
    saved = sorted(path.name for path in (parts / "checkpoints").glob("step_*"))
    assert saved == sorted(path.name for path in (straight / "checkpoints").glob("step_*"))
