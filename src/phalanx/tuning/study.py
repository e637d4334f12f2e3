"""The study runner (:class:`Tuning`): opens or continues the Optuna study, trains trials in chunks on a
population backend, reports each chunk's evaluation to the pruner, and writes tune.yaml, trials.csv and
best.yaml; :func:`tune` and :func:`run_tuning` are its entry points.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.markup import escape

from phalanx.config import TrainConfig
from phalanx.errors import ConfigError, import_optional
from phalanx.files import write_text_atomic
from phalanx.population.backends import ProcessBackend, Report, SerialBackend, Task
from phalanx.train.environments import picklable_factory
from phalanx.train.launch import available_cores
from phalanx.tuning.results import TuneFailed, TuneInterrupted, TuneResult, format_values, trial_rows
from phalanx.tuning.settings import TuneConfig
from phalanx.tuning.space import Dimension, check_within_budget, with_hyperparameters

TRIAL_STATES_ENDED = ("COMPLETE", "PRUNED", "FAIL")
MAX_FAILURES_IN_A_ROW = 3
"""Trials that crash one after another before the study stops (the cause is likely not the values)."""


def import_optuna() -> Any:
    return import_optional(
        "optuna",
        ConfigError,
        "phalanx tune needs Optuna, which is an optional extra: pip install 'phalanx[tune]'.",
        packages=("optuna",),
    )


# -- the search -------------------------------------------------------------------------------------
@dataclass
class _Running:
    trial: Any
    """The optuna.trial.Trial."""
    name: str
    config: TrainConfig
    target: int
    """The step the chunk under way trains to (the step its score is reported at)."""


class Tuning:
    """A study run on a backend: asks Optuna for trials, trains them in chunks, reports and prunes."""

    def __init__(
        self,
        config: TuneConfig,
        sampler: Any = None,
        pruner: Any = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.optuna = import_optuna()
        config.validate()
        self.config = config
        self.space = config.space()
        self.interval = config.resolved_interval()
        self.say = say or (lambda message: None)
        base = config.base
        self.directory = Path(
            config.directory or Path("tuning") / f"{base.env.replace('/', '-')}__{base.algo}"
        )
        self.storage = config.storage or f"sqlite:///{(self.directory / 'study.db').resolve()}"
        self.study_name = config.study_name or self.directory.name
        self.sampler, self.pruner = sampler, pruner
        self.running: dict[str, _Running] = {}
        self.failures_in_a_row = 0

    # -- the study ------------------------------------------------------------------------------
    def open_study(self) -> Any:
        """Create the study, or load it and check that it is the same search."""
        optuna = self.optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            study = self._create_or_load_study()
        except Exception as error:  # noqa: BLE001 - whatever the storage's driver raises
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(
                f"cannot open the Optuna storage {self.storage!r}: {type(error).__name__}: {first}. Give "
                "a URL Optuna can open (sqlite:///path/study.db, postgresql://..., mysql://...; an RDB URL "
                "needs its driver installed), or leave --storage out for a SQLite file in the tune directory."
            ) from None
        if len(study.directions) != 1 or study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise ConfigError(
                f"study {self.study_name!r} in {self.storage} is not a single-objective maximization "
                "(phalanx tune maximizes the evaluation return); choose another --study-name."
            )
        definition = self.config.definition()
        stored = study.user_attrs.get("phalanx")
        if stored is None and study.trials:
            raise ConfigError(
                f"study {self.study_name!r} in {self.storage} holds trials that phalanx tune did not make; "
                "choose another --study-name."
            )
        if stored is None:
            study.set_user_attr("phalanx", definition)
        elif stored != definition:
            raise ConfigError(
                f"study {self.study_name!r} in {self.storage} is another search: "
                f"{_differences(stored, definition)}. "
                "Rerun with the settings it was made with to continue it, or start a new study with another "
                "--directory (or --study-name)."
            )
        ended = len(self.ended(study))
        # A sampler of its own seed for each session, derived from the base seed and the trials so far:
        # a resumed study does not draw again the values of its first trials.
        seed = int(np.random.SeedSequence(self.config.base.seed, spawn_key=(ended,)).generate_state(1)[0])
        study.sampler = self.sampler or (
            optuna.samplers.TPESampler(seed=seed)
            if self.config.sampler == "tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        )
        study.pruner = self.pruner or (
            optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=self.config.base.total_steps // 3)
            if self.config.pruner == "median"
            else optuna.pruners.NopPruner()
        )
        return study

    def _create_or_load_study(self, attempts: int = 4) -> Any:
        """optuna.create_study, again after a pause when it fails: two tune commands sharing one new
        storage (or a reader of it) can race to create its tables, and the loser's error ("table
        studies already exists", "UNIQUE constraint failed") is gone on the second try."""
        for attempt in range(attempts):
            try:
                return self.optuna.create_study(
                    storage=self.storage,
                    study_name=self.study_name,
                    direction="maximize",
                    load_if_exists=True,
                )
            except Exception:  # noqa: BLE001 - the driver's errors; the last one is raised
                if attempt == attempts - 1:
                    raise
                time.sleep(0.25 * (attempt + 1))
        raise AssertionError("unreachable")

    def ended(self, study: Any) -> list[Any]:
        states = tuple(getattr(self.optuna.trial.TrialState, state) for state in TRIAL_STATES_ENDED)
        return study.get_trials(deepcopy=False, states=states)

    def orphans(self, study: Any) -> list[Any]:
        """Trials left running by an interrupted or killed session of this directory (their run
        directories are here): they go on from their checkpoints."""
        running = study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,))
        return [t for t in running if self.trial_dir(t.number).is_dir()]

    def trial_dir(self, number: int) -> Path:
        """Absolute: the run directory every process reaches, whatever its working directory."""
        return self.directory.resolve() / "trials" / f"trial_{number:04d}"

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        self.directory.mkdir(parents=True, exist_ok=True)
        with _locked(self.directory):
            study = self.open_study()
            self.save_definition()
            backend = self.make_backend()
            orphans = self.orphans(study)
            if orphans:
                self.say(f"continuing {len(orphans)} trial(s) from their checkpoints")
            elif len(self.ended(study)) >= self.config.trials:
                self.say(
                    f"nothing to do: the study in {self.directory} has its {self.config.trials} trials; "
                    f"pass --trials N (N > {self.config.trials}) to run more"
                )
            try:
                self.loop(study, backend, orphans)
            except KeyboardInterrupt:
                backend.close()  # a trial in flight saves its checkpoint as it ends
                self.write_table(study)
                raise TuneInterrupted(self.directory, len(self.running)) from None
            finally:
                backend.close()
            self.write_table(study)
            return self.result(study)

    def make_backend(self) -> Any:
        if self.config.resolved_backend() == "serial":
            self.envs: dict[str, Any] = {}
            return SerialBackend()
        self.envs = picklable_factory(
            self.config.base.env,
            "the process backend trains each trial in a process of its own",
            "use --backend serial",
        )
        return ProcessBackend(max(1, available_cores() // self.config.parallel))

    def loop(self, study: Any, backend: Any, orphans: list[Any]) -> None:
        while True:
            while len(self.running) < self.config.parallel:
                if orphans:
                    frozen = orphans.pop(0)
                    self.start(backend, self.optuna.trial.Trial(study, frozen._trial_id), frozen)
                elif len(self.ended(study)) + len(self.running) < self.config.trials:
                    self.start(backend, study.ask(), None)
                else:
                    break
            if not self.running:
                return
            for report in backend.wait(timeout=1.0):
                self.handle(study, backend, report)

    def start(self, backend: Any, trial: Any, frozen: Any) -> None:
        """Begin a trial (``frozen``: a trial that ran before, continued from its last reported step)."""
        name = f"trial_{trial.number:04d}"
        run_dir = self.trial_dir(trial.number)
        run_dir.mkdir(parents=True, exist_ok=True)  # marks the trial as this directory's (orphans())
        if frozen is None:
            stored = {name_: dimension.suggest(trial, name_) for name_, dimension in self.space.items()}
            trial.set_user_attr("run_dir", str(run_dir))
            reached = 0
        else:
            stored = frozen.params
            reached = max(frozen.intermediate_values, default=0)
        base = self.config.base
        try:
            values = {n: self.space[n].decode(n, base, stored[n]) for n in self.space}
            config = with_hyperparameters(base, values, run_dir=str(run_dir), eval_process=False)
            config.validate()
            check_within_budget(config)
        except ConfigError as error:  # a combination of values that no config takes
            self.fail(trial, f"its values make an invalid config: {error}")
            return
        running = _Running(trial, name, config, self.next_target(reached))
        self.running[name] = running
        self.submit(backend, running)
        self.say(
            f"trial {trial.number}: {format_values(values)}"
            + (f" (continued at {reached:,} steps)" if frozen else "")
        )

    def submit(self, backend: Any, running: _Running) -> None:
        backend.submit(Task(running.name, running.config.to_dict(), running.target, envs=self.envs))

    def handle(self, study: Any, backend: Any, report: Report) -> None:
        running = self.running.get(report.member)
        if running is None:
            return
        if report.interrupted:
            raise KeyboardInterrupt
        trial, number = running.trial, running.trial.number
        if report.error is not None:
            del self.running[report.member]
            backend.stop(report.member)
            self.fail(trial, report.error.strip().splitlines()[-1])
            return
        if report.score is None or not math.isfinite(report.score):
            del self.running[report.member]
            backend.stop(report.member)
            self.fail(trial, f"its evaluation return is {report.score} at {report.steps:,} steps")
            return
        self.failures_in_a_row = 0
        trial.report(report.score, running.target)
        trial.set_user_attr("steps", report.steps)
        total = self.config.base.total_steps
        if report.steps >= total or report.steps < running.target:  # the budget, or stop_return
            del self.running[report.member]
            backend.stop(report.member)
            study.tell(trial, report.score)
            best = study.best_trial
            self.say(
                f"trial {number}: complete, value {report.score:.2f} at {report.steps:,} steps "
                f"(best: trial {best.number}, {best.value:.2f})"
            )
            self.write_table(study)
            if best.number == number:
                self.write_best(study)
            return
        if trial.should_prune():
            del self.running[report.member]
            backend.stop(report.member)
            study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
            self.say(f"trial {number}: pruned at {running.target:,} steps, score {report.score:.2f}")
            self.write_table(study)
            return
        self.say(f"trial {number}: score {report.score:.2f} at {report.steps:,} steps")
        running.target = self.next_target(report.steps)
        self.submit(backend, running)

    def next_target(self, steps: int) -> int:
        """The next chunk's step target: the first multiple of the interval past ``steps`` (a chunk that
        overshot its target, a rollout being larger than the interval, skips the targets it passed), at
        most the budget. Every trial reports at these same steps, so the pruner compares like with like."""
        return min((steps // self.interval + 1) * self.interval, self.config.base.total_steps)

    def fail(self, trial: Any, why: str) -> None:
        trial.set_user_attr("error", why)
        trial.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        self.say(f"trial {trial.number}: failed: {why}")
        self.write_table(trial.study)
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            raise TuneFailed(
                f"{self.failures_in_a_row} trials in a row failed; the last one: {why}. The study stops: "
                f"the cause is likely not the searched values. Every trial's error is in "
                f"{self.directory / 'trials.csv'}; fix the cause and rerun the command to continue the study."
            )

    # -- what it writes -------------------------------------------------------------------------
    def save_definition(self) -> None:
        resolved = {
            **self.config.definition(),
            "trials": self.config.trials,
            "sampler": self.config.sampler if self.sampler is None else type(self.sampler).__name__,
            "pruner": self.config.pruner if self.pruner is None else type(self.pruner).__name__,
            "parallel": self.config.parallel,
            "backend": self.config.resolved_backend(),
            "storage": self.storage,
            "study_name": self.study_name,
        }
        write_text_atomic(self.directory / "tune.yaml", yaml.safe_dump(resolved, sort_keys=False))

    def write_table(self, study: Any) -> None:
        rows = trial_rows(study, list(self.space))
        if not rows:
            return
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(self.directory / "trials.csv", text.getvalue())

    def best_config(self, study: Any) -> TrainConfig:
        best = study.best_trial
        base = self.config.base
        values = {name: self.space[name].decode(name, base, best.params[name]) for name in self.space}
        return with_hyperparameters(base, values, run_dir=None)

    def write_best(self, study: Any) -> Path:
        best = study.best_trial
        data = self.best_config(study).to_dict()
        data.pop("run_dir")
        header = (
            f"# phalanx tune: the best trial ({best.number}, value {best.value:.4g}) of study "
            f"{self.study_name!r}, {self.storage}.\n"
            f"# Train with: phalanx train {data['algo']} {data['env']} --config best.yaml "
            "[--total-steps N ...]\n"
        )
        path = self.directory / "best.yaml"
        write_text_atomic(path, header + yaml.safe_dump(data, sort_keys=False))
        return path

    def result(self, study: Any) -> TuneResult:
        complete = study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.COMPLETE,))
        if not complete:
            states = [trial.state.name.lower() for trial in study.get_trials(deepcopy=False)]
            counts = ", ".join(f"{states.count(state)} {state}" for state in sorted(set(states)))
            raise TuneFailed(
                f"no trial of study {self.study_name!r} completed ({counts}), "
                f"so there is no best config. See {self.directory / 'trials.csv'}; raise --trials to go on, "
                "or loosen the pruner (--pruner none)."
            )
        best = study.best_trial
        run_dir = Path(best.user_attrs["run_dir"]) if "run_dir" in best.user_attrs else None
        best_params = {
            name: self.space[name].decode(name, self.config.base, best.params[name]) for name in self.space
        }
        return TuneResult(
            directory=self.directory,
            study=study,
            best_trial=best.number,
            best_value=best.value,
            best_params=best_params,
            best_config=self.write_best(study),
            best_run_dir=run_dir if run_dir is not None and run_dir.is_dir() else None,
        )


def _differences(stored: dict[str, Any], definition: dict[str, Any]) -> str:
    """The settings in which two study definitions differ, e.g. ``base.total_steps 4096 -> 8192``."""
    found = []
    for key in sorted(set(stored) | set(definition)):
        old, new = stored.get(key), definition.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            for name in sorted(set(old) | set(new)):
                if old.get(name) != new.get(name):
                    found.append(f"{key}.{name} {old.get(name)!r} -> {new.get(name)!r}")
        elif old != new:
            found.append(f"{key} {old!r} -> {new!r}")
    return "; ".join(found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")


@contextlib.contextmanager
def _locked(directory: Path):
    """Hold the tune directory for this session: a second `phalanx tune` on it is refused (it would train
    the same trials twice)."""
    if os.name != "posix":  # no advisory locks to take: the user keeps one session per directory
        yield
        return
    import fcntl

    with open(directory / "tune.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another phalanx tune is running in {directory}; wait for it to end, or give this one "
                "another --directory (several directories can share one --storage and --study-name)."
            ) from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- the entry point --------------------------------------------------------------------------------
def tune(
    config: TrainConfig,
    trials: int,
    *,
    search: Mapping[str, str | Dimension] | None = None,
    sampler: Any = "tpe",
    pruner: Any = "median",
    interval: int | None = None,
    parallel: int = 1,
    backend: str | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    directory: str | Path | None = None,
    show_progress: bool = True,
) -> TuneResult:
    """Search ``config``'s hyperparameters with Optuna; returns the best trial and writes best.yaml.

    ``search`` maps hyperparameter names to ``KIND:ARGS`` (``{"learning_rate": "log:1e-5,1e-3"}``; None:
    the algorithm's default space). ``sampler`` and ``pruner`` are names (tpe, random; median, none) or
    Optuna objects (any ``optuna.samplers.BaseSampler`` / ``optuna.pruners.BasePruner``). The same call
    with the same directory (or storage and study name) continues the study.
    """
    tune_config = TuneConfig(
        base=config,
        trials=trials,
        search=dict(search or {}),
        sampler=sampler if isinstance(sampler, str) else "tpe",
        pruner=pruner if isinstance(pruner, str) else "median",
        interval=interval,
        parallel=parallel,
        backend=backend,
        storage=storage,
        study_name=study_name,
        directory=None if directory is None else str(directory),
    )
    return run_tuning(
        tune_config,
        sampler=None if isinstance(sampler, str) else sampler,
        pruner=None if isinstance(pruner, str) else pruner,
        show_progress=show_progress,
    )


def run_tuning(
    config: TuneConfig, sampler: Any = None, pruner: Any = None, show_progress: bool = True
) -> TuneResult:
    """Run (or continue) the study ``config`` describes; ``sampler``/``pruner``: Optuna objects that
    replace the named ones."""
    return Tuning(config, sampler, pruner, _say(show_progress)).run()


def _say(show_progress: bool) -> Callable[[str], None] | None:
    if not show_progress:
        return None
    console = Console(stderr=True)
    return lambda message: console.print(escape(message), highlight=False, soft_wrap=True)
