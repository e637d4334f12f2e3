"""Where a MuJoCo video's time goes: rendering with the model's shadow map against the map phalanx sizes to
the frame, and encoding as GIF (the old format) against MP4 (the new default), side by side in one process.

    MUJOCO_GL=egl PYTHONPATH=src python benchmarks/video_render.py          # HalfCheetah-v5, 300 frames
    MUJOCO_GL=egl PYTHONPATH=src python benchmarks/video_render.py --frames 1001 --json

The same frames are drawn twice from the same seed and the same random actions: once with the model's own
``vis.quality.shadowsize`` (4096 for the Gymnasium MuJoCo models), once after
``phalanx.train.videos._fit_mujoco_shadows`` (what ``phalanx eval --video`` and ``--video-every`` do),
each in a fresh env (the shadow map is allocated with the OpenGL context, at the first render). The
second set of frames is then encoded as GIF and as MP4 with ``phalanx.train.videos.write_video``. Wall
time (``perf_counter``) and CPU time (``process_time``, steadier on a shared machine) are reported per
frame; the physics step and the action draw are outside the timed render calls.

It measures and reports; it does not assert a time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")


def render_frames(env_id: str, frames: int, fit_shadows: bool) -> tuple[list, dict[str, float]]:
    import gymnasium as gym
    import numpy as np

    from phalanx.train.videos import _fit_mujoco_shadows

    env = gym.make(env_id, render_mode="rgb_array")
    env.reset(seed=0)
    if fit_shadows:
        _fit_mujoco_shadows(env)
    shadow = int(env.unwrapped.model.vis.quality.shadowsize)
    actions = np.random.default_rng(0).uniform(-1, 1, (frames, *env.action_space.shape)).astype(np.float32)
    env.render()  # the OpenGL context and the renderer are made here, once: not timed
    images, wall, cpu = [], 0.0, 0.0
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        images.append(env.render())
        wall += time.perf_counter() - wall_start
        cpu += time.process_time() - cpu_start
    env.close()
    size = images[0].shape
    return images, {
        "shadow_map": shadow,
        "frame": f"{size[1]}x{size[0]}",
        "wall_ms_per_frame": 1000 * wall / frames,
        "cpu_ms_per_frame": 1000 * cpu / frames,
    }


def encode(images: list, video_format: str, fps: float) -> dict[str, float]:
    from phalanx.train.videos import write_video

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"video.{video_format}"
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        write_video(path, iter(images), fps, video_format)
        wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
        size = path.stat().st_size
    return {
        "wall_ms_per_frame": 1000 * wall / len(images),
        "cpu_ms_per_frame": 1000 * cpu / len(images),
        "megabytes": size / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--json", nargs="?", const="", default=None, help="write the results (to a file)")
    args = parser.parse_args()

    _, model = render_frames(args.env, args.frames, fit_shadows=False)
    images, fitted = render_frames(args.env, args.frames, fit_shadows=True)
    results = {
        "env": args.env,
        "frames": args.frames,
        "mujoco_gl": os.environ["MUJOCO_GL"],
        "render_model_shadow_map": model,
        "render_fitted_shadow_map": fitted,
        "encode_gif": encode(images, "gif", 20.0),
        "encode_mp4": encode(images, "mp4", 20.0),
    }
    print(f"{args.env}, {args.frames} frames of {fitted['frame']}, MUJOCO_GL={results['mujoco_gl']}")
    print("| step | wall ms/frame | CPU ms/frame |")
    print("|---|---|---|")
    for label, key in (
        (f"render, model's shadow map ({model['shadow_map']})", "render_model_shadow_map"),
        (f"render, fitted shadow map ({fitted['shadow_map']})", "render_fitted_shadow_map"),
        ("encode GIF (Pillow)", "encode_gif"),
        ("encode MP4 (H.264)", "encode_mp4"),
    ):
        row = results[key]
        print(f"| {label} | {row['wall_ms_per_frame']:.1f} | {row['cpu_ms_per_frame']:.1f} |")
    ratio = model["cpu_ms_per_frame"] / fitted["cpu_ms_per_frame"]
    print(f"render CPU time, model's map / fitted map: {ratio:.2f}x")
    gif, mp4 = results["encode_gif"]["megabytes"], results["encode_mp4"]["megabytes"]
    print(f"file: GIF {gif:.2f} MB, MP4 {mp4:.2f} MB")
    if args.json is not None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(args.json or Path(__file__).parent / "results" / f"video_render-{stamp}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
