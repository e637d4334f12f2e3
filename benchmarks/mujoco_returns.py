"""Do phalanx's MuJoCo presets learn? Returns of ALGO x ENV x SEEDS at a step budget against published ones.

    python benchmarks/mujoco_returns.py                                  # the issue's plan (hours)
    python benchmarks/mujoco_returns.py --algos sac --envs Hopper-v5 --seeds 1 2 3
    python benchmarks/mujoco_returns.py --budget 1000000 --algos td3    # 1M (where a GPU is lent)
    python benchmarks/mujoco_returns.py --runs-dir /work/wt/runs --summarize-only   # existing runs

The plan: PPO at 1M env steps, SAC and TD3 at 300k (the issue's budgets on a CPU; ``--budget`` sets one
budget for all), on HalfCheetah-v5, Hopper-v5, Walker2d-v5 and Ant-v5, seeds 1, 2, 3 (the benchmark's
seeds; tune on others). Each run is ``phalanx train ALGO ENV --seed S --total-steps BUDGET --run-dir
RUNS/ALGO-ENV-sS`` with the shipped preset (``--compile`` and further ``phalanx train`` flags after ``--``
are passed on), one after another, its output in ``RUNS/ALGO-ENV-sS.log``.

Resumable: a run whose summary.json says it finished at the budget is skipped; an unfinished run with a
checkpoint (one is written at the end, on Ctrl+C, and every ``--checkpoint-every`` steps) is continued
with ``phalanx resume RUN --total-steps BUDGET``, and so is a finished run of a smaller budget. An
unfinished run without a checkpoint (killed, or still being written by another process) is left as it
is and reported: move it away to train it again. Nothing is ever deleted. A checkpoint holds no replay
buffer unless ``-- --save-buffer`` is passed, and a SAC/TD3 run resumed without one refills it from
scratch; with it, each step checkpoint holds the whole replay (1M transitions: ~170 MB for HalfCheetah,
~880 MB for Ant).

``--summarize-only`` trains nothing: it reads the run directories under ``--runs-dir`` (the layout above,
e.g. runs another process is writing; their evaluations.csv and metrics.csv grow as they train) and
reports them, partial runs marked with the steps they have reached.

What it reports, per ALGO x ENV (printed as Markdown, and as JSON with ``--json``):

- each seed's final evaluation return (the last row of evaluations.csv: the deterministic policy over the
  preset's ``eval_episodes``), its best evaluation, and its final training-episode return (the last
  ``episode_return_mean`` of metrics.csv, the stochastic policy's, as CleanRL reports);
- the median over seeds of each;
- the published references (benchmarks/mujoco_references.py) AT THE BUDGET, each against the median of
  the same kind of return (evaluation against evaluation, training against training), and whether the
  median reaches the reference's mean; references at other budgets are listed apart with their own
  budget, never as the budget's figure.

Learning curves: one figure per ALGO x ENV, ``--figures-dir``/mujoco_ALGO_ENV.png (default
benchmarks/figures/), the deterministic evaluation return's mean over the seeds with its min-max band,
drawn by phalanx's own plot code (:mod:`phalanx.train.plots`, as ``phalanx plot RUNS/ALGO-ENV-s*
--interval minmax``), with the references up to the budget as labelled points.

The benchmark measures and reports; it does not assert a return.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402
    FIGURES_DIR,
    RESULTS_DIR,
    add_json_option,
    machine_info,
    markdown_table,
    run_logged,
    write_json,
)
from mujoco_references import MISSING, references, steps_text  # noqa: E402

from phalanx.train.checkpoint import CheckpointManager  # noqa: E402

ALGOS = ("ppo", "sac", "td3")
ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5")
SEEDS = (1, 2, 3)
BUDGETS = {"ppo": 1_000_000, "sac": 300_000, "td3": 300_000}
"""The issue's budgets on a CPU: PPO 1M env steps, SAC and TD3 300k."""
DEFAULT_RUNS_DIR = RESULTS_DIR / "mujoco_returns" / "runs"
RUN_TIMEOUT_S = 48 * 3600


@dataclass
class RunResult:
    """What one run directory says: how far it got and its returns."""

    algo: str
    env: str
    seed: int
    run_dir: str
    status: str
    """``finished`` (summary.json, at its budget), ``interrupted``, ``failed``, ``partial`` (being
    written, or killed: no summary.json yet), or ``missing``."""
    steps: int
    """Env steps reached (summary.json, else the last row of metrics.csv or evaluations.csv)."""
    budget: int
    """The run's own total_steps (config.yaml), 0 if missing."""
    wall_time_s: float | None
    final_eval: float | None
    final_eval_steps: int | None
    best_eval: float | None
    best_eval_steps: int | None
    final_training: float | None
    evaluations: int


def run_name(algo: str, env: str, seed: int) -> str:
    return f"{algo}-{env}-s{seed}"


def read_run(run_dir: Path, algo: str, env: str, seed: int) -> RunResult:
    """The returns of ``run_dir`` (any state: finished, interrupted, still being written, missing);
    read-only."""
    from phalanx.config import load_yaml
    from phalanx.train.logging import read_table

    if not (run_dir / "config.yaml").is_file():
        return RunResult(
            algo, env, seed, str(run_dir), "missing", 0, 0, None, None, None, None, None, None, 0
        )
    config = load_yaml(run_dir / "config.yaml")
    evaluations = [r for r in read_table(run_dir / "evaluations.csv") if "eval_return_mean" in r]
    evaluations.sort(key=lambda r: r["steps"])
    metrics = read_table(run_dir / "metrics.csv")
    training = [r for r in metrics if "episode_return_mean" in r]
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    rows = metrics + evaluations
    steps = int(max((r["steps"] for r in rows), default=0))
    wall = max((r["wall_time_s"] for r in rows if "wall_time_s" in r), default=None)
    if summary is None:
        status = "partial"
    else:
        steps, wall = int(summary["total_steps"]), summary["wall_time_s"]
        status = "failed" if summary.get("error") else "interrupted" if summary["interrupted"] else "finished"
    best = max(evaluations, key=lambda r: r["eval_return_mean"], default=None)
    return RunResult(
        algo,
        env,
        seed,
        str(run_dir),
        status,
        steps,
        int(config.get("total_steps", 0)),
        wall,
        evaluations[-1]["eval_return_mean"] if evaluations else None,
        int(evaluations[-1]["steps"]) if evaluations else None,
        best["eval_return_mean"] if best else None,
        int(best["steps"]) if best else None,
        training[-1]["episode_return_mean"] if training else None,
        len(evaluations),
    )


def at_budget(run: RunResult, budget: int) -> bool:
    """The run finished a budget of at least ``budget`` steps."""
    return run.status == "finished" and run.budget >= budget


# -- running -------------------------------------------------------------------------------------------
def train_command(algo: str, env: str, seed: int, budget: int, run_dir: Path, extra: list[str]) -> list[str]:
    """``phalanx train`` of the preset at ``budget`` env steps into ``run_dir``."""
    return [
        sys.executable,
        "-m",
        "phalanx.cli",
        "train",
        algo,
        env,
        "--seed",
        str(seed),
        "--total-steps",
        str(budget),
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def resume_command(run_dir: Path, budget: int) -> list[str]:
    return [sys.executable, "-m", "phalanx.cli", "resume", str(run_dir), "--total-steps", str(budget)]


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``phalanx resume`` has a step checkpoint to continue from (``checkpoints/best`` alone is not
    one: it holds the best evaluation's state, not the run's latest)."""
    return CheckpointManager(run_dir).latest() is not None


def plan_run(run: RunResult, budget: int) -> str:
    """What to do with a run: ``skip`` (done at the budget), ``train`` (nothing there yet), ``resume``
    (a checkpoint to continue from), or ``stuck`` (unfinished and no checkpoint: left alone)."""
    if at_budget(run, budget):
        return "skip"
    if run.status == "missing":
        return "train"
    if has_checkpoint(Path(run.run_dir)) and run.steps < budget:
        return "resume"
    return "stuck"


def run_one(algo: str, env: str, seed: int, budget: int, runs_dir: Path, extra: list[str]) -> RunResult:
    """Train (or resume) one run up to ``budget`` unless it is done; what its directory says afterwards."""
    name = run_name(algo, env, seed)
    run_dir = runs_dir / name
    run = read_run(run_dir, algo, env, seed)
    action = plan_run(run, budget)
    if action == "skip":
        print(f"{name}: finished at {run.steps:,} steps, skipped", flush=True)
        return run
    if action == "stuck":
        print(
            f"{name}: {run.status} at {run.steps:,} steps with no checkpoint to resume from (killed, or "
            f"still being written by another process): left as it is. Move {run_dir} away to train it "
            "again.",
            flush=True,
        )
        return run
    command = (
        train_command(algo, env, seed, budget, run_dir, extra)
        if action == "train"
        else resume_command(run_dir, budget)
    )
    runs_dir.mkdir(parents=True, exist_ok=True)
    log = runs_dir / f"{name}.log"
    if action == "resume":  # keep the earlier output: the new log goes next to it
        log = runs_dir / f"{name}.resume-{time.strftime('%Y%m%d-%H%M%S')}.log"
    print(f"{name}: {action} to {budget:,} steps ({log})", flush=True)
    code, _cpu = run_logged(command, log, RUN_TIMEOUT_S)
    run = read_run(run_dir, algo, env, seed)
    print(f"{name}: exit code {code}, {run.status} at {run.steps:,} steps", flush=True)
    return run


# -- reporting ------------------------------------------------------------------------------------------
def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(algo: str, env: str, budget: int, runs: list[RunResult]) -> dict[str, Any]:
    """The medians over the seeds that finished the budget (over every run with returns, marked partial,
    if none has), and the references: at the budget (compared) and at other budgets (listed)."""
    done = [run for run in runs if at_budget(run, budget)]
    counted = done or [run for run in runs if run.final_eval is not None]
    medians = {
        "final_eval": median([r.final_eval for r in counted]),
        "best_eval": median([r.best_eval for r in counted]),
        "final_training": median([r.final_training for r in counted]),
    }
    compared, elsewhere = [], []
    for reference in references(algo, env):
        if reference.steps == budget:
            ours = medians["final_eval" if reference.kind == "evaluation" else "final_training"]
            compared.append(
                {
                    **asdict(reference),
                    "label": reference.label(),
                    "median": ours,
                    "reaches": None if ours is None or not done else ours >= reference.mean,
                }
            )
        else:
            elsewhere.append({**asdict(reference), "label": reference.label()})
    return {
        "algo": algo,
        "env": env,
        "budget": budget,
        "seeds": [run.seed for run in runs],
        "seeds_at_budget": [run.seed for run in done],
        "partial": not done,
        "medians": medians,
        "runs": [asdict(run) for run in runs],
        "references_at_budget": compared,
        "references_at_other_budgets": elsewhere,
    }


def report_markdown(results: list[dict[str, Any]]) -> str:
    """The tables: each run, each ALGO x ENV against the references at its budget, the other budgets."""
    run_rows, median_rows, reference_rows, other_rows = [], [], [], []
    for result in results:
        for run in result["runs"]:
            run_rows.append(
                [
                    run["algo"],
                    run["env"],
                    run["seed"],
                    f"{run['status']} ({run['steps']:,} of {result['budget']:,})",
                    _number(run["final_eval"]),
                    _number(run["best_eval"]),
                    _number(run["final_training"]),
                    _number(run["wall_time_s"]),
                ]
            )
        done = result["seeds_at_budget"]
        partial = [
            f"s{r['seed']} {steps_text(r['steps'])}" for r in result["runs"] if r["final_eval"] is not None
        ]
        counted = ", ".join(map(str, done)) if done else "partial: " + (", ".join(partial) or "none")
        median_rows.append(
            [
                result["algo"],
                result["env"],
                steps_text(result["budget"]),
                counted,
                _number(result["medians"]["final_eval"]),
                _number(result["medians"]["best_eval"]),
                _number(result["medians"]["final_training"]),
            ]
        )
        for reference in result["references_at_budget"]:
            reaches = {True: "yes", False: "no", None: "n/a (no seed at the budget yet)"}[
                reference["reaches"]
            ]
            reference_rows.append(
                [
                    result["algo"],
                    result["env"],
                    reference["label"],
                    f"{reference['mean']:,.0f} ± {reference['std']:,.0f} (n={reference['seeds']})",
                    _number(reference["median"]),
                    reaches,
                ]
            )
        for reference in result["references_at_other_budgets"]:
            other_rows.append(
                [
                    result["algo"],
                    result["env"],
                    reference["label"],
                    f"{reference['mean']:,.0f} ± {reference['std']:,.0f} (n={reference['seeds']})",
                    steps_text(reference["steps"]),
                ]
            )
    parts = [
        "Runs (returns: final and best deterministic evaluation, last training-episode mean):",
        markdown_table(
            ["algo", "env", "seed", "state (steps)", "final eval", "best eval", "final training", "wall s"],
            run_rows,
        ),
        "Medians over the seeds that finished the budget:",
        markdown_table(
            ["algo", "env", "budget", "seeds", "final eval", "best eval", "final training"], median_rows
        ),
        "Against the published references at the same budget (the median of the same kind of return):",
        markdown_table(
            ["algo", "env", "reference", "reference mean ± std", "phalanx median", "reaches"],
            reference_rows,
        )
        if reference_rows
        else "(no published reference at these budgets)",
        "Published references at OTHER budgets (for context only, not the figure at the budget above):",
        markdown_table(["algo", "env", "reference", "mean ± std", "at"], other_rows)
        if other_rows
        else "(none)",
        "No source gives: " + " ".join(MISSING),
    ]
    return "\n\n".join(parts)


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def draw_figure(
    algo: str, env: str, budget: int, runs: list[RunResult], figures_dir: Path, interval: str
) -> Path | None:
    """The evaluation return of the runs with evaluations (mean over seeds, ``interval`` band) and the
    references up to ``budget`` as labelled points, by phalanx's plot code; None if no run has any."""
    import numpy as np

    from phalanx.train.plots import METRIC_LABELS, Line, curves, draw

    run_dirs = [run.run_dir for run in runs if run.evaluations]
    if not run_dirs:
        return None
    result = curves(run_dirs, x="steps", group_by="algo", interval=interval, metric="eval_return_mean")
    group = result.groups[0]
    seeds = ", ".join(str(run.seed) for run in runs if run.evaluations)
    lines = [
        Line(
            f"phalanx {algo.upper()}, seeds {seeds} (n={group.n})", group.x, group.mean, group.low, group.high
        )
    ]
    for reference in references(algo, env):
        if reference.steps <= budget:
            lines.append(
                Line(
                    f"{reference.label()}: {reference.mean:,.0f} ± {reference.std:,.0f}",
                    np.array([reference.steps], dtype=float),
                    np.array([reference.mean]),
                )
            )
    reached = int(group.x[-1])
    progress = "" if reached >= budget else f", runs at {steps_text(reached)} of {steps_text(budget)}"
    return draw(
        lines,
        figures_dir / f"mujoco_{algo}_{env}.png",
        xlabel="environment steps",
        ylabel=METRIC_LABELS["eval_return_mean"],
        title=f"{algo.upper()} on {env} ({steps_text(budget)}-step budget{progress})",
        x_is_steps=True,
        legend_title=f"phalanx: mean, {'min–max' if interval == 'minmax' else interval} over seeds",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--envs", nargs="+", default=list(ENVS), help="MuJoCo ids (default: %(default)s)")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        help="env steps for every algo (default: PPO 1M, SAC and TD3 300k)",
    )
    parser.add_argument(
        "--runs-dir", type=Path, default=DEFAULT_RUNS_DIR, help="where the run directories are"
    )
    parser.add_argument("--summarize-only", action="store_true", help="train nothing; report the runs there")
    parser.add_argument("--compile", action="store_true", help="train with --compile")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="env steps between checkpoints")
    parser.add_argument("--figures-dir", type=Path, default=FIGURES_DIR)
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--interval", choices=("minmax", "stderr"), default="minmax")
    add_json_option(parser)
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of env steps, got {args.budget}")
    if extra and args.summarize_only:
        parser.error(f"--summarize-only trains nothing; these flags would go to `phalanx train`: {extra}")
    if args.compile:
        extra.append("--compile")
    if args.checkpoint_every:
        extra += ["--checkpoint-every", str(args.checkpoint_every)]

    results, figures = [], []
    for algo in args.algos:
        budget = args.budget or BUDGETS[algo]
        for env in args.envs:
            runs = []
            for seed in args.seeds:
                if args.summarize_only:
                    name = run_name(algo, env, seed)
                    runs.append(read_run(args.runs_dir / name, algo, env, seed))
                else:
                    runs.append(run_one(algo, env, seed, budget, args.runs_dir, extra))
            present = [run for run in runs if run.status != "missing"]
            if not present:
                continue
            results.append(summarize(algo, env, budget, present))
            if not args.no_figures:
                figure = draw_figure(algo, env, budget, present, args.figures_dir, args.interval)
                if figure is not None:
                    figures.append(str(figure))
    if not results:
        print(f"no run directories under {args.runs_dir} for {args.algos} x {args.envs} x seeds {args.seeds}")
        return 1
    print(report_markdown(results))
    if figures:
        print("\nFigures: " + ", ".join(figures))
    if args.json is not None:
        path = write_json(
            {"machine": machine_info(), "results": results, "figures": figures}, args.json, "mujoco_returns"
        )
        print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
