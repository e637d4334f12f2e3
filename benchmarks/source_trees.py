"""The same ``phalanx train`` commands timed with two source trees of phalanx: a refactor's "speed unchanged".

    git worktree add --detach /tmp/before <commit-before>
    python benchmarks/source_trees.py --before /tmp/before/src --after src --repeats 3 --json

Each command runs in a fresh process (``python -m phalanx.cli`` with ``PYTHONPATH`` set to the tree), the
two trees interleaved in every repeat (before, after, before, ...), so that a change in the machine's load
falls on both. Reported per command: the median training wall time (summary.json's ``wall_time_s``) and
the median whole-process time of each tree, and after / before (below 1: the change made it faster). It
measures; it asserts nothing.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, load_average, machine_info, markdown_table, write_json  # noqa: E402

COMMON = ["--seed", "1", "--device", "cpu", "--no-compile", "--torch-threads", "1", "--eval-every", "0"]
COMMANDS = {
    "ppo CartPole-v1 4x128, 100k steps": [
        "train", "ppo", "CartPole-v1", "--num-envs", "4", "--horizon", "128", "--minibatch-size", "128",
        "--total-steps", "100000",
    ],
    "sac Pendulum-v1, 10k steps": [
        "train", "sac", "Pendulum-v1", "--num-envs", "1", "--total-steps", "10000",
        "--learning-starts", "1000",
    ],
    "dqn CartPole-v1, 20k steps": [
        "train", "dqn", "CartPole-v1", "--num-envs", "4", "--total-steps", "20000",
        "--learning-starts", "1000",
    ],
}  # fmt: skip
KEYS = ("train_s", "process_s")


def run_once(source: str, command: list[str], run_dir: Path) -> dict[str, float]:
    """One command in a fresh process with ``source`` on PYTHONPATH: its training and process seconds."""
    environment = {**os.environ, "PYTHONPATH": str(Path(source).resolve())}
    argv = [sys.executable, "-m", "phalanx.cli", *command, *COMMON, "--run-dir", str(run_dir)]
    started = time.perf_counter()
    subprocess.run(argv, env=environment, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    process = time.perf_counter() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"train_s": summary["wall_time_s"], "process_s": process}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="the src/ folder of the tree before the change")
    parser.add_argument("--after", default="src", help="the src/ folder of the tree after it (default: src)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commands", nargs="*", default=list(COMMANDS), choices=list(COMMANDS))
    add_json_option(parser)
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    times: dict[str, dict[str, list[dict[str, float]]]] = {c: {t: [] for t in trees} for c in args.commands}
    loads = [load_average()]
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for name in args.commands:
                for tree, source in trees.items():
                    run_dir = Path(scratch) / f"{tree}-{repeat}-{len(times[name][tree])}-{hash(name) % 997}"
                    times[name][tree].append(run_once(source, COMMANDS[name], run_dir))
                    print(f"{name} [{tree}] {times[name][tree][-1]}", file=sys.stderr)
            loads.append(load_average())
    rows, results = [], {}
    for name in args.commands:
        median = {
            tree: {
                key: statistics.median(run[key] for run in times[name][tree])
                for key in ("train_s", "process_s")
            }
            for tree in trees
        }
        ratio = {key: median["after"][key] / median["before"][key] for key in KEYS}
        results[name] = {"median": median, "after_over_before": ratio, "runs": times[name]}
        rows.append([
            name, f"{median['before']['train_s']:.2f}", f"{median['after']['train_s']:.2f}",
            f"{ratio['train_s']:.3f}", f"{median['before']['process_s']:.2f}",
            f"{median['after']['process_s']:.2f}", f"{ratio['process_s']:.3f}",
        ])  # fmt: skip
    header = [
        "command",
        "train s before",
        "after",
        "after/before",
        "process s before",
        "after",
        "after/before",
    ]
    print(markdown_table(header, rows))
    print(f"repeats: {args.repeats}; load averages at the start and after each repeat: {loads}")
    if args.json is not None:
        data = {"machine": machine_info(), "trees": trees, "repeats": args.repeats, "loads": loads}
        print(write_json({**data, "results": results}, args.json, "source_trees"))


if __name__ == "__main__":
    main()
