"""Networks: MLPs, ensembles of MLPs evaluated as one batched matmul, policy heads and value nets.

Policy heads compute log-probabilities, entropies and samples with plain tensor ops instead of
``torch.distributions`` objects: no argument validation, no object construction, no host syncs,
which matters when a whole rollout step is a handful of small kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import gymnasium as gym
import numpy as np
import torch
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
    """Discrete actions: an MLP gives logits ``(B, num_actions)``; actions are int64 ``(B,)``."""

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.logits_net = mlp(obs_dim, hidden_sizes, num_actions, activation, POLICY_OUTPUT_GAIN)

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
            (*obs.shape[:-1], self.num_actions),
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

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.mean_net = mlp(obs_dim, hidden_sizes, action_dim, activation, POLICY_OUTPUT_GAIN)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

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
            (*obs.shape[:-1], self.action_dim),
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


class ValueNet(nn.Module):
    """State value: an MLP from observations ``(B, obs_dim)`` to values ``(B,)``."""

    def __init__(
        self, obs_dim: int, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh"
    ) -> None:
        super().__init__()
        self.value_net = mlp(obs_dim, hidden_sizes, 1, activation, VALUE_OUTPUT_GAIN)

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


# -- spaces ------------------------------------------------------------------------------------------

SUPPORTED_SPACES = "observations: a 1-D Box; actions: Discrete (start 0) or Box"


def obs_dim(space: gym.Space) -> int:
    """Size of a flat (1-D Box) observation space; a ConfigError for any other space."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ConfigError(
            f"unsupported observation space {space}: the MLP networks need a 1-D Box observation space "
            f"(supported: {SUPPORTED_SPACES}). Flatten the observations with a wrapper first."
        )
    return int(space.shape[0])


def make_policy(
    observation_space: gym.Space,
    action_space: gym.Space,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
) -> CategoricalPolicy | GaussianPolicy:
    """The policy head for single-env spaces: Discrete -> Categorical, Box -> Gaussian (flattened)."""
    input_dim = obs_dim(observation_space)
    if isinstance(action_space, gym.spaces.Discrete):
        if int(action_space.start) != 0:
            raise ConfigError(
                f"unsupported action space {action_space}: Discrete action spaces must start at 0 "
                f"(start={int(action_space.start)}); shift the actions with a wrapper."
            )
        return CategoricalPolicy(input_dim, int(action_space.n), hidden_sizes, activation)
    if isinstance(action_space, gym.spaces.Box):
        action_dim = int(np.prod(action_space.shape))
        return GaussianPolicy(input_dim, action_dim, hidden_sizes, activation)
    raise ConfigError(
        f"unsupported action space {type(action_space).__name__} ({action_space}); "
        f"supported: {SUPPORTED_SPACES}."
    )
