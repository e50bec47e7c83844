"""The CUDA C++ kernels against the Triton ones on the GPU (``python -m workbook bench cuda`` ->
``workbook/data/cuda.json``; notebooks 02 and 03 show it through :mod:`workbook.plots.cuda`).

Both backends are called through the public launchers (``nvfp4.nvfp4_quant(..., backend=...)``,
``fp8.silu_mul_quant_fp8_packed(..., backend=...)``) at the sizes of the Triton records
(:data:`workbook.benchmarks.nvfp4.BENCH_SIZES`: bf16, swizzled scales; M in
:data:`workbook.benchmarks.fp8.BENCH_M` at N = ``BENCH_N``, the fused SiLU-mul op). Per size and
backend: GPU time from CUDA-graph replay (``<peer>_graph_us``) beside the eager per-call time
(``<peer>_eager_us``), the share of the copy ceiling, and whether both gave the reference's bytes.
The full run adds the CUDA NVFP4 backend over the Triton record's heatmap grid (each cell after
:data:`HEATMAP_SETTLE_S` seconds of idle GPU, with its launch plan), the power probe at
:data:`POWER_SIZES`, and the static SASS of both backends' kernels. ``smoke=True`` times one size per
topic (what a notebook times live, :func:`live`). The record's ``results["notes"]`` say what each
figure is; its ``timers`` say how it was timed.
"""
from __future__ import annotations

import torch

from .. import fp8, nvcc, nvfp4, sass
from ..device import DEVICE
from ..records import Measurement, format_table
from ..timing import copy_ceiling_GBps, graph_time_us, power_probe, require_gpu, time_us
from . import fp8 as fp8_bench
from . import nvfp4 as nvfp4_bench

__all__ = ["run", "table", "live", "POWER_SIZES", "HEATMAP_SETTLE_S", "SMOKE_SIZES", "TIMERS", "NOTES"]

POWER_SIZES = [(16384, 8192), (8192, 8192)]   # NVFP4 inputs (bf16) probed for power: many waves, 1.3 waves
HEATMAP_SETTLE_S = 0.5   # seconds the GPU idles before each heatmap cell's timing (NOTES["nvfp4_heatmap"])
SMOKE_SIZES = {"nvfp4": [(4096, 4096)], "fp8": [4096]}   # smoke / live: one size per topic (fp8 at BENCH_N)

TIMERS = {
    "graph": "GPU time per call from CUDA-graph replay: a CUDA graph of 20 calls replayed "
             "(workbook.timing.graph_time_us: do_bench median of the replay / 20; nvfp4 rows: median of 5 "
             "windows, as in the nvfp4 record); <peer>_graph_us, and the heatmap's graph_us and "
             "copy_same_bytes_graph_us",
    "eager": "eager per-call time: triton.testing.do_bench median of one Python call through the public "
             "launcher, L2 flushed between runs (host work and the launch path included); <peer>_eager_us",
}

NOTES = {
    "peers": "cuda = the launcher with backend='cuda' (kernels/cuda/<topic>.cu), triton = backend='triton' "
             "(the default); both through workbook.nvfp4.nvfp4_quant / workbook.fp8.silu_mul_quant_fp8_packed",
    "<peer>_GBps": "bytes / <peer>_graph_us (fewest bytes: inputs read once, outputs written once)",
    "<peer>_frac_of_copy": "<peer>_GBps / ceilings.copy_GBps",
    "ceilings.copy_GBps": "one 1 GiB fp32 device-to-device copy, do_bench median, bytes read + written",
    "nvfp4_heatmap": "the CUDA backend (swizzled scales) on the nvfp4 record's heatmap grid, bf16 and fp16: "
                     "graph_us = GPU time from CUDA-graph replay (graph_time_us), frac_of_copy = bytes / graph_us / "
                     "the copy ceiling; copy_same_bytes_graph_us = a device copy of the same bytes, same timer "
                     "(workbook.benchmarks.nvfp4.measure_heatmap); each quantizer timing after settle_s = "
                     "HEATMAP_SETTLE_S seconds of idle GPU, so that no cell inherits the clock of a power-capped "
                     "cell before it (the cells in order: K, then M, then bf16 before fp16); plan = the launch "
                     "(nvfp4_launch_plan): wide CTAs (whole tiles of 128 x 32 blocks), pieces (CTAs of the same "
                     "launch on piece_rows rows of a tile; > 0 where one wave would leave at most half the SMs a "
                     "tile more), narrow CTAs (128 x 8, a second launch; > 0 where the tail rule split a thin "
                     "last wave, or a wave that would leave more than half and at most 7/8 of the SMs a tile "
                     "more), slots (wide CTAs resident at once), sms",
    "power": "workbook.timing.power_probe: a CUDA graph of the calls replayed back to back for 2.5 s while "
             "nvidia-smi samples the SM clock, board power, power limit and clock-event reasons every 50 ms "
             "(the first 0.5 s dropped); power_capped_share = the share of samples with the software power "
             "cap active. The copy, then each size of POWER_SIZES with the CUDA and the Triton NVFP4 launcher",
    "sass_sm90": "CUDA kernels compiled for sm_90 here (nvcc, cuobjdump; workbook.sass.sass_counts): static "
                 "count of the instructions up to the main path's EXIT (the out-of-line IEEE-division slow "
                 "path excluded) / elements per thread",
    "sass_sm90_triton": "Triton kernels as this GPU compiled them (asm['sass']): static count of all "
                        "instructions but NOPs / elements per thread (workbook.benchmarks.nvfp4.sass_counts's method)",
}


# --------------------------------------------------------------------------------------------------
# The contract: run and table
# --------------------------------------------------------------------------------------------------

def run(*, budget_s: float | None = None, smoke: bool = False) -> Measurement:
    """CUDA vs Triton at the Triton records' sizes (``smoke``: :data:`SMOKE_SIZES` only, no heatmap,
    power probe or SASS); ``budget_s`` is ignored (every row is needed for the comparison). The
    measurements run in this order: NVFP4 rows, heatmap, power, FP8 rows, SASS."""
    del budget_s
    require_gpu("benchmarks.cuda.run")
    nvcc.build()
    ceiling = copy_ceiling_GBps()
    nv_sizes = SMOKE_SIZES["nvfp4"] if smoke else nvfp4_bench.BENCH_SIZES
    results = {"nvfp4": {"rows": nvfp4_rows(nv_sizes, ceiling), "dtype": "bfloat16", "layout": "swizzled",
                         "bytes_model": "read M*K*2 (x) + write M*K/2 (codes) + the swizzled scales"}}
    if not smoke:
        results["nvfp4_heatmap"] = nvfp4_heatmap(ceiling)
        results["power"] = power()
    results["fp8"] = {"rows": fp8_rows(SMOKE_SIZES["fp8"] if smoke else fp8_bench.BENCH_M, fp8_bench.BENCH_N,
                                       ceiling),
                      "op": "fused silu-mul + quant (silu_mul_quant_fp8_packed)",
                      "bytes_model": "read M*2N*2 (x, bf16) + write M*N (codes) + write M*ceil(N/512)*4 (scales)"}
    if not smoke:
        results["sass_sm90"] = cuda_sass()
        results["sass_sm90_triton"] = triton_sass()
        results["build_flags"] = " ".join(nvcc.BUILD_FLAGS)
    results["notes"] = dict(NOTES)
    return Measurement(results=results, timers=dict(TIMERS), ceilings={"copy_GBps": round(ceiling, 1)})


def table(rec: dict, topic: str = "nvfp4") -> str:
    """The rows of ``topic`` ('nvfp4' or 'fp8') of a record (or of :func:`live`'s record-like dict)
    as a text table: GPU time from graph replay beside eager per-call time, each labelled."""
    if topic not in ("nvfp4", "fp8"):
        raise ValueError(f"topic must be 'nvfp4' or 'fp8', got {topic!r}")
    size = "K" if topic == "nvfp4" else "N"
    columns = [
        ("M", "M", ""), (size, size, ""),
        ("CUDA graph us", "cuda_graph_us", ".2f"),
        ("%copy", lambda r: 100 * r["cuda_frac_of_copy"], ".1f"),
        ("Triton graph us", "triton_graph_us", ".2f"),
        ("%copy", lambda r: 100 * r["triton_frac_of_copy"], ".1f"),
        ("Triton/CUDA", "cuda_speedup_vs_triton", ".2f"),
        ("CUDA eager us", "cuda_eager_us", ".2f"),
        ("Triton eager us", "triton_eager_us", ".2f"),
        ("exact", lambda r: r["exact_cuda"] and r["exact_triton"] and r["cuda_equals_triton"], ""),
    ]
    title = ("graph us = GPU time per call (CUDA-graph replay); eager us = eager per-call time (do_bench, "
             "host included); %copy = share of the copy ceiling; exact = both backends gave the reference's bytes")
    return format_table(rec["results"][topic]["rows"], columns, title=title)


def live(topic: str) -> dict:
    """One size of ``topic`` (:data:`SMOKE_SIZES`) timed now on this GPU, both backends, as a
    record-like dict that :func:`table` reads (``{"ceilings", "results": {topic: {"rows"}}}``)."""
    if topic not in SMOKE_SIZES:
        raise ValueError(f"topic must be one of {sorted(SMOKE_SIZES)}, got {topic!r}")
    require_gpu("benchmarks.cuda.live")
    nvcc.build()
    ceiling = copy_ceiling_GBps()
    rows = (nvfp4_rows(SMOKE_SIZES["nvfp4"], ceiling) if topic == "nvfp4"
            else fp8_rows(SMOKE_SIZES["fp8"], fp8_bench.BENCH_N, ceiling))
    return {"ceilings": {"copy_GBps": round(ceiling, 1)}, "results": {topic: {"rows": rows}}}


# --------------------------------------------------------------------------------------------------
# One function per measured thing
# --------------------------------------------------------------------------------------------------

def _timed(row: dict, peer: str, fn, nbytes: int, ceiling: float, windows: int) -> None:
    """``<peer>_eager_us``, ``<peer>_graph_us`` (median of ``windows`` replay windows), the bandwidth
    from the graph time and its share of the copy ceiling, into ``row``."""
    fn(), fn()
    torch.cuda.synchronize()
    row[f"{peer}_eager_us"] = round(time_us(fn), 3)
    row[f"{peer}_graph_us"] = round(graph_time_us(fn, windows=windows), 3)
    row[f"{peer}_GBps"] = round(nbytes / (row[f"{peer}_graph_us"] * 1e-6) / 1e9, 1)
    row[f"{peer}_frac_of_copy"] = round(row[f"{peer}_GBps"] / ceiling, 3)


def _same(a: tuple, b: tuple) -> bool:
    """Whether two (codes, scales) pairs hold the same bytes."""
    u8 = (lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)
    return bool(all(torch.equal(u8(p), u8(q)) for p, q in zip(a, b)))


def nvfp4_rows(sizes, ceiling: float) -> list[dict]:
    """Per (M, K) of ``sizes`` (bf16, swizzled): both backends' bytes against ``quantize_ref`` and each
    other, and their times (graph replay: median of 5 windows, as in the nvfp4 record)."""
    rows = []
    for M, K in sizes:
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        gs = nvfp4.global_scale_of(x)
        ref = nvfp4.quantize_ref(x, gs)
        cu = nvfp4.nvfp4_quant(x, gs, backend="cuda")
        tr = nvfp4.nvfp4_quant(x, gs, backend="triton")
        nbytes = nvfp4_bench.bytes_moved(M, K)
        row = {"M": M, "K": K, "bytes": nbytes, "exact_cuda": _same(cu, ref), "exact_triton": _same(tr, ref),
               "cuda_equals_triton": _same(cu, tr)}
        _timed(row, "cuda", lambda: nvfp4.nvfp4_quant(x, gs, backend="cuda"), nbytes, ceiling, 5)
        _timed(row, "triton", lambda: nvfp4.nvfp4_quant(x, gs, backend="triton"), nbytes, ceiling, 5)
        row["cuda_speedup_vs_triton"] = round(row["triton_graph_us"] / row["cuda_graph_us"], 3)
        rows.append(row)
        _print_row(f"nvfp4 {M:>6}x{K:<5}", row)
        del x, ref, cu, tr
        torch.cuda.empty_cache()
    return rows


def fp8_rows(ms, n: int, ceiling: float) -> list[dict]:
    """Per M of ``ms`` at N = ``n`` (x [M, 2N] bf16, the fused SiLU-mul op): both backends' bytes
    against the reference and each other, and their times (graph replay: one window)."""
    rows = []
    for m in ms:
        x = torch.randn(m, 2 * n, device=DEVICE, dtype=torch.bfloat16) * 3
        ref = fp8.silu_mul_quant_fp8_reference(x)
        cu = fp8.silu_mul_quant_fp8_packed(x, backend="cuda")
        tr = fp8.silu_mul_quant_fp8_packed(x, backend="triton")
        nbytes = fp8_bench.bytes_moved(m, n)
        row = {"M": m, "N": n, "bytes": nbytes, "exact_cuda": _same(cu, ref), "exact_triton": _same(tr, ref),
               "cuda_equals_triton": _same(cu, tr)}
        _timed(row, "cuda", lambda: fp8.silu_mul_quant_fp8_packed(x, backend="cuda"), nbytes, ceiling, 1)
        _timed(row, "triton", lambda: fp8.silu_mul_quant_fp8_packed(x, backend="triton"), nbytes, ceiling, 1)
        row["cuda_speedup_vs_triton"] = round(row["triton_graph_us"] / row["cuda_graph_us"], 3)
        rows.append(row)
        _print_row(f"fp8 M={m:>6} N={n}", row)
        del x, ref, cu, tr
        torch.cuda.empty_cache()
    return rows


def _print_row(what: str, row: dict) -> None:
    print(f"  {what} cuda {row['cuda_graph_us']:8.2f} us ({100 * row['cuda_frac_of_copy']:4.1f}% of copy)"
          f"  triton {row['triton_graph_us']:8.2f} us ({100 * row['triton_frac_of_copy']:4.1f}%)  "
          f"exact cuda={row['exact_cuda']} triton={row['exact_triton']}", flush=True)


def nvfp4_heatmap(ceiling: float) -> list[dict]:
    """The CUDA backend over the nvfp4 record's heatmap grid (every (M, K) of HEATMAP_M x HEATMAP_K,
    bf16 and fp16; a device copy of the same bytes beside each; each cell after HEATMAP_SETTLE_S
    seconds of idle GPU), the issue's 85% target, with each cell's launch plan (the tail rule: whole
    tiles, row pieces, narrow CTAs, wave size)."""
    heat = nvfp4_bench.measure_heatmap(ceiling, quant=lambda x, gs: nvfp4.nvfp4_quant(x, gs, backend="cuda"),
                                       settle_s=HEATMAP_SETTLE_S)
    for r in heat:
        plan = nvfp4.nvfp4_launch_plan(r["M"], r["K"], getattr(torch, r["dtype"]))
        r["plan"] = {k: plan[k] for k in ("wide", "pieces", "piece_rows", "narrow", "slots", "sms")}
    return heat


def power() -> dict:
    """The SM clock and board power while a copy and each NVFP4 launcher run back to back at
    POWER_SIZES (the quantizer does arithmetic on every byte and can meet the power cap, which lowers
    the clock); ``{"error": ...}`` where the probe fails (the timings are recorded regardless)."""
    out = {}
    try:
        src = torch.randn(1 << 28, device=DEVICE)
        dst = torch.empty_like(src)
        out["copy 1 GiB (fp32)"] = power_probe(lambda: dst.copy_(src), n=5)
        del src, dst
        for M, K in POWER_SIZES:
            x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
            gs = nvfp4.global_scale_of(x)
            for peer in ("cuda", "triton"):
                out[f"{peer} nvfp4 {M}x{K} bf16"] = power_probe(lambda: nvfp4.nvfp4_quant(x, gs, backend=peer))
            del x
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001  (the timings are recorded regardless)
        out = {"error": f"{type(e).__name__}: {e}"}
    return out


def cuda_sass() -> dict:
    """:func:`workbook.sass.sass_counts`, or ``{"error": ...}`` on a machine without cuobjdump (the
    timings are recorded regardless)."""
    try:
        return sass.sass_counts()
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def triton_sass() -> dict:
    """The Triton kernels' SASS as this GPU runs them, counted the same way (None where unavailable)."""
    try:
        return {"nvfp4 (512, 4) tile, large inputs": nvfp4_bench.sass_counts(),
                "nvfp4 (128, 1) tile, small inputs": nvfp4_bench.sass_counts({"BLOCK_S": 128, "num_warps": 1}),
                "fp8 fused, BLOCK_M = 8": _triton_fp8_sass()}
    except Exception as e:  # noqa: BLE001  (the timings are recorded regardless)
        return {"error": f"{type(e).__name__}: {e}"}


def _triton_fp8_sass() -> dict | None:
    """GPU only: static SASS count of Triton's fused FP8 kernel in one fixed configuration (BLOCK_M = 8,
    not the size rule's default, kept so records compare; 4 warps, the proven SILU_IMPL, EMULATE=False),
    per element a thread handles; None where the SASS cannot be read."""
    import re

    from ..kernels.fp8 import silu_mul_quant_fp8_kernel

    try:
        m, n, bm, warps = 64, 2048, 8, 4
        x = torch.randn(m, 2 * n, device=DEVICE, dtype=torch.bfloat16)
        codes = torch.empty(m, n, dtype=torch.uint8, device=DEVICE)
        storage = torch.empty(n // 512, m, dtype=torch.int32, device=DEVICE)
        compiled = silu_mul_quant_fp8_kernel[(m // bm, n // 512)](
            x, codes, storage, m, n, x.stride(0), codes.stride(0), storage.stride(0), GROUP=128, BLOCK_M=bm,
            SILU_MUL=True, SILU_IMPL=fp8.silu_impl(), EMULATE=False, num_warps=warps)
        listing = compiled.asm["sass"]
    except Exception:  # no cuobjdump, or a Triton without asm["sass"]
        return None
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", listing)
    ops = [o for o in ops if not o.startswith("NOP")]
    per_thread = bm * 512 / (32 * warps)
    return {"config": [bm, warps], "instructions": len(ops), "elements_per_thread": per_thread,
            "per_element": len(ops) / per_thread}
