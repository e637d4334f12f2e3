"""Performance metrics of an equity curve: pure functions of a sequence of portfolio values.

``equity`` is the portfolio value at each bar (at least two bars, first value > 0), sampled
``periods_per_year`` times a year (252 for daily bars). Returns are simple returns between
consecutive bars. Conventions:

- ``cumulative_return = equity[-1] / equity[0] - 1``;
- ``annualized_return = (equity[-1] / equity[0]) ** (periods_per_year / n) - 1`` over ``n`` bar
  intervals (compound annual growth rate; -1 if the value reached 0);
- ``annualized_volatility = std(returns, ddof=1) * sqrt(periods_per_year)``;
- ``sharpe_ratio = mean(returns - rf / periods_per_year) / std(returns, ddof=1) * sqrt(periods_per_year)``
  (``risk_free``: an annual rate, 0 by default; NaN when the returns do not vary);
- ``max_drawdown = max_t (1 - equity[t] / max_{s <= t} equity[s])``, a positive fraction (0.25 is a
  25% fall from the running peak);
- ``calmar_ratio = annualized_return / max_drawdown`` (NaN without a drawdown).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from phalanx.errors import DataError

__all__ = [
    "METRIC_NAMES",
    "annualized_return",
    "annualized_volatility",
    "calmar_ratio",
    "cumulative_return",
    "max_drawdown",
    "performance_summary",
    "sharpe_ratio",
    "simple_returns",
]

METRIC_NAMES = (
    "cumulative_return",
    "annualized_return",
    "sharpe_ratio",
    "annualized_volatility",
    "max_drawdown",
    "calmar_ratio",
)


def _equity(equity: Sequence[float] | Any) -> np.ndarray:
    values = np.asarray(equity, dtype=np.float64).reshape(-1)
    if values.size < 2:
        raise DataError(f"an equity curve needs at least 2 values, got {values.size}.")
    if not np.isfinite(values).all():
        index = int(np.flatnonzero(~np.isfinite(values))[0])
        raise DataError(f"the equity curve has a non-finite value {values[index]} at index {index}.")
    if values[0] <= 0:
        raise DataError(f"the equity curve must start above 0, got {values[0]}.")
    if (values < 0).any():
        index = int(np.flatnonzero(values < 0)[0])
        raise DataError(f"the equity curve is negative ({values[index]}) at index {index}.")
    return values


def _check_periods(periods_per_year: float) -> float:
    if not periods_per_year > 0:
        raise DataError(f"periods_per_year must be > 0 (252 for daily bars), got {periods_per_year}.")
    return float(periods_per_year)


def simple_returns(equity: Sequence[float] | Any) -> np.ndarray:
    """``equity[t] / equity[t-1] - 1`` for t >= 1 (0 after the value has reached 0)."""
    values = _equity(equity)
    previous = values[:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        returns = np.where(previous > 0, values[1:] / np.where(previous > 0, previous, 1.0) - 1.0, 0.0)
    return returns


def cumulative_return(equity: Sequence[float] | Any) -> float:
    values = _equity(equity)
    return float(values[-1] / values[0] - 1.0)


def annualized_return(equity: Sequence[float] | Any, periods_per_year: float = 252.0) -> float:
    values = _equity(equity)
    growth = values[-1] / values[0]
    if growth <= 0:
        return -1.0
    return float(growth ** (_check_periods(periods_per_year) / (values.size - 1)) - 1.0)


def annualized_volatility(equity: Sequence[float] | Any, periods_per_year: float = 252.0) -> float:
    returns = simple_returns(equity)
    if returns.size < 2:
        return float("nan")
    return float(returns.std(ddof=1) * math.sqrt(_check_periods(periods_per_year)))


def sharpe_ratio(
    equity: Sequence[float] | Any, periods_per_year: float = 252.0, risk_free: float = 0.0
) -> float:
    periods = _check_periods(periods_per_year)
    excess = simple_returns(equity) - risk_free / periods
    if excess.size < 2:
        return float("nan")
    spread = excess.std(ddof=1)
    if not spread > 1e-15:
        return float("nan")
    return float(excess.mean() / spread * math.sqrt(periods))


def max_drawdown(equity: Sequence[float] | Any) -> float:
    values = _equity(equity)
    peaks = np.maximum.accumulate(values)
    return float((1.0 - values / peaks).max())


def calmar_ratio(equity: Sequence[float] | Any, periods_per_year: float = 252.0) -> float:
    drawdown = max_drawdown(equity)
    if drawdown <= 0:
        return float("nan")
    return float(annualized_return(equity, periods_per_year) / drawdown)


def performance_summary(
    equity: Sequence[float] | Any, periods_per_year: float = 252.0, risk_free: float = 0.0
) -> dict[str, float]:
    """The six metrics of :data:`METRIC_NAMES` for one equity curve."""
    return {
        "cumulative_return": cumulative_return(equity),
        "annualized_return": annualized_return(equity, periods_per_year),
        "sharpe_ratio": sharpe_ratio(equity, periods_per_year, risk_free),
        "annualized_volatility": annualized_volatility(equity, periods_per_year),
        "max_drawdown": max_drawdown(equity),
        "calmar_ratio": calmar_ratio(equity, periods_per_year),
    }
