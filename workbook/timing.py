"""Timers: every GPU figure of the workbook is measured by one of these, and named by its timer.

Two timers are never mixed up (SPECS section 6 shows how far they can differ on one call):

* ``graph``: GPU time per call from CUDA-graph replay (:func:`graph_time_us`): the calls are captured
  in one graph and replayed, so no host work or launch gap sits between the kernels.
* ``eager``: the per-call time of an eager Python call (:func:`time_us`: ``triton.testing.do_bench``
  median, CUDA events, L2 flushed between calls): host work and launch gaps count when the GPU work
  is short or split over many launches.

Three more name the other ways a figure was taken: ``events`` (CUDA events around a fixed number of
back-to-back calls, :func:`fixed_time_us`; what every rank of a collective can agree on),
``profiler`` (each device kernel's own time from ``torch.profiler``, :func:`kernel_times_us`) and
``ncu`` (Nsight Compute, run by hand). A record names the timers it used in its ``timers`` field and
every time column says its timer in its key (``<what>_<timer>_us``): :mod:`workbook.records`.

Nothing here runs without a GPU (:func:`require_gpu` says so); nothing presents a CPU timing as a GPU
figure.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from typing import Callable

import torch

from .device import DEVICE, ON_GPU

__all__ = [
    "TIMERS", "require_gpu", "time_us", "capture_graph", "graph_time_us", "fixed_time_us",
    "graph_fixed_time_us", "time_both", "kernel_times_us", "power_probe", "power_summary",
    "copy_ceiling_GBps", "matmul_ceiling_TFLOPs", "quiet_kineto",
]

# The timers' names and what each measures; records copy the ones they use into their "timers".
TIMERS = {
    "graph": "GPU time per call from CUDA-graph replay (workbook.timing.graph_time_us): the calls captured "
             "in one graph and replayed, no host work or launch gap between the kernels",
    "eager": "per-call time of an eager Python call (workbook.timing.time_us: triton.testing.do_bench "
             "median, CUDA events, L2 flushed between calls): host work and launch gaps count",
    "events": "CUDA events around a fixed number of back-to-back calls (workbook.timing.fixed_time_us), "
              "per call",
    "profiler": "each device kernel's own GPU time from torch.profiler (CUPTI kernel activity; "
                "workbook.timing.kernel_times_us): kernel durations only, no launch gaps",
    "ncu": "Nsight Compute (ncu), one launch at a time",
}


def require_gpu(what: str) -> None:
    if not ON_GPU:
        raise RuntimeError(f"{what} measures a GPU and none is present here; the notebooks show the "
                           "recorded H200 results instead (workbook.records.load_record)")


def time_us(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median GPU time of ``fn()`` in microseconds (``triton.testing.do_bench``: CUDA events, L2
    flushed between runs)."""
    require_gpu("time_us")
    from triton.testing import do_bench

    return 1e3 * do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def capture_graph(fn, n: int):
    """``fn`` called once (compilation, autotuning, allocator warm-up), then ``n`` calls captured in
    one CUDA graph, which is returned (replay it to time GPU work without host or launch cost)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return g


def graph_time_us(fn: Callable[[], object], n: int = 20, windows: int = 1) -> float:
    """Per-call GPU time of ``fn`` replayed from a CUDA graph that holds ``n`` calls: no host work
    between the kernels, so small calls measure the GPU, not Python and the launch path. ``fn`` is
    called once before capture (compilation, autotuning, allocator warm-up).

    ``windows > 1`` times that many back-to-back 100 ms windows and returns their median: a kernel
    that runs the H200 into its 700 W power cap sees the clock move by 10-20% from one window to the
    next, and one window can land in a dip."""
    require_gpu("graph_time_us")
    g = capture_graph(fn, n)
    g.replay()
    torch.cuda.synchronize()
    times = sorted(time_us(g.replay) / n for _ in range(windows))
    return times[len(times) // 2]


def power_probe(fn: Callable[[], object], seconds: float = 2.5, n: int = 20, settle_s: float = 0.5) -> dict:
    """What the GPU's power management does while ``fn`` runs back to back: ``n`` calls captured in a
    CUDA graph, replayed for ``seconds`` while ``nvidia-smi`` samples the SM clock, the board power,
    the power limit and the active clock-event reasons every 50 ms. Samples from the first
    ``settle_s`` seconds (the ramp up) are dropped. Returns ``{samples, sm_clock_MHz: {mean, min,
    max}, power_W: {mean, max}, power_limit_W, power_capped_share}`` (the share of samples in which
    the driver reported its software power cap lowering the clocks), or ``{"error": ...}`` where
    nvidia-smi cannot be run."""
    import subprocess
    import threading
    import time

    require_gpu("power_probe")
    cmd = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,power.limit,clocks_event_reasons.active",
           "--format=csv,noheader,nounits", "-lms", "50"]
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", "") or "")
    if uuid:
        cmd += ["-i", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]
    g = capture_graph(fn, n)
    torch.cuda.synchronize()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError as e:
        return {"error": f"nvidia-smi: {e}"}
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.time(), ln)) for ln in proc.stdout], daemon=True)
    reader.start()
    time.sleep(0.3)
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(8):
            g.replay()
        torch.cuda.synchronize()
    t1 = time.time()
    proc.terminate()
    proc.wait(timeout=5)
    reader.join(timeout=5)
    return power_summary(lines, t0 + settle_s, t1)


def power_summary(lines: list[tuple[float, str]], t0: float, t1: float) -> dict:
    """:func:`power_probe`'s summary of timestamped nvidia-smi lines ``(host time, "clock MHz, power W,
    limit W, 0x<clock-event reasons>")``: only the lines stamped within [t0, t1] and readable count."""
    rows = []
    for t, ln in lines:
        parts = [p.strip() for p in ln.split(",")]
        if t0 <= t <= t1 and len(parts) == 4:
            try:
                rows.append((float(parts[0]), float(parts[1]), float(parts[2]), int(parts[3], 16)))
            except ValueError:
                continue
    if not rows:
        return {"error": "nvidia-smi gave no readable samples"}
    clk, pw = [r[0] for r in rows], [r[1] for r in rows]
    return {"samples": len(rows),
            "sm_clock_MHz": {"mean": round(sum(clk) / len(clk)), "min": round(min(clk)), "max": round(max(clk))},
            "power_W": {"mean": round(sum(pw) / len(pw), 1), "max": round(max(pw), 1)},
            "power_limit_W": round(max(r[2] for r in rows), 1),
            "power_capped_share": round(sum(1 for r in rows if r[3] & 0x4) / len(rows), 3)}


def copy_ceiling_GBps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read + bytes written (the ceiling that a
    memory-bound kernel is measured against)."""
    require_gpu("copy_ceiling_GBps")
    src = torch.randn(nbytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    t = time_us(lambda: dst.copy_(src))
    return 2 * nbytes / (t * 1e-6) / 1e9


def matmul_ceiling_TFLOPs(n: int = 8192) -> float:
    """Dense bf16 matrix-product rate of this GPU through torch (``n`` x ``n`` x ``n``, random data: zeros
    run faster), the ceiling that a compute-bound kernel's model FLOPs are measured against."""
    require_gpu("matmul_ceiling_TFLOPs")
    a, b = (torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    return 2 * n ** 3 / (time_us(lambda: a @ b) * 1e-6) / 1e12


def fixed_time_us(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    """Per-call time over a FIXED number of calls (CUDA events around them): every rank of a
    collective runs the same count, so collectives inside ``fn`` stay matched across ranks
    (``do_bench`` picks its own count per process)."""
    import torch.distributed as dist

    require_gpu("fixed_time_us")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / iters


def graph_fixed_time_us(fn: Callable[[], object], n: int = 10, replays: int = 10) -> float:
    """GPU time per call from replaying a CUDA graph of ``n`` calls ``replays`` times (fixed counts,
    for collectives: :func:`fixed_time_us`)."""
    return fixed_time_us(capture_graph(fn, n).replay, replays, warmup=2) / n


def time_both(fn: Callable[[], object], *, fixed: bool = False) -> dict:
    """``{"graph_us": .., "eager_us": ..}`` for one call: GPU time from graph replay beside the eager
    per-call time (``fixed=True``: the fixed-count versions, for calls with collectives inside). A
    call that cannot be captured in a graph records why (``"graph_error"``) and keeps its eager
    figure: never silently skipped."""
    out = {"eager_us": fixed_time_us(fn, 20) if fixed else time_us(fn)}
    try:
        out["graph_us"] = graph_fixed_time_us(fn) if fixed else graph_time_us(fn)
    except Exception as e:  # noqa: BLE001  (e.g. a host sync inside the call breaks capture)
        torch.cuda.synchronize()
        out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def kernel_times_us(fn: Callable[[], object], n: int = 5) -> dict:
    """Each device kernel's GPU time per call of ``fn`` ({kernel name: us}), from ``torch.profiler``
    over ``n`` eager calls (kernel durations only: launch gaps and host work are not in them)."""
    from torch.profiler import ProfilerActivity, profile

    require_gpu("kernel_times_us")
    fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with quiet_kineto():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    fn()
                torch.cuda.synchronize()
            out = {}
            for e in prof.key_averages():
                t = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
                if t > 0 and not e.key.startswith(("aten::", "cuda", "Memcpy", "Memset")):
                    out[e.key[:90]] = t / n
    return out


@contextlib.contextmanager
def quiet_kineto():
    """Drop kineto's 'USDT: ... profiler_start / profiler_stop' marker lines, which libkineto (the
    profiler's C++ backend) writes to the process's stderr at every profiling session, even on a CPU;
    anything else it writes (warnings, errors) is passed on to ``sys.stderr``."""
    try:
        saved = os.dup(2)      # kineto writes to file descriptor 2, whatever sys.stderr is
    except OSError:
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stderr.flush()
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            keep = [ln for ln in text.splitlines(keepends=True) if not ln.startswith(("USDT:", "STAGE:"))]
            if keep:
                sys.stderr.write("".join(keep))
