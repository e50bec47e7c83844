"""Notebook 02's exercise graders (NVFP4): each ``check_*`` raises ``AssertionError`` with a message
that teaches, and the notebook calls it through :func:`workbook.check.grade`.

* ``check_e2m1_round(fn)``: exercise 1, E2M1 rounding (saturating, ties to the even code), against
  the brute-force definition on every decision point, one step either side of it, and a sweep.
* ``check_swizzle_offset(fn)``: exercise 2, the byte offset of a scale in the 128x4 swizzled storage.
* ``check_quant(fn)``: exercise 3, a quant kernel and its launcher: every byte of both outputs written
  (two poisons), codes and real scales exact, every padded scale entry ZERO; a wrong padding is
  explained by what the two consumers of :mod:`workbook.nvfp4` make of it. Its allocations carry a
  guard zone (a store past the end of a too-small ``codes`` or ``scales`` is named, not a crash), and
  a zero fill of either output (the statement says ``torch.empty``) gets the words every such
  exercise gives (:func:`.common.zero_fill_message`).

The reference solutions are the workbook's own code (``e2m1_decode(e2m1_encode(y))``,
``swizzle_offset``, ``nvfp4_quant_plain``); ``quant_with_nan_padding`` is a wrong answer to exercise 3
that the notebook shows the grader catching.
"""
from __future__ import annotations

import torch

from ..device import DEVICE
from ..nvfp4 import (E2M1_MAX, E2M1_VALUES, e2m1_round_brute, global_scale_of, nvfp4_gemm_ref,
                     nvfp4_gemm_small_m_model, nvfp4_quant, quantize_ref, unswizzle_scales)
from .common import check_zero_fills, run_guarded

__all__ = ["check_e2m1_round", "check_swizzle_offset", "check_quant", "QUANT_GRADER_SHAPES",
           "quant_with_nan_padding"]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _probe_values() -> torch.Tensor:
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    grid = torch.tensor(E2M1_VALUES)
    eps = torch.tensor([1e-3, -1e-3])
    vals = torch.cat([grid, mids, (mids[:, None] + eps).flatten(), torch.tensor([6.5, 100.0, 1e-6]),
                      torch.linspace(0, 7, 141)])
    return torch.cat([vals, -vals])


def check_e2m1_round(fn) -> None:
    """Grader: ``fn(y: fp32 tensor) -> fp32 tensor`` rounds to E2M1 values (saturating, ties to even)."""
    y = _probe_values()
    out = fn(y.clone())
    if not isinstance(out, torch.Tensor) or out.shape != y.shape:
        raise AssertionError(f"return a tensor of the input's shape {tuple(y.shape)}")
    ref = e2m1_round_brute(y)
    bad = (out.float().cpu() != ref).nonzero().flatten()
    if len(bad):
        lines = [f"y={float(y[i]):+g}: got {float(out[i]):+g}, expected {float(ref[i]):+g}" for i in bad[:6]]
        o, r, a = out.float().cpu()[bad], ref[bad], y[bad].abs()
        on_grid = torch.isin(o.abs(), torch.tensor(E2M1_VALUES))
        codes = torch.isin(o.abs(), torch.arange(16.0)).all() and bool((o.abs() > E2M1_MAX).any())
        if bool(o.isnan().any()):
            z = y[bad][o.isnan()]
            hint = (f"NaN at y = {float(z[0]):+g}: " + ("y / |y| is 0 / 0 at zero: take the sign with torch.sign, "
                    "torch.copysign or torch.where" if bool((z == 0).any()) else "every output must be a grid value"))
        elif codes:
            hint = ("you returned the 4-bit CODE (its index 0..7 plus the sign bit 8); return its VALUE, "
                    "one of 0, 0.5, 1, 1.5, 2, 3, 4, 6 with y's sign, as fp32")
        elif bool(((a > E2M1_MAX) & (o.abs() > E2M1_MAX)).any()):
            hint = "values beyond 6 saturate to 6 (E2M1 has no infinity): clamp to [-6, 6] first"
        elif not bool(on_grid.all()):
            hint = "round to the NEAREST of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (the grid is not uniform)"
        elif bool(((o == -r) & (r != 0)).any()):
            hint = "the sign is kept: round |y|, then give the result y's sign"
        elif bool(torch.isin(a, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])).any()):
            hint = ("a tie between two neighbours goes to the EVEN code index (0, 1, 2, 4 = 0.0, 1.0, "
                    "2.0, 4.0 win ties; 0.5, 1.5, 3, 6 lose them)")
        else:
            hint = "round to the NEAREST of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (the grid is not uniform)"
        raise AssertionError(f"{len(bad)} of {len(y)} values rounded wrongly: " + "; ".join(lines)
                             + f"\nHint: {hint}.")


def check_swizzle_offset(fn) -> None:
    """Grader: ``fn(r, c, Kp)`` (integer tensors) gives the swizzled byte offset."""
    for Mp, Kp in ((128, 4), (256, 8), (384, 12)):
        r = torch.arange(Mp)[:, None].expand(Mp, Kp)
        c = torch.arange(Kp)[None, :].expand(Mp, Kp)
        got = fn(r, c, Kp)
        ref = torch.empty(Mp * Kp, dtype=torch.int64)
        ref_log = torch.arange(Mp * Kp).view(Mp, Kp)
        # where does logical (r, c) land? scatter the identity through the torch permutation
        sw = ref_log.view(Mp // 128, 4, 32, Kp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
        ref[sw] = torch.arange(Mp * Kp)
        ref = ref.view(Mp, Kp)
        if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
            raise AssertionError(f"return an integer tensor of shape {tuple(ref.shape)} for r, c of that shape")
        bad = (got != ref).nonzero()
        if len(bad):
            desc = [f"(r={a}, c={b}): got {int(got[a, b])}, expected {int(ref[a, b])}" for a, b in bad[:5].tolist()]
            if torch.equal(got, ref // 4) or torch.equal(got, ref // 16):
                hint = (f"your offsets are in units of {4 if torch.equal(got, ref // 4) else 16} bytes: the "
                        "offset counts BYTES (one E4M3 scale is one byte)")
            elif torch.equal(got % 512, ref % 512):
                hint = ("inside each tile you are right, but the tiles are in the wrong order: tiles are "
                        "stored row-major, tile (r // 128, c // 4) is number (r // 128) * (Kp / 4) + c // 4")
            else:
                hint = ("a 128x4 tile is 512 contiguous bytes; inside, 32 lines of 16 bytes: line r % 32, "
                        "then 4 bytes per 32-row slab (r % 128) // 32, then c % 4")
            raise AssertionError(f"grid [{Mp}, {Kp}]: {len(bad)} of {Mp * Kp} offsets wrong: "
                                 + "; ".join(desc) + f"\nHint: {hint}.")


QUANT_GRADER_SHAPES = ((1, 64), (90, 80), (129, 48))


def quant_with_nan_padding(x: torch.Tensor, global_scale):
    """A WRONG answer to exercise 3, for the notebook and the tests: the right codes and real scales,
    every byte written, but 0xFF (E4M3 NaN) in every padded scale entry."""
    codes, sf = nvfp4_quant(x, global_scale)
    M, n = x.shape[0], x.shape[1] // 16
    grid = unswizzle_scales(sf.view(torch.uint8)).clone()
    grid[M:, :] = 0xFF
    grid[:, n:] = 0xFF
    Mp, Kp = grid.shape
    sw = grid.view(Mp // 128, 4, 32, Kp // 4, 4).permute(0, 3, 2, 1, 4).reshape(Mp, Kp)
    return codes, sw.view(torch.float8_e4m3fn)


def _consumer_effects(codes, sf, rc, rs, gs, K) -> str:
    """What the two consumers make of (codes, sf), against what they make of the reference bytes."""
    w = torch.randn(8, K, generator=torch.Generator().manual_seed(0)).to(codes.device)
    lines = []
    for name, consumer in (("consumer 1, the K-padding reader (nvfp4_gemm_ref)", nvfp4_gemm_ref),
                           ("consumer 2, the small-M row-mixing model (nvfp4_gemm_small_m_model)",
                            nvfp4_gemm_small_m_model)):
        got, ref = consumer(codes, sf, gs, w), consumer(rc, rs, gs, w)
        bad_rows = (~((got == ref) | (got.isnan() & ref.isnan()))).any(1)
        nan_rows = got.isnan().any(1)
        lines.append(f"  {name}: {int(bad_rows.sum())} of {got.shape[0]} real output rows wrong"
                     + (f" ({int(nan_rows.sum())} of them NaN)" if nan_rows.any() else ""))
    return "\n".join(lines)


def _run_guarded(fn, x, gs, which: int, Mp: int, Kp: int):
    """``fn(x, gs)`` with its allocations poisoned (``which``) and guarded (:func:`.common.run_guarded`):
    a store past an allocation, a stray access, or a zero-filled output is an ``AssertionError`` that
    names it."""
    M, K = x.shape
    case = f"[{M}x{K}]"

    def outputs(out):
        return list(zip(("codes", "scales"), out)) if isinstance(out, (tuple, list)) and len(out) == 2 else []

    needs = {"scales": f"the swizzled layout needs [round_up(M, 128), round_up(K/16, 4)] = [{Mp}, {Kp}] = "
                       f"{Mp * Kp} bytes",
             "codes": f"the codes need [M, K/2] = [{M}, {K // 2}] uint8 = {M * K // 2} bytes (two codes a byte)"}
    out, mode = run_guarded(lambda: fn(x, gs), case, which=which, guard=4 * (M * K + Mp * Kp) + 4096,
                            outputs=outputs, needs=needs)
    check_zero_fills(mode, outputs(out), case, {
        "scales": "your kernel writes every byte, the padded scale entries as 0 (let the grid span the padded grid)",
        "codes": "your kernel writes every byte"})
    return out


def check_quant(fn, shapes=QUANT_GRADER_SHAPES) -> None:
    """Grader: ``fn(x, global_scale) -> (codes, scales_swizzled)`` writes every byte of both outputs
    (its ``torch.empty`` allocations poisoned two ways: a byte that differs between the two runs was
    never written), the codes and the real scales equal ``quantize_ref`` exactly, and every PADDED
    scale entry is zero, because some consumers read padded rows and padded columns. Neither output
    may be zero-filled, and no store may land past an allocation (:func:`_run_guarded`). Shapes: the
    decode case (M = 1, K/16 = 4: only rows padded), both paddings, and two 128-row tiles."""
    for dtype, (M, K) in zip((torch.bfloat16, torch.float16, torch.bfloat16), shapes):
        g = torch.Generator().manual_seed(M * 1000 + K)
        x = (torch.randn(M, K, generator=g) * 3).to(dtype).to(DEVICE)
        gs = global_scale_of(x)
        rc, rs = quantize_ref(x, gs, swizzled=True)
        n, (Mp, Kp) = K // 16, rs.shape
        runs = []
        for which in (0, 1):
            out = _run_guarded(fn, x, gs, which, Mp, Kp)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise AssertionError("return a pair (codes, scales)")
            codes, sf = out
            if tuple(sf.shape) != (Mp, Kp):
                raise AssertionError(f"[{M}x{K}] scales must be the swizzled storage {[Mp, Kp]} "
                                     f"(round_up(M, 128), round_up(K/16, 4)), got {list(sf.shape)}: the "
                                     "GEMM reads whole 128x4 tiles")
            if tuple(codes.shape) != (M, K // 2) or codes.dtype != torch.uint8:
                raise AssertionError(f"[{M}x{K}] codes must be uint8 {[M, K // 2]}, got {codes.dtype} "
                                     f"{list(codes.shape)}")
            runs.append((codes.detach().cpu().clone(), _bytes(sf).detach().cpu().clone()))
        (c0, s0), (c1, s1) = runs
        if not torch.equal(c0, c1):
            raise AssertionError(f"[{M}x{K}] {int((c0 != c1).sum())} code bytes differ between two runs "
                                 "with differently poisoned torch.empty: they were never written")
        if not torch.equal(c0, rc.cpu()):
            raise AssertionError(f"[{M}x{K} {dtype}] {int((c0 != rc.cpu()).sum())} code bytes differ from "
                                 "the reference (check the nibble order: element 2i in the LOW nibble; the "
                                 "sign bit 3 of each code; ties to the even index)")
        l0, l1, lr = unswizzle_scales(s0), unswizzle_scales(s1), _bytes(unswizzle_scales(rs)).cpu()
        if not torch.equal(l0[:M, :n], l1[:M, :n]) or not torch.equal(l0[:M, :n], lr[:M, :n]):
            raise AssertionError(f"[{M}x{K}] real scale entries [:{M}, :{n}] differ from the reference "
                                 "(E4M3 round to nearest even of min(gs*amax/6, 448), at the swizzled "
                                 "offset of section 3)")
        pad = torch.ones(Mp, Kp, dtype=torch.bool)
        pad[:M, :n] = False
        unwritten = pad & (l0 != l1)
        if unwritten.any():
            rows = unwritten.any(1).nonzero().flatten()
            cols = unwritten.any(0).nonzero().flatten()
            raise AssertionError(
                f"[{M}x{K}] the real scales are right, but {int(unwritten.sum())} padded entries of the "
                f"[{Mp}, {Kp}] scale storage were never written (rows {int(rows[0])}..{int(rows[-1])}, "
                f"columns {int(cols[0])}..{int(cols[-1])}). With torch.empty they hold whatever was "
                "there before. Consumers read them: the FP4 GEMM reads whole 128x4 tiles, padded "
                "columns multiply zero codes (0 x NaN = NaN), and a small-M path lets padded rows' "
                "scales reach real rows. Write zeros there (let the grid span the padded grid).")
        if (l0[pad] != 0).any():
            vals = sorted({int(v) for v in l0[pad][l0[pad] != 0].unique()[:4]})
            rows = (pad & (l0 != 0)).any(1).nonzero().flatten()
            raise AssertionError(
                f"[{M}x{K}] every byte is written and the real scales are right, but "
                f"{int((l0[pad] != 0).sum())} padded scale entries hold nonzero bytes "
                f"({', '.join(f'0x{v:02X}' for v in vals)}; 0x7F and 0xFF are E4M3 NaN) in rows "
                f"{int(rows[0])}..{int(rows[-1])}. Padded entries must be ZERO: written is not enough. "
                "What the consumers make of these bytes:\n"
                + _consumer_effects(runs[0][0].to(DEVICE), runs[0][1].to(DEVICE).view(torch.float8_e4m3fn),
                                    rc, rs, gs, K))
