"""Gymnasium's classic-control tasks as batched torch simulators.

Each class reproduces the physics, rewards, termination, initial-state distribution, spaces and time
limit of the Gymnasium 1.4 reference (``gymnasium.envs.classic_control``) for ``num_envs`` copies at
once, as tensor operations on one device: no Python loop over sub-envs, no host synchronisation.
``self.state`` has exactly the layout of the reference's ``env.unwrapped.state``, one row per
sub-env.

Precision: Gymnasium computes in float64 NumPy; the physics here runs in ``dtype``. CartPole and
MountainCarContinuous default to float32, which tracks the reference within ~2e-5 over whole
random-action episodes (the reference itself stores MountainCar's state in float32). Pendulum and
Acrobot are chaotic: float32 rounding grows to 1e-4 within ~50 steps and to 1e-2..O(1) within an
episode, and an Acrobot RK4 step at high joint speeds amplifies rounding ~1e4-fold by itself. They
default to float64 (float32 on MPS, which has no float64), in the reference's operation order:
Pendulum then matches it over whole episodes, Acrobot over whole random-action episodes and ~150
steps of vigorous swinging, beyond which the reference diverges even from itself perturbed by one
ulp. Pass ``dtype`` to choose either way; observations and rewards are float32 regardless.

Autoreset, truncation, episode statistics, seeding and checkpointing come from
:class:`~phalanx.envs.core.BatchedVecEnv`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from gymnasium import spaces

from phalanx.envs.core import BatchedVecEnv, Tensor
from phalanx.envs.observation_wrappers import MaskVelocity


class _ClassicEnv(BatchedVecEnv):
    """Shared plumbing: the physics dtype and the initial-state sampler."""

    gymnasium_id: str = ""
    default_dtype: torch.dtype = torch.float32

    def __init__(
        self,
        num_envs: int,
        observation_space: spaces.Box,
        action_space: spaces.Space,
        state_dim: int,
        device: str | torch.device,
        max_episode_steps: int | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__(num_envs, observation_space, action_space, device, max_episode_steps)
        if dtype is None:
            dtype = torch.float32 if self.device.type == "mps" else self.default_dtype
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(
                f"{type(self).__name__}: dtype must be torch.float32 or torch.float64, got {dtype}."
            )
        self.dtype = dtype
        self.state = torch.zeros(self.num_envs, state_dim, dtype=dtype, device=self.device)  # (N, d)

    def _sample(self, low: float, high: float, size: tuple[int, ...]) -> Tensor:
        """Uniform samples in ``[low, high)`` in the physics dtype."""
        return self.uniform(low, high, size).to(self.dtype)

    def _set_rows(self, mask: Tensor, new_state: Tensor) -> None:
        """``state[mask] = new_state[mask]`` without a host sync.  mask: (N,), new_state: (N, d)."""
        self.state = torch.where(mask.unsqueeze(-1), new_state, self.state)


class CartPoleEnv(_ClassicEnv):
    """CartPole-v1: balance a pole on a cart by pushing it left (0) or right (1).

    State ``(x, x_dot, theta, theta_dot)``; the observation is the state. Euler integration with
    ``tau = 0.02``. Terminates when ``|x| > 2.4`` or ``|theta| > 12 deg``. Reward 1.0 on every step,
    the terminating one included (Gymnasium gives 0.0 only for steps *after* termination, which
    autoreset never takes). With ``sutton_barto_reward=True``: 0.0 per step and -1.0 on termination.
    """

    gymnasium_id = "CartPole-v1"

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02  # seconds between state updates
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = 500,
        dtype: torch.dtype | None = None,
        sutton_barto_reward: bool = False,
    ) -> None:
        high = np.array(
            [self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf], dtype=np.float32
        )
        observation_space = spaces.Box(-high, high, dtype=np.float32)
        super().__init__(num_envs, observation_space, spaces.Discrete(2), 4, device, max_episode_steps, dtype)
        self.sutton_barto_reward = sutton_barto_reward
        self._limits = torch.tensor(
            [self.x_threshold, self.theta_threshold_radians], dtype=self.dtype, device=self.device
        )
        # The constants as 0-dim tensors of the physics dtype: the same arithmetic as Python floats (torch
        # rounds a Python scalar to the tensor's dtype), without wrapping and converting one on every op,
        # which costs ~1.3 us each: a sixth of a step of a few sub-envs on a CPU.
        constant = functools.partial(torch.tensor, dtype=self.dtype, device=self.device)
        self._force = constant(self.force_mag), constant(-self.force_mag)
        self._polemass_length, self._total_mass = constant(self.polemass_length), constant(self.total_mass)
        self._gravity, self._length = constant(self.gravity), constant(self.length)
        self._masspole, self._four_thirds, self._tau = (
            constant(self.masspole),
            constant(4.0 / 3.0),
            constant(self.tau),
        )

    def _reset_rows(self, mask: Tensor) -> None:
        self._set_rows(mask, self._sample(-0.05, 0.05, (self.num_envs, 4)))

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        x, x_dot, theta, theta_dot = self.state.unbind(-1)  # each (N,)
        force = torch.where(actions == 1, *self._force)  # (N,)
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        polemass_length, total_mass = self._polemass_length, self._total_mass

        temp = (force + polemass_length * theta_dot.square() * sintheta) / total_mass
        thetaacc = (self._gravity * sintheta - costheta * temp) / (
            self._length * (self._four_thirds - self._masspole * costheta.square() / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass

        # Euler, as Gymnasium's default kinematics_integrator: positions use the old velocities. One
        # multiply-add on (N, 4) rounds every element as the four scalar updates would.
        derivatives = torch.stack((x_dot, xacc, theta_dot, thetaacc), dim=-1)  # (N, 4)
        self.state = self.state + self._tau * derivatives

        # |x| > 2.4 or |theta| > 12 deg (abs is exact: the same test as the reference's four)
        terminated = (self.state[:, 0::2].abs() > self._limits).any(dim=-1)  # (N,)
        if self.sutton_barto_reward:
            reward = torch.where(terminated, -1.0, 0.0)
        else:
            reward = torch.ones(self.num_envs, device=self.device)
        return reward.to(torch.float32), terminated

    def _observe(self) -> Tensor:
        return self.state.to(torch.float32)  # (N, 4)


def angle_normalize(x: Tensor) -> Tensor:
    """Map angles to ``[-pi, pi)``, as Gymnasium's pendulum ``angle_normalize``."""
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


class PendulumEnv(_ClassicEnv):
    """Pendulum-v1: swing a frictionless pendulum up and keep it upright with a torque in [-2, 2].

    State ``(theta, thetadot)`` (theta unwrapped); observation ``(cos theta, sin theta, thetadot)``.
    The action is clipped to ``[-max_torque, max_torque]``; the reward
    ``-(angle_normalize(theta)^2 + 0.1 thetadot^2 + 0.001 u^2)`` uses the state *before* the step and
    the clipped torque. Never terminates; truncated after 200 steps.
    """

    gymnasium_id = "Pendulum-v1"
    default_dtype = torch.float64  # chaotic under random torques: see the module docstring

    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    l = 1.0  # noqa: E741 (Gymnasium's name)

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = 200,
        dtype: torch.dtype | None = None,
        g: float = 10.0,
    ) -> None:
        high = np.array([1.0, 1.0, self.max_speed], dtype=np.float32)
        observation_space = spaces.Box(low=-high, high=high, dtype=np.float32)
        action_space = spaces.Box(low=-self.max_torque, high=self.max_torque, shape=(1,), dtype=np.float32)
        super().__init__(num_envs, observation_space, action_space, 2, device, max_episode_steps, dtype)
        self.g = g

    def _reset_rows(self, mask: Tensor) -> None:
        theta = self._sample(-math.pi, math.pi, (self.num_envs,))
        thetadot = self._sample(-1.0, 1.0, (self.num_envs,))
        self._set_rows(mask, torch.stack((theta, thetadot), dim=-1))

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        th, thdot = self.state.unbind(-1)  # each (N,)
        g, m, length, dt = self.g, self.m, self.l, self.dt
        # Gymnasium multiplies the float32 action by Python floats, which NumPy does in float32; the
        # terms in u are computed in float32 here too, so that dtype=float64 matches it closely.
        u = actions[:, 0].to(torch.float32).clamp(-self.max_torque, self.max_torque)  # (N,)
        u_cost = (0.001 * u.square()).to(self.dtype)
        u_acc = (3.0 / (m * length**2) * u).to(self.dtype)

        costs = angle_normalize(th).square() + 0.1 * thdot.square() + u_cost
        newthdot = thdot + (3 * g / (2 * length) * torch.sin(th) + u_acc) * dt
        newthdot = newthdot.clamp(-self.max_speed, self.max_speed)
        newth = th + newthdot * dt
        self.state = torch.stack((newth, newthdot), dim=-1)  # (N, 2)

        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return (-costs).to(torch.float32), terminated

    def _observe(self) -> Tensor:
        theta, thetadot = self.state.unbind(-1)
        return torch.stack((torch.cos(theta), torch.sin(theta), thetadot), dim=-1).to(torch.float32)  # (N, 3)


class MountainCarContinuousEnv(_ClassicEnv):
    """MountainCarContinuous-v0: drive an under-powered car up the right hill, force in [-1, 1].

    State = observation = ``(position, velocity)``. The force is the action clipped to [-1, 1];
    velocity is clipped to ``+-0.07``, position to ``[-1.2, 0.6]``, and a car stopped at the left wall
    loses its negative velocity. Terminates at ``position >= 0.45`` with ``velocity >= goal_velocity``.
    Reward ``100 * terminated - 0.1 * action^2``, with the *unclipped* action (as Gymnasium).
    Truncated after 999 steps.
    """

    gymnasium_id = "MountainCarContinuous-v0"

    min_action = -1.0
    max_action = 1.0
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.45
    power = 0.0015

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = 999,
        dtype: torch.dtype | None = None,
        goal_velocity: float = 0.0,
    ) -> None:
        low = np.array([self.min_position, -self.max_speed], dtype=np.float32)
        high = np.array([self.max_position, self.max_speed], dtype=np.float32)
        observation_space = spaces.Box(low=low, high=high, dtype=np.float32)
        action_space = spaces.Box(low=self.min_action, high=self.max_action, shape=(1,), dtype=np.float32)
        super().__init__(num_envs, observation_space, action_space, 2, device, max_episode_steps, dtype)
        self.goal_velocity = goal_velocity

    def _reset_rows(self, mask: Tensor) -> None:
        position = self._sample(-0.6, -0.4, (self.num_envs,))
        self._set_rows(mask, torch.stack((position, torch.zeros_like(position)), dim=-1))

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        position, velocity = self.state.unbind(-1)  # each (N,)
        action = actions[:, 0].to(self.dtype)  # (N,)
        force = action.clamp(self.min_action, self.max_action)

        velocity = velocity + force * self.power - 0.0025 * torch.cos(3 * position)
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = (position + velocity).clamp(self.min_position, self.max_position)
        velocity = torch.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        self.state = torch.stack((position, velocity), dim=-1)  # (N, 2)

        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)  # (N,)
        reward = torch.where(terminated, 100.0, 0.0).to(self.dtype) - action.square() * 0.1
        return reward.to(torch.float32), terminated

    def _observe(self) -> Tensor:
        return self.state.to(torch.float32)  # (N, 2)


class AcrobotEnv(_ClassicEnv):
    """Acrobot-v1: swing the tip of a two-link pendulum above the bar with torque -1, 0 or +1.

    State ``(theta1, theta2, dtheta1, dtheta2)``; observation
    ``(cos theta1, sin theta1, cos theta2, sin theta2, dtheta1, dtheta2)``. One step is a single RK4
    step of ``dt = 0.2`` of the "book" dynamics; then the angles are wrapped to ``[-pi, pi]`` and the
    velocities bounded to ``4 pi`` and ``9 pi``. Terminates when ``-cos(t1) - cos(t1 + t2) > 1``;
    reward -1 per step and 0 on the terminating step. Truncated after 500 steps.
    """

    gymnasium_id = "Acrobot-v1"
    default_dtype = torch.float64  # chaotic, and stiff at high speeds: see the module docstring

    dt = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_LENGTH_2 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * math.pi
    MAX_VEL_2 = 9 * math.pi

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        max_episode_steps: int | None = 500,
        dtype: torch.dtype | None = None,
    ) -> None:
        high = np.array([1.0, 1.0, 1.0, 1.0, self.MAX_VEL_1, self.MAX_VEL_2], dtype=np.float32)
        observation_space = spaces.Box(low=-high, high=high, dtype=np.float32)
        super().__init__(num_envs, observation_space, spaces.Discrete(3), 4, device, max_episode_steps, dtype)

    def _reset_rows(self, mask: Tensor) -> None:
        self._set_rows(mask, self._sample(-0.1, 0.1, (self.num_envs, 4)))

    def _dsdt(self, s: Tensor, torque: Tensor) -> Tensor:
        """Time derivative of the state ``s`` (N, 4) under ``torque`` (N,): (N, 4)."""
        m1, m2 = self.LINK_MASS_1, self.LINK_MASS_2
        l1, lc1, lc2 = self.LINK_LENGTH_1, self.LINK_COM_POS_1, self.LINK_COM_POS_2
        i1 = i2 = self.LINK_MOI
        g = 9.8
        theta1, theta2, dtheta1, dtheta2 = s.unbind(-1)
        cos2, sin2 = torch.cos(theta2), torch.sin(theta2)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos2) + i1 + i2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos2) + i2
        # cos(a - pi/2) rather than sin(a), as Gymnasium writes it: the same rounding in float64.
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2.square() * sin2
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
            + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2)
            + phi2
        )
        # The "book" (and Java) dynamics, Gymnasium's default.
        ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1.square() * sin2 - phi2) / (
            m2 * lc2**2 + i2 - d2.square() / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), dim=-1)

    @staticmethod
    def _wrap(x: Tensor, low: float, high: float) -> Tensor:
        """Gymnasium's ``wrap`` (repeatedly add/subtract ``high - low`` until in range), loop-free."""
        diff = high - low
        x = x - diff * torch.ceil((x - high) / diff).clamp(min=0)
        return x + diff * torch.ceil((low - x) / diff).clamp(min=0)

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        s = self.state  # (N, 4)
        torque = actions.to(self.dtype) - 1.0  # (N,): AVAIL_TORQUE[a] = (-1, 0, +1)[a]

        # One step of Gymnasium's rk4 over t = [0, dt].
        dt, dt2 = self.dt, self.dt / 2.0
        k1 = self._dsdt(s, torque)
        k2 = self._dsdt(s + dt2 * k1, torque)
        k3 = self._dsdt(s + dt2 * k2, torque)
        k4 = self._dsdt(s + dt * k3, torque)
        ns = s + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)  # (N, 4)

        theta1, theta2, dtheta1, dtheta2 = ns.unbind(-1)
        theta1 = self._wrap(theta1, -math.pi, math.pi)
        theta2 = self._wrap(theta2, -math.pi, math.pi)
        dtheta1 = dtheta1.clamp(-self.MAX_VEL_1, self.MAX_VEL_1)
        dtheta2 = dtheta2.clamp(-self.MAX_VEL_2, self.MAX_VEL_2)
        self.state = torch.stack((theta1, theta2, dtheta1, dtheta2), dim=-1)  # (N, 4)

        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0  # (N,)
        reward = torch.where(terminated, 0.0, -1.0)
        return reward.to(torch.float32), terminated

    def _observe(self) -> Tensor:
        theta1, theta2, dtheta1, dtheta2 = self.state.unbind(-1)
        obs = (torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2), dtheta1, dtheta2)
        return torch.stack(obs, dim=-1).to(torch.float32)  # (N, 6)


CLASSIC_ENVS: dict[str, type[BatchedVecEnv]] = {
    "CartPole-v1": CartPoleEnv,
    "Pendulum-v1": PendulumEnv,
    "MountainCarContinuous-v0": MountainCarContinuousEnv,
    "Acrobot-v1": AcrobotEnv,
}


def cartpole_no_velocity(
    num_envs: int = 1, device: str | torch.device = "cpu", **kwargs: object
) -> MaskVelocity:
    """``CartPoleNoVel-v1``: CartPole-v1 whose observations hide the cart and pole velocities (entries 1
    and 3 zeroed, as RL Zoo's ``CartPoleNoVel-v1``): position and angle alone, a task that needs memory.
    ``kwargs`` go to :class:`CartPoleEnv`."""
    return MaskVelocity(CartPoleEnv(num_envs, device, **kwargs), (1, 3))  # type: ignore[arg-type]


def pendulum_no_velocity(
    num_envs: int = 1, device: str | torch.device = "cpu", **kwargs: object
) -> MaskVelocity:
    """``PendulumNoVel-v1``: Pendulum-v1 whose observations hide the angular velocity (entry 2 zeroed):
    cos and sin of the angle alone, a task that needs memory. ``kwargs`` go to :class:`PendulumEnv`."""
    return MaskVelocity(PendulumEnv(num_envs, device, **kwargs), (2,))  # type: ignore[arg-type]


MEMORY_ENVS = {"CartPoleNoVel-v1": cartpole_no_velocity, "PendulumNoVel-v1": pendulum_no_velocity}
"""Classic tasks with their velocities masked: the memory tasks of recurrent policies. The Gymnasium env
of the same task with the same entries masked, for videos: :data:`MASKED_GYMNASIUM`."""
MASKED_GYMNASIUM = {"CartPoleNoVel-v1": ("CartPole-v1", (1, 3)), "PendulumNoVel-v1": ("Pendulum-v1", (2,))}
"""Each memory task's Gymnasium id and the entries of its observations that are masked."""
