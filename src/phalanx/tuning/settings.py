"""The settings of a study (:class:`TuneConfig`): the base config every trial starts from, the search
space, and how trials are drawn, run and pruned; checked before anything runs, and reduced to the
definition that tells one study from another.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from phalanx.config import TrainConfig, is_int
from phalanx.errors import ConfigError
from phalanx.tuning.space import Dimension, default_search

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
BACKENDS = ("serial", "process")


@dataclass
class TuneConfig:
    """A search: the base run every trial starts from, the space, and how trials are run and pruned."""

    base: TrainConfig
    """The training config of every trial (its total_steps is each trial's budget, its seed every trial's)."""
    trials: int = 20
    """Trials in the study: a rerun goes on until this many have ended (complete, pruned or failed)."""
    search: dict[str, str | Dimension] = field(default_factory=dict)
    """Hyperparameter name -> its dimension, or its ``KIND:ARGS`` text, parsed into one when the config is
    built (empty: the algorithm's default search space)."""
    sampler: str = "tpe"
    """How Optuna draws a trial's values: tpe (Tree-structured Parzen Estimator) or random."""
    pruner: str = "median"
    """median (stop a trial whose score is below the median of the earlier trials' at the same step, after
    5 trials and the first third of the budget) or none."""
    interval: int | None = None
    """Env steps a trial trains between evaluations reported to the pruner (default: total_steps / 5)."""
    parallel: int = 1
    """Trials trained at once."""
    backend: str | None = None
    """serial (in this process) or process (one process per running trial); default: serial for
    --parallel 1, process above."""
    storage: str | None = None
    """Optuna storage URL, e.g. sqlite:///study.db (default: sqlite in the tune directory)."""
    study_name: str | None = None
    """The study's name in the storage (default: the tune directory's name)."""
    directory: str | None = None
    """Tune directory; default tuning/<env>__<algo>, so that the same command continues the same study."""

    def __post_init__(self) -> None:
        self.search = {name: Dimension.parse(name, spec) for name, spec in self.search.items()}

    def resolved_interval(self) -> int:
        if self.interval is not None:
            return min(self.interval, self.base.total_steps)
        return max(1, self.base.total_steps // 5)

    def resolved_backend(self) -> str:
        return self.backend or ("serial" if self.parallel == 1 else "process")

    def space(self) -> dict[str, Dimension]:
        # the dimensions __post_init__ parsed, as they are
        search = {name: Dimension.parse(name, spec) for name, spec in self.search.items()}
        return search or default_search(self.base)

    def validate(self) -> None:
        self.base.validate()
        _check_count("trials", self.trials, "an integer >= 1 (the trials of the study)")
        _check_count("parallel", self.parallel, "an integer >= 1 (trials trained at once)")
        if self.interval is not None:
            _check_count("interval", self.interval, "env steps >= 1 between reports to the pruner")
        _check_name("sampler", self.sampler, SAMPLERS)
        _check_name("pruner", self.pruner, PRUNERS)
        if self.backend is not None:
            _check_name("backend", self.backend, BACKENDS)
        space = self.space()
        for name, dimension in space.items():
            try:
                dimension.validate(name, self.base)
            except ConfigError as error:
                if self.search:
                    raise
                raise ConfigError(
                    f"the default search space of {self.base.algo} does not fit this config: {error} "
                    "Give the space with --search NAME=KIND:ARGS (see docs/tuning.md)."
                ) from None

    def definition(self) -> dict[str, Any]:
        """What makes a study: the same definition continues it, another one is another study."""
        base = self.base.to_dict()
        base.pop("run_dir")
        return {
            "base": base,
            "search": {name: dimension.text() for name, dimension in self.space().items()},
            "interval": self.resolved_interval(),
        }


def _check_count(name: str, value: Any, expected: str) -> None:
    if not is_int(value) or value < 1:
        raise ConfigError(f"{name} = {value!r} is invalid: expected {expected}. Fix it with --{name}.")


def _check_name(name: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        close = difflib.get_close_matches(str(value), valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown {name} {value!r}.{hint} Choose one of: {', '.join(valid)} (--{name}).")
