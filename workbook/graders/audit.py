"""Notebook 07's exercise graders and their reference solutions.

Exercise 1: a verdict for each candidate that ``python -m workbook audit`` reports on the sample
engine (``notebooks/audit_sample``), as the notebook's proofs establish them (:func:`check_verdicts`,
:data:`SAMPLE_VERDICTS`, :func:`solution_verdicts`). Exercise 2: a mixed-batch writer that allocates
with ``torch.empty`` and writes every row (:func:`check_mixed_batch_writer`,
:func:`solution_mixed_batch_writer`; :func:`mixed_batch_reference` is what it must return): a
zero fill of the output gets the words of every exercise that asks for ``torch.empty``
(:func:`.common.zero_fill_message`), and :func:`workbook.coverage.coverage` proves the coverage. Each grader raises ``AssertionError`` with a message that teaches (notebooks
call it through :func:`workbook.check.grade`).
"""
from __future__ import annotations

import math

import torch

from ..coverage import coverage
from .common import GuardedAllocations, check_zero_fills

__all__ = ["SAMPLE_VERDICTS", "check_verdicts", "solution_verdicts", "mixed_batch_reference",
           "check_mixed_batch_writer", "solution_mixed_batch_writer", "MIXED_BATCH_CASES"]

#: What the proofs in notebook 07 establish for each candidate of the sample engine
#: (notebooks/audit_sample): 'empty' = the zero fill is redundant, 'zeros' = keep it, 'fix' = an
#: ``empty`` buffer that is not fully written: the writer (or the allocation) must change.
SAMPLE_VERDICTS = {
    "scale_rows": ("empty", "scale_rows_kernel stores every element of every row (grid M, mask N): poisoning "
                   "the zeros_like changes no output."),
    "new_output": ("empty", "its one caller launches scale_rows_kernel on the buffer, which writes all of it."),
    "gate_into": ("empty", "z_out[:] = sigmoid(z) writes every element right after the zero_()."),
    "row_scales": ("zeros", "row_amax_kernel writes rows [0, M) only, and group_scales reads whole groups of "
                   "GROUP rows, padding rows included: poisoned, the padding changes the consumer's result "
                   "(keep zeros, or make the kernel write the padding)."),
    "token_histogram": ("zeros", "histogram_kernel atomic_adds into counts: it reads the buffer, so the zeros "
                        "are the starting value of the count (coverage calls that 'read before written')."),
    "expert_sums": ("zeros", "index_add_ accumulates into acc: the zeros are part of the result."),
    "project_tokens": ("fix", "out is empty and only out[:num_tokens] is written: rows num_tokens.. hold "
                       "garbage that the caller receives. Allocate num_tokens rows, or write the padding."),
}
_CHOICES = ("empty", "zeros", "fix")


def solution_verdicts() -> dict[str, str]:
    """The answer of exercise 1: {function name: verdict} of :data:`SAMPLE_VERDICTS`."""
    return {k: v for k, (v, _) in SAMPLE_VERDICTS.items()}


def check_verdicts(fn) -> None:
    """Grader of exercise 1: ``fn()`` returns {function name: 'empty' | 'zeros' | 'fix'} for the
    seven candidates of the sample engine."""
    got = fn()
    if not isinstance(got, dict):
        raise AssertionError(f"return a dict {{function name: verdict}}, got {type(got).__name__}")
    missing = sorted(set(SAMPLE_VERDICTS) - set(got))
    if missing:
        raise AssertionError(f"give a verdict for every candidate; missing: {missing}")
    bad_value = {k: v for k, v in got.items() if v not in _CHOICES}
    if bad_value:
        raise AssertionError(f"each verdict is one of {_CHOICES}; got {bad_value}")
    wrong = [(k, got[k]) for k in SAMPLE_VERDICTS if got[k] != SAMPLE_VERDICTS[k][0]]
    if wrong:
        lines = []
        for k, v in wrong:
            want, why = SAMPLE_VERDICTS[k]
            lead = {("empty", "zeros"): f"{k}: 'empty' would change results.",
                    ("zeros", "empty"): f"{k}: the zero fill is a memset for nothing.",
                    ("empty", "fix"): f"{k}: 'empty' is what it does now, and that is the bug (expected 'fix').",
                    ("zeros", "fix"): f"{k}: a zero fill would only hide the unwritten rows: the caller still "
                                      "receives rows it did not ask for (expected 'fix').",
                    ("fix", "empty"): f"{k}: nothing to fix: the writer covers the whole buffer (expected 'empty').",
                    ("fix", "zeros"): f"{k}: nothing to fix: the zeros are read on purpose (expected 'zeros')."
                    }.get((v, want), f"{k}: '{v}' is not it (expected '{want}').")
            lines.append(f"{lead} {why}")
        raise AssertionError(f"{len(wrong)} of {len(SAMPLE_VERDICTS)} verdicts are wrong:\n  " + "\n  ".join(lines))


def mixed_batch_reference(decode_out, prefill_out):
    """What the mixed-batch writer of exercise 2 must return: decode rows first, then prefill rows."""
    return torch.cat([decode_out, prefill_out])


def solution_mixed_batch_writer(decode_out, prefill_out):
    """The answer of exercise 2: one ``torch.empty`` output, decode rows [0, nd) then prefill rows
    [nd, nd + npf): two disjoint slices that together cover every row, so no zero fill is needed."""
    nd = decode_out.shape[0]
    # empty is right: rows [0, nd) and [nd, nd + npf) are disjoint and together cover every row
    out = torch.empty(nd + prefill_out.shape[0], decode_out.shape[1], dtype=decode_out.dtype,
                      device=decode_out.device)
    out[:nd] = decode_out
    out[nd:] = prefill_out
    return out


MIXED_BATCH_CASES = [(3, 5, 4, torch.float32), (1, 0, 8, torch.float32), (0, 4, 2, torch.bfloat16),
                     (6, 1, 3, torch.float16)]   # (nd, npf, D, dtype): an empty side, and half precisions


def check_mixed_batch_writer(fn) -> None:
    """Grader of exercise 2: ``fn(decode_out [nd, D], prefill_out [npf, D])`` allocates its output
    with ``torch.empty`` (the inputs' dtype) and writes decode rows then prefill rows, covering every
    row; no zero fill (:func:`.common.zero_fill_message`). Graded with an empty decode side, an empty
    prefill side, and bf16 and fp16 inputs (an output that does not keep their dtype is named)."""
    gen = torch.Generator().manual_seed(7)
    for nd, npf, d, dtype in MIXED_BATCH_CASES:
        dec = torch.randn(nd, d, generator=gen).to(dtype)
        pre = torch.randn(npf, d, generator=gen).to(dtype)
        case = f"nd={nd}, npf={npf}, D={d}, {str(dtype).replace('torch.', '')}"
        with GuardedAllocations() as mode:
            got = fn(dec, pre)
        check_zero_fills(mode, [("out", got)], case, {"out": (
            "rows [0, nd) from the decode path and rows [nd, nd + npf) from the prefill path are disjoint "
            "and together cover every row")}, twice="every row")
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{case}: return one tensor, the [nd + npf, D] output, got {type(got).__name__}")
        if got.dtype != dtype:
            raise AssertionError(f"{case}: the output is {str(got.dtype).replace('torch.', '')}, the inputs are "
                                 f"{str(dtype).replace('torch.', '')}: allocate with the inputs' dtype "
                                 "(torch.empty(..., dtype=decode_out.dtype, device=decode_out.device)); a "
                                 "copy into another dtype rounds or widens every row.")
        if tuple(got.shape) != (nd + npf, d):
            raise AssertionError(f"{case}: the output must be [nd + npf, D] = [{nd + npf}, {d}], got "
                                 f"{list(got.shape)}: one row per token, decode rows then prefill rows"
                                 + (" (rows past nd + npf are padding that nobody writes, and the caller receives "
                                    "them: the reverse risk of project_tokens)" if got.shape[0] > nd + npf else ""))
        covs = coverage(fn, dec, pre, names=["out"])
        c = covs[0]
        n = math.prod(c.storage_shape)
        if n != (nd + npf) * d:
            raise AssertionError(f"{case}: the buffer's storage has {n} elements; allocate exactly "
                                 f"nd + npf = {nd + npf} rows of {d} (a padded batch leaves rows nobody writes: "
                                 f"{c.unwritten_ranges('storage')})")
        if not c.storage_fully_written:
            raise AssertionError(f"{case}: elements never written (poison survives): "
                                 f"{c.unwritten_ranges('storage')}. The decode rows are [0, nd) and the prefill rows "
                                 "[nd, nd + npf): the two slices must meet exactly at nd.")
        ref = mixed_batch_reference(dec, pre)
        if not torch.equal(got, ref):
            raise AssertionError(f"{case}: every row is written, but not with the right rows: decode "
                                 "outputs go first (rows [0, nd)), then prefill outputs (rows [nd, nd + npf)).")
