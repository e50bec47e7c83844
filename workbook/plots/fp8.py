"""Notebook 03's pictures: the packed word, the MN-major scale layout, and the recorded benchmark
(GPU time and achieved bandwidth per peer, from ``workbook/data/fp8.json`` or a live run of
:mod:`workbook.benchmarks.fp8`)."""
from __future__ import annotations

from ..fp8 import num_packed_words, tma_aligned_rows

__all__ = ["plot_bandwidth", "plot_packing", "plot_mn_major_layout"]

_PEER_STYLE = {
    "fused_triton": ("fused Triton kernel", "#2E6FBA", "o"),
    "fused_integer_roundings": ("same, integer roundings on the GPU", "#8FB8E8", "."),
    "torch_compile": ("torch.compile(reference)", "#E08E2B", "s"),
    "unfused": ("unfused: torch silu-mul + quant kernel", "#7A9E3B", "^"),
    "torch_eager": ("eager torch reference", "#9A9A9A", "v"),
}


def plot_bandwidth(rec: dict, title: str | None = None):
    """Left: GPU time per call against M (log-log; CUDA-graph replay). Right: achieved GB/s (fewest-bytes model)
    against M, with the copy ceiling and 80% of it. Returns the figure."""
    import matplotlib.pyplot as plt

    rows = rec["results"]["rows"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.3))
    ms = [r["M"] for r in rows]
    for key, (label, color, marker) in _PEER_STYLE.items():
        if f"{key}_GBps" not in rows[0]:
            continue
        ls = ":" if key == "fused_integer_roundings" else "-"
        # a peer that could not be captured in a CUDA graph has no GPU time at that M (a gap)
        a.plot(ms, [r.get(f"{key}_graph_us", float("nan")) for r in rows], marker=marker, color=color, ls=ls,
               label=label)
        b.plot(ms, [r[f"{key}_GBps"] for r in rows], marker=marker, color=color, ls=ls, label=label)
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_ylabel("GPU time per call [us] (CUDA graph)")
    ceiling = rec["ceilings"].get("copy_GBps")
    if ceiling:
        lines = [b.axhline(ceiling, color="k", ls="--", lw=1, label=f"device copy {ceiling / 1000:.2f} TB/s"),
                 b.axhline(0.8 * ceiling, color="k", ls=":", lw=1, label="80% of copy")]
        b.legend(handles=lines, fontsize=8, loc="upper left")
    b.set_xscale("log", base=2)
    b.set_ylabel("GB/s (x read once, codes + scales written once)")
    for ax in (a, b):
        ax.set_xlabel(f"M (tokens), N = {rows[0]['N']}")
        ax.grid(alpha=0.3, which="both")
    a.legend(fontsize=8, loc="upper left")
    fig.suptitle(title or "SiLU-mul + FP8 group quant, packed UE8M0 scales", fontsize=9)
    fig.tight_layout()
    return fig


def plot_packing(exp_bytes=(0x78, 0x7A, 0x5E, 0x81), ax=None):
    """One int32 word: exponent bytes of groups 4p..4p+3 at bits 0-7, 8-15, 16-23, 24-31."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.2))
    colors = ["#4C78A8", "#F58518", "#54A24B", "#B279A2"]
    word = 0
    for j, b in enumerate(exp_bytes):
        word |= (b & 0xFF) << (8 * j)
        x0 = 3 - j  # most significant byte drawn on the left
        ax.add_patch(Rectangle((x0, 0), 1, 1, color=colors[j], alpha=0.85))
        e = b - 127
        ax.text(x0 + 0.5, 0.62, f"group 4p+{j}", ha="center", va="center", fontsize=9, color="w")
        ax.text(x0 + 0.5, 0.32, f"0x{b:02X}  (s = 2^{e})", ha="center", va="center", fontsize=9, color="w")
        ax.text(x0 + 0.5, -0.18, f"bits {8 * j + 7}..{8 * j}", ha="center", va="center", fontsize=8)
    signed = word - (1 << 32) if word >= 1 << 31 else word
    ax.set_title(f"one packed word = 0x{word:08X} (int32 {signed}); memory order (little-endian): "
                 + " ".join(f"{b:02X}" for b in exp_bytes), fontsize=9)
    ax.set_xlim(-0.05, 4.05)
    ax.set_ylim(-0.35, 1.05)
    ax.axis("off")
    return ax


def plot_mn_major_layout(m: int = 5, num_groups: int = 10, ax=None):
    """The storage [P, round_up(M, 4)] with each cell's address; the view [M, P] is its transpose's
    first M rows. Grey cells: storage rows M..round_up(M,4)-1 (outside the view)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    p, tm = num_packed_words(num_groups), tma_aligned_rows(m)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * tm + 2, 0.75 * p + 1.4))
    for r in range(p):
        for c in range(tm):
            inside = c < m
            ax.add_patch(Rectangle((c, p - 1 - r), 1, 1, facecolor="#9ECAE1" if inside else "#DDDDDD",
                                   edgecolor="w", lw=2))
            label = f"@{r * tm + c}\nview[{c},{r}]" if inside else f"@{r * tm + c}\npad"
            ax.text(c + 0.5, p - 0.5 - r, label, ha="center", va="center", fontsize=7.5)
    ax.set_xlim(0, tm)
    ax.set_ylim(0, p)
    ax.set_xticks([c + 0.5 for c in range(tm)], [str(c) for c in range(tm)])
    ax.set_yticks([p - 0.5 - r for r in range(p)], [f"word {r}" for r in range(p)])
    ax.set_xlabel(f"token m (storage column); round_up(M={m}, 4) = {tm}")
    ax.set_title(f"scale storage int32 [{p}, {tm}] (address @ in words); view = storage.T[:{m}, :], "
                 f"strides (1, {tm})", fontsize=9)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    return ax
