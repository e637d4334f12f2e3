"""Two data-parallel learners against one: env steps/s, updates/s and gradient samples/s.

    python benchmarks/learners.py                                   # SAC, Pendulum-v1 (built-in), 64 envs
    python benchmarks/learners.py --algo ppo --env CartPole-v1 --total-steps 262144
    python benchmarks/learners.py --learners 1,2 --seeds 0,1,2 --json results.json

Each run is ``phalanx.train`` of ``--algo`` on ``--env`` with the shipped preset's hyperparameters,
except the budget, ``num_envs`` (per learner) and the network width, once per ``--learners`` count,
alternating the order between seeds. Every learner has its own ``--num-envs`` sub-envs, so N learners
step N times the envs; the budget counts the env steps of all of them. Off-policy, every learner makes
``num_envs * updates_per_step`` updates per VecEnv step, each averaging the gradients of N batches: N
learners make 1/N of the updates of one learner for the same env steps, on N times the samples each.
"updates" are gradient steps off-policy and rollouts learned from on-policy; "gradient samples" are
the transitions behind the gradient steps (off-policy: updates x batch_size x N; on-policy: env steps
x epochs).
Time = the run's ``wall_time_s`` (learner 0's training loop; process start-up is not timed). torch
runs with 1 thread per learner. The benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402


def run(args: argparse.Namespace, seed: int, learners: int, root: Path) -> dict[str, Any]:
    import phalanx

    overrides: dict[str, Any] = {
        "seed": seed,
        "num_envs": args.num_envs,
        "total_steps": args.total_steps,
        "eval_every": 0,
        "eval_episodes": args.eval_episodes,
        "checkpoint_every": 0,
        "torch_threads": 1,
        "num_learners": learners,
        "run_dir": str(root / f"{args.algo}-{learners}-{seed}"),
    }
    if args.hidden:
        overrides["hidden_sizes"] = (args.hidden, args.hidden)
    config = phalanx.make_config(args.algo, args.env, **overrides)
    summary = phalanx.train(config, show_progress=False).summary
    hp = config.hyperparameters
    wall = summary["wall_time_s"]
    if phalanx.registry.get_algorithm(args.algo).on_policy:  # every env step is learned from `epochs` times
        samples = summary["total_steps"] * getattr(hp, "epochs", 1)
    else:  # every update averages one batch per learner
        samples = summary["updates"] * hp.batch_size * learners
    return {
        "seed": seed,
        "learners": learners,
        "wall_time_s": wall,
        "steps": summary["total_steps"],
        "updates": summary["updates"],
        "env_steps_per_s": summary["total_steps"] / wall,
        "updates_per_s": summary["updates"] / wall,
        "gradient_samples_per_s": samples / wall,
        "eval_return_mean": summary["eval_return_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algo", default="sac")
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--num-envs", type=int, default=64, help="sub-envs per learner")
    parser.add_argument("--total-steps", type=int, default=40_000)
    parser.add_argument("--hidden", type=int, default=0, help="hidden width (two layers); 0: the preset's")
    parser.add_argument("--learners", default="1,2", help="comma-separated learner counts")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-episodes", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()

    counts = [int(n) for n in args.learners.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as root:
        for seed in seeds:
            order = counts if seed % 2 == 0 else counts[::-1]
            for learners in order:
                result = run(args, seed, learners, Path(root))
                results.append(result)
                print(
                    f"seed {seed}, {learners} learner(s): {result['wall_time_s']:.1f} s, "
                    f"{result['env_steps_per_s']:,.0f} env steps/s, "
                    f"{result['updates_per_s']:,.0f} updates/s, "
                    f"eval {result['eval_return_mean']:.1f}",
                    flush=True,
                )
    rows = []
    base: dict[str, float] = {}
    for learners in counts:
        mine = [r for r in results if r["learners"] == learners]
        medians = {
            key: statistics.median(r[key] for r in mine)
            for key in ("wall_time_s", "env_steps_per_s", "updates_per_s", "gradient_samples_per_s")
        }
        base = base or medians
        rows.append(
            [
                str(learners),
                f"{mine[0]['updates']:,}",
                f"{medians['wall_time_s']:.1f}",
                *(
                    f"{medians[key]:,.0f} ({medians[key] / base[key]:.2f}x)"
                    for key in ("env_steps_per_s", "updates_per_s", "gradient_samples_per_s")
                ),
                ", ".join(f"{r['eval_return_mean']:.0f}" for r in mine),
            ]
        )
    machine = machine_info()
    print(
        f"\n{args.algo.upper()} on {args.env}, {args.num_envs} envs per learner, {args.total_steps:,} env "
        f"steps, seeds {seeds}; medians; machine: {machine['cpu']}, {machine['logical_cores']} cores, "
        f"load {machine['load_average_1_5_15min']}\n"
    )
    headers = [
        "learners",
        "updates",
        "wall (s)",
        "env steps/s",
        "updates/s",
        "gradient samples/s",
        "eval returns",
    ]
    print(markdown_table(headers, rows))
    path = write_json({"machine": machine, "args": vars(args), "results": results}, args.json, "learners")
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
