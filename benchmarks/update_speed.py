"""Milliseconds per update of each algorithm on a CPU, networks and batch as given, random data.

    python benchmarks/update_speed.py               # SAC, TD3 [64, 64] batch 256, DQN batch 64, PPO CartPole
    python benchmarks/update_speed.py --hidden 256 --json
    python benchmarks/update_speed.py --compiled    # PPO's update eager against compiled

An update is what the trainer calls once per gradient step (off-policy: ``algorithm.update(batch)``,
critic + actor + temperature + targets) or once per rollout (PPO: every epoch and minibatch of the
CartPole preset's 64 x 16 rollout, reported per gradient step as well). The data are random; only
the arithmetic and the per-op overhead are measured. Median of ``--repeats`` timings of ``--updates``
updates each, after a warm-up. The benchmark measures; it asserts nothing.

``--compiled``: one PPO update (PureJaxRL's CartPole settings: 64x64 tanh, 4 epochs of 4 minibatches,
lr annealed) eager and compiled (``PPO.compile()``), side by side, alternating repeats, on 4 envs x 128
steps and 1024 envs x 32 steps; and the compile time, which each of two fresh processes pays on its
first update: the first with an empty inductor cache, the second with the cache the first left.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

import phalanx  # noqa: E402
from phalanx.buffers import ReplayBatch, RolloutBuffer, StepLayout, compute_gae, compute_gae_scan  # noqa: E402
from phalanx.registry import get_algorithm  # noqa: E402


def off_policy(name: str, hidden: int, batch: int, updates: int, repeats: int) -> dict:
    discrete = name == "dqn"
    env = "CartPole-v1" if discrete else "HalfCheetah-v5"
    obs_dim = 4 if discrete else 17
    obs_space = gym.spaces.Box(-1, 1, (obs_dim,))
    action_space = gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-1, 1, (6,))
    config = phalanx.make_config(name, env, use_preset=False, hidden_sizes=[hidden, hidden], batch_size=batch)
    algorithm = get_algorithm(name)(config.hyperparameters, obs_space, action_space, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    actions = (
        torch.randint(2, (batch,), generator=generator)
        if discrete
        else torch.rand(batch, 6, generator=generator) * 2 - 1
    )
    data = ReplayBatch(
        torch.randn(batch, obs_dim, generator=generator),
        actions,
        torch.randn(batch, generator=generator),
        torch.randn(batch, obs_dim, generator=generator),
        torch.full((batch,), 0.99),
    )
    return _time(lambda: algorithm.update(data, 0.5), updates, repeats)


def ppo(updates: int, repeats: int) -> dict:
    config = phalanx.make_config("ppo", "CartPole-v1")
    hp = config.hyperparameters
    algorithm = _cartpole_ppo(config)
    rollout = _rollout(algorithm, hp.horizon, config.num_envs)
    result = _time(lambda: algorithm.update(rollout, 0.5), updates, repeats)
    steps = hp.epochs * (hp.horizon * config.num_envs // hp.minibatch_size)
    result["ms_per_gradient_step"] = result["ms_per_update"] / steps
    return result


COMPILED_CONFIGS = {"4 envs x 128 steps": (4, 128), "1024 envs x 32 steps": (1024, 32)}
"""PureJaxRL's CartPole PPO at 4 and 1024 envs: 4 minibatches of a rollout, so 128 and 8192 samples."""


def _purejaxrl_config(num_envs: int, horizon: int) -> phalanx.TrainConfig:
    return phalanx.make_config(
        "ppo",
        "CartPole-v1",
        use_preset=False,
        num_envs=num_envs,
        horizon=horizon,
        minibatch_size=num_envs * horizon // 4,
        epochs=4,
        hidden_sizes=[64, 64],
        activation="tanh",
        learning_rate=2.5e-4,
        anneal_lr=True,
        entropy_coef=0.01,
        clip_range=0.2,
        max_grad_norm=0.5,
    )


def _cartpole_ppo(config: phalanx.TrainConfig):
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    return get_algorithm("ppo")(config.hyperparameters, obs_space, action_space, torch.device("cpu"))


def _rollout(algorithm, horizon: int, num_envs: int) -> RolloutBuffer:
    """A rollout of random observations acted on by ``algorithm``, reward 1, an episode end in 2%."""
    layout = StepLayout((4,), torch.float32, (), torch.int64)
    rollout = RolloutBuffer(horizon, num_envs, layout, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for t in range(horizon):
        obs = torch.randn(num_envs, 4, generator=generator)
        actions, log_probs, values = algorithm.explore(obs)
        dones = torch.rand(num_envs, generator=generator) < 0.02
        rollout.add(
            t,
            obs=obs,
            actions=actions,
            log_probs=log_probs,
            values=values,
            rewards=torch.ones(num_envs),
            next_obs=obs,
            terminated=dones,
            dones=dones,
        )
    return rollout


def ppo_eager_and_compiled(num_envs: int, horizon: int, updates: int, repeats: int) -> dict:
    """One PPO update eager and compiled, alternating ``repeats`` timings of ``updates`` updates each
    (the learning rate annealed along), and GAE alone: the loop and the scan."""
    config = _purejaxrl_config(num_envs, horizon)
    torch.manual_seed(0)
    eager = _cartpole_ppo(config)
    compiled = _cartpole_ppo(config)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile()
    rollout = _rollout(eager, horizon, num_envs)
    progress = iter(range(10**9))
    runs = {
        "eager": lambda: eager.update(rollout, next(progress) * 1e-6),
        "compiled": lambda: compiled.update(rollout, next(progress) * 1e-6),
    }
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up (the compiled one compiles here)
        for _ in range(3):
            run()
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(updates):
                run()
            timings[name].append((time.perf_counter() - start) / updates * 1e3)
    gae_inputs = (
        rollout.rewards,
        rollout.values,
        rollout.values,
        rollout.terminated,
        rollout.dones,
        0.99,
        0.95,
    )
    gae = {
        name: _time(lambda function=function: function(*gae_inputs), 20, repeats)["ms_per_update"]
        for name, function in (("loop", compute_gae), ("scan", compute_gae_scan))
    }
    result = {f"{name}_ms_per_update": statistics.median(values) for name, values in timings.items()}
    result["speedup"] = result["eager_ms_per_update"] / result["compiled_ms_per_update"]
    result["gradient_steps_per_update"] = 16
    result["gae_ms"] = gae
    result["timings_ms"] = timings
    return result


def compile_seconds(name: str) -> dict:
    """Seconds of ``compile()`` + the first update in a fresh process, first with an empty inductor
    cache, then with the cache the first left (the cost of a later run of the same shapes)."""
    seconds = {}
    with tempfile.TemporaryDirectory() as cache:
        environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for attempt in ("first", "cached"):
            command = [sys.executable, __file__, "--probe-compile", name]
            output = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
            seconds[attempt] = json.loads(output.stdout.strip().splitlines()[-1])["seconds"]
    return seconds


def probe_compile(name: str) -> None:
    """(In a fresh process) time compile() and the first compiled update of configuration ``name``."""
    num_envs, horizon = COMPILED_CONFIGS[name]
    algorithm = _cartpole_ppo(_purejaxrl_config(num_envs, horizon))
    rollout = _rollout(algorithm, horizon, num_envs)
    start = time.perf_counter()
    algorithm.compile()
    algorithm.update(rollout, 0.5)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def _time(update, updates: int, repeats: int) -> dict:
    for _ in range(max(updates // 5, 3)):
        update()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(updates):
            update()
        timings.append((time.perf_counter() - start) / updates * 1e3)
    return {"ms_per_update": statistics.median(timings), "timings_ms": timings}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compiled", action="store_true", help="PPO's update eager against compiled")
    parser.add_argument("--probe-compile", choices=list(COMPILED_CONFIGS), help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.probe_compile:
        probe_compile(args.probe_compile)
        return
    if args.compiled:
        compare_compiled(args)
        return
    results = {}
    for name, batch in (("sac", 256), ("td3", 256), ("dqn", 64)):
        results[f"{name} [{args.hidden}, {args.hidden}] batch {batch}"] = off_policy(
            name, args.hidden, batch, args.updates, args.repeats
        )
    results["ppo CartPole preset (one rollout)"] = ppo(max(args.updates // 10, 10), args.repeats)
    rows = [
        [
            name,
            f"{r['ms_per_update']:.3f}",
            f"{r['ms_per_gradient_step']:.3f}" if "ms_per_gradient_step" in r else "",
        ]
        for name, r in results.items()
    ]
    print(markdown_table(["update", "ms per update", "ms per gradient step"], rows))
    if args.json is not None:
        path = write_json(
            {"machine": machine_info(), "args": vars(args), "results": results}, args.json, "update_speed"
        )
        print(f"\nwrote {path}")


def compare_compiled(args: argparse.Namespace) -> None:
    results = {}
    for name, (num_envs, horizon) in COMPILED_CONFIGS.items():
        updates = max(args.updates // (10 if num_envs < 64 else 100), 2)
        results[name] = ppo_eager_and_compiled(num_envs, horizon, updates, args.repeats)
        results[name]["compile_s"] = compile_seconds(name)
    rows = [
        [
            name,
            f"{r['eager_ms_per_update']:.2f}",
            f"{r['compiled_ms_per_update']:.2f}",
            f"{r['speedup']:.2f}x",
            f"{r['gae_ms']['loop']:.3f} / {r['gae_ms']['scan']:.3f}",
            f"{r['compile_s']['first']:.1f} / {r['compile_s']['cached']:.1f}",
        ]
        for name, r in results.items()
    ]
    header = ["PPO update (16 gradient steps)", "eager ms", "compiled ms", "speedup", "GAE ms loop / scan"]
    print(markdown_table([*header, "compile s first / cached"], rows))
    if args.json is not None:
        data = {"machine": machine_info(), "args": vars(args), "results": results}
        print(f"\nwrote {write_json(data, args.json, 'update_speed_compiled')}")


if __name__ == "__main__":
    main()
