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
  at scale, and what :func:`benchmark` runs) the down projection is row-parallel too and its
  all-reduce is followed by the next residual add + RMSNorm (the next layer's input norm, or the final
  norm): one more site per layer, returned by the MLP in BOTH styles, so both styles gain one match
  per layer (0 + L vs L + L). :func:`expected_sites` states the counts.

The decoder's linear-attention layers compute :func:`workbook.gdn.qwen3_next_linear_attention` on this
rank's heads (a test checks it): projections, causal conv, gates and gated RMSNorm in torch ops that
Inductor compiles, and the recurrence of notebook 05 in one opaque custom op (:func:`gdn_core`), as
engines register their GDN attention core; the full-attention layers are a small causal attention
written with visible torch ops.

Tensor parallelism: ``world_size`` ranks each hold a slice of the heads (and, with ``shard_mlp``, of
the MLP's intermediate columns); row-parallel projections produce partial sums that
``workbook::all_reduce`` adds up with ``torch.distributed`` (gloo on CPU, NCCL on GPUs). With one rank
it is the identity, but it stays in the graph as the same op, so the pass sees the same sites.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from .device import DEVICE, ON_GPU, check_tensor, require_launchable, resolve_config, resolve_emulate
from .gdn import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, naive_recurrent_gated_delta_rule
from .kernels import fusion as kern

__all__ = [
    "EPS", "DecoderConfig", "DEMO", "rmsnorm", "add_rmsnorm", "add_rmsnorm_ref", "all_reduce",
    "fused_all_reduce_add_rmsnorm", "make_decoder_weights", "shard_weights", "MiniDecoder",
    "FusionPass", "compile_decoder", "expected_sites", "count_ops", "run_tp",
    "benchmark", "main", "logger", "site_chain", "plot_site", "code_excerpt", "kernel_names", "kernel_after", "kernel_source",
    "load_timings", "timing_table", "kernel_table", "site_costs", "kernel_profile", "host_profile",
    "summarize_kernels", "kernel_group", "KERNEL_GROUPS", "gdn_core", "GDN_RECURRENT_MAX_T", "DECODER_VERSION", "BENCH", "SMOKE", "DECODE_TOKENS", "PREFILL_TOKENS",
]

EPS = 1e-6
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
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

    ``config``: ``{"BLOCK_M": rows per program, "num_warps": ...}``. ``emulate``: exact bf16
    conversions with integer ops (default: on without a GPU, where the interpreter runs the kernel)."""
    _check_add_rmsnorm(x, residual, weight, eps, device=DEVICE)
    emulate = resolve_emulate(emulate, "it runs the hardware bf16 casts, which Triton's interpreter gets wrong")
    M, D = x.shape
    BLOCK_D = triton.next_power_of_2(D)
    # GPU: one row per program for decode-sized batches (more programs in flight: the kernel is all
    # latency there), a few rows per program above; the interpreter runs programs one after another:
    # fewer, taller ones
    block_m = (1 if M < 1024 else max(1, min(16, 4096 // BLOCK_D))) if ON_GPU else 64
    cfg = resolve_config(config, {"BLOCK_M": block_m,
                                  "num_warps": 4 if BLOCK_D <= 2048 else 8}, pow2=("BLOCK_M", "num_warps"))
    # empty, both: program i writes rows [i*BLOCK_M, (i+1)*BLOCK_M) x all D columns of out and of
    # residual_out (masked only past M and D), and the grid cdiv(M, BLOCK_M) covers all M rows.
    out = torch.empty_like(x)
    residual_out = torch.empty_like(x)
    require_launchable(kern.add_rmsnorm_kernel)
    if M:
        kern.add_rmsnorm_kernel[(triton.cdiv(M, cfg["BLOCK_M"]),)](
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
    """What the pass puts in place of all_reduce -> add -> RMSNorm: the all-reduce, then ONE kernel
    (:func:`add_rmsnorm`, Triton; in the interpreter on a CPU) returning ``(normed, new_residual)``."""
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
    defined (with ``style='buffer'`` the others hold whatever the unwritten buffer rows held)."""

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
            # empty: rows [num_tokens:] stay unwritten, and only row-wise ops read them, into padding rows
            # that nothing reads (attention is causal and runs on the real rows); the test
            # test_buffer_padding_rows_never_reach_real_rows poisons them two ways.
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
# Benchmark (GPU): one GPU via `python3 -m workbook bench fusion`; TP=2 via torchrun (main below)
# --------------------------------------------------------------------------------------------------

# The decoder's version in the benchmark record: 1 = before the profile-driven fixes (SDPA on 3-D
# tensors, the whole GDN block one opaque op, the chunked GDN kernel at every size); 2 = this code.
DECODER_VERSION = 2
BENCH = DecoderConfig(hidden=2048, layers=("linear", "linear", "linear", "full"), gdn_k_heads=16,
                      gdn_v_heads=32, gdn_head_dim=128, attn_heads=16, attn_head_dim=128, intermediate=6144,
                      shard_mlp=True, gdn_kernel="auto", dtype=torch.bfloat16)
DECODE_TOKENS = (8, 64, 256)
PREFILL_TOKENS = (2048, 8192)
# Tensor-parallel checks on the CPU (spawned ranks, gloo): the MLP sharded too, and the GDN block on
# workbook.gdn's fp32 reference path (pure torch: the spawned processes stay fast).
SMOKE = replace(DEMO, shard_mlp=True, gdn_kernel="auto" if ON_GPU else "reference")


def _cfg_json(cfg: DecoderConfig) -> dict:
    d = asdict(cfg)
    d["dtype"] = str(cfg.dtype).replace("torch.", "")
    d["layers"] = list(cfg.layers)
    return d


def _fixed_time_us(fn, iters: int, warmup: int = 3) -> float:
    """Per-call time over a FIXED number of calls (CUDA events; every rank runs the same count, so
    collectives inside ``fn`` stay matched across ranks; do_bench picks its count per process)."""
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / iters


def _graph_fixed_us(fn, n: int = 10, replays: int = 10) -> float:
    """GPU time per call from replaying a CUDA graph of ``n`` calls, ``replays`` times (fixed counts)."""
    from .bench import capture_graph

    return _fixed_time_us(capture_graph(fn, n).replay, replays, warmup=2) / n


# Kernel groups of a decoder step, by the name the profiler reports (first match wins). The names
# are those of torch 2.11 / Triton 3.6 on an H200: cuBLAS GEMMs ("nvjet", "gemm", "gemv", "xmma"),
# NCCL ("ncclDevKernel_AllReduce..."), Inductor's generated kernels ("triton_red_fused_..."), our
# Triton kernels by their function names, PyTorch's eager elementwise kernels.
KERNEL_GROUPS = (
    ("all-reduce (NCCL)", r"nccl"),
    ("device copies (memcpy)", r"[Mm]emcpy"),
    ("fused add+RMSNorm (ours)", r"add_rmsnorm_kernel"),
    ("GDN kernels (ours)", r"^(?!triton_).*(gdn|chunk_table|gated_rmsnorm)"),   # not Inductor's ..._gdn_core_...
    ("attention", r"flash|fmha|attention|softmax|cudnn_generated|sdpa"),
    ("conv1d", r"conv|fprop|depthwise"),
    ("matmul (cuBLAS)", r"gemm|gemv|nvjet|xmma|cutlass|splitK"),
    ("Inductor: norm kernels", r"^triton_.*rsqrt"),
    ("Inductor: other kernels", r"^triton_"),
    ("torch eager elementwise / copies", r"elementwise|copy|fill|cat|reduce|index|[Mm]emset"),
)


def kernel_group(name: str) -> str:
    """The :data:`KERNEL_GROUPS` group of a kernel name ('other' if none matches)."""
    import re
    for group, pat in KERNEL_GROUPS:
        if re.search(pat, name):
            return group
    return "other"


def summarize_kernels(events, steps: int, top: int = 12) -> dict:
    """Per-step kernel table from profiler trace events (chrome-trace dicts with ``cat`` 'kernel',
    'gpu_memcpy' or 'gpu_memset', ``name`` and ``dur`` in us) of ``steps`` identical steps:
    ``{"kernels_per_step", "kernel_us_per_step", "groups": {group: {"calls", "us"}}, "top": [...]}``,
    calls and times divided by ``steps``."""
    per: dict = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        k = per.setdefault(e["name"], [0, 0.0])
        k[0] += 1
        k[1] += float(e.get("dur", 0.0))
    groups: dict = {}
    for name, (n, us) in per.items():
        g = groups.setdefault(kernel_group(name), {"calls": 0.0, "us": 0.0})
        g["calls"] += n / steps
        g["us"] += us / steps
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])
    return {"kernels_per_step": round(sum(n for n, _ in per.values()) / steps, 2),
            "kernel_us_per_step": round(sum(us for _, us in per.values()) / steps, 2),
            "groups": {g: {"calls": round(v["calls"], 2), "us": round(v["us"], 2)}
                       for g, v in sorted(groups.items(), key=lambda kv: -kv[1]["us"])},
            "top": [{"name": name[:120], "group": kernel_group(name), "calls": round(n / steps, 2),
                     "us": round(us / steps, 2)} for name, (n, us) in rows[:top]]}


def kernel_profile(fn, steps: int = 3, top: int = 12) -> dict:
    """GPU kernels of one call of ``fn`` (GPU only): ``fn`` captured once in a CUDA graph, replayed
    ``steps`` times under ``torch.profiler`` with CUDA activities; :func:`summarize_kernels` of the
    trace. Kernel times are the GPU's own (CUPTI), without host work; the sum of kernel times is at
    most the graph-replay time (the difference is the gaps between kernels)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from .bench import capture_graph

    with torch.no_grad():
        g = capture_graph(fn, 1)
        g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                g.replay()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return summarize_kernels(events, steps, top)


def host_profile(fn, top: int = 10) -> dict:
    """Host side of one eager call of ``fn`` (GPU only): wall time, kernel launches and the ops with
    the most self CPU time (``torch.profiler``, CPU activities). Explains eager per-call time."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            fn()
            wall = time.perf_counter() - t0
        torch.cuda.synchronize()
    ka = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    launches = sum(e.count for e in prof.key_averages()
                   if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"))
    return {"wall_us": round(1e6 * wall, 1), "kernel_launches": launches,
            "top_self_cpu": [{"name": e.key[:100], "calls": e.count, "self_cpu_us": round(e.self_cpu_time_total, 1)}
                             for e in ka[:top]]}


def _weights_fp32(weights: dict) -> dict:
    return {"layers": [{k: (t.float() if torch.is_tensor(t) else t) for k, t in L.items()} for L in weights["layers"]],
            "final_norm": weights["final_norm"].float()}


def _bench_sizes(cfg, rank, world_size, sizes, *, timer, device, log=print, profile=False):
    """Both styles at each size: compiled decoder, pass counts, GPU/eager times, agreement between the
    styles and, for each, with the same decoder in fp32 (eager, on the same bf16-valued weights) and
    with itself run eagerly (uncompiled).
    ``profile``: also the per-kernel GPU table of one step (:func:`kernel_profile`) per style and size,
    and the host side of one eager step (:func:`host_profile`) at the first size."""
    weights = shard_weights(cfg, make_decoder_weights(cfg, device=device), rank, world_size)
    nbytes = sum(t.numel() * t.element_size() for L in weights["layers"] for t in L.values() if torch.is_tensor(t))
    ref_model = MiniDecoder(replace(cfg, dtype=torch.float32), _weights_fp32(weights), "return", world_size=world_size)
    gen = torch.Generator().manual_seed(1)
    rows = []
    models, fns, counts = {}, {}, {}
    for style in ("buffer", "return"):
        models[style] = MiniDecoder(cfg, weights, style, world_size=world_size)
        fusion = FusionPass(cfg.dtype)
        fns[style] = compile_decoder(models[style], fusion, reset=style == "buffer")
        warm = torch.randn(sizes[0], cfg.hidden, generator=gen).to(device, cfg.dtype)
        t0 = time.perf_counter()
        with torch.no_grad():
            fns[style](warm, sizes[0] - 1)
        counts[style] = {"log": list(fusion.log), "counts": list(fusion.counts),
                         "expected": expected_sites(cfg, style), "compile_s": round(time.perf_counter() - t0, 1)}
        log(f"[fusion] {style}: {fusion.log} (compile {counts[style]['compile_s']} s)")
    for T in sizes:
        num_tokens = T - 1 if T > 1 else 1   # a padded batch: one slot of padding
        hidden = (torch.randn(T, cfg.hidden, generator=gen) * 0.5).to(device, cfg.dtype)
        row = {"T_pad": T, "num_tokens": num_tokens, "phase": "decode" if T <= 256 else "prefill"}
        outs = {}
        with torch.no_grad():
            ref = ref_model(hidden.float(), num_tokens)[:num_tokens]
        for style in ("buffer", "return"):
            step = lambda: fns[style](hidden, num_tokens)   # noqa: E731
            with torch.no_grad():
                outs[style] = step()[:num_tokens].float()
                eager = models[style](hidden, num_tokens)[:num_tokens].float()
            row[style] = timer(step)
            row[style]["rel_err_vs_fp32"] = float((outs[style] - ref).norm() / ref.norm())
            row[style]["rel_diff_vs_eager"] = float((outs[style] - eager).norm() / eager.norm())
            if profile:
                row[style]["kernels"] = kernel_profile(step, top=10)
                if T == sizes[0]:
                    row[style]["host"] = host_profile(step)
        row["rel_diff"] = float((outs["return"] - outs["buffer"]).norm() / outs["buffer"].norm())
        rows.append(row)
        log(f"[fusion] T={T}: " + ", ".join(f"{s} {row[s].get('graph_us', row[s])}" for s in ("buffer", "return")))
    return {"config": _cfg_json(cfg), "world_size": world_size, "decoder_version": DECODER_VERSION,
            "weight_bytes_per_rank": nbytes,
            "passes": counts, "sizes": rows}


def _gdn_core_times(cfg, device, tokens=(8, 16, 32, 64)) -> list:
    """GPU time (graph replay) of :func:`gdn_core` with the recurrent and the chunked kernel on one
    sequence of the decoder's head shapes: where 'auto' switches (:data:`GDN_RECURRENT_MAX_T`)."""
    from .bench import graph_time_us

    gen = torch.Generator().manual_seed(5)
    Hk, Hv, Dh = cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
    rows = []
    for T in tokens:
        q, k = (torch.randn(T, Hk, Dh, generator=gen).to(device, cfg.dtype) for _ in range(2))
        v = torch.randn(T, Hv, Dh, generator=gen).to(device, cfg.dtype)
        g = (-0.1 * torch.rand(T, Hv, generator=gen)).to(device)
        beta = torch.rand(T, Hv, generator=gen).to(device, cfg.dtype)
        row = {"T": T}
        for kernel in ("recurrent", "chunk"):
            with torch.no_grad():
                row[f"{kernel}_graph_us"] = graph_time_us(lambda: gdn_core(q, k, v, g, beta, kernel), n=10)
        rows.append(row)
    return rows


def _read_GBps(device, nbytes: int = 1 << 30) -> float:
    """Read bandwidth of ``torch.sum`` over ``nbytes`` of bf16, GPU time from graph replay."""
    from .bench import graph_time_us

    x = torch.ones(nbytes // 2, device=device, dtype=torch.bfloat16)
    t = graph_time_us(lambda: x.sum(), n=5)
    return nbytes / (t * 1e-6) / 1e9


def _gpu_timer(fn):
    with torch.no_grad():
        out = {"eager_us": _fixed_time_us(fn, 20)}
        try:
            out["graph_us"] = _graph_fixed_us(fn)
        except Exception as e:  # noqa: BLE001  (record why, keep the eager figure)
            out["graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return out


def benchmark():
    """One GPU (``python3 -m workbook bench fusion``): the compiled decoder (:data:`BENCH`, bf16),
    both styles, decode-sized and prefill-sized steps. GPU time from CUDA-graph replay
    (:func:`workbook.bench.graph_time_us`), eager per-call time (``do_bench``) beside it. The TP=2
    figures come from ``torchrun --nproc-per-node 2 -m workbook.fusion --bench --out PATH`` and are
    merged in when that file is given as ``WORKBOOK_FUSION_TP2`` (environment)."""
    from .bench import graph_time_us, require_gpu, time_us

    require_gpu("fusion.benchmark")

    def timer(fn):
        with torch.no_grad():
            return {"graph_us": graph_time_us(fn, n=10, windows=3), "eager_us": time_us(fn)}

    res = {"timing": "graph_us: GPU time per step from CUDA-graph replay (10 steps per graph, median of 3 "
                     "windows); eager_us: per-call time of the compiled step (do_bench median), host work "
                     "included; kernels: per-kernel GPU times of one step from torch.profiler (CUPTI) "
                     "around CUDA-graph replay; host: one eager step under torch.profiler (CPU)",
           "decoder_version": DECODER_VERSION,
           "read_GBps": _read_GBps(DEVICE),
           "read_timing": "torch.sum over 1 GiB of bf16, GPU time from CUDA-graph replay",
           "gdn_core": _gdn_core_times(BENCH, DEVICE),
           "tp1": _bench_sizes(BENCH, 0, 1, DECODE_TOKENS + PREFILL_TOKENS, timer=timer, device=DEVICE,
                               profile=True)}
    tp2 = os.environ.get("WORKBOOK_FUSION_TP2")
    if tp2 and Path(tp2).exists():
        res["tp2"] = json.loads(Path(tp2).read_text())["tp2"]
    return res, {}


def main(argv=None) -> int:
    """``python -m workbook.fusion --bench --out PATH`` under ``torchrun --nproc-per-node 2`` (NCCL,
    one GPU per rank); ``--smoke`` runs the same code on CPU with gloo at tiny sizes (CPU wall-clock
    times, labelled so, never GPU figures). ``--check`` spawns TP=2 on CPU itself and compares with
    TP=1 (counts and outputs)."""
    ap = argparse.ArgumentParser(prog="python -m workbook.fusion", description=main.__doc__)
    ap.add_argument("--bench", action="store_true", help="time the compiled decoder under torchrun")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, CPU + gloo (with --bench)")
    ap.add_argument("--check", action="store_true", help="TP=2 (spawned, gloo) vs TP=1 on CPU, counts and outputs")
    ap.add_argument("--out", help="JSON file for the results (rank 0 writes it)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.check:
        return _check_cli()
    if not args.bench:
        ap.error("give --bench (under torchrun) or --check")
    import datetime

    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.smoke or not ON_GPU:
        if not args.smoke:
            raise SystemExit("--bench needs GPUs (one per rank); on a CPU use --bench --smoke")
        backend, device, cfg, sizes = "gloo", torch.device("cpu"), SMOKE, (8, 16)

        def timer(fn):
            t0 = time.perf_counter()
            with torch.no_grad():
                fn()
            return {"cpu_wall_us_smoke": 1e6 * (time.perf_counter() - t0)}
    else:
        torch.cuda.set_device(local)
        backend, device, cfg, sizes = "nccl", torch.device("cuda", local), BENCH, DECODE_TOKENS + PREFILL_TOKENS
        timer = _gpu_timer
    if world > 1:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600),
                                **({"device_id": device} if backend == "nccl" else {}))
    try:
        log = print if rank == 0 else (lambda *a: None)
        res = _bench_sizes(cfg, rank, world, sizes, timer=timer, device=device, log=log, profile=ON_GPU and not args.smoke)
        res["backend"] = backend
        res["timing"] = ("graph_us: GPU time per step from CUDA-graph replay (10 steps per graph, 10 "
                         "replays, fixed counts on every rank); eager_us: per-call time of the compiled "
                         "step over 20 calls; kernels: per-kernel GPU times of one step from torch.profiler (CUPTI) "
                         "around CUDA-graph replay, rank 0" if backend == "nccl" else "CPU smoke run: wall-clock, not GPU")
        if rank == 0:
            from .device import describe
            rec = {"recorded": datetime.date.today().isoformat(), "meta": describe(),
                   f"tp{world}": res}
            text = json.dumps(rec, indent=1)
            if args.out:
                Path(args.out).write_text(text + "\n")
                print(f"[fusion] wrote {args.out}")
            else:
                print(text)
    finally:
        if world > 1:
            dist.destroy_process_group()
    return 0


def _check_cli() -> int:
    cfg = SMOKE
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(12, cfg.hidden, generator=gen)
    n = 9
    ref = run_tp(cfg, hidden, n, world_size=1, compiled=True)[0]
    tp2 = run_tp(cfg, hidden, n, world_size=2, compiled=True)
    ok = True
    for style in ("buffer", "return"):
        for r, res in enumerate(tp2):
            d = float((res[style]["out"] - ref[style]["out"]).abs().max())
            print(f"{style} rank {r}: counts {res[style]['counts']} (TP=1: {ref[style]['counts']}), "
                  f"max |TP2 - TP1| = {d:.2e}")
            ok &= res[style]["counts"] == ref[style]["counts"] and d < 1e-4
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1



# --------------------------------------------------------------------------------------------------
# Pictures and excerpts for notebook 06
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
    import re
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


def load_timings():
    """The recorded H200 results (``workbook/data/fusion.json``) or None."""
    from .bench import load_record
    try:
        return load_record("fusion")
    except FileNotFoundError:
        return None


def timing_table(res: dict) -> str:
    """Text table of one benchmark block (``tp1`` or ``tp2``): per size both styles, GPU time from
    CUDA-graph replay and eager per-call time, and the buffer/return ratio."""
    out = [f"{'phase':8s} {'T_pad':>6s} {'tokens':>6s} | {'buffer graph':>12s} {'return graph':>12s} "
           f"{'speedup':>7s} | {'buffer eager':>12s} {'return eager':>12s}"]
    for r in res["sizes"]:
        b, f = r["buffer"], r["return"]
        if "graph_us" in b and "graph_us" in f:
            g = f"{b['graph_us']:10.1f}us {f['graph_us']:10.1f}us {b['graph_us'] / f['graph_us']:6.2f}x"
        else:
            g = f"{'(no graph time: ' + b.get('graph_error', f.get('graph_error', '?'))[:18] + ')':>33s}"
        out.append(f"{r['phase']:8s} {r['T_pad']:6d} {r['num_tokens']:6d} | {g} | {b['eager_us']:10.1f}us "
                   f"{f['eager_us']:10.1f}us")
    return "\n".join(out)


def _size_row(block: dict, T: int) -> dict:
    for r in block["sizes"]:
        if r["T_pad"] == T:
            return r
    raise ValueError(f"no size T_pad={T} in this record (sizes {[r['T_pad'] for r in block['sizes']]})")


def kernel_table(block: dict, T: int) -> str:
    """Text table of one recorded step (``block``: ``tp1`` or ``tp2`` of fusion.json, ``T``: T_pad):
    per kernel group (:data:`KERNEL_GROUPS`) and style, kernels per step and their GPU time (profiler,
    around graph replay), then the totals and the graph-replay time of the step."""
    row = _size_row(block, T)
    ks = {s: row[s]["kernels"] for s in ("buffer", "return")}
    groups = list(ks["buffer"]["groups"]) + [g for g in ks["return"]["groups"] if g not in ks["buffer"]["groups"]]
    out = [f"{'kernel group':34s} | {'buffer: n':>9s} {'us':>9s} | {'return: n':>9s} {'us':>9s}"]
    for g in groups:
        cells = []
        for s in ("buffer", "return"):
            v = ks[s]["groups"].get(g, {"calls": 0, "us": 0.0})
            cells.append(f"{v['calls']:9.0f} {v['us']:9.1f}")
        out.append(f"{g:34s} | {cells[0]} | {cells[1]}")
    out.append(f"{'all kernels (sum of GPU times)':34s} | " + " | ".join(
        f"{ks[s]['kernels_per_step']:9.0f} {ks[s]['kernel_us_per_step']:9.1f}" for s in ("buffer", "return")))
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
        return row[style]["kernels"]["groups"].get(group, {}).get("us", 0.0)

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
        "kernel_us": {s: row[s]["kernels"]["kernel_us_per_step"] for s in ("buffer", "return")},
        "graph_us": {s: row[s].get("graph_us") for s in ("buffer", "return")},
        "other_us": {s: row[s]["kernels"]["kernel_us_per_step"] - us(s, ind) - us(s, ours) - us(s, nccl)
                     for s in ("buffer", "return")},
    }


if __name__ == "__main__":
    sys.exit(main())
