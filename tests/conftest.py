"""Shared test settings."""

import os

import torch

# One intra-op thread: on a loaded 2-core machine torch's OpenMP threads spin against each other and
# small batched steps can run tens of times slower; tests measure behaviour, not speed.
torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")
