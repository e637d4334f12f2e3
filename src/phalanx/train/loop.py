"""The training loop: collect, learn, and the hooks that are due, until the budget is spent or a hook stops
the run.

How a run collects is chosen once when training starts (:mod:`phalanx.train.collection`): a rollout then
an update (on-policy), one VecEnv step then its updates (off-policy), or one of the pipelines that step
the envs while the learner updates. Everything else is a hook, called in one ordered list
(:class:`~phalanx.train.run.Scheduler`, built by the trainer): evaluation every ``eval_every`` steps
(:mod:`phalanx.train.evaluations`), the early stop at ``stop_return``, the user's own hooks, the safe
point (Ctrl+C), a row of metrics.csv every ``log_every`` steps, a checkpoint every ``checkpoint_every``
steps and ``compile: null``'s decision (:mod:`phalanx.train.hooks`). The loop writes only the
:class:`~phalanx.train.state.RunState` fields it owns.

In a data-parallel group the loop runs in every learner, in lockstep; after every iteration the
learners agree whether to stop (:class:`~phalanx.train.collection.GroupAgreement`), so that every
learner stops at the same step, or none does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.compiling import compile_seconds
from phalanx.config import save_yaml
from phalanx.train.interrupts import Insisted, deferred_interrupts, received_signal
from phalanx.train.logging import RunLogger, Stopwatch
from phalanx.train.plots import plot_curve
from phalanx.train.run import Run
from phalanx.train.summary import write_summary

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

    def __init__(self, run_dir: Path, steps: int, checkpoint: Path | None) -> None:
        by = received_signal()
        super().__init__(
            f"interrupted{f' by {by}' if by else ''} at step {steps:,}; checkpoint saved to {checkpoint}. "
            f"Continue with `phalanx resume {run_dir}` (or the same `phalanx train` command with --resume)."
        )
        self.run_dir = run_dir
        self.steps = steps
        self.checkpoint = checkpoint


def train(trainer: Run) -> TrainResult:
    """Train ``trainer``'s run to ``total_steps``, or until a hook stops it, calling ``trainer.hooks``
    (in a group, learner 0's hooks are the only ones besides the built-in ones). A later call goes on from
    where this one ended (a population's next interval)."""
    state = trainer.state
    if trainer.eval_process is not None:
        trainer.eval_process.wait_ready()  # its start is part of building the run, not of training
    # a group's learner process routes SIGINT to the group's event from its start
    interrupts = (
        deferred_interrupts(trainer.stop_requested) if trainer.group is None else contextlib.nullcontext()
    )
    try:
        with interrupts:
            _start(trainer)
            _loop(trainer)
            return _finish(trainer)
    finally:
        state.wall_offset = state.stopwatch()  # a later train() goes on from here
        state.compile_offset = state.compile_stopwatch()
        trainer.collection.close()


def _start(trainer: Run) -> None:
    """The run's files and TensorBoard's writer (learner 0), the clocks, the collection strategy, then the
    hooks' ``on_start``."""
    config, state = trainer.config, trainer.state
    if trainer.is_main:
        save_yaml(config, trainer.run_dir / "config.yaml")
        state.logger = RunLogger(trainer.run_dir, config.total_steps, state.steps, trainer.show_progress)
        if state.compile_note is not None:  # once, at the trainer's first train()
            state.logger.message(state.compile_note)
            state.compile_note = None
    state.stopwatch = Stopwatch(state.wall_offset)
    state.compile_stopwatch = Stopwatch(state.compile_offset, clock=compile_seconds)
    trainer.start_collection()
    state.metrics, state.hook_metrics, state.stop_reason = {}, {}, None
    for hook in trainer.hooks:
        hook.on_start(trainer)


def _loop(trainer: Run) -> None:
    """Collect, learn, the hooks that are due (:class:`~phalanx.train.run.Scheduler`); a Ctrl+C at the
    safe point saves a checkpoint and raises :class:`TrainingInterrupted`."""
    state = trainer.state
    try:
        while state.steps < trainer.config.total_steps and state.stop_reason is None:
            state.metrics = trainer.collection.iterate() or state.metrics
            trainer.hooks.after_iteration(trainer)
    except Insisted:  # a second Ctrl+C before the safe point: the state may be half-updated
        _end_files(trainer, interrupted=True, error=INSISTED)
        raise
    except KeyboardInterrupt:
        try:
            path = trainer.save()  # a pipeline drains first: the steps its worker made are learned from
            for hook in trainer.hooks:
                hook.on_finish(trainer, interrupted=True)  # the last row: the steps up to the checkpoint
        finally:
            if trainer.is_main:
                trainer.logger.close()
        if trainer.is_main:
            write_summary(trainer, interrupted=True)
        raise TrainingInterrupted(trainer.run_dir, state.steps, path) from None
    except BaseException as error:
        # Whatever stops the run, what it wrote stays: the logs, the checkpoints saved so far, and a
        # summary that names the error (no checkpoint of a state that may be corrupt, e.g. NaN).
        _end_files(trainer, interrupted=False, error=f"{type(error).__name__}: {error}")
        raise


def _finish(trainer: Run) -> TrainResult:
    """The end of a run that was not interrupted: the last steps' updates, the hooks' ``on_finish`` (the
    final evaluation but for an early stop's, the last row of metrics.csv), the last checkpoint, the
    learning curve, the summary, the hooks' ``on_end``."""
    trainer.collection.finish()  # the process pipeline's last step, and its updates
    if not trainer.is_main:
        trainer.save()
        return TrainResult(trainer.run_dir, {})
    for hook in trainer.hooks:
        hook.on_finish(trainer, interrupted=False)
    trainer.save()
    trainer.logger.close()
    plot_curve(trainer.run_dir, f"{trainer.config.algo.upper()} on {trainer.config.env}")
    summary = write_summary(trainer, interrupted=False)
    if trainer.show_progress:
        trainer.logger.summary_table(summary)
    for hook in trainer.hooks:
        hook.on_end(trainer, summary)
    return TrainResult(trainer.run_dir, summary)


def _end_files(trainer: Run, interrupted: bool, error: str) -> None:
    """Learner 0, when the run failed: close the logs and write a summary that names the error."""
    if trainer.is_main:
        trainer.logger.close()
        write_summary(trainer, interrupted=interrupted, error=error)
