"""The GPU benchmark of notebook 03: the fused SiLU-mul + FP8 group quant against its peers.

For M in :data:`BENCH_M` and N = :data:`BENCH_N` (input ``x`` [M, 2N] bf16) every peer is checked on
the very input it is timed on, then timed with both timers (``graph``: GPU time from CUDA-graph
replay; ``eager``: the per-call time of the Python call, :mod:`workbook.timing`). Achieved bandwidth
is :func:`bytes_moved` over the GPU time, against the copy ceiling measured in the same run. A sweep
of the fused kernel's launch configurations at :data:`SWEEP_M` is the evidence for the default tile
(:func:`workbook.fp8.launch_config`). ``run`` and ``table`` keep the contract of
:mod:`workbook.benchmarks`; the record is ``workbook/data/fp8.json``, its pictures
:func:`workbook.plots.fp8.plot_bandwidth`.
"""
from __future__ import annotations

import time

import torch

from ..device import DEVICE
from ..fp8 import (
    GROUP_SIZE, SILU_CANDIDATES, SILU_IMPL_NAMES, SILU_IMPL_TORCH, launch_config, num_packed_words,
    quant_fp8_packed, silu_impl, silu_impl_mismatches, silu_mul_quant_fp8_packed, silu_mul_quant_fp8_reference,
    silu_mul_reference,
)
from ..records import Measurement, format_table
from ..timing import copy_ceiling_GBps, graph_time_us, require_gpu, time_both

__all__ = ["run", "table", "measure", "bytes_moved", "BENCH_M", "BENCH_N", "SMOKE_M", "SWEEP_M", "SWEEP_BLOCK_M",
           "SWEEP_WARPS", "METHODS", "PEERS"]

BENCH_N = 7168
BENCH_M = (1, 4, 16, 64, 256, 1024, 2048, 4096, 8192, 16384)
SMOKE_M = (1, 256, 4096, 16384)    # what notebook 03 times live (run(smoke=True)); no sweep
SWEEP_M = (2048, 4096, 16384)      # the launch-configuration sweep (GPU time, graph replay)
SWEEP_BLOCK_M = (2, 4, 8, 16)
SWEEP_WARPS = (2, 4, 8)   # 2 warps at BLOCK_M 2 (16 elements per thread): the default

# the "integer roundings" peer: the EMULATE path and torch's own silu sequence, on the GPU
_INTEGER_ROUNDINGS = {"emulate": True, "config": {"SILU_IMPL": SILU_IMPL_TORCH}}

PEERS = {
    "fused_triton": "this kernel: one launch, x read once",
    "fused_integer_roundings": "the same kernel with the interpreter's integer roundings and "
                               "torch's silu sequence (libdevice expf, div_rn) on the GPU",
    "torch_compile": "torch.compile(dynamic=True) of silu_mul_quant_fp8_reference",
    "unfused": "eager torch silu-mul (y materialized), then this workbook's quant-only kernel",
    "torch_eager": "silu_mul_quant_fp8_reference run eagerly",
}

# How each figure of the record was taken: the timers (the record's "timers") and the rest
# (results["notes"]).
METHODS = {
    "timers": {
        "graph": "per-call GPU time, a CUDA graph of 20 calls replayed (triton.testing.do_bench median of "
                 "the replay, divided by 20): the rows' <peer>_graph_us; config_sweep's graph_us: the median "
                 "of 3 such windows, the fused kernel with that config",
        "eager": "triton.testing.do_bench median of one Python call, L2 flushed between runs (host work "
                 "and the launch path included): the rows' <peer>_eager_us",
    },
    "notes": {
        "bytes_model": "read M*2N*2 (x, bf16) + write M*N (codes) + write M*ceil(N/512)*4 (packed scales)",
        **{f"peers.{k}": v for k, v in PEERS.items()},
        "<peer>_GBps": "bytes_model / <peer>_graph_us (bytes_model / <peer>_eager_us where "
                       "<peer>_graph_error says why the peer could not be captured in a CUDA graph)",
        "fused_fraction_of_copy": "fused_triton_GBps / ceilings.copy_GBps",
        "ceilings.copy_GBps": "one 1 GiB fp32 device-to-device copy, do_bench median, bytes read + written",
        "history.block_m_default": "Before this record, a sweep at M = 4096 (graph replay) put the tiles "
                                   "with 16 elements per thread (BLOCK_M = num_warps = 1, 2, 4, 8) ahead of "
                                   "the earlier 2 rows x 4 warps (8 per thread); config_sweep repeats the "
                                   "sweep (BLOCK_M 2..16 x 2, 4, 8 warps at M = 2048, 4096, 16384) and is "
                                   "the evidence for the default BLOCK_M = 2 on 2 warps.",
        "history.silu_variants": "A bare ex2.approx.ftz + rcp.approx.ftz silu variant was tried on the "
                                 "H200 (2026-11-30, not measured in this record): 3 of the 65280 finite "
                                 "bf16 gates round differently from torch, so the proof "
                                 "(workbook.fp8.silu_impl) would never pick it; it was taken out of SILU_IMPL.",
    },
}


def bytes_moved(m: int, n: int) -> int:
    """Fewest bytes: read x once (2N bf16 per row), write codes (N bytes) and the packed scales."""
    return m * 2 * n * 2 + m * n + num_packed_words(n // GROUP_SIZE) * m * 4


def _unfused(x: torch.Tensor):
    """The unfused path: silu-mul in eager torch (y materialized in HBM), then the quant kernel."""
    return quant_fp8_packed(silu_mul_reference(x))


def _exact(x: torch.Tensor, q_ref, s_ref, **kw) -> bool:
    """Whether the fused kernel (with keywords ``kw``) gives the reference's bytes on ``x``."""
    q, s = silu_mul_quant_fp8_packed(x, **kw)
    return bool(torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref))


def _peers(x: torch.Tensor, compiled) -> dict:
    return {
        "fused_triton": lambda: silu_mul_quant_fp8_packed(x),
        "fused_integer_roundings": lambda: silu_mul_quant_fp8_packed(x, **_INTEGER_ROUNDINGS),
        "torch_compile": lambda: compiled(x),
        "unfused": lambda: _unfused(x),
        "torch_eager": lambda: silu_mul_quant_fp8_reference(x),
    }


def _time_peer(row: dict, name: str, fn, nbytes: int) -> None:
    """``<name>_graph_us`` (or ``<name>_graph_error``), ``<name>_eager_us`` and ``<name>_GBps`` into
    ``row``: GPU time from graph replay (no host work in between); eager do_bench also measures Python
    and the launch path, which dominate small calls."""
    fn(), fn()  # compile / specialize outside the timed region
    torch.cuda.synchronize()
    t = time_both(fn)
    if "graph_us" in t:
        row[f"{name}_graph_us"] = round(t["graph_us"], 3)
    row[f"{name}_eager_us"] = round(t["eager_us"], 3)
    if "graph_error" in t:   # a peer that cannot be captured keeps its eager time, and says why
        row[f"{name}_graph_error"] = t["graph_error"]
    row[f"{name}_GBps"] = round(nbytes / (t.get("graph_us", t["eager_us"]) * 1e-6) / 1e9, 1)


def _row(m: int, n: int, compiled, ceiling: float) -> dict:
    """One M: correctness of what is timed, on this very input, then every peer with both timers."""
    x = torch.randn(m, 2 * n, device=DEVICE, dtype=torch.bfloat16) * 3
    q_ref, s_ref = silu_mul_quant_fp8_reference(x)
    exact = {"fused_triton": _exact(x, q_ref, s_ref),
             "fused_integer_roundings": _exact(x, q_ref, s_ref, **_INTEGER_ROUNDINGS)}
    nbytes = bytes_moved(m, n)
    row = {"M": m, "N": n, "bytes": nbytes, "exact": exact["fused_triton"],
           "exact_integer_roundings": exact["fused_integer_roundings"]}
    for name, fn in _peers(x, compiled).items():
        _time_peer(row, name, fn, nbytes)
    row["fused_fraction_of_copy"] = round(row["fused_triton_GBps"] / ceiling, 3)
    us = {k: row.get(f"{k}_graph_us", float("nan")) for k in PEERS}
    print(f"M={m:6d}  fused {us['fused_triton']:9.2f} us ({row['fused_triton_GBps']:7.0f} GB/s, "
          f"{100 * row['fused_fraction_of_copy']:.0f}% of copy)  compile {us['torch_compile']:9.2f}  "
          f"unfused {us['unfused']:9.2f}  eager {us['torch_eager']:9.2f}  "
          f"int-roundings {us['fused_integer_roundings']:9.2f}  exact={exact}", flush=True)
    return row


def _sweep(m: int, n: int, ceiling: float) -> list[dict]:
    """The launch configurations the default (workbook.fp8.launch_config) was chosen from, at M rows:
    GPU time from graph replay, median of 3 windows."""
    x = torch.randn(m, 2 * n, device=DEVICE, dtype=torch.bfloat16) * 3
    q_ref, s_ref = silu_mul_quant_fp8_reference(x)
    nbytes = bytes_moved(m, n)
    default = launch_config(m)
    out = []
    for bm in SWEEP_BLOCK_M:
        for warps in SWEEP_WARPS:
            cfg = {"BLOCK_M": bm, "num_warps": warps}
            ok = _exact(x, q_ref, s_ref, config=cfg)
            t = graph_time_us(lambda: silu_mul_quant_fp8_packed(x, config=cfg), windows=3)
            out.append({"M": m, "N": n, "BLOCK_M": bm, "num_warps": warps, "graph_us": round(t, 3),
                        "fraction_of_copy": round(nbytes / (t * 1e-6) / 1e9 / ceiling, 3), "exact": ok,
                        "default": bm == default["BLOCK_M"] and warps == default["num_warps"]})
            print(f"  sweep M={m} BLOCK_M={bm} warps={warps}: {t:.1f} us "
                  f"({100 * out[-1]['fraction_of_copy']:.0f}% of copy) exact={ok}", flush=True)
    del x
    torch.cuda.empty_cache()
    return out


def _silu_results() -> dict:
    """The SiLU sequence the proof chose on this GPU, and every candidate's mismatch count."""
    return {"silu_impl": silu_impl(), "silu_impl_name": SILU_IMPL_NAMES[silu_impl()],
            "silu_impl_mismatches": {str(k): silu_impl_mismatches(k) for k in SILU_CANDIDATES}}


def measure(ms=BENCH_M, n: int = BENCH_N, sweep_m=SWEEP_M, budget_s: float | None = None) -> Measurement:
    """Time the fused kernel against torch.compile of the reference, the unfused path and the eager
    reference, for M in ``ms`` and N = ``n``, and the fused kernel's launch configurations at M in
    ``sweep_m``. Past ``budget_s`` seconds the remaining sizes are skipped (``results["skipped"]``)."""
    require_gpu("benchmarks.fp8")
    start = time.monotonic()
    over = lambda: budget_s is not None and time.monotonic() - start > budget_s  # noqa: E731
    ceiling = copy_ceiling_GBps()
    compiled = torch.compile(silu_mul_quant_fp8_reference, dynamic=True)
    rows, sweep, skipped = [], [], []
    for m in ms:
        if over():
            skipped.append(f"rows M={m}")
            continue
        rows.append(_row(m, n, compiled, ceiling))
    for m in sweep_m:
        if over():
            skipped.append(f"config_sweep M={m}")
            continue
        sweep += _sweep(m, n, ceiling)
    results = {"N": n, "rows": rows, "config_sweep": sweep, **_silu_results(), "notes": dict(METHODS["notes"])}
    if skipped:
        results["skipped"] = skipped
    return Measurement(results=results, timers=dict(METHODS["timers"]), ceilings={"copy_GBps": round(ceiling, 1)})


def run(*, budget_s: float | None = None, smoke: bool = False) -> Measurement:
    """The benchmark contract (:mod:`workbook.benchmarks`): the full set (:data:`BENCH_M` and the sweep
    at :data:`SWEEP_M`), or with ``smoke`` the few sizes notebook 03 times live (:data:`SMOKE_M`, no
    sweep)."""
    if smoke:
        return measure(SMOKE_M, BENCH_N, (), budget_s)
    return measure(BENCH_M, BENCH_N, SWEEP_M, budget_s)


def table(rec: dict) -> str:
    """The record's rows as a text table (``rec`` a record, or any dict with its ``results``): GPU time
    per call from CUDA-graph replay for every peer, then the fused kernel's eager per-call time
    (do_bench, host included) beside it."""
    rows = rec["results"]["rows"]
    columns = [
        ("M", "M", "d"),
        ("fused graph us", "fused_triton_graph_us", ".2f"),
        ("GB/s", "fused_triton_GBps", ".0f"),
        ("%copy", lambda r: 100 * r["fused_fraction_of_copy"], ".0f"),
        ("compile graph us", "torch_compile_graph_us", ".2f"),
        ("unfused graph us", "unfused_graph_us", ".2f"),
        ("eager-ref graph us", "torch_eager_graph_us", ".2f"),
        ("int-round graph us", "fused_integer_roundings_graph_us", ".2f"),
        ("| fused eager us", "fused_triton_eager_us", ".2f"),
        ("exact", lambda r: str(r["exact"] and r["exact_integer_roundings"]), ""),
    ]
    out = format_table(rows, columns, title="GPU time per call (CUDA-graph replay) | fused eager: the same "
                                            "call, eager per-call (do_bench)")
    failed = sorted({k[:-len("_graph_error")] for r in rows for k in r if k.endswith("_graph_error")})
    if failed:
        out += "\ntimed eagerly only (could not be captured in a CUDA graph; GB/s from eager time): " + ", ".join(failed)
    return out
