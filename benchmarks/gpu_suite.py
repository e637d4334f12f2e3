r"""Every GPU figure the open issues ask for, in one time-boxed run of 8 minutes.

    PYTHONPATH=src python3 benchmarks/gpu_suite.py --json $OUT/gpu_suite.json     # on a lent GPU (below)
    PYTHONPATH=src python benchmarks/gpu_suite.py --smoke --device cpu            # tiny, on a CPU (<1 min)
    PYTHONPATH=src python3 benchmarks/gpu_suite.py --parts env_throughput,ppo_training --budget 300

A lent GPU runs one command of at most 10 minutes, so every figure is taken by this one command (after
the CUDA tests, ``pytest -m cuda``). The parts, in this order (each reuses the benchmark script named):

- ``device``: the GPU (name, compute capability, memory, multiprocessors), its driver (``nvidia-smi``),
  torch's CUDA and cuDNN versions, Triton, whether torch.compile can compile for the device, and the
  machine (``benchlib.machine_info``).
- ``env_throughput``: the built-in CartPole-v1 (``phalanx.envs.classic.CartPoleEnv``) at 2^16, 2^20,
  2^22 and 2^24 sub-envs, random actions drawn on the device each step (as ``env_throughput.py``), eager
  and compiled (``env.compile()``; its cost, the compile and the first step, is reported apart).
- ``ppo_training``: ``phalanx.train`` of PPO on CartPole-v1 at 4,096 and 65,536 envs, eager and compiled
  (``TrainConfig.compile``), the preset's hyperparameters with its number of minibatches per epoch, a
  short budget of rollouts: the summary's ``steps_per_second`` (wall time from the start of training,
  compile included) and its compile figures where it reports them, and the steady rate measured from
  the end of the first iteration to the end of the last (compile and warm-up excluded).
- ``population``: a vectorized population of 1,024 PPO members against one member, the same env steps
  each (``population_vectorized.compare``).
- ``ensemble_critics``: K = 2, 10, 50 critics as one batched network against a loop of K networks
  (``ensemble_critics.compare``).
- ``time_to_solve``: ``phalanx train ppo CartPole-v1 --stop-return 475`` and ``Pendulum-v1
  --stop-return -200`` with the shipped presets on the device (``benchlib.run_phalanx``, a subprocess
  each, as ``time_to_solve.py``), eager and compiled, seed 0.
- ``vs_purejaxrl``: PPO on CartPole-v1 at 1024 x 32 and 4096 x 16 envs x steps, 5M env steps, with
  ``vs_purejaxrl.py``'s hyperparameters: PureJaxRL's ``ppo.py`` unmodified with JAX on the GPU (its
  packages on ``--peer-pythonpath``, carried as wheels: below), against ``phalanx train ppo CartPole-v1
  --config FILE`` on the device, eager and compiled, each a fresh process (a user's wait: imports,
  setup, compile, training, the final evaluation).
- ``offpolicy_mujoco``: ``phalanx train sac|td3 HalfCheetah-v5`` with the shipped presets on the device
  for a short budget: the steady env and gradient steps/s once updates run (needs mujoco).
- ``playground``, only when ``--parts`` names it: PPO on MuJoCo Playground's CheetahRun at 4,096
  envs for 20 rollouts (``playground_ppo.py``): env steps per second and the return reached. It needs
  the playground extra and a CUDA build of jax on the machine, and records why when they are absent.

Every part has a time box (``PART_BUDGETS``, cut to what is left of ``--budget``) and is skipped with
a note when too little time is left; a part that runs out of time keeps the figures it took. Every
failure is caught and recorded as an error string in the JSON, and a figure not taken says why: none
is ever estimated. The JSON file is rewritten after every part, so a run killed at the command's limit
still leaves what it took; the markdown tables are printed at the end.

``--smoke`` runs every part at tiny sizes (eagerly unless ``--modes`` names compiled: a compile costs
tens of seconds on a CPU), to check the script without a GPU (tests/test_gpu_suite.py).

On the lent machine nothing installs from a registry, and its image lacks some of phalanx's
dependencies (gymnasium and tyro with their pure-Python dependencies, as of 2026-11; the ``device``
part lists what is missing). Carry them as wheels, as the device tool's README says: here, once,
``echo /.whl/ >> .git/info/exclude; python -m pip download --no-deps --only-binary=:all:
--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl gymnasium==1.4.0
farama-notifications==0.0.6 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1`` (750 kB); then
the same for mujoco (``offpolicy_mujoco``), and PureJaxRL's packages into ``.whl-pjx`` (distrax,
gymnax, brax, navix and what they import that the image lacks: BENCHMARKS.md's GPU section lists the
set used). Then one device call (carry ``.whl`` and ``.whl-pjx``, 600 s)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/peer-site .whl-pjx/*.whl; PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 \
        python3 benchmarks/gpu_suite.py --peer-pythonpath /tmp/peer-site --json $OUT/gpu_suite.json \
        2>&1 | tee $OUT/gpu_suite.log
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402
    machine_info,
    markdown_table,
    run_phalanx,
    run_phalanx_config,
    timed_steps,
    write_json,
)

PARTS = (
    "device",
    "env_throughput",
    "ppo_training",
    "population",
    "ensemble_critics",
    "time_to_solve",
    "vs_purejaxrl",
    "offpolicy_mujoco",
)
# Parts run only when --parts names them: ``playground`` needs the playground extra and JAX with a GPU
# backend, which the lent machine's image may lack (jax's CUDA wheels exceed what a call can carry).
OPTIONAL_PARTS = ("playground",)
MODES = ("eager", "compiled", "default")
# What each mode sets ``TrainConfig.compile`` to: "default" is what a user gets without the flag (null: the
# run starts eagerly and compiles if it pays, ``compiling.compile_pays``). The in-process parts (env
# throughput, PPO at 4,096 and 65,536 envs) take eager and compiled only.
COMPILE_SETTING = {"eager": False, "compiled": True, "default": None}
# Seconds each part may take at most, from what each took on an H200 (2026-11-28); the suite's default
# budget of 480 s cuts the last, so that the CUDA tests (90 s) and the suite fit one 10-minute command.
# A part gets less when less is left; ``--parts`` takes what a first command left out.
PART_BUDGETS = {
    "device": 10.0,
    "env_throughput": 40.0,  # took 26 s on an H200
    "ppo_training": 50.0,  # 20 s
    "population": 75.0,  # 65 s
    "ensemble_critics": 20.0,  # 14 s
    "time_to_solve": 45.0,  # eager: 17-20 s a process
    "vs_purejaxrl": 190.0,  # 171 s
    "offpolicy_mujoco": 95.0,  # SAC: 40 s a process, TD3 as much
    "playground": 300.0,
}
MIN_PART_S = 10.0  # a part with less time than this left is skipped
# Packages phalanx needs that a bare image may lack (the lent GPU machine's does, see the docstring).
REQUIRED_PACKAGES = ("torch", "numpy", "gymnasium", "tyro", "yaml", "rich")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big every part runs: the full sizes on a GPU, tiny ones for ``--smoke``."""

    env_envs: tuple[int, ...]
    env_warmup_steps: int
    env_seconds: float
    ppo_envs: tuple[int, ...]
    ppo_rollouts: int
    population_members: int
    population_steps: int
    population_warmup: int
    population_num_envs: int
    population_minibatch: int
    ensemble_members: tuple[int, ...]
    ensemble_hidden: tuple[int, ...]
    ensemble_batch: int
    ensemble_repeats: int
    ensemble_rounds: int
    solve_envs: tuple[str, ...]
    solve_settings: dict[str, Any]  # over the preset's (smoke: a small budget, no evaluation process)
    solve_run_cap_s: float
    peer_configs: dict[str, tuple[int, int, int]]  # vs_purejaxrl: label -> (num_envs, num_steps, env steps)
    offpolicy_steps: tuple[int, int]  # offpolicy_mujoco: (learning starts, total env steps)
    offpolicy_algos: tuple[str, ...]  # offpolicy_mujoco: the presets run
    offpolicy_flags: tuple[str, ...]  # offpolicy_mujoco: more train flags


FULL = Sizes(
    env_envs=(2**16, 2**20, 2**22, 2**24),
    env_warmup_steps=10,
    env_seconds=1.0,
    ppo_envs=(4_096, 65_536),
    ppo_rollouts=12,
    population_members=1_024,
    population_steps=8_192,
    population_warmup=1_024,
    population_num_envs=8,
    population_minibatch=64,
    ensemble_members=(2, 10, 50),
    ensemble_hidden=(256, 256),
    ensemble_batch=256,
    ensemble_repeats=5,
    ensemble_rounds=3,
    solve_envs=("CartPole-v1", "Pendulum-v1"),
    solve_settings={},
    solve_run_cap_s=100.0,
    peer_configs={"1024x32": (1024, 32, 5_000_000), "4096x16": (4096, 16, 5_000_000)},
    offpolicy_steps=(2_000, 8_000),
    offpolicy_algos=("sac", "td3"),
    offpolicy_flags=(),
)
SMOKE = Sizes(
    env_envs=(2**8, 2**10),
    env_warmup_steps=2,
    env_seconds=0.1,
    ppo_envs=(32,),
    ppo_rollouts=2,
    population_members=3,
    population_steps=256,
    population_warmup=128,
    population_num_envs=8,
    population_minibatch=64,
    ensemble_members=(2, 3),
    ensemble_hidden=(16, 16),
    ensemble_batch=16,
    ensemble_repeats=1,
    ensemble_rounds=1,
    solve_envs=("CartPole-v1",),
    solve_settings={"total_steps": 2_048, "eval_every": 1_024, "eval_process": False},
    solve_run_cap_s=60.0,
    peer_configs={"16x8": (16, 8, 1_024)},
    offpolicy_steps=(256, 400),
    offpolicy_algos=("sac",),
    offpolicy_flags=("--num-workers", "0"),  # no worker processes to start: the smoke checks the script
)


# -- time boxes and recorded failures ----------------------------------------------------------------
class TimeBoxExpired(BaseException):
    """A part's time box ran out. A BaseException, as KeyboardInterrupt, so that no ``except Exception``
    on the way (a row's, or phalanx's own) takes it for the failure of a figure."""


@contextmanager
def time_box(seconds: float) -> Iterator[None]:
    """Raise TimeBoxExpired in this (the main) thread once ``seconds`` have passed."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeBoxExpired(f"the time box of {seconds:.0f} s ran out")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def describe(error: BaseException) -> str:
    """An error as one string for the JSON: its type and message."""
    return f"{type(error).__name__}: {error}"[:2000]


def where(error: BaseException) -> str:
    """The end of an error's traceback (where it was raised), for the JSON."""
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))[-1500:]


class Part:
    """One part's rows and time box: ``take`` fills a row with figures, an error, or why it was not taken."""

    def __init__(self, section: dict[str, Any], deadline: float) -> None:
        self.rows: list[dict[str, Any]] = section.setdefault("rows", [])
        self.deadline = deadline

    def plan(self, **keys: Any) -> dict[str, Any]:
        """A row to take (its ``keys`` name it); not taken until ``take`` takes it."""
        row = {**keys, "not_taken": "the part's time box ran out before this figure"}
        self.rows.append(row)
        return row

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def take(
        self, row: dict[str, Any], need_s: float, measure: Callable[..., dict[str, Any]], *args: Any
    ) -> None:
        """Run ``measure(*args)`` for ``row`` if about ``need_s`` seconds are left in the time box; its
        figures, or the error it raised, go into the row. The time box running out leaves it not taken."""
        if self.left() < need_s:
            row["not_taken"] = (
                f"skipped: {self.left():.0f} s left in the part's time box, it needs ~{need_s:.0f}"
            )
            return
        row["not_taken"] = "the part's time box ran out while taking this figure"
        try:
            figures = measure(*args)
        except Exception as error:  # recorded, and the part goes on with its next figure
            del row["not_taken"]
            row["error"] = describe(error)
            row["traceback"] = where(error)
            return
        del row["not_taken"]
        row.update(figures)


def run_part(measure: Callable[[Part], None], budget_s: float, suite_deadline: float) -> dict[str, Any]:
    """Run one part in its time box (``budget_s``, cut to what is left before ``suite_deadline``)."""
    left = suite_deadline - time.perf_counter()
    seconds = min(budget_s, left)
    section: dict[str, Any] = {"budget_s": budget_s}
    if seconds < MIN_PART_S:
        section["status"] = "skipped"
        section["note"] = (
            f"not taken: {max(left, 0):.0f} s left of the suite's budget (a part needs {MIN_PART_S:.0f})"
        )
        return section
    section["time_box_s"] = seconds
    start = time.perf_counter()
    part = Part(section, start + seconds)
    try:
        with time_box(seconds):
            measure(part)
        section["status"] = "done"
    except TimeBoxExpired as expired:
        section["status"] = "timed out"
        section["note"] = f"{expired}; the figures taken before are kept"
    except Exception as error:
        section["status"] = "error"
        section["error"] = describe(error)
        section["traceback"] = where(error)
    section["seconds"] = time.perf_counter() - start
    return section


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory() -> None:
    """Free what the last figure left on the GPU before the next one allocates."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the parts ---------------------------------------------------------------------------------------
def device_part(part: Part, device: str) -> None:
    """The GPU, its driver, torch's CUDA, Triton, whether compiling works, and the machine."""
    missing = [name for name in REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]
    part.take(part.plan(what="packages"), 0, lambda: {"missing": missing})
    if missing:
        print(
            f"Missing Python packages: {', '.join(missing)}. phalanx needs them; on the lent GPU machine "
            "nothing installs from a registry, so carry them as wheels (see this script's docstring and "
            "the device tool's README); every part that imports phalanx will record the import error.",
            flush=True,
        )
    part.take(part.plan(what="machine"), 0, machine_info, device)
    part.take(part.plan(what="torch"), 0, torch_info, device)
    part.take(part.plan(what="nvidia-smi"), 0, nvidia_smi)


def torch_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "triton": package_version("triton"),
    }
    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        properties = torch.cuda.get_device_properties(torch_device)
        info["gpu"] = {
            "name": properties.name,
            "compute_capability": f"{properties.major}.{properties.minor}",
            "memory_gib": properties.total_memory / 2**30,
            "multiprocessors": properties.multi_processor_count,
        }
    from phalanx.compiling import compile_problem

    info["compile_problem"] = compile_problem(torch_device)
    return info


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def nvidia_smi() -> dict[str, Any]:
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        output = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except FileNotFoundError:
        return {"nvidia_smi": "not found on this machine"}
    return {"query": query, "gpus": [line.strip() for line in output.splitlines() if line.strip()]}


def env_throughput_part(part: Part, device: str, sizes: Sizes, modes: tuple[str, ...]) -> None:
    """CartPole-v1 env steps/s at each size, eager and compiled."""
    need = {"eager": sizes.env_seconds + 2.0, "compiled": sizes.env_seconds + 20.0}
    by_size_and_mode(part, sizes.env_envs, modes, need, env_steps_per_second, device, sizes)


def by_size_and_mode(
    part: Part,
    counts: tuple[int, ...],
    modes: tuple[str, ...],
    need_s: dict[str, float],
    measure: Callable[..., dict[str, Any]],
    device: str,
    sizes: Sizes,
) -> None:
    """``measure(num_envs, device, mode, sizes)`` eagerly at every size, smallest first (cheap and sure),
    then compiled from the largest size down (the size the targets name, while the time box is fresh)."""
    order = [(n, "eager") for n in counts] + [(n, "compiled") for n in reversed(counts)]
    rows = [part.plan(num_envs=num_envs, mode=mode) for num_envs, mode in order]  # all listed up front
    for row in unrequested_modes_marked(rows, modes):
        part.take(row, need_s[row["mode"]], measure, row["num_envs"], device, row["mode"], sizes)
        release_memory()


def unrequested_modes_marked(rows: list[dict[str, Any]], modes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Mark the rows of a mode not in ``modes`` as not taken, and return the others, to take."""
    for row in rows:
        if row["mode"] not in modes:
            row["not_taken"] = f"mode not requested (--modes {','.join(modes)})"
    return [row for row in rows if row["mode"] in modes]


def env_steps_per_second(num_envs: int, device: str, mode: str, sizes: Sizes) -> dict[str, Any]:
    """Steps of ``num_envs`` CartPoles with random actions drawn on the device, as env_throughput.py
    steps them; compiled: after ``env.compile()``, whose cost (with the first step) is reported apart."""
    import torch

    from phalanx.envs.classic import CartPoleEnv

    env = CartPoleEnv(num_envs, device=device)
    env.reset(seed=0)
    generator = torch.Generator(device=env.device)
    generator.manual_seed(0)

    def step() -> None:
        env.step(torch.randint(0, 2, (num_envs,), device=env.device, generator=generator))

    figures: dict[str, Any] = {}
    if mode == "compiled":
        start = time.perf_counter()
        try:
            figures["compiled"] = env.compile()
            step()
            synchronize(env.device)
        except Exception as error:
            return {"not_available": describe(error), "traceback": where(error)}
        figures["compile_and_first_step_s"] = time.perf_counter() - start
    steps, seconds = timed_steps(
        step, lambda: synchronize(env.device), sizes.env_warmup_steps, sizes.env_seconds, 10
    )
    env.close()
    return {
        **figures,
        "vector_steps": steps,
        "seconds": seconds,
        "env_steps_per_second": steps * num_envs / seconds,
    }


def ppo_training_part(part: Part, device: str, sizes: Sizes, modes: tuple[str, ...]) -> None:
    """End-to-end PPO on CartPole-v1 at each size, eager and compiled."""
    by_size_and_mode(
        part, sizes.ppo_envs, modes, {"eager": 15.0, "compiled": 40.0}, ppo_steps_per_second, device, sizes
    )


def ppo_steps_per_second(num_envs: int, device: str, mode: str, sizes: Sizes) -> dict[str, Any]:
    """``phalanx.train`` of ``sizes.ppo_rollouts`` rollouts: the summary's rates and the steady rate."""
    import phalanx
    from phalanx.train.hooks import Hook

    preset = phalanx.make_config("ppo", "CartPole-v1")
    horizon = preset.hyperparameters.horizon
    minibatches = preset.num_envs * horizon // preset.hyperparameters.minibatch_size

    class IterationEnds(Hook):
        """The time (device synchronised) and the env steps at the start and the end of every iteration."""

        def __init__(self) -> None:
            self.start = 0.0
            self.marks: list[tuple[float, int]] = []

        def on_start(self, trainer: Any) -> None:
            self.start = time.perf_counter()

        def after_iteration(self, trainer: Any) -> None:
            synchronize(trainer.device)
            self.marks.append((time.perf_counter(), trainer.steps))

    ends = IterationEnds()
    with tempfile.TemporaryDirectory(prefix="gpu_suite-ppo-") as directory:
        config = phalanx.make_config(
            "ppo",
            "CartPole-v1",
            num_envs=num_envs,
            device=device,
            compile=mode == "compiled",
            total_steps=sizes.ppo_rollouts * num_envs * horizon,
            minibatch_size=num_envs * horizon // minibatches,
            eval_every=0,
            eval_process=False,
            run_dir=f"{directory}/run",
        )
        summary = phalanx.train(config, show_progress=False, hooks=[ends]).summary
    figures: dict[str, Any] = {
        "total_steps": summary["total_steps"],
        "horizon": horizon,
        "minibatch_size": config.hyperparameters.minibatch_size,
        "wall_time_s": summary["wall_time_s"],
        "steps_per_second": summary["steps_per_second"],
        **{key: value for key, value in summary.items() if "compile" in key},
    }
    if len(ends.marks) >= 2:
        (first_time, first_steps), (last_time, last_steps) = ends.marks[0], ends.marks[-1]
        figures["steady_steps_per_second"] = (last_steps - first_steps) / (last_time - first_time)
        figures["first_iteration_s"] = first_time - ends.start
    else:
        figures["steady_steps_per_second"] = "not taken: fewer than two iterations"
    return figures


def population_part(part: Part, device: str, sizes: Sizes) -> None:
    """A vectorized population of ``population_members`` PPO members against one member."""

    def measure() -> dict[str, Any]:
        import population_vectorized

        config = population_vectorized.population_config(
            "CartPole-v1", device, sizes.population_num_envs, sizes.population_minibatch
        )
        compared = population_vectorized.compare(
            config, sizes.population_members, sizes.population_steps, sizes.population_warmup
        )
        return {"config_compile": config.compile, **compared}

    row = part.plan(members=sizes.population_members, num_envs_per_member=sizes.population_num_envs)
    part.take(row, 10.0, measure)


def ensemble_critics_part(part: Part, device: str, sizes: Sizes) -> None:
    """K critics (MuJoCo-sized inputs: 17 + 6) as one batched network against a loop, for each K."""
    import ensemble_critics

    hidden = list(sizes.ensemble_hidden)
    rows = [part.plan(critics=k, hidden=hidden, batch=sizes.ensemble_batch) for k in sizes.ensemble_members]
    for row in rows:
        arguments = (row["critics"], 17, 6, hidden, sizes.ensemble_batch, device, sizes.ensemble_repeats)
        part.take(row, 3.0, ensemble_critics.compare, *arguments, sizes.ensemble_rounds)


def time_to_solve_part(part: Part, device: str, sizes: Sizes, modes: tuple[str, ...], log_root: Path) -> None:
    """The PPO presets to their thresholds on the device, eager then compiled, one subprocess each."""
    from time_to_solve import THRESHOLDS

    rows = [
        part.plan(env=env_id, mode=mode, threshold=THRESHOLDS[env_id], seed=0)
        for mode in MODES
        for env_id in sizes.solve_envs
    ]
    for row in unrequested_modes_marked(rows, modes):
        settings = {"device": device, "compile": COMPILE_SETTING[row["mode"]], **sizes.solve_settings}
        log_dir = log_root / row["mode"]
        part.take(row, 15.0, solve_once, row["env"], row["threshold"], settings, log_dir, part, sizes)


def solve_once(
    env_id: str, threshold: float, settings: dict[str, Any], log_dir: Path, part: Part, sizes: Sizes
) -> dict[str, Any]:
    """``phalanx train ppo ENV --stop-return R --seed 0 --config FILE`` (``settings`` in FILE) in a
    subprocess, killed when the part's time box (or the run's cap) runs out."""
    import yaml

    log_dir.mkdir(parents=True, exist_ok=True)
    config_file = log_dir / f"{env_id}.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    timeout = min(sizes.solve_run_cap_s, part.left() - 2)
    run = run_phalanx("ppo", env_id, threshold, 0, 1, log_dir, timeout, ["--config", str(config_file)])
    if "error" in run:  # the log stays on the lent machine: keep its end, which says why
        run["log_tail"] = Path(run["log"]).read_text()[-1500:]
    return {"settings": settings, "timeout_s": timeout, **run}


def vs_purejaxrl_part(
    part: Part, device: str, sizes: Sizes, modes: tuple[str, ...], log_root: Path, peer_path: str | None
) -> None:
    """PPO on CartPole-v1 at equal work: PureJaxRL's ``ppo.py`` (unmodified, JAX on the GPU) against
    ``phalanx train`` on the device, each in a fresh process, with ``vs_purejaxrl.py``'s hyperparameters.
    phalanx is timed as a user waits for it (the process: imports, setup, compile, training, the final
    evaluation) and by its summary's ``wall_time_s``; PureJaxRL by its compile and its run (its own
    clock, jax.jit lowering to block_until_ready) and by its process."""
    import vs_purejaxrl

    for label, (num_envs, num_steps, total_steps) in sizes.peer_configs.items():
        spec = {"num_envs": num_envs, "num_steps": num_steps, "total_steps": total_steps, "seed": 1}
        peer_row = part.plan(config=label, library="PureJaxRL", env_steps=total_steps)
        phalanx_rows = [
            part.plan(config=label, library=f"phalanx {mode}", mode=mode, env_steps=total_steps)
            for mode in MODES
        ]
        part.take(peer_row, 20.0, purejaxrl_run, spec, log_root / f"purejaxrl-{label}.log", peer_path)
        for row in unrequested_modes_marked(phalanx_rows, modes):
            compile_setting = COMPILE_SETTING[row["mode"]]
            settings = {
                **vs_purejaxrl.phalanx_settings(**spec, compile=compile_setting, threads=0),
                "device": device,
            }
            part.take(row, 15.0, run_phalanx_config, settings, log_root / f"phalanx-{label}-{row['mode']}")
        for row in phalanx_rows:
            if "process_s" in row and "process_s" in peer_row:
                row["speed_vs_purejaxrl_process"] = peer_row["process_s"] / row["process_s"]
                row["speed_vs_purejaxrl_train"] = (peer_row["compile_s"] + peer_row["run_s"]) / row[
                    "wall_time_s"
                ]


def purejaxrl_run(spec: dict[str, Any], log: Path, peer_path: str | None) -> dict[str, Any]:
    """``vs_purejaxrl.py --child=purejaxrl`` with this Python and ``peer_path`` as its PYTHONPATH (the peer's
    packages, carried), or in the peer's own virtualenv where it exists (a CPU machine)."""
    from benchlib import PEER_VENVS, run_child

    python = Path(sys.executable)
    environment = {"PYTHONPATH": peer_path} if peer_path else {}
    if not peer_path:
        python = PEER_VENVS / "purejaxrl" / "bin" / "python"
        if not python.is_file():
            return {
                "not_available": "no --peer-pythonpath and no PureJaxRL virtualenv (vs_purejaxrl.py makes it)"
            }
    script = Path(__file__).resolve().parent / "vs_purejaxrl.py"
    command = [str(python), str(script), "--child=purejaxrl", "--child-spec", json.dumps(spec)]
    result = run_child(command, log, environment)
    if "error" in result:
        result["log_tail"] = log.read_text()[-1500:]
    return result


def offpolicy_mujoco_part(part: Part, device: str, sizes: Sizes, log_root: Path) -> None:
    """SAC and TD3 with their HalfCheetah-v5 presets on the device (``phalanx train``, a fresh process each,
    the preset's worker processes): the steady env and gradient steps/s once updates run (as
    ``mujoco_speed.py`` reads them from metrics.csv), for what a 300k or 1M run costs on a GPU."""
    if importlib.util.find_spec("mujoco") is None:
        part.take(part.plan(env="HalfCheetah-v5"), 0, lambda: {"not_available": "mujoco is not installed"})
        return
    starts, total = sizes.offpolicy_steps
    for algo in sizes.offpolicy_algos:
        row = part.plan(algo=algo, env="HalfCheetah-v5", learning_starts=starts, env_steps=total)
        run_dir = log_root / f"{algo}-halfcheetah"
        part.take(row, 15.0, offpolicy_run, algo, device, starts, total, run_dir, sizes.offpolicy_flags)


def offpolicy_run(
    algo: str, device: str, starts: int, total: int, run_dir: Path, flags: tuple[str, ...] = ()
) -> dict[str, Any]:
    from mujoco_speed import steady_rates

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_suffix(".log")
    command = [sys.executable, "-m", "phalanx.cli", "train", algo, "HalfCheetah-v5", "--device", device]
    command += ["--learning-starts", str(starts), "--total-steps", str(total), "--eval-every", "0"]
    command += ["--eval-episodes", "1", "--log-every", str(max(total // 16, 16)), "--run-dir", str(run_dir)]
    command += list(flags)
    start = time.perf_counter()
    with open(log, "w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT).returncode
    process_s = time.perf_counter() - start
    rates = steady_rates(run_dir) if code == 0 else None
    if rates is None:
        return {"error": f"exit {code}, no steady rate", "log_tail": log.read_text()[-1500:]}
    return {
        "process_s": process_s,
        "env_steps_per_second": rates[0],
        "gradient_steps_per_second": rates[1],
        "command": " ".join(command[1:]),
    }


PLAYGROUND_CASE = {"env": "CheetahRun", "num_envs": 4_096, "rollouts": 20}  # 2.46M env steps


def playground_part(part: Part, device: str) -> None:
    """PPO on MuJoCo Playground's CheetahRun at 4,096 envs (``playground_ppo.py``) for a short budget:
    env steps per second, MJX compilation included and steady, and the return reached (not the 60M-step
    run's: that one is ``playground_ppo.py --device cuda`` on its own)."""
    row = part.plan(**PLAYGROUND_CASE)
    missing = [name for name in ("mujoco_playground", "jax") if importlib.util.find_spec(name) is None]
    if missing:
        del row["not_taken"]
        row["not_available"] = (
            f"{', '.join(missing)} not installed: `pip install 'phalanx[playground]' 'jax[cuda12]'`"
        )
        return

    def measure() -> dict[str, Any]:
        import playground_ppo

        total_steps = PLAYGROUND_CASE["num_envs"] * playground_ppo.BRAX_PPO["unroll_length"]
        arguments = ["--env", PLAYGROUND_CASE["env"], "--device", device]
        arguments += ["--num-envs", str(PLAYGROUND_CASE["num_envs"])]
        arguments += ["--total-steps", str(total_steps * PLAYGROUND_CASE["rollouts"])]
        arguments += ["--json", str(Path(tempfile.mkdtemp(prefix="playground_ppo-")) / "result.json")]
        return playground_ppo.main(arguments)["phalanx"]

    part.take(row, 60.0, measure)


# -- the report --------------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]], keys: dict[str, str], figures: dict[str, str]) -> str:
    """A markdown table of ``rows``: the columns ``keys`` name them, then their ``figures`` (header by
    key), or, for a row without figures, why it has none."""
    lines = []
    for row in rows:
        reason = next((f"{k.replace('_', ' ')}: {row[k]}" for k in REASONS if k in row), None)
        cells = [row.get(key, "-") for key in keys]
        if reason is None:
            cells += [row.get(key, "-") for key in figures]
        else:
            cells += [reason[:160]] + ["-"] * (len(figures) - 1)
        lines.append(cells)
    return markdown_table([*keys.values(), *figures.values()], lines)


REASONS = ("not_taken", "not_available", "error")


def tables(result: dict[str, Any]) -> str:
    """The suite's figures as markdown: a heading with its status per part, then its table."""
    sections = result["sections"]
    out = [
        f"GPU suite on {result['device_name']} ({result['settings']['device']}), {result['total_s']:.0f} s"
    ]
    layouts: dict[str, tuple[dict[str, str], dict[str, str]]] = {
        "env_throughput": (
            {"num_envs": "sub-envs", "mode": "mode"},
            {
                "env_steps_per_second": "env steps/s",
                "compile_and_first_step_s": "compile + first step s",
                "compiled": "compiled",
            },
        ),
        "ppo_training": (
            {"num_envs": "envs", "mode": "mode"},
            {
                "steps_per_second": "steps/s (wall, compile included)",
                "steady_steps_per_second": "steady steps/s",
                "total_steps": "env steps",
                "wall_time_s": "wall s",
                "first_iteration_s": "first iteration s",
            },
        ),
        "population": (
            {"members": "members", "num_envs_per_member": "envs/member"},
            {
                "wall_time_ratio": "wall vs one member",
                "one_member_s": "one member s",
                "population_s": "all s",
            },
        ),
        "ensemble_critics": (
            {"critics": "critics", "batch": "batch"},
            {"loop_ms_per_update": "loop ms/update", "batched_ms_per_update": "batched ms/update"},
        ),
        "time_to_solve": (
            {"env": "env", "mode": "mode", "threshold": "threshold"},
            {
                "time_to_solve_s": "time to solve s",
                "process_s": "process s",
                "steps": "env steps",
                "last_eval_return": "last eval",
                "compile_time_s": "compile s",
                "compile_decision": "compile: null chose",
            },
        ),
        "vs_purejaxrl": (
            {"config": "envs x steps", "library": "run"},
            {
                "process_s": "process s",
                "wall_time_s": "phalanx train s",
                "compile_time_s": "phalanx compile s",
                "compile_s": "PureJaxRL compile s",
                "run_s": "PureJaxRL run s",
                "final_return": "final return",
                "speed_vs_purejaxrl_process": "speed vs PureJaxRL (process)",
                "speed_vs_purejaxrl_train": "speed vs PureJaxRL (train)",
            },
        ),
        "offpolicy_mujoco": (
            {"algo": "algo", "env": "env"},
            {
                "env_steps_per_second": "env steps/s (steady)",
                "gradient_steps_per_second": "gradient steps/s",
                "process_s": "process s",
            },
        ),
        "playground": (
            {"env": "env", "num_envs": "envs"},
            {
                "steps_per_second": "steps/s (wall, compile included)",
                "steady_steps_per_second": "steady steps/s",
                "env_steps": "env steps",
                "final_return": "final return",
            },
        ),
    }
    for name in PARTS + OPTIONAL_PARTS:
        section = sections.get(name, {})
        if "rows" not in section and section.get("status", "not requested").startswith("not requested"):
            continue
        note = section.get("note") or section.get("error") or ""
        out.append(f"\n### {name} ({section.get('status', 'not run')}{': ' + note if note else ''})\n")
        rows = section.get("rows", [])
        if not rows:
            continue
        if name == "device":
            out += [
                f"- {json.dumps({k: v for k, v in row.items() if k != 'traceback'})[:500]}" for row in rows
            ]
        elif name == "population":
            flat = [
                {
                    **row,
                    "one_member_s": row["one_member"]["wall_s"],
                    "population_s": row["population"]["wall_s"],
                }
                if "one_member" in row
                else row
                for row in rows
            ]
            out.append(table(flat, *layouts[name]))
        elif name == "time_to_solve":
            shown = [
                {**row, "time_to_solve_s": "not reached"} if row.get("reached") is False else row
                for row in rows
            ]
            out.append(table(shown, *layouts[name]))
        else:
            out.append(table(rows, *layouts[name]))
    return "\n".join(out)


def device_name(sections: dict[str, Any]) -> str:
    """The GPU's name as the device part found it, or what ran instead."""
    for row in sections.get("device", {}).get("rows", []):
        if row.get("what") == "torch":
            gpu = row.get("gpu")
            if gpu:
                return gpu["name"]
    return "no GPU (CPU)"


def parse_list(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    chosen = tuple(item for item in text.split(",") if item)
    unknown = [item for item in chosen if item not in allowed]
    if unknown or not chosen:
        raise SystemExit(
            f"gpu_suite.py: {flag} {text!r} names {unknown or 'nothing'}; expected a comma-separated "
            f"list of {', '.join(allowed)}. Fix: e.g. {flag} {','.join(allowed)}"
        )
    return chosen


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script (on a CPU)")
    parser.add_argument(
        "--budget", type=float, default=480.0, help="seconds for the whole suite (default 480)"
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS + OPTIONAL_PARTS)}"
    )
    parser.add_argument(
        "--modes", default=None, help="eager,compiled (default; --smoke: eager): which modes to measure"
    )
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="results file (default benchmarks/results/)"
    )
    parser.add_argument(
        "--peer-pythonpath",
        default=None,
        metavar="DIR",
        help="PYTHONPATH of the packages PureJaxRL needs (default: its virtualenv in benchmarks/.peers)",
    )
    args = parser.parse_args(argv)
    parts = parse_list(args.parts, PARTS + OPTIONAL_PARTS, "--parts")
    modes = parse_list(args.modes or ("eager" if args.smoke else "eager,compiled"), MODES, "--modes")
    sizes = SMOKE if args.smoke else FULL
    if args.smoke:  # tiny batches: torch's intra-op threads would only spin against each other (and CI)
        import torch

        torch.set_num_threads(1)

    started = time.perf_counter()
    deadline = started + args.budget
    log_root = Path(tempfile.mkdtemp(prefix="gpu_suite-logs-"))  # the time-to-solve runs' logs
    measures: dict[str, Callable[[Part], None]] = {
        "device": lambda part: device_part(part, args.device),
        "env_throughput": lambda part: env_throughput_part(part, args.device, sizes, modes),
        "ppo_training": lambda part: ppo_training_part(part, args.device, sizes, modes),
        "population": lambda part: population_part(part, args.device, sizes),
        "ensemble_critics": lambda part: ensemble_critics_part(part, args.device, sizes),
        "time_to_solve": lambda part: time_to_solve_part(part, args.device, sizes, modes, log_root),
        "vs_purejaxrl": lambda part: vs_purejaxrl_part(
            part, args.device, sizes, modes, log_root, args.peer_pythonpath
        ),
        "offpolicy_mujoco": lambda part: offpolicy_mujoco_part(part, args.device, sizes, log_root),
        "playground": lambda part: playground_part(part, args.device),
    }
    result: dict[str, Any] = {
        "benchmark": "gpu_suite",
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "settings": {
            "device": args.device,
            "smoke": args.smoke,
            "budget_s": args.budget,
            "parts": list(parts),
            "modes": list(modes),
            "part_budgets_s": PART_BUDGETS,
            "sizes": dataclasses.asdict(sizes),
            "pythonpath": os.environ.get("PYTHONPATH"),
            "logs": str(log_root),
        },
        "sections": {name: {"status": "not requested (--parts)"} for name in PARTS if name not in parts},
    }
    path = None
    for name in PARTS + OPTIONAL_PARTS:
        if name not in parts:
            continue
        print(f"[gpu_suite] {name} ({deadline - time.perf_counter():.0f} s left)", flush=True)
        result["sections"][name] = run_part(measures[name], PART_BUDGETS[name], deadline)
        result["device_name"] = device_name(result["sections"])
        result["total_s"] = time.perf_counter() - started
        path = write_json(result, args.json, "gpu_suite")
        section = result["sections"][name]
        print(f"[gpu_suite] {name}: {section['status']} in {section.get('seconds', 0):.1f} s", flush=True)
    result["device_name"] = device_name(result["sections"])
    result["total_s"] = time.perf_counter() - started
    path = write_json(result, args.json, "gpu_suite")
    print()
    print(tables(result))
    print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
