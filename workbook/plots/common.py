"""Pictures every topic uses: coverage maps, size sweeps, bandwidth against the copy ceiling, code."""
from __future__ import annotations

import matplotlib

if matplotlib.get_backend().lower() in ("", "agg") and "ipykernel" not in __import__("sys").modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ..coverage import Coverage  # noqa: E402
from ..records import human_bytes  # noqa: E402,F401  (re-exported: the notebooks label sizes with it)

__all__ = ["coverage_map", "COVERAGE_COLORS", "human_bytes", "source_of", "show_code"]

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
