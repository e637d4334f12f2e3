"""phalanx.train and phalanx.resume: a single run in this process, or a data-parallel group of learners,
launched here (one process per learner) or by torchrun (this process is one of them)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.config import TrainConfig
from phalanx.envs.registry import register_env
from phalanx.errors import ConfigError
from phalanx.registry import trainer_class
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.environments import picklable_factory
from phalanx.train.hooks import Hook, check_hooks
from phalanx.train.launch import (
    available_cores,
    check_learners,
    join_launched_group,
    launch_learners,
    launched_by_torchrun,
)
from phalanx.train.learner import LearnerGroup
from phalanx.train.loop import TrainingInterrupted, TrainResult
from phalanx.train.run_dir import (
    config_differences,
    finished_summary,
    read_run_config,
    refuse_differences,
    resumable_state,
    set_aside,
)
from phalanx.train.trainer import Trainer


def train(
    config: TrainConfig,
    show_progress: bool = True,
    on_run_dir: Callable[[Path], None] | None = None,
    hooks: Sequence[Hook] = (),
) -> TrainResult:
    """Train ``config`` in a new run directory; return the run directory and the summary.

    With ``num_learners > 1`` this starts one process per learner and waits for them; under torchrun
    this process is one learner of the group torchrun started. ``on_run_dir`` is told the run
    directory as soon as it exists. ``hooks`` (:class:`~phalanx.train.hooks.Hook`) are called by the
    training loop; in a group, by learner 0 alone.

    With ``config.resume`` the run in ``config.run_dir`` is continued if there is one (a requeued job's
    same command), and started there if there is none.
    """
    hooks = check_hooks(hooks)
    if config.resume:
        continued = _continue_existing(config, show_progress, on_run_dir, hooks)
        if continued is not None:
            return continued
    return _run(_Request(config, show_progress, on_run_dir, hooks))


def _continue_existing(
    config: TrainConfig,
    show_progress: bool,
    on_run_dir: Callable[[Path], None] | None,
    hooks: list[Hook],
) -> TrainResult | None:
    """``resume``: the run in ``config.run_dir`` continued to ``config.total_steps`` (or found finished);
    None where there is no run to continue (an empty or missing directory, or a run killed before its
    first checkpoint, whose files are set aside in its ``attempts/``): the caller starts it."""
    if not config.run_dir:
        raise ConfigError(
            "resume = true needs run_dir: the directory whose run to continue, or to start the run in when "
            "it holds none. Pass --run-dir DIR with --resume."
        )
    run_dir = Path(config.run_dir)
    if not run_dir.is_dir() or not any(entry.name != "attempts" for entry in run_dir.iterdir()):
        return None
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"--resume: {str(run_dir)!r} holds files but no phalanx run (its config.yaml is missing). "
            "Point --run-dir at a run directory, or at a new or empty one to start the run there."
        )
    refuse_differences(
        config_differences(read_run_config(run_dir), config),
        f"--resume: the run in {str(run_dir)!r} has another config than this command: ",
        ("the run has", "the command"),
        ". Rerun the command the run was started with, or choose another --run-dir for a new run.",
    )
    if CheckpointManager(run_dir).latest() is None:
        set_aside(run_dir)  # killed before its first checkpoint: nothing to go on from
        return None
    if on_run_dir is not None:
        on_run_dir(run_dir)
    return resume(run_dir, config.total_steps, show_progress, hooks)


def resume(
    run_dir: str | Path,
    total_steps: int | None = None,
    show_progress: bool = True,
    hooks: Sequence[Hook] = (),
) -> TrainResult:
    """Continue a run from its latest checkpoint, optionally with a larger ``total_steps``; ``hooks`` as
    for :func:`train`. A run that finished, with no larger ``total_steps``, is left as it is: the result
    has ``trained = False`` and the run's summary."""
    hooks = check_hooks(hooks)
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    finished = finished_summary(run_dir, total_steps)
    if finished is not None:  # nothing left to train: every file stays as it is
        return TrainResult(run_dir, finished, trained=False)
    state = None
    if not launched_by_torchrun() or os.environ["RANK"] == "0":  # under torchrun, learner 0 reads it
        state = resumable_state(run_dir, config, total_steps)
    if total_steps is not None:
        config.total_steps = total_steps
    if config.num_learners > 1 and not launched_by_torchrun():
        state = None  # learner 0 reads it again and sends each learner its shard
    return _run(_Request(config, show_progress, None, hooks, run_dir, state))


@dataclass
class _Request:
    """What a call of :func:`train` or :func:`resume` asks for; ``run_dir`` and ``state``: a resume's run
    and checkpoint (learner 0 reads the checkpoint where ``state`` is None)."""

    config: TrainConfig
    show_progress: bool
    on_run_dir: Callable[[Path], None] | None
    hooks: list[Hook]
    run_dir: Path | None = None
    state: dict[str, Any] | None = None


def _run(request: _Request) -> TrainResult:
    """The run in this process, a group of learner processes started here, or this process's share of the
    group torchrun started."""
    if launched_by_torchrun():
        return _train_in_launched_group(request)
    config = request.config
    if config.num_learners > 1:
        return _launch(request)
    trainer = trainer_class(config.algo)(config, run_dir=request.run_dir, show_progress=request.show_progress)
    try:
        if request.on_run_dir is not None:
            request.on_run_dir(trainer.run_dir)
        if request.state is not None:
            trainer.load_state_dict(request.state)
        return trainer.train(request.hooks)
    finally:
        trainer.close()


def _launch(request: _Request) -> TrainResult:
    """Start ``config.num_learners`` learner processes on this machine and wait for them; the hooks are
    pickled into them (learner 0 calls them)."""
    config, run_dir = request.config, request.run_dir
    config.validate()
    check_learners(config.num_learners, config.device)
    payload = {
        "config": config.to_dict(),
        "run_dir": str(run_dir) if run_dir is not None else None,
        "show_progress": request.show_progress,
        "hooks": request.hooks,
        "envs": picklable_factory(
            config.env, "num_learners > 1 starts a process per learner", "use --learners 1"
        ),  # an id the caller registered exists in the learners too
    }

    def on_report(kind: str, value: Any) -> None:
        if kind == "run_dir" and request.on_run_dir is not None:
            request.on_run_dir(Path(value))

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
    for env_id, factory in payload["envs"].items():
        register_env(env_id, factory, overwrite=True)
    config = TrainConfig.from_dict(payload["config"], where="the learner's config")
    if not config.torch_threads and group.device.type == "cpu":  # the learners share the cores
        config.torch_threads = max(1, available_cores() // group.world_size)
    run_dir = Path(payload["run_dir"]) if payload["run_dir"] else None

    def on_run_dir(path: Path) -> None:
        report("run_dir", str(path))

    try:
        result = _run_learner(
            group, _Request(config, payload["show_progress"], on_run_dir, payload["hooks"], run_dir)
        )
    except TrainingInterrupted as interrupted:
        if group.is_main:
            report("interrupted", (str(interrupted.run_dir), interrupted.steps, str(interrupted.checkpoint)))
        return
    if group.is_main:
        report("finished", (str(result.run_dir), result.summary))


def _train_in_launched_group(request: _Request) -> TrainResult:
    """This process is one learner of a group torchrun started (RANK, WORLD_SIZE, ... are set)."""
    config = request.config
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
        result = _run_learner(group, dataclasses.replace(request, config=config))
    except TrainingInterrupted:
        group.close(finished=True)
        raise
    except BaseException:
        group.close()
        raise
    group.close(finished=True)
    return result


def _run_learner(group: LearnerGroup, request: _Request) -> TrainResult:
    """Train as one learner of ``group`` (learner 0 alone calls the hooks); with a ``run_dir``, resume that
    run from its latest checkpoint (learner 0 reads it, unless the request holds its ``state``)."""
    run_dir, state = request.run_dir, request.state
    trainer = Trainer(request.config, run_dir=run_dir, show_progress=request.show_progress, group=group)
    try:
        if group.is_main and request.on_run_dir is not None:
            request.on_run_dir(trainer.run_dir)
        if run_dir is not None:
            if group.is_main and state is None:
                latest = CheckpointManager(run_dir).latest()
                assert latest is not None, (
                    "a run resumes from its latest checkpoint (resume checked it has one)"
                )
                state = load_checkpoint(latest, map_location="cpu")
            trainer.load_group_state(state)
        return trainer.train(request.hooks)
    finally:
        trainer.close()
