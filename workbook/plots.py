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

__all__ = ["coverage_map", "COVERAGE_COLORS", "sweep_plot", "graph_plot", "bandwidth_plot"]

# written / unwritten outside the view / unwritten INSIDE the view (a bug)
COVERAGE_COLORS = ("#4C9F70", "#C9C9C9", "#D1495B")


def coverage_map(cov: Coverage, ax=None, title: str | None = None, tile: tuple[int, int] | None = None):
    """Draw the whole storage of one output: green = written, grey = never written but outside the
    view, red = never written although inside the view. ``tile=(rows, cols)`` draws tile borders
    (e.g. (128, 4) for the swizzled NVFP4 scales)."""
    w = cov.written
    grid = w if w.dim() == 2 else w.view(1, -1)
    inside = cov.in_view if w.dim() == 2 else cov.in_view.view(1, -1)
    code = np.where(grid.numpy(), 0, np.where(inside.numpy(), 2, 1))
    if ax is None:
        h = min(6.0, max(1.6, 0.9 + 4.0 * code.shape[0] / max(code.shape[1], 1)))
        _, ax = plt.subplots(figsize=(7, h))
    ax.imshow(code, cmap=ListedColormap(COVERAGE_COLORS), vmin=0, vmax=2, aspect="auto",
              interpolation="nearest")
    if tile:
        for r in range(0, code.shape[0] + 1, tile[0]):
            ax.axhline(r - 0.5, color="k", lw=0.6)
        for c in range(0, code.shape[1] + 1, tile[1]):
            ax.axvline(c - 0.5, color="k", lw=0.6)
    ax.set_xlabel("storage column")
    ax.set_ylabel("storage row")
    n_bug = int(cov.unwritten_in_view.sum())
    ax.set_title(title or f"{cov.name}: storage {list(cov.storage_shape)}, view {list(cov.view_shape)}"
                 + (f", {n_bug} unwritten in view" if n_bug else ""), fontsize=10)
    ax.legend(handles=[Patch(color=COVERAGE_COLORS[0], label="written"),
                       Patch(color=COVERAGE_COLORS[1], label="unwritten, outside view"),
                       Patch(color=COVERAGE_COLORS[2], label="unwritten, INSIDE view")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax
