"""``phalanx plot RUN_OR_GLOB ...``: the learning curves of runs, grouped by a setting of their config
and drawn as the mean over each group's runs with a shaded interval; a table of the groups' ends.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phalanx.cli.output import console
from phalanx.train.plots import INTERVALS, SPANS, X_COLUMNS, curves, draw_curves


def cmd_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx plot",
        description="Learning curves of runs compared: the runs are grouped by a setting of their "
        "config.yaml, and each group drawn as the mean over its runs (seeds) with a shaded interval, on "
        "x values common to its runs (each run interpolated linearly onto them).",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_OR_GLOB",
        help="run directories, globs of them (quoted: 'runs/CartPole-v1__*'), or population directories",
    )
    parser.add_argument("--x", choices=list(X_COLUMNS), default="steps", help="env steps or wall time (s)")
    parser.add_argument(
        "--group-by",
        default="algo",
        metavar="SETTING",
        help="a setting of config.yaml: algo (default), env, seed, a hyperparameter (learning_rate), or "
        "library (a benchmark's peer runs; phalanx's own runs are 'phalanx')",
    )
    parser.add_argument(
        "--interval",
        choices=list(INTERVALS),
        default="stderr",
        help="shaded interval: standard error of the mean (default), min-max over the runs, or none",
    )
    parser.add_argument(
        "--metric",
        default=None,
        metavar="COLUMN",
        help="a column of evaluations.csv or metrics.csv (default: eval_return_mean if every run has "
        "evaluations, else episode_return_mean)",
    )
    parser.add_argument(
        "--span",
        choices=list(SPANS),
        default="common",
        help="common (default): each group's curve covers the x range all its runs have; longest: up to "
        "its longest run, runs that ended earlier holding their last value (runs stopped by --stop-return)",
    )
    parser.add_argument(
        "--output", default="plot.png", help="the figure: .png (default plot.png), .pdf, .svg"
    )
    parser.add_argument("--title", default=None, help="the figure's title (default: the env, metric, groups)")
    args = parser.parse_args(argv)
    result = curves(
        args.runs,
        x=args.x,
        group_by=args.group_by,
        interval=args.interval,
        metric=args.metric,
        span=args.span,
    )
    path = draw_curves(result, args.output, args.title)
    table = Table(title=f"{result.metric} against {result.x}, by {result.group_by}")
    table.add_column("group", overflow="fold", min_width=min(24, max(len(g.name) for g in result.groups)))
    for column in ("runs", "x range", "final mean", "interval at the end"):
        table.add_column(column, justify="right")
    for group in result.groups:
        spread = (
            "-"
            if group.low is None or group.high is None
            else f"{group.low[-1]:,.4g} .. {group.high[-1]:,.4g}"
        )
        table.add_row(
            escape(group.name),
            str(group.n),
            f"{group.x[0]:,.0f} .. {group.x[-1]:,.0f}"
            if result.x == "steps"
            else f"{group.x[0]:,.1f} .. {group.x[-1]:,.1f} s",
            f"{group.mean[-1]:,.4g}",
            spread,
        )
    Console().print(table)
    console.print(f"written: {path}", highlight=False, soft_wrap=True)
    return 0
