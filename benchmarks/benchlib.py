"""Helpers shared by the benchmark scripts: machine description, results files, markdown tables."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
FIGURES_DIR = Path(__file__).resolve().parent / "figures"
PEER_VENVS = Path(__file__).resolve().parent / ".peers"  # peers' virtualenvs and checkouts (gitignored)
# The peers' repositories, at the commits measured. Their code is theirs: it is cloned beside the
# virtualenvs (:func:`peer_source`), run unmodified, and never committed here.
PEER_REPOSITORIES = {
    "cleanrl": ("https://github.com/vwxyzjn/cleanrl", "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"),
    "purejaxrl": ("https://github.com/luchris429/purejaxrl", "31756b197773a52db763fdbe6d635e4b46522a73"),
    "purejaxql": ("https://github.com/mttga/purejaxql", "47af6d7b35c89ddfe633aaf7341bdb8964cb7cce"),
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on (CPU, cores, torch, the load when measured)."""
    import gymnasium
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gymnasium": gymnasium.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1_5_15min": load_average(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def timed_steps(step, sync, warmup_steps: int, min_seconds: float, chunk: int) -> tuple[int, float]:
    """Run ``step`` warmup_steps times, then in chunks until min_seconds have passed: (steps, seconds)."""
    for _ in range(warmup_steps):
        step()
    sync()
    steps = 0
    start = time.perf_counter()
    while True:
        for _ in range(chunk):
            step()
        steps += chunk
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return steps, elapsed


def add_json_option(parser: Any) -> None:
    """``--json [PATH]``: write the results as JSON to PATH, or with no PATH to benchmarks/results/."""
    parser.add_argument(
        "--json",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="write the results as JSON to PATH (no PATH: benchmarks/results/)",
    )


def write_json(data: Any, path: str | Path | None, default_name: str) -> Path:
    """Write ``data`` to ``path`` (default benchmarks/results/<default_name>); return the path."""
    if not path:  # None, or "" from a bare --json
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = RESULTS_DIR / f"{default_name}-{stamp}.json"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# -- time-to-solve harness shared by time_to_solve.py and offpolicy_time_to_solve.py -----------------
def sb3_learn_until(
    model: Any, eval_env: Any, threshold: float, eval_freq: int, budget: int
) -> dict[str, Any]:
    """Train an SB3 ``model`` until an ``EvalCallback`` (one deterministic episode per sub-env of
    ``eval_env``, every ``eval_freq`` callback calls) reaches ``threshold``, or for ``budget`` env
    steps; returns what it measured, timed from the call to ``learn``."""
    import torch
    from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold

    class Stop(StopTrainingOnRewardThreshold):
        solved_at: float | None = None
        solved_steps: int | None = None

        def _on_step(self) -> bool:
            keep_going = super()._on_step()
            if not keep_going and self.solved_at is None:
                self.solved_at = time.perf_counter()
                self.solved_steps = self.num_timesteps
            return keep_going

    stop = Stop(reward_threshold=threshold, verbose=0)
    evaluations: list[list[float]] = []  # the rows of the run's evaluations.csv (EVALUATION_COLUMNS)

    class Eval(EvalCallback):
        def _on_step(self) -> bool:
            evaluating = self.eval_freq > 0 and self.n_calls % self.eval_freq == 0
            weights_time = time.perf_counter() - start  # as phalanx's wall_time_s: when the weights were
            result = super()._on_step()
            if evaluating:
                result_time = time.perf_counter() - start
                evaluations.append([self.num_timesteps, weights_time, self.last_mean_reward, result_time])
            return result

    callback = Eval(
        eval_env,
        callback_on_new_best=stop,
        n_eval_episodes=eval_env.num_envs,
        eval_freq=eval_freq,
        deterministic=True,
        verbose=0,
        warn=False,
    )
    cpu_start = time.process_time()
    start = time.perf_counter()
    model.learn(total_timesteps=budget, callback=callback)
    end = time.perf_counter()
    reached = stop.solved_at is not None
    return {
        "reached": reached,
        "time_to_solve_s": stop.solved_at - start if reached else None,
        "steps": stop.solved_steps if reached else model.num_timesteps,
        "train_wall_s": end - start,
        "train_cpu_s": time.process_time() - cpu_start,
        "budget_steps": budget,
        "evaluations": len(evaluations),
        "last_eval_return": evaluations[-1][2] if evaluations else None,
        "torch_threads": torch.get_num_threads(),
        "curve": evaluations,
    }


PEER_EVALUATION_COLUMNS = ["steps", "wall_time_s", "eval_return_mean", "result_wall_time_s"]


def write_peer_run(run_dir: Path, settings: dict[str, Any], curve: list[list[float]]) -> None:
    """A peer library's run as a directory that ``phalanx plot`` reads like one of phalanx's: config.yaml
    with ``settings`` (``library``, ``algo``, ``env``, ``seed``, ``hyperparameters``) and evaluations.csv
    with the rows of ``curve`` (:data:`PEER_EVALUATION_COLUMNS`: the step and wall time of the weights
    evaluated, the deterministic mean return, when the result was in)."""
    import csv
    import io

    import yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(PEER_EVALUATION_COLUMNS)
    writer.writerows(curve)
    (run_dir / "evaluations.csv").write_text(text.getvalue())


def run_directory(log_dir: Path, name: str) -> Path:
    """Where a benchmark keeps a run: ``log_dir/runs/NAME`` (``NAME-2`` and so on if taken)."""
    base = log_dir / "runs" / name
    candidate, suffix = base, 1
    while candidate.exists():
        suffix += 1
        candidate = base.with_name(f"{name}-{suffix}")
    return candidate


def draw_figures(figures: list[dict[str, Any]]) -> list[str]:
    """Run ``phalanx plot`` once per figure (``runs``: a glob, ``output``, ``x``, ``title``, grouped by
    library: phalanx against the peer); returns the commands, as a reader would type them."""
    commands = []
    for figure in figures:
        arguments = [
            "plot",
            figure["runs"],
            "--group-by",
            "library",
            "--x",
            figure["x"],
            "--span",
            "longest",
            "--output",
            str(figure["output"]),
            "--title",
            figure["title"],
        ]
        subprocess.run([sys.executable, "-m", "phalanx.cli", *arguments], check=True)
        here = f"{Path.cwd()}/"  # shown relative to where it ran, as typed there
        commands.append(" ".join(["phalanx", *(shlex.quote(str(a).replace(here, "")) for a in arguments)]))
    return commands


def run_logged(command: list[str], log: Path, timeout: float) -> tuple[int, float]:
    """Run ``command`` with its output to ``log``; (exit code, 124 on timeout; CPU seconds of the child)."""

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as handle:
        try:
            code = subprocess.run(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            ).returncode
        except subprocess.TimeoutExpired:
            code = 124
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return code, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def final_evaluation_seconds(run_dir: Path) -> float:
    """How long a phalanx run's last evaluation took (0 if it has none): the time from its weights to its
    result, from the last row of evaluations.csv. A benchmark takes it off the process's wall time when
    the peer it is compared with does not evaluate."""
    import csv

    path = run_dir / "evaluations.csv"
    if not path.is_file():
        return 0.0
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    return float(rows[-1]["result_wall_time_s"]) - float(rows[-1]["wall_time_s"]) if rows else 0.0


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def median_time(runs: list[dict[str, Any]]) -> float:
    """Median time to solve, a run that never solved counting as infinitely slow (inf if most did not)."""

    times = [r["time_to_solve_s"] if r.get("reached") else math.inf for r in runs]
    return statistics.median(times) if times else math.nan


def run_phalanx(
    algo: str,
    env_id: str,
    threshold: float,
    seed: int,
    threads: int,
    log_dir: Path,
    timeout: float,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """``phalanx train ALGO ENV --stop-return R`` (its shipped preset) in a subprocess; what it measured.
    Its run directory is kept, without its checkpoints, as ``log_dir/runs/phalanx-ALGO-ENV-sSEED``.
    ``extra_args`` are appended to the command (e.g. ``--config FILE`` with a device and compile setting)."""

    name = f"phalanx-{algo}-{env_id}-s{seed}"
    run_dir = run_directory(log_dir, name)
    command = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "train",
        algo,
        env_id,
        "--stop-return",
        str(threshold),
        "--seed",
        str(seed),
        "--run-dir",
        str(run_dir),
    ]
    if threads:
        command += ["--torch-threads", str(threads)]
    command += list(extra_args)
    start = time.perf_counter()
    log = log_dir / f"{name}.log"
    completed, cpu_s = run_logged(command, log, timeout)
    process_s = time.perf_counter() - start
    summary_path = run_dir / "summary.json"
    base = {
        "library": "phalanx",
        "algo": algo,
        "env": env_id,
        "seed": seed,
        "process_s": process_s,
        "process_cpu_s": cpu_s,
        "log": str(log),
        "run_dir": str(run_dir),
    }
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    # `phalanx train --stop-return R` exits 1 when its budget ran out before R: a result (not reached),
    # not a failure, when the summary says the run ended without an error.
    if summary is None or summary["error"] is not None or completed not in (0, 1):
        return {
            **base,
            "reached": False,
            "error": f"exit {completed}",
            "time_to_solve_s": None,
            "steps": None,
        }
    config = read_yaml(run_dir / "config.yaml")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the run directory stays, to be plotted
    reached = summary["time_to_stop_return_s"] is not None
    return {
        **base,
        "reached": reached,
        "time_to_solve_s": summary["time_to_stop_return_s"],
        "steps": summary["total_steps"],
        "updates": summary["updates"],
        "train_wall_s": summary["wall_time_s"],
        "budget_steps": config.get("total_steps"),
        "eval_every": config.get("eval_every"),
        "num_envs": summary["num_envs"],
        "last_eval_return": summary["eval_return_mean"],
        "compile_time_s": summary.get("compile_time_s"),
        "compile_decision": summary.get("compile_decision"),  # compile: null, what the run chose and why
        "command": " ".join(command[3:]),
    }


def run_phalanx_config(
    settings: dict[str, Any], run_dir: Path, environment: dict[str, str] | None = None
) -> dict[str, Any]:
    """``phalanx train ALGO ENV --config FILE`` (``settings``, with ``algo`` and ``env``, in FILE) in a fresh
    process, as a user runs it, nothing imported or set before (``environment``: variables added to the
    process's, such as torch's compile cache): the process's wall time (the user's wait: imports, setup,
    compile, training, the final evaluation), the summary's figures (``wall_time_s``, the training's,
    compile included) and the last training return in metrics.csv."""
    import csv

    import yaml

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    config_file = run_dir.with_suffix(".yaml")
    config_file.write_text(yaml.safe_dump(settings))
    log = run_dir.with_suffix(".log")
    command = [sys.executable, "-m", "phalanx.cli", "train", settings["algo"], settings["env"]]
    command += ["--config", str(config_file), "--run-dir", str(run_dir)]
    start = time.perf_counter()
    with open(log, "w") as handle:
        code = subprocess.run(
            command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(environment or {})}
        ).returncode
    process_s = time.perf_counter() - start
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.is_file():
        return {"error": f"exit {code}", "log_tail": log.read_text()[-1500:]}
    summary = json.loads(summary_path.read_text())
    with open(run_dir / "metrics.csv") as handle:
        returns = [
            row["episode_return_mean"] for row in csv.DictReader(handle) if row.get("episode_return_mean")
        ]
    return {
        "process_s": process_s,
        "wall_time_s": summary["wall_time_s"],
        "compile_time_s": summary.get("compile_time_s"),
        "compile_decision": summary.get("compile_decision"),
        "steps": summary["total_steps"],
        "steps_per_second": summary["steps_per_second"],
        "final_return": float(returns[-1]) if returns else None,
        "eval_return": summary["eval_return_mean"],
        "command": " ".join(command[1:]),
    }


# -- peers run as they are, in virtualenvs of their own ----------------------------------------------------
def peer_checkout(peer: str) -> Path:
    """Where the checkout of ``peer`` (a key of :data:`PEER_REPOSITORIES`) goes:
    ``benchmarks/.peers/PEER-src``."""
    return PEER_VENVS / f"{peer}-src"


def peer_source(peer: str, needs: Sequence[str], source: Path | None = None) -> Path:
    """The checkout of ``peer`` (``source``, or :func:`peer_checkout`) holding the files ``needs``.

    Exits with the commands that clone it, at the commit measured, when a file is missing; says so when
    the checkout is at another commit (its figures are then not the recorded ones)."""
    url, commit = PEER_REPOSITORIES[peer]
    checkout = peer_checkout(peer) if source is None else source
    missing = [name for name in needs if not (checkout / name).is_file()]
    if missing:
        raise SystemExit(
            f"{peer}: no checkout of {url} at {checkout} ({', '.join(missing)} missing). Its code is not "
            f"kept in this repository; clone it there, at the commit measured:\n  git clone {url} "
            f"{checkout} && git -C {checkout} checkout {commit}"
        )
    head = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if head != commit:
        print(f"note: {checkout} is at {head or 'an unknown commit'}, not {commit[:8]} as measured")
    return checkout


def peer_python(peer: str, packages: list[str]) -> Path | None:
    """The Python of the virtualenv ``benchmarks/.peers/PEER`` with ``packages`` (pinned), created and
    installed on first use; None (and what to install, printed) when it cannot be set up."""
    venv = PEER_VENVS / peer
    python = venv / "bin" / "python"
    marker = venv / "installed.txt"
    if python.is_file() and marker.is_file() and marker.read_text().split() == packages:
        return python
    print(f"setting up {peer}'s virtualenv in {venv} (once; minutes)...", flush=True)
    PEER_VENVS.mkdir(parents=True, exist_ok=True)
    log = PEER_VENVS / f"{peer}-install.log"
    code, _ = run_logged([sys.executable, "-m", "venv", "--clear", str(venv)], log, timeout=600)
    if code == 0:
        code, _ = run_logged([str(python), "-m", "pip", "install", *packages], log, timeout=3600)
    if code != 0:
        print(
            f"{peer} was not run: its virtualenv could not be set up (pip exit {code}; see {log}). To set "
            f"it up by hand: {sys.executable} -m venv {venv} && {python} -m pip install "
            + " ".join(f"'{p}'" for p in packages)
            + f" && echo '{' '.join(packages)}' > {marker}",
            flush=True,
        )
        return None
    marker.write_text(" ".join(packages) + "\n")
    return python


def thread_environment(threads: int) -> dict[str, str]:
    """Environment variables that hold torch (OpenMP) and XLA to ``threads`` threads (0: their default)."""
    if not threads:
        return {}
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
        f"intra_op_parallelism_threads={threads}",
    }


def run_process(
    command: list[str], log: Path, cwd: Path | None = None, environment: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """Run ``command`` to its end, its output written to ``log`` as it comes (tail it to follow a long
    run), with ``environment`` added to this process's variables: (exit code, output, seconds)."""
    print(f"  running, output in {log}", flush=True)
    start = time.perf_counter()
    with open(log, "w") as handle:
        code = subprocess.run(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(environment or {})},
        ).returncode
    return code, log.read_text(), time.perf_counter() - start


def run_process_timed(
    command: list[str], log: Path, cwd: Path | None = None, environment: dict[str, str] | None = None
) -> tuple[int, list[tuple[float, str]], float]:
    """:func:`run_process`, each line of output timed as it arrives (unbuffered): (exit code, [(seconds
    since the start, line)], seconds to the exit). A peer's prints then give its own clock's timeline."""
    print(f"  running, output in {log}", flush=True)
    lines: list[tuple[float, str]] = []
    start = time.perf_counter()
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(environment or {})},
            text=True,
        )
        for line in process.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
            handle.write(line)
            handle.flush()
        code = process.wait()
    return code, lines, time.perf_counter() - start


def run_child(command: list[str], log: Path, environment: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``command`` (a benchmark script with --child); its result is the JSON on its line starting
    RESULT."""
    code, output, process_s = run_process(command, log, environment=environment)
    results = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if code != 0 or not results:
        return {"error": f"exit {code}, see {log}", "process_s": process_s}
    return {**json.loads(results[-1][len("RESULT ") :]), "process_s": process_s}
