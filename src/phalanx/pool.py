"""WorkerPool: processes that serve messages, with shared buffers, timeouts, restarts and fault reports.

A pool starts ``num_workers`` processes that each run a copy of one :class:`WorkerTask`. Its owner (the
env workers of :class:`~phalanx.envs.workers.ProcessVecEnv`, the PettingZoo adapter's workers, the
evaluation process) writes only what a worker does with each message; the pool does the rest, the same
way for all of them:

- start methods: ``fork`` (the parent's objects frozen for the collector, so a child never finalizes
  them), ``forkserver`` with its preloaded modules, or ``spawn`` (:func:`choose_start_method`);
- shared buffers: named numpy arrays in shared memory that the owner and every worker see (actions in,
  observations out), so a step moves no array through a pipe;
- framed messages: short byte frames (:func:`frame`) written straight to the pipe's descriptor for the
  hot path, pickled objects for the rest, on the same pipe;
- timeouts: a worker that does not answer within ``timeout`` seconds is reported hung;
- restarts: each worker can be restarted ``max_restarts`` times;
- fault reports: a worker that raised (its traceback, and where it was working), died (its exit code
  or signal, :func:`death_cause`) or hung reaches the owner as a :class:`Fault`, which the owner turns
  into a restart or its own error message.

Workers ignore SIGINT and SIGTERM (a stop is the owner's to handle; it closes them), exit when the owner's
end of the pipe is gone, and are closed by :meth:`WorkerPool.close`, garbage collection and interpreter exit.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import select
import signal
import struct
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import cloudpickle
import numpy as np
import torch

__all__ = [
    "OK",
    "Fault",
    "WorkerPool",
    "WorkerSide",
    "WorkerTask",
    "choose_start_method",
    "copy_out",
    "death_cause",
    "frame",
]

# A frame is a 4-byte big-endian length, then the bytes: multiprocessing.Connection's own framing, so
# frames written with os.write on the pipe's descriptor mix freely with the Connection's send / recv of
# pickled objects; Connection's Python layers cost ~15 us per message, os.write a few. Windows pipes
# are handles, not descriptors: they keep the Connection methods.
_HEADER = struct.Struct("!i")
_RAW_PIPES = os.name == "posix"
_PICKLE = b"\x80"  # the first byte of every pickle (protocol >= 2): tells an object from a frame
_CLOSE = ("close",)


def frame(body: bytes) -> bytes:
    """``body`` framed for sending (build it once, send it often); the receiver gets ``body``."""
    if not body or body[:1] == _PICKLE:
        raise ValueError(
            f"frame: the body must be non-empty bytes not starting with {_PICKLE!r}, got {body!r}."
        )
    return _HEADER.pack(len(body)) + body


OK = frame(b"k")
"""The answer that says a worker has done what it was asked (started, reset)."""
_OK_BODY = OK[_HEADER.size :]


def copy_out(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A copy of ``array`` as a tensor on ``device``: a shared buffer is rewritten by the next message."""
    if device.type == "cpu":  # numpy's copy of a small array costs a fraction of Tensor.clone's
        return torch.from_numpy(np.array(array, order="C"))
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


# ------------------------------------------------------------------------------------------------------
# Start methods and the causes of a death.


def choose_start_method(
    requested: str | None = None, *, forkable: bool = False, who: str = "WorkerPool", error: type = ValueError
) -> str:
    """The start method of a pool: ``requested`` if given (``error`` if this platform lacks it); else
    ``fork`` where the caller says forking is safe (no CUDA in use) and the platform is Linux (a child in
    milliseconds; the caller's script needs no ``__main__`` guard); else ``forkserver`` where it exists
    (a clean process forked from a server that has imported phalanx once), else ``spawn``."""
    methods = multiprocessing.get_all_start_methods()
    if requested is not None:
        if requested not in methods:
            raise error(
                f"{who}: start_method {requested!r} is not available here; expected one of {methods}."
            )
        return requested
    if forkable and sys.platform.startswith("linux"):
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def death_cause(process: Any, what: str, start_method: str) -> str:
    """Why a worker process that sent nothing ended (its exit code or signal), for the error message.

    A worker that exits with code 1 at start under spawn or forkserver is most often the caller's script
    without a ``__main__`` guard: the new process imports that script, which builds the env again and
    tries to start processes of its own. The cause then says how to fix it."""
    process.join(timeout=1.0)
    code = process.exitcode
    died = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    cause = f"the process died during {what} ({died})"
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if what == "start" and code == 1 and start_method != "fork" and main_file is not None:
        cause += (
            f". If the output above shows multiprocessing's RuntimeError about the 'bootstrapping phase', "
            f"the new process imported {main_file!r}, which built this env again: put that script's "
            'top-level code under `if __name__ == "__main__":`'
        )
    return cause


class Fault(Exception):
    """A worker that raised, died or did not answer in time: what the pool tells its owner.

    ``kind``: ``"fatal"`` (it raised one of its task's ``fatal`` errors, which a restart would not fix),
    ``"raised"`` (another error), ``"died"`` or ``"hung"``. ``summary``: the error's ``"Type: message"``,
    or the death's cause, or what was not answered in time; ``where``: what the task was working on
    (a sub-env, a copy) or None; ``trace``: the worker's traceback."""

    def __init__(
        self, worker: int, what: str, kind: str, summary: str, where: int | None, trace: str
    ) -> None:
        super().__init__(summary)
        self.worker, self.what, self.kind, self.summary, self.where, self.trace = (
            worker,
            what,
            kind,
            summary,
            where,
            trace,
        )

    def cause(self, unit: str) -> str:
        """The fault in a phrase for an error message; ``unit`` names what ``where`` counts (``"copy"``)."""
        if self.kind in ("died", "hung"):
            return self.summary
        at = "" if self.where is None else f" in {unit} {self.where}"
        return f"{self.summary} (raised{at} during {self.what})"


@dataclass(frozen=True)
class _Report:
    """What a failing worker sends before it ends: the main process turns it into a :class:`Fault`."""

    kind: str
    where: int | None
    summary: str
    trace: str


# ------------------------------------------------------------------------------------------------------
# The worker's side.


@dataclass(frozen=True)
class WorkerSide:
    """What a task sees of its worker: its number, the shared buffers (whole), the pool's lock or None."""

    index: int
    views: dict[str, np.ndarray]
    lock: Any


class WorkerTask:
    """What every worker of a pool does: subclass it, and give an instance to :class:`WorkerPool`.

    The instance travels to each worker pickled (with cloudpickle, so lambdas in it work). The worker
    calls :meth:`start` once, then :meth:`handle` with each message until the pool closes it, then
    :meth:`close`. An exception in :meth:`start` or :meth:`handle` ends the worker and reaches the
    owner as a :class:`Fault` with its traceback and :attr:`where`; an instance of one of :attr:`fatal`
    is reported with kind ``"fatal"``.
    """

    fatal: tuple[type[BaseException], ...] = ()
    """Errors that a restart would not fix (a broken contract), reported as kind ``"fatal"``."""

    where: int | None = None
    """What the task is working on (a sub-env, a copy), named in the fault report; set it on failure."""

    def start(self, worker: WorkerSide) -> Any:
        """Build what the worker needs; return the answer to send (None: :data:`OK`)."""

    def handle(self, message: Any) -> Any:
        """Serve ``message``: a frame's body (bytes) or an object sent pickled (a queued pool: the list of
        the messages that arrived while the worker was busy, oldest first). Return the answer to send:
        None (none), a frame (:func:`frame`) or an object (pickled)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what :meth:`start` built (it may have stopped half way); called once, on the way out."""


def _serve(
    payload: bytes,
    index: int,
    buffers: dict[str, tuple[Any, tuple[int, ...], str]],
    lock: Any,
    queued: bool,
    conn: Any,
) -> None:
    """A worker process: run the pickled task's start, then its handle on each message until closed."""
    # Ctrl+C and SIGTERM (Slurm signals every process of a job) are the owner's to handle: it saves the
    # run, then closes us; were it killed instead, its end of the pipe closes and we exit.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    views = {
        name: np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
        for name, (raw, shape, dtype) in buffers.items()
    }
    task: WorkerTask | None = None
    try:
        task = cloudpickle.loads(payload)
        answer = task.start(WorkerSide(index, views, lock))
        _answer(conn, OK if answer is None else answer)
        for message in _queue(conn) if queued else _messages(conn):
            answer = task.handle(message)
            if answer is not None:
                _answer(conn, answer)
    except BaseException as error:  # noqa: BLE001 - every failure is reported to the owner
        kind = "fatal" if task is not None and isinstance(error, task.fatal) else "raised"
        where = None if task is None else task.where
        report = _Report(kind, where, f"{type(error).__name__}: {error}", traceback.format_exc())
        with contextlib.suppress(OSError, EOFError):
            conn.send(report)
    finally:
        if task is not None:
            with contextlib.suppress(Exception):  # closing is best effort on the way out
                task.close()
        conn.close()


def _answer(conn: Any, answer: Any) -> None:
    if isinstance(answer, bytes):
        _send_frame(conn, answer)
    else:
        conn.send(answer)


def _messages(conn: Any) -> Iterator[Any]:
    """The messages sent to this worker until it is closed, or its owner is gone (exit, do not linger)."""
    while True:
        try:
            message = _receive(conn)
        except (EOFError, OSError):
            return
        if message[:1] == _PICKLE:
            message = cloudpickle.loads(message)
            if isinstance(message, tuple) and message == _CLOSE:
                return
        yield message


def _queue(conn: Any) -> Iterator[list[Any]]:
    """The messages of a queued worker: a thread receives them as they come (the owner never waits to
    send a large one), and the worker takes all that arrived whenever it is free, oldest first."""
    arrived: list[Any] = []
    changed = threading.Condition()
    closing = threading.Event()

    def receive() -> None:
        for message in _messages(conn):
            with changed:
                arrived.append(message)
                changed.notify()
        closing.set()
        with changed:
            changed.notify()

    threading.Thread(target=receive, name="phalanx-pool-receive", daemon=True).start()
    parent = os.getppid()
    while not closing.is_set():
        with changed:
            if not arrived and not changed.wait(timeout=1.0):
                if os.getppid() != parent:  # the owner is gone (a forked child holds both ends of the pipe)
                    return
                continue
            taken = arrived[:]
            arrived.clear()
        if taken:
            yield taken


# ------------------------------------------------------------------------------------------------------
# The pipes.


def _send_frame(conn: Any, framed: bytes) -> None:
    if _RAW_PIPES:
        os.write(conn.fileno(), framed)
    else:
        conn.send_bytes(framed[_HEADER.size :])


def _receive(conn: Any) -> bytes:
    """One message's bytes (a frame's body or a pickle); EOFError when the other end is gone."""
    if not _RAW_PIPES:
        return conn.recv_bytes()
    fd = conn.fileno()
    # every message has at least one byte, so this first read often holds the whole frame
    data = _read_until(fd, os.read(fd, _HEADER.size + 1), _HEADER.size)
    (size,) = _HEADER.unpack(data[: _HEADER.size])
    if size < 0:  # > 2 GiB: Connection's long form
        raise OSError(f"unexpected message of {size} bytes on a worker pipe")
    return _read_until(fd, data[_HEADER.size :], size)


def _read_until(fd: int, data: bytes, size: int) -> bytes:
    """``data`` followed by reads from ``fd`` until it holds at least ``size`` bytes."""
    while len(data) < size:
        more = os.read(fd, size - len(data))
        if not more:
            raise EOFError("the pipe was closed")
        data += more
    return data


def _ready(handles: dict[int, tuple[int, int]], timeout: float | None) -> dict[int, bool]:
    """The workers whose pipe is readable or whose process ended, waiting up to ``timeout`` seconds
    (None: as long as it takes).

    ``handles`` maps a worker to (pipe fd, process sentinel fd); the result maps each ready worker to
    whether its pipe has data. ``select.poll`` costs a few microseconds where
    ``multiprocessing.connection.wait`` builds a selector on every call.
    """
    owner = {}
    for worker, (pipe, sentinel) in handles.items():
        owner[pipe] = worker, True
        owner[sentinel] = worker, False
    if hasattr(select, "poll"):
        poller = select.poll()
        for fd in owner:
            poller.register(fd, select.POLLIN)
        fired = [fd for fd, _ in poller.poll(None if timeout is None else timeout * 1000.0)]
    else:  # Windows
        # wait() gives back the objects it was given: here file descriptors
        fired = cast(list[int], multiprocessing.connection.wait(list(owner), timeout))
    ready: dict[int, bool] = {}
    for fd in fired:
        worker, is_pipe = owner[fd]
        ready[worker] = ready.get(worker, False) or is_pipe
    return ready


def _shared_arrays(
    context: Any, layout: dict[str, tuple[tuple[int, ...], str]]
) -> tuple[dict[str, tuple[Any, tuple[int, ...], str]], dict[str, np.ndarray]]:
    """One lock-free shared buffer per ``{name: (shape, dtype)}``: what the workers receive, and the
    numpy views of them here."""
    buffers, views = {}, {}
    for name, (shape, dtype) in layout.items():
        count = int(np.prod(shape))
        raw = context.RawArray("b", max(1, count * np.dtype(dtype).itemsize))
        views[name] = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
        buffers[name] = (raw, shape, dtype)
    return buffers, views


def _shutdown(processes: list[Any], connections: list[Any]) -> None:
    """Close every worker: ask politely, then terminate, then kill. Safe to call twice."""
    connections = [conn for conn in connections if conn is not None]
    for conn in connections:
        with contextlib.suppress(OSError, EOFError, ValueError):
            conn.send(_CLOSE)
    for process in processes:
        if process is None:
            continue
        process.join(timeout=1.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=1.0)
        if process.is_alive():
            process.kill()
            process.join(timeout=1.0)
    for conn in connections:
        with contextlib.suppress(OSError):
            conn.close()


# ------------------------------------------------------------------------------------------------------
# The owner's side.


class WorkerPool:
    """``num_workers`` processes that each run a copy of ``task`` (a :class:`WorkerTask`) and answer its
    owner's messages.

    Args:
        task: what each worker does (sent pickled to every worker; ``task.start`` learns its number).
        num_workers: number of processes (>= 1).
        name: the processes' name prefix (worker ``w`` is ``f"{name}-{w}"``).
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; None: :func:`choose_start_method`.
        preload: modules a forkserver imports once, so that each worker it forks has them.
        buffers: the shared arrays, ``{name: (shape, dtype)}``; :attr:`views` here, ``WorkerSide.views``
            in the workers.
        lock: give the workers a shared lock (:attr:`lock`) to make their updates of a buffer atomic.
        timeout: seconds a worker may take to answer before it counts as hung; None: no limit.
        timeout_setting: the owner's name of ``timeout``, for the hung report (``"step_timeout"``).
        max_restarts: restarts allowed per worker over the pool's life (:meth:`restart`).
        queued: a thread of each worker receives the messages as they come; :meth:`WorkerTask.handle`
            gets the list of those that arrived while it was busy (for workers that take long on large
            messages: the evaluation process).

    The workers start at once; :meth:`wait_started` (or :meth:`receive`) collects their answer to
    ``"start"``.
    """

    def __init__(
        self,
        task: WorkerTask,
        num_workers: int,
        *,
        name: str = "phalanx-worker",
        start_method: str | None = None,
        preload: Iterable[str] = (),
        buffers: dict[str, tuple[tuple[int, ...], str]] | None = None,
        lock: bool = False,
        timeout: float | None = None,
        timeout_setting: str = "timeout",
        max_restarts: int = 0,
        queued: bool = False,
    ) -> None:
        self.start_method = choose_start_method(start_method)
        # the start method's context (typeshed types get_context's result as BaseContext, which lacks Process)
        self.context: Any = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver" and preload:
            self.context.set_forkserver_preload(list(preload))
        self.num_workers, self.name, self.queued = int(num_workers), name, queued
        self.timeout, self.timeout_setting = timeout, timeout_setting
        self.max_restarts = int(max_restarts)
        self.restarts = [0] * self.num_workers
        self.lock = self.context.Lock() if lock else None
        self._buffers, self.views = _shared_arrays(self.context, buffers or {})
        self._payload = cloudpickle.dumps(task)
        self.processes: list[Any] = [None] * self.num_workers
        self._connections: list[Any] = [None] * self.num_workers
        self._handles: list[tuple[int, int]] = [(-1, -1)] * self.num_workers  # (pipe fd, sentinel)
        self._finalizer = weakref.finalize(self, _shutdown, self.processes, self._connections)
        self.closed = False
        try:
            for worker in range(self.num_workers):
                self._start(worker)
        except BaseException:
            self.close()
            raise

    def _start(self, worker: int) -> None:
        parent, child = self.context.Pipe(duplex=True)
        process = self.context.Process(
            target=_serve,
            args=(self._payload, worker, self._buffers, self.lock, self.queued, child),
            name=f"{self.name}-{worker}",
            daemon=True,
        )
        gc.freeze()  # a C++ destructor of the parent's (EnvPool's joins threads) run in a child aborts it
        try:
            process.start()
        finally:
            gc.unfreeze()
        child.close()
        self.processes[worker] = process
        self._connections[worker] = parent
        self._handles[worker] = parent.fileno(), process.sentinel

    # -- messages ----------------------------------------------------------------------------------
    def send(self, worker: int, message: Any) -> None:
        """Send ``message`` to ``worker``: a frame (:func:`frame`) as it is, anything else pickled."""
        if isinstance(message, bytes):
            _send_frame(self._connections[worker], message)
        else:
            self._connections[worker].send(message)

    def broadcast(self, message: Any) -> None:
        """Send ``message`` to every worker."""
        for worker in range(self.num_workers):
            self.send(worker, message)

    def poll(self, worker: int) -> bool:
        """Whether an answer of ``worker`` is waiting (does not wait)."""
        return self._connections[worker].poll()

    def receive(self, worker: int, what: str) -> Any:
        """The next answer of ``worker`` to ``what`` (a frame's body or an object); raises its
        :class:`Fault` if it failed, died or did not answer within the timeout."""
        ready = _ready({worker: self._handles[worker]}, self.timeout)
        answer = self._hung(worker, what) if not ready else self._read(worker, what, ready[worker])
        if isinstance(answer, Fault):
            raise answer
        return answer

    def wait_started(self, on_fault: Callable[[Fault], None]) -> None:
        """Wait for every worker's answer to ``"start"``, faults to ``on_fault``; on any failure (a fault
        ``on_fault`` raises, Ctrl+C) close the pool and raise."""
        try:
            self.wait(range(self.num_workers), "start", on_fault)
        except BaseException:
            self.close()
            raise

    def wait(
        self,
        workers: Iterable[int],
        what: str,
        on_fault: Callable[[Fault], None],
        until: Callable[[], bool] | None = None,
        on_answer: Callable[[Any], None] | None = None,
    ) -> None:
        """Wait until each of ``workers`` has answered ``what`` with :data:`OK` or, given ``until``, until
        ``until()`` is true; other answers go to ``on_answer``. Each fault (a worker that raised or died,
        or, once the timeout has passed, each worker still waited for) goes to ``on_fault``, which
        restarts the worker or raises; after a timeout the wait ends."""
        waiting = set(workers)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while waiting if until is None else not until():
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = _ready({w: self._handles[w] for w in waiting}, left)
            if not ready:
                for worker in sorted(waiting):
                    on_fault(self._hung(worker, what))
                return
            for worker, has_data in sorted(ready.items()):
                answer = self._read(worker, what, has_data)
                if isinstance(answer, bytes) and answer == _OK_BODY:
                    waiting.discard(worker)
                elif isinstance(answer, Fault):
                    waiting.discard(worker)
                    on_fault(answer)
                elif on_answer is not None:
                    on_answer(answer)

    def _read(self, worker: int, what: str, has_data: bool) -> Any:
        """The answer waiting from ``worker``, or its fault (it sent a report, or it died)."""
        try:
            message = _receive(self._connections[worker]) if has_data else None
        except (EOFError, OSError):
            message = None
        if message is None:
            cause = death_cause(self.processes[worker], what, self.start_method)
            return Fault(worker, what, "died", cause, None, "")
        if message[:1] != _PICKLE:
            return message
        answer = cloudpickle.loads(message)
        if isinstance(answer, _Report):
            return Fault(worker, what, answer.kind, answer.summary, answer.where, answer.trace)
        return answer

    def _hung(self, worker: int, what: str) -> Fault:
        summary = f"no answer to {what} within {self.timeout_setting}={self.timeout} s (hung)"
        return Fault(worker, what, "hung", summary, None, "")

    # -- processes ---------------------------------------------------------------------------------
    def stop(self, worker: int) -> None:
        """Kill ``worker`` now (a fault): it answers nothing more."""
        process = self.processes[worker]
        if process.is_alive():
            process.kill()
        process.join(timeout=1.0)

    def restart(self, worker: int) -> bool:
        """Stop ``worker`` and count a restart; start a new one unless that is past ``max_restarts``.
        True if it started (collect its ``"start"`` answer with :meth:`wait`)."""
        self.stop(worker)
        self.restarts[worker] += 1
        if self.restarts[worker] > self.max_restarts:
            return False
        with contextlib.suppress(OSError):
            self._connections[worker].close()
        self._start(worker)
        return True

    @property
    def pids(self) -> list[int]:
        """The process ids of the live workers."""
        return [p.pid for p in self.processes if p is not None and p.is_alive()]

    def close(self) -> None:
        """End every worker (asked to close, then terminated, then killed). Safe to call twice."""
        if not self.closed:
            self.closed = True
            self._finalizer()
