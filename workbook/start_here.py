"""Companion of notebook 00: an environment check and the smallest launcher with a coverage argument."""
from __future__ import annotations

import torch
import triton

from .device import DEVICE, describe, require_launchable
from .kernels.start_here import iota_kernel

__all__ = ["iota", "environment_report"]


def iota(n: int, *, block: int = 64, grid: int | None = None) -> torch.Tensor:
    """``out[i] = i`` for ``i < n``, written by a Triton kernel into a ``torch.empty`` buffer.

    ``grid`` defaults to ``cdiv(n, block)`` programs; pass another to see what a wrong grid leaves
    unwritten (notebook 00's exercise).
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if block <= 0 or block & (block - 1):
        raise ValueError(f"block must be a power of two (Triton's tl.arange), got {block}")
    require_launchable(iota_kernel)
    # empty is right: program p writes [p*block, (p+1)*block) ∩ [0, n), and the cdiv(n, block)
    # programs tile [0, n) exactly: every element is written once. (A smaller grid breaks this.)
    out = torch.empty(n, dtype=torch.int32, device=DEVICE)
    g = triton.cdiv(n, block) if grid is None else grid
    if n and g:
        iota_kernel[(g,)](out, n, BLOCK=block)
    return out


def environment_report() -> str:
    d = describe()
    lines = [f"kernels run on: {d['device']}" + (" (Triton interpreter: no GPU here)" if d["interpreted"] else "")]
    if d.get("gpu"):
        lines.append(f"GPU: {d['gpu']} ({d['sm_count']} SMs, {d['gpu_memory_GiB']} GiB), CUDA {d['cuda']}")
    lines.append(f"torch {d['torch']}, Triton {d['triton']}, Python {d['python']}")
    ok = torch.equal(iota(100, block=32).cpu(), torch.arange(100, dtype=torch.int32))
    lines.append("a Triton kernel ran and wrote the right values: " + ("yes" if ok else "NO"))
    return "\n".join(lines)
