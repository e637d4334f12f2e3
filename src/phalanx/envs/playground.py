"""MuJoCo Playground (``playground`` on PyPI, module ``mujoco_playground``) behind the VecEnv contract.

``make_env("playground:CheetahRun", num_envs=4096, device="cuda")`` builds one
:class:`PlaygroundVecEnv`: Google DeepMind's MJX versions of the DeepMind Control Suite tasks (and,
where their robot models are present, the locomotion and manipulation tasks), vmapped and jitted
through :class:`~phalanx.envs.jax.JaxVecEnv`. Observations, rewards and flags reach torch through
DLPack without a copy; the autoreset of ended sub-envs happens inside the same jitted step, with
``info["final_obs"]`` the true last observation of every ended episode.

Episodes: a Playground environment has no time limit of its own; its config's ``episode_length``
(1000 simulator steps for every DM Control task) is what Playground's own training wrappers use, and
the adapter truncates there, counting ``action_repeat`` simulator steps per agent step as Playground
does (``ceil(episode_length / action_repeat)`` agent steps). ``terminated`` is the env's
``state.done`` (a DM Control task ends only if the physics diverges to NaN). Unlike Playground's
Brax training wrapper, which puts an ended sub-env back into its first, cached state, every reset
here draws a fresh initial state from the sub-env's key.

Assets: the ``playground`` wheel ships the DM Control Suite's XML models. Its locomotion and
manipulation tasks load their robots from MuJoCo Menagerie, which Playground ``git clone``\\ s from
GitHub the first time such a task is loaded. phalanx never downloads at run time: those tasks are
refused with an :class:`~phalanx.errors.EnvError` (naming the clone to do by hand) unless the
Menagerie checkout is already where Playground looks for it.

Physics implementation: the task config's own, MuJoCo Warp (``"warp"``) for Playground 0.2's DM
Control tasks; its sub-envs share some buffers (the contacts), which the autoreset leaves as they are,
as Playground's own wrapper does. ``config_overrides={"impl": "jax"}`` picks MJX's pure-JAX
implementation instead: on a CPU it compiled about 4x slower and stepped about 8x slower than Warp
(CheetahRun, 256 sub-envs, on a loaded 2-core machine).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from phalanx.envs.jax import JaxVecEnv, close_names, float32_box
from phalanx.errors import EnvError, import_optional

__all__ = ["PlaygroundVecEnv", "playground_envs"]

_INSTALL_HINT = (
    "Install MuJoCo Playground with `pip install 'phalanx[playground]'` (the `playground` package: "
    "mujoco-mjx, brax, jax); on a GPU also a CUDA build of jax, e.g. `pip install 'jax[cuda12]'`."
)
_MENAGERIE_URL = "https://github.com/google-deepmind/mujoco_menagerie"


def _playground(who: str) -> Any:
    """The ``mujoco_playground`` package, or an EnvError naming the missing package and the install.

    MuJoCo Warp's physics runs on NVIDIA Warp, which prints its version and a line for every module it
    compiles or loads (some thirty for one task): quiet, before Warp starts, as phalanx's logs are."""
    with contextlib.suppress(ImportError, AttributeError):  # Warp 1.19: log_level (earlier: config.quiet)
        import warp

        warp.config.log_level = warp.LOG_WARNING
    return import_optional(
        "mujoco_playground",
        EnvError,
        f"{who} needs the package '{{package}}' (importing 'mujoco_playground' failed), which is not "
        f"installed in this environment. {_INSTALL_HINT}",
    )


def playground_envs() -> dict[str, list[str]]:
    """Playground's environment names by what they need: ``{"ready": [...], "needs_menagerie": [...]}``.

    ``ready``: the tasks whose models the ``playground`` package ships (the DeepMind Control Suite), or
    whose Menagerie robots are already on disk. ``needs_menagerie``: the locomotion and manipulation
    tasks while Menagerie is absent (Playground would clone it from GitHub when loading them).
    """
    playground = _playground("playground_envs()")
    from mujoco_playground._src import dm_control_suite, mjx_env

    shipped = set(dm_control_suite.ALL_ENVS)
    menagerie_present = mjx_env.MENAGERIE_PATH.exists()
    names = list(playground.registry.ALL_ENVS)
    return {
        "ready": [name for name in names if name in shipped or menagerie_present],
        "needs_menagerie": [name for name in names if name not in shipped and not menagerie_present],
    }


def _apply_overrides(config: Any, overrides: Mapping[str, Any], env_name: str) -> None:
    """Set ``overrides`` (flattened keys, ``"a.b"`` for nested fields) on the ml_collections ``config``."""
    for key, value in overrides.items():
        node = config
        parts = str(key).split(".")
        for depth, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node.keys():
                known = sorted(node.keys()) if hasattr(node, "keys") else []
                where = ".".join(parts[:depth]) or "the config"
                raise EnvError(
                    f"PlaygroundVecEnv({env_name!r}): config_overrides has the key {key!r}, but {where} has "
                    f"no field {part!r}; its fields are {known}. Override only existing fields (nested "
                    "ones as 'parent.child')."
                )
            if depth < len(parts) - 1:
                node = node[part]
        try:
            node[parts[-1]] = value
        except (TypeError, ValueError) as error:
            raise EnvError(
                f"PlaygroundVecEnv({env_name!r}): config_overrides[{key!r}] = {value!r} does not fit the "
                f"field ({error}). Give a value of the field's type (the default is {node[parts[-1]]!r})."
            ) from None


class PlaygroundVecEnv(JaxVecEnv):
    """``num_envs`` copies of a MuJoCo Playground environment (``registry.load(env_name)``) as one batch.

    Args:
        env_name: a Playground name, e.g. ``"CheetahRun"``, ``"WalkerWalk"``, ``"CartpoleBalance"``
            (:func:`playground_envs` lists them).
        num_envs: number of sub-envs, stepped as one vmapped batch (thousands on a GPU).
        device: torch device of the returned tensors; JAX runs on the matching device.
        episode_length: the time limit in simulator steps (truncated when reached); None: the env
            config's ``episode_length`` (1000 for the DM Control tasks).
        action_repeat: simulator steps per agent step, their rewards summed (a sub-env that
            terminates within the repeat stops there); None: the config's ``action_repeat`` (1).
        config_overrides: fields of the env's config to change, e.g. ``{"impl": "jax"}`` or
            ``{"ctrl_dt": 0.02}`` (nested fields as ``"parent.child"``).
        observation_key: for envs whose observation is a dict (the locomotion tasks: ``"state"`` for
            the policy, ``"privileged_state"`` for an asymmetric critic), the entry to observe.

    The action space is ``Box(-1, 1, (action_size,))``, the range every Playground env is trained
    in; the observation space an unbounded float32 ``Box``. Compilation happens at the first reset
    and the first step: tens of seconds for a DM Control task on a CPU.
    """

    def __init__(
        self,
        env_name: str,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        episode_length: int | None = None,
        action_repeat: int | None = None,
        config_overrides: Mapping[str, Any] | None = None,
        observation_key: str = "state",
    ) -> None:
        who = f"PlaygroundVecEnv({env_name!r})"
        playground = _playground(who)
        from mujoco_playground._src import dm_control_suite, mjx_env

        names = list(playground.registry.ALL_ENVS)
        if env_name not in names:
            raise EnvError(
                f"PlaygroundVecEnv: unknown MuJoCo Playground environment {env_name!r}."
                f"{close_names(str(env_name), names)} Available: {', '.join(names)}."
            )
        if env_name not in dm_control_suite.ALL_ENVS and not mjx_env.MENAGERIE_PATH.exists():
            raise EnvError(
                f"{who}: this task's robot model comes from MuJoCo Menagerie, which the playground package "
                f"does not ship: loading it would git-clone {_MENAGERIE_URL} at run time, and phalanx does "
                "not download while building an env. Clone it once yourself, at the commit Playground "
                f"pins: `git clone {_MENAGERIE_URL} {mjx_env.MENAGERIE_PATH} && git -C "
                f"{mjx_env.MENAGERIE_PATH} checkout {mjx_env.MENAGERIE_COMMIT_SHA}`. The tasks that run "
                f"without a download (DeepMind Control Suite): {', '.join(dm_control_suite.ALL_ENVS)}."
            )
        config = playground.registry.get_default_config(env_name)
        _apply_overrides(config, dict(config_overrides or {}), env_name)
        if config.get("vision", False):
            raise EnvError(
                f"{who}: vision=True asks for pixel observations from the Madrona batch renderer, which "
                "this adapter does not drive; it observes the state vector. Leave 'vision' False."
            )
        episode_length = config.episode_length if episode_length is None else episode_length
        action_repeat = config.get("action_repeat", 1) if action_repeat is None else action_repeat
        for name, value in (("episode_length", episode_length), ("action_repeat", action_repeat)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise EnvError(
                    f"{who}: {name} must be an integer >= 1, got {value!r}. Pass a number of simulator steps."
                )
        try:
            env = playground.registry.load(env_name, config=config)
        except (NotImplementedError, ValueError, TypeError, KeyError) as error:
            raise EnvError(
                f"{who}: mujoco_playground.registry.load failed with the config {config.to_dict()} "
                f"({type(error).__name__}: {error}). Check config_overrides against the env's defaults "
                f"(mujoco_playground.registry.get_default_config({env_name!r}))."
            ) from None
        self.env_name = env_name
        self.env = env
        self.config = config
        self.episode_length = int(episode_length)
        self.action_repeat = int(action_repeat)
        self.observation_key = observation_key
        import jax  # installed with mujoco_playground

        abstract_obs = jax.eval_shape(lambda key: self._observe(env.reset(key)), jax.random.PRNGKey(0))
        observation_space = gym.spaces.Box(-np.inf, np.inf, shape=tuple(abstract_obs.shape), dtype=np.float32)
        action_space = float32_box(-1.0, 1.0, (int(env.action_size),))
        super().__init__(
            num_envs,
            observation_space,
            action_space,
            device,
            max_episode_steps=math.ceil(self.episode_length / self.action_repeat),
        )

    def _observe(self, state: Any) -> Any:
        """The observed array of a Playground state (``state.obs``, or its ``observation_key`` entry)."""
        obs = state.obs
        if not isinstance(obs, Mapping):
            return obs
        if self.observation_key not in obs:
            raise EnvError(
                f"PlaygroundVecEnv({self.env_name!r}): the observation is a dict with the entries "
                f"{sorted(obs)}, and observation_key={self.observation_key!r} is not one of them. Pass "
                "observation_key= one of those (the policy's is usually 'state')."
            )
        return obs[self.observation_key]

    def _reset_one(self, key: Any) -> tuple[Any, Any]:
        state = self.env.reset(key)
        return state, self._observe(state)

    def _step_one(self, key: Any, state: Any, action: Any) -> tuple[Any, Any, Any, Any, Any]:
        jax = self._jax
        jnp = jax.numpy
        if self.action_repeat == 1:
            state = self.env.step(state, action)
            return state, self._observe(state), state.reward, state.done > 0.5, jnp.zeros((), bool)

        def repeat(carried: tuple[Any, Any, Any], _: Any) -> tuple[tuple[Any, Any, Any], None]:
            previous, total, ended = carried
            stepped = self.env.step(previous, action)
            kept = jax.tree.map(lambda new, old: jnp.where(ended, old, new), stepped, previous)
            total = total + jnp.where(ended, 0.0, stepped.reward)
            return (kept, total, ended | (stepped.done > 0.5)), None

        start = (state, jnp.zeros((), jnp.float32), jnp.zeros((), bool))
        (state, total, ended), _ = jax.lax.scan(repeat, start, None, length=self.action_repeat)
        return state, self._observe(state), total, ended, jnp.zeros((), bool)

    def __repr__(self) -> str:
        return f"PlaygroundVecEnv({self.env_name!r}, num_envs={self.num_envs}, device={self.device})"
