"""Worker: steps a VecEnv with the algorithm's exploration policy and records what happened."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from phalanx.algos.base import ExplorationPolicy, OffPolicy, OnPolicy
from phalanx.algos.recurrent import is_recurrent
from phalanx.buffers import ReplayBuffer, RolloutBuffer
from phalanx.compiling import compiled
from phalanx.envs.core import ConcatVecEnv, VecEnv, concat_transitions, episode_ends
from phalanx.errors import CheckpointError

Tensor = torch.Tensor
Outputs = tuple[Tensor, Tensor, Tensor]
"""On-policy acting's ``(actions, log_probs, values)`` of N sub-envs."""
StepStatistics = list[Tensor]
"""A rollout step's ``(episode_return, episode_length, episode_ended)``, for the episode log."""
RolloutStep = Callable[[int, Tensor], tuple[Tensor, Tensor, Tensor, Tensor]]
"""One step of a rollout: ``(step, obs) -> (next_obs, episode_return, episode_length, episode_ended)``."""
ActAndStep = Callable[[Tensor, bool], tuple[Outputs, tuple[Any, ...]]]
"""Acting and the env step of a rollout step: ``(obs, last) -> (outputs, (next_obs, rewards, terminated,
truncated, info))``; ``last``: the rollout's last step."""


class Transition(NamedTuple):
    """One VecEnv step of N sub-envs, as the replay buffer takes it (the first six fields, in order)."""

    obs: torch.Tensor  # (N, *obs_shape)
    actions: torch.Tensor  # (N, *action_shape)
    rewards: torch.Tensor  # (N,)
    next_obs: torch.Tensor  # (N, *obs_shape): final_obs, the true next observation of every row
    terminated: torch.Tensor  # (N,)
    truncated: torch.Tensor  # (N,)
    episode_return: torch.Tensor  # (N,), valid where the episode ended
    episode_length: torch.Tensor  # (N,)
    episode_ended: torch.Tensor  # (N,) bool: the rows whose episode statistics are valid (episode_ends)


class EpisodeLog:
    """Sums of finished episodes' returns and lengths, kept on the device until they are read."""

    def __init__(self, device: torch.device) -> None:
        self.return_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.length_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.int64, device=device)

    def record(self, episode_return: torch.Tensor, episode_length: torch.Tensor, done: torch.Tensor) -> None:
        self.return_sum += torch.where(done, episode_return, 0.0).sum(dtype=torch.float64)
        self.length_sum += torch.where(done, episode_length, 0).sum(dtype=torch.float64)
        self.count += done.sum()

    def read(self) -> dict[str, float]:
        """Means of the episodes finished since the last read (one host sync), then clear."""
        count = int(self.count)
        if count == 0:
            return {"episodes": 0}
        means = {
            "episodes": count,
            "episode_return_mean": float(self.return_sum) / count,
            "episode_length_mean": float(self.length_sum) / count,
        }
        self.return_sum.zero_()
        self.length_sum.zero_()
        self.count.zero_()
        return means


class HalvesInTurn:
    """Double buffering's acting and env step (an :data:`ActAndStep`): the policy computes the actions of
    one half of the sub-envs while the other half steps.

    Per step t: the second half's actions are computed while the first half steps, and the first half's
    actions for t + 1 while the second half steps (the first half's actions for step 0 are sent when this
    is made, before the rollout). The last step of the rollout sends no actions ahead: the next rollout
    must act with the policy after the update.
    """

    def __init__(
        self, explore: Callable[[Tensor], Outputs], first: VecEnv, second: VecEnv, obs: Tensor
    ) -> None:
        self.explore, self.first, self.second = explore, first, second
        self.size = first.num_envs
        self.ahead = explore(obs[: self.size])  # the first half's outputs, its step in flight
        first.step_async(self.ahead[0])

    def __call__(self, obs: Tensor, last: bool) -> tuple[Outputs, tuple[Any, ...]]:
        first_outputs, second_outputs = self.ahead, self.explore(obs[self.size :])
        self.second.step_async(second_outputs[0])
        first_result = self.first.step_wait()
        if not last:
            self.ahead = self.explore(first_result[0])
            self.first.step_async(self.ahead[0])
        result = concat_transitions([first_result, self.second.step_wait()])
        outputs = tuple(torch.cat([first_outputs[i], second_outputs[i]]) for i in range(3))
        # ignored below: a tuple of three tensors: Outputs
        return outputs, result  # type: ignore[return-value]


class Worker:
    """Steps a VecEnv with the algorithm's policy; keeps the current observation between calls.

    On-policy (:class:`~phalanx.algos.base.OnPolicy`) it fills a rollout (:meth:`collect`); off-policy
    (:class:`~phalanx.algos.base.OffPolicy`) it adds one VecEnv step of N transitions to the replay
    buffer at a time (:meth:`step`).

    Double buffering: when the env is a :class:`~phalanx.envs.core.ConcatVecEnv` of two halves (worker
    processes split with ``overlap``), the policy computes the actions of one half while the other
    half steps. The data are the same kind as in the plain loop (every transition acted on by the
    current policy); only the order of the computations changes.
    """

    def __init__(self, env: VecEnv, algorithm: OnPolicy | OffPolicy) -> None:
        self.env = env
        # Any: each method calls the interface of the algorithm's kind (algorithm.on_policy), a run-time
        # choice; a union would need a narrowing at every call
        self.algorithm: Any = algorithm
        self.obs: torch.Tensor | None = None
        self._sent: torch.Tensor | None = None  # the actions of a step in flight
        self.episodes = EpisodeLog(env.device)
        self.compiled_act: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None = None
        self.compiled_rollout_step: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]] | None = None
        self._step_indices: list[Tensor] = []
        self.compiled_parts: list[str] | None = None  # what compile() compiled; None before it is called
        self.recurrent = is_recurrent(algorithm)
        self.memory: Tensor | None = None
        """A recurrent policy's memory of every sub-env ``(N, M, H)``, carried across rollouts."""
        self.episode_starts: Tensor | None = None
        """Recurrent: which sub-envs' current observation starts an episode ``(N,)`` (memory zeroed first)."""

    def reset(self, seed: int | None = None) -> None:
        self.obs, _ = self.env.reset(seed=seed)
        if self.recurrent:
            self.memory = self.algorithm.initial_memory(self.env.num_envs)
            self.episode_starts = torch.ones(self.env.num_envs, dtype=torch.bool, device=self.obs.device)

    @property
    def halves(self) -> list[VecEnv] | None:
        """The two halves stepped in turn for double buffering, or None for the plain loop."""
        if isinstance(self.env, ConcatVecEnv) and len(self.env.parts) == 2:
            return self.env.parts
        return None

    def collect(self, buffer: RolloutBuffer) -> RolloutBuffer:
        """Fill ``buffer`` with ``buffer.horizon`` steps of every sub-env.

        One loop for every policy and env; what differs is the step (:meth:`rollout_step_function`):
        eager, with a recurrent policy's memory and with double buffering's halves, or compiled.
        """
        if self.obs is None:
            raise RuntimeError("Worker.collect called before Worker.reset")
        step_once = self.rollout_step_function(buffer)
        ended: list[StepStatistics] = []  # recorded once, after the loop
        for step in range(buffer.horizon):
            self.obs, *statistics = step_once(step, self.obs)
            ended.append(statistics)
        if self.recurrent:  # the memory after the last step: where the update's recomputation ends
            # ignored below: a recurrent policy's buffer has final_memory
            buffer.final_memory.copy_(self.memory)  # type: ignore[attr-defined]
        if self.compiled_rollout_step is not None:
            self.env.check()  # the env's device-side checks (a NanGuard's), raised once per rollout
        self.episodes.record(*(torch.stack(column) for column in zip(*ended, strict=True)))
        return buffer

    def rollout_step_function(self, buffer: RolloutBuffer) -> RolloutStep:
        """What one step of :meth:`collect` runs: ``(step, obs) -> (next_obs, episode_return,
        episode_length, episode_ended)``, having written the step into ``buffer``.

        After :meth:`compile` with a traceable env, the compiled :meth:`rollout_step`; otherwise
        :meth:`eager_step`, which acts and steps the env through :meth:`act_then_step`, or with double
        buffering through :class:`HalvesInTurn`.
        """
        if self.compiled_rollout_step is not None:
            return self.compiled_step_function(buffer)
        act_and_step: ActAndStep = self.act_then_step
        if self.halves is not None and not self.recurrent:
            first, second = self.halves
            assert self.obs is not None, "collect() checked it"
            act_and_step = HalvesInTurn(self.explore, first, second, self.obs)
        return functools.partial(self.eager_step, buffer, act_and_step)

    def eager_step(
        self, buffer: RolloutBuffer, act_and_step: ActAndStep, step: int, obs: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One step of :meth:`collect`, eagerly: act on ``obs`` and step the env (``act_and_step``), then
        write the transition into row ``step`` of ``buffer``.

        A recurrent policy's buffer also stores, per step, the memory before it and the episode starts:
        what the update recomputes the memory from.
        """
        if self.recurrent:
            # ignored below: a recurrent policy's buffer has add_memory
            buffer.add_memory(step, self.memory, self.episode_starts)  # type: ignore[attr-defined]
        last = step + 1 == buffer.horizon
        (actions, log_probs, values), result = act_and_step(obs, last)
        next_obs, rewards, terminated, truncated, info = result
        dones = terminated | truncated
        buffer.add(step, obs, actions, log_probs, values, rewards, terminated, dones, info["final_obs"])
        if self.recurrent:
            self.episode_starts = dones  # same-step autoreset: next_obs starts anew
        return next_obs, info["episode_return"], info["episode_length"], episode_ends(info)

    def act_then_step(self, obs: Tensor, last: bool) -> tuple[Outputs, tuple[Any, ...]]:
        """Act on ``obs`` (:meth:`explore`; a recurrent policy with its memory of every sub-env, zeroed
        where an episode starts), then step the whole env: ``(outputs, env.step's result)``."""
        if self.recurrent:
            actions, log_probs, values, self.memory = self.algorithm.explore(
                obs, self.memory, self.episode_starts
            )
            outputs = (actions, log_probs, values)
        else:
            outputs = self.explore(obs)
        return outputs, self.env.step(outputs[0])

    # -- compiled rollouts ---------------------------------------------------------------------------
    def compile(self) -> list[str]:
        """Switch on-policy collection to its compiled path; the names of what was compiled (idempotent).

        With a traceable env (the built-in simulators and their wrappers), one env step of a rollout is
        one compiled call, :meth:`rollout_step`: acting (policy forward, sampling, value), the env step
        and the buffer write. With any other env (worker processes, Gymnasium, EnvPool) acting alone is
        compiled (:meth:`act`) and the env steps eagerly. Every random draw is taken eagerly just before
        the call, from the same generators in the same order as the eager path, so that compiled and
        eager rollouts differ only by float rounding. The horizon loop stays in Python, one call per
        step: a rollout unrolled into one graph takes minutes to compile. An off-policy algorithm acts
        through its exploration policy, which this does not compile: []; nor does a recurrent policy's
        acting with memory (it stays eager): [].
        """
        if self.compiled_parts is not None:
            return self.compiled_parts
        self.compiled_parts = []
        if self.algorithm.on_policy and not self.recurrent:
            if self.env.traceable and self.halves is None:
                self.compiled_rollout_step = compiled(self.rollout_step)
                self.compiled_parts.append("acting + env step + buffer write")
            else:
                self.compiled_act = compiled(self.act)
                self.compiled_parts.append("acting")
        return self.compiled_parts

    def explore(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """On-policy acting: ``(actions, log_probs, values)`` of observations ``(N, obs_dim)``; the
        algorithm's ``explore``, or after :meth:`compile` the compiled :meth:`act` with the noise drawn
        here."""
        if self.compiled_act is None:
            return self.algorithm.explore(obs)
        return self.compiled_act(obs, self.algorithm.policy.draw_noise(obs))

    @torch.no_grad()
    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The on-policy algorithm's ``explore`` with its random draw given: ``(actions, log_probs,
        values)`` of observations ``(N, obs_dim)``; ``noise`` is the policy's ``draw_noise(obs)`` (a shared
        encoder runs once for the actions and the values, as in ``explore``)."""
        return self.algorithm.explore(obs, noise)

    @torch.no_grad()
    def rollout_step(
        self,
        obs: Tensor,
        policy_noise: Tensor,
        env_noise: tuple[Tensor, ...],
        step: Tensor,
        fields: tuple[Tensor, ...],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One step of a rollout as a function of tensors: act on ``obs`` (:meth:`act`), step the env with
        its draws given (``step_with_noise``) and write the transition into row ``step`` (a ``(1,)``
        index) of the buffer's ``fields`` (in ``RolloutBuffer.FIELDS`` order).

        ``(next_obs, episode_return, episode_length, dones)``, the rest of what the loop needs.
        """
        actions, log_probs, values = self.act(obs, policy_noise)
        next_obs, rewards, terminated, truncated, info = self.env.step_with_noise(actions, env_noise)
        dones = terminated | truncated
        row = (obs, actions, log_probs, values, rewards, terminated, dones, info["final_obs"])
        for storage, value in zip(fields, row, strict=True):
            storage[step] = value.unsqueeze(0)  # a (1,) tensor index: one graph for every step
        return next_obs, info["episode_return"], info["episode_length"], dones

    def compiled_step_function(self, buffer: RolloutBuffer) -> RolloutStep:
        """One step of :meth:`collect` through the compiled :meth:`rollout_step`, its draws taken here
        (the policy's, then the env's); the env's device-side checks are raised by :meth:`collect`, once,
        at the end of the rollout."""
        rollout_step, indices = self.compiled_rollout_step, self.step_indices(buffer.horizon)
        policy, env = self.algorithm.policy, self.env
        fields = tuple(getattr(buffer, name) for name in buffer.FIELDS)

        def step_once(step: int, obs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            policy_noise = policy.draw_noise(obs)
            # ignored below: compiled_rollout_step is set where this is called
            return rollout_step(obs, policy_noise, env.step_noise(), indices[step], fields)  # type: ignore[misc]

        return step_once

    def step_indices(self, horizon: int) -> list[Tensor]:
        """The ``(1,)`` index tensors ``[0], [1], ..., [horizon - 1]`` of :meth:`rollout_step` (made once)."""
        if len(self._step_indices) != horizon:
            device = self.env.device
            self._step_indices = list(torch.arange(horizon, device=device).view(horizon, 1).unbind())
        return self._step_indices

    def step(self, replay: ReplayBuffer, steps: int, random: bool) -> None:
        """One step of every sub-env into ``replay``; uniformly random actions if ``random``."""
        self.store(replay, self.transition(steps, random))

    def transition(self, steps: int, random: bool, policy: ExplorationPolicy | None = None) -> Transition:
        """One step of every sub-env, acted on by ``policy`` (default: the algorithm's exploration
        policy); not yet stored.

        The pipeline calls this from its worker thread with its own copy of the policy, and the
        learner's thread stores the result.
        """
        if self.halves is not None and not random:  # the second half acts while the first steps
            if self.obs is None:
                raise RuntimeError("Worker.transition called before Worker.reset")
            explore = self.algorithm.explore if policy is None else policy
            first, second = self.halves
            first_actions = explore(self.obs[: first.num_envs], steps)
            first.step_async(first_actions)
            second_actions = explore(self.obs[first.num_envs :], steps)
            second.step_async(second_actions)
            self._sent = torch.cat([first_actions, second_actions])
            return self._received(concat_transitions([first.step_wait(), second.step_wait()]))
        self.send(steps, random, policy)
        return self.receive()

    def send(self, steps: int, random: bool, policy: ExplorationPolicy | None = None) -> None:
        """Act on the last observations and start the env's step (:meth:`receive` ends it): an env in
        worker processes steps while this process does something else."""
        if self.obs is None:
            raise RuntimeError("Worker.send (or step, transition) called before Worker.reset")
        if random:
            actions = self.algorithm.random_actions(self.env.num_envs)
        else:
            actions = (self.algorithm.explore if policy is None else policy)(self.obs, steps)
        self.env.step_async(actions)
        self._sent = actions

    @property
    def in_flight(self) -> bool:
        """Whether a step was sent and not yet received."""
        return self._sent is not None

    def receive(self) -> Transition:
        """The transition of the step :meth:`send` started."""
        return self._received(self.env.step_wait())

    def _received(self, result: tuple[Any, ...]) -> Transition:
        next_obs, rewards, terminated, truncated, info = result
        assert self.obs is not None and self._sent is not None, "send() set them"
        transition = Transition(
            self.obs,
            self._sent,
            rewards,
            info["final_obs"],
            terminated,
            truncated,
            info["episode_return"],
            info["episode_length"],
            episode_ends(info),
        )
        self.obs, self._sent = next_obs, None
        return transition

    def store(self, replay: ReplayBuffer, transition: Transition) -> None:
        """Add ``transition`` to ``replay`` and its finished episodes to the episode log."""
        replay.add(*transition[:6])
        self.episodes.record(transition.episode_return, transition.episode_length, transition.episode_ended)

    def state_dict(self) -> dict[str, Any]:
        """The last observations (and a recurrent policy's memory and episode starts)."""
        if self.recurrent:
            return {"obs": self.obs, "memory": self.memory, "episode_starts": self.episode_starts}
        return {"obs": self.obs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.obs = state["obs"]
        if self.recurrent:
            if "memory" not in state:
                raise CheckpointError(
                    "the checkpoint's worker state has no memory, but this run's policy is recurrent: the "
                    "checkpoint is of a feed-forward run. Resume it with its own config."
                )
            self.memory, self.episode_starts = state["memory"], state["episode_starts"]
