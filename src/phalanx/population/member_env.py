"""What a vectorized population's members must be to be batched (:func:`check_batchable`). Their env is one
VecEnv of ``P * num_envs`` sub-envs, member i owning rows ``[i * num_envs, (i + 1) * num_envs)``, in the
wrapper chain of every run (:func:`phalanx.train.environments.wrap_env` with the members' discounts)."""

from __future__ import annotations

import gymnasium as gym

from phalanx.errors import ConfigError
from phalanx.nets import observation_kind


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
