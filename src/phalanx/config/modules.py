"""Importing the user's own modules (``--import MODULE``, a config's ``imports``): those that register
env ids with ``phalanx.envs.register_env``. Found from the current directory or the Python path, with an
error that names the module, what went wrong in it, and the fix.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from phalanx.errors import EnvError


def import_user_module(module_name: str, context: str) -> Any:
    """Import the user's module ``module_name``, or raise an EnvError that starts with ``context``.

    The current directory is put on ``sys.path`` (as ``python -m`` would) so that a module next to
    the user's shell, e.g. ``my_env.py``, can be named from the ``phalanx`` command.
    """
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        dotted = ".".join(Path(module_name).with_suffix("").parts)
        raise EnvError(
            f"{context}: {module_name!r} is a file path, expected a module name such as {dotted!r} (the "
            "path from the current directory or the Python path, dots for slashes, without .py)."
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise EnvError(
                f"{context}: module {module_name!r} not found (looked in the current "
                f"directory {cwd} and the Python path). Check the spelling, or run from the directory "
                "that contains it, or install the package that provides it."
            ) from None
        raise EnvError(
            f"{context}: importing {module_name!r} failed because it imports "
            f"{error.name!r}, which is not installed. Install it (pip install ...) in this environment."
        ) from None
    except Exception as error:  # noqa: BLE001 - any error in the user's module is reported, not raised
        raise EnvError(
            f"{context}: importing {module_name!r} raised {type(error).__name__}: {error}. "
            "Fix the error in that module (run `python -c 'import "
            f"{module_name}'` to see the traceback)."
        ) from None


def import_modules(modules: Iterable[str], where: str) -> None:
    """Import the modules a config names in ``imports`` (those that register its env ids), with the
    current directory on the Python path; an error names the module and ``where`` it was asked for."""
    for module in modules:
        import_user_module(module, f"{where}: imports")
