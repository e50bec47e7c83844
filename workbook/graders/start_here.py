"""Notebook 00's exercise grader and its reference solution.

Exercise 0: the launch grid of :func:`workbook.start_here.iota`, the number of programs that writes each
of the ``n`` elements exactly once (:func:`check_iota_grid`, :func:`solution_iota_grid`); the grader
runs ``iota`` with that grid on poisoned buffers (:func:`workbook.coverage.coverage`) for each case of
:data:`GRID_CASES`. It raises ``AssertionError`` with a message that teaches (notebooks call it through
:func:`workbook.check.grade`).
"""
from __future__ import annotations

import operator

import triton

from ..coverage import coverage
from ..start_here import iota

__all__ = ["GRID_CASES", "check_iota_grid", "solution_iota_grid"]

GRID_CASES = [(1, 64), (64, 64), (65, 64), (200, 64), (1000, 128)]   # (n, block)


def solution_iota_grid(n: int, block: int) -> int:
    """The answer of exercise 0: the smallest number of programs of ``block`` elements that covers
    ``n`` elements, ``triton.cdiv(n, block)``."""
    return (n + block - 1) // block


def check_iota_grid(fn) -> None:
    """Grader of exercise 0: ``fn(n, block)`` -> the number of programs that writes each of the ``n``
    elements exactly once, with no program entirely past the end (``triton.cdiv(n, block)``)."""
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
