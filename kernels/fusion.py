"""Fused residual add + RMSNorm: the kernel that the fusion pass of notebook 06 puts after the
tensor-parallel all-reduce. Device code only: the launcher, its allocation policy and the custom ops
live in ``workbook/fusion.py``.

One program normalises ``BLOCK_M`` rows. Per row::

    h   = x + residual            (rounded to the tensor dtype: this is the new residual stream)
    out = weight * h * rsqrt(mean(h^2) + eps)      (fp32 inside)

It returns both: ``residual_out`` (h) feeds the next residual add, ``out`` feeds the next layer.

Mapping: program i takes rows [i*BLOCK_M, (i+1)*BLOCK_M), a whole row in registers (BLOCK_D = next
power of two >= D, masked past D), so the mean is one in-register reduction per row.
Coverage: every program writes all D columns of its rows of ``out`` and ``residual_out`` (masked only
past M and D) and the grid cdiv(M, BLOCK_M) covers all M rows, so the launcher allocates both with
``empty``. Decisions: the new residual is rounded to the tensor dtype before the norm reads it (the
unfused chain's numbers); EMULATE does the bf16 conversions with integer ops (Triton's interpreter
gets the hardware casts wrong, e.g. it loses bf16 subnormals).
"""
import workbook.device  # noqa: F401  (TRITON_INTERPRET before triton on CPU-only machines)

import triton
import triton.language as tl

from .common import bf16_to_fp32, round_to_bf16


@triton.jit
def _load_f32(p, mask, IS_BF16: tl.constexpr, EMULATE: tl.constexpr):
    """Load a block and widen it to fp32 (bf16 through the exact bit placement under EMULATE: the
    interpreter's own cast loses bf16 subnormals)."""
    b = tl.load(p, mask=mask, other=0.0)
    if IS_BF16 and EMULATE:
        return bf16_to_fp32(b)
    else:
        return b.to(tl.float32)


@triton.jit
def _round(b, IS_BF16: tl.constexpr, EMULATE: tl.constexpr):
    """fp32 -> the fp32 value of the output dtype's nearest number (exact RNE for bf16; fp16 and
    fp32 are rounded by the store's own cast)."""
    if IS_BF16:
        return round_to_bf16(b, EMULATE)
    else:
        return b


@triton.jit
def add_rmsnorm_kernel(
    x,                          # [M, D] what is added to the residual stream (the all-reduced output)
    residual,                   # [M, D] residual stream before the add
    weight,                     # [D] RMSNorm weight
    out,                        # [M, D] normalised output (every element written)
    residual_out,               # [M, D] new residual stream x + residual (every element written)
    M,                          # rows
    D,                          # hidden size (any; masked up to BLOCK_D)
    eps,                        # RMSNorm epsilon (fp32)
    BLOCK_M: tl.constexpr,      # rows per program
    BLOCK_D: tl.constexpr,      # next power of two >= D: a whole row in registers
    IS_BF16: tl.constexpr,      # tensors are bf16 (round the residual with round_to_bf16)
    EMULATE: tl.constexpr,      # exact bf16 conversions with integer ops (the interpreter)
):
    pid = tl.program_id(0)
    o_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    m_m = o_m < M
    m_d = o_d < D
    m = m_m[:, None] & m_d[None, :]
    o = o_m[:, None].to(tl.int64) * D + o_d[None, :]
    b_x = _load_f32(x + o, m, IS_BF16, EMULATE)
    b_r = _load_f32(residual + o, m, IS_BF16, EMULATE)
    # the new residual in the tensor dtype; the norm reads the rounded value, as the unfused chain does
    b_h = _round(b_x + b_r, IS_BF16, EMULATE)
    tl.store(residual_out + o, b_h.to(residual_out.dtype.element_ty), mask=m)
    b_var = tl.sum(b_h * b_h, axis=1) / D            # masked columns hold 0 and add nothing
    b_y = b_h * tl.rsqrt(b_var + eps)[:, None]
    b_w = _load_f32(weight + o_d, m_d, IS_BF16, EMULATE)
    b_y = _round(b_y * b_w[None, :], IS_BF16, EMULATE)
    tl.store(out + o, b_y.to(out.dtype.element_ty), mask=m)
