"""Does PBT pay? Tournament PBT against independent runs, same members, same env steps.

PPO on Pendulum-v1 with every member's learning rate drawn from a poor range (log-uniform in
[1e-5, 1e-4], against the preset's 1e-3). PBT: tournament selection every ``--interval`` steps, the
bottom quarter copies a tournament winner of the top and perturbs its learning rate by x0.5 or x2
(never resampled). Independent: the same members with the same initial learning rates and seeds,
never selected. Both run as one vectorized population (``--backend vectorized``) with the same env
steps per member; the final evaluation of every member is compared, best and median, over seeds.

    python benchmarks/population_pbt.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def run(seed: int, members: int, steps: int, interval: int, pbt: bool, directory: Path) -> list[float]:
    from phalanx import make_config
    from phalanx.population import Leaderboard, Mutation, PopulationConfig, run_population

    base = make_config("ppo", "Pendulum-v1", seed=seed, total_steps=steps, eval_episodes=10, torch_threads=1)
    config = PopulationConfig(
        base=base,
        size=members,
        strategy="tournament",
        interval=interval if pbt else steps,  # one interval to the end: never selected
        replace_fraction=0.25,
        backend="vectorized",
        mutations={  # drawn from the poor range once; after that only perturbed (no resampling back into it)
            "learning_rate": Mutation(
                perturb=(0.5, 2.0), log_uniform=(1e-5, 1e-4), max=1e-2, resample_probability=0.0
            )
        },
        directory=str(directory),
    )
    run_population(config, show_progress=False)
    board = Leaderboard.load(directory)
    return [m.score for m in board.members.values()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150_000, help="env steps per member")
    parser.add_argument("--interval", type=int, default=8_192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"PPO Pendulum-v1, {args.members} members x {args.steps:,} env steps, learning rates log-uniform "
        f"[1e-5, 1e-4]; PBT interval {args.interval:,}; final evaluation (10 episodes) of every member"
    )
    print(f"{'seed':>4} {'run':>12} {'best':>9} {'median':>9} {'worst':>9} {'seconds':>8}")
    summary: dict[str, list[tuple[float, float]]] = {"independent": [], "pbt": []}
    with tempfile.TemporaryDirectory() as scratch:
        for seed in args.seeds:
            for name in ("independent", "pbt"):
                started = time.perf_counter()
                scores = run(
                    seed,
                    args.members,
                    args.steps,
                    args.interval,
                    name == "pbt",
                    Path(scratch) / f"{name}{seed}",
                )
                seconds = time.perf_counter() - started
                best, median = max(scores), statistics.median(scores)
                summary[name].append((best, median))
                print(f"{seed:>4} {name:>12} {best:>9.1f} {median:>9.1f} {min(scores):>9.1f} {seconds:>8.1f}")
    for name, rows in summary.items():
        best = statistics.mean(b for b, _ in rows)
        median = statistics.mean(m for _, m in rows)
        print(f"mean over seeds  {name:>12}: best {best:.1f}, median {median:.1f}")


if __name__ == "__main__":
    main()
