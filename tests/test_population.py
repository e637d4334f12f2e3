"""Population-based training on the serial and process backends: config and bad input, mutation and
selection rules, tournament and generational runs, the leaderboard and report, faults, elasticity,
Ctrl+C / kill and resume, and the CLI. (Ray: tests/test_population_ray.py; vectorized:
tests/test_population_vectorized.py.)"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from phalanx import make_config
from phalanx.agent import evaluate
from phalanx.cli import main
from phalanx.envs import make_env, register_env
from phalanx.envs.registry import unregister_env
from phalanx.errors import ConfigError
from phalanx.population import (
    Leaderboard,
    Mutation,
    PopulationConfig,
    PopulationFailed,
    Resources,
    resume_population,
    run_population,
)
from phalanx.population.evolution import generational_plan, split, tournament, tournament_donor
from phalanx.train.checkpoint import load_checkpoint
from phalanx.train.handover import adopt
from phalanx.train.plots import curves
from phalanx.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8 * 32  # one rollout of the tiny PPO below


def tiny_base(**overrides):
    settings = dict(
        num_envs=8,
        total_steps=3 * STEPS,
        eval_every=0,
        eval_episodes=4,
        log_every=10**9,
        torch_threads=1,
        hyperparameters={"horizon": 32, "minibatch_size": 64, "epochs": 2, "hidden_sizes": (16, 16)},
    )
    settings.update(overrides)
    return make_config("ppo", settings.pop("env", "CartPole-v1"), **settings)


def tiny_population(directory: Path, **overrides) -> PopulationConfig:
    settings = dict(
        base=tiny_base(),
        size=4,
        interval=STEPS,
        backend="serial",
        mutations={
            "learning_rate": Mutation(perturb=(0.8, 1.25), log_uniform=(1e-4, 1e-2)),
            "entropy_coef": Mutation(choices=(0.0, 0.01)),
        },
        resources=Resources(cpus=2),
        directory=str(directory),
    )
    settings.update(overrides)
    return PopulationConfig(**settings)


def decisions(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "decisions.jsonl").read_text().splitlines()]


# -- config and bad input -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"size": 1}, "size = 1 is invalid: expected >= 2 for tournament"),
        ({"replace_fraction": 1.0}, "replace_fraction = 1.0 is invalid: expected a fraction in (0, 1)"),
        ({"replace_fraction": 0}, "replace_fraction = 0 is invalid"),
        ({"strategy": "random"}, "strategy = 'random' is invalid"),
        ({"mutations": {"learning_rat": Mutation(perturb=(0.8, 1.2))}}, "Did you mean learning_rate?"),
        ({"mutations": {"learning_rate": Mutation(uniform=(1e-2, 1e-4))}}, "uniform bounds are inverted"),
        ({"mutations": {"learning_rate": Mutation(perturb=(0.8,), min=1, max=0.1)}}, "min 1 > max 0.1"),
        (
            {"mutations": {"hidden_sizes": Mutation(choices=((8,), (16,)))}},
            "'hidden_sizes' cannot be mutated",
        ),
        ({"mutations": {"learning_rate": Mutation()}}, "nothing says how to change it"),
        ({"mutations": {"clip_value": Mutation(perturb=(0.8, 1.2))}}, "perturb needs a number"),
    ],
)
def test_bad_population_config_is_refused_with_the_fix(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=None) as error:
        tiny_population(tmp_path, **overrides).validate()
    assert message in str(error.value)


def test_unknown_hyperparameter_lists_the_valid_names(tmp_path):
    config = tiny_population(tmp_path, mutations={"bogus": Mutation(perturb=(0.8, 1.2))})
    with pytest.raises(ConfigError, match="Valid names: .*clip_range.*entropy_coef.*learning_rate"):
        config.validate()


def test_resources_too_small_fail_before_any_training(tmp_path):
    directory = tmp_path / "pop"
    config = tiny_population(directory, resources=Resources(cpus=2, cpus_per_member=4))
    with pytest.raises(ConfigError, match=r"the resources fit no member: one member needs 4 CPU"):
        run_population(config, show_progress=False)
    assert not directory.exists()


def sac_population(directory: Path, backend: str, **resources) -> PopulationConfig:
    """4 SAC members of 1,000,000-transition replays: 34 bytes a Pendulum transition (two float32 (3,)
    observations, a float32 (1,) action and reward, two flags), 34,000,000 bytes a member."""
    base = make_config(
        "sac", "Pendulum-v1", num_envs=4, total_steps=512, eval_every=0, use_preset=False, buffer_size=10**6
    )
    return PopulationConfig(
        base=base,
        size=4,
        interval=256,
        backend=backend,
        mutations={"learning_rate": Mutation(perturb=(0.8, 1.25))},
        resources=Resources(cpus=2, cpus_per_member=0.01, **resources),
        directory=str(directory),
    )


def test_replays_the_process_backend_holds_at_once_must_fit_together_before_any_member_starts(
    tmp_path, monkeypatch
):
    """Each member process allocates its own replay and checks it alone: 3 at once fit one by one in 64
    MiB, not together. The population is refused before anything starts, with the sums and the fix."""
    monkeypatch.setattr("phalanx.buffers.memory.available_memory", lambda device: 64 * 2**20)
    directory = tmp_path / "pop"
    with pytest.raises(ConfigError) as error:
        run_population(sac_population(directory, "process", max_concurrent=3), show_progress=False)
    message = str(error.value)
    assert "the process backend holds 3 members at once on this machine" in message
    assert "1,000,000 transitions (obs (3,), actions (1,), 34 bytes each), 34,000,000 bytes" in message
    assert f"(102,000,000 bytes needed, {64 * 2**20:,} available, of which" in message
    assert "lower --buffer-size to at most 592,137 transitions per member" in message  # 0.9 * 64 MiB / 3
    assert (
        "hold at most 1 member at once (--size 1; on the process backend, resources: {max_concurrent: 1}"
        in message
    )
    assert not directory.exists()


def test_the_replays_counted_are_those_each_backend_holds_at_once(tmp_path, monkeypatch):
    from phalanx.population.backends import make_backend
    from phalanx.population.orchestrator import Orchestrator

    monkeypatch.setattr("phalanx.buffers.memory.available_memory", lambda device: 64 * 2**20)

    def check(backend: str, max_concurrent: int | None) -> None:
        config = sac_population(tmp_path / backend, backend, max_concurrent=max_concurrent)
        orchestrator = Orchestrator(
            config, Leaderboard(tmp_path / backend), make_backend(backend, config.resources)
        )
        try:
            orchestrator.check_memory(config.size)
        finally:
            orchestrator.backend.close()

    check("process", max_concurrent=1)  # one process: its own check is the whole of it
    with pytest.raises(ConfigError, match="the serial backend holds 4 members at once"):
        check("serial", max_concurrent=1)  # one at a time, but each member keeps its trainer here
    monkeypatch.setattr("phalanx.buffers.memory.available_memory", lambda device: 2**30)
    check("process", max_concurrent=None)  # 4 x 34 MB fit in 1 GiB


def test_population_config_round_trips_through_yaml(tmp_path):
    config = tiny_population(tmp_path, strategy="generational", tournament_size=3)
    config.save(tmp_path / "population.yaml")
    loaded = PopulationConfig.from_yaml(tmp_path / "population.yaml")
    assert loaded.to_dict() == config.to_dict()
    with pytest.raises(ConfigError, match="unknown settings \\['sizes'\\]"):
        PopulationConfig.from_dict({"base": {"algo": "ppo", "env": "CartPole-v1"}, "sizes": 3})
    with pytest.raises(ConfigError, match="needs a 'base' mapping"):
        PopulationConfig.from_dict({"size": 3})


# -- mutation and selection rules -----------------------------------------------------------------
def test_mutations_perturb_resample_and_step_within_their_bounds():
    rng = random.Random(0)
    perturb = Mutation(perturb=(0.8, 1.25), min=1e-4, max=1e-3)
    values = {perturb.mutate(1e-3, rng) for _ in range(50)}
    assert values == {8e-4, 1e-3}  # x1.25 is capped at max
    steps = Mutation(steps=(0.9, 0.95, 0.99, 0.999))
    assert {steps.mutate(0.95, rng) for _ in range(50)} == {0.9, 0.99}
    assert {steps.mutate(0.9, rng) for _ in range(50)} <= {0.9, 0.95}
    choices = Mutation(choices=(1, 2, 3))
    assert {choices.mutate(1, rng) for _ in range(50)} == {1, 2, 3}
    integer = Mutation(perturb=(0.5, 2.0))
    assert all(isinstance(integer.mutate(4, rng), int) for _ in range(10))
    log_uniform = Mutation(log_uniform=(1e-5, 1e-3))
    assert all(1e-5 <= log_uniform.initial(3e-4, rng) <= 1e-3 for _ in range(50))
    assert Mutation(perturb=(0.8,)).initial(3e-4, rng) == 3e-4  # perturb only: the base value


def test_selection_takes_the_bottom_from_the_top_by_tournament():
    scores = {"m0": 10.0, "m1": 50.0, "m2": 30.0, "m3": 20.0}
    assert split(scores, 0.25) == (["m1"], ["m0"])
    assert split(scores, 0.5) == (["m1", "m2"], ["m3", "m0"])
    assert split({"a": 1.0, "b": 2.0}, 0.9) == (["b"], ["a"])  # never overlapping
    rng = random.Random(0)
    assert tournament(["m1", "m2"], scores, 2, rng) == "m1"  # the best of all drawn
    assert tournament_donor("m2", scores, 0.25, 2, rng) is None  # not in the bottom
    assert tournament_donor("m0", scores, 0.25, 2, rng) == "m1"
    plan = generational_plan(scores, 0.5, 1, rng)
    assert sorted(member for member, _ in plan) == ["m0", "m3"]
    assert all(donor in ("m1", "m2") for _, donor in plan)


# -- adopt: what a copy takes ----------------------------------------------------------------
def test_adopt_takes_the_donors_agent_and_the_new_hyperparameters(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    donor = Trainer(
        tiny_base(seed=1, run_dir=str(tmp_path / "a")), run_dir=tmp_path / "a", show_progress=False
    )
    member = Trainer(
        tiny_base(seed=2, run_dir=str(tmp_path / "b")), run_dir=tmp_path / "b", show_progress=False
    )
    try:
        donor.train()
        agent = donor.agent_state()
        adopt(member, agent, {"learning_rate": 1.234e-3, "horizon": 16, "entropy_coef": 0.02})
        for mine, theirs in zip(
            member.algorithm.state_dict()["policy"].values(),
            agent["algorithm"]["policy"].values(),
            strict=False,
        ):
            torch.testing.assert_close(mine, theirs)
        optimizer = member.algorithm.optimizer
        assert [group["lr"] for group in optimizer.param_groups] == [1.234e-3]
        moments = optimizer.state[optimizer.flat.parameter]["exp_avg"].split(
            [p.numel() for p in member.algorithm.parameters]
        )  # one flat Adam state, a segment per parameter
        assert all(m.abs().sum() > 0 for m in moments)  # the donor's Adam state came along
        assert member.buffer.horizon == 16 and member.config.hyperparameters.entropy_coef == 0.02
        assert member.worker.algorithm is member.algorithm is member.learner.algorithm
        assert member.steps == 0  # its own progress
        member.config.total_steps = 2 * STEPS
        member.train()  # trains on with the new horizon and learning rate
        assert member.steps == 2 * STEPS
        with pytest.raises(ConfigError, match="learning_rate = -1"):
            adopt(member, None, {"learning_rate": -1.0})
    finally:
        donor.close()
        member.close()


# -- runs ---------------------------------------------------------------------------------------------
def test_tournament_population_runs_records_lineage_and_exports_the_best(tmp_path):
    directory = tmp_path / "pop"
    result = run_population(tiny_population(directory, replace_fraction=0.5), show_progress=False)
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" and m.steps == 3 * STEPS for m in board.members.values())
    assert all(len(m.scores) == 3 for m in board.members.values())  # an evaluation per interval
    events = decisions(directory)
    exploits = [e for e in events if e["event"] == "exploit"]
    assert exploits and len(exploits) == len(board.lineage)
    for event, copy in zip(exploits, board.lineage, strict=True):
        assert event["member"] == copy["member"] and f"copies {copy['donor']}" in event["reason"]
        assert "bottom 50%" in event["reason"]
    # The member that copied last trains from the donor's checkpoint with the mutated values.
    last = board.lineage[-1]
    member_config = load_checkpoint(_latest(directory / "members" / last["member"]))["config"]
    for name, value in last["hyperparameters_after"].items():
        assert member_config["hyperparameters"][name] == pytest.approx(value)
    # Report, export, eval.
    for name in (
        "scores.csv",
        "lineage.csv",
        "best_schedule.csv",
        "curves.png",
        "schedule.png",
        "lineage.png",
    ):
        assert (directory / "report" / name).stat().st_size > 0
    assert result.best_member == board.best().id and result.best_score == board.best().score
    assert json.loads((result.best_run_dir / "population.json").read_text())["member"] == result.best_member
    evaluation = evaluate(result.best_run_dir, episodes=2, checkpoint="latest")
    assert len(evaluation.returns) == 2
    schedule = board.best_schedule()
    assert schedule[0]["steps"] == 0 and schedule[-1]["member"] == result.best_member


def _latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()


def test_generational_population_replaces_the_bottom_after_each_generation(tmp_path):
    directory = tmp_path / "pop"
    run_population(tiny_population(directory, strategy="generational", size=4), show_progress=False)
    board = Leaderboard.load(directory)
    events = decisions(directory)
    assert [e["reason"].split(";")[0] for e in events if e["event"] == "generation"] == [
        "generation 1 starts",
        "generation 2 starts",
    ]
    replaced = [e for e in events if e["event"] == "replace"]
    assert len(replaced) == 2  # one of four per generation (the bottom 25%)
    # Synchronous: every member had reported the generation before anyone was replaced.
    for copy in board.lineage:
        assert copy["steps"] == copy["donor_steps"] and copy["steps"] % STEPS == 0
    assert all(m.steps == 3 * STEPS and len(m.scores) == 3 for m in board.members.values())


def test_process_backend_runs_members_in_processes_and_leaves_none_behind(tmp_path):
    directory = tmp_path / "pop"
    config = tiny_population(directory, backend="process", size=3, resources=Resources(cpus=2))
    result = run_population(config, show_progress=False)
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" for m in board.members.values())
    assert result.best_run_dir.is_dir()
    assert multiprocessing.active_children() == []


# -- faults --------------------------------------------------------------------------------------------
def crashing_cartpole(num_envs, device, flags: str = "", **kwargs):
    """CartPole whose step raises while a flag file in ``flags`` is left to claim (one per crash)."""
    from phalanx.envs.wrappers import VecEnvWrapper

    class Crashing(VecEnvWrapper):
        def step(self, actions):
            for flag in sorted(Path(flags).glob("crash-*")):
                try:
                    os.rename(flag, flag.with_name("claimed-" + flag.name))
                except FileNotFoundError:
                    continue
                raise RuntimeError("injected member crash")
            return self.env.step(actions)

    return Crashing(make_env("CartPole-v1", num_envs=num_envs, device=device, **kwargs))


@pytest.fixture
def crashing_env(tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    register_env(
        "Crashing-v0", lambda num_envs, device, **kw: crashing_cartpole(num_envs, device, str(flags), **kw)
    )
    yield flags
    unregister_env("Crashing-v0")


def test_a_crashed_member_restarts_from_its_checkpoint_then_is_removed_past_the_limit(tmp_path, crashing_env):
    directory = tmp_path / "pop"
    config = tiny_population(directory, base=tiny_base(env="Crashing-v0"), size=2, max_restarts=1)
    (crashing_env / "crash-1").touch()  # the first member's first step crashes once
    run_population(config, show_progress=False)
    events = decisions(directory)
    restarts = [e for e in events if e["event"] == "restart"]
    assert len(restarts) == 1 and "injected member crash" in restarts[0]["reason"]
    assert "RuntimeError: injected member crash" in restarts[0]["error"]
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" and m.steps == 3 * STEPS for m in board.members.values())

    # Past max_restarts the member is removed with the reason; the rest finish.
    directory = tmp_path / "pop2"
    for k in range(3):
        (crashing_env / f"crash-{k}").touch()
    run_population(
        tiny_population(directory, base=tiny_base(env="Crashing-v0"), size=3, max_restarts=1),
        show_progress=False,
    )
    board = Leaderboard.load(directory)
    removed = [m for m in board.members.values() if m.status == "removed"]
    assert len(removed) == 1 and removed[0].reason == "crashed 2 times"
    assert [e["event"] for e in decisions(directory)].count("remove") == 1
    assert sum(m.status == "finished" for m in board.members.values()) == 2


def test_a_population_in_which_no_member_scored_fails_with_why(tmp_path, capsys):
    def broken(num_envs, device, **kwargs):
        raise RuntimeError("injected: this env cannot be built")

    register_env("Broken-v0", broken)
    try:
        directory = tmp_path / "pop"
        with pytest.raises(PopulationFailed) as failed:
            run_population(
                tiny_population(directory, base=tiny_base(env="Broken-v0"), size=2, max_restarts=1),
                show_progress=False,
            )
        message = str(failed.value)
        assert f"no member of the population in {directory} produced a score" in message
        assert "Every member m000, m001: crashed 2 times (max_restarts = 1); last error: RuntimeError: " in (
            message
        )
        assert "injected: this env cannot be built" in message and "decisions.jsonl" in message
        assert not (directory / "best").exists()
        # The CLI: the ranking and the error, exit 1 (it ran, without a result), no "best member: None".
        command = ["population", "run", "ppo", "Broken-v0", "--size", "2", "--backend", "serial"]
        assert main([*command, "--max-restarts", "0", "--dir", str(tmp_path / "cli")]) == 1
        output = capsys.readouterr()
        assert "m001" in output.out and "best member:" not in output.out + output.err
        assert "crashed 1 times (max_restarts = 0); last error: RuntimeError: injected" in output.err
    finally:
        unregister_env("Broken-v0")


def test_a_multi_agent_population_copies_every_agents_networks_and_exports_the_best(tmp_path):
    """MAPPO with an agent per network (three PPO units, three optimisers): a copy takes every unit's
    networks and sets the mutated learning rate in every optimiser."""
    directory = tmp_path / "pop"
    command = ["population", "run", "mappo", "simple_spread", "--size", "3", "--replace-fraction", "0.34"]
    command += ["--interval", "400", "--total-steps", "1200", "--num-envs", "16", "--eval-episodes", "4"]
    command += ["--horizon", "25", "--epochs", "2", "--no-share-parameters", "--torch-threads", "1"]
    command += ["--mutate", "learning_rate=perturb:0.5,2", "--backend", "serial", "--dir", str(directory)]
    assert main(command) == 0
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" and len(m.scores) == 3 for m in board.members.values())
    assert board.lineage, "no member copied another"
    last = board.lineage[-1]
    state = load_checkpoint(_latest(directory / "members" / last["member"]))["algorithm"]
    assert sorted(state) == ["agent/agent_0", "agent/agent_1", "agent/agent_2"]
    rate = last["hyperparameters_after"]["learning_rate"]
    assert all(unit["optimizer"]["param_groups"][0]["lr"] == pytest.approx(rate) for unit in state.values())
    evaluation = evaluate(directory / "best", episodes=2, checkpoint="latest")
    assert set(evaluation.agents) == {"agent_0", "agent_1", "agent_2"}


@pytest.mark.slow
def test_a_multi_agent_population_learns_simple_spread(tmp_path):
    """Two MAPPO members, 100k env steps each: the best beats the random policy's team return (-26.6)
    by the margin of the single-run learning test (tests/test_marl.py)."""
    base = make_config(
        "mappo", "simple_spread", num_envs=64, total_steps=100_000, eval_episodes=64, torch_threads=1
    )
    config = tiny_population(
        tmp_path / "pop",
        base=base,
        size=2,
        interval=50_000,
        mutations={"learning_rate": Mutation(perturb=(0.8, 1.25))},
    )
    result = run_population(config, show_progress=False)
    assert result.best_score > -26.6 + 4.0, result


# -- random draws ------------------------------------------------------------------------------------------
def _draws(board: Leaderboard) -> list[float]:
    """Every learning rate the population drew: the members' starting values, then each copy's."""
    starts = [m.schedule[0][1]["learning_rate"] for m in board.members.values()]
    return starts + [copy["hyperparameters_after"]["learning_rate"] for copy in board.lineage]


@pytest.mark.parametrize("backend", ["serial", "vectorized"])
def test_seed_0_decisions_do_not_replay_the_members_starting_draws(tmp_path, monkeypatch, backend):
    """No two random streams of the population are seeded alike (Python seeds by the absolute value,
    so -1 and 1 are one stream). Every value is resampled (uniform, no perturb): a decision whose
    stream were a member's starting stream would draw that member's starting learning rate again."""
    seeds = []

    class Recorded(random.Random):
        def seed(self, a=None, version=2):
            if isinstance(a, int):  # not None: an unseeded Random elsewhere (tempfile's)
                seeds.append(abs(a))
            super().seed(a, version)

    monkeypatch.setattr(random, "Random", Recorded)
    config = tiny_population(
        tmp_path / "pop",
        base=tiny_base(seed=0),
        size=4,
        replace_fraction=0.5,
        backend=backend,
        mutations={"learning_rate": Mutation(uniform=(1e-4, 1e-2))},
    )
    run_population(config, show_progress=False)
    assert len(seeds) >= 6 and len(set(seeds)) == len(seeds), seeds
    draws = _draws(Leaderboard.load(tmp_path / "pop"))
    assert len(draws) >= 6 and len(set(draws)) == len(draws), draws


def test_population_streams_are_independent_for_every_seed():
    from phalanx.population.evolution import population_random

    for seed in (0, 1, 2):
        streams = [("member", k) for k in range(16)] + [("decision", k) for k in range(16)]
        firsts = [population_random(seed, stream, index).random() for stream, index in streams]
        assert len(set(firsts)) == len(firsts)
        assert firsts == [population_random(seed, stream, index).random() for stream, index in streams]
    assert population_random(0, "decision", 1).random() != population_random(1, "decision", 1).random()


def test_a_resumed_population_continues_its_random_streams(tmp_path, monkeypatch):
    """Generational, so that the order in which members train again after the resume does not change
    what is selected: the resumed population draws what the straight one drew."""
    from phalanx.population import PopulationInterrupted
    from phalanx.population.orchestrator import Orchestrator

    def outcome(directory: Path) -> tuple:
        board = Leaderboard.load(directory)
        members = {m.id: ([s[:2] for s in m.scores], m.schedule) for m in board.members.values()}
        copies = [{k: v for k, v in copy.items() if k != "time_s"} for copy in board.lineage]
        return members, copies, board.selections

    def config(name: str) -> PopulationConfig:
        return tiny_population(tmp_path / name, base=tiny_base(seed=0), strategy="generational")

    original, reports = Orchestrator.handle, []

    def handle_then_interrupt(self, report):  # Ctrl+C once the 6th report of 12 is recorded
        original(self, report)
        reports.append(report)
        return len(reports) == 6

    monkeypatch.setattr(Orchestrator, "handle", handle_then_interrupt)
    with pytest.raises(PopulationInterrupted):
        run_population(config("resumed"), show_progress=False)
    monkeypatch.setattr(Orchestrator, "handle", original)
    assert Leaderboard.load(tmp_path / "resumed").lineage, "no copy before the interruption"
    resume_population(tmp_path / "resumed", show_progress=False)
    run_population(config("straight"), show_progress=False)
    assert outcome(tmp_path / "resumed") == outcome(tmp_path / "straight")


# -- elasticity ------------------------------------------------------------------------------------------
def test_lowering_max_concurrent_culls_the_weakest_and_raising_it_spawns_from_the_best(tmp_path):
    directory = tmp_path / "pop"
    config = tiny_population(
        directory,
        size=3,
        base=tiny_base(total_steps=4 * STEPS),
        resources=Resources(cpus=2, cpus_per_member=0.5, max_concurrent=3),
    )
    reports = {"count": 0}

    def say(message: str) -> None:  # the orchestrator's console: change the limit as a user would
        if ": score " in message:
            reports["count"] += 1
            if reports["count"] == 3:
                main(["population", "scale", str(directory), "--max-concurrent", "2"])
            if reports["count"] == 6:
                main(["population", "scale", str(directory), "--max-concurrent", "4"])

    from phalanx.population.backends import make_backend
    from phalanx.population.orchestrator import Orchestrator

    config.validate()
    board = Leaderboard(directory)
    orchestrator = Orchestrator(config, board, make_backend("serial", config.resources), say)
    from phalanx.population.leaderboard import MemberRecord

    for index in range(3):
        board.add(
            MemberRecord(
                board.next_id(), orchestrator.member_seed(index), {"learning_rate": 1e-3, "entropy_coef": 0.0}
            )
        )
    directory.mkdir(parents=True)
    config.save(directory / "population.yaml")
    orchestrator.run()

    events = decisions(directory)
    culls = [e for e in events if e["event"] == "cull"]
    assert len(culls) == 1 and "the resources shrank: 2 members fit instead of 3" in culls[0]["reason"]
    spawns = [e for e in events if e["event"] == "spawn"]
    assert len(spawns) == 2 and all(
        "the resources grew: 4 members fit instead of 2" in e["reason"] for e in spawns
    )
    board = Leaderboard.load(directory)
    assert board.members[culls[0]["member"]].status == "removed"
    for spawn in spawns:
        spawned = board.members[spawn["member"]]
        parent = next(c for c in board.lineage if c["member"] == spawned.id and c["kind"] == "spawn")
        assert spawned.status == "finished" and spawned.steps == 4 * STEPS
        assert spawned.scores[0][0] == parent["donor_steps"] + STEPS  # it went on from its parent's steps


# -- interruption and resume -----------------------------------------------------------------------------
def _run_cli_until_reports(directory: Path, reports: int, extra: list[str]) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "phalanx",
        "population",
        "run",
        "ppo",
        "CartPole-v1",
        "--size",
        "3",
        "--interval",
        str(STEPS),
        "--total-steps",
        str(3 * STEPS),
        "--num-envs",
        "8",
        "--horizon",
        "32",
        "--minibatch-size",
        "64",
        "--epochs",
        "2",
        "--hidden-sizes",
        "16",
        "16",
        "--eval-episodes",
        "4",
        "--torch-threads",
        "1",
        "--eval-every",
        "0",
        "--cpus",
        "2",
        "--dir",
        str(directory),
        "--mutate",
        "learning_rate=perturb:0.8,1.25",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline:
        path = directory / "leaderboard.json"
        if path.is_file():
            try:
                members = json.loads(path.read_text())["members"]
            except json.JSONDecodeError:
                members = []
            if sum(len(m["scores"]) for m in members) >= reports:
                return process
        if process.poll() is not None:
            pytest.fail(f"the population ended early: {process.stdout.read()}")
        time.sleep(0.2)
    process.kill()
    pytest.fail("no reports within 240 s")


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_killed_or_interrupted_population_resumes_without_losing_evaluations(tmp_path, signal_name):
    """SIGKILL and Ctrl+C reach the whole process group; SIGTERM (kill, docker stop) the orchestrator
    alone, which asks the members in flight to save."""
    directory = tmp_path / "pop"
    extra = ["--backend", "process", *(["--resume"] if signal_name == "SIGTERM" else [])]
    process = _run_cli_until_reports(directory, reports=3, extra=extra)
    if signal_name == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, getattr(signal, signal_name))
    output, _ = process.communicate(timeout=120)
    if signal_name != "SIGKILL":
        assert process.returncode == 128 + getattr(signal, signal_name), output
        assert f"phalanx population resume {directory}" in " ".join(output.split())
        cause = {"SIGINT": "Ctrl+C", "SIGTERM": "SIGTERM"}[signal_name]
        interrupts = [e["reason"].split(":")[0] for e in decisions(directory) if e["event"] == "interrupt"]
        assert interrupts == [cause]
    before = Leaderboard.load(directory)
    scored_before = {m.id: list(m.scores) for m in before.members.values()}
    deadline = time.time() + 30  # the members' processes see their parent gone and end
    while _processes_in_group(process.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert _processes_in_group(process.pid) == []

    if signal_name == "SIGTERM":  # a requeued job: the same command (with --resume) continues it
        assert main(process.args[3:]) == 0
    else:
        assert resume_population(directory, show_progress=False).best_run_dir.is_dir()
    after = Leaderboard.load(directory)
    assert all(m.status == "finished" and m.steps == 3 * STEPS for m in after.members.values())
    for member, scores in scored_before.items():
        assert after.members[member].scores[: len(scores)] == scores  # nothing evaluated is lost
    assert any(e["event"] == "resume" for e in decisions(directory))


def test_resume_starts_a_population_then_continues_it_and_refuses_other_settings(tmp_path):
    directory = tmp_path / "pop"
    first = run_population(tiny_population(directory, base=tiny_base(total_steps=STEPS, resume=True)), False)
    assert all(m.steps == STEPS for m in Leaderboard.load(directory).members.values())
    longer = tiny_population(directory, base=tiny_base(total_steps=2 * STEPS, resume=True))
    assert run_population(longer, show_progress=False).best_member is not None  # continued, not refused
    assert all(m.steps == 2 * STEPS for m in Leaderboard.load(directory).members.values())
    assert first.directory == directory
    other = tiny_population(directory, size=5, base=tiny_base(total_steps=2 * STEPS, resume=True))
    with pytest.raises(ConfigError, match="other settings than this command: size: the population has 4"):
        run_population(other, show_progress=False)


def test_a_population_without_mutations_says_it_copies_weights_only(tmp_path):
    directory = tmp_path / "pop"
    config = tiny_population(directory, mutations={}, base=tiny_base(total_steps=3 * STEPS))
    run_population(config, show_progress=False)
    copies = [e for e in decisions(directory) if e["event"] in ("exploit", "copy", "replace")]
    assert copies and all("its weights only: no --mutate" in e["reason"] for e in copies), copies
    assert all("mutates to" not in e["reason"] for e in decisions(directory))
    console = Console(width=100, record=True)
    console.print(Leaderboard.load(directory).table())
    assert "base config" in console.export_text()


def _processes_in_group(group: int) -> list[str]:
    found = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout
    return found.split()


# -- CLI ---------------------------------------------------------------------------------------------------
def test_cli_runs_a_population_from_yaml_and_prints_its_status(tmp_path, capsys):
    config = tmp_path / "population.yaml"
    config.write_text(
        f"""
base:
  algo: ppo
  env: CartPole-v1
  num_envs: 8
  total_steps: {2 * STEPS}
  eval_every: 0
  eval_episodes: 4
  torch_threads: 1
  hyperparameters: {{horizon: 32, minibatch_size: 64, epochs: 2, hidden_sizes: [16, 16]}}
size: 3
interval: {STEPS}
backend: serial
mutations:
  learning_rate: {{perturb: [0.8, 1.25], min: 1.0e-4, max: 1.0e-2}}
  gamma: {{steps: [0.95, 0.98, 0.99]}}
resources: {{cpus: 2}}
"""
    )
    directory = tmp_path / "pop"
    # A CLI flag overrides the file's base (--total-steps) and its population settings (--size).
    assert main(["population", "run", str(config), "--dir", str(directory), "--size", "2"]) == 0
    board = Leaderboard.load(directory)
    assert len(board.members) == 2
    assert all(m.hyperparameters["gamma"] in (0.95, 0.98, 0.99) for m in board.members.values())
    capsys.readouterr()
    assert main(["population", "status", str(directory)]) == 0
    assert "m000" in capsys.readouterr().out
    assert main(["population", "report", str(directory)]) == 0
    assert main(["population", "status", str(tmp_path)]) == 2
    assert "is not a population directory" in capsys.readouterr().err
    assert (
        main(["population", "run", str(config), "--replace-fraction", "1.5", "--dir", str(tmp_path / "x")])
        == 2
    )
    assert "replace_fraction = 1.5 is invalid" in capsys.readouterr().err
    assert (
        main(["population", "run", str(config), "--mutate", "learning_rate", "--dir", str(tmp_path / "y")])
        == 2
    )
    assert "expected NAME=KIND:ARGS" in capsys.readouterr().err
    assert main(["population", "run", str(config), "--dir", str(directory)]) == 2
    assert "already holds a population" in capsys.readouterr().err


# -- vectorized backend (the engine itself: tests/test_population_vectorized.py) ---------------------------
def test_vectorized_population_selects_member_slices_and_exports_the_best(tmp_path):
    directory = tmp_path / "pop"
    config = tiny_population(directory, backend="vectorized", size=6, replace_fraction=0.34)
    result = run_population(config, show_progress=False)
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" and len(m.scores) == 3 for m in board.members.values())
    exploits = [e for e in decisions(directory) if e["event"] == "exploit"]
    assert len(exploits) == 2 * 2  # two selections (not after the last interval), two of six each
    # The exported best is an ordinary run: evaluated with the same seed it scores what the population
    # recorded for it, so the slice written out is the member that was scored.
    evaluation = evaluate(result.best_run_dir, episodes=config.base.eval_episodes)
    assert evaluation.mean == pytest.approx(result.best_score)


@pytest.mark.parametrize("compile", [True, None, False])
def test_a_vectorized_population_compiles_its_members_update_when_asked(tmp_path, monkeypatch, compile):
    """--compile reaches the engine (its compile() called once, before training); the default (auto) and
    --no-compile keep it eager. The compiled update itself: tests/test_compiled_update.py."""
    from phalanx.population.vectorized import VectorizedPPO

    calls = []
    monkeypatch.setattr(VectorizedPPO, "compile", lambda engine: calls.append(engine.steps) or ["update"])
    config = tiny_population(tmp_path / "pop", backend="vectorized", size=2)
    config.base.compile = compile
    run_population(config, show_progress=False)
    assert calls == ([0] if compile else [])
    compiled = [e for e in decisions(tmp_path / "pop") if e["event"] == "compile"]
    assert [e["reason"] for e in compiled] == (["compiled the members' update"] if compile else [])


def test_vectorized_sac_population_runs_from_the_population_config(tmp_path):
    """backend 'vectorized' takes the algorithm's vectorized population from the registry: SAC members
    train as one batched run, exploit each other and export the best as an ordinary run."""
    directory = tmp_path / "pop"
    base = make_config(
        "sac",
        "Pendulum-v1",
        use_preset=False,
        num_envs=2,
        hidden_sizes=(8, 8),
        batch_size=16,
        learning_starts=32,
        buffer_size=1_000,
        total_steps=3 * 64,
        eval_episodes=2,
    )
    config = tiny_population(
        directory,
        backend="vectorized",
        base=base,
        interval=64,
        mutations={"learning_rate": Mutation(perturb=(0.8, 1.25))},
    )
    result = run_population(config, show_progress=False)
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" and len(m.scores) == 3 for m in board.members.values())
    assert [e for e in decisions(directory) if e["event"] == "exploit"]
    evaluation = evaluate(result.best_run_dir, episodes=base.eval_episodes)
    assert evaluation.mean == pytest.approx(result.best_score)


def test_a_vectorized_populations_plot_and_report_say_what_there_is(tmp_path, monkeypatch):
    """`phalanx plot` of a vectorized population names why there are no runs to plot (not a missing
    leaderboard.json); the report's schedule goes to the end of training; its curves name every member."""
    import matplotlib.axes

    directory = tmp_path / "pop"
    run_population(tiny_population(directory, backend="vectorized", size=3), show_progress=False)
    with pytest.raises(ConfigError, match="is a vectorized population: its members train as one batched run"):
        curves(directory)
    steps, labels = [], []
    original_step, original_legend = matplotlib.axes.Axes.step, matplotlib.axes.Axes.legend
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "step",
        lambda self, x, *a, **k: steps.append(list(x)) or original_step(self, x, *a, **k),
    )

    def legend(self, *args, **kwargs):
        labels.extend(self.get_legend_handles_labels()[1])
        return original_legend(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", legend)
    board = Leaderboard.load(directory)
    board.write_report()
    assert steps and all(x[-1] == 3 * STEPS for x in steps)  # the whole run, not to the last change
    assert sorted(label.split()[0] for label in labels) == sorted(board.members)


def test_vectorized_population_resumes_after_sigterm(tmp_path, monkeypatch):
    from phalanx.population import PopulationInterrupted
    from phalanx.population.orchestrator import VectorizedRun
    from phalanx.train import interrupts

    monkeypatch.setattr(interrupts._Received, "last", signal.SIGTERM)  # as its handler records it

    directory = tmp_path / "pop"
    config = tiny_population(directory, backend="vectorized", size=4, strategy="generational")
    original = VectorizedRun.select

    def select_then_interrupt(self):
        original(self)
        if self.engine.steps == 2 * STEPS:
            self.checkpoints.save(
                self.engine.steps,
                {"engine": self.engine.state_dict(), "leaderboard": json.dumps(self.board.to_dict())},
            )
            self.board.save()
            raise KeyboardInterrupt

    VectorizedRun.select = select_then_interrupt
    try:
        with pytest.raises(PopulationInterrupted, match="phalanx population resume"):
            run_population(config, show_progress=False)
    finally:
        VectorizedRun.select = original
    interrupt = [e["reason"] for e in decisions(directory) if e["event"] == "interrupt"]
    assert interrupt == [f"SIGTERM at {2 * STEPS:,} steps; resume goes on from the last interval"]
    before = {m.id: list(m.scores) for m in Leaderboard.load(directory).members.values()}
    assert all(len(scores) == 2 for scores in before.values())
    resume_population(directory, show_progress=False)
    after = Leaderboard.load(directory)
    for member, scores in before.items():
        assert after.members[member].scores[:2] == scores and len(after.members[member].scores) == 3
    # It goes on with the same random streams: what a straight run copies, scores and draws.
    config.directory = str(tmp_path / "straight")
    run_population(config, show_progress=False)
    straight = Leaderboard.load(tmp_path / "straight")
    assert [[s[:2] for s in m.scores] for m in straight.members.values()] == [
        [s[:2] for s in m.scores] for m in after.members.values()
    ]
    assert [copy["hyperparameters_after"] for copy in straight.lineage] == [
        copy["hyperparameters_after"] for copy in after.lineage
    ]


def test_vectorized_backend_refuses_what_it_cannot_batch(tmp_path):
    with pytest.raises(ConfigError, match="backend 'vectorized' trains ppo, pqn, td3, sac members"):
        tiny_population(
            tmp_path, backend="vectorized", base=make_config("ddpg", "Pendulum-v1"), mutations={}
        ).validate()
    config = tiny_population(
        tmp_path, backend="vectorized", mutations={"horizon": Mutation(choices=(16, 32))}
    )
    with pytest.raises(ConfigError, match=r"shares \['horizon'\] across its members"):
        config.validate()
