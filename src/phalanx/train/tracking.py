"""Experiment tracking with Weights & Biases: a hook that the Trainer attaches when ``track = "wandb"``.

TensorBoard needs no tracker: every run writes its events (:class:`~phalanx.train.logging.RunLogger`).
With ``track = "wandb"``, learner 0's Trainer starts a W&B run when it opens the run directory
(:func:`start_tracking`, before anything is trained: a tracker that cannot start stops the run there,
unless ``track_optional``) and adds the :class:`WandbTracker` hook to every ``train``. The W&B run gets

- the config, as config.yaml holds it (again at each ``train``: a population's hand-over changes the
  hyperparameters),
- every row of metrics.csv at its ``steps``, as it is logged (:meth:`~phalanx.train.hooks.Hook.on_log`), so
  that W&B has what the file has: the rates, the training episodes, the learner's metrics and the numbers
  of the user's hooks,
- every evaluation (the columns of evaluations.csv) at the step of the weights evaluated,
- every video that appears in ``RUN_DIR/videos/`` named ``<name>_step<N>.mp4`` (or ``.gif``), at step N,
- curve.png and the numbers of summary.json when a ``train`` ends,

on one x axis, ``steps`` (``define_metric``), so that what is logged late (an evaluation process's
results, videos) lands at its step. The names are TensorBoard's tags (``rollout/episode_return_mean``,
``train/policy_loss``, ``time/steps_per_second``, ``eval/return_mean``, ...).

The W&B run is named after the run directory, keeps its files in ``RUN_DIR/wandb/`` and its id in
``RUN_DIR/wandb_run_id.txt``, so that ``phalanx resume`` continues the same W&B run. It ends when the
trainer is closed (finished), on Ctrl+C (exit code 255, as wandb ends a script that Ctrl+C stopped; the
trainer saved a checkpoint) or on an error (failed). A member of a population (``POPULATION/members/<id>``,
next to ``POPULATION/population.yaml``) is a W&B run of job type ``member`` in the group named after the
population directory, one W&B run for all the tasks it trains.

A W&B call that fails while training goes on (the service died, a full disk) ends the tracking with a
warning, never the training: metrics.csv, evaluations.csv and TensorBoard have every number.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import string
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.config import TrainConfig
from phalanx.errors import ConfigError, import_optional
from phalanx.files import write_text_atomic
from phalanx.train.logging import tensorboard_tag
from phalanx.train.loop import TrainingInterrupted
from phalanx.train.run import Hook, Run

RUN_ID_FILE = "wandb_run_id.txt"
"""In the run directory: the id of its W&B run, which a resume continues."""
VIDEO_FILE = re.compile(r"(?P<name>.+)_step(?P<steps>\d+)\.(?:mp4|gif)")
"""A video recorded during training, in ``RUN_DIR/videos/``: logged at step N as ``videos/<name>``."""
INTERRUPTED = 255
"""The exit code of a W&B run that Ctrl+C ended (wandb's own, for a script ended by Ctrl+C)."""
FAILED = 1
"""The exit code of a W&B run that an error ended: W&B marks it failed."""
INSTALL = "pip install 'phalanx[wandb]'"


def start_tracking(config: TrainConfig, run_dir: Path, created: bool) -> WandbTracker | None:
    """The tracker ``config.track`` asks for, its W&B run started in ``run_dir``; None without ``track``.

    A tracker that cannot start (wandb not installed, not logged in, the server unreachable, a setting W&B
    refuses) is a ConfigError that says why and how to fix it, after removing the files the attempt
    wrote (and ``run_dir`` itself if it was ``created`` for this run and is left empty); with
    ``config.track_optional`` it is a warning, and the run trains without the tracker.
    """
    if config.track is None:
        return None
    run_dir = Path(run_dir)
    leftovers = [path for path in (run_dir / RUN_ID_FILE, run_dir / "wandb") if not path.exists()]
    try:
        run = _start_wandb_run(config, run_dir)
    except Exception as error:  # noqa: BLE001 - whatever stops wandb from starting, said in one paragraph
        for path in leftovers:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        reason = str(error) if isinstance(error, ConfigError) else _start_failure(error)
        if not config.track_optional:
            if created:
                with contextlib.suppress(OSError):  # only if empty: nothing of a run is ever removed
                    run_dir.rmdir()
            raise ConfigError(
                f"{reason} Nothing was trained. To train without W&B when it cannot start, pass "
                "--track-optional (track_optional: true); to train without it, drop --track wandb."
            ) from None
        warnings.warn(
            f"{reason} track_optional is set: training goes on without W&B (metrics.csv, evaluations.csv "
            "and TensorBoard are written as always).",
            stacklevel=2,
        )
        return None
    return WandbTracker(run, run_dir)


def _start_wandb_run(config: TrainConfig, run_dir: Path) -> Any:
    """A W&B run for ``run_dir``: a new one, or the one whose id the run directory keeps (a resume)."""
    wandb = import_optional(
        "wandb",
        ConfigError,
        f"track = 'wandb' needs Weights & Biases, an optional extra: {INSTALL}.",
        packages=("wandb",),
    )
    id_file = run_dir / RUN_ID_FILE
    if id_file.is_file():
        run_id = id_file.read_text().strip()
    else:  # kept before the run starts, so that a run killed while W&B starts is resumed under it too
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        write_text_atomic(id_file, run_id + "\n")
    population = population_of(run_dir)
    run = wandb.init(
        project=config.wandb_project or os.environ.get("WANDB_PROJECT") or "phalanx",
        entity=config.wandb_entity,  # None: WANDB_ENTITY, else the user's default entity
        name=run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=config.to_dict(),
        group=population,  # None: WANDB_RUN_GROUP if it is set
        job_type="member" if population is not None else None,
        reinit="create_new",  # a process may train several runs at once (a serial population's members)
    )
    run.define_metric("steps")
    run.define_metric("*", step_metric="steps")
    return run


def _start_failure(error: BaseException) -> str:
    """Why wandb did not start, and the fixes."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return (
        f"track = 'wandb': the W&B run could not start ({type(error).__name__}: {first}). Log in with "
        "`wandb login` (or set WANDB_API_KEY), check the network and the --wandb-project and "
        "--wandb-entity names, or log offline with WANDB_MODE=offline and upload later with `wandb sync`."
    )


def population_of(run_dir: Path) -> str | None:
    """The name of the population whose member ``run_dir`` is (``POPULATION/members/<id>``, with
    ``POPULATION/population.yaml``: the layout of :mod:`phalanx.population.orchestrator`), or None."""
    members = Path(run_dir).resolve().parent
    if members.name == "members" and (members.parent / "population.yaml").is_file():
        return members.parent.name
    return None


class WandbTracker(Hook):
    """Logs a run to its W&B run ``run`` (see the module docstring); the Trainer attaches it to every
    ``train`` and ends the W&B run with :meth:`finish`."""

    def __init__(self, run: Any, run_dir: Path) -> None:
        self.run = run
        self.run_dir = Path(run_dir)
        self.videos_logged: set[str] = set()

    # -- the hook --------------------------------------------------------------------------------
    def on_start(self, trainer: Run) -> None:
        # The videos before the step this train() starts from are W&B's already (a resume, a population
        # member's next task); the rows a resume drops and writes again are logged again, as they come.
        for path in self._videos():
            if int(_video_name(path)["steps"]) <= trainer.steps:
                self.videos_logged.add(path.name)
        config = trainer.config.to_dict()  # after a hand-over: the member's new hyperparameters
        self._safely(lambda run: run.config.update(config, allow_val_change=True))

    def on_log(self, trainer: Run, row: dict[str, Any]) -> None:
        """A row of metrics.csv, at its step, then the videos that appeared since the last row."""
        values = {
            tensorboard_tag(key): value for key, value in row.items() if key != "steps" and value is not None
        }
        self._log({"steps": int(row["steps"]), **values})
        self._log_videos()

    def on_evaluation(self, trainer: Run, row: dict[str, float]) -> None:
        values: dict[str, float] = {"steps": int(row["steps"])}
        for key, value in {**row, "result_wall_time_s": trainer.stopwatch()}.items():
            if key in ("wall_time_s", "result_wall_time_s"):
                values[f"eval/{key}"] = value
            elif key != "steps":
                values[tensorboard_tag(key)] = value
        self._log(values)

    def on_end(self, trainer: Run, summary: dict[str, Any]) -> None:
        self._log_videos()
        curve = self.run_dir / "curve.png"
        if self.run is not None and curve.is_file():
            import wandb

            self._log({"steps": trainer.steps, "curve": wandb.Image(str(curve))})
        numbers = {
            key: value
            for key, value in summary.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        self._safely(lambda run: run.summary.update(numbers))

    # -- the W&B run -----------------------------------------------------------------------------
    def finish(self, error: BaseException | None = None) -> None:
        """End the W&B run: finished, or after ``error``: Ctrl+C (:data:`INTERRUPTED`; the trainer saved
        a checkpoint, a resume continues the W&B run) or failed (:data:`FAILED`). Once; later calls
        and the hook's methods do nothing."""
        if self.run is None:
            return
        self._log_videos()  # what the run recorded last (a Ctrl+C, an error: since the last row)
        run, self.run = self.run, None
        if error is None:
            exit_code = 0
        elif isinstance(error, (KeyboardInterrupt, TrainingInterrupted)):
            exit_code = INTERRUPTED
        else:
            exit_code = FAILED
        try:
            run.finish(exit_code=exit_code)
        except Exception as failure:  # noqa: BLE001 - the run's own files are whole; say so, go on
            warnings.warn(
                f"the W&B run of {self.run_dir} did not finish cleanly ({type(failure).__name__}: "
                f"{failure}); its local files are in {self.run_dir / 'wandb'}.",
                stacklevel=2,
            )

    def _log_videos(self) -> None:
        if self.run is None:
            return
        import wandb

        for path in self._videos():
            if path.name not in self.videos_logged and self.run is not None:
                match = _video_name(path)
                steps = int(match["steps"])
                self.videos_logged.add(path.name)
                video = wandb.Video(str(path), caption=f"step {steps:,}")
                self._log({"steps": steps, f"videos/{match['name']}": video})

    def _videos(self) -> list[Path]:
        """The videos recorded during training (``<name>_step<N>.mp4|gif``), by step; in-progress
        temporary files do not match."""
        folder = self.run_dir / "videos"
        if not folder.is_dir():
            return []
        videos = [path for path in folder.iterdir() if VIDEO_FILE.fullmatch(path.name)]
        return sorted(videos, key=lambda path: int(_video_name(path)["steps"]))

    def _log(self, values: dict[str, Any]) -> None:
        self._safely(lambda run: run.log(values))

    def _safely(self, call: Callable[[Any], None]) -> None:
        """``call(run)``, a W&B call: skipped once tracking has stopped; one that fails stops the tracking,
        with a warning, and training goes on."""
        if self.run is None:
            return
        try:
            call(self.run)
        except Exception as error:  # noqa: BLE001 - never the training's end
            run, self.run = self.run, None
            warnings.warn(
                f"W&B tracking of {self.run_dir} stopped: {type(error).__name__}: {error}. Training goes "
                "on; metrics.csv, evaluations.csv and TensorBoard have every number.",
                stacklevel=3,
            )
            with contextlib.suppress(Exception):
                run.finish(exit_code=FAILED)


def _video_name(path: Path) -> re.Match[str]:
    """The parts of the name of a video that :meth:`WandbTracker._videos` lists (names that match)."""
    match = VIDEO_FILE.fullmatch(path.name)
    assert match is not None, f"not a video's name: {path.name}"
    return match
