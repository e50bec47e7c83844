"""Pictures shared by the notebooks: coverage maps and GPU measurements (live or recorded)."""
from __future__ import annotations

import matplotlib

if matplotlib.get_backend().lower() in ("", "agg") and "ipykernel" not in __import__("sys").modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from .coverage import Coverage  # noqa: E402

__all__ = ["coverage_map", "COVERAGE_COLORS", "human_bytes", "sweep_plot", "graph_plot", "bandwidth_plot", "source_of", "show_code"]

# written / unwritten outside the view / unwritten INSIDE the view (a bug) / read before written
COVERAGE_COLORS = ("#4C9F70", "#C9C9C9", "#D1495B", "#7B3294")


def coverage_map(cov: Coverage, ax=None, title: str | None = None, tile: tuple[int, int] | None = None):
    """Draw the whole storage of one output: green = written, grey = never written but outside the
    view, red = never written although inside the view, purple = read before written (accumulated
    into: the value depends on what the buffer held). ``tile=(rows, cols)`` draws tile borders
    (e.g. (128, 4) for the swizzled NVFP4 scales)."""
    w = cov.written
    as2d = (lambda m: m) if w.dim() == 2 else (lambda m: m.reshape(1, -1))
    grid, inside = as2d(w).numpy(), as2d(cov.in_view).numpy()
    acc = as2d(cov.read_before_written | cov.nondeterministic).numpy()
    code = np.where(grid, 0, np.where(acc, 3, np.where(inside, 2, 1)))
    if ax is None:
        h = min(6.0, max(1.6, 0.9 + 4.0 * code.shape[0] / max(code.shape[1], 1)))
        _, ax = plt.subplots(figsize=(7, h))
    ax.imshow(code, cmap=ListedColormap(COVERAGE_COLORS), vmin=0, vmax=3, aspect="auto",
              interpolation="nearest")
    if tile:
        for r in range(0, code.shape[0] + 1, tile[0]):
            ax.axhline(r - 0.5, color="k", lw=0.6)
        for c in range(0, code.shape[1] + 1, tile[1]):
            ax.axvline(c - 0.5, color="k", lw=0.6)
    ax.set_xlabel("storage column")
    ax.set_ylabel("storage row")
    n_bug = int((cov.unwritten_in_view & ~cov.read_before_written).sum())
    n_acc = int(cov.read_before_written.sum())
    ax.set_title(title or f"{cov.name}: storage {list(cov.storage_shape)}, view {list(cov.view_shape)}"
                 + (f", {n_bug} unwritten in view" if n_bug else "")
                 + (f", {n_acc} read before written" if n_acc else ""), fontsize=10)
    handles = [Patch(color=COVERAGE_COLORS[0], label="written"),
               Patch(color=COVERAGE_COLORS[1], label="unwritten, outside view"),
               Patch(color=COVERAGE_COLORS[2], label="unwritten, INSIDE view")]
    if acc.any():
        handles.append(Patch(color=COVERAGE_COLORS[3], label="read before written\n(accumulated into)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax


def _label(rec: dict, live: bool) -> str:
    from .bench import recorded_label

    return ("measured live: " if live else "") + recorded_label(rec)


def human_bytes(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    return f"{nbytes:g}"


def sweep_plot(rec: dict, live: bool = False):
    """Left: time per call of zeros/empty alone and followed by a full overwrite. Right: the cost of
    zeros in the allocate-then-overwrite pattern, as zeros+overwrite / empty+overwrite."""
    rows = rec["results"]["sweep"]
    x = np.array([r["bytes"] for r in rows])
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for key, style, lab in (("zeros_us", "o-", "torch.zeros"), ("empty_us", "s-", "torch.empty"),
                            ("zeros_overwrite_us", "o--", "zeros + overwrite"),
                            ("empty_overwrite_us", "s--", "empty + overwrite")):
        a.loglog(x, [r[key] for r in rows], style, label=lab)
    a.set_xlabel("buffer size")
    a.set_ylabel("eager do_bench median per call [us]")
    a.set_xticks(x[::2], [human_bytes(v) for v in x[::2]])
    a.legend(fontsize=8)
    a.grid(True, which="both", alpha=0.3)
    ratio = [r["overwrite_ratio"] for r in rows]
    b.semilogx(x, ratio, "o-", color="#D1495B", label="eager (do_bench)")
    for xi, ri in zip(x, ratio):
        b.annotate(f"{ri:.2f}x", (xi, ri), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    top = max(ratio)
    if all("overwrite_graph_ratio" in r for r in rows):
        g = [r["overwrite_graph_ratio"] for r in rows]
        b.semilogx(x, g, "s--", color="#4C9F70", label="graph replay (GPU time)")
        top = max(top, max(g))
    else:
        b.text(0.01, 0.97, "graph-replay figures: not recorded yet", transform=b.transAxes, fontsize=7, va="top")
    b.legend(fontsize=8, loc="lower right")
    b.axhline(1.0, color="k", lw=0.8)
    b.set_xticks(x[::2], [human_bytes(v) for v in x[::2]])
    b.set_ylim(0.9, top * 1.15)
    b.set_xlabel("buffer size")
    b.set_ylabel("(zeros + overwrite) / (empty + overwrite)")
    b.grid(True, which="both", alpha=0.3)
    fig.suptitle(_label(rec, live), fontsize=9)
    fig.tight_layout()
    return fig


def bandwidth_plot(rec: dict, live: bool = False):
    """Bandwidth of the zero fill (``zero_()``, eager do_bench median) per dtype against the measured
    device-to-device copy ceiling. A record without per-dtype figures shows float32 only and says so."""
    from .bench import FILL_DTYPES, NotRecorded, fill_sweep

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
        ax.semilogx([r["bytes"] for r in fr], [r["GBps"] / 1e3 for r in fr], style, ms=4,
                    label=f"zero_() {name}: bytes written / time")
    ax.semilogx(x, [r["bytes"] / (r["zeros_us"] * 1e-6) / 1e12 for r in rows], "k--", lw=0.8,
                label="torch.zeros() float32: bytes / (host + launch + fill)")
    ax.axhline(copy / 1e3, color="k", ls=":", label=f"copy ceiling {copy / 1e3:.2f} TB/s (read + write)")
    if missing:
        ax.text(0.01, 0.97, "not recorded yet: " + ", ".join(missing), transform=ax.transAxes, fontsize=7,
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
    vals = [g["zeros_us"], g["empty_us"]]
    ax.barh(["zeros", "empty"], vals, color=["#D1495B", "#4C9F70"])
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.1f} us", va="center", fontsize=9)
    ax.set_xlim(0, max(vals) * 1.25)
    ax.set_xlabel(f"graph replay, {g['n_buffers']} buffers of {human_bytes(g['buffer_bytes'])} [us]")
    ax.set_title(_label(rec, live), fontsize=9)
    fig.tight_layout()
    return fig


def source_of(obj) -> str:
    """Source text of a function, a ``@triton.jit`` kernel (compiled or interpreted) or an autotuned
    kernel: ``inspect.getsource`` cannot see through Triton's wrappers."""
    import inspect

    fn = obj
    while not (inspect.isfunction(fn) or inspect.isclass(fn) or inspect.ismodule(fn)) and hasattr(fn, "fn"):
        fn = fn.fn
    return inspect.getsource(fn)


def show_code(*objs):
    """Display the source of kernels/launchers in a notebook (one source of truth, never pasted)."""
    from IPython.display import Code

    return Code("\n\n".join(source_of(o) for o in objs), language="python")
