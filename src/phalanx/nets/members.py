"""P networks as one module: the policy heads and value nets of a population's members, each an
:class:`~phalanx.nets.mlp.EnsembleMLP` with a leading member dimension, every member drawing its actions'
noise from its own generator (so that a vectorised population samples what P separate runs would).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from phalanx.nets.heads import (
    LOG_SQRT_2PI,
    CategoricalPolicy,
    GaussianPolicy,
    ValueNet,
    log_softmax_actions_first,
)
from phalanx.nets.mlp import EnsembleMLP

Tensor = torch.Tensor


class MemberNoise:
    """Each member's random draws from its own generator, into one reusable ``(P, *shape)`` buffer.

    Member i's slice holds exactly what ``torch.rand(shape, generator=generators[i])`` (or ``randn``)
    returns; filling preallocated views in place costs a third of a ``torch.rand`` call per member,
    which matters with one call per member per env step. The buffer is overwritten by the next draw.
    """

    def __init__(self) -> None:
        self.buffer: Tensor | None = None
        self.views: list[Tensor] = []

    def draw(
        self, generators: Sequence[torch.Generator], shape: tuple[int, ...], like: Tensor, normal: bool
    ) -> Tensor:
        full_shape = (len(generators), *shape)
        buffer = self.buffer
        if (
            buffer is None
            or buffer.shape != full_shape
            or buffer.device != like.device
            or buffer.dtype != like.dtype
        ):
            buffer = self.buffer = torch.empty(full_shape, device=like.device, dtype=like.dtype)
            self.views = list(buffer.unbind(0))
        for view, generator in zip(self.views, generators, strict=True):
            if normal:
                view.normal_(generator=generator)
            else:
                view.uniform_(generator=generator)
        return buffer


class MemberCategoricalPolicy(CategoricalPolicy):
    """P categorical policies as one module: ``logits_net`` is an EnsembleMLP; observations are
    ``(P, B, obs_dim)``.

    ``forward``, ``log_prob_entropy`` and ``deterministic_action`` are CategoricalPolicy's own (they
    reduce over the action dim only, so a leading member dim passes through); :meth:`sample_members`
    draws each member's Gumbel noise from that member's generator.
    """

    def __init__(self, policies: Sequence[CategoricalPolicy]) -> None:
        nn.Module.__init__(self)  # not CategoricalPolicy.__init__: its mlp would draw from the global RNG
        self.num_actions = policies[0].num_actions
        # the members' batched MLP in place of the MLP: the same call, a leading member dim
        self.logits_net = EnsembleMLP.from_mlps([policy.logits_net for policy in policies])  # type: ignore[assignment]
        self.noise = MemberNoise()

    def sample_members(self, obs: Tensor, generators: Sequence[torch.Generator]) -> tuple[Tensor, Tensor]:
        """``(actions (P, B), log_probs (P, B))``: CategoricalPolicy.sample, member i's noise drawn from
        generator i."""
        log_probs = log_softmax_actions_first(self(obs))  # (A, P, B)
        # (P, B, A): member i's (B, A), the draw of CategoricalPolicy.sample in a single run
        uniform = self.noise.draw(generators, (obs.shape[1], self.num_actions), log_probs, normal=False)
        gumbel = -torch.log(-torch.log(uniform))  # (P, B, A)
        # max(...).indices, not argmax: the same index, but argmax over a short leading dim is ~10x slower
        action = (log_probs + gumbel.movedim(-1, 0)).max(dim=0).indices  # (P, B)
        log_prob = log_probs.gather(0, action.unsqueeze(0)).squeeze(0)  # (P, B)
        return action, log_prob


class MemberGaussianPolicy(GaussianPolicy):
    """P diagonal Gaussian policies as one module: ``mean_net`` is an EnsembleMLP, ``log_std`` is
    ``(P, 1, action_dim)``; observations ``(P, B, obs_dim)``. The rest is GaussianPolicy's own."""

    def __init__(self, policies: Sequence[GaussianPolicy]) -> None:
        nn.Module.__init__(self)  # not GaussianPolicy.__init__: its mlp would draw from the global RNG
        self.action_dim = policies[0].action_dim
        # the members' batched MLP in place of the MLP: the same call, a leading member dim
        self.mean_net = EnsembleMLP.from_mlps([policy.mean_net for policy in policies])  # type: ignore[assignment]
        log_std = torch.stack([policy.log_std.detach() for policy in policies]).unsqueeze(1)
        self.log_std = nn.Parameter(log_std)  # (P, 1, action_dim)
        self.noise = MemberNoise()

    def sample_members(self, obs: Tensor, generators: Sequence[torch.Generator]) -> tuple[Tensor, Tensor]:
        """``(actions (P, B, act_dim), log_probs (P, B))``: GaussianPolicy.sample, member i's noise from
        generator i."""
        mean, log_std = self(obs)  # (P, B, act_dim) each
        # (P, B, act_dim): member i's (B, act_dim), the draw of GaussianPolicy.sample in a single run
        noise = self.noise.draw(generators, tuple(mean.shape[1:]), mean, normal=True)
        action = mean + log_std.exp() * noise
        log_prob = (-0.5 * noise.square() - log_std - LOG_SQRT_2PI).sum(dim=-1)
        return action, log_prob


class MemberValueNet(ValueNet):
    """P value networks as one module: observations ``(P, B, obs_dim)`` to values ``(P, B)``."""

    def __init__(self, values: Sequence[ValueNet]) -> None:
        nn.Module.__init__(self)  # not ValueNet.__init__: its mlp would draw from the global RNG
        # the members' batched MLP in place of the MLP: the same call, a leading member dim
        self.value_net = EnsembleMLP.from_mlps([value.value_net for value in values])  # type: ignore[assignment]


class MemberActor:
    """The deterministic policies of P members as one actor, as the Evaluator calls it: ``act`` of
    ``(P * E, obs_dim)`` rows gives member i's actions for its block of E rows, in one batched forward."""

    def __init__(self, policy: MemberCategoricalPolicy | MemberGaussianPolicy, num_members: int) -> None:
        self.policy = policy
        self.num_members = num_members

    @classmethod
    def of(cls, policies: Sequence[CategoricalPolicy | GaussianPolicy]) -> MemberActor:
        """The actor of copies of ``policies`` (all categorical, or all Gaussian, of one architecture)."""
        if all(isinstance(policy, CategoricalPolicy) for policy in policies):
            # ignored below: all CategoricalPolicy (checked on the line above)
            return cls(MemberCategoricalPolicy(policies), len(policies))  # type: ignore[arg-type]
        return cls(MemberGaussianPolicy(policies), len(policies))  # type: ignore[arg-type]

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        actions = self.policy.deterministic_action(obs.view(self.num_members, -1, *obs.shape[1:]))
        return actions.flatten(0, 1)  # (P * E, ...)
