"""Shared test settings."""

import contextlib
import os
import signal

import pytest
import torch

# One intra-op thread: on a loaded 2-core machine torch's OpenMP threads spin against each other and
# small batched steps can run tens of times slower; tests measure behaviour, not speed.
torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")

# A suite started in the background of a non-interactive shell (`make test &`, `nohup make test &` in a
# script) inherits SIGINT ignored, and every run it starts would too (ignoring is inherited across exec):
# the tests that press Ctrl+C on a run would then test nothing. Give the suite a terminal's default; the
# tests of an inherited-ignored SIGINT set it up themselves.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def descendants(root: int) -> list[int]:
    """Every process whose chain of parents reaches ``root`` (Linux /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def pytest_sessionfinish(session, exitstatus):
    """A test that fails while a run it started is still going (a stop signal that did not land) leaves
    that process training after the suite; end every process the suite started and left behind."""
    if not os.path.isdir("/proc"):
        return
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def interrupt_update(monkeypatch):
    """``interrupt_update(trainer, n)``: the trainer's n-th learner update raises KeyboardInterrupt, as
    Ctrl+C during training would."""

    def arm(trainer, n: int) -> None:
        original, calls = trainer.learner.update, {"n": 0}

        def update(progress):
            calls["n"] += 1
            if calls["n"] == n:
                raise KeyboardInterrupt
            return original(progress)

        monkeypatch.setattr(trainer.learner, "update", update)

    return arm
