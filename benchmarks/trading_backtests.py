"""Out-of-sample backtests of PPO and SAC on StockTrading-v0 against equal-weight buy-and-hold.

    python benchmarks/trading_backtests.py                                  # ppo and sac, seeds 0 1 2
    python benchmarks/trading_backtests.py --algos ppo --seeds 0 1 2 3 4 --ppo-steps 2000000
    python benchmarks/trading_backtests.py --json results.json --runs-dir runs/trading-study

Each (algorithm, seed) trains with the shipped preset on 1990-2017 (only ``total_steps`` and
``seed`` changed, one torch thread) and is backtested with ``phalanx.backtesting.backtest`` on
2018-2022 from the best checkpoint (chosen by the in-sample evaluation during training, so the
test period plays no part in the choice). Buy-and-hold and the index are the same for every run.
The table reports all six metrics for every run and the mean over seeds, whatever they show.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import add_json_option, write_json  # noqa: E402

from phalanx.backtesting import METRIC_LABELS, format_metric
from phalanx.finance.metrics import METRIC_NAMES


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def run(algo: str, seed: int, steps: int, runs_dir: Path) -> dict:
    import phalanx
    from phalanx.backtesting import backtest

    run_dir = runs_dir / f"{algo}-s{seed}"
    config = phalanx.make_config(
        algo, "StockTrading-v0", total_steps=steps, seed=seed, run_dir=str(run_dir), torch_threads=1
    )
    load_before = load_average()
    start = time.perf_counter()
    phalanx.train(config, show_progress=False)
    train_s = time.perf_counter() - start
    result = backtest(run_dir)
    return {
        "algo": algo,
        "seed": seed,
        "total_steps": steps,
        "train_s": round(train_s, 1),
        "load_average_before": load_before,
        "period": list(result.period),
        "metrics": result.metrics,
        "num_trades": result.num_trades,
        "total_costs": result.total_costs,
    }


def table(runs: list[dict]) -> str:
    baselines = {name: runs[0]["metrics"][name] for name in runs[0]["metrics"] if name != "agent"}
    rows = []
    for entry in runs:
        rows.append((f"{entry['algo']} seed {entry['seed']}", entry["metrics"]["agent"]))
    for algo in dict.fromkeys(entry["algo"] for entry in runs):
        mine = [entry["metrics"]["agent"] for entry in runs if entry["algo"] == algo]
        if len(mine) > 1:
            mean = {k: statistics.fmean(m[k] for m in mine) for k in METRIC_NAMES}
            rows.append((f"**{algo} mean of {len(mine)} seeds**", mean))
    labels = {"buy_and_hold": "buy & hold, equal weight", "index": "S&P 500 index (price)"}
    rows += [(labels.get(name, name), values) for name, values in baselines.items()]
    header = ["strategy", *(METRIC_LABELS[k] for k in METRIC_NAMES)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, values in rows:
        lines.append("| " + " | ".join([name, *(format_metric(k, values[k]) for k in METRIC_NAMES)]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=["ppo", "sac"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--ppo-steps", type=int, default=1_000_000)
    parser.add_argument("--sac-steps", type=int, default=100_000)
    parser.add_argument("--runs-dir", default=None, help="keep the runs here (default: a temporary dir)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    runs_dir = Path(args.runs_dir) if args.runs_dir else Path(tempfile.mkdtemp(prefix="phalanx-trading-"))
    runs = []
    for algo in args.algos:
        steps = args.ppo_steps if algo == "ppo" else args.sac_steps
        for seed in args.seeds:
            entry = run(algo, seed, steps, runs_dir)
            runs.append(entry)
            agent = entry["metrics"]["agent"]
            print(
                f"{algo} seed {seed}: {steps:,} steps in {entry['train_s']} s; out of sample "
                + ", ".join(f"{k} {format_metric(k, agent[k])}" for k in METRIC_NAMES),
                flush=True,
            )
    print(table(runs))
    if args.json is not None:
        print(f"results: {write_json(runs, args.json, 'trading_backtests')}")
    return runs


if __name__ == "__main__":
    main()
