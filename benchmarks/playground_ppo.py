r"""PPO on a MuJoCo Playground task (``playground:<EnvName>``): env steps per second and final return.

    PYTHONPATH=src python benchmarks/playground_ppo.py                       # CPU: a short run
    PYTHONPATH=src python benchmarks/playground_ppo.py --device cuda         # GPU: 4,096 envs, 60M steps
    PYTHONPATH=src python benchmarks/playground_ppo.py --env WalkerWalk --device cuda --json walker.json

One ``phalanx.train`` run of PPO on a DeepMind Control Suite task of MuJoCo Playground (MJX physics,
``phalanx.envs.playground``) with thousands of sub-envs as one batch on the device. Reported:

- ``steps_per_second``: env steps over the run's wall time (the summary's, compilation included) and
  ``steady_steps_per_second``: from the end of the first iteration (the MJX compilation and the first
  rollout) to the end of the last;
- ``final_return``: the mean return of the deterministic evaluation at the end of the run
  (``eval_episodes`` full 1,000-step episodes);
- Playground's own published Brax-PPO reference for the task (``REFERENCES``), with its source and
  hardware, printed beside.

The settings follow Playground's tuned Brax PPO config for the DM Control Suite
(``mujoco_playground/config/dm_control_suite_params.py``: discount 0.995, learning rate 1e-3, entropy
cost 1e-2, unroll length 30, 16 passes per batch, observation normalisation, 60M env steps), mapped
to phalanx's PPO: ``horizon`` is the unroll length and each rollout of ``horizon * num_envs`` samples
is cut into ``--minibatches`` minibatches per epoch. What differs: Brax scales rewards by a constant
10 where phalanx normalises them (``normalize_reward``); Brax's networks are 4 x 32 (policy) and
5 x 256 (value) swish layers where phalanx's PPO has one ``hidden_sizes`` for both (256 x 256 silu
here); and phalanx resets an ended sub-env to a fresh random state where Brax's wrapper restores the
first cached one. On a CPU, MJX compiles the task's reset and step for a minute or more before the
first step (twice: the training env and the evaluation env).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

PAPER = "MuJoCo Playground (Zakka et al., 2025), https://arxiv.org/abs/2502.08844"
# Playground's published Brax-PPO figures, per task: final episode return, training wall time and the
# hardware named. None: not yet read from the source (the report's DM Control figures); never estimated.
REFERENCES: dict[str, dict[str, Any]] = {
    name: {"source": PAPER, "return": None, "train_minutes": None, "hardware": None}
    for name in ("CartpoleBalance", "CheetahRun", "WalkerWalk", "ReacherEasy", "FingerSpin")
}
# Playground's Brax PPO settings for the DM Control Suite (dm_control_suite_params.brax_ppo_config).
PLAYGROUND_SETTINGS = {
    "total_steps": 60_000_000,
    "gamma": 0.995,
    "learning_rate": 1.0e-3,
    "entropy_coef": 1.0e-2,
    "horizon": 30,
    "epochs": 16,
}
CUDA_DEFAULTS = {"num_envs": 4_096, "total_steps": 60_000_000, "minibatches": 4, "eval_episodes": 16}
CPU_DEFAULTS = {"num_envs": 64, "total_steps": 30_720, "minibatches": 4, "eval_episodes": 4}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CheetahRun", help="a Playground DM Control task, e.g. WalkerWalk")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1")
    parser.add_argument("--num-envs", type=int, help="sub-envs (default 4,096 on CUDA, 64 on a CPU)")
    parser.add_argument("--total-steps", type=int, help="env steps (default 60M on CUDA, 30,720 on a CPU)")
    parser.add_argument("--minibatches", type=int, help="minibatches per epoch of each rollout (default 4)")
    parser.add_argument("--eval-episodes", type=int, help="final evaluation episodes (default 16 / 4)")
    parser.add_argument(
        "--impl",
        choices=("warp", "jax"),
        help="physics implementation (default: the task config's, warp; Playground's maintainers rerun the "
        "paper's DM Control figures with jax: google-deepmind/mujoco_playground issue #171)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", help="the run directory (default: a fresh one under runs/)")
    add_json_option(parser)
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: Playground's PPO settings, the device's defaults, then the flags."""
    defaults = CUDA_DEFAULTS if args.device.startswith("cuda") else CPU_DEFAULTS
    num_envs = args.num_envs or defaults["num_envs"]
    minibatches = args.minibatches or defaults["minibatches"]
    horizon = PLAYGROUND_SETTINGS["horizon"]
    rollout = horizon * num_envs
    if rollout % minibatches:
        raise SystemExit(
            f"--minibatches {minibatches} does not divide the rollout of horizon * num_envs = {horizon} * "
            f"{num_envs} = {rollout} samples; pick a divisor."
        )
    return {
        "env": f"playground:{args.env}",
        "num_envs": num_envs,
        "total_steps": args.total_steps or defaults["total_steps"],
        "eval_episodes": args.eval_episodes or defaults["eval_episodes"],
        "minibatch_size": rollout // minibatches,
        "impl": args.impl,
    }


def run(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    import torch

    import phalanx
    from phalanx.envs import register_env
    from phalanx.envs.playground import PlaygroundVecEnv

    class SteadyRate(phalanx.Hook):
        """Env steps and wall time from the end of the first iteration (compilation done) to the last."""

        def __init__(self) -> None:
            self.first: tuple[int, float] | None = None
            self.last: tuple[int, float] | None = None

        def after_iteration(self, trainer: Any) -> None:
            now = (int(trainer.steps), time.perf_counter())
            self.first = self.first or now
            self.last = now

    env_id = settings["env"]
    if settings["impl"] is not None:  # an id of its own, so that the evaluation env uses the same physics
        env_id = f"{env_id}+{settings['impl']}"
        register_env(
            env_id,
            lambda num_envs, device, **kwargs: PlaygroundVecEnv(
                args.env, num_envs, device, config_overrides={"impl": settings["impl"]}, **kwargs
            ),
            overwrite=True,
        )
    config = phalanx.make_config(
        "ppo",
        env_id,
        num_envs=settings["num_envs"],
        total_steps=settings["total_steps"],
        seed=args.seed,
        device=args.device,
        run_dir=args.run_dir,
        eval_every=0,
        eval_episodes=settings["eval_episodes"],
        normalize_obs=True,
        normalize_reward=True,
        gamma=PLAYGROUND_SETTINGS["gamma"],
        learning_rate=PLAYGROUND_SETTINGS["learning_rate"],
        entropy_coef=PLAYGROUND_SETTINGS["entropy_coef"],
        horizon=PLAYGROUND_SETTINGS["horizon"],
        epochs=PLAYGROUND_SETTINGS["epochs"],
        minibatch_size=settings["minibatch_size"],
        hidden_sizes=[256, 256],
        activation="silu",
    )
    steady = SteadyRate()
    torch.manual_seed(args.seed)
    result = phalanx.train(config, hooks=[steady])
    summary = result.summary
    steady_rate = None
    if steady.first and steady.last and steady.last[1] > steady.first[1]:
        steady_rate = (steady.last[0] - steady.first[0]) / (steady.last[1] - steady.first[1])
    return {
        "run_dir": str(result.run_dir),
        "env_steps": summary["total_steps"],
        "wall_time_s": summary["wall_time_s"],
        "steps_per_second": summary["steps_per_second"],
        "steady_steps_per_second": steady_rate,
        "final_return": summary["eval_return_mean"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    settings = plan(args)
    measured = run(args, settings)
    reference = REFERENCES.get(
        args.env, {"source": PAPER, "return": None, "train_minutes": None, "hardware": None}
    )
    result = {
        "machine": machine_info(args.device),
        "settings": settings,
        "phalanx": measured,
        "reference": reference,
    }

    def shown(value: Any, digits: int = 0) -> str:
        return "not measured" if value is None else f"{value:,.{digits}f}"

    print(
        markdown_table(
            ["", "env steps", "env steps/s (all)", "env steps/s (steady)", "final return", "hardware"],
            [
                [
                    f"phalanx PPO, {settings['num_envs']:,} envs",
                    shown(measured["env_steps"]),
                    shown(measured["steps_per_second"]),
                    shown(measured["steady_steps_per_second"]),
                    shown(measured["final_return"], 1),
                    result["machine"].get("gpu") or result["machine"].get("cpu", "this machine"),
                ],
                [
                    "Playground Brax PPO (published)",
                    shown(PLAYGROUND_SETTINGS["total_steps"]),
                    "",
                    "",
                    shown(reference["return"], 1) if reference["return"] is not None else "not recorded here",
                    reference["hardware"] or "not recorded here",
                ],
            ],
        )
    )
    print(f"Reference: {reference['source']}")
    write_json(result, args.json, "playground_ppo.json")
    return result


if __name__ == "__main__":
    main()
