"""Image observations (CNN encoders), Dict observations and MultiDiscrete actions for PPO and A2C, end to
end: networks, training, checkpoints, resume, load_agent, export, and the errors for what is refused.

The envs here are small batched simulators of the VecEnv contract for these spaces: uint8 images stay
uint8, a Dict space is presented as the Dict while its observations are the flat float32 vectors of
``gymnasium.spaces.flatten``, MultiDiscrete actions arrive as ``(N, k)``.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

import phalanx
from phalanx.agent import load_agent
from phalanx.algos.ppo import (
    A2C,
    PPO,
    A2CConfig,
    FlatSampler,
    PPOConfig,
    minibatch_size,
    update_settings,
)
from phalanx.config import ENCODERS
from phalanx.envs import BatchedVecEnv, register_env
from phalanx.envs.registry import unregister_env
from phalanx.errors import ConfigError
from phalanx.nets import (
    CategoricalPolicy,
    GaussianPolicy,
    ImpalaCNN,
    MultiCategoricalPolicy,
    ValueNet,
    feature_encoder,
)
from phalanx.train.environments import space_spec, spaces_from_spec

EPISODE_STEPS = 8
POSITIONS = ((1, 1), (1, 6), (6, 1), (6, 6))
"""Where BrightPixel's pixel lights up: position i says that action i pays."""


class _CueEnv(BatchedVecEnv):
    """A contextual bandit of episodes of EPISODE_STEPS steps: every step shows a random cue (from a
    per-row LCG, so that the step draws nothing and the state checkpoints); the action that matches the
    cue pays 1. ``self.state`` is the LCG state (int64); the cue is read from it."""

    num_cues = 4

    def __init__(self, num_envs, observation_space, action_space, device):
        super().__init__(num_envs, observation_space, action_space, device, max_episode_steps=EPISODE_STEPS)
        self.state = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    def _reset_rows(self, mask):
        seeds = (self.uniform(0.0, 2.0**31, (self.num_envs,))).long()
        self.state = torch.where(mask, seeds, self.state)

    def _next(self):
        self.state = (self.state * 1103515245 + 12345) % 2**31

    def cues(self, count: int, dim: int = 0) -> torch.Tensor:
        """Cue ``dim`` of every row, in ``[0, count)``."""
        return (self.state >> (16 + 3 * dim)) % count


class BrightPixelEnv(_CueEnv):
    """uint8 images ``shape`` (channels first, or last with ``channels_last``) of black pixels but one:
    255 at ``POSITIONS[cue]``; 4 actions, action ``cue`` pays 1."""

    def __init__(self, num_envs=1, device="cpu", shape=(1, 8, 8), channels_last=False):
        space = gym.spaces.Box(0, 255, shape, np.uint8)
        super().__init__(num_envs, space, gym.spaces.Discrete(4), device)
        channels, height, width = (shape[2], shape[0], shape[1]) if channels_last else shape
        frames = torch.zeros(4, channels, height, width, dtype=torch.uint8, device=self.device)
        for cue, (row, column) in enumerate(POSITIONS):
            frames[cue, :, row, column] = 255
        self.frames = frames.permute(0, 2, 3, 1).contiguous() if channels_last else frames

    def _advance(self, actions):
        reward = (actions == self.cues(4)).float()
        self._next()
        return reward, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _observe(self):
        return self.frames[self.cues(4)]


DICT_SPACE = gym.spaces.Dict(
    {
        "frame": gym.spaces.Box(0, 255, (1, 8, 8), np.uint8),
        "cue": gym.spaces.Discrete(2),
        "level": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    }
)
"""Flattened (keys sorted): cue (one-hot, 2), frame (64, 0 or 255), level (3): 69 values."""


class DictCueEnv(_CueEnv):
    """Dict observations, flat float32 tensors: the cue part says which of 2 actions pays; the frame (a
    uint8 image part) and the level are noise from the LCG."""

    def __init__(self, num_envs=1, device="cpu"):
        super().__init__(num_envs, DICT_SPACE, gym.spaces.Discrete(2), device)

    def _advance(self, actions):
        reward = (actions == self.cues(2)).float()
        self._next()
        return reward, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _observe(self):
        cue = torch.nn.functional.one_hot(self.cues(2), 2).float()
        frame = ((self.state.unsqueeze(1) >> torch.arange(64, device=self.device) % 31) % 2 * 255).float()
        level = (self.cues(7, 1).float().unsqueeze(1) / 3 - 1).expand(-1, 3)
        return torch.cat([cue, frame, level], dim=1)  # gymnasium.spaces.flatten's order


class TwoDialsEnv(_CueEnv):
    """MultiDiscrete([3, 2]) actions: the observation is the one-hot of two cues (3 + 2 values); each
    dial set to its cue pays 1."""

    def __init__(self, num_envs=1, device="cpu"):
        space = gym.spaces.Box(0.0, 1.0, (5,), np.float32)
        super().__init__(num_envs, space, gym.spaces.MultiDiscrete([3, 2]), device)

    def _advance(self, actions):
        actions = actions.long()  # (N, 2)
        reward = (actions[:, 0] == self.cues(3)).float() + (actions[:, 1] == self.cues(2, 1)).float()
        self._next()
        return reward, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _observe(self):
        one_hot = torch.nn.functional.one_hot
        return torch.cat([one_hot(self.cues(3), 3), one_hot(self.cues(2, 1), 2)], dim=1).float()


class TupleObservationEnv(_CueEnv):
    def __init__(self, num_envs=1, device="cpu"):
        space = gym.spaces.Tuple((gym.spaces.Box(-1.0, 1.0, (2,), np.float32),))
        super().__init__(num_envs, space, gym.spaces.Discrete(2), device)


class BadDictEnv(_CueEnv):
    def __init__(self, num_envs=1, device="cpu"):
        space = gym.spaces.Dict({"inner": gym.spaces.Dict({"x": gym.spaces.Discrete(2)})})
        super().__init__(num_envs, space, gym.spaces.Discrete(2), device)


class ShiftedDialsEnv(TwoDialsEnv):
    """TwoDials with ``MultiDiscrete([3, 2], start=[1, -4])``: the same task, its actions shifted; an action
    outside the space raises, as a strict simulator would."""

    START = (1, -4)

    def __init__(self, num_envs=1, device="cpu"):
        space = gym.spaces.MultiDiscrete([3, 2], start=list(self.START))
        _CueEnv.__init__(self, num_envs, gym.spaces.Box(0.0, 1.0, (5,), np.float32), space, device)

    def _advance(self, actions):
        shifted = actions.long() - torch.tensor(self.START, device=actions.device)
        if not ((shifted >= 0) & (shifted < torch.tensor([3, 2], device=actions.device))).all():
            raise ValueError(f"actions {actions.tolist()} are not in {self.single_action_space}")
        return super()._advance(shifted)


ENVS = {
    "BrightPixel-v0": BrightPixelEnv,
    "DictCue-v0": DictCueEnv,
    "TwoDials-v0": TwoDialsEnv,
    "TupleObservation-v0": TupleObservationEnv,
    "BadDict-v0": BadDictEnv,
    "ShiftedDials-v0": ShiftedDialsEnv,
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    for name, factory in ENVS.items():
        register_env(name, factory, overwrite=True)
    yield
    for name in ENVS:
        unregister_env(name)


def _config(algo: str, env: str, run_dir, **overrides):
    settings = dict(
        run_dir=str(run_dir),
        num_envs=8,
        eval_episodes=8,
        eval_every=0,
        log_every=10_000,
        seed=0,
        device="cpu",
    )
    settings.update(overrides)
    return phalanx.make_config(algo, env, **settings)


def _train(config):
    return phalanx.train(config, show_progress=False)


IMAGE_PPO = dict(
    total_steps=1536,
    horizon=32,
    minibatch_size=64,
    epochs=4,
    learning_rate=1e-3,
    entropy_coef=0.01,
    gamma=0.5,
    hidden_sizes=(64,),
)


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """A seeded PPO run on BrightPixel (IMPALA CNN, shared encoder), trained once for the tests below."""
    run_dir = tmp_path_factory.mktemp("image") / "run"
    result = _train(_config("ppo", "BrightPixel-v0", run_dir, **IMAGE_PPO))
    return run_dir, result


@pytest.fixture(scope="module")
def dict_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dict") / "run"
    config = _config(
        "ppo", "DictCue-v0", run_dir, total_steps=1024, horizon=32, minibatch_size=64, hidden_sizes=(32,)
    )
    return run_dir, _train(config)


@pytest.fixture(scope="module")
def dials_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dials") / "run"
    config = _config(
        "ppo",
        "TwoDials-v0",
        run_dir,
        total_steps=4096,
        horizon=32,
        minibatch_size=64,
        learning_rate=3e-3,
        gamma=0.5,
        hidden_sizes=(32,),
    )
    return run_dir, _train(config)


# -- networks ------------------------------------------------------------------------------------------
IMAGE_SPACE = gym.spaces.Box(0, 255, (1, 12, 12), np.uint8)


def test_flat_heads_are_the_plain_mlps_of_before():
    torch.manual_seed(0)
    policy = CategoricalPolicy(4, 2, (8,))
    assert policy.encoder is None and policy.observation_rank == 1
    assert list(policy.state_dict()) == [
        "logits_net.0.weight",
        "logits_net.0.bias",
        "logits_net.2.weight",
        "logits_net.2.bias",
    ]
    algorithm = PPO(PPOConfig(), gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), "cpu")
    assert algorithm.parameters == [*algorithm.policy.parameters(), *algorithm.value.parameters()]


@pytest.mark.parametrize("share", [True, False])
def test_share_encoder_gives_one_encoder_to_policy_and_value(share):
    config = PPOConfig(share_encoder=share)
    algorithm = PPO(config, IMAGE_SPACE, gym.spaces.Discrete(4), "cpu")
    policy_encoder, value_encoder = algorithm.policy.encoder, algorithm.value.encoder
    assert isinstance(policy_encoder, ImpalaCNN) and isinstance(value_encoder, ImpalaCNN)
    assert (policy_encoder is value_encoder) == share
    encoder_size = sum(parameter.numel() for parameter in policy_encoder.parameters())
    heads = sum(
        parameter.numel()
        for network in (algorithm.policy.logits_net, algorithm.value.value_net)
        for parameter in network[1:].parameters()
    )
    expected = heads + encoder_size * (1 if share else 2)
    assert sum(parameter.numel() for parameter in algorithm.parameters) == expected
    assert algorithm.optimizer.flat.parameter.numel() == expected  # the optimiser steps each tensor once
    # a checkpoint of the algorithm loads into a new one of the same config
    other = PPO(config, IMAGE_SPACE, gym.spaces.Discrete(4), "cpu")
    other.load_state_dict(algorithm.state_dict())
    obs = torch.randint(0, 256, (3, 1, 12, 12), dtype=torch.uint8)
    assert torch.equal(other.act(obs), algorithm.act(obs))
    assert torch.equal(other.value(obs), algorithm.value(obs))


@pytest.mark.parametrize(
    "action_space, actions",
    [
        (gym.spaces.Discrete(4), torch.randint(0, 4, (16,))),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), torch.randn(16, 2)),
        (gym.spaces.MultiDiscrete([3, 2]), torch.randint(0, 2, (16, 2))),
    ],
)
def test_shared_encoder_runs_once_and_the_function_step_matches_the_eager_one(action_space, actions):
    """With a shared encoder the loss runs the trunk once for both heads; the gradient step as one
    function (GradientStep, the compiled update's, run eagerly here) gives what the eager step gives,
    and both change the encoder."""
    from phalanx.gradient_step import GradientStep

    torch.manual_seed(1)
    config = PPOConfig(hidden_sizes=(16,))
    algorithm = PPO(config, IMAGE_SPACE, action_space, "cpu")
    twin = PPO(config, IMAGE_SPACE, action_space, "cpu")
    twin.load_state_dict(algorithm.state_dict())
    before = [parameter.detach().clone() for parameter in algorithm.policy.encoder.parameters()]
    obs = torch.randint(0, 256, (16, 1, 12, 12), dtype=torch.uint8)
    targets, index = torch.randn(4, 16), torch.arange(16)
    calls = []
    algorithm.policy.encoder.register_forward_hook(lambda *_: calls.append(1))
    hyperparameters = update_settings(config).loss
    loss, _ = algorithm.loss_function()(hyperparameters, targets, index, obs, actions, None)
    assert len(calls) == 1
    algorithm.optimizer.zero_grad()
    loss.backward()
    algorithm.optimizer_step(algorithm.optimizer, 0.5)
    step = GradientStep(twin.optimizer, twin.loss_modules(), twin.loss_function(), 0.5)
    step(hyperparameters, targets, index, obs, actions, None)
    for network, twin_network in ((algorithm.policy, twin.policy), (algorithm.value, twin.value)):
        for parameter, twin_parameter in zip(network.parameters(), twin_network.parameters(), strict=True):
            torch.testing.assert_close(parameter, twin_parameter)
    after = list(algorithm.policy.encoder.parameters())
    assert all(not torch.equal(old, new) for old, new in zip(before, after, strict=True))
    # collection: one encoder forward for the actions and the values, as the full networks compute them
    calls.clear()
    noise = algorithm.policy.draw_noise(obs)
    actions, log_probs, values = algorithm.explore(obs, noise)
    assert len(calls) == 1
    expected_actions, expected_log_probs = algorithm.policy.sample(obs, noise=noise)
    assert torch.equal(actions, expected_actions)
    torch.testing.assert_close(log_probs, expected_log_probs)
    torch.testing.assert_close(values, algorithm.value(obs))


def test_a2c_is_ppo_update_with_one_full_batch_pass_of_the_plain_gradient():
    """PPO and A2C run the one update (ppo_update); A2C's config makes it one epoch of one minibatch of
    the whole rollout, no clipping and no KL stop."""
    a2c = update_settings(A2CConfig())
    assert (a2c.epochs, a2c.target_kl, a2c.loss.clip_range, a2c.loss.clip_value) == (1, None, None, None)
    assert minibatch_size(A2CConfig()) is None
    minibatches = FlatSampler(None, torch.device("cpu")).minibatches((torch.zeros(4, 10), None, None, None))
    assert [tuple(index.shape) for _, index, *_ in minibatches] == [(10,)]
    assert sorted(minibatches[0][1].tolist()) == list(range(10))
    ppo = update_settings(PPOConfig(epochs=3, clip_range=0.1, clip_value=0.5, target_kl=0.02))
    assert (ppo.epochs, ppo.target_kl, ppo.loss.clip_range, ppo.loss.clip_value) == (3, 0.02, 0.1, 0.5)
    assert [
        len(index)
        for _, index, *_ in FlatSampler(4, torch.device("cpu")).minibatches(
            (torch.zeros(4, 10), None, None, None)
        )
    ] == [4, 4, 2]


def test_multi_categorical_policy_is_independent_categoricals():
    torch.manual_seed(2)
    policy = MultiCategoricalPolicy(5, (3, 1, 4), (16,))
    obs = torch.randn(64, 5)
    log_probs = policy(obs)  # (B, 3, 4)
    assert log_probs.shape == (64, 3, 4)
    logits = policy.logits_net(obs).split([3, 1, 4], dim=-1)
    distributions = [torch.distributions.Categorical(logits=part) for part in logits]
    noise = policy.draw_noise(obs, torch.Generator().manual_seed(0))
    assert noise.shape == (64, 12) and policy.action_noise.size == 12
    actions, log_prob = policy.sample(obs, noise=noise)
    assert actions.shape == (64, 3) and actions.dtype == torch.int64
    assert (actions[:, 0] < 3).all() and (actions[:, 1] == 0).all() and (actions[:, 2] < 4).all()
    expected = sum(d.log_prob(actions[:, i]) for i, d in enumerate(distributions))
    torch.testing.assert_close(log_prob, expected)
    scored, entropy = policy.log_prob_entropy(obs, actions)
    torch.testing.assert_close(scored, expected)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in distributions))
    deterministic = policy.deterministic_action(obs)
    assert torch.equal(deterministic, torch.stack([part.argmax(-1) for part in logits], dim=1))
    # Gumbel-max: the sampled frequencies follow the probabilities
    many = obs[:1].expand(20_000, 5)
    sampled, _ = policy.sample(many, generator=torch.Generator().manual_seed(3))
    frequencies = torch.bincount(sampled[:, 2], minlength=4).float() / 20_000
    torch.testing.assert_close(frequencies, distributions[2].probs[0], atol=0.015, rtol=0)


def test_heads_with_an_encoder_read_batches_of_images():
    encoder, features = feature_encoder(IMAGE_SPACE)
    for head in (
        CategoricalPolicy(features, 4, (8,), encoder=encoder),
        GaussianPolicy(features, 2, (8,), encoder=encoder),
        MultiCategoricalPolicy(features, (2, 3), (8,), encoder=encoder),
    ):
        obs = torch.randint(0, 256, (5, 1, 12, 12), dtype=torch.uint8)
        assert head.observation_rank == 3
        noise = head.draw_noise(obs)
        assert noise.shape == (5, head.action_noise.size)
        action, log_prob = head.sample(obs, noise=noise)
        assert action.shape[0] == 5 and log_prob.shape == (5,)
    assert ValueNet(features, (8,), encoder=encoder)(obs).shape == (5,)


# -- checkpoint form of the spaces --------------------------------------------------------------------
@pytest.mark.parametrize(
    "observation_space, action_space",
    [
        (IMAGE_SPACE, gym.spaces.Discrete(4)),
        (gym.spaces.Box(0, 255, (12, 12, 3), np.uint8), gym.spaces.MultiDiscrete([3, 2])),
        (
            gym.spaces.Dict(
                {
                    "a": gym.spaces.Dict({"b": gym.spaces.Box(-1.0, 2.0, (2,), np.float32)}),
                    "c": gym.spaces.MultiBinary(3),
                    "d": DICT_SPACE["frame"],
                    "e": gym.spaces.Discrete(3, start=2),
                }
            ),
            gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
        ),
    ],
)
def test_space_spec_round_trips_dtypes_dicts_and_multi_discrete(observation_space, action_space, tmp_path):
    spec = space_spec(observation_space, action_space)
    torch.save(spec, tmp_path / "spec.pt")
    loaded = torch.load(tmp_path / "spec.pt", weights_only=True)  # tensors and primitives only
    assert spaces_from_spec(loaded) == (observation_space, action_space)


def test_space_spec_of_before_dtypes_still_loads():
    old = {
        "observation_shape": [3],
        "observation_low": torch.full((3,), -1.0),
        "observation_high": torch.full((3,), 1.0),
        "action": {"type": "box", "low": torch.full((2,), -2.0), "high": torch.full((2,), 2.0)},
    }
    observation_space, action_space = spaces_from_spec(old)
    assert observation_space == gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    assert action_space == gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    old["action"] = {"type": "discrete", "n": 5}
    assert spaces_from_spec(old)[1] == gym.spaces.Discrete(5)


# -- training, checkpoints, load_agent, resume -----------------------------------------------------------
def test_image_ppo_learns_which_pixel_pays(image_run):
    run_dir, result = image_run
    # random actions earn 2 of 8; the CNN policy reads the pixel
    assert result.summary["eval_return_mean"] >= 7.0, result.summary
    agent = load_agent(run_dir)
    assert agent.observation_space == gym.spaces.Box(0, 255, (1, 8, 8), np.uint8)
    frames = BrightPixelEnv(4).frames.numpy()  # (4, 1, 8, 8) uint8, one per cue
    assert agent.act(frames).tolist() == [0, 1, 2, 3]
    assert agent.act(frames[2]) == 2  # one observation
    assert torch.equal(agent.act(torch.from_numpy(frames)), torch.tensor([0, 1, 2, 3]))


def test_image_checkpoint_gives_the_trained_actions(image_run):
    run_dir, _ = image_run
    agent = load_agent(run_dir, "latest")
    again = load_agent(run_dir, "latest")
    obs = torch.randint(0, 256, (16, 1, 8, 8), dtype=torch.uint8)
    assert torch.equal(agent.act(obs, deterministic=True), again.act(obs, deterministic=True))
    values = agent.algorithm.value(obs)
    torch.testing.assert_close(values, again.algorithm.value(obs), rtol=0, atol=0)
    assert agent.algorithm.policy.encoder is agent.algorithm.value.encoder


def test_image_run_resumes_exactly(tmp_path):
    """A2C with an encoder each: a run stopped at 256 steps and resumed to 512 ends with the weights of
    a run of 512 steps straight through (the env, the RNG and the optimiser continue exactly)."""
    settings = dict(horizon=16, hidden_sizes=(16,), share_encoder=False, checkpoint_every=256)
    _train(_config("a2c", "BrightPixel-v0", tmp_path / "resumed", total_steps=256, **settings))
    result = phalanx.resume(tmp_path / "resumed", total_steps=512, show_progress=False)
    assert result.summary["total_steps"] == 512 and result.summary["updates"] == 512 // 128
    _train(_config("a2c", "BrightPixel-v0", tmp_path / "straight", total_steps=512, **settings))
    resumed, straight = (load_agent(tmp_path / name, "latest") for name in ("resumed", "straight"))
    assert isinstance(resumed.algorithm, A2C)
    assert resumed.algorithm.policy.encoder is not resumed.algorithm.value.encoder
    for network in ("policy", "value"):
        state, expected = (getattr(agent.algorithm, network).state_dict() for agent in (resumed, straight))
        for key in expected:
            torch.testing.assert_close(state[key], expected[key], rtol=0, atol=0)


def test_dict_run_acts_on_dicts_and_flat_vectors(dict_run):
    run_dir, result = dict_run
    assert result.summary["total_steps"] == 1024
    agent = load_agent(run_dir)
    assert agent.observation_space == DICT_SPACE
    observations = [DICT_SPACE.sample() for _ in range(6)]
    flat = np.stack([gym.spaces.flatten(DICT_SPACE, obs) for obs in observations]).astype(np.float32)
    expected = agent.act(flat)
    assert [int(agent.act(obs)) for obs in observations] == expected.tolist()
    batch = {key: np.stack([obs[key] for obs in observations]) for key in DICT_SPACE.spaces}
    assert agent.act(batch).tolist() == expected.tolist()
    with pytest.raises(ValueError, match="no part 'level'"):
        agent.act({"cue": 1, "frame": observations[0]["frame"]})


def test_multi_discrete_ppo_learns_both_dials(dials_run):
    run_dir, result = dials_run
    assert result.summary["eval_return_mean"] >= 15.0, result.summary  # random: 8 * (1/3 + 1/2) = 6.7
    agent = load_agent(run_dir)
    assert agent.action_space == gym.spaces.MultiDiscrete([3, 2])
    obs = np.eye(5, dtype=np.float32)[[0, 1, 2]] + np.eye(5, dtype=np.float32)[[3, 4, 3]]
    assert agent.act(obs).tolist() == [[0, 0], [1, 1], [2, 0]]


# -- export ----------------------------------------------------------------------------------------------
def _exported_actions(path, inputs):
    if path.suffix == ".onnx":
        onnxruntime = pytest.importorskip("onnxruntime")
        session = onnxruntime.InferenceSession(str(path))
        names = [item.name for item in session.get_inputs()]
        return session.run(None, {name: value.numpy() for name, value in zip(names, inputs, strict=True)})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 marks TorchScript deprecated
        return torch.jit.load(str(path))(*inputs).numpy()


@pytest.mark.parametrize(
    "run, format",
    [
        ("image_run", "torchscript"),
        ("dict_run", "torchscript"),
        ("dials_run", "torchscript"),
        ("image_run", "onnx"),
        # an ONNX export takes ~5-10 s (torch.export): the other two in the slow suite
        pytest.param("dict_run", "onnx", marks=pytest.mark.slow),
        pytest.param("dials_run", "onnx", marks=pytest.mark.slow),
    ],
)
def test_export_equals_load_agent(run, format, request, tmp_path):
    if format == "onnx":
        pytest.importorskip("onnxscript")
        pytest.importorskip("onnxruntime")
    from phalanx.exporting import export

    run_dir, _ = request.getfixturevalue(run)
    agent = load_agent(run_dir)
    generator = torch.Generator().manual_seed(0)
    if isinstance(agent.observation_space, gym.spaces.Dict):
        obs = torch.as_tensor(
            np.stack([gym.spaces.flatten(DICT_SPACE, DICT_SPACE.sample()) for _ in range(5)]),
            dtype=torch.float32,
        )
    elif agent.observation_space.dtype == np.uint8:
        obs = torch.randint(
            0, 256, (5, *agent.observation_space.shape), dtype=torch.uint8, generator=generator
        )
    else:
        obs = torch.rand((5, *agent.observation_space.shape), generator=generator)
    path = export(run_dir, format, output=tmp_path / f"policy{'.onnx' if format == 'onnx' else '.pt'}")
    np.testing.assert_array_equal(_exported_actions(path, (obs,)), agent.act(obs).numpy())
    if run == "dials_run":  # the sampling policy, with the draw as an input: the library's sample
        path = export(run_dir, format, output=tmp_path / f"stochastic{path.suffix}", stochastic=True)
        policy = agent.algorithm.policy
        noise = policy.draw_noise(obs, generator)
        expected, _ = policy.sample(obs, noise=noise)
        actions = _exported_actions(path, (obs, noise))
        assert actions.dtype == np.int64 and actions.shape == (5, 2)
        np.testing.assert_array_equal(actions, expected.numpy())


def test_export_metadata_names_the_input_dtype_and_the_dict_order(image_run, dict_run, dials_run):
    from phalanx.exporting import exported_policies

    image = exported_policies(load_agent(image_run[0]))[None]
    assert image.describe_inputs() == "obs uint8 (batch, 1, 8, 8)"
    assert image.example_inputs()[0].dtype == torch.uint8
    flat = exported_policies(load_agent(dict_run[0]))[None]
    assert flat.describe_inputs().startswith("obs float32 (batch, 69), the Dict observation flattened")
    assert "parts cue, frame, level in this order" in flat.describe_inputs()
    dials = exported_policies(load_agent(dials_run[0]))[None]
    assert dials.describe_output() == "action int64 (batch, 2), in MultiDiscrete([3 2])"


# -- what is refused ---------------------------------------------------------------------------------
def _refused(tmp_path, algo, env, **overrides) -> str:
    config = _config(algo, env, tmp_path / "run", total_steps=64, **overrides)
    with pytest.raises(ConfigError) as error:
        _train(config)
    assert not (tmp_path / "run").exists()
    return str(error.value)


def test_flat_only_algorithms_refuse_images_naming_those_that_read_them(tmp_path):
    message = _refused(tmp_path, "sac", "BrightPixel-v0", learning_starts=256, batch_size=64)
    assert "Discrete" in message  # sac's action space check comes first: Box only
    register_env("BrightPixelBox-v0", _BrightPixelBox, overwrite=True)
    try:
        message = _refused(tmp_path, "ddpg", "BrightPixelBox-v0", learning_starts=256, batch_size=64)
    finally:
        unregister_env("BrightPixelBox-v0")
    assert message.startswith("image observations (1, 12, 12) uint8: ddpg reads flat vectors only; use ")
    assert "a2c or ppo" in message and "flatten the observations" in message


class _BrightPixelBox(_CueEnv):
    def __init__(self, num_envs=1, device="cpu"):
        super().__init__(num_envs, IMAGE_SPACE, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), device)


def test_dict_observations_are_refused_by_flat_only_algorithms(tmp_path):
    message = _refused(tmp_path, "dqn", "DictCue-v0", learning_starts=256, batch_size=64)
    assert message.startswith("Dict observations Dict(")
    assert "dqn reads flat vectors" in message and "use a2c or ppo" in message


def test_unreadable_spaces_are_named(tmp_path):
    message = _refused(tmp_path, "ppo", "TupleObservation-v0", horizon=8, minibatch_size=8)
    assert "ppo cannot read the observation space Tuple(" in message and "FlattenObservation" in message
    message = _refused(tmp_path, "ppo", "BadDict-v0", horizon=8, minibatch_size=8)
    assert "Dict observation part 'inner'" in message and "Convert that part" in message


# -- integer actions that start away from 0: shifted at the env boundary, for every algorithm -----------
def test_multidiscrete_actions_that_start_away_from_0_train_as_those_from_0(tmp_path):
    """The shift is invisible to the agent: the same seed learns the same policy as on TwoDials, and the
    run, the deployed agent and the exported file all act inside the shifted space."""
    settings = dict(total_steps=512, horizon=16, minibatch_size=64, epochs=2, eval_every=256)
    plain = _train(_config("ppo", "TwoDials-v0", tmp_path / "plain", **settings))
    shifted = _train(_config("ppo", "ShiftedDials-v0", tmp_path / "shifted", **settings))
    assert shifted.summary["eval_return_mean"] == plain.summary["eval_return_mean"]
    obs = torch.nn.functional.one_hot(torch.tensor([0, 2, 1, 0]), 5).float().numpy()
    actions = np.asarray(phalanx.load_agent(shifted.run_dir).act(obs))
    assert (actions[:, 0] >= 1).all() and (actions[:, 0] <= 3).all(), actions
    assert (actions[:, 1] >= -4).all() and (actions[:, 1] <= -3).all(), actions
    exported = torch.jit.load(str(phalanx.export(shifted.run_dir, "torchscript", output=tmp_path / "p.pt")))
    assert exported(torch.as_tensor(obs)).tolist() == actions.tolist()


DISCRETE_CASES = [
    ("ppo", -3),
    ("ppo", 5),
    ("a2c", 5),
    ("dqn", -3),
    ("double-dqn", 5),
    ("dueling-dqn", -3),
    ("d3qn", 5),
    ("pqn", -3),
]


@pytest.mark.parametrize(("algo", "start"), DISCRETE_CASES)
def test_discrete_actions_reach_a_gymnasium_env_inside_a_space_that_starts_away_from_0(tmp_path, algo, start):
    """ShiftedCartPole raises on any action outside Discrete(2, start): the run, its evaluation, the
    deployed agent and the exported policy must all stay inside it."""
    from space_envs import ShiftedCartPole

    env_id = f"ShiftedCartPole{start}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=lambda: ShiftedCartPole(start))
    on_policy = algo in ("ppo", "a2c", "pqn")
    settings = {"horizon": 16, "minibatch_size": 64} if on_policy else {"learning_starts": 64}
    if algo == "a2c":
        settings.pop("minibatch_size")
    config = phalanx.make_config(
        algo, env_id, use_preset=False, run_dir=str(tmp_path / "run"), num_envs=4, total_steps=256,
        eval_every=128, eval_episodes=2, hidden_sizes=(16, 16), seed=1, **settings,
    )  # fmt: skip
    result = _train(config)
    assert result.summary["total_steps"] == 256 and result.summary["error"] is None
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    actions = np.asarray(phalanx.load_agent(result.run_dir).act(obs))
    assert set(actions.tolist()) <= {start, start + 1}, actions
    exported = torch.jit.load(str(phalanx.export(result.run_dir, "torchscript", output=tmp_path / "p.pt")))
    assert exported(torch.as_tensor(obs)).tolist() == actions.tolist()


def test_encoder_choices_that_cannot_read_the_space(tmp_path):
    message = _refused(tmp_path, "ppo", "BrightPixel-v0", horizon=8, minibatch_size=8, encoder="mlp")
    assert "encoder 'mlp' cannot read the images of the observation space" in message
    assert "Use encoder 'auto'" in message
    message = _refused(tmp_path, "ppo", "BrightPixel-v0", horizon=8, minibatch_size=8, encoder="nature")
    assert "nature CNN needs images of at least 36x36" in message and "'impala'" in message
    message = _refused(tmp_path, "a2c", "TwoDials-v0", encoder="impala")
    assert "encoder 'impala' is a CNN for images" in message


def test_encoder_setting_is_validated_with_the_config():
    assert ENCODERS == ("auto", "mlp", "nature", "impala", "minatar")
    with pytest.raises(ConfigError, match=r"encoder = 'resnet' is invalid: expected one of \('auto'"):
        phalanx.make_config("ppo", "CartPole-v1", encoder="resnet").validate()
    with pytest.raises(
        ConfigError, match=r"encoder = 'impala' is invalid: expected 'auto' or 'mlp': sac reads flat"
    ):
        phalanx.make_config("sac", "Pendulum-v1", encoder="impala").validate()
    phalanx.make_config("a2c", "CartPole-v1", encoder="nature").validate()  # the space decides, later
    assert A2CConfig().share_encoder is True and A2CConfig().encoder == "auto"


def test_normalize_obs_is_refused_for_images_and_dicts(tmp_path):
    message = _refused(tmp_path, "ppo", "BrightPixel-v0", horizon=8, minibatch_size=8, normalize_obs=True)
    assert "normalize_obs = True cannot apply to the image observations" in message
    assert "scaled to [0, 1] inside the network's encoder" in message and "Drop --normalize-obs" in message
    message = _refused(tmp_path, "ppo", "DictCue-v0", horizon=8, minibatch_size=8, normalize_obs=True)
    assert "cannot apply to the image observations of Dict(" in message  # the frame part


def test_vectorized_population_refuses_encoders_and_multi_discrete():
    from phalanx.population.vectorized_base import check_batchable

    with pytest.raises(
        ConfigError, match=r"no encoder for the image observations of Box\(0, 255, \(1, 12, 12\)"
    ):
        check_batchable("ppo", IMAGE_SPACE, gym.spaces.Discrete(4))
    with pytest.raises(ConfigError, match="Use the process backend"):
        check_batchable("ppo", DICT_SPACE, gym.spaces.Discrete(2))
    with pytest.raises(ConfigError, match=r"not the MultiDiscrete action space MultiDiscrete\(\[3 2\]\)"):
        check_batchable("ppo", gym.spaces.Box(0.0, 1.0, (5,), np.float32), gym.spaces.MultiDiscrete([3, 2]))
    check_batchable("ppo", gym.spaces.Box(0.0, 1.0, (5,), np.float32), gym.spaces.Discrete(2))


def test_cli_flags_come_from_the_fields(capsys):
    from phalanx.cli import main, parse_train_args

    config = parse_train_args(["ppo", "BrightPixel-v0", "--encoder", "impala", "--no-share-encoder"])
    assert (config.hyperparameters.encoder, config.hyperparameters.share_encoder) == ("impala", False)
    with pytest.raises(SystemExit):
        main(["train", "a2c", "BrightPixel-v0", "--help"])
    out = capsys.readouterr().out
    assert "--encoder STR" in out and "--share-encoder, --no-share-encoder" in out


@pytest.mark.slow
def test_compiled_image_run_matches_the_eager_one(tmp_path):
    """torch.compile of the rollout step (uint8 frames, the CNN) and of the gradient step (the shared
    encoder run once, through functional_call) gives the eager run's weights, up to float rounding."""
    settings = dict(total_steps=512, horizon=16, minibatch_size=64, hidden_sizes=(16,))
    runs = {}
    for compile in (False, True):
        run_dir = tmp_path / f"compile_{compile}"
        _train(_config("ppo", "BrightPixel-v0", run_dir, compile=compile, **settings))
        runs[compile] = load_agent(run_dir, "latest").algorithm
    for key, value in runs[False].policy.state_dict().items():
        torch.testing.assert_close(runs[True].policy.state_dict()[key], value, rtol=1e-4, atol=1e-4)


def test_the_workers_compiled_acting_runs_a_shared_encoder_once():
    """Worker.act (what --compile compiles for envs stepped outside torch) is PPO's explore with the draw
    given: one encoder forward for the actions and the values, and the same outputs."""
    from types import SimpleNamespace

    from phalanx.train.worker import Worker

    torch.manual_seed(3)
    algorithm = PPO(PPOConfig(hidden_sizes=(16,)), IMAGE_SPACE, gym.spaces.Discrete(4), "cpu")
    worker = Worker(SimpleNamespace(device=torch.device("cpu")), algorithm)  # act does not step the env
    calls = []
    algorithm.policy.encoder.register_forward_hook(lambda *_: calls.append(1))
    obs = torch.randint(0, 256, (6, 1, 12, 12), dtype=torch.uint8)
    noise = algorithm.policy.draw_noise(obs)
    actions, log_probs, values = worker.act(obs, noise)
    assert len(calls) == 1
    expected_actions, expected_log_probs = algorithm.policy.sample(obs, noise=noise)
    assert torch.equal(actions, expected_actions)
    torch.testing.assert_close(log_probs, expected_log_probs)
    torch.testing.assert_close(values, algorithm.value(obs))
