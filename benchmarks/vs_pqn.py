"""PQN side by side: CleanRL's ``pqn.py`` against ``phalanx train pqn``, the same settings, env steps and
seeds, one run after another (issue 38, part 3).

CleanRL's script runs unmodified, from a checkout of its repository at the commit measured
(benchmarks/.peers/cleanrl-src; the script says how to clone it: its code is not kept here), in the
``cleanrl`` virtualenv that benchmarks/vs_purejaxrl.py also uses
(benchmarks/.peers/cleanrl, created on first use with the pinned versions of ``PEER_PACKAGES``; Gymnasium
0.29.1, whose ``infos["final_info"]`` the script reads). Its defaults are the settings: 4 envs x 128 steps,
4 epochs x 4 minibatches, RAdam lr 2.5e-4 annealed linearly, a 120-84 ReLU network with LayerNorm,
Q(lambda) 0.65, gamma 0.99, epsilon 1 -> 0.05 over half the run, gradient norm 10. phalanx runs
``phalanx train pqn ENV --config FILE`` in a fresh process, FILE holding those settings (the same as its
shipped preset, written out so that a preset change cannot change the comparison). Both run whole
rollouts: 976 of 512 steps, 499,712 env steps, where CleanRL is given its 500k default (it rounds down).
Two differences that stay: phalanx's CartPole-v1 and Acrobot-v1 are its own batched simulators (the
Gymnasium dynamics as tensors), CleanRL steps Gymnasium's through a SyncVectorEnv; and CleanRL anneals
the learning rate before each rollout, phalanx after it (one rollout's step of 1/976 later).

What is measured, per run (a process of its own; CleanRL then phalanx, for each env and seed):
- run s: the training on each side's own clock. CleanRL: its env steps over the steps per second it
  prints last (its clock starts once its envs are built). phalanx: its summary's ``wall_time_s`` (from
  the start of training to the end, its one evaluation at the end included).
- process s: each process's whole wall time (imports, start-up, training), what a user waits for.
- final return: the mean return of the training episodes that ended in the last 10% of the env steps
  (CleanRL's printed ``episodic_return`` lines; phalanx's last metrics.csv row, logged every 10% of the
  steps): both epsilon-greedy at epsilon 0.05. phalanx's deterministic evaluation (10 episodes at the
  end) is given beside it.
- speed: CleanRL's run s over phalanx's (above 1: phalanx is faster), and the same of the processes.

Usage (from the repository root, with phalanx's virtualenv; the 2-core machine: nice, one thread each):
    nice -n 10 env PYTHONPATH=src python benchmarks/vs_pqn.py --threads 1 --json   # 2 envs x 3 seeds
    PYTHONPATH=src python benchmarks/vs_pqn.py --steps 51200 --seeds 1 --envs CartPole-v1   # minutes
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import (  # noqa: E402
    add_json_option,
    machine_info,
    markdown_table,
    peer_checkout,
    peer_python,
    peer_source,
    run_phalanx_config,
    run_process,
    thread_environment,
    write_json,
)
from vs_purejaxrl import PEER_PACKAGES  # noqa: E402  # the one pinned CleanRL virtualenv

ENVS = ["CartPole-v1", "Acrobot-v1"]
CLEANRL_SCRIPT = "cleanrl/pqn.py"  # in CleanRL's checkout
NUM_ENVS, NUM_STEPS = 4, 128
BATCH = NUM_ENVS * NUM_STEPS
SETTINGS = {  # CleanRL pqn.py's defaults, as phalanx's hyperparameters
    "horizon": NUM_STEPS,
    "epochs": 4,
    "minibatch_size": BATCH // 4,
    "learning_rate": 2.5e-4,
    "anneal_lr": True,
    "hidden_sizes": [120, 84],
    "activation": "relu",
    "layer_norm": True,
    "q_lambda": 0.65,
    "gamma": 0.99,
    "exploration_initial": 1.0,
    "exploration_final": 0.05,
    "exploration_fraction": 0.5,
    "max_grad_norm": 10.0,
}


def whole_rollouts(steps: int) -> int:
    """``steps`` rounded down to whole rollouts of 4 x 128 (CleanRL's iterations), at least one."""
    return max(1, steps // BATCH) * BATCH


def tail_start(steps: int) -> int:
    """The env step after which an episode counts towards the final return: the last 10% of the steps."""
    return steps - max(1, steps // BATCH // 10) * BATCH


def run_cleanrl(python: Path, env: str, steps: int, seed: int, log: Path) -> dict[str, Any]:
    """CleanRL's pqn.py as it is, its defaults but the env, the seed, the steps and no CUDA."""
    command = [
        str(python),
        str(peer_checkout("cleanrl") / CLEANRL_SCRIPT),
        f"--env-id={env}",
        f"--seed={seed}",
        f"--total-timesteps={steps}",
        "--no-cuda",
    ]
    workdir = Path(tempfile.mkdtemp(prefix="vs_pqn-cleanrl-"))  # its runs/ (TensorBoard) go there
    code, output, process_s = run_process(command, log, cwd=workdir)
    result = cleanrl_result(output, steps)
    if code != 0 or result is None:
        return {"error": f"exit {code}, see {log}", "process_s": process_s}
    return {**result, "process_s": process_s, "command": " ".join(command)}


def cleanrl_result(output: str, steps: int) -> dict[str, Any] | None:
    """What CleanRL's printed lines say: its run s (the steps over its last ``SPS:``) and the mean of the
    ``episodic_return`` lines of the last 10% of the steps; None without an ``SPS:`` line."""
    speeds = re.findall(r"^SPS: (\d+)$", output, re.MULTILINE)
    episodes = re.findall(r"^global_step=(\d+), episodic_return=\[?([-+\d.eE]+)\]?$", output, re.MULTILINE)
    if not speeds:
        return None
    tail = [float(value) for step, value in episodes if int(step) > tail_start(steps)]
    return {
        "steps": steps,
        "run_s": steps / int(speeds[-1]),
        "final_return": statistics.mean(tail) if tail else None,
    }


def run_phalanx(
    env: str, steps: int, seed: int, threads: int, compile: bool | None, run_dir: Path
) -> dict[str, Any]:
    """``phalanx train pqn ENV --config FILE`` with :func:`phalanx_settings`, in a fresh process."""
    result = run_phalanx_config(phalanx_settings(env, steps, seed, threads, compile), run_dir)
    if "error" in result:
        return result
    return {**result, "run_s": result["wall_time_s"]}


def phalanx_settings(env: str, steps: int, seed: int, threads: int, compile: bool | None) -> dict[str, Any]:
    """phalanx's config (a ``--config`` file's contents) with CleanRL's settings, one evaluation at the
    end, the last metrics row over the last 10% of the steps; ``compile``: phalanx's setting (None: its
    choice, eager on a CPU unless compiling pays for the run)."""
    return {
        "algo": "pqn",
        "env": env,
        "num_envs": NUM_ENVS,
        "total_steps": steps,
        "seed": seed,
        "eval_every": 0,  # one evaluation, at the end
        "eval_episodes": 10,
        "log_every": steps - tail_start(steps),  # the last row: the episodes of the last 10%
        **({"torch_threads": threads} if threads else {}),
        "compile": compile,
        "hyperparameters": SETTINGS,
    }


def speed(cleanrl: dict[str, Any], phalanx: dict[str, Any], key: str) -> float | None:
    if "error" in cleanrl or "error" in phalanx:
        return None
    return cleanrl[key] / phalanx[key]


def table(runs: list[dict[str, Any]]) -> str:
    header = ["env", "seed", "CleanRL run s", "phalanx run s", "speed (run)", "speed (process)"]
    header += ["CleanRL final return", "phalanx final return", "phalanx eval return"]
    rows = []
    for run in runs:
        cleanrl, phalanx = run["cleanrl"], run["phalanx"]
        ratios = [speed(cleanrl, phalanx, key) for key in ("run_s", "process_s")]
        rows.append(
            [
                run["env"],
                run["seed"],
                cleanrl.get("run_s", cleanrl.get("error")),
                phalanx.get("run_s", phalanx.get("error")),
                *("-" if ratio is None else f"{ratio:.2f}x" for ratio in ratios),
                cleanrl.get("final_return"),
                phalanx.get("final_return"),
                phalanx.get("eval_return"),
            ]
        )
    return markdown_table(header, [["-" if value is None else value for value in row] for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", choices=ENVS, default=ENVS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps (whole rollouts of 512)")
    parser.add_argument("--threads", type=int, default=0, help="threads of each side (0: its default)")
    parser.add_argument(
        "--compile",
        choices=["auto", "true", "false"],
        default="auto",
        help="phalanx's compile setting (auto: its own choice; true: compiled, its compile time in run s)",
    )
    add_json_option(parser)
    args = parser.parse_args()

    peer_source("cleanrl", [CLEANRL_SCRIPT])
    os.environ.update(thread_environment(args.threads))  # CleanRL's torch too, through OMP_NUM_THREADS
    python = peer_python("cleanrl", PEER_PACKAGES["cleanrl"])
    steps = whole_rollouts(args.steps)
    logs = Path(tempfile.mkdtemp(prefix="vs_pqn-logs-"))
    machine = machine_info()
    print(f"machine: {machine}\n{steps:,} env steps per run; logs in {logs}\n", flush=True)
    results: dict[str, Any] = {
        "machine": machine,
        "threads": args.threads,
        "compile": args.compile,
        "steps": steps,
        "settings": SETTINGS,
        "peer_packages": PEER_PACKAGES["cleanrl"],
        "runs": [],
    }
    output = None if args.json is None else write_json(results, args.json, "vs_pqn")
    for env in args.envs:
        for seed in args.seeds:
            print(f"== {env}, seed {seed}", flush=True)
            name = f"{env}-s{seed}"
            cleanrl = (
                {"error": "its virtualenv could not be set up (see above)"}
                if python is None
                else run_cleanrl(python, env, steps, seed, logs / f"cleanrl-{name}.log")
            )
            compile = {"auto": None, "true": True, "false": False}[args.compile]
            phalanx = run_phalanx(env, steps, seed, args.threads, compile, logs / f"phalanx-{name}")
            print(f"  CleanRL: {cleanrl}\n  phalanx: {phalanx}", flush=True)
            results["runs"].append({"env": env, "seed": seed, "cleanrl": cleanrl, "phalanx": phalanx})
            if output is not None:  # rewritten after every run: an interrupted benchmark keeps its runs
                write_json(results, output, "vs_pqn")
    print("\n" + table(results["runs"]) + "\n", flush=True)
    if output is not None:
        print(f"wrote {output}")


if __name__ == "__main__":
    main()
