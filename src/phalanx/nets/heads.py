"""Policy heads and value nets: an MLP (with an optional observation encoder in front) and the
distribution it parameterises.

Policy heads compute log-probabilities, entropies and samples with plain tensor ops instead of
``torch.distributions`` objects: no argument validation, no object construction, no host syncs,
which matters when a whole rollout step is a handful of small kernels.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from phalanx.errors import ConfigError
from phalanx.nets.encoders import ImageEncoder
from phalanx.nets.mlp import MLP, POLICY_OUTPUT_GAIN, VALUE_OUTPUT_GAIN, mlp

Tensor = torch.Tensor

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


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


HeadT = TypeVar("HeadT", bound=nn.Module)
"""A policy head or value net (:func:`head_on_features` gives a view of the same class)."""


def encoder_observation_rank(encoder: nn.Module | None) -> int:
    """The rank of one observation a head with ``encoder`` reads: an image encoder's image rank (2 or 3);
    1 otherwise (flat vectors, and Dict observations, which arrive flattened)."""
    return len(encoder.image_shape) if isinstance(encoder, ImageEncoder) else 1


def head_encoder(network: nn.Sequential) -> nn.Module | None:
    """The encoder in front of a head's MLP (:func:`head_mlp`), or None for a flat head."""
    first = network[0]
    return None if isinstance(first, nn.Linear) else first


def head_on_features(head: HeadT) -> HeadT:
    """A view of a policy head or value net built with an encoder that reads the encoder's features
    instead of observations: the same MLP layers (the same parameters, trained through either), without
    the encoder in front. With an encoder shared by the policy and the value function, the trunk then
    runs once per batch for both (``encoder(obs)``, then each view on the features)."""
    view: Any = copy.copy(head)  # Any: it gains observation_rank below
    view._modules = dict(head._modules)  # the view's own table of submodules, the modules themselves shared
    for name, network in head.named_children():
        if isinstance(network, MLP) and head_encoder(network) is not None:
            view._modules[name] = network[1:]
    view.observation_rank = 1
    return view


def _output_layer(network: nn.Sequential) -> nn.Linear:
    """The last layer of a head's MLP (:func:`head_mlp`): a Linear."""
    layer = network[-1]
    assert isinstance(layer, nn.Linear), f"a head's MLP ends with a Linear, not {layer}"
    return layer


@dataclass(frozen=True)
class ActionNoise:
    """The random draw of one sampled action, per observation row: ``size`` float values, uniform in
    [0, 1) (``distribution`` "uniform") or standard normal ("normal"). A policy that samples from a
    given draw (``sample(obs, noise=...)``) is a function of tensors, so that it can be exported."""

    distribution: str
    size: int


def log_softmax_actions_first(logits: Tensor) -> Tensor:
    """Log-probabilities ``(A, B...)`` of logits ``(B..., A)``: ``log_softmax(logits, -1)``, actions first.

    With few actions, reducing over the short, contiguous last dim is slow on CPU (one tiny
    reduction per row, and on 2+ threads a parallel region even for 10 rows); reducing over dim 0 of
    the transposed view vectorises across the batch instead. Same values, 2-5x faster here.
    """
    return torch.log_softmax(logits.movedim(-1, 0), dim=0)  # (A, B...)


class PolicyHead(nn.Module):
    """What the policy heads share: a sample is drawn in two parts, the random draw of
    :meth:`draw_noise` (as :attr:`action_noise` says) and :meth:`sample_from`, a function of it."""

    observation_rank = 1
    """The rank of one observation (:func:`encoder_observation_rank`): the batch dims are the others."""

    @property
    def action_noise(self) -> ActionNoise:
        """What :meth:`draw_noise` draws per observation row."""
        raise NotImplementedError

    @property
    def noise_dtype(self) -> torch.dtype:
        """The dtype of the draw: the head's parameters'."""
        raise NotImplementedError

    def draw_noise(self, obs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The random draw of one :meth:`sample` of ``obs`` ``(B, obs_dim)``: ``(B, action_noise.size)``
        values, uniform in [0, 1) or standard normal."""
        draw = torch.rand if self.action_noise.distribution == "uniform" else torch.randn
        return draw(
            (*obs.shape[: -self.observation_rank], self.action_noise.size),
            generator=generator,
            device=obs.device,
            dtype=self.noise_dtype,
        )

    def sample(
        self,
        obs: Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(action, log_prob)`` of observations ``obs``: :meth:`sample_from` the draw ``noise``, or
        deterministic, the most probable action.

        ``noise``: the draw of :meth:`draw_noise`, drawn by the caller (a compiled caller draws outside
        the graph); None draws it here from ``generator``: the same stream either way.
        """
        if deterministic:
            return self.sample_from(obs, None)
        return self.sample_from(obs, self.draw_noise(obs, generator) if noise is None else noise)

    def sample_from(self, obs: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(action, log_prob)`` of ``obs`` for the draw ``noise`` (None: the most probable action)."""
        raise NotImplementedError


class CategoricalPolicy(PolicyHead):
    """Discrete actions: an MLP gives logits ``(B, num_actions)``; actions are int64 ``(B,)``.

    ``encoder`` (from :func:`feature_encoder`): a network in front of the MLP, which then reads its
    ``obs_dim`` features; observations are ``(B, *obs_shape)`` of the encoder's space. None: the
    observations ``(B, obs_dim)`` are the features. (So for every head below.)
    """

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
        """Uniform noise ``(B, A)``, ``noise[b, a]`` for action a of row b (Gumbel noise once
        transformed)."""
        return ActionNoise("uniform", self.num_actions)

    @property
    def noise_dtype(self) -> torch.dtype:
        return _output_layer(self.logits_net).weight.dtype

    def sample_from(self, obs: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(action, log_prob)``, both ``(B,)``; without ``noise``, the argmax."""
        log_probs = log_softmax_actions_first(self(obs))  # (A, B)
        if noise is None:
            action = log_probs.argmax(dim=0)
        else:  # Gumbel-max trick: argmax(log p + Gumbel noise) ~ Categorical(p)
            # log p + Gumbel noise, as log p - log(-log u): the same bits (x - y is x + (-y)), one op less
            minus_gumbel = torch.log(-torch.log(noise)).movedim(-1, 0)  # u = 0 gives +inf: never chosen
            # max(...).indices, not argmax: the same index, but argmax over a short leading dim is slower
            action = (log_probs - minus_gumbel).max(dim=0).indices
        log_prob = log_probs.gather(0, action.unsqueeze(0)).squeeze(0)
        return action, log_prob

    def log_prob_entropy(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability of ``action`` ``(B,)`` and entropy of the policy, both ``(B,)``."""
        log_probs = log_softmax_actions_first(self(obs))  # (A, B)
        log_prob = log_probs.gather(0, action.long().unsqueeze(0)).squeeze(0)
        # as torch.distributions.Categorical: clamp so that 0 * log(0) gives 0 rather than nan
        log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
        entropy = -(log_probs.exp() * log_probs).sum(dim=0)
        return log_prob, entropy

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The most probable action ``(B,)``."""
        return self(obs).argmax(dim=-1)


class GaussianPolicy(PolicyHead):
    """Continuous actions: diagonal Gaussian with an MLP mean and a state-independent ``log_std``.

    The mean is unbounded; actions are clipped to the action space later, by an env wrapper.
    """

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
        """Standard normal noise ``(B, action_dim)``."""
        return ActionNoise("normal", self.action_dim)

    @property
    def noise_dtype(self) -> torch.dtype:
        return self.log_std.dtype

    def sample_from(self, obs: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(action (B, action_dim), log_prob (B,))``; without ``noise``, the mean."""
        mean, log_std = self(obs)
        if noise is None:
            action = mean
            log_prob = (-log_std - LOG_SQRT_2PI).sum(dim=-1)
        else:
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


class MultiCategoricalPolicy(PolicyHead):
    """MultiDiscrete actions: k independent categorical dims, dim i with ``nvec[i]`` actions; an MLP
    gives the logits of all dims at once (``sum(nvec)`` outputs); actions are int64 ``(B, k)``.

    The log-probability of an action is the sum over the dims, and so is the entropy. Internally the
    logits are laid out ``(B, k, n_max)`` with the ``n_max - nvec[i]`` missing actions of dim i at
    -inf (probability 0), so that every dim is sampled (Gumbel-max, as :class:`CategoricalPolicy`) and
    scored in one op; the random draw is uniform noise ``(B, k * n_max)``.
    """

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
        """Uniform noise ``(B, k * n_max)``, ``noise[b, i * n_max + a]`` for action a of dim i of row b
        (Gumbel noise once transformed)."""
        return ActionNoise("uniform", len(self.nvec) * self.max_actions)

    @property
    def noise_dtype(self) -> torch.dtype:
        return _output_layer(self.logits_net).weight.dtype

    def sample_from(self, obs: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(action (B, k), log_prob (B,))``; without ``noise``, each dim's argmax."""
        log_probs = self(obs)  # (B, k, n_max)
        if noise is None:
            action = log_probs.argmax(dim=-1)
        else:  # Gumbel-max per dim; a padded action (-inf) is never chosen, u < 1 keeps it finite
            minus_gumbel = torch.log(-torch.log(noise)).unflatten(-1, log_probs.shape[-2:])
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
