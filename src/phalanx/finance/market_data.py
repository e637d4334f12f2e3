"""MarketData: the prices of several tickers on one calendar of bars, and what acts on that calendar.

:class:`MarketData` holds ``(bars, tickers)`` float32 arrays (close, open, high, low, volume) and
selects periods, splits at a date and picks tickers. Here too: parsing and printing bar times, checking
a list of tickers (with suggestions for typos), the policy for bars a ticker lacks
(:func:`handle_missing`), and putting one series on another calendar (:func:`align_to_dates`). The
readers (:mod:`phalanx.finance.readers`) and the generator (:mod:`phalanx.finance.synthetic`) build it.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from phalanx.errors import DataError, import_optional

logger = logging.getLogger("phalanx.finance")

NS_PER_DAY = 86_400 * 10**9


def import_pandas() -> Any:
    return import_optional(
        "pandas",
        DataError,
        "market data needs pandas and pyarrow, which are not installed. Install them with "
        "pip install 'phalanx[finance]' (pandas>=2, pyarrow>=14).",
    )


def import_arrow() -> Any:
    return import_optional(
        "pyarrow",
        DataError,
        "market data needs pyarrow, which is not installed. Install it with pip install "
        "'phalanx[finance]' (pandas>=2, pyarrow>=14).",
    )


# -- dates ------------------------------------------------------------------------------------------
def format_ns(value: int | np.integer | np.datetime64, daily: bool | None = None) -> str:
    stamp = np.datetime64(int(value), "ns") if not isinstance(value, np.datetime64) else value
    if daily is None:
        daily = int(stamp.astype("datetime64[ns]").astype(np.int64)) % NS_PER_DAY == 0
    return str(np.datetime_as_string(stamp, unit="D" if daily else "m"))


def parse_date(value: Any, what: str) -> int:
    """A date-like value as int64 nanoseconds since the epoch."""
    pd = import_pandas()
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


def parse_end(value: Any, what: str) -> int:
    """An inclusive end as an exclusive bound: a date without a time includes that whole day."""
    ns = parse_date(value, what)
    has_time = not (isinstance(value, str) and len(value.strip()) <= 10) and ns % NS_PER_DAY != 0
    return ns + 1 if has_time else ns + NS_PER_DAY


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

    @classmethod
    def of_closes(cls, dates: np.ndarray, tickers: list[str], close: np.ndarray, source: str) -> MarketData:
        """Close-only data: open, high and low are the ``close`` array itself, and there is no volume."""
        # positional: dates, tickers, then close, open, high and low
        return cls(dates, tickers, close, close, close, close, volume=None, source=source, close_only=True)

    @property
    def num_bars(self) -> int:
        return int(self.close.shape[0])

    @property
    def num_tickers(self) -> int:
        return len(self.tickers)

    @property
    def daily(self) -> bool:
        """True when every bar time is midnight (daily or coarser bars)."""
        return bool((self.dates.astype(np.int64) % NS_PER_DAY == 0).all())

    def date(self, index: int) -> str:
        """Bar ``index``'s time as text: ``YYYY-MM-DD`` for daily bars, else ``YYYY-MM-DDTHH:MM``."""
        return format_ns(self.dates[index], self.daily)

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

        def part(array: np.ndarray) -> np.ndarray:
            if array is self.close:  # close-only data shares one array
                return close
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
            volume=None if self.volume is None else part(self.volume),
            missing={t: v for t, v in self.missing.items() if t in tickers},
        )

    def index_range(self, start: Any = None, end: Any = None, what: str = "period") -> tuple[int, int]:
        """``(first, last)`` bar indices with ``start <= date <= end`` (inclusive; a date without a
        time includes its whole day). Raises DataError if no bar is in the period."""
        ints = self.dates.astype(np.int64)
        begin = None if start is None else parse_date(start, f"{what} start")
        stop = None if end is None else parse_end(end, f"{what} end")
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
        cut = int(np.searchsorted(self.dates.astype(np.int64), parse_date(date, "split date")))
        if cut == 0 or cut == self.num_bars:
            side = "before" if cut == 0 else "on or after"
            raise DataError(
                f"{self.source}: splitting at {date} leaves no bars {side} it; the data covers {self.span}. "
                "Choose a split date inside that range."
            )
        return self._take(slice(0, cut)), self._take(slice(cut, None))

    def subset(self, tickers: list[str] | tuple[str, ...]) -> MarketData:
        """Only ``tickers``, in that order. Raises DataError naming unknown tickers."""
        columns = [self.tickers.index(t) for t in check_tickers(tickers, self.tickers, self.source)]
        return self._take(slice(None), columns)

    def to_frame(self, tickers: list[str] | None = None) -> Any:
        """A long pandas DataFrame (date, ticker, open, high, low, close, volume), sorted by ticker then
        date; bars whose close is NaN (missing) are left out."""
        pd = import_pandas()
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


def check_tickers(wanted: Any, available: list[str], where: str) -> list[str]:
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


def handle_missing(data: MarketData, policy: str, fill_limit: int) -> MarketData:
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


def align_to_dates(series: MarketData, dates: np.ndarray, column: int = 0) -> np.ndarray:
    """``series``'s close of one column on ``dates``: the last value at or before each date (NaN before
    the series starts). Used to put a benchmark index on a trading calendar."""
    ints = series.dates.astype(np.int64)
    position = np.searchsorted(ints, np.asarray(dates).astype("datetime64[ns]").astype(np.int64), "right") - 1
    values = series.close[:, column].astype(np.float64)
    out = np.where(position >= 0, values[np.clip(position, 0, None)], np.nan)
    return out
