"""Notebook 01's topic: what ``torch.zeros`` adds to allocate-then-overwrite, and why fresh memory lies.

``torch.zeros(n)`` is ``torch.empty(n)`` (a block from PyTorch's caching allocator: host work only)
followed by ``fill_(0)``: PyTorch's own elementwise fill kernel (``FillFunctor``), not ``cudaMemset``,
a kernel node like any other when captured in a CUDA graph. In the allocate-then-overwrite pattern the
overwrite already writes every byte, so the fill is one extra full write. This module holds what a
participant reads beside the notebook:

* :func:`stale_bytes_demo`: a step replayed twice on the same memory (a real CUDA graph on a GPU, a
  static buffer without one) that forgets its last element: that element shows what someone else
  left there, not what the step computed;
* :func:`reuse_demo`: a freed tensor's block handed back by ``torch.empty`` with its bytes;
* :func:`torch_source`: PyTorch's own C++/CUDA source of the fill kernel's launch (elements per
  thread, vector width), quoted from the installed wheel;
* :data:`FILL_DTYPES`: the dtypes whose fill rate the notebook compares (the scale buffers of the
  later topics are ``uint8``, ``int32`` and ``float8_e4m3fn``): the element size sets the fill
  kernel's elements per thread and vector width, and so its bandwidth.

The instrument that does not lie (poisoning, coverage, the consumer differential, the zero-fill
finder) is :mod:`workbook.coverage`. The measurements of the notebook (the zeros-vs-empty sweep, the
fill rate per dtype, the decode-like graph, the profiler's view) are :mod:`workbook.benchmarks.alloc`,
recorded in ``workbook/data/alloc.json``; the exercise's grader is :mod:`workbook.graders.alloc`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .device import DEVICE, ON_GPU

__all__ = ["FILL_DTYPES", "stale_bytes_demo", "reuse_demo", "torch_source"]

# The fill's bandwidth depends on the element size (notebook 01 explains why, from PyTorch's source):
# the sweep times zero_() for each of these dtypes, on the same bytes. The scale buffers of the later
# topics are uint8 (NVFP4 E4M3 scales), int32 (packed UE8M0) and float8_e4m3fn.
FILL_DTYPES = ("uint8", "float8_e4m3fn", "bfloat16", "float16", "int32", "float32")


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
            # audit: ok -- the stale-bytes demo of notebook 01: the last element is left unwritten on purpose
            buf = torch.empty(n, device=DEVICE)
            buf[: n - 1] = step_in + torch.arange(n - 1, device=DEVICE)  # forgets the last element
            holder["buf"] = buf
            return buf

        step()                     # once outside capture (the allocator's warm-up), then captured
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        replay, mode = graph.replay, "CUDA graph replay"
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


def torch_source(relpath: str, start: str, end: str, before: int = 0) -> str:
    """PyTorch's own C++/CUDA source as shipped in the installed wheel (``torch/include/<relpath>``;
    CPU wheels carry the CUDA headers too), from the first line containing ``start`` through the next
    line containing ``end`` (and ``before`` lines above the start), with line numbers: the notebook
    quotes the installed version."""
    path = Path(torch.__file__).resolve().parent / "include" / relpath
    head = f"torch {torch.__version__}: torch/include/{relpath}"
    if not path.exists():
        return f"{head}: not in this install; read it in the pytorch/pytorch repository (aten/src/{relpath})"
    lines = path.read_text(errors="replace").splitlines()
    try:
        i = next(k for k, ln in enumerate(lines) if start in ln)
        j = next(k for k in range(i, len(lines)) if end in lines[k])
    except StopIteration:
        return f"{head}: {start!r} .. {end!r} not found (the source changed): read the file itself"
    return "\n".join([head] + [f"{k + 1:5d}  {lines[k]}" for k in range(max(0, i - before), j + 1)])
