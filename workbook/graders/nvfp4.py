"""Notebook 02's exercise graders (NVFP4): each ``check_*`` raises ``AssertionError`` with a message
that teaches, and the notebook calls it through :func:`workbook.check.grade`.

* ``check_e2m1_round(fn)``: exercise 1, E2M1 rounding (saturating, ties to the even code), against
  the brute-force definition on every decision point, one step either side of it, and a sweep.
* ``check_swizzle_offset(fn)``: exercise 2, the byte offset of a scale in the 128x4 swizzled storage.
* ``check_quant(fn)``: exercise 3, a quant kernel and its launcher: every byte of both outputs written
  (two poisons), codes and real scales exact, every padded scale entry ZERO; a wrong padding is
  explained by what the two consumers of :mod:`workbook.nvfp4` make of it. Its allocations carry a
  guard zone (a store past the end of a too-small ``codes`` or ``scales`` is named, not a crash), and
  a zero fill of either output (the statement says ``torch.empty``) fails as in notebooks 01 and 03.

The reference solutions are the workbook's own code (``e2m1_decode(e2m1_encode(y))``,
``swizzle_offset``, ``nvfp4_quant_plain``); ``quant_with_nan_padding`` is a wrong answer to exercise 3
that the notebook shows the grader catching.
"""
from __future__ import annotations

import contextlib
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..coverage import EMPTY_OPS, bounds_checked, poison_, poisons_for, storage_bytes
from ..device import DEVICE
from ..nvfp4 import (E2M1_MAX, E2M1_VALUES, e2m1_round_brute, global_scale_of, nvfp4_gemm_ref,
                     nvfp4_gemm_small_m_model, nvfp4_quant, quantize_ref, unswizzle_scales)

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
        if bool(((a > E2M1_MAX) & (o.abs() > E2M1_MAX)).any()):
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
            if torch.equal(got % 512, ref % 512):
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


class _GuardedAllocations(TorchDispatchMode):
    """``poisoned_allocations`` with a guard zone: every ``torch.empty``/``empty_like``/``new_empty``/
    ``empty_strided`` (and every zero-filled allocation: ``zeros``, ``zeros_like``, ``new_zeros``,
    ``full(.., 0)``) returns a tensor of the shape asked for at the start of a storage ``guard`` bytes
    longer, the whole storage poisoned (``poisons_for(dtype)[which]``; zero allocations hold zeros in
    their own bytes). A store past the end of an allocation lands in its guard, not in the memory that
    follows (which in Triton's interpreter is the host heap: a stray store there can kill the Python
    process), and :meth:`overruns` finds it. Also records the zero fills: zero-filled allocations and
    ``zero_()``/``fill_(0)`` of a whole allocation."""

    _ZERO_ALLOCS = {"aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::full", "aten::full_like",
                    "aten::new_full"}

    def __init__(self, which: int, guard: int):
        super().__init__()
        self.which, self.guard = which, guard
        self.allocs: list[dict] = []        # shape, dtype, nbytes, ptr, guard snapshot
        self.zero_fills: dict[int, str] = {}  # storage ptr -> the call that zero-filled it

    def _guarded(self, out: torch.Tensor, fill_zero: bool) -> torch.Tensor:
        nbytes, item = out.untyped_storage().nbytes(), out.element_size()
        big = torch.empty(-(-(nbytes + self.guard) // item), dtype=out.dtype, device=out.device)
        poison_(big, poisons_for(out.dtype)[self.which])
        if fill_zero:
            storage_bytes(big)[:nbytes].zero_()
        t = torch.empty(0, dtype=out.dtype, device=out.device).set_(big.untyped_storage(), 0, out.shape, out.stride())
        self.allocs.append(dict(shape=list(out.shape), dtype=out.dtype, nbytes=nbytes,
                                ptr=t.untyped_storage().data_ptr(), tensor=t,
                                snapshot=storage_bytes(big)[nbytes:].clone()))
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            return out
        name = func._schema.name
        if name in ("aten::full", "aten::full_like", "aten::new_full", "aten::fill_"):
            value = args[1] if len(args) > 1 else kwargs.get("fill_value", kwargs.get("value"))
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            zero = isinstance(value, (int, float, bool)) and value == 0
        else:
            zero = name in ("aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero_")
        if (func in EMPTY_OPS or (zero and name in self._ZERO_ALLOCS)) and out.untyped_storage().nbytes():
            out = self._guarded(out, fill_zero=func not in EMPTY_OPS)
            if func not in EMPTY_OPS:
                self.zero_fills[out.untyped_storage().data_ptr()] = f"torch.{name[6:]}"
        elif zero and name in ("aten::zero_", "aten::fill_"):
            ptr = out.untyped_storage().data_ptr()
            mine = [a for a in self.allocs if a["ptr"] == ptr]
            if mine and out.numel() * out.element_size() >= mine[0]["nbytes"]:   # the whole allocation
                self.zero_fills.setdefault(ptr, "Tensor.zero_()" if name == "aten::zero_" else "Tensor.fill_(0)")
        return out

    def overruns(self):
        """(allocation, bytes changed in its guard, farthest changed byte past its end) per overrun."""
        found = []
        for a in self.allocs:
            now = storage_bytes(a["tensor"])[a["nbytes"]:]
            changed = (now != a["snapshot"]).nonzero().flatten()
            if len(changed):
                found.append((a, len(changed), int(changed[-1]) + 1))
        return found


def _check_overruns(mode: _GuardedAllocations, out, M: int, K: int, Mp: int, Kp: int) -> None:
    """Raise, naming the buffer, when a store landed past the end of an allocation."""
    outs = list(out) if isinstance(out, (tuple, list)) and len(out) == 2 else []
    for a, n, far in mode.overruns():
        what = f"{a['shape']} {str(a['dtype']).replace('torch.', '')} = {a['nbytes']} bytes"
        need = ""
        for t, name in zip(outs, ("codes", "scales")):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == a["ptr"]:
                need = (f"; the swizzled layout needs [round_up(M, 128), round_up(K/16, 4)] = [{Mp}, {Kp}] = "
                        f"{Mp * Kp} bytes" if name == "scales" else
                        f"; the codes need [M, K/2] = [{M}, {K // 2}] uint8 = {M * K // 2} bytes (two codes a byte)")
                what = f"`{name}` (allocated {what}{need})"
                break
        else:
            what = f"a buffer your launcher allocated ({what})"
        raise AssertionError(
            f"[{M}x{K}] your kernel stored past the end of {what}: {n} bytes changed up to {far} bytes past "
            "its end. The grader caught them in a guard zone; without it they overwrite whatever memory "
            "comes next (in Triton's interpreter that can kill the Python kernel, e.g. 'corrupted "
            "double-linked list'; on a GPU an illegal memory access, or silent corruption). Allocate "
            "the size the kernel writes.")


def _run_guarded(fn, x, gs, which: int, Mp: int, Kp: int):
    """``fn(x, gs)`` with its allocations poisoned (``which``) and guarded, under ``bounds_checked`` in
    the interpreter; a store past an allocation, a stray access, or a zero-filled output is an
    ``AssertionError`` that names it."""
    M, K = x.shape
    mode = _GuardedAllocations(which, guard=4 * (M * K + Mp * Kp) + 4096)
    checked = bounds_checked() if os.environ.get("TRITON_INTERPRET") == "1" else contextlib.nullcontext()
    try:
        with checked, mode:
            out = fn(x, gs)
    except Exception as e:   # a stray access beyond every guard: bounds_checked stopped it
        if "outside every tensor argument" not in str(e):
            raise
        _check_overruns(mode, None, M, K, Mp, Kp)
        access = "store" if "store of" in str(e) else "load"
        raise AssertionError(
            f"[{M}x{K}] your kernel tried a {access} outside every tensor it was given (stopped before "
            "it happened; unchecked, a stray store can kill the Python kernel in Triton's "
            "interpreter, and is an illegal memory access on a GPU). Check the offsets and the "
            "masks of your loads and stores against the shapes you allocated.") from None
    _check_overruns(mode, out, M, K, Mp, Kp)
    for t, name in zip(out if isinstance(out, (tuple, list)) and len(out) == 2 else (), ("codes", "scales")):
        op = mode.zero_fills.get(t.untyped_storage().data_ptr()) if isinstance(t, torch.Tensor) else None
        if op:
            raise AssertionError(
                f"[{M}x{K}] `{name}` was zero-filled ({op}): that is the extra memset kernel this "
                "workbook removes. Allocate it with torch.empty: your kernel writes every byte, "
                + ("the padded scale entries as 0 (let the grid span the padded grid), "
                   if name == "scales" else "")
                + "so a zero fill writes them twice.")
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
