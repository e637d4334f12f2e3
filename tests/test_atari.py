"""Atari: ``ALE/<Game>-v5`` with the standard preprocessing (in-process and in worker processes), and
``envpool:<Game>-v5``; uint8 frames, clipped rewards, episodic life, and the game score as statistics."""

from __future__ import annotations

import importlib.util
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from phalanx.envs import make_env
from phalanx.envs.atari import AtariGame, EpisodicLife, FireReset
from phalanx.envs.check import check_vec_env
from phalanx.envs.core import episode_ends
from phalanx.errors import EnvError

torch.set_num_threads(1)


needs_ale = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="the atari extra (ale-py, and opencv for Gymnasium's AtariPreprocessing) is not installed",
)


def test_missing_ale_py_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py raises ImportError
    with pytest.raises(EnvError, match=r"pip install 'phalanx\[atari\]'"):
        make_env("ALE/Pong-v5", num_envs=1)
    with pytest.raises(EnvError, match=r"pip install 'phalanx\[atari\]'"):
        make_env("gym:ALE/Pong-v5", num_envs=1)


def play(env, steps: int, seed: int, action_seed: int = 0):
    """Step ``env`` with seeded random actions; per step ``(obs, reward, terminated, truncated, info)``."""
    generator = torch.Generator().manual_seed(action_seed)
    env.reset(seed=seed)
    count = int(env.single_action_space.n)
    return [env.step(torch.randint(0, count, (env.num_envs,), generator=generator)) for _ in range(steps)]


@pytest.fixture(scope="module")
def space_invaders():
    """Two runs of Space Invaders (rewards 5 to 30, 3 lives) with the same seed and actions, rewards
    clipped and not: 2 x 520 steps of 2 sub-envs, a game over in each."""
    runs = {}
    for clip in (True, False):
        env = make_env("ALE/SpaceInvaders-v5", num_envs=2, clip_reward=clip)
        runs[clip] = play(env, 520, seed=11)
        env.close()
    return runs


@needs_ale
def test_preprocessed_frames_are_stacked_uint8(space_invaders):
    env = make_env("ALE/Breakout-v5", num_envs=2)
    assert env.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8)
    assert env.single_action_space == gym.spaces.Discrete(4)
    env.close()
    obs, _, _, _, info = space_invaders[True][10]
    assert obs.dtype == torch.uint8 and obs.shape == (2, 4, 84, 84)
    assert info["final_obs"].dtype == torch.uint8
    assert int(obs.max()) > 0


@needs_ale
def test_rewards_clipped_and_statistics_are_the_unclipped_game(space_invaders):
    clipped, raw = space_invaders[True], space_invaders[False]
    rewards = torch.stack([step[1] for step in raw])  # (T, 2) unclipped
    assert torch.equal(torch.stack([step[1] for step in clipped]), rewards.sign())  # same game, clipped
    assert rewards.max() >= 5  # clipping changes the sum
    games = 0
    for row in range(2):
        lives_lost, since, score = 0, 0, 0.0
        for step_clipped, step_raw in zip(clipped, raw, strict=True):
            _, reward, terminated, truncated, info = step_raw
            score += float(reward[row])
            since += 1
            game_over = bool(episode_ends(info)[row])
            assert game_over == bool(episode_ends(step_clipped[4])[row])
            if game_over:
                games += 1
                assert lives_lost == 2, "a game of Space Invaders ends at the third life lost"
                assert float(info["episode_return"][row]) == score  # the whole game, unclipped
                assert float(step_clipped[4]["episode_return"][row]) == score
                assert int(info["episode_length"][row]) == since
                lives_lost, since, score = 0, 0, 0.0
            elif terminated[row]:
                lives_lost += 1  # episodic life: terminated, the game goes on
    assert games == 2


@needs_ale
def test_episodic_life_continues_the_game_and_fire_reset_launches_the_ball():
    game = AtariGame("ALE/Breakout-v5")()
    chain = []
    wrapper = game
    while isinstance(wrapper, gym.Wrapper):
        chain.append(type(wrapper))
        wrapper = wrapper.env
    assert EpisodicLife in chain and FireReset in chain
    game.reset(seed=0)
    ale = game.unwrapped.ale
    for _ in range(300):  # NOOP only: the ball was launched by FIRE, so a life is lost
        _, _, terminated, truncated, _ = game.step(0)
        if terminated:
            break
    assert terminated and ale.lives() == 4
    game.reset()
    assert ale.lives() == 4  # continued, not a new game
    no_fire = AtariGame("ALE/Freeway-v5")()  # no FIRE action: no fire reset
    assert not any(isinstance(layer, FireReset) for layer in (no_fire, no_fire.env, no_fire.env.env))
    game.close()
    no_fire.close()


@needs_ale
def test_worker_processes_give_the_single_env_frames_and_the_contract():
    env = make_env("ALE/Pong-v5", num_envs=2, num_workers=2)
    assert env.env._views["obs"].dtype == np.uint8  # shared memory holds uint8 84x84 frames
    steps = play(env, 40, seed=3)
    single = AtariGame("ALE/Pong-v5")()
    frame, _ = single.reset(seed=4)  # sub-env 1 of a VecEnv seeded 3
    generator = torch.Generator().manual_seed(0)
    for obs, *_ in steps:
        actions = torch.randint(0, 6, (2,), generator=generator)
        frame, *_ = single.step(int(actions[1]))
        assert np.array_equal(obs[1, -1].numpy(), frame)
    report = check_vec_env(env, num_steps=50)
    assert report.num_steps == 50
    env.close()
    single.close()


@needs_ale
def test_seeding_is_deterministic():
    first, second = (make_env("ALE/Pong-v5", num_envs=2) for _ in range(2))
    for a, b in zip(play(first, 30, seed=7), play(second, 30, seed=7), strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    other = play(first, 30, seed=8)
    assert not torch.equal(other[-1][0], a[0])
    first.close()
    second.close()


@needs_ale
def test_unknown_game_and_settings():
    with pytest.raises(EnvError, match="Did you mean: ALE/Pong-v5"):
        make_env("ALE/Pongg-v5", num_envs=1)
    with pytest.raises(EnvError, match="unknown Atari settings \\['frameskip'\\]"):
        make_env("ALE/Pong-v5", num_envs=1, frameskip=3)


def test_envpool_atari_frames_and_game_score():
    pytest.importorskip("envpool", reason="the envpool extra is not installed")
    env = make_env("envpool:Breakout-v5", num_envs=2)
    assert env.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), dtype=np.uint8)
    steps = play(env, 500, seed=1)
    games = 0
    for row in range(2):
        lives_lost, since, score = 0, 0, 0.0
        for obs, reward, terminated, _, info in steps:
            assert obs.dtype == torch.uint8
            assert float(reward[row]) in (-1.0, 0.0, 1.0)  # reward_clip on by default
            score += float(info["reward"][row])  # EnvPool's unclipped reward
            since += 1
            if episode_ends(info)[row]:
                games += 1
                assert lives_lost == 4 and float(info["episode_return"][row]) == score
                assert int(info["episode_length"][row]) == since
                lives_lost, since, score = 0, 0, 0.0
            elif terminated[row]:
                lives_lost += 1
                assert torch.equal(obs[row], info["final_obs"][row])  # the game goes on
    assert games >= 2
    assert check_vec_env(env, num_steps=200).num_steps == 200
    env.close()


@needs_ale
@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "envpool:Pong-v5"])
def test_a_video_plays_the_preprocessed_frames_to_the_policy_and_draws_the_game(tmp_path, env_id):
    """The video env of an Atari run feeds the policy the stacked 84x84 frames it trained on and draws the
    full-colour game; an EnvPool game is played by ale-py's (EnvPool does not render)."""
    import phalanx
    from phalanx.envs.atari import video_env
    from phalanx.video import record_video

    env = video_env(env_id)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.render().shape == (210, 160, 3)
    env.close()
    if env_id.startswith("envpool:"):  # the same video env, from the same GymnasiumEpisode: no training
        return
    config = phalanx.make_config(
        "ppo", env_id, use_preset=False, run_dir=str(tmp_path / "run"), num_envs=2, total_steps=64,
        horizon=16, minibatch_size=32, epochs=1, eval_every=0, eval_episodes=1, video_every=64,
        video_format="gif",
    )  # fmt: skip
    result = phalanx.train(config, show_progress=False)
    assert sorted(p.name for p in (result.run_dir / "videos").iterdir())  # --video-every recorded
    path = record_video(result.run_dir, "latest", video_format="gif", max_steps=20)
    assert path.is_file() and path.stat().st_size > 1000


@needs_ale
def test_ales_banner_is_not_printed_by_every_worker():
    import subprocess

    script = (
        "from phalanx.envs import make_env\n"
        "if __name__ == '__main__':\n"
        "    env = make_env('ALE/Pong-v5', num_envs=2, num_workers=2)\n"
        "    env.reset(seed=0)\n"
        "    env.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "A.L.E" not in done.stdout + done.stderr
