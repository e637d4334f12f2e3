"""WorkerPool: a task in worker processes, shared buffers, faults (raised, hung, died), restarts, close."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from phalanx.pool import OK, Fault, WorkerPool, WorkerSide, WorkerTask, choose_start_method, frame

sys.path.insert(0, str(Path(__file__).parent))  # forkserver and spawn workers import this module's tasks

START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else None  # the cheapest
_DOUBLE, _SLEEP, _CRASH = frame(b"d"), frame(b"z"), frame(b"c")


class Doubler(WorkerTask):
    """Worker w doubles its row of the shared buffer on b"d", sleeps on b"z", raises on b"c"; it answers
    an object ("add", x) with x + its number."""

    def start(self, worker: WorkerSide) -> None:
        self.index, self.row = worker.index, worker.views["values"][worker.index]

    def handle(self, message):
        if message == b"d":
            self.row *= 2
            return OK
        if message == b"z":
            time.sleep(30)
        if message == b"c":
            self.where = 10 + self.index
            raise RuntimeError("injected fault")
        command, value = message
        return value + self.index


def pool_of(num_workers=2, **settings):
    settings = {"start_method": START_METHOD, "timeout": 60.0, **settings}
    return WorkerPool(Doubler(), num_workers, buffers={"values": ((num_workers, 3), "float32")}, **settings)


def refuse(fault: Fault) -> None:
    raise fault


def gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and "zombie" not in _state(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def test_workers_run_the_task_on_shared_buffers_frames_and_objects():
    pool = pool_of()
    try:
        pool.wait_started(refuse)
        pool.views["values"][:] = [[1, 2, 3], [4, 5, 6]]
        pool.broadcast(_DOUBLE)
        pool.wait(range(2), "double", refuse)
        assert pool.views["values"].tolist() == [[2, 4, 6], [8, 10, 12]]
        pool.send(1, ("add", 5))
        assert pool.receive(1, "add") == 6
        assert len(pool.pids) == 2
    finally:
        pool.close()


def test_a_hung_worker_is_reported_after_the_timeout():
    pool = pool_of(timeout=0.5, timeout_setting="step_timeout")
    faults = []
    try:
        pool.wait_started(refuse)
        pool.send(0, _SLEEP)
        pool.send(1, _DOUBLE)
        start = time.monotonic()
        pool.wait(range(2), "step", faults.append)
        assert time.monotonic() - start < 5.0
        [fault] = faults
        assert (fault.worker, fault.kind) == (0, "hung")
        assert fault.cause("sub-env") == "no answer to step within step_timeout=0.5 s (hung)"
    finally:
        pool.close()


def test_a_crash_is_reported_with_its_traceback_and_the_worker_restarts_up_to_max_restarts():
    pool = pool_of(max_restarts=1)
    faults = []
    try:
        pool.wait_started(refuse)
        pool.send(1, _CRASH)
        pool.wait([1], "step", faults.append)
        [fault] = faults
        assert (fault.worker, fault.kind, fault.where) == (1, "raised", 11)
        assert fault.cause("copy") == "RuntimeError: injected fault (raised in copy 11 during step)"
        assert "injected fault" in fault.trace and "Traceback" in fault.trace
        old = pool.processes[1].pid
        assert pool.restart(1) and pool.restarts == [0, 1]
        pool.wait([1], "start", refuse)
        assert pool.processes[1].pid != old
        pool.send(1, ("add", 1))
        assert pool.receive(1, "add") == 2  # the new worker serves
        assert not pool.restart(1) and pool.restarts == [0, 2]  # past max_restarts: not started
    finally:
        pool.close()


def test_a_killed_worker_is_reported_with_its_death_cause():
    pool = pool_of(num_workers=1)
    try:
        pool.wait_started(refuse)
        os.kill(pool.processes[0].pid, signal.SIGKILL)
        pool.send(0, _DOUBLE)
        with pytest.raises(Fault) as error:
            pool.receive(0, "step")
        assert error.value.kind == "died"
        assert error.value.cause("sub-env") == "the process died during step (killed by signal 9)"
    finally:
        pool.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("start_method", sorted({START_METHOD, choose_start_method()} - {None}))
def test_close_and_garbage_collection_leave_no_process(start_method):
    pool = pool_of(start_method=start_method)
    pool.wait_started(refuse)
    pids = pool.pids
    assert len(pids) == 2
    pool.close()
    pool.close()  # twice is fine
    assert gone(pids) == []
    pool = pool_of(start_method=start_method)
    pids = pool.pids
    del pool
    gc.collect()
    assert gone(pids) == []


def test_start_methods_are_chosen_and_checked():
    assert choose_start_method("spawn") == "spawn"
    if sys.platform.startswith("linux"):
        assert choose_start_method(forkable=True) == "fork"
    assert choose_start_method() in ("forkserver", "spawn")
    with pytest.raises(RuntimeError, match=r"Thing: start_method 'teleport' is not available here; expected"):
        choose_start_method("teleport", who="Thing", error=RuntimeError)
    with pytest.raises(ValueError, match="must be non-empty bytes"):
        frame(b"\x80oops")
