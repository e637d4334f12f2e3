"""VectorizedSAC / VectorizedTD3: P off-policy members as one batched run, each as its own single run."""

from __future__ import annotations

import pytest
import torch
from test_population_vectorized import saved_and_loaded

import phalanx
from phalanx.config import save_yaml
from phalanx.errors import ConfigError
from phalanx.population.vectorized_off_policy import VectorizedOffPolicy, VectorizedSAC, VectorizedTD3
from phalanx.train.checkpoint import CheckpointManager
from phalanx.train.trainer import Trainer

SMALL = dict(num_envs=2, hidden_sizes=(8, 8), learning_starts=32, batch_size=16, buffer_size=400,
             eval_every=0, eval_episodes=2, log_every=10**6, use_preset=False)  # fmt: skip
STEPS = 96  # env steps per member: 32 of warm-up, then 64 with updates (and actor steps)


def small_config(algo: str, **overrides) -> phalanx.TrainConfig:
    return phalanx.make_config(algo, "Pendulum-v1", **{**SMALL, "total_steps": STEPS, **overrides})


def single_run(tmp_path, algo: str, seed: int, values: dict) -> Trainer:
    config = small_config(algo, seed=seed, run_dir=str(tmp_path / f"{algo}-{seed}"), **values)
    trainer = Trainer(config, show_progress=False)
    trainer.train()
    trainer.close()
    return trainer


def assert_member_equals_run(population: VectorizedOffPolicy, member: int, trainer: Trainer) -> None:
    """Member ``member``'s actor and critics (and targets) equal the single run's (float rounding only)."""
    algorithm = trainer.algorithm
    actor_net = population.actor[0] if isinstance(population, VectorizedTD3) else population.actor.net
    single_actor = algorithm.actor[0] if isinstance(population, VectorizedTD3) else algorithm.actor.net
    pairs = list(zip(actor_net.member(member).parameters(), single_actor.parameters(), strict=True))
    rows = slice(member * population.num_critics, (member + 1) * population.num_critics)
    for mine, theirs in (
        (population.critic, algorithm.critic),
        (population.critic_target, algorithm.critic_target),
    ):
        pairs += [(a[rows], b) for a, b in zip(mine.parameters(), theirs.parameters(), strict=True)]
    if isinstance(population, VectorizedSAC):
        pairs.append((population.log_alpha[member], algorithm.log_alpha))
    for index, (a, b) in enumerate(pairs):
        torch.testing.assert_close(
            a.detach(), b.detach(), atol=1e-5, rtol=1e-4, msg=f"member {member}, tensor {index}"
        )


@pytest.mark.parametrize(
    ("population_class", "algo", "members"),
    [
        (
            VectorizedSAC,
            "sac",
            [
                (1, {"learning_rate": 1e-3, "gamma": 0.95}),
                (
                    2,
                    {"learning_rate": 3e-3, "tau": 0.02, "target_entropy": -0.5, "alpha_learning_rate": 1e-2},
                ),
            ],
        ),
        (
            VectorizedTD3,
            "td3",
            [
                (3, {"learning_rate": 1e-3, "exploration_noise": 0.2}),
                (
                    4,
                    {
                        "critic_learning_rate": 2e-3,
                        "target_noise": 0.3,
                        "target_noise_clip": 0.2,
                        "tau": 0.01,
                    },
                ),
            ],
        ),
    ],
    ids=["sac", "td3"],
)
def test_each_member_trains_as_its_own_single_run(tmp_path, population_class, algo, members):
    population = population_class(small_config(algo), [seed for seed, _ in members], [v for _, v in members])
    metrics = population.train(STEPS)
    assert metrics["critic_loss"].shape == (len(members),)
    for member, (seed, values) in enumerate(members):
        assert_member_equals_run(population, member, single_run(tmp_path, algo, seed, values))
    population.close()


def test_bad_hyperparameters_are_refused():
    config = small_config("sac")
    with pytest.raises(ConfigError, match=r"member 1: tau = 2.0 is invalid"):
        VectorizedSAC(config, [1, 2], [{}, {"tau": 2.0}])
    with pytest.raises(
        ConfigError, match=r"unknown hyperparameter 'learning_rat'.*Did you mean learning_rate"
    ):
        VectorizedSAC(config, [1], [{"learning_rat": 1e-3}])
    with pytest.raises(ConfigError, match=r"hidden_sizes is shared by all members"):
        VectorizedSAC(config, [1], [{"hidden_sizes": (4,)}])
    with pytest.raises(
        ConfigError, match=r"VectorizedTD3 trains TD3 members, but the config's algo is 'sac'"
    ):
        VectorizedTD3(config, [1])


def test_state_dict_resumes_exactly_and_copy_member_copies():
    config = small_config("sac")
    population = VectorizedSAC(config, [1, 2], [{}, {"gamma": 0.9}])
    population.train(48)
    resumed = VectorizedSAC(config, [1, 2], [{}, {"gamma": 0.9}])
    resumed.load_state_dict(population.state_dict())
    population.train(16)
    resumed.train(16)
    for a, b in zip(population.flats(), resumed.flats(), strict=True):
        assert torch.equal(a.flat, b.flat)
    population.copy_member(0, 1)
    assert torch.equal(population.actors.flat[1], population.actors.flat[0])
    assert torch.equal(population.critics.flat[2:4], population.critics.flat[0:2])
    assert population.hyperparameters(1)["gamma"] == 0.9


def assert_algorithm_states_close(mine: dict, theirs: dict) -> None:
    """Two single-run algorithm states: networks, temperature and every optimiser's Adam state (step,
    moments, learning rate) equal within float rounding."""
    assert mine.keys() == theirs.keys()
    for key, value in mine.items():
        if key == "updates":
            assert value == theirs[key]
        elif key.endswith("optimizer"):
            assert value["param_groups"][0]["lr"] == pytest.approx(theirs[key]["param_groups"][0]["lr"])
            (adam,), (their_adam,) = value["state"].values(), theirs[key]["state"].values()
            assert float(adam["step"]) == float(their_adam["step"]), key
            for moment in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(adam[moment], their_adam[moment], atol=1e-5, rtol=1e-4, msg=key)
        elif isinstance(value, dict):
            for name, tensor in value.items():
                torch.testing.assert_close(tensor, theirs[key][name], atol=1e-5, rtol=1e-4, msg=key)
        else:
            torch.testing.assert_close(value, theirs[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize(
    ("population_class", "algo", "values"),
    [
        (VectorizedSAC, "sac", {"learning_rate": 2e-3, "alpha_learning_rate": 1e-2}),
        (VectorizedTD3, "td3", {"critic_learning_rate": 2e-3, "tau": 0.01}),
    ],
    ids=["sac", "td3"],
)
def test_member_agent_state_is_an_ordinary_checkpoint(tmp_path, population_class, algo, values):
    population = population_class(small_config(algo), [5, 6], [{}, values])
    population.train(STEPS)
    member = 1
    state = saved_and_loaded(population.member_agent_state(member))
    assert state["config"]["seed"] == 6 and state["progress"]["steps"] == STEPS

    # the member's algorithm state, Adam moments in the single run's layout, is its single run's
    single = single_run(tmp_path, algo, 6, values)
    assert_algorithm_states_close(state["algorithm"], single.algorithm.state_dict())

    # written into a run directory, phalanx.load_agent acts as the member does
    config = population.member_config(member)
    run_dir = tmp_path / "member"
    run_dir.mkdir()
    save_yaml(config, run_dir / "config.yaml")
    CheckpointManager(run_dir).save(population.steps, state)
    agent = phalanx.load_agent(run_dir, checkpoint="latest")
    obs = population.obs.view(2, 2, -1)  # (P, N, obs_dim): no normalisation, so raw observations
    mine = population.deterministic(obs)[member]
    theirs = agent.act(obs[member])  # the agent rescales [-1, 1] to the env's bounds [-2, 2]
    torch.testing.assert_close(theirs, mine * 2.0, atol=1e-5, rtol=1e-4)
    evaluation = phalanx.evaluate(run_dir, episodes=2, checkpoint="latest")
    assert evaluation.mean == pytest.approx(float(population.evaluate(2)[member]), rel=1e-4)
    population.close()
