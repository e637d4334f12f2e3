"""Recurrent PPO and A2C (``recurrent: lstm|gru``): memory carried and reset, stored and recomputed,
BPTT and burn-in, exact resume, deployment, export, the masked-velocity tasks, bad input, and learning a
task that needs memory where a feed-forward policy cannot."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

import phalanx
from phalanx.algos.ppo import PPOConfig, update_settings
from phalanx.algos.recurrent import (
    RecurrentA2C,
    RecurrentPPO,
    SequenceSampler,
    actor,
    reset_memory,
    sequence_loss,
)
from phalanx.buffers import StepLayout
from phalanx.cli import main as cli_main
from phalanx.envs import make_env, register_env
from phalanx.envs.core import BatchedVecEnv
from phalanx.envs.registry import list_envs
from phalanx.envs.wrappers import MaskVelocity
from phalanx.errors import ConfigError
from phalanx.registry import algorithm_class
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.evaluator import CopiesEvaluator
from phalanx.train.run_dir import read_run_config
from phalanx.train.trainer import Trainer
from phalanx.train.worker import Worker


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class RememberFirst(BatchedVecEnv):
    """Episodes of ``length`` steps: the first observation shows a cue (+1 or -1), the later ones 0; each
    later step pays 1 for the action that names the cue (1 for +1, 0 for -1). A feed-forward policy sees
    the same observation at every later step and earns half of it on average; a memory earns it all."""

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu", length: int = 4) -> None:
        space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        super().__init__(num_envs, space, gym.spaces.Discrete(2), device)
        self.length = length
        self.state = torch.zeros(num_envs, 2, device=self.device)  # (cue, step)

    def _reset_rows(self, mask: torch.Tensor) -> None:
        cue = torch.where(self.uniform(0.0, 1.0, (self.num_envs,)) < 0.5, -1.0, 1.0)
        fresh = torch.stack((cue, torch.zeros_like(cue)), dim=-1).to(self.state.dtype)
        self.state = torch.where(mask.unsqueeze(-1), fresh, self.state)

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cue, step = self.state.unbind(-1)
        reward = ((actions == (cue > 0).long()) & (step >= 1)).float()
        step = step + 1
        self.state = torch.stack((cue, step), dim=-1)
        return reward, step >= self.length

    def _observe(self) -> torch.Tensor:
        cue, step = self.state.unbind(-1)
        first = step == 0
        return torch.stack((torch.where(first, cue, 0.0), first.float()), dim=-1)


register_env("RememberFirst-v0", RememberFirst, overwrite=True)


def config(tmp_path, name="run", env="CartPoleNoVel-v1", algo="ppo", **overrides):
    settings = dict(
        num_envs=4,
        total_steps=512,
        eval_every=256,
        eval_episodes=3,
        log_every=256,
        run_dir=str(tmp_path / name),
        horizon=16,
        hidden_sizes=(16,),
        recurrent="lstm",
        recurrent_hidden_size=8,
    )
    if algo == "ppo":
        settings.update(minibatch_size=32, epochs=2, sequence_length=8)
    settings.update(overrides)
    return phalanx.make_config(algo, env, use_preset=False, **settings)


def build(cell="lstm", env="CartPoleNoVel-v1", num_envs=4, **overrides):
    """A recurrent PPO and a worker on ``env``, reset."""
    hyperparameters = PPOConfig(recurrent=cell, recurrent_hidden_size=8, hidden_sizes=(16,), **overrides)
    vec = make_env(env, num_envs=num_envs)
    algorithm = RecurrentPPO(hyperparameters, vec.single_observation_space, vec.single_action_space, "cpu")
    worker = Worker(vec, algorithm)
    worker.reset(seed=0)
    layout = StepLayout.of(vec.single_observation_space, vec.single_action_space)
    buffer = algorithm.rollout_buffer(hyperparameters.horizon, num_envs, layout, "cpu")
    return algorithm, worker, buffer


# -- the network and the memory ------------------------------------------------------------------------
@pytest.mark.parametrize("cell, rows", [("lstm", 2), ("gru", 1)])
@pytest.mark.parametrize("env, action_shape", [("CartPoleNoVel-v1", ()), ("PendulumNoVel-v1", (1,))])
def test_shapes_of_acting_and_memory(cell, rows, env, action_shape):
    algorithm, worker, _ = build(cell, env, num_envs=3)
    assert algorithm.memory_shape == (rows, 8)
    memory = algorithm.initial_memory(3)
    actions, log_probs, values, after = algorithm.explore(worker.obs, memory, torch.ones(3, dtype=torch.bool))
    assert actions.shape == (3, *action_shape) and log_probs.shape == values.shape == (3,)
    assert after.shape == (3, rows, 8) and after.abs().sum() > 0
    deterministic, _ = algorithm.act_with_memory(worker.obs, memory)
    assert deterministic.shape == (3, *action_shape)


def test_memory_is_reset_where_an_episode_starts():
    algorithm, worker, _ = build()
    obs = worker.obs
    carried = torch.randn(4, 2, 8)
    starts = torch.tensor([True, False, True, False])
    _, with_starts = algorithm.act_with_memory(obs, carried, starts)
    _, fresh = algorithm.act_with_memory(obs, reset_memory(carried, starts))
    _, zero = algorithm.act_with_memory(obs, torch.zeros(4, 2, 8))
    assert torch.equal(with_starts, fresh)
    assert torch.equal(with_starts[starts], zero[starts]) and not torch.equal(with_starts[1], zero[1])


def test_the_worker_carries_memory_and_stores_what_the_policy_acted_with():
    algorithm, worker, buffer = build(horizon=64)
    worker.collect(buffer)
    assert buffer.dones.any(), "the rollout should hold episode ends"
    # the observation after a done starts an episode: its flag is the done of the step before
    assert torch.equal(buffer.episode_starts[1:], buffer.dones[:-1])
    assert buffer.episode_starts[0].all()  # the first rollout after reset
    # the stored memory before each step is the memory after the previous step, as acting left it
    hidden = algorithm.network.unroll(buffer.obs, buffer.memory[0], buffer.episode_starts)
    assert torch.allclose(hidden[:-1], buffer.memory[1:, :, 0], atol=1e-6)
    assert torch.allclose(hidden[-1], buffer.final_memory[:, 0], atol=1e-6)
    assert torch.allclose(algorithm.network.value(hidden), buffer.values, atol=1e-6)
    # and the next rollout goes on from the worker's memory, not from zeros
    carried = worker.memory.clone()
    worker.collect(buffer)
    assert torch.equal(buffer.memory[0], carried)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_sequence_call_computes_what_the_steps_compute_values_and_gradients(cell):
    algorithm, _, _ = build(cell)
    network = algorithm.network
    obs, memory = torch.randn(12, 5, 4), torch.randn(5, *algorithm.memory_shape)
    starts = torch.zeros(12, 5, dtype=torch.bool)
    starts[0, 1] = starts[4, 1] = starts[5, 1] = starts[11, 2] = True  # back-to-back starts, a last step
    starts[:, 3] = True  # episodes of one step
    # the reference: acting's step, one after another, the memory zeroed where an episode starts
    outputs, carried = [], memory
    for t in range(12):
        hidden, carried = network.step(obs[t], reset_memory(carried, starts[t]))
        outputs.append(hidden)
    weights = torch.randn(12, 5, 8)  # a loss that weighs every output differently
    (torch.stack(outputs) * weights).sum().backward()
    expected = [parameter.grad.clone() for parameter in network.rnn.parameters()]
    network.zero_grad()
    unrolled = network.unroll(obs, memory, starts)
    (unrolled * weights).sum().backward()
    assert torch.allclose(unrolled, torch.stack(outputs), atol=1e-6)
    for parameter, gradient in zip(network.rnn.parameters(), expected, strict=True):
        assert torch.allclose(parameter.grad, gradient, atol=1e-5)
    assert torch.equal(network.steps(obs, memory, starts), carried)


def test_a_network_saved_with_a_cell_module_loads():
    network = build()[0].network
    state = network.state_dict()  # the names of the weights when the network held an nn.LSTMCell `cell`
    old = {key.replace("rnn.", "cell.").removesuffix("_l0"): value for key, value in state.items()}
    assert "cell.weight_ih" in old
    fresh = build()[0].network
    fresh.load_state_dict(old)
    assert all(torch.equal(value, fresh.state_dict()[key]) for key, value in state.items())


def test_gradient_flows_back_through_the_sequence_but_not_across_an_episode_start():
    algorithm, _, _ = build()
    obs = torch.randn(6, 2, 4, requires_grad=True)
    starts = torch.zeros(6, 2, dtype=torch.bool)
    starts[3, 1] = True  # column 1 starts an episode at step 3
    hidden = algorithm.network.unroll(obs, algorithm.initial_memory(2), starts)
    hidden[-1].sum().backward()
    assert obs.grad[0, 0].abs().sum() > 0  # the last step's output depends on the first observation
    assert obs.grad[:3, 1].abs().sum() == 0 and obs.grad[3, 1].abs().sum() > 0


def test_burn_in_steps_are_left_out_of_the_loss():
    algorithm, worker, buffer = build(horizon=16, sequence_length=8, burn_in=3, minibatch_size=16)
    worker.collect(buffer)
    targets = torch.randn(4, 16 * 4)
    index = torch.tensor([0, 5])  # sequences: chunk 0 of env 0, chunk 1 of env 1
    _, obs, *rest = SequenceSampler(8, 2, "cpu").data(buffer, targets)  # sequence 0 is obs[:, 0]
    hyperparameters = update_settings(algorithm.config).loss

    def loss(targets, obs):
        return sequence_loss(algorithm.network, 3, hyperparameters, targets, index, obs, *rest)[0]

    burn_in_samples = torch.tensor([t * 4 + 0 for t in range(3)] + [t * 4 + 1 for t in range(8, 11)])
    changed = targets.clone()
    changed[:, burn_in_samples] += 100.0  # the targets of the burn-in steps
    assert torch.equal(loss(changed, obs), loss(targets, obs))
    later = targets.clone()
    later[:, 3 * 4] += 100.0  # step 3 of env 0: after the burn-in, in the loss
    assert not torch.equal(loss(later, obs), loss(targets, obs))
    # and the burn-in runs without gradient: no gradient reaches its observations
    obs = obs.clone().requires_grad_(True)
    loss(targets, obs).backward()
    assert obs.grad[:3, 0].abs().sum() == 0 and obs.grad[3:8, 0].abs().sum() > 0


def test_ppo_with_recurrent_builds_the_recurrent_class_everywhere():
    hyperparameters = PPOConfig(recurrent="gru")
    assert algorithm_class("ppo", hyperparameters) is RecurrentPPO
    assert algorithm_class("ppo", PPOConfig()) is phalanx.algos.PPO
    a2c = phalanx.make_config("a2c", "CartPoleNoVel-v1", recurrent="lstm").hyperparameters
    assert algorithm_class("a2c", a2c) is RecurrentA2C


# -- runs: resume, deployment, export --------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("recurrent")
    result = phalanx.train(config(tmp_path, normalize_obs=True), show_progress=False)
    return result


def network_state(run_dir):
    return load_checkpoint(phalanx.agent.resolve_checkpoint(run_dir, "latest"))["algorithm"]["network"]


def test_resume_continues_exactly(tmp_path, trained):
    half = phalanx.train(config(tmp_path, "half", normalize_obs=True, total_steps=256), show_progress=False)
    state = load_checkpoint(phalanx.agent.resolve_checkpoint(half.run_dir, "latest"))
    assert state["worker"]["memory"].shape == (4, 2, 8) and state["worker"]["episode_starts"].shape == (4,)
    resumed = phalanx.resume(half.run_dir, total_steps=512, show_progress=False)
    a, b = network_state(trained.run_dir), network_state(resumed.run_dir)
    assert all(torch.equal(a[key], b[key]) for key in a), "the resumed run differs from the straight one"


def test_a_loaded_agent_acts_as_the_trained_algorithm(trained):
    agent = phalanx.load_agent(trained.run_dir, checkpoint="latest")
    assert agent.recurrent
    env = make_env("CartPoleNoVel-v1", num_envs=3)
    obs, _ = env.reset(seed=1)
    memory, starts = None, None
    policy = actor(agent.algorithm)
    for _ in range(40):
        raw = obs
        actions, memory = agent.act(raw, memory=memory, episode_start=starts)
        # the same actions through the stateful actor on the normalised observations
        assert torch.equal(policy.act(agent.policy.normalize(raw)), actions)
        obs, _, terminated, truncated, _ = env.step(actions)
        starts = terminated | truncated
        policy.episodes_ended(starts)
    single, single_memory = agent.act(np.zeros(4, dtype=np.float32))
    assert single.shape == () and single_memory.shape == (2, 8)
    again, _ = agent.act(np.zeros(4, dtype=np.float32), memory=single_memory, episode_start=True)
    assert again == single  # a start zeroes the memory: the first step again
    with pytest.raises(ValueError, match=r"expected \(2, 8\)"):
        agent.act(np.zeros(4, dtype=np.float32), memory=np.zeros((1, 8), dtype=np.float32))
    evaluation = agent.evaluate(episodes=3)
    assert len(evaluation.returns) == 3


def test_the_deployed_evaluation_reproduces_the_run_s_final_one(trained):
    evaluation = phalanx.evaluate(trained.run_dir, episodes=3, checkpoint="latest")
    assert evaluation.mean == pytest.approx(trained.summary["eval_return_mean"])


def test_copies_evaluated_side_by_side_each_get_their_own_evaluation(trained, tmp_path):
    run_config = read_run_config(trained.run_dir)
    run_config = dataclasses.replace(run_config, eval_batch=2, normalize_obs=False)
    evaluator = CopiesEvaluator(run_config, seed=5)
    try:
        state = load_checkpoint(phalanx.agent.resolve_checkpoint(trained.run_dir, "latest"))["algorithm"]
        other = RecurrentPPO(run_config.hyperparameters, *evaluator.spaces, "cpu").state_dict()
        alone = [evaluator.evaluate([{"algorithm": copy, "obs_statistics": None}]) for copy in (state, other)]
        together = evaluator.evaluate(
            [{"algorithm": copy, "obs_statistics": None} for copy in (state, other)]
        )
        assert together == [evaluation for [evaluation] in alone]
    finally:
        evaluator.close()


@pytest.mark.parametrize("format", ["torchscript", "onnx"])
def test_export_takes_and_gives_the_memory_and_acts_as_the_library(trained, format, tmp_path):
    if format == "onnx":
        ort = pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    path = phalanx.exporting.export(trained.run_dir, format, checkpoint="latest", output=tmp_path / "p")
    if format == "onnx":
        session = ort.InferenceSession(str(path))
        assert [i.name for i in session.get_inputs()] == ["obs", "memory"]
        assert [o.name for o in session.get_outputs()] == ["action", "memory_out"]

        def run(obs, memory):
            actions, after = session.run(None, {"obs": obs.numpy(), "memory": memory.numpy()})
            return torch.as_tensor(actions), torch.as_tensor(after)
    else:
        module = torch.jit.load(str(path))

        def run(obs, memory):
            return module(obs, memory)

    agent = phalanx.load_agent(trained.run_dir, checkpoint="latest")
    env = make_env("CartPoleNoVel-v1", num_envs=3)
    obs, _ = env.reset(seed=2)
    library_memory = exported_memory = torch.zeros(3, 2, 8)
    for step in range(30):
        starts = torch.tensor([step == 10, False, step == 20])  # resets: the file is given zeros there
        exported_memory = reset_memory(exported_memory, starts)
        actions, library_memory = agent.act(obs, memory=library_memory, episode_start=starts)
        exported_actions, exported_memory = run(obs, exported_memory)
        assert torch.equal(exported_actions, actions)
        assert torch.allclose(exported_memory, library_memory, atol=1e-5)
        obs, *_ = env.step(actions)


def test_a_gru_a2c_run_trains_and_evaluates(tmp_path):
    result = phalanx.train(
        config(
            tmp_path, algo="a2c", recurrent="gru", total_steps=256, horizon=8, sequence_length=4, burn_in=1
        ),
        show_progress=False,
    )
    assert result.summary["updates"] == 256 // (8 * 4)
    agent = phalanx.load_agent(result.run_dir, checkpoint="latest")
    assert agent.algorithm.memory_shape == (1, 8) and isinstance(agent.algorithm, RecurrentA2C)


def test_compile_runs_the_recurrent_path_eagerly_and_says_so(tmp_path):
    trainer = Trainer(config(tmp_path, compile=True, total_steps=128, eval_every=0), show_progress=False)
    try:  # the env step alone: acting with memory and the sequence update stay eager
        assert trainer.state.compiled == ["env step"]
        assert trainer.worker.compiled_rollout_step is None and trainer.worker.compiled_act is None
    finally:
        trainer.close()


# -- the memory tasks --------------------------------------------------------------------------------------
def test_mask_velocity_zeroes_the_velocities_of_the_built_in_memory_tasks():
    assert {"CartPoleNoVel-v1", "PendulumNoVel-v1"} <= set(list_envs()["builtin"])
    full, masked = make_env("CartPole-v1", num_envs=5), make_env("CartPoleNoVel-v1", num_envs=5)
    obs, _ = full.reset(seed=3)
    masked_obs, _ = masked.reset(seed=3)
    assert torch.equal(masked_obs[:, [0, 2]], obs[:, [0, 2]]) and not masked_obs[:, [1, 3]].any()
    for _ in range(30):
        actions = torch.randint(2, (5,))
        obs, _, _, _, info = full.step(actions)
        masked_obs, _, _, _, masked_info = masked.step(actions)
        assert torch.equal(masked_obs[:, [0, 2]], obs[:, [0, 2]]) and not masked_obs[:, [1, 3]].any()
        assert not masked_info["final_obs"][:, [1, 3]].any()
    pendulum, _ = make_env("PendulumNoVel-v1", num_envs=2).reset(seed=0)
    assert not pendulum[:, 2].any() and pendulum[:, :2].abs().sum() > 0
    with pytest.raises(ConfigError, match=r"indices \(4,\) must be non-empty and in \[0, 4\)"):
        MaskVelocity(make_env("CartPole-v1"), (4,))


# -- bad input ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["dqn", "sac", "mappo"])
def test_recurrent_on_an_algorithm_without_it_names_ppo_and_a2c(algo):
    env = {"dqn": "CartPole-v1", "sac": "Pendulum-v1", "mappo": "simple_spread"}[algo]
    with pytest.raises(ConfigError, match=f"{algo} has no recurrent policy.*exist for ppo and a2c"):
        phalanx.make_config(algo, env, recurrent="lstm").validate()


def test_recurrent_flag_on_dqn_in_the_cli(capsys):
    assert cli_main(["train", "dqn", "CartPole-v1", "--recurrent", "lstm"]) == 2
    assert "dqn has no recurrent policy" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"recurrent": "rnn"}, "recurrent = 'rnn'.*one of \\('lstm', 'gru'\\)"),
        ({"sequence_length": 5}, "sequence_length = 5.*divides horizon = 16"),
        ({"burn_in": 8}, "burn_in = 8.*\\[0, sequence length = 8\\)"),
        (
            {"minibatch_size": 36},
            "minibatch_size = 36.*multiple of the sequence length 8.*set minibatch_size to 32",
        ),
        ({"recurrent_hidden_size": 0}, "recurrent_hidden_size = 0"),
        ({"overlap": True, "num_workers": 1, "env": "gym:CartPole-v1"}, "overlap=True.*recurrent policy"),
    ],
)
def test_bad_recurrent_settings_are_named(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, **overrides).validate()


def test_the_vectorized_population_refuses_recurrent_members_and_names_the_process_backend(tmp_path):
    from phalanx.population.vectorized import VectorizedPPO

    with pytest.raises(ConfigError, match="--backend process"):
        VectorizedPPO.check_config(config(tmp_path))


def test_a_feed_forward_agent_refuses_a_memory(tmp_path):
    result = phalanx.train(config(tmp_path, recurrent=None, total_steps=128), show_progress=False)
    agent = phalanx.load_agent(result.run_dir, checkpoint="latest")
    assert not agent.recurrent
    with pytest.raises(ValueError, match="feed-forward: it has no memory"):
        agent.act(np.zeros(4, dtype=np.float32), memory=np.zeros((2, 8)))


# -- learning ----------------------------------------------------------------------------------------------
def memory_task(tmp_path, name, recurrent):
    return config(
        tmp_path,
        name,
        env="RememberFirst-v0",
        recurrent=recurrent,
        recurrent_hidden_size=16,
        hidden_sizes=(16,),
        num_envs=16,
        horizon=16,
        sequence_length=None,
        minibatch_size=64,
        epochs=4,
        learning_rate=3e-3,
        gamma=0.9,
        total_steps=4096,
        eval_every=0,
        eval_episodes=32,
        seed=1,
    )


def test_an_lstm_remembers_the_first_observation_where_a_feed_forward_policy_cannot(tmp_path):
    lstm = phalanx.train(memory_task(tmp_path, "lstm", "lstm"), show_progress=False).summary
    mlp = phalanx.train(memory_task(tmp_path, "mlp", None), show_progress=False).summary
    assert lstm["eval_return_mean"] == 3.0  # every later step names the cue
    assert mlp["eval_return_mean"] < 2.5  # the cue is gone after the first step: about half of it


@pytest.mark.slow
def test_lstm_ppo_solves_cartpole_without_velocities_where_feed_forward_ppo_does_not(tmp_path):
    settings = dict(
        num_envs=16, horizon=32, minibatch_size=256, epochs=10, gae_lambda=0.8, gamma=0.98,
        learning_rate=1e-3, anneal_lr=True, normalize_obs=True, hidden_sizes=(64,), activation="relu",
        recurrent_hidden_size=64, total_steps=81920, eval_every=4096, eval_episodes=10, seed=1,
        stop_return=475, sequence_length=None,
    )  # fmt: skip
    lstm = phalanx.train(config(tmp_path, "lstm", **settings), show_progress=False).summary
    mlp = phalanx.train(
        config(tmp_path, "mlp", **{**settings, "recurrent": None}), show_progress=False
    ).summary
    assert lstm["best_eval_return"] >= 475
    assert mlp["best_eval_return"] < 475
