"""Env throughput: phalanx's built-in batched CartPole-v1 against Gymnasium's SyncVectorEnv, same script.

    python benchmarks/env_throughput.py                      # 65,536 phalanx envs vs 64 Gymnasium envs, CPU
    python benchmarks/env_throughput.py --device cuda --num-envs 1048576
    python benchmarks/env_throughput.py --json results.json

Both sides step random actions, with autoreset, for a warm-up and then for at least ``--seconds`` of
timed stepping:

- phalanx: ``phalanx.make_env("CartPole-v1", num_envs=N, device=...)``; each step draws the N random
  actions on the device as one batch (``torch.randint``), then calls ``env.step`` (physics, rewards,
  termination, time limit, autoreset, episode statistics: everything stays on the device). On CUDA the
  device is synchronised before the clock is read.
- Gymnasium: ``gymnasium.vector.SyncVectorEnv`` of ``--gym-envs`` ``gymnasium.make("CartPole-v1")``;
  each step samples ``envs.action_space.sample()`` and calls ``envs.step``.

Env steps/s counts sub-env steps: (steps of the vector env) x (number of sub-envs). The ratio is
phalanx's steps/s over Gymnasium's. The benchmark measures; it does not assert a number.

Eager against compiled (``env.compile()``: the whole step as one ``torch.compile`` graph)::

    python benchmarks/env_throughput.py --compiled-sizes 4,1024,65536,1048576 --repeats 5
    python benchmarks/env_throughput.py --compiled-sizes 4,1024 --fresh-compile-cache  # a first compile
    python benchmarks/env_throughput.py --compiled-sizes 1024 --threads 1  # both with 1 torch thread

For each size, an eager and a compiled env step in turn, ``--repeats`` times for ``--seconds`` each;
the table gives the medians. The compile time is that of the compiled env's first step (tracing,
inductor's C++ build, or loading it from torch's on-disk cache when an earlier run built the same
graph; ``--fresh-compile-cache`` points torch at an empty cache: the cost of a first run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, timed_steps, write_json  # noqa: E402

ENV_ID = "CartPole-v1"


def bench_phalanx(num_envs: int, device: str, warmup: int, seconds: float, seed: int = 0) -> dict[str, Any]:
    import torch

    import phalanx

    env = phalanx.make_env(ENV_ID, num_envs=num_envs, device=device, seed=seed)
    generator = torch.Generator(device=env.device)
    generator.manual_seed(seed)
    num_actions = int(env.single_action_space.n)

    def step() -> None:
        actions = torch.randint(0, num_actions, (num_envs,), device=env.device, generator=generator)
        env.step(actions)

    def sync() -> None:
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)

    steps, elapsed = timed_steps(step, sync, warmup, seconds, chunk=10)
    return {
        "name": "phalanx",
        "vector_env": f"phalanx.make_env({ENV_ID!r}) (built-in batched torch simulator)",
        "device": str(env.device),
        "num_envs": num_envs,
        "vector_steps": steps,
        "seconds": elapsed,
        "env_steps_per_second": steps * num_envs / elapsed,
    }


def bench_compiled(
    sizes: tuple[int, ...], device: str, warmup: int, seconds: float, repeats: int, seed: int = 0
) -> list[dict[str, Any]]:
    """Eager against compiled CartPole steps at each of ``sizes``, alternating, medians of ``repeats``."""
    import statistics
    import time

    import torch

    import phalanx

    rows = []
    for num_envs in sizes:
        envs = {
            mode: phalanx.make_env(ENV_ID, num_envs=num_envs, device=device, seed=seed)
            for mode in ("eager", "compiled")
        }
        generator = torch.Generator(device=envs["eager"].device).manual_seed(seed)

        def sync(env: Any = envs["eager"]) -> None:
            if env.device.type == "cuda":
                torch.cuda.synchronize(env.device)

        start = time.perf_counter()
        envs["compiled"].compile()
        envs["compiled"].step(torch.zeros(num_envs, dtype=torch.int64, device=envs["compiled"].device))
        sync()
        compile_seconds = time.perf_counter() - start
        rates: dict[str, list[float]] = {"eager": [], "compiled": []}
        for _ in range(repeats):
            for mode, env in envs.items():

                def step(env: Any = env, shape: tuple[int] = (num_envs,), draws: Any = generator) -> None:
                    env.step(torch.randint(0, 2, shape, device=env.device, generator=draws))

                steps, elapsed = timed_steps(step, sync, warmup, seconds, chunk=10)
                rates[mode].append(steps * num_envs / elapsed)
        eager, compiled = statistics.median(rates["eager"]), statistics.median(rates["compiled"])
        rows.append(
            {
                "num_envs": num_envs,
                "device": str(envs["eager"].device),
                "eager_env_steps_per_second": eager,
                "compiled_env_steps_per_second": compiled,
                "speedup": compiled / eager,
                "compile_seconds": compile_seconds,
                "repeats": {mode: values for mode, values in rates.items()},
            }
        )
    return rows


def compiled_table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(
        ["sub-envs", "device", "eager env steps/s", "compiled env steps/s", "compiled / eager", "compile s"],
        [
            [
                row["num_envs"],
                row["device"],
                f"{row['eager_env_steps_per_second']:,.0f}",
                f"{row['compiled_env_steps_per_second']:,.0f}",
                f"{row['speedup']:.2f}x",
                f"{row['compile_seconds']:.1f}",
            ]
            for row in rows
        ],
    )


def bench_gymnasium(num_envs: int, warmup: int, seconds: float, seed: int = 0) -> dict[str, Any]:
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(num_envs)])
    envs.reset(seed=seed)
    envs.action_space.seed(seed)

    def step() -> None:
        envs.step(envs.action_space.sample())

    steps, elapsed = timed_steps(step, lambda: None, warmup, seconds, chunk=100)
    envs.close()
    return {
        "name": "gymnasium",
        "vector_env": f"gymnasium.vector.SyncVectorEnv of gymnasium.make({ENV_ID!r})",
        "device": "cpu (numpy)",
        "num_envs": num_envs,
        "vector_steps": steps,
        "seconds": elapsed,
        "env_steps_per_second": steps * num_envs / elapsed,
    }


def run(
    num_envs: int = 65_536,
    gym_envs: int = 64,
    device: str = "cpu",
    seconds: float = 5.0,
    warmup: int = 20,
    threads: tuple[int, ...] = (0,),
) -> dict[str, Any]:
    """phalanx once per torch thread setting in ``threads`` (0: torch's default), then Gymnasium."""
    import torch

    default_threads = torch.get_num_threads()
    rows = []
    for count in threads:
        torch.set_num_threads(count or default_threads)
        row = bench_phalanx(num_envs, device, warmup, seconds)
        row["torch_threads"] = torch.get_num_threads()
        rows.append(row)
    torch.set_num_threads(default_threads)
    gymnasium_row = bench_gymnasium(gym_envs, warmup * 10, seconds)
    for row in rows:
        row["ratio_over_gymnasium"] = row["env_steps_per_second"] / gymnasium_row["env_steps_per_second"]
    best = max(rows, key=lambda row: row["env_steps_per_second"])
    return {
        "benchmark": "env_throughput",
        "env": ENV_ID,
        "machine": machine_info(device),
        "settings": {"seconds": seconds, "warmup_vector_steps": warmup, "random_actions": True},
        "results": [*rows, gymnasium_row],
        "ratio_phalanx_over_gymnasium": best["ratio_over_gymnasium"],
        "ratio_torch_threads": best["torch_threads"],
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        [
            r["name"],
            r["vector_env"],
            r["device"],
            r.get("torch_threads", "-"),
            r["num_envs"],
            r["vector_steps"],
            round(r["seconds"], 2),
            f"{r['env_steps_per_second']:,.0f}",
            f"{r['ratio_over_gymnasium']:,.1f}x" if "ratio_over_gymnasium" in r else "1x",
        ]
        for r in result["results"]
    ]
    header = ["library", "vector env", "device", "torch threads", "sub-envs", "vector steps", "seconds"]
    text = markdown_table([*header, "env steps/s", "vs Gymnasium"], rows)
    return (
        text
        + f"\n\nphalanx / Gymnasium: **{result['ratio_phalanx_over_gymnasium']:,.1f}x** env steps/s"
        + f" (phalanx with {result['ratio_torch_threads']} torch thread(s))"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=65_536, help="phalanx sub-envs (default 65536)")
    parser.add_argument(
        "--gym-envs", type=int, default=64, help="Gymnasium SyncVectorEnv sub-envs (default 64)"
    )
    parser.add_argument("--device", default="cpu", help="torch device of the phalanx env: cpu, cuda, ...")
    parser.add_argument("--seconds", type=float, default=5.0, help="minimum timed seconds per side")
    parser.add_argument("--warmup", type=int, default=20, help="phalanx warm-up steps (Gymnasium: 10x)")
    parser.add_argument(
        "--threads",
        default="0",
        help="comma-separated torch thread counts to run phalanx with (0: torch's default), e.g. 1,0",
    )
    parser.add_argument(
        "--compiled-sizes",
        default="",
        help="comma-separated sub-env counts to compare eager and compiled phalanx steps at (instead of "
        "the comparison with Gymnasium), e.g. 4,1024,65536,1048576",
    )
    parser.add_argument("--repeats", type=int, default=5, help="eager/compiled alternations per size")
    parser.add_argument(
        "--fresh-compile-cache",
        action="store_true",
        help="compile into an empty torch cache (the cost of a first run), not the shared on-disk one",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    threads = tuple(int(count) for count in args.threads.split(",") if count)
    if args.compiled_sizes:
        if args.fresh_compile_cache:  # read by inductor when it first compiles
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="phalanx-inductor-")
        sizes = tuple(int(size) for size in args.compiled_sizes.split(",") if size)
        if threads[0]:  # before compiling: inductor builds its kernels for this many OpenMP threads
            import torch

            torch.set_num_threads(threads[0])
        rows = bench_compiled(sizes, args.device, args.warmup, args.seconds, args.repeats)
        result = {
            "benchmark": "env_throughput_compiled",
            "env": ENV_ID,
            "machine": machine_info(args.device),
            "settings": {
                "torch_threads": threads[0] or "default",
                "seconds": args.seconds,
                "repeats": args.repeats,
                "fresh_compile_cache": args.fresh_compile_cache,
            },
            "results": rows,
        }
        print(compiled_table(rows))
        if args.json is not None:
            print(f"\nwrote {write_json(result, args.json, 'env_throughput_compiled')}")
        return result
    result = run(args.num_envs, args.gym_envs, args.device, args.seconds, args.warmup, threads)
    print(table(result))
    if args.json is not None:
        path = write_json(result, args.json, "env_throughput")
        print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
