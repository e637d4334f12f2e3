"""Starting a data-parallel group of learners (:mod:`phalanx.train.learner`), in two ways:

- :func:`launch_learners`: phalanx spawns the N processes on this machine (``--learners N``);
- ``torchrun``, on one machine or several: every process runs ``phalanx train ...`` with ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ... set; :func:`join_launched_group` joins that group.

A learner that fails takes the group down, never into a hang: the launcher stops the others as soon
as one process exits with an error and reports that learner's traceback; a learner that stops
answering makes the others' next collective fail after ``learner_timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from phalanx.compiling import stop_compile_workers
from phalanx.errors import ConfigError, PhalanxError
from phalanx.train.interrupts import (
    deferred_interrupts,
    interrupts_blocked,
    received_signal,
    request_stop_on_interrupt,
    unblock_interrupts,
)
from phalanx.train.learner import LearnerGroup

LAUNCH_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""Set by torchrun (and torch.distributed.launch) in every process it starts."""


class LearnerError(PhalanxError):
    """A learner of a data-parallel group failed (or stopped answering); the group was taken down."""


def launched_by_torchrun() -> bool:
    """Whether this process was started by torchrun (or another launcher that sets RANK, WORLD_SIZE ...)."""
    return all(name in os.environ for name in LAUNCH_ENV_VARS)


def available_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_learners(num_learners: int, device: str) -> None:
    """Bad input: more learners on this machine than it has CPU cores (CPU) or GPUs (CUDA)."""
    if num_learners <= 1:
        return
    kind = torch.device(device).type
    if kind == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if num_learners > available:
            raise ConfigError(
                f"num_learners = {num_learners} asks for one GPU per learner, but this machine has "
                f"{available} CUDA device(s). Use --learners {max(available, 1)} or fewer here, or start "
                "the learners across machines with torchrun (docs/parallelism.md)."
            )
    elif kind == "cpu":
        cores = available_cores()
        if num_learners > cores:
            raise ConfigError(
                f"num_learners = {num_learners} asks for one CPU core per learner process, but this process "
                f"may use {cores} core(s). Use --learners {cores} or fewer here, or start the learners "
                "across machines with torchrun (docs/parallelism.md)."
            )
    else:
        raise ConfigError(
            f"num_learners = {num_learners} needs device 'cpu' (gloo) or 'cuda' (NCCL), got {device!r}. "
            "Use --learners 1 on this device."
        )


def _catch_interrupts() -> threading.Event:
    """From now on Ctrl+C (SIGINT) sets the returned event instead of raising KeyboardInterrupt: the
    learners stop together, at the iteration where they agree on it. Every SIGINT only sets it (a
    terminal's Ctrl+C reaches a learner twice: directly, and forwarded by the launcher); the launcher
    is the one that kills the learners on a second Ctrl+C."""
    interrupted = threading.Event()
    request_stop_on_interrupt(interrupted, insist=False)
    unblock_interrupts()  # a learner starts with SIGINT held back (launch_learners): from here it is safe
    return interrupted


def _backend(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _learner_device(device: str, local_rank: int) -> torch.device:
    """CUDA: learner ``local_rank`` of a machine takes GPU ``local_rank``; CPU: the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def join_launched_group(device: str, timeout: float) -> LearnerGroup:
    """Join the group torchrun started (the ``env://`` rendezvous of RANK, WORLD_SIZE, MASTER_ADDR ...)."""
    interrupted = _catch_interrupts()
    local_rank = int(os.environ["LOCAL_RANK"])
    group_device = _learner_device(device, local_rank)
    dist.init_process_group(_backend(device), init_method="env://", timeout=dt.timedelta(seconds=timeout))
    return LearnerGroup(dist.get_rank(), dist.get_world_size(), local_rank, group_device, interrupted)


@dataclass
class LearnerOutcome:
    """What learner 0 reported at the end: ``kind`` is "finished" or "interrupted"; ``value`` its data."""

    kind: str
    value: Any


class _Reports:
    """The learners' messages as they arrive: their errors, and learner 0's outcome."""

    def __init__(self, messages: Any, on_report: Callable[[str, Any], None] | None) -> None:
        self.messages = messages
        self.on_report = on_report
        self.outcome: LearnerOutcome | None = None
        self.errors: list[tuple[int, str, str]] = []

    def receive(self, block_s: float) -> None:
        """Take the learners' messages, waiting up to ``block_s`` for the first."""
        timeout_s: float | None = block_s
        while True:
            try:
                kind, rank, value = (
                    self.messages.get(timeout=timeout_s) if timeout_s else self.messages.get_nowait()
                )
            except queue.Empty:
                return
            timeout_s = None
            value = pickle.loads(value)
            if kind == "error":
                self.errors.append((rank, *value))
                continue
            if rank == 0 and kind in ("finished", "interrupted"):
                self.outcome = LearnerOutcome(kind, value)
            if self.on_report is not None:
                self.on_report(kind, value)


def launch_learners(
    entry: Callable[[LearnerGroup, Any, Callable[[str, Any], None]], None],
    payload: Any,
    num_learners: int,
    device: str,
    timeout: float,
    on_report: Callable[[str, Any], None] | None = None,
) -> LearnerOutcome:
    """Run ``entry(group, payload, report)`` in ``num_learners`` new processes joined in one group.

    ``entry`` must be importable (a module-level function) and ``payload`` picklable: the processes
    are spawned, not forked. ``report(kind, value)`` sends a message to this process; ``on_report``
    sees each one as it arrives, and learner 0's last "finished" or "interrupted" report is returned.
    Ctrl+C here is passed on to the learners, which stop together at their next step and save; a
    second Ctrl+C kills them. A learner that fails stops the others, and :class:`LearnerError` names
    it, with its traceback.
    """
    check_learners(num_learners, device)
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    # The learners watch the read end of this pipe: when this process is gone, so are they.
    watched, kept = context.Pipe(duplex=False)
    port = _free_port()
    processes = [
        context.Process(
            target=_learner_process,
            args=(entry, payload, rank, num_learners, port, device, timeout, messages, watched),
            name=f"phalanx-learner-{rank}",
        )
        for rank in range(num_learners)
    ]
    reports = _Reports(messages, on_report)
    try:
        _supervise(processes, watched, reports, timeout)
    finally:
        for process in processes:
            if process.exitcode is None and process.pid is not None:
                process.kill()
            if process.pid is not None:
                process.join()
        kept.close()
        messages.close()
    if reports.outcome is None:
        raise LearnerError("learner 0 ended without reporting its result (a bug in phalanx).")
    return reports.outcome


def _supervise(processes: list[Any], watched: Any, reports: _Reports, timeout: float) -> None:
    """Start the learners and take their reports until they all exit; stop them all when one fails.

    Ctrl+C here is a request too, whenever it comes (a second one kills the learners, in the caller's
    ``finally``). The learners start with SIGINT held back: one that came before a learner installed its
    handler would kill it while the others wait for it in a collective until the timeout.
    """
    interrupted, forwarded = threading.Event(), False
    with deferred_interrupts(interrupted):
        with interrupts_blocked():
            for process in processes:
                process.start()
        watched.close()
        while True:
            reports.receive(0.2)
            if interrupted.is_set() and not forwarded:
                _forward_interrupt(processes)
                forwarded = True
            if reports.errors or any(p.exitcode not in (None, 0) for p in processes):
                _give_others_time(processes, reports.receive)
                raise _failure(processes, reports.errors, timeout)
            if all(p.exitcode == 0 for p in processes):
                reports.receive(0)
                break
    if forwarded and reports.outcome is None:
        raise KeyboardInterrupt


def _forward_interrupt(processes: list[Any]) -> None:
    """Ctrl+C or SIGTERM: every learner is asked to stop with the same signal (they agree on a step, save
    and exit)."""
    stop = signal.Signals[received_signal() or "SIGINT"]
    for process in processes:
        if process.exitcode is None and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, stop)


def _give_others_time(processes: list[Any], receive: Callable[[float], None], grace_s: float = 5.0) -> None:
    """After one learner failed, the others usually fail at their next collective: let them report."""
    deadline = time.monotonic() + grace_s
    while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
        receive(0.1)


def _failure(processes: list[Any], errors: list[tuple[int, str, str]], timeout: float) -> LearnerError:
    world = len(processes)
    silent = [rank for rank, p in enumerate(processes) if p.exitcode is None]
    if errors:
        rank, summary, trace = errors[0]
        lines = [f"learner {rank} of {world} failed: {summary}"]
        if silent and _is_timeout(summary):  # the silent ones never reached the collective
            lines.append(
                f"learner(s) {silent} were still running but stopped answering the group for "
                f"learner_timeout = {timeout:g} s; they were stopped."
            )
        others = [f"learner {r}: {s.splitlines()[0] if s else ''}" for r, s, _ in errors[1:]]
        if others:
            lines.append("the others then stopped too (" + "; ".join(others) + ")")
        if trace:
            lines.append(f"--- learner {rank} traceback ---\n{trace.rstrip()}")
        return LearnerError("\n".join(lines))
    dead = [(rank, p.exitcode) for rank, p in enumerate(processes) if p.exitcode not in (None, 0)]
    rank, code = dead[0]
    return LearnerError(
        f"learner {rank} of {world} exited with code {code} without reporting an error (killed, or out "
        "of memory?); the group was stopped. The checkpoints saved so far are in the run directory."
    )


def _is_timeout(summary: str) -> bool:
    lowered = summary.lower()
    return "timed out" in lowered or "timeout" in lowered


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _learner_process(
    entry: Callable[[LearnerGroup, Any, Callable[[str, Any], None]], None],
    payload: Any,
    rank: int,
    world_size: int,
    port: int,
    device: str,
    timeout: float,
    messages: Any,
    watched: Any,
) -> None:
    """One spawned learner: join the group, run ``entry``, report an error with its traceback."""
    interrupted = _catch_interrupts()
    threading.Thread(target=exit_when_closed, args=(watched,), daemon=True).start()

    def report(kind: str, value: Any) -> None:
        # Pickled here: a queue would share tensors through file descriptors that die with this process.
        messages.put((kind, rank, pickle.dumps(value)))

    group: LearnerGroup | None = None
    try:
        group_device = _learner_device(device, rank)
        dist.init_process_group(
            _backend(device),
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=dt.timedelta(seconds=timeout),
        )
        group = LearnerGroup(rank, world_size, rank, group_device, interrupted)
        entry(group, payload, report)
        group.close(finished=True)
    except BaseException as error:  # noqa: BLE001 - reported to the launching process
        # A user's error (bad input) is its message; anything else, a bug, keeps its traceback.
        trace = "" if isinstance(error, PhalanxError) else traceback.format_exc()
        report("error", (f"{type(error).__name__}: {error}", trace))
        _exit(messages, 1)
    _exit(messages, 0)


def _exit(messages: Any, code: int) -> None:
    """Flush the reports, then end the process without the interpreter's teardown, where the threads
    of torch.distributed's backends can abort the process (and turn a finished run into a failure)."""
    stop_compile_workers()
    messages.close()
    messages.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_when_closed(watched: Any) -> None:
    """Block on the launcher's end of a pipe; when the launcher is gone (EOF), end this process too, even
    in the middle of training (run it in a daemon thread of a child process)."""
    with contextlib.suppress(EOFError, OSError):
        watched.recv()
    os._exit(1)
