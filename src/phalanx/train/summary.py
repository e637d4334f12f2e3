"""summary.json: what a run did, read by people, benchmarks and tools."""

from __future__ import annotations

import json
from typing import Any

from phalanx.files import write_text_atomic
from phalanx.train.interrupts import received_signal
from phalanx.train.run import Run


def write_summary(trainer: Run, interrupted: bool, error: str | None = None) -> dict[str, Any]:
    """Write the run's summary.json (learner 0) and return it: its budget, timings, evaluations, how it
    ended."""
    state = trainer.state
    wall = state.stopwatch()
    evaluation = state.last_evaluation
    best = trainer.evaluator if evaluation else None  # learner 0's, which has evaluated
    summary = {
        "env": trainer.config.env,
        "algo": trainer.config.algo,
        "seed": trainer.config.seed,
        "num_envs": trainer.config.num_envs,
        "device": str(trainer.device),
        "total_steps": state.steps,
        "updates": trainer.learner.updates,
        "wall_time_s": wall,
        "steps_per_second": state.steps / max(wall, 1e-9),
        "compiled": state.compiled,
        "compile_time_s": state.compile_stopwatch(),
        "compile_decision": state.compile_decision,  # compile: null's choice, and why
        "stop_return": trainer.config.stop_return,
        "time_to_stop_return_s": state.time_to_stop_return,
        "eval_return_mean": evaluation.mean if evaluation else None,
        "eval_return_std": evaluation.std if evaluation else None,
        "eval_episodes": len(evaluation.returns) if evaluation else 0,
        "eval_steps": state.last_evaluation_step if evaluation else None,
        "best_eval_return": best.best_return if best is not None else None,
        "best_eval_steps": best.best_steps if best is not None else None,
        "buffer_bytes": trainer.buffer.nbytes,
        "stop_reason": state.stop_reason,  # stop_return, or what a hook's trainer.stop(reason) said
        "interrupted": interrupted,
        "signal": received_signal() if interrupted else None,  # SIGINT (Ctrl+C), SIGTERM; None: a request
        "error": error,
        "run_dir": str(trainer.run_dir),
        "latest_checkpoint": str(trainer.checkpoints.latest()) if trainer.checkpoints.latest() else None,
        **trainer.extra_summary(),
    }
    write_text_atomic(trainer.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
