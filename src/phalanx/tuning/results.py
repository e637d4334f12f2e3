"""What a study reports: the best trial (:class:`TuneResult`), every trial as rows (trials.csv) or as a
table, and the errors that end a study without a best config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from phalanx.errors import PhalanxError


@dataclass
class TuneResult:
    directory: Path
    study: Any
    """The optuna.Study (``study.trials_dataframe()``, Optuna's plots, ...)."""
    best_trial: int
    best_value: float
    best_params: dict[str, Any]
    """The best trial's hyperparameters, as the config takes them."""
    best_config: Path
    """best.yaml: the best trial's config (``phalanx train ALGO ENV --config best.yaml``)."""
    best_run_dir: Path | None
    """The best trial's run directory (None when another tune directory ran it on a shared storage)."""

    def table(self) -> Table:
        """Every trial of the study: number, state, value, steps, seconds and the searched values."""
        return trials_table(self.study, list(self.best_params))


class TuneInterrupted(PhalanxError):
    """Ctrl+C: the running trials saved checkpoints; the same command continues the study."""

    def __init__(self, directory: Path, running: int) -> None:
        super().__init__(
            f"tuning interrupted; {running} running trial(s) saved a checkpoint. Rerun the same command "
            f"(the same --directory {directory}, --storage and --study-name) to continue the study: the "
            "finished trials are kept and the running ones go on from their checkpoints."
        )
        self.directory = directory


class TuneFailed(PhalanxError):
    """The study has no completed trial to report (every one failed or was pruned)."""


def trial_rows(study: Any, names: list[str]) -> list[dict[str, Any]]:
    """Every trial of ``study``: number, state, value, last step, seconds, the values of ``names``, its
    run directory and, for a failed one, why."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        end = trial.datetime_complete
        seconds = (end - trial.datetime_start).total_seconds() if end and trial.datetime_start else None
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name.lower(),
                "value": trial.value,
                "steps": trial.user_attrs.get("steps"),
                "seconds": None if seconds is None else round(seconds, 1),
                **{name: trial.params.get(name) for name in names},
                "run_dir": trial.user_attrs.get("run_dir"),
                "error": trial.user_attrs.get("error"),
            }
        )
    return rows


def trials_table(study: Any, names: list[str]) -> Table:
    """The trials as a table (the best one in bold): number, state, value, steps, seconds, and the values
    searched as ``name=value`` in one column, which wraps, so that the table reads at any width."""
    rows = trial_rows(study, names)
    table = Table(title=f"study {study.study_name} ({len(rows)} trials)")
    columns = ["trial", "state", "value", "steps", "seconds"]
    for name in columns:
        table.add_column(name, justify="left" if name == "state" else "right", no_wrap=True)
    table.add_column("hyperparameters", overflow="fold")
    complete = [row for row in rows if row["state"] == "complete"]
    best = max(complete, key=lambda row: row["value"])["trial"] if complete else None
    for row in rows:
        table.add_row(
            *(cell(row[name]) for name in columns),
            format_values({name: row[name] for name in names}),
            style="bold green" if row["trial"] == best else None,
        )
    return table


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_values(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={cell(value)}" for name, value in values.items() if value is not None)
