"""Allocation helpers of the sample engine."""
import torch


def new_output(x: torch.Tensor) -> torch.Tensor:
    """A fresh output buffer shaped like ``x``."""
    return torch.zeros_like(x)
