"""Synthetic market data: seeded OHLCV bars of correlated geometric Brownian motions.

:func:`synthetic_market` builds a :class:`~phalanx.finance.market_data.MarketData` of any size and bar
frequency (business days, or 09:30-16:00 sessions of intraday bars), optionally with missing bars, for
tests and benchmarks that need no data file.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from phalanx.errors import DataError
from phalanx.finance.market_data import MarketData, import_pandas


def _calendar(start: Any, num_bars: int, freq: str) -> tuple[np.ndarray, float]:
    """``num_bars`` bar times from ``start`` and the bars per year: business days for daily bars,
    09:30-16:00 sessions of business days for intraday bars."""
    pd = import_pandas()
    try:
        step = pd.Timedelta(pd.tseries.frequencies.to_offset(freq))
    except (ValueError, TypeError):
        raise DataError(
            f"freq = {freq!r} is not a bar frequency; use e.g. '1D', '1h', '5min', '1min'."
        ) from None
    if step >= pd.Timedelta("1D"):
        days = pd.bdate_range(start, periods=num_bars)
        return days.values.astype("datetime64[ns]"), 252.0
    session = pd.Timedelta("390min")
    per_day = int(session // step)
    if per_day < 1 or session % step:
        raise DataError(f"freq = {freq!r} must divide a 390-minute session (e.g. '1min', '5min', '30min').")
    days = pd.bdate_range(start, periods=math.ceil(num_bars / per_day)).values.astype("datetime64[ns]")
    offsets = (np.timedelta64(570, "m") + np.arange(per_day) * step.to_timedelta64()).astype(
        "timedelta64[ns]"
    )
    times = (days[:, None] + offsets[None, :]).reshape(-1)[:num_bars]
    return times, 252.0 * per_day


def synthetic_market(
    num_tickers: int = 5,
    num_bars: int = 500,
    *,
    freq: str = "1D",
    start: str = "2000-01-03",
    seed: int = 0,
    drift: float = 0.08,
    volatility: tuple[float, float] = (0.15, 0.45),
    correlation: float = 0.3,
    missing_fraction: float = 0.0,
) -> MarketData:
    """Seeded OHLCV bars of correlated geometric Brownian motions, for tests and benchmarks.

    Log returns follow a one-factor model: ``z = sqrt(rho) * market + sqrt(1 - rho) * idiosyncratic``,
    annual drift ``drift`` and per-ticker annual volatility drawn uniformly from ``volatility``.
    Opens gap from the previous close, highs and lows bracket open and close, and volume is lognormal
    and grows with the size of the move. ``missing_fraction`` of the (bar, ticker) cells are set to
    NaN (absent bars; :meth:`MarketData.to_frame` leaves them out). Tickers are ``T000``, ``T001``...
    """
    if num_tickers < 1 or num_bars < 2:
        raise DataError(
            f"synthetic_market needs num_tickers >= 1 and num_bars >= 2, got {num_tickers}, {num_bars}."
        )
    if not 0.0 <= correlation < 1.0:
        raise DataError(f"correlation = {correlation} must be in [0, 1).")
    dates, per_year = _calendar(start, num_bars, freq)
    rng = np.random.default_rng(seed)
    shape = (num_bars, num_tickers)
    sigma = rng.uniform(*volatility, size=num_tickers).astype(np.float32)
    dt = np.float32(1.0 / per_year)
    bar_sigma = sigma * np.sqrt(dt)  # (S,)
    z = rng.standard_normal(shape, dtype=np.float32)
    z *= np.float32(math.sqrt(1.0 - correlation))
    z += np.float32(math.sqrt(correlation)) * rng.standard_normal((num_bars, 1), dtype=np.float32)
    log_returns = z * bar_sigma + (np.float32(drift) - 0.5 * sigma**2) * dt  # (T, S)
    log_returns[0] = 0.0
    log_close = np.cumsum(log_returns, axis=0, dtype=np.float64)
    log_close += np.log(rng.uniform(20.0, 200.0, size=num_tickers))
    close = np.exp(log_close).astype(np.float32)
    del log_close
    gap = np.exp(0.2 * bar_sigma * rng.standard_normal(shape, dtype=np.float32))
    open_ = np.empty_like(close)
    open_[0] = close[0]
    np.multiply(close[:-1], gap[1:], out=open_[1:])
    del gap
    spread = np.abs(rng.standard_normal(shape, dtype=np.float32)) * (0.5 * bar_sigma)
    high = np.maximum(open_, close) * np.exp(spread)
    spread = np.abs(rng.standard_normal(shape, dtype=np.float32)) * (0.5 * bar_sigma)
    low = np.minimum(open_, close) * np.exp(-spread)
    del spread
    base = np.float32(1e6 * 252.0 / per_year)
    volume = base * np.exp(0.5 * rng.standard_normal(shape, dtype=np.float32)) * (1.0 + np.abs(z))
    del z
    volume = np.round(volume).astype(np.float32)
    if missing_fraction > 0:
        absent = rng.random(shape, dtype=np.float32) < missing_fraction
        absent[0] = False  # every ticker has a first bar
        for array in (open_, high, low, close):
            array[absent] = np.nan
        volume[absent] = np.nan
    return MarketData(
        dates=dates,
        tickers=[f"T{i:03d}" for i in range(num_tickers)],
        close=close,
        open=open_,
        high=high.astype(np.float32, copy=False),
        low=low.astype(np.float32, copy=False),
        volume=volume,
        source=f"<synthetic seed={seed}>",
    )
