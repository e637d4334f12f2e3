"""How long a stop takes: SIGTERM to exit for the largest shipped presets, against a preemption's grace.

    python benchmarks/stop_latency.py                 # every case (a few minutes)
    python benchmarks/stop_latency.py --cases sac-halfcheetah-save-buffer --repeats 3 --json

Slurm sends SIGTERM and then SIGKILL after its grace period (KillWait, 30 s by default), Kubernetes after
``terminationGracePeriodSeconds`` (30 s by default), ``docker stop`` after 10 s. Each case starts the
command a user runs (``phalanx train`` or ``phalanx population run``) in a fresh process, waits until it
trains (its metrics.csv, or a population's first report, exists) and then ``--train-s`` seconds more,
sends SIGTERM to that process alone (as ``kill``, ``docker stop`` and a scheduler do), and measures the
seconds until it exits: the save at the next safe point, the last row and summary, every child ended.
Reported with the exit code, what the stop wrote (the newest checkpoint's size) and whether the run's
summary says SIGTERM. The benchmark measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

# name: (command after `phalanx`, what shows that training has begun: a file under the run directory)
CASES: dict[str, tuple[list[str], str]] = {
    "ppo-halfcheetah": (["train", "ppo", "HalfCheetah-v5"], "metrics.csv"),
    # the largest replay a MuJoCo preset saves: 1M transitions of HalfCheetah (its whole capacity)
    "sac-halfcheetah-save-buffer": (
        ["train", "sac", "HalfCheetah-v5", "--save-buffer", "--learning-starts", "1000"],
        "metrics.csv",
    ),
    "ppo-population-4-process": (
        [
            "population",
            "run",
            "ppo",
            "Pendulum-v1",
            "--size",
            "4",
            "--interval",
            "8192",
            "--backend",
            "process",
            "--mutate",
            "learning_rate=perturb:0.8,1.25",
        ],
        "leaderboard.json",
    ),  # fmt: skip
}


def newest_checkpoint_bytes(directory: Path) -> int:
    """Bytes of the newest step checkpoint under ``directory`` (a run, or every member of a population)."""
    newest = max(directory.rglob("step_*/state.pt"), key=lambda p: p.stat().st_mtime, default=None)
    return newest.stat().st_size if newest is not None else 0


def measure(name: str, train_s: float, timeout: float) -> dict[str, Any]:
    arguments, marker = CASES[name]
    directory = Path(tempfile.mkdtemp(prefix=f"stop_latency-{name}-")) / "run"
    where = ["--dir", str(directory)] if arguments[0] == "population" else ["--run-dir", str(directory)]
    command = [sys.executable, "-m", "phalanx.cli", *arguments, *where]
    log = directory.with_suffix(".log")
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while not (directory / marker).exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            return {"case": name, "error": f"never began training; see {log}"}
        time.sleep(0.2)
    time.sleep(train_s)
    sent = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        return {"case": name, "error": "still running 120 s after SIGTERM", "log": str(log)}
    seconds = time.perf_counter() - sent
    summaries = list(directory.rglob("summary.json"))
    signals = sorted({json.loads(p.read_text()).get("signal") or "-" for p in summaries})
    return {
        "case": name,
        "signal_to_exit_s": seconds,
        "exit_code": code,
        "checkpoint_mb": newest_checkpoint_bytes(directory) / 1e6,
        "summaries_say": signals,
        "command": " ".join(["phalanx", *arguments, *where]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--train-s", type=float, default=20.0, help="seconds of training before SIGTERM")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a case may take to begin")
    add_json_option(parser)
    args = parser.parse_args()
    print(f"machine: {machine_info()}", flush=True)
    results = []
    for name in args.cases:
        runs = [measure(name, args.train_s, args.timeout) for _ in range(args.repeats)]
        for run in runs:
            print(f"  {run}", flush=True)
        good = [r["signal_to_exit_s"] for r in runs if "signal_to_exit_s" in r]
        results.append(
            {
                "case": name,
                "runs": runs,
                "median_s": statistics.median(good) if good else None,
                "max_s": max(good) if good else None,
            }
        )
    rows = [
        [
            r["case"],
            r["median_s"] if r["median_s"] is not None else "failed",
            r["max_s"] if r["max_s"] is not None else "-",
            max((run.get("checkpoint_mb", 0) for run in r["runs"]), default=0),
            ", ".join(sorted({str(run.get("exit_code")) for run in r["runs"]})),
            ", ".join(sorted({s for run in r["runs"] for s in run.get("summaries_say", [])})),
        ]
        for r in results
    ]
    header = ["case", "SIGTERM to exit s (median)", "max s", "checkpoint MB", "exit code", "summary.json"]
    print("\n" + markdown_table(header, rows))
    if args.json is not None:
        path = write_json({"machine": machine_info(), "results": results}, args.json, "stop_latency")
        print(f"wrote {path}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
