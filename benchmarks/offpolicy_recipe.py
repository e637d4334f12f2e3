"""The parallel off-policy recipe (FastTD3/FastSAC's options) against the shipped presets, seeds 0-4.

    python benchmarks/offpolicy_recipe.py                      # every task and variant, seeds 0..4
    python benchmarks/offpolicy_recipe.py --tasks Pendulum-v1 --variants td3-recipe --seeds 2
    python benchmarks/offpolicy_recipe.py --results benchmarks/results/offpolicy_recipe   # resume

Issue 38, part 4: the recipe against the shipped SAC presets on Pendulum-v1 (time to an evaluation mean of
-200) and MountainCarContinuous-v0 (how many seeds reach 90, and when), with the shipped TD3 preset and, on
Pendulum, SAC with the recipe beside them. Every run is ``phalanx train ALGO ENV --stop-return R --seed S
--torch-threads T [--config FILE]`` in its own process, one after another (``benchlib.run_phalanx``):

- ``sac-preset``, ``td3-preset``: the shipped preset of the env.
- ``td3-recipe``: ``examples/fast_td3_pendulum.yaml`` / ``examples/fast_td3_mountaincar.yaml``: 1,024 envs,
  4 gradient steps per vector step on batches of 2,048, a C51 twin critic, n-step returns, per-env noise,
  AdamW.
- ``sac-recipe`` (Pendulum): ``examples/fast_sac_pendulum.yaml``, the same recipe on SAC.

Time to R is ``time_to_stop_return_s`` of the run's summary.json: training and evaluation time, imports and
set-up excluded. A run that never reaches R is reported as not reached. Results are kept per run under
``--results`` (``VARIANT/ENV-sSEED.json`` and the run directory): a second call with the same folder skips
the runs it has, so an interrupted grid resumes. The figures are drawn with ``phalanx plot`` from the
kept run directories. The benchmark measures and reports; it does not assert a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS_DIR, machine_info, markdown_table, run_phalanx  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
THRESHOLDS = {"Pendulum-v1": -200.0, "MountainCarContinuous-v0": 90.0}
# variant -> (algo, {env: config file}; None: the shipped preset of every env)
VARIANTS: dict[str, tuple[str, dict[str, Path] | None]] = {
    "sac-preset": ("sac", None),
    "td3-preset": ("td3", None),
    "td3-recipe": (
        "td3",
        {
            "Pendulum-v1": EXAMPLES / "fast_td3_pendulum.yaml",
            "MountainCarContinuous-v0": EXAMPLES / "fast_td3_mountaincar.yaml",
        },
    ),
    "sac-recipe": ("sac", {"Pendulum-v1": EXAMPLES / "fast_sac_pendulum.yaml"}),
}


def variant_runs(variant: str, env_id: str) -> bool:
    configs = VARIANTS[variant][1]
    return configs is None or env_id in configs


def one_run(
    variant: str, env_id: str, seed: int, threads: int, results: Path, timeout: float
) -> dict[str, Any]:
    """The run's result: read back from ``results`` when an earlier call made it, else run now."""
    record = results / variant / f"{env_id}-s{seed}.json"
    if record.is_file():
        return json.loads(record.read_text())
    algo, configs = VARIANTS[variant]
    extra = ["--config", str(configs[env_id])] if configs else []
    log_dir = results / variant
    log_dir.mkdir(parents=True, exist_ok=True)
    name = f"phalanx-{algo}-{env_id}-s{seed}"  # a run killed before its record: its directory goes, unplotted
    for stale in [*log_dir.glob(f"runs/{name}"), *log_dir.glob(f"runs/{name}-*")]:
        shutil.rmtree(stale)
    run = run_phalanx(algo, env_id, THRESHOLDS[env_id], seed, threads, log_dir, timeout, extra)
    run["variant"] = variant
    if run.get("error") is None:  # a failed run is run again next time
        record.write_text(json.dumps(run, indent=2))
    return run


def figure(results: Path, env_id: str, variants: list[str], group_by: str, x: str, title: str) -> str:
    """``phalanx plot`` of the kept runs of ``variants`` on ``env_id``; the command as typed."""
    runs = [str(p) for v in variants for p in sorted((results / v / "runs").glob(f"phalanx-*-{env_id}-s*"))]
    output = results / f"{env_id}-{'-vs-'.join(variants)}-{x}.png"
    arguments = ["plot", *runs, "--group-by", group_by, "--x", x, "--span", "longest"]
    arguments += ["--output", str(output), "--title", title]
    subprocess.run([sys.executable, "-m", "phalanx.cli", *arguments], check=True)
    where = f"{results}/{{{','.join(variants)}}}/runs/phalanx-*-{env_id}-s*"
    return f"phalanx plot {where} --group-by {group_by} --x {x} --span longest"


def summarise(runs: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for run in runs:
        reached = run.get("reached")
        rows.append(
            [
                run["env"],
                run["variant"],
                run["seed"],
                f"{run['time_to_solve_s']:.1f}" if reached else "not reached",
                f"{run['steps']:,}" if run.get("steps") else "-",
                f"{run['process_s']:.1f}",
                f"{run['last_eval_return']:.1f}" if run.get("last_eval_return") is not None else "-",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument(
        "--tasks", default=",".join(THRESHOLDS), help=f"comma-separated, of {list(THRESHOLDS)}"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}"
    )
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run before it is killed")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_DIR / "offpolicy_recipe", help="where runs are kept (resumes)"
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the phalanx plot figures")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    variants = [v for v in args.variants.split(",") if v]
    for name, known in (("--tasks", THRESHOLDS), ("--variants", VARIANTS)):
        unknown = [v for v in (tasks if name == "--tasks" else variants) if v not in known]
        if unknown:
            parser.error(f"{name}: unknown {unknown}; choose from {list(known)}")

    runs = []
    for env_id in tasks:  # seed-major, so that every variant has its first seeds early in a long grid
        for seed in range(args.seeds):
            for variant in variants:
                if not variant_runs(variant, env_id):
                    continue
                run = one_run(variant, env_id, seed, args.torch_threads, args.results, args.timeout)
                runs.append(run)
                shown = f"{run['time_to_solve_s']:.1f} s" if run.get("reached") else "not reached"
                print(f"{env_id} {variant:11s} seed {seed}: {shown} ({run.get('steps')} steps)", flush=True)

    header = ["env", "variant", "seed", "time to R (s)", "env steps", "process s", "last eval"]
    print(markdown_table(header, summarise(runs)))
    figures = []
    if not args.no_figures:
        for env_id in tasks:
            pair = [v for v in ("sac-preset", "td3-recipe") if v in variants]
            for x in ("steps", "time"):
                title = f"{env_id}: TD3 with the recipe (td3) against the SAC preset (sac)"
                figures.append(figure(args.results, env_id, pair, "algo", x, title))
            if env_id in VARIANTS["sac-recipe"][1] and {"sac-preset", "sac-recipe"} <= set(variants):
                title = f"{env_id}: SAC, the recipe (1,024 envs) against the preset"
                figures.append(
                    figure(args.results, env_id, ["sac-preset", "sac-recipe"], "num_envs", "time", title)
                )
    result = {"benchmark": "offpolicy_recipe", "machine": machine_info(), "runs": runs, "figures": figures}
    (args.results / "offpolicy_recipe.json").write_text(json.dumps(result, indent=2))
    print("\n".join(figures))
    return result


if __name__ == "__main__":
    main()
