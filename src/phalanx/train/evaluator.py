"""Evaluator: deterministic episodes on a separate env, one episode per sub-env, run in parallel.

:class:`Evaluator` runs them in the training process, between updates. :class:`EvaluationProcess` runs
the same evaluator in a process of its own on a copy of the weights, while training goes on.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from phalanx.algos.recurrent import actor
from phalanx.config import TrainConfig
from phalanx.envs.core import BatchedVecEnv, VecEnv, as_device, block_seeds, episode_ends
from phalanx.envs.registry import register_env
from phalanx.envs.wrappers import NormalizeObservation, find_wrapper
from phalanx.optim import without_optimizers
from phalanx.pool import Fault, WorkerPool, WorkerSide, WorkerTask, choose_start_method, death_cause
from phalanx.registry import algorithm_class
from phalanx.train.environments import build_env, to_device

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
    """The best evaluation mean so far and the step of the weights that had it (which evaluation's weights
    the best checkpoint holds)."""

    best_return: float = -math.inf
    best_steps: int | None = None

    def is_best(self, evaluation: Evaluation, steps: int) -> bool:
        """Record ``evaluation`` of the weights of step ``steps``; true if its mean is the best so far."""
        if evaluation.mean > self.best_return:
            self.best_return, self.best_steps = evaluation.mean, steps
            return True
        return False


class EpisodeEnv(Protocol):
    """What an :class:`Evaluator` steps: a VecEnv, or a multi-agent env (``phalanx.marl``, a layer above:
    its observations and actions are groups); ``reset``'s seed may be one per sub-env."""

    @property
    def num_envs(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[Any, dict[str, Any]]: ...

    def step(self, actions: Any) -> tuple[Any, Any, Tensor, Tensor, dict[str, Any]]: ...


class Evaluator(BestReturn):
    """Runs the first episode of each of ``env.num_envs`` sub-envs with the deterministic policy.

    The env is reset with the same seed every time, so successive evaluations see the same start
    states and differ only by the policy. ``max_steps`` bounds envs without a time limit.
    """

    def __init__(
        self,
        env: EpisodeEnv,
        seed: int | list[int],
        max_steps: int = 100_000,
        check_every: int = 16,
    ) -> None:
        self.env = env
        self.seed = seed
        self.max_steps = max_steps
        self.check_every = check_every
        self.best_return = -math.inf

    @torch.no_grad()
    def evaluate(self, algorithm) -> Evaluation:
        """The deterministic episodes of ``algorithm`` (or of k side by side), acting through its
        :func:`~phalanx.algos.recurrent.actor` (a recurrent policy carries its memory from step to step)."""
        acting = actor(algorithm)
        returns, lengths = self.first_episodes(
            lambda obs, info: acting.act(obs, deterministic=True),
            lambda info: info["episode_return"],
            torch.zeros(self.env.num_envs, dtype=torch.float32, device=self.env.device),
            acting.episodes_ended,
        )
        return Evaluation(returns.tolist(), lengths.tolist())

    def first_episodes(
        self,
        act: Callable[[Any, dict], Any],
        episode_return: Callable[[dict], Tensor],
        returns: Tensor,
        episodes_ended: Callable[[Tensor], None] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Reset the env with the evaluation seed and step it with ``act(obs, info)`` until every sub-env
        has ended its first episode: those episodes' ``episode_return(info)`` rows (``returns`` gives the
        shape, ``(num_envs, ...)``) and lengths ``(num_envs,)``. ``episodes_ended(dones)`` is told each
        step's episode ends (an actor with memory forgets them)."""
        env = self.env
        obs, info = env.reset(seed=self.seed)
        finished = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
        lengths = torch.zeros(env.num_envs, dtype=torch.int64, device=env.device)
        for step in range(1, self.max_steps + 1):
            obs, _, terminated, truncated, info = env.step(act(obs, info))
            if episodes_ended is not None:
                episodes_ended(terminated | truncated)
            first_end = episode_ends(info) & ~finished  # Atari: the game, not a life, ended
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
    """The :class:`Evaluator` in a process of its own, evaluating copies of the weights while training
    goes on: evaluations leave the training loop, and can run as often as the process keeps up.

    The process builds the evaluation env the trainer would (``build_env(config, eval_episodes,
    training=False)``) with the same seed, so it gives the same returns as an :class:`Evaluator` for the
    same weights. :meth:`submit` sends a copy of the weights and returns at once (a thread of the process
    receives it while it evaluates others); :meth:`poll` gives the results that are in, :meth:`wait`
    waits for all. Whenever the process is free it takes the copies that have arrived, up to
    :attr:`batch_limit` of them (the newest; older ones are reported skipped), and evaluates them
    together: k copies in one env of ``k * eval_episodes`` sub-envs, each on its own block of rows seeded
    as the single evaluation env (:func:`~phalanx.envs.core.block_seeds`) with its own observation
    statistics, its actions from :meth:`Algorithm.side_by_side`. With a batched simulator k copies cost
    little more than one. The process ignores Ctrl+C (the trainer handles it and closes the process)
    and ends when this side closes or dies.

    On Linux with a CPU device the process is forked (in milliseconds, and the caller's script needs no
    ``if __name__ == "__main__":`` guard); it sets its own thread count first, as PyTorch's DataLoader
    workers do. Otherwise (CUDA, which cannot be used in a forked child, or macOS and Windows) it is
    started as the env worker processes are, with forkserver or spawn.
    """

    def __init__(self, config: Any, seed: int, envs: dict[str, Any], start_method: str | None = None) -> None:
        """``config``: the run's TrainConfig; ``seed``: of the evaluation episodes; ``envs``: ids the caller
        registered, with their factories (for forkserver and spawn); ``start_method``: None picks."""
        self.start_method = choose_start_method(start_method, forkable=as_device(config.device).type == "cpu")
        payload = {
            "config": config.to_dict(),
            "seed": seed,
            "envs": envs,
            "threads": config.torch_threads or 1,
        }
        self.pool = WorkerPool(
            _Evaluation(payload),
            1,
            name="phalanx-evaluator",
            start_method=self.start_method,
            preload=["phalanx.train.trainer"],
            queued=True,
        )
        self.process = self.pool.processes[0]
        self.batch_limit = 1
        """The most copies evaluated together (``eval_batch`` with a batched simulator, else 1); known
        once the process is ready."""
        self.ready = False
        self.outstanding: set[int] = set()  # the steps of the copies sent and not yet reported

    @property
    def busy(self) -> bool:
        return bool(self.outstanding)

    def wait_ready(self) -> None:
        """Wait until the process has built its env and networks (a failure there is raised here)."""
        if not self.ready:
            self.batch_limit = self._receive("start")
            self.ready = True

    def submit(self, steps: int, state: dict[str, Any]) -> None:
        """Evaluate ``state`` (the algorithm's state dict and the observation statistics, on the CPU) as
        the weights of step ``steps``, once the process is free."""
        if steps in self.outstanding:
            raise ValueError(f"EvaluationProcess.submit: the weights of step {steps} were sent already.")
        self.wait_ready()
        buffer = io.BytesIO()
        torch.save({"steps": steps, **state}, buffer)
        try:
            self.pool.send(0, (steps, buffer.getvalue()))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            cause = death_cause(self.process, "an evaluation", self.start_method)
            raise RuntimeError(f"the evaluation process ended: {cause}.") from None
        self.outstanding.add(steps)

    def poll(self) -> list[tuple[int, Evaluation]]:
        """The ``(steps, evaluation)`` results that have arrived, in step order (does not wait); the
        copies skipped for newer ones are no longer outstanding."""
        results = []
        while self.busy and self.pool.poll(0):
            results += self._receive("an evaluation")
        return results

    def wait(self) -> list[tuple[int, Evaluation]]:
        """Wait until every copy sent is evaluated or skipped: their ``(steps, evaluation)`` results."""
        results = []
        while self.busy:
            results += self._receive("an evaluation")
        return results

    def _receive(self, during: str) -> Any:
        try:
            kind, value, *skipped = self.pool.receive(0, during)
        except Fault as fault:
            if fault.kind == "died":
                raise RuntimeError(f"the evaluation process ended: {fault.summary}.") from None
            raise RuntimeError(
                f"the evaluation process failed: {fault.summary}\n\nIts traceback:\n{fault.trace}"
            ) from None
        if kind == "ready":
            return value
        self.outstanding -= {steps for steps, _, _ in value} | set(skipped[0])
        return [(steps, Evaluation(returns, lengths)) for steps, returns, lengths in value]

    def close(self) -> None:
        """End the process (asked to close as the env workers are, then by force). Safe to call twice."""
        if self.process is not None:
            self.pool.close()
            self.process = None


class _Evaluation(WorkerTask):
    """What the evaluation process does: build its :class:`CopiesEvaluator`; then, whenever free, evaluate
    the newest ``batch_limit`` of the copies of the weights that arrived (a thread of the pool receives
    them as they are sent) and report the older ones skipped."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.evaluator: CopiesEvaluator | None = None

    def start(self, worker: WorkerSide) -> tuple[str, int]:
        torch.set_num_threads(self.payload["threads"])
        for env_id, factory in self.payload["envs"].items():  # ids the trainer's caller registered
            register_env(env_id, factory, overwrite=True)
        config = TrainConfig.from_dict(self.payload["config"], where="the evaluation process's config")
        self.evaluator = CopiesEvaluator(config, self.payload["seed"])
        return "ready", self.evaluator.batch_limit

    def handle(self, message: list[tuple[int, bytes]]) -> tuple[str, list, list[int]]:
        """``message``: the ``(steps, copy)`` that arrived, oldest first."""
        assert self.evaluator is not None, "the process's evaluator exists once it has started"
        limit = self.evaluator.batch_limit
        taken, skipped = message[-limit:], [steps for steps, _ in message[:-limit]]
        copies = [torch.load(io.BytesIO(data), weights_only=True) for _, data in taken]
        evaluations = self.evaluator.evaluate(copies)
        results = [
            (steps, evaluation.returns, evaluation.lengths)
            for (steps, _), evaluation in zip(taken, evaluations, strict=True)
        ]
        return "results", results, skipped

    def close(self) -> None:
        if self.evaluator is not None:
            self.evaluator.close()


class CopiesEvaluator:
    """Evaluates k copies of an agent at once (what the evaluation process does with the copies it takes):
    copy i on its own block of ``eval_episodes`` rows of one env of ``k * eval_episodes`` sub-envs (built
    once per k), seeded as the single evaluation env, normalised with its own observation statistics,
    acting through :meth:`Algorithm.side_by_side`. Each copy gets what an :class:`Evaluator` gives it alone.
    """

    def __init__(self, config: Any, seed: int) -> None:
        self.config, self.seed = config, seed
        self.device = as_device(config.device)
        self.envs: dict[int, VecEnv] = {1: build_env(config, config.eval_episodes, training=False)}
        self.algorithm_class = algorithm_class(config.algo, config.hyperparameters)
        self.spaces = self.envs[1].single_observation_space, self.envs[1].single_action_space
        try:
            with without_optimizers():  # copies to act with, never to train
                self.algorithms = [self.algorithm_class(config.hyperparameters, *self.spaces, self.device)]
        except BaseException:
            self.close()
            raise
        self.batch_limit = config.eval_batch if isinstance(self.envs[1].unwrapped, BatchedVecEnv) else 1
        """The most copies evaluated together: ``eval_batch`` with a batched simulator, where k copies cost
        little more than one; 1 with other envs, where they would cost k times one."""

    def evaluate(self, copies: list[dict[str, Any]]) -> list[Evaluation]:
        """The evaluation of each copy (``{"algorithm": state dict, "obs_statistics": state or None}``)."""
        k, episodes = len(copies), self.config.eval_episodes
        if not 1 <= k <= self.batch_limit:
            raise ValueError(f"CopiesEvaluator.evaluate: {k} copies, expected 1 to {self.batch_limit}.")
        copies = to_device(copies, self.device)
        if k not in self.envs:
            self.envs[k] = build_env(self.config, k * episodes, training=False, blocks=k)
        while len(self.algorithms) < k:
            with without_optimizers():
                self.algorithms.append(
                    self.algorithm_class(self.config.hyperparameters, *self.spaces, self.device)
                )
        for algorithm, copy in zip(self.algorithms, copies, strict=False):  # the first k
            algorithm.load_state_dict(copy["algorithm"])
        normalizer = find_wrapper(self.envs[k], NormalizeObservation)
        if normalizer is not None:
            normalizer.statistics.load_state_dict(_block_statistics(copies))
        evaluator = Evaluator(self.envs[k], block_seeds(self.envs[k], [self.seed] * k, episodes))
        actor = self.algorithms[0] if k == 1 else self.algorithm_class.side_by_side(self.algorithms[:k])
        # Inference mode skips autograd's bookkeeping of every op (~20% of a CartPole evaluation). Its
        # tensors refuse in-place updates outside it, so only these envs, which nothing else steps, use it.
        with torch.inference_mode():
            evaluation = evaluator.evaluate(actor)
        return [
            Evaluation(
                evaluation.returns[i * episodes : (i + 1) * episodes],
                evaluation.lengths[i * episodes : (i + 1) * episodes],
            )
            for i in range(k)
        ]

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


def _block_statistics(copies: list[dict[str, Any]]) -> dict[str, Tensor]:
    """The observation statistics of k copies as one state: the copy's own for k = 1, else their means
    and variances stacked ``(k, *obs_shape)`` (a MemberNormalizeObservation's; the count, which
    normalising does not read, is the first one's)."""
    states = [copy["obs_statistics"] for copy in copies]
    if len(states) == 1:
        return states[0]
    stacked = {name: torch.stack([state[name] for state in states]) for name in ("mean", "var")}
    return {**stacked, "count": states[0]["count"]}
