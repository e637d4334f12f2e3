"""phalanx plot: runs grouped by a config setting, the mean and interval over each group's runs on a common
grid, steps or wall time on x; the per-run curve.png drawn by the same code. Synthetic run directories
(config.yaml, evaluations.csv, metrics.csv written directly): no training."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

import phalanx
from phalanx.cli import main
from phalanx.errors import ConfigError
from phalanx.train import plots
from phalanx.train.plots import curves, plot_curve, si_number


def make_run(
    directory: Path,
    algo: str = "ppo",
    seed: int = 0,
    evaluations: list[tuple[float, float, float]] | None = None,
    training: list[tuple[float, float, float]] | None = None,
    **settings,
) -> Path:
    """A run directory: config.yaml, evaluations.csv and metrics.csv rows of (steps, wall_time_s, return)."""
    directory.mkdir(parents=True)
    hyperparameters = settings.pop("hyperparameters", {"learning_rate": 3e-4})
    config = {
        "algo": algo,
        "env": "CartPole-v1",
        "seed": seed,
        **settings,
        "hyperparameters": hyperparameters,
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    for name, column, rows in (
        ("evaluations.csv", "eval_return_mean", evaluations),
        ("metrics.csv", "episode_return_mean", training),
    ):
        if rows is not None:
            lines = [f"steps,wall_time_s,{column}"] + [f"{s},{t},{r}" for s, t, r in rows]
            (directory / name).write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def runs(tmp_path):
    """Two algorithms, two seeds each: ppo's evaluations at the same steps, a2c's at the same steps but
    a2c seed 1 runs further and is slower in wall time."""
    make_run(tmp_path / "ppo_s0", "ppo", 0, [(1000, 1.0, 10), (2000, 2.0, 20), (3000, 3.0, 30)])
    make_run(tmp_path / "ppo_s1", "ppo", 1, [(1000, 1.0, 30), (2000, 2.0, 60), (3000, 3.0, 90)])
    a2c_s0 = [(1000, 1.0, 0), (2000, 2.0, 100)]
    make_run(tmp_path / "a2c_s0", "a2c", 0, a2c_s0, hyperparameters={"learning_rate": 1e-3})
    make_run(tmp_path / "a2c_s1", "a2c", 1, [(1000, 2.0, 50), (2000, 4.0, 100), (4000, 8.0, 200)])
    return tmp_path


def test_groups_by_algo_with_mean_and_standard_error(runs):
    result = curves(runs / "*")
    assert [group.name for group in result.groups] == ["a2c", "ppo"]
    ppo = result.groups[1]
    assert ppo.n == 2 and result.metric == "eval_return_mean"
    np.testing.assert_allclose(ppo.x, [1000, 2000, 3000])
    np.testing.assert_allclose(ppo.mean, [20, 40, 60])
    # the standard error of two values a, b: std (ddof 1) |a - b| / sqrt(2), over sqrt(2) runs: |a - b| / 2
    np.testing.assert_allclose(ppo.high - ppo.mean, [10, 20, 30])
    np.testing.assert_allclose(ppo.mean - ppo.low, [10, 20, 30])
    a2c = result.groups[0]  # the common span: s0's two evaluations
    np.testing.assert_allclose(a2c.high - a2c.mean, [np.std([0, 50], ddof=1) / math.sqrt(2), 0])


def test_runs_of_different_envs_are_never_averaged_together(tmp_path):
    make_run(tmp_path / "cartpole", "ppo", 0, [(1000, 1.0, 400), (2000, 2.0, 500)])
    make_run(tmp_path / "pendulum", "ppo", 0, [(1000, 1.0, -1200), (2000, 2.0, -300)], env="Pendulum-v1")
    make_run(tmp_path / "pendulum_s1", "ppo", 1, [(1000, 1.0, -1000), (2000, 2.0, -200)], env="Pendulum-v1")
    result = curves(tmp_path / "*")
    assert [(group.name, group.n) for group in result.groups] == [
        ("ppo on CartPole-v1", 1),
        ("ppo on Pendulum-v1", 2),
    ]
    np.testing.assert_allclose(result.groups[0].mean, [400, 500])
    np.testing.assert_allclose(result.groups[1].mean, [-1100, -250])
    assert [group.name for group in curves(tmp_path / "*", group_by="env").groups] == [
        "CartPole-v1",
        "Pendulum-v1",
    ]


def test_minmax_and_no_interval(runs):
    ppo = curves(runs / "ppo_*", interval="minmax").groups[0]
    np.testing.assert_allclose(ppo.low, [10, 20, 30])
    np.testing.assert_allclose(ppo.high, [30, 60, 90])
    plain = curves(runs / "ppo_*", interval="none").groups[0]
    assert plain.low is None and plain.high is None


def test_runs_of_different_length_common_span_or_held_to_the_longest(runs):
    a2c = curves(runs / "a2c_*").groups[0]  # common: up to the shorter run's end
    np.testing.assert_allclose(a2c.x, [1000, 2000])
    np.testing.assert_allclose(a2c.mean, [25, 100])
    longest = curves(runs / "a2c_*", span="longest").groups[0]
    np.testing.assert_allclose(longest.x, [1000, 2000, 4000])
    np.testing.assert_allclose(longest.values, [[0, 100, 100], [50, 100, 200]])  # s0 holds its last value


def test_x_by_wall_time_interpolates_each_run_onto_the_common_grid(runs):
    a2c = curves(runs / "a2c_*", x="time").groups[0]
    # s0 covers 1..2 s, s1 2..8 s: the common range is 2 s, where s0 is 100 and s1 50
    np.testing.assert_allclose(a2c.x, [2.0])
    np.testing.assert_allclose(a2c.values, [[100], [50]])
    ppo = curves([runs / "ppo_s0", runs / "ppo_s1"], x="time").groups[0]
    np.testing.assert_allclose(ppo.x, [1.0, 2.0, 3.0])
    longest = curves(runs / "a2c_*", x="time", span="longest").groups[0]
    at = list(longest.x).index(4.0)
    np.testing.assert_allclose(longest.values[:, at], [100, 100])  # s0 held at 100, s1 at 4 s is 100


def test_interpolation_between_points(tmp_path):
    make_run(tmp_path / "a", seed=0, evaluations=[(0, 0, 0), (1000, 1, 100)])
    make_run(tmp_path / "b", seed=1, evaluations=[(0, 0, 0), (500, 1, 0), (1000, 2, 0)])
    group = curves(tmp_path / "*").groups[0]
    np.testing.assert_allclose(group.x, [0, 500, 1000])
    np.testing.assert_allclose(group.values[0], [0, 50, 100])  # run a interpolated at 500
    np.testing.assert_allclose(group.mean, [0, 25, 50])


def test_group_by_hyperparameter_seed_and_library(runs, tmp_path):
    by_rate = curves(runs / "*", group_by="learning_rate")
    assert [(group.name, group.n) for group in by_rate.groups] == [
        ("learning_rate=0.0003", 3),
        ("learning_rate=0.001", 1),
    ]
    assert [g.name for g in curves(runs / "*", group_by="seed").groups] == ["seed=0", "seed=1"]
    peer = make_run(tmp_path / "peer" / "sb3_s0", "ppo", 0, [(1000, 1, 5), (3000, 3, 5)], library="sb3")
    by_library = curves([runs / "ppo_*", peer], group_by="library")
    assert [(group.name, group.n) for group in by_library.groups] == [("phalanx", 2), ("sb3", 1)]


def test_default_metric_falls_back_to_training_returns_and_any_column_can_be_plotted(tmp_path):
    make_run(tmp_path / "a", training=[(100, 1, 5), (200, 2, 7)])
    make_run(tmp_path / "b", training=[(100, 1, 7), (200, 2, 9)], evaluations=[(200, 2, 1)])
    result = curves(tmp_path / "*")
    assert result.metric == "episode_return_mean"
    np.testing.assert_allclose(result.groups[0].mean, [6, 8])
    assert curves(tmp_path / "b", metric="wall_time_s").groups[0].mean.tolist() == [2.0]


def test_clear_errors(runs, tmp_path):
    with pytest.raises(ConfigError, match="no run directory matches .*nothing_.*nothing matches"):
        curves(tmp_path / "nothing_*")
    with pytest.raises(ConfigError, match="cannot group by 'learning_rte'.*did you mean 'learning_rate'"):
        curves(runs / "*", group_by="learning_rte")
    with pytest.raises(ConfigError, match="cannot group by 'library_name'") as missing:
        curves(runs / "*", group_by="library_name")
    assert "hyperparameters: learning_rate" in str(missing.value)
    with pytest.raises(ConfigError, match="'eval_retrun' .*did you mean 'eval_return_mean'.*Columns: steps"):
        curves(runs / "*", metric="eval_retrun")
    with pytest.raises(ConfigError, match="not a phalanx run directory.*pass '.*/\\*'"):
        curves(runs)
    (runs / "notes").mkdir()  # a glob skips what is not a run
    assert curves(runs / "*").groups[1].n == 2
    with pytest.raises(ConfigError, match="1 paths match, none with a config.yaml"):
        curves(runs / "note*")
    with pytest.raises(ConfigError, match="x = 'episodes' is not one of steps, time"):
        curves(runs / "*", x="episodes")
    with pytest.raises(ConfigError, match="no steps in common.*--span longest"):
        make_run(tmp_path / "late" / "r0", evaluations=[(5000, 1, 0), (6000, 2, 0)])
        curves([runs / "ppo_s0", tmp_path / "late" / "r0"])
    make_run(tmp_path / "empty" / "r0")
    with pytest.raises(ConfigError, match="nothing to plot of .*empty.*no rows"):
        curves(tmp_path / "empty" / "*")


def test_population_directory_gives_its_members(tmp_path):
    population = tmp_path / "population"
    (population / "members").mkdir(parents=True)
    (population / "leaderboard.json").write_text("{}")
    for member in ("m000", "m001"):
        make_run(population / "members" / member, evaluations=[(100, 1, 1), (200, 2, 3)])
    group = curves(population).groups[0]
    assert [run.name for run in group.runs] == ["m000", "m001"]


def test_each_run_once_in_the_order_given(runs):
    result = curves([runs / "ppo_s1", runs / "ppo_*"])
    assert [run.name for run in result.groups[0].runs] == ["ppo_s1", "ppo_s0"]


def test_python_plot_writes_the_figure(runs, tmp_path):
    path = phalanx.plot(runs / "*", x="time", group_by="algo", output=tmp_path / "out" / "cmp.png")
    assert path == tmp_path / "out" / "cmp.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = phalanx.plot(runs / "*", output=tmp_path / "cmp.svg", title="mine")
    assert "<svg" in svg.read_text() and "mine" in svg.read_text()


def test_cli(runs, tmp_path, capsys):
    output = tmp_path / "cli.png"
    code = main(["plot", str(runs / "*"), "--interval", "minmax", "--x", "steps", "--output", str(output)])
    assert code == 0 and output.is_file()
    captured = capsys.readouterr()
    assert "a2c" in captured.out and "ppo" in captured.out and "30 .. 90" in captured.out
    assert main(["plot", str(runs / "*"), "--group-by", "nope"]) == 2
    assert "cannot group by 'nope'" in capsys.readouterr().err


def test_run_curve_is_drawn_by_the_same_code(tmp_path, monkeypatch):
    run = make_run(
        tmp_path / "run", training=[(100, 1, 5), (200, 2, 7)], evaluations=[(200, 2, 9), (100, 1, 8)]
    )
    drawn, original = [], plots.draw

    def recorded(lines, *args, **kwargs):
        drawn.append(lines)
        return original(lines, *args, **kwargs)

    monkeypatch.setattr(plots, "draw", recorded)
    assert plot_curve(run, "PPO on CartPole-v1") == run / "curve.png"
    training, evaluation = drawn[0]
    assert evaluation.x.tolist() == [100, 200] and evaluation.y.tolist() == [8, 9]  # sorted by steps
    assert training.y.tolist() == [5, 7]
    assert plot_curve(make_run(tmp_path / "new"), "nothing yet") is None


def test_step_ticks_have_si_suffixes():
    assert [si_number(v) for v in (0, 500, 20_000, 1_500_000, 2e9)] == ["0", "500", "20k", "1.5M", "2G"]
