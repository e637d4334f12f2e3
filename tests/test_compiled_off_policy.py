"""The compiled off-policy update computes what the eager update computes, within float rounding.

After ``compile()`` the critics' and the actor's gradient steps of DDPG, TD3, SAC (REDQ's rule) and
DQN's step each run as one graph (``phalanx.gradient_step.GradientStep``), with every random draw
taken eagerly before them (``phalanx.algos.ddpg.draw``): the same generator, order and sizes as the
eager update, so the global RNG ends where the eager update leaves it. Updates (critics, delayed actor,
temperature, targets) must end where the eager ones end, checkpoints must cross between the modes, and
so for a 2-member VectorizedSAC. Each compile costs ~10 s or more here, so every compiled object is
built once per module (nets of [16, 16], one batch size: one graph per gradient step).
"""

from __future__ import annotations

import io
from typing import Any

import gymnasium as gym
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import phalanx
from phalanx.algos.ddpg import DDPG
from phalanx.algos.dqn import DQN
from phalanx.algos.sac import SAC
from phalanx.algos.td3 import TD3
from phalanx.buffers import ReplayBatch
from phalanx.compiling import compile_problem
from phalanx.population.vectorized_off_policy import VectorizedSAC

PROBLEM = compile_problem(torch.device("cpu"))
needs_compile = pytest.mark.skipif(PROBLEM is not None, reason=f"cannot compile here: {PROBLEM}")
TOLERANCE = dict(rtol=1e-4, atol=1e-6)
OBS_DIM, ACTION_DIM, NUM_ACTIONS, BATCH = 3, 2, 3, 32
UPDATES = 3  # TD3's actor steps at update 2 only (policy_delay 2); DQN's target moves at update 2
SETTINGS: dict[str, tuple[type, dict[str, Any], list[str]]] = {
    "ddpg": (DDPG, {}, ["critic update", "actor update"]),
    "td3": (TD3, {"policy_delay": 2}, ["critic update", "actor update"]),
    # SAC with REDQ's target (a random pair of 3 critics), its own entropy target and temperature rate
    "sac": (
        SAC,
        {
            "num_critics": 3,
            "target_reduction": "redq",
            "target_subset": 2,
            "target_entropy": -0.5,
            "alpha_learning_rate": 1e-2,
        },
        ["critic update", "actor update"],
    ),
    # D3QN, a tight gradient clip and Polyak targets every 2 updates
    "dqn": (
        DQN,
        {"double": True, "dueling": True, "max_grad_norm": 0.5, "target_update_interval": 2, "tau": 0.5},
        ["update"],
    ),
}


def random_batch(index: int, discrete: bool) -> ReplayBatch:
    generator = torch.Generator().manual_seed(index)
    if discrete:
        actions = torch.randint(NUM_ACTIONS, (BATCH,), generator=generator)
    else:
        actions = torch.rand(BATCH, ACTION_DIM, generator=generator) * 2 - 1
    return ReplayBatch(
        torch.randn(BATCH, OBS_DIM, generator=generator),
        actions,
        torch.randn(BATCH, generator=generator),
        torch.randn(BATCH, OBS_DIM, generator=generator),
        0.99 * (torch.rand(BATCH, generator=generator) > 0.1).float(),
    )


class Pair:
    """An eager and a compiled algorithm from the same initial state, updated on the same batches from
    the same global RNG state."""

    def __init__(self, name: str) -> None:
        algorithm_class, settings, self.names = SETTINGS[name]
        config = phalanx.make_config(name, "Pendulum-v1", use_preset=False, hidden_sizes=[16, 16], **settings)
        self.discrete = algorithm_class is DQN
        action_space = (
            gym.spaces.Discrete(NUM_ACTIONS) if self.discrete else gym.spaces.Box(-1, 1, (ACTION_DIM,))
        )
        spaces = (gym.spaces.Box(-1, 1, (OBS_DIM,)), action_space)
        self.build = lambda: algorithm_class(config.hyperparameters, *spaces, torch.device("cpu"))
        torch.manual_seed(0)
        self.initial = self.build()
        self.eager = self.build()
        self.compiled = self.build()
        for algorithm in (self.eager, self.compiled):
            algorithm.load_state_dict(self.initial.state_dict())
        self.compiled_names = [self.compiled.compile(), self.compiled.compile()]
        self.rng_states: list[list[torch.Tensor]] = []
        self.metrics = [self.update(index) for index in range(UPDATES)]

    def update(self, index: int, *others) -> tuple[dict, ...]:
        """Update the eager, the compiled and ``others`` on batch ``index``, each from the same global RNG
        state; records where each leaves the global RNG."""
        results, states = [], []
        batch = random_batch(index, self.discrete)
        for algorithm in (self.eager, self.compiled, *others):
            torch.manual_seed(100 + index)
            results.append(algorithm.update(batch, 0.0))
            states.append(torch.get_rng_state())
        self.rng_states.append(states)
        return tuple(results)


@pytest.fixture(
    scope="module",
    # SAC (the ensemble-critic rule, actor and alpha) in the default suite; the rest under -m slow
    params=[name if name == "sac" else pytest.param(name, marks=pytest.mark.slow) for name in SETTINGS],
)
def pair(request) -> Pair:
    if PROBLEM is not None:
        pytest.skip(f"cannot compile here: {PROBLEM}")
    return Pair(request.param)


def assert_same_state(first: Any, *others: Any) -> None:
    """Equal checkpoints (networks, targets, optimiser moments and steps, SAC's log alpha, counters),
    within float rounding."""
    want = first.state_dict()
    for other in others:
        assert_close_nested(other.state_dict(), want, "")


def assert_close_nested(got: Any, want: Any, where: str) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_close_nested(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, **TOLERANCE, msg=where)
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_close_nested(a, b, f"{where}/{index}")
    else:
        assert got == want, where


@needs_compile
def test_one_compiled_update_equals_the_eager_update(pair) -> None:
    assert pair.compiled_names == [pair.names, pair.names]  # and compile() is idempotent
    for eager, compiled in pair.metrics:
        assert eager.keys() == compiled.keys()
        for name, value in eager.items():
            torch.testing.assert_close(compiled[name], value, rtol=1e-4, atol=1e-5, msg=name)
    if isinstance(pair.eager, TD3):  # the delayed actor: a step at update 2 only
        assert ["actor_loss" in metrics for metrics, _ in pair.metrics] == [False, True, False]
    if isinstance(pair.eager, SAC):  # the temperature moved by its own step
        assert float(pair.compiled.log_alpha.detach()) != 0.0
    assert_same_state(pair.eager, pair.compiled)
    moved = [
        (a - b).abs().max() for a, b in zip(parameters(pair.eager), parameters(pair.initial), strict=True)
    ]
    assert max(moved) > 1e-4  # the updates did learn something


def parameters(algorithm: Any) -> list[torch.Tensor]:
    """Every parameter of the algorithm's networks and their targets."""
    modules = [value for value in algorithm.state_entries().values() if isinstance(value, nn.Module)]
    return [parameter for module in modules for parameter in module.parameters()]


@needs_compile
def test_the_compiled_update_draws_what_the_eager_update_draws(pair) -> None:
    """The draws stay outside the graph, from the same generator in the same sizes: the global RNG ends
    where the eager update leaves it."""
    for eager, compiled, *_ in pair.rng_states:
        assert torch.equal(eager, compiled)


def round_trip(state: dict) -> dict:
    """Through torch.save / torch.load(weights_only=True), as a checkpoint."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@needs_compile
def test_checkpoints_cross_between_eager_and_compiled(pair) -> None:
    """A compiled run's checkpoint resumes eagerly and an eager run's compiled (the steps read the
    optimiser state that load_state_dict put in place), and the graphs are reused."""
    from_compiled = pair.build()  # eager
    from_compiled.load_state_dict(round_trip(pair.compiled.state_dict()))
    pair.compiled.load_state_dict(round_trip(pair.eager.state_dict()))
    graphs = counters["stats"]["unique_graphs"]
    for index in range(UPDATES, UPDATES + 2):
        pair.update(index, from_compiled)
    assert counters["stats"]["unique_graphs"] == graphs
    assert_same_state(pair.eager, pair.compiled, from_compiled)


# -- the vectorized population -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def populations() -> tuple[VectorizedSAC, VectorizedSAC]:
    """An eager and a compiled VectorizedSAC of 2 members with their own learning rates, discounts and
    entropy targets, each after its warm-up and 16 rounds of updates."""
    if PROBLEM is not None:
        pytest.skip(f"cannot compile here: {PROBLEM}")
    config = phalanx.make_config(
        "sac",
        "Pendulum-v1",
        num_envs=2,
        hidden_sizes=(16, 16),
        learning_starts=32,
        batch_size=16,
        buffer_size=400,
        total_steps=1000,
        use_preset=False,
    )
    members = [
        {"learning_rate": 1e-3, "gamma": 0.95},
        {"learning_rate": 3e-3, "tau": 0.02, "target_entropy": -0.5, "alpha_learning_rate": 1e-2},
    ]
    eager, compiled = (VectorizedSAC(config, [1, 2], members) for _ in range(2))
    assert compiled.compile() == ["critic update", "actor update"]
    for _ in range(2):
        eager_metrics, compiled_metrics = eager.train(32), compiled.train(32)
    for name, value in eager_metrics.items():
        torch.testing.assert_close(
            compiled_metrics[name], value, rtol=1e-3, atol=1e-4, msg=name, equal_nan=True
        )
    return eager, compiled


def assert_same_members(eager: VectorizedSAC, compiled: VectorizedSAC) -> None:
    for eager_flat, compiled_flat in zip(eager.flats(), compiled.flats(), strict=True):
        for want, got in zip(eager_flat.tensors(), compiled_flat.tensors(), strict=True):
            torch.testing.assert_close(got, want, **TOLERANCE)
    for eager_generator, compiled_generator in zip(eager.generators, compiled.generators, strict=True):
        assert torch.equal(compiled_generator.get_state(), eager_generator.get_state())


@needs_compile
@pytest.mark.slow  # two more graphs (VectorizedSAC's critic and actor)
def test_compiled_population_update_equals_the_eager_one(populations) -> None:
    eager, compiled = populations
    assert eager.updates == compiled.updates > 0
    assert_same_members(eager, compiled)


@needs_compile
@pytest.mark.slow  # two more graphs (VectorizedSAC's critic and actor)
def test_population_states_cross_between_eager_and_compiled(populations) -> None:
    """An eager population's state resumes compiled, and a new learning rate compiles nothing."""
    eager, compiled = populations
    compiled.load_state_dict(round_trip(eager.state_dict()))
    for population in populations:
        population.set_hyperparameters(1, {"learning_rate": 2e-3, "critic_learning_rate": 1e-3})
    graphs = counters["stats"]["unique_graphs"]
    eager.train(16)
    compiled.train(16)
    assert counters["stats"]["unique_graphs"] == graphs
    assert_same_members(eager, compiled)
