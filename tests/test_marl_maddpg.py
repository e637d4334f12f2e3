"""MADDPG and MATD3: shapes, the centralised TD target, the MADDPG policy gradient, TD3's pieces, state."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import phalanx
from phalanx.algos.ddpg import Draws
from phalanx.algos.td3 import TD3Config
from phalanx.errors import ConfigError
from phalanx.marl.buffers import MultiAgentBatch
from phalanx.marl.core import AgentGroup, MultiAgentSpec
from phalanx.marl.maddpg import MADDPG, MATD3, MADDPGConfig, MATD3Config
from phalanx.registry import get_algorithm

ALGOS = [(MADDPG, MADDPGConfig), (MATD3, MATD3Config)]


def box(dim: int) -> gym.spaces.Box:
    return gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)


def group(prefix: str, agents: int, obs_dim: int, action_space: gym.Space | None = None) -> AgentGroup:
    action_space = action_space or gym.spaces.Box(0.0, 1.0, (5,), np.float32)
    return AgentGroup(tuple(f"{prefix}_{i}" for i in range(agents)), box(obs_dim), action_space)


def spread_spec() -> MultiAgentSpec:
    """simple_spread's spaces: one cooperative group of 3 agents."""
    return MultiAgentSpec({"agent": group("agent", 3, 18)}, box(54))


def tag_spec() -> MultiAgentSpec:
    """simple_tag's spaces: two competing groups with different observations."""
    return MultiAgentSpec({"adversary": group("adversary", 3, 16), "agent": group("agent", 1, 14)}, box(62))


SPECS = {"spread": spread_spec, "tag": tag_spec}


def make(cls=MADDPG, config_class=MADDPGConfig, spec=None, seed=0, **hyperparameters):
    torch.manual_seed(seed)
    config = config_class(hidden_sizes=(16, 16), **hyperparameters)
    return cls(config, spec or spread_spec(), "cpu")


def random_obs(spec: MultiAgentSpec, n: int) -> dict[str, torch.Tensor]:
    return {
        name: torch.randn(n, g.num_agents, int(g.observation_space.shape[0]))
        for name, g in spec.groups.items()
    }


def random_batch(spec: MultiAgentSpec, size: int = 8, seed: int = 1) -> MultiAgentBatch:
    generator = torch.Generator().manual_seed(seed)

    def per_group(tail):
        return {
            name: torch.randn(size, g.num_agents, *tail(g), generator=generator)
            for name, g in spec.groups.items()
        }

    def obs_dim(g):
        return (int(g.observation_space.shape[0]),)

    return MultiAgentBatch(
        obs=per_group(obs_dim),
        state=torch.randn(size, spec.state_dim, generator=generator),
        actions={name: a.tanh() for name, a in per_group(lambda g: (5,)).items()},
        rewards=per_group(lambda g: ()),
        next_obs=per_group(obs_dim),
        next_state=torch.randn(size, spec.state_dim, generator=generator),
        discounts=0.95 * (torch.rand(size, generator=generator) > 0.25).float(),
        next_action_mask=None,
    )


# -- interface ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, config_class", ALGOS)
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("spec_name", SPECS)
def test_actions_have_the_group_shapes_and_lie_in_the_normalised_box(cls, config_class, share, spec_name):
    spec = SPECS[spec_name]()
    algo = make(cls, config_class, spec, share_parameters=share, exploration_noise=5.0)
    obs = random_obs(spec, 7)
    for actions in (
        algo.explore(obs, torch.randn(7, spec.state_dim), None, steps=0),
        algo.act(obs),
        algo.random_actions(7, None),
    ):
        assert set(actions) == set(spec.groups)
        for name, g in spec.groups.items():
            assert actions[name].shape == (7, g.num_agents, 5)
            assert actions[name].dtype == torch.float32
            assert actions[name].abs().max() <= 1.0
    # decentralised: an agent's action depends on its own observation only
    changed = {name: value.clone() for name, value in obs.items()}
    first = next(iter(spec.groups))
    changed[first][:, 0] += 1.0
    before, after = algo.act(obs), algo.act(changed)
    assert not torch.allclose(before[first][:, 0], after[first][:, 0])
    torch.testing.assert_close(before[first][:, 1:], after[first][:, 1:])


def test_registered_and_refuses_discrete_actions_with_a_pointer_to_qmix_and_mappo():
    assert get_algorithm("maddpg") is MADDPG and get_algorithm("matd3") is MATD3
    assert issubclass(MATD3, MADDPG) and MADDPG.action_kinds == ("continuous",) and not MADDPG.on_policy
    spec = MultiAgentSpec({"agent": group("agent", 3, 18, gym.spaces.Discrete(5))}, box(54))
    with pytest.raises(ConfigError, match=r"maddpg needs continuous actions.*'agent'.*qmix.*mappo"):
        MADDPG(MADDPGConfig(), spec, "cpu")


def test_configs_reuse_ddpg_and_td3():
    config, td3 = MATD3Config(), MATD3Config()
    assert isinstance(config, TD3Config) and isinstance(config, MADDPGConfig)
    assert (td3.num_critics, td3.policy_delay, td3.target_noise, td3.target_noise_clip) == (2, 2, 0.2, 0.5)
    assert (config.gamma, config.tau, config.hidden_sizes) == (0.95, 0.05, (64, 64))
    assert (MADDPGConfig().num_critics, MADDPGConfig().policy_delay) == (1, 1)
    for algo in ("maddpg", "matd3"):  # n-step returns come from the multi-agent replay buffer
        phalanx.make_config(algo, "simple_spread_continuous", use_preset=False, n_step=3).validate()


# -- the learning rule -------------------------------------------------------------------------------


def reference_critic_loss(algo: MADDPG, batch: MultiAgentBatch) -> torch.Tensor:
    """The critics' loss written agent by agent, with standalone copies of each agent's networks."""
    spec, config = algo.spec, algo.config

    def network(nets, agents, agent, k=0):  # agent's k-th network, and whether it takes the one-hot id
        member = k if nets.shared else k * agents + agent
        return nets.net.member(member), nets.shared and agents > 1

    def run(nets, agents, agent, x, k=0):
        net, with_id = network(nets, agents, agent, k)
        if with_id:
            x = torch.cat([x, torch.eye(agents)[agent].expand(x.shape[0], agents)], dim=1)
        return net(x)

    next_actions, actions = [], []
    for name, g in spec.groups.items():
        for a in range(g.num_agents):
            next_actions.append(
                run(algo.actor_target[name], g.num_agents, a, batch.next_obs[name][:, a]).tanh()
            )
            actions.append(batch.actions[name][:, a])
    next_joint, joint = torch.cat(next_actions, dim=1), torch.cat(actions, dim=1)
    loss = torch.zeros(())
    for name, g in spec.groups.items():
        for a in range(g.num_agents):
            next_input = torch.cat([batch.next_state, next_joint], dim=1)
            q_next = torch.stack(
                [
                    run(algo.critic_target[name], g.num_agents, a, next_input, k)[:, 0]
                    for k in range(config.num_critics)
                ]
            )
            target = batch.rewards[name][:, a] + batch.discounts * q_next.min(dim=0).values
            for k in range(config.num_critics):
                q = run(algo.critic[name], g.num_agents, a, torch.cat([batch.state, joint], dim=1), k)[:, 0]
                loss = loss + (q - target).pow(2).mean() / g.num_agents
    return loss


@pytest.mark.parametrize("cls, config_class", ALGOS)
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("spec_name", SPECS)
def test_critic_loss_matches_an_agent_by_agent_reference(cls, config_class, share, spec_name):
    spec = SPECS[spec_name]()
    smoothing = {"target_noise": 0.0} if cls is MATD3 else {}  # a deterministic target
    algo = make(cls, config_class, spec, share_parameters=share, tau=0.5, **smoothing)
    batch = random_batch(spec)
    for _ in range(3):  # targets and online networks apart, twin critics apart
        algo.update(random_batch(spec, seed=7), 0.0)
    with torch.no_grad():
        expected = reference_critic_loss(algo, batch)
    torch.testing.assert_close(algo.update(batch, 0.0)["critic_loss"], expected, rtol=1e-5, atol=1e-6)


def test_twin_critics_reduce_to_their_minimum_in_the_target():
    spec = spread_spec()
    algo = make(MATD3, MATD3Config, spec, target_noise=0.0)
    batch = random_batch(spec)
    last = algo.critic_target["agent"].net.layers[-1]
    with torch.no_grad():
        last.bias[1] += 100.0  # member 1 of the target ensemble: far above member 0
        q_next = algo.q_values(
            algo.critic_target,
            "agent",
            batch.next_state,
            algo.joint_actions(algo.next_actions(batch.next_obs)),
        )
    torch.testing.assert_close(algo.reduce_critics(q_next), q_next[0])
    torch.testing.assert_close(reference_critic_loss(algo, batch), algo.update(batch, 0.0)["critic_loss"])


@pytest.mark.parametrize("share", [True, False])
def test_the_policy_gradient_reaches_each_agent_only_through_its_own_action(share):
    spec = tag_spec()
    algo = make(spec=spec, share_parameters=share)
    batch = random_batch(spec)
    for name, g in spec.groups.items():
        own = torch.rand(8, g.num_agents, 5, requires_grad=True)
        joint = algo.with_own_actions(batch.actions, name, own)  # (B, A, joint_dim)
        q_values = algo.q_values(algo.critic, name, batch.state, joint)  # (K, B, A)
        for a in range(g.num_agents):
            (grad,) = torch.autograd.grad(q_values[..., a].sum(), own, retain_graph=True)
            assert grad[:, a].abs().sum() > 0
            assert grad[:, torch.arange(g.num_agents) != a].abs().sum() == 0


def test_an_actor_update_moves_only_the_actors_of_agents_whose_critic_responds():
    # Per-agent networks; the critics of agents 1 and 2 are made constant. If the loss of agent 0 moved
    # other agents' actors (their batch actions replaced by actions from their actors), they would move.
    spec = spread_spec()
    algo = make(spec=spec, share_parameters=False)
    responds = torch.tensor([1.0, 0.0, 0.0]).view(3, 1, 1)
    with torch.no_grad():
        for nets in (algo.critic, algo.critic_target):
            nets["agent"].net.layers[-1].weight.mul_(responds)
    algo.critic["agent"].net.layers[-1].weight.register_hook(lambda grad: grad * responds)  # stay constant
    algo.update(random_batch(spec), 0.0)
    for layer in algo.actor["agent"].net.layers[::2]:
        assert layer.weight.grad[0].abs().sum() > 0
        assert layer.weight.grad[1:].abs().sum() == 0
    for layer in algo.critic["agent"].net.layers[:-1:2]:  # critics' gradients are the critic loss's only
        assert layer.weight.grad[1:].abs().sum() == 0


@pytest.mark.parametrize("cls, config_class", ALGOS)
@pytest.mark.parametrize("share", [True, False])
def test_updates_on_a_fixed_batch_lower_the_critic_loss(cls, config_class, share):
    spec = tag_spec()
    algo = make(cls, config_class, spec, share_parameters=share, learning_rate=3e-3)
    batch = random_batch(spec, size=64)
    losses = [float(algo.update(batch, 0.0)["critic_loss"]) for _ in range(60)]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def test_matd3_updates_actors_and_targets_every_policy_delay_updates():
    spec = spread_spec()
    algo = make(MATD3, MATD3Config, spec, policy_delay=3)
    batch = random_batch(spec)

    def snapshot():
        return [p.detach().clone() for p in (*algo.actor.parameters(), *algo.actor_target.parameters())]

    for update in range(1, 7):
        before = snapshot()
        metrics = algo.update(batch, 0.0)
        moved = [not torch.equal(b, a) for b, a in zip(before, snapshot(), strict=True)]
        assert ("actor_loss" in metrics) == (update % 3 == 0)
        assert all(moved) if update % 3 == 0 else not any(moved)
        assert all(value.dim() == 0 for value in metrics.values())


def test_matd3_smooths_the_target_actions_within_the_clip():
    spec = tag_spec()
    algo = make(MATD3, MATD3Config, spec, target_noise=10.0, target_noise_clip=0.05)
    obs = random_obs(spec, 64)
    plain, smoothed = MADDPG.next_actions(algo, obs), algo.next_actions(obs)
    for name in spec.groups:
        difference = (smoothed[name] - plain[name]).abs()
        assert difference.max() <= 0.05 + 1e-6 and difference.mean() > 0.01
        assert smoothed[name].abs().max() <= 1.0


@pytest.mark.parametrize("cls, config_class", ALGOS)
def test_state_dict_round_trip_gives_identical_actions(tmp_path, cls, config_class):
    spec = tag_spec()
    trained = make(cls, config_class, spec, share_parameters=False)
    for _ in range(4):
        trained.update(random_batch(spec), 0.0)
    torch.save(trained.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # tensors and primitives only
    restored = make(cls, config_class, spec, seed=1, share_parameters=False)
    restored.load_state_dict(state)
    obs = random_obs(spec, 5)
    for name, actions in trained.act(obs).items():
        assert torch.equal(actions, restored.act(obs)[name])
    assert restored.updates == trained.updates
    batch = random_batch(spec, seed=3)
    torch.manual_seed(5)
    expected = trained.update(batch, 0.0)
    torch.manual_seed(5)
    for key, value in restored.update(batch, 0.0).items():
        assert torch.equal(value, expected[key]), key


# -- learning ----------------------------------------------------------------------------------------


def random_team_return(episodes: int = 512) -> float:
    """The mean team return (the mean of the agents' returns) of uniformly random actions."""
    from phalanx.marl.mpe import SimpleSpread

    env = SimpleSpread(episodes, device="cpu", N=3, local_ratio=0.5, max_cycles=25, continuous_actions=True)
    env.reset(seed=123)
    generator = torch.Generator().manual_seed(0)
    for _ in range(25):
        *_, info = env.step({"agent": torch.rand(episodes, 3, 5, generator=generator)})
    return float(info["episode_return"]["agent"].mean())


# simple_spread_continuous to a team return of -17: uniformly random actions score about -26 and every
# agent driving to its nearest landmark about -18. With the presets (256 envs), MADDPG and MATD3 reach
# it at the second evaluation, 82k env steps (~15 s; seeds 0-2), and about -12 after 320k (~60 s).
@pytest.mark.parametrize("algo", ["maddpg", pytest.param("matd3", marks=pytest.mark.slow)])
def test_learns_simple_spread_continuous(tmp_path, algo):
    try:
        import phalanx.marl.trainer  # noqa: F401
    except ImportError as error:
        pytest.skip(f"the multi-agent trainer (phalanx.marl.trainer) cannot be imported: {error}")
    random_return = random_team_return()
    config = phalanx.make_config(
        algo,
        "simple_spread_continuous",
        run_dir=str(tmp_path / algo),
        seed=0,
        torch_threads=1,
        total_steps=163_840,
        stop_return=-17.0,
    )
    summary = phalanx.train(config, show_progress=False).summary
    assert random_return < -24.0, random_return
    assert summary["best_eval_return"] >= -17.0 >= random_return + 7.0, (random_return, summary)
    assert summary["total_steps"] < 163_840, summary


def test_redq_critic_subsets_come_from_the_algorithms_own_draws():
    """The subset of target critics (target_reduction redq) is drawn by the algorithm's ``draws``, as every
    other draw of its rule, so that a vectorized population (which passes its own) draws each member's."""

    class Recorded(Draws):
        def __init__(self):
            self.calls = []

        def subset(self, size, count, device):
            self.calls.append((size, count))
            return torch.arange(count, device=device)

    algo = make(num_critics=4, target_reduction="redq", target_subset=2)
    algo.draws = Recorded()
    q = torch.arange(4.0).view(4, 1, 1).expand(4, 3, 2)
    assert torch.equal(algo.reduce_critics(q), torch.zeros(3, 2))  # the min over critics 0 and 1
    assert algo.draws.calls == [(4, 2)]
