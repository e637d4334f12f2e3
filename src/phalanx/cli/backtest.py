"""``phalanx backtest RUN_DIR``: an out-of-sample backtest of a stock trading agent, printed as a table
of metrics against buy-and-hold and the index, and written to a new folder of the run.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phalanx.backtesting import METRIC_LABELS, STRATEGY_LABELS, backtest, format_metric
from phalanx.finance.metrics import METRIC_NAMES


def cmd_backtest(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx backtest",
        description="Backtest a stock trading agent out of sample (deterministic policy, one episode "
        "from the initial cash) against equal-weight buy-and-hold and the index; writes a new folder "
        "RUN_DIR/backtest/FIRST_LAST/ (equity.png, equity.csv, trades.csv, metrics.json; FIRST_LAST_2/ "
        "and so on when the period was backtested before).",
    )
    parser.add_argument("run_dir")
    parser.add_argument("--start", default=None, help="first date (default: the env's test period)")
    parser.add_argument("--end", default=None, help="last date, inclusive (default: the end of the data)")
    parser.add_argument("--checkpoint", default="best", help="best (default), latest, or a checkpoint path")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    result = backtest(args.run_dir, args.start, args.end, checkpoint=args.checkpoint, device=args.device)
    table = Table(title=f"backtest of {args.run_dir}: {result.period[0]}..{result.period[1]}")
    table.add_column("metric")
    for strategy in result.metrics:
        table.add_column(STRATEGY_LABELS.get(strategy, strategy), justify="right")
    for metric in METRIC_NAMES:
        table.add_row(
            METRIC_LABELS[metric], *(format_metric(metric, result.metrics[s][metric]) for s in result.metrics)
        )
    out = Console()
    out.print(table)
    for note in result.notes:
        out.print(escape(note), highlight=False)
    out.print(f"written: {result.out_dir}", highlight=False, soft_wrap=True)  # a new folder, path whole
    return 0
