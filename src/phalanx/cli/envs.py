"""``phalanx envs`` lists the environment ids; ``phalanx check-env`` checks a VecEnv (a factory of yours
or an env id) against the VecEnv contract and says what it found.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from phalanx.cli.output import console, wrapped
from phalanx.config import import_modules
from phalanx.envs.check import check_vec_env
from phalanx.envs.registry import BACKENDS, list_envs, load_factory, make_env
from phalanx.errors import PhalanxError
from phalanx.marl.registry import list_multi_agent_envs


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
