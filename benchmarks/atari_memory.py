"""Bytes per stored Atari transition in phalanx's replay buffers: (4, 84, 84) frames as float32, as uint8, in
the compact replay without a second copy of each observation, and with each stacked frame stored once.

    python benchmarks/atari_memory.py                          # envpool:Pong-v5 and Breakout-v5, 16k steps
    python benchmarks/atari_memory.py --games Pong --steps 4000 --json

Two figures per layout:

- **allocated**: the buffer's device memory (``nbytes``) over its capacity, for the Atari presets' replay
  (1M transitions, 8 sub-envs). The buffers are built on PyTorch's ``meta`` device, where tensors have
  their sizes but no memory, so that the float32 replay's 225 GB need not exist to be measured.
- **on play**: ``--steps`` env steps of each game (uniformly random actions, EnvPool's Atari preprocessing
  and episodic life) go into each uint8 layout with room for all of them: how many transitions each still
  holds at the end, its bytes per held transition, the frame rows the compact replay wrote per transition
  (one per step in a running episode, 4 more at an episode's first observation), and whether 8 batches of
  256 sampled from each (n-step 3, the same random draws) equal the plain uint8 replay's, element for
  element. The mean time of an ``add`` (one VecEnv step) and of a ``sample`` is given beside them (CPU).

The benchmark measures; it asserts nothing. Needs EnvPool (``pip install 'phalanx[envpool]'``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import add_json_option, machine_info, markdown_table, write_json  # noqa: E402

import phalanx  # noqa: E402
from phalanx.buffers import CompactReplayBuffer, ReplayBuffer, StepLayout  # noqa: E402

ATARI_SHAPE = (4, 84, 84)
LAYOUTS = ("float32 plain", "uint8 plain", "uint8 compact", "uint8 compact, frames shared")


def make_buffer(layout: str, capacity: int, num_envs: int, device: str) -> ReplayBuffer | CompactReplayBuffer:
    obs_dtype = torch.float32 if layout == "float32 plain" else torch.uint8
    step = StepLayout(ATARI_SHAPE, obs_dtype, (), torch.int64)
    if layout.endswith("plain"):
        return ReplayBuffer(capacity, num_envs, step, device)
    stacked_frames = 4 if layout.endswith("frames shared") else 1
    return CompactReplayBuffer(capacity, num_envs, step, device, stacked_frames)


def allocated(capacity: int, num_envs: int) -> list[dict[str, Any]]:
    rows = []
    for layout in LAYOUTS:
        buffer = make_buffer(layout, capacity, num_envs, "meta")
        rows.append({"layout": layout, "capacity": buffer.capacity, "bytes": buffer.nbytes})
    return rows


def played(game: str, steps: int, num_envs: int, seed: int) -> dict[str, Any]:
    """``steps`` env steps of random play into each uint8 layout: what each holds, and its samples."""
    env = phalanx.make_env(f"envpool:{game}-v5", num_envs=num_envs)
    capacity = steps  # room for every transition in each layout
    buffers = {layout: make_buffer(layout, capacity, num_envs, "cpu") for layout in LAYOUTS[1:]}
    add_seconds = dict.fromkeys(buffers, 0.0)
    generator = torch.Generator().manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    episodes = 0
    for _ in range(steps // num_envs):
        actions = torch.randint(int(env.single_action_space.n), (num_envs,), generator=generator)
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        # the VecEnv boundary presents Atari frames as float32 of whole numbers until it keeps them uint8
        transition = (
            obs.to(torch.uint8),
            actions,
            rewards,
            info["final_obs"].to(torch.uint8),
            terminated,
            truncated,
        )
        for layout, buffer in buffers.items():
            start = time.perf_counter()
            buffer.add(*transition)
            add_seconds[layout] += time.perf_counter() - start
        episodes += int((terminated | truncated).sum())
        obs = next_obs
    env.close()
    plain = buffers["uint8 plain"]
    results = []
    for layout, buffer in buffers.items():
        same, sample_seconds = True, 0.0
        for draw in range(8):
            torch.manual_seed(draw)
            expected = plain.sample(256, 0.99, 3)
            torch.manual_seed(draw)
            start = time.perf_counter()
            batch = buffer.sample(256, 0.99, 3)
            sample_seconds += time.perf_counter() - start
            same &= all(
                torch.equal(getattr(batch, name), getattr(expected, name))
                for name in ("obs", "actions", "rewards", "next_obs", "discounts")
            )
        row = {
            "layout": layout,
            "held": len(buffer),
            "bytes": buffer.nbytes,
            "bytes_per_held_transition": buffer.nbytes / len(buffer),
            "same_samples_as_uint8_plain": same,
            "add_us": 1e6 * add_seconds[layout] / (steps // num_envs),
            "sample_ms": 1e3 * sample_seconds / 8,
        }
        if isinstance(buffer, CompactReplayBuffer):
            row["rows_per_transition"] = float((buffer.head + 1).sum()) / (buffer.slots * num_envs)
        results.append(row)
    return {
        "game": game,
        "steps": steps,
        "episodes_ended": episodes,
        "capacity": capacity,
        "layouts": results,
    }


def tables(result: dict[str, Any]) -> str:
    frame = 84 * 84
    lines = [
        f"Allocated ({result['allocated'][0]['capacity']:,} transitions, {result['settings']['num_envs']} "
        "sub-envs; an 84x84 uint8 frame is 7,056 bytes):",
        "",
        markdown_table(
            ["layout", "bytes / transition", "frames / transition", "GB for the buffer", "vs float32"],
            [
                [
                    row["layout"],
                    row["bytes"] / row["capacity"],
                    row["bytes"] / row["capacity"] / frame,
                    row["bytes"] / 1e9,
                    f"{result['allocated'][0]['bytes'] / row['bytes']:.1f}x",
                ]
                for row in result["allocated"]
            ],
        ),
    ]
    for game in result["played"]:
        lines += [
            "",
            f"{game['game']}: {game['steps']:,} random-play steps, {game['episodes_ended']} episodes ended "
            f"(episodic life), capacity {game['capacity']:,}:",
            "",
            markdown_table(
                [
                    "layout",
                    "held",
                    "bytes / held transition",
                    "frame rows / transition",
                    "samples = uint8 plain",
                    "add (us)",
                    "sample 256, n=3 (ms)",
                ],
                [
                    [
                        row["layout"],
                        row["held"],
                        row["bytes_per_held_transition"],
                        row.get("rows_per_transition", "-"),
                        "yes" if row["same_samples_as_uint8_plain"] else "NO",
                        row["add_us"],
                        row["sample_ms"],
                    ]
                    for row in game["layouts"]
                ],
            ),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--games", default="Pong,Breakout", help="EnvPool Atari games (default Pong,Breakout)"
    )
    parser.add_argument(
        "--steps", type=int, default=16_000, help="env steps of play per game (default 16000)"
    )
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs (default 8, as the presets)")
    parser.add_argument(
        "--capacity",
        type=int,
        default=1_000_000,
        help="replay capacity of the allocated figures (default 1M)",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = {
        "benchmark": "atari_memory",
        "machine": machine_info(),
        "settings": {
            "steps": args.steps,
            "num_envs": args.num_envs,
            "capacity": args.capacity,
            "seed": args.seed,
        },
        "allocated": allocated(args.capacity, args.num_envs),
        "played": [
            played(game, args.steps, args.num_envs, args.seed) for game in args.games.split(",") if game
        ],
    }
    print(tables(result))
    if args.json is not None:
        print(f"\nwrote {write_json(result, args.json, 'atari_memory')}")
    return result


if __name__ == "__main__":
    main()
