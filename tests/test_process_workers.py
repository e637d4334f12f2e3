"""ProcessVecEnv: the same results as the in-process adapter, faults survived, no process left behind."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import descendants
from fault_envs import FaultyEnv, OldApiEnv, different_spaces

from phalanx import make_config, train
from phalanx.envs import make_env
from phalanx.envs.check import check_vec_env
from phalanx.envs.core import ConcatVecEnv
from phalanx.envs.workers import GymnasiumVecEnv, ProcessVecEnv
from phalanx.errors import ConfigError, EnvError

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def rollout(env, actions):
    obs, _ = env.reset(seed=11)
    steps = [(obs,)]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append(
            (
                obs,
                reward,
                terminated,
                truncated,
                info["final_obs"],
                info["_final_obs"],
                info["episode_return"],
                info["episode_length"],
            )
        )
    return steps


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1"])
def test_identical_to_the_in_process_adapter(env_id):
    n = 6
    reference = GymnasiumVecEnv(env_id, num_envs=n)
    env = ProcessVecEnv(env_id, num_envs=n, num_workers=3)
    space = reference.action_space
    space.seed(0)
    actions = [torch.as_tensor(space.sample()) for _ in range(260)]
    try:
        expected, got = rollout(reference, actions), rollout(env, actions)
        ended = 0
        for step_expected, step_got in zip(expected, got, strict=True):
            for a, b in zip(step_expected, step_got, strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b)
            ended += int(step_got[-3].sum()) if len(step_got) > 1 else 0
        assert ended >= n  # autoresets were exercised
    finally:
        env.close()
        reference.close()


def test_conforms_to_the_contract_and_seeds_distinct_reproducible_streams():
    env = ProcessVecEnv("CartPole-v1", num_envs=4, num_workers=2)
    try:
        report = check_vec_env(env, num_steps=200)
        assert report.episodes >= 4
        first, _ = env.reset(seed=5)
        assert len({tuple(row.tolist()) for row in first}) == 4  # every sub-env has its own stream
        again, _ = env.reset(seed=5)
        assert torch.equal(first, again)
        assert not torch.equal(first, env.reset(seed=6)[0])
    finally:
        env.close()


def test_make_env_and_bad_arguments():
    env = make_env("gym:CartPole-v1", num_envs=4, num_workers=2, seed=0)
    try:
        assert isinstance(env, ProcessVecEnv) and env.num_workers == 2
    finally:
        env.close()
    with pytest.raises(EnvError, match=r"num_envs=5 is not divisible by num_workers=2.*num_envs=4 or 6"):
        ProcessVecEnv("CartPole-v1", num_envs=5, num_workers=2)
    with pytest.raises(EnvError, match="num_workers must be an integer >= 1"):
        ProcessVecEnv("CartPole-v1", num_envs=4, num_workers=0)
    with pytest.raises(EnvError, match=r"applies to Gymnasium environments only.*'gym:CartPole-v1'"):
        make_env("CartPole-v1", num_envs=4, num_workers=2)
    with pytest.raises(EnvError, match="Unknown environment id 'CartPoel-v1'.*CartPole-v1"):
        make_env("CartPoel-v1", num_envs=4, num_workers=2)
    with pytest.raises(EnvError, match="old gym API"):
        ProcessVecEnv(OldApiEnv, num_envs=2, num_workers=2).step(torch.zeros(2, dtype=torch.int64))


def test_sub_envs_with_different_spaces_are_rejected():
    with pytest.raises(EnvError, match=r"sub-env \d of 'different_spaces' has observation space .* expected"):
        ProcessVecEnv(different_spaces, num_envs=4, num_workers=2)


def run_until_fault(env, steps=5):
    env.reset(seed=0)
    actions = torch.zeros(env.num_envs, dtype=torch.int64)
    results = [env.step(actions) for _ in range(steps)]
    return results


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_a_failing_worker_is_restarted_and_its_episodes_truncated(tmp_path, mode):
    flag = tmp_path / "flag"
    env = ProcessVecEnv(FaultyEnv, num_envs=4, num_workers=2, flag=str(flag), mode=mode)
    try:
        env.reset(seed=0)
        actions = torch.zeros(4, dtype=torch.int64)
        before, *_ = env.step(actions)
        old_pids = env.pids
        flag.touch()
        with pytest.warns(RuntimeWarning, match=r"worker \d \(pid \d+, sub-envs \d\.\.\d\) failed"):
            obs, reward, terminated, truncated, info = env.step(actions)
        broken = truncated.nonzero().flatten().tolist()
        assert broken in ([0, 1], [2, 3])  # exactly one worker's sub-envs
        assert torch.equal(info["final_obs"][broken], before[broken])  # ended at their last observation
        assert reward[broken].eq(0).all() and not terminated.any()
        assert sum(env.restarts) == 1 and env.pids != old_pids and len(env.pids) == 2
        for _ in range(30):  # and the run goes on
            obs, *_ = env.step(actions)
        assert torch.isfinite(obs).all()
    finally:
        env.close()


def test_a_worker_dying_while_the_other_is_still_stepping(tmp_path):
    # Only the last worker to finish a step tells the main process; when a worker dies first, the
    # survivor (slowed down here) must still complete the step, and the next steps must be unaffected.
    flag = tmp_path / "flag"
    env = ProcessVecEnv(FaultyEnv, num_envs=4, num_workers=2, flag=str(flag), mode="exit", delay=0.05)
    try:
        env.reset(seed=0)
        actions = torch.zeros(4, dtype=torch.int64)
        flag.touch()
        with pytest.warns(RuntimeWarning, match="died"):
            *_, truncated, _ = env.step(actions)
        assert truncated.sum() == 2 and sum(env.restarts) == 1
        for step in range(3):
            obs, reward, _, truncated, _ = env.step(actions)
            assert reward.eq(1).all() and not truncated.any(), step
    finally:
        env.close()


def test_a_hung_worker_is_detected_within_the_timeout(tmp_path):
    flag = tmp_path / "flag"
    env = ProcessVecEnv(FaultyEnv, num_envs=2, num_workers=2, flag=str(flag), mode="hang", step_timeout=1.0)
    try:
        env.reset(seed=0)
        flag.touch()
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="hung"):
            env.step(torch.zeros(2, dtype=torch.int64))
        assert time.monotonic() - start < 5.0
    finally:
        env.close()


def test_past_max_restarts_the_error_names_env_worker_and_cause(tmp_path):
    flag = tmp_path / "flag"
    env = ProcessVecEnv(FaultyEnv, num_envs=2, num_workers=1, flag=str(flag), once=False, max_restarts=1)
    env.reset(seed=0)
    pids = env.pids
    flag.touch()
    with pytest.warns(RuntimeWarning), pytest.raises(EnvError) as error:
        env.step(torch.zeros(2, dtype=torch.int64))
        env.step(torch.zeros(2, dtype=torch.int64))
    message = str(error.value)
    assert "'FaultyEnv'" in message and "worker 0" in message and "sub-envs 0..1" in message
    assert "after 1 restarts" in message and "RuntimeError: injected fault" in message
    assert env.closed and wait_gone(pids) == []


@linux_only
def test_close_and_garbage_collection_leave_no_process():
    env = ProcessVecEnv("CartPole-v1", num_envs=2, num_workers=2)
    pids = env.pids
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    env.close()
    assert wait_gone(pids) == []
    env = ProcessVecEnv("CartPole-v1", num_envs=2, num_workers=2)
    pids = env.pids
    del env
    gc.collect()
    assert wait_gone(pids) == []


@linux_only
def test_workers_exit_when_the_main_process_is_killed(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time
        from phalanx.envs.workers import ProcessVecEnv
        if __name__ == "__main__":
            env = ProcessVecEnv("CartPole-v1", num_envs=2, num_workers=2)
            print(" ".join(map(str, env.pids)), flush=True)
            time.sleep(600)
        """
    )
    path = tmp_path / "main.py"
    path.write_text(script)
    process = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    pids = [int(pid) for pid in process.stdout.readline().split()]
    tree = descendants(process.pid)
    assert set(pids) <= set(tree)
    process.kill()
    process.wait()
    assert wait_gone(tree) == []


def ignore_sigint() -> None:
    """A child's SIGINT ignored, as a background job (`cmd &`) of a non-interactive shell inherits it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@linux_only
@pytest.mark.parametrize(
    ("stop", "sigint_ignored"),
    [(signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["ctrl-c", "sigterm-from-a-background-job"],
)
def test_a_stop_signal_during_training_saves_and_leaves_no_process(tmp_path, stop, sigint_ignored):
    """Ctrl+C, and SIGTERM (kill, Slurm, docker stop) to a run started in the background of a script,
    which ignores SIGINT: both save a checkpoint, say so in summary.json, exit 128 + the signal's number
    and end the worker processes and the evaluation process."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "phalanx.cli",
        "train",
        "ppo",
        "gym:CartPole-v1",
        "--num-envs",
        "4",
        "--num-workers",
        "2",
        "--total-steps",
        "10000000",
        "--run-dir",
        str(run_dir),
        "--eval-every",
        "2048",
        "--eval-process",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignore_sigint if sigint_ignored else None,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (run_dir / "metrics.csv").exists():  # training has begun
        time.sleep(0.2)
    time.sleep(1.0)
    tree = descendants(process.pid)
    assert len(tree) >= 3  # the workers, the evaluation process (and the forkserver they came from)
    if sigint_ignored:  # as the shell made it: a Ctrl+C meant for the script's foreground passes it by
        process.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert process.poll() is None
    process.send_signal(stop)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + stop, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == stop.name, summary
    assert (run_dir / "checkpoints" / f"step_{summary['total_steps']}").is_dir(), output
    assert wait_gone(tree) == [], output


# -- double buffering --------------------------------------------------------------------------------
def test_split_halves_step_like_the_whole_env():
    n = 8
    reference = GymnasiumVecEnv("CartPole-v1", num_envs=n)
    env = ConcatVecEnv(ProcessVecEnv("CartPole-v1", num_envs=n, num_workers=2).split())
    try:
        check_vec_env(env, num_steps=50)
        space = reference.action_space
        space.seed(1)
        actions = [torch.as_tensor(space.sample()) for _ in range(150)]
        for step_expected, step_got in zip(rollout(reference, actions), rollout(env, actions), strict=True):
            for a, b in zip(step_expected, step_got, strict=True):
                assert torch.equal(a, b)
        first, second = env.parts
        first.step_async(torch.zeros(4, dtype=torch.int64))
        second.step_async(torch.zeros(4, dtype=torch.int64))
        with pytest.raises(EnvError, match="wait for the steps in the order they started"):
            second.step_wait()
        first.step_wait(), second.step_wait()
        second.step_async(torch.zeros(4, dtype=torch.int64))  # a reset of one half with the other in flight
        reset_obs, _ = first.reset(seed=3)
        second.step_wait()
        assert torch.equal(reset_obs, GymnasiumVecEnv("CartPole-v1", num_envs=4).reset(seed=3)[0])
        with pytest.raises(EnvError, match="no step in flight"):
            first.step_wait()
        with pytest.raises(EnvError, match="split in two halves"):
            first.parent.step(torch.zeros(n, dtype=torch.int64))
    finally:
        env.close()
        reference.close()
    with pytest.raises(EnvError, match="even number of sub-envs"):
        ProcessVecEnv("CartPole-v1", num_envs=6, num_workers=2).split()


def test_a_worker_dying_with_both_halves_in_flight(tmp_path):
    flag = tmp_path / "flag"
    env = ConcatVecEnv(
        ProcessVecEnv(FaultyEnv, num_envs=4, num_workers=1, flag=str(flag), mode="exit").split()
    )
    try:
        env.reset(seed=0)
        first, second = env.parts
        actions = torch.zeros(2, dtype=torch.int64)
        flag.touch()
        first.step_async(actions)
        second.step_async(actions)
        with pytest.warns(RuntimeWarning, match="worker 0"):
            results = [first.step_wait(), second.step_wait()]
        assert all(bool(result[3].all()) for result in results)  # every episode of the worker truncated
        for _ in range(25):
            obs, *_ = env.step(torch.zeros(4, dtype=torch.int64))
        assert torch.isfinite(obs).all() and env.parts[0].parent.restarts == [1]
    finally:
        env.close()


@pytest.mark.parametrize(("algo", "env_id"), [("ppo", "gym:CartPole-v1"), ("sac", "gym:Pendulum-v1")])
def test_training_with_overlap(tmp_path, algo, env_id):
    overrides = (
        {"learning_starts": 64, "batch_size": 32} if algo == "sac" else {"horizon": 16, "minibatch_size": 32}
    )
    config = make_config(
        algo,
        env_id,
        num_envs=4,
        num_workers=2,
        overlap=True,
        total_steps=256,
        eval_every=0,
        eval_episodes=2,
        normalize_obs=True,
        normalize_reward=True,
        run_dir=str(tmp_path / "run"),
        **overrides,
    )
    result = train(config, show_progress=False)
    assert result.summary["total_steps"] >= 256 and result.summary["eval_return_mean"] is not None


def test_overlap_needs_worker_processes(tmp_path):
    with pytest.raises(ConfigError, match="num_workers"):
        make_config("ppo", "gym:CartPole-v1", overlap=True, num_envs=4).validate()
    with pytest.raises(ConfigError, match="even multiple of num_workers=2"):
        make_config("ppo", "gym:CartPole-v1", overlap=True, num_envs=6, num_workers=2).validate()
    with pytest.raises(EnvError, match="applies to Gymnasium environments only"):
        train(
            make_config(
                "ppo", "CartPole-v1", overlap=True, num_envs=64, num_workers=2, run_dir=str(tmp_path / "run")
            ),
            show_progress=False,
        )


def test_a_script_without_main_guard_is_told_the_fix(tmp_path):
    """Worker processes (forkserver/spawn) import the script that started them: without a __main__
    guard it builds the env again inside each worker, which dies at start. The error says why and how."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            """
            from phalanx.envs import make_env
            env = make_env("gym:CartPole-v1", num_envs=2, num_workers=1)
            env.close()
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode != 0
    assert "died during start (exit code 1)" in result.stderr
    assert 'under `if __name__ == "__main__":`' in result.stderr
    assert "unguarded.py" in result.stderr.split("died during start")[-1]
