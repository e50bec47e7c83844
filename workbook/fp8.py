"""Fused SiLU-mul + FP8 group quantization with packed UE8M0 scales (notebook 03).

The format (DeepGEMM's FP8 activations with UE8M0 scales):

* input ``x`` [M, 2N] bf16, ``gate = x[:, :N]``, ``up = x[:, N:]``, ``y = silu(gate) * up``
  (silu in fp32, back to bf16 before the multiply, as the unfused path rounds);
* groups of 128 along N; per group a power-of-two scale ``s = 2^e``,
  ``e = ceil(log2(max(amax / 448, 1e-10)))``, stored as the exponent byte ``e + 127`` (UE8M0);
* codes ``q = e4m3(clamp(y / s, +-448))``, round to nearest even: float8_e4m3fn [M, N];
* four exponent bytes per int32, group 4p+j in bits 8j..8j+7 (little-endian), unused bytes zero;
* MN-major, TMA-aligned: storage int32 [ceil(G/4), round_up(M, 4)], returned as the view
  ``storage.T[:M, :]`` of shape [M, ceil(G/4)] and strides (1, round_up(M, 4)).

This module holds the pure-torch reference, the launchers (allocation policy and its coverage
argument), the unpack helper, a consumer that dequantizes through the view, the benchmark and the
notebook's pictures. The device code is in :mod:`workbook.kernels.fp8`.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .device import DEVICE, INTERPRETED, ON_GPU, check_tensor, require_launchable, resolve_config
from .device import resolve_emulate as _resolve_emulate

import triton  # noqa: E402  (after workbook.device, which chose the interpreter if needed)

from .kernels.fp8 import (  # noqa: E402
    e4m3_cast_kernel, e4m3_round_kernel, silu_mul_bf16_kernel, silu_mul_quant_fp8_kernel, ue8m0_pack_kernel,
)
__all__ = [
    "E4M3_MAX", "GROUP_SIZE", "EPS", "ALL_ZERO_EXPONENT_BYTE",
    "silu_mul_reference", "ue8m0_exponent_reference", "quant_fp8_group_reference",
    "pack_ue8m0_reference", "silu_mul_quant_fp8_reference",
    "silu_mul_quant_fp8_packed", "quant_fp8_packed", "pack_ue8m0_mn_major", "unpack_ue8m0",
    "dequantize_fp8_packed",
    "tma_aligned_rows", "num_packed_words", "e4m3_round", "e4m3_direct_cast", "silu_mul_bf16",
    "silu_impl", "silu_impl_mismatches", "SILU_IMPL_NAMES", "SILU_CANDIDATES",
    "benchmark", "benchmark_table", "plot_bandwidth", "plot_packing", "plot_mn_major_layout",
    "check_exponent_byte", "check_pack", "check_pack_kernel", "solution_exponent_byte", "solution_pack",
    "resolve_emulate", "CONFIG_KEYS", "SILU_IMPL_TORCH", "METHODS",
]

E4M3_MAX = 448.0
GROUP_SIZE = 128
EPS = 1e-10
ALL_ZERO_EXPONENT_BYTE = 0x5E  # ceil(log2(1e-10)) + 127 = -33 + 127 = 94


# --------------------------------------------------------------------------------------------------
# Shapes of the packed layout
# --------------------------------------------------------------------------------------------------

def tma_aligned_rows(m: int) -> int:
    """round_up(M, 4): a TMA row of the MN-major scale storage is 16 bytes aligned (4 int32)."""
    return (m + 3) // 4 * 4


def num_packed_words(num_groups: int) -> int:
    """ceil(G / 4): four exponent bytes per int32 word."""
    return (num_groups + 3) // 4


# --------------------------------------------------------------------------------------------------
# Pure-torch reference
# --------------------------------------------------------------------------------------------------

def silu_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """y = silu(gate) * up, rounded as the unfused path rounds: silu in fp32, to x.dtype, multiply."""
    n = x.shape[-1] // 2
    gate, up = x[..., :n], x[..., n:]
    return F.silu(gate.float()).to(x.dtype) * up


def ue8m0_exponent_reference(amax: torch.Tensor) -> torch.Tensor:
    """Per-group exponent e (int32) of the power-of-two scale s = 2^e = 2^ceil(log2(max(amax/448, 1e-10))).

    Overflow: a group holding +-inf (y = silu(gate) * up beyond bf16's range; the unfused path gives
    inf there too) takes the exponent of the largest finite fp32 value, e = 120 (byte 247), and its
    inf elements saturate to +-448 in :func:`quant_fp8_group_reference`, as the GPU's FP8 cast does."""
    amax = torch.clamp(amax.float(), max=torch.finfo(torch.float32).max)
    ratio = torch.clamp(amax / E4M3_MAX, min=EPS)
    return torch.ceil(torch.log2(ratio)).to(torch.int32)


def quant_fp8_group_reference(y: torch.Tensor, group_size: int = GROUP_SIZE):
    """(codes float8_e4m3fn [M, N], exponent bytes uint8 [M, G]) of y [M, N] in groups along N."""
    m, n = y.shape
    g = y.float().view(m, n // group_size, group_size)
    e = ue8m0_exponent_reference(g.abs().amax(dim=-1))
    scale = torch.exp2(e.float())  # exact powers of two
    q = torch.clamp(g / scale[..., None], -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    exp_bytes = torch.clamp(e + 127, 0, 255).to(torch.uint8)
    return q.view(m, n), exp_bytes


def pack_ue8m0_reference(exp_bytes: torch.Tensor) -> torch.Tensor:
    """uint8 [M, G] -> int32 [M, ceil(G/4)], group 4p+j in bits 8j..8j+7; missing groups are 0 bits."""
    m, g = exp_bytes.shape
    p = num_packed_words(g)
    padded = torch.zeros(m, 4 * p, dtype=torch.int64, device=exp_bytes.device)
    padded[:, :g] = exp_bytes.to(torch.int64)
    words = (padded.view(m, p, 4) << (8 * torch.arange(4, device=exp_bytes.device))).sum(-1)
    return (words - ((words >> 31) << 32)).to(torch.int32)  # two's complement of bit 31


def silu_mul_quant_fp8_reference(x: torch.Tensor, group_size: int = GROUP_SIZE):
    """Reference of the whole fused op: (codes [M, N] float8_e4m3fn, packed scales [M, P] int32).
    The packed scales are returned row-major (values only; the layout is the launcher's business)."""
    q, exp_bytes = quant_fp8_group_reference(silu_mul_reference(x), group_size)
    return q, pack_ue8m0_reference(exp_bytes)


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------

def _check(name: str, t, dtypes, ndim: int, contiguous: bool = True) -> None:
    """check_tensor on the kernels' DEVICE."""
    check_tensor(name, t, dtypes=dtypes, ndim=ndim, device=DEVICE, contiguous=contiguous)


def _check_group_size(group_size) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    if group_size != GROUP_SIZE:
        raise ValueError(f"group_size must be {GROUP_SIZE} (one UE8M0 scale per 128 elements, the "
                         f"layout DeepGEMM reads), got {group_size}")


def _block_m(m: int) -> int:
    # GPU: 2 rows x 512 columns per program with 2 warps (16 elements of gate and of up per thread:
    # each thread's loads are 2 x 16 bytes per input in flight). A sweep at M = 4096 (graph replay)
    # put the 16-elements-per-thread tiles (BLOCK_M = num_warps = 1, 2, 4, 8) ahead of 2 x 4 warps; the
    # recorded sweep (workbook/data/fp8.json, "config_sweep": BLOCK_M 2..16 x 2, 4, 8 warps at
    # M = 2048, 4096, 16384) is the evidence for this default.
    # Interpreter: fewer, larger programs (numpy per block).
    cap = 64 if INTERPRETED else 2
    return min(cap, triton.next_power_of_2(max(m, 1)))


def _quiet():
    """The interpreter runs a kernel's block ops in numpy: exp(-gate) overflows to inf for gate < -88,
    exactly as on the GPU (silu(gate) is then -0.0), but numpy warns. Silence that, there only."""
    return np.errstate(over="ignore") if INTERPRETED else contextlib.nullcontext()


def resolve_emulate(emulate) -> bool:
    """``EMULATE`` for the FP8 kernels (:func:`workbook.device.resolve_emulate`)."""
    return _resolve_emulate(emulate, "it runs the GPU's own fp32 -> E4M3/bf16 conversions, which "
                                     "Triton's interpreter rounds wrongly (notebook 03, section 3)")


CONFIG_KEYS = ("BLOCK_M", "num_warps", "SILU_IMPL")


def _launch_config(m: int, config) -> dict:
    """Defaults for M rows, overridden by ``config``: a dict or a ``triton.Config`` with the names in
    ``CONFIG_KEYS`` (BLOCK_M: rows per program, a power of two; num_warps; SILU_IMPL: the silu
    variant, by default the cheapest one proven exact here, :func:`silu_impl`)."""
    cfg = resolve_config(config, {"BLOCK_M": _block_m(m), "num_warps": 2, "SILU_IMPL": None},
                         pow2=("BLOCK_M", "num_warps"))
    if cfg["SILU_IMPL"] is None:
        cfg["SILU_IMPL"] = silu_impl()
    elif cfg["SILU_IMPL"] not in SILU_CANDIDATES:
        raise ValueError(f"config['SILU_IMPL'] must be one of {SILU_CANDIDATES} here, got {cfg['SILU_IMPL']!r}")
    return cfg


def _launch(src: torch.Tensor, m: int, n: int, silu_mul: bool, emulate, config, backend: str = "triton"):
    from .cuda import _cuda_fp8_quant, check_backend  # imports without a GPU; builds on first CUDA use

    if check_backend(backend, emulate, config):
        return _cuda_fp8_quant(src, m, n, silu_mul)  # same allocations, same bytes (kernels/cuda/fp8.cu)
    emulate = resolve_emulate(emulate)
    cfg = _launch_config(m, config)
    num_groups = n // GROUP_SIZE
    p = num_packed_words(num_groups)
    tma_m = tma_aligned_rows(m)
    # codes: program (i, p) writes rows [i*BLOCK_M, +BLOCK_M) x columns [512p, 512p+512) (masked at M
    # and N); the programs tile [M, N] exactly, so every code byte is written: empty is safe.
    codes = torch.empty(m, n, dtype=torch.float8_e4m3fn, device=src.device)
    # scales: storage int32 [P, tma_M]; program (i, p) writes word p of its tokens m < M (all 4
    # bytes, the unused ones as 0), so the view storage.T[:M, :] is fully written. Rows M..tma_M-1
    # of storage.T (at most 3 int32 per word: TMA alignment) are not elements of the returned
    # tensor and are never written. A consumer that indexes the view cannot reach them; a GEMM whose
    # TMA box fetches them applies each token's scale to that token's row only, so they can reach
    # only output rows >= M, which are never stored (notebook 03, section 8). So empty is safe;
    # zeros would be a wasted fill kernel.
    storage = torch.empty(p, tma_m, dtype=torch.int32, device=src.device)
    scales = storage.T[:m, :]
    if m == 0:
        return codes, scales
    require_launchable(silu_mul_quant_fp8_kernel)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), p)
    with _quiet():
        silu_mul_quant_fp8_kernel[grid](
            src, codes.view(torch.uint8), storage, m, n, src.stride(0), codes.stride(0), storage.stride(0),
            GROUP=GROUP_SIZE, BLOCK_M=cfg["BLOCK_M"], SILU_MUL=silu_mul, SILU_IMPL=cfg["SILU_IMPL"],
            EMULATE=emulate, num_warps=cfg["num_warps"],
        )
    return codes, scales


def silu_mul_quant_fp8_packed(x: torch.Tensor, group_size: int = GROUP_SIZE, *,
                              emulate: bool | None = None, config=None, backend: str = "triton"):
    """Fused y = silu(x[:, :N]) * x[:, N:] and FP8 group quantization with packed UE8M0 scales.

    Returns ``(codes, scales)``: codes float8_e4m3fn [M, N] (contiguous) and scales int32
    [M, ceil(N/128/4)], the view ``storage.T[:M, :]`` of an MN-major storage
    [ceil(N/512), round_up(M, 4)], strides (1, round_up(M, 4)).

    ``emulate``: None (default) = exact integer roundings only where there is no GPU; True = also on a
    GPU; False = the GPU's conversion instructions (GPU only). ``config``: launch configuration, a
    dict or ``triton.Config`` with keys from ``CONFIG_KEYS`` (defaults chosen per M).
    ``backend``: 'triton' (default) or 'cuda', the CUDA C++ kernel of kernels/cuda/fp8.cu (GPU only;
    the same bytes and layout; it takes neither ``emulate`` nor ``config``; see workbook.cuda).
    """
    _check_group_size(group_size)
    _check("x", x, (torch.bfloat16,), 2)
    m, two_n = x.shape
    if two_n == 0 or two_n % 2:
        raise ValueError(f"x's last dimension holds gate and up halves, so it must be even and "
                         f"positive; got {two_n}")
    n = two_n // 2
    if n % group_size:
        raise ValueError(f"N = x.shape[-1] // 2 must be a multiple of group_size={group_size}; got "
                         f"N = {n} (x.shape[-1] = {two_n})")
    return _launch(x, m, n, True, emulate, config, backend)


def quant_fp8_packed(y: torch.Tensor, group_size: int = GROUP_SIZE, *,
                     emulate: bool | None = None, config=None, backend: str = "triton"):
    """The quantization alone, on an already materialized y [M, N] bf16 (the unfused path's second
    kernel). Same outputs, layout and keywords (``backend`` included) as
    :func:`silu_mul_quant_fp8_packed`."""
    _check_group_size(group_size)
    _check("y", y, (torch.bfloat16,), 2)
    m, n = y.shape
    if n == 0 or n % group_size:
        raise ValueError(f"y's last dimension must be a positive multiple of group_size={group_size}; "
                         f"got {n}")
    return _launch(y, m, n, False, emulate, config, backend)


def pack_ue8m0_mn_major(exp_bytes: torch.Tensor) -> torch.Tensor:
    """Exponent bytes uint8 [M, G] -> the packed MN-major view int32 [M, ceil(G/4)], strides
    (1, round_up(M, 4)), as the fused kernel lays it out. Exercise 3's plain solution (kernel:
    ``ue8m0_pack_kernel``)."""
    _check("exp_bytes", exp_bytes, (torch.uint8,), 2)
    m, g = exp_bytes.shape
    p, tma_m = num_packed_words(g), tma_aligned_rows(m)
    # program (i, p) writes word p of its tokens m < M: every element of the view storage.T[:M, :]
    # is written, so empty is safe; storage rows M..tma_M-1 are not elements of the returned tensor
    # (same argument as the fused kernel's)
    storage = torch.empty(p, tma_m, dtype=torch.int32, device=exp_bytes.device)
    if m and g:
        require_launchable(ue8m0_pack_kernel)
        block_m = min(64, triton.next_power_of_2(m))
        ue8m0_pack_kernel[(triton.cdiv(m, block_m), p)](
            exp_bytes, storage, m, g, exp_bytes.stride(0), storage.stride(0), BLOCK_M=block_m)
    return storage.T[:m, :]


# --------------------------------------------------------------------------------------------------
# Consumers
# --------------------------------------------------------------------------------------------------

def unpack_ue8m0(scales: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Exponent bytes uint8 [M, num_groups] from packed int32 [M, P] (any strides: read through the
    view, element by element, never through the storage behind it)."""
    check_tensor("scales", scales, dtypes=(torch.int32,), ndim=2, contiguous=False)
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be a non-negative int, got {num_groups!r}")
    if num_packed_words(num_groups) != scales.shape[1]:
        raise ValueError(f"scales has {scales.shape[1]} packed words per row but num_groups={num_groups} "
                         f"needs ceil({num_groups}/4) = {num_packed_words(num_groups)}")
    shifts = 8 * torch.arange(4, device=scales.device, dtype=torch.int32)
    b = (scales[:, :, None] >> shifts) & 0xFF  # arithmetic shift, then mask: sign bits drop out
    return b.reshape(scales.shape[0], -1)[:, :num_groups].to(torch.uint8)


def dequantize_fp8_packed(codes: torch.Tensor, scales: torch.Tensor, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """The consumer: float32 [M, N] = codes * 2^(byte - 127), scales read through the view."""
    _check_group_size(group_size)
    check_tensor("codes", codes, dtypes=(torch.float8_e4m3fn,), ndim=2, contiguous=False)
    m, n = codes.shape
    if n % group_size:
        raise ValueError(f"codes' last dimension must be a multiple of group_size={group_size}; got {n}")
    if scales.dim() != 2 or scales.shape[0] != m:
        raise ValueError(f"scales must be [M={m}, P], got shape {tuple(scales.shape)}")
    e = unpack_ue8m0(scales, n // group_size).to(torch.int32) - 127
    s = torch.exp2(e.float())
    return (codes.float().view(m, n // group_size, group_size) * s[..., None]).view(m, n)


# --------------------------------------------------------------------------------------------------
# Small kernels the notebook and the tests look at
# --------------------------------------------------------------------------------------------------

def _elementwise(kernel, v: torch.Tensor, out_dtype, **meta):
    _check("v", v, (torch.float32,), 1)
    out = torch.empty(v.numel(), dtype=out_dtype, device=v.device)  # every element written (masked tail)
    require_launchable(kernel)
    block = 1024
    kernel[(triton.cdiv(v.numel(), block),)](v, out, v.numel(), BLOCK=block, **meta)
    return out


def e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes (uint8) of fp32 values, clamped to +-448, by the kernel's exact rounding."""
    return _elementwise(e4m3_round_kernel, v, torch.uint8)


def e4m3_direct_cast(v: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn values of fp32 ``v`` through a plain ``.to(tl.float8e4nv)`` (the cast the
    interpreter gets wrong)."""
    return _elementwise(e4m3_cast_kernel, v, torch.float8_e4m3fn)


def silu_mul_bf16(gate: torch.Tensor, up: torch.Tensor, impl: int | None = None, *,
                  emulate: bool | None = None) -> torch.Tensor:
    """The kernel's y = silu(gate) * up on 1-D bf16 tensors, with SILU_IMPL ``impl`` (default: the
    one the fused kernel uses, :func:`silu_impl`); ``emulate`` as in :func:`silu_mul_quant_fp8_packed`."""
    emulate = resolve_emulate(emulate)
    _check("gate", gate, (torch.bfloat16,), 1)
    _check("up", up, (torch.bfloat16,), 1)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    impl = silu_impl() if impl is None else impl
    if impl not in SILU_CANDIDATES:
        raise ValueError(f"impl must be one of {SILU_CANDIDATES} here, got {impl!r}"
                         + (" (libdevice's exp does not run in the interpreter)" if INTERPRETED else ""))
    y = torch.empty_like(gate)  # every element written (masked tail)
    require_launchable(silu_mul_bf16_kernel)
    block = 1024
    with _quiet():
        silu_mul_bf16_kernel[(triton.cdiv(gate.numel(), block),)](
            gate, up, y, gate.numel(), BLOCK=block, SILU_IMPL=impl, EMULATE=emulate)
    return y


# SILU_IMPL: bit 1 = fast exp (tl.exp) instead of libdevice's expf, bit 0 = Triton's default division
# instead of IEEE div_rn. Cheapest first. libdevice does not exist in the interpreter. (A bare
# ex2.approx.ftz + rcp.approx.ftz variant was tried on the H200, 2026-11-30: 3 of the 65280 gates round
# differently, so the proof would never pick it; it was taken out.)
SILU_IMPL_NAMES = {
    3: "tl.exp + default division",
    2: "tl.exp + IEEE division (div_rn)",
    1: "libdevice expf + default division",
    0: "libdevice expf + IEEE division (torch's own sequence)",
}
SILU_CANDIDATES = (3, 2) if INTERPRETED else (3, 2, 1, 0)
SILU_IMPL_TORCH = 2 if INTERPRETED else 0  # torch's own sequence (numpy's exp is what the interpreter has)


def _all_finite_bf16(device) -> torch.Tensor:
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return g[torch.isfinite(g.float())].to(device)


def silu_impl_mismatches(impl: int) -> int:
    """For how many of the 65280 finite bf16 gates bf16(silu(gate)) of SILU_IMPL ``impl`` differs
    from torch's ``F.silu(gate.float()).to(bf16)`` on this device."""
    g = _all_finite_bf16(DEVICE)
    y = silu_mul_bf16(g, torch.ones_like(g), impl=impl)
    ref = F.silu(g.float()).to(torch.bfloat16)
    return int((y.view(torch.int16) != ref.view(torch.int16)).sum())


@functools.lru_cache(maxsize=None)
def silu_impl() -> int:
    """The cheapest SILU_IMPL that is bit-exact against torch here, proven by trying every gate.

    y = silu(gate) * up is rounded to bf16 after silu, and a bf16 gate has only 65536 values: if a
    variant's bf16 silu equals torch's for every finite gate, the fused kernel's codes equal the
    reference's for every input (the product and the quantization are exact arithmetic). Checked
    once per process on the device the kernels run on; falls back to torch's own sequence.
    """
    for impl in SILU_CANDIDATES:
        if silu_impl_mismatches(impl) == 0:
            return impl
    return SILU_IMPL_TORCH


# --------------------------------------------------------------------------------------------------
# Benchmark (GPU)
# --------------------------------------------------------------------------------------------------

BENCH_N = 7168
BENCH_M = (1, 4, 16, 64, 256, 1024, 2048, 4096, 8192, 16384)
SWEEP_M = (2048, 4096, 16384)      # the launch-configuration sweep (GPU time, graph replay)
SWEEP_BLOCK_M = (2, 4, 8, 16)
SWEEP_WARPS = (2, 4, 8)   # 2 warps at BLOCK_M 2 (16 elements per thread): the default


def _bytes_moved(m: int, n: int) -> int:
    """Fewest bytes: read x once (2N bf16 per row), write codes (N bytes) and the packed scales."""
    return m * 2 * n * 2 + m * n + num_packed_words(n // GROUP_SIZE) * m * 4


# the benchmark's "integer roundings" peer: the EMULATE path and torch's own silu sequence, on the GPU
_INTEGER_ROUNDINGS = {"emulate": True, "config": {"SILU_IMPL": SILU_IMPL_TORCH}}


# Which timer produced each figure of the record (copied into it as results["methods"]).
METHODS = {
    "<peer>_us": "gpu_time_graph_replay: per-call GPU time, a CUDA graph of 20 calls replayed "
                 "(triton.testing.do_bench median of the replay, divided by 20); where <peer>_timer "
                 "is 'eager' the capture failed and the eager per-call time stands in",
    "<peer>_eager_us": "eager_per_call: triton.testing.do_bench median of one Python call, L2 flushed "
                       "between runs (host work and the launch path included)",
    "<peer>_GBps": "bytes_model / <peer>_us",
    "fused_fraction_of_copy": "fused_triton_GBps / ceilings.copy_GBps",
    "config_sweep.us": "gpu_time_graph_replay (median of 3 windows), the fused kernel with that config",
    "ceilings.copy_GBps": "one 1 GiB fp32 device-to-device copy, do_bench median, bytes read + written",
}


def _unfused(x: torch.Tensor):
    """The unfused path: silu-mul in eager torch (y materialized in HBM), then the quant kernel."""
    return quant_fp8_packed(silu_mul_reference(x))


def benchmark(ms: tuple[int, ...] = BENCH_M, n: int = BENCH_N, sweep_m: tuple[int, ...] = SWEEP_M) -> tuple[dict, dict]:
    """Time the fused kernel against torch.compile of the reference, the unfused path and the eager
    reference, for M in ``ms`` and N = ``n`` (input [M, 2N] bf16), and the fused kernel's launch
    configurations at M in ``sweep_m``. Returns (results, ceilings)."""
    from .bench import copy_ceiling_GBps, graph_time_us, require_gpu, time_us

    require_gpu("fp8.benchmark")
    ceiling = copy_ceiling_GBps()
    compiled = torch.compile(silu_mul_quant_fp8_reference, dynamic=True)
    rows = []
    for m in ms:
        x = torch.randn(m, 2 * n, device=DEVICE, dtype=torch.bfloat16) * 3
        # correctness of what is timed, on this very input
        q_ref, s_ref = silu_mul_quant_fp8_reference(x)
        exact = {}
        for key, kw in (("fused_triton", {}), ("fused_integer_roundings", _INTEGER_ROUNDINGS)):
            q, s = silu_mul_quant_fp8_packed(x, **kw)
            exact[key] = bool(torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref))
        fns = {
            "fused_triton": lambda: silu_mul_quant_fp8_packed(x),
            "fused_integer_roundings": lambda: silu_mul_quant_fp8_packed(x, **_INTEGER_ROUNDINGS),
            "torch_compile": lambda: compiled(x),
            "unfused": lambda: _unfused(x),
            "torch_eager": lambda: silu_mul_quant_fp8_reference(x),
        }
        nbytes = _bytes_moved(m, n)
        row = {"M": m, "N": n, "bytes": nbytes, "exact": exact["fused_triton"],
               "exact_integer_roundings": exact["fused_integer_roundings"]}
        for name, fn in fns.items():
            fn(), fn()  # compile / specialize outside the timed region
            torch.cuda.synchronize()
            # GPU time: calls replayed from a CUDA graph (no host work in between); eager do_bench
            # also measures Python and the launch path, which dominate small calls
            t_eager = time_us(fn)
            try:
                t, timer = graph_time_us(fn), "graph"
            except Exception:  # a peer that cannot be captured keeps its eager time, marked so
                t, timer = t_eager, "eager"
            row[f"{name}_us"] = round(t, 3)
            row[f"{name}_eager_us"] = round(t_eager, 3)
            row[f"{name}_timer"] = timer
            row[f"{name}_GBps"] = round(nbytes / (t * 1e-6) / 1e9, 1)
        row["fused_fraction_of_copy"] = round(row["fused_triton_GBps"] / ceiling, 3)
        rows.append(row)
        print(f"M={m:6d}  fused {row['fused_triton_us']:9.2f} us ({row['fused_triton_GBps']:7.0f} GB/s, "
              f"{100 * row['fused_fraction_of_copy']:.0f}% of copy)  compile {row['torch_compile_us']:9.2f}  "
              f"unfused {row['unfused_us']:9.2f}  eager {row['torch_eager_us']:9.2f}  "
              f"int-roundings {row['fused_integer_roundings_us']:9.2f}  exact={exact}",
              flush=True)
    # the launch configurations the default (_block_m) was chosen from, GPU time from graph replay
    sweep = []
    for m in sweep_m:
        x = torch.randn(m, 2 * n, device=DEVICE, dtype=torch.bfloat16) * 3
        q_ref, s_ref = silu_mul_quant_fp8_reference(x)
        nbytes = _bytes_moved(m, n)
        for bm in SWEEP_BLOCK_M:
            for warps in SWEEP_WARPS:
                cfg = {"BLOCK_M": bm, "num_warps": warps}
                q, s = silu_mul_quant_fp8_packed(x, config=cfg)
                ok = bool(torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref))
                t = graph_time_us(lambda: silu_mul_quant_fp8_packed(x, config=cfg), windows=3)
                sweep.append({"M": m, "N": n, "BLOCK_M": bm, "num_warps": warps, "us": round(t, 3), "timer": "graph",
                              "fraction_of_copy": round(nbytes / (t * 1e-6) / 1e9 / ceiling, 3), "exact": ok,
                              "default": bm == _launch_config(m, None)["BLOCK_M"] and warps == _launch_config(m, None)["num_warps"]})
                print(f"  sweep M={m} BLOCK_M={bm} warps={warps}: {t:.1f} us "
                      f"({100 * sweep[-1]['fraction_of_copy']:.0f}% of copy) exact={ok}", flush=True)
        del x
        torch.cuda.empty_cache()
    results = {
        "N": n,
        "rows": rows,
        "config_sweep": sweep,
        "silu_impl": silu_impl(),
        "silu_impl_name": SILU_IMPL_NAMES[silu_impl()],
        "silu_impl_mismatches": {str(k): silu_impl_mismatches(k) for k in SILU_CANDIDATES},
        "bytes_model": "read M*2N*2 (x, bf16) + write M*N (codes) + write M*ceil(N/512)*4 (packed scales)",
        "peers": {
            "fused_triton": "this kernel: one launch, x read once",
            "fused_integer_roundings": "the same kernel with the interpreter's integer roundings and "
                                       "torch's silu sequence (libdevice expf, div_rn) on the GPU",
            "torch_compile": "torch.compile(dynamic=True) of silu_mul_quant_fp8_reference",
            "unfused": "eager torch silu-mul (y materialized), then this workbook's quant-only kernel",
            "torch_eager": "silu_mul_quant_fp8_reference run eagerly",
        },
        "methods": METHODS,
        "timer": "<name>_us: per-call time replayed from a CUDA graph of 20 calls (GPU time; "
                 "<name>_timer says 'eager' where capture failed); <name>_eager_us: "
                 "triton.testing.do_bench median, L2 flushed between runs (host time included)",
    }
    return results, {"copy_GBps": round(ceiling, 1)}


def benchmark_table(rows: list[dict]) -> str:
    """The benchmark rows as a text table: GPU time per call from CUDA-graph replay for every peer,
    then the fused kernel's eager per-call time (do_bench, host included) beside it."""
    head = (f"{'M':>6} {'fused us':>9} {'GB/s':>6} {'%copy':>6} {'compile us':>11} {'unfused us':>11} "
            f"{'eager-ref us':>12} {'int-round us':>12} {'| fused eager':>13} {'exact':>6}")
    lines = ["GPU time per call (CUDA-graph replay) | fused eager: the same call, eager per-call (do_bench)", head]
    for r in rows:
        lines.append(f"{r['M']:>6} {r['fused_triton_us']:9.2f} {r['fused_triton_GBps']:6.0f} "
                     f"{100 * r['fused_fraction_of_copy']:5.0f}% {r['torch_compile_us']:11.2f} {r['unfused_us']:11.2f} "
                     f"{r['torch_eager_us']:12.2f} {r['fused_integer_roundings_us']:12.2f} "
                     f"{r['fused_triton_eager_us']:13.2f} {str(r['exact'] and r['exact_integer_roundings']):>6}")
    eager = sorted({k[:-6] for r in rows for k, v in r.items() if k.endswith("_timer") and v == "eager"})
    if eager:
        lines.append("timed eagerly (could not be captured in a CUDA graph): " + ", ".join(eager))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Pictures
# --------------------------------------------------------------------------------------------------

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
        if f"{key}_us" not in rows[0]:
            continue
        ls = ":" if key == "fused_integer_roundings" else "-"
        a.plot(ms, [r[f"{key}_us"] for r in rows], marker=marker, color=color, ls=ls, label=label)
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


# --------------------------------------------------------------------------------------------------
# Exercise graders (raise AssertionError with a message that teaches; see workbook.check.grade)
# --------------------------------------------------------------------------------------------------

_AMAX_CASES = [0.0, 1e-12, 1e-10, 4.5e-8, 0.001, 1.0, 223.99998, 224.0, 224.00002, 256.0, 447.99997,
               448.0, 448.00003, 449.0, 896.0, 1000.0, 57344.0, 3.0e38]


def _f32(v) -> str:
    """The shortest decimal that names one fp32 value (223.99998 and 224.00002 stay apart, where
    ``:g`` would print both as 224)."""
    return str(np.float32(float(v)))


def solution_exponent_byte(amax: torch.Tensor) -> torch.Tensor:
    """Exercise 1's solution: clamp(ceil(log2(max(amax / 448, 1e-10))) + 127, 0, 255) as uint8."""
    e = torch.ceil(torch.log2(torch.clamp(amax / E4M3_MAX, min=EPS)))
    return torch.clamp(e + 127, 0, 255).to(torch.uint8)


def check_exponent_byte(fn) -> None:
    """Grader of exercise 1: fn(amax fp32 [n]) -> exponent bytes [n] (any integer dtype)."""
    amax = torch.tensor(_AMAX_CASES, dtype=torch.float32)
    ref = torch.clamp(ue8m0_exponent_reference(amax) + 127, 0, 255).to(torch.int64)
    got = fn(amax.clone())
    if not isinstance(got, torch.Tensor) or got.shape != amax.shape:
        raise AssertionError(f"return a tensor of shape {tuple(amax.shape)}, one byte per amax; got {got!r}")
    if got.is_floating_point() and not torch.isfinite(got).all():
        i = int((~torch.isfinite(got)).nonzero()[0])
        raise AssertionError(f"amax = {_f32(amax[i])}: got {float(got[i])}, not a byte. Hint: log2(0) = -inf; "
                             "the floor max(amax/448, 1e-10) keeps an all-zero group finite.")
    got = got.to(torch.int64).cpu()
    bad = (got != ref).nonzero().flatten().tolist()
    if not bad:
        return
    # amax printed as the fp32 value it is, with amax/448 in fp32: 224.00002 / 448 is just above 2^-1
    lines = [f"amax = {_f32(amax[i])} (amax/448 = {_f32(amax[i] / E4M3_MAX)}): got {int(got[i])}, "
             f"expected {int(ref[i])} (0x{int(ref[i]):02X})" for i in bad]
    hint = ""
    if all(int(got[i]) == int(ref[i]) - 127 for i in bad):
        hint = "the byte is the exponent plus the UE8M0 bias: e + 127 (an all-zero group gives 0x5E = 94)."
    elif any(not 0 <= int(got[i]) <= 255 for i in bad):
        hint = ("a byte holds 0..255, and an int8 wraps above 127: compute e + 127 in a wider type "
                "(int32 or float) and clamp it to [0, 255].")
    elif all(int(got[i]) == int(ref[i]) - 1 for i in bad):
        hint = ("every wrong byte is one too small: round UP (ceil), since the scale must satisfy "
                "2^e >= amax/448 so that no |y|/2^e exceeds 448. Near 224 = 448/2 the values differ in "
                "their last fp32 bit, and so do their bytes.")
    elif _AMAX_CASES.index(0.0) in bad:
        hint = ("an all-zero group: log2(0) = -inf. The floor max(amax/448, 1e-10) gives "
                "ceil(log2(1e-10)) = -33, byte 127 - 33 = 94 = 0x5E.")
    elif _AMAX_CASES.index(448.0) in bad or _AMAX_CASES.index(449.0) in bad:
        hint = ("round UP: the scale must satisfy 2^e >= amax/448 so that no |y|/2^e exceeds 448. "
                "amax = 448 gives e = 0 (byte 127); amax = 449 needs e = 1 (byte 128).")
    elif _AMAX_CASES.index(3.0e38) in bad:
        hint = "large amax needs large bytes: 3e38/448 is about 2^119.7, so e = 120, byte 247."
    raise AssertionError("\n  ".join(lines) + (f"\n  Hint: {hint}" if hint else ""))


def solution_pack(exp_bytes: torch.Tensor) -> torch.Tensor:
    """Exercise 2's solution: four bytes side by side ARE one little-endian int32; groups past G are
    0 bytes. (Host byte order: little-endian on x86-64 and Arm, the hosts torch runs on.)"""
    m, g = exp_bytes.shape
    padded = torch.zeros(m, 4 * num_packed_words(g), dtype=torch.uint8, device=exp_bytes.device)
    padded[:, :g] = exp_bytes
    return padded.view(torch.int32)


def check_pack(fn) -> None:
    """Grader of exercise 2: fn(exp_bytes uint8 [M, G]) -> int32 [M, ceil(G/4)] (any strides)."""
    gen = torch.Generator().manual_seed(4)
    for m, g in [(1, 4), (3, 1), (2, 5), (4, 8)]:
        e = torch.randint(0, 256, (m, g), generator=gen, dtype=torch.int32).to(torch.uint8)
        e[0, 0] = 0x78
        if g >= 4:
            e[0, 3] = 0x81  # >= 0x80 in the top byte: a negative int32
        ref = pack_ue8m0_reference(e)
        got = fn(e.clone())
        if not isinstance(got, torch.Tensor) or got.dtype != torch.int32:
            raise AssertionError(f"return an int32 tensor, got {getattr(got, 'dtype', type(got).__name__)}")
        if tuple(got.shape) != tuple(ref.shape):
            raise AssertionError(f"G = {g} groups need ceil({g}/4) = {ref.shape[1]} words per row: expected shape "
                                 f"{tuple(ref.shape)}, got {tuple(got.shape)}")
        got = got.cpu()
        if not torch.equal(got, ref):
            i, j = (got != ref).nonzero()[0].tolist()
            w, r = int(got[i, j]) & 0xFFFFFFFF, int(ref[i, j]) & 0xFFFFFFFF
            msg = (f"M={m}, G={g}: word [{i}, {j}] is 0x{w:08X}, expected 0x{r:08X} (bytes of groups "
                   f"{4 * j}..{min(4 * j + 3, g - 1)}: {[f'0x{int(b):02X}' for b in e[i, 4 * j:4 * j + 4]]}).")
            if w == int.from_bytes(r.to_bytes(4, "little"), "big"):
                msg += " The bytes are reversed: group 4p+j goes to bits 8j..8j+7, the FIRST group in the LOWEST byte."
            elif (w ^ r) & ~0xFF == 0 or (g % 4 and j == ref.shape[1] - 1 and (w ^ r) >> (8 * (g % 4))):
                msg += " Groups that do not exist (past G) must leave their bytes 0."
            elif w & 0xFF == r & 0xFF and (w ^ r) >> 8:
                msg += (" Byte 0 is right, the higher ones are not: shift in a dtype wide enough for 32 bits "
                        "(a uint8 shifted left by 8 is 0).")
            raise AssertionError(msg)


class _ZeroFills(TorchDispatchMode):
    """Records the storages that a zero fill produced (torch.zeros, zeros_like, new_zeros, zero_(),
    fill_(0), full(.., 0)): an exercise about torch.empty can then tell a zero-filled output apart."""

    _OPS = {"aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero_", "aten::fill_", "aten::full"}

    def __init__(self):
        super().__init__()
        self.ptrs: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if name in self._OPS and isinstance(out, torch.Tensor):
            value = 0
            if name in ("aten::fill_", "aten::full"):
                value = args[1] if len(args) > 1 else (kwargs or {}).get("fill_value", (kwargs or {}).get("value"))
                if isinstance(value, torch.Tensor) and value.numel() == 1:
                    value = value.item()
            if isinstance(value, (int, float, bool)) and value == 0:
                self.ptrs.add(out.untyped_storage().data_ptr())
        return out


def check_pack_kernel(fn) -> None:
    """Grader of exercise 3: fn(exp_bytes uint8 [M, G] on DEVICE) -> the MN-major view int32 [M, P],
    strides (1, round_up(M, 4)), of a storage [P, round_up(M, 4)] allocated with torch.empty.

    Every element of the view must be written, with the reference's word. The storage rows
    M..round_up(M, 4)-1 belong to no element of the view: the kernel may leave them alone or write
    them (zeros, say); either passes. A zero-filled allocation does not: it is the memset the
    exercise removes."""
    from .coverage import coverage

    gen = torch.Generator().manual_seed(5)
    for m, g in [(1, 1), (5, 5), (9, 8), (70, 6)]:
        e = torch.randint(0, 256, (m, g), generator=gen, dtype=torch.int32).to(torch.uint8).to(DEVICE)
        p, tm = num_packed_words(g), tma_aligned_rows(m)
        with _ZeroFills() as fills:
            got = fn(e.clone())
        if not isinstance(got, torch.Tensor) or got.dtype != torch.int32 or tuple(got.shape) != (m, p):
            raise AssertionError(f"M={m}, G={g}: return the int32 view [M, P] = [{m}, {p}], got "
                                 f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}")
        if got.stride() != (1, tm) or got.untyped_storage().nbytes() != 4 * p * tm:
            raise AssertionError(f"M={m}, G={g}: the view must be storage.T[:M, :] of an int32 storage [P, round_up(M, 4)]"
                                 f" = [{p}, {tm}]: strides (1, {tm}) over {4 * p * tm} bytes; got strides "
                                 f"{got.stride()} over {got.untyped_storage().nbytes()} bytes")
        if got.untyped_storage().data_ptr() in fills.ptrs:
            raise AssertionError(f"M={m}, G={g}: the storage was zero-filled (torch.zeros, zero_() or fill_(0)): "
                                 "that is the extra memset kernel this workbook removes. Allocate it with "
                                 "torch.empty: the kernel writes every element of the view, and the padding rows "
                                 f"M..{tm - 1} of each word are no element of it.")
        cov = coverage(fn, e, names=["scales"])[0]
        if bool((cov.read_before_written & cov.in_view).any()):
            raise AssertionError(
                f"M={m}, G={g}: view elements {cov.ranges(cov.read_before_written & cov.in_view)} end with values that "
                "depend on what torch.empty left there: the kernel read them (added or OR-ed into them) before "
                "writing. Build the whole word in registers and store it once.")
        if not cov.view_fully_written:
            raise AssertionError(
                f"M={m}, G={g}: elements of the view were never written (they still hold torch.empty's poison): "
                f"{cov.unwritten_ranges('view')} (storage coordinates [word p, token m]). Every token m < M "
                f"needs its word p at storage offset p * {tm} + m: does the grid cover all "
                f"ceil(M / BLOCK_M) row blocks and all {p} words, and is the store masked with m < M?")
        ref = pack_ue8m0_reference(e.cpu())
        got = got.cpu()
        if not torch.equal(got, ref):
            i, j = (got != ref).nonzero()[0].tolist()
            w, r = int(got[i, j]) & 0xFFFFFFFF, int(ref[i, j]) & 0xFFFFFFFF
            hint = (" The bytes are reversed: group 4p+j goes to bits 8j..8j+7." if w == int.from_bytes(r.to_bytes(4, "little"), "big")
                    else f" Is token m's word p stored at storage offset p * {tm} + m, and are groups past G loaded as 0?")
            raise AssertionError(f"M={m}, G={g}: word [{i}, {j}] is 0x{w:08X}, expected 0x{r:08X}.{hint}")
