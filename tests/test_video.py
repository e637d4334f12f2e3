"""Videos: `phalanx eval --video` (MP4 by default, GIF on request), `record_video`, the encoders, and
`video_every`, which records during training; bad input and missing renderers or encoders."""

from __future__ import annotations

import ctypes.util
import os
import sys

import gymnasium as gym
import numpy as np
import pytest

import phalanx
from phalanx.cli import main
from phalanx.errors import ConfigError, EnvError
from phalanx.train.environments import EVAL_SEED_OFFSET
from phalanx.train.videos import GymnasiumEpisode, use_headless_rendering, write_video
from phalanx.video import record_video

av = pytest.importorskip("av", reason="decoding the MP4s needs PyAV (the render extra)")
pytest.importorskip("pygame", reason="classic-control rendering needs pygame (the render extra)")

TINY = dict(num_envs=8, total_steps=256, horizon=16, minibatch_size=64, eval_every=0, torch_threads=1)


def tiny_config(run_dir, **overrides):
    return phalanx.make_config("ppo", "CartPole-v1", run_dir=str(run_dir), **{**TINY, **overrides})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return phalanx.train(tiny_config(tmp_path_factory.mktemp("video") / "run"), show_progress=False).run_dir


def decode(path):
    """(frames, codec, pixel format, frames per second) of an MP4."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        return frames, stream.codec_context.name, stream.codec_context.pix_fmt, float(stream.average_rate)


def episode_length(run_dir, seed):
    """The steps of the agent's deterministic episode on Gymnasium's CartPole from ``seed``."""
    agent = phalanx.load_agent(run_dir)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    for step in range(1, 10_000):
        obs, _, terminated, truncated, _ = env.step(agent.act(obs))
        if terminated or truncated:
            return step
    raise AssertionError("the episode did not end")


def test_eval_video_writes_an_mp4_of_the_episode(run, capsys):
    assert main(["eval", str(run), "--episodes", "1", "--video"]) == 0
    path = run / "videos" / "CartPole-v1_step256.mp4"
    assert f"video: {path}" in capsys.readouterr().err.replace("\n", "")
    frames, codec, pixel_format, fps = decode(path)
    assert (codec, pixel_format, fps) == ("h264", "yuv420p", 50.0)  # CartPole's own render_fps: real time
    assert len(frames) == episode_length(run, seed=EVAL_SEED_OFFSET) + 1  # the reset state, then each step
    assert frames[0].shape == (400, 600, 3)
    assert not list((run / "videos").glob("*.tmp"))


def test_eval_video_writes_a_gif_on_request(run):
    assert main(["eval", str(run), "--episodes", "1", "--video-format", "gif", "--video-fps", "25"]) == 0
    from PIL import Image

    with Image.open(run / "videos" / "CartPole-v1_step256.gif") as image:
        assert image.format == "GIF" and image.size == (600, 400) and image.n_frames > 2
        durations = []
        for index in range(image.n_frames):  # identical frames in a row merge, adding their durations
            image.seek(index)
            durations.append(image.info["duration"])
    assert sum(durations) == 40 * (episode_length(run, seed=EVAL_SEED_OFFSET) + 1)  # 40 ms a frame: 25 fps


def test_record_video_plays_episodes_back_to_back(run):
    path = record_video(run, episodes=2, max_steps=5, fps=10, seed=3)
    frames, _, _, fps = decode(path)
    assert len(frames) == 2 * (5 + 1) and fps == 10.0  # each episode capped at 5 steps


def test_odd_frame_sizes_are_padded_to_even(tmp_path):
    frames = [np.full((5, 7, 3), 40 * index, dtype=np.uint8) for index in range(4)]
    decoded, _, _, _ = decode(write_video(tmp_path / "odd.mp4", frames, fps=4, video_format="mp4"))
    assert len(decoded) == 4 and decoded[0].shape == (6, 8, 3)  # yuv420p needs even sizes


def test_a_video_that_fails_midway_leaves_no_file(tmp_path):
    def frames():
        yield np.zeros((8, 8, 3), dtype=np.uint8)
        raise RuntimeError("renderer died")

    with pytest.raises(RuntimeError, match="renderer died"):
        write_video(tmp_path / "broken.mp4", frames(), fps=10, video_format="mp4")
    assert list(tmp_path.iterdir()) == []


def test_imageio_ffmpeg_encodes_when_pyav_is_absent(tmp_path, monkeypatch):
    pytest.importorskip("imageio_ffmpeg", reason="the fallback encoder is not installed")
    frames = [np.full((6, 10, 3), 20 * index, dtype=np.uint8) for index in range(7)]
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "av", None)  # `import av` fails as if it were not installed
        path = write_video(tmp_path / "fallback.mp4", frames, fps=7, video_format="mp4")
    decoded, codec, pixel_format, fps = decode(path)
    assert (len(decoded), decoded[0].shape, fps) == (7, (6, 10, 3), 7.0)
    assert (codec, pixel_format) == ("h264", "yuv420p")
    assert not list(tmp_path.glob("*.tmp"))


def test_no_mp4_encoder_names_the_extra(run, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    with pytest.raises(ConfigError, match=r"pip install 'phalanx\[render\]'.*--video-format gif"):
        record_video(run)
    assert main(["eval", str(run), "--video"]) == 2  # before the evaluation runs


def test_bad_video_settings_are_refused(run, tmp_path):
    with pytest.raises(ConfigError, match="video format 'webm'"):
        record_video(run, video_format="webm")
    with pytest.raises(ConfigError, match="episodes = 0"):
        record_video(run, episodes=0)
    with pytest.raises(SystemExit):
        main(["eval", str(run), "--video-format", "webm"])
    assert main(["eval", str(run), "--video-fps", "0"]) == 2
    for setting, message in (
        ({"video_every": -1}, "video_every = -1 is invalid: expected >= 0"),
        ({"video_every": 128, "video_format": "webm"}, "video_format = 'webm' is invalid"),
    ):
        with pytest.raises(ConfigError, match=message):
            phalanx.train(tiny_config(tmp_path / "refused", **setting), show_progress=False)
    assert not (tmp_path / "refused").exists()


def test_video_every_records_during_training(tmp_path):
    config = tiny_config(tmp_path / "run", total_steps=512, video_every=256, video_format="gif")
    result = phalanx.train(config, show_progress=False)
    videos = sorted(path.name for path in (result.run_dir / "videos").iterdir())
    assert videos == ["CartPole-v1_step256.gif", "CartPole-v1_step512.gif"]  # the names the tracker reads
    assert "video_every: 256" in (result.run_dir / "config.yaml").read_text()  # a resume records on


def test_video_every_on_an_env_that_cannot_render_fails_before_the_run(tmp_path, monkeypatch):
    class NoRenderer(gym.Wrapper):
        def render(self):
            raise gym.error.DependencyNotInstalled("pygame is not installed")

    make = gym.make
    monkeypatch.setattr(gym, "make", lambda *a, **k: NoRenderer(make(*a, **k)))
    message = r"cannot render 'CartPole-v1': pygame is not installed.*phalanx\[render\]"
    with pytest.raises(EnvError, match=message):
        phalanx.train(tiny_config(tmp_path / "run", video_every=128), show_progress=False)
    assert not (tmp_path / "run").exists()


def cartpole_vec_env(num_envs, device, **kwargs):
    return phalanx.envs.make_env("CartPole-v1", num_envs=num_envs, device=device)


def test_video_every_on_an_env_gymnasium_does_not_know_fails_before_the_run(tmp_path):
    phalanx.envs.register_env("MyCartPole-v0", cartpole_vec_env, overwrite=True)
    config = phalanx.make_config("ppo", "MyCartPole-v0", run_dir=str(tmp_path / "run"), **TINY)
    config.video_every = 128
    with pytest.raises(EnvError, match="cannot render 'MyCartPole-v0' with Gymnasium's rgb_array rendering"):
        phalanx.train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


def test_a_video_failing_midway_does_not_stop_the_run(tmp_path, monkeypatch, capsys):
    from phalanx.train import videos

    write = videos.write_video
    calls = []

    def fail_the_first(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 1:
            raise OSError("disk full")
        return write(*args, **kwargs)

    monkeypatch.setattr(videos, "write_video", fail_the_first)
    config = tiny_config(tmp_path / "run", total_steps=256, video_every=128)
    result = phalanx.train(config, show_progress=False)
    assert result.summary["total_steps"] == 256
    assert [path.name for path in (result.run_dir / "videos").iterdir()] == ["CartPole-v1_step256.mp4"]
    assert "video at step 128 not recorded (OSError: disk full); training goes on" in capsys.readouterr().err


def test_multi_agent_runs_record_their_env(tmp_path):
    config = phalanx.make_config(
        "mappo", "simple_spread", num_envs=4, total_steps=200, eval_every=0, eval_episodes=2, video_every=100
    )
    config.run_dir = str(tmp_path / "run")
    result = phalanx.train(config, show_progress=False)
    path = result.run_dir / "videos" / "simple_spread_step200.mp4"
    frames, _, _, fps = decode(path)
    assert len(frames) == 26 and frames[0].shape == (350, 350, 3) and fps == 10.0  # 25 steps, MPE's 10 fps


def test_a_multi_agent_env_that_does_not_render_fails_before_the_run(tmp_path, monkeypatch):
    from phalanx.marl.mpe import SimpleSpread

    monkeypatch.setattr(SimpleSpread, "render", lambda self: None)
    config = phalanx.make_config("mappo", "simple_spread", num_envs=4, total_steps=200, video_every=100)
    config.run_dir = str(tmp_path / "run")
    with pytest.raises(EnvError, match=r"cannot record 'simple_spread': the env does not render"):
        phalanx.train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(
    not os.environ.get("DISPLAY") and ctypes.util.find_library("EGL") is None,
    reason="no display and no EGL library: MuJoCo cannot render here",
)
def test_mujoco_draws_a_frame_with_a_shadow_map_fitted_to_it():
    pytest.importorskip("mujoco", reason="MuJoCo is not installed (the mujoco extra)")
    use_headless_rendering()
    still = lambda obs: np.zeros(6, np.float32)  # noqa: E731
    with GymnasiumEpisode("HalfCheetah-v5", still, seed=0, max_steps=1) as episode:
        frames = list(episode)
        assert episode.env.unwrapped.model.vis.quality.shadowsize == 1024  # for 480 x 480, not 4096
    assert len(frames) == 2 and frames[0].shape == (480, 480, 3) and frames[0].dtype == np.uint8
    assert frames[0].std() > 10  # a picture, not a blank
    assert episode.fps == 20.0  # HalfCheetah's dt = 0.05 s: real time
