"""benchmarks/vs_pqn.py: the settings it gives phalanx are CleanRL pqn.py's defaults (read from the peer's
checkout, when there is one) and the shipped presets', they make a valid run of the same env steps, and
CleanRL's printed lines give the speed and final return it reports. The runs take minutes and the peer's
virtualenv: not run here."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

import phalanx
from phalanx.config import presets

ROOT = Path(__file__).resolve().parents[1]
CLEANRL_NAMES = {  # CleanRL's Args field -> what it is in phalanx's settings
    "learning_rate": "learning_rate",
    "update_epochs": "epochs",
    "anneal_lr": "anneal_lr",
    "gamma": "gamma",
    "start_e": "exploration_initial",
    "end_e": "exploration_final",
    "exploration_fraction": "exploration_fraction",
    "max_grad_norm": "max_grad_norm",
    "q_lambda": "q_lambda",
}


@pytest.fixture(scope="module")
def vs_pqn():
    spec = importlib.util.spec_from_file_location("vs_pqn", ROOT / "benchmarks" / "vs_pqn.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_pqn"] = module
    spec.loader.exec_module(module)
    return module


def cleanrl_defaults(vs_pqn) -> dict:
    """The defaults of the ``Args`` dataclass of CleanRL's pqn.py, read from its checkout (skips without
    one: CleanRL's code is not kept in this repository)."""
    script = vs_pqn.peer_checkout("cleanrl") / vs_pqn.CLEANRL_SCRIPT
    if not script.is_file():
        pytest.skip(f"no CleanRL checkout at {script.parents[1]} (benchmarks/vs_pqn.py says how to clone it)")
    tree = ast.parse(script.read_text())
    args = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args")
    return {
        node.target.id: ast.literal_eval(node.value)
        for node in args.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant)
    }


def test_the_settings_are_cleanrl_defaults(vs_pqn):
    cleanrl = cleanrl_defaults(vs_pqn)
    settings = vs_pqn.SETTINGS
    assert {ours: settings[ours] for ours in CLEANRL_NAMES.values()} == {
        ours: cleanrl[theirs] for theirs, ours in CLEANRL_NAMES.items()
    }
    assert (vs_pqn.NUM_ENVS, settings["horizon"]) == (cleanrl["num_envs"], cleanrl["num_steps"])
    assert settings["minibatch_size"] == vs_pqn.BATCH // cleanrl["num_minibatches"]
    assert cleanrl["total_timesteps"] == 500_000


def test_the_presets_are_the_settings(vs_pqn):
    for env in vs_pqn.ENVS:
        preset = presets("pqn")[env]
        assert preset["num_envs"] == vs_pqn.NUM_ENVS and preset["total_steps"] == 500_000
        assert {key: preset["hyperparameters"][key] for key in vs_pqn.SETTINGS} == vs_pqn.SETTINGS


def test_phalanx_settings_make_a_valid_run_of_whole_rollouts(vs_pqn, tmp_path):
    steps = vs_pqn.whole_rollouts(500_000)
    assert steps == 976 * 512
    settings = vs_pqn.phalanx_settings("Acrobot-v1", steps, seed=2, threads=1, compile=None)
    config = phalanx.make_config(
        settings.pop("algo"), settings.pop("env"), run_dir=str(tmp_path / "run"), **settings
    )
    config.validate()
    assert config.hyperparameters.minibatch_size == 128 and config.hyperparameters.layer_norm
    assert config.log_every == steps - vs_pqn.tail_start(steps) == 97 * 512  # the last 10%


def test_cleanrl_output_gives_its_last_speed_and_the_final_window_return(vs_pqn):
    steps = 10 * 512
    output = "\n".join(
        [
            "global_step=4000, episodic_return=[10.0]",  # before the last 10%: left out
            "SPS: 900",
            "global_step=4700, episodic_return=[30.0]",
            "global_step=5120, episodic_return=50.0",
            "SPS: 1024",
        ]
    )
    assert vs_pqn.cleanrl_result(output, steps) == {"steps": steps, "run_s": 5.0, "final_return": 40.0}
    assert vs_pqn.cleanrl_result("Traceback ...", steps) is None
