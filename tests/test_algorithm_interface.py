"""The algorithm interface: state dicts built from the networks and optimisers an algorithm holds (the
checkpoint format unchanged), and exploration policies the pipeline copies."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from phalanx.algos.base import Algorithm, ExplorationPolicy
from phalanx.algos.ddpg import DDPG
from phalanx.algos.dqn import D3QN, DQN, DoubleDQN, DuelingDQN
from phalanx.algos.ppo import A2C, PPO
from phalanx.algos.pqn import PQN
from phalanx.algos.sac import REDQ, SAC
from phalanx.algos.td3 import TD3
from phalanx.marl.core import AgentGroup, MultiAgentSpec
from phalanx.marl.maddpg import MADDPG, MATD3
from phalanx.marl.mappo import IPPO, MAPPO
from phalanx.marl.qmix import QMIX, VDN

ALGORITHMS = [
    PPO,
    A2C,
    DQN,
    DoubleDQN,
    DuelingDQN,
    D3QN,
    PQN,
    DDPG,
    TD3,
    SAC,
    REDQ,
    MAPPO,
    IPPO,
    QMIX,
    VDN,
    MADDPG,
    MATD3,
]

ENSEMBLE_CRITIC = {"actor", "critic", "critic_target", "actor_optimizer", "critic_optimizer", "updates"}
CHECKPOINT_KEYS = {
    "ppo": {"policy", "value", "optimizer"},
    "a2c": {"policy", "value", "optimizer"},
    "dqn": {"q_network", "q_target", "optimizer", "updates"},
    "pqn": {"q_network", "optimizer", "exploration_decay"},
    "ddpg": ENSEMBLE_CRITIC | {"actor_target"},
    "td3": ENSEMBLE_CRITIC | {"actor_target"},
    "sac": ENSEMBLE_CRITIC | {"log_alpha", "alpha_optimizer"},
    "redq": ENSEMBLE_CRITIC | {"log_alpha", "alpha_optimizer"},
    "maddpg": ENSEMBLE_CRITIC | {"actor_target"},
    "matd3": ENSEMBLE_CRITIC | {"actor_target"},
    "qmix": {"groups", "optimizer", "updates"},
    "vdn": {"groups", "optimizer", "updates"},
    "mappo": {"team"},
    "ippo": {"team"},
}
CHECKPOINT_KEYS |= {name: CHECKPOINT_KEYS["dqn"] for name in ("double-dqn", "dueling-dqn", "d3qn")}


def build(name: str, seed: int) -> Algorithm:
    """``name`` on small spaces: a team of two agents for the multi-agent algorithms."""
    torch.manual_seed(seed)
    cls = next(algorithm for algorithm in ALGORITHMS if algorithm.name == name)
    discrete = gym.spaces.Discrete in cls.action_spaces and name not in ("ppo", "a2c")
    if cls.multi_agent:
        discrete = "discrete" in cls.action_kinds and "continuous" not in cls.action_kinds
        action = gym.spaces.Discrete(5) if discrete else gym.spaces.Box(-1, 1, (2,), np.float32)
        observation = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
        groups = {"team": AgentGroup(("a0", "a1"), observation, action)}
        return cls(cls.config_class(), MultiAgentSpec(groups, gym.spaces.Box(-1, 1, (9,))), "cpu")
    action = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1, 1, (2,), np.float32)
    return cls(cls.config_class(), gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), action, "cpu")


def flat(state: dict, prefix: str = "") -> dict:
    """Every leaf of a nested state dict by its path."""
    leaves = {}
    for key, value in state.items():
        if isinstance(value, dict):
            leaves |= flat(value, f"{prefix}{key}/")
        elif isinstance(value, list):
            leaves |= flat(dict(enumerate(value)), f"{prefix}{key}/")
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_every_algorithm_is_covered():
    assert {algorithm.name for algorithm in ALGORITHMS} == set(CHECKPOINT_KEYS)


@pytest.mark.parametrize("name", sorted(CHECKPOINT_KEYS))
def test_the_state_dict_has_the_checkpoint_keys_and_loads_into_another_instance(name):
    source, target = build(name, seed=0), build(name, seed=1)
    state = source.state_dict()
    assert set(state) == CHECKPOINT_KEYS[name]
    before = flat(target.state_dict())
    assert not all(same(value, before[key]) for key, value in flat(state).items())  # other weights
    target.load_state_dict(copy.deepcopy(state))
    loaded = flat(target.state_dict())
    assert loaded.keys() == flat(state).keys()
    assert all(same(value, loaded[key]) for key, value in flat(state).items())


@pytest.mark.parametrize("name", ["dqn", "ddpg", "td3", "sac", "redq"])
def test_a_copy_of_the_exploration_policy_acts_as_the_algorithm_until_the_weights_change(name):
    algorithm = build(name, seed=0)
    policy = algorithm.exploration_policy()
    assert isinstance(policy, ExplorationPolicy)
    assert set(algorithm.state_dict()) == CHECKPOINT_KEYS[name]  # its networks are saved once
    copied = copy.deepcopy(policy)
    obs = torch.randn(5, 4)
    torch.manual_seed(3)
    expected = algorithm.explore(obs, 10)
    torch.manual_seed(3)
    assert torch.equal(copied(obs, 10), expected)
    with torch.no_grad():
        for tensor in policy.tensors():
            tensor.add_(1.0)
    torch.manual_seed(3)
    assert torch.equal(copied(obs, 10), expected)  # its own networks
    torch._foreach_copy_(copied.tensors(), policy.tensors())
    torch.manual_seed(3)
    changed = algorithm.explore(obs, 10)
    torch.manual_seed(3)
    assert torch.equal(copied(obs, 10), changed)


def test_dqn_epsilon_is_the_schedule_at_the_step_it_acted_on():
    dqn = build("dqn", seed=0)
    config = dqn.config
    policy = copy.deepcopy(dqn.exploration_policy())
    assert dqn.exploration_policy().epsilon == config.exploration_initial
    policy(torch.randn(2, 4), config.exploration_steps)
    assert policy.epsilon == pytest.approx(config.exploration_final)
    assert dqn.exploration_policy().epsilon == config.exploration_initial  # a plain value per copy
    dqn.exploration_policy().advance_to(config.exploration_steps // 2)
    middle = (config.exploration_initial + config.exploration_final) / 2
    assert dqn.exploration_policy().epsilon == pytest.approx(middle)
