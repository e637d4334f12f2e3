"""Rollout storage and GAE against a plain Python reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.buffers import RolloutBuffer, StepLayout, compute_gae
from phalanx.errors import CheckpointError


def reference_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE one env and one step at a time, in float64."""
    horizon, num_envs = rewards.shape
    advantages = np.zeros((horizon, num_envs), dtype=np.float64)
    for env in range(num_envs):
        advantage = 0.0
        for t in reversed(range(horizon)):
            if terminated[t, env]:
                target = float(rewards[t, env])
            else:  # not done, or truncated: bootstrap from the true next observation
                target = float(rewards[t, env]) + gamma * float(next_values[t, env])
            delta = target - float(values[t, env])
            if dones[t, env]:
                advantage = delta  # the next step belongs to another episode
            else:
                advantage = delta + gamma * gae_lambda * advantage
            advantages[t, env] = advantage
    return advantages, advantages + values.astype(np.float64)


def random_rollout(seed: int, horizon: int, num_envs: int, done_probability: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dones = rng.random((horizon, num_envs)) < done_probability
    terminated = dones & (rng.random((horizon, num_envs)) < 0.5)  # the other dones are truncations
    return dict(
        rewards=rng.normal(size=(horizon, num_envs)).astype(np.float32),
        values=rng.normal(size=(horizon, num_envs)).astype(np.float32),
        next_values=rng.normal(size=(horizon, num_envs)).astype(np.float32),
        terminated=terminated,
        dones=dones,
    )


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    horizon=st.integers(1, 12),
    num_envs=st.integers(1, 6),
    done_probability=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
    gamma=st.floats(0.0, 1.0),
    gae_lambda=st.floats(0.0, 1.0),
)
def test_compute_gae_matches_reference(
    seed: int, horizon: int, num_envs: int, done_probability: float, gamma: float, gae_lambda: float
) -> None:
    rollout = random_rollout(seed, horizon, num_envs, done_probability)
    advantages, returns = compute_gae(
        **{name: torch.from_numpy(array) for name, array in rollout.items()},
        gamma=gamma,
        gae_lambda=gae_lambda,
    )
    expected_advantages, expected_returns = reference_gae(**rollout, gamma=gamma, gae_lambda=gae_lambda)
    assert advantages.shape == returns.shape == (horizon, num_envs)
    assert advantages.dtype == torch.float32
    np.testing.assert_allclose(advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns.numpy(), expected_returns, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_and_termination_does_not() -> None:
    gamma, gae_lambda = 0.9, 0.8
    rewards = torch.tensor([[1.0, 1.0, 1.0]])  # (T=1, N=3): running, truncated, terminated
    values = torch.tensor([[0.5, 0.5, 0.5]])
    next_values = torch.tensor([[2.0, 2.0, 2.0]])
    terminated = torch.tensor([[False, False, True]])
    dones = torch.tensor([[False, True, True]])
    advantages, _ = compute_gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda)
    torch.testing.assert_close(
        advantages, torch.tensor([[1.0 + 0.9 * 2.0 - 0.5, 1.0 + 0.9 * 2.0 - 0.5, 0.5]])
    )

    # two steps: a done at t=0 cuts the recursion from t=1, whatever kind of done it is
    rewards = torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    values = torch.zeros(2, 3)
    next_values = torch.zeros(2, 3)
    terminated = torch.tensor([[False, False, True], [False, False, False]])
    dones = torch.tensor([[False, True, True], [False, False, False]])
    advantages, _ = compute_gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda)
    torch.testing.assert_close(advantages[0], torch.tensor([1.0 + 0.9 * 0.8 * 3.0, 1.0, 1.0]))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), horizon=st.integers(1, 10), gamma=st.floats(0.5, 1.0))
def test_lambda_one_without_dones_gives_discounted_returns_plus_bootstrap(
    seed: int, horizon: int, gamma: float
) -> None:
    num_envs = 3
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(horizon, num_envs, generator=generator, dtype=torch.float64)
    values = torch.randn(horizon, num_envs, generator=generator, dtype=torch.float64)
    last_value = torch.randn(num_envs, generator=generator, dtype=torch.float64)
    next_values = torch.cat([values[1:], last_value[None]])  # V(s_{t+1}), as no episode ends
    no_dones = torch.zeros(horizon, num_envs, dtype=torch.bool)
    _, returns = compute_gae(rewards, values, next_values, no_dones, no_dones, gamma, 1.0)

    expected = torch.empty_like(rewards)
    running = last_value
    for t in reversed(range(horizon)):
        running = rewards[t] + gamma * running
        expected[t] = running
    torch.testing.assert_close(returns, expected)


def test_compute_gae_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(T, N\)"):
        zeros = torch.zeros(4, 2)
        flags = torch.zeros(4, 2, dtype=torch.bool)
        compute_gae(zeros, zeros, torch.zeros(4, 3), flags, flags, 0.99, 0.95)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compute_gae_on_cuda_does_not_sync() -> None:
    rollout = random_rollout(0, 16, 64, 0.2)
    inputs = {name: torch.from_numpy(array).cuda() for name, array in rollout.items()}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        advantages, returns = compute_gae(**inputs, gamma=0.99, gae_lambda=0.95)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected_advantages, _ = reference_gae(**rollout, gamma=0.99, gae_lambda=0.95)
    np.testing.assert_allclose(advantages.cpu().numpy(), expected_advantages, rtol=1e-5, atol=1e-5)


# -- RolloutBuffer -----------------------------------------------------------------------------------


def make_buffer(discrete: bool, horizon: int = 4, num_envs: int = 3) -> RolloutBuffer:
    if discrete:
        return RolloutBuffer(horizon, num_envs, StepLayout((5,), torch.float32, (), torch.int64), "cpu")
    return RolloutBuffer(horizon, num_envs, StepLayout((5,), torch.float32, (2,), torch.float32), "cpu")


def random_step(buffer: RolloutBuffer, generator: torch.Generator) -> dict[str, torch.Tensor]:
    num_envs = buffer.num_envs
    if buffer.action_dtype == torch.int64:
        actions = torch.randint(0, 4, (num_envs, *buffer.action_shape), generator=generator)
    else:
        actions = torch.randn(num_envs, *buffer.action_shape, generator=generator)
    dones = torch.rand(num_envs, generator=generator) < 0.5
    return dict(
        obs=torch.randn(num_envs, *buffer.obs_shape, generator=generator),
        actions=actions,
        log_probs=torch.randn(num_envs, generator=generator),
        values=torch.randn(num_envs, generator=generator),
        rewards=torch.randn(num_envs, generator=generator),
        terminated=dones & (torch.rand(num_envs, generator=generator) < 0.5),
        dones=dones,
        next_obs=torch.randn(num_envs, *buffer.obs_shape, generator=generator),
    )


def fill(buffer: RolloutBuffer, seed: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    steps = [random_step(buffer, generator) for _ in range(buffer.horizon)]
    for step, row in enumerate(steps):
        buffer.add(step, **row)
    return steps


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_rollout_buffer_add_and_flatten(discrete: bool) -> None:
    buffer = make_buffer(discrete)
    storage_pointers = {name: getattr(buffer, name).data_ptr() for name in RolloutBuffer.FIELDS}
    steps = fill(buffer, seed=0)
    assert buffer.actions.dtype == (torch.int64 if discrete else torch.float32)
    assert buffer.terminated.dtype == buffer.dones.dtype == torch.bool
    for name in RolloutBuffer.FIELDS:
        stored = getattr(buffer, name)
        assert stored.data_ptr() == storage_pointers[name]  # written in place
        torch.testing.assert_close(stored, torch.stack([row[name] for row in steps]))

    obs, actions, values = buffer.flatten("obs", "actions", "values")
    assert obs.shape == (12, 5) and values.shape == (12,)
    assert actions.shape == ((12,) if discrete else (12, 2))
    torch.testing.assert_close(obs[4], buffer.obs[1, 1])  # row-major: index t * N + n
    values[4] = 123.0  # views, not copies
    assert buffer.values[1, 1] == 123.0


def test_rollout_buffer_add_checks_shapes() -> None:
    buffer = make_buffer(discrete=False)
    row = random_step(buffer, torch.Generator().manual_seed(0))
    row["actions"] = torch.zeros(3)  # missing the action dim
    with pytest.raises(ValueError, match="actions has shape"):
        buffer.add(0, **row)
    with pytest.raises(KeyError, match="fields"):
        buffer.flatten("advantages")


def test_rollout_buffer_nbytes() -> None:
    buffer = make_buffer(discrete=False, horizon=4, num_envs=3)
    steps = 4 * 3
    expected = steps * (5 * 4 * 2 + 2 * 4 + 3 * 4 + 2 * 1)  # obs, next_obs; actions; 3 floats; 2 bools
    assert buffer.nbytes == expected


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_rollout_buffer_state_dict_round_trip(discrete: bool, tmp_path) -> None:
    buffer = make_buffer(discrete)
    fill(buffer, seed=1)
    state = buffer.state_dict()
    torch.save(state, tmp_path / "buffer.pt")
    buffer.rewards.zero_()  # the state is a copy, not a view of the live buffer
    assert torch.count_nonzero(state["rewards"]) > 0

    restored = make_buffer(discrete)
    restored.load_state_dict(torch.load(tmp_path / "buffer.pt"))
    for name in RolloutBuffer.FIELDS:
        torch.testing.assert_close(getattr(restored, name), state[name])

    with pytest.raises(CheckpointError, match="num_envs"):
        make_buffer(discrete, num_envs=4).load_state_dict(state)
    with pytest.raises(CheckpointError, match="missing"):
        make_buffer(discrete).load_state_dict({"obs": state["obs"]})
