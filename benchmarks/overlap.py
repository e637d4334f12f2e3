"""Double buffering (``overlap``) against the plain loop: PPO rollout collection through worker processes.

    python benchmarks/overlap.py                       # HalfCheetah-v5, 16 envs, 2 workers, PPO
    python benchmarks/overlap.py --env gym:CartPole-v1 --num-envs 64
    python benchmarks/overlap.py --json results.json

Both sides build the training env exactly as ``phalanx train`` does (``build_env`` with the PPO preset of
the env, NaN guard, action rescale, normalisation) and time ``Worker.collect`` of a rollout of
``--horizon`` steps, the part of an iteration that double buffering changes; updates are not run, so
the policy is the same fresh network on both sides. Plain: the policy acts for all sub-envs, then they
all step. Overlap: the policy computes one half's actions while the other half steps. The policy's
cost is varied with ``--hidden`` (the preset's 64x64, and larger networks) since what overlap can hide
is the smaller of the policy's time and the env's time. Repeats alternate the two sides; medians.
The benchmark measures; it does not assert a number.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402


def collection_rate(config, horizon: int, rollouts: int) -> float:
    """Env steps per second of ``rollouts`` timed rollouts (after one warm-up rollout)."""
    from phalanx.buffers import RolloutBuffer, StepLayout
    from phalanx.registry import get_algorithm
    from phalanx.train.environments import build_env
    from phalanx.train.worker import Worker

    env = build_env(config, config.num_envs, training=True)
    try:
        algorithm = get_algorithm(config.algo)(
            config.hyperparameters, env.single_observation_space, env.single_action_space, torch.device("cpu")
        )
        obs_shape, action_shape = env.single_observation_space.shape, env.single_action_space.shape
        layout = StepLayout(obs_shape, torch.float32, action_shape, torch.float32)
        buffer = RolloutBuffer(horizon, config.num_envs, layout, torch.device("cpu"))
        worker = Worker(env, algorithm)
        worker.reset(seed=0)
        with torch.no_grad():
            worker.collect(buffer)
            start = time.perf_counter()
            for _ in range(rollouts):
                worker.collect(buffer)
            elapsed = time.perf_counter() - start
    finally:
        env.close()
    return rollouts * horizon * config.num_envs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=128)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", default="64,256,1024", help="policy widths to try (two layers each)")
    add_json_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from phalanx.config import make_config

    rows, results = [], []
    for width in [int(w) for w in args.hidden.split(",")]:
        base = make_config(
            "ppo", args.env, num_envs=args.num_envs, num_workers=args.num_workers, torch_threads=1
        )
        base.hyperparameters = dataclasses.replace(base.hyperparameters, hidden_sizes=(width, width))
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for overlap in (False, True):
                config = dataclasses.replace(base, overlap=overlap)
                rates[overlap].append(collection_rate(config, args.horizon, args.rollouts))
        plain, overlapped = statistics.median(rates[False]), statistics.median(rates[True])
        results.append({"hidden": width, "plain": rates[False], "overlap": rates[True]})
        rows.append([f"{width}x{width}", f"{plain:,.0f}", f"{overlapped:,.0f}", f"{overlapped / plain:.2f}x"])
        print(f"{width}x{width}: plain {plain:,.0f}  overlap {overlapped:,.0f} env steps/s", flush=True)
    machine = machine_info()
    print(
        f"\n{args.env}, {args.num_envs} envs, {args.num_workers} workers, PPO collection, horizon "
        f"{args.horizon}, median of {args.repeats}; machine: {machine['cpu']}, {machine['logical_cores']} "
        f"cores, load {machine['load_average_1_5_15min']}\n"
    )
    print(markdown_table(["policy", "plain env steps/s", "overlap env steps/s", "overlap / plain"], rows))
    path = write_json({"machine": machine, "args": vars(args), "results": results}, args.json, "overlap")
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
