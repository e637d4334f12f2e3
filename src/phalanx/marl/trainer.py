"""Multi-agent training: the single-agent Trainer's loop, with a multi-agent env, worker and evaluator.

The loop itself (budget, evaluations, logging, checkpoints, resume, Ctrl+C, summary, hooks) is
:class:`phalanx.train.trainer.Trainer`'s; this module supplies the parts that see per-agent data:

- :class:`MultiAgentWorker` steps a :class:`~phalanx.marl.core.MultiAgentVecEnv` with the algorithm's
  exploration, into a :class:`~phalanx.marl.buffers.MultiAgentRollout` (on-policy) or one transition
  at a time into a :class:`~phalanx.marl.buffers.MultiAgentReplayBuffer` (off-policy);
- :class:`MultiAgentEvaluator` runs deterministic episodes and reports every agent's return and each
  group's *team return* (the mean of its agents' returns); the first group's team return is the run's
  ``eval_return_mean`` (what ``stop_return`` and the best checkpoint follow);
- :class:`MultiAgentTrainer` wires them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from phalanx.buffers.memory import ReplayMemory
from phalanx.config import TrainConfig
from phalanx.envs.core import as_device
from phalanx.marl.base import MultiAgentAlgorithm, to_env_actions
from phalanx.marl.buffers import MultiAgentReplayBuffer, MultiAgentRollout
from phalanx.marl.core import Groups, MultiAgentSpec, MultiAgentVecEnv, Tensor
from phalanx.marl.registry import make_multi_agent_env
from phalanx.registry import get_algorithm
from phalanx.train.environments import EVAL_SEED_OFFSET
from phalanx.train.evaluator import Evaluation, Evaluator
from phalanx.train.learner import Learner, replay_settings, rollout_settings
from phalanx.train.trainer import Trainer
from phalanx.train.videos import MAX_EPISODE_STEPS, EpisodeFrames
from phalanx.train.worker import EpisodeLog


def team_returns(episode_return: Groups) -> Groups:
    """Each group's team return ``(N,)``: the mean of its agents' returns ``(N, A_g)``."""
    return {name: returns.mean(dim=1) for name, returns in episode_return.items()}


class TeamEpisodeLog:
    """Training episodes' team returns, one :class:`EpisodeLog` per group; the first group's is the run's
    ``episode_return_mean``, the others are logged as ``episode_return/<group>``."""

    def __init__(self, groups: list[str], device: torch.device) -> None:
        self.logs = {name: EpisodeLog(device) for name in groups}

    def record(self, episode_return: Groups, episode_length: Tensor, done: Tensor) -> None:
        for name, returns in team_returns(episode_return).items():
            self.logs[name].record(returns, episode_length, done)

    def read(self) -> dict[str, float]:
        rows = {name: log.read() for name, log in self.logs.items()}
        first, *others = rows
        row = rows[first]
        for name in others:
            if "episode_return_mean" in rows[name]:
                row[f"episode_return/{name}"] = rows[name]["episode_return_mean"]
        return row


class MultiAgentWorker:
    """Steps a multi-agent env with the algorithm's policy; keeps the current observations, global state
    and action masks between calls (the :class:`~phalanx.train.worker.Worker` interface)."""

    in_flight = False  # steps are never left in flight (no worker-process pipeline for multi-agent runs)

    def __init__(self, env: MultiAgentVecEnv, algorithm: MultiAgentAlgorithm) -> None:
        self.env = env
        # Any: the interface of the algorithm's kind (explore, random_actions), as Worker.algorithm
        self.algorithm: Any = algorithm
        self.obs: Groups | None = None
        self.state: Tensor | None = None
        self.action_mask: Groups | None = None
        self.episodes = TeamEpisodeLog(list(env.groups), env.device)

    def reset(self, seed: int | None = None) -> None:
        self.obs, info = self.env.reset(seed=seed)
        self.state, self.action_mask = info["state"], info.get("action_mask")

    def _step(self, actions: Groups) -> tuple[Groups, Tensor, Tensor, Tensor, dict[str, Any]]:
        """Step the env with normalised ``actions``; record finished episodes; move to the next obs."""
        next_obs, rewards, terminated, truncated, info = self.env.step(
            to_env_actions(actions, self.env.groups)
        )
        dones = terminated | truncated
        self.episodes.record(info["episode_return"], info["episode_length"], dones)
        self.obs, self.state, self.action_mask = next_obs, info["state"], info.get("action_mask")
        return rewards, terminated, truncated, dones, info

    def collect(self, buffer: MultiAgentRollout) -> MultiAgentRollout:
        """Fill ``buffer`` with ``buffer.horizon`` steps of every sub-env."""
        if self.obs is None:
            raise RuntimeError("MultiAgentWorker.collect called before reset")
        for step in range(buffer.horizon):
            obs, state, action_mask = self.obs, self.state, self.action_mask
            actions, log_probs, values = self.algorithm.explore(obs, state, action_mask)
            rewards, terminated, _, dones, info = self._step(actions)
            buffer.add(
                step,
                obs=obs,
                state=state,
                actions=actions,
                log_probs=log_probs,
                values=values,
                rewards=rewards,
                terminated=terminated,
                dones=dones,
                next_obs=info["final_obs"],
                next_state=info["final_state"],
                action_mask=action_mask,
            )
        return buffer

    def transition(self, steps: int, random: bool, policy: Any | None = None) -> dict[str, Any]:
        """One step of every sub-env, as :meth:`MultiAgentReplayBuffer.add` takes it."""
        algorithm = policy if policy is not None else self.algorithm
        obs, state, action_mask = self.obs, self.state, self.action_mask
        if random:
            actions = algorithm.random_actions(self.env.num_envs, action_mask)
        else:
            actions = algorithm.explore(obs, state, action_mask, steps)
        rewards, terminated, truncated, _, info = self._step(actions)
        return {
            "obs": obs,
            "state": state,
            "actions": actions,
            "rewards": rewards,
            "next_obs": info["final_obs"],
            "next_state": info["final_state"],
            "terminated": terminated,
            "truncated": truncated,
            "next_action_mask": info.get("final_action_mask"),
        }

    def store(self, replay: MultiAgentReplayBuffer, transition: dict[str, Any]) -> None:
        replay.add(**transition)

    def state_dict(self) -> dict[str, Any]:
        return {"obs": self.obs, "state": self.state, "action_mask": self.action_mask}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.obs, self.state, self.action_mask = state["obs"], state["state"], state.get("action_mask")


@dataclass
class MultiAgentEvaluation(Evaluation):
    """``returns``: the first group's team return of each episode; ``agents``: each agent's mean return;
    ``teams``: each group's mean team return."""

    agents: dict[str, float] = field(default_factory=dict)
    teams: dict[str, float] = field(default_factory=dict)


class MultiAgentEvaluator(Evaluator):
    """One deterministic episode per sub-env of ``env`` (decentralised: each agent acts on its own
    observation), reset with the same seed every time."""

    env: MultiAgentVecEnv

    @torch.no_grad()
    def evaluate(self, algorithm: MultiAgentAlgorithm) -> MultiAgentEvaluation:
        env = self.env
        returns, lengths = self.first_episodes(
            lambda obs, info: to_env_actions(
                algorithm.act(obs, info.get("action_mask"), deterministic=True), env.groups
            ),
            lambda info: torch.cat([info["episode_return"][name] for name in env.groups], dim=1),
            torch.zeros(env.num_envs, env.num_agents, device=env.device),  # (N, all agents)
        )
        sizes = [group.num_agents for group in env.groups.values()]
        teams = team_returns(dict(zip(env.groups, returns.split(sizes, dim=1), strict=True)))
        agent_means = returns.mean(dim=0).tolist()
        return MultiAgentEvaluation(
            returns=teams[next(iter(env.groups))].tolist(),
            lengths=lengths.tolist(),
            agents=dict(zip(env.agents, agent_means, strict=True)),
            teams={name: float(team.mean()) for name, team in teams.items()},
        )


class MultiAgentTrainer(Trainer):
    """A :class:`~phalanx.train.trainer.Trainer` for the multi-agent algorithms of :mod:`phalanx.marl`."""

    algorithm: MultiAgentAlgorithm
    # The multi-agent parts where a Trainer has single-agent ones: the methods that read them differently
    # are this class's own (mypy cannot express the substitution)
    env: MultiAgentVecEnv  # type: ignore[assignment]
    eval_env: MultiAgentVecEnv | None  # type: ignore[assignment]
    worker: MultiAgentWorker  # type: ignore[assignment]
    compilable = False  # its worker, buffers and rules have no compiled path: compile: null stays eager

    def _build(self, config: TrainConfig, run_dir: Path | None, show_progress: bool) -> None:
        self.env = make_multi_agent_env(
            config.env, num_envs=config.num_envs, device=config.device, num_workers=config.num_workers
        )
        self.eval_env = make_multi_agent_env(config.env, num_envs=config.eval_episodes, device=config.device)
        self.spec = MultiAgentSpec.of(self.env)
        self.algorithm = self.new_algorithm(config.hyperparameters)
        self.obs_statistics = None
        self.statistics_syncs = []
        self.step_size = config.num_envs
        self.spaces = self.spec.to_dict()
        self.buffer = self.make_buffer()
        self.worker = MultiAgentWorker(self.env, self.algorithm)
        self.learner = Learner(self.algorithm, self.buffer)
        self.evaluator = MultiAgentEvaluator(self.eval_env, seed=config.seed + EVAL_SEED_OFFSET)
        self.open_run(run_dir, show_progress)
        self.worker.reset(seed=config.seed)

    def make_buffer(self) -> MultiAgentRollout | MultiAgentReplayBuffer:  # type: ignore[override]  # as env
        config, hp = self.config, self.config.hyperparameters
        if self.algorithm.on_policy:
            return MultiAgentRollout(rollout_settings(hp).horizon, config.num_envs, self.spec, self.device)
        return MultiAgentReplayBuffer(
            replay_settings(hp).buffer_size, config.num_envs, self.spec, self.device
        )

    @classmethod
    def replay_memory(cls, config: TrainConfig) -> ReplayMemory | None:
        """What the replay buffer of a run of ``config`` takes (None: on-policy), from its env's spec."""
        if get_algorithm(config.algo).on_policy:
            return None
        env = make_multi_agent_env(config.env, num_envs=1, device=config.device)
        try:
            spec = MultiAgentSpec.of(env)
        finally:
            env.close()
        return MultiAgentReplayBuffer.memory(
            replay_settings(config.hyperparameters).buffer_size,
            config.num_envs,
            spec,
            as_device(config.device),
        )

    def evaluation_columns(  # type: ignore[override]  # its evaluator's evaluations
        self, evaluation: MultiAgentEvaluation
    ) -> dict[str, float]:
        """Every agent's mean return and, with more than one group, each group's team return."""
        columns = {f"eval_return/{agent}": value for agent, value in evaluation.agents.items()}
        if len(evaluation.teams) > 1:
            columns.update({f"eval_team_return/{name}": value for name, value in evaluation.teams.items()})
        return columns

    def extra_summary(self) -> dict[str, Any]:
        evaluation = self.last_evaluation
        assert evaluation is None or isinstance(evaluation, MultiAgentEvaluation), "its evaluator's"
        return {
            "eval_agent_returns": evaluation.agents if evaluation else None,
            "eval_team_returns": evaluation.teams if evaluation else None,
        }

    def new_algorithm(self, hyperparameters: Any) -> MultiAgentAlgorithm:
        return get_algorithm(self.config.algo)(hyperparameters, self.spec, self.device)

    def video_episode(self, seed: int) -> MultiAgentEpisode:  # type: ignore[override]  # its own episodes
        """The current policies' deterministic episode from ``seed``, drawn frame by frame (for
        ``video_every``)."""
        return MultiAgentEpisode(self.config.env, self.algorithm, self.device, seed)


class MultiAgentEpisode(EpisodeFrames):
    """The deterministic episode of a multi-agent ``algorithm`` on one copy of ``env_id``, drawn by the
    env's own ``render()`` (sub-env 0); each agent acts on its own observation."""

    def __init__(
        self,
        env_id: str,
        algorithm: MultiAgentAlgorithm,
        device: torch.device,
        seed: int,
        max_steps: int = MAX_EPISODE_STEPS,
    ) -> None:
        self.algorithm = algorithm
        super().__init__(env_id, make_multi_agent_env(env_id, num_envs=1, device=device), seed, max_steps)

    def reset(self, seed: int) -> None:
        self.obs, self.info = self.env.reset(seed=seed)

    @torch.no_grad()
    def step(self) -> bool:
        actions = self.algorithm.act(self.obs, self.info.get("action_mask"), deterministic=True)
        env_actions = to_env_actions(actions, self.env.groups)
        self.obs, _, terminated, truncated, self.info = self.env.step(env_actions)
        return bool(terminated[0] | truncated[0])
