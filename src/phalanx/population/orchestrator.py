"""The orchestrator: runs a population on a backend, selects, and fits it to the resources it is given.

It runs as many members at once as fit (``Resources.slots`` of what the backend sees, at most
``max_concurrent``) and queues the rest, the members with the fewest steps first. When the resources
shrink (a Ray node leaves, or ``phalanx population scale DIR --max-concurrent N`` lowers the limit while
it runs) it ends the weakest members; when they grow it spawns members from the strongest. Every
decision goes to ``decisions.jsonl`` with its reason, and the leaderboard is saved after each report,
so that ``phalanx population resume DIR`` goes on from there after the orchestrator is killed.

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

import contextlib
import dataclasses
import datetime as dt
import json
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from phalanx.buffer_memory import MEMORY_HEADROOM, ReplayMemory, available_when_short
from phalanx.config import TrainConfig, save_yaml
from phalanx.errors import ConfigError, PhalanxError
from phalanx.files import replace_directory, write_text_atomic
from phalanx.population.backends import Report, Task, make_backend
from phalanx.population.evolution import (
    PopulationConfig,
    explore,
    generational_plan,
    initial_hyperparameters,
    member_config,
    population_random,
    ranking,
    split,
    tournament_donor,
)
from phalanx.population.leaderboard import LIVE, Leaderboard, MemberRecord, format_hyperparameters
from phalanx.registry import trainer_class, vectorized_population
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.environments import picklable_factory
from phalanx.train.run_dir import config_differences

MEMBER_SEED_STRIDE = 10_000
"""Member k trains with seed base.seed + k * MEMBER_SEED_STRIDE (its sub-envs' seeds do not overlap)."""


@dataclass
class PopulationResult:
    directory: Path
    best_member: str
    best_score: float
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


def default_directory(config: PopulationConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("populations") / f"{config.base.env.replace('/', '-')}__{config.base.algo}__{stamp}"


class Orchestrator:
    def __init__(
        self,
        config: PopulationConfig,
        board: Leaderboard,
        backend: Any,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.board = board
        self.backend = backend
        self.say = say or (lambda message: None)
        self.directory = board.directory
        self.capacity = self.fit()
        self.minimum = 2 if config.strategy == "tournament" else 1
        self.envs = {}
        if backend.name != "serial":
            self.envs = picklable_factory(
                config.base.env,
                f"the {backend.name} backend trains members in other processes",
                "use --backend serial",
            )

    # -- resources -------------------------------------------------------------------------------
    def fit(self) -> int:
        """How many members fit now: the resources told, capped by what the backend sees and by
        control.json's max_concurrent."""
        resources = self.config.resources
        control = self.directory / "control.json"
        if control.is_file():
            try:
                limit = json.loads(control.read_text()).get("max_concurrent")
            except (json.JSONDecodeError, OSError):
                limit = None  # a half-written file: read it on the next round
            if limit is not None:
                resources = dataclasses.replace(resources, max_concurrent=int(limit))
        cpus, gpus, memory = self.backend.seen_resources()
        cpus = min(cpus, resources.cpus) if resources.cpus is not None else cpus
        gpus = min(gpus, resources.gpus) if resources.gpus is not None else gpus
        memory = resources.memory_gb if memory is None else min(memory, resources.memory_gb or memory)
        return resources.slots(cpus, gpus, memory)

    def adapt(self) -> None:
        """Elasticity: end the weakest members when the capacity shrank; spawn from the best if it grew."""
        capacity = self.fit()
        if capacity == self.capacity:
            return
        before, self.capacity = self.capacity, capacity
        live = self.board.live()
        if capacity < before:
            excess = min(before - capacity, len(live) - self.minimum)
            weakest = sorted(live, key=lambda m: (m.score is not None, m.score or 0.0, -int(m.id[1:])))
            for member in weakest[: max(excess, 0)]:
                self.backend.stop(member.id)
                member.status, member.reason = "removed", f"culled: capacity {before} -> {capacity}"
                self.decide(
                    "cull",
                    member.id,
                    f"the resources shrank: {capacity} members fit instead of {before}; {member.id} is the "
                    "weakest "
                    f"live member (score {_score(member.score)})",
                )
            if excess < before - capacity:
                self.decide(
                    "keep", None, f"kept {len(self.board.live())} members, the least this strategy needs"
                )
            return
        best = self.board.best()
        for _ in range(capacity - before):
            self.spawn(best, f"the resources grew: {capacity} members fit instead of {before}")

    def spawn(self, parent: MemberRecord | None, reason: str) -> MemberRecord:
        index = len(self.board.members)
        if parent is None or parent.checkpoint is None:
            rng = population_random(self.config.base.seed, "member", index)
            hyperparameters = initial_hyperparameters(self.config, rng)
            record = self.board.add(
                MemberRecord(self.board.next_id(), self.member_seed(index), hyperparameters)
            )
            self.decide("spawn", record.id, f"{reason}; no member has been scored yet: a new member")
            return record
        hyperparameters = explore(parent.hyperparameters, self.config.mutations, self.rng())
        record = self.board.add(
            MemberRecord(self.board.next_id(), self.member_seed(index), hyperparameters, steps=parent.steps)
        )
        record.pending = {
            "donor": parent.checkpoint,
            "hyperparameters": hyperparameters,
            "start_steps": parent.steps,
        }
        self.board.copied(record.id, parent.id, "spawn", dict(parent.hyperparameters), hyperparameters)
        self.decide(
            "spawn",
            record.id,
            f"{reason}; copies the strongest, {parent.id} (score {_score(parent.score)}), "
            f"with {format_hyperparameters(hyperparameters)}",
        )
        return record

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> PopulationResult:
        if self.capacity < 1:
            raise ConfigError(self.too_small())
        self.say(f"population {self.directory}: {len(self.board.live())} members, {self.capacity} at once")
        interrupted = False
        try:
            while True:
                self.adapt()
                self.dispatch()
                if not self.backend.running() and not self.waiting():
                    if self.config.strategy == "generational" and self.generation_done():
                        self.select_generation()
                        continue
                    break
                for report in self.backend.wait(timeout=1.0):
                    interrupted |= self.handle(report)
                if self.config.strategy == "generational" and self.generation_done():
                    self.select_generation()
                self.board.save()
                if interrupted:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            self.backend.close()  # a member in flight saves its checkpoint as it ends
            for member in self.board.live():
                member.status = "waiting"
            self.decide("interrupt", None, "Ctrl+C: members saved checkpoints; resume goes on from them")
            self.board.save()
            raise PopulationInterrupted(self.directory) from None
        finally:
            self.backend.close()
        return self.finish()

    def waiting(self) -> list[MemberRecord]:
        """Members ready for their next interval, the fewest steps first."""
        limit = self.generation_target() if self.config.strategy == "generational" else None
        ready = [
            m
            for m in self.board.live()
            if m.status == "waiting"
            and (limit is None or m.steps < limit)
            and m.steps < self.config.base.total_steps
        ]
        return sorted(ready, key=lambda m: (m.steps, m.id))

    def dispatch(self) -> None:
        free = self.capacity - len(self.backend.running())
        for member in self.waiting()[: max(free, 0)]:
            pending = member.pending or {}
            target = min(member.steps + self.config.interval, self.config.base.total_steps)
            if self.config.strategy == "generational":
                target = min(self.generation_target(), self.config.base.total_steps)
            config = member_config(
                self.config, member.seed, member.hyperparameters, self.member_dir(member.id)
            )
            self.backend.submit(
                Task(
                    member.id,
                    config.to_dict(),
                    target,
                    donor=pending.get("donor"),
                    hyperparameters=pending.get("hyperparameters"),
                    start_steps=pending.get("start_steps"),
                    envs=self.envs,
                )
            )
            member.status = "running"

    def handle(self, report: Report) -> bool:
        """Take a member's report: its score, a crash, or Ctrl+C (returns True)."""
        member = self.board.members[report.member]
        if member.status == "removed":
            return False
        if report.interrupted:
            return True
        if report.error is not None:
            member.restarts += 1
            last_line = report.error.strip().splitlines()[-1]
            if member.restarts > self.config.max_restarts:
                member.status = "removed"
                member.reason = f"crashed {member.restarts} times"
                self.decide(
                    "remove",
                    member.id,
                    f"crashed {member.restarts} times (max_restarts = {self.config.max_restarts}); "
                    f"last error: {last_line}",
                    error=report.error,
                )
            else:
                member.status = "waiting"
                self.decide(
                    "restart",
                    member.id,
                    f"crashed ({last_line}); restart {member.restarts} of {self.config.max_restarts} "
                    "from its last "
                    "checkpoint",
                    error=report.error,
                )
            return False
        self.board.record(member.id, report.steps, report.score, report.checkpoint)
        member.pending = None
        finished = member.steps >= self.config.base.total_steps
        member.status = "finished" if finished else "waiting"
        self.say(
            f"{member.id}: score {_score(report.score)} at {member.steps:,} steps ({report.seconds:.1f} s)"
        )
        if self.config.strategy == "tournament" and not finished:
            self.select_tournament(member)
        return False

    # -- selection -------------------------------------------------------------------------------
    def rng(self) -> random.Random:
        return next_decision(self.config, self.board)

    def select_tournament(self, member: MemberRecord) -> None:
        scores = self.board.scores()
        if len(scores) < 2:
            return
        donor = tournament_donor(
            member.id, scores, self.config.replace_fraction, self.config.tournament_size, self.rng()
        )
        if donor is None:
            return
        rank = ranking(scores).index(member.id) + 1
        self.copy(
            member,
            self.board.members[donor],
            "exploit",
            f"score {_score(member.score)} ranks {rank} of {len(scores)}, in the bottom "
            f"{self.config.replace_fraction:.0%}",
        )

    def generation_target(self) -> int:
        return (self.board.generation + 1) * self.config.interval

    def generation_done(self) -> bool:
        live = self.board.live()
        target = min(self.generation_target(), self.config.base.total_steps)
        return (
            bool(live)
            and all(m.status == "waiting" and m.steps >= target for m in live)
            and (target < self.config.base.total_steps)
        )

    def select_generation(self) -> None:
        live = [m.id for m in self.board.live()]
        scores = self.board.scores(live)
        rng = self.rng()
        plan = (
            generational_plan(scores, self.config.replace_fraction, self.config.tournament_size, rng)
            if len(scores) >= 2
            else []
        )
        top, _ = split(scores, self.config.replace_fraction) if len(scores) >= 2 else ([], [])
        for replaced, donor in plan:
            self.copy(
                self.board.members[replaced],
                self.board.members[donor],
                "replace",
                f"generation {self.board.generation}: in the bottom {self.config.replace_fraction:.0%} "
                f"(top: {', '.join(top)})",
            )
        self.board.generation += 1
        self.decide(
            "generation", None, f"generation {self.board.generation} starts; {len(plan)} members replaced"
        )

    def copy(self, member: MemberRecord, donor: MemberRecord, kind: str, why: str) -> None:
        before = dict(member.hyperparameters)
        after = explore(donor.hyperparameters, self.config.mutations, self.rng())
        member.pending = {"donor": donor.checkpoint, "hyperparameters": after, "start_steps": None}
        self.board.copied(member.id, donor.id, kind, before, after)
        self.board.set_hyperparameters(member.id, after)
        self.decide(
            kind,
            member.id,
            f"{why}; copies {donor.id} (score {_score(donor.score)}) {mutated(after)}",
        )

    def decide(self, event: str, member: str | None, reason: str, **details: Any) -> None:
        _decide(self.board, self.say, event, member, reason, **details)

    # -- the end ---------------------------------------------------------------------------------
    def finish(self) -> PopulationResult:
        self.board.save()
        self.board.write_report()
        best = self.board.best()
        if best is None:
            raise PopulationFailed(self.board)
        exported = self.directory / "best"
        with replace_directory(exported) as directory:
            shutil.copytree(self.member_dir(best.id), directory, dirs_exist_ok=True)
        return _exported(self.board, best, exported, self.say)

    def member_dir(self, member: str) -> Path:
        """Absolute: the member's run directory and the checkpoints it reports are then paths that every
        process, Ray actor and node reaches, whatever its working directory."""
        return self.directory.resolve() / "members" / member

    def member_seed(self, index: int) -> int:
        return member_seed(self.config, index)

    def check_memory(self, members: int) -> None:
        """A ConfigError with the fix, before any member starts, where the replay buffers of the members
        this machine holds at once (the backend says how many, of ``members`` at most
        :attr:`capacity` at once) do not fit together in its memory. Each member's trainer checks its
        own buffer alone when it allocates it: enough on Ray's nodes, where nothing here knows where
        it lands, but not where several members share this machine."""
        together = self.backend.members_held_here(members, self.capacity)
        if together < 2:
            return
        memory = trainer_class(self.config.base.algo).replay_memory(self.config.base)
        if memory is not None:
            check_members_memory(memory, together, f"the {self.backend.name} backend")

    def too_small(self) -> str:
        r = self.config.resources
        cpus, gpus, memory = self.backend.seen_resources()
        given = f"cpus={r.cpus}, gpus={r.gpus}, memory_gb={r.memory_gb}, max_concurrent={r.max_concurrent}"
        return (
            f"the resources fit no member: one member needs {r.cpus_per_member} CPU(s), "
            f"{r.gpus_per_member} GPU(s) and {r.memory_per_member_gb} GB of memory, but the orchestrator was "
            f"given {given} and the {self.backend.name} backend sees {cpus:g} CPUs, {gpus:g} GPUs"
            f"{f', {memory:g} GB' if memory else ''}. Lower resources.cpus_per_member / gpus_per_member / "
            "memory_per_member_gb, or give more resources (resources.cpus / gpus / max_concurrent)."
        )


def check_members_memory(memory: ReplayMemory, members: int, where: str) -> None:
    """A ConfigError with the fix where ``members`` replay buffers of ``memory`` each, held at once on this
    machine (one per member), would not fit together; ``where`` says why they are held together."""
    needed = memory.needed * members
    available = available_when_short(needed, memory.device)
    if available is None:
        return
    budget = MEMORY_HEADROOM * available
    fewer = int(budget // memory.needed)  # members whose buffers fit at this buffer size
    at_most = (
        f"hold at most {fewer} member{'s' if fewer > 1 else ''} at once (--size {fewer}; on the process "
        f"backend, resources: {{max_concurrent: {fewer}}} in the population file does too), "
        if fewer >= 1
        else ""
    )
    raise ConfigError(
        f"the population's replay buffers do not fit on {memory.device}: {where} holds {members} members at "
        f"once on this machine, each with a replay buffer of its own of {memory.capacity:,} transitions "
        f"({memory.layout}, {memory.per_transition:,.0f} bytes each), {memory.needed:,} bytes "
        f"({memory.needed / 2**30:.2f} GiB) per member; together they need {needed / 2**30:.2f} GiB, but "
        f"only {available / 2**30:.2f} GiB is available ({needed:,} bytes needed, {available:,} available, "
        f"of which the replay buffers may take {MEMORY_HEADROOM:.0%}). Fix: lower --buffer-size to at most "
        f"{int(budget / members / memory.per_transition):,} transitions per member, {at_most}or train on a "
        "device with more memory."
    )


def member_seed(config: PopulationConfig, index: int) -> int:
    return config.base.seed + index * MEMBER_SEED_STRIDE


def next_decision(config: PopulationConfig, board: Leaderboard) -> random.Random:
    """The random draws of the next decision: the decision stream at the count of decisions so far,
    which the leaderboard keeps, so that a resumed population draws what it would have drawn."""
    board.selections += 1
    return population_random(config.base.seed, "decision", board.selections)


def _decide(
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


def _exported(
    board: Leaderboard, best: MemberRecord, exported: Path, say: Callable[[str], None]
) -> PopulationResult:
    """The result, after noting in the exported run directory which member it is (population.json)."""
    note = {"member": best.id, "score": best.score, "hyperparameters": best.hyperparameters}
    write_text_atomic(exported / "population.json", json.dumps(note, indent=1) + "\n")
    _decide(
        board, say, "best", best.id, f"the best final score, {_score(best.score)}; exported to {exported}"
    )
    return PopulationResult(board.directory, best.id, best.score, exported)


def _score(score: float | None) -> str:
    return "-" if score is None else f"{score:.2f}"


# -- vectorized ------------------------------------------------------------------------------------
class VectorizedRun:
    """A population as one vectorized run (the algorithm's: VectorizedPPO, VectorizedSAC, VectorizedTD3):
    every member trains an interval together, all are evaluated, then the same selection rules copy
    member slices (tournament: each member of the bottom fraction copies a tournament winner of the top;
    generational: the same plan). One process, one device; no orchestrator (nothing to schedule). Its
    checkpoint, in vectorized/, holds the engine and the leaderboard together, so a resume continues
    from a consistent pair."""

    def __init__(
        self,
        config: PopulationConfig,
        board: Leaderboard,
        say: Callable[[str], None] | None,
        resume: bool = False,
    ) -> None:
        self.config, self.board, self.say = config, board, say or (lambda message: None)
        self.members = list(board.members)  # member i of the engine is the i-th record
        self.engine = vectorized_population(config.base.algo)(
            config.base,
            [board.members[m].seed for m in self.members],
            [board.members[m].hyperparameters for m in self.members],
        )
        self.checkpoints = CheckpointManager(board.directory / "vectorized", keep=2)
        latest = self.checkpoints.latest() if resume else None
        if latest is not None:
            state = load_checkpoint(latest, map_location=self.engine.device)
            self.engine.load_state_dict(state["engine"])
            restored = Leaderboard.from_dict(board.directory, json.loads(state["leaderboard"]))
            self.board.members, self.board.lineage = restored.members, restored.lineage
            self.board.selections, self.board.generation = restored.selections, restored.generation
            self.board.save()
            self.decide("resume", None, f"resumed the vectorized population at {self.engine.steps:,} steps")

    def decide(self, event: str, member: str | None, reason: str) -> None:
        _decide(self.board, self.say, event, member, reason)

    def run(self) -> PopulationResult:
        config, board, engine = self.config, self.board, self.engine
        total = config.base.total_steps
        try:
            while engine.steps < total:
                engine.train(min(config.interval, total - engine.steps))
                scores = engine.evaluate(config.base.eval_episodes).tolist()
                for member, score in zip(self.members, scores, strict=True):
                    board.record(member, engine.steps, score, None)
                median = sorted(scores)[len(scores) // 2]
                self.say(f"{engine.steps:,} steps: best {max(scores):.2f}, median {median:.2f}")
                if engine.steps < total:
                    self.select()
                state = {"engine": engine.state_dict(), "leaderboard": json.dumps(board.to_dict())}
                self.checkpoints.save(engine.steps, state)
                board.save()
        except KeyboardInterrupt:
            self.decide(
                "interrupt", None, f"Ctrl+C at {engine.steps:,} steps; resume goes on from the last interval"
            )
            raise PopulationInterrupted(board.directory) from None
        finally:
            engine.close()
        for member in board.members.values():
            member.status = "finished"
        return self.finish()

    def select(self) -> None:
        board, config = self.board, self.config
        scores = board.scores(self.members)
        rng = next_decision(config, board)
        if config.strategy == "generational":
            plan = generational_plan(scores, config.replace_fraction, config.tournament_size, rng)
            kind, why = (
                "replace",
                f"generation {board.generation}: in the bottom {config.replace_fraction:.0%}",
            )
            board.generation += 1
        else:
            plan = [
                (member, donor)
                for member in self.members
                if (
                    donor := tournament_donor(
                        member, scores, config.replace_fraction, config.tournament_size, rng
                    )
                )
            ]
            kind, why = "exploit", f"in the bottom {config.replace_fraction:.0%}"
        for member, donor in plan:
            target, source = self.members.index(member), self.members.index(donor)
            after = explore(board.members[donor].hyperparameters, config.mutations, rng)
            before = dict(board.members[member].hyperparameters)
            self.engine.copy_member(source, target)
            self.engine.set_hyperparameters(target, after)
            board.copied(member, donor, kind, before, after)
            board.set_hyperparameters(member, after)
            self.decide(
                kind,
                member,
                f"score {_score(scores[member])} {why}; copies {donor} (score {_score(scores[donor])}) "
                f"{mutated(after)}",
            )

    def finish(self) -> PopulationResult:
        """The report, and the best member written as an ordinary run directory (best/)."""
        board = self.board
        board.save()
        board.write_report()
        best = board.best()
        exported = board.directory / "best"
        state = self.engine.member_agent_state(self.members.index(best.id))
        with replace_directory(exported) as directory:
            save_yaml(TrainConfig.from_dict(state["config"]), directory / "config.yaml")
            manager = CheckpointManager(directory)
            manager.save(self.engine.steps, state)
            manager.save_best(state)
        return _exported(board, best, exported, self.say)


# -- entry points ---------------------------------------------------------------------------------
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
    differences = population_differences(saved, config)
    if differences:
        raise ConfigError(
            f"--resume: the population in {str(directory)!r} has other settings than this command: "
            + "; ".join(f"{key}: the population has {a!r}, the command {b!r}" for key, a, b in differences)
            + ". Rerun the command it was started with, or choose another --dir for a new population."
        )
    return resume_population(directory, show_progress, total_steps=config.base.total_steps)


def mutated(hyperparameters: dict[str, Any]) -> str:
    """How a copy's decision ends: the mutated hyperparameters, or that a population without mutations
    copies weights alone."""
    if not hyperparameters:
        return "(its weights only: no --mutate, so every member keeps the base config's hyperparameters)"
    return f"and mutates to {format_hyperparameters(hyperparameters)}"


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
