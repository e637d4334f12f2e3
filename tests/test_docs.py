"""Docs and examples are tested: every Python block of the README runs, and so do the examples."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert len(README_BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(README_BLOCKS)))
def test_readme_python_block_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/ goes to a temporary directory
    code = README_BLOCKS[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": f"readme_block_{index}"})


def test_readme_names_exactly_the_two_setup_commands_first():
    first_block = (ROOT / "README.md").read_text().split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_custom_vec_env_example_trains_and_deploys(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["custom_vec_env.py"])
    module = runpy.run_path(str(ROOT / "examples" / "custom_vec_env.py"), run_name="example")
    result = module["main"](["--total-steps", "20000", "--run-dir", str(tmp_path / "run")])
    assert result.summary["total_steps"] >= 20000
    assert (tmp_path / "run" / "summary.json").is_file()
