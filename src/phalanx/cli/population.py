"""``phalanx population run|status|resume|report|scale``: population-based training from a population
file and flags (the population's own, generated from PopulationConfig and Resources, and the train flags
of its members' base config), and the commands on a population directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import typing
from typing import Annotated, Any

import tyro
from rich.console import Console
from rich.markup import escape

from phalanx.cli.arguments import RUN_TIME_ANNOTATED, command_flags, field_docs, parse_train_args
from phalanx.cli.output import console
from phalanx.config import coerce, load_yaml
from phalanx.config.specs import split_name
from phalanx.errors import PhalanxError
from phalanx.files import write_text_atomic
from phalanx.population import PopulationFailed, PopulationInterrupted, resume_population, run_population
from phalanx.population.evolution import Mutation, PopulationConfig, Resources
from phalanx.population.leaderboard import Leaderboard, format_score
from phalanx.train.interrupts import exit_code as interrupted_exit_code

POPULATION_USAGE = """usage: phalanx population COMMAND ...

  run [POPULATION.yaml] [ALGO ENV] [population flags] [train flags]
        train a population; ALGO ENV and train flags set (or override) the file's base config
  status DIR                    the ranking, from the leaderboard
  resume DIR                    continue after Ctrl+C or a crash, from the leaderboard and checkpoints
  scale DIR --max-concurrent N  change how many members run at once while it runs
  report DIR                    (re)write DIR/report: CSV files and plots
"""


def population_cli_class(data: dict[str, Any], where: str = "population config") -> type:
    """The population's own flags, from the PopulationConfig and Resources fields (each defined and
    documented once there); their defaults are the population file's values (``data``) if it has them."""
    fields: list[tuple[str, Any, Any]] = []
    for source, values in ((PopulationConfig, data), (Resources, data.get("resources") or {})):
        types, docs = typing.get_type_hints(source), field_docs(source)
        for f in dataclasses.fields(source):
            if f.name in ("base", "mutations", "resources"):
                continue
            default = coerce(source, f.name, values[f.name], where) if f.name in values else f.default
            aliases = ("--dir",) if f.name == "directory" else ()
            annotation = RUN_TIME_ANNOTATED[
                types[f.name], tyro.conf.arg(help=docs.get(f.name), aliases=aliases)
            ]
            fields.append((f.name, annotation, dataclasses.field(default=default)))
    mutate_help = (
        "NAME=KIND:ARGS (repeatable; the kinds given for one NAME combine), e.g. "
        "learning_rate=log_uniform:1e-4,1e-2 --mutate learning_rate=perturb:0.8,1.25 or gamma=steps:0.95,0.99"
    )
    fields.append(
        ("mutate", Annotated[tuple[str, ...], tyro.conf.arg(help=mutate_help)], dataclasses.field(default=()))
    )
    return dataclasses.make_dataclass("PopulationFlags", fields)


def parse_population_args(argv: list[str]) -> Any:
    """``[POPULATION.yaml] [ALGO ENV] [flags]`` -> a validated PopulationConfig."""
    data: dict[str, Any] = {}
    where = "arguments"
    if argv and argv[0].endswith((".yaml", ".yml")):
        data, where = load_yaml(argv[0]), f"population config {argv[0]!r}"
        argv = argv[1:]
    positional = list(itertools.takewhile(lambda a: not a.startswith("-"), argv[:2]))  # ALGO ENV
    rest = argv[len(positional) :]
    flags, train_args = command_flags(
        population_cli_class(data, where),
        rest,
        prog="phalanx population run",
        description="Population flags; the train flags of `phalanx train ALGO ENV --help` set the members' "
        "base config (a population file's base, if given, first).",
    )
    base = dict(data.get("base") or {})
    if len(positional) < 2:
        positional = [p for p in (base.get("algo"), base.get("env")) if p]
    base = {k: v for k, v in base.items() if k not in ("algo", "env")}
    train_config = parse_train_args(
        positional + train_args, settings=base, where=where, prog="phalanx population run"
    )
    resource_names = {f.name for f in dataclasses.fields(Resources)}
    mutations = dict(data.get("mutations") or {})
    flagged: dict[str, dict[str, Any]] = {}  # a flag replaces the file's mutation of that name
    for spec in flags.mutate:
        name, kind = split_name(spec, "--mutate", "learning_rate=perturb:0.8,1.2")
        flagged.setdefault(name, {}).update(Mutation.spec_from_text(kind, f"--mutate {spec}"))
    mutations.update(flagged)
    settings = {k: v for k, v in vars(flags).items() if k != "mutate" and k not in resource_names}
    resources = {k: v for k, v in vars(flags).items() if k in resource_names}
    config = PopulationConfig.from_dict(
        {**settings, "base": train_config.to_dict(), "resources": resources, "mutations": mutations},
        where=where,
    )
    config.validate()
    return config


def cmd_population(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(POPULATION_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    say = lambda text: console.print(escape(text), highlight=False, soft_wrap=True)  # noqa: E731
    try:
        if command == "run":
            config = parse_population_args(rest)
            result = run_population(config)
        elif command == "resume":
            result = resume_population(_one_directory("resume", rest))
        elif command == "status":
            board = Leaderboard.load(_one_directory("status", rest))
            Console().print(board.table())
            say(f"population directory: {board.directory}")
            return 0
        elif command == "report":
            board = Leaderboard.load(_one_directory("report", rest))
            say(f"written: {board.write_report()}")
            return 0
        elif command == "scale":
            return _scale(rest)
        else:
            raise PhalanxError(f"unknown population command {command!r}.\n{POPULATION_USAGE}")
    except PopulationInterrupted as interrupted:
        console.print(f"[yellow]{escape(str(interrupted))}[/]", highlight=False)
        return interrupted_exit_code()
    except PopulationFailed as failed:  # it ran, and ended without a result
        Console().print(Leaderboard.load(failed.directory).table())
        console.print(f"[bold red]error:[/] {escape(str(failed))}", highlight=False, soft_wrap=True)
        return 1
    Console().print(Leaderboard.load(result.directory).table())
    say(f"best member: {result.best_member}, score {format_score(result.best_score)}")
    say(f"best member's run directory: {result.best_run_dir}")
    say(f"report: {result.directory / 'report'}")
    return 0


def _one_directory(command: str, argv: list[str]) -> str:
    if len(argv) != 1 or argv[0].startswith("-"):
        raise PhalanxError(f"`phalanx population {command}` takes one population directory, got {argv}.")
    return argv[0]


def _scale(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx population scale", description="Change how many members run at once, while it runs."
    )
    parser.add_argument("directory")
    parser.add_argument("--max-concurrent", type=int, required=True)
    args = parser.parse_args(argv)
    if args.max_concurrent < 1:
        raise PhalanxError(f"--max-concurrent must be >= 1, got {args.max_concurrent}.")
    board = Leaderboard.load(args.directory)  # refuses a directory that is not a population's
    write_text_atomic(
        board.directory / "control.json", json.dumps({"max_concurrent": args.max_concurrent}) + "\n"
    )
    console.print(
        f"max_concurrent = {args.max_concurrent} written to {board.directory / 'control.json'}",
        soft_wrap=True,
    )
    return 0
