"""Notebook 02's pictures (NVFP4): the two number formats, the swizzled 128x4 scale layout, and the
H200 records of :mod:`workbook.benchmarks.nvfp4` (bandwidth per size, the share of the copy ceiling
over (M, K), decode sizes, zeros vs empty). Each record plot takes a record (``records.load_record``,
or a live run's figures) and says which timer produced what it draws.
"""
from __future__ import annotations

from ..benchmarks.nvfp4 import TARGET_FRAC, TARGET_MIN_INPUT_BYTES, compiled_ref_timer
from ..nvfp4 import E2M1_VALUES, e4m3_grid, round_up, swizzle_offset

__all__ = ["plot_value_grids", "plot_swizzle", "plot_benchmark", "plot_heatmap", "plot_small_m",
           "plot_zeros_vs_empty", "peer_bytes_text"]


def plot_value_grids():
    """E2M1's 15 values with their decision points, and E4M3's non-negative values (log scale)."""
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 4.2))
    vals = sorted({s * v for v in E2M1_VALUES for s in (1, -1)})
    a1.scatter(vals, [0] * len(vals), color="#2E5EAA", zorder=3, s=28)
    for v in vals:
        a1.annotate(f"{v:g}", (v, 0), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    for t, strict in ((0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False), (5.0, True)):
        for s in (1, -1):
            a1.axvline(s * t, color="#D1495B" if strict else "#E8A33D", lw=0.8, ls="--")
    a1.set_yticks([])
    a1.set_xlim(-6.8, 6.8)
    a1.set_title("E2M1: 15 values (+0 and -0 share 0). Dashed: decision points; red ties round DOWN "
                 "in magnitude, orange ties UP (to the even code)", fontsize=9)
    g = e4m3_grid().numpy()[1:]
    sub = g < 2 ** -6
    a2.scatter(g[~sub], [0] * int((~sub).sum()), s=8, color="#2E5EAA", label="normal (8 per binade)")
    a2.scatter(g[sub], [0] * int(sub.sum()), s=8, color="#E8A33D", label="subnormal (multiples of 2^-9)")
    a2.set_xscale("log", base=2)
    a2.set_yticks([])
    a2.legend(fontsize=8, loc="upper left")
    a2.set_title("E4M3 (the block scale): 126 positive values from 2^-9 to 448, 3 mantissa bits: "
                 "relative step 1/8 to 1/16", fontsize=9)
    fig.tight_layout()
    return fig


def plot_swizzle(M: int = 200, n_cols: int = 6):
    """Left: the logical scale grid [M, K/16] inside its padded [Mp, Kp], cut into 128x4 tiles
    (storage order numbered). Right: the 512 bytes of one tile as 32 lines of 16 bytes, coloured by
    32-row slab: each line holds rows r, r+32, r+64, r+96."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    Mp, Kp = round_up(M, 128), round_up(n_cols, 4)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [1, 1.6]})
    r = np.arange(Mp)[:, None]
    c = np.arange(Kp)[None, :]
    tile = (r // 128) * (Kp // 4) + c // 4
    real = (r < M) & (c < n_cols)
    a1.imshow(np.where(real, tile % 2, 2 + tile % 2), cmap=ListedColormap(["#7FA7D9", "#2E5EAA", "#EEEEEE", "#D5D5D5"]),
              aspect="auto", interpolation="nearest")
    for t in range(int(tile.max()) + 1):
        rr, cc = (t // (Kp // 4)) * 128, (t % (Kp // 4)) * 4
        a1.text(cc + 1.5, rr + 64, f"tile {t}\nbytes {512 * t}..{512 * t + 511}", ha="center", va="center", fontsize=7)
    for y in range(0, Mp + 1, 128):
        a1.axhline(y - 0.5, color="k", lw=0.8)
    for x in range(0, Kp + 1, 4):
        a1.axvline(x - 0.5, color="k", lw=0.8)
    a1.set_title(f"logical scales [{M}, {n_cols}] (blue) in padded [{Mp}, {Kp}] (grey = padding)", fontsize=9)
    a1.set_xlabel("scale column c (one per 16 elements of K)")
    a1.set_ylabel("row r")
    lines = np.zeros((32, 16), dtype=int)
    labels = np.empty((32, 16), dtype=object)
    for rr in range(128):
        for cc in range(4):
            off = swizzle_offset(rr, cc, 4)
            lines[off // 16, off % 16] = rr // 32
            labels[off // 16, off % 16] = f"{rr},{cc}"
    a2.imshow(lines[:8], cmap=ListedColormap(["#2E5EAA", "#4C9F70", "#E8A33D", "#D1495B"]), aspect="auto")
    for i in range(8):
        for j in range(16):
            a2.text(j, i, labels[i, j], ha="center", va="center", fontsize=6, color="white")
    a2.set_xticks(range(16))
    a2.set_yticks(range(8))
    a2.set_xlabel("byte within the 16-byte line")
    a2.set_ylabel("line (= r % 32)")
    a2.set_title("tile 0 in memory, first 8 of 32 lines: labels 'r,c'; colour = slab (r % 128) // 32", fontsize=9)
    fig.tight_layout()
    return fig


def plot_benchmark(rec: dict, label: str = ""):
    """Achieved bandwidth of the Triton kernel and the compiled torch reference against the copy
    ceiling, per size, from the record's ``sizes`` rows; each line says which timer produced it (the
    Triton kernel: graph replay; the compiled reference: graph replay, or eager where its graph could
    not be captured, marked at the point)."""
    import matplotlib.pyplot as plt

    rows = rec["results"]["sizes"]
    ceiling = rec["ceilings"]["copy_GBps"]
    names = [f"{r['M']}x{r['K']}" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    xs = list(range(len(rows)))
    ref_t = sorted({compiled_ref_timer(r) for r in rows})
    ax.plot(xs, [r["triton_GBps"] / 1e3 for r in rows], "o-", label="Triton kernel (nvfp4_quant), timer: graph")
    ax.plot(xs, [r["compiled_ref_GBps"] / 1e3 for r in rows], "s-",
            label=f"torch.compile(quantize_ref), timer: {', '.join(ref_t)}")
    for i, r in enumerate(rows):        # a point timed eagerly (graph capture failed) is marked
        if compiled_ref_timer(r) != "graph":
            ax.annotate("eager", (i, r["compiled_ref_GBps"] / 1e3), textcoords="offset points",
                        xytext=(0, -12), ha="center", fontsize=7)
    ax.axhline(ceiling / 1e3, color="k", ls="--", lw=1, label=f"copy ceiling {ceiling / 1e3:.2f} TB/s")
    ax.axhline(TARGET_FRAC * ceiling / 1e3, color="grey", ls=":", lw=1,
               label=f"{100 * TARGET_FRAC:.0f}% of the ceiling (target for inputs >= 64 MiB)")
    ax.set_xticks(xs, names, rotation=30, fontsize=8)
    ax.set_ylabel("TB/s (bytes read + written)")
    ax.set_xlabel("M x K (bf16 input)")
    ax.set_title(label or "NVFP4 quantization, swizzled scales", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_heatmap(rec: dict, label: str = "", key: str = "heatmap"):
    """The share of the copy ceiling over (M, K), one panel per input dtype, from the record's
    ``key`` rows (``heatmap`` of nvfp4.json: the Triton launcher with the launch rule's tile;
    ``nvfp4_heatmap`` of cuda.json: the CUDA backend; GPU time from CUDA-graph replay). Each cell:
    the share in %, and below it what a device copy of the same bytes reaches at that size (same
    timer). Cells whose input is under 64 MiB are hatched: the issue's target covers inputs of 64 MiB
    or more."""
    import matplotlib.pyplot as plt
    import numpy as np

    heat = rec["results"][key]
    ks = sorted({r["K"] for r in heat})
    ms = sorted({r["M"] for r in heat})
    dtypes = sorted({r["dtype"] for r in heat})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.2 * len(dtypes), 5.0), squeeze=False, layout="constrained")
    for ax, dt in zip(axes[0], dtypes):
        grid = np.full((len(ms), len(ks)), np.nan)
        cell = {}
        for r in heat:
            if r["dtype"] == dt:
                grid[ms.index(r["M"]), ks.index(r["K"])] = 100 * r["frac_of_copy"]
                cell[(r["M"], r["K"])] = r
        im = ax.imshow(grid, cmap="RdYlGn", vmin=40, vmax=100, aspect="auto", origin="lower")
        for (m, k), r in cell.items():
            i, j = ms.index(m), ks.index(k)
            ax.text(j, i + 0.12, f"{100 * r['frac_of_copy']:.0f}%", ha="center", va="center", fontsize=8,
                    fontweight="bold" if r["input_bytes"] >= TARGET_MIN_INPUT_BYTES else "normal")
            ax.text(j, i - 0.25, f"copy {100 * r['frac_of_copy'] / r['frac_of_same_size_copy']:.0f}%",
                    ha="center", va="center", fontsize=6, color="#333333")
            if r["input_bytes"] < TARGET_MIN_INPUT_BYTES:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", lw=0,
                                           edgecolor="#888888"))
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_yticks(range(len(ms)), [str(m) for m in ms])
        ax.set_xlabel("K")
        ax.set_ylabel("M")
        ax.set_title(f"{dt} input", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="% of the copy ceiling (GPU time, graph replay)")
    fig.suptitle((label + "\n" if label else "") + "% of the copy ceiling (bold: input >= 64 MiB; hatched: "
                 "smaller). Small print: a device copy of the same bytes at that size, same ceiling", fontsize=8)
    return fig


def plot_small_m(rec: dict, label: str = ""):
    """Decode sizes: the quant call's GPU time beside an empty kernel's, both replayed from a CUDA
    graph (the floor of any launch), from the record's ``small_m``."""
    import matplotlib.pyplot as plt
    import numpy as np

    sm = rec["results"]["small_m"]
    rows = sm["rows"]
    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.bar(xs, [r["graph_us"] for r in rows], 0.6, color="#2E5EAA", label="nvfp4_quant (GPU time, graph replay)")
    ax.axhline(sm["empty_kernel_graph_us"], color="#D1495B", ls="--", lw=1.2,
               label=f"an empty kernel, same timer: {sm['empty_kernel_graph_us']:.2f} us")
    for i, r in enumerate(rows):
        ax.text(i, r["graph_us"] * 1.02, f"{r['graph_us']:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [f"M={r['M']}\nK={r['K']}" for r in rows], fontsize=7)
    ax.set_ylabel("us per call")
    ax.set_ylim(0, max(r["graph_us"] for r in rows) * 1.25)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(label or "NVFP4 at decode sizes: GPU time against the floor of a launch", fontsize=9)
    fig.tight_layout()
    return fig


def plot_zeros_vs_empty(rec: dict, label: str = ""):
    """Time of a full quant call with the scale buffer from torch.zeros vs torch.empty (eager do_bench,
    and replayed from a CUDA graph), per M; log scale, zeros/empty ratio above each pair. The legend
    sits below the panels, never over a ratio."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows = rec["results"]["zeros_vs_empty"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    top = 0.0
    for ax, mode in zip(axes, ("eager", "graph")):
        xs = np.arange(len(rows))
        z = [r[f"zeros_{mode}_us"] for r in rows]
        e = [r[f"empty_{mode}_us"] for r in rows]
        ax.bar(xs - 0.2, z, 0.4, label="scales = torch.zeros", color="#D1495B")
        ax.bar(xs + 0.2, e, 0.4, label="scales = torch.empty", color="#4C9F70")
        for i in range(len(rows)):
            ax.text(i, max(z[i], e[i]) * 1.15, f"{z[i] / e[i]:.2f}x", ha="center", fontsize=8)
        top = max(top, max(z + e))
        ax.set_yscale("log")
        ax.set_xticks(xs, [f"M={r['M']}\nK={r['K']}" for r in rows], fontsize=8)
        ax.set_title("timer: eager (do_bench), host work included" if mode == "eager"
                     else "timer: replayed from a CUDA graph (GPU time)", fontsize=9)
    axes[0].set_ylim(top=top * 2.5)                       # room for the ratio labels
    axes[0].set_ylabel("us per quant call (log)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    if label:
        fig.suptitle(label, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def peer_bytes_text(p: dict, label: str) -> str:
    """One comparison of ``measure_peer_bytes`` (benchmarks/nvfp4.py) as text, one line per input: the
    share of equal scale and code bytes, which side is exactly rounded at each differing scale, and how
    close to an E2M1 threshold the codes that differ under an equal scale sit."""
    lines = [f"{label}: ours = {p['ours']} on {p['device']}; peer = {p['peer']}"]
    for r in p["rows"]:
        dist = r["max_rel_distance_to_threshold"]
        lines.append(
            f"  {r['input']:<18} seed {r['seed']}: scale bytes equal {100 * r['scale_bytes_equal'] / r['scale_bytes']:6.2f}% "
            f"({r['scale_bytes'] - r['scale_bytes_equal']} differ; exactly rounded there: ours "
            f"{r['scales_differing_ours_exact']}, torchao for its own scale {r['scales_differing_peer_exact_own_scale']}); "
            f"code bytes equal {100 * r['code_bytes_equal'] / r['code_bytes']:6.2f}%, codes differing under an equal "
            f"scale {r['codes_differing_same_scale']}" + ("" if dist is None else
                                                          f", each within {dist:.1e} (relative) of an E2M1 threshold"))
    return "\n".join(lines)
