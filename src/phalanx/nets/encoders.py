"""Observation encoders: CNNs for images and the encoder of Dict observations.

An encoder turns observations ``(B, *obs_shape)`` (any dtype: uint8 images stay uint8 until here) into
float features ``(B, out_dim)`` for the MLP heads. A 1-D Box needs none: its observations are the
features. :func:`feature_encoder` picks one for a space.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from phalanx.config import ENCODERS
from phalanx.errors import ConfigError
from phalanx.nets.mlp import HIDDEN_GAIN, layer_init
from phalanx.nets.spaces import image_layout, is_image_space, obs_dim

Tensor = torch.Tensor


class ImageEncoder(nn.Module):
    """Base of the CNN encoders: converts a batch of images to float ``(B, C, H, W)``, scaled to [0, 1]
    when the space is uint8 (so that buffers keep 1 byte a pixel), then ``self.body`` gives features."""

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__()
        (self.channels, self.height, self.width), self.channels_last = image_layout(space)
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        self.image_shape = tuple(int(size) for size in space.shape)
        self.body: nn.Module = nn.Identity()
        self.out_dim = 0

    def require_size(self, space: gym.spaces.Box, name: str, minimum: int, fix: str) -> None:
        """A ConfigError, ending with ``fix``, for images smaller than ``minimum`` x ``minimum``."""
        if self.height < minimum or self.width < minimum:
            raise ConfigError(
                f"the {name} CNN needs images of at least {minimum}x{minimum} pixels, but the observation "
                f"space {space} holds {self.height}x{self.width} images. {fix}"
            )

    def images(self, obs: Tensor) -> tuple[Tensor, torch.Size]:
        """Observations ``(B, *image_shape)`` as float ``(B, C, H, W)`` in the encoder's scale."""
        x = obs.to(torch.float32)
        if self.scale != 1.0:
            x = x * self.scale
        batch = x.shape[: x.dim() - len(self.image_shape)]
        x = x.reshape(-1, *self.image_shape)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        elif len(self.image_shape) == 2:
            x = x.unsqueeze(1)
        return x, batch

    def forward(self, obs: Tensor) -> Tensor:
        x, batch = self.images(obs)
        return self.body(x).reshape(*batch, self.out_dim)


def conv_init(layer: nn.Conv2d, gain: float = HIDDEN_GAIN) -> nn.Conv2d:
    """Orthogonal weight with ``gain``, zero bias (as :func:`layer_init`)."""
    nn.init.orthogonal_(layer.weight, gain)
    assert layer.bias is not None, "the CNNs' convolutions have biases"
    nn.init.zeros_(layer.bias)
    return layer


class NatureCNN(ImageEncoder):
    """The CNN of Mnih et al. (2015): 32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1, ReLU, then a
    linear layer of ``features`` (512) units with ReLU. Images must be at least 36x36. ``layer_norm``: a
    LayerNorm over each convolution's whole output (C, H, W) and over the linear layer's, before each ReLU
    (PQN's Q-network)."""

    def __init__(self, space: gym.spaces.Box, features: int = 512, layer_norm: bool = False) -> None:
        super().__init__(space)
        self.require_size(space, "nature", 36, "Use encoder 'impala' (any size >= 8x8) instead.")
        layers: list[nn.Module] = []
        shape = (self.channels, self.height, self.width)
        for out_channels, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            convolution = conv_init(nn.Conv2d(shape[0], out_channels, kernel, stride=stride))
            shape = (out_channels, (shape[1] - kernel) // stride + 1, (shape[2] - kernel) // stride + 1)
            layers += [convolution, *normalized(shape, layer_norm), nn.ReLU()]
        convolutions = nn.Sequential(*layers, nn.Flatten())
        flat = shape[0] * shape[1] * shape[2]
        linear = layer_init(nn.Linear(flat, features), HIDDEN_GAIN)
        self.body = nn.Sequential(convolutions, linear, *normalized((features,), layer_norm), nn.ReLU())
        self.out_dim = features


def normalized(shape: tuple[int, ...], layer_norm: bool) -> list[nn.Module]:
    """A LayerNorm over the trailing ``shape`` of a layer's output where ``layer_norm`` asks for it."""
    return [nn.LayerNorm(list(shape))] if layer_norm else []


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = conv_init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = conv_init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(ImageEncoder):
    """The IMPALA ResNet (Espeholt et al., 2018): per stack of ``channels`` (16, 32, 32), a 3x3 convolution,
    3x3 max-pool stride 2 and two residual blocks; then ReLU and a linear layer of ``features`` (256)
    units with ReLU. Images must be at least 8x8. ``layer_norm``: a LayerNorm over each stack's output
    (C, H, W) and over the linear layer's, before its ReLU."""

    def __init__(
        self,
        space: gym.spaces.Box,
        channels: Sequence[int] = (16, 32, 32),
        features: int = 256,
        layer_norm: bool = False,
    ) -> None:
        super().__init__(space)
        self.require_size(space, "impala", 8, "Flatten such small observations and use encoder 'mlp'.")
        layers: list[nn.Module] = []
        height, width = self.height, self.width
        in_channels = self.channels
        for out_channels in channels:
            height, width = (height + 1) // 2, (width + 1) // 2  # the max-pool's output
            layers += [
                conv_init(nn.Conv2d(in_channels, out_channels, 3, padding=1)),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(out_channels),
                _ResidualBlock(out_channels),
                *normalized((out_channels, height, width), layer_norm),
            ]
            in_channels = out_channels
        convolutions = nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
        flat = in_channels * height * width
        linear = layer_init(nn.Linear(flat, features), HIDDEN_GAIN)
        self.body = nn.Sequential(convolutions, linear, *normalized((features,), layer_norm), nn.ReLU())
        self.out_dim = features


class MinAtarCNN(ImageEncoder):
    """The network of the MinAtar paper (Young and Tian, 2019), which purejaxql's PQN uses on MinAtar: 16
    3x3 convolutions (stride 1, no padding), ReLU, then a linear layer of ``features`` (128) units with
    ReLU; with ``layer_norm``, a LayerNorm before each ReLU. Images must be at least 3x3."""

    def __init__(self, space: gym.spaces.Box, features: int = 128, layer_norm: bool = False) -> None:
        super().__init__(space)
        self.require_size(space, "minatar", 3, "Flatten them and use encoder 'mlp'.")
        shape = (16, self.height - 2, self.width - 2)
        convolution = conv_init(nn.Conv2d(self.channels, shape[0], 3))
        convolutions = nn.Sequential(convolution, *normalized(shape, layer_norm), nn.ReLU(), nn.Flatten())
        linear = layer_init(nn.Linear(shape[0] * shape[1] * shape[2], features), HIDDEN_GAIN)
        self.body = nn.Sequential(convolutions, linear, *normalized((features,), layer_norm), nn.ReLU())
        self.out_dim = features


class DictEncoder(nn.Module):
    """Dict observations, which arrive flattened (``gymnasium.spaces.flatten``'s order: the parts by
    sorted key, each flattened): the vector is split into its parts, image parts go through a CNN of
    ``kind`` (their own), flat parts are passed as they are, and the features are concatenated."""

    def __init__(self, space: gym.spaces.Dict, kind: str = "auto", layer_norm: bool = False) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.parts = nn.ModuleList()
        self.out_dim = 0
        for name, part in space.spaces.items():
            size = int(gym.spaces.flatdim(part))
            if is_image_space(part):
                image_encoder = _image_encoder(part, kind, f"Dict part {name!r}", layer_norm)
                self.out_dim += image_encoder.out_dim
                encoder: nn.Module = image_encoder
            elif isinstance(part, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiBinary):
                encoder = nn.Identity()
                self.out_dim += size
            else:
                raise ConfigError(
                    f"Dict observation part {name!r} is {part}, which phalanx cannot encode; supported "
                    "parts: Box (vectors and images), Discrete (one-hot), MultiBinary. Convert that part"
                    " with a Gymnasium observation wrapper, or leave it out."
                )
            self.sizes.append(size)
            self.parts.append(encoder)

    def forward(self, obs: Tensor) -> Tensor:
        pieces = torch.split(obs, self.sizes, dim=-1)
        return torch.cat([encoder(piece) for encoder, piece in zip(self.parts, pieces, strict=True)], dim=-1)


def _image_encoder(space: gym.spaces.Box, kind: str, where: str, layer_norm: bool) -> ImageEncoder:
    if kind == "auto":
        height, width = image_layout(space)[0][1:]
        kind = "nature" if min(height, width) >= 36 else "impala"
    if kind == "impala":
        return ImpalaCNN(space, layer_norm=layer_norm)
    if kind == "nature":  # asked for: a ConfigError for images under 36x36, not another CNN
        return NatureCNN(space, layer_norm=layer_norm)
    if kind == "minatar":
        return MinAtarCNN(space, layer_norm=layer_norm)
    raise ConfigError(
        f"encoder {kind!r} cannot read the images of {where} ({space}): an MLP needs flat vectors. Use "
        "encoder 'auto' (a CNN chosen for the image size), 'nature', 'impala' or 'minatar'."
    )


def feature_encoder(
    space: gym.Space, kind: str = "auto", layer_norm: bool = False
) -> tuple[nn.Module | None, int]:
    """The encoder of observations of ``space`` and the size of its features: ``(None, obs_dim)`` for a
    1-D Box (its observations are the features); a CNN for images (``auto``: Nature for 36x36 or more,
    IMPALA below), with LayerNorms where ``layer_norm`` asks; a :class:`DictEncoder` for a Dict. A
    ConfigError names the space and the fix where ``kind`` cannot read it."""
    if kind not in ENCODERS:
        raise ConfigError(f"unknown encoder {kind!r}; valid encoders: {', '.join(ENCODERS)}.")
    if isinstance(space, gym.spaces.Dict):
        dict_encoder = DictEncoder(space, kind, layer_norm)
        return dict_encoder, dict_encoder.out_dim
    if is_image_space(space):
        image_encoder = _image_encoder(space, kind, "the observation space", layer_norm)
        return image_encoder, image_encoder.out_dim
    if kind in ("nature", "impala", "minatar"):
        raise ConfigError(
            f"encoder {kind!r} is a CNN for images, but the observation space {space} is not an image space "
            "((C, H, W) or (H, W, C) Box). Use encoder 'auto' or 'mlp'."
        )
    return None, obs_dim(space)
