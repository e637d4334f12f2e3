"""Population-based training: members evolve by tournament or generations, run by an orchestrator on
a backend (serial, process, ray) or as one vectorized run (see docs/population.md)."""

from phalanx.population.evolution import Mutation, PopulationConfig, Resources
from phalanx.population.leaderboard import Leaderboard
from phalanx.population.orchestrator import (
    PopulationFailed,
    PopulationInterrupted,
    PopulationResult,
    resume_population,
    run_population,
)

__all__ = [
    "Leaderboard",
    "Mutation",
    "PopulationConfig",
    "PopulationFailed",
    "PopulationInterrupted",
    "PopulationResult",
    "Resources",
    "resume_population",
    "run_population",
]
