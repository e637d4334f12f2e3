"""MuJoCo through process workers: parity with in-process stepping, CLI training with the presets, video."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("mujoco", reason="MuJoCo is not installed (pip install 'phalanx[mujoco]')")

from phalanx.cli import main  # noqa: E402
from phalanx.config import make_config  # noqa: E402
from phalanx.envs.check import check_vec_env  # noqa: E402
from phalanx.envs.workers import GymnasiumVecEnv, ProcessVecEnv  # noqa: E402


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_process_workers_match_in_process_stepping(env_id):
    reference = GymnasiumVecEnv(env_id, num_envs=4)
    env = ProcessVecEnv(env_id, num_envs=4, num_workers=2)
    try:
        check_vec_env(env, num_steps=20)
        obs, _ = env.reset(seed=3)
        expected, _ = reference.reset(seed=3)
        assert torch.equal(obs, expected)
        generator = torch.Generator().manual_seed(0)
        for _ in range(60):
            actions = torch.rand(env.action_space.shape, generator=generator) * 2 - 1
            got, want = env.step(actions), reference.step(actions)
            for a, b in zip(got[:4], want[:4], strict=True):
                assert torch.equal(a, b)
            assert torch.equal(got[4]["final_obs"], want[4]["final_obs"])
    finally:
        env.close()
        reference.close()


def test_presets_exist_for_the_main_tasks():
    for algo in ("ppo", "sac"):
        for env_id in ("HalfCheetah-v5", "Hopper-v5", "Ant-v5"):
            config = make_config(algo, env_id)
            assert config.num_workers == 2 and config.num_envs == 16, (algo, env_id)
            config.validate()


@pytest.mark.parametrize(
    ("algo", "env_id", "extra"),
    [
        ("sac", "HalfCheetah-v5", ["--learning-starts", "256", "--batch-size", "64"]),
        ("ppo", "Hopper-v5", ["--horizon", "32"]),
    ],
)
def test_cli_trains_through_process_workers(tmp_path, capsys, algo, env_id, extra):
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            algo,
            env_id,
            "--num-envs",
            "4",
            "--num-workers",
            "2",
            "--total-steps",
            "512",
            "--eval-every",
            "0",
            "--eval-episodes",
            "1",
            "--run-dir",
            str(run_dir),
            *extra,
        ]
    )
    assert code == 0, capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] >= 512 and summary["eval_return_mean"] is not None


@pytest.mark.skipif(ctypes.util.find_library("EGL") is None, reason="no EGL library for headless rendering")
def test_eval_video_renders_headless(tmp_path):
    run_dir = tmp_path / "run"
    train = ["train", "ppo", "Hopper-v5", "--num-envs", "2", "--num-workers", "2", "--total-steps", "64"]
    assert main([*train, "--horizon", "32", "--eval-every", "0", "--run-dir", str(run_dir)]) == 0
    headless = ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")
    environment = {k: v for k, v in os.environ.items() if k not in headless}
    result = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "eval", str(run_dir), "--episodes", "1", "--video"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    videos = list((run_dir / "videos").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 10_000
