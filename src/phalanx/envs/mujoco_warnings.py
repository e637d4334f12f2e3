"""MuJoCo's compiler warnings about Gymnasium's own model files, silenced while Gymnasium builds them.

MuJoCo >= 3.3 deprecates the ``settotalmass`` compiler attribute that Gymnasium's ``half_cheetah.xml``
still sets, and warns about it each time the model is compiled: once per sub-env (16 lines for the
HalfCheetah preset), each also appended to ``MUJOCO_LOG.TXT`` in the current directory. The model it
compiles is the one Gymnasium intends (the attribute still works), and the user cannot act on the
warning, so :func:`gymnasium_model_warnings_silenced` drops exactly these messages while a Gymnasium
MuJoCo env is made. Any other MuJoCo warning in that time goes on to the handler that was installed
before, or, if none was (MuJoCo's default), to stderr as MuJoCo prints it (``WARNING: <text>``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import gymnasium as gym

SILENCED = ("compiler attribute 'settotalmass' is deprecated",)
"""The start of each MuJoCo warning that is dropped: deprecations in Gymnasium's shipped model files."""
MUJOCO_ENTRY_POINT = "gymnasium.envs.mujoco."


def is_gymnasium_mujoco(env_id: str) -> bool:
    """Whether ``env_id`` is one of Gymnasium's MuJoCo environments (by its entry point, without
    importing it)."""
    spec = gym.envs.registry.get(env_id)
    return (
        spec is not None
        and isinstance(spec.entry_point, str)
        and spec.entry_point.startswith(MUJOCO_ENTRY_POINT)
    )


def forward_warning(previous: Callable[[str], None] | None) -> Callable[[str], None]:
    """A MuJoCo warning handler that drops the :data:`SILENCED` messages and passes every other one to
    ``previous`` (or prints it to stderr as MuJoCo's default handler does, when there was none)."""

    def handle(message: str) -> None:
        if message.startswith(SILENCED):
            return
        if previous is not None:
            previous(message)
        else:
            print(f"WARNING: {message}", file=sys.stderr, flush=True)

    return handle


@contextlib.contextmanager
def gymnasium_model_warnings_silenced(env_id: str) -> Iterator[None]:
    """While making ``env_id``: for Gymnasium's MuJoCo envs, MuJoCo's warning handler is
    :func:`forward_warning`, and the one before is restored after; any other id: nothing changes (and
    mujoco is not imported)."""
    if not is_gymnasium_mujoco(env_id):
        yield
        return
    try:
        import mujoco
    except ImportError:  # make_gym_env reports the missing extra
        yield
        return
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(forward_warning(previous))
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)
