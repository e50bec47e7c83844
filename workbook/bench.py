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
from pathlib import Path
from typing import Callable

import torch

from .device import DEVICE, ON_GPU, describe

__all__ = [
    "DATA_DIR", "require_gpu", "time_us", "copy_ceiling_GBps", "save_record", "load_record",
    "validate_record", "recorded_label", "zeros_vs_empty_sweep", "graph_decode_step",
    "profile_zeros_vs_empty", "SWEEP_SIZES",
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
