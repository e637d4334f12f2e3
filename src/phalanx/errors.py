"""User-facing errors: each says what is wrong, where, expected against actual, and how to fix it.

The CLI prints a :class:`PhalanxError` as one paragraph and exits non-zero, without a traceback;
anything else is a bug in phalanx and keeps its traceback.
"""


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
