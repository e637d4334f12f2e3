"""The ``phalanx`` command: train, eval, resume, backtest, envs, check-env.

``phalanx train ALGO ENV`` starts from the algorithm's defaults, applies the shipped preset for that
pair, then ``--config FILE``, then the flags; every flag is generated from the config dataclasses.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import shutil
import signal
import sys
import textwrap
import typing
import warnings
from pathlib import Path
from typing import Annotated, Any

import tyro
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phalanx import __version__
from phalanx.agent import evaluate
from phalanx.backtesting import METRIC_LABELS, STRATEGY_LABELS, backtest, format_metric
from phalanx.config import (
    VIDEO_FORMATS,
    TrainConfig,
    coerce,
    import_modules,
    load_yaml,
    make_config,
    presets,
    to_number,
)
from phalanx.envs.check import check_vec_env
from phalanx.envs.registry import BACKENDS, list_envs, load_factory, make_env
from phalanx.errors import PhalanxError
from phalanx.exporting import FORMATS, export
from phalanx.files import write_text_atomic
from phalanx.finance.metrics import METRIC_NAMES
from phalanx.marl.registry import list_multi_agent_envs
from phalanx.marl.trainer import MultiAgentEvaluation
from phalanx.population import PopulationFailed, PopulationInterrupted, resume_population, run_population
from phalanx.population.evolution import Mutation, PopulationConfig, Resources
from phalanx.population.leaderboard import Leaderboard, format_score
from phalanx.registry import (
    RECURRENT_SETTINGS,
    algorithm_names,
    get_algorithm,
    no_recurrent_policy,
    registration,
)
from phalanx.train.entry import resume, train
from phalanx.train.interrupts import exit_code as interrupted_exit_code
from phalanx.train.interrupts import stop_signals_interrupt
from phalanx.train.loop import TrainingInterrupted
from phalanx.train.plots import INTERVALS, SPANS, X_COLUMNS, curves, draw_curves
from phalanx.train.videos import MAX_EPISODE_STEPS, check_video_format
from phalanx.tuning import TuneConfig, TuneFailed, TuneInterrupted, run_tuning
from phalanx.video import check_recordable, record_video

console = Console(stderr=True)

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


def main(argv: list[str] | None = None) -> int:
    if argv is None and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `phalanx envs | head` ends quietly
    if argv is None:  # SIGTERM (kill, Slurm, docker stop) stops a command as Ctrl+C does, and saves
        stop_signals_interrupt()
        warnings.showwarning = show_warning
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "train": cmd_train,
        "eval": cmd_eval,
        "resume": cmd_resume,
        "backtest": cmd_backtest,
        "export": cmd_export,
        "envs": cmd_envs,
        "check-env": cmd_check_env,
        "population": cmd_population,
        "plot": cmd_plot,
        "tune": cmd_tune,
    }
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"phalanx {__version__}")
        return 0
    command = commands.get(argv[0])
    if command is None:
        close = difflib.get_close_matches(argv[0], list(commands), n=1)
        hint = f" Did you mean `phalanx {close[0]}`?" if close else ""
        console.print(f"[bold red]error:[/] {escape(f'unknown command {argv[0]!r}.{hint}')}\n{escape(USAGE)}")
        return 2
    try:
        return command(argv[1:])
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
    if not filename.startswith(str(Path(__file__).parent)):
        PYTHON_SHOW_WARNING(message, category, filename, lineno, file, line)
        return
    console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


PYTHON_SHOW_WARNING = warnings.showwarning


# -- train ----------------------------------------------------------------------------------------
def cli_config_class(algorithm: Any) -> type:
    """TrainConfig with the algorithm's own hyperparameter class, so tyro generates its flags.

    A ``bool | None`` setting (None: decided by the run, e.g. ``compile``) is a pair of flags,
    ``--compile`` / ``--no-compile``, absent: None, instead of tyro's ``--compile {None,True,False}``."""
    optional_flags = [
        (name, tyro.conf.DisallowNone[bool | None], dataclasses.field(default=None))
        for name, kind in typing.get_type_hints(TrainConfig).items()
        if kind == bool | None
    ]
    return dataclasses.make_dataclass(
        f"{algorithm.config_class.__name__}Run",
        [
            ("algo", tyro.conf.Suppress[str], dataclasses.field(default="")),
            ("env", tyro.conf.Suppress[str], dataclasses.field(default="")),
            (
                "hyperparameters",
                algorithm.config_class,
                dataclasses.field(default_factory=algorithm.config_class),
            ),
            (  # --learners N is the short form the docs use
                "num_learners",
                Annotated[int, tyro.conf.arg(aliases=("--learners",))],
                dataclasses.field(default=1),
            ),
            (  # --import MODULE, repeated for each module
                "imports",
                Annotated[tuple[str, ...], tyro.conf.arg(aliases=("--import",), metavar="MODULE ...")],
                dataclasses.field(default=()),
            ),
            *optional_flags,
        ],
        bases=(TrainConfig,),
    )


def number_rules() -> Any:
    """tyro rules that read an integer flag as the config files do: ``--total-steps 1e6`` or
    ``1_000_000`` is 1000000, ``1.5`` is refused (floats: Python's float() already reads 1e-3)."""

    def read_int(text: str) -> int:
        number = to_number(int, text)
        if number is None:
            raise ValueError(f"{text!r} is not a whole number (1000, 1_000 and 1e3 are)")
        return number

    registry = tyro.constructors.ConstructorRegistry()

    @registry.primitive_rule
    def integers(type_info: Any) -> Any:
        if type_info.type is not int:
            return None
        return tyro.constructors.PrimitiveConstructorSpec(
            nargs=1,
            metavar="INT",
            instance_from_str=lambda args: read_int(args[0]),
            is_instance=lambda value: isinstance(value, int) and not isinstance(value, bool),
            str_from_instance=lambda value: [str(value)],
        )

    return registry


def gather_repeated(argv: list[str], cls: type) -> list[str]:
    """``--mutate A --mutate B`` -> ``--mutate A B``: the values of a list flag of ``cls`` (a tuple field,
    also in its nested dataclasses) given more than once accumulate, where tyro, like argparse, would
    keep only the last occurrence. One occurrence still replaces the default or the config file's list."""
    flags = _list_flags(cls)
    gathered: list[Any] = []
    values_of: dict[str, list[str]] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if token == "--":  # the rest is positional
            gathered.extend(argv[index - 1 :])
            break
        flag, equals, inline = token.partition("=")
        name = flags.get(flag)
        if name is None:
            gathered.append(token)
            continue
        values = [inline] if equals else []
        while not equals and index < len(argv):
            following = argv[index]
            if following.startswith("-") and to_number(float, following) is None:  # a flag, not -1
                break
            values.append(following)
            index += 1
        if name in values_of:
            values_of[name].extend(values)
        else:
            values_of[name] = values
            gathered += [flag, values]
    return [part for item in gathered for part in (item if isinstance(item, list) else [item])]


def _list_flags(cls: type) -> dict[str, str]:
    """Every spelling of the flags of ``cls``'s tuple fields (and its nested dataclasses') -> field name."""
    flags: dict[str, str] = {}
    for name, kind in typing.get_type_hints(cls, include_extras=True).items():
        metadata: tuple[Any, ...] = ()
        if typing.get_origin(kind) is Annotated:
            kind, *extras = typing.get_args(kind)
            metadata = tuple(extras)
        if dataclasses.is_dataclass(kind):
            flags.update(_list_flags(kind))
        elif typing.get_origin(kind) in (tuple, list):
            aliases = [alias for extra in metadata for alias in getattr(extra, "aliases", None) or ()]
            for flag in (f"--{name}", f"--{name.replace('_', '-')}", *aliases):
                flags[flag] = name
    return flags


def parse_train_args(
    argv: list[str],
    settings: dict[str, Any] | None = None,
    where: str = "arguments",
    prog: str = "phalanx train",
) -> Any:
    """``ALGO ENV [--config FILE] [flags]`` -> a validated TrainConfig (``settings``: a config's values
    that the flags override, e.g. the base of a population file)."""
    positional = [a for a in argv[:2] if not a.startswith("-")]
    # `phalanx train ppo --help` shows the flags with the algorithm's defaults, without an env.
    asking_help = len(positional) == 1 and any(a in ("-h", "--help") for a in argv)
    if len(positional) < 2 and not asking_help:
        raise PhalanxError(f"`{prog}` needs an algorithm and an environment.\n{train_usage(prog)}")
    algo = positional[0]
    env = positional[1] if len(positional) > 1 else ""
    rest = argv[len(positional) :]
    algorithm = get_algorithm(algo)

    settings = dict(settings or {})
    if "--config" in rest:
        index = rest.index("--config")
        if index + 1 >= len(rest):
            raise PhalanxError("--config needs a YAML file path: --config my_run.yaml")
        config_file = rest[index + 1]
        settings = load_yaml(config_file)
        for key in ("algo", "env"):
            if key in settings and settings.pop(key) not in (algo, env):
                raise PhalanxError(
                    f"config file {rest[index + 1]!r} sets {key}, which disagrees with the command line "
                    f"({algo} {env}); remove it from the file or change the command."
                )
        rest = rest[:index] + rest[index + 2 :]
        where = f"config file {config_file!r}"
    default = make_config(algorithm.name, env, where=where, **settings)
    if registration(algorithm.name).recurrent is None and recurrent_flags(rest):
        raise no_recurrent_policy(algorithm.name)
    cls = cli_config_class(algorithm)
    base = {f.name: getattr(default, f.name) for f in dataclasses.fields(TrainConfig)}
    parsed = tyro.cli(
        cls,
        args=gather_repeated(rest, cls),
        default=cls(**base),
        prog=f"{prog} {algorithm.name} {env or 'ENV'}",
        description=f"Train {algorithm.name.upper()} on {env or 'ENV'} (defaults include the preset).",
        config=(tyro.conf.OmitArgPrefixes,),
        registry=number_rules(),
    )
    config = TrainConfig(**{f.name: getattr(parsed, f.name) for f in dataclasses.fields(TrainConfig)})
    import_modules(config.imports, "arguments")
    config.validate()
    return config


def recurrent_flags(argv: list[str]) -> list[str]:
    """The flags of ``argv`` that set a recurrent policy's settings (``--recurrent``, ``--burn-in``, ...)."""
    names = {f"--{name}" for name in RECURRENT_SETTINGS} | {
        f"--{name.replace('_', '-')}" for name in RECURRENT_SETTINGS
    }
    return [token for token in argv if token.partition("=")[0] in names]


def train_usage(prog: str) -> str:
    """How to call ``prog``, and the algorithms with the envs they have a preset for."""
    lines = [
        wrapped(f"usage: {prog} ALGO ENV [flags], e.g. {prog} ppo CartPole-v1", "", "  "),
        wrapped(f"`{prog} ALGO ENV --help` lists the flags, `phalanx envs` the env ids.", "", "  "),
        "Algorithms, and the envs they have a tuned preset for (others: defaults):",
    ]
    lines += [
        wrapped(", ".join(presets(name)) or "-", f"  {name:<12} ", " " * 15) for name in algorithm_names()
    ]
    return "\n".join(lines)


def wrapped(text: str, first: str = "  ", indent: str = "    ") -> str:
    """``text`` after ``first``, wrapped to the terminal (80 columns at most) with every continuation line
    indented by ``indent``; words (env ids such as CartPole-v1) are never broken."""
    width = max(min(shutil.get_terminal_size().columns, 80), 40)
    return textwrap.fill(
        text,
        width=width,
        initial_indent=first,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=False,
    )


def cmd_train(argv: list[str]) -> int:
    if not argv or argv in (["-h"], ["--help"]):  # a listing, not an error
        print(train_usage("phalanx train"))
        return 0
    config = parse_train_args(argv)
    try:
        result = train(
            config,
            on_run_dir=lambda path: console.print(
                f"run directory: [bold]{escape(str(path))}[/]", highlight=False, soft_wrap=True
            ),
        )
    except TrainingInterrupted as interrupted:
        console.print(f"[yellow]{escape(str(interrupted))}[/]", highlight=False, soft_wrap=True)
        return interrupted_exit_code()
    if not result.trained:
        say_nothing_to_train(result)
    return training_exit_code(result.summary)


def say_nothing_to_train(result: Any) -> None:
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


# -- eval / resume --------------------------------------------------------------------------------
def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx eval", description="Evaluate a trained agent deterministically."
    )
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--checkpoint", default="best", help="best (default), latest, or a checkpoint path")
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=None, help="seed of the evaluation episodes")
    video = parser.add_argument_group("video (written to RUN_DIR/videos/<env>_step<N>.<format>)")
    video.add_argument("--video", action="store_true", help="also record a deterministic episode")
    video.add_argument(
        "--video-format", choices=VIDEO_FORMATS, default=None, help="mp4 (default, H.264) or gif"
    )
    video.add_argument("--video-episodes", type=int, default=None, help="episodes in the video (default 1)")
    video.add_argument(
        "--video-max-steps",
        type=int,
        default=None,
        help=f"steps at most per episode (default {MAX_EPISODE_STEPS:,}, or the env's own time limit)",
    )
    video.add_argument(
        "--video-fps", type=float, default=None, help="frames per second (default: the env's own, real time)"
    )
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise PhalanxError(f"--episodes must be >= 1, got {args.episodes}.")
    video_options = (args.video_format, args.video_episodes, args.video_max_steps, args.video_fps)
    if any(option is not None for option in video_options):
        args.video = True  # a --video-* option asks for the video
    if args.video:
        counts = (("--video-episodes", args.video_episodes), ("--video-max-steps", args.video_max_steps))
        for flag, value in counts:
            if value is not None and value < 1:
                raise PhalanxError(f"{flag} must be >= 1, got {value}.")
        if args.video_fps is not None and not args.video_fps > 0:
            raise PhalanxError(f"--video-fps must be > 0, got {args.video_fps:g}.")
        check_video_format(args.video_format or "mp4")  # the encoder is there, before the evaluation runs
        check_recordable(args.run_dir, args.checkpoint)  # and the env draws, before the evaluation runs

    evaluation = evaluate(args.run_dir, args.episodes, args.checkpoint, args.device, args.seed)
    table = Table(title="deterministic evaluation", show_header=False)
    table.add_row("episodes", str(len(evaluation.returns)))
    table.add_row("return mean", f"{evaluation.mean:.3f}")
    table.add_row("return std", f"{evaluation.std:.3f}")
    table.add_row("length mean", f"{sum(evaluation.lengths) / len(evaluation.lengths):.1f}")

    if isinstance(evaluation, MultiAgentEvaluation):  # the return above is the first team's
        for name, value in evaluation.teams.items():
            table.add_row(f"team {name} return", f"{value:.3f}")
        for name, value in evaluation.agents.items():
            table.add_row(f"agent {name} return", f"{value:.3f}")
    out = Console()
    out.print(table)
    out.print(
        f"run directory: {args.run_dir} (checkpoint: {args.checkpoint})", highlight=False, soft_wrap=True
    )
    if args.video:
        path = record_video(
            args.run_dir,
            args.checkpoint,
            video_format=args.video_format or "mp4",
            episodes=args.video_episodes or 1,
            max_steps=args.video_max_steps or MAX_EPISODE_STEPS,
            fps=args.video_fps,
            seed=args.seed,
        )
        console.print(f"video: {path}", highlight=False, soft_wrap=True)
    return 0


def cmd_resume(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx resume", description="Continue a run from its latest checkpoint."
    )
    parser.add_argument("run_dir")
    parser.add_argument("--total-steps", type=int, default=None, help="new training budget (env steps)")
    args = parser.parse_args(argv)

    try:
        result = resume(args.run_dir, args.total_steps)
    except TrainingInterrupted as interrupted:
        console.print(f"[yellow]{escape(str(interrupted))}[/]", highlight=False, soft_wrap=True)
        return interrupted_exit_code()
    if not result.trained:
        say_nothing_to_train(result)
    return training_exit_code(result.summary)


def cmd_backtest(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx backtest",
        description="Backtest a stock trading agent out of sample (deterministic policy, one episode "
        "from the initial cash) against equal-weight buy-and-hold and the index; writes a new folder "
        "RUN_DIR/backtest/FIRST_LAST/ (equity.png, equity.csv, trades.csv, metrics.json; FIRST_LAST_2/ "
        "and so on when the period was backtested before).",
    )
    parser.add_argument("run_dir")
    parser.add_argument("--start", default=None, help="first date (default: the env's test period)")
    parser.add_argument("--end", default=None, help="last date, inclusive (default: the end of the data)")
    parser.add_argument("--checkpoint", default="best", help="best (default), latest, or a checkpoint path")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    result = backtest(args.run_dir, args.start, args.end, checkpoint=args.checkpoint, device=args.device)
    table = Table(title=f"backtest of {args.run_dir}: {result.period[0]}..{result.period[1]}")
    table.add_column("metric")
    for strategy in result.metrics:
        table.add_column(STRATEGY_LABELS.get(strategy, strategy), justify="right")
    for metric in METRIC_NAMES:
        table.add_row(
            METRIC_LABELS[metric], *(format_metric(metric, result.metrics[s][metric]) for s in result.metrics)
        )
    out = Console()
    out.print(table)
    for note in result.notes:
        out.print(escape(note), highlight=False)
    out.print(f"written: {result.out_dir}", highlight=False, soft_wrap=True)  # a new folder, path whole
    return 0


# -- export ---------------------------------------------------------------------------------------
def cmd_export(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx export",
        description="Write a trained policy as one self-contained file that runs without phalanx: raw "
        "observations (a float32 batch) in, actions in the env's action space out, with the observation "
        "normalisation and the action rescaling inside. ONNX runs with onnxruntime (pip install "
        "'phalanx[export]'), TorchScript with torch.jit.load. A multi-agent run gives one file per agent "
        "group. See docs/export.md.",
    )
    parser.add_argument("run_dir")
    parser.add_argument("--format", default="onnx", help=f"{' or '.join(FORMATS)} (default: onnx)")
    parser.add_argument("--checkpoint", default="best", help="best (default), latest, or a checkpoint path")
    parser.add_argument(
        "--output",
        default=None,
        help="the file to write (default: RUN_DIR/export/policy.onnx, policy.pt for TorchScript; "
        "policy_<group>.onnx per agent group)",
    )
    parser.add_argument(
        "--stochastic",
        action="store_true",
        help="export the sampling policy: the random draw is a second input, noise (see docs/export.md)",
    )
    args = parser.parse_args(argv)
    written = export(args.run_dir, args.format, args.checkpoint, args.output, args.stochastic)
    paths = written if isinstance(written, dict) else {"": written}
    out = Console()
    for group, path in paths.items():
        label = f"agent group {group}: " if group else ""
        out.print(f"written: {label}{path}", highlight=False, soft_wrap=True)
    return 0


# -- envs / check-env ------------------------------------------------------------------------------
def cmd_envs(argv: list[str]) -> int:
    envs = list_envs()
    lines = ["built-in batched envs (torch, any num_envs, CPU or CUDA):", wrapped(", ".join(envs["builtin"]))]
    if envs["registered"]:
        lines += ["registered with phalanx.envs.register_env:", wrapped(", ".join(envs["registered"]))]
    missing = envs["needs_extra"]
    ready = [env_id for env_id in envs["gymnasium"] if env_id not in missing]
    lines += [
        f"Gymnasium ids ({len(ready)}, stepped through the Gymnasium adapter):",
        wrapped(", ".join(ready)),
    ]
    for extra in sorted(set(missing.values())):
        ids = [env_id for env_id, needed in missing.items() if needed == extra]
        lines += [
            f"Gymnasium ids that need phalanx[{extra}] (not installed):",
            wrapped(", ".join(ids)),
        ]
    atari = envs["atari"]
    if atari is None:
        lines += [
            "Atari games (ALE/<Game>-v5; docs/atari.md):",
            wrapped("need phalanx[atari] (not installed)"),
        ]
    else:
        lines += [f"Atari games ({len(atari)}, preprocessed; docs/atari.md):", wrapped(", ".join(atari))]
    lines += [
        "EnvPool ids (phalanx[envpool]):",
        wrapped("envpool:<id>, e.g. envpool:Pong-v5, envpool:Ant-v5"),
        "MuJoCo Playground (phalanx[playground]):",
        wrapped(
            "playground:<EnvName>, the DM Control Suite tasks, e.g. playground:CheetahRun "
            "(docs/playground.md)"
        ),
    ]
    multi_agent = list_multi_agent_envs()
    lines.append("multi-agent envs (mappo, ippo, qmix, vdn, maddpg, matd3):")
    lines.append(wrapped(", ".join(multi_agent["builtin"]), "  built-in: "))
    if multi_agent["registered"]:
        lines.append(wrapped(", ".join(multi_agent["registered"]), "  registered: "))
    lines.append(wrapped(", ".join(multi_agent["adapters"]), "  adapters: "))
    print("\n".join(lines))
    return 0


def cmd_check_env(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx check-env", description="Check a VecEnv factory against the phalanx VecEnv contract."
    )
    parser.add_argument(
        "factory",
        metavar="FACTORY_OR_ENV",
        help="module.path:callable returning a phalanx VecEnv, or an env id (one registered in Python "
        "with --import MODULE)",
    )
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, e.g. one that calls register_env (repeatable)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    import_modules(args.imports, "arguments")
    prefix, colon, _ = args.factory.partition(":")
    if not colon or prefix in ("gym", *BACKENDS):  # an env id, as `phalanx train` takes it
        factory: Any = functools.partial(make_env, args.factory)
        call = f"make_env({args.factory!r}, num_envs={args.num_envs}, device={args.device!r})"
        kwargs = {"num_envs": args.num_envs, "device": args.device}
    else:
        factory = load_factory(args.factory)
        accepted = inspect.signature(factory).parameters
        kwargs = {k: v for k, v in (("num_envs", args.num_envs), ("device", args.device)) if k in accepted}
        call = f"{args.factory}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    try:
        env = factory(**kwargs)
    except PhalanxError:
        raise
    except Exception as error:
        raise PhalanxError(
            f"{call} raised {type(error).__name__}: {error}. The factory must build and return the VecEnv."
        ) from None
    report = check_vec_env(env, num_steps=args.steps)
    Console().print(f"[green]ok[/]: {escape(args.factory)} follows the VecEnv contract.", highlight=False)
    say = lambda text: console.print(escape(text), highlight=False, soft_wrap=True)  # noqa: E731
    episodes = (
        f"{report.episodes} episodes ended, mean return {report.mean_episode_return:.4g}, mean length "
        f"{report.mean_episode_length:.4g}"
        if report.episodes
        else "no episode ended"
    )
    print(wrapped(f"{report.num_steps:,} steps of {report.env}: {episodes}.", first="  "))
    for warning in report.warnings:
        say(f"warning: {warning}")
    return 0


# -- population -----------------------------------------------------------------------------------
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
        types, docs = typing.get_type_hints(source), _field_docs(source)
        for f in dataclasses.fields(source):
            if f.name in ("base", "mutations", "resources"):
                continue
            default = coerce(source, f.name, values[f.name], where) if f.name in values else f.default
            aliases = ("--dir",) if f.name == "directory" else ()
            annotation = Annotated[types[f.name], tyro.conf.arg(help=docs.get(f.name), aliases=aliases)]
            fields.append((f.name, annotation, dataclasses.field(default=default)))
    mutate_help = (
        "NAME=KIND:ARGS (repeatable; the kinds given for one NAME combine), e.g. "
        "learning_rate=log_uniform:1e-4,1e-2 --mutate learning_rate=perturb:0.8,1.25 or gamma=steps:0.95,0.99"
    )
    fields.append(
        ("mutate", Annotated[tuple[str, ...], tyro.conf.arg(help=mutate_help)], dataclasses.field(default=()))
    )
    return dataclasses.make_dataclass("PopulationFlags", fields)


def _field_docs(cls: type) -> dict[str, str]:
    """The docstrings under a dataclass's fields (the text the config modules document them with)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for statement, following in zip(body, body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def command_flags(cls: type, argv: list[str], prog: str, description: str) -> tuple[Any, list[str]]:
    """A command's own flags (the dataclass ``cls``) parsed from ``argv``, and the train flags it leaves
    for :func:`parse_train_args` (``population run`` and ``tune`` take both)."""
    return tyro.cli(
        cls,
        args=gather_repeated(argv, cls),
        return_unknown_args=True,
        prog=prog,
        description=description,
        config=(tyro.conf.OmitArgPrefixes,),
        registry=number_rules(),
    )


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
        name, equals, kind = spec.partition("=")
        if not equals:
            raise PhalanxError(
                f"--mutate {spec!r}: expected NAME=KIND:ARGS, e.g. learning_rate=perturb:0.8,1.2"
            )
        flagged.setdefault(name.strip(), {}).update(Mutation.spec_from_text(kind))
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


# -- plot -----------------------------------------------------------------------------------------
def cmd_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx plot",
        description="Learning curves of runs compared: the runs are grouped by a setting of their "
        "config.yaml, and each group drawn as the mean over its runs (seeds) with a shaded interval, on "
        "x values common to its runs (each run interpolated linearly onto them).",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_OR_GLOB",
        help="run directories, globs of them (quoted: 'runs/CartPole-v1__*'), or population directories",
    )
    parser.add_argument("--x", choices=list(X_COLUMNS), default="steps", help="env steps or wall time (s)")
    parser.add_argument(
        "--group-by",
        default="algo",
        metavar="SETTING",
        help="a setting of config.yaml: algo (default), env, seed, a hyperparameter (learning_rate), or "
        "library (a benchmark's peer runs; phalanx's own runs are 'phalanx')",
    )
    parser.add_argument(
        "--interval",
        choices=list(INTERVALS),
        default="stderr",
        help="shaded interval: standard error of the mean (default), min-max over the runs, or none",
    )
    parser.add_argument(
        "--metric",
        default=None,
        metavar="COLUMN",
        help="a column of evaluations.csv or metrics.csv (default: eval_return_mean if every run has "
        "evaluations, else episode_return_mean)",
    )
    parser.add_argument(
        "--span",
        choices=list(SPANS),
        default="common",
        help="common (default): each group's curve covers the x range all its runs have; longest: up to "
        "its longest run, runs that ended earlier holding their last value (runs stopped by --stop-return)",
    )
    parser.add_argument(
        "--output", default="plot.png", help="the figure: .png (default plot.png), .pdf, .svg"
    )
    parser.add_argument("--title", default=None, help="the figure's title (default: the env, metric, groups)")
    args = parser.parse_args(argv)
    result = curves(
        args.runs,
        x=args.x,
        group_by=args.group_by,
        interval=args.interval,
        metric=args.metric,
        span=args.span,
    )
    path = draw_curves(result, args.output, args.title)
    table = Table(title=f"{result.metric} against {result.x}, by {result.group_by}")
    table.add_column("group", overflow="fold", min_width=min(24, max(len(g.name) for g in result.groups)))
    for column in ("runs", "x range", "final mean", "interval at the end"):
        table.add_column(column, justify="right")
    for group in result.groups:
        spread = "-" if group.low is None else f"{group.low[-1]:,.4g} .. {group.high[-1]:,.4g}"
        table.add_row(
            escape(group.name),
            str(group.n),
            f"{group.x[0]:,.0f} .. {group.x[-1]:,.0f}"
            if result.x == "steps"
            else f"{group.x[0]:,.1f} .. {group.x[-1]:,.1f} s",
            f"{group.mean[-1]:,.4g}",
            spread,
        )
    Console().print(table)
    console.print(f"written: {path}", highlight=False, soft_wrap=True)
    return 0


# -- tune -------------------------------------------------------------------------------------------
def tune_cli_class() -> type:
    """The tune flags, from the TuneConfig fields (each documented once there); ``--trials`` is required,
    ``--search`` repeatable."""
    types, docs = typing.get_type_hints(TuneConfig), _field_docs(TuneConfig)
    fields: list[tuple[str, Any, Any]] = [("trials", Annotated[int, tyro.conf.arg(help=docs["trials"])])]
    for f in dataclasses.fields(TuneConfig):
        if f.name in ("base", "trials", "search"):
            continue
        aliases = ("--dir",) if f.name == "directory" else ()
        kind = tyro.conf.DisallowNone[types[f.name]] if f.default is None else types[f.name]  # absent: None
        annotation = Annotated[kind, tyro.conf.arg(help=docs.get(f.name), aliases=aliases)]
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
    search: dict[str, str] = {}
    for spec in flags.search:
        name, equals, dimension = spec.partition("=")
        if not equals or not name.strip():
            raise PhalanxError(
                f"--search {spec!r}: expected NAME=KIND:ARGS, e.g. learning_rate=log:1e-5,1e-3"
            )
        search[name.strip()] = dimension
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


if __name__ == "__main__":
    sys.exit(main())
