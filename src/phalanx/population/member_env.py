"""The env of a vectorized population: one VecEnv of ``P * num_envs`` sub-envs, member i owning rows
``[i * num_envs, (i + 1) * num_envs)``, wrapped as a single run's training env is (NaN guard, actions in
[-1, 1]) but normalised with statistics, and a discount for the rewards, of each member's own
(:class:`MemberScaleReward`); and :func:`check_batchable`, what the members' batched networks cannot read.

The wrappers are those of :func:`phalanx.train.environments.wrap_env`, in its order, but not that
function: it normalises with one set of statistics when there is one block of rows (a population of one
member keeps per-member statistics here), scales rewards with one scalar discount, and refuses image
observations for ``normalize_obs`` before :func:`check_batchable` would say why a population cannot.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from phalanx.config import TrainConfig
from phalanx.envs.core import Tensor, VecEnv
from phalanx.envs.registry import make_env
from phalanx.envs.wrappers import (
    MemberNormalizeObservation,
    NanGuard,
    RescaleAction,
    RunningMeanStd,
    ScaleReward,
    VecEnvWrapper,
    needs_action_map,
)
from phalanx.errors import ConfigError
from phalanx.nets import observation_kind
from phalanx.train.environments import nan_check_every


def check_batchable(algo: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    """A ConfigError where the vectorized backend cannot batch the members' networks: it stacks their
    MLPs into ensembles (``EnsembleMLP``), which have no observation encoder (images, Dict observations)
    and no MultiDiscrete head."""
    kind = observation_kind(observation_space)
    if kind != "flat":
        what = "image observations" if kind == "image" else "Dict observations"
        raise ConfigError(
            f"backend 'vectorized' batches the members' MLPs as one ensemble network, which has no encoder "
            f"for the {what} of {observation_space}. Use the process backend (--backend process; also "
            f"serial or ray), which trains each member as a single {algo} run with its encoder."
        )
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        raise ConfigError(
            f"backend 'vectorized' batches the members' policies as ensembles of categorical or Gaussian "
            f"heads, not the MultiDiscrete action space {action_space}. Use the process backend "
            f"(--backend process; also serial or ray), which trains each member as a single {algo} run."
        )


# -- per-member scaling of the rewards --------------------------------------------------------------


class MemberScaleReward(ScaleReward):
    """ScaleReward with a discount and return statistics of their own for each member's block of rows.

    ``gamma`` is the population's ``(P,)`` float64 discount tensor, read at every step (a member's new
    gamma applies from the next step, as it would after a single run reloaded its config). Reset and
    state dict are ScaleReward's.
    """

    def __init__(
        self, env: VecEnv, num_members: int, gamma: Tensor, clip: float = 10.0, epsilon: float = 1e-8
    ) -> None:
        VecEnvWrapper.__init__(self, env)  # not ScaleReward's: its gamma and statistics are scalars
        self.num_members = num_members
        self.gamma = gamma  # type: ignore[assignment]  # (P,) float64, shared with the population
        self.clip = clip
        self.epsilon = epsilon
        self.update = True
        self.statistics = RunningMeanStd((num_members,), self.device)
        self.returns = torch.zeros(self.num_envs, dtype=self.statistics.dtype, device=self.device)  # (P * N,)

    def _transition(
        self, obs: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        by_member = (self.num_members, -1)
        gamma: Tensor = self.gamma  # type: ignore[assignment]
        self.returns = (self.returns.view(by_member) * gamma.unsqueeze(1)).view(-1) + reward
        self.statistics.update(self.returns.view(by_member).T)  # (N, P)
        scale = torch.sqrt(self.statistics.var + self.epsilon).to(reward.dtype)  # (P,)
        scaled = (reward.view(by_member) / scale.unsqueeze(1)).view(-1).clamp(-self.clip, self.clip)
        self.returns.masked_fill_(terminated | truncated, 0.0)
        return obs, scaled, terminated, truncated, info


def build_member_env(
    config: TrainConfig,
    num_envs: int,
    device: torch.device,
    num_members: int,
    training: bool,
    obs_statistics: RunningMeanStd | None,
    gamma: Tensor,
) -> VecEnv:
    """``build_env``'s wrapper chain (NaN guard when training, actions in [-1, 1], normalisation) over
    ``num_envs`` rows, with the normalisation statistics per member: ``obs_statistics`` (evaluation: the
    training env's, frozen) and the ``(P,)`` discount tensor ``gamma`` of the population."""
    env = make_env(config.env, num_envs=num_envs, device=device)
    if training:  # on an accelerator, reads its record once per rollout on-policy, as a run's does
        env = NanGuard(env, check_every=nan_check_every(config))
    if needs_action_map(env.single_action_space):
        env = RescaleAction(env)
    if config.normalize_obs:
        env = MemberNormalizeObservation(env, num_members, statistics=obs_statistics, update=training)
    if config.normalize_reward and training:
        env = MemberScaleReward(env, num_members, gamma)
    return env
