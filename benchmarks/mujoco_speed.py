"""Speed of the MuJoCo presets (PPO, SAC, TD3) on this machine: gradient-step time and whole-run env steps/s.

    python benchmarks/mujoco_speed.py                         # both parts, PPO, SAC and TD3 on HalfCheetah-v5
    python benchmarks/mujoco_speed.py --part step             # gradient steps only (a minute or two)
    python benchmarks/mujoco_speed.py --part run --algos ppo --repeats 3 --json
    python benchmarks/mujoco_speed.py --quick                 # smoke test: one short repeat of each

Two parts, each an A/B of variants interleaved within one script (each repeat runs every variant once,
in an order rotated by one per repeat, so that a change in the machine's load falls on all of them);
the tables give the median over repeats, with the min.

- ``step``: one gradient step of the preset's networks (``phalanx.make_config(ALGO, ENV)``: PPO 64x64
  tanh, minibatch 64; SAC 256x256 relu, batch 256; the library defaults where no preset exists yet, as
  for TD3 until its MuJoCo presets land) on random data of HalfCheetah's shapes (17 observations, 6
  actions), in this process. PPO: a whole update of the preset's rollout (16 envs x 128 steps, 10 epochs
  of 32 minibatches: GAE, 320 gradient steps, the metrics), reported per gradient step. SAC, TD3: a batch
  sampled from a filled replay buffer and ``algorithm.update`` on it (critic step; actor, temperature
  and target networks where the rule updates them), per update. Variants: eager and compiled
  (``algorithm.compile()``; its compile time is paid in an untimed warm-up), and eager with torch's own
  ``Optimizer.step`` (the step before :meth:`phalanx.optim.FlatAdam.step` called the fused
  kernel directly), all with torch on 1 thread (threads are compared in part ``run``, each run in a
  process of its own: switching one process between thread counts slows its OpenMP pool far more than
  either count alone). Wall milliseconds and this process's CPU milliseconds per gradient step.
- ``run``: ``phalanx train ALGO ENV`` with the shipped preset in a fresh process per run, at a short
  budget (PPO 20,480 env steps, 10 updates; SAC and TD3 --learning-starts 2,000 --total-steps 4,000,
  2,000 updates), evaluated once at the end (1 episode). Variants: the preset as shipped (its
  ``num_workers`` worker processes, torch's default threads, eager), then ``--torch-threads 1``,
  ``--torch-threads 1 --num-workers 0`` (the sub-envs in the training process), ``--torch-threads 1
  --compile``, and for SAC and TD3 ``--torch-threads 1 --pipeline`` (collection in a thread beside the
  updates). The figure is the steady training rate from the run's metrics.csv: env steps between its
  first and last row (after learning starts for SAC/TD3: rows with updates) over the wall time between
  them, so start-up, the learning-starts phase and a compile in the first update are left out; gradient
  steps/s likewise.

Timings on a shared machine are noisy: compare variants of one invocation, never across invocations,
and record the load (the JSON has ``load_average_1_5_15min`` before and after each part). The benchmark
measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402
    add_json_option,
    load_average,
    machine_info,
    markdown_table,
    run_logged,
    write_json,
)

import phalanx  # noqa: E402
from phalanx.buffers import ReplayBuffer, StepLayout  # noqa: E402
from phalanx.optim import FlatAdam  # noqa: E402
from phalanx.registry import get_algorithm  # noqa: E402

ENV_ID = "HalfCheetah-v5"
OBS_DIM, ACTION_DIM = 17, 6  # HalfCheetah-v5's observation and action sizes
LAYOUT = StepLayout((OBS_DIM,), torch.float32, (ACTION_DIM,), torch.float32)
"""HalfCheetah-v5's step as the buffers store it."""
ALGOS = ("ppo", "sac", "td3")
STEP_VARIANTS = ("eager", "compiled", "eager, torch Optimizer.step")
RUN_VARIANTS: dict[str, list[str]] = {
    "preset as shipped": [],
    "1 thread": ["--torch-threads", "1"],
    "1 thread, envs in-process": ["--torch-threads", "1", "--num-workers", "0"],
    "1 thread, compiled": ["--torch-threads", "1", "--compile"],
    "1 thread, pipeline": ["--torch-threads", "1", "--pipeline"],
}
OFF_POLICY_ONLY = ("1 thread, pipeline",)  # --pipeline is for the off-policy algorithms
RUN_BUDGETS = {
    "ppo": ["--total-steps", "20480"],
    "off-policy": ["--learning-starts", "2000", "--total-steps", "4000"],
}
QUICK_BUDGETS = {
    "ppo": ["--total-steps", "4096"],
    "off-policy": ["--learning-starts", "500", "--total-steps", "1000"],
}


# -- part "step": gradient steps in this process ----------------------------------------------------------
def build_algorithm(algo: str) -> tuple[Any, phalanx.TrainConfig]:
    config = phalanx.make_config(algo, ENV_ID)
    torch.manual_seed(0)
    algorithm = get_algorithm(algo)(
        config.hyperparameters,
        gym.spaces.Box(-1.0, 1.0, (OBS_DIM,)),
        gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,)),
        torch.device("cpu"),
    )
    return algorithm, config


def ppo_update(algorithm: Any, config: phalanx.TrainConfig) -> tuple[Callable[[], Any], int]:
    """One PPO update of the preset's rollout shape on random data; (the update, its gradient steps)."""
    hp = config.hyperparameters
    horizon, num_envs = hp.horizon, config.num_envs
    rollout = algorithm.rollout_buffer(horizon, num_envs, LAYOUT, "cpu")
    generator = torch.Generator().manual_seed(0)
    rollout.obs.copy_(torch.randn(horizon, num_envs, OBS_DIM, generator=generator))
    rollout.next_obs.copy_(torch.randn(horizon, num_envs, OBS_DIM, generator=generator))
    rollout.rewards.copy_(torch.randn(horizon, num_envs, generator=generator))
    rollout.dones.copy_(torch.rand(horizon, num_envs, generator=generator) < 0.001)
    rollout.terminated.copy_(rollout.dones)
    actions, log_probs, values = algorithm.explore(rollout.obs.flatten(0, 1))
    rollout.actions.copy_(actions.view_as(rollout.actions))
    rollout.log_probs.copy_(log_probs.view(horizon, num_envs))
    rollout.values.copy_(values.view(horizon, num_envs))
    gradient_steps = hp.epochs * -(-horizon * num_envs // hp.minibatch_size)
    return (lambda: algorithm.update(rollout, 0.5)), gradient_steps


def off_policy_update(algorithm: Any, config: phalanx.TrainConfig) -> tuple[Callable[[], Any], int]:
    """A replay batch sampled from a filled buffer and one update on it; (the update, 1 gradient step)."""
    hp = config.hyperparameters
    num_envs = config.num_envs
    slots = 10_000 // num_envs
    buffer = ReplayBuffer(slots * num_envs, num_envs, LAYOUT, "cpu")
    generator = torch.Generator().manual_seed(0)
    for _ in range(slots):
        buffer.add(
            torch.randn(num_envs, OBS_DIM, generator=generator),
            torch.rand(num_envs, ACTION_DIM, generator=generator) * 2 - 1,
            torch.randn(num_envs, generator=generator),
            torch.randn(num_envs, OBS_DIM, generator=generator),
            torch.rand(num_envs, generator=generator) < 0.001,
            torch.zeros(num_envs, dtype=torch.bool),
        )

    def update() -> Any:
        return algorithm.update(buffer.sample(hp.batch_size, hp.gamma, hp.n_step), 0.5)

    return update, 1


def step_variant(algo: str, variant: str) -> dict[str, Any]:
    """The algorithm, its update closure and the settings one variant runs with."""
    algorithm, config = build_algorithm(algo)
    if variant == "compiled":
        algorithm.compile()
    make = ppo_update if algo == "ppo" else off_policy_update
    update, gradient_steps = make(algorithm, config)
    return {
        "update": update,
        "gradient_steps": gradient_steps,
        "torch_optimizer_step": variant == "eager, torch Optimizer.step",
    }


def time_updates(setup: dict[str, Any], seconds: float) -> tuple[float, float]:
    """Updates for at least ``seconds``: (wall ms, CPU ms of this process) per gradient step."""
    fast_step = FlatAdam.step
    if setup["torch_optimizer_step"]:
        FlatAdam.step = FlatAdam.torch_step  # type: ignore[method-assign]
    try:
        updates = 0
        wall, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - wall < seconds or updates < 2:
            setup["update"]()
            updates += 1
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        FlatAdam.step = fast_step  # type: ignore[method-assign]
    steps = updates * setup["gradient_steps"]
    return wall / steps * 1e3, cpu / steps * 1e3


def step_part(algos: list[str], repeats: int, seconds: float) -> list[dict[str, Any]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results = []
    for algo in algos:
        setups = {variant: step_variant(algo, variant) for variant in STEP_VARIANTS}
        for setup in setups.values():  # warm-up: the compiled variant compiles here, untimed
            for _ in range(3):
                setup["update"]()
        samples: dict[str, list[tuple[float, float]]] = {variant: [] for variant in STEP_VARIANTS}
        for repeat in range(repeats):
            order = (
                STEP_VARIANTS[repeat % len(STEP_VARIANTS) :] + STEP_VARIANTS[: repeat % len(STEP_VARIANTS)]
            )
            for variant in order:
                samples[variant].append(time_updates(setups[variant], seconds))
        for variant in STEP_VARIANTS:
            walls = [wall for wall, _ in samples[variant]]
            cpus = [cpu for _, cpu in samples[variant]]
            results.append(
                {
                    "algo": algo,
                    "variant": variant,
                    "wall_ms_median": statistics.median(walls),
                    "wall_ms_min": min(walls),
                    "cpu_ms_median": statistics.median(cpus),
                    "cpu_ms_min": min(cpus),
                    "repeats": repeats,
                }
            )
        print(step_table([r for r in results if r["algo"] == algo]), flush=True)
    torch.set_num_threads(threads)
    return results


def step_table(results: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["algo"],
            r["variant"],
            r["wall_ms_median"],
            r["wall_ms_min"],
            r["cpu_ms_median"],
        ]
        for r in results
    ]
    header = ["algo", "variant", "wall ms/step (median)", "wall ms (min)", "CPU ms/step (median)"]
    return markdown_table(header, rows)


# -- part "run": the presets' training runs, in fresh processes ------------------------------------------
def steady_rates(run_dir: Path) -> tuple[float, float] | None:
    """(env steps/s, gradient steps/s) between the first and the last row of metrics.csv that come after
    an update (None if there are fewer than two such rows)."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return None
    with open(path) as handle:
        rows = [row for row in csv.DictReader(handle) if float(row.get("updates") or 0) > 0]
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    seconds = float(last["wall_time_s"]) - float(first["wall_time_s"])
    steps = float(last["steps"]) - float(first["steps"])
    gradient_steps = gradient_step_count(last) - gradient_step_count(first)
    return steps / seconds, gradient_steps / seconds


def gradient_step_count(row: dict[str, str]) -> float:
    """Gradient steps so far at a metrics row: PPO logs its steps per update (``gradient_steps``, the last
    update's), so its count is updates x that; an off-policy update is one gradient step."""
    if row.get("gradient_steps"):
        return float(row["updates"]) * float(row["gradient_steps"])
    return float(row["updates"])


def run_variant(algo: str, variant: str, log_dir: Path, quick: bool, timeout: float) -> dict[str, Any]:
    budgets = QUICK_BUDGETS if quick else RUN_BUDGETS
    run_dir = log_dir / f"{algo}-{variant.replace(' ', '').replace(',', '-')}"
    command = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "train",
        algo,
        ENV_ID,
        *budgets["ppo" if algo == "ppo" else "off-policy"],
        "--eval-every",
        "0",
        "--eval-episodes",
        "1",
        "--log-every",
        "2048" if algo == "ppo" else "400",
        "--run-dir",
        str(run_dir),
        *RUN_VARIANTS[variant],
    ]
    start = time.perf_counter()
    code, _ = run_logged(command, log_dir / f"{run_dir.name}.log", timeout)
    wall = time.perf_counter() - start
    rates = steady_rates(run_dir) if code == 0 else None
    result: dict[str, Any] = {"algo": algo, "variant": variant, "process_s": wall, "exit": code}
    if rates is None:
        result["error"] = f"exit {code}, no steady rate; see {log_dir / (run_dir.name + '.log')}"
    else:
        result["env_steps_per_s"], result["gradient_steps_per_s"] = rates
    return result


def run_part(algos: list[str], repeats: int, quick: bool, timeout: float) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="mujoco-speed-") as directory:
        log_dir = Path(directory)
        for algo in algos:
            variants = [v for v in RUN_VARIANTS if not (algo == "ppo" and v in OFF_POLICY_ONLY)]
            samples: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
            for repeat in range(repeats):
                order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
                for variant in order:
                    result = run_variant(algo, variant, log_dir, quick, timeout)
                    print(f"  {algo} / {variant}: {result}", flush=True)
                    samples[variant].append(result)
            for variant in variants:
                good = [r for r in samples[variant] if "env_steps_per_s" in r]
                entry: dict[str, Any] = {"algo": algo, "variant": variant, "runs": samples[variant]}
                if good:
                    entry["env_steps_per_s_median"] = statistics.median(r["env_steps_per_s"] for r in good)
                    entry["env_steps_per_s_min"] = min(r["env_steps_per_s"] for r in good)
                    entry["gradient_steps_per_s_median"] = statistics.median(
                        r["gradient_steps_per_s"] for r in good
                    )
                results.append(entry)
            print(run_table([r for r in results if r["algo"] == algo]), flush=True)
    return results


def run_table(results: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["algo"],
            r["variant"],
            r.get("env_steps_per_s_median", "failed"),
            r.get("env_steps_per_s_min", "-"),
            r.get("gradient_steps_per_s_median", "-"),
        ]
        for r in results
    ]
    header = ["algo", "variant", "env steps/s (median)", "env steps/s (min)", "gradient steps/s (median)"]
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("step", "run", "both"), default="both")
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each variant (default 5)")
    parser.add_argument("--seconds", type=float, default=2.0, help="part step: seconds per timing")
    parser.add_argument("--timeout", type=float, default=900.0, help="part run: seconds per run")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 repeat, tiny budgets")
    add_json_option(parser)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    seconds = 0.2 if args.quick else args.seconds
    report: dict[str, Any] = {"machine": machine_info(), "env": ENV_ID, "load_average_during": {}}
    if args.part in ("step", "both"):
        print(f"gradient steps, {ENV_ID} shapes, load {load_average()}", flush=True)
        report["step"] = step_part(args.algos, repeats, seconds)
        report["load_average_during"]["step"] = load_average()
    if args.part in ("run", "both"):
        print(f"preset runs, {ENV_ID}, load {load_average()}", flush=True)
        report["run"] = run_part(args.algos, repeats, args.quick, args.timeout)
        report["load_average_during"]["run"] = load_average()
    print(f"load average after: {load_average()}")
    if args.json is not None:
        print(f"results: {write_json(report, args.json, 'mujoco_speed')}")


if __name__ == "__main__":
    main()
