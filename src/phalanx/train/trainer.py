"""train(config): environment -> worker -> learner -> evaluator, with logging, checkpoints and resume.

By default the loop is synchronous: the worker collects a rollout (or one VecEnv step, off-policy),
the learner updates on it, and every ``eval_every`` steps the evaluator runs the deterministic policy;
every step of it stays on the device except the scalars that are logged. With ``pipeline`` (off-policy
only) the worker steps the envs in its own thread and the loop consumes its steps
(:mod:`phalanx.train.pipeline`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from phalanx.algos import get_algorithm
from phalanx.algos.base import Algorithm
from phalanx.buffers import ReplayBuffer, RolloutBuffer
from phalanx.config import TrainConfig, load_yaml, save_yaml
from phalanx.envs.core import ConcatVecEnv, VecEnv, as_device
from phalanx.envs.registry import make_env
from phalanx.envs.workers import ProcessVecEnv
from phalanx.envs.wrappers import NanGuard, NormalizeObservation, RescaleAction, ScaleReward, find_wrapper
from phalanx.errors import CheckpointError, ConfigError
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.evaluator import Evaluation, Evaluator
from phalanx.train.learner import Learner
from phalanx.train.logging import RunLogger, Stopwatch, plot_curve
from phalanx.train.pipeline import Pipeline, Step
from phalanx.train.worker import Transition, Worker

EVAL_SEED_OFFSET = 1_000_003


@dataclass
class TrainResult:
    run_dir: Path
    summary: dict[str, Any]


# -- environments -------------------------------------------------------------------------------
def build_env(
    config: TrainConfig, num_envs: int, training: bool, obs_statistics: Any | None = None
) -> VecEnv:
    """The env the algorithm sees: NaN guard (training only), actions in [-1, 1], optional normalisation.

    Training envs of Gymnasium ids step in ``config.num_workers`` processes, and with ``config.overlap``
    as two halves (a :class:`ConcatVecEnv` of two wrapped halves that share their statistics) for the
    worker's double buffering. Evaluation envs step in this process (a few episodes with frozen
    weights, where idle worker processes would only take memory).
    """
    env: VecEnv = make_env(
        config.env,
        num_envs=num_envs,
        device=config.device,
        num_workers=config.num_workers if training else 0,
        worker_options={"max_restarts": config.worker_restarts, "step_timeout": config.worker_timeout},
    )
    if not (training and config.overlap):
        return _wrap(env, config, training, obs_statistics, None)
    if not isinstance(env, ProcessVecEnv):
        env.close()
        raise ConfigError(
            f"overlap=True steps half of the sub-envs in worker processes while the policy computes, "
            f"but {config.env!r} is {type(env).__name__}, not a Gymnasium env in worker processes. Use a "
            "Gymnasium id with --num-workers (e.g. 'gym:CartPole-v1'), or drop --overlap (batched envs "
            "step all sub-envs at once already)."
        )
    halves = env.split()
    first = _wrap(halves[0], config, training, obs_statistics, None)
    normalizer, scaler = find_wrapper(first, NormalizeObservation), find_wrapper(first, ScaleReward)
    second = _wrap(
        halves[1],
        config,
        training,
        normalizer.statistics if normalizer is not None else None,
        scaler.statistics if scaler is not None else None,
    )
    return ConcatVecEnv([first, second])


def _wrap(
    env: VecEnv,
    config: TrainConfig,
    training: bool,
    obs_statistics: Any | None,
    reward_statistics: Any | None,
) -> VecEnv:
    if training:  # evaluation runs the same env with frozen weights: no need to pay the check per step
        env = NanGuard(env)
    if isinstance(env.single_action_space, gym.spaces.Box):
        env = RescaleAction(env)
    if config.normalize_obs:
        env = NormalizeObservation(env, statistics=obs_statistics, update=training)
    if config.normalize_reward and training:
        env = ScaleReward(env, gamma=config.hyperparameters.gamma, statistics=reward_statistics)
    return env


def space_spec(observation_space: gym.Space, action_space: gym.Space) -> dict[str, Any]:
    """The spaces as tensors and primitives, so that a checkpoint can rebuild the agent without the env."""
    spec: dict[str, Any] = {
        "observation_shape": list(observation_space.shape),
        "observation_low": torch.as_tensor(observation_space.low),
        "observation_high": torch.as_tensor(observation_space.high),
    }
    if isinstance(action_space, gym.spaces.Discrete):
        spec["action"] = {"type": "discrete", "n": int(action_space.n)}
    else:
        spec["action"] = {
            "type": "box",
            "low": torch.as_tensor(action_space.low),
            "high": torch.as_tensor(action_space.high),
        }
    return spec


def spaces_from_spec(spec: dict[str, Any]) -> tuple[gym.Space, gym.Space]:
    observation_space = gym.spaces.Box(
        spec["observation_low"].numpy(), spec["observation_high"].numpy(), dtype="float32"
    )
    action = spec["action"]
    if action["type"] == "discrete":
        return observation_space, gym.spaces.Discrete(action["n"])
    return observation_space, gym.spaces.Box(action["low"].numpy(), action["high"].numpy(), dtype="float32")


# -- run directories ----------------------------------------------------------------------------
def default_run_dir(config: TrainConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe_env = re.sub(r"[^A-Za-z0-9_.-]", "_", config.env)
    base = Path("runs") / f"{safe_env}__{config.algo}__s{config.seed}__{stamp}"
    candidate, suffix = base, 1
    while candidate.exists():
        suffix += 1
        candidate = base.with_name(f"{base.name}_{suffix}")
    return candidate


def create_run_dir(config: TrainConfig) -> Path:
    run_dir = Path(config.run_dir) if config.run_dir else default_run_dir(config)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"run directory {str(run_dir)!r} already exists and is not empty; "
            "phalanx never overwrites a run. "
            f"Continue it with `phalanx resume {run_dir}`, or choose another --run-dir."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


# -- the trainer --------------------------------------------------------------------------------
class Trainer:
    """Owns one run: its envs, algorithm, worker, learner, evaluator, logger and checkpoints."""

    def __init__(self, config: TrainConfig, run_dir: Path | None = None, show_progress: bool = True) -> None:
        config.validate()
        config = self.config = dataclasses.replace(config)  # the caller's config stays as it was
        self.device = as_device(config.device)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)

        # Everything that can fail on bad input happens before the run directory is created; the envs
        # (and their worker processes) are closed if any of it fails.
        self.env = self.eval_env = None
        self.pipeline: Pipeline | None = None
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

    def _build(self, config: TrainConfig, run_dir: Path | None, show_progress: bool) -> None:
        self.env = build_env(config, config.num_envs, training=True)
        algorithm_class = get_algorithm(config.algo)
        raw_env = self.env.unwrapped  # name the env's own spaces in errors, not the rescaled ones
        algorithm_class.check_spaces(raw_env.single_observation_space, raw_env.single_action_space)
        normalizer = find_wrapper(self.env, NormalizeObservation)
        self.obs_statistics = normalizer.statistics if normalizer is not None else None
        self.eval_env = build_env(
            config, config.eval_episodes, training=False, obs_statistics=self.obs_statistics
        )
        self.algorithm: Algorithm = algorithm_class(
            config.hyperparameters,
            self.env.single_observation_space,
            self.env.single_action_space,
            self.device,
        )
        # The env's own action bounds, so that a deployed agent maps [-1, 1] back to them.
        self.spaces = space_spec(self.env.single_observation_space, raw_env.single_action_space)
        hp = config.hyperparameters
        buffer_shapes = (
            self.env.single_observation_space.shape,
            self.env.single_action_space.shape,
            torch.int64 if isinstance(self.env.single_action_space, gym.spaces.Discrete) else torch.float32,
            self.device,
        )
        if self.algorithm.on_policy:
            self.buffer: RolloutBuffer | ReplayBuffer = RolloutBuffer(
                hp.horizon, config.num_envs, *buffer_shapes
            )
        else:
            self.buffer = ReplayBuffer(hp.buffer_size, config.num_envs, *buffer_shapes)
            # Updates start once the buffer holds the warm-up (and enough steps for n-step returns).
            self.update_threshold = max(hp.learning_starts, config.num_envs * hp.n_step)
        self.updates_owed = 0.0  # off-policy: fractional gradient steps carried to the next env step
        self.worker = Worker(self.env, self.algorithm)
        self.learner = Learner(self.algorithm, self.buffer)
        self.evaluator = Evaluator(self.eval_env, seed=config.seed + EVAL_SEED_OFFSET)

        self.run_dir = run_dir if run_dir is not None else create_run_dir(config)
        self.config.run_dir = str(self.run_dir)
        self.checkpoints = CheckpointManager(self.run_dir, keep=config.keep_checkpoints)
        self.show_progress = show_progress

        self.steps = 0
        self.wall_offset = 0.0
        self.time_to_stop_return: float | None = None
        self.last_evaluation: Evaluation | None = None
        self.last_evaluation_step = -1
        self.next_eval = config.eval_every if config.eval_every else math.inf
        self.next_checkpoint = config.checkpoint_every if config.checkpoint_every else math.inf
        self.next_log = 0
        self.worker.reset(seed=config.seed)

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        state = {
            "config": self.config.to_dict(),
            "spaces": self.spaces,
            "algorithm": self.algorithm.state_dict(),
            "env": self.env.state_dict(),
            "obs_statistics": self.obs_statistics.state_dict() if self.obs_statistics is not None else None,
            "worker": self.worker.state_dict(),
            "rng": rng,
            "progress": {
                "steps": self.steps,
                "updates": self.learner.updates,
                "wall_time_s": self.stopwatch(),
                "best_eval_return": self.evaluator.best_return,
                "time_to_stop_return_s": self.time_to_stop_return,
                "next_eval": self.next_eval,
                "next_checkpoint": self.next_checkpoint,
                "next_log": self.next_log,
                "updates_owed": self.updates_owed,
            },
        }
        if self.config.save_buffer:
            state["buffer"] = self.buffer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.algorithm.load_state_dict(state["algorithm"])
        self.env.load_state_dict(state["env"])
        self.worker.load_state_dict({"obs": state["worker"]["obs"].to(self.device)})
        torch.set_rng_state(state["rng"]["torch"])
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        progress = state["progress"]
        self.steps = progress["steps"]
        self.learner.updates = progress["updates"]
        self.wall_offset = progress["wall_time_s"]
        self.evaluator.best_return = progress["best_eval_return"]
        self.time_to_stop_return = progress["time_to_stop_return_s"]
        self.next_eval = progress["next_eval"]
        self.next_checkpoint = progress["next_checkpoint"]
        self.next_log = progress["next_log"]
        self.updates_owed = progress["updates_owed"]
        if "buffer" in state:
            self.buffer.load_state_dict(state["buffer"])

    def save(self) -> Path:
        with self.pipeline_drained():
            return self.checkpoints.save(self.steps, self.state_dict())

    @contextlib.contextmanager
    def pipeline_drained(self) -> Any:
        """With a pipeline, a quiet state to save: the worker paused, every step it made consumed."""
        if self.pipeline is None or not self.pipeline.alive:
            yield
            return
        for step in self.pipeline.drain():
            self.consume(step)
        try:
            yield
        finally:
            self.pipeline.resume()

    def close(self) -> None:
        """Close the envs (and stop their worker processes); the run directory stays as it is."""
        for env in (self.env, self.eval_env):
            if env is not None:
                env.close()

    # -- the loop --------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Train to ``total_steps`` (or ``stop_return``); a pipeline's worker thread ends with the loop."""
        try:
            return self._train()
        finally:
            if self.pipeline is not None:
                self.pipeline.stop()

    def _train(self) -> TrainResult:
        config = self.config
        save_yaml(config, self.run_dir / "config.yaml")
        self.stopwatch = Stopwatch(self.wall_offset)
        self.logger = RunLogger(self.run_dir, config.total_steps, show_progress=self.show_progress)
        iterate = self.on_policy_iteration if self.algorithm.on_policy else self.off_policy_iteration
        if config.pipeline:
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
            )
            iterate = self.pipelined_iteration
        self.policy_lags: list[int] = []
        metrics: dict[str, Any] = {}
        reached = False
        try:
            last_time, last_steps, last_updates = self.stopwatch(), self.steps, self.learner.updates
            while self.steps < config.total_steps and not reached:
                metrics = iterate() or metrics

                row: dict[str, Any] = {}
                if self.steps >= self.next_eval:
                    while self.next_eval <= self.steps:
                        self.next_eval += config.eval_every
                    row.update(self.evaluate())
                    reached = self.reached_stop_return()
                if self.steps >= self.next_log or row:
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
                        **row,
                    }
                    self.logger.log(row)
                    last_time, last_steps, last_updates = now, self.steps, self.learner.updates
                    while self.next_log <= self.steps:
                        self.next_log += config.log_every
                if self.steps >= self.next_checkpoint:
                    self.save()
                    while self.next_checkpoint <= self.steps:
                        self.next_checkpoint += config.checkpoint_every
        except KeyboardInterrupt:
            self.logger.close()
            path = self.save()  # a pipeline drains first: the steps its worker made are learned from
            self.write_summary(interrupted=True)
            raise TrainingInterrupted(self.run_dir, self.steps, path) from None
        except BaseException as error:
            # Whatever stops the run, what it wrote stays: the logs, the checkpoints saved so far, and
            # a summary that names the error (no checkpoint of a state that may be corrupt, e.g. NaN).
            self.logger.close()
            self.write_summary(interrupted=False, error=f"{type(error).__name__}: {error}")
            raise

        if self.last_evaluation_step != self.steps:
            row = self.evaluate()
            self.reached_stop_return()
            self.logger.log(
                {"steps": self.steps, "wall_time_s": self.stopwatch(), "updates": self.learner.updates, **row}
            )
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
        self.steps += self.config.hyperparameters.horizon * self.config.num_envs
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
        hp = self.config.hyperparameters
        progress = min(self.steps / self.config.total_steps, 1.0)
        self.worker.store(self.buffer, transition)
        self.steps += self.config.num_envs
        if len(self.buffer) < self.update_threshold:
            return {}
        self.updates_owed += self.config.num_envs * hp.updates_per_step
        updates = int(self.updates_owed)
        self.updates_owed -= updates
        if hp.max_updates_per_step is not None:
            updates = min(updates, hp.max_updates_per_step)
        metrics: dict[str, torch.Tensor] = {}
        for _ in range(updates):
            metrics = self.learner.update(progress)
            if self.pipeline is not None:
                self.pipeline.after_update(self.learner.updates)
        return metrics

    def read_policy_lag(self) -> dict[str, float]:
        """Pipeline: mean and max policy lag (in updates) of the steps consumed since the last read."""
        if not self.policy_lags:
            return {}
        lags, self.policy_lags = self.policy_lags, []
        return {"policy_lag_mean": sum(lags) / len(lags), "policy_lag_max": float(max(lags))}

    def evaluate(self) -> dict[str, float]:
        evaluation = self.evaluator.evaluate(self.algorithm)
        self.last_evaluation = evaluation
        self.last_evaluation_step = self.steps
        if self.evaluator.is_best(evaluation):
            with self.pipeline_drained():
                self.checkpoints.save_best(self.state_dict())
        return {"eval_return_mean": evaluation.mean, "eval_return_std": evaluation.std}

    def reached_stop_return(self) -> bool:
        stop = self.config.stop_return
        if stop is None or self.last_evaluation is None or self.last_evaluation.mean < stop:
            return False
        if self.time_to_stop_return is None:
            self.time_to_stop_return = self.stopwatch()
            self.logger.message(
                f"reached stop_return {stop} (evaluation mean {self.last_evaluation.mean:.1f}) "
                f"after {self.steps:,} steps in {self.time_to_stop_return:.1f} s"
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
            "best_eval_return": self.evaluator.best_return if evaluation else None,
            "buffer_bytes": self.buffer.nbytes,
            "interrupted": interrupted,
            "error": error,
            "run_dir": str(self.run_dir),
            "latest_checkpoint": str(self.checkpoints.latest()) if self.checkpoints.latest() else None,
        }
        temporary = self.run_dir / "summary.json.tmp"
        temporary.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(temporary, self.run_dir / "summary.json")
        return summary


class TrainingInterrupted(Exception):
    """Ctrl+C during training: a checkpoint was saved; the run can be resumed."""

    def __init__(self, run_dir: Path, steps: int, checkpoint: Path) -> None:
        super().__init__(
            f"interrupted at step {steps:,}; checkpoint saved to {checkpoint}. "
            f"Continue with `phalanx resume {run_dir}`."
        )
        self.run_dir = run_dir
        self.checkpoint = checkpoint


def train(config: TrainConfig, show_progress: bool = True) -> TrainResult:
    """Train ``config`` in a new run directory; return the run directory and the summary."""
    trainer = Trainer(config, show_progress=show_progress)
    try:
        return trainer.train()
    finally:
        trainer.close()


def read_run_config(run_dir: str | Path) -> TrainConfig:
    """The config.yaml of a run directory, with a clear error if ``run_dir`` is not one."""
    config_path = Path(run_dir) / "config.yaml"
    if not config_path.is_file():
        raise CheckpointError(
            f"{str(run_dir)!r} is not a phalanx run directory: {config_path.name} is missing. "
            "Pass the directory that `phalanx train` created (runs/<env>__<algo>__...)."
        )
    return TrainConfig.from_dict(load_yaml(config_path), where=str(config_path))


def resume(run_dir: str | Path, total_steps: int | None = None, show_progress: bool = True) -> TrainResult:
    """Continue a run from its latest checkpoint, optionally with a larger ``total_steps``."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    config = read_run_config(run_dir)
    latest = CheckpointManager(run_dir).latest()
    if latest is None:
        raise CheckpointError(
            f"run directory {str(run_dir)!r} has no checkpoint to resume from (checkpoints/ is empty). "
            "Start a new run with `phalanx train` instead."
        )
    state = load_checkpoint(latest, map_location=config.device)
    saved = TrainConfig.from_dict(state["config"], where=f"{latest}/state.pt")
    differences = _config_differences(saved, config)
    if differences:
        raise CheckpointError(
            f"{config_path} does not match the config stored in the checkpoint {latest}: "
            + "; ".join(f"{key}: checkpoint has {a!r}, config.yaml has {b!r}" for key, a, b in differences)
            + ". Restore config.yaml, or start a new run with the new settings."
        )
    if total_steps is not None:
        if total_steps <= state["progress"]["steps"]:
            raise ConfigError(
                f"--total-steps {total_steps} is not beyond the {state['progress']['steps']} steps this run "
                "has already trained. Pass a larger --total-steps."
            )
        config.total_steps = total_steps
    trainer = Trainer(config, run_dir=run_dir, show_progress=show_progress)
    try:
        trainer.load_state_dict(state)
        return trainer.train()
    finally:
        trainer.close()


def _config_differences(saved: TrainConfig, current: TrainConfig) -> list[tuple[str, Any, Any]]:
    # Settings that change how fast a run goes, not what it computes, may differ on resume.
    ignored = {
        "total_steps",
        "run_dir",
        "num_workers",
        "worker_restarts",
        "worker_timeout",
        "torch_threads",
        "pipeline",
        "pipeline_queue",
        "sync_every",
    }
    a, b = saved.to_dict(), current.to_dict()
    differences = [
        (k, a[k], b.get(k)) for k in a if k not in ignored and k != "hyperparameters" and a[k] != b.get(k)
    ]
    for key, value in a["hyperparameters"].items():
        if value != b["hyperparameters"].get(key):
            differences.append((f"hyperparameters.{key}", value, b["hyperparameters"].get(key)))
    return differences
