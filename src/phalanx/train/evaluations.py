"""The evaluation hook: the deterministic policy evaluated every ``eval_every`` env steps, the best
evaluation kept as the best checkpoint, and the time it took to reach ``stop_return``.

Learner 0 evaluates (the other learners of a group keep the schedule only). With ``eval_process`` the
evaluation runs in a process of its own on a CPU copy of the agent while training goes on: a copy is
sent when an evaluation is due, and the results that came in are taken after every iteration, in step
order, each logged at the step of the weights it evaluated.
"""

from __future__ import annotations

from typing import Any

import torch

from phalanx.train.environments import to_device
from phalanx.train.evaluator import Evaluation, Evaluator
from phalanx.train.hooks import BuiltIn
from phalanx.train.run import Hook, Run


class Evaluations(BuiltIn):
    """Evaluates ``trainer``'s agent on schedule, records and logs every evaluation."""

    name = "evaluations"

    def __init__(self, trainer: Run) -> None:
        super().__init__(trainer, trainer.config.eval_every)
        self.trainer = trainer
        self.copies: dict[int, dict[str, Any]] = {}  # evaluation process: {steps: agent} sent to it

    def after_iteration(self, trainer: Run) -> None:
        if trainer.is_main and trainer.eval_process is None:
            self.log(self.evaluate())
        elif trainer.is_main:
            self.send_copy()

    def on_finish(self, trainer: Run, interrupted: bool) -> None:
        """Learner 0, at the end of a ``train`` that was neither interrupted nor stopped at
        ``stop_return``: the evaluations under way, and the final weights'."""
        if interrupted or not trainer.is_main or trainer.state.stop_reason == "stop_return":
            return
        if trainer.eval_process is not None:
            self.poll(wait=True)
            if trainer.state.last_evaluation_step != trainer.steps and not self.reached_stop_return():
                self.send_copy()
                self.poll(wait=True)
        elif trainer.state.last_evaluation_step != trainer.steps:
            self.log(self.evaluate())

    def evaluate(self) -> dict[str, float]:
        """Evaluate the current weights in this process (no evaluation process)."""
        trainer = self.trainer
        wall_time = trainer.stopwatch()
        assert isinstance(trainer.evaluator, Evaluator), "without an evaluation process, an Evaluator"
        return self.record(trainer.steps, wall_time, trainer.evaluator.evaluate(trainer.algorithm))

    def log(self, row: dict[str, float]) -> None:
        """An evaluation's row in evaluations.csv and TensorBoard, at the step of the weights evaluated."""
        trainer = self.trainer
        self.reached_stop_return()
        trainer.logger.log_evaluation({**row, "result_wall_time_s": trainer.stopwatch()})
        for hook in trainer.hooks:
            hook.on_evaluation(trainer, row)

    def send_copy(self) -> None:
        """Evaluation process: send it a CPU copy of the agent now (kept, to be the best checkpoint if its
        evaluation is the best)."""
        trainer = self.trainer
        agent = to_device(self.agent_state(), torch.device("cpu"), copy=True)
        assert trainer.eval_process is not None, "with an evaluation process"
        trainer.eval_process.submit(
            trainer.steps, {key: agent[key] for key in ("algorithm", "obs_statistics")}
        )
        self.copies[trainer.steps] = agent

    def poll(self, wait: bool = False) -> None:
        """Evaluation process: record and log its results that have arrived (``wait``: all), in step order,
        up to the first that reaches stop_return (training stops there)."""
        trainer = self.trainer
        process = trainer.eval_process
        assert process is not None, "with an evaluation process"
        results = process.wait() if wait else process.poll()
        for steps, evaluation in results:
            if not self.reached_stop_return():
                wall_time = self.copies[steps]["progress"]["wall_time_s"]
                self.log(self.record(steps, wall_time, evaluation))
        for steps in [steps for steps in self.copies if steps not in process.outstanding]:
            del self.copies[steps]  # evaluated, or skipped for newer ones

    def record(self, steps: int, wall_time: float, evaluation: Evaluation) -> dict[str, float]:
        """Take an evaluation of the weights of step ``steps`` (taken ``wall_time`` seconds into the run); a
        new best is saved as the best checkpoint. Returns its row of evaluations.csv."""
        trainer = self.trainer
        trainer.state.last_evaluation = evaluation
        trainer.state.last_evaluation_step = steps
        assert trainer.evaluator is not None, "learner 0 evaluates, and it has the evaluator"
        if trainer.evaluator.is_best(evaluation, steps):
            if trainer.eval_process is not None:
                agent = self.copies[steps]
                agent["progress"].update(best_eval_return=evaluation.mean, best_eval_steps=steps)
                trainer.checkpoints.save_best(agent)
            else:
                trainer.checkpoints.save_best(self.agent_state())
        return {
            "steps": steps,
            "wall_time_s": wall_time,
            "eval_return_mean": evaluation.mean,
            "eval_return_std": evaluation.std,
            "eval_length_mean": sum(evaluation.lengths) / len(evaluation.lengths),
            **trainer.evaluation_columns(evaluation),
        }

    def agent_state(self) -> dict[str, Any]:
        """The agent as it is evaluated now (a pipeline's worker thread paused, its steps consumed)."""
        trainer = self.trainer
        if trainer.group is not None:  # learner 0 alone: no drain (a collective); no statistics move then
            return trainer.agent_state()
        with trainer.collection.drained():  # the worker thread would move the observation statistics
            return trainer.agent_state()

    def results(self) -> Hook:
        """The hook that takes the evaluation process's results after every iteration (learner 0)."""
        return EvaluationResults(self)

    def reached_stop_return(self) -> bool:
        """Whether the last evaluation reached ``stop_return``; the first time, the time it took is noted."""
        trainer = self.trainer
        stop = trainer.config.stop_return
        if stop is None or trainer.last_evaluation is None or trainer.last_evaluation.mean < stop:
            return False
        state = trainer.state
        if state.time_to_stop_return is None:
            state.time_to_stop_return = trainer.stopwatch()
            trainer.logger.message(
                f"reached stop_return {stop:g}: eval return {trainer.last_evaluation.mean:.1f} of the "
                f"weights of step {state.last_evaluation_step:,} (result in at step {trainer.steps:,}, "
                f"after {state.time_to_stop_return:.1f} s)"
            )
        return True


class EvaluationResults(Hook):
    """With an evaluation process: the results that came in, taken after every iteration (learner 0)."""

    def __init__(self, evaluations: Evaluations) -> None:
        self.evaluations = evaluations

    def after_iteration(self, trainer: Run) -> None:
        if trainer.is_main and trainer.eval_process is not None:
            self.evaluations.poll()
