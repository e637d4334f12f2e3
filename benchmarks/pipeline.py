"""Pipelined against synchronous off-policy training: wall time for equal env steps and updates.

    python benchmarks/pipeline.py                                  # SAC, HalfCheetah-v5, 16 envs, 2 workers
    python benchmarks/pipeline.py --env Pendulum-v1 --num-envs 1024 --num-workers 0 --total-steps 262144
    python benchmarks/pipeline.py --updates-per-step 1,0.0625 --seeds 0,1,2 --json results.json
    python benchmarks/pipeline.py --hidden 64 --batch-size 64 --updates-per-step 0.0625   # cheap updates

Each run is ``phalanx.train`` of SAC on ``--env`` with the shipped preset's hyperparameters, except
what the flags set (budget, warm-up, update-to-data ratio, network width), once with ``pipeline=False``
and once with ``pipeline=True``, alternating, for every seed and every ``--updates-per-step``. Both
modes make the same env steps and the same number of updates (checked: the script stops if they
differ). Time = the run's ``wall_time_s`` (construction and worker start-up are not timed; the final
evaluation is, and takes the same time in both modes); "training" is the time at the last training
step, before that evaluation (the metrics row logged there). The evaluation return is the final
deterministic evaluation (``--eval-episodes`` episodes). torch runs with 1 thread. The benchmark
measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402


def run(args: argparse.Namespace, seed: int, ratio: float, pipeline: bool, root: Path) -> dict[str, Any]:
    import phalanx

    overrides: dict[str, Any] = {
        "seed": seed,
        "num_envs": args.num_envs,
        "num_workers": args.num_workers,
        "total_steps": args.total_steps,
        "learning_starts": args.learning_starts,
        "updates_per_step": ratio,
        "eval_every": 0,
        "eval_episodes": args.eval_episodes,
        "checkpoint_every": 0,
        "log_every": args.total_steps,  # a metrics row at the last training step, before the evaluation
        "torch_threads": 1,
        "pipeline": pipeline,
        "run_dir": str(root / f"{args.env}-{ratio}-{seed}-{'pipe' if pipeline else 'sync'}"),
    }
    if args.hidden:
        overrides["hidden_sizes"] = (args.hidden, args.hidden)
    if args.batch_size:
        overrides["batch_size"] = args.batch_size
    result = phalanx.train(phalanx.make_config("sac", args.env, **overrides), show_progress=False)
    summary = result.summary
    with (result.run_dir / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))  # the training rows (evaluations are in evaluations.csv)
    return {
        "seed": seed,
        "updates_per_step": ratio,
        "pipeline": pipeline,
        "wall_time_s": summary["wall_time_s"],
        "training_time_s": float(rows[-1]["wall_time_s"]),
        "steps": summary["total_steps"],
        "updates": summary["updates"],
        "eval_return_mean": summary["eval_return_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--total-steps", type=int, default=24_000)
    parser.add_argument("--learning-starts", type=int, default=4_000)
    parser.add_argument("--updates-per-step", default="0.0625,0.25", help="comma-separated ratios")
    parser.add_argument("--hidden", type=int, default=0, help="hidden width (two layers); 0: the preset's")
    parser.add_argument("--batch-size", type=int, default=0, help="transitions per update; 0: the preset's")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-episodes", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    ratios = [float(r) for r in args.updates_per_step.split(",")]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as root:
        for ratio in ratios:
            for seed in seeds:
                pair = [
                    run(args, seed, ratio, pipeline, Path(root))
                    for pipeline in (seed % 2 == 1, seed % 2 == 0)
                ]
                sync, pipe = sorted(pair, key=lambda r: r["pipeline"])
                if (sync["steps"], sync["updates"]) != (pipe["steps"], pipe["updates"]):
                    raise SystemExit(f"steps/updates differ: {sync} against {pipe}")
                results += pair
                print(
                    f"ratio {ratio} seed {seed}: sync {sync['wall_time_s']:.1f} s, pipelined "
                    f"{pipe['wall_time_s']:.1f} s, {sync['updates']:,} updates; eval "
                    f"{sync['eval_return_mean']:.1f} / {pipe['eval_return_mean']:.1f}",
                    flush=True,
                )
    rows = []
    for ratio in ratios:

        def pick(pipeline: bool, key: str, ratio: float = ratio) -> list[float]:
            return [r[key] for r in results if r["updates_per_step"] == ratio and r["pipeline"] == pipeline]

        sync_t, pipe_t = (
            statistics.median(pick(False, "wall_time_s")),
            statistics.median(pick(True, "wall_time_s")),
        )
        sync_train, pipe_train = (
            statistics.median(pick(False, "training_time_s")),
            statistics.median(pick(True, "training_time_s")),
        )
        sync_r, pipe_r = pick(False, "eval_return_mean"), pick(True, "eval_return_mean")
        rows.append(
            [
                f"{ratio:g}",
                f"{pick(False, 'updates')[0]:,}",
                f"{sync_t:.1f}",
                f"{pipe_t:.1f}",
                f"**{sync_t / pipe_t:.2f}x**",
                f"{sync_train:.1f} / {pipe_train:.1f} = **{sync_train / pipe_train:.2f}x**",
                ", ".join(f"{r:.0f}" for r in sync_r),
                ", ".join(f"{r:.0f}" for r in pipe_r),
            ]
        )
    machine = machine_info()
    print(
        f"\nSAC on {args.env}, {args.num_envs} envs, {args.num_workers} workers, "
        f"{args.total_steps:,} env steps (warm-up {args.learning_starts:,}), seeds {seeds}; medians; "
        f"machine: {machine['cpu']}, "
        f"{machine['logical_cores']} cores, load {machine['load_average_1_5_15min']}\n"
    )
    headers = [
        "updates per env step",
        "updates",
        "sync wall (s)",
        "pipelined wall (s)",
        "sync / pipelined",
        "training only: sync / pipelined",
        "sync eval returns",
        "pipelined eval returns",
    ]
    print(markdown_table(headers, rows))
    path = write_json({"machine": machine, "args": vars(args), "results": results}, args.json, "pipeline")
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
