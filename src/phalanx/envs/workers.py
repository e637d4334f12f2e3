"""The Gymnasium adapters under their first module name, for the imports that use it.

:class:`GymnasiumVecEnv` and :func:`make_gym_env` live in :mod:`phalanx.envs.gymnasium`,
:class:`ProcessVecEnv` in :mod:`phalanx.envs.processes` (its workers' side in
:mod:`phalanx.envs.process_worker`).
"""

from __future__ import annotations

from phalanx.envs.gymnasium import GymnasiumVecEnv, make_gym_env
from phalanx.envs.processes import ProcessVecEnv

__all__ = ["GymnasiumVecEnv", "ProcessVecEnv", "make_gym_env"]
