"""VectorizedPQN: P PQN members as the leading dimension of one run (see
:mod:`phalanx.population.vectorized_base` for what every vectorized population shares).

A round is one rollout of ``horizon`` steps of every member's sub-envs, each member acting epsilon-greedily
with its own epsilon schedule and its own random draws, then one PQN update of every member on it by PQN's
own update (:func:`phalanx.algos.pqn.pqn_update`, called once for all P members with a
:class:`~phalanx.population.vectorized.MemberSampler`): the Q-networks are one
:class:`~phalanx.nets.EnsembleMLP` (a LayerNorm per member), the Q(lambda) targets take each member's
gamma and lambda, gradients are clipped per member and :class:`~phalanx.optim.VectorizedAdam` with
``rectified`` (torch's RAdam, PQN's optimiser) steps the members' flat ``(P, D)`` parameters with a learning
rate per member. On CPU, member i ends where ``phalanx.train`` with ``seed = seeds[i]`` and member i's
hyperparameters ends (within float rounding); tests check it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from phalanx.algos.base import Algorithm
from phalanx.algos.pqn import PQN, PQNConfig, QLambdaSettings, epsilon_greedy, epsilons_at, pqn_update, q_loss
from phalanx.buffers import RolloutBuffer, StepLayout, compute_gae
from phalanx.config import TrainConfig
from phalanx.envs.core import Tensor
from phalanx.errors import ConfigError
from phalanx.gradient_step import GradientStep
from phalanx.nets import EnsembleMLP
from phalanx.optim import (
    VectorizedAdam,
    flatten_parameters,
)
from phalanx.population.vectorized import FlatAdamPopulation, MemberSampler
from phalanx.population.vectorized_base import SingleLayout, ensemble_linear_weights

MEMBER_HYPERPARAMETERS: tuple[str, ...] = (
    "learning_rate",
    "gamma",
    "q_lambda",
    "max_grad_norm",
    "exploration_initial",
    "exploration_final",
    "exploration_fraction",
)
"""PQNConfig fields that may differ per member; the others shape the network, the rollout or the update."""
CNN_ENCODERS = ("nature", "impala", "minatar")
"""``encoder`` values that put a CNN in front of the Q-network, which the batched members do not have."""


class VectorizedPQN(FlatAdamPopulation):
    """P PQN members trained as one batched run; see the module docstring.

    ``config`` is an ordinary PQN TrainConfig (``phalanx.make_config("pqn", env, ...)``) of vector
    observations and Discrete actions; ``total_steps`` is the horizon of ``anneal_lr`` and of the epsilon
    schedule. ``exploration_final_lowest`` spreads each member's final epsilon over its own sub-envs, from
    the member's ``exploration_final`` down to this shared value, as its single run does.
    """

    algorithm_class = PQN
    member_hyperparameters = MEMBER_HYPERPARAMETERS
    optional_hyperparameters = ("max_grad_norm",)
    shared_hyperparameters = (
        "hidden_sizes",
        "activation",
        "layer_norm",
        "horizon",
        "epochs",
        "minibatch_size",
        "anneal_lr",
        "exploration_final_lowest",
        "reward_scale",
    )

    @classmethod
    def check_config(cls, config: TrainConfig) -> None:
        super().check_config(config)
        encoder = _pqn_settings(config).encoder
        if encoder in CNN_ENCODERS:
            raise ConfigError(
                f"encoder = {encoder!r} is not supported by VectorizedPQN: its members' Q-networks are MLPs "
                "batched into one ensemble network, which has no CNN encoder. Set encoder to 'auto' with "
                "vector observations, or train the members as separate runs (phalanx population run ... "
                "--backend process), each a single pqn run with its encoder."
            )

    def _build_members(self, algorithms: list[Algorithm]) -> None:
        hp = _pqn_settings(self.config)
        pqns = cast(list[PQN], algorithms)  # built from algorithm_class
        self.horizon = hp.horizon
        self.steps_per_round = hp.horizon * self.num_envs  # env steps per member
        single = pqns[0].q_network
        assert isinstance(single.encoder, nn.Identity), "vector observations (check_batchable)"
        self.q_network = EnsembleMLP.from_mlps([pqn.q_network.q for pqn in pqns]).to(self.device)
        member_parameters = list(self.q_network.parameters())
        transposed = ensemble_linear_weights(self.q_network)
        self._layout = SingleLayout(member_parameters, list(single.parameters()), transposed)
        self.parameters, self.gradients = flatten_parameters(member_parameters)  # (P, D) each
        radam = pqns[0].optimizer
        assert radam is not None, "a member's run, built to learn"
        group = radam.param_groups[0]  # the single run's RAdam settings (torch's defaults)
        self.optimizer = VectorizedAdam(
            self.parameters, self.gradients, betas=group["betas"], eps=group["eps"], rectified=True
        )
        self.gradient_step: GradientStep | None = None  # compiled (compile()); None: the eager step
        self.gae: Callable[..., tuple[Tensor, Tensor]] = compute_gae
        layout = StepLayout.of(self.observation_space, self.action_space)
        self.buffer = RolloutBuffer(hp.horizon, self.num_members * self.num_envs, layout, self.device)
        self.lr_factor = 1.0  # anneal_lr: the factor of the last update
        self.progress = 0.0  # the progress of the last update, where the epsilon schedules stand

    def _refresh_flags(self) -> None:
        """Whether any member clips gradients (host-side, so that the update does not sync)."""
        self._clips_gradients = bool(torch.isfinite(self.hyperparameter_tensors["max_grad_norm"]).any())

    def _evaluation_actor(self) -> GreedyMembers:
        return GreedyMembers(self.q_network, self.num_members)

    def _progress(self) -> dict[str, float]:
        return {"lr_factor": self.lr_factor, "exploration_progress": self.progress}

    def _load_progress(self, progress: dict[str, float]) -> None:
        self.lr_factor, self.progress = progress["lr_factor"], progress["exploration_progress"]

    def networks(self) -> list[nn.Module]:
        return [self.q_network]

    # -- epsilon-greedy acting --------------------------------------------------------------------------
    def decay(self) -> Tensor:
        """``(P, 1)``: where each member's epsilon schedule stands, ``min(progress / exploration_fraction,
        1)`` of the last update (0 before it), as the single run's ``exploration_decay``."""
        fraction = self.hyperparameter_tensors["exploration_fraction"]
        return (self.progress / fraction).clamp(max=1.0).float().unsqueeze(1)

    def member_epsilons(self) -> Tensor:
        """``(P, N)``: the epsilon of each member's sub-envs (:func:`phalanx.algos.pqn.epsilons_at`)."""
        hp = self.hyperparameter_tensors
        initial = hp["exploration_initial"].float().unsqueeze(1)  # (P, 1)
        final = hp["exploration_final"].float().unsqueeze(1)
        lowest = _pqn_settings(self.config).exploration_final_lowest
        return epsilons_at(initial, final, lowest, self.decay(), self.num_envs)

    # -- a round: collect a rollout, then one PQN update ------------------------------------------------
    @torch.no_grad()
    def _collect(self) -> None:
        """Fill the rollout buffer with ``horizon`` steps of every member's sub-envs (rows as the env's):
        epsilon-greedy actions, each member's noise from its generator (a single run's ``draw_noise``), and
        ``max_a Q`` as the values."""
        members, num_envs = self.num_members, self.num_envs
        epsilon = self.member_epsilons()  # (P, N): fixed during a rollout
        for step in range(self.horizon):
            obs = self.obs  # (P * N, obs_dim)
            noise = torch.stack(
                [torch.rand(num_envs, 2, generator=g, device=self.device) for g in self.generators]
            )  # (P, N, 2)
            q_values = self.q_network(obs.view(members, num_envs, -1))  # (P, N, A)
            actions, values = (tensor.flatten() for tensor in epsilon_greedy(q_values, noise, epsilon))
            next_obs, rewards, terminated, truncated, info = self.env.step(actions)
            dones = terminated | truncated
            self.buffer.add(
                step,
                obs,
                actions,
                torch.zeros_like(values),  # log-probabilities: PQN's update does not read them
                values,
                rewards,
                terminated,
                dones,
                info["final_obs"],
            )
            self._record_episodes(dones, info)
            self.obs = next_obs

    def _update(self, progress: float) -> dict[str, Tensor]:
        """:func:`~phalanx.algos.pqn.pqn_update` of every member at once: Q(lambda) targets with each
        member's gamma and lambda, epochs of minibatches of each member's own shuffles
        (:class:`~phalanx.population.vectorized.MemberSampler`), :func:`member_q_loss`, gradient clipping
        per member and a rectified VectorizedAdam step with a learning rate per member; then the epsilon
        schedules move. The metrics, as PQN.update's, ``(P,)``."""
        config = _pqn_settings(self.config)
        learning_rate, minimise, compiled_step = self._gradient_steps(progress, config.anneal_lr)
        hp = self.hyperparameter_tensors  # (P,) each
        rollout = self.buffer  # (T, P * N): the env's row layout
        num_envs = self.num_envs
        sampler = MemberSampler(
            self.num_members, num_envs, config.minibatch_size, self.generators, discrete=True
        )
        with torch.no_grad():  # max_a Q of each step's true next observation, in the env's row layout
            next_values = self._in_env_rows(self.q_network(sampler.flatten(rollout.next_obs)).amax(dim=-1))
        settings = QLambdaSettings(  # gamma and lambda: the members' values repeated for each of their rows
            gamma=hp["gamma"].float().repeat_interleave(num_envs),
            q_lambda=hp["q_lambda"].float().repeat_interleave(num_envs),
            epochs=config.epochs,
            gae=self.gae,
            reward_scale=config.reward_scale,
        )
        metrics = pqn_update(
            rollout,
            next_values,
            sampler,
            self.loss_function(),
            minimise,
            settings,
            compiled_step,
        )
        epsilon = self.member_epsilons().mean(dim=1)  # the mean each member's rollout acted with
        self.progress = progress
        return {**metrics, "epsilon": epsilon, "learning_rate": learning_rate.float()}

    def loss_function(self) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
        """:func:`member_q_loss` on the members' Q-networks."""
        assert self.observation_space.shape is not None, "a flat observation space (check_batchable)"
        return functools.partial(member_q_loss, self.q_network, self.observation_space.shape[0])

    # -- a member as a single PQN ------------------------------------------------------------------------
    @torch.no_grad()
    def _load_member(self, member: int, algorithm: Algorithm) -> None:
        """Member ``member``'s Q-network, RAdam state (step, moments, learning rate) and epsilon schedule
        into a single PQN."""
        # ignored below: a single run of algorithm_class, PQN
        pqn: PQN = algorithm  # type: ignore[assignment]
        assert pqn.optimizer is not None, "a member's run, built to learn"
        self._load_flat_member(
            member, list(pqn.q_network.parameters()), pqn.optimizer, pqn.config.learning_rate
        )
        pqn.exploration_decay.copy_(self.decay()[member, 0])


class GreedyMembers:
    """The members' greedy policies as the Evaluator calls them: ``act`` of ``(P * E, obs_dim)`` rows gives
    member i's actions (the largest Q-value) for its block of E rows, in one batched forward."""

    def __init__(self, q_network: EnsembleMLP, num_members: int) -> None:
        self.q_network = q_network
        self.num_members = num_members

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        q_values = self.q_network(obs.view(self.num_members, -1, *obs.shape[1:]))  # (P, E, A)
        return q_values.argmax(dim=-1).flatten()


def member_q_loss(q_network: nn.Module, obs_dim: int, minibatch: Tensor) -> tuple[Tensor, Tensor]:
    """Every member's :func:`~phalanx.algos.pqn.q_loss` ``(P,)`` on its ``(P, M, obs_dim + 2)`` minibatch of
    :class:`~phalanx.population.vectorized.MemberSampler`'s packed samples (observation, action, target),
    and the Q-values ``(P, M)``."""
    obs, actions, targets = minibatch.split([obs_dim, 1, 1], dim=-1)
    return q_loss(q_network, obs, actions.squeeze(-1), targets.squeeze(-1))


def _pqn_settings(config: TrainConfig) -> PQNConfig:
    """The members' shared hyperparameters: PQN's config class (TrainConfig.validate checks the type)."""
    return cast(PQNConfig, config.hyperparameters)
