"""VectorizedPQN: P PQN members as one batched run; each member trains as its own single run would."""

from __future__ import annotations

import pytest
import torch

import phalanx
from phalanx.cli import main
from phalanx.errors import ConfigError
from phalanx.optim import VectorizedAdam
from phalanx.population import Leaderboard, Mutation, PopulationConfig
from phalanx.population.vectorized_pqn import VectorizedPQN
from phalanx.train.trainer import Trainer

SMALL = dict(
    num_envs=4,
    horizon=16,
    hidden_sizes=(16, 16),
    minibatch_size=16,
    epochs=2,
    eval_episodes=2,
    torch_threads=1,
)
ROLLOUT = 4 * 16  # env steps per member per rollout


def small_config(**overrides) -> phalanx.TrainConfig:
    return phalanx.make_config("pqn", "CartPole-v1", use_preset=False, **{**SMALL, **overrides})


def single_run(tmp_path, name: str, seed: int, steps: int, **overrides) -> Trainer:
    """An ordinary run of ``steps`` env steps; evaluates every ``steps // 2`` (and so at the end)."""
    config = small_config(
        seed=seed, total_steps=steps, eval_every=steps // 2, run_dir=str(tmp_path / name), **overrides
    )
    trainer = Trainer(config, show_progress=False)
    trainer.train()
    trainer.close()
    return trainer


# -- independence: each member is its single run --------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "members"),
    [
        (
            {},  # PQN's defaults: LayerNorm, anneal_lr, gradient clipping
            [
                (1, {"learning_rate": 1e-3}),
                (2, {"learning_rate": 3e-3, "gamma": 0.9, "q_lambda": 0.3, "exploration_final": 0.2}),
                (3, {"max_grad_norm": 0.5, "exploration_fraction": 0.3, "exploration_initial": 0.5}),
            ],
        ),
        (
            {
                "layer_norm": False,
                "anneal_lr": False,
                "exploration_final_lowest": 0.01,
                "normalize_obs": True,
                "reward_scale": 0.1,
            },
            [
                (4, {"learning_rate": 2e-3, "max_grad_norm": None, "q_lambda": 1.0}),
                (5, {"learning_rate": 5e-4, "exploration_final": 0.1, "gamma": 0.95}),
            ],
        ),
    ],
    ids=["defaults", "no-layer-norm-spread-epsilons"],
)
def test_each_member_trains_as_its_own_single_run(tmp_path, settings, members):
    """Different seeds and hyperparameters; an evaluation halfway on both sides must not disturb the
    training RNG or envs of either. The member's checkpoint (member_agent_state) is its single run's."""
    steps = 4 * ROLLOUT
    config = small_config(total_steps=steps, **settings)  # total_steps: the horizon of the schedules
    population = VectorizedPQN(config, [seed for seed, _ in members], [values for _, values in members])
    population.train(steps // 2)
    population.evaluate(2)
    metrics = population.train(steps // 2)
    assert population.steps == steps
    assert all(value.shape == (len(members),) for value in metrics.values())
    for member, (seed, values) in enumerate(members):
        trainer = single_run(tmp_path, f"run{member}", seed, steps, **settings, **values)
        assert trainer.learner.updates == population.updates == 4
        single = trainer.algorithm.state_dict()
        state = population.member_agent_state(member)["algorithm"]
        mine = [*state["q_network"].values(), *state["optimizer"]["state"][0].values()]
        theirs = [*single["q_network"].values(), *single["optimizer"]["state"][0].values()]
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"member {member}, tensor {index}")
        assert torch.equal(state["exploration_decay"], single["exploration_decay"])
        assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(
            single["optimizer"]["param_groups"][0]["lr"]
        )
    population.close()


def test_the_rectified_vectorized_adam_is_torchs_radam_per_member():
    """RAdam's first steps (rho_t <= 5: momentum only) and the rectified ones after, per member."""
    torch.manual_seed(0)
    rates = torch.tensor([1e-2, 3e-3], dtype=torch.float64)
    singles = [torch.nn.Parameter(torch.randn(7)) for _ in rates]
    optimizers = [torch.optim.RAdam([p], lr=float(rate)) for p, rate in zip(singles, rates, strict=True)]
    parameters = torch.stack([p.detach().clone() for p in singles])
    gradients = torch.zeros_like(parameters)
    members = VectorizedAdam(parameters, gradients, eps=1e-8, rectified=True)
    for _ in range(12):
        gradients.copy_(torch.randn_like(gradients))
        for parameter, optimizer, gradient in zip(singles, optimizers, gradients, strict=True):
            parameter.grad = gradient.clone()
            optimizer.step()
        members.step(rates)
        torch.testing.assert_close(parameters, torch.stack([p.detach() for p in singles]))


def test_the_gradient_step_function_is_the_eager_update(monkeypatch):
    """compile(): the members' gradient step as one function of tensors (torch.func, per-member clipping,
    the rectified rule); run uncompiled here, it gives the eager update's parameters."""
    monkeypatch.setattr("phalanx.gradient_step.compiled_method", lambda method: method)
    values = [{"max_grad_norm": 0.1}, {"learning_rate": 1e-3, "max_grad_norm": None}]
    eager, functional = (VectorizedPQN(small_config(), [1, 2], values) for _ in range(2))
    assert functional.compile() == ["update"]
    for population in (eager, functional):
        population.train(2 * ROLLOUT)
    torch.testing.assert_close(eager.parameters, functional.parameters, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(eager.optimizer.exp_avg_sq, functional.optimizer.exp_avg_sq)
    eager.close()
    functional.close()


# -- hyperparameters and members -------------------------------------------------------------------
def test_set_hyperparameters_and_copy_member():
    population = VectorizedPQN(small_config(total_steps=4 * ROLLOUT), [0, 1, 2])
    population.train(ROLLOUT)
    population.set_hyperparameters(1, {"exploration_final": 0.3, "exploration_fraction": 1.0})
    assert population.member_config(1).hyperparameters.exploration_final == 0.3
    epsilons = population.member_epsilons()  # progress 1/4: decay 0.5 for the default fraction, 0.25 for 1
    assert epsilons[0].tolist() == pytest.approx([1 - 0.5 * 0.95] * 4)
    assert epsilons[1].tolist() == pytest.approx([1 - 0.25 * 0.7] * 4)
    population.copy_member(2, 0)
    assert torch.equal(population.parameters[0], population.parameters[2])
    assert population.hyperparameters(0) == population.hyperparameters(2)  # the defaults: not copied
    population.train(ROLLOUT)  # the new values are usable
    population.close()


def test_a_saved_state_resumes_the_same_run():
    """The state dict holds the learner (weights, RAdam state, where the schedules stand), the envs and the
    generators: a new population loaded from it goes on as the first."""
    config = small_config(total_steps=4 * ROLLOUT)
    first = VectorizedPQN(config, [0, 1], [{"exploration_fraction": 0.2}, {}])
    first.train(2 * ROLLOUT)
    second = VectorizedPQN(config, [0, 1], [{"exploration_fraction": 0.2}, {}])
    second.load_state_dict(first.state_dict())
    for population in (first, second):
        population.train(ROLLOUT)
    assert torch.equal(first.parameters, second.parameters)
    assert torch.equal(first.member_epsilons(), second.member_epsilons())
    assert second.member_epsilons()[0].tolist() == pytest.approx([0.05] * 4)  # fraction 0.2: decayed
    first.close()
    second.close()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"layer_norm": False}, "layer_norm is shared by all members"),
        ({"horizon": 32}, "horizon is shared by all members"),
        ({"q_lambda": 1.5}, r"member 0: q_lambda = 1.5 is invalid: expected a value in \[0, 1\]"),
        ({"exploration_final": 1.2}, "exploration_final = 1.2 is invalid"),
        ({"gamma": None}, "gamma = None is invalid: expected a number"),
    ],
)
def test_bad_hyperparameters_are_config_errors(values, message):
    with pytest.raises(ConfigError, match=message):
        VectorizedPQN(small_config(), [0, 1], [values, {}])


def test_what_a_vectorized_pqn_population_refuses(tmp_path):
    with pytest.raises(
        ConfigError, match="encoder = 'nature' is not supported by VectorizedPQN.*--backend process"
    ):
        VectorizedPQN.check_config(small_config(encoder="nature"))
    lowest = small_config(exploration_final=0.2, exploration_final_lowest=0.1)
    with pytest.raises(ConfigError, match=r"member 1: exploration_final_lowest = 0.1 is invalid"):
        VectorizedPQN(lowest, [0, 1], [{}, {"exploration_final": 0.05}])
    with pytest.raises(ConfigError, match="trains PQN members"):
        VectorizedPQN(phalanx.make_config("dqn", "CartPole-v1"), [0])
    # A population file's base is refused by the population's validate, before its directory exists.
    directory = tmp_path / "pop"
    config = PopulationConfig(
        base=small_config(encoder="impala"), size=2, backend="vectorized", directory=str(directory)
    )
    with pytest.raises(ConfigError, match="encoder = 'impala' is not supported by VectorizedPQN"):
        config.validate()
    mutations = {"epochs": Mutation(choices=(1, 2))}
    with pytest.raises(ConfigError, match=r"shares \['epochs'\] across its members"):
        PopulationConfig(base=small_config(), size=2, backend="vectorized", mutations=mutations).validate()
    command = "population run pqn CartPole-v1 --backend vectorized --encoder nature --dir".split()
    assert main([*command, str(directory)]) == 2
    assert not directory.exists()


# -- the population API and CLI -----------------------------------------------------------------------
def test_a_vectorized_pqn_population_runs_from_the_command_line(tmp_path):
    directory = tmp_path / "pop"
    flags = "--size 3 --backend vectorized --interval 64 --replace-fraction 0.34 --total-steps 192"
    flags += " --num-envs 4 --horizon 16 --minibatch-size 16 --hidden-sizes 16 16 --eval-episodes 2"
    flags += " --torch-threads 1 --mutate learning_rate=perturb:0.8,1.25 exploration_final=steps:0.02,0.1"
    assert main(["population", "run", "pqn", "CartPole-v1", *flags.split(), "--dir", str(directory)]) == 0
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" and len(m.scores) == 3 for m in board.members.values())
    best = board.best()
    assert best is not None
    evaluation = phalanx.evaluate(directory / "best", episodes=2)  # an ordinary run: its score again
    assert evaluation.mean == pytest.approx(best.score)
