"""The replay buffer for image observations: :class:`CompactReplayBuffer` stores each observation, and
each frame of stacked frames, once, and samples exactly the batches a :class:`ReplayBuffer` of the same
capacity would (the same :class:`ReplayRing`, the same random draws) in a fraction of its memory.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from phalanx.buffers.layout import Device, StepLayout
from phalanx.buffers.memory import ReplayMemory, check_memory, replay_layout, transition_bytes
from phalanx.buffers.replay import ReplayBatch, ReplayRing
from phalanx.errors import CheckpointError, ConfigError

Tensor = torch.Tensor


class CompactReplayBuffer(ReplayRing):
    """A replay buffer that stores each observation once, and each frame of stacked frames once: for
    images, as exact as :class:`ReplayBuffer` in a fraction of its memory.

    A :class:`ReplayBuffer` stores every observation twice (as the ``obs`` of a step and as the
    ``next_obs`` of the step before), and with ``k`` stacked frames each frame ``2k`` times. Here each
    sub-env has a ring of frame rows, written in order; an observation is the ``k`` consecutive rows ending
    at its *serial* (the count of rows the sub-env had written when it ended), and a transition stores the
    serials of its ``obs`` and ``next_obs``. Adding a step writes only what the rows do not hold yet:

    - ``obs`` equal to the observation stored last (the ``next_obs`` of the sub-env's previous step, as
      the VecEnv contract has it): nothing; equal to it shifted by one frame: that new frame; else all
      ``k`` (an episode's first observation);
    - ``next_obs`` against ``obs`` likewise: one frame in a running episode of stacked frames (or the whole
      observation, with ``k = 1``), and the final observation of an episode that ended gets its own row
      like any other, where a ReplayBuffer that leaves ``next_obs`` out would have lost it.

    Nothing is assumed: each step is compared with what is stored (a few elementwise ops on the device), so
    any data reads back exactly as added, and ``sample`` returns, for the same random draws, the very
    batch a :class:`ReplayBuffer` of the same capacity returns (it samples through the same
    :class:`NStepWindow`; the stacks are rebuilt by one gather). A run of stacked frames costs one row per
    transition plus ``k`` per episode; plain observations one row per transition plus one per episode.

    The rows are ``slots + slots // 8 + 2k`` per sub-env: room for the episodes' extra rows as long as
    they average at least ``8k`` steps (8 for plain observations, 32 for Atari's 4 frames). Where they
    run out, the oldest transitions, whose rows were written over, leave the buffer (``len`` says how many
    remain; :meth:`sample` finds them with one host synchronisation): the buffer then holds fewer than
    ``capacity`` transitions, each still exact. ``stacked_frames = k > 1`` requires observations
    ``(k, ...)``: the frames along the first axis, as Atari's ``(4, 84, 84)``.
    """

    FIELDS = (
        "frames",
        "obs_serial",
        "next_serial",
        "actions",
        "rewards",
        "terminated",
        "truncated",
        "head",
        "last",
    )

    def __init__(
        self, capacity: int, num_envs: int, layout: StepLayout, device: Device, stacked_frames: int = 1
    ) -> None:
        super().__init__(capacity, num_envs, layout, device)
        if stacked_frames < 1 or (stacked_frames > 1 and self.obs_shape[:1] != (stacked_frames,)):
            raise ConfigError(
                f"CompactReplayBuffer: stacked_frames = {stacked_frames} needs observations of shape "
                f"({stacked_frames}, ...) (the frames along the first axis), but they are {self.obs_shape}. "
                "Use stacked_frames = 1 (each observation stored whole)."
            )
        self.stacked_frames = stacked_frames
        self.frame_shape = self.obs_shape[1:] if stacked_frames > 1 else self.obs_shape
        self.rows = self.rows_per_env(self.slots, stacked_frames)
        check_memory(self.memory(capacity, num_envs, layout, device, stacked_frames))
        obs_dtype = self.obs_dtype
        shape = (self.slots, num_envs)
        # the row after the last is written with what a step leaves out (writes stay one op per step)
        self.frames = torch.zeros(
            num_envs, self.rows + 1, *self.frame_shape, dtype=obs_dtype, device=self.device
        )
        self.obs_serial = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.next_serial = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.allocate_steps()
        self.head = torch.full((num_envs,), -1, dtype=torch.int64, device=self.device)
        """Per sub-env, the serial of the last row written (-1: none yet)."""
        self.last = torch.zeros(
            num_envs, stacked_frames, *self.frame_shape, dtype=obs_dtype, device=self.device
        )
        """Per sub-env, the observation stored last (the rows ending at ``head``), which the next is
        compared with."""
        self.margin = -1
        """Rows every sub-env can still write before the oldest held observation is written over, as of
        the last check, less the most each add since may have written (2k): :meth:`drop_overwritten` checks
        again (a host synchronisation) only once it is negative."""
        # Frames are copied and compared as whole machine words (the widest integer that divides a frame's
        # bytes): index_select and index_copy_ of a CPU tensor take ~10x less time per frame than on bytes.
        frame_bytes = obs_dtype.itemsize * math.prod(self.frame_shape)
        self.word = next(dtype for dtype in WORDS if frame_bytes % dtype.itemsize == 0)
        self.frame_words = self.words(self.frames)  # (N * (rows + 1), W): a view of the frames
        self.last_words = self.words(self.last).view(num_envs, stacked_frames, -1)  # (N, k, W), a view
        self.env_rows = torch.arange(num_envs, device=self.device).unsqueeze(1) * (self.rows + 1)  # (N, 1)
        self.frame_offsets = torch.arange(1 - stacked_frames, 1, device=self.device)  # (k,)
        self.frame_index = torch.arange(stacked_frames, device=self.device)  # (k,)

    @staticmethod
    def rows_per_env(slots: int, stacked_frames: int) -> int:
        """Frame rows per sub-env: one per transition, an eighth more for the episodes' first frames."""
        return slots + slots // 8 + 2 * stacked_frames

    @classmethod
    def bytes_needed(cls, slots: int, num_envs: int, layout: StepLayout, stacked_frames: int) -> int:
        frame = layout.obs_dtype.itemsize * math.prod(layout.obs_shape) // stacked_frames
        rows = cls.rows_per_env(slots, stacked_frames) + 1  # and the spare row
        per_transition = 2 * 8 + transition_bytes(layout.action_shape, layout.action_dtype)  # 2 int64 serials
        # and per sub-env the int64 head and the last observation
        return num_envs * (rows * frame + slots * per_transition + 8 + stacked_frames * frame)

    @classmethod
    def memory(
        cls, capacity: int, num_envs: int, layout: StepLayout, device: Device, stacked_frames: int = 1
    ) -> ReplayMemory:
        """What a buffer built with these arguments takes, without allocating it."""
        slots = max(capacity // num_envs, 1)
        needed = cls.bytes_needed(slots, num_envs, layout, stacked_frames)
        return ReplayMemory(
            needed,
            slots * num_envs,
            replay_layout(layout.obs_shape, layout.action_shape),
            torch.device(device),
        )

    def __len__(self) -> int:
        self.drop_overwritten()
        return super().__len__()

    def store_obs(self, obs: Tensor, next_obs: Tensor) -> None:
        """Write the frames of ``obs`` and ``next_obs`` the rows do not hold yet, and their serials."""
        stacks = (self.num_envs, self.stacked_frames, -1)
        obs_words = self.words(obs.to(self.obs_dtype)).view(stacks)  # (N, k, W)
        next_words = self.words(next_obs.to(self.obs_dtype)).view(stacks)
        obs_new = torch.where(self.head < 0, self.stacked_frames, self.new_frames(self.last_words, obs_words))
        obs_serial = self.head + obs_new  # (N,)
        next_serial = obs_serial + self.new_frames(obs_words, next_words)
        self.write(obs_words, obs_serial, obs_new)
        self.write(next_words, next_serial, next_serial - obs_serial)
        self.head = next_serial
        self.last_words.copy_(next_words)
        self.obs_serial[self.position] = obs_serial
        self.next_serial[self.position] = next_serial
        self.margin -= 2 * self.stacked_frames

    def words(self, tensor: Tensor) -> Tensor:
        """``tensor`` (frames of the observation dtype, contiguous) as rows of machine words ``(-1, W)``."""
        rows = tensor.numel() // math.prod(self.frame_shape)
        return tensor.reshape(rows, -1).view(torch.uint8).view(self.word)

    def new_frames(self, previous: Tensor, current: Tensor) -> Tensor:
        """Per sub-env, the frames of ``current`` to write after ``previous`` (both ``(N, k, W)`` words): 0
        if they are equal, 1 if ``current`` is ``previous`` moved on by one frame, else k."""
        equal = (current == previous).flatten(1).all(dim=1)
        if self.stacked_frames == 1:
            return (~equal).long()
        shifted = (current[:, :-1] == previous[:, 1:]).flatten(1).all(dim=1)
        return torch.where(equal, 0, torch.where(shifted, 1, self.stacked_frames))

    def write(self, stacks: Tensor, serials: Tensor, new: Tensor) -> None:
        """Write the last ``new[i]`` frames of ``stacks[i]`` (``(N, k, W)`` words) to the rows ending at
        ``serials[i]``; the other frames go to the spare row (one index_copy_, whatever ``new`` is)."""
        keep = self.frame_index >= self.stacked_frames - new.unsqueeze(1)  # (N, k): the newest new[i]
        rows = torch.where(keep, self.frame_rows(serials), self.rows)  # (N, k)
        self.frame_words.index_copy_(0, (self.env_rows + rows).flatten(), stacks.flatten(0, 1))

    def frame_rows(self, serials: Tensor) -> Tensor:
        """The ring rows ``(..., k)`` of the observations ending at ``serials`` ``(...)``."""
        return (serials.unsqueeze(-1) + self.frame_offsets) % self.rows

    def observations(self, serials: Tensor, envs: Tensor) -> Tensor:
        """The observations ``(B, *obs_shape)`` ending at ``serials`` of sub-envs ``envs`` (both ``(B,)``)."""
        rows = self.env_rows[envs] + self.frame_rows(serials)  # (B, k)
        words = self.frame_words.index_select(0, rows.flatten())  # (B * k, W)
        return words.view(torch.uint8).view(self.obs_dtype).view(-1, *self.obs_shape)

    def stored_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.observations(self.obs_serial[slots, envs], envs)

    def stored_next_obs(self, slots: Tensor, envs: Tensor) -> Tensor:
        return self.observations(self.next_serial[slots, envs], envs)

    def sample(self, batch_size: int, gamma: float, n_step: int = 1) -> ReplayBatch:
        """A uniform batch of ``n_step``-step transitions, exactly as :meth:`ReplayBuffer.sample` draws it
        (the transitions whose rows were written over dropped first)."""
        self.drop_overwritten()
        return super().sample(batch_size, gamma, n_step)

    def drop_overwritten(self) -> None:
        """Drop the oldest transitions whose rows were written over (episodes shorter than the rows allow
        for). A host synchronisation once the rows written since the last check could have reached the
        oldest held observation (with Atari's episodes, every few thousand adds), and a binary search of a
        few more where some were."""
        if self.filled == 0 or self.margin >= 0:
            return
        if self.rows_left(0) < 0:
            broken, whole = 0, self.filled - 1  # the newest transition is always whole
            while whole - broken > 1:
                middle = (broken + whole) // 2
                broken, whole = (middle, whole) if self.rows_left(middle) < 0 else (broken, middle)
            self.filled -= whole
        self.margin = self.rows_left(0)

    def rows_left(self, age: int) -> int:
        """The rows every sub-env can still write before the ``age``-th oldest slot's observation is
        written over; negative where it already is, in some sub-env (serials only grow along a sub-env's
        slots, so the later slots' observations are then still whole)."""
        slot = (self.position - self.filled + age) % self.slots
        oldest_row = self.obs_serial[slot] + 1 - self.stacked_frames  # (N,)
        return int((oldest_row - 1 - (self.head - self.rows)).min())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stacked_frames": self.stacked_frames}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "stacked_frames" not in state:
            raise CheckpointError(
                f"CompactReplayBuffer state has {sorted(state)}, not the frames of a compact replay: the "
                "checkpoint was written by another kind of replay buffer (resume it with its own version "
                "of phalanx, or without its buffer: save_buffer = false)."
            )
        if state["stacked_frames"] != self.stacked_frames:
            raise CheckpointError(
                f"CompactReplayBuffer state has stacked_frames = {state['stacked_frames']}, but this "
                f"buffer stacks {self.stacked_frames}; resume with the observation space and frame stacking "
                "the checkpoint was written with."
            )
        super().load_state_dict(state)
        self.margin = -1


WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)
"""The integer types :class:`CompactReplayBuffer` moves frames as, widest first."""
