"""Checkpoints: atomic writes, rotation, and loading with ``torch.load(weights_only=True)``.

Layout inside a run directory::

    checkpoints/step_<n>/state.pt   the last ``keep`` of them
    checkpoints/best/state.pt       the best evaluation so far
    checkpoints/latest              a text file naming the newest step_<n>

A checkpoint is a dict of tensors and primitives (so it loads without unpickling code) with a
``format`` marker that identifies it as phalanx's.

``state.pt`` is written whole or not at all (:mod:`phalanx.files`), so a checkpoint is complete when its
``state.pt`` exists. Whatever the moment a run is killed, the newest complete ``step_<n>`` is the one to
resume: :meth:`CheckpointManager.latest` finds it, skipping a ``step_<n>`` a kill left without its
``state.pt``, and the next save removes such leftovers. An older checkpoint is removed only after a
newer one is complete.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from phalanx.errors import CheckpointError
from phalanx.files import atomic_write, write_text_atomic

FORMAT = "phalanx-checkpoint-v1"
STATE = "state.pt"


def write_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """Write ``directory/state.pt`` atomically (the old one stays until the new one is whole)."""
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_write(directory / STATE, "wb") as file:
        torch.save({**state, "format": FORMAT}, file)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint file or directory (``state.pt`` inside), refusing foreign or broken files."""
    path = Path(path)
    if path.is_dir():
        path = path / STATE
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {str(path)!r}: the file does not exist.")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many types for a corrupt or foreign file
        raise CheckpointError(
            f"cannot read checkpoint {str(path)!r}: {type(error).__name__}: {str(error).splitlines()[0]}. "
            "It is truncated, corrupt, or not a phalanx checkpoint; use another one in checkpoints/."
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{str(path)!r} is not a phalanx checkpoint: expected format {FORMAT!r}, found {found!r}. "
            "Point to a checkpoint written by phalanx (runs/<run>/checkpoints/...)."
        )
    return state


class CheckpointManager:
    """Saves step checkpoints (keeping the last ``keep``) and the best one of a run directory."""

    def __init__(self, run_dir: str | Path, keep: int = 3) -> None:
        self.directory = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Checkpoint ``step``, then name it in ``latest`` and remove what is older than the last ``keep``
        complete checkpoints, and what a kill left half-written."""
        target = self.directory / f"step_{step}"
        write_checkpoint(target, state)
        write_text_atomic(self.directory / "latest", target.name + "\n")
        kept = self.step_directories()[-self.keep :]
        for path in self.directory.iterdir():
            stale = path.name.startswith("step_") and path not in kept  # older, or half-written
            if path.is_dir() and (stale or path.suffix in (".tmp", ".old")):  # earlier versions' swaps
                shutil.rmtree(path, ignore_errors=True)
        return target

    def save_best(self, state: dict[str, Any]) -> Path:
        target = self.directory / "best"
        write_checkpoint(target, state)
        return target

    def step_directories(self) -> list[Path]:
        """The complete ``step_<n>`` checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.glob("step_*") if p.name[5:].isdigit() and (p / STATE).is_file()]
        return sorted(found, key=lambda p: int(p.name[5:]))

    def latest(self) -> Path | None:
        """The newest complete step checkpoint (``latest`` names it too, once it is complete)."""
        steps = self.step_directories()
        return steps[-1] if steps else None

    def best(self) -> Path | None:
        candidate = self.directory / "best"
        return candidate if (candidate / STATE).is_file() else None
