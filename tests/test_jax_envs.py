"""The JAX simulator adapter (phalanx.envs.jax): gymnax and Brax behind the VecEnv contract.

Skipped, per package, when jax, gymnax or brax is not installed (`pip install 'phalanx[jax]'`). Brax
tests use the trivial 'fast' env: real Brax envs take tens of seconds to compile on a CPU.
"""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'phalanx[jax]')")

import phalanx  # noqa: E402
from phalanx.envs import check_vec_env, make_env  # noqa: E402
from phalanx.envs.jax import BraxVecEnv, GymnaxVecEnv, JaxVecEnv, split_keys  # noqa: E402
from phalanx.errors import EnvError  # noqa: E402


def needs_gymnax() -> None:
    pytest.importorskip("gymnax", reason="gymnax is not installed (pip install 'phalanx[jax]')")


def needs_brax() -> None:
    pytest.importorskip("brax.envs", reason="brax is not installed (pip install 'phalanx[jax]')")


def run_steps(env: JaxVecEnv, actions: list[torch.Tensor]) -> list[torch.Tensor]:
    trace = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        trace += [
            obs.clone(),
            reward.clone(),
            terminated.clone(),
            truncated.clone(),
            info["final_obs"].clone(),
        ]
    return trace


def test_preallocation_is_off_for_gpu_sharing():
    assert os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") is not None


# -- gymnax ----------------------------------------------------------------------------------------
def test_gymnax_cartpole_passes_check_vec_env():
    needs_gymnax()
    env = GymnaxVecEnv("CartPole-v1", num_envs=8)
    report = check_vec_env(env, num_steps=300)
    assert report.episodes > 0
    assert env.single_observation_space.dtype == np.float32
    assert env.single_action_space.n == 2


def test_gymnax_pendulum_continuous_passes_check_vec_env():
    needs_gymnax()
    env = GymnaxVecEnv("Pendulum-v1", num_envs=4, max_episode_steps=50)
    report = check_vec_env(env, num_steps=120)
    assert report.mean_episode_length == 50
    assert env.single_action_space.shape == (1,)
    assert float(env.single_action_space.high[0]) == pytest.approx(2.0)


def test_make_env_gymnax_prefix():
    needs_gymnax()
    env = make_env("gymnax:CartPole-v1", 8, seed=0)
    assert isinstance(env, GymnaxVecEnv)
    obs, reward, terminated, truncated, info = env.step(torch.zeros(8, dtype=torch.int64))
    assert obs.shape == (8, 4) and obs.dtype == torch.float32
    assert reward.dtype == torch.float32 and terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert set(info) >= {"final_obs", "_final_obs", "episode_return", "episode_length"}


def test_autoreset_matches_single_gymnax_env_with_the_same_keys():
    needs_gymnax()
    env = GymnaxVecEnv("CartPole-v1", num_envs=6)
    single, params = env.env, env.params
    step_one = jax.jit(lambda key, state, action: single.step_env(key, state, action, params))
    reset_one = jax.jit(lambda key: single.reset_env(key, params))
    env.reset(seed=5)
    generator = torch.Generator().manual_seed(0)
    ended_rows = 0
    for _ in range(40):
        key, state = env._key, env._state
        _, step_keys, reset_keys = split_keys(key, env.num_envs)
        actions = torch.randint(0, 2, (env.num_envs,), generator=generator)
        obs, reward, terminated, truncated, info = env.step(actions)
        for row in range(env.num_envs):
            row_state = jax.tree.map(lambda leaf, row=row: leaf[row], state)
            expected_obs, _, expected_reward, expected_terminal, _ = step_one(
                step_keys[row], row_state, int(actions[row])
            )
            np.testing.assert_allclose(info["final_obs"][row].numpy(), np.asarray(expected_obs), rtol=1e-5)
            assert bool(terminated[row]) == bool(expected_terminal)
            assert float(reward[row]) == pytest.approx(float(expected_reward))
            if bool(terminated[row] | truncated[row]):
                ended_rows += 1
                reset_obs, _ = reset_one(reset_keys[row])
                np.testing.assert_allclose(obs[row].numpy(), np.asarray(reset_obs), rtol=1e-6)
                # the last observation of the finished episode is a terminal CartPole state
                x, _, theta, _ = info["final_obs"][row].tolist()
                assert abs(x) > 2.4 or abs(theta) > 0.2094
            else:
                assert torch.equal(obs[row], info["final_obs"][row])
        assert torch.equal(info["_final_obs"], terminated | truncated)
    assert ended_rows > 0


def test_seeding_is_reproducible_and_seeds_differ():
    needs_gymnax()
    actions = [torch.randint(0, 2, (4,), generator=torch.Generator().manual_seed(i)) for i in range(30)]
    first, second = GymnaxVecEnv("CartPole-v1", 4), GymnaxVecEnv("CartPole-v1", 4)
    obs_first, _ = first.reset(seed=11)
    obs_second, _ = second.reset(seed=11)
    assert torch.equal(obs_first, obs_second)
    for a, b in zip(run_steps(first, actions), run_steps(second, actions), strict=True):
        assert torch.equal(a, b)
    other, _ = GymnaxVecEnv("CartPole-v1", 4).reset(seed=12)
    assert not torch.equal(obs_first, other)
    assert len({tuple(row.tolist()) for row in obs_first}) == 4, "sub-envs must get different keys"


def test_state_dict_resumes_the_same_trajectories():
    needs_gymnax()
    env = GymnaxVecEnv("CartPole-v1", 4)
    env.reset(seed=2)
    warmup = [torch.ones(4, dtype=torch.int64)] * 7
    run_steps(env, warmup)
    buffer = io.BytesIO()
    torch.save(env.state_dict(), buffer)
    actions = [torch.randint(0, 2, (4,), generator=torch.Generator().manual_seed(i)) for i in range(40)]
    expected = run_steps(env, actions)
    buffer.seek(0)
    resumed = GymnaxVecEnv("CartPole-v1", 4)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for a, b in zip(expected, run_steps(resumed, actions), strict=True):
        assert torch.equal(a, b)


def test_dlpack_transfers_are_zero_copy():
    needs_gymnax()
    env = GymnaxVecEnv("CartPole-v1", 4)
    env.reset(seed=0)
    array = jax.numpy.arange(12, dtype=jax.numpy.float32)
    assert env._to_torch(array).data_ptr() == array.unsafe_buffer_pointer()
    tensor = torch.arange(12, dtype=torch.float32)
    assert env._to_jax(tensor).unsafe_buffer_pointer() == tensor.data_ptr()
    actions = torch.ones(4, dtype=torch.int32)  # already the adapter's action dtype: no conversion
    assert env._actions_to_jax(actions).unsafe_buffer_pointer() == actions.data_ptr()
    leaf = env._state.x
    assert env._to_torch(leaf).data_ptr() == leaf.unsafe_buffer_pointer()


def test_step_errors():
    needs_gymnax()
    env = GymnaxVecEnv("CartPole-v1", 4)
    with pytest.raises(EnvError, match="before reset"):
        env.step(torch.zeros(4, dtype=torch.int64))
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"shape \(3,\), expected \(4,\)"):
        env.step(torch.zeros(3, dtype=torch.int64))


def test_gymnax_bad_names_and_parameters():
    needs_gymnax()
    with pytest.raises(EnvError, match="CartPole-v1") as caught:
        GymnaxVecEnv("CartPol-v1", 2)
    assert "Did you mean" in str(caught.value)
    with pytest.raises(EnvError, match="Did you mean: CartPole-v1"):
        make_env("gymnax:cartpole-v1", 2)
    with pytest.raises(EnvError, match="no parameter"):
        GymnaxVecEnv("CartPole-v1", 2, env_params={"gravityy": 1.0})


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnax", None)
    with pytest.raises(EnvError, match=r"pip install 'phalanx\[jax\]'"):
        GymnaxVecEnv("CartPole-v1", 2)
    monkeypatch.setitem(sys.modules, "brax", None)
    monkeypatch.setitem(sys.modules, "brax.envs", None)
    with pytest.raises(EnvError, match=r"pip install 'phalanx\[jax\]'"):
        BraxVecEnv("fast", 2)


def test_ppo_trains_on_gymnax_cartpole(tmp_path):
    needs_gymnax()
    config = phalanx.make_config(
        "ppo",
        "gymnax:CartPole-v1",
        use_preset=False,
        num_envs=8,
        total_steps=2048,
        eval_every=1024,
        eval_episodes=2,
        log_every=512,
        run_dir=str(tmp_path / "gymnax"),
        horizon=16,
        minibatch_size=64,
        epochs=2,
        hidden_sizes=(16, 16),
    )
    result = phalanx.train(config, show_progress=False)
    assert result.summary["total_steps"] >= 2048
    assert np.isfinite(result.summary["eval_return_mean"])


# -- brax ------------------------------------------------------------------------------------------
def test_brax_passes_check_vec_env():
    needs_brax()
    env = BraxVecEnv("fast", num_envs=4, episode_length=30)
    report = check_vec_env(env, num_steps=100)
    assert report.mean_episode_length == 30
    assert env.single_action_space.shape == (1,)


def test_brax_truncates_at_episode_length():
    needs_brax()
    env = make_env("brax:fast", 3, episode_length=5, seed=0)
    push = torch.ones(3, 1)
    for _ in range(4):
        obs, reward, terminated, truncated, info = env.step(push)
        assert not truncated.any() and not terminated.any()
    obs, reward, terminated, truncated, info = env.step(push)
    assert truncated.all() and not terminated.any()
    assert info["_final_obs"].all()
    assert torch.equal(info["episode_length"], torch.full((3,), 5))
    assert (info["final_obs"][:, 1] > 0).all(), "final_obs is the last state: velocity > 0 after pushing"
    assert torch.equal(obs, torch.zeros(3, 2)), "obs is the first observation of the next episode"
    obs, reward, terminated, truncated, info = env.step(push)
    assert not truncated.any()
    assert (info["episode_length"] == 1).all()


def test_brax_bad_name():
    needs_brax()
    with pytest.raises(EnvError, match="Did you mean: ant"):
        BraxVecEnv("antt", 2)
    with pytest.raises(EnvError, match="halfcheetah"):
        make_env("brax:halfchetah", 2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gymnax_on_cuda_follows_the_torch_device():
    needs_gymnax()
    try:
        env = GymnaxVecEnv("CartPole-v1", 16, device="cuda")
    except EnvError as error:
        pytest.skip(f"jax has no GPU backend here: {error}")
    obs, _ = env.reset(seed=0)
    assert obs.device.type == "cuda"
    obs, reward, *_ = env.step(torch.zeros(16, dtype=torch.int64, device="cuda"))
    assert obs.device.type == "cuda" and reward.device.type == "cuda"
    check_vec_env(env, num_steps=100)
