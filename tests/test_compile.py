"""Compiled execution, run level: the flags and config values, the auto rule, the timing of compiles, and
a compiled PPO run against the eager reference (close parameters, exact resume within compiled mode)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from test_training import parameters, small_config

import phalanx
from phalanx import compiling
from phalanx.cli import parse_population_args, parse_train_args
from phalanx.compiling import compile_problem, compiled, should_compile
from phalanx.errors import ConfigError
from phalanx.train.trainer import Trainer

CPU = torch.device("cpu")
needs_compiler = pytest.mark.skipif(
    compile_problem(CPU) is not None, reason=f"torch.compile cannot run here: {compile_problem(CPU)}"
)


@pytest.mark.parametrize("flags, value", [([], None), (["--compile"], True), (["--no-compile"], False)])
def test_compile_flags(flags, value):
    assert parse_train_args(["ppo", "CartPole-v1", *flags]).compile is value
    population = parse_population_args(["ppo", "CartPole-v1", "--size", "2", *flags])
    assert population.base.compile is value


def test_compile_flag_takes_no_value():
    with pytest.raises(SystemExit):
        parse_train_args(["ppo", "CartPole-v1", "--compile", "True"])


@pytest.mark.parametrize("text, value", [("true", True), ("false", False), ("null", None)])
def test_compile_in_a_config_file(tmp_path, text, value):
    path = tmp_path / "run.yaml"
    path.write_text(f"compile: {text}\n")
    assert parse_train_args(["ppo", "CartPole-v1", "--config", str(path)]).compile is value
    assert parse_train_args(["ppo", "CartPole-v1", "--config", str(path), "--no-compile"]).compile is False


def test_a_bad_compile_value_names_the_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("compile: maybe\n")
    with pytest.raises(ConfigError, match=r"compile = 'maybe' \(str\) is not true, false or null"):
        parse_train_args(["ppo", "CartPole-v1", "--config", str(path)])
    config = phalanx.make_config("ppo", "CartPole-v1")
    config.compile = "yes"
    with pytest.raises(ConfigError, match=r"compile = 'yes' is invalid: expected true, false or null"):
        config.validate()


def test_without_a_cpp_compiler_compile_true_says_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert compile_problem(CPU) is not None
    with pytest.raises(ConfigError, match=r"no C\+\+ compiler.*apt-get install g\+\+.*--no-compile"):
        should_compile(True, CPU)
    assert should_compile(None, CPU) is False and should_compile(False, CPU) is False
    with pytest.raises(ConfigError, match="no C\\+\\+ compiler"):
        Trainer(small_config(tmp_path, compile=True), show_progress=False)
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_auto_compiles_on_cuda_only():
    assert should_compile(None, CPU) is False
    if compile_problem(CPU) is None:
        assert should_compile(True, CPU) is True


def test_the_first_call_of_a_compiled_function_is_timed(monkeypatch):
    """The timing around torch.compile's result: the first call (where torch compiles) counts, later
    calls do not (torch.compile replaced by a function whose first call takes 0.2 s, so no compile)."""
    calls = []

    def slow_first_call(function, **options):
        def run(*args):
            if not calls:
                time.sleep(0.2)
            calls.append(args)
            return function(*args)

        return run

    monkeypatch.setattr(compiling.torch, "compile", slow_first_call)
    before = compiling.compile_seconds()

    def double(x):
        """Twice x."""
        return 2 * x

    function = compiled(double)
    assert function.__name__ == "double" and function.__doc__ == "Twice x."
    assert function(3) == 6 and compiling.compile_seconds() - before >= 0.2
    first = compiling.compile_seconds()
    assert function(4) == 8 and compiling.compile_seconds() == first
    assert len(calls) == 2


def test_cpu_graphs_get_a_cpp_wrapper_and_starting_a_compiled_run_starts_no_thread(monkeypatch):
    """On a CPU each graph is compiled with inductor's C++ wrapper (a CUDA tensor would get torch's
    default). Resolving compile = True starts nothing in the background: a thread of the compiler alive
    when the run forks its evaluation process hung runs (its subprocess pipes, then filelock's fork gate)."""
    options = []

    def record(function, **kwargs):
        options.append(kwargs.get("options"))
        return function

    monkeypatch.setattr(compiling.torch, "compile", record)
    monkeypatch.setattr(compiling, "compile_problem", lambda device: None)  # a machine without g++ too
    threads = set(threading.enumerate())
    assert compiling.should_compile(True, CPU) is True
    assert set(threading.enumerate()) == threads
    add_one = compiled(lambda x: x + 1)
    assert add_one(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert options == [{**compiling.CPU_OPTIONS, **compiling.cpu_isa_options()}]
    assert options[0]["cpp_wrapper"] is True


def test_vector_isa_probes_are_skipped_only_where_they_cannot_fail(monkeypatch, tmp_path):
    """inductor trusts the CPU's flags (no probe builds) on x86 without AMX, and probes where the flags
    need a newer compiler (AMX), off x86, or where the user set TORCHINDUCTOR_VEC_ISA_OK."""
    import builtins

    real_open = builtins.open

    def machine(flags: str | None, arch: str = "x86_64", variable: str | None = None) -> dict:
        compiling.cpu_isa_options.cache_clear()
        monkeypatch.setattr(compiling.platform, "machine", lambda: arch)
        if variable is None:
            monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", variable)
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text(f"processor : 0\nflags : {flags}\n" if flags is not None else "")

        def fake_open(path, *args, **kwargs):
            return real_open(cpuinfo if path == "/proc/cpuinfo" else path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", fake_open)
        try:
            return compiling.cpu_isa_options()
        finally:
            monkeypatch.setattr(builtins, "open", real_open)
            compiling.cpu_isa_options.cache_clear()

    assert machine("fpu sse avx avx2 fma avx512f") == {"cpp.vec_isa_ok": True}
    assert machine("fpu avx2 avx512f amx_tile amx_bf16") == {}
    assert machine("fpu avx2", arch="aarch64") == {}
    assert machine("fpu avx2", variable="0") == {}
    assert machine(None) == {}  # no flags line: probe


@needs_compiler
def test_tanh_compiled_for_a_cpu_is_tanh_within_2e_7():
    """CPU graphs compute tanh as 2 / (1 + exp(-2x)) - 1 (3x faster than the library tanh): within 2e-7 of
    float64 tanh over the float range, never above 1 in magnitude, +-1 at +-inf, NaN at NaN; its gradient
    through torch.func.grad (as the compiled updates take it) is 1 - tanh**2."""
    x = torch.cat([torch.linspace(-12.0, 12.0, 200_001), torch.logspace(-30, 1.5, 2_000)])
    x = torch.cat([x, -x, torch.tensor([0.0, 1e4, float("inf"), float("-inf"), float("nan")])])
    y = compiled(torch.tanh)(x)
    finite = slice(0, -1)
    assert (y[finite].double() - torch.tanh(x[finite].double())).abs().max().item() < 2e-7
    assert y[finite].abs().max().item() <= 1.0 and y[-5:-1].tolist() == [0.0, 1.0, 1.0, -1.0]
    assert y[-1].isnan()
    assert not torch.equal(y, torch.tanh(x)), "the compiled graph should compute tanh the fast way"

    points, weights = torch.linspace(-6.0, 6.0, 1_001), torch.linspace(-1.0, 1.0, 1_001)
    gradient = compiled(torch.func.grad(lambda inputs: (torch.tanh(inputs) * weights).sum()))(points)
    expected = weights * (1 - torch.tanh(points.double()) ** 2)
    torch.testing.assert_close(gradient.double(), expected, atol=5e-7, rtol=0)


# -- a compiled PPO run against the eager reference ---------------------------------------------------
# 8 envs x 16 steps: 128 env steps per update, 2 epochs of 2 minibatches. A large learning rate, so that
# one Adam step moves a weight by ~1e-2 and a compiled update that computes anything else than the eager
# one shows far above the tolerance, while float rounding stays orders of magnitude below it.
UPDATE = 128
SETTINGS = dict(eval_every=0, log_every=UPDATE, learning_rate=1e-2, seed=5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An eager and a compiled run of two updates, the compiled one resumed to four, and a compiled run of
    four straight: the compiled functions are shared by the runs of this process."""
    tmp_path = tmp_path_factory.mktemp("compiled")
    eager = phalanx.train(
        small_config(tmp_path, "eager", total_steps=2 * UPDATE, compile=False, **SETTINGS),
        show_progress=False,
    )
    half = phalanx.train(
        small_config(tmp_path, "half", total_steps=2 * UPDATE, compile=True, **SETTINGS), show_progress=False
    )
    half_parameters = parameters(half.run_dir)
    resumed = phalanx.resume(half.run_dir, total_steps=4 * UPDATE, show_progress=False)
    straight = phalanx.train(
        small_config(tmp_path, "straight", total_steps=4 * UPDATE, compile=True, **SETTINGS),
        show_progress=False,
    )
    return {
        "eager": eager,
        "half": half,
        "half_parameters": half_parameters,
        "resumed": resumed,
        "straight": straight,
    }


@needs_compiler
def test_a_compiled_run_says_what_it_compiled_and_how_long_it_took(runs):
    eager, compiled_run = runs["eager"].summary, runs["half"].summary
    assert eager["compiled"] == [] and eager["compile_time_s"] == 0.0
    assert all(isinstance(name, str) for name in compiled_run["compiled"])
    assert (compiled_run["compile_time_s"] > 0) == bool(compiled_run["compiled"])
    assert compiled_run["compile_time_s"] <= compiled_run["wall_time_s"]
    on_disk = json.loads((runs["half"].run_dir / "summary.json").read_text())
    assert on_disk["compiled"] == compiled_run["compiled"]


@needs_compiler
def test_compiled_updates_match_the_eager_ones(runs):
    eager, compiled_run = parameters(runs["eager"].run_dir), runs["half_parameters"]
    for name, value in eager.items():
        torch.testing.assert_close(compiled_run[name], value, rtol=0, atol=1e-4, msg=name)


@needs_compiler
def test_a_compiled_run_resumes_exactly(runs):
    resumed, straight = runs["resumed"], runs["straight"]
    assert resumed.summary["total_steps"] == straight.summary["total_steps"] == 4 * UPDATE
    assert resumed.summary["compiled"] == straight.summary["compiled"]
    assert resumed.summary["compile_time_s"] >= runs["half"].summary["compile_time_s"]  # summed over both
    a, b = parameters(straight.run_dir), parameters(resumed.run_dir)
    assert all(torch.equal(a[name], b[name]) for name in a), "resumed parameters differ from the straight run"


@pytest.mark.parametrize(("cost", "compiles"), [(0.0, True), (1e9, False)])
def test_compile_null_times_the_run_and_compiles_only_where_it_pays(tmp_path, monkeypatch, cost, compiles):
    """compile: null starts eagerly, times a few iterations, and compiles for the rest when the eager time
    left, times the saving, is more than a compile costs (here made free, or endless); it says why."""
    import phalanx
    from phalanx.train.hooks import CompileWhenItPays
    from phalanx.train.trainer import Trainer

    monkeypatch.setitem(compiling.COMPILE_ECONOMICS, "cpu", (cost, 2.0))
    calls = []
    monkeypatch.setattr(Trainer, "compile", lambda self: calls.append(self.steps) or ["(recorded)"])
    monkeypatch.setattr(CompileWhenItPays, "MEASURE_SECONDS", 0.0)
    config = phalanx.make_config(
        "ppo", "CartPole-v1", use_preset=False, num_envs=4, horizon=32, minibatch_size=64, epochs=1,
        total_steps=128 * 12, eval_every=0, eval_episodes=1, run_dir=str(tmp_path / "run"),
    )  # fmt: skip
    summary = phalanx.train(config, show_progress=False).summary
    assert summary["compile_decision"].startswith("compiled at step 512" if compiles else "eager: ~")
    assert "s to compile on cpu" in summary["compile_decision"]
    assert calls == ([512] if compiles else [])  # after the warm-up iteration and 3 timed ones
    assert summary["compiled"] == (["(recorded)"] if compiles else [])


def test_a_process_ending_with_os_exit_stops_the_compile_workers_torch_started(monkeypatch):
    """Learners end with os._exit, which skips torch's atexit shutdown of its compile-worker pool (whose
    semaphores multiprocessing then reports as leaked): stop_compile_workers shuts it down, and imports
    nothing where torch's compiler never ran."""
    import sys
    import types

    stopped = []
    fake = types.SimpleNamespace(shutdown_compile_workers=lambda: stopped.append(True))
    monkeypatch.setitem(sys.modules, "torch._inductor.async_compile", fake)
    compiling.stop_compile_workers()
    assert stopped == [True]
    monkeypatch.delitem(sys.modules, "torch._inductor.async_compile")
    compiling.stop_compile_workers()
    assert stopped == [True] and "torch._inductor.async_compile" not in sys.modules
