"""The NVFP4 benchmark (``python -m workbook bench nvfp4``, notebook 02): ``nvfp4_quant`` on the H200
against the device's copy ceiling and against ``torch.compile`` of the pure-torch reference, the cost of
a zero-filled scale buffer, a sweep of tile sizes, the share of the copy ceiling over a grid of shapes,
and decode sizes beside the floor of a launch. Record: ``workbook/data/nvfp4.json``.

What each part times (every figure's key names its timer, :mod:`workbook.records`):

* ``sizes`` (:func:`measure_sizes`): per (M, K) of :data:`BENCH_SIZES`, bf16 input, the shipped
  launcher and the compiled reference, GPU time from CUDA-graph replay (median of 5 windows: this
  kernel runs the H200 into its power cap) and the eager per-call time beside it; achieved bandwidth
  is :func:`bytes_moved` over the graph time.
* ``zeros_vs_empty`` (:func:`measure_zeros_vs_empty`): a full quant call with the scale buffer from
  ``torch.zeros`` vs ``torch.empty``, eager and graph, and the zero fill alone.
* ``config_sweep`` (:func:`measure_config_sweep`): every tile of :data:`SWEEP_CONFIGS`, the one the
  launch rule ships marked.
* ``heatmap`` (:func:`measure_heatmap`): :data:`HEATMAP_M` x :data:`HEATMAP_K`, both input dtypes,
  beside a device copy of the same bytes (the CUDA benchmark times its backend on the same grid).
* ``small_m`` (:func:`measure_small_m`): decode sizes beside an empty kernel, both from graph replay.
* ``peer_bytes`` (:func:`measure_peer_bytes`, no timer): our bytes against torchao's ``nvfp4_quantize``
  (a peer no one here wrote) on the same inputs, when torchao is installed.

:func:`sass_counts` and :func:`instruction_budget` give the instruction side: what the kernel issues
per element, and what the copy ceiling allows.
"""
from __future__ import annotations

import re
import time

import numpy as np
import torch

from .. import nvfp4
from ..device import DEVICE, ON_GPU
from ..kernels.nvfp4 import empty_kernel, nvfp4_quant_kernel
from ..records import Measurement, format_table
from ..timing import copy_ceiling_GBps, graph_time_us, require_gpu, time_us

__all__ = [
    "BENCH_SIZES", "SMOKE_SIZES", "ZEROS_EMPTY_SIZES", "SWEEP_SIZES", "SWEEP_CONFIGS", "HEATMAP_K", "HEATMAP_M",
    "SMALL_M", "SMALL_K", "TARGET_FRAC", "TARGET_MIN_INPUT_BYTES", "TIMERS", "NOTES", "bytes_moved",
    "compiled_ref_timer", "run", "table", "measure_sizes", "measure_zeros_vs_empty", "measure_config_sweep",
    "measure_heatmap", "measure_small_m", "measure_peer_bytes", "PEER_INPUTS", "targets", "sass_counts", "instruction_budget",
]

BENCH_SIZES = [(128, 4096), (512, 4096), (1024, 8192), (3000, 5120), (4096, 8192), (12288, 7168), (16384, 8192)]
SMOKE_SIZES = [(128, 4096), (16384, 8192)]     # run(smoke=True): the two sizes notebook 02 times live
ZEROS_EMPTY_SIZES = [(1, 4096), (16, 4096), (128, 8192), (16384, 8192)]
SWEEP_SIZES = [(16384, 8192), (12288, 7168), (3000, 5120), (8192, 4096)]
# the tiles the sweep times and the tests run: every tile size the launch rule can pick is among them
SWEEP_CONFIGS = [{"BLOCK_S": bs, "num_warps": w} for bs, w in
                 [(1024, 8), (512, 4), (512, 2), (256, 4), (256, 2), (128, 2), (128, 1), (64, 1), (32, 1)]]
# the share of the copy ceiling over (M, K), both input dtypes, with the launch rule's tile
HEATMAP_K = (2048, 4096, 5120, 7168, 8192, 14336)
HEATMAP_M = (1024, 2048, 3000, 4096, 8192, 12288, 16384)
SMALL_M = (1, 16, 128, 512)        # decode sizes: GPU time beside an empty kernel's, both in a graph
SMALL_K = (4096, 8192)
TARGET_FRAC = 0.85                 # issue #11: >= 85% of the copy ceiling ...
TARGET_MIN_INPUT_BYTES = 64 << 20  # ... for every input of 64 MiB or more

TIMERS = {
    "graph": "GPU time per call, replayed from a CUDA graph of 20 calls (workbook.timing.graph_time_us); "
             "sizes: median of 5 100-ms windows; zeros_vs_empty, config_sweep, heatmap and small_m: one "
             "100-ms window",
    "eager": "per-call time of eager calls (workbook.timing.time_us = triton.testing.do_bench, median): host "
             "work (Python, checks, launch) included, which dominates small calls",
}
NOTES = {
    "compiled_ref": "torch.compile(quantize_ref, dynamic=False). Where its CUDA graph cannot be captured, a "
                    "sizes row holds compiled_ref_eager_us only (no compiled_ref_graph_us), and its "
                    "compiled_ref_GBps and speedup_vs_compiled use that eager time",
}


def bytes_moved(M: int, K: int) -> int:
    """Bytes one quant call of an [M, K] 16-bit input moves: x read (2MK), the codes (MK/2) and the
    swizzled scales, padding included (Mp * Kp), written."""
    Mp, Kp = nvfp4.padded_scale_shape(M, K)
    return M * K * 2 + M * K // 2 + Mp * Kp


def compiled_ref_timer(row: dict) -> str:
    """The timer of a ``sizes`` row's compiled-reference figures: ``graph``, or ``eager`` where its CUDA
    graph could not be captured (``NOTES["compiled_ref"]``)."""
    return "graph" if row.get("compiled_ref_graph_us") is not None else "eager"


def _compiled_ref():
    import torch._dynamo

    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    return torch.compile(nvfp4.quantize_ref, dynamic=False)


# --------------------------------------------------------------------------------------------------
# One function per measured thing
# --------------------------------------------------------------------------------------------------

def _measure_size(M: int, K: int, ref_c, ceiling: float) -> dict:
    """One ``sizes`` row: the launcher and the compiled reference at [M, K], checked against
    ``quantize_ref``, timed eagerly and from graph replay."""
    x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
    gs = nvfp4.global_scale_of(x)
    codes, sf = nvfp4.nvfp4_quant(x, gs)
    rc, rs = nvfp4.quantize_ref(x, gs)
    cc, cs = ref_c(x, gs, True)
    exact = torch.equal(codes, rc) and torch.equal(sf.view(torch.uint8), rs.view(torch.uint8))
    comp_mismatch = int((cc != rc).sum()) + int((cs.view(torch.uint8) != rs.view(torch.uint8)).sum())
    # eager do_bench includes host time (Python + launch), which dominates below ~10 us; the GPU
    # figure is the per-call time replayed from a CUDA graph (same kernels, no host in between)
    t_tri_eager = time_us(lambda: nvfp4.nvfp4_quant(x, gs))
    t_ref_eager = time_us(lambda: ref_c(x, gs, True))
    # median of 5 windows: this kernel runs the H200 into its power cap (see graph_time_us)
    t_tri = graph_time_us(lambda: nvfp4.nvfp4_quant(x, gs), windows=5)
    try:
        t_ref_graph = graph_time_us(lambda: ref_c(x, gs, True), windows=5)
    except Exception:  # a compiled graph that cannot be captured: its eager time stands in
        t_ref_graph = None
    t_ref = t_ref_eager if t_ref_graph is None else t_ref_graph
    nbytes = bytes_moved(M, K)
    row = {"M": M, "K": K, "bytes": nbytes, "triton_graph_us": t_tri}
    if t_ref_graph is not None:
        row["compiled_ref_graph_us"] = t_ref_graph
    row.update({"triton_eager_us": t_tri_eager, "compiled_ref_eager_us": t_ref_eager,
                "triton_GBps": nbytes / t_tri / 1e3, "compiled_ref_GBps": nbytes / t_ref / 1e3,
                "triton_frac_of_copy": nbytes / t_tri / 1e3 / ceiling,
                "speedup_vs_compiled": t_ref / t_tri, "exact_vs_ref": exact,
                "compiled_ref_mismatched_bytes": comp_mismatch,
                "config": list(nvfp4.launch_tile(M, K))})
    print(f"  {M:>6}x{K:<5} triton {t_tri:8.1f} us {row['triton_GBps']:7.0f} GB/s "
          f"({100 * row['triton_frac_of_copy']:4.1f}% of copy)  compiled ref {t_ref:8.1f} us  "
          f"x{row['speedup_vs_compiled']:.2f}  exact={exact}")
    return row


def measure_sizes(sizes=BENCH_SIZES, ceiling: float | None = None) -> list[dict]:
    """GPU: the ``sizes`` rows (bandwidth against the copy ceiling, speed against the compiled
    reference), one per (M, K); ``ceiling`` in GB/s (measured here if None)."""
    require_gpu("nvfp4 sizes")
    ceiling = copy_ceiling_GBps() if ceiling is None else ceiling
    ref_c = _compiled_ref()
    rows = []
    for M, K in sizes:
        rows.append(_measure_size(M, K, ref_c, ceiling))
        torch.cuda.empty_cache()
    return rows


def measure_zeros_vs_empty(sizes=ZEROS_EMPTY_SIZES) -> list[dict]:
    """GPU: a full quant call with the scale buffer from torch.zeros vs torch.empty, per (M, K): eager
    (``timing.time_us``) and replayed from a CUDA graph (``timing.graph_time_us``), plus the zero fill
    alone (eager). Rows as in the record's ``zeros_vs_empty``."""
    require_gpu("nvfp4 zeros vs empty")
    zve = []
    for M, K in sizes:
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        gs = nvfp4.global_scale_of(x)
        Mp, Kp = nvfp4.padded_scale_shape(M, K)
        row = {"M": M, "K": K, "scale_bytes": Mp * Kp}
        for alloc in ("zeros", "empty"):
            row[f"{alloc}_eager_us"] = time_us(lambda: nvfp4.nvfp4_quant(x, gs, alloc=alloc))
            row[f"{alloc}_graph_us"] = graph_time_us(lambda: nvfp4.nvfp4_quant(x, gs, alloc=alloc))
        row["memset_alone_eager_us"] = time_us(lambda: torch.zeros((Mp, Kp), dtype=torch.uint8, device=DEVICE))
        zve.append(row)
        print(f"  zeros vs empty M={M:>5} K={K}: eager {row['zeros_eager_us']:.1f} vs {row['empty_eager_us']:.1f} us, "
              f"graph {row['zeros_graph_us']:.2f} vs {row['empty_graph_us']:.2f} us")
    return zve


def measure_config_sweep(sizes=SWEEP_SIZES, ceiling: float | None = None, configs=SWEEP_CONFIGS) -> list[dict]:
    """GPU: every tile of ``configs`` per (M, K), GPU time from graph replay, checked against the
    reference; ``shipped`` marks the tile the launch rule picks."""
    require_gpu("nvfp4 config sweep")
    ceiling = copy_ceiling_GBps() if ceiling is None else ceiling
    sweep = []
    for M, K in sizes:
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        gs = nvfp4.global_scale_of(x)
        nbytes = bytes_moved(M, K)
        rc, rs = nvfp4.quantize_ref(x, gs)
        for cfg in configs:
            c, s = nvfp4.nvfp4_quant(x, gs, config=cfg)
            ok = torch.equal(c, rc) and torch.equal(s.view(torch.uint8), rs.view(torch.uint8))
            t = graph_time_us(lambda: nvfp4.nvfp4_quant(x, gs, config=cfg))
            tile = nvfp4.launch_tile(M, K, cfg)
            sweep.append({"M": M, "K": K, "config": list(tile), "graph_us": t, "exact_vs_ref": ok,
                          "frac_of_copy": nbytes / t / 1e3 / ceiling, "shipped": tile == nvfp4.launch_tile(M, K)})
            print(f"  sweep {M}x{K} (BLOCK_S, warps)={tile}: {t:.1f} us "
                  f"{100 * sweep[-1]['frac_of_copy']:.1f}% of copy exact={ok}")
        del x, rc, rs, c, s
        torch.cuda.empty_cache()
    return sweep


def measure_heatmap(ceiling: float, ks=HEATMAP_K, ms=HEATMAP_M, quant=None, settle_s: float = 0.0) -> list[dict]:
    """GPU: the shipped launcher (launch rule's tile) on every (M, K), bf16 and fp16, GPU time from
    graph replay, as a share of the copy ceiling; beside it a device copy that moves the same number
    of bytes (read + written), timed the same way: what a copy achieves at that size. ``quant(x, gs)``
    times another launcher of the same bytes instead (the CUDA benchmark: the CUDA backend); its rows
    carry ``config`` None. ``settle_s`` > 0: the GPU idles that many seconds before each quantizer
    timing, so that every cell starts from a rested card (a kernel that reaches the board's power cap
    lowers the clock for what runs right after it; without a pause a cell also measures the cell
    before it). Each row records its ``settle_s``."""
    if not isinstance(settle_s, (int, float)) or not settle_s >= 0:
        raise ValueError(f"settle_s must be a number of seconds >= 0, got {settle_s!r}")
    fn = quant or nvfp4.nvfp4_quant
    heat = []
    for K in ks:
        for M in ms:
            nbytes = bytes_moved(M, K)
            src = torch.empty(nbytes // 4, dtype=torch.int16, device=DEVICE)
            dst = torch.empty_like(src)
            t_copy = graph_time_us(lambda: dst.copy_(src))
            del src, dst
            for dtype in (torch.bfloat16, torch.float16):
                x = torch.randn(M, K, device=DEVICE, dtype=dtype)
                gs = nvfp4.global_scale_of(x)
                fn(x, gs)   # compiled, and built on first use, before the pause
                torch.cuda.synchronize()
                if settle_s:
                    time.sleep(settle_s)
                t = graph_time_us(lambda: fn(x, gs))
                heat.append({"M": M, "K": K, "dtype": str(dtype).removeprefix("torch."), "input_bytes": M * K * 2,
                             "bytes": nbytes, "graph_us": t, "frac_of_copy": nbytes / t / 1e3 / ceiling,
                             "copy_same_bytes_graph_us": t_copy, "frac_of_same_size_copy": t_copy / t,
                             "config": None if quant else list(nvfp4.launch_tile(M, K)), "settle_s": settle_s})
                print(f"  heatmap {M:>6}x{K:<5} {heat[-1]['dtype']}: {t:7.1f} us "
                      f"{100 * heat[-1]['frac_of_copy']:5.1f}% of copy (a copy of the same bytes: {t_copy:.1f} us)")
                del x
            torch.cuda.empty_cache()
    return heat


def measure_small_m(ms=SMALL_M, ks=SMALL_K) -> dict:
    """GPU: at decode sizes, the quant call's GPU time (graph replay) beside the floor of any launch:
    an empty Triton kernel (one program, no work) timed the same way."""
    z = torch.empty(1, device=DEVICE)
    floor = graph_time_us(lambda: empty_kernel[(1,)](z))
    rows = []
    for M in ms:
        for K in ks:
            x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
            gs = nvfp4.global_scale_of(x)
            rows.append({"M": M, "K": K, "graph_us": graph_time_us(lambda: nvfp4.nvfp4_quant(x, gs)),
                         "config": list(nvfp4.launch_tile(M, K))})
    return {"empty_kernel_graph_us": floor, "rows": rows}


def targets(rows: list[dict], heat: list[dict]) -> dict:
    """The issue's targets, counted from the ``sizes`` and ``heatmap`` rows."""
    big = rows[-1]
    large = [r for r in heat if r["input_bytes"] >= TARGET_MIN_INPUT_BYTES]
    return {
        "largest": f"{big['M']}x{big['K']}",
        "frac_of_copy_at_largest": big["triton_frac_of_copy"],
        "reached_80pct_at_largest": big["triton_frac_of_copy"] >= 0.8,
        "faster_than_compiled_everywhere": all(r["speedup_vs_compiled"] > 1 for r in rows),
        "large_inputs": len(large),
        "large_inputs_at_85pct": sum(r["frac_of_copy"] >= TARGET_FRAC for r in large),
        "min_frac_of_copy_large": min((r["frac_of_copy"] for r in large), default=None),
    }


# --------------------------------------------------------------------------------------------------
# The contract (workbook.benchmarks): run and table
# --------------------------------------------------------------------------------------------------

def run(*, budget_s: float | None = None, smoke: bool = False) -> Measurement:
    """``python -m workbook bench nvfp4``: every part of the module docstring, at the sizes above.
    ``smoke=True``: the ``sizes`` rows at :data:`SMOKE_SIZES` only (what notebook 02 times live; the other
    parts come back empty). ``budget_s`` is ignored: the full run is a fixed set (a few minutes)."""
    del budget_s
    require_gpu("nvfp4 benchmark")
    ceiling = copy_ceiling_GBps()
    rows = measure_sizes(SMOKE_SIZES if smoke else BENCH_SIZES, ceiling)
    zve = [] if smoke else measure_zeros_vs_empty(ZEROS_EMPTY_SIZES)
    sweep = [] if smoke else measure_config_sweep(SWEEP_SIZES, ceiling)
    heat = [] if smoke else measure_heatmap(ceiling)
    small = {} if smoke else measure_small_m()
    results = {"sizes": rows, "zeros_vs_empty": zve, "config_sweep": sweep, "heatmap": heat, "small_m": small,
               "targets": targets(rows, heat), "notes": dict(NOTES)}
    peer = {} if smoke else {d: measure_peer_bytes(d) for d in ("cpu", "cuda")}   # run() needs a GPU
    if peer and all(peer.values()):
        results["peer_bytes"] = peer
    return Measurement(results=results, timers=dict(TIMERS), ceilings={"copy_GBps": ceiling})


def table(rec: dict) -> str:
    """The ``sizes`` rows of a record (measured or loaded) as text: GPU time from graph replay, the share
    of the copy ceiling, the compiled reference with its timer, the speedup and exactness."""
    return format_table(rec["results"]["sizes"], [
        ("M x K", lambda r: f"{r['M']}x{r['K']}", "s"),
        ("Triton graph us", "triton_graph_us", ".1f"),
        ("GB/s", "triton_GBps", ".0f"),
        ("% copy", lambda r: 100 * r["triton_frac_of_copy"], ".1f"),
        ("compiled us", lambda r: r.get("compiled_ref_graph_us", r.get("compiled_ref_eager_us")), ".1f"),
        ("timer", compiled_ref_timer, "s"),
        ("speedup", lambda r: f"{r['speedup_vs_compiled']:.2f}x", "s"),
        ("exact", lambda r: str(r["exact_vs_ref"]), "s"),
    ], title=f"copy ceiling {rec['ceilings']['copy_GBps']:.0f} GB/s (read + write)")


# --------------------------------------------------------------------------------------------------
# Bytes against a peer: torchao's nvfp4_quantize (no timer: which bytes differ, and why)
# --------------------------------------------------------------------------------------------------

# (name, seed, transform of a standard normal [1000, 2048]): Gaussian activations, and heavy tails
# (cubed), whose blocks put amax*gs/6 in more places between two E4M3 values
PEER_INPUTS = (("gaussian", 0, lambda z: z), ("gaussian", 1, lambda z: z), ("heavy tails (z^3)", 0, lambda z: z ** 3),
               ("heavy tails (z^3)", 1, lambda z: z ** 3))
_E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _peer_row(x: torch.Tensor, ours, peer_quantize, peer_scale_of) -> dict:
    M, K = x.shape
    gs = nvfp4.global_scale_of(x)
    codes, sf = ours(x, gs)
    pts = peer_scale_of(x.float().abs().amax())      # the peer's per-tensor scale, amax / (448 * 6)
    peer_sf, peer_codes = peer_quantize(x, 16, pts)
    a, b = sf.view(torch.uint8).cpu(), peer_sf.view(torch.uint8).cpu()
    codes, peer_codes = codes.cpu(), peer_codes.cpu()
    # the exactly rounded scale: gs * amax / 6 in float64 (exact to far below an E4M3 step), then RNE
    amax = x.double().cpu().view(M, K // 16, 16).abs().amax(-1)
    exact = nvfp4.e4m3_round_brute(gs.double().cpu() * amax / 6)
    exact_peer = nvfp4.e4m3_round_brute(amax / 6 / pts.double().cpu())   # the same, with the peer's scale
    d = a != b
    nib = lambda c: torch.stack([c & 15, c >> 4], -1).reshape(M, K)  # noqa: E731
    same_scale = (~d).repeat_interleave(16, dim=1)
    dc = (nib(codes) != nib(peer_codes)) & same_scale
    # where codes differ under the same scale: the exact quotient's distance to the nearest E2M1 threshold
    s = sf.double().cpu().repeat_interleave(16, dim=1)
    y = (x.double().cpu() * gs.double().cpu() / torch.where(s > 0, s, torch.ones_like(s))).abs()[dc]
    th = torch.tensor(_E2M1_THRESHOLDS, dtype=torch.float64)
    dist = ((y[:, None] - th).abs() / th).min(-1).values if y.numel() else y
    return {"M": M, "K": K, "scale_bytes": a.numel(), "scale_bytes_equal": int((~d).sum()),
            "scales_differing_ours_exact": int((a[d] == exact[d]).sum()),
            "scales_differing_peer_exact": int((b[d] == exact[d]).sum()),
            "scales_differing_peer_exact_own_scale": int((b[d] == exact_peer[d]).sum()),
            "global_scales_rel_diff": float(gs.double().cpu() * pts.double().cpu() - 1),
            "code_bytes": codes.numel(), "code_bytes_equal": int((codes == peer_codes).sum()),
            "codes_differing_same_scale": int(dc.sum()),
            "max_rel_distance_to_threshold": float(dist.max()) if dist.numel() else None}


def measure_peer_bytes(device=None) -> dict | None:
    """Our NVFP4 bytes (linear scales) against torchao's ``nvfp4_quantize`` on :data:`PEER_INPUTS`, bf16
    [1000, 2048], both with the per-tensor scale of the input's amax. On a GPU ours is the shipped kernel,
    on a CPU the pure-torch reference (the kernels match it byte for byte: tests/test_nvfp4.py). For each
    input: how many scale and code bytes are equal; at each differing scale, which side is the exactly
    rounded ``RNE_e4m3(gs * amax / 6)`` (and whether the peer's is, for its own per-tensor scale, which
    is not exactly ``1 / gs``); and where codes differ under an equal scale, how close the exact
    quotient ``x * gs / scale`` lies to an E2M1 rounding threshold. None when torchao is not installed."""
    import warnings

    try:
        with warnings.catch_warnings():      # torchao's own import-time warnings are not ours to show
            warnings.simplefilter("ignore")
            import torchao
            from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
    except ImportError:
        return None
    device = torch.device(device or DEVICE)
    if device.type == "cuda":
        ours = lambda x, gs: nvfp4.nvfp4_quant(x, gs, swizzled=False)  # noqa: E731
    else:
        ours = lambda x, gs: nvfp4.quantize_ref(x, gs, swizzled=False)  # noqa: E731
    rows = []
    for name, seed, shape_of in PEER_INPUTS:
        z = torch.randn(1000, 2048, generator=torch.Generator().manual_seed(seed))
        x = shape_of(z).to(torch.bfloat16).to(device)
        rows.append({"input": name, "seed": seed, **_peer_row(x, ours, nvfp4_quantize, per_tensor_amax_to_scale)})
    return {"peer": f"torchao {torchao.__version__} nvfp4_quantize(x, 16, per_tensor_amax_to_scale(amax))",
            "ours": "nvfp4_quant (shipped kernel)" if device.type == "cuda" else "quantize_ref (pure torch)",
            "device": device.type, "rows": rows}


# --------------------------------------------------------------------------------------------------
# Instructions: what the kernel issues per element, and what the copy ceiling allows
# --------------------------------------------------------------------------------------------------

def instruction_budget(rec: dict, clock_GHz: float = 1.98, bytes_per_element: float = 2.5) -> dict:
    """How many instructions per element a kernel may issue and still keep up with memory: the
    record's copy ceiling (bytes/s) over the bytes per element gives elements/s; the SMs (the record's
    ``machine.sm_count``) x 4 warp schedulers x 32 threads x the clock give thread-instructions/s.
    ``clock_GHz`` defaults to the H200's boost clock (NVIDIA's specification, not a measurement);
    under its power cap the chip runs below it, so the real budget is smaller."""
    elems = rec["ceilings"]["copy_GBps"] * 1e9 / bytes_per_element
    issue = rec["machine"]["sm_count"] * 4 * 32 * clock_GHz * 1e9
    return {"elements_per_s": elems, "thread_instructions_per_s": issue,
            "instructions_per_element": issue / elems, "clock_GHz": clock_GHz}


def sass_counts(config=None) -> dict | None:
    """GPU only: static SASS instruction counts of the fast kernel as the GPU runs it (``EMULATE=False``,
    bf16, swizzled, full tiles, no padding) for one tile ``config`` (default: the launch rule's tile for
    large inputs), divided by the elements each thread handles. The listing holds every path of the
    kernel (the last, masked tile and the padding programs too), so this overstates the instructions
    the main path issues per element by a little. Returns {"config", "instructions", "ffma",
    "elements_per_thread", "per_element", "ffma_per_element"}, or None without a GPU or where the
    SASS cannot be disassembled (Triton's ``asm["sass"]`` needs cuobjdump)."""
    if not ON_GPU:
        return None
    bs, warps = nvfp4.launch_tile(1 << 16, 1 << 13, config)
    M, K = 128, 16 * bs
    x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
    gs = nvfp4.global_scale_of(x)
    codes = torch.empty((M, K // 2), dtype=torch.uint8, device=DEVICE)
    sf = torch.empty((M, K // 16), dtype=torch.uint8, device=DEVICE)
    try:
        compiled = nvfp4_quant_kernel[(M,)](
            x.view(torch.int32), gs, codes, sf, M, K, M, K // 16, M, float(np.float32(1.0 / bs)), 0,
            IS_BF16=True, BLOCK_S=bs, SWIZZLED=True, EMULATE=False, LAST_PARTIAL=False,
            ONE_WRAP=True, num_warps=warps)
        sass = compiled.asm["sass"]
    except Exception:   # no cuobjdump, or a Triton without asm["sass"]
        return None
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    ops = [o for o in ops if not o.startswith("NOP")]
    if not ops:   # an empty or differently formatted listing (seen: Triton 3.6 on the H200): no count
        return None
    per_thread = bs * 16 / (32 * warps)
    ffma = sum(o.startswith("FFMA") for o in ops)
    return {"config": [bs, warps], "instructions": len(ops), "ffma": ffma,
            "elements_per_thread": per_thread, "per_element": len(ops) / per_thread,
            "ffma_per_element": ffma / per_thread}
