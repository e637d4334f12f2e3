"""Optimisers over one flat parameter buffer, and gradient-norm clipping.

With the small networks of most RL tasks an optimiser step is per-tensor overhead, not arithmetic:
torch's fused Adam over the 12 tensors of PPO's two [32, 32] MLPs costs ~60 us on a CPU, gradient
clipping ~60 us and ``zero_grad`` ~20 us, about a quarter of a whole PPO gradient step. So the
optimisers here first move the parameters they are given into one contiguous buffer
(:class:`FlatParameters`): each module parameter stays the same ``nn.Parameter`` object, now a view
of that buffer, and its gradient a view of one gradient buffer, which backward accumulates into in
place. The optimiser then steps one tensor, clipping takes one norm, zeroing is one fill, and a
data-parallel all-reduce is one call. The update rule is torch's, element for element.

Rules that keep the views intact: build the optimiser after the modules are on their device (moving
a module afterwards gives it new tensors the optimiser does not hold), load weights with
``load_state_dict`` (it copies in place), and copy a trained model through its state dicts
(``copy.deepcopy`` of a module gives it new tensors that are no longer views). A gradient that
something else replaced (``module.zero_grad()`` sets them to None; backward then allocates new ones)
is copied back into the buffer at the next step, so no gradient is lost.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

Tensor = torch.Tensor


class FlatParameters:
    """``parameters`` re-homed as views of one flat buffer (:attr:`parameter`), gradients of another."""

    def __init__(self, parameters: list[nn.Parameter]) -> None:
        self.parameters = list(parameters)
        if not self.parameters:
            raise ValueError("FlatParameters: no parameters given; pass the module parameters to optimise.")
        first = self.parameters[0]
        for index, p in enumerate(self.parameters):
            if p.device != first.device or p.dtype != first.dtype:
                raise ValueError(
                    f"FlatParameters: parameter {index} is {p.dtype} on {p.device}, parameter 0 is "
                    f"{first.dtype} on {first.device}; one flat buffer needs one dtype and device. Move "
                    "the modules to one device and dtype before building the optimiser."
                )
        if len({id(p) for p in self.parameters}) != len(self.parameters):
            raise ValueError("FlatParameters: a parameter is given twice; pass each parameter once.")
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.parameters])
        gradient = torch.zeros_like(flat)
        self.parameter = nn.Parameter(flat)
        self.parameter.grad = gradient
        self.gradient_views: list[Tensor] = []
        offset = 0
        for p in self.parameters:
            size = p.numel()
            p.data = flat[offset : offset + size].view_as(p)
            view = gradient[offset : offset + size].view_as(p)
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
            self.gradient_views.append(view)
            offset += size

    def zero_grad(self) -> None:
        self.reattach()
        self.parameter.grad.zero_()

    def reattach(self) -> None:
        """Put back any gradient that is no longer a view of the buffer (copying its values in)."""
        for p, view in zip(self.parameters, self.gradient_views, strict=True):
            if p.grad is not view:
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
                p.grad = view


class _FlatOptimizerMixin:
    """A torch optimiser over one :class:`FlatParameters` buffer; ``zero_grad`` fills it with zeros
    (never None: the module gradients must stay views of it)."""

    flat: FlatParameters

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.flat.zero_grad()

    def step(self, closure: Any = None) -> Any:
        self.flat.reattach()
        return super().step(closure)  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also takes the state of torch's optimiser over the same parameters one by one (checkpoints
        written before the optimisers were flat): per-parameter tensors are concatenated in order."""
        groups = state_dict["param_groups"]
        count = len(self.flat.parameters)
        if len(groups) == 1 and len(groups[0]["params"]) == count > 1:
            per_parameter = [state_dict["state"].get(index, {}) for index in groups[0]["params"]]
            flat_state: dict[str, Any] = {}
            for key, value in per_parameter[0].items():  # the step count is shared; the rest per element
                if key != "step":
                    value = torch.cat([state[key].reshape(-1) for state in per_parameter])
                flat_state[key] = value
            state_dict = {
                "state": {0: flat_state} if flat_state else {},
                "param_groups": [{**groups[0], "params": [0]}],
            }
        super().load_state_dict(state_dict)  # type: ignore[misc]


class FlatAdam(_FlatOptimizerMixin, torch.optim.Adam):
    """``torch.optim.Adam`` on a flat buffer of ``parameters``, with the fused kernel where this torch
    has it for the device (CPU: torch >= 2.4)."""

    def __init__(self, parameters: list[nn.Parameter], **kwargs: Any) -> None:
        self.flat = FlatParameters(parameters)
        try:
            torch.optim.Adam.__init__(self, [self.flat.parameter], fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):
            torch.optim.Adam.__init__(self, [self.flat.parameter], **kwargs)


class FlatRMSprop(_FlatOptimizerMixin, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` on a flat buffer of ``parameters``."""

    def __init__(self, parameters: list[nn.Parameter], **kwargs: Any) -> None:
        self.flat = FlatParameters(parameters)
        torch.optim.RMSprop.__init__(self, [self.flat.parameter], **kwargs)


def make_adam(parameters: list[nn.Parameter], **kwargs: Any) -> torch.optim.Optimizer:
    """Adam over a flat buffer of ``parameters`` (see the module docstring)."""
    return FlatAdam(parameters, **kwargs)


def gradients(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The gradients ``optimizer`` steps on (one tensor for a flat optimiser)."""
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def clip_grad_norm(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale ``grads`` in place so that their global 2-norm is at most ``max_norm``; the norm before.

    As ``torch.nn.utils.clip_grad_norm_`` (scale ``max_norm / (norm + 1e-6)``, capped at 1), without
    its per-call overhead, which is most of its cost for a single flat gradient.
    """
    if len(grads) == 1:
        norm = torch.linalg.vector_norm(grads[0])
    else:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)
    return norm
