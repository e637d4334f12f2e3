"""Record an episode of a trained agent as an animated GIF, through Gymnasium's rgb_array rendering.

Built-in envs share Gymnasium's ids and semantics, so the agent acts directly in the Gymnasium
reference env, which draws the frames. Needs the env's rendering dependencies (for classic control:
``pip install 'phalanx[render]'``, which brings pygame).
"""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym

from phalanx.agent import load_agent
from phalanx.errors import EnvError


def use_headless_rendering() -> None:
    """On a machine without a display, make MuJoCo render offscreen through EGL (unless told otherwise).

    MuJoCo reads ``MUJOCO_GL`` when it is first imported, so this runs before any env is built.
    """
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


def record_video(run_dir: str | Path, checkpoint: str = "best", max_steps: int = 2000, fps: int = 30) -> Path:
    use_headless_rendering()
    agent = load_agent(run_dir, checkpoint)
    env_id = agent.config.env.removeprefix("gym:")
    try:
        env = gym.make(env_id, render_mode="rgb_array")
    except gym.error.DependencyNotInstalled as error:
        raise EnvError(
            f"cannot render {env_id!r}: {error}. Install the rendering extra: pip install 'phalanx[render]'."
        ) from None
    except gym.error.Error as error:
        raise EnvError(f"cannot render {env_id!r} with Gymnasium's rgb_array mode: {error}") from None
    from PIL import Image

    obs, _ = env.reset(seed=agent.config.seed)
    try:
        frames = [env.render()]
    except gym.error.DependencyNotInstalled as error:
        raise EnvError(
            f"cannot render {env_id!r}: {error}. Install the rendering extra: pip install 'phalanx[render]'."
        ) from None
    for _ in range(max_steps):
        obs, _, terminated, truncated, _ = env.step(agent.act(obs))
        frames.append(env.render())
        if terminated or truncated:
            break
    env.close()
    directory = Path(run_dir) / "videos"
    directory.mkdir(exist_ok=True)
    path = directory / f"{env_id}_step{agent.steps}.gif"
    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path
