"""The flat-buffer optimisers step exactly as torch's per-tensor ones, and keep every gradient."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from phalanx.nets import mlp
from phalanx.optim import FlatAdam, FlatRMSprop, clip_grad_norm, gradients


def _nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    net = nn.Sequential(mlp(5, [16, 16], 3, "tanh"), nn.Linear(3, 2))
    return net, copy.deepcopy(net)


def _loss(net: nn.Module, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 5, generator=generator)
    return net(x).pow(2).mean() + net(x).sin().sum()


@pytest.mark.parametrize(
    ("flat_class", "torch_class", "kwargs"),
    [
        (FlatAdam, torch.optim.Adam, {"lr": 1e-2, "eps": 1e-5}),
        (FlatRMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.99, "eps": 1e-5}),
    ],
)
def test_flat_optimizer_steps_as_torch_per_tensor(flat_class, torch_class, kwargs) -> None:
    net, reference = _nets()
    flat = flat_class(list(net.parameters()), **kwargs)
    per_tensor = torch_class(reference.parameters(), **kwargs)
    for step in range(20):
        for optimizer, module in ((flat, net), (per_tensor, reference)):
            optimizer.zero_grad()
            _loss(module, step).backward()
            clip_grad_norm(gradients(optimizer), 0.5)
            optimizer.step()
    for got, want in zip(net.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # still the module's own Parameters, now views of the one buffer the optimiser steps
    assert all(isinstance(p, nn.Parameter) for p in net.parameters())
    assert len(gradients(flat)) == 1
    assert flat.flat.parameter.data_ptr() == next(net.parameters()).data_ptr()


def test_flat_adam_step_is_torch_fused_adam_bit_for_bit_and_keeps_the_step_hooks() -> None:
    """FlatAdam's step calls the fused kernel itself (no torch step wrapper): the same bits as a torch
    fused Adam over the same one flat tensor, a changed learning rate included; with a step hook
    registered it is torch's own step, which calls the hook."""
    net, reference = _nets()
    flat = FlatAdam(list(net.parameters()), lr=1e-2, eps=1e-5)
    reference_flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in reference.parameters()]))
    fused = torch.optim.Adam([reference_flat], lr=1e-2, eps=1e-5, fused=True)
    for step in range(12):
        if step == 6:
            for optimizer in (flat, fused):
                optimizer.param_groups[0]["lr"] = 3e-3
        flat.zero_grad()
        _loss(net, step).backward()
        flat.step()
        reference.zero_grad()
        _loss(reference, step).backward()
        reference_flat.grad = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        fused.step()
        with torch.no_grad():  # the reference modules follow their flat copy
            offset = 0
            for p in reference.parameters():
                p.copy_(reference_flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
    assert torch.equal(flat.flat.parameter.detach(), reference_flat.detach())
    for name in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(flat.state[flat.flat.parameter][name], fused.state[reference_flat][name])
    calls = []
    handle = flat.register_step_post_hook(lambda *_: calls.append(1))
    flat.step()
    handle.remove()
    flat.step()
    assert calls == [1]


def test_gradients_replaced_by_module_zero_grad_are_not_lost() -> None:
    """``module.zero_grad()`` sets gradients to None and backward allocates new ones: the step must
    still see them, exactly as if the optimiser had zeroed its buffer."""
    net, reference = _nets()
    flat = FlatAdam(list(net.parameters()), lr=1e-2)
    per_tensor = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for step in range(3):
        net.zero_grad()  # set_to_none=True: detaches the gradients from the flat buffer
        _loss(net, step).backward()
        flat.step()
        per_tensor.zero_grad()
        _loss(reference, step).backward()
        per_tensor.step()
    for got, want in zip(net.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # and the next zero_grad puts the views back
    flat.zero_grad()
    views = flat.flat.gradient_views
    assert all(p.grad is view for p, view in zip(net.parameters(), views, strict=True))


def test_state_dict_round_trip_and_in_place_weight_loading() -> None:
    net, other = _nets()
    optimizer = FlatAdam(list(net.parameters()), lr=1e-2)
    for step in range(3):
        optimizer.zero_grad()
        _loss(net, step).backward()
        optimizer.step()
    # load weights and optimiser state into a fresh pair: the next steps agree exactly
    fresh = FlatAdam(list(other.parameters()), lr=1e-2)
    other.load_state_dict(net.state_dict())
    fresh.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as a checkpoint round trip
    for optimizer_, module in ((optimizer, net), (fresh, other)):
        optimizer_.zero_grad()
        _loss(module, 99).backward()
        optimizer_.step()
    for got, want in zip(other.parameters(), net.parameters(), strict=True):
        assert torch.equal(got, want)
    # load_state_dict copied into the views: the optimiser still steps the module's weights
    assert fresh.flat.parameter.data_ptr() == next(other.parameters()).data_ptr()


@pytest.mark.parametrize("count", [1, 4])
def test_clip_grad_norm_matches_torch(count: int) -> None:
    generator = torch.Generator().manual_seed(1)
    grads = [torch.randn(7, 3, generator=generator) * 10 for _ in range(count)]
    expected = [g.clone() for g in grads]
    params = [nn.Parameter(torch.zeros_like(g)) for g in expected]
    for p, g in zip(params, expected, strict=True):
        p.grad = g
    want = nn.utils.clip_grad_norm_(params, 0.5)
    got = clip_grad_norm(grads, 0.5)
    torch.testing.assert_close(got, want)
    for g, p in zip(grads, params, strict=True):
        torch.testing.assert_close(g, p.grad)


def test_mixed_dtypes_are_refused_with_the_fix() -> None:
    parameters = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    with pytest.raises(ValueError, match="parameter 1 is torch.float64.*one dtype and device"):
        FlatAdam(parameters, lr=1e-3)


def test_loads_the_state_of_torch_per_tensor_optimiser() -> None:
    """Checkpoints written before the optimisers were flat hold torch's per-parameter Adam state."""
    net, reference = _nets()
    per_tensor = torch.optim.Adam(reference.parameters(), lr=1e-2, fused=True)
    for step in range(3):
        per_tensor.zero_grad()
        _loss(reference, step).backward()
        per_tensor.step()
    net.load_state_dict(reference.state_dict())
    flat = FlatAdam(list(net.parameters()), lr=1e-2)
    flat.load_state_dict(copy.deepcopy(per_tensor.state_dict()))
    for optimizer, module in ((flat, net), (per_tensor, reference)):
        optimizer.zero_grad()
        _loss(module, 7).backward()
        optimizer.step()
    for got, want in zip(net.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
