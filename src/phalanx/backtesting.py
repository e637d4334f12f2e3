"""Out-of-sample backtest of a trained trading agent against equal-weight buy-and-hold and the index.

:func:`backtest` rebuilds the run's environment, turns it into one deterministic episode over the
test period (:meth:`~phalanx.envs.trading.StockTradingVecEnv.backtest_env`: same data, costs and
settings, starting with the initial cash at the period's first bar) and runs the agent's
deterministic policy through it. The benchmarks start with the same cash on the same bar:

- **buy-and-hold**: equal value in every stock, bought at the first close (paying the same
  proportional transaction cost), never rebalanced;
- **index**: the benchmark index of the data set (the S&P 500 for the vendored data), scaled to the
  initial cash, without costs.

It reports the six metrics of :mod:`phalanx.finance.metrics` for each, and writes
``equity.png``, ``equity.csv``, ``trades.csv`` and ``metrics.json`` into a new folder per backtest,
``RUN_DIR/backtest/<first bar>_<last bar>/`` (``..._2/`` and so on when the period was backtested
before: an earlier backtest is never written over).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from phalanx.agent import load_agent
from phalanx.envs.registry import make_env
from phalanx.envs.trading import StockTradingVecEnv
from phalanx.errors import CheckpointError, EnvError
from phalanx.files import atomic_write, write_text_atomic
from phalanx.finance.metrics import METRIC_NAMES, performance_summary
from phalanx.train.run_dir import read_run_config

__all__ = ["BacktestResult", "backtest"]

STRATEGY_LABELS = {"agent": "agent", "buy_and_hold": "buy & hold (equal weight)", "index": "index"}
METRIC_LABELS = {
    "cumulative_return": "cumulative return",
    "annualized_return": "annualised return",
    "sharpe_ratio": "Sharpe ratio",
    "annualized_volatility": "annualised volatility",
    "max_drawdown": "max drawdown",
    "calmar_ratio": "Calmar ratio",
}
PERCENT_METRICS = ("cumulative_return", "annualized_return", "annualized_volatility", "max_drawdown")


@dataclass
class BacktestResult:
    """What :func:`backtest` measured; ``equity`` and ``metrics`` are keyed by strategy."""

    run_dir: Path
    period: tuple[str, str]
    training_period: tuple[str, str]
    periods_per_year: float
    dates: np.ndarray
    """(L + 1,) datetime64: the period's bars; equity[k] is the value at the close of dates[k]."""
    equity: dict[str, np.ndarray]
    metrics: dict[str, dict[str, float]]
    num_trades: int
    total_costs: float
    out_dir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def in_sample(self) -> bool:
        """True when the backtest period overlaps the period the agent was trained on."""
        return self.period[0] <= self.training_period[1] and self.training_period[0] <= self.period[1]

    def format(self) -> str:
        """The metrics as a plain-text table, one column per strategy."""
        strategies = list(self.metrics)
        header = ["metric", *(STRATEGY_LABELS.get(s, s) for s in strategies)]
        rows = [header]
        for metric in METRIC_NAMES:
            rows.append(
                [METRIC_LABELS[metric], *(format_metric(metric, self.metrics[s][metric]) for s in strategies)]
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [
            "  ".join(
                cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
            )
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        title = f"backtest {self.period[0]}..{self.period[1]} ({len(self.dates) - 1} bars)"
        return "\n".join([title, *lines, *self.notes])


def format_metric(metric: str, value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.2f}%" if metric in PERCENT_METRICS else f"{value:.3f}"


def _trading_env(env_id: str, device: str) -> Any:
    env = make_env(env_id, num_envs=1, device=device)
    while not isinstance(env, StockTradingVecEnv) and hasattr(env, "env"):
        env = env.env
    if not isinstance(env, StockTradingVecEnv):
        raise EnvError(
            f"backtest needs a stock trading run: env {env_id!r} builds a {type(env).__name__}, not a "
            "StockTradingVecEnv. Backtest runs trained on StockTrading-v0 (or an id registered with a "
            "StockTradingVecEnv factory)."
        )
    return env


def backtest(
    run_dir: str | Path,
    start: Any = None,
    end: Any = None,
    *,
    checkpoint: str = "best",
    device: str = "cpu",
    write: bool = True,
) -> BacktestResult:
    """Backtest the run's agent (deterministic policy) over ``start..end`` (default: the env's test
    period, e.g. 2018-2022 for StockTrading-v0) against equal-weight buy-and-hold and the index.

    Writes ``equity.png``, ``equity.csv``, ``trades.csv`` and ``metrics.json`` to a new folder, the
    result's ``out_dir``: ``RUN_DIR/backtest/<first bar>_<last bar>/``, suffixed ``_2``, ``_3``, ... if
    the period was backtested before; unless ``write`` is False. ``checkpoint`` is "best" (chosen by
    the training-period evaluation), "latest", or a checkpoint path.
    """
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    train_env = _trading_env(config.env, device)
    env = train_env.backtest_env(start, end)
    agent = load_agent(run_dir, checkpoint, device)
    expected = tuple(agent.observation_space.shape)
    if tuple(env.single_observation_space.shape) != expected:
        raise CheckpointError(
            f"the agent of {str(run_dir)!r} observes {expected} values, but {config.env!r} now builds "
            f"observations of shape {tuple(env.single_observation_space.shape)} (different tickers or "
            "settings?). Backtest with the env the agent was trained on."
        )
    steps, first = env.episode_length, env.first_bar
    prices = env.prices[first : first + steps + 1].double().cpu().numpy()  # (L + 1, S)
    equity, trades, costs, ruined_at = _trade(env, agent)
    curves, notes = _benchmark_curves(env, prices, equity)
    per_year = env.periods_per_year
    result = BacktestResult(
        run_dir=run_dir,
        period=(env.market.date(first), env.market.date(first + steps)),
        training_period=train_env.period,
        periods_per_year=per_year,
        dates=env.dates[first : first + steps + 1],
        equity=curves,
        metrics={name: performance_summary(curve, per_year) for name, curve in curves.items()},
        num_trades=int((np.abs(trades) * prices[:-1] > 1e-6).sum()),
        total_costs=float(costs.sum()),
        notes=notes,
    )
    if ruined_at is not None:
        notes.append(f"agent: the portfolio value reached 0 after {ruined_at} bars; it stays 0 afterwards.")
    if result.in_sample:
        notes.append(
            f"warning: the period overlaps the training period {train_env.period[0]}..{train_env.period[1]}: "
            "this is an in-sample result."
        )
    notes.append(
        f"agent: {result.num_trades} trades, transaction costs {result.total_costs:,.0f} "
        f"({100 * result.total_costs / env.initial_cash:.2f}% of the initial cash); checkpoint "
        f"{checkpoint!r} after {agent.steps:,} training steps."
    )
    if write:
        result.out_dir = _write(result, env, trades, prices, env.transaction_cost)
    return result


def _trade(env: Any, agent: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int | None]:
    """The agent's deterministic episode over the backtest env: the portfolio value at every bar, the
    shares traded and the costs paid at every step, and the bar at which the value reached 0 (or None)."""
    steps = env.episode_length
    equity = np.empty(steps + 1)
    equity[0] = env.initial_cash
    trades = np.zeros((steps, len(env.tickers)))
    costs = np.zeros(steps)
    obs, _ = env.reset(seed=0)
    with torch.no_grad():
        for k in range(steps):
            obs, _, terminated, _, _ = env.step(agent.act(obs))
            equity[k + 1] = float(env.last_value[0])
            trades[k] = env.last_trades[0].double().cpu().numpy()
            costs[k] = float(env.last_costs[0])
            if bool(terminated[0]):
                equity[k + 1 :] = 0.0
                return equity, trades, costs, k + 1
    return equity, trades, costs, None


def _benchmark_curves(env: Any, prices: np.ndarray, equity: np.ndarray) -> tuple[dict, list[str]]:
    """The agent's curve with equal-weight buy-and-hold and the index beside it (when the index has a
    value on every bar), all starting from the same cash; and the notes on what is not reported."""
    cash, cost = env.initial_cash, env.transaction_cost
    shares = (cash / len(env.tickers)) / (prices[0] * (1.0 + cost))  # (S,) equal value in each stock
    curves = {"agent": equity, "buy_and_hold": np.concatenate([[cash], prices[1:] @ shares])}
    notes: list[str] = []
    if env.index_data is not None:
        first = env.first_bar
        index = env.index_data[first : first + env.episode_length + 1]
        if np.isfinite(index).all() and index[0] > 0:
            curves["index"] = cash * index / index[0]
        else:
            notes.append("index: not reported (it has no value on some bars of the period).")
    return curves, notes


def _write(result: BacktestResult, env: Any, trades: np.ndarray, prices: np.ndarray, cost: float) -> Path:
    out = _new_folder(result.run_dir / "backtest", "_".join(result.period))
    day = np.datetime_as_string(result.dates, unit="D" if env.market.daily else "m")
    with atomic_write(out / "equity.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["date", *result.equity])
        for k, date in enumerate(day):
            writer.writerow([date, *(f"{curve[k]:.2f}" for curve in result.equity.values())])
    with atomic_write(out / "trades.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["date", "ticker", "side", "shares", "price", "value", "cost"])
        for k, i in zip(*np.nonzero(np.abs(trades) * prices[:-1] > 1e-6), strict=True):
            shares, price = trades[k, i], prices[k, i]
            value = shares * price
            writer.writerow(
                [
                    day[k],
                    env.tickers[i],
                    "buy" if shares > 0 else "sell",
                    f"{shares:.6f}",
                    f"{price:.4f}",
                    f"{value:.2f}",
                    f"{cost * abs(value):.2f}",
                ]
            )
    payload = {
        "period": list(result.period),
        "training_period": list(result.training_period),
        "in_sample": result.in_sample,
        "periods_per_year": result.periods_per_year,
        "num_trades": result.num_trades,
        "total_costs": result.total_costs,
        "metrics": {
            name: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in values.items()}
            for name, values in result.metrics.items()
        },
        "notes": result.notes,
    }
    write_text_atomic(out / "metrics.json", json.dumps(payload, indent=2) + "\n")
    _plot(result, out / "equity.png")
    return out


def _new_folder(parent: Path, name: str) -> Path:
    """A new folder ``parent/name`` (``:`` of intraday times made ``-``), or ``name_2``, ``name_3``, ...
    when that exists: a backtest never writes over an earlier one."""
    name = re.sub(r"[^0-9A-Za-z_.-]", "-", name)
    parent.mkdir(parents=True, exist_ok=True)
    candidate, suffix = parent / name, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            suffix += 1
            candidate = parent / f"{name}_{suffix}"


def _plot(result: BacktestResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dates = result.dates.astype("datetime64[ms]").astype(object)
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), dpi=110, sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for name, curve in result.equity.items():
        label = f"{STRATEGY_LABELS.get(name, name)} ({100 * result.metrics[name]['cumulative_return']:+.1f}%)"
        top.plot(dates, curve, label=label, linewidth=1.4 if name == "agent" else 1.0)
        peaks = np.maximum.accumulate(curve)
        bottom.plot(dates, -100 * (1 - curve / np.where(peaks > 0, peaks, 1)), linewidth=0.9)
    top.set_ylabel("portfolio value")
    top.set_title(f"out-of-sample backtest {result.period[0]}..{result.period[1]}")
    top.legend(loc="upper left", fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_ylabel("drawdown %")
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    with atomic_write(path, "wb") as file:
        figure.savefig(file, format="png")
    plt.close(figure)
