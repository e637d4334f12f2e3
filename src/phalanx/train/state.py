"""A run's progress in one typed object (:class:`RunState`), and the :class:`Schedule` its hooks keep.

The trainer holds the parts of a run (envs, algorithm, worker, learner, buffer); what changes as it trains
is here, each field with the one part that writes it, so that a reader finds who moves a counter without
searching eight modules. A checkpoint saves the fields that resume needs (:meth:`RunState.progress`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phalanx.compiling import compile_seconds
from phalanx.train.logging import Stopwatch

if TYPE_CHECKING:
    from phalanx.train.evaluator import Evaluation
    from phalanx.train.logging import RunLogger


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

    @classmethod
    def periodic(cls, steps: int, every: int) -> Schedule:
        """A built-in hook's schedule from ``steps``: every ``every`` env steps, never where it is 0."""
        return cls(every, steps + every if every else math.inf)

    def due(self, steps: int) -> bool:
        return steps >= self.next

    def advance(self, steps: int) -> None:
        """Past ``steps``: the next multiple of ``every`` after it."""
        while self.every and self.next <= steps:
            self.next += self.every


@dataclass
class RunState:
    """What changes as a run trains. Each field names its one writer; everything else reads it."""

    steps: int = 0
    """Env steps made (stored, off-policy): the collection strategy (:mod:`phalanx.train.collection`);
    a resume or a hand-over set it."""
    updates_owed: float = 0.0
    """Off-policy: the fraction of a gradient step carried to the next env step (the collection)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The learner's last metrics (the loop)."""
    hook_metrics: dict[str, float] = field(default_factory=dict)
    """The hooks' numbers for the next row of metrics.csv: the scheduler adds them, the logging hook
    takes them when it writes the row."""
    stop_reason: str | None = None
    """Why the run stops before its budget: ``Trainer.stop`` (a hook's request) or the loop's safe point."""
    last_evaluation: Evaluation | None = None
    """The latest evaluation and the step of the weights it evaluated (the evaluations hook)."""
    last_evaluation_step: int = -1
    time_to_stop_return: float | None = None
    """Training seconds until an evaluation first reached ``stop_return`` (the evaluations hook)."""
    wall_offset: float = 0.0
    """Seconds trained before this ``train()`` (and compiling, of them): the loop, and a resume."""
    compile_offset: float = 0.0
    stopwatch: Stopwatch = field(default_factory=Stopwatch)
    """The run's clocks, restarted by the loop at each ``train()`` from the offsets."""
    compile_stopwatch: Stopwatch = field(default_factory=lambda: Stopwatch(clock=compile_seconds))
    compiled: list[str] = field(default_factory=list)
    """What ``compile()`` switched to its compiled path: the trainer when it is built, or the
    compile-when-it-pays hook later."""
    compile_decision: str | None = None
    """``compile: null``'s choice and why, once made (the compile-when-it-pays hook)."""
    compile_note: str | None = None
    """What the log says of compiling at the first ``train()`` (set by the trainer, cleared by the loop)."""
    schedules: dict[str, Schedule] = field(default_factory=dict)
    """The built-in hooks' schedules by name (each created and advanced by its hook's scheduler entry),
    saved in checkpoints so that a resumed run logs, evaluates and saves at the same steps."""
    logger: RunLogger | None = None
    """The run's files and display for the current ``train()`` (the loop, learner 0)."""

    def progress(self) -> dict[str, Any]:
        """The fields a checkpoint saves (beside the learner's updates and the evaluator's best)."""
        return {
            "steps": self.steps,
            "wall_time_s": self.stopwatch(),
            "compile_time_s": self.compile_stopwatch(),
            "time_to_stop_return_s": self.time_to_stop_return,
            "updates_owed": self.updates_owed,
            "schedules": {name: schedule.next for name, schedule in self.schedules.items()},
        }

    def load_progress(self, progress: dict[str, Any]) -> None:
        """Resume from a checkpoint's :meth:`progress` (also those saved before ``schedules`` was)."""
        self.steps = progress["steps"]
        self.wall_offset = progress["wall_time_s"]
        self.compile_offset = progress.get("compile_time_s", 0.0)  # absent before it was saved
        self.time_to_stop_return = progress["time_to_stop_return_s"]
        self.updates_owed = progress["updates_owed"]
        saved = progress.get("schedules") or {
            "evaluations": progress["next_eval"],
            "checkpoints": progress["next_checkpoint"],
            "logging": progress["next_log"],
        }
        for name, next_step in saved.items():
            if name in self.schedules:
                self.schedules[name].next = next_step
