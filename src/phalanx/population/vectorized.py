"""Vectorized population: P PPO members as the leading dimension of one run, in one process, on one device.

Every member is an ordinary PPO agent (the learning rule of :mod:`phalanx.algos.ppo`), but the P of
them share every kernel launch:

- networks: the policies of all members are one :class:`~phalanx.nets.EnsembleMLP` (weights
  ``(P, in, out)``, one batched matmul per layer), and so are the value networks;
- environment: one VecEnv of ``P * num_envs`` sub-envs; member i owns rows
  ``[i * num_envs, (i + 1) * num_envs)``, each block reset by its own generator
  (``reset(seed=[s0, s1, ...])``) and, with ``normalize_obs`` / ``normalize_reward``, normalised with its
  own running statistics;
- hyperparameters: the ones that may differ per member (:attr:`VectorizedPPO.member_hyperparameters`)
  are ``(P,)`` tensors that broadcast into the losses, GAE, gradient clipping and the optimiser;
- optimiser: :class:`VectorizedAdam`, torch's Adam rule over the members' flattened ``(P, D)``
  parameters with a learning rate, bias corrections and step count per member.

Members stay independent: nothing mixes across the member dimension, and each member draws its action
noise and minibatch shuffles from its own ``torch.Generator``, which starts where the global RNG of a
single run with the member's seed stands after that run built its networks. On CPU, member i's
parameters after training equal (within float rounding: batched matmul against ``nn.Linear``) those of
``phalanx.train`` with ``seed = seeds[i]`` and member i's hyperparameters; tests check it.

Cost: every op is batched over the members except the random draws, one small call per member (the
action noise and the env's reset draws each env step, the shuffles each update), the price of giving each
member its own stream; ``benchmarks/population_vectorized.py`` measures P members against one.

Selection (tournament, generational) lives outside: it reads :meth:`VectorizedPPO.evaluate`, copies
members with :meth:`VectorizedPPO.copy_member` and mutates with
:meth:`VectorizedPPO.set_hyperparameters`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import nn

from phalanx.algos.ppo import PPO, PPOConfig
from phalanx.buffers import RolloutBuffer, compute_gae
from phalanx.config import TrainConfig
from phalanx.envs.core import Tensor, VecEnv, as_device, block_seeds
from phalanx.envs.registry import make_env
from phalanx.envs.wrappers import (
    MemberNormalizeObservation,
    NanGuard,
    RescaleAction,
    RunningMeanStd,
    VecEnvWrapper,
    find_wrapper,
)
from phalanx.errors import CheckpointError, ConfigError
from phalanx.nets import (
    EnsembleLinear,
    MemberActor,
    MemberCategoricalPolicy,
    MemberGaussianPolicy,
    MemberValueNet,
)
from phalanx.train.environments import EVAL_SEED_OFFSET, space_spec
from phalanx.train.evaluator import Evaluator

MEMBER_HYPERPARAMETERS: tuple[str, ...] = (
    "learning_rate",
    "entropy_coef",
    "clip_range",
    "clip_value",
    "gamma",
    "gae_lambda",
    "value_coef",
    "max_grad_norm",
)
"""PPOConfig fields that may differ per member; the others shape the networks, the rollout or the update."""
OPTIONAL_HYPERPARAMETERS = ("clip_value", "max_grad_norm")
"""Per-member hyperparameters that may be None (no clipping); stored as +inf in the tensors."""
_GRAD_LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"
"""torch's one-time hint when a .grad is not laid out like a dense parameter (flatten_parameters' views)."""


def flatten_parameters(parameters: Sequence[nn.Parameter]) -> tuple[Tensor, Tensor]:
    """Put P-member parameters (each ``(P, ...)``) into one ``(P, D)`` tensor, their gradients into another.

    Each parameter's data becomes a view of a range of columns of ``flat``, and its ``.grad`` a view of
    the same columns of ``flat_grad`` (autograd accumulates into an existing ``.grad`` in place). The
    optimiser, the per-member gradient clipping and :meth:`VectorizedPPO.copy_member` then act on every
    member's whole parameter vector in a few ops, however many tensors the networks have. Zero
    ``flat_grad`` (never set the grads to None) before each backward pass, and do not move the modules
    afterwards (``.to()`` would give the parameters new storage).
    """
    first = parameters[0]
    num_members = first.shape[0]
    sizes = [parameter[0].numel() for parameter in parameters]
    flat = torch.empty(num_members, sum(sizes), device=first.device, dtype=first.dtype)  # (P, D)
    flat_grad = torch.zeros_like(flat)  # (P, D)
    start = 0
    for parameter, size in zip(parameters, sizes, strict=True):
        columns = slice(start, start + size)
        flat[:, columns].copy_(parameter.detach().reshape(num_members, size))
        parameter.data = flat[:, columns].view(parameter.shape)
        parameter.grad = flat_grad[:, columns].view(parameter.shape)
        start += size
    return flat, flat_grad


class VectorizedAdam:
    """Adam over the ``(P, D)`` flat parameters of P members, with its own learning rate per member.

    The update rule of ``torch.optim.Adam`` (no weight decay, no amsgrad) as PPO uses it (eps 1e-5),
    with a step count, bias corrections and learning rate per member: a fixed number of whole-tensor
    ops per step, whatever P. The scalars (bias corrections, step size) are computed in float64 as
    torch does in Python floats, then used in the parameters' dtype.
    """

    def __init__(
        self,
        parameters: Tensor,
        gradients: Tensor,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-5,
    ) -> None:
        self.parameters = parameters  # (P, D)
        self.gradients = gradients  # (P, D)
        self.betas = betas
        self.eps = eps
        self.exp_avg = torch.zeros_like(parameters)  # (P, D)
        self.exp_avg_sq = torch.zeros_like(parameters)  # (P, D)
        self.steps = torch.zeros(parameters.shape[0], dtype=torch.float64, device=parameters.device)  # (P,)

    @torch.no_grad()
    def step(self, learning_rate: Tensor) -> None:
        """One Adam step of every member on ``gradients``; ``learning_rate`` is ``(P,)`` float64."""
        beta1, beta2 = self.betas
        dtype = self.parameters.dtype
        self.steps += 1
        self.exp_avg.lerp_(self.gradients, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.gradients, self.gradients, value=1 - beta2)
        bias_correction1 = 1 - beta1**self.steps  # (P,)
        bias_correction2_sqrt = (1 - beta2**self.steps).sqrt()  # (P,)
        step_size = (learning_rate / bias_correction1).to(dtype).unsqueeze(1)  # (P, 1)
        denom = self.exp_avg_sq.sqrt().div_(bias_correction2_sqrt.to(dtype).unsqueeze(1)).add_(self.eps)
        # param + (-step_size * exp_avg) / denom: torch's addcdiv_(exp_avg, denom, value=-step_size)
        self.parameters.addcdiv_(self.exp_avg * -step_size, denom)

    def state_dict(self) -> dict[str, Tensor]:
        return {
            "exp_avg": self.exp_avg.clone(),
            "exp_avg_sq": self.exp_avg_sq.clone(),
            "steps": self.steps.clone(),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name in ("exp_avg", "exp_avg_sq", "steps"):
            getattr(self, name).copy_(state[name])


# -- per-member scaling of the rewards --------------------------------------------------------------
class MemberScaleReward(VecEnvWrapper):
    """ScaleReward with a discount and return statistics of their own for each member's block of rows.

    ``gamma`` is the population's ``(P,)`` float64 discount tensor, read at every step (a member's new
    gamma applies from the next step, as it would after a single run reloaded its config).
    """

    def __init__(
        self, env: VecEnv, num_members: int, gamma: Tensor, clip: float = 10.0, epsilon: float = 1e-8
    ) -> None:
        super().__init__(env)
        self.num_members = num_members
        self.gamma = gamma  # (P,) float64, shared with the population
        self.clip = clip
        self.epsilon = epsilon
        self.statistics = RunningMeanStd((num_members,), self.device)
        self.returns = torch.zeros(self.num_envs, dtype=self.statistics.dtype, device=self.device)  # (P * N,)

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        self.returns.zero_()
        return self.env.reset(seed=seed, options=options)

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        by_member = (self.num_members, -1)
        self.returns = (self.returns.view(by_member) * self.gamma.unsqueeze(1)).view(-1) + reward
        self.statistics.update(self.returns.view(by_member).T)  # (N, P)
        scale = torch.sqrt(self.statistics.var + self.epsilon).to(reward.dtype)  # (P,)
        scaled = (reward.view(by_member) / scale.unsqueeze(1)).view(-1).clamp(-self.clip, self.clip)
        self.returns.masked_fill_(terminated | truncated, 0.0)
        return obs, scaled, terminated, truncated, info

    def _own_state_dict(self) -> dict[str, Any]:
        return {"return_statistics": self.statistics.state_dict(), "returns": self.returns.clone()}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        self.statistics.load_state_dict(state["return_statistics"])
        self.returns.copy_(state["returns"])


# -- the population ------------------------------------------------------------------------------------
class VectorizedPPO:
    """P PPO members trained as one batched run; see the module docstring.

    ``config`` is an ordinary PPO TrainConfig (``phalanx.make_config("ppo", env, ...)``): env,
    ``num_envs`` (per member), device, network sizes, horizon, epochs, minibatch size, normalisation are
    shared by every member; ``total_steps`` is the horizon of ``anneal_lr`` only. ``seeds[i]`` is member
    i's seed and ``hyperparameters[i]`` its values of any of :attr:`member_hyperparameters`.
    """

    member_hyperparameters: ClassVar[tuple[str, ...]] = MEMBER_HYPERPARAMETERS

    def __init__(
        self,
        config: TrainConfig,
        seeds: Sequence[int],
        hyperparameters: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        config.validate()
        self.config = config = dataclasses.replace(config)  # the caller's config stays as it was
        _check_population_config(config)
        self.seeds = [int(seed) for seed in seeds]
        self.num_members = len(self.seeds)
        if self.num_members == 0:
            raise ConfigError("VectorizedPPO needs at least one member: pass a non-empty list of seeds.")
        if hyperparameters is None:
            hyperparameters = [{} for _ in self.seeds]
        if len(hyperparameters) != self.num_members:
            raise ConfigError(
                f"VectorizedPPO: {len(hyperparameters)} hyperparameter dicts for {self.num_members} seeds; "
                "pass one dict (possibly empty) per member, in the order of the seeds."
            )
        self.device = as_device(config.device)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        hp: PPOConfig = config.hyperparameters
        self.num_envs = config.num_envs
        self.horizon = hp.horizon
        self.rollout_size = hp.horizon * config.num_envs  # env steps per member per rollout

        # Per-member hyperparameters: (P,) float64 tensors, None stored as +inf.
        values = [
            self._validated_values(member, overrides) for member, overrides in enumerate(hyperparameters)
        ]
        self.hyperparameter_tensors: dict[str, Tensor] = {
            name: torch.tensor(
                [_encode(member_values[name]) for member_values in values],
                dtype=torch.float64,
                device=self.device,
            )
            for name in MEMBER_HYPERPARAMETERS
        }
        self._refresh_flags()

        # One env of P * num_envs sub-envs, wrapped as build_env wraps a training env, with per-member
        # normalisation; each member's block seeded as the single run with its seed (rank 0).
        self.env = self._build_env(self.num_members * self.num_envs, training=True)
        raw_env = self.env.unwrapped
        PPO.check_spaces(raw_env.single_observation_space, raw_env.single_action_space)
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space  # [-1, 1] for a Box (RescaleAction)
        self.spaces = space_spec(self.observation_space, raw_env.single_action_space)
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)

        # Member i's networks are those a single run seeded seeds[i] builds; its generator continues from
        # where that run's global RNG stands after building them.
        members = [self._initial_member(member) for member in range(self.num_members)]
        algorithms = [algorithm for algorithm, _ in members]
        self.generators: list[torch.Generator] = [generator for _, generator in members]
        if self.discrete:
            self.policy: MemberCategoricalPolicy | MemberGaussianPolicy = MemberCategoricalPolicy(
                [algorithm.policy for algorithm in algorithms]
            )
        else:
            self.policy = MemberGaussianPolicy([algorithm.policy for algorithm in algorithms])
        self.value = MemberValueNet([algorithm.value for algorithm in algorithms])
        self.policy.to(self.device)
        self.value.to(self.device)
        member_parameters = [*self.policy.parameters(), *self.value.parameters()]
        self._layout = _single_layout(member_parameters, algorithms[0].parameters, self._linear_weights())
        self.parameters, self.gradients = flatten_parameters(member_parameters)  # (P, D) each
        self.optimizer = VectorizedAdam(self.parameters, self.gradients, eps=1e-5)

        action_shape = () if self.discrete else self.action_space.shape
        action_dtype = torch.int64 if self.discrete else torch.float32
        self.buffer = RolloutBuffer(
            hp.horizon,
            self.num_members * self.num_envs,
            self.observation_space.shape,
            action_shape,
            action_dtype,
            self.device,
        )
        self.steps = 0
        self.updates = 0
        self.lr_factor = 1.0  # anneal_lr: the factor of the last update
        self.wall_time = 0.0
        self.best_eval_return = [-math.inf] * self.num_members
        self._episodes = torch.zeros(3, self.num_members, dtype=torch.float64, device=self.device)
        self._eval_envs: dict[int, VecEnv] = {}
        self.obs, _ = self.env.reset(seed=self._env_seeds(0, self.num_envs))  # (P * N, obs_dim)

    # -- construction --------------------------------------------------------------------------------
    def member_config(self, member: int) -> TrainConfig:
        """Member ``member`` as an ordinary single-run config: its seed and hyperparameters."""
        self._check_member(member)
        hyperparameters = dataclasses.replace(self.config.hyperparameters, **self.hyperparameters(member))
        return dataclasses.replace(self.config, seed=self.seeds[member], hyperparameters=hyperparameters)

    def _validated_values(self, member: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """The config's per-member values with ``overrides``, checked as PPOConfig.validate checks them."""
        _check_names(overrides)
        base = {name: getattr(self.config.hyperparameters, name) for name in MEMBER_HYPERPARAMETERS}
        values = {**base, **overrides}
        for name, value in overrides.items():
            allowed = "a number, or None for no clipping" if name in OPTIONAL_HYPERPARAMETERS else "a number"
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (is_number or (value is None and name in OPTIONAL_HYPERPARAMETERS)):
                raise ConfigError(f"member {member}: {name} = {value!r} is invalid: expected {allowed}.")
        candidate = dataclasses.replace(self.config.hyperparameters, **values)
        try:
            candidate.validate(self.config)
        except ConfigError as error:
            raise ConfigError(f"member {member}: {error}") from None
        return values

    def _initial_member(self, member: int) -> tuple[PPO, torch.Generator]:
        """The PPO a single run seeded ``seeds[member]`` builds (on CPU, as Trainer's nets are initialised
        before they move), and a generator in the state that run's global RNG is in afterwards.

        The global RNG is left as it was (``fork_rng``)."""
        config = self.member_config(member)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            algorithm = PPO(
                config.hyperparameters, self.observation_space, self.action_space, torch.device("cpu")
            )
            generator = torch.Generator(device=self.device)
            if self.device.type == "cpu":
                generator.set_state(torch.get_rng_state())
            else:  # the single run samples from the device's generator, which its init never touched
                generator.manual_seed(config.seed)
        return algorithm, generator

    def _build_env(self, num_envs: int, training: bool) -> VecEnv:
        """``build_env``'s wrapper chain (NaN guard when training, actions in [-1, 1], normalisation) over
        ``num_envs`` rows, with the normalisation statistics per member."""
        config = self.config
        env = make_env(config.env, num_envs=num_envs, device=self.device)
        if training:  # on an accelerator, reads its record once per rollout rather than every step
            env = NanGuard(env, check_every=self.horizon)
        if isinstance(env.single_action_space, gym.spaces.Box):
            env = RescaleAction(env)
        if config.normalize_obs:
            statistics = None if training else self.obs_statistics
            env = MemberNormalizeObservation(env, self.num_members, statistics=statistics, update=training)
        if config.normalize_reward and training:
            env = MemberScaleReward(env, self.num_members, self.hyperparameter_tensors["gamma"])
        return env

    def _env_seeds(self, offset: int, rows_per_member: int) -> int | list[int]:
        """``reset(seed=...)`` giving each member's rows what a single env seeded ``seed + offset`` gets."""
        return block_seeds(self.env, [seed + offset for seed in self.seeds], rows_per_member)

    def _linear_weights(self) -> set[int]:
        """Ids of the EnsembleLinear weights ((P, in, out): the transpose of an nn.Linear weight)."""
        modules = [*self.policy.modules(), *self.value.modules()]
        return {id(module.weight) for module in modules if isinstance(module, EnsembleLinear)}

    @property
    def obs_statistics(self) -> RunningMeanStd | None:
        """The members' observation statistics, ``(P, *obs_shape)``, or None without normalize_obs."""
        normalizer = find_wrapper(self.env, MemberNormalizeObservation)
        return normalizer.statistics if normalizer is not None else None

    @property
    def reward_statistics(self) -> RunningMeanStd | None:
        """The members' return statistics, ``(P,)``, or None without normalize_reward."""
        scaler = find_wrapper(self.env, MemberScaleReward)
        return scaler.statistics if scaler is not None else None

    # -- training ------------------------------------------------------------------------------------
    def train(self, steps: int) -> dict[str, Tensor]:
        """Train every member ``steps`` more env steps (rounded up to whole rollouts).

        Returns the metrics of the last update and the means of the episodes finished during this call,
        each ``(P,)`` on the device (``episode_return_mean`` is NaN for a member that finished none).
        """
        if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1):
            raise ConfigError(
                f"VectorizedPPO.train: steps = {steps!r} is invalid: expected an integer >= 1 (env steps per "
                f"member; they are rounded up to whole rollouts of horizon * num_envs = {self.rollout_size})."
            )
        start = time.perf_counter()
        self._episodes.zero_()
        metrics: dict[str, Tensor] = {}
        for _ in range(math.ceil(steps / self.rollout_size)):
            self._collect()
            self.steps += self.rollout_size
            metrics = self._update(progress=min(self.steps / self.config.total_steps, 1.0))
            self.updates += 1
        count, return_sum, length_sum = self._episodes
        finished = count.clamp(min=1)
        metrics["episodes"] = count
        metrics["episode_return_mean"] = torch.where(count > 0, return_sum / finished, math.nan)
        metrics["episode_length_mean"] = torch.where(count > 0, length_sum / finished, math.nan)
        self.wall_time += time.perf_counter() - start
        return metrics

    @torch.no_grad()
    def _collect(self) -> None:
        """Fill the rollout buffer with ``horizon`` steps of every member's sub-envs (rows as the env's)."""
        members, num_envs = self.num_members, self.num_envs
        for step in range(self.horizon):
            obs = self.obs  # (P * N, obs_dim)
            by_member = obs.view(members, num_envs, -1)  # (P, N, obs_dim)
            actions, log_probs = self.policy.sample_members(by_member, self.generators)  # (P, N[, A]), (P, N)
            values = self.value(by_member)  # (P, N)
            actions = actions.flatten(0, 1)  # (P * N[, A])
            next_obs, rewards, terminated, truncated, info = self.env.step(actions)
            dones = terminated | truncated
            self.buffer.add(
                step,
                obs,
                actions,
                log_probs.flatten(),
                values.flatten(),
                rewards,
                terminated,
                dones,
                info["final_obs"],
            )
            finished = dones.view(members, num_envs)
            episode_return = info["episode_return"].view(members, num_envs)
            episode_length = info["episode_length"].view(members, num_envs)
            self._episodes += torch.stack(  # (3, P): episodes, return sums, length sums
                (
                    finished.sum(dim=1, dtype=torch.float64),
                    torch.where(finished, episode_return, 0.0).sum(dim=1, dtype=torch.float64),
                    torch.where(finished, episode_length, 0).sum(dim=1, dtype=torch.float64),
                )
            )
            self.obs = next_obs

    def _by_member(self, x: Tensor) -> Tensor:
        """``(T, P * N, ...)`` rollout rows as ``(P, T * N, ...)``: member p's samples in the order of a
        single run's flattened ``(T * N, ...)`` rollout."""
        horizon, members = x.shape[0], self.num_members
        by_member = x.view(horizon, members, self.num_envs, *x.shape[2:]).transpose(0, 1)
        return by_member.reshape(members, horizon * self.num_envs, *x.shape[2:])

    def _update(self, progress: float) -> dict[str, Tensor]:
        """PPO.update for every member at once: GAE, then epochs of shuffled minibatches, each a clipped
        surrogate + value + entropy loss per member, gradient clipping per member, a VectorizedAdam step."""
        config: PPOConfig = self.config.hyperparameters
        hp = self.hyperparameter_tensors
        members, num_envs, rollout = self.num_members, self.num_envs, self.buffer
        if config.anneal_lr:
            self.lr_factor = max(1.0 - progress, 0.0)
        learning_rate = hp["learning_rate"] * self.lr_factor  # (P,) float64
        clip_range = hp["clip_range"].unsqueeze(1)  # (P, 1) float64
        ratio_low, ratio_high = (1 - clip_range).float(), (1 + clip_range).float()  # (P, 1)
        clip_range = clip_range.float()
        clip_value = hp["clip_value"].float().unsqueeze(1)  # (P, 1), inf: no value clipping
        clips_value = torch.isfinite(clip_value)  # (P, 1)
        value_coef, entropy_coef = hp["value_coef"].float(), hp["entropy_coef"].float()  # (P,)
        max_grad_norm = hp["max_grad_norm"].float()  # (P,), inf: no gradient clipping

        # 1-2. Advantages from the value of each step's true next observation, in the env's row layout.
        with torch.no_grad():
            next_values = self.value(self._by_member(rollout.next_obs))  # (P, T * N)
            next_values = (
                next_values.view(members, self.horizon, num_envs).transpose(0, 1).reshape_as(rollout.values)
            )
        rows_gamma = hp["gamma"].float().repeat_interleave(num_envs)  # (P * N,): broadcasts over (T, P * N)
        rows_lambda = hp["gae_lambda"].float().repeat_interleave(num_envs)
        advantages, returns = compute_gae(
            rollout.rewards,
            rollout.values,
            next_values,
            rollout.terminated,
            rollout.dones,
            rows_gamma,  # type: ignore[arg-type]  # a (P * N,) tensor broadcasts like a float
            rows_lambda,  # type: ignore[arg-type]
        )  # (T, P * N) each

        obs = self._by_member(rollout.obs)  # (P, T*N, obs_dim)
        actions = self._by_member(rollout.actions).to(obs.dtype)  # (P, T*N) or (P, T*N, A)
        if self.discrete:
            actions = actions.unsqueeze(-1)
        old_log_probs, advantages, old_values, returns = (
            self._by_member(x) for x in (rollout.log_probs, advantages, rollout.values, returns)
        )  # (P, T*N) each
        obs_dim, action_dim = obs.shape[-1], actions.shape[-1]
        # Every per-sample quantity in one tensor, so that a shuffle is one gather per epoch.
        samples = torch.cat(
            (obs, actions, torch.stack((old_log_probs, advantages, old_values, returns), dim=-1)), dim=-1
        )  # (P, T*N, obs_dim + A + 4)
        batch_size, minibatch_size = samples.shape[1], config.minibatch_size
        # Each member's shuffles, epoch after epoch, from its own generator: the draws of a single run.
        permutations = torch.stack(
            [
                torch.stack(
                    [
                        torch.randperm(batch_size, generator=g, device=self.device)
                        for _ in range(config.epochs)
                    ]
                )
                for g in self.generators
            ],
            dim=1,
        )  # (epochs, P, T*N)

        # 3. Minibatch epochs.
        metric_sums: Tensor | None = None  # (P, K) running sums of the step metrics
        metric_names: list[str] = []
        num_steps = 0
        for permutation in permutations:
            shuffled = samples.gather(1, permutation.unsqueeze(-1).expand(-1, -1, samples.shape[-1]))
            for start in range(0, batch_size, minibatch_size):
                minibatch = shuffled[:, start : start + minibatch_size]  # (P, M, F)
                mb_obs = minibatch[..., :obs_dim]
                mb_actions = minibatch[..., obs_dim : obs_dim + action_dim]
                if self.discrete:
                    mb_actions = mb_actions.squeeze(-1)
                mb_old_log_probs, mb_advantages, mb_old_values, mb_returns = minibatch[
                    ..., obs_dim + action_dim :
                ].unbind(-1)  # (P, M) each
                log_probs, entropy = self.policy.log_prob_entropy(mb_obs, mb_actions)  # (P, M) each
                log_ratio = log_probs - mb_old_log_probs
                ratio = log_ratio.exp()
                if config.normalize_advantages and minibatch.shape[1] > 1:
                    mb_advantages = (mb_advantages - mb_advantages.mean(dim=1, keepdim=True)) / (
                        mb_advantages.std(dim=1, keepdim=True) + 1e-8
                    )
                surrogate = torch.min(
                    ratio * mb_advantages, ratio.clamp(ratio_low, ratio_high) * mb_advantages
                )
                policy_loss = -surrogate.mean(dim=1)  # (P,)
                values = self.value(mb_obs)  # (P, M)
                value_errors = (values - mb_returns).pow(2)
                if self._clips_values:  # members with clip_value: the pessimum of clipped and unclipped
                    clipped = mb_old_values + (values - mb_old_values).clamp(-clip_value, clip_value)
                    clipped_errors = (clipped - mb_returns).pow(2)
                    value_errors = torch.where(
                        clips_value, torch.max(value_errors, clipped_errors), value_errors
                    )
                value_loss = 0.5 * value_errors.mean(dim=1)  # (P,)
                entropy_mean = entropy.mean(dim=1)  # (P,)
                loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean  # (P,)

                self.gradients.zero_()
                with warnings.catch_warnings():  # the grads are strided views of self.gradients, on purpose
                    warnings.filterwarnings("ignore", message=_GRAD_LAYOUT_WARNING)
                    loss.sum().backward()  # members share no parameter: each gets its own loss's gradient
                with torch.no_grad():
                    if self._clips_gradients:  # clip_grad_norm_ per member, over all its parameters
                        norms = torch.linalg.vector_norm(self.gradients, dim=1)  # (P,)
                        clip = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
                        self.gradients.mul_(clip.unsqueeze(1))
                    self.optimizer.step(learning_rate)

                    approx_kl = ((ratio - 1) - log_ratio).mean(dim=1)  # unbiased KL estimator (Schulman)
                    clip_fraction = ((ratio - 1).abs() > clip_range).float().mean(dim=1)
                    step_metrics = {
                        "policy_loss": policy_loss,
                        "value_loss": value_loss,
                        "entropy": entropy_mean,
                        "approx_kl": approx_kl,
                        "clip_fraction": clip_fraction,
                    }
                    step_values = torch.stack(list(step_metrics.values()), dim=1)  # (P, K)
                    metric_sums = step_values if metric_sums is None else metric_sums + step_values
                metric_names = list(step_metrics)
                num_steps += 1

        assert metric_sums is not None
        metrics = dict(zip(metric_names, (metric_sums / num_steps).unbind(dim=1), strict=True))
        with torch.no_grad():
            explained = 1 - (returns - old_values).var(dim=1) / (returns.var(dim=1) + 1e-8)
        metrics["explained_variance"] = explained
        metrics["learning_rate"] = learning_rate.float()
        metrics["gradient_steps"] = torch.full((members,), float(num_steps), device=self.device)
        return metrics

    # -- evaluation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, episodes: int) -> Tensor:
        """``(P,)`` mean return of each member's deterministic policy over ``episodes`` episodes.

        Member i runs on its own rows of an evaluation env seeded as a single run's evaluator
        (``seeds[i] + EVAL_SEED_OFFSET``), with its frozen observation statistics; the training envs,
        generators and RNG are not touched. Returns a float64 CPU tensor (one host sync per 16 steps).
        """
        if not (isinstance(episodes, int) and not isinstance(episodes, bool) and episodes >= 1):
            raise ConfigError(
                f"VectorizedPPO.evaluate: episodes = {episodes!r} is invalid: expected an integer >= 1."
            )
        env = self._eval_envs.get(episodes)
        if env is None:
            env = self._eval_envs[episodes] = self._build_env(self.num_members * episodes, training=False)
        seeds = self._env_seeds(EVAL_SEED_OFFSET, episodes)  # a list: each member's rows as its own run's
        actor = MemberActor(self.policy, self.num_members)
        evaluation = Evaluator(env, seed=seeds).evaluate(actor)  # type: ignore[arg-type]
        means = (
            torch.tensor(evaluation.returns, dtype=torch.float64).view(self.num_members, episodes).mean(dim=1)
        )
        self.best_eval_return = [
            max(best, mean) for best, mean in zip(self.best_eval_return, means.tolist(), strict=True)
        ]
        return means

    # -- hyperparameters -----------------------------------------------------------------------------
    def hyperparameters(self, member: int) -> dict[str, Any]:
        """Member ``member``'s current values of :attr:`member_hyperparameters` (floats; None: no clip)."""
        self._check_member(member)
        return {
            name: _decode(name, float(self.hyperparameter_tensors[name][member]))
            for name in MEMBER_HYPERPARAMETERS
        }

    def set_hyperparameters(self, member: int, values: dict[str, Any]) -> None:
        """Give member ``member`` new values of some of :attr:`member_hyperparameters`, validated as
        PPOConfig validates them; the others keep theirs. They apply from the next rollout."""
        self._check_member(member)
        merged = self._validated_values(member, {**self.hyperparameters(member), **values})
        for name, value in merged.items():
            self.hyperparameter_tensors[name][member] = _encode(value)
        self._refresh_flags()

    def _refresh_flags(self) -> None:
        """Which optional branches any member needs (host-side, so that the update does not sync)."""
        hp = self.hyperparameter_tensors
        self._clips_values = bool(torch.isfinite(hp["clip_value"]).any())
        self._clips_gradients = bool(torch.isfinite(hp["max_grad_norm"]).any())

    # -- members -------------------------------------------------------------------------------------
    @torch.no_grad()
    def copy_member(self, source: int, target: int) -> None:
        """Give member ``target`` the networks, optimiser state (Adam moments and step count) and
        normalisation statistics of member ``source``; ``target`` keeps its hyperparameters, its env
        rows and their state, and its generator."""
        self._check_member(source)
        self._check_member(target)
        if source == target:
            return
        tensors = [self.parameters, self.optimizer.exp_avg, self.optimizer.exp_avg_sq, self.optimizer.steps]
        for statistics in (self.obs_statistics, self.reward_statistics):
            if statistics is not None:  # mean and var per member (the count is the same for all)
                tensors += [statistics.mean, statistics.var]
        for tensor in tensors:
            tensor[target] = tensor[source]

    def member_agent_state(self, member: int) -> dict[str, Any]:
        """Member ``member`` as the agent state of an ordinary PPO run (the keys of
        ``Trainer.agent_state()``): written as ``checkpoints/step_<n>/state.pt`` of a run directory whose
        ``config.yaml`` is ``state["config"]``, it loads with ``phalanx.load_agent`` and ``phalanx eval``."""
        config = self.member_config(member)
        obs_statistics = None
        if self.obs_statistics is not None:
            statistics = self.obs_statistics.state_dict()
            obs_statistics = {
                "mean": statistics["mean"][member].clone(),
                "var": statistics["var"][member].clone(),
                "count": statistics["count"].clone(),
            }
        eval_every, checkpoint_every = config.eval_every, config.checkpoint_every
        return {
            "config": config.to_dict(),
            "spaces": self.spaces,
            "algorithm": self._single_algorithm(member, config).state_dict(),
            "obs_statistics": obs_statistics,
            "progress": {
                "steps": self.steps,
                "updates": self.updates,
                "wall_time_s": self.wall_time,
                "best_eval_return": self.best_eval_return[member],
                "time_to_stop_return_s": None,
                "next_eval": (self.steps // eval_every + 1) * eval_every if eval_every else math.inf,
                "next_checkpoint": (
                    (self.steps // checkpoint_every + 1) * checkpoint_every if checkpoint_every else math.inf
                ),
                "next_log": self.steps,
                "updates_owed": 0.0,
            },
        }

    def _single_algorithm(self, member: int, config: TrainConfig) -> PPO:
        """An ordinary PPO with member ``member``'s weights and Adam state (step, moments, learning rate)."""
        with torch.random.fork_rng(devices=[]):  # its throwaway initialisation must not move the RNG
            algorithm = PPO(config.hyperparameters, self.observation_space, self.action_space, self.device)
        with torch.no_grad():
            for parameter, tensor in zip(
                algorithm.parameters, self._single_tensors(self.parameters[member]), strict=True
            ):
                parameter.copy_(tensor)
        state = algorithm.optimizer.state_dict()
        state["param_groups"][0]["lr"] = config.hyperparameters.learning_rate * self.lr_factor
        steps = float(self.optimizer.steps[member])
        if steps > 0:  # the single PPO's Adam steps one flat buffer of its parameters, in their order
            state["state"] = {
                0: {
                    "step": torch.tensor(steps),
                    "exp_avg": self._flat_single(self.optimizer.exp_avg[member]),
                    "exp_avg_sq": self._flat_single(self.optimizer.exp_avg_sq[member]),
                }
            }
        algorithm.optimizer.load_state_dict(state)
        return algorithm

    def _flat_single(self, row: Tensor) -> Tensor:
        """A member's ``(D,)`` row laid out as a single PPO's flat parameter buffer."""
        return torch.cat([tensor.reshape(-1) for tensor in self._single_tensors(row)])

    def _single_tensors(self, row: Tensor) -> list[Tensor]:
        """A member's ``(D,)`` row of the flat parameters (or of an Adam moment) as the tensors of a single
        PPO's ``parameters``, in their order and layout (nn.Linear weights are ``(out, in)``)."""
        tensors = []
        for start, end, member_shape, single_shape, transpose in self._layout:
            tensor = row[start:end].view(member_shape)
            tensors.append((tensor.T if transpose else tensor).reshape(single_shape))
        return tensors

    def _check_member(self, member: int) -> None:
        if not (isinstance(member, int) and not isinstance(member, bool) and 0 <= member < self.num_members):
            raise ConfigError(
                f"member {member!r} is not a member of this population: expected an integer in "
                f"[0, {self.num_members - 1}]."
            )

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything to resume exactly: weights, optimiser, hyperparameter tensors, env state, the last
        observations, every member's generator, progress. Tensors and primitives only."""
        return {
            "num_members": self.num_members,
            "seeds": list(self.seeds),
            "config": self.config.to_dict(),
            "hyperparameters": {name: tensor.clone() for name, tensor in self.hyperparameter_tensors.items()},
            "parameters": self.parameters.clone(),
            "optimizer": self.optimizer.state_dict(),
            "env": self.env.state_dict(),
            "obs": self.obs.clone(),
            "generators": [generator.get_state() for generator in self.generators],
            "progress": {
                "steps": self.steps,
                "updates": self.updates,
                "lr_factor": self.lr_factor,
                "wall_time_s": self.wall_time,
                "best_eval_return": list(self.best_eval_return),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, into a population built with the same shared settings."""
        saved = TrainConfig.from_dict(state["config"], where="the VectorizedPPO state")
        differences = [
            f"{name}: the state has {a!r}, this population {b!r}"
            for name, a, b in zip(
                ("num_members", *_SHARED),
                (state["num_members"], *_shared(saved)),
                (self.num_members, *_shared(self.config)),
                strict=True,
            )
            if a != b
        ]
        if differences:
            raise CheckpointError(
                "cannot load this VectorizedPPO state: " + "; ".join(differences) + ". Build the population "
                "with the config and number of seeds the state was saved with."
            )
        with torch.no_grad():
            for name, tensor in self.hyperparameter_tensors.items():
                tensor.copy_(state["hyperparameters"][name])
            self.parameters.copy_(state["parameters"])
        self._refresh_flags()
        self.optimizer.load_state_dict(state["optimizer"])
        self.env.load_state_dict(state["env"])
        self.obs = state["obs"].to(self.device).clone()
        self.seeds = list(state["seeds"])
        for generator, generator_state in zip(self.generators, state["generators"], strict=True):
            generator.set_state(generator_state.cpu())  # a CPU byte tensor, even for a CUDA generator
        progress = state["progress"]
        self.steps = progress["steps"]
        self.updates = progress["updates"]
        self.lr_factor = progress["lr_factor"]
        self.wall_time = progress["wall_time_s"]
        self.best_eval_return = list(progress["best_eval_return"])

    def close(self) -> None:
        """Close the training and evaluation envs."""
        for env in (self.env, *self._eval_envs.values()):
            env.close()
        self._eval_envs.clear()


# -- helpers -------------------------------------------------------------------------------------------
_SHARED = (
    "env",
    "num_envs",
    "normalize_obs",
    "normalize_reward",
    "hidden_sizes",
    "activation",
    "horizon",
    "epochs",
    "minibatch_size",
    "normalize_advantages",
    "anneal_lr",
    "log_std_init",
)


def _shared(config: TrainConfig) -> tuple[Any, ...]:
    """The settings two populations must share for one's state to load into the other."""
    hp = config.hyperparameters
    return (
        config.env,
        config.num_envs,
        config.normalize_obs,
        config.normalize_reward,
        tuple(hp.hidden_sizes),
        hp.activation,
        hp.horizon,
        hp.epochs,
        hp.minibatch_size,
        hp.normalize_advantages,
        hp.anneal_lr,
        hp.log_std_init,
    )


def _check_population_config(config: TrainConfig) -> None:
    """What a vectorized population cannot do, with the reason and the fix."""
    if config.algo != "ppo":
        raise ConfigError(
            f"VectorizedPPO trains PPO members, but the config's algo is {config.algo!r}. Build it with "
            "phalanx.make_config('ppo', env, ...)."
        )
    if config.num_workers or config.overlap or config.num_learners != 1 or config.pipeline:
        raise ConfigError(
            "a vectorized population runs in one process on one device: num_workers must be 0, overlap and "
            f"pipeline off, num_learners 1 (got num_workers={config.num_workers}, overlap={config.overlap}, "
            f"pipeline={config.pipeline}, num_learners={config.num_learners}). Use a batched env (e.g. "
            "'CartPole-v1') with the defaults, or the process backend for one process per member."
        )
    if config.hyperparameters.target_kl is not None:
        raise ConfigError(
            f"target_kl = {config.hyperparameters.target_kl!r} is not supported by VectorizedPPO: its early "
            "stop would end each member's epochs at a different point, which the batched update (every "
            "member takes the same gradient steps) does not do. Set target_kl to None, or train the members "
            "as separate runs (the process backend)."
        )


def _check_names(values: dict[str, Any]) -> None:
    """A ConfigError for a name that is not a per-member hyperparameter, naming the per-member ones."""
    allowed = ", ".join(MEMBER_HYPERPARAMETERS)
    shared = {field.name for field in dataclasses.fields(PPOConfig)} | {
        field.name for field in dataclasses.fields(TrainConfig)
    }
    for name in values:
        if name in MEMBER_HYPERPARAMETERS:
            continue
        if name == "seed":
            raise ConfigError(
                "seed is not a hyperparameter of a member: each member's seed is its entry of the seeds "
                "argument of VectorizedPPO."
            )
        if name in shared:
            raise ConfigError(
                f"{name} is shared by all members of a vectorized population (it shapes the networks, the "
                f"env, the rollout or the update), so it cannot be set per member; set it in the config "
                f"instead. Per-member hyperparameters: {allowed}."
            )
        close = difflib.get_close_matches(str(name), MEMBER_HYPERPARAMETERS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown hyperparameter {name!r}.{hint} Per-member hyperparameters: {allowed}.")


def _encode(value: float | None) -> float:
    return math.inf if value is None else float(value)


def _decode(name: str, value: float) -> float | None:
    return None if name in OPTIONAL_HYPERPARAMETERS and math.isinf(value) else value


def _single_layout(
    member_parameters: Sequence[nn.Parameter],
    single_parameters: Sequence[nn.Parameter],
    linear_weights: set[int],
) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...], bool]]:
    """Where each single-PPO parameter sits in a member's flat row: ``(start, end, member_shape,
    single_shape, transpose)``, in the order of ``PPO.parameters``."""
    layout = []
    start = 0
    for member_parameter, single_parameter in zip(member_parameters, single_parameters, strict=True):
        size = member_parameter[0].numel()
        if size != single_parameter.numel():
            raise AssertionError(
                f"member parameter {tuple(member_parameter.shape)} vs {tuple(single_parameter.shape)}"
            )
        transpose = id(member_parameter) in linear_weights
        layout.append(
            (start, start + size, tuple(member_parameter.shape[1:]), tuple(single_parameter.shape), transpose)
        )
        start += size
    return layout
