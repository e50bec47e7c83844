"""NVFP4 quantization: device code only (no allocation, no policy; the launcher is workbook.nvfp4).

One program quantizes a tile of BLOCK_M rows x BLOCK_S blocks of 16 elements. Per 16-element block
it computes the E4M3 block scale, the E2M1 codes of the 16 elements, packs two codes per byte and
stores the scale byte either in the linear layout or at its address in the 128x4 swizzled layout.

The grid spans the *padded* scale grid in the swizzled layout, so the programs that own a padded
128x4 tile also write its padding (zeros). ``WRITE_PADDING=False`` skips those entries: it exists
only to reproduce the regression in the workbook.

No FP8 cast anywhere: the E4M3 byte and its value are computed with exact integer/fp32 arithmetic
(round to nearest, ties to even) and stored as uint8, so the result is the same in Triton's
interpreter (whose cast to float8e4nv mis-rounds) and on a GPU.
"""
import workbook.device  # noqa: F401  (TRITON_INTERPRET=1 before triton on a CPU-only machine)

import triton
import triton.language as tl


@triton.jit
def e4m3_rne(v):
    """E4M3 round to nearest even of fp32 ``v`` in [0, 448] -> (byte as int32, value as fp32)."""
    b_bits = v.to(tl.int32, bitcast=True)
    # normal range (v >= 2^-6): keep 3 of fp32's 23 mantissa bits, ties to even on bit 20
    b_lsb = (b_bits >> 20) & 1
    b_top = (b_bits + 0x7FFFF + b_lsb) >> 20            # fp32 exponent:mantissa3, carry included
    b_byte_n = b_top - (120 << 3)                      # rebias exponent 127 -> 7
    b_val_n = (b_top << 20).to(tl.float32, bitcast=True)
    # subnormal range (v < 2^-6): multiples of 2^-9, the byte is the multiple
    b_t = v * 512.0                                    # exact (power of two)
    b_f = b_t.to(tl.int32)                             # floor, v >= 0
    b_r = b_t - b_f.to(tl.float32)                     # exact fraction
    b_up = (b_r > 0.5) | ((b_r == 0.5) & ((b_f & 1) == 1))
    b_byte_s = b_f + b_up.to(tl.int32)
    b_val_s = b_byte_s.to(tl.float32) * 0.001953125    # * 2^-9, exact
    m_normal = v >= 0.015625
    return tl.where(m_normal, b_byte_n, b_byte_s), tl.where(m_normal, b_val_n, b_val_s)


@triton.jit
def e2m1_index(a):
    """3-bit E2M1 magnitude index of |y| = ``a`` (grid 0, .5, 1, 1.5, 2, 3, 4, 6): nearest, ties to
    even, saturating at 6. Each comparison is a decision point between two neighbours."""
    return ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
            + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
            + (a > 5.0).to(tl.int32))


@triton.jit
def nvfp4_quant_kernel(
    p_x,                         # *fp16|bf16 [M, K] input, row-major, contiguous
    p_gs,                        # *fp32 [1] per-tensor global scale (448*6/amax), read on the device
    p_codes,                     # *uint8 [M, K//2] packed E2M1 codes: element 2i low nibble, 2i+1 high
    p_sf,                        # *uint8 E4M3 scale bytes: swizzled storage [SF_ROWS*SF_COLS] or linear [M, K//16]
    M,                           # rows of x
    K,                           # columns of x, a multiple of 16
    SF_ROWS,                     # scale rows the grid covers: Mp = round_up(M, 128) swizzled, M linear
    SF_COLS,                     # scale columns the grid covers: Kp = round_up(K//16, 4) swizzled, K//16 linear
    BLOCK_M: tl.constexpr,       # rows per program
    BLOCK_S: tl.constexpr,       # 16-element blocks (scale columns) per program
    SWIZZLED: tl.constexpr,      # store scales in the 128x4 swizzled layout (else linear)
    WRITE_PADDING: tl.constexpr,  # write zeros to padded scale entries; False reproduces the regression
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    n_blocks = K // 16
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                    # [BM] rows
    o_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)                    # [BS] scale columns
    m_real = (o_m < M)[:, None] & (o_s < n_blocks)[None, :]          # [BM, BS] real (unpadded) blocks

    # load [BM, BS*16] contiguous along K, view as [BM, BS, 16] blocks
    o_k = pid_s * (BLOCK_S * 16) + tl.arange(0, BLOCK_S * 16)        # [BS*16] element columns
    m_x = (o_m < M)[:, None] & (o_k < K)[None, :]
    p_xt = p_x + o_m[:, None].to(tl.int64) * K + o_k[None, :]
    b_x = tl.load(p_xt, mask=m_x, other=0.0).to(tl.float32)
    b_x = tl.reshape(b_x, (BLOCK_M, BLOCK_S, 16))

    # block scale: sf = e4m3(min(gs * amax / 6, 448))
    b_gs = tl.load(p_gs)
    b_amax = tl.max(tl.abs(b_x), axis=2)                              # [BM, BS]
    b_sf_want = tl.minimum(tl.math.div_rn(b_gs * b_amax, tl.full((BLOCK_M, BLOCK_S), 6.0, tl.float32)), 448.0)
    b_sf_byte, b_sf = e4m3_rne(b_sf_want)

    # codes: y = x * gs / sf (correctly rounded division), E2M1 of |y|, sign bit of x
    m_nz = b_sf > 0.0
    b_den = tl.broadcast_to(tl.where(m_nz, b_sf, 1.0)[:, :, None], (BLOCK_M, BLOCK_S, 16))
    b_y = tl.math.div_rn(b_x * b_gs, b_den)
    b_idx = tl.where(m_nz[:, :, None], e2m1_index(tl.abs(b_y)), 0)
    b_sign = (b_x.to(tl.int32, bitcast=True) >> 28) & 8
    b_code = b_sign | b_idx                                           # [BM, BS, 16]

    # pack pairs: element 2i -> low nibble, 2i+1 -> high nibble
    b_lo, b_hi = tl.split(tl.reshape(b_code, (BLOCK_M, BLOCK_S * 8, 2)))
    b_packed = (b_lo | (b_hi << 4)).to(tl.uint8)                      # [BM, BS*8]
    o_c = pid_s * (BLOCK_S * 8) + tl.arange(0, BLOCK_S * 8)
    m_c = (o_m < M)[:, None] & (o_c < K // 2)[None, :]
    tl.store(p_codes + o_m[:, None].to(tl.int64) * (K // 2) + o_c[None, :], b_packed, mask=m_c)

    # scales
    r = o_m[:, None]
    c = o_s[None, :]
    if SWIZZLED:
        o_sf = (((r // 128) * (SF_COLS // 4) + c // 4) * 512
                + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4))
        if WRITE_PADDING:
            # the grid spans [Mp, Kp]: this program owns every entry of its part of the padded tiles
            m_sf = (r < SF_ROWS) & (c < SF_COLS)
        else:
            m_sf = m_real                                             # the regression: padding skipped
    else:
        o_sf = r * n_blocks + c
        m_sf = m_real
    b_sf_out = tl.where(m_real, b_sf_byte, 0).to(tl.uint8)
    tl.store(p_sf + o_sf.to(tl.int64), b_sf_out, mask=m_sf)
