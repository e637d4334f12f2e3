"""The device replay buffer: ring order, true next observations, n-step targets, checkpoints, memory."""

from __future__ import annotations

import pytest
import torch

from phalanx.buffers import ReplayBuffer, StepLayout
from phalanx.errors import ConfigError


def fill(buffer: ReplayBuffer, steps: int, seed: int = 0, end_prob: float = 0.2):
    """Add random steps; return the per-step tensors for a reference computation."""
    generator = torch.Generator().manual_seed(seed)
    n = buffer.num_envs
    history = []
    for t in range(steps):
        obs = torch.full((n, 2), float(t)) + torch.arange(n).unsqueeze(1) / 100
        rewards = torch.rand(n, generator=generator)
        ends = torch.rand(n, generator=generator) < end_prob
        terminated = ends & (torch.rand(n, generator=generator) < 0.5)
        truncated = ends & ~terminated
        next_obs = obs + 0.5
        actions = torch.randint(3, (n,), generator=generator)
        buffer.add(obs, actions, rewards, next_obs, terminated, truncated)
        history.append((obs, actions, rewards, next_obs, terminated, truncated))
    return history


def reference_target(history, t, env, gamma, n_step):
    """Python reference of the n-step return and discount starting at step t of sub-env env."""
    total, discount = 0.0, 1.0
    for k in range(n_step):
        _, _, rewards, next_obs, terminated, truncated = history[t + k]
        total += discount * float(rewards[env])
        discount *= gamma
        if terminated[env]:
            return total, 0.0, next_obs[env]
        if truncated[env] or k == n_step - 1:
            return total, discount, next_obs[env]
    raise AssertionError


LAYOUT = StepLayout((2,), torch.float32, (), torch.int64)
"""Observations of 2 float32, discrete actions."""


@pytest.mark.parametrize("n_step", [1, 3])
def test_sampled_targets_match_a_reference(n_step):
    buffer = ReplayBuffer(capacity=40, num_envs=4, layout=LAYOUT, device="cpu")
    history = fill(buffer, steps=25)  # 10 slots per env: the ring has wrapped
    assert len(buffer) == 40
    torch.manual_seed(0)
    batch = buffer.sample(256, gamma=0.9, n_step=n_step)
    for i in range(256):
        t = int(batch.obs[i, 0].floor().item())  # obs encodes the step and the sub-env
        env = int(round((batch.obs[i, 0].item() - t) * 100))
        assert 15 <= t <= 24 - (n_step - 1), "sampled a slot that was overwritten or is not complete"
        rewards, discount, next_obs = reference_target(history, t, env, 0.9, n_step)
        assert batch.rewards[i].item() == pytest.approx(rewards, rel=1e-5)
        assert batch.discounts[i].item() == pytest.approx(discount, rel=1e-5)
        assert torch.equal(batch.next_obs[i], next_obs)
        assert batch.actions[i] == history[t][1][env]


def test_state_dict_round_trip_continues_identically():
    a = ReplayBuffer(capacity=24, num_envs=3, layout=LAYOUT, device="cpu")
    fill(a, steps=11)
    b = ReplayBuffer(capacity=24, num_envs=3, layout=LAYOUT, device="cpu")
    b.load_state_dict(a.state_dict())
    torch.manual_seed(1)
    x = a.sample(32, gamma=0.99, n_step=2)
    torch.manual_seed(1)
    y = b.sample(32, gamma=0.99, n_step=2)
    assert torch.equal(x.obs, y.obs) and torch.equal(x.rewards, y.rewards)


def test_buffer_that_cannot_fit_is_refused_before_allocating():
    with pytest.raises(
        ConfigError, match=r"needs .* GiB on cpu, but only .* GiB is available.*--buffer-size"
    ):
        ReplayBuffer(
            capacity=10**12,
            num_envs=1,
            layout=StepLayout((100,), torch.float32, (6,), torch.float32),
            device="cpu",
        )
