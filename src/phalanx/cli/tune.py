"""``phalanx tune ALGO ENV --trials N``: a hyperparameter search with Optuna, from the tune flags
(generated from TuneConfig) and the train flags of every trial's base config.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from typing import Annotated, Any

import tyro
from rich.console import Console
from rich.markup import escape

from phalanx.cli.arguments import (
    DISALLOW_NONE,
    RUN_TIME_ANNOTATED,
    command_flags,
    field_docs,
    parse_train_args,
)
from phalanx.cli.output import console
from phalanx.config.specs import split_name
from phalanx.train.interrupts import exit_code as interrupted_exit_code
from phalanx.tuning import Dimension, TuneConfig, TuneFailed, TuneInterrupted, run_tuning


def tune_cli_class() -> type:
    """The tune flags, from the TuneConfig fields (each documented once there); ``--trials`` is required,
    ``--search`` repeatable."""
    types, docs = typing.get_type_hints(TuneConfig), field_docs(TuneConfig)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        ("trials", Annotated[int, tyro.conf.arg(help=docs["trials"])])
    ]
    for f in dataclasses.fields(TuneConfig):
        if f.name in ("base", "trials", "search"):
            continue
        aliases = ("--dir",) if f.name == "directory" else ()
        kind = DISALLOW_NONE[types[f.name]] if f.default is None else types[f.name]  # absent: None
        annotation = RUN_TIME_ANNOTATED[kind, tyro.conf.arg(help=docs.get(f.name), aliases=aliases)]
        fields.append((f.name, annotation, dataclasses.field(default=f.default)))
    search_help = (
        "NAME=KIND:ARGS (repeatable; default: the algorithm's search space), e.g. "
        "learning_rate=log:1e-5,1e-3, gamma=uniform:0.9,0.9999, epochs=int:1,10, "
        "horizon=int_log:16,256, activation=choice:tanh,relu"
    )
    fields.append(
        ("search", Annotated[tuple[str, ...], tyro.conf.arg(help=search_help)], dataclasses.field(default=()))
    )
    return dataclasses.make_dataclass("TuneFlags", fields)


def parse_tune_args(argv: list[str]) -> TuneConfig:
    """``ALGO ENV --trials N [tune flags] [train flags]`` -> a validated TuneConfig."""
    positional = list(itertools.takewhile(lambda a: not a.startswith("-"), argv[:2]))  # ALGO ENV
    rest = argv[len(positional) :]
    flags, train_args = command_flags(
        tune_cli_class(),
        rest,
        prog="phalanx tune ALGO ENV",
        description="Hyperparameter search with Optuna; the train flags of `phalanx train ALGO ENV --help` "
        "set every trial's base config (see docs/tuning.md).",
    )
    base = parse_train_args(positional + train_args, prog="phalanx tune")
    search: dict[str, str | Dimension] = {}
    for spec in flags.search:
        name, dimension = split_name(spec, "--search", "learning_rate=log:1e-5,1e-3")
        search[name] = dimension
    settings = {k: v for k, v in vars(flags).items() if k != "search"}
    config = TuneConfig(base=base, search=search, **settings)
    config.validate()
    return config


def cmd_tune(argv: list[str]) -> int:
    config = parse_tune_args(argv)
    try:
        result = run_tuning(config)
    except TuneInterrupted as interrupted:
        console.print(f"[yellow]{escape(str(interrupted))}[/]", highlight=False, soft_wrap=True)
        return interrupted_exit_code()
    except TuneFailed as failed:  # it ran, and ended without a best config
        console.print(f"[bold red]error:[/] {escape(str(failed))}", highlight=False, soft_wrap=True)
        return 1
    Console().print(result.table())
    say = lambda text: console.print(escape(text), highlight=False, soft_wrap=True)  # noqa: E731
    say(f"best trial: {result.best_trial}, value {result.best_value:.4g}")
    say(f"best trial's run directory: {result.best_run_dir}")
    say(f"trials: {result.directory / 'trials.csv'}")
    say(
        f"best config: {result.best_config} (phalanx train {config.base.algo} {config.base.env} --config "
        f"{result.best_config})"
    )
    return 0
