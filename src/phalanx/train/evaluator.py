"""Evaluator: deterministic episodes on a separate env, one episode per sub-env, run in parallel.

:class:`Evaluator` runs them in the training process, between updates. :class:`EvaluationProcess` runs
the same evaluator in a process of its own on a copy of the weights, while training goes on.
"""

from __future__ import annotations

import io
import math
import multiprocessing
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from phalanx.envs.core import VecEnv

Tensor = torch.Tensor


@dataclass
class Evaluation:
    returns: list[float]
    lengths: list[int]

    @property
    def mean(self) -> float:
        return sum(self.returns) / len(self.returns)

    @property
    def std(self) -> float:
        mean = self.mean
        return math.sqrt(sum((r - mean) ** 2 for r in self.returns) / len(self.returns))


class BestReturn:
    """The best evaluation mean so far (which evaluation's weights the best checkpoint holds)."""

    best_return: float = -math.inf

    def is_best(self, evaluation: Evaluation) -> bool:
        """Record ``evaluation``; true if its mean is the best so far."""
        if evaluation.mean > self.best_return:
            self.best_return = evaluation.mean
            return True
        return False


class Evaluator(BestReturn):
    """Runs the first episode of each of ``env.num_envs`` sub-envs with the deterministic policy.

    The env is reset with the same seed every time, so successive evaluations see the same start
    states and differ only by the policy. ``max_steps`` bounds envs without a time limit.
    """

    def __init__(self, env: VecEnv, seed: int, max_steps: int = 100_000, check_every: int = 16) -> None:
        self.env = env
        self.seed = seed
        self.max_steps = max_steps
        self.check_every = check_every
        self.best_return = -math.inf

    @torch.no_grad()
    def evaluate(self, algorithm) -> Evaluation:
        returns, lengths = self.first_episodes(
            lambda obs, info: algorithm.act(obs, deterministic=True),
            lambda info: info["episode_return"],
            torch.zeros(self.env.num_envs, dtype=torch.float32, device=self.env.device),
        )
        return Evaluation(returns.tolist(), lengths.tolist())

    def first_episodes(
        self, act: Callable[[Any, dict], Any], episode_return: Callable[[dict], Tensor], returns: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Reset the env with the evaluation seed and step it with ``act(obs, info)`` until every sub-env
        has ended its first episode: those episodes' ``episode_return(info)`` rows (``returns`` gives the
        shape, ``(num_envs, ...)``) and lengths ``(num_envs,)``."""
        env = self.env
        obs, info = env.reset(seed=self.seed)
        finished = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
        lengths = torch.zeros(env.num_envs, dtype=torch.int64, device=env.device)
        for step in range(1, self.max_steps + 1):
            obs, _, terminated, truncated, info = env.step(act(obs, info))
            first_end = (terminated | truncated) & ~finished
            rows = first_end.view(-1, *[1] * (returns.dim() - 1))
            returns = torch.where(rows, episode_return(info), returns)
            lengths = torch.where(first_end, info["episode_length"], lengths)
            finished |= first_end
            if step % self.check_every == 0 and bool(finished.all()):
                break
        if not bool(finished.all()):
            raise RuntimeError(
                f"evaluation: {int((~finished).sum())} of {env.num_envs} episodes of {env!r} did not end "
                f"within {self.max_steps} steps. Give the env a time limit (max_episode_steps)."
            )
        return returns, lengths


class EvaluationProcess(BestReturn):
    """The :class:`Evaluator` in a process of its own, evaluating a copy of the weights while training
    goes on: evaluations leave the training loop, and can run as often as the process keeps up.

    The process builds the evaluation env the trainer would (``build_env(config, eval_episodes,
    training=False)``) with the same seed, so it gives the same returns as an :class:`Evaluator` for the
    same weights. One evaluation at a time: :meth:`submit` sends the weights and returns at once,
    :meth:`poll` gives the result when there is one, :meth:`wait` waits for it. The process ignores
    Ctrl+C (the trainer handles it and closes the process) and ends when this side closes or dies.

    On Linux with a CPU device the process is forked (in milliseconds, and the caller's script needs no
    ``if __name__ == "__main__":`` guard); it sets its own thread count first, as PyTorch's DataLoader
    workers do. Otherwise (CUDA, which cannot be used in a forked child, or macOS and Windows) it is
    started as the env worker processes are, with forkserver or spawn.
    """

    def __init__(self, config: Any, seed: int, envs: dict[str, Any], start_method: str | None = None) -> None:
        """``config``: the run's TrainConfig; ``seed``: of the evaluation episodes; ``envs``: ids the caller
        registered, with their factories (for forkserver and spawn); ``start_method``: None picks."""
        from phalanx.envs.core import as_device
        from phalanx.envs.workers import _default_start_method, _start_process

        forkable = sys.platform.startswith("linux") and as_device(config.device).type == "cpu"
        self.start_method = start_method or ("fork" if forkable else _default_start_method())
        context = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            context.set_forkserver_preload(["phalanx.train.trainer"])
        payload = {
            "config": config.to_dict(),
            "seed": seed,
            "envs": envs,
            "threads": config.torch_threads or 1,
        }
        self.process, self.connection = _start_process(
            context, _evaluation_loop, (payload,), name="phalanx-evaluator"
        )
        self.ready = False
        self.in_flight: int | None = None  # the steps of the weights being evaluated

    @property
    def busy(self) -> bool:
        return self.in_flight is not None

    def wait_ready(self) -> None:
        """Wait until the process has built its env and networks (a failure there is raised here)."""
        if not self.ready:
            self._receive("ready", block=True)
            self.ready = True

    def submit(self, steps: int, state: dict[str, Any]) -> None:
        """Evaluate ``state`` (the algorithm's state dict and the observation statistics, on the CPU) as
        the weights of step ``steps``."""
        if self.busy:
            raise RuntimeError("EvaluationProcess.submit: an evaluation is under way; poll() or wait() first")
        self.wait_ready()
        buffer = io.BytesIO()
        torch.save({"steps": steps, **state}, buffer)
        try:
            self.connection.send(("evaluate", buffer.getvalue()))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._died("an evaluation")
        self.in_flight = steps

    def poll(self) -> tuple[int, Evaluation] | None:
        """``(steps, evaluation)`` if the evaluation under way has ended, else None (does not wait)."""
        if not self.busy:
            return None
        return self._receive("result", block=False)

    def wait(self) -> tuple[int, Evaluation] | None:
        """Wait for the evaluation under way: ``(steps, evaluation)``, or None if there is none."""
        if not self.busy:
            return None
        return self._receive("result", block=True)

    def _receive(self, expected: str, block: bool) -> Any:
        try:
            if not block and not self.connection.poll():
                return None
            message = self.connection.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._died("start" if expected == "ready" else "an evaluation")
        kind, *value = message
        if kind == "error":
            summary, details = value
            raise RuntimeError(f"the evaluation process failed: {summary}\n\nIts traceback:\n{details}")
        if kind == "ready":
            return None
        steps, returns, lengths = value
        self.in_flight = None
        return steps, Evaluation(returns, lengths)

    def _died(self, during: str) -> None:
        from phalanx.envs.workers import death_cause

        cause = death_cause(self.process, during, self.start_method)
        raise RuntimeError(f"the evaluation process ended: {cause}.")

    def close(self) -> None:
        """End the process (asked to close as the env workers are, then by force). Safe to call twice."""
        from phalanx.envs.workers import _shutdown

        if self.process is not None:
            _shutdown([self.process], [self.connection])
            self.process = None


def _evaluation_loop(payload: dict[str, Any], connection: Any) -> None:
    """The evaluation process: build the env, evaluator and algorithm, then evaluate what arrives."""
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the trainer's to handle; it closes us

    def report_error(error: BaseException) -> None:
        connection.send(("error", f"{type(error).__name__}: {error}", traceback.format_exc()))

    try:
        from phalanx.algos import get_algorithm
        from phalanx.config import TrainConfig
        from phalanx.envs.core import as_device
        from phalanx.envs.registry import register_env
        from phalanx.envs.wrappers import NormalizeObservation, find_wrapper
        from phalanx.train.trainer import _to_device, build_env

        torch.set_num_threads(payload["threads"])
        for env_id, factory in payload["envs"].items():  # ids the trainer's caller registered
            register_env(env_id, factory, overwrite=True)
        config = TrainConfig.from_dict(payload["config"], where="the evaluation process's config")
        device = as_device(config.device)
        env = build_env(config, config.eval_episodes, training=False)
        normalizer = find_wrapper(env, NormalizeObservation)
        algorithm = get_algorithm(config.algo)(
            config.hyperparameters, env.single_observation_space, env.single_action_space, device
        )
        evaluator = Evaluator(env, payload["seed"])
    except BaseException as error:
        report_error(error)
        return
    connection.send(("ready",))
    parent = os.getppid()
    try:
        while True:
            try:
                if not connection.poll(1.0):
                    if os.getppid() != parent:  # the trainer is gone (a forked child holds both ends)
                        break
                    continue
                command, *arguments = connection.recv()
            except (EOFError, OSError):  # the trainer is gone
                break
            if command == "close":
                break
            try:
                request = _to_device(torch.load(io.BytesIO(arguments[0]), weights_only=True), device)
                algorithm.load_state_dict(request["algorithm"])
                if normalizer is not None:
                    normalizer.statistics.load_state_dict(request["obs_statistics"])
                evaluation = evaluator.evaluate(algorithm)
            except Exception as error:
                report_error(error)
                continue
            connection.send(("result", request["steps"], evaluation.returns, evaluation.lengths))
    finally:
        env.close()
