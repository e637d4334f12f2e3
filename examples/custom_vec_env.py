"""Write your own batched VecEnv, check it, register it, and train PPO on it.

A point mass on a plane must be pushed to the origin and stopped there. All ``num_envs`` sub-envs
are rows of one ``(num_envs, 4)`` state tensor, so a step is a handful of tensor operations whatever
the number of envs, on CPU or GPU.

    python examples/custom_vec_env.py                 # trains for 300k steps
    python examples/custom_vec_env.py --total-steps 20000 --device cuda

Importing this module registers ``PointMass-v0`` (and trains nothing), so the command line can use it:

    phalanx train ppo PointMass-v0 --import examples.custom_vec_env --total-steps 20000
    phalanx eval runs/PointMass-v0__ppo__...    # config.yaml names the module, eval imports it again
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

import phalanx
from phalanx.envs import BatchedVecEnv, check_vec_env, register_env


class PointMassEnv(BatchedVecEnv):
    """State (x, y, vx, vy); action: a force in [-1, 1]^2; reward: minus the distance to the origin."""

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu", max_episode_steps: int = 200):
        observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        super().__init__(num_envs, observation_space, action_space, device, max_episode_steps)
        self.state = torch.zeros(self.num_envs, 4, device=self.device)  # (N, 4), saved in checkpoints
        self.dt = 0.05

    def _reset_rows(self, mask: torch.Tensor) -> None:
        # Draw a start for every row and keep it only where mask is set: no host sync on a GPU.
        position = self.uniform(-1.0, 1.0, (self.num_envs, 2))
        fresh = torch.cat([position, torch.zeros_like(position)], dim=1)  # (N, 4)
        self.state = torch.where(mask.unsqueeze(1), fresh, self.state)

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        position, velocity = self.state[:, :2], self.state[:, 2:]
        velocity = 0.95 * velocity + self.dt * actions.clamp(-1.0, 1.0)
        position = position + self.dt * velocity
        self.state = torch.cat([position, velocity], dim=1)
        distance = position.norm(dim=1)  # (N,)
        reward = -distance - 0.01 * actions.pow(2).sum(dim=1)
        terminated = (distance < 0.05) & (velocity.norm(dim=1) < 0.05)
        return reward, terminated

    def _observe(self) -> torch.Tensor:
        return self.state.clone()


# Registered ids work everywhere an env id does: make_env, train, and the CLI with --import.
register_env("PointMass-v0", PointMassEnv, overwrite=True)


def main(argv: list[str] | None = None) -> phalanx.TrainResult:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--total-steps", type=int, default=300_000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args(argv)

    # 1. The contract checker runs the env and reports every violation, expected against actual.
    report = check_vec_env(PointMassEnv(num_envs=16, device=args.device))
    print(report)

    # 2. Train PPO with 256 parallel envs on the id registered above.
    config = phalanx.make_config(
        "ppo",
        "PointMass-v0",
        num_envs=256,
        total_steps=args.total_steps,
        device=args.device,
        run_dir=args.run_dir,
        eval_every=50_000,
        horizon=32,
        minibatch_size=2048,
        learning_rate=1e-3,
        log_std_init=-0.5,
    )
    result = phalanx.train(config)

    # 3. Deploy: the agent takes raw observations and returns actions in the env's own bounds.
    agent = phalanx.load_agent(result.run_dir)
    print("action at (0.5, -0.5) at rest:", agent.act(np.array([0.5, -0.5, 0.0, 0.0], dtype=np.float32)))
    return result


if __name__ == "__main__":
    main()
