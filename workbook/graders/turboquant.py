"""Notebook 04's exercise graders and their reference solutions.

Exercise 1: the 4-bit uniform value quantizer (:func:`check_value_quant`, :func:`solution_value_quant`;
the finished one is :func:`workbook.turboquant.quantize_values`). Exercise 2: the rows of ``attn_out``
that neither the decode nor the prefill path writes (:func:`check_unwritten_rows`,
:func:`solution_unwritten_rows`). Exercise 3: the log-sum-exp merge of split-KV outputs
(:func:`check_merge_splits`, :func:`merge_splits_reference`). Each grader raises ``AssertionError`` with
a message that teaches (notebooks call it through :func:`workbook.check.grade`).
"""
from __future__ import annotations

import math

import torch

from ..turboquant import quantize_values

__all__ = ["check_value_quant", "check_unwritten_rows", "check_merge_splits", "merge_splits_reference",
           "solution_value_quant", "solution_unwritten_rows", "solution_merge_splits"]


def solution_value_quant(v: torch.Tensor):
    """Exercise 1's solution: (codes uint8 [M, D], scale fp16 [M], zero fp16 [M]) with 15 steps between
    each row's min and max, coded with the fp16-rounded scale and zero, code 0 for a constant row."""
    vmax, vmin = v.amax(-1), v.amin(-1)
    scale, zero = ((vmax - vmin) / 15).half(), vmin.half()
    s = scale.float()[:, None]
    q = torch.floor((v - zero.float()[:, None]) / torch.where(s > 0, s, torch.ones_like(s)) + 0.5).clamp(0, 15)
    return torch.where(s > 0, q, torch.zeros_like(q)).to(torch.uint8), scale, zero


def solution_unwritten_rows(query_start_loc, num_decode_reqs: int, num_rows: int) -> list:
    """Exercise 2's solution: the decode rows [0, nd) and prefill rows [nd, qsl[-1]) are all written;
    rows [qsl[-1], num_rows) have no writer."""
    return list(range(query_start_loc[-1], num_rows))


def check_value_quant(fn) -> None:
    """Exercise 1: fn(v float32 [M, D]) -> (codes uint8 [M, D] in 0..15, scale fp16 [M], zero fp16 [M])."""
    g = torch.Generator().manual_seed(11)
    v = torch.randn(6, 32, generator=g) * torch.tensor([1, 0.01, 100, 1, 3, 1.0])[:, None]
    v[3] = 0.25  # a constant row: scale 0
    ref = quantize_values(v)
    got = fn(v.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError(f"return (codes, scale, zero), got {type(got).__name__}")
    codes, scale, zero = got
    for name, t, dt, shape in (("codes", codes, torch.uint8, (6, 32)), ("scale", scale, torch.float16, (6,)),
                               ("zero", zero, torch.float16, (6,))):
        if not isinstance(t, torch.Tensor) or t.dtype != dt or tuple(t.shape) != shape:
            raise AssertionError(f"{name} must be {str(dt)[6:]} {shape}, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if not torch.equal(zero, ref.zero):
        raise AssertionError("zero must be the row minimum rounded to fp16, so that the smallest value gets code 0")
    if not torch.equal(scale, ref.scale):
        r = int((scale != ref.scale).nonzero()[0])
        hint = ""
        if abs(float(scale[r]) * 16 / 15 - float(ref.scale[r])) < 1e-2 * float(ref.scale[r]):
            hint = " 4 bits give 16 codes 0..15, so 15 steps between min and max: scale = (max - min) / 15."
        raise AssertionError(f"row {r}: scale {float(scale[r]):g}, expected {float(ref.scale[r]):g}.{hint}")
    if int(codes.max()) > 15:
        raise AssertionError("codes must fit in 4 bits (0..15): clamp after rounding")
    bad = (codes != ref.codes).nonzero()
    if bad.numel():
        r, c = bad[0].tolist()
        x = float((v[r, c] - ref.zero[r].float()) / ref.scale[r].float()) if ref.scale[r] else 0.0
        hint = ""
        if r == 3:
            hint = " A constant row has scale 0: give it code 0 (dividing by 0 gives NaN)."
        elif int(codes[r, c]) == math.floor(x):
            hint = " Round to the nearest code (floor(x + 1/2)), do not truncate."
        else:
            hint = " Code with the fp16-rounded scale and zero (the ones stored), or dequantization drifts."
        raise AssertionError(f"{len(bad)} codes differ; first at [{r}, {c}]: got {int(codes[r, c])}, expected "
                             f"{int(ref.codes[r, c])} ((v - zero) / scale = {x:.3f}).{hint}")


def check_unwritten_rows(fn) -> None:
    """Exercise 2: fn(query_start_loc list, num_decode_reqs, num_rows) -> sorted list of the rows of
    attn_out that neither the decode path nor the prefill path writes."""
    cases = [([0, 1, 2, 7], 2, 7, []), ([0, 5, 9], 0, 12, [9, 10, 11]), ([0, 1, 2, 7], 2, 8, [7]),
             ([0, 1, 2, 3], 3, 3, []), ([0, 1, 2, 3], 3, 4, [3]), ([0, 4], 0, 4, [])]
    for qsl, nd, n, want in cases:
        got = fn(list(qsl), nd, n)
        try:
            got = sorted(int(x) for x in got)
        except TypeError:
            raise AssertionError(f"return a list of row indices, got {got!r}") from None
        if got != want:
            hint = ""
            if want and got and got == list(range(want[0] + 1, n)):
                hint = " Off by one: query_start_loc[-1] itself is the first row nobody writes."
            elif not got and want:
                hint = (" Rows past query_start_loc[-1] (padding added for a CUDA graph) have no writer: "
                        "torch.empty leaves garbage there.")
            elif got and not want:
                hint = " The decode rows [0, nd) and prefill rows [nd, qsl[-1]) are all written."
            raise AssertionError(f"query_start_loc={qsl}, num_decode_reqs={nd}, attn_out rows={n}: got {got}, "
                                 f"expected {want}.{hint}")


def merge_splits_reference(outs: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """outs [S, D] (each split's normalized output), lse2 [S] (log2 of each split's sum of 2^score;
    -inf for an empty split) -> the merged output [D]."""
    w = torch.exp2(lse2 - lse2.max())
    return (w[:, None] * outs).sum(0) / w.sum()


def check_merge_splits(fn) -> None:
    """Exercise 3: fn(outs [S, D], lse2 [S]) -> [D], the log-sum-exp merge of split outputs."""
    g = torch.Generator().manual_seed(3)
    for S, D, empty in ((2, 4, False), (5, 8, False), (4, 8, True)):
        outs = torch.randn(S, D, generator=g, dtype=torch.float64)
        lse = torch.randn(S, generator=g, dtype=torch.float64) * 4 + 30
        if empty:
            outs[1] = 0.0
            lse[1] = float("-inf")
        ref = merge_splits_reference(outs, lse)
        got = fn(outs.clone(), lse.clone())
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (D,):
            raise AssertionError(f"return a tensor [D={D}], got {getattr(got, 'shape', type(got).__name__)}")
        got = got.double()
        if torch.isnan(got).any():
            raise AssertionError(f"S={S}: NaN in the result. An empty split has lse = -inf: subtract the MAX lse "
                                 "(finite) before exponentiating, so its weight is exactly 0.")
        if not torch.allclose(got, ref, rtol=1e-9, atol=1e-12):
            hint = ""
            if torch.allclose(got, outs.mean(0)) or torch.allclose(got, outs[~torch.isinf(lse)].mean(0)):
                hint = " A plain average ignores how much softmax mass each split holds: weight by 2^lse."
            else:
                w = torch.exp(lse - lse.max())
                if torch.allclose(got, (w[:, None] * outs).sum(0) / w.sum()):
                    hint = " The lse here is in base 2 (the kernels use exp2): weight by 2^(lse - max), not e^."
            raise AssertionError(f"S={S}, D={D}: got {got.tolist()[:3]}..., expected {ref.tolist()[:3]}...{hint}")


solution_merge_splits = merge_splits_reference   # Exercise 3's solution
