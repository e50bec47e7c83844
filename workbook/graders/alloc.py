"""Notebook 01's exercise graders and their reference solutions.

Exercise 1.1: ``pad_rows(x, multiple)``, a padded copy allocated with ``torch.empty`` and written
whole by the participant's code (:func:`check_pad_rows`, :func:`solution_pad_rows`): a zero fill gets
the words of every exercise that asks for ``torch.empty`` (:func:`.common.zero_fill_message`), and
the whole storage is checked under two poisons.

Exercise 1.2: predict the price of a zero fill from the recorded sweep.
:func:`check_zero_fill_prediction` grades ``fn(rec, nbytes, dtype)`` (microseconds that ``torch.zeros``
adds to allocate-then-overwrite) against what the recorded fill rows support, and names the likely
mistake of a wrong answer (units, bytes vs MiB, averaged times, the wrong rate); its reference
solution is :func:`solution_zero_fill_prediction`.
"""
from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from ..benchmarks.alloc import fill_sweep
from ..coverage import coverage
from ..records import NotRecorded
from .common import zero_fill_message

__all__ = ["PAD_ROWS_CASES", "check_pad_rows", "solution_pad_rows",
           "PREDICTION_SIZES", "check_zero_fill_prediction", "solution_zero_fill_prediction", "human"]

# (M, N, multiple, dtype): a partial block, an exact multiple (no padding), one row padded to 128 in
# bf16 (an output that does not keep x's dtype shows), two blocks of 128
PAD_ROWS_CASES = [(13, 6, 8, torch.float32), (16, 3, 8, torch.float32), (1, 5, 128, torch.bfloat16),
                  (130, 2, 128, torch.float32)]


def solution_pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Exercise 1.1's reference: one ``torch.empty`` output; the data rows and the padding rows are
    two disjoint slices that together cover it, each written once."""
    M, N = x.shape
    # empty is right: rows [0, M) get x, rows [M, round_up(M, multiple)) get zeros: every row written once
    out = torch.empty((M + multiple - 1) // multiple * multiple, N, dtype=x.dtype, device=x.device)
    out[:M] = x
    out[M:] = 0
    return out


def _is_zero(v) -> bool:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    return isinstance(v, (int, float, bool)) and v == 0


class _ZeroSourceMode(TorchFunctionMode):
    """Records the calls that produce zeros without the producer writing them: zero-filled allocations
    (``zeros``, ``zeros_like``, ``new_zeros``, ``full(.., 0)``), padding helpers (``F.pad``) and
    whole-buffer fills (``zero_()``, ``fill_(0)``)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, torch.Tensor | None]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        module = getattr(func, "__module__", "") or ""
        if func in (torch.zeros, torch.zeros_like) or name == "new_zeros":
            self.calls.append((f"{'Tensor.' if name == 'new_zeros' else 'torch.'}{name}", None))
        elif func in (torch.full, torch.full_like) or name == "new_full":
            value = args[1] if len(args) >= 2 else kwargs.get("fill_value")
            if _is_zero(value):
                self.calls.append((f"torch.{name}(.., 0)", None))
        elif (name == "pad" and "functional" in module) or func is torch.constant_pad_nd:
            self.calls.append(("torch.nn.functional.pad", None))
        elif name == "zero_" or (name == "fill_" and len(args) >= 2 and _is_zero(args[1])):
            self.calls.append((f"Tensor.{name}{'(0)' if name == 'fill_' else '()'}", args[0] if args else None))
        elif name == "__setitem__" and len(args) == 3 and _is_zero(args[2]) and isinstance(args[0], torch.Tensor):
            self.calls.append(("Tensor[...] = 0", args[0][args[1]]))   # the view it filled (the mode is off here)
        return out


def _runs(rows: list[int]) -> str:
    runs: list[list[int]] = []
    for r in rows:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:6]) + (", ..." if len(runs) > 6 else "")


def check_pad_rows(fn) -> None:
    """Grader of exercise 1.1: ``fn(x, multiple)`` -> a ``[round_up(M, multiple), N]`` tensor of x's
    dtype whose first M rows are ``x`` and whose padding rows are zero, allocated with ``torch.empty``
    and written entirely by ``fn`` itself: no ``torch.zeros``/``zeros_like``/``new_zeros``/
    ``full(.., 0)``, no ``F.pad``, no ``zero_()`` of the whole buffer (each is a zero fill the data rows
    then overwrite, exactly the cost notebook 01 removes). Checks the whole storage under two poisons
    and the values, on the cases of :data:`PAD_ROWS_CASES`."""
    from ..device import DEVICE as device

    for M, N, multiple, dtype in PAD_ROWS_CASES:
        case = f"M={M}, N={N}, multiple={multiple}, {str(dtype).replace('torch.', '')}"
        x = torch.randn(M, N, generator=torch.Generator().manual_seed(M)).to(dtype).to(device)
        Mp = (M + multiple - 1) // multiple * multiple
        mode = _ZeroSourceMode()
        with mode:
            got = fn(x.clone(), multiple)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{case}: return a tensor, got {type(got).__name__}")
        whole = [c for c, t in mode.calls if t is not None and t.untyped_storage().data_ptr()
                 == got.untyped_storage().data_ptr() and t.numel() * t.element_size() >= got.numel() * got.element_size()]
        used = sorted({c for c, t in mode.calls if t is None} | set(whole))
        if used:
            raise AssertionError(zero_fill_message(
                case, "padded", ", ".join(used),
                f"your code writes every row itself, out[:M] = x and out[M:] = 0 (the {Mp - M} padding rows only)",
                twice="every data row"))
        if tuple(got.shape) != (Mp, N):
            hint = (f"M rounded UP to a multiple of {multiple}: the smallest multiple >= M; when M is one "
                    "already, there is no padding" if got.dim() == 2 and got.shape[0] > Mp else
                    f"M rounded UP to a multiple of {multiple}")
            raise AssertionError(f"{case}: expected shape [{Mp}, {N}] ({hint}), got {list(got.shape)}")
        if got.dtype != x.dtype:
            raise AssertionError(f"{case}: keep x's dtype {x.dtype}, got {got.dtype}: allocate with "
                                 "dtype=x.dtype (and device=x.device)")
        cov = coverage(fn, x, multiple, names=["padded"])[0]
        if cov.storage_shape != (Mp, N):
            raise AssertionError(f"{case}: the returned tensor must own exactly its [{Mp}, {N}] storage, but it is "
                                 f"a view over a storage of shape {list(cov.storage_shape)}")
        probs = cov.problems("storage")
        if probs:
            raise AssertionError(f"{case}: " + " ".join(probs)
                                 + (" A consumer that reads whole tiles reads the padding too."
                                    if cov.never_written.any() else ""))
        ref = torch.cat([x, torch.zeros(Mp - M, N, dtype=x.dtype, device=device)])
        if not torch.equal(got, ref):
            bad = (got != ref) & ~(torch.isnan(got) & torch.isnan(ref))
            rows = bad.any(dim=1).nonzero().flatten().tolist()
            where = "padding" if min(rows) >= M else "data"
            raise AssertionError(f"{case}: rows {_runs(rows)} hold wrong values ({where} rows): the "
                                 "first M rows must equal x and the padding rows must be exactly 0.")

PREDICTION_SIZES = (512 << 20, 128 << 20)   # not measured sizes: the prediction must interpolate
_PREDICTION_DTYPES = ("float32", "uint8", "int32")
_TOLERANCE = 0.01               # run-to-run noise of the large-size fill timings


def solution_zero_fill_prediction(rec: dict, nbytes: int, dtype) -> float:
    """Exercise 1.2's reference: ``nbytes`` / the fill bandwidth of ``dtype`` interpolated in log(size)
    between the recorded sizes around ``nbytes`` (eager rows), in microseconds."""
    rows = fill_sweep(rec, dtype)
    below = max((r for r in rows if r["bytes"] <= nbytes), key=lambda r: r["bytes"])
    above = min((r for r in rows if r["bytes"] >= nbytes), key=lambda r: r["bytes"])
    t = 0.0 if above is below else math.log(nbytes / below["bytes"]) / math.log(above["bytes"] / below["bytes"])
    beta = below["eager_GBps"] + t * (above["eager_GBps"] - below["eager_GBps"])   # GB/s
    return nbytes / (beta * 1e9) * 1e6                                                # bytes / (bytes/s) -> s -> us


def _as_float(p, what: str) -> float:
    if isinstance(p, (bool, str, bytes)) or p is None:
        raise AssertionError(f"{what}: return a number of microseconds (a float), got {p!r}")
    try:
        v = float(p)  # float, int, numpy scalar, 0-d tensor
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: return a number of microseconds (a float), got {p!r} "
                             f"({type(p).__name__})") from None
    if not math.isfinite(v) or v <= 0:
        raise AssertionError(f"{what}: return a positive, finite number of microseconds, got {v!r}")
    return v


def check_zero_fill_prediction(fn, rec: dict) -> None:
    """Grader of exercise 1.2: ``fn(rec, nbytes, dtype)`` -> the time [us] ``torch.zeros`` adds to
    allocate-then-overwrite for a ``nbytes`` buffer of ``dtype`` (a torch dtype), by the cost model
    extra = nbytes / beta_fill(dtype, size), beta interpolated from the recorded fill sweep.

    What the data supports at a size B between two measured sizes B/2 and 2B: the fill's bandwidth
    grows with size, so its time lies between (2B's time) / 2 and (B/2's time) x 2, each within the
    timing noise. Checked at 512 MiB and 128 MiB (an answer must follow ``nbytes``), for float32,
    uint8 and int32 (a dtype the record lacks is said and skipped)."""
    copy = rec["ceilings"].get("copy_GBps")
    checked = []
    for name in _PREDICTION_DTYPES:
        try:
            rows = {r["bytes"]: r for r in fill_sweep(rec, name)}
        except NotRecorded:
            print(f"    ({name}: not recorded in this record, so not checked)")
            continue
        got = {}
        for B in PREDICTION_SIZES:
            lo_row, hi_row = rows[B // 2], rows[2 * B]
            bounds = sorted((hi_row["eager_us"] * B / hi_row["bytes"], lo_row["eager_us"] * B / lo_row["bytes"]))
            lo, hi = bounds[0] * (1 - _TOLERANCE), bounds[1] * (1 + _TOLERANCE)
            what = f"{name}, {B >> 20} MiB"
            p = got[B] = _as_float(fn(rec, B, getattr(torch, name)), what)
            if lo <= p <= hi:
                continue
            why = _likely_mistake(rec, rows, name, B, p, got, copy)
            raise AssertionError(
                f"{what}: your prediction {p:.1f} us is outside what the recorded data supports, "
                f"{lo:.1f}..{hi:.1f} us ({human(2 * B)}'s fill time / 2 .. {human(B // 2)}'s x 2, "
                f"{_TOLERANCE:.0%} noise)."
                + (f" Likely cause: {why}." if why else
                   " Model: extra = bytes / fill bandwidth, bandwidth in bytes/s (GB/s * 1e9), result * 1e6 for us."))
        checked.append(name)
    if not checked:
        raise AssertionError("nothing to check: the record holds no fill sweep")


def human(nbytes: int) -> str:
    return f"{nbytes >> 30} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


def _likely_mistake(rec, rows, name, B, p, got, copy) -> str | None:
    """The wrong answer that ``p`` matches (within 1.5%), as a sentence; None if none does."""
    lo_row, hi_row = rows[B // 2], rows[2 * B]
    beta_mid = (lo_row["eager_GBps"] + hi_row["eager_GBps"]) / 2 * 1e9
    hints = []
    if len(got) > 1:
        first = next(iter(got.values()))
        hints.append((first, f"your prediction does not change with nbytes (it gave the same at "
                             f"{next(iter(got)) >> 20} MiB): compute from the nbytes argument"))
    hints += [
        (B / beta_mid * 1e0, "that is in SECONDS: multiply by 1e6 for microseconds"),
        (B / beta_mid * 1e3, "that is in MILLISECONDS: microseconds are 1e6 per second"),
        ((B >> 20) * 1e6 / beta_mid * 1e6,
         f"{B >> 20} MiB is {B >> 20} * 2**20 = {B} bytes, not {B >> 20}e6"),
        ((lo_row["eager_us"] + hi_row["eager_us"]) / 2, f"averaging the TIMES of {human(B // 2)} and {human(2 * B)} "
         f"mixes two sizes; time scales with bytes: interpolate the bandwidth (or scale each time by "
         f"{B >> 20} MiB / its size)"),
    ]
    if (B // 8) in rows:
        hints.append((rows[B // 8]["eager_us"] * 8, f"the {human(B // 8)} row's bandwidth is lower (the launch still "
                      f"shows there): use the rows around {B >> 20} MiB"))
    if copy:
        hints.append((B / (copy * 1e9) * 1e6, "the copy ceiling counts bytes read + written; a fill only "
                      "writes, at its own rate: use the fill bandwidth of this dtype"))
        hints.append((2 * B / (copy * 1e9) * 1e6, "the copy ceiling is not the fill's rate: use the fill "
                      "bandwidth of this dtype"))
    if name != "float32":
        try:
            f32 = {r["bytes"]: r for r in fill_sweep(rec, "float32")}
            hints.append((B / ((f32[B // 2]["eager_GBps"] + f32[2 * B]["eager_GBps"]) / 2 * 1e9) * 1e6,
                          f"that is the float32 rate; the fill kernel writes {name} at a different rate "
                          "(the element size sets its vector width and bytes per thread): use this dtype's rows"))
        except (NotRecorded, KeyError):
            pass
    near = [(abs(p - v) / v, h) for v, h in hints if v > 0 and abs(p - v) <= 0.015 * v]
    return min(near)[1] if near else None
