"""Gated DeltaNet on the GPU (notebook 05): our chunked prefill and recurrent decode against
flash-linear-attention (fla, when its wheel is installed), called with the same arguments in the same
process. :func:`run` follows the benchmark contract (:mod:`workbook.benchmarks`); :func:`table` prints a
record.

What a full run measures, one function per family of rows:

* chunk (:func:`_chunk_row`): each prefill call at CHUNK_SHAPES (bf16, mixed gates, initial state in, final
  state out) and one varlen batch (device cu_seqlens, VARLEN_SEQS), ours (state pass by the launch rule,
  :func:`workbook.gdn.state_launch`) and fla, each timed two ways (``graph``: GPU time from CUDA-graph
  replay; ``eager``: eager per-call time) and cross-checked (outputs and final states); at PROFILE_SHAPES
  also each kernel's own GPU time (``profiler``). fla's first call at each head count autotunes there,
  with the GPU to itself.
* state pass alone (:func:`_state_row`): at STATE_SHAPES, graph replay of the state pass launched alone
  (:func:`state_pass_alone`), the rule's pick beside the previous default (``gdn.STATE_PREVIOUS``).
* decode (:func:`_decode_row`): DECODE_SHAPE with an fp32 state, ours (also in place) and fla; state
  traffic over GPU time against the copy ceiling measured in the same run.
* extras (:func:`_extras`), for ``budget_s`` seconds after the rows above (default 60), each only while
  the time left covers its cold cost: the state pass over STATE_GRID (BV x num_stages) at
  STATE_GRID_SHAPES, a call-for-call cross-check on small odd shapes, launch-configuration sweeps
  (DECODE_SWEEP, CHUNK_SWEEP). What is left out is listed under ``skipped``; defaults stay as shipped.

Apart from :func:`run`: :func:`measure_segments` (issue #33) times the chunked prefill parallel over the
sequence (``segments=``, a few lengths) beside the plain path and fla at SEGMENT_SHAPES, both timers, with
each shape's model FLOPs and bytes (:func:`segment_cost`); :func:`segments_table` prints its record;
:func:`measure_fusion` times the fused forms of the chunked path (FUSION_FORMS) into that record's ``fusion``
table, with each shape's floor from the ceilings it measures; :func:`fusion_table` prints it.

Before anything is timed, a compile warm-up (:func:`_warm_up`; a cold machine spends most of a run
compiling) calls every kernel variant timed below, ours and fla's, once at WARM_T tokens in spawned
processes (the CPUs this process may use less two, at most 14), so the binaries are in Triton's disk
cache; fla's autotuning picks there are thrown away.

``smoke=True`` (what notebook 05 times live, seconds): the first chunk shape and the decode call, ours
and fla, timed both ways and cross-checked; no warm-up processes, no profiler, no state pass alone, no
extras.
"""
from __future__ import annotations

import os
import time

import torch
import triton

from .. import timing
from ..check import rel_err
from ..device import DEVICE, ON_GPU, describe, resolve_emulate
from ..gdn import (CHUNK, CONFIG, EMULATE_WHY, STATE_PREVIOUS, STATE_RULE, _chunk_table, _final_state_buffer,
                   _launch_state, _previous_state_cfg, _state_cfg, chunk_gated_delta_rule,
                   fused_recurrent_gated_delta_rule, make_inputs, naive_recurrent_gated_delta_rule, state_launch)
from ..records import Measurement, as_record, carry_over, load_record, save_record

__all__ = [
    "run", "table", "has_timing_methods", "state_pass_alone", "TIMERS", "CHUNK_SHAPES", "VARLEN_SEQS",
    "VARLEN_HEADS", "PROFILE_SHAPES", "STATE_SHAPES", "STATE_GRID_SHAPES", "STATE_GRID", "DECODE_SHAPE",
    "DECODE_SWEEP", "CHUNK_SWEEP", "WARM_T", "measure_segments", "segments_table", "segment_cost", "SEGMENT_SHAPES",
    "SEGMENT_SWEEP", "SEGMENT_D", "profile_segments",
]

# The timers of the record (workbook.timing.TIMERS, with this benchmark's detail).
TIMERS = {
    "graph": "GPU time per call: the call captured in a CUDA graph of 20 calls and replayed "
             "(workbook.timing.graph_time_us); no Python or launch work between kernels. Claims are made on this.",
    "eager": "eager per-call time: the Python call timed with triton.testing.do_bench (CUDA events around each "
             "call; workbook.timing.time_us), so the host's work and every kernel launch are included.",
    "profiler": "each device kernel's own GPU time per call, from torch.profiler over 5 eager calls "
                "(workbook.timing.kernel_times_us; kernel durations, gaps between kernels not included).",
}

# (B, T, key heads H, value heads HV, D, L2 norm of q and k in the kernel): the three shapes,
# then a Qwen3-Next linear-attention layer (16 key / 32 value heads, D = 128, q and k normalised in
# the kernel as the model calls it) at the two ends of T = 4k .. 32k.
CHUNK_SHAPES = [(1, 8192, 16, 16, 128, False), (4, 4096, 32, 32, 128, False), (2, 2048, 16, 32, 128, False),
                (1, 4096, 16, 32, 128, True), (1, 32768, 16, 32, 128, True)]
# a varlen prefill batch of the Qwen3-Next layer (key heads, value heads, D): four sequences, one of a single token
VARLEN_SEQS, VARLEN_HEADS = (1, 3071, 4000, 1120), (16, 32, 128)
# every prefill call of the record: CHUNK_SHAPES + (sequence lengths or None,), then the varlen batch
_SPECS = [(*s, None) for s in CHUNK_SHAPES] + [(1, sum(VARLEN_SEQS), *VARLEN_HEADS, True, VARLEN_SEQS)]
PROFILE_SHAPES = {(1, 8192, 16, 16, 128), (2, 2048, 16, 32, 128)}   # per-kernel times recorded for these
# the state pass alone, the rule's pick beside the previous default, at the shapes with few sequences x
# heads (the rule's territory); at STATE_GRID_SHAPES also a BV x num_stages grid (under the budget)
STATE_SHAPES = {(1, 8192, 16, 16, 128), (2, 2048, 16, 32, 128), (1, 32768, 16, 32, 128), (1, 8192, 16, 32, 128)}
STATE_GRID_SHAPES = {(1, 8192, 16, 16, 128), (1, 32768, 16, 32, 128)}
STATE_GRID = [(bv, ns) for bv in (16, 32, 64) for ns in (2, 3)]
DECODE_SHAPE = (256, 32, 128)
WARM_T = 1024   # tokens of the compile warm-up calls (same divisibility by 16 of T and chunk counts)
# the launch configurations the extras sweep (the shipped defaults stay CONFIG's)
DECODE_SWEEP = [{"BV": 16, "num_warps": 2}, {"BV": 32, "num_warps": 8}, {"BV": 64, "num_warps": 4}]
CHUNK_SWEEP = [{"state": {"BV": 32}}, {"state": {"BV": 64}}, {"state": {"num_warps": 8}},
               {"state": {"num_stages": 3}}, {"output": {"BV": 128}}, {"solve": {"num_warps": 2}},
               {"wu": {"num_warps": 8}}, {"state": {"FUSE_O": True}}, {"state": {"FUSE_O": True, "num_warps": 8}}]


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fc
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fr
        import fla
        return fc, fr, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001  (the peer is optional)
        return None, None, f"unavailable: {type(e).__name__}: {e}"


# --------------------------------------------------------------------------------------------------
# The calls that are timed
# --------------------------------------------------------------------------------------------------

def state_pass_alone(args: dict, config: dict | None = None):
    """A function that launches the state pass (kernel 3) alone, as :func:`workbook.gdn.chunk_gated_delta_rule`
    launches it when the outputs are not folded in (FUSE_O off), on the intermediates of one call with ``args``
    (made once, here; ``.call_outputs`` holds that call's (o, final state)), with the launch configuration ``config``
    {"BV", "num_warps", "num_stages"} (names left out or None: the rule's). Each call rewrites h, v' and
    ``.final_state``; the benchmark times it alone, by graph replay."""
    q, k, v = args["q"], args["k"], args["v"]
    cu = args.get("cu_seqlens")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu is None else cu.numel() - 1
    l2 = bool(args.get("use_qk_l2norm_in_kernel", False))
    o, ht0, inter = chunk_gated_delta_rule(**args, return_intermediates=True, segments=None)   # the plain path's
    if cu is not None:
        _, chunk_offsets, NT = _chunk_table(cu, N, B * T)
    else:
        chunk_offsets, NT = None, B * triton.cdiv(T, CHUNK)
    cs = {"BV": None, "num_warps": None, "num_stages": None, "RULE": True, **(config or {})}
    c3 = _state_cfg(cs, N, HV, K, V, q.element_size(), cu is not None)
    h0 = args.get("initial_state")
    # the final state as the launcher allocates it (empty: the programs tile it; see _final_state_buffer)
    ht = _final_state_buffer(h0, False, N, HV, K, V, q.device) if args.get("output_final_state") else None
    scale = K ** -0.5 if args.get("scale") is None else float(args["scale"])
    kc = inter["kn"] if l2 else k
    emulate = resolve_emulate(None, EMULATE_WHY)

    def run():
        _launch_state(c3, kc, inter["w"], inter["u"], inter["G"], inter["h"], inter["v_new"], None, None, h0, ht,
                      cu, chunk_offsets, scale, T, NT, N=N, l2=l2, emulate=emulate)
    run.config, run.final_state, run.call_outputs = c3, ht, (o, ht0)
    return run


def _bench_args(spec, warm: bool = False) -> dict:
    """Arguments of one benchmark call (bf16, mixed gates, initial state in, final state out) for a
    _SPECS entry, or the decode call for spec "decode". ``warm``: the same call at WARM_T tokens
    (same batch, heads, flags and dtypes: the same compiled kernels), for the compile warm-up."""
    if spec == "decode":
        Bd, Hd, Dd = DECODE_SHAPE
        x = make_inputs(Bd, 1, Hd, Dd, dtype=torch.bfloat16, gate="mixed", initial_state=True)
        return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x["initial_state"],
                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    B, T, H, HV, D, l2, seqs = spec
    if warm:
        T = WARM_T
        if seqs is not None:   # the same number of sequences, scaled down (each at least one token)
            seqs = [max(1, s * WARM_T // sum(seqs)) for s in seqs[:-1]]
            seqs.append(WARM_T - sum(seqs))
    x = make_inputs(B, T if seqs is None else sum(seqs), H, D, HV=HV, dtype=torch.bfloat16, gate="mixed",
                    normalize_qk=not l2)
    N = B if seqs is None else len(seqs)
    x["initial_state"] = torch.randn(N, HV, D, D, device=DEVICE) * 0.3
    args = dict(**x, output_final_state=True, use_qk_l2norm_in_kernel=l2)
    if seqs is not None:
        args["cu_seqlens"] = torch.tensor([0, *seqs], device=DEVICE).cumsum(0)
    return args


def _n_seq(spec) -> int:
    return spec[0] if spec[6] is None else len(spec[6])


def _state_cfgs(spec) -> tuple:
    """(the rule's pick, the previous default) for a prefill spec, bf16 storage."""
    N, HV, D = _n_seq(spec), spec[3], spec[4]
    return state_launch(N, HV, D, D, 2, varlen=spec[6] is not None), _previous_state_cfg(N, HV, D)


def _decode_state_bytes() -> int:
    Bd, Hd, Dd = DECODE_SHAPE
    return 2 * Bd * Hd * Dd * Dd * 4   # read h0 + write ht, fp32


# --------------------------------------------------------------------------------------------------
# Compile warm-up (spawned processes; nothing is timed meanwhile)
# --------------------------------------------------------------------------------------------------

def _warm_one(task) -> str:
    """(In a spawned process.) One call of ours or of fla at the warm-up size of a benchmark shape, so
    that its kernels are compiled into Triton's disk cache before anything is timed. fla autotunes
    here on a busy GPU and a small shape: FLA_CACHE_RESULTS=0 keeps those picks off the disk, so fla
    autotunes again in the timing process, alone (from the cached binaries: benchmarking only)."""
    os.environ["FLA_CACHE_RESULTS"] = "0"
    who, spec, state = task
    t0 = time.time()
    try:
        args = _bench_args(spec, warm=True)
        if spec == "decode":
            fn = _fla()[1] if who == "fla" else fused_recurrent_gated_delta_rule
        else:
            fn = _fla()[0] if who == "fla" else chunk_gated_delta_rule
        if fn is None:
            return f"{who} {spec}: peer unavailable"
        fn(**args, **({"config": {"state": state}} if state else {}))
        if ON_GPU:
            torch.cuda.synchronize()
        return f"{who} {spec} {state or ''}: {time.time() - t0:.1f} s"
    except Exception as e:  # noqa: BLE001  (the timing process compiles whatever is missing)
        return f"{who} {spec} {state or ''}: failed: {type(e).__name__}: {e}"[:200]


def _warm_compile(tasks, procs: int, timeout_s: float) -> dict:
    """Run ``_warm_one`` over ``tasks`` in ``procs`` spawned processes (Triton compiles on the CPU: a
    cold machine compiles in parallel what one process would compile one kernel after another).
    Nothing is timed meanwhile. Whatever fails or is cut by ``timeout_s`` is compiled later, in the
    timing process, before its first timing (each timing calls its function once first)."""
    import multiprocessing as mp

    t0 = time.time()
    out = {"tasks": len(tasks), "processes": procs}
    pool = mp.get_context("spawn").Pool(procs)
    try:
        out["results"] = pool.map_async(_warm_one, tasks, chunksize=1).get(timeout=timeout_s)
    except Exception as e:  # noqa: BLE001  (a timeout or a broken pool costs time, not the record)
        out["results"] = [f"warm-up cut: {type(e).__name__}: {e}"[:200]]
    finally:
        pool.terminate()
        pool.join()
    out["wall_s"] = time.time() - t0
    return out


def _warm_tasks(with_fla: bool, grid: bool) -> list:
    """Every call the run will time, as warm-up tasks: fla's first (its autotuning compiles the most),
    then ours, then the state configurations other than the rule's (the grid's too when ``grid``)."""
    firsts = {}   # the first spec of each compile signature (all but T: same warm-up call)
    for spec in _SPECS:
        firsts.setdefault((spec[0], *spec[2:6], spec[6] is None), spec)
    tasks = [("fla", spec, None) for spec in firsts.values() if with_fla]
    tasks += [("ours", spec, None) for spec in firsts.values()]
    for spec in _SPECS:
        if spec[:5] in STATE_SHAPES:
            rule, prev = _state_cfgs(spec)
            cfgs = [prev] if prev != rule else []
            if grid and spec[:5] in STATE_GRID_SHAPES:
                cfgs += [c for bv, ns in STATE_GRID
                         if (c := {"BV": bv, "num_warps": 4, "num_stages": ns}) not in (rule, prev)]
            tasks += [("ours", spec, c) for c in cfgs]
    return tasks + [(who, "decode", None) for who in (["fla"] if with_fla else []) + ["ours"]]


def _warm_up(res: dict, tasks: list, log) -> None:
    """The compile warm-up in (the CPUs this process may use less two, at most 14) processes, cut after
    100 s; recorded under ``warm_up``. Fewer than two processes: none (each timing compiles first)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    procs = min(len(tasks), 14, cpus - 2)
    if procs >= 2:
        res["warm_up"] = _warm_compile(tasks, procs, timeout_s=100)
        log("warm-up", res["warm_up"])


# --------------------------------------------------------------------------------------------------
# One function per measured family
# --------------------------------------------------------------------------------------------------

def _put(row: dict, who: str, times: dict) -> None:
    """``timing.time_both``'s figures into ``row`` as <who>_graph_us (or <who>_graph_error: why the
    call could not be captured) and <who>_eager_us."""
    if "graph_us" in times:
        row[f"{who}_graph_us"] = times["graph_us"]
    else:
        row[f"{who}_graph_error"] = times["graph_error"]
    row[f"{who}_eager_us"] = times["eager_us"]


def _ratios(row: dict) -> None:
    for m in ("graph", "eager"):
        a, b = row.get(f"ours_{m}_us"), row.get(f"fla_{m}_us")
        if isinstance(a, float) and isinstance(b, float):
            row[f"ratio_ours_over_fla_{m}"] = a / b


def _compare(row: dict, ours, peer) -> None:
    """Outputs and final states of one call, ours against the peer's (relative error)."""
    row["rel_err_vs_fla_o"] = rel_err(ours[0].float(), peer[0].float())
    row["rel_err_vs_fla_ht"] = rel_err(ours[1].float(), peer[1].float())


def _graph(fn, prefix: str = "") -> dict:
    """``{prefix + "graph_us": GPU time per call from graph replay}``, or ``{prefix + "graph_error": why
    there is none}`` (recorded, never silently skipped)."""
    try:
        return {f"{prefix}graph_us": timing.graph_time_us(fn)}
    except Exception as e:  # noqa: BLE001  (one failed configuration never costs the record)
        torch.cuda.synchronize()
        return {f"{prefix}graph_error": f"{type(e).__name__}: {e}"[:300]}


def _state_alone(args: dict, config: dict, prefix: str = "") -> dict:
    """:func:`_graph` of the state pass alone with ``config``."""
    try:
        run = state_pass_alone(args, config)
    except Exception as e:  # noqa: BLE001  (one failed configuration never costs the record)
        torch.cuda.synchronize()
        return {f"{prefix}graph_error": f"{type(e).__name__}: {e}"[:300]}
    return _graph(run, prefix)


def _chunk_row(spec, args: dict, fla_chunk, profile: bool) -> dict:
    """One prefill call, ours and fla's: both timers, the cross-check, and with ``profile`` each
    kernel's own GPU time (where the time goes)."""
    B, T, H, HV, D, l2, seqs = spec
    row = {"B": B, "T": T, "H": H, "HV": HV, "D": D, "dtype": "bfloat16", "l2norm_in_kernel": l2}
    if seqs is not None:
        row["cu_seqlens"] = args["cu_seqlens"].tolist()
    _put(row, "ours", timing.time_both(lambda: chunk_gated_delta_rule(**args)))
    if fla_chunk is not None:
        _put(row, "fla", timing.time_both(lambda: fla_chunk(**args)))
        _compare(row, chunk_gated_delta_rule(**args), fla_chunk(**args))
    _ratios(row)
    if profile:
        row["ours_kernels_profiler_us"] = timing.kernel_times_us(lambda: chunk_gated_delta_rule(**args))
        if fla_chunk is not None:
            row["fla_kernels_profiler_us"] = timing.kernel_times_us(lambda: fla_chunk(**args))
    return row


def _state_row(spec, row: dict, args: dict) -> dict:
    """The state pass alone (graph replay): the rule's pick beside the previous default."""
    rule, prev = _state_cfgs(spec)
    srow = {k: row[k] for k in ("B", "T", "H", "HV", "D", "l2norm_in_kernel", "cu_seqlens") if k in row}
    srow["rule"] = rule
    srow.update(_state_alone(args, rule, "rule_"))
    if prev == rule:
        srow["previous"] = "same as the rule's pick"
        return srow
    srow["previous"] = prev
    srow.update(_state_alone(args, prev, "previous_"))
    if isinstance(srow.get("rule_graph_us"), float) and isinstance(srow.get("previous_graph_us"), float):
        srow["ratio_rule_over_previous"] = srow["rule_graph_us"] / srow["previous_graph_us"]
    return srow


def _chunk_rows(res: dict, specs, fla_chunk, smoke: bool, log) -> tuple:
    """The prefill rows (and, unless ``smoke``, the state pass alone at STATE_SHAPES) into ``res``;
    returns the args (and state rows) of the shapes that the extras use: ({spec: (args, state row)}
    for the state grid, {spec: args} for the chunk sweeps, the first of each value-head count)."""
    keep_grid, keep_sweep = {}, {}
    for spec in specs:
        B, T, H, HV, D, l2, seqs = spec
        args = _bench_args(spec)
        profile = not smoke and seqs is None and spec[:5] in PROFILE_SHAPES
        row = _chunk_row(spec, args, fla_chunk, profile)
        res["chunk"].append(row)
        log("chunk", row)
        if smoke:
            continue
        if spec[:5] in STATE_SHAPES:
            srow = _state_row(spec, row, args)
            res["state_alone"].append(srow)
            log("state alone", srow)
            if spec[:5] in STATE_GRID_SHAPES:
                keep_grid[spec] = (args, srow)
        if seqs is None and T <= 8192 and HV not in {s[3] for s in keep_sweep}:
            keep_sweep[spec] = args
    return keep_grid, keep_sweep


def _decode_row(dargs: dict, fla_rec) -> dict:
    """The decode step at DECODE_SHAPE: ours, ours in place, fla; state traffic over GPU time."""
    Bd, Hd, Dd = DECODE_SHAPE
    state_bytes = _decode_state_bytes()
    row = {"B": Bd, "T": 1, "H": Hd, "D": Dd, "dtype": "bfloat16", "state": "float32", "state_bytes": state_bytes}
    _put(row, "ours", timing.time_both(lambda: fused_recurrent_gated_delta_rule(**dargs)))
    h_inplace = dargs["initial_state"].clone()
    _put(row, "ours_inplace", timing.time_both(lambda: fused_recurrent_gated_delta_rule(
        **{**dargs, "initial_state": h_inplace}, inplace_final_state=True)))
    if fla_rec is not None:
        _put(row, "fla", timing.time_both(lambda: fla_rec(**dargs)))
        _compare(row, fused_recurrent_gated_delta_rule(**dargs), fla_rec(**dargs))
    for who in ("ours", "fla"):
        t = row.get(f"{who}_graph_us")
        if isinstance(t, float):
            row[f"{who}_graph_GBps"] = state_bytes / t / 1e3   # state traffic over GPU time
    _ratios(row)
    return row


def _state_grid(args: dict, srow: dict) -> list:
    """The state pass alone over STATE_GRID (num_warps 4); the rule's and the previous default's
    configurations reuse their figures from ``srow``."""
    def timed(prefix):
        return {k[len(prefix):]: v for k, v in srow.items() if k in (f"{prefix}graph_us", f"{prefix}graph_error")}

    done = {(srow["rule"]["BV"], srow["rule"]["num_stages"]): timed("rule_")}
    if isinstance(srow["previous"], dict):
        done[(srow["previous"]["BV"], srow["previous"]["num_stages"])] = timed("previous_")
    out = []
    for bv, ns in STATE_GRID:
        cfg = {"BV": bv, "num_warps": 4, "num_stages": ns}
        out.append({**cfg, **(done.get((bv, ns)) or _state_alone(args, cfg))})
    return out


def _decode_sweep(dargs: dict) -> list:
    """The decode step at each DECODE_SWEEP configuration: GPU time and state traffic."""
    sw = []
    for cfg in DECODE_SWEEP:
        t = _graph(lambda: fused_recurrent_gated_delta_rule(**dargs, config=cfg))
        gbps = _decode_state_bytes() / t["graph_us"] / 1e3 if "graph_us" in t else None
        sw.append({"config": cfg, **t, "graph_GBps": gbps})
    return sw


def _chunk_sweep(args: dict) -> list:
    """The prefill call at each CHUNK_SWEEP configuration: GPU time."""
    return [{"config": repr(cfg), **_graph(lambda: chunk_gated_delta_rule(**args, config=cfg))} for cfg in CHUNK_SWEEP]


def _extras(res: dict, keep_grid: dict, keep_sweep: dict, dargs: dict, budget_s: float, fla_chunk, fla_rec,
            log) -> None:
    """The extras, each only while the budget left covers its cost on a cold machine (the state grid
    was compiled in the warm-up when budget_s >= 10); what does not fit goes to ``skipped``."""
    t_extra = time.time()
    grid = budget_s >= 10

    def afford(cost_s: float, what: str) -> bool:
        if budget_s - (time.time() - t_extra) >= cost_s:
            return True
        res["skipped"].append(f"{what} (budget)")
        return False

    for spec, (args, srow) in keep_grid.items():
        if afford(5 if grid else 60, "state grid %dx%dx%dx%dx%d" % spec[:5]):
            srow["grid"] = _state_grid(args, srow)
            log("state grid", spec, srow["grid"])
    if fla_chunk is not None and afford(60, "crosscheck on small odd shapes"):
        res["crosscheck"] = _crosscheck_fla(fla_chunk, fla_rec)
        log("crosscheck", res["crosscheck"])
    if afford(20, "decode sweep"):
        res["sweeps"]["decode"] = _decode_sweep(dargs)
        log("sweep decode", res["sweeps"]["decode"])
    for spec, args in keep_sweep.items():
        if afford(60, "chunk sweep %dx%dx%dx%dx%d" % spec[:5]):
            sw = res["sweeps"]["chunk_%dx%dx%dx%dx%d" % spec[:5]] = _chunk_sweep(args)
            log("sweep", spec, sw)


def _crosscheck_fla(fla_chunk, fla_rec, left=lambda: 1.0):
    rows = []
    cases = [  # (B, T, H, HV, K, V, dtype, cu_seqlens, l2)
        (2, 1000, 4, 8, 128, 128, torch.float32, None, True),
        (1, 777, 2, 2, 100, 72, torch.float32, [0, 1, 200, 513, 777], False),
        (3, 129, 2, 4, 128, 128, torch.bfloat16, None, True),
    ]
    for B, T, H, HV, K, V, dt, cu, l2 in cases:
        if left() <= 0:
            rows.append({"B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "skipped": "budget"})
            continue
        x = make_inputs(B, T, H, K, V=V, HV=HV, dtype=dt, gate="mixed", normalize_qk=not l2, seed=T)
        N = B if cu is None else len(cu) - 1
        x["initial_state"] = torch.randn(N, HV, K, V, device=DEVICE) * 0.3
        cus = None if cu is None else torch.tensor(cu, device=DEVICE)
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=l2, cu_seqlens=cus)
        ref_o, ref_h = naive_recurrent_gated_delta_rule(**x, **kw) if T * B <= 1000 else (None, None)
        for name, ours, peer in (("chunk", chunk_gated_delta_rule, fla_chunk),
                                 ("recurrent", fused_recurrent_gated_delta_rule, fla_rec)):
            o, h = ours(**x, **kw)
            try:
                fo, fh = peer(**x, **kw)
            except Exception as e:  # noqa: BLE001
                rows.append({"fn": name, "B": B, "T": T, "fla_failed": f"{type(e).__name__}: {e}"[:200]})
                continue
            row = {"fn": name, "B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "dtype": str(dt)[6:],
                   "cu_seqlens": cu, "l2norm": l2, "o_vs_fla": rel_err(o.float(), fo.float()),
                   "ht_vs_fla": rel_err(h.float(), fh.float())}
            if ref_o is not None:
                row["o_vs_fp32_ref"] = rel_err(o.float(), ref_o)
                row["fla_o_vs_fp32_ref"] = rel_err(fo.float(), ref_o)
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# The contract: run() and table()
# --------------------------------------------------------------------------------------------------

def run(*, budget_s: float | None = None, smoke: bool = False) -> Measurement:
    """Measure on this GPU (module docstring): the warm-up, the record's rows (chunk, state pass alone,
    decode), then the extras for ``budget_s`` seconds (default 60). ``smoke=True``: the first chunk
    shape and the decode call only (what notebook 05 times live)."""
    timing.require_gpu("workbook.benchmarks.gdn.run")
    budget_s = 60.0 if budget_s is None else budget_s
    log = (lambda *a: None) if smoke else (lambda *a: print(*a, flush=True))
    t_start = time.time()
    fla_chunk, fla_rec, fla_ver = _fla()
    res = {"fla_version": fla_ver, "config": repr(CONFIG),
           "notes": {"state_rule": STATE_RULE, "state_previous": STATE_PREVIOUS},
           "chunk": [], "state_alone": [], "decode": [], "sweeps": {}, "skipped": []}
    if smoke:
        res["smoke"] = True
    if fla_chunk is None:
        res["skipped"].append(f"every comparison with flash-linear-attention: {fla_ver}")
    if not smoke:
        _warm_up(res, _warm_tasks(fla_chunk is not None, grid=budget_s >= 10), log)
    ceil = timing.copy_ceiling_GBps()
    keep_grid, keep_sweep = _chunk_rows(res, _SPECS[:1] if smoke else _SPECS, fla_chunk, smoke, log)
    dargs = _bench_args("decode")
    res["decode"].append(_decode_row(dargs, fla_rec))
    log("decode", res["decode"][-1])
    res["record_s"] = time.time() - t_start
    if not smoke:
        _extras(res, keep_grid, keep_sweep, dargs, budget_s, fla_chunk, fla_rec, log)
    keep_grid.clear()
    keep_sweep.clear()
    res["elapsed_s"] = time.time() - t_start
    timers = {k: v for k, v in TIMERS.items() if not (smoke and k == "profiler")}
    return Measurement(results=res, timers=timers, ceilings={"copy_GBps": ceil})


def _fmt_us(t) -> str:
    return f"{t:8.1f} us" if isinstance(t, (int, float)) else "     n/a   "


def _short(c: dict) -> str:
    return f"BV{c['BV']} ns{c['num_stages']} nw{c['num_warps']}"


def _results(rec) -> dict:
    if isinstance(rec, Measurement):
        return rec.results
    return rec["results"] if "results" in rec else rec


def has_timing_methods(rec) -> bool:
    """Whether a gdn record holds both timings (graph replay and eager) per call (a capture that
    failed is recorded as <who>_graph_error and counts). Records written before the benchmark timed
    graph replay held one eager figure per call, labelled nothing."""
    r = _results(rec)
    return bool(r.get("chunk")) and any(k.startswith("ours_graph_") for k in r["chunk"][0])


def _chunk_lines(row: dict) -> list:
    kind = f"varlen N={len(row['cu_seqlens']) - 1}" if row.get("cu_seqlens") else f"chunk  B={row['B']}"
    line = (f"{kind} T={row['T']:5d} H={row['H']}/{row.get('HV', row['H'])} D={row['D']} l2norm_in_kernel="
            f"{row['l2norm_in_kernel']!s:5}: ours graph {_fmt_us(row.get('ours_graph_us'))}, eager "
            f"{_fmt_us(row.get('ours_eager_us'))} | fla graph {_fmt_us(row.get('fla_graph_us'))}, eager "
            f"{_fmt_us(row.get('fla_eager_us'))}")
    if "ratio_ours_over_fla_graph" in row:
        line += f" | ours/fla on GPU time {row['ratio_ours_over_fla_graph']:.2f}x"
    if "ratio_ours_over_fla_eager" in row:
        line += f", eager {row['ratio_ours_over_fla_eager']:.2f}x"
    if "rel_err_vs_fla_o" in row:
        line += f" | vs fla: o {row['rel_err_vs_fla_o']:.1e}, final state {row['rel_err_vs_fla_ht']:.1e} (rel. err.)"
    lines = [line]
    for who in ("ours", "fla"):
        ks = row.get(f"{who}_kernels_profiler_us")
        if ks is not None:
            parts = ", ".join(f"{name.split('(')[0].replace('void ', '')[:48]} {t:.1f}" for name, t in ks.items())
            lines.append(f"    {who} kernels, GPU time per call in us (torch.profiler): {parts} | sum {sum(ks.values()):.1f}")
    return lines


def _state_lines(row: dict) -> list:
    kind = f"varlen N={len(row['cu_seqlens']) - 1}" if row.get("cu_seqlens") else f"B={row['B']}"
    line = (f"state pass alone, GPU time (graph replay), {kind} T={row['T']} H={row['H']}/{row['HV']}: "
            f"launch rule {_short(row['rule'])} {_fmt_us(row.get('rule_graph_us'))}")
    if isinstance(row.get("previous"), dict):
        line += f" | previous default {_short(row['previous'])} {_fmt_us(row.get('previous_graph_us'))}"
        if "ratio_rule_over_previous" in row:
            line += f" | rule/previous {row['ratio_rule_over_previous']:.2f}x"
    else:
        line += " | previous default: the same configuration"
    lines = [line]
    if row.get("grid"):
        lines.append("    BV x num_stages (num_warps 4): " + ", ".join(
            f"BV{c['BV']} ns{c['num_stages']} {_fmt_us(c.get('graph_us')).strip()}" for c in row["grid"]))
    return lines


def _decode_line(row: dict, copy) -> str:
    line = (f"decode B={row['B']} H={row['H']} D={row['D']} (fp32 state): ours graph "
            f"{_fmt_us(row.get('ours_graph_us'))}, eager {_fmt_us(row.get('ours_eager_us'))}")
    if isinstance(row.get("ours_graph_GBps"), float):
        line += f" ({row['ours_graph_GBps']:.0f} GB/s of state traffic"
        line += f" = {row['ours_graph_GBps'] / copy:.0%} of the {copy:.0f} GB/s copy ceiling)" if copy else ")"
    line += (f", in place graph {_fmt_us(row.get('ours_inplace_graph_us'))} | fla graph "
             f"{_fmt_us(row.get('fla_graph_us'))}, eager {_fmt_us(row.get('fla_eager_us'))}")
    if "ratio_ours_over_fla_graph" in row:
        line += f" | ours/fla on GPU time {row['ratio_ours_over_fla_graph']:.2f}x"
    if "rel_err_vs_fla_o" in row:
        line += f" | vs fla: o {row['rel_err_vs_fla_o']:.1e}, final state {row['rel_err_vs_fla_ht']:.1e}"
    return line


def table(rec) -> str:
    """The rows of a record (or of :func:`run`'s Measurement) as text, each time labelled with its
    timer: GPU time from CUDA-graph replay first, eager per-call time beside it. A record without
    graph-replay times says so instead of showing numbers whose timer is not recorded."""
    r = _results(rec)
    if not has_timing_methods(rec):
        return ("GPU time from CUDA-graph replay: not recorded yet (this record predates it; its single "
                "eager per-call figures are not shown, since claims are made on GPU time). "
                "Re-record with `python3 -m workbook bench gdn` on the GPU.")
    ceilings = rec.ceilings if isinstance(rec, Measurement) else rec.get("ceilings", {})
    copy = (ceilings or {}).get("copy_GBps")
    lines = ["times per call; 'graph' = GPU time from CUDA-graph replay, 'eager' = eager per-call time "
             "(Python + launches included)"]
    for row in r["chunk"]:
        lines += _chunk_lines(row)
    for row in r.get("state_alone", []):
        lines += _state_lines(row)
    lines += [_decode_line(row, copy) for row in r["decode"]]
    for row in r.get("crosscheck", []):
        if "o_vs_fla" in row:
            lines.append(f"cross-check {row['fn']:9} B={row['B']} T={row['T']} H={row['H']}/{row['HV']} K={row['K']} "
                         f"V={row['V']} {row['dtype']} varlen={row['cu_seqlens'] is not None}: vs fla o "
                         f"{row['o_vs_fla']:.1e}, final state {row['ht_vs_fla']:.1e}")
    if r.get("skipped"):
        lines.append("not measured in this record (budget or missing peer): " + "; ".join(r["skipped"]))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Segments (issue #33): the chunked prefill parallel over the sequence, timed alone
# --------------------------------------------------------------------------------------------------

# (B, T, key heads H, value heads HV): the shapes of FlashInfer's sequence-parallel PRs (SPECS section 7),
# K = V = SEGMENT_D, bf16, mixed gates, initial state in, final state out, no in-kernel L2 norm
SEGMENT_SHAPES = [(2, 4096, 16, 64), (1, 8192, 16, 64), (1, 65536, 16, 64), (1, 65536, 2, 8), (1, 8192, 2, 8)]
SEGMENT_D = 128
SEGMENT_SWEEP = (4, 8, 16, 32)   # chunks of 64 tokens per segment


def segment_cost(B: int, T: int, H: int, HV: int, K: int, V: int, seg: int | None = None, itemsize: int = 2) -> dict:
    """Model FLOPs and bytes of one prefill call (C = 64 tokens per chunk, NC = B x HV x ceil(T / C) chunk-heads).

    ``flops``: the plain chunked path's products per chunk and value head: K K^T, w, Q K^T (2 C^2 K each),
    u and the in-chunk output (2 C^2 V each), v' = u - w h, the state update and Q h (2 C K V each), and
    the triangular solve (C^3 / 3 multiply-adds); total NC (6 C^2 K + 4 C^2 V + 6 C K V + 2 C^3 / 3).
    With ``seg`` (chunks per segment) also ``seg_flops``: the [B | M] pass (solve, w, u and the state update
    with V + K value columns, no outputs), the scan (2 K^2 V per segment and head) and the last pass
    (= the plain path). ``bytes``: what the call must move at least: q, k, v, beta read (``itemsize``
    bytes), g read (fp32), o written, the initial state read and the final state written (fp32);
    intermediates excluded."""
    C = CHUNK
    nc = B * HV * triton.cdiv(T, C)
    per = lambda v: 6 * C * C * K + 4 * C * C * v + 6 * C * K * v + 2 * C ** 3 / 3   # noqa: E731
    out = {"flops": nc * per(V),
           "bytes": B * T * (2 * H * K + 2 * HV * V + HV) * itemsize + B * T * HV * 4 + 2 * B * HV * K * V * 4}
    if seg is not None:
        ns = B * triton.cdiv(T, seg * C)
        pass1 = nc * (4 * C * C * K + 2 * C * C * (V + K) + 4 * C * K * (V + K) + 2 * C ** 3 / 3)
        out["seg_flops"] = pass1 + ns * HV * 2 * K * K * V + out["flops"]
    return out


def _time_into(row: dict, who: str, fn) -> None:
    """:func:`_put` of ``timing.time_both(fn)``, or ``<who>_error`` when the call fails (one failed call,
    e.g. out of memory, never costs the record)."""
    try:
        _put(row, who, timing.time_both(fn))
    except Exception as e:  # noqa: BLE001
        row[f"{who}_error"] = f"{type(e).__name__}: {e}"[:300]


def _segment_row(shape, fla_chunk, sweep, log) -> dict:
    """One shape: the plain call, the segmented call at each length of ``sweep`` and fla's, each timed
    both ways (graph replay and eager), the segmented outputs and final states checked against the plain ones."""
    B, T, H, HV = shape
    D = SEGMENT_D
    args = _bench_args((B, T, H, HV, D, False, None))
    row = {"B": B, "T": T, "H": H, "HV": HV, "K": D, "V": D, "dtype": "bfloat16", **segment_cost(B, T, H, HV, D, D)}
    _time_into(row, "plain", lambda: chunk_gated_delta_rule(**args, segments=None))
    plain = chunk_gated_delta_rule(**args, segments=None)
    for seg in sweep:
        who = f"seg{seg}"
        try:
            ours = chunk_gated_delta_rule(**args, segments=seg)
        except Exception as e:  # noqa: BLE001  (one failed length never costs the record)
            row[f"{who}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        row[f"{who}_rel_err_vs_plain_o"] = rel_err(ours[0].float(), plain[0].float())
        row[f"{who}_rel_err_vs_plain_ht"] = rel_err(ours[1].float(), plain[1].float())
        row[f"{who}_segments_per_sequence"] = triton.cdiv(T, seg * CHUNK)
        row[f"{who}_flops"] = segment_cost(B, T, H, HV, D, D, seg)["seg_flops"]
        del ours
        _time_into(row, who, lambda: chunk_gated_delta_rule(**args, segments=seg))
    if fla_chunk is not None:
        _time_into(row, "fla", lambda: fla_chunk(**args))
        if "fla_error" not in row:
            row["fla_rel_err_vs_plain_o"] = rel_err(fla_chunk(**args)[0].float(), plain[0].float())
    for who in ["plain", "fla"] + [f"seg{s}" for s in sweep]:
        t = row.get(f"{who}_graph_us")
        if isinstance(t, float):
            row[f"{who}_model_TFLOPs"] = row["flops"] / t / 1e6      # the plain path's FLOPs over GPU time
            if who != "plain" and isinstance(row.get("plain_graph_us"), float):
                row[f"ratio_{who}_over_plain_graph"] = t / row["plain_graph_us"]
    log("segments", row)
    return row


# the gdn_segments record's tables other runs add, which measure_segments keeps (records.carry_over)
SEGMENTS_KEPT = ("previous_design", "fusion", "fuse_o_launch_sweep", "ncu_profile", "fused_prototype",
                 "transposed_state", "from_a", "from_a_segments")


def measure_segments(*, shapes=None, sweep=SEGMENT_SWEEP, save: bool = False, verbose: bool = True) -> dict:
    """Plain vs segmented (``segments=`` each of ``sweep``) vs fla (when importable) at SEGMENT_SHAPES (or
    ``shapes``), K = V = 128, bf16: GPU time from CUDA-graph replay with eager time beside it, the model FLOPs
    and bytes of each shape (:func:`segment_cost`), the segmented results checked against the plain ones.
    Prints one table line per shape as it goes (``verbose``) and returns the record (a dict in the one schema,
    name ``gdn_segments``, validated); ``save=True`` also writes it to ``workbook/data/gdn_segments.json``,
    after every shape.
    The launch rule :func:`workbook.gdn.segment_rule` is set from what this measures."""
    timing.require_gpu("workbook.benchmarks.gdn.measure_segments")
    log = (lambda *a: print(*a, flush=True)) if verbose else (lambda *a: None)
    t0 = time.time()
    fla_chunk, _, fla_ver = _fla()
    res = {"fla_version": fla_ver, "sweep_chunks_per_segment": list(sweep), "config": repr(CONFIG["chunk"]),
           "segments": [], "skipped": [] if fla_chunk else [f"every comparison with flash-linear-attention: {fla_ver}"]}
    try:   # the record's other tables (the previous design, the fused forms, the profile) stay beside the new rows
        old = load_record("gdn_segments")
    except FileNotFoundError:
        old = None
    res.update(carry_over(old, SEGMENTS_KEPT, describe().get("gpu"))[0])
    timers, path = {k: TIMERS[k] for k in ("graph", "eager", "profiler")}, None
    for shape in shapes or SEGMENT_SHAPES:
        row = _segment_row(tuple(shape), fla_chunk, sweep, lambda *a: None)
        res["segments"].append(row)
        log(_segment_line(row, sweep))
        torch.cuda.empty_cache()
        res["elapsed_s"] = time.time() - t0
        if save:   # after every shape: a run cut short keeps the shapes it measured
            path = save_record("gdn_segments", Measurement(results=res, timers=timers))
    if save:
        log("written:", path)
    return as_record("gdn_segments", Measurement(results=res, timers=timers))


def _segment_line(row: dict, sweep) -> str:
    if "not_measured" in row:
        return (f"B={row['B']} T={row['T']} H={row['H']}/{row['HV']} D={row['K']}: not measured "
                f"({row['not_measured']}) | {row['flops'] / 1e9:.1f} GFLOP, {row['bytes'] / 1e6:.1f} MB")
    line = (f"B={row['B']} T={row['T']} H={row['H']}/{row['HV']} D={row['K']}: plain graph "
            f"{_fmt_us(row.get('plain_graph_us'))} eager {_fmt_us(row.get('plain_eager_us'))}")
    for s in sweep:
        if f"seg{s}_graph_us" in row or f"seg{s}_eager_us" in row:
            r = row.get(f"ratio_seg{s}_over_plain_graph")
            line += (f" | seg{s} graph {_fmt_us(row.get(f'seg{s}_graph_us'))}"
                     + (f" ({r:.2f}x plain)" if isinstance(r, float) else ""))
        elif f"seg{s}_error" in row:
            line += f" | seg{s} failed"
    if "plain_error" in row:
        line += " (plain failed)"
    line += f" | fla graph {_fmt_us(row.get('fla_graph_us'))} eager {_fmt_us(row.get('fla_eager_us'))}"
    return line + f" | {row['flops'] / 1e9:.1f} GFLOP, {row['bytes'] / 1e6:.1f} MB"


def segments_table(rec) -> str:
    """The rows of a :func:`measure_segments` record as text (GPU time from graph replay, eager beside it)."""
    r = _results(rec)
    sweep = r.get("sweep_chunks_per_segment", SEGMENT_SWEEP)
    return "\n".join(["times per call; 'graph' = GPU time from CUDA-graph replay, 'eager' = eager per-call time"]
                     + [_segment_line(row, sweep) for row in r["segments"]])


def profile_segments(*, seg: int = 32, save: bool = False) -> dict:
    """Where the time goes, per kernel: each device kernel's own GPU time per call (torch.profiler over 5
    eager calls, :func:`workbook.timing.kernel_times_us`) of the plain path and of ``segments=seg`` at every
    shape of the ``gdn_segments`` record, added to its rows as ``plain_kernels_profiler_us`` and
    ``seg<seg>_kernels_profiler_us`` (the record gains the ``profiler`` timer). Returns the record;
    ``save=True`` writes it back."""
    timing.require_gpu("workbook.benchmarks.gdn.profile_segments")
    rec = load_record("gdn_segments")
    res = rec["results"]
    for row in res["segments"]:
        args = _bench_args((row["B"], row["T"], row["H"], row["HV"], row["K"], False, None))
        for who, kw in (("plain", {"segments": None}), (f"seg{seg}", {"segments": seg})):
            try:
                row[f"{who}_kernels_profiler_us"] = timing.kernel_times_us(lambda: chunk_gated_delta_rule(**args, **kw))
            except Exception as e:  # noqa: BLE001  (one failed shape never costs the record)
                row[f"{who}_kernels_error"] = f"{type(e).__name__}: {e}"[:300]
        del args
        torch.cuda.empty_cache()
    res["profiled_segment_length"] = seg
    m = Measurement(results=res, timers={k: TIMERS[k] for k in ("graph", "eager", "profiler")},
                    ceilings=rec.get("ceilings", {}))
    if save:
        save_record("gdn_segments", m)
    return load_record("gdn_segments") if save else rec


# --------------------------------------------------------------------------------------------------
# Fused forms of the chunked path (issue #33 item 2): which round trips of the intermediates pay
# --------------------------------------------------------------------------------------------------
# Forms, each a launch configuration of chunk_gated_delta_rule: "split" the four kernels (A, w, u, h and v'
# through memory), "fuse_wu" w and u from A in kernel 1's registers (A never stored), "fuse_o" the outputs in
# the state pass (h and v' never stored), both, and fuse_wu with four value heads per solve program (GQA:
# one K K^T shared). The solve on 8 warps and with BC 32 were tried in an exploratory run (2026-12-01, H200), both
# slower at every shape, and are not timed here.
FUSION_FORMS = {
    "split": {"solve": {"FUSE_WU": False}, "state": {"FUSE_O": False, "FROM_A": False}},
    "fuse_wu": {"solve": {"FUSE_WU": True}, "state": {"FUSE_O": False, "FROM_A": False}},
    "fuse_wu_gv4": {"solve": {"FUSE_WU": True, "GV": 4}, "state": {"FUSE_O": False, "FROM_A": False}},
    "fuse_o": {"solve": {"FUSE_WU": False}, "state": {"FUSE_O": True, "FROM_A": False}},
    "fuse_wu_o": {"solve": {"FUSE_WU": True}, "state": {"FUSE_O": True, "FROM_A": False}},
    "from_a": {"state": {"FUSE_O": False, "FROM_A": True}},      # w, u formed in the state pass from A
    "from_a_o": {"state": {"FUSE_O": True, "FROM_A": True}},     # and the outputs there too
}
FUSION_SHAPES = SEGMENT_SHAPES + [(1, 8192, 16, 16), (4, 4096, 32, 32)]
FUSION_PROFILED = {(2, 4096, 16, 64), (1, 65536, 2, 8)}   # per-kernel times recorded for these


def _floor_us(row: dict, ceilings: dict) -> float | None:
    """The physical floor of a shape's call: its model FLOPs at the measured bf16 matrix rate or its minimum
    bytes at the measured copy bandwidth, whichever takes longer (None without both ceilings)."""
    tf, bw = ceilings.get("bf16_matmul_TFLOPs"), ceilings.get("copy_GBps")
    return max(row["flops"] / (tf * 1e6), row["bytes"] / (bw * 1e3)) if tf and bw else None


def _fusion_row(shape, fla_chunk, ceilings: dict) -> dict:
    """One shape: every form of FUSION_FORMS timed both ways, its output checked against the split form's,
    fla beside them; per-kernel times of three forms at FUSION_PROFILED shapes; the floor and its share."""
    B, T, H, HV = shape
    args = _bench_args((B, T, H, HV, SEGMENT_D, False, None))
    row = {"B": B, "T": T, "H": H, "HV": HV, "K": SEGMENT_D, "V": SEGMENT_D, "dtype": "bfloat16",
           **segment_cost(B, T, H, HV, SEGMENT_D, SEGMENT_D)}
    row["floor_microseconds"] = _floor_us(row, ceilings)
    split = chunk_gated_delta_rule(**args, config=FUSION_FORMS["split"], segments=None)[0].float()
    for who, cfg in FUSION_FORMS.items():
        try:
            o = chunk_gated_delta_rule(**args, config=cfg, segments=None)[0].float()   # the plain path's forms
            row[f"{who}_rel_err_vs_split_o"] = rel_err(o, split)
        except Exception as e:  # noqa: BLE001  (one failed form never costs the record)
            row[f"{who}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        _time_into(row, who, lambda: chunk_gated_delta_rule(**args, config=cfg, segments=None))
        if tuple(shape) in FUSION_PROFILED and who in ("split", "fuse_wu", "fuse_wu_o", "from_a_o"):
            row[f"{who}_kernels_profiler_us"] = timing.kernel_times_us(
                lambda: chunk_gated_delta_rule(**args, config=cfg, segments=None))
    if fla_chunk is not None:
        _time_into(row, "fla", lambda: fla_chunk(**args))
    best = min(FUSION_FORMS, key=lambda w: row.get(f"{w}_graph_us", float("inf")))
    row["fastest_form"] = best
    if row["floor_microseconds"] and isinstance(row.get(f"{best}_graph_us"), float):
        row["fastest_share_of_floor"] = row["floor_microseconds"] / row[f"{best}_graph_us"]
    for who in list(FUSION_FORMS) + ["fla"]:
        if isinstance(row.get(f"{who}_graph_us"), float) and who != "split":
            row[f"ratio_{who}_over_split_graph"] = row[f"{who}_graph_us"] / row["split_graph_us"]
    return row


def measure_fusion(*, shapes=None, save: bool = False, verbose: bool = True) -> dict:
    """The fused forms (FUSION_FORMS) at FUSION_SHAPES (or ``shapes``), K = V = 128, bf16, fla in the same run:
    GPU time from CUDA-graph replay with eager time beside it. Added to the ``gdn_segments`` record as its
    ``fusion`` table (``save=True`` writes it after every shape); returns the table. The FUSE_WU default and
    :func:`workbook.gdn.fuse_o_rule` are set from it (tests/test_gdn.py ties both to the recorded table)."""
    timing.require_gpu("workbook.benchmarks.gdn.measure_fusion")
    fla_chunk, _, fla_ver = _fla()
    ceilings = {"copy_GBps": timing.copy_ceiling_GBps(), "bf16_matmul_TFLOPs": timing.matmul_ceiling_TFLOPs()}
    table_ = {"what": "each form of benchmarks.gdn.FUSION_FORMS as a launch configuration of chunk_gated_delta_rule "
                      "(the rest of CONFIG['chunk'] as in force), fla in the same run",
              "forms": {k: repr(v) for k, v in FUSION_FORMS.items()}, "fla_version": fla_ver, "rows": []}
    for shape in shapes or FUSION_SHAPES:
        row = _fusion_row(tuple(shape), fla_chunk, ceilings)
        table_["rows"].append(row)
        if verbose:
            print(_fusion_line(row), flush=True)
        torch.cuda.empty_cache()
        if save:
            _save_fusion(table_, ceilings)
    return table_


def _save_fusion(table_: dict, ceilings: dict, directory=None):
    """``table_`` as the ``gdn_segments`` record's ``fusion`` table, the record's other tables kept where this GPU
    may carry them (:func:`workbook.records.carry_over`: all on the record's GPU model, else those naming their own
    machine). Returns the path written."""
    rec = load_record("gdn_segments", directory)
    kept, timers = carry_over(rec, set(rec["results"]) - {"fusion"}, describe().get("gpu"))
    timers = {**timers, **{k: TIMERS[k] for k in ("graph", "eager", "profiler")}}
    return save_record("gdn_segments", Measurement(results={**kept, "fusion": table_}, timers=timers, ceilings={
        **(rec.get("ceilings", {}) if kept else {}), **ceilings}), directory)


def _fusion_line(row: dict) -> str:
    forms = " | ".join(f"{w} {_fmt_us(row.get(f'{w}_graph_us'))}" for w in list(FUSION_FORMS) + ["fla"])
    share = row.get("fastest_share_of_floor")
    floor = f" ({100 * share:.0f}% of the floor, {row['floor_microseconds']:.1f} us)" if share else ""
    return f"B={row['B']} T={row['T']} H={row['H']}/{row['HV']}: graph us: {forms} | fastest {row['fastest_form']}{floor}"


def fusion_table(rec, table: str = "fusion") -> str:
    """A table of :func:`measure_fusion`'s (``fusion``, or ``table``) in a ``gdn_segments`` record as text (GPU time
    from graph replay, us per call); forms a row was not timed with print n/a."""
    f = _results(rec).get(table)
    if not f:
        return f"fused forms ({table}): not recorded yet (workbook.benchmarks.gdn.measure_fusion records them)"
    return "\n".join([f"fused forms, GPU time per call from CUDA-graph replay (fla {f['fla_version']} in the same run)"]
                     + [_fusion_line(row) for row in f["rows"]])
