"""The docs are tested as a reader uses them: every code block of README.md and docs/*.md runs as a
script or a shell command, in a fresh directory, and what it prints is checked.

Conventions of the Markdown source (a contributor's reference; the rendered docs do not show them):

- Every code block is fenced and names its language: ``python`` and ``bash`` blocks run, ``yaml`` blocks
  are files the commands use, ``text`` blocks (directory trees, usage synopses) are not run.
- A ``python`` block runs as a script (``python block.py``, so ``__name__ == "__main__"`` and worker
  processes re-import it, as they do for a reader) in a temporary directory. A block that starts with
  ``# (continues the block above)`` runs after the blocks it continues, as one script. Header lines:
  ``# requires: mujoco, envpool`` runs the block only where those modules exist (``cuda``: a CUDA GPU;
  ``jax-gpu``: JAX with a GPU backend), ``# file: NAME.py`` names the script.
- The ``bash`` blocks of a page run in order, one command at a time, in one temporary directory that
  holds a copy of ``examples/``, as a reader types them in one terminal at the repository root. ``phalanx``
  and ``.venv/bin/phalanx`` are this interpreter's ``python -m phalanx``; ``python`` and
  ``.venv/bin/python`` are this interpreter. ``<stamp>`` in a path is the newest run directory that the
  commands before created. A ``yaml`` block whose first line is ``# file: NAME.yaml`` is written to that
  file when the commands reach it. ``# requires: ...`` works as in Python blocks.
- ``<!-- not run by tests/test_docs.py: REASON -->`` on the line above a block: it cannot run on a CI
  machine (a GPU, a Ray cluster, several machines, installing packages, ``make``).
  ``<!-- run by tests/test_docs.py only with -m slow: REASON -->``: a bash block that runs only in the
  slow suite (``make test-all``), to keep the default suite's time. Both kinds are listed by
  :func:`test_blocks_not_run_here_say_why`, one skipped test each with its reason.
- Budgets: scripts and commands run with ``tests/docs_budget`` on their PYTHONPATH and
  ``PHALANX_DOCS_MAX_STEPS`` set: its ``sitecustomize`` caps every run's ``total_steps``, so a documented
  1M-step run ends after a few thousand steps (phalanx itself reads no such variable). A command with
  ``--stop-return`` runs its whole budget:
  it must reach the return, or it exits 1.
- The scripts and pages run in the background, two at a time (:class:`BlockRunner`); each test waits
  for its own.
- Checks: exit status 0 and no ``Traceback`` in the output. A ``print(...)`` whose comment shows a
  Python value, as in ``print(x.shape)  # (65536, 4)`` or a comment line of its own after the print,
  must print that value (compared without spaces and brackets, so ``torch.Size([65536, 4])`` shows
  ``(65536, 4)``).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import phalanx

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONTINUES = "# (continues the block above)"
MARKER = re.compile(r"^<!-- (not run by|run by) tests/test_docs\.py(?: only with -m slow)?: (.+?) -->$")
LANGUAGES = ("python", "bash", "yaml", "text")
MAX_STEPS = 2048  # PHALANX_DOCS_MAX_STEPS of every script and command (but those with --stop-return)
BUDGET = ROOT / "tests" / "docs_budget"  # its sitecustomize.py applies the cap
TIMEOUT_S = 900  # per script or command: generous, for a loaded machine


@dataclasses.dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence
    language: str
    code: str
    not_run: str | None  # the reason given in the doc source
    slow: str | None  # the reason it runs only with -m slow

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def read_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    blocks, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        if not lines[index].startswith("```"):
            index += 1
            continue
        start, language = index, lines[index][3:].strip()
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        assert end < len(lines), f"{page.name}:{start + 1}: a code block is not closed"
        above = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = MARKER.match(above.strip())
        not_run = marker.group(2) if marker and marker.group(1) == "not run by" else None
        slow = marker.group(2) if marker and marker.group(1) == "run by" else None
        code = "\n".join(lines[start + 1 : end]) + "\n"
        blocks.append(Block(str(page.relative_to(ROOT)), start + 1, language, code, not_run, slow))
        index = end + 1
    return blocks


BLOCKS = {str(page.relative_to(ROOT)): read_blocks(page) for page in PAGES}
ALL_BLOCKS = [block for blocks in BLOCKS.values() for block in blocks]


def header(code: str, key: str) -> list[str]:
    """The comma-separated values of a leading ``# key: a, b`` comment line of a block."""
    for line in code.splitlines():
        if not line.startswith("#"):
            break
        name, sep, values = line[1:].partition(":")
        if sep and name.strip() == key:
            return [value.strip() for value in values.split(",") if value.strip()]
    return []


def missing_requirement(code: str) -> str | None:
    """Why the block cannot run here (a ``# requires:`` it names is missing), or None."""
    for requirement in header(code, "requires"):
        if requirement == "cuda":
            if not torch.cuda.is_available():
                return "needs a CUDA GPU"
        elif requirement == "jax-gpu":
            probe = "import phalanx.envs.jax, jax; jax.devices('gpu')"  # the adapter sets JAX's memory option
            if subprocess.run([sys.executable, "-c", probe], capture_output=True, env=run_env()).returncode:
                return "needs JAX with a GPU backend (pip install 'jax[cuda12]')"
        elif importlib.util.find_spec(requirement) is None:
            return f"needs {requirement}, which is not installed"
    return None


def run_env(max_steps: int | None = MAX_STEPS, path: Path | None = None) -> dict[str, str]:
    """The environment of a script or command: this phalanx first on the import path (a relative
    PYTHONPATH would not survive the change of directory), one torch thread per process, the step cap."""
    source = str(Path(phalanx.__file__).resolve().parents[1])
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    paths = [source, *filter(None, [os.environ.get("PYTHONPATH")])]
    env.pop("PHALANX_DOCS_MAX_STEPS", None)
    if max_steps is not None:
        env["PHALANX_DOCS_MAX_STEPS"] = str(max_steps)
        paths.insert(0, str(BUDGET))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
    return env


def check_output(where: str, what: str, result: subprocess.CompletedProcess, shown: list[str] = ()) -> None:
    output = result.stdout + result.stderr
    tail = output[-6000:]
    assert result.returncode == 0, f"{where}: {what} exited {result.returncode}:\n{tail}"
    assert "Traceback" not in output, f"{where}: {what} printed a traceback:\n{tail}"
    printed = normalized(result.stdout)
    for value in shown:
        assert normalized(value) in printed, (
            f"{where}: the doc shows {value} as printed, but the script printed:\n{result.stdout[-3000:]}"
        )


def normalized(text: str) -> str:
    return re.sub(r"[\s()\[\]]", "", text)


def shown_values(code: str) -> list[str]:
    """The values a block says it prints: Python literals in the comment of a print(...) line, or in a
    comment line of its own right after one."""
    values, after_print = [], False
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = stripped[1:].strip() if after_print else ""
            after_print = False
        else:
            after_print = "print(" in stripped
            comment = comment_of(line) if after_print else ""
        values += [span for span in bracketed_spans(comment) if is_literal(span)]
    return values


def comment_of(line: str) -> str:
    """The comment of a line of Python, or ''."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    return next((token.string[1:].strip() for token in tokens if token.type == tokenize.COMMENT), "")


def bracketed_spans(text: str) -> list[str]:
    """The outermost (...), [...] and {...} spans of ``text``."""
    spans, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([{":
            if depth == 0:
                start = index
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start : index + 1])
    return spans


def is_literal(span: str) -> bool:
    if "..." in span:
        return False
    try:
        ast.literal_eval(span)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


# -- the blocks and their conventions ---------------------------------------------------------------
def test_every_code_block_is_fenced_with_a_language():
    """An indented code block or a fence without a language would escape these tests."""
    problems = []
    for page in PAGES:
        in_fence, previous = False, ""
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            if line.startswith("```"):
                in_fence = not in_fence
            elif not in_fence and line.startswith("    ") and line.strip() and not previous.strip():
                problems.append(f"{page.name}:{number}: an indented code block; fence it with a language")
            previous = line if not in_fence else "x"
    for block in ALL_BLOCKS:
        if block.language not in LANGUAGES:
            problems.append(f"{block.where}: language {block.language!r}, expected one of {LANGUAGES}")
    assert not problems, "\n".join(problems)


NOT_RUN_HERE = [
    block for block in ALL_BLOCKS if block.not_run or block.slow or header(block.code, "requires")
]


# What keeps a block off a CI machine: a reason must name one of these (or it is a block to run).
CANNOT_RUN_ON_CI = re.compile(
    r"GPU|CUDA|cluster|server|PostgreSQL|wandb\.ai|install|\bmake\b|machines|cores|minutes", re.I
)


@pytest.mark.parametrize("block", NOT_RUN_HERE, ids=[block.where for block in NOT_RUN_HERE])
def test_blocks_not_run_here_say_why(block):
    """The blocks the default suite does not run, each with its reason (``pytest -rs`` lists them); a
    reason that names nothing a CI machine lacks, a slow marker on a block that is not a command, or a
    block whose requirement is met here and still does not run, fails."""
    if block.not_run:
        assert CANNOT_RUN_ON_CI.search(block.not_run), (
            f"{block.where}: 'not run' because {block.not_run!r}, which names nothing a CI machine lacks "
            f"(a GPU, a cluster, a server, an account, installing, minutes of training): run the block"
        )
        pytest.skip(f"{block.where} is not run: {block.not_run}")
    if block.slow:
        assert block.language == "bash", f"{block.where}: only bash blocks run with -m slow"
        pytest.skip(f"{block.where} runs only with -m slow (make test-all): {block.slow}")
    missing = missing_requirement(block.code)
    if missing:
        pytest.skip(f"{block.where} is not run here: it {missing}")
    run_here = [b for chain in python_chains() for b in chain] + [
        b for blocks in BLOCKS.values() for b in blocks if b.language == "bash"
    ]
    assert block in run_here, f"{block.where}: its requirements are met here, yet no test runs it"


def test_not_run_markers_are_well_formed():
    """A misspelt marker, or one that is not right above a block, would not take a block out: say so."""
    marked = {block.where for block in ALL_BLOCKS if block.not_run or block.slow}
    written = [
        f"{page.relative_to(ROOT)}:{number}"
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if "<!--" in line and "test_docs.py" in line
    ]
    assert len(written) == len(marked), f"markers {written} take out only the blocks {sorted(marked)}"


# -- python blocks and bash blocks -------------------------------------------------------------------
def python_chains() -> list[list[Block]]:
    """The python blocks of every page grouped into scripts: a block with the CONTINUES marker joins
    the script of the block above it."""
    chains: list[list[Block]] = []
    for blocks in BLOCKS.values():
        page_chains: list[list[Block]] = []
        for block in blocks:
            if block.language != "python" or block.not_run:
                continue
            if block.code.startswith(CONTINUES) and page_chains:
                page_chains[-1].append(block)
            else:
                page_chains.append([block])
        chains += page_chains
    return chains


def shell_commands(code: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines left out."""
    commands, current = [], ""
    for line in code.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        commands.append(current)
        current = ""
    return commands


def resolve_stamps(command: str, directory: Path, where: str) -> str:
    """``runs/NAME__<stamp>``: the newest run directory of that name the commands before created."""

    def newest(match: re.Match) -> str:
        pattern = match.group(0).replace("<stamp>", "*")
        found = [path for path in directory.glob(pattern) if path.is_dir()]
        assert found, f"{where}: no directory matches {match.group(0)}; the commands above should create it"
        return str(max(found, key=lambda path: path.stat().st_mtime).relative_to(directory))

    return re.sub(r"[^\s'\"]*<stamp>[^\s'\"]*", newest, command)


def reader_directory(directory: Path) -> tuple[Path, Path]:
    """A directory like a fresh clone's root (examples/, .venv/bin/phalanx and python), and a directory of
    the same commands to put on PATH."""
    work, shims = directory / "repo", directory / "shims"
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    for bin_directory in (work / ".venv" / "bin", shims):
        bin_directory.mkdir(parents=True)
        for name, command in (
            ("phalanx", f'"{sys.executable}" -m phalanx'),
            ("python", f'"{sys.executable}"'),
        ):
            (bin_directory / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
            (bin_directory / name).chmod(0o755)
    return work, shims


class BlockRunner:
    """Runs what the selected tests ask for (a python script, a page's commands) in the background, two
    at a time, each test waiting for its own: a script or command mostly keeps one core busy, so on a
    2-core machine the second core halves the wall time of these tests."""

    def __init__(self, directory: Path, units: dict[str, Callable[[BlockRunner, Path], str]]) -> None:
        self.processes: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.futures = {
            key: self.pool.submit(self.outcome, unit, directory / re.sub(r"\W+", "_", key))
            for key, unit in units.items()
        }

    def outcome(self, unit: Callable[[BlockRunner, Path], str], directory: Path) -> tuple[str | None, str]:
        """(the failure, or None; what the unit printed)."""
        directory.mkdir(parents=True)
        try:
            return None, unit(self, directory)
        except AssertionError as failure:
            return str(failure), ""

    def result(self, key: str) -> tuple[str | None, str]:
        return self.futures[key].result()

    def run(self, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
        """``subprocess.run`` in a session of its own, so that close() can stop it and its children."""
        process = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        with self.lock:
            self.processes.add(process)
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            stderr += f"\n(stopped after {TIMEOUT_S} s)"
        finally:
            with self.lock:
                self.processes.discard(process)
        return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)

    def close(self) -> None:
        """Cancel what has not started; stop the process groups still running (an interrupted session)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            for process in self.processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)


def run_python_chain(chain: list[Block], runner: BlockRunner, directory: Path) -> str:
    """The chain's blocks as one script; returns its time."""
    code = "".join(f"# --- {block.where} ---\n{block.code}" for block in chain)
    name = (header(chain[0].code, "file") or ["block.py"])[0]
    (directory / name).write_text(code)
    start = time.perf_counter()
    result = runner.run([sys.executable, name], directory, run_env())
    check_output(chain[-1].where, "the script", result, shown_values(code))
    return f"{time.perf_counter() - start:6.1f} s  python {name}"


def run_shell_page(page: str, slow: bool, runner: BlockRunner, directory: Path) -> str:
    """The page's bash blocks in order, one command at a time, in one directory (``slow``: with the
    blocks only ``-m slow`` runs); returns the commands' times."""
    work, shims = reader_directory(directory)
    timings = []
    for block in BLOCKS[page]:
        if block.not_run or (block.slow and not slow) or missing_requirement(block.code):
            continue  # listed by test_blocks_not_run_here_say_why
        if block.language == "yaml" and header(block.code, "file"):
            (work / header(block.code, "file")[0]).write_text(block.code)
        if block.language != "bash":
            continue
        for command in shell_commands(block.code):
            command = resolve_stamps(command, work, block.where)
            env = run_env(None if "--stop-return" in command else MAX_STEPS, path=shims)
            start = time.perf_counter()
            result = runner.run(["bash", "-c", command], work, env)
            timings.append(f"{time.perf_counter() - start:6.1f} s  {command}")
            check_output(block.where, f"`{command}`", result)
    return "\n".join(timings)


PYTHON_CHAINS = python_chains()
SHELL_PAGES = [
    pytest.param(
        page, slow, id=page + (" with the slow blocks" if slow else ""), marks=[pytest.mark.slow] * slow
    )
    for page, blocks in BLOCKS.items()
    for slow in (False, True)
    if any(block.language == "bash" and not block.not_run and (slow or not block.slow) for block in blocks)
    and (not slow or any(block.slow for block in blocks))
]


@pytest.fixture(scope="session")
def block_runner(request, tmp_path_factory):
    """Starts, in the background, every script and page of commands the selected tests will ask for."""
    units = {}
    for item in request.session.items:  # the pages first: they take longest
        if getattr(item, "originalname", "") == "test_shell_blocks_run_in_order":
            page, slow = item.callspec.params["page"], item.callspec.params["slow"]
            units[f"shell {page} {slow}"] = functools.partial(run_shell_page, page, slow)
    for item in request.session.items:
        if getattr(item, "originalname", "") == "test_python_block_runs_as_a_script":
            chain = item.callspec.params["chain"]
            if not missing_requirement(chain[0].code):
                units[f"python {chain[-1].where}"] = functools.partial(run_python_chain, chain)
    runner = BlockRunner(tmp_path_factory.mktemp("docs"), units)
    yield runner
    runner.close()


# The pages' tests come first, in the order the runner starts their work (the pages, then the scripts):
# a test's duration (--durations) is then the time its own work took to finish, where a script's test
# placed first would wait, and be timed, for the pages started before it.
@pytest.mark.parametrize("page, slow", SHELL_PAGES)
def test_shell_blocks_run_in_order(page, slow, block_runner):
    failure, timings = block_runner.result(f"shell {page} {slow}")
    if failure:
        pytest.fail(failure, pytrace=False)
    print(timings)


@pytest.mark.parametrize("chain", PYTHON_CHAINS, ids=[chain[-1].where for chain in PYTHON_CHAINS])
def test_python_block_runs_as_a_script(chain, block_runner):
    missing = missing_requirement(chain[0].code)
    if missing:
        pytest.skip(f"{chain[-1].where} {missing}")
    failure, timing = block_runner.result(f"python {chain[-1].where}")
    if failure:
        pytest.fail(failure, pytrace=False)
    print(timing)


# -- what the pages say -------------------------------------------------------------------------------
def test_readme_names_exactly_the_two_setup_commands_first():
    first_block = BLOCKS["README.md"][0]
    commands = [command.split("#")[0].strip() for command in shell_commands(first_block.code)]
    assert commands == ["make demo", "make test"]


def test_readme_links_the_guides():
    readme = (ROOT / "README.md").read_text()
    for guide in (
        "environments",
        "parallelism",
        "population",
        "multi_agent",
        "architecture",
        "hooks",
        "compile",
    ):
        assert f"(docs/{guide}.md)" in readme, guide


def test_multi_agent_guide_names_every_multi_agent_algorithm_and_env():
    from phalanx.marl.registry import BUILTIN_IDS
    from phalanx.registry import ALGORITHMS, get_algorithm

    text = (ROOT / "docs" / "multi_agent.md").read_text()
    for name in ALGORITHMS:
        if get_algorithm(name).multi_agent:
            assert f"| `{name}` |" in text, name
    for env_id in BUILTIN_IDS:
        assert env_id.removesuffix("_continuous") in text, env_id


def test_architecture_page_names_every_module():
    """docs/architecture.md is kept current: a new module (or a moved one) must find its place there."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    package = Path(phalanx.__file__).parent
    modules = [path.relative_to(package).as_posix() for path in package.rglob("*.py")]
    missing = [
        name for name in modules if name.rsplit("/", 1)[-1] != "__init__.py" and f"`{name}`" not in text
    ]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_docs_step_cap_caps_every_run_and_phalanx_reads_no_such_variable(tmp_path):
    """The cap the scripts and commands above run with caps total_steps wherever a config comes from;
    without tests/docs_budget on the path nothing changes, whatever the environment holds."""
    script = tmp_path / "budget.py"
    script.write_text(
        textwrap.dedent(
            """
            import dataclasses
            from phalanx.config import TrainConfig, make_config
            print(make_config("ppo", "CartPole-v1").total_steps)
            print(make_config("ppo", "CartPole-v1", total_steps=1000).total_steps)
            config = TrainConfig.from_dict({"algo": "sac", "env": "Pendulum-v1", "total_steps": 10**6})
            print(config.total_steps, dataclasses.replace(config, total_steps=10**7).total_steps)
            """
        )
    )
    capped = subprocess.run([sys.executable, str(script)], env=run_env(3000), capture_output=True, text=True)
    assert capped.stdout.split() == ["3000", "1000", "3000", "3000"], capped.stderr
    free = subprocess.run(
        [sys.executable, str(script)],
        env={**run_env(None), "PHALANX_DOCS_MAX_STEPS": "3000", "PHALANX_MAX_STEPS": "3000"},
        capture_output=True,
        text=True,
    )
    assert free.stdout.split() == ["500000", "1000", "1000000", "10000000"], free.stderr


# -- links -------------------------------------------------------------------------------------------
def markdown_files() -> list[Path]:
    """The repository's pages, outside hidden directories, which are not walked (.venv holds thousands of
    files: a few seconds of every collection of this file)."""
    pages = []
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
        pages += [Path(directory, name) for name in files if name.endswith(".md") and name[0] != "."]
    return sorted(pages)


MARKDOWN_FILES = markdown_files()
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`(\.\.?/[^`\s]+)`")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return found


def test_links_resolve_inside_the_repository():
    """Every relative link of README and docs (and of every other page of the repository) names a file
    of the repository that exists, with an anchor that exists; no path leads out of the repository."""
    problems = []
    for page in MARKDOWN_FILES:
        text, where = page.read_text(), page.relative_to(ROOT)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.is_relative_to(ROOT):
                problems.append(f"{where}: link {target} leads out of the repository")
            elif not resolved.exists():
                problems.append(f"{where}: link {target}: {resolved.relative_to(ROOT)} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: link {target}: no heading with anchor #{anchor}")
        for path in CODE_PATH.findall(text):
            if not (page.parent / path).resolve().is_relative_to(ROOT):
                problems.append(f"{where}: `{path}` leads out of the repository")
    assert MARKDOWN_FILES and not problems, "\n".join(problems)
