"""Trainer: one run, its envs, algorithm, worker, learner, evaluator, checkpoints and built-in hooks, and
saving and resuming them. What changes as it trains is its :class:`~phalanx.train.state.RunState`; its
loop is :mod:`phalanx.train.loop`'s; starting runs and learner groups, :mod:`phalanx.train.entry`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from phalanx.algos.base import Algorithm

if TYPE_CHECKING:
    from phalanx.algos.base import OnPolicy
from phalanx.buffers import (
    CompactReplayBuffer,
    ReplayBuffer,
    RolloutBuffer,
    StepLayout,
    replay_choice,
)
from phalanx.buffers.memory import ReplayMemory
from phalanx.compiling import should_compile
from phalanx.config import TrainConfig
from phalanx.envs.core import VecEnv, as_device
from phalanx.envs.wrappers import NormalizeObservation, ScaleReward, find_wrapper
from phalanx.errors import CheckpointError, ConfigError
from phalanx.registry import algorithm_class, get_algorithm
from phalanx.train.checkpoint import CheckpointManager
from phalanx.train.collection import Agreement, Collection, GroupAgreement, choose_collection
from phalanx.train.environments import (
    EVAL_SEED_OFFSET,
    EnvSpacePolicy,
    build_env,
    picklable_factory,
    space_spec,
    spaces_from_spec,
    to_device,
)
from phalanx.train.evaluations import Evaluations
from phalanx.train.evaluator import Evaluation, EvaluationProcess, Evaluator
from phalanx.train.hooks import Checkpoints, CompileWhenItPays, Logging, SafePoint, StopAtReturn, check_hooks
from phalanx.train.learner import Learner, LearnerGroup, StatisticsSync, replay_settings, rollout_settings
from phalanx.train.logging import RunLogger, Stopwatch
from phalanx.train.loop import TrainResult, train
from phalanx.train.run import Hook, Scheduler
from phalanx.train.run_dir import create_run_dir
from phalanx.train.state import RunState
from phalanx.train.tracking import WandbTracker, start_tracking
from phalanx.train.videos import GymnasiumEpisode, Videos
from phalanx.train.worker import Worker


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
        stop_requested: threading.Event | None = None,
    ) -> None:
        config.validate()
        config = self.config = dataclasses.replace(config)  # the caller's config stays as it was
        self.group = group
        self.is_main = group is None or group.is_main
        self.device = group.device if group is not None else as_device(config.device)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.compiles = should_compile(config.compile, self.device)  # a ConfigError with the fix if it can't
        self.state = RunState()  # what changes as it trains (train.state)

        # Everything that can fail on bad input happens before the run directory is created; the envs
        # (and their worker processes) are closed if any of it fails.
        # None until _build makes them, so that close() after a failed build closes what exists
        self.env: VecEnv = None  # type: ignore[assignment]  # set by _build, which runs next
        self.eval_env: VecEnv | None = None
        self.evaluator: Evaluator | EvaluationProcess | None = None  # learner 0's
        self.eval_process: EvaluationProcess | None = None  # the evaluator, when it is a process
        self.tracker: WandbTracker | None = None  # learner 0's, with config.track (train.tracking)
        # Ctrl+C (or a population's request) to stop at the loop's next safe point (train.interrupts)
        self.stop_requested = group.interrupted if group is not None else stop_requested or threading.Event()
        if group is None and config.num_learners > 1:
            raise ConfigError(
                f"num_learners = {config.num_learners}: a Trainer is one learner. Start the group with "
                "phalanx.train(config) or `phalanx train ... --learners N`, which launch one process per "
                "learner (or with torchrun, see docs/parallelism.md)."
            )
        if config.pipeline and get_algorithm(config.algo).on_policy:
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
        if self.compiles:  # what the run's log says of it, at its first train()
            compiled = self.state.compiled
            self.state.compile_note = (
                f"compiled: {', '.join(compiled)} (torch compiles each at its first call)"
                if compiled
                else "compiled: nothing (this run has no compiled path): it runs eagerly"
            )

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
        algorithm_type = algorithm_class(config.algo, config.hyperparameters)
        raw_env = self.env.unwrapped  # name the env's own spaces in errors, not the rescaled ones
        algorithm_type.check_spaces(raw_env.single_observation_space, raw_env.single_action_space)
        normalizer = find_wrapper(self.env, NormalizeObservation)
        self.obs_statistics = normalizer.statistics if normalizer is not None else None
        if self.is_main and self.eval_process is None:
            self.eval_env = build_env(
                config, config.eval_episodes, training=False, obs_statistics=self.obs_statistics
            )
        self.algorithm: Algorithm = algorithm_type(
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
        self.buffer: Any = self.make_buffer()  # as Run.buffer: its kind follows algorithm.on_policy
        self.worker = Worker(self.env, self.algorithm)
        self.learner = Learner(self.algorithm, self.buffer)
        if self.compiles:
            self.state.compiled = self.compile()
        if self.eval_env is not None:
            self.evaluator = Evaluator(self.eval_env, seed=config.seed + EVAL_SEED_OFFSET)
        self.open_run(run_dir, show_progress)
        self.worker.reset(seed=config.seed + rank * config.num_envs)  # each learner its own sub-env seeds
        self.sync_statistics()

    def open_run(self, run_dir: Path | None, show_progress: bool) -> None:
        """The run directory, its checkpoints and the built-in hooks: the last step of building a trainer,
        once everything that can fail on bad input has been built."""
        config, group = self.config, self.group
        # the videos' env renders and their encoder is installed, or the run does not start
        self.videos = Videos(config, self.video_episode) if config.video_every and self.is_main else None
        if self.is_main:
            self.run_dir = run_dir if run_dir is not None else create_run_dir(config)
        if group is not None:
            self.run_dir = Path(group.broadcast(str(self.run_dir) if self.is_main else None))
        self.config.run_dir = str(self.run_dir)
        if self.is_main:  # a tracker that cannot start stops the run here, before it trains
            self.tracker = start_tracking(config, self.run_dir, created=run_dir is None)
        self.checkpoints = CheckpointManager(self.run_dir, keep=config.keep_checkpoints)
        self.show_progress = show_progress and self.is_main
        self.collection = Collection(self)  # chosen when training starts
        self.agreement = Agreement() if group is None else GroupAgreement(group, self.sync_statistics)
        # the built-in hooks, each keeping its schedule in self.state (saved in checkpoints)
        self.evaluations = Evaluations(self)
        self.logging = Logging(self)
        self.checkpointing = Checkpoints(self)
        self.hooks = Scheduler(self, [])  # those of the current train() (train())

    # -- what hooks read -------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Env steps made so far."""
        return self.state.steps

    @property
    def last_evaluation(self) -> Evaluation | None:
        """The latest evaluation (None before the first)."""
        return self.state.last_evaluation

    @property
    def logger(self) -> RunLogger:
        """The run's files and display (learner 0, while it trains)."""
        assert self.state.logger is not None, "the run's logger exists while it trains (learner 0)"
        return self.state.logger

    @property
    def stopwatch(self) -> Stopwatch:
        """Seconds trained, across resumes."""
        return self.state.stopwatch

    compilable = True
    """Whether this kind of run has compiled paths (``compile: null`` may switch to them)."""

    def compile(self) -> list[str]:
        """Switch the training env's step, acting and the update to their compiled paths (torch compiles
        each at its first call); the names of what was compiled, once each. The envs of the evaluations
        stay eager: they step a few episodes now and then, which would not earn a compilation back."""
        # the env's whole wrapped step as one graph where it is traceable ([] for envs stepped outside torch)
        compiled = self.env.compile() + self.worker.compile() + self.algorithm.compile()
        return list(dict.fromkeys(compiled))

    def make_buffer(self) -> RolloutBuffer | ReplayBuffer | CompactReplayBuffer:
        """The rollout or replay buffer the hyperparameters ask for, observations in the env's dtype (uint8
        images stay uint8); the replay of image observations stores each one once
        (:func:`~phalanx.buffers.replay_choice`)."""
        config, hp = self.config, self.config.hyperparameters
        observation_space, action_space = self.env.single_observation_space, self.env.single_action_space
        if self.algorithm.on_policy:
            layout = StepLayout.of(observation_space, action_space)  # a Dict's observations: flat vectors
            algorithm = cast("OnPolicy", self.algorithm)
            horizon = rollout_settings(hp).horizon
            return algorithm.rollout_buffer(horizon, config.num_envs, layout, self.device)
        replay = replay_settings(hp)
        return replay_choice(
            replay.buffer_size,
            config.num_envs,
            observation_space,
            action_space,
            self.device,
            replay.replay_stacked_frames,
        ).build()

    @classmethod
    def replay_memory(cls, config: TrainConfig) -> ReplayMemory | None:
        """What the replay buffer of a run of ``config`` takes (None: on-policy, no replay), without building
        the run: from the spaces of its env made with one sub-env in this process. A population checks with
        it that the buffers its members hold at once fit together, before any member starts."""
        if get_algorithm(config.algo).on_policy:
            return None
        env = build_env(dataclasses.replace(config, num_workers=0, overlap=False), 1, training=True)
        try:
            observation_space, action_space = env.single_observation_space, env.single_action_space
        finally:
            env.close()
        hp = replay_settings(config.hyperparameters)
        return replay_choice(
            hp.buffer_size,
            config.num_envs,
            observation_space,
            action_space,
            as_device(config.device),
            hp.replay_stacked_frames,
        ).memory()

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
        assert self.evaluator is not None, "learner 0 saves the agent, and it has the evaluator"
        return {
            "config": self.config.to_dict(),
            "spaces": self.spaces,
            "algorithm": self.algorithm.state_dict(),
            "obs_statistics": self.obs_statistics.state_dict() if self.obs_statistics is not None else None,
            "progress": {
                **self.state.progress(),
                "updates": self.learner.updates,
                "best_eval_return": self.evaluator.best_return,
                "best_eval_steps": self.evaluator.best_steps,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.algorithm.load_state_dict(state["algorithm"])
        self.env.load_state_dict(state["env"])
        self.worker.load_state_dict(to_device(state["worker"], self.device))
        # RNG states are CPU byte tensors, also CUDA's; loading the checkpoint onto the device moved them.
        torch.set_rng_state(state["rng"]["torch"].cpu())
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"].cpu(), self.device)
        progress = state["progress"]
        self.state.load_progress(progress)
        self.learner.updates = progress["updates"]
        if self.evaluator is not None:
            self.evaluator.best_return = progress["best_eval_return"]
            self.evaluator.best_steps = progress.get("best_eval_steps")  # absent before it was saved
        if "buffer" in state:
            self.buffer.load_state_dict(state["buffer"])
        for sync in self.statistics_syncs:
            sync.rebase()

    def load_group_state(self, state: dict[str, Any] | None) -> None:
        """In a group, resume from a checkpoint's ``state``, which learner 0 passes (None on the others):
        it sends each learner the agent with that learner's own shard."""
        group = self.group
        assert group is not None, "a learner of a group"
        states = None
        if self.is_main:
            assert state is not None, "learner 0 passes the checkpoint's state"
            shards = [{}] + state.pop("learner_shards", [])
            if len(shards) != group.world_size:
                raise CheckpointError(
                    f"the checkpoint holds the shards of {len(shards)} learner(s), but this group has "
                    f"{group.world_size}. Resume with --learners {len(shards)}."
                )
            states = [{**state, **shard} for shard in shards]
        self.load_state_dict(to_device(group.scatter(states), self.device))

    def save(self) -> Path | None:
        """Checkpoint the run (learner 0 writes it, with every learner's shard); returns its path."""
        with self.collection.drained():
            if self.group is None:
                return self.checkpoints.save(self.steps, self.state_dict())
            shards = self.group.gather(self.shard_state())
            if not self.is_main:
                return None
            assert shards is not None, "learner 0 gathers every learner's shard"
            return self.checkpoints.save(self.steps, {**self.state_dict(), "learner_shards": shards[1:]})

    def close(self) -> None:
        """End the tracker's run, close the envs (and stop their worker processes); the run directory stays
        as it is.

        In a group the learners may close at different times: nothing here waits for the others."""
        if self.tracker is not None:
            self.tracker.finish()
        for env in (self.env, self.eval_env):
            if env is not None:
                env.close()
        if self.eval_process is not None:
            self.eval_process.close()

    # -- the loop --------------------------------------------------------------------------------
    def train(self, hooks: Sequence[Hook] = (), total_steps: int | None = None) -> TrainResult:
        """Train to ``total_steps`` (default: the config's), or until a hook stops the run
        (:func:`phalanx.train.loop.train`), calling ``hooks`` among the built-in ones; the tracker, if
        there is one, logs it (its W&B run ends with Ctrl+C or an error, else at close())."""
        if total_steps is not None:
            self.config.total_steps = total_steps
        attached = [hook for hook in (self.videos, self.tracker) if hook is not None]  # the tracker last:
        user = [*check_hooks(hooks), *attached] if self.is_main else []  # it logs what the others wrote
        self.hooks = Scheduler(self, self.hook_order(user))
        try:
            return train(self)
        except BaseException as error:
            if self.tracker is not None:
                self.tracker.finish(error)
            raise

    def hook_order(self, user: list[Hook]) -> list[Hook]:
        """Every hook of a ``train``, in the order they are called after each iteration."""
        results = [self.evaluations.results()] if self.eval_process is not None else []
        return [
            self.evaluations,
            *results,
            StopAtReturn(self.evaluations.reached_stop_return),
            *user,
            SafePoint(),
            self.logging,
            self.checkpointing,
            CompileWhenItPays(self),
        ]

    def start_collection(self) -> None:
        """Choose how this ``train`` collects (:func:`~phalanx.train.collection.choose_collection`)."""
        self.collection = choose_collection(self)

    def video_episode(self, seed: int) -> GymnasiumEpisode:
        """The current policy's deterministic episode from ``seed``, drawn frame by frame, the observation
        normalisation frozen as evaluation has it (``video_every``)."""
        statistics = copy.deepcopy(self.obs_statistics)  # a pipeline's worker thread moves the live ones
        _, action_space = spaces_from_spec(self.spaces)  # the env's own bounds
        policy = EnvSpacePolicy(self.algorithm, statistics, action_space)
        return GymnasiumEpisode(self.config.env, policy, seed)

    def stop(self, reason: str) -> None:
        """A hook's request: end the run after this iteration, as a spent budget does (``reason`` is
        logged); the first request is the one that counts."""
        if self.state.stop_reason is not None:
            return
        if reason != "stop_return":
            self.logger.message(f"stopped at step {self.steps:,} by a hook: {reason}")
        self.state.stop_reason = reason

    def new_algorithm(self, hyperparameters: Any) -> Algorithm:
        """A new algorithm for this run's spaces, built from ``hyperparameters`` (a hand-over)."""
        old = self.algorithm
        algorithm = algorithm_class(self.config.algo, hyperparameters)(
            hyperparameters, old.observation_space, old.action_space, self.device
        )
        if self.compiles:
            algorithm.compile()
        return algorithm

    def hand_over(self, algorithm: Algorithm, hyperparameters: Any, steps: int | None) -> None:
        """Train on with ``algorithm`` built from ``hyperparameters`` (:func:`~phalanx.train.handover.adopt`),
        from ``steps`` env steps if given (the schedules go on from there); a new horizon gets a new
        rollout buffer."""
        self.config.hyperparameters = hyperparameters
        self.algorithm = self.worker.algorithm = self.learner.algorithm = algorithm
        if algorithm.on_policy and self.buffer.horizon != hyperparameters.horizon:
            self.buffer = self.learner.buffer = self.make_buffer()
        if steps is not None:
            self.state.steps = steps
            for hook in (self.logging, self.evaluations, self.checkpointing):
                hook.restart(self, steps)

    def sync_statistics(self) -> None:
        """In a group: merge every learner's new observation and reward statistics (the same bits on all)."""
        for sync in self.statistics_syncs:
            sync()

    def evaluation_columns(self, evaluation: Evaluation) -> dict[str, float]:
        """Columns a kind of run adds to an evaluation's row (a multi-agent run: per-agent returns)."""
        return {}

    def extra_summary(self) -> dict[str, Any]:
        """Fields a kind of run adds to summary.json (a multi-agent run: per-agent returns)."""
        return {}
