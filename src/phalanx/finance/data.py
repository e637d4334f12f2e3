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
"""

from __future__ import annotations

import difflib
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.errors import DataError, import_optional

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

logger = logging.getLogger("phalanx.finance")

DATA_DIR = Path(__file__).resolve().parent / "data"
SP500_PATH = DATA_DIR / "sp500_dataset.csv.gz"
"""Daily adjusted closes of 20 S&P 500 stocks, 1990-01-02 to 2022-12-28 (skfolio, BSD-3)."""
SP500_INDEX_PATH = DATA_DIR / "sp500_index.csv.gz"
"""Daily S&P 500 index level over the same dates (skfolio, BSD-3)."""

TIME_COLUMNS = ("date", "datetime", "time", "timestamp")
TICKER_COLUMNS = ("ticker", "symbol", "tic")
CLOSE_COLUMNS = ("close", "adj_close", "adj close", "adjclose")
OHL_COLUMNS = ("open", "high", "low")
MISSING_POLICIES = ("ffill", "drop", "raise")
_NS_PER_DAY = 86_400 * 10**9


def _pandas() -> Any:
    return import_optional(
        "pandas",
        DataError,
        "market data needs pandas and pyarrow, which are not installed. Install them with "
        "pip install 'phalanx[finance]' (pandas>=2, pyarrow>=14).",
    )


def _arrow() -> Any:
    return import_optional(
        "pyarrow",
        DataError,
        "market data needs pyarrow, which is not installed. Install it with pip install "
        "'phalanx[finance]' (pandas>=2, pyarrow>=14).",
    )


# -- dates ------------------------------------------------------------------------------------------
def _format_ns(value: int | np.integer | np.datetime64, daily: bool | None = None) -> str:
    stamp = np.datetime64(int(value), "ns") if not isinstance(value, np.datetime64) else value
    if daily is None:
        daily = int(stamp.astype("datetime64[ns]").astype(np.int64)) % _NS_PER_DAY == 0
    return str(np.datetime_as_string(stamp, unit="D" if daily else "m"))


def _parse_date(value: Any, what: str) -> int:
    """A date-like value as int64 nanoseconds since the epoch."""
    pd = _pandas()
    try:
        stamp = pd.Timestamp(value)
    except (ValueError, TypeError) as error:
        raise DataError(
            f"{what} = {value!r} is not a date ({error}). Use an ISO date such as '2018-01-01' or "
            "'2018-01-02 09:30'."
        ) from None
    if stamp is pd.NaT:
        raise DataError(f"{what} = {value!r} is not a date. Use an ISO date such as '2018-01-01'.")
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    return int(stamp.as_unit("ns").value)


def _parse_end(value: Any, what: str) -> int:
    """An inclusive end as an exclusive bound: a date without a time includes that whole day."""
    ns = _parse_date(value, what)
    has_time = not (isinstance(value, str) and len(value.strip()) <= 10) and ns % _NS_PER_DAY != 0
    return ns + 1 if has_time else ns + _NS_PER_DAY


# -- the container ----------------------------------------------------------------------------------
@dataclass
class MarketData:
    """Prices of ``S`` tickers on a common calendar of ``T`` bars, as ``(T, S)`` float32 arrays."""

    dates: np.ndarray
    """(T,) datetime64[ns], strictly increasing."""
    tickers: list[str]
    """The S tickers, in column order."""
    close: np.ndarray
    """(T, S) float32 closes (adjusted closes for the vendored data set)."""
    open: np.ndarray
    """(T, S) float32; equal to close for close-only data."""
    high: np.ndarray
    """(T, S) float32; equal to close for close-only data."""
    low: np.ndarray
    """(T, S) float32; equal to close for close-only data."""
    volume: np.ndarray | None = None
    """(T, S) float32 traded volume, or None when the data has none."""
    source: str = "<frame>"
    """Where the data came from (a file path), for error messages."""
    close_only: bool = False
    """True when the source had no open/high/low columns."""
    missing: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per ticker with missing bars: {"missing": bars absent, "filled": forward-filled, "dropped": ...}."""

    @property
    def num_bars(self) -> int:
        return int(self.close.shape[0])

    @property
    def num_tickers(self) -> int:
        return len(self.tickers)

    @property
    def daily(self) -> bool:
        """True when every bar time is midnight (daily or coarser bars)."""
        return bool((self.dates.astype(np.int64) % _NS_PER_DAY == 0).all())

    def date(self, index: int) -> str:
        """Bar ``index``'s time as text: ``YYYY-MM-DD`` for daily bars, else ``YYYY-MM-DDTHH:MM``."""
        return _format_ns(self.dates[index], self.daily)

    @property
    def span(self) -> str:
        return f"{self.date(0)}..{self.date(-1)}" if self.num_bars else "(no bars)"

    def __repr__(self) -> str:
        return (
            f"MarketData({self.num_tickers} tickers x {self.num_bars} bars, {self.span}, "
            f"{'close-only' if self.close_only else 'OHLC'}{'' if self.volume is None else ' + volume'}, "
            f"source={self.source!r})"
        )

    def _take(self, rows: slice | np.ndarray, columns: slice | list[int] = slice(None)) -> MarketData:
        close = np.ascontiguousarray(self.close[rows][:, columns])

        def part(array: np.ndarray | None) -> np.ndarray | None:
            if array is None or array is self.close:  # close-only data shares one array
                return None if array is None else close
            return np.ascontiguousarray(array[rows][:, columns])

        tickers = self.tickers[columns] if isinstance(columns, slice) else [self.tickers[i] for i in columns]
        return replace(
            self,
            dates=self.dates[rows],
            tickers=list(tickers),
            close=close,
            open=part(self.open),
            high=part(self.high),
            low=part(self.low),
            volume=part(self.volume),
            missing={t: v for t, v in self.missing.items() if t in tickers},
        )

    def index_range(self, start: Any = None, end: Any = None, what: str = "period") -> tuple[int, int]:
        """``(first, last)`` bar indices with ``start <= date <= end`` (inclusive; a date without a
        time includes its whole day). Raises DataError if no bar is in the period."""
        ints = self.dates.astype(np.int64)
        begin = None if start is None else _parse_date(start, f"{what} start")
        stop = None if end is None else _parse_end(end, f"{what} end")
        if begin is not None and stop is not None and begin >= stop:
            raise DataError(
                f"{self.source}: the {what} {start}..{end} ends before it starts: the start must come before "
                f"the end. Swap them (start {end}, end {start})."
            )
        first = 0 if begin is None else int(np.searchsorted(ints, begin))
        last = len(ints) - 1
        if stop is not None:
            last = int(np.searchsorted(ints, stop, side="left")) - 1
        if first > last or not len(ints):
            raise DataError(
                f"{self.source}: the {what} {start or 'start'}..{end or 'end'} has no bars; the data "
                f"covers {self.span} ({self.num_bars} bars). Choose dates inside that range."
            )
        return first, last

    def select(self, start: Any = None, end: Any = None) -> MarketData:
        """The bars with ``start <= date <= end`` (inclusive; a date alone includes its whole day)."""
        first, last = self.index_range(start, end)
        return self._take(slice(first, last + 1))

    def split(self, date: Any) -> tuple[MarketData, MarketData]:
        """``(train, test)``: the bars before ``date`` and those from ``date`` on; both non-empty."""
        cut = int(np.searchsorted(self.dates.astype(np.int64), _parse_date(date, "split date")))
        if cut == 0 or cut == self.num_bars:
            side = "before" if cut == 0 else "on or after"
            raise DataError(
                f"{self.source}: splitting at {date} leaves no bars {side} it; the data covers {self.span}. "
                "Choose a split date inside that range."
            )
        return self._take(slice(0, cut)), self._take(slice(cut, None))

    def subset(self, tickers: list[str] | tuple[str, ...]) -> MarketData:
        """Only ``tickers``, in that order. Raises DataError naming unknown tickers."""
        columns = [self.tickers.index(t) for t in _check_tickers(tickers, self.tickers, self.source)]
        return self._take(slice(None), columns)

    def to_frame(self, tickers: list[str] | None = None) -> Any:
        """A long pandas DataFrame (date, ticker, open, high, low, close, volume), sorted by ticker then
        date; bars whose close is NaN (missing) are left out."""
        pd = _pandas()
        columns = (
            list(range(self.num_tickers)) if tickers is None else [self.tickers.index(t) for t in tickers]
        )
        names = [self.tickers[c] for c in columns]
        t = self.num_bars
        codes = np.repeat(np.arange(len(columns), dtype=np.int16 if len(columns) < 32_000 else np.int32), t)
        frame = {
            "date": np.tile(self.dates, len(columns)),
            "ticker": pd.Categorical.from_codes(codes, categories=names),
        }
        for name in ("open", "high", "low", "close") if not self.close_only else ("close",):
            frame[name] = np.ascontiguousarray(getattr(self, name)[:, columns].T).reshape(-1)
        if self.volume is not None:
            frame["volume"] = np.ascontiguousarray(self.volume[:, columns].T).reshape(-1)
        df = pd.DataFrame(frame)
        present = ~np.isnan(df["close"].to_numpy())
        return df if present.all() else df[present].reset_index(drop=True)


# -- reading ----------------------------------------------------------------------------------------
def _read_table(source: str | Path) -> tuple[Any, str]:
    """A pyarrow Table from a CSV (optionally gzipped) or Parquet file."""
    pa = _arrow()
    path = Path(source)
    where = str(path)
    if not path.is_file():
        raise DataError(
            f"market data file {where!r} does not exist (or is not a file). Pass a CSV or Parquet file."
        )
    if path.stat().st_size == 0:
        raise DataError(f"market data file {where!r} is empty (0 bytes). Expected a CSV or Parquet table.")
    suffixes = [s.lower() for s in path.suffixes]
    try:
        if ".parquet" in suffixes or ".pq" in suffixes:
            import pyarrow.parquet as pq

            columns = pq.read_schema(path).names
            lowered = {str(c).strip().lower() for c in columns}
            if lowered & set(TICKER_COLUMNS):  # long data: only the columns the loader reads
                known = {*TIME_COLUMNS, *TICKER_COLUMNS, *CLOSE_COLUMNS, *OHL_COLUMNS, "volume", "vol"}
                columns = [c for c in columns if str(c).strip().lower() in known]
            table = pq.read_table(path, columns=columns)
        else:
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(path)
    except (pa.ArrowException, OSError, ValueError) as error:
        kind = "Parquet" if ".parquet" in suffixes or ".pq" in suffixes else "CSV"
        raise DataError(
            f"market data file {where!r} could not be read as {kind} ({type(error).__name__}: {error}). "
            "Expected a table with a date column and prices (long: date, ticker, close, ...; wide: date "
            "and one close column per ticker)."
        ) from None
    return table, where


def _find(names: dict[str, str], candidates: tuple[str, ...]) -> str | None:
    for candidate in candidates:
        if candidate in names:
            return names[candidate]
    return None


def _times_ns(column: Any, where: str, name: str) -> np.ndarray:
    """An arrow column of dates/timestamps/ISO strings as int64 ns; DataError on nulls or bad values."""
    pa = _arrow()
    import pyarrow.compute as pc

    kind = column.type
    try:
        if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            values = pc.cast(column, pa.timestamp("ns", tz=getattr(kind, "tz", None)))
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind):
            values = pc.cast(pc.cast(column, pa.string()), pa.timestamp("ns"))
        else:
            raise DataError(
                f"{where}: column {name!r} has type {kind}, expected dates or timestamps (e.g. "
                "'2018-01-02' or '2018-01-02 09:30:00'). Store the column as text dates or timestamps."
            )
    except pa.ArrowInvalid as error:
        raise DataError(
            f"{where}: column {name!r} has a value that is not a date ({error}). Expected ISO dates such "
            "as '2018-01-02' or '2018-01-02 09:30:00'."
        ) from None
    if values.null_count:
        row = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
        raise DataError(
            f"{where}: column {name!r} is empty in row {row + 1} (of data). Every row needs a date."
        )
    return values.cast(pa.int64()).to_numpy()


def _floats(column: Any, where: str, name: str) -> np.ndarray:
    pa = _arrow()
    import pyarrow.compute as pc

    try:
        values = pc.cast(column, pa.float32())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise DataError(
            f"{where}: column {name!r} is not numeric ({error}). Prices and volumes must be numbers."
        ) from None
    return values.to_numpy()  # nulls become NaN


def _check_tickers(wanted: Any, available: list[str], where: str) -> list[str]:
    if isinstance(wanted, str):
        wanted = [wanted]
    wanted = [str(t) for t in wanted]
    if not wanted:
        raise DataError(f"{where}: tickers is empty. Name at least one ticker, or pass None for all.")
    duplicates = sorted({t for t in wanted if wanted.count(t) > 1})
    if duplicates:
        raise DataError(f"{where}: tickers {duplicates} are listed more than once. Name each ticker once.")
    unknown = [t for t in wanted if t not in available]
    if unknown:
        hints = []
        for ticker in unknown:
            close = difflib.get_close_matches(ticker, available, n=1)
            if close:
                hints.append(f"{ticker} -> {close[0]}?")
        hint = f" Did you mean: {', '.join(hints)}" if hints else ""
        shown = ", ".join(available[:40]) + (
            f", ... ({len(available)} in all)" if len(available) > 40 else ""
        )
        raise DataError(f"{where}: unknown ticker(s) {', '.join(unknown)}.{hint} Available: {shown}.")
    return wanted


def _read_source(source: Any) -> tuple[Any, str]:
    if isinstance(source, (str, Path)):
        return _read_table(source)
    pd = _pandas()
    pa = _arrow()
    if isinstance(source, pd.DataFrame):
        frame = source
        if not any(str(c).strip().lower() in TIME_COLUMNS for c in frame.columns) and isinstance(
            frame.index, pd.DatetimeIndex
        ):
            frame = frame.reset_index(names="date")
        try:
            return pa.Table.from_pandas(frame, preserve_index=False), "<DataFrame>"
        except (pa.ArrowException, TypeError, ValueError) as error:
            raise DataError(f"<DataFrame>: cannot be converted to a table ({error}).") from None
    raise DataError(
        f"market data source must be a file path (CSV or Parquet) or a pandas DataFrame, got "
        f"{type(source).__name__}."
    )


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
    table, where = _read_source(source)
    names = {str(name).strip().lower(): name for name in table.column_names}
    time_name = _find(names, TIME_COLUMNS)
    if time_name is None:
        raise DataError(
            f"{where}: no date column; expected one named {' or '.join(TIME_COLUMNS)} (any case), found "
            f"columns {table.column_names}."
        )
    if table.num_rows == 0:
        raise DataError(
            f"{where}: the table has columns {table.column_names} but no rows. It holds no prices."
        )
    ticker_name = _find(names, TICKER_COLUMNS)
    if ticker_name is not None:
        holder = [table]
        del table  # _load_long owns the table from here and frees its columns one by one
        data = _load_long(holder, where, names, time_name, ticker_name, tickers, start, end)
    else:
        data = _load_wide(table, where, time_name, tickers, start, end)
    return _handle_missing(data, missing, fill_limit)


def _window(times: np.ndarray, start: Any, end: Any, where: str) -> np.ndarray | None:
    """Boolean row mask for start <= time <= end, or None when both are None."""
    if start is None and end is None:
        return None
    keep = np.ones(len(times), dtype=bool)
    if start is not None:
        keep &= times >= _parse_date(start, "start")
    if end is not None:
        keep &= times < _parse_end(end, "end")
    if not keep.any():
        lo, hi = _format_ns(times.min()), _format_ns(times.max())
        raise DataError(
            f"{where}: no bars between {start or 'the start'} and {end or 'the end'}; the data covers "
            f"{lo}..{hi}. Choose dates inside that range."
        )
    return keep


def _check_positive(
    values: np.ndarray, codes: np.ndarray | None, times: np.ndarray, tickers: list[str], where: str, name: str
) -> None:
    """DataError naming ticker and date of the first non-positive (or NaN) price in a long column."""
    bad = ~(values > 0)
    if not bad.any():
        return
    count = int(bad.sum())
    row = int(np.flatnonzero(bad)[0])
    ticker = tickers[int(codes[row])] if codes is not None else "?"
    value = values[row]
    what = "missing (empty)" if np.isnan(value) else f"{value:g}, not positive"
    raise DataError(
        f"{where}: {name} price of {ticker} on {_format_ns(times[row])} is {what} ({count} such row"
        f"{'s' if count > 1 else ''} in all). Prices must be positive numbers; fix or remove those rows."
    )


def _load_long(
    holder: list[Any],
    where: str,
    names: dict[str, str],
    time_name: str,
    ticker_name: str,
    tickers: list[str] | None,
    start: Any,
    end: Any,
) -> MarketData:
    """Long rows -> (T, S) arrays. ``holder`` hands over the only reference to the arrow table, so that
    each column's buffers are freed as soon as it has been scattered (peak memory ~ table + grids)."""
    table = holder.pop()
    close_name = _find(names, CLOSE_COLUMNS)
    if close_name is None:
        raise DataError(
            f"{where}: long-format data (it has a {ticker_name!r} column) needs a close column named "
            f"{' or '.join(CLOSE_COLUMNS)}; found columns {table.column_names}."
        )
    ohl_names = [_find(names, (n,)) for n in OHL_COLUMNS]
    close_only = all(n is None for n in ohl_names)
    volume_name = _find(names, ("volume", "vol"))

    times = _times_ns(table.column(time_name), where, time_name)
    codes, names_in_file = _ticker_codes(table.column(ticker_name), where, ticker_name)
    table = table.drop_columns([time_name, ticker_name])
    keep, wanted, times, codes = _select_rows(times, codes, names_in_file, tickers, start, end, where)
    calendar, flat = _bar_cells(times, codes, wanted, where)
    num_bars, num_tickers = len(calendar), len(wanted)

    def grid(column_name: str, price: str | None) -> np.ndarray:
        """Extract one column, check it, scatter it into a (T, S) float32 grid, free the column."""
        nonlocal table
        values = _floats(table.column(column_name), where, column_name)
        table = table.drop_columns([column_name])
        if keep is not None:
            values = values[keep]
        if price is not None:
            _check_positive(values, codes, times, wanted, where, price)
        elif (values < 0).any():
            row = int(np.flatnonzero(values < 0)[0])
            raise DataError(
                f"{where}: volume of {wanted[codes[row]]} on {_format_ns(times[row])} is {values[row]:g}; "
                "volumes must be >= 0."
            )
        out = np.full((num_bars, num_tickers), np.nan, dtype=np.float32)
        out.reshape(-1)[flat] = values
        return out

    close_grid = grid(close_name, "close")
    grids = {
        name: grid(column_name, name) if column_name is not None else close_grid
        for name, column_name in zip(OHL_COLUMNS, ohl_names, strict=True)
    }
    volume_grid = grid(volume_name, None) if volume_name is not None else None
    if volume_grid is not None:  # absent bars and empty volume fields: no volume
        np.nan_to_num(volume_grid, copy=False, nan=0.0)
    return MarketData(
        dates=calendar.astype("datetime64[ns]"),
        tickers=list(wanted),
        close=close_grid,
        open=grids["open"],
        high=grids["high"],
        low=grids["low"],
        volume=volume_grid,
        source=where,
        close_only=close_only,
    )


def _ticker_codes(column: Any, where: str, name: str) -> tuple[np.ndarray, list[str]]:
    """The ticker column as one small integer code per row, and the ticker of each code."""
    pa = _arrow()
    import pyarrow.compute as pc

    if column.null_count:
        row = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{where}: column {name!r} is empty in row {row + 1}. Every row needs a ticker.")
    if not pa.types.is_dictionary(column.type):  # categorical tickers: one small code per row
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            column = pc.cast(column, pa.string())
        column = pc.dictionary_encode(column)
    column = pa.table({"ticker": column}).unify_dictionaries().column("ticker")
    dictionary = column.chunk(0).dictionary if column.num_chunks else pa.array([], pa.string())
    codes = np.concatenate(
        [chunk.indices.to_numpy(zero_copy_only=False) for chunk in column.chunks] or [np.zeros(0)]
    ).astype(np.int32, copy=False)
    return codes, [str(t) for t in dictionary.to_pylist()]


def _select_rows(
    times: np.ndarray,
    codes: np.ndarray,
    names_in_file: list[str],
    tickers: list[str] | None,
    start: Any,
    end: Any,
    where: str,
) -> tuple[np.ndarray | None, list[str], np.ndarray, np.ndarray]:
    """The rows of the wanted tickers within start..end: ``(keep, wanted, times, codes)``, ``keep`` the
    row mask (None: every row), codes renumbered in the order of ``wanted``."""
    counts = np.bincount(codes, minlength=len(names_in_file))
    available = [t for t, c in zip(names_in_file, counts, strict=True) if c > 0]
    keep = _window(times, start, end, where)
    wanted = available if tickers is None else _check_tickers(tickers, available, where)
    remap = np.full(len(names_in_file), -1, dtype=np.int32)
    for new, ticker in enumerate(wanted):
        remap[names_in_file.index(ticker)] = new
    codes = remap[codes]
    if tickers is not None:
        keep = codes >= 0 if keep is None else keep & (codes >= 0)
    if keep is not None:
        times, codes = times[keep], codes[keep]
    present = np.bincount(codes, minlength=len(wanted))
    if (present == 0).any():
        absent = [t for t, c in zip(wanted, present, strict=True) if c == 0]
        raise DataError(
            f"{where}: no prices for {', '.join(absent)} between {start or 'the start'} and "
            f"{end or 'the end'}. Choose other tickers or dates."
        )
    return keep, wanted, times, codes


def _bar_cells(
    times: np.ndarray, codes: np.ndarray, wanted: list[str], where: str
) -> tuple[np.ndarray, np.ndarray]:
    """The common calendar (every distinct bar time, sorted) and each row's cell in the (T, S) grid;
    DataError on a ticker with two rows at one bar time."""
    flat, calendar = _pandas().factorize(times, sort=True)  # flat: bar index per row, int64
    calendar = np.asarray(calendar, dtype=np.int64)
    num_bars, num_tickers = len(calendar), len(wanted)
    flat *= num_tickers
    flat += codes
    seen = np.zeros(num_bars * num_tickers, dtype=bool)
    seen[flat] = True
    if int(seen.sum()) != len(flat):
        unique, count = np.unique(flat, return_counts=True)
        cell = int(unique[np.argmax(count > 1)])
        raise DataError(
            f"{where}: {len(flat) - len(unique)} duplicate bar(s); e.g. {wanted[cell % num_tickers]} on "
            f"{_format_ns(calendar[cell // num_tickers])} appears {int(count.max())} times. Keep one row per "
            "ticker and bar time."
        )
    return calendar, flat


def _load_wide(
    table: Any, where: str, time_name: str, tickers: list[str] | None, start: Any, end: Any
) -> MarketData:
    available = [str(c) for c in table.column_names if c != time_name]
    if not available:
        raise DataError(
            f"{where}: only a date column ({time_name!r}), no prices. Expected long data (date, ticker, "
            "close, ...) or wide data (date and one close column per ticker)."
        )
    wanted = available if tickers is None else _check_tickers(tickers, available, where)
    by_name = {str(c): c for c in table.column_names}
    times = _times_ns(table.column(time_name), where, time_name)
    keep = _window(times, start, end, where)
    order = np.argsort(times[keep] if keep is not None else times, kind="stable")
    if keep is not None:
        times = times[keep]
    times = times[order]
    duplicate = np.flatnonzero(np.diff(times) == 0)
    if len(duplicate):
        raise DataError(
            f"{where}: the date {_format_ns(times[duplicate[0]])} appears more than once ({len(duplicate)} "
            "duplicate row(s)). Keep one row per date in wide data."
        )
    close = np.empty((len(times), len(wanted)), dtype=np.float32)
    for j, ticker in enumerate(wanted):
        values = _floats(table.column(by_name[ticker]), where, ticker)
        close[:, j] = (values[keep] if keep is not None else values)[order]
    bad = close <= 0
    if bad.any():
        row, j = (int(v[0]) for v in np.nonzero(bad))
        raise DataError(
            f"{where}: close price of {wanted[j]} on {_format_ns(times[row])} is {close[row, j]:g}, not "
            f"positive ({int(bad.sum())} such value(s) in all). Prices must be positive numbers."
        )
    absent = [t for j, t in enumerate(wanted) if np.isnan(close[:, j]).all()]
    if absent:
        raise DataError(
            f"{where}: no prices for {', '.join(absent)} between {start or 'the start'} and "
            f"{end or 'the end'} (every value is empty). Choose other tickers or dates."
        )
    return MarketData(
        dates=times.astype("datetime64[ns]"),
        tickers=list(wanted),
        close=close,
        open=close,
        high=close,
        low=close,
        volume=None,
        source=where,
        close_only=True,
    )


def _handle_missing(data: MarketData, policy: str, fill_limit: int) -> MarketData:
    holes = np.isnan(data.close)  # (T, S) bars a ticker lacks
    per_ticker = holes.sum(axis=0)
    if not per_ticker.any():
        return data
    where = data.source
    if policy == "raise":
        j = int(np.flatnonzero(per_ticker)[0])
        row = int(np.flatnonzero(holes[:, j])[0])
        raise DataError(
            f"{where}: {data.tickers[j]} has no bar on {data.date(row)} ({int(per_ticker.sum())} missing "
            f"bar(s) over {int((per_ticker > 0).sum())} ticker(s)). Pass missing='ffill' (with fill_limit) "
            "or missing='drop' to handle them."
        )
    filled = np.zeros_like(holes)
    if policy == "ffill" and fill_limit > 0:
        bars = np.arange(data.num_bars, dtype=np.int32)[:, None]
        last_seen = np.where(holes, np.int32(-1), bars)
        np.maximum.accumulate(last_seen, axis=0, out=last_seen)
        filled = holes & (last_seen >= 0) & (bars - last_seen <= fill_limit)
        if filled.any():
            rows, cols = np.nonzero(filled)
            source_rows = last_seen[rows, cols]
            carried = data.close[source_rows, cols]
            arrays = [data.close] + [a for a in (data.open, data.high, data.low) if a is not data.close]
            for array in arrays:  # a filled bar is flat at the last close: no trading happened
                array[rows, cols] = carried
            if data.volume is not None:
                data.volume[rows, cols] = 0.0
    unfilled = holes & ~filled
    drop = unfilled.any(axis=1)  # (T,) bars where some ticker is still missing
    report: dict[str, dict[str, int]] = {}
    for j, ticker in enumerate(data.tickers):
        if per_ticker[j]:
            report[ticker] = {
                "missing": int(per_ticker[j]),
                "filled": int(filled[:, j].sum()),
                "dropped": int(unfilled[:, j].sum()),
            }
            logger.info(
                "%s: %s has %d missing bar(s): %d forward-filled (limit %d), %d left missing (bars dropped)",
                where,
                ticker,
                report[ticker]["missing"],
                report[ticker]["filled"],
                fill_limit if policy == "ffill" else 0,
                report[ticker]["dropped"],
            )
    if drop.all():
        worst = sorted(report, key=lambda t: -report[t]["dropped"])[:5]
        raise DataError(
            f"{where}: no bar has a price for every ticker after handling missing bars "
            f"(missing={policy!r}, fill_limit={fill_limit}); most missing: "
            + ", ".join(f"{t} ({report[t]['dropped']} bars)" for t in worst)
            + ". Choose fewer tickers, a later start, or a larger fill_limit."
        )
    if drop.any():
        logger.info(
            "%s: dropped %d of %d bars (first %s) where a ticker had no price",
            where,
            int(drop.sum()),
            data.num_bars,
            data.date(int(np.flatnonzero(drop)[0])),
        )
        data = data._take(~drop)
    data.missing = report
    return data


# -- the vendored data set --------------------------------------------------------------------------
def load_sp500(start: Any = None, end: Any = None, tickers: list[str] | None = None) -> MarketData:
    """The vendored daily adjusted closes of 20 S&P 500 stocks, 1990-01-02 to 2022-12-28 (close-only)."""
    return load_market_data(SP500_PATH, tickers=tickers, start=start, end=end)


def load_sp500_index(start: Any = None, end: Any = None) -> MarketData:
    """The vendored S&P 500 index level (one column, ``SP500``) over the same dates."""
    return load_market_data(SP500_INDEX_PATH, start=start, end=end)


def align_to_dates(series: MarketData, dates: np.ndarray, column: int = 0) -> np.ndarray:
    """``series``'s close of one column on ``dates``: the last value at or before each date (NaN before
    the series starts). Used to put a benchmark index on a trading calendar."""
    ints = series.dates.astype(np.int64)
    position = np.searchsorted(ints, np.asarray(dates).astype("datetime64[ns]").astype(np.int64), "right") - 1
    values = series.close[:, column].astype(np.float64)
    out = np.where(position >= 0, values[np.clip(position, 0, None)], np.nan)
    return out


# -- synthetic data ---------------------------------------------------------------------------------
def _calendar(start: Any, num_bars: int, freq: str) -> tuple[np.ndarray, float]:
    """``num_bars`` bar times from ``start`` and the bars per year: business days for daily bars,
    09:30-16:00 sessions of business days for intraday bars."""
    pd = _pandas()
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
