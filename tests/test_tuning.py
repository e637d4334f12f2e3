"""Hyperparameter search with Optuna (phalanx.tuning, `phalanx tune`): trials as run directories trained
in chunks, intermediate reports and pruning, best.yaml, resume from the storage (also after Ctrl+C), the
process backend, the default search spaces, bad input and the CLI."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip(
    "optuna", reason="phalanx tune needs the optional extra: pip install 'phalanx[tune]'"
)

from phalanx import make_config  # noqa: E402
from phalanx.cli import main, parse_train_args, parse_tune_args  # noqa: E402
from phalanx.config import TrainConfig, load_yaml, presets  # noqa: E402
from phalanx.errors import ConfigError  # noqa: E402
from phalanx.registry import algorithm_names  # noqa: E402
from phalanx.tuning import TuneConfig, TuneFailed, tune, with_hyperparameters  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 8 * 32  # one rollout of the tiny PPO below
SEARCH = {"learning_rate": "log:1e-4,1e-2", "hidden_sizes": "choice:[16,16],[32]"}
TINY = [
    "--num-envs", "8", "--horizon", "32", "--minibatch-size", "64", "--epochs", "2", "--hidden-sizes", "16",
    "16", "--eval-every", "0", "--eval-episodes", "4", "--log-every", "1e9", "--torch-threads", "1",
]  # fmt: skip


def tiny_base(**overrides) -> TrainConfig:
    settings = dict(
        num_envs=8,
        total_steps=2 * CHUNK,
        eval_every=0,
        eval_episodes=4,
        log_every=10**9,
        torch_threads=1,
        hyperparameters={"horizon": 32, "minibatch_size": 64, "epochs": 2, "hidden_sizes": (16, 16)},
    )
    settings.update(overrides)
    return make_config("ppo", "CartPole-v1", **settings)


def load_study(directory: Path):
    return optuna.load_study(
        study_name=directory.name, storage=f"sqlite:///{directory.resolve() / 'study.db'}"
    )


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """3 trials of 2 chunks each, random sampler, no pruner, in this process."""
    directory = tmp_path_factory.mktemp("tune") / "cartpole"
    started = time.perf_counter()
    result = tune(
        tiny_base(),
        3,
        search=SEARCH,
        sampler="random",
        pruner="none",
        interval=CHUNK,
        directory=directory,
        show_progress=False,
    )
    print(f"3 trials x {2 * CHUNK} steps, serial: {time.perf_counter() - started:.1f} s")
    return directory, result


def test_every_trial_is_a_run_directory_trained_in_chunks_reported_to_the_study(study):
    directory, result = study
    trials = load_study(directory).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    for trial in trials:
        run_dir = directory.resolve() / "trials" / f"trial_{trial.number:04d}"
        assert trial.user_attrs["run_dir"] == str(run_dir)
        assert (run_dir / "checkpoints").is_dir() and (run_dir / "summary.json").is_file()
        assert sorted(trial.intermediate_values) == [CHUNK, 2 * CHUNK]  # one report per chunk
        assert trial.value == trial.intermediate_values[2 * CHUNK]  # the objective: the final evaluation
        config = TrainConfig.from_dict(load_yaml(run_dir / "config.yaml"))
        assert config.hyperparameters.learning_rate == trial.params["learning_rate"]
        assert config.eval_process is False  # the chunk's score is its own, final evaluation
    assert result.best_value == max(t.value for t in trials)
    assert result.best_run_dir == directory.resolve() / "trials" / f"trial_{result.best_trial:04d}"
    rows = (directory / "trials.csv").read_text().splitlines()
    assert rows[0].startswith("trial,state,value,steps,seconds,learning_rate,hidden_sizes,run_dir")
    assert len(rows) == 4 and all(",complete," in row for row in rows[1:])


def test_best_yaml_loads_exactly_as_the_best_trials_config(study):
    directory, result = study
    best = TrainConfig.from_dict(
        load_yaml(directory.resolve() / "trials" / f"trial_{result.best_trial:04d}" / "config.yaml")
    )
    expected = dataclasses.replace(best, run_dir=None, eval_process=tiny_base().eval_process)
    assert result.best_config == directory / "best.yaml"
    loaded = parse_train_args(["ppo", "CartPole-v1", "--config", str(result.best_config)])  # `phalanx train`
    assert loaded == expected
    assert isinstance(result.best_params["hidden_sizes"], tuple)
    assert loaded == with_hyperparameters(tiny_base(), result.best_params)


def test_rerunning_continues_the_study_and_refuses_another_search(study, tmp_path, capsys):
    directory = tmp_path / "cartpole"
    shutil.copytree(study[0], directory)
    before = {t.number: t.value for t in load_study(directory).trials}
    tune(tiny_base(), 3, search=SEARCH, sampler="random", pruner="none", interval=CHUNK, directory=directory,
         show_progress=True)  # fmt: skip
    assert "nothing to do: the study" in capsys.readouterr().err
    tune(tiny_base(), 4, search=SEARCH, sampler="random", pruner="none", interval=CHUNK, directory=directory,
         show_progress=False)  # fmt: skip
    trials = load_study(directory).trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert {t.number: t.value for t in trials[:3]} == before  # kept, not trained again
    assert trials[3].state.name == "COMPLETE"
    assert trials[3].params != trials[0].params  # a resumed sampler does not replay the first draws
    with pytest.raises(ConfigError, match=r"another search: search.learning_rate 'log:0.0001, 0.01' -> 'log"):
        tune(tiny_base(), 5, search={**SEARCH, "learning_rate": "log:1e-3,1e-2"}, interval=CHUNK,
             directory=directory, show_progress=False)  # fmt: skip


class PruneAllButTheFirst(optuna.pruners.BasePruner):
    """Deterministic: every trial after the first is pruned at its first report."""

    def prune(self, study, trial) -> bool:
        return trial.number > 0


def test_the_pruner_stops_trials_after_a_chunk(tmp_path):
    directory = tmp_path / "pruned"
    pruner = PruneAllButTheFirst()
    result = tune(tiny_base(), 3, search=SEARCH, sampler="random", pruner=pruner, interval=CHUNK,
                  directory=directory, show_progress=False)  # fmt: skip
    trials = load_study(directory).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert result.best_trial == 0
    for trial in trials[1:]:
        assert list(trial.intermediate_values) == [CHUNK]
        assert trial.value == trial.intermediate_values[CHUNK]  # Optuna keeps the last report as its value
        summary = (Path(trial.user_attrs["run_dir"]) / "summary.json").read_text()
        assert f'"total_steps": {CHUNK},' in summary  # trained one chunk, not the budget
    assert "pruned" in (directory / "trials.csv").read_text()


def test_a_study_of_only_pruned_trials_has_no_best_config(tmp_path):
    class PruneAll(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            return True

    with pytest.raises(TuneFailed, match=r"no trial .* completed \(2 pruned\)"):
        tune(tiny_base(), 2, search=SEARCH, pruner=PruneAll(), interval=CHUNK, directory=tmp_path / "t",
             show_progress=False)  # fmt: skip
    assert not (tmp_path / "t" / "best.yaml").exists()


@pytest.mark.slow  # the default suite runs the process backend in the Ctrl+C test below
def test_parallel_trials_run_on_the_process_backend(tmp_path):
    directory = tmp_path / "parallel"
    started = time.perf_counter()
    result = tune(tiny_base(total_steps=CHUNK), 2, search=SEARCH, sampler="random", pruner="none", parallel=2,
                  directory=directory, show_progress=False)  # fmt: skip
    print(f"2 trials x {CHUNK} steps, 2 processes: {time.perf_counter() - started:.1f} s")
    assert (directory / "tune.yaml").read_text().count("backend: process") == 1
    trials = load_study(directory).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert all((Path(t.user_attrs["run_dir"]) / "summary.json").is_file() for t in trials)
    assert result.best_value == max(t.value for t in trials)


# -- Ctrl+C and resume ------------------------------------------------------------------------------
def _processes_in_group(group: int) -> list[str]:
    return subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()


def _reported(directory: Path) -> bool:
    """Whether a trial of the study in ``directory`` has reported a chunk's score yet. Read-only SQL, not
    Optuna: opening the storage with Optuna creates its tables when they are missing, which raced the
    tune process creating them (a CI failure: "table studies already exists")."""
    path = directory / "study.db"
    if not path.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as db:
            return db.execute("SELECT COUNT(*) FROM trial_intermediate_values").fetchone()[0] > 0
    except sqlite3.OperationalError:  # the tables are not there yet, or the file is locked
        return False


@pytest.mark.parametrize(
    "stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c-to-the-group", "sigterm-to-tune"]
)
def test_a_stop_signal_saves_the_running_trials_and_the_same_command_continues_them(tmp_path, stop):
    """Two trials at once on the process backend; Ctrl+C (to the whole group), or SIGTERM to `phalanx tune`
    alone (which asks the trials to save); the same command (here in this process, one trial at a time)
    continues both from their checkpoints. Chunks of 4 rollouts: after its first report a trial is seconds
    from its end, so the signal reaches both while they run, even on a loaded machine."""
    directory = tmp_path / "interrupted"
    command = [
        sys.executable, "-m", "phalanx", "tune", "ppo", "CartPole-v1", "--trials", "2", "--sampler", "random",
        "--pruner", "none", "--interval", str(4 * CHUNK), "--total-steps", str(12 * CHUNK), *TINY, "--dir",
        str(directory), "--search", "learning_rate=log:1e-4,1e-2", "--parallel", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while not _reported(directory):
        assert process.poll() is None, process.stdout.read()
        assert time.time() < deadline, "no report within 240 s"
        time.sleep(0.2)
    if stop == signal.SIGINT:
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + stop, output
    assert "Rerun the same command" in " ".join(output.split())
    deadline = time.time() + 30  # the trials' processes see their parent gone and end
    while _processes_in_group(process.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert _processes_in_group(process.pid) == []
    before = load_study(directory).trials
    assert [t.state.name for t in before] == ["RUNNING", "RUNNING"]  # left running, with checkpoints
    reported = {t.number: dict(t.intermediate_values) for t in before}

    assert main([*command[3:-2], "--parallel", "1"]) == 0  # the same command, one trial at a time
    after = load_study(directory).trials
    assert [t.number for t in after] == [0, 1]  # both went on, no new trial took their place
    assert [t.state.name for t in after] == ["COMPLETE"] * 2
    for trial in before:
        continued = after[trial.number]
        assert continued.params == trial.params
        assert {step: continued.intermediate_values[step] for step in reported[trial.number]} == reported[
            trial.number
        ]
        assert sorted(continued.intermediate_values) == [4 * CHUNK, 8 * CHUNK, 12 * CHUNK]


# -- search spaces and bad input --------------------------------------------------------------------
@pytest.mark.parametrize("algo", algorithm_names())
def test_the_default_search_space_fits_every_preset(algo):
    for env in presets(algo) or ["CartPole-v1"]:
        config = TuneConfig(base=make_config(algo, env))
        config.validate()
        assert "learning_rate" in config.space() and "gamma" in config.space()


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"search": {"learning_rate": "log:1e-2,1e-4"}},
            r"inverted or equal: low 0.01 >= high 0.0001.*log:0.0001",
        ),
        ({"search": {"gamma": "uniform:0.99,0.99"}}, r"inverted or equal"),
        ({"search": {"learning_rate": "log:0,1e-3"}}, r"log-uniform search needs low > 0"),
        (
            {"search": {"learning_rat": "log:1e-5,1e-3"}},
            r"not a hyperparameter of ppo. Did you mean learning_rate",
        ),
        ({"search": {"learning_rate": "logg:1e-5,1e-3"}}, r"unknown kind 'logg'. Did you mean 'log'"),
        (
            {"search": {"learning_rate": "int:1,10"}},
            r"learning_rate is a float, not an integer; search it with",
        ),
        ({"search": {"epochs": "uniform:1,10"}}, r"epochs is an integer, not a float; search it with int"),
        ({"search": {"activation": "choice:tanh"}}, r"a choice needs at least two values"),
        ({"search": {"activation": "choice:tanh,sigmoid"}}, r"the value 'sigmoid' makes an invalid config"),
        ({"search": {"minibatch_size": "int:64,1024"}}, r"the value 1024 makes an invalid config"),
        ({"search": {"epochs": "int:1,10,4"}}, r"never reaches 10 \(its values are 1, 5, ..., 9\)"),
        ({"search": {"horizon": "int:16,4096"}}, r"the value 4096 .*one rollout, horizon 4096 x num_envs"),
        ({"sampler": "cmaes"}, r"unknown sampler 'cmaes'.*tpe, random"),
        ({"pruner": "medain"}, r"unknown pruner 'medain'. Did you mean 'median'"),
        ({"trials": 0}, r"trials = 0 is invalid"),
        ({"parallel": 0}, r"parallel = 0 is invalid"),
        ({"backend": "ray"}, r"unknown backend 'ray'"),
    ],
)
def test_bad_search_settings_are_refused_before_any_trial(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        TuneConfig(base=tiny_base(), **{"directory": str(tmp_path / "t"), **settings}).validate()


def test_a_storage_optuna_cannot_open_is_refused_before_any_trial(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot open the Optuna storage 'nosuchdb://x'"):
        tune(tiny_base(), 2, storage="nosuchdb://x", directory=tmp_path / "t", show_progress=False)
    assert not (tmp_path / "t" / "trials").exists()


def test_without_optuna_the_error_says_which_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ConfigError, match=r"pip install 'phalanx\[tune\]'"):
        tune(tiny_base(), 2, directory=tmp_path / "t", show_progress=False)


def test_cli_parses_tune_flags_and_train_flags(tmp_path):
    config = parse_tune_args(
        ["ppo", "CartPole-v1", "--trials", "5", "--sampler", "random", "--pruner", "none", "--parallel", "2",
         "--interval", "1e3", "--dir", str(tmp_path), "--search", "learning_rate=log:1e-5,1e-3",
         "--search", "activation=choice:tanh,relu", "--total-steps", "4096", "--num-envs", "8",
         "--minibatch-size", "64"]
    )  # fmt: skip
    assert (config.trials, config.sampler, config.pruner, config.parallel) == (5, "random", "none", 2)
    assert config.interval == 1000 and config.resolved_backend() == "process"
    assert [d.text() for d in config.search.values()] == ["log:1.0e-05, 0.001", "choice:tanh, relu"]
    assert (config.base.total_steps, config.base.num_envs) == (4096, 8)


def test_cli_reports_bad_input_as_an_error(capsys):
    assert main(["tune", "ppo", "CartPole-v1", "--trials", "2", "--search", "gamma=uniform:1.0,0.9"]) == 2
    assert "bounds are inverted" in capsys.readouterr().err
    assert main(["tune", "ppo", "CartPole-v1", "--trials", "2", "--search", "gamma"]) == 2
    assert "expected NAME=KIND:ARGS" in capsys.readouterr().err
