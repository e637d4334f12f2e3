"""A member of a vectorized population read back as its single run's tensors: :class:`SingleLayout` maps
the member's rows of a flat ``(rows, D)`` parameter buffer (or of an Adam moment) to the single run's
parameters, in their order and layout, for ``member_agent_state`` (a member as an ordinary checkpoint);
:func:`ensemble_linear_weights` names the weights stored transposed to an ``nn.Linear``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from phalanx.envs.core import Tensor
from phalanx.nets import EnsembleLinear


def ensemble_linear_weights(*modules: nn.Module) -> set[int]:
    """Ids of the EnsembleLinear weights in ``modules`` (``(P, in, out)``: an nn.Linear weight transposed)."""
    return {
        id(layer.weight)
        for module in modules
        for layer in module.modules()
        if isinstance(layer, EnsembleLinear)
    }


class SingleLayout:
    """Where each parameter of a single run sits in its member's rows of a flat ``(rows, D)`` buffer
    (:func:`~phalanx.optim.flatten_parameters`), to read a member back as its single run's tensors.

    ``member_parameters`` are the member-batched parameters in the buffer's order, ``rows_per_member`` rows
    per member (K for an ensemble of K critics); ``single_parameters`` the single run's, in the same order;
    ``transposed`` the ids of member weights whose single counterpart is an ``nn.Linear`` weight.
    """

    def __init__(
        self,
        member_parameters: Sequence[nn.Parameter],
        single_parameters: Sequence[torch.Tensor],
        transposed: set[int],
        rows_per_member: int = 1,
    ) -> None:
        self.rows_per_member = rows_per_member
        self.entries: list[tuple[int, int, tuple[int, ...], tuple[int, ...], bool]] = []
        start = 0
        for member_parameter, single_parameter in zip(member_parameters, single_parameters, strict=True):
            size = member_parameter[0].numel()
            if size * rows_per_member != single_parameter.numel():
                raise AssertionError(
                    f"member parameter {tuple(member_parameter.shape)} vs {tuple(single_parameter.shape)}"
                )
            member_shape, single_shape = tuple(member_parameter.shape[1:]), tuple(single_parameter.shape)
            transpose = id(member_parameter) in transposed
            self.entries.append((start, start + size, member_shape, single_shape, transpose))
            start += size

    def tensors(self, rows: Tensor) -> list[Tensor]:
        """A member's rows of the buffer (or of an Adam moment), ``(rows_per_member, D)`` or ``(D,)``, as
        the single run's tensors, in their order and layout."""
        rows = rows.reshape(self.rows_per_member, -1)
        tensors = []
        for start, end, member_shape, single_shape, transpose in self.entries:
            tensor = rows[:, start:end].reshape(-1, *member_shape)
            tensors.append((tensor.transpose(-2, -1) if transpose else tensor).reshape(single_shape))
        return tensors

    def flat(self, rows: Tensor) -> Tensor:
        """A member's rows laid out as its single run's flat optimiser buffer (``make_adam``'s)."""
        return torch.cat([tensor.reshape(-1) for tensor in self.tensors(rows)])
