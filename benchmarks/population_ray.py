"""Ray backend overhead per selection round, against the process backend, same script.

    python benchmarks/population_ray.py                          # 4 members, 8 rounds each, 2 CPUs
    python benchmarks/population_ray.py --quick                  # smoke test: 4 rounds each
    python benchmarks/population_ray.py --repeats 3 --rounds 12 --json results.json

Both backends run the same small tournament population: ``--size`` PPO members on CartPole-v1 (8
sub-envs, horizon 32, a 16x16 network, 1 torch thread each), ``--rounds`` intervals of one PPO
iteration (256 env steps) and 2 evaluation episodes per member, ``--cpus`` members at once. The
intervals are tiny on purpose: a member's interval trains for tens of milliseconds, so that what the
backend adds around it (sending the task, the member's process or actor, waiting for its report,
copying checkpoints on exploit) shows.

A selection round is one member's report (the orchestrator selects on every report of the tournament
strategy), so "per round" is the population's wall time over the number of reports. The wall time
starts when the population's directory is created and ends when its best member is exported; it
includes each backend's own start-up of members (spawning processes; creating Ray actors), but not
Ray's start-up (``ray.init``), which is timed and printed separately. "steady" excludes the first
report of every member (process spawn / actor start and the first Trainer). The overhead is Ray's
time per round minus the process backend's, and the ratio Ray's over the process backend's.
Repeats alternate the backends; the tables give the median over repeats. It measures; it asserts
nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

HORIZON = 32
NUM_ENVS = 8


def population_config(backend: str, size: int, rounds: int, cpus: int, directory: Path) -> Any:
    from phalanx import make_config
    from phalanx.population import Mutation, PopulationConfig, Resources

    interval = NUM_ENVS * HORIZON  # one PPO iteration per round
    base = make_config(
        "ppo",
        "CartPole-v1",
        num_envs=NUM_ENVS,
        total_steps=interval * rounds,
        eval_every=0,
        eval_episodes=2,
        log_every=10**9,
        torch_threads=1,
        hyperparameters={"horizon": HORIZON, "minibatch_size": 64, "epochs": 2, "hidden_sizes": (16, 16)},
    )
    return PopulationConfig(
        base=base,
        size=size,
        strategy="tournament",
        interval=interval,
        backend=backend,
        mutations={"learning_rate": Mutation(perturb=(0.8, 1.2), log_uniform=(1e-4, 1e-2))},
        resources=Resources(cpus=cpus),
        directory=str(directory),
    )


def run_once(backend: str, size: int, rounds: int, cpus: int, root: Path) -> dict[str, Any]:
    from phalanx.population import Leaderboard, run_population

    directory = root / f"{backend}-{time.monotonic_ns()}"
    config = population_config(backend, size, rounds, cpus, directory)
    started = time.perf_counter()
    run_population(config, show_progress=False)
    wall = time.perf_counter() - started
    board = Leaderboard.load(directory)
    times = sorted(score[2] for member in board.members.values() for score in member.scores)
    reports = len(times)
    first_wave = min(size, reports - 1)
    # Report times are seconds since the leaderboard was created; the steady part starts at the
    # first-wave report and ends at the last report.
    steady = (times[-1] - times[first_wave - 1]) / (reports - first_wave) if reports > first_wave else None
    finished = sum(m.status == "finished" for m in board.members.values())
    return {
        "backend": backend,
        "wall_s": wall,
        "reports": reports,
        "per_round_s": wall / reports,
        "steady_per_round_s": steady,
        "finished_members": finished,
    }


def start_ray(cpus: int) -> float:
    import ray

    started = time.perf_counter()
    ray.init(num_cpus=cpus, logging_level="ERROR", log_to_driver=False)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4, help="members (default 4)")
    parser.add_argument("--rounds", type=int, default=8, help="intervals per member (default 8)")
    parser.add_argument("--cpus", type=int, default=2, help="members at once / Ray CPUs (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per backend (default 1)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 rounds, 1 repeat")
    add_json_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.repeats = 4, 1
    try:
        import ray  # noqa: F401
    except ImportError:
        print("Ray is not installed (pip install 'phalanx[ray]'); nothing to compare.", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    import ray

    print(
        f"tournament population: {args.size} PPO members on CartPole-v1, {args.rounds} rounds of "
        f"{NUM_ENVS * HORIZON} env steps each, {args.cpus} at once, {args.repeats} repeat(s)"
    )
    ray_startup = start_ray(args.cpus)
    print(f"Ray start-up (ray.init(num_cpus={args.cpus})): {ray_startup:.2f} s (not in the figures below)")
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="phx-bench-") as root:
            for repeat in range(args.repeats):
                order = ("process", "ray") if repeat % 2 == 0 else ("ray", "process")
                for backend in order:
                    run = run_once(backend, args.size, args.rounds, args.cpus, Path(root))
                    run["repeat"] = repeat
                    runs.append(run)
                    print(
                        f"  repeat {repeat} {backend:>7}: {run['wall_s']:.2f} s, {run['reports']} reports, "
                        f"{run['per_round_s'] * 1e3:.0f} ms per round "
                        f"(steady {run['steady_per_round_s'] * 1e3:.0f} ms), "
                        f"{run['finished_members']} members finished",
                        flush=True,
                    )
    finally:
        ray.shutdown()

    def median(backend: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["backend"] == backend)

    rows = []
    summary: dict[str, Any] = {"ray_startup_s": ray_startup}
    for key, label in (("per_round_s", "all reports"), ("steady_per_round_s", "steady (after first wave)")):
        process, ray_time = median("process", key), median("ray", key)
        rows.append([label, process * 1e3, ray_time * 1e3, (ray_time - process) * 1e3, ray_time / process])
        summary[key] = {"process": process, "ray": ray_time, "overhead": ray_time - process}
    print()
    print(
        markdown_table(
            [
                "wall time per selection round",
                "process (ms)",
                "ray (ms)",
                "ray overhead (ms)",
                "ray / process",
            ],
            rows,
        )
    )
    print(f"\nRay start-up, once per orchestrator: {ray_startup:.2f} s")
    if args.json is not None:
        path = write_json(
            {"machine": machine_info(), "args": vars(args), "runs": runs, "summary": summary},
            args.json,
            "population_ray",
        )
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
