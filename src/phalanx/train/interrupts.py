"""Ctrl+C and SIGTERM as requests to stop at a safe point, not exceptions wherever the program happens to be.

SIGTERM is what ``kill``, ``timeout``, Slurm's preemption, ``docker stop`` and a Kubernetes eviction send
(then SIGKILL after a grace period), so it gets exactly what Ctrl+C (SIGINT) gets: these are the *stop
signals*. Python's own SIGINT handler raises KeyboardInterrupt in the main thread at whatever line it
runs: in the middle of an optimiser step, between freezing a critic and unfreezing it, halfway through a
rollout's counters; SIGTERM's default ends the process with nothing saved. So the training loop, the
launcher of a learner group and a population's members take a stop signal as a request:
:func:`deferred_interrupts` turns it into an event, which the loop reads at its safe point (between
iterations: every update whole, every counter in step with the state); there it saves a checkpoint and
stops. Outside those places a command's process raises KeyboardInterrupt on either signal
(:func:`stop_signals_interrupt`), so every ``except KeyboardInterrupt`` that tidies up serves both.

A second stop signal while the first is still pending means the user insists (an env that hangs, a save
that takes too long): it raises :class:`Insisted` (a KeyboardInterrupt) at once, and nothing is saved from
a state that may be half-updated; the run's latest checkpoint is the one to resume from. A process whose
parent supervises it (a learner, a population member) does not insist: the parent forwards the request,
and it is the parent that ends its children on a second one.

A signal this process inherited as ignored stays ignored: a background job of a non-interactive shell
ignores SIGINT so that a Ctrl+C meant for the script's foreground does not reach it; such a run stops on
SIGTERM (``kill PID``).
"""

from __future__ import annotations

import contextlib
import multiprocessing.resource_tracker
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Insisted(KeyboardInterrupt):
    """A second stop signal before the first one reached a safe point: stop at once, save nothing."""


class _Received:
    """This process's stop signals: the last one received, and whether a supervisor insists for it."""

    last: signal.Signals | None = None
    supervised = False


def received_signal() -> str | None:
    """The name of the last stop signal this process received ("SIGINT", "SIGTERM"), or None."""
    return _Received.last.name if _Received.last is not None else None


def stop_cause() -> str:
    """What asked this process to stop, as a log line names it: "SIGTERM", or "Ctrl+C" (SIGINT, or a
    stop requested without a signal)."""
    name = received_signal()
    return "Ctrl+C" if name in (None, "SIGINT") else name


def exit_code() -> int:
    """The exit code of a command a stop signal ended: 128 + the signal's number (130 for Ctrl+C, 143
    for SIGTERM), as a shell reports a process the signal killed."""
    return 128 + int(_Received.last or signal.SIGINT)


def supervised() -> None:
    """This process is supervised (a learner, a population member): a second stop signal does not insist;
    its supervisor forwards requests and ends it if it must."""
    _Received.supervised = True


def _install(handler: Callable[[int, Any], None]) -> dict[int, Any] | None:
    """``handler`` for every stop signal that is not ignored; the handlers it replaced (None: outside the
    main thread, where signals never arrive, nothing is installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous: dict[int, Any] = {}
    for stop in STOP_SIGNALS:
        before = signal.getsignal(stop)
        if before == signal.SIG_IGN:
            continue
        signal.signal(stop, handler)
        previous[stop] = before if before is not None else signal.SIG_DFL
    return previous


def request_stop_on_interrupt(
    requested: threading.Event, insist: bool | None = None
) -> dict[int, Any] | None:
    """From now on a stop signal sets ``requested``; with ``insist`` (default: unless :func:`supervised`),
    a second one raises :class:`Insisted`. Returns the handlers it replaced (see :func:`_install`)."""
    insist = not _Received.supervised if insist is None else insist
    received = 0

    def handler(signum: int, frame: object) -> None:
        nonlocal received
        received += 1
        _Received.last = signal.Signals(signum)
        if insist and received > 1:
            raise Insisted
        requested.set()

    return _install(handler)


def stop_signals_interrupt() -> None:
    """From now on a stop signal raises KeyboardInterrupt, SIGTERM as Ctrl+C does (a command's process,
    outside the training loop's deferred section)."""

    def handler(signum: int, frame: object) -> None:
        _Received.last = signal.Signals(signum)
        raise KeyboardInterrupt

    _install(handler)


def _restore(previous: dict[int, Any] | None) -> None:
    for stop, handler in (previous or {}).items():
        signal.signal(stop, handler)


@contextlib.contextmanager
def deferred_interrupts(requested: threading.Event) -> Iterator[None]:
    """While inside, a stop signal sets ``requested`` (a second one raises :class:`Insisted`); the handlers
    that were there before come back at the end. :func:`received_signal` names the signals received
    from here on."""
    _Received.last = None
    previous = request_stop_on_interrupt(requested)
    try:
        yield
    finally:
        _restore(previous)


@contextlib.contextmanager
def interrupts_blocked() -> Iterator[None]:
    """The stop signals held back (pending, not lost) in this thread while inside. A process started inside
    inherits the block: it receives one only once it unblocks them, after installing its own handler
    (:func:`unblock_interrupts`), never while it is still starting up."""
    # multiprocessing's resource tracker unblocks SIGINT in the thread that starts it: started first
    multiprocessing.resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def unblock_interrupts() -> None:
    """Receive the stop signals in this thread again, one held back meanwhile included."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))
