"""Recurrent PPO on masked-velocity CartPole: memory against none, and phalanx against sb3-contrib.

The task is ``CartPoleNoVel-v1``: CartPole-v1 whose observations have the cart and pole velocities
(entries 1 and 3) zeroed, as RL Zoo's ``CartPoleNoVel-v1``; a policy has to infer them from the
positions it saw, so it needs memory. Every run uses RL Zoo's tuned RecurrentPPO settings for it
(``hyperparams/ppo_lstm.yml``, rl-baselines3-zoo commit 22e3ff2): 8 envs x 32 steps, one minibatch
of the whole rollout (256), 20 epochs, lr 1e-3 annealed linearly to 0, gamma 0.98, GAE lambda 0.8, no
entropy bonus, an LSTM of 64 units, a ReLU layer of 64 in the policy and value heads, normalised
observations and rewards (RL Zoo's ``normalize: True``); value coefficient 0.5 and gradient norm 0.5
(SB3's defaults). Two differences from RL Zoo, the same on both sides: the clip range is a constant
0.2 (RL Zoo anneals it; phalanx has no clip schedule), and the LSTM is shared by policy and value (as
phalanx's ``RecurrentActorCritic``; RL Zoo gives the critic an LSTM of its own: ``--sb3-critic-lstm``).

Two comparisons:

(a) memory against none, phalanx only: ``phalanx train ppo CartPoleNoVel-v1 --recurrent lstm`` and the
    same without ``--recurrent`` (feed-forward, the same settings), several seeds, each until a
    deterministic evaluation (10 episodes, every ``--eval-every`` env steps) reaches a mean of 475, or
    the budget (``--budget``). Reported: the env steps of the weights that first reached 475 ("-": not
    within the budget), and the best evaluation. A feed-forward policy sees only positions and angles:
    it is not expected to reach 475.
(b) speed at equal work: phalanx recurrent PPO against sb3-contrib's ``RecurrentPPO`` (unmodified,
    stable-baselines3 2.9.2 + sb3-contrib 2.9.2, in a virtualenv of its own that this script creates on
    first use under benchmarks/.peers/sb3-contrib), the same settings and env steps (``--steps``), each
    a process of its own, one after another, per torch thread count (``--threads``). SB3 steps 8
    Gymnasium CartPole-v1 in a DummyVecEnv (RL Zoo's default) behind this script's own small wrapper
    that zeroes the same entries (RL Zoo's ``MaskVelocityWrapper`` does the same), with VecNormalize;
    phalanx its built-in batched CartPole. Reported: env steps/s of the training (its own clock: SB3's
    ``learn`` call; phalanx's last metrics.csv row, steps over wall_time_s) and of the whole process
    (imports, env creation, training), and a deterministic evaluation of 10 episodes after training,
    whose time is on neither clock (taken off the process's wall time on both sides).

Usage (from the repository root, with phalanx's virtualenv):
    PYTHONPATH=src python benchmarks/recurrent_cartpole.py                    # both comparisons
    PYTHONPATH=src python benchmarks/recurrent_cartpole.py --part speed --steps 10240 --threads 1
    PYTHONPATH=src python benchmarks/recurrent_cartpole.py --part solve --seeds 0 1 2 3 4 --json out.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import statistics
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
    peer_python,
    run_child,
    run_phalanx,
    run_process,
    thread_environment,
    write_json,
)

ENV_ID = "CartPoleNoVel-v1"
THRESHOLD = 475.0
MASKED_ENTRIES = (1, 3)  # cart velocity, pole angular velocity: what CartPoleNoVel-v1 zeroes
EVAL_EPISODES = 10

PEER = "sb3-contrib"
PEER_PACKAGES = [
    "torch==2.13.0",
    "stable-baselines3==2.9.2",
    "sb3-contrib==2.9.2",
    "gymnasium==1.4.0",
    "numpy==2.4.6",
]

# RL Zoo's RecurrentPPO settings for CartPoleNoVel-v1 (see the module docstring), for both libraries.
NUM_ENVS = 8
NUM_STEPS = 32
BATCH_SIZE = 256
EPOCHS = 20
LEARNING_RATE = 1e-3  # annealed linearly to 0
CLIP = 0.2
GAMMA = 0.98
GAE_LAMBDA = 0.8
ENTROPY_COEF = 0.0
VALUE_COEF = 0.5
MAX_GRAD_NORM = 0.5
LSTM_HIDDEN = 64
HIDDEN_SIZES = (64,)
ACTIVATION = "relu"
ROLLOUT = NUM_ENVS * NUM_STEPS


def whole_rollouts(steps: int) -> int:
    """``steps`` rounded down to whole rollouts of ROLLOUT env steps (at least one)."""
    return max(1, steps // ROLLOUT) * ROLLOUT


def phalanx_hyperparameters(recurrent: bool) -> list[str]:
    """The flags of ``phalanx train ppo CartPoleNoVel-v1`` for these settings, with or without the LSTM
    (every setting explicit, so that a preset for the env changes nothing)."""
    memory = (
        [
            "--recurrent",
            "lstm",
            "--recurrent-hidden-size",
            str(LSTM_HIDDEN),
            "--sequence-length",
            str(NUM_STEPS),
        ]
        + ["--burn-in", "0"]
        if recurrent
        else ["--recurrent", "None"]
    )
    return [
        "--num-envs",
        str(NUM_ENVS),
        "--normalize-obs",
        "--normalize-reward",
        *memory,
        "--hidden-sizes",
        *(str(size) for size in HIDDEN_SIZES),
        "--activation",
        ACTIVATION,
        "--horizon",
        str(NUM_STEPS),
        "--minibatch-size",
        str(BATCH_SIZE),
        "--epochs",
        str(EPOCHS),
        "--learning-rate",
        str(LEARNING_RATE),
        "--anneal-lr",
        "--clip-range",
        str(CLIP),
        "--clip-value",
        "None",
        "--target-kl",
        "None",
        "--normalize-advantages",
        "--entropy-coef",
        str(ENTROPY_COEF),
        "--value-coef",
        str(VALUE_COEF),
        "--max-grad-norm",
        str(MAX_GRAD_NORM),
        "--gamma",
        str(GAMMA),
        "--gae-lambda",
        str(GAE_LAMBDA),
    ]


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path) as handle:
        return list(csv.DictReader(handle))


def phalanx_failed(result: dict[str, Any], command: list[str]) -> None:
    """Print the end of a failed phalanx run's log and the command to rerun it by hand."""
    log = Path(result["log"])
    tail = log.read_text().splitlines()[-15:] if log.is_file() else []
    print(
        f"  phalanx failed ({result['error']}); the end of {log}:\n"
        + "\n".join("    " + line for line in tail)
        + f"\n  to rerun it by hand: PYTHONPATH=src {shlex.join(command)}",
        flush=True,
    )


# -- (a) memory against none: phalanx recurrent and feed-forward until 475 ----------------------------------
def solve_run(
    recurrent: bool, seed: int, budget: int, eval_every: int, threads: int, logs: Path
) -> dict[str, Any]:
    """One ``phalanx train ... --stop-return 475`` run (benchlib.run_phalanx); the env steps of the first
    evaluation that reached 475, read from its evaluations.csv."""
    extra = [
        *phalanx_hyperparameters(recurrent),
        "--total-steps",
        str(budget),
        "--eval-every",
        str(eval_every),
        "--eval-episodes",
        str(EVAL_EPISODES),
        "--no-eval-process",  # evaluated in the training process: the same steps whatever the load
        "--log-every",
        str(eval_every),
    ]
    variant_logs = logs / ("recurrent" if recurrent else "feed-forward")
    variant_logs.mkdir(parents=True, exist_ok=True)
    result = run_phalanx(
        "ppo", ENV_ID, THRESHOLD, seed, threads, variant_logs, timeout=7200, extra_args=extra
    )
    result["variant"] = "LSTM" if recurrent else "feed-forward"
    command = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "train",
        "ppo",
        ENV_ID,
        "--stop-return",
        str(THRESHOLD),
        "--seed",
        str(seed),
        *(["--torch-threads", str(threads)] if threads else []),
        *extra,
    ]
    result["command"] = "phalanx " + shlex.join(command[3:])
    if "error" in result:
        phalanx_failed(result, command)
        return result
    evaluations = read_rows(Path(result["run_dir"]) / "evaluations.csv")
    reached = [int(row["steps"]) for row in evaluations if float(row["eval_return_mean"]) >= THRESHOLD]
    result["steps_to_threshold"] = reached[0] if reached else None
    result["best_eval_return"] = max((float(row["eval_return_mean"]) for row in evaluations), default=None)
    return result


def median_steps(runs: list[dict[str, Any]]) -> float | None:
    """The median env steps to 475 over ``runs``, a run that never reached it counting as infinitely
    slow: None when most did not reach it."""
    median = (
        statistics.median(run.get("steps_to_threshold") or math.inf for run in runs) if runs else math.inf
    )
    return None if math.isinf(median) else median


def solve_table(runs: list[dict[str, Any]]) -> str:
    header = ["policy", "seeds reaching 475", "env steps to 475 (per seed)", "median", "best eval (per seed)"]
    rows = []
    for variant in ("LSTM", "feed-forward"):
        mine = [run for run in runs if run["variant"] == variant]
        if not mine:
            continue
        steps = [run.get("steps_to_threshold") for run in mine]
        reached = [value for value in steps if value is not None]
        median = median_steps(mine)
        rows.append(
            [
                variant,
                f"{len(reached)}/{len(mine)}",
                ", ".join(
                    "error" if "error" in run else f"{value:,}" if value else "-"
                    for run, value in zip(mine, steps, strict=True)
                ),
                "-" if median is None else median,
                ", ".join(
                    "-" if run.get("best_eval_return") is None else f"{run['best_eval_return']:.0f}"
                    for run in mine
                ),
            ]
        )
    return markdown_table(header, rows)


# -- (b) speed: phalanx recurrent PPO against sb3-contrib RecurrentPPO ---------------------------------------
def speed_phalanx(steps: int, seed: int, threads: int, log: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="recurrent_cartpole-phalanx-")) / "run"
    arguments = [
        "train",
        "ppo",
        ENV_ID,
        *phalanx_hyperparameters(recurrent=True),
        "--total-steps",
        str(steps),
        "--seed",
        str(seed),
        "--torch-threads",
        str(threads),
        "--no-compile",
        "--run-dir",
        str(run_dir),
        "--eval-every",
        "0",  # one evaluation, at the end (after training: not on the training clock)
        "--eval-episodes",
        str(EVAL_EPISODES),
        "--no-eval-process",
        "--log-every",
        str(steps),
    ]
    command = [sys.executable, "-m", "phalanx.cli", *arguments]
    code, _, process_s = run_process(command, log, environment=thread_environment(threads))
    result = {"command": "phalanx " + shlex.join(arguments), "log": str(log), "process_s": process_s}
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.is_file():
        result["error"] = f"exit {code}, see {log}"
        phalanx_failed(result, command)
        return result
    summary = json.loads(summary_path.read_text())
    last = read_rows(run_dir / "metrics.csv")[-1]
    evaluation_s = final_evaluation_seconds(run_dir)
    return {
        **result,
        "steps": summary["total_steps"],
        "train_s": float(last["wall_time_s"]),
        "train_steps_per_s": int(last["steps"]) / float(last["wall_time_s"]),
        "final_evaluation_s": evaluation_s,
        "process_steps_per_s": summary["total_steps"] / (process_s - evaluation_s),
        "eval_return": summary["eval_return_mean"],
        "run_dir": str(run_dir),
    }


def child_sb3(steps: int, seed: int, threads: int, critic_lstm: bool) -> dict[str, Any]:
    """sb3-contrib's RecurrentPPO with these settings (runs in its virtualenv, with --child sb3)."""
    import gymnasium as gym
    import numpy as np
    import sb3_contrib
    import stable_baselines3
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    class MaskVelocity(gym.ObservationWrapper):
        """CartPole-v1 with its velocities zeroed: CartPoleNoVel-v1 (RL Zoo's MaskVelocityWrapper)."""

        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            self.mask = np.ones(env.observation_space.shape, dtype=env.observation_space.dtype)
            self.mask[list(MASKED_ENTRIES)] = 0.0

        def observation(self, observation: np.ndarray) -> np.ndarray:
            return observation * self.mask

    if threads:
        torch.set_num_threads(threads)
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=NUM_ENVS, seed=seed, wrapper_class=MaskVelocity))
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=NUM_STEPS,
        batch_size=BATCH_SIZE,
        n_epochs=EPOCHS,
        learning_rate=lambda remaining: remaining * LEARNING_RATE,  # RL Zoo's lin_0.001
        clip_range=CLIP,
        gamma=GAMMA,
        gae_lambda=GAE_LAMBDA,
        ent_coef=ENTROPY_COEF,
        vf_coef=VALUE_COEF,
        max_grad_norm=MAX_GRAD_NORM,
        policy_kwargs={
            "ortho_init": False,
            "activation_fn": torch.nn.ReLU,
            "lstm_hidden_size": LSTM_HIDDEN,
            "shared_lstm": not critic_lstm,
            "enable_critic_lstm": critic_lstm,
            "net_arch": {"pi": list(HIDDEN_SIZES), "vf": list(HIDDEN_SIZES)},
        },
        seed=seed,
        device="cpu",
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    train_s = time.perf_counter() - start

    eval_env = VecNormalize(
        make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1000, wrapper_class=MaskVelocity),
        training=False,
        norm_reward=False,
    )
    eval_env.obs_rms = env.obs_rms
    start = time.perf_counter()
    returns, _ = evaluate_policy(
        model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True, return_episode_rewards=True
    )
    evaluation_s = time.perf_counter() - start
    return {
        "steps": model.num_timesteps,
        "train_s": train_s,
        "train_steps_per_s": model.num_timesteps / train_s,
        "eval_return": float(np.mean(returns)),
        "final_evaluation_s": evaluation_s,
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "stable_baselines3": stable_baselines3.__version__,
            "sb3_contrib": sb3_contrib.__version__,
            "torch": torch.__version__,
            "gymnasium": gym.__version__,
        },
    }


def speed_sb3(
    python: Path, steps: int, seed: int, threads: int, critic_lstm: bool, log: Path
) -> dict[str, Any]:
    spec = {"steps": steps, "seed": seed, "threads": threads, "critic_lstm": critic_lstm}
    command = [str(python), __file__, "--child", "sb3", "--child-spec", json.dumps(spec)]
    result = run_child(command, log, environment=thread_environment(threads))
    result["command"] = shlex.join(command)
    if "error" not in result:
        result["process_steps_per_s"] = result["steps"] / (result["process_s"] - result["final_evaluation_s"])
    return result


def speed_table(runs: dict[str, dict[str, Any]]) -> str:
    header = [
        "run",
        "env steps",
        "train s",
        "env steps/s (training)",
        "env steps/s (whole process)",
        "eval return",
    ]
    rows = []
    for label, result in runs.items():
        if "error" in result:
            rows.append([label, f"not run: {result['error']}", "", "", "", ""])
            continue
        rows.append(
            [
                label,
                result["steps"],
                result["train_s"],
                result["train_steps_per_s"],
                result["process_steps_per_s"],
                result["eval_return"],
            ]
        )
    return markdown_table(header, rows)


def speedups(runs: dict[str, dict[str, Any]], threads: list[int]) -> list[str]:
    lines = []
    for count in threads:
        mine, peer = runs.get(f"phalanx, {count} thread(s)"), runs.get(f"sb3-contrib, {count} thread(s)")
        if mine and peer and "error" not in mine and "error" not in peer:
            training = mine["train_steps_per_s"] / peer["train_steps_per_s"]
            process = mine["process_steps_per_s"] / peer["process_steps_per_s"]
            lines.append(
                f"{count} thread(s): phalanx / sb3-contrib {training:.2f}x (training), "
                f"{process:.2f}x (whole process)"
            )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["solve", "speed", "both"], default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="(a): seeds of each policy")
    parser.add_argument(
        "--budget", type=int, default=150_000, help="(a): env steps a run may take to reach 475"
    )
    parser.add_argument("--eval-every", type=int, default=2_048, help="(a): env steps between evaluations")
    parser.add_argument(
        "--steps",
        type=int,
        default=25_600,
        help="(b): env steps of each run (rounded down to whole rollouts)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="torch threads ((a): the first; (b): a run each)",
    )
    parser.add_argument(
        "--sb3-critic-lstm",
        action="store_true",
        help="(b): give SB3's critic an LSTM of its own, as RL Zoo does (phalanx shares one LSTM)",
    )
    parser.add_argument("--only", choices=["phalanx", "sb3-contrib"], help="(b): run only this library")
    parser.add_argument("--seed", type=int, default=0, help="(b): the seed of both libraries")
    add_json_option(parser)
    parser.add_argument("--child", choices=["sb3"], help=argparse.SUPPRESS)
    parser.add_argument("--child-spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child == "sb3":
        print("RESULT " + json.dumps(child_sb3(**json.loads(args.child_spec))))
        return {}

    logs = Path(tempfile.mkdtemp(prefix="recurrent_cartpole-logs-"))
    machine = machine_info()
    print(f"machine: {machine}\nlogs in {logs}\n", flush=True)
    results: dict[str, Any] = {"machine": machine, "env": ENV_ID, "threshold": THRESHOLD}
    outputs = []

    if args.part in ("solve", "both"):
        print(f"## (a) env steps to {THRESHOLD:g}, budget {args.budget:,}, seeds {args.seeds}", flush=True)
        runs = []
        for seed in args.seeds:
            for recurrent in (True, False):
                run = solve_run(recurrent, seed, args.budget, args.eval_every, args.threads[0], logs)
                print(f"  {run['variant']} seed {seed}: {run}", flush=True)
                runs.append(run)
        results["solve"] = {
            "budget": args.budget,
            "eval_every": args.eval_every,
            "threads": args.threads[0],
            "runs": runs,
            "median_steps_to_threshold": {
                variant: median_steps([run for run in runs if run["variant"] == variant])
                for variant in ("LSTM", "feed-forward")
            },
        }
        outputs.append(f"## (a) env steps to {THRESHOLD:g} (budget {args.budget:,})\n\n" + solve_table(runs))
        print("\n" + outputs[-1] + "\n", flush=True)

    if args.part in ("speed", "both"):
        steps = whole_rollouts(args.steps)
        libraries = [args.only] if args.only else ["sb3-contrib", "phalanx"]
        python = peer_python(PEER, PEER_PACKAGES) if "sb3-contrib" in libraries else None
        print(f"## (b) speed, {steps:,} env steps a run", flush=True)
        runs_b: dict[str, dict[str, Any]] = {}
        for threads in args.threads:
            suffix = f", {threads} thread(s)"
            if "sb3-contrib" in libraries:
                if python is None:
                    runs_b["sb3-contrib" + suffix] = {
                        "error": "its virtualenv could not be set up (see above)"
                    }
                else:
                    print(f"== sb3-contrib{suffix}", flush=True)
                    runs_b["sb3-contrib" + suffix] = speed_sb3(
                        python, steps, args.seed, threads, args.sb3_critic_lstm, logs / f"sb3-t{threads}.log"
                    )
            if "phalanx" in libraries:
                print(f"== phalanx{suffix}", flush=True)
                runs_b["phalanx" + suffix] = speed_phalanx(
                    steps, args.seed, threads, logs / f"phalanx-t{threads}.log"
                )
        for label, result in runs_b.items():
            print(f"  {label}: {result}", flush=True)
        results["speed"] = {
            "steps": steps,
            "seed": args.seed,
            "sb3_critic_lstm": args.sb3_critic_lstm,
            "peer_packages": PEER_PACKAGES,
            "runs": runs_b,
        }
        outputs.append(
            f"## (b) recurrent PPO speed, {steps:,} env steps\n\n"
            + speed_table(runs_b)
            + "\n\n"
            + "\n".join(speedups(runs_b, args.threads))
        )
        print("\n" + outputs[-1] + "\n", flush=True)

    if len(outputs) > 1:
        print("\n\n".join(outputs))
    if args.json is not None:
        print(f"wrote {write_json(results, args.json, 'recurrent_cartpole')}")
    return results


if __name__ == "__main__":
    main()
