"""Which of Gymnasium's ids phalanx can run, and which phalanx extra installs the simulator of those
that need one (``make_env``, ``list_envs`` and the Gymnasium adapter ask)."""

from __future__ import annotations

import importlib.util

import gymnasium as gym

GYMNASIUM_EXTRAS = {
    "gymnasium.envs.box2d": ("Box2D", "box2d"),
    "gymnasium.envs.mujoco": ("mujoco", "mujoco"),
    "gymnasium.envs.phys2d": ("jax", "jax"),
    "gymnasium.envs.tabular": ("jax", "jax"),
}
"""Gymnasium's optional simulators: entry point module -> (the package it imports, the phalanx extra)."""


def gymnasium_extra(env_id: str) -> str | None:
    """The phalanx extra that installs the simulator of Gymnasium's ``env_id``, if it is not installed
    here (None: nothing is missing, or the id is not one of Gymnasium's optional simulators)."""
    spec = gym.envs.registry.get(env_id)
    entry_point = spec.entry_point if spec is not None and isinstance(spec.entry_point, str) else ""
    for prefix, (package, extra) in GYMNASIUM_EXTRAS.items():
        if entry_point.startswith(prefix + ".") and importlib.util.find_spec(package) is None:
            return extra
    return None


def gymnasium_unavailable(env_id: str) -> str | None:
    """Why Gymnasium's ``env_id`` cannot run in phalanx, whatever is installed (None: it can, perhaps
    after installing an extra): ids Gymnasium keeps only to say where they went (their entry point
    raises), and entry points whose package is not installed."""
    spec = gym.envs.registry.get(env_id)
    if spec is None:
        return None
    entry_point = spec.entry_point
    if callable(entry_point):
        name = getattr(entry_point, "__name__", "")
        if name == "_raise_mujoco_py_error":
            current = f"{env_id.rpartition('-v')[0]}-v5"
            instead = f"'{current}'" if current in gym.envs.registry else "the v5 version of the id"
            extra = gymnasium_extra(current)
            install = f", after `pip install 'phalanx[{extra}]'`" if extra else ""
            return (
                "Gymnasium's MuJoCo v2 and v3 environments need mujoco-py, which phalanx does not support. "
                f"Use {instead} (the same task on the mujoco package{install})"
            )
        if name == "_raise_shimmy_error":
            return (
                "it is Gymnasium's compatibility wrapper for environments of the old gym API (through "
                "shimmy), not an environment. Port the environment to the Gymnasium API, or build it with "
                "shimmy in a factory of yours and register that with phalanx.envs.register_env"
            )
        return None
    assert isinstance(entry_point, str), f"a registered id has an entry point: {env_id}"
    package = entry_point.partition(":")[0].partition(".")[0]  # found without importing anything
    if importlib.util.find_spec(package) is not None:
        return None  # (Gymnasium's optional simulators: gymnasium_extra says what they need)
    return (
        f"its entry point {entry_point!r} cannot be imported: the package {package!r} is not installed. "
        "Install the package that provides it"
    )
