"""Companion of notebook 00: an environment check and the smallest launcher with a coverage argument."""
from __future__ import annotations

import torch
import triton

from .device import DEVICE, describe, require_launchable, resolve_config
from .kernels.start_here import iota_kernel

__all__ = ["iota", "DEFAULT_CONFIG", "environment_report", "check_iota_grid", "GRID_CASES", "NOTEBOOKS", "notebook_map"]


DEFAULT_CONFIG = {"BLOCK": 64, "num_warps": 4}


def _launch_config(config) -> dict:
    """``DEFAULT_CONFIG`` overridden by ``config`` (a dict or a ``triton.Config`` with those names)."""
    return resolve_config(config, DEFAULT_CONFIG, pow2=tuple(DEFAULT_CONFIG))


def iota(n: int, *, grid: int | None = None, config=None) -> torch.Tensor:
    """``out[i] = i`` for ``i < n``, written by a Triton kernel into a ``torch.empty`` buffer.

    ``config``: the launch configuration, ``{"BLOCK": elements per program, "num_warps": ...}`` (a dict
    or a ``triton.Config``; defaults in ``DEFAULT_CONFIG``). ``grid`` defaults to ``cdiv(n, BLOCK)``
    programs; pass another to see what a wrong grid leaves unwritten (notebook 00's exercise).
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    cfg = _launch_config(config)
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
    d = describe()
    lines = [f"kernels run on: {d['device']}" + (" (Triton interpreter: no GPU here)" if d["interpreted"] else "")]
    if d.get("gpu"):
        lines.append(f"GPU: {d['gpu']} ({d['sm_count']} SMs, {d['gpu_memory_GiB']} GiB), CUDA {d['cuda']}")
    lines.append(f"torch {d['torch']}, Triton {d['triton']}, Python {d['python']}")
    ok = torch.equal(iota(100, config={"BLOCK": 32}).cpu(), torch.arange(100, dtype=torch.int32))
    lines.append("a Triton kernel ran and wrote the right values: " + ("yes" if ok else "NO"))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Exercise grader (raises AssertionError with a message that teaches; see workbook.check.grade)
# --------------------------------------------------------------------------------------------------

GRID_CASES = [(1, 64), (64, 64), (65, 64), (200, 64), (1000, 128)]


def check_iota_grid(fn) -> None:
    """Grader of exercise 0: ``fn(n, block)`` -> the number of programs that writes each of the ``n``
    elements exactly once, with no program entirely past the end (``triton.cdiv(n, block)``)."""
    import operator

    from .coverage import coverage

    for n, block in GRID_CASES:
        g = fn(n, block)
        try:
            g = operator.index(g)  # int, numpy integer, 0-d integer tensor
        except TypeError:
            raise AssertionError(
                f"n={n}, block={block}: return a whole number of programs (an int), got {g!r} "
                f"({type(g).__name__}). n / block is a float: round it up to an int "
                "(math.ceil, or triton.cdiv(n, block) which stays in integers).") from None
        if g < 0:
            raise AssertionError(f"n={n}, block={block}: grid={g}: a grid counts programs, it cannot be negative.")
        if g > 0 and (g - 1) * block >= n:
            raise AssertionError(
                f"n={n}, block={block}: grid={g} launches {g - triton.cdiv(n, block)} program(s) that start at "
                f"or past element n={n}: they own no element and write nothing (harmless, but wasted). "
                "The smallest G with G * block >= n is enough: when n is a multiple of block, n // block "
                "programs already cover it.")
        cov = coverage(iota, n, grid=g, config={"BLOCK": block})[0]
        if not cov.view_fully_written:
            raise AssertionError(
                f"n={n}, block={block}: grid={g} leaves {cov.unwritten_ranges('view')} unwritten. Those "
                "elements keep whatever torch.empty handed out. Round the division UP.")
