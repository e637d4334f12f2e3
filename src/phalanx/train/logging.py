"""Run logging: metrics.csv, TensorBoard, a rich progress display, and the learning curve."""

from __future__ import annotations

import csv
import io
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from phalanx.files import append_line, atomic_write, write_text_atomic

FIRST_COLUMNS = [
    "steps",
    "wall_time_s",
    "steps_per_second",
    "episode_return_mean",
    "episode_length_mean",
    "eval_return_mean",
    "eval_return_std",
]


class RunLogger:
    """Writes one row per log step to metrics.csv and TensorBoard, and shows live progress.

    Columns are the fixed first ones plus every metric seen so far, empty where a row has none; when
    a new metric appears (off-policy losses start after the warm-up) the file is rewritten once with
    the wider header. A run resumed at ``steps`` appends to the existing file, after dropping the rows
    of later steps (a run killed after its last checkpoint logged them; they are logged again), and
    TensorBoard hides its events of those steps.
    """

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        show_progress: bool = True,
        tensorboard: bool = True,
        steps: int = 0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.csv_path = self.run_dir / "metrics.csv"
        self.columns: list[str] | None = None
        if self.csv_path.is_file():
            self._drop_rows_after(steps)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir), purge_step=steps + 1 if steps else None)
        self.console = Console(stderr=True)
        self.progress: Progress | None = None
        self.total_steps = total_steps
        self.last_return = "-"
        if show_progress:
            self.progress = Progress(
                TextColumn("[bold]training"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TextColumn("{task.fields[fps]} env steps/s"),
                TextColumn("{task.fields[ups]} updates/s"),
                TextColumn("return {task.fields[ret]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self.task = self.progress.add_task("train", total=total_steps, fps="-", ups="-", ret="-")
            self.progress.start()

    def log(self, row: dict[str, Any]) -> None:
        row = {key: _scalar(value) for key, value in row.items()}
        if self.columns is None:
            self.columns = list(FIRST_COLUMNS)
            write_text_atomic(self.csv_path, _csv_line(self.columns) + "\n")
        new = sorted(key for key in row if key not in self.columns)
        if new:
            self._widen(new)
        append_line(
            self.csv_path, _csv_line(["" if row.get(key) is None else row.get(key) for key in self.columns])
        )
        if self.writer is not None:
            step = int(row["steps"])
            for key, value in row.items():
                if key != "steps" and isinstance(value, (int, float)) and value is not None:
                    self.writer.add_scalar(_tensorboard_tag(key), value, step)
        if self.progress is not None:
            recent = row.get("eval_return_mean") or row.get("episode_return_mean")
            if recent is not None:
                self.last_return = f"{recent:.1f}"
            fps, ups = row.get("steps_per_second"), row.get("updates_per_second")
            self.progress.update(
                self.task,
                completed=min(int(row["steps"]), self.total_steps),
                fps=f"{fps:,.0f}" if fps else "-",
                ups=f"{ups:,.0f}" if ups is not None else "-",
                ret=self.last_return,
            )

    def _drop_rows_after(self, steps: int) -> None:
        """Read the header of metrics.csv, and rewrite it without the rows after ``steps`` (and without a
        last row a kill cut short)."""
        text = self.csv_path.read_text()
        whole = text[: text.rfind("\n") + 1]
        reader = csv.DictReader(io.StringIO(whole))
        rows = list(reader)
        self.columns = list(reader.fieldnames) if reader.fieldnames else None
        kept = [row for row in rows if int(row["steps"]) <= steps]
        if self.columns is not None and (len(kept) < len(rows) or whole != text):
            with atomic_write(self.csv_path, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self.columns, lineterminator="\n")
                writer.writeheader()
                writer.writerows(kept)

    def _widen(self, new_columns: list[str]) -> None:
        """Rewrite metrics.csv with ``new_columns`` added (earlier rows get empty cells)."""
        with self.csv_path.open(newline="") as file:
            rows = list(csv.DictReader(file))
        self.columns = [*self.columns, *new_columns]
        with atomic_write(self.csv_path, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.columns, restval="", lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)

    def message(self, text: str) -> None:
        self.console.print(text)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def summary_table(self, summary: dict[str, Any]) -> None:
        table = Table(title="phalanx run summary", show_header=False)
        for key in (
            "env",
            "algo",
            "seed",
            "total_steps",
            "wall_time_s",
            "steps_per_second",
            "time_to_stop_return_s",
            "eval_return_mean",
            "eval_return_std",
            "best_eval_return",
            "run_dir",
        ):
            value = summary.get(key)
            if isinstance(value, float):
                value = f"{value:,.3f}" if abs(value) < 1e6 else f"{value:,.0f}"
            table.add_row(key, "-" if value is None else str(value))
        Console().print(table)


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


def _tensorboard_tag(key: str) -> str:
    if key.startswith("eval_"):
        return f"eval/{key[5:]}"
    if key.startswith("episode_"):
        return f"rollout/{key}"
    if key in ("wall_time_s", "steps_per_second", "updates_per_second", "episodes", "updates"):
        return f"time/{key}"
    return f"train/{key}"


def plot_curve(run_dir: Path, title: str) -> Path | None:
    """Draw curve.png from metrics.csv: training episode return and evaluation return vs steps."""
    csv_path = Path(run_dir) / "metrics.csv"
    if not csv_path.is_file():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as file:
        rows = list(csv.DictReader(file))

    def series(key: str) -> tuple[list[float], list[float]]:
        points = [(float(r["steps"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
        return [p[0] for p in points], [p[1] for p in points]

    figure, axis = plt.subplots(figsize=(7, 4.2), dpi=110)
    steps, values = series("episode_return_mean")
    if steps:
        axis.plot(steps, values, label="training episodes (stochastic)", alpha=0.7)
    steps, values = series("eval_return_mean")
    if steps:
        std = series("eval_return_std")[1]
        axis.plot(steps, values, marker="o", label="evaluation (deterministic)")
        if len(std) == len(values):
            axis.fill_between(
                steps,
                [v - s for v, s in zip(values, std, strict=True)],
                [v + s for v, s in zip(values, std, strict=True)],
                alpha=0.2,
            )
    axis.set_xlabel("environment steps")
    axis.set_ylabel("episode return")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    figure.tight_layout()
    path = Path(run_dir) / "curve.png"
    with atomic_write(path, "wb") as file:
        figure.savefig(file, format="png")
    plt.close(figure)
    return path


class Stopwatch:
    """Wall time of a run, continued across resumes."""

    def __init__(self, offset: float = 0.0) -> None:
        self.start = time.perf_counter() - offset

    def __call__(self) -> float:
        return time.perf_counter() - self.start
