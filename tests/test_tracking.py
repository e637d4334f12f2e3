"""Experiment tracking with Weights & Biases (phalanx.train.tracking), offline, read back from what W&B wrote.

wandb runs with WANDB_MODE=offline and no server to reach: each W&B run is a transaction log,
``RUN_DIR/wandb/offline-run-*/run-<id>.wandb`` (what ``wandb sync`` uploads), with its media files
beside it. :func:`read_records` reads that log (LevelDB's log format of protobuf ``Record`` s, wandb's
own ``wandb.proto``), and the tests check the config, every row and evaluation at its step, curve.png,
the videos, the exit code, the resume of the same run, and a population's grouping.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path

import pytest
import yaml
from PIL import Image

import phalanx
from phalanx.cli import parse_population_args, parse_train_args
from phalanx.config import TrainConfig
from phalanx.errors import ConfigError
from phalanx.population import run_population
from phalanx.population.evolution import PopulationConfig, Resources
from phalanx.train.logging import read_table
from phalanx.train.loop import TrainingInterrupted
from phalanx.train.run_dir import config_differences
from phalanx.train.tracking import RUN_ID_FILE

wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed: pip install 'phalanx[wandb]'")
from wandb.proto import wandb_internal_pb2  # noqa: E402 - after the skip

ROLLOUT = 8 * 16  # env steps of one iteration of the tiny PPO below


@pytest.fixture(scope="module", autouse=True)
def offline_wandb(tmp_path_factory):
    """wandb offline, its own folders in a temporary directory, no server it could reach, no user settings."""
    home = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("WANDB_")]:
            patch.delenv(name)
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        patch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
        patch.setenv("NETRC", str(home / "netrc"))  # no API key
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            patch.setenv(name, str(home / name.lower()))
        yield
    wandb.teardown()  # its service process ends with the module's tests


def tiny(run_dir: Path, algo: str = "ppo", env: str = "CartPole-v1", **overrides) -> TrainConfig:
    settings = dict(
        num_envs=8,
        total_steps=16 * ROLLOUT,
        eval_every=8 * ROLLOUT,
        eval_episodes=2,
        eval_process=False,  # the CartPole preset's: a process start per run
        log_every=2 * ROLLOUT,
        torch_threads=1,
        track="wandb",
        run_dir=str(run_dir),
    )
    if algo == "ppo":
        settings["hyperparameters"] = {
            "horizon": 16,
            "minibatch_size": 64,
            "epochs": 1,
            "hidden_sizes": (16,),
        }
    settings.update(overrides)
    return phalanx.make_config(algo, env, **settings)


class RecordsVideos(phalanx.Hook):
    """Writes RUN_DIR/videos/eval_step<N>.gif as the video hook does (a temporary name, then renamed),
    and a number of its own, every 4 iterations."""

    every = 4 * ROLLOUT

    def after_iteration(self, trainer):
        folder = trainer.run_dir / "videos"
        folder.mkdir(exist_ok=True)
        partial = folder / "eval_step.gif.partial"
        Image.new("RGB", (8, 8), (trainer.steps % 256, 0, 0)).save(partial, format="GIF")
        os.replace(partial, folder / f"eval_step{trainer.steps}.gif")
        return {"my_number": trainer.steps / 2}


class StopsOrFails(phalanx.Hook):
    """At the 4th iteration: Ctrl+C (the request the SIGINT handler makes), or an error."""

    def __init__(self, error: bool) -> None:
        self.error = error

    def after_iteration(self, trainer):
        if trainer.steps >= 4 * ROLLOUT:
            if self.error:
                raise RuntimeError("a bug in a hook")
            trainer.stop_requested.set()


# -- reading what W&B wrote ---------------------------------------------------------------------------
def read_records(path: Path) -> list:
    """The records of a W&B transaction log (a ``.wandb`` file): a 7-byte header (":W&B", magic 0xBEE1,
    version 0), then LevelDB log records in 32 KiB blocks (checksum, length, kind; kinds 1 full, 2
    first, 3 middle, 4 last), each record a ``wandb_internal_pb2.Record``."""
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    block, position, payload, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:  # zeros to the end of the block
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        payload = chunk if kind in (1, 2) else payload + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            records.append(record)
    return records


class OfflineRun:
    """One offline W&B run (a folder ``offline-run-<time>-<id>``): its records, read."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (log,) = folder.glob("run-*.wandb")
        # wandb's service writes the log behind the run: wait until it holds the run's end (its exit)
        deadline = time.monotonic() + 60
        self.records = read_records(log)
        while not self.of("exit") and time.monotonic() < deadline:
            time.sleep(0.05)
            self.records = read_records(log)
        self.run = next(r.run for r in self.records if r.WhichOneof("record_type") == "run")

    def of(self, kind: str) -> list:
        return [getattr(r, kind) for r in self.records if r.WhichOneof("record_type") == kind]

    @property
    def config(self) -> dict:
        config = {}
        for update in [self.run.config, *self.of("config")]:
            config.update({item.key: json.loads(item.value_json) for item in update.update})
        return config

    @property
    def history(self) -> list[dict]:
        return [
            {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in history.item}
            for history in self.of("history")
        ]

    @property
    def exit_code(self) -> int | None:
        exits = self.of("exit")
        return exits[-1].exit_code if exits else None

    def media(self, kind: str) -> list[Path]:
        return sorted((self.folder / "files" / "media" / kind).rglob("*.*"))


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    return [OfflineRun(folder) for folder in sorted((run_dir / "wandb").glob("offline-run-*"))]


# -- one tracked run, read by several tests ----------------------------------------------------------
@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tracked") / "ppo_run"
    phalanx.train(tiny(run_dir), hooks=[RecordsVideos()], show_progress=False)
    (first,) = offline_runs(run_dir)
    return run_dir, first


def test_the_config_is_logged_as_config_yaml_holds_it_under_the_run_directorys_name(tracked):
    run_dir, run = tracked
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    logged = {key: value for key, value in run.config.items() if key != "_wandb"}
    assert logged == config
    assert logged["track"] == "wandb" and logged["hyperparameters"]["horizon"] == 16
    assert run.run.display_name == run_dir.name and run.run.project == "phalanx"
    assert run.run.run_id == (run_dir / RUN_ID_FILE).read_text().strip()
    assert run.exit_code == 0  # finished


def test_every_metric_of_every_row_lands_at_its_steps_on_one_step_axis(tracked):
    run_dir, run = tracked
    rows = read_table(run_dir / "metrics.csv")
    assert len(rows) == 9 and "my_number" in rows[-1]  # a hook's number is a column, and logged
    logged = {entry["steps"]: entry for entry in run.history if "rollout/episode_return_mean" in entry}
    assert sorted(logged) == [row["steps"] for row in rows]
    for row in rows:
        entry = logged[row["steps"]]
        assert entry["rollout/episode_return_mean"] == pytest.approx(row["episode_return_mean"])
        assert entry["time/steps_per_second"] == pytest.approx(row["steps_per_second"])
        assert entry["train/policy_loss"] == pytest.approx(row["policy_loss"])
        if "my_number" in row:
            assert entry["train/my_number"] == pytest.approx(row["my_number"])
        assert len(entry) - 4 == len(row) - 1  # every column (but steps) once; _step, _runtime, _timestamp
    metrics = {metric.glob_name or metric.name: metric.step_metric for metric in run.of("metric")}
    assert metrics["*"] == "steps"  # W&B draws every number against env steps


def test_every_evaluation_lands_at_the_evaluated_step(tracked):
    run_dir, run = tracked
    evaluations = read_table(run_dir / "evaluations.csv")
    logged = {entry["steps"]: entry for entry in run.history if "eval/return_mean" in entry}
    assert sorted(logged) == [row["steps"] for row in evaluations] == [8 * ROLLOUT, 16 * ROLLOUT]
    for row in evaluations:
        entry = logged[row["steps"]]
        assert entry["eval/return_mean"] == pytest.approx(row["eval_return_mean"])
        assert entry["eval/return_std"] == pytest.approx(row["eval_return_std"])
        assert entry["eval/length_mean"] == pytest.approx(row["eval_length_mean"])
        assert entry["eval/wall_time_s"] == pytest.approx(row["wall_time_s"])


def test_the_curve_and_every_video_are_logged_at_their_steps(tracked):
    run_dir, run = tracked
    # a media file is logged as its fields (curve/_type, curve/path, ...) and a copy beside the log
    (curve,) = [entry for entry in run.history if "curve/_type" in entry]
    assert curve["steps"] == 16 * ROLLOUT and curve["curve/_type"] == "image-file"
    image = run.folder / "files" / curve["curve/path"]
    assert image.read_bytes() == (run_dir / "curve.png").read_bytes()
    videos = {entry["steps"]: entry for entry in run.history if "videos/eval/_type" in entry}
    assert sorted(videos) == [4 * ROLLOUT, 8 * ROLLOUT, 12 * ROLLOUT, 16 * ROLLOUT]
    for steps, entry in videos.items():
        assert entry["videos/eval/_type"] == "video-file"
        logged = run.folder / "files" / entry["videos/eval/path"]
        assert logged.read_bytes() == (run_dir / "videos" / f"eval_step{steps}.gif").read_bytes()
    assert len(run.media("videos")) == 4  # every file once, the partial one never


def test_resume_continues_the_same_wandb_run_from_its_checkpoint(tracked):
    run_dir, first = tracked
    phalanx.resume(run_dir, total_steps=24 * ROLLOUT, show_progress=False)
    second = next(run for run in offline_runs(run_dir) if run.folder != first.folder)
    assert second.run.run_id == first.run.run_id  # the same W&B run, resumed ("allow")
    steps = [entry["steps"] for entry in second.history if "rollout/episode_return_mean" in entry]
    assert steps == [18 * ROLLOUT, 20 * ROLLOUT, 22 * ROLLOUT, 24 * ROLLOUT]  # only the new rows
    assert [e["steps"] for e in second.history if "eval/return_mean" in e] == [24 * ROLLOUT]
    assert second.exit_code == 0


# -- how a run ends ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("algo", "env", "error", "exit_code"),
    [("ppo", "CartPole-v1", False, 255), ("mappo", "simple_spread", True, 1)],
    ids=["ctrl-c", "error-multi-agent"],
)
def test_ctrl_c_and_an_error_end_the_wandb_run_with_what_happened(tmp_path, algo, env, error, exit_code):
    run_dir = tmp_path / "run"
    expected = RuntimeError if error else TrainingInterrupted
    with pytest.raises(expected):
        phalanx.train(tiny(run_dir, algo, env), hooks=[StopsOrFails(error)], show_progress=False)
    (run,) = offline_runs(run_dir)
    assert run.exit_code == exit_code  # 255: ended by Ctrl+C (resumable), 1: failed
    rows = [entry["steps"] for entry in run.history if "time/steps_per_second" in entry]
    assert rows == [row["steps"] for row in read_table(run_dir / "metrics.csv")]


class BreaksWandb(phalanx.Hook):
    """At the 4th iteration, the W&B run's log starts failing (as when wandb's service process died)."""

    def after_iteration(self, trainer):
        if trainer.steps == 4 * ROLLOUT:

            def log(values):
                raise BrokenPipeError("the wandb service is gone")

            trainer.tracker.run.log = log


def test_a_wandb_call_that_fails_while_training_ends_the_tracking_not_the_training(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.warns(UserWarning, match="W&B tracking of .* stopped: BrokenPipeError.*Training goes on"):
        result = phalanx.train(tiny(run_dir, eval_every=0), hooks=[BreaksWandb()], show_progress=False)
    assert result.summary["total_steps"] == 16 * ROLLOUT and result.summary["error"] is None
    (run,) = offline_runs(run_dir)
    assert run.exit_code == 1  # failed: the W&B run holds the rows up to the break only
    assert [e["steps"] for e in run.history if "time/steps_per_second" in e] == [ROLLOUT, 2 * ROLLOUT]


# -- a tracker that cannot start ---------------------------------------------------------------------
@pytest.fixture
def not_logged_in(monkeypatch):
    """Online, with no API key: wandb refuses to start before it reaches any server. (wandb reads its
    settings from the environment once per process, until ``wandb.teardown()``.)"""
    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "online")
    yield
    wandb.teardown()


def test_a_tracker_that_cannot_start_stops_the_run_before_it_exists(tmp_path, not_logged_in):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="the W&B run could not start") as error:
        phalanx.train(tiny(run_dir), show_progress=False)
    message = str(error.value)
    assert "No API key" in message and "wandb login" in message and "WANDB_MODE=offline" in message
    assert "--track-optional" in message and "Nothing was trained" in message
    assert not run_dir.exists()  # no half-made run directory: the same command works once logged in


def test_track_optional_trains_without_the_tracker_after_a_warning(tmp_path, not_logged_in):
    run_dir = tmp_path / "run"
    with pytest.warns(UserWarning, match="training goes on without W&B"):
        result = phalanx.train(
            tiny(run_dir, total_steps=2 * ROLLOUT, track_optional=True), show_progress=False
        )
    assert result.summary["total_steps"] == 2 * ROLLOUT and (run_dir / "metrics.csv").is_file()
    assert not (run_dir / "wandb").exists() and not (run_dir / RUN_ID_FILE).exists()


def test_a_missing_extra_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install 'phalanx\[wandb\]'"):
        phalanx.train(tiny(tmp_path / "run"), show_progress=False)
    assert not (tmp_path / "run").exists()


# -- settings -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"track": "mlflow"}, "track = 'mlflow' is invalid: expected one of wandb, or null"),
        ({"track": None, "wandb_project": "p"}, "wandb_project = 'p' is a Weights & Biases setting"),
        ({"wandb_project": "a/b"}, r"a W&B project name, without / \\ # \? % : \(found /\)"),
        ({"wandb_entity": ""}, "wandb_entity = '' is invalid"),
    ],
)
def test_bad_tracking_settings_are_refused_with_the_fix(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny(tmp_path, **overrides).validate()


def test_tracking_settings_may_change_on_resume(tmp_path):
    saved = tiny(tmp_path)
    changed = tiny(tmp_path, wandb_project="other", wandb_entity="team", track_optional=True)
    assert config_differences(saved, changed) == []
    assert config_differences(saved, tiny(tmp_path, track=None)) == []


def test_the_cli_flags_set_the_tracking_fields_for_train_and_population_run(capsys):
    flags = ["--track", "wandb", "--wandb-project", "P", "--wandb-entity", "E", "--track-optional"]
    config = parse_train_args(["ppo", "CartPole-v1", *flags])
    assert (config.track, config.wandb_project, config.wandb_entity, config.track_optional) == (
        "wandb",
        "P",
        "E",
        True,
    )
    population = parse_population_args(["ppo", "CartPole-v1", "--backend", "serial", *flags])
    assert population.base.track == "wandb" and population.base.wandb_project == "P"
    with pytest.raises(SystemExit):
        parse_train_args(["ppo", "CartPole-v1", "--help"])
    shown = capsys.readouterr().out
    assert all(flag in shown for flag in ("--track", "--wandb-project", "--wandb-entity", "--track-optional"))
    with pytest.raises(ConfigError, match="backend 'vectorized'.*Use --backend process"):
        parse_population_args(["ppo", "CartPole-v1", "--backend", "vectorized", "--track", "wandb"])


# -- populations ---------------------------------------------------------------------------------------
def test_each_population_member_logs_one_wandb_run_grouped_by_population(tmp_path):
    directory = tmp_path / "my_population"
    base = tiny(tmp_path, total_steps=2 * ROLLOUT, eval_every=0, log_every=ROLLOUT)
    config = PopulationConfig(
        base=base, size=2, interval=ROLLOUT, backend="serial", resources=Resources(cpus=2)
    )
    config.directory = str(directory)
    run_population(config, show_progress=False)
    ids = set()
    for member in ("m000", "m001"):
        member_dir = directory / "members" / member
        (run,) = offline_runs(member_dir)  # one W&B run for both of its tasks
        assert (run.run.run_group, run.run.job_type, run.run.display_name) == (
            "my_population",
            "member",
            member,
        )
        steps = [entry["steps"] for entry in run.history if "time/steps_per_second" in entry]
        assert steps == [ROLLOUT, 2 * ROLLOUT]  # both tasks' rows, once each
        assert run.exit_code == 0
        ids.add(run.run.run_id)
    assert len(ids) == 2


def test_the_cli_says_a_track_optional_warning_as_one_line_of_its_own(tmp_path):
    """`phalanx train ... --track-optional` when W&B cannot start: "warning: ..." in words, not Python's
    UserWarning with the source line that raised it."""
    import os
    import subprocess
    import sys

    environment = {**os.environ, "WANDB_MODE": "online", "HOME": str(tmp_path), "WANDB_DIR": str(tmp_path)}
    environment.pop("WANDB_API_KEY", None)
    command = [sys.executable, "-m", "phalanx.cli", "train", "ppo", "CartPole-v1", "--total-steps", "256",
               "--num-envs", "8", "--horizon", "16", "--minibatch-size", "64", "--eval-every", "0",
               "--eval-episodes", "2", "--track", "wandb", "--track-optional",
               "--run-dir", str(tmp_path / "r")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "warning: " in output and "training goes on without W&B" in " ".join(output.split())
    assert "UserWarning" not in output and "warnings.warn(" not in output
