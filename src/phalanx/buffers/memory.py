"""Device memory of replay buffers: what a buffer of a given shape takes, what the device has free, and a
ConfigError that says what to lower before a buffer that would not fit is allocated. The single- and
multi-agent replays and a population's shared buffer all check through :func:`check_memory`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from phalanx.errors import ConfigError


def available_memory(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes (None if unknown)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as file:
                for line in file:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def transition_bytes(action_shape: tuple, action_dtype: torch.dtype) -> int:
    """Bytes of a stored transition besides its observations: the action, the reward, two flags."""
    return action_dtype.itemsize * math.prod(action_shape) + 4 + 1 + 1


def replay_layout(obs_shape: tuple, action_shape: tuple) -> str:
    """What a transition of a single-agent replay holds, as a memory error names it."""
    return f"obs {obs_shape}, actions {action_shape}"


@dataclass(frozen=True)
class ReplayMemory:
    """What a replay buffer takes: ``needed`` bytes of ``device``'s memory for ``capacity`` transitions,
    each holding ``layout`` (as a memory error names it)."""

    needed: int
    capacity: int
    layout: str
    device: torch.device

    @property
    def per_transition(self) -> float:
        return self.needed / self.capacity


MEMORY_HEADROOM = 0.9
"""A replay buffer may take at most this fraction of the memory available when it is allocated: the rest
is left for the networks, the envs and the other processes."""


def available_when_short(needed: int, device: torch.device) -> int | None:
    """The bytes available on ``device`` now (RAM on the CPU, free device memory on CUDA) where ``needed``
    bytes exceed :data:`MEMORY_HEADROOM` of them; None where they fit (or the memory is unknown)."""
    available = available_memory(device)
    if available is None or needed <= MEMORY_HEADROOM * available:
        return None
    return available


def check_memory(memory: ReplayMemory, members: int = 1) -> None:
    """A ConfigError with the fix where a replay buffer of ``memory`` would not fit on its device,
    checked before allocating it. ``members``: a population's members share the buffer,
    ``capacity / members`` transitions each."""
    needed, capacity, device = memory.needed, memory.capacity, memory.device
    available = available_when_short(needed, device)
    if available is None:
        return
    per_transition = memory.per_transition
    fits = int(MEMORY_HEADROOM * available / per_transition)
    if members > 1:
        what = f"{members} members x {capacity // members:,} transitions"
        fix = (
            f"lower --buffer-size to at most {fits // members:,} transitions per member, or use fewer "
            f"members (at most {max(fits // max(capacity // members, 1), 0):,} at this buffer size)"
        )
    else:
        what = f"{capacity:,} transitions"
        fix = f"lower --buffer-size to at most {fits:,} transitions"
    raise ConfigError(
        f"a replay buffer of {what} ({memory.layout}, {per_transition:,.0f} bytes each) needs "
        f"{needed / 2**30:.2f} GiB on {device}, but only {available / 2**30:.2f} GiB is available "
        f"({needed:,} bytes needed, {available:,} available, of which a replay buffer may take "
        f"{MEMORY_HEADROOM:.0%}). Fix: {fix}, or train on a device with more memory."
    )
