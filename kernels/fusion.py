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

One-shot all-reduce + add + RMSNorm (``oneshot_all_reduce_add_rmsnorm_kernel``). Rank q owns an
exchange buffer ``[SLOTS, WORLD, MAX_T, D]`` of element bits that every rank can address (``peers``:
the WORLD buffer addresses). Step t uses slot s = t % SLOTS. Push: rank r stores its partial rows into
position r of slot s of EVERY rank's buffer (peer stores; -0.0 turned into +0.0 first). Reduce: rank r
loads all WORLD positions of slot s of its OWN buffer with volatile loads until no element holds the
sentinel (the bits of -0.0: the data is the flag, so no fence orders the data behind a flag), sums
them in fp32 in rank order 0..WORLD-1 (every rank gets the same bits), rounds to the dtype (the
all-reduce's value), then the add + RMSNorm above; then it writes the sentinel back into exactly the
rows it read. The wait ends on a count summed over the whole block, so no thread stores the sentinel
before every thread has loaded. Two slots: a peer's next write into a slot is two steps later (it
waits for this rank's next push, issued after this launch ended). The step counter lives in
``state`` on the device; the last program of a rank to finish (atomic count) advances it, so CUDA-
graph replay advances it. Mapping: grid (programs, served ranks); program k takes row blocks k, k+G,
...; the launcher keeps G x served ranks at most one per SM, so every program a waiting one depends
on is resident. PHASE 1 / 2 / 3 = push / reduce / both: the interpreter runs programs one after
another, so it runs push then reduce as two launches; a wait bounded by ``max_spin`` counts in state.
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


@triton.jit
def _add_rmsnorm_rows(b_x, p_r, weight, p_out, p_res_out, o_d, m, m_d, D, eps, IS_BF16: tl.constexpr,
                      EMULATE: tl.constexpr):
    """The rows' add + RMSNorm from ``b_x`` (fp32 values of the tensor dtype): reads the residual at
    ``p_r``, writes the new residual at ``p_res_out`` and the normalised rows at ``p_out`` (masked by ``m``).
    The body of add_rmsnorm_kernel, which keeps its own copy so that notebook 06 shows it whole; tests
    hold the two to the same bits (test_oneshot_equals_the_nccl_path_bits, each step's new residual)."""
    b_r = _load_f32(p_r, m, IS_BF16, EMULATE)
    # the new residual in the tensor dtype; the norm reads the rounded value, as the unfused chain does
    b_h = _round(b_x + b_r, IS_BF16, EMULATE)
    tl.store(p_res_out, b_h.to(p_res_out.dtype.element_ty), mask=m)
    b_var = tl.sum(b_h * b_h, axis=1) / D            # masked columns hold 0 and add nothing
    b_y = b_h * tl.rsqrt(b_var + eps)[:, None]
    b_w = _load_f32(weight + o_d, m_d, IS_BF16, EMULATE)
    b_y = _round(b_y * b_w[None, :], IS_BF16, EMULATE)
    tl.store(p_out, b_y.to(p_out.dtype.element_ty), mask=m)


# --------------------------------------------------------------------------------------------------
# One-shot all-reduce + add + RMSNorm over peer-accessible exchange buffers (Lamport data-as-flag)
# --------------------------------------------------------------------------------------------------

@triton.jit
def _bits_to_f32(b, IS_BF16: tl.constexpr, IS_FP16: tl.constexpr):
    """The fp32 value of the element bits ``b`` (int16 for bf16/fp16, int32 for fp32): exact."""
    if IS_BF16:
        return bf16_to_fp32(b)
    elif IS_FP16:
        return b.to(tl.float16, bitcast=True).to(tl.float32)
    else:
        return b.to(tl.float32, bitcast=True)


@triton.jit
def _round_to_dtype(b, IS_BF16: tl.constexpr, IS_FP16: tl.constexpr, EMULATE: tl.constexpr):
    """fp32 -> the fp32 value of the tensor dtype's nearest number (what an all-reduce returns)."""
    if IS_FP16:
        return b.to(tl.float16).to(tl.float32)
    else:
        return _round(b, IS_BF16, EMULATE)


@triton.jit
def _spin_load(p, m, max_spin, SENTINEL: tl.constexpr):
    """Volatile loads of the block at ``p`` until no element under ``m`` holds ``SENTINEL`` (all
    arrived) or ``max_spin`` reloads; returns (bits, elements still missing). The count is a sum over
    the whole block, so no thread leaves the loop before every thread's loads are done."""
    b = tl.load(p, mask=m, other=0, volatile=True)
    b_miss = tl.sum(tl.sum(((b == SENTINEL) & m).to(tl.int32), axis=1), axis=0)
    it = 0
    while (b_miss > 0) & (it < max_spin):
        b = tl.load(p, mask=m, other=0, volatile=True)
        b_miss = tl.sum(tl.sum(((b == SENTINEL) & m).to(tl.int32), axis=1), axis=0)
        it += 1
    return b, b_miss


@triton.jit
def oneshot_all_reduce_add_rmsnorm_kernel(
    x,                          # [R, M, D] int bits (int16: bf16/fp16, int32: fp32) of the partial sums of the
                                #   R ranks this launch serves (R = 1 on a real rank, R = WORLD simulated)
    residual,                   # [R, M, D] residual stream before the add
    weight,                     # [D] RMSNorm weight
    out,                        # [R, M, D] normalised output (every element written)
    residual_out,               # [R, M, D] new residual stream (every element written)
    peers,                      # int64 [WORLD]: address of rank q's exchange buffer [SLOTS, WORLD, MAX_T, D]
    state,                      # int32 [R, 3]: per served rank (step, programs finished in this step,
                                #   waits given up: a bounded spin that ran out counts one)
    rank0,                      # rank of the first served rank (served rank i is rank0 + i)
    M,                          # tokens (<= MAX_T)
    D,                          # hidden size
    MAX_T,                      # rows per position of the exchange buffers
    eps,                        # RMSNorm epsilon (fp32)
    max_spin,                   # reloads of a block before the reduce gives up (counted in state)
    WORLD: tl.constexpr,        # tensor-parallel ranks
    SLOTS: tl.constexpr,        # slots of the exchange buffers (step t uses slot t % SLOTS)
    SENTINEL: tl.constexpr,     # the bits of -0.0 as a signed integer: "not arrived"
    BLOCK_M: tl.constexpr,      # rows per block
    BLOCK_D: tl.constexpr,      # next power of two >= D: a whole row in registers
    PHASE: tl.constexpr,        # 1 push, 2 reduce, 3 both (the interpreter runs 1 then 2: it runs programs in turn)
    IS_BF16: tl.constexpr,      # tensors are bf16
    IS_FP16: tl.constexpr,      # tensors are fp16
    EMULATE: tl.constexpr,      # exact bf16 conversions with integer ops (the interpreter)
):
    pid, pid_r = tl.program_id(0), tl.program_id(1)
    n_prog = tl.num_programs(0)
    rank = rank0 + pid_r
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    step = tl.load(state + 3 * pid_r)
    slot = step % SLOTS
    p_ty = tl.pointer_type(x.dtype.element_ty)
    for blk in range(pid, tl.cdiv(M, BLOCK_M), n_prog):
        o_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        m = (o_m < M)[:, None] & m_d[None, :]
        o = o_m[:, None].to(tl.int64) * D + o_d[None, :]              # row-major [M, D] offsets
        o_io = pid_r.to(tl.int64) * M * D + o                         # this served rank's rows of x, out, ...
        if PHASE & 1:
            # push: this rank's partial rows into slot `slot`, position `rank`, of every rank's buffer;
            # -0.0 becomes +0.0, so data never carries the sentinel
            b_x = tl.load(x + o_io, mask=m, other=0)
            b_x = tl.where(b_x == SENTINEL, 0, b_x)
            o_push = (slot * WORLD + rank).to(tl.int64) * MAX_T * D + o
            for q in tl.static_range(WORLD):
                tl.store(tl.load(peers + q).to(p_ty) + o_push, b_x, mask=m)
        if PHASE & 2:
            # reduce: wait for every position of the local slot, sum in rank order (fp32), refill
            p_loc = tl.load(peers + rank).to(p_ty)
            b_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
            for q in tl.static_range(WORLD):
                p_q = p_loc + (slot * WORLD + q).to(tl.int64) * MAX_T * D + o
                b_q, b_miss = _spin_load(p_q, m, max_spin, SENTINEL)
                if b_miss > 0:
                    tl.atomic_add(state + 3 * pid_r + 2, 1)
                b_acc += _bits_to_f32(b_q, IS_BF16, IS_FP16)
            for q in tl.static_range(WORLD):   # the producer of "not arrived" for this slot's next use
                p_q = p_loc + (slot * WORLD + q).to(tl.int64) * MAX_T * D + o
                tl.store(p_q, tl.full([BLOCK_M, BLOCK_D], SENTINEL, x.dtype.element_ty), mask=m)
            b_red = _round_to_dtype(b_acc, IS_BF16, IS_FP16, EMULATE)   # the all-reduce's value
            _add_rmsnorm_rows(b_red, residual + o_io, weight, out + o_io, residual_out + o_io, o_d, m, m_d, D,
                              eps, IS_BF16, EMULATE)
    if PHASE & 2:
        # the last program of this rank to finish advances the step (graph replay advances it too)
        if tl.atomic_add(state + 3 * pid_r + 1, 1) == n_prog - 1:
            tl.store(state + 3 * pid_r, step + 1)
            tl.store(state + 3 * pid_r + 1, 0)
