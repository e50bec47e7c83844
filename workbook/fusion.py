"""How buffer passing blocks ``torch.compile`` fusion: a mini Qwen3-Next decoder in two styles, a
tensor-parallel all-reduce as a custom op, an Inductor post-grad pattern pass that fuses
all-reduce -> residual add -> RMSNorm, and the fused add + RMSNorm kernel it calls.

The two styles compute the same function on the real tokens of a batch padded to a fixed size (as an
engine pads for CUDA graphs: ``hidden [T_pad, D]``, of which the first ``num_tokens`` rows are real):

* ``style="buffer"``: the layer allocates ``output = torch.empty_like(x)`` and each attention block
  writes ``output[:num_tokens] = all_reduce(out_proj(...))``. In the functionalised post-grad graph
  that slice write is a ``slice_scatter`` between the all-reduce and the residual add, so the pattern
  all_reduce -> add -> RMSNorm is not there to match: ``Replaced 0 patterns``.
* ``style="return"``: each attention block returns ``all_reduce(out_proj(...))`` over the padded batch
  (the attention is causal and the padding comes last, so the real rows are unchanged); the add
  consumes the all-reduce directly and every attention-output site matches.

All-reduce sites and what the pass does with them (the accounting):

* the attention out projections (one per layer): row-parallel, end in ``workbook::all_reduce``, then
  the post-attention residual add + RMSNorm. These are the sites of the headline: 0 (buffer) vs one
  per layer (return). The demo decoder has 2 layers (one linear-attention, one full-attention), hence
  ``Replaced 0 patterns`` then ``Replaced 2 patterns``.
* the MLP down projections: with ``shard_mlp=False`` (the demo's default) the MLP is replicated on
  every rank, so it has NO all-reduce and no site at all. With ``shard_mlp=True`` (what an engine does
  at scale, and what the benchmark runs) the down projection is row-parallel too and its all-reduce is
  followed by the next residual add + RMSNorm (the next layer's input norm, or the final norm): one
  more site per layer, returned by the MLP in BOTH styles, so both styles gain one match per layer
  (0 + L vs L + L). :func:`expected_sites` states the counts.

The decoder's linear-attention layers compute :func:`workbook.gdn.qwen3_next_linear_attention` on this
rank's heads (a test checks it): projections, causal conv, gates and gated RMSNorm in torch ops that
Inductor compiles, and the recurrence of notebook 05 in one opaque custom op (:func:`gdn_core`), as
engines register their GDN attention core; the full-attention layers are a small causal attention
written with visible torch ops.

Tensor parallelism: ``world_size`` ranks each hold a slice of the heads (and, with ``shard_mlp``, of
the MLP's intermediate columns); row-parallel projections produce partial sums that
``workbook::all_reduce`` adds up with ``torch.distributed`` (gloo on CPU, NCCL on GPUs). With one rank
it is the identity, but it stays in the graph as the same op, so the pass sees the same sites.
Within one host the fused op can also do the communication itself: :func:`enable_oneshot` registers
a one-shot exchange (peer-accessible buffers in symmetric memory, NVLink multicast off) and small
messages then take :func:`oneshot_all_reduce_add_rmsnorm`, one kernel that pushes this rank's partial
sums to every peer, waits for theirs (a sentinel says "not arrived"), adds the residual and normalises.
:func:`run_tp` runs the ranks as spawned CPU processes; the GPU benchmark (one GPU, and two under
``torchrun``), the notebook's pictures and its displays of the record live in
:mod:`workbook.benchmarks.fusion` and :mod:`workbook.plots.fusion`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .device import (DEVICE, ON_GPU, cdiv, check_tensor, next_pow2, require_launchable, resolve_config,
                     resolve_emulate, sm_count)
from .gdn import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, naive_recurrent_gated_delta_rule
from .kernels import fusion as kern

__all__ = [
    "EPS", "CONFIG", "EMULATE_WHY", "DecoderConfig", "DEMO", "SMOKE", "DECODER_VERSION", "rmsnorm", "add_rmsnorm",
    "add_rmsnorm_ref", "all_reduce", "fused_all_reduce_add_rmsnorm", "gdn_core", "GDN_RECURRENT_MAX_T",
    "make_decoder_weights", "shard_weights", "MiniDecoder", "expected_sites", "FusionPass", "compile_decoder",
    "count_ops", "run_tp", "logger",
]

EPS = 1e-6
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# add_rmsnorm's launch configuration; None = the launch rule of add_rmsnorm, per M and D
CONFIG = {"BLOCK_M": None, "num_warps": None}
EMULATE_WHY = "it runs the hardware bf16 casts, which Triton's interpreter gets wrong"
logger = logging.getLogger("workbook.fusion")

# --------------------------------------------------------------------------------------------------
# RMSNorm: the torch form (what the pattern matches) and the fused add + RMSNorm kernel
# --------------------------------------------------------------------------------------------------


def rmsnorm(h: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """weight * h * rsqrt(mean(h^2) + eps) over the last dim, fp32 inside, h's dtype out."""
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(h.dtype)


def add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = EPS):
    """The unfused chain: ``h = x + residual`` (in the tensors' dtype), ``rmsnorm(h)``; returns
    ``(normed, h)``."""
    h = x + residual
    return rmsnorm(h, weight, eps), h


def _check_add_rmsnorm(x, residual, weight, eps, device=None):
    check_tensor("x", x, dtypes=_FLOATS, ndim=2, device=device)
    check_tensor("residual", residual, dtypes=_FLOATS, ndim=2, device=x.device)
    check_tensor("weight", weight, dtypes=_FLOATS, ndim=1, device=x.device)
    if residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {list(x.shape)}, got {list(residual.shape)}")
    if residual.dtype != x.dtype or weight.dtype != x.dtype:
        raise TypeError(f"x, residual and weight must share one dtype, got {x.dtype}, {residual.dtype}, "
                        f"{weight.dtype}")
    if weight.shape[0] != x.shape[1] or x.shape[1] == 0:
        raise ValueError(f"weight must be [D] with D = x.shape[1] = {x.shape[1]} > 0, got {list(weight.shape)}")
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = EPS, *,
                config=None, emulate: bool | None = None):
    """Residual add + RMSNorm in one Triton kernel. ``x, residual [M, D]``, ``weight [D]``.
    Returns ``(normed [M, D], new_residual [M, D])`` = :func:`add_rmsnorm_ref`.

    ``config``: names as in :data:`CONFIG` (``BLOCK_M``: rows per program, ``num_warps``; None or left
    out: the launch rule below, per M and D). ``emulate``: exact bf16 conversions with integer ops
    (default: on without a GPU, where the interpreter runs the kernel; :data:`EMULATE_WHY`)."""
    _check_add_rmsnorm(x, residual, weight, eps, device=DEVICE)
    emulate = resolve_emulate(emulate, EMULATE_WHY)
    M, D = x.shape
    BLOCK_D = next_pow2(D)
    cfg = resolve_config(config, CONFIG, pow2=("BLOCK_M", "num_warps"))
    if cfg["BLOCK_M"] is None:
        # GPU: one row per program for decode-sized batches (more programs in flight: the kernel is all
        # latency there), a few rows per program above; the interpreter runs programs one after
        # another: fewer, taller ones
        cfg["BLOCK_M"] = (1 if M < 1024 else max(1, min(16, 4096 // BLOCK_D))) if ON_GPU else 64
    if cfg["num_warps"] is None:
        cfg["num_warps"] = 4 if BLOCK_D <= 2048 else 8
    # empty, both: program i writes rows [i*BLOCK_M, (i+1)*BLOCK_M) x all D columns of out and of
    # residual_out (masked only past M and D), and the grid cdiv(M, BLOCK_M) covers all M rows.
    out = torch.empty_like(x)
    residual_out = torch.empty_like(x)
    require_launchable(kern.add_rmsnorm_kernel)
    if M:
        kern.add_rmsnorm_kernel[(cdiv(M, cfg["BLOCK_M"]),)](
            x, residual, weight, out, residual_out, M, D, float(eps), BLOCK_M=cfg["BLOCK_M"],
            BLOCK_D=BLOCK_D, IS_BF16=x.dtype == torch.bfloat16, EMULATE=bool(emulate),
            num_warps=cfg["num_warps"])
    return out, residual_out


# --------------------------------------------------------------------------------------------------
# Custom ops: the all-reduce, the GDN block, the fused op
# --------------------------------------------------------------------------------------------------

_TRACING_PATTERN = [False]   # set while register_replacement traces the pattern on example tensors


def _world() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@torch.library.custom_op("workbook::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel ranks (``torch.distributed.all_reduce``); the identity with
    one rank. Always a new tensor (a custom op may not return an alias of its input)."""
    out = x.clone()
    if _world() > 1 and not _TRACING_PATTERN[0]:
        import torch.distributed as dist
        dist.all_reduce(out)
    return out


@all_reduce.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("workbook::fused_all_reduce_add_rmsnorm", mutates_args=())
def fused_all_reduce_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What the pass puts in place of all_reduce -> add -> RMSNorm, returning ``(normed, new_residual)``:
    with a one-shot exchange registered (:func:`enable_oneshot`) and a message up to
    :data:`ONESHOT_MAX_BYTES`, ONE kernel that also does the communication
    (:func:`oneshot_all_reduce_add_rmsnorm`); otherwise the all-reduce (NCCL, gloo on a CPU), then ONE
    kernel (:func:`add_rmsnorm`, Triton; in the interpreter on a CPU)."""
    ex = _oneshot_for(x)
    if ex is not None:
        return oneshot_all_reduce_add_rmsnorm(ex, x.contiguous(), residual.contiguous(), weight.contiguous(), eps)
    return add_rmsnorm(all_reduce(x).contiguous(), residual.contiguous(), weight.contiguous(), eps)


@fused_all_reduce_add_rmsnorm.register_fake
def _(x, residual, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


# 'auto': the delta rule's recurrent kernel (notebook 05's decode path, token by token) up to this
# many tokens, the chunked kernel (chunks of 64, three launches) above. Measured on the H200 (fusion.json,
# "gdn_core"): the chunked kernels cost about the same from 8 to 64 tokens, the recurrent kernel grows
# with the tokens; they cross between 16 and 64.
GDN_RECURRENT_MAX_T = 16


@torch.library.custom_op("workbook::gdn_core", mutates_args=())
def gdn_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             kernel: str) -> torch.Tensor:
    """The Gated DeltaNet recurrence of notebook 05 on one sequence: ``q, k [T, Hk, Dk]``,
    ``v [T, Hv, Dv]``, ``g`` (fp32), ``beta [T, Hv]`` -> ``o [T, Hv, Dv]``, q and k L2-normalised in the
    kernel. ``kernel``: 'chunk' (:func:`workbook.gdn.chunk_gated_delta_rule`), 'recurrent'
    (:func:`workbook.gdn.fused_recurrent_gated_delta_rule`), 'auto' (recurrent up to
    :data:`GDN_RECURRENT_MAX_T` tokens, chunk above) or 'reference' (the fp32 naive recurrence).
    Opaque to the compiler (its Triton launches are not traced), as an engine registers its GDN
    attention core."""
    if kernel == "auto":
        kernel = "recurrent" if q.shape[0] <= GDN_RECURRENT_MAX_T else "chunk"
    q, k, v, g, beta = (t.contiguous()[None] for t in (q, k, v, g, beta))
    if kernel == "reference":
        o, _ = naive_recurrent_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        return o[0].to(v.dtype)
    fn = chunk_gated_delta_rule if kernel == "chunk" else fused_recurrent_gated_delta_rule
    o, _ = fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    return o[0]


@gdn_core.register_fake
def _(q, k, v, g, beta, kernel):
    return torch.empty_like(v)


# --------------------------------------------------------------------------------------------------
# The mini decoder
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecoderConfig:
    """Sizes of the mini decoder. ``layers``: 'linear' (Gated DeltaNet) or 'full' (causal attention)
    per layer (Qwen3-Next alternates 3 linear : 1 full). Head counts are totals over all ranks and
    must divide by the tensor-parallel world size."""
    hidden: int = 64
    layers: tuple = ("linear", "full")
    gdn_k_heads: int = 2
    gdn_v_heads: int = 4
    gdn_head_dim: int = 16
    attn_heads: int = 4
    attn_head_dim: int = 16
    intermediate: int = 96
    shard_mlp: bool = False
    gdn_kernel: str = "auto"
    dtype: torch.dtype = torch.float32


# The demo: 2 layers (one linear-attention, one full-attention), hidden 64. Without a GPU its Gated
# DeltaNet runs the recurrent Triton kernel (in the interpreter, the fastest of the three paths there).
DEMO = DecoderConfig(gdn_kernel="auto" if ON_GPU else "recurrent")
# Tensor-parallel checks on the CPU (spawned ranks, gloo): the MLP sharded too, and the GDN block on
# workbook.gdn's fp32 reference path (pure torch: the spawned processes stay fast).
SMOKE = replace(DEMO, shard_mlp=True, gdn_kernel="auto" if ON_GPU else "reference")
# The decoder's version, written into every benchmark record (workbook.benchmarks.fusion): bump it when
# MiniDecoder computes differently. 1 = before the profile-driven fixes (SDPA on 3-D tensors, the whole
# GDN block one opaque op, the chunked GDN kernel at every size); 2 = this code.
DECODER_VERSION = 2


def make_decoder_weights(cfg: DecoderConfig, seed: int = 0, device=None) -> dict:
    """Full (unsharded) random weights: ``{"layers": [dict per layer], "final_norm": [D]}``."""
    gen = torch.Generator().manual_seed(seed)
    dev = device or DEVICE
    D = cfg.hidden

    def r(*s, std=1.0):
        return (torch.randn(*s, generator=gen) * std).to(dtype=cfg.dtype, device=dev)

    def norm_w():
        return (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype=cfg.dtype, device=dev)

    layers = []
    for kind in cfg.layers:
        w = {"kind": kind, "input_norm": norm_w(), "post_norm": norm_w()}
        if kind == "linear":
            Hk, Hv, Dh = cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
            nk, nv = Hk * Dh, Hv * Dh
            w.update(in_proj_qkvz=r(2 * nk + 2 * nv, D, std=D ** -0.5), in_proj_ba=r(2 * Hv, D, std=D ** -0.5),
                     conv_weight=r(2 * nk + nv, 4, std=0.5),
                     A_log=(torch.rand(Hv, generator=gen) * 2 - 1).to(device=dev),
                     dt_bias=torch.rand(Hv, generator=gen).to(device=dev),
                     norm_weight=(1 + 0.1 * torch.randn(Dh, generator=gen)).to(dtype=cfg.dtype, device=dev),
                     out_proj=r(D, nv, std=nv ** -0.5))
        elif kind == "full":
            n = cfg.attn_heads * cfg.attn_head_dim
            w.update(wq=r(n, D, std=D ** -0.5), wk=r(n, D, std=D ** -0.5), wv=r(n, D, std=D ** -0.5),
                     wo=r(D, n, std=n ** -0.5))
        else:
            raise ValueError(f"layers must hold 'linear' or 'full', got {kind!r}")
        I = cfg.intermediate
        w.update(gate_up=r(2 * I, D, std=D ** -0.5), down=r(D, I, std=I ** -0.5))
        layers.append(w)
    return {"layers": layers, "final_norm": norm_w()}


def _split(t, dim, parts, rank, sizes):
    """Rank ``rank``'s share of each consecutive segment (of the given sizes) of ``t`` along ``dim``."""
    out, start = [], 0
    for s in sizes:
        seg = t.narrow(dim, start, s)
        out.append(seg.narrow(dim, rank * (s // parts), s // parts))
        start += s
    return torch.cat(out, dim).contiguous()


def shard_weights(cfg: DecoderConfig, weights: dict, rank: int, world_size: int) -> dict:
    """Rank ``rank``'s weights: column-parallel input projections and row-parallel output projections
    (heads split; with ``shard_mlp`` the MLP's intermediate columns too). Norms are replicated."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    for name in ("gdn_k_heads", "gdn_v_heads", "attn_heads") + (("intermediate",) if cfg.shard_mlp else ()):
        if getattr(cfg, name) % world_size:
            raise ValueError(f"{name}={getattr(cfg, name)} must be divisible by world_size={world_size}")
    W = world_size
    layers = []
    for w in weights["layers"]:
        s = {"kind": w["kind"], "input_norm": w["input_norm"], "post_norm": w["post_norm"]}
        if w["kind"] == "linear":
            nk, nv, Hv = cfg.gdn_k_heads * cfg.gdn_head_dim, cfg.gdn_v_heads * cfg.gdn_head_dim, cfg.gdn_v_heads
            s.update(in_proj_qkvz=_split(w["in_proj_qkvz"], 0, W, rank, [nk, nk, nv, nv]),
                     in_proj_ba=_split(w["in_proj_ba"], 0, W, rank, [Hv, Hv]),
                     conv_weight=_split(w["conv_weight"], 0, W, rank, [nk, nk, nv]),
                     A_log=_split(w["A_log"], 0, W, rank, [Hv]), dt_bias=_split(w["dt_bias"], 0, W, rank, [Hv]),
                     norm_weight=w["norm_weight"], out_proj=_split(w["out_proj"], 1, W, rank, [nv]))
        else:
            n = cfg.attn_heads * cfg.attn_head_dim
            s.update(wq=_split(w["wq"], 0, W, rank, [n]), wk=_split(w["wk"], 0, W, rank, [n]),
                     wv=_split(w["wv"], 0, W, rank, [n]), wo=_split(w["wo"], 1, W, rank, [n]))
        I = cfg.intermediate
        if cfg.shard_mlp:
            s.update(gate_up=_split(w["gate_up"], 0, W, rank, [I, I]), down=_split(w["down"], 1, W, rank, [I]))
        else:
            s.update(gate_up=w["gate_up"], down=w["down"])
        layers.append(s)
    return {"layers": layers, "final_norm": weights["final_norm"]}


class MiniDecoder(torch.nn.Module):
    """A few Qwen3-Next-style decoder layers on one padded batch ``hidden [T_pad, D]`` whose first
    ``num_tokens`` rows are real tokens of one sequence. ``style``: 'buffer' or 'return' (module doc).
    Built from this rank's weights (:func:`shard_weights`); ``world_size`` ranks sum their partial
    out projections with :func:`all_reduce`. Returns ``[T_pad, D]``; only rows ``[:num_tokens]`` are
    defined, and a caller keeps only those (with ``style='buffer'`` the others are undefined: eager, whatever
    the unwritten buffer rows held; compiled by Inductor, NaN)."""

    def __init__(self, cfg: DecoderConfig, weights: dict, style: str, world_size: int = 1):
        super().__init__()
        if style not in ("buffer", "return"):
            raise ValueError(f"style must be 'buffer' or 'return', got {style!r}")
        if cfg.gdn_kernel not in ("auto", "chunk", "recurrent", "reference"):
            raise ValueError(f"gdn_kernel must be 'auto', 'chunk', 'recurrent' or 'reference', got {cfg.gdn_kernel!r}")
        self.cfg, self.style, self.world_size = cfg, style, world_size
        self.kinds = [w["kind"] for w in weights["layers"]]
        self.layers = torch.nn.ModuleList()
        for w in weights["layers"]:
            m = torch.nn.Module()
            for name, t in w.items():
                if name != "kind":
                    m.register_buffer(name, t)
            self.layers.append(m)
        self.register_buffer("final_norm", weights["final_norm"])

    # the attention blocks: each computes this rank's partial out projection, then the all-reduce
    def _linear_attention(self, m, x):
        """A Qwen3-Next linear-attention (Gated DeltaNet) block on this rank's heads: the function of
        :func:`workbook.gdn.qwen3_next_linear_attention`, with everything but the recurrence written in
        torch ops that Inductor compiles and fuses (projections, causal depthwise conv + SiLU, gates,
        gated RMSNorm, out projection); the recurrence is the opaque :func:`gdn_core`."""
        c, W = self.cfg, self.world_size
        Hk, Hv, Dk, Dv = c.gdn_k_heads // W, c.gdn_v_heads // W, c.gdn_head_dim, c.gdn_head_dim
        nk, nv, T = Hk * Dk, Hv * Dv, x.shape[0]
        qkv, z = (x @ m.in_proj_qkvz.T).split([2 * nk + nv, nv], dim=-1)
        b, a = (x @ m.in_proj_ba.T).float().split(Hv, dim=-1)
        # causal depthwise conv1d (kernel kc, fp32 accumulation) + SiLU as kc shifted multiply-adds:
        # one fused elementwise kernel instead of a convolution call and its layout copies
        kc = m.conv_weight.shape[1]
        xp = F.pad(qkv.float(), (0, 0, kc - 1, 0))        # kc - 1 zero rows before the first token
        wc = m.conv_weight.float()
        qkv = F.silu(sum(xp[j: j + T] * wc[:, j] for j in range(kc))).to(x.dtype)
        q, k = qkv[:, :nk].reshape(T, Hk, Dk), qkv[:, nk: 2 * nk].reshape(T, Hk, Dk)
        v = qkv[:, 2 * nk:].reshape(T, Hv, Dv)
        g = -m.A_log.float().exp() * F.softplus(a + m.dt_bias.float())
        beta = torch.sigmoid(b).to(x.dtype)
        o = gdn_core(q, k, v, g, beta, c.gdn_kernel).float()
        # gated RMSNorm per head (RMSNormGated), fp32 inside
        y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS) * m.norm_weight.float()
        y = (y * F.silu(z.reshape(T, Hv, Dv).float())).to(x.dtype)
        return y.reshape(T, nv) @ m.out_proj.T

    def _full_attention(self, m, x):
        T, H, Dh = x.shape[0], self.cfg.attn_heads // self.world_size, self.cfg.attn_head_dim
        # [1, H, T, Dh]: four dimensions, as the fused attention kernels (flash, cuDNN) require; with
        # three, SDPA falls back to its math path and materialises the T x T scores
        q, k, v = ((x @ w.T).view(1, T, H, Dh).transpose(1, 2) for w in (m.wq, m.wk, m.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(T, H * Dh) @ m.wo.T

    def _attention(self, kind, m, x, num_tokens):
        block = self._linear_attention if kind == "linear" else self._full_attention
        if self.style == "buffer":
            # the engine's layer: a caller-owned output buffer, written on the real tokens only.
            # empty: rows [num_tokens:] stay unwritten. Their consumers (the residual add, the RMSNorms, the
            # MLP) are row-wise and read them only into padding rows; attention runs on the real rows and is
            # causal; the forward's kept result is rows [:num_tokens]. Compiled, Inductor fills these rows with
            # NaN; test_buffer_padding_rows_never_reach_real_rows poisons them two ways.
            # audit: ok -- no consumer reads rows [num_tokens:] into a kept result: only row-wise and causal ops read them, and the forward keeps rows [:num_tokens] (notebook 06)
            output = torch.empty_like(x)
            output[:num_tokens] = all_reduce(block(m, x[:num_tokens]))
            return output
        # return style: the block runs over the padded batch (causal, padding last: the real rows
        # are the same) and returns its output
        return all_reduce(block(m, x))

    def _mlp(self, m, x):
        gu = x @ m.gate_up.T
        g, u = gu.chunk(2, dim=-1)
        y = (F.silu(g) * u) @ m.down.T
        return all_reduce(y) if self.cfg.shard_mlp else y

    def forward(self, hidden: torch.Tensor, num_tokens: int) -> torch.Tensor:
        check_tensor("hidden", hidden, dtypes=(self.cfg.dtype,), ndim=2, device=self.final_norm.device)
        if hidden.shape[1] != self.cfg.hidden:
            raise ValueError(f"hidden must be [T_pad, {self.cfg.hidden}], got {list(hidden.shape)}")
        if not (isinstance(num_tokens, int) and 1 <= num_tokens <= hidden.shape[0]):
            raise ValueError(f"num_tokens must be an int in [1, T_pad = {hidden.shape[0]}] (the real tokens "
                             f"of the padded batch), got {num_tokens!r}")
        residual = hidden
        x = rmsnorm(hidden, self.layers[0].input_norm)
        mlp_out = None
        for kind, m in zip(self.kinds, self.layers):
            if mlp_out is not None:      # the previous MLP's output joins the residual stream
                residual = mlp_out + residual
                x = rmsnorm(residual, m.input_norm)
            a = self._attention(kind, m, x, num_tokens)
            residual = a + residual      # the site: all_reduce -> add -> RMSNorm
            x = rmsnorm(residual, m.post_norm)
            mlp_out = self._mlp(m, x)
        return rmsnorm(mlp_out + residual, self.final_norm)


def expected_sites(cfg: DecoderConfig, style: str) -> dict:
    """Where the pattern all_reduce -> add -> RMSNorm stands in the decoder's post-grad graph:
    ``{"attention": matches at the attention outputs, "mlp": matches at the MLP outputs}``."""
    L = len(cfg.layers)
    return {"attention": 0 if style == "buffer" else L, "mlp": L if cfg.shard_mlp else 0}


# --------------------------------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------------------------------

def _search(x, residual, weight):
    h = all_reduce(x) + residual
    return rmsnorm(h, weight), h


def _replace(x, residual, weight):
    return fused_all_reduce_add_rmsnorm(x, residual, weight, EPS)


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _CustomGraphPass
except ImportError:  # pragma: no cover  (torch < 2.6)
    _CustomGraphPass = object


class FusionPass(_CustomGraphPass):
    """Inductor post-grad custom pass: one ``PatternMatcherPass`` holding the pattern
    all_reduce(x) + residual -> RMSNorm (traced for ``dtype``), replaced by
    ``workbook::fused_all_reduce_add_rmsnorm``. Each call logs ``Replaced N patterns`` and appends N
    to ``counts`` (and the line to ``log``)."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

        self.dtype = dtype
        self.patterns = PatternMatcherPass(pass_name="workbook_allreduce_add_rmsnorm")
        # example inputs on the kernels' device: tracing runs the ops (the fused op's kernel included);
        # no collective is issued while tracing (ranks may build their passes at different times)
        ex = [torch.randn(8, 16, device=DEVICE).to(dtype), torch.randn(8, 16, device=DEVICE).to(dtype),
              torch.randn(16, device=DEVICE).to(dtype)]
        _TRACING_PATTERN[0] = True
        try:
            with torch.no_grad():
                register_replacement(_search, _replace, ex, fwd_only, self.patterns)
        finally:
            _TRACING_PATTERN[0] = False
        self.counts: list[int] = []
        self.log: list[str] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        n = self.patterns.apply(graph)
        line = f"Replaced {n} patterns"
        self.counts.append(n)
        self.log.append(line)
        logger.info(line)

    def uuid(self):
        src = Path(__file__).read_bytes() + str(self.dtype).encode()
        return hashlib.sha256(src).hexdigest()


def compile_decoder(model, fusion: FusionPass | None = None, *, dynamic: bool = True,
                    before: list | None = None, after: list | None = None, reset: bool = True,
                    codegen: bool = True):
    """``torch.compile(model)`` (a :class:`MiniDecoder` or any function; Inductor, one whole graph) with ``fusion`` as the post-grad custom
    pass. ``dynamic=True`` (the default) compiles one graph for every ``T_pad`` and ``num_tokens``, as
    an engine does: ``num_tokens`` is then a symbol, and ``output[:num_tokens] = ...`` a partial write
    whatever its value. The FX graph cache is off, so the pass runs (and logs) on every compilation.
    ``before``/``after``, if given, receive a copy of each post-grad graph before/after the pass.
    ``reset`` clears Dynamo's cache first, so that this decoder compiles (and the pass logs) anew
    even where a graph compiled for another decoder object would pass its guards; it also drops the
    graphs compiled before (they recompile on their next call).

    ``codegen=False`` runs Inductor's graph passes only (its decompositions, functionalisation, the
    joint-graph and post-grad passes, the fusion pass among them: the same graphs, the same log) and
    then executes the post-grad graph op by op, without generating or compiling kernels. The CPU tests
    use it: on a CPU, compiling Inductor's C++ kernels is most of a compilation's time."""
    if reset:
        torch._dynamo.reset()
    hook = _Hook(fusion, before, after)
    if codegen:
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic,
                                 options={"fx_graph_cache": False, "post_grad_custom_post_pass": hook,
                                          "compile_threads": 1})
    else:
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend=_graph_passes_backend(hook))
    # specialize_float: with dynamic=True Dynamo would otherwise lift the RMSNorm's eps (a Python float)
    # into a graph input, and the add of eps would no longer match the pattern's constant (torch 2.13)
    return torch._dynamo.config.patch(specialize_float=True)(compiled)


def _graph_passes_backend(hook):
    """A ``torch.compile`` backend: AOT autograd with Inductor's decompositions, then Inductor's
    joint-graph and post-grad passes (``hook`` as the custom post-grad pass), then the graph itself
    (Inductor's internal pass functions, torch 2.11-2.13)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._guards import detect_fake_mode
    from torch._inductor import config as inductor_config
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes
    from torch._inductor.fx_passes.post_grad import post_grad_passes
    from torch._inductor.virtualized import V

    def forward_compiler(gm, example_inputs):
        with inductor_config.patch(post_grad_custom_post_pass=hook), V.set_fake_mode(detect_fake_mode(example_inputs)):
            joint_graph_passes(gm)
            post_grad_passes(gm, is_inference=True)
        gm.recompile()
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=forward_compiler, decompositions=select_decomp_table(),
                        keep_inference_input_mutations=True)   # the copy_ into a mutated input stays in the graph, as in Inductor


class _Hook(_CustomGraphPass):
    """The custom post-grad pass that Inductor calls: snapshots, then the fusion pass."""

    def __init__(self, fusion, before, after):
        self.fusion, self.before, self.after = fusion, before, after

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.before is not None:
            self.before.append(_copy_graph(graph))
        if self.fusion is not None:
            self.fusion(graph)
        if self.after is not None:
            self.after.append(_copy_graph(graph))

    def uuid(self):
        return "hook:" + (self.fusion.uuid() if self.fusion is not None else "none")


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    g = torch.fx.Graph()
    out = g.graph_copy(graph, {})
    g.output(out)
    return g


def count_ops(graph: torch.fx.Graph) -> dict:
    """How many call_function nodes of each target name (``all_reduce``, ``slice_scatter``, ...)."""
    out: dict = {}
    for n in graph.nodes:
        if n.op == "call_function":
            name = getattr(n.target, "__name__", str(n.target)).split(".")[0]
            out[name] = out.get(name, 0) + 1
    return out


# --------------------------------------------------------------------------------------------------
# Tensor parallel: worker processes (CPU + gloo here; torchrun + NCCL on GPUs)
# --------------------------------------------------------------------------------------------------

def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, world_size: int, port: int, cfg: DecoderConfig, hidden: torch.Tensor,
               num_tokens: int, compiled: bool, codegen: bool, out_dir: str) -> None:
    """One rank of :func:`run_tp`: its shard of the decoder, both styles, outputs and pass counts
    saved to ``out_dir/rank<r>.pt``."""
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    try:
        weights = shard_weights(cfg, make_decoder_weights(cfg, device="cpu"), rank, world_size)
        res = {}
        for style in ("buffer", "return"):
            model = MiniDecoder(cfg, weights, style, world_size=world_size)
            fusion = FusionPass(cfg.dtype)
            fn = compile_decoder(model, fusion, codegen=codegen) if compiled else model
            with torch.no_grad():
                out = fn(hidden, num_tokens)
            res[style] = {"out": out[:num_tokens].clone(), "counts": list(fusion.counts)}
        torch.save(res, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_tp(cfg: DecoderConfig, hidden: torch.Tensor, num_tokens: int, world_size: int = 2, *,
           compiled: bool = True, codegen: bool = True, timeout_s: float = 240.0) -> list[dict]:
    """Run the decoder with ``world_size`` tensor-parallel ranks as spawned CPU processes (gloo on
    loopback, a free port), both styles, compiled with the fusion pass unless ``compiled=False``.
    ``codegen``: as in :func:`compile_decoder`.
    Returns, per rank, ``{style: {"out": real rows, "counts": pass counts}}``. The processes are
    joined within ``timeout_s`` or killed (then a TimeoutError)."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="fusion_tp_") as tmp:
        ctx = mp.start_processes(_tp_worker, args=(world_size, _free_port(), cfg, hidden.cpu(), num_tokens,
                                                   compiled, codegen, tmp),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tensor-parallel workers did not finish within {timeout_s} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world_size)]


# --------------------------------------------------------------------------------------------------
# The one-shot fused op: all-reduce + add + RMSNorm in one kernel over peer-accessible buffers
# --------------------------------------------------------------------------------------------------

# The bits of -0.0 as a signed integer of the element's width: the "not arrived" sentinel of the
# exchange buffers (data never carries it: the push turns -0.0 into +0.0, which sums the same)
_BITS = {torch.bfloat16: (torch.int16, -(1 << 15)), torch.float16: (torch.int16, -(1 << 15)),
         torch.float32: (torch.int32, -(1 << 31))}
# Slots of the exchange buffers. Each reduce refills exactly the rows it has read, in the same
# program, after reading them; a peer can run at most one step ahead (its step t+1 reduce waits for
# this rank's step t+1 push, issued after this rank's step t launch ended), so its next write into a
# slot comes two steps later: two slots suffice, one races (tests/test_fusion.py plays both schedules).
ONESHOT_SLOTS = 2
# The one-shot path serves messages up to this many bytes per rank (tokens x hidden x element size),
# NCCL + add_rmsnorm above. PROVISIONAL: a guess, not a measurement; the crossover is to be measured on
# two H200s (workbook.benchmarks.fusion's TP=2 one-shot sweep, 8..512 tokens x hidden 2048 and 4096).
ONESHOT_MAX_BYTES = 1 << 20
# Reloads of a block before a reduce gives up and counts it in ``state`` (a protocol bug fails, never
# hangs); on a GPU a reload takes well under a microsecond, so this is seconds, far past any honest wait.
ONESHOT_MAX_SPIN = 1 << 24
_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_PHASES = {"push": 1, "reduce": 2, "both": 3}
# (dtype, hidden) -> the exchange the fused op uses (enable_oneshot); empty: the NCCL path everywhere
_ONESHOT: dict = {}


def multicast_off() -> None:
    """Keep NVLink multicast (NVLS, multimem) off: set before NCCL or symmetric memory first start."""
    os.environ.update(_MULTICAST_OFF)


class OneShotExchange:
    """The exchange buffers of the one-shot op and its small device state, allocated once and reused
    (and overwritten) every step. ``buffers``: the local buffer of each rank this process serves,
    int bits ``[ONESHOT_SLOTS, world, max_tokens, hidden]``; ``peers``: int64 addresses of every rank's
    buffer; ``state [served, 3]`` on the device: per served rank the step, the programs finished in
    it, and the waits given up.

    :meth:`simulated`: every rank's buffer on one device, all ranks served by one launch (tests, one
    GPU). :meth:`symmetric`: one rank of real tensor parallelism, peers' buffers mapped by
    ``torch.distributed._symmetric_memory``."""

    def __init__(self, buffers, peers, world, rank0, dtype):
        self.buffers, self.world, self.rank0, self.dtype = buffers, world, rank0, dtype
        self.served = len(buffers)
        self.slots, _, self.max_tokens, self.hidden = buffers[0].shape
        self.bits, self.sentinel = _BITS[dtype]
        self.peers = peers
        dev = buffers[0].device
        # zeros: the kernel reads the step and adds to the two counts before anyone writes them, and
        # step 0, no program done, no wait given up are the values those first reads need
        # audit: ok -- read before written: the one-shot kernel loads the step and atomically adds to both counts
        self.state = torch.zeros(self.served, 3, dtype=torch.int32, device=dev)
        self._given_up = [0] * self.served      # the counts that check() has reported

    @staticmethod
    def _check(world, max_tokens, hidden, dtype):
        if not all(isinstance(v, int) and v > 0 for v in (world, max_tokens, hidden)):
            raise ValueError(f"world, max_tokens and hidden must be positive ints, got {world}, {max_tokens}, {hidden}")
        if dtype not in _BITS:
            raise TypeError(f"dtype must be one of {[str(d) for d in _BITS]}, got {dtype}")

    @staticmethod
    def _fresh(world, max_tokens, hidden, dtype, device):
        bits, sentinel = _BITS[dtype]
        # full, not empty: the reduce's first reads of a slot come BEFORE any peer has pushed into it
        # (that is the wait), so the bytes there before the first push must say "not arrived". Stale
        # bytes of an empty would read as arrived data (tests: the poison). Every later step's refill
        # (the kernel) is the producer of the sentinel for the next use of a slot.
        return torch.full((ONESHOT_SLOTS, world, max_tokens, hidden), sentinel, dtype=bits, device=device)

    @classmethod
    def simulated(cls, world: int, max_tokens: int, hidden: int, dtype=torch.bfloat16, device=None):
        """``world`` ranks on one device, each with its own buffer (the pointer table holds their
        addresses): one launch serves them all, as concurrent programs on a GPU."""
        cls._check(world, max_tokens, hidden, dtype)
        dev = torch.device(device or DEVICE)
        bufs = [cls._fresh(world, max_tokens, hidden, dtype, dev) for _ in range(world)]
        return cls(bufs, torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=dev), world, 0, dtype)

    @classmethod
    def symmetric(cls, max_tokens: int, hidden: int, dtype=torch.bfloat16, group=None):
        """This rank's exchange for the process ``group`` (collective: every rank calls it), in
        symmetric memory on the current CUDA device, peers' buffers mapped into this process. NVLink
        multicast stays off (:func:`multicast_off`): peer loads and stores only."""
        import torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm_mem

        multicast_off()
        group = group or dist.group.WORLD
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        cls._check(world, max_tokens, hidden, dtype)
        bits, sentinel = _BITS[dtype]
        dev = torch.device("cuda", torch.cuda.current_device())
        # empty, then filled whole with the sentinel on the next line (the reason: _fresh)
        buf = symm_mem.empty((ONESHOT_SLOTS, world, max_tokens, hidden), dtype=bits, device=dev)
        buf.fill_(sentinel)
        handle = symm_mem.rendezvous(buf, group)
        # every rank's fill must be done before any peer's first push lands, or the fill erases it
        torch.cuda.synchronize()
        dist.barrier(group)
        peers = torch.tensor([handle.get_remote_tensor(q, buf.shape, bits).data_ptr() if q != rank else buf.data_ptr()
                              for q in range(world)], dtype=torch.int64, device=dev)
        ex = cls([buf], peers, world, rank, dtype)
        ex.handle = handle
        return ex

    def check(self) -> None:
        """Raise if a reduce gave up waiting since the last check (reads the device's counts)."""
        given_up = self.state[:, 2].tolist()
        bad = [i for i, (now, seen) in enumerate(zip(given_up, self._given_up)) if now > seen]
        self._given_up = given_up
        if bad:
            raise RuntimeError(f"one-shot all-reduce: rank(s) {[self.rank0 + i for i in bad]} stopped waiting "
                               "for a peer's partial sums (a peer never pushed, or the buffer lost the sentinel)")


def _check_oneshot(ex, x, residual, weight, eps, rank):
    if not isinstance(ex, OneShotExchange):
        raise TypeError(f"ex must be a OneShotExchange, got {type(ex).__name__}")
    if torch.is_tensor(x) and x.dim() == 2 and ex.served == 1:
        x, residual = x[None], residual[None] if torch.is_tensor(residual) else residual
    check_tensor("x", x, dtypes=(ex.dtype,), ndim=3, device=ex.buffers[0].device)
    if x.shape[0] != ex.served:
        raise ValueError(f"x must be [served ranks = {ex.served}, M, D] (or [M, D] with one), got {list(x.shape)}")
    if x.shape[1] > ex.max_tokens or x.shape[2] != ex.hidden:
        raise ValueError(f"x must have at most max_tokens = {ex.max_tokens} rows and hidden = {ex.hidden} columns, "
                         f"got {list(x.shape[1:])}")
    if not torch.is_tensor(residual) or residual.shape != x.shape:
        got = list(residual.shape) if torch.is_tensor(residual) else type(residual).__name__
        raise ValueError(f"residual must have x's shape {list(x.shape)}, got {got}")
    _check_add_rmsnorm(x.reshape(-1, x.shape[2]), residual.reshape(-1, x.shape[2]), weight, eps)
    if rank is not None and not (isinstance(rank, int) and 0 <= rank < ex.served):
        raise ValueError(f"rank must be None (all served ranks) or an int in [0, {ex.served}), got {rank!r}")
    return x.contiguous(), residual.contiguous()


def oneshot_all_reduce_add_rmsnorm(ex: OneShotExchange, x, residual, weight, eps: float = EPS, *, phase: str = "auto",
                                   rank: int | None = None, max_spin: int | None = None, config=None,
                                   emulate: bool | None = None):
    """All-reduce over ranks + residual add + RMSNorm in one Triton kernel (the one-shot design):
    each rank pushes its partial sums into every rank's exchange buffer (peer stores), then waits on
    its own buffer until no element holds the sentinel, sums the partials in rank order (fp32: every
    rank gets the same bits), adds the residual, normalises and refills what it read. ``x, residual
    [served, M, D]`` (``[M, D]`` with one served rank); returns ``(normed, new_residual)`` shaped so
    (with ``rank``: that rank's ``[1, M, D]``).

    ``phase``: 'auto' = 'both' (one launch; on a GPU every program resident at once: the grid is at
    most one program per SM) or, in the interpreter, which runs programs one after another and would
    wait forever, 'push' then 'reduce' as two launches. 'push' / 'reduce' alone (``rank``: one served
    rank only) let tests play any schedule. ``max_spin``: reloads before a reduce gives up and counts
    it (default :data:`ONESHOT_MAX_SPIN` on a GPU, 0 in the interpreter, where waiting cannot help);
    :meth:`OneShotExchange.check` reports it."""
    x3, r3 = _check_oneshot(ex, x, residual, weight, eps, rank)
    if phase not in ("auto", *_PHASES):
        raise ValueError(f"phase must be 'auto', 'push', 'reduce' or 'both', got {phase!r}")
    emulate = resolve_emulate(emulate, EMULATE_WHY)
    R, M, D = x3.shape
    BLOCK_D = next_pow2(D)
    cfg = resolve_config(config, CONFIG, pow2=("BLOCK_M", "num_warps"))
    cfg["BLOCK_M"] = cfg["BLOCK_M"] or (1 if ON_GPU else 64)
    cfg["num_warps"] = cfg["num_warps"] or (4 if BLOCK_D <= 2048 else 8)
    served = range(R) if rank is None else range(rank, rank + 1)
    # co-residency: a waiting program holds its SM, so every program that it may wait for must be
    # running too: at most one program per SM over all the ranks one launch serves (programs loop)
    grid = (min(cdiv(M, cfg["BLOCK_M"]), max(1, sm_count() // len(served))) if ON_GPU
            else cdiv(M, cfg["BLOCK_M"]), len(served))
    # empty, both: over the grid's row blocks every row of every served rank is written (masked past M, D)
    out, residual_out = torch.empty_like(x3), torch.empty_like(x3)
    phases = [phase] if phase != "auto" else ["both"] if ON_GPU else ["push", "reduce"]
    spin = (ONESHOT_MAX_SPIN if ON_GPU else 0) if max_spin is None else int(max_spin)
    require_launchable(kern.oneshot_all_reduce_add_rmsnorm_kernel)
    s = slice(served.start, served.stop)
    for ph in phases if M else []:
        kern.oneshot_all_reduce_add_rmsnorm_kernel[grid](
            x3[s].view(ex.bits), r3[s], weight, out[s], residual_out[s], ex.peers, ex.state[s],
            ex.rank0 + served.start, M, D, ex.max_tokens, float(eps), spin, WORLD=ex.world, SLOTS=ex.slots,
            SENTINEL=ex.sentinel, BLOCK_M=cfg["BLOCK_M"], BLOCK_D=BLOCK_D, PHASE=_PHASES[ph],
            IS_BF16=x3.dtype == torch.bfloat16, IS_FP16=x3.dtype == torch.float16, EMULATE=bool(emulate),
            num_warps=cfg["num_warps"])
    if rank is not None:                       # one served rank: its own [1, M, D] results
        return out[s], residual_out[s]
    return (out, residual_out) if x.dim() == 3 else (out[0], residual_out[0])


def enable_oneshot(hidden: int, dtype=torch.bfloat16, group=None) -> OneShotExchange | None:
    """Register a one-shot exchange for messages of ``hidden`` columns in ``dtype`` (collective: every
    rank calls it after ``init_process_group``), sized for :data:`ONESHOT_MAX_BYTES`; the fused op then
    takes the one-shot path for such messages up to that size. Returns None, and registers nothing,
    where the path does not apply: one rank (or no process group), a backend other than NCCL (gloo on
    a CPU keeps its path unchanged), or symmetric memory unavailable."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) < 2:
        return None
    if dist.get_backend(group) != "nccl" or not torch.cuda.is_available():
        return None
    max_tokens = max(1, ONESHOT_MAX_BYTES // (hidden * torch.empty((), dtype=dtype).element_size()))
    try:
        ex = OneShotExchange.symmetric(max_tokens, hidden, dtype, group)
    except (ImportError, RuntimeError, AttributeError) as e:      # no symmetric memory here: NCCL path
        logging.getLogger(__name__).warning("one-shot all-reduce not enabled: %s", e)
        return None
    _ONESHOT[(dtype, hidden)] = ex
    return ex


def disable_oneshot() -> None:
    """Forget every registered exchange: the fused op takes the NCCL path again."""
    _ONESHOT.clear()


def _oneshot_for(x: torch.Tensor) -> OneShotExchange | None:
    """The exchange the fused op uses for ``x [M, D]``, or None (the NCCL path): one is registered for
    its dtype and D, the message is at most ONESHOT_MAX_BYTES and fits the buffers."""
    ex = _ONESHOT.get((x.dtype, x.shape[-1])) if x.dim() == 2 else None
    if ex is None or _TRACING_PATTERN[0] or x.numel() * x.element_size() > ONESHOT_MAX_BYTES:
        return None
    return ex if x.shape[0] <= ex.max_tokens and ex.served == 1 else None
