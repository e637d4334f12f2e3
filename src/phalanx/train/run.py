"""What a hook is (:class:`Hook`) and what it sees of the run (:class:`Run`).

The trainer implements :class:`Run`; the loop, the built-in hooks and yours are typed against it, so
that none of them imports the trainer that calls them. One rule for every hook, built-in or not: a hook
reads the run, writes only the :class:`~phalanx.train.state.RunState` fields it is named the writer of,
returns numbers to log, and stops the run only through :meth:`Run.stop`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from phalanx.train.state import RunState, Schedule

if TYPE_CHECKING:
    import torch

    from phalanx.algos.base import Algorithm
    from phalanx.config import TrainConfig
    from phalanx.train.checkpoint import CheckpointManager
    from phalanx.train.collection import Agreement, Collection
    from phalanx.train.evaluator import Evaluation, EvaluationProcess, Evaluator
    from phalanx.train.learner import Learner, LearnerGroup
    from phalanx.train.logging import RunLogger, Stopwatch
    from phalanx.train.worker import Worker


class Run(Protocol):
    """A training run as the loop and its hooks see it (:class:`~phalanx.train.trainer.Trainer`).

    Your hooks read ``steps``, ``config``, ``algorithm``, ``learner.updates``, ``run_dir`` and
    ``last_evaluation``, and may call :meth:`stop`; the rest serves the built-in hooks.
    """

    config: TrainConfig
    device: torch.device
    group: LearnerGroup | None
    is_main: bool
    run_dir: Path
    algorithm: Algorithm
    learner: Learner
    worker: Worker
    buffer: Any  # the rollout or replay buffer, single- or multi-agent (its kind: algorithm.on_policy)
    evaluator: Evaluator | EvaluationProcess | None
    eval_process: EvaluationProcess | None
    checkpoints: CheckpointManager
    collection: Collection
    agreement: Agreement
    stop_requested: threading.Event
    show_progress: bool
    compilable: bool
    state: RunState
    hooks: Scheduler

    @property
    def steps(self) -> int: ...
    @property
    def last_evaluation(self) -> Evaluation | None: ...
    @property
    def logger(self) -> RunLogger: ...
    @property
    def stopwatch(self) -> Stopwatch: ...

    def stop(self, reason: str) -> None: ...
    def save(self) -> Path | None: ...
    def start_collection(self) -> None: ...
    def agent_state(self) -> dict[str, Any]: ...
    def compile(self) -> list[str]: ...
    def evaluation_columns(self, evaluation: Evaluation) -> dict[str, float]: ...
    def extra_summary(self) -> dict[str, Any]: ...


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
    - :meth:`on_finish`: when a ``train`` ends (budget spent, stopped, or Ctrl+C), before its last
      checkpoint.
    - :meth:`on_end`: after a run that ended without an error or Ctrl+C, with its summary.json.

    The ``trainer`` is the run (:class:`Run`): read ``trainer.steps``, ``trainer.config``,
    ``trainer.algorithm``, ``trainer.learner.updates``, ``trainer.run_dir``, ``trainer.last_evaluation``;
    change nothing there but through ``trainer.stop``.

    In a data-parallel group (``num_learners > 1``) hooks run in learner 0's process only: phalanx
    pickles them into it when it starts the learners (define their class at module level); under
    torchrun every process builds its own, and only learner 0 calls them. A stop one requests stops
    every learner at the same step.
    """

    every: int = 0

    def schedule(self, trainer: Run) -> Schedule:
        """When this hook is first due in a ``train`` starting now; the built-in hooks return the schedule
        they keep in the run's state (saved in checkpoints), yours start at ``every``'s next multiple."""
        return Schedule.after(trainer.steps, self.every)

    def due(self, trainer: Run, schedule: Schedule) -> bool:
        """Whether :meth:`after_iteration` is called after this iteration (by default: its schedule's)."""
        return schedule.due(trainer.steps)

    def on_start(self, trainer: Run) -> None:
        """Training starts (or goes on), before the first iteration."""

    def after_iteration(self, trainer: Run) -> dict[str, float] | None:
        """An iteration (collect, learn) ended and the hook is due; numbers to log, or None."""

    def on_log(self, trainer: Run, row: dict[str, Any]) -> None:
        """A training row was logged; ``row`` is its row of metrics.csv."""

    def on_evaluation(self, trainer: Run, row: dict[str, float]) -> None:
        """An evaluation was recorded; ``row`` is its row of evaluations.csv."""

    def on_finish(self, trainer: Run, interrupted: bool) -> None:
        """The ``train`` ends: its budget spent, a stop, or Ctrl+C (``interrupted``); before its last
        checkpoint (after it, when interrupted: that one is saved first)."""

    def on_end(self, trainer: Run, summary: dict[str, Any]) -> None:
        """The run ended (budget spent or stopped); ``summary`` is its summary.json."""


class Scheduler:
    """The hooks of one ``train``, in the order they are called, each on its schedule."""

    def __init__(self, trainer: Run, hooks: Sequence[Hook]) -> None:
        self.hooks = list(hooks)
        self.schedules = [hook.schedule(trainer) for hook in self.hooks]

    def __iter__(self) -> Iterator[Hook]:
        return iter(self.hooks)

    def after_iteration(self, trainer: Run) -> None:
        """Call the hooks that are due, each moved past this step first; the numbers they return go to the
        next row of metrics.csv."""
        for hook, schedule in zip(self.hooks, self.schedules, strict=True):
            if hook.due(trainer, schedule):
                schedule.advance(trainer.steps)
                trainer.state.hook_metrics.update(hook.after_iteration(trainer) or {})
