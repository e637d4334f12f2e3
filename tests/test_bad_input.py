"""Bad input gets a clear error before anything is written, and a failing run keeps what it wrote."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import phalanx
from phalanx.cli import main
from phalanx.envs import BatchedVecEnv, register_env
from phalanx.envs.classic import PendulumEnv
from phalanx.envs.registry import unregister_env
from phalanx.errors import ConfigError, ContractError


class TwoKnobsEnv(BatchedVecEnv):
    """An env with a MultiDiscrete action space, which the DQN family does not support."""

    def __init__(self, num_envs=1, device="cpu"):
        super().__init__(
            num_envs,
            gym.spaces.Box(-1, 1, (2,), np.float32),
            gym.spaces.MultiDiscrete([3, 3]),
            device,
            max_episode_steps=10,
        )
        self.state = torch.zeros(self.num_envs, 2, device=self.device)

    def _reset_rows(self, mask):
        self.state = torch.where(mask.unsqueeze(1), torch.zeros_like(self.state), self.state)

    def _advance(self, actions):
        return torch.zeros(self.num_envs, device=self.device), torch.zeros(self.num_envs, dtype=torch.bool)

    def _observe(self):
        return self.state.clone()


class ExplodingPendulum(PendulumEnv):
    """Pendulum whose observations turn to NaN after 300 steps of the run."""

    def __init__(self, num_envs=1, device="cpu"):
        super().__init__(num_envs=num_envs, device=device)
        self.calls = 0

    def _observe(self):
        self.calls += 1
        obs = super()._observe()
        return obs * float("nan") if self.calls > 300 else obs


@pytest.fixture
def registered():
    names = []

    def register(name, factory):
        register_env(name, factory, overwrite=True)
        names.append(name)

    yield register
    for name in names:
        unregister_env(name)


def test_algorithm_and_action_space_mismatch_is_refused_before_the_run_dir(tmp_path, registered):
    registered("TwoKnobs-v0", TwoKnobsEnv)
    config = phalanx.make_config(
        "dqn", "TwoKnobs-v0", run_dir=str(tmp_path / "run"), num_envs=4, learning_starts=64, batch_size=32
    )
    with pytest.raises(ConfigError, match=r"needs a Discrete action space.*MultiDiscrete.*Use a2c or ppo"):
        phalanx.train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


def test_nan_in_the_env_stops_with_the_sub_env_and_keeps_the_logs(tmp_path, registered, capsys):
    registered("ExplodingPendulum-v0", ExplodingPendulum)
    run = tmp_path / "run"
    flags = ["--num-envs", "4", "--horizon", "16", "--minibatch-size", "32", "--total-steps", "4096"]
    flags += ["--eval-every", "0", "--log-every", "64", "--run-dir", str(run)]
    code = main(["train", "ppo", "ExplodingPendulum-v0", *flags])
    out = " ".join(capsys.readouterr().err.split())
    assert code == 2, out
    assert "sub-env" in out and "Traceback" not in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["error"].startswith("ContractError")
    assert (run / "metrics.csv").read_text().count("\n") > 1  # the rows logged before the NaN are kept


def test_contract_checker_lists_every_violation():
    class Sloppy(PendulumEnv):
        def step(self, actions):
            obs, reward, terminated, truncated, info = super().step(actions)
            return obs.double(), reward.unsqueeze(1), terminated, truncated, info

    with pytest.raises(ContractError) as caught:
        phalanx.check_vec_env(Sloppy(num_envs=3), num_steps=50)
    message = str(caught.value)
    assert "float64" in message and "float32" in message
    assert "(3, 1)" in message and "(3,)" in message


def test_cuda_request_without_cuda_is_explained(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    config = phalanx.make_config("ppo", "CartPole-v1", device="cuda", run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="CUDA is not available"):
        phalanx.train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


def test_eval_video_writes_an_mp4(tmp_path, capsys):
    pytest.importorskip("pygame", reason="classic-control rendering needs pygame (the render extra)")
    pytest.importorskip("av", reason="MP4 videos need PyAV (the render extra)")
    run = tmp_path / "run"
    args = ["--num-envs", "8", "--total-steps", "256", "--horizon", "16", "--minibatch-size", "64"]
    assert main(["train", "ppo", "CartPole-v1", *args, "--run-dir", str(run)]) == 0
    assert main(["eval", str(run), "--episodes", "2", "--video"]) == 0
    videos = list((run / "videos").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000


def test_video_without_a_renderer_names_the_extra(tmp_path, monkeypatch):
    """pygame missing: Gymnasium raises DependencyNotInstalled at the first render; the error names the
    extra to install, and the run directory keeps what it had."""
    import gymnasium as gym

    from phalanx.agent import load_agent
    from phalanx.errors import EnvError

    run = tmp_path / "run"
    args = ["--num-envs", "8", "--total-steps", "256", "--horizon", "16", "--minibatch-size", "64"]
    assert main(["train", "ppo", "CartPole-v1", *args, "--run-dir", str(run)]) == 0
    before = sorted(p.relative_to(run) for p in run.rglob("*"))

    class NoRenderer(gym.Wrapper):
        def render(self):
            raise gym.error.DependencyNotInstalled("pygame is not installed")

    make = gym.make
    monkeypatch.setattr(gym, "make", lambda *a, **k: NoRenderer(make(*a, **k)))
    with pytest.raises(
        EnvError, match=r"cannot render 'CartPole-v1': pygame is not installed.*phalanx\[render\]"
    ):
        load_agent(run).frames()
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_training_twice_with_one_config_makes_two_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = phalanx.make_config(
        "ppo", "CartPole-v1", num_envs=4, total_steps=64, horizon=16, minibatch_size=32, eval_episodes=2
    )
    first = phalanx.train(config, show_progress=False)
    second = phalanx.train(config, show_progress=False)
    assert config.run_dir is None and first.run_dir != second.run_dir
