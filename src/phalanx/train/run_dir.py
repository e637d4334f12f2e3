"""Run directories: where a run is written, its config.yaml, and the checks a resume makes."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

from phalanx.config import TrainConfig, load_yaml
from phalanx.errors import CheckpointError, ConfigError
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint


def default_run_dir(config: TrainConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe_env = re.sub(r"[^A-Za-z0-9_.-]", "_", config.env)
    base = Path("runs") / f"{safe_env}__{config.algo}__s{config.seed}__{stamp}"
    candidate, suffix = base, 1
    while candidate.exists():
        suffix += 1
        candidate = base.with_name(f"{base.name}_{suffix}")
    return candidate


def create_run_dir(config: TrainConfig) -> Path:
    run_dir = Path(config.run_dir) if config.run_dir else default_run_dir(config)
    # attempts/: earlier attempts of this run that ended before their first checkpoint (set_aside)
    if run_dir.exists() and any(entry.name != "attempts" for entry in run_dir.iterdir()):
        raise ConfigError(
            f"run directory {str(run_dir)!r} already exists and is not empty; "
            "phalanx never overwrites a run. "
            f"Continue it with `phalanx resume {run_dir}` (or this command with --resume, which starts the "
            "run where there is none and continues it where there is), or choose another --run-dir."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def read_run_config(run_dir: str | Path) -> TrainConfig:
    """The config.yaml of a run directory, with a clear error if ``run_dir`` is not one."""
    config_path = Path(run_dir) / "config.yaml"
    if not Path(run_dir).is_dir():
        raise CheckpointError(
            f"run directory {str(run_dir)!r} does not exist. Pass the directory that `phalanx train` "
            "created (its path is printed when training starts; `ls runs/` lists them)."
        )
    if not config_path.is_file():
        raise CheckpointError(
            f"{str(run_dir)!r} is not a phalanx run directory: {config_path.name} is missing. "
            "Pass the directory that `phalanx train` created (runs/<env>__<algo>__...)."
        )
    return TrainConfig.from_dict(load_yaml(config_path), where=str(config_path))


def resumable_state(run_dir: Path, config: TrainConfig, total_steps: int | None) -> dict[str, Any]:
    """The latest checkpoint's state, checked against config.yaml and the new ``total_steps``."""
    config_path = run_dir / "config.yaml"
    latest = CheckpointManager(run_dir).latest()
    if latest is None:
        raise CheckpointError(
            f"run directory {str(run_dir)!r} has no checkpoint to resume from: no complete "
            "checkpoints/step_<n> (checkpoints/best is the best evaluation's weights, not the latest state; "
            "a run killed before its first --checkpoint-every step, or without one, leaves none). "
            "Start a new run with `phalanx train` instead."
        )
    state = load_checkpoint(latest, map_location=config.device if config.num_learners == 1 else "cpu")
    saved = TrainConfig.from_dict(state["config"], where=f"{latest}/state.pt")
    refuse_differences(
        config_differences(saved, config),
        f"{config_path} does not match the config stored in the checkpoint {latest}: ",
        ("checkpoint has", "config.yaml has"),
        ". Restore config.yaml, or start a new run with the new settings.",
        error=CheckpointError,
    )
    if total_steps is not None and total_steps <= state["progress"]["steps"]:
        raise ConfigError(
            f"--total-steps {total_steps} is not beyond the {state['progress']['steps']} steps this run "
            "has already trained. Pass a larger --total-steps."
        )
    return state


def finished_summary(run_dir: Path, total_steps: int | None) -> dict[str, Any] | None:
    """The summary of a run that finished (its budget spent, or stopped by its stop_return or a hook) and
    has nothing left to train up to ``total_steps`` (None: its own budget); None where there is work left
    (an interrupted, failed or killed run, or a larger ``total_steps``)."""
    path = run_dir / "summary.json"
    latest = CheckpointManager(run_dir).latest()
    if not path.is_file() or latest is None:
        return None
    summary = json.loads(path.read_text())
    if summary.get("interrupted") or summary.get("error") is not None:
        return None
    if latest.name != f"step_{summary['total_steps']}":  # a later run went on and was killed
        return None
    if total_steps is not None and total_steps > summary["total_steps"]:
        return None
    return summary


def set_aside(run_dir: Path) -> Path:
    """Move what a run directory holds into its ``attempts/<n>/`` (a run that was killed before its first
    checkpoint: nothing to continue from), so that the run starts again there; nothing is deleted."""
    attempts = run_dir / "attempts"
    number = 1 + max((int(p.name) for p in attempts.glob("*") if p.name.isdigit()), default=0)
    target = attempts / str(number)
    target.mkdir(parents=True)
    for entry in list(run_dir.iterdir()):
        if entry.name != "attempts":
            entry.rename(target / entry.name)
    return target


def refuse_differences(
    differences: list[tuple[str, Any, Any]],
    opening: str,
    sides: tuple[str, str],
    closing: str,
    error: type[Exception] = ConfigError,
) -> None:
    """Raise ``error`` where a saved config and a new one differ (``differences``: ``(key, saved value,
    new value)`` each, as :func:`config_differences` lists them): ``opening``, then ``key: <saved side>
    a, <new side> b`` for each difference, ``sides`` naming the two, then ``closing`` (the fix)."""
    if differences:
        saved, new = sides
        listed = "; ".join(f"{key}: {saved} {a!r}, {new} {b!r}" for key, a, b in differences)
        raise error(opening + listed + closing)


def config_differences(saved: TrainConfig, current: TrainConfig) -> list[tuple[str, Any, Any]]:
    # Settings that change how fast a run goes, not what it computes, may differ on resume (compile: the
    # same computation up to float rounding, and checkpoints load in either mode), and so may where it is
    # tracked (a resumed run's W&B run continues from the id in its run directory).
    ignored = {
        "compile",
        "resume",
        "checkpoint_every_minutes",
        "track",
        "wandb_project",
        "wandb_entity",
        "track_optional",
        "total_steps",
        "run_dir",
        "num_workers",
        "worker_restarts",
        "worker_timeout",
        "torch_threads",
        "eval_process",
        "eval_batch",
        "pipeline",
        "pipeline_queue",
        "sync_every",
        "learner_timeout",
    }
    a, b = saved.to_dict(), current.to_dict()
    differences = [
        (k, a[k], b.get(k)) for k in a if k not in ignored and k != "hyperparameters" and a[k] != b.get(k)
    ]
    for key, value in a["hyperparameters"].items():
        if value != b["hyperparameters"].get(key):
            differences.append((f"hyperparameters.{key}", value, b["hyperparameters"].get(key)))
    return differences
