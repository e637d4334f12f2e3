"""The compiled gradient step: the loss, its gradient over a flat optimiser's parameter buffer, clipping and
the optimiser's update as one graph (:class:`GradientStep`), for every algorithm's ``compile()``. The eager
step stays the reference, and the compiled one computes the same update (tests/test_compiled_update.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from phalanx.compiling import compiled_method
from phalanx.optim import (
    FlatAdam,
    FlatRAdam,
    FlatRMSprop,
    VectorizedAdam,
    adam_update,
    rmsprop_update,
)

Tensor = torch.Tensor


FlatOptimizer = FlatAdam | FlatRAdam | FlatRMSprop | VectorizedAdam
Loss = Callable[..., tuple[Tensor, Any]]
"""``loss(*inputs) -> (loss, aux)``: a scalar loss (or P members' ``(P,)`` losses) computed with the
modules, and whatever tensors the caller wants back (metrics)."""


class _LossModule(nn.Module):
    """``loss`` as the forward of a module holding ``modules``, so that ``torch.func.functional_call``
    can run it with their parameters swapped for views of the differentiated flat buffer."""

    def __init__(self, modules: Sequence[nn.Module], loss: Loss) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)
        self.loss = loss

    def forward(self, *inputs: Any) -> tuple[Tensor, Any]:
        return self.loss(*inputs)


class GradientStep:
    """One gradient step of a flat optimiser as one function of tensors: the loss, its gradient with
    respect to the flat parameter buffer, gradient-norm clipping and the optimiser's update, in place.

    ``loss(*inputs) -> (loss, aux)`` computes with ``modules`` as eager code does (``policy(obs)``); the
    step runs it with the modules' parameters swapped for views of the flat buffer
    (``torch.func.functional_call``) and differentiates it over that buffer
    (``torch.func.grad_and_value``), so no ``.grad`` bookkeeping is left: :meth:`compile` makes the whole
    step one graph (LeanRL's technique, as one graph per gradient step). A P-member ``(P,)`` loss is
    differentiated through its sum, which gives each member the gradient of its own loss.

    The step reads and writes the optimiser's own tensors: its flat parameters (the modules' parameters
    are views of them) and torch's ``exp_avg``, ``exp_avg_sq``, ``step`` (RMSprop: ``square_avg``,
    ``step``), or :class:`VectorizedAdam`'s. So the optimiser's state dict, checkpoints and an eager
    ``optimizer.step()`` continue from it, and a run resumes in either mode. The learning rate is a tensor
    input (a flat torch optimiser's ``param_groups[0]["lr"]``, copied into a device tensor when it
    changes; :class:`VectorizedAdam`: the ``(P,)`` tensor passed to the call), so annealing it compiles
    nothing. ``max_grad_norm``: None (no clipping), a float (the global norm, as :func:`clip_grad_norm`)
    or, for :class:`VectorizedAdam`, a ``(P,)`` tensor read at every call (per member, as
    :func:`clip_member_grad_norm`; +inf: not clipped). The update rules are :func:`adam_update` (RAdam
    with ``rectified``; AdamW's decoupled weight decay where the Adam has it) and :func:`rmsprop_update`,
    torch's formulas element for element.
    """

    def __init__(
        self,
        optimizer: FlatOptimizer,
        modules: Sequence[nn.Module],
        loss: Loss,
        max_grad_norm: float | Tensor | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.module = _LossModule(modules, loss)
        parameters = self._parameters()
        self.views = _parameter_views(self.module, parameters)
        self.state_names, self.rule = _update_rule(optimizer)
        self.learning_rate = torch.zeros((), dtype=torch.float64, device=parameters.device)
        self.learning_rate_value: float | None = None
        self.function: Callable[..., tuple[Tensor, Any]] = self.step
        self.is_compiled = False

    def compile(self) -> None:
        """Run the step as one compiled graph from now on (idempotent)."""
        if not self.is_compiled:
            self.function = compiled_method(self.step)
            self.is_compiled = True

    def __call__(self, *inputs: Any, learning_rate: Tensor | None = None) -> tuple[Tensor, Any]:
        """One step on ``loss(*inputs)``; returns ``(loss, aux)``, detached. ``learning_rate``: the
        ``(P,)`` float64 learning rates of :class:`VectorizedAdam`'s members (a torch optimiser's comes
        from its param group)."""
        if learning_rate is None:
            learning_rate = self._group_learning_rate()
        return self.function(self._parameters(), self._state(), learning_rate, self.max_grad_norm, *inputs)

    def step(
        self,
        parameters: Tensor,
        state: tuple[Tensor, ...],
        learning_rate: Tensor,
        max_grad_norm: float | Tensor | None,
        *inputs: Any,
    ) -> tuple[Tensor, Any]:
        """The step as a pure function of its tensors (what :meth:`compile` compiles)."""
        gradient, (_, (loss, aux)) = torch.func.grad_and_value(self._summed_loss, has_aux=True)(
            parameters, inputs
        )
        if max_grad_norm is not None:
            if gradient.dim() == 2:  # per member, as clip_member_grad_norm
                norm = torch.linalg.vector_norm(gradient, dim=1, keepdim=True)  # (P, 1)
                # ignored below: a tensor here: the per-member clip (a float for one run)
                max_grad_norm = max_grad_norm.to(gradient.dtype).unsqueeze(1)  # type: ignore[union-attr]
            else:  # the global norm, as clip_grad_norm
                norm = torch.linalg.vector_norm(gradient)
            gradient = gradient * (max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        self.rule(parameters, gradient, *state, learning_rate)
        return loss, aux

    def _summed_loss(self, parameters: Tensor, inputs: tuple[Any, ...]) -> tuple[Tensor, tuple[Tensor, Any]]:
        swapped = {
            name: parameters.narrow(-1, start, size).view(shape) for name, start, size, shape in self.views
        }
        loss, aux = torch.func.functional_call(self.module, swapped, inputs)
        return loss.sum(), (loss.detach(), aux)

    def _parameters(self) -> Tensor:
        """The flat parameter buffer (detached: the step writes it in place, outside autograd)."""
        if isinstance(self.optimizer, VectorizedAdam):
            return self.optimizer.parameters
        return self.optimizer.flat.parameter.detach()

    def _state(self) -> tuple[Tensor, ...]:
        """The optimiser's state tensors, fetched at every call (``load_state_dict`` replaces torch's);
        a torch optimiser's state is created here before its first step, as its own step would."""
        optimizer = self.optimizer
        if isinstance(optimizer, VectorizedAdam):
            return tuple(getattr(optimizer, name) for name in self.state_names)
        parameter = optimizer.flat.parameter
        state = optimizer.state[parameter]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=parameter.device)
            for name in self.state_names[:-1]:  # the moments, as zeros_like(param)
                state[name] = torch.zeros_like(parameter, memory_format=torch.preserve_format).detach()
        elif state["step"].device != parameter.device:  # torch keeps a non-fused step on the CPU
            state["step"] = state["step"].to(parameter.device)
        return tuple(state[name] for name in self.state_names)

    def _group_learning_rate(self) -> Tensor:
        # ignored below: an optimiser with param_groups (a flat Adam)
        value = float(self.optimizer.param_groups[0]["lr"])  # type: ignore[union-attr]
        if value != self.learning_rate_value:
            self.learning_rate.fill_(value)
            self.learning_rate_value = value
        return self.learning_rate


def _parameter_views(
    module: nn.Module, parameters: Tensor
) -> list[tuple[str, int | torch.SymInt, int, torch.Size]]:
    """Where each parameter of ``module`` sits in the flat buffer ``parameters`` (``(D,)``, or ``(P, D)``
    with each member parameter a range of columns): ``(name, start, size, shape)``, so that
    ``parameters.narrow(-1, start, size).view(shape)`` is that parameter. Every column must belong to one."""
    rows = parameters.numel() // parameters.shape[-1]
    storage = parameters.untyped_storage().data_ptr()
    views = []
    for name, parameter in module.named_parameters():
        if parameter.untyped_storage().data_ptr() != storage:
            continue  # not optimised by this optimiser: the loss uses it as it is
        start, size = parameter.storage_offset() - parameters.storage_offset(), parameter.numel() // rows
        view = parameters.narrow(-1, start, size).view(parameter.shape)
        if view.data_ptr() != parameter.data_ptr() or view.stride() != parameter.stride():
            raise ValueError(
                f"GradientStep: parameter {name} {tuple(parameter.shape)} shares the optimiser's flat buffer "
                "but is not a range of its last dim; build the optimiser over the modules' parameters and "
                "do not move the modules afterwards."
            )
        views.append((name, start, size, parameter.shape))
    covered = sum(size for _, _, size, _ in views)
    if covered != parameters.shape[-1]:
        raise ValueError(
            f"GradientStep: the modules' parameters cover {covered} of the optimiser's "
            f"{parameters.shape[-1]} flat parameters; pass every module whose parameters the optimiser steps."
        )
    return views


def _update_rule(optimizer: FlatOptimizer) -> tuple[tuple[str, ...], Callable[..., None]]:
    """The names of ``optimizer``'s state tensors and its update rule as a function of
    ``(parameters, gradients, *state, learning_rate)``; a ValueError for an option the rules lack."""
    if isinstance(optimizer, VectorizedAdam):
        return ("exp_avg", "exp_avg_sq", "steps"), functools.partial(
            adam_update, betas=optimizer.betas, eps=optimizer.eps, rectified=optimizer.rectified
        )
    if len(optimizer.param_groups) != 1:
        raise ValueError(
            f"GradientStep: {type(optimizer).__name__} has {len(optimizer.param_groups)} "
            "parameter groups; a flat optimiser has one."
        )
    group = optimizer.param_groups[0]
    if isinstance(optimizer, FlatAdam):
        # AdamW (make_adam's weight_decay) is in the rule; Adam's L2 weight decay is not
        decoupled = group.get("decoupled_weight_decay", False)
        unsupported = {"amsgrad": False, "maximize": False, **({} if decoupled else {"weight_decay": 0})}
        rule: tuple[tuple[str, ...], Callable[..., None]] = (
            ("exp_avg", "exp_avg_sq", "step"),
            functools.partial(
                adam_update,
                betas=group["betas"],
                eps=group["eps"],
                weight_decay=group["weight_decay"] if decoupled else 0.0,
            ),
        )
    elif isinstance(optimizer, FlatRAdam):
        unsupported = {"weight_decay": 0, "maximize": False, "decoupled_weight_decay": False}
        rule = (
            ("exp_avg", "exp_avg_sq", "step"),
            functools.partial(adam_update, betas=group["betas"], eps=group["eps"], rectified=True),
        )
    elif isinstance(optimizer, FlatRMSprop):
        unsupported = {"momentum": 0, "centered": False, "weight_decay": 0, "maximize": False}
        rule = (
            ("square_avg", "step"),
            functools.partial(rmsprop_update, alpha=group["alpha"], eps=group["eps"]),
        )
    else:
        raise ValueError(
            "GradientStep steps a FlatAdam, FlatRAdam, FlatRMSprop or VectorizedAdam, not a "
            f"{type(optimizer).__name__}; build the optimiser with phalanx.optim."
        )
    options = {name: group.get(name, default) for name, default in unsupported.items()}
    if options != unsupported:
        raise ValueError(
            f"GradientStep: {type(optimizer).__name__} has options {options}; its update rule is torch's "
            f"without them ({unsupported}). Build the optimiser with those values, or step it eagerly."
        )
    return rule
