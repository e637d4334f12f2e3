"""Time to solve, off-policy: phalanx SAC/TD3/DQN against Stable-Baselines3, same machine, same script.

    python benchmarks/offpolicy_time_to_solve.py            # sac, td3 (Pendulum), dqn (CartPole), seeds 0..4
    python benchmarks/offpolicy_time_to_solve.py --tasks sac --seeds 3
    python benchmarks/offpolicy_time_to_solve.py --json out.json

Tasks (the issue's targets):

- ``sac``: SAC on Pendulum-v1 to a deterministic evaluation mean of -200. SB3: ``stable_baselines3.SAC``
  with its constructor defaults (lr 3e-4, buffer 1e6, learning_starts 100, batch 256, tau 0.005,
  gamma 0.99, train_freq 1, gradient_steps 1, ent_coef "auto", [256, 256] networks).
- ``td3``: TD3 on Pendulum-v1 to -200. SB3: ``stable_baselines3.TD3`` with its constructor defaults
  (lr 1e-3, buffer 1e6, learning_starts 100, batch 256, tau 0.005, gamma 0.99, policy_delay 2,
  target noise 0.2 clipped at 0.5, [400, 300] networks). SB3's TD3 has no exploration noise by default;
  this script adds ``NormalActionNoise(0, 0.1)``, as SB3's documentation example does.
- ``dqn``: DQN on CartPole-v1 to 475. SB3: ``stable_baselines3.DQN`` with the rl-baselines3-zoo settings
  (``ZOO_DQN`` below, copied from rl_zoo3 2.9.2 ``hyperparams/dqn.yml``).

Every run is its own subprocess, and the runs go one after another (never two at once), alternating
libraries seed by seed, so that both see the same machine state:

- phalanx: ``phalanx train ALGO ENV --stop-return R --seed S --torch-threads T`` (``python -m
  phalanx.cli``) with the shipped preset. Its time is ``time_to_stop_return_s`` of ``summary.json``.
- SB3: the model above on ``make_vec_env(ENV, n_envs=1)``, and an ``EvalCallback`` with
  ``StopTrainingOnRewardThreshold(R)`` as ``callback_on_new_best``; its time is taken when that
  callback fires.

Same protocol on both sides:

- Evaluation: 10 deterministic episodes, one per sub-env of a 10-env evaluation env (phalanx's
  Evaluator; SB3's ``evaluate_policy`` on a ``DummyVecEnv`` of 10 ``Monitor`` envs, which runs exactly
  one episode per sub-env), every ``eval_every`` env steps: phalanx's preset value, and the same number
  of env steps for SB3 (``--sb3-eval-every`` overrides). A run stops at the first evaluation whose mean
  reaches R; evaluation time counts on both sides.
- Wall time: ``time.perf_counter`` from the start of training (phalanx: the start of ``Trainer.train``;
  SB3: just before ``model.learn``) to the end of the evaluation that reached R. Imports, env and
  network construction are excluded on both sides; the subprocess's total wall time is recorded too,
  as ``process_s``, and its CPU time as ``cpu_s`` (SB3 only; phalanx: ``process_s`` of the CLI).
- Threads: ``--torch-threads`` (default 1) for both.
- Budget: phalanx its preset's ``total_steps``; SB3 ``SB3_BUDGET`` env steps (SAC, TD3: 50,000, several
  times what they usually need; DQN: 2 x the zoo's ``n_timesteps`` with the zoo's epsilon schedule kept
  in absolute steps, i.e. ``exploration_fraction`` rescaled so that epsilon still decays over
  0.16 x 50,000 = 8,000 steps). A run that never reaches R is reported as not reached, with its steps;
  medians count it as infinitely slow.

Runs kept: every run's directory stays under the results folder, ``runs/phalanx-ALGO-ENV-sSEED`` (the
run directory without its checkpoints) and ``runs/sb3-ALGO-ENV-sSEED`` (SB3's evaluations in the same
layout: config.yaml with ``library: sb3``, evaluations.csv), for ``phalanx plot RESULTS/runs/*-sac-*
--group-by library --x time --span longest``.

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
    RESULTS_DIR,
    add_json_option,
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

TASKS: dict[str, dict[str, Any]] = {
    "sac": {"env": "Pendulum-v1", "threshold": -200.0},
    "td3": {"env": "Pendulum-v1", "threshold": -200.0},
    "dqn": {"env": "CartPole-v1", "threshold": 475.0},
}
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 1_000_003  # as phalanx's trainer: evaluation envs get seed + this

# rl-baselines3-zoo 2.9.2, hyperparams/dqn.yml, CartPole-v1 (checked against the rl_zoo3 wheel).
ZOO_DQN = {
    "n_timesteps": 50_000,
    "policy": "MlpPolicy",
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
SB3_BUDGET = {"sac": 50_000, "td3": 50_000, "dqn": 2 * ZOO_DQN["n_timesteps"]}
SB3_SETTINGS = {
    "sac": "stable_baselines3.SAC constructor defaults",
    "td3": "stable_baselines3.TD3 constructor defaults + NormalActionNoise(0, 0.1)",
    "dqn": {"rl_zoo3_2.9.2": ZOO_DQN, "exploration_fraction_rescaled_to_budget": True},
}


def phalanx_preset(algo: str, env_id: str) -> dict[str, Any]:
    from phalanx import make_config

    config = make_config(algo, env_id)
    return {"eval_every": config.eval_every, "total_steps": config.total_steps, "num_envs": config.num_envs}


# -- the runs (each in its own subprocess) ------------------------------------------------------------
def sb3_model(algo: str, env, seed: int, budget: int):
    import numpy as np
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    if algo == "sac":
        return SAC("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
    if algo == "td3":
        action_dim = env.action_space.shape[0]
        noise = NormalActionNoise(mean=np.zeros(action_dim), sigma=0.1 * np.ones(action_dim))
        return TD3("MlpPolicy", env, action_noise=noise, seed=seed, device="cpu", verbose=0)
    hyperparams = {k: v for k, v in ZOO_DQN.items() if k not in ("n_timesteps", "policy")}
    # The zoo's epsilon decays over exploration_fraction * n_timesteps steps; keep that in absolute steps.
    hyperparams["exploration_fraction"] = ZOO_DQN["exploration_fraction"] * ZOO_DQN["n_timesteps"] / budget
    return DQN(ZOO_DQN["policy"], env, seed=seed, device="cpu", verbose=0, **hyperparams)


def sb3_worker(algo: str, seed: int, eval_every: int, threads: int, run_dir: Path) -> dict[str, Any]:
    """One SB3 run in this process; returns what it measured, and writes its evaluation curve to
    ``run_dir`` as a run directory that ``phalanx plot`` reads (``library: sb3``)."""
    import torch
    from stable_baselines3.common.env_util import make_vec_env

    if threads:
        torch.set_num_threads(threads)
    env_id, threshold = TASKS[algo]["env"], TASKS[algo]["threshold"]
    budget = SB3_BUDGET[algo]
    env = make_vec_env(env_id, n_envs=1, seed=seed)
    eval_env = make_vec_env(env_id, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)
    model = sb3_model(algo, env, seed, budget)

    measured = sb3_learn_until(model, eval_env, threshold, eval_every, budget)  # one env: calls = steps
    settings = {"library": "sb3", "algo": algo, "env": env_id, "seed": seed, "num_envs": 1}
    settings["total_steps"] = budget
    settings["sb3_settings"] = SB3_SETTINGS[algo]
    write_peer_run(run_dir, settings, measured.pop("curve"))
    return {
        "library": "sb3",
        "algo": algo,
        "env": env_id,
        "seed": seed,
        **measured,
        "updates": int(model._n_updates),
        "eval_every": eval_every,
        "run_dir": str(run_dir),
    }


def run_sb3(algo: str, seed: int, eval_every: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--sb3-worker",
        algo,
        str(seed),
        str(eval_every),
        str(args.torch_threads),
        str(run_directory(log_dir, f"sb3-{algo}-{TASKS[algo]['env']}-s{seed}")),
    ]
    out = log_dir / f"sb3-{algo}-s{seed}.log"
    start = time.perf_counter()
    completed, cpu_s = run_logged(command, out, args.timeout)
    process_s = time.perf_counter() - start
    lines = [line for line in out.read_text().splitlines() if line.startswith("RESULT ")]
    if completed != 0 or not lines:
        return {
            "library": "sb3",
            "algo": algo,
            "env": TASKS[algo]["env"],
            "seed": seed,
            "reached": False,
            "error": f"exit {completed}",
            "process_s": process_s,
            "time_to_solve_s": None,
            "steps": None,
        }
    result = json.loads(lines[-1][len("RESULT ") :])
    result["process_s"] = process_s
    result["process_cpu_s"] = cpu_s
    return result


# -- aggregation and report ---------------------------------------------------------------------------
def summarize(runs: list[dict[str, Any]], tasks: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for algo in tasks:
        entry: dict[str, Any] = {"env": TASKS[algo]["env"], "threshold": TASKS[algo]["threshold"]}
        for library in ("phalanx", "sb3"):
            mine = [r for r in runs if r["algo"] == algo and r["library"] == library]
            if not mine:
                continue
            reached = [r for r in mine if r.get("reached")]
            median = median_time(mine)
            entry[library] = {
                "runs": len(mine),
                "reached": len(reached),
                "median_time_to_solve_s": median if math.isfinite(median) else None,
                "median_steps_reached": statistics.median(r["steps"] for r in reached) if reached else None,
            }
        phalanx, sb3 = entry.get("phalanx"), entry.get("sb3")
        if phalanx and sb3 and phalanx["median_time_to_solve_s"] and sb3["median_time_to_solve_s"]:
            entry["ratio_sb3_over_phalanx"] = (
                sb3["median_time_to_solve_s"] / phalanx["median_time_to_solve_s"]
            )
        summary[algo] = entry
    return summary


def tables(result: dict[str, Any]) -> str:
    out = []
    for algo, entry in result["summary"].items():
        rows = []
        seeds = sorted({r["seed"] for r in result["runs"] if r["algo"] == algo})
        for seed in seeds:
            row: list[Any] = [seed]
            for library in ("phalanx", "sb3"):
                run = next(
                    (
                        r
                        for r in result["runs"]
                        if r["algo"] == algo and r["library"] == library and r["seed"] == seed
                    ),
                    None,
                )
                row += _cells(run)
            rows.append(row)
        medians: list[Any] = ["**median**"]
        for library in ("phalanx", "sb3"):
            stats = entry.get(library)
            if stats is None:
                medians += ["-", "-", "-"]
                continue
            time_cell = (
                f"**{stats['median_time_to_solve_s']:.1f}**"
                if stats["median_time_to_solve_s"]
                else "not reached"
            )
            steps_cell = f"{stats['median_steps_reached']:,.0f}" if stats["median_steps_reached"] else "-"
            medians += [f"{time_cell} ({stats['reached']}/{stats['runs']} reached)", steps_cell, ""]
        rows.append(medians)
        header = [
            "seed",
            "phalanx time (s)",
            "phalanx env steps",
            "phalanx updates",
            "SB3 time (s)",
            "SB3 env steps",
            "SB3 updates",
        ]
        ratio = entry.get("ratio_sb3_over_phalanx")
        title = (
            f"### {algo.upper()} on {entry['env']}: time to a deterministic evaluation mean "
            f">= {entry['threshold']:g}"
        )
        footer = (
            f"\nSB3 median / phalanx median: **{ratio:.1f}x**"
            if ratio
            else "\nSB3 median / phalanx median: n/a (a median did not reach the threshold)"
        )
        out.append(f"{title}\n\n{markdown_table(header, rows)}\n{footer}")
    return "\n\n".join(out)


def _cells(run: dict[str, Any] | None) -> list[Any]:
    if run is None:
        return ["-", "-", "-"]
    if run.get("error"):
        return [f"failed ({run['error']})", "-", "-"]
    updates = f"{run['updates']:,}" if run.get("updates") is not None else "-"
    if not run["reached"]:
        last = run.get("last_eval_return")
        last_text = f"{last:.0f}" if last is not None else "-"
        return [f"not reached (last eval {last_text})", f"{run['steps']:,}", updates]
    return [f"{run['time_to_solve_s']:.1f}", f"{run['steps']:,}", updates]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--sb3-worker":
        algo, seed, eval_every, threads, run_dir = argv[1:6]
        result = sb3_worker(algo, int(seed), int(eval_every), int(threads), Path(run_dir))
        print("RESULT " + json.dumps(result), flush=True)
        return result

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per library and task (default 5)")
    parser.add_argument("--tasks", default="sac,td3,dqn", help="comma-separated: sac, td3, dqn")
    parser.add_argument("--libraries", default="phalanx,sb3", help="comma-separated: phalanx, sb3")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads for both (default 1)")
    parser.add_argument(
        "--sb3-eval-every",
        type=int,
        default=0,
        help="SB3 env steps between evaluations (default: phalanx's preset eval_every)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    add_json_option(parser)
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    libraries = [lib for lib in args.libraries.split(",") if lib]
    for algo in tasks:
        if algo not in TASKS:
            parser.error(f"--tasks: unknown task {algo!r}; choose from {sorted(TASKS)}")

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="offpolicy_time_to_solve-", dir=RESULTS_DIR))
    machine = machine_info()
    machine["torch_threads"] = args.torch_threads or "default"
    presets = {algo: phalanx_preset(algo, TASKS[algo]["env"]) for algo in tasks}
    sb3_eval_every = {algo: args.sb3_eval_every or presets[algo]["eval_every"] for algo in tasks}
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    for algo in tasks:
        for seed in range(args.seeds):
            for library in libraries:
                if library == "phalanx":
                    run = run_phalanx(
                        algo,
                        TASKS[algo]["env"],
                        TASKS[algo]["threshold"],
                        seed,
                        args.torch_threads,
                        log_dir,
                        args.timeout,
                    )
                else:
                    run = run_sb3(algo, seed, sb3_eval_every[algo], args, log_dir)
                runs.append(run)
                shown = f"{run['time_to_solve_s']:.1f} s" if run.get("reached") else "not reached"
                where = f"{algo} {TASKS[algo]['env']} seed {seed}"
                print(f"{where} {library:8s} {shown} ({run.get('steps')} steps)", flush=True)
    result = {
        "benchmark": "offpolicy_time_to_solve",
        "machine": machine,
        "load_average_after": machine_info()["load_average_1_5_15min"],
        "total_benchmark_s": time.perf_counter() - started,
        "settings": {
            "seeds": list(range(args.seeds)),
            "tasks": {algo: TASKS[algo] for algo in tasks},
            "eval_episodes": EVAL_EPISODES,
            "phalanx_presets": presets,
            "sb3_eval_every": sb3_eval_every,
            "sb3_budget_steps": {algo: SB3_BUDGET[algo] for algo in tasks},
            "sb3_settings": SB3_SETTINGS,
            "torch_threads": args.torch_threads or "default",
            "timing": "perf_counter from the start of training to the evaluation that reached the threshold; "
            "imports and construction excluded on both sides",
            "logs": str(log_dir),
        },
        "runs": runs,
        "summary": summarize(runs, tasks),
    }
    print()
    print(tables(result))
    path = write_json(result, args.json, "offpolicy_time_to_solve")
    print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
