"""The Multi-Particle Environments ``simple_spread`` and ``simple_tag`` as batched torch simulators.

Each class reproduces one task of the ``mpe2`` package (PettingZoo's MPE, version 3 of both tasks)
for ``num_envs`` copies at once, as tensor operations on one device: the particle physics of
``mpe2._mpe_utils.core.World.step``, the action decoding of ``SimpleEnv._set_action``, the scenario's
rewards and observations, the initial-state distribution, the spaces, the agent names and the
``max_cycles`` truncation. ``env.position`` and ``env.velocity`` ``(num_envs, E, 2)`` hold the state of
every entity in ``world.entities`` order (agents in ``world.agents`` order, then landmarks), one row per
sub-env; they are the checkpointed state and can be read and written directly.

Physics (``dt`` 0.1, damping 0.25, mass 1): every step, an agent's force is its action
(``sensitivity * u``) plus the contact forces of all colliding entities,
``contact_force * (p_a - p_b) / |p_a - p_b| * k * softplus((size_a + size_b - |p_a - p_b|) / k)`` with
``contact_force`` 100 and ``k`` 1e-3, summed over all pairs at once. Positions move with the *old*
velocity, then the velocity is damped, accelerated and clamped to the agent's ``max_speed``.
Landmarks never move.

Precision: the reference computes in float64 NumPy; the physics here runs in ``dtype`` (float32 by
default, float64 on request). Float32 tracks the reference within ~1e-5 over whole random-action
episodes with collisions; rewards that count collisions (``distance < size_a + size_b``) can differ
from the reference only when a distance lies within float32 rounding of that threshold.

Deliberate differences from mpe2: the other agents' communication slots of ``simple_spread`` are
always zero (its agents are silent, so they are in mpe2 too); two distinct entities at exactly the
same point exert no contact force on each other (mpe2 divides by zero and produces NaN); Box actions
are clipped to ``[0, 1]`` (mpe2's ``ClipOutOfBoundsWrapper`` clips and warns), Discrete actions outside
``0..4`` are a no-op (mpe2's ``AssertOutOfBoundsWrapper`` raises); the curriculum, partial observability,
``terminate_on_success`` and benchmark options are not implemented; ``render()`` draws with NumPy, at
true scale (mpe2 additionally scales radii by the camera range at reset) and without text.

Autoreset, truncation, episode statistics, seeding and checkpointing come from
:class:`~phalanx.marl.core.BatchedMultiAgentEnv`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from phalanx.errors import ConfigError
from phalanx.marl.core import AgentGroup, BatchedMultiAgentEnv, Groups, Tensor

Color = tuple[float, float, float]

LANDMARK_COLOR: Color = (0.25, 0.25, 0.25)


def _check_int(owner: str, name: str, value: Any, minimum: int, meaning: str) -> int:
    """``value`` as an int, or a ConfigError saying what was expected."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(
            f"{owner}: {name} ({meaning}) must be an integer >= {minimum}, got {value!r}. "
            f"Pass {name}={max(minimum, 1)} or more."
        )
    return int(value)


def _flat_box(dim: int) -> spaces.Box:
    return spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)


def _others_index(n: int) -> Tensor:
    """``(n, n - 1)`` int64: row i lists ``0..n-1`` without ``i``, in order."""
    index = torch.arange(n).expand(n, n)
    keep = ~torch.eye(n, dtype=torch.bool)
    return index[keep].view(n, n - 1)


class ParticleWorldEnv(BatchedMultiAgentEnv):
    """The particle world of MPE, batched: movable agents and static landmarks on a plane.

    Entities are agents (``world.agents`` order: group by group) followed by landmarks. Every agent is
    movable and collides; landmarks never move and either all collide (``landmarks_collide``) or none
    do. All masses are 1, as in every MPE scenario. Subclasses supply the groups, the per-agent
    properties, the initial positions (:meth:`_initial_positions`), the rewards (:meth:`_rewards`) and
    the observations (:meth:`_observe`).
    """

    metadata: dict[str, Any] = {
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": ["rgb_array"],
        "render_fps": 10,
    }
    state_names = ("position", "velocity")
    reference_id: str = ""
    """The mpe2 module this env reproduces, e.g. ``"simple_spread_v3"``."""

    dt = 0.1
    damping = 0.25
    contact_force = 1e2
    contact_margin = 1e-3
    render_size = 350
    """Width and height of :meth:`render`'s frames, in pixels."""

    def __init__(
        self,
        num_envs: int,
        groups: dict[str, AgentGroup],
        *,
        agent_size: Sequence[float],
        agent_accel: Sequence[float | None],
        agent_max_speed: Sequence[float | None],
        agent_color: Sequence[Color],
        num_landmarks: int,
        landmark_size: float,
        landmarks_collide: bool,
        continuous_actions: bool,
        max_cycles: int,
        device: str | torch.device,
        dtype: torch.dtype,
    ) -> None:
        name = type(self).__name__
        state_dim = sum(g.num_agents * int(g.observation_space.shape[0]) for g in groups.values())
        super().__init__(num_envs, groups, _flat_box(state_dim), device, max_episode_steps=max_cycles)
        if dtype not in (torch.float32, torch.float64):
            raise ConfigError(
                f"{name}: dtype must be torch.float32 or torch.float64, got {dtype}. "
                "Pass dtype=torch.float32 (or torch.float64)."
            )
        if dtype == torch.float64 and self.device.type == "mps":
            raise ConfigError(f"{name}: MPS has no float64; pass dtype=torch.float32 or device='cpu'.")
        num_agents = self.num_agents
        if not len(agent_size) == len(agent_accel) == len(agent_max_speed) == len(agent_color) == num_agents:
            raise ConfigError(
                f"{name}: one size, accel, max_speed and colour per agent ({num_agents}) needed."
            )
        self.dtype = dtype
        self.continuous_actions = bool(continuous_actions)
        self.max_cycles = max_cycles
        self.num_landmarks = num_landmarks
        self.num_entities = num_agents + num_landmarks
        self.landmarks_collide = bool(landmarks_collide)
        self.entity_names = tuple(self.agents) + tuple(f"landmark {i}" for i in range(num_landmarks))
        """Every entity's name, as mpe2's ``world.entities``."""

        def tensor(values: Sequence[float]) -> Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        sizes = [*agent_size, *[landmark_size] * num_landmarks]
        self.size = tensor(sizes)  # (E,)
        self.color = np.array([*agent_color, *[LANDMARK_COLOR] * num_landmarks], dtype=np.float64)  # (E, 3)
        # mpe2: u *= accel if accel is set, else 5.0.
        self._sensitivity = tensor([5.0 if a is None else a for a in agent_accel]).view(-1, 1)  # (A, 1)
        max_speed = [math.inf if s is None else s for s in agent_max_speed]
        self._max_speed = tensor(max_speed).view(-1, 1)  # (A, 1); inf: no limit
        self._any_max_speed = any(s is not None for s in agent_max_speed)
        # Colliders: every agent, and the landmarks when they collide (a prefix of the entities).
        self._num_colliders = self.num_entities if self.landmarks_collide else num_agents
        collider_size = self.size[: self._num_colliders]
        self._contact_distance = collider_size.view(-1, 1) + collider_size.view(1, -1)  # (C, C)
        self._others = _others_index(num_agents).to(self.device)  # (A, A-1)
        self._rows = torch.arange(num_agents, device=self.device).view(-1, 1)  # (A, 1)

        self.position = torch.zeros(self.num_envs, self.num_entities, 2, dtype=dtype, device=self.device)
        """Every entity's position ``(num_envs, E, 2)``, ``world.entities`` order."""
        self.velocity = torch.zeros_like(self.position)
        """Every entity's velocity ``(num_envs, E, 2)``; zero for landmarks."""

    # -- for subclasses ------------------------------------------------------------------------------
    def _initial_positions(self) -> Tensor:
        """Fresh positions ``(num_envs, E, 2)`` for every row, from the seeded generator."""
        raise NotImplementedError

    def _rewards(self) -> Groups:
        """The rewards per group of the current (post-step) state, float32."""
        raise NotImplementedError

    @property
    def reference_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the mpe2 ``parallel_env`` with the same settings."""
        raise NotImplementedError

    # -- shared helpers --------------------------------------------------------------------------
    @property
    def agent_position(self) -> Tensor:
        return self.position[:, : self.num_agents]  # (N, A, 2)

    @property
    def agent_velocity(self) -> Tensor:
        return self.velocity[:, : self.num_agents]  # (N, A, 2)

    @property
    def landmark_position(self) -> Tensor:
        return self.position[:, self.num_agents :]  # (N, L, 2)

    def _own_view(self) -> Tensor:
        """What every agent sees of the world, ``(N, A, 4 + 2 L + 2 (A - 1))`` in the physics dtype: its
        velocity and position, the landmarks' and the other agents' positions relative to it."""
        return torch.cat(
            (
                self.agent_velocity,  # (N, A, 2)
                self.agent_position,  # (N, A, 2)
                self._relative_landmarks(),  # (N, A, 2 L)
                self._relative_others(),  # (N, A, 2)
            ),
            dim=-1,
        )

    def _relative_landmarks(self) -> Tensor:
        """Each landmark's position relative to each agent, flattened: ``(N, A, 2 L)``."""
        rel = self.landmark_position.unsqueeze(1) - self.agent_position.unsqueeze(2)  # (N, A, L, 2)
        return rel.flatten(2)

    def _relative_others(self) -> Tensor:
        """Each *other* agent's position relative to each agent, flattened: ``(N, A, 2 (A - 1))``."""
        pos = self.agent_position
        rel = pos.unsqueeze(1) - pos.unsqueeze(2)  # (N, A, A, 2): [i, j] = p_j - p_i
        return rel[:, self._rows, self._others].flatten(2)  # (N, A, A-1, 2) -> (N, A, 2(A-1))

    @staticmethod
    def _distance(a: Tensor, b: Tensor) -> Tensor:
        """Pairwise distances ``(N, P, Q)`` between points ``a`` ``(N, P, 2)`` and ``b`` ``(N, Q, 2)``."""
        return (a.unsqueeze(2) - b.unsqueeze(1)).square().sum(-1).sqrt()

    def _action_force(self, actions: Groups) -> Tensor:
        """mpe2's ``_set_action``: the agents' control forces ``(N, A, 2)`` in the physics dtype."""
        action = torch.cat([actions[name] for name in self.groups], dim=1)  # (N, A) or (N, A, 5)
        if self.continuous_actions:
            action = action.clamp(0.0, 1.0)
            u = torch.stack((action[..., 2] - action[..., 1], action[..., 4] - action[..., 3]), dim=-1)
        else:
            # 0 no-op, 1 -x, 2 +x, 3 -y, 4 +y (anything else: no-op)
            ux = (action == 2).to(torch.float32) - (action == 1).to(torch.float32)
            uy = (action == 4).to(torch.float32) - (action == 3).to(torch.float32)
            u = torch.stack((ux, uy), dim=-1)
        return u.to(self.dtype) * self._sensitivity  # (N, A, 2)

    def _contact_forces(self) -> Tensor:
        """Each collider's summed contact force ``(N, C, 2)``, all pairs at once.

        mpe2 visits the pairs b > a and adds ``+f`` to a and ``-f`` to b; as ``f(b, a) = -f(a, b)``, that is
        the sum over every other collider b of ``f(a, b)``. The diagonal has ``p_a - p_b = 0`` and adds 0.
        """
        pos = self.position[:, : self._num_colliders]  # (N, C, 2)
        delta = pos.unsqueeze(2) - pos.unsqueeze(1)  # (N, C, C, 2): [a, b] = p_a - p_b
        dist = delta.square().sum(-1).sqrt()  # (N, C, C)
        k = self.contact_margin
        penetration = F.softplus((self._contact_distance - dist) / k) * k  # logaddexp(0, -(d - d_min)/k) k
        scale = self.contact_force * penetration / dist.clamp_min(1e-12)  # (N, C, C)
        return (delta * scale.unsqueeze(-1)).sum(2)  # (N, C, 2)

    # -- BatchedMultiAgentEnv ----------------------------------------------------------------------
    def _reset_rows(self, mask: Tensor) -> None:
        rows = mask.view(-1, 1, 1)
        self.position = torch.where(rows, self._initial_positions(), self.position)
        self.velocity = self.velocity.masked_fill(rows, 0.0)

    def _advance(self, actions: Groups) -> tuple[Groups, Tensor]:
        num_agents = self.num_agents
        force = self._action_force(actions) + self._contact_forces()[:, :num_agents]  # (N, A, 2)
        pos, vel = self.agent_position, self.agent_velocity
        # World.integrate_state: position with the old velocity, then damping, force (mass 1), clamp.
        new_pos = pos + vel * self.dt
        new_vel = vel * (1 - self.damping) + force * self.dt
        if self._any_max_speed:
            speed = new_vel.square().sum(-1, keepdim=True).sqrt()  # (N, A, 1)
            clamped = new_vel / speed.clamp_min(1e-12) * self._max_speed
            new_vel = torch.where(speed > self._max_speed, clamped, new_vel)
        self.position = torch.cat((new_pos, self.landmark_position), dim=1)
        self.velocity = torch.cat((new_vel, self.velocity[:, num_agents:]), dim=1)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return self._rewards(), terminated

    # -- rendering -------------------------------------------------------------------------------
    def render(self) -> np.ndarray:
        """Sub-env 0 as an RGB frame ``(render_size, render_size, 3)`` uint8, drawn as mpe2 does.

        White background, one filled circle per entity (agents first, then landmarks on top) in the
        entity's colour * 200 with a black border; the camera is centred on the origin and fits the
        entity farthest from it with a 10% margin.
        """
        pos = self.position[0].detach().to("cpu", torch.float64).numpy()  # (E, 2)
        size = self.size.detach().to("cpu", torch.float64).numpy()  # (E,)
        width = height = self.render_size
        cam_range = max(float(np.abs(pos).max()), 1e-6)
        scale = 0.9 * (width / 2) / cam_range  # pixels per unit
        frame = np.full((height, width, 3), 255, dtype=np.uint8)
        for entity in range(self.num_entities):
            cx = width / 2 + pos[entity, 0] * scale
            cy = height / 2 - pos[entity, 1] * scale  # y up, as mpe2's flipped pygame frame
            radius = max(size[entity] * scale, 1.0)
            x0, x1 = max(int(cx - radius) - 1, 0), min(int(cx + radius) + 2, width)
            y0, y1 = max(int(cy - radius) - 1, 0), min(int(cy + radius) + 2, height)
            if x0 >= x1 or y0 >= y1:
                continue
            ys, xs = np.mgrid[y0:y1, x0:x1]
            d2 = (xs + 0.5 - cx) ** 2 + (ys + 0.5 - cy) ** 2
            inside = d2 <= radius**2
            patch = frame[y0:y1, x0:x1]
            patch[inside] = np.round(self.color[entity] * 200).astype(np.uint8)
            patch[inside & (d2 > (radius - 1) ** 2)] = 0
        return frame


def _action_space(continuous_actions: bool) -> spaces.Discrete | spaces.Box:
    """mpe2's action space of a silent movable agent: Discrete(5), or Box(0, 1, (5,)) float32."""
    if continuous_actions:
        return spaces.Box(0.0, 1.0, shape=(5,), dtype=np.float32)
    return spaces.Discrete(5)


def _check_common(owner: str, max_cycles: Any, continuous_actions: Any) -> int:
    max_cycles = _check_int(owner, "max_cycles", max_cycles, 1, "the episode length in steps")
    if not isinstance(continuous_actions, (bool, np.bool_)):
        raise ConfigError(
            f"{owner}: continuous_actions must be True or False, got {continuous_actions!r}. "
            "Pass continuous_actions=False for Discrete(5) actions or True for Box(0, 1, (5,))."
        )
    return max_cycles


class SimpleSpread(ParticleWorldEnv):
    """``simple_spread_v3``: N agents cover N landmarks while avoiding each other.

    One group ``"agent"`` (``agent_0`` ..). Agents (size 0.15) collide with each other, landmarks do not
    collide. Observation per agent (``6 N`` dims): ``[self_vel, self_pos, landmark_rel_positions,
    other_agent_rel_positions, communication]`` (communication: zeros, 2 per other agent). Reward per
    agent: ``global * (1 - local_ratio) + local * local_ratio`` with ``global = -sum over landmarks of
    the nearest agent's distance`` and ``local = -(number of other agents it collides with)``. Never
    terminates; truncated after ``max_cycles`` steps. Initial positions uniform in ``[-1, 1)^2``.
    """

    reference_id = "simple_spread_v3"
    agent_size = 0.15
    agent_color: Color = (0.35, 0.35, 0.85)

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        N: int = 3,  # noqa: N803 (mpe2's name)
        local_ratio: float = 0.5,
        max_cycles: int = 25,
        continuous_actions: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        owner = type(self).__name__
        n = _check_int(owner, "N", N, 1, "the number of agents and of landmarks")
        if (
            isinstance(local_ratio, bool)
            or not isinstance(local_ratio, numbers.Real)
            or not 0.0 <= float(local_ratio) <= 1.0
        ):
            raise ConfigError(
                f"{owner}: local_ratio (the weight of each agent's collision penalty against the shared "
                f"coverage reward) must be a number in [0, 1], got {local_ratio!r}. "
                "Pass e.g. local_ratio=0.5."
            )
        max_cycles = _check_common(owner, max_cycles, continuous_actions)
        self.N: int = n
        self.local_ratio: float = float(local_ratio)
        group = AgentGroup(
            agents=tuple(f"agent_{i}" for i in range(n)),
            observation_space=_flat_box(6 * n),
            action_space=_action_space(continuous_actions),
        )
        super().__init__(
            num_envs,
            {"agent": group},
            agent_size=[self.agent_size] * n,
            agent_accel=[None] * n,
            agent_max_speed=[None] * n,
            agent_color=[self.agent_color] * n,
            num_landmarks=n,
            landmark_size=0.05,
            landmarks_collide=False,
            continuous_actions=continuous_actions,
            max_cycles=max_cycles,
            device=device,
            dtype=dtype,
        )
        # The other (silent) agents' communication: always zero.
        self._comm: Tensor = torch.zeros(
            self.num_envs, n, 2 * (n - 1), dtype=torch.float32, device=self.device
        )

    @property
    def reference_kwargs(self) -> dict[str, Any]:
        return {
            "N": self.N,
            "local_ratio": self.local_ratio,
            "max_cycles": self.max_cycles,
            "continuous_actions": self.continuous_actions,
        }

    def _initial_positions(self) -> Tensor:
        return self.uniform(-1.0, 1.0, (self.num_envs, self.num_entities, 2)).to(self.dtype)

    def _rewards(self) -> Groups:
        agents = self.agent_position  # (N, A, 2)
        nearest = self._distance(self.landmark_position, agents).amin(-1)  # (N, L)
        global_reward = -nearest.sum(-1, keepdim=True)  # (N, 1)
        between = self._distance(agents, agents)  # (N, A, A)
        colliding = (between < 2 * self.agent_size).sum(-1) - 1  # (N, A), minus itself (distance 0)
        local = -colliding.to(self.dtype)
        reward = global_reward * (1 - self.local_ratio) + local * self.local_ratio
        return {"agent": reward.to(torch.float32)}

    def _observe(self) -> Groups:
        obs = self._own_view().to(torch.float32)
        return {"agent": torch.cat((obs, self._comm), dim=-1)}  # (N, A, 6 N)


class SimpleTag(ParticleWorldEnv):
    """``simple_tag_v3``: slower adversaries chase faster good agents among obstacles.

    Two groups in mpe2's ``world.agents`` order: ``"adversary"`` (``adversary_0`` ..; size 0.075, accel
    3, max speed 1.0) then ``"agent"`` (``agent_0`` ..; size 0.05, accel 4, max speed 1.3). Obstacles
    (size 0.2) collide but never move. Observation: ``[self_vel, self_pos, obstacle_rel_positions,
    other_agent_rel_positions, other_good_agent_velocities]`` (16 dims for an adversary and 14 for a
    good agent with the defaults). Rewards: every adversary gets +10 per colliding (good agent,
    adversary) pair; a good agent gets -10 per adversary it collides with, minus a boundary penalty
    per coordinate (0 below 0.9, ``10 (|x| - 0.9)`` below 1, then ``min(exp(2 |x| - 2), 10)``). Never
    terminates; truncated after ``max_cycles`` steps. Initial agent positions uniform in ``[-1, 1)^2``,
    obstacles in ``[-0.9, 0.9)^2``.
    """

    reference_id = "simple_tag_v3"
    adversary_size, good_size = 0.075, 0.05
    adversary_color: Color = (0.85, 0.35, 0.35)
    good_color: Color = (0.35, 0.85, 0.35)

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        num_good: int = 1,
        num_adversaries: int = 3,
        num_obstacles: int = 2,
        max_cycles: int = 25,
        continuous_actions: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        owner = type(self).__name__
        good = _check_int(owner, "num_good", num_good, 1, "the number of good agents")
        adv = _check_int(owner, "num_adversaries", num_adversaries, 1, "the number of adversaries")
        obstacles = _check_int(owner, "num_obstacles", num_obstacles, 0, "the number of obstacles")
        max_cycles = _check_common(owner, max_cycles, continuous_actions)
        self.num_good, self.num_adversaries, self.num_obstacles = good, adv, obstacles
        common = 4 + 2 * obstacles + 2 * (good + adv - 1)
        action_space = _action_space(continuous_actions)
        groups = {
            "adversary": AgentGroup(
                tuple(f"adversary_{i}" for i in range(adv)), _flat_box(common + 2 * good), action_space
            ),
            "agent": AgentGroup(
                tuple(f"agent_{i}" for i in range(good)), _flat_box(common + 2 * (good - 1)), action_space
            ),
        }
        super().__init__(
            num_envs,
            groups,
            agent_size=[self.adversary_size] * adv + [self.good_size] * good,
            agent_accel=[3.0] * adv + [4.0] * good,
            agent_max_speed=[1.0] * adv + [1.3] * good,
            agent_color=[self.adversary_color] * adv + [self.good_color] * good,
            num_landmarks=obstacles,
            landmark_size=0.2,
            landmarks_collide=True,
            continuous_actions=continuous_actions,
            max_cycles=max_cycles,
            device=device,
            dtype=dtype,
        )
        self._good_others = _others_index(good).to(self.device)  # (G, G-1)

    @property
    def reference_kwargs(self) -> dict[str, Any]:
        return {
            "num_good": self.num_good,
            "num_adversaries": self.num_adversaries,
            "num_obstacles": self.num_obstacles,
            "max_cycles": self.max_cycles,
            "continuous_actions": self.continuous_actions,
        }

    def _initial_positions(self) -> Tensor:
        agents = self.uniform(-1.0, 1.0, (self.num_envs, self.num_agents, 2))
        obstacles = self.uniform(-0.9, 0.9, (self.num_envs, self.num_obstacles, 2))
        return torch.cat((agents, obstacles), dim=1).to(self.dtype)

    def _rewards(self) -> Groups:
        adv = self.num_adversaries
        adversaries = self.agent_position[:, :adv]  # (N, Adv, 2)
        good = self.agent_position[:, adv:]  # (N, G, 2)
        caught = self._distance(good, adversaries) < self.good_size + self.adversary_size  # (N, G, Adv)
        catches = caught.sum(-1).to(self.dtype)  # (N, G)
        adversary_reward = (10.0 * catches.sum(-1, keepdim=True)).expand(-1, adv)  # (N, Adv)
        x = good.abs()  # (N, G, 2)
        bound = torch.where(
            x < 0.9,
            torch.zeros_like(x),
            torch.where(x < 1.0, (x - 0.9) * 10, torch.exp(2 * x - 2).clamp_max(10.0)),
        )
        good_reward = -10.0 * catches - bound.sum(-1)  # (N, G)
        return {"adversary": adversary_reward.to(torch.float32), "agent": good_reward.to(torch.float32)}

    def _observe(self) -> Groups:
        adv = self.num_adversaries
        n = self.num_envs
        common = self._own_view()
        good_velocity = self.agent_velocity[:, adv:]  # (N, G, 2)
        adversary_sees = good_velocity.flatten(1).unsqueeze(1).expand(n, adv, -1)  # (N, Adv, 2 G)
        good_sees = good_velocity[:, self._good_others].flatten(2)  # (N, G, 2 (G-1))
        return {
            "adversary": torch.cat((common[:, :adv], adversary_sees), dim=-1).to(torch.float32),
            "agent": torch.cat((common[:, adv:], good_sees), dim=-1).to(torch.float32),
        }


MPE_ENVS: dict[str, type[ParticleWorldEnv]] = {
    SimpleSpread.reference_id: SimpleSpread,
    SimpleTag.reference_id: SimpleTag,
}
"""The batched MPE tasks by the mpe2 module they reproduce."""
