"""The batched classic-control envs against Gymnasium's reference implementations.

Parity runs step our sub-envs and as many reference envs (``gymnasium.make``, with its TimeLimit) in
lockstep with the same actions. States are synchronised only at episode starts (our freshly reset row,
or a "wide" start state, is copied into the reference), so any drift of the physics shows up.

Sensitivity (measured; see the module docstring of ``phalanx.envs.classic``): rounding differences
grow exponentially in CartPole with a balancing policy (the reference runs the unstable pole
open-loop under our actions), in Pendulum with random torques and in Acrobot. Float32 therefore
matches those only over short episodes (a shorter time limit on both sides), and float64 (which
follows the reference's operation order) over full ones, except Acrobot and a balanced CartPole,
where even the float64 reference diverges from itself, perturbed by one ulp, within a few hundred
steps; they are checked over shorter episodes too.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from phalanx.envs.classic import (
    CLASSIC_ENVS,
    AcrobotEnv,
    CartPoleEnv,
    MountainCarContinuousEnv,
    PendulumEnv,
)

RTOL, ATOL = 1e-4, 1e-5
Policy = Callable[[np.random.Generator, np.ndarray], np.ndarray]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Small tensors gain nothing from intra-op threads, and on a loaded 2-core machine the spinning
    OpenMP workers made the 100k-env steps ~40x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- policies: obs (N, d) float32 -> actions (int64 (N,) or float32 (N, 1)) ---------------------------
def _mix(
    rng: np.random.Generator, controlled: np.ndarray, random: np.ndarray, eps: float = 0.1
) -> np.ndarray:
    """Even rows follow ``controlled`` (with probability 1 - eps), odd rows act at random."""
    rows = np.arange(len(random)).reshape(-1, *([1] * (random.ndim - 1)))
    use = (rows % 2 == 0) & (rng.random(random.shape) > eps)
    return np.where(use, controlled, random)


def cartpole_random(rng, obs):
    return rng.integers(0, 2, len(obs))


def cartpole_balance(rng, obs):
    """Half the rows balance (long episodes, truncation at 500), half act at random."""
    x, x_dot, theta, theta_dot = obs.T
    balance = (theta + 0.5 * theta_dot + 0.05 * x + 0.2 * x_dot > 0).astype(np.int64)
    return _mix(rng, balance, rng.integers(0, 2, len(obs)))


def pendulum_policy(rng, obs):
    return rng.uniform(-3.0, 3.0, (len(obs), 1)).astype(np.float32)  # beyond +-2: exercises the clip


def mountain_car_policy(rng, obs):
    """Half the rows pump energy (reach the goal), half act at random (time out); some |a| > 1."""
    pump = np.sign(obs[:, 1:2]) + rng.normal(0.0, 0.3, (len(obs), 1))
    return _mix(rng, pump, rng.uniform(-1.5, 1.5, (len(obs), 1)), eps=0.0).astype(np.float32)


def acrobot_policy(rng, obs):
    """Half the rows pump with the second joint's velocity (terminate in ~90 steps), half random."""
    pump = np.where(obs[:, 5] > 0, 2, 0)
    return _mix(rng, pump, rng.integers(0, 3, len(obs)))


POLICIES: dict[str, Policy] = {
    "CartPole-v1": cartpole_balance,
    "Pendulum-v1": pendulum_policy,
    "MountainCarContinuous-v0": mountain_car_policy,
    "Acrobot-v1": acrobot_policy,
}


# -- wide start states: the reset distribution only covers states near rest ---------------------------
def cartpole_wide(rng, n):
    return rng.uniform([-2.0, -2.0, -0.2, -2.0], [2.0, 2.0, 0.2, 2.0], (n, 4))


def pendulum_wide(rng, n):
    return rng.uniform([-np.pi, -8.0], [np.pi, 8.0], (n, 2))


def acrobot_wide(rng, n):
    high = np.array([np.pi, np.pi, 4 * np.pi, 9 * np.pi])  # up to the velocity bounds
    return rng.uniform(-high, high, (n, 4))


def acrobot_moderate(rng, n):
    high = np.array([np.pi, np.pi, 2.0, 4.0])  # float32 RK4 steps at high speeds lose ~1e-4 each
    return rng.uniform(-high, high, (n, 4))


# -- lockstep parity -----------------------------------------------------------------------------
def _copy_state(ref: gym.Env, env, row: int) -> None:
    ref.unwrapped.state = env.state[row].cpu().numpy().astype(np.float64)


def _ref_action(action: np.ndarray):
    return int(action) if action.ndim == 0 else action.astype(np.float32)


def run_parity(
    env_id: str,
    dtype: torch.dtype,
    num_steps: int,
    policy: Policy,
    max_episode_steps: int | None = None,
    num_envs: int = 16,
    seed: int = 0,
    start: Callable[[np.random.Generator, int], np.ndarray] | None = None,
    atol: float = ATOL,
    **env_kwargs,
) -> dict[str, int]:
    """Step ours and the references in lockstep; return how many episodes terminated / truncated.

    With ``start``, every episode starts from ``start(rng, num_envs)[row]`` instead of our reset state.
    """
    limit = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = CLASSIC_ENVS[env_id](num_envs=num_envs, dtype=dtype, **limit, **env_kwargs)
    refs = [gym.make(env_id, disable_env_checker=True, **limit, **env_kwargs) for _ in range(num_envs)]
    env.reset(seed=seed)
    for row, ref in enumerate(refs):
        ref.reset(seed=row)
    rng = np.random.default_rng(seed)

    def restart(rows: np.ndarray) -> torch.Tensor:
        if start is not None:
            mask = torch.zeros(num_envs, dtype=torch.bool)
            mask[torch.from_numpy(rows)] = True
            wide = torch.as_tensor(start(rng, num_envs), dtype=dtype)
            env.state = torch.where(mask.unsqueeze(-1), wide, env.state)
        for row in rows:
            _copy_state(refs[row], env, row)
        return env._observe()

    obs = restart(np.arange(num_envs))
    counts = {"terminated": 0, "truncated": 0}
    for t in range(num_steps):
        actions = policy(rng, obs.numpy())
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(actions))
        results = [ref.step(_ref_action(a)) for ref, a in zip(refs, actions, strict=True)]
        ref_obs = np.stack([r[0] for r in results]).astype(np.float32)
        ref_reward = np.array([r[1] for r in results], dtype=np.float64)
        ref_terminated = np.array([r[2] for r in results])
        ref_truncated = np.array([r[3] for r in results])

        where = f"{env_id} {dtype} step {t}"
        np.testing.assert_array_equal(terminated.numpy(), ref_terminated, err_msg=where)
        np.testing.assert_array_equal(truncated.numpy(), ref_truncated, err_msg=where)
        np.testing.assert_allclose(info["final_obs"].numpy(), ref_obs, rtol=RTOL, atol=atol, err_msg=where)
        np.testing.assert_allclose(reward.numpy(), ref_reward, rtol=RTOL, atol=atol, err_msg=where)
        assert obs.dtype == reward.dtype == torch.float32

        done = ref_terminated | ref_truncated
        np.testing.assert_array_equal(info["_final_obs"].numpy(), done, err_msg=where)
        assert torch.equal(obs[~torch.from_numpy(done)], info["final_obs"][~torch.from_numpy(done)])
        counts["terminated"] += int(ref_terminated.sum())
        counts["truncated"] += int(ref_truncated.sum())
        for row in np.flatnonzero(done):
            refs[row].reset()  # restarts the TimeLimit count (and CartPole's steps_beyond_terminated)
        if done.any():
            obs = restart(np.flatnonzero(done))
    return counts


def _case(env_id, dtype, num_steps, policy, *, limit=None, start=None, num_envs=16, atol=ATOL, **minimum):
    return {
        "run": {
            "env_id": env_id,
            "dtype": dtype,
            "num_steps": num_steps,
            "policy": policy,
            "max_episode_steps": limit,
            "start": start,
            "num_envs": num_envs,
            "atol": atol,
        },
        "minimum": {"terminated": 0, "truncated": 0, **minimum},  # episodes the run must cover
    }


F32, F64 = torch.float32, torch.float64
PARITY_CASES = {
    # Random actions end CartPole episodes in ~20 steps (float32 drift reaches ~2e-5 in long ones).
    "cartpole-f32": _case("CartPole-v1", F32, 600, cartpole_random, atol=3e-5, terminated=300),
    "cartpole-f32-wide": _case("CartPole-v1", F32, 300, cartpole_random, start=cartpole_wide, terminated=300),
    "cartpole-f64": _case("CartPole-v1", F64, 700, cartpole_balance, limit=200, terminated=50, truncated=16),
    # Gymnasium stores this state in float32 itself: float32 agrees over full 999-step episodes.
    "mountaincar-f32": _case(
        "MountainCarContinuous-v0", F32, 2000, mountain_car_policy, num_envs=8, terminated=20, truncated=6
    ),
    "mountaincar-f64": _case(
        "MountainCarContinuous-v0", F64, 1000, mountain_car_policy, num_envs=8, terminated=10, truncated=4
    ),
    "pendulum-f32": _case("Pendulum-v1", F32, 300, pendulum_policy, limit=30, truncated=160),
    "pendulum-f32-wide": _case(
        "Pendulum-v1", F32, 200, pendulum_policy, limit=20, start=pendulum_wide, truncated=160
    ),
    "pendulum-f64": _case("Pendulum-v1", F64, 600, pendulum_policy, truncated=48),
    "pendulum-f64-wide": _case("Pendulum-v1", F64, 400, pendulum_policy, start=pendulum_wide, truncated=32),
    "acrobot-f32": _case("Acrobot-v1", F32, 200, acrobot_policy, limit=40, truncated=80),
    "acrobot-f32-wide": _case(
        "Acrobot-v1", F32, 100, acrobot_policy, limit=10, start=acrobot_moderate, terminated=30, truncated=100
    ),
    "acrobot-f64": _case("Acrobot-v1", F64, 600, acrobot_policy, limit=120, terminated=30, truncated=16),
    "acrobot-f64-wide": _case(
        "Acrobot-v1", F64, 150, acrobot_policy, limit=50, start=acrobot_wide, terminated=100, truncated=5
    ),
}


@pytest.mark.parametrize("case", list(PARITY_CASES))
def test_parity_with_gymnasium(case):
    counts = run_parity(**PARITY_CASES[case]["run"])
    for kind, minimum in PARITY_CASES[case]["minimum"].items():
        assert counts[kind] >= minimum, counts
    if PARITY_CASES[case]["run"]["env_id"] == "Pendulum-v1":
        assert counts["terminated"] == 0


def test_cartpole_sutton_barto_reward_parity():
    counts = run_parity("CartPole-v1", F32, 100, cartpole_random, sutton_barto_reward=True, atol=3e-5)
    assert counts["terminated"] > 10


# -- spaces, registry ----------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", list(CLASSIC_ENVS))
def test_spaces_and_time_limit_match_gymnasium(env_id):
    cls = CLASSIC_ENVS[env_id]
    assert cls.gymnasium_id == env_id
    env, ref = cls(num_envs=3), gym.make(env_id)
    assert env.single_observation_space == ref.observation_space
    assert env.single_action_space == ref.action_space
    assert env.max_episode_steps == gym.spec(env_id).max_episode_steps
    ref.reset(seed=0)
    assert env.state.shape == (3, len(ref.unwrapped.state))


# -- autoreset semantics --------------------------------------------------------------------------
def _initial_state_ok(env_id: str, state: torch.Tensor) -> torch.Tensor:
    """(N,) whether each state row lies in the reference's initial distribution."""
    if env_id == "CartPole-v1":
        return (state.abs() <= 0.05).all(-1)
    if env_id == "Pendulum-v1":
        return (state[:, 0].abs() <= np.pi) & (state[:, 1].abs() <= 1.0)
    if env_id == "MountainCarContinuous-v0":
        return (state[:, 0] >= -0.6) & (state[:, 0] <= -0.4) & (state[:, 1] == 0)
    return (state.abs() <= 0.1).all(-1)


def _terminal(env_id: str, obs: torch.Tensor) -> torch.Tensor:
    """(N,) the reference's termination condition evaluated on observations."""
    if env_id == "CartPole-v1":
        return (obs[:, 0].abs() > 2.4) | (obs[:, 2].abs() > CartPoleEnv.theta_threshold_radians)
    if env_id == "MountainCarContinuous-v0":
        return (obs[:, 0] >= 0.45) & (obs[:, 1] >= 0)
    if env_id == "Acrobot-v1":
        cos1, sin1, cos2, sin2 = obs[:, :4].T
        return -cos1 - (cos1 * cos2 - sin1 * sin2) > 1.0
    return torch.zeros(len(obs), dtype=torch.bool)


@pytest.mark.parametrize("env_id", list(CLASSIC_ENVS))
def test_autoreset_and_episode_statistics(env_id):
    num_envs = 32
    env = CLASSIC_ENVS[env_id](num_envs=num_envs)
    obs, _ = env.reset(seed=1)
    assert _initial_state_ok(env_id, env.state).all()
    rng = np.random.default_rng(1)
    returns, lengths = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)
    finished = truncations = 0
    for _ in range({"MountainCarContinuous-v0": 1000, "CartPole-v1": 600}.get(env_id, 400)):
        obs, reward, terminated, truncated, info = env.step(
            torch.as_tensor(POLICIES[env_id](rng, obs.numpy()))
        )
        returns += reward.numpy()
        lengths += 1
        done = terminated | truncated
        assert torch.equal(info["_final_obs"], done)
        assert torch.equal(terminated, _terminal(env_id, info["final_obs"]))
        assert env.observation_space.contains(obs.numpy())
        assert env.observation_space.contains(info["final_obs"].numpy())
        if done.any():
            d = done.numpy()
            assert _initial_state_ok(env_id, env.state[done]).all()
            assert torch.equal(obs[done], env._observe()[done])  # obs rows are the new episode's first
            assert not torch.equal(obs[done], info["final_obs"][done])
            np.testing.assert_array_equal(info["episode_length"].numpy()[d], lengths[d])
            np.testing.assert_allclose(info["episode_return"].numpy()[d], returns[d], rtol=1e-5, atol=1e-3)
            np.testing.assert_array_equal(lengths[truncated.numpy()], env.max_episode_steps)
            assert (lengths[d] <= env.max_episode_steps).all()
            returns[d], lengths[d] = 0.0, 0
            finished += int(d.sum())
            truncations += int(truncated.sum())
    assert finished > 0
    if env_id == "Pendulum-v1":  # never terminates: every row truncated at 200 and 400
        assert finished == truncations == 2 * num_envs
    if env_id in ("CartPole-v1", "MountainCarContinuous-v0"):  # the balancing / random rows time out
        assert 0 < truncations < finished


def test_pendulum_episode_length_is_time_limit():
    env = PendulumEnv(num_envs=4)
    env.reset(seed=0)
    actions = torch.zeros(4, 1)
    for step in range(1, 201):
        _, _, terminated, truncated, info = env.step(actions)
        assert not terminated.any()
        assert bool(truncated.all()) == (step == 200)
    assert (info["episode_length"] == 200).all()


# -- seeding, sizes, checkpoints -----------------------------------------------------------------
def _rollout(env, seed: int | None, num_steps: int, action_seed: int = 0) -> list[torch.Tensor]:
    """Reset with ``seed`` (or continue where ``env`` is) and collect every step's outputs."""
    obs = env._observe() if seed is None else env.reset(seed=seed)[0]
    out = [obs]
    rng = np.random.default_rng(action_seed)
    for _ in range(num_steps):
        actions = torch.as_tensor(POLICIES[env.gymnasium_id](rng, obs.numpy()))
        obs, reward, terminated, truncated, info = env.step(actions)
        out += [obs, reward, terminated, truncated, info["final_obs"]]
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("env_id", list(CLASSIC_ENVS))
def test_seeding_is_reproducible(env_id):
    cls = CLASSIC_ENVS[env_id]
    env = cls(num_envs=8, max_episode_steps=20)  # resets inside the rollout draw from the generator too
    first = _rollout(env, 3, 50)
    assert _same(first, _rollout(env, 3, 50))
    assert _same(first, _rollout(cls(num_envs=8, max_episode_steps=20), 3, 50))
    assert not torch.equal(first[0], _rollout(env, 4, 0)[0])


@pytest.mark.parametrize("env_id", list(CLASSIC_ENVS))
def test_state_dict_round_trip(env_id):
    cls = CLASSIC_ENVS[env_id]
    env = cls(num_envs=8, max_episode_steps=15)
    _rollout(env, 5, 12)
    checkpoint = env.state_dict()
    expected = _rollout(env, None, 40, action_seed=1)
    env.load_state_dict(checkpoint)
    assert _same(expected, _rollout(env, None, 40, action_seed=1))
    other = cls(num_envs=8, max_episode_steps=15)
    other.reset(seed=123)
    other.load_state_dict(checkpoint)
    assert _same(expected, _rollout(other, None, 40, action_seed=1))


@pytest.mark.parametrize("env_id", list(CLASSIC_ENVS))
def test_single_env(env_id):
    env = CLASSIC_ENVS[env_id](num_envs=1)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (1, *env.single_observation_space.shape) and obs.dtype == torch.float32
    for _ in range(10):
        obs, reward, terminated, truncated, _ = env.step(torch.as_tensor(env.action_space.sample()))
        assert obs.shape == (1, *env.single_observation_space.shape)
        assert reward.shape == terminated.shape == truncated.shape == (1,)
        assert reward.dtype == torch.float32 and terminated.dtype == truncated.dtype == torch.bool


def test_many_envs():
    env = CartPoleEnv(num_envs=100_000)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (100_000, 4)
    actions = torch.zeros(100_000, dtype=torch.int64)
    ended = torch.zeros(100_000, dtype=torch.bool)
    for _ in range(12):  # pushing left without pause, every pole falls past 12 degrees in ~9 steps
        obs, reward, terminated, truncated, info = env.step(actions)
        assert _initial_state_ok("CartPole-v1", env.state[terminated]).all()
        ended |= terminated
    assert reward.shape == (100_000,) and info["final_obs"].shape == (100_000, 4)
    assert env.observation_space.contains(obs.numpy())
    assert ended.all() and (env.elapsed_steps < 12).all()


def test_validation_and_dtypes():
    env = PendulumEnv(num_envs=4)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(4))
    with pytest.raises(ValueError, match="dtype"):
        AcrobotEnv(num_envs=2, dtype=torch.float16)
    # float64 by default where float32 rounding visibly changes trajectories within an episode
    assert (
        CartPoleEnv(num_envs=2).state.dtype
        == MountainCarContinuousEnv(num_envs=2).state.dtype
        == torch.float32
    )
    assert PendulumEnv(num_envs=2).state.dtype == AcrobotEnv(num_envs=2).state.dtype == torch.float64
    env = AcrobotEnv(num_envs=2, dtype=torch.float32)
    obs, _ = env.reset(seed=0)
    assert env.state.dtype == torch.float32 and obs.dtype == torch.float32
