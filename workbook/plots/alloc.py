"""Notebook 01's pictures of the alloc record (:mod:`workbook.benchmarks.alloc`): the zeros-vs-empty
sweep, the fill's bandwidth per dtype against the copy ceiling, and the decode-like CUDA graph. Each
takes a record, recorded (``workbook/data/alloc.json``) or just measured
(:func:`workbook.records.as_record` of a live run, ``live=True``), and says which in its title."""
from __future__ import annotations

import numpy as np

from ..alloc import FILL_DTYPES
from ..benchmarks.alloc import fill_sweep
from ..records import NotRecorded, recorded_label
from .common import human_bytes, plt

__all__ = ["sweep_plot", "bandwidth_plot", "graph_plot"]


def _label(rec: dict, live: bool) -> str:
    return ("measured live: " if live else "") + recorded_label(rec)


def sweep_plot(rec: dict, live: bool = False):
    """Left: time per call of zeros/empty alone and followed by a full overwrite (eager). Right: the
    cost of zeros in the allocate-then-overwrite pattern, as zeros+overwrite / empty+overwrite, eager
    and from graph replay."""
    rows = rec["results"]["sweep"]
    x = np.array([r["bytes"] for r in rows])
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for key, style, lab in (("zeros_eager_us", "o-", "torch.zeros"), ("empty_eager_us", "s-", "torch.empty"),
                            ("zeros_overwrite_eager_us", "o--", "zeros + overwrite"),
                            ("empty_overwrite_eager_us", "s--", "empty + overwrite")):
        a.loglog(x, [r[key] for r in rows], style, label=lab)
    a.set_xlabel("buffer size")
    a.set_ylabel("eager do_bench median per call [us]")
    a.set_xticks(x[::2], [human_bytes(v) for v in x[::2]])
    a.legend(fontsize=8)
    a.grid(True, which="both", alpha=0.3)
    ratio = [r["overwrite_eager_ratio"] for r in rows]
    b.semilogx(x, ratio, "o-", color="#D1495B", label="eager (do_bench)")
    for xi, ri in zip(x, ratio):
        b.annotate(f"{ri:.2f}x", (xi, ri), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    g = [r["overwrite_graph_ratio"] for r in rows]
    b.semilogx(x, g, "s--", color="#4C9F70", label="graph replay (GPU time)")
    b.legend(fontsize=8, loc="lower right")
    b.axhline(1.0, color="k", lw=0.8)
    b.set_xticks(x[::2], [human_bytes(v) for v in x[::2]])
    b.set_ylim(0.9, max(max(ratio), max(g)) * 1.15)
    b.set_xlabel("buffer size")
    b.set_ylabel("(zeros + overwrite) / (empty + overwrite)")
    b.grid(True, which="both", alpha=0.3)
    fig.suptitle(_label(rec, live), fontsize=9)
    fig.tight_layout()
    return fig


def bandwidth_plot(rec: dict, live: bool = False):
    """Bandwidth of the zero fill (``zero_()``, eager do_bench median) per dtype against the measured
    device-to-device copy ceiling; a dtype the record lacks is named as not recorded."""
    rows = rec["results"]["sweep"]
    x = np.array([r["bytes"] for r in rows])
    copy = rec["ceilings"]["copy_GBps"]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    missing = []
    for name, style in zip(FILL_DTYPES, ("o-", "v-", "s-", "^-", "D-", "P-")):
        try:
            fr = fill_sweep(rec, name)
        except NotRecorded:
            missing.append(name)
            continue
        ax.semilogx([r["bytes"] for r in fr], [r["eager_GBps"] / 1e3 for r in fr], style, ms=4,
                    label=f"zero_() {name}: bytes written / time")
    ax.semilogx(x, [r["bytes"] / (r["zeros_eager_us"] * 1e-6) / 1e12 for r in rows], "k--", lw=0.8,
                label="torch.zeros() float32: bytes / (host + launch + fill)")
    ax.axhline(copy / 1e3, color="k", ls=":", label=f"copy ceiling {copy / 1e3:.2f} TB/s (read + write)")
    if missing:
        ax.text(0.01, 0.97, "not recorded: " + ", ".join(missing), transform=ax.transAxes, fontsize=7,
                va="top", color="#7B3294")
    ax.set_xticks(x[::2], [human_bytes(v) for v in x[::2]])
    ax.set_xlabel("buffer size")
    ax.set_ylabel("TB/s (eager do_bench median)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(_label(rec, live), fontsize=9)
    fig.tight_layout()
    return fig


def graph_plot(rec: dict, live: bool = False):
    """One CUDA-graph replay of a decode-like step, zeros vs empty."""
    g = rec["results"]["graph"]
    fig, ax = plt.subplots(figsize=(6, 2.6))
    vals = [g["zeros_graph_us"], g["empty_graph_us"]]
    ax.barh(["zeros", "empty"], vals, color=["#D1495B", "#4C9F70"])
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.1f} us", va="center", fontsize=9)
    ax.set_xlim(0, max(vals) * 1.25)
    ax.set_xlabel(f"graph replay, {g['n_buffers']} buffers of {human_bytes(g['buffer_bytes'])} [us]")
    ax.set_title(_label(rec, live), fontsize=9)
    fig.tight_layout()
    return fig
