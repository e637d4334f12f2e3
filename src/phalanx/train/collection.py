"""How a run collects experience and learns from it: one strategy, chosen once when training starts.

- :class:`Rollouts` (on-policy): the worker collects a rollout of ``horizon`` steps of every sub-env
  (double buffered by the worker itself when the env is two halves, ``--overlap``), the learner
  updates on it;
- :class:`EnvSteps` (off-policy): one VecEnv step into the replay buffer, then the updates it is owed
  (the update-to-data ratio);
- :class:`ProcessPipeline` (off-policy, ``pipeline`` with envs in worker processes): the processes make
  step k while the learner stores step k - 1 and makes its updates;
- :class:`ThreadPipeline` (off-policy, ``pipeline`` otherwise): a worker thread steps the envs
  (:mod:`phalanx.train.pipeline`), the loop consumes its steps.

Beside it, the run's :class:`Agreement` is chosen once too: a single run acts on its own stop requests;
the learners of a data-parallel group (:class:`GroupAgreement`) merge their running statistics and
agree after every iteration whether to stop, so that every learner stops at the same step or none does.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from phalanx.envs.workers import ProcessVecEnv
from phalanx.train.learner import Learner, LearnerGroup, replay_settings, rollout_settings
from phalanx.train.pipeline import Pipeline, Step
from phalanx.train.worker import Transition, Worker

if TYPE_CHECKING:
    from phalanx.algos.base import Algorithm, OffPolicy
    from phalanx.config import TrainConfig
    from phalanx.envs.core import VecEnv
    from phalanx.train.state import RunState

Metrics = dict[str, torch.Tensor]


class Parts(Protocol):
    """What a collection strategy uses of the run (the trainer): its parts, and the two counters of its
    state the strategy writes, ``steps`` and ``updates_owed``."""

    config: TrainConfig
    group: LearnerGroup | None
    env: VecEnv
    algorithm: Algorithm
    worker: Worker
    learner: Learner
    buffer: Any  # the rollout or replay buffer the worker fills
    step_size: int
    state: RunState


class Collection:
    """One iteration of the loop (:meth:`iterate`: collect, learn) and what saving needs of it."""

    def __init__(self, trainer: Parts) -> None:
        self.trainer = trainer

    def iterate(self) -> Metrics:
        """Collect and learn; the metrics of the iteration's last update ({} if it made none)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def drained(self) -> Iterator[None]:
        """A quiet state to save or evaluate: every step collected so far learnt from."""
        yield

    def finish(self) -> None:
        """At the end of the loop: learn from the steps collected and not learnt from yet."""

    def read_policy_lag(self) -> dict[str, float]:
        """Pipelines: mean and max policy lag (in updates) of the steps consumed since the last read."""
        return {}

    def close(self) -> None:
        """Stop what the strategy started (a pipeline's worker thread)."""


class Rollouts(Collection):
    """On-policy: a rollout of ``horizon`` steps of every sub-env, then an update on it."""

    def iterate(self) -> Metrics:
        trainer = self.trainer
        trainer.worker.collect(trainer.buffer)
        trainer.state.steps += rollout_settings(trainer.config.hyperparameters).horizon * trainer.step_size
        return trainer.learner.update(progress=min(trainer.state.steps / trainer.config.total_steps, 1.0))


class EnvSteps(Collection):
    """Off-policy: one step of every sub-env into the replay buffer, then ``num_envs * updates_per_step``
    updates (fractions carried to the next step in the trainer's ``updates_owed``)."""

    def __init__(self, trainer: Parts) -> None:
        super().__init__(trainer)
        self.updates_due = 0  # gradient steps owed to the steps stored, not made yet
        self.progress = 0.0  # the fraction of the budget spent when the last step was stored
        self.policy_lags: list[int] = []

    def iterate(self) -> Metrics:
        trainer = self.trainer
        hp = replay_settings(trainer.config.hyperparameters)
        return self.learn_from(
            trainer.worker.transition(trainer.state.steps, random=trainer.state.steps < hp.learning_starts)
        )

    @contextlib.contextmanager
    def drained(self) -> Iterator[None]:
        self.finish()
        yield

    def finish(self) -> None:
        self.settle()

    def learn_from(self, transition: Transition) -> Metrics:
        """Store one VecEnv step, then make the updates it is owed (the update-to-data ratio)."""
        self.store(transition)
        return self.settle()

    def store(self, transition: Transition) -> None:
        """Store one VecEnv step and add the updates it is owed to :attr:`updates_due`."""
        trainer = self.trainer
        config, hp = trainer.config, replay_settings(trainer.config.hyperparameters)
        self.progress = min(trainer.state.steps / config.total_steps, 1.0)
        trainer.worker.store(trainer.buffer, transition)
        trainer.state.steps += trainer.step_size
        if len(trainer.buffer) < self.update_threshold:
            return
        trainer.state.updates_owed += config.num_envs * hp.updates_per_step
        updates = int(trainer.state.updates_owed)
        trainer.state.updates_owed -= updates
        if hp.max_updates_per_step is not None:
            updates = min(updates, hp.max_updates_per_step)
        self.updates_due += updates

    @property
    def update_threshold(self) -> int:
        """Updates start once the buffer holds the warm-up (and enough steps for n-step returns); a
        learner of a group holds its share of the warm-up."""
        trainer = self.trainer
        hp = replay_settings(trainer.config.hyperparameters)
        world = trainer.group.world_size if trainer.group is not None else 1
        return max(math.ceil(hp.learning_starts / world), trainer.config.num_envs * hp.n_step)

    def settle(self) -> Metrics:
        """Make the updates due; the metrics of the last one ({} if none was due)."""
        metrics: Metrics = {}
        while self.updates_due:
            metrics = self.trainer.learner.update(self.progress)
            self.updates_due -= 1
            self.after_update()
        return metrics

    def after_update(self) -> None:
        """What follows every update (a thread pipeline's weight copy)."""

    def read_policy_lag(self) -> dict[str, float]:
        if not self.policy_lags:
            return {}
        lags, self.policy_lags = self.policy_lags, []
        return {"policy_lag_mean": sum(lags) / len(lags), "policy_lag_max": float(max(lags))}


class ProcessPipeline(EnvSteps):
    """The pipeline when the envs step in worker processes: while they make step k, the learner stores
    step k - 1 and makes the updates it is owed; step k is stored in the next iteration.

    The same env steps and updates as :class:`EnvSteps`, each update one VecEnv step later: the actions
    of a step are those of the weights before the previous step's updates. The trainer's ``steps``
    counts the steps stored, so the last step is sent only while the budget lasts.
    """

    def __init__(self, trainer: Parts) -> None:
        super().__init__(trainer)
        self.received: Transition | None = None  # the last step made, stored next

    def iterate(self) -> Metrics:
        trainer = self.trainer
        hp = replay_settings(trainer.config.hyperparameters)
        previous = self.received  # cleared just before it is stored: Ctrl+C in send() loses nothing
        if previous is not None and trainer.state.steps + trainer.step_size >= trainer.config.total_steps:
            self.received = None
            self.store(previous)  # the budget's last step: nothing left to send
            return self.settle()
        sent_at = trainer.state.steps + (trainer.step_size if previous is not None else 0)
        trainer.worker.send(sent_at, random=sent_at < hp.learning_starts)
        if previous is not None:
            self.received = None
            self.store(previous)
        before = trainer.learner.updates
        metrics = self.settle()
        self.received = trainer.worker.receive()
        self.policy_lags.append(trainer.learner.updates - before)
        return metrics

    def finish(self) -> None:
        """Store the step received and not yet stored, then the step in flight if there is one (sent
        when Ctrl+C came), in the order they were made; then make their updates."""
        previous, self.received = self.received, None
        if previous is not None:
            self.store(previous)
        if self.trainer.worker.in_flight:
            self.store(self.trainer.worker.receive())
        self.settle()


class ThreadPipeline(EnvSteps):
    """The same steps and updates as :class:`EnvSteps`, with the steps made by the pipeline's worker
    thread while the learner updates."""

    def __init__(self, trainer: Parts) -> None:
        super().__init__(trainer)
        config = trainer.config
        self.pipeline = Pipeline(
            trainer.worker,
            cast("OffPolicy", trainer.algorithm),  # an off-policy run's (choose_collection)
            queue_size=config.pipeline_queue,
            sync_every=config.sync_every,
            steps=trainer.state.steps,
            total_steps=config.total_steps,
            learning_starts=replay_settings(config.hyperparameters).learning_starts,
            updates=trainer.learner.updates,
            steps_per_transition=trainer.step_size,
        )

    def iterate(self) -> Metrics:
        return self.consume(self.pipeline.next())

    def consume(self, step: Step) -> Metrics:
        self.policy_lags.append(self.trainer.learner.updates - step.version)
        return self.learn_from(step.transition)

    def after_update(self) -> None:
        self.pipeline.after_update(self.trainer.learner.updates)

    @contextlib.contextmanager
    def drained(self) -> Iterator[None]:
        """The worker paused, every step it made consumed.

        In a group every learner drains to the same env step (the furthest any worker got), so that
        they all make the same updates; every learner must call it at the same point of the loop.
        """
        self.settle()
        if not self.pipeline.alive:
            yield
            return
        steps = self.pipeline.drain()
        group = self.trainer.group
        if group is not None:
            furthest = group.maximum(self.pipeline.produced)
            if self.pipeline.produced < furthest:
                steps += self.pipeline.drain(until=furthest)
        for step in steps:
            self.consume(step)
        try:
            yield
        finally:
            self.pipeline.resume()

    def close(self) -> None:
        self.pipeline.stop()


def choose_collection(trainer: Parts) -> Collection:
    """The strategy for ``trainer``'s algorithm and config (once, when training starts)."""
    if trainer.algorithm.on_policy:
        return Rollouts(trainer)
    if not trainer.config.pipeline:
        return EnvSteps(trainer)
    steps_in_processes = isinstance(trainer.env.unwrapped, ProcessVecEnv) and trainer.worker.halves is None
    return ProcessPipeline(trainer) if steps_in_processes else ThreadPipeline(trainer)


# -- the agreement on stopping ---------------------------------------------------------------------
class Agreement:
    """A single run: Ctrl+C and the hooks' stop requests are its own to act on."""

    def __call__(self, stop: bool, interrupted: bool) -> tuple[bool, bool]:
        """After an iteration: whether to ``stop`` (a hook asked) and whether Ctrl+C came, as agreed."""
        return stop, interrupted


class GroupAgreement(Agreement):
    """A learner of a data-parallel group: the learners merge their new observation and reward statistics
    (the same bits on all), then agree on one verdict, the strongest any of them has (Ctrl+C before a
    hook's stop, which only learner 0's hooks request, before going on)."""

    GO_ON, STOP, INTERRUPTED = 0, 1, 2

    def __init__(self, group: LearnerGroup, synchronise_statistics: Callable[[], None]) -> None:
        self.group = group
        self.synchronise_statistics = synchronise_statistics

    def __call__(self, stop: bool, interrupted: bool) -> tuple[bool, bool]:
        self.synchronise_statistics()
        verdict = self.group.maximum(self.INTERRUPTED if interrupted else self.STOP if stop else self.GO_ON)
        return verdict == self.STOP, verdict == self.INTERRUPTED
