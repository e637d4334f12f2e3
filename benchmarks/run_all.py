"""All benchmarks (``make bench``): env throughput, worker processes, then time to solve against SB3.

    python benchmarks/run_all.py                 # 5 seeds (about 8-13 minutes on 2 CPU cores)
    python benchmarks/run_all.py --seeds 2       # quicker
    python benchmarks/run_all.py --device cuda --num-envs 1048576
    python benchmarks/run_all.py --atari-pong --recurrent-cartpole   # and the issue-25 comparisons (+~40 min)

Each benchmark writes its JSON under benchmarks/results/ and the tables are printed at the end.
The numbers depend on the machine and on what else runs on it: run on an otherwise idle machine
(the load average is recorded in the JSON files).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import atari_pong  # noqa: E402
import env_throughput  # noqa: E402
import process_workers  # noqa: E402
import recurrent_cartpole  # noqa: E402
import time_to_solve  # noqa: E402
from benchlib import load_average  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per library and env for time to solve")
    parser.add_argument("--envs", default="CartPole-v1,Pendulum-v1", help="time-to-solve envs")
    parser.add_argument("--device", default="cpu", help="device of the throughput benchmark's phalanx env")
    parser.add_argument(
        "--num-envs", type=int, default=65_536, help="phalanx envs in the throughput benchmark"
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="time to solve: torch threads for both (0: torch default)",
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-process-workers", action="store_true")
    parser.add_argument("--skip-time-to-solve", action="store_true")
    parser.add_argument(
        "--atari-pong",
        action="store_true",
        help="also PPO on Pong against CleanRL (atari_pong.py; the envpool extra, its peer's virtualenv)",
    )
    parser.add_argument(
        "--recurrent-cartpole",
        action="store_true",
        help="also recurrent PPO on CartPoleNoVel-v1, and against sb3-contrib (recurrent_cartpole.py)",
    )
    args = parser.parse_args(argv)

    print(f"load average (1, 5, 15 min) before: {load_average()}\n", flush=True)
    outputs = []
    if not args.skip_throughput:
        print("## Env throughput\n", flush=True)
        result = env_throughput.main(
            ["--device", args.device, "--num-envs", str(args.num_envs), "--threads", "1,0", "--json"]
        )
        outputs.append("## Env throughput\n\n" + env_throughput.table(result))
    if not args.skip_process_workers:
        print("\n## Worker processes\n", flush=True)
        result = process_workers.main(["--json"])
        outputs.append("## Worker processes\n\n" + process_workers.tables(result))
    if not args.skip_time_to_solve:
        print("\n## Time to solve\n", flush=True)
        result = time_to_solve.main(
            ["--seeds", str(args.seeds), "--envs", args.envs, "--torch-threads", str(args.torch_threads)]
        )
        outputs.append("## Time to solve\n\n" + time_to_solve.tables(result))
    if args.atari_pong:
        print("\n## Atari PPO on Pong against CleanRL\n", flush=True)
        result = atari_pong.main(["--json"])
        outputs.append(
            "## Atari PPO on Pong against CleanRL\n\n" + atari_pong.table(result["runs"], result["env_only"])
        )
    if args.recurrent_cartpole:
        print("\n## Recurrent PPO on CartPoleNoVel-v1\n", flush=True)
        result = recurrent_cartpole.main(["--json"])
        outputs.append(
            "## Recurrent PPO on CartPoleNoVel-v1\n\n"
            + recurrent_cartpole.solve_table(result["solve"]["runs"])
            + "\n\n"
            + recurrent_cartpole.speed_table(result["speed"]["runs"])
        )
    print("\n\n# Summary\n")
    print("\n\n".join(outputs))
    print(f"\nload average (1, 5, 15 min) after: {load_average()}")


if __name__ == "__main__":
    main()
