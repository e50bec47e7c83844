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

The alloc record (notebook 01, :func:`benchmark`) holds ``results = {"sweep": [row per size],
"graph", "profile", "fill_kernels", "stale_bytes", "fill_events", "timers"}``; a sweep row has
``bytes, zeros_us, empty_us, zeros_overwrite_us, empty_overwrite_us, fill_us, fill_GBps,
overwrite_ratio`` (eager), ``zeros_overwrite_graph_us, empty_overwrite_graph_us,
overwrite_graph_ratio`` (graph replay) and ``fill_by_dtype = {dtype: {us, GBps, graph_us,
graph_GBps}}`` for each of :data:`FILL_DTYPES`. Records written before the graph-replay, per-dtype,
``fill_kernels`` and ``timers`` fields existed still load: readers say "not recorded yet".

Two timers, never mixed up: *eager* (``time_us``: ``triton.testing.do_bench``, CUDA events around
each call, so host work and launch gaps count when the GPU work is short) and *graph replay*
(``graph_time_us``: the calls captured in a CUDA graph, GPU time only). The alloc record names the
timer of every figure in ``results["timers"]`` (:data:`ALLOC_TIMERS`, :func:`timer_of`).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch

from .device import DEVICE, ON_GPU, describe

__all__ = [
    "DATA_DIR", "require_gpu", "time_us", "capture_graph", "graph_time_us", "power_probe", "power_summary", "copy_ceiling_GBps", "save_record", "load_record",
    "validate_record", "recorded_label", "zeros_vs_empty_sweep", "graph_decode_step",
    "profile_zeros_vs_empty", "stale_bytes_demo", "reuse_demo", "fill_bandwidth_events", "fill_kernel_names",
    "benchmark", "SWEEP_SIZES", "FILL_DTYPES", "ALLOC_TIMERS", "NotRecorded", "timer_of", "fill_sweep",
    "fill_rate_table", "check_zero_fill_prediction", "torch_source",
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

# The fill's bandwidth depends on the element size (notebook 01 explains why, from PyTorch's source):
# the sweep times zero_() for each of these dtypes, on the same bytes. The scale buffers of the later
# topics are uint8 (NVFP4 E4M3 scales), int32 (packed UE8M0) and float8_e4m3fn.
FILL_DTYPES = ("uint8", "float8_e4m3fn", "bfloat16", "float16", "int32", "float32")

# Which timer produced each figure of the alloc record ("eager" = time_us, "graph replay" =
# graph_time_us). benchmark() stores this in results["timers"].
ALLOC_TIMERS = {
    "sweep.zeros_us": "eager: do_bench median of torch.zeros(n) alone (host + allocator + launch + fill)",
    "sweep.empty_us": "eager: do_bench median of torch.empty(n) alone (host + allocator only)",
    "sweep.zeros_overwrite_us": "eager: do_bench median of torch.zeros(n).copy_(src)",
    "sweep.empty_overwrite_us": "eager: do_bench median of torch.empty(n).copy_(src)",
    "sweep.fill_us": "eager: do_bench median of buf.zero_() on an existing float32 buffer",
    "sweep.zeros_overwrite_graph_us": "graph replay: torch.zeros(n).copy_(src) captured in a CUDA graph, GPU time per call",
    "sweep.empty_overwrite_graph_us": "graph replay: torch.empty(n).copy_(src) captured in a CUDA graph, GPU time per call",
    "sweep.fill_by_dtype.us": "eager: do_bench median of zero_() on the same bytes viewed as each dtype",
    "sweep.fill_by_dtype.graph_us": "graph replay: zero_() on the same bytes viewed as each dtype, GPU time per call",
    "graph": "graph replay: one replay of the decode-like step (do_bench median of g.replay())",
    "profile": "torch.profiler (CUPTI kernel activity) over one eager call of each",
    "fill_events": "CUDA events around back-to-back zero_() calls (no L2 flush)",
    "copy_GBps": "eager: do_bench median of dst.copy_(src), 1 GiB float32, bytes read + written",
}

# Records written before ALLOC_TIMERS existed carry no "timers": their figures came from the same
# timers (bench.py of that date used do_bench for the sweep and for g.replay()), stated as such.
_LEGACY_TIMERS_NOTE = "not recorded in this record; the bench.py of its date used the same timer"


class NotRecorded(LookupError):
    """A figure that the current record does not hold yet (it predates the field)."""


def timer_of(rec: dict, key: str) -> str:
    """Which timer produced the figure ``key`` (e.g. 'sweep.zeros_us', 'graph') of an alloc record."""
    if key not in ALLOC_TIMERS:
        raise KeyError(f"unknown figure {key!r}; known: {sorted(ALLOC_TIMERS)}")
    timers = rec.get("results", {}).get("timers")
    if timers and key in timers:
        return timers[key]
    if key.endswith("graph_us") or key == "sweep.fill_by_dtype.us":
        return f"{ALLOC_TIMERS[key]} (not recorded yet)"
    return f"{ALLOC_TIMERS[key]} ({_LEGACY_TIMERS_NOTE})"


def _dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in FILL_DTYPES:
        raise ValueError(f"dtype must be one of {FILL_DTYPES} (or the torch dtype), got {dtype!r}")
    return name


def fill_sweep(rec: dict, dtype="float32") -> list[dict]:
    """The fill kernel's time per size for one dtype: ``[{"bytes", "us", "GBps", "graph_us"?}, ...]``
    (eager do_bench medians; ``graph_us`` from graph replay when recorded). Records that predate the
    per-dtype sweep hold float32 only (their ``fill_us``); other dtypes raise :class:`NotRecorded`."""
    name = _dtype_name(dtype)
    rows = []
    for r in rec["results"]["sweep"]:
        per = r.get("fill_by_dtype", {}).get(name)
        if per is not None:
            rows.append({"bytes": r["bytes"], **per})
        elif name == "float32" and "fill_us" in r:
            rows.append({"bytes": r["bytes"], "us": r["fill_us"], "GBps": r["fill_GBps"]})
        else:
            raise NotRecorded(f"fill bandwidth of {name}: not recorded yet in this record ({recorded_label(rec)}); "
                              "`python3 -m workbook bench alloc` on a GPU records it")
    return rows


def fill_rate_table(rec: dict, nbytes: int = 1 << 30) -> str:
    """One line per dtype: the fill's bandwidth at ``nbytes`` against the copy ceiling, or 'not
    recorded yet'."""
    copy = rec["ceilings"].get("copy_GBps")
    lines = [f"zero_() at {nbytes >> 20} MiB, eager do_bench median ({recorded_label(rec)}):"]
    for name in FILL_DTYPES:
        try:
            row = next(r for r in fill_sweep(rec, name) if r["bytes"] == nbytes)
        except NotRecorded:
            lines.append(f"  {name:<14} not recorded yet")
            continue
        except StopIteration:
            lines.append(f"  {name:<14} size not in the sweep")
            continue
        rel = f" = {row['GBps'] / copy:.2f} x the copy ceiling" if copy else ""
        lines.append(f"  {name:<14} {row['GBps'] / 1e3:5.2f} TB/s ({row['us']:.1f} us){rel}")
    if copy:
        lines.append(f"  copy ceiling   {copy / 1e3:5.2f} TB/s (bytes read + written, {timer_of(rec, 'copy_GBps').split(':')[0]})")
    return "\n".join(lines)


def torch_source(relpath: str, start: str, end: str, before: int = 0) -> str:
    """PyTorch's own C++/CUDA source as shipped in the installed wheel (``torch/include/<relpath>``;
    CPU wheels carry the CUDA headers too), from the first line containing ``start`` through the next
    line containing ``end`` (and ``before`` lines above the start), with line numbers: the notebook
    quotes the installed version."""
    import torch as _torch

    path = Path(_torch.__file__).resolve().parent / "include" / relpath
    head = f"torch {_torch.__version__}: torch/include/{relpath}"
    if not path.exists():
        return f"{head}: not in this install; read it in the pytorch/pytorch repository (aten/src/{relpath})"
    lines = path.read_text(errors="replace").splitlines()
    try:
        i = next(k for k, ln in enumerate(lines) if start in ln)
        j = next(k for k in range(i, len(lines)) if end in lines[k])
    except StopIteration:
        return f"{head}: {start!r} .. {end!r} not found (the source changed): read the file itself"
    return "\n".join([head] + [f"{k + 1:5d}  {lines[k]}" for k in range(max(0, i - before), j + 1)])


def _fill_per_dtype(nbytes: int) -> dict:
    """zero_() over the same ``nbytes`` viewed as each of :data:`FILL_DTYPES`: eager and graph replay."""
    raw = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    out = {}
    for name in FILL_DTYPES:
        buf = raw.view(getattr(torch, name))
        us = time_us(buf.zero_)
        gus = graph_time_us(buf.zero_, n=20 if nbytes <= (16 << 20) else 5)
        out[name] = {"us": us, "GBps": nbytes / (us * 1e-6) / 1e9, "graph_us": gus,
                     "graph_GBps": nbytes / (gus * 1e-6) / 1e9}
    return out


def zeros_vs_empty_sweep(sizes=SWEEP_SIZES) -> list[dict]:
    """Per size: ``torch.zeros`` vs ``torch.empty`` alone (host + launch + memset), each followed by a
    full overwrite (``copy_`` from a source, the allocate-then-overwrite pattern), eager and from
    CUDA-graph replay, and the fill kernel itself (``zero_`` on an existing buffer) per dtype.
    Which timer gave which figure: :data:`ALLOC_TIMERS`."""
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
            "zeros_us": time_us(lambda: torch.zeros(n, device=DEVICE)),
            "empty_us": time_us(lambda: torch.empty(n, device=DEVICE)),
            "zeros_overwrite_us": time_us(zeros_copy),
            "empty_overwrite_us": time_us(empty_copy),
            "fill_us": time_us(buf.zero_),
            "zeros_overwrite_graph_us": graph_time_us(zeros_copy, n=reps),
            "empty_overwrite_graph_us": graph_time_us(empty_copy, n=reps),
        }
        row["fill_GBps"] = nbytes / (row["fill_us"] * 1e-6) / 1e9
        row["overwrite_ratio"] = row["zeros_overwrite_us"] / row["empty_overwrite_us"]
        row["overwrite_graph_ratio"] = row["zeros_overwrite_graph_us"] / row["empty_overwrite_graph_us"]
        del src, buf
        torch.cuda.empty_cache()
        row["fill_by_dtype"] = _fill_per_dtype(nbytes)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def graph_decode_step(n_buffers: int = 50, nbytes: int = 16 << 10) -> dict:
    """A decode-like step: ``n_buffers`` small outputs, each allocated and then written once by a
    kernel, captured in a CUDA graph. The graph with ``zeros`` carries one fill-kernel node per
    buffer (PyTorch's FillFunctor elementwise kernel, not a memset node)."""
    require_gpu("graph_decode_step")
    n = nbytes // 4
    srcs = [torch.randn(n, device=DEVICE) for _ in range(n_buffers)]
    out = {}
    for alloc in ("zeros", "empty"):
        make = getattr(torch, alloc)

        def step():
            return [make(n, device=DEVICE).copy_(s) for s in srcs]

        g = capture_graph(step, 1)   # the first call warms the caching allocator outside capture
        g.replay()
        torch.cuda.synchronize()
        out[f"{alloc}_us"] = time_us(g.replay)
    out.update(n_buffers=n_buffers, buffer_bytes=nbytes, ratio=out["zeros_us"] / out["empty_us"])
    return out


def stale_bytes_demo(n: int = 8) -> dict:
    """Why a buffer from ``empty`` inside a CUDA graph is not 'fresh': replay the same step twice; an
    element the step skips keeps what the previous replay, or anyone else, left there.

    On a GPU the step is captured in a real CUDA graph. Without one there is no graph to capture, so
    the step runs on a *static buffer* allocated once, which is what a captured graph does with its
    ``empty`` outputs (the same memory on every replay); the result says which one ran."""
    holder = {}
    if ON_GPU:
        step_in = torch.zeros(1, device=DEVICE)

        def step():
            buf = torch.empty(n, device=DEVICE)
            buf[: n - 1] = step_in + torch.arange(n - 1, device=DEVICE)  # forgets the last element
            holder["buf"] = buf
            return buf

        replay, mode = capture_graph(step, 1).replay, "CUDA graph replay"
    else:
        step_in = torch.zeros(1)
        static = torch.empty(n)   # allocated once, reused by every "replay", like a graph's buffers
        static.fill_(-1.0)        # what the memory held before the first step (made visible)

        def replay():
            static[: n - 1] = step_in + torch.arange(n - 1)  # forgets the last element
            holder["buf"] = static

        mode = "static buffer reused by each step (what a CUDA graph does), no graph: no GPU here"
    seen = []
    for value in (100.0, 200.0):
        step_in.fill_(value)
        replay()
        if ON_GPU:
            torch.cuda.synchronize()
        seen.append(holder["buf"].tolist())
        holder["buf"][n - 1] = value  # something else wrote there between steps
    return {"replays": seen, "mode": mode}


def reuse_demo(nbytes: int = 16 << 10) -> dict:
    """Free a tensor full of 7.0 and ask ``torch.empty`` for the same size at once: did the allocator
    hand back the same block, and what does it hold? On a GPU PyTorch's caching allocator keeps freed
    blocks (same stream, same size class) and returns them with their bytes. On a CPU ``torch.empty``
    is ``malloc``: a small freed block often comes back at the same address with the old bytes except
    the first few, where malloc keeps its free-list pointers, and large blocks go back to the OS, which
    hands out zeroed pages. Nothing is promised either way; the result says what happened here."""
    n = nbytes // 4
    x = torch.full((n,), 7.0, device=DEVICE)
    ptr = x.data_ptr()
    del x
    y = torch.empty(n, device=DEVICE)
    same = y.data_ptr() == ptr
    v = y.cpu()
    frac_prev = float((v == 7.0).float().mean())
    frac_zero = float((v == 0.0).float().mean())
    return {"device": str(DEVICE), "bytes": nbytes, "same_block": same, "head": v[:6].tolist(),
            "frac_previous_owner": frac_prev, "frac_zero": frac_zero,
            "frac_other": 1.0 - frac_prev - frac_zero}


@contextlib.contextmanager
def _quiet_kineto():
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
            with _quiet_kineto():
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
            with _quiet_kineto():
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
        "fill_kernels": fill_kernel_names(),
        "stale_bytes": stale_bytes_demo(),
        "fill_events": fill_bandwidth_events(),
        "timers": dict(ALLOC_TIMERS),
    }
    return results, {"copy_GBps": ceiling}


# --------------------------------------------------------------------------------------------------
# Grader of notebook 01's exercise 1.2 (raises AssertionError with a message that teaches)
# --------------------------------------------------------------------------------------------------

PREDICTION_SIZES = (512 << 20, 128 << 20)   # not measured sizes: the prediction must interpolate
_PREDICTION_DTYPES = ("float32", "uint8", "int32")
_TOLERANCE = 0.01               # run-to-run noise of the large-size fill timings


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
    timing noise. Checked at 512 MiB and 128 MiB (an answer must follow ``nbytes``), for float32, and
    for uint8 and int32 when the record holds them (it says 'not recorded yet' otherwise)."""
    copy = rec["ceilings"].get("copy_GBps")
    checked = []
    for name in _PREDICTION_DTYPES:
        try:
            rows = {r["bytes"]: r for r in fill_sweep(rec, name)}
        except NotRecorded:
            print(f"    ({name}: not recorded yet in this record, so not checked)")
            continue
        got = {}
        for B in PREDICTION_SIZES:
            lo_row, hi_row = rows[B // 2], rows[2 * B]
            bounds = sorted((hi_row["us"] * B / hi_row["bytes"], lo_row["us"] * B / lo_row["bytes"]))
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
    beta_mid = (lo_row["GBps"] + hi_row["GBps"]) / 2 * 1e9
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
        ((lo_row["us"] + hi_row["us"]) / 2, f"averaging the TIMES of {human(B // 2)} and {human(2 * B)} mixes two "
         f"sizes; time scales with bytes: interpolate the bandwidth (or scale each time by {B >> 20} MiB / its size)"),
    ]
    if (B // 8) in rows:
        hints.append((rows[B // 8]["us"] * 8, f"the {human(B // 8)} row's bandwidth is lower (the launch still shows "
                      f"there): use the rows around {B >> 20} MiB"))
    if copy:
        hints.append((B / (copy * 1e9) * 1e6, "the copy ceiling counts bytes read + written; a fill only "
                      "writes, at its own rate: use the fill bandwidth of this dtype"))
        hints.append((2 * B / (copy * 1e9) * 1e6, "the copy ceiling is not the fill's rate: use the fill "
                      "bandwidth of this dtype"))
    if name != "float32":
        try:
            f32 = {r["bytes"]: r for r in fill_sweep(rec, "float32")}
            hints.append((B / ((f32[B // 2]["GBps"] + f32[2 * B]["GBps"]) / 2 * 1e9) * 1e6,
                          f"that is the float32 rate; the fill kernel writes {name} at a different rate "
                          "(the element size sets its vector width and bytes per thread): use this dtype's rows"))
        except (NotRecorded, KeyError):
            pass
    near = [(abs(p - v) / v, h) for v, h in hints if v > 0 and abs(p - v) <= 0.015 * v]
    return min(near)[1] if near else None
