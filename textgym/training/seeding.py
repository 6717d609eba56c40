"""Seeds and devices: the global RNGs every trainer seeds, and what "auto" means for a device."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(device: str) -> torch.device:
    """Map "auto" to cuda when available, else cpu; pass other strings through."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
