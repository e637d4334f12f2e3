"""The same code on CUDA: every algorithm trains with ``device="cuda"``, its checkpoint gives the same
actions on the CPU, seeded runs repeat, compiled matches eager, the hot loop does not copy to the host.

Skipped (with the reason) where torch sees no CUDA device, as on CI; run on a GPU with ``pytest -m cuda``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import phalanx
from phalanx.train.checkpoint import load_checkpoint

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"),
]

SINGLE_AGENT = ["ppo", "a2c", "pqn", "dqn", "double-dqn", "dueling-dqn", "d3qn", "ddpg", "td3", "sac", "redq"]


def env_of(algo: str) -> str:
    return "CartPole-v1" if algo in ("ppo", "a2c", "pqn", "d3qn") or "dqn" in algo else "Pendulum-v1"


def short_config(tmp_path, algo: str, name: str = "run", **overrides) -> phalanx.TrainConfig:
    settings: dict = dict(
        device="cuda",
        num_envs=8,
        total_steps=1024,
        eval_every=512,
        eval_episodes=2,
        eval_process=False,
        seed=3,
        hidden_sizes=(32, 32),
        run_dir=str(tmp_path / name),
    )
    if algo in ("ppo", "a2c", "pqn"):
        settings.update(horizon=16)
        if algo in ("ppo", "pqn"):
            settings.update(minibatch_size=64, epochs=2)
    else:
        settings.update(learning_starts=128, batch_size=64)
    settings.update(overrides)
    return phalanx.make_config(algo, env_of(algo), use_preset=False, **settings)


def algorithm_tensors(run_dir, which: str = "latest") -> dict[str, torch.Tensor]:
    """Every tensor of the algorithm's checkpointed state, flattened to ``path -> tensor``."""
    state = load_checkpoint(phalanx.agent.resolve_checkpoint(run_dir, which))["algorithm"]
    found: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, torch.Tensor):
            found[prefix] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}", item)

    walk("algorithm", state)
    return found


@pytest.mark.parametrize("algo", SINGLE_AGENT)
def test_every_algorithm_trains_on_cuda_and_acts_the_same_on_the_cpu(tmp_path, algo):
    result = phalanx.train(short_config(tmp_path, algo), show_progress=False)
    assert result.summary["total_steps"] == 1024
    assert np.isfinite(result.summary["eval_return_mean"])
    on_cuda = phalanx.load_agent(result.run_dir, "latest", device="cuda")
    on_cpu = phalanx.load_agent(result.run_dir, "latest", device="cpu")
    obs_dim = 4 if env_of(algo) == "CartPole-v1" else 3
    obs = np.random.default_rng(0).normal(size=(16, obs_dim)).astype(np.float32)
    cuda_actions, cpu_actions = np.asarray(on_cuda.act(obs)), np.asarray(on_cpu.act(obs))
    if cuda_actions.dtype.kind in "iu":  # argmax of near-equal values may differ in the last bits
        assert (cuda_actions == cpu_actions).mean() >= 0.9
    else:
        np.testing.assert_allclose(cuda_actions, cpu_actions, atol=1e-4)


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_seeded_cuda_runs_repeat_exactly(tmp_path, algo):
    first = phalanx.train(short_config(tmp_path, algo, "first"), show_progress=False)
    second = phalanx.train(short_config(tmp_path, algo, "second"), show_progress=False)
    a, b = algorithm_tensors(first.run_dir), algorithm_tensors(second.run_dir)
    differ = [key for key in a if not torch.equal(a[key], b[key])]
    assert not differ, f"seeded CUDA runs differ in {differ[:5]}"


def test_cuda_run_resumes_exactly(tmp_path):
    straight = phalanx.train(short_config(tmp_path, "ppo", "straight"), show_progress=False)
    half = phalanx.train(short_config(tmp_path, "ppo", "half", total_steps=512), show_progress=False)
    resumed = phalanx.resume(half.run_dir, total_steps=1024, show_progress=False)
    a, b = algorithm_tensors(straight.run_dir), algorithm_tensors(resumed.run_dir)
    differ = [key for key in a if not torch.equal(a[key], b[key])]
    assert not differ, f"resumed CUDA run differs from the straight one in {differ[:5]}"


def test_ppo_rollout_and_update_do_not_copy_to_the_host(tmp_path, monkeypatch):
    """The hot loop (collection and the update, between logging steps) synchronises with the host once
    per rollout, where the NaN guard reads its record at the rollout's last step (so a NaN is raised
    before the update learns from it), and nowhere else: torch's sync debug mode turns each ``.item()``,
    ``.cpu()`` or data-dependent shape into a warning."""
    from phalanx.envs.wrappers import NanGuard
    from phalanx.train.trainer import Trainer

    reads = []
    check = NanGuard.check
    monkeypatch.setattr(NanGuard, "check", lambda guard: (reads.append(guard.num_steps), check(guard)))
    config = short_config(
        tmp_path, "ppo", num_envs=256, total_steps=256 * 16 * 4, log_every=10**9, eval_every=0
    )
    trainer = Trainer(config, show_progress=False)
    try:
        trainer.worker.collect(trainer.buffer)  # the first rollout and update allocate, untimed
        trainer.learner.update(0.5)
        torch.cuda.synchronize()
        reads.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(3):
                    trainer.worker.collect(trainer.buffer)
                    trainer.learner.update(0.5)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        trainer.close()
    syncs = [
        str(w.message)
        for w in caught
        if "synchronizing CUDA operation" in str(w.message)  # not the mode's "prototype" notice
    ]
    assert reads == [32, 48, 64], (
        f"the NaN guard read its record at steps {reads}, expected each rollout's end"
    )
    assert len(syncs) == len(reads), (
        f"{len(syncs)} host synchronisations in 3 iterations, expected 3: {syncs[:2]}"
    )


def test_vectorized_population_trains_on_cuda():
    from phalanx.population.vectorized import VectorizedPPO

    config = phalanx.make_config(
        "ppo",
        "CartPole-v1",
        device="cuda",
        num_envs=8,
        horizon=16,
        minibatch_size=64,
        epochs=2,
        eval_episodes=2,
    )
    population = VectorizedPPO(config, [1, 2, 3], [{"learning_rate": lr} for lr in (1e-3, 2e-3, 3e-3)])
    try:
        metrics = population.train(8 * 16 * 2)
        assert all(value.shape == (3,) for value in metrics.values())
        assert all(torch.isfinite(torch.as_tensor(value)).all() for value in metrics.values())
        scores = population.evaluate(2)
        assert len(scores) == 3
    finally:
        population.close()


def test_recurrent_ppo_and_pipelined_sac_train_on_cuda(tmp_path):
    recurrent = short_config(tmp_path, "ppo", "recurrent", recurrent="lstm", minibatch_size=32)
    assert phalanx.train(recurrent, show_progress=False).summary["total_steps"] == 1024
    pipelined = short_config(tmp_path, "sac", "pipelined", pipeline=True)
    assert phalanx.train(pipelined, show_progress=False).summary["total_steps"] == 1024


def test_mappo_trains_on_cuda(tmp_path):
    config = phalanx.make_config(
        "mappo",
        "simple_spread",
        device="cuda",
        num_envs=16,
        total_steps=1600,
        eval_every=800,
        eval_episodes=2,
        eval_process=False,
        run_dir=str(tmp_path / "mappo"),
    )
    assert phalanx.train(config, show_progress=False).summary["total_steps"] >= 1600


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_compiled_run_on_cuda_matches_eager(tmp_path, algo):
    eager = phalanx.train(short_config(tmp_path, algo, "eager", total_steps=512), show_progress=False)
    compiled = phalanx.train(
        short_config(tmp_path, algo, "compiled", total_steps=512, compile=True), show_progress=False
    )
    a, b = algorithm_tensors(eager.run_dir), algorithm_tensors(compiled.run_dir)
    for key in a:
        if a[key].is_floating_point():
            torch.testing.assert_close(b[key], a[key], atol=2e-3, rtol=2e-3, msg=key)
