"""benchmarks/vs_cleanrl.py: the commands it runs set what it compares (phalanx's v5 preset on the v4 id;
flags CleanRL's own scripts accept), and what it reads back from the runs (CleanRL's printed lines,
phalanx's evaluations) gives the numbers it reports. The runs take minutes to hours and CleanRL's
virtualenv: they are not run here."""

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest

from phalanx.cli import parse_train_args
from phalanx.config import presets

ROOT = Path(__file__).resolve().parents[1]


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vs_cleanrl():
    return load_module("vs_cleanrl", ROOT / "benchmarks" / "vs_cleanrl.py")


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_phalanx_runs_the_v4_id_with_the_v5_preset(vs_cleanrl, algo, tmp_path):
    config_file = vs_cleanrl.write_preset_config(algo, "Hopper-v4", tmp_path)
    arguments = vs_cleanrl.phalanx_arguments(
        algo,
        "Hopper-v4",
        seed=2,
        steps=6_000,
        learning_starts=1_000,
        eval_every=2_048,
        threads=1,
        config=config_file,
        run_dir=tmp_path / "run",
    )
    config = parse_train_args(arguments[1:])  # without "train"
    preset = presets(algo)["Hopper-v5"]
    assert (config.algo, config.env, config.seed, config.total_steps) == (algo, "Hopper-v4", 2, 6_000)
    assert (config.num_envs, config.num_workers) == (preset["num_envs"], preset["num_workers"])
    assert (config.eval_every, config.eval_episodes, config.torch_threads) == (2_048, 5, 1)
    for name, value in preset["hyperparameters"].items():
        expected = 1_000 if name == "learning_starts" else value
        actual = getattr(config.hyperparameters, name)
        assert (list(actual) if isinstance(actual, tuple) else actual) == expected, name
    if algo == "ppo":
        assert config.normalize_obs and config.normalize_reward
        assert "--learning-starts" not in arguments  # SAC's warm-up only


@pytest.mark.filterwarnings("ignore:The field .* is annotated with type:UserWarning")  # CleanRL's Args
@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_cleanrl_scripts_accept_the_flags_given(vs_cleanrl, algo, monkeypatch):
    tyro = pytest.importorskip("tyro")
    pytest.importorskip("torch.utils.tensorboard")
    checkout = vs_cleanrl.peer_checkout("cleanrl")
    if not (checkout / vs_cleanrl.CLEANRL_SCRIPTS[algo]).is_file():
        pytest.skip(f"no CleanRL checkout at {checkout} (benchmarks/vs_cleanrl.py says how to clone it)")
    monkeypatch.syspath_prepend(str(checkout))  # the SAC script's cleanrl_utils
    script = load_module(f"cleanrl_{algo}", checkout / vs_cleanrl.CLEANRL_SCRIPTS[algo])  # no __main__ run
    command = vs_cleanrl.cleanrl_command(
        "python", algo, "Walker2d-v4", seed=3, steps=6_000, learning_starts=1_000
    )
    parsed = tyro.cli(script.Args, args=command[2:])
    assert (parsed.env_id, parsed.seed, parsed.total_timesteps, parsed.cuda) == (
        "Walker2d-v4",
        3,
        6_000,
        False,
    )
    if algo == "sac":
        assert parsed.learning_starts == 1_000
    else:
        assert (parsed.num_envs * parsed.num_steps) == vs_cleanrl.CLEANRL_PPO_BATCH
        assert vs_cleanrl.cleanrl_steps("ppo", 10_000) == 8_192  # whole updates of 2,048 steps


def test_cleanrl_timed_output_gives_its_clock_and_the_final_window_return(vs_cleanrl):
    # PPO, 10,240 steps: SPS after each update of 2,048 steps; its clock started 3.0 s into its process
    # (imports, envs), and it ran at exactly 200 steps/s, so SPS (truncated) reads 200 at every update
    start = 3.0
    lines = [(start + 2048 * k / 200 - 0.001, "SPS: 200") for k in range(1, 6)]
    lines += [
        (start + 5.0, "global_step=1000, episodic_return=[-300.5]"),
        (start + 45.0, "global_step=9215, episodic_return=[100.]"),  # before the last 10%: left out
        (start + 46.1, "global_step=9216, episodic_return=[200.]"),
        (start + 51.0, "global_step=10000, episodic_return=400.0"),
        (start + 51.1, "a line of something else"),
    ]
    lines.sort()
    parsed = vs_cleanrl.parse_cleanrl(lines, "ppo", steps=10_240, learning_starts=None, exit_s=start + 51.3)
    assert parsed["setup_s"] == pytest.approx(start, abs=0.01)
    assert parsed["wall_time_s"] == pytest.approx(51.3, abs=0.01)
    assert parsed["own_clock_steps_per_s"] == pytest.approx(10_240 / 51.3, rel=1e-3)
    assert (parsed["episodes"], parsed["final_episodes"]) == (4, 2)
    assert parsed["final_return"] == pytest.approx(300.0)
    assert parsed["episode_returns"][0] == [1000, pytest.approx(5.0, abs=0.01), -300.5]
    failed = vs_cleanrl.parse_cleanrl([(1.0, "Traceback ...")], "ppo", 10_240, None, exit_s=1.5)
    assert failed["wall_time_s"] is None


def test_cleanrl_sac_prints_its_speed_every_100_steps_once_it_learns(vs_cleanrl):
    assert list(itertools.islice(vs_cleanrl.sps_steps("sac", None), 3)) == [5_100, 5_200, 5_300]
    assert list(itertools.islice(vs_cleanrl.sps_steps("sac", 1_000), 2)) == [1_100, 1_200]
    assert list(itertools.islice(vs_cleanrl.sps_steps("ppo", 1_000), 2)) == [2_048, 4_096]
    # the start bound of a slow SAC: 5,100 steps in 100.0 s and 5,200 in 102.0 s -> SPS 51, 50
    lines = [(7.0 + 100.0, "SPS: 51"), (7.0 + 102.0, "SPS: 50")]
    parsed = vs_cleanrl.parse_cleanrl(lines, "sac", steps=5_250, learning_starts=None, exit_s=110.0)
    assert parsed["setup_s"] == pytest.approx(7.0, abs=0.05) and parsed["start_uncertainty_s"] < 2.0


def test_phalanx_run_files_give_its_curves_and_final_returns(vs_cleanrl, tmp_path):
    summary = {
        "total_steps": 10_000,
        "wall_time_s": 50.0,
        "steps_per_second": 200.0,
        "eval_return_mean": 900.0,
        "best_eval_return": 1000.0,
        "best_eval_steps": 5_000,
        "error": None,
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "evaluations.csv").write_text(
        "steps,wall_time_s,eval_return_mean,eval_return_std,eval_length_mean,result_wall_time_s\n"
        "5000,20.0,1000.0,5.0,1000.0,24.0\n"
        "10000,46.0,900.0,5.0,1000.0,50.0\n"
    )
    (tmp_path / "metrics.csv").write_text(
        "steps,wall_time_s,episodes,episode_return_mean\n"
        "2000,8.0,0,\n"  # no episode ended: not on the training curve
        "8000,35.0,4,100.0\n"
        "9008,40.0,1,300.0\n"  # the last 10%: episodes weighted by their counts
        "10000,46.0,3,500.0\n"
    )
    parsed = vs_cleanrl.parse_phalanx(tmp_path, steps=10_000)
    assert (parsed["steps"], parsed["wall_time_s"], parsed["final_return"], parsed["best_return"]) == (
        10_000,
        50.0,
        900.0,
        1000.0,
    )
    assert parsed["evaluations"] == [[5000.0, 20.0, 1000.0], [10000.0, 46.0, 900.0]]
    assert [row[0] for row in parsed["training_returns"]] == [8000.0, 9008.0, 10000.0]
    assert parsed["final_training_episodes"] == 4
    assert parsed["final_training_return"] == pytest.approx((300.0 + 3 * 500.0) / 4)


def test_time_ratio_is_phalanx_first_time_at_cleanrl_return_over_cleanrl_time(vs_cleanrl):
    cleanrl = {"wall_time_s": 200.0, "final_return": 1500.0}
    phalanx = {
        "evaluations": [[20_000, 30.0, 900.0], [40_000, 50.0, 1500.0], [60_000, 70.0, 2000.0]],
        "training_returns": [[10_000, 20.0, 1000.0, 10], [60_000, 70.0, 1600.0, 10]],
    }
    pair = vs_cleanrl.compare(cleanrl, phalanx)
    assert (pair["time_to_cleanrl_return_s"], pair["steps_to_cleanrl_return"], pair["time_ratio"]) == (
        50.0,
        40_000,
        0.25,
    )
    assert (pair["training_time_to_cleanrl_return_s"], pair["training_time_ratio"]) == (70.0, 0.35)
    never = vs_cleanrl.compare({**cleanrl, "final_return": 2500.0}, phalanx)
    assert never["time_ratio"] is None and never["training_time_ratio"] is None
    assert vs_cleanrl.compare({"error": "exit 1"}, phalanx)["time_ratio"] is None


def test_median_ratio_counts_a_seed_that_never_reached_as_slowest(vs_cleanrl):
    def pairs(*ratios):
        return [{"cleanrl": {}, "phalanx": {}, "time_ratio": ratio} for ratio in ratios]

    assert vs_cleanrl.median_ratio(pairs(0.2, None, 0.4)) == 0.4
    assert vs_cleanrl.median_ratio(pairs(0.2, None, None)) is None
    assert (
        vs_cleanrl.median_ratio([{"cleanrl": {"error": "exit 1"}, "phalanx": {}, "time_ratio": None}]) is None
    )


def test_steps_are_one_budget_or_one_per_algorithm(vs_cleanrl):
    assert vs_cleanrl.parse_steps([], ["ppo", "sac"]) == {"ppo": 1_000_000, "sac": 300_000}
    assert vs_cleanrl.parse_steps(["20000"], ["ppo", "sac"]) == {"ppo": 20_000, "sac": 20_000}
    assert vs_cleanrl.parse_steps(["ppo=10240", "sac=6_000"], ["ppo", "sac"]) == {"ppo": 10_240, "sac": 6_000}
    assert vs_cleanrl.parse_steps(["sac=6000"], ["ppo"]) == {"ppo": 1_000_000}  # sac not run
    with pytest.raises(SystemExit, match="'td3' is not an algorithm of this benchmark"):
        vs_cleanrl.parse_steps(["td3=100"], ["ppo"])
    with pytest.raises(SystemExit, match="'1M' is not a whole number"):
        vs_cleanrl.parse_steps(["1M"], ["ppo"])


def test_v5_ids_are_refused_with_the_v4_id_to_use(vs_cleanrl):
    vs_cleanrl.check_envs(["HalfCheetah-v4", "Humanoid-v4"])
    with pytest.raises(SystemExit, match="no v5 ids: use Hopper-v4"):
        vs_cleanrl.check_envs(["Hopper-v5"])
    with pytest.raises(SystemExit, match="Choose from HalfCheetah-v4"):
        vs_cleanrl.check_envs(["CartPole-v1"])


@pytest.mark.parametrize("concurrent", [False, True])
def test_concurrent_runs_both_sides_of_a_pair_at_once(vs_cleanrl, monkeypatch, tmp_path, concurrent):
    import threading
    import time

    running, overlapped = set(), []
    lock = threading.Lock()

    def side(name):
        def run(*args, **kwargs):
            with lock:
                running.add(name)
            time.sleep(0.3)
            with lock:
                overlapped.append(len(running) == 2)
                running.discard(name)
            fields = {"wall_time_s": 1.0, "final_return": 1.0}
            return fields if name == "cleanrl" else {**fields, "evaluations": [[1.0, 100, 1.0]]}

        return run

    monkeypatch.setattr(vs_cleanrl, "peer_source", lambda *args: tmp_path)  # no CleanRL checkout needed
    monkeypatch.setattr(vs_cleanrl, "peer_python", lambda *args: Path(sys.executable))
    monkeypatch.setattr(vs_cleanrl, "env_check", lambda *args: {"observations": [[0.0]]})
    monkeypatch.setattr(vs_cleanrl, "same_trajectory", lambda ours, theirs: {"same": True})
    monkeypatch.setattr(vs_cleanrl, "run_cleanrl", side("cleanrl"))
    monkeypatch.setattr(vs_cleanrl, "run_phalanx", side("phalanx"))
    monkeypatch.setattr(vs_cleanrl, "compare", lambda cleanrl, phalanx: {"time_ratio": 1.0})
    monkeypatch.setattr(vs_cleanrl, "summaries", lambda pairs: {})
    monkeypatch.setattr(vs_cleanrl, "table", lambda pairs: "")
    monkeypatch.setattr(vs_cleanrl, "summary_table", lambda summary: "")
    output = tmp_path / "pairs.json"
    arguments = ["--algos", "sac", "--envs", "HalfCheetah-v4", "--seeds", "1", "--output", str(output)]
    vs_cleanrl.main(arguments + (["--concurrent"] if concurrent else []))
    assert any(overlapped) == concurrent
    recorded = json.loads(output.read_text())["pairs"]["sac HalfCheetah-v4 s1"]
    assert recorded["settings"]["concurrent"] == concurrent
