"""The CLI's specs of a searched or mutated hyperparameter, ``NAME=KIND:ARGS`` (``--search`` of `phalanx
tune`, ``--mutate`` of `phalanx population run`): one parser for both, so that they are written and read
alike, with errors that show the spec, what was expected and the fix.

- ``NAME``: the hyperparameter, before the first ``=`` (spaces around it are dropped);
- ``KIND``: before the first ``:`` of the rest, one of the kinds the caller takes;
- ``ARGS``: the values, comma separated, read as the items of a YAML flow sequence (:func:`parse_yaml`):
  ``1e-5,1e-3`` are numbers, ``tanh,relu`` text, ``[64,64],[256,256]`` two lists, and no values an empty
  tuple.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import yaml

from phalanx.config.yaml_reader import parse_yaml
from phalanx.errors import ConfigError


def split_name(spec: str, flag: str, example: str) -> tuple[str, str]:
    """``NAME=KIND:ARGS`` as ``(NAME, "KIND:ARGS")``, or a ConfigError naming ``flag`` (``--search``) with
    ``example`` (``learning_rate=log:1e-5,1e-3``) as the fix."""
    name, equals, rest = spec.partition("=")
    if equals and name.strip():
        return name.strip(), rest
    what = "no '=' between the name and the kind" if not equals else "no name before the '='"
    raise ConfigError(f"{flag} {spec!r}: expected NAME=KIND:ARGS ({what}), e.g. {example}")


def parse_kind_args(spec: str, kinds: Mapping[str, str], where: str) -> tuple[str, tuple[Any, ...]]:
    """``KIND:ARGS`` as ``(KIND, ARGS)`` (``"log:1e-5,1e-3"`` -> ``("log", (1e-05, 0.001))``), or a
    ConfigError that starts with ``where`` (e.g. ``--search learning_rate=logg:1e-5``). ``kinds`` maps
    each kind taken to how it is written (``log:LOW,HIGH (...), e.g. ...``), which the errors list."""
    kind, colon, rest = spec.partition(":")
    kind = kind.strip()
    if not colon or kind not in kinds:
        close = difflib.get_close_matches(kind, list(kinds), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        found = f"unknown kind {kind!r}.{hint}" if kind not in kinds else f"no ':' after the kind {kind!r}."
        raise ConfigError(
            f"{where}: {found} Write NAME=KIND:ARGS with one of:\n  " + "\n  ".join(kinds.values())
        )
    try:
        values = parse_yaml(f"[{rest}]")
    except yaml.YAMLError as error:
        raise ConfigError(
            f"{where}: cannot read the values {rest!r} ({error}); expected {kinds[kind]}."
        ) from None
    return kind, tuple(values)
