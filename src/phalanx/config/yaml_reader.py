"""The one YAML reader of phalanx: PyYAML's safe loader with YAML 1.2's floats.

Config files, the config.yaml of runs, population files, presets and the values of CLI specs (``--search``,
``--mutate``) are all read here, so that ``1e-3`` is the same number wherever a user writes it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, with YAML 1.2's floats: ``1e-3`` and ``1.0e5`` are numbers (YAML 1.1, which
    PyYAML follows, wants a dot and a signed exponent, so it reads them as text)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """YAML ``text`` as Python values; every YAML phalanx reads goes through here (config files,
    config.yaml of runs, population files, presets, the values of CLI specs such as --mutate)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def parse_scalar(text: str) -> Any:
    """One value written as in YAML: ``"1e-4"`` -> 0.0001, ``"1_000"`` -> 1000, ``"tanh"`` -> "tanh"."""
    try:
        return parse_yaml(text)
    except yaml.YAMLError:
        return text
