"""``phalanx eval RUN_DIR``: evaluate a trained agent with its deterministic policy, print the returns
(per team and agent for a multi-agent run), and record a video of it with ``--video``.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from phalanx.agent import evaluate
from phalanx.cli.output import console
from phalanx.config import VIDEO_FORMATS
from phalanx.errors import PhalanxError
from phalanx.marl.trainer import MultiAgentEvaluation
from phalanx.train.videos import MAX_EPISODE_STEPS, check_video_format
from phalanx.video import check_recordable, record_video


def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="phalanx eval", description="Evaluate a trained agent deterministically."
    )
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--checkpoint", default="best", help="best (default), latest, or a checkpoint path")
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=None, help="seed of the evaluation episodes")
    video = parser.add_argument_group("video (written to RUN_DIR/videos/<env>_step<N>.<format>)")
    video.add_argument("--video", action="store_true", help="also record a deterministic episode")
    video.add_argument(
        "--video-format", choices=VIDEO_FORMATS, default=None, help="mp4 (default, H.264) or gif"
    )
    video.add_argument("--video-episodes", type=int, default=None, help="episodes in the video (default 1)")
    video.add_argument(
        "--video-max-steps",
        type=int,
        default=None,
        help=f"steps at most per episode (default {MAX_EPISODE_STEPS:,}, or the env's own time limit)",
    )
    video.add_argument(
        "--video-fps", type=float, default=None, help="frames per second (default: the env's own, real time)"
    )
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise PhalanxError(f"--episodes must be >= 1, got {args.episodes}.")
    video_options = (args.video_format, args.video_episodes, args.video_max_steps, args.video_fps)
    if any(option is not None for option in video_options):
        args.video = True  # a --video-* option asks for the video
    if args.video:
        counts = (("--video-episodes", args.video_episodes), ("--video-max-steps", args.video_max_steps))
        for flag, value in counts:
            if value is not None and value < 1:
                raise PhalanxError(f"{flag} must be >= 1, got {value}.")
        if args.video_fps is not None and not args.video_fps > 0:
            raise PhalanxError(f"--video-fps must be > 0, got {args.video_fps:g}.")
        check_video_format(args.video_format or "mp4")  # the encoder is there, before the evaluation runs
        check_recordable(args.run_dir, args.checkpoint)  # and the env draws, before the evaluation runs

    evaluation = evaluate(args.run_dir, args.episodes, args.checkpoint, args.device, args.seed)
    table = Table(title="deterministic evaluation", show_header=False)
    table.add_row("episodes", str(len(evaluation.returns)))
    table.add_row("return mean", f"{evaluation.mean:.3f}")
    table.add_row("return std", f"{evaluation.std:.3f}")
    table.add_row("length mean", f"{sum(evaluation.lengths) / len(evaluation.lengths):.1f}")

    if isinstance(evaluation, MultiAgentEvaluation):  # the return above is the first team's
        for name, value in evaluation.teams.items():
            table.add_row(f"team {name} return", f"{value:.3f}")
        for name, value in evaluation.agents.items():
            table.add_row(f"agent {name} return", f"{value:.3f}")
    out = Console()
    out.print(table)
    out.print(
        f"run directory: {args.run_dir} (checkpoint: {args.checkpoint})", highlight=False, soft_wrap=True
    )
    if args.video:
        path = record_video(
            args.run_dir,
            args.checkpoint,
            video_format=args.video_format or "mp4",
            episodes=args.video_episodes or 1,
            max_steps=args.video_max_steps or MAX_EPISODE_STEPS,
            fps=args.video_fps,
            seed=args.seed,
        )
        console.print(f"video: {path}", highlight=False, soft_wrap=True)
    return 0
