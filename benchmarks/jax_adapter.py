"""JAX adapter overhead: phalanx's ``env.step`` on torch tensors against the raw jitted JAX step.

    python benchmarks/jax_adapter.py                     # gymnax CartPole 1024 / 16384, brax on CPU
    python benchmarks/jax_adapter.py --device cuda --cases gymnax:CartPole-v1:65536
    python benchmarks/jax_adapter.py --json results.json

For every case (``backend:env:num_envs``) the same simulator is stepped three ways with fixed
actions, each for a warm-up and then for at least ``--seconds``:

- raw simulator: the simulator's own batched step, ``jax.jit(jax.vmap(...))`` on JAX arrays (gymnax:
  ``env.step`` with its built-in autoreset; Brax: ``env.step`` without any reset or time limit),
  ``jax.block_until_ready`` at the end of each chunk;
- raw adapter step: the adapter's jitted function (``env._step_function``: split keys, step, time
  limit, autoreset of ended rows) called on JAX arrays, the same way;
- phalanx: ``env.step(actions)`` with torch tensors: torch -> JAX through DLPack, the jitted step,
  JAX -> torch through DLPack for the five outputs, episode statistics in torch.

The adapter overhead is phalanx's time per vector step minus the raw adapter step's (what the
torch interface costs), and the ratio of the two. The benchmark measures; it does not assert.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

DEFAULT_CASES = (
    "gymnax:CartPole-v1:1024",
    "gymnax:CartPole-v1:16384",
    "brax:fast:1024",
    "brax:inverted_pendulum:128",
)


def _timed(step: Callable[[], Any], sync: Callable[[], None], warmup: int, seconds: float) -> float:
    """Seconds per call of ``step``: warm up, then run chunks of 20 calls until ``seconds`` passed."""
    for _ in range(warmup):
        step()
    sync()
    calls = 0
    start = time.perf_counter()
    while True:
        for _ in range(20):
            step()
        calls += 20
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


def bench_case(case: str, device: str, warmup: int, seconds: float) -> dict[str, Any]:
    import jax
    import torch

    from phalanx.envs.jax import BraxVecEnv, GymnaxVecEnv

    backend, name, count = case.rsplit(":", 2)
    num_envs = int(count)
    if backend == "gymnax":
        env = GymnaxVecEnv(name, num_envs=num_envs, device=device)
        simulator, params = env.env, env.params
        raw_simulator_step = jax.jit(
            jax.vmap(lambda key, state, action: simulator.step(key, state, action, params)[:2])
        )
    elif backend == "brax":
        env = BraxVecEnv(name, num_envs=num_envs, device=device)
        simulator = env.env
        raw_simulator_step = jax.jit(
            jax.vmap(lambda key, state, action: (state, simulator.step(state, action)))
        )
    else:
        raise SystemExit(f"unknown backend {backend!r} in case {case!r}: expected gymnax or brax")
    env.reset(seed=0)
    torch_actions = env.action_space.sample()
    torch_actions = torch.as_tensor(torch_actions, device=env.device).to(env._action_dtype)
    jax_actions = jax.device_put(jax.numpy.asarray(torch_actions.cpu().numpy()), env.jax_device)
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)

    carried = {"state": env._state}

    def simulator_step() -> None:
        _, carried["state"] = raw_simulator_step(keys, carried["state"], jax_actions)

    def simulator_sync() -> None:
        jax.block_until_ready(carried["state"])

    adapter = {"key": env._key, "state": env._state, "elapsed": env._elapsed}

    def adapter_step() -> None:
        outputs = env._step_function(adapter["key"], adapter["state"], adapter["elapsed"], jax_actions)
        adapter["key"], adapter["state"], adapter["elapsed"] = outputs[:3]

    def adapter_sync() -> None:
        jax.block_until_ready(adapter["state"])

    def phalanx_step() -> None:
        env.step(torch_actions)

    def phalanx_sync() -> None:
        jax.block_until_ready(env._state)
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)

    compile_start = time.perf_counter()
    simulator_step(), adapter_step(), phalanx_step()
    simulator_sync(), adapter_sync(), phalanx_sync()
    compile_seconds = time.perf_counter() - compile_start
    raw_simulator = _timed(simulator_step, simulator_sync, warmup, seconds)
    raw_adapter = _timed(adapter_step, adapter_sync, warmup, seconds)
    phalanx = _timed(phalanx_step, phalanx_sync, warmup, seconds)
    return {
        "case": case,
        "device": str(env.device),
        "num_envs": num_envs,
        "first_call_seconds": compile_seconds,
        "raw_simulator_us": raw_simulator * 1e6,
        "raw_adapter_us": raw_adapter * 1e6,
        "phalanx_us": phalanx * 1e6,
        "overhead_us": (phalanx - raw_adapter) * 1e6,
        "ratio_over_raw_adapter": phalanx / raw_adapter,
        "ratio_over_raw_simulator": phalanx / raw_simulator,
        "phalanx_env_steps_per_second": num_envs / phalanx,
    }


def run(cases: tuple[str, ...], device: str, warmup: int, seconds: float) -> dict[str, Any]:
    import brax
    import gymnax  # noqa: F401 - fails early with ModuleNotFoundError if the extra is missing
    import jax

    info = machine_info(device)
    info.update({"jax": jax.__version__, "brax": brax.__version__, "jax_devices": str(jax.devices())})
    return {
        "benchmark": "jax_adapter",
        "machine": info,
        "settings": {"seconds": seconds, "warmup_steps": warmup, "fixed_actions": True},
        "results": [bench_case(case, device, warmup, seconds) for case in cases],
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        [
            r["case"].rsplit(":", 1)[0],
            r["device"],
            r["num_envs"],
            round(r["raw_simulator_us"], 1),
            round(r["raw_adapter_us"], 1),
            round(r["phalanx_us"], 1),
            round(r["overhead_us"], 1),
            f"{r['ratio_over_raw_adapter']:.2f}x",
            f"{r['phalanx_env_steps_per_second']:,.0f}",
        ]
        for r in result["results"]
    ]
    header = ["env", "device", "sub-envs", "raw simulator us/step", "raw adapter us/step"]
    header += ["phalanx env.step us/step", "overhead us/step", "phalanx / raw adapter", "env steps/s"]
    return markdown_table(header, rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help="comma-separated backend:env:num_envs (default: %(default)s)",
    )
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--seconds", type=float, default=3.0, help="minimum timed seconds per variant")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up steps per variant")
    add_json_option(parser)
    args = parser.parse_args(argv)
    cases = tuple(case for case in args.cases.split(",") if case)
    result = run(cases, args.device, args.warmup, args.seconds)
    print(table(result))
    if args.json is not None:
        path = write_json(result, args.json, "jax_adapter")
        print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
