"""How a population run ends and what it records on the way, shared by the orchestrator (members on a
backend, :mod:`phalanx.population.scheduler`) and the vectorized run
(:mod:`phalanx.population.vectorized_run`): the result and the errors it ends with, its decisions logged
with their reasons, the note on the exported best member, and the members' seeds and the decisions'
random draws (which a resume draws again).
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.errors import PhalanxError
from phalanx.files import write_text_atomic
from phalanx.population.evolution import PopulationConfig, population_random
from phalanx.population.leaderboard import Leaderboard, MemberRecord, format_hyperparameters, format_score

MEMBER_SEED_STRIDE = 10_000
"""Member k trains with seed base.seed + k * MEMBER_SEED_STRIDE (its sub-envs' seeds do not overlap)."""


@dataclass
class PopulationResult:
    directory: Path
    best_member: str
    best_score: float | None
    best_run_dir: Path
    """The best member exported as an ordinary run directory."""


class PopulationInterrupted(PhalanxError):
    """Ctrl+C: the members saved checkpoints and the leaderboard is saved; resume continues."""

    def __init__(self, directory: Path) -> None:
        super().__init__(
            f"population interrupted; every member saved a checkpoint. Continue with "
            f"`phalanx population resume {directory}`."
        )
        self.directory = directory


class PopulationFailed(PhalanxError):
    """No member produced a score (every one crashed past max_restarts): there is no best member."""

    def __init__(self, board: Leaderboard) -> None:
        directory = board.directory
        removals = {}  # member -> why it was removed, with its last error (decisions.jsonl)
        log = directory / "decisions.jsonl"
        for line in log.read_text().splitlines() if log.is_file() else []:
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by a kill
                entry = json.loads(line)
                if entry.get("event") == "remove":
                    removals[entry["member"]] = entry["reason"]
        members: dict[str, list[str]] = {}  # reason -> the members it applies to
        for member in board.members.values():
            reason = removals.get(member.id) or member.reason or f"has no score (status {member.status})"
            members.setdefault(reason, []).append(member.id)
        why = "; ".join(
            f"{'Every member' if len(ids) == len(board.members) > 1 else 'Member'} {', '.join(ids)}: {reason}"
            for reason, ids in members.items()
        )
        super().__init__(
            f"no member of the population in {directory} produced a score, so there is no best member. "
            f"{why}. The full tracebacks are the 'error' of the restart and remove entries in {log}. Fix "
            "the cause and start a new population (a resume does not bring removed members back)."
        )
        self.directory = directory


def member_seed(config: PopulationConfig, index: int) -> int:
    return config.base.seed + index * MEMBER_SEED_STRIDE


def next_decision(config: PopulationConfig, board: Leaderboard) -> random.Random:
    """The random draws of the next decision: the decision stream at the count of decisions so far,
    which the leaderboard keeps, so that a resumed population draws what it would have drawn."""
    board.selections += 1
    return population_random(config.base.seed, "decision", board.selections)


def log_decision(
    board: Leaderboard,
    say: Callable[[str], None],
    event: str,
    member: str | None,
    reason: str,
    **details: Any,
) -> None:
    """A decision: into decisions.jsonl with its reason, and onto the console."""
    board.log(event, reason, member=member, **details)
    say(f"{event}{' ' + member if member else ''}: {reason}")


def exported_result(
    board: Leaderboard, best: MemberRecord, exported: Path, say: Callable[[str], None]
) -> PopulationResult:
    """The result, after noting in the exported run directory which member it is (population.json)."""
    note = {"member": best.id, "score": best.score, "hyperparameters": best.hyperparameters}
    write_text_atomic(exported / "population.json", json.dumps(note, indent=1) + "\n")
    log_decision(
        board,
        say,
        "best",
        best.id,
        f"the best final score, {format_score(best.score)}; exported to {exported}",
    )
    return PopulationResult(board.directory, best.id, best.score, exported)


def mutated(hyperparameters: dict[str, Any]) -> str:
    """How a copy's decision ends: the mutated hyperparameters, or that a population without mutations
    copies weights alone."""
    if not hyperparameters:
        return "(its weights only: no --mutate, so every member keeps the base config's hyperparameters)"
    return f"and mutates to {format_hyperparameters(hyperparameters)}"
