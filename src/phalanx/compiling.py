"""Compiled execution: ``torch.compile`` of phalanx's hot functions, with the eager path as reference.

phalanx's speed on small batches is bounded by overhead, not arithmetic: a CartPole step of 4 sub-envs
is ~30 tensor ops, a PPO gradient step ~150, each paying Python and dispatch costs (and, on a GPU, a
kernel launch). A compiled function runs them as a few fused kernels. Each hot function is written
once, as a function of tensors with every random draw taken outside it (drawn eagerly from the same
generators, in the same order), so the compiled and the eager function compute the same thing and
differ only by floating-point rounding; the eager one is the reference the tests compare against.

A run compiles when ``TrainConfig.compile`` is True (``--compile``), runs eagerly when it is False
(``--no-compile``), and when it is None (the default) decides for itself, per run: it starts eagerly,
times a few iterations, and compiles for the rest only if the eager time left, times what compiling
saves on this kind of device, is more than a compile costs there (:data:`COMPILE_ECONOMICS`,
:func:`compile_pays`). A 2-second run never waits for a compile; a 10-minute one compiles.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from phalanx.errors import ConfigError

Function = TypeVar("Function", bound=Callable[..., Any])


def compile_problem(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot compile for ``device`` on this machine, or None if it can.

    On a CPU, inductor builds C++ and needs a compiler (``CXX``, or ``c++``/``g++``/``clang++`` on the
    path); on CUDA it generates Triton kernels and needs the ``triton`` package.
    """
    if device.type == "cpu":
        compilers = [os.environ.get("CXX"), "c++", "g++", "clang++"]
        if not any(name and shutil.which(name) for name in compilers):
            return (
                "torch.compile on a CPU builds C++ kernels, and no C++ compiler was found (CXX, c++, g++ "
                "or clang++ on the PATH). Install one (Debian/Ubuntu: apt-get install g++)"
            )
        return None
    if device.type == "cuda":
        try:
            import triton  # noqa: F401  # the optional part inductor needs on CUDA
        except ImportError:
            return (
                "torch.compile on CUDA generates Triton kernels and the triton package is missing. "
                "pip install triton"
            )
        return None
    return f"phalanx compiles for 'cpu' and 'cuda' devices, not {device.type!r}"


def should_compile(requested: bool | None, device: torch.device) -> bool:
    """Resolve ``TrainConfig.compile`` at the start of a run: True and False as asked (True raises a
    ConfigError with the fix where compiling is impossible); None: eager at the start (the run decides
    later whether compiling pays, :func:`compile_pays`).

    Nothing of the compiler starts here: the first compile probes the vector instructions itself. A
    thread that probed them while the run set up hung runs twice, its compiler's pipes and then filelock's
    fork gate meeting the fork of the evaluation process, and hid little (BENCHMARKS.md, issue 35)."""
    problem = compile_problem(device)
    if requested and problem is not None:
        raise ConfigError(f"compile = True, but {problem}; or run eagerly with --no-compile.")
    return bool(requested)


def stop_compile_workers() -> None:
    """End the pool of compile-worker processes torch's compiler started in this process, if it did
    (importing nothing). torch ends it at exit; a process that ends with ``os._exit`` (a learner) calls
    this first, else the pool's semaphores are left to multiprocessing's resource tracker, which warns
    about them when the run ends."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        with contextlib.suppress(Exception):  # a private torch API: if it moved, the warning is all
            async_compile.shutdown_compile_workers()


COMPILE_ECONOMICS = {"cpu": (30.0, 1.3), "cuda": (20.0, 1.7)}
"""By device type: (seconds a run's compile costs, how many times faster the compiled run then goes), the
cautious end of what was measured (BENCHMARKS.md): on a 2-core CPU, PPO's graphs took 10-30 s to compile
(6 s from torch's on-disk cache) and ran 1.3-1.7x faster; on an H200, 15-19 s on a fresh machine (6.3-7.7 s
before issue 35's graphs) and 1.7-2.2x at 65,536 envs (3.2x at 4,096)."""


def compile_pays(device: torch.device, eager_seconds_left: float) -> tuple[bool, str]:
    """Whether compiling now pays for a run with ``eager_seconds_left`` of eager training ahead, and why,
    in words for the run's log."""
    cost, speedup = COMPILE_ECONOMICS.get(device.type, (math.inf, 1.0))
    saving = eager_seconds_left * (1.0 - 1.0 / speedup)
    verdict = saving > cost
    why = (
        f"~{eager_seconds_left:,.0f} s of eager training left; compiled, ~{saving:,.0f} s of it saved "
        f"against ~{cost:.0f} s to compile on {device.type}"
    )
    return verdict, why


CPU_OPTIONS = {"cpp_wrapper": True, "cpp.use_decompose_tanh": True}
"""inductor's options for every graph phalanx compiles for a CPU (:func:`compiled` says why), with
:func:`cpu_isa_options`."""


@functools.cache
def cpu_isa_options() -> dict[str, bool]:
    """``cpp.vec_isa_ok``: inductor trusts the vector instructions the CPU's flags claim instead of proving
    each by building and loading a test library, where nothing can fail but the probes themselves: no
    AMX claimed (its flags need g++ 11; the probes stay there), ``TORCHINDUCTOR_VEC_ISA_OK`` unset (a
    user's setting wins). The probes were ~6 s of a first compile's ~28 s on a 2-core CPU (three builds
    of ATen's vector headers, three loads in a child process; BENCHMARKS.md); later compiles find them in
    torch's cache. The instructions picked are the same: the best the CPU claims."""
    if "TORCHINDUCTOR_VEC_ISA_OK" in os.environ or platform.machine() not in ("x86_64", "AMD64"):
        return {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:  # not Linux: inductor probes as usual
        return {}
    return {"cpp.vec_isa_ok": True} if flags and "amx_tile" not in flags.split() else {}


def compiled(function: Function, dynamic: bool = False) -> Function:
    """``function`` compiled as one graph (``fullgraph``: a graph break is a bug to fix, not a silent
    slow path), specialised to the shapes it is called with (``dynamic``: whether sizes may vary
    without a recompilation). It keeps ``function``'s name and docstring, and its first call, where
    torch compiles it, is timed into :func:`compile_seconds`.

    On a CPU the graph's wrapper, which calls its kernels, is C++ as well (inductor's ``cpp_wrapper``):
    for the small graphs of a few envs it is most of the time left (PPO at 4 envs x 128 steps runs 1.24x
    faster with it, at 1,024 x 32 the same; the compile takes as long; BENCHMARKS.md). And its kernels
    compute tanh as ``2 / (1 + exp(-2x)) - 1`` (inductor's ``cpp.use_decompose_tanh``), 3x faster than the
    vectorised library tanh they call otherwise and within 2e-7 of tanh (absolute; values under ~3e-8
    become 0): tanh, the default activation, was a quarter of PPO's compiled gradient step at minibatches
    of 8,192 (four 8,192 x 64 tanh at 0.85 ms each, in a 14 ms step on one core)."""
    _make_room_for_graphs()
    graph: Callable[..., Any] | None = None

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        global _compile_seconds
        nonlocal graph
        if graph is not None:
            return graph(*args, **kwargs)
        tensors = [leaf for leaf in torch.utils._pytree.tree_leaves(args) if isinstance(leaf, torch.Tensor)]
        on_cpu = not tensors or tensors[0].device.type == "cpu"
        options: dict[str, Any] | None = {**CPU_OPTIONS, **cpu_isa_options()} if on_cpu else None
        graph = torch.compile(function, fullgraph=True, dynamic=dynamic, options=options)
        start = time.perf_counter()
        try:
            return graph(*args, **kwargs)
        finally:
            _compile_seconds += time.perf_counter() - start

    # ignored below: call has the compiled function's signature (a TypeVar of it)
    return call  # type: ignore[return-value]


def compiled_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """A bound method compiled as :func:`compiled` does."""
    return compiled(method)


_compile_seconds = 0.0

GRAPHS_PER_FUNCTION = 64
"""How many graphs torch may keep for one compiled code object before it stops compiling it.

One function of phalanx serves many objects: ``BatchedVecEnv.step_with_noise`` every env class and
wrapper chain, ``GradientStep.step`` every loss (PPO's, a critic's, an actor's), each a graph of its
own. torch's default limit (8, ``torch._dynamo.config.recompile_limit``) is reached by a process that
trains several kinds of runs (a test session, a notebook, a population of runs in one process), and past
it torch runs the function eagerly without a word. :func:`compiled` raises the limit to this when it is
lower."""


def _make_room_for_graphs() -> None:
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, GRAPHS_PER_FUNCTION)


def compile_seconds() -> float:
    """Seconds this process has spent in the first calls of its compiled functions: compiling them
    (tracing, code generation and the C++ build, or loading torch's cached artefacts) and running them
    once. A recompilation in a later call (a new shape, which phalanx's fixed shapes avoid; see them with
    ``TORCH_LOGS=recompiles``) is not counted. A run reports its share as ``compile_time_s``."""
    return _compile_seconds
