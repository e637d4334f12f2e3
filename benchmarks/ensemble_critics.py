"""An ensemble of K critics as one batched network against a Python loop of K MLPs.

Both compute the same thing (tests/test_nets.py checks the values and gradients): K critics of
(obs + action) -> Q on one minibatch, forward and backward plus an Adam step. The batched version is
one ``EnsembleMLP`` (a leading member dimension, ``torch.baddbmm``); the loop is K ``nn.Sequential``.

    python benchmarks/ensemble_critics.py                   # K = 10, 256x256, batch 256, CPU
    python benchmarks/ensemble_critics.py --members 2 --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import time

import torch
from benchlib import add_json_option, machine_info, markdown_table, write_json

from phalanx.nets import EnsembleMLP, mlp


def time_updates(step, repeats: int, warmup: int, device: torch.device) -> float:
    """Median seconds of one update over ``repeats`` timed rounds of 20 updates each."""
    for _ in range(warmup):
        step()
    rounds = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(20):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rounds.append((time.perf_counter() - start) / 20)
    rounds.sort()
    return rounds[len(rounds) // 2]


def compare(
    members: int,
    obs_dim: int,
    action_dim: int,
    hidden: list[int],
    batch_size: int,
    device: str,
    repeats: int,
    rounds: int = 3,
) -> dict[str, float]:
    """Milliseconds per update of K = ``members`` critics as a loop and as one batched network: the best
    of ``rounds`` alternating rounds of each (each round the median of ``repeats`` x 20 updates)."""
    torch_device = torch.device(device)
    torch.manual_seed(0)
    in_dim = obs_dim + action_dim
    loop = [mlp(in_dim, hidden, 1, "relu").to(torch_device) for _ in range(members)]
    batched = EnsembleMLP.from_mlps(loop).to(torch_device)
    x = torch.randn(batch_size, in_dim, device=torch_device)
    target = torch.randn(batch_size, device=torch_device)
    loop_optimizer = torch.optim.Adam([p for net in loop for p in net.parameters()], lr=1e-3)
    batched_optimizer = torch.optim.Adam(batched.parameters(), lr=1e-3)

    def loop_step() -> None:
        loss = sum((net(x).squeeze(-1) - target).pow(2).mean() for net in loop)
        loop_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        loop_optimizer.step()

    def batched_step() -> None:
        loss = (batched(x).squeeze(-1) - target).pow(2).mean(dim=1).sum()
        batched_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        batched_optimizer.step()

    # Alternate to share any drift of the machine's speed between the two.
    loop_times, batched_times = [], []
    for _ in range(rounds):
        loop_times.append(time_updates(loop_step, repeats, 5, torch_device))
        batched_times.append(time_updates(batched_step, repeats, 5, torch_device))
    loop_s, batched_s = min(loop_times), min(batched_times)
    return {
        "loop_ms_per_update": loop_s * 1e3,
        "batched_ms_per_update": batched_s * 1e3,
        "speedup": loop_s / batched_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--obs-dim", type=int, default=17)
    parser.add_argument("--action-dim", type=int, default=6)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=15)
    add_json_option(parser)
    args = parser.parse_args()
    measured = compare(
        args.members, args.obs_dim, args.action_dim, args.hidden, args.batch_size, args.device, args.repeats
    )
    loop_s, batched_s = measured["loop_ms_per_update"] / 1e3, measured["batched_ms_per_update"] / 1e3
    result = {
        "machine": machine_info(args.device),
        "settings": vars(args),
        **measured,
    }
    path = write_json(result, args.json, "ensemble_critics")
    print(
        markdown_table(
            [
                "critics",
                "hidden",
                "batch",
                "device",
                "loop ms/update",
                "batched ms/update",
                "batched speed-up",
            ],
            [
                [
                    args.members,
                    "x".join(map(str, args.hidden)),
                    args.batch_size,
                    args.device,
                    loop_s * 1e3,
                    batched_s * 1e3,
                    f"{loop_s / batched_s:.2f}x",
                ]
            ],
        )  # fmt: skip
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
