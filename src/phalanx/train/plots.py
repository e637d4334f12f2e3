"""Learning curves: one run's ``curve.png``, and runs compared across seeds and settings (``phalanx plot``).

Both are drawn by :func:`draw`, so a run's own curve and a comparison of runs look alike: labelled axes
with units, environment steps with SI suffixes (``20k``, ``1.5M``), a legend, one colour per line with
its shaded interval.

Comparing runs (:func:`plot`, :func:`curves`): each argument is a run directory (``config.yaml`` with its
algo, env, seed and hyperparameters; ``evaluations.csv`` and ``metrics.csv`` with its curves), a glob of
them, or a population directory (its members' run directories). The runs are grouped by a setting of
their config.yaml (``algo``, ``env``, ``seed``, any hyperparameter, or a peer library's ``library``);
each group is drawn as the mean over its runs and a shaded interval, on a grid of x values common to
its runs, each run interpolated linearly onto it.
"""

from __future__ import annotations

import difflib
import glob
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.config import load_yaml
from phalanx.errors import ConfigError
from phalanx.files import atomic_write
from phalanx.train.logging import read_table

X_COLUMNS = {"steps": "steps", "time": "wall_time_s"}
"""What ``x`` may be, and the column of evaluations.csv and metrics.csv it reads."""
X_LABELS = {"steps": "environment steps", "time": "wall time (s)"}
INTERVALS = {
    "stderr": "mean ± standard error over runs",
    "minmax": "mean, min–max over runs",
    "none": "mean over runs",
}
"""The shaded interval around each group's mean, and how the legend explains it."""
SPANS = ("common", "longest")
"""How far a group's curve goes when its runs end at different x: ``common``, the range every run of
the group has data for; ``longest``, up to its longest run, a run that ended earlier holding its last
value (as a run stopped by ``--stop-return`` does: its last evaluation reached the return)."""
METRIC_LABELS = {
    "eval_return_mean": "evaluation return (deterministic)",
    "episode_return_mean": "training episode return",
    "eval_length_mean": "evaluation episode length",
    "episode_length_mean": "training episode length",
}
DEFAULT_METRICS = ("eval_return_mean", "episode_return_mean")
"""The metric drawn when none is named: the first that every run has."""
SETTING_DEFAULTS = {"library": "phalanx"}
"""Settings a run's config.yaml may leave out: a phalanx run's names no library, a peer's (a benchmark's
SB3 run directory) does."""
MAX_POINTS = 1000
"""A group's grid is the x values of its runs; more than this many are thinned to this many, evenly."""


@dataclass
class Line:
    """One line of a figure: y against x, and optionally a shaded band from ``low`` to ``high``."""

    label: str
    x: np.ndarray
    y: np.ndarray
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    alpha: float = 1.0


@dataclass
class GroupCurve:
    """A group's aggregated curve: at each ``x``, the ``mean`` of its runs' values and the interval."""

    name: str
    """The group's value of the group-by setting, as the legend shows it: ``ppo``, ``learning_rate=0.001``."""
    runs: list[Path]
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray | None
    """The interval's lower and upper edge (None for ``interval="none"``, and for stderr over one run)."""
    high: np.ndarray | None
    values: np.ndarray = field(repr=False)
    """Every run's value at each x: shape (runs, len(x))."""

    @property
    def n(self) -> int:
        return len(self.runs)


@dataclass
class Curves:
    """What :func:`plot` draws: one :class:`GroupCurve` per group, in order of the group's value."""

    metric: str
    x: str
    group_by: str
    interval: str
    span: str
    groups: list[GroupCurve]
    configs: dict[Path, dict[str, Any]]
    """Each run's config.yaml."""


def find_runs(patterns: str | Path | Iterable[str | Path]) -> list[Path]:
    """The run directories that ``patterns`` name, in order, each once: a run directory, a population
    directory (its members), or a glob of them (``runs/CartPole*``; what else it matches, files and
    other directories, is left out)."""
    if isinstance(patterns, (str, Path)):
        patterns = [patterns]
    found: list[Path] = []
    for pattern in map(str, patterns):
        if glob.has_magic(pattern):
            matches = [Path(p) for p in sorted(glob.glob(pattern))]
            runs = [run for match in matches if _is_run_or_population(match) for run in _runs_in(match)]
            if not runs:
                what = (
                    f"{len(matches)} paths match, none with a config.yaml" if matches else "nothing matches"
                )
                raise ConfigError(
                    f"no run directory matches {pattern!r} ({what}, from {Path.cwd()}). Check the pattern, "
                    "e.g. runs/CartPole-v1__ppo__* for the runs `phalanx train ppo CartPole-v1` wrote."
                )
            found += runs
        elif Path(pattern).is_dir():
            found += _runs_in(Path(pattern))
        else:
            raise ConfigError(
                f"{pattern!r} is not a directory (from {Path.cwd()}). Pass run directories (the ones "
                "`phalanx train` prints), or globs of them."
            )
    unique = {path.resolve(): path for path in reversed(found)}  # each once, where it first appears
    return [path for path in found if unique.get(path.resolve()) is path]


def _is_run_or_population(path: Path) -> bool:
    return (path / "config.yaml").is_file() or (path / "leaderboard.json").is_file()


def _runs_in(directory: Path) -> list[Path]:
    if (directory / "config.yaml").is_file():
        return [directory]
    members = directory / "members"
    if (directory / "leaderboard.json").is_file():
        runs = (
            sorted(p for p in members.iterdir() if (p / "config.yaml").is_file()) if members.is_dir() else []
        )
        if runs:
            return runs
        if _read_config(directory, "population.yaml").get("backend") == "vectorized":
            raise ConfigError(
                f"{str(directory)!r} is a vectorized population: its members train as one batched run and "
                "have no run directories to plot. Its members' curves are in report/curves.png: "
                f"`phalanx population report {directory}` writes them."
            )
        raise ConfigError(f"population directory {str(directory)!r} has no member run directories yet.")
    raise ConfigError(
        f"{str(directory)!r} is not a phalanx run directory (no config.yaml) nor a population directory "
        f"(no leaderboard.json). To plot the runs inside it, pass {str(directory / '*')!r}."
    )


def curves(
    runs: str | Path | Iterable[str | Path],
    x: str = "steps",
    group_by: str = "algo",
    interval: str = "stderr",
    metric: str | None = None,
    span: str = "common",
) -> Curves:
    """The aggregated curves that :func:`plot` draws, as numbers: for each group of ``runs`` (run
    directories, globs of them, population directories) by the config setting ``group_by``, the mean of
    ``metric`` over its runs at each ``x`` (``steps`` or ``time``, wall seconds) and the ``interval``
    (``stderr``, ``minmax``, ``none``) around it. ``metric`` is a column of evaluations.csv or
    metrics.csv (default: ``eval_return_mean`` if every run has evaluations, else
    ``episode_return_mean``). ``span``: see :data:`SPANS`."""
    _check_choice("x", x, X_COLUMNS)
    _check_choice("interval", interval, INTERVALS)
    _check_choice("span", span, SPANS)
    paths = find_runs(runs)
    if not paths:
        raise ConfigError("no run directories given to plot. Pass run directories or globs of them.")
    configs = {path: _read_config(path) for path in paths}
    tables = {path: _tables(path) for path in paths}
    metric = metric or _default_metric(tables)
    series = {path: _series(path, tables[path], metric, X_COLUMNS[x]) for path in paths}

    # Returns of different envs are never averaged together: with runs of several envs, each env's runs
    # form groups of their own (a line each, named with the env), whatever the grouping.
    envs = {configs[path].get("env") for path in paths}
    by_env = group_by != "env" and len(envs) > 1
    members: dict[Any, list[Path]] = {}
    for path in paths:
        value = _setting(configs[path], group_by, path)
        key = (str(configs[path].get("env")), value) if by_env else value
        members.setdefault(key, []).append(path)

    def name(key: Any) -> str:
        return f"{_group_name(group_by, key[1])} on {key[0]}" if by_env else _group_name(group_by, key)

    def order(key: Any) -> tuple:
        return (key[0], _order(key[1])) if by_env else _order(key)

    groups = [
        _aggregate(name(key), members[key], series, interval, span, x) for key in sorted(members, key=order)
    ]
    return Curves(metric, x, group_by, interval, span, groups, configs)


def plot(
    runs: str | Path | Iterable[str | Path],
    x: str = "steps",
    group_by: str = "algo",
    interval: str = "stderr",
    metric: str | None = None,
    span: str = "common",
    output: str | Path = "plot.png",
    title: str | None = None,
) -> Path:
    """Draw ``runs`` compared (see :func:`curves` for the arguments) to ``output`` (PNG, or the format
    its suffix names: .pdf, .svg); returns its path. The default title names the env (and algorithm)
    the runs share."""
    return draw_curves(
        curves(runs, x=x, group_by=group_by, interval=interval, metric=metric, span=span), output, title
    )


def draw_curves(result: Curves, output: str | Path = "plot.png", title: str | None = None) -> Path:
    """Draw the curves :func:`curves` computed to ``output``; returns its path."""
    lines = [
        Line(f"{group.name} (n={group.n})", group.x, group.mean, group.low, group.high)
        for group in result.groups
    ]
    return draw(
        lines,
        Path(output),
        xlabel=X_LABELS[result.x],
        ylabel=METRIC_LABELS.get(result.metric, result.metric),
        title=title or _default_title(result),
        x_is_steps=result.x == "steps",
        legend_title=INTERVALS[result.interval],
    )


def plot_curve(run_dir: str | Path, title: str) -> Path | None:
    """Draw ``run_dir``/curve.png: the training episodes' mean return (metrics.csv) and the evaluations'
    (evaluations.csv, at the steps of the weights evaluated, ± their standard deviation over episodes)
    against env steps. None if the run has neither yet."""
    run_dir = Path(run_dir)
    training = [r for r in read_table(run_dir / "metrics.csv") if "episode_return_mean" in r]
    evaluations = sorted(
        (r for r in read_table(run_dir / "evaluations.csv") if "eval_return_mean" in r),
        key=lambda r: r["steps"],
    )
    lines = []
    if training:
        lines.append(
            Line(
                "training episodes (stochastic)",
                np.array([r["steps"] for r in training]),
                np.array([r["episode_return_mean"] for r in training]),
                alpha=0.7,
            )
        )
    if evaluations:
        means = np.array([r["eval_return_mean"] for r in evaluations])
        spread = np.array([r.get("eval_return_std", 0.0) for r in evaluations])
        lines.append(
            Line(
                "evaluation (deterministic)",
                np.array([r["steps"] for r in evaluations]),
                means,
                means - spread,
                means + spread,
            )
        )
    if not lines:
        return None
    shaded = "shaded: ± std over the evaluation episodes" if evaluations else None
    return draw(
        lines, run_dir / "curve.png", X_LABELS["steps"], "episode return", title, True, legend_title=shaded
    )


def draw(
    lines: Sequence[Line],
    path: Path,
    xlabel: str,
    ylabel: str,
    title: str,
    x_is_steps: bool,
    legend_title: str | None = None,
) -> Path:
    """Draw ``lines`` (each with its band) into ``path``, written atomically; returns ``path``.

    matplotlib's object interface, without pyplot: no window, and the caller's backend (a notebook's)
    is left as it was."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    figure = Figure(figsize=(8, 4.8), dpi=120, layout="constrained")
    axis = figure.add_subplot()
    for index, line in enumerate(lines):
        color = f"C{index % 10}"
        axis.plot(
            line.x,
            line.y,
            color=color,
            linewidth=2,
            alpha=line.alpha,
            marker="o" if len(line.x) == 1 else None,  # a line of one point draws nothing
            label=line.label,
        )
        if line.low is not None and line.high is not None:
            axis.fill_between(line.x, line.low, line.high, color=color, alpha=0.2, linewidth=0)
    lowest = min((float(np.min(line.x)) for line in lines if len(line.x)), default=0.0)
    if lowest >= 0:
        axis.set_xlim(left=0)
    axis.xaxis.set_major_formatter(FuncFormatter(si_number if x_is_steps else plain_number))
    axis.yaxis.set_major_formatter(FuncFormatter(plain_number))
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="best", title=legend_title, title_fontsize="small", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as file:
        figure.savefig(file, format=path.suffix.lstrip(".").lower() or "png")
    return path


def si_number(value: float, position: int | None = None) -> str:
    """A tick of env steps: 0, 500, 20k, 1.5M, 2G."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def plain_number(value: float, position: int | None = None) -> str:
    """A tick of seconds or returns, with thousands separators: -1,200, 0.5, 36,000."""
    return f"{value:,.6g}" if abs(value) < 1e6 else f"{value:,.0f}"


# -- reading the runs ---------------------------------------------------------------------------------
def _check_choice(name: str, value: str, choices: Iterable[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} = {value!r} is not one of {', '.join(choices)}.")


def _read_config(path: Path, name: str = "config.yaml") -> dict[str, Any]:
    config = load_yaml(path / name)
    if not isinstance(config, dict):
        raise ConfigError(f"{path / name} is not a mapping of settings.")
    return config


def _tables(path: Path) -> dict[str, list[dict[str, float]]]:
    return {name: read_table(path / name) for name in ("evaluations.csv", "metrics.csv")}


def _columns(rows: list[dict[str, float]]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def _default_metric(tables: dict[Path, dict[str, list[dict[str, float]]]]) -> str:
    for metric in DEFAULT_METRICS:
        if all(metric in _all_columns(run) for run in tables.values()):
            return metric
    empty = [str(path) for path, run in tables.items() if not _all_columns(run)]
    if empty:
        raise ConfigError(
            f"nothing to plot of {', '.join(empty)}: no rows in evaluations.csv nor metrics.csv yet (a run "
            "writes them as it trains). Leave it out, or plot it once it has trained a while."
        )
    first, run = next(iter(tables.items()))
    raise ConfigError(
        f"the runs do not all have {' or '.join(DEFAULT_METRICS)}: name the metric to plot with --metric "
        f"(metric= in Python). Columns of {first}: {', '.join(_all_columns(run))}."
    )


def _all_columns(run: dict[str, list[dict[str, float]]]) -> list[str]:
    return list(dict.fromkeys(column for rows in run.values() for column in _columns(rows)))


def _series(
    path: Path, tables: dict[str, list[dict[str, float]]], metric: str, x_column: str
) -> tuple[np.ndarray, np.ndarray]:
    """The run's (x, metric) points from the table that has the metric, sorted by x, one per x (the last)."""
    name = next((name for name, rows in tables.items() if metric in _columns(rows)), None)
    if name is None:
        available = _all_columns(tables)
        close = difflib.get_close_matches(metric, available, n=1)
        raise ConfigError(
            f"metric {metric!r} is not a column of {path}/evaluations.csv nor metrics.csv"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f". Columns: {', '.join(available) or 'none (no rows yet)'}."
        )
    points = {row[x_column]: row[metric] for row in tables[name] if x_column in row and metric in row}
    if not points:
        raise ConfigError(f"{path}/{name} has no row with both {x_column!r} and {metric!r}.")
    xs = np.array(sorted(points), dtype=float)
    return xs, np.array([points[value] for value in xs], dtype=float)


def _setting(config: dict[str, Any], key: str, path: Path) -> Any:
    """The value of setting ``key`` in a run's config: top level, under hyperparameters, or a dotted
    path (``hyperparameters.learning_rate``)."""
    hyperparameters = config.get("hyperparameters")
    hyperparameters = hyperparameters if isinstance(hyperparameters, dict) else {}
    if key in config:
        return _hashable(config[key])
    if key in hyperparameters:
        return _hashable(hyperparameters[key])
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            break
        value = value[part]
    else:
        return _hashable(value)
    if key in SETTING_DEFAULTS:
        return SETTING_DEFAULTS[key]
    names = [*config, *hyperparameters]
    close = difflib.get_close_matches(key, names, n=1)
    raise ConfigError(
        f"cannot group by {key!r}: {path / 'config.yaml'} has no setting {key!r} (neither at the top level "
        "nor under hyperparameters)"
        + (f"; did you mean {close[0]!r}?" if close else ".")
        + f" Settings: {', '.join(k for k in config if k != 'hyperparameters')}; hyperparameters: "
        f"{', '.join(hyperparameters) or 'none'}."
    )


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    return value


def _order(value: Any) -> tuple[int, Any]:
    """Groups in order: numbers by value (learning rates ascending), then everything else as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _group_name(group_by: str, value: Any) -> str:
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return shown if group_by in ("algo", "env", "library") else f"{group_by}={shown}"


def _aggregate(
    name: str,
    runs: list[Path],
    series: dict[Path, tuple[np.ndarray, np.ndarray]],
    interval: str,
    span: str,
    x: str,
) -> GroupCurve:
    starts = [series[run][0][0] for run in runs]
    ends = [series[run][0][-1] for run in runs]
    start = max(starts)
    end = min(ends) if span == "common" else max(ends)
    if start > end:
        shortest = runs[int(np.argmin(ends))]
        latest = runs[int(np.argmax(starts))]
        raise ConfigError(
            f"the runs of group {name} have no {x} in common: {shortest} ends at {min(ends):,g} before "
            f"{latest} starts at {start:,g}. Plot them with span='longest' (--span longest), or apart."
        )
    grid = np.unique(np.concatenate([series[run][0] for run in runs] + [np.array([start, end])]))
    grid = grid[(grid >= start) & (grid <= end)]
    if len(grid) > MAX_POINTS:
        grid = np.linspace(start, end, MAX_POINTS)
    # np.interp holds a run's last value beyond its end (span "longest"); the grid starts where all have data
    values = np.stack([np.interp(grid, *series[run]) for run in runs])
    mean = values.mean(axis=0)
    low = high = None
    if interval == "minmax":
        low, high = values.min(axis=0), values.max(axis=0)
    elif interval == "stderr" and len(runs) > 1:
        error = values.std(axis=0, ddof=1) / math.sqrt(len(runs))
        low, high = mean - error, mean + error
    return GroupCurve(name, runs, grid, mean, low, high, values)


def _default_title(result: Curves) -> str:
    """``PPO on CartPole-v1: evaluation return (deterministic) by library``: the algorithm and env all the
    runs share (unless they are what the runs are grouped by), the metric, the grouping."""
    subject = []
    for key in ("algo", "env"):
        values = {config.get(key) for config in result.configs.values()}
        if key != result.group_by and len(values) == 1 and None not in values:
            value = str(values.pop())
            subject.append(value.upper() if key == "algo" else value)
    what = METRIC_LABELS.get(result.metric, result.metric)
    grouped = f"{what} by {result.group_by}"
    return f"{' on '.join(subject)}: {grouped}" if subject else grouped
