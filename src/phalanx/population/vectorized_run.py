"""A population as one vectorized run (``--backend vectorized``): P members of one algorithm trained
together in one process, evaluated after every interval and evolved by the same selection rules as the
members the orchestrator runs; the engine is the algorithm's :class:`~phalanx.population.vectorized_base.
VectorizedPopulation`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from phalanx.compiling import should_compile
from phalanx.config import TrainConfig, save_yaml
from phalanx.files import replace_directory
from phalanx.population.evolution import PopulationConfig, explore, generational_plan, tournament_donor
from phalanx.population.leaderboard import Leaderboard, format_score
from phalanx.population.outcome import (
    PopulationInterrupted,
    PopulationResult,
    exported_result,
    log_decision,
    mutated,
    next_decision,
)
from phalanx.registry import vectorized_population
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.interrupts import stop_cause


class VectorizedRun:
    """A population as one vectorized run (the algorithm's: VectorizedPPO, VectorizedPQN, VectorizedSAC,
    VectorizedTD3): every member trains an interval together, all are evaluated, then the same selection
    rules copy member slices (tournament: each member of the bottom fraction copies a tournament winner of
    the top; generational: the same plan). One process, one device; no orchestrator (nothing to schedule). Its
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
        if should_compile(config.base.compile, self.engine.device):  # None (auto) stays eager here
            compiled = self.engine.compile()
            self.decide("compile", None, f"compiled the members' {', '.join(compiled) or 'nothing'}")
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
        log_decision(self.board, self.say, event, member, reason)

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
                "interrupt",
                None,
                f"{stop_cause()} at {engine.steps:,} steps; resume goes on from the last interval",
            )
            raise PopulationInterrupted(board.directory) from None
        finally:
            engine.close()
        for record in board.members.values():
            record.status = "finished"
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
                f"score {format_score(scores[member])} {why}; copies {donor} "
                f"(score {format_score(scores[donor])}) {mutated(after)}",
            )

    def finish(self) -> PopulationResult:
        """The report, and the best member written as an ordinary run directory (best/)."""
        board = self.board
        board.save()
        board.write_report()
        best = board.best()
        assert best is not None, "a vectorized population's members all train to the end"
        exported = board.directory / "best"
        state = self.engine.member_agent_state(self.members.index(best.id))
        with replace_directory(exported) as directory:
            save_yaml(TrainConfig.from_dict(state["config"]), directory / "config.yaml")
            manager = CheckpointManager(directory)
            manager.save(self.engine.steps, state)
            manager.save_best(state)
        return exported_result(board, best, exported, self.say)
