"""Optimisers over one flat parameter buffer, and gradient-norm clipping (their compiled step:
:mod:`phalanx.gradient_step`).

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

P members of a vectorized population (networks whose parameters are ``(P, ...)``) get the same
treatment with a member dimension: :func:`flatten_parameters` makes their parameters views of one
``(P, D)`` buffer, :class:`VectorizedAdam` steps it with a learning rate per member, and
:func:`clip_member_grad_norm` clips each member's gradient on its own.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

Tensor = torch.Tensor


class FlatParameters:
    """``parameters`` re-homed as views of one flat buffer (:attr:`parameter`), gradients of another."""

    def __init__(self, parameters: Sequence[Tensor]) -> None:
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
        assert self.parameter.grad is not None, "reattach() gives the flat parameter its gradient"
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
        # ignored below: torch's Optimizer.step, which the hook wrapper hides from mypy
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
        # ignored below: as step: torch's Optimizer.load_state_dict
        super().load_state_dict(state_dict)  # type: ignore[misc]


class FlatAdam(_FlatOptimizerMixin, torch.optim.Adam):
    """``torch.optim.Adam`` on a flat buffer of ``parameters``, with the fused kernel where this torch
    has it for the device (CPU: torch >= 2.4)."""

    def __init__(self, parameters: Sequence[Tensor], **kwargs: Any) -> None:
        self.flat = FlatParameters(parameters)
        try:
            torch.optim.Adam.__init__(self, [self.flat.parameter], fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):
            torch.optim.Adam.__init__(self, [self.flat.parameter], **kwargs)

    def step(self, closure: Any = None) -> Any:
        """torch's Adam step. Its usual case (the fused kernel, state made, no closure, no step hooks) is
        the two calls torch's fused path makes, ``step += 1`` and ``torch._fused_adam_`` (AdamW's decoupled
        weight decay: ``torch._fused_adamw_``) with the group's values, made here directly: the same kernel
        on the same tensors, so the same bits, without the ~130 us of Python (hook dispatch, profiler
        scope, grouping by device) torch spends around them on every call, a tenth of a small network's
        gradient step. Every other case is torch's own step."""
        group = self.param_groups[0]
        state = self.state[self.flat.parameter]
        if (
            closure is not None
            or not state
            or not group.get("fused")
            or group["amsgrad"]
            or self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or torch_optimizer._global_optimizer_pre_hooks
            or torch_optimizer._global_optimizer_post_hooks
            or getattr(self, "grad_scale", None) is not None  # set by torch.amp.GradScaler
        ):
            return self.torch_step(closure)
        self.flat.reattach()
        parameter = self.flat.parameter
        assert parameter.grad is not None, "reattach() gives the flat parameter its gradient"
        beta1, beta2 = group["betas"]
        # AdamW's decoupled weight decay is the other kernel, as torch picks it (a group key since torch 2.6)
        kernel = torch._fused_adamw_ if group.get("decoupled_weight_decay", False) else torch._fused_adam_
        with torch.no_grad():
            state["step"] += 1
            kernel(
                [parameter],
                [parameter.grad],
                [state["exp_avg"]],
                [state["exp_avg_sq"]],
                [],
                [state["step"]],
                amsgrad=False,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                grad_scale=None,
                found_inf=None,
            )
        return None

    # torch.optim.Optimizer wraps the step of its subclasses in its hook and profiler scope unless the step
    # is marked as wrapped already: this one calls the wrapped torch step whenever a hook is registered.
    # ignored below: torch's marker attribute on a function
    step.hooked = True  # type: ignore[attr-defined]

    @torch.optim.Optimizer.profile_hook_step
    def torch_step(self, closure: Any = None) -> Any:
        """torch's Adam step on the flat buffer, in torch's hook and profiler scope (the hooks once: the
        inner ``Adam.step``, which torch wraps too once it has built a plain Adam, is taken unwrapped)."""
        self.flat.reattach()
        adam_step = torch.optim.Adam.step
        if getattr(adam_step, "hooked", False):
            # ignored below: functools.wraps' attribute
            adam_step = adam_step.__wrapped__  # type: ignore[attr-defined]
        return adam_step(self, closure)


class FlatRMSprop(_FlatOptimizerMixin, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` on a flat buffer of ``parameters``."""

    def __init__(self, parameters: Sequence[Tensor], **kwargs: Any) -> None:
        self.flat = FlatParameters(parameters)
        torch.optim.RMSprop.__init__(self, [self.flat.parameter], **kwargs)


class FlatRAdam(_FlatOptimizerMixin, torch.optim.RAdam):
    """``torch.optim.RAdam`` (Adam with the variance of its early steps rectified) on a flat buffer of
    ``parameters``: PQN's optimiser, which has no replay warm-up to steady Adam's first steps."""

    def __init__(self, parameters: list[nn.Parameter], **kwargs: Any) -> None:
        self.flat = FlatParameters(parameters)
        torch.optim.RAdam.__init__(self, [self.flat.parameter], **kwargs)


class _Building:
    optimizers = True


@contextlib.contextmanager
def without_optimizers() -> Iterator[None]:
    """Algorithms built inside hold no optimisers (None where one would be): a deployed policy (``phalanx
    eval``, ``export``, ``load_agent``) acts and never learns, and building a torch optimiser imports
    torch's compiler, a second of start-up."""
    before, _Building.optimizers = _Building.optimizers, False
    try:
        yield
    finally:
        _Building.optimizers = before


DECOUPLED_WEIGHT_DECAY = "decoupled_weight_decay" in inspect.signature(torch.optim.Adam).parameters
"""Whether this torch's Adam takes ``decoupled_weight_decay`` (AdamW as a flag of Adam: torch >= 2.6)."""


def make_adam(
    parameters: Sequence[Tensor], *, weight_decay: float = 0.0, **kwargs: Any
) -> torch.optim.Optimizer | None:
    """Adam over a flat buffer of ``parameters`` (see the module docstring); None inside
    :func:`without_optimizers`.

    ``weight_decay``: AdamW's decoupled weight decay (Loshchilov & Hutter), torch's
    ``Adam(decoupled_weight_decay=True)``: each step first shrinks the parameters by
    ``lr * weight_decay`` of themselves. 0 builds plain Adam, the optimiser of every run before it.
    Adam's other weight decay, an L2 term in the gradient, is not offered (no algorithm here uses it)."""
    if weight_decay:
        if not DECOUPLED_WEIGHT_DECAY:
            raise ValueError(
                f"make_adam: weight_decay = {weight_decay} needs torch >= 2.6 (Adam's "
                f"decoupled_weight_decay), this is torch {torch.__version__}. Upgrade torch or set "
                "weight_decay to 0."
            )
        kwargs.update(weight_decay=weight_decay, decoupled_weight_decay=True)
    return FlatAdam(parameters, **kwargs) if _Building.optimizers else None


def make_rmsprop(parameters: Sequence[Tensor], **kwargs: Any) -> torch.optim.Optimizer | None:
    """RMSprop over a flat buffer of ``parameters``; None inside :func:`without_optimizers`."""
    return FlatRMSprop(parameters, **kwargs) if _Building.optimizers else None


def make_radam(parameters: list[nn.Parameter], **kwargs: Any) -> torch.optim.Optimizer | None:
    """RAdam over a flat buffer of ``parameters``; None inside :func:`without_optimizers`."""
    return FlatRAdam(parameters, **kwargs) if _Building.optimizers else None


def load_adam_state(
    optimizer: torch.optim.Optimizer, learning_rate: float, step: float, exp_avg: Tensor, exp_avg_sq: Tensor
) -> None:
    """Set a single run's flat Adam (:func:`make_adam`) to ``learning_rate``, ``step`` and the moments
    (laid out as its flat buffer): a vectorized population's member handed over as an ordinary run."""
    state = optimizer.state_dict()
    state["param_groups"][0]["lr"] = learning_rate
    if step > 0:
        state["state"] = {0: {"step": torch.tensor(step), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}}
    optimizer.load_state_dict(state)


def linear_decay(progress: float) -> float:
    """The factor of an annealed learning rate (``anneal_lr``): 1 at the start of the budget, falling
    linearly to 0 at ``progress`` 1 and staying there."""
    return max(1.0 - progress, 0.0)


def anneal_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float, progress: float) -> None:
    """Every param group of ``optimizer`` at ``learning_rate`` times :func:`linear_decay` of ``progress``."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate * linear_decay(progress)


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


def clip_member_grad_norm(gradients: Tensor, max_norm: Tensor) -> None:
    """:func:`clip_grad_norm` for each member's row of ``(P, D)`` gradients, with its own ``(P,)``
    ``max_norm`` (+inf: no clipping for that member)."""
    norms = torch.linalg.vector_norm(gradients, dim=1)  # (P,)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    gradients.mul_(scale.unsqueeze(1))


# -- P members: parameters (P, ...) as one (P, D) buffer ------------------------------------------------
GRAD_LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"
"""torch's one-time hint when a .grad is not laid out like a dense parameter (flatten_parameters' views)."""


def flatten_parameters(parameters: Sequence[nn.Parameter]) -> tuple[Tensor, Tensor]:
    """Put P-member parameters (each ``(P, ...)``) into one ``(P, D)`` tensor, their gradients into another.

    Each parameter's data becomes a view of a range of columns of ``flat``, and its ``.grad`` a view of
    the same columns of ``flat_grad`` (autograd accumulates into an existing ``.grad`` in place). The
    optimiser, the per-member gradient clipping and copying a member then act on every member's whole
    parameter vector in a few ops, however many tensors the networks have. Zero ``flat_grad`` (never set
    the grads to None) before each backward pass (:func:`member_backward`), and do not move the modules
    afterwards (``.to()`` would give the parameters new storage).
    """
    first = parameters[0]
    num_members = first.shape[0]
    sizes = [parameter[0].numel() for parameter in parameters]
    flat = torch.empty(num_members, sum(sizes), device=first.device, dtype=first.dtype)  # (P, D)
    flat_grad = torch.zeros_like(flat)  # (P, D)
    start = 0
    for parameter, size in zip(parameters, sizes, strict=True):
        columns = slice(start, start + size)
        flat[:, columns].copy_(parameter.detach().reshape(num_members, size))
        parameter.data = flat[:, columns].view(parameter.shape)
        parameter.grad = flat_grad[:, columns].view(parameter.shape)
        start += size
    return flat, flat_grad


def member_backward(losses: Tensor) -> None:
    """Backward of the members' ``(P,)`` losses into :func:`flatten_parameters`' gradient views (zeroed
    before): members share no parameter, so the sum gives each member the gradient of its own loss."""
    with warnings.catch_warnings():  # the grads are strided views of the flat gradients, on purpose
        warnings.filterwarnings("ignore", message=GRAD_LAYOUT_WARNING)
        losses.sum().backward()


class VectorizedAdam:
    """Adam over the ``(P, D)`` flat parameters of P members, with its own learning rate per member.

    The update rule of ``torch.optim.Adam`` (no weight decay, no amsgrad), with a step count, bias
    corrections and learning rate per member: a fixed number of whole-tensor ops per step, whatever P.
    The scalars (bias corrections, step size) are computed in float64 as torch does in Python floats,
    then used in the parameters' dtype. ``rectified``: ``torch.optim.RAdam``'s rule instead (PQN's
    optimiser; the same state, :func:`adam_update`'s ``rectified``).
    """

    state_names = ("exp_avg", "exp_avg_sq", "steps")

    def __init__(
        self,
        parameters: Tensor,
        gradients: Tensor,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-5,
        rectified: bool = False,
    ) -> None:
        self.parameters = parameters  # (P, D)
        self.gradients = gradients  # (P, D)
        self.betas = betas
        self.eps = eps
        self.rectified = rectified
        self.exp_avg = torch.zeros_like(parameters)  # (P, D)
        self.exp_avg_sq = torch.zeros_like(parameters)  # (P, D)
        self.steps = torch.zeros(parameters.shape[0], dtype=torch.float64, device=parameters.device)  # (P,)

    @torch.no_grad()
    def step(self, learning_rate: Tensor) -> None:
        """One Adam (RAdam) step of every member on ``gradients``; ``learning_rate`` is ``(P,)`` float64."""
        adam_update(
            self.parameters,
            self.gradients,
            self.exp_avg,
            self.exp_avg_sq,
            self.steps,
            learning_rate,
            self.betas,
            self.eps,
            rectified=self.rectified,
        )

    def state_dict(self) -> dict[str, Tensor]:
        return {name: getattr(self, name).clone() for name in self.state_names}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name in self.state_names:
            getattr(self, name).copy_(state[name])


# -- the update rules as functions of tensors, and a gradient step as one graph ---------------------------
def adam_update(
    parameters: Tensor,
    gradients: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: Tensor,
    learning_rate: Tensor,
    betas: tuple[float, float],
    eps: float,
    rectified: bool = False,
    weight_decay: float = 0.0,
) -> None:
    """torch's Adam rule (no amsgrad) in place, with no host sync: ``(D,)`` parameters
    with a ``()`` step count and learning rate (a flat ``torch.optim.Adam``'s own state), or P members'
    ``(P, D)`` with ``(P,)`` of each (:class:`VectorizedAdam`). The bias corrections and the step size are
    computed in float64, as torch computes them in Python floats, then used in the parameters' dtype.

    ``rectified``: torch's RAdam rule (no weight decay): the same moments, and the step rectified by the
    length of the approximated simple moving average (rho_t) once it exceeds 5, the bias-corrected
    momentum alone before (torch's ``capturable`` form of the same branch), per member for ``(P, D)``.

    ``weight_decay``: AdamW's decoupled weight decay (torch's ``Adam(decoupled_weight_decay=True)``): the
    parameters first lose ``lr * weight_decay`` of themselves, then take the Adam step; 0 (the default)
    adds no op."""
    beta1, beta2 = betas
    dtype = parameters.dtype
    rows = (-1, 1) if parameters.dim() == 2 else ()  # a member's scalars broadcast over its row
    if weight_decay:
        parameters.sub_(parameters * (learning_rate * weight_decay).to(dtype).reshape(rows))
    steps += 1
    exp_avg.lerp_(gradients, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(gradients, gradients, value=1 - beta2)
    count = steps.double()
    bias_correction1 = 1 - beta1**count
    if rectified:
        bias_correction2 = 1 - beta2**count
        rho_infinity = 2 / (1 - beta2) - 1
        rho = rho_infinity - 2 * count * beta2**count / bias_correction2
        rectify = rho > 5.0
        safe_rho = torch.where(rectify, rho, torch.full_like(rho, 6.0))  # no sqrt of a negative number
        numerator = (safe_rho - 4) * (safe_rho - 2) * rho_infinity
        rectification = (numerator / ((rho_infinity - 4) * (rho_infinity - 2) * safe_rho)).sqrt()
        adaptive = bias_correction2.sqrt().to(dtype).reshape(rows) / exp_avg_sq.sqrt().add_(eps)
        rectified_scale = rectification.to(dtype).reshape(rows) * adaptive
        scale = torch.where(rectify.reshape(rows), rectified_scale, torch.ones_like(adaptive))
        corrected = exp_avg / bias_correction1.to(dtype).reshape(rows)
        parameters.sub_(corrected * learning_rate.to(dtype).reshape(rows) * scale)
        return
    bias_correction2_sqrt = (1 - beta2**count).sqrt()
    step_size = (learning_rate / bias_correction1).to(dtype).reshape(rows)
    denom = exp_avg_sq.sqrt().div_(bias_correction2_sqrt.to(dtype).reshape(rows)).add_(eps)
    # param + (-step_size * exp_avg) / denom: torch's addcdiv_(exp_avg, denom, value=-step_size)
    parameters.addcdiv_(exp_avg * -step_size, denom)


def rmsprop_update(
    parameters: Tensor,
    gradients: Tensor,
    square_avg: Tensor,
    steps: Tensor,
    learning_rate: Tensor,
    alpha: float,
    eps: float,
) -> None:
    """torch's RMSprop rule (not centred, no momentum, no weight decay) in place; ``learning_rate`` a
    ``()`` tensor."""
    steps += 1
    square_avg.mul_(alpha).addcmul_(gradients, gradients, value=1 - alpha)
    average = square_avg.sqrt().add_(eps)
    parameters.addcdiv_(gradients * -learning_rate.to(parameters.dtype), average)
