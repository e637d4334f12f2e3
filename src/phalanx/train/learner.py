"""Learner: owns the algorithm and its training data, and turns data into updates; several learners
share the work of one agent as a data-parallel group.

With ``num_learners = N > 1`` there are N processes in a ``torch.distributed`` group (gloo on CPU, NCCL
on CUDA). Each runs the whole training loop on its own env shard and buffer; every optimiser step
first averages the gradients over the group (:meth:`LearnerGroup.average`, one all-reduce of the
flattened gradients), so every learner applies the same step to the same parameters and they stay
identical, bit for bit. Learner 0 (rank 0) evaluates, logs and checkpoints; the others send it their
share of a checkpoint.

Two ways to start a group:

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

from phalanx.algos.base import Algorithm
from phalanx.buffers import ReplayBuffer, RolloutBuffer
from phalanx.envs.wrappers import RunningMeanStd
from phalanx.errors import ConfigError, PhalanxError
from phalanx.train.interrupts import (
    deferred_interrupts,
    interrupts_blocked,
    request_stop_on_interrupt,
    unblock_interrupts,
)

LAUNCH_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""Set by torchrun (and torch.distributed.launch) in every process it starts."""


class LearnerError(PhalanxError):
    """A learner of a data-parallel group failed (or stopped answering); the group was taken down."""


class Learner:
    """One learner on one device.

    On-policy, ``update`` learns from the rollout the worker just wrote into ``buffer``; off-policy,
    each ``update`` samples a batch from the replay buffer. In a group, the algorithm's ``group`` is
    set and its optimiser steps average the gradients over the learners.
    """

    def __init__(self, algorithm: Algorithm, buffer: RolloutBuffer | ReplayBuffer) -> None:
        self.algorithm = algorithm
        self.buffer = buffer
        self.updates = 0

    def update(self, progress: float) -> dict[str, torch.Tensor]:
        if not self.algorithm.on_policy:  # a replay buffer (single- or multi-agent)
            config = self.algorithm.config
            batch = self.buffer.sample(config.batch_size, config.gamma, config.n_step)
            metrics = self.algorithm.update(batch, progress)
        else:
            metrics = self.algorithm.update(self.buffer, progress)
        self.updates += 1
        return metrics


# -- the group ------------------------------------------------------------------------------------
class LearnerGroup:
    """This process's place in a data-parallel group of learners (the process group is already up).

    Tensor collectives run on the group's backend (gloo: CPU tensors, NCCL: CUDA tensors); the
    collectives of Python objects (checkpoint shards, the run directory) on a gloo group beside it.
    """

    def __init__(
        self, rank: int, world_size: int, local_rank: int, device: torch.device, interrupted: threading.Event
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = device
        self.objects = dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else None
        self.interrupted = interrupted  # set by SIGINT; acted on when every learner agrees

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its mean over the learners: one all-reduce per dtype."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():
            flat = torch.cat([tensor.reshape(-1) for tensor in group])
            dist.all_reduce(flat)
            flat /= self.world_size
            views = [
                chunk.view_as(t)
                for chunk, t in zip(flat.split([t.numel() for t in group]), group, strict=True)
            ]
            torch._foreach_copy_(group, views)

    def maximum(self, value: int) -> int:
        """The largest of the learners' ``value``, on every learner."""
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def broadcast(self, obj: Any) -> Any:
        """Learner 0's ``obj``, on every learner."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.objects)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every learner's ``obj``, in rank order, on learner 0 (None elsewhere)."""
        gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0, group=self.objects)
        return gathered

    def scatter(self, objs: list[Any] | None) -> Any:
        """Learner 0 passes one object per learner (``objs[rank]``); each learner gets its own."""
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs if self.is_main else None, src=0, group=self.objects)
        return box[0]

    def close(self, finished: bool = False) -> None:
        """Leave the group; ``finished``: after a barrier, so that no learner tears its connections down
        while another still receives from it (gloo can abort the process then)."""
        if not dist.is_initialized():
            return
        if finished:
            dist.barrier()
        dist.destroy_process_group()


class StatisticsSync:
    """Keeps running statistics (observation normalisation, reward scaling) identical on every learner.

    Each learner's statistics absorb the samples of its own env shard. :meth:`__call__` recovers what
    each learner added since the last call (its *delta*: count, mean, variance, by undoing the merge
    into the common base), gathers the deltas, and merges all of them into the base in rank order, so
    that every learner ends with the same bits: the statistics of all the learners' samples.
    """

    def __init__(self, group: LearnerGroup, statistics: RunningMeanStd) -> None:
        self.group = group
        self.statistics = statistics
        empty = RunningMeanStd(statistics.shape, statistics.device)
        self.base = (empty.count, empty.mean, empty.var)  # before any sample: the same everywhere

    def rebase(self) -> None:
        """Take the current statistics as the common base (after loading a checkpoint)."""
        s = self.statistics
        self.base = (s.count.clone(), s.mean.clone(), s.var.clone())

    def __call__(self) -> None:
        s = self.statistics
        base_count, base_mean, base_var = self.base
        added = s.count - base_count
        if float(added) > 0:
            delta_mean = s.mean + (s.mean - base_mean) * (base_count / added)
            spread = (delta_mean - base_mean).square() * base_count * added / s.count
            delta_m2 = s.var * s.count - base_var * base_count - spread
            delta_var = (delta_m2 / added).clamp(min=0)
        else:
            delta_mean, delta_var = torch.zeros_like(s.mean), torch.zeros_like(s.var)
        packed = torch.cat([added.reshape(1), delta_mean.reshape(-1), delta_var.reshape(-1)])
        gathered = [torch.empty_like(packed) for _ in range(self.group.world_size)]
        dist.all_gather(gathered, packed)
        s.count, s.mean, s.var = base_count.clone(), base_mean.clone(), base_var.clone()
        size = s.mean.numel()
        for delta in gathered:
            s.merge(delta[0], delta[1 : 1 + size].view(s.shape), delta[1 + size :].view(s.shape))
        self.rebase()


# -- starting a group -------------------------------------------------------------------------------
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
    outcome: LearnerOutcome | None = None
    errors: list[tuple[int, str, str]] = []

    def receive(block_s: float) -> None:
        """Take the learners' messages, waiting up to ``block_s`` for the first."""
        nonlocal outcome
        timeout_s: float | None = block_s
        while True:
            try:
                kind, rank, value = messages.get(timeout=timeout_s) if timeout_s else messages.get_nowait()
            except queue.Empty:
                return
            timeout_s = None
            value = pickle.loads(value)
            if kind == "error":
                errors.append((rank, *value))
                continue
            if rank == 0 and kind in ("finished", "interrupted"):
                outcome = LearnerOutcome(kind, value)
            if on_report is not None:
                on_report(kind, value)

    # Ctrl+C here is a request too, whenever it comes (a second one kills the learners, in `finally`).
    # The learners start with SIGINT held back: one that came before a learner installed its handler
    # would kill it while the others wait for it in a collective until the timeout.
    interrupted, forwarded = threading.Event(), False
    try:
        with deferred_interrupts(interrupted):
            with interrupts_blocked():
                for process in processes:
                    process.start()
            watched.close()
            while True:
                receive(0.2)
                if interrupted.is_set() and not forwarded:
                    _forward_interrupt(processes)
                    forwarded = True
                if errors or any(p.exitcode not in (None, 0) for p in processes):
                    _give_others_time(processes, receive)
                    raise _failure(processes, errors, timeout)
                if all(p.exitcode == 0 for p in processes):
                    receive(0)
                    break
        if forwarded and outcome is None:
            raise KeyboardInterrupt
    finally:
        for process in processes:
            if process.exitcode is None and process.pid is not None:
                process.kill()
            if process.pid is not None:
                process.join()
        kept.close()
        messages.close()
    if outcome is None:
        raise LearnerError("learner 0 ended without reporting its result (a bug in phalanx).")
    return outcome


def _forward_interrupt(processes: list[Any]) -> None:
    """Ctrl+C: every learner is asked to stop (they agree on a step, save and exit)."""
    for process in processes:
        if process.exitcode is None and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGINT)


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
