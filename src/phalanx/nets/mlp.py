"""MLPs and ensembles of MLPs: the layers every policy head, value net and Q-network is built from.

:func:`mlp` builds one network with the PPO-implementation-details initialisation (orthogonal weights,
zero biases); :class:`EnsembleMLP` holds K such networks evaluated as one batched matmul, with a leading
member dimension (population members, critic ensembles, per-agent networks), each optionally with a
LayerNorm of its own after every hidden layer (:class:`EnsembleLayerNorm`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from phalanx.errors import ConfigError

Tensor = torch.Tensor

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
}
HIDDEN_GAIN = math.sqrt(2.0)
POLICY_OUTPUT_GAIN = 0.01
VALUE_OUTPUT_GAIN = 1.0


def activation_class(name: str) -> type[nn.Module]:
    """The ``nn.Module`` class of an activation name, or a ConfigError listing the valid names."""
    if name not in ACTIVATIONS:
        raise ConfigError(f"unknown activation {name!r}; valid activations: {', '.join(ACTIVATIONS)}.")
    return ACTIVATIONS[name]


def layer_init(layer: nn.Linear, gain: float) -> nn.Linear:
    """Orthogonal weight with ``gain``, zero bias (the PPO-implementation-details init)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class MLP(nn.Sequential):
    """The network :func:`mlp` builds: an ``nn.Sequential`` whose forward calls each layer's ``forward``
    directly. ``nn.Module.__call__`` (hook dispatch) costs ~1-2 us a layer, a third of the forward of a
    few rows, on every acting step; the results are the same. Hooks on the layers are not called
    (hooks on the MLP itself are)."""

    def forward(self, x: Tensor) -> Tensor:
        for layer in self:
            x = layer.forward(x)
        return x


def mlp(
    in_dim: int,
    hidden_sizes: Sequence[int],
    out_dim: int,
    activation: str = "tanh",
    output_gain: float = 1.0,
    layer_norm: bool = False,
) -> MLP:
    """Linear-activation stack; gain sqrt(2) on hidden layers, ``output_gain`` on the last one;
    ``layer_norm``: a LayerNorm between each hidden layer and its activation (PQN's Q-network)."""
    activation_type = activation_class(activation)
    sizes = [in_dim, *hidden_sizes]
    layers: list[nn.Module] = []
    for size_in, size_out in pairwise(sizes):
        layers.append(layer_init(nn.Linear(size_in, size_out), HIDDEN_GAIN))
        if layer_norm:
            layers.append(nn.LayerNorm(size_out))
        layers.append(activation_type())
    layers.append(layer_init(nn.Linear(sizes[-1], out_dim), output_gain))
    return MLP(*layers)


class EnsembleLinear(nn.Module):
    """K independent linear layers applied as one batched matmul.

    ``weight`` is ``(K, in, out)`` (member k's is the transpose of an ``nn.Linear`` weight) and
    ``bias`` is ``(K, 1, out)``. Input ``(K, B, in)`` gives member k the rows ``x[k]``; input
    ``(B, in)`` gives every member the same rows. Output is ``(K, B, out)``.
    """

    def __init__(self, num_members: int, in_features: int, out_features: int, gain: float = 1.0) -> None:
        super().__init__()
        self.num_members = num_members
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(num_members, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_features))
        self.reset_parameters(gain)

    @torch.no_grad()
    def reset_parameters(self, gain: float = 1.0) -> None:
        """Each member initialised like ``layer_init(nn.Linear(in, out), gain)``."""
        for member_weight in self.weight:  # (in, out)
            linear_weight = torch.empty(self.out_features, self.in_features)
            nn.init.orthogonal_(linear_weight, gain)
            member_weight.copy_(linear_weight.T)
        self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2:  # (B, in): the same rows for every member
            x = x.expand(self.num_members, *x.shape)
        if x.dim() != 3 or x.shape[0] != self.num_members or x.shape[2] != self.in_features:
            raise ValueError(
                f"EnsembleLinear expects input (K={self.num_members}, B, {self.in_features}) or "
                f"(B, {self.in_features}), got {tuple(x.shape)}."
            )
        return torch.baddbmm(self.bias, x, self.weight)  # (K, B, out)

    def extra_repr(self) -> str:
        return (
            f"num_members={self.num_members}, in_features={self.in_features}, "
            f"out_features={self.out_features}"
        )


class EnsembleLayerNorm(nn.Module):
    """K independent LayerNorms over the last dimension, one batched op: member k normalises its rows
    ``x[k]`` and applies its own affine ``weight[k]``, ``bias[k]`` (``(K, 1, features)`` each, as
    :class:`EnsembleLinear`'s bias), what ``nn.LayerNorm(features)`` with those weights computes."""

    def __init__(self, num_members: int, features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.features = features
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_members, 1, features))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, features))

    def forward(self, x: Tensor) -> Tensor:
        normalised = F.layer_norm(x, (self.features,), eps=self.eps)  # (K, B, features)
        return torch.addcmul(self.bias, normalised, self.weight)

    def extra_repr(self) -> str:
        return f"num_members={self.weight.shape[0]}, features={self.features}, eps={self.eps}"


class EnsembleMLP(nn.Module):
    """K MLPs with the architecture of :func:`mlp`, evaluated at once with a leading member dim.

    Input ``(K, B, in_dim)`` (one batch per member) or ``(B, in_dim)`` (shared); output
    ``(K, B, out_dim)``. ``layer_norm``: each member's LayerNorm between each hidden layer and its
    activation, as ``mlp(..., layer_norm=True)`` (:class:`EnsembleLayerNorm`).
    """

    def __init__(
        self,
        num_members: int,
        in_dim: int,
        hidden_sizes: Sequence[int],
        out_dim: int,
        activation: str = "tanh",
        output_gain: float = 1.0,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        activation_type = activation_class(activation)
        self.num_members = num_members
        self.in_dim = in_dim
        self.hidden_sizes = tuple(hidden_sizes)
        self.out_dim = out_dim
        self.activation = activation
        self.layer_norm = layer_norm
        sizes = [in_dim, *hidden_sizes]
        layers: list[nn.Module] = []
        for size_in, size_out in pairwise(sizes):
            layers.append(EnsembleLinear(num_members, size_in, size_out, HIDDEN_GAIN))
            if layer_norm:
                layers.append(EnsembleLayerNorm(num_members, size_out))
            layers.append(activation_type())
        layers.append(EnsembleLinear(num_members, sizes[-1], out_dim, output_gain))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)  # (K, B, out_dim)

    @classmethod
    def from_mlps(cls, networks: Sequence[nn.Module]) -> EnsembleMLP:
        """An ensemble whose member k has a copy of the weights of ``networks[k]`` (built by :func:`mlp`)."""
        mlps = cast("Sequence[nn.Sequential]", networks)  # mlp() builds Sequentials: checked below
        if len(mlps) == 0:
            raise ValueError("EnsembleMLP.from_mlps needs at least one mlp.")
        architecture = _mlp_architecture(mlps[0])
        for index, other in enumerate(mlps[1:], start=1):
            other_architecture = _mlp_architecture(other)
            if other_architecture != architecture:
                raise ValueError(
                    f"EnsembleMLP.from_mlps: mlps[{index}] has architecture (in_dim, hidden_sizes, out_dim, "
                    f"activation, layer_norm) = {other_architecture}, but mlps[0] has {architecture}."
                )
        first_layer = mlps[0][0]
        assert isinstance(first_layer, nn.Linear), "_mlp_architecture checked the layers"
        first_weight = first_layer.weight
        in_dim, hidden_sizes, out_dim, activation, layer_norm = architecture
        ensemble = cls(len(mlps), in_dim, hidden_sizes, out_dim, activation, layer_norm=layer_norm)
        ensemble.to(device=first_weight.device, dtype=first_weight.dtype)
        with torch.no_grad():
            for member_index, member_mlp in enumerate(mlps):
                for ensemble_layer, layer in zip(ensemble.layers, member_mlp, strict=True):
                    _copy_member(ensemble_layer, layer, member_index, into_ensemble=True)
        return ensemble

    def member(self, index: int) -> nn.Sequential:
        """A standalone :func:`mlp` holding a copy of member ``index``'s weights (same device, dtype)."""
        if not -self.num_members <= index < self.num_members:
            raise IndexError(f"member index {index} out of range for {self.num_members} members.")
        first_layer = self.layers[0]
        assert isinstance(first_layer, EnsembleLinear)
        first_weight = first_layer.weight
        standalone = mlp(
            self.in_dim, self.hidden_sizes, self.out_dim, self.activation, layer_norm=self.layer_norm
        )
        standalone.to(device=first_weight.device, dtype=first_weight.dtype)
        with torch.no_grad():
            for ensemble_layer, layer in zip(self.layers, standalone, strict=True):
                _copy_member(ensemble_layer, layer, index, into_ensemble=False)
        return standalone


def _copy_member(ensemble_layer: nn.Module, layer: nn.Module, index: int, into_ensemble: bool) -> None:
    """Copy the weights of ``layer`` (an ``nn.Linear`` or ``nn.LayerNorm`` of an :func:`mlp`) into member
    ``index`` of ``ensemble_layer``, or (``into_ensemble`` False) that member's into ``layer``; an
    activation has none."""
    if isinstance(layer, nn.Linear):
        assert isinstance(ensemble_layer, EnsembleLinear), "the same architecture"
        pairs = [(ensemble_layer.weight[index], layer.weight.T), (ensemble_layer.bias[index, 0], layer.bias)]
    elif isinstance(layer, nn.LayerNorm):
        assert isinstance(ensemble_layer, EnsembleLayerNorm), "the same architecture"
        pairs = [(ensemble_layer.weight[index, 0], layer.weight), (ensemble_layer.bias[index, 0], layer.bias)]
    else:
        return
    for member_tensor, single_tensor in pairs:
        if into_ensemble:
            member_tensor.copy_(single_tensor)
        else:
            single_tensor.copy_(member_tensor)


def _mlp_architecture(network: nn.Sequential) -> tuple[int, tuple[int, ...], int, str, bool]:
    """``(in_dim, hidden_sizes, out_dim, activation, layer_norm)`` of a network built by :func:`mlp`."""
    layer_norm = any(isinstance(layer, nn.LayerNorm) for layer in network)
    step = 3 if layer_norm else 2  # Linear, [LayerNorm,] activation, ..., Linear
    modules = list(network)
    linears = modules[0::step]
    norms = modules[1::step] if layer_norm else []
    activation_types = {type(layer) for layer in modules[step - 1 :: step]}
    activation_names = [name for name, module_type in ACTIVATIONS.items() if module_type in activation_types]
    if (
        len(network) % step != 1
        or not all(isinstance(layer, nn.Linear) for layer in linears)
        or not all(isinstance(layer, nn.LayerNorm) for layer in norms)
        or len(activation_types) > 1
        or len(activation_names) != len(activation_types)
    ):
        raise ValueError(f"not an mlp built by phalanx.nets.mlp: {network}")
    # a single linear layer has no activation; any name builds the same network
    activation = activation_names[0] if activation_names else "tanh"
    layers = [layer for layer in linears if isinstance(layer, nn.Linear)]  # every one (checked above)
    hidden_sizes = tuple(layer.out_features for layer in layers[:-1])
    return layers[0].in_features, hidden_sizes, layers[-1].out_features, activation, layer_norm
