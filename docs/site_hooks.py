"""MkDocs hooks of the documentation site (mkdocs.yml): the pages as they read on the repository, and the
reference pages generated from the code at each build (none of them is checked in).

- README.md is the home page (``index.md``). A page's links to repository files outside docs/ (an example,
  BENCHMARKS.md and its figures) bring those files into the site at their repository path, and every link
  is rewritten from the repository's layout to the site's, so that the Markdown stays as GitHub and
  tests/test_docs.py read it;
- ``reference/cli.md``: every command's ``--help``, as its own parser prints it;
- ``reference/configuration.md``: every field of the config dataclasses, its type, default and docstring;
- ``reference/api/*.md``: the public names, rendered by mkdocstrings from their docstrings, each once.

A guide in docs/ that the nav leaves out is a warning, so a strict build fails until it finds its place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import posixpath
import re
import sys
import types
from collections import deque
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.nav import Navigation
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
DOCS = "docs"
HOME = "README.md"
LINK = re.compile(r"(\[[^\]]*\]\()([^)\s]+)(\))")  # as tests/test_docs.py reads links
HELP_WIDTH = "90"  # what the text column shows without scrolling

SOURCES: dict[str, str] = {}
"""Each site page or file (its path in docs_dir) -> the repository file it comes from."""


def site_path(repository_path: str) -> str:
    """Where a repository file is in the site: README.md is the home page, docs/ the site's root, any
    other file at its repository path."""
    if repository_path == HOME:
        return "index.md"
    if repository_path.startswith(f"{DOCS}/"):
        return repository_path.removeprefix(f"{DOCS}/")
    return repository_path


def linked_files(repository_path: str) -> list[str]:
    """The repository files a Markdown file links to (relative links that name an existing file)."""
    found = []
    for _, target, _ in LINK.findall((ROOT / repository_path).read_text()):
        path = target.partition("#")[0]
        if not path or re.match(r"[a-z]+:", path):
            continue
        resolved = (ROOT / repository_path).parent.joinpath(path).resolve()
        if resolved.is_file() and resolved.is_relative_to(ROOT):
            found.append(resolved.relative_to(ROOT).as_posix())
    return found


def on_files(files: Files, config: Any) -> Files:
    """The README, the repository files the pages link to, and the generated reference pages."""
    SOURCES.clear()
    for file in files.documentation_pages():
        SOURCES[file.src_uri] = f"{DOCS}/{file.src_uri}"
    pending = deque([HOME, *SOURCES.values()])
    while pending:
        repository_path = pending.popleft()
        if site_path(repository_path) not in SOURCES:
            SOURCES[site_path(repository_path)] = repository_path
            files.append(
                File.generated(config, site_path(repository_path), abs_src_path=str(ROOT / repository_path))
            )
        if repository_path.endswith(".md"):
            pending.extend(path for path in linked_files(repository_path) if site_path(path) not in SOURCES)
    for path, content in generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    """A repository page's relative links, from where the file is in the repository to where it is in the
    site; MkDocs then checks them (a target the site lacks fails the strict build)."""
    source = SOURCES.get(page.file.src_uri)
    if source is None:  # a generated page: written with the site's paths
        return markdown

    def to_site(match: re.Match) -> str:
        path, hash_sign, anchor = match.group(2).partition("#")
        if not path or re.match(r"[a-z]+:", path):
            return match.group(0)
        target = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if site_path(target) not in SOURCES:
            return match.group(0)
        relative = posixpath.relpath(site_path(target), posixpath.dirname(page.file.src_uri) or ".")
        return f"{match.group(1)}{relative}{hash_sign}{anchor}{match.group(3)}"

    return LINK.sub(to_site, markdown)


def on_nav(nav: Navigation, config: Any, files: Files) -> Navigation:
    """Every guide of docs/ has its place in the nav (mkdocs.yml)."""
    listed = {page.file.src_uri for page in nav.pages}
    missing = sorted(
        uri for uri, source in SOURCES.items() if source.startswith(f"{DOCS}/") and uri not in listed
    )
    if missing:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"mkdocs.yml: the nav does not list {missing}; add each under Guides")
    return nav


def generated_pages() -> dict[str, str]:
    pages = {"reference/cli.md": cli_reference(), "reference/configuration.md": configuration_reference()}
    pages.update(api_reference())
    return pages


# -- the CLI reference ------------------------------------------------------------------------------
def help_text(argv: list[str]) -> str:
    """What ``phalanx ARGV`` prints, as a terminal of HELP_WIDTH columns shows it."""
    from phalanx.cli import main

    output = io.StringIO()
    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse and tyro exit after --help
                code = exit_.code
    finally:
        if width is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = width
    if code not in (0, None):
        raise RuntimeError(f"`phalanx {' '.join(argv)}` exited {code}:\n{output.getvalue()}")
    return "\n".join(line.rstrip() for line in output.getvalue().strip("\n").splitlines())


def cli_reference() -> str:
    """Each command's help: every command of ``phalanx.cli.COMMANDS`` has a section, so a new command
    has one too."""
    from phalanx.cli import COMMANDS

    helps = {"phalanx": ["--help"]} | {f"phalanx {command}": [command, "--help"] for command in COMMANDS}
    helps["phalanx train"] = ["train", "ppo", "--help"]  # the flags and PPO's hyperparameters
    helps["phalanx envs"] = []  # no flags: it lists the env ids
    helps["phalanx population run"] = ["population", "run", "--help"]
    helps["phalanx population scale"] = ["population", "scale", "--help"]
    notes = {
        "phalanx train": (
            "The flags of `phalanx train ppo ENV`: the run's settings, then PPO's hyperparameters. "
            "`phalanx train ALGO --help` shows another algorithm's; the "
            "[configuration reference](configuration.md) lists every algorithm's, with their defaults."
        ),
        "phalanx envs": "Lists the environment ids (built-in, Gymnasium, Atari, multi-agent); no flags.",
    }
    lines = [
        "# CLI reference",
        "",
        "Generated at each build from the parsers of `phalanx` itself: every section is what that "
        f"command's `--help` prints, {HELP_WIDTH} columns wide. The flags of `phalanx train` are the "
        "fields of the [configuration](configuration.md), with `-` for `_`.",
        "",
    ]
    for title, argv in helps.items():
        lines += [f"## `{title}`", ""]
        if title in notes:
            lines += [notes[title], ""]
        if argv:
            lines += ["```text", help_text(argv), "```", ""]
    return "\n".join(lines)


# -- the configuration reference ----------------------------------------------------------------------
def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, its own or inherited."""
    from phalanx.cli.arguments import field_docs

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and klass is not object:
            docs.update(field_docs(klass))
    return docs


def default_text(field: dataclasses.Field) -> str:
    """A field's default as YAML writes it (``null``, ``[64, 64]``), a nested config's name, or required."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return f"[{type(value).__name__}](#{type(value).__name__.lower()})"
    from phalanx.config.coercion import plain

    return f"`{json.dumps(plain(value))}`"


def type_text(field: dataclasses.Field) -> str:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    return f"`{kind}`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def field_table(cls: type, names: list[str] | None = None) -> list[str]:
    """A table of ``cls``'s fields (or those of ``names``): field, type, default, what it sets. A field
    without a docstring stops the build: every setting is documented where it is declared."""
    docs = field_docstrings(cls)
    rows = ["| Field | Type | Default | What it sets |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(cls):
        if names is not None and field.name not in names:
            continue
        if field.name not in docs:
            raise RuntimeError(f"{cls.__module__}.{cls.__qualname__}.{field.name} has no docstring under it")
        rows.append(
            f"| `{field.name}` | {cell(type_text(field))} | {cell(default_text(field))} | "
            f"{cell(docs[field.name])} |"
        )
    return [*rows, ""]


def class_section(cls: type, level: str = "##") -> list[str]:
    return [f"{level} {cls.__name__}", "", cell((cls.__doc__ or "").strip()), "", *field_table(cls)]


def configuration_reference() -> str:
    """TrainConfig, the hyperparameters every algorithm has, each algorithm's own, and the configs of
    populations and searches; generated from the dataclasses and the docstrings under their fields."""
    from phalanx.config import AlgoConfig, TrainConfig
    from phalanx.population.evolution import PopulationConfig, Resources
    from phalanx.registry import algorithm_names, config_class
    from phalanx.tuning.settings import TuneConfig

    lines = [
        "# Configuration reference",
        "",
        "Generated at each build from the config dataclasses and the docstring under each field. A run is a "
        "`TrainConfig`; its `hyperparameters` are the algorithm's config. Every field can be set the same "
        "ways: `phalanx.make_config(algo, env, name=value)`, a key of a YAML file (`--config FILE`, "
        "`config.yaml` of a run directory), or a CLI flag, `--name-with-dashes VALUE` "
        "([CLI reference](cli.md)). Defaults are the dataclasses'; the preset shipped for an algorithm "
        "and env (`src/phalanx/presets/`) changes some of them for that pair.",
        "",
        *class_section(TrainConfig),
        *class_section(AlgoConfig),
        "## Each algorithm's hyperparameters",
        "",
        "Each algorithm's config class: its own fields, and those of `AlgoConfig` whose default it changes "
        "(the others are as in [AlgoConfig](#algoconfig)).",
        "",
    ]
    classes: dict[type, list[str]] = {}
    for name in algorithm_names():
        classes.setdefault(config_class(name), []).append(name)
    common = {field.name: default_text(field) for field in dataclasses.fields(AlgoConfig)}
    for cls, names in classes.items():
        own = [
            field.name
            for field in dataclasses.fields(cls)
            if field.name not in common or default_text(field) != common[field.name]
        ]
        algorithms = ", ".join(f"`{name}`" for name in names)
        lines += [
            f"### {cls.__name__}",
            "",
            f"Algorithms: {algorithms}. {cell((cls.__doc__ or '').strip())}",
            "",
        ]
        lines += field_table(cls, own)
    lines += [
        "## Populations and searches",
        "",
        "`phalanx population run` and `phalanx tune` take a `base` TrainConfig and these settings.",
        "",
    ]
    for cls in (PopulationConfig, Resources, TuneConfig):
        lines += class_section(cls, "###")
    return "\n".join(lines)


# -- the API reference ----------------------------------------------------------------------------------
API_PAGES = {
    "phalanx": ("phalanx", "The names of `import phalanx`: train, evaluate, export, load, configure."),
    "vecenv": (
        "The VecEnv contract",
        "What an environment implements to be stepped by phalanx (also on the "
        "[home page](../../index.md#the-vecenv-contract)), from `phalanx.envs.core`:\n\n"
        "::: phalanx.envs.core\n    options:\n      members: false\n      show_root_heading: false\n"
        "      show_root_toc_entry: false",
    ),
    "hooks": (
        "Hooks",
        "Your code in the training loop: subclass `Hook` and pass instances to `phalanx.train(config, "
        "hooks=[...])` ([guide](../../hooks.md)). A hook's methods receive the `Run`.",
    ),
    "envs": ("phalanx.envs", "Batched environments on torch tensors: adapters, wrappers and the registry."),
    "finance": ("phalanx.finance", "Market data, indicators and performance metrics (the `finance` extra)."),
    "marl": (
        "phalanx.marl",
        "Multi-agent environments, adapters and algorithms ([guide](../../multi_agent.md)).",
    ),
}


def public_names(module_name: str) -> dict[str, str]:
    """A module's public names, in alphabetical order -> the path where each is defined (``VecEnv`` ->
    ``phalanx.envs.core.VecEnv``), so that an object re-exported in several places is documented once."""
    module = importlib.import_module(module_name)
    exports = getattr(module, "_EXPORTS", {})  # the lazily imported names of phalanx and phalanx.finance
    paths = {}
    for name in sorted(module.__all__, key=str.lower):
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            paths[name] = value.__name__
        elif hasattr(value, "__qualname__") and hasattr(value, "__module__"):
            paths[name] = f"{value.__module__}.{value.__qualname__}"
        else:  # a constant: where the module imports it from
            paths[name] = f"{exports.get(name, module_name)}.{name}"
    return paths


def api_contents() -> dict[str, dict[str, str]]:
    """Each API page's names -> their paths, in the order the page shows them."""
    from phalanx.envs.check import CheckReport, check_vec_env
    from phalanx.envs.core import BatchedVecEnv, VecEnv
    from phalanx.envs.wrapper_base import VecEnvWrapper
    from phalanx.train.run import Hook, Run
    from phalanx.train.state import Schedule

    def paths(*objects: Any) -> dict[str, str]:
        return {value.__name__: f"{value.__module__}.{value.__qualname__}" for value in objects}

    return {
        "vecenv": paths(VecEnv, BatchedVecEnv, check_vec_env, CheckReport, VecEnvWrapper),
        "hooks": paths(Hook, Run, Schedule),
        "phalanx": public_names("phalanx"),
        "envs": public_names("phalanx.envs"),
        "finance": public_names("phalanx.finance"),
        "marl": public_names("phalanx.marl"),
    }


def api_reference() -> dict[str, str]:
    """One page per entry of API_PAGES. Each object is rendered on the first page that names it; the
    later pages link to it (mkdocstrings renders one object once, autorefs finds it by its path)."""
    contents = api_contents()
    page_of_module = {f"phalanx.{page}" if page != "phalanx" else "phalanx": page for page in API_PAGES}
    rendered: dict[str, str] = {}
    pages = {}
    for page, names in contents.items():
        title, intro = API_PAGES[page]
        lines = [f"# {title}", "", intro, ""]
        links = []
        for name, path in names.items():
            if path in page_of_module:
                links.append(f"- [`{name}`]({page_of_module[path]}.md): the module, on its own page")
            elif path in rendered:
                links.append(
                    f"- [`{name}`][{path}]: in [{API_PAGES[rendered[path]][0]}]({rendered[path]}.md)"
                )
            else:
                rendered[path] = page
                members = "\n    options:\n      members: false" if path in sys.modules else ""
                lines += [f"::: {path}{members}", ""]
        if links:
            lines += ["## Documented on other pages", "", *links, ""]
        pages[f"reference/api/{page}.md"] = "\n".join(lines)
    return pages


def on_page_content(html: str, page: Page, config: Any, files: Files) -> str:
    """Sphinx roles in docstrings (``:class:`X```) read as code, without the role."""
    return re.sub(r":(?:class|func|meth|mod|attr|data|exc):(<code>)", r"\1", html)
