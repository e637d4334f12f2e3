"""train(config): environment -> worker -> learner -> evaluator, with logging, checkpoints and resume.

By default the loop is synchronous: the worker collects a rollout (or one VecEnv step, off-policy),
the learner updates on it, and every ``eval_every`` steps the evaluator runs the deterministic policy;
every step of it stays on the device except the scalars that are logged. With ``pipeline`` (off-policy
only) the worker steps the envs in its own thread and the loop consumes its steps
(:mod:`phalanx.train.pipeline`). With ``num_learners > 1`` the loop runs in every learner of a
data-parallel group (:mod:`phalanx.train.learner`), each on its own env shard, in lockstep: ``steps``
counts the env steps of all the learners, learner 0 evaluates, logs and checkpoints, and the learners
agree after every iteration whether to stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from phalanx import registry
from phalanx.algos.base import Algorithm
from phalanx.buffers import ReplayBuffer, RolloutBuffer
from phalanx.config import TrainConfig, save_yaml
from phalanx.envs.core import as_device
from phalanx.envs.workers import ProcessVecEnv
from phalanx.envs.wrappers import (
    NormalizeObservation,
    ScaleReward,
    find_wrapper,
)
from phalanx.errors import CheckpointError, ConfigError
from phalanx.files import write_text_atomic
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.environments import (
    EVAL_SEED_OFFSET,
    build_env,
    picklable_factory,
    space_spec,
    to_device,
)
from phalanx.train.evaluator import Evaluation, EvaluationProcess, Evaluator
from phalanx.train.interrupts import Insisted, deferred_interrupts
from phalanx.train.learner import (
    Learner,
    LearnerGroup,
    StatisticsSync,
    available_cores,
    check_learners,
    join_launched_group,
    launch_learners,
    launched_by_torchrun,
)
from phalanx.train.logging import RunLogger, Stopwatch, plot_curve
from phalanx.train.pipeline import Pipeline, Step
from phalanx.train.run_dir import create_run_dir, read_run_config, resumable_state
from phalanx.train.worker import Transition, Worker

_REACHED, _INTERRUPTED = 1, 2  # what the learners of a group agree on after every iteration
INSISTED = "a second Ctrl+C stopped the run at once, unsaved: resume goes on from its latest checkpoint"


@dataclass
class TrainResult:
    run_dir: Path
    summary: dict[str, Any]


# -- the trainer --------------------------------------------------------------------------------
class Trainer:
    """Owns one run: its envs, algorithm, worker, learner, evaluator, logger and checkpoints.

    In a data-parallel ``group`` it is one learner's share of the run: its own env shard, worker,
    buffer and pipeline; only learner 0 has the evaluator, the logger and the run directory's files.
    """

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path | None = None,
        show_progress: bool = True,
        group: LearnerGroup | None = None,
    ) -> None:
        config.validate()
        config = self.config = dataclasses.replace(config)  # the caller's config stays as it was
        self.group = group
        self.is_main = group is None or group.is_main
        self.device = group.device if group is not None else as_device(config.device)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)

        # Everything that can fail on bad input happens before the run directory is created; the envs
        # (and their worker processes) are closed if any of it fails.
        self.env = self.eval_env = None
        self.evaluator: Evaluator | EvaluationProcess | None = None  # learner 0's
        self.eval_process: EvaluationProcess | None = None  # the evaluator, when it is a process
        self.pipeline: Pipeline | None = None
        # Ctrl+C (or a population's request) to stop at the loop's next safe point (train.interrupts)
        self.stop_requested = group.interrupted if group is not None else threading.Event()
        if group is None and config.num_learners > 1:
            raise ConfigError(
                f"num_learners = {config.num_learners}: a Trainer is one learner. Start the group with "
                "phalanx.train(config) or `phalanx train ... --learners N`, which launch one process per "
                "learner (or with torchrun, see docs/parallelism.md)."
            )
        if config.pipeline and registry.get_algorithm(config.algo).on_policy:
            raise ConfigError(
                f"pipeline = True is for the off-policy algorithms (dqn, ddpg, td3, sac, ...), but "
                f"{config.algo} is on-policy: its update needs the rollout its own policy collected, so a "
                "worker running ahead would bias it. Drop --pipeline; for on-policy runs, --overlap with "
                "--num-workers overlaps the env and the policy instead."
            )
        try:
            self._build(config, run_dir, show_progress)
        except BaseException:
            self.close()
            raise

    def _build(self, config: TrainConfig, run_dir: Path | None, show_progress: bool) -> None:
        group = self.group
        world = group.world_size if group is not None else 1
        rank = group.rank if group is not None else 0
        self.env = build_env(config, config.num_envs, training=True)
        if self.is_main and config.eval_process:  # it starts while the rest is built
            envs = picklable_factory(config.env, "eval_process evaluates in a process of its own", "drop it")
            self.evaluator = self.eval_process = EvaluationProcess(
                config, seed=config.seed + EVAL_SEED_OFFSET, envs=envs
            )
        algorithm_class = registry.get_algorithm(config.algo)
        raw_env = self.env.unwrapped  # name the env's own spaces in errors, not the rescaled ones
        algorithm_class.check_spaces(raw_env.single_observation_space, raw_env.single_action_space)
        normalizer = find_wrapper(self.env, NormalizeObservation)
        self.obs_statistics = normalizer.statistics if normalizer is not None else None
        if self.is_main and self.eval_process is None:
            self.eval_env = build_env(
                config, config.eval_episodes, training=False, obs_statistics=self.obs_statistics
            )
        self.algorithm: Algorithm = algorithm_class(
            config.hyperparameters,
            self.env.single_observation_space,
            self.env.single_action_space,
            self.device,
        )
        self.statistics_syncs: list[StatisticsSync] = []
        if group is not None:
            # The same initial weights everywhere (learner 0's), then each learner its own samples.
            self.algorithm.load_state_dict(group.broadcast(self.algorithm.state_dict()))
            self.algorithm.group = group
            torch.manual_seed(config.seed + rank)
            scaler = find_wrapper(self.env, ScaleReward)
            for statistics in (self.obs_statistics, scaler.statistics if scaler is not None else None):
                if statistics is not None:
                    self.statistics_syncs.append(StatisticsSync(group, statistics))
        self.step_size = config.num_envs * world  # env steps of one VecEnv step of every learner
        # The env's own action bounds, so that a deployed agent maps [-1, 1] back to them.
        self.spaces = space_spec(self.env.single_observation_space, raw_env.single_action_space)
        self.buffer = self.make_buffer()
        self.worker = Worker(self.env, self.algorithm)
        self.learner = Learner(self.algorithm, self.buffer)
        if self.eval_env is not None:
            self.evaluator = Evaluator(self.eval_env, seed=config.seed + EVAL_SEED_OFFSET)
        self.open_run(run_dir, show_progress)
        self.worker.reset(seed=config.seed + rank * config.num_envs)  # each learner its own sub-env seeds
        self.sync_statistics()

    def open_run(self, run_dir: Path | None, show_progress: bool) -> None:
        """The run directory, its checkpoints and the loop's counters: the last step of building a
        trainer, once everything that can fail on bad input has been built."""
        config, group = self.config, self.group
        if self.is_main:
            self.run_dir = run_dir if run_dir is not None else create_run_dir(config)
        if group is not None:
            self.run_dir = Path(group.broadcast(str(self.run_dir) if self.is_main else None))
        self.config.run_dir = str(self.run_dir)
        self.checkpoints = CheckpointManager(self.run_dir, keep=config.keep_checkpoints)
        self.show_progress = show_progress and self.is_main

        self.steps = 0
        self.wall_offset = 0.0
        self.stopwatch = Stopwatch()  # restarted by each train(), from wall_offset
        self.time_to_stop_return: float | None = None
        self.last_evaluation: Evaluation | None = None
        self.last_evaluation_step = -1
        self.next_eval = config.eval_every if config.eval_every else math.inf
        self.eval_copies: dict[int, dict[str, Any]] = {}  # evaluation process: {steps: agent} sent to it
        self.next_checkpoint = config.checkpoint_every if config.checkpoint_every else math.inf
        self.next_log = 0
        self.updates_owed = 0.0  # off-policy: fractional gradient steps carried to the next env step
        self.updates_due = 0  # off-policy: gradient steps owed to the steps stored, not made yet
        self.received: Transition | None = None  # process pipeline: the last step made, stored next
        self.progress = 0.0  # the fraction of the budget spent when the last step was stored

    def make_buffer(self) -> RolloutBuffer | ReplayBuffer:
        """The rollout or replay buffer the hyperparameters ask for."""
        config, hp = self.config, self.config.hyperparameters
        buffer_shapes = (
            self.env.single_observation_space.shape,
            self.env.single_action_space.shape,
            torch.int64 if isinstance(self.env.single_action_space, gym.spaces.Discrete) else torch.float32,
            self.device,
        )
        if self.algorithm.on_policy:
            return RolloutBuffer(hp.horizon, config.num_envs, *buffer_shapes)
        return ReplayBuffer(hp.buffer_size, config.num_envs, *buffer_shapes)

    @property
    def update_threshold(self) -> int:
        """Off-policy: updates start once the buffer holds the warm-up (and enough steps for n-step
        returns); a learner of a group holds its share of the warm-up."""
        config, hp = self.config, self.config.hyperparameters
        world = self.group.world_size if self.group is not None else 1
        return max(math.ceil(hp.learning_starts / world), config.num_envs * hp.n_step)

    def adopt(
        self,
        agent: dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        steps: int | None = None,
    ) -> None:
        """Population-based training: take another run's ``agent`` (an :meth:`agent_state`: networks,
        optimiser state, observation statistics) and/or new ``hyperparameters``, and go on training.

        This run keeps its own envs, buffer and RNG, and its progress unless ``steps`` is given (a new
        member spawned from another takes its step count, and its schedules go on from there). The
        algorithm is rebuilt from the new hyperparameters, so every one of them takes effect, also those
        an algorithm reads only when it is built; the learning rates are the new ones, not those in the
        optimiser state. A change of the networks' shapes (hidden_sizes) cannot carry the weights.
        """
        if self.group is not None:
            raise ConfigError("adopt() is for single-learner runs; a population member has one learner.")
        config = self.config
        if hyperparameters:
            candidate = dataclasses.replace(
                config, hyperparameters=dataclasses.replace(config.hyperparameters, **hyperparameters)
            )
            candidate.validate()
            config.hyperparameters = candidate.hyperparameters
        old = self.algorithm
        algorithm = self.new_algorithm()
        learning_rates = _learning_rates(algorithm)  # from the new hyperparameters
        state = agent["algorithm"] if agent is not None else old.state_dict()
        try:
            algorithm.load_state_dict(to_device(state, self.device))
        except (RuntimeError, KeyError, ValueError) as error:
            raise ConfigError(
                f"cannot carry the agent's weights into {config.algo} with hyperparameters "
                f"{hyperparameters}: {str(error).splitlines()[0]}. Hyperparameters that change the "
                "networks' shapes (hidden_sizes) cannot be changed while training goes on."
            ) from None
        for name, optimizer in algorithm.optimizers().items():
            for group, rate in zip(optimizer.param_groups, learning_rates[name], strict=True):
                group["lr"] = rate
        self.algorithm = self.worker.algorithm = self.learner.algorithm = algorithm
        if agent is not None and agent.get("obs_statistics") is not None and self.obs_statistics is not None:
            self.obs_statistics.load_state_dict(to_device(agent["obs_statistics"], self.device))
        if self.algorithm.on_policy and self.buffer.horizon != config.hyperparameters.horizon:
            self.buffer = self.learner.buffer = self.make_buffer()  # it holds nothing between rollouts
        elif not self.algorithm.on_policy and self.buffer.slots != max(
            config.hyperparameters.buffer_size // config.num_envs, 1
        ):
            raise ConfigError(
                "buffer_size cannot change while training goes on: the replay buffer holds this run's "
                "experience. Leave it out of the mutations."
            )
        if steps is not None:
            self.steps = self.next_log = steps
            self.next_eval = steps + config.eval_every if config.eval_every else math.inf
            self.next_checkpoint = steps + config.checkpoint_every if config.checkpoint_every else math.inf

    def new_algorithm(self) -> Algorithm:
        """A new algorithm for this run's spaces, built from the current hyperparameters (``adopt``)."""
        old = self.algorithm
        return registry.get_algorithm(self.config.algo)(
            self.config.hyperparameters, old.observation_space, old.action_space, self.device
        )

    @property
    def env_steps_in_processes(self) -> bool:
        """Whether the training env steps in worker processes (one batch; not double buffered)."""
        return isinstance(self.env.unwrapped, ProcessVecEnv) and self.worker.halves is None

    def sync_statistics(self) -> None:
        """In a group: merge every learner's new observation and reward statistics (the same bits on all)."""
        for sync in self.statistics_syncs:
            sync()

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**self.agent_state(), **self.shard_state()}

    def shard_state(self) -> dict[str, Any]:
        """What is this learner's own: its envs, the worker's last observations, the RNG, the buffer."""
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        shard = {"env": self.env.state_dict(), "worker": self.worker.state_dict(), "rng": rng}
        if self.config.save_buffer:
            shard["buffer"] = self.buffer.state_dict()
        return shard

    def agent_state(self) -> dict[str, Any]:
        """What every learner has the same of: the config, the agent (weights, optimisers, observation
        statistics) and the run's progress; enough to deploy the agent (``phalanx eval``)."""
        return {
            "config": self.config.to_dict(),
            "spaces": self.spaces,
            "algorithm": self.algorithm.state_dict(),
            "obs_statistics": self.obs_statistics.state_dict() if self.obs_statistics is not None else None,
            "progress": {
                "steps": self.steps,
                "updates": self.learner.updates,
                "wall_time_s": self.stopwatch(),
                "best_eval_return": self.evaluator.best_return,
                "best_eval_steps": self.evaluator.best_steps,
                "time_to_stop_return_s": self.time_to_stop_return,
                "next_eval": self.next_eval,
                "next_checkpoint": self.next_checkpoint,
                "next_log": self.next_log,
                "updates_owed": self.updates_owed,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.algorithm.load_state_dict(state["algorithm"])
        self.env.load_state_dict(state["env"])
        self.worker.load_state_dict(to_device(state["worker"], self.device))
        torch.set_rng_state(state["rng"]["torch"])
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        progress = state["progress"]
        self.steps = progress["steps"]
        self.learner.updates = progress["updates"]
        self.wall_offset = progress["wall_time_s"]
        if self.evaluator is not None:
            self.evaluator.best_return = progress["best_eval_return"]
            self.evaluator.best_steps = progress.get("best_eval_steps")  # absent before it was saved
        self.time_to_stop_return = progress["time_to_stop_return_s"]
        self.next_eval = progress["next_eval"]
        self.next_checkpoint = progress["next_checkpoint"]
        self.next_log = progress["next_log"]
        self.updates_owed = progress["updates_owed"]
        if "buffer" in state:
            self.buffer.load_state_dict(state["buffer"])
        for sync in self.statistics_syncs:
            sync.rebase()

    def load_group_state(self, state: dict[str, Any] | None) -> None:
        """In a group, resume from a checkpoint's ``state``, which learner 0 passes (None on the others):
        it sends each learner the agent with that learner's own shard."""
        states = None
        if self.is_main:
            shards = [{}] + state.pop("learner_shards", [])
            if len(shards) != self.group.world_size:
                raise CheckpointError(
                    f"the checkpoint holds the shards of {len(shards)} learner(s), but this group has "
                    f"{self.group.world_size}. Resume with --learners {len(shards)}."
                )
            states = [{**state, **shard} for shard in shards]
        self.load_state_dict(to_device(self.group.scatter(states), self.device))

    def save(self) -> Path | None:
        """Checkpoint the run (learner 0 writes it, with every learner's shard); returns its path."""
        with self.pipeline_drained():
            if self.group is None:
                return self.checkpoints.save(self.steps, self.state_dict())
            shards = self.group.gather(self.shard_state())
            if not self.is_main:
                return None
            return self.checkpoints.save(self.steps, {**self.state_dict(), "learner_shards": shards[1:]})

    @contextlib.contextmanager
    def pipeline_drained(self) -> Any:
        """With a pipeline, a quiet state to save: the worker paused, every step it made consumed.

        In a group every learner drains to the same env step (the furthest any worker got), so that
        they all make the same updates; every learner must call it at the same point of the loop.
        """
        if self.pipeline is None:
            self.store_received()
        self.settle()
        if self.pipeline is None or not self.pipeline.alive:
            yield
            return
        steps = self.pipeline.drain()
        if self.group is not None:
            furthest = self.group.maximum(self.pipeline.produced)
            if self.pipeline.produced < furthest:
                steps += self.pipeline.drain(until=furthest)
        for step in steps:
            self.consume(step)
        try:
            yield
        finally:
            self.pipeline.resume()

    def close(self) -> None:
        """Close the envs (and stop their worker processes); the run directory stays as it is.

        In a group the learners may close at different times: nothing here waits for the others."""
        for env in (self.env, self.eval_env):
            if env is not None:
                env.close()
        if self.eval_process is not None:
            self.eval_process.close()

    # -- the loop --------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Train to ``total_steps`` (or ``stop_return``); a pipeline's worker thread ends with the loop."""
        if self.eval_process is not None:
            self.eval_process.wait_ready()  # its start is part of building the run, not of training
        try:
            # a group's learner process routes SIGINT to the group's event from its start
            interrupts = (
                deferred_interrupts(self.stop_requested) if self.group is None else contextlib.nullcontext()
            )
            with interrupts:
                return self._train()
        finally:
            self.wall_offset = self.stopwatch()  # a later train() (a population's next interval) goes on
            if self.pipeline is not None:
                self.pipeline.stop()

    def _train(self) -> TrainResult:
        config = self.config
        if self.is_main:  # the run's files and TensorBoard's writer are set up before the clock starts
            save_yaml(config, self.run_dir / "config.yaml")
            self.logger = RunLogger(self.run_dir, config.total_steps, self.steps, self.show_progress)
        self.stopwatch = Stopwatch(self.wall_offset)
        iterate = self.on_policy_iteration if self.algorithm.on_policy else self.off_policy_iteration
        if config.pipeline and self.env_steps_in_processes:
            iterate = self.process_pipelined_iteration
        elif config.pipeline:
            hp = config.hyperparameters
            self.pipeline = Pipeline(
                self.worker,
                self.algorithm,
                queue_size=config.pipeline_queue,
                sync_every=config.sync_every,
                steps=self.steps,
                total_steps=config.total_steps,
                learning_starts=hp.learning_starts,
                updates=self.learner.updates,
                steps_per_transition=self.step_size,
            )
            iterate = self.pipelined_iteration
        self.policy_lags: list[int] = []
        metrics: dict[str, Any] = {}
        reached = False
        try:
            last_time, last_steps, last_updates = self.stopwatch(), self.steps, self.learner.updates
            while self.steps < config.total_steps and not reached:
                metrics = iterate() or metrics

                if self.steps >= self.next_eval:
                    while self.next_eval <= self.steps:
                        self.next_eval += config.eval_every
                    if self.is_main and self.eval_process is None:
                        self.log_evaluation(self.evaluate())
                    elif self.is_main:
                        self.send_copy()
                if self.is_main:
                    if self.eval_process is not None:
                        self.poll_evaluation()
                    reached = self.reached_stop_return()
                # The safe point where Ctrl+C stops the run: every update of the iteration made, whole.
                interrupted = self.stop_requested.is_set()
                if self.group is not None:  # every learner stops at the same step, or none does
                    self.sync_statistics()
                    verdict = self.group.maximum(_INTERRUPTED if interrupted else int(reached))
                    interrupted, reached = verdict == _INTERRUPTED, verdict == _REACHED
                if interrupted:
                    self.stop_requested.clear()  # acted on: a later train() goes on
                    raise KeyboardInterrupt
                if not self.is_main:
                    while self.next_log <= self.steps:
                        self.next_log += config.log_every
                elif self.steps >= self.next_log:
                    now = self.stopwatch()
                    elapsed = max(now - last_time, 1e-9)
                    row = {
                        "steps": self.steps,
                        "wall_time_s": now,
                        "steps_per_second": (self.steps - last_steps) / elapsed,
                        "updates": self.learner.updates,
                        "updates_per_second": (self.learner.updates - last_updates) / elapsed,
                        **self.worker.episodes.read(),
                        **self.read_policy_lag(),
                        **metrics,
                    }
                    self.logger.log(row)
                    last_time, last_steps, last_updates = now, self.steps, self.learner.updates
                    while self.next_log <= self.steps:
                        self.next_log += config.log_every
                if self.steps >= self.next_checkpoint:
                    if self.is_main:  # the rows up to the checkpoint are on disk when it is
                        self.logger.sync()
                    self.save()
                    while self.next_checkpoint <= self.steps:
                        self.next_checkpoint += config.checkpoint_every
        except Insisted:  # a second Ctrl+C before the safe point: the state may be half-updated
            if self.is_main:
                self.logger.close()
                self.write_summary(interrupted=True, error=INSISTED)
            raise
        except KeyboardInterrupt:
            if self.is_main:
                self.logger.close()
            path = self.save()  # a pipeline drains first: the steps its worker made are learned from
            if self.is_main:
                self.write_summary(interrupted=True)
            raise TrainingInterrupted(self.run_dir, self.steps, path) from None
        except BaseException as error:
            # Whatever stops the run, what it wrote stays: the logs, the checkpoints saved so far, and
            # a summary that names the error (no checkpoint of a state that may be corrupt, e.g. NaN).
            if self.is_main:
                self.logger.close()
                self.write_summary(interrupted=False, error=f"{type(error).__name__}: {error}")
            raise

        self.store_received()  # the process pipeline's last step
        self.settle()  # and its updates
        if not self.is_main:
            self.save()
            return TrainResult(self.run_dir, {})
        if self.eval_process is not None and not reached:  # the evaluations under way, the final weights'
            self.poll_evaluation(wait=True)
            if self.last_evaluation_step != self.steps and not self.reached_stop_return():
                self.send_copy()
                self.poll_evaluation(wait=True)
        elif self.last_evaluation_step != self.steps and not reached:
            self.log_evaluation(self.evaluate())
        self.save()
        self.logger.close()
        plot_curve(self.run_dir, f"{config.algo.upper()} on {config.env}")
        summary = self.write_summary(interrupted=False)
        if self.show_progress:
            self.logger.summary_table(summary)
        return TrainResult(self.run_dir, summary)

    def on_policy_iteration(self) -> dict[str, torch.Tensor]:
        """Collect a rollout of horizon steps of every sub-env, then learn from it."""
        self.worker.collect(self.buffer)
        self.steps += self.config.hyperparameters.horizon * self.step_size
        return self.learner.update(progress=min(self.steps / self.config.total_steps, 1.0))

    def off_policy_iteration(self) -> dict[str, torch.Tensor]:
        """One step of every sub-env into the replay buffer, then num_envs * updates_per_step updates."""
        hp = self.config.hyperparameters
        return self.learn_from(self.worker.transition(self.steps, random=self.steps < hp.learning_starts))

    def pipelined_iteration(self) -> dict[str, torch.Tensor]:
        """The same as :meth:`off_policy_iteration`, with the step made by the pipeline's worker thread."""
        return self.consume(self.pipeline.next())

    def consume(self, step: Step) -> dict[str, torch.Tensor]:
        self.policy_lags.append(self.learner.updates - step.version)
        return self.learn_from(step.transition)

    def learn_from(self, transition: Transition) -> dict[str, torch.Tensor]:
        """Store one VecEnv step, then make the updates it is owed (the update-to-data ratio)."""
        self.store(transition)
        return self.settle()

    def store(self, transition: Transition) -> None:
        """Store one VecEnv step and add the updates it is owed to :attr:`updates_due`."""
        hp = self.config.hyperparameters
        self.progress = min(self.steps / self.config.total_steps, 1.0)
        self.worker.store(self.buffer, transition)
        self.steps += self.step_size
        if len(self.buffer) < self.update_threshold:
            return
        self.updates_owed += self.config.num_envs * hp.updates_per_step
        updates = int(self.updates_owed)
        self.updates_owed -= updates
        if hp.max_updates_per_step is not None:
            updates = min(updates, hp.max_updates_per_step)
        self.updates_due += updates

    def settle(self) -> dict[str, torch.Tensor]:
        """Make the updates due; the metrics of the last one ({} if none was due)."""
        metrics: dict[str, torch.Tensor] = {}
        while self.updates_due:
            metrics = self.learner.update(self.progress)
            self.updates_due -= 1
            if self.pipeline is not None:
                self.pipeline.after_update(self.learner.updates)
        return metrics

    def process_pipelined_iteration(self) -> dict[str, torch.Tensor]:
        """The pipeline when the envs step in worker processes: while they make step k, the learner
        stores step k - 1 and makes the updates it is owed; step k is stored in the next iteration.

        The same env steps and updates as :meth:`off_policy_iteration`, each update one VecEnv step
        later: the actions of a step are those of the weights before the previous step's updates.
        :attr:`steps` counts the steps stored, so the last step is sent only while the budget lasts.
        """
        hp = self.config.hyperparameters
        previous = self.received  # cleared just before it is stored: Ctrl+C in send() loses nothing
        if previous is not None and self.steps + self.step_size >= self.config.total_steps:
            self.received = None
            self.store(previous)  # the budget's last step: nothing left to send
            return self.settle()
        sent_at = self.steps + (self.step_size if previous is not None else 0)
        self.worker.send(sent_at, random=sent_at < hp.learning_starts)
        if previous is not None:
            self.received = None
            self.store(previous)
        before = self.learner.updates
        metrics = self.settle()
        self.received = self.worker.receive()
        self.policy_lags.append(self.learner.updates - before)
        return metrics

    def store_received(self) -> None:
        """Process pipeline: store the step received and not yet stored, then the step in flight if
        there is one (sent when Ctrl+C came), in the order they were made."""
        previous, self.received = self.received, None
        if previous is not None:
            self.store(previous)
        if self.worker.in_flight:
            self.store(self.worker.receive())

    def read_policy_lag(self) -> dict[str, float]:
        """Pipeline: mean and max policy lag (in updates) of the steps consumed since the last read."""
        if not self.policy_lags:
            return {}
        lags, self.policy_lags = self.policy_lags, []
        return {"policy_lag_mean": sum(lags) / len(lags), "policy_lag_max": float(max(lags))}

    def evaluate(self) -> dict[str, float]:
        """Evaluate the current weights in this process (no evaluation process)."""
        wall_time = self.stopwatch()
        return self.record_evaluation(self.steps, wall_time, self.evaluator.evaluate(self.algorithm))

    def log_evaluation(self, row: dict[str, float]) -> None:
        """An evaluation's row in evaluations.csv and TensorBoard, at the step of the weights evaluated."""
        self.reached_stop_return()
        self.logger.log_evaluation({**row, "result_wall_time_s": self.stopwatch()})

    def send_copy(self) -> None:
        """Evaluation process: send it a CPU copy of the agent now (kept, to be the best checkpoint if its
        evaluation is the best)."""
        agent = to_device(self.evaluated_agent_state(), torch.device("cpu"), copy=True)
        self.eval_process.submit(self.steps, {key: agent[key] for key in ("algorithm", "obs_statistics")})
        self.eval_copies[self.steps] = agent

    def poll_evaluation(self, wait: bool = False) -> None:
        """Evaluation process: record and log its results that have arrived (``wait``: all), in step order,
        up to the first that reaches stop_return (training stops there)."""
        results = self.eval_process.wait() if wait else self.eval_process.poll()
        for steps, evaluation in results:
            if not self.reached_stop_return():
                wall_time = self.eval_copies[steps]["progress"]["wall_time_s"]
                self.log_evaluation(self.record_evaluation(steps, wall_time, evaluation))
        for steps in [steps for steps in self.eval_copies if steps not in self.eval_process.outstanding]:
            del self.eval_copies[steps]  # evaluated, or skipped for newer ones

    def evaluated_agent_state(self) -> dict[str, Any]:
        """The agent as it is evaluated now (a pipeline's worker thread paused, its steps consumed)."""
        if self.group is not None:  # learner 0 alone: no drain (a collective); no statistics move then
            return self.agent_state()
        with self.pipeline_drained():  # the worker thread would move the observation statistics
            return self.agent_state()

    def record_evaluation(self, steps: int, wall_time: float, evaluation: Evaluation) -> dict[str, float]:
        """Take an evaluation of the weights of step ``steps`` (taken ``wall_time`` seconds into the run); a
        new best is saved as the best checkpoint. Returns its row of evaluations.csv."""
        self.last_evaluation = evaluation
        self.last_evaluation_step = steps
        if self.evaluator.is_best(evaluation, steps):
            if self.eval_process is not None:
                agent = self.eval_copies[steps]
                agent["progress"].update(best_eval_return=evaluation.mean, best_eval_steps=steps)
                self.checkpoints.save_best(agent)
            else:
                self.checkpoints.save_best(self.evaluated_agent_state())
        return {
            "steps": steps,
            "wall_time_s": wall_time,
            "eval_return_mean": evaluation.mean,
            "eval_return_std": evaluation.std,
            "eval_length_mean": sum(evaluation.lengths) / len(evaluation.lengths),
        }

    def reached_stop_return(self) -> bool:
        stop = self.config.stop_return
        if stop is None or self.last_evaluation is None or self.last_evaluation.mean < stop:
            return False
        if self.time_to_stop_return is None:
            self.time_to_stop_return = self.stopwatch()
            self.logger.message(
                f"reached stop_return {stop:g}: eval return {self.last_evaluation.mean:.1f} of the weights "
                f"of step {self.last_evaluation_step:,} (result in at step {self.steps:,}, after "
                f"{self.time_to_stop_return:.1f} s)"
            )
        return True

    def write_summary(self, interrupted: bool, error: str | None = None) -> dict[str, Any]:
        wall = self.stopwatch()
        evaluation = self.last_evaluation
        summary = {
            "env": self.config.env,
            "algo": self.config.algo,
            "seed": self.config.seed,
            "num_envs": self.config.num_envs,
            "device": str(self.device),
            "total_steps": self.steps,
            "updates": self.learner.updates,
            "wall_time_s": wall,
            "steps_per_second": self.steps / max(wall, 1e-9),
            "stop_return": self.config.stop_return,
            "time_to_stop_return_s": self.time_to_stop_return,
            "eval_return_mean": evaluation.mean if evaluation else None,
            "eval_return_std": evaluation.std if evaluation else None,
            "eval_episodes": len(evaluation.returns) if evaluation else 0,
            "eval_steps": self.last_evaluation_step if evaluation else None,
            "best_eval_return": self.evaluator.best_return if evaluation else None,
            "best_eval_steps": self.evaluator.best_steps if evaluation else None,
            "buffer_bytes": self.buffer.nbytes,
            "interrupted": interrupted,
            "error": error,
            "run_dir": str(self.run_dir),
            "latest_checkpoint": str(self.checkpoints.latest()) if self.checkpoints.latest() else None,
            **self.extra_summary(),
        }
        write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        return summary

    def extra_summary(self) -> dict[str, Any]:
        """Fields a kind of run adds to summary.json (a multi-agent run: per-agent returns)."""
        return {}


def trainer_class(config: TrainConfig) -> type[Trainer]:
    """The Trainer that runs ``config``'s algorithm (the multi-agent algorithms name their own)."""
    return registry.trainer_class(config.algo)


class TrainingInterrupted(Exception):
    """Ctrl+C during training: a checkpoint was saved; the run can be resumed."""

    def __init__(self, run_dir: Path, steps: int, checkpoint: Path) -> None:
        super().__init__(
            f"interrupted at step {steps:,}; checkpoint saved to {checkpoint}. "
            f"Continue with `phalanx resume {run_dir}`."
        )
        self.run_dir = run_dir
        self.steps = steps
        self.checkpoint = checkpoint


def train(
    config: TrainConfig, show_progress: bool = True, on_run_dir: Callable[[Path], None] | None = None
) -> TrainResult:
    """Train ``config`` in a new run directory; return the run directory and the summary.

    With ``num_learners > 1`` this starts one process per learner and waits for them; under torchrun
    this process is one learner of the group torchrun started. ``on_run_dir`` is told the run
    directory as soon as it exists.
    """
    if launched_by_torchrun():
        return _train_in_launched_group(config, show_progress, on_run_dir)
    if config.num_learners > 1:
        return _launch(config, show_progress, on_run_dir)
    trainer = trainer_class(config)(config, show_progress=show_progress)
    if on_run_dir is not None:
        on_run_dir(trainer.run_dir)
    try:
        return trainer.train()
    finally:
        trainer.close()


def resume(run_dir: str | Path, total_steps: int | None = None, show_progress: bool = True) -> TrainResult:
    """Continue a run from its latest checkpoint, optionally with a larger ``total_steps``."""
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    state = None
    if not launched_by_torchrun() or os.environ["RANK"] == "0":  # under torchrun, learner 0 reads it
        state = resumable_state(run_dir, config, total_steps)
    if total_steps is not None:
        config.total_steps = total_steps
    if launched_by_torchrun():
        return _train_in_launched_group(config, show_progress, None, run_dir=run_dir, state=state)
    if config.num_learners > 1:
        del state  # learner 0 reads it again and sends each learner its shard
        return _launch(config, show_progress, None, run_dir=run_dir)
    trainer = trainer_class(config)(config, run_dir=run_dir, show_progress=show_progress)
    try:
        trainer.load_state_dict(state)
        return trainer.train()
    finally:
        trainer.close()


# -- data-parallel learners ------------------------------------------------------------------------
def _launch(
    config: TrainConfig,
    show_progress: bool,
    on_run_dir: Callable[[Path], None] | None,
    run_dir: Path | None = None,
) -> TrainResult:
    """Start ``config.num_learners`` learner processes on this machine and wait for them."""
    config.validate()
    check_learners(config.num_learners, config.device)
    payload = {
        "config": config.to_dict(),
        "run_dir": str(run_dir) if run_dir is not None else None,
        "show_progress": show_progress,
        "envs": picklable_factory(
            config.env, "num_learners > 1 starts a process per learner", "use --learners 1"
        ),  # an id the caller registered exists in the learners too
    }

    def on_report(kind: str, value: Any) -> None:
        if kind == "run_dir" and on_run_dir is not None:
            on_run_dir(Path(value))

    outcome = launch_learners(
        _learner_entry, payload, config.num_learners, config.device, config.learner_timeout, on_report
    )
    if outcome.kind == "interrupted":
        run, steps, checkpoint = outcome.value
        raise TrainingInterrupted(Path(run), steps, Path(checkpoint))
    run, summary = outcome.value
    return TrainResult(Path(run), summary)


def _learner_entry(group: LearnerGroup, payload: dict[str, Any], report: Callable[[str, Any], None]) -> None:
    """One learner process started by :func:`_launch`."""
    from phalanx.envs.registry import register_env

    for env_id, factory in payload["envs"].items():
        register_env(env_id, factory, overwrite=True)
    config = TrainConfig.from_dict(payload["config"], where="the learner's config")
    if not config.torch_threads and group.device.type == "cpu":  # the learners share the cores
        config.torch_threads = max(1, available_cores() // group.world_size)
    run_dir = Path(payload["run_dir"]) if payload["run_dir"] else None
    try:
        result = _run_learner(
            group, config, run_dir, payload["show_progress"], lambda path: report("run_dir", str(path))
        )
    except TrainingInterrupted as interrupted:
        if group.is_main:
            report("interrupted", (str(interrupted.run_dir), interrupted.steps, str(interrupted.checkpoint)))
        return
    if group.is_main:
        report("finished", (str(result.run_dir), result.summary))


def _train_in_launched_group(
    config: TrainConfig,
    show_progress: bool,
    on_run_dir: Callable[[Path], None] | None,
    run_dir: Path | None = None,
    state: dict[str, Any] | None = None,
) -> TrainResult:
    """This process is one learner of a group torchrun started (RANK, WORLD_SIZE, ... are set)."""
    world = int(os.environ["WORLD_SIZE"])
    if config.num_learners not in (1, world):
        raise ConfigError(
            f"num_learners = {config.num_learners}, but torchrun started {world} learner process(es) "
            f"(WORLD_SIZE). Drop --learners under torchrun, or pass --learners {world}."
        )
    config = dataclasses.replace(config, num_learners=world)
    config.validate()
    group = join_launched_group(config.device, config.learner_timeout)
    try:
        result = _run_learner(group, config, run_dir, show_progress, on_run_dir, state)
    except TrainingInterrupted:
        group.close(finished=True)
        raise
    except BaseException:
        group.close()
        raise
    group.close(finished=True)
    return result


def _run_learner(
    group: LearnerGroup,
    config: TrainConfig,
    run_dir: Path | None,
    show_progress: bool,
    on_run_dir: Callable[[Path], None] | None,
    state: dict[str, Any] | None = None,
) -> TrainResult:
    """Train as one learner of ``group``; with ``run_dir``, resume that run from its latest checkpoint
    (learner 0 reads it, unless it already holds its ``state``)."""
    trainer = Trainer(config, run_dir=run_dir, show_progress=show_progress, group=group)
    try:
        if group.is_main and on_run_dir is not None:
            on_run_dir(trainer.run_dir)
        if run_dir is not None:
            if group.is_main and state is None:
                state = load_checkpoint(CheckpointManager(run_dir).latest(), map_location="cpu")
            trainer.load_group_state(state)
        return trainer.train()
    finally:
        trainer.close()


def _learning_rates(algorithm: Algorithm) -> dict[str, list[float]]:
    """The learning rate of every parameter group of every optimiser an algorithm holds, by name."""
    return {
        name: [group["lr"] for group in optimizer.param_groups]
        for name, optimizer in algorithm.optimizers().items()
    }
