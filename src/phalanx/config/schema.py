"""The config schema: a run's settings as dataclasses, one field per setting, documented and validated once.

A run is described by a :class:`TrainConfig` (what to train, where, for how long, how to log) whose
``hyperparameters`` field holds the algorithm's own dataclass (subclasses of :class:`AlgoConfig`:
``PPOConfig``, ``A2CConfig``, ..., defined next to each learning rule in ``phalanx.algos``).
:func:`make_config` builds one from the defaults, the shipped preset and overrides, each value coerced to
its field's type (:mod:`phalanx.config.coercion`).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from phalanx.config.coercion import coerce, is_int, plain
from phalanx.config.modules import import_modules
from phalanx.config.yaml_reader import parse_yaml
from phalanx.errors import ConfigError
from phalanx.registry import (
    RECURRENT_SETTINGS,
    algorithm_names,
    algorithms_reading,
    canonical_name,
    config_class,
    get_algorithm,
    no_recurrent_policy,
)

TRACKERS = ("wandb",)
"""The experiment trackers a run can log to (``TrainConfig.track``), besides TensorBoard."""
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"
"""Characters W&B refuses in a project name."""
VIDEO_FORMATS = ("mp4", "gif")
"""The formats a video is written in: ``mp4`` (H.264, the default) or ``gif``."""
ENCODERS = ("auto", "mlp", "nature", "impala", "minatar")
"""``encoder`` values (``phalanx.nets.feature_encoder``): auto (a CNN for image spaces, none for vectors),
mlp (no encoder: flat vectors only), nature (the Nature-DQN CNN), impala (the IMPALA ResNet), minatar (the
MinAtar paper's small CNN)."""


@dataclass
class AlgoConfig:
    """Hyperparameters every algorithm has. Algorithm configs subclass this."""

    learning_rate: float = 3e-4
    """Optimiser learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy and value networks."""
    activation: str = "tanh"
    """Hidden activation: tanh, relu, elu, silu or gelu."""
    encoder: str = "auto"
    """Observation encoder in front of the networks: auto (a CNN for image observations: nature for
    images of 36x36 pixels or more, impala below; none for vectors), mlp (none: flat vectors only),
    nature (the Nature-DQN CNN), impala (the IMPALA ResNet) or minatar (the MinAtar paper's small CNN). Dict
    observations: per image part."""
    share_encoder: bool = True
    """Actor-critic algorithms with an encoder: one encoder for the policy and the value function
    (trained by both losses, as CleanRL's Atari PPO); false: each network its own."""

    def validate(self, run: TrainConfig) -> None:
        """Raise ConfigError for impossible values; ``run`` gives the context (num_envs, ...)."""
        check(self.learning_rate > 0, "learning_rate", self.learning_rate, "a positive number, e.g. 3e-4")
        check(0.0 <= self.gamma <= 1.0, "gamma", self.gamma, "a discount factor in [0, 1], e.g. 0.99")
        check(
            all(isinstance(width, int) and width >= 1 for width in self.hidden_sizes),
            "hidden_sizes",
            self.hidden_sizes,
            "positive integer layer widths, e.g. 64 64",
        )
        activations = ("tanh", "relu", "elu", "silu", "gelu")
        check(self.activation in activations, "activation", self.activation, f"one of {activations}")
        check(self.encoder in ENCODERS, "encoder", self.encoder, f"one of {ENCODERS}")
        check(isinstance(self.share_encoder, bool), "share_encoder", self.share_encoder, "true or false")
        if self.encoder in ("nature", "impala", "minatar"):
            algorithm = get_algorithm(run.algo)
            check(
                "image" in algorithm.observations,
                "encoder",
                self.encoder,
                f"'auto' or 'mlp': {run.algo} reads flat vectors only, so it has no CNN encoder (algorithms "
                f"that read images: {', '.join(algorithms_reading('image'))})",
            )


@dataclass
class TrainConfig:
    """A training run: the environment, the algorithm and its hyperparameters, budget and logging."""

    algo: str = ""
    """Algorithm name (see `phalanx train --help`)."""
    env: str = ""
    """Environment id: a built-in id, a Gymnasium id, or one registered with phalanx.envs.register_env."""
    num_envs: int = 64
    """Sub-environments stepped as one batch."""
    num_workers: int = 0
    """Processes that step a Gymnasium env's sub-environments (0: in this process, one after another).
    Built-in envs are batched tensors and take 0."""
    overlap: bool = False
    """Double buffering with worker processes: half of every worker's sub-envs step while the policy
    computes the actions of the other half (needs num_workers >= 1 and an even num_envs / num_workers)."""
    worker_restarts: int = 3
    """How many times each worker process may be restarted after a crash or hang before the run stops."""
    worker_timeout: float = 60.0
    """Seconds a worker process may take for one step or reset before it counts as hung."""
    pipeline: bool = False
    """Off-policy algorithms: step the envs in a worker thread, with its own copy of the policy, while
    the learner updates (same env steps and updates as the synchronous loop; see docs/parallelism.md)."""
    pipeline_queue: int = 4
    """With pipeline: VecEnv steps the worker may run ahead of the learner (the queue's bound)."""
    sync_every: int = 1
    """With pipeline: learner updates between copies of the policy's weights to the worker."""
    num_learners: int = 1
    """Data-parallel learners (processes in a torch.distributed group, gloo on CPU, NCCL on CUDA), each
    with its own num_envs sub-envs; gradients are averaged over them (see docs/parallelism.md)."""
    learner_timeout: float = 300.0
    """With num_learners > 1: seconds a learner waits for the others at a collective before the group
    is taken down (it covers the evaluations and checkpoints learner 0 makes alone)."""
    total_steps: int = 1_000_000
    """Training budget in environment steps, counted over all sub-environments."""
    seed: int = 0
    """Seed of the environments, network initialisation and sampling."""
    device: str = "cpu"
    """Torch device for environments, networks and buffers: cpu, cuda, cuda:1, ..."""
    run_dir: str | None = None
    """Run directory; default runs/<env>__<algo>__s<seed>__<yyyymmdd-hhmmss>."""
    resume: bool = False
    """With run_dir: continue the run there from its latest checkpoint if there is one, else start it
    there, so that one command both starts a cluster job and continues it when the scheduler requeues
    it after a preemption (docs/cluster.md). Refused if that run has another config. In a population's
    base config: the same for the population in its --dir."""
    stop_return: float | None = None
    """Stop when the deterministic evaluation mean return reaches this value."""
    eval_every: int = 50_000
    """Environment steps between evaluations (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation, run as parallel sub-environments with the deterministic policy."""
    eval_process: bool = False
    """Evaluate in a process of its own, on copies of the weights, while training goes on (on another
    core): a copy is taken every eval_every steps and evaluated as soon as the process is free, and
    stop_return stops training when a result reaching it arrives."""
    eval_batch: int = 8
    """With eval_process and a batched simulator (the built-in envs): the copies taken while the process
    was busy are evaluated together, up to this many (the newest), side by side in one env of
    eval_batch * eval_episodes sub-envs, so that every copy is evaluated. 1, or another kind of env:
    only the newest copy; the ones it replaces are not evaluated."""
    video_every: int = 0
    """Environment steps between videos (0: none): one deterministic evaluation episode of the current
    policy, recorded to RUN_DIR/videos/<env>_step<N>.mp4 (see docs/video.md). The env must render
    (Gymnasium's rgb_array, or a multi-agent env's render()); this is checked before the run starts."""
    video_format: str = "mp4"
    """Format of the videos of video_every: mp4 (H.264, needs PyAV or imageio-ffmpeg, the render extra)
    or gif."""
    checkpoint_every: int = 0
    """Environment steps between checkpoints (0: only at the end and at each new best evaluation)."""
    checkpoint_every_minutes: float = 30.0
    """Minutes of training between checkpoints, besides checkpoint_every (0: none by time): a run killed
    without warning (SIGKILL, a lost node) loses at most this much. Ctrl+C and SIGTERM save at once."""
    keep_checkpoints: int = 3
    """How many step_<n> checkpoints to keep (the best one is kept in addition)."""
    normalize_obs: bool = False
    """Normalise observations with running statistics on the device (saved in checkpoints)."""
    normalize_reward: bool = False
    """Scale rewards by the running standard deviation of the discounted return."""
    log_every: int = 0
    """Environment steps between rows of metrics.csv and console updates (0: scaled to the run, about 100
    rows: total_steps / 100, at most 10,000)."""
    track: str | None = None
    """Experiment tracker that the run also logs to: wandb (Weights & Biases, the `wandb` extra; see
    docs/tracking.md), or null: none. metrics.csv, evaluations.csv and TensorBoard are written either way."""
    wandb_project: str | None = None
    """With track wandb: the W&B project (null: WANDB_PROJECT if it is set, else phalanx)."""
    wandb_entity: str | None = None
    """With track wandb: the W&B entity, a user or team (null: WANDB_ENTITY if it is set, else your
    default entity)."""
    track_optional: bool = False
    """With track: if the tracker cannot start (not installed, not logged in, unreachable), train
    without it after a warning, instead of stopping with an error before the run starts."""
    save_buffer: bool = False
    """Include the replay buffer in checkpoints (off-policy), so that a resume continues exactly."""
    torch_threads: int = 1
    """torch's intra-op threads for this run (0: torch's default, one per core). One thread is never
    pathological: on a quiet 2-core machine it gives up to 27% to two threads on large batches, while two
    threads run 2.5x slower than one as soon as another process holds a core (docs/performance.md)."""
    compile: bool | None = None
    """Run the env step, acting and the update as compiled graphs (torch.compile): --compile (true);
    --no-compile (false): eagerly; neither (null): compiled on CUDA, eager on a CPU, where compiling costs
    tens of seconds (see docs/compile.md)."""
    imports: tuple[str, ...] = ()
    """Python modules to import before the env is built, e.g. one that calls register_env (--import
    MODULE, repeatable; found from the current directory or the Python path). Stored in config.yaml,
    so that eval, resume, backtest and load_agent import them again."""
    hyperparameters: AlgoConfig = field(default_factory=AlgoConfig)
    """The algorithm's hyperparameters."""

    @property
    def log_interval(self) -> int:
        """Environment steps between rows of metrics.csv: ``log_every``, or when 0 the run's budget over
        100 (so that a short run's curve has as many points as a long one's), at most 10,000."""
        if self.log_every:
            return self.log_every
        return min(10_000, max(1, self.total_steps // 100))

    def validate(self) -> None:
        """Check every field; raise ConfigError naming the field, the value and the fix."""
        check(self.algo in algorithm_names(), "algo", self.algo, f"one of {algorithm_names()}")
        expected = config_class(self.algo)
        if type(self.hyperparameters) is not expected:
            raise ConfigError(
                f"hyperparameters for algo {self.algo!r} must be a {expected.__name__}, got "
                f"{type(self.hyperparameters).__name__}. Build the config with "
                f"phalanx.make_config({self.algo!r}, env) or pass {expected.__name__}(...)."
            )
        check(bool(self.env), "env", self.env, "an environment id such as 'CartPole-v1' (see `phalanx envs`)")
        self._check_count("num_envs", 1, "an integer >= 1")
        self._check_count("num_workers", 0)
        self._check_workers()
        self._check_count("worker_restarts", 0)
        self._check_seconds("worker_timeout")
        self._check_count(
            "pipeline_queue",
            1,
            "an integer >= 1: the worker needs room for at least one step ahead of the learner",
        )
        self._check_count("sync_every", 1, "an integer >= 1 (updates between weight copies to the worker)")
        self._check_count("num_learners", 1, "an integer >= 1 (1: one learner in this process)")
        self._check_seconds("learner_timeout")
        if self.num_learners > 1 and self.pipeline and (self.normalize_obs or self.normalize_reward):
            raise ConfigError(
                "pipeline with num_learners > 1 cannot normalise observations or rewards: the learners "
                "merge their running statistics at every step, while a pipeline's worker thread updates "
                "them between steps. Drop --normalize-obs / --normalize-reward, --pipeline, or use "
                "--learners 1."
            )
        if get_algorithm(self.algo).multi_agent:
            self._check_multi_agent()
        self._check_count("total_steps", 1)
        self._check_count("seed", 0, "a non-negative integer")
        self._check_count("eval_every", 0)
        self._check_count("eval_episodes", 1)
        self._check_count("eval_batch", 1)
        self._check_count("video_every", 0)
        formats = f"one of {VIDEO_FORMATS}"
        check(self.video_format in VIDEO_FORMATS, "video_format", self.video_format, formats)
        self._check_count("checkpoint_every", 0)
        minutes = self.checkpoint_every_minutes
        number = isinstance(minutes, (int, float)) and not isinstance(minutes, bool)
        check(
            number and minutes >= 0, "checkpoint_every_minutes", minutes, "a number of minutes >= 0 (0: off)"
        )

        self._check_count("keep_checkpoints", 1, ">= 1 (the latest checkpoint is needed to resume)")
        self._check_count("log_every", 0)
        self._check_count("torch_threads", 0)
        check(self.compile in (None, True, False), "compile", self.compile, "true, false or null (auto)")
        self._check_tracking()
        self.hyperparameters.validate(self)

    def _check_tracking(self) -> None:
        """track names a tracker, and the W&B settings are set only for W&B, with names W&B takes."""
        check(
            self.track is None or self.track in TRACKERS,
            "track",
            self.track,
            f"one of {', '.join(TRACKERS)}, or null for none (TensorBoard is always written)",
        )
        for name in ("wandb_project", "wandb_entity"):
            value = getattr(self, name)
            if value is not None and self.track != "wandb":
                raise ConfigError(
                    f"{name} = {value!r} is a Weights & Biases setting, but track = {self.track!r}: "
                    f"nothing would log to W&B. Add --track wandb, or drop --{name.replace('_', '-')}."
                )
            check(
                value is None or (isinstance(value, str) and 0 < len(value) <= 128),
                name,
                value,
                "a W&B name of 1 to 128 characters, or null",
            )
        if self.wandb_project is not None:
            forbidden = sorted(set(self.wandb_project) & set(WANDB_PROJECT_FORBIDDEN))
            check(
                not forbidden,
                "wandb_project",
                self.wandb_project,
                f"a W&B project name, without {' '.join(WANDB_PROJECT_FORBIDDEN)} "
                f"(found {' '.join(forbidden)})",
            )
        check(self.track_optional in (True, False), "track_optional", self.track_optional, "true or false")

    def _check_count(self, name: str, minimum: int, expected: str | None = None) -> None:
        """The field ``name`` is an integer >= ``minimum`` (``expected``: what the error says it must be)."""
        value = getattr(self, name)
        check(is_int(value) and value >= minimum, name, value, expected or f">= {minimum}")

    def _check_seconds(self, name: str) -> None:
        value = getattr(self, name)
        check(isinstance(value, (int, float)) and value > 0, name, value, "a number of seconds > 0")

    def _check_workers(self) -> None:
        """num_envs splits evenly over the worker processes (and into two halves each with overlap)."""
        if self.num_workers:
            multiple = max(self.num_workers, self.num_envs // self.num_workers * self.num_workers)
            check(
                self.num_envs % self.num_workers == 0,
                "num_envs",
                self.num_envs,
                f"a multiple of num_workers={self.num_workers}, so that every worker steps the same number "
                f"of sub-envs (e.g. {multiple})",
            )
        if self.overlap:
            halves = 2 * max(1, self.num_workers)
            check(
                self.num_workers >= 1,
                "num_workers",
                self.num_workers,
                ">= 1 with overlap: the halves step in worker processes while the policy computes "
                "(set --num-workers, or drop --overlap)",
            )
            check(
                self.num_envs % halves == 0,
                "num_envs",
                self.num_envs,
                f"an even multiple of num_workers={self.num_workers} with overlap, so that every worker "
                f"steps two equal halves (e.g. {halves * max(1, self.num_envs // halves)})",
            )

    def _check_multi_agent(self) -> None:
        """The run settings a multi-agent algorithm does not take (yet), each refused by name."""
        unsupported = {
            "pipeline": self.pipeline,
            "overlap": self.overlap,
            "eval_process": self.eval_process,
            "normalize_obs": self.normalize_obs,
            "normalize_reward": self.normalize_reward,
            "num_learners": self.num_learners if self.num_learners != 1 else False,
        }
        for name, value in unsupported.items():
            if value:
                raise ConfigError(
                    f"{name} = {value!r} is not supported for the multi-agent algorithm {self.algo!r}: multi-"
                    "agent runs have one learner, a synchronous loop and raw observations and rewards. Drop "
                    f"--{name.replace('_', '-')} (see docs/multi_agent.md)."
                )

    # -- dict/YAML round trip --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "hyperparameters"
        }
        data["hyperparameters"] = {
            f.name: plain(getattr(self.hyperparameters, f.name))
            for f in dataclasses.fields(self.hyperparameters)
        }
        return {key: plain(value) for key, value in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> TrainConfig:
        """Build from a (possibly partial) dict with ``algo`` and ``env``; unknown keys are errors."""
        if "algo" not in data or "env" not in data:
            raise ConfigError(f"{where}: needs 'algo' and 'env' keys, got keys {sorted(data)}.")
        return make_config(
            data["algo"],
            data["env"],
            where=where,
            **{k: v for k, v in data.items() if k not in ("algo", "env")},
        )


def check(condition: bool, name: str, value: Any, expected: str) -> None:
    """Raise a ConfigError saying which setting is wrong, its value, and what it must be."""
    if not condition:
        flag = "--" + name.replace("_", "-")
        raise ConfigError(
            f"{name} = {value!r} is invalid: expected {expected}. Fix it with {flag} or in the config file."
        )


def presets(algo: str) -> dict[str, dict[str, Any]]:
    """The tuned presets shipped for an algorithm: {env_id: partial config dict}."""
    path = resources.files("phalanx") / "presets" / f"{algo}.yaml"
    if not path.is_file():
        return {}
    return parse_yaml(path.read_text()) or {}


def make_config(
    algo: str, env: str, *, use_preset: bool = True, where: str = "arguments", **overrides: Any
) -> TrainConfig:
    """The config for ``algo`` on ``env``: defaults, then the shipped preset, then ``overrides``.

    Overrides may name any TrainConfig field or any hyperparameter of the algorithm, flat
    (``learning_rate=1e-3``) or nested (``hyperparameters={"learning_rate": 1e-3}``).
    """
    if "imports" in overrides:  # first: a module may register algo (phalanx.registry.register_algorithm)
        import_modules(coerce(TrainConfig, "imports", overrides["imports"], where), where)
    name = canonical_name(algo)
    hyperparameter_class = config_class(name)
    merged: dict[str, Any] = {}
    if use_preset:
        merged = _merge(merged, presets(name).get(env, {}))
    merged = _merge(merged, dict(overrides))
    run_fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"algo", "env", "hyperparameters"}
    hp_fields = {f.name for f in dataclasses.fields(hyperparameter_class)}
    run_values: dict[str, Any] = {}
    hp_values: dict[str, Any] = dict(merged.pop("hyperparameters", None) or {})
    for key, value in merged.items():
        if key in run_fields:
            run_values[key] = value
        elif key in hp_fields:
            hp_values[key] = value
        else:
            _unknown_key(key, run_fields | hp_fields, name, where)
    for key in hp_values:
        if key not in hp_fields:
            _unknown_key(key, hp_fields, name, where)
    hyperparameters = hyperparameter_class(
        **{k: coerce(hyperparameter_class, k, v, where) for k, v in hp_values.items()}
    )
    run_values = {k: coerce(TrainConfig, k, v, where) for k, v in run_values.items()}
    return TrainConfig(algo=name, env=env, hyperparameters=hyperparameters, **run_values)


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if key == "hyperparameters" and isinstance(value, dict):
            merged[key] = {**(merged.get(key) or {}), **value}
        else:
            merged[key] = value
    return merged


def check_hyperparameter_name(name: str, config: TrainConfig, where: str) -> None:
    """``name`` is a hyperparameter of ``config``'s algorithm, or a ConfigError from ``where`` that names the
    closest ones and every valid one (a search space's or a mutation's name)."""
    valid = sorted(field.name for field in dataclasses.fields(config.hyperparameters))
    if name in valid:
        return
    close = difflib.get_close_matches(name, valid, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"{where}: {name!r} is not a hyperparameter of {config.algo}.{hint} Valid names: {', '.join(valid)}."
    )


def _unknown_key(key: str, valid: set[str], algo: str, where: str) -> None:
    if key in RECURRENT_SETTINGS:
        raise no_recurrent_policy(algo)
    close = difflib.get_close_matches(key, sorted(valid), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(
        f"{where}: unknown setting {key!r} for algo {algo!r}.{hint} "
        f"Valid settings: {', '.join(sorted(valid))}."
    )
