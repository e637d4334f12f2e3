"""Milliseconds per update of each algorithm on a CPU, networks and batch as given, random data.

    python benchmarks/update_speed.py               # SAC, TD3 [64, 64] batch 256, DQN batch 64, PPO CartPole
    python benchmarks/update_speed.py --hidden 256 --json

An update is what the trainer calls once per gradient step (off-policy: ``algorithm.update(batch)``,
critic + actor + temperature + targets) or once per rollout (PPO: every epoch and minibatch of the
CartPole preset's 64 x 16 rollout, reported per gradient step as well). The data are random; only
the arithmetic and the per-op overhead are measured. Median of ``--repeats`` timings of ``--updates``
updates each, after a warm-up. The benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

import phalanx  # noqa: E402
from phalanx.buffers import ReplayBatch, RolloutBuffer  # noqa: E402
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
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    algorithm = get_algorithm("ppo")(hp, obs_space, action_space, torch.device("cpu"))
    rollout = RolloutBuffer(hp.horizon, config.num_envs, (4,), (), torch.int64, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for t in range(hp.horizon):
        obs = torch.randn(config.num_envs, 4, generator=generator)
        actions, log_probs, values = algorithm.explore(obs)
        rollout.add(
            t,
            obs=obs,
            actions=actions,
            log_probs=log_probs,
            values=values,
            rewards=torch.ones(config.num_envs),
            next_obs=obs,
            terminated=torch.zeros(config.num_envs, dtype=torch.bool),
            dones=torch.zeros(config.num_envs, dtype=torch.bool),
        )
    result = _time(lambda: algorithm.update(rollout, 0.5), updates, repeats)
    steps = hp.epochs * (hp.horizon * config.num_envs // hp.minibatch_size)
    result["ms_per_gradient_step"] = result["ms_per_update"] / steps
    return result


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
    add_json_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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


if __name__ == "__main__":
    main()
