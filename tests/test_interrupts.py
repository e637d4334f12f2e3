"""Ctrl+C never leaves an algorithm half-updated: SIGINT at many points of an update, for every
off-policy algorithm and PPO, ends as a Ctrl+C between updates does (see interrupt_checks.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from interrupt_checks import CASES  # noqa: E402


def test_sigint_anywhere_in_an_update_saves_a_whole_state_that_resumes(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(TESTS / "interrupt_checks.py"), str(tmp_path), *CASES],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr[-4000:]
    checked = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [c["algo"] for c in checked] == list(CASES)
    for c in checked:
        assert len(c["offsets"]) >= 4, c  # spread over the update (and the frozen-critic window)
