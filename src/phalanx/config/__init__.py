"""Typed configuration: one dataclass field per setting, documented once, validated once.

A run is described by a :class:`TrainConfig` (what to train, where, for how long, how to log) whose
``hyperparameters`` field holds the algorithm's own dataclass (``PPOConfig``, ``A2CConfig``, ...,
defined next to each learning rule in ``phalanx.algos``). The CLI flags are generated from these
dataclasses, presets and YAML files fill the same fields, and ``config.yaml`` in a run directory is
the full resolved config.

- :mod:`~phalanx.config.schema`: :class:`AlgoConfig`, :class:`TrainConfig`, their checks, :func:`make_config`
  (defaults, the shipped preset, overrides) and :func:`presets`;
- :mod:`~phalanx.config.coercion`: a value as the type of the field it sets (:func:`coerce`);
- :mod:`~phalanx.config.yaml_reader`: the YAML reader every config, preset and CLI value goes through;
- :mod:`~phalanx.config.files`: config files read (:func:`load_yaml`) and a run's config.yaml written;
- :mod:`~phalanx.config.modules`: the user's modules a config imports (``--import``);
- :mod:`~phalanx.config.specs`: the CLI's ``NAME=KIND:ARGS`` specs (``--search``, ``--mutate``).
"""

from __future__ import annotations

from phalanx.config.coercion import coerce, is_int, to_number
from phalanx.config.files import load_yaml, save_yaml
from phalanx.config.modules import import_modules, import_user_module
from phalanx.config.schema import (
    ENCODERS,
    TRACKERS,
    VIDEO_FORMATS,
    WANDB_PROJECT_FORBIDDEN,
    AlgoConfig,
    TrainConfig,
    check,
    check_hyperparameter_name,
    make_config,
    presets,
)
from phalanx.config.yaml_reader import parse_scalar, parse_yaml

__all__ = [
    "ENCODERS",
    "TRACKERS",
    "VIDEO_FORMATS",
    "WANDB_PROJECT_FORBIDDEN",
    "AlgoConfig",
    "TrainConfig",
    "check",
    "check_hyperparameter_name",
    "coerce",
    "import_modules",
    "import_user_module",
    "is_int",
    "load_yaml",
    "make_config",
    "parse_scalar",
    "parse_yaml",
    "presets",
    "save_yaml",
    "to_number",
]
