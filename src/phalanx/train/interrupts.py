"""Ctrl+C as a request to stop at a safe point, not an exception wherever the program happens to be.

Python's own SIGINT handler raises KeyboardInterrupt in the main thread at whatever line it runs: in
the middle of an optimiser step, between freezing a critic and unfreezing it, halfway through a
rollout's counters. Whatever then saves the run saves (or worse, goes on updating) a half-updated
algorithm. So the training loop, the launcher of a learner group and a population's members take
SIGINT as a request instead: :func:`deferred_interrupts` turns it into an event, which the loop reads
at its safe point (between iterations: every update whole, every counter in step with the state);
there it saves a checkpoint and stops.

A second Ctrl+C while the first is still pending means the user insists (an env that hangs, a save
that takes too long): it raises :class:`Insisted` (a KeyboardInterrupt) at once, and nothing is saved
from a state that may be half-updated; the run's latest checkpoint is the one to resume from.
"""

from __future__ import annotations

import contextlib
import multiprocessing.resource_tracker
import signal
import threading
from collections.abc import Iterator


class Insisted(KeyboardInterrupt):
    """A second Ctrl+C before the first one reached a safe point: stop at once, save nothing."""


def request_stop_on_interrupt(requested: threading.Event, insist: bool = True) -> object | None:
    """From now on SIGINT sets ``requested``; with ``insist``, a second SIGINT raises :class:`Insisted`.

    Returns the handler it replaced, or None where it installs nothing: outside the main thread (signals
    reach the main thread only) and where SIGINT is ignored (a background job of a shell), which stays so.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        return None
    received = 0

    def handler(signum: int, frame: object) -> None:
        nonlocal received
        received += 1
        if insist and received > 1:
            raise Insisted
        requested.set()

    signal.signal(signal.SIGINT, handler)
    return previous if previous is not None else signal.SIG_DFL


@contextlib.contextmanager
def deferred_interrupts(requested: threading.Event) -> Iterator[None]:
    """While inside, Ctrl+C sets ``requested`` (a second one raises :class:`Insisted`); the handler that
    was there before comes back at the end."""
    previous = request_stop_on_interrupt(requested)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def interrupts_blocked() -> Iterator[None]:
    """SIGINT held back (pending, not lost) in this thread while inside. A process started inside inherits
    the block: it receives a Ctrl+C only once it unblocks SIGINT, after installing its own handler
    (:func:`unblock_interrupts`), never while it is still starting up."""
    # multiprocessing's resource tracker unblocks SIGINT in the thread that starts it: started first
    multiprocessing.resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def unblock_interrupts() -> None:
    """Receive SIGINT in this thread again, a Ctrl+C held back meanwhile included."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
