"""Export of trained policies: ONNX and TorchScript files act as ``load_agent(run).act`` does, for every
algorithm, deterministic and stochastic (given the same draw), per agent group, in a process without
phalanx; and bad input gets a clear error that leaves the run and any earlier export untouched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

import phalanx
from phalanx import registry
from phalanx.cli import main
from phalanx.errors import CheckpointError, ConfigError
from phalanx.exporting import METADATA_FILE, ExportedPolicy, exported_policies, trace
from phalanx.marl.base import to_env_actions
from phalanx.marl.core import AgentGroup, MultiAgentSpec
from phalanx.marl.mappo import MAPPO, MAPPOConfig
from phalanx.marl.qmix import QMIX, QMIXConfig

BATCH = 64
TOLERANCE = 1e-5
SMALL = dict(num_envs=4, eval_every=0, eval_episodes=2, torch_threads=1, seed=0, hidden_sizes=(32, 32))
TRAINED = {"ppo", "ppo-continuous", "dqn", "sac", "td3", "ippo", "mappo"}
"""The representative runs, trained for a few hundred steps (several updates); the others run one
iteration (on-policy) or the warm-up alone (off-policy): the initial weights, exported all the same."""
MULTI_AGENT_ENVS = {
    "mappo": "simple_tag",  # two agent groups: one file each
    "ippo": "simple_spread",
    "qmix": "simple_tag",
    "vdn": "simple_spread",
    "maddpg": "simple_tag_continuous",
    "matd3": "simple_spread_continuous",
}
RUNS = {algo: (algo, None) for algo in registry.algorithm_names()} | {
    "ppo-continuous": ("ppo", "Pendulum-v1")
}
"""Each run of the fixture: (algorithm, env or None for the algorithm's default test env)."""
STOCHASTIC = {"ppo", "a2c", "sac", "redq", "mappo", "ippo", "ppo-continuous"}
"""The runs whose policy samples (the others act deterministically and refuse a stochastic export)."""
ONNX_CASES = {"ppo": True, "ppo-continuous": False, "dqn": False, "sac": True, "ippo": False}
"""The runs exported to ONNX, and whether stochastic: the Gumbel-max and the squashed Gaussian samples,
the argmax of logits and of Q-values, the normalisation and the rescale, an agent group."""


def env_of(algo: str) -> str:
    algorithm = registry.get_algorithm(algo)
    if algorithm.multi_agent:
        return MULTI_AGENT_ENVS[algo]
    return "CartPole-v1" if gym.spaces.Discrete in algorithm.action_spaces else "Pendulum-v1"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny trained run of every algorithm (a few updates: not the initial weights), single-agent ones
    with observation normalisation, so that the statistics are in the exported graph."""
    root = tmp_path_factory.mktemp("runs")
    paths = {}
    for name, (algo, env) in RUNS.items():
        algorithm = registry.get_algorithm(algo)
        trained = name in TRAINED
        if algorithm.on_policy:
            settings = dict(horizon=16, total_steps=256 if trained else 64)
            if algo != "a2c":
                settings["minibatch_size"] = 32
        else:
            settings = dict(learning_starts=64, batch_size=64, total_steps=192 if trained else 64)
        if not algorithm.multi_agent:
            settings["normalize_obs"] = True
        config = phalanx.make_config(algo, env or env_of(algo), run_dir=str(root / name), **SMALL, **settings)
        paths[name] = phalanx.train(config, show_progress=False).run_dir
    return paths


def observations(agent, seed: int = 0, batch: int = BATCH) -> dict[str | None, np.ndarray]:
    """Raw observations ``{group: (batch, A_g, obs_dim)}``, or ``{None: (batch, obs_dim)}``, spread wider
    than the env's so that the normalisation's clipping is exercised."""
    rng = np.random.default_rng(seed)
    if agent.algorithm.multi_agent:
        shapes = {name: (g.num_agents, g.observation_space.shape[0]) for name, g in agent.spec.groups.items()}
    else:
        shapes = {None: agent.observation_space.shape}
    return {
        name: (3 * rng.standard_normal((batch, *shape))).astype(np.float32) for name, shape in shapes.items()
    }


def library_actions(agent, obs: dict, deterministic: bool = True) -> dict:
    if agent.algorithm.multi_agent:
        return agent.act(obs, deterministic=deterministic)
    return {None: agent.act(obs[None], deterministic=deterministic)}


def draws(agent, policies: dict[str | None, ExportedPolicy], batch: int = BATCH) -> dict:
    """The noise input of each policy, drawn as the library's sampling draws it from the global
    generator: one ``(batch, size)`` draw for a single agent; for agent groups, one ``(batch * A_u, size)``
    draw per unit of A_u agents sharing a policy (MAPPO's units), in the order of the units."""
    noise = {}
    for name, policy in policies.items():
        draw = torch.rand if policy.noise.distribution == "uniform" else torch.randn
        if name is None:
            noise[name] = draw(batch, policy.noise.size)
            continue
        units = [unit.agents for unit in agent.algorithm.units if unit.group == name]
        parts = [draw(batch, agents.stop - agents.start, policy.noise.size) for agents in units]
        noise[name] = torch.cat(parts, dim=1)
    return noise


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual.dtype, expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE)


def exported_files(result) -> dict[str | None, Path]:
    return {name: Path(path) for name, path in result.items()} if isinstance(result, dict) else {None: result}


def torchscript_metadata(path: Path) -> dict[str, str]:
    extra = {METADATA_FILE: ""}
    torch.jit.load(str(path), _extra_files=extra)
    return json.loads(extra[METADATA_FILE])


def run_torchscript(path: Path, *inputs) -> np.ndarray:
    module = torch.jit.load(str(path))
    # no tensor is made on a fixed device: the module runs wherever .to(device) moves it
    assert 'Device = prim::Constant[value="cpu"]' not in str(module.inlined_graph)
    output = module(*(torch.as_tensor(x) for x in inputs))
    assert not output.requires_grad  # the weights are parameters with gradients off, not constants
    return output.numpy()


# -- every algorithm, TorchScript ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(RUNS))
def test_torchscript_acts_as_the_agent(runs, tmp_path, name):
    agent = phalanx.load_agent(runs[name])
    obs = observations(agent)
    expected = library_actions(agent, obs)
    files = exported_files(phalanx.export(runs[name], "torchscript", output=tmp_path / "policy.pt"))
    assert set(files) == set(obs)
    for group, path in files.items():
        assert_same(run_torchscript(path, obs[group]), expected[group])
        assert_same(run_torchscript(path, obs[group][:1]), expected[group][:1])  # a batch of one
        metadata = torchscript_metadata(path)
        assert metadata["algo"] == agent.config.algo and metadata["env"] == agent.config.env
        assert metadata["steps"] == str(agent.steps) and metadata["phalanx_version"] == phalanx.__version__
        assert metadata["stochastic"] == "false" and metadata["checkpoint"] == "checkpoints/best"
        assert metadata.get("group") == group


@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_stochastic_torchscript_samples_what_the_agent_samples_for_the_same_draw(runs, tmp_path, name):
    agent = phalanx.load_agent(runs[name])
    obs = observations(agent, seed=1)
    torch.manual_seed(123)
    expected = library_actions(agent, obs, deterministic=False)
    torch.manual_seed(123)
    policies = exported_policies(agent, stochastic=True)
    noise, other_noise = draws(agent, policies), draws(agent, policies)
    result = phalanx.export(runs[name], "torchscript", output=tmp_path / "p.pt", stochastic=True)
    for group, path in exported_files(result).items():
        assert_same(run_torchscript(path, obs[group], noise[group]), expected[group])
        assert not np.array_equal(run_torchscript(path, obs[group], other_noise[group]), expected[group])


@pytest.mark.parametrize("name", sorted(set(RUNS) - STOCHASTIC))
def test_a_deterministic_policy_refuses_a_stochastic_export(runs, tmp_path, name):
    with pytest.raises(ConfigError, match="has no stochastic policy to export"):
        phalanx.export(runs[name], "torchscript", output=tmp_path / "p.pt", stochastic=True)
    assert not any(tmp_path.iterdir())


# -- ONNX -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_exports(runs, tmp_path_factory) -> dict[str, dict]:
    """The ONNX files of :data:`ONNX_CASES`, with the observations, the noise and the library's actions
    to compare them with."""
    pytest.importorskip(
        "onnxruntime", reason="ONNX export tests need onnxruntime (pip install 'phalanx[export]')"
    )
    root = tmp_path_factory.mktemp("onnx")
    cases = {}
    for name, stochastic in ONNX_CASES.items():
        agent = phalanx.load_agent(runs[name])
        obs = observations(agent, seed=2)
        torch.manual_seed(5)
        expected = library_actions(agent, obs, deterministic=not stochastic)
        torch.manual_seed(5)
        noise = draws(agent, exported_policies(agent, stochastic)) if stochastic else {}
        result = phalanx.export(runs[name], "onnx", output=root / f"{name}.onnx", stochastic=stochastic)
        cases[name] = dict(files=exported_files(result), obs=obs, noise=noise, expected=expected, agent=agent)
    return cases


@pytest.mark.parametrize("name", list(ONNX_CASES))
def test_onnx_runtime_acts_as_the_agent(onnx_exports, name):
    import onnxruntime

    case = onnx_exports[name]
    for group, path in case["files"].items():
        session = onnxruntime.InferenceSession(str(path))
        inputs = {"obs": case["obs"][group]}
        if group in case["noise"]:
            inputs["noise"] = case["noise"][group].numpy()
        assert [i.name for i in session.get_inputs()] == list(inputs)
        assert_same(session.run(None, inputs)[0], case["expected"][group])
        one = {key: value[:1] for key, value in inputs.items()}  # the batch dimension is dynamic
        assert_same(session.run(None, one)[0], case["expected"][group][:1])

        metadata = session.get_modelmeta().custom_metadata_map
        agent = case["agent"]
        assert metadata["algo"] == agent.config.algo and metadata["env"] == agent.config.env
        assert metadata["steps"] == str(agent.steps) and metadata["phalanx_version"] == phalanx.__version__
        assert metadata["stochastic"] == json.dumps(group in case["noise"])
        assert metadata["normalize_obs"] == json.dumps(group is None)  # single-agent runs normalise here
        assert metadata["inputs"].startswith("obs float32 (batch, ")


def test_exported_files_run_in_a_process_without_phalanx(runs, onnx_exports, tmp_path):
    case = onnx_exports["ppo-continuous"]
    torchscript = phalanx.export(runs["ppo-continuous"], "torchscript", output=tmp_path / "policy.pt")
    np.save(tmp_path / "obs.npy", case["obs"][None])
    script = tmp_path / "deploy.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            sys.modules["phalanx"] = None  # an import of phalanx would fail
            import numpy as np
            import onnxruntime
            import torch

            obs = np.load(sys.argv[1])
            session = onnxruntime.InferenceSession(sys.argv[2])
            np.save(sys.argv[4], session.run(None, {"obs": obs})[0])
            policy = torch.jit.load(sys.argv[3])
            with torch.no_grad():
                np.save(sys.argv[5], policy(torch.from_numpy(obs)).numpy())
            assert sys.modules["phalanx"] is None, "phalanx was imported"
            """
        )
    )
    outputs = [tmp_path / "onnx.npy", tmp_path / "torchscript.npy"]
    args = [tmp_path / "obs.npy", case["files"][None], torchscript, *outputs]
    subprocess.run(
        [sys.executable, "-I", str(script), *map(str, args)], check=True, cwd=tmp_path, timeout=120
    )
    for output in outputs:
        assert_same(np.load(output), case["expected"][None])


def test_a_missing_extra_names_the_install(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"onnxscript.*pip install 'phalanx\[export\]'"):
        phalanx.export(runs["ppo"], "onnx", output=tmp_path / "policy.onnx")
    assert not any(tmp_path.iterdir())


# -- the command line ------------------------------------------------------------------------------------


def test_cli_writes_the_default_files_and_says_where(runs, capsys):
    assert main(["export", str(runs["mappo"]), "--format", "torchscript", "--checkpoint", "latest"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for group in ("adversary", "agent"):
        path = runs["mappo"] / "export" / f"policy_{group}.pt"
        assert f"written: agent group {group}: {path}" in out
        metadata = torchscript_metadata(path)
        assert metadata["group"] == group and metadata["checkpoint"].startswith("checkpoints/step_")
    assert main(["export", str(runs["sac"]), "--format", "torchscript", "--stochastic"]) == 0
    path = runs["sac"] / "export" / "policy_stochastic.pt"
    assert f"written: {path}" in " ".join(capsys.readouterr().out.split())
    metadata = torchscript_metadata(path)
    assert metadata["stochastic"] == "true" and metadata["noise"] == "normal"
    assert metadata["inputs"] == "obs float32 (batch, 3); noise float32 (batch, 1), standard normal"


@pytest.mark.parametrize(
    ("make_argv", "expected"),
    [
        (lambda run, tmp: ["export", str(run), "--format", "tflite"], "valid formats: onnx, torchscript"),
        (lambda run, tmp: ["export", str(tmp / "nowhere")], "does not exist"),
        (
            lambda run, tmp: ["export", str(run), "--format", "torchscript", "--output", str(tmp)],
            "is a directory",
        ),
        (
            lambda run, tmp: ["export", str(run), "--format", "torchscript", "--output", str(tmp / "p.onnx")],
            "has the suffix of an onnx file",
        ),
        (
            lambda run, tmp: [
                "export",
                str(run),
                "--checkpoint",
                str(tmp / "missing.pt"),
                "--format",
                "torchscript",
            ],
            "is neither a path nor one of",
        ),
        (
            lambda run, tmp: [
                "export",
                str(run),
                "--format",
                "torchscript",
                "--output",
                str(tmp / "file" / "p.pt"),
            ],
            "cannot create the directory",
        ),
    ],
)
def test_bad_input_gets_one_paragraph_and_writes_nothing(runs, tmp_path, capsys, make_argv, expected):
    (tmp_path / "file").write_text("a file where a directory is expected")
    before = sorted(path.relative_to(runs["dqn"]) for path in runs["dqn"].rglob("*"))
    assert main(make_argv(runs["dqn"], tmp_path)) == 2
    captured = capsys.readouterr()
    out = " ".join((captured.out + captured.err).split())
    assert expected in out and "Traceback" not in out
    assert sorted(path.relative_to(runs["dqn"]) for path in runs["dqn"].rglob("*")) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


def test_a_run_without_a_checkpoint_says_so(runs, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text((runs["ppo"] / "config.yaml").read_text())
    with pytest.raises(CheckpointError, match="has no checkpoint yet"):
        phalanx.export(tmp_path / "run", "torchscript")
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["config.yaml"]


def test_a_failed_write_keeps_the_earlier_export(runs, tmp_path, monkeypatch):
    path = phalanx.export(runs["ppo"], "torchscript", output=tmp_path / "policy.pt")
    earlier = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch.jit, "save", fail)
    with pytest.raises(OSError, match="disk full"):
        phalanx.export(runs["ppo-continuous"], "torchscript", output=path)
    assert path.read_bytes() == earlier and sorted(p.name for p in tmp_path.iterdir()) == ["policy.pt"]


# -- multi-agent modules without a run: action masks, a policy per agent -----------------------------


def box(dim: int) -> gym.spaces.Box:
    return gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)


def test_a_group_with_action_masks_takes_the_mask_as_an_input():
    group = AgentGroup(("a", "b", "c"), box(6), gym.spaces.Discrete(5))
    spec = MultiAgentSpec({"agent": group}, box(10), has_action_mask=True)
    torch.manual_seed(0)
    algorithm = QMIX(
        QMIXConfig(hidden_sizes=(16, 16), batch_size=32, learning_starts=32), spec, torch.device("cpu")
    )
    policy = ExportedPolicy(algorithm.group_acting_module("agent"), (3, 6), group.action_space)
    assert policy.inputs == ("obs", "action_mask")
    obs = torch.randn(BATCH, 3, 6)
    mask = torch.rand(BATCH, 3, 5) < 0.5
    mask[..., 0] |= ~mask.any(dim=-1)  # at least one allowed action
    actions = trace(policy)(obs, mask)
    assert torch.equal(actions, algorithm.act({"agent": obs}, {"agent": mask})["agent"])
    assert mask.gather(2, actions.unsqueeze(2)).all()
    assert "action_mask bool (batch, 3, 5)" in policy.describe_inputs()


def group_policy(algorithm, name: str, stochastic: bool = False) -> ExportedPolicy:
    group = algorithm.spec.groups[name]
    shape = (group.num_agents, group.observation_space.shape[0])
    return ExportedPolicy(algorithm.group_acting_module(name, stochastic), shape, group.action_space)


@pytest.mark.parametrize("continuous", [False, True])
def test_agents_with_their_own_policies_sample_from_their_own_draws(continuous):
    action_space = gym.spaces.Box(-2.0, 3.0, (2,), np.float32) if continuous else gym.spaces.Discrete(4)
    groups = {
        "adversary": AgentGroup(("adversary_0", "adversary_1"), box(7), action_space),
        "agent": AgentGroup(("agent_0",), box(5), action_space),
    }
    torch.manual_seed(0)
    config = MAPPOConfig(hidden_sizes=(16, 16), share_parameters=False)
    algorithm = MAPPO(config, MultiAgentSpec(groups, box(12)), torch.device("cpu"))
    obs = {name: torch.randn(BATCH, g.num_agents, g.observation_space.shape[0]) for name, g in groups.items()}

    deterministic = to_env_actions(algorithm.act(obs), groups)
    for name in groups:
        actions = trace(group_policy(algorithm, name))(obs[name])
        torch.testing.assert_close(actions, deterministic[name], rtol=0, atol=TOLERANCE)

    policies = {name: group_policy(algorithm, name, stochastic=True) for name in groups}
    torch.manual_seed(1)
    sampled = to_env_actions(algorithm.act(obs, deterministic=False), groups)
    torch.manual_seed(1)
    noise = draws(SimpleNamespace(algorithm=algorithm), policies)  # one draw per agent, agent by agent
    assert noise["adversary"].shape == (BATCH, 2, policies["adversary"].noise.size)
    for name, policy in policies.items():
        actions = trace(policy)(obs[name], noise[name])
        torch.testing.assert_close(actions, sampled[name], rtol=0, atol=TOLERANCE)
