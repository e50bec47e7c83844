"""Fused SiLU-mul + FP8 (E4M3) per-token-group quantization with packed UE8M0 scales.

Device code only: the launchers, the allocation policy and the input checks live in
``workbook/fp8.py``.

Layout and mapping: ``silu_mul_quant_fp8_kernel`` runs on a grid (ceil(M / BLOCK_M), P = ceil(N / 512)).
Program (i, p) owns rows [i*BLOCK_M, +BLOCK_M) and groups 4p..4p+3 (columns [512p, 512p+512), masked at
M and N): exactly the four exponent bytes of packed word p, assembled in registers. It stores its tile
of codes (E4M3 bytes, row-major [M, N]) and, per row m < M, word p whole at ``scales + p * stride_sp + m``
(the MN-major storage int32 [P, round_up(M, 4)]; bytes of groups >= G are 0). Coverage: the programs
tile the codes exactly and write every element of the view ``storage.T[:M, :]``; storage rows
M..round_up(M, 4)-1 are no element of it and are never written (the launcher says why that is safe).

Rounding, and where it happens (``EMULATE`` is the house's one compile-time switch, see
``kernels/__init__.py``):

* On the GPU (``EMULATE=False``) the hardware conversions are exact: fp32 -> bf16 is
  ``cvt.rn.bf16.f32`` and fp32 -> float8e4nv is ``cvt.rn.satfinite.e4m3x2.f32`` (round to nearest
  even, saturating).
* Triton's interpreter gets both casts wrong: it truncates fp32 -> bf16 (and loses bf16
  subnormals on the way up), and rounds fp32 -> float8e4nv half-up with a mantissa carry that
  lands in the wrong bit (-124.5 -> -64). With ``EMULATE`` set, ``round_to_bf16`` and ``e4m3_rne``
  (``kernels/common.py``) do the same roundings with integer and exact fp32 operations instead.

Both paths give bytes identical to torch's; the tests check each where it runs, and on a GPU run
both and demand identical bytes. Running the emulation on the GPU is correct but slower: the
benchmark times it (``fused_integer_roundings`` in ``workbook/data/fp8.json``; notebook 03,
section 10, prints the recorded fractions of the copy ceiling).

SiLU is computed as torch computes it, gate / (1 + exp(-gate)) in fp32, then rounded to bf16.
``SILU_IMPL`` picks the exp and the division: bit 1 set = ``tl.exp`` (ex2.approx on the GPU) instead
of libdevice's expf (CUDA's accurate expf, the one torch calls); bit 0 set = Triton's default
division instead of the IEEE ``div_rn``. Only the bf16 rounding of silu matters and a bf16 gate has
65536 values, so the launcher proves a cheaper variant exact by trying every gate (see
``workbook.fp8.silu_impl``).
"""
import workbook.device  # noqa: F401  (sets TRITON_INTERPRET=1 on a CPU-only machine before triton loads)

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .common import bf16_to_fp32, e4m3_rne, round_to_bf16


@triton.jit
def _round_pairs_to_bf16(x):
    """GPU only: fp32 -> the fp32 value of the nearest bf16 (RNE), two elements per conversion
    (``cvt.rn.bf16x2.f32`` is one instruction on the integer pipe, where two scalar conversions would
    be two on the slow conversion pipe that the exp and reciprocal of silu already load). Same
    result as ``round_to_bf16(x, EMULATE=False)``."""
    b = tl.inline_asm_elementwise(
        """{
        .reg .b32 t;
        cvt.rn.bf16x2.f32 t, $3, $2;
        shl.b32 $0, t, 16;
        and.b32 $1, t, 0xFFFF0000;
        }""",
        "=r,=r,r,r", [x.to(tl.int32, bitcast=True)], dtype=tl.int32, is_pure=True, pack=2)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _silu_mul_bf16(b_gate, b_up, SILU_IMPL: tl.constexpr, EMULATE: tl.constexpr):
    """y = bf16(bf16(silu(gate)) * up) for fp32 blocks holding bf16 values, rounded like the
    unfused torch path: silu in fp32 as gate / (1 + exp(-gate)), back to bf16, multiply, to bf16."""
    if SILU_IMPL & 2:
        b_exp = tl.exp(-b_gate)  # ex2.approx on the GPU; numpy's exp in the interpreter
    else:
        b_exp = libdevice.exp(-b_gate)  # CUDA's accurate expf, the one torch's silu kernel calls
    if SILU_IMPL & 1:
        b_silu = b_gate / (1.0 + b_exp)  # Triton's default (approximate on the GPU)
    else:
        b_silu = tl.math.div_rn(b_gate, 1.0 + b_exp)  # IEEE division, as torch's kernel divides
    if EMULATE:
        b_silu = round_to_bf16(b_silu, EMULATE)
        # bf16 * bf16 has at most 16 significant bits: exact in fp32, then one rounding to bf16
        return round_to_bf16(b_silu * b_up, EMULATE)
    else:
        return _round_pairs_to_bf16(_round_pairs_to_bf16(b_silu) * b_up)


@triton.jit
def silu_mul_quant_fp8_kernel(
    x,  # input: [M, 2N] bf16 (gate | up) when SILU_MUL, else y [M, N] bf16
    codes,  # output codes [M, N] E4M3, passed as uint8 (the kernel computes the bytes itself)
    scales,  # output scale storage int32 [ceil(G/4), tma_M]: word p of row m at p * stride_sp + m
    M,  # rows (tokens)
    N,  # output columns (N % GROUP == 0)
    stride_xm,  # elements between rows of the input
    stride_cm,  # elements between rows of the codes
    stride_sp,  # int32 words between consecutive packed words of one row (= tma_M)
    GROUP: tl.constexpr,  # elements sharing one UE8M0 scale (128)
    BLOCK_M: tl.constexpr,  # rows per program (power of two)
    SILU_MUL: tl.constexpr,  # True: y = silu(gate) * up fused here; False: the input is y
    SILU_IMPL: tl.constexpr,  # exp/division variant of silu (module docstring), proven exact
    EMULATE: tl.constexpr,  # exact integer roundings instead of the casts the interpreter gets wrong
):
    # Program (pid_m, pid_p) owns rows [pid_m*BLOCK_M, +BLOCK_M) and groups 4*pid_p .. 4*pid_p+3:
    # exactly the 4 exponent bytes of packed word pid_p, so each word is written whole, once.
    pid_m = tl.program_id(0)
    pid_p = tl.program_id(1)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_j = tl.arange(0, 4)  # byte j of the word = group 4*pid_p + j
    o_k = tl.arange(0, GROUP)
    o_g = pid_p * 4 + o_j
    m_m = o_m < M
    m_g = o_g * GROUP < N  # the last word may hold fewer than 4 groups
    o_n = o_g[None, :, None] * GROUP + o_k[None, None, :]  # [1, 4, GROUP] output column
    m_x = m_m[:, None, None] & m_g[None, :, None]
    o_row = o_m.to(tl.int64)[:, None, None]

    p_in = x + o_row * stride_xm + o_n
    if SILU_MUL:
        b_gate = bf16_to_fp32(tl.load(p_in, mask=m_x, other=0.0))
        b_up = bf16_to_fp32(tl.load(p_in + N, mask=m_x, other=0.0))
        b_y = _silu_mul_bf16(b_gate, b_up, SILU_IMPL, EMULATE)
    else:
        b_y = bf16_to_fp32(tl.load(p_in, mask=m_x, other=0.0))

    # UE8M0 exponent e = ceil(log2(max(amax / 448, 1e-10))) without a division or a log:
    # amax = f * 2^E with f in [1, 2); amax / 448 = (f / 1.75) * 2^(E - 8), and f / 1.75 lies in
    # (0.57, 1] when f <= 1.75 (mantissa bits <= 0x600000), in (1, 1.15) otherwise.
    # The 1e-10 floor is e >= -33 (2^-34 < 1e-10 <= 2^-33); amax = 0 also lands there (byte 0x5E).
    b_amax = tl.max(tl.abs(b_y), axis=2)  # [BLOCK_M, 4]
    b_abits = b_amax.to(tl.int32, bitcast=True)
    b_e = ((b_abits >> 23) & 0xFF) - 135 + ((b_abits & 0x7FFFFF) > 0x600000).to(tl.int32)
    b_e = tl.maximum(b_e, -33)
    b_inv = ((127 - b_e) << 23).to(tl.float32, bitcast=True)  # 2^-e, built from its bits
    # y / 2^e is exact, and |y / 2^e| <= 448 by the choice of e (2^e >= amax / 448) for finite y. A y
    # of +-inf (silu(gate) * up beyond bf16's range) gives amax's bits of inf, e = 120 (the exponent of
    # the largest finite fp32 value / 448), and y / 2^e = +-inf, which saturates to +-448 like the FP8
    # cast of the GPU (satfinite); the emulation clamps to match. (The reference defines the same.)
    b_v = b_y * b_inv[:, :, None]
    if EMULATE:
        b_code, _ = e4m3_rne(tl.minimum(tl.maximum(b_v, -448.0), 448.0))  # (byte with the sign bit, value)
        b_q = b_code.to(tl.uint8)
    else:
        b_q = b_v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)  # cvt.rn.satfinite.e4m3x2.f32
    tl.store(codes + o_m.to(tl.int64)[:, None, None] * stride_cm + o_n, b_q, mask=m_x)

    # little-endian packing: group 4p+j -> bits 8j..8j+7; bytes of groups >= G are zero
    b_byte = tl.where(m_g[None, :], b_e + 127, 0)
    b_word = tl.sum(b_byte << (8 * o_j)[None, :], axis=1)  # disjoint bit fields: sum == or
    tl.store(scales + pid_p * stride_sp + o_m, b_word, mask=m_m)


@triton.jit
def e4m3_round_kernel(
    v,  # input fp32 values (clamped to +-448 here)
    q,  # output E4M3 bytes (uint8)
    n,  # number of values
    BLOCK: tl.constexpr,  # values per program
):
    """The EMULATE path's E4M3 rounding (``common.e4m3_rne``) alone, on any device (the notebook
    compares it with the interpreter's own cast)."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    b_v = tl.load(v + o, mask=m, other=0.0)
    b_v = tl.minimum(tl.maximum(b_v, -448.0), 448.0)
    b_byte, _ = e4m3_rne(b_v)
    tl.store(q + o, b_byte.to(tl.uint8), mask=m)


@triton.jit
def e4m3_cast_kernel(
    v,  # input fp32 values
    q,  # output float8_e4m3fn tensor
    n,  # number of values
    BLOCK: tl.constexpr,  # values per program
):
    """A plain ``.to(tl.float8e4nv)`` cast: right on the GPU, wrong in the interpreter."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    b_v = tl.load(v + o, mask=m, other=0.0)
    tl.store(q + o, b_v.to(tl.float8e4nv), mask=m)


@triton.jit
def silu_mul_bf16_kernel(
    gate,  # gate values, bf16
    up,  # up values, bf16
    y,  # output y = silu(gate) * up, bf16
    n,  # number of values
    BLOCK: tl.constexpr,  # values per program
    SILU_IMPL: tl.constexpr,  # exp/division variant of silu (module docstring)
    EMULATE: tl.constexpr,  # exact integer roundings instead of the casts the interpreter gets wrong
):
    """The kernel's SiLU-mul alone (for the exhaustive bf16 proof and test)."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    b_g = bf16_to_fp32(tl.load(gate + o, mask=m, other=0.0))
    b_u = bf16_to_fp32(tl.load(up + o, mask=m, other=0.0))
    b_y = _silu_mul_bf16(b_g, b_u, SILU_IMPL, EMULATE)
    # b_y holds a bf16 value in fp32: its top 16 bits are the bf16 (no cast, so no rounding)
    b_bits = (b_y.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
    tl.store(y + o, b_bits.to(tl.bfloat16, bitcast=True), mask=m)


@triton.jit
def ue8m0_pack_kernel(
    exp_bytes,  # input exponent bytes uint8 [M, G], row-major
    storage,  # output int32 [ceil(G/4), tma_M]: word p of token m at p * stride_sp + m
    M,  # tokens
    G,  # groups per token
    stride_em,  # elements between rows of exp_bytes
    stride_sp,  # int32 words between consecutive packed words of one token (= tma_M)
    BLOCK_M: tl.constexpr,  # tokens per program
):
    """Exercise 3's plain solution: pack exponent bytes into the MN-major TMA-aligned layout.

    Program (i, p) builds word p of tokens [i*BLOCK_M, +BLOCK_M): it loads their bytes of groups
    4p..4p+3 (groups past G load as 0), shifts byte j to bits 8j..8j+7, adds the four (the bit
    fields do not overlap, so the sum is an OR), and stores one int32 per token at p * tma_M + m.
    Tokens m >= M are masked off: the storage rows M..tma_M-1 stay as allocated."""
    pid_m = tl.program_id(0)
    pid_p = tl.program_id(1)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # tokens of this program
    o_j = tl.arange(0, 4)  # byte j of the word = group 4p + j
    m_m = o_m < M
    m_g = pid_p * 4 + o_j < G
    p_e = exp_bytes + o_m[:, None] * stride_em + pid_p * 4 + o_j[None, :]
    b_e = tl.load(p_e, mask=m_m[:, None] & m_g[None, :], other=0).to(tl.int32)  # [BLOCK_M, 4]
    b_word = tl.sum(b_e << (8 * o_j)[None, :], axis=1)  # [BLOCK_M]
    tl.store(storage + pid_p * stride_sp + o_m, b_word, mask=m_m)
