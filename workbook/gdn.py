"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025) as Qwen3-Next uses it: references, launchers,
a linear-attention block that returns its output, the redundant ``zero_()`` lesson, the benchmark.

Per value head the state ``h`` is a ``[K, V]`` matrix. Per token ``t``::

    h <- exp(g_t) h                  (decay, g_t <= 0)
    u  = beta_t (v_t - h^T k_t)      (delta rule: write only what h does not already predict)
    h <- h + k_t u^T
    o_t = h^T (scale q_t)            (scale defaults to K^-0.5)

The public functions take the arguments of flash-linear-attention's functions of the same names:
q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g, beta ``[B, T, HV]``; states ``[N, HV, K, V]``;
``cu_seqlens`` (with B == 1) for variable-length batches. Value heads may outnumber key heads
(HV a multiple of H, value head ``hv`` reads key head ``hv // (HV // H)``: Qwen3-Next has 16 and 32).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import torch.nn.functional as F

from .device import DEVICE, ON_GPU, check_tensor, require_launchable, resolve_config, resolve_emulate, same_device
from .kernels import gdn as kern

__all__ = [
    "l2norm", "naive_recurrent_gated_delta_rule", "chunk_gated_delta_rule_ref",
    "fused_recurrent_gated_delta_rule", "chunk_gated_delta_rule", "gated_rmsnorm", "gated_rmsnorm_ref",
    "GDNBlockParams", "make_block_params", "qwen3_next_linear_attention", "z_handoff_zero_then_copy",
    "make_inputs", "benchmark", "benchmark_table", "has_timing_methods", "plot_state", "plot_benchmark",
    "CHUNK", "CONFIG", "TIMERS", "time_both", "state_launch", "STATE_FILL", "state_pass_alone", "STATE_RULE",
    "STATE_PREVIOUS",
    "check_decode_step", "check_ut_transform", "check_chunk_spans", "check_state_pass",
    "solution_decode_step", "solution_ut_transform", "solution_chunk_spans", "solution_state_pass",
]

CHUNK = 64
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# Default launch configurations, one per launcher, with the names the kernels take (BV: value columns
# per program; None lets the launcher choose). A launcher's ``config=`` overrides some of them; the
# chunked launcher takes one dict per kernel. ``benchmark()`` sweeps alternatives on the GPU.
CONFIG = {
    "recurrent": {"BV": 32, "num_warps": 4},
    # solve: BC rows per diagonal block solved by substitution before the pairwise merges (a power of
    # two, 2 .. 64; 1, pure merging, does not compile for sm_90: Triton 3.9 fails on its [64, 1, 1]
    # tile), GV value heads per program sharing one K K^T (the launcher uses gcd(GV, HV // H)),
    # PREC the precision of the merge products with 16-bit storage (fp32 storage always uses "tf32x3").
    "chunk": {"solve": {"BC": 16, "GV": 1, "PREC": "tf32", "num_warps": 4, "num_stages": 2},
              "wu": {"num_warps": 4, "num_stages": 2},
              # state: FUSE_O folds kernel 4 (outputs) into the state pass (h and v' never stored);
              # BV / num_warps / num_stages None: state_launch()'s pick from the grid (RULE True; the
              # benchmark records it beside the previous default, STATE_PREVIOUS, which RULE False keeps)
              "state": {"BV": None, "num_warps": None, "num_stages": None, "FUSE_O": False, "RULE": True},
              "output": {"BV": 64, "num_warps": 4, "num_stages": 2}},
    "rmsnorm": {"BM": None, "num_warps": 4},
}
if not ON_GPU:  # the interpreter runs programs one after another: fewer, wider programs are faster
    CONFIG["recurrent"]["BV"] = CONFIG["chunk"]["state"]["BV"] = CONFIG["chunk"]["output"]["BV"] = 128


def _merge_config(default: dict, config, name: str) -> dict:
    """``default`` updated with ``config`` (nested dicts per kernel; unknown names raise)."""
    return resolve_config(config, default, name=f"config of {name}")


def _pow2(n: int, lo: int = 16) -> int:
    """The next power of two >= n, at least ``lo`` (tl.dot and tl.arange need powers of two >= 16)."""
    return max(lo, triton.next_power_of_2(max(n, 1)))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) along the last dim, in fp32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


# --------------------------------------------------------------------------------------------------
# Input checks (shared by references and kernels)
# --------------------------------------------------------------------------------------------------

def _check_bounds(bounds, T, name="cu_seqlens"):
    """The values of a host list of offsets: 0 .. T, non-decreasing."""
    if bounds[0] != 0 or bounds[-1] != T:
        raise ValueError(f"{name} must start at 0 and end at T={T}, got {bounds[0]} .. {bounds[-1]}")
    if any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"{name} must be non-decreasing, got {bounds}")


def _check(q, k, v, g, beta, scale, initial_state, cu_seqlens, *, device=None, inplace=False, cu_seqlens_cpu=None):
    """Validate the public arguments; return (B, T, H, HV, K, V, N).

    Never reads a device tensor on the host (no sync, so a CUDA graph can hold the call): shapes,
    dtypes and devices only. The VALUES of cu_seqlens are checked only from ``cu_seqlens_cpu``, a
    host copy the caller already has (as engines do); without it they are trusted."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dtypes=_FLOATS, ndim=4, device=device)
    dev = q.device
    for name, t in (("k", k), ("v", v)):
        if not same_device(t.device, dev):
            raise ValueError(f"{name} is on {t.device} but q is on {dev}: all inputs must share one device")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape [B, T, H, K] = {list(q.shape)}, got {list(k.shape)}")
    B, T, H, K = q.shape
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v must be [B, T, HV, V] with q's B, T = {B}, {T}, got {list(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H != 0:
        raise ValueError(f"value heads HV={HV} must be a positive multiple of the key heads H={H} "
                         "(value head hv reads key head hv // (HV // H))")
    if not 1 <= K <= 256:
        raise ValueError(f"key head dim K={K} must be in [1, 256] (the whole key dim is one block)")
    if not 1 <= V <= 512:
        raise ValueError(f"value head dim V={V} must be in [1, 512]")
    for name, t in (("g", g), ("beta", beta)):
        check_tensor(name, t, dtypes=_FLOATS, ndim=3, device=dev)
        if tuple(t.shape) != (B, T, HV):
            raise ValueError(f"{name} must be [B, T, HV] = {[B, T, HV]} (one value per token and value "
                             f"head), got {list(t.shape)}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be None (K^-0.5) or a positive finite number, got {scale!r}")
    if cu_seqlens is not None:
        check_tensor("cu_seqlens", cu_seqlens, dtypes=(torch.int32, torch.int64), ndim=1, device=dev)
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1 (sequences laid end to end), got B={B}")
        if cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must hold at least 2 offsets [0, ..., T]")
        N = cu_seqlens.numel() - 1
        if cu_seqlens_cpu is not None:
            check_tensor("cu_seqlens_cpu", cu_seqlens_cpu, dtypes=(torch.int32, torch.int64), ndim=1, device="cpu")
            if cu_seqlens_cpu.numel() != N + 1:
                raise ValueError(f"cu_seqlens_cpu must hold the same {N + 1} offsets as cu_seqlens, "
                                 f"got {cu_seqlens_cpu.numel()}")
            _check_bounds(cu_seqlens_cpu.tolist(), T, "cu_seqlens")   # a host tensor: no device sync
    else:
        if cu_seqlens_cpu is not None:
            raise ValueError("cu_seqlens_cpu is a host copy of cu_seqlens: give cu_seqlens too")
        N = B
    if initial_state is not None:
        check_tensor("initial_state", initial_state, dtypes=_FLOATS, ndim=4, device=dev)
        if tuple(initial_state.shape) != (N, HV, K, V):
            raise ValueError(f"initial_state must be [N, HV, K, V] = {[N, HV, K, V]} (N = number of "
                             f"sequences), got {list(initial_state.shape)}")
    if inplace and initial_state is None:
        raise ValueError("inplace_final_state=True needs an initial_state to update in place")
    return B, T, H, HV, K, V, N


def _host_bounds(cu_seqlens, B, T):
    """Sequence bounds as a host list for the pure-torch references (which loop in Python, so they
    read cu_seqlens on the host and check its values)."""
    if cu_seqlens is None:
        return [i * T for i in range(B + 1)]
    bounds = cu_seqlens.tolist()
    _check_bounds(bounds, T)
    return bounds


# --------------------------------------------------------------------------------------------------
# References (pure torch, fp32)
# --------------------------------------------------------------------------------------------------

def _ref_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel, dtype):
    """What both references start from: the checked sizes and the inputs token-major in ``dtype``,
    q and k (L2-normalised if asked) repeated to the HV value heads. Returns
    ((B, T, HV, K, V, N, bounds, scale), (q [B*T, HV, K], k, v [B*T, HV, V], g [B*T, HV], beta))."""
    B, T, H, HV, K, V, N = _check(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    bounds = _host_bounds(cu_seqlens, B, T)
    scale = K ** -0.5 if scale is None else scale
    qf, kf = q.reshape(B * T, H, K).to(dtype), k.reshape(B * T, H, K).to(dtype)
    if use_qk_l2norm_in_kernel:
        qf, kf = l2norm(qf).to(dtype), l2norm(kf).to(dtype)
    qf, kf = qf.repeat_interleave(HV // H, dim=1), kf.repeat_interleave(HV // H, dim=1)
    vf, gf, bf = v.reshape(B * T, HV, V).to(dtype), g.reshape(B * T, HV).to(dtype), beta.reshape(B * T, HV).to(dtype)
    return (B, T, HV, K, V, N, bounds, scale), (qf, kf, vf, gf, bf)


def naive_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None,
                                     use_qk_l2norm_in_kernel=False, dtype=torch.float32):
    """The recurrence token by token in ``dtype`` (fp32 by default): the reference for everything.
    Returns (o [B, T, HV, V] in ``dtype``, final state [N, HV, K, V] or None)."""
    (B, T, HV, K, V, N, bounds, scale), (qf, kf, vf, gf, bf) = _ref_inputs(
        q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel, dtype)
    o = torch.empty(B * T, HV, V, dtype=dtype, device=q.device)  # rows filled by the loop below
    finals = []
    for n in range(N):
        h = (initial_state[n].to(dtype).clone() if initial_state is not None
             else torch.zeros(HV, K, V, dtype=dtype, device=q.device))
        for t in range(bounds[n], bounds[n + 1]):
            h = h * gf[t].exp()[:, None, None]
            u = bf[t][:, None] * (vf[t] - torch.einsum("hkv,hk->hv", h, kf[t]))
            h = h + kf[t][:, :, None] * u[:, None, :]
            o[t] = torch.einsum("hkv,hk->hv", h, qf[t] * scale)
        finals.append(h)
    return o.view(B, T, HV, V), (torch.stack(finals) if output_final_state else None)


def chunk_gated_delta_rule_ref(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, chunk_size=CHUNK,
                               dtype=torch.float32):
    """The chunked form in pure torch (Yang, Kautz, Hatamizadeh, arXiv 2412.06464; as flash-linear-attention
    computes it): per chunk of ``chunk_size`` tokens,
    A = (I + strict_lower(diag(beta)(K K^T * Gamma)))^-1, W = A diag(beta exp(G)) K, U = A diag(beta) V,
    V' = U - W h, O = (Q exp(G)) h + (Q K^T * Gamma)_causal V', h <- exp(G_C) h + (K exp(G_C - G))^T V'."""
    (B, T, HV, K, V, N, bounds, scale), tok = _ref_inputs(
        q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel, dtype)
    qf, kf, vf, gf, bf = (t.transpose(0, 1) for t in tok)         # head-major: [HV, T_all, ...]
    qf = qf * scale
    o = torch.empty(HV, B * T, V, dtype=dtype, device=q.device)  # every chunk writes its rows below
    finals = []
    for n in range(N):
        h = (initial_state[n].to(dtype).clone() if initial_state is not None
             else torch.zeros(HV, K, V, dtype=dtype, device=q.device))
        for s in range(bounds[n], bounds[n + 1], chunk_size):
            e = min(s + chunk_size, bounds[n + 1])
            C = e - s
            Q, Kc, Vc, b = qf[:, s:e], kf[:, s:e], vf[:, s:e], bf[:, s:e]
            G = gf[:, s:e].cumsum(-1)                                        # [HV, C]
            diff = G[:, :, None] - G[:, None, :]
            low = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
            gamma = torch.where(low, diff, torch.zeros((), dtype=dtype, device=q.device)).exp() * low
            L = (b[:, :, None] * (Kc @ Kc.transpose(1, 2)) * gamma).tril(-1)
            eye = torch.eye(C, dtype=dtype, device=q.device).expand(HV, C, C)
            A = torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)
            W = A @ ((b * G.exp())[:, :, None] * Kc)
            U = A @ (b[:, :, None] * Vc)
            Vn = U - W @ h
            o[:, s:e] = (Q * G.exp()[:, :, None]) @ h + ((Q @ Kc.transpose(1, 2)) * gamma) @ Vn
            Gl = G[:, -1:]
            h = h * Gl.exp()[:, :, None] + (Kc * (Gl - G).exp()[:, :, None]).transpose(1, 2) @ Vn
        finals.append(h)
    return (o.transpose(0, 1).reshape(B, T, HV, V),
            torch.stack(finals) if output_final_state else None)


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------

def _emulate(emulate):
    """The one emulation switch: default ``not ON_GPU``; ``emulate=False`` needs a GPU."""
    return resolve_emulate(emulate, "it runs tl.dot on 16-bit operands, which Triton's interpreter gets wrong")


def _final_state_buffer(initial_state, inplace, N, HV, K, V, dev):
    if inplace:
        # In place: the program that owns state slice (n, hv, :, v-block) reads it first and writes it
        # last; no other program touches it, so aliasing h0 and ht is race-free.
        return initial_state
    # empty: each (n, hv, v-block) program stores its whole [K, BV] slice (K rows, BV columns,
    # masked only at the true K / V edges), and the programs tile [N, HV, K, V] exactly.
    return torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)


def _fla_gates(q, v, g, beta, *, gk=None, gv=None, use_gate_in_kernel=False, A_log=None, dt_bias=None,
               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False):
    """Turn flash-linear-attention's gate options into plain (g, beta) before the kernels run.

    fla fuses these into its kernels; here they are one or two elementwise torch ops on [B, T, HV]
    (tiny next to q, k, v). Unsupported options raise instead of being ignored."""
    if gk is not None or gv is not None:
        raise ValueError("gk / gv (per-channel decays) are not supported: only the per-head scalar gate g")
    if state_v_first:
        raise ValueError("state_v_first=True is not supported: states are [N, HV, K, V] (K first)")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (beta = 2 sigmoid(beta))")
    if isinstance(v, torch.Tensor) and v.dim() == 4:
        shape, dev = tuple(v.shape[:3]), v.device
        if g is None and not use_gate_in_kernel:
            g = torch.zeros(shape, dtype=torch.float32, device=dev)   # no decay: log gate 0 (a value, not a fill)
        if beta is None:
            beta = torch.ones(shape, dtype=v.dtype, device=dev)       # fla's default: full-strength writes
    if use_gate_in_kernel:
        if A_log is None or not isinstance(g, torch.Tensor):
            raise ValueError("use_gate_in_kernel=True needs the raw gate input g and A_log [HV]")
        check_tensor("A_log", A_log, dtypes=_FLOATS, ndim=1, device=g.device)
        if A_log.shape[0] != g.shape[-1]:
            raise ValueError(f"A_log must be [HV] = [{g.shape[-1]}], got {list(A_log.shape)}")
        a = g.float()
        if dt_bias is not None:
            check_tensor("dt_bias", dt_bias, dtypes=_FLOATS, ndim=1, device=g.device)
            if dt_bias.shape != A_log.shape:
                raise ValueError(f"dt_bias must be [HV] = {list(A_log.shape)}, got {list(dt_bias.shape)}")
            a = a + dt_bias.float()
        g = (-A_log.float().exp() * F.softplus(a)).contiguous()
    if use_beta_sigmoid_in_kernel and isinstance(beta, torch.Tensor):
        beta = (torch.sigmoid(beta.float()) * (2.0 if allow_neg_eigval else 1.0)).contiguous()
    return g, beta


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None,
                                     dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                                     state_v_first=False, cu_seqlens=None, inplace_final_state=False,
                                     cu_seqlens_cpu=None, config=None):
    """Recurrent Gated DeltaNet in one Triton kernel (decode and short sequences).

    Arguments in flash-linear-attention's order (``g, gk, gv, beta``: pass beta by keyword, or
    positionally as the 7th argument as in fla). ``gk``/``gv`` and ``state_v_first`` are not
    supported (clear error). Returns ``(o [B, T, HV, V] in v's dtype, final_state [N, HV, K, V] fp32
    or None)``. With ``inplace_final_state=True`` the final state is written into ``initial_state``
    (its dtype) and that tensor is returned. ``config``: launch configuration, names as in
    ``CONFIG["recurrent"]`` (``{"BV": 32, "num_warps": 4}``).

    A varlen decode step (``cu_seqlens`` on the device) never waits for the device nor copies from
    it, so a CUDA graph can hold the call; the offsets' values are checked only from
    ``cu_seqlens_cpu`` (a host copy) when it is given.
    """
    g, beta = _fla_gates(q, v, g, beta, gk=gk, gv=gv, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log,
                         dt_bias=dt_bias, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                         allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first)
    B, T, H, HV, K, V, N = _check(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                  device=DEVICE, inplace=inplace_final_state, cu_seqlens_cpu=cu_seqlens_cpu)
    cfg = _merge_config(CONFIG["recurrent"], config, "fused_recurrent_gated_delta_rule")
    scale = K ** -0.5 if scale is None else float(scale)
    # empty: o[b, t, hv, :] is written by the programs of head hv of the sequence holding t, one
    # value block each, at its step t; every token belongs to exactly one sequence (checked above).
    o = torch.empty_like(v)
    store = output_final_state or inplace_final_state
    ht = _final_state_buffer(initial_state, inplace_final_state, N, HV, K, V, q.device) if store else None
    BK = _pow2(K)
    BV = min(cfg["BV"], _pow2(V))
    require_launchable(kern.fused_recurrent_gdn_fwd_kernel)
    # initial_state, ht and cu_seqlens go in as None when absent: the kernel's heuristics turn them
    # into the constexpr flags USE_H0, STORE_HT, IS_VARLEN (no placeholder tensor anywhere).
    kern.fused_recurrent_gdn_fwd_kernel[(triton.cdiv(V, BV), N * HV)](
        q, k, v, g, beta, o, initial_state, ht, cu_seqlens, scale, T,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, USE_QK_L2NORM=bool(use_qk_l2norm_in_kernel),
        num_warps=cfg["num_warps"])
    return o, ht


def chunk_count_bound(T: int, N: int, chunk: int = CHUNK) -> int:
    """An upper bound of the number of chunks of N sequences of T tokens in all, from shapes alone:
    sum_n cdiv(L_n, C) <= sum_n (L_n + C - 1) / C = (T + N (C - 1)) / C, and never more than T
    (every chunk holds a token)."""
    return min(T, (T + N * (chunk - 1)) // chunk)


def _chunk_table(cu_seqlens, N: int, T: int):
    """(chunk_indices [NT_MAX, 2], chunk_offsets [N + 1], NT_MAX), built on the device by one small
    kernel: no host sync, so a CUDA graph can hold it, and the launch depends on shapes only (a
    captured graph stays right for any offsets with the same T and N)."""
    nt_max = chunk_count_bound(T, N)
    # empty: program c of the table kernel writes rows [c*BC, (c+1)*BC) of chunk_indices (both
    # columns, masked at NT_MAX; the grid covers all NT_MAX rows), and program 0 writes all N + 1
    # entries of chunk_offsets (entry 0, then entries n + 1 tile by tile over all N sequences).
    chunk_indices = torch.empty(max(nt_max, 1), 2, dtype=torch.int32, device=cu_seqlens.device)
    chunk_offsets = torch.empty(N + 1, dtype=torch.int32, device=cu_seqlens.device)
    BC = 128 if ON_GPU else 256
    require_launchable(kern.chunk_table_kernel)
    kern.chunk_table_kernel[(max(1, triton.cdiv(nt_max, BC)),)](
        cu_seqlens, chunk_indices, chunk_offsets, N, T, nt_max, BT=CHUNK, BC=BC,
        BN=min(64, _pow2(N)), num_warps=4)
    return chunk_indices, chunk_offsets, nt_max


# The state pass is the one sequential part of the chunked form: a program walks every chunk of its
# sequence for a [K, BV] slice of one head's state, and each chunk waits for the one before. Its time
# is therefore (chunks per sequence) x (one chunk's latency) as long as every program is resident on
# an SM, and grows by whole waves once they are not. A narrower slice (BV) shortens a chunk's latency
# (smaller products on the chain) but every program re-reads the chunk's w and k, so narrow slices
# multiply that traffic. Rule, from the grid alone (no per-shape table):
#   BV: the widest of 64, 32, 16 whose grid still gives at least STATE_FILL programs per SM;
#   num_stages: 3 (the next chunks' w, u and k tiles, which do not depend on the state, load while
#   this chunk's products run) when the programs each SM must hold still fit its shared memory with
#   three tiles in flight, else 2; num_warps: 4 (one warpgroup: sm_90's wgmma; 2 warps spill).
#   Varlen batches (cu_seqlens): the sequences differ in length, the pass lasts as long as the longest
#   one, and the programs of the shorter ones finish early and free their SM; so the stages are chosen
#   for one program per SM (the long sequences' chunk latency is what counts). The lengths themselves
#   are never read: they live on the device, and reading them would sync the host.
STATE_FILL = 7 / 8
_SMEM_PER_PROGRAM = 8 << 10     # shared memory a state program uses besides its pipelined tiles (about)


@functools.lru_cache(maxsize=None)
def _sm_count() -> tuple:
    """(SMs, shared memory per SM in bytes) of the GPU in use; without one, an H200's (132, 228 KiB):
    the figures the rule assumes where the interpreter ignores launch configurations anyway."""
    if ON_GPU:
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return p.multi_processor_count, getattr(p, "shared_memory_per_multiprocessor", 228 << 10)
    return 132, 228 << 10


def state_launch(N: int, HV: int, K: int, V: int, itemsize: int = 2, n_sm: int | None = None,
                 smem_per_sm: int | None = None, varlen: bool = False) -> dict:
    """The state pass's launch configuration, {"BV", "num_warps", "num_stages"}, for N sequences of HV
    value heads with K x V states stored ``itemsize`` bytes per element (w, k, u, h), by the rule
    above. ``n_sm``, ``smem_per_sm``: the GPU's (default: the GPU in use). ``varlen``: the N sequences
    come from cu_seqlens (lengths unknown on the host): stages for one program per SM."""
    sm, smem = _sm_count()
    n_sm, smem_per_sm = n_sm or sm, smem_per_sm or smem
    bv = min(64, _pow2(V))
    while bv > 16 and N * HV * triton.cdiv(V, bv) < STATE_FILL * n_sm:
        bv //= 2
    per_sm = 1 if varlen else triton.cdiv(N * HV * triton.cdiv(V, bv), n_sm)   # programs each SM must hold
    stage = CHUNK * (2 * _pow2(K) + bv) * itemsize                # one chunk's w, k and u tiles
    ns = 3 if per_sm * (3 * stage + _SMEM_PER_PROGRAM) <= smem_per_sm else 2
    return {"BV": bv, "num_warps": 4, "num_stages": ns}


def _state_cfg(cs: dict, N: int, HV: int, K: int, V: int, itemsize: int, varlen: bool = False) -> dict:
    """config['state'] with each name left None filled in: by state_launch with RULE (the default),
    else by the previous default (:func:`_previous_state_cfg`). A given BV is capped at V."""
    rule = state_launch(N, HV, K, V, itemsize, varlen=varlen) if cs.get("RULE") else _previous_state_cfg(N, HV, V)
    out = {k: (rule[k] if cs[k] is None else cs[k]) for k in ("BV", "num_warps", "num_stages")}
    out["BV"] = min(out["BV"], _pow2(V))
    return out


def _launch_state(c3, k, w, u, G, h, v_new, q, o, initial_state, ht, cu_seqlens, chunk_offsets, scale, T, NT,
                  *, N, l2, emulate):
    """Kernel 3 (the state pass) with launch configuration ``c3`` {"BV", "num_warps", "num_stages"}: one
    program per (V block, sequence, value head). Shared by the launcher and the benchmark's timing of
    the state pass alone (:func:`state_pass_alone`)."""
    H, K, HV, V = k.shape[-2], k.shape[-1], w.shape[-2], u.shape[-1]
    kern.chunk_gdn_state_kernel[(triton.cdiv(V, c3["BV"]), N * HV)](
        k, w, u, G, h, v_new, q, o, initial_state, ht, cu_seqlens, chunk_offsets, scale, T, max(NT, 1),
        H=H, HV=HV, K=K, V=V, BT=CHUNK, BK=_pow2(K), BV=c3["BV"], USE_Q_L2NORM=l2, EMULATE=emulate,
        num_warps=c3["num_warps"], num_stages=c3["num_stages"])


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                           chunk_indices=None, *, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                           inplace_final_state=False, config=None, return_intermediates=False,
                           emulate: bool | None = None):
    """Chunked Gated DeltaNet (prefill), chunks of 64 tokens, four Triton kernels:
    solve (G and A = (I + L)^-1 per chunk) -> w/u (parallel over chunks) -> state pass (sequential
    over chunks) -> output (parallel over chunks). Arguments in flash-linear-attention's order; returns as
    :func:`fused_recurrent_gated_delta_rule`. With ``use_qk_l2norm_in_kernel`` the solve kernel
    normalises the keys once and stores them for the two later kernels.

    Varlen (``cu_seqlens`` on the device) never waits for the device nor copies from it: the chunk
    table is built on the device for an upper bound of the chunk count known from shapes
    (:func:`chunk_count_bound`), so a CUDA graph can hold the call. The offsets' values are checked
    only from ``cu_seqlens_cpu`` (a host copy, as engines keep one) when it is given;
    ``chunk_indices`` is accepted and ignored (built here).

    ``config``: launch configuration, one dict per kernel, names as in ``CONFIG["chunk"]`` (e.g.
    ``{"state": {"BV": 32, "num_warps": 8}}``); the state pass's BV, num_warps and num_stages left None
    take the pick of :func:`state_launch`, or with ``{"state": {"RULE": False}}`` the previous default
    (``STATE_PREVIOUS``). ``return_intermediates=True`` also returns the dict
    of intermediate buffers (G, A, w, u, v_new, h, and kn with the in-kernel L2 norm) so that their
    coverage can be checked.
    ``emulate`` (default: True without a GPU) runs ``tl.dot`` on fp32 copies, the interpreter's
    workaround (kernels/gdn.py ``_dot``); ``emulate=False`` needs a GPU."""
    g, beta = _fla_gates(q, v, g, beta, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
                         use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                         allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first)
    B, T, H, HV, K, V, N = _check(q, k, v, g, beta, scale, initial_state, cu_seqlens, device=DEVICE,
                                  inplace=inplace_final_state, cu_seqlens_cpu=cu_seqlens_cpu)
    cfg = _merge_config(CONFIG["chunk"], config, "chunk_gated_delta_rule")
    c1 = cfg["solve"]
    if c1["BC"] not in (2, 4, 8, 16, 32, 64) or not (isinstance(c1["GV"], int) and c1["GV"] >= 1) \
            or c1["PREC"] not in ("tf32", "tf32x3"):
        raise ValueError(f"config['solve'] needs BC a power of two in 2..64, GV >= 1 and PREC 'tf32' or "
                         f"'tf32x3'; got BC={c1['BC']!r}, GV={c1['GV']!r}, PREC={c1['PREC']!r}")
    emulate = _emulate(emulate)
    scale = K ** -0.5 if scale is None else float(scale)
    dev = q.device
    dt = q.dtype   # storage dtype of w, u, v', h (and of the matrix units), as in fla
    l2 = bool(use_qk_l2norm_in_kernel)
    TA = B * T
    for kfn in (kern.chunk_gdn_solve_kernel, kern.chunk_gdn_wu_kernel, kern.chunk_gdn_state_kernel,
                kern.chunk_gdn_output_kernel):
        require_launchable(kfn)
    if cu_seqlens is not None and TA:
        chunk_indices, chunk_offsets, NT = _chunk_table(cu_seqlens, N, TA)
    else:
        chunk_indices = chunk_offsets = None
        NT = B * triton.cdiv(T, CHUNK)
    BK, BVf = _pow2(K), _pow2(V)
    # Intermediates. All `empty`: chunk c of sequence n covers rows [bos + 64c, min(bos + 64c + 64, eos))
    # and the chunks of all sequences tile [0, T_all) (cu_seqlens: 0 .. T, non-decreasing), so each
    # per-row buffer below is written row by row by its chunk's program before anyone reads it.
    G = torch.empty(TA, HV, dtype=torch.float32, device=dev)   # kernel 1, program (chunk, hv)
    # kernel 1, program (chunk, value heads hv .. hv + GV - 1): its rows x all 64 columns (zeros above the diagonal)
    A = torch.empty(TA, HV, CHUNK, dtype=dt, device=dev)
    # kernel 1, the program (chunk, hv ..) whose first value head is its key head's first: all K columns
    kn = torch.empty(TA, H, K, dtype=dt, device=dev) if l2 else None
    w = torch.empty(TA, HV, K, dtype=dt, device=dev)           # kernel 2, program (chunk, hv), all K columns
    u = torch.empty(TA, HV, V, dtype=dt, device=dev)           # kernel 2, all V columns
    # With FUSE_O (kernel 4 folded into kernel 3) v' and h stay in registers and are not allocated;
    # return_intermediates asks for them, so it runs the four-kernel form.
    fuse = bool(cfg["state"]["FUSE_O"]) and not return_intermediates
    # kernel 3, program (v-block, n, hv): its sequence's rows x its V block
    v_new = None if fuse else torch.empty(TA, HV, V, dtype=dt, device=dev)
    # h[c, hv] = state at the start of chunk c: kernel 3 stores it for every chunk of every sequence
    # (chunk_offsets numbers them 0 .. NT-1 without gaps), all K rows, its V block. For a varlen
    # batch NT is an upper bound (chunk_count_bound); rows past the true count are neither written
    # nor read (kernel 4's programs for them exit at once).
    h = None if fuse else torch.empty(max(NT, 1), HV, K, V, dtype=dt, device=dev)
    # o: kernel 4 program (v-block, chunk, hv) writes the chunk's rows x its V block; with FUSE_O,
    # kernel 3 program (v-block, n, hv) writes its sequence's rows (all its chunks) x its V block.
    o = torch.empty_like(v)
    store = output_final_state or inplace_final_state
    ht = _final_state_buffer(initial_state, inplace_final_state, N, HV, K, V, dev) if store else None
    # Absent optional inputs (initial_state, ht, cu_seqlens and its tables, kn) go in as None; the
    # kernels' heuristics turn them into constexpr flags.
    c1, c2, cs, co = cfg["solve"], cfg["wu"], cfg["state"], cfg["output"]
    if NT:
        gv = math.gcd(c1["GV"], HV // H)
        kern.chunk_gdn_solve_kernel[(NT, HV // gv)](
            k, g, beta, G, A, kn, cu_seqlens, chunk_indices, T,
            H=H, HV=HV, K=K, BT=CHUNK, BK=BK, BC=c1["BC"], GV=gv, PREC=c1["PREC"], EMULATE=emulate,
            num_warps=c1["num_warps"], num_stages=c1["num_stages"])
    kc = kn if l2 else k       # the keys the later kernels read: normalised once, by kernel 1
    if NT:
        kern.chunk_gdn_wu_kernel[(NT, HV)](
            kc, v, beta, G, A, w, u, cu_seqlens, chunk_indices, T,
            H=H, HV=HV, K=K, V=V, BT=CHUNK, BK=BK, BV=BVf, EMULATE=emulate,
            num_warps=c2["num_warps"], num_stages=c2["num_stages"])
    _launch_state(_state_cfg(cs, N, HV, K, V, q.element_size(), cu_seqlens is not None), kc, w, u, G, h, v_new,
                  q if fuse else None, o if fuse else None, initial_state, ht, cu_seqlens, chunk_offsets, scale, T,
                  NT, N=N, l2=l2, emulate=emulate)
    BV3 = min(co["BV"], BVf)
    if NT and not fuse:
        kern.chunk_gdn_output_kernel[(triton.cdiv(V, BV3), NT, HV)](
            q, kc, v_new, h, G, o, cu_seqlens, chunk_indices, scale, T,
            H=H, HV=HV, K=K, V=V, BT=CHUNK, BK=BK, BV=BV3, USE_Q_L2NORM=l2, EMULATE=emulate,
            num_warps=co["num_warps"], num_stages=co["num_stages"])
    if return_intermediates:
        inter = {"G": G, "A": A, "w": w, "u": u, "v_new": v_new, "h": h}
        if l2:
            inter["kn"] = kn
        return o, ht, inter
    return o, ht


# --------------------------------------------------------------------------------------------------
# Gated RMSNorm
# --------------------------------------------------------------------------------------------------

def _check_norm(x, z, weight, eps, device=None):
    check_tensor("x", x, dtypes=_FLOATS, device=device)
    check_tensor("z", z, dtypes=_FLOATS, device=x.device)
    check_tensor("weight", weight, dtypes=_FLOATS, ndim=1, device=x.device)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last (head) dim, got shape {list(x.shape)}")
    if z.shape != x.shape:
        raise ValueError(f"z must have x's shape {list(x.shape)}, got {list(z.shape)}")
    if z.dtype != x.dtype:
        raise TypeError(f"z must have x's dtype {x.dtype}, got {z.dtype}")
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must be [D] with D = x.shape[-1] = {x.shape[-1]}, got {list(weight.shape)}")
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")


def gated_rmsnorm_ref(x, z, weight, eps=1e-6):
    """weight * x * rsqrt(mean(x^2) + eps) * silu(z) over the last dim, fp32 inside, x's dtype out."""
    _check_norm(x, z, weight, eps)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float() * F.silu(z.float())
    return y.to(x.dtype)


def gated_rmsnorm(x, z, weight, eps=1e-6, config=None):
    """Gated RMSNorm (Qwen3-Next ``RMSNormGated``) per head: normalises the last dim of x.
    ``config``: names as in ``CONFIG["rmsnorm"]`` (``BM`` rows per program, ``num_warps``)."""
    _check_norm(x, z, weight, eps, device=DEVICE)
    cfg = _merge_config(CONFIG["rmsnorm"], config, "gated_rmsnorm")
    D = x.shape[-1]
    M = x.numel() // D
    # empty: program i writes rows [i*BM, (i+1)*BM) x all D columns; the grid covers all M rows.
    y = torch.empty_like(x)
    BD = _pow2(D, 1)
    BM = cfg["BM"] or max(1, min(16, 4096 // BD))
    require_launchable(kern.gated_rmsnorm_kernel)
    if M:
        kern.gated_rmsnorm_kernel[(triton.cdiv(M, BM),)](x, z, weight, y, M, float(eps), D=D, BD=BD, BM=BM,
                                                         num_warps=cfg["num_warps"])
    return y


# --------------------------------------------------------------------------------------------------
# A Qwen3-Next-style linear-attention block
# --------------------------------------------------------------------------------------------------

@dataclass
class GDNBlockParams:
    """Weights of one linear-attention (Gated DeltaNet) block. Shapes: in_proj_qkvz
    [2*Hk*Dk + 2*Hv*Dv, hidden], in_proj_ba [2*Hv, hidden], conv_weight [2*Hk*Dk + Hv*Dv, conv_k],
    A_log, dt_bias [Hv], norm_weight [Dv], out_proj [hidden, Hv*Dv]."""
    in_proj_qkvz: torch.Tensor
    in_proj_ba: torch.Tensor
    conv_weight: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    norm_weight: torch.Tensor
    out_proj: torch.Tensor
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int


def make_block_params(hidden=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_k=4,
                      dtype=torch.float32, device=None, seed=0) -> GDNBlockParams:
    """Random weights of a small block (Qwen3-Next: hidden 2048, 16 key heads, 32 value heads, 128, 4)."""
    gen = torch.Generator().manual_seed(seed)
    dev = device or DEVICE
    nk, nv = num_k_heads * head_k_dim, num_v_heads * head_v_dim
    r = lambda *s, std=1.0: (torch.randn(*s, generator=gen) * std).to(dtype=dtype, device=dev)  # noqa: E731
    return GDNBlockParams(
        in_proj_qkvz=r(2 * nk + 2 * nv, hidden, std=hidden ** -0.5),
        in_proj_ba=r(2 * num_v_heads, hidden, std=hidden ** -0.5),
        conv_weight=r(2 * nk + nv, conv_k, std=0.5),
        A_log=(torch.rand(num_v_heads, generator=gen) * 2 - 1).to(device=dev),
        dt_bias=(torch.rand(num_v_heads, generator=gen)).to(device=dev),
        norm_weight=(1 + 0.1 * torch.randn(head_v_dim, generator=gen)).to(dtype=dtype, device=dev),
        out_proj=r(hidden, nv, std=nv ** -0.5),
        num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)


def z_handoff_zero_then_copy(z: torch.Tensor) -> torch.Tensor:
    """The pattern removed from a GDN path: a fresh buffer zero-filled, then overwritten whole."""
    z_out = torch.empty(z.shape, dtype=z.dtype, device=z.device)
    z_out.zero_()   # redundant: the next line writes every element of z_out
    z_out[:] = z
    return z_out


def qwen3_next_linear_attention(hidden: torch.Tensor, p: GDNBlockParams, *, kernel: str = "chunk",
                                legacy_z_zero_fill: bool = False) -> torch.Tensor:
    """One Qwen3-Next-style linear-attention block on ``hidden [B, T, hidden]``; RETURNS its output
    ``[B, T, hidden]`` (no caller-owned output buffer, so a compiler can fuse what follows).

    projections -> causal depthwise conv1d (kernel conv_k) + SiLU over concat(q, k, v) -> gates
    g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) -> Gated DeltaNet with q, k L2-normalised
    in the kernel -> gated RMSNorm per head with z -> out projection. ``kernel`` is 'chunk',
    'recurrent' or 'reference' (fp32 naive recurrence). The projection layout here is plain
    concatenation (the real checkpoint interleaves per key-head group).
    """
    if kernel not in ("chunk", "recurrent", "reference"):
        raise ValueError(f"kernel must be 'chunk', 'recurrent' or 'reference', got {kernel!r}")
    check_tensor("hidden", hidden, dtypes=_FLOATS, ndim=3, device=p.out_proj.device)
    B, T, D = hidden.shape
    if D != p.in_proj_qkvz.shape[1]:
        raise ValueError(f"hidden's last dim {D} must match the block's hidden size {p.in_proj_qkvz.shape[1]}")
    Hk, Hv, Dk, Dv = p.num_k_heads, p.num_v_heads, p.head_k_dim, p.head_v_dim
    nk, nv = Hk * Dk, Hv * Dv
    qkvz = hidden @ p.in_proj_qkvz.T
    ba = hidden @ p.in_proj_ba.T
    qkv, z = qkvz[..., : 2 * nk + nv], qkvz[..., 2 * nk + nv:]
    kc = p.conv_weight.shape[1]
    qkv = F.conv1d(F.pad(qkv.transpose(1, 2), (kc - 1, 0)), p.conv_weight[:, None, :],
                   groups=qkv.shape[-1]).transpose(1, 2)
    qkv = F.silu(qkv)
    q = qkv[..., :nk].reshape(B, T, Hk, Dk).contiguous()
    k = qkv[..., nk: 2 * nk].reshape(B, T, Hk, Dk).contiguous()
    v = qkv[..., 2 * nk:].reshape(B, T, Hv, Dv).contiguous()
    b, a = ba[..., :Hv], ba[..., Hv:]
    g = (-p.A_log.float().exp() * F.softplus(a.float() + p.dt_bias.float())).contiguous()
    beta = torch.sigmoid(b.float()).to(hidden.dtype).contiguous()
    if kernel == "reference":
        core, _ = naive_recurrent_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        core = core.to(hidden.dtype)
    else:
        fn = chunk_gated_delta_rule if kernel == "chunk" else fused_recurrent_gated_delta_rule
        core, _ = fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    z = z.reshape(B, T, Hv, Dv)
    if legacy_z_zero_fill:
        z = z_handoff_zero_then_copy(z)
    else:
        z = z.contiguous()
    if kernel == "reference":
        y = gated_rmsnorm_ref(core, z, p.norm_weight)
    else:
        y = gated_rmsnorm(core, z, p.norm_weight)
    return y.reshape(B, T, nv) @ p.out_proj.T


# --------------------------------------------------------------------------------------------------
# Inputs, benchmark, plots
# --------------------------------------------------------------------------------------------------

def make_inputs(B, T, H, K, V=None, HV=None, dtype=torch.float32, gate="medium", device=None, seed=0,
                initial_state=False, normalize_qk=True):
    """Random inputs in the shapes of the public functions. ``gate``: 'near0' (g ~ -1e-3, almost no
    decay), 'medium', 'strong' (g ~ -5: the state forgets within a few tokens) or 'mixed'."""
    gen = torch.Generator().manual_seed(seed)
    V = V or K
    HV = HV or H
    dev = device or DEVICE
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = r(B, T, H, K), r(B, T, H, K)
    if normalize_qk:
        q, k = l2norm(q), l2norm(k)
    v = r(B, T, HV, V)
    scale_g = {"near0": 1e-3, "medium": 0.1, "strong": 5.0}
    if gate == "mixed":
        g = -torch.rand(B, T, HV, generator=gen) * torch.tensor([1e-3, 0.1, 1.0, 5.0]).repeat(HV)[:HV]
    else:
        g = -torch.rand(B, T, HV, generator=gen) * scale_g[gate]
    beta = torch.rand(B, T, HV, generator=gen) * 0.9 + 0.05
    out = dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g.float(), beta=beta.to(dtype))
    out = {n: t.to(dev) for n, t in out.items()}
    if initial_state:
        out["initial_state"] = (r(B, HV, K, V) * 0.5).to(dev)
    return out


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fc
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fr
        import fla
        return fc, fr, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001  (the peer is optional)
        return None, None, f"unavailable: {type(e).__name__}: {e}"


def _previous_state_cfg(N: int, HV: int, V: int) -> dict:
    """The state pass's previous default launch configuration (``STATE_PREVIOUS``, kept with
    ``{"state": {"RULE": False}}``; the benchmark records it beside :func:`state_launch`'s pick):
    BV 64, else 32, once the grid reaches 256 programs, else 16; num_stages 2; num_warps 4."""
    bv = next((b for b in (64, 32) if N * HV * triton.cdiv(V, b) >= 256), 16)
    return {"BV": min(bv, _pow2(V)), "num_warps": 4, "num_stages": 2}


def state_pass_alone(args: dict, config: dict | None = None):
    """A function that launches the state pass (kernel 3) alone, as :func:`chunk_gated_delta_rule`
    launches it in its four-kernel form, on the intermediates of one call with ``args`` (made once, here;
    ``.call_outputs`` holds that call's (o, final state)), with the launch configuration ``config``
    {"BV", "num_warps", "num_stages"} (names left out or None: the rule's). Each call rewrites h, v' and
    ``.final_state``; the benchmark times it alone, by graph replay."""
    q, k, v = args["q"], args["k"], args["v"]
    cu = args.get("cu_seqlens")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu is None else cu.numel() - 1
    l2 = bool(args.get("use_qk_l2norm_in_kernel", False))
    o, ht0, inter = chunk_gated_delta_rule(**args, return_intermediates=True)
    if cu is not None:
        _, chunk_offsets, NT = _chunk_table(cu, N, B * T)
    else:
        chunk_offsets, NT = None, B * triton.cdiv(T, CHUNK)
    cs = {"BV": None, "num_warps": None, "num_stages": None, "RULE": True, **(config or {})}
    c3 = _state_cfg(cs, N, HV, K, V, q.element_size(), cu is not None)
    h0 = args.get("initial_state")
    # the final state as the launcher allocates it (empty: the programs tile it; see _final_state_buffer)
    ht = _final_state_buffer(h0, False, N, HV, K, V, q.device) if args.get("output_final_state") else None
    scale = K ** -0.5 if args.get("scale") is None else float(args["scale"])
    kc = inter["kn"] if l2 else k
    emulate = _emulate(None)

    def run():
        _launch_state(c3, kc, inter["w"], inter["u"], inter["G"], inter["h"], inter["v_new"], None, None, h0, ht,
                      cu, chunk_offsets, scale, T, NT, N=N, l2=l2, emulate=emulate)
    run.config, run.final_state, run.call_outputs = c3, ht, (o, ht0)
    return run


# (B, T, key heads H, value heads HV, D, L2 norm of q and k in the kernel): the three shapes,
# then a Qwen3-Next linear-attention layer (16 key / 32 value heads, D = 128, q and k normalised in
# the kernel as the model calls it) at the two ends of T = 4k .. 32k.
CHUNK_SHAPES = [(1, 8192, 16, 16, 128, False), (4, 4096, 32, 32, 128, False), (2, 2048, 16, 32, 128, False),
                (1, 4096, 16, 32, 128, True), (1, 32768, 16, 32, 128, True)]
# a varlen prefill batch of the Qwen3-Next layer (key heads, value heads, D): four sequences, one of a single token
VARLEN_SEQS, VARLEN_HEADS = (1, 3071, 4000, 1120), (16, 32, 128)
# every prefill call of the record: CHUNK_SHAPES + (sequence lengths or None,), then the varlen batch
_SPECS = [(*s, None) for s in CHUNK_SHAPES] + [(1, sum(VARLEN_SEQS), *VARLEN_HEADS, True, VARLEN_SEQS)]
PROFILE_SHAPES = {(1, 8192, 16, 16, 128), (2, 2048, 16, 32, 128)}   # per-kernel times recorded for these
# the state pass alone, the rule's pick beside the previous default, at the shapes with few sequences x
# heads (the rule's territory); at STATE_GRID_SHAPES also a BV x num_stages grid (under the budget)
STATE_SHAPES = {(1, 8192, 16, 16, 128), (2, 2048, 16, 32, 128), (1, 32768, 16, 32, 128), (1, 8192, 16, 32, 128)}
STATE_GRID_SHAPES = {(1, 8192, 16, 16, 128), (1, 32768, 16, 32, 128)}
STATE_GRID = [(bv, ns) for bv in (16, 32, 64) for ns in (2, 3)]
DECODE_SHAPE = (256, 32, 128)
WARM_T = 1024   # tokens of the compile warm-up calls (same divisibility by 16 of T and chunk counts)

TIMERS = {
    "graph_us": "GPU time per call: the call captured in a CUDA graph and replayed (workbook.bench."
                "graph_time_us); no Python or launch work between kernels. Claims are made on this.",
    "eager_us": "eager per-call time: the Python call timed with triton.testing.do_bench (CUDA events "
                "around each call), so the host's work and every kernel launch are included.",
    "kernels_us": "each device kernel's own GPU time per call, from torch.profiler over 5 eager calls "
                  "(kernel durations; gaps between kernels not included).",
}


def _bench_args(spec, warm: bool = False) -> dict:
    """Arguments of one benchmark call (bf16, mixed gates, initial state in, final state out) for a
    CHUNK_SHAPES entry, or the decode call for spec "decode". ``warm``: the same call at WARM_T tokens
    (same batch, heads, flags and dtypes: the same compiled kernels), for the compile warm-up."""
    if spec == "decode":
        Bd, Hd, Dd = DECODE_SHAPE
        x = make_inputs(Bd, 1, Hd, Dd, dtype=torch.bfloat16, gate="mixed", initial_state=True)
        return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x["initial_state"],
                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    B, T, H, HV, D, l2, seqs = spec
    if warm:
        T = WARM_T
        if seqs is not None:   # the same number of sequences, scaled down (each at least one token)
            seqs = [max(1, s * WARM_T // sum(seqs)) for s in seqs[:-1]]
            seqs.append(WARM_T - sum(seqs))
    x = make_inputs(B, T if seqs is None else sum(seqs), H, D, HV=HV, dtype=torch.bfloat16, gate="mixed",
                    normalize_qk=not l2)
    N = B if seqs is None else len(seqs)
    x["initial_state"] = torch.randn(N, HV, D, D, device=DEVICE) * 0.3
    args = dict(**x, output_final_state=True, use_qk_l2norm_in_kernel=l2)
    if seqs is not None:
        args["cu_seqlens"] = torch.tensor([0, *seqs], device=DEVICE).cumsum(0)
    return args


def _warm_one(task) -> str:
    """(In a spawned process.) One call of ours or of fla at the warm-up size of a benchmark shape, so
    that its kernels are compiled into Triton's disk cache before anything is timed. fla autotunes
    here on a busy GPU and a small shape: FLA_CACHE_RESULTS=0 keeps those picks off the disk, so fla
    autotunes again in the timing process, alone (from the cached binaries: benchmarking only)."""
    import os
    import time

    os.environ["FLA_CACHE_RESULTS"] = "0"
    who, spec, state = task
    t0 = time.time()
    try:
        args = _bench_args(spec, warm=True)
        if spec == "decode":
            fn = _fla()[1] if who == "fla" else fused_recurrent_gated_delta_rule
        else:
            fn = _fla()[0] if who == "fla" else chunk_gated_delta_rule
        if fn is None:
            return f"{who} {spec}: peer unavailable"
        fn(**args, **({"config": {"state": state}} if state else {}))
        if ON_GPU:
            torch.cuda.synchronize()
        return f"{who} {spec} {state or ''}: {time.time() - t0:.1f} s"
    except Exception as e:  # noqa: BLE001  (the timing process compiles whatever is missing)
        return f"{who} {spec} {state or ''}: failed: {type(e).__name__}: {e}"[:200]


def _warm_compile(tasks, procs: int, timeout_s: float) -> dict:
    """Run ``_warm_one`` over ``tasks`` in ``procs`` spawned processes (Triton compiles on the CPU: a
    cold machine compiles in parallel what one process would compile one kernel after another).
    Nothing is timed meanwhile. Whatever fails or is cut by ``timeout_s`` is compiled later, in the
    timing process, before its first timing (each timing calls its function once first)."""
    import multiprocessing as mp
    import time

    t0 = time.time()
    out = {"tasks": len(tasks), "processes": procs}
    pool = mp.get_context("spawn").Pool(procs)
    try:
        out["results"] = pool.map_async(_warm_one, tasks, chunksize=1).get(timeout=timeout_s)
    except Exception as e:  # noqa: BLE001  (a timeout or a broken pool costs time, not the record)
        out["results"] = [f"warm-up cut: {type(e).__name__}: {e}"[:200]]
    finally:
        pool.terminate()
        pool.join()
    out["wall_s"] = time.time() - t0
    return out


def _put(row: dict, who: str, times: dict) -> None:
    row[f"{who}_graph_us"], row[f"{who}_eager_us"] = times["graph_us"], times["eager_us"]


def _ratios(row: dict) -> None:
    for m in ("graph", "eager"):
        a, b = row.get(f"ours_{m}_us"), row.get(f"fla_{m}_us")
        if isinstance(a, float) and isinstance(b, float):
            row[f"ratio_ours_over_fla_{m}"] = a / b


def kernel_times_us(fn, n: int = 5) -> dict:
    """Each device kernel's GPU time per call of ``fn`` ({kernel name: us}), from ``torch.profiler``
    over ``n`` eager calls (kernel durations only: launch gaps and host work are not in them)."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    from .bench import _quiet_kineto

    fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with _quiet_kineto():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    fn()
                torch.cuda.synchronize()
            out = {}
            for e in prof.key_averages():
                t = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
                if t > 0 and not e.key.startswith(("aten::", "cuda", "Memcpy", "Memset")):
                    out[e.key[:90]] = t / n
    return out


def _compare(row: dict, ours, peer) -> None:
    """Outputs and final states of one call, ours against the peer's (relative error)."""
    from .check import rel_err

    row["rel_err_vs_fla_o"] = rel_err(ours[0].float(), peer[0].float())
    row["rel_err_vs_fla_ht"] = rel_err(ours[1].float(), peer[1].float())


STATE_RULE = ("BV: the widest of 64/32/16 whose grid gives at least 7/8 program per SM; num_stages 3 while the "
              "programs each SM must hold (varlen: one) fit its shared memory with three tiles in flight, else 2; "
              "num_warps 4 (workbook.gdn.state_launch)")
STATE_PREVIOUS = "BV 64, else 32, once the grid reaches 256 programs, else 16; num_stages 2; num_warps 4"


def _graph_us(fn):
    """GPU time per call from graph replay, or why there is none (recorded, never silently skipped)."""
    from .bench import graph_time_us

    try:
        return graph_time_us(fn)
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        return f"failed: {type(e).__name__}: {e}"[:200]


def _state_alone_us(args: dict, config: dict):
    """GPU time per call (graph replay) of the state pass alone with ``config``, or why there is none."""
    try:
        run = state_pass_alone(args, config)
    except Exception as e:  # noqa: BLE001  (one failed configuration never costs the record)
        torch.cuda.synchronize()
        return f"failed: {type(e).__name__}: {e}"[:200]
    return _graph_us(run)


def _n_seq(spec) -> int:
    return spec[0] if spec[6] is None else len(spec[6])


def _state_cfgs(spec) -> tuple:
    """(the rule's pick, the previous default) for a prefill spec, bf16 storage."""
    N, HV, D = _n_seq(spec), spec[3], spec[4]
    return state_launch(N, HV, D, D, 2, varlen=spec[6] is not None), _previous_state_cfg(N, HV, D)


def _short(c: dict) -> str:
    return f"BV{c['BV']} ns{c['num_stages']} nw{c['num_warps']}"


def benchmark(budget_s: float = 60.0, warm_processes: int | None = None):
    """H200 benchmark: chunked prefill at CHUNK_SHAPES (bf16) and one varlen prefill batch (device
    cu_seqlens, VARLEN_SEQS), recurrent decode at DECODE_SHAPE (fp32 state), ours vs
    flash-linear-attention (when its wheel is installed) measured in the same process.

    1. Compile warm-up (a cold machine spends most of a run compiling): every kernel variant timed
       below, ours and fla's, is called once at WARM_T tokens in ``warm_processes`` spawned processes
       (default: the CPUs this process may use less two, at most 14; 0 or 1: none; cut after 100 s),
       so the binaries are in Triton's disk cache. Nothing is timed meanwhile; fla's autotuning picks
       there are thrown away.
    2. The record's rows, always measured: each prefill call of ours (state pass by the launch rule,
       :func:`state_launch`) and of fla timed two ways (``TIMERS``: GPU time from CUDA-graph replay,
       and eager per-call time), cross-checked (outputs and final states); fla's first call at each
       head count autotunes there, with the GPU to itself. Per-kernel times at PROFILE_SHAPES. At
       STATE_SHAPES the state pass alone (graph replay), the rule's pick beside the previous default
       (``STATE_PREVIOUS``), so that the record shows what the rule changes. Then decode.
    3. Then, for ``budget_s`` seconds more, extras, each only while the time left covers its cold cost:
       the state pass alone over STATE_GRID (BV x num_stages) at STATE_GRID_SHAPES (compiled in step 1
       when budget_s >= 10), a call-for-call cross-check on small odd shapes, launch-configuration
       sweeps. What is left out is listed under "skipped"; defaults stay as shipped."""
    import os
    import time

    from .bench import copy_ceiling_GBps, require_gpu

    require_gpu("gdn.benchmark")
    t_start = time.time()
    fla_chunk, fla_rec, fla_ver = _fla()
    res = {"fla_version": fla_ver, "timers": TIMERS, "config": repr(CONFIG), "state_rule": STATE_RULE,
           "state_previous": STATE_PREVIOUS, "chunk": [], "state_alone": [], "decode": [], "sweeps": {},
           "skipped": []}
    if fla_chunk is None:
        res["skipped"].append(f"every comparison with flash-linear-attention: {fla_ver}")
    grid = budget_s >= 10

    # 1. compile warm-up: fla's first (its autotuning compiles the most), then ours, then state configs
    tasks, firsts = [], {}   # the first spec of each compile signature (all but T: same warm-up call)
    for spec in _SPECS:
        firsts.setdefault((spec[0], *spec[2:6], spec[6] is None), spec)
    tasks += [("fla", spec, None) for spec in firsts.values() if fla_chunk is not None]
    tasks += [("ours", spec, None) for spec in firsts.values()]
    for spec in _SPECS:
        if spec[:5] in STATE_SHAPES:
            rule, prev = _state_cfgs(spec)
            cfgs = [prev] if prev != rule else []
            if grid and spec[:5] in STATE_GRID_SHAPES:
                cfgs += [c for bv, ns in STATE_GRID
                         if (c := {"BV": bv, "num_warps": 4, "num_stages": ns}) not in (rule, prev)]
            tasks += [("ours", spec, c) for c in cfgs]
    tasks += [(who, "decode", None) for who in (["fla"] if fla_rec is not None else []) + ["ours"]]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    procs = min(len(tasks), 14, cpus - 2) if warm_processes is None else warm_processes
    if procs >= 2:
        res["warm_up"] = _warm_compile(tasks, procs, timeout_s=100)
        print("warm-up", res["warm_up"], flush=True)
    ceil = copy_ceiling_GBps()

    # 2. the record's rows
    keep_grid, keep_sweep = {}, {}   # the args (and state rows) of the shapes that the extras use
    for spec in _SPECS:
        B, T, H, HV, D, l2, seqs = spec
        args = _bench_args(spec)
        row = {"B": B, "T": T, "H": H, "HV": HV, "D": D, "dtype": "bfloat16", "l2norm_in_kernel": l2}
        if seqs is not None:
            row["cu_seqlens"] = args["cu_seqlens"].tolist()
        _put(row, "ours", time_both(lambda: chunk_gated_delta_rule(**args)))
        if fla_chunk is not None:
            _put(row, "fla", time_both(lambda: fla_chunk(**args)))
            _compare(row, chunk_gated_delta_rule(**args), fla_chunk(**args))
        _ratios(row)
        if seqs is None and spec[:5] in PROFILE_SHAPES:   # where the time goes: each kernel's own GPU time
            row["kernels_us"] = {"ours": kernel_times_us(lambda: chunk_gated_delta_rule(**args))}
            if fla_chunk is not None:
                row["kernels_us"]["fla"] = kernel_times_us(lambda: fla_chunk(**args))
        res["chunk"].append(row)
        print("chunk", row, flush=True)
        if spec[:5] in STATE_SHAPES:   # the state pass alone: the rule's pick beside the previous default
            rule, prev = _state_cfgs(spec)
            srow = {k: row[k] for k in ("B", "T", "H", "HV", "D", "l2norm_in_kernel", "cu_seqlens") if k in row}
            srow["rule"], srow["rule_graph_us"] = rule, _state_alone_us(args, rule)
            if prev == rule:
                srow["previous"] = "same as the rule's pick"
            else:
                srow["previous"], srow["previous_graph_us"] = prev, _state_alone_us(args, prev)
                if isinstance(srow["rule_graph_us"], float) and isinstance(srow["previous_graph_us"], float):
                    srow["ratio_rule_over_previous"] = srow["rule_graph_us"] / srow["previous_graph_us"]
            res["state_alone"].append(srow)
            print("state alone", srow, flush=True)
            if spec[:5] in STATE_GRID_SHAPES:
                keep_grid[spec] = (args, srow)
        if seqs is None and T <= 8192 and HV not in {s[3] for s in keep_sweep}:
            keep_sweep[spec] = args   # the chunk sweeps' shapes (the first of each value-head count)
        del args

    dargs = _bench_args("decode")
    Bd, Hd, Dd = DECODE_SHAPE
    state_bytes = 2 * Bd * Hd * Dd * Dd * 4   # read h0 + write ht, fp32
    row = {"B": Bd, "T": 1, "H": Hd, "D": Dd, "dtype": "bfloat16", "state": "float32", "state_bytes": state_bytes}
    _put(row, "ours", time_both(lambda: fused_recurrent_gated_delta_rule(**dargs)))
    h_inplace = dargs["initial_state"].clone()
    _put(row, "ours_inplace", time_both(lambda: fused_recurrent_gated_delta_rule(
        **{**dargs, "initial_state": h_inplace}, inplace_final_state=True)))
    if fla_rec is not None:
        _put(row, "fla", time_both(lambda: fla_rec(**dargs)))
        _compare(row, fused_recurrent_gated_delta_rule(**dargs), fla_rec(**dargs))
    for who in ("ours", "fla"):
        t = row.get(f"{who}_graph_us")
        if isinstance(t, float):
            row[f"{who}_graph_GBps"] = state_bytes / t / 1e3   # state traffic over GPU time
    _ratios(row)
    res["decode"].append(row)
    print("decode", row, flush=True)
    res["record_s"] = time.time() - t_start

    # 3. extras, each only while the budget left covers its cost on a cold machine
    t_extra = time.time()

    def afford(cost_s: float, what: str) -> bool:
        if budget_s - (time.time() - t_extra) >= cost_s:
            return True
        res["skipped"].append(f"{what} (budget)")
        return False

    for spec, (args, srow) in keep_grid.items():
        if not afford(5 if grid else 60, "state grid %dx%dx%dx%dx%d" % spec[:5]):
            continue
        done = {(srow["rule"]["BV"], srow["rule"]["num_stages"]): srow["rule_graph_us"]}
        if isinstance(srow["previous"], dict):
            done[(srow["previous"]["BV"], srow["previous"]["num_stages"])] = srow["previous_graph_us"]
        srow["grid"] = [{"BV": bv, "num_warps": 4, "num_stages": ns, "graph_us": done.get((bv, ns)) or _state_alone_us(
            args, {"BV": bv, "num_warps": 4, "num_stages": ns})} for bv, ns in STATE_GRID]
        print("state grid", spec, srow["grid"], flush=True)
    if fla_chunk is not None and afford(60, "crosscheck on small odd shapes"):
        res["crosscheck"] = _crosscheck_fla(fla_chunk, fla_rec)
        print("crosscheck", res["crosscheck"], flush=True)
    if afford(20, "decode sweep"):
        sw = []
        for bv, nw in ((16, 2), (32, 8), (64, 4)):
            cfg = {"BV": bv, "num_warps": nw}
            t = _graph_us(lambda: fused_recurrent_gated_delta_rule(**dargs, config=cfg))
            gbps = state_bytes / t / 1e3 if isinstance(t, float) else None
            sw.append({"config": cfg, "graph_us": t, "graph_GBps": gbps})
        res["sweeps"]["decode"] = sw
        print("sweep decode", sw, flush=True)
    for spec, args in keep_sweep.items():
        if not afford(60, "chunk sweep %dx%dx%dx%dx%d" % spec[:5]):
            continue
        sw = []
        for cfg in ({"state": {"BV": 32}}, {"state": {"BV": 64}}, {"state": {"num_warps": 8}},
                    {"state": {"num_stages": 3}}, {"output": {"BV": 128}}, {"solve": {"num_warps": 2}},
                    {"wu": {"num_warps": 8}}, {"state": {"FUSE_O": True}},
                    {"state": {"FUSE_O": True, "num_warps": 8}}):
            sw.append({"config": repr(cfg), "graph_us": _graph_us(lambda: chunk_gated_delta_rule(**args, config=cfg))})
        res["sweeps"]["chunk_%dx%dx%dx%dx%d" % spec[:5]] = sw
        print("sweep", spec, sw, flush=True)
    keep_grid.clear()
    keep_sweep.clear()
    res["elapsed_s"] = time.time() - t_start
    return res, {"copy_GBps": ceil}


def time_both(fn) -> dict:
    """{"graph_us": GPU time from CUDA-graph replay, "eager_us": eager per-call time}; a call that
    cannot be captured records why instead of a number (never silently skipped)."""
    from .bench import graph_time_us, time_us

    out = {"eager_us": time_us(fn)}
    try:
        out["graph_us"] = graph_time_us(fn)
    except Exception as e:  # noqa: BLE001  (e.g. a host sync inside the call breaks capture)
        torch.cuda.synchronize()
        out["graph_us"] = f"capture failed: {type(e).__name__}: {e}"[:200]
    return out


def _crosscheck_fla(fla_chunk, fla_rec, left=lambda: 1.0):
    from .check import rel_err

    rows = []
    cases = [  # (B, T, H, HV, K, V, dtype, cu_seqlens, l2)
        (2, 1000, 4, 8, 128, 128, torch.float32, None, True),
        (1, 777, 2, 2, 100, 72, torch.float32, [0, 1, 200, 513, 777], False),
        (3, 129, 2, 4, 128, 128, torch.bfloat16, None, True),
    ]
    for B, T, H, HV, K, V, dt, cu, l2 in cases:
        if left() <= 0:
            rows.append({"B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "skipped": "budget"})
            continue
        x = make_inputs(B, T, H, K, V=V, HV=HV, dtype=dt, gate="mixed", normalize_qk=not l2, seed=T)
        N = B if cu is None else len(cu) - 1
        x["initial_state"] = torch.randn(N, HV, K, V, device=DEVICE) * 0.3
        cus = None if cu is None else torch.tensor(cu, device=DEVICE)
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=l2, cu_seqlens=cus)
        ref_o, ref_h = naive_recurrent_gated_delta_rule(**x, **kw) if T * B <= 1000 else (None, None)
        for name, ours, peer in (("chunk", chunk_gated_delta_rule, fla_chunk),
                                 ("recurrent", fused_recurrent_gated_delta_rule, fla_rec)):
            o, h = ours(**x, **kw)
            try:
                fo, fh = peer(**x, **kw)
            except Exception as e:  # noqa: BLE001
                rows.append({"fn": name, "B": B, "T": T, "fla_failed": f"{type(e).__name__}: {e}"[:200]})
                continue
            row = {"fn": name, "B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "dtype": str(dt)[6:],
                   "cu_seqlens": cu, "l2norm": l2, "o_vs_fla": rel_err(o.float(), fo.float()),
                   "ht_vs_fla": rel_err(h.float(), fh.float())}
            if ref_o is not None:
                row["o_vs_fp32_ref"] = rel_err(o.float(), ref_o)
                row["fla_o_vs_fp32_ref"] = rel_err(fo.float(), ref_o)
            rows.append(row)
    return rows


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


def _fmt_us(t) -> str:
    return f"{t:8.1f} us" if isinstance(t, (int, float)) else "     n/a   "


def has_timing_methods(rec: dict) -> bool:
    """Whether a gdn record holds both timings (graph replay and eager) per call. Records written
    before the benchmark timed graph replay hold one eager figure per call, labelled nothing."""
    r = rec["results"] if "results" in rec else rec
    return bool(r.get("chunk")) and "ours_graph_us" in r["chunk"][0]


def benchmark_table(rec: dict) -> str:
    """The recorded rows as text, each time labelled with its method (``TIMERS``): GPU time from
    CUDA-graph replay first, eager per-call time beside it. An old record without graph-replay
    times says so instead of showing numbers whose method is not recorded."""
    r = rec["results"] if "results" in rec else rec
    if not has_timing_methods(rec):
        return ("GPU time from CUDA-graph replay: not recorded yet (this record predates it; its single "
                "eager per-call figures are not shown, since claims are made on GPU time). "
                "Re-record with `python3 -m workbook bench gdn` on the GPU.")
    copy = rec.get("ceilings", {}).get("copy_GBps")
    lines = ["times per call; 'graph' = GPU time from CUDA-graph replay, 'eager' = eager per-call time "
             "(Python + launches included)"]
    for row in r["chunk"]:
        kind = f"varlen N={len(row['cu_seqlens']) - 1}" if row.get("cu_seqlens") else f"chunk  B={row['B']}"
        line = (f"{kind} T={row['T']:5d} H={row['H']}/{row.get('HV', row['H'])} D={row['D']} l2norm_in_kernel="
                f"{row['l2norm_in_kernel']!s:5}: ours graph {_fmt_us(row.get('ours_graph_us'))}, eager "
                f"{_fmt_us(row.get('ours_eager_us'))} | fla graph {_fmt_us(row.get('fla_graph_us'))}, eager "
                f"{_fmt_us(row.get('fla_eager_us'))}")
        if "ratio_ours_over_fla_graph" in row:
            line += f" | ours/fla on GPU time {row['ratio_ours_over_fla_graph']:.2f}x"
        if "ratio_ours_over_fla_eager" in row:
            line += f", eager {row['ratio_ours_over_fla_eager']:.2f}x"
        if "rel_err_vs_fla_o" in row:
            line += f" | vs fla: o {row['rel_err_vs_fla_o']:.1e}, final state {row['rel_err_vs_fla_ht']:.1e} (rel. err.)"
        lines.append(line)
        for who, ks in row.get("kernels_us", {}).items():
            parts = ", ".join(f"{name.split('(')[0].replace('void ', '')[:48]} {t:.1f}" for name, t in ks.items())
            lines.append(f"    {who} kernels, GPU time per call in us (torch.profiler): {parts} | sum {sum(ks.values()):.1f}")
    for row in r.get("state_alone", []):
        kind = f"varlen N={len(row['cu_seqlens']) - 1}" if row.get("cu_seqlens") else f"B={row['B']}"
        line = (f"state pass alone, GPU time (graph replay), {kind} T={row['T']} H={row['H']}/{row['HV']}: "
                f"launch rule {_short(row['rule'])} {_fmt_us(row['rule_graph_us'])}")
        if isinstance(row.get("previous"), dict):
            line += f" | previous default {_short(row['previous'])} {_fmt_us(row['previous_graph_us'])}"
            if "ratio_rule_over_previous" in row:
                line += f" | rule/previous {row['ratio_rule_over_previous']:.2f}x"
        else:
            line += " | previous default: the same configuration"
        lines.append(line)
        if row.get("grid"):
            lines.append("    BV x num_stages (num_warps 4): " + ", ".join(
                f"BV{c['BV']} ns{c['num_stages']} {_fmt_us(c['graph_us']).strip()}" for c in row["grid"]))
    for row in r["decode"]:
        line = (f"decode B={row['B']} H={row['H']} D={row['D']} (fp32 state): ours graph "
                f"{_fmt_us(row.get('ours_graph_us'))}, eager {_fmt_us(row.get('ours_eager_us'))}")
        if isinstance(row.get("ours_graph_GBps"), float):
            line += f" ({row['ours_graph_GBps']:.0f} GB/s of state traffic"
            line += f" = {row['ours_graph_GBps'] / copy:.0%} of the {copy:.0f} GB/s copy ceiling)" if copy else ")"
        line += (f", in place graph {_fmt_us(row.get('ours_inplace_graph_us'))} | fla graph "
                 f"{_fmt_us(row.get('fla_graph_us'))}, eager {_fmt_us(row.get('fla_eager_us'))}")
        if "ratio_ours_over_fla_graph" in row:
            line += f" | ours/fla on GPU time {row['ratio_ours_over_fla_graph']:.2f}x"
        if "rel_err_vs_fla_o" in row:
            line += f" | vs fla: o {row['rel_err_vs_fla_o']:.1e}, final state {row['rel_err_vs_fla_ht']:.1e}"
        lines.append(line)
    for row in r.get("crosscheck", []):
        if "o_vs_fla" in row:
            lines.append(f"cross-check {row['fn']:9} B={row['B']} T={row['T']} H={row['H']}/{row['HV']} K={row['K']} "
                         f"V={row['V']} {row['dtype']} varlen={row['cu_seqlens'] is not None}: vs fla o "
                         f"{row['o_vs_fla']:.1e}, final state {row['ht_vs_fla']:.1e}")
    if r.get("skipped"):
        lines.append("not measured in this record (budget or missing peer): " + "; ".join(r["skipped"]))
    return "\n".join(lines)


def plot_benchmark(rec: dict, label: str = ""):
    """Bars: ours vs flash-linear-attention per shape, GPU time from CUDA-graph replay (solid) and
    eager per-call time (hatched), from a record. Returns None (and draws nothing) for a record
    without graph-replay times."""
    import matplotlib.pyplot as plt

    if not has_timing_methods(rec):
        return None
    r = rec["results"] if "results" in rec else rec
    rows = r["chunk"] + r["decode"]
    names = [((f"varlen N{len(x['cu_seqlens']) - 1}" if x.get("cu_seqlens") else f"chunk B{x['B']}")
              + f" T{x['T']} H{x['H']}/{x.get('HV', x['H'])}" + (" +l2" if x["l2norm_in_kernel"] else ""))
             if "l2norm_in_kernel" in x else f"decode B{x['B']} H{x['H']}" for x in rows]
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


# --------------------------------------------------------------------------------------------------
# Exercises of notebook 05: graders (raise AssertionError with a message that teaches, or let the
# stub's NotImplementedError through) and plain reference solutions.
# --------------------------------------------------------------------------------------------------

def _call_learner(fn, *args, what: str, shapes: str):
    """Run the learner's function; an error other than NotImplementedError becomes a teaching message."""
    try:
        return fn(*args)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as e:  # noqa: BLE001  (any bug in the learner's code)
        raise AssertionError(f"{what} raised {type(e).__name__}: {str(e)[:300]}\nThe inputs were: {shapes}. "
                             "Check each tensor's shape and which axis you reduce over.") from None


def _rel(a, b) -> float:
    from .check import rel_err
    return rel_err(a, b)


# Exercise 1: one decode step ----------------------------------------------------------------------

def _decode_step_torch(h, q, k, v, g, beta, *, heads="group", order="decay_first", scale=True):
    """One decode step in torch on copies; the variants name plausible mistakes."""
    N, H, K = q.shape
    HV = v.shape[1]
    kh = torch.arange(HV, device=q.device) // (HV // H) if heads == "group" else torch.arange(HV, device=q.device) % H
    qh, kk = q[:, kh].float(), k[:, kh].float()                    # [N, HV, K]
    h = h.float().clone()
    decay = g.float().exp()[:, :, None, None]
    if order == "decay_first":
        h = h * decay
        u = beta.float()[:, :, None] * (v.float() - torch.einsum("nhkv,nhk->nhv", h, kk))
        h = h + kk[:, :, :, None] * u[:, :, None, :]
    else:  # the correction from the old state, decay applied after the write
        u = beta.float()[:, :, None] * (v.float() - torch.einsum("nhkv,nhk->nhv", h, kk))
        h = (h + kk[:, :, :, None] * u[:, :, None, :]) * decay
    o = torch.einsum("nhkv,nhk->nhv", h, qh * (K ** -0.5 if scale else 1.0))
    return o, h


def solution_decode_step(h, q, k, v, g, beta):
    """Exercise 1, plain solution: one Triton program per (sequence, value head) holds the whole
    [K, V] state (``kernels/gdn.py: decode_step_solution_kernel``); h is updated in place."""
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    # empty: program (n, hv) writes all V entries of o[n, hv]; the N * HV programs cover o.
    o = torch.empty(N, HV, V, dtype=torch.float32, device=h.device)
    require_launchable(kern.decode_step_solution_kernel)
    kern.decode_step_solution_kernel[(N * HV,)](h, q, k, v, g, beta, o, K ** -0.5, H=H, HV=HV, K=K, V=V,
                                               BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V))
    return o


def check_decode_step(fn) -> None:
    """Grader of exercise 1: ``fn(h, q, k, v, g, beta) -> o`` for T = 1 with h [N, HV, K, V] fp32
    updated in place, q, k [N, H, K], v [N, HV, V], g, beta [N, HV]; o [N, HV, V]. Graded with
    K != V (a K/V mix-up shows) and two value heads per key head, outputs allocated poisoned."""
    from .coverage import poisoned_allocations

    N, H, HV, K, V = 3, 2, 4, 32, 16
    x = make_inputs(N, 1, H, K, V=V, HV=HV, gate="mixed", initial_state=True, seed=11)
    h0 = x["initial_state"]
    q, k, v, g, beta = x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["g"][:, 0], x["beta"][:, 0]
    ref_o, ref_h = _decode_step_torch(h0, q, k, v, g, beta)
    h = h0.clone()
    shapes = (f"h [N, HV, K, V] = [{N}, {HV}, {K}, {V}], q and k [N, H, K] = [{N}, {H}, {K}], "
              f"v [N, HV, V] = [{N}, {HV}, {V}], g and beta [N, HV] = [{N}, {HV}]")
    with poisoned_allocations("nan"):
        o = _call_learner(fn, h, q, k, v, g, beta, what="your decode step", shapes=shapes)
    if not isinstance(o, torch.Tensor):
        raise AssertionError(f"return o, a tensor [N, HV, V] = [{N}, {HV}, {V}] (got {type(o).__name__})")
    if tuple(o.shape) == (N, HV, K):
        raise AssertionError(f"o has shape [N, HV, K] = [{N}, {HV}, {K}]: the output lives in VALUE space. "
                             f"o = h^T q contracts the K axis of h [K, V] with q, leaving V = {V} entries per head.")
    if tuple(o.shape) != (N, HV, V):
        raise AssertionError(f"o must be [N, HV, V] = [{N}, {HV}, {V}], got {list(o.shape)}")
    if torch.isnan(o.float()).any():
        raise AssertionError("o still holds poison (NaN) at some positions: every o[n, hv, :] must be written "
                             f"(all HV = {HV} value heads, not only the H = {H} key heads)")
    if torch.equal(h, h0):
        raise AssertionError("h was not updated in place: write the new state into the h you were given "
                             "(h.mul_(...), h.copy_(...), or a kernel storing into h), not into a new tensor")
    if _rel(h, ref_h) > 2e-3:
        for kw, hint in (({"heads": "mod"}, "value head hv reads key head hv // (HV // H) (heads in groups: "
                                            "value heads 0, 1 share key head 0 here), not hv % H"),
                         ({"order": "decay_after"}, "decay FIRST (h *= exp(g)), then u = beta (v - h^T k) "
                                                    "with the DECAYED h, then h += k u^T")):
            if _rel(h, _decode_step_torch(h0, q, k, v, g, beta, **kw)[1]) < 2e-3:
                raise AssertionError(f"the state is off by {_rel(h, ref_h):.1e}: {hint}.")
        raise AssertionError(f"the state is off by {_rel(h, ref_h):.1e}: h <- exp(g) h; u = beta (v - h^T k); "
                             "h <- h + k u^T (k as a column, u as a row: an outer product [K, V]); value head "
                             "hv uses key head hv // (HV // H).")
    if _rel(o, ref_o) > 2e-3:
        old_h = h0.float() * g.float().exp()[:, :, None, None]
        kh = torch.arange(HV) // (HV // H)
        if _rel(o, torch.einsum("nhkv,nhk->nhv", old_h, q[:, kh].float() * K ** -0.5)) < 2e-3:
            raise AssertionError("the state is right but o was read from the state BEFORE this token's write: "
                                 "o = h^T q uses the UPDATED h (the token sees its own value).")
        if _rel(o, _decode_step_torch(h0, q, k, v, g, beta, scale=False)[0]) < 2e-3:
            raise AssertionError(f"o is off by a factor sqrt(K) = {K ** 0.5:.2f}: o = h^T q * K**-0.5.")
        raise AssertionError(f"the state is right but o is off by {_rel(o, ref_o):.1e}: o = h^T q * K**-0.5 "
                             "with the updated h.")


# Exercise 2: the UT transform of one chunk --------------------------------------------------------

class _ExpWatch:
    """Records the largest argument passed to exp/exp2 (any spelling: torch.exp, Tensor.exp, exp_)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        watch = self
        self.max_arg = float("-inf")
        ops = {torch.ops.aten.exp, torch.ops.aten.exp_, torch.ops.aten.exp2, torch.ops.aten.exp2_}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket in ops and isinstance(args[0], torch.Tensor) and args[0].numel():
                    a = args[0].detach().float()
                    a = a[~torch.isnan(a)]
                    if a.numel():
                        watch.max_arg = max(watch.max_arg, float(a.max()))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


def solution_ut_transform(k, beta, G):
    """Exercise 2, plain solution: A = (I + L)^-1 with L = strict_lower(diag(beta) (K K^T * Gamma)),
    Gamma_ij = exp(G_i - G_j) computed only where i > j (masked BEFORE exp: above the diagonal the
    exponent is positive and overflows), then forward substitution row by row."""
    C = k.shape[0]
    below = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)        # i > j
    expo = torch.where(below, G[:, None] - G[None, :], torch.zeros((), device=k.device))
    L = torch.where(below, beta[:, None] * (k @ k.T) * expo.exp(), torch.zeros((), device=k.device))
    A = torch.eye(C, device=k.device)                       # row i of A = e_i - sum_{j<i} L[i, j] A[j]
    for i in range(1, C):
        A[i] = A[i] - L[i, :i] @ A[:i]
    return A


def check_ut_transform(fn) -> None:
    """Grader of exercise 2: ``fn(k [C, K], beta [C], G [C]) -> A [C, C]``. The gates drop sharply
    near the end of the chunk, so that above the diagonal G_i - G_j reaches about +200 (exp overflows
    to inf in fp32); an exp of those entries is seen (every exp call's argument is watched) and
    refused, and a masked product inf * 0 = NaN shows as non-finite. Two chunk lengths, 64 and 37."""
    for C, K in ((64, 32), (37, 16)):
        gen = torch.Generator().manual_seed(C)
        k = l2norm(torch.randn(C, K, generator=gen))
        beta = torch.rand(C, generator=gen) * 0.9 + 0.05
        G = (-torch.rand(C, generator=gen) * 0.5).cumsum(0)
        G[-C // 4:] -= 200.0         # a sharp drop: exp(G_i - G_j) above the diagonal overflows
        watch = _ExpWatch()
        with watch.mode:
            A = _call_learner(fn, k.clone(), beta.clone(), G.clone(), what="your UT transform",
                              shapes=f"k [C, K] = [{C}, {K}], beta [C], G [C] with C = {C}")
        if watch.max_arg > 1.0:
            raise AssertionError(
                f"[C={C}] you exponentiated a positive number (up to {watch.max_arg:+.1f}): above the diagonal "
                "(i < j) G_i - G_j > 0, and from about 89 on exp overflows to inf in fp32 (here the gap is "
                "200). Masking after exp (tril, or * mask) comes too late. Mask the EXPONENT first: "
                "torch.where(i > j, G_i - G_j, 0) (or -inf), then exp; likewise exp(G_i) * exp(-G_j) overflows.")
        if not isinstance(A, torch.Tensor) or tuple(A.shape) != (C, C):
            raise AssertionError(f"[C={C}] return A as a [C, C] = [{C}, {C}] tensor")
        A = A.float()
        if not torch.isfinite(A).all():
            raise AssertionError(f"[C={C}] A has inf/NaN: an overflowing exp times a zero mask is NaN (inf * 0). "
                                 "Mask the exponent G_i - G_j to i > j BEFORE exponentiating.")
        if A.triu(1).abs().max() > 0:
            raise AssertionError(f"[C={C}] A must be lower triangular (the inverse of a unit lower triangular matrix)")
        below = torch.ones(C, C, dtype=torch.bool).tril(-1)
        gam = torch.where(below, G[:, None] - G[None, :], torch.zeros(())).exp()
        S = (k @ k.T) * gam
        eye = torch.eye(C)

        def inv(Lm):
            return torch.linalg.solve_triangular(eye + Lm, eye, upper=False)

        L = torch.where(below, beta[:, None] * S, torch.zeros(()))
        if (A - inv(L)).abs().max() < 1e-4:
            continue
        if (A - inv(torch.where(below, beta[None, :] * S, torch.zeros(())))).abs().max() < 1e-4:
            raise AssertionError(f"[C={C}] beta scales the wrong side: diag(beta) multiplies on the LEFT, so row "
                                 "i of L is scaled by beta_i (the token being written), not column j.")
        if (A - inv(torch.where(below | eye.bool(), beta[:, None] * S, torch.zeros(())))).abs().max() < 1e-4:
            raise AssertionError(f"[C={C}] L must be STRICTLY lower (i > j): a token does not correct against "
                                 "itself, so I + L has ones on its diagonal.")
        if (A - (eye - L)).abs().max() < 1e-4:
            raise AssertionError(f"[C={C}] you returned I - L, the first terms of the inverse only: solve "
                                 "(I + L) A = I (forward substitution or torch.linalg.solve_triangular).")
        resid = (A @ (eye + L) - eye).abs().max().item()
        raise AssertionError(f"[C={C}] A (I + L) - I has entries up to {resid:.1e}: L = strict_lower(diag(beta) "
                             "(K K^T * Gamma)) with Gamma_ij = exp(G_i - G_j), and A = (I + L)^-1.")


# Exercise 3: the chunks of a variable-length batch -------------------------------------------------

def solution_chunk_spans(cu_seqlens, chunk):
    """Exercise 3, plain solution: the row range [start, end) of every chunk, sequence by sequence.
    Chunks restart at every sequence start and the last one of a sequence is cut at its end."""
    spans = []
    for bos, eos in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        for start in range(bos, eos, chunk):
            spans.append((start, min(start + chunk, eos)))
    return spans


def check_chunk_spans(fn) -> None:
    """Grader of exercise 3: ``fn(cu_seqlens: list[int], chunk: int) -> list of (start, end)``, the rows
    each program of the chunked kernels owns, in order. Graded on T = 63, T = 1, exact multiples,
    an empty sequence and a sequence one row longer than a chunk."""
    cases = [([0, 63], 64), ([0, 1], 64), ([0, 15, 100, 130], 64), ([0, 64, 64, 129, 130], 64),
             ([0, 5, 37, 37, 64, 100], 16)]
    for cu, C in cases:
        got = _call_learner(fn, list(cu), C, what="your chunk table",
                            shapes=f"cu_seqlens = {cu}, chunk = {C}")
        try:
            got = [(int(s), int(e)) for s, e in got]
        except (TypeError, ValueError):
            raise AssertionError(f"return a list of (start, end) pairs, got {got!r:.200}") from None
        ref = solution_chunk_spans(cu, C)
        if got == ref:
            continue
        where = f"cu_seqlens = {cu}, chunk = {C}: "
        for s, e in got:
            if e <= s:
                raise AssertionError(where + f"chunk ({s}, {e}) is empty: a zero-length sequence has no chunks "
                                     "(a program for it would read and write rows of its neighbours)")
            n = max((i for i in range(len(cu) - 1) if cu[i] <= s < cu[i + 1]), default=None)
            if n is None or e > cu[n + 1]:
                end = cu[-1] if n is None else cu[n + 1]
                raise AssertionError(where + f"chunk ({s}, {e}) runs past the end of its sequence at row {end}: a "
                                     "chunk never spans two sequences (the state restarts from h0 at every "
                                     "cu_seqlens offset); start chunks at each sequence start and cut the last "
                                     "one at the sequence end.")
            if (s - cu[n]) % C:
                raise AssertionError(where + f"chunk ({s}, {e}) does not start at a multiple of {C} rows from its "
                                     f"sequence start {cu[n]}: chunks restart at every sequence start.")
        count = [0] * cu[-1]
        for s, e in got:
            for r in range(s, e):
                count[r] += 1
        missed = [r for r, c in enumerate(count) if c == 0]
        if missed:
            raise AssertionError(where + f"rows {missed[0]}..{missed[-1]} ({len(missed)} rows) belong to no chunk: "
                                 "a sequence of L rows has ceil(L / chunk) chunks, the last one partial "
                                 "(floor drops the tail, and nobody writes those rows of o).")
        twice = [r for r, c in enumerate(count) if c > 1]
        if twice:
            raise AssertionError(where + f"rows from {twice[0]} belong to two chunks: chunks must not overlap.")
        raise AssertionError(where + f"the chunks are right but not in order: expected {ref}, got {got}")


# Exercise 4: the state carried from chunk to chunk -------------------------------------------------

def _prepare_one_head(k, v, g, beta, cu_seqlens, chunk):
    """In-chunk G (cumulative log decay), w and u of one head (fp32 torch), chunk by chunk."""
    T = k.shape[0]
    G, w, u = torch.empty(T), torch.empty(T, k.shape[1]), torch.empty(T, v.shape[1])   # every chunk's rows
    for s, e in solution_chunk_spans(cu_seqlens, chunk):
        Gc = g[s:e].cumsum(0)
        A = solution_ut_transform(k[s:e], beta[s:e], Gc)
        G[s:e], w[s:e], u[s:e] = Gc, A @ ((beta[s:e] * Gc.exp())[:, None] * k[s:e]), A @ (beta[s:e, None] * v[s:e])
    return G, w, u


def _state_pass_torch(k, w, u, G, h0, cu_seqlens, chunk, *, variant=None):
    """The state pass of one head; ``variant`` names a plausible mistake (for the grader's messages)."""
    T, V = u.shape
    v_new = torch.empty(T, V)     # every chunk writes its rows
    finals = []
    h = None
    for n, (bos, eos) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        h = h0[n].clone() if variant != "carry" or h is None else h
        for s in range(bos, eos, chunk):
            e = min(s + chunk, eos)
            v_new[s:e] = u[s:e] - w[s:e] @ h
            last = {"batch_end": min(s + chunk, T) - 1, "first": s}.get(variant, e - 1)
            gl = G[last]
            dec = (gl - G[s:e]).exp() if variant != "no_weights" else torch.ones(e - s)
            h = h * gl.exp() + (k[s:e] * dec[:, None]).T @ v_new[s:e]
        finals.append(h)
    return v_new, torch.stack(finals)


def solution_state_pass(k, w, u, G, h0, cu_seqlens, chunk):
    """Exercise 4, plain solution (one head): per sequence, start from h0[n]; per chunk [s, e),
    v' = u - w h, then h <- exp(G_C) h + (K * exp(G_C - G))^T v' with G_C = G[e - 1], the cumulative
    decay at the chunk's LAST VALID row (e is cut at the sequence end)."""
    v_new = torch.empty_like(u)          # every chunk of every sequence writes its rows below
    finals = []
    for n in range(len(cu_seqlens) - 1):
        bos, eos = cu_seqlens[n], cu_seqlens[n + 1]
        h = h0[n].clone()
        for s in range(bos, eos, chunk):
            e = min(s + chunk, eos)
            v_new[s:e] = u[s:e] - w[s:e] @ h
            G_C = G[e - 1]
            h = h * G_C.exp() + (k[s:e] * (G_C - G[s:e]).exp()[:, None]).T @ v_new[s:e]
        finals.append(h)
    return v_new, torch.stack(finals)


def check_state_pass(fn) -> None:
    """Grader of exercise 4: ``fn(k [T, K], w [T, K], u [T, V], G [T], h0 [N, K, V], cu_seqlens, chunk)
    -> (v_new [T, V], ht [N, K, V])`` for one head. Graded with chunk = 16 on T = 63 (a partial last
    chunk), T = 1, and a variable-length batch with an empty sequence, against the fp32 recurrence."""
    from .coverage import poisoned_allocations

    cases = [[0, 63], [0, 1], [0, 5, 37, 37, 64, 100]]
    C, K, V = 16, 16, 8
    for cu in cases:
        T, N = cu[-1], len(cu) - 1
        x = make_inputs(1, T, 1, K, V=V, gate="mixed", seed=T)
        k, v, g, beta = x["k"][0, :, 0].cpu(), x["v"][0, :, 0].cpu(), x["g"][0, :, 0].cpu(), x["beta"][0, :, 0].cpu()
        h0 = torch.randn(N, K, V, generator=torch.Generator().manual_seed(N)) * 0.5
        G, w, u = _prepare_one_head(k, v, g, beta, cu, C)
        ref_v, ref_h = solution_state_pass(k, w, u, G, h0, cu, C)
        where = f"cu_seqlens = {cu}, chunk = {C}: "
        with poisoned_allocations("nan"):
            out = _call_learner(fn, k, w, u, G, h0.clone(), list(cu), C, what="your state pass",
                                shapes=f"k, w [T, K] = [{T}, {K}], u [T, V] = [{T}, {V}], G [T], "
                                       f"h0 [N, K, V] = [{N}, {K}, {V}], cu_seqlens = {cu}, chunk = {C}")
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise AssertionError("return the pair (v_new [T, V], final states [N, K, V])")
        vn, ht = out
        if not (isinstance(vn, torch.Tensor) and isinstance(ht, torch.Tensor)):
            raise AssertionError("return the pair (v_new, final states) as two tensors")
        if tuple(vn.shape) != (T, V) or tuple(ht.shape) != (N, K, V):
            raise AssertionError(where + f"v_new must be [T, V] = [{T}, {V}] and the final states [N, K, V] = "
                                 f"[{N}, {K}, {V}], got {list(vn.shape)} and {list(ht.shape)}")
        vn, ht = vn.float(), ht.float()
        if torch.isnan(vn).any():
            r = torch.isnan(vn).any(1).nonzero().flatten().tolist()
            raise AssertionError(where + f"rows {r[:6]} of v_new were never written (poison left): every row of "
                                 "every chunk, the partial last chunk included, gets v' = u - w h.")
        if _rel(vn, ref_v) < 1e-4 and _rel(ht, ref_h) < 1e-4:
            continue
        for variant, msg in (
                ("carry", "the state leaked from one sequence into the next: at every cu_seqlens offset the state "
                          "restarts from that sequence's h0[n]."),
                ("batch_end", "the last chunk of a sequence ends at the SEQUENCE end, not 16 rows later: G_C is the "
                              "cumulative decay at the chunk's last valid row, G[min(s + chunk, eos) - 1], never "
                              "a row of the next sequence."),
                ("first", "G_C is the cumulative decay at the chunk's LAST row (the state leaves the chunk after "
                          "its last token), not its first."),
                ("no_weights", "each key row carries the decay still to come before the chunk ends: (K * exp(G_C - "
                               "G))^T v', not K^T v'.")):
            wv, wh = _state_pass_torch(k, w, u, G, h0, cu, C, variant=variant)
            if _rel(vn, wv) < 1e-4 and _rel(ht, wh) < 1e-4:
                raise AssertionError(where + msg)
        for n in range(N):
            for s, e in solution_chunk_spans(cu[n:n + 2], C):
                if _rel(vn[s:e], ref_v[s:e]) > 1e-4:
                    first = s == cu[n]
                    raise AssertionError(
                        where + f"v' is wrong from rows {s}..{e - 1} (sequence {n}, "
                        + ("its first chunk: the state there is h0[n], nothing carried from before)" if first else
                           "not its first chunk: the state handed over by the previous chunk is wrong: h <- "
                           "exp(G_C) h + (K * exp(G_C - G))^T v', G_C at the previous chunk's last row)"))
            if _rel(ht[n], ref_h[n]) > 1e-4:
                raise AssertionError(where + f"v' is right but the final state of sequence {n} is wrong"
                                     + (" (an empty sequence hands back h0[n] unchanged)" if cu[n] == cu[n + 1] else
                                        ": apply the update after the LAST chunk too, the partial one included, "
                                        "with G_C = G[eos - 1]."))
        raise AssertionError(where + "v' and the final states differ from the reference.")
