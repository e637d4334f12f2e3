"""The Ray backend for real: a local Ray (`ray.init(num_cpus=2)`), a killed member actor, a two-node
cluster on loopback that loses a node, an unreachable address, and the CLI.

One local Ray is shared by the tests that use it (the first one starts it through RayBackend, as
`phalanx population run --backend ray` does); the two-node cluster test disconnects from it and runs
its own head and worker node (`ray start ... --block` processes, each in its own process group), which
it tears down by process id whatever happens. Members are tiny PPO agents on CartPole-v1 (8 sub-envs,
horizon 32, a 16x16 network): one interval of 256 env steps is one PPO iteration.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is an optional extra (pip install 'phalanx[ray]'); these tests run the Ray backend"
)

from phalanx import make_config  # noqa: E402
from phalanx.agent import evaluate  # noqa: E402
from phalanx.cli import main  # noqa: E402
from phalanx.errors import ConfigError  # noqa: E402
from phalanx.population import (  # noqa: E402
    Leaderboard,
    Mutation,
    PopulationConfig,
    PopulationInterrupted,
    Resources,
    resume_population,
    run_population,
)
from phalanx.population import orchestrator as orchestrator_module  # noqa: E402
from phalanx.population.backends import RayBackend  # noqa: E402

RAY = Path(sys.executable).with_name("ray")
NUM_ENVS, HORIZON = 8, 32
ITERATION = NUM_ENVS * HORIZON  # env steps of one PPO iteration
HYPERPARAMETERS = {"horizon": HORIZON, "minibatch_size": 64, "epochs": 2, "hidden_sizes": (16, 16)}
MUTATIONS = {"learning_rate": Mutation(perturb=(0.8, 1.2), log_uniform=(1e-4, 1e-2))}


def population(directory: Path, total_steps: int, interval: int, **settings: Any) -> PopulationConfig:
    base_settings = {"log_every": 10**9, **settings.pop("base", {})}
    base = make_config(
        "ppo",
        "CartPole-v1",
        num_envs=NUM_ENVS,
        total_steps=total_steps,
        eval_every=0,
        eval_episodes=4,
        torch_threads=1,
        hyperparameters=HYPERPARAMETERS,
        **base_settings,
    )
    settings.setdefault("resources", Resources(cpus=2))
    return PopulationConfig(
        base=base,
        strategy="tournament",
        interval=interval,
        backend="ray",
        mutations=MUTATIONS,
        directory=str(directory),
        **settings,
    )


def decisions(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "decisions.jsonl").read_text().splitlines()]


def metric_steps(run_dir: Path) -> list[int]:
    with (run_dir / "metrics.csv").open() as file:
        return [int(float(row["steps"])) for row in csv.DictReader(file)]


def use_backend(monkeypatch: pytest.MonkeyPatch, cls: type, made: list[Any], **extra: Any) -> None:
    """run_population builds ``cls`` (a RayBackend subclass) for backend "ray"; it lands in ``made``."""
    real = orchestrator_module.make_backend

    def make_backend(name: str, resources: Any, address: str | None = None) -> Any:
        if name != "ray":
            return real(name, resources, address)
        backend = cls(resources, address, max(1, int(resources.cpus_per_member)), **extra)
        made.append(backend)
        return backend

    monkeypatch.setattr(orchestrator_module, "make_backend", make_backend)


@pytest.fixture(scope="module", autouse=True)
def shut_ray_down():
    """The local Ray the tests start lives as long as this module's tests; then it is shut down."""
    yield
    ray.shutdown()


# -- bad input: an unreachable address ------------------------------------------------------------
def test_unreachable_address_is_a_clear_error_before_training(tmp_path):
    directory = tmp_path / "pop"
    config = population(directory, 2 * ITERATION, ITERATION, size=2, address="127.0.0.1:1")
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1:1") as raised:
        run_population(config, show_progress=False)
    assert time.perf_counter() - started < 15, "it fails fast, not after Ray's minutes of retries"
    assert "--fallback" in str(raised.value)
    assert not directory.exists(), "nothing is created before the address is found unreachable"

    with pytest.raises(ConfigError, match="not a Ray cluster address"):
        run_population(population(directory, ITERATION, ITERATION, size=2, address="head:port"))
    assert not directory.exists()


def test_cli_unreachable_address_exits_with_the_error(tmp_path, capsys):
    directory = tmp_path / "pop"
    arguments = ["population", "run", "ppo", "CartPole-v1", "--backend", "ray", "--size", "2"]
    code = main([*arguments, "--address", "127.0.0.1:1", "--dir", str(directory)])
    assert code == 2
    assert "cannot reach the Ray cluster at --address '127.0.0.1:1'" in capsys.readouterr().err
    assert not directory.exists()


def test_unreachable_address_falls_back_to_processes_when_asked(tmp_path):
    directory = tmp_path / "pop"
    config = population(directory, 2 * ITERATION, ITERATION, size=2, address="127.0.0.1:1", fallback=True)
    with pytest.warns(UserWarning, match="--fallback: running on the process backend instead"):
        result = run_population(config, show_progress=False)
    assert result.best_member is not None and (directory / "best").is_dir()
    saved = PopulationConfig.from_yaml(directory / "population.yaml")
    assert saved.backend == "process", "the population says it ran on the process backend"
    board = Leaderboard.load(directory)
    assert all(m.status == "finished" and m.steps == 2 * ITERATION for m in board.members.values())


# -- a local Ray: the CLI, to the end -------------------------------------------------------------
def test_cli_tournament_on_local_ray_runs_to_the_end(tmp_path):
    directory = tmp_path / "pop"
    total = 6 * ITERATION
    code = main(
        [
            "population", "run", "ppo", "CartPole-v1", "--backend", "ray", "--cpus", "2",
            "--size", "4", "--interval", str(2 * ITERATION), "--dir", str(directory),
            "--mutate", "learning_rate=perturb:0.8,1.2",
            "--num-envs", str(NUM_ENVS), "--total-steps", str(total), "--eval-every", "0",
            "--eval-episodes", "4", "--log-every", str(10**9), "--torch-threads", "1",
            "--horizon", str(HORIZON), "--minibatch-size", "64", "--epochs", "2",
            "--hidden-sizes", "16", "16", "--learning-rate", "2e-3",  # not the preset's: fixed here
        ]
    )  # fmt: skip
    assert code == 0
    # RayBackend started a local Ray with resources.cpus CPUs (the members ran as its actors)
    assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 2.0
    assert PopulationConfig.from_yaml(directory / "population.yaml").backend == "ray"

    board = Leaderboard.load(directory)
    assert len(board.members) == 4
    for member in board.members.values():
        assert member.status == "finished" and member.steps == total, member
        assert [s[0] for s in member.scores] == [2 * ITERATION, 4 * ITERATION, total]
    events = decisions(directory)
    assert events[-1]["event"] == "best"
    assert any(e["event"] == "exploit" for e in events), "the tournament selected"
    for name in ("scores.csv", "lineage.csv", "best_schedule.csv", "curves.png"):
        assert (directory / "report" / name).is_file(), name
    best = json.loads((directory / "best" / "population.json").read_text())
    assert best["member"] == board.best().id
    evaluation = evaluate(directory / "best", episodes=2)  # what `phalanx eval DIR/best` runs
    assert len(evaluation.returns) == 2


# -- a member's actor killed mid-run --------------------------------------------------------------
class KillMidRun(RayBackend):
    """Kills the actor of ``victim`` once, while it trains: as soon as a checkpoint it saves in the
    middle of its interval appears (checkpoint_every is shorter than the interval). If an interval
    ends before the kill lands, it tries again on the next one."""

    victim = "m000"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.killed_after: int | None = None  # the checkpoint (steps) seen when the actor was killed

    def submit(self, task: Any) -> None:
        super().submit(task)
        if task.member == self.victim and self.killed_after is None:
            reference = list(self.pending)[-1]  # this task's result, until it is reported
            task, actor = self.pending[reference]
            threading.Thread(target=self.watch, args=(reference, task, actor), daemon=True).start()

    def watch(self, reference: Any, task: Any, actor: Any) -> None:
        checkpoints = Path(task.config["run_dir"]) / "checkpoints"

        def steps() -> list[int]:
            with contextlib.suppress(OSError):
                return [int(p.name[5:]) for p in checkpoints.glob("step_*") if p.name[5:].isdigit()]
            return []

        before = max(steps(), default=0)
        while reference in self.pending:  # else the interval ended first
            middle = [s for s in steps() if before < s < task.target]
            if middle:  # marked before the kill: the restarted task's submit must not watch it again
                self.killed_after = max(middle)
                self.ray.kill(actor)
                return
            time.sleep(0.002)


def test_killed_member_actor_restarts_from_its_checkpoint(tmp_path, monkeypatch):
    directory = tmp_path / "pop"
    interval, total = 4 * ITERATION, 12 * ITERATION
    made: list[KillMidRun] = []
    use_backend(monkeypatch, KillMidRun, made)
    base = {"checkpoint_every": ITERATION, "log_every": ITERATION}
    config = population(directory, total, interval, size=2, base=base)
    result = run_population(config, show_progress=False)
    backend = made[0]
    assert backend.killed_after is not None, "the actor was killed in the middle of an interval"

    restarts = [e for e in decisions(directory) if e["event"] == "restart"]
    assert [e["member"] for e in restarts] == ["m000"]
    assert restarts[0]["error"].startswith("the member's Ray actor died")
    assert "ray.kill" in restarts[0]["reason"] and "from its last checkpoint" in restarts[0]["reason"]
    board = Leaderboard.load(directory)
    victim = board.members["m000"]
    assert victim.restarts == 1
    assert victim.status == "finished" and victim.steps == total
    assert [s[0] for s in victim.scores] == [interval, 2 * interval, total], "no interval lost or repeated"
    # It went on from the checkpoint it had saved before the kill, not from step 0: its log's step
    # counts only grow (a member rebuilt from scratch would log its first iteration, 256 steps, again;
    # the rows the killed actor logged after its checkpoint are dropped when it goes on from there).
    logged = metric_steps(directory / "members" / "m000")
    assert logged == sorted(set(logged)) and logged[-1] == total, logged
    assert result.best_member is not None and (directory / "best").is_dir()


# -- Ctrl+C ------------------------------------------------------------------------------------------
class CtrlCMidInterval(RayBackend):
    """Ctrl+C in the orchestrator (the KeyboardInterrupt Python raises there) as soon as a member has
    logged an iteration of its first interval. Its two actors are started first, so that both members
    are under way by then (an actor takes seconds to start, an interval seconds to train)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.idle = [(self.actor_class.remote(self.threads), None) for _ in range(2)]
        ray.get([actor.__ray_ready__.remote() for actor, _ in self.idle])
        self.actors: list[Any] = []

    def wait(self, timeout: float) -> list[Any]:
        running = [task for task, _ in self.pending.values()]
        if any(metric_steps_so_far(Path(task.config["run_dir"])) for task in running):
            self.actors = [actor for _, actor in self.pending.values()]
            raise KeyboardInterrupt
        return super().wait(min(timeout, 0.05))


def metric_steps_so_far(run_dir: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return metric_steps(run_dir)
    return []


def test_ctrl_c_lets_ray_members_save_and_resume_goes_on(tmp_path, monkeypatch):
    directory = tmp_path / "pop"
    interval = total = 16 * ITERATION
    made: list[CtrlCMidInterval] = []
    use_backend(monkeypatch, CtrlCMidInterval, made)
    config = population(directory, total, interval, size=2, base={"log_every": ITERATION})
    with pytest.raises(PopulationInterrupted):
        run_population(config, show_progress=False)
    backend = made[0]
    assert len(backend.actors) == 2, "both members were under way when Ctrl+C came"
    saved = {}
    for member in ("m000", "m001"):
        run_dir = directory / "members" / member
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["interrupted"] is True, member
        saved[member] = summary["total_steps"]
        assert 0 < saved[member] < interval, f"{member} saved where Ctrl+C stopped it, mid-interval"
        assert (run_dir / "checkpoints" / f"step_{saved[member]}").is_dir()
    assert decisions(directory)[-1]["event"] == "interrupt"

    monkeypatch.undo()  # resume on the plain Ray backend
    resume_population(directory, show_progress=False)
    board = Leaderboard.load(directory)
    for member in ("m000", "m001"):
        assert board.members[member].status == "finished" and board.members[member].steps == total
        logged = metric_steps(directory / "members" / member)
        # it went on from the checkpoint saved at Ctrl+C, not from step 0 (which would log its first
        # iterations again): no step logged twice
        assert logged == sorted(set(logged)) and logged[-1] == total, logged


# -- a two-node cluster on loopback that loses a node ---------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Node:
    """`ray start ... --block` in its own process group, logging to a file."""

    def __init__(self, arguments: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [str(RAY), "start", *arguments, "--block", "--disable-usage-stats"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def descendants(self) -> list[int]:
        try:
            import psutil

            return [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]
        except Exception:  # noqa: BLE001 - gone already, or no psutil: the process group is enough
            return []

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """The node's processes: its process group, and any that left it (Ray's workers start their own)."""
        pids = self.descendants()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill(signal.SIGTERM)  # `ray start --block` stops its node's processes
            try:
                self.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.kill(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


@pytest.fixture
def two_node_cluster(tmp_path):
    """A head and a worker node of one CPU each on loopback; yields (address, worker node)."""
    ray.shutdown()  # this process leaves the local Ray of the other tests
    port = free_port()
    temp_dir = Path(f"/tmp/phx-ray-{port}")  # short: Ray's socket paths must stay under 108 characters
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k.startswith("RAY_AUTH")}
    env.update(
        # The nodes authenticate as this process does: without a token if it has not started a local
        # Ray, else (ray.init turned token authentication on for it) with the same token,
        # ~/.ray/auth_token. A driver and nodes that disagree cannot start actors.
        RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
        # a node that stops answering is declared dead in ~1.5 s instead of ~30 s
        RAY_health_check_initial_delay_ms="500",
        RAY_health_check_period_ms="500",
        RAY_health_check_timeout_ms="500",
        RAY_health_check_failure_threshold="3",
    )
    nodes: list[Node] = []
    try:
        head = Node(
            [
                f"--port={port}",
                "--head",
                "--num-cpus=1",
                "--include-dashboard=false",
                f"--temp-dir={temp_dir}",
            ],
            tmp_path / "head.log",
            env,
        )
        nodes.append(head)
        deadline = time.monotonic() + 60
        while True:
            if head.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start:\n{head.log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.2)
        address = f"127.0.0.1:{port}"
        worker = Node([f"--address={address}", "--num-cpus=1"], tmp_path / "worker.log", env)
        nodes.append(worker)
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        try:
            deadline = time.monotonic() + 60
            while sum(n["Alive"] for n in ray.nodes()) < 2:
                if worker.process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the Ray worker node did not join:\n{worker.log.read_text()[-3000:]}")
                time.sleep(0.2)
        finally:
            ray.shutdown()  # the population connects by itself, through --address
        yield address, worker
    finally:
        ray.shutdown()
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


class LoseWorkerNode(RayBackend):
    """Kills the worker node (every process of it) once two reports have come in: both nodes have run
    a member by then (one actor of one CPU on each), and most of the population is still to train."""

    def __init__(self, *args: Any, worker: Node) -> None:
        super().__init__(*args)
        self.worker = worker
        self.reports = 0
        self.node_lost_at: int | None = None

    def wait(self, timeout: float) -> list[Any]:
        reports = super().wait(timeout)
        self.reports += len(reports)
        if self.node_lost_at is None and self.reports >= 2:
            self.worker.kill()
            self.node_lost_at = self.reports
            # Ray declares the node dead within seconds (the health checks of the fixture); wait for
            # that here, so that the population cannot end before the orchestrator can see it.
            deadline = time.monotonic() + 60
            while self.seen_resources()[0] > 1 and time.monotonic() < deadline:
                time.sleep(0.1)
        return reports


def test_two_node_cluster_loses_a_node_culls_and_finishes(tmp_path, monkeypatch, two_node_cluster):
    address, worker = two_node_cluster
    directory = tmp_path / "pop"
    interval, total = 2 * ITERATION, 8 * ITERATION
    made: list[LoseWorkerNode] = []
    use_backend(monkeypatch, LoseWorkerNode, made, worker=worker)
    config = population(directory, total, interval, size=4, address=address, resources=Resources())
    result = run_population(config, show_progress=False)
    backend = made[0]
    assert backend.node_lost_at is not None, "the worker node was killed while the population ran"

    events = decisions(directory)
    culls = [e for e in events if e["event"] == "cull"]
    assert len(culls) == 1, events
    assert "the resources shrank: 1 members fit instead of 2" in culls[0]["reason"]
    board = Leaderboard.load(directory)
    culled = board.members[culls[0]["member"]]
    assert culled.status == "removed" and culled.reason == "culled: capacity 2 -> 1"
    rest = [m for m in board.members.values() if m.id != culled.id]
    assert len(rest) == 3 and all(m.status == "finished" and m.steps == total for m in rest), rest
    assert result.best_member in {m.id for m in rest} and (directory / "best").is_dir()
    assert events[-1]["event"] == "best"
