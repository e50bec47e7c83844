"""TurboQuant KV cache (the ``4bit_nc`` preset): the store kernel and the attention kernels.

Device code only: the launchers, the allocation policy, the batch plan and the input checks live in
``workbook/turboquant.py``.

The paged cache (one page = ``BLOCK_SIZE`` tokens; a request's block table lists its pages)::

    k_codes  uint8   [num_blocks, HKV, BLOCK_SIZE, D/2]  4-bit Lloyd-Max codes of the rotated unit key
    k_scale  float16 [num_blocks, HKV, BLOCK_SIZE]       ||k|| / ||c||  (norm correction folded in)
    v_codes  uint8   [num_blocks, HKV, BLOCK_SIZE, D/2]  4-bit uniform codes of the value
    v_scale  float16 [num_blocks, HKV, BLOCK_SIZE]       (max - min) / 15
    v_zero   float16 [num_blocks, HKV, BLOCK_SIZE]       min

Byte ``j`` of a row holds coordinate ``2j`` in its low nibble and ``2j + 1`` in its high nibble (so
32-bit word ``j`` holds coordinates ``8j .. 8j + 7``, nibble ``k`` = coordinate ``8j + k``). Key codes
are sign-magnitude: bit 3 is the sign, bits 0-2 the rank of the magnitude, and the cache's centroid
table is in that order (``c[m]`` ascending magnitudes, ``c[8 + m] = -c[m]``; the Lloyd-Max table is
symmetric, so this is a relabelling of the sorted codes, ``workbook.turboquant.sign_magnitude``).

Keys: ``k ~= k_scale * (c[codes] @ H)`` with ``H`` the orthonormal (symmetric) Hadamard matrix. The
attention kernels never rotate a key back: ``<q, c H> = <q H, c>``, so the launcher rotates each
query once and the kernels dot it with the centroids directly. Values:
``v ~= v_scale * codes + v_zero``, so ``sum_n p_n v_n = sum_n (p_n v_scale_n) (codes_n - 8) +
sum_n p_n (v_zero_n + 8 v_scale_n)``: the centred codes go into the matrix multiply (small integers are
exact in fp16; centred, the products' rounding scales with the output, not with an offset), the rest
is a running fp32 sum per query row.

Matrix-multiply operands are fp16 on the GPU (tensor cores, fp32 accumulate). ``EMULATE`` (the
house's one switch, ``kernels/__init__.py``): Triton's interpreter returns garbage from ``tl.dot``
on fp16/bf16 operands (SPECS.md section 2, seen with Triton 3.9), so there the same fp16-rounded
operands are upcast to fp32 and multiplied exactly (``input_precision="ieee"``). Heuristics turn
``EMULATE`` into ``OP`` (operand dtype) and ``PREC`` (dot precision).

Designed for the H200 (132 SMs, HBM3e), where decode is a stream over the cache: the launcher
splits each context so that about ``WAVES`` x 132 programs run (``CONFIG["decode"]``); the G query
heads of one KV head share a program, so each cache byte is read once per KV head. The decode kernel
reads each token's codes as 16 words of 32 bits (64 contiguous bytes; the next tile's loads go out
before the current tile's math) and unpacks every word into 8 fp16 values in registers: keys with
``prmt.b32`` byte permutes that look up 4 magnitudes at once in an fp16 table held in 4 registers,
the sign bits placed by one more permute and OR-ed in (``_KEY_ASM``); values with a mask, the 0x6400 /
0x5400 exponents and one packed fp16 subtraction (``_VALUE_ASM``); no per-element conversion or memory
gather. Tokens are the rows of both matrix multiplies (``tq_decode_kernel``), so each tile is unpacked
once as a whole [BLOCK_N, D] operand (``words_to_tile``). The prefill kernel's cached-prefix loop
(``_attend_cache``) still reads bytes and looks each centroid up (``LOOKUP`` 0: fp16 table load, 1:
select tree).

Helpers are few in the hot loops: every call of a ``@triton.jit`` helper costs the interpreter
milliseconds, and the notebooks and tests run there.

Softmax in base 2: the launcher folds ``sm_scale * log2(e)`` into the queries, the kernels use
``exp2``; a split's log-sum-exp is stored in base 2 too.
"""
import workbook.device  # noqa: F401  (sets TRITON_INTERPRET=1 on a CPU-only machine before triton loads)

import triton
import triton.language as tl

from .common import round_to_bf16


@triton.jit
def lookup_centroids(b_code, centroids, LOOKUP: tl.constexpr):
    """Centroid values (the table's dtype, fp16 in the attention kernels) of 4-bit codes (int32 in [0, 15]).

    ``LOOKUP == 0``: a load from the 16-entry table (32 bytes, one L1 line: every lane of a
    warp hits the same line, so the gather costs one wavefront). ``LOOKUP == 1``: no memory access;
    the codes are sign-magnitude (c[8 + m] = -c[m]), so three bits pick one of the 8 magnitudes through
    a tree of 7 selects and the top bit gives the sign."""
    if LOOKUP == 0:
        return tl.load(centroids + b_code)
    m_neg = b_code >= 8
    b_k = b_code & 7                                   # magnitude index: c[k] = |value|
    c0 = tl.load(centroids + 0)
    c1 = tl.load(centroids + 1)
    c2 = tl.load(centroids + 2)
    c3 = tl.load(centroids + 3)
    c4 = tl.load(centroids + 4)
    c5 = tl.load(centroids + 5)
    c6 = tl.load(centroids + 6)
    c7 = tl.load(centroids + 7)
    m_b0 = (b_k & 1) != 0
    m_b1 = (b_k & 2) != 0
    m_b2 = (b_k & 4) != 0
    b_lo = tl.where(m_b1, tl.where(m_b0, c3, c2), tl.where(m_b0, c1, c0))
    b_hi = tl.where(m_b1, tl.where(m_b0, c7, c6), tl.where(m_b0, c5, c4))
    b_mag = tl.where(m_b2, b_hi, b_lo)
    return tl.where(m_neg, -b_mag, b_mag)


@triton.jit
def centred_nibble(b_code):
    """Integer codes 0..15 (int32) -> code - 8 in fp16 without a conversion instruction (those run at a
    quarter of the ALU rate on Hopper): the fp16 bits 0x6400 | code are 1024 + code, exactly, and
    subtracting 1032 leaves code - 8, exactly."""
    b_bits = (b_code | 0x6400).to(tl.int16)
    return b_bits.to(tl.float16, bitcast=True) - tl.full([1, 1], 1032.0, tl.float16)


# PTX for the decode kernel's GPU path (EMULATE=False). One 32-bit word holds 8 codes: nibble k =
# coordinate 8j + k. Outputs $0..$7 are the fp16 values of nibbles 0..7; each 32-bit result register
# holds the pair (k, k + 4) (bits 4k.. and 4k + 16..), so no repacking is needed.
# Values, centred: code - 8 in [-8, 7]. A nibble OR-ed under the fp16 exponent of 1024 (0x6400: unit
# 1 in the mantissa's low bits) is 1024 + code; under the exponent of 64 (0x5400: unit 1/16, so a
# nibble at bits 4-7 counts 1 each) it is 64 + code. So nibbles 0 and 1 need no shift, one shift by 8
# serves nibbles 2 and 3, one lop3 per pair does the mask and the OR ((a & b) | c: 0xEA), and one packed
# subtraction of 1032 (0x6408) or 72 (0x5480) leaves code - 8, exactly: 9 instructions per 8 codes (a
# shift, 4 lop3, 4 sub.f16x2; the constants stay in registers across the loop).
_VALUE_ASM = tl.constexpr("""{
.reg .b32 w, p, e, f, a, b;
mov.b32 e, 0x64006400;  mov.b32 f, 0x54005400;  mov.b32 a, 0x64086408;  mov.b32 b, 0x54805480;
lop3.b32 p, $8, 0x000F000F, e, 0xEA;  sub.f16x2 p, p, a;  mov.b32 {$0, $4}, p;
lop3.b32 p, $8, 0x00F000F0, f, 0xEA;  sub.f16x2 p, p, b;  mov.b32 {$1, $5}, p;
shr.b32 w, $8, 8;
lop3.b32 p, w, 0x000F000F, e, 0xEA;   sub.f16x2 p, p, a;  mov.b32 {$2, $6}, p;
lop3.b32 p, w, 0x00F000F0, f, 0xEA;   sub.f16x2 p, p, b;  mov.b32 {$3, $7}, p;
}""")
# Keys: nibble = sign (bit 3) | magnitude index m (bits 0-2). prmt.b32 picks 4 bytes at once from an
# 8-byte table by 4 selector nibbles (their bit 3, the sign, cleared first: it would switch prmt's mode):
# $9:$10 hold the low bytes of the 8 fp16 magnitudes, $11:$12 the high bytes; l0/h0 are the bytes of
# nibbles 0-3, l1/h1 of nibbles 4-7. Signs: one more prmt of the word and the word shifted by 4 puts the
# sign of nibble k on bit 7 of byte k ([w<<4].b0, w.b0, [w<<4].b1, w.b1 for nibbles 0-3), and one lop3
# ORs those into the high bytes. A last prmt per pair interleaves low and high bytes into the fp16 pair
# (k, k + 1): 15 instructions per 8 codes (and, 2 shifts, 10 prmt, 2 lop3).
_KEY_ASM = tl.constexpr("""{
.reg .b32 s, t, l0, h0, l1, h1, v, g, p;
and.b32 s, $8, 0x77777777;  shr.b32 t, s, 16;  shl.b32 v, $8, 4;
prmt.b32 l0, $9, $10, s;  prmt.b32 h0, $11, $12, s;  prmt.b32 l1, $9, $10, t;  prmt.b32 h1, $11, $12, t;
prmt.b32 g, v, $8, 0x5140;  and.b32 g, g, 0x80808080;  or.b32 h0, h0, g;
prmt.b32 g, v, $8, 0x7362;  and.b32 g, g, 0x80808080;  or.b32 h1, h1, g;
prmt.b32 p, l0, h0, 0x5140;  mov.b32 {$0, $1}, p;
prmt.b32 p, l0, h0, 0x7362;  mov.b32 {$2, $3}, p;
prmt.b32 p, l1, h1, 0x5140;  mov.b32 {$4, $5}, p;
prmt.b32 p, l1, h1, 0x7362;  mov.b32 {$6, $7}, p;
}""")
# An opaque copy (no instruction survives ptxas): keeps Triton from folding "acc * alpha + dot(a, b)"
# into one dot that accumulates straight into acc (see tq_decode_kernel on why).
_COPY_ASM = tl.constexpr("mov.b32 $0, $1;")


@triton.jit
def unpack_values(b_w, OP: tl.constexpr, EMULATE: tl.constexpr):
    """8 code words -> the CENTRED codes (code - 8, in [-8, 7]) of nibbles 0..7 as fp16 (8 tensors shaped
    like ``b_w``). GPU: 9 instructions per word, no conversion (``_VALUE_ASM``); EMULATE: integer ops."""
    if EMULATE:
        v0 = ((b_w & 15) - 8).to(OP)
        v1 = (((b_w >> 4) & 15) - 8).to(OP)
        v2 = (((b_w >> 8) & 15) - 8).to(OP)
        v3 = (((b_w >> 12) & 15) - 8).to(OP)
        v4 = (((b_w >> 16) & 15) - 8).to(OP)
        v5 = (((b_w >> 20) & 15) - 8).to(OP)
        v6 = (((b_w >> 24) & 15) - 8).to(OP)
        v7 = (((b_w >> 28) & 15) - 8).to(OP)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _VALUE_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r", [b_w], dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def unpack_keys(b_w, centroids, tl0, tl1, th0, th1, OP: tl.constexpr, EMULATE: tl.constexpr):
    """8 code words -> the fp16 centroids of nibbles 0..7 (8 tensors shaped like ``b_w``). GPU: byte
    permutes from the table held in 4 registers (``_KEY_ASM``); EMULATE: loads from the fp16 table."""
    if EMULATE:
        v0 = tl.load(centroids + (b_w & 15)).to(OP)
        v1 = tl.load(centroids + ((b_w >> 4) & 15)).to(OP)
        v2 = tl.load(centroids + ((b_w >> 8) & 15)).to(OP)
        v3 = tl.load(centroids + ((b_w >> 12) & 15)).to(OP)
        v4 = tl.load(centroids + ((b_w >> 16) & 15)).to(OP)
        v5 = tl.load(centroids + ((b_w >> 20) & 15)).to(OP)
        v6 = tl.load(centroids + ((b_w >> 24) & 15)).to(OP)
        v7 = tl.load(centroids + ((b_w >> 28) & 15)).to(OP)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _KEY_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r", [b_w, tl0, tl1, th0, th1],
            dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def words_to_tile(x0, x1, x2, x3, x4, x5, x6, x7, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """8 tensors [BLOCK_N, D / 8] (x_i from word j of a row) -> one [BLOCK_N, D] operand tile, each
    word's 8 values side by side in one thread. The joins nest so that tile column 8 j + p holds
    x_bitrev3(p) (bitrev3: 0 1 2 3 4 5 6 7 -> 0 4 2 6 1 5 3 7). Keys are passed as (k0, k4, k2, k6, k1,
    k5, k3, k7): natural coordinate order, and their fp16 pairs (k, k + 1) stay adjacent. Values are
    passed as (v0, ..., v7): column c holds coordinate ``tile_columns(D)[c]``, and their pairs (k, k + 4)
    stay adjacent. So no register is repacked on the way to shared memory."""
    b_x = tl.join(tl.join(tl.join(x0, x1), tl.join(x2, x3)), tl.join(tl.join(x4, x5), tl.join(x6, x7)))
    return tl.reshape(b_x, (BLOCK_N, D))


@triton.jit
def tile_columns(D: tl.constexpr):
    """Coordinate held by each column of a value tile (``words_to_tile`` of v0..v7): 8 (c // 8) + bitrev3(c % 8)."""
    o_c = tl.arange(0, D)
    return 8 * (o_c // 8) + 4 * (o_c % 2) + 2 * ((o_c // 2) % 2) + (o_c // 4) % 2


@triton.jit
def tq_store_kernel(
    k,             # new keys [N, HKV, D] (fp16 / bf16 / fp32), contiguous
    v,             # new values [N, HKV, D], same dtype
    slot_mapping,  # int64 [N]: cache slot of token n = page * BLOCK_SIZE + offset; < 0 = skip (padding)
    hadamard,      # fp32 [D, D], orthonormal and symmetric
    centroids,     # fp32 [16] in code order: c[m] = m-th magnitude (ascending), c[8 + m] = -c[m]
    boundaries,    # fp32 [16]: midpoints between neighbouring SORTED centroids, then +inf
    k_codes,       # cache pages (layout in the module docstring)
    k_scale,
    v_codes,
    v_scale,
    v_zero,
    num_rows,      # N * HKV: row r is token r // HKV, KV head r % HKV
    HKV: tl.constexpr,
    D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per page
    BLOCK_R: tl.constexpr,     # rows (token, head) per program, >= 16 (tl.dot)
):
    """Quantize BLOCK_R (token, KV head) rows of the new keys and values into their cache slots."""
    HALF: tl.constexpr = D // 2
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_tok = o_r // HKV
    o_h = o_r % HKV
    b_slot = tl.load(slot_mapping + o_tok, mask=o_r < num_rows, other=-1)
    m_r = b_slot >= 0           # real rows whose token has a slot (padding tokens have -1)
    o_d = tl.arange(0, D)
    o_j = tl.arange(0, HALF)
    o_in = o_r.to(tl.int64)[:, None] * D
    # --- keys: norm, unit vector, rotation (fp32, IEEE: the codes must match the reference) ---
    b_k = tl.load(k + o_in + o_d[None, :], mask=m_r[:, None], other=0.0).to(tl.float32)
    b_norm = tl.sqrt(tl.sum(b_k * b_k, axis=1))
    b_u = b_k / tl.where(b_norm > 0, b_norm, 1.0)[:, None]
    b_he = tl.load(hadamard + o_d[:, None] * D + 2 * o_j[None, :])      # columns 2j
    b_ho = tl.load(hadamard + o_d[:, None] * D + 2 * o_j[None, :] + 1)  # columns 2j + 1
    b_ye = tl.dot(b_u, b_he, input_precision="ieee")                    # [BLOCK_R, HALF]
    b_yo = tl.dot(b_u, b_ho, input_precision="ieee")
    # nearest centroid = number of boundaries below y (16 levels; the last boundary is +inf)
    b_bnd = tl.load(boundaries + tl.arange(0, 16))
    b_ce = tl.sum((b_ye[:, :, None] > b_bnd[None, None, :]).to(tl.int32), axis=2)
    b_co = tl.sum((b_yo[:, :, None] > b_bnd[None, None, :]).to(tl.int32), axis=2)
    # sign-magnitude code (module docstring): sorted index i >= 8 -> i - 8, i < 8 -> 8 | (7 - i)
    b_ce = tl.where(b_ce >= 8, b_ce - 8, 15 - b_ce)
    b_co = tl.where(b_co >= 8, b_co - 8, 15 - b_co)
    b_ve = tl.load(centroids + b_ce)
    b_vo = tl.load(centroids + b_co)
    b_cnorm = tl.sqrt(tl.sum(b_ve * b_ve + b_vo * b_vo, axis=1))
    b_ks = b_norm / b_cnorm  # norm correction: the dequantized key has norm ||k|| exactly
    b_slot = tl.where(m_r, b_slot, 0)
    o_slot = ((b_slot // BLOCK_SIZE) * HKV + o_h) * BLOCK_SIZE + b_slot % BLOCK_SIZE  # [BLOCK_R]
    tl.store(k_codes + o_slot[:, None] * HALF + o_j[None, :], (b_ce | (b_co << 4)).to(tl.uint8),
             mask=m_r[:, None])
    tl.store(k_scale + o_slot, b_ks.to(tl.float16), mask=m_r)
    # --- values: 4-bit uniform, fp16 scale and zero per (token, head) ---
    b_v = tl.load(v + o_in + o_d[None, :], mask=m_r[:, None], other=0.0).to(tl.float32)
    b_e = tl.load(v + o_in + 2 * o_j[None, :], mask=m_r[:, None], other=0.0).to(tl.float32)
    b_o = tl.load(v + o_in + 2 * o_j[None, :] + 1, mask=m_r[:, None], other=0.0).to(tl.float32)
    b_max = tl.max(b_v, axis=1)
    b_min = tl.min(b_v, axis=1)
    b_scale = tl.math.div_rn(b_max - b_min, tl.full([BLOCK_R], 15.0, tl.float32)).to(tl.float16).to(tl.float32)
    b_zero = b_min.to(tl.float16).to(tl.float32)
    m_s = b_scale > 0
    b_div = tl.where(m_s, b_scale, 1.0)[:, None]
    b_qe = tl.math.div_rn(b_e - b_zero[:, None], b_div)
    b_qo = tl.math.div_rn(b_o - b_zero[:, None], b_div)
    b_qe = tl.where(m_s[:, None], tl.minimum(tl.maximum(tl.floor(b_qe + 0.5), 0.0), 15.0), 0.0).to(tl.int32)
    b_qo = tl.where(m_s[:, None], tl.minimum(tl.maximum(tl.floor(b_qo + 0.5), 0.0), 15.0), 0.0).to(tl.int32)
    tl.store(v_codes + o_slot[:, None] * HALF + o_j[None, :], (b_qe | (b_qo << 4)).to(tl.uint8),
             mask=m_r[:, None])
    tl.store(v_scale + o_slot, b_scale.to(tl.float16), mask=m_r)
    tl.store(v_zero + o_slot, b_zero.to(tl.float16), mask=m_r)


@triton.jit
def _attend_cache(
    b_qe, b_qo,             # [ROWS, HALF] rotated, scaled queries (even / odd coordinates), MMA operands
    m_i, l_i, b_acc_e, b_acc_o, b_accz,  # online-softmax state
    start, end,             # token range [start, end) of this request's cache to read
    block_table, bt_row,    # the block table and this request's row offset in it
    kvh,                    # KV head
    k_codes, k_scale, v_codes, v_scale, v_zero, centroids,
    HKV: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    LOOKUP: tl.constexpr, OP: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr,
):
    """Online softmax over the quantized cache tokens [start, end): keys and values dequantized in
    registers, one tile of BLOCK_N tokens at a time."""
    HALF: tl.constexpr = D // 2
    o_n = tl.arange(0, BLOCK_N)
    o_j = tl.arange(0, HALF)
    for t0 in range(start, end, BLOCK_N):
        o_t = t0 + o_n
        m_t = o_t < end
        b_page = tl.load(block_table + bt_row + o_t // BLOCK_SIZE, mask=m_t, other=0).to(tl.int64)
        o_slot = (b_page * HKV + kvh) * BLOCK_SIZE + o_t % BLOCK_SIZE    # [BLOCK_N]
        p_rows = o_slot[:, None] * HALF + o_j[None, :]
        b_kc = tl.load(k_codes + p_rows, mask=m_t[:, None], other=0).to(tl.int32)
        b_ks = tl.load(k_scale + o_slot, mask=m_t, other=0.0).to(tl.float32)
        if LOOKUP == 0:  # inline: a jit-helper call costs the interpreter milliseconds
            b_ke = tl.load(centroids + (b_kc & 15)).to(OP)   # fp16 table: no conversion on the GPU
            b_ko = tl.load(centroids + (b_kc >> 4)).to(OP)
        else:
            b_ke = lookup_centroids(b_kc & 15, centroids, LOOKUP).to(OP)
            b_ko = lookup_centroids(b_kc >> 4, centroids, LOOKUP).to(OP)
        b_s = tl.dot(b_qe, tl.trans(b_ke), input_precision=PREC)
        b_s = tl.dot(b_qo, tl.trans(b_ko), b_s, input_precision=PREC)
        b_s = tl.where(m_t[None, :], b_s * b_ks[None, :], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
        b_alpha = tl.exp2(m_i - m_new)
        b_p = tl.exp2(b_s - m_new[:, None])
        l_i = l_i * b_alpha + tl.sum(b_p, axis=1)
        b_vc = tl.load(v_codes + p_rows, mask=m_t[:, None], other=0).to(tl.int32)
        b_vs = tl.load(v_scale + o_slot, mask=m_t, other=0.0).to(tl.float32)
        b_vz = tl.load(v_zero + o_slot, mask=m_t, other=0.0).to(tl.float32)
        b_ps = (b_p * b_vs[None, :]).to(tl.float16).to(OP)
        if EMULATE:  # centred, code - 8, as in the decode kernels (the offset rides in the fp32 sum below)
            b_vlo = ((b_vc & 15) - 8).to(OP)
            b_vhi = ((b_vc >> 4) - 8).to(OP)
        else:
            b_vlo = centred_nibble(b_vc & 15)
            b_vhi = centred_nibble(b_vc >> 4)
        b_acc_e = tl.dot(b_ps, b_vlo, b_acc_e * b_alpha[:, None], input_precision=PREC)
        b_acc_o = tl.dot(b_ps, b_vhi, b_acc_o * b_alpha[:, None], input_precision=PREC)
        b_accz = b_accz * b_alpha + tl.sum(b_p * (b_vz + 8.0 * b_vs)[None, :], axis=1)
        m_i = m_new
    return m_i, l_i, b_acc_e, b_acc_o, b_accz


@triton.jit
def load_tile(o_t, m_t, p_bt, kvh, k_words, k_scale, v_words, v_scale, v_zero,
              HKV: tl.constexpr, W: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """One tile of the paged cache for the decode kernel: tokens ``o_t`` (where ``m_t``) of one request
    (``p_bt`` its block-table row) and one KV head: key and value code words [BLOCK_N, W] (each row 4 W
    contiguous bytes) and the three fp16 scalars per token, as fp32."""
    b_page = tl.load(p_bt + o_t // BLOCK_SIZE, mask=m_t, other=0).to(tl.int64)
    o_slot = (b_page * HKV + kvh) * BLOCK_SIZE + o_t % BLOCK_SIZE
    p_rows = o_slot[:, None] * W + tl.arange(0, W)[None, :]
    b_kw = tl.load(k_words + p_rows, mask=m_t[:, None], other=0)
    b_vw = tl.load(v_words + p_rows, mask=m_t[:, None], other=0)
    b_ks = tl.load(k_scale + o_slot, mask=m_t, other=0.0).to(tl.float32)
    b_vs = tl.load(v_scale + o_slot, mask=m_t, other=0.0).to(tl.float32)
    b_vz = tl.load(v_zero + o_slot, mask=m_t, other=0.0).to(tl.float32)
    return b_kw, b_vw, b_ks, b_vs, b_vz


@triton.heuristics({"SPLIT": lambda args: args["NUM_SPLITS"] > 1})
@triton.heuristics({"OP": lambda args: tl.float32 if args["EMULATE"] else tl.float16,
                    "PREC": lambda args: "ieee" if args["EMULATE"] else "tf32"})
@triton.jit
def tq_decode_kernel(
    q_rot,        # fp32 [N, HQ, D]: rotated queries times sm_scale * log2(e); rows [0, B) are the decode tokens
    block_table,  # int32 [R, max_pages]
    seq_lens,     # int32 [R]: context length per request, the new token included (already stored)
    k_words,      # int32 view of k_codes [num_blocks, HKV, BLOCK_SIZE, D / 8]: 8 codes per word
    k_scale,
    v_words,      # int32 view of v_codes
    v_scale, v_zero,
    centroids,    # fp16 [16] in code order (EMULATE reads it; the GPU path holds it in tl0..th1)
    tl0, tl1, th0, th1,  # int32: low / high bytes of the 8 fp16 magnitudes, 4 per word (the prmt table)
    out,          # attn_out [N, HQ, D]: rows [0, B) written here when NUM_SPLITS == 1
    part_out,     # fp32 [B, HQ, NUM_SPLITS, D] when NUM_SPLITS > 1 (each split's normalized output)
    part_lse,     # fp32 [B, HQ, NUM_SPLITS] (each split's log2-sum-exp2; -inf for an empty split)
    stride_bt,    # row stride of block_table
    split_len,    # tokens per split (a multiple of BLOCK_N)
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,     # power of two >= HQ // HKV (the launcher: at least CONFIG's BLOCK_G, 16 on a GPU)
    BLOCK_N: tl.constexpr,     # cache tokens per tile
    NUM_SPLITS: tl.constexpr,
    SPLIT: tl.constexpr,       # from NUM_SPLITS (heuristic): write partials for the merge kernel
    EMULATE: tl.constexpr,
    OP: tl.constexpr, PREC: tl.constexpr,  # from EMULATE (heuristics): MMA operand dtype, tl.dot precision
):
    """Split-KV decode: program (request b, KV head, split s) attends the G = HQ // HKV query heads of
    that KV head (each cache byte read once per KV head) over tokens [s * split_len, ...).

    Tokens are the rows of both matrix multiplies, the G heads their narrow side (padded to BLOCK_G: 16 on a
    GPU, the narrowest for which Triton 3.6 emits Hopper's wgmma):
    scores^T [BLOCK_N, G] = K [BLOCK_N, D] @ Q^T [D, G], and
    out^T [D, G] += V^T [D, BLOCK_N] @ (p * v_scale) [BLOCK_N, G]. K and V are dequantized once per tile,
    as whole [BLOCK_N, D] fp16 tiles (``words_to_tile``), and Q^T is loaded once, in the tile's column
    order. The softmax sums l and sum p * (v_zero + 8 v_scale) stay per (token row, head) and are reduced
    once at the end; only the running max is reduced across the tile each step.

    Precision: values go in centred (code - 8), so on a flat softmax the output is not a small
    difference of two large sums, and each tile's p @ V starts from zero and is added to the running sum
    in fp32 (``_COPY_ASM`` keeps the two apart), so the tensor cores' accumulator only ever sums one tile."""
    G: tl.constexpr = HQ // HKV
    W: tl.constexpr = D // 8
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    L = tl.load(seq_lens + b)
    start = s * split_len
    end = tl.minimum(start + split_len, L)
    o_g = tl.arange(0, BLOCK_G)
    m_g = o_g < G
    o_hq = kvh * G + o_g
    o_d = tl.arange(0, D)
    o_cd = tile_columns(D)                                          # coordinate of each value-tile column
    p_q = q_rot + (b * HQ + o_hq)[None, :].to(tl.int64) * D + o_d[:, None]
    b_qt = tl.load(p_q, mask=m_g[None, :], other=0.0).to(tl.float16).to(OP)   # Q^T [D, BLOCK_G]
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_N, BLOCK_G], tl.float32)                  # sum p, per token row
    b_z = tl.zeros([BLOCK_N, BLOCK_G], tl.float32)                  # sum p * (v_zero + 8 v_scale)
    b_acc = tl.zeros([D, BLOCK_G], tl.float32)                      # sum (p * v_scale) (code - 8)
    o_n = tl.arange(0, BLOCK_N)
    p_bt = block_table + b * stride_bt
    o_t = start + o_n
    m_t = o_t < end
    b_kw, b_vw, b_ks, b_vs, b_vz = load_tile(o_t, m_t, p_bt, kvh, k_words, k_scale, v_words, v_scale, v_zero,
                                             HKV, W, BLOCK_SIZE)
    for t0 in range(start, end, BLOCK_N):
        # prefetch: the next tile's loads go out before this tile's math (masked off past the end)
        o_tn = t0 + BLOCK_N + o_n
        m_tn = o_tn < end
        n_kw, n_vw, n_ks, n_vs, n_vz = load_tile(o_tn, m_tn, p_bt, kvh, k_words, k_scale, v_words, v_scale,
                                                 v_zero, HKV, W, BLOCK_SIZE)
        k0, k1, k2, k3, k4, k5, k6, k7 = unpack_keys(b_kw, centroids, tl0, tl1, th0, th1, OP, EMULATE)
        b_k = words_to_tile(k0, k4, k2, k6, k1, k5, k3, k7, BLOCK_N, D)  # natural coordinate order
        b_s = tl.dot(b_k, b_qt, input_precision=PREC)                   # scores^T [BLOCK_N, BLOCK_G]
        b_s = tl.where(m_t[:, None], b_s * b_ks[:, None], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=0))
        b_alpha = tl.exp2(m_i - m_new)
        b_p = tl.exp2(b_s - m_new[None, :])
        b_l = b_l * b_alpha[None, :] + b_p
        b_z = b_z * b_alpha[None, :] + b_p * (b_vz + 8.0 * b_vs)[:, None]
        b_pv = (b_p * b_vs[:, None]).to(tl.float16).to(OP)
        v0, v1, v2, v3, v4, v5, v6, v7 = unpack_values(b_vw, OP, EMULATE)
        b_v = words_to_tile(v0, v1, v2, v3, v4, v5, v6, v7, BLOCK_N, D)
        b_pv = tl.dot(tl.trans(b_v), b_pv, input_precision=PREC)       # this tile's V^T @ pv [D, BLOCK_G]
        if not EMULATE:
            b_pv = tl.inline_asm_elementwise(_COPY_ASM, "=r,r", [b_pv], dtype=tl.float32, is_pure=True, pack=1)
        b_acc = b_acc * b_alpha[None, :] + b_pv
        m_i = m_new
        b_kw, b_vw, b_ks, b_vs, b_vz, m_t = n_kw, n_vw, n_ks, n_vs, n_vz, m_tn
    b_lsum = tl.sum(b_l, axis=0)
    m_any = b_lsum > 0  # false only for an empty split (start >= L)
    b_lsum = tl.where(m_any, b_lsum, 1.0)
    b_o = tl.where(m_any[None, :], (b_acc + tl.sum(b_z, axis=0)[None, :]) / b_lsum[None, :], 0.0)
    m_o = m_g[None, :] & (o_cd < D)[:, None]
    if SPLIT:
        o_row = (b * HQ + o_hq).to(tl.int64) * NUM_SPLITS + s
        tl.store(part_lse + o_row, tl.where(m_any, m_i + tl.log2(b_lsum), float("-inf")), mask=m_g)
        tl.store(part_out + o_row[None, :] * D + o_cd[:, None], b_o, mask=m_o)
    else:
        if out.dtype.element_ty == tl.bfloat16:  # the interpreter's fp32 -> bf16 cast truncates
            b_o = round_to_bf16(b_o, EMULATE)
        p_o = out + (b * HQ + o_hq)[None, :].to(tl.int64) * D + o_cd[:, None]
        tl.store(p_o, b_o.to(out.dtype.element_ty), mask=m_o)


@triton.jit
def tq_merge_kernel(
    part_out,   # fp32 [B, HQ, NUM_SPLITS, D]
    part_lse,   # fp32 [B, HQ, NUM_SPLITS]
    out,        # attn_out [N, HQ, D]: row b, head h written by program (b, h)
    HQ: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """Log-sum-exp merge of the splits: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    o_s = tl.arange(0, BLOCK_S)
    m_s = o_s < NUM_SPLITS
    o_d = tl.arange(0, D)
    row = (b * HQ + h).to(tl.int64) * NUM_SPLITS
    b_lse = tl.load(part_lse + row + o_s, mask=m_s, other=float("-inf"))
    b_w = tl.exp2(b_lse - tl.max(b_lse, axis=0))   # an empty split has lse -inf: weight 0
    b_o = tl.load(part_out + (row + o_s)[:, None] * D + o_d[None, :], mask=m_s[:, None], other=0.0)
    b_res = tl.sum(b_w[:, None] * b_o, axis=0) / tl.sum(b_w, axis=0)
    if out.dtype.element_ty == tl.bfloat16:
        b_res = round_to_bf16(b_res, EMULATE)
    tl.store(out + (b * HQ + h).to(tl.int64) * D + o_d, b_res.to(out.dtype.element_ty))


@triton.heuristics({"OP": lambda args: tl.float32 if args["EMULATE"] else tl.float16,
                    "PREC": lambda args: "ieee" if args["EMULATE"] else "tf32"})
@triton.jit
def tq_prefill_kernel(
    q,            # new queries [N, HQ, D] (fp16 / bf16 / fp32)
    q_rot,        # fp32 [N, HQ, D]: rotated queries times sm_scale * log2(e)
    k,            # new keys [N, HKV, D], full precision (the prefill attends its own tokens unquantized)
    v,            # new values [N, HKV, D]
    query_start_loc,  # int32 [R + 1]: request r's new tokens are rows [qsl[r], qsl[r + 1])
    seq_lens,     # int32 [R]: context length, new tokens included
    block_table,  # int32 [R, max_pages]
    k_codes, k_scale, v_codes, v_scale, v_zero,
    centroids,    # fp16 [16]
    out,          # attn_out [N, HQ, D]: rows [qsl[first], qsl[R]) written here
    first_req,    # index of the first prefill request (= number of decode requests)
    stride_bt,
    sm_scale_log2,  # sm_scale * log2(e)
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query tokens per program
    BLOCK_N: tl.constexpr,  # key tokens per tile
    LOOKUP: tl.constexpr, EMULATE: tl.constexpr,
    OP: tl.constexpr, PREC: tl.constexpr,  # from EMULATE (heuristics): MMA operand dtype, tl.dot precision
):
    """Program (prefill request, query head, tile of BLOCK_M new tokens): attention over the cached
    prefix [0, P) read from the quantized cache, then causally over the request's own new tokens
    (full precision), P = seq_len - query_len."""
    G: tl.constexpr = HQ // HKV
    HALF: tl.constexpr = D // 2
    r = first_req + tl.program_id(0)
    hq = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    qs = tl.load(query_start_loc + r)
    qlen = tl.load(query_start_loc + r + 1) - qs
    if m0 < qlen:
        kvh = hq // G
        P = tl.load(seq_lens + r) - qlen
        o_m = m0 + tl.arange(0, BLOCK_M)
        m_m = o_m < qlen
        o_j = tl.arange(0, HALF)
        o_q = ((qs + o_m).to(tl.int64) * HQ + hq)[:, None] * D + 2 * o_j[None, :]
        m_acc = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        b_accz = tl.zeros([BLOCK_M], tl.float32)
        b_acc_e = tl.zeros([BLOCK_M, HALF], tl.float32)
        b_acc_o = tl.zeros([BLOCK_M, HALF], tl.float32)
        # 1. the cached prefix (a continuation chunk), dequantized in registers
        b_qe = (tl.load(q_rot + o_q, mask=m_m[:, None], other=0.0)).to(tl.float16).to(OP)
        b_qo = (tl.load(q_rot + o_q + 1, mask=m_m[:, None], other=0.0)).to(tl.float16).to(OP)
        m_acc, l_i, b_acc_e, b_acc_o, b_accz = _attend_cache(
            b_qe, b_qo, m_acc, l_i, b_acc_e, b_acc_o, b_accz, 0, P, block_table, r * stride_bt, kvh,
            k_codes, k_scale, v_codes, v_scale, v_zero, centroids, HKV, D, BLOCK_SIZE, BLOCK_N, LOOKUP, OP, PREC, EMULATE)
        # 2. the new tokens, causal, unrotated and unquantized
        b_qe = (tl.load(q + o_q, mask=m_m[:, None], other=0.0).to(tl.float32) * sm_scale_log2).to(tl.float16).to(OP)
        b_qo = (tl.load(q + o_q + 1, mask=m_m[:, None], other=0.0).to(tl.float32) * sm_scale_log2).to(tl.float16).to(OP)
        o_n = tl.arange(0, BLOCK_N)
        for j0 in range(0, tl.minimum(qlen, m0 + BLOCK_M), BLOCK_N):
            o_t = j0 + o_n
            m_t = o_t < qlen
            o_kv = ((qs + o_t).to(tl.int64) * HKV + kvh)[:, None] * D + 2 * o_j[None, :]
            b_ke = (tl.load(k + o_kv, mask=m_t[:, None], other=0.0)).to(tl.float16).to(OP)
            b_ko = (tl.load(k + o_kv + 1, mask=m_t[:, None], other=0.0)).to(tl.float16).to(OP)
            b_s = tl.dot(b_qe, tl.trans(b_ke), input_precision=PREC)
            b_s = tl.dot(b_qo, tl.trans(b_ko), b_s, input_precision=PREC)
            m_causal = m_t[None, :] & (o_t[None, :] <= o_m[:, None])
            b_s = tl.where(m_causal, b_s, float("-inf"))
            m_new = tl.maximum(m_acc, tl.max(b_s, axis=1))
            b_alpha = tl.exp2(m_acc - m_new)
            b_p = tl.exp2(b_s - m_new[:, None])
            l_i = l_i * b_alpha + tl.sum(b_p, axis=1)
            b_pm = (b_p).to(tl.float16).to(OP)
            b_ve = (tl.load(v + o_kv, mask=m_t[:, None], other=0.0)).to(tl.float16).to(OP)
            b_vo = (tl.load(v + o_kv + 1, mask=m_t[:, None], other=0.0)).to(tl.float16).to(OP)
            b_acc_e = tl.dot(b_pm, b_ve, b_acc_e * b_alpha[:, None], input_precision=PREC)
            b_acc_o = tl.dot(b_pm, b_vo, b_acc_o * b_alpha[:, None], input_precision=PREC)
            b_accz = b_accz * b_alpha
            m_acc = m_new
        b_oe = (b_acc_e + b_accz[:, None]) / l_i[:, None]
        b_oo = (b_acc_o + b_accz[:, None]) / l_i[:, None]
        if out.dtype.element_ty == tl.bfloat16:
            b_oe = round_to_bf16(b_oe, EMULATE)
            b_oo = round_to_bf16(b_oo, EMULATE)
        tl.store(out + o_q, b_oe.to(out.dtype.element_ty), mask=m_m[:, None])
        tl.store(out + o_q + 1, b_oo.to(out.dtype.element_ty), mask=m_m[:, None])
