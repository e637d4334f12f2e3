"""Ctrl+C and SIGTERM never leave an algorithm half-updated: the signal at many points of an update, for
every off-policy algorithm and PPO, ends as one between updates does (see interrupt_checks.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from interrupt_checks import CASES  # noqa: E402


# SIGTERM goes through the same handler as SIGINT: an on-policy and an off-policy update are enough for it.
@pytest.mark.parametrize(
    ("stop", "algos"),
    [("SIGINT", list(CASES)), ("SIGTERM", ["ppo", "sac"])],
    ids=["int", "term"],
)
def test_a_stop_signal_anywhere_in_an_update_saves_a_whole_state_that_resumes(tmp_path, stop, algos):
    completed = subprocess.run(
        [sys.executable, str(TESTS / "interrupt_checks.py"), str(tmp_path), stop, *algos],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr[-4000:]
    checked = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [c["algo"] for c in checked] == algos
    for c in checked:
        assert len(c["offsets"]) >= 4, c  # spread over the update (and the frozen-critic window)
