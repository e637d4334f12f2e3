"""JAX simulators (gymnax, Brax, and anything written as pure JAX functions) behind the VecEnv contract.

The simulator runs as two jitted, vmapped JAX functions on the JAX device that matches the torch
device (``cpu`` -> JAX's CPU, ``cuda:k`` -> JAX's GPU ``k``). Arrays cross between the frameworks
through DLPack without a copy: the actions go from torch to JAX with ``jax.dlpack.from_dlpack`` and
the observations, rewards and flags come back with ``torch.from_dlpack``.

- :class:`JaxVecEnv` is the generic part: per-sub-env PRNG keys split from the seed, batched reset
  and step, same-step autoreset *inside* the jitted step (``info["final_obs"]`` is the true next
  observation of every row), an optional time limit, episode statistics and checkpointable state.
  A simulator implements two single-env pure functions, ``_reset_one(key) -> (state, obs)`` and
  ``_step_one(key, state, action) -> (state, obs, reward, terminated, truncated)``.
- :class:`GymnaxVecEnv` wraps ``gymnax.make(env_id)`` (``make_env("gymnax:CartPole-v1", ...)``).
- :class:`BraxVecEnv` wraps ``brax.envs.get_environment(name)`` (``make_env("brax:ant", ...)``).
  Brax envs have no time limit of their own; the adapter truncates at ``episode_length`` steps.

Importing this module sets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (unless the user set it) before
JAX is imported, so that JAX allocates GPU memory on demand and leaves room for PyTorch on the same
GPU. The setting has no effect if JAX had already started its GPU backend before this import.

Key schedule (reproducible, documented so that tests can replay it): ``reset(seed=s)`` starts from
``jax.random.PRNGKey(s)``; every reset and step first splits the running key with
:func:`split_keys` into ``(next_key, step_keys, reset_keys)``, one key per sub-env in each batch.

Returned tensors share memory with JAX buffers (zero copy). JAX buffers are immutable by contract:
treat ``obs``, ``reward``, ``terminated``, ``truncated`` and ``info["final_obs"]`` as read-only
(``obs`` and ``final_obs`` may even be the same buffer when no row ended), and ``.clone()`` a tensor
before modifying it in place.

Adding another imported simulator
---------------------------------
A JAX simulator (MJX, a custom JAX env) needs only a subclass of :class:`JaxVecEnv` with the two
single-env functions above. A simulator that already returns torch tensors on the GPU (Isaac Lab,
ManiSkill, MuJoCo Warp) needs no DLPack at all: a thin :class:`~phalanx.envs.core.VecEnv` subclass
maps its step to the contract. For a simulator that resets ended sub-envs itself and can report
the last observation of the finished episodes::

    import torch
    from phalanx.envs.core import EpisodeStatistics, VecEnv

    class TorchSimulatorVecEnv(VecEnv):
        def __init__(self, sim, device="cuda"):
            super().__init__(sim.num_envs, sim.single_observation_space,
                             sim.single_action_space, device)
            self.sim = sim
            self.episode_statistics = EpisodeStatistics(self.num_envs, self.device)

        def reset(self, *, seed=None, options=None):
            obs, _ = self.sim.reset(seed=seed)
            self.episode_statistics.reset()
            return obs.float(), {}

        def step(self, actions):
            obs, reward, terminated, truncated, extras = self.sim.step(actions)
            done = terminated.bool() | truncated.bool()
            # the simulator's own name for the pre-reset observation of the ended rows:
            last = extras.get("final_observation", obs)
            final_obs = torch.where(done.unsqueeze(-1), last, obs).float()
            episode_return, episode_length = self.episode_statistics.step(reward.float(), done)
            info = {"final_obs": final_obs, "_final_obs": done,
                    "episode_return": episode_return, "episode_length": episode_length}
            return obs.float(), reward.float(), terminated.bool(), truncated.bool(), info

If the simulator cannot report the terminal observation (it resets before it observes), the
adapter can only pass ``obs`` as ``final_obs``, and value bootstrapping on time-limit truncation
uses the next episode's first observation; prefer a simulator option that keeps it. Register the
adapter with :func:`phalanx.envs.register_env` and check it with :func:`phalanx.envs.check_vec_env`.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before the first `import jax`

import gymnasium as gym  # noqa: E402 - the environment variable above must be set first
import numpy as np  # noqa: E402
import torch  # noqa: E402

from phalanx.envs.core import EpisodeStatistics, Tensor, VecEnv, action_layout, step_info  # noqa: E402
from phalanx.errors import EnvError, import_optional  # noqa: E402

__all__ = ["BraxVecEnv", "GymnaxVecEnv", "JaxVecEnv", "jax_device", "split_keys"]

_INSTALL_HINT = (
    "Install the JAX simulators with `pip install 'phalanx[jax]'` (jax, brax) and `pip install --no-deps "
    "'gymnax>=1,<2'` (gymnax declares gymnasium<1.4 but runs on 1.4); on a GPU also a CUDA build of jax, "
    "e.g. `pip install 'jax[cuda12]'`."
)


def _require(module_name: str, who: str) -> Any:
    """Import ``module_name`` or raise an EnvError naming the missing package and the install command."""
    return import_optional(
        module_name,
        EnvError,
        f"{who} needs the package '{{package}}' (importing {module_name!r} failed), which is not "
        f"installed in this environment. {_INSTALL_HINT}",
    )


def jax_device(device: torch.device, who: str = "JaxVecEnv") -> Any:
    """The JAX device that holds the same memory as the torch ``device`` (cpu, or cuda:k -> gpu k)."""
    jax = _require("jax", who)
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            raise EnvError(
                f"{who}: the torch device is {device}, but the installed jax {jax.__version__} has no GPU "
                "backend (jax.devices('gpu') failed). Install a CUDA build of jax "
                "(`pip install 'jax[cuda12]'`), or use device='cpu'."
            ) from None
        if index >= len(gpus):
            raise EnvError(
                f"{who}: the torch device is {device}, but JAX sees only {len(gpus)} GPU(s) ({gpus}). Use a "
                "device index JAX can see, and the same CUDA_VISIBLE_DEVICES for torch and JAX."
            )
        return gpus[index]
    raise EnvError(
        f"{who}: device {device} is not supported by the JAX adapter, expected 'cpu' or 'cuda[:k]' (JAX and "
        "torch exchange arrays through DLPack on those only). Use device='cpu' or a CUDA device."
    )


def split_keys(key: Any, num_envs: int) -> tuple[Any, Any, Any]:
    """The key schedule of one reset or step: ``(next_key, step_keys, reset_keys)``.

    ``step_keys`` and ``reset_keys`` have one key per sub-env (shape ``(num_envs, 2)``); ``next_key``
    replaces the running key. A reset uses ``reset_keys`` only.
    """
    import jax

    next_key, step_key, reset_key = jax.random.split(key, 3)
    return next_key, jax.random.split(step_key, num_envs), jax.random.split(reset_key, num_envs)


def close_names(name: str, names: list[str]) -> str:
    """ " Did you mean: ...?" with up to five of ``names`` close to ``name`` (case-insensitive), or ""."""
    lowered = {candidate.lower(): candidate for candidate in names}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=5, cutoff=0.5)
    return f" Did you mean: {', '.join(lowered[c] for c in close)}?" if close else ""


def float32_box(low: Any, high: Any, shape: tuple[int, ...]) -> gym.spaces.Box:
    """A float32 Box of ``shape`` with bounds broadcast from ``low`` and ``high`` (a JAX env's limits)."""
    low = np.broadcast_to(np.asarray(low, dtype=np.float32), shape)
    high = np.broadcast_to(np.asarray(high, dtype=np.float32), shape)
    return gym.spaces.Box(low, high, shape=shape, dtype=np.float32)


class JaxVecEnv(VecEnv):
    """Generic adapter: a single-env JAX simulator, vmapped and jitted, behind the VecEnv contract.

    Subclasses call ``super().__init__`` with the spaces and implement, as pure JAX functions of one
    sub-env (they are vmapped over ``num_envs`` and traced once):

    - ``_reset_one(key) -> (state, obs)``: an initial state (any pytree) and its observation;
    - ``_step_one(key, state, action) -> (state, obs, reward, terminated, truncated)``: one step
      without any reset; ``terminated`` is a true terminal state, ``truncated`` the simulator's own
      time limit (``False`` if it has none).

    The base class adds the rest inside one jitted step: the time limit ``max_episode_steps``
    (truncated when the step count reaches it, independent of ``terminated``, as Gymnasium's
    TimeLimit), same-step autoreset of the rows that ended (the reset is computed only on steps
    where some row ended), and ``info["final_obs"]``, ``info["_final_obs"]``,
    ``info["episode_return"]``, ``info["episode_length"]`` (:class:`~phalanx.envs.core.EpisodeStatistics`).

    Checkpointing: :meth:`state_dict` holds the PRNG key, the simulator state of every sub-env (its
    pytree leaves as CPU tensors), the step counts and the episode statistics, so that a resumed run
    continues the exact same trajectories; :meth:`load_state_dict` restores them.
    """

    def __init__(
        self,
        num_envs: int,
        single_observation_space: gym.Space,
        single_action_space: gym.Space,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = None,
    ) -> None:
        super().__init__(num_envs, single_observation_space, single_action_space, device)
        name = type(self).__name__
        self._jax = _require("jax", name)
        if max_episode_steps is not None and (
            isinstance(max_episode_steps, bool)
            or not isinstance(max_episode_steps, int)
            or max_episode_steps < 1
        ):
            raise EnvError(
                f"{name}: max_episode_steps must be an integer >= 1 or None, got {max_episode_steps!r}. "
                "Pass the episode length in steps, or None for no time limit."
            )
        if not isinstance(single_observation_space, gym.spaces.Box):
            raise EnvError(
                f"{name}: observation space {single_observation_space} is not supported, expected a Box. "
                "Flatten the observation in the simulator (e.g. concatenate a dict of arrays)."
            )
        self.max_episode_steps = max_episode_steps
        self.jax_device = jax_device(self.device, name)
        self.episode_statistics = EpisodeStatistics(self.num_envs, self.device)
        if not isinstance(single_action_space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise EnvError(
                f"{name}: action space {single_action_space} is not supported, expected Discrete or Box."
            )
        # int32: JAX's default integer (64-bit integers need jax_enable_x64)
        self._action_shape, self._action_dtype = action_layout(
            single_action_space, self.num_envs, torch.int32
        )
        self._key: Any = None  # the running PRNG key, None until the first reset
        self._state: Any = None  # the simulator state pytree, (num_envs, ...) leaves
        self._elapsed: Any = None  # (num_envs,) int32 steps since each row's reset
        self._reset_function = self._jax.jit(self._batched_reset)
        self._step_function = self._jax.jit(self._batched_step)

    # -- to implement ----------------------------------------------------------------------------
    def _reset_one(self, key: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def _step_one(self, key: Any, state: Any, action: Any) -> tuple[Any, Any, Any, Any, Any]:
        raise NotImplementedError

    # -- the jitted batch functions ----------------------------------------------------------------
    def _batched_reset(self, key: Any) -> tuple[Any, Any, Any]:
        jax = self._jax
        key, _, reset_keys = split_keys(key, self.num_envs)
        state, obs = jax.vmap(self._reset_one)(reset_keys)
        return key, state, obs.astype("float32")

    def _batched_step(self, key: Any, state: Any, elapsed: Any, actions: Any) -> tuple[Any, ...]:
        jax = self._jax
        jnp = jax.numpy
        key, step_keys, reset_keys = split_keys(key, self.num_envs)
        next_state, next_obs, reward, terminated, truncated = jax.vmap(self._step_one)(
            step_keys, state, actions
        )
        next_obs = next_obs.astype(jnp.float32)  # (N, *obs_shape), the true next observation
        reward = jnp.reshape(reward, (self.num_envs,)).astype(jnp.float32)
        terminated = jnp.reshape(terminated, (self.num_envs,)).astype(jnp.bool_)
        truncated = jnp.reshape(truncated, (self.num_envs,)).astype(jnp.bool_)
        elapsed = elapsed + 1
        if self.max_episode_steps is not None:
            truncated = truncated | (elapsed >= self.max_episode_steps)
        done = terminated | truncated

        def reset_ended(carried: tuple[Any, Any]) -> tuple[Any, Any]:
            stepped_state, stepped_obs = carried
            fresh_state, fresh_obs = jax.vmap(self._reset_one)(reset_keys)

            def pick(fresh: Any, stepped: Any) -> Any:
                if stepped.ndim == 0 or stepped.shape[0] != self.num_envs:
                    return stepped  # a buffer the sub-envs share (MuJoCo Warp's contacts): no rows
                rows = jnp.reshape(done, done.shape + (1,) * (stepped.ndim - 1))
                return jnp.where(rows, fresh, stepped).astype(stepped.dtype)

            return jax.tree.map(pick, fresh_state, stepped_state), pick(fresh_obs, stepped_obs)

        state, obs = jax.lax.cond(jnp.any(done), reset_ended, lambda carried: carried, (next_state, next_obs))
        elapsed = jnp.where(done, 0, elapsed)
        return key, state, elapsed, obs, next_obs, reward, terminated, truncated

    # -- transfers ---------------------------------------------------------------------------------
    def _to_torch(self, array: Any) -> Tensor:
        return torch.from_dlpack(array)

    def _to_jax(self, tensor: Tensor) -> Any:
        return self._jax.dlpack.from_dlpack(tensor.contiguous())

    def _actions_to_jax(self, actions: Any) -> Any:
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(np.asarray(actions))
        if tuple(actions.shape) != self._action_shape:
            raise EnvError(
                f"{self!r}.step: actions have shape {tuple(actions.shape)}, expected {self._action_shape} "
                f"(num_envs={self.num_envs}, action space {self.single_action_space}). Pass one action per "
                "sub-env."
            )
        if actions.device != self.device or actions.dtype != self._action_dtype:
            actions = actions.to(self.device, self._action_dtype)
        return self._to_jax(actions.detach())

    # -- the contract ------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        """Reset every sub-env; ``seed`` restarts the key schedule from ``PRNGKey(seed)``."""
        jax = self._jax
        if seed is not None:
            self._key = jax.device_put(jax.random.PRNGKey(int(seed)), self.jax_device)
        elif self._key is None:
            entropy = int(np.random.SeedSequence().generate_state(1, dtype=np.uint32)[0])
            self._key = jax.device_put(jax.random.PRNGKey(entropy), self.jax_device)
        self._key, self._state, obs = self._reset_function(self._key)
        self._elapsed = jax.device_put(jax.numpy.zeros(self.num_envs, jax.numpy.int32), self.jax_device)
        self.episode_statistics.reset()
        return self._to_torch(obs), {}

    def step(self, actions: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """Step every sub-env; ended rows are reset inside the same jitted call (see the class doc)."""
        if self._state is None:
            raise EnvError(
                f"{self!r}.step was called before reset(): the simulator has no state yet. Call "
                "env.reset(seed=...) first (make_env(..., seed=s) does it for you)."
            )
        actions_jax = self._actions_to_jax(actions)
        key, state, elapsed, obs, final_obs, reward, terminated, truncated = self._step_function(
            self._key, self._state, self._elapsed, actions_jax
        )
        self._key, self._state, self._elapsed = key, state, elapsed
        reward_t = self._to_torch(reward)
        terminated_t = self._to_torch(terminated)
        truncated_t = self._to_torch(truncated)
        done = terminated_t | truncated_t
        episode_return, episode_length = self.episode_statistics.step(reward_t, done)
        info = step_info(self._to_torch(final_obs), done, episode_return, episode_length)
        return self._to_torch(obs), reward_t, terminated_t, truncated_t, info

    def close(self, **kwargs: Any) -> None:
        """Drop the simulator state (JAX frees its buffers once no tensor refers to them)."""
        self._state = self._elapsed = None
        self.closed = True

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The PRNG key, the simulator state, step counts and episode statistics, as CPU tensors.

        ``{"key": (2,) int64 or None, "sim_state": [leaf tensors] or None, "elapsed_steps": (N,) int64
        or None, "episode_statistics": {...}}``. Unsigned JAX leaves (PRNG keys inside the simulator
        state) are stored as int64; :meth:`load_state_dict` casts every leaf back to its JAX dtype.
        """

        def to_tensor(array: Any) -> Tensor:
            host = np.asarray(array)
            if host.dtype.kind == "u":
                host = host.astype(np.int64)
            return torch.from_numpy(np.array(host, copy=True))

        leaves = (
            None if self._state is None else [to_tensor(leaf) for leaf in self._jax.tree.leaves(self._state)]
        )
        return {
            "key": None if self._key is None else to_tensor(self._key),
            "sim_state": leaves,
            "elapsed_steps": None if self._elapsed is None else to_tensor(self._elapsed).to(torch.int64),
            "episode_statistics": self.episode_statistics.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a fresh env first resets once for the state layout)."""
        jax = self._jax
        name = repr(self)
        missing = {"key", "sim_state", "elapsed_steps", "episode_statistics"} - set(state)
        if missing:
            raise EnvError(
                f"{name}.load_state_dict: the state lacks {sorted(missing)}; expected the dict that "
                "JaxVecEnv.state_dict() returns. Load a checkpoint written by the same kind of env."
            )

        def to_jax(tensor: Tensor, dtype: Any, shape: tuple[int, ...], what: str) -> Any:
            host = tensor.detach().cpu().numpy()
            if tuple(host.shape) != tuple(shape):
                raise EnvError(
                    f"{name}.load_state_dict: {what} has shape {tuple(host.shape)}, expected {tuple(shape)}. "
                    "The checkpoint was written by an env with another num_envs or simulator; build the env "
                    "as it was when the checkpoint was saved."
                )
            return jax.device_put(host.astype(dtype), self.jax_device)

        if state["sim_state"] is not None and self._state is None:
            self.reset(seed=0)  # a template for the pytree structure and dtypes, replaced below
        if state["key"] is not None:
            self._key = to_jax(state["key"], np.uint32, (2,), "key")
        if state["sim_state"] is not None:
            leaves, treedef = jax.tree.flatten(self._state)
            if len(leaves) != len(state["sim_state"]):
                raise EnvError(
                    f"{name}.load_state_dict: sim_state has {len(state['sim_state'])} arrays, expected "
                    f"{len(leaves)}. The checkpoint belongs to another simulator; build the same env."
                )
            restored = [
                to_jax(tensor, leaf.dtype, leaf.shape, f"sim_state[{index}]")
                for index, (tensor, leaf) in enumerate(zip(state["sim_state"], leaves, strict=True))
            ]
            self._state = jax.tree.unflatten(treedef, restored)
        if state["elapsed_steps"] is not None:
            self._elapsed = to_jax(state["elapsed_steps"], np.int32, (self.num_envs,), "elapsed_steps")
        self.episode_statistics.load_state_dict(state["episode_statistics"])


class GymnaxVecEnv(JaxVecEnv):
    """``num_envs`` copies of a gymnax environment (``gymnax.make(env_id)``), e.g. ``"CartPole-v1"``.

    Args:
        env_id: a gymnax id (``gymnax.registered_envs``): ``"CartPole-v1"``, ``"Pendulum-v1"``, ...
        num_envs: number of sub-envs, stepped as one vmapped batch.
        device: torch device of the returned tensors; JAX runs on the matching device.
        max_episode_steps: overrides the env's ``max_steps_in_episode`` parameter (its time limit).
        env_params: other overrides of the env's parameters (``EnvParams`` fields), e.g.
            ``{"gravity": 12.0}``.
        **kwargs: passed to ``gymnax.make``.

    Spaces become Gymnasium spaces: ``Box`` (float32 bounds) and ``Discrete``. Termination and
    truncation are gymnax's own (``step_env``'s terminal flag and ``is_truncated``, the time limit).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = None,
        env_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        gymnax = _require("gymnax", f"GymnaxVecEnv({env_id!r})")
        names = list(gymnax.registered_envs)
        if env_id not in names:
            raise EnvError(
                f"GymnaxVecEnv: unknown gymnax environment {env_id!r}.{close_names(str(env_id), names)} "
                f"Available: {', '.join(names)}."
            )
        try:
            env, params = gymnax.make(env_id, **kwargs)
        except TypeError as error:
            raise EnvError(
                f"GymnaxVecEnv({env_id!r}): gymnax.make rejected the arguments {sorted(kwargs)} ({error}). "
                "Pass only keyword arguments the environment's constructor accepts."
            ) from None
        overrides = dict(env_params or {})
        if max_episode_steps is not None:
            overrides["max_steps_in_episode"] = max_episode_steps
        if overrides:
            fields = sorted(getattr(params, "__dataclass_fields__", {}))
            unknown = sorted(set(overrides) - set(fields))
            if unknown:
                raise EnvError(
                    f"GymnaxVecEnv({env_id!r}): the env has no parameter(s) {unknown} (from env_params or "
                    f"max_episode_steps); its parameters are {fields}. Override only those."
                )
            params = params.replace(**overrides)
        self.env_id = env_id
        self.env = env
        self.params = params
        observation_space = self._convert(env.observation_space(params), "observation")
        action_space = self._convert(env.action_space(params), "action")
        super().__init__(num_envs, observation_space, action_space, device)

    def _convert(self, space: Any, which: str) -> gym.Space:
        kind = type(space).__name__
        if kind == "Discrete" and which == "action":
            return gym.spaces.Discrete(int(space.n))
        if kind == "Box":
            return float32_box(space.low, space.high, tuple(space.shape))
        raise EnvError(
            f"GymnaxVecEnv({self.env_id!r}): the {which} space is {space!r}; phalanx supports Box "
            f"observations and Box or Discrete actions. Use another env, or wrap it in a JaxVecEnv "
            "subclass that flattens the space."
        )

    def _reset_one(self, key: Any) -> tuple[Any, Any]:
        obs, state = self.env.reset_env(key, self.params)
        return state, obs

    def _step_one(self, key: Any, state: Any, action: Any) -> tuple[Any, Any, Any, Any, Any]:
        obs, state, reward, terminated, _ = self.env.step_env(key, state, action, self.params)
        truncated = self.env.is_truncated(state, self.params)
        return state, obs, reward, terminated, truncated

    def __repr__(self) -> str:
        return f"GymnaxVecEnv({self.env_id!r}, num_envs={self.num_envs}, device={self.device})"


class BraxVecEnv(JaxVecEnv):
    """``num_envs`` copies of a Brax environment (``brax.envs.get_environment(name)``), e.g. ``"ant"``.

    Args:
        env_name: a Brax environment name (``"ant"``, ``"halfcheetah"``, ``"humanoid"``, ...).
        num_envs: number of sub-envs, stepped as one vmapped batch.
        device: torch device of the returned tensors; JAX runs on the matching device.
        episode_length: the time limit: ``truncated`` when a sub-env has run this many steps. Brax
            envs have none of their own; ``terminated`` is Brax's ``state.done``.
        backend: Brax physics pipeline (``"generalized"``, ``"positional"``, ``"spring"``, ``"mjx"``);
            None: the env's default.
        **kwargs: passed to ``brax.envs.get_environment``.

    The action space is ``Box`` over the actuators' control range (``[-1, 1]`` when the env does not
    say); the observation space an unbounded float32 ``Box``. Compilation happens at the first reset
    and the first step and takes from seconds (small envs) to minutes (``ant`` on a CPU).
    """

    def __init__(
        self,
        env_name: str,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        episode_length: int = 1000,
        backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        envs = _require("brax.envs", f"BraxVecEnv({env_name!r})")
        names = sorted(getattr(envs, "_envs", {}))
        if env_name not in names:
            raise EnvError(
                f"BraxVecEnv: unknown Brax environment {env_name!r}.{close_names(str(env_name), names)} "
                f"Available: {', '.join(names)}."
            )
        if backend is not None:
            kwargs["backend"] = backend
        try:
            env = envs.get_environment(env_name, **kwargs)
        except (TypeError, ValueError, KeyError) as error:
            raise EnvError(
                f"BraxVecEnv({env_name!r}): brax.envs.get_environment rejected the arguments {kwargs} "
                f"({type(error).__name__}: {error}). Pass only arguments the env accepts (backend is one "
                "of 'generalized', 'positional', 'spring', 'mjx')."
            ) from None
        observation_size = env.observation_size
        if not isinstance(observation_size, (int, np.integer)):
            raise EnvError(
                f"BraxVecEnv({env_name!r}): the observation is a dict {observation_size}, expected one "
                "array. Create the env with array observations (the default for the built-in envs)."
            )
        self.env_name = env_name
        self.env = env
        observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(int(observation_size),), dtype=np.float32)
        action_size = int(env.action_size)
        low: np.ndarray | float
        high: np.ndarray | float
        try:
            control_range = np.asarray(env.sys.actuator.ctrl_range, dtype=np.float32)
            low, high = control_range[:, 0], control_range[:, 1]
        except AttributeError:  # envs without a physics system (e.g. the 'fast' test env)
            low, high = -1.0, 1.0
        action_space = float32_box(low, high, (action_size,))
        super().__init__(num_envs, observation_space, action_space, device, max_episode_steps=episode_length)

    def _reset_one(self, key: Any) -> tuple[Any, Any]:
        state = self.env.reset(key)
        return state, state.obs

    def _step_one(self, key: Any, state: Any, action: Any) -> tuple[Any, Any, Any, Any, Any]:
        state = self.env.step(state, action)
        return state, state.obs, state.reward, state.done > 0.5, self._jax.numpy.zeros((), bool)

    def __repr__(self) -> str:
        return f"BraxVecEnv({self.env_name!r}, num_envs={self.num_envs}, device={self.device})"
