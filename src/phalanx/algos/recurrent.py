"""Recurrent PPO and A2C: an actor-critic with a memory (LSTM or GRU) carried from step to step.

A run asks for it with ``recurrent: lstm`` (or ``gru``) in the PPO or A2C hyperparameters
(``phalanx.registry.algorithm_class`` then builds :class:`RecurrentPPO` / :class:`RecurrentA2C`). The
network (:class:`RecurrentActorCritic`) is observations -> encoder (``phalanx.nets.feature_encoder``;
flat observations are their own features) -> one LSTM/GRU (``nn.LSTM`` / ``nn.GRU``) shared by actor and
critic -> the policy head and the value head of the feed-forward algorithms (``CategoricalPolicy`` /
``GaussianPolicy`` and ``ValueNet``, on the LSTM's output).

**Memory.** Each sub-env has one memory tensor, ``(M, H)``: ``M = 2`` rows (h and c) for an LSTM, 1 for a
GRU, ``H = recurrent_hidden_size``; a batch of them is ``(B, M, H)``. Before each step the memory of a
sub-env whose observation starts an episode is zeroed (:func:`reset_memory`; with the same-step autoreset
the observation after a done is the next episode's first), so an episode never sees the previous one.

**Collection** (``phalanx.train.worker.Worker``) stores, per step, the memory before the step (not yet
reset) and the episode-start flags (:class:`RecurrentRolloutBuffer`), and the memory after the last
step; the update recomputes from them exactly the memory the policy acted with.

**Update.** PPO's update (:func:`~phalanx.algos.ppo.ppo_update`: GAE, the epochs, the loss, the
optimiser, A2C's differences) unchanged; what differs is how a minibatch is formed
(:class:`SequenceSampler`) and how its log-probabilities and values are computed (:func:`sequence_loss`).
Each sub-env's rollout of ``horizon`` steps is cut into
sequences of ``sequence_length`` steps (default: the whole horizon); a minibatch is a random set of
``minibatch_size / sequence_length`` sequences (A2C: all of them). A sequence is run through the LSTM
from its stored first memory, the memory zeroed inside it where an episode starts, and the gradient
flows back through the whole sequence (truncated backpropagation through time: not into the memory it
starts from). A minibatch's sequences run as one call of the ``nn.LSTM`` (one op over all the steps,
forward and backward; :meth:`RecurrentActorCritic.unroll`), not step by step: each stretch between
episode starts is a row of its own. A sequence's first ``burn_in`` steps run without gradient and are
left out of the loss: they only warm the memory with the current weights. Bootstrapping values of
truncated episodes read the memory after the step (:meth:`RecurrentPPO.update`).

**Acting outside training**: :meth:`RecurrentPPO.act_with_memory` (a pure function of observations,
memory and episode starts); :func:`actor` wraps any algorithm as an :class:`Actor` that acts on a
stream of steps of B sub-envs and is told which episodes ended (the evaluator, videos and deployed
agents act through it). :class:`RecurrentActing` is the export form: memory in, memory out.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, cast

import gymnasium as gym
import torch
from torch import nn

from phalanx.algos.base import ActingModule, Algorithm
from phalanx.algos.ppo import (
    A2C,
    PPO,
    A2CConfig,
    ActorCriticBatch,
    ActorCriticConfig,
    ActorCriticHyperparameters,
    PolicyHead,
    actor_critic_loss,
    minibatch_size,
    ppo_update,
    update_settings,
)
from phalanx.buffers import RolloutBuffer, StepLayout
from phalanx.errors import CheckpointError, ConfigError
from phalanx.nets import (
    CategoricalPolicy,
    GaussianPolicy,
    MultiCategoricalPolicy,
    ValueNet,
    feature_encoder,
    multi_discrete_sizes,
)

Tensor = torch.Tensor


def reset_memory(memory: Tensor, episode_starts: Tensor) -> Tensor:
    """``memory`` ``(B, M, H)`` with the rows zeroed where ``episode_starts`` ``(B,)`` is true."""
    return memory * (~episode_starts).to(memory.dtype).view(-1, 1, 1)


class RecurrentActorCritic(nn.Module):
    """Observations -> encoder -> LSTM or GRU -> policy head and value head.

    :meth:`step` is one step of B sub-envs (acting); :meth:`unroll` a sequence of L steps of B sub-envs
    with resets where episodes start (the update), with the same weights, so that the update recomputes
    what acting computed (up to float rounding).
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: ActorCriticConfig):
        super().__init__()
        self.encoder, features = feature_encoder(observation_space, config.encoder)  # None: flat obs
        hidden = config.recurrent_hidden_size
        self.kind = config.recurrent
        self.rnn: nn.LSTM | nn.GRU = (
            nn.LSTM(features, hidden) if self.kind == "lstm" else nn.GRU(features, hidden)
        )
        for name, parameter in self.rnn.named_parameters():  # CleanRL's init of the LSTM
            if name.startswith("bias"):
                nn.init.zeros_(parameter)
            else:
                nn.init.orthogonal_(parameter, 1.0)
        self.register_load_state_dict_pre_hook(rename_cell_weights)
        self.memory_shape = (2 if self.kind == "lstm" else 1, hidden)
        """One sub-env's memory: h and c of an LSTM, h of a GRU, each ``recurrent_hidden_size``."""
        if isinstance(action_space, gym.spaces.Discrete):
            self.policy: PolicyHead = CategoricalPolicy(
                hidden, int(action_space.n), config.hidden_sizes, config.activation
            )
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self.policy = MultiCategoricalPolicy(
                hidden, multi_discrete_sizes(action_space), config.hidden_sizes, config.activation
            )
        else:
            assert action_space.shape is not None, "a Box (the other action spaces it acts in)"
            self.policy = GaussianPolicy(
                hidden,
                int(action_space.shape[0]),
                config.hidden_sizes,
                config.activation,
                config.log_std_init,
            )
        self.value = ValueNet(hidden, config.hidden_sizes, config.activation)

    def encode(self, obs: Tensor) -> Tensor:
        """Features ``(B, F)`` of observations ``(B, *obs_shape)``."""
        return obs if self.encoder is None else self.encoder(obs)

    def cell_step(self, features: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The output ``(B, H)`` and new memory ``(B, M, H)`` for features ``(B, F)``: one step of the
        LSTM/GRU, as ``nn.LSTMCell`` / ``nn.GRUCell`` compute it (their op, on ``rnn``'s weights: faster
        than ``rnn`` on a sequence of one step)."""
        rnn = self.rnn
        weights = cast(  # the LSTM's or GRU's parameters (nn.Module types them Tensor | Module)
            "tuple[Tensor, Tensor, Tensor, Tensor]",
            (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0),
        )
        if self.kind == "lstm":
            hidden, cell = torch.lstm_cell(features, (memory[:, 0], memory[:, 1]), *weights)
            return hidden, torch.stack((hidden, cell), dim=1)
        hidden = torch.gru_cell(features, memory[:, 0], *weights)
        return hidden, hidden.unsqueeze(1)

    def step(self, obs: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        """One step: the recurrent features ``(B, H)`` and the memory after it ``(B, M, H)``, from
        observations ``(B, *obs_shape)`` and the memory before it (already reset where episodes start)."""
        return self.cell_step(self.encode(obs), memory)

    def steps(self, obs: Tensor, memory: Tensor, episode_starts: Tensor) -> Tensor:
        """The memory after L steps of B sub-envs, step by step as acting computes it, from observations
        ``(L, B, *obs_shape)``, the memory before the first step ``(B, M, H)`` and the episode starts
        ``(L, B)`` (the memory is zeroed before each step where they are true)."""
        for step_obs, starts in zip(obs, episode_starts, strict=True):
            _, memory = self.step(step_obs, reset_memory(memory, starts))
        return memory

    def unroll(self, obs: Tensor, memory: Tensor, episode_starts: Tensor) -> Tensor:
        """The recurrent features ``(L, B, H)`` of L steps of B sub-envs, as :meth:`steps` computes them,
        by one call of ``rnn`` (one op over the sequence, for the forward and the backward pass).

        ``rnn`` cannot zero the memory of a row within a sequence, so each stretch of a sub-env's steps
        between episode starts (:func:`segments`) runs as a row of its own, from the sub-env's memory (its
        first stretch) or from zeros (a new episode). The rows are padded at their end to the longest: an
        RNN's output at a step depends only on the steps before it, so the padding changes nothing."""
        length, batch = episode_starts.shape
        features = self.encode(obs.flatten(0, 1))  # (L * B, F): the encoder batched over steps
        row, position, rows, longest = segments(episode_starts)
        slot = (position * rows + row).flatten()  # each step's place in the (longest, rows) padded steps
        inputs = features.new_zeros(longest * rows, features.shape[-1]).index_copy(0, slot, features)
        memory_rows, hidden_size = self.memory_shape
        initial = memory.new_zeros(
            memory_rows, rows, hidden_size
        )  # (M, rows, H): h (and c) as rnn takes them
        initial[:, row[0]] = reset_memory(memory, episode_starts[0]).transpose(0, 1)
        outputs, _ = self.rnn(
            inputs.view(longest, rows, -1), (initial[:1], initial[1:]) if self.kind == "lstm" else initial
        )
        return outputs.flatten(0, 1).index_select(0, slot).view(length, batch, -1)


class Segments(NamedTuple):
    """The stretches of L steps of B sub-envs between episode starts, each a row of its own: step t of
    sub-env b is step ``position[t, b]`` of row ``row[t, b]`` (both ``(L, B)``); ``rows`` rows, the longest
    of ``longest`` steps. Made by :func:`segments`."""

    row: Tensor
    position: Tensor
    rows: int
    longest: int


def segments(episode_starts: Tensor) -> Segments:
    """The :class:`Segments` of ``episode_starts`` ``(L, B)``: each runs from a sub-env's first step or an
    episode start to the step before its next episode start or its last step; numbered sub-env by sub-env,
    in time order. One host synchronisation (the two sizes)."""
    length = episode_starts.shape[0]
    first = episode_starts.clone()
    first[0] = True  # the first step of a row
    row = (first.t().flatten().cumsum(0) - 1).view_as(first.t()).t()
    time = torch.arange(length, device=first.device).unsqueeze(1).expand_as(first)
    position = time - torch.where(first, time, 0).cummax(0).values  # the steps since the row's first
    rows, longest = (torch.stack((row[-1, -1], position.max())) + 1).tolist()
    return Segments(row, position, rows, longest)


def rename_cell_weights(module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load checkpoints whose network ran an ``nn.LSTMCell`` / ``nn.GRUCell`` named ``cell``: its weights
    (``cell.weight_ih``, ...) are the same tensors as ``rnn``'s (``rnn.weight_ih_l0``, ...)."""
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        if f"{prefix}cell.{name}" in state:
            state[f"{prefix}rnn.{name}_l0"] = state.pop(f"{prefix}cell.{name}")


class RecurrentRolloutBuffer(RolloutBuffer):
    """A :class:`~phalanx.buffers.RolloutBuffer` with what a recurrent update needs besides:

    - ``memory`` ``(T, N, M, H)``: each step's memory before the step, as carried (not yet reset where
      the step's observation starts an episode);
    - ``episode_starts`` ``(T, N)`` bool: the step's observation is the first of an episode;
    - ``final_memory`` ``(N, M, H)``: the memory after the last step (for the last bootstrap values).
    """

    MEMORY_FIELDS = ("memory", "episode_starts", "final_memory")

    def __init__(self, horizon: int, num_envs: int, *args: Any, memory_shape: tuple[int, int], **kwargs: Any):
        super().__init__(horizon, num_envs, *args, **kwargs)
        self.memory_shape = tuple(memory_shape)
        self.memory = torch.zeros(horizon, num_envs, *self.memory_shape, device=self.device)
        self.episode_starts = torch.zeros(horizon, num_envs, dtype=torch.bool, device=self.device)
        self.final_memory = torch.zeros(num_envs, *self.memory_shape, device=self.device)

    def add_memory(self, step: int, memory: Tensor, episode_starts: Tensor) -> None:
        """Record the memory ``(N, M, H)`` before step ``step`` and its episode starts ``(N,)``."""
        self.memory[step].copy_(memory)
        self.episode_starts[step].copy_(episode_starts)

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(getattr(self, name).nbytes for name in self.MEMORY_FIELDS)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **{name: getattr(self, name).clone() for name in self.MEMORY_FIELDS}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.MEMORY_FIELDS:
            storage = getattr(self, name)
            if name not in state or state[name].shape != storage.shape:
                raise CheckpointError(
                    f"RecurrentRolloutBuffer state {name!r} is missing or has another shape than "
                    f"{tuple(storage.shape)}; the checkpoint was written with a different horizon, "
                    "num_envs or recurrent_hidden_size."
                )
        super().load_state_dict(state)
        for name in self.MEMORY_FIELDS:
            getattr(self, name).copy_(state[name])


class RecurrentPPO(PPO):
    """PPO with a recurrent policy: PPO's learning rule on minibatches of whole sequences."""

    def build_networks(
        self, observation_space: gym.Space, action_space: gym.Space, critic_space: gym.Space | None
    ) -> None:
        """One recurrent network with both heads (the recurrent update runs eagerly: see compile)."""
        if self.config.recurrent is None:
            raise ConfigError(
                f"{type(self).__name__} needs recurrent: lstm or gru in its hyperparameters; build the "
                "algorithm of a config with phalanx.registry.algorithm_class(algo, hyperparameters)."
            )
        if critic_space is not None:
            raise ConfigError(
                f"{type(self).__name__} got critic_space {critic_space}, but its value head reads the "
                "recurrent network's memory of the observations, not another input. Pass critic_space=None."
            )
        self.network = RecurrentActorCritic(observation_space, action_space, self.config).to(self.device)
        self.parameters = list(self.network.parameters())

    @property
    def memory_shape(self) -> tuple[int, int]:
        """One sub-env's memory ``(M, H)``: M = 2 (h, c) for an LSTM, 1 for a GRU."""
        return self.network.memory_shape

    def initial_memory(self, batch: int) -> Tensor:
        """The memory ``(batch, M, H)`` of sub-envs that start an episode: zeros."""
        return torch.zeros(batch, *self.memory_shape, device=self.device)

    def rollout_buffer(
        self, horizon: int, num_envs: int, layout: StepLayout, device: str | torch.device
    ) -> RecurrentRolloutBuffer:
        return RecurrentRolloutBuffer(horizon, num_envs, layout, device, memory_shape=self.memory_shape)

    # -- acting ----------------------------------------------------------------------------------
    @torch.no_grad()
    # ignored below: explore takes the memory and episode starts as well: a recurrent policy's
    def explore(  # type: ignore[override]
        self, obs: Tensor, memory: Tensor, episode_starts: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Collection: ``(actions, log_probs, values, memory after the step)`` of observations ``(N, ...)``,
        the memory before the step ``(N, M, H)`` and the episode starts ``(N,)``."""
        hidden, memory = self.network.step(obs, reset_memory(memory, episode_starts))
        actions, log_probs = self.network.policy.sample(hidden)
        return actions, log_probs, self.network.value(hidden), memory

    @torch.no_grad()
    def act_with_memory(
        self,
        obs: Tensor,
        memory: Tensor,
        episode_starts: Tensor | None = None,
        deterministic: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """``(actions, memory after the step)`` of observations ``(B, ...)`` and the memory before the step
        ``(B, M, H)`` (:meth:`initial_memory` for new episodes); ``episode_starts`` ``(B,)``: rows whose
        memory is zeroed first (None: none)."""
        if episode_starts is not None:
            memory = reset_memory(memory, episode_starts)
        hidden, memory = self.network.step(obs, memory)
        policy = self.network.policy
        actions = policy.deterministic_action(hidden) if deterministic else policy.sample(hidden)[0]
        return actions, memory

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        raise ConfigError(
            f"a recurrent {self.name} policy acts with its memory: call act_with_memory(obs, memory, "
            "episode_starts), or act through phalanx.algos.recurrent.actor(algorithm), which carries the "
            "memory of a stream of steps."
        )

    def acting_module(self, stochastic: bool = False) -> RecurrentActing:
        return RecurrentActing(self.network, stochastic)

    @classmethod
    def side_by_side(cls, agents: list[Algorithm]) -> RecurrentSideBySide:
        # ignored below: the agents are RecurrentPPOs, which RecurrentSideBySide reads
        return RecurrentSideBySide(agents)  # type: ignore[arg-type]

    # -- learning --------------------------------------------------------------------------------
    def compile(self) -> list[str]:
        """Nothing: the recurrent update runs eagerly. Its LSTM is one op over a minibatch's steps already,
        on rows whose number and length follow the minibatch's episode starts (read on the host): a
        compiled step would be a graph per size."""
        return []

    def update(self, rollout: RolloutBuffer, progress: float) -> dict[str, Tensor]:
        """:func:`~phalanx.algos.ppo.ppo_update` on the rollout's sequences (:class:`SequenceSampler`,
        :func:`sequence_loss`); the value of every step's true next observation with the memory after the
        step (the next step's stored memory, the final memory after the last step), all steps as one
        batch."""
        memory = cast(RecurrentRolloutBuffer, rollout)
        config = self.config
        assert self.optimizer is not None, "a learning algorithm has its optimiser"
        self.anneal_learning_rate(progress)
        horizon, num_envs = rollout.rewards.shape
        with torch.no_grad():
            after = torch.cat((memory.memory[1:], memory.final_memory.unsqueeze(0)))  # (T, N, M, H)
            hidden, _ = self.network.step(rollout.next_obs.flatten(0, 1), after.flatten(0, 1))
            next_values = self.network.value(hidden).view(horizon, num_envs)
        length = config.sequence_steps()
        samples = minibatch_size(config) or horizon * num_envs
        return ppo_update(
            rollout,
            next_values,
            SequenceSampler(length, samples // length, self.device),
            functools.partial(sequence_loss, self.network, config.burn_in),
            functools.partial(self.minimise, optimizer=self.optimizer, max_grad_norm=config.max_grad_norm),
            update_settings(config, gae=self.gae),
            torch.tensor(self.optimizer.param_groups[0]["lr"]),
            None,  # eager (see compile)
            self.group,
        )


class SequenceSampler:
    """A recurrent policy's minibatches (a :class:`~phalanx.algos.ppo.Sampler`): shuffled sets of
    ``per_minibatch`` sequences of ``length`` steps, each the inputs of :func:`sequence_loss`; the shuffle
    from the global generator."""

    def __init__(self, length: int, per_minibatch: int, device: torch.device | str) -> None:
        self.length = length
        self.per_minibatch = per_minibatch
        self.device = device

    def flatten(self, steps: Tensor) -> Tensor:
        return steps.flatten(0, 1)

    def data(self, rollout: RolloutBuffer, targets: Tensor) -> tuple[Tensor, ...]:
        """The rollout as sequences, once per update (a minibatch then gathers its sequences in one op
        each): chunk c of sub-env n's rollout (its steps ``[c * L, (c + 1) * L)``) is sequence ``c * N + n``
        (the ids of :meth:`minibatches`). ``targets``; observations, actions and episode starts
        ``(L, S, ...)``, the stored memory before each sequence's first step ``(S, M, H)`` and the index of
        each step in the flattened ``(T * N)`` rollout ``(L, S)`` (where its targets are)."""
        memory = cast(RecurrentRolloutBuffer, rollout)
        horizon, num_envs = rollout.rewards.shape
        length = self.length

        def sequences(steps: Tensor) -> Tensor:  # (T, N, ...) -> (L, S, ...)
            return steps.view(horizon // length, length, *steps.shape[1:]).transpose(0, 1).flatten(1, 2)

        sample_index = torch.arange(horizon * num_envs, device=self.device).view(horizon, num_envs)
        first_memory = sequences(memory.memory)[0]
        return (
            targets,
            sequences(rollout.obs),
            sequences(rollout.actions),
            sequences(memory.episode_starts),
            first_memory,
            sequences(sample_index),
        )

    def minibatches(self, data: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One epoch's minibatches of sequences: shuffled sequence ids (see :meth:`data`)."""
        targets, obs, *inputs = data
        permutation = torch.randperm(obs.shape[1], device=self.device)
        return [(targets, index, obs, *inputs) for index in permutation.split(self.per_minibatch)]


def sequence_loss(
    network: RecurrentActorCritic,
    burn_in: int,
    hyperparameters: ActorCriticHyperparameters,
    targets: Tensor,
    index: Tensor,
    obs: Tensor,
    actions: Tensor,
    episode_starts: Tensor,
    first_memory: Tensor,
    sample_index: Tensor,
) -> tuple[Tensor, tuple[dict[str, Tensor], Tensor, Tensor]]:
    """:func:`~phalanx.algos.ppo.actor_critic_loss` of the sequences ``index`` (of
    :meth:`SequenceSampler.data`): each run through the LSTM/GRU from its stored first memory, the first
    ``burn_in`` steps without gradient and out of the loss."""
    sequence_obs, starts = obs[:, index], episode_starts[:, index]  # (L, S, ...), (L, S)
    start_memory = first_memory[index]  # (S, M, H)
    if burn_in:
        with torch.no_grad():
            start_memory = network.steps(sequence_obs[:burn_in], start_memory, starts[:burn_in])
    hidden = network.unroll(sequence_obs[burn_in:], start_memory, starts[burn_in:])
    hidden = hidden.flatten(0, 1)  # ((L - burn_in) * S, H), time-major as the flat index below
    flat = sample_index[burn_in:, index].flatten()  # into the (T * N) targets
    old_log_probs, advantages, old_values, returns = targets.index_select(1, flat)
    batch = ActorCriticBatch(
        hidden, actions[burn_in:, index].flatten(0, 1), old_log_probs, advantages, old_values, returns, hidden
    )
    result = actor_critic_loss(network.policy, network.value, batch, hyperparameters)
    return result.loss, (result.metrics, result.ratio, result.log_ratio)


class RecurrentA2C(RecurrentPPO, A2C):
    """A2C with a recurrent policy: one full-batch pass over all sequences, -log pi(a|s) * A, RMSprop."""

    name = "a2c"
    config_class = A2CConfig
    config: A2CConfig


class RecurrentActing(ActingModule):
    """A recurrent policy's acting as a module of tensors alone (export): ``forward(obs, memory[, noise])``
    gives ``(actions, memory after the step)``; ``memory`` ``(B, M, H)`` is zeros at an episode's start and
    the previous call's output after it."""

    def __init__(self, network: RecurrentActorCritic, stochastic: bool = False) -> None:
        super().__init__(network.policy.action_noise if stochastic else None)
        self.network = network
        self.inputs = ("obs", "memory", *(("noise",) if stochastic else ()))
        self.memory_shape = network.memory_shape

    def forward(self, obs: Tensor, memory: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        hidden, memory = self.network.step(obs, memory)
        policy = self.network.policy
        actions = (
            policy.deterministic_action(hidden) if noise is None else policy.sample(hidden, noise=noise)[0]
        )
        return actions, memory


class RecurrentSideBySide:
    """k recurrent agents as one: agent i acts on its own block of ``len(obs) / k`` rows (and memory rows)."""

    def __init__(self, agents: list[RecurrentPPO]) -> None:
        self.agents = agents
        self.memory_shape = agents[0].memory_shape
        self.device = agents[0].device

    def initial_memory(self, batch: int) -> Tensor:
        return torch.zeros(batch, *self.memory_shape, device=self.device)

    def act_with_memory(
        self, obs: Tensor, memory: Tensor, episode_starts: Tensor | None = None, deterministic: bool = True
    ) -> tuple[Tensor, Tensor]:
        k = len(self.agents)
        starts = [None] * k if episode_starts is None else episode_starts.chunk(k)
        results = [
            agent.act_with_memory(rows, rows_memory, rows_starts, deterministic)
            for agent, rows, rows_memory, rows_starts in zip(
                self.agents, obs.chunk(k), memory.chunk(k), starts, strict=True
            )
        ]
        return torch.cat([actions for actions, _ in results]), torch.cat([memory for _, memory in results])


class Actor:
    """Acting on a stream of steps of B sub-envs: :meth:`act` on each step's observations, then
    :meth:`episodes_ended` with the step's dones. A feed-forward policy has nothing to carry: this is its
    ``act``; :class:`MemoryActor` carries a recurrent policy's memory. Made by :func:`actor`."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Actions of observations ``(B, ...)``."""
        return self.policy.act(obs, deterministic)

    def episodes_ended(self, dones: Tensor) -> None:
        """The episodes of the rows where ``dones`` ``(B,)`` is true ended: the next observations start new
        ones."""

    def reset(self) -> None:
        """Forget every episode: the next :meth:`act` starts all rows afresh."""


class MemoryActor(Actor):
    """A recurrent policy's :class:`Actor`: it carries the memory ``(B, M, H)`` from step to step, zeros
    at the first step and for the rows whose episode ended."""

    def __init__(self, policy: RecurrentPPO | RecurrentSideBySide) -> None:
        super().__init__(policy)
        self.memory: Tensor | None = None

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        if self.memory is None:
            self.memory = self.policy.initial_memory(obs.shape[0])
        elif self.memory.shape[0] != obs.shape[0]:
            raise ValueError(
                f"MemoryActor.act: {obs.shape[0]} rows of observations, but the memory is of "
                f"{self.memory.shape[0]} sub-envs (the rows of the first step). Call reset() to start a new "
                "stream of another batch size."
            )
        actions, self.memory = self.policy.act_with_memory(obs, self.memory, None, deterministic)
        return actions

    def episodes_ended(self, dones: Tensor) -> None:
        if self.memory is not None:
            self.memory = reset_memory(self.memory, dones.to(self.memory.device))

    def reset(self) -> None:
        self.memory = None


def actor(policy: Any) -> Actor:
    """The :class:`Actor` of an algorithm (or of k side by side): a :class:`MemoryActor` for a recurrent
    policy, else the policy's own ``act``."""
    if isinstance(policy, RecurrentPPO | RecurrentSideBySide):
        return MemoryActor(policy)
    return Actor(policy)


def is_recurrent(algorithm: Any) -> bool:
    """Whether ``algorithm`` acts with a memory."""
    return isinstance(algorithm, RecurrentPPO | RecurrentSideBySide)
