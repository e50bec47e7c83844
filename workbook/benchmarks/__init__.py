"""The GPU benchmarks: one module per topic, one contract, one registry.

Every module ``workbook.benchmarks.<topic>`` (``<topic>`` a key of :data:`REGISTRY`) defines:

* ``run(*, budget_s: float | None = None, smoke: bool = False) -> workbook.records.Measurement``:
  measures on this GPU and returns the figures, the timers it used and the ceilings it measured.
  ``smoke=True`` times the small set a notebook times live (seconds); ``budget_s`` bounds the time of
  the full run where the topic can trade rows for time (rows that did not fit are listed in
  ``results["skipped"]``), and is otherwise ignored. Without a GPU it raises (``timing.require_gpu``).
* ``table(rec: dict) -> str``: the record's main figures as text (``records.format_table``), whether
  ``rec`` was just measured or loaded from ``workbook/data/<topic>.json``.

``python3 -m workbook bench TOPIC`` and the notebooks call these and nothing else: :func:`record`
runs one and writes its record (``workbook/data/<topic>.json``, schema in :mod:`workbook.records`).
Pictures of the records are in :mod:`workbook.plots`.
"""
from __future__ import annotations

import importlib
from pathlib import Path

# topic -> what it measures (the order of the notebooks)
REGISTRY = {
    "alloc": "zeros vs empty: allocation, fill kernels by dtype, a decode-like CUDA graph (notebook 01)",
    "nvfp4": "NVFP4 quantization against the copy ceiling and a compiled reference (notebook 02)",
    "fp8": "fused SiLU-mul + FP8 group quant against its peers (notebook 03)",
    "turboquant": "TurboQuant decode against SDPA on a bf16 cache, the mixed step (notebook 04)",
    "gdn": "Gated DeltaNet chunked prefill and decode against flash-linear-attention (notebook 05)",
    "fusion": "the mini decoder in both buffer styles, compiled (notebook 06)",
    "cuda": "the CUDA C++ kernels against the Triton ones (notebooks 02-04)",
}


def topics() -> list[str]:
    return list(REGISTRY)


def module(topic: str):
    """The benchmark module of ``topic`` (imported on demand: a topic's benchmark imports its kernels)."""
    if topic not in REGISTRY:
        raise ValueError(f"unknown benchmark topic {topic!r}; known: {', '.join(REGISTRY)}")
    return importlib.import_module(f"{__name__}.{topic}")


def record(topic: str, *, budget_s: float | None = None, smoke: bool = False,
           directory: Path | None = None) -> Path:
    """Run ``topic``'s benchmark and write its record; returns the file's path."""
    from ..records import save_record

    return save_record(topic, module(topic).run(budget_s=budget_s, smoke=smoke), directory)
