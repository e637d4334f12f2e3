"""Finance: market data, technical indicators and performance metrics (below ``phalanx.envs``).

Needs the ``finance`` extra (pandas, pyarrow): ``pip install 'phalanx[finance]'``. Names are imported
lazily so that ``import phalanx.finance`` stays light.

- :mod:`phalanx.finance.data`: :func:`load_market_data`, :class:`MarketData`, :func:`load_sp500`,
  :func:`load_sp500_index` (the vendored skfolio data set, BSD-3), :func:`synthetic_market`;
- :mod:`phalanx.finance.indicators`: technical indicators as batched torch operations;
- :mod:`phalanx.finance.metrics`: cumulative and annualised return, Sharpe ratio, volatility, maximum
  drawdown, Calmar ratio (pure functions of an equity curve).

The environment built on them is :class:`phalanx.envs.trading.StockTradingVecEnv` (id
``StockTrading-v0``); :func:`phalanx.backtesting.backtest` runs a trained agent on it out of sample.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MarketData": "phalanx.finance.data",
    "load_market_data": "phalanx.finance.data",
    "load_sp500": "phalanx.finance.data",
    "load_sp500_index": "phalanx.finance.data",
    "synthetic_market": "phalanx.finance.data",
    "SP500_PATH": "phalanx.finance.data",
    "SP500_INDEX_PATH": "phalanx.finance.data",
    "performance_summary": "phalanx.finance.metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'phalanx.finance' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
