"""A vectorized population of P PPO members against one member, the same env steps each.

Both sides are ``phalanx.population.vectorized.VectorizedPPO`` with the same config, one with P = 1 and
one with P = ``--members``: the same learning rule, the same code path, the same env steps per member;
only the member dimension of every tensor differs. The target of the issue is P = 64 on CartPole-v1 in
at most 4x the wall time of one member on a 2-core CPU (measured, never asserted). The config is the
CartPole PPO preset (horizon 16, 8 epochs, hidden 32x32, learning rate 2e-3) with ``--num-envs`` sub-envs
per member and ``--minibatch-size`` sized for it (the preset has 2 minibatches per epoch of its 64 x 16
rollout; the default 64 keeps 2 per epoch of an 8 x 16 rollout).

    python benchmarks/population_vectorized.py                      # 64 members, 50k steps each, CPU
    python benchmarks/population_vectorized.py --members 256 --device cuda --steps 100000
    python benchmarks/population_vectorized.py --trainer    # and an ordinary phalanx.train of one member
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import torch
from benchlib import add_json_option, machine_info, markdown_table, write_json

import phalanx
from phalanx.population.vectorized import VectorizedPPO


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_population(config: phalanx.TrainConfig, members: int, steps: int, warmup: int) -> dict[str, Any]:
    """Seconds for ``members`` members to train ``steps`` env steps each, after ``warmup`` steps each."""
    population = VectorizedPPO(config, seeds=list(range(members)))
    device = population.device
    population.train(warmup)
    synchronize(device)
    start = time.perf_counter()
    metrics = population.train(steps)
    synchronize(device)
    wall = time.perf_counter() - start
    trained = population.steps - warmup  # whole rollouts: at least ``steps``
    returns = metrics["episode_return_mean"]
    population.close()
    return {
        "members": members,
        "wall_s": wall,
        "steps_per_member": trained,
        "env_steps_per_s": members * trained / wall,
        "episode_return_mean": float(returns.nanmean()) if returns.isfinite().any() else None,
    }


def population_config(env: str, device: str, num_envs: int, minibatch_size: int) -> phalanx.TrainConfig:
    """The PPO preset of ``env``, ``num_envs`` sub-envs per member, ``minibatch_size``, no step limit."""
    return phalanx.make_config(
        "ppo", env, num_envs=num_envs, minibatch_size=minibatch_size, device=device, total_steps=10**9
    )


def compare(config: phalanx.TrainConfig, members: int, steps: int, warmup: int) -> dict[str, Any]:
    """One member, then ``members`` members, ``steps`` env steps each: both timings, the wall-time ratio."""
    single = time_population(config, 1, steps, warmup)
    population = time_population(config, members, steps, warmup)
    return {
        "one_member": single,
        "population": population,
        "wall_time_ratio": population["wall_s"] / single["wall_s"],
    }


def time_trainer(config: phalanx.TrainConfig, steps: int) -> float:
    """Seconds of ``phalanx.train`` of one member for ``steps`` env steps (with its final evaluation)."""
    with tempfile.TemporaryDirectory() as directory:
        run = phalanx.TrainConfig.from_dict(
            {**config.to_dict(), "total_steps": steps, "eval_every": 0, "run_dir": f"{directory}/run"}
        )
        start = time.perf_counter()
        phalanx.train(run, show_progress=False)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=64, help="population size P")
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per member (timed)")
    parser.add_argument("--warmup", type=int, default=2_048, help="env steps per member before timing")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs per member")
    parser.add_argument("--minibatch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1)")
    parser.add_argument("--trainer", action="store_true", help="also time an ordinary phalanx.train run")
    add_json_option(parser)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)

    config = population_config(args.env, args.device, args.num_envs, args.minibatch_size)
    measured = compare(config, args.members, args.steps, args.warmup)
    single, population, ratio = measured["one_member"], measured["population"], measured["wall_time_ratio"]
    trainer_s = time_trainer(config, single["steps_per_member"]) if args.trainer else None

    hp = config.hyperparameters
    result = {
        "machine": machine_info(args.device),
        "settings": {
            **vars(args),
            "horizon": hp.horizon,
            "epochs": hp.epochs,
            "hidden_sizes": list(hp.hidden_sizes),
            "learning_rate": hp.learning_rate,
        },
        "one_member": single,
        "population": population,
        "wall_time_ratio": ratio,
        "trainer_one_member_s": trainer_s,
    }
    path = write_json(result, args.json, "population_vectorized") if args.json is not None else None
    rows = [
        [
            row["members"],
            row["steps_per_member"],
            row["wall_s"],
            row["env_steps_per_s"],
            f"{row['wall_s'] / single['wall_s']:.2f}x",
        ]
        for row in (single, population)
    ]
    print(
        f"{args.env}, {args.device} ({torch.get_num_threads()} thread(s)), num_envs {args.num_envs}/member, "
        f"horizon {hp.horizon}, epochs {hp.epochs}, minibatch {args.minibatch_size}, hidden {hp.hidden_sizes}"
    )
    print(markdown_table(["members", "steps/member", "wall s", "env steps/s (total)", "wall vs 1"], rows))
    print(f"{args.members} members in {ratio:.2f}x the wall time of one (target: <= 4x)")
    if trainer_s is not None:
        print(
            f"ordinary phalanx.train of one member, same steps: {trainer_s:.2f} s (with its final evaluation)"
        )
    if path is not None:
        print(f"results: {path}")


if __name__ == "__main__":
    main()
