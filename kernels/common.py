"""Device helpers shared by more than one topic: exact E4M3 rounding, bf16/fp16 unpacking, bf16
rounding, and the exact division by 6 of the NVFP4 block scale.

Each exists once, here, with one exhaustive test (tests/test_common.py). They are the ``EMULATE``
path of the kernels: on the GPU the kernels use the hardware conversions (``cvt.rn.satfinite.e4m3x2
.f32``, ``cvt.rn.bf16.f32``); Triton's interpreter gets those casts wrong (SPECS.md section 2: its
fp32 -> float8e4nv cast rounds ties away from zero with a misplaced carry, its fp32 -> bf16 cast
truncates, and bf16 subnormals are lost on the way up), so the emulation does the same roundings
with integer and exact fp32 operations on the bits. Both paths give the same bytes; tests run both on
a GPU.
"""
import workbook.device  # noqa: F401  (TRITON_INTERPRET=1 before triton on a CPU-only machine)

import triton
import triton.language as tl


@triton.jit
def e4m3_rne(v):
    """E4M3 (float8_e4m3fn) round to nearest, ties to even, of fp32 ``v`` with |v| <= 448 (clamp
    first: E4M3 has no infinity) -> (the byte as int32 in [0, 255], the rounded value as fp32).

    The sign is copied, so -0.0 and negatives that round to zero give 0x80, as torch's cast does.
    Normal range (|v| >= 2^-6): keep 3 of fp32's 23 mantissa bits with a tie-to-even carry on the
    integer bits (a carry moves into the exponent on its own), then rebias 127 -> 7. Subnormal range
    (multiples of 2^-9): adding 2^14, whose ulp is 2^-9, rounds |v| to that grid, ties to even, in
    one IEEE add, and the low bits of the sum count the multiples (8 lands on 2^-6, the first normal
    byte)."""
    b_bits = v.to(tl.int32, bitcast=True)
    b_abs = b_bits & 0x7FFFFFFF
    b_top = (b_abs + 0x7FFFF + ((b_abs >> 20) & 1)) >> 20   # fp32 exponent:mantissa3, carry included
    b_byte_n = b_top - (120 << 3)                          # rebias the exponent 127 -> 7
    b_val_n = (b_top << 20).to(tl.float32, bitcast=True)
    b_q = b_abs.to(tl.float32, bitcast=True) + 16384.0
    b_byte_s = b_q.to(tl.int32, bitcast=True) - 0x46800000    # minus the bits of 16384.0
    b_val_s = b_q - 16384.0                                # exact
    m_normal = b_abs >= 0x3C800000                         # 2^-6
    m_neg = b_bits < 0
    b_byte = tl.where(m_normal, b_byte_n, b_byte_s) | tl.where(m_neg, 0x80, 0)
    b_val = tl.where(m_normal, b_val_n, b_val_s)
    return b_byte, tl.where(m_neg, -b_val, b_val)


@triton.jit
def bf16_to_fp32(b):
    """bf16 -> fp32 by placing the 16 bits on top: exact, subnormals included (the interpreter's own
    cast loses bf16 subnormals)."""
    return (b.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def unpack_pairs(w, IS_BF16: tl.constexpr):
    """The two fp16|bf16 halves of int32 words as fp32: (element 2i from the low half, 2i+1 from the
    high half). Exact, subnormals included. Loading pairs as one int32 word halves the number of load
    instructions of a 16-bit input."""
    if IS_BF16:
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    else:
        lo = (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def round_to_bf16(x, EMULATE: tl.constexpr):
    """fp32 -> the fp32 value of the nearest bf16 (round to nearest, ties to even; finite x)."""
    if EMULATE:
        b_bits = x.to(tl.uint32, bitcast=True)
        b_bits = (b_bits + 0x7FFF + ((b_bits >> 16) & 1)) & 0xFFFF0000
        return b_bits.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16).to(tl.float32)  # cvt.rn.bf16.f32: exact RNE on the GPU


@triton.jit
def div6_rn(y):
    """y / 6 correctly rounded (fp32, y >= 0, normal quotient) in three FP32 operations: q1 = y * r
    with r = RN(1/6), the remainder y - 6 q1 (exact in one FMA), and one correction step
    q1 + rem * r (Markstein). Checked against IEEE division for every fp32 mantissa
    (tests/test_common.py). Quotients below 2^-126 may differ in their last bit; they round to the
    E4M3 scale 0 either way. It replaces ``div_rn``'s checked sequence, which carries a slow-path
    call, once per NVFP4 block."""
    q1 = y * 0.16666667163372039795
    return tl.math.fma(tl.math.fma(q1, -6.0, y), 0.16666667163372039795, q1)
