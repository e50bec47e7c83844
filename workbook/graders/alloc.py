"""Notebook 01's exercise 1.2: predict the price of a zero fill from the recorded sweep.

:func:`check_zero_fill_prediction` grades ``fn(rec, nbytes, dtype)`` (microseconds that ``torch.zeros``
adds to allocate-then-overwrite) against what the recorded fill rows support, and names the likely
mistake of a wrong answer (units, bytes vs MiB, averaged times, the wrong rate); its reference
solution is :func:`solution_zero_fill_prediction`. Exercise 1.1's grader is
:func:`workbook.coverage.check_pad_rows`.
"""
from __future__ import annotations

import math

import torch

from ..benchmarks.alloc import fill_sweep
from ..records import NotRecorded

__all__ = ["PREDICTION_SIZES", "check_zero_fill_prediction", "solution_zero_fill_prediction", "human"]

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
