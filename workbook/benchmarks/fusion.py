"""The GPU benchmark of notebook 06: the compiled mini decoder of :mod:`workbook.fusion` in both
buffer styles, on one GPU (:func:`run`) and tensor parallel on two (:func:`main`, under torchrun).

What one step is: the decoder :data:`BENCH` (hidden 2048, three Gated DeltaNet layers and one
full-attention layer, Qwen3-Next's 16 key / 32 value heads of 128, MLP sharded so its sites count in
both styles, bf16), compiled with the fusion pass, on a padded batch with one padding row, at
decode sizes (:data:`DECODE_TOKENS`) and prefill sizes (:data:`PREFILL_TOKENS`). Per size and style
(:func:`_bench_sizes`): GPU time from CUDA-graph replay and eager per-call time, the pass's counts,
the relative error against the same decoder in fp32 and against itself uncompiled, the per-kernel
GPU profile of one step (:func:`kernel_profile`, grouped by :data:`KERNEL_GROUPS`) and, at the first
size, the host side of one eager step (:func:`host_profile`). Beside it: :func:`workbook.fusion.gdn_core`
alone with each kernel (where 'auto' switches) and the GPU's read bandwidth (the decode floor).

* ``run(smoke=True)``: one GPU, the first decode and the first prefill size only (what notebook 06
  times live); ``budget_s`` is ignored (every size is part of the story).
* ``torchrun --nproc-per-node 2 -m workbook.benchmarks.fusion --out FILE``: the same steps with two
  ranks over NCCL, one GPU each, with fixed-count timers (every rank runs the same number of calls,
  so the collectives stay matched); rank 0 writes a schema-2 record holding ``results["tp2"]``, which
  ``WORKBOOK_FUSION_TP2=FILE python3 -m workbook bench fusion`` merges into ``fusion.json``.
  ``--smoke``: the same code on the CPU with gloo at tiny sizes (CPU wall-clock times, labelled so,
  never GPU figures). ``--check``: TP=2 spawned on the CPU against TP=1 (counts and outputs).
  With NCCL the record also holds ``tp2["oneshot"]`` (:func:`oneshot_sweep`): per site, the one-shot
  fused op against NCCL all-reduce + add + RMSNorm at :data:`ONESHOT_TOKENS` x :data:`ONESHOT_HIDDEN`;
  ``--oneshot`` runs that sweep alone. The full run also times the decoder's steps with the one-shot
  exchange registered (``tp2["decoder_oneshot"]``): the return style's sites on the one-shot kernel.
  NVLink multicast stays off (:func:`workbook.fusion.multicast_off`).

Timers come from :mod:`workbook.timing`; record keys follow :mod:`workbook.records`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import sys
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import torch

from .. import timing
from ..device import DEVICE, ON_GPU
from ..fusion import (
    DECODER_VERSION, ONESHOT_MAX_BYTES, ONESHOT_SLOTS, SMOKE, DecoderConfig, FusionPass, MiniDecoder, OneShotExchange,
    add_rmsnorm, all_reduce, compile_decoder, disable_oneshot, enable_oneshot, expected_sites, gdn_core,
    make_decoder_weights, multicast_off, oneshot_all_reduce_add_rmsnorm, run_tp, shard_weights,
)
from ..records import SCHEMA, Measurement, validate_record

__all__ = [
    "run", "table", "timing_table", "main", "BENCH", "DECODE_TOKENS", "PREFILL_TOKENS", "TIMERS",
    "KERNEL_GROUPS", "kernel_group", "summarize_kernels", "kernel_profile", "host_profile", "oneshot_sweep",
    "ONESHOT_TOKENS", "ONESHOT_HIDDEN",
]

BENCH = DecoderConfig(hidden=2048, layers=("linear", "linear", "linear", "full"), gdn_k_heads=16,
                      gdn_v_heads=32, gdn_head_dim=128, attn_heads=16, attn_head_dim=128, intermediate=6144,
                      shard_mlp=True, gdn_kernel="auto", dtype=torch.bfloat16)
DECODE_TOKENS = (8, 64, 256)
PREFILL_TOKENS = (2048, 8192)
# The one-shot sweep (two GPUs): tokens x hidden of one all-reduce + add + RMSNorm site, bf16, past the
# provisional ONESHOT_MAX_BYTES on purpose (the crossover with NCCL is what it is to find)
ONESHOT_TOKENS = (8, 16, 32, 64, 128, 256, 512)
ONESHOT_HIDDEN = (2048, 4096)

# The record's timers (workbook.records): what each timer name means in this record
TIMERS = {
    "graph": "GPU time per step from CUDA-graph replay, 10 steps per graph (workbook.timing): one GPU (tp1) "
             "median of 3 windows (graph_time_us); TP=2 (tp2) 10 replays, fixed counts on every rank "
             "(graph_fixed_time_us); gdn_core 10 calls per graph; read_GBps 5 calls per graph",
    "eager": "per-call time of the compiled step, host work included: tp1 triton.testing.do_bench median "
             "(time_us); tp2 CUDA events over 20 back-to-back calls, fixed counts on every rank (fixed_time_us)",
    "profiler": "torch.profiler: 'kernels' = per-kernel GPU times (CUPTI) of one step around CUDA-graph replay "
                "(3 replays, per step; rank 0 in tp2; kernel_profile); 'host' = one eager step under "
                "torch.profiler's CPU activities: its wall time, kernel launches, self CPU time per op "
                "(host_profile)",
}
_READ_NOTE = "torch.sum over 1 GiB of bf16, GPU time from CUDA-graph replay"


def _cfg_json(cfg: DecoderConfig) -> dict:
    d = asdict(cfg)
    d["dtype"] = str(cfg.dtype).replace("torch.", "")
    d["layers"] = list(cfg.layers)
    return d


# --------------------------------------------------------------------------------------------------
# Per-kernel and host profiles of one step
# --------------------------------------------------------------------------------------------------

# Kernel groups of a decoder step, by the name the profiler reports (first match wins). The names
# are those of torch 2.11 / Triton 3.6 on an H200: cuBLAS GEMMs ("nvjet", "gemm", "gemv", "xmma"),
# NCCL ("ncclDevKernel_AllReduce..."), Inductor's generated kernels ("triton_red_fused_..."), our
# Triton kernels by their function names, PyTorch's eager elementwise kernels.
KERNEL_GROUPS = (
    ("all-reduce (NCCL)", r"nccl"),
    ("device copies (memcpy)", r"[Mm]emcpy"),
    ("one-shot all-reduce+add+RMSNorm (ours)", r"oneshot_all_reduce"),
    ("fused add+RMSNorm (ours)", r"add_rmsnorm_kernel"),
    ("GDN kernels (ours)", r"^(?!triton_).*(gdn|chunk_table|gated_rmsnorm)"),   # not Inductor's ..._gdn_core_...
    ("attention", r"flash|fmha|attention|softmax|cudnn_generated|sdpa"),
    ("conv1d", r"conv|fprop|depthwise"),
    ("matmul (cuBLAS)", r"gemm|gemv|nvjet|xmma|cutlass|splitK"),
    ("Inductor: norm kernels", r"^triton_.*rsqrt"),
    ("Inductor: other kernels", r"^triton_"),
    ("torch eager elementwise / copies", r"elementwise|copy|fill|cat|reduce|index|[Mm]emset"),
)


def kernel_group(name: str) -> str:
    """The :data:`KERNEL_GROUPS` group of a kernel name ('other' if none matches)."""
    for group, pat in KERNEL_GROUPS:
        if re.search(pat, name):
            return group
    return "other"


def summarize_kernels(events, steps: int, top: int = 12) -> dict:
    """Per-step kernel table from profiler trace events (chrome-trace dicts with ``cat`` 'kernel',
    'gpu_memcpy' or 'gpu_memset', ``name`` and ``dur`` in us) of ``steps`` identical steps:
    ``{"kernels_per_step", "kernel_profiler_us", "groups": {group: {"calls", "profiler_us"}}, "top": [...]}``,
    calls and times per step (divided by ``steps``)."""
    per: dict = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        k = per.setdefault(e["name"], [0, 0.0])
        k[0] += 1
        k[1] += float(e.get("dur", 0.0))
    groups: dict = {}
    for name, (n, us) in per.items():
        g = groups.setdefault(kernel_group(name), {"calls": 0.0, "us": 0.0})
        g["calls"] += n / steps
        g["us"] += us / steps
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])
    return {"kernels_per_step": round(sum(n for n, _ in per.values()) / steps, 2),
            "kernel_profiler_us": round(sum(us for _, us in per.values()) / steps, 2),
            "groups": {g: {"calls": round(v["calls"], 2), "profiler_us": round(v["us"], 2)}
                       for g, v in sorted(groups.items(), key=lambda kv: -kv[1]["us"])},
            "top": [{"name": name[:120], "group": kernel_group(name), "calls": round(n / steps, 2),
                     "profiler_us": round(us / steps, 2)} for name, (n, us) in rows[:top]]}


def kernel_profile(fn, steps: int = 3, top: int = 12) -> dict:
    """GPU kernels of one call of ``fn`` (GPU only): ``fn`` captured once in a CUDA graph, replayed
    ``steps`` times under ``torch.profiler`` with CUDA activities; :func:`summarize_kernels` of the
    trace. Kernel times are the GPU's own (CUPTI), without host work; the sum of kernel times is at
    most the graph-replay time (the difference is the gaps between kernels)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        g = timing.capture_graph(fn, 1)
        g.replay()
        torch.cuda.synchronize()
        with warnings.catch_warnings():   # torch's note that each profiling cycle clears events
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    g.replay()
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return summarize_kernels(events, steps, top)


def host_profile(fn, top: int = 10) -> dict:
    """Host side of one eager call of ``fn`` (GPU only): wall time, kernel launches and the ops with
    the most self CPU time (``torch.profiler``, CPU activities). Explains eager per-call time.
    ``{"wall_profiler_us", "kernel_launches", "top_self_cpu": [{"name", "calls", "self_cpu_profiler_us"}]}``."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                fn()
                wall = time.perf_counter() - t0
        torch.cuda.synchronize()
    ka = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    launches = sum(e.count for e in prof.key_averages()
                   if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"))
    return {"wall_profiler_us": round(1e6 * wall, 1), "kernel_launches": launches,
            "top_self_cpu": [{"name": e.key[:100], "calls": e.count,
                              "self_cpu_profiler_us": round(e.self_cpu_time_total, 1)} for e in ka[:top]]}


# --------------------------------------------------------------------------------------------------
# The measured things
# --------------------------------------------------------------------------------------------------

def _one_gpu_timer(fn) -> dict:
    """One GPU: graph replay (10 steps per graph, median of 3 windows) and the eager do_bench median."""
    with torch.no_grad():
        return {"graph_us": timing.graph_time_us(fn, n=10, windows=3), "eager_us": timing.time_us(fn)}


def _ranks_timer(fn) -> dict:
    """Several ranks: the fixed-count timers (collectives inside ``fn`` stay matched across ranks)."""
    with torch.no_grad():
        return timing.time_both(fn, fixed=True)


def _cpu_smoke_timer(fn) -> dict:
    """The CPU smoke run (``--smoke``): wall-clock time of one call, never a GPU figure (its key says so)."""
    t0 = time.perf_counter()
    with torch.no_grad():
        fn()
    return {"cpu_wall_us_smoke": 1e6 * (time.perf_counter() - t0)}


def _weights_fp32(weights: dict) -> dict:
    return {"layers": [{k: (t.float() if torch.is_tensor(t) else t) for k, t in L.items()} for L in weights["layers"]],
            "final_norm": weights["final_norm"].float()}


def _compile_styles(cfg, weights, world_size, T, *, gen, device, log) -> tuple[dict, dict, dict]:
    """Both styles compiled with the fusion pass and run once on a random batch of ``T`` rows (drawn
    from ``gen``): (models, compiled functions, pass counts and compile times)."""
    models, fns, counts = {}, {}, {}
    for style in ("buffer", "return"):
        models[style] = MiniDecoder(cfg, weights, style, world_size=world_size)
        fusion = FusionPass(cfg.dtype)
        fns[style] = compile_decoder(models[style], fusion, reset=style == "buffer")
        warm = torch.randn(T, cfg.hidden, generator=gen).to(device, cfg.dtype)
        t0 = time.perf_counter()
        with torch.no_grad():
            fns[style](warm, T - 1)
        counts[style] = {"log": list(fusion.log), "counts": list(fusion.counts),
                         "expected": expected_sites(cfg, style), "compile_s": round(time.perf_counter() - t0, 1)}
        log(f"[fusion] {style}: {fusion.log} (compile {counts[style]['compile_s']} s)")
    return models, fns, counts


def _bench_sizes(cfg, rank, world_size, sizes, *, timer, device, log=print, profile=False):
    """Both styles at each size: compiled decoder, pass counts, GPU/eager times, agreement between the
    styles and, for each, with the same decoder in fp32 (eager, on the same bf16-valued weights) and
    with itself run eagerly (uncompiled).
    ``profile``: also the per-kernel GPU table of one step (:func:`kernel_profile`) per style and size,
    and the host side of one eager step (:func:`host_profile`) at the first size."""
    weights = shard_weights(cfg, make_decoder_weights(cfg, device=device), rank, world_size)
    nbytes = sum(t.numel() * t.element_size() for L in weights["layers"] for t in L.values() if torch.is_tensor(t))
    ref_model = MiniDecoder(replace(cfg, dtype=torch.float32), _weights_fp32(weights), "return", world_size=world_size)
    gen = torch.Generator().manual_seed(1)
    models, fns, counts = _compile_styles(cfg, weights, world_size, sizes[0], gen=gen, device=device, log=log)
    rows = []
    for T in sizes:
        num_tokens = T - 1 if T > 1 else 1   # a padded batch: one slot of padding
        hidden = (torch.randn(T, cfg.hidden, generator=gen) * 0.5).to(device, cfg.dtype)
        row = {"T_pad": T, "num_tokens": num_tokens, "phase": "decode" if T <= 256 else "prefill"}
        outs = {}
        with torch.no_grad():
            ref = ref_model(hidden.float(), num_tokens)[:num_tokens]
        for style in ("buffer", "return"):
            step = lambda: fns[style](hidden, num_tokens)   # noqa: E731
            with torch.no_grad():
                outs[style] = step()[:num_tokens].float()
                eager = models[style](hidden, num_tokens)[:num_tokens].float()
            row[style] = timer(step)
            row[style]["rel_err_vs_fp32"] = float((outs[style] - ref).norm() / ref.norm())
            row[style]["rel_diff_vs_eager"] = float((outs[style] - eager).norm() / eager.norm())
            if profile:
                row[style]["kernels"] = kernel_profile(step, top=10)
                if T == sizes[0]:
                    row[style]["host"] = host_profile(step)
        row["rel_diff"] = float((outs["return"] - outs["buffer"]).norm() / outs["buffer"].norm())
        rows.append(row)
        log(f"[fusion] T={T}: " + ", ".join(f"{s} {row[s].get('graph_us', row[s])}" for s in ("buffer", "return")))
    return {"config": _cfg_json(cfg), "world_size": world_size, "decoder_version": DECODER_VERSION,
            "weight_bytes_per_rank": nbytes,
            "passes": counts, "sizes": rows}


def _decoder_with_oneshot(cfg, rank, world_size, sizes, *, timer, device, log=print) -> dict:
    """The decoder's steps again with the one-shot exchange registered (:func:`workbook.fusion.enable_oneshot`):
    the return style's matched sites then run the one-shot kernel (messages up to ONESHOT_MAX_BYTES), the
    buffer style, which matches nothing, stays on NCCL: what the match buys. ``{"enabled": False, why}``
    where the exchange cannot be made (no symmetric memory)."""
    ex = enable_oneshot(cfg.hidden, cfg.dtype)
    if ex is None:
        return {"enabled": False, "why": "enable_oneshot returned None (no symmetric memory, or not NCCL)"}
    try:
        res = _bench_sizes(cfg, rank, world_size, sizes, timer=timer, device=device, log=log)
        ex.check()                  # a wait given up anywhere in those steps fails the record
        res["enabled"] = True
        return res
    finally:
        disable_oneshot()


def _gdn_core_times(cfg, device, tokens=(8, 16, 32, 64)) -> list:
    """GPU time (graph replay) of :func:`workbook.fusion.gdn_core` with the recurrent and the chunked
    kernel on one sequence of the decoder's head shapes: where 'auto' switches
    (:data:`workbook.fusion.GDN_RECURRENT_MAX_T`)."""
    gen = torch.Generator().manual_seed(5)
    Hk, Hv, Dh = cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
    rows = []
    for T in tokens:
        q, k = (torch.randn(T, Hk, Dh, generator=gen).to(device, cfg.dtype) for _ in range(2))
        v = torch.randn(T, Hv, Dh, generator=gen).to(device, cfg.dtype)
        g = (-0.1 * torch.rand(T, Hv, generator=gen)).to(device)
        beta = torch.rand(T, Hv, generator=gen).to(device, cfg.dtype)
        row = {"T": T}
        for kernel in ("recurrent", "chunk"):
            with torch.no_grad():
                row[f"{kernel}_graph_us"] = timing.graph_time_us(lambda: gdn_core(q, k, v, g, beta, kernel), n=10)
        rows.append(row)
    return rows


def _read_GBps(device, nbytes: int = 1 << 30) -> float:
    """Read bandwidth of ``torch.sum`` over ``nbytes`` of bf16, GPU time from graph replay."""
    x = torch.ones(nbytes // 2, device=device, dtype=torch.bfloat16)
    t = timing.graph_time_us(lambda: x.sum(), n=5)
    return nbytes / (t * 1e-6) / 1e9


def oneshot_sweep(group=None, tokens=ONESHOT_TOKENS, hidden=ONESHOT_HIDDEN, log=print) -> dict:
    """One all-reduce + add + RMSNorm site on every rank of ``group`` (NCCL, one GPU each, under
    torchrun; collective: every rank runs the same calls): per hidden size and token count the
    one-shot op (:func:`workbook.fusion.oneshot_all_reduce_add_rmsnorm`, an exchange in symmetric
    memory holding the largest count) against the fallback the fused op takes, NCCL all-reduce +
    :func:`workbook.fusion.add_rmsnorm`; GPU time from graph replay and eager time beside it
    (fixed-count timers), and whether the two give the same bits."""
    import torch.distributed as dist

    timing.require_gpu("workbook.benchmarks.fusion.oneshot_sweep")
    rank, dev, rows = dist.get_rank(group), torch.device("cuda", torch.cuda.current_device()), []
    for D in hidden:
        ex = OneShotExchange.symmetric(max(tokens), D, torch.bfloat16, group)
        for T in tokens:
            gen = torch.Generator().manual_seed(T * D)           # residual and weight: the same on every rank
            r = torch.randn(T, D, generator=gen).to(dev, torch.bfloat16)
            w = (1 + 0.1 * torch.randn(D, generator=gen)).to(dev, torch.bfloat16)
            x = torch.randn(T, D, generator=torch.Generator().manual_seed(T * D + 1 + rank)).to(dev, torch.bfloat16)
            paths = {"oneshot": lambda: oneshot_all_reduce_add_rmsnorm(ex, x, r, w),
                     "nccl": lambda: add_rmsnorm(all_reduce(x), r, w)}
            row = {"tokens": T, "hidden": D, "message_bytes": T * D * 2}
            with torch.no_grad():
                a, b = paths["oneshot"](), paths["nccl"]()
                for name, fn in paths.items():
                    row[name] = _ranks_timer(fn)
            torch.cuda.synchronize()
            ex.check()
            row["same_bits"] = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
            row["max_abs_diff"] = float((a[0].float() - b[0].float()).abs().max())
            rows.append(row)
            log(f"[fusion] one-shot T={T} D={D}: " + ", ".join(f"{k} {row[k].get('graph_us')}" for k in paths))
    return {"dtype": "bfloat16", "world_size": dist.get_world_size(group), "slots": ONESHOT_SLOTS,
            "oneshot_max_bytes": ONESHOT_MAX_BYTES, "multicast": "off", "sizes": rows}


def _load_tp2() -> tuple[dict, dict] | None:
    """The TP=2 block and its notes from the record named by ``WORKBOOK_FUSION_TP2`` (what :func:`main`
    writes), or None when that variable is unset or names no file."""
    path = os.environ.get("WORKBOOK_FUSION_TP2")
    if not path or not Path(path).exists():
        return None
    how = "write it with `torchrun --nproc-per-node 2 -m workbook.benchmarks.fusion --out FILE`"
    try:
        rec = json.loads(Path(path).read_text())
        validate_record(rec)
    except ValueError as e:
        raise ValueError(f"WORKBOOK_FUSION_TP2={path}: not a tensor-parallel record ({e}); {how}") from None
    if "tp2" not in rec["results"]:
        raise ValueError(f"WORKBOOK_FUSION_TP2={path} holds no 'tp2' block (run with two ranks); {how}")
    if rec["results"]["tp2"].get("backend") != "nccl":
        raise ValueError(f"WORKBOOK_FUSION_TP2={path} is a CPU smoke run (--smoke), not GPU figures; {how}")
    return rec["results"]["tp2"], rec["results"].get("notes", {})


def run(*, budget_s: float | None = None, smoke: bool = False) -> Measurement:
    """One GPU (``python3 -m workbook bench fusion``): :data:`BENCH` compiled, both styles, decode-
    and prefill-sized steps, with per-kernel and host profiles; :func:`workbook.fusion.gdn_core` per
    kernel and the read bandwidth. ``smoke``: the first decode and prefill sizes only (notebook 06's
    live cell), nothing else, and no progress lines. The TP=2 figures (:func:`main`) are merged in
    from the record that ``WORKBOOK_FUSION_TP2`` names. ``budget_s`` is ignored."""
    timing.require_gpu("workbook.benchmarks.fusion.run")
    tp2 = None if smoke else _load_tp2()          # a bad file fails now, not after the measurements
    sizes = (DECODE_TOKENS[0], PREFILL_TOKENS[0]) if smoke else DECODE_TOKENS + PREFILL_TOKENS
    res = {"decoder_version": DECODER_VERSION}
    notes = {}
    if not smoke:
        res["read_GBps"] = _read_GBps(DEVICE)
        notes["read_GBps"] = _READ_NOTE
        res["gdn_core"] = _gdn_core_times(BENCH, DEVICE)
    res["tp1"] = _bench_sizes(BENCH, 0, 1, sizes, timer=_one_gpu_timer, device=DEVICE, profile=True,
                              log=(lambda *a: None) if smoke else print)
    if tp2 is not None:
        res["tp2"] = tp2[0]
        notes.update(tp2[1])
    res["notes"] = notes
    return Measurement(results=res, timers=dict(TIMERS))


# --------------------------------------------------------------------------------------------------
# Tables of a record
# --------------------------------------------------------------------------------------------------

_BLOCKS = (("tp1", "one GPU"), ("tp2", "tensor parallel, 2 GPUs (NCCL)"))


def timing_table(block: dict) -> str:
    """Text table of one benchmark block (``tp1`` or ``tp2``): per size both styles, GPU time from
    CUDA-graph replay and eager per-call time, and the buffer/return ratio."""
    out = [f"{'phase':8s} {'T_pad':>6s} {'tokens':>6s} | {'buffer graph':>12s} {'return graph':>12s} "
           f"{'speedup':>7s} | {'buffer eager':>12s} {'return eager':>12s}"]
    for r in block["sizes"]:
        b, f = r["buffer"], r["return"]
        if "graph_us" in b and "graph_us" in f:
            g = f"{b['graph_us']:10.1f}us {f['graph_us']:10.1f}us {b['graph_us'] / f['graph_us']:6.2f}x"
        else:
            g = f"{'(no graph time: ' + b.get('graph_error', f.get('graph_error', '?'))[:18] + ')':>33s}"
        out.append(f"{r['phase']:8s} {r['T_pad']:6d} {r['num_tokens']:6d} | {g} | {b['eager_us']:10.1f}us "
                   f"{f['eager_us']:10.1f}us")
    return "\n".join(out)


def table(rec: dict) -> str:
    """The record's timings (``rec``: a record, or ``{"results": Measurement.results}``): per block
    (one GPU, TP=2) the pass logs of both styles and :func:`timing_table`."""
    parts = []
    for key, title in _BLOCKS:
        r = rec["results"].get(key)
        if r is None:
            parts.append(f"{title}: not recorded yet")
        else:
            parts.append(f"{title}: pass logs buffer {r['passes']['buffer']['log']}, return "
                         f"{r['passes']['return']['log']}\n" + timing_table(r))
    return "\n\n".join(parts)


# --------------------------------------------------------------------------------------------------
# Tensor parallel: torchrun entry point (and the CPU check)
# --------------------------------------------------------------------------------------------------

def _tp_record(res: dict, world: int, backend: str, key: str | None = None) -> dict:
    """The schema-2 record that rank 0 writes: ``results[key or "tp<world>"]`` (what :func:`run` merges)."""
    from ..device import describe

    if backend == "nccl":
        timers = dict(TIMERS)
        note = (f"tensor parallel: torchrun --nproc-per-node {world}, NCCL, one GPU per rank; figures of rank 0 "
                "(every rank runs the same steps)")
    else:
        timers, note = {}, "CPU smoke run (gloo): wall-clock, not GPU"
    rec = {"schema": SCHEMA, "name": f"fusion_tp{world}", "recorded": datetime.date.today().isoformat(),
           "machine": describe(), "timers": timers, "ceilings": {},
           "results": {key or f"tp{world}": res, "notes": {key or f"tp{world}": note}}}
    validate_record(rec)
    return rec


def _bench_tp(smoke: bool, out: str | None, oneshot_only: bool = False) -> int:
    """One rank of the tensor-parallel benchmark (environment from torchrun); ``oneshot_only``: the
    one-shot sweep alone (:func:`oneshot_sweep`)."""
    import torch.distributed as dist

    multicast_off()                 # before NCCL starts: NVLink multicast (NVLS) stays off
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if smoke or not ON_GPU:
        if not smoke:
            raise SystemExit("the benchmark needs GPUs (one per rank); on a CPU use --smoke")
        backend, device, cfg, sizes, timer = "gloo", torch.device("cpu"), SMOKE, (8, 16), _cpu_smoke_timer
    else:
        torch.cuda.set_device(local)
        backend, device, cfg = "nccl", torch.device("cuda", local), BENCH
        sizes, timer = DECODE_TOKENS + PREFILL_TOKENS, _ranks_timer
    if world > 1:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600),
                                **({"device_id": device} if backend == "nccl" else {}))
    try:
        log = print if rank == 0 else (lambda *a: None)
        if oneshot_only and (backend != "nccl" or world < 2):
            raise SystemExit("--oneshot needs two or more GPUs under torchrun (NCCL)")
        res = {} if oneshot_only else _bench_sizes(cfg, rank, world, sizes, timer=timer, device=device, log=log,
                                                   profile=ON_GPU and not smoke)
        if backend == "nccl" and world > 1:
            res["oneshot"] = oneshot_sweep(log=log)
            if not oneshot_only:
                res["decoder_oneshot"] = _decoder_with_oneshot(cfg, rank, world, sizes, timer=timer, device=device,
                                                               log=log)
        res["backend"] = backend
        if rank == 0:
            # --oneshot alone: a record of its own (results["oneshot_tp<world>"]), never merged as a tp2 block
            rec = _tp_record(res, world, backend, key=f"oneshot_tp{world}" if oneshot_only else None)
            text = json.dumps(rec, indent=1)
            if out:
                Path(out).write_text(text + "\n")
                print(f"[fusion] wrote {out}")
            else:
                print(text)
    finally:
        if world > 1:
            dist.destroy_process_group()
    return 0


def _check_cli() -> int:
    cfg = SMOKE
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(12, cfg.hidden, generator=gen)
    n = 9
    ref = run_tp(cfg, hidden, n, world_size=1, compiled=True)[0]
    tp2 = run_tp(cfg, hidden, n, world_size=2, compiled=True)
    ok = True
    for style in ("buffer", "return"):
        for r, res in enumerate(tp2):
            d = float((res[style]["out"] - ref[style]["out"]).abs().max())
            print(f"{style} rank {r}: counts {res[style]['counts']} (TP=1: {ref[style]['counts']}), "
                  f"max |TP2 - TP1| = {d:.2e}")
            ok &= res[style]["counts"] == ref[style]["counts"] and d < 1e-4
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


def main(argv=None) -> int:
    """``torchrun --nproc-per-node 2 -m workbook.benchmarks.fusion --out PATH``: the benchmark with two
    ranks (NCCL, one GPU per rank); rank 0 writes the record (merge it with
    ``WORKBOOK_FUSION_TP2=PATH python3 -m workbook bench fusion``). ``--smoke`` runs the same code on
    CPU with gloo at tiny sizes (CPU wall-clock times, labelled so, never GPU figures). ``--check``
    spawns TP=2 on CPU itself and compares with TP=1 (counts and outputs)."""
    ap = argparse.ArgumentParser(prog="python -m workbook.benchmarks.fusion", description=main.__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="tiny sizes, CPU + gloo")
    mode.add_argument("--check", action="store_true", help="TP=2 (spawned, gloo) vs TP=1 on CPU, counts and outputs")
    mode.add_argument("--oneshot", action="store_true", help="the one-shot vs NCCL site sweep alone (GPUs)")
    ap.add_argument("--out", help="JSON file for the record (rank 0 writes it; default: print it)")
    args = ap.parse_args(argv)
    if args.out and (Path(args.out).is_dir() or not Path(args.out).resolve().parent.is_dir()):
        ap.error(f"--out {args.out}: not a file in an existing folder")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return _check_cli() if args.check else _bench_tp(args.smoke, args.out, args.oneshot)
    except (OSError, ValueError, RuntimeError, TimeoutError) as e:
        if os.environ.get("WORKBOOK_DEBUG"):
            raise
        print(f"[fusion] {type(e).__name__}: {' '.join(str(e).split())[:300]} (set WORKBOOK_DEBUG=1 for the "
              "full trace)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
