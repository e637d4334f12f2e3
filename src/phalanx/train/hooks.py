"""The hooks of a run in one ordered list (:class:`Scheduler`), and the ones built into every run.

The loop (:mod:`phalanx.train.loop`) is: collect, learn, then call the hooks that are due, in one order:
evaluation (:mod:`phalanx.train.evaluations`), the early stop at ``stop_return``, the user's hooks (the
video and W&B hooks after them), the safe point where Ctrl+C and a group's agreement act, the row of
metrics.csv, the checkpoint, and ``compile: null``'s decision. Each is an ordinary :class:`Hook` on its
own schedule; every hook keeps the one rule of :mod:`phalanx.train.run`. See docs/hooks.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from phalanx.compiling import compile_pays, compile_problem
from phalanx.errors import ConfigError
from phalanx.train.run import Hook, Run, Scheduler
from phalanx.train.state import Schedule

__all__ = ["Hook", "Schedule", "Scheduler", "check_hooks"]


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
class BuiltIn(Hook):
    """A built-in hook whose schedule lives in the run's state under ``name`` (saved in checkpoints):
    every ``every`` env steps from the run's start (0: never), or from a hand-over's step count."""

    name = ""

    def __init__(self, trainer: Run, every: int) -> None:
        self.every = every
        self.restart(trainer, steps=0)

    def restart(self, trainer: Run, steps: int) -> None:
        """The schedule of a run that is at ``steps`` now (its start, or a hand-over's steps)."""
        trainer.state.schedules[self.name] = Schedule.periodic(steps, self.every)

    def schedule(self, trainer: Run) -> Schedule:
        return trainer.state.schedules[self.name]


class StopAtReturn(Hook):
    """Early stop: the run ends once an evaluation reaches ``stop_return`` (learner 0's evaluations)."""

    def __init__(self, reached: Callable[[], bool]) -> None:
        self.reached = reached  # the evaluations' check, which notes the time it took

    def after_iteration(self, trainer: Run) -> None:
        if trainer.is_main and self.reached():
            trainer.stop("stop_return")


class SafePoint(Hook):
    """Where Ctrl+C stops the run (every update of the iteration made, whole) and where the learners of a
    group agree on stopping: an interrupt is raised here as KeyboardInterrupt, for the loop to save."""

    def after_iteration(self, trainer: Run) -> None:
        state = trainer.state
        stop, interrupted = trainer.agreement(state.stop_reason is not None, trainer.stop_requested.is_set())
        if interrupted:
            trainer.stop_requested.clear()  # acted on: a later train() goes on
            raise KeyboardInterrupt
        if stop and state.stop_reason is None:
            state.stop_reason = "learner 0's hooks stopped the group"


class Logging(BuiltIn):
    """A row of metrics.csv every ``log_every`` env steps (learner 0; the others keep the schedule):
    the rates since the last row, the training episodes, the learner's last metrics, the hooks' numbers.
    The end of a ``train`` (its budget spent, a stop, Ctrl+C) writes the row of the steps made since the
    last row (:meth:`on_finish`), so that the last row is the run's last step."""

    name = "logging"

    def __init__(self, trainer: Run) -> None:
        super().__init__(trainer, trainer.config.log_interval)
        self.last = (0.0, 0, 0)

    def restart(self, trainer: Run, steps: int) -> None:
        """A row after the next iteration, then every ``every`` env steps."""
        trainer.state.schedules[self.name] = Schedule(self.every, next=steps)

    def on_start(self, trainer: Run) -> None:
        """The rates of the next row are those since training (re)starts now."""
        self.last = (trainer.stopwatch(), trainer.steps, trainer.learner.updates)

    def after_iteration(self, trainer: Run) -> None:
        if trainer.is_main:
            self.write(trainer)

    def on_finish(self, trainer: Run, interrupted: bool) -> None:
        """Learner 0, at the end of a ``train``: the row of the steps made since the last row, if there
        are any (none where the last iteration was a log step, or where nothing was trained)."""
        if trainer.is_main and trainer.steps > self.last[1]:
            self.write(trainer)

    def write(self, trainer: Run) -> None:
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
            **trainer.state.metrics,
            **trainer.state.hook_metrics,
        }
        row = trainer.logger.log(row)
        trainer.state.hook_metrics.clear()  # taken: they are in this row
        for hook in trainer.hooks:
            hook.on_log(trainer, row)
        self.last = (now, trainer.steps, trainer.learner.updates)


class Checkpoints(BuiltIn):
    """A checkpoint every ``checkpoint_every`` env steps (0: only at the end) and every
    ``checkpoint_every_minutes`` of training (0: none by time), whichever comes first; every learner of a
    group takes part (learner 0 writes it with the others' shards), at the same iteration."""

    name = "checkpoints"

    def __init__(self, trainer: Run) -> None:
        super().__init__(trainer, trainer.config.checkpoint_every)
        self.seconds = 60.0 * trainer.config.checkpoint_every_minutes
        self.saved_at: float | None = None  # the training clock at the last checkpoint (or the start)

    def due(self, trainer: Run, schedule: Schedule) -> bool:
        return schedule.due(trainer.steps) or self.time_due(trainer)

    def after_iteration(self, trainer: Run) -> None:
        if trainer.is_main:  # the rows up to the checkpoint are on disk when it is
            trainer.logger.sync()
        trainer.save()
        self.saved_at = trainer.stopwatch()

    def time_due(self, trainer: Run) -> bool:
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

    def __init__(self, trainer: Run) -> None:
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

    def after_iteration(self, trainer: Run) -> None:
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
            trainer.state.compiled = trainer.compile()
            trainer.state.compile_decision = f"compiled at step {trainer.steps:,}: {why}"
        else:
            trainer.state.compile_decision = f"eager: {why}"
        trainer.logger.message(trainer.state.compile_decision)

    @staticmethod
    def _clock(trainer: Run) -> float:
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        return time.perf_counter()
