"""The GPU benchmark of notebook 04: TurboQuant decode against SDPA on a bf16 cache, and the mixed step.

Decode steps (Hq=32, Hkv=8, D=128, pages of 16 tokens in shuffled order, :data:`HEADS`) at each
(batch, context) of :data:`SHAPES`, in every launch configuration of :data:`CONFIGS` (both decode
kernels: Triton and CUDA C++; a configuration may name its ``backend``), against
``scaled_dot_product_attention(..., enable_gqa=True)`` on a bf16 cache of the same tokens
(:func:`decode_point`). Ours is the whole decode: rotation of q, decode, merge. Timers
(:mod:`workbook.timing`, the record's ``timers``): ``graph`` (GPU time per call from replaying a CUDA
graph of 10 calls; median of 3 windows, one window with ``smoke``) and ``eager`` (per-call time of the
Python call, host and launches included). Read rates are each cache's bytes over its GPU time, measured
in the same run. The full run adds zeros vs empty for ``attn_out`` in a mixed step (store + decode +
prefill, :data:`MIXED_STEP`), issue 34's target points timed alternately (:func:`target_ab`), the CUDA
kernel's default configuration over :data:`GRID` and the
copy ceiling, and what sustained load does to each timer at :data:`SUSTAINED_POINTS`
(:func:`sustained_point`). :func:`key_table_ab` (not part of ``run``) re-measures the CUDA kernel's
key-table threshold on the GPU at hand (turboquant.json: run 10 chose one on an H100, run 11 another on
the H200, within its spread); :func:`decode_forms_ab` times any configurations of it side by side.
A full run keeps the tables other runs added to the record (:data:`KEPT_TABLES`:
profiles, SASS counts, A/B runs) when the record it replaces was measured on the same GPU model (:func:`kept_tables`).

``smoke=True`` is what notebook 04 times live: batch 8 x 4k, each backend's default configuration
(:data:`SMOKE_CONFIGS`). ``budget_s`` skips the (batch, context) points that would start after it ran
out (listed in ``results["skipped"]``). The contract (``run``, ``table``) is :mod:`workbook.benchmarks`';
the record is ``workbook/data/turboquant.json``, its picture :func:`workbook.plots.turboquant.plot_benchmark`.
"""
from __future__ import annotations

import functools
import math
import statistics
import time

import torch
import triton

from ..check import rel_err
from ..device import DEVICE, ON_GPU, describe
from ..records import Measurement, carry_over, format_table, load_record
from ..timing import (TIMERS as _TIMERS, copy_ceiling_GBps, graph_time_us, kernel_times_us, power_probe, require_gpu,
                      time_us)
from ..turboquant import (CONFIG, MixedBatch, allocate_cache, decode_attention, dequantize_keys, make_example,
                          mixed_attention, pack_nibbles, quantize_keys, quantize_values, sign_magnitude, slot_bytes)

__all__ = ["run", "table", "grid_table", "GRID", "decode_point", "key_mse", "mse_table", "PAPER_MSE", "SHAPES", "SMOKE_SHAPES", "CONFIGS", "SMOKE_CONFIGS", "HEADS",
           "MIXED_STEP", "TIMERS", "SUSTAINED_POINTS", "sustained_point",
           "KEY_TABLE_POINTS", "key_table_ab", "decode_forms_ab", "choose_key_table_threshold", "KEPT_TABLES",
           "RUN_TABLES", "kept_tables", "TARGET_POINTS", "target_ab"]

HEADS = {"hq": 32, "hkv": 8, "d": 128, "block_size": 16}
SHAPES = [(8, 4096), (8, 32768), (8, 65536), (32, 4096), (32, 32768), (128, 16384)]   # (batch, context)
SMOKE_SHAPES = [(8, 4096)]
# issue 34's grid (batch x context): the CUDA kernel in its default configuration (the launch rule of
# CONFIG["cuda_decode"]) against SDPA at every point, short contexts included
GRID = [(b, t) for t in (1024, 4096, 16384, 65536) for b in (1, 2, 8, 32, 128)]
GRID_CONFIGS = {"cuda_default": {"backend": "cuda"}}
# name -> config of decode_attention (plus "backend"); the Triton ones are named by their tile
# (64 tokens, 4 warps, 128 registers) and waves, the CUDA ones by their rounds of resident warps
CONFIGS = {"n64_w4_r128_waves8": {}, "n64_w4_r128_waves16": {"WAVES": 16},
           "cuda_rounds1": {"backend": "cuda"}, "cuda_rounds2": {"backend": "cuda", "WAVES": 2},
           "cuda_rounds4": {"backend": "cuda", "WAVES": 4}}
SMOKE_CONFIGS = {"triton": {}, "cuda": {"backend": "cuda"}}
# the mixed step: 32 decode requests of 4k context beside two prefill chunks (512 new tokens after 512
# cached, 256 fresh ones)
MIXED_STEP = {"nd": 32, "ctx": 4096, "pre_q": [512, 256], "pre_ctx": [1024, 256], "hq": 32, "hkv": 8, "d": 128}
TIMERS = {
    "graph": "GPU time per call from CUDA-graph replay (workbook.timing.graph_time_us): a graph of 10 calls, "
             "median of 3 windows (smoke: one window)",
    "eager": "per-call time of the Python call, host work and launches included (workbook.timing.time_us: "
             "triton.testing.do_bench median)",
    "profiler": _TIMERS["profiler"],
}
# long points where the full run also records what sustained load does to each timer (results["sustained"]):
# on the H200 the CUDA decode's graph-replay time sat above its eager time there, SDPA's did not
SUSTAINED_POINTS = [(32, 32768), (8, 65536)]
# issue 34's target: >= 3x SDPA at 32k and above for batch 8 and 32 (timed alternately by target_ab)
TARGET_POINTS = [(8, 32768), (8, 65536), (32, 32768), (32, 65536)]
# where fill_ab times FILL on and off (run 17): the target points first, then points whose pairs do not divide
# an H200's or an H100's round of 2112 resident warps, then short contexts
FILL_POINTS = [(8, 32768), (8, 65536), (32, 32768), (32, 65536), (128, 16384), (32, 16384), (8, 16384), (128, 4096),
               (32, 4096), (16, 24576), (64, 8192), (4, 131072), (128, 1024), (8, 4096)]
# where key_table_ab times both forms of the CUDA kernel: issue 34's grid and six long points beyond it
KEY_TABLE_POINTS = GRID + [(8, 32768), (32, 32768), (16, 24576), (4, 131072), (64, 8192), (2, 5000)]


# The paper's MSE distortion of its MSE quantizer on unit vectors, b = 1..4 (Theorem on D_mse, numeric
# values as quoted by independent summaries of arXiv 2504.19874; not checked here against the paper's
# own text, so printed as "as quoted").
PAPER_MSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}


def key_mse(bits: int, dim: int, n: int = 4096, norm_correction: bool = False, seed: int = 0) -> float:
    """E ||x - dequant(quant(x))||^2 over ``n`` random unit vectors in ``dim`` dimensions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    xh = dequantize_keys(quantize_keys(x, bits, norm_correction=norm_correction))
    return float(((x - xh) ** 2).sum(-1).mean())


def mse_table(dim: int = 128, bits=(2, 3, 4), n: int = 4096) -> list[dict]:
    """Measured key MSE on random unit vectors beside the paper's bounds and quoted figures."""
    rows = []
    for b in bits:
        rows.append({"bits": b, "mse": key_mse(b, dim, n), "mse_nc": key_mse(b, dim, n, norm_correction=True),
                     "lower_bound": 4.0 ** -b, "upper_bound": math.sqrt(3) * math.pi / 2 * 4.0 ** -b,
                     "paper_quoted": PAPER_MSE.get(b)})
    return rows


def run(*, budget_s: float | None = None, smoke: bool = False) -> Measurement:
    """Decode at :data:`SHAPES` x :data:`CONFIGS` against SDPA, then the mixed step and the copy ceiling
    (``smoke``: :data:`SMOKE_SHAPES` x :data:`SMOKE_CONFIGS` only). GPU only."""
    require_gpu("workbook.benchmarks.turboquant.run")
    t0 = time.time()
    windows = 1 if smoke else 3
    timer = functools.partial(_graph10, windows=windows)
    configs = SMOKE_CONFIGS if smoke else CONFIGS
    res = {"shapes": [], "configs": configs, "cuda_decode_config": dict(CONFIG["cuda_decode"]),
           "slot_bytes": slot_bytes(HEADS["d"])}
    skipped = []
    for B, T in (SMOKE_SHAPES if smoke else SHAPES):
        if budget_s is not None and time.time() - t0 > budget_s:
            skipped.append({"batch": B, "context": T})
            continue
        try:
            row = decode_point(B, T, HEADS["hq"], HEADS["hkv"], HEADS["d"], HEADS["block_size"], timer, time_us,
                               configs)
        except torch.OutOfMemoryError as e:  # recorded, not fatal: the other points still run
            row = {"batch": B, "context": T, "error": f"OutOfMemoryError: {str(e)[:200]}"}
        res["shapes"].append(row)
        if not smoke:
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        torch.cuda.empty_cache()
    ceilings = {}
    if not smoke:
        if budget_s is None or time.time() - t0 <= budget_s:
            res["target_ab"] = target_ab()
            print("target_ab", {k: round(v["median_speedup"], 3) for k, v in res["target_ab"].items()}, flush=True)
        res["grid"] = _grid(timer, t0, budget_s, skipped)
        try:
            res["mixed_step"] = _mixed_step_point(timer, eager=time_us)
        except Exception as e:  # noqa: BLE001  (recorded; the decode figures above stand)
            res["mixed_step"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print("mixed", res["mixed_step"], flush=True)
        if budget_s is None or time.time() - t0 <= budget_s:   # the whole section or none of it
            try:
                res["sustained"] = [sustained_point(B, T, HEADS["hq"], HEADS["hkv"], HEADS["d"], HEADS["block_size"],
                                                    _sustained_timers()) for B, T in SUSTAINED_POINTS]
            except Exception as e:  # noqa: BLE001  (recorded; the figures above stand)
                res["sustained"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        ceilings["copy_GBps"] = copy_ceiling_GBps()
    res["mse"] = mse_table(128 if not smoke else 32, n=4096 if not smoke else 256)   # a CPU computation
    if skipped:
        res["skipped"] = skipped
    res["elapsed_s"] = time.time() - t0
    timers = dict(TIMERS)
    if not smoke:
        try:
            old = load_record("turboquant")
        except FileNotFoundError:
            old = None
        kept, more_timers = kept_tables(old, describe().get("gpu"))
        res.update(kept)
        timers.update(more_timers)
    return Measurement(res, timers, ceilings)


# The record's tables a full run writes, and those other runs add (Nsight Compute profiles, SASS counts, A/B runs of
# kernel variants, the H100 record, the notes on them), which a full run carries over (kept_tables).
RUN_TABLES = ("shapes", "configs", "cuda_decode_config", "slot_bytes", "target_ab", "grid", "mixed_step", "sustained",
              "mse", "skipped", "elapsed_s")
KEPT_TABLES = ("profile", "profile_b8", "profile_kernel_c", "profile_kernel_l", "static_sass", "static_sass_cuda",
               "previous_kernel", "previous_cuda_kernel", "cuda_variants_measured", "launch_rule", "h100_record",
               "notes")


def kept_tables(old: dict | None, gpu: str | None) -> tuple[dict, dict]:
    """(tables, timers) that a full run on ``gpu`` keeps from ``old``, the turboquant record it replaces: its
    KEPT_TABLES (:func:`workbook.records.carry_over`: all of them on the same GPU model; on another none, since
    none names its own machine) and the timers beyond :data:`TIMERS`. The notes gain which tables were kept and
    from when; what they say of the main tables' date is for the reader to update."""
    kept, timers = carry_over(old, KEPT_TABLES, gpu)
    if kept:
        kept["notes"] = {**kept.get("notes", {}), "kept_tables": (
            f"{', '.join(sorted(k for k in kept if k != 'notes'))}: carried over from the record of {old['recorded']}; "
            f"the main tables ({', '.join(t for t in RUN_TABLES if t not in ('skipped', 'elapsed_s'))}): this run")}
    return kept, {k: v for k, v in timers.items() if k not in TIMERS}


def _grid(timer, t0: float, budget_s, skipped: list) -> list:
    """:data:`GRID` x :data:`GRID_CONFIGS` against SDPA (:func:`decode_point`); points past the budget skipped."""
    rows = []
    for B, T in GRID:
        if budget_s is not None and time.time() - t0 > budget_s:
            skipped.append({"grid": True, "batch": B, "context": T})
            continue
        try:
            row = decode_point(B, T, HEADS["hq"], HEADS["hkv"], HEADS["d"], HEADS["block_size"], timer, time_us,
                               GRID_CONFIGS)
        except torch.OutOfMemoryError as e:
            row = {"batch": B, "context": T, "error": f"OutOfMemoryError: {str(e)[:200]}"}
        rows.append(row)
        print("grid", B, T, {k: round(v, 2) for k, v in row.items() if k in ("sdpa_graph_us", "ours_graph_us",
                                                                          "speedup_vs_sdpa")}, flush=True)
        torch.cuda.empty_cache()
    return rows


def grid_table(rec: dict) -> str:
    """The grid of a record: SDPA against the CUDA kernel's default configuration, graph replay and eager."""
    rows = [r for r in rec["results"].get("grid", []) if "ours_graph_us" in r]
    columns = [("batch", "batch", "d"), ("context", "context", "d"),
               ("SDPA graph us", "sdpa_graph_us", ".1f"), ("ours graph us", "ours_graph_us", ".1f"),
               ("SDPA eager us", "sdpa_eager_us", ".1f"), ("ours eager us", "ours_eager_us", ".1f"),
               ("speedup (graph)", "speedup_vs_sdpa", ".2f")]
    return format_table(rows, columns, title="CUDA decode, default configuration, vs SDPA over the grid "
                                             "(graph: CUDA-graph replay; eager: per-call time)")


def table(rec: dict) -> str:
    """The decode points of a record (or of any dict with its ``results``) as text: GPU time from
    graph replay beside the eager per-call time, SDPA and ours (the best configuration), the read
    rates, and each backend's best speedup; then the mixed step."""
    res = rec["results"]
    rows = [r for r in res["shapes"] if "ours_graph_us" in r]
    columns = [("batch", "batch", "d"), ("context", "context", "d"),
               ("SDPA graph us", "sdpa_graph_us", ".1f"), ("ours graph us", "ours_graph_us", ".1f"),
               ("SDPA eager us", "sdpa_eager_us", ".1f"), ("ours eager us", "ours_eager_us", ".1f"),
               ("speedup", "speedup_vs_sdpa", ".2f"), ("SDPA TB/s", "sdpa_read_TBps", ".2f"),
               ("ours TB/s", "ours_read_TBps", ".2f"), ("best config", "best_config", "s"),
               ("Triton best x", "triton_speedup_vs_sdpa", ".2f"), ("CUDA best x", "cuda_speedup_vs_sdpa", ".2f")]
    out = format_table(rows, columns, title="TurboQuant 4bit_nc decode vs SDPA on a bf16 cache (graph: CUDA-graph "
                                            "replay; eager: per-call time)")
    failed = [r for r in res["shapes"] if "ours_graph_us" not in r]
    for r in failed:
        out += f"\n{r['batch']} x {r['context']}: failed: {[v for k, v in r.items() if k.endswith('error')]}"
    ms = res.get("mixed_step")
    if ms and "empty_graph_us" in ms:
        out += (f"\nmixed step (store + decode + prefill), graph replay: empty {ms['empty_graph_us']:.1f} us, "
                f"zeros {ms['zeros_graph_us']:.1f} us ({ms['zeros_over_empty']:.3f}x)")
    return out


def _fill_cache_fast(cache, k_bf16, v_bf16, pages: torch.Tensor, chunk_tokens: int = 1 << 16):
    """Quantize a request-major bf16 cache [B, Hkv, T, D] into pages (pure torch, in chunks): the
    benchmark's setup, far faster than one store-kernel program per token at millions of tokens."""
    B, hkv, T, d = k_bf16.shape
    bs = cache.block_size
    H = cache.rotation
    bnd = cache.boundaries[:-1]
    for b in range(B):
        for t0 in range(0, T, chunk_tokens):
            t1 = min(T, t0 + chunk_tokens)
            kk = k_bf16[b, :, t0:t1].float().transpose(0, 1)  # [t, Hkv, D]
            vv = v_bf16[b, :, t0:t1].float().transpose(0, 1)
            norm = torch.linalg.vector_norm(kk, dim=-1)
            codes = sign_magnitude(torch.bucketize((kk / norm.clamp_min(1e-30).unsqueeze(-1)) @ H, bnd))
            c = cache.centroids[codes]
            ks = (norm / torch.linalg.vector_norm(c, dim=-1)).half()
            qv = quantize_values(vv)
            pos = torch.arange(t0, t1, device=kk.device)
            page, off = pages[b, pos // bs].long(), pos % bs
            for h in range(hkv):
                cache.k_codes[page, h, off] = pack_nibbles(codes[:, h].to(torch.uint8))
                cache.k_scale[page, h, off] = ks[:, h]
                cache.v_codes[page, h, off] = pack_nibbles(qv.codes[:, h])
                cache.v_scale[page, h, off] = qv.scale[:, h]
                cache.v_zero[page, h, off] = qv.zero[:, h]


def _decode_setup(B, T, hq, hkv, d, block_size, seed):
    """Random bf16 q, k, v (SDPA's layout [B, H, T, D]), the same keys and values quantized into
    shuffled pages, a decode-only batch of B requests of T tokens and its output buffer."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    k16 = torch.randn(B, hkv, T, d, device=DEVICE, dtype=torch.bfloat16, generator=g)
    v16 = torch.randn(B, hkv, T, d, device=DEVICE, dtype=torch.bfloat16, generator=g)
    q16 = torch.randn(B, hq, 1, d, device=DEVICE, dtype=torch.bfloat16, generator=g)
    pages_per = triton.cdiv(T, block_size)
    num_blocks = B * pages_per
    perm = torch.randperm(num_blocks, device=DEVICE, generator=g).to(torch.int32).view(B, pages_per)
    cache = allocate_cache(num_blocks, block_size, hkv, d, DEVICE)
    _fill_cache_fast(cache, k16, v16, perm)
    batch = MixedBatch([1] * B, [T] * B, list(range(B + 1)), B, block_size,
                       torch.full((B,), T, dtype=torch.int32, device=DEVICE),
                       torch.arange(B + 1, dtype=torch.int32, device=DEVICE), perm.contiguous(),
                       torch.zeros(B, dtype=torch.int64, device=DEVICE))
    out = torch.empty(B, hq, d, dtype=torch.bfloat16, device=DEVICE)
    return q16, k16, v16, cache, batch, out


def _split_backend(cfg):  # a configuration may name the backend: {"backend": "cuda", ...}
    cfg = dict(cfg)
    return cfg.pop("backend", "triton"), (cfg or None)


def decode_point(B, T, hq, hkv, d, block_size, timer, eager, configs, seed=0):
    """One (batch, context) point: ours in each of ``configs`` (name -> config, see :data:`CONFIGS`) vs
    SDPA on the bf16 cache of the same tokens; ``timer`` / ``eager`` time one call (us). Returns the row."""
    import torch.nn.functional as F

    q16, k16, v16, cache, batch, out = _decode_setup(B, T, hq, hkv, d, block_size, seed)
    q = q16[:, :, 0].contiguous()

    def sdpa():
        return F.scaled_dot_product_attention(q16, k16, v16, enable_gqa=True)

    row = {"batch": B, "context": T, "Hq": hq, "Hkv": hkv, "D": d, "block_size": block_size}
    quant_bytes = B * hkv * T * slot_bytes(d)["total"]
    bf16_bytes = 2 * k16.numel() * 2
    row["quant_cache_bytes"], row["bf16_cache_bytes"] = quant_bytes, bf16_bytes
    row["sdpa_graph_us"] = timer(sdpa)
    row["sdpa_eager_us"] = eager(sdpa)
    row["sdpa_read_TBps"] = bf16_bytes / row["sdpa_graph_us"] / 1e6
    ref = sdpa()[:, :, 0].float()
    best = None
    for name, cfg in configs.items():
        def ours(cfg=cfg):
            be, c = _split_backend(cfg)
            return decode_attention(q, cache, batch, out, config=c, backend=be)   # rotation included
        try:
            t = timer(ours)
        except Exception as e:  # noqa: BLE001  (record, keep going)
            row[f"ours_{name}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        row[f"ours_{name}_graph_us"] = t
        if best is None or t < row[f"ours_{best}_graph_us"]:
            best = name
    if best is None:
        return row
    be_best, cfg = _split_backend(configs[best])
    for be in ("triton", "cuda"):  # the best of each backend, beside the best overall
        times = [row[f"ours_{n}_graph_us"] for n, c in configs.items()
                 if _split_backend(c)[0] == be and f"ours_{n}_graph_us" in row]
        if times:
            row[f"{be}_best_graph_us"] = min(times)
            row[f"{be}_speedup_vs_sdpa"] = row["sdpa_graph_us"] / min(times)

    def ours_best():
        return decode_attention(q, cache, batch, out, config=cfg, backend=be_best)

    row["best_config"] = best
    row["ours_graph_us"] = row[f"ours_{best}_graph_us"]
    row["ours_eager_us"] = eager(ours_best)
    row["ours_read_TBps"] = quant_bytes / row["ours_graph_us"] / 1e6
    row["speedup_vs_sdpa"] = row["sdpa_graph_us"] / row["ours_graph_us"]
    ours_best()
    row["rel_err_vs_sdpa_bf16"] = rel_err(out.float(), ref)  # quantization error included
    return row


def _graph10(fn, windows: int = 3) -> float:
    """The tables' timer: GPU time per call from replaying a graph of 10 calls, median of ``windows``."""
    return graph_time_us(fn, n=10, windows=windows)


def choose_key_table_threshold(points) -> int:
    """The run length (tokens of the longest run; kernel T's split length) from which the key table should run,
    from ``points`` = [(run_len, table_us, registers_us)]: the threshold that minimises the summed time of the form it picks (the table at or above
    it, registers below) relative to the better form at each point; ties go to the shortest. 10**9 = never."""
    def cost(c):
        return sum((tt if n >= c else tr) / min(tt, tr) for n, tt, tr in points)
    return min(sorted({n for n, _, _ in points} | {10 ** 9}), key=lambda c: (cost(c), c))


def decode_forms_ab(points, forms: dict, timer=None, eager=time_us, seed: int = 0):
    """The CUDA decode in each of ``forms`` ({name: config or None}; the first is the default's, the only
    one timed eagerly too) against SDPA at each (batch, context) of ``points`` (:data:`HEADS`), each form
    timed twice in turn and the faster kept (``timer``: graph replay of 10 calls, median of 3 windows).
    Returns (run, same, times): run = ``{"<form> B<b> T<t>": [[sdpa_us, ours_us, eager_us or None, speedup,
    None, "split_len <n>"]]}`` (the format of turboquant.json's cuda_variants_measured runs; n: the longest
    run of the default's split, tokens, the KEY_TABLE_MIN_SPLIT rule's length), same = {point: whether every
    form gave the first form's bits}, times = [(n, {form: us})]. GPU only."""
    import torch.nn.functional as F
    from ..turboquant import cuda_decode_launch

    require_gpu("workbook.benchmarks.turboquant.decode_forms_ab")
    timer = timer or _graph10
    run, same, times = {}, {}, []
    for B, T in points:
        q16, k16, v16, cache, batch, out = _decode_setup(B, T, HEADS["hq"], HEADS["hkv"], HEADS["d"],
                                                         HEADS["block_size"], seed)
        q = q16[:, :, 0].contiguous()
        t_sdpa = timer(lambda: F.scaled_dot_product_attention(q16, k16, v16, enable_gqa=True))
        n = cuda_decode_launch(CONFIG["cuda_decode"], B * HEADS["hkv"], T, torch.cuda.current_device()).run_len
        calls = {f: (lambda c=c: decode_attention(q, cache, batch, out, backend="cuda", config=c)) for f, c in forms.items()}
        best, outs = {}, {}
        for _ in range(2):   # each form twice, in turn; the faster kept
            for f, fn in calls.items():
                best[f] = min(best.get(f, math.inf), timer(fn))
        for f, fn in calls.items():
            fn()
            outs[f] = out.clone()
        pt, first = f"B{B} T{T}", next(iter(forms))
        same[pt] = all(torch.equal(outs[first], o) for o in outs.values())
        for f, fn in calls.items():
            run[f"{f} {pt}"] = [[round(t_sdpa, 1), round(best[f], 1), round(eager(fn), 1) if f == first else None,
                                 round(t_sdpa / best[f], 3), None, f"split_len {n}"]]
        times.append((n, dict(best)))
        del q16, k16, v16, q, cache, batch, out, outs, calls, fn   # the lambdas hold the cache too
        torch.cuda.empty_cache()
    return run, same, times


def _each_point(points, seed: int):
    """Per (batch, context) of ``points``: a namespace of :func:`_decode_setup`'s tensors (``q`` the decode
    queries [B, Hq, D]) and ``sdpa``, SDPA on its bf16 cache; its tensors are dropped, and the allocator's
    cache emptied, when the caller moves on to the next point."""
    import torch.nn.functional as F
    from types import SimpleNamespace

    for B, T in points:
        p = SimpleNamespace(label=f"B{B} T{T}", B=B, T=T)
        p.q16, p.k16, p.v16, p.cache, p.batch, p.out = _decode_setup(B, T, HEADS["hq"], HEADS["hkv"], HEADS["d"],
                                                                     HEADS["block_size"], seed)
        p.q = p.q16[:, :, 0].contiguous()
        p.sdpa = lambda: F.scaled_dot_product_attention(p.q16, p.k16, p.v16, enable_gqa=True)
        yield p
        p.__dict__.clear()
        torch.cuda.empty_cache()


def _alternate(fns: dict, rounds: int, pause_s: float, timer) -> dict:
    """{name: [time per round]}: every callable of ``fns`` timed once a round, in ``fns``' order on even
    rounds and reversed on odd ones, ``pause_s`` of idle card before every timing."""
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            time.sleep(pause_s)
            times[name].append(timer(fns[name]))
    return times


def target_ab(points=TARGET_POINTS, rounds: int = 4, pause_s: float = 1.0, timer=None, seed: int = 0) -> dict:
    """Issue 34's target points, SDPA and the CUDA decode (default configuration) timed alternately: ``rounds``
    rounds per point, the order flipped each round, ``pause_s`` of idle card before every timing so that
    each starts from the same state (a single pass times each kernel right after the other, and the table
    and the grid of one run can disagree at the same point: turboquant.json, 8 x 64k). Returns
    ``{"B<b> T<t>": {"sdpa_graph_us": [...], "ours_graph_us": [...], "speedups": [...], "median_speedup": m}}``,
    the lists in round order. GPU only."""
    require_gpu("workbook.benchmarks.turboquant.target_ab")
    res = {}
    for p in _each_point(points, seed):
        fns = {"sdpa": p.sdpa, "ours": lambda: decode_attention(p.q, p.cache, p.batch, p.out, backend="cuda")}
        times = _alternate(fns, rounds, pause_s, timer or _graph10)
        speedups = [a / b for a, b in zip(times["sdpa"], times["ours"])]
        res[p.label] = {"sdpa_graph_us": times["sdpa"], "ours_graph_us": times["ours"], "speedups": speedups,
                        "median_speedup": statistics.median(speedups)}
    return res


def fill_ab(points=FILL_POINTS, rounds: int = 4, pause_s: float = 0.4, timer=None, eager=time_us,
            seed: int = 0) -> dict:
    """The CUDA decode with FILL on and off (CONFIG["cuda_decode"]; the rest default) and SDPA, timed as
    :func:`target_ab` times its pair (order sdpa, fill, nofill, reversed every other round). Returns
    ``{"B<b> T<t>": row}`` in the format of turboquant.json's cuda_variants_measured run 17: each one's
    times per round, FILL's and FILL off's eager time, each one's median speedup over SDPA, the median of
    the rounds' nofill / fill ratios, FILL's plan (cuda_decode_launch) and the outputs' relative
    differences (FILL against FILL off, and against SDPA on the unquantized bf16 cache). GPU only."""
    from ..turboquant import cuda_decode_launch

    require_gpu("workbook.benchmarks.turboquant.fill_ab")
    res = {}
    for p in _each_point(points, seed):
        fns = {"sdpa": p.sdpa, **{f: (lambda c=c: decode_attention(p.q, p.cache, p.batch, p.out, backend="cuda",
                                                                   config={"FILL": c}))
                                  for f, c in (("fill", True), ("nofill", False))}}
        outs = {}
        for f in ("fill", "nofill"):
            fns[f]()
            outs[f] = p.out.float().clone()
        row = {"rel_fill_nofill": rel_err(outs["fill"], outs["nofill"]),
               "rel_fill_sdpa": rel_err(outs["fill"], p.sdpa()[:, :, 0].float())}
        times = _alternate(fns, rounds, pause_s, timer or _graph10)
        row.update({f"{f}_graph_us": v for f, v in times.items()})
        row["fill_eager_us"], row["nofill_eager_us"] = eager(fns["fill"]), eager(fns["nofill"])
        for f in ("fill", "nofill"):
            row[f"{f}_median_speedup"] = statistics.median(a / b for a, b in zip(times["sdpa"], times[f]))
        row["fill_over_nofill_median"] = statistics.median(b / a for a, b in zip(times["fill"], times["nofill"]))
        row["plan"] = list(cuda_decode_launch({**CONFIG["cuda_decode"], "FILL": True}, p.B * HEADS["hkv"], p.T,
                                              torch.cuda.current_device()))
        res[p.label] = row
    return res


def key_table_ab(points=KEY_TABLE_POINTS, variant: str = "T", timer=None, eager=time_us, seed: int = 0) -> dict:
    """The CUDA decode by its rule and with each key form forced (KEY_TABLE True / False) against SDPA
    (:func:`decode_forms_ab`); returns ``{"run": ..., "threshold": the one :func:`choose_key_table_threshold`
    picks, "table_equals_regs_bitwise": {point: bool}}``. GPU only."""
    forms = {variant: None, f"{variant}-table": {"KEY_TABLE": True}, f"{variant}-regs": {"KEY_TABLE": False}}
    run, same, times = decode_forms_ab(points, forms, timer, eager, seed)
    pts = [(n, t[f"{variant}-table"], t[f"{variant}-regs"]) for n, t in times]
    return {"run": run, "threshold": choose_key_table_threshold(pts), "table_equals_regs_bitwise": same}


def _sustained_timers() -> dict:
    return {"graph": _graph10, "graph1": lambda fn: graph_time_us(fn, n=1, windows=3),
            "eager": time_us, "profiler": kernel_times_us,
            "power": lambda fn: power_probe(fn, seconds=1.5, n=10, settle_s=0.4)}


def sustained_point(B, T, hq, hkv, d, block_size, timers: dict, backend: str = "cuda", seed: int = 0) -> dict:
    """What each timer sees at one decode point under sustained load, for our decode (``backend``, its default
    configuration) and SDPA: ``graph`` (a graph of 10 calls, as the tables; again after the power probe),
    ``graph1`` (a graph of one call per replay), ``eager``, ``profiler`` (each kernel's own time) and ``power``
    (nvidia-smi's SM clock, board power and power-cap flag during sustained replay,
    :func:`workbook.timing.power_probe`). ``timers`` maps those names to functions of a call."""
    import torch.nn.functional as F

    q16, k16, v16, cache, batch, out = _decode_setup(B, T, hq, hkv, d, block_size, seed)
    q = q16[:, :, 0].contiguous()
    calls = {"ours": lambda: decode_attention(q, cache, batch, out, backend=backend),
             "sdpa": lambda: F.scaled_dot_product_attention(q16, k16, v16, enable_gqa=True)}
    row = {"batch": B, "context": T, "backend": backend}
    for name, fn in calls.items():
        row[f"{name}_graph_us"] = timers["graph"](fn)
        row[f"{name}_graph1_graph_us"] = timers["graph1"](fn)
        row[f"{name}_eager_us"] = timers["eager"](fn)
        row[f"{name}_kernels_profiler_us"] = timers["profiler"](fn)
        row[f"{name}_power"] = timers["power"](fn)
        row[f"{name}_after_power_graph_us"] = timers["graph"](fn)
        row[f"{name}_graph_over_eager"] = row[f"{name}_graph_us"] / row[f"{name}_eager_us"]
    return row


def _mixed_step_point(timer, shape: dict = MIXED_STEP, eager=None) -> dict:
    """A mixed step (store + decode + prefill, one prefill a continuation chunk after a cached prefix)
    timed by ``timer``: ``attn_out`` from ``empty`` and from ``zeros``, what the difference is made of
    (the zero fill of those bytes alone, in a graph), and the step's bf16 twin (:func:`_bf16_twin`).
    ``eager`` (a per-call timer) adds the eager time beside each graph time."""
    nd, ctx, pre_q, pre_ctx = shape["nd"], shape["ctx"], list(shape["pre_q"]), list(shape["pre_ctx"])
    q, k, v, cache, batch = make_example([1] * nd + pre_q, [ctx] * nd + pre_ctx, nd, block_size=16,
                                         dtype=torch.bfloat16, hq=shape["hq"], hkv=shape["hkv"], d=shape["d"])
    res = {"decode_reqs": nd, "decode_context": ctx, "prefill_query_lens": pre_q, "prefill_context": pre_ctx,
           "attn_out_bytes": q.numel() * q.element_size()}
    for alloc in ("empty", "zeros"):
        res[f"{alloc}_graph_us"] = timer(lambda alloc=alloc: mixed_attention(q, k, v, cache, batch, alloc=alloc))
        if eager is not None:
            res[f"{alloc}_eager_us"] = eager(lambda alloc=alloc: mixed_attention(q, k, v, cache, batch, alloc=alloc))
    res["zeros_over_empty"] = res["zeros_graph_us"] / res["empty_graph_us"]
    res["zero_fill_alone_graph_us"] = timer(lambda: torch.zeros_like(q))
    if ON_GPU:   # the same step with the CUDA C++ decode (mixed_attention's default decode is Triton's)
        try:
            res["cuda_decode_empty_graph_us"] = timer(lambda: mixed_attention(q, k, v, cache, batch, backend="cuda"))
        except ValueError as e:   # a step the CUDA kernel does not take (head dim, GQA ratio, pages): its reason
            res["cuda_decode_error"] = str(e)[:300]
    try:
        res["bf16_twin"] = _bf16_twin(q, k, v, batch, timer, eager)
        res["bf16_twin"]["turboquant_over_twin"] = res["empty_graph_us"] / res["bf16_twin"]["twin_graph_us"]
        if "cuda_decode_empty_graph_us" in res:
            res["bf16_twin"]["turboquant_cuda_decode_over_twin"] = (res["cuda_decode_empty_graph_us"]
                                                                    / res["bf16_twin"]["twin_graph_us"])
    except (NotImplementedError, RuntimeError) as e:    # torch's flash attention is CUDA-only
        res["bf16_twin"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return res


def _varlen_flash(q, k, v, cu_q, cu_k, max_q: int, max_k: int) -> torch.Tensor:
    """torch's varlen flash-attention forward (CUDA only): causal, aligned bottom-right."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False)[0]


def _bf16_twin(q, k, v, batch: MixedBatch, timer, eager=None) -> dict:
    """The same mixed step on a bf16 cache with the best attention torch offers for it: every request's
    tokens contiguous in one packed bf16 cache (no pages: an optimistic twin, nothing to gather), the new
    tokens stored with ``index_copy_``, then ONE varlen flash-attention call for the decode and prefill
    rows together (``torch.ops.aten._flash_attention_forward``, causal aligned bottom-right, GQA native).
    Its output is checked against exact attention per request before it is timed."""
    import torch.nn.functional as F
    dev, R = q.device, batch.num_reqs
    seq = list(batch.seq_lens_host)
    qs = list(batch.query_start_host[: R + 1])
    cu_k = torch.tensor([0] + [sum(seq[: i + 1]) for i in range(R)], dtype=torch.int32, device=dev)
    cu_q = torch.tensor(qs, dtype=torch.int32, device=dev)
    kc = torch.randn(int(cu_k[-1]), k.shape[1], k.shape[2], device=dev).to(torch.bfloat16)
    vc = torch.randn_like(kc)
    # the new tokens go to the end of each request's span of the packed cache
    slots = torch.cat([torch.arange(int(cu_k[r + 1]) - (qs[r + 1] - qs[r]), int(cu_k[r + 1]), device=dev)
                       for r in range(R)])
    max_q, max_k = max(b - a for a, b in zip(qs, qs[1:])), max(seq)

    heads = {"gqa": "native"}

    def step():
        kc.index_copy_(0, slots, k)
        vc.index_copy_(0, slots, v)
        if heads["gqa"] == "native":
            return _varlen_flash(q, kc, vc, cu_q, cu_k, max_q, max_k)
        g = q.shape[1] // k.shape[1]
        return _varlen_flash(q, kc.repeat_interleave(g, 1), vc.repeat_interleave(g, 1), cu_q, cu_k, max_q, max_k)

    try:
        out = step()
    except RuntimeError:          # a flash build without native GQA: K and V heads repeated (recorded)
        heads["gqa"] = "K/V heads repeated in the step"
        out = step()
    errs = []
    for r in (0, R - 2, R - 1):     # a decode request and the prefill requests, against exact attention
        a, b, lo, hi = qs[r], qs[r + 1], int(cu_k[r]), int(cu_k[r + 1])
        qq, kk, vv = (t.transpose(0, 1)[None].float() for t in (q[a:b], kc[lo:hi], vc[lo:hi]))
        mask = torch.ones(b - a, hi - lo, dtype=torch.bool, device=dev).tril(hi - lo - (b - a))
        ref = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
        errs.append(rel_err(out[a:b], ref))
    return {"layout": "packed contiguous bf16 KV per request (no pages)", "attention":
            "torch.ops.aten._flash_attention_forward (varlen, causal bottom-right), one call",
            "store": "index_copy_ of the new K and V", "gqa": heads["gqa"], "max_rel_err_vs_exact": max(errs),
            "twin_graph_us": timer(step), **({"twin_eager_us": eager(step)} if eager is not None else {})}
