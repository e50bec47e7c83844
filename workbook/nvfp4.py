"""NVFP4 quantization: the pure-torch reference, the launcher and its allocation policy, the consumer,
the graders of notebook 02 and the H200 benchmark.

Format (one E4M3 scale per 16 elements, a per-tensor fp32 global scale):

* ``global_scale = 448 * 6 / amax(x)`` maps the tensor's largest magnitude onto the largest product
  of an E4M3 scale (448) and an E2M1 value (6).
* block scale ``sf = e4m3(min(global_scale * amax_block / 6, 448))``
* code ``q = e2m1(clamp(x * global_scale / float(sf), -6, 6))`` (nearest, ties to even; the sign bit
  is the sign bit of x), two codes per byte, element 2i in the low nibble.
* dequantize ``x ~ value(q) * float(sf) / global_scale``.

Scales come in two layouts: linear ``[M, K/16]``, or swizzled 128x4 over the padded grid
``[round_up(M, 128), round_up(K/16, 4)]`` as the FP4 GEMMs read them, whole 128x4 tiles at a time.
"""
from __future__ import annotations

import numpy as np
import torch

import triton

from .device import DEVICE, ON_GPU, check_tensor, require_launchable, resolve_config, resolve_emulate
from .kernels.nvfp4 import nvfp4_quant_kernel, nvfp4_quant_plain_kernel

__all__ = [
    "E2M1_VALUES", "E2M1_MAX", "E4M3_MAX", "round_up", "padded_scale_shape", "global_scale_of",
    "e2m1_encode", "e2m1_decode", "e2m1_round_brute", "e4m3_round_brute", "swizzle_offset",
    "swizzle_scales", "unswizzle_scales", "quantize_ref", "dequantize_ref", "nvfp4_quant",
    "nvfp4_quant_plain", "TUNE_CONFIGS", "launch_rule", "measure_heatmap", "measure_small_m", "plot_heatmap", "plot_small_m", "e4m3_cast_errors", "QUANT_GRADER_SHAPES", "quant_with_nan_padding", "nvfp4_gemm_ref", "nvfp4_gemm_small_m_model", "quant_coverage", "logical_scale_coverage",
    "check_e2m1_round", "check_swizzle_offset", "check_quant",
    "plot_value_grids", "plot_swizzle", "plot_benchmark", "plot_zeros_vs_empty", "benchmark",
    "measure_zeros_vs_empty", "instruction_budget", "sass_counts",
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


def _e4m3_grid() -> torch.Tensor:
    """All non-negative finite E4M3 values in byte order (bytes 0x00..0x7E)."""
    b = torch.arange(0x7F, dtype=torch.uint8)
    return b.view(torch.float8_e4m3fn).double()


def e4m3_round_brute(v: torch.Tensor) -> torch.Tensor:
    """E4M3 byte of each value in [0, 448] by brute force: nearest of the 127 non-negative finite
    values, ties to the even byte (the even mantissa)."""
    grid = _e4m3_grid()
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
# The launcher
# --------------------------------------------------------------------------------------------------

_launchable = False


# Tiles: a program quantizes BLOCK_S consecutive 16-element blocks of x read as one flat sequence
# (rows end to end), so every tile is one contiguous stretch of x and of the codes for any M and K and
# only the last one can be partial. The launch rule (``_config``) picks the tile from the input's size;
# TUNE_CONFIGS are the candidates the benchmark's sweep times and the tests run (every tile size the
# rule can pick is among them).
TUNE_CONFIGS = [{"BLOCK_S": bs, "num_warps": w} for bs, w in
                [(1024, 8), (512, 4), (512, 2), (256, 4), (256, 2), (128, 2), (128, 1), (64, 1), (32, 1)]]
_WAVES = 8               # the rule's target: at least this many programs per SM ...
_MIN_BLOCK_S, _MAX_BLOCK_S = 32, 512   # ... with tiles of 512 to 8192 elements


def _as_tile(config) -> tuple[int, int]:
    """``config`` (a dict or a ``triton.Config`` with BLOCK_S and optionally num_warps) -> the tuple."""
    cfg = resolve_config(config, {"BLOCK_S": None, "num_warps": 4}, pow2=("BLOCK_S", "num_warps"))
    if cfg["BLOCK_S"] is None:
        raise ValueError(f"config must name BLOCK_S (16-element blocks per program; optionally num_warps), "
                         f"got {config!r}")
    return cfg["BLOCK_S"], cfg["num_warps"]


def _sm_count() -> int:
    return torch.cuda.get_device_properties(DEVICE).multi_processor_count if ON_GPU else 1


def launch_rule(M: int, K: int, sm_count: int) -> tuple[int, int]:
    """The GPU's default tile (BLOCK_S, num_warps), a rule of the input's size alone (no per-shape
    table): the widest tile of at most ``_MAX_BLOCK_S`` 16-element blocks that still gives every SM
    ``_WAVES`` programs, so that large inputs run wide tiles (long contiguous stretches, the per-tile
    work amortised) and small inputs still spread over all SMs; one warp per 128 blocks (4 blocks,
    64 elements per thread), at least one."""
    blocks = M * (K // 16)
    bs = _MAX_BLOCK_S
    while bs > _MIN_BLOCK_S and blocks < bs * _WAVES * sm_count:
        bs //= 2
    return bs, max(1, min(8, bs // 128))


def _config(M: int, K: int) -> tuple[int, int]:
    """(BLOCK_S, num_warps) by default: on the GPU ``launch_rule``; in the interpreter the largest tile
    up to 2048 blocks (numpy does the work there; fewer programs are faster)."""
    if not ON_GPU:
        return min(2048, triton.next_power_of_2(max(M * (K // 16), 1))), 4
    return launch_rule(M, K, _sm_count())


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
    unwritten); ``alloc='zeros'`` allocates the scale buffer with ``torch.zeros`` (for the
    benchmark); ``config={"BLOCK_S": .., "num_warps": ..}`` (or a ``triton.Config``: 16-element
    blocks per program, a power of two) picks the tile instead of the launch rule's (``_config``); ``emulate=True`` on a GPU runs the
    interpreter's path (exact emulation of the packed |max| and of the E4M3 conversion) instead of
    the GPU instructions, so the tests can compare the two (default: ``not ON_GPU``).

    ``backend='cuda'`` runs the CUDA C++ kernels of kernels/cuda/nvfp4.cu instead (GPU only; the same
    checks, outputs and bytes, plus a 4 KB scratch table; it takes neither ``config`` nor ``emulate``;
    see workbook.cuda). It is ahead at large inputs and behind at decode sizes (workbook/data/cuda.json).
    """
    from .cuda import _cuda_nvfp4_quant, check_backend  # imports without a GPU; builds on first CUDA use

    if check_backend(backend, emulate, config):
        return _cuda_nvfp4_quant(x, global_scale, swizzled=swizzled, write_padding=write_padding, alloc=alloc,
                                 check_finite=check_finite)
    global _launchable
    M, K, global_scale = _check_inputs(x, global_scale, check_finite)
    if alloc not in ("empty", "zeros"):
        raise ValueError(f"alloc must be 'empty' or 'zeros', got {alloc!r}")
    emulate = resolve_emulate(emulate, "Triton's interpreter runs no inline PTX and mis-rounds casts to "
                                       "float8e4nv")
    n = K // 16
    # codes: [M, K/2] is [M * K/16 blocks, 8 bytes] read flat; quantizing program i writes the bytes of
    # blocks [i*BS, (i+1)*BS) (masked past the end), and the cdiv(M*K/16, BS) programs cover every
    # block, so every byte is written: `empty` is safe.
    codes = torch.empty((M, K // 2), dtype=torch.uint8, device=x.device)
    new = torch.empty if alloc == "empty" else torch.zeros
    if swizzled:
        sf_rows, sf_cols = round_up(M, 128), round_up(n, 4)
        # scales, swizzled: the quantizing programs store the scale of each real block (r < M,
        # c < K/16) at its swizzled offset, and the padding programs store 0 at every other entry of
        # the padded grid [Mp, Kp] (rows M..Mp-1, then columns K/16..Kp-1). Together they write every
        # byte of the storage, padding included, so `empty` is safe. (Allocated as uint8 because the
        # kernel stores bytes; returned as a float8_e4m3fn view of the same storage.)
        sf = new((sf_rows, sf_cols), dtype=torch.uint8, device=x.device)
    else:
        sf_rows, sf_cols = M, n
        # scales, linear: [M, K/16] is exactly the written size, one byte per block at the block's
        # flat index; the quantizing programs cover every block, so `empty` is safe.
        sf = new((M, n), dtype=torch.uint8, device=x.device)
    if M == 0:
        return codes, sf.view(torch.float8_e4m3fn)
    bs, warps = _as_tile(config) if config is not None else _config(M, K)
    if n + bs > 1 << 21 or M >= 1 << 22 or M * n + bs >= 1 << 31:
        raise ValueError(f"x of shape [{M}, {K}] is too large for this kernel: it needs K/16 + BLOCK_S <= 2^21, "
                         "M < 2^22 and M * K/16 + BLOCK_S < 2^31 (its row and column arithmetic is exact in "
                         "fp32 and its block indices fit int32 only there)")
    if not _launchable:
        require_launchable(nvfp4_quant_kernel)
        _launchable = True
    # programs 0..n_data-1 quantize BLOCK_S blocks each (rows end to end); the padding programs after
    # them write every padded scale entry (only when the padding is written, i.e. not for the lesson)
    n_data = triton.cdiv(M * n, bs)
    # padding programs, one 128x4 tile each: every tile of the last 128-row group if M % 128 (the padded
    # rows), then the last 4-column tile of each other row group if K/16 % 4 (the padded columns)
    pad_rows = swizzled and write_padding and M % 128 != 0
    pad_cols = swizzled and write_padding and n % 4 != 0
    n_rowpad_tiles = sf_cols // 4 if pad_rows else 0
    n_pad = n_rowpad_tiles + ((sf_rows // 128 - (1 if pad_rows else 0)) if pad_cols else 0)
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
        nvfp4_quant_plain_kernel[(triton.cdiv(Mp, block_m), Kp)](
            x, global_scale, codes, sf, M, K, Mp, Kp, BLOCK_M=block_m)
    return codes, sf.view(torch.float8_e4m3fn)


def e4m3_cast_errors(n: int = 4096, seed: int = 0) -> dict:
    """How often Triton's own cast ``.to(tl.float8e4nv)`` differs from round-to-nearest-even on n
    random fp32 values in [0, 448] (torch's cast is RNE; SPECS: the interpreter's is not, the H200's
    is). Returns {"n", "wrong", "examples": [(value, got byte, want byte), ...], "where"}."""
    from .kernels.nvfp4 import e4m3_cast_kernel

    v = torch.rand(n, generator=torch.Generator().manual_seed(seed)) * E4M3_MAX
    out = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    e4m3_cast_kernel[(triton.cdiv(n, 1024),)](v.to(DEVICE), out, n, BLOCK=1024)
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
    from .coverage import coverage

    def producer(x, gs):
        codes, sf = nvfp4_quant(x, gs, **kwargs)
        return codes, sf.view(torch.uint8)     # compare bytes, as allocated

    return coverage(producer, x, global_scale, names=["codes", "scales"])


def logical_scale_coverage(cov):
    """A storage-order Coverage of swizzled scales [Mp, Kp], re-indexed to logical (row, scale
    column) coordinates, so that 128x4 tiles are rectangles in a coverage map."""
    from .coverage import Coverage

    def un(mask):
        return unswizzle_scales(mask.to(torch.uint8)).bool()

    return Coverage(cov.name + " (logical rows x scale columns)", cov.dtype, cov.view_shape,
                    cov.view_stride, un(cov.written), un(cov.in_view), un(cov.partially_written))


# --------------------------------------------------------------------------------------------------
# Graders (notebook exercises): raise AssertionError with a message that teaches
# --------------------------------------------------------------------------------------------------

def _probe_values() -> torch.Tensor:
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    grid = torch.tensor(E2M1_VALUES)
    eps = torch.tensor([1e-3, -1e-3])
    vals = torch.cat([grid, mids, (mids[:, None] + eps).flatten(), torch.tensor([6.5, 100.0, 1e-6]),
                      torch.linspace(0, 7, 141)])
    return torch.cat([vals, -vals])


def check_e2m1_round(fn) -> None:
    """Grader: ``fn(y: fp32 tensor) -> fp32 tensor`` rounds to E2M1 values (saturating, ties to even)."""
    y = _probe_values()
    out = fn(y.clone())
    if not isinstance(out, torch.Tensor) or out.shape != y.shape:
        raise AssertionError(f"return a tensor of the input's shape {tuple(y.shape)}")
    ref = e2m1_round_brute(y)
    bad = (out.float().cpu() != ref).nonzero().flatten()
    if len(bad):
        lines = [f"y={float(y[i]):+g}: got {float(out[i]):+g}, expected {float(ref[i]):+g}" for i in bad[:6]]
        o, r, a = out.float().cpu()[bad], ref[bad], y[bad].abs()
        on_grid = torch.isin(o.abs(), torch.tensor(E2M1_VALUES))
        if bool(((a > E2M1_MAX) & (o.abs() > E2M1_MAX)).any()):
            hint = "values beyond 6 saturate to 6 (E2M1 has no infinity): clamp to [-6, 6] first"
        elif not bool(on_grid.all()):
            hint = "round to the NEAREST of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (the grid is not uniform)"
        elif bool(((o == -r) & (r != 0)).any()):
            hint = "the sign is kept: round |y|, then give the result y's sign"
        elif bool(torch.isin(a, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])).any()):
            hint = ("a tie between two neighbours goes to the EVEN code index (0, 1, 2, 4 = 0.0, 1.0, "
                    "2.0, 4.0 win ties; 0.5, 1.5, 3, 6 lose them)")
        else:
            hint = "round to the NEAREST of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (the grid is not uniform)"
        raise AssertionError(f"{len(bad)} of {len(y)} values rounded wrongly: " + "; ".join(lines)
                             + f"\nHint: {hint}.")


def check_swizzle_offset(fn) -> None:
    """Grader: ``fn(r, c, Kp)`` (integer tensors) gives the swizzled byte offset."""
    for Mp, Kp in ((128, 4), (256, 8), (384, 12)):
        r = torch.arange(Mp)[:, None].expand(Mp, Kp)
        c = torch.arange(Kp)[None, :].expand(Mp, Kp)
        got = fn(r, c, Kp)
        ref = torch.empty(Mp * Kp, dtype=torch.int64)
        ref_log = torch.arange(Mp * Kp).view(Mp, Kp)
        # where does logical (r, c) land? scatter the identity through the torch permutation
        sw = ref_log.view(Mp // 128, 4, 32, Kp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
        ref[sw] = torch.arange(Mp * Kp)
        ref = ref.view(Mp, Kp)
        if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
            raise AssertionError(f"return an integer tensor of shape {tuple(ref.shape)} for r, c of that shape")
        bad = (got != ref).nonzero()
        if len(bad):
            desc = [f"(r={a}, c={b}): got {int(got[a, b])}, expected {int(ref[a, b])}" for a, b in bad[:5].tolist()]
            if torch.equal(got % 512, ref % 512):
                hint = ("inside each tile you are right, but the tiles are in the wrong order: tiles are "
                        "stored row-major, tile (r // 128, c // 4) is number (r // 128) * (Kp / 4) + c // 4")
            else:
                hint = ("a 128x4 tile is 512 contiguous bytes; inside, 32 lines of 16 bytes: line r % 32, "
                        "then 4 bytes per 32-row slab (r % 128) // 32, then c % 4")
            raise AssertionError(f"grid [{Mp}, {Kp}]: {len(bad)} of {Mp * Kp} offsets wrong: "
                                 + "; ".join(desc) + f"\nHint: {hint}.")


QUANT_GRADER_SHAPES = ((1, 64), (90, 80), (129, 48))


def quant_with_nan_padding(x: torch.Tensor, global_scale):
    """A WRONG answer to exercise 3, for the notebook and the tests: the right codes and real scales,
    every byte written, but 0xFF (E4M3 NaN) in every padded scale entry."""
    codes, sf = nvfp4_quant(x, global_scale)
    M, n = x.shape[0], x.shape[1] // 16
    grid = unswizzle_scales(sf.view(torch.uint8)).clone()
    grid[M:, :] = 0xFF
    grid[:, n:] = 0xFF
    Mp, Kp = grid.shape
    sw = grid.view(Mp // 128, 4, 32, Kp // 4, 4).permute(0, 3, 2, 1, 4).reshape(Mp, Kp)
    return codes, sw.view(torch.float8_e4m3fn)


def _consumer_effects(codes, sf, rc, rs, gs, K) -> str:
    """What the two consumers make of (codes, sf), against what they make of the reference bytes."""
    w = torch.randn(8, K, generator=torch.Generator().manual_seed(0)).to(codes.device)
    lines = []
    for name, consumer in (("consumer 1, the K-padding reader (nvfp4_gemm_ref)", nvfp4_gemm_ref),
                           ("consumer 2, the small-M row-mixing model (nvfp4_gemm_small_m_model)",
                            nvfp4_gemm_small_m_model)):
        got, ref = consumer(codes, sf, gs, w), consumer(rc, rs, gs, w)
        bad_rows = (~((got == ref) | (got.isnan() & ref.isnan()))).any(1)
        nan_rows = got.isnan().any(1)
        lines.append(f"  {name}: {int(bad_rows.sum())} of {got.shape[0]} real output rows wrong"
                     + (f" ({int(nan_rows.sum())} of them NaN)" if nan_rows.any() else ""))
    return "\n".join(lines)


def check_quant(fn, shapes=QUANT_GRADER_SHAPES) -> None:
    """Grader: ``fn(x, global_scale) -> (codes, scales_swizzled)`` writes every byte of both outputs
    (its ``torch.empty`` allocations poisoned two ways: a byte that differs between the two runs was
    never written), the codes and the real scales equal ``quantize_ref`` exactly, and every PADDED
    scale entry is zero, because some consumers read padded rows and padded columns. Shapes: the
    decode case (M = 1, K/16 = 4: only rows padded), both paddings, and two 128-row tiles."""
    from .coverage import poisoned_allocations

    for dtype, (M, K) in zip((torch.bfloat16, torch.float16, torch.bfloat16), shapes):
        g = torch.Generator().manual_seed(M * 1000 + K)
        x = (torch.randn(M, K, generator=g) * 3).to(dtype).to(DEVICE)
        gs = global_scale_of(x)
        rc, rs = quantize_ref(x, gs, swizzled=True)
        n, (Mp, Kp) = K // 16, rs.shape
        runs = []
        for which in (0, 1):
            with poisoned_allocations(which):
                out = fn(x, gs)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise AssertionError("return a pair (codes, scales)")
            codes, sf = out
            if tuple(sf.shape) != (Mp, Kp):
                raise AssertionError(f"[{M}x{K}] scales must be the swizzled storage {[Mp, Kp]} "
                                     f"(round_up(M, 128), round_up(K/16, 4)), got {list(sf.shape)}: the "
                                     "GEMM reads whole 128x4 tiles")
            if tuple(codes.shape) != (M, K // 2) or codes.dtype != torch.uint8:
                raise AssertionError(f"[{M}x{K}] codes must be uint8 {[M, K // 2]}, got {codes.dtype} "
                                     f"{list(codes.shape)}")
            runs.append((codes.detach().cpu().clone(), _bytes(sf).detach().cpu().clone()))
        (c0, s0), (c1, s1) = runs
        if not torch.equal(c0, c1):
            raise AssertionError(f"[{M}x{K}] {int((c0 != c1).sum())} code bytes differ between two runs "
                                 "with differently poisoned torch.empty: they were never written")
        if not torch.equal(c0, rc.cpu()):
            raise AssertionError(f"[{M}x{K} {dtype}] {int((c0 != rc.cpu()).sum())} code bytes differ from "
                                 "the reference (check the nibble order: element 2i in the LOW nibble; the "
                                 "sign bit 3 of each code; ties to the even index)")
        l0, l1, lr = unswizzle_scales(s0), unswizzle_scales(s1), _bytes(unswizzle_scales(rs)).cpu()
        if not torch.equal(l0[:M, :n], l1[:M, :n]) or not torch.equal(l0[:M, :n], lr[:M, :n]):
            raise AssertionError(f"[{M}x{K}] real scale entries [:{M}, :{n}] differ from the reference "
                                 "(E4M3 round to nearest even of min(gs*amax/6, 448), at the swizzled "
                                 "offset of section 3)")
        pad = torch.ones(Mp, Kp, dtype=torch.bool)
        pad[:M, :n] = False
        unwritten = pad & (l0 != l1)
        if unwritten.any():
            rows = unwritten.any(1).nonzero().flatten()
            cols = unwritten.any(0).nonzero().flatten()
            raise AssertionError(
                f"[{M}x{K}] the real scales are right, but {int(unwritten.sum())} padded entries of the "
                f"[{Mp}, {Kp}] scale storage were never written (rows {int(rows[0])}..{int(rows[-1])}, "
                f"columns {int(cols[0])}..{int(cols[-1])}). With torch.empty they hold whatever was "
                "there before. Consumers read them: the FP4 GEMM reads whole 128x4 tiles, padded "
                "columns multiply zero codes (0 x NaN = NaN), and a small-M path lets padded rows' "
                "scales reach real rows. Write zeros there (let the grid span the padded grid).")
        if (l0[pad] != 0).any():
            vals = sorted({int(v) for v in l0[pad][l0[pad] != 0].unique()[:4]})
            rows = (pad & (l0 != 0)).any(1).nonzero().flatten()
            raise AssertionError(
                f"[{M}x{K}] every byte is written and the real scales are right, but "
                f"{int((l0[pad] != 0).sum())} padded scale entries hold nonzero bytes "
                f"({', '.join(f'0x{v:02X}' for v in vals)}; 0x7F and 0xFF are E4M3 NaN) in rows "
                f"{int(rows[0])}..{int(rows[-1])}. Padded entries must be ZERO: written is not enough. "
                "What the consumers make of these bytes:\n"
                + _consumer_effects(runs[0][0].to(DEVICE), runs[0][1].to(DEVICE).view(torch.float8_e4m3fn),
                                    rc, rs, gs, K))


# --------------------------------------------------------------------------------------------------
# Pictures
# --------------------------------------------------------------------------------------------------

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
    g = _e4m3_grid().numpy()[1:]
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


def _timer_of(rec: dict, row: dict, field: str) -> str:
    """The timer label of a figure: from the row, else from the record's timer table, else unknown."""
    if f"{field}_timer" in row:
        return row[f"{field}_timer"]
    return "timer not recorded"


def plot_benchmark(rec: dict, label: str = ""):
    """Achieved bandwidth of the Triton kernel and the compiled torch reference against the copy
    ceiling, per size; each line says which timer produced it (see ``TIMERS``)."""
    import matplotlib.pyplot as plt

    rows = rec["results"]["sizes"]
    ceiling = rec["ceilings"]["copy_GBps"]
    names = [f"{r['M']}x{r['K']}" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    xs = list(range(len(rows)))
    tri_t = sorted({_timer_of(rec, r, "triton") for r in rows})
    ref_t = sorted({_timer_of(rec, r, "compiled_ref") for r in rows})
    ax.plot(xs, [r["triton_GBps"] / 1e3 for r in rows], "o-",
            label=f"Triton kernel (nvfp4_quant), timer: {', '.join(tri_t)}")
    ax.plot(xs, [r["compiled_ref_GBps"] / 1e3 for r in rows], "s-",
            label=f"torch.compile(quantize_ref), timer: {', '.join(ref_t)}")
    for i, r in enumerate(rows):        # a point timed eagerly (graph capture failed) is marked
        if _timer_of(rec, r, "compiled_ref") != TIMER_GRAPH and "timer not" not in _timer_of(rec, r, "compiled_ref"):
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
    ax.bar(xs, [r["us"] for r in rows], 0.6, color="#2E5EAA", label="nvfp4_quant (GPU time, graph replay)")
    ax.axhline(sm["empty_kernel_us"], color="#D1495B", ls="--", lw=1.2,
               label=f"an empty kernel, same timer: {sm['empty_kernel_us']:.2f} us")
    for i, r in enumerate(rows):
        ax.text(i, r["us"] * 1.02, f"{r['us']:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [f"M={r['M']}\nK={r['K']}" for r in rows], fontsize=7)
    ax.set_ylabel("us per call")
    ax.set_ylim(0, max(r["us"] for r in rows) * 1.25)
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
        z = [r[f"{mode}_zeros_us"] for r in rows]
        e = [r[f"{mode}_empty_us"] for r in rows]
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


# --------------------------------------------------------------------------------------------------
# Benchmark (GPU)
# --------------------------------------------------------------------------------------------------

BENCH_SIZES = [(128, 4096), (512, 4096), (1024, 8192), (3000, 5120), (4096, 8192), (12288, 7168), (16384, 8192)]
ZEROS_EMPTY_SIZES = [(1, 4096), (16, 4096), (128, 8192), (16384, 8192)]
SWEEP_SIZES = [(16384, 8192), (12288, 7168), (3000, 5120), (8192, 4096)]
SWEEP_CONFIGS = TUNE_CONFIGS
# the share of the copy ceiling over (M, K), both input dtypes, with the launch rule's tile
HEATMAP_K = (2048, 4096, 5120, 7168, 8192, 14336)
HEATMAP_M = (1024, 2048, 3000, 4096, 8192, 12288, 16384)
SMALL_M = (1, 16, 128, 512)        # decode sizes: GPU time beside an empty kernel's, both in a graph
SMALL_K = (4096, 8192)
TARGET_FRAC = 0.85                 # issue #11: >= 85% of the copy ceiling ...
TARGET_MIN_INPUT_BYTES = 64 << 20  # ... for every input of 64 MiB or more

# Which timer produced each figure of the record (``results.timers``; rows of "sizes" also carry
# ``triton_timer`` and ``compiled_ref_timer``, since the compiled reference falls back to eager timing
# when its graph cannot be captured).
TIMER_GRAPH = "graph"                    # bench.graph_time_us: per call, replayed from a CUDA graph
TIMER_EAGER = "eager"                    # bench.time_us: triton.testing.do_bench, host work included
TIMER_EAGER_FALLBACK = "eager (graph capture failed)"
TIMERS = {
    "graph": "GPU time per call, replayed from a CUDA graph of 20 calls (bench.graph_time_us); "
             "sizes.triton_us and sizes.compiled_ref_us: median of 5 100-ms windows; heatmap and "
             "config_sweep: one 100-ms window",
    "eager": "per-call time of eager calls (bench.time_us = triton.testing.do_bench, median): host "
             "work (Python, checks, launch) included, which dominates small calls",
    "eager (graph capture failed)": "the compiled reference could not be captured in a CUDA graph: its "
                                    "'compiled_ref_us' is the eager time",
    "fields": {"sizes.triton_us": "graph", "sizes.compiled_ref_us": "see sizes.compiled_ref_timer",
               "sizes.triton_eager_us": "eager", "sizes.compiled_ref_eager_us": "eager",
               "zeros_vs_empty.eager_*_us": "eager", "zeros_vs_empty.graph_*_us": "graph",
               "zeros_vs_empty.memset_alone_us": "eager", "config_sweep.us": "graph",
               "heatmap.us": "graph", "heatmap.copy_same_bytes_us": "graph",
               "small_m.us": "graph", "small_m.empty_kernel_us": "graph"},
}


def _bytes_moved(M: int, K: int) -> int:
    Mp, Kp = padded_scale_shape(M, K)
    return M * K * 2 + M * K // 2 + Mp * Kp


def _compiled_ref():
    import torch._dynamo

    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    return torch.compile(quantize_ref, dynamic=False)


def measure_zeros_vs_empty(sizes=ZEROS_EMPTY_SIZES) -> list[dict]:
    """GPU: a full quant call with the scale buffer from torch.zeros vs torch.empty, per (M, K): eager
    (``bench.time_us``) and replayed from a CUDA graph (``bench.graph_time_us``), plus the zero fill
    alone (eager). Rows as in the record's ``zeros_vs_empty`` (timers: ``TIMERS["fields"]``)."""
    from .bench import graph_time_us, require_gpu, time_us

    require_gpu("nvfp4 zeros vs empty")
    zve = []
    for M, K in sizes:
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        gs = global_scale_of(x)
        Mp, Kp = padded_scale_shape(M, K)
        row = {"M": M, "K": K, "scale_bytes": Mp * Kp}
        for alloc in ("zeros", "empty"):
            row[f"eager_{alloc}_us"] = time_us(lambda: nvfp4_quant(x, gs, alloc=alloc))
            row[f"graph_{alloc}_us"] = graph_time_us(lambda: nvfp4_quant(x, gs, alloc=alloc))
        row["memset_alone_us"] = time_us(lambda: torch.zeros((Mp, Kp), dtype=torch.uint8, device=DEVICE))
        zve.append(row)
        print(f"  zeros vs empty M={M:>5} K={K}: eager {row['eager_zeros_us']:.1f} vs {row['eager_empty_us']:.1f} us, "
              f"graph {row['graph_zeros_us']:.2f} vs {row['graph_empty_us']:.2f} us")
    return zve


def benchmark(sizes=BENCH_SIZES, zeros_sizes=ZEROS_EMPTY_SIZES, sweep_sizes=SWEEP_SIZES,
              heatmap: bool = True) -> tuple[dict, dict]:
    """``python -m workbook bench nvfp4``: bandwidth per size against the copy ceiling and the compiled
    reference (``torch.compile``, static shapes), and zeros vs empty for the scale buffer on a full
    quant call (eager, and replayed from a CUDA graph)."""
    from .bench import copy_ceiling_GBps, graph_time_us, require_gpu, time_us

    require_gpu("nvfp4 benchmark")
    ceiling = copy_ceiling_GBps()
    ref_c = _compiled_ref()
    rows = []
    for M, K in sizes:
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        gs = global_scale_of(x)
        codes, sf = nvfp4_quant(x, gs)
        rc, rs = quantize_ref(x, gs)
        cc, cs = ref_c(x, gs, True)
        exact = torch.equal(codes, rc) and torch.equal(sf.view(torch.uint8), rs.view(torch.uint8))
        comp_mismatch = int((cc != rc).sum()) + int((cs.view(torch.uint8) != rs.view(torch.uint8)).sum())
        # eager do_bench includes host time (Python + launch), which dominates below ~10 us; the GPU
        # figure is the per-call time replayed from a CUDA graph (same kernels, no host in between)
        t_tri_eager = time_us(lambda: nvfp4_quant(x, gs))
        t_ref_eager = time_us(lambda: ref_c(x, gs, True))
        # median of 5 windows: this kernel runs the H200 into its power cap (see graph_time_us)
        t_tri = graph_time_us(lambda: nvfp4_quant(x, gs), windows=5)
        try:
            t_ref, ref_timer = graph_time_us(lambda: ref_c(x, gs, True), windows=5), TIMER_GRAPH
        except Exception:  # a compiled graph that cannot be captured: fall back to eager timing
            t_ref, ref_timer = t_ref_eager, TIMER_EAGER_FALLBACK
        nbytes = _bytes_moved(M, K)
        row = {"M": M, "K": K, "bytes": nbytes, "triton_us": t_tri, "compiled_ref_us": t_ref,
               "triton_timer": TIMER_GRAPH, "compiled_ref_timer": ref_timer,
               "triton_eager_us": t_tri_eager, "compiled_ref_eager_us": t_ref_eager,
               "triton_GBps": nbytes / t_tri / 1e3, "compiled_ref_GBps": nbytes / t_ref / 1e3,
               "triton_frac_of_copy": nbytes / t_tri / 1e3 / ceiling,
               "speedup_vs_compiled": t_ref / t_tri, "exact_vs_ref": exact,
               "compiled_ref_mismatched_bytes": comp_mismatch,
               "config": list(_config(M, K))}
        rows.append(row)
        print(f"  {M:>6}x{K:<5} triton {t_tri:8.1f} us {row['triton_GBps']:7.0f} GB/s "
              f"({100 * row['triton_frac_of_copy']:4.1f}% of copy)  compiled ref {t_ref:8.1f} us  "
              f"x{row['speedup_vs_compiled']:.2f}  exact={exact}")
        del x, codes, sf, rc, rs, cc, cs
        torch.cuda.empty_cache()
    zve = measure_zeros_vs_empty(zeros_sizes)
    sweep = []
    for M, K in sweep_sizes:
        x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
        gs = global_scale_of(x)
        nbytes = _bytes_moved(M, K)
        rc, rs = quantize_ref(x, gs)
        for cfg in SWEEP_CONFIGS:
            c, s = nvfp4_quant(x, gs, config=cfg)
            ok = torch.equal(c, rc) and torch.equal(s.view(torch.uint8), rs.view(torch.uint8))
            t = graph_time_us(lambda: nvfp4_quant(x, gs, config=cfg))
            sweep.append({"M": M, "K": K, "config": list(_as_tile(cfg)), "us": t, "timer": TIMER_GRAPH,
                          "exact_vs_ref": ok, "frac_of_copy": nbytes / t / 1e3 / ceiling,
                          "shipped": _as_tile(cfg) == _config(M, K)})
            print(f"  sweep {M}x{K} (BLOCK_S, warps)={_as_tile(cfg)}: {t:.1f} us "
                  f"{100 * sweep[-1]['frac_of_copy']:.1f}% of copy exact={ok}")
        del x, rc, rs, c, s
        torch.cuda.empty_cache()
    heat = measure_heatmap(ceiling) if heatmap else []
    small = measure_small_m() if heatmap else {}
    big = rows[-1]
    large = [r for r in heat if r["input_bytes"] >= TARGET_MIN_INPUT_BYTES]
    targets = {
        "largest": f"{big['M']}x{big['K']}",
        "frac_of_copy_at_largest": big["triton_frac_of_copy"],
        "reached_80pct_at_largest": big["triton_frac_of_copy"] >= 0.8,
        "faster_than_compiled_everywhere": all(r["speedup_vs_compiled"] > 1 for r in rows),
        "large_inputs": len(large),
        "large_inputs_at_85pct": sum(r["frac_of_copy"] >= TARGET_FRAC for r in large),
        "min_frac_of_copy_large": min((r["frac_of_copy"] for r in large), default=None),
    }
    return ({"sizes": rows, "zeros_vs_empty": zve, "config_sweep": sweep, "heatmap": heat, "small_m": small,
             "targets": targets, "timers": TIMERS}, {"copy_GBps": ceiling})


def measure_heatmap(ceiling: float, ks=HEATMAP_K, ms=HEATMAP_M, quant=None, settle_s: float = 0.0) -> list[dict]:
    """GPU: the shipped launcher (launch rule's tile) on every (M, K), bf16 and fp16, GPU time from
    graph replay, as a share of the copy ceiling; beside it a device copy that moves the same number
    of bytes (read + written), timed the same way: what a copy achieves at that size. ``quant(x, gs)``
    times another launcher of the same bytes instead (workbook.cuda: the CUDA backend); its rows
    carry ``config`` None. ``settle_s`` > 0: the GPU idles that many seconds before each quantizer
    timing, so that every cell starts from a rested card (a kernel that reaches the board's power cap
    lowers the clock for what runs right after it; without a pause a cell also measures the cell
    before it). Each row records its ``settle_s``."""
    import time

    from .bench import graph_time_us

    if not isinstance(settle_s, (int, float)) or not settle_s >= 0:
        raise ValueError(f"settle_s must be a number of seconds >= 0, got {settle_s!r}")

    heat = []
    for K in ks:
        for M in ms:
            nbytes = _bytes_moved(M, K)
            src = torch.empty(nbytes // 4, dtype=torch.int16, device=DEVICE)
            dst = torch.empty_like(src)
            t_copy = graph_time_us(lambda: dst.copy_(src))
            del src, dst
            for dtype in (torch.bfloat16, torch.float16):
                x = torch.randn(M, K, device=DEVICE, dtype=dtype)
                gs = global_scale_of(x)
                (quant or nvfp4_quant)(x, gs)   # compiled, and built on first use, before the pause
                torch.cuda.synchronize()
                if settle_s:
                    time.sleep(settle_s)
                t = graph_time_us(lambda: (quant or nvfp4_quant)(x, gs))
                heat.append({"M": M, "K": K, "dtype": str(dtype).removeprefix("torch."), "input_bytes": M * K * 2,
                             "bytes": nbytes, "us": t, "timer": TIMER_GRAPH, "frac_of_copy": nbytes / t / 1e3 / ceiling,
                             "copy_same_bytes_us": t_copy, "frac_of_same_size_copy": t_copy / t,
                             "config": None if quant else list(_config(M, K)), "settle_s": settle_s})
                print(f"  heatmap {M:>6}x{K:<5} {heat[-1]['dtype']}: {t:7.1f} us "
                      f"{100 * heat[-1]['frac_of_copy']:5.1f}% of copy (a copy of the same bytes: {t_copy:.1f} us)")
                del x
            torch.cuda.empty_cache()
    return heat


def measure_small_m(ms=SMALL_M, ks=SMALL_K) -> dict:
    """GPU: at decode sizes, the quant call's GPU time (graph replay) beside the floor of any launch:
    an empty Triton kernel (one program, no work) timed the same way."""
    from .bench import graph_time_us
    from .kernels.nvfp4 import empty_kernel

    z = torch.empty(1, device=DEVICE)
    floor = graph_time_us(lambda: empty_kernel[(1,)](z))
    rows = []
    for M in ms:
        for K in ks:
            x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
            gs = global_scale_of(x)
            rows.append({"M": M, "K": K, "us": graph_time_us(lambda: nvfp4_quant(x, gs)), "timer": TIMER_GRAPH,
                         "config": list(_config(M, K))})
    return {"empty_kernel_us": floor, "rows": rows}


def instruction_budget(rec: dict, clock_GHz: float = 1.98, bytes_per_element: float = 2.5) -> dict:
    """How many instructions per element a kernel may issue and still keep up with memory: the
    record's copy ceiling (bytes/s) over the bytes per element gives elements/s; the SMs (the record's
    ``meta.sm_count``) x 4 warp schedulers x 32 threads x the clock give thread-instructions/s.
    ``clock_GHz`` defaults to the H200's boost clock (NVIDIA's specification, not a measurement);
    under its power cap the chip runs below it, so the real budget is smaller."""
    elems = rec["ceilings"]["copy_GBps"] * 1e9 / bytes_per_element
    issue = rec["meta"]["sm_count"] * 4 * 32 * clock_GHz * 1e9
    return {"elements_per_s": elems, "thread_instructions_per_s": issue,
            "instructions_per_element": issue / elems, "clock_GHz": clock_GHz}


def sass_counts(config=None) -> dict | None:
    """GPU only: static SASS instruction counts of the fast kernel as the GPU runs it (``EMULATE=False``,
    bf16, swizzled, full tiles, no padding) for one tile ``config`` (default: the launch rule's tile for
    large inputs), divided by the elements each thread handles. The listing holds every path of the
    kernel (the last, masked tile and the padding programs too), so this overstates the instructions
    the main path issues per element by a little. Returns {"config", "instructions", "ffma",
    "elements_per_thread", "per_element", "ffma_per_element"}, or None without a GPU or where the
    SASS cannot be disassembled (Triton's ``asm["sass"]`` needs cuobjdump)."""
    import re

    if not ON_GPU:
        return None
    bs, warps = _as_tile(config) if config is not None else _config(1 << 16, 1 << 13)
    M, K = 128, 16 * bs
    x = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
    gs = global_scale_of(x)
    codes = torch.empty((M, K // 2), dtype=torch.uint8, device=DEVICE)
    sf = torch.empty((M, K // 16), dtype=torch.uint8, device=DEVICE)
    try:
        compiled = nvfp4_quant_kernel[(M,)](
            x.view(torch.int32), gs, codes, sf, M, K, M, K // 16, M, float(np.float32(1.0 / bs)), 0,
            IS_BF16=True, BLOCK_S=bs, SWIZZLED=True, EMULATE=False, LAST_PARTIAL=False,
            ONE_WRAP=True, num_warps=warps)
        sass = compiled.asm["sass"]
    except Exception:   # no cuobjdump, or a Triton without asm["sass"]
        return None
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    ops = [o for o in ops if not o.startswith("NOP")]
    if not ops:   # an empty or differently formatted listing (seen: Triton 3.6 on the H200): no count
        return None
    per_thread = bs * 16 / (32 * warps)
    ffma = sum(o.startswith("FFMA") for o in ops)
    return {"config": [bs, warps], "instructions": len(ops), "ffma": ffma,
            "elements_per_thread": per_thread, "per_element": len(ops) / per_thread,
            "ffma_per_element": ffma / per_thread}
