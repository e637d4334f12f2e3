"""The docs tests' step cap, outside phalanx: tests/test_docs.py puts this folder on the PYTHONPATH of the
scripts and commands it runs (Python imports ``sitecustomize`` at start-up, in every process, workers
included), with ``PHALANX_DOCS_MAX_STEPS`` set. Once ``phalanx.config`` is imported (never before: the
import order of a reader's script stays its own), every TrainConfig built is capped at that many steps,
wherever it comes from (make_config, the CLI, YAML files, resume, the Trainer's copy, population
members), so that a documented 1M-step run ends after a few thousand steps. phalanx itself reads no such
variable: nothing a test needs can change a user's run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

CAP = int(os.environ.get("PHALANX_DOCS_MAX_STEPS") or 0)


def cap_train_configs(module) -> None:
    """Wrap TrainConfig's __init__ (dataclasses.replace and from_dict go through it) with the cap."""
    config_class = module.TrainConfig
    init = config_class.__init__

    def capped_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        if isinstance(self.total_steps, int) and not isinstance(self.total_steps, bool):
            self.total_steps = min(self.total_steps, CAP)

    config_class.__init__ = capped_init


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        cap_train_configs(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds phalanx.config as the other finders do, and caps it once it is loaded."""

    def find_spec(self, name, path, target=None):
        if name != "phalanx.config":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if CAP:
    sys.meta_path.insert(0, _Finder())
