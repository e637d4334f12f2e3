"""Atari PPO on Pong: phalanx against CleanRL's ``ppo_atari_envpool.py``, equal settings, equal env steps.

Both sides train PPO on EnvPool's ``Pong-v5`` (EnvPool's own Atari preprocessing: 30 no-op resets,
frame skip 4 with max-pooling, fire reset, 84x84 grey, 4 stacked frames, sticky actions off, at most
27,000 steps an episode) with CleanRL's Atari settings: 8 envs x 128 steps, lr 2.5e-4 annealed to 0,
4 epochs of 4 minibatches (256 samples), clip 0.1 for the ratio and the value loss, entropy 0.01,
value coefficient 0.5, gamma 0.99, GAE lambda 0.95, gradient norm 0.5, advantages normalised per
minibatch; the Nature CNN (3 convolutions, a 512-unit layer) shared by the policy and value heads,
which are single linear layers (phalanx: ``--encoder nature --share-encoder --hidden-sizes`` with no
sizes). CleanRL also asks EnvPool for ``episodic_life=True, reward_clip=True``; neither changes Pong
(it has no lives, and its rewards are already -1 and +1), so phalanx's ``envpool:Pong-v5`` with
EnvPool's defaults steps the same game.

CleanRL's script runs unmodified, from a checkout of its repository at the commit measured
(benchmarks/.peers/cleanrl-src; the script says how to clone it: CleanRL's code is not kept here) in a
virtualenv of its own that this script creates on first use under
benchmarks/.peers/cleanrl-atari with pinned versions. The script is written against gym 0.23's API
(``reset()`` returns the observations, ``step`` four values) and EnvPool's ``env_type="gym"``; EnvPool
1.x speaks only Gymnasium's API, so the virtualenv has EnvPool 0.8.4 (the oldest with Python 3.11
wheels; CleanRL pins ``envpool<0.7``) with gym 0.23.1, while phalanx runs EnvPool 1.2.5. Both step
the same ALE emulator in C++ threads; ``env-only steps/s`` in the table measures each EnvPool on its
own (random actions, no network), so that a difference between the EnvPools is not taken for one
between the libraries.

What is measured, per run (a process of its own, one after another):
- env steps/s (whole process): the env steps over the process's wall time, from its start to its
  exit (imports, env creation, training), less phalanx's evaluation of one episode at the end (CleanRL
  does not evaluate; the evaluation's time is in the JSON as ``final_evaluation_s``).
- env steps/s (its own clock): CleanRL's last ``SPS:`` print (global steps over the time since the
  envs were built); phalanx's last metrics.csv row (steps over wall_time_s), less ``compile_time_s``
  when compiled.
- final return: the mean game score (-21..21) of the training episodes that ended in the last 20% of
  the env steps (CleanRL: its printed ``episodic_return`` lines; phalanx: the metrics.csv rows, logged
  every update, weighted by their episode counts).

Pong barely moves within a budget this 2-core CPU affords: the returns stay near -21 (CleanRL needs
about 2M env steps to start winning points and ~10M to win games). The point of the comparison is the
speed at equal work; the returns are reported so that a broken learner would show, not as a result.

Usage (from the repository root, with phalanx's virtualenv; the envpool extra installed):
    PYTHONPATH=src python benchmarks/atari_pong.py                       # 50k steps a run, 1 and 2 threads
    PYTHONPATH=src python benchmarks/atari_pong.py --steps 8192 --threads 1    # a quick try
    PYTHONPATH=src python benchmarks/atari_pong.py --only phalanx --compile --json out.json
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import (  # noqa: E402
    add_json_option,
    final_evaluation_seconds,
    machine_info,
    markdown_table,
    peer_checkout,
    peer_python,
    peer_source,
    run_child,
    run_process,
    thread_environment,
    write_json,
)

PEER = "cleanrl-atari"
# CleanRL's ppo_atari_envpool.py needs gym's old step API from EnvPool (see the module docstring);
# numpy 1.x because gym 0.23 predates numpy 2.
PEER_PACKAGES = [
    "torch==2.13.0",
    "envpool==0.8.4",
    "gym==0.23.1",
    "gymnasium==0.29.1",
    "numpy==1.26.4",
    "tyro==1.0.17",
    "tensorboard==2.21.0",
]
CLEANRL_SCRIPT = "cleanrl/ppo_atari_envpool.py"  # in CleanRL's checkout
GAME = "Pong-v5"

# CleanRL's ppo_atari_envpool.py defaults, passed to both sides.
NUM_ENVS = 8
NUM_STEPS = 128
LEARNING_RATE = 2.5e-4
EPOCHS = 4
MINIBATCHES = 4
CLIP = 0.1
ENTROPY_COEF = 0.01
VALUE_COEF = 0.5
GAMMA = 0.99
GAE_LAMBDA = 0.95
MAX_GRAD_NORM = 0.5
BATCH = NUM_ENVS * NUM_STEPS

TAIL_FRACTION = 0.2  # the final return: episodes that ended in the last 20% of the env steps
ENV_ONLY_STEPS = 20_000  # env steps of the env-only measurement of each EnvPool


def whole_updates(steps: int) -> int:
    """``steps`` rounded down to whole updates of BATCH env steps (at least one)."""
    return max(1, steps // BATCH) * BATCH


def tail_start(total_steps: int) -> float:
    return total_steps * (1.0 - TAIL_FRACTION)


# -- CleanRL: its script as it is, in its virtualenv --------------------------------------------------------
def cleanrl_command(python: Path, total_steps: int, seed: int, device: str) -> list[str]:
    return [
        str(python),
        str(peer_checkout("cleanrl") / CLEANRL_SCRIPT),
        f"--env-id={GAME}",
        f"--seed={seed}",
        "--cuda" if device.startswith("cuda") else "--no-cuda",
        f"--total-timesteps={total_steps}",
        f"--num-envs={NUM_ENVS}",
        f"--num-steps={NUM_STEPS}",
        f"--learning-rate={LEARNING_RATE}",
        "--anneal-lr",
        f"--update-epochs={EPOCHS}",
        f"--num-minibatches={MINIBATCHES}",
        f"--clip-coef={CLIP}",
        "--clip-vloss",
        "--norm-adv",
        f"--ent-coef={ENTROPY_COEF}",
        f"--vf-coef={VALUE_COEF}",
        f"--gamma={GAMMA}",
        f"--gae-lambda={GAE_LAMBDA}",
        f"--max-grad-norm={MAX_GRAD_NORM}",
    ]


def parse_cleanrl(output: str, total_steps: int) -> dict[str, Any]:
    """What CleanRL's prints say: its last SPS and the final return (see the module docstring)."""
    speeds = re.findall(r"^SPS: (\d+)$", output, re.MULTILINE)
    episodes = [
        (int(step), float(value))
        for step, value in re.findall(
            r"^global_step=(\d+), episodic_return=\[?([-+\d.eE]+)\]?$", output, re.MULTILINE
        )
    ]
    tail = [value for step, value in episodes if step > tail_start(total_steps)]
    return {
        "own_clock_steps_per_s": float(speeds[-1]) if speeds else None,
        "episodes": len(episodes),
        "final_episodes": len(tail),
        "final_return": sum(tail) / len(tail) if tail else None,
    }


def run_cleanrl(
    python: Path, total_steps: int, seed: int, threads: int, device: str, log: Path
) -> dict[str, Any]:
    command = cleanrl_command(python, total_steps, seed, device)
    workdir = Path(tempfile.mkdtemp(prefix="atari_pong-cleanrl-"))  # its runs/ (TensorBoard) go there
    code, output, process_s = run_process(command, log, cwd=workdir, environment=thread_environment(threads))
    parsed = parse_cleanrl(output, total_steps)
    result = {"command": shlex.join(command), "log": str(log), "process_s": process_s}
    if code != 0 or parsed["own_clock_steps_per_s"] is None:
        return {**result, "error": f"exit {code}, see {log}"}
    return {
        **result,
        **parsed,
        "steps": total_steps,
        "process_steps_per_s": total_steps / process_s,
        "compile_s": None,
    }


# -- phalanx: `phalanx train ppo envpool:Pong-v5` with the same settings -------------------------------------
def phalanx_arguments(
    total_steps: int, seed: int, threads: int, device: str, compile: bool, run_dir: Path
) -> list[str]:
    """The flags of ``phalanx train ppo envpool:Pong-v5`` for this comparison (every setting explicit, so
    that a preset for the game changes nothing)."""
    return [
        "train",
        "ppo",
        f"envpool:{GAME}",
        "--num-envs",
        str(NUM_ENVS),
        "--total-steps",
        str(total_steps),
        "--seed",
        str(seed),
        "--device",
        device,
        "--torch-threads",
        str(threads),
        "--compile" if compile else "--no-compile",
        "--run-dir",
        str(run_dir),
        "--log-every",
        str(BATCH),  # a metrics.csv row per update: the final return's window is exact
        "--eval-every",
        "0",  # no evaluation during training (CleanRL has none) ...
        "--eval-episodes",
        "1",  # ... and the shortest one at the end
        "--no-eval-process",
        "--no-normalize-obs",
        "--no-normalize-reward",
        "--encoder",
        "nature",
        "--share-encoder",
        "--hidden-sizes",  # no sizes: linear policy and value heads on the encoder's 512 features
        "--horizon",
        str(NUM_STEPS),
        "--epochs",
        str(EPOCHS),
        "--minibatch-size",
        str(BATCH // MINIBATCHES),
        "--learning-rate",
        str(LEARNING_RATE),
        "--anneal-lr",
        "--clip-range",
        str(CLIP),
        "--clip-value",
        str(CLIP),
        "--normalize-advantages",
        "--target-kl",
        "None",
        "--entropy-coef",
        str(ENTROPY_COEF),
        "--value-coef",
        str(VALUE_COEF),
        "--gamma",
        str(GAMMA),
        "--gae-lambda",
        str(GAE_LAMBDA),
        "--max-grad-norm",
        str(MAX_GRAD_NORM),
    ]


def parse_phalanx(run_dir: Path, total_steps: int) -> dict[str, Any]:
    """What a finished phalanx run's files say: its own-clock speed and the final return."""
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    compile_s = summary.get("compile_time_s") or 0.0
    last = rows[-1]
    tail = [
        (int(row["episodes"]), float(row["episode_return_mean"]))
        for row in rows
        if row.get("episode_return_mean") and int(row["steps"]) > tail_start(total_steps)
    ]
    episodes = sum(count for count, _ in tail)
    return {
        "steps": summary["total_steps"],
        "own_clock_steps_per_s": int(last["steps"]) / (float(last["wall_time_s"]) - compile_s),
        "compile_s": summary.get("compile_time_s"),
        "episodes": sum(int(row["episodes"] or 0) for row in rows),
        "final_episodes": episodes,
        "final_return": sum(count * mean for count, mean in tail) / episodes if episodes else None,
        "eval_return": summary["eval_return_mean"],
        "error_in_summary": summary["error"],
    }


def run_phalanx(
    total_steps: int, seed: int, threads: int, device: str, compile: bool, log: Path
) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="atari_pong-phalanx-")) / "run"
    arguments = phalanx_arguments(total_steps, seed, threads, device, compile, run_dir)
    command = [sys.executable, "-m", "phalanx.cli", *arguments]
    code, _, process_s = run_process(command, log, environment=thread_environment(threads))
    result = {
        "command": "phalanx " + shlex.join(arguments),
        "log": str(log),
        "run_dir": str(run_dir),
        "process_s": process_s,
    }
    if code != 0 or not (run_dir / "summary.json").is_file():
        print(
            f"  phalanx failed (exit {code}); the end of {log}:\n"
            + "\n".join("    " + line for line in log.read_text().splitlines()[-15:])
            + f"\n  to rerun it by hand: PYTHONPATH=src {shlex.join(command)}",
            flush=True,
        )
        return {**result, "error": f"exit {code}, see {log}"}
    parsed = parse_phalanx(run_dir, total_steps)
    evaluation_s = final_evaluation_seconds(run_dir)
    return {
        **result,
        **parsed,
        "final_evaluation_s": evaluation_s,
        "process_steps_per_s": parsed["steps"] / (process_s - evaluation_s),
    }


# -- each EnvPool on its own: runs in the peer's virtualenv and in phalanx's, with --child env-only --------
def child_env_only(steps: int, seed: int) -> dict[str, Any]:
    """Step ``GAME`` with uniformly random actions in EnvPool (as CleanRL builds it): env steps/s."""
    import envpool
    import numpy as np

    pool = envpool.make(
        GAME,
        env_type="gymnasium",
        num_envs=NUM_ENVS,
        episodic_life=True,
        reward_clip=True,
        seed=seed,
    )
    pool.reset()
    generator = np.random.default_rng(seed)
    actions = generator.integers(0, pool.action_space.n, size=(steps // NUM_ENVS, NUM_ENVS))
    start = time.perf_counter()
    for row in actions:
        pool.step(row)
    seconds = time.perf_counter() - start
    return {"envpool": envpool.__version__, "steps": actions.size, "steps_per_s": actions.size / seconds}


def env_only(python: Path | str, seed: int, log: Path) -> dict[str, Any]:
    command = [
        str(python),
        __file__,
        "--child",
        "env-only",
        "--steps",
        str(ENV_ONLY_STEPS),
        "--seed",
        str(seed),
    ]
    return run_child(command, log, environment=thread_environment(1))


# -- the comparison ----------------------------------------------------------------------------------------
def table(runs: dict[str, dict[str, Any]], env_speeds: dict[str, dict[str, Any]]) -> str:
    header = [
        "run",
        "env steps",
        "env steps/s (whole process)",
        "env steps/s (its own clock)",
        "compile s",
        "final return (episodes)",
        "EnvPool",
        "env-only steps/s",
    ]
    rows = []
    for label, result in runs.items():
        library = "CleanRL" if label.startswith("CleanRL") else "phalanx"
        env_speed = env_speeds.get(library, {})
        env_columns = [env_speed.get("envpool", "-"), env_speed.get("steps_per_s", "-")]
        if "error" in result:
            rows.append([label, f"not run: {result['error']}", "", "", "", "", *env_columns])
            continue
        final = "n/a" if result["final_return"] is None else f"{result['final_return']:.2f}"
        rows.append(
            [
                label,
                result["steps"],
                result["process_steps_per_s"],
                result["own_clock_steps_per_s"],
                "n/a" if result["compile_s"] is None else result["compile_s"],
                f"{final} ({result['final_episodes']})",
                *env_columns,
            ]
        )
    return markdown_table(header, rows)


def speedups(runs: dict[str, dict[str, Any]], threads: list[int]) -> list[str]:
    """phalanx's speed over CleanRL's at each thread count, by each clock."""
    lines = []
    for count in threads:
        peer = runs.get(f"CleanRL, {count} thread(s)")
        for label, result in runs.items():
            if not label.startswith("phalanx") or not label.endswith(f", {count} thread(s)"):
                continue
            if peer is None or "error" in peer or "error" in result:
                continue
            lines.append(
                f"{label} / CleanRL: {result['process_steps_per_s'] / peer['process_steps_per_s']:.2f}x "
                f"(whole process), {result['own_clock_steps_per_s'] / peer['own_clock_steps_per_s']:.2f}x "
                "(own clocks)"
            )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=50_000, help="env steps of every run (rounded down to whole updates)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="torch threads of both libraries; a run per count (0: torch's default)",
    )
    parser.add_argument("--only", choices=["phalanx", "cleanrl"], help="run only this library")
    parser.add_argument(
        "--compile", action="store_true", help="also run phalanx compiled (--compile: torch.compile)"
    )
    parser.add_argument("--device", default="cpu", help="both libraries' torch device (cpu or cuda)")
    parser.add_argument("--seed", type=int, default=1)
    add_json_option(parser)
    parser.add_argument("--child", choices=["env-only"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child == "env-only":
        print("RESULT " + json.dumps(child_env_only(args.steps, args.seed)))
        return {}

    total_steps = whole_updates(args.steps)
    libraries = [args.only] if args.only else ["cleanrl", "phalanx"]
    if "cleanrl" in libraries:
        peer_source("cleanrl", [CLEANRL_SCRIPT])
    python = peer_python(PEER, PEER_PACKAGES) if "cleanrl" in libraries else None
    logs = Path(tempfile.mkdtemp(prefix="atari_pong-logs-"))
    machine = machine_info(args.device)
    print(f"machine: {machine}\n{total_steps:,} env steps a run; logs in {logs}\n", flush=True)

    env_speeds: dict[str, dict[str, Any]] = {}
    if python is not None:
        env_speeds["CleanRL"] = env_only(python, args.seed, logs / "env-only-cleanrl.log")
    if "phalanx" in libraries:
        env_speeds["phalanx"] = env_only(sys.executable, args.seed, logs / "env-only-phalanx.log")
    print(f"env only ({ENV_ONLY_STEPS:,} random steps, 1 thread): {env_speeds}\n", flush=True)

    runs: dict[str, dict[str, Any]] = {}
    for threads in args.threads:
        suffix = f", {threads} thread(s)"
        if "cleanrl" in libraries:
            if python is None:
                runs["CleanRL" + suffix] = {"error": "its virtualenv could not be set up (see above)"}
            else:
                print(f"== CleanRL{suffix}", flush=True)
                runs["CleanRL" + suffix] = run_cleanrl(
                    python, total_steps, args.seed, threads, args.device, logs / f"cleanrl-t{threads}.log"
                )
        if "phalanx" in libraries:
            for compile in [False, True] if args.compile else [False]:
                mode = "compiled" if compile else "eager"
                print(f"== phalanx {mode}{suffix}", flush=True)
                runs[f"phalanx {mode}{suffix}"] = run_phalanx(
                    total_steps,
                    args.seed,
                    threads,
                    args.device,
                    compile,
                    logs / f"phalanx-{mode}-t{threads}.log",
                )
    for label, result in runs.items():
        print(f"  {label}: {result}", flush=True)
    print("\n" + table(runs, env_speeds) + "\n", flush=True)
    for line in speedups(runs, args.threads):
        print(line)
    results = {
        "machine": machine,
        "game": GAME,
        "steps": total_steps,
        "seed": args.seed,
        "device": args.device,
        "peer_packages": PEER_PACKAGES,
        "env_only": env_speeds,
        "runs": runs,
    }
    if args.json is not None:
        print(f"wrote {write_json(results, args.json, 'atari_pong')}")
    return results


if __name__ == "__main__":
    main()
