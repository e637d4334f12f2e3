"""Videos of a policy: the frames of a deterministic episode, drawn one at a time; their encoding as MP4 or
GIF, written atomically; and the hook that records one every ``video_every`` env steps of a run.

Frames: a single-agent env is drawn by Gymnasium's rgb_array rendering of the env id (the built-in envs
share Gymnasium's ids and semantics; classic control draws with pygame, MuJoCo with OpenGL offscreen),
its policy acting on the raw observations; a multi-agent env by its own ``render()`` (sub-env 0,
:class:`phalanx.marl.trainer.MultiAgentEpisode`).
:class:`EpisodeFrames` holds one episode's env and yields its frames as they are drawn, the first one
drawn when it opens, so that an env that cannot render fails at once, with the fix, and a long episode
is never all in memory: an episode of T steps gives T + 1 frames (the reset state, then each step's).

Encoding: MP4 (H.264, yuv420p, even frame sizes: the form every player and browser plays) through PyAV,
or imageio-ffmpeg's ffmpeg where PyAV is absent (``pip install 'phalanx[render]'`` installs PyAV); GIF
through Pillow. A video plays in real time by default: at the env's ``render_fps``.

MuJoCo: offscreen rendering is OpenGL through EGL or OSMesa (:func:`use_headless_rendering` chooses EGL
on a machine without a display). Without a GPU both rasterise in software (Mesa's llvmpipe), where a
frame's cost is mostly the shadow map, which MuJoCo's models ask for at 4096 x 4096 texels whatever the
frame size: :class:`GymnasiumEpisode` sizes it to the frame (1024 for the default 480 x 480), which
halves the CPU time of a frame and draws the same picture.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from phalanx.config import VIDEO_FORMATS, TrainConfig
from phalanx.envs.atari import video_env
from phalanx.envs.classic import MASKED_GYMNASIUM
from phalanx.errors import ConfigError, EnvError
from phalanx.files import atomic_write
from phalanx.train.environments import EVAL_SEED_OFFSET
from phalanx.train.run import Hook, Run

MAX_EPISODE_STEPS = 2_000
"""The steps a recorded episode may take when its env sets no shorter time limit."""
DEFAULT_FPS = 30.0
"""Frames per second of the video of an env that does not say its own (``metadata["render_fps"]``)."""
RENDER_EXTRA = "pip install 'phalanx[render]'"


# -- frames ---------------------------------------------------------------------------------------
class EpisodeFrames:
    """One deterministic episode of ``env``, drawn frame by frame as it is iterated.

    A subclass says how the episode starts (:meth:`reset`) and how its policy takes a step
    (:meth:`step`). ``name`` is the env id as a file name, ``fps`` the env's own frame rate, ``size``
    (height, width). The env is open from construction, when the first frame is drawn (an
    :class:`~phalanx.errors.EnvError` with the fix if it cannot be), until the frames are exhausted or
    :meth:`close`: use it as a context manager where they may not all be taken."""

    def __init__(self, env_id: str, env: Any, seed: int, max_steps: int) -> None:
        self.name = video_name(env_id)
        self.env = env
        self.max_steps = max_steps
        self.closed = False
        try:
            self.reset(seed)
            self.first = first_frame(env_id, env.render)
        except BaseException:
            self.close()
            raise
        self.size = self.first.shape[:2]
        self.fps = float(env.metadata.get("render_fps") or DEFAULT_FPS)

    def reset(self, seed: int) -> None:
        """Start the episode from ``seed``."""
        raise NotImplementedError

    def step(self) -> bool:
        """One step of the policy; whether the episode ended."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            yield self.first
            for _ in range(self.max_steps):
                done = self.step()
                frame = self.env.render()
                if frame.shape[:2] != self.size:
                    raise EnvError(
                        f"cannot record {self.name!r}: its frames change size during the episode, from "
                        f"{self.size} to {frame.shape[:2]} (height, width); a video needs one frame size."
                    )
                yield frame
                if done:
                    return
        finally:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.env.close()

    def __enter__(self) -> EpisodeFrames:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class GymnasiumEpisode(EpisodeFrames):
    """The episode of ``policy`` (raw observation in, env action out) on Gymnasium's ``env_id``, drawn
    with ``render_mode="rgb_array"`` (the built-in single-agent envs share Gymnasium's ids; a memory task,
    ``CartPoleNoVel-v1``, is its Gymnasium env with the same entries masked). A policy with memory acts on
    the episode's steps in order (a new policy object per episode)."""

    def __init__(
        self, env_id: str, policy: Callable[[Any], Any], seed: int, max_steps: int = MAX_EPISODE_STEPS
    ) -> None:
        self.policy = policy
        gym_id, masked = MASKED_GYMNASIUM.get(env_id, (env_id.removeprefix("gym:"), ()))
        if gym_id.startswith("envpool:"):  # EnvPool's envs do not render: the same task's Gymnasium env
            gym_id = gym_id.removeprefix("envpool:")
        try:  # a missing simulator shows here, a missing renderer at the first render (pygame, OpenGL)
            atari = video_env(env_id)  # an Atari game: its preprocessed frames in, the game drawn
            env = atari if atari is not None else gym.make(gym_id, render_mode="rgb_array")
            if masked:  # a memory task: the Gymnasium env's observations with the same entries zeroed
                assert env.observation_space.shape is not None, "a masked task's observations are a Box"
                mask = np.ones(env.observation_space.shape, dtype=np.float32)
                mask[list(masked)] = 0.0
                env = gym.wrappers.TransformObservation(env, lambda obs: obs * mask, env.observation_space)
        except gym.error.DependencyNotInstalled as error:
            raise EnvError(f"cannot render {gym_id!r}: {error}. {_install_hint(error)}") from None
        except gym.error.Error as error:
            raise EnvError(
                f"cannot render {env_id!r} with Gymnasium's rgb_array rendering: {str(error).rstrip('.')}. "
                "Videos draw "
                "Gymnasium envs (the built-in envs share their ids; an EnvPool id is drawn by the "
                "Gymnasium env of the same id, an EnvPool Atari game by ale-py's ALE/<Game>-v5) and "
                "multi-agent envs whose render() draws a frame."
            ) from None
        _fit_mujoco_shadows(env)
        super().__init__(env_id, env, seed, max_steps)

    def reset(self, seed: int) -> None:
        self.obs, _ = self.env.reset(seed=seed)

    def step(self) -> bool:
        self.obs, _, terminated, truncated, _ = self.env.step(self.policy(self.obs))
        return bool(terminated or truncated)


def video_name(env_id: str) -> str:
    """``env_id`` as the stem of a file name (``gym:`` dropped; ``:`` and ``/`` become ``_``)."""
    return env_id.removeprefix("gym:").replace(":", "_").replace("/", "_")


def first_frame(env_id: str, render: Callable[[], Any]) -> np.ndarray:
    """The env's first frame, checked to be an RGB image; rendering errors become EnvErrors with the fix."""
    try:
        frame = render()
    except gym.error.DependencyNotInstalled as error:
        raise EnvError(f"cannot render {env_id!r}: {error}. {_install_hint(error)}") from None
    except Exception as error:  # OpenGL fails in many ways (PyOpenGL, EGL, OSMesa), each with its own type
        raise EnvError(
            f"cannot render {env_id!r}: {type(error).__name__}: {error}. {_opengl_hint()}"
        ) from None
    if frame is None:
        raise EnvError(
            f"cannot record {env_id!r}: the env does not render (render() returns None). Videos need an "
            "env that draws RGB frames: Gymnasium envs with rgb_array rendering, the built-in multi-agent "
            "tasks (simple_spread, simple_tag)."
        )
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise EnvError(
            f"cannot record {env_id!r}: its render() returns an array of shape {frame.shape} and dtype "
            f"{frame.dtype}, expected an RGB frame (height, width, 3) of uint8."
        )
    return frame


def _install_hint(error: BaseException) -> str:
    if "mujoco" in str(error).lower():
        return "Install MuJoCo: pip install 'phalanx[mujoco]'."
    return f"Install the rendering extra: {RENDER_EXTRA}."


def _opengl_hint() -> str:
    backend = os.environ.get("MUJOCO_GL")
    return (
        f"An env that draws with OpenGL (MuJoCo) needs a backend, chosen by MUJOCO_GL (here "
        f"{backend or 'unset'}): MUJOCO_GL=egl needs "
        "libEGL (a GPU driver, or Mesa: apt install libegl1), MUJOCO_GL=osmesa needs OSMesa (apt install "
        "libosmesa6), MUJOCO_GL=glfw a display. Set the one this machine has before phalanx starts."
    )


def _fit_mujoco_shadows(env: gym.Env) -> None:
    """A MuJoCo env draws its shadows into a map sized for the frame (the smallest power of two at least
    twice its larger side, never more than the model asks for) instead of the model's 4096 x 4096: in
    software OpenGL that map is most of a frame's cost. It must be set before the first render, which
    creates the OpenGL context."""
    mujoco_env = sys.modules.get("gymnasium.envs.mujoco.mujoco_env")  # imported by every MuJoCo env
    if mujoco_env is None or not isinstance(env.unwrapped, mujoco_env.MujocoEnv):
        return
    renderer = env.unwrapped.mujoco_renderer
    quality = env.unwrapped.model.vis.quality
    side = 1 << (2 * max(renderer.width, renderer.height) - 1).bit_length()
    quality.shadowsize = min(quality.shadowsize, side)


def use_headless_rendering() -> None:
    """On a machine without a display, make MuJoCo render offscreen through EGL, and pygame (classic
    control) through SDL's dummy video driver, which draws the same frames without asking for a display
    (and without SDL's "XDG_RUNTIME_DIR is invalid" line); unless told otherwise.

    Gymnasium reads ``MUJOCO_GL`` when an env creates its renderer (its first frame), PyOpenGL reads
    ``PYOPENGL_PLATFORM`` when it is first imported, SDL ``SDL_VIDEODRIVER`` when pygame starts: this
    runs before any of them."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


# -- encoding -------------------------------------------------------------------------------------
def check_video_format(video_format: str) -> None:
    """``video_format`` is one of :data:`VIDEO_FORMATS` and its encoder is installed; a ConfigError with
    the fix otherwise."""
    if video_format not in VIDEO_FORMATS:
        raise ConfigError(
            f"video format {video_format!r} is not one of {VIDEO_FORMATS}: write mp4 (the default) or gif."
        )
    if video_format == "mp4":
        _mp4_encoder()


def _mp4_encoder() -> str:
    """``"av"`` (PyAV), else ``"imageio_ffmpeg"``: the installed MP4 encoder."""
    for module in ("av", "imageio_ffmpeg"):
        try:
            __import__(module)
            return module
        except ModuleNotFoundError:
            continue
    raise ConfigError(
        f"MP4 videos need an H.264 encoder, PyAV or imageio-ffmpeg, and neither is installed. Install it "
        f"with the rendering extra: {RENDER_EXTRA} (or record a GIF: --video-format gif)."
    )


def video_path(run_dir: str | Path, name: str, steps: int, video_format: str) -> Path:
    """``RUN_DIR/videos/<name>_step<steps>.<format>``: where the video of the weights of step ``steps``
    goes (made if missing)."""
    directory = Path(run_dir) / "videos"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{name}_step{steps}.{video_format}"


def write_video(path: str | Path, frames: Iterable[np.ndarray], fps: float, video_format: str) -> Path:
    """Encode ``frames`` (RGB, uint8, one size) as ``video_format`` at ``fps`` frames per second into
    ``path``, which appears whole once they are all written (a temporary name, then a rename)."""
    check_video_format(video_format)
    if not fps > 0:
        raise ConfigError(f"fps = {fps!r}: a video needs a frame rate > 0, e.g. 30.")
    path = Path(path)
    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError(f"write_video({str(path)!r}): no frames to write.")
    if video_format == "gif":
        _write_gif(path, first, frames, fps)
    elif _mp4_encoder() == "av":
        _write_mp4_pyav(path, first, frames, fps)
    else:
        _write_mp4_ffmpeg(path, first, frames, fps)
    return path


def _even(frame: np.ndarray) -> np.ndarray:
    """``frame`` with an odd height or width padded by one edge row or column: yuv420p subsamples the
    colour by 2 in both directions, so H.264 in yuv420p takes even sizes only."""
    height, width = frame.shape[:2]
    if height % 2 == 0 and width % 2 == 0:
        return frame
    return np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


X264_OPTIONS = {"preset": "veryfast", "crf": "23"}
"""libx264's settings: ``veryfast`` encodes a 480 x 480 frame in half the time of the default ``medium``
for a file a few percent larger; CRF 23 is x264's default quality."""


def _write_mp4_pyav(path: Path, first: np.ndarray, frames: Iterator[np.ndarray], fps: float) -> None:
    import av

    height, width = _even(first).shape[:2]
    rate = Fraction(fps).limit_denominator(1001)
    # w+b: faststart moves the index to the front of the file (a browser plays it while it downloads),
    # which reads the file back once it is written
    with (
        atomic_write(path, "w+b") as file,
        av.open(file, "w", format="mp4", options={"movflags": "+faststart"}) as container,
    ):
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = X264_OPTIONS
        for index, frame in enumerate(_chain(first, frames)):
            picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(_even(frame)), format="rgb24")
            picture.pts = index
            container.mux(stream.encode(picture))
        container.mux(stream.encode())  # what the encoder still holds


def _write_mp4_ffmpeg(path: Path, first: np.ndarray, frames: Iterator[np.ndarray], fps: float) -> None:
    import imageio_ffmpeg

    height, width = _even(first).shape[:2]
    # ffmpeg writes the temporary file by its name (it opens the same file, truncated): atomic_write then
    # syncs it and renames it into place
    with atomic_write(path, "wb") as file:
        writer = imageio_ffmpeg.write_frames(
            file.name,
            (width, height),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            macro_block_size=1,  # the frames are even already; no resizing
            output_params=[
                "-f", "mp4", "-movflags", "+faststart",
                *[value for name, setting in X264_OPTIONS.items() for value in (f"-{name}", setting)],
            ],
        )  # fmt: skip
        writer.send(None)  # starts ffmpeg
        try:
            for frame in _chain(first, frames):
                writer.send(np.ascontiguousarray(_even(frame)))
        finally:
            writer.close()


def _write_gif(path: Path, first: np.ndarray, frames: Iterator[np.ndarray], fps: float) -> None:
    from PIL import Image

    images = (Image.fromarray(frame) for frame in frames)
    # GIF delays are whole hundredths of a second; Pillow takes milliseconds
    duration = max(20, round(1000 / fps / 10) * 10)
    with atomic_write(path, "wb") as file:
        Image.fromarray(first).save(
            file, format="GIF", save_all=True, append_images=images, duration=duration, loop=0
        )


def _chain(first: np.ndarray, frames: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    yield first
    yield from frames


# -- the hook -------------------------------------------------------------------------------------
class Videos(Hook):
    """Every ``video_every`` env steps, one deterministic evaluation episode of the current policy, with
    the observation normalisation frozen as evaluation has it, as
    ``RUN_DIR/videos/<env>_step<steps>.<video_format>`` (learner 0; ``draw(seed)`` is the trainer's
    ``video_episode``, which draws the episode).

    Built with the trainer, before its run directory: it checks then that the encoder is installed and
    that the env renders (an episode is opened: the env built, its first frame drawn), so that a run
    does not fail at its first video. A video that fails later is reported in the run's log and
    training goes on."""

    def __init__(self, config: TrainConfig, draw: Callable[[int], EpisodeFrames]) -> None:
        self.draw = draw
        self.every = config.video_every
        self.video_format = config.video_format
        self.seed = config.seed + EVAL_SEED_OFFSET  # the evaluations' seed
        use_headless_rendering()  # before MuJoCo's first render
        check_video_format(self.video_format)
        draw(self.seed).close()

    def after_iteration(self, trainer: Run) -> None:
        try:
            with self.draw(self.seed) as episode:
                path = video_path(trainer.run_dir, episode.name, trainer.steps, self.video_format)
                write_video(path, episode, episode.fps, self.video_format)
        except Exception as error:  # a video is not worth the run: say so and train on
            trainer.logger.message(
                f"video at step {trainer.steps:,} not recorded ({type(error).__name__}: {error}); "
                "training goes on"
            )
