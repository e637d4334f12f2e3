"""What a user sees: the progress display, the run summary and the population ranking fit the terminal
(80 columns, and 60), label every number with what it is and the step it is from, round scores, and
never cut a number or a path."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from phalanx.population.leaderboard import Leaderboard, MemberRecord
from phalanx.train.logging import RunLogger, print_summary


def console(width: int) -> Console:
    return Console(width=width, file=io.StringIO(), color_system=None)


def render(width: int, renderable) -> list[str]:
    out = console(width)
    out.print(renderable)
    return out.file.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 60])
def test_progress_fits_and_labels_every_number(tmp_path, width):
    logger = RunLogger(tmp_path, 10_000_000, show_progress=True, tensorboard=False, console=console(width))
    try:
        logger.log(
            {
                "steps": 1_234_560,
                "wall_time_s": 50.0,
                "steps_per_second": 24_691.2,
                "updates": 1205,
                "updates_per_second": 24.1,
                "episodes": 12,
                "episode_return_mean": 211.648,
            }
        )
        # An evaluation process's result comes in after the training row, for weights of an earlier step.
        logger.log_evaluation(
            {
                "steps": 1_223_680,
                "wall_time_s": 49.5,
                "eval_return_mean": 483.33,
                "eval_return_std": 34.3,
                "eval_length_mean": 483.3,
                "result_wall_time_s": 50.1,
            }
        )
        lines = render(width, logger.progress)
    finally:
        logger.close()
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines), text
    assert "…" not in text
    assert "1,234,560/10,000,000 steps" in text
    assert "24,691 env steps/s" in text and "24 updates/s" in text  # not replaced by the evaluation's row
    assert "train return 211.6 (step 1,234,560)" in text
    assert "eval return 483.3 (step 1,223,680)" in text


def test_the_bar_never_shows_fewer_steps_than_an_evaluation(tmp_path):
    # An off-policy run logs a training row every log_every steps; its evaluations come more often. The
    # bar must not stay at the first row's 16 steps while the line under it names step 4,096.
    logger = RunLogger(tmp_path, 200_000, show_progress=True, tensorboard=False, console=console(80))
    try:
        logger.log({"steps": 16, "wall_time_s": 0.1, "steps_per_second": 160.0, "updates": 0})
        logger.log_evaluation({"steps": 4096, "wall_time_s": 9.0, "eval_return_mean": -142.7})
        text = "\n".join(render(80, logger.progress))
    finally:
        logger.close()
    assert "4,096/200,000 steps" in text, text
    assert "eval return -142.7 (step 4,096)" in text


@pytest.mark.parametrize("width", [80, 60])
def test_summary_labels_every_number_and_prints_the_run_directory_whole(width):
    run_dir = "runs/" + "gym_ALE_Breakout-v5__ppo__s12345__20250101-120000/" * 2
    summary = {
        "env": "gym:ALE/Breakout-v5",
        "algo": "ppo",
        "seed": 12345,
        "total_steps": 10_000_000,
        "wall_time_s": 1234.56,
        "steps_per_second": 8100.4,
        "stop_return": 475.0,
        "time_to_stop_return_s": None,
        "eval_return_mean": 306.0,
        "eval_return_std": 130.65,
        "eval_steps": 10_000_000,
        "best_eval_return": 483.3,
        "best_eval_steps": 9_990_144,
        "run_dir": run_dir,
    }
    out = console(width)
    print_summary(summary, out)
    lines = out.file.getvalue().splitlines()
    assert lines[-1] == f"run directory: {run_dir}"  # whole, on a line of its own (the terminal wraps it)
    table = "\n".join(lines[:-1])
    assert all(len(line) <= width for line in lines[:-1]), table
    assert "…" not in table and run_dir not in table
    for text in ("10,000,000", "1,234.6 s", "8,100", "475 not reached"):
        assert text in table, text
    assert "306.0 ± 130.7 (step 10,000,000)" in table and "483.3 (step 9,990,144)" in table


@pytest.mark.parametrize("width", [80, 60])
def test_population_ranking_fits_with_rounded_scores(tmp_path, width):
    board = Leaderboard(tmp_path / "populations" / "CartPole-v1__ppo__20250101-120000")
    for i in range(3):
        hyperparameters = {
            "learning_rate": 0.0024000000000000002 * (i + 1),
            "entropy_coef": 0.01,
            "clip_range": 0.2,
        }
        board.add(MemberRecord(id=f"m00{i}", seed=i, hyperparameters=hyperparameters))
        board.record(f"m00{i}", 10_000_000, 487.29999999 - 100 * i, None)
    board.members["m002"].status, board.members["m002"].reason = "removed", "crashed 3 times: RuntimeError"
    lines = render(width, board.table())
    text = "\n".join(lines)
    assert all(len(line) <= width for line in lines), text
    assert "…" not in text and "99999" not in text and "0.0024000" not in text
    assert "487.30" in text and "10,000,000" in text
    for member in ("m000", "m001", "m002"):
        assert any(line.strip().startswith(f"{member}  learning_rate=0.00") for line in lines), text
    assert "crashed 3 times:" in text
