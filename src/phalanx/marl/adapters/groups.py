"""How the adapters group other libraries' agents, and the per-group views of per-agent tensors.

Agents whose names share the prefix before a final ``_<number>`` and that have equal spaces form one
group (:func:`group_agents`); :func:`split_groups` cuts a tensor over all agents into the groups' views
and :func:`concat_state` builds the global state of an env without one. Shared by both adapters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from phalanx.marl.core import AgentGroup, Groups, Tensor

_NUMBERED = re.compile(r"(.+)_(\d+)")


def agent_prefix(name: str) -> str:
    """The group prefix of an agent name: the part before a final ``_<number>``, else the whole name."""
    match = _NUMBERED.fullmatch(str(name))
    return match.group(1) if match else str(name)


def group_agents(agents: Sequence[str], signature: Callable[[str], Any]) -> dict[str, tuple[str, ...]]:
    """Agents grouped by name prefix and equal ``signature(agent)`` (their spaces), in ``agents`` order.

    Groups come in the order of their first agent. Agents that share a prefix but not a signature form
    several groups: the first keeps the prefix as its name, the next are ``prefix_g1``, ``prefix_g2``...
    """
    buckets: dict[str, list[tuple[Any, list[str]]]] = {}
    for agent in agents:
        subgroups = buckets.setdefault(agent_prefix(agent), [])
        key = signature(agent)
        for known, members in subgroups:
            if known == key:
                members.append(agent)
                break
        else:
            subgroups.append((key, [agent]))
    named: list[tuple[int, str, tuple[str, ...]]] = []
    taken: set[str] = set()
    for prefix, subgroups in buckets.items():
        for k, (_, members) in enumerate(subgroups):
            name = prefix if k == 0 else f"{prefix}_g{k}"
            while name in taken or (name != prefix and name in buckets):
                name += "_"
            taken.add(name)
            named.append((list(agents).index(members[0]), name, tuple(members)))
    return {name: members for _, name, members in sorted(named)}


def split_groups(groups: dict[str, AgentGroup], per_agent: Tensor) -> Groups:
    """A ``(num_envs, num_agents, ...)`` tensor over all agents as one view per group."""
    sizes = [group.num_agents for group in groups.values()]
    return dict(zip(groups, per_agent.split(sizes, dim=1), strict=True))


def concat_state(groups: dict[str, AgentGroup], obs: Groups) -> Tensor:
    """The global state of envs without one: every agent's observation, group by group."""
    return torch.cat([obs[name].flatten(1) for name in groups], dim=1)
