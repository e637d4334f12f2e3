"""Export a trained policy as one self-contained file: ONNX (run with ONNX Runtime) or TorchScript (run
with ``torch.jit.load``), neither of which needs phalanx to run.

``export(run_dir, format)`` writes what ``load_agent(run_dir).act(obs)`` computes for a batch of raw
observations, as one graph: the checkpoint's observation normalisation (frozen, clipped as in training),
the policy, and the map of its actions into the env's action space (a Box's bounds, an integer space's
start). The policy is deterministic by
default; ``stochastic=True`` exports the sampling policy with the random draw as a second input
(``noise``), so that the file is a pure function of its inputs and equals the library's sample for the
same draw. A multi-agent run gives one file per agent group (decentralised execution). A recurrent
policy's file takes its memory as the second input, ``memory`` ``(B, M, H)`` (zeros at an episode's
start), and gives the memory after the step as a second output, ``memory_out``.

Tracing needs the networks as parameters of the traced module: :class:`ExportedPolicy` holds a copy of
the algorithm's :class:`~phalanx.algos.base.ActingModule` (its ``act`` as a module of tensors alone)
with gradients off, and the normalisation statistics and the :class:`~phalanx.envs.wrappers.ActionMap`
as buffers. (Tracing a function
that closes over the networks, such as ``Agent.act``, fails with "Cannot insert a Tensor that requires
grad as a constant": the weights are no module's parameters there, so the tracer would bake them in.)
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from phalanx import __version__
from phalanx.agent import load_agent, resolve_checkpoint
from phalanx.algos.base import ActingModule
from phalanx.algos.recurrent import RecurrentActing
from phalanx.envs.wrappers import OBS_CLIP, OBS_EPSILON, ActionMap, RunningMeanStd
from phalanx.errors import ConfigError, import_optional
from phalanx.files import atomic_write
from phalanx.train.run_dir import read_run_config

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
"""Each export format and the suffix of its default file name."""
METADATA_FILE = "phalanx.json"
"""The metadata's name among a TorchScript file's extra files (``torch.jit.load(path, _extra_files=...)``)."""
EXPORT_EXTRA = (
    "ONNX export needs the {package} package: pip install 'phalanx[export]' (onnx, onnxscript, "
    "onnxruntime). TorchScript export needs nothing more: --format torchscript."
)
_EXAMPLE_BATCH = 2
"""Rows of the example inputs that exports trace with (2: the exporter treats a batch of 1 as fixed)."""
_NOISE_TEXT = {"uniform": "uniform in [0, 1)", "normal": "standard normal"}


class ExportedPolicy(nn.Module):
    obs_mean: torch.Tensor  # buffers, with obs_statistics
    obs_inv_std: torch.Tensor

    """Raw observations in, actions in the env's action space out: what the file holds.

    ``forward(obs, *extra)``: ``obs`` ``(B, *observation_shape)`` float32 (uint8 for the images of a
    uint8 space, which the network scales; for a Dict space the flat vector of
    ``gymnasium.spaces.flatten``: the parts by sorted key, each flattened, Discrete parts one-hot), then
    the acting module's other inputs (``action_mask``, ``noise``) in the order of :attr:`inputs`. The
    observation statistics are applied as ``Agent.act`` applies them: ``(obs - mean) * rsqrt(var + eps)``
    with both factors computed in the statistics' float64 and cast to float32, then clipped to
    ``[-OBS_CLIP, OBS_CLIP]``.
    """

    def __init__(
        self,
        acting: ActingModule,
        observation_shape: tuple[int, ...],
        action_space: gym.Space,
        obs_statistics: RunningMeanStd | None = None,
        observation_space: gym.Space | None = None,
        agents_shape: tuple[int, ...] | None = None,
    ) -> None:
        """``observation_space``: the env's, which names the input's dtype (uint8 images) and layout (a
        Dict's parts); ``agents_shape``: ``(A_g,)`` for an agent group's policy, ``()`` for a single
        agent's; None: every dim of ``observation_shape`` but the last (flat observations)."""
        super().__init__()
        self.acting = copy.deepcopy(acting)  # its own networks, whose gradients can be turned off
        self.inputs = acting.inputs
        self.noise = acting.noise
        self.memory_shape: tuple[int, ...] | None = (
            acting.memory_shape if isinstance(acting, RecurrentActing) else None
        )
        """A recurrent policy's memory of one row ``(M, H)``: an input and an output; None: no memory."""
        self.observation_shape = tuple(observation_shape)
        self.observation_space = observation_space
        uint8 = isinstance(observation_space, gym.spaces.Box) and observation_space.dtype == np.uint8
        self.observation_dtype = torch.uint8 if uint8 else torch.float32
        self.agents_shape = self.observation_shape[:-1] if agents_shape is None else tuple(agents_shape)
        self.action_space = action_space
        self.normalize = obs_statistics is not None
        if obs_statistics is not None:
            self.register_buffer("obs_mean", obs_statistics.mean.to(torch.float32))
            self.register_buffer(
                "obs_inv_std", torch.rsqrt(obs_statistics.var + OBS_EPSILON).to(torch.float32)
            )
        self.action_map = ActionMap(action_space)  # the agent's actions into the env's space, as in training
        self.requires_grad_(False).eval()

    def forward(
        self, obs: torch.Tensor, *extra: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.normalize:
            obs = ((obs - self.obs_mean) * self.obs_inv_std).clamp(-OBS_CLIP, OBS_CLIP)
        memory = None
        if self.memory_shape is not None:  # a recurrent policy: (actions, memory after the step)
            actions, memory = self.acting(obs, *extra)
        else:
            actions = self.acting(obs, *extra)
        actions = self.action_map(actions)
        return actions if memory is None else (actions, memory)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of the outputs: the action, and a recurrent policy's memory after the step."""
        return ("action",) if self.memory_shape is None else ("action", "memory_out")

    def example_inputs(self, batch: int = _EXAMPLE_BATCH) -> tuple[torch.Tensor, ...]:
        """Inputs of ``batch`` rows, one per name of :attr:`inputs` (every action allowed; noise 0.5)."""
        examples = {"obs": torch.zeros((batch, *self.observation_shape), dtype=self.observation_dtype)}
        if self.memory_shape is not None:
            examples["memory"] = torch.zeros((batch, *self.memory_shape))
        if "action_mask" in self.inputs:
            assert isinstance(self.action_space, gym.spaces.Discrete), "action masks are of Discrete actions"
            mask_shape = (batch, *self.agents_shape, int(self.action_space.n))
            examples["action_mask"] = torch.ones(mask_shape, dtype=torch.bool)
        if self.noise is not None:
            examples["noise"] = torch.full((batch, *self.agents_shape, self.noise.size), 0.5)
        return tuple(examples[name] for name in self.inputs)

    def describe_inputs(self) -> str:
        """The inputs, their dtypes and shapes, for the file's metadata."""
        lead = ("batch", *self.agents_shape)
        dtype = str(self.observation_dtype).removeprefix("torch.")
        text = {"obs": f"obs {dtype} {_shape('batch', *self.observation_shape)}"}
        if isinstance(self.observation_space, gym.spaces.Dict):
            text["obs"] += (
                f", the Dict observation flattened by gymnasium.spaces.flatten (parts "
                f"{', '.join(self.observation_space.spaces)} in this order, each flattened, Discrete parts "
                "one-hot)"
            )
        if self.memory_shape is not None:
            text["memory"] = (
                f"memory float32 {_shape(*lead, *self.memory_shape)}, zeros at an episode's start, else the "
                "memory_out of the previous step"
            )
        if "action_mask" in self.inputs:
            assert isinstance(self.action_space, gym.spaces.Discrete), "action masks are of Discrete actions"
            mask_shape = _shape(*lead, int(self.action_space.n))
            text["action_mask"] = f"action_mask bool {mask_shape}, true where the action is allowed"
        if self.noise is not None:
            noise_shape = _shape(*lead, self.noise.size)
            text["noise"] = f"noise float32 {noise_shape}, {_NOISE_TEXT[self.noise.distribution]}"
        return "; ".join(text[name] for name in self.inputs)

    def describe_output(self) -> str:
        lead = ("batch", *self.agents_shape)
        if isinstance(self.action_space, gym.spaces.Discrete):
            text = f"action int64 {_shape(*lead)}, in {self.action_space}"
        elif isinstance(self.action_space, gym.spaces.MultiDiscrete):
            text = f"action int64 {_shape(*lead, *self.action_space.shape)}, in {self.action_space}"
        else:
            assert self.action_space.shape is not None, "an exported action space has a shape"
            text = f"action float32 {_shape(*lead, *self.action_space.shape)}, in {self.action_space}"
        if self.memory_shape is not None:
            text += f"; memory_out float32 {_shape(*lead, *self.memory_shape)}, the memory after the step"
        return text


def _shape(*dims: Any) -> str:
    return f"({', '.join(str(dim) for dim in dims)}{',' if len(dims) == 1 else ''})"


def exported_policies(agent: Any, stochastic: bool = False) -> dict[str | None, ExportedPolicy]:
    """The :class:`ExportedPolicy` of a loaded agent (``phalanx.load_agent``): ``{None: policy}`` for a
    single-agent one, ``{group: policy}`` for a multi-agent one."""
    algorithm = agent.algorithm
    if algorithm.multi_agent:
        return {
            name: ExportedPolicy(
                algorithm.group_acting_module(name, stochastic),
                (group.num_agents, int(group.observation_space.shape[0])),
                group.action_space,
            )
            for name, group in agent.spec.groups.items()
        }
    acting = algorithm.acting_module(stochastic)
    policy = ExportedPolicy(
        acting,
        agent.observation_shape,
        agent.action_space,
        agent.obs_statistics,
        agent.observation_space,
        agents_shape=(),
    )
    return {None: policy}


def export(
    run_dir: str | Path,
    format: str = "onnx",
    checkpoint: str = "best",
    output: str | Path | None = None,
    stochastic: bool = False,
) -> Path | dict[str, Path]:
    """Write the run's policy as a self-contained ``format`` file ("onnx" or "torchscript"); return its path.

    ``checkpoint``: "best" (default), "latest", or a checkpoint path. ``output``: the file to write
    (default ``RUN_DIR/export/policy.onnx``, or ``policy.pt`` for TorchScript; ``policy_stochastic.*``
    with ``stochastic``). A multi-agent run writes one file per agent group, the group's name added to
    the file name (``policy_<group>.onnx``), and returns ``{group: path}``. The file takes a batch of raw
    observations (float32; uint8 for the images of a uint8 space; a Dict space's flat vectors) and gives
    the actions ``load_agent(run_dir).act(obs)`` gives; ``stochastic`` gives the sampled action for a
    random draw passed as the last input, ``noise``. The run's metadata
    (env, algorithm, steps, inputs, ...) is in the file: ONNX ``metadata_props``, TorchScript extra file
    ``phalanx.json``.
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}; valid formats: {', '.join(FORMATS)}.")
    if format == "onnx":
        for module in ("onnxscript", "onnx"):  # torch's ONNX exporter needs both
            import_optional(module, ConfigError, EXPORT_EXTRA, packages=("onnxscript", "onnx"))
    output_path = _check_output(output, format) if output is not None else None
    run_dir = Path(run_dir)
    read_run_config(run_dir)  # a clear error for a directory that is not a run's, before its checkpoints
    checkpoint_path = resolve_checkpoint(run_dir, checkpoint)
    agent = load_agent(run_dir, str(checkpoint_path))
    policies = exported_policies(agent, stochastic)
    base = output_path or run_dir / "export" / ("policy_stochastic" if stochastic else "policy")
    paths = {group: _group_path(base, group, FORMATS[format]) for group in policies}
    for group, policy in policies.items():
        path = paths[group]
        _make_parent(path)
        metadata = _metadata(agent, policy, group, _relative(checkpoint_path, run_dir), stochastic)
        if format == "onnx":
            write_onnx(policy, path, metadata)
        else:
            write_torchscript(policy, path, metadata)
    if None in paths:
        return paths[None]
    return {str(group): path for group, path in paths.items()}


def trace(policy: ExportedPolicy) -> torch.jit.ScriptModule:
    """``policy`` as a TorchScript module, traced on its example inputs (the batch dim stays free)."""
    with torch.no_grad(), warnings.catch_warnings():
        # torch 2.13 marks TorchScript deprecated (for torch.export), yet it is what torch.jit.load and
        # libtorch run. The tracer also warns where a shape check reads a size: those read the agent and
        # ensemble-member dims, fixed for a policy, never the batch dim, so tracing them as constants is
        # right (check_trace runs the traced graph again and compares).
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return torch.jit.trace(policy, policy.example_inputs())


def write_torchscript(policy: ExportedPolicy, path: Path, metadata: dict[str, str]) -> None:
    """Trace ``policy`` and save it as TorchScript at ``path`` (atomically), ``metadata`` as the extra file
    ``phalanx.json``."""
    traced = trace(policy)
    with atomic_write(path, "wb") as file, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript's, as in trace()
        torch.jit.save(traced, file, _extra_files={METADATA_FILE: json.dumps(metadata, indent=1)})


def write_onnx(policy: ExportedPolicy, path: Path, metadata: dict[str, str]) -> None:
    """Export ``policy`` with torch's ONNX exporter (``torch.export``, dynamo) to ``path`` (atomically):
    a dynamic batch dimension, shared by every input and the output; ``metadata`` as ``metadata_props``."""
    batch = torch.export.Dim("batch")
    example = policy.example_inputs()
    dynamic_shapes: tuple[Any, ...] = ({0: batch},)  # obs, then the tuple of *extra where there are any
    if len(example) > 1:
        dynamic_shapes += (tuple({0: batch} for _ in example[1:]),)
    with torch.no_grad(), _quiet_onnx_exporter():
        program = torch.onnx.export(
            policy,
            example,
            input_names=list(policy.inputs),
            output_names=list(policy.outputs),
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            verbose=False,
        )
    assert program is not None, "the dynamo exporter returns the program"
    program.model.metadata_props.update(metadata)
    with atomic_write(path, "wb") as file:
        file.write(program.model_proto.SerializeToString())


@contextlib.contextmanager
def _quiet_onnx_exporter() -> Iterator[None]:
    """Silence what torch's ONNX exporter says that a user cannot act on: its deprecation notices, a
    note on the shared batch dim, and log lines about operators of packages that are not installed
    (torchvision's)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            # every input shares the batch dim: the exporter says that it names it once
            warnings.filterwarnings("ignore", message="# The axis name")
            yield
    finally:
        logger.setLevel(level)


def _metadata(
    agent: Any, policy: ExportedPolicy, group: str | None, checkpoint: str, stochastic: bool
) -> dict[str, str]:
    """What the file says about itself (strings: ONNX metadata_props hold strings)."""
    config = agent.config
    metadata = {
        "phalanx_version": __version__,
        "env": config.env,
        "algo": config.algo,
        "steps": str(agent.steps),
        "checkpoint": checkpoint,
    }
    if group is not None:
        metadata["group"] = group
        metadata["agents"] = ",".join(agent.spec.groups[group].agents)
    metadata.update(
        {
            "observation_shape": json.dumps(list(policy.observation_shape)),
            "action_space": str(policy.action_space),
            "inputs": policy.describe_inputs(),
            "output": policy.describe_output(),
            "stochastic": json.dumps(stochastic),
            "normalize_obs": json.dumps(policy.normalize),
        }
    )
    if policy.noise is not None:
        metadata["noise"] = policy.noise.distribution
    return metadata


def _check_output(output: str | Path, format: str) -> Path:
    path = Path(output)
    if path.is_dir():
        raise ConfigError(
            f"export output {str(path)!r} is a directory; give the file to write, e.g. "
            f"{str(path / ('policy' + FORMATS[format]))!r}."
        )
    other = {suffix: name for name, suffix in FORMATS.items() if name != format}
    if path.suffix in other:
        named = other[path.suffix]
        raise ConfigError(
            f"export output {str(path)!r} has the suffix of {_article(named)} {named} file, but the format "
            f"is {format!r}; name it {str(path.with_suffix(FORMATS[format]))!r} or choose --format {named}."
        )
    return path


def _article(word: str) -> str:
    """ "an" before a vowel sound (an onnx file), "a" before the rest (a torchscript file)."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _group_path(base: Path, group: str | None, suffix: str) -> Path:
    """``base`` with ``suffix`` where it has none, ``_<group>`` added to the name for a group's file."""
    path = base if base.suffix else base.with_name(base.name + suffix)
    if group is None:
        return path
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", group)
    return path.with_name(f"{path.stem}_{safe}{path.suffix}")


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"cannot create the directory of the export output {str(path)!r}: {error.strerror or error}."
        ) from None
    if path.is_dir():
        raise ConfigError(f"export output {str(path)!r} is a directory; give the file to write.")
    if not os.access(path.parent, os.W_OK):
        raise ConfigError(
            f"cannot write the export output {str(path)!r}: directory {str(path.parent)!r} is not "
            "writable. Choose another --output."
        )


def _relative(path: Path, run_dir: Path) -> str:
    """``path`` relative to the run directory where it is inside it (``checkpoints/best``)."""
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)
