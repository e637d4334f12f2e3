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
- beside them, what the MuJoCo Playground paper publishes for Brax PPO on the task (``reference``): its
  env steps per second (Table IV: env steps over the wall-clock time of 5 seeds' runs on one A100) and
  env steps (Table XII). The paper shows the returns only as curves (Figures 7 and 8), so no published
  final return is printed; on training time its text says only that most environments train "in under
  10 minutes on a single GPU device" (Section IV-A);
- a table of Playground's Brax PPO settings for the task beside the ones this run used.

The settings follow Playground's tuned Brax PPO config for the DM Control Suite (``BRAX_PPO``:
discount 0.995, 0.95 for BallInCup and FingerSpin; learning rate 1e-3; entropy cost 1e-2; unroll length
30; 16 passes per batch; observation normalisation; 60M env steps, 100M for AcrobotSwingup,
SwimmerSwimmer6 and WalkerRun), mapped to phalanx's PPO: ``horizon`` is the unroll length and each
rollout of ``horizon * num_envs`` samples is cut into ``--minibatches`` minibatches per epoch. On CUDA,
4,096 sub-envs and 4 minibatches give Brax's minibatch of 1,024 x 30 = 30,720 samples and its number
of gradient steps per env step (16 x 32 per 983,040 steps); Brax collects its 983,040 steps per
update as 16 unrolls of its 2,048 sub-envs where phalanx updates after each 30 steps of its 4,096. What
differs besides: Brax scales rewards by a constant 10 where phalanx normalises them
(``normalize_reward``); Brax's networks are 4 x 32 (policy) and 5 x 256 (value) swish layers where
phalanx's PPO has one ``hidden_sizes`` for both (256 x 256 silu here); and phalanx resets an ended
sub-env to a fresh random state where Brax's wrapper restores the first cached one. The paper's runs
predate Playground's MuJoCo Warp support and used MJX; Playground 0.2's DM Control tasks default to
Warp, and ``--impl jax`` picks MJX's JAX implementation. On a CPU, MJX compiles the task's reset and
step for a minute or more before the first step (twice: the training env and the evaluation env).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

PAPER = "MuJoCo Playground (Zakka et al., 2025), arXiv 2502.08844v1, https://arxiv.org/abs/2502.08844v1"
PLAYGROUND_COMMIT = "d5e6b47531328468da1eec33b8b304a00bb0873c"
PLAYGROUND_CONFIG = (
    f"https://github.com/google-deepmind/mujoco_playground/blob/{PLAYGROUND_COMMIT}"
    "/mujoco_playground/config/dm_control_suite_params.py"
)
BRAX_COMMIT = "03a509014c234057b64ed9a2ec1893921c8f49a9"
BRAX_NETWORKS = f"https://github.com/google/brax/blob/{BRAX_COMMIT}/brax/training/agents/ppo/networks.py"

# Playground's Brax PPO config for the DM Control Suite: ``brax_ppo_config`` in PLAYGROUND_CONFIG (these
# values unchanged since Playground's first commit; the same in playground 0.2.0 and in the paper's Table
# XII), and the networks it leaves to the defaults of Brax's ``make_ppo_networks`` (BRAX_NETWORKS; the
# same in brax 0.14.2).
BRAX_PPO: dict[str, Any] = {
    "num_envs": 2_048,
    "num_timesteps": 60_000_000,
    "unroll_length": 30,
    "batch_size": 1_024,
    "num_minibatches": 32,
    "num_updates_per_batch": 16,
    "discounting": 0.995,
    "learning_rate": 1.0e-3,
    "entropy_cost": 1.0e-2,
    "action_repeat": 1,
    "reward_scaling": 10.0,
    "normalize_observations": True,
    "policy_hidden_layer_sizes": (32, 32, 32, 32),
    "value_hidden_layer_sizes": (256, 256, 256, 256, 256),
    "activation": "swish",
}
# What ``brax_ppo_config`` changes per task, by the names Playground registers. Table XII also gives
# PendulumSwingUp an action repeat of 4 and 4 passes per batch, but the config compares the name with
# "PendulumSwingUp" where the registered task is "PendulumSwingup", so for it the config is the default.
BRAX_PPO_CHANGES: dict[str, dict[str, Any]] = {
    "AcrobotSwingup": {"num_timesteps": 100_000_000},
    "AcrobotSwingupSparse": {"num_timesteps": 100_000_000},
    "BallInCup": {"discounting": 0.95},
    "FingerSpin": {"discounting": 0.95},
    "SwimmerSwimmer6": {"num_timesteps": 100_000_000},
    "WalkerRun": {"num_timesteps": 100_000_000},
}
# The paper's Table IV (Appendix A.3): Brax PPO's env steps per second, "the number of environment steps
# divided by wallclock time" of the Appendix A.2 runs (5 seeds per task, one A100, the Table XII
# settings): the mean and its 95% confidence interval.
PPO_STEPS_PER_SECOND: dict[str, tuple[int, int]] = {
    "AcrobotSwingup": (752_092, 11_562),
    "AcrobotSwingupSparse": (750_597, 4_640),
    "BallInCup": (235_899, 565),
    "CartpoleBalance": (718_626, 6_894),
    "CartpoleBalanceSparse": (721_061, 14_135),
    "CartpoleSwingup": (728_088, 12_503),
    "CartpoleSwingupSparse": (718_355, 10_189),
    "CheetahRun": (435_162, 12_183),
    "FingerSpin": (246_791, 1_763),
    "FingerTurnEasy": (245_255, 4_561),
    "FingerTurnHard": (245_421, 4_278),
    "FishSwim": (183_750, 1_773),
    "HopperHop": (201_313, 2_833),
    "HopperStand": (201_517, 3_227),
    "HumanoidRun": (91_617, 1_019),
    "HumanoidStand": (91_927, 1_004),
    "HumanoidWalk": (91_563, 1_150),
    "PendulumSwingup": (724_126, 21_524),
    "PointMass": (730_775, 3_608),
    "ReacherEasy": (520_021, 9_637),
    "ReacherHard": (523_441, 8_012),
    "SwimmerSwimmer6": (167_259, 2_377),
    "WalkerRun": (141_581, 831),
    "WalkerStand": (140_360, 1_762),
    "WalkerWalk": (139_818, 1_267),
}
PAPER_SEEDS = 5
PAPER_HARDWARE = "one NVIDIA A100"
RETURN_NOT_PUBLISHED = (
    "the paper shows Brax PPO's returns only as curves (Figures 7 and 8: reward against env steps and "
    "against wall-clock time, 5 seeds); no table or text states a final return"
)
CUDA_DEFAULTS = {"num_envs": 4_096, "minibatches": 4, "eval_episodes": 16}
CPU_DEFAULTS = {"num_envs": 64, "total_steps": 30_720, "minibatches": 4, "eval_episodes": 4}
HIDDEN_SIZES = [256, 256]
ACTIVATION = "silu"


def brax_ppo_config(env_name: str) -> dict[str, Any]:
    """Playground's Brax PPO config for the DM Control task ``env_name``."""
    return {**BRAX_PPO, **BRAX_PPO_CHANGES.get(env_name, {})}


def reference(env_name: str) -> dict[str, Any] | None:
    """What the paper publishes for Brax PPO on ``env_name``; None for a task its Table IV lacks."""
    if env_name not in PPO_STEPS_PER_SECOND:
        return None
    steps_per_second, interval = PPO_STEPS_PER_SECOND[env_name]
    return {
        "source": f"{PAPER}: Table IV (steps per second), Table XII (settings), Figures 7-8 (returns)",
        "env": env_name,
        "env_steps": brax_ppo_config(env_name)["num_timesteps"],
        "steps_per_second": steps_per_second,
        "steps_per_second_ci95": interval,
        "seeds": PAPER_SEEDS,
        "hardware": PAPER_HARDWARE,
        "final_return": None,
        "final_return_note": RETURN_NOT_PUBLISHED,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CheetahRun", help="a Playground DM Control task, e.g. WalkerWalk")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1")
    parser.add_argument("--num-envs", type=int, help="sub-envs (default 4,096 on CUDA, 64 on a CPU)")
    parser.add_argument(
        "--total-steps",
        type=int,
        help="env steps (default: Playground's for the task on CUDA, 60M or 100M; 30,720 on a CPU)",
    )
    parser.add_argument("--minibatches", type=int, help="minibatches per epoch of each rollout (default 4)")
    parser.add_argument("--eval-episodes", type=int, help="final evaluation episodes (default 16 / 4)")
    parser.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="env steps between evaluations, for a curve (default 0: the end)",
    )
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
    """The run's settings: Playground's Brax PPO config for the task mapped to phalanx's PPO, the device's
    defaults, then the flags."""
    playground = brax_ppo_config(args.env)
    cuda = args.device.startswith("cuda")
    defaults = CUDA_DEFAULTS if cuda else CPU_DEFAULTS
    num_envs = args.num_envs or defaults["num_envs"]
    minibatches = args.minibatches or defaults["minibatches"]
    horizon = playground["unroll_length"]
    rollout = horizon * num_envs
    if rollout % minibatches:
        raise SystemExit(
            f"--minibatches {minibatches} does not divide the rollout of horizon * num_envs = {horizon} * "
            f"{num_envs} = {rollout} samples; pick a divisor."
        )
    return {
        "env": f"playground:{args.env}",
        "num_envs": num_envs,
        "total_steps": args.total_steps or (playground["num_timesteps"] if cuda else defaults["total_steps"]),
        "eval_episodes": args.eval_episodes or defaults["eval_episodes"],
        "horizon": horizon,
        "minibatches": minibatches,
        "minibatch_size": rollout // minibatches,
        "epochs": playground["num_updates_per_batch"],
        "gamma": playground["discounting"],
        "learning_rate": playground["learning_rate"],
        "entropy_coef": playground["entropy_cost"],
        "hidden_sizes": HIDDEN_SIZES,
        "activation": ACTIVATION,
        "impl": args.impl,
    }


def settings_table(env_name: str, settings: dict[str, Any]) -> str:
    """Playground's Brax PPO config for ``env_name`` beside the settings of this run, row by row."""
    playground = brax_ppo_config(env_name)
    batch_steps = playground["batch_size"] * playground["num_minibatches"] * playground["unroll_length"]

    def layers(sizes: tuple[int, ...] | list[int], activation: str) -> str:
        return " x ".join(str(size) for size in sizes) + f" {activation}"

    rows = [
        ["sub-envs", f"{playground['num_envs']:,} (num_envs)", f"{settings['num_envs']:,}"],
        ["env steps", f"{playground['num_timesteps']:,} (num_timesteps)", f"{settings['total_steps']:,}"],
        [
            "unroll (steps per sub-env, GAE window)",
            f"{playground['unroll_length']} (unroll_length)",
            f"{settings['horizon']} (horizon)",
        ],
        [
            "env steps per update",
            f"{batch_steps:,} (batch_size x num_minibatches x unroll_length)",
            f"{settings['num_envs'] * settings['horizon']:,} (num_envs x horizon)",
        ],
        [
            "minibatch, samples",
            f"{playground['batch_size'] * playground['unroll_length']:,} (batch_size x unroll_length)",
            f"{settings['minibatch_size']:,}",
        ],
        [
            "minibatches per pass",
            f"{playground['num_minibatches']} (num_minibatches)",
            str(settings["minibatches"]),
        ],
        [
            "passes per update",
            f"{playground['num_updates_per_batch']} (num_updates_per_batch)",
            str(settings["epochs"]),
        ],
        ["discount", f"{playground['discounting']} (discounting)", str(settings["gamma"])],
        ["learning rate", f"{playground['learning_rate']:g}", f"{settings['learning_rate']:g}"],
        ["entropy cost", f"{playground['entropy_cost']:g}", f"{settings['entropy_coef']:g}"],
        ["action repeat", str(playground["action_repeat"]), "the task config's"],
        ["rewards", f"scaled by {playground['reward_scaling']:g}", "normalised (normalize_reward)"],
        ["observations", "normalised", "normalised (normalize_obs)"],
        [
            "policy network",
            layers(playground["policy_hidden_layer_sizes"], playground["activation"]),
            layers(settings["hidden_sizes"], settings["activation"]),
        ],
        [
            "value network",
            layers(playground["value_hidden_layer_sizes"], playground["activation"]),
            layers(settings["hidden_sizes"], settings["activation"]),
        ],
    ]
    return markdown_table(["", "Playground Brax PPO", "this run (phalanx PPO)"], rows)


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
        eval_every=args.eval_every,
        eval_episodes=settings["eval_episodes"],
        normalize_obs=True,
        normalize_reward=True,
        gamma=settings["gamma"],
        learning_rate=settings["learning_rate"],
        entropy_coef=settings["entropy_coef"],
        horizon=settings["horizon"],
        epochs=settings["epochs"],
        minibatch_size=settings["minibatch_size"],
        hidden_sizes=settings["hidden_sizes"],
        activation=settings["activation"],
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
    published = reference(args.env)
    result = {
        "machine": machine_info(args.device),
        "settings": settings,
        "phalanx": measured,
        "reference": published,
        "playground_config": {"source": PLAYGROUND_CONFIG, **brax_ppo_config(args.env)},
    }

    def shown(value: Any, digits: int = 0) -> str:
        return "not measured" if value is None else f"{value:,.{digits}f}"

    rows = [
        [
            f"phalanx PPO, {settings['num_envs']:,} envs",
            shown(measured["env_steps"]),
            shown(measured["steps_per_second"]),
            shown(measured["steady_steps_per_second"]),
            shown(measured["final_return"], 1),
            result["machine"].get("gpu") or result["machine"].get("cpu", "this machine"),
        ]
    ]
    if published is not None:
        rows.append(
            [
                f"Playground Brax PPO (paper), {BRAX_PPO['num_envs']:,} envs",
                f"{published['env_steps']:,}",
                f"{published['steps_per_second']:,} ± {published['steps_per_second_ci95']:,} "
                f"({published['seeds']} seeds)",
                "",
                "not published (curves only)",
                published["hardware"],
            ]
        )
    header = ["", "env steps", "env steps/s (all)", "env steps/s (steady)", "final return", "hardware"]
    print(markdown_table(header, rows))
    if published is None:
        print(f"No published Brax PPO figures for {args.env} are recorded here (the paper's Table IV lists")
        print(f"{', '.join(PPO_STEPS_PER_SECOND)}).")
    else:
        print(f"Reference: {published['source']}; final return: {published['final_return_note']}.")
    print()
    print(settings_table(args.env, settings))
    print(f"Playground's config: {PLAYGROUND_CONFIG}; its networks: Brax's defaults, {BRAX_NETWORKS}")
    write_json(result, args.json, "playground_ppo.json")
    return result


if __name__ == "__main__":
    main()
