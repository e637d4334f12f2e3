"""Networks: mlp init, ensembles equal to independent mlps, policy heads against torch.distributions."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from phalanx.nets import (
    ACTIVATIONS,
    CategoricalPolicy,
    EnsembleLinear,
    EnsembleMLP,
    GaussianPolicy,
    ValueNet,
    mlp,
    obs_dim,
)


def assert_orthogonal(weight: torch.Tensor, gain: float) -> None:
    """Every singular value of a (semi-)orthogonal matrix with ``gain`` equals ``gain``."""
    singular_values = torch.linalg.svdvals(weight.detach().double())
    torch.testing.assert_close(singular_values, torch.full_like(singular_values, gain), atol=1e-5, rtol=1e-5)


# -- mlp ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_mlp_shapes_and_layers(activation: str) -> None:
    network = mlp(4, (32, 16), 3, activation)
    assert [type(layer) for layer in network] == [
        nn.Linear,
        ACTIVATIONS[activation],
        nn.Linear,
        ACTIVATIONS[activation],
        nn.Linear,
    ]
    assert network(torch.randn(7, 4)).shape == (7, 3)
    assert network(torch.randn(2, 7, 4)).shape == (2, 7, 3)


def test_mlp_without_hidden_layers_is_one_linear() -> None:
    network = mlp(5, (), 2, output_gain=0.5)
    assert len(network) == 1 and isinstance(network[0], nn.Linear)
    assert network(torch.randn(3, 5)).shape == (3, 2)
    assert_orthogonal(network[0].weight, 0.5)


def test_mlp_orthogonal_init_and_zero_bias() -> None:
    torch.manual_seed(0)
    network = mlp(8, (16, 16, 4), 2, output_gain=0.01)
    linears = [layer for layer in network if isinstance(layer, nn.Linear)]
    # the square 16x16 layer: W W^T = gain^2 I
    square = linears[1].weight.detach().double()
    torch.testing.assert_close(square @ square.T, 2.0 * torch.eye(16, dtype=torch.float64), atol=1e-5, rtol=0)
    for layer in linears[:-1]:  # non-square ones: all singular values equal the gain
        assert_orthogonal(layer.weight, math.sqrt(2.0))
    assert_orthogonal(linears[-1].weight, 0.01)
    for layer in linears:
        assert torch.count_nonzero(layer.bias) == 0


def test_mlp_unknown_activation_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="swish") as error:
        mlp(2, (4,), 1, "swish")
    for name in ACTIVATIONS:
        assert name in str(error.value)


# -- ensembles ---------------------------------------------------------------------------------------


def test_ensemble_linear_shapes_init_and_forward() -> None:
    layer = EnsembleLinear(3, 6, 4, gain=2.0)
    assert layer.weight.shape == (3, 6, 4) and layer.bias.shape == (3, 1, 4)
    for member_weight in layer.weight:
        assert_orthogonal(member_weight, 2.0)
    assert torch.count_nonzero(layer.bias) == 0
    with torch.no_grad():
        layer.bias.normal_()
    per_member = torch.randn(3, 5, 6)  # (K, B, in)
    expected = torch.stack([per_member[k] @ layer.weight[k] + layer.bias[k] for k in range(3)])
    torch.testing.assert_close(layer(per_member), expected)
    shared = torch.randn(5, 6)  # (B, in)
    expected = torch.stack([shared @ layer.weight[k] + layer.bias[k] for k in range(3)])
    torch.testing.assert_close(layer(shared), expected)
    with pytest.raises(ValueError, match=r"\(K=3, B, 6\)"):
        layer(torch.randn(2, 5, 6))


def test_ensemble_mlp_init_is_per_member_orthogonal() -> None:
    ensemble = EnsembleMLP(4, 3, (8, 8), 2, output_gain=0.01)
    for index in range(4):
        linears = [layer for layer in ensemble.member(index) if isinstance(layer, nn.Linear)]
        for layer in linears[:-1]:
            assert_orthogonal(layer.weight, math.sqrt(2.0))
        assert_orthogonal(linears[-1].weight, 0.01)
    first_layer = ensemble.layers[0].weight
    assert not torch.allclose(first_layer[0], first_layer[1])  # members are initialised independently


@pytest.mark.parametrize("shared_input", [False, True], ids=["per-member-input", "shared-input"])
@pytest.mark.parametrize("activation", ["tanh", "relu", "gelu"])
def test_ensemble_mlp_equals_independent_mlps(shared_input: bool, activation: str) -> None:
    torch.manual_seed(1)
    num_members, batch, in_dim, out_dim = 5, 7, 3, 2
    mlps = [mlp(in_dim, (16, 8), out_dim, activation) for _ in range(num_members)]
    for network in mlps:  # nonzero biases, so that a bias mix-up would show
        for layer in network:
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.bias)
    ensemble = EnsembleMLP.from_mlps(mlps)
    x = torch.randn(batch, in_dim) if shared_input else torch.randn(num_members, batch, in_dim)
    member_inputs = [x if shared_input else x[k] for k in range(num_members)]

    output = ensemble(x)  # (K, B, out)
    expected = torch.stack([network(member_x) for network, member_x in zip(mlps, member_inputs, strict=True)])
    assert output.shape == (num_members, batch, out_dim)
    torch.testing.assert_close(output, expected)

    output_weights = torch.randn(num_members, batch, out_dim)
    (output * output_weights).sum().backward()
    (expected * output_weights).sum().backward()
    ensemble_linears = [layer for layer in ensemble.layers if isinstance(layer, EnsembleLinear)]
    for k, network in enumerate(mlps):
        linears = [layer for layer in network if isinstance(layer, nn.Linear)]
        for ensemble_layer, layer in zip(ensemble_linears, linears, strict=True):
            torch.testing.assert_close(ensemble_layer.weight.grad[k], layer.weight.grad.T)
            torch.testing.assert_close(ensemble_layer.bias.grad[k, 0], layer.bias.grad)

    for k, network in enumerate(mlps):
        member = ensemble.member(k)
        assert str(member) == str(network)
        for member_parameter, parameter in zip(member.parameters(), network.parameters(), strict=True):
            torch.testing.assert_close(member_parameter, parameter)
        torch.testing.assert_close(member(member_inputs[k]), output[k])


def test_ensemble_member_is_a_copy() -> None:
    ensemble = EnsembleMLP(2, 3, (4,), 1)
    member = ensemble.member(0)
    before = ensemble.layers[0].weight[0].clone()
    with torch.no_grad():
        member[0].weight.add_(1.0)
    torch.testing.assert_close(ensemble.layers[0].weight[0], before)
    with pytest.raises(IndexError):
        ensemble.member(2)


def test_from_mlps_rejects_mixed_architectures() -> None:
    with pytest.raises(ValueError, match=r"mlps\[1\]"):
        EnsembleMLP.from_mlps([mlp(3, (4,), 1), mlp(3, (5,), 1)])
    with pytest.raises(ValueError, match=r"mlps\[1\]"):
        EnsembleMLP.from_mlps([mlp(3, (4,), 1, "tanh"), mlp(3, (4,), 1, "relu")])


# -- policies ----------------------------------------------------------------------------------------


def categorical_policy_with_spread_logits() -> CategoricalPolicy:
    """A categorical policy whose logits are far from uniform (the 0.01 output gain makes them flat)."""
    torch.manual_seed(2)
    policy = CategoricalPolicy(4, 5, (16,), "tanh")
    with torch.no_grad():
        policy.logits_net[-1].weight.mul_(200.0)
        policy.logits_net[-1].bias.copy_(torch.tensor([2.0, -1.0, 0.0, 1.0, -3.0]))
    return policy


def test_categorical_log_prob_entropy_match_torch_distributions() -> None:
    policy = categorical_policy_with_spread_logits()
    obs = torch.randn(64, 4)
    actions = torch.randint(0, 5, (64,))
    log_prob, entropy = policy.log_prob_entropy(obs, actions)
    reference = Categorical(logits=policy(obs))
    assert log_prob.shape == entropy.shape == (64,)
    torch.testing.assert_close(log_prob, reference.log_prob(actions))
    torch.testing.assert_close(entropy, reference.entropy())

    sampled, sampled_log_prob = policy.sample(obs)
    assert sampled.dtype == torch.int64 and sampled.shape == (64,)
    torch.testing.assert_close(sampled_log_prob, reference.log_prob(sampled))


def test_categorical_entropy_is_finite_for_extreme_logits() -> None:
    policy = CategoricalPolicy(2, 3, ())
    with torch.no_grad():
        policy.logits_net[0].bias.copy_(torch.tensor([0.0, 1e4, -1e4]))
    _, entropy = policy.log_prob_entropy(torch.zeros(1, 2), torch.tensor([1]))
    assert torch.isfinite(entropy).all()


def test_categorical_deterministic_is_argmax() -> None:
    policy = categorical_policy_with_spread_logits()
    obs = torch.randn(32, 4)
    logits = policy(obs)
    action, log_prob = policy.sample(obs, deterministic=True)
    torch.testing.assert_close(action, logits.argmax(dim=-1))
    torch.testing.assert_close(policy.deterministic_action(obs), action)
    torch.testing.assert_close(log_prob, Categorical(logits=logits).log_prob(action))


def test_categorical_sampling_follows_the_probabilities() -> None:
    policy = categorical_policy_with_spread_logits()
    obs = torch.randn(1, 4).expand(40_000, 4)
    actions, _ = policy.sample(obs)
    frequencies = torch.bincount(actions, minlength=5).float() / actions.numel()
    probs = torch.softmax(policy(obs[:1]), dim=-1)[0].detach()
    torch.testing.assert_close(frequencies, probs, atol=0.01, rtol=0)


def gaussian_policy() -> GaussianPolicy:
    torch.manual_seed(3)
    policy = GaussianPolicy(4, 3, (16,), "tanh", log_std_init=-0.5)
    with torch.no_grad():
        policy.log_std.copy_(torch.tensor([-0.5, 0.0, 0.7]))
        policy.mean_net[-1].weight.mul_(100.0)
    return policy


def test_gaussian_log_prob_entropy_match_torch_distributions() -> None:
    policy = gaussian_policy()
    obs = torch.randn(64, 4)
    actions = torch.randn(64, 3) * 2.0
    log_prob, entropy = policy.log_prob_entropy(obs, actions)
    mean, log_std = policy(obs)
    assert mean.shape == log_std.shape == (64, 3)
    reference = Normal(mean, log_std.exp())
    assert log_prob.shape == entropy.shape == (64,)
    torch.testing.assert_close(log_prob, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))

    sampled, sampled_log_prob = policy.sample(obs)
    assert sampled.shape == (64, 3)
    torch.testing.assert_close(sampled_log_prob, reference.log_prob(sampled).sum(-1))


def test_gaussian_deterministic_is_mean() -> None:
    policy = gaussian_policy()
    obs = torch.randn(16, 4)
    mean, log_std = policy(obs)
    action, log_prob = policy.sample(obs, deterministic=True)
    torch.testing.assert_close(action, mean)
    torch.testing.assert_close(policy.deterministic_action(obs), mean)
    torch.testing.assert_close(log_prob, Normal(mean, log_std.exp()).log_prob(mean).sum(-1))


def test_gaussian_sampling_statistics_and_log_std_gradient() -> None:
    policy = gaussian_policy()
    obs = torch.randn(1, 4).expand(40_000, 4)
    actions, _ = policy.sample(obs)
    mean = policy(obs[:1])[0][0].detach()
    torch.testing.assert_close(actions.mean(0), mean, atol=0.05, rtol=0)
    torch.testing.assert_close(actions.std(0), policy.log_std.exp().detach(), atol=0.05, rtol=0.02)

    log_prob, entropy = policy.log_prob_entropy(obs[:8], actions[:8].detach())
    (log_prob.sum() + entropy.sum()).backward()
    assert policy.log_std.grad is not None and torch.count_nonzero(policy.log_std.grad) == 3


@pytest.mark.parametrize("make", [categorical_policy_with_spread_logits, gaussian_policy])
def test_sampling_is_reproducible(make) -> None:
    policy = make()
    obs = torch.randn(32, 4)
    torch.manual_seed(10)
    first = policy.sample(obs)
    torch.manual_seed(10)
    second = policy.sample(obs)
    third = policy.sample(obs)
    torch.testing.assert_close(first, second)
    assert not torch.equal(first[0], third[0])

    generator = torch.Generator().manual_seed(11)
    from_generator = policy.sample(obs, generator=generator)
    generator.manual_seed(11)
    torch.manual_seed(99)  # the global RNG does not matter when a generator is given
    torch.testing.assert_close(policy.sample(obs, generator=generator), from_generator)


def test_policy_output_layer_gain() -> None:
    for network in (CategoricalPolicy(4, 3, (8,)).logits_net, GaussianPolicy(4, 3, (8,)).mean_net):
        assert_orthogonal(network[-1].weight, 0.01)
    assert_orthogonal(ValueNet(4, (8,)).value_net[-1].weight, 1.0)


def test_value_net_shape() -> None:
    value_net = ValueNet(4, (32, 32), "relu")
    assert value_net(torch.randn(9, 4)).shape == (9,)


# -- spaces ------------------------------------------------------------------------------------------


def test_obs_dim() -> None:
    assert obs_dim(gym.spaces.Box(-1.0, 1.0, (7,), np.float32)) == 7
    with pytest.raises(ValueError, match="Discrete"):
        obs_dim(gym.spaces.Discrete(4))
