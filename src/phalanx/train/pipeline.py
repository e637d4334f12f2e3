"""Pipelined off-policy training: the worker steps the envs in its own thread while the learner updates.

(When the envs step in worker processes, the trainer needs no thread: the processes step while the
learner makes the previous step's updates, see ``phalanx.train.collection.ProcessPipeline``. This module is
the pipeline for every other env: batched envs on a device, envs stepped in this process.)

Producer and consumer. The worker thread acts with its own copy of the algorithm's exploration policy
(a module, ``OffPolicy.exploration_policy()``; on CUDA, on its own stream) and puts each VecEnv step
into a bounded queue; the learner (the trainer's thread) takes the steps out in order, stores them in
the replay buffer and makes exactly the updates the synchronous loop would make after them. So a
pipelined run takes the same env steps and the same number of updates as a synchronous one; what
changes is that the envs step while the learner computes, and that the policy acting may be a few
updates old:

- every ``sync_every`` updates the learner copies its policy's tensors into a spare copy, which the
  worker swaps in before its next step;
- the worker runs at most ``queue_size`` VecEnv steps ahead of the learner (then ``put`` blocks).

The *policy lag* of a step (learner updates made since the weights that acted on it were copied) is
therefore at most ``sync_every + (queue_size + 2) * U``, where ``U`` is the number of updates after
one VecEnv step (``ceil(num_envs * updates_per_step)``, or ``max_updates_per_step``); the trainer logs
its mean and maximum.

Checkpoints need a quiet pipeline: :meth:`Pipeline.drain` pauses the worker between two steps and
returns every step it had queued, the learner consumes them, the trainer saves, and
:meth:`Pipeline.resume` lets the worker go on. A failure in the worker thread is raised in the learner's
thread as :class:`PipelineError` with the worker's traceback; a failure in the learner's thread (or
Ctrl+C) stops the worker through :meth:`Pipeline.stop`, which joins the thread.

Runs are not bitwise reproducible: the worker and the learner draw from torch's global generator in
an order set by the thread scheduler.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from phalanx.algos.base import OffPolicy
from phalanx.train.worker import Transition, Worker

_POLL_S = 0.1  # how often a blocked put / get looks whether the other side stopped


class PipelineError(RuntimeError):
    """The pipeline's worker thread failed; the message carries its traceback."""


@dataclass
class Step:
    """One VecEnv step made by the worker thread."""

    transition: Transition
    version: int  # learner updates when the weights that acted were copied
    steps: int  # env steps made before it (what the policy acted on, for its schedules)
    ready: Any = None  # CUDA: an event recorded on the worker's stream after the step


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_PAUSED, _FINISHED, _FAILED = _Marker("paused"), _Marker("finished"), _Marker("failed")


class Pipeline:
    """The worker thread of a pipelined off-policy run (see the module docstring).

    Args:
        worker: the run's worker; only the thread steps its env while the pipeline runs.
        algorithm: the learner's algorithm; the thread acts with copies of its exploration policy.
        queue_size: VecEnv steps the worker may run ahead of the learner (>= 1).
        sync_every: learner updates between weight copies to the worker (>= 1).
        steps: env steps made so far (the run's ``steps``; > 0 on resume).
        total_steps: the worker stops once it has made this many env steps.
        learning_starts: env steps made with uniformly random actions before the policy acts.
        updates: learner updates made so far (the version of the weights at the start).
        steps_per_transition: env steps one VecEnv step counts for (default ``num_envs``; a learner
            of a group counts the steps of every learner's shard).
    """

    def __init__(
        self,
        worker: Worker,
        algorithm: OffPolicy,
        queue_size: int,
        sync_every: int,
        steps: int,
        total_steps: int,
        learning_starts: int,
        updates: int,
        steps_per_transition: int | None = None,
    ) -> None:
        self.worker = worker
        self.steps_per_transition = steps_per_transition or worker.env.num_envs
        self.algorithm = algorithm
        self.sync_every = sync_every
        self.total_steps = total_steps
        self.learning_starts = learning_starts
        self.produced = steps  # env steps the worker has made (the learner's count trails it)
        self.device = algorithm.device
        self.policy = algorithm.exploration_policy()  # the learner's
        self._source = self.policy.tensors()
        self._acting = copy.deepcopy(self.policy)  # the worker's
        self._spare = copy.deepcopy(self.policy)  # the learner copies into it; the worker swaps it in
        self._acting_version = self._spare_version = updates
        self._spare_fresh = False
        self._spare_ready: Any = None
        self._swap = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._pause_at = 0  # with _pause set, the worker pauses once it has made this many env steps
        self._drain_id = self._served = 0  # drains asked for / answered with _PAUSED
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._finished = False
        self._error: tuple[BaseException, str] | None = None
        self._thread = threading.Thread(target=self._run, name="phalanx-pipeline-worker", daemon=True)
        self._thread.start()

    # -- the worker thread -------------------------------------------------------------------------
    def _run(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        try:
            with context:
                while self.produced < self.total_steps and not self._stop.is_set():
                    if self._pause.is_set() and self.produced >= self._pause_at:
                        if self._served != self._drain_id:  # tell the learner once per drain
                            self._running.clear()  # before the learner can see _PAUSED and resume
                            self._put(_PAUSED)
                            self._served = self._drain_id
                        self._running.wait(_POLL_S)
                        continue
                    self._take_fresh_weights()
                    made_at = self.produced
                    transition = self.worker.transition(
                        made_at, random=made_at < self.learning_starts, policy=self._acting
                    )
                    ready = None
                    if stream is not None:
                        ready = torch.cuda.Event()
                        ready.record(stream)
                    self.produced += self.steps_per_transition
                    self._put(Step(transition, self._acting_version, made_at, ready))
            self._put(_FINISHED)
        except BaseException as error:  # noqa: BLE001 - reported to the learner's thread
            self._error = (error, traceback.format_exc())
            self._put(_FAILED)

    def _take_fresh_weights(self) -> None:
        with self._swap:
            if not self._spare_fresh:
                return
            self._acting, self._spare = self._spare, self._acting
            self._acting_version = self._spare_version
            self._spare_fresh = False
            ready = self._spare_ready
        if ready is not None:  # the copy was made on the learner's stream
            torch.cuda.current_stream().wait_event(ready)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    # -- the learner's side ------------------------------------------------------------------------
    def next(self) -> Step:
        """The oldest step the worker made (waits for it)."""
        item = self._get()
        if item is _PAUSED:  # a drain was asked for and already served: not expected here
            return self.next()
        if item is _FINISHED:
            self._finished = True
            raise PipelineError(
                f"the pipeline's worker made all {self.total_steps:,} env steps of the budget and the "
                "learner asked for more (a bug in the trainer's step accounting)."
            )
        return item

    def _get(self) -> Any:
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise PipelineError("the pipeline's worker thread ended without a word") from None
                continue
            if item is _FAILED:
                error, trace = self._error if self._error else (RuntimeError("unknown"), "")
                env = type(self.worker.env.unwrapped).__name__
                raise PipelineError(
                    f"the pipeline's worker thread failed while stepping the env ({env}): "
                    f"{type(error).__name__}: {error}\n--- worker thread traceback ---\n{trace}"
                ) from error
            if isinstance(item, Step):
                if item.ready is not None:
                    torch.cuda.current_stream().wait_event(item.ready)
                self.policy.advance_to(item.steps)  # its schedules at the step the learner takes
            return item

    def after_update(self, updates: int) -> None:
        """Call after every learner update; every ``sync_every`` updates, the weights go to the worker."""
        if updates % self.sync_every:
            return
        with self._swap, torch.no_grad():
            torch._foreach_copy_(self._spare.tensors(), self._source)
            self._spare_version = updates
            self._spare_fresh = True
            if self.device.type == "cuda":
                self._spare_ready = torch.cuda.Event()
                self._spare_ready.record(torch.cuda.current_stream())

    def drain(self, until: int = 0) -> list[Step]:
        """Pause the worker between two steps, once it has made ``until`` env steps (0: at once); every
        step it made and the learner has not taken."""
        if self._finished or not self._thread.is_alive() and self._queue.empty():
            return []
        self._pause_at = until
        self._drain_id += 1
        self._pause.set()
        self._running.set()  # a worker paused by an earlier drain wakes to answer this one
        steps: list[Step] = []
        while True:
            item = self._get()
            if item is _PAUSED:
                return steps
            if item is _FINISHED:
                self._finished = True
                return steps
            steps.append(item)

    def resume(self) -> None:
        """Let the worker go on after :meth:`drain`."""
        self._pause.clear()
        self._running.set()

    def stop(self) -> None:
        """Stop the worker thread and wait for it (steps still queued are dropped)."""
        self._stop.set()
        self._running.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=_POLL_S)
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
