"""Record deterministic episodes of a trained agent as a video: MP4 (H.264) by default, or GIF.

The agent draws its own frames (``agent.frames()``): a single-agent agent through Gymnasium's
rgb_array rendering of its env (built-in envs share Gymnasium's ids and semantics; classic control
needs ``pip install 'phalanx[render]'``, which brings pygame and the PyAV encoder), a multi-agent agent
through its built-in env's ``render()``. The frames and their encoding are
:mod:`phalanx.train.videos`', which the runs' ``video_every`` videos use too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.agent import load_agent
from phalanx.errors import ConfigError
from phalanx.train.environments import EVAL_SEED_OFFSET
from phalanx.train.videos import (
    MAX_EPISODE_STEPS,
    EpisodeFrames,
    check_video_format,
    use_headless_rendering,
    video_path,
    write_video,
)


def record_video(
    run_dir: str | Path,
    checkpoint: str = "best",
    video_format: str = "mp4",
    episodes: int = 1,
    max_steps: int = MAX_EPISODE_STEPS,
    fps: float | None = None,
    seed: int | None = None,
) -> Path:
    """Deterministic episodes of the run's agent as ``RUN_DIR/videos/<env>_step<N>.<video_format>``, N
    the step of the checkpoint's weights; returns the file's path.

    ``checkpoint``: "best" (default), "latest" or a checkpoint path. ``episodes`` play one after the
    other in the file, seeded ``seed``, ``seed + 1``, ... (default: the seed of the run's evaluations);
    each stops after ``max_steps`` steps if it has not ended. ``fps``: frames per second, by default the
    env's own (real time). The file appears whole once written, or not at all."""
    check_video_format(video_format)
    for name, value in (("episodes", episodes), ("max_steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"record_video: {name} = {value!r} is invalid: expected an integer >= 1.")
    if fps is not None and not (isinstance(fps, (int, float)) and fps > 0):
        raise ConfigError(f"record_video: fps = {fps!r} is invalid: expected a number > 0, e.g. 30.")
    use_headless_rendering()
    agent = load_agent(run_dir, checkpoint)
    if seed is None:
        seed = agent.config.seed + EVAL_SEED_OFFSET
    first = agent.frames(max_steps, seed)
    with first:
        path = video_path(run_dir, first.name, agent.steps, video_format)
        frames = _episodes(first, agent, episodes, max_steps, seed)
        return write_video(path, frames, fps if fps is not None else first.fps, video_format)


def check_recordable(run_dir: str | Path, checkpoint: str = "best") -> None:
    """Open the video env of the run's agent and draw its first frame, so that a run that cannot be
    recorded (no renderer, an env with no Gymnasium id, a missing package) says so with the fix before
    anything long runs (an EnvError)."""
    use_headless_rendering()
    with load_agent(run_dir, checkpoint).frames(1):
        pass


def _episodes(
    first: EpisodeFrames, agent: Any, episodes: int, max_steps: int, seed: int
) -> Iterator[np.ndarray]:
    """The frames of ``episodes`` episodes, back to back: ``first``, then each of the next opened in turn."""
    yield from first
    for index in range(1, episodes):
        with agent.frames(max_steps, seed + index) as episode:
            yield from episode
