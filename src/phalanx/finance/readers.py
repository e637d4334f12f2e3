"""Reading price tables (CSV, Parquet, a DataFrame) into :class:`~phalanx.finance.market_data.MarketData`.

A table is read with pyarrow (multi-threaded CSV; Parquet reads only the columns needed), then one of
two layouts becomes ``(bars, tickers)`` float32 grids: **long** rows of (time, ticker, prices), whose
tickers are dictionary-encoded and scattered straight into the grids on the union of their bar times
(:func:`load_long`), or **wide** rows of a time and one close column per ticker (:func:`load_wide`).
Every bad value raises :class:`~phalanx.errors.DataError` naming the file, the ticker and the date.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from phalanx.errors import DataError
from phalanx.finance.market_data import (
    MarketData,
    check_tickers,
    format_ns,
    import_arrow,
    import_pandas,
    parse_date,
    parse_end,
)

TIME_COLUMNS = ("date", "datetime", "time", "timestamp")
TICKER_COLUMNS = ("ticker", "symbol", "tic")
CLOSE_COLUMNS = ("close", "adj_close", "adj close", "adjclose")
OHL_COLUMNS = ("open", "high", "low")


def _read_table(source: str | Path) -> tuple[Any, str]:
    """A pyarrow Table from a CSV (optionally gzipped) or Parquet file."""
    pa = import_arrow()
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


def find_column(names: dict[str, str], candidates: tuple[str, ...]) -> str | None:
    for candidate in candidates:
        if candidate in names:
            return names[candidate]
    return None


def _times_ns(column: Any, where: str, name: str) -> np.ndarray:
    """An arrow column of dates/timestamps/ISO strings as int64 ns; DataError on nulls or bad values."""
    pa = import_arrow()
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
    pa = import_arrow()
    import pyarrow.compute as pc

    try:
        values = pc.cast(column, pa.float32())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise DataError(
            f"{where}: column {name!r} is not numeric ({error}). Prices and volumes must be numbers."
        ) from None
    return values.to_numpy()  # nulls become NaN


def read_source(source: Any) -> tuple[Any, str]:
    if isinstance(source, (str, Path)):
        return _read_table(source)
    pd = import_pandas()
    pa = import_arrow()
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


def _window(times: np.ndarray, start: Any, end: Any, where: str) -> np.ndarray | None:
    """Boolean row mask for start <= time <= end, or None when both are None."""
    if start is None and end is None:
        return None
    keep = np.ones(len(times), dtype=bool)
    if start is not None:
        keep &= times >= parse_date(start, "start")
    if end is not None:
        keep &= times < parse_end(end, "end")
    if not keep.any():
        lo, hi = format_ns(times.min()), format_ns(times.max())
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
        f"{where}: {name} price of {ticker} on {format_ns(times[row])} is {what} ({count} such row"
        f"{'s' if count > 1 else ''} in all). Prices must be positive numbers; fix or remove those rows."
    )


def load_long(
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
    close_name = find_column(names, CLOSE_COLUMNS)
    if close_name is None:
        raise DataError(
            f"{where}: long-format data (it has a {ticker_name!r} column) needs a close column named "
            f"{' or '.join(CLOSE_COLUMNS)}; found columns {table.column_names}."
        )
    ohl_names = [find_column(names, (n,)) for n in OHL_COLUMNS]
    close_only = all(n is None for n in ohl_names)
    volume_name = find_column(names, ("volume", "vol"))

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
                f"{where}: volume of {wanted[codes[row]]} on {format_ns(times[row])} is {values[row]:g}; "
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
    pa = import_arrow()
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
    wanted = available if tickers is None else check_tickers(tickers, available, where)
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
    flat, calendar = import_pandas().factorize(times, sort=True)  # flat: bar index per row, int64
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
            f"{format_ns(calendar[cell // num_tickers])} appears {int(count.max())} times. Keep one row per "
            "ticker and bar time."
        )
    return calendar, flat


def load_wide(
    table: Any, where: str, time_name: str, tickers: list[str] | None, start: Any, end: Any
) -> MarketData:
    available = [str(c) for c in table.column_names if c != time_name]
    if not available:
        raise DataError(
            f"{where}: only a date column ({time_name!r}), no prices. Expected long data (date, ticker, "
            "close, ...) or wide data (date and one close column per ticker)."
        )
    wanted = available if tickers is None else check_tickers(tickers, available, where)
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
            f"{where}: the date {format_ns(times[duplicate[0]])} appears more than once ({len(duplicate)} "
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
            f"{where}: close price of {wanted[j]} on {format_ns(times[row])} is {close[row, j]:g}, not "
            f"positive ({int(bad.sum())} such value(s) in all). Prices must be positive numbers."
        )
    absent = [t for j, t in enumerate(wanted) if np.isnan(close[:, j]).all()]
    if absent:
        raise DataError(
            f"{where}: no prices for {', '.join(absent)} between {start or 'the start'} and "
            f"{end or 'the end'} (every value is empty). Choose other tickers or dates."
        )
    return MarketData.of_closes(times.astype("datetime64[ns]"), list(wanted), close, where)
