"""Environment ids: built-in batched simulators, user-registered factories, and Gymnasium's registry.

:func:`make_env` resolves an id in this order:

1. ids registered with :func:`register_env` (these may shadow a built-in id with ``overwrite=True``);
2. built-in batched simulators (``phalanx.envs.classic.CLASSIC_ENVS``, the memory tasks
   ``MEMORY_ENVS`` and ``StockTrading-v0``);
3. ``"<backend>:<id>"`` for the imported simulators in :data:`BACKENDS`: ``gym:`` forces the
   Gymnasium adapter, ``envpool:`` EnvPool's C++ envs, ``brax:`` and ``gymnax:`` JAX simulators,
   ``playground:`` MuJoCo Playground's MJX tasks (:mod:`phalanx.envs.playground`);
4. ``ALE/<Game>-v5``: Atari games with the standard preprocessing and 4 stacked frames
   (:func:`~phalanx.envs.atari.make_atari_env`; ``gym:ALE/<Game>-v5`` gives the raw game);
5. any other id in Gymnasium's registry, through the Gymnasium adapter.

Gymnasium ids step in this process one after another (:class:`~phalanx.envs.workers.GymnasiumVecEnv`)
with ``num_workers=0``, or in ``num_workers`` processes (:class:`~phalanx.envs.workers.ProcessVecEnv`).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

from phalanx.config import import_user_module
from phalanx.envs.atari import atari_game_ids, is_atari_id, make_atari_env
from phalanx.envs.classic import CLASSIC_ENVS, MEMORY_ENVS
from phalanx.envs.core import VecEnv
from phalanx.envs.gymnasium import GymnasiumVecEnv
from phalanx.envs.gymnasium_ids import gymnasium_extra, gymnasium_unavailable
from phalanx.envs.processes import ProcessVecEnv
from phalanx.envs.trading import StockTradingVecEnv
from phalanx.errors import EnvError, import_optional
from phalanx.registry import resolve

__all__ = ["list_envs", "load_factory", "make_env", "register_env"]

VecEnvFactory = Callable[..., VecEnv]

_REGISTERED: dict[str, VecEnvFactory] = {}
_GYM_PREFIX = "gym:"

# "<backend>:<id>" -> the adapter class ("module:attribute", imported on first use so that an absent
# extra costs nothing until it is asked for) and the extra that installs the simulator.
BACKENDS: dict[str, tuple[str, str]] = {
    "envpool": ("phalanx.envs.envpool:EnvPoolVecEnv", "envpool"),
    "brax": ("phalanx.envs.jax:BraxVecEnv", "jax"),
    "gymnax": ("phalanx.envs.jax:GymnaxVecEnv", "jax"),
    "playground": ("phalanx.envs.playground:PlaygroundVecEnv", "playground"),
}


def _builtin() -> dict[str, VecEnvFactory]:
    return {**CLASSIC_ENVS, **MEMORY_ENVS, "StockTrading-v0": StockTradingVecEnv}


def register_env(env_id: str, factory: VecEnvFactory, *, overwrite: bool = False) -> None:
    """Make ``make_env(env_id, ...)`` call ``factory(num_envs=..., device=..., **kwargs) -> VecEnv``."""
    if not isinstance(env_id, str) or not env_id or env_id.startswith(_GYM_PREFIX):
        raise EnvError(
            f"register_env: env_id must be a non-empty string not starting with {_GYM_PREFIX!r}, got "
            f"{env_id!r}. Use a name such as 'MyTask-v0'."
        )
    if not callable(factory):
        raise EnvError(
            f"register_env({env_id!r}): factory must be callable as factory(num_envs=..., device=..., "
            f"**kwargs) -> VecEnv, got {type(factory).__name__} ({factory!r})."
        )
    if not overwrite:
        if env_id in _REGISTERED:
            raise EnvError(
                f"register_env: {env_id!r} is already registered (factory {_REGISTERED[env_id]!r}). Pass "
                "overwrite=True to replace it, or choose another id."
            )
        if env_id in _builtin():
            raise EnvError(
                f"register_env: {env_id!r} is a built-in phalanx environment. Pass overwrite=True to "
                "shadow it with your factory, or choose another id."
            )
    _REGISTERED[env_id] = factory


def unregister_env(env_id: str) -> None:
    """Remove an id added with :func:`register_env` (no error if absent)."""
    _REGISTERED.pop(env_id, None)


def registered_factories() -> dict[str, VecEnvFactory]:
    """The ids added with :func:`register_env` and their factories (to register them in another process)."""
    return dict(_REGISTERED)


def list_envs() -> dict[str, Any]:
    """Every id :func:`make_env` accepts: ``{"builtin": [...], "registered": [...], "gymnasium": [...],
    "needs_extra": {gymnasium_id: extra}, "atari": [...] or None}``. The Gymnasium ids are those phalanx
    can run (not those :func:`gymnasium_unavailable` names); ``needs_extra`` marks the ones whose
    simulator a phalanx extra installs that is not installed here. ``atari``: the ``ALE/<Game>-v5`` ids
    (preprocessed, see :mod:`phalanx.envs.atari`), None where ale-py (the atari extra) is not installed."""
    gymnasium = sorted(
        env_id
        for env_id in gym.envs.registry
        if gymnasium_unavailable(env_id) is None and not is_atari_id(env_id)
    )
    extras = {env_id: gymnasium_extra(env_id) for env_id in gymnasium}
    return {
        "builtin": sorted(_builtin()),
        "registered": sorted(_REGISTERED),
        "gymnasium": gymnasium,
        "needs_extra": {env_id: extra for env_id, extra in extras.items() if extra is not None},
        "atari": atari_game_ids(),
    }


def _suggest(env_id: str) -> str:
    names: dict[str, str] = {}
    envs = list_envs()
    for group in (envs["builtin"], envs["registered"], envs["gymnasium"]):
        for name in group:
            names.setdefault(name.lower(), name)
    query = env_id.partition(":")[2].lower() if ":" in env_id else env_id.lower()
    close = [names[name] for name in difflib.get_close_matches(query, list(names), n=5, cutoff=0.6)]
    return f" Did you mean: {', '.join(close)}?" if close else ""


ELSEWHERE_HINTS = ("phalanx.marl.registry:single_agent_hint",)
"""Functions ``hint(env_id) -> str`` that say where an unknown id lives (a multi-agent id), named as
``"module:attribute"`` and imported only when an id is unknown (they sit in the layers above)."""

# Gymnasium namespaces whose ids a separate package registers: namespace -> how to get them.
_NAMESPACES = {"ALE": "The Atari ids (ALE/<Game>-v5) come with ale-py: `pip install 'phalanx[atari]'`"}


def _elsewhere(env_id: str) -> str:
    """Where an id unknown to Gymnasium can be found: a namespace's package, or EnvPool if installed."""
    namespace, _, name = env_id.removeprefix(_GYM_PREFIX).rpartition("/")
    hints = [f" {_NAMESPACES[namespace]}."] if namespace in _NAMESPACES else []
    hints += [resolve(hint)(env_id) for hint in ELSEWHERE_HINTS]
    if importlib.util.find_spec("envpool") is not None:
        import envpool

        if name in envpool.list_all_envs():
            hints.append(f" EnvPool has it: use 'envpool:{name}'.")
    return "".join(hints)


def _unknown(env_id: str) -> EnvError:
    return EnvError(
        f"Unknown environment id {env_id!r}: it is not a built-in phalanx env, not registered with "
        f"phalanx.envs.register_env, and not in Gymnasium's registry.{_elsewhere(env_id)}{_suggest(env_id)} "
        "Run `phalanx envs` to list every available id. If the id is registered by a module of yours or a "
        "third-party package, import it first (on the command line: --import MODULE)."
    )


def _call_factory(env_id: str, factory: VecEnvFactory, num_envs: int, device: Any, kwargs: dict) -> VecEnv:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(num_envs=num_envs, device=device, **kwargs)
        except TypeError as error:
            accepted = ", ".join(name for name in signature.parameters if name not in ("self",))
            raise EnvError(
                f"make_env({env_id!r}): {getattr(factory, '__name__', factory)!r} cannot be called with "
                f"num_envs, device and {sorted(kwargs) or 'no other arguments'} ({error}). It accepts: "
                f"{accepted}. Pass only those keyword arguments."
            ) from None
    env = factory(num_envs=num_envs, device=device, **kwargs)
    if not isinstance(env, VecEnv):
        raise EnvError(
            f"make_env({env_id!r}): the factory {factory!r} returned {type(env).__name__}, expected a "
            "phalanx.envs.VecEnv. Return a VecEnv subclass (e.g. a BatchedVecEnv), or register a "
            "Gymnasium env and use it through GymnasiumVecEnv."
        )
    return env


def _backend_class(env_id: str, backend: str) -> Callable[..., VecEnv]:
    target, extra = BACKENDS[backend]
    module_name, _, attribute = target.partition(":")
    module = import_optional(
        module_name,
        EnvError,
        f"make_env({env_id!r}): the {backend!r} backend needs the package '{{package}}', which is not "
        f"installed. Install it with `pip install 'phalanx[{extra}]'`.",
    )
    return getattr(module, attribute)


def make_env(
    env_id: str,
    num_envs: int = 1,
    device: str | torch.device = "cpu",
    seed: int | None = None,
    num_workers: int = 0,
    worker_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> VecEnv:
    """Build ``num_envs`` copies of ``env_id`` as one VecEnv on ``device``; reset with ``seed`` if given.

    ``kwargs`` go to the env's constructor (``gymnasium.make`` for Gymnasium ids, e.g.
    ``render_mode="rgb_array"``; :func:`~phalanx.envs.atari.make_atari_env` for ``ALE/<Game>-v5``, e.g.
    ``repeat_action_probability=0.0``). ``num_workers > 0`` steps a Gymnasium env's copies in that many
    processes (:class:`~phalanx.envs.workers.ProcessVecEnv`, configured by ``worker_options``, e.g.
    ``{"max_restarts": 3}``); it applies only to Gymnasium ids (Atari's included), since every other
    env is already batched.
    """
    if not isinstance(env_id, str) or not env_id:
        raise EnvError(f"make_env: env_id must be a non-empty string such as 'CartPole-v1', got {env_id!r}.")
    backend, sep, backend_id = env_id.partition(":")
    gym_id = env_id.removeprefix(_GYM_PREFIX)
    is_atari = is_atari_id(env_id) and env_id not in _REGISTERED
    is_gym = env_id.startswith(_GYM_PREFIX) or (
        env_id not in _REGISTERED
        and env_id not in _builtin()
        and not (sep and backend in BACKENDS)
        and not is_atari
    )
    if num_workers and not (is_gym or is_atari):
        hint = (
            f" For Gymnasium's own {env_id!r} in worker processes, use 'gym:{env_id}'."
            if (env_id in gym.envs.registry)
            else ""
        )
        raise EnvError(
            f"make_env({env_id!r}): num_workers={num_workers} applies to Gymnasium environments only; "
            f"{env_id!r} is already a batched VecEnv that steps all {num_envs} sub-envs at once. "
            f"Use num_workers=0.{hint}"
        )
    if env_id in _REGISTERED:
        env = _call_factory(env_id, _REGISTERED[env_id], num_envs, device, kwargs)
    elif env_id in (builtin := _builtin()):
        env = _call_factory(env_id, builtin[env_id], num_envs, device, kwargs)
    elif sep and backend in BACKENDS:
        env = _backend_class(env_id, backend)(backend_id, num_envs=num_envs, device=device, **kwargs)
    elif is_atari:
        env = make_atari_env(env_id, num_envs, device, num_workers, worker_options, **kwargs)
    else:
        if is_atari_id(gym_id):
            _ale_registered(env_id)
        if gym_id not in gym.envs.registry:
            raise _unknown(env_id)
        if num_workers:
            env = ProcessVecEnv(
                gym_id,
                num_envs=num_envs,
                num_workers=num_workers,
                device=device,
                **(worker_options or {}),
                **kwargs,
            )
        else:
            env = GymnasiumVecEnv(gym_id, num_envs=num_envs, device=device, **kwargs)
    if seed is not None:
        env.reset(seed=seed)
    return env


def _ale_registered(env_id: str) -> None:
    """Register ale-py's ids with Gymnasium (for a raw ``gym:ALE/...`` id); the atari extra's error if
    ale-py is missing."""
    import_optional(
        "ale_py",
        EnvError,
        f"make_env({env_id!r}): the Atari games need ale-py, which is not installed. Install it with "
        "`pip install 'phalanx[atari]'`.",
        packages=("ale_py",),
    )
    gym.register_envs(importlib.import_module("ale_py"))


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:attribute"`` (``attribute`` may be dotted).

    The module is imported by :func:`import_user_module`, from the current directory or the Python path.
    """
    module_name, sep, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module_name or not attr or ":" in attr:
        raise EnvError(
            f"Bad env factory {spec!r}: expected 'module.path:callable', e.g. 'my_envs:make_my_env' for a "
            "function make_my_env in my_envs.py (the module must be importable from the current directory "
            "or the Python path)."
        )
    module = import_user_module(module_name, f"Bad env factory {spec!r}")
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            public = sorted(name for name in dir(target) if not name.startswith("_"))
            close = difflib.get_close_matches(part, public, n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise EnvError(
                f"Bad env factory {spec!r}: {module_name!r} has no attribute {attr!r} ({part!r} missing)."
                f"{hint} Name a function or class defined in that module."
            )
        target = getattr(target, part)
    if not callable(target):
        raise EnvError(
            f"Bad env factory {spec!r}: {attr!r} is a {type(target).__name__}, expected a callable "
            "(a function or class returning an env)."
        )
    return target
