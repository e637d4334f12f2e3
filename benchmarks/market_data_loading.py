"""Market data loading: 100 tickers x 5 years of minute bars (~49M rows) from Parquet and CSV.

    python benchmarks/market_data_loading.py                         # the full size; ~2 GB of temp files
    python benchmarks/market_data_loading.py --tickers 10 --years 1  # a quick run
    python benchmarks/market_data_loading.py --csv-tickers 100       # also the full-size CSV (~4 GB)
    python benchmarks/market_data_loading.py --json results.json --keep --dir /tmp/bars

1. Generate seeded synthetic OHLCV minute bars (``phalanx.finance.synthetic_market``: correlated
   geometric Brownian motions, 390 bars per business day; ``--missing-fraction`` of the bars absent,
   so that the alignment has gaps to fill) and write them once, in long format sorted by ticker then
   time: Parquet for every ticker (row groups of 10 tickers; float32 prices, dictionary-encoded
   tickers, nanosecond timestamps) and CSV for the first ``--csv-tickers`` tickers (default 10, a
   tenth of the rows: the full CSV is ~4 GB; pass ``--csv-tickers 100`` to time it too).
2. Time ``phalanx.finance.load_market_data(path)`` in a fresh Python process per file: read with
   pyarrow, dictionary-encode tickers, build the common calendar, scatter into ``(bars, tickers)``
   float32 arrays, check duplicates and prices, forward-fill missing bars (limit 5) and drop the rest.
   Peak memory is the highest resident set size sampled every 5 ms during the load minus the one
   just before it, so it counts pyarrow's and numpy's buffers (tracemalloc would miss pyarrow's).

The files go to a temporary directory, removed at the end unless ``--keep``. Figures depend on the
disk cache and on the machine's load; the load average is recorded next to them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import add_json_option, write_json  # noqa: E402

BARS_PER_DAY = 390
DAYS_PER_YEAR = 252


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def current_rss() -> int:
    """This process's resident set size in bytes (Linux /proc; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def measure(path: str) -> dict:
    """Load one file in this (fresh) process: seconds and peak memory above the post-import baseline."""
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401
    import pyarrow.csv  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from phalanx.finance.data import load_market_data

    gc.collect()
    baseline = current_rss()
    samples = [baseline]
    done = threading.Event()

    def sample() -> None:  # the resident set size every 5 ms while loading
        while not done.wait(0.005):
            samples.append(current_rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    data = load_market_data(path)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    samples.append(current_rss())
    peak = max(samples)
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    arrays = [data.close, data.open, data.high, data.low, data.volume]
    filled = sum(v["filled"] for v in data.missing.values())
    return {
        "file": Path(path).name,
        "file_mb": round(os.path.getsize(path) / 2**20, 1),
        "load_s": round(seconds, 2),
        "peak_rss_above_imports_mb": round((peak - baseline) / 2**20, 1),
        "rss_after_imports_mb": round(baseline / 2**20, 1),
        "process_max_rss_mb": round(max(max_rss, peak) / 2**20, 1),
        "result_mb": round(sum(a.nbytes for a in arrays if a is not None) / 2**20, 1),
        "bars": data.num_bars,
        "tickers": data.num_tickers,
        "forward_filled_bars": filled,
        "dropped_bars": sum(v["dropped"] for v in data.missing.values()),
    }


def generate(directory: Path, tickers: int, years: int, csv_tickers: int, missing: float, seed: int) -> dict:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from phalanx.finance.data import synthetic_market

    bars = years * DAYS_PER_YEAR * BARS_PER_DAY
    start = time.perf_counter()
    market = synthetic_market(
        tickers, bars, freq="1min", start="2018-01-02", seed=seed, missing_fraction=missing
    )
    generate_s = time.perf_counter() - start
    parquet_path, csv_path = directory / "bars.parquet", directory / "bars.csv"
    rows = csv_rows = 0
    start = time.perf_counter()
    writer = None
    for first in range(0, tickers, 10):
        chunk = market.tickers[first : first + 10]
        table = pa.Table.from_pandas(market.to_frame(chunk), preserve_index=False)
        if writer is None:
            writer = pq.ParquetWriter(parquet_path, table.schema)
        writer.write_table(table)
        rows += table.num_rows
    writer.close()
    parquet_s = time.perf_counter() - start
    csv_s = None
    if csv_tickers:
        start = time.perf_counter()
        with pcsv.CSVWriter(csv_path, pa.schema(_csv_schema())) as csv_writer:
            for first in range(0, min(csv_tickers, tickers), 10):
                chunk = market.tickers[first : min(first + 10, csv_tickers)]
                frame = market.to_frame(chunk)
                frame["ticker"] = frame["ticker"].astype(str)
                table = pa.Table.from_pandas(frame, schema=pa.schema(_csv_schema()), preserve_index=False)
                csv_writer.write_table(table)
                csv_rows += table.num_rows
        csv_s = time.perf_counter() - start
    del market
    gc.collect()
    return {
        "tickers": tickers,
        "years": years,
        "bars_per_ticker": bars,
        "missing_fraction": missing,
        "parquet_rows": rows,
        "csv_rows": csv_rows,
        "csv_tickers": min(csv_tickers, tickers),
        "generate_s": round(generate_s, 1),
        "write_parquet_s": round(parquet_s, 1),
        "write_csv_s": None if csv_s is None else round(csv_s, 1),
        "paths": [str(parquet_path)] + ([str(csv_path)] if csv_tickers else []),
    }


def _csv_schema() -> list:
    import pyarrow as pa

    return [
        ("date", pa.timestamp("ns")),
        ("ticker", pa.string()),
        ("open", pa.float32()),
        ("high", pa.float32()),
        ("low", pa.float32()),
        ("close", pa.float32()),
        ("volume", pa.float32()),
    ]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tickers", type=int, default=100)
    parser.add_argument("--years", type=int, default=5)
    parser.add_argument("--csv-tickers", type=int, default=10, help="tickers in the CSV file (0: no CSV)")
    parser.add_argument("--missing-fraction", type=float, default=0.001, help="share of (bar, ticker) absent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    add_json_option(parser)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # child process: one file
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return {}

    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="phalanx-bars-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        print(f"generating {args.tickers} tickers x {args.years} years of minute bars in {directory} ...")
        generated = generate(
            directory, args.tickers, args.years, args.csv_tickers, args.missing_fraction, args.seed
        )
        print(json.dumps({k: v for k, v in generated.items() if k != "paths"}))
        results = []
        for path in generated["paths"]:
            load_before = load_average()
            child = subprocess.run(
                [sys.executable, __file__, "--measure", path], capture_output=True, text=True, check=True
            )
            result = json.loads(child.stdout.strip().splitlines()[-1])
            result["rows"] = generated["parquet_rows"] if path.endswith(".parquet") else generated["csv_rows"]
            result["load_average_before"] = load_before
            results.append(result)
            r = result
            print(
                f"{r['file']}: {r['rows']:,} rows, {r['file_mb']} MB -> {r['bars']:,} bars x {r['tickers']} "
                f"tickers in {r['load_s']} s, peak memory {r['peak_rss_above_imports_mb']} MB above imports "
                f"(result arrays {r['result_mb']} MB); load average {load_before}"
            )
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    output = {"generated": generated, "loads": results, "cpu_count": os.cpu_count()}
    if args.json is not None:
        print(f"results: {write_json(output, args.json, 'market_data_loading')}")
    return output


if __name__ == "__main__":
    main()
