"""User-facing errors: each says what is wrong, where, expected against actual, and how to fix it.

The CLI prints a :class:`PhalanxError` as one paragraph and exits non-zero, without a traceback;
anything else is a bug in phalanx and keeps its traceback.
"""

import importlib
from collections.abc import Collection
from types import ModuleType


class PhalanxError(Exception):
    """Base of the errors a user can cause and fix."""


class ConfigError(PhalanxError, ValueError):
    """A configuration value is impossible or inconsistent."""


class EnvError(PhalanxError, ValueError):
    """An environment id is unknown, an environment cannot be built, or it is given invalid actions."""


class ContractError(PhalanxError):
    """An environment breaks the VecEnv contract (see ``phalanx.envs.check_vec_env``)."""


class CheckpointError(PhalanxError):
    """A checkpoint or run directory cannot be read, or does not belong to this run."""


class DataError(PhalanxError, ValueError):
    """A market data file or frame is empty, malformed, or does not cover what was asked of it."""


def import_optional(
    module_name: str, error: type[PhalanxError], message: str, packages: Collection[str] | None = None
) -> ModuleType:
    """Import ``module_name``, the module of an optional extra, or say how to install what is missing.

    When the import fails because a package is not installed, raise ``error(message)``, every
    ``{package}`` in ``message`` replaced by the missing package's name: an install for the user to
    do, said in one paragraph instead of a traceback. ``packages`` limits this to those packages; a
    module missing outside them (a broken install of the extra itself) keeps its traceback.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as missing:
        if packages is not None and missing.name not in packages:
            raise
        raise error(message.replace("{package}", str(missing.name))) from None
