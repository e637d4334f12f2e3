"""Compiled env steps: ``env.compile()`` against the eager step over whole episodes.

Every compile costs ~10 s on a 2-core CPU, so each compiled env is built once per module (fixtures) and
shapes stay small. Compiled and eager differ by float rounding only: the draws of the autoreset are the
same numbers (taken eagerly by ``step_noise``), so the trajectories, episode ends included, coincide.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from phalanx.compiling import compile_problem
from phalanx.config import TrainConfig
from phalanx.envs.classic import AcrobotEnv, CartPoleEnv, MountainCarContinuousEnv, PendulumEnv
from phalanx.envs.core import BatchedVecEnv, VecEnv
from phalanx.envs.wrappers import VecEnvWrapper
from phalanx.errors import ContractError
from phalanx.train.environments import build_env

pytestmark = pytest.mark.skipif(
    compile_problem(torch.device("cpu")) is not None,
    reason=f"torch.compile cannot run here: {compile_problem(torch.device('cpu'))}",
)

NUM_ENVS = 8
STEPS = 600


def trading_env(num_envs: int = NUM_ENVS) -> BatchedVecEnv:
    pytest.importorskip("pandas", reason="the finance extra (pandas, pyarrow) is not installed")
    from phalanx.envs.trading import StockTradingVecEnv
    from phalanx.finance.data import synthetic_market

    return StockTradingVecEnv(num_envs, data=synthetic_market(3, 400, seed=2), episode_length=40)


# short time limits, so that 600 steps cross many truncations as well as terminations
FACTORIES: dict[str, Callable[[], BatchedVecEnv]] = {
    "CartPole": lambda: CartPoleEnv(NUM_ENVS, max_episode_steps=60),
    "Pendulum": lambda: PendulumEnv(NUM_ENVS, max_episode_steps=50),
    "Acrobot": lambda: AcrobotEnv(NUM_ENVS, max_episode_steps=70),
    "MountainCarContinuous": lambda: MountainCarContinuousEnv(NUM_ENVS, max_episode_steps=80),
    "StockTrading": trading_env,
}


def random_actions(env: VecEnv, seed: int, steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    space = env.single_action_space
    if hasattr(space, "n"):
        return [torch.randint(0, int(space.n), (env.num_envs,), generator=generator) for _ in range(steps)]
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    return [
        low + (high - low) * torch.rand((env.num_envs, *space.shape), generator=generator)
        for _ in range(steps)
    ]


def assert_same_step(compiled: tuple, eager: tuple, where: str, atol: float = 1e-5) -> None:
    """Two steps' results alike: flags and lengths exactly, floats within rounding."""
    obs, reward, terminated, truncated, info = compiled
    torch.testing.assert_close(terminated, eager[2], rtol=0, atol=0, msg=f"terminated, {where}")
    torch.testing.assert_close(truncated, eager[3], rtol=0, atol=0, msg=f"truncated, {where}")
    torch.testing.assert_close(obs, eager[0], rtol=1e-5, atol=atol, msg=f"obs, {where}")
    torch.testing.assert_close(reward, eager[1], rtol=1e-5, atol=atol, msg=f"reward, {where}")
    for key in ("final_obs", "episode_return"):
        torch.testing.assert_close(info[key], eager[4][key], rtol=1e-5, atol=atol, msg=f"{key}, {where}")
    for key in ("_final_obs", "episode_length"):
        torch.testing.assert_close(info[key], eager[4][key], rtol=0, atol=0, msg=f"{key}, {where}")


@pytest.fixture(
    scope="module",
    # CartPole (float32) and Pendulum (float64) in the default suite; the rest compile under -m slow
    params=[
        name if name in ("CartPole", "Pendulum") else pytest.param(name, marks=pytest.mark.slow)
        for name in FACTORIES
    ],
)
def compiled_env(request: pytest.FixtureRequest) -> tuple[str, BatchedVecEnv]:
    env = FACTORIES[request.param]()
    assert env.compile() == ["env step"]
    assert env.compile() == ["env step"]  # idempotent
    return request.param, env


def test_compiled_step_follows_the_eager_one_over_whole_episodes(compiled_env):
    name, env = compiled_env
    eager = FACTORIES[name]()
    env.reset(seed=11)
    eager.reset(seed=11)
    ends = 0
    for step, actions in enumerate(random_actions(env, 5, STEPS)):
        result = env.step(actions)
        assert_same_step(result, eager.step(actions), f"{name} step {step}")
        ends += int(result[4]["_final_obs"].sum())
        for state_name in env.state_names:
            torch.testing.assert_close(
                getattr(env, state_name), getattr(eager, state_name), rtol=1e-5, atol=1e-5
            )
    torch.testing.assert_close(env.elapsed_steps, eager.elapsed_steps, rtol=0, atol=0)
    assert ends >= NUM_ENVS * 5, f"{name}: only {ends} episode ends in {STEPS} steps"


def test_block_seeding_and_resume_within_compiled_mode(compiled_env):
    """reset(seed=[...]) gives each block its own generator, also compiled; a state_dict taken in
    compiled mode continues identically (bit for bit: the same graph) in a fresh compiled env."""
    name, env = compiled_env
    eager = FACTORIES[name]()
    env.reset(seed=[3, 4])
    eager.reset(seed=[3, 4])
    actions = random_actions(env, 6, 200)
    for step, action in enumerate(actions[:100]):
        assert_same_step(env.step(action), eager.step(action), f"{name} blocks step {step}")
    saved = env.state_dict()
    first = [env.step(action) for action in actions[100:]]
    other = FACTORIES[name]()
    other.compile()
    other.load_state_dict(saved)
    for step, (action, expected) in enumerate(zip(actions[100:], first, strict=True)):
        result = other.step(action)
        for got, want in zip(result[:4], expected[:4], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"{name} resumed step {step}")


def test_step_with_noise_is_the_eager_step():
    """The interface a fused rollout traces: step(a) == step_with_noise(a, step_noise()) bit for bit."""
    env, reference = CartPoleEnv(NUM_ENVS, max_episode_steps=30), CartPoleEnv(NUM_ENVS, max_episode_steps=30)
    env.reset(seed=[1, 2, 3, 4])
    reference.reset(seed=[1, 2, 3, 4])
    for actions in random_actions(env, 1, 100):
        got = env.step_with_noise(actions, env.step_noise())
        want = reference.step(actions)
        for a, b in zip(got[:4], want[:4], strict=True):
            assert torch.equal(a, b)
        assert torch.equal(got[4]["final_obs"], want[4]["final_obs"])


# -- the training wrapper chain -------------------------------------------------------------------------
def training_env(env_id: str) -> VecEnv:
    config = TrainConfig(env=env_id, num_envs=NUM_ENVS, normalize_obs=True, normalize_reward=True)
    return build_env(config, NUM_ENVS, training=True)


@pytest.fixture(scope="module")
def compiled_chain() -> VecEnv:
    env = training_env("Pendulum-v1")  # NanGuard, RescaleAction, NormalizeObservation, ScaleReward
    assert env.traceable
    assert env.compile() == ["env step"]
    return env


def test_wrapped_training_chain_compiles_and_follows_the_eager_one(compiled_chain):
    eager = training_env("Pendulum-v1")
    compiled_chain.reset(seed=7)
    eager.reset(seed=7)
    actions = [2 * a - 1 for a in random_actions(eager, 2, 300)]  # the agent acts in [-1, 1]
    for step, action in enumerate(actions):
        assert_same_step(compiled_chain.step(action), eager.step(action), f"chain step {step}", atol=1e-4)
    saved, expected = compiled_chain.state_dict(), eager.state_dict()  # ScaleReward(Normalize(Rescale(Nan)))
    assert saved["env"]["env"]["env"]["num_steps"] == expected["env"]["env"]["env"]["num_steps"] == 300
    torch.testing.assert_close(saved["env"]["obs_statistics"], expected["env"]["obs_statistics"])
    torch.testing.assert_close(saved["return_statistics"], expected["return_statistics"])


def test_nan_guard_raises_in_the_compiled_chain(compiled_chain):
    """Inside the graph the guard records the first non-finite value on the device; the compiled step
    raises it (every step: check_every=1). The last test of the shared chain: its record stays set."""
    compiled_chain.reset(seed=1)
    compiled_chain.step(torch.zeros(NUM_ENVS, 1))
    actions = torch.zeros(NUM_ENVS, 1)
    actions[5, 0] = float("nan")
    with pytest.raises(ContractError, match=r"actions .* non-finite value at sub-env index 5, step \d+ "):
        compiled_chain.step(actions)


def test_a_wrapper_that_writes_step_is_not_compiled():
    class Loud(VecEnvWrapper):
        def step(self, actions):
            return self.env.step(actions)

    env = Loud(CartPoleEnv(2))
    assert not env.traceable and env.compile() == [] and env.step_noise() == ()
