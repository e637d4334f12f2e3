"""Multi-agent env ids: the built-in batched tasks, user-registered factories, and the adapters.

:func:`make_multi_agent_env` resolves an id in this order:

1. ids registered with :func:`register_multi_agent_env`;
2. the built-in batched MPE tasks: ``simple_spread``, ``simple_tag`` (discrete actions) and their
   ``_continuous`` variants;
3. ``"pettingzoo:<module>"``: any PettingZoo parallel env whose module has ``parallel_env()`` (e.g.
   ``pettingzoo:mpe2.simple_spread_v3``), or ``"pettingzoo:<module>:<factory>"``, stepped in this
   process or in ``num_workers`` processes;
4. ``"vmas:<scenario>"``: a VMAS scenario, batched on the device already.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from typing import Any

import torch

from phalanx.errors import EnvError, import_optional
from phalanx.marl.adapters import PettingZooVecEnv, VMASVecEnv
from phalanx.marl.core import MultiAgentVecEnv
from phalanx.marl.mpe import SimpleSpread, SimpleTag

MultiAgentFactory = Callable[..., MultiAgentVecEnv]

_REGISTERED: dict[str, MultiAgentFactory] = {}


def _builtin() -> dict[str, MultiAgentFactory]:
    return {
        "simple_spread": SimpleSpread,
        "simple_spread_continuous": functools.partial(SimpleSpread, continuous_actions=True),
        "simple_tag": SimpleTag,
        "simple_tag_continuous": functools.partial(SimpleTag, continuous_actions=True),
    }


BUILTIN_IDS = ("simple_spread", "simple_spread_continuous", "simple_tag", "simple_tag_continuous")
ADAPTERS = {"pettingzoo": "marl", "vmas": "marl"}
"""``"<adapter>:<id>"`` prefixes and the extra that installs what they need."""


def register_multi_agent_env(env_id: str, factory: MultiAgentFactory, *, overwrite: bool = False) -> None:
    """Make ``make_multi_agent_env(env_id, ...)`` call ``factory(num_envs=..., device=..., **kwargs)``."""
    if not isinstance(env_id, str) or not env_id or ":" in env_id:
        raise EnvError(
            f"register_multi_agent_env: env_id must be a non-empty string without ':', got {env_id!r}."
        )
    if not callable(factory):
        raise EnvError(
            f"register_multi_agent_env({env_id!r}): factory must be callable as factory(num_envs=..., "
            f"device=..., **kwargs) -> MultiAgentVecEnv, got {type(factory).__name__}."
        )
    if not overwrite and (env_id in _REGISTERED or env_id in BUILTIN_IDS):
        raise EnvError(
            f"register_multi_agent_env: {env_id!r} is already a multi-agent env id. Pass overwrite=True to "
            "replace it, or choose another id."
        )
    _REGISTERED[env_id] = factory


def is_multi_agent_env(env_id: str) -> bool:
    """Whether ``env_id`` names a multi-agent env (built in, registered, or an adapter prefix)."""
    prefix, sep, _ = env_id.partition(":")
    return env_id in _REGISTERED or env_id in BUILTIN_IDS or bool(sep and prefix in ADAPTERS)


def list_multi_agent_envs() -> dict[str, list[str]]:
    return {
        "builtin": list(BUILTIN_IDS),
        "registered": sorted(_REGISTERED),
        "adapters": ["pettingzoo:<module>[:<factory>]", "vmas:<scenario>"],
    }


def make_multi_agent_env(
    env_id: str,
    num_envs: int = 1,
    device: str | torch.device = "cpu",
    seed: int | None = None,
    num_workers: int = 0,
    **kwargs: Any,
) -> MultiAgentVecEnv:
    """``num_envs`` copies of the multi-agent env ``env_id`` as one MultiAgentVecEnv on ``device``.

    ``num_workers`` applies to PettingZoo envs (stepped in that many processes); ``kwargs`` go to the
    env's constructor (for ``pettingzoo:`` ids, to the module's ``parallel_env``).
    """
    if not isinstance(env_id, str) or not env_id:
        raise EnvError(f"make_multi_agent_env: env_id must be a non-empty string, got {env_id!r}.")
    prefix, sep, rest = env_id.partition(":")
    if num_workers and prefix != "pettingzoo":
        raise EnvError(
            f"make_multi_agent_env({env_id!r}): num_workers={num_workers} applies to PettingZoo envs only "
            "('pettingzoo:<module>'); the others step all their sub-envs as one batch. Use num_workers=0."
        )
    if env_id in _REGISTERED:
        env = _REGISTERED[env_id](num_envs=num_envs, device=device, **kwargs)
    elif env_id in BUILTIN_IDS:
        env = _builtin()[env_id](num_envs=num_envs, device=device, **kwargs)
    elif sep and prefix == "pettingzoo":
        factory = _pettingzoo_factory(env_id, rest, kwargs)
        env = PettingZooVecEnv(factory, num_envs=num_envs, num_workers=num_workers, device=device)
    elif sep and prefix == "vmas":
        env = VMASVecEnv(rest, num_envs=num_envs, device=device, seed=seed, **kwargs)
    else:
        raise _unknown(env_id)
    if not isinstance(env, MultiAgentVecEnv):
        raise EnvError(
            f"make_multi_agent_env({env_id!r}): the factory returned {type(env).__name__}, expected a "
            "phalanx.marl.MultiAgentVecEnv."
        )
    if seed is not None:
        env.reset(seed=seed)
    return env


def _pettingzoo_factory(env_id: str, spec: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A picklable zero-argument factory of the PettingZoo parallel env named by ``spec``."""
    module_name, _, attribute = spec.partition(":")
    module = import_optional(
        module_name,
        EnvError,
        f"make_multi_agent_env({env_id!r}): cannot import {module_name!r} ('{{package}}' is not "
        "installed). PettingZoo envs need `pip install 'phalanx[marl]'` and the package of the env "
        "(e.g. mpe2, pettingzoo[butterfly]).",
    )
    attribute = attribute or "parallel_env"
    if not callable(getattr(module, attribute, None)):
        raise EnvError(
            f"make_multi_agent_env({env_id!r}): module {module_name!r} has no callable {attribute!r}. Name "
            "the factory of a parallel env: 'pettingzoo:<module>:<factory>'."
        )
    return functools.partial(getattr(module, attribute), **kwargs)


def _unknown(env_id: str) -> EnvError:
    names = [*BUILTIN_IDS, *_REGISTERED]
    close = difflib.get_close_matches(env_id, names, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return EnvError(
        f"Unknown multi-agent environment id {env_id!r}.{hint} Multi-agent ids: {', '.join(names)}, "
        "'pettingzoo:<module>' (a PettingZoo parallel env, e.g. pettingzoo:mpe2.simple_spread_v3) and "
        "'vmas:<scenario>'. Run `phalanx envs` to list them."
    )


def single_agent_hint(env_id: str) -> str:
    """What ``make_env`` says of a multi-agent id (one of ``phalanx.envs.registry.ELSEWHERE_HINTS``)."""
    if is_multi_agent_env(env_id):
        return (
            f" {env_id!r} is a multi-agent env: train it with a multi-agent algorithm (mappo, ippo, qmix, "
            "vdn, maddpg, matd3)."
        )
    return ""
