"""Checkpoints: atomic writes, rotation, and loading with ``torch.load(weights_only=True)``.

Layout inside a run directory::

    checkpoints/step_<n>/state.pt   the last ``keep`` of them
    checkpoints/best/state.pt       the best evaluation so far
    checkpoints/latest              a text file naming the newest step_<n>

A checkpoint is a dict of tensors and primitives (so it loads without unpickling code) with a
``format`` marker that identifies it as phalanx's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from phalanx.errors import CheckpointError

FORMAT = "phalanx-checkpoint-v1"


def write_atomic(directory: Path, state: dict[str, Any]) -> None:
    """Write ``directory/state.pt``: into a temporary directory first, then rename it into place."""
    directory = Path(directory)
    temporary = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    torch.save({**state, "format": FORMAT}, temporary / "state.pt")
    if directory.exists():
        old = directory.with_name(directory.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
        os.replace(temporary, directory)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(temporary, directory)


def write_text_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint file or directory (``state.pt`` inside), refusing foreign or broken files."""
    path = Path(path)
    if path.is_dir():
        path = path / "state.pt"
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
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / f"step_{step}"
        write_atomic(target, state)
        write_text_atomic(self.directory / "latest", target.name + "\n")
        for old in self.step_directories()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def save_best(self, state: dict[str, Any]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / "best"
        write_atomic(target, state)
        return target

    def step_directories(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
        return sorted(found, key=lambda p: int(p.name[5:]))

    def latest(self) -> Path | None:
        marker = self.directory / "latest"
        if marker.is_file():
            candidate = self.directory / marker.read_text().strip()
            if (candidate / "state.pt").is_file():
                return candidate
        steps = self.step_directories()
        return steps[-1] if steps else None

    def best(self) -> Path | None:
        candidate = self.directory / "best"
        return candidate if (candidate / "state.pt").is_file() else None
