"""The leaderboard: every member's scores, hyperparameters and status, and the lineage (who copied whom
and when), persisted atomically as ``leaderboard.json`` in the population directory; the decisions
the orchestrator takes are appended to ``decisions.jsonl`` with their reasons.

``write_report`` turns it into CSV files and PNG plots: each member's curve, the hyperparameter
schedule of the best member (followed back through the members it copied), and the lineage.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich import box
from rich.console import Group
from rich.padding import Padding
from rich.table import Table

from phalanx.errors import CheckpointError
from phalanx.files import append_line, atomic_write, write_text_atomic

LIVE = ("waiting", "running")


@dataclass
class MemberRecord:
    id: str
    seed: int
    hyperparameters: dict[str, Any]
    """The current values of the mutated hyperparameters."""
    steps: int = 0
    """Env steps trained (a copy keeps its own count; a spawned member starts from its parent's)."""
    scores: list[list[Any]] = field(default_factory=list)
    """[steps, evaluation mean return (None: none yet), seconds since the population started], one per
    report."""
    schedule: list[list[Any]] = field(default_factory=list)
    """[steps, hyperparameters] each time they were set."""
    status: str = "waiting"
    """waiting, running, finished, or removed (with ``reason``)."""
    restarts: int = 0
    reason: str | None = None
    checkpoint: str | None = None
    """The checkpoint of the last report (what a member that copies this one loads)."""
    pending: dict[str, Any] | None = None
    """A copy decided but not trained yet: {donor: checkpoint, hyperparameters, start_steps}."""

    @property
    def score(self) -> float | None:
        return self.scores[-1][1] if self.scores else None


class Leaderboard:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.members: dict[str, MemberRecord] = {}
        self.lineage: list[dict[str, Any]] = []
        self.selections = 0  # decisions drawn so far: the next one's random stream, so a resume repeats them
        self.generation = 0
        self.started = time.time()
        self.elapsed_before = 0.0  # seconds of earlier sessions (a resumed population)

    # -- state -----------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self.directory / "leaderboard.json"

    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.started

    def add(self, record: MemberRecord) -> MemberRecord:
        record.schedule.append([record.steps, dict(record.hyperparameters)])
        self.members[record.id] = record
        return record

    def next_id(self) -> str:
        return f"m{len(self.members):03d}"

    def live(self) -> list[MemberRecord]:
        return [m for m in self.members.values() if m.status in LIVE]

    def scores(self, members: list[str] | None = None) -> dict[str, float]:
        """Latest score of each live (or finished) member that has one."""
        chosen = (
            members if members is not None else [m.id for m in self.members.values() if m.status != "removed"]
        )
        return {m: score for m in chosen if (score := self.members[m].score) is not None}

    def best(self) -> MemberRecord | None:
        scored = [m for m in self.members.values() if m.score is not None and m.status != "removed"]
        return max(scored, key=lambda m: (m.score, -int(m.id[1:]))) if scored else None

    def record(self, member: str, steps: int, score: float | None, checkpoint: str | None) -> None:
        record = self.members[member]
        record.steps = steps
        record.scores.append([steps, score, round(self.elapsed(), 3)])
        record.checkpoint = checkpoint

    def set_hyperparameters(self, member: str, hyperparameters: dict[str, Any]) -> None:
        record = self.members[member]
        record.hyperparameters = dict(hyperparameters)
        record.schedule.append([record.steps, dict(hyperparameters)])

    def copied(
        self, member: str, donor: str, kind: str, before: dict[str, Any], after: dict[str, Any]
    ) -> None:
        """A lineage event: ``member`` took ``donor``'s agent (exploit, replace or spawn) and ``after``."""
        self.lineage.append(
            {
                "time_s": round(self.elapsed(), 3),
                "kind": kind,
                "member": member,
                "steps": self.members[member].steps,
                "donor": donor,
                "donor_steps": self.members[donor].steps,
                "donor_score": self.members[donor].score,
                "hyperparameters_before": before,
                "hyperparameters_after": after,
            }
        )

    def log(self, event: str, reason: str, **details: Any) -> dict[str, Any]:
        """Append a decision with its reason to decisions.jsonl; returns the entry."""
        entry = {"time_s": round(self.elapsed(), 3), "event": event, "reason": reason, **details}
        self.directory.mkdir(parents=True, exist_ok=True)
        append_line(self.directory / "decisions.jsonl", json.dumps(entry))
        return entry

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "phalanx-leaderboard-v1",
            "selections": self.selections,
            "generation": self.generation,
            "elapsed_s": self.elapsed(),
            "members": [dataclasses.asdict(m) for m in self.members.values()],
            "lineage": self.lineage,
        }

    @classmethod
    def from_dict(cls, directory: str | Path, data: dict[str, Any]) -> Leaderboard:
        board = cls(directory)
        board.members = {m["id"]: MemberRecord(**m) for m in data["members"]}
        board.lineage = data["lineage"]
        board.selections = data["selections"]
        board.generation = data["generation"]
        board.elapsed_before = data["elapsed_s"]
        return board

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Leaderboard:
        path = cls(directory).path
        if not path.is_file():
            raise CheckpointError(
                f"{str(directory)!r} is not a population directory: leaderboard.json is missing. Pass the "
                "directory that `phalanx population run` created (populations/<env>__<algo>__...)."
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise CheckpointError(
                f"{path} is not valid JSON ({error}); it was not written by phalanx."
            ) from None
        return cls.from_dict(directory, data)

    # -- views -----------------------------------------------------------------------------------
    def table(self) -> Any:
        """The ranking, best score first, then the members without a score, as a rich renderable: a table
        of the numbers, then each member's hyperparameters (and why it was removed) on lines of their
        own, which wrap to the terminal's width (nothing is cut). The directory is not in it: print it on
        a line of its own, whole."""
        ranking = Table(
            title="population ranking",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        for column in ("rank", "member", "score", "steps", "status", "copies"):
            justify: Literal["left", "right"] = "left" if column in ("member", "status") else "right"
            ranking.add_column(column, justify=justify, overflow="fold")
        details = Table.grid(padding=(0, 2))  # member, then its hyperparameters
        details.add_column(no_wrap=True)
        details.add_column()
        copies = {m: sum(1 for e in self.lineage if e["member"] == m) for m in self.members}
        ordered = sorted(
            self.members.values(),
            key=lambda m: (m.status == "removed", m.score is None, -(m.score or 0.0), m.id),
        )
        for rank, member in enumerate(ordered, start=1):
            ranking.add_row(
                str(rank),
                member.id,
                format_score(member.score),
                f"{member.steps:,}",
                member.status,
                str(copies[member.id]),
            )
            text = format_hyperparameters(member.hyperparameters) or "base config"
            details.add_row(
                member.id, text + (f"; {member.status}: {member.reason}" if member.reason else "")
            )
        return Group(ranking, "hyperparameters:", Padding(details, (0, 0, 0, 2)))

    def best_schedule(self) -> list[dict[str, Any]]:
        """The best member's hyperparameters over its whole history: its own schedule back to its last
        copy, then that of the member it copied up to the copy, and so on back to the start."""
        best = self.best()
        if best is None:
            return []
        rows: list[dict[str, Any]] = []
        member: str | None = best.id
        until: int | None = None
        while member is not None:
            copies = [
                e for e in self.lineage if e["member"] == member and (until is None or e["steps"] <= until)
            ]
            last = copies[-1] if copies else None
            since = last["steps"] if last else -1
            own = [
                [steps, values]
                for steps, values in self.members[member].schedule
                if (until is None or steps <= until) and steps >= since
            ]
            rows = [{"steps": s, "member": member, **v} for s, v in own] + rows
            member, until = (last["donor"], last["donor_steps"]) if last else (None, None)
        return rows

    def write_report(self) -> Path:
        """report/: scores.csv, lineage.csv, best_schedule.csv, curves.png, schedule.png, lineage.png."""
        out = self.directory / "report"
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(out / "scores.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["member", "steps", "score", "time_s", "status"])
            for m in self.members.values():
                for steps, score, seconds in m.scores:
                    writer.writerow([m.id, steps, score, seconds, m.status])
        names = sorted({k for e in self.lineage for k in e["hyperparameters_after"]})
        with atomic_write(out / "lineage.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(
                ["time_s", "kind", "member", "steps", "donor", "donor_steps", "donor_score", *names]
            )
            for e in self.lineage:
                after = e["hyperparameters_after"]
                writer.writerow(
                    [
                        e["time_s"],
                        e["kind"],
                        e["member"],
                        e["steps"],
                        e["donor"],
                        e["donor_steps"],
                        e["donor_score"],
                    ]
                    + [after.get(n) for n in names]
                )
        schedule = self.best_schedule()
        keys = [k for k in (schedule[0] if schedule else {}) if k not in ("steps", "member")]
        with atomic_write(out / "best_schedule.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["steps", "member", *keys])
            for row in schedule:
                writer.writerow([row["steps"], row["member"], *(row[k] for k in keys)])
        self._plot(out, schedule, keys)
        return out

    def _plot(self, out: Path, schedule: list[dict[str, Any]], keys: list[str]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        best = self.best()
        figure, axis = plt.subplots(figsize=(8, 4.5))
        scored = [m for m in self.members.values() if m.scores]
        for m in scored:
            steps, scores = [s[0] for s in m.scores], [s[1] for s in m.scores]
            is_best = best is not None and m.id == best.id
            axis.plot(
                steps,
                scores,
                lw=2.5 if is_best else 1,
                alpha=1 if is_best else 0.6,
                label=f"{m.id} (best)" if is_best else m.id,
            )
        axis.set(
            xlabel="env steps (member)", ylabel="evaluation return", title="members' curves (best in bold)"
        )
        if scored:  # every member named; many of them in columns beside the axes
            columns = 1 + len(scored) // 16
            axis.legend(fontsize="small", ncol=columns, loc="center left", bbox_to_anchor=(1.01, 0.5))
        figure.tight_layout()
        with atomic_write(out / "curves.png", "wb") as file:
            figure.savefig(file, format="png", dpi=100)
        plt.close(figure)

        figure, axes = plt.subplots(max(len(keys), 1), 1, figsize=(8, 2.2 * max(len(keys), 1)), squeeze=False)
        end = max((s[0] for s in best.scores), default=0) if best is not None else 0
        # to the end of the best member's training, not to its schedule's last change
        steps = [r["steps"] for r in schedule] + ([end] if schedule and end > schedule[-1]["steps"] else [])
        for axis, key in zip(axes[:, 0], keys, strict=False):
            values = [r[key] for r in schedule]
            axis.step(steps, values + values[-1:] * (len(steps) - len(values)), where="post")
            axis.set(ylabel=key)
        axes[-1, 0].set(xlabel="env steps")
        axes[0, 0].set(title=f"hyperparameter schedule of the best member ({best.id if best else '-'})")
        figure.tight_layout()
        with atomic_write(out / "schedule.png", "wb") as file:
            figure.savefig(file, format="png", dpi=100)
        plt.close(figure)

        order = {m: i for i, m in enumerate(self.members)}
        figure, axis = plt.subplots(figsize=(8, 0.35 * len(order) + 1.5))
        for m in self.members.values():
            if m.scores:
                axis.plot([m.scores[0][2], m.scores[-1][2]], [order[m.id]] * 2, color="grey", lw=1)
        for e in self.lineage:
            axis.annotate(
                "",
                xy=(e["time_s"], order[e["member"]]),
                xytext=(e["time_s"], order[e["donor"]]),
                arrowprops={"arrowstyle": "->", "color": "tab:red" if e["kind"] == "spawn" else "tab:blue"},
            )
        axis.set_yticks(range(len(order)), list(order))
        axis.set(xlabel="seconds", title="lineage: arrows from the copied member to the one that copied it")
        figure.tight_layout()
        with atomic_write(out / "lineage.png", "wb") as file:
            figure.savefig(file, format="png", dpi=100)
        plt.close(figure)


def format_score(score: float | None) -> str:
    """A score as tables and messages show it: 2 decimals, '-' for none."""
    return "-" if score is None else f"{score:.2f}"


def format_hyperparameters(values: dict[str, Any], separator: str = ", ") -> str:
    """``name=value`` of each hyperparameter, floats to 3 significant digits."""
    return separator.join(f"{name}={_short(value)}" for name, value in values.items())


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
