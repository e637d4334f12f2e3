"""Docs and examples are tested: the Python blocks of the README and of docs/ run, and so do the examples."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README_BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
ENV_GUIDE = ROOT / "docs" / "environments.md"
ENV_GUIDE_BLOCKS = re.findall(r"```python\n(.*?)```", ENV_GUIDE.read_text(), flags=re.S)
PARALLELISM_GUIDE = ROOT / "docs" / "parallelism.md"
PARALLELISM_BLOCKS = re.findall(r"```python\n(.*?)```", PARALLELISM_GUIDE.read_text(), flags=re.S)
POPULATION_GUIDE = ROOT / "docs" / "population.md"
POPULATION_BLOCKS = re.findall(r"```python\n(.*?)```", POPULATION_GUIDE.read_text(), flags=re.S)
MULTI_AGENT_GUIDE = ROOT / "docs" / "multi_agent.md"
MULTI_AGENT_BLOCKS = re.findall(r"```python\n(.*?)```", MULTI_AGENT_GUIDE.read_text(), flags=re.S)
CONTINUES = "# (continues the block above)"


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


def test_readme_links_the_environment_guide():
    assert "docs/environments.md" in (ROOT / "README.md").read_text()


def _block_header(code: str, key: str) -> list[str]:
    """The comma-separated values of a leading ``# key: a, b`` comment line of a docs block."""
    for line in code.splitlines():
        if not line.startswith("#"):
            break
        name, sep, values = line[1:].partition(":")
        if sep and name.strip() == key:
            return [value.strip() for value in values.split(",") if value.strip()]
    return []


def test_environment_guide_has_python_blocks():
    assert len(ENV_GUIDE_BLOCKS) >= 6


@pytest.mark.parametrize("index", range(len(ENV_GUIDE_BLOCKS)))
def test_environment_guide_python_block_runs(index, tmp_path, monkeypatch):
    """Blocks run as scripts (``__name__ == "__main__"``), in a temporary directory.

    A block that starts with ``# (continues the block above)`` runs after the block before it.
    ``# requires: mujoco, envpool`` skips a block unless those modules import (``cuda``: unless
    torch sees a CUDA GPU; ``jax-gpu``: unless JAX has a GPU backend). ``# file: NAME.py`` writes
    the block to that file and runs it with Python in a subprocess, for examples whose worker
    processes must re-import the script.
    """
    from phalanx.envs import registry

    code = ENV_GUIDE_BLOCKS[index]
    for previous in range(index - 1, -1, -1):  # prepend the blocks this one continues
        if not code.startswith(CONTINUES):
            break
        code = ENV_GUIDE_BLOCKS[previous] + code
    for requirement in _block_header(code, "requires"):
        if requirement == "cuda":
            if not torch.cuda.is_available():
                pytest.skip("needs a CUDA GPU")
        elif requirement == "jax-gpu":
            import phalanx.envs.jax  # noqa: F401 - sets JAX's GPU memory option before JAX starts

            jax = pytest.importorskip("jax", reason="jax is not installed")
            try:
                jax.devices("gpu")
            except RuntimeError:
                pytest.skip("jax has no GPU backend (pip install 'jax[cuda12]')")
        else:
            pytest.importorskip(requirement, reason=f"{requirement} is not installed")
    monkeypatch.chdir(tmp_path)  # runs/ goes to a temporary directory
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))  # register_env stays local
    file_name = _block_header(code, "file")
    if file_name:
        (tmp_path / file_name[0]).write_text(code)
        result = subprocess.run(
            [sys.executable, file_name[0]], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, f"{file_name[0]} failed:\n{result.stdout}\n{result.stderr}"
        return
    exec(compile(code, f"docs/environments.md python block {index}", "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("index", range(len(PARALLELISM_BLOCKS)))
def test_parallelism_guide_python_block_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/ goes to a temporary directory
    code = PARALLELISM_BLOCKS[index]
    exec(compile(code, f"docs/parallelism.md python block {index}", "exec"), {"__name__": "__main__"})


def test_population_guide_runs_top_to_bottom(tmp_path, monkeypatch):
    """Its blocks continue one another: run as one script, as a reader would paste them."""
    monkeypatch.chdir(tmp_path)  # populations/ goes to a temporary directory
    assert len(POPULATION_BLOCKS) >= 3 and all(CONTINUES in block for block in POPULATION_BLOCKS[1:])
    code = "\n".join(POPULATION_BLOCKS)
    exec(compile(code, "docs/population.md python blocks", "exec"), {"__name__": "__main__"})
    assert (tmp_path / "populations" / "cartpole-vectorized" / "best" / "config.yaml").is_file()


def test_population_guide_yaml_is_a_valid_population_config(tmp_path):
    from phalanx.population import PopulationConfig

    text = POPULATION_GUIDE.read_text()
    block = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)[0]
    (tmp_path / "population.yaml").write_text(block)
    PopulationConfig.from_yaml(tmp_path / "population.yaml").validate()


@pytest.mark.parametrize("index", range(len(MULTI_AGENT_BLOCKS)))
def test_multi_agent_guide_python_block_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = MULTI_AGENT_BLOCKS[index]
    exec(compile(code, f"multi_agent.md python block {index}", "exec"), {"__name__": f"marl_block_{index}"})


def test_multi_agent_guide_names_every_multi_agent_algorithm_and_env():
    from phalanx.algos import ALGORITHMS
    from phalanx.marl.registry import BUILTIN_IDS

    text = MULTI_AGENT_GUIDE.read_text()
    assert len(MULTI_AGENT_BLOCKS) >= 2 and "docs/multi_agent.md" in (ROOT / "README.md").read_text()
    for name, algorithm in ALGORITHMS.items():
        if algorithm.multi_agent:
            assert f"| `{name}` |" in text, name
    for env_id in BUILTIN_IDS:
        assert env_id.removesuffix("_continuous") in text, env_id


def test_readme_links_the_parallelism_guide():
    assert PARALLELISM_BLOCKS and "docs/parallelism.md" in (ROOT / "README.md").read_text()


def test_custom_vec_env_example_trains_and_deploys(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["custom_vec_env.py"])
    module = runpy.run_path(str(ROOT / "examples" / "custom_vec_env.py"), run_name="example")
    result = module["main"](["--total-steps", "20000", "--run-dir", str(tmp_path / "run")])
    assert result.summary["total_steps"] >= 20000
    assert (tmp_path / "run" / "summary.json").is_file()
