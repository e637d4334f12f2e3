"""VectorizedPPO: P PPO members as one batched run; each member trains as its own single run would."""

from __future__ import annotations

import io

import pytest
import torch

import phalanx
from phalanx.algos.ppo import PPO
from phalanx.config import save_yaml
from phalanx.envs.classic import CartPoleEnv, PendulumEnv
from phalanx.envs.wrappers import MemberNormalizeObservation, find_wrapper
from phalanx.errors import ConfigError, EnvError
from phalanx.population.vectorized import VectorizedPPO
from phalanx.train.checkpoint import CheckpointManager
from phalanx.train.trainer import Trainer

SMALL = dict(num_envs=4, horizon=16, hidden_sizes=(16, 16), minibatch_size=32, epochs=2, eval_episodes=2)
ROLLOUT = 4 * 16  # env steps per member per rollout


def small_config(env: str = "CartPole-v1", **overrides) -> phalanx.TrainConfig:
    return phalanx.make_config("ppo", env, **{**SMALL, **overrides})


def single_run(tmp_path, name: str, env: str, seed: int, steps: int, **overrides) -> Trainer:
    """An ordinary run of ``steps`` env steps; evaluates every ``steps // 2`` (and so at the end)."""
    config = small_config(
        env, seed=seed, total_steps=steps, eval_every=steps // 2, run_dir=str(tmp_path / name), **overrides
    )
    trainer = Trainer(config, show_progress=False)
    trainer.train()
    trainer.close()
    return trainer


def assert_member_equals_run(population: VectorizedPPO, member: int, trainer: Trainer) -> None:
    """Member ``member``'s policy and value parameters equal the single run's (float rounding only)."""
    mine = population.single_tensors(member)
    theirs = [parameter.detach() for parameter in trainer.algorithm.parameters]
    assert len(mine) == len(theirs)
    for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"member {member}, parameter {index}")


def saved_and_loaded(state: dict) -> dict:
    """``state`` through torch.save and torch.load(weights_only=True): a Trainer checkpoint holds tensors
    and primitives only, and so must a member's."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# -- independence: each member is its single run --------------------------------------------------
@pytest.mark.parametrize(
    ("env", "settings", "members"),
    [
        (
            "CartPole-v1",
            {},
            [
                (1, {"learning_rate": 1e-3, "entropy_coef": 0.0}),
                (2, {"learning_rate": 3e-3, "entropy_coef": 0.01}),
                (3, {"learning_rate": 2e-3, "entropy_coef": 0.05, "clip_range": 0.1, "max_grad_norm": None}),
            ],
        ),
        (
            "Pendulum-v1",
            {"normalize_obs": True, "normalize_reward": True, "anneal_lr": True},
            [
                (4, {"learning_rate": 1e-3, "gamma": 0.95, "clip_value": 0.2}),
                (5, {"learning_rate": 3e-3, "gae_lambda": 0.9, "value_coef": 1.0}),
            ],
        ),
    ],
    ids=["discrete", "continuous-normalized"],
)
def test_each_member_trains_as_its_own_single_run(tmp_path, env, settings, members):
    """Different seeds and hyperparameters; an evaluation halfway on both sides must not disturb the
    training RNG or envs of either."""
    steps = 4 * ROLLOUT
    seeds = [seed for seed, _ in members]
    config = small_config(env, total_steps=steps, **settings)  # total_steps: the horizon of anneal_lr
    population = VectorizedPPO(config, seeds, [values for _, values in members])
    population.train(steps // 2)
    population.evaluate(2)
    metrics = population.train(steps // 2)
    assert population.steps == steps
    assert all(value.shape == (len(members),) for value in metrics.values())
    for member, (seed, values) in enumerate(members):
        trainer = single_run(tmp_path, f"run{member}", env, seed, steps, **settings, **values)
        assert trainer.learner.updates == population.updates == 4
        assert_member_equals_run(population, member, trainer)
    population.close()


def test_train_rounds_up_to_whole_rollouts():
    population = VectorizedPPO(small_config(), [0])
    population.train(1)
    assert population.steps == ROLLOUT
    population.train(ROLLOUT + 1)
    assert population.steps == 3 * ROLLOUT
    with pytest.raises(ConfigError, match="steps = 0 is invalid"):
        population.train(0)
    population.close()


# -- the per-block env seeding (envs/core.py) ---------------------------------------------------------
@pytest.mark.parametrize("env_class", [CartPoleEnv, PendulumEnv])
def test_block_seeds_give_each_block_the_draws_of_its_own_env(env_class):
    together = env_class(num_envs=6)
    alone = [env_class(num_envs=2) for _ in range(3)]
    obs, _ = together.reset(seed=[7, 8, 9])
    assert torch.equal(
        obs, torch.cat([env.reset(seed=seed)[0] for env, seed in zip(alone, [7, 8, 9], strict=True)])
    )
    generator = torch.Generator().manual_seed(0)
    for step in range(250):  # episodes end and reset, drawing from each block's generator
        if step == 100:  # a checkpoint of the block generators resumes the same draws
            saved = together.state_dict()
            together = env_class(num_envs=6)
            together.load_state_dict(saved)
        if env_class is CartPoleEnv:
            actions = torch.randint(2, (6,), generator=generator)
        else:
            actions = torch.rand(6, 1, generator=generator) * 4 - 2
        obs = together.step(actions)[0]
        expected = [env.step(actions[2 * i : 2 * i + 2])[0] for i, env in enumerate(alone)]
        assert torch.equal(obs, torch.cat(expected))
    together.reset(seed=3)  # an int seed goes back to one generator for all rows
    assert together.block_generators is None and "block_generators" not in together.state_dict()
    with pytest.raises(EnvError, match="4 seeds for 6 sub-envs"):
        together.reset(seed=[1, 2, 3, 4])


# -- hyperparameters ----------------------------------------------------------------------------------
def test_set_hyperparameters_changes_only_that_member():
    population = VectorizedPPO(small_config(), [0, 1, 2], [{"learning_rate": 1e-3}, {}, {"clip_value": 0.3}])
    assert population.hyperparameters(0)["learning_rate"] == pytest.approx(1e-3)
    assert population.hyperparameters(1)["clip_value"] is None
    assert population.hyperparameters(2)["clip_value"] == pytest.approx(0.3)
    before = [population.hyperparameters(member) for member in range(3)]
    population.set_hyperparameters(1, {"entropy_coef": 0.02, "max_grad_norm": None, "gamma": 0.9})
    after = population.hyperparameters(1)
    assert after == {**before[1], "entropy_coef": pytest.approx(0.02), "max_grad_norm": None, "gamma": 0.9}
    assert [population.hyperparameters(member) for member in (0, 2)] == [before[0], before[2]]
    assert population.hyperparameter_tensors["entropy_coef"].tolist() == pytest.approx([0.0, 0.02, 0.0])
    assert population.member_config(1).hyperparameters.gamma == 0.9
    population.train(ROLLOUT)  # the new values are usable
    population.close()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"learing_rate": 1e-3}, "unknown hyperparameter 'learing_rate'. Did you mean learning_rate"),
        ({"hidden_sizes": (8, 8)}, "hidden_sizes is shared by all members.*Per-member hyperparameters: "),
        ({"epochs": 3}, "epochs is shared by all members"),
        ({"num_envs": 2}, "num_envs is shared by all members"),
        ({"seed": 3}, "each member's seed is its entry of the seeds argument"),
        ({"clip_range": 1.5}, r"member 0: clip_range = 1.5 is invalid: expected a value in \(0, 1\)"),
        ({"learning_rate": -1.0}, "learning_rate = -1.0 is invalid"),
        ({"gamma": "high"}, "gamma = 'high' is invalid: expected a number"),
        ({"entropy_coef": None}, "entropy_coef = None is invalid: expected a number"),
    ],
)
def test_bad_hyperparameters_are_config_errors(values, message):
    population = VectorizedPPO(small_config(), [0, 1])
    before = population.hyperparameters(0)
    with pytest.raises(ConfigError, match=message):
        population.set_hyperparameters(0, values)
    assert population.hyperparameters(0) == before  # nothing half-applied
    with pytest.raises(ConfigError, match=message):
        VectorizedPPO(small_config(), [0, 1], [values, {}])
    population.close()


def test_what_a_vectorized_population_refuses():
    with pytest.raises(ConfigError, match="member 3 is not a member"):
        VectorizedPPO(small_config(), [0, 1]).hyperparameters(3)
    with pytest.raises(ConfigError, match="1 hyperparameter dicts for 2 seeds; pass one dict"):
        VectorizedPPO(small_config(), [0, 1], [{}])
    with pytest.raises(ConfigError, match="target_kl"):
        VectorizedPPO(small_config(target_kl=0.02), [0, 1])
    with pytest.raises(ConfigError, match="trains PPO members"):
        VectorizedPPO(phalanx.make_config("a2c", "CartPole-v1"), [0])
    with pytest.raises(ConfigError, match="at least one member"):
        VectorizedPPO(small_config(), [])


# -- members --------------------------------------------------------------------------------------------
def test_copy_member_copies_networks_optimizer_and_statistics_not_the_rest():
    population = VectorizedPPO(
        small_config("Pendulum-v1", normalize_obs=True, normalize_reward=True),
        [0, 1, 2],
        [{"learning_rate": 1e-3}, {"learning_rate": 3e-3, "entropy_coef": 0.01}, {}],
    )
    population.train(2 * ROLLOUT)
    source, target, other = 0, 1, 2
    hyperparameters = [population.hyperparameters(member) for member in range(3)]
    generator_state = population.generators[target].get_state()
    env_state = population.env.unwrapped.state.clone()
    untouched = population.parameters[other].clone()
    population.copy_member(source, target)

    optimizer = population.optimizer
    for tensor in (population.parameters, optimizer.exp_avg, optimizer.exp_avg_sq, optimizer.steps):
        assert torch.equal(tensor[target], tensor[source])
    for statistics in (population.obs_statistics, population.reward_statistics):
        assert torch.equal(statistics.mean[target], statistics.mean[source])
        assert torch.equal(statistics.var[target], statistics.var[source])
    assert torch.equal(population.parameters[other], untouched)
    assert [population.hyperparameters(member) for member in range(3)] == hyperparameters
    assert torch.equal(population.generators[target].get_state(), generator_state)
    assert torch.equal(population.env.unwrapped.state, env_state)
    # the copy acts as its source: the same deterministic actions on the same observations
    obs = torch.randn(1, 5, 3).expand(3, -1, -1)
    actions = population.policy.deterministic_action(obs)
    assert torch.equal(actions[target], actions[source])
    population.train(ROLLOUT)  # and trains on from there with its own hyperparameters
    assert not torch.equal(population.parameters[target], population.parameters[source])
    population.close()


@pytest.mark.parametrize(
    ("env", "settings"),
    [("CartPole-v1", {}), ("Pendulum-v1", {"normalize_obs": True})],
    ids=["discrete", "box"],
)
def test_member_agent_state_is_an_ordinary_checkpoint(tmp_path, env, settings):
    population = VectorizedPPO(
        small_config(env, **settings), [3, 4], [{"learning_rate": 1e-3}, {"learning_rate": 2e-3}]
    )
    population.train(2 * ROLLOUT)
    member = 1
    state = saved_and_loaded(population.member_agent_state(member))
    assert state["config"]["seed"] == 4 and state["config"]["hyperparameters"]["learning_rate"] == 2e-3
    assert state["progress"]["steps"] == 2 * ROLLOUT

    # an ordinary PPO takes it, optimiser state included
    config = population.member_config(member)
    algorithm = PPO(config.hyperparameters, population.observation_space, population.action_space, "cpu")
    algorithm.load_state_dict(state["algorithm"])
    adam = algorithm.optimizer.state_dict()
    assert adam["param_groups"][0]["lr"] == pytest.approx(2e-3)
    assert all(float(entry["step"]) == population.updates * 4 for entry in adam["state"].values())

    # written into a run directory, phalanx.load_agent acts as the member does on raw observations
    run_dir = tmp_path / "member"
    run_dir.mkdir()
    save_yaml(config, run_dir / "config.yaml")
    CheckpointManager(run_dir).save(population.steps, state)
    agent = phalanx.load_agent(run_dir, checkpoint="latest")
    raw_obs = population.env.unwrapped._observe()  # (P * N, obs_dim), the members' current raw obs
    rows = slice(member * 4, member * 4 + 4)
    normalizer = find_wrapper(population.env, MemberNormalizeObservation)
    obs = normalizer.normalize(raw_obs) if normalizer is not None else raw_obs
    mine = population.policy.deterministic_action(obs.view(2, 4, -1))[member]
    theirs = agent.act(raw_obs[rows])
    if env == "CartPole-v1":
        assert torch.equal(theirs, mine)
    else:  # the agent rescales [-1, 1] to the env's bounds [-2, 2]
        torch.testing.assert_close(theirs, (mine.clamp(-1, 1) * 2.0), atol=1e-5, rtol=1e-4)
    evaluation = phalanx.evaluate(run_dir, episodes=2, checkpoint="latest")
    assert evaluation.mean == pytest.approx(float(population.evaluate(2)[member]), rel=1e-4)
    population.close()


# -- state ----------------------------------------------------------------------------------------------
def test_state_dict_resumes_exactly():
    config = small_config(
        "Pendulum-v1", normalize_obs=True, normalize_reward=True, anneal_lr=True, total_steps=800
    )
    seeds, values = [0, 1], [{"learning_rate": 1e-3}, {"learning_rate": 2e-3, "clip_value": 0.5}]

    straight = VectorizedPPO(config, seeds, values)
    straight.train(2 * ROLLOUT)
    expected = straight.train(2 * ROLLOUT)

    first = VectorizedPPO(config, seeds, values)
    first.train(2 * ROLLOUT)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    first.train(ROLLOUT)  # moves on after saving: the state is a copy
    buffer.seek(0)
    resumed = VectorizedPPO(config, [7, 8], [{}, {}])  # other seeds and hyperparameters: the state has them
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.hyperparameters(1) == straight.hyperparameters(1)
    metrics = resumed.train(2 * ROLLOUT)

    assert resumed.steps == straight.steps == 4 * ROLLOUT
    assert torch.equal(resumed.parameters, straight.parameters)
    assert torch.equal(resumed.optimizer.exp_avg_sq, straight.optimizer.exp_avg_sq)
    assert torch.equal(resumed.obs, straight.obs)
    for name, value in expected.items():
        torch.testing.assert_close(metrics[name], value, atol=0, rtol=0, equal_nan=True, msg=name)
    for population in (straight, first, resumed):
        population.close()


def test_load_state_dict_refuses_another_shape():
    state = VectorizedPPO(small_config(), [0, 1]).state_dict()
    with pytest.raises(phalanx.CheckpointError, match="num_members: the state has 2, this population 3"):
        VectorizedPPO(small_config(), [0, 1, 2]).load_state_dict(state)
    with pytest.raises(phalanx.CheckpointError, match=r"hidden_sizes: the state has \(16, 16\)"):
        VectorizedPPO(small_config(hidden_sizes=(8,)), [0, 1]).load_state_dict(state)


# -- learning -------------------------------------------------------------------------------------------
def test_a_population_learns_cartpole():
    config = phalanx.make_config("ppo", "CartPole-v1", num_envs=8, horizon=16, minibatch_size=64)  # preset
    population = VectorizedPPO(config, [0, 1, 2, 3])
    before = population.evaluate(5)
    population.train(8192)
    after = population.evaluate(5)
    assert after.shape == (4,)
    assert after.mean() >= 150 and after.mean() > before.mean() + 100, (before, after)
    population.close()
