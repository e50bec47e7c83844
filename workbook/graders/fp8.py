"""Notebook 03's exercise graders and their reference solutions.

Exercise 1: the UE8M0 exponent byte of a group maximum (:func:`check_exponent_byte`,
:func:`solution_exponent_byte`). Exercise 2: four exponent bytes packed into one little-endian int32
(:func:`check_pack`, :func:`solution_pack`). Exercise 3: the packing kernel with its MN-major,
TMA-aligned layout and an ``empty`` allocation (:func:`check_pack_kernel`; its solution is the
finished launcher :func:`workbook.fp8.pack_ue8m0_mn_major`). Each grader raises ``AssertionError`` with
a message that teaches (notebooks call it through :func:`workbook.check.grade`).
"""
from __future__ import annotations

import numpy as np
import torch

from ..coverage import coverage
from ..device import DEVICE
from ..fp8 import (
    E4M3_MAX, EPS, num_packed_words, pack_ue8m0_reference, tma_aligned_rows, ue8m0_exponent_reference,
)
from .common import check_zero_fills, run_guarded

__all__ = ["check_exponent_byte", "check_pack", "check_pack_kernel", "solution_exponent_byte", "solution_pack"]

_AMAX_CASES = [0.0, 1e-12, 1e-10, 4.5e-8, 0.001, 1.0, 223.99998, 224.0, 224.00002, 256.0, 447.99997,
               448.0, 448.00003, 449.0, 896.0, 1000.0, 57344.0, 3.0e38]


def _f32(v) -> str:
    """The shortest decimal that names one fp32 value (223.99998 and 224.00002 stay apart, where
    ``:g`` would print both as 224)."""
    return str(np.float32(float(v)))


def solution_exponent_byte(amax: torch.Tensor) -> torch.Tensor:
    """Exercise 1's solution: clamp(ceil(log2(max(amax / 448, 1e-10))) + 127, 0, 255) as uint8."""
    e = torch.ceil(torch.log2(torch.clamp(amax / E4M3_MAX, min=EPS)))
    return torch.clamp(e + 127, 0, 255).to(torch.uint8)


def check_exponent_byte(fn) -> None:
    """Grader of exercise 1: fn(amax fp32 [n]) -> exponent bytes [n] (any integer dtype)."""
    amax = torch.tensor(_AMAX_CASES, dtype=torch.float32)
    ref = torch.clamp(ue8m0_exponent_reference(amax) + 127, 0, 255).to(torch.int64)
    got = fn(amax.clone())
    if not isinstance(got, torch.Tensor) or got.shape != amax.shape:
        raise AssertionError(f"return a tensor of shape {tuple(amax.shape)}, one byte per amax; got {got!r}")
    if got.is_floating_point() and not torch.isfinite(got).all():
        i = int((~torch.isfinite(got)).nonzero()[0])
        raise AssertionError(f"amax = {_f32(amax[i])}: got {float(got[i])}, not a byte. Hint: log2(0) = -inf; "
                             "the floor max(amax/448, 1e-10) keeps an all-zero group finite.")
    got = got.to(torch.int64).cpu()
    bad = (got != ref).nonzero().flatten().tolist()
    if not bad:
        return
    # amax printed as the fp32 value it is, with amax/448 in fp32: 224.00002 / 448 is just above 2^-1
    lines = [f"amax = {_f32(amax[i])} (amax/448 = {_f32(amax[i] / E4M3_MAX)}): got {int(got[i])}, "
             f"expected {int(ref[i])} (0x{int(ref[i]):02X})" for i in bad]
    hint = ""
    pow2 = [i for i in bad if float(torch.frexp(amax[i] / E4M3_MAX)[0]) == 0.5]   # amax/448 a power of two
    split = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30))).to(torch.int64) - 9 + 127   # log2(448) ~ 8.8 -> 9
    if all(int(got[i]) == int(ref[i]) - 127 for i in bad):
        hint = "the byte is the exponent plus the UE8M0 bias: e + 127 (an all-zero group gives 0x5E = 94)."
    elif any(not 0 <= int(got[i]) <= 255 for i in bad):
        hint = ("a byte holds 0..255, and an int8 wraps above 127: compute e + 127 in a wider type "
                "(int32 or float) and clamp it to [0, 255].")
    elif all(int(got[i]) == int(split[i]) for i in bad if amax[i] > 1e-9) and any(amax[i] > 1e-9 for i in bad):
        hint = ("ceil(log2(amax)) - ceil(log2(448)) is not ceil(log2(amax / 448)): log2(448) = 8.81 is not "
                "a whole number. Divide first (amax / 448), then log2, then ceil.")
    elif all(int(got[i]) == int(ref[i]) + 1 for i in bad) and pow2 and len(pow2) == len(bad):
        hint = ("every wrong byte is one too large, exactly where amax/448 is a power of two: "
                "ceil(log2(2^k)) = k, no rounding up there (frexp's exponent is one more than log2 at powers "
                "of two).")
    elif all(int(got[i]) == int(ref[i]) + 1 for i in bad):
        hint = ("every wrong byte is one too large: e is the SMALLEST integer with 2^e >= amax/448, 448 "
                "being E4M3's largest value (not 224, not 256).")
    elif all(int(got[i]) == int(ref[i]) - 1 for i in bad):
        hint = ("every wrong byte is one too small: round UP (ceil), since the scale must satisfy "
                "2^e >= amax/448 so that no |y|/2^e exceeds 448. Near 224 = 448/2 the values differ in "
                "their last fp32 bit, and so do their bytes.")
    elif _AMAX_CASES.index(0.0) in bad:
        hint = ("an all-zero group: log2(0) = -inf. The floor max(amax/448, 1e-10) gives "
                "ceil(log2(1e-10)) = -33, byte 127 - 33 = 94 = 0x5E.")
    elif _AMAX_CASES.index(448.0) in bad or _AMAX_CASES.index(449.0) in bad:
        hint = ("round UP: the scale must satisfy 2^e >= amax/448 so that no |y|/2^e exceeds 448. "
                "amax = 448 gives e = 0 (byte 127); amax = 449 needs e = 1 (byte 128).")
    elif _AMAX_CASES.index(3.0e38) in bad:
        hint = "large amax needs large bytes: 3e38/448 is about 2^119.7, so e = 120, byte 247."
    raise AssertionError("\n  ".join(lines) + (f"\n  Hint: {hint}" if hint else ""))


def solution_pack(exp_bytes: torch.Tensor) -> torch.Tensor:
    """Exercise 2's solution: four bytes side by side ARE one little-endian int32; groups past G are
    0 bytes. (Host byte order: little-endian on x86-64 and Arm, the hosts torch runs on.)"""
    m, g = exp_bytes.shape
    padded = torch.zeros(m, 4 * num_packed_words(g), dtype=torch.uint8, device=exp_bytes.device)
    padded[:, :g] = exp_bytes
    return padded.view(torch.int32)


def check_pack(fn) -> None:
    """Grader of exercise 2: fn(exp_bytes uint8 [M, G]) -> int32 [M, ceil(G/4)] (any strides)."""
    gen = torch.Generator().manual_seed(4)
    for m, g in [(1, 4), (3, 1), (2, 5), (4, 8)]:
        e = torch.randint(0, 256, (m, g), generator=gen, dtype=torch.int32).to(torch.uint8)
        e[0, 0] = 0x78
        if g >= 4:
            e[0, 3] = 0x81  # >= 0x80 in the top byte: a negative int32
        ref = pack_ue8m0_reference(e)
        got = fn(e.clone())
        if not isinstance(got, torch.Tensor) or got.dtype != torch.int32:
            raise AssertionError(f"return an int32 tensor, got {getattr(got, 'dtype', type(got).__name__)}")
        if tuple(got.shape) != tuple(ref.shape):
            raise AssertionError(f"G = {g} groups need ceil({g}/4) = {ref.shape[1]} words per row: expected shape "
                                 f"{tuple(ref.shape)}, got {tuple(got.shape)}")
        got = got.cpu()
        if not torch.equal(got, ref):
            i, j = (got != ref).nonzero()[0].tolist()
            w, r = int(got[i, j]) & 0xFFFFFFFF, int(ref[i, j]) & 0xFFFFFFFF
            msg = (f"M={m}, G={g}: word [{i}, {j}] is 0x{w:08X}, expected 0x{r:08X} (bytes of groups "
                   f"{4 * j}..{min(4 * j + 3, g - 1)}: {[f'0x{int(b):02X}' for b in e[i, 4 * j:4 * j + 4]]}).")
            if w == int.from_bytes(r.to_bytes(4, "little"), "big"):
                msg += " The bytes are reversed: group 4p+j goes to bits 8j..8j+7, the FIRST group in the LOWEST byte."
            elif (w ^ r) & ~0xFF == 0 or (g % 4 and j == ref.shape[1] - 1 and (w ^ r) >> (8 * (g % 4))):
                msg += " Groups that do not exist (past G) must leave their bytes 0."
            elif w & 0xFF == r & 0xFF and (w ^ r) >> 8:
                msg += (" Byte 0 is right, the higher ones are not: shift in a dtype wide enough for 32 bits "
                        "(a uint8 shifted left by 8 is 0).")
            raise AssertionError(msg)


def check_pack_kernel(fn) -> None:
    """Grader of exercise 3: fn(exp_bytes uint8 [M, G] on DEVICE) -> the MN-major view int32 [M, P],
    strides (1, round_up(M, 4)), of a storage [P, round_up(M, 4)] allocated with torch.empty.

    Every element of the view must be written, with the reference's word. The storage rows
    M..round_up(M, 4)-1 belong to no element of the view: the kernel may leave them alone or write
    them (zeros, say); either passes. A zero-filled allocation does not: it is the memset the
    exercise removes. Allocations carry a poisoned guard zone (:func:`.common.run_guarded`): a store
    past the end of a too-small storage is named, not a crashed interpreter. M = 8 is a multiple of 4
    (no padding rows: a store to row M is a store into the next word, or past the end)."""
    gen = torch.Generator().manual_seed(5)
    for m, g in [(1, 1), (5, 5), (8, 9), (9, 8), (70, 6)]:
        e = torch.randint(0, 256, (m, g), generator=gen, dtype=torch.int32).to(torch.uint8).to(DEVICE)
        p, tm = num_packed_words(g), tma_aligned_rows(m)
        case = f"M={m}, G={g}"
        got, mode = run_guarded(lambda: fn(e.clone()), case, guard=4 * (p * tm + m * g) + 4096,
                                outputs=lambda out: [("scales", out)],
                                needs={"scales": f"the layout needs int32 [P, round_up(M, 4)] = [{p}, {tm}] = "
                                                 f"{4 * p * tm} bytes, and token m's word p at offset p * {tm} + m"})
        check_zero_fills(mode, [("scales", got)], case, {"scales": (
            "your kernel writes every element of the view, and the padding rows "
            f"M..{tm - 1} of each word are no element of it (no consumer reads them into a kept result)")},
            twice="the view")
        if not isinstance(got, torch.Tensor) or got.dtype != torch.int32 or tuple(got.shape) != (m, p):
            raise AssertionError(f"{case}: return the int32 view [M, P] = [{m}, {p}], got "
                                 f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}")
        if got.stride() != (1, tm) or mode.nbytes(got) != 4 * p * tm:
            raise AssertionError(f"{case}: the view must be storage.T[:M, :] of an int32 storage [P, round_up(M, 4)]"
                                 f" = [{p}, {tm}]: strides (1, {tm}) over {4 * p * tm} bytes; got strides "
                                 f"{got.stride()} over {mode.nbytes(got)} bytes")
        cov = coverage(fn, e, names=["scales"])[0]
        if bool((cov.read_before_written & cov.in_view).any()):
            raise AssertionError(
                f"{case}: view elements {cov.ranges(cov.read_before_written & cov.in_view)} end with values that "
                "depend on what torch.empty left there: the kernel read them (added or OR-ed into them) before "
                "writing. Build the whole word in registers and store it once.")
        if not cov.view_fully_written:
            raise AssertionError(
                f"{case}: elements of the view were never written (they still hold torch.empty's poison): "
                f"{cov.unwritten_ranges('view')} (storage coordinates [word p, token m]). Every token m < M "
                f"needs its word p at storage offset p * {tm} + m: does the grid cover all "
                f"ceil(M / BLOCK_M) row blocks and all {p} words, and is the store masked with m < M?")
        ref = pack_ue8m0_reference(e.cpu())
        got = got.cpu()
        if not torch.equal(got, ref):
            i, j = (got != ref).nonzero()[0].tolist()
            w, r = int(got[i, j]) & 0xFFFFFFFF, int(ref[i, j]) & 0xFFFFFFFF
            hint = (" The bytes are reversed: group 4p+j goes to bits 8j..8j+7." if w == int.from_bytes(r.to_bytes(4, "little"), "big")
                    else f" Is token m's word p stored at storage offset p * {tm} + m, and are groups past G loaded as 0?")
            raise AssertionError(f"{case}: word [{i}, {j}] is 0x{w:08X}, expected 0x{r:08X}.{hint}")
