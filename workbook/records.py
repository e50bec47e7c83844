"""Recorded results: ``workbook/data/<name>.json``, one schema for every file.

Every record is one JSON object::

    {"schema": 2,
     "name": "<name>",                     # the file's stem (a benchmark topic, "audit", "cpu_times")
     "recorded": "YYYY-MM-DD",             # when it was measured
     "machine": {"device": "cuda" | "cpu", "gpu": str | None, "torch": str, "triton": str,
                 "python": str, "cuda": str?, "sm_count": int?, "cpu": str?, ...},
     "timers": {"<timer>": "what it measures", ...},
     "ceilings": {"copy_GBps": float, ...},   # the bounds figures are compared with (may be empty)
     "results": {...}}                        # the topic's own figures

One rule names every time figure: its key ends in ``_<timer>_us`` (or is ``<timer>_us``), where
``<timer>`` is one of the record's ``timers``, each one of :data:`workbook.timing.TIMERS` (``graph``:
GPU time from CUDA-graph replay; ``eager``: eager per-call time; ``events``, ``profiler``,
``ncu``). So ``triton_graph_us`` sits beside ``triton_eager_us``, and no row carries a timer field of
its own. :func:`validate_record` checks all of it (``tests/test_records.py`` runs it over every file
in ``workbook/data/``); :func:`save_record` refuses a record that breaks it.
"""
from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DATA_DIR", "SCHEMA", "Measurement", "as_record", "save_record", "load_record", "validate_record", "recorded_label",
    "time_keys", "format_table", "human_bytes", "NotRecorded", "carry_over",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
SCHEMA = 2
TIMER_NAMES = ("graph", "eager", "events", "profiler", "ncu")   # the keys of workbook.timing.TIMERS
_MACHINE_STRINGS = ("device", "torch", "triton", "python")
_FORBIDDEN_IN_RESULTS = ("timer", "timers", "methods", "meta")


class NotRecorded(LookupError):
    """A figure that the record at hand does not hold (yet)."""


@dataclass
class Measurement:
    """What a benchmark's ``run()`` returns (:mod:`workbook.benchmarks`): its figures, the timers it
    used (names from :data:`workbook.timing.TIMERS`, with a description that may add detail) and the
    ceilings it measured."""
    results: dict
    timers: dict
    ceilings: dict = field(default_factory=dict)


def as_record(name: str, m: Measurement) -> dict:
    """``m`` as a record of this machine and today (validated, written nowhere): what a notebook's live
    cell hands to a benchmark's ``table`` or a plot, as it hands them a recorded file."""
    from .device import describe

    rec = {"schema": SCHEMA, "name": name, "recorded": _dt.date.today().isoformat(), "machine": describe(),
           "timers": dict(m.timers), "ceilings": dict(m.ceilings or {}), "results": m.results}
    validate_record(rec)
    return rec


def save_record(name: str, m: Measurement, directory: Path | None = None) -> Path:
    """Write ``m`` as ``<directory>/<name>.json`` with this machine's description and today's date
    (:func:`as_record`: validated first, so nothing that breaks the schema is written)."""
    rec = as_record(name, m)
    path = Path(directory or DATA_DIR) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def load_record(name: str, directory: Path | None = None) -> dict:
    """The record ``<name>.json`` (validated)."""
    path = Path(directory or DATA_DIR) / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no recorded result {path.name} in {path.parent}; run "
                                f"`python3 -m workbook bench {name}` on a GPU to record it")
    rec = json.loads(path.read_text())
    validate_record(rec)
    return rec


def time_keys(obj, prefix: str = ""):
    """Every key of ``obj`` (nested dicts and lists of dicts) that holds a time figure: those ending
    in ``_us``, as dotted paths."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if str(k).endswith("_us") or str(k) == "us":
                yield path, str(k)
            yield from time_keys(v, path)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from time_keys(v, f"{prefix}[{i}]")


def _forbidden(obj, prefix: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if k in _FORBIDDEN_IN_RESULTS or str(k).endswith("_timer"):
                yield path
            yield from _forbidden(v, path)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _forbidden(v, f"{prefix}[{i}]")


def validate_record(rec: dict) -> None:
    """Raise ValueError naming the first field that breaks the schema (module docstring)."""
    def need(cond, what):
        if not cond:
            raise ValueError(f"recorded result {rec.get('name', '?') if isinstance(rec, dict) else '?'!r}: {what}")

    need(isinstance(rec, dict), "must be a JSON object")
    need(rec.get("schema") == SCHEMA, f"'schema' must be {SCHEMA}, got {rec.get('schema')!r}")
    need(isinstance(rec.get("name"), str) and rec["name"], "'name' must be a non-empty string")
    try:
        _dt.date.fromisoformat(rec.get("recorded", ""))
    except (TypeError, ValueError):
        need(False, "'recorded' must be an ISO date (YYYY-MM-DD)")
    machine = rec.get("machine")
    need(isinstance(machine, dict), "'machine' must be an object (where it was measured, with versions)")
    for key in _MACHINE_STRINGS:
        need(isinstance(machine.get(key), str), f"machine.{key} must be a string")
    if machine["device"].startswith("cuda"):
        need(isinstance(machine.get("gpu"), str), "machine.gpu must name the GPU of a GPU record")
    timers = rec.get("timers")
    need(isinstance(timers, dict), "'timers' must be an object {timer: what it measures}")
    for t, what in timers.items():
        need(t in TIMER_NAMES, f"timers.{t}: unknown timer (known: {', '.join(TIMER_NAMES)})")
        need(isinstance(what, str) and what, f"timers.{t} must say what it measures")
    need(isinstance(rec.get("ceilings"), dict), "'ceilings' must be an object")
    for k, v in rec["ceilings"].items():
        need(isinstance(v, (int, float)) and v > 0, f"ceilings.{k} must be a positive number")
    results = rec.get("results")
    need(isinstance(results, dict), "'results' must be an object")
    allowed = "|".join(map(re.escape, timers)) or "(?!)"
    pattern = re.compile(rf"(^|_)({allowed})_us$")
    for path, key in time_keys(results):
        need(pattern.search(key), f"results.{path}: a time figure's key must end in _<timer>_us with its "
                                  f"timer among the record's timers ({', '.join(timers) or 'none'})")
    for path in _forbidden(results):
        need(False, f"results.{path}: timers are named once, in the record's 'timers', and by each "
                    "figure's key (_<timer>_us); the machine and versions live in 'machine'")


def carry_over(old: dict | None, keys, gpu: str | None) -> tuple[dict, dict]:
    """What a run that rewrites the record ``old`` (or None) on ``gpu`` keeps of it: (its tables named in ``keys``,
    its timers). Every such table when ``old`` was measured on the same GPU model; otherwise only the tables that
    name their own ``machine``: the others would sit under the new record's machine, which did not measure them."""
    if not old:
        return {}, {}
    same = old.get("machine", {}).get("gpu") == gpu
    kept = {k: v for k, v in old["results"].items()
            if k in keys and (same or (isinstance(v, dict) and isinstance(v.get("machine"), dict)))}
    return kept, (dict(old.get("timers", {})) if kept else {})


def recorded_label(rec: dict) -> str:
    """``recorded <date> on <GPU>, torch .., Triton .., CUDA ..``: the label of a recorded figure."""
    m = rec["machine"]
    where = m.get("gpu") or f"CPU ({m.get('cpu', '?')})"
    return (f"recorded {rec['recorded']} on {where}, torch {m['torch']}, Triton {m['triton']}"
            + (f", CUDA {m['cuda']}" if m.get("cuda") else ""))


def human_bytes(nbytes: float) -> str:
    """4096 -> '4 KiB': a size as the tables and plots print it."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    return f"{nbytes:g}"


def format_table(rows: list[dict], columns: list[tuple], title: str | None = None) -> str:
    """A plain-text table, the one every benchmark's ``table()`` prints: ``columns`` is a list of
    ``(header, key_or_function, format)``; a missing value (absent, None, or a string such as a
    capture failure) prints as ``-``."""
    def cell(row, get, fmt):
        v = get(row) if callable(get) else row.get(get)
        if v is None or isinstance(v, str) and fmt and not fmt.endswith("s"):
            return "-"
        try:
            return format(v, fmt) if fmt else str(v)
        except (TypeError, ValueError):
            return str(v)

    body = [[cell(r, get, fmt) for _, get, fmt in columns] for r in rows]
    heads = [h for h, _, _ in columns]
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(heads)]
    lines = [title] if title else []
    lines.append("  ".join(h.rjust(w) for h, w in zip(heads, widths)))
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)
