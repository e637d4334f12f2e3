"""make_env / register_env / list_envs / load_factory: resolution order and the errors users see; the
algorithm table (phalanx.registry): a name -> its class, and register_algorithm."""

from __future__ import annotations

import importlib.util
import uuid

import pytest
import torch

from phalanx import registry
from phalanx.config import AlgoConfig, make_config
from phalanx.envs.classic import CLASSIC_ENVS, MEMORY_ENVS, CartPoleEnv
from phalanx.envs.core import VecEnv
from phalanx.envs.registry import list_envs, load_factory, make_env, register_env, unregister_env
from phalanx.envs.workers import GymnasiumVecEnv
from phalanx.errors import ConfigError, EnvError
from phalanx.registry import (
    ALGORITHMS,
    agent_class,
    algorithm_class,
    config_class,
    get_algorithm,
    trainer_class,
    vectorized_population,
)


@pytest.fixture
def env_id():
    """A fresh id, unregistered afterwards."""
    name = f"Test{uuid.uuid4().hex[:8]}-v0"
    yield name
    unregister_env(name)


def test_builtin_ids_use_the_batched_simulators():
    env = make_env("CartPole-v1", num_envs=5, seed=0)
    assert isinstance(env, CartPoleEnv) and env.num_envs == 5
    again = make_env("CartPole-v1", num_envs=5, seed=0)
    assert torch.equal(env.state, again.state)  # seed given: already reset, reproducibly


def test_gym_prefix_forces_the_adapter_and_other_gymnasium_ids_use_it():
    env = make_env("gym:CartPole-v1", num_envs=2, seed=1)
    assert isinstance(env, GymnasiumVecEnv) and env.env_id == "CartPole-v1"
    assert isinstance(make_env("FrozenLake-v1", num_envs=1), GymnasiumVecEnv)


def test_unknown_id_suggests_close_names():
    with pytest.raises(EnvError) as info:
        make_env("CartPole-v2")
    message = str(info.value)
    assert "Unknown environment id 'CartPole-v2'" in message
    assert "Did you mean: CartPole-v1" in message and "phalanx envs" in message
    with pytest.raises(EnvError, match="Did you mean: CartPole-v1"):
        make_env("cartpole-v1")


def test_unknown_id_of_a_separate_package_says_where_it_lives():
    if importlib.util.find_spec("ale_py") is None:
        with pytest.raises(
            EnvError, match=r"ALE/Pong-v5.*Atari games need ale-py.*pip install 'phalanx\[atari\]'"
        ):
            make_env("ALE/Pong-v5")
    else:
        with pytest.raises(EnvError, match=r"Unknown Atari id 'ALE/Pongg-v5'.*Did you mean: ALE/Pong-v5"):
            make_env("ALE/Pongg-v5")
    if importlib.util.find_spec("envpool") is not None:
        with pytest.raises(EnvError, match="EnvPool has it: use 'envpool:Pong-v5'"):
            make_env("Pong-v5")


def test_missing_box2d_names_the_extra():
    if importlib.util.find_spec("Box2D") is not None:
        pytest.skip("Box2D is installed here")
    with pytest.raises(
        EnvError, match=r"'LunarLander-v3' is known to Gymnasium.*pip install 'phalanx\[box2d\]'"
    ):
        make_env("LunarLander-v3")


def test_missing_mujoco_names_the_extra():
    if importlib.util.find_spec("mujoco") is not None:
        pytest.skip("MuJoCo is installed here")
    with pytest.raises(EnvError, match=r"pip install 'phalanx\[mujoco\]'"):
        make_env("HalfCheetah-v5")


def test_bad_keyword_arguments_list_the_accepted_ones():
    with pytest.raises(
        EnvError, match=r"make_env\('CartPole-v1'\).*no_such_option.*It accepts: num_envs, device"
    ):
        make_env("CartPole-v1", no_such_option=3)


def test_register_env(env_id):
    def factory(num_envs, device, scale=1.0):
        env = CartPoleEnv(num_envs=num_envs, device=device)
        env.scale = scale
        return env

    register_env(env_id, factory)
    env = make_env(env_id, num_envs=3, scale=2.0)
    assert isinstance(env, VecEnv) and env.num_envs == 3 and env.scale == 2.0
    assert env_id in list_envs()["registered"]
    with pytest.raises(EnvError, match="already registered.*overwrite=True"):
        register_env(env_id, factory)
    register_env(env_id, lambda num_envs, device: CartPoleEnv(num_envs=1), overwrite=True)
    assert make_env(env_id, num_envs=3).num_envs == 1


def test_register_refuses_builtin_ids_and_non_vecenv_factories(env_id):
    with pytest.raises(EnvError, match="built-in phalanx environment"):
        register_env("CartPole-v1", lambda num_envs, device: None)
    register_env(env_id, lambda num_envs, device: object())
    with pytest.raises(EnvError, match="returned object, expected a phalanx.envs.VecEnv"):
        make_env(env_id)


def test_list_envs():
    envs = list_envs()
    assert set(envs) == {"builtin", "registered", "gymnasium", "needs_extra", "atari"}
    assert envs["atari"] is None or "ALE/Pong-v5" in envs["atari"]
    assert not any(env_id.startswith("ALE/") for env_id in envs["gymnasium"])
    assert envs["builtin"] == sorted([*CLASSIC_ENVS, *MEMORY_ENVS, "StockTrading-v0"])
    assert "CartPole-v1" in envs["gymnasium"] and "Ant-v2" not in envs["gymnasium"]
    assert set(envs["needs_extra"]) <= set(envs["gymnasium"])


@pytest.mark.parametrize(
    ("env_id", "reason"),
    [
        (
            "Ant-v2",
            "MuJoCo v2 and v3 environments need mujoco-py, which phalanx does not support. Use 'Ant-v5'",
        ),
        ("Hopper-v3", "Use 'Hopper-v5' (the same task on the mujoco package"),
        ("GymV21Environment-v0", "compatibility wrapper for environments of the old gym API"),
    ],
)
def test_ids_phalanx_cannot_run_say_why_and_are_not_listed(env_id, reason):
    with pytest.raises(EnvError) as info:
        make_env(env_id)
    message = str(info.value)
    assert f"Environment {env_id!r} cannot run in phalanx: " in message and reason in message
    if importlib.util.find_spec("mujoco") is not None:
        assert "pip install" not in message  # not the extra that is installed already
    assert env_id not in list_envs()["gymnasium"]


def test_load_factory(tmp_path, monkeypatch):
    assert load_factory("phalanx.envs.classic:CartPoleEnv") is CartPoleEnv
    assert load_factory("phalanx.envs.registry:make_env") is make_env
    with pytest.raises(EnvError, match="expected 'module.path:callable'"):
        load_factory("phalanx.envs.classic.CartPoleEnv")
    with pytest.raises(EnvError, match="module 'no_such_module_xyz' not found"):
        load_factory("no_such_module_xyz:make")
    with pytest.raises(EnvError, match="has no attribute 'CartPoleEnvv'.*Did you mean: CartPoleEnv"):
        load_factory("phalanx.envs.classic:CartPoleEnvv")
    with pytest.raises(EnvError, match="'CLASSIC_ENVS' is a dict, expected a callable"):
        load_factory("phalanx.envs.classic:CLASSIC_ENVS")
    name = f"user_env_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import not_installed_dependency_xyz\n")
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('bad module')\n")
    (tmp_path / f"{name}_ok.py").write_text("def make(num_envs, device):\n    return num_envs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvError, match="imports 'not_installed_dependency_xyz', which is not installed"):
        load_factory(f"{name}:make")
    with pytest.raises(EnvError, match="raised RuntimeError: bad module"):
        load_factory(f"{name}_broken:make")
    assert load_factory(f"{name}_ok:make")(num_envs=3, device="cpu") == 3


# -- the algorithm table (phalanx.registry) -------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_row_names_classes_that_agree(name):
    algorithm = get_algorithm(name)
    assert algorithm.name == name and algorithm.config_class is config_class(name)
    assert trainer_class(name).__name__ == ("MultiAgentTrainer" if algorithm.multi_agent else "Trainer")
    assert agent_class(name).__name__ == ("MultiAgentAgent" if algorithm.multi_agent else "Agent")


def test_unknown_algorithm_names_the_closest_and_all():
    with pytest.raises(
        ConfigError, match=r"unknown algorithm 'ppo2'\. Did you mean ppo.*Available: a2c, d3qn"
    ):
        get_algorithm("ppo2")
    assert get_algorithm("PPO") is get_algorithm("ppo")


def test_the_classes_declare_what_the_table_held():
    """Each algorithm's class says its variants (the table named them before the classes did)."""
    declared = {
        name: (get_algorithm(name).recurrent_variant, get_algorithm(name).vectorized_population)
        for name in ALGORITHMS
    }
    assert {name: variants for name, variants in declared.items() if variants != (None, None)} == {
        "ppo": ("phalanx.algos.recurrent:RecurrentPPO", "phalanx.population.vectorized:VectorizedPPO"),
        "a2c": ("phalanx.algos.recurrent:RecurrentA2C", None),
        "td3": (None, "phalanx.population.vectorized_off_policy:VectorizedTD3"),
        "sac": (None, "phalanx.population.vectorized_off_policy:VectorizedSAC"),
        "pqn": (None, "phalanx.population.vectorized_pqn:VectorizedPQN"),
    }
    assert algorithm_class(
        "ppo", make_config("ppo", "CartPole-v1", recurrent="lstm").hyperparameters
    ).__name__ == ("RecurrentPPO")
    assert vectorized_population("sac").algorithm_class is get_algorithm("sac")
    with pytest.raises(ConfigError, match="backend 'vectorized' trains ppo, pqn, td3, sac members"):
        vectorized_population("a2c")


class Custom:
    """What register_algorithm reads of a class (an Algorithm subclass declares more: see
    examples/custom_algorithm.py, trained from the command line by tests/test_examples.py)."""

    name = "custom-test"
    config_class = AlgoConfig
    on_policy = True


def test_register_algorithm_names_a_class_once(monkeypatch):
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    assert registry.register_algorithm(Custom) is Custom  # it decorates a class statement
    assert registry.register_algorithm(Custom) is Custom  # the module imported again: a no-op
    assert get_algorithm("Custom-Test") is Custom and config_class("custom-test") is AlgoConfig
    assert "custom-test" in registry.algorithm_names()
    with pytest.raises(ConfigError, match="unknown algorithm 'custom-tst'. Did you mean custom-test"):
        get_algorithm("custom-tst")

    other = type("Other", (Custom,), {})
    with pytest.raises(ConfigError, match="'custom-test' is already .*:Custom; give .*Other another name"):
        registry.register_algorithm(other)
    with pytest.raises(ConfigError, match="'ppo' is phalanx's own algorithm"):
        registry.register_algorithm(type("MyPPO", (Custom,), {"name": "ppo"}))
    for bad in ({"name": "Upper"}, {"name": ""}, {"config_class": None}):
        cls = type("Bad", (), {**vars(Custom), **bad})
        if bad == {"config_class": None}:
            del cls.config_class
        with pytest.raises(ConfigError, match="an algorithm class declares its `name`"):
            registry.register_algorithm(cls)
