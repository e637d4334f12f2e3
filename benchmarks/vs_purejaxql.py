"""PQN side by side with purejaxql (JAX, on this CPU): its ``pqn_gymnax.py`` (CartPole-v1) and
``pqn_minatar.py`` (MinAtar) against ``phalanx train pqn``, the same settings, env steps and seeds, one
process after another (issue 38, part 3).

purejaxql runs unmodified from a checkout of https://github.com/mttga/purejaxql (commit 47af6d7 measured),
which is not kept in this repository: pass ``--source DIR`` or put it at ``benchmarks/.peers/purejaxql-src``
(``git clone https://github.com/mttga/purejaxql benchmarks/.peers/purejaxql-src``). Its Python packages go
in a virtualenv of their own, ``benchmarks/.peers/purejaxql`` (created on first use with ``PACKAGES``'
pins: JAX 0.10.2 on the CPU, where purejaxql's pyproject asks for <= 0.4.38, which has no wheel for this
Python here). A child process in that virtualenv imports the script's ``make_train`` and runs it as the
script's ``single_run`` does (``jax.jit(jax.vmap(make_train(config)))`` over ``NUM_SEEDS`` keys, here one),
with the config its hydra files give (``config/config.yaml`` and ``config/alg/ALG.yaml``), wandb disabled,
and ``TOTAL_TIMESTEPS`` (and its decay horizon) set to ``--steps``. phalanx runs ``phalanx train pqn ENV
--config FILE`` in a fresh process, FILE holding the same settings read from those files (:func:`settings`).

What is measured, per run:
- compile s / run s: purejaxql's ``.lower(keys).compile()``, then the compiled call until
  ``block_until_ready``: "without its compile" is run s, "with it" their sum. phalanx: its summary's
  ``wall_time_s`` (training and evaluations; its compile, if it chose one, included).
- process s: each process's whole wall time, what a user waits for.
- final return: training episodes (epsilon-greedy at the schedule's end) over the last 10% of the updates.
  purejaxql: the mean over those updates of its ``returned_episode_returns`` metric (the LogWrapper's last
  finished episode of each env); phalanx: the last metrics.csv row, logged over the last 10%.
- eval: the greedy evaluation at the end. purejaxql: its test of 128 envs for the episode limit, every 5%
  of the updates (``TEST_INTERVAL``); phalanx: ``eval_episodes`` 128 at the same interval. Not equal
  work: purejaxql's test always runs 128 x the limit (500 CartPole, 1,000 MinAtar) steps, phalanx's
  ends with its 128 episodes. ``--no-test`` turns both off (phalanx evaluates once, at the end), so that
  the training alone is timed.
- speed: purejaxql's seconds over phalanx's (above 1: phalanx is faster), without and with its compile.

Differences that stay: purejaxql anneals the learning rate at every gradient step, phalanx at every
rollout; its loss is half the squared error (phalanx's the mean squared error: the same step under RAdam,
up to the gradient clipping); its MinAtar network divides the 0/1 observations by 255; phalanx's CartPole
is its own batched simulator (Gymnasium's dynamics as tensors), purejaxql's gymnax's, and phalanx's MinAtar
is gymnax's through its JAX adapter.

Usage (from the repository root, with phalanx's virtualenv; one thread each on the 2-core machine):
    PYTHONPATH=src python benchmarks/vs_purejaxql.py --threads 1 --json          # CartPole, seeds 1-3
    PYTHONPATH=src python benchmarks/vs_purejaxql.py --tasks Breakout-MinAtar --steps 1000000 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import (  # noqa: E402
    add_json_option,
    draw_figures,
    machine_info,
    markdown_table,
    peer_checkout,
    peer_python,
    peer_source,
    run_child,
    run_phalanx_config,
    thread_environment,
    write_json,
    write_peer_run,
)

PACKAGES = [
    "jax[cpu]==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "chex==0.1.92",
    "gymnax==0.0.9",
    "hydra-core==1.3.8",
    "omegaconf==2.3.0",
    "safetensors==0.8.0",
    "wandb==0.31.0",
    "six==1.17.0",  # gymnax 0.0.9 imports it and does not declare it
]
# task -> (purejaxql's script module, its alg config, phalanx's env id)
TASKS = {
    "CartPole-v1": ("pqn_gymnax", "pqn_cartpole", "CartPole-v1"),
    "Acrobot-v1": ("pqn_gymnax", "pqn_cartpole", "Acrobot-v1"),  # the alg config's other ENV_NAME
    "Breakout-MinAtar": ("pqn_minatar", "pqn_minatar", "gymnax:Breakout-MinAtar"),
    "Asterix-MinAtar": ("pqn_minatar", "pqn_minatar", "gymnax:Asterix-MinAtar"),
}


def peer_config(source: Path, task: str, steps: int, seed: int, test: bool) -> dict[str, Any]:
    """purejaxql's config as its hydra main sees it (``{**config, **config["alg"]}``) for ``task``;
    ``test``: its evaluations during training (``TEST_DURING_TRAINING``) on, as its files have it, or off."""
    import yaml

    base = yaml.safe_load((source / "purejaxql" / "config" / "config.yaml").read_text())
    base.pop("defaults", None)
    alg = yaml.safe_load((source / "purejaxql" / "config" / "alg" / f"{TASKS[task][1]}.yaml").read_text())
    config = {**base, **alg, "ENV_NAME": task, "SEED": seed, "NUM_SEEDS": 1, "WANDB_MODE": "disabled"}
    config.update(TOTAL_TIMESTEPS=steps, TOTAL_TIMESTEPS_DECAY=steps, SAVE_PATH=None)
    config["TEST_DURING_TRAINING"] = config["TEST_DURING_TRAINING"] and test
    return config


def updates(config: dict[str, Any]) -> int:
    return int(config["TOTAL_TIMESTEPS"]) // config["NUM_STEPS"] // config["NUM_ENVS"]


def settings(config: dict[str, Any], threads: int) -> dict[str, Any]:
    """phalanx's ``--config`` contents with purejaxql's ``config``: the same rollout, epochs, minibatches,
    network, schedules and evaluation, over the same whole updates."""
    rollout = config["NUM_ENVS"] * config["NUM_STEPS"]
    steps = updates(config) * rollout
    minatar = "MinAtar" in config["ENV_NAME"]
    network = (
        {"hidden_sizes": [], "encoder": "minatar"}
        if minatar
        else {"hidden_sizes": [config["HIDDEN_SIZE"]] * config["NUM_LAYERS"]}
    )
    test_every = int(updates(config) * config["TEST_INTERVAL"])
    return {
        "algo": "pqn",
        "env": TASKS[config["ENV_NAME"]][2],
        "num_envs": config["NUM_ENVS"],
        "total_steps": steps,
        "seed": config["SEED"],
        "eval_every": test_every * rollout if config["TEST_DURING_TRAINING"] else 0,  # 0: once, at the end
        "eval_episodes": config["TEST_NUM_ENVS"],
        "log_every": steps - max(1, updates(config) // 10) * rollout,  # the last row: the last 10%
        **({"torch_threads": threads} if threads else {}),
        "hyperparameters": {
            "horizon": config["NUM_STEPS"],
            "epochs": config["NUM_EPOCHS"],
            "minibatch_size": rollout // config["NUM_MINIBATCHES"],
            "learning_rate": config["LR"],
            "anneal_lr": bool(config.get("LR_LINEAR_DECAY", False)),
            **network,
            "activation": "relu",
            "layer_norm": config["NORM_TYPE"] == "layer_norm",
            "q_lambda": config["LAMBDA"],
            "gamma": config["GAMMA"],
            "reward_scale": config.get("REW_SCALE", 1.0),
            "exploration_initial": config["EPS_START"],
            "exploration_final": config["EPS_FINISH"],
            "exploration_fraction": config["EPS_DECAY"],
            "max_grad_norm": config["MAX_GRAD_NORM"],
        },
    }


# -- purejaxql: in its virtualenv, in a process started with --child SOURCE CONFIG_JSON --------------------
def child(source: str, config_json: str) -> dict[str, Any]:
    import importlib

    import jax
    import numpy as np

    config = json.loads(config_json)
    sys.path.insert(0, source)
    script = importlib.import_module(f"purejaxql.{TASKS[config['ENV_NAME']][0]}")
    keys = jax.random.split(jax.random.PRNGKey(config["SEED"]), config["NUM_SEEDS"])
    start = time.perf_counter()
    train = jax.jit(jax.vmap(script.make_train(dict(config)))).lower(keys).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(train(keys))
    run_s = time.perf_counter() - start
    metrics = out["metrics"]  # each (seeds, updates)
    returns = np.asarray(metrics["returned_episode_returns"])[0]
    steps = np.asarray(metrics["env_step"])[0]
    count = returns.shape[0]
    last = max(1, count // 10)
    # The test curve: the updates that tested (every TEST_INTERVAL of them); the compiled scan has no clock
    # inside, so the wall time of each point is run_s spread evenly over the updates.
    curve = []
    if config["TEST_DURING_TRAINING"]:
        tests = np.asarray(metrics["test/returned_episode_returns"])[0]
        test_every = int(count * config["TEST_INTERVAL"])
        tested = [i for i in range(count) if (i + 1) % test_every == 0]
        curve = [
            [int(steps[i]), run_s * (i + 1) / count, float(tests[i]), run_s * (i + 1) / count] for i in tested
        ]
    return {
        "steps": int(np.asarray(metrics["env_step"])[0][-1]),
        "compile_s": compile_s,
        "run_s": run_s,
        "final_return": float(returns[-last:].mean()),
        "eval_return": curve[-1][2] if curve else None,
        "curve": curve,
        "jax": jax.__version__,
    }


def speed(peer: dict[str, Any], phalanx: dict[str, Any], with_compile: bool) -> str:
    if "error" in peer or "error" in phalanx:
        return "-"
    peer_s = peer["run_s"] + (peer["compile_s"] if with_compile else 0.0)
    return f"{peer_s / phalanx['wall_time_s']:.2f}x"


def table(runs: list[dict[str, Any]]) -> str:
    header = ["task", "seed", "purejaxql compile s", "purejaxql run s", "phalanx run s"]
    header += ["speed (run)", "speed (compile + run)", "speed (process)"]
    header += ["purejaxql final", "phalanx final", "purejaxql eval", "phalanx eval"]
    rows = []
    for run in runs:
        peer, phalanx = run["purejaxql"], run["phalanx"]
        process = (
            f"{peer['process_s'] / phalanx['process_s']:.2f}x"
            if "error" not in peer and "error" not in phalanx
            else "-"
        )
        rows.append(
            [
                run["task"],
                run["seed"],
                peer.get("compile_s", peer.get("error")),
                peer.get("run_s"),
                phalanx.get("wall_time_s", phalanx.get("error")),
                speed(peer, phalanx, False),
                speed(peer, phalanx, True),
                process,
                peer.get("final_return"),
                phalanx.get("final_return"),
                peer.get("eval_return"),
                phalanx.get("eval_return"),
            ]
        )
    return markdown_table(header, [["-" if value is None else value for value in row] for row in rows])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(sys.argv[2], sys.argv[3])), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=["CartPole-v1"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps (whole updates of each side)")
    parser.add_argument("--threads", type=int, default=1, help="threads of each side (0: its default)")
    parser.add_argument("--source", type=Path, default=peer_checkout("purejaxql"), help="purejaxql checkout")
    parser.add_argument(
        "--no-test",
        dest="test",
        action="store_false",
        help="no evaluations during training on either side (purejaxql's TEST_DURING_TRAINING off; phalanx "
        "one evaluation at the end): the training alone, timed",
    )
    add_json_option(parser)
    args = parser.parse_args()
    peer_source("purejaxql", ["purejaxql/pqn_gymnax.py", "purejaxql/pqn_minatar.py"], args.source)

    environment = thread_environment(args.threads)
    python = peer_python("purejaxql", PACKAGES)
    logs = Path(tempfile.mkdtemp(prefix="vs_purejaxql-"))
    machine = machine_info()
    print(f"machine: {machine}\nlogs in {logs}\n", flush=True)
    results: dict[str, Any] = {"machine": machine, "threads": args.threads, "packages": PACKAGES, "runs": []}
    output = None if args.json is None else write_json(results, args.json, "vs_purejaxql")
    for task in args.tasks:
        for seed in args.seeds:
            print(f"== {task}, seed {seed}", flush=True)
            config = peer_config(args.source, task, args.steps, seed, args.test)
            name = f"{task}-s{seed}"
            command = [str(python), __file__, "--child", str(args.source), json.dumps(config)]
            peer = (
                {"error": "its virtualenv could not be set up (see above)"}
                if python is None
                else run_child(command, logs / f"purejaxql-{name}.log", environment)
            )
            phalanx_settings = settings(config, args.threads)
            phalanx = run_phalanx_config(phalanx_settings, logs / "runs" / f"phalanx-{name}", environment)
            curve = peer.pop("curve", None)
            if curve:  # a run directory that phalanx plot reads beside phalanx's
                peer_settings = {"library": "purejaxql", "algo": "pqn", "env": phalanx_settings["env"]}
                peer_settings.update(seed=seed, hyperparameters=config)
                write_peer_run(logs / "runs" / f"purejaxql-{name}", peer_settings, curve)
            print(f"  purejaxql: {peer}\n  phalanx: {phalanx}", flush=True)
            results["runs"].append(
                {
                    "task": task,
                    "seed": seed,
                    "settings": phalanx_settings,
                    "purejaxql": peer,
                    "phalanx": phalanx,
                }
            )
            if output is not None:  # rewritten after every run: an interrupted benchmark keeps its runs
                write_json(results, output, "vs_purejaxql")
    print("\n" + table(results["runs"]) + "\n", flush=True)
    figures = [
        {
            "runs": str(logs / "runs" / f"*-{task}-s*"),
            "output": logs / f"vs_purejaxql-{task}.png",
            "x": "steps",
            "title": f"PQN on {task}: greedy evaluation, purejaxql's settings",
        }
        for task in args.tasks
    ]
    results["figures"] = draw_figures(figures) if args.test else []
    print("\n".join(results["figures"]), flush=True)
    if output is not None:
        print(f"wrote {output}")


if __name__ == "__main__":
    main()
