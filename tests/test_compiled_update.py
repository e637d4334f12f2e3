"""The compiled update computes what the eager update computes, within float rounding, on the same state.

A compiled gradient step (``phalanx.gradient_step.GradientStep``) differentiates the loss with torch.func over
the optimiser's flat parameter buffer and applies torch's Adam/RMSprop rule to the optimiser's own state
tensors: one update of PPO (discrete and continuous actions), A2C and the vectorized PPO population
must end where the eager update ends, checkpoints must cross between the modes, and an annealed
learning rate must not recompile. Each compile costs ~10 s or more here, so every compiled object is
built once per module (small nets, rollouts whose minibatches divide evenly: one graph each).
"""

from __future__ import annotations

import copy
import io

import gymnasium as gym
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import phalanx
from phalanx.algos.ppo import A2C, PPO
from phalanx.buffers import SCAN_MAX_ENVS, RolloutBuffer, StepLayout, compute_gae, compute_gae_scan
from phalanx.compiling import compile_problem
from phalanx.gradient_step import GradientStep
from phalanx.nets import mlp
from phalanx.optim import FlatAdam, FlatRAdam, FlatRMSprop, clip_grad_norm, gradients
from phalanx.population.vectorized import VectorizedPPO

PROBLEM = compile_problem(torch.device("cpu"))
needs_compile = pytest.mark.skipif(PROBLEM is not None, reason=f"cannot compile here: {PROBLEM}")
TOLERANCE = dict(rtol=1e-4, atol=1e-5)
NUM_ENVS = 4


# -- the pieces, eagerly: the update rules and the GAE scan --------------------------------------------
@pytest.mark.parametrize(
    ("flat_class", "torch_class", "kwargs"),
    [
        (FlatAdam, torch.optim.Adam, {"lr": 1e-2, "eps": 1e-5}),
        (FlatRAdam, torch.optim.RAdam, {"lr": 1e-2, "eps": 1e-5}),  # 20 steps: before and after rho_t > 5
        (FlatRMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.99, "eps": 1e-5}),
    ],
)
def test_gradient_step_is_torch_optimizer_step(flat_class, torch_class, kwargs) -> None:
    """The step's function, run eagerly, is backward + global clipping + torch's optimiser step."""
    torch.manual_seed(0)
    net = nn.Sequential(mlp(5, [16, 16], 3, "tanh"), nn.Linear(3, 2))
    reference = copy.deepcopy(net)
    optimizer = flat_class(list(net.parameters()), **kwargs)
    torch_optimizer = torch_class(reference.parameters(), **kwargs)

    def loss_of(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return module(x).pow(2).mean() + module(x).sin().sum()

    step = GradientStep(optimizer, [net], lambda x: (loss_of(net, x), {}), max_grad_norm=0.5)
    for seed in range(20):
        x = torch.randn(32, 5, generator=torch.Generator().manual_seed(seed))
        loss, _ = step(x)
        torch_optimizer.zero_grad()
        reference_loss = loss_of(reference, x)
        reference_loss.backward()
        clip_grad_norm(gradients(torch_optimizer), 0.5)
        torch_optimizer.step()
        torch.testing.assert_close(loss, reference_loss.detach(), **TOLERANCE)
    for got, want in zip(net.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    mine, theirs = optimizer.state_dict()["state"][0], torch_optimizer.state_dict()["state"]
    assert float(mine["step"]) == float(theirs[0]["step"]) == 20.0


def test_gradient_step_refuses_options_its_rule_lacks() -> None:
    net = nn.Linear(3, 2)
    optimizer = FlatAdam(list(net.parameters()), lr=1e-3, amsgrad=True)
    with pytest.raises(ValueError, match="amsgrad"):
        GradientStep(optimizer, [net], lambda x: (net(x).sum(), {}))
    with pytest.raises(ValueError, match="cover 0 of"):
        GradientStep(FlatAdam(list(net.parameters()), lr=1e-3), [nn.Linear(3, 2)], lambda x: (x.sum(), {}))


@pytest.mark.parametrize(("horizon", "num_envs"), [(1, 3), (5, 2), (128, 4), (37, 7), (8, SCAN_MAX_ENVS + 1)])
def test_gae_scan_equals_the_loop(horizon, num_envs) -> None:
    generator = torch.Generator().manual_seed(horizon)
    rewards, values, next_values = (torch.randn(horizon, num_envs, generator=generator) for _ in range(3))
    dones = torch.rand(horizon, num_envs, generator=generator) < 0.1
    terminated = dones & (torch.rand(horizon, num_envs, generator=generator) < 0.5)
    gamma = torch.linspace(0.9, 0.99, num_envs)  # one per row, as a vectorized population's
    for discount in (0.99, gamma):
        want = compute_gae(rewards, values, next_values, terminated, dones, discount, 0.95)
        got = compute_gae_scan(rewards, values, next_values, terminated, dones, discount, 0.95)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# -- one compiled update against one eager update ------------------------------------------------------
def random_rollout(discrete: bool, horizon: int) -> RolloutBuffer:
    """A rollout of random observations, rewards and episode ends, actions from a throwaway policy."""
    generator = torch.Generator().manual_seed(1)
    shape, dtype = ((), torch.int64) if discrete else ((2,), torch.float32)
    rollout = RolloutBuffer(horizon, NUM_ENVS, StepLayout((4,), torch.float32, shape, dtype), "cpu")
    for t in range(horizon):
        obs = torch.randn(NUM_ENVS, 4, generator=generator)
        actions = (
            torch.randint(2, (NUM_ENVS,), generator=generator)
            if discrete
            else torch.randn(NUM_ENVS, 2, generator=generator)
        )
        rollout.add(
            t,
            obs,
            actions,
            torch.randn(NUM_ENVS, generator=generator) - 0.7,
            torch.randn(NUM_ENVS, generator=generator),
            torch.randn(NUM_ENVS, generator=generator),
            torch.rand(NUM_ENVS, generator=generator) < 0.05,
            torch.rand(NUM_ENVS, generator=generator) < 0.1,
            torch.randn(NUM_ENVS, 4, generator=generator),
        )
    return rollout


class Pair:
    """An eager and a compiled algorithm from the same initial state, updated on the same data."""

    def __init__(self, name: str) -> None:
        algorithm_class = A2C if name == "a2c" else PPO
        discrete = name != "ppo-continuous"
        settings: dict = {"hidden_sizes": [16, 16], "anneal_lr": True}
        if algorithm_class is PPO:  # minibatches of 32 (one compiled graph), a KL stop after epoch 1
            settings.update(horizon=32, minibatch_size=32, epochs=2, clip_value=0.2, target_kl=1e-12)
        else:
            settings.update(horizon=8)
        config = phalanx.make_config(algorithm_class.name, "CartPole-v1", use_preset=False, **settings)
        spaces = (
            gym.spaces.Box(-1, 1, (4,)),
            gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-1, 1, (2,)),
        )
        self.build = lambda: algorithm_class(config.hyperparameters, *spaces, torch.device("cpu"))
        torch.manual_seed(0)
        self.eager = self.build()
        self.compiled = self.build()
        self.compiled.load_state_dict(self.eager.state_dict())
        assert self.compiled.compile() == ["update"] and self.compiled.compile() == ["update"]
        self.rollout = random_rollout(discrete, config.hyperparameters.horizon)
        self.metrics = [self.update(progress) for progress in (0.0, 0.25)]

    def update(self, progress: float, *others) -> tuple[dict, ...]:
        """One update of the eager, the compiled and ``others``, each from the same global RNG state."""
        results = []
        for algorithm in (self.eager, self.compiled, *others):
            torch.manual_seed(progress * 1000)
            results.append(algorithm.update(self.rollout, progress))
        return tuple(results)


@pytest.fixture(
    scope="module",
    # one compile in the default suite; the other rules under -m slow (each compile is ~10-30 s on 2 cores)
    params=[
        "ppo-discrete",
        pytest.param("ppo-continuous", marks=pytest.mark.slow),
        pytest.param("a2c", marks=pytest.mark.slow),
    ],
)
def pair(request) -> Pair:
    if PROBLEM is not None:
        pytest.skip(f"cannot compile here: {PROBLEM}")
    return Pair(request.param)


def assert_same_state(*algorithms) -> None:
    """Equal parameters and optimiser state (moments, step count, learning rate), within float rounding."""
    first, *others = algorithms
    state = first.optimizer.state_dict()
    for other in others:
        for mine, theirs in zip(first.parameters, other.parameters, strict=True):
            torch.testing.assert_close(theirs, mine, **TOLERANCE)
        other_state = other.optimizer.state_dict()
        assert other_state["param_groups"][0]["lr"] == state["param_groups"][0]["lr"]
        for name, value in state["state"][0].items():
            torch.testing.assert_close(other_state["state"][0][name], value, rtol=1e-4, atol=1e-8, msg=name)


@needs_compile
def test_one_compiled_update_equals_the_eager_update(pair) -> None:
    for eager, compiled in pair.metrics:
        assert eager.keys() == compiled.keys()
        for name, value in eager.items():
            torch.testing.assert_close(compiled[name], value, rtol=1e-3, atol=1e-5, msg=name)
        expected_steps = 1.0 if isinstance(pair.eager, A2C) else 4.0  # PPO: one epoch, then the KL stop
        assert float(compiled["gradient_steps"]) == expected_steps
    assert_same_state(pair.eager, pair.compiled)
    moved = [(a - b).abs().max() for a, b in zip(pair.eager.parameters, pair.build().parameters, strict=True)]
    assert max(moved) > 1e-4  # the updates did learn something


@needs_compile
def test_an_annealed_learning_rate_does_not_recompile(pair) -> None:
    graphs = counters["stats"]["unique_graphs"]
    rates = [float(pair.update(progress)[1]["learning_rate"]) for progress in (0.5, 0.75)]
    assert rates[0] > rates[1] > 0
    assert counters["stats"]["unique_graphs"] == graphs
    assert_same_state(pair.eager, pair.compiled)


def round_trip(state: dict) -> dict:
    """Through torch.save / torch.load(weights_only=True), as a checkpoint."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@needs_compile
def test_checkpoints_cross_between_eager_and_compiled(pair) -> None:
    """A compiled run's checkpoint resumes eagerly, and an eager run's compiled (the step reads the
    optimiser state that load_state_dict put in place, not the one it saw before)."""
    from_compiled = pair.build()  # eager
    from_compiled.load_state_dict(round_trip(pair.compiled.state_dict()))
    pair.compiled.load_state_dict(round_trip(pair.eager.state_dict()))
    pair.update(0.5, from_compiled)
    assert_same_state(pair.eager, pair.compiled, from_compiled)


# -- the vectorized population -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def populations() -> tuple[VectorizedPPO, VectorizedPPO]:
    """An eager and a compiled VectorizedPPO of 3 members (value clipping, no gradient clipping and a
    tight one), each after two rounds with an annealed learning rate."""
    if PROBLEM is not None:
        pytest.skip(f"cannot compile here: {PROBLEM}")
    config = phalanx.make_config(
        "ppo",
        "Pendulum-v1",
        num_envs=NUM_ENVS,
        horizon=16,
        hidden_sizes=(16, 16),
        minibatch_size=32,
        epochs=2,
        anneal_lr=True,
        total_steps=1000,
    )
    members = [
        {"learning_rate": 1e-3, "clip_value": 0.2},
        {"learning_rate": 3e-3, "max_grad_norm": None, "gamma": 0.95},
        {"learning_rate": 2e-3, "entropy_coef": 0.05, "max_grad_norm": 0.1},
    ]
    eager, compiled = (VectorizedPPO(config, [1, 2, 3], members) for _ in range(2))
    assert compiled.compile() == ["update"]
    for _ in range(2):
        eager_metrics, compiled_metrics = eager.train(64), compiled.train(64)
    for name, value in eager_metrics.items():
        torch.testing.assert_close(
            compiled_metrics[name], value, rtol=1e-3, atol=1e-4, msg=name, equal_nan=True
        )
    return eager, compiled


def assert_same_members(eager: VectorizedPPO, compiled: VectorizedPPO) -> None:
    torch.testing.assert_close(compiled.parameters, eager.parameters, **TOLERANCE)
    for name, value in eager.optimizer.state_dict().items():
        torch.testing.assert_close(
            compiled.optimizer.state_dict()[name], value, rtol=1e-4, atol=1e-8, msg=name
        )


@needs_compile
def test_compiled_population_update_equals_the_eager_one(populations) -> None:
    assert_same_members(*populations)


@needs_compile
def test_population_states_cross_between_eager_and_compiled(populations) -> None:
    eager, compiled = populations
    compiled.load_state_dict(round_trip(eager.state_dict()))
    graphs = counters["stats"]["unique_graphs"]
    eager.train(64)
    compiled.train(64)
    assert counters["stats"]["unique_graphs"] == graphs  # and a new learning rate compiles nothing
    assert_same_members(eager, compiled)
