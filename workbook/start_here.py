"""Companion of notebook 00: an environment check and the smallest launcher with a coverage argument.

:func:`iota` writes ``out[i] = i`` into a ``torch.empty`` buffer: program ``p`` of the
``cdiv(n, BLOCK)`` programs writes ``[p*BLOCK, (p+1)*BLOCK) ∩ [0, n)``, so the programs tile ``[0, n)``
exactly and no zero fill is needed (the kernel is :func:`workbook.kernels.start_here.iota_kernel`; the
launch configuration is :data:`CONFIG`). :func:`environment_report` and :func:`notebook_map` are the
notebook's first and last cells: what this machine runs, and where to go next. The exercise's grader
is in :mod:`workbook.graders.start_here`.
"""
from __future__ import annotations

import torch
import triton

from .device import DEVICE, describe, require_launchable, resolve_config
from .kernels.start_here import iota_kernel

__all__ = ["iota", "CONFIG", "environment_report", "NOTEBOOKS", "notebook_map"]

# The launch configuration of iota_kernel: BLOCK elements per program, num_warps (both powers of two).
CONFIG = {"BLOCK": 64, "num_warps": 4}


def iota(n: int, *, grid: int | None = None, config=None) -> torch.Tensor:
    """``out[i] = i`` for ``i < n``, written by a Triton kernel into a ``torch.empty`` buffer.

    ``config``: the launch configuration, ``{"BLOCK": elements per program, "num_warps": ...}`` (a dict
    or a ``triton.Config``; defaults in ``CONFIG``). ``grid`` defaults to ``cdiv(n, BLOCK)``
    programs; pass another to see what a wrong grid leaves unwritten (notebook 00's exercise).
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    cfg = resolve_config(config, CONFIG, pow2=tuple(CONFIG))
    block = cfg["BLOCK"]
    require_launchable(iota_kernel)
    # empty is right: program p writes [p*BLOCK, (p+1)*BLOCK) ∩ [0, n), and the cdiv(n, BLOCK)
    # programs tile [0, n) exactly: every element is written once. (A smaller grid breaks this.)
    out = torch.empty(n, dtype=torch.int32, device=DEVICE)
    g = triton.cdiv(n, block) if grid is None else grid
    if n and g:
        iota_kernel[(g,)](out, n, BLOCK=block, num_warps=cfg["num_warps"])
    return out


# The series, in order: notebook stem -> what a reader learns there (notebook 00's "where to go next").
NOTEBOOKS = {
    "01_allocate_then_overwrite": "what `zeros` costs and why, the caching allocator, stale bytes under CUDA graphs, "
                                  "the poison method, the decision rule",
    "02_nvfp4_quant": "NVFP4: E2M1 codes, E4M3 block scales, the swizzled 128x4 layout, and padding that a GEMM reads",
    "03_fp8_silu_mul_quant": "fused SiLU-mul + FP8 group quant with packed UE8M0 scales, a view over larger storage",
    "04_turboquant_mixed_batch": "a quantized KV cache (TurboQuant) and a mixed decode + prefill batch whose two "
                                 "kernels share one `empty` output: the disjoint-slice proof",
    "05_gated_deltanet": "Gated DeltaNet: recurrent and chunked kernels, gated RMSNorm, a redundant `zero_()`",
    "06_buffers_block_fusion": "how writing into a preallocated buffer hides a pattern from the compiler's fusion pass",
    "07_audit": "finding allocate-then-overwrite candidates in a real codebase, and proving them",
}


def notebook_map(directory=None) -> str:
    """A markdown table of the notebooks of :data:`NOTEBOOKS` that exist in ``directory`` (the
    repository's ``notebooks/``); where that folder is not there (an installed wheel), all of them."""
    from pathlib import Path

    d = Path(directory) if directory is not None else Path(__file__).resolve().parent.parent / "notebooks"
    rows = [(stem, what) for stem, what in NOTEBOOKS.items() if not d.is_dir() or (d / f"{stem}.ipynb").exists()]
    return "\n".join(["| notebook | what you learn |", "|---|---|"] + [f"| `{s}` | {w} |" for s, w in rows])


def environment_report() -> str:
    """Where kernels run (GPU, or the Triton interpreter on the CPU), the versions, and whether a Triton
    kernel ran and wrote the right values: notebook 00's first cell."""
    d = describe()
    lines = [f"kernels run on: {d['device']}" + (" (Triton interpreter: no GPU here)" if d["interpreted"] else "")]
    if d.get("gpu"):
        lines.append(f"GPU: {d['gpu']} ({d['sm_count']} SMs, {d['gpu_memory_GiB']} GiB), CUDA {d['cuda']}")
    lines.append(f"torch {d['torch']}, Triton {d['triton']}, Python {d['python']}")
    ok = torch.equal(iota(100, config={"BLOCK": 32}).cpu(), torch.arange(100, dtype=torch.int32))
    lines.append("a Triton kernel ran and wrote the right values: " + ("yes" if ok else "NO"))
    return "\n".join(lines)
