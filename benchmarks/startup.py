"""Start-up: how long the commands a user types take when there is (almost) nothing to do, against
``python -c "import torch"``, each a fresh process.

    python benchmarks/startup.py                 # 5 runs of each, medians (about a minute)
    python benchmarks/startup.py --repeats 9 --json

Commands: ``phalanx --help``, ``phalanx envs``, ``phalanx train ppo CartPole-v1`` for 64 env steps,
``phalanx eval`` and ``phalanx export`` of that run, ``phalanx check-env CartPole-v1 --steps 100``. The
commands run interleaved (one of each per repeat), so a change in the machine's load falls on all. It
measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, load_average, machine_info, markdown_table, write_json  # noqa: E402

PHALANX = [sys.executable, "-m", "phalanx.cli"]
TRAIN = ["train", "ppo", "CartPole-v1", "--num-envs", "8", "--horizon", "8", "--minibatch-size", "64",
         "--total-steps", "64", "--eval-every", "0", "--eval-episodes", "1"]  # fmt: skip


def commands(run: Path) -> dict[str, list[str]]:
    return {
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "phalanx --help": [*PHALANX, "--help"],
        "phalanx envs": [*PHALANX, "envs"],
        "phalanx train (64 steps)": [*PHALANX, *TRAIN, "--run-dir", str(run / "train")],
        "phalanx eval": [*PHALANX, "eval", str(run / "base"), "--episodes", "1"],
        "phalanx export": [*PHALANX, "export", str(run / "base"), "--format", "torchscript"],
        "phalanx check-env": [*PHALANX, "check-env", "CartPole-v1", "--steps", "100"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()
    print(f"machine: {machine_info()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="startup-") as directory:
        run = Path(directory)
        subprocess.run([*PHALANX, *TRAIN, "--run-dir", str(run / "base")], check=True, capture_output=True)
        timings: dict[str, list[float]] = {name: [] for name in commands(run)}
        for _ in range(args.repeats):
            for name, command in commands(run).items():
                if name.startswith("phalanx train"):
                    subprocess.run(["rm", "-rf", str(run / "train")], check=True)
                started = time.perf_counter()
                subprocess.run(command, check=True, capture_output=True)
                timings[name].append(time.perf_counter() - started)
    base = statistics.median(timings["python -c 'import torch'"])
    rows = [
        [name, statistics.median(values), min(values), statistics.median(values) - base]
        for name, values in timings.items()
    ]
    print("\n" + markdown_table(["command", "median s", "min s", "median - import torch s"], rows))
    print(f"load average after: {load_average()}")
    if args.json is not None:
        print(f"wrote {write_json({'machine': machine_info(), 'timings': timings}, args.json, 'startup')}")


if __name__ == "__main__":
    main()
