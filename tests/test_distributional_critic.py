"""The critic options of DDPG, TD3 and SAC: a LayerNorm per critic, and categorical (C51) critics.

The projection and the reduction of target distributions (``phalanx.algos.distributional``), a
categorical loss that falls on a fixed target, the per-member LayerNorm against ``nn.LayerNorm``,
checkpoints, the compiled step against the eager one, a vectorized population's members against their
single runs, the bad settings refused before a run exists, and the CLI end to end.
"""

from __future__ import annotations

import io
import json

import gymnasium as gym
import pytest
import torch
from test_population_vectorized_off_policy import assert_member_equals_run, single_run, small_config
from torch import nn

import phalanx
from phalanx.algos.ddpg import critic_values
from phalanx.algos.distributional import (
    expected_values,
    project_distribution,
    reduce_distributions,
)
from phalanx.algos.sac import SAC
from phalanx.algos.td3 import TD3
from phalanx.buffers import ReplayBatch
from phalanx.cli import main
from phalanx.compiling import compile_problem
from phalanx.config import load_yaml
from phalanx.errors import ConfigError
from phalanx.nets import EnsembleLayerNorm, EnsembleMLP, mlp
from phalanx.population.vectorized_off_policy import VectorizedTD3

OBS_DIM, ACTION_DIM, BATCH = 3, 2, 32
CATEGORICAL = dict(critic_atoms=51, v_min=-10.0, v_max=10.0, critic_layer_norm=True)
ALGORITHMS = {"td3": TD3, "sac": SAC}


def build(algo: str, seed: int = 0, **settings):
    config = phalanx.make_config(algo, "Pendulum-v1", use_preset=False, hidden_sizes=[16, 16], **settings)
    config.validate()
    torch.manual_seed(seed)
    spaces = (gym.spaces.Box(-1, 1, (OBS_DIM,)), gym.spaces.Box(-1, 1, (ACTION_DIM,)))
    return ALGORITHMS[algo](config.hyperparameters, *spaces, torch.device("cpu"))


def random_batch(seed: int, discount: float = 0.99) -> ReplayBatch:
    generator = torch.Generator().manual_seed(seed)
    return ReplayBatch(
        torch.randn(BATCH, OBS_DIM, generator=generator),
        torch.rand(BATCH, ACTION_DIM, generator=generator) * 2 - 1,
        3 * torch.randn(BATCH, generator=generator),
        torch.randn(BATCH, OBS_DIM, generator=generator),
        discount * (torch.rand(BATCH, generator=generator) > 0.1).float(),
    )


def round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# -- the projection and the target ------------------------------------------------------------------
def test_projection_conserves_mass_keeps_atoms_and_clips_to_the_ends():
    support = torch.linspace(-10.0, 10.0, 21)
    probabilities = torch.rand(3, 8, 21).softmax(dim=-1)  # K = 3 critics, B = 8
    rewards, discounts = 4 * torch.randn(1, 8), torch.rand(1, 8)
    projected = project_distribution(probabilities, support, rewards, discounts)
    torch.testing.assert_close(projected.sum(dim=-1), torch.ones(3, 8))
    assert projected.min() >= 0

    point_masses = torch.eye(21)  # row i: all mass on atom i
    zero, one = torch.zeros(21), torch.ones(21)
    torch.testing.assert_close(project_distribution(point_masses, support, zero, one), point_masses)
    top = project_distribution(point_masses, support, torch.full((21,), 25.0), one)
    assert torch.equal(top[:, -1], one)  # r + z beyond v_max for every atom: all on the top atom
    bottom = project_distribution(point_masses, support, torch.full((21,), -50.0), 0.5 * one)
    assert torch.equal(bottom[:, 0], one)
    # 2.25 lies between the atoms 2 and 3 at a quarter of the way: 3/4 and 1/4 of the mass
    between = project_distribution(point_masses[10], support, torch.tensor(2.25), torch.tensor(1.0))
    torch.testing.assert_close(between[12:14], torch.tensor([0.75, 0.25]))
    assert between.sum() == pytest.approx(1.0) and between[12:14].sum() == pytest.approx(1.0)


def test_expected_values_and_the_reduction_over_critics():
    support = torch.tensor([-1.0, 0.0, 2.0])
    assert float(expected_values(torch.tensor([0.5, 0.25, 0.25]), support)) == pytest.approx(0.0)
    first = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])  # expected 2, -1
    second = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # expected 0, 2
    critics = torch.stack([first, second])  # (K = 2, B = 2, atoms)
    smallest = reduce_distributions(critics, support, "min")
    assert torch.equal(smallest, torch.stack([second[0], first[1]]))  # per sample, not per critic
    torch.testing.assert_close(reduce_distributions(critics, support, "mean"), critics.mean(dim=0))


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_updates_lower_the_categorical_loss_towards_a_fixed_target(algo):
    """Terminal transitions (discount 0): the target is each reward on the atoms, which the critics learn."""
    algorithm = build(algo, critic_learning_rate=3e-3, **CATEGORICAL)
    batch = random_batch(0, discount=0.0)
    losses = [float(algorithm.update(batch, 0.0)["critic_loss"]) for _ in range(150)]
    assert losses[0] > 2 * 3.5  # two critics near the uniform distribution, ln 51 = 3.9 each
    assert losses[-1] < losses[0] - 3.0
    values = critic_values(algorithm.critic, batch.obs, batch.actions, algorithm.config)  # (K, B)
    assert values.shape == (2, BATCH)
    assert torch.corrcoef(torch.stack([values[0], batch.rewards]))[0, 1] > 0.9


# -- LayerNorm per critic ----------------------------------------------------------------------------
def test_each_critic_has_its_own_layer_norm_as_nn_layer_norm_computes():
    torch.manual_seed(0)
    ensemble = EnsembleMLP(3, 5, (8, 8), 4, "relu", layer_norm=True)
    norms = [layer for layer in ensemble.layers if isinstance(layer, EnsembleLayerNorm)]
    assert len(norms) == 2 and all(norm.weight.shape == norm.bias.shape == (3, 1, 8) for norm in norms)
    with torch.no_grad():  # distinct affine weights per member
        for norm in norms:
            norm.weight.normal_()
            norm.bias.normal_()
    inputs = torch.randn(10, 5)
    outputs = ensemble(inputs)  # (3, 10, 4)
    for member in range(3):
        standalone = ensemble.member(member)
        assert sum(isinstance(layer, nn.LayerNorm) for layer in standalone) == 2
        assert torch.equal(standalone[1].weight, norms[0].weight[member, 0])
        torch.testing.assert_close(outputs[member], standalone(inputs))
    again = EnsembleMLP.from_mlps([ensemble.member(member) for member in range(3)])
    torch.testing.assert_close(again(inputs), outputs)
    plain = mlp(5, (8, 8), 4, "relu", layer_norm=True)
    torch.testing.assert_close(EnsembleMLP.from_mlps([plain])(inputs)[0], plain(inputs))


def test_the_critic_options_shape_the_critics_and_nothing_else():
    default, categorical = build("td3", seed=1), build("td3", seed=1, **CATEGORICAL)
    assert not any(isinstance(layer, EnsembleLayerNorm) for layer in default.critic.layers)
    assert (default.critic.out_dim, categorical.critic.out_dim) == (1, 51)
    assert categorical.critic_target.layer_norm and categorical.critic.layer_norm
    for mine, theirs in zip(default.actor.parameters(), categorical.actor.parameters(), strict=True):
        assert torch.equal(mine, theirs)  # the same draws before and after the critics


# -- checkpoints, the compiled step, populations ----------------------------------------------------
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_a_checkpoint_of_categorical_critics_resumes_exactly(algo):
    algorithm = build(algo, policy_delay=1, **CATEGORICAL)
    for index in range(2):
        algorithm.update(random_batch(index), 0.0)
    resumed = build(algo, seed=5, policy_delay=1, **CATEGORICAL)
    resumed.load_state_dict(round_trip(algorithm.state_dict()))
    batch = random_batch(7)
    results = []
    for learner in (algorithm, resumed):
        torch.manual_seed(3)
        results.append(learner.update(batch, 0.0))
    for name, value in results[0].items():
        assert torch.equal(results[1][name], value), name
    for mine, theirs in zip(algorithm.critic.parameters(), resumed.critic.parameters(), strict=True):
        assert torch.equal(mine, theirs)


PROBLEM = compile_problem(torch.device("cpu"))


@pytest.mark.skipif(PROBLEM is not None, reason=f"cannot compile here: {PROBLEM}")
def test_the_compiled_step_computes_the_eager_one():
    """SAC's categorical critics (the entropy term shifting the target) compiled, on the same draws."""
    eager = build("sac", num_critics=3, target_reduction="mean", **CATEGORICAL)
    compiled = build("sac", num_critics=3, target_reduction="mean", **CATEGORICAL)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile()
    for index in range(2):
        results = []
        for learner in (eager, compiled):
            torch.manual_seed(index)
            results.append(learner.update(random_batch(index), 0.0))
        for name, value in results[0].items():
            torch.testing.assert_close(results[1][name], value, rtol=1e-4, atol=1e-5, msg=name)
    for mine, theirs in zip(eager.critic.parameters(), compiled.critic.parameters(), strict=True):
        torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-6)


def test_each_member_of_a_population_trains_as_its_own_single_run(tmp_path):
    settings = dict(critic_atoms=11, v_min=-60.0, v_max=5.0, critic_layer_norm=True)
    members = [(3, {"learning_rate": 1e-3}), (4, {"tau": 0.01, "target_noise": 0.3, "gamma": 0.95})]
    population = VectorizedTD3(small_config("td3", **settings), [3, 4], [values for _, values in members])
    metrics = population.train(96)
    assert metrics["critic_loss"].shape == (2,) and torch.isfinite(metrics["actor_loss"]).all()
    for member, (seed, values) in enumerate(members):
        assert_member_equals_run(
            population, member, single_run(tmp_path, "td3", seed, {**settings, **values})
        )
    population.close()


# -- bad input ----------------------------------------------------------------------------------------
RANGE = {"v_min": -1.0, "v_max": 1.0}


@pytest.mark.parametrize(
    "algo, settings, expected",
    [
        ("td3", {"critic_atoms": 1, **RANGE}, r"critic_atoms = 1 is invalid: expected an integer >= 2"),
        ("td3", {"critic_atoms": 5.5, **RANGE}, r"critic_atoms = 5.5 \(float\) is not a whole number"),
        (
            "sac",
            {"critic_atoms": 51},
            r"critic_atoms = 51 needs v_min and v_max.*got v_min = None.*r_max / \(1 - gamma\) = "
            r"100 \* r_max at gamma = 0.99.*`v_min: -250, v_max: 250` for rewards within \+-2.5.*"
            r"--v-min and --v-max",
        ),
        ("td3", {"critic_atoms": 5, "v_min": -1.0, "gamma": 0.98}, r"50 \* r_max.*`v_min: -125, v_max: 125`"),
        (
            "td3",
            {"critic_atoms": 51, "v_min": 5.0, "v_max": 5.0},
            r"v_max = 5.0 is invalid: expected a number above v_min = 5.0",
        ),
        ("sac", {"v_min": -10.0}, r"v_min = -10.0 is invalid: expected None without critic_atoms.*set"),
        ("td3", {"v_max": 10.0}, r"v_max = 10.0 is invalid: expected None without critic_atoms"),
        ("redq", {"critic_atoms": 51, **RANGE}, r"target_reduction = 'redq' is invalid.*drop critic_atoms"),
        ("matd3", {"critic_atoms": 51, **RANGE}, r"critic_atoms = 51 is invalid: expected None: matd3"),
        ("maddpg", {"critic_layer_norm": True}, r"critic_layer_norm = True .* False: maddpg"),
    ],
)
def test_bad_critic_settings_are_refused_before_the_run_dir(tmp_path, algo, settings, expected):
    env = "simple_spread_continuous" if algo.startswith("ma") else "Pendulum-v1"
    with pytest.raises(ConfigError, match=expected):
        config = phalanx.make_config(algo, env, use_preset=False, run_dir=str(tmp_path / "run"), **settings)
        phalanx.train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


# -- the CLI --------------------------------------------------------------------------------------------
def test_the_cli_trains_and_evaluates_with_the_critic_options(tmp_path, capsys):
    file = tmp_path / "fast.yaml"
    file.write_text(
        "hyperparameters:\n  critic_atoms: 31\n  v_min: -1600\n  v_max: 0\n  critic_layer_norm: true\n"
    )
    flags = ["--num-envs", "2", "--total-steps", "600", "--learning-starts", "64", "--batch-size", "32"]
    flags += ["--eval-episodes", "1", "--hidden-sizes", "16", "16"]
    td3, sac = tmp_path / "td3", tmp_path / "sac"
    code = main(["train", "td3", "Pendulum-v1", "--config", str(file), *flags, "--run-dir", str(td3)])
    assert code == 0, capsys.readouterr().err
    saved = load_yaml(td3 / "config.yaml")["hyperparameters"]
    assert (saved["critic_atoms"], saved["v_min"], saved["critic_layer_norm"]) == (31, -1600, True)
    assert json.loads((td3 / "summary.json").read_text())["total_steps"] == 600
    assert main(["eval", str(td3), "--episodes", "1"]) == 0
    sac_flags = ["--critic-atoms", "21", "--v-min", "-1600", "--v-max", "0", "--target-reduction", "mean"]
    assert main(["train", "sac", "Pendulum-v1", *sac_flags, *flags, "--run-dir", str(sac)]) == 0
    assert phalanx.load_agent(sac).algorithm.critic.out_dim == 21
