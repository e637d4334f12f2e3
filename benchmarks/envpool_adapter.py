"""EnvPool adapter overhead: raw EnvPool (numpy in/out) against phalanx's EnvPoolVecEnv (torch in/out).

    python benchmarks/envpool_adapter.py                       # HalfCheetah-v5, 16 envs, 5 repeats
    python benchmarks/envpool_adapter.py --env Pong-v5 --num-envs 8 --repeats 3
    python benchmarks/envpool_adapter.py --json results.json

Both sides step the same EnvPool pool configuration (``envpool.make(ENV, env_type="gymnasium",
num_envs=N, num_threads=...)``, synchronous mode) with the same random actions, for a warm-up and
then for at least ``--seconds`` of timed stepping per repeat:

- raw EnvPool: ``pool.step(actions)`` with numpy actions in EnvPool's own dtype (float64 for MuJoCo);
  EnvPool resets an ended sub-env on its next step (next-step autoreset).
- phalanx adapter: ``phalanx.make_env("envpool:ENV", num_envs=N)`` (:class:`EnvPoolVecEnv`) with float32
  torch actions; every step converts actions to numpy, observations, rewards and flags to CPU torch
  tensors, resets ended sub-envs in the same step, and keeps the episode statistics.

The random actions are drawn once, before timing (a bank of 256 batches cycled through), so that
both sides time the environment and the conversions, not the random number generator. The repeats
alternate between the two sides so that a change in the machine's load affects both; the table
reports the median over repeats. Env steps/s counts sub-env steps: (vector steps) x (sub-envs).
torch runs with ``--torch-threads`` threads (default 1). The benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

ENV_ID = "HalfCheetah-v5"
ACTION_BANK = 256  # action batches drawn before timing and cycled through


def _timed(
    step: Callable[[int], None], warmup_steps: int, min_seconds: float, chunk: int = 50
) -> tuple[int, float]:
    """Run ``step(i)`` warmup_steps times, then in chunks until min_seconds have passed: (steps, seconds)."""
    for i in range(warmup_steps):
        step(i)
    steps = 0
    start = time.perf_counter()
    while True:
        for _ in range(chunk):
            step(steps)
            steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return steps, elapsed


def _action_bank(pool: Any, num_envs: int, seed: int) -> Any:
    """``ACTION_BANK`` batches of uniformly random actions of ``pool``'s space, as numpy arrays."""
    import gymnasium as gym
    import numpy as np

    space = pool.action_space
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=(ACTION_BANK, num_envs))
    low = np.broadcast_to(space.low, space.shape)
    high = np.broadcast_to(space.high, space.shape)
    return rng.uniform(low, high, size=(ACTION_BANK, num_envs, *space.shape)).astype(np.float32)


def _make_pool(env_id: str, num_envs: int, num_threads: int, seed: int) -> Any:
    import envpool

    with warnings.catch_warnings():  # EnvPool's float64-bounds cast warning, as in the adapter
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        pool = envpool.make(
            env_id, env_type="gymnasium", num_envs=num_envs, num_threads=num_threads, seed=seed
        )
        pool.reset()
    return pool


def bench_raw(
    env_id: str, num_envs: int, num_threads: int, actions: Any, warmup: int, seconds: float
) -> float:
    """Env steps/s of EnvPool itself, numpy actions in EnvPool's action dtype."""
    import numpy as np

    pool = _make_pool(env_id, num_envs, num_threads, seed=0)
    dtype = np.dtype(pool.spec.action_array_spec["action"].dtype)
    bank = [np.ascontiguousarray(batch, dtype=dtype) for batch in actions]

    def step(i: int) -> None:
        pool.step(bank[i % ACTION_BANK])

    steps, elapsed = _timed(step, warmup, seconds)
    pool.close()
    return steps * num_envs / elapsed


def bench_adapter(
    env_id: str, num_envs: int, num_threads: int, actions: Any, warmup: int, seconds: float
) -> float:
    """Env steps/s of ``phalanx.make_env("envpool:...")``, torch actions in, torch tensors out (CPU)."""
    import gymnasium as gym
    import torch

    import phalanx

    env = phalanx.make_env(f"envpool:{env_id}", num_envs=num_envs, seed=0, num_threads=num_threads)
    dtype = torch.int64 if isinstance(env.single_action_space, gym.spaces.Discrete) else torch.float32
    bank = [torch.as_tensor(batch).to(dtype) for batch in actions]

    def step(i: int) -> None:
        env.step(bank[i % ACTION_BANK])

    steps, elapsed = _timed(step, warmup, seconds)
    env.close()
    return steps * num_envs / elapsed


def run(
    env_id: str = ENV_ID,
    num_envs: int = 16,
    num_threads: int = 0,
    repeats: int = 5,
    seconds: float = 2.0,
    warmup: int = 100,
    torch_threads: int = 1,
) -> dict[str, Any]:
    """Alternate raw and adapter ``repeats`` times each; the medians and their ratio."""
    import envpool
    import torch

    torch.set_num_threads(torch_threads)
    probe = _make_pool(env_id, num_envs, num_threads, seed=0)
    actions = _action_bank(probe, num_envs, seed=0)
    pool_config = {key: value for key, value in probe.config.items() if key in ("num_threads", "batch_size")}
    probe.close()
    raw: list[float] = []
    adapter: list[float] = []
    for _ in range(repeats):
        raw.append(bench_raw(env_id, num_envs, num_threads, actions, warmup, seconds))
        adapter.append(bench_adapter(env_id, num_envs, num_threads, actions, warmup, seconds))
    raw_median, adapter_median = statistics.median(raw), statistics.median(adapter)
    return {
        "benchmark": "envpool_adapter",
        "env": env_id,
        "machine": {**machine_info("cpu"), "envpool": envpool.__version__},
        "settings": {
            "num_envs": num_envs,
            "envpool_num_threads_argument": num_threads,
            "envpool_pool_config": pool_config,
            "repeats": repeats,
            "seconds_per_repeat": seconds,
            "warmup_vector_steps": warmup,
            "torch_threads": torch.get_num_threads(),
            "random_actions": f"bank of {ACTION_BANK} batches drawn before timing",
        },
        "results": [
            {"name": "raw EnvPool", "io": "numpy in / numpy out", "env_steps_per_second": raw},
            {
                "name": "phalanx EnvPoolVecEnv",
                "io": "torch in / torch out (CPU)",
                "env_steps_per_second": adapter,
            },
        ],
        "median_raw": raw_median,
        "median_adapter": adapter_median,
        "ratio_adapter_over_raw": adapter_median / raw_median,
    }


def table(result: dict[str, Any]) -> str:
    settings = result["settings"]
    rows = []
    for row in result["results"]:
        values = row["env_steps_per_second"]
        median = statistics.median(values)
        rows.append(
            [
                row["name"],
                row["io"],
                settings["num_envs"],
                len(values),
                f"{median:,.0f}",
                f"{min(values):,.0f} - {max(values):,.0f}",
                f"{median / result['median_raw']:.2f}x",
            ]
        )
    header = ["side", "arrays", "sub-envs", "repeats", "median env steps/s", "range", "vs raw"]
    return (
        f"{result['env']}, {settings['num_envs']} envs, random actions, "
        f"{settings['torch_threads']} torch thread(s), EnvPool {result['machine']['envpool']} "
        f"(pool config {settings['envpool_pool_config']})\n\n"
        + markdown_table(header, rows)
        + f"\n\nadapter / raw EnvPool: **{result['ratio_adapter_over_raw']:.2f}x** median env steps/s "
        "(target: at least 0.80x, i.e. within 20% of raw EnvPool)"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default=ENV_ID, help=f"EnvPool id (default {ENV_ID})")
    parser.add_argument("--num-envs", type=int, default=16, help="sub-envs (default 16)")
    parser.add_argument(
        "--num-threads", type=int, default=0, help="EnvPool's num_threads, both sides (default 0: EnvPool's)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side, alternating (default 5)")
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="minimum timed seconds per run (default 2)"
    )
    parser.add_argument("--warmup", type=int, default=100, help="untimed vector steps per run (default 100)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads (default 1)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    result = run(
        args.env, args.num_envs, args.num_threads, args.repeats, args.seconds, args.warmup, args.torch_threads
    )
    print(table(result))
    if args.json is not None:
        path = write_json(result, args.json, "envpool_adapter")
        print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
