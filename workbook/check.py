"""Checks shared by tests, graders and notebooks: exact and relative comparisons whose failure
messages say *where* and *what* went wrong, and the exercise grader.

Exercises follow Triton-Puzzles: a statement, a stub you fill in, and ``grade(...)`` that runs on the
CPU (Triton's interpreter) and prints either a pass or a message that teaches. A grader never raises
in a notebook, so an unfinished exercise does not stop the rest of the notebook from running.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["rel_err", "assert_rel_close", "assert_exact", "mismatches", "grade"]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN anywhere gives NaN; 0/0 gives 0)."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch: out {tuple(o.shape)} vs ref {tuple(r.shape)}")
    num, den = torch.linalg.vector_norm(o - r), torch.linalg.vector_norm(r)
    if torch.isnan(num):
        return float("nan")
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return float(num / den)


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, bound: float, name: str = "output") -> float:
    """Assert ||out - ref|| / ||ref|| <= bound; NaN never passes."""
    if torch.isnan(out.detach().float()).any():
        bad = torch.isnan(out.detach().float()).nonzero()[:5].tolist()
        raise AssertionError(f"{name} contains NaN (first at {bad}): an unwritten (poisoned) element or a "
                             "numerical blow-up")
    e = rel_err(out, ref)
    if not e <= bound:
        raise AssertionError(f"{name}: relative error {e:.3e} exceeds the bound {bound:.1e}")
    return e


def mismatches(out: torch.Tensor, ref: torch.Tensor, limit: int = 8) -> tuple[int, list[str]]:
    """Count of positions where out and ref differ bitwise (NaN == NaN), and the first few, described."""
    o, r = out.detach().cpu(), ref.detach().cpu()
    if o.dtype != r.dtype:
        raise AssertionError(f"dtype mismatch: out {o.dtype} vs ref {r.dtype}")
    if o.shape != r.shape:
        raise AssertionError(f"shape mismatch: out {tuple(o.shape)} vs ref {tuple(r.shape)}")
    if o.dtype.is_floating_point:
        of, rf = o.float(), r.float()
        same = (of == rf) | (torch.isnan(of) & torch.isnan(rf))
        if o.dtype.itemsize == 1:  # fp8: compare bytes, +0/-0 and NaN encodings matter for a format
            same = o.view(torch.uint8) == r.view(torch.uint8)
    else:
        same = o == r
    bad = (~same).nonzero()
    desc = []
    for idx in bad[:limit].tolist():
        t = tuple(idx)
        desc.append(f"{list(t)}: got {_fmt(o[t])}, expected {_fmt(r[t])}")
    return int(bad.shape[0]), desc


def _fmt(x: torch.Tensor) -> str:
    if x.dtype.is_floating_point:
        if x.dtype.itemsize == 1:
            return f"{float(x):g} (0x{int(x.view(torch.uint8)):02X})"
        return f"{float(x):g}"
    v = int(x)
    return f"{v} (0x{v & ((1 << (8 * x.dtype.itemsize)) - 1):X})"


def assert_exact(out: torch.Tensor, ref: torch.Tensor, name: str = "output", hint: str = "") -> None:
    """Assert bitwise equality; the message lists the first differing positions."""
    n, desc = mismatches(out, ref)
    if n:
        raise AssertionError(f"{name}: {n} of {ref.numel()} elements differ from the reference"
                             + (f" ({hint})" if hint else "") + ":\n  " + "\n  ".join(desc))


class Verdict:
    """What :func:`grade` returns: truthy on a pass; displays nothing (the grader already printed)."""

    def __init__(self, passed: bool):
        self.passed = passed

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed})"

    def _ipython_display_(self) -> None:
        pass


def grade(title: str, check: Callable[[], object]) -> Verdict:
    """Run ``check`` (which raises AssertionError with a teaching message on a wrong answer) and print
    the verdict. Returns a truthy :class:`Verdict` on a pass. Never raises for a wrong or unfinished
    answer."""
    try:
        check()
    except NotImplementedError:
        print(f"[ ] {title}: not attempted yet (the stub raises NotImplementedError)")
        return Verdict(False)
    except AssertionError as e:
        print(f"[x] {title}: not yet.\n{e}")
        return Verdict(False)
    print(f"[ok] {title}: passed")
    return Verdict(True)
