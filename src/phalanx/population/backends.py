"""Where members train: one interface, three backends.

A :class:`Task` asks a member to train up to a step target, after optionally copying another member's
agent and taking new hyperparameters; it comes back as a :class:`Report` (the new score, or the error).
A member's run directory is an ordinary phalanx run, and every task ends with a checkpoint in it, so a
member can be rebuilt anywhere from its directory: that is how a process that runs another member
next, a restarted Ray actor, and ``phalanx population resume`` all go on.

- :class:`SerialBackend`: tasks run one after another in this process (tests, debugging);
- :class:`ProcessBackend`: one process per running member (the default on one machine);
- :class:`RayBackend`: one Ray actor per running member, with fractional CPU and GPU resources; the
  population directory must be on storage every node reaches.

The orchestrator submits tasks and waits for reports; it never knows which backend runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_connections
from pathlib import Path
from typing import Any

import torch

from phalanx.config import TrainConfig
from phalanx.envs.registry import register_env
from phalanx.errors import CheckpointError, ConfigError, import_optional
from phalanx.registry import trainer_class
from phalanx.train.checkpoint import CheckpointManager, load_checkpoint
from phalanx.train.handover import adopt
from phalanx.train.interrupts import received_signal, stop_signals_interrupt, supervised
from phalanx.train.launch import available_cores, exit_when_closed
from phalanx.train.loop import TrainingInterrupted


@dataclass
class Task:
    member: str
    config: dict[str, Any]
    """The member's TrainConfig as a dict: its seed, run directory and current hyperparameters."""
    target: int
    """Train until this many env steps (the member's steps + interval)."""
    donor: str | None = None
    """Copy the agent of this checkpoint first (or, if it has been rotated away, the donor's latest)."""
    hyperparameters: dict[str, Any] | None = None
    """Hyperparameters to set first (the mutated ones)."""
    start_steps: int | None = None
    """A new member spawned from another: start its step count here."""
    envs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """{env_id: factory} of an env the caller registered (phalanx.envs.register_env), for other processes."""


@dataclass
class Report:
    member: str
    steps: int = 0
    score: float | None = None
    checkpoint: str | None = None
    error: str | None = None
    """What went wrong (with the traceback); the member's process may be gone."""
    interrupted: bool = False
    """The member saw Ctrl+C, saved a checkpoint and stopped."""
    seconds: float = 0.0


class Member:
    """Trains the members its tasks name, keeping the last one's Trainer between its tasks."""

    def __init__(self, threads: int | None = None) -> None:
        self.trainer: Any = None
        self.member: str | None = None
        self.stop_requested = threading.Event()
        """Set by :meth:`stop`; every trainer of this member stops at its next safe point on it."""
        self.rng: dict[str, Any] = {}
        """The torch RNG state the last task left (a member's own, restored when its next task runs
        here after other members', as a member rebuilt from its checkpoint restores it)."""
        if threads:
            torch.set_num_threads(threads)

    def run(self, task: Task) -> Report:
        started = time.perf_counter()
        if self.stop_requested.is_set():  # stopped before this task began: nothing to save
            return Report(task.member, interrupted=True)
        try:
            for env_id, factory in task.envs.items():
                register_env(env_id, factory, overwrite=True)
            trainer = self._trainer_for(task)
            if task.donor is not None:
                adopt(trainer, _load_donor(task.donor), task.hyperparameters, steps=task.start_steps)
            elif task.hyperparameters:
                adopt(trainer, None, task.hyperparameters)
            summary = trainer.train(total_steps=task.target).summary
            self.rng = _rng_state(trainer.device)
        except TrainingInterrupted as interrupted:
            self.close()
            return Report(
                task.member, interrupted.steps, interrupted=True, checkpoint=str(interrupted.checkpoint)
            )
        except KeyboardInterrupt:  # while the trainer was built or a checkpoint loaded: nothing to lose
            self.close()
            return Report(task.member, interrupted=True)
        except BaseException as error:  # noqa: BLE001 - reported to the orchestrator, which decides
            self.close()  # rebuilt from its last checkpoint if it is restarted
            text = "".join(traceback.format_exception(error)).rstrip()
            return Report(task.member, error=text, seconds=time.perf_counter() - started)
        return Report(
            task.member,
            steps=trainer.steps,
            score=summary["eval_return_mean"],
            checkpoint=summary["latest_checkpoint"],
            seconds=time.perf_counter() - started,
        )

    def _trainer_for(self, task: Task) -> Any:
        if self.trainer is not None and self.member == task.member:
            torch.set_rng_state(self.rng["torch"])
            if "cuda" in self.rng:
                torch.cuda.set_rng_state(self.rng["cuda"], self.trainer.device)
            return self.trainer
        self.close()
        config = TrainConfig.from_dict(task.config, where=f"member {task.member}")
        assert config.run_dir is not None, "the scheduler gives every member's task its run directory"
        run_dir = Path(config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        trainer = trainer_class(config.algo)(
            config, run_dir=run_dir, show_progress=False, stop_requested=self.stop_requested
        )
        latest = trainer.checkpoints.latest()
        if latest is not None:  # this member trained before (elsewhere, or before a crash or resume)
            try:
                trainer.load_state_dict(load_checkpoint(latest, map_location=trainer.device))
            except BaseException:
                trainer.close()
                raise
        self.trainer, self.member = trainer, task.member
        return trainer

    def stop(self) -> None:
        """Ask the task under way (from another thread) to stop where Ctrl+C would: at the training loop's
        next safe point, with a checkpoint; a task that has not begun yet does not begin."""
        self.stop_requested.set()

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
        self.trainer = self.member = None


def _rng_state(device: torch.device) -> dict[str, Any]:
    """The torch RNG state a checkpoint saves (``Trainer.shard_state``), of the CPU and ``device``."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _load_donor(checkpoint: str) -> dict[str, Any]:
    """The donor's checkpoint; if the donor has rotated it away meanwhile, its newest one."""
    path = Path(checkpoint)
    with contextlib.suppress(CheckpointError):
        return load_checkpoint(path)
    latest = CheckpointManager(path.parent.parent).latest()
    if latest is None:
        raise CheckpointError(f"the member to copy has no checkpoint left in {path.parent}.")
    return load_checkpoint(latest)


# -- serial ---------------------------------------------------------------------------------------
class SerialBackend:
    """Runs each task to its end when its report is waited for, in this process (a Trainer per member)."""

    name = "serial"

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads
        self.members: dict[str, Member] = {}
        self.queue: list[Task] = []

    def seen_resources(self) -> tuple[float, float, float | None]:
        return float(available_cores()), float(_visible_gpus()), None

    def members_held_here(self, members: int, at_once: int) -> int:
        """How many members' trainers (and replay buffers) this machine holds at once: here every member
        keeps its Trainer in this process between its tasks, all ``members`` of them."""
        return members

    def submit(self, task: Task) -> None:
        self.queue.append(task)

    def running(self) -> list[str]:
        return [task.member for task in self.queue]

    def wait(self, timeout: float) -> list[Report]:
        if not self.queue:
            return []
        task = self.queue.pop(0)
        member = self.members.setdefault(task.member, Member(self.threads))
        return [member.run(task)]

    def stop(self, member: str) -> None:
        self.queue = [task for task in self.queue if task.member != member]
        if member in self.members:
            self.members.pop(member).close()

    def close(self) -> None:
        for member in self.members.values():
            member.close()
        self.members = {}
        self.queue = []


# -- processes ------------------------------------------------------------------------------------
class ProcessBackend:
    """One process per running member. A process keeps its member's Trainer between tasks; a process
    left idle goes on with the next member that needs one (rebuilt from its directory)."""

    name = "process"

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []

    def seen_resources(self) -> tuple[float, float, float | None]:
        return float(available_cores()), float(_visible_gpus()), None

    def members_held_here(self, members: int, at_once: int) -> int:
        """How many members' trainers (and replay buffers) this machine holds at once: one per process,
        and there are as many processes as members run at once (``at_once``), each keeping its last
        member's Trainer while idle."""
        return min(members, at_once)

    def submit(self, task: Task) -> None:
        idle = [w for w in self.workers if w.task is None and w.process.is_alive()]
        worker = next((w for w in idle if w.member == task.member), idle[0] if idle else None)
        if worker is None:
            worker = _Worker(self.context, self.threads)
            self.workers.append(worker)
        worker.send(task)

    def running(self) -> list[str]:
        return [w.task.member for w in self.workers if w.task is not None]

    def wait(self, timeout: float) -> list[Report]:
        busy = {w.connection: w for w in self.workers if w.task is not None}
        if not busy:
            return []
        reports = []
        for connection in wait_for_connections(list(busy), timeout=timeout):
            worker = busy[connection]
            reports.append(worker.receive())
            if not worker.process.is_alive():
                self.workers.remove(worker)
        return reports

    def stop(self, member: str) -> None:
        for worker in [w for w in self.workers if w.task is not None and w.task.member == member]:
            worker.kill()
            self.workers.remove(worker)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []


class _Worker:
    def __init__(self, context: Any, threads: int | None) -> None:
        self.connection, child = context.Pipe()
        watched, self.watch = context.Pipe(duplex=False)  # the child ends when this end closes
        self.process = context.Process(target=_worker_main, args=(child, watched, threads), daemon=True)
        self.process.start()
        child.close()
        watched.close()
        self.task: Task | None = None
        self.member: str | None = None

    def send(self, task: Task) -> None:
        self.task, self.member = task, task.member
        self.connection.send(task)

    def receive(self) -> Report:
        task, self.task = self.task, None
        assert task is not None, "receive() follows send()"
        try:
            return self.connection.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            code = self.process.exitcode
            return Report(task.member, error=f"the member's process died (exit code {code}) while training")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()
        self.watch.close()

    def close(self) -> None:
        """Ask the process to end: a task in flight stops at its next safe point and saves a checkpoint, as
        on Ctrl+C (forwarded: a stop signal may have reached this process only); kill it if it hangs."""
        if self.task is not None and self.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.Signals[received_signal() or "SIGINT"])
        with contextlib.suppress(OSError):
            self.connection.send(None)
        self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.connection.close()
        self.watch.close()


def _worker_main(connection: Any, watched: Any, threads: int | None) -> None:
    supervised()  # a second stop signal does not abandon the save: the orchestrator ends us if it must
    stop_signals_interrupt()  # SIGTERM as Ctrl+C: between tasks it ends the process, in one it saves
    threading.Thread(target=exit_when_closed, args=(watched,), daemon=True).start()
    member = Member(threads)
    try:
        while True:
            try:
                task = connection.recv()
            except (EOFError, KeyboardInterrupt):
                break
            if task is None:
                break
            connection.send(member.run(task))
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        member.close()


# -- ray ------------------------------------------------------------------------------------------
RAY_PORTS = {"ray": 10001}
"""The default port of an address without one, by scheme (Ray client: 10001); otherwise the GCS's, 6379."""


class RayBackend:
    """One Ray actor per running member, with ``num_cpus`` and ``num_gpus`` (fractional) reserved.

    An actor holds its resources as long as it lives, so actors are pooled like the process backend's
    processes: an actor left idle runs the next member that needs one (rebuilt from its directory), and
    there are never more actors than members running at once.

    An actor that dies (its node left, it was killed, it ran out of memory) is reported as a crash;
    the orchestrator restarts the member, which a new actor rebuilds from its last checkpoint.
    """

    name = "ray"

    def __init__(self, resources: Any, address: str | None, threads: int | None = None) -> None:
        ray = import_ray()
        self.ray = ray
        # A Ray job's driver (`ray job submit`, a KubeRay RayJob) is told its cluster by RAY_ADDRESS.
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is not None and address not in ("auto", "local"):
            probe_address(address)  # ray.init would retry an address nothing answers at for minutes
        if not ray.is_initialized():
            options = {"logging_level": "ERROR", "log_to_driver": False}
            try:
                if address and address != "local":
                    ray.init(address=address, **options)
                else:  # start a local Ray ("local": even where `ray start` runs a cluster on this machine)
                    cpus = int(resources.cpus) if resources.cpus is not None else None
                    try:
                        ray.init(address=address, num_cpus=cpus, num_gpus=resources.gpus, **options)
                    except ValueError as error:
                        if "existing cluster" not in str(error):
                            raise
                        # a cluster started on this machine with `ray start`: ray.init joins it, and
                        # resources.cpus / gpus cap what the orchestrator uses of it instead
                        ray.init(**options)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise ConfigError(_ray_init_error(address, error)) from None
        # Two threads: stop() runs while run() trains (an actor runs one task at a time otherwise).
        self.actor_class = ray.remote(_RayMember).options(
            num_cpus=resources.cpus_per_member,
            num_gpus=resources.gpus_per_member,
            max_restarts=0,
            max_concurrency=2,
        )
        self.threads = threads
        self.idle: list[tuple[Any, str]] = []
        """Actors waiting for a task, with the member each trained last (it keeps that Trainer)."""
        self.pending: dict[Any, tuple[Task, Any]] = {}
        """The result reference of each task in flight -> (the task, its actor)."""
        self.starting: dict[Any, Any] = {}
        """New actors not placed and started yet (their ``__ray_ready__`` reference -> the actor)."""

    def seen_resources(self) -> tuple[float, float, float | None]:
        """The resources of the nodes alive now (a node that left no longer counts)."""
        cpus = gpus = memory = 0.0
        for node in self.ray.nodes():
            if node.get("Alive"):
                total = node.get("Resources", {})
                cpus += total.get("CPU", 0.0)
                gpus += total.get("GPU", 0.0)
                memory += total.get("memory", 0.0) / 2**30
        return cpus, gpus, memory or None

    def members_held_here(self, members: int, at_once: int) -> int:
        """None that this process can count: Ray places each actor on a node of its choosing, so each
        member's replay buffer is checked on the node it lands on, as it is allocated (a member that does
        not fit there crashes with the memory error, and is restarted or removed)."""
        return 0

    def submit(self, task: Task) -> None:
        same = [i for i, (_, member) in enumerate(self.idle) if member == task.member]
        if same:
            actor = self.idle.pop(same[0])[0]
        elif self.idle:
            actor = self.idle.pop(0)[0]
        else:
            actor = self.actor_class.remote(self.threads)
            self.starting[actor.__ray_ready__.remote()] = actor
        self.pending[actor.run.remote(task)] = (task, actor)

    def running(self) -> list[str]:
        return [task.member for task, _ in self.pending.values()]

    def wait(self, timeout: float) -> list[Report]:
        """The reports of the tasks that have ended: as soon as one has, with any others done by then."""
        if not self.pending:
            return []
        self.release_idle()
        done, rest = self.ray.wait(list(self.pending), num_returns=1, timeout=timeout)
        if done and rest:
            done += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        reports = []
        for reference in done:
            task, actor = self.pending.pop(reference)
            try:
                reports.append(self.ray.get(reference))
            except self.ray.exceptions.RayError as error:  # the actor died: its node left, or it was killed
                with contextlib.suppress(Exception):
                    self.ray.kill(actor)
                reports.append(
                    Report(task.member, error=f"the member's Ray actor died: {type(error).__name__}: {error}")
                )
            else:
                self.idle.append((actor, task.member))
        return reports

    def release_idle(self) -> None:
        """Idle actors hold resources that a new actor may be waiting for: when the cluster shrank (a
        node left) the orchestrator runs fewer members, and a member restarted on a new actor must not
        wait for ever behind the idle actor of a member that no longer runs. So while a new actor has
        not started, the idle ones (which the orchestrator had no task for) end."""
        if not self.starting:
            return
        started, _ = self.ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
        for reference in started:
            del self.starting[reference]
        if self.starting and self.idle:
            for actor, _ in self.idle:
                with contextlib.suppress(Exception):
                    self.ray.kill(actor)
            self.idle = []

    def stop(self, member: str) -> None:
        for reference, (task, actor) in list(self.pending.items()):
            if task.member == member:
                del self.pending[reference]
                with contextlib.suppress(Exception):
                    self.ray.kill(actor)

    def close(self, grace_s: float = 60.0) -> None:
        """End every actor; the members in flight first stop at their next safe point and save a checkpoint
        (as a process backend's member does on Ctrl+C), for up to ``grace_s`` seconds. A task whose
        actor has not started yet is dropped: it has nothing to save."""
        pending, starting = self.pending, self.starting
        actors = [actor for _, actor in pending.values()] + [actor for actor, _ in self.idle]
        self.pending, self.idle, self.starting = {}, [], {}
        try:
            ready = self.ray.wait(list(starting), num_returns=len(starting), timeout=0)[0] if starting else []
            waiting = [actor for reference, actor in starting.items() if reference not in ready]
            started = [r for r, (_, actor) in pending.items() if not any(actor is a for a in waiting)]
            for reference in started:
                pending[reference][1].stop.remote()
            if started:
                self.ray.wait(started, num_returns=len(started), timeout=grace_s)
        finally:  # also when a second Ctrl+C cuts the wait short
            for actor in actors:
                with contextlib.suppress(Exception):
                    self.ray.kill(actor)


class _RayMember:
    """The Ray actor: a Member."""

    def __init__(self, threads: int | None) -> None:
        self.member = Member(threads)

    def run(self, task: Task) -> Report:
        return self.member.run(task)

    def stop(self) -> None:
        self.member.stop()

    def pid(self) -> int:
        return os.getpid()


def probe_address(address: str, timeout: float = 5.0) -> None:
    """Raise a ConfigError unless something answers at ``address`` (HOST:PORT, or ray://HOST:PORT)."""
    scheme, _, rest = address.rpartition("://")
    rest = rest.rstrip("/")
    host, colon, port_text = rest.rpartition(":")
    if not colon or "]" in port_text:  # no port (an IPv6 address is written [::1]:6379)
        host, port_text = rest, str(RAY_PORTS.get(scheme, 6379))
    host = host.strip("[]")
    if not host or not port_text.isdigit():
        raise ConfigError(
            f"--address {address!r} is not a Ray cluster address: give HOST:PORT, e.g. 10.0.0.5:6379 "
            "(the address `ray start --head` prints), or ray://HOST:10001 for Ray Client."
        )
    try:
        socket.create_connection((host, int(port_text)), timeout=timeout).close()
    except OSError as error:
        raise ConfigError(
            f"cannot reach the Ray cluster at --address {address!r}: nothing answers at {host}:{port_text} "
            f"({error.strerror or error}). Check the address (`ray status` on the head node prints it) and "
            "that the head node is up and its port open, or pass --fallback to run on the process backend "
            "instead."
        ) from None


def _ray_init_error(address: str | None, error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if address in (None, "local"):
        return f"cannot start a local Ray: {first}."
    cause = f"{type(error.__cause__).__name__}: {error.__cause__}" if error.__cause__ is not None else ""
    if "AuthenticationError" in cause or "InvalidAuthToken" in f"{cause} {error}":
        return (
            f"cannot connect to the Ray cluster at --address {address!r}: the cluster requires token "
            "authentication. Set RAY_AUTH_MODE=token and give this machine the cluster's token "
            "(RAY_AUTH_TOKEN, or the file ~/.ray/auth_token as on the head node)."
        )
    return (
        f"cannot reach the Ray cluster at --address {address!r}: {first}. Check the address (`ray status` "
        "on the head node prints it), or pass --fallback to run on the process backend instead."
    )


def import_ray() -> Any:
    return import_optional(
        "ray",
        ConfigError,
        "backend 'ray' needs Ray, which is an optional extra: pip install 'phalanx[ray]' "
        "(or choose --backend process).",
    )


def _visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def make_backend(name: str, resources: Any, address: str | None = None) -> Any:
    threads = max(1, int(resources.cpus_per_member))
    if name == "serial":
        return SerialBackend(threads)
    if name == "process":
        return ProcessBackend(threads)
    if name == "ray":
        return RayBackend(resources, address, threads)
    raise ConfigError(f"backend {name!r} does not run members one by one; choose serial, process or ray.")
