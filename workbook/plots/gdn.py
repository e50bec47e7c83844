"""The pictures of notebook 05 (Gated DeltaNet): one head's state matrix as a heat map, and the
recorded benchmark (ours vs flash-linear-attention, GPU time from CUDA-graph replay beside eager
per-call time) as bars. The record's text is :func:`workbook.benchmarks.gdn.table`."""
from __future__ import annotations

import torch

__all__ = ["plot_state", "plot_benchmark"]


def plot_state(h: torch.Tensor, ax=None, title="state h (K x V)"):
    """Heat map of one head's state matrix."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4, 3.4))
    hm = h.detach().float().cpu()
    lim = float(hm.abs().max()) or 1.0
    im = ax.imshow(hm, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    ax.set_xlabel("value channel")
    ax.set_ylabel("key channel")
    ax.set_title(title, fontsize=10)
    ax.figure.colorbar(im, ax=ax, fraction=0.046)
    return ax


def _row_name(x: dict) -> str:
    if "l2norm_in_kernel" not in x:
        return f"decode B{x['B']} H{x['H']}"
    return ((f"varlen N{len(x['cu_seqlens']) - 1}" if x.get("cu_seqlens") else f"chunk B{x['B']}")
            + f" T{x['T']} H{x['H']}/{x.get('HV', x['H'])}" + (" +l2" if x["l2norm_in_kernel"] else ""))


def plot_benchmark(rec: dict, label: str = ""):
    """Bars: ours vs flash-linear-attention per shape, GPU time from CUDA-graph replay (solid) and
    eager per-call time (hatched), from a record (or a benchmark's Measurement). Returns None (and
    draws nothing) for a record without graph-replay times (a capture that failed counts as timed:
    its bar is missing)."""
    import matplotlib.pyplot as plt

    r = rec.results if hasattr(rec, "results") else rec["results"] if "results" in rec else rec
    if not (r.get("chunk") and any(k.startswith("ours_graph_") for k in r["chunk"][0])):
        return None
    rows = r["chunk"] + r["decode"]
    names = [_row_name(x) for x in rows]
    num = lambda t: t if isinstance(t, (int, float)) else float("nan")  # noqa: E731
    fig, ax = plt.subplots(figsize=(10, 3.8))
    w = 0.2
    series = [("ours", "graph", "#2E5EAA", None, "this workbook, GPU time (graph replay)"),
              ("fla", "graph", "#E8A33D", None, f"flash-linear-attention {r.get('fla_version', '')}, GPU time"),
              ("ours", "eager", "#2E5EAA", "//", "this workbook, eager per call"),
              ("fla", "eager", "#E8A33D", "//", "flash-linear-attention, eager per call")]
    for j, (who, m, color, hatch, lab) in enumerate(series):
        vals = [num(x.get(f"{who}_{m}_us")) for x in rows]
        ax.bar([i + (j - 1.5) * w for i in range(len(rows))], vals, w, color=color, hatch=hatch,
               edgecolor="white" if hatch else None, alpha=0.55 if hatch else 1.0, label=lab)
    ax.set_xticks(list(range(len(rows))))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("time per call (us, log scale)")
    ax.set_yscale("log")
    ax.set_title(label or "Gated DeltaNet on the GPU", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return ax
