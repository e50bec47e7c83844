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


def _tricky_value_rows() -> tuple:
    """Exercise 1's hand-made rows [6, 32] and, per row, (name, what it teaches): values exactly halfway
    between two codes, codes that move when scale or zero is not rounded to fp16 first, constant rows."""
    rows, notes = [], []
    tie = torch.tensor([0.0, 15.0] + [k + 0.5 for k in range(15)] * 2)  # scale 1, zero 0: x = k + 1/2
    rows.append(tie)
    notes.append(("values exactly halfway between two codes", " Halfway goes UP: code = floor(x + 0.5). "
                  "torch.round (and Python's round) round half to EVEN, which gives the even neighbour."))
    rows.append(tie * 0.25 - 2.0)  # scale 0.25, zero -2: all exact, x = k + 1/2 again
    notes.append(("halfway values with an offset", notes[0][1]))
    s32 = torch.tensor(1.5) / 15  # 0.1 in float32, stored as fp16 0.0999756
    s16 = s32.half().float()
    mids = [(k - 0.5) * (s32 + s16) / 2 for k in range(1, 16)]  # between the two rounding boundaries
    rows.append(torch.stack([torch.tensor(0.0), torch.tensor(1.5)] + mids + mids))
    notes.append(("scale 0.1 stored as fp16 0.0999756", " Code with the fp16-rounded scale (the one stored "
                  "and used to dequantize): round scale to fp16 BEFORE coding; here values near a code "
                  "boundary land on the other side with the float32 scale."))
    g = torch.Generator().manual_seed(5)
    off = 1000.3 + torch.rand(32, generator=g) * 1.5  # zero 1000.3 is stored as 1000.5: 2 codes away
    off[0], off[1] = 1000.3, 1001.8
    rows.append(off)
    notes.append(("large offset, min 1000.3 stored as fp16 1000.5", " Code with the fp16-rounded zero "
                  "(the one stored): round zero to fp16 BEFORE coding; here the float32 min is 2 codes away "
                  "from the stored zero, so every code shifts."))
    const = (" A constant row has scale 0: give it code 0. Its v is not exactly its fp16 zero here, so "
             "(v - zero) / 0 = +inf (not NaN) and clamps to 15: test scale == 0 itself.")
    rows.append(torch.full((32,), 0.1))
    notes.append(("constant row 0.1, zero stored as 0.0999756", const))
    rows.append(torch.full((32,), -1000.3))
    notes.append(("constant row -1000.3, zero stored as -1000.5", const))
    return torch.stack(rows).float(), notes


def _grade_value_quant(fn, v: torch.Tensor, notes) -> None:
    """Runs fn on v and compares with the reference; notes[r] (or None) = (case name, hint) of row r."""
    ref = quantize_values(v)
    got = fn(v.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError(f"return (codes, scale, zero), got {type(got).__name__}")
    codes, scale, zero = got
    M, D = v.shape
    for name, t, dt, shape in (("codes", codes, torch.uint8, (M, D)), ("scale", scale, torch.float16, (M,)),
                               ("zero", zero, torch.float16, (M,))):
        if not isinstance(t, torch.Tensor) or t.dtype != dt or tuple(t.shape) != shape:
            raise AssertionError(f"{name} must be {str(dt)[6:]} {shape}, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")

    def case(r):
        return f" ({notes[r][0]})" if notes and notes[r] else ""

    def row(r):
        return f"row {r}{case(r)}"

    if not torch.equal(zero, ref.zero):
        r = int((zero != ref.zero).nonzero()[0])
        where = f" ({row(r)}: got {float(zero[r]):g}, expected {float(ref.zero[r]):g})" if notes else ""
        raise AssertionError("zero must be the row minimum rounded to fp16, so that the smallest value gets "
                             f"code 0{where}")
    if not torch.equal(scale, ref.scale):
        r = int((scale != ref.scale).nonzero()[0])
        hint = ""
        if abs(float(scale[r]) * 16 / 15 - float(ref.scale[r])) < 1e-2 * float(ref.scale[r]):
            hint = " 4 bits give 16 codes 0..15, so 15 steps between min and max: scale = (max - min) / 15."
        raise AssertionError(f"{row(r)}: scale {float(scale[r]):g}, expected {float(ref.scale[r]):g}.{hint}")
    if int(codes.max()) > 15:
        raise AssertionError("codes must fit in 4 bits (0..15): clamp after rounding")
    bad = (codes != ref.codes).nonzero()
    if bad.numel():
        r, c = bad[0].tolist()
        x = float((v[r, c] - ref.zero[r].float()) / ref.scale[r].float()) if ref.scale[r] else 0.0
        if notes and notes[r]:
            hint = notes[r][1]
        elif not ref.scale[r]:
            hint = " A constant row has scale 0: give it code 0 (dividing by 0 gives NaN)."
        elif int(codes[r, c]) == math.floor(x):
            hint = " Round to the nearest code (floor(x + 1/2)), do not truncate."
        else:
            hint = " Code with the fp16-rounded scale and zero (the ones stored), or dequantization drifts."
        raise AssertionError(f"{len(bad)} codes differ; first at [{r}, {c}]{case(r)}: got "
                             f"{int(codes[r, c])}, expected {int(ref.codes[r, c])} ((v - zero) / scale = "
                             f"{x:.{5 if notes else 3}f}).{hint}")


def check_value_quant(fn) -> None:
    """Exercise 1: fn(v float32 [M, D]) -> (codes uint8 [M, D] in 0..15, scale fp16 [M], zero fp16 [M]).
    First random rows (one constant), then hand-made rows that tell the usual slips from the answer."""
    g = torch.Generator().manual_seed(11)
    v = torch.randn(6, 32, generator=g) * torch.tensor([1, 0.01, 100, 1, 3, 1.0])[:, None]
    v[3] = 0.25  # a constant row: scale 0
    _grade_value_quant(fn, v, None)
    _grade_value_quant(fn, *_tricky_value_rows())


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


def _merge_cases() -> list:
    """Exercise 3's cases: (label, outs [S, D], lse2 [S], what a NaN/inf there means) in float64."""
    g = torch.Generator().manual_seed(3)
    empty_nan = (" An empty split has lse = -inf: subtract the MAX lse (finite) before exponentiating, so its "
                 "weight is exactly 0.")
    cases = []
    for S, D, empty in ((2, 4, False), (5, 8, False), (4, 8, True)):
        outs = torch.randn(S, D, generator=g, dtype=torch.float64)
        lse = torch.randn(S, generator=g, dtype=torch.float64) * 4 + 30
        if empty:
            outs[1] = 0.0
            lse[1] = float("-inf")
        cases.append((f"S={S}, D={D}", outs, lse, empty_nan))
    outs = torch.randn(4, 8, generator=g, dtype=torch.float64)
    lse = torch.tensor([float("-inf"), 0.5, -1.0, 2.0], dtype=torch.float64)  # small sums: lse2 near 0
    outs[0] = 0.0
    cases.append(("S=4, D=8, split 0 empty, the others with lse2 near 0", outs, lse, empty_nan))
    outs = torch.randn(3, 8, generator=g, dtype=torch.float64)
    lse = torch.tensor([1e4, 1e4 - 3, 1e4 + 1.5], dtype=torch.float64)
    cases.append(("S=3, D=8, lse2 around 1e4", outs, lse,
                  " 2^lse2 overflows here (2^10000 > the float64 max, about 2^1024), and inf / inf = NaN: "
                  "subtract the max lse2 before exponentiating, so every weight is at most 1."))
    outs = torch.randn(3, 8, generator=g, dtype=torch.float64)
    lse = torch.tensor([-1e4, -1e4 + 2, float("-inf")], dtype=torch.float64)
    outs[2] = 0.0
    cases.append(("S=3, D=8, lse2 around -1e4 and an empty split", outs, lse,
                  " 2^lse2 underflows to 0 here (2^-10000), and 0 / 0 = NaN: subtract the max lse2 before "
                  "exponentiating, so the largest weight is exactly 1."))
    return cases


def _merge_hint(got, outs, lse) -> str:
    """Names the slip when got matches a usual wrong merge."""
    full = ~torch.isinf(lse)

    def near(x):
        return bool(torch.isfinite(x).all()) and torch.allclose(got, x)

    if near(outs.mean(0)) or near(outs[full].mean(0)):
        return " A plain average ignores how much softmax mass each split holds: weight by 2^lse."
    w = torch.exp(lse - lse.max())
    if near((w[:, None] * outs).sum(0) / w.sum()):
        return " The lse here is in base 2 (the kernels use exp2): weight by 2^(lse - max), not e^."
    w = torch.exp2(lse - lse.max())
    if near((w[:, None] * outs).sum(0)) or near((w[:, None] * outs).sum(0) / len(lse)):
        return " Divide by the sum of the weights (sum_s 2^(lse_s - max)): the weights must add up to 1."
    if near(outs[int(lse.argmax())]):
        return (" The split with the largest lse2 is not the whole answer: every split counts, weighted by "
                "2^(lse_s - max).")
    w = torch.exp2(torch.where(full, lse, torch.zeros_like(lse)) - lse[full].max())
    if not full.all() and near((w[:, None] * outs).sum(0) / w.sum()):
        return (" An empty split (lse = -inf) must weigh exactly 0: 2^(-inf - max) = 0. Replacing -inf by 0 "
                "gives it the weight of a split with one token of score 0.")
    return ""


def check_merge_splits(fn) -> None:
    """Exercise 3: fn(outs [S, D], lse2 [S]) -> [D], the log-sum-exp merge of split outputs. Random
    splits, then an empty split among small lse2, lse2 around 1e4 (2^lse2 overflows) and around -1e4."""
    for label, outs, lse, nan_hint in _merge_cases():
        S, D = outs.shape
        ref = merge_splits_reference(outs, lse)
        got = fn(outs.clone(), lse.clone())
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (D,):
            raise AssertionError(f"return a tensor [D={D}], got {getattr(got, 'shape', type(got).__name__)}")
        got = got.double()
        if not torch.isfinite(got).all():
            what = "NaN" if torch.isnan(got).any() else "inf"
            head = f"S={S}" if label == f"S={S}, D={D}" else label
            raise AssertionError(f"{head}: {what} in the result.{nan_hint}")
        if not torch.allclose(got, ref, rtol=1e-9, atol=1e-12):
            raise AssertionError(f"{label}: got {got.tolist()[:3]}..., expected {ref.tolist()[:3]}..."
                                 f"{_merge_hint(got, outs, lse)}")


solution_merge_splits = merge_splits_reference   # Exercise 3's solution
