"""Gated DeltaNet device code: the recurrent step kernel, the kernels of the chunked form (solve -> w/u ->
state pass -> output; w/u folded into the solve (FUSE_WU) or formed by the state pass from A (FROM_A), the
outputs folded into the state pass (FUSE_O): the launcher's rules pick), the varlen chunk table they read,
the scan over segments (the chunked form parallel over the sequence), and the gated RMSNorm.
Device code only: the launchers, the allocation policy and its coverage argument live in ``workbook/gdn.py``.

Segments: a segment of chunks maps its start state affinely, S_end = M S_start + B (M [K, K], B [K, V]).
The state kernel run over segments as sequences, on state width V + K with u's V columns (VU) and zero
values past them, from [0 | I_K] (H0_EYE, no h / v' stores), ends each in [B | M]; ``segment_scan_kernel``
chains them; the state and output kernels run again from each segment's start state, on the same A (w, u)
(a segment is whole chunks). The chunk table kernel, with ``starts``, gives the segments' offsets.

Layouts (all contiguous, tokens of all sequences laid end to end):
q, k, kn ``[T_all, H, K]``; v, o, u, v_new ``[T_all, HV, V]``; w ``[T_all, HV, K]``; A ``[T_all, HV, 64]``;
g, beta, G ``[T_all, HV]``; states ``[N, HV, K, V]``; per-chunk states ``[NT_MAX, HV, K, V]`` (NT_MAX: the
chunk count, or for a varlen batch an upper bound of it known from shapes). Value head ``hv`` reads
key head ``hv // (HV // H)``.
"""
import workbook.device  # noqa: F401  (TRITON_INTERPRET before triton on CPU-only machines)

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, F32: tl.constexpr, EMULATE: tl.constexpr):
    """a @ b with fp32 accumulation; fp32 operands use 3xTF32 (fp32-accurate) on the GPU.

    EMULATE: Triton's interpreter (3.9, seen here) returns garbage for tl.dot on bf16/fp16 operands,
    so there the operands are upcast and multiplied in IEEE fp32: products of 16-bit values are exact
    in fp32, as in the GPU's matrix units."""
    if EMULATE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif F32:
        return tl.dot(a, b, input_precision="tf32x3")
    else:
        return tl.dot(a, b)


@triton.jit
def _pdot(a, b, P: tl.constexpr, EMULATE: tl.constexpr):
    """a @ b of fp32 tiles on the matrix units at precision P (IEEE fp32 in the interpreter)."""
    if EMULATE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=P)


@triton.jit
def _l2norm_rows(b_x):
    """Each row of an fp32 tile times rsqrt(sum of squares + 1e-6)."""
    return b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=1) + 1e-6)[:, None]


@triton.jit
def _seq_bounds(cu_seqlens, i_n, T):
    """[bos, eos) of sequence i_n from the device offsets, clamped to 0 <= bos <= eos <= T: the
    launchers do not read cu_seqlens on the host (no sync), so offsets checked nowhere must still
    keep every address inside the buffers (a malformed table gives wrong rows, never a stray write)."""
    bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n).to(tl.int64), 0), T)
    eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + i_n + 1).to(tl.int64), bos), T)
    return bos, eos


# --------------------------------------------------------------------------------------------------
# Recurrent form: one program owns a [K, BV] slice of one head's state and walks the tokens.
# --------------------------------------------------------------------------------------------------

@triton.heuristics({
    "USE_H0": lambda args: args["h0"] is not None,
    "STORE_HT": lambda args: args["ht"] is not None,
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
})
@triton.jit
def fused_recurrent_gdn_fwd_kernel(
    q,                          # [T_all, H, K] queries
    k,                          # [T_all, H, K] keys
    v,                          # [T_all, HV, V] values
    g,                          # [T_all, HV] log decay (<= 0)
    beta,                       # [T_all, HV] write strength
    o,                          # [T_all, HV, V] output (every row written by its head's programs)
    h0,                         # [N, HV, K, V] initial state, or None (USE_H0)
    ht,                         # [N, HV, K, V] final state, or None (STORE_HT; may alias h0)
    cu_seqlens,                 # [N + 1] sequence starts, or None (IS_VARLEN)
    scale,                      # query scale (fp32)
    T,                          # tokens per sequence (with IS_VARLEN: all tokens, B == 1)
    H: tl.constexpr,            # key heads
    HV: tl.constexpr,           # value heads (multiple of H)
    K: tl.constexpr,            # key head dim
    V: tl.constexpr,            # value head dim
    BK: tl.constexpr,           # next power of two >= K (whole key dim in one block)
    BV: tl.constexpr,           # value columns per program
    USE_QK_L2NORM: tl.constexpr,  # L2-normalise q and k rows in the kernel
    USE_H0: tl.constexpr,       # h0 given: start from it instead of zeros (heuristic)
    STORE_HT: tl.constexpr,     # ht given: write the final state (heuristic)
    IS_VARLEN: tl.constexpr,    # cu_seqlens given (heuristic)
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        bos, eos = _seq_bounds(cu_seqlens, i_n, T)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    o_h = i_nh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + o_h, mask=m_h, other=0).to(tl.float32)

    p_q = q + (bos * H + i_h) * K + o_k
    p_k = k + (bos * H + i_h) * K + o_k
    p_v = v + (bos * HV + i_hv) * V + o_v
    p_g = g + bos * HV + i_hv
    p_beta = beta + bos * HV + i_hv
    p_o = o + (bos * HV + i_hv) * V + o_v
    for _ in range(0, eos - bos):
        b_q = tl.load(p_q, mask=m_k, other=0).to(tl.float32)
        b_k = tl.load(p_k, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0).to(tl.float32)
        b_g = tl.load(p_g).to(tl.float32)
        b_beta = tl.load(p_beta).to(tl.float32)
        if USE_QK_L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        # h <- exp(g) h ;  u = beta (v - h^T k) ;  h <- h + k u^T ;  o = h^T q
        b_h *= tl.exp(b_g)
        b_u = b_beta * (b_v - tl.sum(b_h * b_k[:, None], axis=0))
        b_h += b_k[:, None] * b_u[None, :]
        b_o = tl.sum(b_h * b_q[:, None], axis=0)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_v)
        p_q += H * K
        p_k += H * K
        p_v += HV * V
        p_g += HV
        p_beta += HV
        p_o += HV * V
    if STORE_HT:
        tl.store(ht + o_h, b_h.to(ht.dtype.element_ty), mask=m_h)


# --------------------------------------------------------------------------------------------------
# Varlen chunk table, built on the device (no host sync: a CUDA graph can hold it). Global chunk c
# of a batch laid end to end belongs to sequence n = #{sequences whose chunks all come before c}
# and is chunk c - (first chunk of n) within it. The grid covers an upper bound NT_MAX of the chunk
# count known from shapes alone; entries past the true count get sequence -1 (their programs exit).
# --------------------------------------------------------------------------------------------------

@triton.heuristics({"STORE_STARTS": lambda args: args["starts"] is not None})
@triton.jit
def chunk_table_kernel(
    cu_seqlens,                 # [N + 1] sequence starts (device)
    chunk_indices,              # [NT_MAX, 2] out: (sequence or -1, chunk within the sequence)
    chunk_offsets,              # [N + 1] out: first global chunk of each sequence (program 0 writes it)
    starts,                     # [NT_MAX + 1] out: first token of each chunk (T past the count), or None
    N,                          # number of sequences
    T,                          # tokens in all
    NT_MAX,                     # rows of chunk_indices (an upper bound of the chunk count)
    BT: tl.constexpr,           # chunk length
    BC: tl.constexpr,           # chunk ids per program
    BN: tl.constexpr,           # sequences per tile of the scan
    STORE_STARTS: tl.constexpr,  # starts given (heuristic): the chunks as offsets, a cu_seqlens of chunks
):
    i_c = tl.program_id(0)
    o_c = i_c * BC + tl.arange(0, BC)
    b_n = tl.zeros([BC], dtype=tl.int32)          # sequences that end at or before chunk c
    b_s = tl.zeros([BC], dtype=tl.int32)          # first chunk of the sequence holding c
    carry = 0
    if i_c == 0:
        tl.store(chunk_offsets, 0)
    for n0 in range(0, N, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < N
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + o_n, mask=m_n, other=0).to(tl.int32), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + o_n + 1, mask=m_n, other=0).to(tl.int32), bos), T)
        cnt = tl.where(m_n, (eos - bos + BT - 1) // BT, 0)   # clamped as _seq_bounds does
        end = carry + tl.cumsum(cnt, axis=0)      # first chunk after sequence n
        if i_c == 0:
            tl.store(chunk_offsets + o_n + 1, end, mask=m_n)
        hit = (end[None, :] <= o_c[:, None]) & m_n[None, :]
        b_n += tl.sum(hit.to(tl.int32), axis=1)
        b_s = tl.maximum(b_s, tl.max(tl.where(hit, end[None, :], 0), axis=1))
        carry += tl.sum(cnt, axis=0)
    m_c = o_c < NT_MAX
    tl.store(chunk_indices + 2 * o_c, tl.where(b_n < N, b_n, -1), mask=m_c)
    tl.store(chunk_indices + 2 * o_c + 1, o_c - b_s, mask=m_c)
    if STORE_STARTS:   # chunk c starts BT (o_c - b_s) tokens after its sequence's start (clamped to T)
        b_bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + tl.minimum(b_n, N - 1)).to(tl.int32), 0), T)
        b_t = tl.where(b_n < N, tl.minimum(b_bos + (o_c - b_s) * BT, T), T)
        tl.store(starts + o_c, b_t, mask=m_c)
        if i_c == 0:
            tl.store(starts + NT_MAX, T)


# --------------------------------------------------------------------------------------------------
# Chunked form, kernels 1 and 2 of 4: everything that stays inside one chunk of 64 tokens.
# Kernel 1: G = cumsum(g); L = strict_lower(diag(beta) (K K^T * Gamma)); A = (I + L)^-1, stored as
# [64, 64] per chunk. With USE_QK_L2NORM the keys are normalised here, once, and stored (kn) for the
# later kernels. Kernel 2: w = A diag(beta exp(G)) K ; u = A diag(beta) V, each one 64-row product on
# the matrix units. With FUSE_WU kernel 1 computes w and u itself from A still in registers (A is then
# stored only for a caller who asks for it): one launch and no A round trip, at the price of the solve's
# 64x64 fp32 tiles and the 64-row products sharing one program's registers (workbook.gdn.CONFIG says
# which form is the default, and why).
# --------------------------------------------------------------------------------------------------

@triton.jit
def _chunk_position(i_c, cu_seqlens, chunk_indices, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(sequence or -1 past the last chunk, sequence start, end, first row of the chunk) of global chunk i_c."""
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int64)
        i_t = tl.load(chunk_indices + 2 * i_c + 1).to(tl.int64)
        bos, eos = _seq_bounds(cu_seqlens, tl.maximum(i_n, 0), T)
    else:
        NT = tl.cdiv(T, BT)
        i_n = (i_c // NT).to(tl.int64)
        i_t = (i_c % NT).to(tl.int64)
        bos = i_n * T
        eos = bos + T
    return i_n, bos, eos, bos + i_t * BT


@triton.jit
def _inv_diag_blocks(b_l, BC: tl.constexpr, BT: tl.constexpr):
    """(I + D)^-1, D the BC x BC diagonal blocks of the strictly lower [BT, BT] fp32 tile L, as a
    block-diagonal [BT, BT] tile, by forward substitution in fp32 on the BT / BC blocks at once, held
    as one [BT / BC, BC, BC] tile (no work on the zeros between them). Right-looking: row j of every
    block is final after step j - 1, and step j subtracts it, times L[i, j], from every later row i of
    its block. A step is one column of L (independent of the result: off the dependent chain), one row
    of the result (a masked sum over rows) and a rank-1 update, with no change of register layout."""
    NB: tl.constexpr = BT // BC
    o_b = tl.arange(0, NB)
    o_r = tl.arange(0, BC)
    m_bb = (o_b[:, None] == o_b[None, :])[:, None, :, None]                           # [NB, 1, NB, 1]
    b_ld = tl.sum(tl.where(m_bb, tl.reshape(b_l, [NB, BC, NB, BC]), 0.), axis=2)       # [NB, BC, BC]
    b_x = tl.broadcast_to((o_r[:, None] == o_r[None, :]).to(tl.float32)[None, :, :], [NB, BC, BC])
    for j in tl.static_range(BC - 1):
        b_xj = tl.sum(tl.where((o_r == j)[None, :, None], b_x, 0.), axis=1)     # [NB, BC]: row j of each block
        b_lj = tl.sum(tl.where((o_r == j)[None, None, :], b_ld, 0.), axis=2)    # [NB, BC]: column j of each block
        b_x -= b_lj[:, :, None] * b_xj[:, None, :]
    b_x4 = tl.where(m_bb, tl.broadcast_to(b_x[:, :, None, :], [NB, BC, NB, BC]), 0.)
    return tl.reshape(b_x4, [BT, BT])


@triton.jit
def _merge_pairs(b_x, b_l, S: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr):
    """From X = the inverses of the S x S diagonal blocks of I + L to those of the 2S x 2S blocks: a pair
    [[D1, 0], [E, D2]] has the inverse [[X1, 0], [-X2 E X1, X2]], so X <- X - X E X with E the lower-left
    S x S block of each pair (X E X is X2 E X1 there and zero elsewhere). Two [BT, BT] products on the
    matrix units (PREC for their inputs; fp32 accumulation)."""
    o_i = tl.arange(0, BT)
    m_e = ((o_i[:, None] // (2 * S)) == (o_i[None, :] // (2 * S))) & ((o_i[:, None] // S) != (o_i[None, :] // S))
    b_e = tl.where(m_e, b_l, 0.)
    return b_x - _pdot(b_x, _pdot(b_e, b_x, PREC, EMULATE), PREC, EMULATE)


@triton.jit
def _inv_unit_lower(b_l, BC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr):
    """(I + L)^-1 of a strictly lower [BT, BT] fp32 tile: diagonal blocks of BC rows by substitution,
    then pairs merged (BC -> 2 BC -> ... -> BT). BC = BT is pure substitution; every path computes the same terms as forward substitution, no cancelling series."""
    tl.static_assert(BT <= 64, "merge levels run up to 64 rows")
    b_x = _inv_diag_blocks(b_l, BC, BT)
    for lvl in tl.static_range(6):      # merged block sizes 1, 2, 4, ..., 32 (pairs of them: up to 64 rows)
        if BC <= (1 << lvl) and (1 << lvl) < BT:
            b_x = _merge_pairs(b_x, b_l, 1 << lvl, BT, PREC, EMULATE)
    return b_x


@triton.heuristics({
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "USE_QK_L2NORM": lambda args: args["kn"] is not None,
    "STORE_A": lambda args: args["A"] is not None,
    "FUSE_WU": lambda args: args["w"] is not None,
})
@triton.jit
def chunk_gdn_solve_kernel(
    k,                          # [T_all, H, K] keys
    v,                          # [T_all, HV, V] values (read with FUSE_WU only)
    g,                          # [T_all, HV] log decay
    beta,                       # [T_all, HV] write strength
    G,                          # [T_all, HV] fp32 out: in-chunk cumulative sum of g
    A,                          # [T_all, HV, BT] out: row t holds row (t - t0) of its chunk's (I + L)^-1, or None
    kn,                         # [T_all, H, K] out: L2-normalised keys, or None (then USE_QK_L2NORM off)
    w,                          # [T_all, HV, K] out: kernel 2's w, or None (FUSE_WU: kernel 2 folded in)
    u,                          # [T_all, HV, V] out: kernel 2's u, or None exactly when w is None
    cu_seqlens,                 # [N + 1] sequence starts, or None (IS_VARLEN)
    chunk_indices,              # [NT_MAX, 2] (sequence or -1, chunk within it), or None when not IS_VARLEN
    T,                          # tokens per sequence (with IS_VARLEN: all tokens, B == 1)
    H: tl.constexpr,            # key heads
    HV: tl.constexpr,           # value heads
    K: tl.constexpr,            # key head dim
    V: tl.constexpr,            # value head dim
    BT: tl.constexpr,           # chunk length (64)
    BK: tl.constexpr,           # padded K (power of two >= 16)
    BV: tl.constexpr,           # padded V
    BC: tl.constexpr,           # rows per diagonal block solved by substitution (2 .. BT, power of two)
    GV: tl.constexpr,           # value heads per program (divides HV // H): they share one K K^T
    PREC: tl.constexpr,         # matrix-unit precision of the merge products for 16-bit storage ("tf32", "tf32x3")
    EMULATE: tl.constexpr,      # interpreter: tl.dot on fp32 copies (see _dot)
    IS_VARLEN: tl.constexpr,    # cu_seqlens given: chunk positions from chunk_indices (heuristic)
    USE_QK_L2NORM: tl.constexpr,  # kn given: normalise k rows and store them (heuristic)
    STORE_A: tl.constexpr,      # A given: store it (kernel 2 or a caller reads it) (heuristic)
    FUSE_WU: tl.constexpr,      # w given: w and u here, from A still in registers (heuristic)
):
    i_c, i_p = tl.program_id(0), tl.program_id(1)
    i_h = (i_p * GV) // (HV // H)
    i_n, bos, eos, t0 = _chunk_position(i_c, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    if i_n < 0:   # past the last chunk of a varlen batch (the grid covers an upper bound)
        return
    dt: tl.constexpr = k.dtype.element_ty      # the compute dtype: A, w, u are stored in it
    F32: tl.constexpr = dt == tl.float32
    P: tl.constexpr = "tf32x3" if F32 else PREC     # fp32 storage keeps fp32 accuracy throughout

    o_i = tl.arange(0, BT)
    o_t = t0 + o_i
    m_t = o_t < eos
    o_k = tl.arange(0, BK)
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    # the chunk's keys (normalised once, here, and stored by one program per key head)
    b_k = tl.load(k + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
    if USE_QK_L2NORM:
        b_k = _l2norm_rows(b_k.to(tl.float32)).to(dt)
        if (i_p * GV) % (HV // H) == 0:
            tl.store(kn + (o_t[:, None] * H + i_h) * K + o_k[None, :], b_k.to(kn.dtype.element_ty), mask=m_tk)
    # K K^T once for the GV value heads of this program (matrix units, fp32 accumulation)
    b_s = _dot(b_k.to(dt), tl.trans(b_k.to(dt)), F32, EMULATE)
    m_low = o_i[:, None] > o_i[None, :]
    for r in range(GV):
        i_hv = i_p * GV + r
        b_g = tl.load(g + o_t * HV + i_hv, mask=m_t, other=0).to(tl.float32)
        b_beta = tl.load(beta + o_t * HV + i_hv, mask=m_t, other=0).to(tl.float32)
        b_G = tl.cumsum(b_g, axis=0)                     # in-chunk cumulative log decay
        tl.store(G + o_t * HV + i_hv, b_G, mask=m_t)
        # L = strict_lower(beta_i S_ij exp(G_i - G_j)), the exponent masked first (no overflow above)
        b_d = tl.exp(tl.where(m_low, b_G[:, None] - b_G[None, :], 0.))
        b_l = tl.where(m_low, b_beta[:, None] * b_s * b_d, 0.)
        b_a = _inv_unit_lower(b_l, BC, BT, P, EMULATE).to(dt)
        if STORE_A:   # all 64 columns of the chunk's rows (zeros above the diagonal): kernel 2 reads [64, 64]
            tl.store(A + (o_t[:, None] * HV + i_hv) * BT + o_i[None, :], b_a, mask=m_t[:, None])
        if FUSE_WU:   # kernel 2's products on A as it would read it back (rounded to dt): the same numbers
            b_kb = (b_k.to(tl.float32) * (b_beta * tl.exp(b_G))[:, None]).to(dt)
            tl.store(w + (o_t[:, None] * HV + i_hv) * K + o_k[None, :], _dot(b_a, b_kb, F32, EMULATE).to(dt),
                     mask=m_tk)
            o_v = tl.arange(0, BV)
            m_tv = m_t[:, None] & (o_v < V)[None, :]
            b_v = tl.load(v + (o_t[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0).to(tl.float32)
            tl.store(u + (o_t[:, None] * HV + i_hv) * V + o_v[None, :],
                     _dot(b_a, (b_v * b_beta[:, None]).to(dt), F32, EMULATE).to(dt), mask=m_tv)


@triton.heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit
def chunk_gdn_wu_kernel(
    k,                          # [T_all, H, K] keys (normalised by kernel 1 when asked)
    v,                          # [T_all, HV, V] values
    beta,                       # [T_all, HV] write strength
    G,                          # [T_all, HV] fp32 cumulative log decay from kernel 1
    A,                          # [T_all, HV, BT] from kernel 1
    w,                          # [T_all, HV, K] out: A diag(beta exp(G)) K
    u,                          # [T_all, HV, V] out: A diag(beta) V
    cu_seqlens,                 # [N + 1] sequence starts, or None (IS_VARLEN)
    chunk_indices,              # [NT_MAX, 2] (sequence or -1, chunk within it), or None when not IS_VARLEN
    T,                          # tokens per sequence (with IS_VARLEN: all tokens, B == 1)
    H: tl.constexpr,            # key heads
    HV: tl.constexpr,           # value heads
    K: tl.constexpr,            # key head dim
    V: tl.constexpr,            # value head dim
    BT: tl.constexpr,           # chunk length
    BK: tl.constexpr,           # padded K
    BV: tl.constexpr,           # padded V
    EMULATE: tl.constexpr,      # interpreter: tl.dot on fp32 copies (see _dot)
    IS_VARLEN: tl.constexpr,    # cu_seqlens given: chunk positions from chunk_indices (heuristic)
):
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    i_n, bos, eos, t0 = _chunk_position(i_c, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    if i_n < 0:
        return
    dt: tl.constexpr = w.dtype.element_ty
    F32: tl.constexpr = dt == tl.float32
    o_t = t0 + tl.arange(0, BT)
    m_t = o_t < eos
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    b_A = tl.load(A + (o_t[:, None] * HV + i_hv) * BT + tl.arange(0, BT)[None, :], mask=m_t[:, None], other=0)
    b_beta = tl.load(beta + o_t * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    b_G = tl.load(G + o_t * HV + i_hv, mask=m_t, other=0)
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    b_k = tl.load(k + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
    b_kb = (b_k * (b_beta * tl.exp(b_G))[:, None]).to(dt)
    tl.store(w + (o_t[:, None] * HV + i_hv) * K + o_k[None, :], _dot(b_A, b_kb, F32, EMULATE).to(dt), mask=m_tk)
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    b_v = tl.load(v + (o_t[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0).to(tl.float32)
    b_vb = (b_v * b_beta[:, None]).to(dt)
    tl.store(u + (o_t[:, None] * HV + i_hv) * V + o_v[None, :], _dot(b_A, b_vb, F32, EMULATE).to(dt), mask=m_tv)


# --------------------------------------------------------------------------------------------------
# Chunked form, kernel 3 of 4: the only sequential part. One program owns a [K, BV] slice of one
# head's state and walks that sequence's chunks: v' = u - w h ; h <- exp(G_C) h + (K exp(G_C - G))^T v'.
# The keys arrive normalised (kernel 1 did it): nothing but the recurrence stays on the dependent chain.
# With FUSE_O (o given) the program also computes kernel 4's outputs for its chunks, while h and v'
# are in its registers: h and v' are then neither stored nor read back (q K^T and the output products
# hang off the chain: the next chunk's state does not wait for them). With FROM_A (A given) kernel 2
# never runs: v' = A diag(beta) (V - diag(exp(G)) K h) is formed here from A, the values and the keys
# already loaded for the state update (one more product on the chain, w and u neither stored nor read).
# --------------------------------------------------------------------------------------------------

@triton.heuristics({
    "USE_H0": lambda args: args["h0"] is not None,
    "STORE_HT": lambda args: args["ht"] is not None,
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "FUSE_O": lambda args: args["o"] is not None,
    "STORE_H": lambda args: args["h"] is not None,
    "FROM_A": lambda args: args["A"] is not None,
})
@triton.jit
def chunk_gdn_state_kernel(
    k,                          # [T_all, H, K] keys (normalised by kernel 1 when asked)
    w,                          # [T_all, HV, K] from kernel 2, or None (FROM_A)
    u,                          # [T_all, HV, VU] from kernel 2; with FROM_A the values v themselves
    A,                          # [T_all, HV, BT] from kernel 1, or None (FROM_A: v' formed here from A)
    beta,                       # [T_all, HV] write strength (read with FROM_A only)
    G,                          # [T_all, HV] fp32 cumulative log decay from kernel 1
    h,                          # [NT_MAX, HV, K, V] out: state at the start of every chunk, or None (FUSE_O;
                                # or no outputs at all: the segments' [B | M] pass wants final states only)
    v_new,                      # [T_all, HV, V] out: v' = u - w h, or None exactly when h is None
    q,                          # [T_all, H, K] queries, or None (read with FUSE_O only)
    o,                          # [T_all, HV, V] out: outputs, or None (FUSE_O: kernel 4 folded in)
    h0,                         # [N, HV, K, V] initial state, or None (USE_H0)
    ht,                         # [N, HV, K, V] final state, or None (STORE_HT; may alias h0)
    cu_seqlens,                 # [N + 1] sequence starts, or None (IS_VARLEN)
    chunk_offsets,              # [N + 1] first global chunk of each sequence, or None when not IS_VARLEN
    scale,                      # query scale (fp32; FUSE_O)
    T,                          # tokens per sequence (with IS_VARLEN: all tokens, B == 1)
    NT_MAX,                     # rows of h
    H: tl.constexpr,            # key heads
    HV: tl.constexpr,           # value heads
    K: tl.constexpr,            # key head dim
    V: tl.constexpr,            # value head dim (state width)
    VU: tl.constexpr,           # u's width: V, or fewer (the [B | M] pass: the values past VU are zeros)
    BT: tl.constexpr,           # chunk length
    BK: tl.constexpr,           # padded K
    BV: tl.constexpr,           # value columns per program
    USE_Q_L2NORM: tl.constexpr,  # FUSE_O: L2-normalise q rows (the keys came normalised)
    EMULATE: tl.constexpr,      # interpreter: tl.dot on fp32 copies (see _dot)
    H0_EYE: tl.constexpr,       # start from [0 | I_K] (identity in the last K of the V columns; no h0 read)
    USE_H0: tl.constexpr,       # h0 given: start from it (heuristic)
    STORE_HT: tl.constexpr,     # ht given: write the final state (heuristic)
    IS_VARLEN: tl.constexpr,    # cu_seqlens given (heuristic)
    FUSE_O: tl.constexpr,       # o given: outputs here, no h / v_new stores (heuristic)
    STORE_H: tl.constexpr,      # h (and v_new) given: store them for kernel 4 (heuristic)
    FROM_A: tl.constexpr,       # A given: v' from A, beta, the values and the keys (heuristic)
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        bos, eos = _seq_bounds(cu_seqlens, i_n, T)
        c0 = tl.load(chunk_offsets + i_n).to(tl.int64)
        NT = tl.minimum(tl.cdiv(eos - bos, BT), NT_MAX - c0)   # h has NT_MAX rows, whatever the offsets
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
        c0 = i_n.to(tl.int64) * tl.cdiv(T, BT)
        NT = tl.cdiv(T, BT)
    dt: tl.constexpr = k.dtype.element_ty
    F32: tl.constexpr = dt == tl.float32

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_i = tl.arange(0, BT)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    o_hkv = o_k[:, None] * V + o_v[None, :]

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_nh.to(tl.int64) * K * V + o_hkv, mask=m_h, other=0).to(tl.float32)
    if H0_EYE:   # the segments' [B | M] pass: value columns V - K .. V - 1 carry the identity
        b_h += tl.where(o_v[None, :] - (V - K) == o_k[:, None], 1., 0.)

    for i_t in range(0, NT):
        t0 = bos + i_t * BT
        o_t = t0 + o_i
        m_t = o_t < eos
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_hd = b_h.to(dt)
        if STORE_H:
            tl.store(h + ((c0 + i_t) * HV + i_hv) * K * V + o_hkv, b_hd, mask=m_h)
        t_last = tl.minimum(t0 + BT, eos) - 1
        b_glast = tl.load(G + t_last * HV + i_hv)
        b_G = tl.load(G + o_t * HV + i_hv, mask=m_t, other=0)
        b_G = tl.where(m_t, b_G, b_glast)
        b_k = tl.load(k + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0).to(dt)
        b_u = tl.load(u + (o_t[:, None] * HV + i_hv) * VU + o_v[None, :], mask=m_tv & (o_v < VU)[None, :], other=0)
        if FROM_A:   # kernel 2's rounding points differ: diag(beta) (V - exp(G) K h) is rounded, not w and u
            b_A = tl.load(A + (o_t[:, None] * HV + i_hv) * BT + o_i[None, :], mask=m_t[:, None], other=0)
            b_b = tl.load(beta + o_t * HV + i_hv, mask=m_t, other=0).to(tl.float32)
            b_x = b_u.to(tl.float32) - tl.exp(b_G)[:, None] * _dot(b_k, b_hd, F32, EMULATE)
            b_v = _dot(b_A, (b_x * b_b[:, None]).to(dt), F32, EMULATE)
        else:
            b_w = tl.load(w + (o_t[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_tk, other=0)
            b_v = b_u.to(tl.float32) - _dot(b_w, b_hd, F32, EMULATE)
        if STORE_H:
            tl.store(v_new + (o_t[:, None] * HV + i_hv) * V + o_v[None, :], b_v.to(dt), mask=m_tv)
        if FUSE_O:   # kernel 4 on this chunk, with the h and v' it would have read back (same roundings)
            b_q = tl.load(q + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
            if USE_Q_L2NORM:
                b_q = _l2norm_rows(b_q.to(tl.float32))
            b_q = b_q.to(dt)
            m_a = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
            b_a = _dot(b_q, tl.trans(b_k), F32, EMULATE)
            b_a = tl.where(m_a, b_a * tl.exp(tl.where(m_a, b_G[:, None] - b_G[None, :], 0.)), 0.)
            b_o = _dot(b_q, b_hd, F32, EMULATE) * tl.exp(b_G)[:, None]
            b_o = (b_o + _dot(b_a.to(dt), b_v.to(dt), F32, EMULATE)) * scale
            tl.store(o + (o_t[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_tv)
        b_vd = (b_v * tl.exp(b_glast - b_G)[:, None]).to(dt)
        b_h = b_h * tl.exp(b_glast) + _dot(tl.trans(b_k), b_vd, F32, EMULATE)
    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_hkv, b_h.to(ht.dtype.element_ty), mask=m_h)


# --------------------------------------------------------------------------------------------------
# Segments (parallel over the sequence): the scan over segments. A segment's state map is affine,
# S_end = M S_start + B (M [K, K], B [K, V]); a [B | M] pass (the state kernel over segments as
# sequences, values [v, 0_K], start [0 | I_K]) gives both. One program per (V block, sequence, value
# head) walks its sequence's segments: it stores S_start of each, then S <- M S + B (fp32, K x K times
# K x BV on the matrix units); M and B do not depend on S, so their loads run ahead of the chain.
# --------------------------------------------------------------------------------------------------

@triton.heuristics({
    "USE_H0": lambda args: args["h0"] is not None,
    "STORE_HT": lambda args: args["ht"] is not None,
})
@triton.jit
def segment_scan_kernel(
    bm,                         # [NS_MAX, HV, K, V + K] fp32: [B | M] of every segment (the pass's final states)
    s0,                         # [NS_MAX, HV, K, V] fp32 out: the state at the start of every segment
    h0,                         # [N, HV, K, V] initial state, or None (USE_H0: zeros)
    ht,                         # [N, HV, K, V] out: final state, or None (STORE_HT; may alias h0)
    seg_offsets,                # [N + 1] first segment of each sequence (from chunk_table_kernel)
    N,                          # number of sequences
    NS_MAX,                     # rows of bm and s0 (an upper bound of the segment count)
    HV: tl.constexpr,           # value heads
    K: tl.constexpr,            # key head dim
    V: tl.constexpr,            # value head dim
    BK: tl.constexpr,           # padded K
    BV: tl.constexpr,           # value columns per program
    EMULATE: tl.constexpr,      # interpreter: tl.dot in IEEE fp32 (see _dot)
    USE_H0: tl.constexpr,       # h0 given (heuristic)
    STORE_HT: tl.constexpr,     # ht given (heuristic)
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    j0 = tl.minimum(tl.maximum(tl.load(seg_offsets + i_n), 0), NS_MAX).to(tl.int64)
    j1 = tl.minimum(tl.maximum(tl.load(seg_offsets + i_n + 1).to(tl.int64), j0), NS_MAX)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_h = m_k[:, None] & (o_v < V)[None, :]
    o_hkv = o_k[:, None] * V + o_v[None, :]
    o_b = o_k[:, None] * (V + K) + o_v[None, :]                     # B: columns 0 .. V - 1 of [B | M]
    o_m = o_k[:, None] * (V + K) + V + o_k[None, :]                 # M: columns V .. V + K - 1
    m_m = m_k[:, None] & m_k[None, :]
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_s += tl.load(h0 + i_nh.to(tl.int64) * K * V + o_hkv, mask=m_h, other=0).to(tl.float32)
    for j in range(j0, j1):
        tl.store(s0 + (j * HV + i_hv) * K * V + o_hkv, b_s, mask=m_h)
        p_bm = bm + (j * HV + i_hv) * K * (V + K)
        b_m = tl.load(p_bm + o_m, mask=m_m, other=0)
        b_b = tl.load(p_bm + o_b, mask=m_h, other=0)
        b_s = _dot(b_m, b_s, True, EMULATE) + b_b
    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_hkv, b_s.to(ht.dtype.element_ty), mask=m_h)
    if i_n == N - 1:   # rows past the true count (empty padding segments): zeros, so that s0 is tiled
        for j in range(j1, NS_MAX):
            tl.store(s0 + (j * HV + i_hv) * K * V + o_hkv, tl.zeros([BK, BV], dtype=tl.float32), mask=m_h)


# --------------------------------------------------------------------------------------------------
# Chunked form, kernel 4 of 4: outputs, parallel over chunks.
# O = scale * ((Q exp(G)) h + (Q K^T * Gamma, causal incl. diagonal) v')
# --------------------------------------------------------------------------------------------------

@triton.heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit
def chunk_gdn_output_kernel(
    q,                          # [T_all, H, K] queries
    k,                          # [T_all, H, K] keys (normalised by kernel 1 when asked)
    v_new,                      # [T_all, HV, V] from kernel 3
    h,                          # [NT_MAX, HV, K, V] chunk-start states from kernel 3
    G,                          # [T_all, HV] fp32 cumulative log decay
    o,                          # [T_all, HV, V] out
    cu_seqlens,                 # [N + 1] sequence starts, or None (IS_VARLEN)
    chunk_indices,              # [NT_MAX, 2] (sequence or -1, chunk within it), or None when not IS_VARLEN
    scale,                      # query scale (fp32)
    T,                          # tokens per sequence (with IS_VARLEN: all tokens, B == 1)
    H: tl.constexpr,            # key heads
    HV: tl.constexpr,           # value heads
    K: tl.constexpr,            # key head dim
    V: tl.constexpr,            # value head dim
    BT: tl.constexpr,           # chunk length
    BK: tl.constexpr,           # padded K
    BV: tl.constexpr,           # value columns per program
    USE_Q_L2NORM: tl.constexpr,  # L2-normalise q rows (the keys came normalised)
    EMULATE: tl.constexpr,      # interpreter: tl.dot on fp32 copies (see _dot)
    IS_VARLEN: tl.constexpr,    # cu_seqlens given: chunk positions from chunk_indices (heuristic)
):
    i_v, i_c, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    i_n, bos, eos, t0 = _chunk_position(i_c, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    if i_n < 0:   # past the last chunk of a varlen batch
        return
    F32: tl.constexpr = v_new.dtype.element_ty == tl.float32
    dt: tl.constexpr = v_new.dtype.element_ty

    o_i = tl.arange(0, BT)
    o_t = t0 + o_i
    m_t = o_t < eos
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_tk = m_t[:, None] & m_k[None, :]
    b_q = tl.load(q + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
    b_k = tl.load(k + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
    if USE_Q_L2NORM:
        b_q = _l2norm_rows(b_q.to(tl.float32)).to(dt)
    b_h = tl.load(h + (i_c.to(tl.int64) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0)
    b_G = tl.load(G + o_t * HV + i_hv, mask=m_t, other=0)

    b_o = _dot(b_q.to(dt), b_h, F32, EMULATE) * tl.exp(b_G)[:, None]
    m_a = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_a = _dot(b_q.to(dt), tl.trans(b_k.to(dt)), F32, EMULATE)
    b_a = tl.where(m_a, b_a * tl.exp(tl.where(m_a, b_G[:, None] - b_G[None, :], 0.)), 0.)
    b_vn = tl.load(v_new + (o_t[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0)
    b_o = (b_o + _dot(b_a.to(dt), b_vn, F32, EMULATE)) * scale
    tl.store(o + (o_t[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


# --------------------------------------------------------------------------------------------------
# Gated RMSNorm: y = weight * x * rsqrt(mean(x^2) + eps) * silu(z), per row of one head, fp32 inside.
# --------------------------------------------------------------------------------------------------

@triton.jit
def gated_rmsnorm_kernel(
    x,                          # [M, D] rows to normalise (one row = one token of one head)
    z,                          # [M, D] gate
    weight,                     # [D] per-channel weight
    y,                          # [M, D] out
    M,                          # number of rows
    eps,                        # added to the mean square
    D: tl.constexpr,            # head dim
    BD: tl.constexpr,           # next power of two >= D
    BM: tl.constexpr,           # rows per program
):
    i_m = tl.program_id(0)
    o_m = i_m * BM + tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    m = (o_m < M)[:, None] & (o_d < D)[None, :]
    o_md = o_m.to(tl.int64)[:, None] * D + o_d[None, :]
    b_x = tl.load(x + o_md, mask=m, other=0).to(tl.float32)
    b_z = tl.load(z + o_md, mask=m, other=0).to(tl.float32)
    b_w = tl.load(weight + o_d, mask=o_d < D, other=0).to(tl.float32)
    b_r = tl.rsqrt(tl.sum(b_x * b_x, axis=1) / D + eps)
    b_y = b_x * b_r[:, None] * b_w[None, :] * (b_z * tl.sigmoid(b_z))
    tl.store(y + o_md, b_y.to(y.dtype.element_ty), mask=m)


# --------------------------------------------------------------------------------------------------
# Notebook 05, exercise 1: a plain solution (one decode step, state updated in place). One program
# per (sequence, value head) holds that head's whole [K, V] state: simple, not tuned.
# --------------------------------------------------------------------------------------------------

@triton.jit
def decode_step_solution_kernel(
    h,                          # [N, HV, K, V] fp32 state, updated in place
    q,                          # [N, H, K]
    k,                          # [N, H, K]
    v,                          # [N, HV, V]
    g,                          # [N, HV] log decay
    beta,                       # [N, HV] write strength
    o,                          # [N, HV, V] out
    scale,                      # query scale
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    i_nh = tl.program_id(0)                  # one program per (sequence n, value head hv)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)                  # the key head this value head reads
    o_k, o_v = tl.arange(0, BK), tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    p_h = h + i_nh * K * V + o_k[:, None] * V + o_v[None, :]
    m_h = m_k[:, None] & m_v[None, :]
    b_h = tl.load(p_h, mask=m_h, other=0)
    b_q = tl.load(q + (i_n * H + i_h) * K + o_k, mask=m_k, other=0) * scale
    b_k = tl.load(k + (i_n * H + i_h) * K + o_k, mask=m_k, other=0)
    b_v = tl.load(v + i_nh * V + o_v, mask=m_v, other=0)
    b_g = tl.load(g + i_nh)
    b_beta = tl.load(beta + i_nh)
    b_h = b_h * tl.exp(b_g)                                      # decay first
    b_u = b_beta * (b_v - tl.sum(b_h * b_k[:, None], axis=0))   # correction, with the decayed h
    b_h = b_h + b_k[:, None] * b_u[None, :]                      # rank-1 write
    b_o = tl.sum(b_h * b_q[:, None], axis=0)                     # read with the updated h
    tl.store(p_h, b_h, mask=m_h)
    tl.store(o + i_nh * V + o_v, b_o, mask=m_v)
