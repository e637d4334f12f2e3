"""Equal-work PPO on CartPole-v1: phalanx against PureJaxRL's ``ppo.py`` and CleanRL's ``ppo.py``.

The peers run unmodified, from checkouts of their repositories at the commits measured
(benchmarks/.peers/purejaxrl-src and cleanrl-src; the script says how to clone them: their code is not kept
here), each in a virtualenv of its own that this script creates on first use under benchmarks/.peers/ with
pinned versions. Every run is a process of its own; all use the same PPO hyperparameters (PureJaxRL's
CartPole config: 64x64 tanh, lr 2.5e-4 annealed, 4 epochs, 4 minibatches, entropy 0.01, clip 0.2, value clip
0.2, grad norm 0.5, gamma 0.99, GAE 0.95, value coefficient 0.5) and the same number of env steps (whole
updates: num_envs x num_steps x updates).

What is measured, per run:
- run s: the training without compilation. PureJaxRL: the call of the compiled ``train`` until
  block_until_ready. CleanRL: its own clock (total steps / its last printed SPS). phalanx: ``phalanx
  train ppo CartPole-v1 --config FILE`` in a fresh process, as a user runs it (nothing imported or set
  before it), its summary's training wall time less its ``compile_time_s``.
- compile s: PureJaxRL: ``jax.jit(make_train(config)).lower(rng).compile()``. phalanx compiled:
  ``compile_time_s`` from its summary ("n/a" where it compiled nothing: then run s includes it), taken
  twice by ``compiled-cold`` (the default): a first run with torch's compile caches empty (its
  TORCHINDUCTOR_CACHE_DIR and its precompiled header), as on a new machine, then the same run again
  with the caches it filled ("compiled-cached"), as every later run.
- process s: each process's whole wall time, what a user waits for (imports, start-up, compile, training,
  phalanx's final evaluation).
- final return: the mean return of the episodes that ended in the last 10% of the updates (PureJaxRL:
  its metrics; CleanRL: its printed episodic returns; phalanx: the last row of metrics.csv, logged every
  10% of the steps).

Usage (from the repository root, with phalanx's virtualenv):
    PYTHONPATH=src python benchmarks/vs_purejaxrl.py                # every config, every peer
    PYTHONPATH=src python benchmarks/vs_purejaxrl.py --quick        # 1/20 of the steps, to try it
    PYTHONPATH=src python benchmarks/vs_purejaxrl.py --only cleanrl --configs 4x128 --json out.json
    PYTHONPATH=src python benchmarks/vs_purejaxrl.py --threads 1     # every library on one thread

On a loaded machine use --threads 1: torch's and XLA's thread pools spin-wait, and two threads
on two busy cores can make CleanRL 9x slower than one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
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
    run_child,
    run_phalanx_config,
    run_process,
    thread_environment,
    write_json,
)

# The peers' virtualenvs: pinned versions that work together on Python 3.11 (PyPI; torch's CPU wheel
# from PyPI or a local wheel directory). PureJaxRL's wrappers.py imports brax and navix at its top, so
# they are installed although CartPole needs neither. CleanRL pins gymnasium 0.29.1: its ppo.py reads
# infos["final_info"], which Gymnasium 1.x no longer gives.
PEER_PACKAGES = {
    "purejaxrl": [
        "jax[cpu]==0.10.2",
        "jaxlib==0.10.2",
        "flax==0.12.8",
        "optax==0.2.8",
        "distrax==0.1.9",
        "chex==0.1.92",
        "gymnax==0.0.9",
        "brax==0.14.2",
        "navix==0.7.4",
    ],
    "cleanrl": ["torch==2.13.0", "gymnasium==0.29.1", "numpy==1.26.4", "tyro==1.0.17", "tensorboard==2.21.0"],
}

# (num_envs, num_steps per env per update, total env steps)
CONFIGS = {
    "4x128": (4, 128, 500_000),
    "64x32": (64, 32, 500_000),
    "1024x32": (1024, 32, 5_000_000),
    "4096x16": (4096, 16, 5_000_000),
}
CLEANRL_MAX_ENVS = 64  # a SyncVectorEnv of 1024 Gymnasium envs for 5M steps takes tens of minutes

LEARNING_RATE = 2.5e-4
EPOCHS = 4
MINIBATCHES = 4
ENTROPY_COEF = 0.01
CLIP = 0.2
MAX_GRAD_NORM = 0.5
GAMMA = 0.99
GAE_LAMBDA = 0.95
VALUE_COEF = 0.5


def final_window(updates: int) -> int:
    """How many of the last updates the final return is taken over: 10%, at least one."""
    return max(1, updates // 10)


# -- PureJaxRL: runs in its virtualenv, in a process started with --child purejaxrl ---------------------
def child_purejaxrl(num_envs: int, num_steps: int, total_steps: int, seed: int) -> dict[str, Any]:
    import jax
    import numpy as np

    sys.path.insert(0, str(peer_checkout("purejaxrl") / "purejaxrl"))  # its ppo.py imports wrappers.py so
    from ppo import make_train

    config = {
        "LR": LEARNING_RATE,
        "NUM_ENVS": num_envs,
        "NUM_STEPS": num_steps,
        "TOTAL_TIMESTEPS": total_steps,
        "UPDATE_EPOCHS": EPOCHS,
        "NUM_MINIBATCHES": MINIBATCHES,
        "GAMMA": GAMMA,
        "GAE_LAMBDA": GAE_LAMBDA,
        "CLIP_EPS": CLIP,
        "ENT_COEF": ENTROPY_COEF,
        "VF_COEF": VALUE_COEF,
        "MAX_GRAD_NORM": MAX_GRAD_NORM,
        "ACTIVATION": "tanh",
        "ENV_NAME": "CartPole-v1",
        "ANNEAL_LR": True,
        "DEBUG": False,
    }
    rng = jax.random.PRNGKey(seed)
    start = time.perf_counter()
    train = jax.jit(make_train(config)).lower(rng).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(train(rng))
    run_s = time.perf_counter() - start

    metrics = out["metrics"]  # (updates, num_steps, num_envs) each
    returns = np.asarray(metrics["returned_episode_returns"])
    ended = np.asarray(metrics["returned_episode"])
    last = final_window(returns.shape[0])
    tail_returns = returns[-last:][ended[-last:]]
    return {
        "steps": int(returns.size),
        "run_s": run_s,
        "compile_s": compile_s,
        "final_return": float(tail_returns.mean()) if tail_returns.size else None,
        "versions": {"jax": jax.__version__, "jax_devices": str(jax.devices())},
    }


# -- phalanx: in a process started with --child phalanx (eager or compiled) ------------------------------
def phalanx_settings(
    num_envs: int, num_steps: int, total_steps: int, seed: int, compile: bool | None, threads: int
) -> dict[str, Any]:
    """phalanx's config (a ``--config`` file's contents) for the peers' PPO: the same hyperparameters and
    env steps, one evaluation at the end, metrics logged over the last 10% of the updates."""
    updates = total_steps // (num_envs * num_steps)
    return {
        "algo": "ppo",
        "env": "CartPole-v1",
        "num_envs": num_envs,
        "total_steps": total_steps,
        "seed": seed,
        "eval_every": 0,  # one evaluation, at the end
        "eval_episodes": 10,
        "log_every": final_window(updates) * num_envs * num_steps,
        **({"torch_threads": threads} if threads else {}),  # 0: phalanx's default (1)
        "compile": compile,
        "hyperparameters": {
            "horizon": num_steps,
            "epochs": EPOCHS,
            "minibatch_size": num_envs * num_steps // MINIBATCHES,
            "learning_rate": LEARNING_RATE,
            "anneal_lr": True,
            "entropy_coef": ENTROPY_COEF,
            "clip_range": CLIP,
            "clip_value": CLIP,  # PureJaxRL clips the value loss with its clip_eps, CleanRL with --clip-vloss
            "max_grad_norm": MAX_GRAD_NORM,
            "hidden_sizes": [64, 64],
            "activation": "tanh",
            "gamma": GAMMA,
            "gae_lambda": GAE_LAMBDA,
            "value_coef": VALUE_COEF,
        },
    }


def run_phalanx(
    spec: dict[str, Any], compile: bool, threads: int, run_dir: Path, cache: Path | None = None
) -> dict[str, Any]:
    """``phalanx train ppo CartPole-v1 --config FILE`` with :func:`phalanx_settings` in a fresh process, as
    a user runs it: run s is the summary's training wall time less its compile time (compile s), and the
    process's whole wall time is kept too (imports, setup, the final evaluation). ``cache``: torch's compile
    caches for the run, empty for a first run on a machine (cold), or the ones an earlier run filled
    (cached); None: torch's defaults, whatever earlier runs left there. Two caches: TORCHINDUCTOR_CACHE_DIR
    (graphs, kernels, the probes of the vector instructions) and the precompiled C++ header of graph
    wrappers (~5 s to build), which inductor keeps in the temporary directory whatever the first says."""
    environment = None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        environment = {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TMPDIR": str(cache)}
    settings = phalanx_settings(**spec, compile=compile, threads=threads)
    result = run_phalanx_config(settings, run_dir, environment)
    if "error" in result:
        return result
    compile_s = result["compile_time_s"] or None
    return {
        **result,
        "run_s": result["wall_time_s"] - (compile_s or 0.0),
        "compile_s": compile_s,
    }


# -- CleanRL: its ppo.py as it is, in its virtualenv --------------------------------------------------------
def run_cleanrl(
    python: Path, num_envs: int, num_steps: int, total_steps: int, seed: int, log: Path
) -> dict[str, Any]:
    command = [
        str(python),
        str(peer_checkout("cleanrl") / "cleanrl" / "ppo.py"),
        "--env-id=CartPole-v1",
        f"--seed={seed}",
        "--no-cuda",
        f"--num-envs={num_envs}",
        f"--num-steps={num_steps}",
        f"--total-timesteps={total_steps}",
        f"--learning-rate={LEARNING_RATE}",
        "--anneal-lr",
        f"--update-epochs={EPOCHS}",
        f"--num-minibatches={MINIBATCHES}",
        f"--ent-coef={ENTROPY_COEF}",
        f"--clip-coef={CLIP}",
        "--clip-vloss",
        "--norm-adv",
        f"--max-grad-norm={MAX_GRAD_NORM}",
        f"--gamma={GAMMA}",
        f"--gae-lambda={GAE_LAMBDA}",
        f"--vf-coef={VALUE_COEF}",
    ]
    workdir = Path(tempfile.mkdtemp(prefix="vs_purejaxrl-cleanrl-"))  # its runs/ (tensorboard) go there
    code, output, process_s = run_process(command, log, cwd=workdir)
    speeds = re.findall(r"^SPS: (\d+)$", output, re.MULTILINE)
    episodes = [
        (int(step), float(value))
        for step, value in re.findall(
            r"^global_step=(\d+), episodic_return=\[?([-+\d.eE]+)\]?$", output, re.MULTILINE
        )
    ]
    if code != 0 or not speeds:
        return {"error": f"exit {code}, see {log}", "process_s": process_s}
    batch = num_envs * num_steps
    updates = total_steps // batch
    steps = updates * batch
    tail_start = (updates - final_window(updates)) * batch
    tail = [value for step, value in episodes if step > tail_start]
    return {
        "steps": steps,
        "run_s": steps / int(speeds[-1]),
        "compile_s": None,
        "final_return": sum(tail) / len(tail) if tail else None,
        "process_s": process_s,
        "command": " ".join(command),
    }


# -- the comparison ----------------------------------------------------------------------------------------
def speed_ratio(phalanx: dict[str, Any], peer: dict[str, Any]) -> str:
    """phalanx's speed over ``peer``'s (equal work: the inverse ratio of times): run alone, counting
    compilation, and of the whole processes: "0.52x / 0.61x / 0.70x"."""
    if "error" in phalanx or "error" in peer:
        return "-"
    run = peer["run_s"] / phalanx["run_s"]
    with_compile = (peer["run_s"] + (peer["compile_s"] or 0.0)) / (
        phalanx["run_s"] + (phalanx["compile_s"] or 0.0)
    )
    if "process_s" in phalanx and "process_s" in peer:
        return f"{run:.2f}x / {with_compile:.2f}x / {peer['process_s'] / phalanx['process_s']:.2f}x"
    return f"{run:.2f}x / {with_compile:.2f}x"


def table(runs: dict[str, dict[str, Any]]) -> str:
    phalanx_runs = [label for label in runs if label.startswith("phalanx")]
    header = [
        "run",
        "run s",
        "compile s",
        "run + compile s",
        "process s",
        "env steps/s (run)",
        "final return",
    ]
    header += [f"{label} speed / this (run / +compile / process)" for label in phalanx_runs]
    rows = []
    for label, result in runs.items():
        if "error" in result:
            rows.append([label, f"not run: {result['error']}"] + [""] * (len(header) - 2))
            continue
        compile_s = result["compile_s"]
        row = [
            label,
            result["run_s"],
            "n/a" if compile_s is None else compile_s,
            result["run_s"] + (compile_s or 0.0),
            result.get("process_s", "-"),
            result["steps"] / result["run_s"],
            "n/a" if result["final_return"] is None else result["final_return"],
        ]
        row += ["-" if label == p else speed_ratio(runs[p], result) for p in phalanx_runs]
        rows.append(row)
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1/20 of every config's steps, to try it")
    parser.add_argument(
        "--only",
        action="append",
        choices=["phalanx", "purejaxrl", "cleanrl"],
        help="run only this library (repeatable)",
    )
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument(
        "--phalanx-modes",
        nargs="+",
        choices=["eager", "compiled", "compiled-cold"],
        default=["eager", "compiled-cold"],
        help="compiled: with torch's default compile cache as earlier runs left it; compiled-cold: a first "
        "run with an empty cache, then the same run again with the cache it filled (cached)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="threads of every library (0: its default)")
    parser.add_argument(
        "--phalanx-threads",
        nargs="+",
        type=int,
        default=None,
        help="also run phalanx with these --torch-threads (each a run of its own; default: --threads)",
    )
    add_json_option(parser)
    parser.add_argument("--child", choices=["purejaxrl"], help=argparse.SUPPRESS)
    parser.add_argument("--child-spec", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child == "purejaxrl":
        print("RESULT " + json.dumps(child_purejaxrl(**json.loads(args.child_spec))))
        return

    os.environ.update(thread_environment(args.threads))  # every process started from here inherits it
    libraries = args.only or ["purejaxrl", "cleanrl", "phalanx"]
    for peer, script in (("purejaxrl", "purejaxrl/ppo.py"), ("cleanrl", "cleanrl/ppo.py")):
        if peer in libraries:
            peer_source(peer, [script])
    pythons = {
        peer: peer_python(peer, PEER_PACKAGES[peer]) for peer in ("purejaxrl", "cleanrl") if peer in libraries
    }
    logs = Path(tempfile.mkdtemp(prefix="vs_purejaxrl-logs-"))
    machine = machine_info()
    print(
        f"machine: {machine}\nthreads: {args.threads or 'each library its default'}; logs in {logs}\n",
        flush=True,
    )
    results: dict[str, Any] = {
        "machine": machine,
        "threads": args.threads,
        "quick": args.quick,
        "seed": args.seed,
        "peer_packages": {peer: PEER_PACKAGES[peer] for peer in pythons},
        "configs": {},
    }
    for name in args.configs:
        num_envs, num_steps, total_steps = CONFIGS[name]
        batch = num_envs * num_steps
        total_steps = max(1, (total_steps // 20 if args.quick else total_steps) // batch) * batch
        spec = {"num_envs": num_envs, "num_steps": num_steps, "total_steps": total_steps, "seed": args.seed}
        print(f"== {num_envs} envs x {num_steps} steps, {total_steps:,} env steps", flush=True)
        runs: dict[str, dict[str, Any]] = {}
        if "purejaxrl" in pythons:
            if pythons["purejaxrl"] is None:
                runs["PureJaxRL"] = {"error": "its virtualenv could not be set up (see above)"}
            else:
                command = [
                    str(pythons["purejaxrl"]),
                    __file__,
                    "--child=purejaxrl",
                    "--child-spec",
                    json.dumps(spec),
                ]
                runs["PureJaxRL"] = run_child(command, logs / f"purejaxrl-{name}.log")
        if "cleanrl" in pythons and num_envs > CLEANRL_MAX_ENVS:
            print(f"  CleanRL: not run above {CLEANRL_MAX_ENVS} envs (a SyncVectorEnv of Gymnasium envs)")
        elif "cleanrl" in pythons:
            if pythons["cleanrl"] is None:
                runs["CleanRL"] = {"error": "its virtualenv could not be set up (see above)"}
            else:
                runs["CleanRL"] = run_cleanrl(pythons["cleanrl"], **spec, log=logs / f"cleanrl-{name}.log")
        if "phalanx" in libraries:
            for mode in args.phalanx_modes:
                for threads in args.phalanx_threads or [args.threads]:
                    label = f"phalanx {mode}" + (f", {threads} threads" if args.phalanx_threads else "")
                    run_dir = logs / f"phalanx-{mode}-{threads}-{name}"
                    if mode != "compiled-cold":
                        runs[label] = run_phalanx(spec, mode == "compiled", threads, run_dir)
                        continue
                    cache = logs / f"torch-cache-{threads}-{name}"  # made empty by the first run
                    runs[label] = run_phalanx(spec, True, threads, run_dir, cache)
                    cached = label.replace("compiled-cold", "compiled-cached")
                    runs[cached] = run_phalanx(spec, True, threads, Path(f"{run_dir}-cached"), cache)
        for label, result in runs.items():
            print(f"  {label}: {result}", flush=True)
        if runs:
            print("\n" + table(runs) + "\n", flush=True)
        results["configs"][name] = {**spec, "runs": runs}
    if args.json is not None:
        print(f"wrote {write_json(results, args.json, 'vs_purejaxrl')}")


if __name__ == "__main__":
    main()
