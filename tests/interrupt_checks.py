"""Ctrl+C or SIGTERM at many points of an update, run by test_interrupts.py in a subprocess of its own (it
sends itself the signal; a failure must not reach pytest's own handler):

    python interrupt_checks.py RUN_ROOT SIGNAL ALGO ...        # SIGNAL: SIGINT or SIGTERM

For each ALGO, `phalanx train` (the CLI's main) runs it again and again on a small problem; each time
this process sends itself SIGNAL in the middle of the learner's UPDATE-th update: at the k-th line of
phalanx's own code that the update runs, for several k spread over all of it and inside the window
where an ensemble critic is frozen for the actor's step (between set_critic_grad(False) and
set_critic_grad(True)). Each run must end as a Ctrl+C at the start of that update does (the
reference): exit code 128 + the signal's number (130, 143), "interrupted": true and the signal's name in
summary.json, a checkpoint step_<n> at the same step
that holds the same state, bit for bit (no half-made update, no update made twice); and
`phalanx resume` must go on from the last one (exit 0). Prints one JSON line per ALGO: the lines its
update ran and the offsets checked; exits 1 at the first failure.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

import phalanx
from phalanx.cli import main
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.learner import Learner

UPDATE = 4  # the update interrupted: with policy_delay 2 (TD3), an update with an actor step
SPREAD = 4  # offsets spread over the update, besides three in the frozen-critic window
SMALL = ["--num-envs", "4", "--total-steps", "100000", "--hidden-sizes", "16", "16", "--eval-every", "0",
         "--eval-episodes", "2", "--log-every", "1000000", "--torch-threads", "1", "--seed", "3"]  # fmt: skip
OFF_POLICY = ["--learning-starts", "32", "--batch-size", "16", "--buffer-size", "1000",
              "--updates-per-step", "0.5"]  # fmt: skip
CASES = {  # algo: env, flags (two updates per iteration off-policy)
    "dqn": ("CartPole-v1", OFF_POLICY),
    "double-dqn": ("CartPole-v1", OFF_POLICY),
    "dueling-dqn": ("CartPole-v1", OFF_POLICY),
    "d3qn": ("CartPole-v1", OFF_POLICY),
    "ddpg": ("Pendulum-v1", OFF_POLICY),
    "td3": ("Pendulum-v1", OFF_POLICY),
    "sac": ("Pendulum-v1", OFF_POLICY),
    "redq": ("Pendulum-v1", OFF_POLICY),
    "ppo": ("CartPole-v1", ["--horizon", "8", "--minibatch-size", "16", "--epochs", "2"]),
    "pqn": ("CartPole-v1", ["--horizon", "8", "--minibatch-size", "16", "--epochs", "2"]),
}
PHALANX = str(Path(phalanx.__file__).parent)


class Arm:
    """Wraps Learner.update: the UPDATE-th call sends ``stop`` at line ``offset`` of the update (0: before
    it starts); the first update that then runs is traced, to count its lines."""

    def __init__(self, stop: signal.Signals) -> None:
        self.stop = stop
        self.original = Learner.update
        self.offset = 0
        self.calls = 0
        self.lines: list[str] = []  # "file:line" of each line the traced update ran
        self.tracing = False
        Learner.update = lambda learner, progress: self.update(learner, progress)  # type: ignore[method-assign]

    def reset(self, offset: int) -> None:
        self.offset, self.calls, self.lines, self.tracing = offset, 0, [], False

    def update(self, learner: Learner, progress: float) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.calls == UPDATE:
            self.tracing = True
            if self.offset == 0:
                os.kill(os.getpid(), self.stop)
        if not self.tracing:
            return self.original(learner, progress)
        self.tracing = False  # one update
        sys.settrace(self.trace)
        try:
            return self.original(learner, progress)
        finally:
            sys.settrace(None)

    def trace(self, frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(PHALANX):
            return None
        if event == "line":
            self.lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            if len(self.lines) == self.offset:
                os.kill(os.getpid(), self.stop)  # lands on this line, or the next few bytecodes
        return self.trace


def frozen_lines(lines: list[str]) -> list[int]:
    """The offsets (1-based) of the first, a middle and the last line run while the critic is frozen for
    the actor's step (none if the algorithm has no such window)."""
    frozen, inside = [], False
    for index, where in enumerate(lines, start=1):
        path, number = where.rsplit(":", 1)
        text = Path(path).read_text().splitlines()[int(number) - 1]
        if "set_critic_grad(True)" in text:
            inside = False
        if inside:
            frozen.append(index)
        if "set_critic_grad(False)" in text:
            inside = True
    return sorted({frozen[0], frozen[len(frozen) // 2], frozen[-1]}) if frozen else []


def flatten(state: Any, prefix: str = "") -> dict[str, Any]:
    """A nested state as {"a.b.c": leaf}."""
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in flatten(value, f"{prefix}.{key}").items()}
    return {prefix.lstrip("."): state}


def same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys where two flattened states differ."""
    differ = [key for key in a.keys() | b.keys() if key not in a or key not in b]
    for key in a.keys() & b.keys():
        x, y = a[key], b[key]
        equal = torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        if not equal:
            differ.append(key)
    return sorted(differ)


def run(arguments: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(arguments)
    if code not in (0, 130, 143):
        print(err.getvalue()[-3000:], file=sys.stderr)
    return code


def check(arm: Arm, algo: str, root: Path) -> dict[str, Any]:
    env, flags = CASES[algo]

    def interrupted_run(offset: int) -> tuple[Path, int, dict[str, Any]]:
        arm.reset(offset)
        run_dir = root / f"{algo}_{offset}"
        code = run(["train", algo, env, *SMALL, *flags, "--run-dir", str(run_dir)])
        where = f"{algo}, {arm.stop.name} at line {offset} of update {UPDATE}"
        assert code == 128 + arm.stop, f"{where}: exit code {code}, not {128 + arm.stop}"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["interrupted"] is True and summary["error"] is None, f"{where}: {summary}"
        assert summary["signal"] == arm.stop.name, f"{where}: {summary}"
        steps = summary["total_steps"]
        checkpoint = run_dir / "checkpoints" / f"step_{steps}"
        assert checkpoint.is_dir(), f"{where}: no {checkpoint}"
        return (
            run_dir,
            steps,
            flatten({k: v for k, v in load_checkpoint(checkpoint).items() if k != "config"}),
        )

    _, reference_steps, reference = interrupted_run(0)
    lines = arm.lines
    assert lines, f"{algo}: update {UPDATE} was never made after a Ctrl+C at its start (its data lost)"
    offsets = sorted({*range(1, len(lines) + 1, max(1, len(lines) // SPREAD)), *frozen_lines(lines)})
    for offset in offsets:
        run_dir, steps, state = interrupted_run(offset)
        where = f"{algo}, {arm.stop.name} at line {offset} of update {UPDATE} ({lines[offset - 1]})"
        assert steps == reference_steps, f"{where}: stopped at step {steps}, not {reference_steps}"
        differ = [key for key in same(state, reference) if key != "progress.wall_time_s"]
        assert not differ, f"{where}: the checkpoint differs from the reference in {differ[:5]}"
    total = reference_steps + 64
    code = run(["resume", str(run_dir), "--total-steps", str(total)])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and summary["total_steps"] == total and not summary["interrupted"], f"{where}: resume"
    return {"algo": algo, "lines": len(lines), "offsets": offsets}


if __name__ == "__main__":
    root, stop, *algos = sys.argv[1:]
    arm = Arm(signal.Signals[stop])
    for algo in algos:
        print(json.dumps(check(arm, algo, Path(root))), flush=True)
