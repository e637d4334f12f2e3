"""Population-based training's hand-over: a run takes another run's agent and/or new hyperparameters and
goes on training (:func:`adopt`, which a population calls before the member's next ``train``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from phalanx.algos.base import Algorithm
from phalanx.errors import ConfigError
from phalanx.train.environments import to_device

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer


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
    new = config.hyperparameters
    if hyperparameters:
        candidate = dataclasses.replace(config, hyperparameters=dataclasses.replace(new, **hyperparameters))
        candidate.validate()
        new = candidate.hyperparameters
    _check_buffer(trainer, new)
    old = trainer.algorithm
    algorithm = trainer.new_algorithm(new)
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
    statistics = trainer.obs_statistics
    if agent is not None and agent.get("obs_statistics") is not None and statistics is not None:
        statistics.load_state_dict(to_device(agent["obs_statistics"], trainer.device))
    trainer.hand_over(algorithm, new, steps)


def _check_buffer(trainer: Trainer, hyperparameters: Any) -> None:
    """A replay buffer must keep its size (it holds the run's experience); a rollout buffer is remade
    for a new horizon by the hand-over (it holds nothing between rollouts)."""
    if not trainer.algorithm.on_policy and trainer.buffer.slots != max(
        hyperparameters.buffer_size // trainer.config.num_envs, 1
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
