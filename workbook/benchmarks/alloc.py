"""Notebook 01's measurements: what ``torch.zeros`` costs against ``torch.empty`` on this GPU.

``run()`` (``python3 -m workbook bench alloc``) records ``workbook/data/alloc.json``::

    results = {"sweep":        [row per size of SWEEP_SIZES],       # zeros_vs_empty_sweep
               "graph":        {...},                                # graph_decode_step
               "profile":      {"zeros": [...], "empty": [...]},     # profile_zeros_vs_empty
               "fill_kernels": {dtype: kernel name},                 # fill_kernel_names
               "stale_bytes":  {...},                                # workbook.alloc.stale_bytes_demo
               "fill_events":  {...},                                # fill_bandwidth_events
               "notes":        {...}}                                # what the non-time figures mean

A sweep row holds ``bytes``; ``zeros_eager_us``, ``empty_eager_us`` (each alone),
``zeros_overwrite_eager_us``, ``empty_overwrite_eager_us`` (each followed by a full ``copy_``),
``fill_eager_us`` (``zero_()`` on an existing float32 buffer), ``fill_eager_GBps`` and
``overwrite_eager_ratio`` (eager timer); ``zeros_overwrite_graph_us``, ``empty_overwrite_graph_us``
and ``overwrite_graph_ratio`` (graph replay); and ``fill_by_dtype = {dtype: {eager_us, eager_GBps,
graph_us, graph_GBps}}`` for each of :data:`workbook.alloc.FILL_DTYPES`. Which timer took which
figure, in detail: :data:`TIMERS` (copied into the record's ``timers``).

``smoke=True`` times what notebook 01 times live on a GPU: every third size of the sweep (4 KiB,
256 KiB, 16 MiB, 1 GiB), the decode-like graph and the copy ceiling. ``budget_s`` is ignored: the
full run (a few minutes on an H200) has no rows worth trading for time.

The record's readers are here too: :func:`table` (the sweep), :func:`fill_sweep` (one dtype's fill
rows, what exercise 1.2 reads) and :func:`fill_rate_table`. Pictures: :mod:`workbook.plots.alloc`.
"""
from __future__ import annotations

import warnings

import torch

from ..alloc import FILL_DTYPES, stale_bytes_demo
from ..device import DEVICE, ON_GPU
from ..records import Measurement, NotRecorded, format_table, human_bytes, recorded_label
from ..timing import (copy_ceiling_GBps, fixed_time_us, graph_time_us, quiet_kineto, require_gpu,
                      time_us)

__all__ = [
    "SWEEP_SIZES", "SMOKE_SIZES", "TIMERS", "NOTES", "run", "table", "fill_sweep",
    "fill_rate_table", "zeros_vs_empty_sweep", "graph_decode_step", "profile_zeros_vs_empty",
    "fill_kernel_names", "fill_bandwidth_events",
]

SWEEP_SIZES = [4 << 10 << (2 * i) for i in range(10)]  # 4 KiB, 16 KiB, ..., 1 GiB
SMOKE_SIZES = SWEEP_SIZES[::3]                         # 4 KiB, 256 KiB, 16 MiB, 1 GiB: the notebook's live set

# The timers of the alloc record, and which figure each one took (the record's "timers").
TIMERS = {
    "eager": "triton.testing.do_bench median of one eager call (workbook.timing.time_us: CUDA events, L2 "
             "flushed between calls, so host, allocator and launch work count). Sweep: zeros_eager_us = "
             "torch.zeros(n) alone (host + allocator + launch + fill), empty_eager_us = torch.empty(n) alone "
             "(host + allocator only), zeros/empty_overwrite_eager_us = torch.zeros/empty(n).copy_(src), "
             "fill_eager_us = buf.zero_() on an existing float32 buffer, fill_by_dtype eager_us = zero_() on "
             "the same bytes viewed as each dtype; ceilings.copy_GBps = dst.copy_(src), 1 GiB float32",
    "graph": "GPU time per call from CUDA-graph replay (workbook.timing.graph_time_us: do_bench median of "
             "g.replay() / calls in the graph). Sweep: zeros/empty_overwrite_graph_us = "
             "torch.zeros/empty(n).copy_(src), 20 calls per graph up to 16 MiB, 3 above; fill_by_dtype "
             "graph_us = zero_() per dtype, 20 calls per graph up to 16 MiB, 5 above; graph.zeros/empty_graph_us "
             "= one replay of the decode-like step (a graph of one step)",
    "events": "CUDA events around 20 back-to-back zero_() calls on one 1 GiB float32 buffer after 3 warm-up "
              "calls, per call, no L2 flush (the buffer dwarfs the L2; workbook.timing.fixed_time_us): "
              "fill_events.fill_events_us",
    "profiler": "torch.profiler (CUPTI kernel activity) over one eager call of each: each device kernel's own "
                "time (profile.zeros/empty[].profiler_us)",
}

# What the figures without a timer mean (the record's results["notes"]).
NOTES = {
    "bandwidth": "*_GBps: bytes written / time for a fill (a fill only writes); ceilings.copy_GBps counts "
                 "bytes read + bytes written of a device-to-device copy",
    "ratios": "overwrite_<timer>_ratio = zeros_overwrite_<timer>_us / empty_overwrite_<timer>_us; "
              "graph.ratio = zeros_graph_us / empty_graph_us",
    "graph": "the decode-like step: n_buffers outputs of buffer_bytes each, allocated with zeros or empty "
             "and written once by copy_, captured in one CUDA graph",
    "fill_kernels": "the device kernel zero_() launches per dtype, as the profiler names it (PyTorch's "
                    "FillFunctor elementwise kernel; its first template argument is the vector width)",
    "stale_bytes": "workbook.alloc.stale_bytes_demo on the GPU: a step that forgets its last element, "
                   "captured in a CUDA graph and replayed twice",
}


def run(*, budget_s: float | None = None, smoke: bool = False) -> Measurement:
    """Everything notebook 01 shows, measured on this GPU (``smoke``: what it times live)."""
    require_gpu("workbook.benchmarks.alloc.run")
    ceiling = copy_ceiling_GBps()
    if smoke:
        results = {"sweep": zeros_vs_empty_sweep(SMOKE_SIZES), "graph": graph_decode_step()}
        timers = {k: TIMERS[k] for k in ("eager", "graph")}
    else:
        results = {
            "sweep": zeros_vs_empty_sweep(),
            "graph": graph_decode_step(),
            "profile": profile_zeros_vs_empty(),
            "fill_kernels": fill_kernel_names(),
            "stale_bytes": stale_bytes_demo(),
            "fill_events": fill_bandwidth_events(),
        }
        timers = dict(TIMERS)
    results["notes"] = dict(NOTES)
    return Measurement(results, timers, {"copy_GBps": ceiling})


# --------------------------------------------------------------------------------------------------
# Readers of the record
# --------------------------------------------------------------------------------------------------

def table(rec: dict) -> str:
    """The sweep: zeros and empty alone and followed by a full overwrite, eager and graph replay."""
    columns = [("size", lambda r: human_bytes(r["bytes"]), "s"),
               ("zeros", "zeros_eager_us", ".1f"), ("empty", "empty_eager_us", ".1f"),
               ("zeros+ow", "zeros_overwrite_eager_us", ".1f"), ("empty+ow", "empty_overwrite_eager_us", ".1f"),
               ("ratio", "overwrite_eager_ratio", ".2f"),
               ("graph z+ow", "zeros_overwrite_graph_us", ".1f"), ("graph e+ow", "empty_overwrite_graph_us", ".1f"),
               ("ratio", "overwrite_graph_ratio", ".2f")]
    return (format_table(rec["results"]["sweep"], columns)
            + "\ntimes in us; first five columns: eager (do_bench median); graph columns: graph replay "
              "(GPU time per call)")


def _dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in FILL_DTYPES:
        raise ValueError(f"dtype must be one of {FILL_DTYPES} (or the torch dtype), got {dtype!r}")
    return name


def fill_sweep(rec: dict, dtype="float32") -> list[dict]:
    """The fill kernel's time per size for one dtype: ``[{"bytes", "eager_us", "eager_GBps", "graph_us",
    "graph_GBps"}, ...]`` (``zero_()`` on the same bytes viewed as ``dtype``; the timers: the record's
    ``timers``). A record whose sweep lacks ``dtype`` raises :class:`workbook.records.NotRecorded`."""
    name = _dtype_name(dtype)
    rows = []
    for r in rec["results"]["sweep"]:
        per = r.get("fill_by_dtype", {}).get(name)
        if per is None:
            raise NotRecorded(f"fill bandwidth of {name}: not recorded in this record ({recorded_label(rec)}); "
                              "`python3 -m workbook bench alloc` on a GPU records it")
        rows.append({"bytes": r["bytes"], **per})
    return rows


def fill_rate_table(rec: dict, nbytes: int = 1 << 30) -> str:
    """One line per dtype: the fill's bandwidth at ``nbytes`` against the copy ceiling."""
    copy = rec["ceilings"].get("copy_GBps")
    lines = [f"zero_() at {nbytes >> 20} MiB, eager do_bench median ({recorded_label(rec)}):"]
    for name in FILL_DTYPES:
        try:
            row = next(r for r in fill_sweep(rec, name) if r["bytes"] == nbytes)
        except NotRecorded:
            lines.append(f"  {name:<14} not recorded")
            continue
        except StopIteration:
            lines.append(f"  {name:<14} size not in the sweep")
            continue
        rel = f" = {row['eager_GBps'] / copy:.2f} x the copy ceiling" if copy else ""
        lines.append(f"  {name:<14} {row['eager_GBps'] / 1e3:5.2f} TB/s ({row['eager_us']:.1f} us){rel}")
    if copy:
        lines.append(f"  copy ceiling   {copy / 1e3:5.2f} TB/s (bytes read + written, eager)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------------------

def _fill_per_dtype(nbytes: int) -> dict:
    """zero_() over the same ``nbytes`` viewed as each of :data:`FILL_DTYPES`: eager and graph replay."""
    raw = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    out = {}
    for name in FILL_DTYPES:
        buf = raw.view(getattr(torch, name))
        us = time_us(buf.zero_)
        gus = graph_time_us(buf.zero_, n=20 if nbytes <= (16 << 20) else 5)
        out[name] = {"eager_us": us, "eager_GBps": nbytes / (us * 1e-6) / 1e9, "graph_us": gus,
                     "graph_GBps": nbytes / (gus * 1e-6) / 1e9}
    return out


def zeros_vs_empty_sweep(sizes=SWEEP_SIZES) -> list[dict]:
    """Per size: ``torch.zeros`` vs ``torch.empty`` alone (host + launch + memset), each followed by a
    full overwrite (``copy_`` from a source, the allocate-then-overwrite pattern), eager and from
    CUDA-graph replay, and the fill kernel itself (``zero_`` on an existing buffer) per dtype.
    Which timer gave which figure: :data:`TIMERS`."""
    require_gpu("zeros_vs_empty_sweep")
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        src = torch.randn(n, device=DEVICE)
        buf = torch.empty(n, device=DEVICE)

        def zeros_copy():
            torch.zeros(n, device=DEVICE).copy_(src)

        def empty_copy():
            torch.empty(n, device=DEVICE).copy_(src)

        reps = 20 if nbytes <= (16 << 20) else 3   # calls per graph: 3 x 1 GiB is plenty of GPU time
        row = {
            "bytes": nbytes,
            "zeros_eager_us": time_us(lambda: torch.zeros(n, device=DEVICE)),
            "empty_eager_us": time_us(lambda: torch.empty(n, device=DEVICE)),
            "zeros_overwrite_eager_us": time_us(zeros_copy),
            "empty_overwrite_eager_us": time_us(empty_copy),
            "fill_eager_us": time_us(buf.zero_),
            "zeros_overwrite_graph_us": graph_time_us(zeros_copy, n=reps),
            "empty_overwrite_graph_us": graph_time_us(empty_copy, n=reps),
        }
        row["fill_eager_GBps"] = nbytes / (row["fill_eager_us"] * 1e-6) / 1e9
        row["overwrite_eager_ratio"] = row["zeros_overwrite_eager_us"] / row["empty_overwrite_eager_us"]
        row["overwrite_graph_ratio"] = row["zeros_overwrite_graph_us"] / row["empty_overwrite_graph_us"]
        del src, buf
        torch.cuda.empty_cache()
        row["fill_by_dtype"] = _fill_per_dtype(nbytes)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def graph_decode_step(n_buffers: int = 50, nbytes: int = 16 << 10) -> dict:
    """A decode-like step: ``n_buffers`` small outputs, each allocated and then written once by a
    kernel, captured in a CUDA graph of one step and timed as graph replays. The graph with ``zeros``
    carries one fill-kernel node per buffer (PyTorch's FillFunctor elementwise kernel, not a memset
    node)."""
    require_gpu("graph_decode_step")
    n = nbytes // 4
    srcs = [torch.randn(n, device=DEVICE) for _ in range(n_buffers)]
    out = {}
    for alloc in ("zeros", "empty"):
        make = getattr(torch, alloc)

        def step():
            return [make(n, device=DEVICE).copy_(s) for s in srcs]

        # the first call warms the caching allocator outside capture; then one step per graph
        out[f"{alloc}_graph_us"] = graph_time_us(step, n=1)
    out.update(n_buffers=n_buffers, buffer_bytes=nbytes, ratio=out["zeros_graph_us"] / out["empty_graph_us"])
    return out


def _is_kernel(e) -> bool:
    dt = getattr(e, "device_type", None)
    return dt is not None and "CUDA" in str(dt) and not e.key.startswith(("aten::", "cuda"))


def _profiled_events(averages) -> list[dict]:
    """The profiler's rows worth showing: device kernels on a GPU, aten ops on a CPU (their CPU time)."""
    events = []
    for e in averages:
        dev_us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
        if ON_GPU and dev_us <= 0:
            continue
        if ON_GPU and not _is_kernel(e):
            continue
        if not ON_GPU and not e.key.startswith("aten::"):
            continue
        events.append({"name": e.key[:110], "count": e.count,
                       "profiler_us": round(dev_us if ON_GPU else e.cpu_time_total, 2)})
    return events


def profile_zeros_vs_empty(nbytes: int = 64 << 20) -> dict:
    """``torch.profiler`` over one zeros+overwrite and one empty+overwrite: which device kernels each
    launches, with each kernel's own time (``profiler_us``). On a CPU-only machine it profiles the CPU
    ops instead (``profiler_us`` is then their CPU time, not a GPU figure)."""
    from torch.profiler import ProfilerActivity, profile

    n = nbytes // 4
    src = torch.randn(n, device=DEVICE)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ON_GPU else [])
    res = {"device": str(DEVICE), "bytes": nbytes}
    for alloc in ("zeros", "empty"):
        make = getattr(torch, alloc)
        for _ in range(3):
            make(n, device=DEVICE).copy_(src)
        if ON_GPU:
            torch.cuda.synchronize()
        with warnings.catch_warnings():  # torch's note that each profiling cycle clears events
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            with quiet_kineto():
                with profile(activities=activities) as prof:
                    make(n, device=DEVICE).copy_(src)
                    if ON_GPU:
                        torch.cuda.synchronize()
                averages = prof.key_averages()
        res[alloc] = _profiled_events(averages)
    return res


def fill_kernel_names(nbytes: int = 64 << 20) -> dict:
    """The device kernel that ``zero_()`` launches for each of :data:`FILL_DTYPES`, as the profiler
    names it (PyTorch's elementwise ``FillFunctor`` kernel; its first template argument is the
    vector width in elements that PyTorch picked for that dtype)."""
    require_gpu("fill_kernel_names")
    from torch.profiler import ProfilerActivity, profile

    raw = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    names = {}
    for name in FILL_DTYPES:
        buf = raw.view(getattr(torch, name))
        buf.zero_()
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            with quiet_kineto():
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    buf.zero_()
                    torch.cuda.synchronize()
                kernels = [e.key for e in prof.key_averages() if _is_kernel(e)]
        names[name] = kernels[0][:160] if kernels else "(no kernel seen)"
    return names


def fill_bandwidth_events(nbytes: int = 1 << 30, iters: int = 20) -> dict:
    """A second, independent measure of the zero-fill bandwidth: CUDA events around ``iters``
    back-to-back ``zero_()`` calls on one large buffer (no L2 flush; the buffer dwarfs the L2)."""
    require_gpu("fill_bandwidth_events")
    buf = torch.empty(nbytes // 4, device=DEVICE)
    us = fixed_time_us(buf.zero_, iters, warmup=3)
    return {"bytes": nbytes, "iters": iters, "fill_events_us": us, "GBps": nbytes / (us * 1e-6) / 1e9}
