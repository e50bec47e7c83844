"""Notebook 06's pictures and displays: the data path of an all-reduce site in a post-grad graph
(:func:`site_chain`, :func:`plot_site`), excerpts of the code Inductor generates (:func:`code_excerpt`,
:func:`kernel_names`, :func:`kernel_after`, :func:`kernel_source`; the NaN it puts in rows that nothing
wrote: :func:`nan_fill_kernels`, :func:`nan_fill_excerpt`), and readings of the recorded
benchmark (``workbook/data/fusion.json``, written by :mod:`workbook.benchmarks.fusion`):
:func:`load_timings`, the per-kernel table of one step (:func:`kernel_table`) and what the pass changes
at the attention sites (:func:`site_costs`), the two-GPU one-shot sweep (:func:`oneshot_table`).
Nothing here measures."""
from __future__ import annotations

import re

import torch

from ..records import load_record

__all__ = [
    "site_chain", "plot_site", "code_excerpt", "kernel_names", "kernel_after", "kernel_source", "nan_fill_kernels",
    "nan_fill_excerpt", "load_timings", "kernel_table", "site_costs", "oneshot_table",
]

# --------------------------------------------------------------------------------------------------
# Post-grad graphs and Inductor's output code
# --------------------------------------------------------------------------------------------------

_BREAKERS = ("slice_scatter", "copy_", "copy", "slice")


def _name(n) -> str:
    if n.op != "call_function":
        return n.op if n.op == "output" else str(n.name)
    return getattr(n.target, "__name__", str(n.target)).split(".")[0]


def site_chain(graph: torch.fx.Graph, start: str = "all_reduce", which: int = 0, steps: int = 9) -> list:
    """The data path from the ``which``-th node named ``start`` (``all_reduce`` or
    ``fused_all_reduce_add_rmsnorm``) forward: at each step the first user in graph order, ``steps``
    nodes at most. Returns ``[(node name, op name, [side inputs' names], [other users' op names])]``."""
    nodes = [n for n in graph.nodes if _name(n) == start]
    if len(nodes) <= which:
        raise ValueError(f"the graph has {len(nodes)} {start} node(s), asked for number {which}")
    n, chain = nodes[which], []
    while n is not None and len(chain) < steps:
        prev = chain[-1][0] if chain else None
        side = [_name(a) if a.op == "call_function" else a.name for a in n.all_input_nodes if a.name != prev]
        users = sorted(n.users, key=lambda u: list(graph.nodes).index(u))
        chain.append((n.name, _name(n), side, [_name(u) for u in users[1:]]))
        n = users[0] if users and users[0].op != "output" else None
    return chain


def plot_site(graph: torch.fx.Graph, ax, title: str, start: str = "all_reduce", which: int = 0, steps: int = 9):
    """Draw :func:`site_chain` top to bottom: the chain's ops in boxes, side inputs to the left;
    nodes that break the pattern (``slice_scatter``, ``copy_``, ``slice``) in red, the all-reduce in
    blue, the fused op in green."""
    chain = site_chain(graph, start, which, steps)
    colors = {"all_reduce": "#9ecae1", "fused_all_reduce_add_rmsnorm": "#a1d99b"}
    ax.set_xlim(0, 10)
    ax.set_ylim(-len(chain) - 0.5, 0.8)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    for i, (_, op, side, others) in enumerate(chain):
        y = -i
        face = "#fb6a4a" if op in _BREAKERS else colors.get(op, "#f0f0f0")
        label = op if len(op) <= 18 else op[:op.index("_", len(op) // 2 - 3) + 1] + "\n" + op[op.index("_", len(op) // 2 - 3) + 1:]
        ax.text(6.2, y, label, ha="center", va="center", fontsize=9, family="monospace",
                bbox=dict(boxstyle="round,pad=0.3", fc=face, ec="black", lw=0.8))
        if side:
            label = ", ".join(s if len(s) < 18 else s[:16] + ".." for s in side[:2])
            ax.text(2.2, y, label, ha="center", va="center", fontsize=7.5, family="monospace", color="#444")
            ax.annotate("", xy=(4.5, y), xytext=(3.9, y), arrowprops=dict(arrowstyle="->", color="#888", lw=0.8))
        for j, o in enumerate(o for o in others if o in _BREAKERS):   # e.g. the copy_ back into an input
            ax.text(9.3, y - 0.35 * j, o, ha="center", va="center", fontsize=8, family="monospace",
                    bbox=dict(boxstyle="round,pad=0.2", fc="#fb6a4a", ec="black", lw=0.6))
            ax.annotate("", xy=(8.6, y - 0.35 * j), xytext=(7.6, y), arrowprops=dict(arrowstyle="->", lw=0.7))
        if i:
            ax.annotate("", xy=(6.2, y + 0.28), xytext=(6.2, y + 0.72), arrowprops=dict(arrowstyle="->", lw=0.9))
    return ax


def code_excerpt(code: str, needle: str, before: int = 1, after: int = 6, limit: int = 1) -> str:
    """The lines around the first ``limit`` occurrences of ``needle`` in Inductor's output code."""
    lines = code.splitlines()
    hits = [i for i, s in enumerate(lines) if needle in s][:limit]
    parts = []
    for i in hits:
        parts.append("\n".join(lines[max(0, i - before): i + after + 1]))
    return "\n    ...\n".join(parts) if parts else f"(no line with {needle!r})"


def kernel_names(code: str, contains: str = "") -> list[str]:
    """Names of the kernels defined in Inductor's output code (``name = async_compile.<lang>(...)``,
    C++ on a CPU, Triton on a GPU), those whose name contains ``contains``. Inductor names a fused
    kernel after the ops it fused (``..._add_mean_mul_pow_rsqrt_slice_scatter_3``)."""
    names = re.findall(r"^(\w+) = async_compile\.\w+\(", code, flags=re.M)
    return [n for n in names if contains in n]


def kernel_after(code: str, needle: str) -> str:
    """The first kernel (of :func:`kernel_names`) that the output code calls after the line with ``needle``."""
    names = set(kernel_names(code))
    lines = code.splitlines()
    start = next((i for i, s in enumerate(lines) if needle in s), None)
    if start is None:
        raise ValueError(f"no line with {needle!r} in this code")
    for s in lines[start + 1:]:
        call = s.strip().split("(")[0]
        call = call[:-len(".run")] if call.endswith(".run") else call   # Triton kernels: name.run(...)
        if call in names:
            return call
    raise ValueError(f"no kernel is called after {needle!r}")


def kernel_source(code: str, name: str, lines: int = 30) -> str:
    """The first ``lines`` lines of kernel ``name``'s definition in Inductor's output code."""
    src = code.splitlines()
    for i, s in enumerate(src):
        if s.startswith(f"{name} = async_compile."):
            return "\n".join(src[i: i + lines])
    raise ValueError(f"no kernel {name!r} in this code")


# a NaN constant in Inductor's kernels: Triton `tl.full([..], float("nan"), ..)`, C++ `quiet_NaN()`
_NAN = re.compile(r'float\("nan"\)|quiet_NaN\(\)')
_ASSIGN = re.compile(r"^\s*(?:auto\s+)?(tmp\d+)\s*=")
_END = "'" * 3          # the end of a kernel's source string in the output code


def _kernel_body(code: str, name: str) -> list[str]:
    """The lines of kernel ``name``'s definition, up to the end of its source string."""
    src = code.splitlines()
    start = next((i for i, s in enumerate(src) if s.startswith(f"{name} = async_compile.")), None)
    if start is None:
        raise ValueError(f"no kernel {name!r} in this code")
    end = next((i for i in range(start + 1, len(src)) if src[i].lstrip().startswith(_END)), len(src))
    return src[start: end + 1]


def nan_fill_kernels(code: str) -> list[str]:
    """Names of the kernels (of :func:`kernel_names`) whose source holds a NaN constant: where a fused
    kernel reads rows of an ``empty`` buffer that nothing wrote, Inductor puts a constant in place of
    the load (NaN for floats)."""
    return [n for n in kernel_names(code) if any(_NAN.search(s) for s in _kernel_body(code, n))]


def nan_fill_excerpt(code: str, name: str) -> str:
    """The lines of kernel ``name`` that choose, per row, between a loaded value and NaN: from the row
    index (``tmp0 = x0``, compared with ``num_tokens``, a size argument ``ks..``) through the NaN
    constant to the select that uses it (``tl.where`` in Triton, ``blendv`` in the CPU's C++). The first
    such place only (a C++ kernel repeats it in each of its loops)."""
    body = _kernel_body(code, name)
    i = next((k for k, s in enumerate(body) if _NAN.search(s)), None)
    if i is None:
        raise ValueError(f"kernel {name!r} holds no NaN constant")
    m = _ASSIGN.match(body[i])
    derived, j = ({m.group(1)} if m else set()), i
    for k in range(i + 1, len(body)):
        if any(re.search(rf"\b{v}\b", body[k]) for v in derived):
            j = k
            if "where" in body[k] or "blendv" in body[k]:
                break
            a = _ASSIGN.match(body[k])
            if a:
                derived.add(a.group(1))
    start = next((k for k in range(i, -1, -1) if re.search(r"=\s*x\d+;?\s*$", body[k])), max(0, i - 3))
    lines = body[start: j + 1]
    indent = min(len(s) - len(s.lstrip()) for s in lines if s.strip())
    return "\n".join(s[indent:] for s in lines)


# --------------------------------------------------------------------------------------------------
# The recorded benchmark
# --------------------------------------------------------------------------------------------------

def load_timings():
    """The recorded H200 results (``workbook/data/fusion.json``) or None."""
    try:
        return load_record("fusion")
    except FileNotFoundError:
        return None


def _size_row(block: dict, T: int) -> dict:
    for r in block["sizes"]:
        if r["T_pad"] == T:
            return r
    raise ValueError(f"no size T_pad={T} in this record (sizes {[r['T_pad'] for r in block['sizes']]})")


def kernel_table(block: dict, T: int) -> str:
    """Text table of one recorded step (``block``: ``tp1`` or ``tp2`` of fusion.json, ``T``: T_pad):
    per kernel group (:data:`workbook.benchmarks.fusion.KERNEL_GROUPS`) and style, kernels per step
    and their GPU time (profiler, around graph replay), then the totals and the graph-replay time of
    the step."""
    row = _size_row(block, T)
    ks = {s: row[s]["kernels"] for s in ("buffer", "return")}
    groups = list(ks["buffer"]["groups"]) + [g for g in ks["return"]["groups"] if g not in ks["buffer"]["groups"]]
    out = [f"{'kernel group':34s} | {'buffer: n':>9s} {'us':>9s} | {'return: n':>9s} {'us':>9s}"]
    for g in groups:
        cells = []
        for s in ("buffer", "return"):
            v = ks[s]["groups"].get(g, {"calls": 0, "profiler_us": 0.0})
            cells.append(f"{v['calls']:9.0f} {v['profiler_us']:9.1f}")
        out.append(f"{g:34s} | {cells[0]} | {cells[1]}")
    out.append(f"{'all kernels (sum of GPU times)':34s} | " + " | ".join(
        f"{ks[s]['kernels_per_step']:9.0f} {ks[s]['kernel_profiler_us']:9.1f}" for s in ("buffer", "return")))
    if all("graph_us" in row[s] for s in ("buffer", "return")):
        out.append(f"{'step, CUDA-graph replay':34s} | " + " | ".join(
            f"{'':9s} {row[s]['graph_us']:9.1f}" for s in ("buffer", "return")))
    return "\n".join(out)


def site_costs(block: dict, T: int) -> dict:
    """What the pass changes at the attention sites, from one recorded step's kernel groups (us per
    step unless named per site): the buffer style runs Inductor's own fused kernel there (slice_scatter
    + add + RMSNorm; the other Inductor norm kernels, e.g. the gated norms, are the same in both styles,
    so the difference between the styles is these sites), the return style our add+RMSNorm kernel; the
    all-reduce runs in both. Keys: ``sites``, ``inductor_per_site_us``, ``ours_per_site_us``,
    ``nccl_us`` (per style; 0 with one rank, where the all-reduce op is a copy), ``kernel_us`` and
    ``graph_us`` (per style), ``other_us`` (per style: all kernels minus the norms and NCCL),
    ``inductor_norm_us`` (per style) and ``comparable``: False when the per-site figures cannot be read
    off the difference because Inductor fused the rest of the step differently in the two styles."""
    row = _size_row(block, T)
    sites = block["passes"]["return"]["expected"]["attention"]
    if not sites:
        raise ValueError("this record has no attention sites that the return style fuses")

    def us(style, group):
        return row[style]["kernels"]["groups"].get(group, {}).get("profiler_us", 0.0)

    ind, ours, nccl = "Inductor: norm kernels", "fused add+RMSNorm (ours)", "all-reduce (NCCL)"
    inductor_per_site = (us("buffer", ind) - us("return", ind)) / sites
    calls = {s: row[s]["kernels"]["groups"].get(ind, {}).get("calls", 0) for s in ("buffer", "return")}
    return {
        "sites": sites,
        # the subtraction isolates the sites only when Inductor fused everything else alike: exactly
        # `sites` norm kernels more in the buffer style, and a positive difference (at prefill Inductor
        # may fold other work, e.g. the gated norm's gate, into different kernels in the two styles)
        "comparable": inductor_per_site > 0 and calls["buffer"] - calls["return"] == sites,
        "inductor_norm_us": {s: us(s, ind) for s in ("buffer", "return")},
        "inductor_per_site_us": inductor_per_site,
        "ours_per_site_us": (us("return", ours) - us("buffer", ours)) / sites,
        "nccl_us": {s: us(s, nccl) for s in ("buffer", "return")},
        "kernel_us": {s: row[s]["kernels"]["kernel_profiler_us"] for s in ("buffer", "return")},
        "graph_us": {s: row[s].get("graph_us") for s in ("buffer", "return")},
        "other_us": {s: row[s]["kernels"]["kernel_profiler_us"] - us(s, ind) - us(s, ours) - us(s, nccl)
                     for s in ("buffer", "return")},
    }


ONESHOT_HOW = ("torchrun --nproc-per-node 2 -m workbook.benchmarks.fusion --out tp2.json on two GPUs, then "
               "WORKBOOK_FUSION_TP2=tp2.json python3 -m workbook bench fusion")


def oneshot_table(rec: dict | None) -> str:
    """The one-shot sweep of the record's TP=2 block (``results["tp2"]["oneshot"]``, written by
    :func:`workbook.benchmarks.fusion.oneshot_sweep`): per hidden size and token count, GPU time from
    graph replay and eager time of the one-shot op and of NCCL + add_rmsnorm, their ratio, and whether
    they gave the same bits; or a line saying that two-GPU figures do not exist yet."""
    res = (rec or {}).get("results", {})
    block = (res.get("tp2") or res.get("oneshot_tp2") or {}).get("oneshot")     # oneshot_tp2: --oneshot alone
    if not block or not block.get("sizes"):
        return f"two-GPU one-shot figures: not recorded yet ({ONESHOT_HOW})"
    out = [f"TP={block['world_size']}, {block['dtype']}, multicast {block['multicast']}, provisional switch at "
           f"{block['oneshot_max_bytes']} bytes per rank",
           f"{'hidden':>6s} {'tokens':>6s} | {'one-shot graph':>14s} {'NCCL+norm graph':>15s} {'ratio':>6s} | "
           f"{'one-shot eager':>14s} {'NCCL+norm eager':>15s} | same bits"]
    for r in block["sizes"]:
        a, b = r["oneshot"], r["nccl"]
        ga, gb = a.get("graph_us"), b.get("graph_us")
        ratio = f"{gb / ga:5.2f}x" if ga and gb else "   n/a"
        g = f"{ga:12.1f}us {gb:13.1f}us" if ga and gb else f"{'(no graph time)':>29s}"
        out.append(f"{r['hidden']:6d} {r['tokens']:6d} | {g} {ratio} | {a['eager_us']:12.1f}us "
                   f"{b['eager_us']:13.1f}us | {r['same_bits']}")
    return "\n".join(out)
