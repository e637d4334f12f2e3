"""Published MuJoCo returns that phalanx's PPO, SAC and TD3 presets are compared with (mujoco_returns.py).

Every figure names its source (a URL at a fixed commit where one exists), the env version it was
measured on (CleanRL: Gymnasium MuJoCo v4; RL Zoo: gym v3; the TD3 paper: gym v1; phalanx trains on v5,
whose tasks are the same up to the fixes Gymnasium lists for v5), the env steps it was taken at, the
number of seeds, and what kind of return it is:

- ``training``: the episodic return of the training episodes (the stochastic or noisy policy, with the
  weights changing during the episode) near the end of training, as CleanRL reports;
- ``evaluation``: the deterministic policy evaluated apart, as RL Zoo and the TD3 paper report (and
  phalanx's ``eval_return_mean``).

The issue asks for PPO at 1M env steps and SAC/TD3 at 300k (1M where a GPU is lent). A figure at another
budget is listed with its own budget and is never presented as the figure at the budget asked; where no
source gives a figure at a budget, there is no row for it (see ``MISSING``). No number here is
invented: each was copied from the source named, or computed (TD3 paper, see its rows) from the learning
curves the authors published.
"""

from __future__ import annotations

from dataclasses import dataclass

CLEANRL_COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"
CLEANRL_TABLES = f"https://github.com/vwxyzjn/cleanrl/blob/{CLEANRL_COMMIT}/docs/benchmark"
ZOO_COMMIT = "22e3ff2450fd92033f7f032915e1f64894a09584"
ZOO_BENCHMARK = f"https://github.com/DLR-RM/rl-baselines3-zoo/blob/{ZOO_COMMIT}/benchmark.md"
TD3_COMMIT = "34770ccdcb51df6f6c7d85c1ba7e40d71b940d16"
TD3_CURVES = f"https://github.com/sfujim/TD3/tree/{TD3_COMMIT}/learning_curves"


@dataclass(frozen=True)
class Reference:
    """One published return: ``mean`` ± ``std`` over ``seeds`` runs of ``algo`` on ``source_env``, at
    ``steps`` env steps; ``env`` is the phalanx (v5) id it is compared with."""

    source: str
    algo: str
    env: str
    source_env: str
    steps: int
    mean: float
    std: float
    seeds: int
    kind: str
    """``training`` or ``evaluation`` (module docstring)."""
    url: str
    note: str = ""

    def label(self) -> str:
        """``CleanRL (HalfCheetah-v4, 1M steps, training return)``: source, env version, budget, kind."""
        return f"{self.source} ({self.source_env}, {steps_text(self.steps)} steps, {self.kind} return)"


def steps_text(steps: int) -> str:
    """300k, 1M, 2M, 1.5M; 342k for 342,016 (three significant digits)."""
    return f"{steps / 1e6:.3g}M" if steps >= 1_000_000 else f"{steps / 1e3:.3g}k"


CLEANRL_NOTE = (
    "openrlbenchmark's end-of-training figure (tag pr-424) of CleanRL's script at its defaults, mean ± "
    "std over 3 seeds; the training episodes' return"
)
ZOO_NOTE = (
    "RL Zoo's trained agent (one run, RL Zoo's own hyperparameters for the algo and env) evaluated "
    "deterministically over ~150k steps; ± is the std over those evaluation episodes, not over seeds"
)
TD3_NOTE = (
    "computed from the TD3 paper's published learning curves (10 seeds, deterministic evaluation of 10 "
    "episodes every 5,000 steps; evaluation k at k x 5,000 steps): mean ± std (ddof 0) over the seeds "
    "of the evaluation at this step"
)


def _cleanrl(algo: str, script: str, env: str, mean: float, std: float) -> Reference:
    return Reference(
        "CleanRL",
        algo,
        f"{env}-v5",
        f"{env}-v4",
        1_000_000,
        mean,
        std,
        3,
        "training",
        f"{CLEANRL_TABLES}/{script}.md",
        CLEANRL_NOTE,
    )


def _zoo(algo: str, env: str, mean: float, std: float, steps: int = 1_000_000) -> Reference:
    return Reference(
        "RL Zoo (SB3)",
        algo,
        f"{env}-v5",
        f"{env}-v3",
        steps,
        mean,
        std,
        1,
        "evaluation",
        ZOO_BENCHMARK,
        ZOO_NOTE,
    )


def _td3_paper(env: str, steps: int, mean: float, std: float) -> Reference:
    folder = "Walker" if env == "Walker2d" else env
    return Reference(
        "TD3 paper (Fujimoto et al., 2018)",
        "td3",
        f"{env}-v5",
        f"{env}-v1",
        steps,
        mean,
        std,
        10,
        "evaluation",
        f"{TD3_CURVES}/{folder}",
        TD3_NOTE,
    )


REFERENCES: tuple[Reference, ...] = (
    # CleanRL ppo_continuous_action.py: docs/benchmark/ppo_continuous_action.md (1M steps, its default).
    _cleanrl("ppo", "ppo_continuous_action", "HalfCheetah", 1442.64, 46.03),
    _cleanrl("ppo", "ppo_continuous_action", "Walker2d", 2287.95, 571.78),
    _cleanrl("ppo", "ppo_continuous_action", "Hopper", 2382.86, 271.74),
    _cleanrl("ppo", "ppo_continuous_action", "Humanoid", 716.11, 49.08),
    # CleanRL sac_continuous_action.py: docs/benchmark/sac.md (1M steps, its default).
    _cleanrl("sac", "sac", "HalfCheetah", 9634.89, 1423.73),
    _cleanrl("sac", "sac", "Walker2d", 3591.45, 911.33),
    _cleanrl("sac", "sac", "Hopper", 2310.46, 342.82),
    _cleanrl("sac", "sac", "Humanoid", 4996.29, 686.40),
    # CleanRL td3_continuous_action.py: docs/benchmark/td3.md (1M steps, its default).
    _cleanrl("td3", "td3", "HalfCheetah", 9583.22, 126.09),
    _cleanrl("td3", "td3", "Walker2d", 4057.59, 658.78),
    _cleanrl("td3", "td3", "Hopper", 3134.61, 360.18),
    _cleanrl("td3", "td3", "Humanoid", 5035.36, 21.67),
    # RL Zoo benchmark.md (SB3, gym v3 ids; n_timesteps 1M, Humanoid 2M).
    _zoo("ppo", "HalfCheetah", 5819.099, 663.530),
    _zoo("ppo", "Hopper", 2410.435, 10.026),
    _zoo("ppo", "Walker2d", 3478.798, 821.708),
    _zoo("ppo", "Ant", 1327.158, 451.577),
    _zoo("sac", "HalfCheetah", 9535.451, 100.470),
    _zoo("sac", "Hopper", 2325.547, 1129.676),
    _zoo("sac", "Walker2d", 3863.203, 254.347),
    _zoo("sac", "Ant", 4615.791, 1354.111),
    _zoo("sac", "Humanoid", 6232.287, 279.885, steps=2_000_000),
    _zoo("td3", "HalfCheetah", 9655.666, 969.916),
    _zoo("td3", "Hopper", 3606.390, 4.027),
    _zoo("td3", "Walker2d", 4717.823, 46.303),
    _zoo("td3", "Ant", 5813.274, 589.773),
    _zoo("td3", "Humanoid", 5566.687, 14.544, steps=2_000_000),
    # The TD3 paper's curves (sfujim/TD3 learning_curves/<Env>/TD3_<Env>-v1_<seed>.npy, seeds 0..9):
    # evaluation 60 (300k steps) and 200 (1M steps).
    _td3_paper("HalfCheetah", 300_000, 7697.1, 727.4),
    _td3_paper("HalfCheetah", 1_000_000, 9566.6, 832.9),
    _td3_paper("Hopper", 300_000, 2410.3, 900.4),
    _td3_paper("Hopper", 1_000_000, 3390.8, 377.8),
    _td3_paper("Walker2d", 300_000, 3335.5, 956.8),
    _td3_paper("Walker2d", 1_000_000, 4412.9, 1030.1),
    _td3_paper("Ant", 300_000, 1953.5, 1013.9),
    _td3_paper("Ant", 1_000_000, 4242.5, 1098.4),
)

MISSING: tuple[str, ...] = (
    "CleanRL Ant-v4 (PPO, SAC, TD3): CleanRL's MuJoCo benchmark runs HalfCheetah, Walker2d, Hopper, "
    "InvertedPendulum, Humanoid and Pusher, not Ant.",
    "SAC at 300k steps: none of the sources tabulates it (CleanRL and RL Zoo report the end of 1M-step "
    "runs; CleanRL's learning curves are images). The SAC rows are at 1M, labelled so.",
    "RL Zoo PPO Humanoid: not in RL Zoo's benchmark table.",
)
"""Cells no source fills, and why."""


def references(algo: str, env: str) -> list[Reference]:
    """The references for ``algo`` on the phalanx id ``env``, by budget then source."""
    found = [r for r in REFERENCES if r.algo == algo and r.env == env]
    return sorted(found, key=lambda r: (r.steps, r.source))
