"""The memory accounting of replay buffers, now :mod:`phalanx.buffers.memory`: this module re-exports it
for the importers that still name ``phalanx.buffer_memory``. Patch ``phalanx.buffers.memory`` (where
:func:`check_memory` looks its helpers up), not this module."""

from __future__ import annotations

from phalanx.buffers.memory import (
    MEMORY_HEADROOM,
    ReplayMemory,
    available_memory,
    available_when_short,
    check_memory,
    replay_layout,
    transition_bytes,
)

__all__ = [
    "MEMORY_HEADROOM",
    "ReplayMemory",
    "available_memory",
    "available_when_short",
    "check_memory",
    "replay_layout",
    "transition_bytes",
]
