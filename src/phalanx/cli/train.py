"""``phalanx train ALGO ENV`` and ``phalanx resume RUN_DIR``: run the training, and exit with its verdict
(1 if a --stop-return was not reached; Ctrl+C and SIGTERM: the interrupted exit codes).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape

from phalanx.cli.arguments import parse_train_args, train_usage
from phalanx.cli.output import console
from phalanx.train.entry import resume, train
from phalanx.train.interrupts import exit_code as interrupted_exit_code
from phalanx.train.loop import TrainingInterrupted, TrainResult


def cmd_train(argv: list[str]) -> int:
    if not argv or argv in (["-h"], ["--help"]):  # a listing, not an error
        print(train_usage("phalanx train"))
        return 0
    config = parse_train_args(argv)

    def say_run_dir(path: Path) -> None:
        console.print(f"run directory: [bold]{escape(str(path))}[/]", highlight=False, soft_wrap=True)

    return run_training(lambda: train(config, on_run_dir=say_run_dir))


def cmd_resume(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx resume", description="Continue a run from its latest checkpoint."
    )
    parser.add_argument("run_dir")
    parser.add_argument("--total-steps", type=int, default=None, help="new training budget (env steps)")
    args = parser.parse_args(argv)
    return run_training(lambda: resume(args.run_dir, args.total_steps))


def run_training(training: Callable[[], TrainResult]) -> int:
    """Run ``training`` (a train or a resume) and say how it ended: Ctrl+C or SIGTERM (the checkpoint it
    saved), or nothing left to train; its exit code."""
    try:
        result = training()
    except TrainingInterrupted as interrupted:
        console.print(f"[yellow]{escape(str(interrupted))}[/]", highlight=False, soft_wrap=True)
        return interrupted_exit_code()
    if not result.trained:
        say_nothing_to_train(result)
    return training_exit_code(result.summary)


def say_nothing_to_train(result: TrainResult) -> None:
    """A resume (or train --resume) of a run that had finished: what it found, and how to train on."""
    steps = result.summary["total_steps"]
    console.print(
        escape(
            f"nothing left to train: the run in {result.run_dir} finished at {steps:,} steps; no file was "
            f"changed. To train it longer: phalanx resume {result.run_dir} --total-steps N (N > {steps:,})."
        ),
        highlight=False,
        soft_wrap=True,
    )


def training_exit_code(summary: dict[str, Any]) -> int:
    """How `phalanx train` and `phalanx resume` exit when training ends (Ctrl+C: 130, SIGTERM: 143): 1 if
    the run has a stop_return (--stop-return) that no evaluation reached, else 0. An empty ``summary`` is
    a learner other than learner 0 under torchrun, which leaves the verdict to learner 0: 0."""
    if summary and summary["stop_return"] is not None and summary["time_to_stop_return_s"] is None:
        return 1
    return 0
