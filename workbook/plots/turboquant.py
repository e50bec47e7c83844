"""Notebook 04's pictures and displays: the rotation's effect on spiky keys, the Lloyd-Max centroids
under the coordinate density, one page of the
paged cache drawn to scale, and the recorded decode benchmark (``workbook/data/turboquant.json`` or a
live run of :mod:`workbook.benchmarks.turboquant`)."""
from __future__ import annotations

import math

import torch

from ..turboquant import coordinate_density, hadamard, lloyd_max_centroids, slot_bytes

__all__ = ["plot_rotation_histograms", "plot_centroids", "draw_cache_layout",
           "plot_benchmark"]

def plot_rotation_histograms(dim: int = 64, n: int = 2000, seed: int = 0):
    """Coordinates of spiky vectors (a few large channels, like real keys) before and after the
    Hadamard rotation, against the coordinate density of a random unit vector."""
    import matplotlib.pyplot as plt

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g) * 0.2
    x[:, :3] += torch.randn(n, 3, generator=g) * 4  # outlier channels
    u = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    y = u @ hadamard(dim)
    grid = torch.linspace(-1, 1, 801)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    for ax, data, title in ((axes[0], u, "unit keys, as they are"), (axes[1], y, "after the Hadamard rotation")):
        ax.hist(data.flatten().numpy(), bins=160, range=(-1, 1), density=True, color="#4C72B0", alpha=0.7,
                label="coordinates")
        ax.plot(grid.numpy(), coordinate_density(grid, dim).numpy(), "k-", lw=1,
                label=f"density of a random unit vector (d={dim})")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(-1, 1)
        ax.set_yscale("log")
        ax.set_ylim(1e-3, 30)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def plot_centroids(dim: int = 128, bits=(2, 3, 4)):
    import matplotlib.pyplot as plt

    s = 1 / math.sqrt(dim)
    grid = torch.linspace(-4.5 * s, 4.5 * s, 600)
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(grid.numpy(), coordinate_density(grid, dim).numpy(), "k-", lw=1)
    for i, b in enumerate(bits):
        c = lloyd_max_centroids(b, dim)
        ax.plot(c.numpy(), [-(i + 1) * 0.6] * len(c), "|", ms=14, mew=2, label=f"{b} bits: {len(c)} centroids")
    ax.set_xlabel(f"coordinate value (sigma = 1/sqrt({dim}) = {s:.4f})")
    ax.set_yticks([])
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("Lloyd-Max centroids under the coordinate density", fontsize=10)
    fig.tight_layout()
    return fig


def draw_cache_layout(head_dim: int = 128, block_size: int = 16):
    """One page of the cache for one KV head, bytes drawn to scale, and the block table."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    sb = slot_bytes(head_dim)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    parts = [("k_codes", head_dim // 2, "#4C72B0"), ("k_scale", 2, "#DD8452"), ("v_codes", head_dim // 2, "#55A868"),
             ("v_scale", 2, "#C44E52"), ("v_zero", 2, "#8172B3")]
    rows = 4
    for r in range(rows):
        x = 0
        for name, nb, col in parts:
            ax.add_patch(Rectangle((x, rows - r), nb, 0.8, color=col, alpha=0.85))
            if r == 0:
                ax.text(x + nb / 2, rows + 1.0, f"{name}\n{nb} B", ha="center", va="bottom", fontsize=8)
            x += nb + 3
        ax.text(-2, rows - r + 0.4, f"token {r}", ha="right", va="center", fontsize=8)
    ax.text(-2, 0.4, f"... {block_size} tokens per page", ha="right", fontsize=8)
    ax.text(0, -0.6, f"per (token, KV head): key {sb['key']} B + value {sb['value']} B = {sb['total']} B, vs bf16 "
                     f"{sb['bf16']} B ({sb['ratio']:.2f}x smaller). Byte j of a code row: coordinate 2j in the "
                     "low nibble, 2j+1 in the high nibble.", fontsize=8)
    ax.text(0, -1.4, "block_table[r] = [page ids]: position p of request r lives in page block_table[r][p // "
                     f"{block_size}], slot p % {block_size}; each array is [num_blocks, Hkv, {block_size}, ...]",
            fontsize=8)
    ax.set_xlim(-14, sum(p[1] + 3 for p in parts))
    ax.set_ylim(-1.8, rows + 2.2)
    ax.axis("off")
    ax.set_title(f"The 4bit_nc paged cache, one page of one KV head (D = {head_dim})", fontsize=10)
    fig.tight_layout()
    return fig


def plot_benchmark(rec: dict, label: str = ""):
    """Left: decode time (graph replay) ours vs SDPA per point. Right: speedup and read rates."""
    import matplotlib.pyplot as plt

    rows = [r for r in rec["results"]["shapes"] if "ours_graph_us" in r]
    names = [f"B{r['batch']}\n{r['context'] // 1024}k" for r in rows]
    idx = list(range(len(rows)))
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4))
    w = 0.27
    a.bar([i - w for i in idx], [r["sdpa_graph_us"] for r in rows], w, label="SDPA, bf16 cache")
    for j, (be, name) in enumerate((("triton", "Triton"), ("cuda", "CUDA C++"))):
        if any(f"{be}_best_graph_us" in r for r in rows):
            a.bar([i + j * w for i in idx], [r.get(f"{be}_best_graph_us", float("nan")) for r in rows], w,
                  label=f"TurboQuant 4bit_nc ({name})")
    if not any("triton_best_graph_us" in r or "cuda_best_graph_us" in r for r in rows):  # older records
        a.bar([i + w for i in idx], [r["ours_graph_us"] for r in rows], w, label="TurboQuant 4bit_nc")
    a.set_yscale("log")
    a.set_xticks(idx, names, fontsize=7)
    a.set_ylabel("GPU time per decode step [us]\n(CUDA-graph replay)")
    a.legend(fontsize=8)
    b.plot(idx, [r["speedup_vs_sdpa"] for r in rows], "o-", color="#D1495B", label="speedup vs SDPA (best kernel)")
    b.axhline(2.5, color="k", ls=":", lw=0.8, label="issue #15: 2.5x at 32k")
    b.axhline(3.0, color="k", ls="--", lw=0.8, label="issue #34: 3x at 32k and above, batch 8 and 32")
    b.axhline(1.0, color="k", lw=0.6)
    b2 = b.twinx()
    b2.plot(idx, [r["ours_read_TBps"] for r in rows], "s--", color="#4C9F70", label="ours (best): quantized bytes / time")
    b2.plot(idx, [r["sdpa_read_TBps"] for r in rows], "^--", color="#4C72B0", label="SDPA: bf16 bytes / time")
    b2.set_ylabel("TB/s read")
    b.set_xticks(idx, names, fontsize=7)
    b.set_ylabel("speedup")
    # headroom above both target lines and the read rates, for the legend
    b.set_ylim(0.8, 1.35 * max([3.0] + [r["speedup_vs_sdpa"] for r in rows]))
    b2.set_ylim(0, 1.35 * max(max(r["ours_read_TBps"], r["sdpa_read_TBps"]) for r in rows))
    h1, l1 = b.get_legend_handles_labels()
    h2, l2 = b2.get_legend_handles_labels()
    b.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    fig.suptitle(label, fontsize=9)
    fig.tight_layout()
    return fig
