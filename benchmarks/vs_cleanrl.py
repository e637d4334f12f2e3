"""MuJoCo PPO and SAC: phalanx's presets against CleanRL's ``ppo_continuous_action.py`` and
``sac_continuous_action.py``, the same env, env steps and seeds, one run after another (or with
``--concurrent`` both sides of a pair at the same time, one core each).

CleanRL's scripts run unmodified, from a checkout of its repository at the commit measured
(benchmarks/.peers/cleanrl-src, with the ``cleanrl_utils/buffers.py`` the SAC script imports; the script
says how to clone it: CleanRL's code is not kept here) with their own defaults (the PPO paper's MuJoCo
settings; SAC with a 5k-step random warm-up), in a virtualenv of their own that this script creates on first
use under benchmarks/.peers/cleanrl-mujoco with pinned versions. phalanx runs ``phalanx train ALGO ENV``
with its shipped MuJoCo preset.

The env version. CleanRL's scripts at that commit read Gymnasium 0.29's vector-env API
(``infos["final_info"]``, ``infos["final_observation"]``), which Gymnasium 1.x removed, and CleanRL pins
``gymnasium==0.29.1``; the MuJoCo v5 ids came with Gymnasium 1.0, so CleanRL cannot run them unmodified.
Both sides therefore run the v4 ids (``HalfCheetah-v4``, ``Hopper-v4``, ...; CleanRL's published
MuJoCo results are on v4 too): CleanRL through Gymnasium 0.29.1, phalanx through its Gymnasium 1.4, which
still registers them. phalanx's presets are keyed by the v5 ids, so a bare ``phalanx train ppo
HalfCheetah-v4`` would run the algorithm's defaults: this script writes the v5 id's preset to a config
file and passes it with ``--config`` (every setting of the preset, nothing else). Both virtualenvs have
MuJoCo 4.0.0 (CleanRL's own pin, ``mujoco<=2.3.3``, is for its Python <3.11), so both sides step the
same simulator build; the ``same env`` check at the start steps the env in each virtualenv with the same
seed and actions and compares the trajectories (and times the env alone on each side).

What is measured, per run (a process of its own; CleanRL then phalanx for each seed, or both at once):
- wall time: each side's own clock, which starts once its envs are built (the processes' imports and
  env creation are not training), to the end: phalanx's ``wall_time_s`` (summary.json, its final
  evaluation in it); CleanRL's from its ``start_time`` (not printed: found to a fraction of a second from
  its timed ``SPS:`` prints, see ``parse_cleanrl``) to its process's exit. The processes' whole wall
  times are recorded too.
- final return: CleanRL's, the mean return of the training episodes that ended in the last 10% of the
  env steps (its printed ``episodic_return`` lines; its policy samples, and CleanRL does not evaluate);
  phalanx's, its last evaluation (the preset's deterministic episodes, evaluations.csv) and its best, and
  like for like with CleanRL's, its training episodes' mean return over the last 10% (metrics.csv).
- time ratio: the ``wall_time_s`` of phalanx's first evaluation whose mean return reaches CleanRL's
  final return for the same seed (the time at which the weights evaluated existed; phalanx's earlier
  evaluations are in it, CleanRL spends no time evaluating) over CleanRL's wall time. Below 1: phalanx
  got there sooner. A seed phalanx never brings to CleanRL's return has no ratio, and counts as slowest in
  the median over seeds. A deterministic policy's return is usually above the sampling policy's that
  CleanRL's return is of, so the table also gives the ratio by phalanx's training episodes: its first
  metrics.csv row (the episodes that ended since the row before, ~10 at the default ``log_every``) whose
  mean reaches CleanRL's final return.

Results: a JSON file (``--output``, default benchmarks/results/vs_cleanrl-<date>.json) rewritten after
every run, and next to it a directory of the same name with the runs' logs, CleanRL's TensorBoard files
and phalanx's run directories (without checkpoints). Run the same command with ``--output`` naming an
existing file to go on after an interruption: runs it holds with the same settings are not run again.

Usage (from the repository root, with phalanx's virtualenv and the mujoco extra):
    PYTHONPATH=src python benchmarks/vs_cleanrl.py     # PPO 1M, SAC 300k; HalfCheetah, Hopper; 3 seeds
    PYTHONPATH=src python benchmarks/vs_cleanrl.py --algos sac --envs Walker2d-v4 --seeds 1
    PYTHONPATH=src python benchmarks/vs_cleanrl.py --steps ppo=10240 sac=6000 --learning-starts 1000 \\
        --eval-every 2048 --seeds 1 --envs HalfCheetah-v4       # a few minutes: the whole pipeline
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import re
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import (  # noqa: E402
    RESULTS_DIR,
    machine_info,
    markdown_table,
    peer_checkout,
    peer_python,
    peer_source,
    run_child,
    run_process,
    run_process_timed,
    thread_environment,
)

PEER = "cleanrl-mujoco"
# CleanRL pins gymnasium 0.29.1 (the vector-env API its scripts read); its MuJoCo envs need mujoco and
# imageio (gymnasium[mujoco]); MuJoCo 4.0.0 as phalanx's virtualenv has; numpy 1.x, as Gymnasium 0.29
# predates numpy 2.
PEER_PACKAGES = [
    "torch==2.13.0",
    "gymnasium==0.29.1",
    "mujoco==4.0.0",
    "imageio==2.38.0",
    "numpy==1.26.4",
    "tyro==1.0.17",
    "tensorboard==2.21.0",
]
CLEANRL_SCRIPTS = {  # in CleanRL's checkout
    "ppo": "cleanrl/ppo_continuous_action.py",
    "sac": "cleanrl/sac_continuous_action.py",
}
# The budgets: PPO 1M env steps, SAC 300k (this CPU; 1M on a GPU).
DEFAULT_STEPS = {"ppo": 1_000_000, "sac": 300_000}
CLEANRL_PPO_BATCH = 2048  # its defaults: 1 env x 2048 steps per update; the budget is whole updates
CLEANRL_SAC_LEARNING_STARTS = 5_000  # its default random warm-up
# The v4 ids Gymnasium 0.29.1 registers that have a phalanx preset (under their v5 id).
ENVS = ["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Ant-v4", "Humanoid-v4"]
FINAL_FRACTION = 0.1  # CleanRL's final return: episodes that ended in the last 10% of the env steps
ENV_CHECK_STEPS = 2_000


# -- the plan -------------------------------------------------------------------------------------------
def parse_steps(values: list[str], algos: list[str]) -> dict[str, int]:
    """``--steps``: one number for every algorithm, or ``ALGO=N`` pairs (the others keep DEFAULT_STEPS)."""
    steps = {algo: DEFAULT_STEPS[algo] for algo in algos}
    for value in values:
        algo, equals, number = value.rpartition("=")
        if equals and algo not in DEFAULT_STEPS:
            raise SystemExit(
                f"--steps {value}: {algo!r} is not an algorithm of this benchmark; expected "
                f"{' or '.join(f'{name}=N' for name in DEFAULT_STEPS)}, or a number for all."
            )
        try:
            count = int(number.replace("_", ""))
        except ValueError:
            raise SystemExit(f"--steps {value}: {number!r} is not a whole number of env steps.") from None
        if count <= 0:
            raise SystemExit(f"--steps {value}: the budget must be positive.")
        if equals:
            if algo in steps:
                steps[algo] = count
        else:
            steps = dict.fromkeys(steps, count)
    return steps


def check_envs(envs: list[str]) -> None:
    """The ids both sides can run: Gymnasium 0.29.1's v4 ids with a phalanx preset (see the docstring)."""
    for env in envs:
        if env in ENVS:
            continue
        v4 = re.sub(r"-v\d+$", "-v4", env)
        hint = (
            f" CleanRL's scripts need Gymnasium 0.29.1, which has no v5 ids: use {v4} (phalanx runs it with "
            f"the {env} preset)."
            if v4 in ENVS
            else ""
        )
        raise SystemExit(f"--envs {env}: not an env of this comparison.{hint} Choose from {', '.join(ENVS)}.")


def preset_id(env: str) -> str:
    """The id whose phalanx preset a v4 id runs with: HalfCheetah-v4 -> HalfCheetah-v5."""
    return re.sub(r"-v4$", "-v5", env)


def run_name(library: str, algo: str, env: str, seed: int) -> str:
    return f"{library}-{algo}-{env}-s{seed}"


# -- CleanRL: its script as it is, in its virtualenv --------------------------------------------------------
def cleanrl_command(
    python: Path | str, algo: str, env: str, seed: int, steps: int, learning_starts: int | None
) -> list[str]:
    command = [
        str(python),
        str(peer_checkout("cleanrl") / CLEANRL_SCRIPTS[algo]),
        f"--env-id={env}",
        f"--seed={seed}",
        f"--total-timesteps={steps}",
        "--no-cuda",
    ]
    if algo == "sac" and learning_starts is not None:
        command.append(f"--learning-starts={learning_starts}")
    return command


def cleanrl_steps(algo: str, steps: int) -> int:
    """The env steps CleanRL's script runs for ``--total-timesteps=steps``."""
    return steps // CLEANRL_PPO_BATCH * CLEANRL_PPO_BATCH if algo == "ppo" else steps


def sps_steps(algo: str, learning_starts: int | None) -> Iterator[int]:
    """The global steps at which CleanRL's script prints ``SPS:``, in order: PPO after every update of
    2,048 steps, SAC every 100 steps once it learns (after ``learning_starts``, 5,000 by default)."""
    if algo == "ppo":
        return itertools.count(CLEANRL_PPO_BATCH, CLEANRL_PPO_BATCH)
    warm_up = CLEANRL_SAC_LEARNING_STARTS if learning_starts is None else learning_starts
    return itertools.count((warm_up // 100 + 1) * 100, 100)


def parse_cleanrl(
    lines: list[tuple[float, str]], algo: str, steps: int, learning_starts: int | None, exit_s: float
) -> dict[str, Any]:
    """What CleanRL's prints, timed as they came (seconds since its process started), say about a run of
    ``steps`` env steps: when its clock started, its wall time from then to its exit, and its final return
    (the episodes that ended in the last FINAL_FRACTION of the steps).

    Its clock (``start_time``, set once its envs are built) is not printed, but each ``SPS: N`` line at
    global step g says N = int(g / (t - start)): start >= t - g / N for every line; the latest of these
    bounds is taken (within g / (N (N + 1)) of the truth, a fraction of a second at the first lines)."""
    timeline = sps_steps(algo, learning_starts)
    bounds = []  # [lower, upper] bound of the start from each SPS line
    episodes = []  # [step, seconds since its clock started (set below), return]
    for seconds, line in lines:
        if match := re.fullmatch(r"SPS: (\d+)", line):
            speed, step = int(match[1]), next(timeline)
            if speed > 0:
                bounds.append([seconds - step / speed, seconds - step / (speed + 1)])
        elif match := re.fullmatch(r"global_step=(\d+), episodic_return=\[?([-+\d.eE]+)\]?", line):
            episodes.append([int(match[1]), seconds, float(match[2])])
    final = [value for step, _, value in episodes if step >= steps * (1.0 - FINAL_FRACTION)]
    result: dict[str, Any] = {
        "steps": steps,
        "wall_time_s": None,
        "episodes": len(episodes),
        "final_episodes": len(final),
        "final_return": statistics.fmean(final) if final else None,
    }
    if not bounds:
        return result
    start = max(lower for lower, _ in bounds)
    for episode in episodes:
        episode[1] -= start
    wall_time = exit_s - start
    return {
        **result,
        "wall_time_s": wall_time,
        "own_clock_steps_per_s": steps / wall_time,
        "setup_s": start,  # its imports and env creation, before its clock started
        "start_uncertainty_s": max(0.0, min(upper for _, upper in bounds) - start),
        "episode_returns": episodes,  # [step, seconds on its clock, return] of every training episode
    }


def run_cleanrl(
    python: Path,
    algo: str,
    env: str,
    seed: int,
    steps: int,
    learning_starts: int | None,
    threads: int,
    out: Path,
) -> dict[str, Any]:
    command = cleanrl_command(python, algo, env, seed, steps, learning_starts)
    workdir = out / run_name("cleanrl", algo, env, seed)  # its runs/ (TensorBoard files) go there
    shutil.rmtree(workdir, ignore_errors=True)  # what an interrupted attempt left
    workdir.mkdir(parents=True)
    # cleanrl_utils (the SAC script imports its ReplayBuffer) is at the checkout's top
    environment = {**thread_environment(threads), "PYTHONPATH": str(peer_checkout("cleanrl"))}
    log = workdir / "output.log"
    code, lines, process_s = run_process_timed(command, log, cwd=workdir, environment=environment)
    result = {"command": shlex.join(command), "log": str(log), "process_s": process_s}
    parsed = parse_cleanrl(lines, algo, cleanrl_steps(algo, steps), learning_starts, process_s)
    if code != 0 or parsed["wall_time_s"] is None:
        tail = "\n".join("    " + line for _, line in lines[-15:])
        print(f"  CleanRL failed (exit {code}); the end of {log}:\n{tail}", flush=True)
        return {**result, "error": f"exit {code}, see {log}"}
    return {**result, **parsed}


# -- phalanx: `phalanx train ALGO ENV` with the v5 id's preset ----------------------------------------------
def write_preset_config(algo: str, env: str, directory: Path) -> Path:
    """The phalanx preset of ``env``'s v5 id as a config file for ``--config`` (see the docstring)."""
    import yaml

    from phalanx.config import presets

    preset = presets(algo).get(preset_id(env))
    if preset is None:
        raise SystemExit(f"phalanx has no {algo} preset for {preset_id(env)} (the preset {env} runs with).")
    path = directory / f"preset-{algo}-{preset_id(env)}.yaml"
    path.write_text(
        f"# phalanx's shipped {algo} preset for {preset_id(env)}, run on {env}\n"
        + yaml.safe_dump(preset, sort_keys=False)
    )
    return path


def phalanx_arguments(
    algo: str,
    env: str,
    seed: int,
    steps: int,
    learning_starts: int | None,
    eval_every: int | None,
    threads: int,
    config: Path,
    run_dir: Path,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The ``phalanx train`` flags of a run: the preset (``config``), then the comparison's settings, then
    ``extra`` (``--phalanx-flags``, e.g. ``--compile``)."""
    arguments = [
        "train",
        algo,
        env,
        "--config",
        str(config),
        "--seed",
        str(seed),
        "--total-steps",
        str(steps),
        "--torch-threads",
        str(threads),
        "--run-dir",
        str(run_dir),
    ]
    if algo == "sac" and learning_starts is not None:
        arguments += ["--learning-starts", str(learning_starts)]
    if eval_every is not None:
        arguments += ["--eval-every", str(eval_every)]
    return arguments + list(extra)


def read_table(path: Path) -> list[dict[str, float]]:
    """A run's CSV file (evaluations.csv, metrics.csv) as numbers, empty cells left out."""
    import csv

    if not path.is_file():
        return []
    with open(path) as handle:
        return [{key: float(value) for key, value in row.items() if value} for row in csv.DictReader(handle)]


def time_to_reach(curve: list[list[float]], target: float | None) -> list[float] | None:
    """The first ``[step, wall_time_s, mean return, ...]`` row of ``curve`` whose return reaches
    ``target``, or None."""
    if target is None:
        return None
    return next((row for row in curve if row[2] >= target), None)


def parse_phalanx(run_dir: Path, steps: int) -> dict[str, Any]:
    """What a finished phalanx run's files say: its own wall time and speed, its evaluations, and the
    returns of its training episodes (metrics.csv; the final one over the last FINAL_FRACTION of ``steps``,
    weighted by the episodes of each row), which compare with CleanRL's like for like."""
    summary = json.loads((run_dir / "summary.json").read_text())
    training = [
        [row["steps"], row["wall_time_s"], row["episode_return_mean"], row["episodes"]]
        for row in read_table(run_dir / "metrics.csv")
        if "episode_return_mean" in row
    ]
    final = [row for row in training if row[0] > steps * (1.0 - FINAL_FRACTION)]
    final_episodes = sum(row[3] for row in final)
    return {
        "steps": summary["total_steps"],
        "wall_time_s": summary["wall_time_s"],
        "own_clock_steps_per_s": summary["steps_per_second"],
        "final_return": summary["eval_return_mean"],
        "best_return": summary["best_eval_return"],
        "best_return_steps": summary["best_eval_steps"],
        "final_training_return": (
            sum(row[2] * row[3] for row in final) / final_episodes if final_episodes else None
        ),
        "final_training_episodes": int(final_episodes),
        "evaluations": [  # [step, wall_time_s, mean return] of every evaluation
            [row["steps"], row["wall_time_s"], row["eval_return_mean"]]
            for row in read_table(run_dir / "evaluations.csv")
        ],
        "training_returns": training,  # [step, wall_time_s, mean return, episodes] of every metrics row
        "error_in_summary": summary["error"],
    }


def run_phalanx(
    algo: str,
    env: str,
    seed: int,
    steps: int,
    learning_starts: int | None,
    eval_every: int | None,
    threads: int,
    out: Path,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    run_dir = out / run_name("phalanx", algo, env, seed)
    shutil.rmtree(run_dir, ignore_errors=True)  # what an interrupted attempt left
    config = write_preset_config(algo, env, out)
    arguments = phalanx_arguments(
        algo, env, seed, steps, learning_starts, eval_every, threads, config, run_dir, extra
    )
    command = [sys.executable, "-m", "phalanx.cli", *arguments]
    log = out / f"{run_dir.name}.log"
    code, _, process_s = run_process(command, log, environment=thread_environment(threads))
    result = {"command": "phalanx " + shlex.join(arguments), "log": str(log), "run_dir": str(run_dir)}
    result["process_s"] = process_s
    if code != 0 or not (run_dir / "summary.json").is_file():
        tail = "\n".join("    " + line for line in log.read_text().splitlines()[-15:])
        print(f"  phalanx failed (exit {code}); the end of {log}:\n{tail}", flush=True)
        return {**result, "error": f"exit {code}, see {log}"}
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the run directory stays, to be plotted
    return {**result, **parse_phalanx(run_dir, steps)}


# -- the same env on both sides: runs in each virtualenv with --child env-check --------------------------
def child_env_check(env_id: str, seed: int, steps: int) -> dict[str, Any]:
    """Step ``env_id`` with seeded uniform actions (a reset when an episode ends): the trajectory's summary
    and env steps/s, in whichever virtualenv runs it."""
    import gymnasium
    import mujoco
    import numpy as np

    env = gymnasium.make(env_id)
    generator = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    actions = generator.uniform(low, high, size=(steps, *low.shape)).astype(low.dtype)
    observation, _ = env.reset(seed=seed)
    first = observation.tolist()
    total_reward, episodes = 0.0, 0
    start = time.perf_counter()
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        total_reward += float(reward)
        if terminated or truncated:
            episodes += 1
            observation, _ = env.reset()
    seconds = time.perf_counter() - start
    return {
        "gymnasium": gymnasium.__version__,
        "mujoco": mujoco.__version__,
        "steps_per_s": steps / seconds,
        "first_observation": first,
        "last_observation": observation.tolist(),
        "total_reward": total_reward,
        "episodes": episodes,
    }


def env_check(python: Path | str, env: str, seed: int, log: Path) -> dict[str, Any]:
    command = [str(python), __file__, "--child", "env-check", "--envs", env, "--seeds", str(seed)]
    return run_child(command, log, environment=thread_environment(1))


def same_trajectory(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """How far apart the two sides' trajectories ended (0: the same env, the same physics)."""
    if "error" in ours or "error" in theirs:
        return {"same": None}
    difference = max(
        abs(a - b)
        for key in ("first_observation", "last_observation")
        for a, b in zip(ours[key], theirs[key], strict=True)
    )
    reward_difference = abs(ours["total_reward"] - theirs["total_reward"])
    return {
        "same": difference < 1e-6 and reward_difference < 1e-6 * max(1.0, abs(ours["total_reward"])),
        "max_observation_difference": difference,
        "total_reward_difference": reward_difference,
    }


# -- the comparison ----------------------------------------------------------------------------------------
def compare(cleanrl: dict[str, Any], phalanx: dict[str, Any]) -> dict[str, Any]:
    """phalanx's time to CleanRL's final return (same seed) over CleanRL's wall time: by phalanx's
    evaluations (the comparison's measure), and by its training episodes (like for like with CleanRL's
    training returns; a metrics row's mean is over fewer episodes than CleanRL's final window)."""
    pair: dict[str, Any] = {}
    for measure, curve in (("", "evaluations"), ("training_", "training_returns")):
        reached = None
        if "error" not in cleanrl and "error" not in phalanx:
            reached = time_to_reach(phalanx[curve], cleanrl["final_return"])
        pair[f"{measure}time_to_cleanrl_return_s"] = None if reached is None else reached[1]
        pair[f"{measure}steps_to_cleanrl_return"] = None if reached is None else int(reached[0])
        pair[f"{measure}time_ratio"] = None if reached is None else reached[1] / cleanrl["wall_time_s"]
    return pair


def median_ratio(pairs: list[dict[str, Any]], key: str = "time_ratio") -> float | None:
    """The median of the pairs' ``key`` (a time ratio) over seeds, a seed phalanx never brought to
    CleanRL's return counting as infinitely slow (None when most did not, or when no pair ran)."""
    ratios = [
        pair[key] if pair[key] is not None else math.inf
        for pair in pairs
        if "error" not in pair["cleanrl"] and "error" not in pair["phalanx"]
    ]
    if not ratios:
        return None
    median = statistics.median(ratios)
    return None if math.isinf(median) else median


def reached(pair: dict[str, Any], measure: str = "") -> str:
    """ "123 s (0.25)": phalanx's time to CleanRL's return (by ``measure``) and its ratio to CleanRL's."""
    ratio = pair[f"{measure}time_ratio"]
    return (
        "not reached"
        if ratio is None
        else f"{pair[f'{measure}time_to_cleanrl_return_s']:,.0f} s ({ratio:.2f})"
    )


def number(value: float | None) -> float | str:
    return "-" if value is None else value


TABLE_HEADER = [
    "run",
    "env steps",
    "CleanRL s",
    "CleanRL steps/s",
    "CleanRL final return (training episodes)",
    "phalanx s",
    "phalanx steps/s",
    "phalanx final eval (best)",
    "phalanx final training return",
    "phalanx to CleanRL's return, by evaluations (/ CleanRL s)",
    "by training episodes",
]


def rows(pairs: dict[str, dict[str, Any]]) -> list[list[Any]]:
    table = []
    for pair in pairs.values():
        cleanrl, phalanx = pair["cleanrl"], pair["phalanx"]
        label = f"{pair['algo']} {pair['env']} s{pair['seed']}"
        if "error" in cleanrl or "error" in phalanx:
            errors = [f"CleanRL: {cleanrl['error']}" if "error" in cleanrl else ""]
            errors += [f"phalanx: {phalanx['error']}" if "error" in phalanx else ""]
            table.append([label, *errors] + [""] * (len(TABLE_HEADER) - 3))
            continue
        table.append(
            [
                label,
                cleanrl["steps"],
                cleanrl["wall_time_s"],
                cleanrl["own_clock_steps_per_s"],
                number(cleanrl["final_return"]),
                phalanx["wall_time_s"],
                phalanx["own_clock_steps_per_s"],
                f"{phalanx['final_return']:,.0f} ({phalanx['best_return']:,.0f})",
                number(phalanx["final_training_return"]),
                reached(pair),
                reached(pair, "training_"),
            ]
        )
    return table


def table(pairs: dict[str, dict[str, Any]]) -> str:
    return markdown_table(TABLE_HEADER, rows(pairs))


def summaries(pairs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per algorithm and env, over seeds: the medians of each side's wall time and final return, and of the
    time ratios."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for pair in pairs.values():
        groups.setdefault(f"{pair['algo']} {pair['env']}", []).append(pair)

    def median_of(side: str, key: str, group: list[dict[str, Any]]) -> float | None:
        values = [p[side][key] for p in group if p[side].get(key) is not None]
        return statistics.median(values) if values else None

    return {
        name: {
            "seeds": [pair["seed"] for pair in group],
            "cleanrl_wall_time_s": median_of("cleanrl", "wall_time_s", group),
            "cleanrl_final_return": median_of("cleanrl", "final_return", group),
            "phalanx_wall_time_s": median_of("phalanx", "wall_time_s", group),
            "phalanx_final_return": median_of("phalanx", "final_return", group),
            "phalanx_final_training_return": median_of("phalanx", "final_training_return", group),
            "median_time_ratio": median_ratio(group),
            "median_training_time_ratio": median_ratio(group, "training_time_ratio"),
        }
        for name, group in groups.items()
    }


SUMMARY_COLUMNS = {
    "cleanrl_wall_time_s": "CleanRL s",
    "cleanrl_final_return": "CleanRL return",
    "phalanx_wall_time_s": "phalanx s",
    "phalanx_final_return": "phalanx eval",
    "phalanx_final_training_return": "phalanx training return",
    "median_time_ratio": "time ratio, by evaluations",
    "median_training_time_ratio": "by training episodes",
}


def summary_table(summary: dict[str, dict[str, Any]]) -> str:
    """The medians over seeds (a ratio of "-": phalanx did not reach CleanRL's return in most seeds)."""
    body = [
        [
            name,
            " ".join(str(seed) for seed in values["seeds"]),
            *(number(values[key]) for key in SUMMARY_COLUMNS),
        ]
        for name, values in summary.items()
    ]
    return markdown_table(["algo env (medians)", "seeds", *SUMMARY_COLUMNS.values()], body)


def settings_of(
    algo: str,
    steps: int,
    learning_starts: int | None,
    eval_every: int | None,
    threads: int,
    extra: tuple[str, ...] = (),
    concurrent: bool = False,
) -> dict[str, Any]:
    """What a pair of runs depends on besides its env and seed: a run recorded with other settings is run
    again when resuming."""
    return {
        "concurrent": concurrent,
        "steps": steps,
        "learning_starts": learning_starts if algo == "sac" else None,
        "eval_every": eval_every,
        "threads": threads,
        "phalanx_flags": list(extra),
        "peer_packages": PEER_PACKAGES,
    }


def write_results(results: dict[str, Any], path: Path) -> None:
    from phalanx.files import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(results, indent=2) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", choices=list(DEFAULT_STEPS), default=list(DEFAULT_STEPS))
    parser.add_argument(
        "--envs", nargs="+", default=["HalfCheetah-v4", "Hopper-v4"], help=f"of {', '.join(ENVS)}"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument(
        "--steps",
        nargs="+",
        default=[],
        metavar="N|ALGO=N",
        help="env steps of every run, or per algorithm: ppo=N sac=N (default: ppo=1000000 sac=300000)",
    )
    parser.add_argument(
        "--learning-starts",
        type=int,
        help="SAC's random warm-up steps on both sides (default: each its own: CleanRL 5,000, phalanx's "
        "preset 10,000)",
    )
    parser.add_argument(
        "--eval-every", type=int, help="phalanx's env steps between evaluations (default: its preset's)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of both libraries (0: torch's default, every core; their pools spin-wait, so "
        "on a busy 2-core machine 1 is faster for these small networks)",
    )
    parser.add_argument(
        "--phalanx-flags",
        default="",
        help="more `phalanx train` flags for phalanx's runs, e.g. --phalanx-flags=--compile",
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="run the two sides of a pair at the same time, one core each, instead of one after the other "
        "(half the wall time on two cores; both share the machine's memory bandwidth and caches alike)",
    )
    parser.add_argument(
        "--output", type=Path, help="results JSON (default benchmarks/results/vs_cleanrl-<date>.json)"
    )
    parser.add_argument("--child", choices=["env-check"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    check_envs(args.envs)
    if args.child == "env-check":
        print("RESULT " + json.dumps(child_env_check(args.envs[0], args.seeds[0], ENV_CHECK_STEPS)))
        return {}
    steps = parse_steps(args.steps, args.algos)
    extra = tuple(shlex.split(args.phalanx_flags))
    output = args.output or RESULTS_DIR / f"vs_cleanrl-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out = output.with_suffix("")  # the runs' directories and logs
    out.mkdir(parents=True, exist_ok=True)
    previous = json.loads(output.read_text()) if output.is_file() else {}
    if previous:
        print(f"going on from {output}: {len(previous.get('pairs', {}))} pair(s) recorded", flush=True)

    peer_source("cleanrl", list(CLEANRL_SCRIPTS.values()))
    python = peer_python(PEER, PEER_PACKAGES)
    if python is None:
        raise SystemExit("CleanRL's virtualenv could not be set up (see above); nothing was run.")
    machine = machine_info()
    print(f"machine: {machine}\nresults: {output}; runs and logs in {out}\n", flush=True)
    results: dict[str, Any] = {
        "machine": machine,
        "command": shlex.join(["python", "benchmarks/vs_cleanrl.py", *(argv or sys.argv[1:])]),
        "peer_packages": PEER_PACKAGES,
        "env_check": previous.get("env_check", {}),
        "pairs": previous.get("pairs", {}),
    }

    for env in args.envs:
        if env in results["env_check"] and results["env_check"][env].get("same"):
            continue
        print(f"== the same env: {env} stepped {ENV_CHECK_STEPS:,} times in each virtualenv", flush=True)
        theirs = env_check(python, env, args.seeds[0], out / f"env-check-cleanrl-{env}.log")
        ours = env_check(sys.executable, env, args.seeds[0], out / f"env-check-phalanx-{env}.log")
        check = {"cleanrl": theirs, "phalanx": ours, **same_trajectory(ours, theirs)}
        results["env_check"][env] = check
        print(
            f"  same trajectory: {check['same']} (max observation difference "
            f"{check.get('max_observation_difference')}); env-only steps/s: CleanRL's "
            f"{theirs.get('steps_per_s', 0):,.0f} (Gymnasium {theirs.get('gymnasium')}), phalanx's "
            f"{ours.get('steps_per_s', 0):,.0f} (Gymnasium {ours.get('gymnasium')})",
            flush=True,
        )
        write_results(results, output)

    for algo in args.algos:
        settings = settings_of(
            algo, steps[algo], args.learning_starts, args.eval_every, args.threads, extra, args.concurrent
        )
        for env in args.envs:
            for seed in args.seeds:
                key = f"{algo} {env} s{seed}"
                recorded = results["pairs"].get(key)
                if (
                    recorded
                    and recorded["settings"] == settings
                    and "time_ratio" in recorded
                    and not any("error" in recorded[side] for side in ("cleanrl", "phalanx"))
                ):
                    print(f"== {key}: recorded, not run again", flush=True)
                    continue
                when = "at the same time" if args.concurrent else "one after the other"
                print(f"== {key}: CleanRL and phalanx, {steps[algo]:,} env steps, {when}", flush=True)
                with ThreadPoolExecutor(max_workers=2 if args.concurrent else 1) as pool:
                    cleanrl_run = pool.submit(
                        run_cleanrl,
                        python,
                        algo,
                        env,
                        seed,
                        steps[algo],
                        args.learning_starts,
                        args.threads,
                        out,
                    )
                    phalanx_run = pool.submit(
                        run_phalanx,
                        algo,
                        env,
                        seed,
                        steps[algo],
                        args.learning_starts,
                        args.eval_every,
                        args.threads,
                        out,
                        extra,
                    )
                    cleanrl, phalanx = cleanrl_run.result(), phalanx_run.result()
                pair = {"algo": algo, "env": env, "seed": seed, "settings": settings}
                pair.update(cleanrl=cleanrl, phalanx=phalanx, **compare(cleanrl, phalanx))
                results["pairs"][key] = pair
                results["summary"] = summaries(results["pairs"])
                write_results(results, output)
                print("\n" + table({key: pair}) + "\n", flush=True)

    results["summary"] = summaries(results["pairs"])
    write_results(results, output)
    print("\n" + table(results["pairs"]) + "\n\n" + summary_table(results["summary"]) + "\n")
    print(f"wrote {output}")
    return results


if __name__ == "__main__":
    main()
