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
"""

from __future__ import annotations

import argparse
import sys
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
    add_json_option(parser)
    args = parser.parse_args(argv)
    threads = tuple(int(count) for count in args.threads.split(",") if count)
    result = run(args.num_envs, args.gym_envs, args.device, args.seconds, args.warmup, threads)
    print(table(result))
    if args.json is not None:
        path = write_json(result, args.json, "env_throughput")
        print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
