"""Multi-agent env throughput: phalanx's batched simple spread against mpe2's, through PettingZooVecEnv.

    python benchmarks/marl_throughput.py                     # 4096 phalanx envs vs 64 mpe2 envs, CPU
    python benchmarks/marl_throughput.py --device cuda --num-envs 65536
    python benchmarks/marl_throughput.py --workers 0,2 --seconds 3 --json results.json

Every variant steps simple spread (3 agents, 3 landmarks, discrete actions, 25-step episodes) with
random actions and same-step autoreset, for a warm-up and then for at least ``--seconds`` of timed
stepping:

- phalanx: ``phalanx.marl.mpe.SimpleSpread(num_envs=N, device=...)``, all sub-envs as one batch of
  tensor operations; each step draws the ``(N, 3)`` random actions on the device (``torch.randint``)
  and calls ``env.step`` (physics, rewards, time limit, autoreset, global state, episode statistics).
  On CUDA the device is synchronised before the clock is read.
- mpe2: ``PettingZooVecEnv(mpe2.simple_spread_v3.parallel_env, num_envs=M, num_workers=W)``: M copies
  of mpe2's own simple spread (numpy, one sub-env at a time), in this process (W = 0) or split over W
  worker processes (shared memory); each step draws the ``(M, 3)`` actions with ``torch.randint`` and
  returns the same tensors (observations, rewards, flags, state, final observations, statistics).

Env steps/s counts sub-env steps: (vector steps) x (sub-envs); multiply by 3 for agent steps. The
ratios are phalanx's env steps/s over each mpe2 variant's. Construction and worker start-up are not
timed. The benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, timed_steps, write_json  # noqa: E402

AGENTS = 3


def _row(name: str, vector_env: str, device: str, num_envs: int, steps: int, elapsed: float, **extra: Any):
    return {
        "name": name,
        "vector_env": vector_env,
        "device": device,
        "num_envs": num_envs,
        "vector_steps": steps,
        "seconds": elapsed,
        "env_steps_per_second": steps * num_envs / elapsed,
        "agent_steps_per_second": steps * num_envs * AGENTS / elapsed,
        **extra,
    }


def bench_phalanx(num_envs: int, device: str, warmup: int, seconds: float, seed: int = 0) -> dict[str, Any]:
    import torch

    from phalanx.marl.mpe import SimpleSpread

    env = SimpleSpread(num_envs=num_envs, device=device)
    env.reset(seed=seed)
    generator = torch.Generator(device=env.device)
    generator.manual_seed(seed)
    group = env.groups["agent"]
    num_actions = int(group.action_space.n)
    shape = (num_envs, group.num_agents)

    def step() -> None:
        env.step({"agent": torch.randint(0, num_actions, shape, device=env.device, generator=generator)})

    def sync() -> None:
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)

    steps, elapsed = timed_steps(step, sync, warmup, seconds, chunk=10)
    env.close()
    return _row(
        "phalanx",
        "phalanx.marl.mpe.SimpleSpread (batched torch simulator)",
        str(env.device),
        num_envs,
        steps,
        elapsed,
        torch_threads=torch.get_num_threads(),
    )


def bench_mpe2(num_envs: int, workers: int, warmup: int, seconds: float, seed: int = 0) -> dict[str, Any]:
    import torch
    from mpe2 import simple_spread_v3

    from phalanx.marl.adapters import PettingZooVecEnv

    start = time.perf_counter()
    env = PettingZooVecEnv(simple_spread_v3.parallel_env, num_envs=num_envs, num_workers=workers)
    startup = time.perf_counter() - start
    try:
        env.reset(seed=seed)
        generator = torch.Generator().manual_seed(seed)
        shape = (num_envs, env.groups["agent"].num_agents)

        def step() -> None:
            env.step({"agent": torch.randint(0, 5, shape, generator=generator)})

        steps, elapsed = timed_steps(step, lambda: None, warmup, seconds, chunk=10)
    finally:
        env.close()
    where = "in-process" if workers == 0 else f"{workers} worker process{'es' if workers > 1 else ''}"
    return _row(
        f"mpe2 ({where})",
        f"PettingZooVecEnv(mpe2.simple_spread_v3.parallel_env, num_workers={workers})",
        "cpu (numpy)",
        num_envs,
        steps,
        elapsed,
        num_workers=workers,
        startup_s=startup,
    )


def run(
    num_envs: int = 4096,
    mpe_envs: int = 64,
    device: str = "cpu",
    seconds: float = 3.0,
    warmup: int = 10,
    workers: tuple[int, ...] = (0, 2),
) -> dict[str, Any]:
    import mpe2
    import pettingzoo

    phalanx_row = bench_phalanx(num_envs, device, warmup, seconds)
    mpe_rows = [bench_mpe2(mpe_envs, count, warmup, seconds) for count in workers]
    for row in mpe_rows:
        row["phalanx_ratio"] = phalanx_row["env_steps_per_second"] / row["env_steps_per_second"]
    best = max(mpe_rows, key=lambda row: row["env_steps_per_second"])
    info = machine_info(device)
    info["pettingzoo"] = pettingzoo.__version__
    info["mpe2"] = getattr(mpe2, "__version__", "unknown")
    return {
        "benchmark": "marl_throughput",
        "env": "simple_spread_v3 (N=3, discrete actions, max_cycles=25)",
        "machine": info,
        "settings": {"seconds": seconds, "warmup_vector_steps": warmup, "random_actions": True},
        "results": [phalanx_row, *mpe_rows],
        "ratio_phalanx_over_best_mpe2": phalanx_row["env_steps_per_second"] / best["env_steps_per_second"],
        "best_mpe2": best["name"],
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        [
            r["name"],
            r["vector_env"],
            r["device"],
            r["num_envs"],
            r["vector_steps"],
            round(r["seconds"], 2),
            f"{r['env_steps_per_second']:,.0f}",
            f"{r['agent_steps_per_second']:,.0f}",
            f"{r['phalanx_ratio']:,.1f}x" if "phalanx_ratio" in r else "-",
        ]
        for r in result["results"]
    ]
    header = ["library", "vector env", "device", "sub-envs", "vector steps", "seconds", "env steps/s"]
    text = markdown_table([*header, "agent steps/s", "phalanx / this"], rows)
    ratio = result["ratio_phalanx_over_best_mpe2"]
    return text + f"\n\nphalanx / best mpe2 ({result['best_mpe2']}): **{ratio:,.1f}x** env steps/s"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=4096, help="phalanx sub-envs (default 4096)")
    parser.add_argument(
        "--mpe-envs", type=int, default=64, help="mpe2 copies in PettingZooVecEnv (default 64)"
    )
    parser.add_argument("--device", default="cpu", help="torch device of the phalanx env: cpu, cuda, ...")
    parser.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per variant")
    parser.add_argument("--warmup", type=int, default=10, help="untimed vector steps per variant")
    parser.add_argument(
        "--workers",
        default="0,2",
        help="comma-separated num_workers of the mpe2 variants (0: in-process), e.g. 0,2,4",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1: on a loaded 2-core machine two threads made each "
        "4096-env step 6x slower, 94 ms against 14 ms; 0 leaves torch's default)",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    workers = tuple(int(count) for count in args.workers.split(",") if count)
    result = run(args.num_envs, args.mpe_envs, args.device, args.seconds, args.warmup, workers)
    print(table(result))
    if args.json is not None:
        path = write_json(result, args.json, "marl_throughput")
        print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
