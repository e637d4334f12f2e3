"""The training loop: collect, learn, and the hooks that are due, until the budget is spent or a hook stops
the run.

How a run collects is chosen once when training starts (:mod:`phalanx.train.collection`): a rollout then
an update (on-policy), one VecEnv step then its updates (off-policy), or one of the pipelines that step
the envs while the learner updates. Everything else is a hook (:mod:`phalanx.train.hooks`): evaluation
every ``eval_every`` steps (:mod:`phalanx.train.evaluations`), the early stop at ``stop_return``, a row of
metrics.csv every ``log_every`` steps, a checkpoint every ``checkpoint_every`` steps, a population's
hand-over (:mod:`phalanx.train.handover`), and the user's own hooks.

In a data-parallel group the loop runs in every learner, in lockstep; after every iteration the
learners agree whether to stop (:class:`~phalanx.train.collection.GroupAgreement`), so that every
learner stops at the same step, or none does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.compiling import compile_seconds
from phalanx.config import save_yaml
from phalanx.train.collection import choose_collection
from phalanx.train.hooks import Hook, Schedule, check_hooks
from phalanx.train.interrupts import Insisted, deferred_interrupts, received_signal
from phalanx.train.logging import RunLogger, Stopwatch
from phalanx.train.plots import plot_curve
from phalanx.train.summary import write_summary

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer

INSISTED = (
    "a second stop signal (Ctrl+C, SIGTERM) stopped the run at once, unsaved: resume goes on from its "
    "latest checkpoint"
)


@dataclass
class TrainResult:
    run_dir: Path
    summary: dict[str, Any]
    trained: bool = True
    """False where a resume found nothing left to train (the run had finished): no file was changed."""


class TrainingInterrupted(Exception):
    """Ctrl+C or SIGTERM during training: a checkpoint was saved; the run can be resumed."""

    def __init__(self, run_dir: Path, steps: int, checkpoint: Path) -> None:
        by = received_signal()
        super().__init__(
            f"interrupted{f' by {by}' if by else ''} at step {steps:,}; checkpoint saved to {checkpoint}. "
            f"Continue with `phalanx resume {run_dir}` (or the same `phalanx train` command with --resume)."
        )
        self.run_dir = run_dir
        self.steps = steps
        self.checkpoint = checkpoint


def train(trainer: Trainer, hooks: Sequence[Hook] = ()) -> TrainResult:
    """Train ``trainer``'s run to ``total_steps``, or until a hook stops it; in a group, learner 0 alone
    calls ``hooks``. A later call goes on from where this one ended (a population's next interval)."""
    hooks = check_hooks(hooks) if trainer.is_main else []
    trainer.hooks = [
        *hooks,
        trainer.evaluations,
        trainer.stop_at_return,
        trainer.logging,
        trainer.checkpointing,
        trainer.auto_compile,
    ]
    for hook in hooks:  # a hand-over first: the run's files below see its config and steps
        hook.on_start(trainer)
    if trainer.eval_process is not None:
        trainer.eval_process.wait_ready()  # its start is part of building the run, not of training
    # a group's learner process routes SIGINT to the group's event from its start
    interrupts = (
        deferred_interrupts(trainer.stop_requested) if trainer.group is None else contextlib.nullcontext()
    )
    try:
        with interrupts:
            _start(trainer)
            _loop(trainer, [(hook, Schedule.after(trainer.steps, hook.every)) for hook in hooks])
            return _finish(trainer)
    finally:
        trainer.wall_offset = trainer.stopwatch()  # a later train() goes on from here
        trainer.compile_offset = trainer.compile_stopwatch()
        trainer.collection.close()


def _start(trainer: Trainer) -> None:
    """The run's files and TensorBoard's writer (learner 0), then the clock starts and the collection
    strategy is chosen."""
    config = trainer.config
    if trainer.is_main:
        save_yaml(config, trainer.run_dir / "config.yaml")
        trainer.logger = RunLogger(trainer.run_dir, config.total_steps, trainer.steps, trainer.show_progress)
        if trainer.compile_note is not None:  # once, at the trainer's first train()
            trainer.logger.message(trainer.compile_note)
            trainer.compile_note = None
    trainer.stopwatch = Stopwatch(trainer.wall_offset)
    trainer.compile_stopwatch = Stopwatch(trainer.compile_offset, clock=compile_seconds)
    trainer.logging.restart(trainer)
    trainer.collection = choose_collection(trainer)
    trainer.metrics, trainer.hook_metrics, trainer.stop_reason = {}, {}, None


def _loop(trainer: Trainer, user_hooks: list[tuple[Hook, Schedule]]) -> None:
    """Collect, learn, the hooks; a Ctrl+C at the safe point saves a checkpoint and raises
    :class:`TrainingInterrupted`."""
    try:
        while trainer.steps < trainer.config.total_steps and trainer.stop_reason is None:
            trainer.metrics = trainer.collection.iterate() or trainer.metrics
            trainer.evaluations.after_iteration(trainer)
            trainer.stop_at_return.after_iteration(trainer)
            _call_due(trainer, user_hooks)
            _safe_point(trainer)
            trainer.logging.after_iteration(trainer)
            trainer.checkpointing.after_iteration(trainer)
            trainer.auto_compile.after_iteration(trainer)
    except Insisted:  # a second Ctrl+C before the safe point: the state may be half-updated
        _end_files(trainer, interrupted=True, error=INSISTED)
        raise
    except KeyboardInterrupt:
        try:
            path = trainer.save()  # a pipeline drains first: the steps its worker made are learned from
            if trainer.is_main:
                trainer.logging.finish(trainer)  # the last row: the steps up to the checkpoint
        finally:
            if trainer.is_main:
                trainer.logger.close()
        if trainer.is_main:
            write_summary(trainer, interrupted=True)
        raise TrainingInterrupted(trainer.run_dir, trainer.steps, path) from None
    except BaseException as error:
        # Whatever stops the run, what it wrote stays: the logs, the checkpoints saved so far, and a
        # summary that names the error (no checkpoint of a state that may be corrupt, e.g. NaN).
        _end_files(trainer, interrupted=False, error=f"{type(error).__name__}: {error}")
        raise


def _call_due(trainer: Trainer, scheduled: list[tuple[Hook, Schedule]]) -> None:
    """The user's hooks that are due: the numbers they return go to the next row of metrics.csv."""
    for hook, schedule in scheduled:
        if schedule.due(trainer.steps):
            schedule.advance(trainer.steps)
            trainer.hook_metrics.update(hook.after_iteration(trainer) or {})


def _safe_point(trainer: Trainer) -> None:
    """Where Ctrl+C stops the run (every update of the iteration made, whole) and where the learners of a
    group agree on stopping."""
    stop, interrupted = trainer.agreement(trainer.stop_reason is not None, trainer.stop_requested.is_set())
    if interrupted:
        trainer.stop_requested.clear()  # acted on: a later train() goes on
        raise KeyboardInterrupt
    if stop and trainer.stop_reason is None:
        trainer.stop_reason = "learner 0's hooks stopped the group"


def _finish(trainer: Trainer) -> TrainResult:
    """The end of a run that was not interrupted: the last steps' updates, the last row of metrics.csv,
    the final evaluation (but for an early stop's), the last checkpoint, the learning curve, the summary,
    the hooks' ``on_end``."""
    trainer.collection.finish()  # the process pipeline's last step, and its updates
    if not trainer.is_main:
        trainer.save()
        return TrainResult(trainer.run_dir, {})
    trainer.logging.finish(trainer)  # the last row: the steps since the last log step
    if trainer.stop_reason != "stop_return":
        trainer.evaluations.finish()
    trainer.save()
    trainer.logger.close()
    plot_curve(trainer.run_dir, f"{trainer.config.algo.upper()} on {trainer.config.env}")
    summary = write_summary(trainer, interrupted=False)
    if trainer.show_progress:
        trainer.logger.summary_table(summary)
    for hook in trainer.hooks:
        hook.on_end(trainer, summary)
    return TrainResult(trainer.run_dir, summary)


def _end_files(trainer: Trainer, interrupted: bool, error: str) -> None:
    """Learner 0, when the run failed: close the logs and write a summary that names the error."""
    if trainer.is_main:
        trainer.logger.close()
        write_summary(trainer, interrupted=interrupted, error=error)
