"""The ``phalanx`` command: train, eval, resume, backtest, export, envs, check-env, population, plot, tune.

``main`` dispatches to one module per command (or per small group), imported when its command runs, so
that ``phalanx --help`` and ``phalanx envs`` start without the training stack. ``phalanx train ALGO
ENV`` starts from the algorithm's defaults, applies the shipped preset for that pair, then ``--config
FILE``, then the flags; every flag is generated from the config dataclasses (:mod:`phalanx.cli.arguments`).
"""

from __future__ import annotations

import difflib
import importlib
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

from rich.markup import escape

import phalanx
from phalanx.cli.output import console
from phalanx.errors import PhalanxError
from phalanx.train.interrupts import exit_code as interrupted_exit_code
from phalanx.train.interrupts import stop_signals_interrupt

USAGE = """usage: phalanx COMMAND ...

commands:
  train ALGO ENV [--num-envs N] [--total-steps N] [--seed S] [--device D] [--run-dir DIR]
                 [--stop-return R] [--num-workers N] [--pipeline] [--learners N] [--[no-]compile]
                 [--track wandb] [--video-every N] [--config FILE] [--import MODULE ...]
                 [--<hyperparameter> VALUE ...]
                                   train an agent (phalanx train ALGO ENV --help lists every flag)
  eval RUN_DIR [--episodes N] [--checkpoint best|latest|PATH] [--video] [--video-format mp4|gif]
               [--video-episodes N] [--video-max-steps N] [--video-fps F]
                                   evaluate a trained agent with its deterministic policy (and record it)
  resume RUN_DIR [--total-steps N] continue a run from its latest checkpoint
  backtest RUN_DIR [--start DATE] [--end DATE] [--checkpoint best|latest|PATH]
                                   out-of-sample backtest of a stock trading agent
  export RUN_DIR [--format onnx|torchscript] [--checkpoint best|latest|PATH] [--output FILE]
                 [--stochastic]    write the policy as a self-contained ONNX or TorchScript file
  envs                             list the environment ids
  check-env MODULE:FACTORY|ENV [--import MODULE] [--num-envs N] [--device D] [--steps N]
                                   check that your VecEnv follows the contract
  population run [POPULATION.yaml] [ALGO ENV] [--size N] [--strategy tournament|generational]
                 [--interval N] [--backend serial|process|ray|vectorized] [--address A]
                 [--mutate NAME=KIND:ARGS ...] [--<train flag> VALUE ...]
                                   population-based training (`phalanx population run --help`)
  population status|resume|report DIR, population scale DIR --max-concurrent N
  plot RUN_OR_GLOB ... [--x steps|time] [--group-by algo|env|SETTING] [--interval stderr|minmax|none]
                 [--metric COLUMN] [--span common|longest] [--output FILE] [--title T]
                                   learning curves of runs: mean and interval over seeds, one line per group
  tune ALGO ENV --trials N [--sampler tpe|random] [--pruner median|none] [--search NAME=KIND:ARGS ...]
                [--storage URL] [--study-name NAME] [--parallel K] [--interval N] [--directory DIR]
                [--<train flag> VALUE ...]
                                   hyperparameter search with Optuna (`phalanx tune --help`)
"""


COMMANDS = {
    "train": ("train", "cmd_train"),
    "eval": ("evaluation", "cmd_eval"),
    "resume": ("train", "cmd_resume"),
    "backtest": ("backtest", "cmd_backtest"),
    "export": ("export", "cmd_export"),
    "envs": ("envs", "cmd_envs"),
    "check-env": ("envs", "cmd_check_env"),
    "population": ("population", "cmd_population"),
    "plot": ("plot", "cmd_plot"),
    "tune": ("tune", "cmd_tune"),
}
"""Each command -> (its module in ``phalanx.cli``, the function that runs it). The module is imported when
its command runs: the others' imports (torch, the learners, Optuna, ...) are not paid for."""


def main(argv: list[str] | None = None) -> int:
    if argv is None and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `phalanx envs | head` ends quietly
    if argv is None:  # SIGTERM (kill, Slurm, docker stop) stops a command as Ctrl+C does, and saves
        stop_signals_interrupt()
        warnings.showwarning = show_warning
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"phalanx {phalanx.__version__}")
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        close = difflib.get_close_matches(argv[0], list(COMMANDS), n=1)
        hint = f" Did you mean `phalanx {close[0]}`?" if close else ""
        console.print(f"[bold red]error:[/] {escape(f'unknown command {argv[0]!r}.{hint}')}\n{escape(USAGE)}")
        return 2
    try:
        module, function = command
        run = getattr(importlib.import_module(f"phalanx.cli.{module}"), function)
        return run(argv[1:])
    except PhalanxError as error:
        console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return interrupted_exit_code()


def show_warning(
    message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """phalanx's own warnings as a command says them: ``warning: <message>``, wrapped to the terminal,
    without the source line Python adds (which points into phalanx, not at the user's input); other
    packages' warnings as Python prints them."""
    if not filename.startswith(str(Path(__file__).parent.parent)):  # src/phalanx
        PYTHON_SHOW_WARNING(message, category, filename, lineno, file, line)
        return
    console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


PYTHON_SHOW_WARNING = warnings.showwarning


EXPORTS = {
    name: f"phalanx.cli.{module}"
    for module, names in {
        "output": ("wrapped",),
        "arguments": (
            "cli_config_class",
            "command_flags",
            "field_docs",
            "gather_repeated",
            "number_rules",
            "parse_train_args",
            "recurrent_flags",
            "train_usage",
        ),
        "train": ("cmd_train", "cmd_resume", "say_nothing_to_train", "training_exit_code"),
        "evaluation": ("cmd_eval",),
        "backtest": ("cmd_backtest",),
        "export": ("cmd_export",),
        "envs": ("cmd_envs", "cmd_check_env"),
        "population": ("POPULATION_USAGE", "cmd_population", "parse_population_args", "population_cli_class"),
        "plot": ("cmd_plot",),
        "tune": ("cmd_tune", "parse_tune_args", "tune_cli_class"),
    }.items()
    for name in names
}
"""The names the command modules define, each importable from ``phalanx.cli`` as from the single module it
was (``from phalanx.cli import parse_train_args``), its module imported on first use."""


def __getattr__(name: str) -> Any:
    if name in EXPORTS:
        return getattr(importlib.import_module(EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
