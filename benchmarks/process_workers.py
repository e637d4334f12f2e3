"""Worker processes: phalanx ProcessVecEnv against Gymnasium AsyncVectorEnv and SyncVectorEnv, same script.

    python benchmarks/process_workers.py                    # both tasks, 5 repeats of >= 2 s per variant
    python benchmarks/process_workers.py --quick            # smoke test: 1 short repeat per variant
    python benchmarks/process_workers.py --tasks cartpole --repeats 3 --seconds 3 --json results.json

Two tasks, each a set of variants stepping the same Gymnasium env with the same random actions:

- ``cartpole``: ``CartPole-v1``, 64 sub-envs. phalanx ``ProcessVecEnv`` with ``--workers`` (default 2)
  processes; ``gymnasium.vector.AsyncVectorEnv`` (one process per sub-env, 64); ``SyncVectorEnv``
  (in-process); and phalanx ``GymnasiumVecEnv`` (in-process, for reference).
  Targets: ProcessVecEnv >= 2x AsyncVectorEnv and >= 1x SyncVectorEnv.
- ``halfcheetah``: ``HalfCheetah-v5`` (MuJoCo), 16 sub-envs. ProcessVecEnv with ``--workers`` processes;
  AsyncVectorEnv (16 processes); SyncVectorEnv for reference. Target: ProcessVecEnv >= 1.5x Async.

Gymnasium's vector envs run in same-step autoreset mode (``autoreset_mode=AutoresetMode.SAME_STEP``, the
mode phalanx converts to) with their other defaults (``copy=True``; Async: shared memory, the default
multiprocessing start method). phalanx takes torch actions and returns CPU torch tensors (observations,
rewards, flags, ``final_obs``, episode statistics); Gymnasium takes and returns numpy arrays.

The random actions are drawn once, before timing (a bank of 256 batches cycled through), as numpy
arrays for Gymnasium and as torch tensors of the same values for phalanx, so that every variant times
the environment, the transport and the conversions, not the random number generator.

Each timed run builds its vector env, resets it (seed 0), steps ``--warmup`` untimed vector steps, then
steps in chunks until at least ``--seconds`` have passed, and closes the env: construction, worker
start-up and reset are not timed (they are reported as ``startup_s`` in the JSON). Within a task the
repeats alternate the variants, in an order rotated by one each repeat, so that a change in the
machine's load affects all of them; the tables report the median, min and max over repeats, and the
ratios are of medians (the JSON also has the median of the per-repeat ratios). "main CPU" is the
main process's CPU time over the timed wall time (100% = one core busy). torch runs with 1 thread.
Env steps/s counts sub-env steps: (vector steps) x (sub-envs). The benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, load_average, machine_info, markdown_table, write_json  # noqa: E402

ACTION_BANK = 256  # action batches drawn before timing and cycled through
SEED = 0

# task -> env id, sub-envs, variants (in the order of the table), targets (variant over variant, ratio)
TASKS: dict[str, dict[str, Any]] = {
    "cartpole": {
        "env_id": "CartPole-v1",
        "num_envs": 64,
        "variants": ("process", "async", "sync", "inprocess"),
        "targets": (("process", "async", 2.0), ("process", "sync", 1.0)),
    },
    "halfcheetah": {
        "env_id": "HalfCheetah-v5",
        "num_envs": 16,
        "variants": ("process", "async", "sync"),
        "targets": (("process", "async", 1.5),),
    },
}

LABELS = {
    "process": "phalanx ProcessVecEnv",
    "async": "Gymnasium AsyncVectorEnv",
    "sync": "Gymnasium SyncVectorEnv",
    "inprocess": "phalanx GymnasiumVecEnv",
}


def _timed(
    step: Callable[[int], None], warmup_steps: int, min_seconds: float, chunk: int = 50
) -> tuple[int, float, float]:
    """Run ``step(i)`` warmup_steps times, then in chunks until min_seconds have passed.

    Returns (timed steps, wall seconds, CPU seconds of this process over the timed part).
    """
    for i in range(warmup_steps):
        step(i)
    steps = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    while True:
        for _ in range(chunk):
            step(steps)
            steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return steps, elapsed, time.process_time() - cpu_start


def _action_bank(env_id: str, num_envs: int, seed: int) -> Any:
    """``ACTION_BANK`` batches of uniformly random actions of ``env_id``'s action space (numpy)."""
    import gymnasium as gym
    import numpy as np

    probe = gym.make(env_id)
    space = probe.action_space
    probe.close()
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        low = int(space.start)
        return rng.integers(low, low + int(space.n), size=(ACTION_BANK, num_envs), dtype=np.int64)
    low = np.broadcast_to(space.low, space.shape)
    high = np.broadcast_to(space.high, space.shape)
    return rng.uniform(low, high, size=(ACTION_BANK, num_envs, *space.shape)).astype(np.float32)


def _build(variant: str, env_id: str, num_envs: int, workers: int) -> tuple[Any, str, int]:
    """The vector env of ``variant``, reset; (env, description, processes stepping the sub-envs)."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    from phalanx.envs.workers import GymnasiumVecEnv, ProcessVecEnv

    if variant == "process":
        env = ProcessVecEnv(env_id, num_envs=num_envs, num_workers=workers, device="cpu")
        env.reset(seed=SEED)
        return env, f"ProcessVecEnv({env_id!r}, num_workers={workers})", workers
    if variant == "inprocess":
        env = GymnasiumVecEnv(env_id, num_envs=num_envs, device="cpu")
        env.reset(seed=SEED)
        return env, f"GymnasiumVecEnv({env_id!r}) (in-process)", 0
    factories = [lambda: gym.make(env_id) for _ in range(num_envs)]
    if variant == "async":
        env = gym.vector.AsyncVectorEnv(factories, autoreset_mode=AutoresetMode.SAME_STEP)
        processes = num_envs
    elif variant == "sync":
        env = gym.vector.SyncVectorEnv(factories, autoreset_mode=AutoresetMode.SAME_STEP)
        processes = 0
    else:
        raise ValueError(f"unknown variant {variant!r}")
    env.reset(seed=SEED)
    return env, f"{type(env).__name__} of gym.make({env_id!r}), SAME_STEP autoreset", processes


def bench_variant(
    variant: str,
    env_id: str,
    num_envs: int,
    workers: int,
    actions: Any,
    warmup: int,
    seconds: float,
) -> dict[str, Any]:
    """Build, reset, warm up and time one variant, then close it; what it measured."""
    import torch

    build_start = time.perf_counter()
    env, description, processes = _build(variant, env_id, num_envs, workers)
    startup = time.perf_counter() - build_start
    if variant in ("process", "inprocess"):  # torch in: the same values as the numpy bank
        bank = [torch.from_numpy(batch.copy()) for batch in actions]
    else:
        bank = [batch.copy() for batch in actions]
    try:

        def step(i: int) -> None:
            env.step(bank[i % ACTION_BANK])

        steps, elapsed, cpu = _timed(step, warmup, seconds)
    finally:
        env.close()
    return {
        "variant": variant,
        "name": LABELS[variant],
        "vector_env": description,
        "processes": processes,
        "vector_steps": steps,
        "seconds": elapsed,
        "main_cpu_s": cpu,
        "startup_s": startup,
        "env_steps_per_second": steps * num_envs / elapsed,
        "load_average_after": load_average(),
    }


def run_task(
    task: str, workers: int, repeats: int, seconds: float, warmup: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """All variants of ``task``, ``repeats`` times each in a rotated order; per-variant statistics."""
    spec = TASKS[task]
    env_id, num_envs, variants = spec["env_id"], spec["num_envs"], list(spec["variants"])
    base = {"task": task, "env": env_id, "num_envs": num_envs, "workers": workers}
    try:
        actions = _action_bank(env_id, num_envs, SEED)
    except Exception as error:  # noqa: BLE001 - e.g. MuJoCo not installed: report and go on
        log(f"{task}: skipped, {env_id} cannot be built ({type(error).__name__}: {error})")
        return {**base, "skipped": f"{type(error).__name__}: {error}"}
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for repeat in range(repeats):
        shift = repeat % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            row = bench_variant(variant, env_id, num_envs, workers, actions, warmup, seconds)
            row["repeat"] = repeat
            runs[variant].append(row)
            log(
                f"{task} repeat {repeat + 1}/{repeats}: {LABELS[variant]:<26} "
                f"{row['env_steps_per_second']:>12,.0f} env steps/s "
                f"(startup {row['startup_s']:.1f} s, load {row['load_average_after']})"
            )
    medians = {
        variant: statistics.median(r["env_steps_per_second"] for r in rows) for variant, rows in runs.items()
    }
    results = []
    for variant in variants:
        values = [r["env_steps_per_second"] for r in runs[variant]]
        cpu_share = [r["main_cpu_s"] / r["seconds"] for r in runs[variant]]
        first = runs[variant][0]
        row = {
            "variant": variant,
            "name": first["name"],
            "vector_env": first["vector_env"],
            "processes": first["processes"],
            "env_steps_per_second": values,
            "median": medians[variant],
            "min": min(values),
            "max": max(values),
            "main_cpu_share_median": statistics.median(cpu_share),
            "startup_s_median": statistics.median(r["startup_s"] for r in runs[variant]),
            "runs": runs[variant],
        }
        for other in ("async", "sync"):
            if other in medians:
                row[f"ratio_over_{other}"] = medians[variant] / medians[other]
                paired = [
                    mine["env_steps_per_second"] / theirs["env_steps_per_second"]
                    for mine, theirs in zip(runs[variant], runs[other], strict=True)
                ]
                row[f"paired_ratio_over_{other}_median"] = statistics.median(paired)
        results.append(row)
    targets = []
    for mine, other, goal in spec["targets"]:
        ratio = medians[mine] / medians[other]
        targets.append(
            {"variant": mine, "over": other, "target": goal, "ratio": ratio, "met": bool(ratio >= goal)}
        )
    return {**base, "results": results, "targets": targets}


def _versions() -> dict[str, str | None]:
    import numpy
    import torch

    import phalanx

    versions: dict[str, str | None] = {"numpy": numpy.__version__, "phalanx": phalanx.__version__}
    try:
        import mujoco

        versions["mujoco"] = mujoco.__version__
    except ImportError:
        versions["mujoco"] = None
    versions["torch_threads"] = str(torch.get_num_threads())
    versions["phalanx_git"] = _git_revision()
    return versions


def _git_revision() -> str | None:
    """The repository's commit, with ``-dirty`` when src/ has uncommitted changes (None outside git)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def run(
    tasks: tuple[str, ...] = ("cartpole", "halfcheetah"),
    workers: int = 2,
    repeats: int = 5,
    seconds: float = 2.0,
    warmup: int = 100,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> dict[str, Any]:
    import multiprocessing

    import torch

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        machine = {**machine_info("cpu"), **_versions()}
        machine["load_average_before"] = machine.pop("load_average_1_5_15min")
        log(header(machine))
        task_results = [run_task(task, workers, repeats, seconds, warmup, log) for task in tasks]
    finally:
        torch.set_num_threads(previous_threads)  # as found, for a caller such as run_all.py
    machine["load_average_after"] = load_average()
    log(f"load average (1, 5, 15 min) after: {machine['load_average_after']}")
    return {
        "benchmark": "process_workers",
        "machine": machine,
        "settings": {
            "tasks": list(tasks),
            "workers": workers,
            "repeats": repeats,
            "seconds_per_run": seconds,
            "warmup_vector_steps": warmup,
            "torch_threads": 1,
            "random_actions": f"bank of {ACTION_BANK} batches drawn before timing",
            "gymnasium_autoreset_mode": "SAME_STEP",
            "default_start_method": multiprocessing.get_start_method(),
        },
        "tasks": task_results,
    }


def header(machine: dict[str, Any]) -> str:
    return (
        f"machine: {machine['cpu']}, {machine['logical_cores']} logical cores; "
        f"load average (1, 5, 15 min) before: {machine['load_average_before']}\n"
        f"python {machine['python']}, torch {machine['torch']} ({machine['torch_threads']} thread), "
        f"gymnasium {machine['gymnasium']}, numpy {machine['numpy']}, mujoco {machine['mujoco']}, "
        f"phalanx {machine['phalanx']} ({machine['phalanx_git']})"
    )


def _ratio(row: dict[str, Any], other: str) -> str:
    key = f"ratio_over_{other}"
    return f"{row[key]:.2f}x" if key in row else "-"


def table(task: dict[str, Any], settings: dict[str, Any]) -> str:
    title = f"### {task['env']}, {task['num_envs']} sub-envs"
    if "skipped" in task:
        return f"{title}\n\nskipped: {task['skipped']}"
    rows = [
        [
            row["name"],
            row["processes"] or "main only",
            len(row["env_steps_per_second"]),
            f"{row['median']:,.0f}",
            f"{row['min']:,.0f} - {row['max']:,.0f}",
            f"{row['main_cpu_share_median']:.0%}",
            _ratio(row, "async"),
            _ratio(row, "sync"),
        ]
        for row in task["results"]
    ]
    header_row = ["variant", "processes", "repeats", "median env steps/s", "min - max", "main CPU"]
    lines = [
        title,
        "",
        f"random actions, {settings['seconds_per_run']:g} s per run after {settings['warmup_vector_steps']} "
        f"warm-up steps, 1 torch thread",
        "",
        markdown_table([*header_row, "vs Async", "vs Sync"], rows),
        "",
    ]
    for target in task["targets"]:
        verdict = "met" if target["met"] else "not met"
        lines.append(
            f"{LABELS[target['variant']]} / {LABELS[target['over']]}: **{target['ratio']:.2f}x** median "
            f"env steps/s (target >= {target['target']:g}x: {verdict})"
        )
    return "\n".join(lines)


def tables(result: dict[str, Any]) -> str:
    return "\n\n".join(table(task, result["settings"]) for task in result["tasks"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tasks",
        default="cartpole,halfcheetah",
        help=f"comma-separated, of {', '.join(TASKS)} (default all)",
    )
    parser.add_argument("--workers", type=int, default=2, help="ProcessVecEnv worker processes (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per variant (default 5)")
    parser.add_argument(
        "--seconds", type=float, default=None, help="minimum timed seconds per run (default 2)"
    )
    parser.add_argument("--warmup", type=int, default=None, help="untimed vector steps per run (default 100)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 1 repeat, 0.25 s, 10 warm-up steps unless given"
    )
    add_json_option(parser)
    args = parser.parse_args(argv)
    tasks = tuple(task.strip() for task in args.tasks.split(",") if task.strip())
    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; expected some of {list(TASKS)}")
    quick = args.quick
    repeats = args.repeats if args.repeats is not None else (1 if quick else 5)
    seconds = args.seconds if args.seconds is not None else (0.25 if quick else 2.0)
    warmup = args.warmup if args.warmup is not None else (10 if quick else 100)
    result = run(tasks, args.workers, repeats, seconds, warmup)
    result["settings"]["quick"] = quick
    print("\n" + tables(result))
    if args.json is not None:
        path = write_json(result, args.json, "process_workers")
        print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
