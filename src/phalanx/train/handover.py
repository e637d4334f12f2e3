"""Population-based training's hand-over: a run takes another run's agent and/or new hyperparameters and
goes on training (:func:`adopt`), as a hook that acts when its next ``train`` starts (:class:`HandOver`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from phalanx.algos.base import Algorithm
from phalanx.errors import ConfigError
from phalanx.train.environments import to_device
from phalanx.train.hooks import Hook

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer


class HandOver(Hook):
    """Before training goes on: :func:`adopt` ``agent`` and/or ``hyperparameters`` (a population member
    copying a better one, or taking mutated hyperparameters)."""

    def __init__(
        self,
        agent: dict[str, Any] | None = None,
        hyperparameters: dict[str, Any] | None = None,
        steps: int | None = None,
    ) -> None:
        self.agent = agent
        self.hyperparameters = hyperparameters
        self.steps = steps

    def on_start(self, trainer: Trainer) -> None:
        adopt(trainer, self.agent, self.hyperparameters, self.steps)


def adopt(
    trainer: Trainer,
    agent: dict[str, Any] | None = None,
    hyperparameters: dict[str, Any] | None = None,
    steps: int | None = None,
) -> None:
    """Population-based training: ``trainer`` takes another run's ``agent`` (an ``agent_state()``:
    networks, optimiser state, observation statistics) and/or new ``hyperparameters``, and goes on.

    The run keeps its own envs, buffer and RNG, and its progress unless ``steps`` is given (a new
    member spawned from another takes its step count, and its schedules go on from there). The
    algorithm is rebuilt from the new hyperparameters, so every one of them takes effect, also those
    an algorithm reads only when it is built; the learning rates are the new ones, not those in the
    optimiser state. A change of the networks' shapes (hidden_sizes) cannot carry the weights.
    """
    if trainer.group is not None:
        raise ConfigError("adopt() is for single-learner runs; a population member has one learner.")
    config = trainer.config
    if hyperparameters:
        candidate = dataclasses.replace(
            config, hyperparameters=dataclasses.replace(config.hyperparameters, **hyperparameters)
        )
        candidate.validate()
        config.hyperparameters = candidate.hyperparameters
    old = trainer.algorithm
    algorithm = trainer.new_algorithm()
    learning_rates = _learning_rates(algorithm)  # from the new hyperparameters
    state = agent["algorithm"] if agent is not None else old.state_dict()
    try:
        algorithm.load_state_dict(to_device(state, trainer.device))
    except (RuntimeError, KeyError, ValueError) as error:
        raise ConfigError(
            f"cannot carry the agent's weights into {config.algo} with hyperparameters "
            f"{hyperparameters}: {str(error).splitlines()[0]}. Hyperparameters that change the "
            "networks' shapes (hidden_sizes) cannot be changed while training goes on."
        ) from None
    for name, optimizer in algorithm.optimizers().items():
        for group, rate in zip(optimizer.param_groups, learning_rates[name], strict=True):
            group["lr"] = rate
    trainer.algorithm = trainer.worker.algorithm = trainer.learner.algorithm = algorithm
    statistics = trainer.obs_statistics
    if agent is not None and agent.get("obs_statistics") is not None and statistics is not None:
        statistics.load_state_dict(to_device(agent["obs_statistics"], trainer.device))
    _keep_buffer(trainer)
    if steps is not None:
        trainer.steps = steps
        trainer.restart_schedules()


def _keep_buffer(trainer: Trainer) -> None:
    """A rollout buffer of the new horizon (it holds nothing between rollouts); a replay buffer must keep
    its size (it holds the run's experience)."""
    config = trainer.config
    if trainer.algorithm.on_policy and trainer.buffer.horizon != config.hyperparameters.horizon:
        trainer.buffer = trainer.learner.buffer = trainer.make_buffer()
    elif not trainer.algorithm.on_policy and trainer.buffer.slots != max(
        config.hyperparameters.buffer_size // config.num_envs, 1
    ):
        raise ConfigError(
            "buffer_size cannot change while training goes on: the replay buffer holds this run's "
            "experience. Leave it out of the mutations."
        )


def _learning_rates(algorithm: Algorithm) -> dict[str, list[float]]:
    """The learning rate of every parameter group of every optimiser an algorithm holds, by name."""
    return {
        name: [group["lr"] for group in optimizer.param_groups]
        for name, optimizer in algorithm.optimizers().items()
    }
