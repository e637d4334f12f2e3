"""Record an episode of a trained agent as an animated GIF.

The agent draws its own frames (``agent.frames()``): a single-agent agent through Gymnasium's
rgb_array rendering of its env (built-in envs share Gymnasium's ids and semantics; classic control
needs ``pip install 'phalanx[render]'``, which brings pygame), a multi-agent agent through its built-in
env's ``render()``.
"""

from __future__ import annotations

import os
from pathlib import Path

from phalanx.agent import load_agent
from phalanx.files import atomic_write


def use_headless_rendering() -> None:
    """On a machine without a display, make MuJoCo render offscreen through EGL (unless told otherwise).

    MuJoCo reads ``MUJOCO_GL`` when it is first imported, so this runs before any env is built.
    """
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


def record_video(run_dir: str | Path, checkpoint: str = "best", max_steps: int = 2000, fps: int = 30) -> Path:
    """One deterministic episode of the run's agent as ``RUN_DIR/videos/<env>_step<N>.gif``."""
    use_headless_rendering()
    agent = load_agent(run_dir, checkpoint)
    name, frames = agent.frames(max_steps)
    from PIL import Image

    directory = Path(run_dir) / "videos"
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}_step{agent.steps}.gif"
    images = [Image.fromarray(frame) for frame in frames]
    with atomic_write(path, "wb") as file:
        images[0].save(
            file, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0
        )
    return path
