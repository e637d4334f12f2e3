"""Hyperparameter search with Optuna: independent trials, each an ordinary run directory.

``phalanx tune ALGO ENV --trials N`` (or :func:`tune`) asks Optuna's sampler for each trial's
hyperparameters, trains the trial in chunks of ``interval`` env steps on the population module's backend
(:class:`~phalanx.population.backends.Task` in, :class:`~phalanx.population.backends.Report` out: in this
process, or one process per running trial), reports each chunk's deterministic evaluation return to the
trial, and lets Optuna's pruner stop the trials that do worse than the others at the same step. The
objective is the return of the evaluation that ends the trial (its final one, as RL Zoo's).

The study lives in Optuna's storage (a SQLite file in the tune directory unless ``--storage`` names
another), so rerunning the same command continues it: finished trials are kept, and a trial that was
running when the study was interrupted (Ctrl+C) or killed goes on from its run directory's checkpoint.

Tune directory::

    tune.yaml          the resolved search: base config, search space, interval, sampler, pruner
    study.db           the Optuna storage (SQLite), unless --storage names another
    trials.csv         every trial: number, state, value, steps, seconds, params, run directory
    best.yaml          the best trial's config, for `phalanx train ALGO ENV --config best.yaml`
    trials/trial_0007/ each trial's run directory (`phalanx eval`, `phalanx resume` work on it)

Modules:

- :mod:`~phalanx.tuning.space`: the search space (:class:`Dimension`, ``KIND:ARGS``) and each
  algorithm's default one;
- :mod:`~phalanx.tuning.settings`: :class:`TuneConfig`, the settings of a study;
- :mod:`~phalanx.tuning.study`: the study runner (:class:`Tuning`), :func:`tune` and :func:`run_tuning`;
- :mod:`~phalanx.tuning.results`: the best trial, the trials table, and the errors that end a study.
"""

from __future__ import annotations

from phalanx.tuning.results import TuneFailed, TuneInterrupted, TuneResult, trial_rows, trials_table
from phalanx.tuning.settings import BACKENDS, PRUNERS, SAMPLERS, TuneConfig
from phalanx.tuning.space import (
    DEFAULT_SEARCH,
    GAMMAS,
    KINDS,
    Dimension,
    check_within_budget,
    default_search,
    with_hyperparameters,
)
from phalanx.tuning.study import (
    MAX_FAILURES_IN_A_ROW,
    TRIAL_STATES_ENDED,
    Tuning,
    import_optuna,
    run_tuning,
    tune,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_SEARCH",
    "GAMMAS",
    "KINDS",
    "MAX_FAILURES_IN_A_ROW",
    "PRUNERS",
    "SAMPLERS",
    "TRIAL_STATES_ENDED",
    "Dimension",
    "TuneConfig",
    "TuneFailed",
    "TuneInterrupted",
    "TuneResult",
    "Tuning",
    "check_within_budget",
    "default_search",
    "import_optuna",
    "run_tuning",
    "trial_rows",
    "trials_table",
    "tune",
    "with_hyperparameters",
]
