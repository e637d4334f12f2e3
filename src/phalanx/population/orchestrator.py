"""Running a population: :func:`run_population` starts one in a new population directory and
:func:`resume_population` continues one, on a backend (serial, process, ray) under the orchestrator
(:class:`~phalanx.population.scheduler.Orchestrator`: runs the members as the resources fit, selects,
ends and spawns members when the resources change) or as one vectorized run
(:class:`~phalanx.population.vectorized_run.VectorizedRun`). What both end with is in
:mod:`phalanx.population.outcome`.

Population directory::

    population.yaml    the resolved PopulationConfig
    leaderboard.json   members, scores, hyperparameters, lineage (atomic)
    decisions.jsonl    every decision with its reason
    control.json       optional: {"max_concurrent": N}, read while running
    members/m000/ ...  each member's ordinary run directory
    best/              the best member, exported as a run directory (`phalanx eval DIR/best`)
    report/            scores.csv, lineage.csv, best_schedule.csv, curves.png, schedule.png, lineage.png
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from phalanx.errors import ConfigError
from phalanx.population.backends import make_backend
from phalanx.population.evolution import PopulationConfig, initial_hyperparameters, population_random
from phalanx.population.leaderboard import LIVE, Leaderboard, MemberRecord
from phalanx.population.outcome import (
    MEMBER_SEED_STRIDE,
    PopulationFailed,
    PopulationInterrupted,
    PopulationResult,
    member_seed,
    mutated,
    next_decision,
)
from phalanx.population.scheduler import Orchestrator, check_members_memory
from phalanx.population.vectorized_run import VectorizedRun
from phalanx.train.run_dir import config_differences, refuse_differences

__all__ = [  # with the names of scheduler, vectorized_run and outcome that were defined here before
    "MEMBER_SEED_STRIDE",
    "Orchestrator",
    "PopulationFailed",
    "PopulationInterrupted",
    "PopulationResult",
    "VectorizedRun",
    "check_members_memory",
    "default_directory",
    "member_seed",
    "mutated",
    "next_decision",
    "population_differences",
    "resume_population",
    "run_population",
]


def default_directory(config: PopulationConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("populations") / f"{config.base.env.replace('/', '-')}__{config.base.algo}__{stamp}"


def run_population(config: PopulationConfig, show_progress: bool = True) -> PopulationResult:
    """Train a population from ``config`` in a new population directory; returns the best member."""
    config.validate()
    if config.base.resume:
        continued = _continue_existing(config, show_progress)
        if continued is not None:
            return continued
    backend = _backend(config) if config.backend != "vectorized" else None
    try:
        directory = Path(config.directory) if config.directory else default_directory(config)
        if (directory / "leaderboard.json").exists():
            raise ConfigError(
                f"{directory} already holds a population. Continue it with `phalanx population resume "
                f"{directory}`, or choose another --dir."
            )
        board = Leaderboard(directory)
        orchestrator = None
        if backend is not None:
            orchestrator = Orchestrator(config, board, backend, _say(show_progress))
            if orchestrator.capacity < 1:
                raise ConfigError(orchestrator.too_small())
            orchestrator.check_memory(config.size)
        directory.mkdir(parents=True, exist_ok=True)
        config.directory = str(directory)
        config.save(directory / "population.yaml")
        for index in range(config.size):
            rng = population_random(config.base.seed, "member", index)
            seed = member_seed(config, index)
            board.add(MemberRecord(board.next_id(), seed, initial_hyperparameters(config, rng)))
        board.save()
    except BaseException:
        if backend is not None:
            backend.close()
        raise
    if orchestrator is None:
        return VectorizedRun(config, board, _say(show_progress)).run()
    return orchestrator.run()


def _continue_existing(config: PopulationConfig, show_progress: bool) -> PopulationResult | None:
    """``--resume`` (the base config's ``resume``): the population in ``config.directory`` continued, if
    there is one with the same settings; None where there is none (the caller starts it there)."""
    if not config.directory:
        raise ConfigError(
            "--resume needs --dir: the population directory to continue, or to start the population in when "
            "it holds none."
        )
    directory = Path(config.directory)
    if not (directory / "leaderboard.json").exists():
        return None
    saved = PopulationConfig.from_yaml(directory / "population.yaml")
    refuse_differences(
        population_differences(saved, config),
        f"--resume: the population in {str(directory)!r} has other settings than this command: ",
        ("the population has", "the command"),
        ". Rerun the command it was started with, or choose another --dir for a new population.",
    )
    return resume_population(directory, show_progress, total_steps=config.base.total_steps)


def population_differences(saved: PopulationConfig, current: PopulationConfig) -> list[tuple[str, Any, Any]]:
    """What makes ``current`` another population than ``saved``: its selection and mutations, and the
    members' config as a run's resume compares it; where it runs (backend, resources) may change."""
    ignored = {"base", "directory", "backend", "resources", "address", "fallback", "max_restarts"}
    a, b = saved.to_dict(), current.to_dict()
    differences = [(k, a[k], b.get(k)) for k in a if k not in ignored and a[k] != b.get(k)]
    return differences + [(f"base.{key}", x, y) for key, x, y in config_differences(saved.base, current.base)]


def resume_population(
    directory: str | Path, show_progress: bool = True, total_steps: int | None = None
) -> PopulationResult:
    """Continue a population from its leaderboard and its members' last checkpoints; ``total_steps``: a
    new budget per member (kept in population.yaml)."""
    directory = Path(directory)
    board = Leaderboard.load(directory)
    config = PopulationConfig.from_yaml(directory / "population.yaml")
    if total_steps is not None and total_steps != config.base.total_steps:
        config.base.total_steps = total_steps
        config.save(directory / "population.yaml")
    config.validate()
    if config.backend == "vectorized":
        return VectorizedRun(config, board, _say(show_progress), resume=True).run()
    for member in board.members.values():  # a larger budget wakes the finished members too
        if member.status in LIVE or (member.status == "finished" and member.steps < config.base.total_steps):
            member.status = "waiting"
    backend = _backend(config)
    try:
        orchestrator = Orchestrator(config, board, backend, _say(show_progress))
        orchestrator.check_memory(len(board.live()))
    except BaseException:
        backend.close()
        raise
    orchestrator.decide("resume", None, f"resumed with {len(board.live())} live members")
    return orchestrator.run()


def _backend(config: PopulationConfig) -> Any:
    if config.backend != "ray":
        return make_backend(config.backend, config.resources)
    try:
        return make_backend("ray", config.resources, config.address)
    except ConfigError as error:
        if not config.fallback:
            raise
        # Said, not silent: the user asked for Ray and gets processes on this machine.
        warnings.warn(f"{error} --fallback: running on the process backend instead.", stacklevel=3)
        config.backend = "process"
        return make_backend("process", config.resources)


def _say(show_progress: bool) -> Callable[[str], None] | None:
    if not show_progress:
        return None
    console = Console(stderr=True)
    return lambda message: console.print(escape(message), highlight=False, soft_wrap=True)  # paths whole
