"""NVFP4 quantization, the finished code of notebook 02: the format in torch (the reference), the
launchers (Triton and CUDA C++) with their allocation policy and its proof, the input checks, and the
consumers that read the output. Graders: :mod:`workbook.graders.nvfp4`; pictures:
:mod:`workbook.plots.nvfp4`; the H200 benchmark: :mod:`workbook.benchmarks.nvfp4`.

Format (one E4M3 scale per 16 elements, a per-tensor fp32 global scale):

* ``global_scale = 448 * 6 / amax(x)`` maps the tensor's largest magnitude onto the largest product
  of an E4M3 scale (448) and an E2M1 value (6).
* block scale ``sf = e4m3(min(global_scale * amax_block / 6, 448))``
* code ``q = e2m1(clamp(x * global_scale / float(sf), -6, 6))`` (nearest, ties to even; the sign bit
  is the sign bit of x), two codes per byte, element 2i in the low nibble.
* dequantize ``x ~ value(q) * float(sf) / global_scale``.

Scales come in two layouts: linear ``[M, K/16]``, or swizzled 128x4 over the padded grid
``[round_up(M, 128), round_up(K/16, 4)]`` as the FP4 GEMMs read them, whole 128x4 tiles at a time.

Launchers. ``nvfp4_quant`` runs the fast kernel (``kernels/nvfp4.py``: a program quantizes BLOCK_S
consecutive 16-element blocks of x read as one flat sequence; :data:`CONFIG` names the tile, and
:func:`launch_rule` picks it from the input's size) or, with ``backend="cuda"``, the CUDA C++ kernels
of ``kernels/cuda/nvfp4.cu`` (same checks, same outputs, same bytes). ``nvfp4_quant_plain`` runs the
plain kernel, notebook 02's exercise solution. Every output is allocated with ``torch.empty``: the
comment at each allocation says which programs write every byte of it, padding included, and the
tests prove it by poisoning the whole storage (``quant_coverage``). ``write_padding=False`` leaves
the padded scale entries unwritten: the regression the notebook studies.

Consumers. ``nvfp4_gemm_ref`` reads operand A as a block-scaled FP4 GEMM does (whole tiles: padded
columns multiply zero codes); ``nvfp4_gemm_small_m_model`` models a small-M path in which padded rows'
scales reach real rows. Which bytes matter depends on the consumer; the contract is the whole padded
storage, padding zero.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from . import device, nvcc
from .device import (DEVICE, ON_GPU, cdiv, check_tensor, next_pow2, require_launchable, resolve_config,
                     resolve_emulate)
from .coverage import Coverage, coverage
from .kernels.nvfp4 import e4m3_cast_kernel, nvfp4_quant_kernel, nvfp4_quant_plain_kernel

__all__ = [
    "E2M1_VALUES", "E2M1_MAX", "E4M3_MAX", "round_up", "padded_scale_shape", "global_scale_of",
    "e2m1_encode", "e2m1_decode", "e2m1_round_brute", "e4m3_grid", "e4m3_round_brute", "swizzle_offset",
    "swizzle_scales", "unswizzle_scales", "quantize_ref", "dequantize_ref",
    "CONFIG", "EMULATE_WHY", "launch_rule", "launch_tile", "allocate_outputs", "nvfp4_quant", "nvfp4_quant_plain",
    "nvfp4_launch_plan", "e4m3_cast_errors", "nvfp4_gemm_ref", "nvfp4_gemm_small_m_model",
    "quant_coverage", "logical_scale_coverage",
]

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of code index 0..7
E2M1_MAX = 6.0
E4M3_MAX = 448.0
_DTYPES = (torch.float16, torch.bfloat16)


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def padded_scale_shape(M: int, K: int) -> tuple[int, int]:
    """Shape of the swizzled scale storage for an [M, K] input: (round_up(M, 128), round_up(K/16, 4))."""
    return round_up(M, 128), round_up(K // 16, 4)


def global_scale_of(x: torch.Tensor) -> torch.Tensor:
    """``448 * 6 / amax(x)`` as a 1-element fp32 tensor on x's device (stays there: no host sync)."""
    amax = x.detach().abs().amax().float().clamp(min=1e-12)
    return (E4M3_MAX * E2M1_MAX / amax).reshape(1)


# --------------------------------------------------------------------------------------------------
# The formats in torch
# --------------------------------------------------------------------------------------------------

def e2m1_encode(y: torch.Tensor, sign_of: torch.Tensor | None = None) -> torch.Tensor:
    """E2M1 code (uint8 0..15) of each fp32 value ``y``: |y| saturated at 6, rounded to the nearest
    E2M1 magnitude with ties to the even index; bit 3 is the sign bit of ``sign_of`` (default y)."""
    a = y.abs()
    idx = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
           + (a > 2.5) + (a >= 3.5) + (a > 5.0)).to(torch.uint8)
    sign = torch.signbit(y if sign_of is None else sign_of).to(torch.uint8) << 3
    return sign | idx


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 value of each E2M1 code (uint8, low 4 bits used)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    c = codes.to(torch.int64)
    mag = table[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def e2m1_round_brute(y: torch.Tensor) -> torch.Tensor:
    """E2M1 rounding by brute force (the specification, independent of the decision thresholds):
    the nearest grid value to clamp(y, -6, 6), ties to the even index; returned as a signed value."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    a = y.detach().double().cpu().abs().clamp(max=E2M1_MAX)
    d = (a[..., None] - grid).abs()
    best = d.min(dim=-1, keepdim=True).values
    tie_ok = (d == best) & (torch.arange(8) % 2 == 0)
    only = (d == best).sum(-1, keepdim=True) == 1
    pick = torch.where(only, (d == best).to(torch.int64).argmax(-1, keepdim=True),
                       tie_ok.to(torch.int64).argmax(-1, keepdim=True))
    mag = grid[pick.squeeze(-1)]
    return torch.where(torch.signbit(y.detach().cpu()), -mag, mag).float()


def e4m3_grid() -> torch.Tensor:
    """All non-negative finite E4M3 values in byte order (bytes 0x00..0x7E)."""
    b = torch.arange(0x7F, dtype=torch.uint8)
    return b.view(torch.float8_e4m3fn).double()


def e4m3_round_brute(v: torch.Tensor) -> torch.Tensor:
    """E4M3 byte of each value in [0, 448] by brute force: nearest of the 127 non-negative finite
    values, ties to the even byte (the even mantissa)."""
    grid = e4m3_grid()
    a = v.detach().double().cpu().clamp(0, E4M3_MAX)
    d = (a[..., None] - grid).abs()
    best = d.min(dim=-1, keepdim=True).values
    hit = d == best
    even = hit & (torch.arange(0x7F) % 2 == 0)
    pick = torch.where(hit.sum(-1, keepdim=True) == 1, hit.to(torch.int64).argmax(-1, keepdim=True),
                       even.to(torch.int64).argmax(-1, keepdim=True))
    return pick.squeeze(-1).to(torch.uint8)


def swizzle_offset(r, c, Kp: int):
    """Byte offset of logical scale (r, c) in the 128x4 swizzled storage of a [Mp, Kp] grid.

    The grid is cut into 128x4 tiles of 512 bytes, tiles stored row-major (``Kp/4`` per tile row).
    Inside a tile, row r sits in 32-row slab ``(r % 128) // 32``; the 4 slabs of one row-in-slab
    ``r % 32`` are neighbours, so one 16-byte line holds rows r, r+32, r+64, r+96 x 4 columns.
    Works on ints and on integer tensors."""
    return (((r // 128) * (Kp // 4) + c // 4) * 512
            + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def swizzle_scales(sf: torch.Tensor) -> torch.Tensor:
    """Linear scales [M, n] (float8_e4m3fn or uint8) -> swizzled storage [Mp, Kp] of the same dtype,
    padded entries zero."""
    check_tensor("sf", sf, dtypes=(torch.float8_e4m3fn, torch.uint8), ndim=2, contiguous=False)
    return _swizzle(sf)


def _swizzle(sf: torch.Tensor) -> torch.Tensor:
    M, n = sf.shape
    Mp, Kp = round_up(M, 128), round_up(n, 4)
    b = torch.nn.functional.pad(_bytes(sf), (0, Kp - n, 0, Mp - M))
    out = b.view(Mp // 128, 4, 32, Kp // 4, 4).permute(0, 3, 2, 1, 4).reshape(Mp, Kp)
    return out.view(sf.dtype) if sf.dtype != torch.uint8 else out


def unswizzle_scales(sf_swizzled: torch.Tensor) -> torch.Tensor:
    """Swizzled storage [Mp, Kp] -> the whole padded logical grid [Mp, Kp] (slice [:M, :K/16] for the
    real scales)."""
    check_tensor("sf_swizzled", sf_swizzled, dtypes=(torch.float8_e4m3fn, torch.uint8), ndim=2)
    Mp, Kp = sf_swizzled.shape
    if Mp % 128 or Kp % 4:
        raise ValueError(f"sf_swizzled must have shape [multiple of 128, multiple of 4], got {[Mp, Kp]}")
    b = _bytes(sf_swizzled)
    out = b.view(Mp // 128, Kp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(Mp, Kp)
    return out.view(sf_swizzled.dtype) if sf_swizzled.dtype != torch.uint8 else out


def quantize_ref(x: torch.Tensor, global_scale: torch.Tensor, swizzled: bool = True):
    """Pure-torch NVFP4 quantization -> (codes uint8 [M, K/2], scales float8_e4m3fn in storage order:
    [Mp, Kp] swizzled with zero padding, or [M, K/16] linear)."""
    M, K = x.shape
    xf = x.float().view(M, K // 16, 16)
    gs = global_scale.float().reshape(())
    amax = xf.abs().amax(dim=-1)
    # divide by a tensor, not the Python scalar 6.0: on CUDA torch turns a scalar divisor into a
    # multiplication by its reciprocal, which is not the correctly rounded quotient
    six = torch.full_like(amax, 6.0)
    sf = torch.clamp(gs * amax / six, max=E4M3_MAX).to(torch.float8_e4m3fn)   # RNE, no overflow
    sff = sf.float()[..., None]
    y = (xf * gs) / torch.where(sff > 0, sff, torch.ones_like(sff))
    y = torch.where(sff > 0, y, torch.zeros_like(y))
    q = e2m1_encode(y, sign_of=xf).view(M, K // 2, 2)
    codes = q[..., 0] | (q[..., 1] << 4)
    return codes, (_swizzle(sf) if swizzled else sf)


def dequantize_ref(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                   *, swizzled: bool = True) -> torch.Tensor:
    """codes [M, K/2] + scales (storage order) -> fp32 [M, K]: value(q) * float(sf) / global_scale."""
    M, half = codes.shape
    K = 2 * half
    sf = unswizzle_scales(scales)[:M, :K // 16] if swizzled else scales
    if tuple(sf.shape) != (M, K // 16):
        raise ValueError(f"scales hold {tuple(sf.shape)} real entries, expected {(M, K // 16)} for codes {tuple(codes.shape)}")
    q = torch.stack([codes & 0xF, codes >> 4], dim=-1).view(M, K)
    vals = e2m1_decode(q).view(M, K // 16, 16)
    return (vals * sf.float()[..., None] / global_scale.float().reshape(())).view(M, K)


# --------------------------------------------------------------------------------------------------
# The launch configuration and the input checks
# --------------------------------------------------------------------------------------------------

# The fast kernel's one launch configuration (``config=`` of nvfp4_quant takes these names, or a
# triton.Config). Tiles: a program quantizes BLOCK_S consecutive 16-element blocks of x read as one flat
# sequence (rows end to end), so every tile is one contiguous stretch of x and of the codes for any M
# and K and only the last one can be partial. BLOCK_S None (the default): the tile, BLOCK_S and
# num_warps, is chosen per input by ``launch_tile`` (on the GPU: ``launch_rule``). A config that names
# BLOCK_S runs that tile, with num_warps 4 unless it names it too.
CONFIG = {"BLOCK_S": None, "num_warps": 4}
EMULATE_WHY = "Triton's interpreter runs no inline PTX and mis-rounds casts to float8e4nv"
_WAVES = 8               # the rule's target: at least this many programs per SM ...
_MIN_BLOCK_S, _MAX_BLOCK_S = 32, 512   # ... with tiles of 512 to 8192 elements
_INTERPRETER_MAX_BLOCK_S = 2048        # the interpreter's tile: numpy does the work, fewer programs are faster
_launchable = False


def launch_rule(M: int, K: int, sm_count: int | None = None) -> tuple[int, int]:
    """The GPU's default tile (BLOCK_S, num_warps), a rule of the input's size alone (no per-shape
    table): the widest tile of at most ``_MAX_BLOCK_S`` 16-element blocks that still gives every SM
    ``_WAVES`` programs, so that large inputs run wide tiles (long contiguous stretches, the per-tile
    work amortised) and small inputs still spread over all SMs; one warp per 128 blocks (4 blocks,
    64 elements per thread), at least one. ``sm_count``: the GPU's SMs (default ``device.sm_count()``)."""
    sms = device.sm_count() if sm_count is None else sm_count
    blocks = M * (K // 16)
    bs = _MAX_BLOCK_S
    while bs > _MIN_BLOCK_S and blocks < bs * _WAVES * sms:
        bs //= 2
    return bs, max(1, min(8, bs // 128))


def launch_tile(M: int, K: int, config=None) -> tuple[int, int]:
    """The tile (BLOCK_S, num_warps) that ``nvfp4_quant(x [M, K], config=config)`` launches: ``config``
    resolved against :data:`CONFIG`; without BLOCK_S, on the GPU ``launch_rule``, in the interpreter
    the largest tile up to ``_INTERPRETER_MAX_BLOCK_S`` blocks."""
    if config is None:
        if not ON_GPU:
            return min(_INTERPRETER_MAX_BLOCK_S, next_pow2(max(M * (K // 16), 1))), CONFIG["num_warps"]
        return launch_rule(M, K)
    cfg = resolve_config(config, CONFIG, pow2=("BLOCK_S", "num_warps"))
    if cfg["BLOCK_S"] is None:
        raise ValueError(f"config must name BLOCK_S (16-element blocks per program; optionally num_warps), "
                         f"got {config!r}")
    return cfg["BLOCK_S"], cfg["num_warps"]


def _check_global_scale(global_scale, x: torch.Tensor, check_finite: bool) -> torch.Tensor:
    """The global scale as a 1-element fp32 tensor on x's device; its VALUE checked where reading it
    costs no device-to-host sync (a Python number, a CPU tensor) or where the caller asked for it
    (``check_finite=True``)."""
    if isinstance(global_scale, (int, float)) and not isinstance(global_scale, bool):
        value = float(global_scale)
        _check_scale_value(value)
        # a fill kernel, not a host-to-device copy: capturable in a CUDA graph
        return torch.full((1,), value, dtype=torch.float32, device=x.device)
    check_tensor("global_scale", global_scale, dtypes=(torch.float32,), device=x.device, contiguous=False)
    if global_scale.numel() != 1 or global_scale.dim() > 1:
        raise ValueError(f"global_scale must hold exactly one fp32 value (shape [] or [1]), got shape "
                         f"{tuple(global_scale.shape)}: NVFP4 has one global scale per tensor")
    if global_scale.device.type == "cpu" or check_finite:
        _check_scale_value(float(global_scale.reshape(())))
    return global_scale


def _check_scale_value(value: float) -> None:
    if not (value > 0 and value != float("inf")):          # also False for NaN
        raise ValueError(
            f"global_scale must be a finite positive number, got {value}: it multiplies every element "
            "(gs = 448*6/amax(x)); 0 makes every code and scale 0, a negative one flips every sign, NaN "
            "or inf makes the scales meaningless. (amax(x) = 0 or inf gives such a gs: check x.)")


def _check_inputs(x, global_scale, check_finite: bool = False):
    check_tensor("x", x, dtypes=_DTYPES, ndim=2, device=DEVICE)
    M, K = x.shape
    if K == 0 or K % 16:
        raise ValueError(f"x.shape[1] (K={K}) must be a positive multiple of 16: one E4M3 scale per "
                         "16 elements along K")
    if check_finite and x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ValueError("check_finite=True reads values back to the host (a sync), which a CUDA graph "
                         "capture forbids: check outside the graph, or leave check_finite=False")
    global_scale = _check_global_scale(global_scale, x, check_finite)
    if check_finite and x.numel() and not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x)).nonzero()[:3].tolist()
        raise ValueError(f"x holds inf or NaN (first at {bad}): NVFP4 has neither, and one such element "
                         "makes its block's scale (and the global scale from amax) meaningless")
    return M, K, global_scale


def allocate_outputs(M: int, K: int, device, *, swizzled: bool = True, alloc: str = "empty"):
    """The outputs of :func:`nvfp4_quant`, both backends: codes uint8 [M, K/2] and the scales as uint8
    (the launcher returns a float8_e4m3fn view of the same storage), [round_up(M, 128),
    round_up(K/16, 4)] swizzled or [M, K/16] linear. ``alloc='zeros'`` fills the scales (the
    benchmark's comparison); the codes are always ``empty``."""
    if alloc not in ("empty", "zeros"):
        raise ValueError(f"alloc must be 'empty' or 'zeros', got {alloc!r}")
    n = K // 16
    # codes: every one of the M x K/16 blocks is quantized by exactly one program, which stores its 8
    # code bytes (Triton: program i takes blocks [i*BLOCK_S, (i+1)*BLOCK_S) of [M, K/2] read flat, masked
    # past the end; CUDA: the CTA of the block's 128 x 32 tile, of its row piece or of its narrow tile).
    # Every byte is written, so `empty` is safe.
    codes = torch.empty((M, K // 2), dtype=torch.uint8, device=device)
    new = torch.empty if alloc == "empty" else torch.zeros
    if swizzled:
        # scales, swizzled: every entry of the padded grid [Mp, Kp] is stored, the real ones (r < M,
        # c < K/16) by their block's quantizer and the padded ones (rows M..Mp-1, columns K/16..Kp-1) as 0
        # (Triton: the padding programs; CUDA: each CTA stores its whole 512-byte swizzled tiles, or its
        # pieces' whole runs of them). Every byte of the storage, padding included, is written, so
        # `empty` is safe; write_padding=False leaves the padding unwritten: the regression.
        return codes, new((round_up(M, 128), round_up(n, 4)), dtype=torch.uint8, device=device)
    # scales, linear: [M, K/16] is exactly the written size, one byte per block stored by its
    # quantizer: `empty` is safe.
    return codes, new((M, n), dtype=torch.uint8, device=device)


# --------------------------------------------------------------------------------------------------
# The CUDA C++ backend (kernels/cuda/nvfp4.cu): the same checks, allocations and bytes
# --------------------------------------------------------------------------------------------------

def _cuda_nvfp4_quant(x: torch.Tensor, global_scale, *, swizzled: bool = True, write_padding: bool = True,
                      alloc: str = "empty", check_finite: bool = False):
    """``nvfp4_quant(..., backend='cuda')``: the same checks, allocations and bytes as the Triton
    launcher, computed by ``nvfp4_quant_cuda`` (kernels/cuda/nvfp4.cu)."""
    nvcc.check_backend("cuda")
    M, K, global_scale = _check_inputs(x, global_scale, check_finite)
    codes, sf = allocate_outputs(M, K, x.device, swizzled=swizzled, alloc=alloc)
    n, (sf_rows, sf_cols) = K // 16, sf.shape
    if M == 0:
        return codes, sf.view(torch.float8_e4m3fn)
    if M * n >= 1 << 31:
        raise ValueError(f"x of shape {(M, K)} is too large for the CUDA kernel: it numbers the "
                         "16-element blocks below 2^31")
    lib = nvcc.build()
    xa = nvcc.aligned16(x)
    gs = global_scale.reshape(1).contiguous()
    # the threshold table (128 scale bytes x 8 words), scratch: past one wave the table kernel writes it
    # whole before the quantizer reads it (within one wave each CTA builds its own in shared memory and
    # this one is not touched), so `empty` is safe
    table = torch.empty(1024, dtype=torch.int32, device=x.device)
    err = lib.nvfp4_quant_cuda(xa.data_ptr(), gs.data_ptr(), codes.data_ptr(), sf.data_ptr(), table.data_ptr(),
                               M, K, sf_rows, sf_cols, int(x.dtype == torch.bfloat16), int(swizzled),
                               int(write_padding), *nvcc.device_stream(x))
    nvcc.check_error(lib, err, "nvfp4_quant_cuda")
    return codes, sf.view(torch.float8_e4m3fn)


def nvfp4_launch_plan(M: int, K: int, dtype: torch.dtype = torch.bfloat16, device=None) -> dict:
    """How ``nvfp4_quant(..., backend='cuda')`` launches an [M, K] input on ``device`` (default: the
    current GPU), by the tail rule in kernels/cuda/nvfp4.cu: ``wide`` CTAs that each quantize a whole
    tile of 128 rows x 32 blocks; ``pieces`` CTAs of the same launch that each quantize ``piece_rows``
    (32 or 64) rows of one of the remaining tiles (0 unless the tiles fit in one wave and would leave
    at most half the SMs a tile more than the others); ``narrow`` CTAs of a second launch, 128 rows x 8
    blocks each (0 unless the tiles would leave a thin last wave after whole ones, or fit in one wave
    and would leave more than half, and at most 7/8, of the SMs a tile more); ``wide_tiles`` (all of
    [M, K] in wide tiles), ``slots`` (the wide CTAs the GPU holds at once: SMs x resident CTAs per SM) and
    ``sms``."""
    nvcc.check_backend("cuda")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    if M < 0 or K < 0 or K % 16:
        raise ValueError(f"M must be >= 0 and K a multiple of 16 (the block size), got M={M}, K={K}")
    index = torch.cuda.current_device() if device is None else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    lib = nvcc.build()
    out = {k: ctypes.c_int(0) for k in ("wide", "narrow", "slots", "pieces", "piece_rows", "sms")}
    nvcc.check_error(lib, lib.nvfp4_quant_cuda_plan(M, K, int(dtype == torch.bfloat16), index,
                                               *(ctypes.byref(v) for v in out.values())), "nvfp4_quant_cuda_plan")
    plan = {k: v.value for k, v in out.items()}
    plan["wide_tiles"] = -(-M // 128) * -(-(K // 16) // 32)
    return plan


def _nvfp4_threshold_tables(global_scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The quantizer's threshold table (nvfp4_threshold_table_kernel) for each fp32 global scale of
    ``global_scales`` (1-D, on a GPU): int32 [n, 128, 8], word [b, j] = X_j(b) in both 16-bit halves
    (word 7 of each row 0). For tests: a call builds one such table (past one wave) or one per CTA in
    shared memory (within one wave)."""
    nvcc.check_backend("cuda")
    if global_scales.dim() != 1 or not global_scales.is_cuda:
        raise ValueError(f"global_scales must be a 1-D tensor on a GPU, got shape {tuple(global_scales.shape)} "
                         f"on {global_scales.device}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    gs = global_scales.to(torch.float32).contiguous()
    # one block per global scale writes all 1024 words of its table: empty is safe
    tables = torch.empty((gs.numel(), 128, 8), dtype=torch.int32, device=gs.device)
    lib = nvcc.build()
    nvcc.check_error(lib, lib.nvfp4_threshold_tables_cuda(gs.data_ptr(), gs.numel(), int(dtype == torch.bfloat16),
                                                     tables.data_ptr(), *nvcc.device_stream(gs)), "nvfp4_threshold_tables_cuda")
    return tables


# --------------------------------------------------------------------------------------------------
# The launchers: nvfp4_quant (the fast Triton kernel, or the CUDA C++ backend) and the plain kernel
# --------------------------------------------------------------------------------------------------

def _padding_programs(M: int, n: int, write_padding: bool) -> tuple[int, int]:
    """(tiles of padded rows, all padding programs) of the fast kernel's swizzled launch: one program per
    128x4 tile, every tile of the last 128-row group if M % 128 (the padded rows), then the last 4-column
    tile of each other row group if K/16 % 4 (the padded columns); none where the padding is not written."""
    pad_rows = write_padding and M % 128 != 0
    pad_cols = write_padding and n % 4 != 0
    n_rowpad_tiles = round_up(n, 4) // 4 if pad_rows else 0
    return n_rowpad_tiles, n_rowpad_tiles + ((round_up(M, 128) // 128 - (1 if pad_rows else 0)) if pad_cols else 0)


def nvfp4_quant(x: torch.Tensor, global_scale, *, swizzled: bool = True, write_padding: bool = True,
                alloc: str = "empty", config=None, emulate: bool | None = None, check_finite: bool = False,
                backend: str = "triton"):
    """Quantize x [M, K] (fp16/bf16, K % 16 == 0) to NVFP4 on ``DEVICE`` with the fast kernel.

    Returns ``(codes, scales)``: codes uint8 [M, K/2] (element 2i in the low nibble); scales
    float8_e4m3fn in storage order, [round_up(M,128), round_up(K/16,4)] swizzled 128x4 (padding
    zero) or [M, K/16] linear. ``global_scale`` (448*6/amax(x), see ``global_scale_of``) is a
    1-element fp32 tensor on x's device, or a Python number.

    Bad values. A global scale that is 0, negative, NaN or inf raises ValueError wherever its value is
    on the host (a Python number, a CPU tensor). On the GPU it stays on the device: reading it would
    be a device-to-host sync on every call, which a CUDA graph capture forbids, so it is not checked
    unless ``check_finite=True``. That flag also checks x for inf and NaN (a full pass over x and a
    sync). Without it, such inputs give codes and scales that mean nothing (defined by no format).

    Lesson switches: ``write_padding=False`` reproduces the regression (padded scale entries left
    unwritten); ``alloc='zeros'`` allocates the scale buffer with ``torch.zeros`` (for the benchmark);
    ``config`` (names as in :data:`CONFIG`, or a ``triton.Config``) picks the tile instead of the launch
    rule's (``launch_tile``); ``emulate=True`` on a GPU runs the interpreter's path (exact emulation of
    the packed |max| and of the E4M3 conversion), so the tests can compare both (default: ``not ON_GPU``).

    ``backend='cuda'`` runs the CUDA C++ kernels of kernels/cuda/nvfp4.cu instead (GPU only; the same
    checks, outputs and bytes, plus a 4 KB scratch table; it takes neither ``config`` nor ``emulate``;
    built by workbook.nvcc). It is ahead at large inputs and behind at decode sizes (workbook/data/cuda.json).
    """
    given = tuple(k for k, v in (("emulate", emulate), ("config", config)) if v is not None)
    if nvcc.check_backend(backend, triton_only=given):   # the CUDA library builds on first use
        return _cuda_nvfp4_quant(x, global_scale, swizzled=swizzled, write_padding=write_padding, alloc=alloc,
                                 check_finite=check_finite)
    global _launchable
    M, K, global_scale = _check_inputs(x, global_scale, check_finite)
    codes, sf = allocate_outputs(M, K, x.device, swizzled=swizzled, alloc=alloc)
    emulate = resolve_emulate(emulate, EMULATE_WHY)
    n, (sf_rows, sf_cols) = K // 16, sf.shape
    if M == 0:
        return codes, sf.view(torch.float8_e4m3fn)
    bs, warps = launch_tile(M, K, config)
    if n + bs > 1 << 21 or M >= 1 << 22 or M * n + bs >= 1 << 31:
        raise ValueError(f"x of shape [{M}, {K}] is too large for this kernel: it needs K/16 + BLOCK_S <= 2^21, "
                         "M < 2^22 and M * K/16 + BLOCK_S < 2^31 (its row and column arithmetic is exact in "
                         "fp32 and its block indices fit int32 only there)")
    if not _launchable:
        require_launchable(nvfp4_quant_kernel)
        _launchable = True
    # programs 0..n_data-1 quantize BLOCK_S blocks each (rows end to end); the padding programs after
    # them write every padded scale entry (only when the padding is written, i.e. not for the lesson)
    n_data = cdiv(M * n, bs)
    n_rowpad_tiles, n_pad = _padding_programs(M, n, swizzled and write_padding)
    grid = (n_data + n_pad,)
    # the kernel reads element pairs as int32 words (needs a 4-byte aligned start)
    xw = x.view(torch.int32) if x.storage_offset() % 2 == 0 else x.clone().view(torch.int32)
    nvfp4_quant_kernel[grid](
        xw, global_scale, codes, sf, M, K, sf_rows, sf_cols, n_data, float(np.float32(1.0 / n)), n_rowpad_tiles,
        IS_BF16=x.dtype == torch.bfloat16, BLOCK_S=bs, SWIZZLED=swizzled,
        EMULATE=emulate, LAST_PARTIAL=(M * n) % bs != 0, ONE_WRAP=bs <= n, num_warps=warps,
    )
    return codes, sf.view(torch.float8_e4m3fn)


def nvfp4_quant_plain(x: torch.Tensor, global_scale, *, block_m: int = 128, check_finite: bool = False):
    """Quantize x [M, K] to NVFP4 with the plain kernel (notebook 02's exercise solution): the same
    ``(codes, swizzled scales)`` bytes as ``nvfp4_quant``, written the way the definition reads.
    Same input checks and bad-value policy (``check_finite``) as ``nvfp4_quant``."""
    M, K, global_scale = _check_inputs(x, global_scale, check_finite)
    Mp, Kp = padded_scale_shape(M, K)
    # codes: program (i, c) writes the 8 bytes of block c for its BLOCK_M rows; the grid covers every
    # row and every block, so `empty` is safe
    codes = torch.empty((M, K // 2), dtype=torch.uint8, device=x.device)
    # scales: the grid covers the PADDED grid [Mp, Kp] and each program stores a byte for each of its
    # rows (< Mp) in column c: the scale, or 0 in the padding. Every byte is written: `empty` is safe
    sf = torch.empty((Mp, Kp), dtype=torch.uint8, device=x.device)
    if M:
        require_launchable(nvfp4_quant_plain_kernel)
        nvfp4_quant_plain_kernel[(cdiv(Mp, block_m), Kp)](
            x, global_scale, codes, sf, M, K, Mp, Kp, BLOCK_M=block_m)
    return codes, sf.view(torch.float8_e4m3fn)


def e4m3_cast_errors(n: int = 4096, seed: int = 0) -> dict:
    """How often Triton's own cast ``.to(tl.float8e4nv)`` differs from round-to-nearest-even on n
    random fp32 values in [0, 448] (torch's cast is RNE; SPECS: the interpreter's is not, the H200's
    is). Returns {"n", "wrong", "examples": [(value, got byte, want byte), ...], "where"}."""
    v = torch.rand(n, generator=torch.Generator().manual_seed(seed)) * E4M3_MAX
    out = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    e4m3_cast_kernel[(cdiv(n, 1024),)](v.to(DEVICE), out, n, BLOCK=1024)
    got, want = out.cpu(), v.to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (got != want).nonzero().flatten()
    return {"n": n, "wrong": int(bad.numel()), "where": "GPU" if ON_GPU else "Triton interpreter",
            "examples": [(float(v[i]), int(got[i]), int(want[i])) for i in bad[:3]]}


# --------------------------------------------------------------------------------------------------
# The consumer: what the FP4 GEMM reads
# --------------------------------------------------------------------------------------------------

def _dequant_padded(codes: torch.Tensor, scales_swizzled: torch.Tensor, global_scale: torch.Tensor):
    """A as a block-scaled GEMM loads it: the whole padded grid [Mp, 16*Kp], codes outside [M, K] read
    as 0 (+0.0), every element times its scale from the whole padded scale storage."""
    M, half = codes.shape
    K = 2 * half
    Mp, Kp = scales_swizzled.shape
    if (Mp, Kp) != padded_scale_shape(M, K):
        raise ValueError(f"scales_swizzled has shape {[Mp, Kp]}, expected the padded grid "
                         f"{list(padded_scale_shape(M, K))} for codes {list(codes.shape)}")
    q = torch.stack([codes & 0xF, codes >> 4], dim=-1).view(M, K)
    q = torch.nn.functional.pad(q, (0, 16 * Kp - K, 0, Mp - M))            # zero codes = +0.0
    sf = unswizzle_scales(scales_swizzled).float()                          # whole tiles, padding too
    a = (e2m1_decode(q).view(Mp, Kp, 16) * sf[..., None]).view(Mp, 16 * Kp)
    return a / global_scale.float().reshape(()), sf


def _padded_w(w: torch.Tensor, K: int, Kp: int) -> torch.Tensor:
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"w must be [N, K={K}], got {tuple(w.shape)}")
    return torch.nn.functional.pad(w.float(), (0, 16 * Kp - K))


def nvfp4_gemm_ref(codes: torch.Tensor, scales_swizzled: torch.Tensor, global_scale: torch.Tensor,
                   w: torch.Tensor) -> torch.Tensor:
    """Consumer 1, the K-padding reader: ``dequant(A) @ w.T`` computed the way a block-scaled FP4 GEMM
    reads its operand A, whole 128x4 scale tiles, i.e. the padded grid [Mp, Kp] of scales and
    [Mp, 16*Kp] of elements.

    Elements outside [M, K] are zero (the GEMM's tile loads fill out-of-bounds data with zeros, here
    code 0 = +0.0) and w is zero-padded along K the same way, but each padded element is still
    multiplied by its padded scale: 0 * NaN = NaN. So a padded scale COLUMN holding a NaN byte turns
    whole output rows into NaN, while a finite garbage byte happens to vanish. Rows >= M are computed
    and dropped, as the GEMM's store does: in this consumer, padded ROWS never reach a real row (see
    ``nvfp4_gemm_small_m_model`` for one where they do). Returns fp32 [M, N]."""
    M, K = codes.shape[0], 2 * codes.shape[1]
    a, _ = _dequant_padded(codes, scales_swizzled, global_scale)
    wp = _padded_w(w, K, scales_swizzled.shape[1])
    return (a @ wp.T)[:M]


def nvfp4_gemm_small_m_model(codes: torch.Tensor, scales_swizzled: torch.Tensor,
                             global_scale: torch.Tensor, w: torch.Tensor, tile_rows: int = 8,
                             pad_value: float = 1.0) -> torch.Tensor:
    """Consumer 2, the padded-ROW reader. A MODEL, not a kernel: it reproduces the effect reported for
    the TRT-LLM FP4 GEMM's small-M path (FlashInfer issue #2861: with its 8x4 scale layout, used for
    m <= 32, padding rows' scales reach real rows' outputs; a NaN there makes real rows NaN, finite
    garbage changes them, zeros are harmless), not that kernel's mechanism, which the reports do not
    spell out.

    The model: the result of ``nvfp4_gemm_ref`` (so padded K columns are read too), plus, for every
    real row r, the contribution of the padded rows p >= M of r's ``tile_rows``-row tile, each of
    whose elements reads as ``pad_value`` times its scale sf[p, c] (the data a kernel finds in rows
    that hold no token is arbitrary; what matters is that it is multiplied by the padded scale). Zero
    padded scales add exactly 0 * data = 0, as the fix PRs argue (vLLM #37564, #47587). Unlike the real
    kernel, the model applies at any M. Returns fp32 [M, N]."""
    M, K = codes.shape[0], 2 * codes.shape[1]
    a, sf = _dequant_padded(codes, scales_swizzled, global_scale)
    Mp, Kp = sf.shape
    wp = _padded_w(w, K, Kp)
    out = (a @ wp.T)[:M]
    if tile_rows < 1 or 128 % tile_rows:
        raise ValueError(f"tile_rows must divide 128, got {tile_rows}")
    # padded rows of each tile_rows-row tile, as the kernel would load them: pad_value * their scales
    pad_rows = torch.arange(Mp, device=sf.device) >= M
    junk = (pad_value * sf.repeat_interleave(16, dim=1)) * pad_rows[:, None]        # [Mp, 16*Kp]
    junk = torch.where(pad_rows[:, None], junk, torch.zeros_like(junk))             # real rows: none
    per_tile = (junk / global_scale.float().reshape(())).view(Mp // tile_rows, tile_rows, -1).sum(1)
    leak = per_tile @ wp.T                                                          # [Mp/tile_rows, N]
    return out + leak.repeat_interleave(tile_rows, dim=0)[:M]


# --------------------------------------------------------------------------------------------------
# Coverage helpers
# --------------------------------------------------------------------------------------------------

def quant_coverage(x: torch.Tensor, global_scale: torch.Tensor, **kwargs):
    """Coverage of ``nvfp4_quant(x, global_scale, **kwargs)`` over the WHOLE storage of codes and
    scales, each poisoned two ways (0xA5 and 0x7F bytes) at allocation. Returns [codes, scales]
    Coverage objects; the scales' one is in storage order (see :func:`logical_scale_coverage`)."""
    def producer(x, gs):
        codes, sf = nvfp4_quant(x, gs, **kwargs)
        return codes, sf.view(torch.uint8)     # compare bytes, as allocated

    return coverage(producer, x, global_scale, names=["codes", "scales"])


def logical_scale_coverage(cov):
    """A storage-order Coverage of swizzled scales [Mp, Kp], re-indexed to logical (row, scale
    column) coordinates, so that 128x4 tiles are rectangles in a coverage map."""
    def un(mask):
        return unswizzle_scales(mask.to(torch.uint8)).bool()

    return Coverage(cov.name + " (logical rows x scale columns)", cov.dtype, cov.view_shape,
                    cov.view_stride, un(cov.written), un(cov.in_view), un(cov.partially_written))

