"""Which torch thread count and OpenMP wait policy to default to: small and large networks, on a quiet
and on a loaded machine, through the CLI a user runs.

    python benchmarks/threads.py                     # every case and variant (about 10 minutes on 2 cores)
    python benchmarks/threads.py --cases ppo-cartpole-4x128 --repeats 3 --json

Each run is ``phalanx train ...`` in a fresh process with ``--torch-threads T`` and, where the variant
says so, ``OMP_WAIT_POLICY`` in its environment (it only acts if set before torch starts; unset, GNU
OpenMP spins a while before it sleeps). "loaded" runs it beside one busy process (a Python loop) per
``--load`` core, as a shared machine has; "quiet" beside nothing of this script's. The figure is the
run's env steps/s from its summary (training wall time, start-up excluded). The variants of one case and
load run interleaved, in an order rotated per repeat. It measures; it asserts nothing.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, load_average, machine_info, markdown_table, write_json  # noqa: E402

SMALL = ["--eval-every", "0", "--eval-episodes", "2", "--log-every", "100000000"]
CASES: dict[str, list[str]] = {
    # PureJaxRL's CartPole PPO: 64x64 tanh, minibatches of 128 (the small end)
    "ppo-cartpole-4x128": ["ppo", "CartPole-v1", "--num-envs", "4", "--horizon", "128", "--minibatch-size",
                           "128", "--epochs", "4", "--total-steps", "40960", "--hidden-sizes", "64", "64"],
    # the same network on 1,024 envs, minibatches of 8,192
    "ppo-cartpole-1024x32": ["ppo", "CartPole-v1", "--num-envs", "1024", "--horizon", "32",
                             "--minibatch-size", "8192", "--epochs", "4", "--total-steps", "655360",
                             "--hidden-sizes", "64", "64"],
    # a large network: SAC's MuJoCo preset sizes (256x256, batch 256), one update per env step
    "sac-256x256": ["sac", "Pendulum-v1", "--num-envs", "1", "--hidden-sizes", "256", "256", "--batch-size",
                    "256", "--learning-starts", "500", "--total-steps", "2500"],
}  # fmt: skip
VARIANTS = {
    "1 thread": (1, None),
    "2 threads": (2, None),
    "2 threads, PASSIVE": (2, "PASSIVE"),
    "1 thread, PASSIVE": (1, "PASSIVE"),
}


def run(case: str, variant: str, directory: Path) -> dict[str, Any]:
    threads, policy = VARIANTS[variant]
    run_dir = directory / f"{case}-{variant.replace(' ', '').replace(',', '_')}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "phalanx.cli", "train", *CASES[case], *SMALL]
    command += ["--torch-threads", str(threads), "--run-dir", str(run_dir)]
    environment = dict(os.environ)
    environment.pop("OMP_WAIT_POLICY", None)
    if policy is not None:
        environment["OMP_WAIT_POLICY"] = policy
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=1800)
    process_s = time.perf_counter() - started
    summary_path = run_dir / "summary.json"
    if done.returncode != 0 or not summary_path.is_file():
        return {"error": f"exit {done.returncode}: {(done.stdout + done.stderr)[-500:]}"}
    summary = json.loads(summary_path.read_text())
    return {"steps_per_second": summary["steps_per_second"], "process_s": process_s}


class Load:
    """``cores`` busy Python loops, for the duration of a ``with`` block."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> Load:
        self.processes = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.cores)
        ]
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: Any) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--load", type=int, default=1, help="busy cores in the loaded condition")
    add_json_option(parser)
    args = parser.parse_args()
    print(f"machine: {machine_info()}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="threads-") as directory:
        for load_name, cores in (("quiet", 0), ("loaded", args.load)):
            with Load(cores):
                for case in args.cases:
                    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
                    for repeat in range(args.repeats):
                        shift = repeat % len(args.variants)
                        for variant in args.variants[shift:] + args.variants[:shift]:
                            sample = run(case, variant, Path(directory))
                            sample["load_average"] = load_average()
                            print(f"  {load_name} {case} {variant}: {sample}", flush=True)
                            samples[variant].append(sample)
                    for variant, runs in samples.items():
                        rates = [r["steps_per_second"] for r in runs if "steps_per_second" in r]
                        results.append(
                            {
                                "load": load_name,
                                "case": case,
                                "variant": variant,
                                "median_steps_per_second": statistics.median(rates) if rates else None,
                                "runs": runs,
                            }
                        )
    rows = [[r["load"], r["case"], r["variant"], r["median_steps_per_second"] or "failed"] for r in results]
    print("\n" + markdown_table(["load", "case", "variant", "env steps/s (median)"], rows))
    if args.json is not None:
        print(f"wrote {write_json({'machine': machine_info(), 'results': results}, args.json, 'threads')}")


if __name__ == "__main__":
    main()
