"""Image observations in the buffers and the DQN family: uint8 kept, the compact replay (each observation
and each stacked frame stored once) sampling exactly what the plain replay samples, its memory, its
checkpoints, and a DQN learning a tiny image task through its CNN."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import phalanx
from phalanx.algos.dqn import QNetwork
from phalanx.buffers import (
    CompactReplayBuffer,
    ReplayBuffer,
    RolloutBuffer,
    StepLayout,
    replay_choice,
    storage_dtype,
)
from phalanx.config import make_config
from phalanx.envs.core import BatchedVecEnv
from phalanx.envs.registry import unregister_env
from phalanx.errors import CheckpointError, ConfigError
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.trainer import Trainer

torch.set_num_threads(1)


# -- observation dtypes ----------------------------------------------------------------------------------
def test_storage_dtype_keeps_the_space_dtype_and_flattens_dicts_to_float32():
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert storage_dtype(image) == torch.uint8
    assert storage_dtype(gym.spaces.Box(0, 1, (3,), np.float32)) == torch.float32
    assert storage_dtype(gym.spaces.MultiBinary(5)) == torch.int8
    assert storage_dtype(gym.spaces.Box(0, 9, (3,), np.int64)) == torch.int64
    assert storage_dtype(gym.spaces.Box(0, 1, (3,), np.bool_)) == torch.bool
    assert storage_dtype(gym.spaces.Dict({"a": image, "b": gym.spaces.Discrete(3)})) == torch.float32


def test_rollout_buffer_stores_uint8_and_loads_an_old_float32_state():
    uint8 = StepLayout((1, 6, 6), torch.uint8, (), torch.int64)
    buffer = RolloutBuffer(4, 2, uint8, "cpu")
    assert buffer.obs.dtype == buffer.next_obs.dtype == torch.uint8
    float32 = StepLayout((1, 6, 6), torch.float32, (), torch.int64)
    assert buffer.nbytes < RolloutBuffer(4, 2, float32, "cpu").nbytes / 3
    frames = torch.randint(256, (2, 1, 6, 6), dtype=torch.uint8)
    flags = torch.zeros(2, dtype=torch.bool)
    buffer.add(0, frames, torch.ones(2, dtype=torch.int64), *torch.zeros(3, 2), flags, flags, frames)
    assert torch.equal(buffer.obs[0], frames)  # 0..255 survive, no scaling
    old = {
        name: tensor.float() if name in buffer.OBS_FIELDS else tensor
        for name, tensor in buffer.state_dict().items()
    }
    restored = RolloutBuffer(4, 2, uint8, "cpu")
    restored.load_state_dict(old)  # a float32 checkpoint of the same observations
    assert restored.obs.dtype == torch.uint8 and torch.equal(restored.obs, buffer.obs)
    old["rewards"] = old["rewards"].double()
    with pytest.raises(CheckpointError, match="rewards"):
        restored.load_state_dict(old)


def test_replay_buffer_stores_the_observation_dtype_and_loads_float32_states():
    int16 = StepLayout((3,), torch.int16, (), torch.int64)
    plain = ReplayBuffer(8, 2, int16, "cpu")
    obs = torch.tensor([[1, -2, 300], [4, 5, 6]], dtype=torch.int16)
    plain.add(
        obs, torch.zeros(2, dtype=torch.int64), torch.ones(2), obs + 1, *torch.zeros(2, 2, dtype=torch.bool)
    )
    assert plain.obs.dtype == plain.next_obs.dtype == torch.int16
    state = plain.state_dict()
    state["obs"], state["next_obs"] = state["obs"].float(), state["next_obs"].float()
    restored = ReplayBuffer(8, 2, int16, "cpu")
    restored.load_state_dict(state)
    assert torch.equal(restored.obs[0], obs) and restored.obs.dtype == torch.int16


# -- the compact replay: exactly the plain replay's samples ---------------------------------------------
class StackedFrames:
    """Random trajectories of ``num_envs`` sub-envs whose observations are ``k`` stacked ``(5, 5)`` frames,
    as a frame-stacking env gives them: each step pushes a new frame, an episode's first observation is
    its first frame repeated or zero-padded, and the final observation of an ended episode is its own.
    ``odd`` steps break the VecEnv contract (an observation that is not the previous next observation):
    the buffer must store them exactly all the same. ``still`` steps repeat the newest frame."""

    def __init__(
        self, num_envs: int, k: int, seed: int, end: float = 0.1, odd: float = 0.03, still: float = 0.1
    ):
        self.num_envs, self.k, self.end, self.odd, self.still = num_envs, k, end, odd, still
        self.generator = torch.Generator().manual_seed(seed)
        self.obs = torch.stack([self.first_stack() for _ in range(num_envs)])  # (N, k, 5, 5)
        self.step_count = 0

    def rand(self) -> float:
        return float(torch.rand((), generator=self.generator))

    def frame(self) -> torch.Tensor:
        return torch.randint(256, (5, 5), generator=self.generator, dtype=torch.uint8)

    def first_stack(self) -> torch.Tensor:
        first = self.frame()
        padding = first if self.rand() < 0.5 else torch.zeros_like(first)
        return torch.stack([padding] * (self.k - 1) + [first])

    def step(self) -> tuple[torch.Tensor, ...]:
        n = self.num_envs
        obs = self.obs.clone()
        next_obs = torch.empty_like(obs)
        for env in range(n):
            newest = obs[env, -1] if self.rand() < self.still else self.frame()
            next_obs[env] = torch.cat([obs[env, 1:], newest.unsqueeze(0)])
        ends = torch.rand(n, generator=self.generator) < self.end
        terminated = ends & (torch.rand(n, generator=self.generator) < 0.5)
        truncated = ends & ~terminated
        actions = torch.randint(6, (n,), generator=self.generator)
        # the rewards name the transition: step * n + env (exact in float32 for these sizes)
        rewards = (self.step_count * n + torch.arange(n)).float()
        self.step_count += 1
        for env in range(n):
            if ends[env]:
                self.obs[env] = self.first_stack()
            elif self.rand() < self.odd:
                self.obs[env] = torch.stack([self.frame() for _ in range(self.k)])
            else:
                self.obs[env] = next_obs[env]
        shape = (n, self.k, 5, 5) if self.k > 1 else (n, 5, 5)
        return obs.reshape(shape), actions, rewards, next_obs.reshape(shape), terminated, truncated


def filled_pair(k: int, capacity: int, steps: int, seed: int = 0, **trajectories) -> tuple:
    obs_shape = (k, 5, 5) if k > 1 else (5, 5)
    layout = StepLayout(obs_shape, torch.uint8, (), torch.int64)
    plain = ReplayBuffer(capacity, 4, layout, "cpu")
    compact = CompactReplayBuffer(capacity, 4, layout, "cpu", k)
    source = StackedFrames(4, max(k, 1), seed, **trajectories)
    history = []
    for _ in range(steps):
        step = source.step()
        plain.add(*step)
        compact.add(*step)
        history.append(step)
    return plain, compact, history


def assert_same_batches(plain, compact, n_step: int, seed: int) -> None:
    torch.manual_seed(seed)
    expected = plain.sample(512, gamma=0.9, n_step=n_step)
    torch.manual_seed(seed)
    batch = compact.sample(512, gamma=0.9, n_step=n_step)
    for name in ("obs", "actions", "rewards", "next_obs", "discounts"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name
    assert batch.obs.dtype == torch.uint8


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("n_step", [1, 3])
def test_compact_replay_samples_exactly_what_the_plain_replay_samples(k, n_step):
    # 100 slots a sub-env, 250 steps: the ring wraps; ends, truncations, broken contracts, still frames
    plain, compact, history = filled_pair(k, capacity=400, steps=250, seed=k + n_step, end=0.012, odd=0.004)
    ends = torch.stack([step[4] | step[5] for step in history])
    assert ends.sum() >= 4 and torch.stack([step[5] for step in history]).any()
    assert len(compact) == len(plain) == 400
    for seed in range(3):
        assert_same_batches(plain, compact, n_step, seed)


def assert_transitions_added(batch, history, held: int, num_envs: int = 4) -> None:
    """Each sampled transition is the one added (its reward names it) and among the ``held`` newest."""
    for i in range(len(batch.rewards)):
        step, env = divmod(int(batch.rewards[i]), num_envs)
        assert step >= len(history) - held // num_envs, "sampled a transition that was dropped"
        obs, actions, _, next_obs, terminated, _ = history[step]
        assert torch.equal(batch.obs[i], obs[env]) and torch.equal(batch.next_obs[i], next_obs[env])
        assert batch.actions[i] == actions[env] and batch.discounts[i] == 0.9 * (not terminated[env])


def test_compact_replay_drops_only_overwritten_transitions_and_the_rest_stay_exact():
    # episodes of ~2 steps need 4 + 1 frames each: more than the rows hold, so the oldest slots go
    _, compact, history = filled_pair(4, capacity=160, steps=120, seed=3, end=0.5)
    assert 0 < len(compact) < 160
    torch.manual_seed(0)
    assert_transitions_added(compact.sample(256, gamma=0.9), history, len(compact))
    source = StackedFrames(4, 4, seed=4, end=0.5)
    source.step_count = len(history)  # its rewards name its steps after those
    for _ in range(40):  # adds and samples in turn: the buffer checks its rows only when it must
        history.append(source.step())
        compact.add(*history[-1])
        assert_transitions_added(compact.sample(16, gamma=0.9), history, len(compact))


STACKS = StepLayout((4, 5, 5), torch.uint8, (), torch.int64)
"""Stacks of 4 uint8 frames of 5 x 5, discrete actions."""


def test_compact_replay_state_round_trip_continues_identically():
    plain, compact, _ = filled_pair(4, capacity=160, steps=40, seed=5, end=0.012, odd=0.004)
    restored = CompactReplayBuffer(160, 4, STACKS, "cpu", 4)
    restored.load_state_dict(compact.state_dict())
    source = StackedFrames(4, 4, seed=6, end=0.012, odd=0.004)
    for _ in range(10):  # all three go on from there (and wrap)
        step = source.step()
        for buffer in (plain, compact, restored):
            buffer.add(*step)
    assert len(restored) == 160
    assert_same_batches(plain, restored, 2, seed=0)
    assert_same_batches(compact, restored, 2, seed=1)
    with pytest.raises(CheckpointError, match="stacked_frames = 4"):
        CompactReplayBuffer(160, 4, STACKS, "cpu", 1).load_state_dict(compact.state_dict())
    with pytest.raises(CheckpointError, match="another kind of replay buffer"):
        restored.load_state_dict(plain.state_dict())


def test_replay_choice_picks_the_compact_replay_for_images_and_refuses_bad_stacks():
    image = gym.spaces.Box(0, 255, (4, 12, 12), np.uint8)
    vector = gym.spaces.Box(-1, 1, (6,), np.float32)
    actions = gym.spaces.Discrete(3)
    assert isinstance(replay_choice(64, 2, image, actions, "cpu", 4).build(), CompactReplayBuffer)
    assert type(replay_choice(64, 2, vector, actions, "cpu").build()) is ReplayBuffer
    with pytest.raises(ConfigError, match=r"needs observations of shape \(3, \.\.\.\).*\(4, 12, 12\)"):
        replay_choice(64, 2, image, actions, "cpu", 3).build()
    with pytest.raises(ConfigError, match="not an image space"):
        replay_choice(64, 2, vector, actions, "cpu", 4)


# -- memory ----------------------------------------------------------------------------------------------
def test_bytes_per_atari_transition_follow_from_the_shapes():
    # on the meta device: the tensors have their sizes without memory, so a full-size replay is measured
    capacity, num_envs, atari, device = 1_000_000, 8, (4, 84, 84), "meta"
    frame = 84 * 84
    side = 8 + 4 + 1 + 1  # int64 action, float32 reward, terminated, truncated
    float32 = ReplayBuffer(capacity, num_envs, StepLayout(atari, torch.float32, (), torch.int64), device)
    frames = StepLayout(atari, torch.uint8, (), torch.int64)
    uint8 = ReplayBuffer(capacity, num_envs, frames, device)
    lean = CompactReplayBuffer(capacity, num_envs, frames, device, 1)
    shared = CompactReplayBuffer(capacity, num_envs, frames, device, 4)
    assert float32.nbytes == capacity * (2 * 4 * 4 * frame + side)
    assert uint8.nbytes == capacity * (2 * 4 * frame + side)
    slots = capacity // num_envs
    rows = lambda k: num_envs * (slots + slots // 8 + 2 * k + 1)  # noqa: E731
    serials_heads_lasts = capacity * 16 + num_envs * (8 + 4 * frame)
    assert lean.nbytes == rows(1) * 4 * frame + capacity * side + serials_heads_lasts
    assert shared.nbytes == rows(4) * frame + capacity * side + serials_heads_lasts
    needed = CompactReplayBuffer.bytes_needed(slots, num_envs, frames, 4)
    assert shared.nbytes == needed
    per_transition = {buffer: buffer.nbytes / capacity for buffer in (float32, uint8, lean, shared)}
    assert per_transition[float32] / per_transition[uint8] == pytest.approx(4, rel=0.01)
    assert per_transition[uint8] / per_transition[lean] > 1.7  # next_obs no longer stored
    assert per_transition[uint8] / per_transition[shared] > 6.5  # and each frame once, not 8 times
    assert per_transition[shared] < 1.15 * frame


# -- DQN on images ---------------------------------------------------------------------------------------
class SpotSide(BatchedVecEnv):
    """A tiny image task: a bright 3x3 spot on the left or the right of a 12x12 grey image; action 0
    (left) or 1 (right) names its side. Right: reward 1; wrong: the episode terminates (reward 0); 8
    steps at most. The observation stacks the last 2 frames, ``(2, 12, 12)`` uint8 (the first frame of an
    episode repeated at its start). A random policy returns ~1, the right one 8."""

    state_names = ("sides", "rows", "t")
    length = 8

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu") -> None:
        space = gym.spaces.Box(0, 255, (2, 12, 12), np.uint8)
        super().__init__(num_envs, space, gym.spaces.Discrete(2), device, max_episode_steps=self.length)
        self.sides = torch.zeros(num_envs, self.length + 1, dtype=torch.int64, device=self.device)
        self.rows = torch.zeros_like(self.sides)
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.grid = torch.arange(12, device=self.device)

    def _reset_rows(self, mask):
        sides = (self.uniform(0, 2, (self.num_envs, self.length + 1))).long().clamp(max=1)
        rows = (self.uniform(0, 10, (self.num_envs, self.length + 1))).long().clamp(max=9)
        self.sides = torch.where(mask.unsqueeze(1), sides, self.sides)
        self.rows = torch.where(mask.unsqueeze(1), rows, self.rows)
        self.t = torch.where(mask, 0, self.t)

    def _advance(self, actions):
        right = actions.long() == self.sides.gather(1, self.t.unsqueeze(1)).squeeze(1)
        self.t = (self.t + 1).clamp(max=self.length)
        return right.float(), ~right

    def frame(self, t):
        side = self.sides.gather(1, t.unsqueeze(1))  # (N, 1)
        row = self.rows.gather(1, t.unsqueeze(1))
        column = 1 + 7 * side
        ys = (self.grid >= row) & (self.grid < row + 3)  # (N, 12)
        xs = (self.grid >= column) & (self.grid < column + 3)
        return (ys.unsqueeze(2) & xs.unsqueeze(1)).to(torch.uint8) * 255  # (N, 12, 12)

    def _observe(self):
        return torch.stack([self.frame((self.t - 1).clamp(min=0)), self.frame(self.t)], dim=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A D3QN trained on SpotSide through the Trainer: the compact replay with stacks of 2 frames."""
    phalanx.register_env("SpotSide-v0", SpotSide)
    config = make_config(
        "d3qn",
        "SpotSide-v0",
        num_envs=8,
        total_steps=1_000,  # ~90 gradient steps (a CNN's steps are the cost here)
        eval_every=0,
        eval_episodes=16,
        seed=3,
        save_buffer=True,
        hyperparameters=dict(
            hidden_sizes=(64,),
            learning_rate=1e-3,
            batch_size=32,
            buffer_size=4_000,
            learning_starts=256,
            updates_per_step=0.125,
            target_update_interval=25,
            exploration_steps=500,
            gamma=0.5,
            replay_stacked_frames=2,
        ),
    )
    trainer = Trainer(config, run_dir=tmp_path_factory.mktemp("spot"), show_progress=False)
    try:
        result = trainer.train()
        yield trainer, result, config
    finally:
        trainer.close()
        unregister_env("SpotSide-v0")


def test_dqn_reads_images_through_a_cnn_and_learns_the_spot_task(trained):
    trainer, result, _ = trained
    algorithm = trainer.algorithm
    assert isinstance(algorithm.q_network, QNetwork)
    assert any(isinstance(module, torch.nn.Conv2d) for module in algorithm.q_network.encoder.modules())
    assert any(isinstance(module, torch.nn.Conv2d) for module in algorithm.q_target.encoder.modules())
    assert isinstance(trainer.buffer, CompactReplayBuffer) and trainer.buffer.frames.dtype == torch.uint8
    assert trainer.buffer.stacked_frames == 2
    evaluation = trainer.evaluator.evaluate(algorithm)
    assert evaluation.mean >= 7.0, evaluation.returns  # a random policy: ~1


def test_image_run_resumes_with_its_compact_replay(trained, tmp_path):
    trainer, _, config = trained
    checkpoint = trainer.save()
    state = load_checkpoint(checkpoint)
    assert state["buffer"]["frames"].dtype == torch.uint8
    resumed = Trainer(config, run_dir=tmp_path, show_progress=False)
    try:
        resumed.load_state_dict(state)
        for seed in range(2):
            torch.manual_seed(seed)
            expected = trainer.buffer.sample(64, 0.9)
            torch.manual_seed(seed)
            batch = resumed.buffer.sample(64, 0.9)
            assert torch.equal(batch.obs, expected.obs) and torch.equal(batch.next_obs, expected.next_obs)
        obs = trainer.buffer.sample(16, 0.9).obs
        assert torch.equal(resumed.algorithm.q_network(obs), trainer.algorithm.q_network(obs))
    finally:
        resumed.close()


def test_replay_stacked_frames_must_match_the_observations():
    with pytest.raises(ConfigError, match="replay_stacked_frames"):
        make_config("dqn", "CartPole-v1", hyperparameters=dict(replay_stacked_frames=0)).validate()
    config = make_config("dqn", "CartPole-v1", num_envs=2, hyperparameters=dict(replay_stacked_frames=4))
    with pytest.raises(ConfigError, match="not an image space"):
        Trainer(config, show_progress=False)
