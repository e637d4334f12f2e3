"""Hooks: what the training loop does besides collecting and learning, each on a schedule in env steps.

The loop (:meth:`phalanx.train.trainer.Trainer.train`) is: collect, learn, then call the hooks that are
due. Evaluation, early stop at ``stop_return``, logging and checkpoints are hooks built into every run
(:mod:`phalanx.train.evaluations` and below); a population's hand-over of weights and hyperparameters
is one (:mod:`phalanx.train.handover`); a user's own are passed to ``phalanx.train(config, hooks=[...])``.
See docs/hooks.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from phalanx.compiling import compile_pays, compile_problem
from phalanx.errors import ConfigError

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer


class Hook:
    """Something done at points of a training run, on a schedule in env steps (a callback).

    Subclass it, override the methods you need (each does nothing by default) and pass instances to
    ``phalanx.train(config, hooks=[...])`` or ``phalanx.resume(run_dir, hooks=[...])``:

    - ``every``: env steps between two calls of :meth:`after_iteration`; it is called after the first
      iteration that reaches each multiple of ``every`` (an iteration is a rollout on-policy, one step
      of every sub-env off-policy). 0, the default: after every iteration.
    - :meth:`on_start`: before the first iteration of a ``train`` (also of a resumed run).
    - :meth:`after_iteration`: numbers it returns land in the next row of metrics.csv (and TensorBoard);
      ``trainer.stop(reason)`` there ends the run as a spent budget does: a last evaluation, a
      checkpoint, summary.json.
    - :meth:`on_log`: after every row of metrics.csv, with that row (as written: numbers, None where empty).
    - :meth:`on_evaluation`: after every evaluation, with its row of evaluations.csv.
    - :meth:`on_end`: after a run that ended without an error or Ctrl+C, with its summary.json.

    The ``trainer`` (:class:`~phalanx.train.trainer.Trainer`) is the run: read ``trainer.steps``,
    ``trainer.config``, ``trainer.algorithm``, ``trainer.learner.updates``, ``trainer.run_dir``,
    ``trainer.last_evaluation``; change nothing there but through ``trainer.stop``.

    In a data-parallel group (``num_learners > 1``) hooks run in learner 0's process only: phalanx
    pickles them into it when it starts the learners (define their class at module level); under
    torchrun every process builds its own, and only learner 0 calls them. A stop one requests stops
    every learner at the same step.
    """

    every: int = 0

    def on_start(self, trainer: Trainer) -> None:
        """Training starts (or goes on), before the first iteration."""

    def after_iteration(self, trainer: Trainer) -> dict[str, float] | None:
        """An iteration (collect, learn) ended and the hook is due; numbers to log, or None."""

    def on_log(self, trainer: Trainer, row: dict[str, Any]) -> None:
        """A training row was logged; ``row`` is its row of metrics.csv."""

    def on_evaluation(self, trainer: Trainer, row: dict[str, float]) -> None:
        """An evaluation was recorded; ``row`` is its row of evaluations.csv."""

    def on_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        """The run ended (budget spent or stopped); ``summary`` is its summary.json."""


class Schedule:
    """When a hook is due: at the first iteration that reaches ``next``, then every ``every`` env steps
    after it (``every = 0``: after every iteration)."""

    def __init__(self, every: int, next: float) -> None:
        self.every = every
        self.next = next

    @classmethod
    def after(cls, steps: int, every: int) -> Schedule:
        """The schedule of a hook of period ``every`` starting at ``steps``: due at its next multiple."""
        return cls(every, (steps // every + 1) * every if every else steps)

    def due(self, steps: int) -> bool:
        return steps >= self.next

    def advance(self, steps: int) -> None:
        """Past ``steps``: the next multiple of ``every`` after it."""
        while self.every and self.next <= steps:
            self.next += self.every


def check_hooks(hooks: Sequence[Hook]) -> list[Hook]:
    """The user's hooks as a list, or a ConfigError that says which one is wrong and how."""
    if isinstance(hooks, Hook) or not isinstance(hooks, (list, tuple)):
        raise ConfigError(
            f"hooks must be a list of phalanx.Hook instances, got {type(hooks).__name__}. "
            "Pass hooks=[MyHook()]."
        )
    for index, hook in enumerate(hooks):
        if not isinstance(hook, Hook):
            named = hook.__name__ if isinstance(hook, type) else type(hook).__name__
            fix = f"pass {named}() " if isinstance(hook, type) and issubclass(hook, Hook) else ""
            raise ConfigError(
                f"hooks[{index}] is {named!s}, not a phalanx.Hook instance. A hook is an instance of a "
                "subclass of phalanx.Hook that overrides on_start, after_iteration, on_log, on_evaluation "
                f"or on_end: {fix or 'subclass phalanx.Hook'} (see docs/hooks.md)."
            )
        every = hook.every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ConfigError(
                f"hooks[{index}] ({type(hook).__name__}) has every = {every!r}: expected a whole number of "
                "env steps >= 0 (0: after every iteration). Set every = 10_000, for instance."
            )
    return list(hooks)


# -- the hooks built into every run -----------------------------------------------------------------
class StopAtReturn(Hook):
    """Early stop: the run ends once an evaluation reaches ``stop_return`` (learner 0's evaluations)."""

    def after_iteration(self, trainer: Trainer) -> None:
        if trainer.is_main and trainer.evaluations.reached_stop_return():
            trainer.stop("stop_return")


class Logging(Hook):
    """A row of metrics.csv every ``log_every`` env steps (learner 0; the others keep the schedule):
    the rates since the last row, the training episodes, the learner's last metrics, the hooks' numbers.
    The end of a ``train`` (its budget spent, a stop, Ctrl+C) writes the row of the steps made since the
    last row (:meth:`finish`), so that the last row is the run's last step."""

    def __init__(self, trainer: Trainer) -> None:
        self.schedule = Schedule(trainer.config.log_interval, next=0)
        self.last = (0.0, 0, 0)

    def restart(self, trainer: Trainer) -> None:
        """The rates of the next row are those since training (re)starts now."""
        self.last = (trainer.stopwatch(), trainer.steps, trainer.learner.updates)

    def after_iteration(self, trainer: Trainer) -> None:
        if not self.schedule.due(trainer.steps):
            return
        if trainer.is_main:
            self.write(trainer)
        self.schedule.advance(trainer.steps)

    def finish(self, trainer: Trainer) -> None:
        """Learner 0, at the end of a ``train``: the row of the steps made since the last row, if there
        are any (none where the last iteration was a log step, or where nothing was trained)."""
        if trainer.steps > self.last[1]:
            self.write(trainer)

    def write(self, trainer: Trainer) -> None:
        """A row of metrics.csv at ``trainer.steps``; the hooks' ``on_log`` get it."""
        now = trainer.stopwatch()
        last_time, last_steps, last_updates = self.last
        elapsed = max(now - last_time, 1e-9)
        row = {
            "steps": trainer.steps,
            "wall_time_s": now,
            "steps_per_second": (trainer.steps - last_steps) / elapsed,
            "updates": trainer.learner.updates,
            "updates_per_second": (trainer.learner.updates - last_updates) / elapsed,
            **trainer.worker.episodes.read(),
            **trainer.collection.read_policy_lag(),
            **trainer.metrics,
            **trainer.hook_metrics,
        }
        row = trainer.logger.log(row)
        trainer.hook_metrics = {}
        for hook in trainer.hooks:
            hook.on_log(trainer, row)
        self.last = (now, trainer.steps, trainer.learner.updates)


class Checkpoints(Hook):
    """A checkpoint every ``checkpoint_every`` env steps (0: only at the end) and every
    ``checkpoint_every_minutes`` of training (0: none by time), whichever comes first; every learner of a
    group takes part (learner 0 writes it with the others' shards), at the same iteration."""

    def __init__(self, trainer: Trainer) -> None:
        every = trainer.config.checkpoint_every
        self.schedule = Schedule(every, next=every if every else math.inf)
        self.seconds = 60.0 * trainer.config.checkpoint_every_minutes
        self.saved_at: float | None = None  # the training clock at the last checkpoint (or the start)

    def after_iteration(self, trainer: Trainer) -> None:
        if not (self.schedule.due(trainer.steps) or self.time_due(trainer)):
            return
        if trainer.is_main:  # the rows up to the checkpoint are on disk when it is
            trainer.logger.sync()
        trainer.save()
        self.schedule.advance(trainer.steps)
        self.saved_at = trainer.stopwatch()

    def time_due(self, trainer: Trainer) -> bool:
        """Whether ``checkpoint_every_minutes`` have passed since the last checkpoint (in a group: on any
        learner's clock, so that all save at the same iteration)."""
        if not self.seconds:
            return False
        now = trainer.stopwatch()
        if self.saved_at is None:
            self.saved_at = now
        due = now - self.saved_at >= self.seconds
        if trainer.group is not None:
            due = bool(trainer.group.maximum(int(due)))
        return due


class CompileWhenItPays(Hook):
    """``compile: null`` (the default): the run starts eagerly, times its iterations once it learns (off-
    policy: after the warm-up) for at least ``MEASURE_ITERATIONS`` iterations and ``MEASURE_SECONDS``, then
    compiles for the rest if :func:`~phalanx.compiling.compile_pays` says it pays, and says what it chose
    and why in the log and summary.json (``compile_decision``). Never in a learner group (the learners
    would have to agree), a pipeline, or a run without compiled paths (multi-agent)."""

    MEASURE_ITERATIONS = 3
    MEASURE_SECONDS = 1.0

    def __init__(self, trainer: Trainer) -> None:
        config = trainer.config
        self.active = (
            config.compile is None
            and trainer.compilable
            and compile_problem(trainer.device) is None
            and trainer.group is None
            and not config.pipeline
        )
        self.start: tuple[float, int, int] | None = None  # (clock, steps, iterations) when timing began
        self.iterations = 0

    def after_iteration(self, trainer: Trainer) -> None:
        if not self.active or trainer.learner.updates == 0:
            return
        self.iterations += 1
        now = self._clock(trainer)
        if self.start is None:  # the first learning iteration: warm-up, not timed
            self.start = (now, trainer.steps, self.iterations)
            return
        began, steps, iterations = self.start
        seconds, timed = now - began, trainer.steps - steps
        left = max(trainer.config.total_steps - trainer.steps, 0) * seconds / max(timed, 1)
        if self.iterations - iterations < self.MEASURE_ITERATIONS or seconds < self.MEASURE_SECONDS:
            return
        self.active = False
        pays, why = compile_pays(trainer.device, left)
        if pays:
            trainer.compiled = trainer.compile()
            trainer.compile_decision = f"compiled at step {trainer.steps:,}: {why}"
        else:
            trainer.compile_decision = f"eager: {why}"
        trainer.logger.message(trainer.compile_decision)

    @staticmethod
    def _clock(trainer: Trainer) -> float:
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        return time.perf_counter()
