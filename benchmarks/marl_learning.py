"""Multi-agent learning on simple_spread: MAPPO and QMIX (and any other multi-agent algorithm) with
their shipped presets, several seeds, against two references measured in the same script.

    python benchmarks/marl_learning.py                          # mappo and qmix, seeds 0..2
    python benchmarks/marl_learning.py --algos mappo --seeds 1
    python benchmarks/marl_learning.py --json out.json

Returns are the *team return*: the mean over the 3 agents of each agent's 25-step episode return,
with mpe2's simple_spread_v3 reward (local_ratio 0.5: half the shared -sum of landmark distances, half
the agent's own collision penalty), from the deterministic evaluation of the final policy over
``--eval-episodes`` episodes. The references, on the same env and start states:

- random: uniformly random actions;
- assignment: a scripted oracle that sees every position, assigns agents to landmarks by the cheapest
  permutation, and steers each agent straight at its landmark with a velocity-damped bang-bang
  controller. It is not optimal (agents can collide on the way) but shows what "solved" looks like.

Each run is a subprocess-free ``phalanx.train`` of the preset, one after another (never two at once),
``torch_threads`` 1. The benchmark measures and reports; it does not assert a return or a time.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

import phalanx  # noqa: E402
from phalanx.marl.mpe import SimpleSpread  # noqa: E402


def reference_returns(episodes: int, seed: int) -> dict[str, float]:
    """Team returns of the random and the scripted assignment policy."""
    results = {}
    for name in ("random", "assignment"):
        env = SimpleSpread(num_envs=episodes)
        env.reset(seed=seed)
        generator = torch.Generator().manual_seed(seed)
        for _ in range(25):
            if name == "random":
                actions = torch.randint(5, (episodes, 3), generator=generator)
            else:
                actions = _assignment_actions(env)
            _, _, _, _, info = env.step({"agent": actions})
        results[name] = float(info["episode_return"]["agent"].mean())
    return results


def _assignment_actions(env: SimpleSpread) -> torch.Tensor:
    agents, landmarks = env.position[:, :3], env.position[:, 3:]  # (N, 3, 2) each
    distance = (agents[:, :, None] - landmarks[:, None]).norm(dim=-1)  # (N, agent, landmark)
    permutations = torch.tensor(list(itertools.permutations(range(3))))  # (6, 3)
    cost = torch.stack([distance[:, torch.arange(3), p].sum(1) for p in permutations], dim=1)  # (N, 6)
    target = torch.gather(landmarks, 1, permutations[cost.argmin(1)][..., None].expand(-1, -1, 2))
    error = target - agents - 0.3 * env.velocity[:, :3]  # aim ahead of the drift
    horizontal = error[..., 0].abs() >= error[..., 1].abs()
    move = torch.where(horizontal, torch.where(error[..., 0] > 0, 2, 1), torch.where(error[..., 1] > 0, 4, 3))
    return torch.where(error.norm(dim=-1) < 0.05, 0, move)


def run(algo: str, seed: int, eval_episodes: int, directory: Path) -> dict[str, Any]:
    config = phalanx.make_config(
        algo,
        "simple_spread",
        seed=seed,
        eval_episodes=eval_episodes,
        torch_threads=1,
        run_dir=str(directory / f"{algo}_s{seed}"),
    )
    start = time.perf_counter()
    result = phalanx.train(config, show_progress=False)
    summary = result.summary
    return {
        "algo": algo,
        "seed": seed,
        "steps": summary["total_steps"],
        "wall_time_s": time.perf_counter() - start,
        "team_return": summary["eval_return_mean"],
        "best_team_return": summary["best_eval_return"],
        "steps_per_second": summary["steps_per_second"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", default="mappo,qmix")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-episodes", type=int, default=256)
    add_json_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    references = reference_returns(args.eval_episodes, seed=12345)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            for seed in range(args.seeds):
                runs.append(run(algo, seed, args.eval_episodes, Path(tmp)))
                print(runs[-1], flush=True)
    rows = []
    for algo in args.algos.split(","):
        mine = [r for r in runs if r["algo"] == algo]
        rows.append(
            [
                algo,
                mine[0]["steps"],
                f"{statistics.median(r['team_return'] for r in mine):.2f}",
                ", ".join(f"{r['team_return']:.2f}" for r in mine),
                f"{statistics.median(r['wall_time_s'] for r in mine):.0f}",
            ]
        )
    rows += [[name, "-", f"{value:.2f}", "-", "-"] for name, value in references.items()]
    print(markdown_table(["policy", "env steps", "median team return", "per seed", "median wall s"], rows))
    write_json(
        {"machine": machine_info(), "runs": runs, "references": references},
        args.json,
        "marl_learning",
    )


if __name__ == "__main__":
    main()
