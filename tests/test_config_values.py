"""Config values: repeated list flags accumulate, numbers parse alike on the CLI and in every YAML file
(1e-3, 1_000_000), wrong types get one paragraph naming the key and the file, and --import makes an
env registered in Python usable by train, eval and resume."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import phalanx
from phalanx.cli import main, parse_population_args, parse_train_args
from phalanx.config import TrainConfig, coerce, load_yaml
from phalanx.envs import registry
from phalanx.errors import ConfigError
from phalanx.population.evolution import Mutation, PopulationConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--num-envs", "8", "--eval-every", "0", "--eval-episodes", "2", "--horizon", "16",
         "--minibatch-size", "64", "--hidden-sizes", "16", "16"]  # fmt: skip


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# -- point 5: repeated flags accumulate, CLI numbers in scientific notation ----------------------------
def test_every_repeated_mutate_counts_and_scientific_bounds_are_numbers():
    # docs/population.md's own command: both mutations must survive, 1e-4 and 1e-2 are numbers
    config = parse_population_args(
        [
            "ppo",
            "CartPole-v1",
            "--size",
            "4",
            "--mutate",
            "learning_rate=log_uniform:1e-4,1e-2",
            "--mutate",
            "entropy_coef=choices:0,0.01,0.02",
        ]  # fmt: skip
    )
    assert config.mutations["learning_rate"].log_uniform == (1e-4, 1e-2)
    assert config.mutations["entropy_coef"].choices == (0, 0.01, 0.02)
    # kinds given for one name combine, as the keys of one YAML mapping do
    config = parse_population_args(
        [
            "ppo",
            "CartPole-v1",
            "--size",
            "4",
            "--mutate",
            "learning_rate=perturb:0.8,1.25",
            "--mutate",
            "learning_rate=log_uniform:1e-4,1e-2",
            "--mutate",
            "learning_rate=min:1e-5",
        ]  # fmt: skip
    )
    assert config.mutations["learning_rate"] == Mutation(
        perturb=(0.8, 1.25), log_uniform=(1e-4, 1e-2), min=1e-5
    )


def test_every_list_flag_of_train_accumulates_when_repeated():
    config = parse_train_args(["ppo", "CartPole-v1", "--hidden-sizes", "32", "--hidden-sizes", "16"])
    assert config.hyperparameters.hidden_sizes == (32, 16)
    config = parse_train_args(["ppo", "CartPole-v1", "--import", "json", "--import", "csv"])
    assert config.imports == ("json", "csv")
    # one occurrence replaces the preset's list; the same through `population run`
    assert parse_train_args(["ppo", "CartPole-v1", "--hidden-sizes", "8"]).hyperparameters.hidden_sizes == (
        8,
    )
    config = parse_population_args(
        [
            "ppo",
            "CartPole-v1",
            "--size",
            "2",
            "--hidden-sizes",
            "8",
            "--mutate",
            "gamma=steps:0.9,0.99",
            "--hidden-sizes",
            "4",
            "--import",
            "json",
        ]  # fmt: skip
    )
    assert config.base.hyperparameters.hidden_sizes == (8, 4) and config.base.imports == ("json",)


def test_integer_flags_take_underscores_and_whole_scientific_numbers(capsys):
    config = parse_train_args(["ppo", "CartPole-v1", "--total-steps", "1e4", "--eval-every", "2_000"])
    assert (config.total_steps, config.eval_every) == (10_000, 2_000)
    with pytest.raises(SystemExit):
        parse_train_args(["ppo", "CartPole-v1", "--total-steps", "1.5"])
    assert "'1.5' is not a whole number" in capsys.readouterr().err


# -- point 6: one YAML loader and one coercion for every config value ----------------------------------
def test_config_file_numbers_in_scientific_notation_and_with_underscores(tmp_path):
    file = tmp_path / "run.yaml"
    file.write_text(
        "learning_rate: 1e-3\ntotal_steps: 1_000_000\neval_every: 1e4\nstop_return: 475\n"
        "hyperparameters:\n  gamma: 9.9E-1\n  max_grad_norm: 5e-1\n"
    )
    config = parse_train_args(["ppo", "CartPole-v1", "--config", str(file)])
    assert config.hyperparameters.learning_rate == 1e-3 and config.hyperparameters.gamma == 0.99
    assert config.hyperparameters.max_grad_norm == 0.5
    assert config.total_steps == 1_000_000 and type(config.total_steps) is int
    assert config.eval_every == 10_000 and type(config.eval_every) is int
    assert config.stop_return == 475.0 and type(config.stop_return) is float
    # a run's config.yaml edited by hand, as eval and resume read it
    run_config = tmp_path / "config.yaml"
    run_config.write_text("algo: ppo\nenv: CartPole-v1\nlearning_rate: 3e-4\nnum_envs: 6.4e1\n")
    config = TrainConfig.from_dict(load_yaml(run_config), where=str(run_config))
    assert config.hyperparameters.learning_rate == 3e-4 and config.num_envs == 64


def test_population_file_numbers_in_scientific_notation(tmp_path):
    file = tmp_path / "population.yaml"
    file.write_text(
        "base: {algo: ppo, env: CartPole-v1, total_steps: 2e4, learning_rate: 3e-4}\n"
        "size: 4\ninterval: 5e3\n"
        "mutations:\n  learning_rate: {perturb: [0.8, 1.25], log_uniform: [1e-4, 3e-3], min: 1e-5}\n"
        "resources: {cpus: 2, cpus_per_member: 5e-1}\n"
    )
    config = PopulationConfig.from_yaml(file)
    config.validate()
    assert config.base.total_steps == 20_000 and config.interval == 5_000
    assert config.mutations["learning_rate"].log_uniform == (1e-4, 3e-3)
    assert config.mutations["learning_rate"].min == 1e-5 and config.resources.cpus_per_member == 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file's values are the flags' defaults: typed, no tyro warning
        config = parse_population_args([str(file), "--size", "2"])
    assert config.size == 2 and config.interval == 5_000 and type(config.interval) is int


@pytest.mark.parametrize(
    "line, expected",
    [
        ("learning_rate: fast", "learning_rate = 'fast' (str) is not a number"),
        ("num_envs: 1.5", "num_envs = 1.5 (float) is not a whole number"),
        ("num_envs: true", "num_envs = True (bool) is not a whole number"),
        ("normalize_obs: 1", "normalize_obs = 1 (int) is not true or false"),
        ("hidden_sizes: 64", "hidden_sizes = 64 (int) is not a list"),
        ("hidden_sizes: [64, 0.5]", "hidden_sizes = 0.5 (float) is not a whole number"),
        ("device: 0", "device = 0 (int) is not text"),
        ("run_dir: 2024_01", "run_dir = 202401 (int) is not text"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_paragraph_naming_the_key_and_file(tmp_path, capsys, line, expected):
    file = tmp_path / "run.yaml"
    file.write_text(line + "\n")
    code, out = run_cli(capsys, "train", "ppo", "CartPole-v1", "--config", str(file))
    assert code == 2 and "Traceback" not in out
    assert expected in out and str(file) in out and "e.g." in out


def test_coercion_keeps_text_as_text_and_refuses_bools_as_numbers():
    assert coerce(TrainConfig, "device", "1e3", "test") == "1e3"  # quoted in YAML: stays text
    assert coerce(TrainConfig, "total_steps", "1_000_000", "test") == 1_000_000
    assert coerce(TrainConfig, "total_steps", 1e6, "test") == 1_000_000
    assert coerce(TrainConfig, "stop_return", None, "test") is None
    assert coerce(TrainConfig, "worker_timeout", 60, "test") == 60.0
    for name, value in (("seed", True), ("worker_timeout", False), ("stop_return", "high")):
        with pytest.raises(ConfigError, match=f"test: {name} = "):
            coerce(TrainConfig, name, value, "test")


def test_a_listed_value_of_a_float_hyperparameter_stays_a_float_when_perturbed():
    import random

    mutation = Mutation(perturb=(0.5, 2.0), choices=(0, 0.01), resample_probability=0.0)
    value = 0.0
    for seed in range(4):
        value = mutation.initial(0.01, random.Random(seed))
        assert isinstance(value, float)
    assert isinstance(mutation.mutate(value, random.Random(0)), float)  # 0 * factor, not max(1, round(0))


# -- point 9: --import for envs registered in Python ---------------------------------------------------
def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(phalanx.__file__).parents[1]),
                                                          os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "phalanx.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def test_a_run_on_the_tutorials_env_imports_its_module_again_for_eval_and_resume(tmp_path):
    run = tmp_path / "run"
    trained = cli("train", "ppo", "PointMass-v0", "--import", "examples.custom_vec_env", *SMALL,
                  "--total-steps", "256", "--run-dir", str(run), cwd=ROOT)  # fmt: skip
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "examples.custom_vec_env" in (run / "config.yaml").read_text()
    evaluated = cli("eval", str(run), "--episodes", "2", cwd=ROOT)
    assert evaluated.returncode == 0 and "return mean" in evaluated.stdout, evaluated.stderr
    resumed = cli("resume", str(run), "--total-steps", "512", cwd=ROOT)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    elsewhere = cli("eval", str(run), "--episodes", "2", cwd=tmp_path)  # the module is not found there
    assert elsewhere.returncode == 2 and "Traceback" not in elsewhere.stderr
    message = " ".join(elsewhere.stderr.split())
    assert f"{run / 'config.yaml'}: imports: module 'examples.custom_vec_env' not found" in message


def test_import_errors_name_the_module_and_check_env_takes_a_registered_id(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))  # the import registers locally
    code, out = run_cli(capsys, "train", "ppo", "CartPole-v1", "--import", "examples/custom_vec_env.py")
    assert code == 2 and "expected a module name such as 'examples.custom_vec_env'" in " ".join(out.split())
    file = tmp_path / "run.yaml"
    file.write_text("imports: [no_such_module_of_mine]\n")
    code, out = run_cli(capsys, "train", "ppo", "CartPole-v1", "--config", str(file))
    assert code == 2 and f"config file {str(file)!r}: imports: module 'no_such_module_of_mine' not found" in (
        " ".join(out.split())
    )
    code, out = run_cli(
        capsys, "check-env", "PointMass-v0", "--import", "examples.custom_vec_env", "--steps", "50"
    )
    assert code == 0 and "ok" in out
