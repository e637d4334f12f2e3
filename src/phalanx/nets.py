"""Networks: MLPs, ensembles of MLPs evaluated as one batched matmul, policy heads and value nets.

Policy heads compute log-probabilities, entropies and samples with plain tensor ops instead of
``torch.distributions`` objects: no argument validation, no object construction, no host syncs,
which matters when a whole rollout step is a handful of small kernels.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from phalanx.config import ENCODERS
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
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


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
) -> MLP:
    """Linear-activation stack; gain sqrt(2) on hidden layers, ``output_gain`` on the last one."""
    activation_type = activation_class(activation)
    sizes = [in_dim, *hidden_sizes]
    layers: list[nn.Module] = []
    for size_in, size_out in pairwise(sizes):
        layers += [layer_init(nn.Linear(size_in, size_out), HIDDEN_GAIN), activation_type()]
    layers.append(layer_init(nn.Linear(sizes[-1], out_dim), output_gain))
    return MLP(*layers)


def head_mlp(
    in_dim: int,
    hidden_sizes: Sequence[int],
    out_dim: int,
    activation: str,
    output_gain: float,
    encoder: nn.Module | None,
) -> MLP:
    """The network of a policy head or value net: :func:`mlp` from ``in_dim`` features, with ``encoder``
    (if given, from :func:`feature_encoder`) as its first layer, so that observations go through the
    encoder and then the MLP in one ``MLP.forward``, without a branch on the flat path."""
    network = mlp(in_dim, hidden_sizes, out_dim, activation, output_gain)
    return network if encoder is None else MLP(encoder, *network)


def encoder_observation_rank(encoder: nn.Module | None) -> int:
    """The rank of one observation a head with ``encoder`` reads: an image encoder's image rank (2 or 3);
    1 otherwise (flat vectors, and Dict observations, which arrive flattened)."""
    return len(encoder.image_shape) if isinstance(encoder, ImageEncoder) else 1


def head_encoder(network: nn.Sequential) -> nn.Module | None:
    """The encoder in front of a head's MLP (:func:`head_mlp`), or None for a flat head."""
    first = network[0]
    return None if isinstance(first, nn.Linear) else first


def head_on_features(head: nn.Module) -> nn.Module:
    """A view of a policy head or value net built with an encoder that reads the encoder's features
    instead of observations: the same MLP layers (the same parameters, trained through either), without
    the encoder in front. With an encoder shared by the policy and the value function, the trunk then
    runs once per batch for both (``encoder(obs)``, then each view on the features)."""
    view = copy.copy(head)
    view._modules = dict(head._modules)  # the view's own table of submodules, the modules themselves shared
    for name, network in head.named_children():
        if isinstance(network, MLP) and head_encoder(network) is not None:
            view._modules[name] = network[1:]
    view.observation_rank = 1
    return view


# -- ensembles ---------------------------------------------------------------------------------------


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


class EnsembleMLP(nn.Module):
    """K MLPs with the architecture of :func:`mlp`, evaluated at once with a leading member dim.

    Input ``(K, B, in_dim)`` (one batch per member) or ``(B, in_dim)`` (shared); output
    ``(K, B, out_dim)``.
    """

    def __init__(
        self,
        num_members: int,
        in_dim: int,
        hidden_sizes: Sequence[int],
        out_dim: int,
        activation: str = "tanh",
        output_gain: float = 1.0,
    ) -> None:
        super().__init__()
        activation_type = activation_class(activation)
        self.num_members = num_members
        self.in_dim = in_dim
        self.hidden_sizes = tuple(hidden_sizes)
        self.out_dim = out_dim
        self.activation = activation
        sizes = [in_dim, *hidden_sizes]
        layers: list[nn.Module] = []
        for size_in, size_out in pairwise(sizes):
            layers += [EnsembleLinear(num_members, size_in, size_out, HIDDEN_GAIN), activation_type()]
        layers.append(EnsembleLinear(num_members, sizes[-1], out_dim, output_gain))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)  # (K, B, out_dim)

    @classmethod
    def from_mlps(cls, mlps: Sequence[nn.Sequential]) -> EnsembleMLP:
        """An ensemble whose member k has a copy of the weights of ``mlps[k]`` (built by :func:`mlp`)."""
        if len(mlps) == 0:
            raise ValueError("EnsembleMLP.from_mlps needs at least one mlp.")
        in_dim, hidden_sizes, out_dim, activation = _mlp_architecture(mlps[0])
        for index, other in enumerate(mlps[1:], start=1):
            other_architecture = _mlp_architecture(other)
            if other_architecture != (in_dim, hidden_sizes, out_dim, activation):
                raise ValueError(
                    f"EnsembleMLP.from_mlps: mlps[{index}] has architecture (in_dim, hidden_sizes, out_dim, "
                    f"activation) = {other_architecture}, but mlps[0] has "
                    f"{(in_dim, hidden_sizes, out_dim, activation)}."
                )
        first_weight = mlps[0][0].weight
        ensemble = cls(len(mlps), in_dim, hidden_sizes, out_dim, activation)
        ensemble.to(device=first_weight.device, dtype=first_weight.dtype)
        with torch.no_grad():
            for member_index, member_mlp in enumerate(mlps):
                for ensemble_layer, layer in zip(ensemble.layers, member_mlp, strict=True):
                    if isinstance(layer, nn.Linear):
                        ensemble_layer.weight[member_index].copy_(layer.weight.T)
                        ensemble_layer.bias[member_index, 0].copy_(layer.bias)
        return ensemble

    def member(self, index: int) -> nn.Sequential:
        """A standalone :func:`mlp` holding a copy of member ``index``'s weights (same device, dtype)."""
        if not -self.num_members <= index < self.num_members:
            raise IndexError(f"member index {index} out of range for {self.num_members} members.")
        first_weight = self.layers[0].weight
        standalone = mlp(self.in_dim, self.hidden_sizes, self.out_dim, self.activation)
        standalone.to(device=first_weight.device, dtype=first_weight.dtype)
        with torch.no_grad():
            for ensemble_layer, layer in zip(self.layers, standalone, strict=True):
                if isinstance(layer, nn.Linear):
                    layer.weight.copy_(ensemble_layer.weight[index].T)
                    layer.bias.copy_(ensemble_layer.bias[index, 0])
        return standalone


def _mlp_architecture(network: nn.Sequential) -> tuple[int, tuple[int, ...], int, str]:
    """``(in_dim, hidden_sizes, out_dim, activation)`` of a network built by :func:`mlp`."""
    linears = list(network[0::2])  # Linear, activation, Linear, ..., Linear
    activation_types = {type(layer) for layer in network[1::2]}
    activation_names = [name for name, module_type in ACTIVATIONS.items() if module_type in activation_types]
    if (
        len(network) % 2 == 0
        or not all(isinstance(layer, nn.Linear) for layer in linears)
        or len(activation_types) > 1
        or len(activation_names) != len(activation_types)
    ):
        raise ValueError(f"not an mlp built by phalanx.nets.mlp: {network}")
    # a single linear layer has no activation; any name builds the same network
    activation = activation_names[0] if activation_names else "tanh"
    hidden_sizes = tuple(layer.out_features for layer in linears[:-1])
    return linears[0].in_features, hidden_sizes, linears[-1].out_features, activation


# -- policies and values -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionNoise:
    """The random draw of one sampled action, per observation row: ``size`` float values, uniform in
    [0, 1) (``distribution`` "uniform") or standard normal ("normal"). A policy that samples from a
    given draw (``sample(obs, noise=...)``) is a function of tensors, so that it can be exported."""

    distribution: str
    size: int


def _log_softmax_actions_first(logits: Tensor) -> Tensor:
    """Log-probabilities ``(A, B...)`` of logits ``(B..., A)``: ``log_softmax(logits, -1)``, actions first.

    With few actions, reducing over the short, contiguous last dim is slow on CPU (one tiny
    reduction per row, and on 2+ threads a parallel region even for 10 rows); reducing over dim 0 of
    the transposed view vectorises across the batch instead. Same values, 2-5x faster here.
    """
    return torch.log_softmax(logits.movedim(-1, 0), dim=0)  # (A, B...)


class CategoricalPolicy(nn.Module):
    """Discrete actions: an MLP gives logits ``(B, num_actions)``; actions are int64 ``(B,)``.

    ``encoder`` (from :func:`feature_encoder`): a network in front of the MLP, which then reads its
    ``obs_dim`` features; observations are ``(B, *obs_shape)`` of the encoder's space. None: the
    observations ``(B, obs_dim)`` are the features. (So for every head below.)
    """

    observation_rank = 1
    """The rank of one observation (:func:`encoder_observation_rank`): the batch dims are the others."""

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.observation_rank = encoder_observation_rank(encoder)
        self.logits_net = head_mlp(
            obs_dim, hidden_sizes, num_actions, activation, POLICY_OUTPUT_GAIN, encoder
        )

    @property
    def encoder(self) -> nn.Module | None:
        """The encoder in front of the MLP, or None."""
        return head_encoder(self.logits_net)

    def forward(self, obs: Tensor) -> Tensor:
        """Logits ``(B, num_actions)`` of observations ``(B, obs_dim)``."""
        return self.logits_net(obs)

    @property
    def action_noise(self) -> ActionNoise:
        """What :meth:`draw_noise` draws per observation row."""
        return ActionNoise("uniform", self.num_actions)

    def draw_noise(self, obs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The random draw of one :meth:`sample` of ``obs`` ``(B, obs_dim)``: uniform noise ``(B, A)``,
        ``noise[b, a]`` for action a of row b (Gumbel noise once transformed)."""
        return torch.rand(
            (*obs.shape[: -self.observation_rank], self.num_actions),
            generator=generator,
            device=obs.device,
            dtype=self.logits_net[-1].weight.dtype,
        )

    def sample(
        self,
        obs: Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(action, log_prob)``, both ``(B,)``; deterministic takes the argmax.

        ``noise``: the draw of :meth:`draw_noise`, drawn by the caller (a compiled caller draws outside
        the graph); None draws it here from ``generator``: the same stream either way.
        """
        log_probs = _log_softmax_actions_first(self(obs))  # (A, B)
        if deterministic:
            action = log_probs.argmax(dim=0)
        else:  # Gumbel-max trick: argmax(log p + Gumbel noise) ~ Categorical(p)
            uniform = self.draw_noise(obs, generator) if noise is None else noise  # (B, A)
            # log p + Gumbel noise, as log p - log(-log u): the same bits (x - y is x + (-y)), one op less
            minus_gumbel = torch.log(-torch.log(uniform)).movedim(-1, 0)  # u = 0 gives +inf: never chosen
            # max(...).indices, not argmax: the same index, but argmax over a short leading dim is slower
            action = (log_probs - minus_gumbel).max(dim=0).indices
        log_prob = log_probs.gather(0, action.unsqueeze(0)).squeeze(0)
        return action, log_prob

    def log_prob_entropy(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability of ``action`` ``(B,)`` and entropy of the policy, both ``(B,)``."""
        log_probs = _log_softmax_actions_first(self(obs))  # (A, B)
        log_prob = log_probs.gather(0, action.long().unsqueeze(0)).squeeze(0)
        # as torch.distributions.Categorical: clamp so that 0 * log(0) gives 0 rather than nan
        log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
        entropy = -(log_probs.exp() * log_probs).sum(dim=0)
        return log_prob, entropy

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The most probable action ``(B,)``."""
        return self(obs).argmax(dim=-1)


class GaussianPolicy(nn.Module):
    """Continuous actions: diagonal Gaussian with an MLP mean and a state-independent ``log_std``.

    The mean is unbounded; actions are clipped to the action space later, by an env wrapper.
    """

    observation_rank = 1
    """The rank of one observation (:func:`encoder_observation_rank`): the batch dims are the others."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.observation_rank = encoder_observation_rank(encoder)
        self.mean_net = head_mlp(obs_dim, hidden_sizes, action_dim, activation, POLICY_OUTPUT_GAIN, encoder)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    @property
    def encoder(self) -> nn.Module | None:
        """The encoder in front of the MLP, or None."""
        return head_encoder(self.mean_net)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``(mean, log_std)``, both ``(B, action_dim)`` (``log_std`` an expanded view)."""
        mean = self.mean_net(obs)
        return mean, self.log_std.expand_as(mean)

    @property
    def action_noise(self) -> ActionNoise:
        """What :meth:`draw_noise` draws per observation row."""
        return ActionNoise("normal", self.action_dim)

    def draw_noise(self, obs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The random draw of one :meth:`sample` of ``obs`` ``(B, obs_dim)``: standard normal noise
        ``(B, action_dim)``."""
        return torch.randn(
            (*obs.shape[: -self.observation_rank], self.action_dim),
            generator=generator,
            device=obs.device,
            dtype=self.log_std.dtype,
        )

    def sample(
        self,
        obs: Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(action (B, action_dim), log_prob (B,))``; deterministic takes the mean.

        ``noise``: the draw of :meth:`draw_noise`, drawn by the caller (a compiled caller draws outside
        the graph); None draws it here from ``generator``: the same stream either way.
        """
        mean, log_std = self(obs)
        if deterministic:
            action = mean
            log_prob = (-log_std - LOG_SQRT_2PI).sum(dim=-1)
        else:
            if noise is None:
                noise = self.draw_noise(obs, generator)
            action = mean + log_std.exp() * noise
            log_prob = (-0.5 * noise.square() - log_std - LOG_SQRT_2PI).sum(dim=-1)
        return action, log_prob

    def log_prob_entropy(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability of ``action`` ``(B, action_dim)`` and entropy, both ``(B,)`` (summed over dims)."""
        mean, log_std = self(obs)
        standardized = (action - mean) * torch.exp(-log_std)
        log_prob = (-0.5 * standardized.square() - log_std - LOG_SQRT_2PI).sum(dim=-1)
        entropy = (0.5 + LOG_SQRT_2PI + log_std).sum(dim=-1)
        return log_prob, entropy

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The mean action ``(B, action_dim)``."""
        return self.mean_net(obs)


class MultiCategoricalPolicy(nn.Module):
    """MultiDiscrete actions: k independent categorical dims, dim i with ``nvec[i]`` actions; an MLP
    gives the logits of all dims at once (``sum(nvec)`` outputs); actions are int64 ``(B, k)``.

    The log-probability of an action is the sum over the dims, and so is the entropy. Internally the
    logits are laid out ``(B, k, n_max)`` with the ``n_max - nvec[i]`` missing actions of dim i at
    -inf (probability 0), so that every dim is sampled (Gumbel-max, as :class:`CategoricalPolicy`) and
    scored in one op; the random draw is uniform noise ``(B, k * n_max)``.
    """

    observation_rank = 1
    """The rank of one observation (:func:`encoder_observation_rank`): the batch dims are the others."""

    def __init__(
        self,
        obs_dim: int,
        nvec: Sequence[int],
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.nvec = tuple(int(n) for n in nvec)
        if not self.nvec or min(self.nvec) < 1:
            raise ConfigError(f"MultiCategoricalPolicy needs nvec of positive sizes, got {self.nvec}.")
        self.max_actions = max(self.nvec)
        self.observation_rank = encoder_observation_rank(encoder)
        self.logits_net = head_mlp(
            obs_dim, hidden_sizes, sum(self.nvec), activation, POLICY_OUTPUT_GAIN, encoder
        )
        # (k * n_max,) index into the logits (padding reads logit 0, then masked) and the padding mask
        index = torch.zeros(len(self.nvec), self.max_actions, dtype=torch.int64)
        padding = torch.ones(len(self.nvec), self.max_actions, dtype=torch.bool)
        start = 0
        for dim, size in enumerate(self.nvec):
            index[dim, :size] = torch.arange(start, start + size)
            padding[dim, :size] = False
            start += size
        self.register_buffer("logit_index", index.flatten(), persistent=False)
        self.register_buffer("padding", padding, persistent=False)

    @property
    def encoder(self) -> nn.Module | None:
        """The encoder in front of the MLP, or None."""
        return head_encoder(self.logits_net)

    def forward(self, obs: Tensor) -> Tensor:
        """Log-probabilities ``(B, k, n_max)`` of every dim's actions (-inf past ``nvec[i]``)."""
        logits = self.logits_net(obs).index_select(-1, self.logit_index)  # (B, k * n_max)
        logits = logits.unflatten(-1, (len(self.nvec), self.max_actions)).masked_fill(self.padding, -math.inf)
        return torch.log_softmax(logits, dim=-1)

    @property
    def action_noise(self) -> ActionNoise:
        """What :meth:`draw_noise` draws per observation row."""
        return ActionNoise("uniform", len(self.nvec) * self.max_actions)

    def draw_noise(self, obs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The random draw of one :meth:`sample` of ``obs``: uniform noise ``(B, k * n_max)``,
        ``noise[b, i * n_max + a]`` for action a of dim i of row b (Gumbel noise once transformed)."""
        return torch.rand(
            (*obs.shape[: -self.observation_rank], len(self.nvec) * self.max_actions),
            generator=generator,
            device=obs.device,
            dtype=self.logits_net[-1].weight.dtype,
        )

    def sample(
        self,
        obs: Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(action (B, k), log_prob (B,))``; deterministic takes each dim's argmax. ``noise``: as
        :meth:`CategoricalPolicy.sample`'s."""
        log_probs = self(obs)  # (B, k, n_max)
        if deterministic:
            action = log_probs.argmax(dim=-1)
        else:  # Gumbel-max per dim; a padded action (-inf) is never chosen, u < 1 keeps it finite
            uniform = self.draw_noise(obs, generator) if noise is None else noise
            minus_gumbel = torch.log(-torch.log(uniform)).unflatten(-1, log_probs.shape[-2:])
            action = (log_probs - minus_gumbel).max(dim=-1).indices
        log_prob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1).sum(dim=-1)
        return action, log_prob

    def log_prob_entropy(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability of ``action`` ``(B, k)`` and entropy, both ``(B,)`` (summed over the dims)."""
        log_probs = self(obs)  # (B, k, n_max)
        log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1).sum(dim=-1)
        # clamp so that the padding's 0 * log(0) gives 0 rather than nan
        log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
        entropy = -(log_probs.exp() * log_probs).sum(dim=(-2, -1))
        return log_prob, entropy

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The most probable action of every dim ``(B, k)``."""
        return self(obs).argmax(dim=-1)


class ValueNet(nn.Module):
    """State value: an MLP from observations ``(B, obs_dim)`` to values ``(B,)`` (``encoder``: as
    :class:`CategoricalPolicy`'s; a policy's encoder passed here is shared with it)."""

    def __init__(
        self,
        obs_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.value_net = head_mlp(obs_dim, hidden_sizes, 1, activation, VALUE_OUTPUT_GAIN, encoder)

    @property
    def encoder(self) -> nn.Module | None:
        """The encoder in front of the MLP, or None."""
        return head_encoder(self.value_net)

    def forward(self, obs: Tensor) -> Tensor:
        return self.value_net(obs).squeeze(-1)  # (B,)


# -- networks: P members as one module -------------------------------------------------------------
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
        self.logits_net = EnsembleMLP.from_mlps([policy.logits_net for policy in policies])
        self.noise = MemberNoise()

    def sample_members(self, obs: Tensor, generators: Sequence[torch.Generator]) -> tuple[Tensor, Tensor]:
        """``(actions (P, B), log_probs (P, B))``: CategoricalPolicy.sample, member i's noise drawn from
        generator i."""
        log_probs = _log_softmax_actions_first(self(obs))  # (A, P, B)
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
        self.mean_net = EnsembleMLP.from_mlps([policy.mean_net for policy in policies])
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
        self.value_net = EnsembleMLP.from_mlps([value.value_net for value in values])


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
            return cls(MemberCategoricalPolicy(policies), len(policies))  # type: ignore[arg-type]
        return cls(MemberGaussianPolicy(policies), len(policies))  # type: ignore[arg-type]

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        actions = self.policy.deterministic_action(obs.view(self.num_members, -1, *obs.shape[1:]))
        return actions.flatten(0, 1)  # (P * E, ...)


# -- observation encoders ----------------------------------------------------------------------------
# An encoder turns observations ``(B, *obs_shape)`` (any dtype: uint8 images stay uint8 until here) into
# float features ``(B, out_dim)`` for the MLP heads. A 1-D Box needs none: its observations are the
# features. :func:`feature_encoder` picks one for a space.


def is_image_space(space: gym.Space) -> bool:
    """Whether ``space`` holds images: a Box of rank 3, channels first ``(C, H, W)`` or last ``(H, W, C)``
    with C in 1..4, or a rank-2 ``(H, W)`` Box of uint8 (one grey channel)."""
    if not isinstance(space, gym.spaces.Box):
        return False
    shape = space.shape
    return len(shape) == 3 or (len(shape) == 2 and space.dtype == np.uint8)


def image_layout(space: gym.spaces.Box) -> tuple[tuple[int, int, int], bool]:
    """``((C, H, W), channels_last)`` of an image space (see :func:`is_image_space`)."""
    shape = tuple(int(size) for size in space.shape)
    if len(shape) == 2:
        return (1, *shape), False  # (H, W): one channel, added by the encoder
    if shape[-1] <= 4 < shape[0]:  # (H, W, C), as Gymnasium renders and ALE gives without preprocessing
        return (shape[2], shape[0], shape[1]), True
    return (shape[0], shape[1], shape[2]), False


class ImageEncoder(nn.Module):
    """Base of the CNN encoders: converts a batch of images to float ``(B, C, H, W)``, scaled to [0, 1]
    when the space is uint8 (so that buffers keep 1 byte a pixel), then ``self.body`` gives features."""

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__()
        (self.channels, self.height, self.width), self.channels_last = image_layout(space)
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        self.image_shape = tuple(int(size) for size in space.shape)
        self.body: nn.Module = nn.Identity()
        self.out_dim = 0

    def images(self, obs: Tensor) -> tuple[Tensor, torch.Size]:
        """Observations ``(B, *image_shape)`` as float ``(B, C, H, W)`` in the encoder's scale."""
        x = obs.to(torch.float32)
        if self.scale != 1.0:
            x = x * self.scale
        batch = x.shape[: x.dim() - len(self.image_shape)]
        x = x.reshape(-1, *self.image_shape)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        elif len(self.image_shape) == 2:
            x = x.unsqueeze(1)
        return x, batch

    def forward(self, obs: Tensor) -> Tensor:
        x, batch = self.images(obs)
        return self.body(x).reshape(*batch, self.out_dim)


def conv_init(layer: nn.Conv2d, gain: float = HIDDEN_GAIN) -> nn.Conv2d:
    """Orthogonal weight with ``gain``, zero bias (as :func:`layer_init`)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class NatureCNN(ImageEncoder):
    """The CNN of Mnih et al. (2015): 32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1, ReLU, then a
    linear layer of ``features`` (512) units with ReLU. Images must be at least 36x36."""

    def __init__(self, space: gym.spaces.Box, features: int = 512) -> None:
        super().__init__(space)
        if self.height < 36 or self.width < 36:
            raise ConfigError(
                f"the nature CNN needs images of at least 36x36 pixels, but the observation space {space} "
                f"holds {self.height}x{self.width} images. Use encoder 'impala' (any size >= 8x8) instead."
            )
        convolutions = nn.Sequential(
            conv_init(nn.Conv2d(self.channels, 32, 8, stride=4)),
            nn.ReLU(),
            conv_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            conv_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = convolutions(torch.zeros(1, self.channels, self.height, self.width)).shape[1]
        self.body = nn.Sequential(convolutions, layer_init(nn.Linear(flat, features), HIDDEN_GAIN), nn.ReLU())
        self.out_dim = features


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = conv_init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = conv_init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(ImageEncoder):
    """The IMPALA ResNet (Espeholt et al., 2018): per stack of ``channels`` (16, 32, 32), a 3x3 convolution,
    3x3 max-pool stride 2 and two residual blocks; then ReLU and a linear layer of ``features`` (256)
    units with ReLU. Images must be at least 8x8."""

    def __init__(
        self, space: gym.spaces.Box, channels: Sequence[int] = (16, 32, 32), features: int = 256
    ) -> None:
        super().__init__(space)
        if self.height < 8 or self.width < 8:
            raise ConfigError(
                f"the impala CNN needs images of at least 8x8 pixels, but the observation space {space} "
                f"holds {self.height}x{self.width} images. Flatten such small observations and use encoder "
                "'mlp'."
            )
        layers: list[nn.Module] = []
        in_channels = self.channels
        for out_channels in channels:
            layers += [
                conv_init(nn.Conv2d(in_channels, out_channels, 3, padding=1)),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(out_channels),
                _ResidualBlock(out_channels),
            ]
            in_channels = out_channels
        convolutions = nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = convolutions(torch.zeros(1, self.channels, self.height, self.width)).shape[1]
        self.body = nn.Sequential(convolutions, layer_init(nn.Linear(flat, features), HIDDEN_GAIN), nn.ReLU())
        self.out_dim = features


class DictEncoder(nn.Module):
    """Dict observations, which arrive flattened (``gymnasium.spaces.flatten``'s order: the parts by
    sorted key, each flattened): the vector is split into its parts, image parts go through a CNN of
    ``kind`` (their own), flat parts are passed as they are, and the features are concatenated."""

    def __init__(self, space: gym.spaces.Dict, kind: str = "auto") -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.parts = nn.ModuleList()
        self.out_dim = 0
        for name, part in space.spaces.items():
            size = int(gym.spaces.flatdim(part))
            if is_image_space(part):
                encoder = _image_encoder(part, kind, f"Dict part {name!r}")
                self.out_dim += encoder.out_dim
            elif isinstance(part, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiBinary):
                encoder = nn.Identity()
                self.out_dim += size
            else:
                raise ConfigError(
                    f"Dict observation part {name!r} is {part}, which phalanx cannot encode; supported "
                    "parts: Box (vectors and images), Discrete (one-hot), MultiBinary. Convert that part"
                    " with a Gymnasium observation wrapper, or leave it out."
                )
            self.sizes.append(size)
            self.parts.append(encoder)

    def forward(self, obs: Tensor) -> Tensor:
        pieces = torch.split(obs, self.sizes, dim=-1)
        return torch.cat([encoder(piece) for encoder, piece in zip(self.parts, pieces, strict=True)], dim=-1)


def _image_encoder(space: gym.spaces.Box, kind: str, where: str) -> ImageEncoder:
    if kind == "impala":
        return ImpalaCNN(space)
    if kind == "nature":  # asked for: a ConfigError for images under 36x36, not another CNN
        return NatureCNN(space)
    if kind == "auto":
        height, width = image_layout(space)[0][1:]
        return NatureCNN(space) if min(height, width) >= 36 else ImpalaCNN(space)
    raise ConfigError(
        f"encoder {kind!r} cannot read the images of {where} ({space}): an MLP needs flat vectors. Use "
        "encoder 'auto' (a CNN chosen for the image size), 'nature' or 'impala'."
    )


def feature_encoder(space: gym.Space, kind: str = "auto") -> tuple[nn.Module | None, int]:
    """The encoder of observations of ``space`` and the size of its features: ``(None, obs_dim)`` for a
    1-D Box (its observations are the features); a CNN for images (``auto``: Nature for 36x36 or more,
    IMPALA below); a :class:`DictEncoder` for a Dict. A ConfigError names the space and the fix where
    ``kind`` cannot read it."""
    if kind not in ENCODERS:
        raise ConfigError(f"unknown encoder {kind!r}; valid encoders: {', '.join(ENCODERS)}.")
    if isinstance(space, gym.spaces.Dict):
        encoder: nn.Module = DictEncoder(space, kind)
        return encoder, encoder.out_dim
    if is_image_space(space):
        encoder = _image_encoder(space, kind, "the observation space")
        return encoder, encoder.out_dim
    if kind in ("nature", "impala"):
        raise ConfigError(
            f"encoder {kind!r} is a CNN for images, but the observation space {space} is not an image space "
            "((C, H, W) or (H, W, C) Box). Use encoder 'auto' or 'mlp'."
        )
    return None, obs_dim(space)


# -- spaces ------------------------------------------------------------------------------------------

SUPPORTED_SPACES = "observations: a 1-D Box; actions: Discrete, MultiDiscrete or Box"


def observation_kind(space: gym.Space) -> str | None:
    """What an algorithm must read to learn from ``space``: "flat" (a 1-D Box), "image"
    (:func:`is_image_space`), "dict" (a Dict, its parts checked by :class:`DictEncoder`), or None (a
    space no phalanx network reads)."""
    if isinstance(space, gym.spaces.Dict):
        return "dict"
    if is_image_space(space):
        return "image"
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return "flat"
    return None


def observation_shape(space: gym.Space) -> tuple[int, ...]:
    """The shape of one observation tensor of ``space``: a Dict's is its flat vector
    ``(gymnasium.spaces.flatdim(space),)`` (Dict observations arrive flattened), any other's its shape."""
    if isinstance(space, gym.spaces.Dict):
        return (int(gym.spaces.flatdim(space)),)
    return tuple(int(size) for size in space.shape)


def obs_dim(space: gym.Space) -> int:
    """Size of a flat (1-D Box) observation space; a ConfigError for any other space."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ConfigError(
            f"unsupported observation space {space}: the MLP networks need a 1-D Box observation space "
            f"(supported: {SUPPORTED_SPACES}). Flatten the observations with a wrapper first."
        )
    return int(space.shape[0])


def multi_discrete_sizes(action_space: gym.spaces.MultiDiscrete) -> tuple[int, ...]:
    """``nvec`` of a MultiDiscrete action space as a policy reads it; a ConfigError where it is not a
    flat vector of dims starting at 0."""
    if action_space.nvec.ndim != 1:
        raise ConfigError(
            f"unsupported action space {action_space}: a MultiDiscrete action space must be a vector of "
            f"dims (nvec of shape (k,)), but nvec has shape {action_space.nvec.shape}. Flatten it with an "
            "action wrapper (gymnasium.spaces.MultiDiscrete(nvec.flatten()))."
        )
    if np.any(action_space.start != 0):  # RescaleAction presents every integer space from 0
        raise ConfigError(
            f"unsupported action space {action_space}: a policy acts from 0 (start="
            f"{action_space.start.tolist()}); build the env with phalanx's wrappers (RescaleAction)."
        )
    return tuple(int(size) for size in action_space.nvec)
