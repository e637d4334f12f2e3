"""phalanx: massively parallel deep reinforcement learning in PyTorch."""

__version__ = "0.1.0"
