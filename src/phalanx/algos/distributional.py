"""The categorical (C51) critic of the ensemble-critic algorithms: its support, projection and loss.

With ``critic_atoms`` set (:class:`~phalanx.algos.ddpg.EnsembleCriticConfig`), each of the K critics
outputs logits over a fixed support of atoms ``linspace(v_min, v_max, atoms)`` (Bellemare et al.,
2017, as FastTD3 uses it: Seo et al., 2025). The TD target moves each target critic's distribution at
the next action to ``r + discount * z`` (minus SAC's entropy term, which shifts it as the reward
does) and projects it back onto the support (:func:`project_distribution`); the K projected targets
combine into one (:func:`reduce_distributions`: the one of smallest expected value, FastTD3's clipped
double Q, or their mean); each critic's loss is the cross-entropy to it (:func:`categorical_td_loss`).

Every function takes any leading dimensions: ``(K, B, atoms)`` for one algorithm, ``(P, K, B, atoms)``
for P members of a vectorized population.
"""

from __future__ import annotations

from typing import Any

import torch

from phalanx.config import check, is_int
from phalanx.errors import ConfigError

Tensor = torch.Tensor
REDUCTIONS = ("min", "mean")
"""How the K critics' projected targets combine (``target_reduction``; REDQ's random subset is refused)."""


def validate_categorical_critic(config: Any) -> None:
    """``config.critic_atoms`` (None, or an integer >= 2) and, with it, the range ``[v_min, v_max]`` of its
    atoms and a target reduction of distributions; without it, no range. A ConfigError says what to set."""
    atoms, v_min, v_max = config.critic_atoms, config.v_min, config.v_max
    if atoms is None:
        for name, value in (("v_min", v_min), ("v_max", v_max)):
            check(
                value is None,
                name,
                value,
                "None without critic_atoms (v_min and v_max are the range of a distributional critic's "
                "atoms); set critic_atoms too (e.g. 101), or drop v_min and v_max",
            )
        return
    check(is_int(atoms) and atoms >= 2, "critic_atoms", atoms, "an integer >= 2 (e.g. 101), or None")
    if v_min is None or v_max is None:
        gamma = config.gamma
        bound = (
            f"r_max / (1 - gamma) = {1 / (1 - gamma):g} * r_max at gamma = {gamma:g}, e.g. "
            f"`v_min: {-2.5 / (1 - gamma):g}, v_max: {2.5 / (1 - gamma):g}` for rewards within +-2.5"
            if gamma < 1
            else "r_max times the longest episode at gamma = 1"
        )
        raise ConfigError(
            f"critic_atoms = {atoms} needs v_min and v_max, the range of returns its atoms cover (got "
            f"v_min = {v_min}, v_max = {v_max}). A return of rewards within [-r_max, r_max] lies within "
            f"+-{bound}. Set v_min and v_max to that range for your env's reward scale, with --v-min and "
            "--v-max or in the config file's hyperparameters; returns beyond them are clipped to the ends."
        )
    check(v_min < v_max, "v_max", v_max, f"a number above v_min = {v_min} (the atoms span [v_min, v_max])")
    check(
        config.target_reduction in REDUCTIONS,
        "target_reduction",
        config.target_reduction,
        f"one of {REDUCTIONS} with critic_atoms (the target distribution of smallest expected value, or "
        "the mean distribution); set target_reduction to min, or drop critic_atoms to keep redq",
    )


def value_support(hp: Any, like: Tensor) -> Tensor:
    """The atoms' values ``linspace(hp.v_min, hp.v_max, hp.critic_atoms)``, on ``like``'s device and dtype."""
    return torch.linspace(hp.v_min, hp.v_max, hp.critic_atoms, device=like.device, dtype=like.dtype)


def expected_values(probabilities: Tensor, support: Tensor) -> Tensor:
    """The means ``sum_i p_i z_i`` of distributions ``(..., atoms)`` over ``support`` ``(atoms,)``."""
    return (probabilities * support).sum(dim=-1)


def project_distribution(
    probabilities: Tensor, support: Tensor, rewards: Tensor, discounts: Tensor
) -> Tensor:
    """The distribution of ``rewards + discounts * Z`` for ``Z`` distributed as ``probabilities``
    ``(..., atoms)`` over ``support``, projected onto ``support`` (C51's projection): each atom's moved
    value, clamped to ``[v_min, v_max]``, splits its mass between the two atoms around it in proportion to
    its closeness to each. ``rewards`` and ``discounts`` broadcast against ``probabilities[..., 0]``.
    Probability mass is conserved; a value on an atom keeps all of its mass there."""
    atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    moved = rewards.unsqueeze(-1) + discounts.unsqueeze(-1) * support  # (..., atoms)
    position = ((moved - v_min) / ((v_max - v_min) / (atoms - 1))).clamp(0, atoms - 1)
    lower = position.floor().clamp(max=atoms - 2)  # the atom below, so that lower + 1 is one too
    upper_share = position - lower  # in [0, 1]: 1 on the top atom
    lower_index = lower.long().expand_as(probabilities)
    projected = torch.zeros_like(probabilities).scatter_add(
        -1, lower_index, probabilities * (1 - upper_share)
    )
    return projected.scatter_add(-1, lower_index + 1, probabilities * upper_share)


def reduce_distributions(distributions: Tensor, support: Tensor, reduction: str) -> Tensor:
    """One target distribution per sample from K critics' ``(..., K, B, atoms)``: ``(..., B, atoms)``.
    ``min``: per sample, the distribution of smallest expected value (clipped double Q over
    distributions, FastTD3's); ``mean``: their average."""
    if reduction == "mean":
        return distributions.mean(dim=-3)
    assert reduction == "min", "validate_categorical_critic allows REDUCTIONS only"
    smallest = expected_values(distributions, support).argmin(dim=-2, keepdim=True)  # (..., 1, B)
    index = smallest.unsqueeze(-1).expand(*smallest.shape, distributions.shape[-1])
    return distributions.gather(-3, index).squeeze(-3)


def categorical_td_loss(logits: Tensor, targets: Tensor, support: Tensor) -> tuple[Tensor, Tensor]:
    """The critics' loss towards the target distributions ``targets`` ``(..., B, atoms)``: the
    cross-entropy of each critic's ``logits`` ``(..., K, B, atoms)`` summed over the K critics and averaged
    over the batch (``td_loss``'s convention; ``(P,)`` for P members), and the critics' mean expected Q."""
    log_probabilities = logits.log_softmax(dim=-1)
    cross_entropy = -(targets.unsqueeze(-3) * log_probabilities).sum(dim=-1)  # (..., K, B)
    q_mean = expected_values(log_probabilities.detach().exp(), support).mean(dim=(-2, -1))
    return cross_entropy.mean(dim=-1).sum(dim=-1), q_mean
