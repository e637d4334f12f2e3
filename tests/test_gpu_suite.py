"""benchmarks/gpu_suite.py, the one command that takes every GPU figure in a short lease: its smoke run on a
CPU writes every section with figures or the reason a figure is missing, and its time boxes keep what
was taken and record the rest as not taken (never estimated)."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_suite.py"
# The figure each part's rows carry when they were taken.
FIGURES = {
    "env_throughput": "env_steps_per_second",
    "ppo_training": "steady_steps_per_second",
    "population": "wall_time_ratio",
    "ensemble_critics": "speedup",
    "time_to_solve": "reached",
    "vs_purejaxrl": "process_s",
    "offpolicy_mujoco": "env_steps_per_second",
}


def load_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_suite"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def suite():
    return load_suite()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The JSON of ``gpu_suite.py --smoke --device cpu`` (one run for the module)."""
    directory = tmp_path_factory.mktemp("gpu_suite")
    path = directory / "gpu_suite.json"
    # TMPDIR: the suite's logs and the runs' directories go under pytest's temporary directory too.
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(directory)}
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads(path.read_text()), completed.stdout


def test_smoke_run_writes_every_section_with_figures_or_reasons(suite, smoke):
    result, stdout = smoke
    assert set(result["sections"]) == set(suite.PARTS)
    for name in suite.PARTS:
        section = result["sections"][name]
        assert section["status"] == "done", (name, section)
        assert section["rows"], name
        for row in section["rows"]:
            reasons = [key for key in ("not_taken", "not_available", "error") if key in row]
            if name == "device":
                assert not reasons, row
                continue
            if row.get("library") == "PureJaxRL" and "not_available" in row:  # no peer virtualenv here
                assert "PureJaxRL virtualenv" in row["not_available"], row
                continue
            if row.get("mode", "eager") == "eager":  # what --smoke runs on a CPU must work there
                assert not reasons and FIGURES[name] in row, (name, row)
            else:  # compiled: --smoke does not compile unless --modes says so
                assert row["not_taken"].startswith("mode not requested"), row
    assert result["device_name"] == "no GPU (CPU)"
    assert "### env_throughput (done)" in stdout and "| 256 | eager |" in stdout


def test_time_box_keeps_the_figures_taken_and_marks_the_rest_not_taken(suite, monkeypatch):
    monkeypatch.setattr(suite, "MIN_PART_S", 0.0)

    def measure(part):
        part.take(part.plan(figure=1), 0, lambda: {"value": 1.0})
        part.take(part.plan(figure=2), 0, lambda: {"value": 1 / 0})
        part.take(part.plan(figure=3), 60, lambda: {"value": 3.0})
        slow = part.plan(figure=4)
        part.plan(figure=5)
        part.take(slow, 0, time.sleep, 5)

    started = time.perf_counter()
    section = suite.run_part(measure, 0.5, time.perf_counter() + 100)
    assert time.perf_counter() - started < 3
    assert section["status"] == "timed out" and "ran out" in section["note"]
    taken, failed, skipped, cut, never = section["rows"]
    assert taken == {"figure": 1, "value": 1.0}
    assert failed["error"] == "ZeroDivisionError: division by zero" and "1 / 0" in failed["traceback"]
    assert skipped["not_taken"].startswith("skipped:")
    assert cut["not_taken"] == "the part's time box ran out while taking this figure"
    assert never["not_taken"] == "the part's time box ran out before this figure"


def test_a_part_without_time_left_is_skipped_and_a_failing_part_is_recorded(suite):
    skipped = suite.run_part(lambda part: None, 100, time.perf_counter() + 1)
    assert skipped["status"] == "skipped" and skipped["note"].startswith("not taken:")

    def broken(part):
        raise ModuleNotFoundError("No module named 'gymnasium'")

    failed = suite.run_part(broken, 100, time.perf_counter() + 100)
    assert failed["status"] == "error"
    assert failed["error"] == "ModuleNotFoundError: No module named 'gymnasium'"


def test_unknown_parts_are_refused_with_the_choices(suite):
    with pytest.raises(SystemExit, match="expected a comma-separated list of device, env_throughput"):
        suite.main(["--parts", "device,gpu"])
