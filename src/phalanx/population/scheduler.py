"""The orchestrator: runs the members of a population on a backend, as many at once as the resources fit,
and selects among them as their reports come in.

It runs as many members at once as fit (``Resources.slots`` of what the backend sees, at most
``max_concurrent``) and queues the rest, the members with the fewest steps first. When the resources
shrink (a Ray node leaves, or ``phalanx population scale DIR --max-concurrent N`` lowers the limit while
it runs) it ends the weakest members; when they grow it spawns members from the strongest. Every
decision goes to ``decisions.jsonl`` with its reason, and the leaderboard is saved after each report,
so that ``phalanx population resume DIR`` goes on from there after the orchestrator is killed.
(:mod:`phalanx.population.orchestrator` starts and resumes it.)
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.buffers.memory import MEMORY_HEADROOM, ReplayMemory, available_when_short
from phalanx.errors import ConfigError
from phalanx.files import replace_directory
from phalanx.population.backends import Report, Task
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
from phalanx.population.leaderboard import Leaderboard, MemberRecord, format_hyperparameters, format_score
from phalanx.population.outcome import (
    PopulationFailed,
    PopulationInterrupted,
    PopulationResult,
    exported_result,
    log_decision,
    member_seed,
    mutated,
    next_decision,
)
from phalanx.registry import trainer_class
from phalanx.train.environments import picklable_factory
from phalanx.train.interrupts import stop_cause


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
                    f"live member (score {format_score(member.score)})",
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
            f"{reason}; copies the strongest, {parent.id} (score {format_score(parent.score)}), "
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
            self.decide(
                "interrupt", None, f"{stop_cause()}: members saved checkpoints; resume goes on from them"
            )
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
            f"{member.id}: score {format_score(report.score)} at {member.steps:,} steps "
            f"({report.seconds:.1f} s)"
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
            f"score {format_score(member.score)} ranks {rank} of {len(scores)}, in the bottom "
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
            f"{why}; copies {donor.id} (score {format_score(donor.score)}) {mutated(after)}",
        )

    def decide(self, event: str, member: str | None, reason: str, **details: Any) -> None:
        log_decision(self.board, self.say, event, member, reason, **details)

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
        return exported_result(self.board, best, exported, self.say)

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
