"""What the commands print with: the console for messages (on stderr, so that a command's output on
stdout can be piped), and text wrapped to the terminal. Light to import (rich only): every command
module uses it, ``phalanx --help`` and ``phalanx envs`` too.
"""

from __future__ import annotations

import shutil
import textwrap

from rich.console import Console

console = Console(stderr=True)


def wrapped(text: str, first: str = "  ", indent: str = "    ") -> str:
    """``text`` after ``first``, wrapped to the terminal (80 columns at most) with every continuation line
    indented by ``indent``; words (env ids such as CartPole-v1) are never broken."""
    width = max(min(shutil.get_terminal_size().columns, 80), 40)
    return textwrap.fill(
        text,
        width=width,
        initial_indent=first,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=False,
    )
