"""EnvPoolVecEnv: EnvPool's C++ envs follow the contract and match the raw pool transition by transition."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch

envpool = pytest.importorskip(
    "envpool", reason="EnvPool is not installed (pip install 'phalanx[envpool]'): EnvPool adapter not tested"
)

import phalanx  # noqa: E402 - after the skip, so that a missing envpool skips the whole file
from phalanx.envs.check import check_vec_env  # noqa: E402
from phalanx.envs.envpool import EnvPoolVecEnv  # noqa: E402
from phalanx.errors import EnvError  # noqa: E402

Policy = Callable[[np.ndarray], np.ndarray]


def cartpole_policy(obs: np.ndarray) -> np.ndarray:
    """Push towards the side the pole leans to, flipped on every other pole-velocity sign: short episodes."""
    return ((obs[:, 2] > 0) ^ (obs[:, 3] > 0.5)).astype(np.int64)


def cheetah_policy(obs: np.ndarray) -> np.ndarray:
    return np.tanh(obs[:, :6].astype(np.float32))


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [("CartPole-v1", {}), ("HalfCheetah-v5", {"max_episode_steps": 40}), ("FrozenLake-v1", {})],
)
def test_conforms_to_the_contract(env_id, kwargs):
    env = EnvPoolVecEnv(env_id, num_envs=3, **kwargs)
    report = check_vec_env(env, num_steps=200)
    assert report.episodes >= 3 and report.warnings == []
    env.close()


def test_make_env_builds_the_adapter():
    env = phalanx.make_env("envpool:CartPole-v1", num_envs=8, seed=0)
    assert isinstance(env, EnvPoolVecEnv)
    assert repr(env) == "EnvPoolVecEnv('CartPole-v1', num_envs=8, device=cpu)"
    obs, reward, terminated, truncated, info = env.step(torch.ones(8, dtype=torch.int64))
    assert obs.shape == (8, 4) and obs.dtype == torch.float32
    assert reward.dtype == torch.float32 and terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert info["final_obs"].shape == (8, 4) and info["_final_obs"].shape == (8,)
    env.close()


def raw_pool(env_id: str, num_envs: int, seed: int, **kwargs):
    """EnvPool's own Gymnasium pool, without its float64-bounds warning (the adapter silences it too)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        pool = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **kwargs)
        pool.observation_space, pool.action_space  # noqa: B018 - builds and caches the spaces
    return pool


def raw_transitions(env_id: str, num_envs: int, seed: int, steps: int, policy: Policy, **kwargs):
    """Per row of a raw (next-step autoreset) pool: its real transitions and its finished episodes.

    A transition is ``(obs, reward, terminated, truncated, next_obs)``; the step after an episode end is
    EnvPool's reset step (action ignored, reward 0), which is not a transition: its obs starts the next one.
    """
    pool = raw_pool(env_id, num_envs, seed, **kwargs)
    obs, _ = pool.reset()
    transitions: list[list[tuple]] = [[] for _ in range(num_envs)]
    episodes: list[list[tuple[float, int]]] = [[] for _ in range(num_envs)]
    returns = np.zeros(num_envs, dtype=np.float32)  # accumulated like EpisodeStatistics
    ended = np.zeros(num_envs, dtype=bool)
    for _ in range(steps):
        next_obs, reward, terminated, truncated, info = pool.step(policy(obs))
        for i in range(num_envs):
            if ended[i]:  # EnvPool's reset step
                assert reward[i] == 0 and info["elapsed_step"][i] == 0
                continue
            transitions[i].append((obs[i], reward[i], terminated[i], truncated[i], next_obs[i]))
            returns[i] += np.float32(reward[i])
            if terminated[i] or truncated[i]:
                episodes[i].append((float(returns[i]), int(info["elapsed_step"][i])))
                returns[i] = 0.0
        ended = terminated | truncated
        obs = next_obs
    pool.close()
    return transitions, episodes


@pytest.mark.parametrize(
    ("env_id", "kwargs", "policy"),
    [
        ("CartPole-v1", {}, cartpole_policy),  # episodes end by termination
        ("HalfCheetah-v5", {"max_episode_steps": 25}, cheetah_policy),  # ... by truncation
    ],
)
def test_same_step_autoreset_matches_the_raw_pool(env_id, kwargs, policy):
    # The policy is a function of the observation, so each row of the adapter and of the raw pool sees the
    # same episodes although the raw pool spends one extra step per episode end on its reset.
    num_envs, seed, steps = 4, 11, 120
    raw, raw_episodes = raw_transitions(env_id, num_envs, seed, steps + 20, policy, **kwargs)
    env = EnvPoolVecEnv(env_id, num_envs=num_envs, **kwargs)
    obs, _ = env.reset(seed=seed)
    ends = 0
    episodes: list[list[tuple[float, int]]] = [[] for _ in range(num_envs)]
    for t in range(steps):
        obs_before = obs
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(policy(obs.numpy())))
        done = terminated | truncated
        assert torch.equal(info["_final_obs"], done)
        assert torch.equal(info["final_obs"][~done], obs[~done])
        for i in range(num_envs):
            raw_obs, raw_reward, raw_terminated, raw_truncated, raw_next = raw[i][t]
            where = f"step {t}, row {i}"
            assert torch.equal(obs_before[i], torch.as_tensor(raw_obs, dtype=torch.float32)), where
            assert torch.equal(info["final_obs"][i], torch.as_tensor(raw_next, dtype=torch.float32)), where
            assert float(reward[i]) == np.float32(raw_reward), where
            assert bool(terminated[i]) == raw_terminated and bool(truncated[i]) == raw_truncated, where
            if done[i]:
                ends += 1
                # the reset observation is the first observation of the raw pool's next episode
                assert torch.equal(obs[i], torch.as_tensor(raw[i][t + 1][0], dtype=torch.float32)), where
                assert not torch.equal(obs[i], info["final_obs"][i]), where
                episodes[i].append((float(info["episode_return"][i]), int(info["episode_length"][i])))
    assert ends >= 8
    for i in range(num_envs):
        assert episodes[i] == raw_episodes[i][: len(episodes[i])]
    env.close()


def test_atari_frames_stay_uint8():
    env = EnvPoolVecEnv("Pong-v5", num_envs=2)
    assert env.single_observation_space.shape == (4, 84, 84)
    assert env.single_observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=3)
    pool = raw_pool("Pong-v5", num_envs=2, seed=3, reward_clip=True)
    raw_obs, _ = pool.reset()
    assert raw_obs.dtype == np.uint8
    assert obs.dtype == torch.uint8 and torch.equal(obs, torch.as_tensor(raw_obs))
    obs, *_ = env.step(torch.tensor([2, 3]))
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == torch.uint8
    env.close()
    pool.close()


def run(env: EnvPoolVecEnv, seed: int | None, actions: list[torch.Tensor]) -> list[torch.Tensor]:
    """Reset with ``seed`` (``None``: the env was reset already) and step; every returned tensor."""
    trace = [] if seed is None else [env.reset(seed=seed)[0].clone()]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        trace += [obs.clone(), reward, terminated, truncated, info["final_obs"]]
    return trace


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_reset_with_a_seed_is_reproducible():
    generator = torch.Generator().manual_seed(0)
    actions = [torch.rand(3, 6, generator=generator) * 2 - 1 for _ in range(60)]
    first = EnvPoolVecEnv("HalfCheetah-v5", num_envs=3, max_episode_steps=20)
    second = EnvPoolVecEnv("HalfCheetah-v5", num_envs=3, max_episode_steps=20)
    reference = run(first, 5, actions)
    assert same(run(second, 5, actions), reference)  # two envs, same seed
    assert same(run(first, 5, actions), reference)  # the same env reseeded after it has run
    assert not torch.equal(run(first, 6, actions)[0], reference[0])
    assert not torch.equal(first.reset()[0], reference[0])  # no seed: the random streams continue
    through_make_env = phalanx.make_env("envpool:HalfCheetah-v5", num_envs=3, seed=5, max_episode_steps=20)
    assert same(run(through_make_env, None, actions), reference[1:])  # make_env resets with its seed
    for env in (first, second, through_make_env):
        env.close()


def test_unknown_id_suggests_close_names():
    with pytest.raises(EnvError, match=r"Unknown EnvPool environment id 'HalfChetah-v5'.*HalfCheetah-v5"):
        phalanx.make_env("envpool:HalfChetah-v5")
    with pytest.raises(EnvError, match=r"'cartpole-v1'.*Did you mean: CartPole-v1.*case-sensitive"):
        EnvPoolVecEnv("cartpole-v1")


def test_missing_envpool_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # makes `import envpool` fail
    with pytest.raises(EnvError, match=r"'envpool' is not installed.*pip install 'phalanx\[envpool\]'"):
        EnvPoolVecEnv("CartPole-v1")


def test_invalid_arguments_and_actions_are_explained():
    with pytest.raises(EnvError, match=r"rejected the keyword arguments \['bogus'\].*max_episode_steps"):
        EnvPoolVecEnv("CartPole-v1", bogus=1)
    with pytest.raises(EnvError, match="batch_size=2 asks for EnvPool's asynchronous mode"):
        EnvPoolVecEnv("CartPole-v1", num_envs=4, batch_size=2)
    with pytest.raises(EnvError, match=r"seed=4294967296 is not a valid EnvPool seed"):
        EnvPoolVecEnv("CartPole-v1", seed=2**32)
    env = EnvPoolVecEnv("CartPole-v1", num_envs=4)
    with pytest.raises(EnvError, match=r"step: called before reset\(\)"):
        env.step(torch.zeros(4, dtype=torch.int64))
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"actions have shape \(3,\), expected \(4,\)"):
        env.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(EnvError, match=r"action 2 of sub-env 1 is outside the action space Discrete\(2\)"):
        env.step(torch.tensor([0, 2, 1, -1]))
    with pytest.raises(EnvError, match=r"reset: options=\{'reset_mask'"):
        env.reset(options={"reset_mask": np.ones(4, dtype=bool)})
    env.close()
    with pytest.raises(EnvError, match="the env is closed"):
        env.step(torch.zeros(4, dtype=torch.int64))
    cheetah = EnvPoolVecEnv("HalfCheetah-v5", num_envs=2)
    cheetah.reset(seed=0)
    with pytest.raises(EnvError, match=r"actions have shape \(2,\), expected \(2, 6\)"):
        cheetah.step(torch.zeros(2))
    cheetah.close()


def test_state_dict_holds_episode_statistics():
    env = EnvPoolVecEnv("CartPole-v1", num_envs=2)
    env.reset(seed=0)
    for _ in range(5):
        env.step(torch.zeros(2, dtype=torch.int64))
    other = EnvPoolVecEnv("CartPole-v1", num_envs=2)
    other.load_state_dict(env.state_dict())
    assert torch.equal(other.episode_statistics.lengths, torch.full((2,), 5))
    env.close()
    other.close()


def test_ppo_trains_on_envpool(tmp_path):
    config = phalanx.make_config(
        "ppo",
        "envpool:CartPole-v1",
        use_preset=False,
        num_envs=8,
        total_steps=2048,
        eval_every=1024,
        eval_episodes=3,
        log_every=512,
        run_dir=str(tmp_path / "run"),
        horizon=32,
        minibatch_size=64,
        epochs=2,
        hidden_sizes=(16, 16),
    )
    result = phalanx.train(config, show_progress=False)
    assert result.summary["total_steps"] >= 2048
    assert np.isfinite(result.summary["eval_return_mean"])
