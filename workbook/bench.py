"""Measuring on the GPU, and recording what was measured.

Timings are GPU timings only when a GPU is present: :func:`time_us` uses
``triton.testing.do_bench`` (CUDA events, median of many runs). Without a GPU the notebooks show the
results recorded on an H200 (``workbook/data/*.json``), labelled as recorded, with GPU, versions and
date. Nothing here presents a CPU timing as a GPU figure.

Record schema (checked by :func:`validate_record`)::

    {"schema": 1, "name": str, "recorded": "YYYY-MM-DD",
     "meta": {"gpu": str, "torch": str, "triton": str, "cuda": str, ...},
     "ceilings": {"copy_GBps": float, ...},
     "results": {...topic specific...}}
"""
from __future__ import annotations

import datetime as _dt
import json
import warnings
from pathlib import Path
from typing import Callable

import torch

from .device import DEVICE, ON_GPU, describe

__all__ = [
    "DATA_DIR", "require_gpu", "time_us", "graph_time_us", "copy_ceiling_GBps", "save_record", "load_record",
    "validate_record", "recorded_label", "zeros_vs_empty_sweep", "graph_decode_step",
    "profile_zeros_vs_empty", "stale_bytes_demo", "fill_bandwidth_events", "benchmark", "SWEEP_SIZES",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
SCHEMA = 1


def require_gpu(what: str) -> None:
    if not ON_GPU:
        raise RuntimeError(f"{what} measures a GPU and none is present here; the notebooks show the "
                           "recorded H200 results instead (workbook.bench.load_record)")


def time_us(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median GPU time of ``fn()`` in microseconds (``triton.testing.do_bench``: CUDA events, L2
    flushed between runs)."""
    require_gpu("time_us")
    from triton.testing import do_bench

    return 1e3 * do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def graph_time_us(fn: Callable[[], object], n: int = 20, windows: int = 1) -> float:
    """Per-call GPU time of ``fn`` replayed from a CUDA graph that holds ``n`` calls: no host work
    between the kernels, so small calls measure the GPU, not Python and the launch path. ``fn`` is
    called once before capture (compilation, autotuning, allocator warm-up).

    ``windows > 1`` times that many back-to-back 100 ms windows and returns their median: a kernel
    that runs the H200 into its 700 W power cap sees the clock move by 10-20% from one window to the
    next, and one window can land in a dip."""
    require_gpu("graph_time_us")
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = sorted(time_us(g.replay) / n for _ in range(windows))
    return times[len(times) // 2]


def copy_ceiling_GBps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read + bytes written (the ceiling that a
    memory-bound kernel is measured against)."""
    require_gpu("copy_ceiling_GBps")
    src = torch.randn(nbytes // 4, device=DEVICE)
    dst = torch.empty_like(src)
    t = time_us(lambda: dst.copy_(src))
    return 2 * nbytes / (t * 1e-6) / 1e9


# --------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------

def save_record(name: str, results: dict, ceilings: dict | None = None, directory: Path | None = None) -> Path:
    """Write ``results`` (JSON-serialisable) as ``<directory>/<name>.json`` with the device's meta."""
    rec = {
        "schema": SCHEMA,
        "name": name,
        "recorded": _dt.date.today().isoformat(),
        "meta": describe(),
        "ceilings": ceilings or {},
        "results": results,
    }
    validate_record(rec)
    path = Path(directory or DATA_DIR) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def load_record(name: str, directory: Path | None = None) -> dict:
    path = Path(directory or DATA_DIR) / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no recorded result {path.name} in {path.parent}; run "
                                f"`python -m workbook bench` on a GPU to record it")
    rec = json.loads(path.read_text())
    validate_record(rec)
    return rec


def validate_record(rec: dict) -> None:
    """Raise ValueError naming the first field that breaks the record schema."""
    def need(cond, what):
        if not cond:
            raise ValueError(f"recorded result {rec.get('name', '?')!r}: {what}")

    need(isinstance(rec, dict), "must be a JSON object")
    need(rec.get("schema") == SCHEMA, f"'schema' must be {SCHEMA}")
    need(isinstance(rec.get("name"), str) and rec["name"], "'name' must be a non-empty string")
    try:
        _dt.date.fromisoformat(rec.get("recorded", ""))
    except (TypeError, ValueError):
        need(False, "'recorded' must be an ISO date (YYYY-MM-DD)")
    meta = rec.get("meta")
    need(isinstance(meta, dict), "'meta' must be an object")
    for key in ("torch", "triton", "device"):
        need(isinstance(meta.get(key), str), f"meta.{key} must be a string")
    if meta.get("device", "").startswith("cuda"):
        need(isinstance(meta.get("gpu"), str), "meta.gpu must name the GPU of a GPU record")
    need(isinstance(rec.get("ceilings"), dict), "'ceilings' must be an object")
    for k, v in rec["ceilings"].items():
        need(isinstance(v, (int, float)) and v > 0, f"ceilings.{k} must be a positive number")
    need(isinstance(rec.get("results"), (dict, list)), "'results' must be an object or a list")


def recorded_label(rec: dict) -> str:
    m = rec["meta"]
    where = m.get("gpu") or f"CPU ({m.get('cpu', '?')})"
    return (f"recorded {rec['recorded']} on {where}, torch {m['torch']}, Triton {m['triton']}"
            + (f", CUDA {m['cuda']}" if m.get("cuda") else ""))


# --------------------------------------------------------------------------------------------------
# zeros vs empty (notebook 01)
# --------------------------------------------------------------------------------------------------

SWEEP_SIZES = [4 << 10 << (2 * i) for i in range(10)]  # 4 KiB, 16 KiB, ..., 1 GiB


def zeros_vs_empty_sweep(sizes=SWEEP_SIZES) -> list[dict]:
    """Per size: ``torch.zeros`` vs ``torch.empty`` alone (host + launch + memset), each followed by a
    full overwrite (``copy_`` from a source, the allocate-then-overwrite pattern), and the bandwidth of
    the fill kernel itself (``zero_`` on an existing buffer, bytes written / time)."""
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

        row = {
            "bytes": nbytes,
            "zeros_us": time_us(lambda: torch.zeros(n, device=DEVICE)),
            "empty_us": time_us(lambda: torch.empty(n, device=DEVICE)),
            "zeros_overwrite_us": time_us(zeros_copy),
            "empty_overwrite_us": time_us(empty_copy),
            "fill_us": time_us(buf.zero_),
        }
        row["fill_GBps"] = nbytes / (row["fill_us"] * 1e-6) / 1e9
        row["overwrite_ratio"] = row["zeros_overwrite_us"] / row["empty_overwrite_us"]
        rows.append(row)
        del src, buf
        torch.cuda.empty_cache()
    return rows


def graph_decode_step(n_buffers: int = 50, nbytes: int = 16 << 10) -> dict:
    """A decode-like step: ``n_buffers`` small outputs, each allocated and then written once by a
    kernel, captured in a CUDA graph. The graph with ``zeros`` carries one memset node per buffer."""
    require_gpu("graph_decode_step")
    n = nbytes // 4
    srcs = [torch.randn(n, device=DEVICE) for _ in range(n_buffers)]
    out = {}
    for alloc in ("zeros", "empty"):
        make = getattr(torch, alloc)

        def step():
            return [make(n, device=DEVICE).copy_(s) for s in srcs]

        step()  # warm the caching allocator outside capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        g.replay()
        torch.cuda.synchronize()
        out[f"{alloc}_us"] = time_us(g.replay)
    out.update(n_buffers=n_buffers, buffer_bytes=nbytes, ratio=out["zeros_us"] / out["empty_us"])
    return out


def stale_bytes_demo(n: int = 8) -> dict:
    """Why a buffer from ``empty`` inside a CUDA graph is not 'fresh': replay the same graph twice;
    an element the kernel skips keeps the previous replay's value."""
    require_gpu("stale_bytes_demo")
    step_in = torch.zeros(1, device=DEVICE)
    holder = {}

    def step():
        buf = torch.empty(n, device=DEVICE)
        buf[: n - 1] = step_in + torch.arange(n - 1, device=DEVICE)  # forgets the last element
        holder["buf"] = buf
        return buf

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    seen = []
    for value in (100.0, 200.0):
        step_in.fill_(value)
        g.replay()
        torch.cuda.synchronize()
        seen.append(holder["buf"].tolist())
        holder["buf"][n - 1] = value  # something else wrote there between steps
    return {"replays": seen}


def profile_zeros_vs_empty(nbytes: int = 64 << 20) -> dict:
    """``torch.profiler`` over one zeros+overwrite and one empty+overwrite: which device kernels each
    launches. On a CPU-only machine it profiles the CPU ops instead (and says so)."""
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
            with profile(activities=activities) as prof:
                make(n, device=DEVICE).copy_(src)
                if ON_GPU:
                    torch.cuda.synchronize()
            averages = prof.key_averages()
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
                           "time_us": round(dev_us if ON_GPU else e.cpu_time_total, 2)})
        res[alloc] = events
    return res


def _is_kernel(e) -> bool:
    dt = getattr(e, "device_type", None)
    return dt is not None and "CUDA" in str(dt) and not e.key.startswith(("aten::", "cuda"))


def fill_bandwidth_events(nbytes: int = 1 << 30, iters: int = 20) -> dict:
    """A second, independent measure of the zero-fill bandwidth: CUDA events around ``iters``
    back-to-back ``zero_()`` calls on one large buffer (no L2 flush; the buffer dwarfs the L2)."""
    require_gpu("fill_bandwidth_events")
    buf = torch.empty(nbytes // 4, device=DEVICE)
    for _ in range(3):
        buf.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        buf.zero_()
    end.record()
    end.synchronize()
    us = start.elapsed_time(end) * 1e3 / iters
    return {"bytes": nbytes, "iters": iters, "us_per_fill": us, "GBps": nbytes / (us * 1e-6) / 1e9}


def benchmark() -> tuple[dict, dict]:
    """Everything notebook 01 shows, measured on this GPU (``python -m workbook bench alloc``)."""
    require_gpu("benchmark")
    ceiling = copy_ceiling_GBps()
    results = {
        "sweep": zeros_vs_empty_sweep(),
        "graph": graph_decode_step(),
        "profile": profile_zeros_vs_empty(),
        "stale_bytes": stale_bytes_demo(),
        "fill_events": fill_bandwidth_events(),
    }
    return results, {"copy_GBps": ceiling}
