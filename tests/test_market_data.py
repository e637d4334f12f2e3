"""Market data: loading CSV/Parquet in long and wide layouts, alignment, missing bars, splits, bad input."""

from __future__ import annotations

import gzip
import logging

import numpy as np
import pytest

pd = pytest.importorskip("pandas", reason="the finance extra (pandas, pyarrow) is not installed")
pytest.importorskip("pyarrow", reason="the finance extra (pandas, pyarrow) is not installed")

from phalanx.errors import DataError  # noqa: E402
from phalanx.finance.data import (  # noqa: E402
    SP500_INDEX_PATH,
    SP500_PATH,
    MarketData,
    align_to_dates,
    load_market_data,
    load_sp500,
    load_sp500_index,
    synthetic_market,
)


def long_frame(rows):
    return pd.DataFrame(rows, columns=["date", "ticker", "close"])


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- round trips --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_long_ohlcv_round_trip(tmp_path, fmt):
    market = synthetic_market(4, 120, seed=3)
    frame = market.to_frame()
    assert list(frame.columns) == ["date", "ticker", "open", "high", "low", "close", "volume"]
    assert frame["ticker"].dtype == "category" and frame["close"].dtype == np.float32
    path = tmp_path / f"bars.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path)
    loaded = load_market_data(path)
    assert loaded.tickers == market.tickers and loaded.num_bars == 120
    assert loaded.close.dtype == np.float32 and not loaded.close_only
    np.testing.assert_array_equal(loaded.dates, market.dates)
    for name in ("open", "high", "low", "close", "volume"):
        np.testing.assert_allclose(getattr(loaded, name), getattr(market, name), rtol=1e-6)
    assert loaded.missing == {}


def test_shuffled_rows_and_ticker_selection_order(tmp_path):
    frame = synthetic_market(3, 60, seed=1).to_frame().sample(frac=1.0, random_state=0)
    path = tmp_path / "shuffled.parquet"
    frame.to_parquet(path)
    loaded = load_market_data(path, tickers=["T002", "T000"])
    assert loaded.tickers == ["T002", "T000"]
    reference = synthetic_market(3, 60, seed=1)
    np.testing.assert_array_equal(loaded.close, reference.close[:, [2, 0]])


def test_close_only_long_data(tmp_path):
    path = write(
        tmp_path,
        "close.csv",
        "Date,Symbol,Close\n2020-01-02,AAA,10\n2020-01-02,BBB,20\n2020-01-03,AAA,11\n2020-01-03,BBB,19\n",
    )
    data = load_market_data(path)
    assert data.close_only and data.volume is None and data.tickers == ["AAA", "BBB"]
    np.testing.assert_array_equal(data.close, [[10, 20], [11, 19]])
    for name in ("open", "high", "low"):
        np.testing.assert_array_equal(getattr(data, name), data.close)


def test_wide_close_only_csv_and_gzip(tmp_path):
    text = "Date,AAA,BBB\n2020-01-03,11,19\n2020-01-02,10,20\n"  # unsorted on purpose
    path = tmp_path / "wide.csv.gz"
    with gzip.open(path, "wt") as file:
        file.write(text)
    data = load_market_data(path)
    assert data.close_only and data.tickers == ["AAA", "BBB"]
    assert [data.date(0), data.date(1)] == ["2020-01-02", "2020-01-03"]
    np.testing.assert_array_equal(data.close, [[10, 20], [11, 19]])


# -- alignment and missing bars -----------------------------------------------------------------------
def gappy_frame():
    """AAA trades every day; BBB starts a day late and misses three days in a row later."""
    days = pd.bdate_range("2021-01-04", periods=10)
    rows = [(d, "AAA", 100.0 + i) for i, d in enumerate(days)]
    rows += [(d, "BBB", 50.0 + i) for i, d in enumerate(days) if i not in (0, 4, 5, 6)]
    return long_frame(rows), days


def test_alignment_forward_fill_within_limit_and_drop(caplog):
    frame, days = gappy_frame()
    with caplog.at_level(logging.INFO, logger="phalanx.finance"):
        data = load_market_data(frame, fill_limit=2)
    # bar 0 (BBB not yet trading) and bar 6 (third missing day, beyond the limit) are dropped
    assert data.num_bars == 8
    assert list(data.dates) == [d.to_datetime64() for i, d in enumerate(days) if i not in (0, 6)]
    assert data.missing == {"BBB": {"missing": 4, "filled": 2, "dropped": 2}}
    bbb = data.close[:, 1]
    np.testing.assert_array_equal(bbb[:3], [51, 52, 53])
    np.testing.assert_array_equal(bbb[3:5], [53, 53])  # days 4 and 5 carry day 3's close
    assert "BBB has 4 missing bar(s): 2 forward-filled (limit 2), 2 left missing" in caplog.text
    assert "dropped 2 of 10 bars" in caplog.text


def test_forward_fill_sets_flat_bar_and_zero_volume():
    market = synthetic_market(2, 80, seed=5)
    frame = market.to_frame()
    frame = frame[~((frame["ticker"] == "T001") & (frame["date"] == market.dates[40]))]
    data = load_market_data(frame)
    assert data.num_bars == 80 and data.missing["T001"]["filled"] == 1
    for name in ("open", "high", "low", "close"):
        assert getattr(data, name)[40, 1] == market.close[39, 1]
    assert data.volume[40, 1] == 0.0


def test_missing_drop_and_raise_policies():
    frame, days = gappy_frame()
    dropped = load_market_data(frame, missing="drop")
    assert dropped.num_bars == 6 and dropped.missing["BBB"]["dropped"] == 4
    with pytest.raises(DataError, match=r"BBB has no bar on 2021-01-04 \(4 missing bar"):
        load_market_data(frame, missing="raise")


def test_split_select_and_minute_dates():
    data = load_sp500()
    train, test = data.split("2018-01-01")
    assert train.date(-1) == "2017-12-29" and test.date(0) == "2018-01-02"
    assert train.num_bars + test.num_bars == data.num_bars
    minutes = synthetic_market(2, 3 * 390, freq="1min", start="2022-03-01")
    assert minutes.date(0) == "2022-03-01T09:30" and minutes.date(389) == "2022-03-01T15:59"
    day = minutes.select("2022-03-02", "2022-03-02")  # a date alone includes its whole day
    assert day.num_bars == 390 and day.date(-1) == "2022-03-02T15:59"
    with pytest.raises(
        DataError, match=r"leaves no bars on or after it; the data covers 1990-01-02\.\.2022-12-28"
    ):
        data.split("2030-01-01")


def test_vendored_sp500_and_index():
    data = load_sp500()
    assert data.num_bars == 8313 and data.num_tickers == 20 and data.close_only
    assert data.tickers[:3] == ["AAPL", "AMD", "BAC"] and data.span == "1990-01-02..2022-12-28"
    assert data.close[0, 0] == pytest.approx(0.264)
    index = load_sp500_index()
    assert index.tickers == ["SP500"] and index.close[0, 0] == pytest.approx(359.69)
    aligned = align_to_dates(index, data.dates[100:110])
    np.testing.assert_allclose(aligned, index.close[100:110, 0])
    license_text = (SP500_PATH.parent / "LICENSE-skfolio").read_text()
    assert "BSD 3-Clause" in license_text and "The skfolio developers" in license_text
    assert "1.12.2" in (SP500_PATH.parent / "README.md").read_text()
    assert SP500_INDEX_PATH.is_file()


def test_synthetic_market_is_seeded_and_correlated():
    a, b = (
        synthetic_market(4, 2000, seed=7, correlation=0.5),
        synthetic_market(4, 2000, seed=7, correlation=0.5),
    )
    np.testing.assert_array_equal(a.close, b.close)
    assert not np.array_equal(a.close, synthetic_market(4, 2000, seed=8).close)
    returns = np.diff(np.log(a.close), axis=0)
    correlation = np.corrcoef(returns.T)[np.triu_indices(4, 1)]
    assert 0.4 < correlation.mean() < 0.6
    assert (a.high >= np.maximum(a.open, a.close)).all() and (a.low <= np.minimum(a.open, a.close)).all()
    assert (a.volume > 0).all()


# -- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, text, message",
    [
        ("empty.csv", "", r"empty.csv' is empty \(0 bytes\)"),
        ("header.csv", "date,ticker,close\n", r"header.csv: the table has columns .* but no rows"),
        ("ragged.csv", "date,ticker,close\n2020-01-02,AAA,1,2\n", r"ragged.csv' could not be read as CSV"),
        ("nodate.csv", "day,ticker,close\n2020-01-02,AAA,1\n", r"nodate.csv: no date column"),
        (
            "noclose.csv",
            "date,ticker,price\n2020-01-02,AAA,1\n",
            r"noclose.csv: long-format data .* needs a close",
        ),
        ("text.csv", "date,ticker,close\n2020-01-02,AAA,abc\n", r"text.csv: column 'close' is not numeric"),
        (
            "baddate.csv",
            "date,ticker,close\n2020-01-02,AAA,1\nyesterday,AAA,2\n",
            r"baddate.csv: column 'date'",
        ),
        (
            "negative.csv",
            "date,ticker,close\n2020-01-02,AAA,1\n2020-01-03,AAA,-2\n",
            r"negative.csv: close price of AAA on 2020-01-03 is -2, not positive",
        ),
        (
            "zero.csv",
            "date,AAA,BBB\n2020-01-02,1,2\n2020-01-03,1,0\n",
            r"zero.csv: close price of BBB on 2020-01-03 is 0, not positive",
        ),
        (
            "blank.csv",
            "date,ticker,close\n2020-01-02,AAA,1\n2020-01-03,AAA,\n",
            r"blank.csv: close price of AAA on 2020-01-03 is missing \(empty\)",
        ),
        (
            "duplicate.csv",
            "date,ticker,close\n2020-01-02,AAA,1\n2020-01-02,AAA,1.1\n",
            r"duplicate.csv: 1 duplicate bar\(s\); e.g. AAA on 2020-01-02 appears 2 times",
        ),
    ],
)
def test_bad_files_name_file_ticker_and_date(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(DataError, match=message):
        load_market_data(path)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(DataError, match=r"nowhere.csv' does not exist"):
        load_market_data(tmp_path / "nowhere.csv")
    path = write(tmp_path, "corrupt.parquet", "this is not parquet")
    with pytest.raises(DataError, match=r"corrupt.parquet' could not be read as Parquet"):
        load_market_data(path)


def test_unknown_tickers_and_periods_outside_the_data():
    with pytest.raises(
        DataError, match=r"sp500_dataset.csv.gz: unknown ticker\(s\) APPL. Did you mean: APPL -> AAPL"
    ):
        load_sp500(tickers=["APPL", "MSFT"])
    with pytest.raises(
        DataError, match=r"no bars between 2030-01-01 and 2031-01-01; the data covers 1990-01-02"
    ):
        load_sp500(start="2030-01-01", end="2031-01-01")
    with pytest.raises(DataError, match=r"'someday' is not a date"):
        load_sp500(start="someday")
    with pytest.raises(DataError, match=r"missing = 'interpolate' is invalid"):
        load_market_data(SP500_PATH, missing="interpolate")


def test_ticker_without_prices_in_the_period():
    frame = long_frame([("2020-01-02", "AAA", 1.0), ("2020-01-03", "AAA", 1.1), ("2021-01-04", "BBB", 3.0)])
    with pytest.raises(DataError, match=r"<DataFrame>: no prices for BBB between 2020-01-01 and 2020-12-31"):
        load_market_data(frame, start="2020-01-01", end="2020-12-31")
    with pytest.raises(DataError, match=r"no bar has a price for every ticker"):
        load_market_data(frame, missing="drop")


def test_market_data_repr_and_subset():
    data = load_sp500().subset(["MSFT", "AAPL"])
    assert isinstance(data, MarketData) and data.tickers == ["MSFT", "AAPL"]
    assert "2 tickers x 8313 bars" in repr(data) and "close-only" in repr(data)
