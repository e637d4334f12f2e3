"""Env throughput of StockTrading-v0: many portfolios x 20 S&P 500 stocks stepped as one batch.

    python benchmarks/trading_throughput.py                          # 4096 envs, CPU, 1 thread
    python benchmarks/trading_throughput.py --num-envs 65536 --device cuda
    python benchmarks/trading_throughput.py --json results.json

Each step draws ``num_envs x 20`` uniform actions in [-1, 1] on the device and calls ``env.step``
(trade execution, costs, valuation, reward, observation with indicators, time limit, autoreset,
episode statistics). Env steps/s counts sub-env steps: vector steps x num_envs. The construction
time (reading the vendored CSV, computing the indicators on the device) is reported apart. On CUDA
the device is synchronised before the clock is read. The benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import add_json_option, write_json  # noqa: E402


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def run(num_envs: int, device: str, seconds: float, warmup: int, threads: int, seed: int = 0) -> dict:
    import torch

    import phalanx

    if threads:
        torch.set_num_threads(threads)
    load_before = load_average()
    start = time.perf_counter()
    env = phalanx.make_env("StockTrading-v0", num_envs=num_envs, device=device, seed=seed)
    construction_s = time.perf_counter() - start
    generator = torch.Generator(device=env.device).manual_seed(seed)
    shape = (num_envs, env.single_action_space.shape[0])

    def step() -> None:
        env.step(torch.rand(shape, generator=generator, device=env.device) * 2 - 1)

    def sync() -> None:
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)

    for _ in range(warmup):
        step()
    sync()
    steps, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            step()
        steps += 10
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return {
        "env": "StockTrading-v0",
        "num_envs": num_envs,
        "stocks": shape[1],
        "device": str(env.device),
        "torch_threads": torch.get_num_threads(),
        "construction_s": round(construction_s, 3),
        "vector_steps": steps,
        "seconds": round(elapsed, 3),
        "vector_steps_per_s": round(steps / elapsed, 1),
        "env_steps_per_s": round(steps * num_envs / elapsed),
        "ms_per_vector_step": round(1000 * elapsed / steps, 3),
        "cpu": platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
        "torch": torch.__version__,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed stepping, after the warm-up")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: torch's default)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    result = run(args.num_envs, args.device, args.seconds, args.warmup, args.threads)
    print(
        f"StockTrading-v0, {result['num_envs']} envs x {result['stocks']} stocks on {result['device']} "
        f"({result['torch_threads']} thread(s)): {result['env_steps_per_s']:,} env steps/s "
        f"({result['vector_steps_per_s']} vector steps/s, {result['ms_per_vector_step']} ms each); "
        f"construction {result['construction_s']} s; load average {result['load_average_before']}"
    )
    if args.json is not None:
        print(f"results: {write_json(result, args.json, 'trading_throughput')}")
    return result


if __name__ == "__main__":
    main()
