"""Market data: load price tables from CSV or Parquet, align them on one calendar, split by date.

Two layouts are read, at any bar frequency (daily to minute bars):

- **long**: one row per (time, ticker) with columns ``date`` (or ``datetime``/``time``/``timestamp``),
  ``ticker`` (or ``symbol``/``tic``), ``close`` (or ``adj_close``) and optionally ``open``, ``high``,
  ``low``, ``volume``. Column names are case-insensitive.
- **wide**: a time column and one column of close prices per ticker (the vendored S&P 500 set).

Close-only data is accepted: ``open``, ``high`` and ``low`` default to the close, and ``volume`` is
``None`` (indicators that need volume read zeros). Every ticker is aligned on the union of all bar
times; a bar a ticker lacks is *missing* and is handled explicitly by ``missing``:

- ``"ffill"`` (default): carry the last close forward for at most ``fill_limit`` consecutive bars
  (open = high = low = that close, volume 0); bars still missing for any ticker (before a ticker's
  first bar, or gaps longer than the limit) are dropped;
- ``"drop"``: drop every bar where any ticker is missing;
- ``"raise"``: refuse data with missing bars.

Counts per ticker are logged (logger ``phalanx.finance``, level INFO) and kept in
:attr:`MarketData.missing`. Bad input raises :class:`~phalanx.errors.DataError` naming the file, the
ticker and the date.

Loading is dtype-efficient: files are read with pyarrow (the CSV reader is multi-threaded, Parquet
reads only the needed columns), tickers are dictionary-encoded (categorical), prices are float32, and
the alignment scatters rows straight into ``(bars, tickers)`` arrays (no pandas pivot).
``benchmarks/market_data_loading.py`` measures 100 tickers x 5 years of minute bars.

Where each part lives (every name is importable from here too): :mod:`phalanx.finance.market_data`
(:class:`MarketData`, missing bars, :func:`align_to_dates`), :mod:`phalanx.finance.readers` (reading
files and the two layouts), :mod:`phalanx.finance.synthetic` (:func:`synthetic_market`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phalanx.errors import DataError
from phalanx.finance.market_data import MarketData, align_to_dates, handle_missing
from phalanx.finance.readers import CLOSE_COLUMNS as CLOSE_COLUMNS
from phalanx.finance.readers import OHL_COLUMNS as OHL_COLUMNS
from phalanx.finance.readers import (
    TICKER_COLUMNS,
    TIME_COLUMNS,
    find_column,
    load_long,
    load_wide,
    read_source,
)
from phalanx.finance.synthetic import synthetic_market

__all__ = [
    "SP500_INDEX_PATH",
    "SP500_PATH",
    "MarketData",
    "align_to_dates",
    "load_market_data",
    "load_sp500",
    "load_sp500_index",
    "synthetic_market",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
SP500_PATH = DATA_DIR / "sp500_dataset.csv.gz"
"""Daily adjusted closes of 20 S&P 500 stocks, 1990-01-02 to 2022-12-28 (skfolio, BSD-3)."""
SP500_INDEX_PATH = DATA_DIR / "sp500_index.csv.gz"
"""Daily S&P 500 index level over the same dates (skfolio, BSD-3)."""

MISSING_POLICIES = ("ffill", "drop", "raise")


def load_market_data(
    source: str | Path | Any,
    *,
    tickers: list[str] | None = None,
    start: Any = None,
    end: Any = None,
    missing: str = "ffill",
    fill_limit: int = 5,
) -> MarketData:
    """Load long or wide price data from a CSV/Parquet file or DataFrame, aligned on one calendar.

    ``tickers`` selects (and orders) columns; ``start``/``end`` select bars (inclusive; a date alone
    includes its whole day); ``missing`` and ``fill_limit`` handle missing bars (see the module
    docstring). Raises :class:`~phalanx.errors.DataError` for empty or malformed data, unknown tickers,
    duplicate bars, non-positive or missing prices and periods without bars.
    """
    if missing not in MISSING_POLICIES:
        raise DataError(f"missing = {missing!r} is invalid: expected one of {MISSING_POLICIES}.")
    if isinstance(fill_limit, bool) or not isinstance(fill_limit, int) or fill_limit < 0:
        raise DataError(f"fill_limit = {fill_limit!r} is invalid: expected an integer >= 0 (bars).")
    table, where = read_source(source)
    names = {str(name).strip().lower(): name for name in table.column_names}
    time_name = find_column(names, TIME_COLUMNS)
    if time_name is None:
        raise DataError(
            f"{where}: no date column; expected one named {' or '.join(TIME_COLUMNS)} (any case), found "
            f"columns {table.column_names}."
        )
    if table.num_rows == 0:
        raise DataError(
            f"{where}: the table has columns {table.column_names} but no rows. It holds no prices."
        )
    ticker_name = find_column(names, TICKER_COLUMNS)
    if ticker_name is not None:
        holder = [table]
        del table  # load_long owns the table from here and frees its columns one by one
        data = load_long(holder, where, names, time_name, ticker_name, tickers, start, end)
    else:
        data = load_wide(table, where, time_name, tickers, start, end)
    return handle_missing(data, missing, fill_limit)


# -- the vendored data set --------------------------------------------------------------------------
def load_sp500(start: Any = None, end: Any = None, tickers: list[str] | None = None) -> MarketData:
    """The vendored daily adjusted closes of 20 S&P 500 stocks, 1990-01-02 to 2022-12-28 (close-only)."""
    return load_market_data(SP500_PATH, tickers=tickers, start=start, end=end)


def load_sp500_index(start: Any = None, end: Any = None) -> MarketData:
    """The vendored S&P 500 index level (one column, ``SP500``) over the same dates."""
    return load_market_data(SP500_INDEX_PATH, start=start, end=end)
