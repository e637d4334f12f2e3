"""Time to solve: phalanx PPO against Stable-Baselines3 PPO (rl-baselines3-zoo hyperparameters), same machine.

    python benchmarks/time_to_solve.py                       # CartPole-v1 and Pendulum-v1, seeds 0..4
    python benchmarks/time_to_solve.py --seeds 3 --envs CartPole-v1
    python benchmarks/time_to_solve.py --json out.json
    python benchmarks/time_to_solve.py --seeds 3 --envs CartPole-v1 --figures   # + learning-curve figures

Every run is its own subprocess, and the runs go one after another (never two at once), alternating
libraries seed by seed, so that both see the same machine state:

- phalanx: the command of the project's goal, ``phalanx train ppo ENV --stop-return R --seed S``
  (``python -m phalanx.cli``), with the shipped preset. Its time is ``time_to_stop_return_s`` from the
  run's ``summary.json``.
- Stable-Baselines3: ``stable_baselines3.PPO`` with the rl-baselines3-zoo hyperparameters (``ZOO`` below,
  copied from rl_zoo3 2.9.2 ``hyperparams/ppo.yml``), a ``DummyVecEnv`` as the zoo builds it, and an
  ``EvalCallback`` with ``StopTrainingOnRewardThreshold(R)`` as ``callback_on_new_best``. Its time is
  taken by that callback when the threshold is reached.

Same protocol on both sides:

- Evaluation: ``eval_episodes`` = 10 deterministic episodes, one per sub-env of a 10-env evaluation env
  (phalanx's Evaluator; for SB3 ``evaluate_policy`` on a ``DummyVecEnv`` of 10 ``Monitor`` envs, which
  also runs exactly one episode per sub-env), every ``eval_every`` env steps; a run stops at the
  first evaluation whose mean return reaches R. Evaluation time counts on both sides.
- Wall time: ``time.perf_counter`` from the start of training (phalanx: the start of
  ``Trainer.train``; SB3: just before ``model.learn``) to the end of the evaluation that reached R.
  Python imports, env and network construction are excluded on both sides. The subprocess's total
  wall time (imports included) is recorded too, as ``process_s``.
- Threads: ``--torch-threads N`` on both sides (default 1; 0 leaves torch's default, one thread per
  core). One thread is the default because both libraries step small networks, where intra-op
  threads only add synchronisation, and because with torch's default a second process on the
  machine (a test run, another benchmark) makes every small op wait on a descheduled thread: on a
  2-core machine under load, phalanx's CartPole runs took 2-87 s with 2 threads against 1.3-4.6 s
  with 1 (BENCHMARKS.md has both settings).
- Budget: phalanx's preset ``total_steps``; SB3 ``--sb3-budget-factor`` (5) x the zoo's ``n_timesteps``.
  The zoo's linear schedules (``lin_0.001``) run over SB3's ``total_timesteps``, as with
  ``rl_zoo3.train -n <budget>``. A run that never reaches R is reported as not reached, with its steps.

Evaluation interval: phalanx uses its preset's ``eval_every`` and ``eval_process``: a copy of the
weights every 1,024 env steps (CartPole-v1, every update) or 2,048 (Pendulum-v1, every update), each
evaluated in an evaluation process on the second core while training goes on (copies that arrive
while it is busy are evaluated together, side by side). For SB3 the interval is a multiple of its
rollout (its policy only changes once per rollout): CartPole-v1 every 4,096 env steps (16 rollouts
of 8 x 32) and Pendulum-v1 every 4,096 env steps (every rollout of 4 x 1024); SB3 evaluates in its
training loop, as it does by design (more often costs it more than it gains: see BENCHMARKS.md).
Override with ``--sb3-eval-every``.

Seeds: CartPole-v1's time to 475 varies several-fold from seed to seed for both libraries, and a
median of 10 seeds moves by 20-30% with the choice of seeds; ``--seeds 30`` gives a steadier figure.

Runs kept: every run's directory stays under the results folder, ``runs/phalanx-ppo-ENV-sSEED`` (the
run directory without its checkpoints) and ``runs/sb3-ppo-ENV-sSEED`` (SB3's evaluations in the same
layout: config.yaml with ``library: sb3``, evaluations.csv), so that ``phalanx plot --group-by library``
draws the two libraries' learning curves over the seeds; ``--figures`` does that for each env, against
wall time and env steps (the commands are printed and stored in the JSON). A run stops at the threshold,
so the curves use ``--span longest``: a seed that has stopped holds its last evaluation.

The benchmark measures and reports; it does not assert a time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402
    FIGURES_DIR,
    RESULTS_DIR,
    add_json_option,
    draw_figures,
    machine_info,
    markdown_table,
    median_time,
    run_directory,
    run_logged,
    run_phalanx,
    sb3_learn_until,
    write_json,
    write_peer_run,
)

THRESHOLDS = {"CartPole-v1": 475.0, "Pendulum-v1": -200.0}
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 1_000_003  # as phalanx's trainer: evaluation envs get seed + this

# rl-baselines3-zoo 2.9.2, hyperparams/ppo.yml (checked against the rl_zoo3 wheel).
ZOO: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "n_envs": 8,
        "n_timesteps": 100_000,
        "policy": "MlpPolicy",
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": "lin_0.001",
        "clip_range": "lin_0.2",
    },
    "Pendulum-v1": {
        "n_envs": 4,
        "n_timesteps": 100_000,
        "policy": "MlpPolicy",
        "n_steps": 1024,
        "gae_lambda": 0.95,
        "gamma": 0.9,
        "n_epochs": 10,
        "ent_coef": 0.0,
        "learning_rate": 1e-3,
        "clip_range": 0.2,
        "use_sde": True,
        "sde_sample_freq": 4,
    },
}
SB3_EVAL_EVERY = {"CartPole-v1": 4096, "Pendulum-v1": 4096}


# -- the runs (each in its own subprocess) ------------------------------------------------------------
def sb3_worker(
    env_id: str, seed: int, budget_factor: float, eval_every: int, threads: int, run_dir: Path
) -> dict[str, Any]:
    """One SB3 run in this process; returns what it measured, and writes its evaluation curve to
    ``run_dir`` as a run directory that ``phalanx plot`` reads (``library: sb3``)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    if threads:
        torch.set_num_threads(threads)
    hyperparams = dict(ZOO[env_id])
    n_envs = hyperparams.pop("n_envs")
    n_timesteps = hyperparams.pop("n_timesteps")
    policy = hyperparams.pop("policy")
    normalize = hyperparams.pop("normalize", False)
    for key in ("learning_rate", "clip_range"):
        value = hyperparams.get(key)
        if isinstance(value, str) and value.startswith("lin_"):
            initial = float(value[4:])
            hyperparams[key] = lambda progress_remaining, initial=initial: progress_remaining * initial
    threshold = THRESHOLDS[env_id]
    budget = int(budget_factor * n_timesteps)

    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    eval_env = make_vec_env(env_id, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)
    if normalize:  # as the zoo: VecNormalize on training, frozen statistics for evaluation
        env = VecNormalize(env, gamma=hyperparams["gamma"])
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False, gamma=hyperparams["gamma"])
    model = PPO(policy, env, seed=seed, device="cpu", verbose=0, **hyperparams)

    measured = sb3_learn_until(model, eval_env, threshold, max(eval_every // n_envs, 1), budget)
    settings = {"library": "sb3", "algo": "ppo", "env": env_id, "seed": seed, "num_envs": n_envs}
    hyperparameters = {k: v for k, v in ZOO[env_id].items() if k not in ("n_envs", "n_timesteps")}
    write_peer_run(
        run_dir,
        {**settings, "total_steps": budget, "hyperparameters": hyperparameters},
        measured.pop("curve"),
    )
    return {
        "library": "sb3",
        "env": env_id,
        "seed": seed,
        **measured,
        "eval_every": max(eval_every // n_envs, 1) * n_envs,
        "run_dir": str(run_dir),
    }


def run_sb3(env_id: str, seed: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    eval_every = args.sb3_eval_every or SB3_EVAL_EVERY[env_id]
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--sb3-worker",
        env_id,
        str(seed),
        str(args.sb3_budget_factor),
        str(eval_every),
        str(args.torch_threads),
        str(run_directory(log_dir, f"sb3-ppo-{env_id}-s{seed}")),
    ]
    out = log_dir / f"sb3-{env_id}-s{seed}.log"
    start = time.perf_counter()
    completed, _ = run_logged(command, out, args.timeout)
    process_s = time.perf_counter() - start
    lines = [line for line in out.read_text().splitlines() if line.startswith("RESULT ")]
    if completed != 0 or not lines:
        return {
            "library": "sb3",
            "env": env_id,
            "seed": seed,
            "reached": False,
            "error": f"exit {completed}",
            "process_s": process_s,
            "time_to_solve_s": None,
            "steps": None,
        }
    result = json.loads(lines[-1][len("RESULT ") :])
    result["process_s"] = process_s
    return result


# -- aggregation and report ---------------------------------------------------------------------------
def summarize(runs: list[dict[str, Any]], envs: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for env_id in envs:
        entry: dict[str, Any] = {"threshold": THRESHOLDS[env_id]}
        for library in ("phalanx", "sb3"):
            mine = [r for r in runs if r["env"] == env_id and r["library"] == library]
            if not mine:
                continue
            reached = [r for r in mine if r.get("reached")]
            entry[library] = {
                "runs": len(mine),
                "reached": len(reached),
                "median_time_to_solve_s": _finite(median_time(mine)),
                "median_steps_reached": statistics.median(r["steps"] for r in reached) if reached else None,
            }
        phalanx, sb3 = entry.get("phalanx"), entry.get("sb3")
        if phalanx and sb3 and phalanx["median_time_to_solve_s"] and sb3["median_time_to_solve_s"]:
            entry["ratio_sb3_over_phalanx"] = (
                sb3["median_time_to_solve_s"] / phalanx["median_time_to_solve_s"]
            )
        summary[env_id] = entry
    return summary


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def tables(result: dict[str, Any]) -> str:
    out = []
    for env_id, entry in result["summary"].items():
        rows = []
        seeds = sorted({r["seed"] for r in result["runs"] if r["env"] == env_id})
        for seed in seeds:
            row: list[Any] = [seed]
            for library in ("phalanx", "sb3"):
                run = next(
                    (
                        r
                        for r in result["runs"]
                        if r["env"] == env_id and r["library"] == library and r["seed"] == seed
                    ),
                    None,
                )
                row += _cells(run)
            rows.append(row)
        medians: list[Any] = ["**median**"]
        for library in ("phalanx", "sb3"):
            stats = entry.get(library)
            if stats is None:
                medians += ["-", "-"]
                continue
            time_cell = (
                f"**{stats['median_time_to_solve_s']:.1f}**"
                if stats["median_time_to_solve_s"]
                else "not reached"
            )
            steps_cell = f"{stats['median_steps_reached']:,.0f}" if stats["median_steps_reached"] else "-"
            medians += [f"{time_cell} ({stats['reached']}/{stats['runs']} reached)", steps_cell]
        rows.append(medians)
        header = ["seed", "phalanx time to solve (s)", "phalanx steps", "SB3 time to solve (s)", "SB3 steps"]
        ratio = entry.get("ratio_sb3_over_phalanx")
        title = f"### {env_id}: PPO to a deterministic evaluation mean >= {entry['threshold']:g}"
        footer = (
            f"\nSB3 median / phalanx median: **{ratio:.1f}x**"
            if ratio
            else "\nSB3 median / phalanx median: n/a (a median did not reach the threshold)"
        )
        out.append(f"{title}\n\n{markdown_table(header, rows)}\n{footer}")
    return "\n\n".join(out)


def _cells(run: dict[str, Any] | None) -> list[Any]:
    if run is None:
        return ["-", "-"]
    if run.get("error"):
        return [f"failed ({run['error']})", "-"]
    if not run["reached"]:
        return [
            f"not reached (last eval {run.get('last_eval_return', float('nan')):.0f})",
            f"{run['steps']:,}",
        ]
    return [f"{run['time_to_solve_s']:.1f}", f"{run['steps']:,}"]


def figures(log_dir: Path, envs: list[str], directory: Path) -> list[dict[str, Any]]:
    """The learning curves of phalanx's runs and SB3's over the seeds, per env, against wall time and
    env steps (the runs kept under ``log_dir/runs``)."""
    return [
        {
            "runs": str(log_dir / "runs" / f"*-ppo-{env_id}-s*"),
            "x": x,
            "output": directory / f"time_to_solve_{env_id}_{x}.png",
            "title": f"PPO on {env_id} to {THRESHOLDS[env_id]:g}: phalanx vs SB3 (rl-zoo hyperparameters)",
        }
        for env_id in envs
        for x in ("time", "steps")
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--sb3-worker":
        env_id, seed, factor, eval_every, threads, run_dir = argv[1:7]
        result = sb3_worker(env_id, int(seed), float(factor), int(eval_every), int(threads), Path(run_dir))
        print("RESULT " + json.dumps(result), flush=True)
        return result

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per library and env (default 5)")
    parser.add_argument("--envs", default="CartPole-v1,Pendulum-v1", help="comma-separated env ids")
    parser.add_argument("--libraries", default="phalanx,sb3", help="comma-separated: phalanx, sb3")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="torch threads for both (default 1; 0: torch default)"
    )
    parser.add_argument(
        "--sb3-budget-factor", type=float, default=5.0, help="SB3 budget = this x zoo n_timesteps"
    )
    parser.add_argument("--sb3-eval-every", type=int, default=0, help="SB3 env steps between evaluations")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    parser.add_argument(
        "--figures",
        nargs="?",
        const=str(FIGURES_DIR),
        default=None,
        metavar="DIR",
        help="draw the learning curves of the runs, phalanx against SB3 over the seeds, with `phalanx plot` "
        f"into DIR (no DIR: {FIGURES_DIR.relative_to(FIGURES_DIR.parent.parent)}): "
        "time_to_solve_ENV_time.png and time_to_solve_ENV_steps.png",
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    envs = [e for e in args.envs.split(",") if e]
    libraries = [lib for lib in args.libraries.split(",") if lib]
    for env_id in envs:
        if env_id not in THRESHOLDS:
            parser.error(f"--envs: {env_id!r} has no threshold; choose from {sorted(THRESHOLDS)}")

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="time_to_solve-", dir=RESULTS_DIR))
    machine = machine_info()
    machine["torch_threads"] = args.torch_threads or machine["torch_threads"]
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    for env_id in envs:
        for seed in range(args.seeds):
            for library in libraries:
                if library == "phalanx":
                    run = run_phalanx(
                        "ppo", env_id, THRESHOLDS[env_id], seed, args.torch_threads, log_dir, args.timeout
                    )
                else:
                    run = run_sb3(env_id, seed, args, log_dir)
                runs.append(run)
                shown = f"{run['time_to_solve_s']:.1f} s" if run.get("reached") else "not reached"
                print(f"{env_id} seed {seed} {library:8s} {shown} ({run.get('steps')} steps)", flush=True)
    result = {
        "benchmark": "time_to_solve",
        "machine": machine,
        "load_average_after": machine_info()["load_average_1_5_15min"],
        "total_benchmark_s": time.perf_counter() - started,
        "settings": {
            "seeds": list(range(args.seeds)),
            "eval_episodes": EVAL_EPISODES,
            "thresholds": {e: THRESHOLDS[e] for e in envs},
            "sb3_zoo_hyperparameters": {e: ZOO[e] for e in envs},
            "sb3_budget_factor": args.sb3_budget_factor,
            "sb3_eval_every": {e: args.sb3_eval_every or SB3_EVAL_EVERY[e] for e in envs},
            "torch_threads": args.torch_threads or "default",
            "timing": "perf_counter from the start of training to the evaluation that reached the threshold; "
            "imports and construction excluded on both sides",
            "logs": str(log_dir),
        },
        "runs": runs,
        "summary": summarize(runs, envs),
    }
    if args.figures is not None:
        result["figures"] = draw_figures(figures(log_dir, envs, Path(args.figures)))
    print()
    print(tables(result))
    for command in result.get("figures", []):
        print(command)
    path = write_json(result, args.json, "time_to_solve")
    print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
