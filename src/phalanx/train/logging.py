"""Run logging: metrics.csv, evaluations.csv, TensorBoard, a rich progress display (the learning curve,
curve.png, is drawn by :mod:`phalanx.train.plots`)."""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from phalanx.files import append_line, fsync_file, write_text_atomic

TRAINING_COLUMNS = [
    "steps",
    "wall_time_s",
    "steps_per_second",
    "updates",
    "updates_per_second",
    "episodes",
    "episode_return_mean",
    "episode_length_mean",
]
EVALUATION_COLUMNS = [
    "steps",
    "wall_time_s",
    "eval_return_mean",
    "eval_return_std",
    "eval_length_mean",
    "result_wall_time_s",
]


class StepTable:
    """A CSV file of rows keyed by ``steps``: ``first_columns``, then every other key in the order it first
    appears (sorted within a row), empty where a row has none. A key that appears after rows were written
    (off-policy losses start after the warm-up) widens the file once.

    Opened on an existing file (a resumed run), it keeps the rows up to ``steps``, the step the run goes
    on from, and drops the later ones (and a last row a kill cut short): they were logged after the
    checkpoint it resumes and will be logged again. Rows are appended whole but not fsynced one by one
    (an fsync costs milliseconds, an evaluation row may come every few); :meth:`sync` makes them durable,
    and the trainer calls it before every checkpoint, so the rows up to a checkpoint survive with it.
    """

    def __init__(self, path: Path, first_columns: list[str], steps: int) -> None:
        self.path = path
        self.columns = list(first_columns)
        if not path.is_file():  # written with the first row
            return
        rows, header, torn = self._read()
        self.columns += [column for column in header if column not in self.columns]
        kept = [row for row in rows if row.get("steps") and float(row["steps"]) <= steps]
        if len(kept) < len(rows) or header != self.columns or torn:
            self._rewrite(kept)

    def append(self, row: dict[str, Any]) -> None:
        new = sorted(key for key in row if key not in self.columns)
        if new or not self.path.is_file():
            rows = self._read()[0] if self.path.is_file() else []
            self.columns += new
            self._rewrite(rows)
        append_line(
            self.path,
            _csv_line(["" if row.get(key) is None else row[key] for key in self.columns]),
            sync=False,
        )

    def sync(self) -> None:
        if self.path.is_file():
            fsync_file(self.path)

    def _read(self) -> tuple[list[dict[str, str]], list[str], bool]:
        """The whole rows, the header, and whether a last line was cut short (by a kill)."""
        text = self.path.read_text()
        whole = text[: text.rfind("\n") + 1]
        reader = csv.DictReader(io.StringIO(whole))
        return list(reader), list(reader.fieldnames or []), whole != text

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(self.path, text.getvalue())


def read_table(path: Path) -> list[dict[str, float]]:
    """The rows of a :class:`StepTable` file as numbers (empty cells left out); [] if there is none."""
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        return [{key: float(value) for key, value in row.items() if value} for row in csv.DictReader(file)]


class RunLogger:
    """Logs a run: training rows to metrics.csv, evaluations to evaluations.csv, both to TensorBoard, and
    shows live progress.

    metrics.csv has one row per log step (:data:`TRAINING_COLUMNS`, then the algorithm's losses and
    statistics); evaluations.csv one row per evaluation, keyed by the step of the weights evaluated
    (:data:`EVALUATION_COLUMNS`, then a multi-agent run's per-agent returns), which with an evaluation
    process is some steps before the result came in. TensorBoard gets every number at the step it belongs
    to. ``steps`` is the step the run starts (or resumes) from.
    """

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        steps: int = 0,
        show_progress: bool = True,
        tensorboard: bool = True,
        console: Console | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.training = StepTable(self.run_dir / "metrics.csv", TRAINING_COLUMNS, steps)
        self.evaluations = StepTable(self.run_dir / "evaluations.csv", EVALUATION_COLUMNS, steps)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run hides the events its killed predecessor logged after the checkpoint
            self.writer = SummaryWriter(str(self.run_dir), purge_step=steps + 1 if steps else None)
        self.console = console or Console(stderr=True)
        self.progress: TrainingProgress | None = None
        if show_progress:
            self.progress = TrainingProgress(total_steps, steps, self.console)
            self.progress.start()

    def log(self, row: dict[str, Any]) -> dict[str, Any]:
        """A training row (``steps``, ``wall_time_s``, rates, episode means, the algorithm's metrics); returns
        it as written (numbers, None where empty)."""
        row = {key: _scalar(value) for key, value in row.items()}
        self.training.append(row)
        self._tensorboard(row, ("steps",))
        if self.progress is not None:
            self.progress.training(row)
        return row

    def log_evaluation(self, row: dict[str, Any]) -> None:
        """An evaluation row: ``steps`` and ``wall_time_s`` of the weights evaluated, ``eval_*`` results and
        ``result_wall_time_s``, when the result was in."""
        row = {key: _scalar(value) for key, value in row.items()}
        self.evaluations.append(row)
        self._tensorboard(row, ("steps", "wall_time_s", "result_wall_time_s"))
        if self.progress is not None:
            self.progress.evaluation(row)

    def _tensorboard(self, row: dict[str, Any], skip: tuple[str, ...]) -> None:
        if self.writer is None:
            return
        step = int(row["steps"])
        for key, value in row.items():
            if key not in skip and isinstance(value, (int, float)):
                self.writer.add_scalar(tensorboard_tag(key), value, step)

    def sync(self) -> None:
        """Make every row logged so far durable (before a checkpoint: the rows up to it survive a kill)."""
        self.training.sync()
        self.evaluations.sync()

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self.sync()
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def summary_table(self, summary: dict[str, Any]) -> None:
        print_summary(summary, Console())


class TrainingProgress(Progress):
    """The live display: a bar with the steps done of the budget and the elapsed time, and under it the
    latest rates and returns, each with its label and the step it is from, packed into as many lines as
    the terminal's width needs (nothing cut)."""

    def __init__(self, total_steps: int, steps: int, console: Console) -> None:
        self.numbers: dict[str, str] = {}  # what the line under the bar shows, by kind
        super().__init__(
            TextColumn("[bold]training"),
            BarColumn(bar_width=None),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
            TimeElapsedColumn(),
            console=console,
            expand=True,
        )
        self.task = self.add_task("train", total=total_steps, completed=steps)

    def training(self, row: dict[str, Any]) -> None:
        steps = int(row["steps"])
        if row.get("steps_per_second") is not None:
            self.numbers["steps_per_second"] = f"{row['steps_per_second']:,.0f} env steps/s"
        if row.get("updates_per_second") is not None:
            self.numbers["updates_per_second"] = f"{row['updates_per_second']:,.0f} updates/s"
        if row.get("episode_return_mean") is not None:
            self.numbers["train_return"] = f"train return {row['episode_return_mean']:.1f} (step {steps:,})"
        self.update(self.task, completed=steps)

    def evaluation(self, row: dict[str, Any]) -> None:
        steps = int(row["steps"])
        self.numbers["eval_return"] = f"eval return {row['eval_return_mean']:.1f} (step {steps:,})"
        # training has reached at least the evaluated step: the bar never shows fewer steps than that
        self.update(self.task, completed=max(self._tasks[self.task].completed, steps))
        self.refresh()

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.numbers:
            yield PackedLine(list(self.numbers.values()))


class PackedLine:
    """Items side by side, two spaces apart, wrapped between items (never inside one) to the width."""

    def __init__(self, items: list[str]) -> None:
        self.items = items

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = ""
        for item in self.items:
            if line and len(line) + 2 + len(item) > options.max_width:
                yield Text(line)
                line = ""
            line = f"{line}  {item}" if line else item
        yield Text(line)


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """The run's summary.json as a table of labelled numbers, then the run directory on a line of its own
    (whole, to be copied: a long one wraps as the terminal wraps it)."""
    table = Table(title="phalanx run summary", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("env", summary["env"])
    table.add_row("algorithm", summary["algo"])
    table.add_row("seed", str(summary["seed"]))
    table.add_row("env steps", f"{summary['total_steps']:,}")
    table.add_row("wall time", f"{summary['wall_time_s']:,.1f} s")
    table.add_row("env steps/s", f"{summary['steps_per_second']:,.0f}")
    stop, reached = summary["stop_return"], summary["time_to_stop_return_s"]
    if stop is not None:
        table.add_row(
            "stop return",
            f"{stop:g} reached after {reached:,.1f} s" if reached is not None else f"{stop:g} not reached",
        )
    if summary["eval_return_mean"] is not None:
        table.add_row(
            "eval return",
            f"{summary['eval_return_mean']:.1f} ± {summary['eval_return_std']:.1f}"
            + _of_step(summary["eval_steps"]),
        )
        table.add_row(
            "best eval return", f"{summary['best_eval_return']:.1f}" + _of_step(summary["best_eval_steps"])
        )
    console.print(table)
    console.print(f"run directory: {summary['run_dir']}", highlight=False, soft_wrap=True)


def _of_step(steps: int | None) -> str:
    return "" if steps is None else f" (step {steps:,})"  # None: a checkpoint saved before it was recorded


def _csv_line(values: list[Any]) -> str:
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow(values)
    return line.getvalue()


def _scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a metrics.csv column: grouped as eval/, rollout/, time/ or train/."""
    if key.startswith("eval_"):
        return f"eval/{key[5:]}"
    if key.startswith("episode_"):
        return f"rollout/{key}"
    if key in ("wall_time_s", "steps_per_second", "updates_per_second", "episodes", "updates"):
        return f"time/{key}"
    return f"train/{key}"


class Stopwatch:
    """Wall time of a run, continued across resumes (``clock``: another count of seconds to follow, e.g.
    :func:`phalanx.compiling.compile_seconds`)."""

    def __init__(self, offset: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.start = clock() - offset

    def __call__(self) -> float:
        return self.clock() - self.start
