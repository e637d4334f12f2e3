"""Train an agent to trade 20 S&P 500 stocks (1990-2017) and backtest it out of sample (2018-2022).

StockTrading-v0 runs many portfolios in parallel over random one-year windows of the training
period; the backtest then runs the deterministic policy once over the test period, starting with
the initial cash, next to equal-weight buy-and-hold and the S&P 500 index.

    python examples/stock_trading.py                           # PPO, 1M steps: a few minutes on CPU
    python examples/stock_trading.py --algo sac --total-steps 100000
    python examples/stock_trading.py --total-steps 20000 --device cuda

The data set is skfolio's (BSD-3), vendored in phalanx/finance/data; it needs the finance extra
(pip install 'phalanx[finance]'). The result is one seed of one budget: judge it as such.
"""

from __future__ import annotations

import argparse

import phalanx
from phalanx.backtesting import BacktestResult, backtest


def main(argv: list[str] | None = None) -> BacktestResult:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algo", default="ppo", help="ppo (default) or sac: both ship a preset")
    parser.add_argument("--total-steps", type=int, default=1_000_000, help="training budget in env steps")
    parser.add_argument(
        "--num-envs", type=int, default=None, help="parallel portfolios (default: the preset)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args(argv)

    # 1. Train on 1990-2017 with the shipped preset for the pair (src/phalanx/presets/<algo>.yaml).
    overrides = {"num_envs": args.num_envs} if args.num_envs else {}
    config = phalanx.make_config(
        args.algo,
        "StockTrading-v0",
        total_steps=args.total_steps,
        seed=args.seed,
        device=args.device,
        run_dir=args.run_dir,
        **overrides,
    )
    hp = config.hyperparameters
    if args.algo == "ppo":  # with fewer envs than the preset, keep a minibatch within one rollout
        hp.minibatch_size = min(hp.minibatch_size, config.num_envs * hp.horizon)
    result = phalanx.train(config)

    # 2. Backtest on 2018-2022, never seen in training: the same as `phalanx backtest RUN_DIR`.
    report = backtest(result.run_dir, device=args.device)
    print(report.format())
    print(f"equity curve, trades and metrics: {report.out_dir}")
    return report


if __name__ == "__main__":
    main()
