"""Atomic, durable writes: every file of a run, a population or a leaderboard is written through here.

A file is written to ``<name>.tmp`` beside it, flushed and fsynced, renamed over ``<name>``, and its
directory fsynced: whoever reads it, and a run resumed after a kill or a power loss, finds the old
file or the new one, never a part of one. A kill leaves at most the ``.tmp`` file, which the next
write of that file replaces. A file that grows (metrics.csv, decisions.jsonl) gets whole lines
(:func:`append_line`), and a line a kill cut short is dropped before the next one is added. A
directory built in one piece (a population's exported best member) is built beside its place and
renamed into it (:func:`replace_directory`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", **open_arguments: Any) -> Iterator[IO[Any]]:
    """``with atomic_write(path, "wb") as file:`` write ``file``; ``path`` appears whole when the block
    ends, or not at all (an exception leaves the old ``path`` and removes the temporary file)."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    file = open(temporary, mode, **open_arguments)
    try:
        yield file
        file.flush()
        os.fsync(file.fileno())
    except BaseException:
        file.close()
        temporary.unlink(missing_ok=True)
        raise
    file.close()
    os.replace(temporary, path)
    sync_directory(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_write(path, "w") as file:
        file.write(text)


def append_line(path: str | Path, line: str, sync: bool = True) -> None:
    """Add ``line`` (no newline in it) to the end of ``path``, durably (``sync=False``: the caller makes it
    durable later, with :func:`fsync_file`); a last line without its newline, cut short by a kill, is
    dropped first."""
    with open(path, "a+b") as file:
        end = file.seek(0, os.SEEK_END)
        if end:
            file.seek(end - 1)
            if file.read(1) != b"\n":
                file.seek(0)
                file.truncate(file.read().rfind(b"\n") + 1)
        file.write(line.encode() + b"\n")
        file.flush()
        if sync:
            os.fsync(file.fileno())


def fsync_file(path: str | Path) -> None:
    """Make what was written to ``path`` survive a power loss."""
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def sync_directory(directory: str | Path) -> None:
    """Make the names in ``directory`` (a file renamed or created in it) survive a power loss."""
    if os.name != "posix":  # elsewhere a directory cannot be opened to be fsynced
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def replace_directory(target: str | Path) -> Iterator[Path]:
    """``with replace_directory(target) as directory:`` fill ``directory``; it then takes the place of
    ``target`` (and of the old ``target``, removed), fsynced. An exception leaves the old ``target``.

    For what can be built again (an export): ``target`` is never a part of either, but a kill between
    the two renames leaves it missing (the old one in ``.old``, the new one in ``.tmp``) until the next
    replace."""
    target = Path(target)
    temporary, old = target.with_name(target.name + ".tmp"), target.with_name(target.name + ".old")
    for leftover in (temporary, old):
        shutil.rmtree(leftover, ignore_errors=True)
    temporary.mkdir(parents=True)
    try:
        yield temporary
        for directory, _, names in os.walk(temporary):
            for name in names:
                with open(os.path.join(directory, name), "rb") as file:
                    os.fsync(file.fileno())
            sync_directory(directory)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if target.exists():
        os.replace(target, old)
    os.replace(temporary, target)
    sync_directory(target.parent)
    shutil.rmtree(old, ignore_errors=True)
